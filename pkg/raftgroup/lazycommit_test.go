package raftgroup_test

import (
	"fmt"
	"testing"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	rgt "github.com/shoal-dev/shoal/pkg/raftgroup/raftgrouptest"
)

// stepUntil runs rounds and deliveries, without ticks, until f resolves
// or max steps passed; it reports whether f resolved.
func stepUntil[T any](c *rgt.Cluster, f *raftgroup.Future[T], max int) bool {
	for range max {
		if rgt.Resolved(f) {
			return true
		}
		c.Step()
	}
	return rgt.Resolved(f)
}

// statusOn returns node n's status of group 1.
func statusOn(t *testing.T, c *rgt.Cluster, n raftgroup.NodeID) raftgroup.GroupStatus {
	t.Helper()
	st, err := c.Host(n).Status(1)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func appliedOn(t *testing.T, c *rgt.Cluster, n raftgroup.NodeID) uint64 {
	t.Helper()
	return statusOn(t, c, n).Applied
}

// A leader holds the notice of a commit that only its own proposers wait
// for until the next append or tick; a follower's own proposal, and one
// that waits for a quorum to apply it, are answered without a tick.
func TestCommitNoticesHeldUntilNeeded(t *testing.T) {
	// Deferred appends (tested on their own) would keep the next append
	// from one of the followers.
	c := rgt.New(t, rgt.Options{Nodes: 3, Seed: 11, Configure: func(cfg *raftgroup.Config) { cfg.DeferAppends = -1 }})
	l, followers := settledGroup(t, c)

	// The leader's own write: answered without a tick, and the followers
	// learn of its commit only at the next tick.
	held := c.Host(l).Stats().NoticesHeld
	f := c.Host(l).Submit(1, raftgroup.Proposal{Data: put("a", "1")})
	if !stepUntil(c, f, 50) {
		t.Fatal("the leader's write was not answered without a tick")
	}
	res, err := f.Result()
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		c.Step()
	}
	if c.Host(l).Stats().NoticesHeld == held {
		t.Fatal("no commit notice was held")
	}
	for _, n := range followers {
		if a := appliedOn(t, c, n); a >= res.Index {
			t.Fatalf("node %d applied %d before the tick, want below %d (the notice was sent)", n, a, res.Index)
		}
	}
	c.Tick()
	for _, n := range followers {
		if a := appliedOn(t, c, n); a < res.Index {
			t.Fatalf("node %d applied %d after the tick, want %d", n, a, res.Index)
		}
	}

	// A next write's append carries the commit: the notice is moot.
	f = c.Host(l).Submit(1, raftgroup.Proposal{Data: put("a", "2")})
	if !stepUntil(c, f, 50) {
		t.Fatal("the leader's second write was not answered without a tick")
	}
	first, _ := f.Result()
	f = c.Host(l).Submit(1, raftgroup.Proposal{Data: put("a", "3")})
	if !stepUntil(c, f, 50) {
		t.Fatal("the leader's third write was not answered without a tick")
	}
	for range 20 {
		c.Step()
	}
	for _, n := range followers {
		if a := appliedOn(t, c, n); a < first.Index {
			t.Fatalf("node %d applied %d, want at least %d (the next append's commit)", n, a, first.Index)
		}
	}

	// A follower's own write needs the commit notice at once.
	f = c.Host(followers[0]).Submit(1, raftgroup.Proposal{Data: put("b", "1")})
	if !stepUntil(c, f, 50) {
		t.Fatal("a follower's write was not answered without a tick")
	}
	// So does a write that waits for a quorum to apply it.
	f = c.Host(l).Submit(1, raftgroup.Proposal{Data: put("c", "1"), WaitQuorum: true})
	if !stepUntil(c, f, 50) {
		t.Fatal("a quorum write was not answered without a tick")
	}
	c.Tick()
	d := converge(t, c, 1, c.Up()...)
	if d["a"] != "3" || d["b"] != "1" || d["c"] != "1" {
		t.Fatalf("data %v", d)
	}
}

// A follower's own write needs the commit notice at once; it travels as a
// heartbeat that wants no answer, so the write costs the leader two
// batches from that follower (the proposal and its acknowledgement),
// while regular heartbeats are still answered.
func TestNoticeHeartbeatUnanswered(t *testing.T) {
	c := rgt.New(t, rgt.Options{Nodes: 3, Seed: 5})
	l, followers := settledGroup(t, c)
	p := followers[0]
	var toLeader, notices, answers int
	c.Net.Tap = func(from, to raftgroup.NodeID, b *raftgroup.Batch) {
		if from == p && to == l {
			toLeader++
			answers += len(b.HeartbeatResps)
		}
		if from == l && to == p {
			for _, hb := range b.Heartbeats {
				if hb.Notice {
					notices++
				}
			}
		}
	}
	for i := range 3 {
		toLeader, notices, answers = 0, 0, 0
		f := c.Host(p).Submit(1, raftgroup.Proposal{Data: put("w", fmt.Sprint(i))})
		if !stepUntil(c, f, 50) {
			t.Fatalf("write %d from a follower was not answered without a tick", i)
		}
		for range 10 {
			c.Step()
		}
		if notices != 1 || toLeader != 2 || answers != 0 {
			t.Fatalf("write %d: %d notice heartbeats, %d batches to the leader with %d heartbeat answers; want 1, 2, 0", i, notices, toLeader, answers)
		}
	}
	c.Tick()
	if answers == 0 {
		t.Fatal("a regular heartbeat was not answered")
	}
	d := converge(t, c, 1, c.Up()...)
	if d["w"] != "2" {
		t.Fatalf("data %v", d)
	}
}
