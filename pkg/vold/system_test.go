package vold

import (
	"context"
	"crypto/sha256"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	"github.com/shoal-dev/shoal/pkg/raftgroup/raftgrouptest"
)

// call runs a blocking host call on its own goroutine while the test
// drives the deterministic cluster, and returns its error.
func call(t *testing.T, c *raftgrouptest.Cluster, fn func(ctx context.Context) error) error {
	t.Helper()
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { done <- fn(ctx) }()
	var err error
	finished := func() bool {
		select {
		case err = <-done:
			return true
		default:
			// Let the caller's goroutine queue its request.
			time.Sleep(time.Millisecond)
			return false
		}
	}
	if !c.RunUntil(500, finished) {
		t.Fatalf("call did not finish in 500 ticks")
	}
	return err
}

func systemDigest(t *testing.T, c *raftgrouptest.Cluster, n raftgroup.NodeID, g raftgroup.GroupID) [32]byte {
	t.Helper()
	var snap []byte
	if err := c.Host(n).WithStateMachine(g, func(sm raftgroup.StateMachine, _ uint64) {
		snap, _ = sm.(*raftgroup.Typed).Snapshot()
	}); err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(snap)
}

// TestSystemGroupKVAndLocks runs the system group's state machine (typed,
// with the KV applier and raftgroup's locks) on three deterministic hosts:
// revisions are entry indexes, compare-and-swap is exact, lock tokens of
// successive holders increase, and replicas (one restarted from its disk)
// end with identical state.
func TestSystemGroupKVAndLocks(t *testing.T) {
	kvs := map[raftgroup.NodeID]*kvStore{}
	c := raftgrouptest.New(t, raftgrouptest.Options{Nodes: 3, Seed: 7, NewStateMachine: func(n raftgroup.NodeID, _ raftgroup.GroupID) raftgroup.StateMachine {
		sm, kv := newSystemMachine()
		kvs[n] = kv
		return sm
	}})
	g := newGroupID(true)
	c.CreateGroup(g, 1, 2, 3)
	c.WaitLeader(g, 200)

	var r1, r2, r3 kvPutResult
	h := c.Host(2)
	if err := call(t, c, func(ctx context.Context) error {
		return h.Do(ctx, g, &kvPut{Key: "k", Value: []byte("a"), Compare: true, IdemKey: "p1"}, &r1)
	}); err != nil || !r1.Applied || r1.Revision == 0 {
		t.Fatalf("create-if-absent: %+v, %v", r1, err)
	}
	if err := call(t, c, func(ctx context.Context) error {
		return h.Do(ctx, g, &kvPut{Key: "k", Value: []byte("b"), Compare: true, Expect: r1.Revision + 1}, &r2)
	}); err != nil || r2.Applied || r2.Revision != r1.Revision {
		t.Fatalf("cas on a stale revision: %+v, %v", r2, err)
	}
	// A retry of the first put (same idempotency key) through another
	// member gets the first result and changes nothing.
	if err := call(t, c, func(ctx context.Context) error {
		return c.Host(3).Do(ctx, g, &kvPut{Key: "k", Value: []byte("a"), Compare: true, IdemKey: "p1"}, &r3)
	}); err != nil || r3 != r1 {
		t.Fatalf("retried put: %+v, %v; want %+v", r3, err, r1)
	}

	var l1, l2 raftgroup.Lease
	if err := call(t, c, func(ctx context.Context) (err error) {
		l1, err = c.Host(1).AcquireLock(ctx, g, "L", "h1", time.Second)
		return err
	}); err != nil || l1.Token == 0 {
		t.Fatalf("acquire: %+v, %v", l1, err)
	}
	c.Crash(3)
	c.RunTicks(20) // the lease (1s of group time) runs out
	if err := call(t, c, func(ctx context.Context) (err error) {
		l2, err = c.Host(2).AcquireLock(ctx, g, "L", "h2", time.Second)
		return err
	}); err != nil || l2.Token <= l1.Token {
		t.Fatalf("second holder: %+v, %v (first token %d)", l2, err, l1.Token)
	}
	c.Restart(3)
	var caughtUp bool
	c.RunUntil(300, func() bool {
		st1, _ := c.Host(1).Status(g)
		st3, err := c.Host(3).Status(g)
		caughtUp = err == nil && st3.Applied == st1.Applied && st1.Applied > 0
		return caughtUp
	})
	if !caughtUp {
		t.Fatalf("restarted replica did not catch up")
	}
	want := systemDigest(t, c, 1, g)
	for _, n := range []raftgroup.NodeID{2, 3} {
		if systemDigest(t, c, n, g) != want {
			t.Fatalf("node %d's state differs from node 1's", n)
		}
	}
	if e, ok := kvs[3].get("k"); !ok || string(e.Value) != "a" || e.Revision != r1.Revision {
		t.Fatalf("restarted replica has k = %+v, %v", e, ok)
	}
}
