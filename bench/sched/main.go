// Command sched measures placement throughput of pkg/sched: a simulated
// cluster (pkg/sched/sim) of -nodes nodes in one process places -replicas
// replicas spread over -services services through the real protocol: each
// service's owner chosen by rendezvous hashing over the live nodes,
// sched.Reconcile deciding, Reserve calls delivered after -rpc-delay to the
// target's real sched.Ledger (retrying the next candidate on a reject),
// slot and task documents merged as CRDTs, sched.AgentDecide starting each
// task in a fake runtime. It prints a Markdown section on stdout
// (docs/BENCHMARKS.md style).
//
// Placements/s is replicas divided by the wall time until every slot names
// a running task. The simulator is one goroutine in virtual time, so this
// is the CPU cost of the whole cluster's scheduling on one core, not a
// latency; the virtual time to converge is printed beside it. The baseline
// is a central scheduler with perfect knowledge placing the same replicas
// with the same sched.Place, no protocol at all, measured in the same run.
package main

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/shoal-dev/shoal/pkg/sched"
	"github.com/shoal-dev/shoal/pkg/sched/sim"
)

func main() {
	nodes := flag.Int("nodes", 100, "simulated nodes")
	services := flag.Int("services", 100, "services")
	replicas := flag.Int("replicas", 10000, "replicas in total, split evenly over the services")
	runs := flag.Int("runs", 3, "runs (the table shows the median)")
	rpcDelay := flag.Duration("rpc-delay", time.Millisecond, "one-way delay of a Reserve call (virtual)")
	lag := flag.Duration("lag", 200*time.Millisecond, "gossip lag of every node's view of others' writes (virtual)")
	tick := flag.Duration("tick", 100*time.Millisecond, "how often nodes run their agent and reconcile (virtual)")
	load := flag.Float64("load", 0.75, "requested CPU as a fraction of the cluster's CPU")
	observe := flag.Duration("observe", time.Second, "how long owners trust the free capacity in Reserve answers (0: not at all)")
	seed := flag.Uint64("seed", 1, "random seed (node sizes, service sizes, task IDs)")
	flag.Parse()
	if *services <= 0 || *replicas < *services || *nodes <= 0 {
		fail("need nodes > 0 and replicas >= services > 0")
	}

	w := newWorkload(*nodes, *services, *replicas, *load, *seed)
	fmt.Printf("## Scheduling (pkg/sched)\n\n")
	fmt.Printf("Machine: %d CPUs, %s/%s, %s. One process, one goroutine, virtual time (pkg/sched/sim): %d nodes, %d services × %d replicas (%d), Reserve one-way delay %v, gossip lag %v, tick %v, owners trust Reserve answers' free capacity for %v. Node sizes 8/16/32 CPU with 2 GiB per CPU; tasks ask 100m–1 CPU and 64–1024 MiB, %.0f%% of the cluster's CPU in total, services alternate spread and binpack. Placements/s is replicas ÷ wall time until every slot names a running task: the CPU cost of the whole cluster's scheduling on one core. Baseline: a central scheduler with perfect knowledge placing the same replicas with the same `sched.Place` (no ownership, reservations, documents or agents). Median of %d runs, range in brackets.\n\n",
		runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version(), *nodes, *services, *replicas / *services, w.total(), *rpcDelay, *lag, *tick, *observe, 100**load, *runs)

	var wall, base, virt []time.Duration
	var last result
	for i := range *runs {
		r := w.run(*rpcDelay, *lag, *tick, *observe, *seed+uint64(i))
		wall, virt = append(wall, r.wall), append(virt, r.virtual)
		base = append(base, w.baseline())
		last = r
		fmt.Fprintf(os.Stderr, "bench/sched: run %d: %v wall, %v virtual, %d rejects\n", i+1, r.wall, r.virtual, r.stats.Rejects)
	}
	n := w.total()
	fmt.Printf("| nodes | services | replicas | wall time | placements/s | baseline placements/s | protocol ÷ baseline | virtual time to converge | Reserve calls | rejects | retries | unschedulable | max node CPU | max node memory | mean node CPU |\n")
	fmt.Printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	fmt.Printf("| %d | %d | %d | %s | %s | %s | %.2f | %s | %d | %d | %d | %d | %.0f%% | %.0f%% | %.0f%% |\n\n",
		*nodes, *services, n, durs(wall), rate(n, median(wall)), rate(n, median(base)),
		float64(median(base))/float64(median(wall)), median(virt).Round(time.Millisecond),
		last.stats.Calls, last.stats.Rejects, last.stats.Retries, last.stats.Unschedulable,
		100*last.maxCPU, 100*last.maxMem, 100*last.meanCPU)
	fmt.Printf("Counters are from the last run. Rejects are Reserve calls a node's ledger refused because owners placed on stale usage at the same moment; each was retried on the owner's next candidate. Unschedulable counts Reserves that ran out of candidates (re-placed on the next reconcile).\n\n")
}

// workload is the cluster and services of one benchmark, identical in
// every run.
type workload struct {
	nodes    []sim.NodeConfig
	services []sched.ServiceSpec
}

func newWorkload(nodes, services, replicas int, load float64, seed uint64) *workload {
	rng := rand.New(rand.NewPCG(seed, 0xbe7c4))
	w := &workload{}
	var cpu int64
	for i := range nodes {
		c := []int64{8, 16, 32}[rng.IntN(3)]
		w.nodes = append(w.nodes, sim.NodeConfig{
			ID:       fmt.Sprintf("n%03d", i+1),
			Capacity: sched.Resources{CPUMillis: c * 1000, MemoryBytes: c * 2 << 30},
		})
		cpu += c * 1000
	}
	// Task sizes are drawn, then scaled so the total is load × capacity.
	per := replicas / services
	sizes := make([]float64, services)
	var sum float64
	for i := range sizes {
		sizes[i] = 0.1 + 0.9*rng.Float64()
		sum += sizes[i] * float64(per)
	}
	scale := load * float64(cpu) / 1000 / sum
	for i := range services {
		st := sched.Spread
		if i%2 == 1 {
			st = sched.Binpack
		}
		c := int64(sizes[i]*scale*1000) / 10 * 10
		w.services = append(w.services, sched.ServiceSpec{
			Name: fmt.Sprintf("svc-%03d", i), Image: "app", Replicas: per,
			CPUMillis: max(c, 10), MemoryBytes: max(64, min(1024, c*2*1024/1000)) << 20,
			Placement: st,
		})
	}
	return w
}

func (w *workload) total() int {
	n := 0
	for _, s := range w.services {
		n += s.Replicas
	}
	return n
}

type result struct {
	wall, virtual           time.Duration
	stats                   sim.Stats
	maxCPU, maxMem, meanCPU float64
}

func (w *workload) run(rpcDelay, lag, tick, observe time.Duration, seed uint64) result {
	if observe == 0 {
		observe = -1 // sim: never
	}
	c := sim.New(sim.Config{Nodes: w.nodes, Seed: seed, RPCDelay: rpcDelay, GossipLag: lag, Tick: tick, ObservationAge: observe})
	for _, s := range w.services {
		if err := c.CreateService(s); err != nil {
			fail("create %s: %v", s.Name, err)
		}
	}
	runtime.GC()
	start, vstart := time.Now(), c.Now()
	if !c.RunUntil(c.AllSettled, 10*time.Minute) {
		fail("the cluster did not converge in 10 virtual minutes; unschedulable: %v", firstN(c.LastUnschedulable, 3))
	}
	r := result{wall: time.Since(start), virtual: c.Now().Sub(vstart), stats: c.Stats}
	if len(c.Violations) > 0 {
		fail("invariants broken: %s", strings.Join(c.Violations, "; "))
	}
	for _, id := range c.NodeIDs() {
		l := c.Node(id).Ledger
		u, capa := l.Usage(), l.Capacity()
		r.maxCPU = max(r.maxCPU, float64(u.CPUMillis)/float64(capa.CPUMillis))
		r.maxMem = max(r.maxMem, float64(u.MemoryBytes)/float64(capa.MemoryBytes))
		r.meanCPU += float64(u.CPUMillis) / float64(capa.CPUMillis) / float64(len(w.nodes))
	}
	return r
}

// baseline places every replica centrally, in one loop, with exact usage.
func (w *workload) baseline() time.Duration {
	nodes := make([]sched.Node, len(w.nodes))
	for i, nc := range w.nodes {
		nodes[i] = sched.Node{ID: nc.ID, Alive: true, Availability: sched.Active, Capacity: nc.Capacity}
	}
	runtime.GC()
	start := time.Now()
	usage := sched.Usage{}
	for _, s := range w.services {
		req, err := sched.NewRequest(s, "")
		if err != nil {
			fail("%v", err)
		}
		req.Tasks = map[string]int{}
		for slot := range s.Replicas {
			req.Slot = fmt.Sprint(slot)
			ranked, why := sched.Place(req, nodes, usage)
			if len(ranked) == 0 {
				fail("baseline: %s/%d unschedulable: %s", s.Name, slot, why)
			}
			u := usage[ranked[0]]
			u.Used = u.Used.Add(req.Resources)
			usage[ranked[0]] = u
			req.Tasks[ranked[0]]++
		}
	}
	return time.Since(start)
}

func firstN(m map[string]string, n int) []string {
	var out []string
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}) {
		if len(out) == n {
			break
		}
		out = append(out, k+": "+m[k])
	}
	return out
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func durs(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 1 {
		return fmtDur(s[0])
	}
	return fmt.Sprintf("%s [%s–%s]", fmtDur(median(s)), fmtDur(s[0]), fmtDur(s[len(s)-1]))
}

func fmtDur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
}

func rate(n int, d time.Duration) string {
	if d <= 0 {
		return "∞"
	}
	return fmt.Sprintf("%.0f", float64(n)/d.Seconds())
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench/sched: "+format+"\n", args...)
	os.Exit(1)
}
