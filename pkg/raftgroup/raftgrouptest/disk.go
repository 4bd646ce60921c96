package raftgrouptest

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
)

// StartOnDisk starts a host on the OS filesystem in each of dirs (node
// ids 1, 2, ...), with their loops running, on an immediate in-memory
// network; stop (also a cleanup) stops them. Unlike a Cluster, time and
// scheduling are real: for tests of what the disk and the goroutines
// off the loop do.
func StartOnDisk(tb testing.TB, dirs []string, seed uint64, configure func(*raftgroup.Config), newSM func(raftgroup.NodeID, raftgroup.GroupID) raftgroup.StateMachine) (hosts []*raftgroup.Host, stop func()) {
	net := NewNetwork(rand.New(rand.NewPCG(seed, seed)))
	net.Immediate = true
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i, dir := range dirs {
		id := raftgroup.NodeID(i + 1)
		cfg := raftgroup.Config{
			NodeID: id, Dir: dir, FS: vfs.Default, Transport: net.Transport(id),
			NewStateMachine: func(g raftgroup.GroupID) raftgroup.StateMachine { return newSM(id, g) },
		}
		if configure != nil {
			configure(&cfg)
		}
		h, err := raftgroup.Open(cfg)
		if err != nil {
			cancel()
			tb.Fatal(err)
		}
		net.Attach(id, h)
		hosts = append(hosts, h)
		wg.Add(1)
		go func() { defer wg.Done(); _ = h.Run(ctx) }()
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			for _, h := range hosts {
				h.Close()
			}
		})
	}
	tb.Cleanup(stop)
	return hosts, stop
}

// CreateOn creates group g with a replica on each of hosts (replica i+1
// on node i+1) and has the first campaign.
func CreateOn(tb testing.TB, hosts []*raftgroup.Host, g raftgroup.GroupID) {
	var members []raftgroup.Member
	for i := range hosts {
		members = append(members, raftgroup.Member{Replica: raftgroup.ReplicaID(i + 1), Node: raftgroup.NodeID(i + 1)})
	}
	for i, h := range hosts {
		if err := h.CreateGroup(g, raftgroup.ReplicaID(i+1), members); err != nil {
			tb.Fatal(err)
		}
	}
	hosts[0].Campaign(g)
}

// LeaderOn waits up to 20 s for group g's leader among hosts.
func LeaderOn(tb testing.TB, hosts []*raftgroup.Host, g raftgroup.GroupID) *raftgroup.Host {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		for _, h := range hosts {
			if st, err := h.Status(g); err == nil && st.Role == "leader" {
				return h
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	tb.Fatalf("group %d: no leader", g)
	return nil
}

// WaitBackgroundSnapshots waits up to timeout until each of hosts stored
// at least n snapshots, and fails the test unless every one of them was
// written off the loop and, with dirs (the hosts' Config.Dir), left its
// file in the journal's directory.
func WaitBackgroundSnapshots(tb testing.TB, hosts []*raftgroup.Host, dirs []string, n uint64, timeout time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for _, h := range hosts {
		for h.Stats().SnapshotsTaken < n {
			if time.Now().After(deadline) {
				tb.Fatalf("node %d: %+v", h.NodeID(), h.Stats())
			}
			time.Sleep(10 * time.Millisecond)
		}
		if st := h.Stats(); st.BackgroundSnapshots < st.SnapshotsTaken {
			tb.Fatalf("node %d: %d snapshots stored, %d of them written off the loop", h.NodeID(), st.SnapshotsTaken, st.BackgroundSnapshots)
		}
	}
	for i, dir := range dirs {
		if names, err := filepath.Glob(filepath.Join(dir, "entries", "*.snap")); err != nil || len(names) == 0 {
			tb.Fatalf("node %d: snapshot files %v (%v)", i+1, names, err)
		}
	}
}
