package raftgroup_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	rgt "github.com/shoal-dev/shoal/pkg/raftgroup/raftgrouptest"
)

// writeTicks runs ticks ticks; before each, every node of writers
// submits perTick writes. It returns the leader after each tick, once
// every write succeeded.
func writeTicks(t *testing.T, c *rgt.Cluster, ticks, perTick int, writers ...raftgroup.NodeID) []raftgroup.NodeID {
	t.Helper()
	var leaders []raftgroup.NodeID
	var futs []*raftgroup.Future[raftgroup.Result]
	for i := range ticks {
		for _, w := range writers {
			for j := range perTick {
				p := raftgroup.Proposal{Data: put(fmt.Sprintf("k%d", j), fmt.Sprintf("%d.%d", w, i))}
				futs = append(futs, c.Host(w).Submit(1, p))
			}
		}
		c.RunTicks(1)
		l, _, _ := c.Leader(1)
		leaders = append(leaders, l)
	}
	for i, f := range futs {
		if _, err := rgt.Await(c, f, 200); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	return leaders
}

func followCluster(t *testing.T, seed uint64, on bool) *rgt.Cluster {
	return rgt.New(t, rgt.Options{Nodes: 3, Seed: seed, Configure: func(cfg *raftgroup.Config) {
		cfg.FollowProposers = on
	}})
}

// TestFollowProposers: a group written through one follower moves its
// leadership there, once, and stays while that node writes.
func TestFollowProposers(t *testing.T) {
	c := followCluster(t, 21, true)
	leader, followers := settledGroup(t, c)
	writer := followers[0]
	leaders := writeTicks(t, c, 60, 3, writer)
	moved := -1
	for i, l := range leaders {
		if l == writer {
			moved = i
			break
		}
	}
	if moved < 0 {
		t.Fatalf("leadership stayed off the writer %d: leaders per tick %v\n%s", writer, leaders, c.String(1))
	}
	for i, l := range leaders[moved:] {
		if l != writer {
			t.Fatalf("leadership left the writer %d again %d ticks after it moved there: %v", writer, i, leaders)
		}
	}
	if n := c.Host(leader).Stats().LeaderTransfers; n != 1 {
		t.Fatalf("the first leader handed leadership on %d times, want 1", n)
	}
	converge(t, c, 1, 1, 2, 3)
}

// TestFollowProposersHysteresis: a leader that writes as much as a
// follower keeps leadership, and without FollowProposers a follower that
// does all the writing does not get it.
func TestFollowProposersHysteresis(t *testing.T) {
	t.Run("two writers", func(t *testing.T) {
		c := followCluster(t, 22, true)
		leader, followers := settledGroup(t, c)
		for i, l := range writeTicks(t, c, 60, 2, leader, followers[0]) {
			if l != leader {
				t.Fatalf("leadership moved to %d after %d ticks although the leader writes as much", l, i)
			}
		}
	})
	t.Run("off", func(t *testing.T) {
		c := followCluster(t, 23, false)
		leader, followers := settledGroup(t, c)
		for i, l := range writeTicks(t, c, 60, 3, followers[0]) {
			if l != leader {
				t.Fatalf("leadership moved to %d after %d ticks with FollowProposers off", l, i)
			}
		}
	})
}

// TestFollowProposersWithinWindow: a follower's burst of large proposals
// moves the leadership as soon as it is enough, before the window ends
// (no tick runs here: a window only ends at a tick), even from a leader
// whose term is a tick or two old — the node that wrote just before the
// burst took it back (young) — and even when the leader wrote more in the
// window before the burst began; not when the leader's proposals come
// between the follower's. Small ones wait for the window's end.
func TestFollowProposersWithinWindow(t *testing.T) {
	large := raftgroup.FollowEarlyBytes / raftgroup.FollowMinProposals
	for _, tc := range []struct {
		n, size int
		young   bool
		// leaderFirst large proposals of the leader come before the
		// follower's; with interleaved, one of the leader's comes after
		// each of the follower's.
		leaderFirst int
		interleaved bool
		move        bool
	}{
		{n: raftgroup.FollowMinProposals - 1, size: large},
		{n: raftgroup.FollowMinProposals, size: large, move: true},
		{n: 4 * raftgroup.FollowMinProposals, size: 64},
		{n: raftgroup.FollowMinProposals, size: large, young: true, move: true},
		{n: raftgroup.FollowMinProposals, size: large, young: true, leaderFirst: 3 * raftgroup.FollowMinProposals, move: true},
		{n: 2 * raftgroup.FollowMinProposals, size: large, young: true, interleaved: true},
		{n: 4 * raftgroup.FollowMinProposals, size: 64, young: true},
	} {
		name := fmt.Sprintf("%d of %d bytes, young %v, leader first %d, interleaved %v", tc.n, tc.size, tc.young, tc.leaderFirst, tc.interleaved)
		t.Run(name, func(t *testing.T) {
			c := followCluster(t, 24, true)
			leader, followers := settledGroup(t, c)
			writer := followers[0]
			if tc.young {
				// followers[0] takes the leadership; the old leader
				// then writes.
				c.Host(leader).TransferLeadership(1, raftgroup.ReplicaID(followers[0]))
				if !c.RunUntilStep(50, func() bool { n, _, ok := c.Leader(1); return ok && n == followers[0] }) {
					t.Fatalf("leadership not transferred to %d\n%s", followers[0], c.String(1))
				}
				leader, writer = followers[0], leader
				c.RunTicks(2) // the new term is two ticks old, under two windows
			} else {
				c.RunTicks(7) // the leader's term is two windows old
			}
			var futs []*raftgroup.Future[raftgroup.Result]
			submit := func(n raftgroup.NodeID, i, size int) {
				v := strings.Repeat("v", size)
				futs = append(futs, c.Host(n).Submit(1, raftgroup.Proposal{Data: put(fmt.Sprint("k", n, ".", i), v)}))
				c.Step()
			}
			for i := range tc.leaderFirst {
				submit(leader, i, large)
			}
			for i := range tc.n {
				submit(writer, i, tc.size)
				if tc.interleaved {
					submit(leader, tc.leaderFirst+i, large)
				}
			}
			for range 30 {
				c.Step()
			}
			l, _, _ := c.Leader(1)
			switch {
			case !tc.move && l != leader:
				t.Fatalf("leadership moved to %d within the window", l)
			case tc.move && l != writer:
				t.Fatalf("leadership still on %d after %d's burst within a window\n%s", l, writer, c.String(1))
			}
			for i, f := range futs {
				if _, err := rgt.Await(c, f, 200); err != nil {
					t.Fatalf("write %d: %v", i, err)
				}
			}
			converge(t, c, 1, 1, 2, 3)
		})
	}
}
