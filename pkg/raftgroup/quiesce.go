package raftgroup

import (
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/tracker"
)

// tickOnce advances the host's logical clock: node liveness, one Raft tick
// for every awake group (or quiescence for an idle leader), request
// retries and liveness pings.
func (h *Host) tickOnce() {
	h.tick++
	h.releaseNotices()
	h.releaseDeferred(true)
	h.checkLiveness()
	for _, id := range h.sortedGroups(h.awake) {
		g := h.awake[id]
		if g.removed || g.broken != nil {
			delete(h.awake, id)
			continue
		}
		if h.canQuiesce(g) {
			h.quiesce(g)
			continue
		}
		g.rn.Tick()
		g.idleTicks++
		h.stats.Ticked++
		h.markDirty(g)
	}
	h.followProposers()
	h.askRetirements()
	for _, id := range h.sortedGroups(h.busy) {
		g := h.busy[id]
		g.retry(false)
		if !g.hasPending() {
			delete(h.busy, id)
		}
	}
	// Liveness pings: a peer that got nothing from us for pingTicks gets
	// an empty batch. One per node pair, whatever the number of groups, so
	// quiesced followers can tell that their leader's node is alive.
	for n, p := range h.peers {
		if h.tick-p.lastSent >= h.pingTicks() {
			h.outbox(n)
		}
	}
}

// pingTicks is the longest a peer goes without a batch from this host:
// three per election timeout (a peer is dead after a whole one without
// any), rather than one per heartbeat interval. Between idle nodes the
// pings, each a gRPC message over TLS woken and read on both sides, were
// about a quarter of an idle vold's CPU (perf, 1,000 quiesced volumes).
func (h *Host) pingTicks() uint64 {
	return uint64(max(h.cfg.HeartbeatTicks, h.cfg.ElectionTicks/3))
}

// checkLiveness marks peers we have not heard from for an election
// timeout as dead, and wakes the quiesced groups that have a replica
// there: their followers must be able to elect a new leader, and their
// leader to notice it lost its quorum.
func (h *Host) checkLiveness() {
	if h.peersStale {
		h.recomputePeers()
	}
	var died []NodeID
	for n, p := range h.peers {
		if !p.dead && h.tick-p.lastHeard > uint64(h.cfg.ElectionTicks) {
			p.dead = true
			died = append(died, n)
		}
	}
	if len(died) == 0 {
		return
	}
	for _, id := range h.sortedGroups(h.groups) {
		g := h.groups[id]
		if !g.quiesced {
			continue
		}
		for _, n := range g.meta.members {
			if containsNode(died, n) {
				h.wakeGroup(g)
				break
			}
		}
	}
}

func containsNode(ns []NodeID, n NodeID) bool {
	for _, m := range ns {
		if m == n {
			return true
		}
	}
	return false
}

// recomputePeers derives the peer nodes from the groups' memberships.
func (h *Host) recomputePeers() {
	h.peersStale = false
	want := map[NodeID]bool{}
	for _, g := range h.groups {
		if g.removed {
			continue
		}
		for _, n := range g.meta.members {
			if n != h.cfg.NodeID && n != 0 {
				want[n] = true
			}
		}
	}
	for n := range want {
		h.peer(n)
	}
	for n := range h.peers {
		if !want[n] {
			delete(h.peers, n)
		}
	}
}

// wakeGroup makes a quiesced group tick again and restarts its idle count.
func (h *Host) wakeGroup(g *group) {
	g.idleTicks = 0
	if g.removed || g.broken != nil {
		return
	}
	g.quiesced = false
	h.awake[g.id] = g
}

// canQuiesce reports whether g is a leader with nothing to do: no local
// request, everything committed and applied, every live follower
// replicating and caught up, no configuration or leadership change under
// way, and idle for QuiesceAfterTicks.
func (h *Host) canQuiesce(g *group) bool {
	if h.cfg.DisableQuiesce || g.idleTicks < h.cfg.QuiesceAfterTicks || g.hasPending() || g.rn.HasReady() {
		return false
	}
	bs := g.rn.BasicStatus()
	if bs.RaftState != raft.StateLeader || bs.LeadTransferee != 0 {
		return false
	}
	last := g.st.last
	if bs.GetCommit() != last || g.applied != last || isJoint(g.confState) {
		return false
	}
	ok := true
	g.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
		if ReplicaID(id) == g.replica || !ok {
			return
		}
		if n, known := g.nodeOf(ReplicaID(id)); known && pr.Match > 0 {
			if p := h.peers[n]; p != nil && p.dead {
				// A dead follower catches up when it is back: its
				// election timer makes it speak up. Not one that has
				// acknowledged nothing in this term: if it never
				// received the group's state (it was added while its
				// node was down) it has no timer, and only the leader's
				// heartbeats would find it back.
				return
			}
		}
		if pr.Match != last || pr.State != tracker.StateReplicate {
			ok = false
		}
	})
	return ok
}

// quiesce stops ticking a leader's group and tells its followers to stop
// too (a heartbeat marked Quiesce, carrying the commit index).
func (h *Host) quiesce(g *group) {
	g.quiesced = true
	g.st.cache.reset() // an idle group pins no entries
	delete(h.awake, g.id)
	h.stats.QuiesceEntered++
	bs := g.rn.BasicStatus()
	g.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
		if ReplicaID(id) == g.replica {
			return
		}
		n, ok := g.nodeOf(ReplicaID(id))
		if !ok {
			return
		}
		b := h.outbox(n)
		b.Heartbeats = append(b.Heartbeats, Heartbeat{
			Group:   g.id,
			From:    g.replica,
			To:      ReplicaID(id),
			Term:    bs.GetTerm(),
			Commit:  min(pr.Match, bs.GetCommit()),
			Quiesce: true,
		})
	})
}

// maybeQuiesceFollower quiesces a follower that received a quiesce
// heartbeat from its leader, if it is caught up with it.
func (h *Host) maybeQuiesceFollower(g *group) {
	hb := g.quiesceHint
	g.quiesceHint = nil
	if g.quiesced || g.removed || g.broken != nil || g.hasPending() || g.rn.HasReady() {
		return
	}
	bs := g.rn.BasicStatus()
	if bs.RaftState != raft.StateFollower || ReplicaID(bs.Lead) != hb.From || bs.GetTerm() != hb.Term {
		return
	}
	if bs.GetCommit() != hb.Commit || g.st.last != hb.Commit || g.applied != hb.Commit {
		return
	}
	g.quiesced = true
	g.st.cache.reset()
	delete(h.awake, g.id)
}

// afterRound finishes a round: follower quiescence, re-proposals after a
// leader change, and the per-group bookkeeping that need not be synced
// (applied indexes, snapshots, log compaction).
func (h *Host) afterRound() {
	if h.err != nil {
		return
	}
	for _, id := range h.sortedGroups(h.attention) {
		g := h.attention[id]
		if g.quiesceHint != nil {
			h.maybeQuiesceFollower(g)
		}
		if g.retryNow {
			g.retryNow = false
			g.retry(true)
		}
	}
	clear(h.attention)
	if err := h.jnl.collect(h.db); err != nil {
		h.fail(err)
		return
	}
	if len(h.appliedSome) == 0 {
		return
	}
	ids := h.sortedGroups(h.appliedSome)
	clear(h.appliedSome)
	for _, id := range ids {
		g := h.groups[id]
		if g == nil || g.broken != nil || g.removed {
			continue
		}
		if err := g.maybeCompact(); err != nil {
			h.log.Warn("snapshot failed", "group", uint64(id), "err", err)
		}
	}
}
