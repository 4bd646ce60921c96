package vold

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	volv1 "github.com/shoal-dev/shoal/proto/shoal/vol/v1"
)

// KV and lock limits.
const (
	maxKeyLen     = 1024
	maxValueLen   = 1 << 20
	defaultLockTT = 15 * time.Second
	maxLockTTL    = time.Hour
)

// kvAPI serves shoal.vol.v1.KV on vold.sock: every call runs on the
// system group, on this node's replica or forwarded to a member.
type kvAPI struct {
	volv1.UnimplementedKVServer
	n *node
}

func (a *kvAPI) Put(ctx context.Context, req *volv1.PutRequest) (*volv1.PutResponse, error) {
	if err := checkKey("key", req.GetKey()); err != nil {
		return nil, err
	}
	if len(req.GetValue()) > maxValueLen {
		return nil, fmt.Errorf("value of %d bytes is over the %d-byte limit: %w", len(req.GetValue()), maxValueLen, errdefs.ErrInvalidArgument)
	}
	req = proto.CloneOf(req)
	if req.IdempotencyKey == "" {
		// Drawn here, at the edge, so retries on other members apply once.
		req.IdempotencyKey = newKey()
	}
	out := &volv1.PutResponse{}
	return out, a.n.kvCall(ctx, kindKVPut, req, out)
}

func (a *kvAPI) Get(ctx context.Context, req *volv1.GetRequest) (*volv1.GetResponse, error) {
	if err := checkKey("key", req.GetKey()); err != nil {
		return nil, err
	}
	out := &volv1.GetResponse{}
	return out, a.n.kvCall(ctx, kindKVGet, req, out)
}

func (a *kvAPI) AcquireLock(ctx context.Context, req *volv1.AcquireLockRequest) (*volv1.Lease, error) {
	if err := checkLock(req.GetName(), req.GetHolder()); err != nil {
		return nil, err
	}
	if err := checkTTL(req.GetTtl()); err != nil {
		return nil, err
	}
	out := &volv1.Lease{}
	return out, a.n.kvCall(ctx, kindLockAcquire, req, out)
}

func (a *kvAPI) RenewLock(ctx context.Context, req *volv1.RenewLockRequest) (*volv1.Lease, error) {
	if err := checkLock(req.GetName(), req.GetHolder()); err != nil {
		return nil, err
	}
	if err := checkTTL(req.GetTtl()); err != nil {
		return nil, err
	}
	out := &volv1.Lease{}
	return out, a.n.kvCall(ctx, kindLockRenew, req, out)
}

func (a *kvAPI) ReleaseLock(ctx context.Context, req *volv1.ReleaseLockRequest) (*volv1.ReleaseLockResponse, error) {
	if err := checkLock(req.GetName(), req.GetHolder()); err != nil {
		return nil, err
	}
	out := &volv1.ReleaseLockResponse{}
	return out, a.n.kvCall(ctx, kindLockRelease, req, out)
}

func (a *kvAPI) ListLocks(ctx context.Context, req *volv1.ListLocksRequest) (*volv1.ListLocksResponse, error) {
	out := &volv1.ListLocksResponse{}
	return out, a.n.kvCall(ctx, kindLockList, req, out)
}

func checkKey(what, k string) error {
	if k == "" || len(k) > maxKeyLen {
		return fmt.Errorf("%s must be 1 to %d bytes: %w", what, maxKeyLen, errdefs.ErrInvalidArgument)
	}
	return nil
}

func checkLock(name, holder string) error {
	if err := checkKey("lock name", name); err != nil {
		return err
	}
	return checkKey("lock holder", holder)
}

func checkTTL(d *durationpb.Duration) error {
	if d == nil {
		return nil
	}
	if t := d.AsDuration(); t < 0 || t > maxLockTTL {
		return fmt.Errorf("lock TTL %s is out of range: want at most %s (0 or none for the default): %w", t, maxLockTTL, errdefs.ErrInvalidArgument)
	}
	return nil
}

func ttlOf(d *durationpb.Duration) time.Duration {
	if d == nil || d.AsDuration() == 0 {
		return defaultLockTT
	}
	return d.AsDuration()
}

// kvCall runs a KV request (encoded as its protobuf request) on the system
// group and decodes the protobuf response into out.
func (n *node) kvCall(ctx context.Context, kind string, req, out proto.Message) error {
	if _, err := n.raftHost(); err != nil {
		return err
	}
	d, err := n.ensureSystem(ctx)
	if err != nil {
		return err
	}
	payload, err := proto.Marshal(req)
	if err != nil {
		return err
	}
	resp, err := n.route(ctx, d, kind, payload, "")
	if err != nil {
		return err
	}
	return proto.Unmarshal(resp, out)
}

// readKV returns this node's KV of system group g once it has applied
// everything committed before the call (a ReadIndex): a linearizable read.
func (n *node) readKV(ctx context.Context, h *raftgroup.Host, g raftgroup.GroupID) (*kvStore, error) {
	if _, err := h.ReadIndex(ctx, g); err != nil {
		return nil, err
	}
	kv := n.kvOf(g)
	if kv == nil {
		return nil, raftgroup.ErrGroupNotFound
	}
	return kv, nil
}

// localKV runs a KV request on this node's replica of system group g.
func (n *node) localKV(ctx context.Context, g raftgroup.GroupID, kind string, payload []byte) ([]byte, error) {
	h, err := n.raftHost()
	if err != nil {
		return nil, err
	}
	if !isSystemGroup(g) {
		return nil, fmt.Errorf("group %d is not the system group: %w", g, errdefs.ErrInvalidArgument)
	}
	bad := func(err error) error { return fmt.Errorf("%s payload: %v: %w", kind, err, errdefs.ErrInvalidArgument) }
	var out proto.Message
	switch kind {
	case kindMachineSet, kindMachineRead:
		return n.localMachine(ctx, h, g, kind, payload)
	case kindKVPut:
		var req volv1.PutRequest
		if err := proto.Unmarshal(payload, &req); err != nil {
			return nil, bad(err)
		}
		n.stats.proposals.Add(1)
		var res kvPutResult
		if err := h.DoQuorum(ctx, g, &kvPut{Key: req.GetKey(), Value: req.GetValue(), Compare: req.GetCompare(), Expect: req.GetExpectRevision(), IdemKey: req.GetIdempotencyKey()}, &res); err != nil {
			return nil, err
		}
		out = &volv1.PutResponse{Applied: res.Applied, Revision: res.Revision}
	case kindKVGet:
		var req volv1.GetRequest
		if err := proto.Unmarshal(payload, &req); err != nil {
			return nil, bad(err)
		}
		kv, err := n.readKV(ctx, h, g)
		if err != nil {
			return nil, err
		}
		resp := &volv1.GetResponse{}
		if e, ok := kv.get(req.GetKey()); ok {
			resp.Found, resp.Value, resp.Revision = true, e.Value, e.Revision
		}
		out = resp
	case kindLockAcquire:
		var req volv1.AcquireLockRequest
		if err := proto.Unmarshal(payload, &req); err != nil {
			return nil, bad(err)
		}
		n.stats.proposals.Add(1)
		l, err := h.AcquireLock(ctx, g, req.GetName(), req.GetHolder(), ttlOf(req.GetTtl()))
		if errors.Is(err, raftgroup.ErrLockHeld) {
			return nil, fmt.Errorf("lock %q is held by %q (token %d) until %s: %w", l.Name, l.Holder, l.Token, l.Expires.Format(time.RFC3339), errdefs.ErrFailedPrecondition)
		}
		if err != nil {
			return nil, err
		}
		out = leaseProto(l)
	case kindLockRenew:
		var req volv1.RenewLockRequest
		if err := proto.Unmarshal(payload, &req); err != nil {
			return nil, bad(err)
		}
		n.stats.proposals.Add(1)
		l, err := h.RenewLock(ctx, g, raftgroup.Lease{Name: req.GetName(), Holder: req.GetHolder(), Token: req.GetToken()}, ttlOf(req.GetTtl()))
		if errors.Is(err, raftgroup.ErrLeaseLost) {
			return nil, fmt.Errorf("lock %q: %q with token %d no longer holds it: %w", req.GetName(), req.GetHolder(), req.GetToken(), errdefs.ErrFailedPrecondition)
		}
		if err != nil {
			return nil, err
		}
		out = leaseProto(l)
	case kindLockRelease:
		var req volv1.ReleaseLockRequest
		if err := proto.Unmarshal(payload, &req); err != nil {
			return nil, bad(err)
		}
		n.stats.proposals.Add(1)
		err := h.ReleaseLock(ctx, g, raftgroup.Lease{Name: req.GetName(), Holder: req.GetHolder(), Token: req.GetToken()})
		if errors.Is(err, raftgroup.ErrLeaseLost) {
			return nil, fmt.Errorf("lock %q: %q with token %d does not hold it: %w", req.GetName(), req.GetHolder(), req.GetToken(), errdefs.ErrFailedPrecondition)
		}
		if err != nil {
			return nil, err
		}
		out = &volv1.ReleaseLockResponse{}
	case kindLockList:
		leases, err := h.Locks(ctx, g)
		if err != nil {
			return nil, err
		}
		// Expired leases stay in the table until an entry replaces them;
		// listing shows held locks, judged by this node's clock.
		now := time.Now()
		resp := &volv1.ListLocksResponse{}
		for _, l := range leases {
			if l.Expires.After(now) {
				resp.Leases = append(resp.Leases, leaseProto(l))
			}
		}
		slices.SortFunc(resp.Leases, func(a, b *volv1.Lease) int { return strings.Compare(a.GetName(), b.GetName()) })
		out = resp
	default:
		return nil, fmt.Errorf("unknown KV request kind %q: %w", kind, errdefs.ErrInvalidArgument)
	}
	return proto.Marshal(out)
}

func leaseProto(l raftgroup.Lease) *volv1.Lease {
	return &volv1.Lease{Name: l.Name, Holder: l.Holder, Token: l.Token, Expires: timestamppb.New(l.Expires)}
}

// ensureSystem returns the system group's document, creating the group
// on first use. So that racing first uses do not create two groups (the
// loser's writes would vanish with its document), only one node creates
// it: the lowest live node that answers; others ask it over VolPeer.
func (n *node) ensureSystem(ctx context.Context) (*volumeDoc, error) {
	if d := n.volumeDoc(systemVolume); d != nil {
		return d, nil
	}
	var ids []string
	for _, c := range n.candidates() {
		ids = append(ids, c.Node)
	}
	slices.Sort(ids)
	var last error
	for _, id := range ids {
		if id == n.id {
			return n.ensureSystemLocal(ctx)
		}
		resp, err := n.forwardTo(ctx, id, &volv1.ForwardRequest{Kind: kindSystemEnsure})
		if err == nil {
			var d volumeDoc
			if err := json.Unmarshal(resp.GetPayload(), &d); err != nil {
				return nil, fmt.Errorf("system group from %s: %w", id, err)
			}
			return &d, nil
		}
		last = err
		if status.Code(err) != codes.Unavailable && status.Code(err) != codes.DeadlineExceeded {
			return nil, err
		}
	}
	return nil, fmt.Errorf("cannot create the system group: %w", last)
}

// ensureSystemLocal creates the system group from this node unless its
// document exists (read from statd itself, not the mirror, which may lag).
func (n *node) ensureSystemLocal(ctx context.Context) (*volumeDoc, error) {
	n.sysMu.Lock()
	defer n.sysMu.Unlock()
	if d, err := n.readVolume(ctx, systemVolume); err != nil || d != nil {
		return d, err
	}
	return n.createVolume(ctx, systemVolume, DefaultReplicas, 0)
}
