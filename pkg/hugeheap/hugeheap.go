// Package hugeheap spares a Go process page faults as its heap grows: it
// asks Linux to back the heap with transparent huge pages where the host
// leaves that to each process (/sys/kernel/mm/transparent_hugepage/enabled
// set to "madvise", the common default), and Reserve makes heap memory
// resident ahead of use and keeps it (reserve.go).
//
// Why: vold keeps each volume's files in memory on every replica, so
// writing new data grows its heap, and every 4 KiB page touched for the
// first time is a page fault. On the project's paravirtualized VMs a
// fault costs ~10 µs (2.7 ms per MiB of fresh memory, 1.7 ms with 2 MiB
// pages), which made page faults the largest single cost of sequential
// writes into a new volume. With huge pages, sequential writes through
// a leader's mount went from 62.7 to 89.3 MB/s and from 26–29 to 15–19
// ms of CPU per MiB (docs/VOLUMES-PERFORMANCE.md).
//
// Why not the runtime: Go stopped advising huge pages itself (Go 1.21.1)
// because khugepaged collapsing sparse heaps raised some programs' RSS.
// That is the price here too: memory is committed in 2 MiB steps, so an
// idle process's RSS can be higher. It is a per-process choice, off
// unless a daemon turns it on.
//
// How: the heap is mapped in pieces as it grows; MADV_HUGEPAGE is set on
// every anonymous read-write mapping (the heap, and the runtime's own
// small ones) once at Enable and again after every garbage collection,
// which covers what the heap grew by since. Enable can first map heap
// address space ahead (Premap) by allocating and dropping a large slice
// that is never touched, so that early growth lands in advised memory.
package hugeheap

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// Mapping is one line of /proc/self/maps that Enable advises.
type Mapping struct{ Start, End uintptr }

// AnonymousRW returns the private anonymous read-write mappings listed in
// maps (the format of /proc/PID/maps), leaving out the named ones
// ([stack], [heap] of the C allocator, [vvar] ...) and those of files.
func AnonymousRW(maps []byte) []Mapping {
	var out []Mapping
	sc := bufio.NewScanner(bytes.NewReader(maps))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		// start-end perms offset dev inode [path]
		if len(f) != 5 || string(f[1]) != "rw-p" || string(f[4]) != "0" {
			continue
		}
		lo, hi, ok := bytes.Cut(f[0], []byte("-"))
		if !ok {
			continue
		}
		s, err1 := strconv.ParseUint(string(lo), 16, 64)
		e, err2 := strconv.ParseUint(string(hi), 16, 64)
		if err1 != nil || err2 != nil || e <= s {
			continue
		}
		out = append(out, Mapping{uintptr(s), uintptr(e)})
	}
	return out
}

var (
	// mu guards advised; enableMu makes Enable run once at a time.
	mu       sync.Mutex
	advised  = map[Mapping]bool{}
	enableMu sync.Mutex
	enabled  bool
)

// Enable advises huge pages for the process's anonymous memory now and
// after every garbage collection from now on. premap bytes of heap
// address space are mapped first (0: none). It returns how many mappings
// it advised now; an error means the kernel refused (no THP support), and
// nothing is left running. Later calls do nothing.
func Enable(premap int) (int, error) {
	enableMu.Lock()
	defer enableMu.Unlock()
	if enabled {
		return 0, nil
	}
	if premap > 0 {
		// Allocated, never touched, dropped: the heap's mapping grows by
		// it, and it is advised below before anything uses it.
		runtime.KeepAlive(make([]byte, premap))
		runtime.GC()
	}
	n, err := advise()
	if err != nil {
		return n, err
	}
	enabled = true
	afterEveryGC(func() { _, _ = advise() })
	return n, nil
}

// advise sets MADV_HUGEPAGE on the anonymous mappings not yet advised.
func advise() (int, error) {
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return 0, fmt.Errorf("hugeheap: %w", err)
	}
	mu.Lock()
	defer mu.Unlock()
	n := 0
	seen := map[Mapping]bool{}
	for _, m := range AnonymousRW(maps) {
		seen[m] = true
		if advised[m] {
			continue
		}
		if _, _, e := unix.Syscall(unix.SYS_MADVISE, m.Start, m.End-m.Start, unix.MADV_HUGEPAGE); e != 0 {
			return n, fmt.Errorf("hugeheap: madvise %#x-%#x: %w", m.Start, m.End, e)
		}
		n++
	}
	advised = seen
	return n, nil
}

// gcSentinel's finalizer runs after each collection that finds it
// unreachable, and sets itself up for the next one.
type gcSentinel struct{ fn func() }

func afterEveryGC(fn func()) {
	s := &gcSentinel{fn: fn}
	runtime.SetFinalizer(s, func(s *gcSentinel) {
		s.fn()
		afterEveryGC(s.fn)
	})
}
