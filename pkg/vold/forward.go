package vold

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	volv1 "github.com/shoal-dev/shoal/proto/shoal/vol/v1"
)

// Kinds of forwarded requests (ForwardRequest.kind).
const (
	kindFSMutate     = "fs.mutate"
	kindFSQuery      = "fs.query"
	kindStatus       = "status"
	kindKVPut        = "kv.put"
	kindKVGet        = "kv.get"
	kindLockAcquire  = "lock.acquire"
	kindLockRenew    = "lock.renew"
	kindLockRelease  = "lock.release"
	kindLockList     = "lock.list"
	kindSystemEnsure = "system.ensure"
	kindMachineSet   = "machine.set"
	kindMachineRead  = "machine.read"
)

// forwardAttempt bounds one forwarded call, so that a member that hangs
// (partitioned from its group) does not keep the caller from the others.
const forwardAttempt = 10 * time.Second

// newKey returns a random idempotency key.
func newKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// route runs a request on a member of d's group: on this node's replica
// when it holds one, else forwarded — to the last known leader first,
// then the other live members, then the rest. A member that is
// unreachable, has no replica (yet) or hangs is skipped, and rounds repeat
// with backoff until ctx ends (a group being created has no replica
// anywhere for a moment). Errors of the request itself are returned as
// they are.
func (n *node) route(ctx context.Context, d *volumeDoc, kind string, payload []byte, key string) ([]byte, error) {
	g := d.group()
	req := &volv1.ForwardRequest{Group: d.Group, Kind: kind, Payload: payload, Key: key}
	var last error
	for round := 0; ; round++ {
		if n.holds(g) {
			out, err := n.runLocal(ctx, g, kind, payload, key)
			if err == nil || !replicaGone(err) || ctx.Err() != nil {
				return out, err
			}
			last = err
		}
		for _, m := range n.forwardOrder(d) {
			if m == n.id {
				continue
			}
			resp, err := n.forwardTo(ctx, m, req)
			if err == nil {
				return resp.GetPayload(), nil
			}
			last = err
			if ctx.Err() != nil {
				// The call ended because ctx did: say so, so that callers
				// see context.Canceled (EINTR for a filesystem op), not
				// the forwarded call's CANCELED status (EIO).
				return nil, fmt.Errorf("volume group %d on node %s: %v: %w", d.Group, m, status.Convert(err).Message(), ctx.Err())
			}
			if !retryElsewhere(err) {
				return nil, err
			}
		}
		select {
		case <-ctx.Done():
			why := "no replica is up yet"
			if last != nil {
				why = status.Convert(last).Message()
			}
			return nil, fmt.Errorf("no member of volume group %d answered (last: %s): %w", d.Group, why, ctx.Err())
		case <-time.After(min(50*time.Millisecond<<min(round, 5), time.Second)):
		}
	}
}

func (n *node) forwardTo(ctx context.Context, node string, req *volv1.ForwardRequest) (*volv1.ForwardResponse, error) {
	c, err := n.pool.client(node)
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	actx, cancel := context.WithTimeout(ctx, forwardAttempt)
	defer cancel()
	n.stats.forwardedOut.Add(1)
	resp, err := c.Forward(actx, req)
	if err != nil {
		n.stats.forwardErrors.Add(1)
		if ctx.Err() == nil && actx.Err() != nil {
			err = status.Errorf(codes.DeadlineExceeded, "node %s did not answer in %s", node, forwardAttempt)
		}
	}
	return resp, err
}

// retryElsewhere reports whether a forwarded call may succeed on another
// member: the one asked was unreachable, had no replica, or hung.
func retryElsewhere(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.NotFound, codes.DeadlineExceeded, codes.Canceled:
		return true
	}
	return false
}

// forwardOrder lists d's members to try: known leader, live, the rest.
func (n *node) forwardOrder(d *volumeDoc) []string {
	var leader string
	if v, ok := n.leaders.Load(d.group()); ok {
		leader = v.(string)
	}
	nodes := d.nodes()
	rank := func(id string) int {
		switch {
		case id == leader:
			return 0
		case n.alive(id):
			return 1
		}
		return 2
	}
	slices.SortStableFunc(nodes, func(a, b string) int { return rank(a) - rank(b) })
	return nodes
}

// serveForward runs a request forwarded by node from on this node's
// replica of the group.
func (n *node) serveForward(ctx context.Context, from string, req *volv1.ForwardRequest) (*volv1.ForwardResponse, error) {
	n.stats.forwardedIn.Add(1)
	h, err := n.raftHost()
	if err != nil {
		return nil, err
	}
	g := raftgroup.GroupID(req.GetGroup())
	if req.GetKind() == kindPing {
		// Answered only once the host's loop has synced its journal: a
		// vold whose loop or disk is stuck answers nothing else either.
		if err := h.Check(ctx); err != nil {
			return nil, fmt.Errorf("vold on %s cannot write: %w: %w", n.id, err, errdefs.ErrUnavailable)
		}
		return &volv1.ForwardResponse{Payload: binary.AppendUvarint(nil, uint64(n.level()))}, nil
	}
	if req.GetKind() == kindSystemEnsure {
		d, err := n.ensureSystemLocal(ctx)
		if err != nil {
			return nil, err
		}
		b, err := json.Marshal(d)
		return &volv1.ForwardResponse{Payload: b}, err
	}
	if k := req.GetKind(); k == kindRemovalFence || k == kindRemovalLift {
		b, err := n.serveRemovalFence(ctx, k, req.GetPayload())
		if err != nil {
			return nil, err
		}
		return &volv1.ForwardResponse{Payload: b}, nil
	}
	if !n.holds(g) {
		return nil, fmt.Errorf("node %s holds no replica of group %d: %w", n.id, g, errdefs.ErrNotFound)
	}
	out, err := n.runLocal(ctx, g, req.GetKind(), req.GetPayload(), req.GetKey())
	if err != nil {
		return nil, forwardedError(err)
	}
	return &volv1.ForwardResponse{Payload: out}, nil
}

// runLocal runs a request on this node's replica of g.
func (n *node) runLocal(ctx context.Context, g raftgroup.GroupID, kind string, payload []byte, key string) ([]byte, error) {
	switch kind {
	case kindFSMutate:
		return n.localMutate(ctx, g, payload, key)
	case kindFSQuery:
		return n.localQuery(ctx, g, payload)
	case kindStatus:
		var req statusRequest
		if len(payload) > 0 {
			if err := json.Unmarshal(payload, &req); err != nil {
				return nil, fmt.Errorf("status request: %v: %w", err, errdefs.ErrInvalidArgument)
			}
		}
		st, err := n.localStatus(g, !req.NoDigest)
		if err != nil {
			return nil, err
		}
		return json.Marshal(st)
	case kindKVPut, kindKVGet, kindLockAcquire, kindLockRenew, kindLockRelease, kindLockList, kindMachineSet, kindMachineRead:
		return n.localKV(ctx, g, kind, payload)
	}
	return nil, fmt.Errorf("unknown request kind %q: %w", kind, errdefs.ErrInvalidArgument)
}

// forwardedError makes the replica-level failures a caller should retry
// on another member say NOT_FOUND or UNAVAILABLE, whatever their class here.
func forwardedError(err error) error {
	switch {
	case errors.Is(err, raftgroup.ErrRemoved), errors.Is(err, raftgroup.ErrGroupNotFound):
		return fmt.Errorf("%v: %w", err, errdefs.ErrNotFound)
	case errors.Is(err, raftgroup.ErrClosed), errors.Is(err, raftgroup.ErrGroupBroken):
		return fmt.Errorf("%v: %w", err, errdefs.ErrUnavailable)
	}
	return err
}

// holds reports whether this node holds an initialized, live replica of g.
func (n *node) holds(g raftgroup.GroupID) bool {
	h := n.host.Load()
	if h == nil {
		return false
	}
	return h.Serves(g)
}
