package raftgroup_test

import (
	"errors"
	"fmt"
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
