package volfs

import (
	"context"
	"fmt"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
)

// HostBackend is the Backend of a node that holds a replica of the volume:
// mutations are proposed through the local host (which forwards them to
// the leader and retries them, idempotently, until applied), and queries
// run on the local replica after a ReadIndex, which makes them
// linearizable on followers too. The host must be running (Host.Run).
type HostBackend struct {
	Host  *raftgroup.Host
	Group raftgroup.GroupID
}

var _ Backend = HostBackend{}

// Mutate implements Backend. The proposal carries the request's key
// (RequestKey), and its outcome is awaited even once ctx is cancelled:
// a FUSE request is cancelled when the kernel interrupts it (any signal to
// the caller, Go's preemption included), and answering EINTR for a
// mutation that then applies makes the caller's retry apply it twice (an
// O_APPEND write appended twice). The host fails it if it stops. vold's
// own backend does the same with a grace period.
func (b HostBackend) Mutate(ctx context.Context, op []byte) ([]byte, error) {
	r, err := b.Host.Submit(b.Group, raftgroup.Proposal{Data: op, Key: RequestKey(ctx)}).Wait(context.WithoutCancel(ctx))
	if err != nil {
		return nil, fmt.Errorf("volume group %d: propose: %w", b.Group, err)
	}
	return r.Data, nil
}

// Query implements Backend.
func (b HostBackend) Query(ctx context.Context, req []byte) ([]byte, error) {
	if _, err := b.Host.ReadIndex(ctx, b.Group); err != nil {
		return nil, fmt.Errorf("volume group %d: read index: %w", b.Group, err)
	}
	return QueryHost(b.Host, b.Group, req)
}

// QueryHost runs an encoded query on the local replica of group g as it is
// now (no ReadIndex: call one first for a linearizable read). The query
// runs outside the host's loop lock (FS has its own), so a large read or a
// digest does not stall the host's other groups, and it does not wait for
// the loop's round in progress either (Host.Machine).
func QueryHost(h *raftgroup.Host, g raftgroup.GroupID, req []byte) ([]byte, error) {
	sm, err := h.Machine(g)
	if err != nil {
		return nil, fmt.Errorf("volume group %d: %w", g, err)
	}
	fs, ok := sm.(*FS)
	if !ok {
		return nil, fmt.Errorf("volfs: group %d runs %T, not a volume", g, sm)
	}
	return fs.Query(req)
}
