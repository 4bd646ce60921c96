package raftgroup_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	rgt "github.com/shoal-dev/shoal/pkg/raftgroup/raftgrouptest"
	"github.com/shoal-dev/shoal/pkg/volfs"
)

// snapFiles counts node n's snapshot files written off the loop.
func snapFiles(t *testing.T, c *rgt.Cluster, n raftgroup.NodeID) int {
	t.Helper()
	names, err := c.Node(n).FS.List("/pebble/entries")
	if err != nil {
		t.Fatal(err)
	}
	k := 0
	for _, name := range names {
		if strings.HasSuffix(name, ".snap") {
			k++
		}
	}
	return k
}

func forkingCluster(t *testing.T, seed uint64, gate <-chan struct{}, written chan struct{}) *rgt.Cluster {
	return rgt.New(t, rgt.Options{Nodes: 3, Seed: seed, Configure: func(cfg *raftgroup.Config) {
		cfg.SnapshotEntries = 10
		cfg.CompactionMargin = 2
		cfg.LargeEntry = 64 // the snapshots of a few keys are larger
		cfg.BackgroundSnapshots = true
	}, NewStateMachine: func(raftgroup.NodeID, raftgroup.GroupID) raftgroup.StateMachine {
		return &rgt.ForkingKV{KV: rgt.NewKV(), Gate: gate, Written: written}
	}})
}

// runUntil runs ticks until cond holds (the snapshot writers are
// goroutines: real time passes too), or fails after 10 s.
func runUntil(t *testing.T, c *rgt.Cluster, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		c.RunTicks(1)
		time.Sleep(time.Millisecond)
	}
}

// TestBackgroundSnapshots: with BackgroundSnapshots, a snapshot is
// written off the loop — writes go on while its writer is held, the log
// is compacted only once it is stored — and the stored snapshot serves a
// lagging replica and every node's restart.
func TestBackgroundSnapshots(t *testing.T) {
	gate := make(chan struct{})
	c := forkingCluster(t, 11, gate, nil)
	var open sync.Once
	release := func() { open.Do(func() { close(gate) }) }
	t.Cleanup(release) // before the cluster closes, which waits for the writers
	c.Net.SendErrors = true
	c.CreateGroup(1, 1, 2, 3)
	l := c.WaitLeader(1, 100)
	victim := otherThan(l)
	c.Crash(victim)
	for i := range 30 {
		write(t, c, l, 1, fmt.Sprint("k", i), fmt.Sprint(i))
	}
	st := c.Host(l).Stats()
	if st.BackgroundSnapshots != 1 || st.SnapshotsTaken != 0 {
		t.Fatalf("leader: %d snapshots started off the loop, %d stored, want 1 and 0 while the writer is held", st.BackgroundSnapshots, st.SnapshotsTaken)
	}
	if s, _ := c.Host(l).Status(1); s.SnapshotIndex > 1 || s.FirstIndex > 2 {
		t.Fatalf("snapshot stored or log compacted while the writer is held: %+v", s)
	}
	release()
	runUntil(t, c, "the snapshot to be stored", func() bool {
		s, _ := c.Host(l).Status(1)
		return c.Host(l).Stats().SnapshotsTaken > 0 && s.SnapshotIndex >= 10 && s.FirstIndex > 5
	})
	if n := snapFiles(t, c, l); n != 1 {
		t.Fatalf("leader holds %d snapshot files, want 1", n)
	}
	// More writes: the next snapshot replaces the first, whose file goes.
	for i := 30; i < 60; i++ {
		write(t, c, l, 1, fmt.Sprint("k", i), fmt.Sprint(i))
	}
	runUntil(t, c, "a second snapshot, and the first one's file gone", func() bool {
		return c.Host(l).Stats().SnapshotsTaken >= 2 && snapFiles(t, c, l) == 1
	})
	// The lagging replica needs the log the leader no longer has.
	c.Restart(victim)
	if d := converge(t, c, 1, 1, 2, 3); len(d) != 60 {
		t.Fatalf("%d keys after catching up", len(d))
	}
	sent := uint64(0)
	for _, n := range c.Up() {
		sent += c.Host(n).Stats().SnapshotsSent
	}
	if sent == 0 {
		t.Fatal("the lagging replica caught up without a snapshot")
	}
	// Every node restarts from its disk alone.
	for _, n := range c.Up() {
		c.Crash(n)
	}
	for n := raftgroup.NodeID(1); n <= 3; n++ {
		c.Restart(n)
	}
	// A write commits after everything before it (converge alone could
	// see three replicas agree before the new term commits anything).
	write(t, c, c.WaitLeader(1, 200), 1, "k60", "60")
	if d := converge(t, c, 1, 1, 2, 3); len(d) != 61 || d["k59"] != "59" {
		t.Fatalf("%d keys after a restart of every node and a write (k59 = %q)", len(d), d["k59"])
	}
}

// TestBackgroundSnapshotCrash: a node that crashes while it writes a
// snapshot off the loop, or before the loop stores it, leaves no file
// behind once it restarts, and carries on.
func TestBackgroundSnapshotCrash(t *testing.T) {
	written := make(chan struct{})
	c := forkingCluster(t, 12, nil, written)
	c.CreateGroup(1, 1, 2, 3)
	l := c.WaitLeader(1, 100)
	for i := range 12 {
		write(t, c, l, 1, fmt.Sprint("k", i), fmt.Sprint(i))
	}
	<-written
	time.Sleep(20 * time.Millisecond) // the file's sync, most likely
	victim := otherThan(l)
	stored := c.Host(victim).Stats().SnapshotsTaken
	c.Crash(victim)
	c.Restart(victim)
	if n := snapFiles(t, c, victim); stored == 0 && n != 0 {
		t.Fatalf("%d snapshot files after a restart, none stored", n)
	}
	for i := 12; i < 20; i++ {
		write(t, c, l, 1, fmt.Sprint("k", i), fmt.Sprint(i))
	}
	if d := converge(t, c, 1, 1, 2, 3); len(d) != 20 {
		t.Fatalf("%d keys", len(d))
	}
}

// TestBackgroundSnapshotsOnDisk runs a volume's filesystem on three hosts
// on the OS filesystem, their loops running, with snapshots written off
// the loop: each host stores snapshots in files of their own while
// writes go on; all three restart from their disks and agree on the
// state, which holds every write.
func TestBackgroundSnapshotsOnDisk(t *testing.T) {
	const g = raftgroup.GroupID(1)
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	var mu sync.Mutex
	fss := map[raftgroup.NodeID]*volfs.FS{}
	start := func(seed uint64) ([]*raftgroup.Host, func()) {
		return rgt.StartOnDisk(t, dirs, seed, func(cfg *raftgroup.Config) {
			cfg.SnapshotEntries, cfg.CompactionMargin, cfg.BackgroundSnapshots = 20, 5, true
		}, func(id raftgroup.NodeID, _ raftgroup.GroupID) raftgroup.StateMachine {
			fs := volfs.New()
			mu.Lock()
			fss[id] = fs
			mu.Unlock()
			return fs
		})
	}
	leader := func(hosts []*raftgroup.Host) *raftgroup.Host { return rgt.LeaderOn(t, hosts, g) }
	apply := func(h *raftgroup.Host, op volfs.Op) volfs.Result {
		t.Helper()
		return applyOp(t, h, g, op)
	}

	hosts, stop := start(1)
	rgt.CreateOn(t, hosts, g)
	l := leader(hosts)
	apply(l, volfs.Op{Kind: volfs.KindSetLimit, Size: 64 << 20})
	ino := apply(l, volfs.Op{Kind: volfs.KindCreate, Parent: volfs.RootIno, Name: "f", Mode: 0o644}).Attr.Ino
	rng := rand.New(rand.NewPCG(3, 4))
	want := make([]byte, 512<<10)
	for i := range 120 {
		data := make([]byte, 8<<10)
		for j := range data {
			data[j] = byte(rng.Uint32())
		}
		off := rng.IntN(len(want)-len(data)) &^ 4095
		if i == 0 {
			data, off = make([]byte, len(want)), 0
		}
		apply(l, volfs.Op{Kind: volfs.KindWrite, Ino: ino, Offset: uint64(off), Data: data})
		copy(want[off:], data)
	}
	rgt.WaitBackgroundSnapshots(t, hosts, dirs, 2, 20*time.Second)
	// A replaced snapshot's file goes (off the loop): one stays per node.
	for i, dir := range dirs {
		for deadline := time.Now().Add(10 * time.Second); ; {
			names, err := filepath.Glob(filepath.Join(dir, "entries", "*.snap"))
			if err == nil && len(names) == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d keeps snapshot files %v (%v)", i+1, names, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	stop()
	hosts, _ = start(2)
	l = leader(hosts)
	apply(l, volfs.Op{Kind: volfs.KindWrite, Ino: ino, Offset: 0, Data: []byte("after")})
	copy(want, "after")
	digests := map[[32]byte]bool{}
	deadline := time.Now().Add(20 * time.Second)
	for id := raftgroup.NodeID(1); id <= 3; id++ {
		for {
			mu.Lock()
			fs := fss[id]
			mu.Unlock()
			got, err := (&volfs.Client{B: volfsBackend{fs}}).Read(context.Background(), ino, 0, len(want)+1)
			if err == nil && bytes.Equal(got, want) {
				digests[fs.Digest()] = true
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d reads %d bytes (%v), not the %d written", id, len(got), err, len(want))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if len(digests) != 1 {
		t.Fatalf("%d different states on three replicas", len(digests))
	}
}

// volfsBackend reads one replica's filesystem directly.
// applyOp proposes a filesystem op to group g through h and returns its
// result, failing the test on an error.
func applyOp(t *testing.T, h *raftgroup.Host, g raftgroup.GroupID, op volfs.Op) volfs.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, res, err := h.Propose(ctx, g, op.Encode())
	if err != nil {
		t.Fatal(err)
	}
	r, err := volfs.DecodeResult(res)
	if err != nil || r.Errno != 0 {
		t.Fatalf("group %d: %v: %v errno %d", g, op.Kind, err, r.Errno)
	}
	return r
}

type volfsBackend struct{ fs *volfs.FS }

func (b volfsBackend) Mutate(context.Context, []byte) ([]byte, error) {
	return nil, errors.New("read-only")
}

func (b volfsBackend) Query(_ context.Context, req []byte) ([]byte, error) { return b.fs.Query(req) }

// BenchmarkSnapshotStall measures what a volume's snapshot costs the other
// groups of its hosts. Three hosts on the OS filesystem: group 1 is a
// volume into which 1 MiB writes pass SnapshotBytes (128 MiB here), so
// that each host snapshots all of it once; group 2, a small KV, takes a
// proposal every 2 ms meanwhile. Reported: group 2's longest and 99th
// percentile proposal over the writes, and the writes' rate, with the
// snapshot written on the loop (background=false) and off it.
//
//	go test -run - -bench SnapshotStall -benchtime 3x ./pkg/raftgroup/
func BenchmarkSnapshotStall(b *testing.B) {
	const mib = 1 << 20
	const snapBytes = 128 * mib
	for _, bg := range []bool{false, true} {
		b.Run(fmt.Sprint("background=", bg), func(b *testing.B) {
			var worst, p99s, rates []float64
			for range b.N {
				dirs := []string{b.TempDir(), b.TempDir(), b.TempDir()}
				hosts, stop := rgt.StartOnDisk(b, dirs, 1, func(cfg *raftgroup.Config) {
					cfg.SnapshotBytes, cfg.BackgroundSnapshots = snapBytes, bg
				}, func(_ raftgroup.NodeID, g raftgroup.GroupID) raftgroup.StateMachine {
					if g == 1 {
						return volfs.New()
					}
					return rgt.NewKV()
				})
				rgt.CreateOn(b, hosts, 1)
				rgt.CreateOn(b, hosts, 2)
				vl, kl := rgt.LeaderOn(b, hosts, 1), rgt.LeaderOn(b, hosts, 2)
				ctx := context.Background()
				propose := func(h *raftgroup.Host, g raftgroup.GroupID, data []byte) []byte {
					_, res, err := h.Propose(ctx, g, data)
					if err != nil {
						b.Fatal(err)
					}
					return res
				}
				propose(vl, 1, (&volfs.Op{Kind: volfs.KindSetLimit, Size: 4 * snapBytes}).Encode())
				r, _ := volfs.DecodeResult(propose(vl, 1, (&volfs.Op{Kind: volfs.KindCreate, Parent: volfs.RootIno, Name: "f", Mode: 0o644}).Encode()))
				var lats []time.Duration
				done := make(chan struct{})
				probed := make(chan struct{})
				go func() {
					defer close(probed)
					for i := 0; ; i++ {
						select {
						case <-done:
							return
						case <-time.After(2 * time.Millisecond):
						}
						t0 := time.Now()
						if _, _, err := kl.Propose(ctx, 2, put(fmt.Sprint("k", i%16), "v")); err != nil {
							b.Error(err)
							return
						}
						lats = append(lats, time.Since(t0))
					}
				}()
				taken := func() (n uint64) {
					for _, h := range hosts {
						n += h.Stats().SnapshotsTaken
					}
					return n
				}
				before := taken()
				data := make([]byte, mib)
				t0 := time.Now()
				written := 0
				for i := 0; taken() < before+3; i++ {
					if i > 2*snapBytes/mib {
						b.Fatalf("no snapshot after %d MiB: %d taken", i, taken()-before)
					}
					data[0] = byte(i)
					propose(vl, 1, (&volfs.Op{Kind: volfs.KindWrite, Ino: r.Attr.Ino, Offset: uint64(i * mib), Data: data}).Encode())
					written += mib
				}
				rates = append(rates, float64(written)/1e6/time.Since(t0).Seconds())
				close(done)
				<-probed
				stop()
				slices.Sort(lats)
				worst = append(worst, float64(lats[len(lats)-1])/1e6)
				p99s = append(p99s, float64(lats[len(lats)*99/100])/1e6)
			}
			b.ReportMetric(median(worst), "max-ms")
			b.ReportMetric(median(p99s), "p99-ms")
			b.ReportMetric(median(rates), "MB/s")
			b.ReportMetric(0, "ns/op")
		})
	}
}

func median(xs []float64) float64 {
	slices.Sort(xs)
	return xs[len(xs)/2]
}
