package raftgroup

import (
	"cmp"
	"slices"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
)

// Deferred appends. An entry commits once a quorum holds it on disk: with
// three replicas, the leader and one follower. The third replica's copy is
// waited for by nobody, yet receiving each entry on its own costs that
// follower a round and a synced journal write per entry, on a disk that
// the two writes a caller does wait for often share (three replicas on a
// machine, or busy nodes): on this project's VM three synced writers at
// once get 0.6× the rate of two. So a leader sends appends with entries
// at once only to the followers that complete its quorum — those on whose
// nodes the entries were proposed (they answer their callers when they
// apply), then the most up to date (nodes handing their leaderships off
// last, Batch.Leaving) — and defers those to the others, the
// spare followers, for up to Config.DeferAppends (or until
// maxDeferredMessages or maxDeferredBytes wait): a spare then writes and
// syncs several entries at once. Everything else (heartbeats, votes,
// snapshots) goes out at once, and an append to a follower with deferred
// ones queues behind them, so that a follower sees its leader's appends in
// order.
//
// A spare's appends also go at once when it asks the leader for a read
// index or forwards a proposal (its node's callers want its log current),
// and when an append with entries must reach it at once (entries its node
// proposed): they go ahead of it, in order.
//
// Delaying a message is within what Raft tolerates of a network: an entry
// still commits only once a quorum has it on disk. A spare's applied index
// lags the commit by up to DeferAppends. If an eager follower stops
// answering, the entries commit when the spare's deferred appends go out;
// the next Ready then ranks the spare first (it is the more up to date)
// and the write after is back to one round trip.

// maxDeferredMessages and maxDeferredBytes bound what a spare follower's
// queue holds before it is sent early. An append with more entry data
// than maxDeferredAppend is not deferred: large writes are bound by the
// disks' bandwidth rather than their syncs, and a write then commits on
// whichever follower is faster (alternated runs of 2 × 32 MiB in 1 MiB
// writes: 113 against 92 MB/s through the leader's mount with every
// append deferrable).
const (
	maxDeferredMessages = 64
	maxDeferredBytes    = 4 << 20
	maxDeferredAppend   = 64 << 10
)

// entryBytes is the entry data m carries.
func entryBytes(m *pb.Message) int {
	n := 0
	for _, e := range m.GetEntries() {
		n += len(e.GetData())
	}
	return n
}

// deferredAppends are the appends of a group waiting to go to a spare
// follower on node n since since.
type deferredAppends struct {
	n     NodeID
	since time.Time
	msgs  []*pb.Message
	bytes int
}

// spareFollowers returns which followers of a leader's Ready may have its
// appends deferred (see above), or nil when none may: deferral is off, the
// Ready appends nothing or is not a leader's, the configuration is joint,
// or some new entry is a configuration change, a leader's empty entry or a
// proposal that waits for a quorum to apply it (Proposal.WaitQuorum).
func (h *Host) spareFollowers(g *group, rd *raft.Ready) []ReplicaID {
	if h.cfg.DeferAppends <= 0 || len(rd.Entries) == 0 || len(rd.Messages) == 0 {
		return nil
	}
	cs := g.confState
	if cs == nil || len(cs.GetVotersOutgoing()) > 0 || len(cs.GetVoters()) < 3 {
		return nil
	}
	st := g.rn.BasicStatus()
	if st.RaftState != raft.StateLeader {
		return nil
	}
	proposers, ok := plainProposers(rd.Entries)
	if !ok {
		return nil
	}
	type follower struct {
		id        ReplicaID
		proposer  bool
		leaving   bool
		match     uint64
		replicate bool
	}
	var fs []follower
	g.rn.WithProgress(func(id uint64, typ raft.ProgressType, pr tracker.Progress) {
		if typ != raft.ProgressTypePeer || id == st.ID || !slices.Contains(cs.GetVoters(), id) {
			return
		}
		n, ok := g.nodeOf(ReplicaID(id))
		fs = append(fs, follower{ReplicaID(id), ok && slices.Contains(proposers, n), h.isLeaving(g, ReplicaID(id)), pr.Match, pr.State == tracker.StateReplicate})
	})
	// The leader and this many eager followers make a quorum.
	eager := len(cs.GetVoters()) / 2
	if len(fs) <= eager {
		return nil
	}
	slices.SortFunc(fs, func(a, b follower) int {
		if a.proposer != b.proposer {
			if a.proposer {
				return -1
			}
			return 1
		}
		if a.leaving != b.leaving {
			// A node about to stop makes a quorum only until it does;
			// the write after would wait for the spare's deferred
			// appends.
			if b.leaving {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(b.match, a.match), cmp.Compare(a.id, b.id))
	})
	var spare []ReplicaID
	for _, f := range fs[eager:] {
		if f.replicate && !f.proposer {
			spare = append(spare, f.id)
		}
	}
	return spare
}

// deferAppend queues m (an append with entries to a spare follower, or a
// commit notice behind deferred appends) and sends the queue when it is
// full. An append with entries that may not wait sends the queue before
// it. It reports whether m was queued.
func (h *Host) deferAppend(g *group, n NodeID, m *pb.Message, spare []ReplicaID) bool {
	k := heldKey{g.id, ReplicaID(m.GetTo())}
	q := h.deferred[k]
	size := entryBytes(m)
	mayWait := len(m.GetEntries()) > 0 && slices.Contains(spare, k.to) && size <= maxDeferredAppend
	if q == nil {
		if !mayWait {
			return false
		}
		q = &deferredAppends{n: n, since: h.cfg.Now()}
		h.deferred[k] = q
	} else if len(m.GetEntries()) > 0 && !mayWait {
		h.sendDeferred(k, q)
		return false
	}
	q.msgs = append(q.msgs, m)
	q.bytes += size
	h.stats.AppendsDeferred++
	if len(q.msgs) >= maxDeferredMessages || q.bytes >= maxDeferredBytes {
		h.sendDeferred(k, q)
	}
	return true
}

// releaseDeferred queues for sending every deferred append that waited
// DeferAppends by now, or all of them if all is set.
func (h *Host) releaseDeferred(all bool) {
	if len(h.deferred) == 0 {
		return
	}
	// Most rounds find nothing due: only what is due is sorted (sends go
	// out in a stable order).
	now := h.cfg.Now()
	var due []heldKey
	for k, q := range h.deferred {
		if all || now.Sub(q.since) >= h.cfg.DeferAppends {
			due = append(due, k)
		}
	}
	slices.SortFunc(due, func(a, b heldKey) int {
		return cmp.Or(cmp.Compare(a.g, b.g), cmp.Compare(a.to, b.to))
	})
	for _, k := range due {
		h.sendDeferred(k, h.deferred[k])
	}
}

// releaseDeferredTo queues for sending the appends deferred for k, if any.
func (h *Host) releaseDeferredTo(k heldKey) {
	if q := h.deferred[k]; q != nil {
		h.sendDeferred(k, q)
	}
}

// sendDeferred moves q's appends into the outbox.
func (h *Host) sendDeferred(k heldKey, q *deferredAppends) {
	b := h.outbox(q.n)
	for _, m := range q.msgs {
		b.Messages = append(b.Messages, GroupMessage{Group: k.g, Msg: m})
	}
	h.stats.DeferredSent++
	delete(h.deferred, k)
}

// nextDeferredRelease returns how long until the oldest deferred append is
// due, and false if none waits.
func (h *Host) nextDeferredRelease() (time.Duration, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.deferred) == 0 {
		return 0, false
	}
	var oldest time.Time
	for _, q := range h.deferred {
		if oldest.IsZero() || q.since.Before(oldest) {
			oldest = q.since
		}
	}
	return max(0, h.cfg.DeferAppends-h.cfg.Now().Sub(oldest)), true
}
