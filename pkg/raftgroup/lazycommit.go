package raftgroup

import (
	"cmp"
	"maps"
	"slices"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
)

// Lazy commit notices. When a leader commits entries, etcd raft at once
// sends every follower an append without entries that only carries the
// new commit index. Each costs the leader a send and the follower a
// receive and a whole round (persist the hard state, apply, advance): for
// a replicated synchronous 4 KiB write, two of the three volds' seven
// rounds. Nobody waits for a follower to apply an entry that its own
// node did not propose and whose proposer does not wait for a quorum to
// apply it (Proposal.WaitQuorum): the leader's proposers are answered
// when the leader applies; reads on followers go through a ReadIndex,
// whose heartbeat carries the commit index. So such notices are held,
// one per follower and group, until the leader sends that follower
// another append (which carries the commit index anyway: the next write
// of a writer in a loop) or until the next tick, when all held notices
// go out. Delaying a message is within what Raft tolerates of a network;
// a follower's applied index may lag the commit by up to one tick more.

// heldKey names a follower of a group.
type heldKey struct {
	g  GroupID
	to ReplicaID
}

// heldNotice is a commit notice waiting to go to node n.
type heldNotice struct {
	n   NodeID
	msg *pb.Message
}

// commitNotice reports whether m only tells a follower the commit index.
func commitNotice(m *pb.Message) bool {
	return m.GetType() == pb.MsgApp && len(m.GetEntries()) == 0
}

// noticeHolder returns which followers' commit notices in a leader's
// Ready may wait (see above): hold(n) reports whether the notice to node
// n may. It is nil when none may: the Ready is not a leader's, it does
// not hold every entry up to the new commit index (raft splits large
// commits over Readies), or some committed entry is a configuration
// change, an entry without a proposer (a new leader's empty entry), or a
// proposal that waits for a quorum to apply it.
func noticeHolder(g *group, rd *raft.Ready) (hold func(n NodeID) bool) {
	if len(rd.Messages) == 0 || len(rd.CommittedEntries) == 0 || raft.IsEmptyHardState(rd.HardState) {
		return nil
	}
	if rd.CommittedEntries[len(rd.CommittedEntries)-1].GetIndex() != rd.HardState.GetCommit() {
		return nil
	}
	if g.rn.BasicStatus().RaftState != raft.StateLeader {
		return nil
	}
	proposers, ok := plainProposers(rd.CommittedEntries)
	if !ok {
		return nil
	}
	return func(n NodeID) bool { return !slices.Contains(proposers, n) }
}

// plainProposers returns the nodes that proposed entries, and false if
// some entry is a configuration change, an entry without a proposer (a new
// leader's empty entry) or a proposal that waits for a quorum to apply it.
func plainProposers(entries []*pb.Entry) ([]NodeID, bool) {
	var proposers []NodeID
	for _, e := range entries {
		if e.GetType() != pb.EntryNormal || len(e.GetData()) == 0 {
			return nil, false
		}
		env, err := decodeEnvelope(e.GetData())
		if err != nil || env.quorum {
			return nil, false
		}
		if !slices.Contains(proposers, env.proposer) {
			proposers = append(proposers, env.proposer)
		}
	}
	return proposers, true
}

// noticeHeartbeat returns the notice heartbeat that may replace the commit
// notice m (see above): the follower must be replicating and have
// acknowledged every entry up to the one the notice follows, and at least
// up to the commit index it carries.
func noticeHeartbeat(g *group, m *pb.Message) (Heartbeat, bool) {
	if !commitNotice(m) || len(m.GetContext()) > 0 {
		return Heartbeat{}, false
	}
	ok := false
	g.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
		if id == m.GetTo() {
			ok = pr.State == tracker.StateReplicate && pr.Match == m.GetIndex() && pr.Match >= m.GetCommit()
		}
	})
	if !ok {
		return Heartbeat{}, false
	}
	return Heartbeat{Group: g.id, From: ReplicaID(m.GetFrom()), To: ReplicaID(m.GetTo()), Term: m.GetTerm(), Commit: m.GetCommit(), Notice: true}, true
}

// releaseNotices queues every held commit notice for sending.
func (h *Host) releaseNotices() {
	keys := slices.SortedFunc(maps.Keys(h.held), func(a, b heldKey) int {
		return cmp.Or(cmp.Compare(a.g, b.g), cmp.Compare(a.to, b.to))
	})
	for _, k := range keys {
		hn := h.held[k]
		b := h.outbox(hn.n)
		b.Messages = append(b.Messages, GroupMessage{Group: k.g, Msg: hn.msg})
		h.stats.NoticesReleased++
	}
	clear(h.held)
}
