package vold

import (
	"context"
	"fmt"
	"golang.org/x/sys/unix"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/containerd/errdefs"

	clusterv1 "github.com/shoal-dev/shoal/proto/shoal/cluster/v1"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

// membership is statd's view of the cluster's members.
type membership struct {
	at      time.Time
	members map[string]memberView
}

type memberView struct {
	// State is alive, suspect, dead or left.
	State string
	// Since is when the member entered State.
	Since time.Time
}

// membershipLoop follows statd's membership view.
func (n *node) membershipLoop(ctx context.Context) {
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := n.statd.Cluster.Status(cctx, &clusterv1.StatusRequest{})
		cancel()
		if err == nil {
			m := &membership{at: time.Now(), members: map[string]memberView{}}
			changed := false
			prev := n.members.Load()
			for _, s := range st.GetMembers() {
				v := memberView{State: s.GetState(), Since: s.GetSince().AsTime()}
				if s.GetSelf() {
					v.State = "alive"
				}
				m.members[s.GetId()] = v
				if prev == nil || prev.members[s.GetId()].State != v.State {
					changed = true
				}
			}
			n.members.Store(m)
			if changed {
				n.wake()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// alive reports whether statd counts node alive. A suspect is alive until
// declared dead: a slow node must not lose its replicas.
func (n *node) alive(node string) bool {
	if node == n.id {
		return true
	}
	m := n.members.Load()
	if m == nil {
		return false
	}
	s := m.members[node].State
	return s == "alive" || s == "suspect"
}

// otherLiveNodes lists the live members other than this node.
func (n *node) otherLiveNodes() []string {
	var nodes []string
	if m := n.members.Load(); m != nil {
		for id := range m.members {
			if id != n.id && n.alive(id) {
				nodes = append(nodes, id)
			}
		}
	}
	return nodes
}

// anyNodeDead reports whether statd counts any member dead or left.
func (n *node) anyNodeDead() bool {
	m := n.members.Load()
	if m == nil {
		return false
	}
	for _, v := range m.members {
		if v.State == "dead" || v.State == "left" {
			return true
		}
	}
	return false
}

// aliveFor returns how long statd has counted node alive (not suspect)
// without a break; zero when it does not now.
func (n *node) aliveFor(node string) time.Duration {
	m := n.members.Load()
	if m == nil {
		return 0
	}
	v, ok := m.members[node]
	if !ok || v.State != "alive" {
		return 0
	}
	return time.Since(v.Since)
}

// deadFor returns how long statd has counted node dead (or left); zero
// when it is alive or unknown.
func (n *node) deadFor(node string) time.Duration {
	m := n.members.Load()
	if m == nil || node == n.id {
		return 0
	}
	v, ok := m.members[node]
	if !ok || (v.State != "dead" && v.State != "left") {
		return 0
	}
	return time.Since(v.Since)
}

// candidates are the live nodes that run vold (they published a peer
// port), with how many replicas each hosts.
func (n *node) candidates() []candidate {
	hosted, reserved := hostedCounts(n.allVolumeDocs())
	free := func(f map[string]*statev1.Value, id string) int64 {
		v, ok := f[fieldVoldFree]
		if !ok {
			return unknownFree
		}
		return v.GetIntValue() - reserved[id]
	}
	var out []candidate
	for _, d := range n.mirror.List(nodesPrefix) {
		id := d.GetKey()[len(nodesPrefix):]
		f := d.GetFields()
		if f["left"].GetBoolValue() || f[fieldVoldPort].GetIntValue() == 0 || !n.alive(id) {
			continue
		}
		if _, err := raftNodeID(id); err != nil {
			continue
		}
		out = append(out, candidate{Node: id, Hosted: hosted[id], Free: free(f, id)})
	}
	if !slices.ContainsFunc(out, func(c candidate) bool { return c.Node == n.id }) {
		out = append(out, candidate{Node: n.id, Hosted: hosted[n.id], Free: n.freeBytes() - reserved[n.id]})
	}
	return out
}

// peerAddr returns host:port of node's VolPeer.
func (n *node) peerAddr(node string) (string, error) {
	d := n.mirror.Get(nodesPrefix + node)
	if d == nil {
		return "", fmt.Errorf("unknown node %s: %w", node, errdefs.ErrUnavailable)
	}
	addr := d.GetFields()["addr"].GetStringValue()
	port := d.GetFields()[fieldVoldPort].GetIntValue()
	if port == 0 {
		port = int64(n.cfg.PeerPort)
	}
	if addr == "" {
		return "", fmt.Errorf("node %s has no address: %w", node, errdefs.ErrUnavailable)
	}
	if h, _, err := net.SplitHostPort(addr); err == nil {
		addr = h
	}
	return net.JoinHostPort(addr, strconv.FormatInt(port, 10)), nil
}

// publishNode writes this node's VolPeer port, free space and volume
// level (level.go) into its node document. The free space is written
// again only when it moved by more than 5% and at least 1 GiB, not on
// every byte written.
func (n *node) publishNode(ctx context.Context) error {
	free := n.freeBytes()
	if d := n.mirror.Get(nodesPrefix + n.id); d != nil {
		f := d.GetFields()
		old, ok := f[fieldVoldFree]
		moved := free - old.GetIntValue()
		if moved < 0 {
			moved = -moved
		}
		if f[fieldVoldPort].GetIntValue() == int64(n.cfg.PeerPort) && f[fieldVoldFSLevel].GetIntValue() == int64(n.level()) && ok && (moved <= old.GetIntValue()/20 || moved < 1<<30) {
			return nil
		}
	}
	_, err := n.statd.Put(ctx, &statev1.PutRequest{Key: nodesPrefix + n.id, Fields: map[string]*statev1.Value{
		fieldVoldPort:    {Kind: &statev1.Value_IntValue{IntValue: int64(n.cfg.PeerPort)}},
		fieldVoldFree:    {Kind: &statev1.Value_IntValue{IntValue: free}},
		fieldVoldFSLevel: {Kind: &statev1.Value_IntValue{IntValue: int64(n.level())}},
	}})
	return err
}

// freeBytes is the space left for volumes on this node: what the state
// dir's file system offers unprivileged users, or the configured capacity
// when smaller.
func (n *node) freeBytes() int64 {
	var st unix.Statfs_t
	if err := unix.Statfs(n.cfg.StateDir, &st); err != nil {
		return 0
	}
	free := int64(st.Bavail) * st.Bsize
	if c := int64(n.cfg.Capacity); c > 0 && c < free {
		free = c
	}
	return free
}

// waitStatdSynced waits (ten seconds at most) until statd has completed an
// anti-entropy round with a peer since vold started, so that a volume
// deleted while this node was away is known before missing documents are
// taken to mean anything.
func (n *node) waitStatdSynced(ctx context.Context) {
	start := time.Now()
	deadline := start.Add(10 * time.Second)
	for time.Now().Before(deadline) {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := n.statd.Cluster.Status(cctx, &clusterv1.StatusRequest{})
		cancel()
		if err == nil {
			others := 0
			for _, m := range st.GetMembers() {
				if m.GetSelf() || m.GetState() == "left" {
					continue
				}
				others++
				if ls := m.GetSync().GetLastSync(); ls != nil && ls.AsTime().After(start) {
					return
				}
			}
			if others == 0 {
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
	n.log.Warn("statd has not synced with a peer yet; going on")
}
