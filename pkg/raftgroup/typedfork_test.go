package raftgroup_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	rgt "github.com/shoal-dev/shoal/pkg/raftgroup/raftgrouptest"
)

// forkingDB is a db whose snapshot can be forked.
type forkingDB struct{ db }

func (d *forkingDB) ForkSnapshot() (func() ([]byte, error), error) {
	d.mu.Lock()
	m := maps.Clone(d.m)
	d.mu.Unlock()
	return func() ([]byte, error) { return json.Marshal(m) }, nil
}

func newForkingTyped(reg *raftgroup.Registry) (*raftgroup.Typed, *forkingDB, *db) {
	sm := raftgroup.NewTyped(reg)
	fd, pd := &forkingDB{db{m: map[string]string{}}}, &db{m: map[string]string{}}
	sm.Use(fd)
	sm.Use(pd) // stateful, cannot fork: snapshotted at the fork
	sm.Use(raftgroup.ApplierFunc(func(raftgroup.Command) any { return nil }))
	return sm, fd, pd
}

// A fork of a Typed machine writes, twice alike, its snapshot as of the
// fork while entries go on applying; Typed.WriteSnapshot writes what
// Snapshot returns.
func TestTypedForkSnapshot(t *testing.T) {
	reg := raftgroup.NewRegistry()
	if err := reg.Register(&KV{}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	fds := map[raftgroup.NodeID]*forkingDB{}
	c := rgt.New(t, rgt.Options{Nodes: 3, Seed: 5, NewStateMachine: func(n raftgroup.NodeID, _ raftgroup.GroupID) raftgroup.StateMachine {
		sm, fd, _ := newForkingTyped(reg)
		mu.Lock()
		fds[n] = fd
		mu.Unlock()
		return sm
	}})
	c.CreateGroup(1, 1, 2, 3)
	l := c.WaitLeader(1, 100)
	set := func(i int) {
		t.Helper()
		if _, err := rgt.Await(c, c.Host(l).SetAsync(1, &KV{Key: fmt.Sprint("k", i), Val: fmt.Sprint("v", i)}), 100); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 10 {
		set(i)
	}
	if !c.RunUntil(100, func() bool { return fds[1].get("k9") == "v9" }) {
		t.Fatal("node 1 did not apply k9")
	}
	var typed *raftgroup.Typed
	if err := c.Host(1).WithStateMachine(1, func(sm raftgroup.StateMachine, _ uint64) { typed = sm.(*raftgroup.Typed) }); err != nil {
		t.Fatal(err)
	}
	want, err := typed.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	fork, err := typed.ForkSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	for i := 10; i < 20; i++ {
		set(i)
	}
	if !c.RunUntil(100, func() bool { return fds[1].get("k19") == "v19" }) {
		t.Fatal("node 1 did not apply k19")
	}
	for range 2 {
		var b bytes.Buffer
		if err := fork.WriteSnapshot(&b); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b.Bytes(), want) {
			t.Fatalf("the fork wrote %d bytes, not the %d of the snapshot at the fork", b.Len(), len(want))
		}
	}
	now, err := typed.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(now, want) {
		t.Fatal("ten more entries left the snapshot unchanged")
	}
	var b bytes.Buffer
	if err := typed.WriteSnapshot(&b); err != nil || !bytes.Equal(b.Bytes(), now) {
		t.Fatalf("WriteSnapshot: %d bytes (%v), Snapshot %d", b.Len(), err, len(now))
	}
	// The fork's bytes restore the state as of the fork.
	back, fd, pd := newForkingTyped(reg)
	if err := back.Restore(want); err != nil {
		t.Fatal(err)
	}
	if fd.get("k9") != "v9" || pd.get("k9") != "v9" || fd.get("k10") != "" || pd.get("k10") != "" {
		t.Fatalf("restored from the fork: %v / %v", fd.m, pd.m)
	}
}

// Three hosts on the OS filesystem snapshot a Typed machine off the loop
// and restart from those snapshots with every key.
func TestTypedBackgroundSnapshotsOnDisk(t *testing.T) {
	const g = raftgroup.GroupID(1)
	reg := raftgroup.NewRegistry()
	if err := reg.Register(&KV{}); err != nil {
		t.Fatal(err)
	}
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	var mu sync.Mutex
	fds := map[raftgroup.NodeID]*forkingDB{}
	start := func(seed uint64) ([]*raftgroup.Host, func()) {
		return rgt.StartOnDisk(t, dirs, seed, func(cfg *raftgroup.Config) {
			cfg.SnapshotEntries, cfg.CompactionMargin, cfg.BackgroundSnapshots = 20, 5, true
		}, func(id raftgroup.NodeID, _ raftgroup.GroupID) raftgroup.StateMachine {
			sm, fd, _ := newForkingTyped(reg)
			mu.Lock()
			fds[id] = fd
			mu.Unlock()
			return sm
		})
	}
	hosts, stop := start(1)
	defer func() { stop() }()
	rgt.CreateOn(t, hosts, g)
	l := rgt.LeaderOn(t, hosts, g)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const keys = 100
	for i := range keys {
		if err := l.Set(ctx, g, &KV{Key: fmt.Sprint("k", i), Val: fmt.Sprint("v", i)}); err != nil {
			t.Fatal(err)
		}
	}
	rgt.WaitBackgroundSnapshots(t, hosts, dirs, 2, 20*time.Second)
	stop()
	hosts, stop = start(2)
	l = rgt.LeaderOn(t, hosts, g)
	if err := l.Set(ctx, g, &KV{Key: "after", Val: "restart"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for id := raftgroup.NodeID(1); id <= 3; id++ {
		for {
			mu.Lock()
			fd := fds[id]
			mu.Unlock()
			if fd.get("after") == "restart" {
				for i := range keys {
					if got := fd.get(fmt.Sprint("k", i)); got != fmt.Sprint("v", i) {
						t.Fatalf("node %d after the restart: k%d = %q", id, i, got)
					}
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d did not apply the write after the restart", id)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
