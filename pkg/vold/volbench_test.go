package vold

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	"github.com/shoal-dev/shoal/pkg/volfs"
	"github.com/shoal-dev/shoal/pkg/volfuse"
)

// BenchmarkVolumeWrites measures a volume's write path in one process:
// three nodes with the real Raft transport (framed mutual TLS on
// loopback) and Pebble on disk, the volume mounted with volfuse on the
// group leader's node. It reports CPU time per MiB or per write (the
// whole process: all three nodes, the FUSE server and the writer's
// syscalls), which is steadier than throughput on a shared machine; run
// with -cpuprofile to see where it goes. bench/vold measures the same on
// real nodes.
func BenchmarkVolumeWrites(b *testing.B) {
	if _, err := os.Stat("/dev/fuse"); err != nil || os.Geteuid() != 0 {
		b.Skip("needs root and /dev/fuse")
	}
	const g = raftgroup.GroupID(1)
	peers := startClusterWith(b, clusterOpts{
		dir:   b.TempDir,
		newSM: func() raftgroup.StateMachine { return volfs.New() },
		tick:  100 * time.Millisecond,
	}, "a1", "b2", "c3")
	var members []raftgroup.Member
	for i, p := range peers {
		members = append(members, raftgroup.Member{Replica: raftgroup.ReplicaID(i + 1), Node: p.rid})
	}
	for i, p := range peers {
		if err := p.host.CreateGroup(g, raftgroup.ReplicaID(i+1), members); err != nil {
			b.Fatal(err)
		}
	}
	peers[0].host.Campaign(g)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if st, err := peers[0].host.Status(g); err == nil && st.Role == "leader" {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("no leader")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The leader's node mounts the volume, and a follower's: writes
	// through the second go to the leader as proposals and come back in
	// its appends.
	dir, fdir := mountGroup(b, peers[0].host, g), mountGroup(b, peers[1].host, g)
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(rand.Uint32())
	}
	for _, m := range []struct{ name, dir string }{{"seq", dir}, {"seq-follower", fdir}} {
		b.Run(m.name, func(b *testing.B) { seqWrites(b, filepath.Join(m.dir, "seq"), buf) })
	}

	b.Run("sync4k", func(b *testing.B) {
		const size = 16 << 20
		path := filepath.Join(dir, "rand")
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			b.Fatal(err)
		}
		for range size / len(buf) {
			if _, err := f.Write(buf); err != nil {
				b.Fatal(err)
			}
		}
		f.Close()
		f, err = os.OpenFile(path, os.O_WRONLY|syscall.O_DSYNC, 0)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		rng := rand.New(rand.NewPCG(1, 2))
		perWrite(b, peers, func() {
			for b.Loop() {
				if _, err := f.WriteAt(buf[:4096], rng.Int64N(size/4096)*4096); err != nil {
					b.Fatal(err)
				}
			}
		})
	})

	// Four writers at once, a file each: the leader should commit
	// together what is pending, so a write costs less than alone.
	b.Run("sync4k-4writers", func(b *testing.B) {
		const size, writers = 1 << 20, 4
		var files []*os.File
		for w := range writers {
			path := filepath.Join(dir, fmt.Sprintf("par-%d", w))
			if err := os.WriteFile(path, buf[:size], 0o644); err != nil {
				b.Fatal(err)
			}
			f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_DSYNC, 0)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			files = append(files, f)
		}
		b.ResetTimer()
		perWrite(b, peers, func() {
			var next atomic.Int64
			var wg sync.WaitGroup
			for w := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(w), 2))
					for next.Add(1) <= int64(b.N) {
						if _, err := files[w].WriteAt(buf[:4096], rng.Int64N(size/4096)*4096); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
		})
	})
}

// perWrite runs b.N writes and reports the process's CPU time and the
// hosts' batches sent, rounds, synced journal writes and journal writes
// per write.
func perWrite(b *testing.B, peers []*testPeer, writes func()) {
	batches0, rounds0, syncs0, commits0 := hostStats(peers)
	cpu0 := processCPU()
	writes()
	cpu := processCPU() - cpu0
	batches, rounds, syncs, commits := hostStats(peers)
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
	b.ReportMetric(float64(batches-batches0)/float64(b.N), "batches/op")
	b.ReportMetric(float64(rounds-rounds0)/float64(b.N), "rounds/op")
	b.ReportMetric(float64(syncs-syncs0)/float64(b.N), "syncs/op")
	b.ReportMetric(float64(commits-commits0)/float64(b.N), "commits/op")
}

// hostStats sums the hosts' batches sent, rounds, synced journal writes
// and journal writes.
func hostStats(peers []*testPeer) (batches, rounds, syncs, commits uint64) {
	for _, p := range peers {
		st := p.host.Stats()
		batches, rounds, syncs, commits = batches+st.BatchesSent, rounds+st.Rounds, syncs+st.Syncs, commits+st.Commits
	}
	return batches, rounds, syncs, commits
}

// processCPU is this process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// seqWrites writes 64 MiB files at path in 1 MiB writes with an fsync and
// reports CPU time per MiB.
func seqWrites(b *testing.B, path string, buf []byte) {
	const fileMiB = 64
	cpu0 := processCPU()
	for b.Loop() {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
		if err != nil {
			b.Fatal(err)
		}
		for range fileMiB {
			if _, err := f.Write(buf); err != nil {
				b.Fatal(err)
			}
		}
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
		if err := os.Remove(path); err != nil {
			b.Fatal(err)
		}
	}
	cpu := processCPU() - cpu0
	b.SetBytes(fileMiB << 20)
	b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N*fileMiB), "cpu-ms/MiB")
}

// mountGroup mounts group g of host on a new directory until b ends.
func mountGroup(b *testing.B, host *raftgroup.Host, g raftgroup.GroupID) string {
	dir := b.TempDir()
	srv, err := volfuse.Mount(dir, &volfs.Client{B: volfs.HostBackend{Host: host, Group: g}}, volfuse.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := srv.Unmount(); err != nil {
			b.Error(err)
		}
		srv.Wait()
	})
	return dir
}
