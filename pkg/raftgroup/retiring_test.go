package raftgroup_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	rgt "github.com/shoal-dev/shoal/pkg/raftgroup/raftgrouptest"
)

// TestRemovedReplicaVotesUntilNoVoterNeedsIt replaces a live member and
// then loses the leader for good at the worst moment: the removed replica
// knows the change is done, but the new member and the remaining old one
// do not — they still run the joint configuration, whose outgoing half
// needs the removed replica's vote, since the dead leader's is gone. A
// removed replica that fell silent at once left the group with no leader
// possible, ever. It now stays a Raft peer (it votes, takes no requests)
// until every voter of the newest configuration it heard of says it
// counts the replica removed; only then is it Removed.
func TestRemovedReplicaVotesUntilNoVoterNeedsIt(t *testing.T) {
	c := rgt.New(t, rgt.Options{Nodes: 5, Seed: 41})
	l, followers := settledGroup(t, c)
	gone, lag := followers[0], followers[1]
	const spare, spare2 = raftgroup.NodeID(4), raftgroup.NodeID(5)
	goneReplica := raftgroup.ReplicaID(gone) // replica i on node i

	// lag hears nothing of the change: the leader's messages to it are cut.
	c.Net.Cut(l, lag)
	next, err := c.Host(l).NextReplicaID(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Host(spare).JoinGroup(1, next); err != nil {
		t.Fatal(err)
	}
	fut := c.Host(l).ChangeMembershipAsync(1, raftgroup.Replace(goneReplica, next, spare)...)
	// Once the spare holds every entry of the leader (the change's last,
	// the one that leaves the joint configuration, included), the leader's
	// messages to it are cut too: its acknowledgement gets through, so the
	// leader commits, but the spare does not learn that it did.
	ok := c.RunUntilStep(300, func() bool {
		ls, _ := c.Host(l).Status(1)
		ss, err := c.Host(spare).Status(1)
		if err == nil && len(ls.VotersOutgoing) > 0 && ls.LastIndex > ls.Applied && ss.LastIndex >= ls.LastIndex {
			c.Net.Cut(l, spare)
			return true
		}
		return false
	})
	c.Require(ok, "the spare never caught up with the joint configuration")
	done := c.RunUntil(300, func() bool { return rgt.Resolved(fut) })
	c.Require(done, "the replacement never completed")
	if _, err := fut.Result(); err != nil {
		t.Fatal(err)
	}
	ss, _ := c.Host(spare).Status(1)
	c.Require(len(ss.VotersOutgoing) > 0, "the spare learned the change was done: %+v", ss)
	c.RunUntil(100, func() bool {
		st, _ := c.Host(gone).Status(1)
		return st.Retiring || st.Removed
	})
	st, _ := c.Host(gone).Status(1)
	c.Require(st.Retiring && !st.Removed, "the removed replica: %+v", st)

	// The leader dies for good. lag (old configuration) and the spare
	// (joint) elect a leader only with the removed replica's vote.
	c.Crash(l)
	c.Net.Heal()
	var nl raftgroup.NodeID
	ok = c.RunUntil(300, func() bool {
		n, _, found := c.Leader(1)
		nl = n
		return found && n != gone
	})
	c.Require(ok, "no leader without the dead one\n%s", c.String(1))
	write(t, c, nl, 1, "after", "the leader died")
	st, _ = c.Host(gone).Status(1)
	c.Require(st.Retiring && !st.Removed, "removed while a voter (the dead leader) never said so: %+v", st)

	// The dead leader is replaced in turn: every voter of the newest
	// configuration then counts the removed replica out, so it is Removed.
	next, err = c.Host(nl).NextReplicaID(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Host(spare2).JoinGroup(1, next); err != nil {
		t.Fatal(err)
	}
	if _, err := rgt.Await(c, c.Host(nl).ChangeMembershipAsync(1, raftgroup.Replace(raftgroup.ReplicaID(l), next, spare2)...), 300); err != nil {
		t.Fatalf("replace the dead leader: %v\n%s", err, c.String(1))
	}
	ok = c.RunUntil(100, func() bool {
		st, _ := c.Host(gone).Status(1)
		return st.Removed
	})
	c.Require(ok, "the removed replica never learned it may go")
	if err := c.Host(gone).DestroyGroup(1); err != nil {
		t.Fatal(err)
	}
	write(t, c, nl, 1, "after", "the replacement")
	d := converge(t, c, 1, lag, spare, spare2)
	if d["after"] != "the replacement" || !slices.Contains([]raftgroup.NodeID{lag, spare, spare2}, nl) {
		t.Fatalf("%v, leader %d", d, nl)
	}
}

// TestRetireOnTheApplicationsWord has the application tell replicas they
// were removed (as vold does from a volume's document). One that was
// removed, cut off so that it never heard, retires at once (it takes no
// requests) and is Removed once the voters answer. One that is still a
// member retires too, but no voter confirms it: it is never Removed, and
// its vote still elects a leader.
func TestRetireOnTheApplicationsWord(t *testing.T) {
	c := rgt.New(t, rgt.Options{Nodes: 4, Seed: 43})
	l, followers := settledGroup(t, c)
	gone, kept := followers[0], followers[1]
	const spare = raftgroup.NodeID(4)
	c.Net.Isolate(gone, c.NodeIDs())
	next, err := c.Host(l).NextReplicaID(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Host(spare).JoinGroup(1, next); err != nil {
		t.Fatal(err)
	}
	m, err := rgt.Await(c, c.Host(l).ChangeMembershipAsync(1, raftgroup.Replace(raftgroup.ReplicaID(gone), next, spare)...), 300)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Host(gone).Retire(1, m.Voters); err != nil {
		t.Fatal(err)
	}
	st, _ := c.Host(gone).Status(1)
	c.Require(st.Retiring && !st.Removed, "told, cut off: %+v", st)
	if _, err := rgt.Await(c, c.Host(gone).Submit(1, raftgroup.Proposal{Data: put("k", "v")}), 10); !errors.Is(err, raftgroup.ErrRemoved) {
		t.Fatalf("a retiring replica took a write: %v", err)
	}
	c.Net.Heal()
	ok := c.RunUntil(100, func() bool {
		st, _ := c.Host(gone).Status(1)
		return st.Removed
	})
	c.Require(ok, "the removed replica was never confirmed")

	// A member told it was removed, wrongly.
	if err := c.Host(kept).Retire(1, m.Voters); err != nil {
		t.Fatal(err)
	}
	c.RunTicks(50)
	st, _ = c.Host(kept).Status(1)
	c.Require(st.Retiring && !st.Removed, "a member told it was removed: %+v", st)
	// The leader dies: the spare needs the member's vote to lead.
	c.Crash(l)
	ok = c.RunUntil(300, func() bool {
		n, _, found := c.Leader(1)
		return found && n != l
	})
	c.Require(ok, "no leader without the dead one's vote\n%s", c.String(1))
	// (Through the spare: a retiring replica takes no requests of its
	// own, though it may lead.)
	write(t, c, spare, 1, "after", "the crash")
	st, _ = c.Host(kept).Status(1)
	c.Require(st.Retiring && !st.Removed, "a member told it was removed: %+v", st)
}
