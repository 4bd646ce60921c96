package raftgroup

import (
	"context"
	"slices"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
)

// Leadership hand-off before a host stops (Host.HandOff).
//
// A leader that stops leaves each group it led without one until a
// follower's election timeout passes (10–20 ticks, 1–2 s at vold's tick),
// and every write of those groups waits that long, although the stop was
// planned (a vold restarted by systemd, an upgrade). A host asked to hand
// off gives each group it leads to its most up-to-date voter on a live
// node with raft's TransferLeader: the leader brings that follower up to
// its last entry and tells it to campaign at once (MsgTimeoutNow, which
// skips PreVote and the other voters' leader lease), so the writes wait
// for one election round instead. A group whose only voter is this host,
// or whose other voters' nodes are dead, is kept: nobody could take it.
//
// From the hand-off on, the host does not take leadership back: its
// batches say it is leaving (Batch.Leaving), so that its peers neither
// pick it as a successor nor hand it a group whose entries it still
// proposes most (FollowProposers; such a transfer would hold the group's
// proposals until raft gave it up), and it drops the MsgTimeoutNow of a
// peer that had not heard yet. It still votes and follows, so it stays
// part of its groups' quorums until it stops.

// HandOffResult says what a hand-off did.
type HandOffResult struct {
	// Moved counts the groups this host led that now have another leader.
	Moved int
	// Kept counts the groups it leads that no other voter could take (a
	// sole voter, or voters on nodes it deems dead or leaving) and those
	// between two configurations (a replica being replaced), whose
	// successor is not picked until the change completes.
	Kept int
}

// handOff is a hand-off under way.
type handOff struct {
	pending map[GroupID]bool
	res     HandOffResult
	futs    []*Future[HandOffResult]
}

// HandOff hands the leadership of every group this host leads to another
// voter and waits until each has moved (see above); from then on the host
// leads none until it is opened again. A host stopping on purpose calls it
// first, with a deadline: a transfer that does not finish (its target
// died meanwhile) is tried again with another target until ctx ends.
func (h *Host) HandOff(ctx context.Context) (HandOffResult, error) {
	return h.HandOffAsync().Wait(ctx)
}

// HandOffAsync is HandOff's asynchronous form.
func (h *Host) HandOffAsync() *Future[HandOffResult] {
	fut := newFuture[HandOffResult]()
	h.enqueue(request{
		run:  func() { h.startHandOff(fut) },
		fail: func(err error) { fut.resolve(HandOffResult{}, err) },
	})
	return fut
}

func (h *Host) startHandOff(fut *Future[HandOffResult]) {
	if h.err != nil {
		fut.resolve(HandOffResult{}, h.err)
		return
	}
	h.leaving = true
	if ho := h.handoff; ho != nil && len(ho.futs) > 0 {
		ho.futs = append(ho.futs, fut) // one under way: it answers both
		return
	}
	ho := &handOff{pending: map[GroupID]bool{}, futs: []*Future[HandOffResult]{fut}}
	for _, id := range h.sortedGroups(h.groups) {
		g := h.groups[id]
		if g.removed || g.broken != nil || g.leader != g.replica {
			continue
		}
		if !h.transferLeadership(g) {
			ho.res.Kept++
			continue
		}
		ho.pending[id] = true
	}
	for _, n := range sortedKeys(h.peers) {
		h.outbox(n).Leaving = true // tell every peer now, not at its next message
	}
	h.log.Debug("handing leadership off", "groups", len(ho.pending), "kept", ho.res.Kept)
	h.handoff = ho
	h.checkHandOff(false)
}

// transferLeadership starts moving g's leadership to its best successor
// and reports whether it has one.
func (h *Host) transferLeadership(g *group) bool {
	to := h.successor(g)
	if to == 0 {
		return false
	}
	h.wakeGroup(g)
	g.rn.TransferLeader(uint64(to))
	h.markDirty(g)
	return true
}

// successor returns the voter g's leadership should go to when this host
// leaves, or 0 if there is none: the one with the highest match index (the
// quickest to catch up) among those on live nodes.
func (h *Host) successor(g *group) ReplicaID {
	cs := g.confState
	if cs == nil || isJoint(cs) {
		return 0
	}
	var (
		best  ReplicaID
		match uint64
	)
	g.rn.WithProgress(func(id uint64, typ raft.ProgressType, pr tracker.Progress) {
		r := ReplicaID(id)
		if typ != raft.ProgressTypePeer || r == g.replica || !slices.Contains(cs.GetVoters(), id) {
			return
		}
		n, ok := g.nodeOf(r)
		if !ok || n == h.cfg.NodeID {
			return
		}
		if p := h.peers[n]; p == nil || p.dead || p.leaving {
			return
		}
		if best == 0 || pr.Match > match || pr.Match == match && r < best {
			best, match = r, pr.Match
		}
	})
	return best
}

// checkHandOff settles the groups of a hand-off under way whose leadership
// moved, and resolves the hand-off once none is left. At a tick (retry) it
// starts again, with a successor chosen afresh, the transfers raft gave up
// (it aborts one after an election timeout) and those whose target's node
// is leaving too (nodes stopped together): a group nobody is left to take
// is kept.
func (h *Host) checkHandOff(retry bool) {
	ho := h.handoff
	if ho == nil || len(ho.futs) == 0 {
		return // none, or done
	}
	for _, id := range sortedKeys(ho.pending) {
		g := h.groups[id]
		switch {
		case g == nil || g.removed || g.broken != nil:
			delete(ho.pending, id)
		case g.leader != g.replica && g.leader != 0:
			// Known to this replica only once the new leader has
			// won: the writes wait for that, not for this host to
			// step down.
			delete(ho.pending, id)
			ho.res.Moved++
		case g.leader != g.replica:
			// Stepped down, and nobody leads yet: the election
			// under way settles it.
		case retry:
			to := ReplicaID(g.rn.BasicStatus().LeadTransferee)
			if to != 0 && !h.isLeaving(g, to) {
				continue // under way
			}
			if !h.transferLeadership(g) {
				if to != 0 {
					// Its target is leaving too: end the transfer, which
					// holds the group's proposals (a leader's transfer
					// to itself aborts it).
					g.rn.TransferLeader(uint64(g.replica))
					h.markDirty(g)
				}
				delete(ho.pending, id)
				ho.res.Kept++
			}
		}
	}
	if len(ho.pending) > 0 {
		return
	}
	h.log.Debug("leadership handed off", "moved", ho.res.Moved, "kept", ho.res.Kept)
	for _, f := range ho.futs {
		f.resolve(ho.res, nil)
	}
	ho.futs = nil
}

// refusesLeadership reports whether m asks a leaving host to take
// leadership (see above).
func (h *Host) refusesLeadership(m *pb.Message) bool {
	return h.leaving && m.GetType() == pb.MsgTimeoutNow
}

// isLeaving reports whether replica r of g is on a node that hands its
// leaderships off.
func (h *Host) isLeaving(g *group, r ReplicaID) bool {
	n, ok := g.nodeOf(r)
	if !ok {
		return false
	}
	p := h.peers[n]
	return p != nil && p.leaving
}
