package raftgroup_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	rgt "github.com/shoal-dev/shoal/pkg/raftgroup/raftgrouptest"
)

func lastIndexOn(t *testing.T, c *rgt.Cluster, n raftgroup.NodeID) uint64 {
	t.Helper()
	return statusOn(t, c, n).LastIndex
}

// A leader sends its entries at once to the follower that completes its
// quorum and defers them to the other, which then writes them all with
// one sync; a write that the eager follower cannot acknowledge commits
// once the deferred appends are due.
func TestSpareFollowerAppendsDeferred(t *testing.T) {
	c := rgt.New(t, rgt.Options{Nodes: 3, Seed: 5})
	l, followers := settledGroup(t, c)

	const writes = 5
	var last raftgroup.Result
	syncs := map[raftgroup.NodeID]uint64{}
	for _, n := range followers {
		syncs[n] = c.Host(n).Stats().Syncs
	}
	for i := range writes {
		f := c.Host(l).Submit(1, raftgroup.Proposal{Data: put("k", fmt.Sprint(i))})
		if !stepUntil(c, f, 50) {
			t.Fatalf("write %d was not answered without a tick", i)
		}
		var err error
		if last, err = f.Result(); err != nil {
			t.Fatal(err)
		}
	}
	for range 20 {
		c.Step()
	}
	if c.Host(l).Stats().AppendsDeferred < writes {
		t.Fatalf("leader deferred %d appends, want at least %d", c.Host(l).Stats().AppendsDeferred, writes)
	}
	// One follower holds every entry, the other none of the new ones.
	var eager, spare raftgroup.NodeID
	for _, n := range followers {
		if li := lastIndexOn(t, c, n); li >= last.Index {
			eager = n
		} else if li+writes <= last.Index {
			spare = n
		} else {
			t.Fatalf("node %d holds the log up to %d, want %d or below %d", n, li, last.Index, last.Index-writes+1)
		}
	}
	if eager == 0 || spare == 0 {
		t.Fatalf("want one eager and one spare follower, got eager %d, spare %d", eager, spare)
	}
	if got := c.Host(eager).Stats().Syncs - syncs[eager]; got < writes {
		t.Fatalf("eager follower synced %d times for %d writes", got, writes)
	}
	// The tick sends the deferred appends: the spare writes them at once.
	c.Tick()
	if li := lastIndexOn(t, c, spare); li < last.Index {
		t.Fatalf("spare holds the log up to %d after the tick, want %d", li, last.Index)
	}
	if got := c.Host(spare).Stats().Syncs - syncs[spare]; got != 1 {
		t.Fatalf("spare follower synced %d times for %d deferred writes, want 1", got, writes)
	}

	// A read on the spare's node gets the deferred appends sent at once.
	w := c.Host(l).Submit(1, raftgroup.Proposal{Data: put("k", "r")})
	if !stepUntil(c, w, 50) {
		t.Fatal("leader's write not answered")
	}
	wr, _ := w.Result()
	if li := lastIndexOn(t, c, spare); li >= wr.Index {
		t.Fatalf("spare holds %d before its read, want the write at %d deferred", li, wr.Index)
	}
	r := c.Host(spare).ReadIndexAsync(1)
	if !stepUntil(c, r, 50) {
		t.Fatal("a read on the spare's node waited for its deferred appends to be due")
	}
	if a := appliedOn(t, c, spare); a < wr.Index {
		t.Fatalf("spare applied %d after its read, want %d", a, wr.Index)
	}
	// So does a write proposed on the spare's node, which goes to it at
	// once behind them.
	w = c.Host(l).Submit(1, raftgroup.Proposal{Data: put("k", "w")})
	if !stepUntil(c, w, 50) {
		t.Fatal("leader's write not answered")
	}
	f := c.Host(spare).Submit(1, raftgroup.Proposal{Data: put("s", "1")})
	if !stepUntil(c, f, 50) {
		t.Fatal("the spare's own write was not answered without a tick")
	}

	// The eager follower is gone: the leader's write commits when the
	// deferred appends are due (the clock moves without a tick).
	c.Tick()
	c.Net.Isolate(eager, c.Up())
	f = c.Host(l).Submit(1, raftgroup.Proposal{Data: put("k", "cut")})
	if stepUntil(c, f, 30) {
		t.Fatal("a write committed without the eager follower before its deferred appends were due")
	}
	c.Clock.Advance(11 * time.Millisecond)
	if !stepUntil(c, f, 30) {
		t.Fatal("a write did not commit once the deferred appends were due")
	}
	// The next write is sent at once to the follower that answered.
	f = c.Host(l).Submit(1, raftgroup.Proposal{Data: put("k", "next")})
	if !stepUntil(c, f, 30) {
		t.Fatal("the next write waited for deferred appends")
	}
	c.Net.Heal()
	d := converge(t, c, 1, c.Up()...)
	if d["k"] != "next" || d["s"] != "1" {
		t.Fatalf("data %v", d)
	}
}

// requireSentToAll writes data through the leader and checks that both
// followers hold it without a tick and that no append was deferred.
func requireSentToAll(t *testing.T, c *rgt.Cluster, l raftgroup.NodeID, followers []raftgroup.NodeID, data []byte) {
	t.Helper()
	before := c.Host(l).Stats().AppendsDeferred
	f := c.Host(l).Submit(1, raftgroup.Proposal{Data: data})
	if !stepUntil(c, f, 50) {
		t.Fatal("write not answered without a tick")
	}
	res, _ := f.Result()
	for range 20 {
		c.Step()
	}
	for _, n := range followers {
		if li := lastIndexOn(t, c, n); li < res.Index {
			t.Fatalf("node %d holds the log up to %d, want %d", n, li, res.Index)
		}
	}
	if d := c.Host(l).Stats().AppendsDeferred - before; d != 0 {
		t.Fatalf("%d appends deferred", d)
	}
}

// With deferral off, both followers get every append at once.
func TestDeferAppendsOff(t *testing.T) {
	c := rgt.New(t, rgt.Options{Nodes: 3, Seed: 5, Configure: func(cfg *raftgroup.Config) { cfg.DeferAppends = -1 }})
	l, followers := settledGroup(t, c)
	requireSentToAll(t, c, l, followers, put("k", "v"))
	if d := c.Host(l).Stats().AppendsDeferred; d != 0 {
		t.Fatalf("%d appends deferred with deferral off", d)
	}
}

// An append with more entry data than a small write is not deferred: it
// commits on whichever follower is faster.
func TestLargeAppendsNotDeferred(t *testing.T) {
	c := rgt.New(t, rgt.Options{Nodes: 3, Seed: 5})
	l, followers := settledGroup(t, c)
	requireSentToAll(t, c, l, followers, put("big", strings.Repeat("x", 100<<10)))
}
