package raftgroup_test

import (
	"fmt"
	"testing"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	rgt "github.com/shoal-dev/shoal/pkg/raftgroup/raftgrouptest"
)

// handOffGroups is how many three-replica groups the hand-off tests make:
// enough that one node leads several.
const handOffGroups = 6

// busiestLeader creates the groups, writes to each, and returns the node
// that leads most of them and those groups.
func busiestLeader(t *testing.T, c *rgt.Cluster) (raftgroup.NodeID, []raftgroup.GroupID) {
	t.Helper()
	led := map[raftgroup.NodeID][]raftgroup.GroupID{}
	for g := raftgroup.GroupID(1); g <= handOffGroups; g++ {
		c.CreateGroup(g, 1, 2, 3)
	}
	for g := raftgroup.GroupID(1); g <= handOffGroups; g++ {
		l := c.WaitLeader(g, 100)
		write(t, c, l, g, "k", "before")
		led[l] = append(led[l], g)
	}
	c.RunTicks(3)
	var busiest raftgroup.NodeID
	for n, gs := range led {
		if busiest == 0 || len(gs) > len(led[busiest]) || len(gs) == len(led[busiest]) && n < busiest {
			busiest = n
		}
	}
	for _, g := range led[busiest] {
		if l, _, _ := c.Leader(g); l != busiest {
			t.Fatalf("group %d: leader moved to %d before the test", g, l)
		}
	}
	return busiest, led[busiest]
}

// writesAfterCrash crashes node n and submits a write to each group
// through another node; it ticks up to maxTicks and returns how many
// were applied by then.
func writesAfterCrash(c *rgt.Cluster, n raftgroup.NodeID, groups []raftgroup.GroupID, maxTicks int) int {
	c.Crash(n)
	via := otherThan(n)
	var futs []*raftgroup.Future[raftgroup.Result]
	for _, g := range groups {
		futs = append(futs, c.Host(via).Submit(g, raftgroup.Proposal{Data: put("k", "after")}))
	}
	done := func() int {
		k := 0
		for _, f := range futs {
			select {
			case <-f.Done():
				if _, err := f.Result(); err == nil {
					k++
				}
			default:
			}
		}
		return k
	}
	for range 3 { // a round first, as Await does
		c.Step()
	}
	c.RunUntil(maxTicks, func() bool { return done() == len(futs) })
	return done()
}

// TestHandOffMovesLeadership: a host that hands off gives every group it
// leads to another node within a few ticks, takes none back while it
// keeps proposing, and when it then stops the others write on at once,
// where without the hand-off they wait for an election timeout.
func TestHandOffMovesLeadership(t *testing.T) {
	// Writes must go on well before the earliest election (ElectionTicks
	// 10, randomized up to 20, at the default configuration).
	const quick = 3
	newCluster := func() *rgt.Cluster {
		return rgt.New(t, rgt.Options{Nodes: 3, Seed: 61, Configure: func(cfg *raftgroup.Config) {
			cfg.FollowProposers = true
		}})
	}

	t.Run("without hand-off", func(t *testing.T) {
		c := newCluster()
		leaving, groups := busiestLeader(t, c)
		if k := writesAfterCrash(c, leaving, groups, quick); k != 0 {
			t.Fatalf("%d of %d writes applied within %d ticks of the leader's crash without an election timeout", k, len(groups), quick)
		}
	})

	c := newCluster()
	leaving, groups := busiestLeader(t, c)
	if len(groups) < 2 {
		t.Fatalf("node %d leads %v: want several groups", leaving, groups)
	}
	// Idle groups are quiesced: the hand-off must wake them.
	if !c.RunUntil(20, func() bool { return c.Host(leaving).Stats().AwakeGroups == 0 }) {
		n := c.Host(leaving).Stats().AwakeGroups
		t.Fatalf("%d groups awake before the hand-off", n)
	}
	start := c.Ticks
	res, err := rgt.Await(c, c.Host(leaving).HandOffAsync(), quick)
	if err != nil {
		t.Fatal(err)
	}
	if res.Moved != len(groups) || res.Kept != 0 {
		t.Fatalf("hand-off of %v: %+v", groups, res)
	}
	t.Logf("node %d handed %d groups off in %d ticks", leaving, len(groups), c.Ticks-start)
	for _, g := range groups {
		if l, _, ok := c.Leader(g); !ok || l == leaving {
			t.Fatalf("group %d: leader %d after the hand-off\n%s", g, l, c.String(g))
		}
	}

	// The leaving node goes on proposing to a group (its callers' last
	// requests): with FollowProposers that would bring the leadership
	// back, and a transfer it refused would hold the group's writes.
	transfers := func() (n uint64) {
		for _, id := range c.Up() {
			n += c.Host(id).Stats().LeaderTransfers
		}
		return n
	}
	before := transfers()
	for i, l := range writeTicks(t, c, 4*10, 3, leaving) {
		if l == leaving {
			t.Fatalf("tick %d: group 1's leadership went back to the leaving node", i)
		}
	}
	if n := transfers() - before; n != 0 {
		t.Fatalf("%d transfers to the leaving node were started", n)
	}
	if k := writesAfterCrash(c, leaving, groups, quick); k != len(groups) {
		t.Fatalf("%d of %d writes applied within %d ticks of the crash after the hand-off\n%s", k, len(groups), quick, c.String(groups[0]))
	}
	c.Restart(leaving)
	for _, g := range groups {
		converge(t, c, g, 1, 2, 3)
	}
}

// TestHandOffKeepsWhatNobodyCanTake: a sole voter's groups stay with the
// host, and the hand-off returns at once rather than waiting for them.
func TestHandOffKeepsWhatNobodyCanTake(t *testing.T) {
	c := rgt.New(t, rgt.Options{Nodes: 1, Seed: 62})
	c.CreateGroup(1, 1)
	c.CreateGroup(2, 1)
	c.WaitLeader(1, 100)
	c.WaitLeader(2, 100)
	start := c.Ticks
	res, err := rgt.Await(c, c.Host(1).HandOffAsync(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if res.Moved != 0 || res.Kept != 2 || c.Ticks != start {
		t.Fatalf("sole voters' hand-off: %+v after %d ticks", res, c.Ticks-start)
	}
	write(t, c, 1, 1, "still", "led")
}

// TestHandOffTogether: nodes that hand off at the same time do not hand
// their groups to each other. With two of three leaving, every group ends
// up led by the third; with all three, each keeps what it leads. Either
// way the hand-offs end within a few ticks, not after the election
// timeout that raft takes to give up a transfer its target ignores.
func TestHandOffTogether(t *testing.T) {
	const quick = 4
	for _, leaving := range [][]raftgroup.NodeID{{1, 2}, {1, 2, 3}} {
		t.Run(fmt.Sprint(len(leaving), " leaving"), func(t *testing.T) {
			c := rgt.New(t, rgt.Options{Nodes: 3, Seed: 64})
			busiestLeader(t, c)
			var futs []*raftgroup.Future[raftgroup.HandOffResult]
			for _, n := range leaving {
				futs = append(futs, c.Host(n).HandOffAsync())
			}
			moved, kept := 0, 0
			for i, f := range futs {
				res, err := rgt.Await(c, f, quick)
				if err != nil {
					t.Fatalf("node %d: %v", leaving[i], err)
				}
				moved += res.Moved
				kept += res.Kept
			}
			for g := raftgroup.GroupID(1); g <= handOffGroups; g++ {
				l, _, ok := c.Leader(g)
				if !ok {
					t.Fatalf("group %d has no leader\n%s", g, c.String(g))
				}
				if len(leaving) == 2 && l != 3 {
					t.Fatalf("group %d led by %d, want the staying node 3\n%s", g, l, c.String(g))
				}
			}
			if len(leaving) == 3 && (moved != 0 || kept != handOffGroups) {
				t.Fatalf("all leaving: moved %d, kept %d; want every group kept", moved, kept)
			}
			// Writes go on: no transfer holds a group's proposals.
			for g := raftgroup.GroupID(1); g <= handOffGroups; g++ {
				if _, err := rgt.Await(c, c.Host(3).Submit(g, raftgroup.Proposal{Data: put("k", "after")}), quick); err != nil {
					t.Fatalf("group %d: %v", g, err)
				}
			}
		})
	}
}
