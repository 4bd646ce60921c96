package raftgroup

import (
	"bufio"
	"bytes"
	"fmt"
	"io"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/raft/v3/raftpb"
	"golang.org/x/sys/unix"
)

// Snapshots written off the loop (Config.BackgroundSnapshots).
//
// On the loop, maybeCompact forks the state machine (SnapshotForker),
// freezes a copy of the host's part of the snapshot (groupMeta.frozen)
// and reserves a journal segment number. A goroutine encodes that part
// and writes the snapshot to a file of its own in the
// journal's directory under that number (<id>.snap: the data alone, no
// record framing, like the segments of earlier versions), syncs it and
// its directory entry, and queues the result for the loop. The loop then
// adopts the file as a segment, stores the snapshot's reference and
// compacts the log, as if it had written the snapshot itself. Until then
// the group takes no other snapshot of its own accord, and its log keeps
// everything after the previous one.
//
// A crash or a close before the reference is durable leaves a file that
// nothing references, which the next open drops. A snapshot that is no
// longer of use when the file is done (the group was removed, or
// installed a newer snapshot from its leader) is deleted.

// snapFileName names the file of a snapshot written off the loop.
func snapFileName(id uint64) string { return fmt.Sprintf("%016x.snap", id) }

// reserveID takes a segment number for a file written off the loop.
func (j *journal) reserveID() uint64 {
	id := j.nextID
	j.nextID++
	return id
}

// adoptSnapFile makes the synced snapshot file id, of n bytes, a segment
// of the journal, and returns the reference to its data.
func (j *journal) adoptSnapFile(id uint64, n int, crc uint32) (segmentRef, error) {
	f, err := j.fs.Open(j.fs.PathJoin(j.dir, snapFileName(id)))
	if err != nil {
		return segmentRef{}, fmt.Errorf("raftgroup: open snapshot file: %w", err)
	}
	j.segs[id] = &segment{id: id, r: f, size: int64(n), legacy: true, snapFile: true}
	return segmentRef{seg: id, n: uint64(n), crc: crc}, nil
}

// writeSnapFile writes hdr and then what sw writes to dir's snapshot file
// id, synced with its directory entry, and returns their length and
// checksum. It runs off the loop: it touches no journal state. stop
// aborts it (the host is closing).
func writeSnapFile(fs vfs.FS, dir string, id uint64, hdr []byte, sw SnapshotWriter, stop <-chan struct{}) (int, uint32, error) {
	f, err := fs.Create(fs.PathJoin(dir, snapFileName(id)), vfs.WriteCategoryUnspecified)
	if err != nil {
		return 0, 0, fmt.Errorf("raftgroup: create snapshot file: %w", err)
	}
	// Like the journal's copyBlobs: a vfs.File other than the OS's may
	// modify what it writes, and a fork's pages are the live state's.
	cw := &snapFileWriter{f: f, stop: stop, copy: fs != vfs.Default}
	// Checksummed before the file gets the bytes: a vfs.File may modify
	// what it is given to write (Pebble's in-memory one does in race
	// builds).
	var sum checksumWriter
	bw := bufio.NewWriterSize(io.MultiWriter(&sum, cw), 256<<10)
	_, err = bw.Write(hdr)
	if err == nil {
		err = sw.WriteSnapshot(bw)
	}
	if err == nil {
		err = bw.Flush()
	}
	if err == nil {
		err = f.SyncData()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = syncDir(fs, dir)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("raftgroup: write snapshot file %d: %w", id, err)
	}
	return sum.n, sum.crc, nil
}

// snapFileWriter writes to a snapshot file, asking for write-back as it
// grows, until stop.
type snapFileWriter struct {
	f    vfs.File
	stop <-chan struct{}
	n    int
	// flushed is how much of the file was last asked to be written back.
	flushed int
	// copy writes a copy of what it is given (see writeSnapFile).
	copy bool
}

func (w *snapFileWriter) Write(p []byte) (int, error) {
	select {
	case <-w.stop:
		return 0, ErrClosed
	default:
	}
	if w.copy {
		p = bytes.Clone(p)
	}
	n, err := w.f.Write(p)
	w.n += n
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	if err == nil && w.n-w.flushed >= writeBackStep {
		err = w.writeBack()
	}
	return n, err
}

// writeBack writes what was written since the last call back, so that a
// snapshot reaches the disk writeBackStep at a time rather than all of it
// at the final sync.
func (w *snapFileWriter) writeBack() error {
	off := int64(w.flushed)
	w.flushed = w.n
	return writeBack(w.f, off, int64(w.n)-off)
}

// writeBack writes f's bytes [off, off+n) to the disk and waits until it
// has them (sync_file_range: no flush of the disk's cache, no metadata).
// Files written off the loop (snapshots, spare segments) go out this way
// a little at a time: a journal sync on the same disk waits behind
// whatever is queued there. On a file without a descriptor (an in-memory
// one) it asks for the write-back without waiting.
func writeBack(f vfs.File, off, n int64) error {
	if fd := f.Fd(); fd != vfs.InvalidFd {
		return unix.SyncFileRange(int(fd), off, n, unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER)
	}
	_, err := f.SyncTo(off + n)
	return err
}

// writeBackStep is how much of a file written off the loop (a snapshot,
// a spare segment's zeros) is written back at a time. With 8 MiB and no wait, the journals' syncs on this project's VM waited
// up to 8–100 ms while three replicas wrote their snapshots of 85 MiB
// (bench/vold's 4 KiB rows); a throwaway program syncing 4 KiB records
// beside an 80 MiB file written back 8 MiB at a time saw syncs of up to
// 6.6–8.3 ms, 256 KiB at a time with the wait up to 0.7–1.0 ms (the file
// taking 90 ms instead of 50).
const writeBackStep = 512 << 10

// bgSnapshot is a snapshot being written off the loop.
type bgSnapshot struct {
	id   uint64
	meta *pb.SnapshotMetadata
	// logBytes is the group's logBytes at the fork: what the snapshot
	// covers of it. margin is for compactTo.
	logBytes uint64
	margin   uint64
}

// startBackgroundSnapshot forks the state machine and starts writing its
// snapshot off the loop, if the host is configured to and the machine
// can fork; it reports whether it did.
func (g *group) startBackgroundSnapshot(margin uint64) (bool, error) {
	f, ok := g.fsm.(SnapshotForker)
	if !g.h.cfg.BackgroundSnapshots || !ok || !g.streamable() {
		return false, nil
	}
	term, sd, err := g.snapshotHeader()
	if err != nil {
		return false, err
	}
	view, err := f.ForkSnapshot()
	if err != nil {
		return false, fmt.Errorf("fork state machine: %w", err)
	}
	h := g.h
	bg := &bgSnapshot{id: h.jnl.reserveID(), meta: g.snapshotMeta(term), logBytes: g.logBytes, margin: margin}
	g.bgSnap = bg
	h.stats.BackgroundSnapshots++
	fs, dir := h.jnl.fs, h.jnl.dir
	h.bgWG.Add(1)
	go func() {
		defer h.bgWG.Done()
		n, crc, err := writeSnapFile(fs, dir, bg.id, sd.header(), view, h.closing)
		h.enqueue(request{run: func() { g.adoptBackgroundSnapshot(bg, n, crc, err) }})
	}()
	return true, nil
}

// adoptBackgroundSnapshot, on the loop, stores the snapshot written off it
// as the group's latest and compacts the log, or deletes the file if the
// snapshot failed or is no longer of use.
func (g *group) adoptBackgroundSnapshot(bg *bgSnapshot, n int, crc uint32, werr error) {
	h := g.h
	if g.bgSnap == bg {
		g.bgSnap = nil
	}
	stale := h.groups[g.id] != g || g.broken != nil ||
		(g.st.snap != nil && g.st.snap.GetIndex() >= bg.meta.GetIndex())
	if werr != nil || stale {
		if werr != nil {
			h.log.Warn("snapshot written off the loop failed", "group", uint64(g.id), "err", werr)
		}
		if err := h.jnl.fs.Remove(h.jnl.fs.PathJoin(h.jnl.dir, snapFileName(bg.id))); err != nil {
			h.log.Warn("remove snapshot file", "group", uint64(g.id), "err", err)
		}
		return
	}
	ref, err := h.jnl.adoptSnapFile(bg.id, n, crc)
	if err == nil {
		err = g.storeStaged(func(b *pebble.Batch) (func(), error) { return g.st.stageSnapshotRef(b, ref, bg.meta) })
	}
	if err != nil {
		h.fail(fmt.Errorf("group %d: store snapshot written off the loop: %w", g.id, err))
		return
	}
	g.logBytes -= min(g.logBytes, bg.logBytes)
	g.snapBytes = uint64(n)
	if err := g.compactTo(bg.meta.GetIndex(), bg.margin); err != nil {
		h.fail(fmt.Errorf("group %d: compact: %w", g.id, err))
	}
}
