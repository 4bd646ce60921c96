package raftgroup_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	rgt "github.com/shoal-dev/shoal/pkg/raftgroup/raftgrouptest"
)

// TestReplaceDeadMember kills a member for good, adds a replica on a spare
// node (it catches up by snapshot transfer: the log is compacted) and
// removes the dead one in one joint change: the group is back to three.
func TestReplaceDeadMember(t *testing.T) {
	c := rgt.New(t, rgt.Options{Nodes: 4, Seed: 21, Configure: func(cfg *raftgroup.Config) {
		cfg.SnapshotEntries = 8
		cfg.CompactionMargin = 2
	}})
	c.CreateGroup(1, 1, 2, 3)
	l := c.WaitLeader(1, 100)
	for i := range 30 {
		write(t, c, l, 1, fmt.Sprint("k", i), fmt.Sprint(i))
	}
	dead := raftgroup.NodeID(3)
	if l == dead {
		dead = 2
	}
	deadReplica := raftgroup.ReplicaID(dead) // replica i on node i
	c.Crash(dead)
	l = c.WaitLeader(1, 100)
	write(t, c, l, 1, "while", "degraded")

	next, err := c.Host(l).NextReplicaID(1)
	if err != nil || next != 4 {
		t.Fatalf("next replica %d %v", next, err)
	}
	if err := c.Host(4).JoinGroup(1, next); err != nil {
		t.Fatal(err)
	}
	m, err := rgt.Await(c, c.Host(l).ChangeMembershipAsync(1, raftgroup.Replace(deadReplica, next, 4)...), 300)
	if err != nil {
		t.Fatalf("replace: %v\n%s", err, c.String(1))
	}
	if len(m.Voters) != 3 {
		t.Fatalf("voters %v", m.Voters)
	}
	for _, v := range m.Voters {
		if v.Replica == deadReplica {
			t.Fatalf("dead replica still a voter: %v", m.Voters)
		}
	}
	var live []raftgroup.NodeID
	for _, n := range []raftgroup.NodeID{1, 2, 3, 4} {
		if n != dead {
			live = append(live, n)
		}
	}
	d := converge(t, c, 1, live...)
	if len(d) != 31 {
		t.Fatalf("%d keys on the new member", len(d))
	}
	st, _ := c.Host(4).Status(1)
	if st.SnapshotIndex <= 1 {
		t.Fatalf("new member did not start from a snapshot: %+v", st)
	}
	// The group works with its new member; a quorum without the dead node.
	l = c.WaitLeader(1, 100)
	write(t, c, l, 1, "after", "replace")
	converge(t, c, 1, live...)

	// Replica IDs are never reused: neither the dead one nor a stale guess.
	_, err = rgt.Await(c, c.Host(l).ChangeMembershipAsync(1, raftgroup.Change{Type: raftgroup.AddVoter, Replica: deadReplica, Node: dead}), 100)
	if !errors.Is(err, raftgroup.ErrReplicaIDReused) {
		t.Fatalf("re-adding replica %d: %v", deadReplica, err)
	}

	// The dead node comes back: its replica learns it was removed and
	// stays out of the group's way.
	c.Restart(dead)
	c.RunUntil(100, func() bool {
		st, err := c.Host(dead).Status(1)
		return err == nil && st.Removed
	})
	st, _ = c.Host(dead).Status(1)
	if !st.Removed {
		t.Fatalf("restarted removed replica does not know: %+v", st)
	}
	if err := c.Host(dead).DestroyGroup(1); err != nil {
		t.Fatal(err)
	}
	if err := c.Host(dead).JoinGroup(1, deadReplica); !errors.Is(err, raftgroup.ErrReplicaIDReused) {
		t.Fatalf("rejoin with a destroyed replica ID: %v", err)
	}
	// But the node can host the group again under a new replica ID.
	next, _ = c.Host(l).NextReplicaID(1)
	if err := c.Host(dead).JoinGroup(1, next); err != nil {
		t.Fatal(err)
	}
	if _, err := rgt.Await(c, c.Host(l).ChangeMembershipAsync(1, raftgroup.Change{Type: raftgroup.AddVoter, Replica: next, Node: dead}), 300); err != nil {
		t.Fatal(err)
	}
	converge(t, c, 1, 1, 2, 3, 4)
}

// TestAddThenRemove grows a group to four, then shrinks it to three with
// simple (one-at-a-time) changes.
func TestAddThenRemove(t *testing.T) {
	c := rgt.New(t, rgt.Options{Nodes: 4, Seed: 22})
	c.CreateGroup(9, 1, 2, 3)
	l := c.WaitLeader(9, 100)
	write(t, c, l, 9, "a", "1")
	if err := c.Host(4).JoinGroup(9, 4); err != nil {
		t.Fatal(err)
	}
	m, err := rgt.Await(c, c.Host(l).ChangeMembershipAsync(9, raftgroup.Change{Type: raftgroup.AddLearner, Replica: 4, Node: 4}), 200)
	if err != nil || len(m.Learners) != 1 {
		t.Fatalf("%+v %v", m, err)
	}
	converge(t, c, 9, 1, 2, 3, 4)
	m, err = rgt.Await(c, c.Host(l).ChangeMembershipAsync(9, raftgroup.Change{Type: raftgroup.AddVoter, Replica: 4}), 200)
	if err != nil || len(m.Voters) != 4 {
		t.Fatalf("%+v %v", m, err)
	}
	// Remove the leader itself: it steps down, another takes over.
	leaderReplica := raftgroup.ReplicaID(l)
	_, err = rgt.Await(c, c.Host(l).ChangeMembershipAsync(9, raftgroup.Change{Type: raftgroup.RemoveReplica, Replica: leaderReplica}), 200)
	if err != nil && !errors.Is(err, raftgroup.ErrRemoved) {
		t.Fatal(err)
	}
	var rest []raftgroup.NodeID
	for _, n := range c.NodeIDs() {
		if n != l {
			rest = append(rest, n)
		}
	}
	nl := c.WaitLeader(9, 100)
	c.Require(nl != l, "removed replica still leads")
	write(t, c, nl, 9, "b", "2")
	d := converge(t, c, 9, rest...)
	if d["a"] != "1" || d["b"] != "2" {
		t.Fatalf("%v", d)
	}
	st, _ := c.Host(nl).Status(9)
	if len(st.Voters) != 3 {
		t.Fatalf("voters %v", st.Voters)
	}
}

// TestStaleReplicaIDRefused proposes two replacements that took the same
// new replica ID (NextReplicaID asked twice while the first change was in
// flight, as a repair retried after a timeout would): the first applies,
// and the second, which would add a voter that already is one beside
// removing another member (the group would shrink to two), is refused.
// So is the same ID "added" on another node. A retry of the replacement
// that already happened is a no-op and succeeds.
func TestStaleReplicaIDRefused(t *testing.T) {
	c := rgt.New(t, rgt.Options{Nodes: 5, Seed: 23})
	l, others, next := groupWithSpare(t, c)
	followers := []raftgroup.ReplicaID{raftgroup.ReplicaID(others[0]), raftgroup.ReplicaID(others[1])}
	h := c.Host(l)
	first := h.ChangeMembershipAsync(1, raftgroup.Replace(followers[0], next, 4)...)
	stale := h.ChangeMembershipAsync(1, raftgroup.Replace(followers[1], next, 4)...)
	elsewhere := h.ChangeMembershipAsync(1, raftgroup.Replace(followers[1], next, 5)...)
	if m, err := rgt.Await(c, first, 300); err != nil || len(m.Voters) != 3 {
		t.Fatalf("first replacement: %+v %v", m, err)
	}
	for name, f := range map[string]*raftgroup.Future[raftgroup.Membership]{"stale": stale, "elsewhere": elsewhere} {
		if m, err := rgt.Await(c, f, 300); !errors.Is(err, raftgroup.ErrReplicaIDReused) {
			t.Fatalf("%s replacement with replica %d: %+v %v, want ErrReplicaIDReused\n%s", name, next, m, err, c.String(1))
		}
	}
	if m, err := rgt.Await(c, h.ChangeMembershipAsync(1, raftgroup.Replace(followers[0], next, 4)...), 300); err != nil || len(m.Voters) != 3 {
		t.Fatalf("retried replacement: %+v %v", m, err)
	}
	st, err := h.Status(1)
	if err != nil || len(st.Voters) != 3 {
		t.Fatalf("voters %v %v\n%s", st.Voters, err, c.String(1))
	}
	l = c.WaitLeader(1, 100)
	write(t, c, l, 1, "after", "replacements")
	converge(t, c, 1, l, raftgroup.NodeID(followers[1]), 4)
}

// TestChangeLearnedFromSnapshotResolves has a leader propose a replacement
// and lose touch with the others as soon as they hold the entry: they
// commit and apply it under a new leader, and compact their logs past it,
// so the old leader learns of it from a snapshot, never applying the
// entry itself. Its caller must still hear that the change was made.
func TestChangeLearnedFromSnapshotResolves(t *testing.T) {
	c := rgt.New(t, rgt.Options{Nodes: 4, Seed: 24, Configure: func(cfg *raftgroup.Config) {
		cfg.SnapshotEntries = 8
		cfg.CompactionMargin = 2
	}})
	l, others, next := groupWithSpare(t, c)
	victim := raftgroup.ReplicaID(others[0]) // replica i on node i
	fut := c.Host(l).ChangeMembershipAsync(1, raftgroup.Replace(victim, next, 4)...)
	// The leader's round appends and sends the entry, which reaches the
	// followers; then the leader is cut off before their answers arrive.
	c.Step()
	c.Net.Isolate(l, c.NodeIDs())
	if !c.RunUntil(300, func() bool { id, _, ok := c.Leader(1); return ok && id != l }) {
		t.Fatalf("no new leader\n%s", c.String(1))
	}
	ok := c.RunUntil(300, func() bool {
		_, st, led := c.Leader(1)
		return led && len(st.VotersOutgoing) == 0 && slices.ContainsFunc(st.Voters, func(m raftgroup.Member) bool { return m.Replica == next })
	})
	if !ok {
		t.Fatalf("the others did not make the change\n%s", c.String(1))
	}
	nl, _, _ := c.Leader(1)
	for i := range 30 {
		write(t, c, nl, 1, fmt.Sprint("k", i), "v")
	}
	select {
	case <-fut.Done():
		t.Fatalf("resolved while cut off: %v", fmt.Sprint(fut.Result()))
	default:
	}
	c.Net.Heal()
	m, err := rgt.Await(c, fut, 300)
	if err != nil {
		t.Fatalf("change made, yet its caller got %v\n%s", err, c.String(1))
	}
	if len(m.Voters) != 3 {
		t.Fatalf("voters %v", m.Voters)
	}
	st, _ := c.Host(l).Status(1)
	if st.SnapshotIndex == 0 {
		t.Fatalf("the old leader caught up without a snapshot: %+v", st)
	}
}

// TestRestartKeepsAppliedConfiguration restarts a leader right after a
// replacement it made, cut off from the others: it must come back with
// the configuration it had applied, not the one of its last durable
// commit index from before the change. (A commit index alone is not
// written, and the replica removed has gone silent: a leader back under
// the old configuration would need that replica's vote, and with the
// longest log it would refuse the others theirs.)
func TestRestartKeepsAppliedConfiguration(t *testing.T) {
	c := rgt.New(t, rgt.Options{Nodes: 4, Seed: 25})
	l, others, next := groupWithSpare(t, c)
	victim := raftgroup.ReplicaID(others[0]) // replica i on node i
	m, err := rgt.Await(c, c.Host(l).ChangeMembershipAsync(1, raftgroup.Replace(victim, next, 4)...), 300)
	if err != nil {
		t.Fatal(err)
	}
	c.Crash(l)
	c.Net.Isolate(l, c.NodeIDs())
	c.Restart(l)
	for range 3 { // apply what the restart found committed; hear nothing
		c.Step()
	}
	st, err := c.Host(l).Status(1)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(st.Voters, m.Voters) || len(st.VotersOutgoing) > 0 {
		t.Fatalf("restarted with voters %v (outgoing %v), had applied %v\n%s", st.Voters, st.VotersOutgoing, m.Voters, c.String(1))
	}
}

// groupWithSpare creates group 1 on nodes 1 to 3 (replica i on node i),
// writes to it, and joins a replica on node 4 under the next replica ID,
// ready to be added: it returns the leader's node, the other two nodes
// and the new replica's ID.
func groupWithSpare(t *testing.T, c *rgt.Cluster) (raftgroup.NodeID, []raftgroup.NodeID, raftgroup.ReplicaID) {
	t.Helper()
	c.CreateGroup(1, 1, 2, 3)
	l := c.WaitLeader(1, 100)
	write(t, c, l, 1, "before", "1")
	var others []raftgroup.NodeID
	for _, n := range []raftgroup.NodeID{1, 2, 3} {
		if n != l {
			others = append(others, n)
		}
	}
	next, err := c.Host(l).NextReplicaID(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Host(4).JoinGroup(1, next); err != nil {
		t.Fatal(err)
	}
	return l, others, next
}
