package raftgroup_test

import (
	"fmt"
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

// TestFollowProposersWithinWindow: a follower's burst of proposals moves
// the leadership as soon as it is enough, before the window ends (no
// tick runs here: a window only ends at a tick).
func TestFollowProposersWithinWindow(t *testing.T) {
	for _, early := range []int{raftgroup.FollowMinProposals - 1, raftgroup.FollowMinProposals} {
		t.Run(fmt.Sprint(early, " proposals"), func(t *testing.T) {
			c := followCluster(t, 24, true)
			leader, followers := settledGroup(t, c)
			writer := followers[0]
			c.RunTicks(7) // the leader's term is two windows old
			var futs []*raftgroup.Future[raftgroup.Result]
			for i := range early {
				futs = append(futs, c.Host(writer).Submit(1, raftgroup.Proposal{Data: put(fmt.Sprint("k", i), "v")}))
			}
			for range 30 {
				c.Step()
			}
			l, _, _ := c.Leader(1)
			switch {
			case early < raftgroup.FollowMinProposals && l != leader:
				t.Fatalf("leadership moved to %d after %d proposals, fewer than a window needs", l, early)
			case early >= raftgroup.FollowMinProposals && l != writer:
				t.Fatalf("leadership still on %d after %d proposals from %d within a window\n%s", l, early, writer, c.String(1))
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
