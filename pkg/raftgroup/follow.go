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
)

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
	g.h.counted[g.id] = g
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
		h.endWindow(g, g.proposerToFollow())
	}
}

// followEarly moves g's leadership to from at once, within the window,
// once from alone proposed enough of the window's entries (the same test
// as at a window's end) carrying followEarlyBytes of data. Judged only at
// the window's end, a bulk writer that starts a burst waited up to a
// window and a half for the leadership: a 64 MiB sequential write through
// a follower's mount (about half a second) sent most of its data through
// the leader first (bench/vold's "Raft MiB sent per MiB", 2.61–2.95 where
// the leader's own mount sends 2.00). Small writes keep to the window's
// end: for them a forward costs a round trip, not megabytes, and a
// writer that makes a few dozen of them moves leadership no sooner than
// before. The caller has stepped the proposal that counted, so the
// transfer waits for it to reach from like any other entry. (It runs for
// every forwarded proposal: the counts are checked before the full test.)
func (h *Host) followEarly(g *group, from ReplicaID) {
	if !h.cfg.FollowProposers || from == g.replica || g.proposed[from] < followMinProposals ||
		g.proposedBytes[from] < followEarlyBytes || g.proposerToFollow() != from {
		return
	}
	h.endWindow(g, from)
}

// endWindow ends g's window: it moves g's leadership to to, unless to is
// 0, and starts counting afresh.
func (h *Host) endWindow(g *group, to ReplicaID) {
	delete(h.counted, g.id)
	clear(g.proposed)
	clear(g.proposedBytes)
	if to == 0 {
		return
	}
	h.log.Debug("leadership follows the proposer", "group", uint64(g.id), "to", uint64(to))
	g.rn.TransferLeader(uint64(to))
	h.stats.LeaderTransfers++
	h.wakeGroup(g)
	h.markDirty(g)
}

// proposerToFollow returns the replica g's leadership should move to, or
// 0 to stay.
func (g *group) proposerToFollow() ReplicaID {
	if g.removed || g.retiring != nil || g.broken != nil || g.leader != g.replica || g.h.tick-g.leaderTick < followWindows*followWindowTicks {
		return 0
	}
	cs := g.confState
	if cs == nil || isJoint(cs) {
		return 0
	}
	if st := g.rn.BasicStatus(); st.RaftState != raft.StateLeader || st.LeadTransferee != 0 {
		return 0
	}
	var top ReplicaID
	topN, total := 0, 0
	for r, n := range g.proposed {
		total += n
		if n > topN || n == topN && r < top {
			top, topN = r, n
		}
	}
	if top == g.replica || topN < followMinProposals || topN < 2*(total-topN) {
		return 0
	}
	if !slices.Contains(cs.GetVoters(), uint64(top)) {
		return 0 // a learner cannot lead
	}
	if g.h.isLeaving(g, top) {
		// Its node is stopping: the transfer would hold this group's
		// proposals until raft gave it up, an election timeout later.
		return 0
	}
	return top
}
