package volfs_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	rgt "github.com/shoal-dev/shoal/pkg/raftgroup/raftgrouptest"
	"github.com/shoal-dev/shoal/pkg/volfs"
	"github.com/shoal-dev/shoal/pkg/volfs/volfstest"
)

// TestRaftReplicas runs a volume on three raftgroup hosts: clients on
// every node write files, the leader crashes mid-workload, the survivors
// carry on, the crashed node comes back (catching up by snapshot, as the
// log is compacted meanwhile), and in the end every replica holds the
// same state — equal digests — and reads see every acknowledged write.
// The Background run has the snapshots forked and written off the loop.
func TestRaftReplicas(t *testing.T) {
	t.Run("OnLoop", func(t *testing.T) { testRaftReplicas(t, false) })
	t.Run("Background", func(t *testing.T) { testRaftReplicas(t, true) })
}

func testRaftReplicas(t *testing.T, background bool) {
	const g = raftgroup.GroupID(7)
	c := volfstest.NewCluster(t, rgt.Options{
		Seed: 3,
		Configure: func(cfg *raftgroup.Config) {
			cfg.SnapshotEntries = 30
			cfg.CompactionMargin = 5
			cfg.BackgroundSnapshots = background
		},
	}, g)
	ctx := context.Background()
	client := func(n raftgroup.NodeID) *volfs.Client {
		return &volfs.Client{B: &volfstest.ClusterBackend{C: c, Node: n, Group: g}}
	}
	want := map[string][]byte{} // path in /data → content
	dir, err := client(1).Mkdir(ctx, volfs.RootIno, "data", 0o755, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := client(2).SetLimit(ctx, 1<<20); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	work := func(nodes []raftgroup.NodeID, from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			cl := client(nodes[i%len(nodes)])
			name := fmt.Sprintf("f%03d", i%40)
			a, err := cl.Create(ctx, dir.Ino, name, 0o644, 0, 0, 0)
			if err != nil {
				t.Fatalf("create %s: %v", name, err)
			}
			data := make([]byte, 1+rng.IntN(3000))
			for j := range data {
				data[j] = byte(rng.Uint32())
			}
			if _, err := cl.Setattr(ctx, a.Ino, volfs.SetAttr{Valid: volfs.SetSize}); err != nil {
				t.Fatal(err)
			}
			if _, err := cl.Write(ctx, a.Ino, 0, data, false); err != nil {
				t.Fatalf("write %s: %v", name, err)
			}
			want[name] = data
			if i%7 == 3 {
				// A read on another node sees the write at once.
				other := client(nodes[(i+1)%len(nodes)])
				got, err := other.Read(ctx, a.Ino, 0, len(data)+10)
				if err != nil || !bytes.Equal(got, data) {
					t.Fatalf("read %s on another node: %d bytes, %v", name, len(got), err)
				}
			}
			if i%11 == 5 {
				old := fmt.Sprintf("f%03d", (i+13)%40)
				if _, ok := want[old]; ok {
					if err := cl.Rename(ctx, dir.Ino, old, dir.Ino, name, 0); err != nil {
						t.Fatalf("rename: %v", err)
					}
					want[name] = want[old]
					delete(want, old)
				}
			}
		}
	}
	work([]raftgroup.NodeID{1, 2, 3}, 0, 40)
	leader := c.WaitLeader(g, 200)
	t.Logf("crashing leader node %d", leader)
	c.Crash(leader)
	var rest []raftgroup.NodeID
	for _, n := range c.NodeIDs() {
		if n != leader {
			rest = append(rest, n)
		}
	}
	work(rest, 40, 120)
	c.Restart(leader)
	work(c.NodeIDs(), 120, 140)

	// Every replica converges on one state.
	var digest [32]byte
	ok := c.RunUntil(500, func() bool {
		var applied uint64
		for i, n := range c.NodeIDs() {
			st, err := c.Host(n).Status(g)
			if err != nil {
				return false
			}
			d := c.SM(n, g).(*volfs.FS).Digest()
			if i == 0 {
				applied, digest = st.Applied, d
			} else if st.Applied != applied || d != digest {
				return false
			}
		}
		return true
	})
	if !ok {
		t.Fatalf("replicas did not converge\n%s", c.String(g))
	}
	var bg uint64
	for _, n := range c.NodeIDs() {
		if err := c.SM(n, g).(*volfs.FS).CheckInvariants(); err != nil {
			t.Fatalf("node %d: %v", n, err)
		}
		bg += c.Host(n).Stats().BackgroundSnapshots
	}
	if background && bg == 0 {
		t.Fatal("no snapshot was written off the loop")
	}
	// The restarted node serves every acknowledged write.
	cl := client(leader)
	ents, err := cl.Readdir(ctx, dir.Ino)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != len(want) {
		t.Fatalf("restarted node lists %d files, want %d", len(ents), len(want))
	}
	for _, e := range ents {
		got, err := cl.Read(ctx, e.Ino, 0, 1<<20)
		if err != nil || !bytes.Equal(got, want[e.Name]) {
			t.Fatalf("restarted node: %s differs (%v)", e.Name, err)
		}
	}
	if d, err := cl.Digest(ctx); err != nil || d != digest {
		t.Fatalf("digest query: %v", err)
	}
	sent := uint64(0)
	for _, n := range c.NodeIDs() {
		sent += c.Host(n).Stats().SnapshotsSent
	}
	if sent == 0 {
		t.Error("the restarted node caught up without a snapshot: the test misses that path")
	}
}
