package raftgroup_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	rgt "github.com/shoal-dev/shoal/pkg/raftgroup/raftgrouptest"
	"github.com/shoal-dev/shoal/pkg/volfs"
)

// runWhile runs ticks while more holds, with real time passing too
// (snapshots written off the loop, Pebble's flushes are goroutines), for
// at most limit; it reports whether more still held at the end.
func runWhile(c *rgt.Cluster, limit time.Duration, more func() bool) bool {
	for deadline := time.Now().Add(limit); more(); {
		if time.Now().After(deadline) {
			return true
		}
		c.RunTicks(1)
		time.Sleep(time.Millisecond)
	}
	return false
}

// TestIdleGroupsLetGoOfJournalSegments: groups written once and then left
// idle (far from their snapshot thresholds) each hold the journal segment
// of their entries, in small segments that a busy group keeps filling.
// Past the pin limit, the quiesced ones truncate their logs (after a
// snapshot), so the segments go: the journal stays bounded whatever the
// number of groups written now and then, and their data survives a
// restart from those snapshots.
func TestIdleGroupsLetGoOfJournalSegments(t *testing.T) {
	t.Run("snapshots on the loop", func(t *testing.T) { testJournalRelief(t, false) })
	// As a volume's: forked, written off the loop, then adopted.
	t.Run("snapshots off the loop", func(t *testing.T) { testJournalRelief(t, true) })
}

func testJournalRelief(t *testing.T, background bool) {
	opts := rgt.Options{Nodes: 3, Seed: 11, Configure: func(cfg *raftgroup.Config) {
		cfg.LargeEntry = 1
		cfg.SegmentSize = 4 << 10
		cfg.SnapshotEntries = 20
		cfg.CompactionMargin = 5
		cfg.BackgroundSnapshots = background
	}}
	if background {
		opts.NewStateMachine = func(raftgroup.NodeID, raftgroup.GroupID) raftgroup.StateMachine {
			return &rgt.ForkingKV{KV: rgt.NewKV()}
		}
	}
	c := rgt.New(t, opts)
	const idle = 40
	c.CreateGroup(1, 1, 2, 3)
	busy := c.WaitLeader(1, 100)
	value := strings.Repeat("v", 900) // about five entries per segment
	for g := raftgroup.GroupID(2); g < 2+idle; g++ {
		c.CreateGroup(g, 1, 2, 3)
		l := c.WaitLeader(g, 100)
		write(t, c, l, g, "k", fmt.Sprint(value, g))
		for i := range 8 { // about two segments of the busy group's
			write(t, c, busy, 1, fmt.Sprint("b", i), fmt.Sprint(value, i))
		}
	}
	// Every group quiesces, and the relief runs at ticks. Without it each
	// idle group would hold a segment of its own (two busy segments lie
	// between any two of them); with it only those among the newest 16
	// segments that hold log entries (the pin limit, most of them the
	// busy group's) still do.
	var holders, held int
	ok := runWhile(c, 10*time.Second, func() bool {
		for _, n := range c.Up() {
			holders, held = 0, 0
			for g, segs := range c.Host(n).JournalSegmentsHeld() {
				if g != 1 {
					holders++
					held += segs
				}
			}
			if holders > 8 || held > 16 {
				return true
			}
		}
		return false
	})
	if ok {
		t.Fatalf("%d of %d idle groups still hold %d journal segments", holders, idle, held)
	}
	var reliefs uint64
	for _, n := range c.Up() {
		reliefs += c.Host(n).Stats().JournalReliefSnapshots
	}
	if reliefs == 0 {
		t.Fatal("no snapshot taken for relief")
	}
	// A node restarts from its disk: the idle groups' data is in their
	// snapshots now, and they still take writes.
	c.Crash(2)
	c.Restart(2)
	for _, g := range []raftgroup.GroupID{2, 2 + idle/2, 1 + idle} {
		// Node 2 may have led the group: its followers may not have
		// heard of the commit yet, so write through the next leader first.
		write(t, c, c.WaitLeader(g, 200), g, "after", "restart")
		d := converge(t, c, g, 1, 2, 3)
		if got, want := d["k"], fmt.Sprint(value, g); got != want || len(d) != 2 {
			t.Fatalf("group %d after the restart: k = %.20q..., want %.20q... (%d keys)", g, got, want, len(d))
		}
	}
}

// TestJournalReliefOnDisk: volumes' filesystems on three hosts on the OS
// filesystem, loops and ticks running, snapshots written off the loop.
// Volumes that each got one write (a blob of 20 KiB) between a busy
// volume's writes let go of the segment files their blobs were in, so
// the journal's files stay bounded; after a restart every volume reads
// back what it was written.
func TestJournalReliefOnDisk(t *testing.T) {
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	var mu sync.Mutex
	fss := map[[2]uint64]*volfs.FS{}
	start := func(seed uint64) ([]*raftgroup.Host, func()) {
		return rgt.StartOnDisk(t, dirs, seed, func(cfg *raftgroup.Config) {
			cfg.SegmentSize = 64 << 10
			cfg.SnapshotEntries, cfg.CompactionMargin, cfg.BackgroundSnapshots = 20, 5, true
		}, func(id raftgroup.NodeID, g raftgroup.GroupID) raftgroup.StateMachine {
			fs := volfs.New()
			mu.Lock()
			fss[[2]uint64{uint64(id), uint64(g)}] = fs
			mu.Unlock()
			return fs
		})
	}
	apply := func(h *raftgroup.Host, g raftgroup.GroupID, op volfs.Op) volfs.Result {
		t.Helper()
		return applyOp(t, h, g, op)
	}
	newFile := func(h *raftgroup.Host, g raftgroup.GroupID) uint64 {
		apply(h, g, volfs.Op{Kind: volfs.KindSetLimit, Size: 8 << 20})
		return apply(h, g, volfs.Op{Kind: volfs.KindCreate, Parent: volfs.RootIno, Name: "f", Mode: 0o644}).Attr.Ino
	}
	const idle = 32
	hosts, stop := start(1)
	rgt.CreateOn(t, hosts, 1)
	busy := rgt.LeaderOn(t, hosts, 1)
	busyIno := newFile(busy, 1)
	rng := rand.New(rand.NewPCG(5, 6))
	random := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	want := map[raftgroup.GroupID][]byte{}
	inos := map[raftgroup.GroupID]uint64{}
	for g := raftgroup.GroupID(2); g < 2+idle; g++ {
		rgt.CreateOn(t, hosts, g)
		l := rgt.LeaderOn(t, hosts, g)
		inos[g] = newFile(l, g)
		want[g] = random(20 << 10) // a blob (16 KiB or more)
		apply(l, g, volfs.Op{Kind: volfs.KindWrite, Ino: inos[g], Data: want[g]})
		// Two segments of the busy volume's writes, small enough to be
		// in its batches (which go once Pebble has flushed them).
		for i := range 16 {
			apply(busy, 1, volfs.Op{Kind: volfs.KindWrite, Ino: busyIno, Offset: uint64(i) * 8 << 10, Data: random(8 << 10)})
		}
	}
	// Without relief every idle volume keeps a segment file (33 files on
	// each node); with it, the pin limit's 16 and the active one remain
	// once Pebble has flushed what the others held.
	logFiles := func(dir string) int {
		names, err := filepath.Glob(filepath.Join(dir, "entries", "*.log"))
		if err != nil {
			t.Fatal(err)
		}
		return len(names)
	}
	const bound = 20
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		most := 0
		for _, dir := range dirs {
			most = max(most, logFiles(dir))
		}
		if most <= bound {
			t.Logf("at most %d journal segment files on a node", most)
			break
		}
		if time.Now().After(deadline) {
			for i, h := range hosts {
				held := h.JournalSegmentsHeld()
				total := 0
				for _, n := range held {
					total += n
				}
				t.Logf("node %d: %d log files, groups holding segments %d (%d segments): %v; reliefs %d", i+1, logFiles(dirs[i]), len(held), total, held, h.Stats().JournalReliefSnapshots)
			}
			t.Fatalf("%d journal segment files on a node after %d volumes wrote once (want at most %d)", most, idle, bound)
		}
	}
	stop()
	hosts, _ = start(2)
	rgt.LeaderOn(t, hosts, 2)
	deadline := time.Now().Add(20 * time.Second)
	for g := raftgroup.GroupID(2); g < 2+idle; g++ {
		for id := uint64(1); id <= 3; id++ {
			for {
				mu.Lock()
				fs := fss[[2]uint64{id, uint64(g)}]
				mu.Unlock()
				var got []byte
				err := errors.New("no replica yet")
				if fs != nil {
					got, err = (&volfs.Client{B: volfsBackend{fs}}).Read(context.Background(), inos[g], 0, len(want[g])+1)
				}
				if err == nil && bytes.Equal(got, want[g]) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("volume %d on node %d after the restart: %d bytes (%v), not the %d written", g, id, len(got), err, len(want[g]))
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
}
