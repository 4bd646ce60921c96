package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/shoal-dev/shoal/bench/internal/cpuacct"
)

// idleGoal is the goal for an idle vold: its share of one core.
const idleGoal = 2.0

type procSample struct {
	cpu   float64 // % of one core
	rssMB float64
}

type idleResult struct {
	volumes         int
	window          time.Duration
	vold, statd     []procSample
	groups, leading []float64 // from each vold's metrics
	awake, cacheMiB []float64 // groups not quiesced, their entry caches
	heapMiB         []float64 // Go heap in use, less the reserve's ballast
	gcs             []float64 // Go collections since the phase began (-1: unknown)
	releasedMiB     []float64 // heap the Go runtime returned to the kernel during the window
	reserveMiB      []float64 // heap reserved at start (resident from then on)
	load            phaseLoad
	quiesceWait     time.Duration
	quiesced        bool
}

// pids returns each node's pid of process name.
func (b *bench) pids(ctx context.Context, name string) []int {
	st, err := b.cl.Status(ctx)
	check(err)
	out := make([]int, nodes)
	for _, n := range st.Nodes {
		for _, p := range n.Processes {
			if p.Name == name {
				if !p.Running {
					fail("node %d: %s is not running", n.Node, name)
				}
				out[n.Node-1] = p.PID
			}
		}
	}
	return out
}

// cpuOver returns the CPU of each pid over d, as % of one core.
func cpuOver(ctx context.Context, pids []int, d time.Duration) ([]float64, time.Duration) {
	read := func() []uint64 {
		out := make([]uint64, len(pids))
		for i, pid := range pids {
			t, err := cpuacct.ProcTicks(pid)
			check(err)
			out[i] = t
		}
		return out
	}
	c0, t0 := read(), time.Now()
	if err := sleep(ctx, d); err != nil {
		fail("%v", err)
	}
	c1, w := read(), time.Since(t0)
	out := make([]float64, len(pids))
	for i := range pids {
		out[i] = float64(c1[i]-c0[i]) / cpuacct.ClockTicks / w.Seconds() * 100
	}
	return out, w
}

// measureIdle measures every vold's and statd's CPU over c.idleWindow and
// their RSS at the end. With quiesce, it first waits (up to
// c.quiesceMax) until every vold uses less than the goal over 3 s. The
// Go collections are counted from since, the volds' metrics when the
// phase began (nil: from the window's start).
func (b *bench) measureIdle(ctx context.Context, volumes int, quiesce bool, since []map[string]float64) idleResult {
	c := b.c
	r := idleResult{volumes: volumes}
	vold, statd := b.pids(ctx, "vold"), b.pids(ctx, "statd")
	if quiesce {
		t0 := time.Now()
		for time.Since(t0) < c.quiesceMax {
			cpu, _ := cpuOver(ctx, vold, 3*time.Second)
			progress("  vold CPU over 3 s: %.1f%% / %.1f%% / %.1f%% of a core", cpu[0], cpu[1], cpu[2])
			if max(cpu[0], cpu[1], cpu[2]) < idleGoal {
				r.quiesced = true
				break
			}
		}
		r.quiesceWait = time.Since(t0)
	}
	b.waitQuiet(ctx)
	atStart := b.allMetrics()
	if since == nil {
		since = atStart
	}
	l0 := b.acct.Take()
	cpu, w := cpuOver(ctx, append(vold, statd...), c.idleWindow)
	r.load = phaseLoad{cpuacct.Phase{A: l0, B: b.acct.Take()}}
	r.window = w
	for i, pid := range append(vold, statd...) {
		rss, err := cpuacct.RSSMiB(pid)
		check(err)
		s := procSample{cpu: cpu[i], rssMB: rss}
		if i < nodes {
			r.vold = append(r.vold, s)
		} else {
			r.statd = append(r.statd, s)
		}
	}
	for i, m := range b.allMetrics() {
		gcs := -1.0
		if n, ok := m["go_gc_duration_seconds_count"]; ok && i < len(since) && since[i] != nil {
			gcs = n - since[i]["go_gc_duration_seconds_count"]
		}
		r.gcs = append(r.gcs, gcs)
		rel := 0.0
		if i < len(atStart) && atStart[i] != nil {
			rel = (m["go_memstats_heap_released_bytes"] - atStart[i]["go_memstats_heap_released_bytes"]) / (1 << 20)
		}
		r.releasedMiB = append(r.releasedMiB, rel)
		r.groups = append(r.groups, m["groups"])
		r.leading = append(r.leading, m["groups_leading"])
		r.awake = append(r.awake, m["groups_awake"])
		r.cacheMiB = append(r.cacheMiB, m["raft_entry_cache_bytes"]/(1<<20))
		// The reserve's ballast counts as in use but is never touched.
		r.heapMiB = append(r.heapMiB, (m["go_memstats_heap_inuse_bytes"]-m["heap_reserve_bytes"])/(1<<20))
		r.reserveMiB = append(r.reserveMiB, m["heap_reserve_bytes"]/(1<<20))
	}
	progress("  vold CPU %.2f%% / %.2f%% / %.2f%%, RSS %.0f / %.0f / %.0f MiB",
		r.vold[0].cpu, r.vold[1].cpu, r.vold[2].cpu, r.vold[0].rssMB, r.vold[1].rssMB, r.vold[2].rssMB)
	if len(r.heapMiB) == nodes {
		progress("  vold Go heap in use %.0f / %.0f / %.0f MiB, groups awake %.0f / %.0f / %.0f, entry caches %.1f / %.1f / %.1f MiB",
			r.heapMiB[0], r.heapMiB[1], r.heapMiB[2], r.awake[0], r.awake[1], r.awake[2], r.cacheMiB[0], r.cacheMiB[1], r.cacheMiB[2])
	}
	return r
}

type createResult struct {
	n, failed int
	elapsed   time.Duration
	lat       []time.Duration
	firstErr  string
	load      phaseLoad
}

// createMany creates c.idleVols volumes of 3 replicas and 1 MiB through
// the three nodes' sockets in turn, c.createPar at a time.
func (b *bench) createMany(ctx context.Context) createResult {
	c := b.c
	r := createResult{n: c.idleVols}
	jobs := make(chan int)
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		done atomic.Int64
	)
	l0 := b.acct.Take()
	t0 := time.Now()
	for range c.createPar {
		wg.Go(func() {
			for k := range jobs {
				name := fmt.Sprintf("idle-%04d", k)
				node := 1 + k%nodes
				var err error
				s := time.Now()
				for attempt := range 3 {
					_, err = b.create(ctx, node, name, 3, 1<<20)
					if err == nil || ctx.Err() != nil {
						break
					}
					if attempt > 0 && (errors.Is(err, errdefs.ErrAlreadyExists) || status.Code(err) == codes.AlreadyExists) {
						// An earlier attempt made it after all.
						err = nil
						break
					}
				}
				d := time.Since(s)
				mu.Lock()
				if err != nil {
					r.failed++
					if r.firstErr == "" {
						r.firstErr = fmt.Sprintf("%s on node %d: %v", name, node, err)
						progress("  create %s", r.firstErr)
					}
				} else {
					r.lat = append(r.lat, d)
				}
				mu.Unlock()
				if n := done.Add(1); n%100 == 0 {
					progress("  %d of %d created (%v)", n, c.idleVols, time.Since(t0).Round(time.Second))
				}
			}
		})
	}
	for k := range c.idleVols {
		if ctx.Err() != nil {
			break
		}
		jobs <- k
	}
	close(jobs)
	wg.Wait()
	if ctx.Err() != nil {
		fail("%v", ctx.Err())
	}
	r.elapsed = time.Since(t0)
	r.load = phaseLoad{cpuacct.Phase{A: l0, B: b.acct.Take()}}
	return r
}
