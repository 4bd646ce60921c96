package volfuse

import (
	"context"
	"sync"
	"syscall"
	"time"

	"github.com/shoal-dev/shoal/pkg/volfs"
)

// Write-behind. A write through the mount is copied into its inode's
// buffer and acknowledged at once; the buffer is proposed to the volume's
// Raft group in chunks of up to volfs.MaxWriteChunk, several at a time, so
// that a single writer keeps the group busy (Raft carries the chunks in
// flight together: one log fsync and one message per follower for all of
// them) instead of waiting a commit round trip per write. fsync, close
// (FUSE Flush), and every request that must see the data (read, getattr,
// setattr, lookup, rename and unlink of the name) wait until the buffer
// is committed and applied. See the package doc for the guarantees.
//
// The buffer is per inode rather than per open file so that the order of
// writes made through different descriptors on this node is kept, and so
// that one flush makes everything written so far visible.

const (
	// maxInflight bounds the chunks of one inode being proposed at once:
	// enough to fill a Raft round with several MiB, few enough that one
	// busy file cannot flood the group's log with uncommitted entries.
	maxInflight = 8
	// maxBuffered bounds the bytes of one inode buffered or in flight; a
	// write beyond it waits until chunks are committed (backpressure, so
	// memory stays bounded and fsync has at most this much to wait for).
	maxBuffered = 16 << 20
	// tailDelay is how long the last, partly filled chunk waits for more
	// contiguous data before it is sent anyway, so that unsynced data
	// reaches the replicas (and other nodes) soon even when nobody calls
	// fsync or close.
	tailDelay = 100 * time.Millisecond
)

// extent is a contiguous run of buffered bytes, sent as one write op.
type extent struct {
	seq  uint64 // order of creation; flush waits for every seq up to a mark
	off  int64
	data []byte
	// handles are the open files whose writes the extent holds: a failure
	// to write it is reported to each of them.
	handles []*handle
}

func (e *extent) end() int64 { return e.off + int64(len(e.data)) }

func overlap(a, b *extent) bool { return a.off < b.end() && b.off < a.end() }

// inodeWB is one inode's write-behind buffer.
type inodeWB struct {
	vol *volume
	ino uint64

	// opens counts the open handles using the buffer; guarded by vol.mu.
	opens int

	mu sync.Mutex
	// pending are extents not yet sent, in write order. Only the last one
	// grows (by contiguous or overlapping writes), so merging never moves
	// data ahead of a later write.
	pending []*extent
	// inflight are extents being proposed. No two overlap: an extent is
	// sent only when it overlaps none in flight, and pending is sent in
	// order, so overlapping writes apply in the order they were made
	// (Raft keeps no order between concurrent proposals: a dropped one is
	// retried after later ones).
	inflight map[*extent]struct{}
	bytes    int    // in pending and inflight
	nextSeq  uint64 // last seq handed out
	// sealed: extents with seq <= sealed are sent even if they are the
	// last, partly filled one (a flush or the tail timer asked for them).
	sealed  uint64
	timerOn bool
	changed chan struct{} // closed and replaced when an extent completes
}

func newInodeWB(v *volume, ino uint64) *inodeWB {
	return &inodeWB{vol: v, ino: ino, inflight: map[*extent]struct{}{}, changed: make(chan struct{})}
}

// idle reports that nothing is buffered or in flight; w.mu held.
func (w *inodeWB) idle() bool { return len(w.pending) == 0 && len(w.inflight) == 0 }

// wait releases w.mu until an extent completes or ctx ends; w.mu held.
func (w *inodeWB) wait(ctx context.Context) error {
	ch := w.changed
	w.mu.Unlock()
	defer w.mu.Lock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// write buffers data for offset off on behalf of h. It returns an error
// a previous buffered write of h met (which is then cleared, as Linux
// reports a writeback error once per file), or EINTR if interrupted while
// waiting for room.
func (w *inodeWB) write(ctx context.Context, h *handle, off int64, data []byte) syscall.Errno {
	if off < 0 {
		return syscall.EINVAL
	}
	// Checked here, as the state machine would, because afterwards the
	// error could only be reported late.
	if uint64(off) > volfs.MaxFileSize || uint64(len(data)) > volfs.MaxFileSize-uint64(off) {
		return syscall.EFBIG
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if e := h.takeErr(); e != 0 {
		return e
	}
	for w.bytes > 0 && w.bytes+len(data) > maxBuffered {
		w.sealed = w.nextSeq
		w.kick()
		if err := w.wait(ctx); err != nil {
			return syscall.EINTR
		}
		if e := h.takeErr(); e != 0 {
			return e
		}
	}
	for len(data) > 0 {
		// FUSE never sends more than max_write (MaxWriteChunk) at once,
		// but a caller of this function might.
		n := min(len(data), volfs.MaxWriteChunk)
		w.add(h, off, data[:n])
		off += int64(n)
		data = data[n:]
	}
	w.kick()
	if !w.timerOn && len(w.pending) > 0 {
		w.timerOn = true
		time.AfterFunc(tailDelay, w.sealTail)
	}
	return 0
}

// add buffers a copy of data at off, merging it into the last pending
// extent when they touch and the result fits in one chunk; w.mu held.
func (w *inodeWB) add(h *handle, off int64, data []byte) {
	end := off + int64(len(data))
	if k := len(w.pending); k > 0 {
		t := w.pending[k-1]
		lo, hi := min(t.off, off), max(t.end(), end)
		if off <= t.end() && end >= t.off && hi-lo <= volfs.MaxWriteChunk {
			old := len(t.data)
			size := int(hi - lo)
			if lo == t.off && size <= cap(t.data) {
				t.data = t.data[:size]
			} else {
				// Grow by doubling, as append does: sequential small
				// writes then cost amortised constant copying.
				nb := make([]byte, size, min(volfs.MaxWriteChunk, max(size, 2*cap(t.data))))
				copy(nb[t.off-lo:], t.data)
				t.data = nb
			}
			t.off = lo
			copy(t.data[off-lo:], data)
			w.bytes += size - old
			if !hasHandle(t.handles, h) {
				t.handles = append(t.handles, h)
			}
			return
		}
	}
	w.nextSeq++
	e := &extent{seq: w.nextSeq, off: off, data: append([]byte(nil), data...), handles: []*handle{h}}
	w.pending = append(w.pending, e)
	w.bytes += len(data)
}

func hasHandle(hs []*handle, h *handle) bool {
	for _, x := range hs {
		if x == h {
			return true
		}
	}
	return false
}

// kick sends pending extents, in order, while there is room in flight;
// w.mu held. It stops at an extent that overlaps one in flight (it must
// apply after it) and at a last, partly filled, unsealed extent (more
// contiguous data may still join it).
func (w *inodeWB) kick() {
	for len(w.pending) > 0 && len(w.inflight) < maxInflight {
		e := w.pending[0]
		if len(w.pending) == 1 && e.seq > w.sealed && len(e.data) < volfs.MaxWriteChunk {
			return
		}
		for f := range w.inflight {
			if overlap(e, f) {
				return
			}
		}
		w.pending[0] = nil
		w.pending = w.pending[1:]
		w.inflight[e] = struct{}{}
		go w.send(e)
	}
}

// send proposes one extent and records the outcome. It runs detached from
// the request that buffered the data (which has long returned), so it
// waits as long as the backend does: a group without quorum holds the data
// here, and every flush waits for it, as a write did before write-behind.
func (w *inodeWB) send(e *extent) {
	_, err := w.vol.c.Write(context.Background(), w.ino, e.off, e.data, false)
	w.mu.Lock()
	delete(w.inflight, e)
	w.bytes -= len(e.data)
	if err != nil {
		errno := w.vol.errno("write", err)
		for _, h := range e.handles {
			if h.err == 0 {
				h.err = errno
			}
		}
	}
	close(w.changed)
	w.changed = make(chan struct{})
	w.kick()
	idle := w.idle()
	w.mu.Unlock()
	if idle {
		w.vol.dropIfUnused(w)
	}
}

// sealTail sends the last extent even though it is not full: the timer
// set by the write that left it pending fired.
func (w *inodeWB) sealTail() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.timerOn = false
	w.sealed = w.nextSeq
	w.kick()
}

// flush waits until everything buffered before the call is committed and
// applied (or ctx ends: EINTR). It returns h's pending write error, if
// any, clearing it; h may be nil.
func (w *inodeWB) flush(ctx context.Context, h *handle) syscall.Errno {
	w.mu.Lock()
	defer w.mu.Unlock()
	mark := w.nextSeq
	w.sealed = max(w.sealed, mark)
	w.kick()
	for w.hasUpTo(mark) {
		if err := w.wait(ctx); err != nil {
			return syscall.EINTR
		}
	}
	return h.takeErr()
}

// hasUpTo reports whether an extent with seq <= mark is still pending or
// in flight; w.mu held.
func (w *inodeWB) hasUpTo(mark uint64) bool {
	for _, e := range w.pending {
		if e.seq <= mark {
			return true
		}
	}
	for e := range w.inflight {
		if e.seq <= mark {
			return true
		}
	}
	return false
}

// dirty reports whether anything is buffered or in flight.
func (w *inodeWB) dirty() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return !w.idle()
}

// takeErr returns and clears h's pending write error; the buffer's mu
// held (h may be nil).
func (h *handle) takeErr() syscall.Errno {
	if h == nil {
		return 0
	}
	e := h.err
	h.err = 0
	return e
}

// openWB returns ino's buffer for a new writable handle.
func (v *volume) openWB(ino uint64) *inodeWB {
	v.mu.Lock()
	defer v.mu.Unlock()
	w := v.wbs[ino]
	if w == nil {
		w = newInodeWB(v, ino)
		v.wbs[ino] = w
	}
	w.opens++
	return w
}

// releaseWB drops a closed handle's use of its buffer.
func (v *volume) releaseWB(w *inodeWB) {
	v.mu.Lock()
	w.opens--
	v.mu.Unlock()
	v.dropIfUnused(w)
}

// dropIfUnused forgets a buffer that no handle uses and that holds
// nothing. A buffer with data in flight stays (even with no handle), so
// that a new handle on the inode orders its writes after that data.
func (v *volume) dropIfUnused(w *inodeWB) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if w.opens > 0 || v.wbs[w.ino] != w {
		return
	}
	w.mu.Lock()
	idle := w.idle()
	w.mu.Unlock()
	if idle {
		delete(v.wbs, w.ino)
	}
}

// flushIno waits until everything buffered for ino on this mount is
// committed (see flush); errors stay with the handles that wrote.
func (v *volume) flushIno(ctx context.Context, ino uint64) syscall.Errno {
	v.mu.Lock()
	w := v.wbs[ino]
	v.mu.Unlock()
	if w == nil {
		return 0
	}
	return w.flush(ctx, nil)
}

// isDirty reports whether ino has buffered or in-flight writes.
func (v *volume) isDirty(ino uint64) bool {
	v.mu.Lock()
	w := v.wbs[ino]
	v.mu.Unlock()
	return w != nil && w.dirty()
}
