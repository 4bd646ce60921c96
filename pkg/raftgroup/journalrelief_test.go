package raftgroup_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	rgt "github.com/shoal-dev/shoal/pkg/raftgroup/raftgrouptest"
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
