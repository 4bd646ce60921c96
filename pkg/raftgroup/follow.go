package raftgroup

import (
	"slices"

	"go.etcd.io/raft/v3"
)

// Leadership follows the proposer (Config.FollowProposers).
//
// Every write costs one hop more when it is proposed on a follower: raft
// forwards it to the leader, which replicates it back, and the proposer
// answers only once its own replica has applied it. A volume is usually
// written from one node, the one whose task mounts it; measured on this
// project's three-node benchmark, a follower's mount wrote sequentially
// at about half the speed of the leader's and spent twice the CPU per MiB.
// So a leader counts the proposals of each window (its own and the ones
// its followers forward) and, when one voter follower made most of them,
// hands leadership to it (raft's TransferLeader: the follower is caught
// up, then campaigns at once). Writes stop for that handover only — raft
// drops proposals while a transfer is under way and the host proposes
// them again to the new leader.
//
// Hysteresis keeps two writers from tossing leadership between them: the
// follower must have made at least followMinProposals in the window and
// at least twice as many as every other replica together, and a leader
// considers moving only after followWindows whole windows as leader.
// A bulk writer (followEarly) takes it sooner, after followEarlyTicks of
// the term, with followEarlyBytes in the window or in a run of its own
// proposals that no other replica's interrupted: those bytes bound how
// often leadership can move.

const (
	// followWindowTicks is the window proposals are counted over (300
	// ms at the default tick), so that leadership reaches a writer
	// early in its burst. On this project's bench/vold, alternating
	// binaries, 3 s runs of 4 KiB synced writes through a follower's
	// mount made 1,104–1,239 IOPS (median of each run's three rounds;
	// four runs, two with 16 proposals a window, two with 5) against
	// 867–1,076 with one-second windows. 64 MiB sequential writes
	// (about 0.6 s) showed no difference above the noise.
	followWindowTicks = 3
	// followMinProposals is the fewest proposals of a follower in one
	// window that move leadership to it: about 27 a second. A writer
	// much slower gains little from leading, and a short window must
	// not let it take leadership from a busier one that paused.
	followMinProposals = 8
	// followWindows is how many windows a new leader serves before it
	// may hand leadership on.
	followWindows = 2
	// followEarlyBytes is the entry data a follower must have proposed
	// in a window for followEarly to move leadership before the window
	// ends: eight 512 KiB writes.
	followEarlyBytes = 4 << 20
	// followEarlyTicks is how long a leader serves before followEarly
	// may hand leadership on: a bulk writer's followEarlyBytes bound how
	// often leadership moves. A node that writes right after another
	// (bench/vold's follower's mount runs after the leader's, whose
	// mount took the leadership back before its run) found the term
	// under two windows old and forwarded up to 0.6 s of a 64 MiB
	// write through the leader (2.14–2.44 Raft MiB sent per MiB in
	// full runs, where 2.00 is none). One tick lets the new term
	// commit its first entry first.
	followEarlyTicks = 1
)

// proposalRun is a run of proposals from one replica that no other
// replica's proposal interrupted: its count and entry data.
type proposalRun struct {
	from     ReplicaID
	n, bytes int
}

// countProposals records n proposals of the given entry data bytes from
// replica from if g leads (a follower forwards its own to the leader,
// which counts them there).
func (g *group) countProposals(from ReplicaID, n, bytes int) {
	if !g.h.cfg.FollowProposers || n == 0 || g.leader != g.replica {
		return
	}
	if g.proposed == nil {
		g.proposed, g.proposedBytes = map[ReplicaID]int{}, map[ReplicaID]int{}
	}
	g.proposed[from] += n
	g.proposedBytes[from] += bytes
	if g.run.from != from {
		g.run = proposalRun{from: from}
	}
	g.run.n += n
	g.run.bytes += bytes
	g.h.counted[g.id] = g
}

// forgetProposals drops the counts of the window and the run: a new
// leader, or one that just moved leadership, starts afresh.
func (g *group) forgetProposals() {
	clear(g.proposed)
	clear(g.proposedBytes)
	g.run = proposalRun{}
}

// followProposers runs at every tick: at the end of each window it moves
// the leadership of every group it leads to the replica that proposed
// most of the window's entries, if one did (see above), and starts the
// next window.
func (h *Host) followProposers() {
	if !h.cfg.FollowProposers || h.tick%followWindowTicks != 0 {
		return
	}
	for _, id := range h.sortedGroups(h.counted) {
		g := h.counted[id]
		h.endWindow(g, g.proposerToFollow(followWindows*followWindowTicks))
	}
}

// followEarly moves g's leadership to from at once, within the window,
// once from alone proposed enough of the window's entries (the same test
// as at a window's end) carrying followEarlyBytes of data, or made a run
// of that many proposals and bytes that no other replica's interrupted.
//
// Judged only at the window's end, a bulk writer that starts a burst
// waited up to a window and a half for the leadership: a 64 MiB
// sequential write through a follower's mount (about half a second) sent
// most of its data through the leader first (bench/vold's "Raft MiB sent
// per MiB", 2.61–2.95 where the leader's own mount sends 2.00). The run
// catches a writer that starts just after another stopped, whose burst
// the window still counts and the newcomer had to double (bench/vold's
// follower's mount, run right after the leader's, still sent 2.19–2.45
// Raft MiB per MiB with followEarlyTicks alone); two writers
// at once interrupt each other's runs, and one whose proposals come ten
// times as often as the other's leads from the window's end anyway.
// Small writes keep to the window's end: for them a forward costs a
// round trip, not megabytes, and a writer that makes a few dozen of them
// moves leadership no sooner than before. The caller has stepped the
// proposal that counted, so the transfer waits for it to reach from like
// any other entry. (It runs for every forwarded proposal: the counts are
// checked before the full test.)
func (h *Host) followEarly(g *group, from ReplicaID) {
	if !h.cfg.FollowProposers || from == g.replica {
		return
	}
	window := g.proposed[from] >= followMinProposals && g.proposedBytes[from] >= followEarlyBytes &&
		g.proposerToFollow(followEarlyTicks) == from
	run := g.run.from == from && g.run.n >= followMinProposals && g.run.bytes >= followEarlyBytes &&
		g.mayLead(from, followEarlyTicks)
	if window || run {
		h.endWindow(g, from)
	}
}

// endWindow ends g's window: it moves g's leadership to to, unless to is
// 0, and starts counting afresh.
func (h *Host) endWindow(g *group, to ReplicaID) {
	delete(h.counted, g.id)
	if to == 0 {
		// The run outlives a window that moved nothing: a lone bulk
		// writer slower than followMinProposals a window still takes
		// the leadership once its run is long enough.
		clear(g.proposed)
		clear(g.proposedBytes)
		return
	}
	g.forgetProposals()
	h.log.Debug("leadership follows the proposer", "group", uint64(g.id), "to", uint64(to))
	g.rn.TransferLeader(uint64(to))
	h.stats.LeaderTransfers++
	h.wakeGroup(g)
	h.markDirty(g)
}

// proposerToFollow returns the replica g's leadership should move to, or
// 0 to stay; g's leader must have led for minTerm ticks.
func (g *group) proposerToFollow(minTerm uint64) ReplicaID {
	var top ReplicaID
	topN, total := 0, 0
	for r, n := range g.proposed {
		total += n
		if n > topN || n == topN && r < top {
			top, topN = r, n
		}
	}
	if topN < followMinProposals || topN < 2*(total-topN) || !g.mayLead(top, minTerm) {
		return 0
	}
	return top
}

// mayLead reports whether g, which must have led for minTerm ticks, may
// hand its leadership to replica to now.
func (g *group) mayLead(to ReplicaID, minTerm uint64) bool {
	if to == g.replica || g.removed || g.retiring != nil || g.broken != nil || g.leader != g.replica || g.h.tick-g.leaderTick < minTerm {
		return false
	}
	cs := g.confState
	if cs == nil || isJoint(cs) {
		return false
	}
	if st := g.rn.BasicStatus(); st.RaftState != raft.StateLeader || st.LeadTransferee != 0 {
		return false
	}
	if !slices.Contains(cs.GetVoters(), uint64(to)) {
		return false // a learner cannot lead
	}
	// Its node stopping, the transfer would hold this group's proposals
	// until raft gave it up, an election timeout later.
	return !g.h.isLeaving(g, to)
}
