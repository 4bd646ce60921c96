package raftgroup

import (
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// FollowMinProposals exposes followMinProposals to the external tests.
const FollowMinProposals = followMinProposals

// FollowEarlyBytes exposes followEarlyBytes to the external tests.
const FollowEarlyBytes = followEarlyBytes

// JournalSegmentsHeld returns, for each group whose log references
// journal segments, how many it references.
func (h *Host) JournalSegmentsHeld() map[GroupID]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[GroupID]int{}
	for _, m := range h.jnl.refs {
		for g := range m {
			out[g]++
		}
	}
	return out
}

// SegmentHookFS calls OnWrite before every write and OnSync before every
// data sync of a file in a journal's "entries" directory, with the
// file's name; the tests of both packages count or hold them with it.
// Sync, which the journal calls on preallocated segments from another
// goroutine, is not hooked.
type SegmentHookFS struct {
	vfs.FS
	OnWrite, OnSync func(name string)
}

type segmentHookFile struct {
	vfs.File
	name string
	fs   *SegmentHookFS
}

func (fs *SegmentHookFS) wrap(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil || !strings.Contains(name, "/entries/") {
		return f, err
	}
	return segmentHookFile{File: f, name: name, fs: fs}, nil
}

// Create wraps the files it creates.
func (fs *SegmentHookFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, c)
	return fs.wrap(name, f, err)
}

// ReuseForWrite wraps the files it reuses.
func (fs *SegmentHookFS) ReuseForWrite(oldname, newname string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.ReuseForWrite(oldname, newname, c)
	return fs.wrap(newname, f, err)
}

func (f segmentHookFile) Write(p []byte) (int, error) {
	if f.fs.OnWrite != nil {
		f.fs.OnWrite(f.name)
	}
	return f.File.Write(p)
}

// SyncData is how the journal syncs its records.
func (f segmentHookFile) SyncData() error {
	if f.fs.OnSync != nil {
		f.fs.OnSync(f.name)
	}
	return f.File.SyncData()
}
