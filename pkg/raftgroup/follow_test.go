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
// (no tick runs here: a window only ends at a tick); small ones wait for
// the window's end.
func TestFollowProposersWithinWindow(t *testing.T) {
	large := raftgroup.FollowEarlyBytes / raftgroup.FollowMinProposals
	for _, tc := range []struct {
		n, size int
		move    bool
	}{
		{raftgroup.FollowMinProposals - 1, large, false},
		{raftgroup.FollowMinProposals, large, true},
		{4 * raftgroup.FollowMinProposals, 64, false},
	} {
		t.Run(fmt.Sprintf("%d of %d bytes", tc.n, tc.size), func(t *testing.T) {
			c := followCluster(t, 24, true)
			leader, followers := settledGroup(t, c)
			writer := followers[0]
			c.RunTicks(7) // the leader's term is two windows old
			var futs []*raftgroup.Future[raftgroup.Result]
			for i := range tc.n {
				v := strings.Repeat("v", tc.size)
				futs = append(futs, c.Host(writer).Submit(1, raftgroup.Proposal{Data: put(fmt.Sprint("k", i), v)}))
			}
			for range 30 {
				c.Step()
			}
			l, _, _ := c.Leader(1)
			switch {
			case !tc.move && l != leader:
				t.Fatalf("leadership moved to %d within the window after %d proposals of %d bytes", l, tc.n, tc.size)
			case tc.move && l != writer:
				t.Fatalf("leadership still on %d after %d proposals of %d bytes from %d within a window\n%s", l, tc.n, tc.size, writer, c.String(1))
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
