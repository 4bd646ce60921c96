package schedd

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/shoal-dev/shoal/pkg/client"
	"github.com/shoal-dev/shoal/pkg/sched"
	"github.com/shoal-dev/shoal/pkg/statepb"
	clusterv1 "github.com/shoal-dev/shoal/proto/shoal/cluster/v1"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

var errUnavailable = errdefs.ErrUnavailable

// run waits until the node is in a cluster, sets up what needs the
// cluster identity, then runs the scheduling loop until ctx ends.
func (n *node) run(ctx context.Context) error {
	idr, err := n.identity.Wait(ctx, n.statd.Cluster, n.log)
	if err != nil {
		return nil // ctx ended
	}
	n.id = idr.GetNodeId()
	n.log = n.log.With("node", n.id)
	n.mirror = client.NewMirror(n.statd, n.log.With("component", "mirror"),
		sched.ServicesPrefix, sched.SlotsPrefix, sched.TasksPrefix, sched.NodesPrefix, imagesPrefix)
	changes := n.mirror.Changes()
	go n.mirror.Run(ctx)
	go n.identity.Follow(ctx, n.statd.Cluster, n.log)
	go n.aliveLoop(ctx)
	go n.releases.run(ctx)
	n.peers = newPeerPool(n)
	if err := n.servePeers(ctx, idr.GetAdvertiseIp()); err != nil {
		return err
	}
	for !n.mirror.Ready() {
		select {
		case <-ctx.Done():
			return nil
		case <-changes:
		case <-time.After(100 * time.Millisecond):
		}
	}
	n.waitStatdSynced(ctx)
	if err := n.adopt(ctx); err != nil {
		return fmt.Errorf("re-adopt tasks: %w", err)
	}
	if err := n.publishNode(ctx); err != nil {
		n.log.Warn("publish node capacity", "err", err)
	}
	go n.publishImages(ctx)
	close(n.ready)
	n.log.Info("scheduler ready", "capacity", n.capacity.String(), "tasks", len(n.local))

	tick := time.NewTicker(time.Duration(n.cfg.Tick))
	defer tick.Stop()
	var republished time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-changes:
		case <-n.kick:
		}
		now := time.Now()
		n.agentRounds(ctx, now)
		n.ownerRound(ctx, now)
		n.dropRemovedImages(ctx, now)
		// The other nodes leave this one out while its document says it
		// shut down: a failed publishNode must not leave it so.
		if n.shutDown(n.id) && now.Sub(republished) > time.Second {
			republished = now
			if err := n.publishNode(ctx); err != nil {
				n.log.Warn("publish node capacity", "err", err)
			}
		}
	}
}

// waitStatdSynced waits (a few seconds at most) until statd has completed
// an anti-entropy round since schedd started, so that the agent's first
// decisions see what changed while this node was away: a node returning
// from the dead must stop tasks others replaced, not restart them.
func (n *node) waitStatdSynced(ctx context.Context) {
	start := time.Now()
	deadline := start.Add(5 * time.Second)
	for time.Now().Before(deadline) {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := n.statd.Cluster.Status(cctx, &clusterv1.StatusRequest{})
		cancel()
		if err == nil {
			peer, others := syncedSince(st, start)
			if !others {
				return // alone in the cluster: nothing to catch up with
			}
			if peer != "" {
				if err := n.mirrorCatchUp(ctx); err == nil {
					return
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
	n.log.Warn("statd has not synced with a peer yet; going on")
}

// syncedSince returns a member with which statd completed an anti-entropy
// round after since ("" if none), and whether statd knows other members
// at all (dead ones too: a node back from a partition may still hold the
// others dead).
func syncedSince(st *clusterv1.StatusResponse, since time.Time) (peer string, others bool) {
	for _, m := range st.GetMembers() {
		if m.GetSelf() {
			continue
		}
		others = true
		if ls := m.GetSync().GetLastSync(); ls != nil && ls.AsTime().After(since) {
			return m.GetId(), true
		}
	}
	return "", others
}

// mirrorCatchUp waits until the mirror reflects statd's current revision:
// a round that completed may still be on its way through the watch.
func (n *node) mirrorCatchUp(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	// A marker write under a mirrored prefix, then wait to see it: the
	// watch delivers in revision order, so everything before it is in.
	key := sched.NodeKey(n.id)
	if err := n.put(ctx, key, map[string]crdtValue{"schedd_started": stringValue(time.Now().UTC().Format(time.RFC3339Nano))}); err != nil {
		return err
	}
	want := ""
	if d, err := n.getMeta(ctx, key); err == nil {
		want = d.GetFields()["schedd_started"].GetStringValue()
	}
	for ctx.Err() == nil {
		if d := n.mirror.Get(key); d != nil && d.GetFields()["schedd_started"].GetStringValue() == want {
			return nil
		}
		select {
		case <-cctx.Done():
			return cctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return ctx.Err()
}

// aliveLoop follows statd's membership view: the nodes it reports alive,
// and when a member it had reported dead came back (a partition healing:
// the owners hold off replacing the tasks of nodes still seen dead, see
// sched.Snapshot.Rejoined).
func (n *node) aliveLoop(ctx context.Context) {
	dead := map[string]bool{}
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := n.statd.Cluster.Status(cctx, &clusterv1.StatusRequest{})
		cancel()
		if err == nil {
			// A suspect is alive until declared dead (DESIGN.md 4): a node
			// that is only slow must not have its tasks duplicated.
			var alive []string
			for _, m := range st.GetMembers() {
				switch s := m.GetState(); s {
				case "alive", "suspect":
					alive = append(alive, m.GetId())
					if dead[m.GetId()] {
						delete(dead, m.GetId())
						n.rejoined.Store(time.Now().UnixNano())
						n.log.Info("member back", "member", m.GetId())
					}
				case "dead":
					dead[m.GetId()] = true
				}
			}
			// Nodes whose machines shut down are left out at once.
			alive = sched.Up(alive, n.id, n.shutDown)
			if prev := n.alive.Load(); prev == nil || strings.Join(*prev, ",") != strings.Join(alive, ",") {
				n.alive.Store(&alive)
				n.wake()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// aliveNodes returns the IDs statd last reported alive, less those whose
// machines shut down (sched.Up; this node always).
func (n *node) aliveNodes() []string {
	if p := n.alive.Load(); p != nil && len(*p) > 0 {
		return *p
	}
	return []string{n.id}
}

// publishNode writes this node's capacity and (if unset) availability,
// and that it is up (clearing a shutdown's word, see stopForShutdown).
func (n *node) publishNode(ctx context.Context) error {
	avail := sched.Active
	if d := n.mirror.Get(sched.NodeKey(n.id)); d != nil {
		avail = sched.NodeFromDoc(n.id, statepb.FromDocument(d), true).Availability
	}
	fields := sched.NodeFields(n.capacity, avail)
	fields["schedd_port"] = intValue(int64(n.cfg.PeerPort))
	return n.put(ctx, sched.NodeKey(n.id), fields)
}

// nodes returns every node that has not left, with this node's liveness
// view.
func (n *node) nodes() []sched.Node {
	up := map[string]bool{}
	for _, id := range n.aliveNodes() {
		up[id] = true
	}
	var out []sched.Node
	for _, d := range n.mirror.List(sched.NodesPrefix) {
		id := strings.TrimPrefix(d.GetKey(), sched.NodesPrefix)
		if d.GetFields()["left"].GetBoolValue() {
			continue
		}
		out = append(out, sched.NodeFromDoc(id, statepb.FromDocument(d), up[id]))
	}
	return out
}

// nodeAddr returns host:port of a node's scheduler peer API.
func (n *node) nodeAddr(id string) (string, error) {
	d := n.mirror.Get(sched.NodeKey(id))
	if d == nil {
		return "", fmt.Errorf("unknown node %s: %w", id, errdefs.ErrNotFound)
	}
	addr := d.GetFields()["addr"].GetStringValue()
	port := d.GetFields()["schedd_port"].GetIntValue()
	if port == 0 {
		port = int64(n.cfg.PeerPort)
	}
	if addr == "" {
		return "", fmt.Errorf("node %s has no address: %w", id, errdefs.ErrUnavailable)
	}
	return net.JoinHostPort(addr, strconv.FormatInt(port, 10)), nil
}

// put writes fields of a document through statd.
func (n *node) put(ctx context.Context, key string, fields map[string]crdtValue) error {
	pf := make(map[string]*statev1.Value, len(fields))
	for k, v := range fields {
		pf[k] = statepb.ToValue(v)
	}
	_, err := n.statd.Put(ctx, &statev1.PutRequest{Key: key, Fields: pf})
	return err
}

// getMeta reads a document with its stamps, straight from statd.
func (n *node) getMeta(ctx context.Context, key string) (*statev1.Document, error) {
	resp, err := n.statd.Get(ctx, &statev1.GetRequest{Key: key, WithMeta: true})
	if err != nil {
		return nil, err
	}
	return resp.GetDocument(), nil
}
