package raftgroup

import (
	"errors"
	"fmt"
	iofs "io/fs"
	"sync"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// Dead journal files are removed off the loop.
//
// Unlinking a file of 64 MiB (a segment no free file takes, a volume's
// replaced snapshot) took 15–36 ms on this project's VM: ext4 frees its
// extents and journals that. collect runs on the loop, and one that
// dropped a snapshot's predecessor and two segments held every group's
// writes for up to 150 ms (bench/vold's 4 KiB rows, at each snapshot). The
// loop now only forgets the file; a goroutine unlinks it. A crash before
// that leaves a file nothing references, as a crash just before a removal
// on the loop did: open lists it and dropUnreferenced removes it. Names
// are never reused (nextID only grows, and open counts every file), so a
// late unlink cannot hit a newer file.

// unlinker removes files in the background, one at a time, in order.
type unlinker struct {
	fs    vfs.FS
	paths chan string
	done  chan struct{}

	mu  sync.Mutex
	err error // the first failed removal, reported by takeErr
}

// unlinkQueue bounds the removals waiting: a loop that drops files faster
// than the disk unlinks them waits for it rather than piling them up.
const unlinkQueue = 64

func newUnlinker(fs vfs.FS) *unlinker {
	u := &unlinker{fs: fs, paths: make(chan string, unlinkQueue), done: make(chan struct{})}
	go u.run()
	return u
}

func (u *unlinker) run() {
	defer close(u.done)
	for path := range u.paths {
		if err := u.fs.Remove(path); err != nil && !errors.Is(err, iofs.ErrNotExist) {
			u.mu.Lock()
			if u.err == nil {
				u.err = fmt.Errorf("raftgroup: remove %s: %w", path, err)
			}
			u.mu.Unlock()
		}
	}
}

// remove queues path for removal.
func (u *unlinker) remove(path string) { u.paths <- path }

// takeErr returns the first removal that failed since the last call.
func (u *unlinker) takeErr() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	err := u.err
	u.err = nil
	return err
}

// close waits for the queued removals.
func (u *unlinker) close() {
	close(u.paths)
	<-u.done
}
