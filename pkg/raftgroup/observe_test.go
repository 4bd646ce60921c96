package raftgroup_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	rgt "github.com/shoal-dev/shoal/pkg/raftgroup/raftgrouptest"
	"github.com/shoal-dev/shoal/pkg/volfs"
)

// ObserveSync hears of every synced journal write, and of nothing else:
// on each host, the rounds' synced writes (Stats.Syncs) and the group's
// creation.
func TestObserveSync(t *testing.T) {
	const g = raftgroup.GroupID(1)
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	var mu sync.Mutex
	observed := map[raftgroup.NodeID][]time.Duration{}
	hosts, stop := rgt.StartOnDisk(t, dirs, 1, func(cfg *raftgroup.Config) {
		id := cfg.NodeID
		cfg.ObserveSync = func(d time.Duration) {
			mu.Lock()
			observed[id] = append(observed[id], d)
			mu.Unlock()
		}
	}, func(raftgroup.NodeID, raftgroup.GroupID) raftgroup.StateMachine { return volfs.New() })
	defer stop()
	rgt.CreateOn(t, hosts, g)
	l := rgt.LeaderOn(t, hosts, g)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 20 {
		op := volfs.Op{Kind: volfs.KindMkdir, Parent: volfs.RootIno, Name: string(rune('a' + i)), Mode: 0o755}
		if _, _, err := l.Propose(ctx, g, op.Encode()); err != nil {
			t.Fatal(err)
		}
	}
	stop()
	mu.Lock()
	defer mu.Unlock()
	for i, h := range hosts {
		id := raftgroup.NodeID(i + 1)
		syncs := h.Stats().Syncs
		if got := uint64(len(observed[id])); got != syncs+1 {
			t.Errorf("host %d: %d synced writes observed, want %d (rounds' %d and the group's creation)", id, got, syncs+1, syncs)
		}
		for _, d := range observed[id] {
			if d <= 0 {
				t.Errorf("host %d: a synced write took %v", id, d)
			}
		}
	}
	if n := l.Stats().Syncs; n == 0 {
		t.Errorf("the leader synced no round over 20 proposals")
	}
}
