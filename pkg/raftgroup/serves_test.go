package raftgroup_test

import (
	"errors"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	rgt "github.com/shoal-dev/shoal/pkg/raftgroup/raftgrouptest"
)

// statusServes is what Serves must say, by Status: the replica exists,
// holds the group's state, and was neither removed nor broken.
func statusServes(h *raftgroup.Host, g raftgroup.GroupID) bool {
	st, err := h.Status(g)
	return err == nil && st.Initialized && !st.Removed && st.Err == nil
}

// checkServes fails unless Serves agrees with Status and with want.
func checkServes(t *testing.T, c *rgt.Cluster, n raftgroup.NodeID, g raftgroup.GroupID, want bool, when string) {
	t.Helper()
	h := c.Host(n)
	if got, byStatus := h.Serves(g), statusServes(h, g); got != want || byStatus != want {
		st, err := h.Status(g)
		t.Fatalf("%s: node %d: Serves(%d) = %v, by Status %v, want %v (%+v, %v)", when, n, g, got, byStatus, want, st, err)
	}
	if _, err := h.Machine(g); (err == nil) != knows(h, g) {
		t.Fatalf("%s: node %d: Machine(%d): %v", when, n, g, err)
	}
}

// knows reports whether h has a replica of g at all, serving or not.
func knows(h *raftgroup.Host, g raftgroup.GroupID) bool {
	_, err := h.Status(g)
	return err == nil
}

// TestServesFollowsTheReplica: Serves (which vold asks before every
// filesystem op) says what Status says at each step of a replica's life:
// unknown, created, joined but without state, caught up, removed,
// destroyed; and a group whose state machine failed.
func TestServesFollowsTheReplica(t *testing.T) {
	c := rgt.New(t, rgt.Options{Nodes: 4, Seed: 31})
	checkServes(t, c, 1, 9, false, "before the group")
	c.CreateGroup(9, 1, 2, 3)
	l := c.WaitLeader(9, 100)
	write(t, c, l, 9, "a", "1")
	for _, n := range []raftgroup.NodeID{1, 2, 3} {
		checkServes(t, c, n, 9, true, "created")
	}
	checkServes(t, c, 4, 9, false, "not a member")

	if err := c.Host(4).JoinGroup(9, 4); err != nil {
		t.Fatal(err)
	}
	checkServes(t, c, 4, 9, false, "joined, no state yet")
	if _, err := rgt.Await(c, c.Host(l).ChangeMembershipAsync(9, raftgroup.Change{Type: raftgroup.AddLearner, Replica: 4, Node: 4}), 200); err != nil {
		t.Fatal(err)
	}
	converge(t, c, 9, 1, 2, 3, 4)
	checkServes(t, c, 4, 9, true, "caught up")

	_, err := rgt.Await(c, c.Host(l).ChangeMembershipAsync(9, raftgroup.Change{Type: raftgroup.RemoveReplica, Replica: 4}), 200)
	if err != nil {
		t.Fatal(err)
	}
	if !c.RunUntil(100, func() bool { st, err := c.Host(4).Status(9); return err == nil && st.Removed }) {
		t.Fatalf("node 4 never learned its removal\n%s", c.String(9))
	}
	checkServes(t, c, 4, 9, false, "removed")
	if err := c.Host(4).DestroyGroup(9); err != nil {
		t.Fatal(err)
	}
	checkServes(t, c, 4, 9, false, "destroyed")
	if _, err := c.Host(4).Machine(9); !errors.Is(err, raftgroup.ErrGroupNotFound) {
		t.Fatalf("Machine of a destroyed replica: %v", err)
	}

	// An entry the state machine cannot apply breaks the group on every
	// replica.
	f := c.Host(l).Submit(9, raftgroup.Proposal{Data: []byte("not json")})
	if _, err := rgt.Await(c, f, 100); err == nil {
		t.Fatal("an entry the state machine refused was answered without an error")
	}
	if !c.RunUntil(100, func() bool {
		for _, n := range []raftgroup.NodeID{1, 2, 3} {
			if st, err := c.Host(n).Status(9); err != nil || st.Err == nil {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("the group did not break everywhere\n%s", c.String(9))
	}
	for _, n := range []raftgroup.NodeID{1, 2, 3} {
		checkServes(t, c, n, 9, false, "broken")
	}
}

// TestServesAndMachineDoNotWaitForTheLoop: while the leader's loop is in
// a round's journal sync, holding the host's lock, Serves and Machine
// answer (Status, which takes the lock, does not): a filesystem op asks
// both before it proposes or reads, and waiting there for the round in
// progress kept concurrent writers from sharing a sync.
func TestServesAndMachineDoNotWaitForTheLoop(t *testing.T) {
	c, hooks := syncHookedCluster(t, 32)
	leader, _ := settledGroup(t, c)
	h := c.Host(leader)

	type answers struct {
		serves  bool
		machine error
	}
	var got *answers
	statusHeld := false
	synced := false
	hooks[leader].OnSync = func(string) {
		if synced {
			return
		}
		synced = true
		status := make(chan struct{})
		go func() { _, _ = h.Status(1); close(status) }()
		lockFree := make(chan answers, 1)
		go func() {
			_, err := h.Machine(1)
			lockFree <- answers{serves: h.Serves(1), machine: err}
		}()
		select {
		case a := <-lockFree:
			got = &a
		case <-time.After(30 * time.Second):
		}
		select {
		case <-status:
		default:
			statusHeld = true // the round holds the lock: Status waits
		}
	}
	f := h.Submit(1, raftgroup.Proposal{Data: put("k", "v")})
	h.Round()
	hooks[leader].OnSync = nil
	if !synced {
		t.Fatalf("the leader's round synced nothing\n%s", c.String(1))
	}
	if !statusHeld {
		t.Fatal("Status answered during the round's sync: the test does not hold the loop's lock")
	}
	if got == nil {
		t.Fatal("Serves or Machine waited for the loop's round")
	}
	if !got.serves || got.machine != nil {
		t.Fatalf("during the sync: Serves %v, Machine %v", got.serves, got.machine)
	}
	if _, err := rgt.Await(c, f, 50); err != nil {
		t.Fatal(err)
	}
}
