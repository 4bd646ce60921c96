package vold

import (
	"context"
	"encoding/json"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
	volv1 "github.com/shoal-dev/shoal/proto/shoal/vol/v1"
)

// askMountUsers asks every other live node's vold for its recorded users
// of a volume, at once, and returns the answers by node.
func (n *node) askMountUsers(ctx context.Context, name string) map[string][]string {
	var nodes []string
	if m := n.members.Load(); m != nil {
		for id := range m.members {
			if id != n.id && n.alive(id) {
				nodes = append(nodes, id)
			}
		}
	}
	return askEach(nodes, func(id string) ([]string, bool) {
		users, err := n.remoteMountUsers(ctx, id, name)
		if err != nil {
			n.log.Debug("mount users not confirmed by the node's vold; its record as statd has it counts", "volume", name, "peer_node", id, "err", err)
			return nil, false
		}
		return users, true
	})
}

// remoteMountUsers asks node's vold for its recorded users of a volume.
func (n *node) remoteMountUsers(ctx context.Context, node, name string) ([]string, error) {
	resp, err := n.askPeer(ctx, node, &volv1.ForwardRequest{Kind: kindMountUsers, Payload: []byte(name)})
	if err != nil {
		return nil, err
	}
	var users []string
	if err := json.Unmarshal(resp.GetPayload(), &users); err != nil {
		return nil, fmt.Errorf("mount users from %s: %w", node, err)
	}
	return users, nil
}

// kindMountUsers asks a vold for its own node's recorded users of a volume
// (payload: the name), as its statd has them: that statd took the
// record's every write.
const kindMountUsers = "mount.users"

// ownMountUsers answers kindMountUsers.
func (n *node) ownMountUsers(ctx context.Context, name string) ([]byte, error) {
	if err := validateName(name); err != nil {
		return nil, err
	}
	var users []string
	resp, err := n.statd.Get(ctx, &statev1.GetRequest{Key: mountKey(name, n.id)})
	switch {
	case status.Code(err) == codes.NotFound:
	case err != nil:
		return nil, fmt.Errorf("read mount record of volume %q: %w", name, err)
	default:
		users = decodeUsers(resp.GetDocument())
	}
	if users == nil {
		users = []string{}
	}
	return json.Marshal(users)
}
