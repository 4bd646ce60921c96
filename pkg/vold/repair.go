package vold

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	"github.com/shoal-dev/shoal/pkg/volfs"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

// Repair. The leader of each group checks its voters against statd's
// membership every repair_interval. A voter whose node has been dead for
// replace_after is replaced, and so is one whose vold has sent this
// leader's vold nothing for twice replace_after while statd has counted
// its node alive all along (vold crashed for good, or cannot start
// there). The volds of nodes that share groups ping each other a few
// times per election timeout even when every group is quiesced
// (raftgroup.Host.PeerSilence), so such a silence is not idleness. The
// silence counts only from when statd last saw the node come alive: a
// node that restarts is back in statd's view before its vold has
// started, and the vold then has twice replace_after to start (opening
// its store and groups can take a while on a busy node) before its
// replicas go. The replacement:
//
//  1. pick a live node that holds no replica of the group and whose vold
//     answers a ping (placement rule: fewest replicas hosted, then node
//     ID; probe.go) and a replica ID the group has never used;
//  2. add the new member to the volume document (not Boot), so that its
//     node's vold joins the group with an empty replica;
//  3. swap the dead replica for the new one in one joint-consensus change
//     (raftgroup.Replace): the group never has an even number of voters,
//     and the new replica catches up from a snapshot;
//  4. rewrite the document's members from the group's new voters.
//
// Step 4 also runs on its own whenever the document and the voters
// disagree (a leader that crashed between 3 and 4, say), keeping members
// that are pending (added in step 2, not yet voters) for pendingGrace.
//
// A group that has lost its quorum (one of one, two of three) has no
// leader and cannot be repaired; it waits for its nodes to come back.

// pendingGrace is how long a member added to a document may wait to
// become a voter before a leader drops it from the document.
const pendingGrace = 2 * time.Minute

// changeTimeout bounds one membership change.
const changeTimeout = 30 * time.Second

func (n *node) repairLoop(ctx context.Context) {
	t := time.NewTicker(time.Duration(n.cfg.RepairInterval))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n.repairRound(ctx)
	}
}

func (n *node) repairRound(ctx context.Context) {
	h := n.host.Load()
	if h == nil || !n.synced.Load() {
		return
	}
	// With every node alive there is nothing to replace; a full sweep
	// still runs now and then, to bring documents in line with voters
	// after a replacement a leader change interrupted. Skipping the rest
	// keeps an idle node with a thousand groups idle.
	n.raiseLevels(ctx, h)
	silent := n.silentVolds(h)
	n.scaleVolumes(ctx, h, silent)
	if !n.anyNodeDead() && len(silent) == 0 && time.Since(n.lastSweep) < repairSweep {
		return
	}
	n.lastSweep = time.Now()
	docs := n.volumeDocs()
	byGroup := map[raftgroup.GroupID]string{}
	for name, d := range docs {
		byGroup[d.group()] = name
	}
	for _, g := range h.Groups() {
		if ctx.Err() != nil {
			return
		}
		st, ok := leading(h, g)
		if !ok {
			continue
		}
		name, ok := byGroup[g]
		if !ok {
			continue
		}
		if err := n.repairGroup(ctx, name, docs[name], st, silent); err != nil {
			n.log.Warn("repair volume", "volume", name, "group", uint64(g), "err", err)
		}
		n.forgetDeadHolders(ctx, h, g, name)
	}
}

// leading returns group g's status when this node leads it in a settled
// configuration (not joint, the replica neither removed nor retiring):
// only then may it change the group's members or level. Brief, which
// does not wait for the host's loop, rules out most groups first.
func leading(h *raftgroup.Host, g raftgroup.GroupID) (raftgroup.GroupStatus, bool) {
	if b, err := h.Brief(g); err != nil || !b.Leader || b.Removed || b.Retiring {
		return raftgroup.GroupStatus{}, false
	}
	st, err := h.Status(g)
	if err != nil || st.Role != "leader" || len(st.VotersOutgoing) > 0 || st.Removed || st.Retiring {
		return raftgroup.GroupStatus{}, false
	}
	return st, true
}

// forgetDeadHolders frees the open-unlinked files that mounts on nodes
// dead for replace_after hold in group g (led here): their processes are
// gone with the node, and no new mount there will sweep them while the
// node stays away. A node cut off, not dead, loses them too, as it loses
// its replicas.
func (n *node) forgetDeadHolders(ctx context.Context, h *raftgroup.Host, g raftgroup.GroupID, name string) {
	fs := volumeFS(h, g)
	if fs == nil {
		return
	}
	for _, node := range fs.HeldNodes() {
		if n.deadFor(node) <= time.Duration(n.cfg.ReplaceAfter) {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, changeTimeout)
		// No session named: every one of the node's goes.
		err := (&volfs.Client{B: volfs.HostBackend{Host: h, Group: g}}).ForgetOthers(cctx, volfs.Holder{Node: node})
		cancel()
		if err != nil {
			n.log.Warn("free the unlinked files a dead node held open", "volume", name, "node", node, "err", err)
			continue
		}
		n.log.Info("freed the unlinked files a dead node held open", "volume", name, "node", node)
	}
}

// repairGroup replaces at most one dead voter of a group this node leads,
// or brings the document in line with the voters.
func (n *node) repairGroup(ctx context.Context, name string, d *volumeDoc, st raftgroup.GroupStatus, silent map[string]bool) error {
	var dead *raftgroup.Member
	why := "node dead"
	for _, v := range st.Voters {
		node := n.names.name(v.Node)
		if n.deadFor(node) > time.Duration(n.cfg.ReplaceAfter) {
			dead = &v
			break
		}
		if silent[node] {
			dead, why = &v, "vold silent"
			break
		}
	}
	if dead == nil {
		// Most rounds change nothing: judge from the mirror before reading
		// statd.
		if slices.Equal(n.membersFor(d.Members, st.Voters, st.Learners, st.MaxReplica), d.Members) {
			return nil
		}
		return n.syncMembers(ctx, name, d.group(), st.Voters, st.Learners, st.MaxReplica)
	}
	deadNode := n.names.name(dead.Node)
	h := n.host.Load()

	// A member pending from an earlier attempt on a live node is the
	// replacement; otherwise place a new one.
	var target docMember
	for _, m := range d.Members {
		if m.Boot || raftgroup.ReplicaID(m.Replica) <= st.MaxReplica || !n.alive(m.Node) || isVoterNode(st.Voters, m.Node, n.names) {
			continue
		}
		if !n.answering(ctx, []string{m.Node})[m.Node] {
			// Its pendingGrace runs out, and a node that answers is placed.
			continue
		}
		target = m
		break
	}
	if target.Node == "" {
		picked := n.placeReplicas(ctx, d, 1, n.takenFor(d, st, silent))
		if len(picked) == 0 {
			n.log.Debug("no node to replace a dead replica on", "volume", name, "dead_node", deadNode)
			return nil
		}
		next, err := h.NextReplicaID(d.group())
		if err != nil {
			return err
		}
		target = docMember{Node: picked[0], Replica: max(uint64(next), d.maxReplica()+1), Added: time.Now().UTC()}
		if err := n.updateMembers(ctx, name, d.group(), func(ms []docMember) []docMember { return append(ms, target) }); err != nil {
			return fmt.Errorf("add replica %d on %s to the document: %w", target.Replica, target.Node, err)
		}
	}
	targetID, err := n.names.add(target.Node)
	if err != nil {
		return err
	}
	n.log.Info("replacing dead replica", "volume", name, "group", uint64(d.group()), "why", why,
		"dead_node", deadNode, "dead_replica", uint64(dead.Replica), "new_node", target.Node, "new_replica", target.Replica)
	cctx, cancel := context.WithTimeout(ctx, changeTimeout)
	defer cancel()
	m, err := h.ChangeMembership(cctx, d.group(), raftgroup.Replace(dead.Replica, raftgroup.ReplicaID(target.Replica), targetID)...)
	if err != nil {
		if errors.Is(err, raftgroup.ErrReplicaIDReused) || errors.Is(err, raftgroup.ErrInvalidChange) {
			// Drop the pending member so the next round starts afresh.
			_ = n.updateMembers(ctx, name, d.group(), func(ms []docMember) []docMember {
				return slices.DeleteFunc(ms, func(x docMember) bool { return x.Node == target.Node && x.Replica == target.Replica })
			})
		}
		return fmt.Errorf("replace replica %d on %s with %d on %s: %w", dead.Replica, deadNode, target.Replica, target.Node, err)
	}
	n.stats.replaced.Add(1)
	n.log.Info("dead replica replaced", "volume", name, "group", uint64(d.group()), "why", why, "dead_node", deadNode, "new_node", target.Node, "config_index", m.Index)
	maxRep := raftgroup.ReplicaID(target.Replica)
	return n.syncMembers(ctx, name, d.group(), m.Voters, m.Learners, maxRep)
}

// silentVolds returns the nodes whose vold has sent this one nothing for
// twice replace_after while statd has counted the node alive (those statd
// counts dead are deadFor's). Only nodes this vold shares a group with
// are known.
func (n *node) silentVolds(h *raftgroup.Host) map[string]bool {
	return silentLongerThan(n.peerSilence(h), n.aliveFor, 2*time.Duration(n.cfg.ReplaceAfter))
}

// peerSilence is h.PeerSilence by node name: how long each vold this one
// shares a group with has sent it nothing.
func (n *node) peerSilence(h *raftgroup.Host) map[string]time.Duration {
	out := map[string]time.Duration{}
	for id, d := range h.PeerSilence() {
		out[n.names.name(id)] = d
	}
	return out
}

// silentLongerThan returns the nodes silent for longer than limit, a
// silence counting only from when the node was last seen to come alive
// (aliveFor: zero while it is not alive).
func silentLongerThan(silence map[string]time.Duration, aliveFor func(string) time.Duration, limit time.Duration) map[string]bool {
	var out map[string]bool
	for node, d := range silence {
		if min(d, aliveFor(node)) <= limit {
			continue
		}
		if out == nil {
			out = map[string]bool{}
		}
		out[node] = true
	}
	return out
}

func isVoterNode(voters []raftgroup.Member, node string, names *nodeNames) bool {
	return slices.ContainsFunc(voters, func(v raftgroup.Member) bool { return names.name(v.Node) == node })
}

// syncMembers rewrites the document's members to be the group's voters
// and learners (marked so), keeping what the document knew about each
// (Boot, Added) and members still pending (never admitted, added less
// than pendingGrace ago).
func (n *node) syncMembers(ctx context.Context, name string, g raftgroup.GroupID, voters, learners []raftgroup.Member, maxReplica raftgroup.ReplicaID) error {
	if len(voters) == 0 {
		return nil
	}
	return n.updateMembers(ctx, name, g, func(ms []docMember) []docMember {
		return n.membersFor(ms, voters, learners, maxReplica)
	})
}

// membersFor returns the document members that match voters and learners
// (see syncMembers), learners marked so.
func (n *node) membersFor(ms []docMember, voters, learners []raftgroup.Member, maxReplica raftgroup.ReplicaID) []docMember {
	var out []docMember
	for i, v := range slices.Concat(voters, learners) {
		node := n.names.name(v.Node)
		learner := i >= len(voters)
		k := slices.IndexFunc(ms, func(m docMember) bool { return m.Node == node && m.Replica == uint64(v.Replica) })
		m := docMember{Node: node, Replica: uint64(v.Replica), Added: time.Now().UTC()}
		if k >= 0 {
			m = ms[k]
		}
		m.Learner = learner
		out = append(out, m)
	}
	for _, m := range ms {
		pending := !m.Boot && raftgroup.ReplicaID(m.Replica) > maxReplica && time.Since(m.Added) < pendingGrace
		if pending && !slices.ContainsFunc(out, func(o docMember) bool { return o.Node == m.Node }) {
			out = append(out, m)
		}
	}
	return out
}

// updateMembers applies fn to the members of the volume's current
// document (read from statd) and writes it back if they changed. It does
// nothing when the document is gone or names another group.
func (n *node) updateMembers(ctx context.Context, name string, g raftgroup.GroupID, fn func([]docMember) []docMember) error {
	var members []docMember
	changed := false
	err := n.updateDoc(ctx, name, g, func(d *volumeDoc) {
		members = fn(slices.Clone(d.Members))
		changed = !slices.Equal(members, d.Members)
		d.Members = members
	})
	if err == nil && changed {
		n.log.Info("volume members updated", "volume", name, "group", uint64(g), "members", memberList(members))
	}
	return err
}

// updateDoc applies fn to the volume's current document (read from statd)
// and writes it back if it changed. It does nothing when the document is
// gone or names another group.
func (n *node) updateDoc(ctx context.Context, name string, g raftgroup.GroupID, fn func(*volumeDoc)) error {
	d, err := n.readVolume(ctx, name)
	if err != nil || d == nil || d.group() != g {
		return err
	}
	before, err := encodeVolume(d)
	if err != nil {
		return err
	}
	fn(d)
	fields, err := encodeVolume(d)
	if err != nil {
		return err
	}
	if fields[fieldVolume].GetStringValue() == before[fieldVolume].GetStringValue() {
		return nil
	}
	_, err = n.statd.Put(ctx, &statev1.PutRequest{Key: volumeKey(name), Fields: fields})
	return err
}

func memberList(ms []docMember) string {
	s := ""
	for i, m := range ms {
		if i > 0 {
			s += ","
		}
		s += fmt.Sprintf("%s/%d", m.Node, m.Replica)
	}
	return s
}

// repairSweep is how often repair looks at every group it leads even when
// no node is dead.
const repairSweep = 30 * time.Second
