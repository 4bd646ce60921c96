package vold

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
	volv1 "github.com/shoal-dev/shoal/proto/shoal/vol/v1"
)

// Removal fences. `volume rm` asks every live node's vold for its users
// of the volume, and a node that has none also stops mounting that
// volume from then on (it fences it), under the same lock as its mounts:
// so no mount can start between a node's "no users" and the volume's
// removal, however late that node's statd hears of the removal. A fence
// names the volume's group, so a new volume of the same name is not held
// up, and it lapses after removalFenceTTL; a removal that is refused or
// fails lifts the fences it set.

// removalFenceTTL is how long a node refuses to mount a volume after it
// told a removal it had no users, unless the removal lifts the fence: a
// removal that succeeded leaves it, so that a node whose statd has not
// heard of the removal yet does not mount the removed volume.
const removalFenceTTL = time.Minute

// kindRemovalFence asks a vold for its own node's recorded users of a
// volume, as its statd has them (that statd took the record's every
// write), and to fence the volume if it has none; kindRemovalLift lifts
// such a fence. Payload: a removalFence as JSON.
const (
	kindRemovalFence = "removal.fence"
	kindRemovalLift  = "removal.lift"
)

// removalFence names a volume incarnation a removal is under way for.
type removalFence struct {
	Name  string `json:"name"`
	Group uint64 `json:"group"`
}

// fenceHold is a fence as this node keeps it.
type fenceHold struct {
	group uint64
	until time.Time
}

// fenceOwn returns this node's recorded users of the volume and, when it
// has none, fences the volume on this node.
func (n *node) fenceOwn(ctx context.Context, f removalFence) ([]string, error) {
	n.mountMu.Lock()
	defer n.mountMu.Unlock()
	resp, err := n.statd.Get(ctx, &statev1.GetRequest{Key: mountKey(f.Name, n.id)})
	var users []string
	switch {
	case status.Code(err) == codes.NotFound:
	case err != nil:
		return nil, fmt.Errorf("read mount record of volume %q: %w", f.Name, err)
	default:
		users = decodeUsers(resp.GetDocument())
	}
	if len(users) == 0 {
		n.fences[f.Name] = fenceHold{group: f.Group, until: time.Now().Add(removalFenceTTL)}
	}
	return users, nil
}

// liftOwn lifts this node's fence of the volume incarnation, if any.
func (n *node) liftOwn(f removalFence) {
	n.mountMu.Lock()
	defer n.mountMu.Unlock()
	if h, ok := n.fences[f.Name]; ok && h.group == f.Group {
		delete(n.fences, f.Name)
	}
}

// fencedLocked returns an error when a removal fenced the volume
// incarnation of group on this node. The caller holds mountMu.
func (n *node) fencedLocked(name string, group uint64) error {
	h, ok := n.fences[name]
	if !ok {
		return nil
	}
	left := time.Until(h.until)
	if left <= 0 {
		delete(n.fences, name)
		return nil
	}
	if h.group != group {
		return nil
	}
	return fmt.Errorf("volume %q is being removed (if the removal fails, it can be mounted again within %s): %w",
		name, left.Round(time.Second), errdefs.ErrFailedPrecondition)
}

// fenceEach asks every other live node's vold for its users of the
// volume, fencing it where there are none, at once. It returns the
// answers by node: a node whose vold did not answer is missing.
func (n *node) fenceEach(ctx context.Context, f removalFence) map[string][]string {
	payload, _ := json.Marshal(f)
	return askEach(n.otherLiveNodes(), func(id string) ([]string, bool) {
		resp, err := n.askPeer(ctx, id, &volv1.ForwardRequest{Kind: kindRemovalFence, Payload: payload})
		var users []string
		if err == nil {
			err = json.Unmarshal(resp.GetPayload(), &users)
		}
		if err != nil {
			n.log.Debug("mount users not confirmed by the node's vold; its record as statd has it counts", "volume", f.Name, "peer_node", id, "err", err)
			return nil, false
		}
		return users, true
	})
}

// liftEach lifts the fences of the volume incarnation on nodes (this one
// included, if listed). A vold that does not answer keeps its fence until
// it lapses.
func (n *node) liftEach(ctx context.Context, f removalFence, nodes []string) {
	payload, _ := json.Marshal(f)
	askEach(nodes, func(id string) (struct{}, bool) {
		if id == n.id {
			n.liftOwn(f)
			return struct{}{}, true
		}
		if _, err := n.askPeer(ctx, id, &volv1.ForwardRequest{Kind: kindRemovalLift, Payload: payload}); err != nil {
			n.log.Warn("could not lift a removal's fence; it lapses by itself", "volume", f.Name, "peer_node", id, "after", removalFenceTTL, "err", err)
		}
		return struct{}{}, true
	})
}

// serveRemovalFence answers kindRemovalFence and kindRemovalLift.
func (n *node) serveRemovalFence(ctx context.Context, kind string, payload []byte) ([]byte, error) {
	var f removalFence
	if err := json.Unmarshal(payload, &f); err != nil {
		return nil, fmt.Errorf("removal fence: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	if err := validateName(f.Name); err != nil {
		return nil, err
	}
	if kind == kindRemovalLift {
		n.liftOwn(f)
		return nil, nil
	}
	users, err := n.fenceOwn(ctx, f)
	if err != nil {
		return nil, err
	}
	if users == nil {
		users = []string{}
	}
	return json.Marshal(users)
}
