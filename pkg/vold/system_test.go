package vold

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
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

// newSystemCluster runs a system group on three deterministic hosts and
// returns the KV applier of each.
func newSystemCluster(t *testing.T, seed uint64) (*raftgrouptest.Cluster, map[raftgroup.NodeID]*kvStore, raftgroup.GroupID) {
	kvs := map[raftgroup.NodeID]*kvStore{}
	c := raftgrouptest.New(t, raftgrouptest.Options{Nodes: 3, Seed: seed, NewStateMachine: func(n raftgroup.NodeID, _ raftgroup.GroupID) raftgroup.StateMachine {
		sm, kv := newSystemMachine()
		kvs[n] = kv
		return sm
	}})
	g := newGroupID(true)
	c.CreateGroup(g, 1, 2, 3)
	c.WaitLeader(g, 200)
	return c, kvs, g
}

// requireCaughtUp waits until node 3 (restarted) applied what node 1 has,
// and checks that every replica's state is the same.
func requireCaughtUp(t *testing.T, c *raftgrouptest.Cluster, g raftgroup.GroupID) {
	t.Helper()
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
}

// TestSystemGroupKVAndLocks runs the system group's state machine (typed,
// with the KV applier and raftgroup's locks) on three deterministic hosts:
// revisions are entry indexes, compare-and-swap is exact, lock tokens of
// successive holders increase, and replicas (one restarted from its disk)
// end with identical state.
func TestSystemGroupKVAndLocks(t *testing.T) {
	c, kvs, g := newSystemCluster(t, 7)

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
	requireCaughtUp(t, c, g)
	if e, ok := kvs[3].get("k"); !ok || string(e.Value) != "a" || e.Revision != r1.Revision {
		t.Fatalf("restarted replica has k = %+v, %v", e, ok)
	}
}

// TestSystemGroupStateMachines runs the named state machines of the
// StateMachines API on three deterministic hosts: commands get increasing
// indexes, a compare on the last index is exact, a retried Set applies
// once, a snapshot command compacts the log, the log's size is capped, a
// fenced Set is refused once its lease is gone, and replicas (one
// restarted from its disk) end with identical logs.
func TestSystemGroupStateMachines(t *testing.T) {
	c, kvs, g := newSystemCluster(t, 9)
	set := func(n raftgroup.NodeID, m machineSet) machineSetResult {
		t.Helper()
		var r machineSetResult
		if err := call(t, c, func(ctx context.Context) error { return c.Host(n).DoQuorum(ctx, g, &m, &r) }); err != nil {
			t.Fatalf("set %+v on node %d: %v", m, n, err)
		}
		return r
	}
	var last uint64
	for i := range 5 {
		r := set(raftgroup.NodeID(1+i%3), machineSet{Machine: "m", TypeURL: "t", Value: []byte{byte(i)}, IdemKey: fmt.Sprint("k", i)})
		if !r.Applied || r.Index <= last {
			t.Fatalf("set %d: %+v after index %d", i, r, last)
		}
		last = r.Index
	}
	// A retry of the last Set on another member: the first result, once.
	if r := set(3, machineSet{Machine: "m", TypeURL: "t", Value: []byte{4}, IdemKey: "k4"}); r != (machineSetResult{Applied: true, Index: last}) {
		t.Fatalf("retried set: %+v, want applied at %d", r, last)
	}
	if r := set(2, machineSet{Machine: "m", Value: []byte("x"), Compare: true, Expect: last - 1}); r.Applied || r.Index != last {
		t.Fatalf("compare on a stale index: %+v, want refused with index %d", r, last)
	}
	// A snapshot command, compared on the last index, compacts the log.
	snap := set(2, machineSet{Machine: "m", TypeURL: "t", Value: []byte("fold"), Snapshot: true, Compare: true, Expect: last})
	if !snap.Applied {
		t.Fatalf("snapshot: %+v", snap)
	}
	cmds, _ := kvs[2].readMachine("m", 0)
	if len(cmds) != 1 || !cmds[0].Snapshot || cmds[0].Index != snap.Index || string(cmds[0].Value) != "fold" {
		t.Fatalf("log after the snapshot: %+v", cmds)
	}
	if cmds, _ := kvs[2].readMachine("m", snap.Index); len(cmds) != 0 {
		t.Fatalf("commands after the snapshot's index: %+v", cmds)
	}
	// The log of a machine is capped; a snapshot makes room again.
	mib := make([]byte, 1<<20)
	for range maxMachineBytes / len(mib) {
		set(1, machineSet{Machine: "big", Value: mib})
	}
	if r := set(1, machineSet{Machine: "big", Value: mib}); r.Applied || !r.Full {
		t.Fatalf("a Set over the limit: %+v", r)
	}
	if r := set(1, machineSet{Machine: "big", Value: []byte("small"), Snapshot: true}); !r.Applied {
		t.Fatalf("compaction of a full log: %+v", r)
	}
	// Fenced: applied while the lease holds, refused once superseded.
	var l1 raftgroup.Lease
	if err := call(t, c, func(ctx context.Context) (err error) {
		l1, err = c.Host(1).AcquireLock(ctx, g, "L", "h1", time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	fenced := func(l raftgroup.Lease) error {
		var r machineSetResult
		return call(t, c, func(ctx context.Context) error {
			return c.Host(3).DoFencedQuorum(ctx, g, l, &machineSet{Machine: "m", Value: []byte("fenced")}, &r)
		})
	}
	if err := fenced(l1); err != nil {
		t.Fatalf("fenced set with the current lease: %v", err)
	}
	c.RunTicks(20) // the lease (1s of group time) runs out
	if err := call(t, c, func(ctx context.Context) error {
		_, err := c.Host(2).AcquireLock(ctx, g, "L", "h2", time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := fenced(l1); !errors.Is(err, raftgroup.ErrFenced) {
		t.Fatalf("fenced set with a superseded lease: %v, want ErrFenced", err)
	}

	// A replica that restarts from its disk ends with the same logs.
	c.Crash(3)
	set(1, machineSet{Machine: "m", Value: []byte("while 3 is down")})
	c.Restart(3)
	requireCaughtUp(t, c, g)
	got, _ := kvs[3].readMachine("m", 0)
	if len(got) != 3 || !got[0].Snapshot || string(got[1].Value) != "fenced" || string(got[2].Value) != "while 3 is down" {
		t.Fatalf("restarted replica's log of m: %+v", got)
	}
}

// The system group's machine (KV, named state machines, locks) on three
// hosts on the OS filesystem is snapshotted off the Raft loop, as vold
// runs it, and the hosts restart from those snapshots with every key and
// command and the same state.
func TestSystemGroupBackgroundSnapshotsOnDisk(t *testing.T) {
	g := newGroupID(true)
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	var mu sync.Mutex
	kvs := map[raftgroup.NodeID]*kvStore{}
	start := func(seed uint64) ([]*raftgroup.Host, func()) {
		return raftgrouptest.StartOnDisk(t, dirs, seed, func(cfg *raftgroup.Config) {
			cfg.SnapshotEntries, cfg.CompactionMargin, cfg.BackgroundSnapshots = 20, 5, true
		}, func(id raftgroup.NodeID, _ raftgroup.GroupID) raftgroup.StateMachine {
			sm, kv := newSystemMachine()
			mu.Lock()
			kvs[id] = kv
			mu.Unlock()
			return sm
		})
	}
	kvOf := func(id raftgroup.NodeID) *kvStore {
		mu.Lock()
		defer mu.Unlock()
		return kvs[id]
	}
	hosts, stop := start(1)
	defer func() { stop() }()
	raftgrouptest.CreateOn(t, hosts, g)
	l := raftgrouptest.LeaderOn(t, hosts, g)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 60
	for i := range n {
		var r kvPutResult
		if err := l.Do(ctx, g, &kvPut{Key: fmt.Sprint("k", i), Value: []byte(fmt.Sprint("v", i))}, &r); err != nil || !r.Applied {
			t.Fatalf("put k%d: %+v, %v", i, r, err)
		}
		var m machineSetResult
		if err := l.Do(ctx, g, &machineSet{Machine: "m", Value: []byte(fmt.Sprint(i))}, &m); err != nil || !m.Applied {
			t.Fatalf("set %d: %+v, %v", i, m, err)
		}
	}
	raftgrouptest.WaitBackgroundSnapshots(t, hosts, nil, 2, 30*time.Second)
	stop()
	hosts, stop = start(2)
	l = raftgrouptest.LeaderOn(t, hosts, g)
	var r kvPutResult
	if err := l.Do(ctx, g, &kvPut{Key: "after", Value: []byte("restart")}, &r); err != nil || !r.Applied {
		t.Fatalf("put after the restart: %+v, %v", r, err)
	}
	var want []byte
	deadline := time.Now().Add(30 * time.Second)
	for id := raftgroup.NodeID(1); id <= 3; id++ {
		for {
			if e, ok := kvOf(id).get("after"); ok && string(e.Value) == "restart" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d did not apply the put after the restart", id)
			}
			time.Sleep(10 * time.Millisecond)
		}
		kv := kvOf(id)
		for i := range n {
			if e, ok := kv.get(fmt.Sprint("k", i)); !ok || string(e.Value) != fmt.Sprint("v", i) {
				t.Fatalf("node %d after the restart: k%d = %+v, %v", id, i, e, ok)
			}
		}
		if cmds, _ := kv.readMachine("m", 0); len(cmds) != n {
			t.Fatalf("node %d after the restart: machine m has %d commands, want %d", id, len(cmds), n)
		}
		snap, err := kv.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		if want == nil {
			want = snap
		} else if !bytes.Equal(snap, want) {
			t.Fatalf("node %d's KV state differs from node 1's", id)
		}
	}
}
