package volfuse

import (
	"context"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/shoal-dev/shoal/pkg/volfs"
)

// opens counts the files this server has open, per inode, so that a file
// unlinked while open keeps working until its last handle here closes
// (volfs holds it for the session). It is the one table a server builds
// from earlier requests, and it is only ever an answer to "may a process
// here still use this inode": a server that takes over a session starts
// with an empty table, does not count the handles its predecessor gave
// out (their numbers carry another epoch), and so frees a file unlinked
// while only such a handle has it open, as before; files its predecessor
// held stay held until the session ends or the node mounts the volume
// afresh (ForgetSession, ForgetOthers).
type opens struct {
	// epoch is the high bits of this server's file handles (the lowest is
	// fhAppend): random, so that no two servers of a session share it.
	epoch uint64

	mu    sync.Mutex
	count map[uint64]int
	// held lists the inodes the volume holds for this session (an unlink
	// or a rename from here took their last name) while handles here
	// still have them open.
	held map[uint64]bool
}

func newOpens() *opens {
	return &opens{epoch: rand.Uint64() &^ fhAppend, count: map[uint64]int{}, held: map[uint64]bool{}}
}

// opened counts a new handle of ino and returns its number.
func (o *opens) opened(ino uint64, flags uint32) uint64 {
	o.mu.Lock()
	o.count[ino]++
	o.mu.Unlock()
	return o.epoch | openFh(flags)
}

// released drops handle fh of ino and reports whether it was the last
// open handle of a file the volume holds for this session: then the
// caller forgets it. A handle of another epoch was not counted.
func (o *opens) released(ino, fh uint64) (forget bool) {
	if fh&^fhAppend != o.epoch {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.count[ino]--; o.count[ino] > 0 {
		return false
	}
	delete(o.count, ino)
	forget = o.held[ino]
	delete(o.held, ino)
	return forget
}

// open returns the inodes open here, for an unlink or a rename to send.
func (o *opens) open() []uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.count) == 0 {
		return nil
	}
	return slices.Collect(maps.Keys(o.count))
}

// holding records that the volume now holds ino for this session, and
// reports whether its handles have all closed meanwhile (then the caller
// forgets it at once).
func (o *opens) holding(ino uint64) (forget bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.count[ino] == 0 {
		return true
	}
	o.held[ino] = true
	return false
}

// holder is this server's volfs.Holder for an unlink of name in parent,
// or a rename over it. The op carries the inodes open here; past
// maxOpenSent of them it carries only the name's, looked up first, so
// that an unlink does not grow with the open files (a name another node
// points elsewhere in between may then free a file open here).
func (r *rawFS) holder(ctx context.Context, parent uint64, name string) volfs.Holder {
	h := volfs.Holder{Node: r.vol.node, Session: r.vol.session, Open: r.opens.open()}
	if len(h.Open) <= maxOpenSent {
		return h
	}
	h.Open = nil
	if a, err := r.vol.c.Lookup(ctx, parent, name); err == nil && r.opens.isOpen(a.Ino) {
		h.Open = []uint64{a.Ino}
	}
	return h
}

// maxOpenSent bounds the open inodes an unlink or a rename carries.
const maxOpenSent = 64

// isOpen reports whether ino has a handle open here.
func (o *opens) isOpen(ino uint64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.count[ino] > 0
}

// held follows up an unlink or a rename whose result says the volume
// holds inode ino (0: none) for this session.
func (r *rawFS) held(ctx context.Context, ino uint64) {
	if ino != 0 && r.opens.holding(ino) {
		r.vol.forget(ctx, ino)
	}
}

// forget frees held file ino, whose last handle here has closed. A
// failure leaves the file held until the session ends or the node mounts
// the volume afresh.
func (v *volume) forget(ctx context.Context, ino uint64) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), forgetTimeout)
	defer cancel()
	if err := v.c.Forget(ctx, volfs.Holder{Node: v.node, Session: v.session}, ino); err != nil {
		v.log.Warn("free an unlinked file after its last close", "ino", ino, "err", err)
	}
}

// forgetAll frees what the volume holds for this session (ended) or, with
// others, for the node's other sessions (the node mounted the volume
// afresh, so no other session of it is left).
func (v *volume) forgetAll(others bool) {
	ctx, cancel := context.WithTimeout(context.Background(), forgetTimeout)
	defer cancel()
	h := volfs.Holder{Node: v.node, Session: v.session}
	var err error
	if others {
		err = v.c.ForgetOthers(ctx, h)
	} else {
		err = v.c.ForgetSession(ctx, h)
	}
	if err != nil {
		v.log.Warn("free the unlinked files a mount held", "others", others, "err", err)
	}
}

// forgetTimeout bounds a forget: the volume may have lost its quorum.
const forgetTimeout = 30 * time.Second
