package raftgroup_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	rgt "github.com/shoal-dev/shoal/pkg/raftgroup/raftgrouptest"
)

// segmentFiles counts a node's live and kept (free) segment files.
func segmentFiles(t *testing.T, c *rgt.Cluster, n raftgroup.NodeID) (live, free int) {
	t.Helper()
	names, err := c.Node(n).FS.List("/pebble/entries")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		switch {
		case strings.HasSuffix(name, ".log"):
			live++
		case strings.HasSuffix(name, ".free"):
			free++
		}
	}
	return live, free
}

// TestSegmentLogBoundedAndDurable writes entries whose data all go to the
// segment log, in small segments and with frequent snapshots: the segments
// that truncation emptied are dropped or kept for reuse, so their number
// stays bounded; a crashed node reads its log back from the segments (its
// entry cache is gone) and catches up; so does one that missed more than
// the log keeps, from a snapshot stored in a segment.
func TestSegmentLogBoundedAndDurable(t *testing.T) {
	c := rgt.New(t, rgt.Options{Nodes: 3, Seed: 9, Configure: func(cfg *raftgroup.Config) {
		cfg.LargeEntry = 1
		cfg.SegmentSize = 4 << 10
		cfg.SnapshotEntries = 20
		cfg.CompactionMargin = 5
	}})
	c.CreateGroup(1, 1, 2, 3)
	l := c.WaitLeader(1, 100)
	value := strings.Repeat("v", 900) // about five entries per segment
	for i := range 200 {
		write(t, c, l, 1, fmt.Sprint("k", i%50), fmt.Sprint(value, i))
	}
	// The log holds at most CompactionMargin entries more than it takes
	// to weigh as much as the last snapshot (SnapshotEntries at least):
	// here the 50 values and the recent proposals' results (each with the
	// old value) the snapshot keeps, 120-130 KiB, weigh about 65 entries
	// (900 bytes and 1 KiB each), some 15 segments, where the 230 writes
	// fill over 50; four more are kept for reuse. Segments whose batches
	// Pebble has not flushed yet wait for a flush in the background, so
	// give it a moment.
	deadline := time.Now().Add(10 * time.Second)
	for _, n := range c.Up() {
		for {
			live, free := segmentFiles(t, c, n)
			if live > 0 && live <= 20 && free <= 4 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d: %d live and %d free segment files after 200 writes", n, live, free)
			}
			c.RunTicks(1)
			time.Sleep(time.Millisecond)
		}
	}
	// A follower restarts from its disk alone.
	victim := otherThan(l)
	c.Crash(victim)
	c.Restart(victim)
	for i := 200; i < 230; i++ {
		write(t, c, l, 1, fmt.Sprint("k", i%50), fmt.Sprint(value, i))
	}
	d := converge(t, c, 1, 1, 2, 3)
	if got, want := d["k29"], fmt.Sprint(value, 229); got != want {
		t.Fatalf("k29 = %.20q..., want %.20q...", got, want)
	}
	// A follower that misses more than the log keeps catches up from the
	// snapshot, which is in a segment too.
	c.Crash(victim)
	sent := func() (n uint64) {
		for _, id := range c.Up() {
			n += c.Host(id).Stats().SnapshotsSent
		}
		return n
	}
	before := sent()
	for i := 230; i < 300; i++ {
		write(t, c, l, 1, fmt.Sprint("k", i%50), fmt.Sprint(value, i))
	}
	c.Restart(victim)
	converge(t, c, 1, 1, 2, 3)
	if sent() == before {
		t.Fatal("the follower caught up without a snapshot")
	}
	// The leader restarts too and serves its log from the segments.
	c.Crash(l)
	c.Restart(l)
	l = c.WaitLeader(1, 200)
	write(t, c, l, 1, "after", "restart")
	if d := converge(t, c, 1, 1, 2, 3); len(d) != 51 {
		t.Fatalf("%d keys after the restarts", len(d))
	}
}

// TestSnapshotByBytes: a group whose entries are large snapshots and
// truncates its log by the bytes applied, long before SnapshotEntries.
func TestSnapshotByBytes(t *testing.T) {
	c := rgt.New(t, rgt.Options{Nodes: 3, Seed: 10, Configure: func(cfg *raftgroup.Config) {
		cfg.SnapshotBytes = 256 << 10
	}})
	c.CreateGroup(1, 1, 2, 3)
	l := c.WaitLeader(1, 100)
	big := strings.Repeat("x", 20<<10) // in segments by default
	for i := range 40 {
		write(t, c, l, 1, fmt.Sprint("k", i%2), fmt.Sprint(big, i))
	}
	converge(t, c, 1, 1, 2, 3)
	st, err := c.Host(l).Status(1)
	if err != nil {
		t.Fatal(err)
	}
	// 800 KiB applied: snapshots at 256 KiB and beyond; the state is two
	// keys (40 KiB), so the threshold stays SnapshotBytes.
	if st.SnapshotIndex == 0 || st.FirstIndex <= 5 {
		t.Fatalf("no snapshot or truncation by bytes: %+v", st)
	}
	// The log (under 1 MiB) spans at most two segments; segments whose
	// batches Pebble has not flushed yet go once a flush in the background
	// ends.
	for deadline := time.Now().Add(10 * time.Second); ; {
		live, _ := segmentFiles(t, c, l)
		if live <= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d live segments for a log of at most %d entries", live, st.LastIndex-st.FirstIndex+1)
		}
		c.RunTicks(1)
		time.Sleep(time.Millisecond)
	}
}
