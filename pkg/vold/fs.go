package vold

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/containerd/errdefs"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	"github.com/shoal-dev/shoal/pkg/volfs"
)

// newVolumeMachine is a volume group's state machine.
func newVolumeMachine() raftgroup.StateMachine { return volfs.New() }

// volumeBackend carries a volume's filesystem ops to its group: through
// the local replica when this node holds one, else forwarded to a member
// (route). It looks the volume up on every call, so a replica that repair
// adds to or removes from this node changes the path without remounting.
type volumeBackend struct {
	n    *node
	name string
	// fixed, when set, is used instead of the mirror's document (a volume
	// being created may not have reached the mirror yet).
	fixed *volumeDoc
}

var _ volfs.Backend = (*volumeBackend)(nil)

func (b *volumeBackend) doc() (*volumeDoc, error) {
	if b.fixed != nil {
		return b.fixed, nil
	}
	d := b.n.volumeDoc(b.name)
	if d == nil {
		return nil, fmt.Errorf("volume %q does not exist: %w", b.name, errdefs.ErrNotFound)
	}
	return d, nil
}

// Mutate implements volfs.Backend. The idempotency key is the request's
// (volfs.RequestKey: a FUSE request resent to a restarted vold keeps it),
// else drawn once per call, so that the local attempt and retries on
// other members apply the op at most once.
func (b *volumeBackend) Mutate(ctx context.Context, op []byte) ([]byte, error) {
	d, err := b.doc()
	if err != nil {
		return nil, err
	}
	ctx, cancel := interruptible(ctx)
	defer cancel()
	key := volfs.RequestKey(ctx)
	if key == "" {
		key = newKey()
	}
	defer b.n.lat.observeFS(fsMutate, time.Now())
	return b.n.route(ctx, d, kindFSMutate, op, key)
}

// Query implements volfs.Backend.
func (b *volumeBackend) Query(ctx context.Context, req []byte) ([]byte, error) {
	d, err := b.doc()
	if err != nil {
		return nil, err
	}
	ctx, cancel := interruptible(ctx)
	defer cancel()
	defer b.n.lat.observeFS(fsQuery, time.Now())
	return b.n.route(ctx, d, kindFSQuery, req, "")
}

// interruptGrace is how long a filesystem op whose FUSE request was
// interrupted keeps going to learn its outcome.
const interruptGrace = 5 * time.Second

// interruptible returns the context a filesystem op runs under. Any
// signal to the calling process (Go's runtime preempts goroutines with
// SIGURG many times a second) makes the kernel interrupt its FUSE request,
// which cancels the op's context. An interrupt is only advisory — the
// kernel still waits for the answer — and an op given up on is worse than
// a late one: a mutation proposed by then may still apply, and the
// caller's retry of an applied rename, unlink or exclusive create would
// fail; a query proxied to another node turns into EIO for callers that
// do not retry on EINTR. So an interrupted op goes on for interruptGrace,
// and only then is cancelled (EINTR).
func interruptible(ctx context.Context) (context.Context, context.CancelFunc) {
	op, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() {
		t := time.NewTimer(interruptGrace)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-op.Done():
		}
	})
	return op, func() { stop(); cancel() }
}

// replicaGone reports an error that means the local replica went away
// under the call (removed or destroyed): another member can serve it.
func replicaGone(err error) bool {
	return errors.Is(err, raftgroup.ErrRemoved) || errors.Is(err, raftgroup.ErrGroupNotFound)
}

// localMutate proposes op to group g through this node's replica. The
// proposal returns once this replica applied it: the entry is committed,
// so durable on a quorum, and every later linearizable read sees it.
func (n *node) localMutate(ctx context.Context, g raftgroup.GroupID, op []byte, key string) ([]byte, error) {
	h, err := n.raftHost()
	if err != nil {
		return nil, err
	}
	n.stats.proposals.Add(1)
	r, err := h.Submit(g, raftgroup.Proposal{Data: op, Key: key}).Wait(ctx)
	if err != nil {
		return nil, fmt.Errorf("volume group %d: propose: %w", g, err)
	}
	return r.Data, nil
}

// localQuery runs a filesystem query on this node's replica of g after a
// ReadIndex, so it is linearizable.
func (n *node) localQuery(ctx context.Context, g raftgroup.GroupID, req []byte) ([]byte, error) {
	h, err := n.raftHost()
	if err != nil {
		return nil, err
	}
	if _, err := h.ReadIndex(ctx, g); err != nil {
		return nil, fmt.Errorf("volume group %d: read index: %w", g, err)
	}
	return volfs.QueryHost(h, g, req)
}

// setLimit applies a volume's size limit through its group.
func (n *node) setLimit(ctx context.Context, name string, d *volumeDoc) error {
	c := &volfs.Client{B: &volumeBackend{n: n, name: name, fixed: d}}
	return c.SetLimit(ctx, d.SizeBytes)
}

// A volume's snapshot (its whole filesystem, data included) is copied once
// when sent, and written straight into the journal when stored.
var (
	_ raftgroup.SnapshotAppender = (*volfs.FS)(nil)
	_ raftgroup.SnapshotWriter   = (*volfs.FS)(nil)
)
