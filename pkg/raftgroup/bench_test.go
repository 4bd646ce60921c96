package raftgroup_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	rgt "github.com/shoal-dev/shoal/pkg/raftgroup/raftgrouptest"
)

// realCluster runs n hosts with Run over an immediate in-memory network.
type realCluster struct {
	hosts []*raftgroup.Host
	stop  func()
}

func startReal(tb testing.TB, n int, fs func() vfs.FS, newSM func() raftgroup.StateMachine) *realCluster {
	net := rgt.NewNetwork(rand.New(rand.NewPCG(1, 2)))
	net.Immediate = true
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	rc := &realCluster{}
	for i := 1; i <= n; i++ {
		id := raftgroup.NodeID(i)
		h, err := raftgroup.Open(raftgroup.Config{
			NodeID:          id,
			Dir:             tb.TempDir(),
			FS:              fs(),
			Transport:       net.Transport(id),
			NewStateMachine: func(raftgroup.GroupID) raftgroup.StateMachine { return newSM() },
		})
		if err != nil {
			tb.Fatal(err)
		}
		net.Attach(id, h)
		rc.hosts = append(rc.hosts, h)
		wg.Add(1)
		go func() { defer wg.Done(); _ = h.Run(ctx) }()
	}
	rc.stop = func() {
		cancel()
		wg.Wait()
		for _, h := range rc.hosts {
			h.Close()
		}
	}
	tb.Cleanup(rc.stop)
	return rc
}

func (rc *realCluster) createGroups(tb testing.TB, groups int) {
	members := make([]raftgroup.Member, len(rc.hosts))
	for i := range rc.hosts {
		members[i] = raftgroup.Member{Replica: raftgroup.ReplicaID(i + 1), Node: raftgroup.NodeID(i + 1)}
	}
	for g := raftgroup.GroupID(1); g <= raftgroup.GroupID(groups); g++ {
		for i, h := range rc.hosts {
			if err := h.CreateGroup(g, raftgroup.ReplicaID(i+1), members); err != nil {
				tb.Fatal(err)
			}
		}
		rc.hosts[int(g)%len(rc.hosts)].Campaign(g)
	}
}

// leaderOf waits for group g's leader.
func (rc *realCluster) leaderOf(tb testing.TB, g raftgroup.GroupID) *raftgroup.Host {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		for _, h := range rc.hosts {
			if st, err := h.Status(g); err == nil && st.Role == "leader" {
				return h
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	tb.Fatalf("group %d: no leader", g)
	return nil
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkIdleGroups measures the CPU of 1,000 idle (quiesced) groups on
// three hosts in one process (real 100 ms ticks, on-disk Pebble): the
// issue's goal is at most 2% of a core per node.
func BenchmarkIdleGroups(b *testing.B) {
	const groups = 1000
	rc := startReal(b, 3, func() vfs.FS { return vfs.Default }, func() raftgroup.StateMachine { return rgt.NewKV() })
	rc.createGroups(b, groups)
	ctx := context.Background()
	for g := raftgroup.GroupID(1); g <= groups; g++ {
		if _, _, err := rc.leaderOf(b, g).Propose(ctx, g, put("k", "v")); err != nil {
			b.Fatal(err)
		}
	}
	// Let them quiesce.
	deadline := time.Now().Add(30 * time.Second)
	for {
		quiet := 0
		for _, h := range rc.hosts {
			for g := raftgroup.GroupID(1); g <= groups; g++ {
				if st, _ := h.Status(g); st.Quiesced {
					quiet++
				}
			}
		}
		if quiet == 3*groups {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d replicas quiesced", quiet, 3*groups)
		}
		time.Sleep(100 * time.Millisecond)
	}
	b.ResetTimer()
	window := 3 * time.Second
	for range b.N {
		before, start := cpuTime(), time.Now()
		time.Sleep(window)
		used, wall := cpuTime()-before, time.Since(start)
		b.ReportMetric(100*float64(used)/float64(wall)/3, "%core/node")
	}
}

// BenchmarkSet measures typed Set (returns once a quorum applied) with 1
// and 64 concurrent clients on one group of three hosts (on-disk Pebble,
// immediate in-memory network).
func BenchmarkSet(b *testing.B) {
	for _, clients := range []int{1, 64} {
		b.Run(fmt.Sprint("clients=", clients), func(b *testing.B) {
			reg := raftgroup.NewRegistry()
			_ = reg.Register(&KV{})
			rc := startReal(b, 3, func() vfs.FS { return vfs.Default }, func() raftgroup.StateMachine {
				sm := raftgroup.NewTyped(reg)
				sm.Use(&db{m: map[string]string{}})
				return sm
			})
			rc.createGroups(b, 1)
			l := rc.leaderOf(b, 1)
			ctx := context.Background()
			var (
				mu   sync.Mutex
				lats []time.Duration
				next int
			)
			b.ResetTimer()
			var wg sync.WaitGroup
			for c := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						mu.Lock()
						if next >= b.N {
							mu.Unlock()
							return
						}
						i := next
						next++
						mu.Unlock()
						start := time.Now()
						if err := l.Set(ctx, 1, &KV{Key: fmt.Sprint(c, "-", i), Val: "v"}); err != nil {
							b.Error(err)
							return
						}
						d := time.Since(start)
						mu.Lock()
						lats = append(lats, d)
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			slices.Sort(lats)
			if len(lats) > 0 {
				b.ReportMetric(float64(lats[len(lats)*99/100].Microseconds()), "p99-µs")
			}
		})
	}
}
