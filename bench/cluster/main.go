// Command cluster measures a real Shoal cluster: shoal-statd on N nodes
// (network namespaces on one machine, pkg/devcluster), bootstrapped with
// cluster init and join, driven from the host through each node's statd
// socket. It prints a Markdown section on stdout (docs/BENCHMARKS.md
// style):
//
//   - convergence: writes on random nodes, timed until every node's watch
//     delivers them, against the durable local write and the writer's own
//     watch measured in the same run and the Serf gossip model;
//   - failure detection: a statd killed with SIGKILL, timed until every
//     other node reports it dead, then restarted and timed until every
//     node reports it alive again;
//   - idle cost: CPU and RSS of each statd with the cluster idle, against
//     a statd on the same node that is not in a cluster.
//
// It needs root and the binaries of `make build`. The cluster is torn down
// at the end, on failure and on SIGINT, SIGTERM or SIGHUP. BENCH_QUICK=1
// in the environment scales the defaults down (bench/run.sh).
package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/shoal-dev/shoal/bench/internal/cpuacct"
	"github.com/shoal-dev/shoal/pkg/client"
	"github.com/shoal-dev/shoal/pkg/devcluster"
	"github.com/shoal-dev/shoal/pkg/gossip"
	"github.com/shoal-dev/shoal/pkg/member"
	clusterv1 "github.com/shoal-dev/shoal/proto/shoal/cluster/v1"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

type config struct {
	bin      string
	nodes    int
	writes   int
	timeout  time.Duration
	kills    int
	idle     time.Duration
	settle   time.Duration
	baseline bool
	verbose  bool
	quiet    time.Duration
}

func main() {
	quick := os.Getenv("BENCH_QUICK") == "1"
	var c config
	defWrites, defKills, defIdle := 200, 3, 10*time.Second
	if quick {
		defWrites, defKills, defIdle = 50, 1, 5*time.Second
	}
	flag.StringVar(&c.bin, "bin", "bin", "directory with shoal-statd and shoalctl (make build)")
	flag.IntVar(&c.nodes, "nodes", 5, "nodes in the cluster")
	flag.IntVar(&c.writes, "writes", defWrites, "writes timed for convergence")
	flag.DurationVar(&c.timeout, "timeout", 15*time.Second, "give up on a write, a death or a return after this long")
	flag.IntVar(&c.kills, "kills", defKills, "kill-and-restart cycles for failure detection")
	flag.DurationVar(&c.idle, "idle", defIdle, "length of the idle measurement")
	flag.DurationVar(&c.settle, "settle", 5*time.Second, "wait after the cluster formed (and after each restart) before measuring")
	flag.BoolVar(&c.baseline, "baseline", true, "run a statd outside the cluster on every node as the idle baseline")
	flag.BoolVar(&c.verbose, "v", false, "print devcluster progress on stderr")
	flag.DurationVar(&c.quiet, "quiet-wait", 10*time.Second, "before the idle and convergence measurements, wait up to this long for other processes to use less than 0.25 CPUs")
	seed := flag.Uint64("seed", 1, "random seed of the workload")
	flag.Parse()
	if c.nodes < 3 || c.writes < 1 || c.kills < 0 || c.idle <= 0 {
		fail("-nodes must be at least 3, -writes and -idle positive")
	}

	fmt.Printf("## Cluster of %d real nodes (shoal-statd in network namespaces)\n\n", c.nodes)
	if os.Geteuid() != 0 {
		fmt.Printf("Skipped: this benchmark needs root (it creates network namespaces, a bridge and veth pairs).\n\n")
		fmt.Fprintf(os.Stderr, "cluster bench: not root, skipped\n")
		return
	}
	bin, err := filepath.Abs(c.bin)
	check(err)
	c.bin = bin
	for _, b := range []string{"shoal-statd", "shoalctl"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			fail("%v (run make build first, or pass -bin)", err)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mainDone := make(chan struct{})
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		s := <-sigs
		fmt.Fprintf(os.Stderr, "cluster bench: %v, tearing the cluster down\n", s)
		cancel()
		// Give the main goroutine a moment to stop and tear down (Up tears
		// down by itself when its context ends); then do it here.
		select {
		case <-mainDone:
		case <-time.After(3 * time.Second):
		}
		runCleanup()
		os.Exit(1)
	}()

	rng := rand.New(rand.NewPCG(*seed, 0xc105e))
	name := fmt.Sprintf("bc%d", rand.IntN(1_000_000))
	var cmu sync.Mutex
	var cl *devcluster.Cluster
	atCleanup(func() {
		dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
		defer dcancel()
		cmu.Lock()
		cur := cl
		cmu.Unlock()
		if cur != nil {
			if err := cur.Down(dctx); err != nil {
				fmt.Fprintf(os.Stderr, "cluster bench: %v\n", err)
			}
		}
		// Whatever an interrupted Up or Down left under the default roots.
		if found, err := devcluster.Purge(dctx, name); err != nil {
			fmt.Fprintf(os.Stderr, "cluster bench: purge %s: %v\n", name, err)
		} else if found {
			fmt.Fprintf(os.Stderr, "cluster bench: purged what was left of %s\n", name)
		}
	})

	r := run(ctx, c, name, rng, func(x *devcluster.Cluster) { cmu.Lock(); cl = x; cmu.Unlock() })
	runCleanup()
	close(mainDone)
	r.print(c)
}

// results holds everything measured; print writes the Markdown.
type results struct {
	name, subnet, version string
	up                    time.Duration
	conv                  convResult
	kills                 []killResult
	idle                  idleResult
}

func run(ctx context.Context, c config, name string, rng *rand.Rand, setCluster func(*devcluster.Cluster)) *results {
	spec := devcluster.Spec{
		Name:      name,
		Nodes:     c.nodes,
		Subnet:    devcluster.AutoSubnet,
		BinDir:    c.bin,
		Daemons:   []string{"statd"},
		Args:      map[string][]string{"statd": {"--node-name", "n{node}"}},
		Bootstrap: true,
	}
	if c.verbose {
		spec.Logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, "devcluster: "+format+"\n", args...) }
	}
	if c.baseline {
		// The same binary on the same node, never initialised: no peer
		// port, no membership, no gossip.
		spec.Extra = []devcluster.ProcessSpec{{
			Name: "solo",
			Path: "shoal-statd",
			Args: []string{"--state-dir", "{nodedir}/solo/state", "--run-dir", "{nodedir}/solo",
				"--metrics-addr", "", "--config", "", "--node-name", "solo{node}"},
			ReadySocket: "{nodedir}/solo/statd.sock",
			ReadyHealth: true,
		}}
	}
	progress("starting %d nodes (cluster %s)", c.nodes, name)
	start := time.Now()
	cl, err := devcluster.Up(ctx, spec)
	check(err)
	setCluster(cl)
	r := &results{name: name, subnet: cl.Subnet().String(), up: time.Since(start)}

	cls := make([]*client.Statd, c.nodes)
	for i := range cls {
		cls[i], err = client.NewStatd(cl.RunDir(i+1), client.Retry{Attempts: 3})
		check(err)
		defer cls[i].Close()
	}
	ids := make([]string, c.nodes)
	for i, x := range cls {
		st, err := status(ctx, x)
		check(err)
		ids[i] = st.GetNodeId()
	}
	if out, _, code, err := cl.Exec(ctx, 1, []string{filepath.Join(c.bin, "shoal-statd"), "--version"}, nil); err == nil && code == 0 {
		r.version = strings.TrimSpace(out)
	}
	progress("waiting until every node sees every node alive")
	check(waitStates(ctx, cls, ids, nil, "alive", time.Minute))
	sleep(ctx, c.settle)

	pids := clusterPids(ctx, cl)
	progress("idle: %v", c.idle)
	r.idle = measureIdle(ctx, c, cl, cls, pids)
	progress("convergence: %d writes", c.writes)
	r.conv = measureConvergence(ctx, c, cls, rng, pids)
	for k := range c.kills {
		victim := c.nodes - k%(c.nodes-1)
		progress("failure detection %d of %d: node %d", k+1, c.kills, victim)
		r.kills = append(r.kills, measureKill(ctx, c, cl, cls, ids, victim))
	}
	return r
}

// ---- convergence ----

// tracker records when each node's watch first delivers the key being
// timed.
type tracker struct {
	mu   sync.Mutex
	key  string
	t0   time.Time
	at   []time.Duration // -1: not yet
	got  int
	done chan struct{}
}

func (t *tracker) begin(key string, n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.key, t.got, t.done = key, 0, make(chan struct{})
	t.at = slices.Repeat([]time.Duration{-1}, n)
	t.t0 = time.Now()
}

func (t *tracker) arrive(key string, node int, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if key != t.key || t.at[node] >= 0 {
		return
	}
	t.at[node] = now.Sub(t.t0)
	t.got++
	if t.got == len(t.at) {
		close(t.done)
	}
}

func (t *tracker) result() []time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.key = ""
	return slices.Clone(t.at)
}

type convResult struct {
	ack, own, first, all []time.Duration
	missed               int
	background           float64 // CPUs other processes used meanwhile
}

func measureConvergence(ctx context.Context, c config, cls []*client.Statd, rng *rand.Rand, pids []int) (r convResult) {
	wctx, wcancel := context.WithCancel(ctx)
	tr := &tracker{}
	ready := make(chan int, len(cls))
	var wg sync.WaitGroup
	defer wg.Wait()
	defer wcancel()
	for i, x := range cls {
		wg.Go(func() {
			first := true
			err := x.Watch(wctx, "/bench/", client.FromNow, func(resp *statev1.WatchResponse) error {
				now := time.Now()
				if first {
					first = false
					ready <- i
				}
				for _, e := range resp.GetEvents() {
					tr.arrive(e.GetDocument().GetKey(), i, now)
				}
				return nil
			})
			if err != nil && wctx.Err() == nil {
				fmt.Fprintf(os.Stderr, "cluster bench: watch on node %d: %v\n", i+1, err)
			}
		})
	}
	for range cls {
		select {
		case <-ready:
		case <-time.After(c.timeout):
			fail("watches did not start within %v", c.timeout)
		case <-ctx.Done():
			fail("%v", ctx.Err())
		}
	}
	value := strings.Repeat("x", 100)
	waitQuiet(ctx, pids, c.quiet)
	load0 := takeLoad(pids)
	defer func() { r.background = load0.others(takeLoad(pids)) }()
	for w := range c.writes {
		node := rng.IntN(len(cls))
		key := fmt.Sprintf("/bench/conv/%04d", w)
		tr.begin(key, len(cls))
		_, err := cls[node].Put(ctx, &statev1.PutRequest{Key: key, Fields: map[string]*statev1.Value{
			"v": {Kind: &statev1.Value_StringValue{StringValue: value}},
		}})
		ack := time.Since(tr.t0)
		check(err)
		select {
		case <-tr.done:
		case <-time.After(c.timeout):
		case <-ctx.Done():
			fail("%v", ctx.Err())
		}
		at := tr.result()
		r.ack = append(r.ack, ack)
		if at[node] >= 0 {
			r.own = append(r.own, at[node])
		}
		first, all := time.Duration(math.MaxInt64), time.Duration(0)
		complete := true
		for i, d := range at {
			if d < 0 {
				complete = false
				continue
			}
			all = max(all, d)
			if i != node {
				first = min(first, d)
			}
		}
		if first != math.MaxInt64 {
			r.first = append(r.first, first)
		}
		if complete {
			r.all = append(r.all, all)
		} else {
			r.missed++
			fmt.Fprintf(os.Stderr, "cluster bench: write %d not on every node after %v\n", w, c.timeout)
		}
		sleep(ctx, time.Duration(rng.Int64N(int64(100*time.Millisecond))))
	}
	return r
}

// ---- failure detection ----

type killResult struct {
	node            int
	suspect, dead   time.Duration // until every other node reports it so
	deadFirst       time.Duration // until the first other node reports it dead
	ready, alive    time.Duration // restart: until statd serves; until every other node reports it alive (from the restart)
	deadOK, aliveOK bool
}

func status(ctx context.Context, x *client.Statd) (*clusterv1.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return x.Cluster.Status(ctx, &clusterv1.StatusRequest{})
}

func stateOf(st *clusterv1.StatusResponse, id string) string {
	for _, m := range st.GetMembers() {
		if m.GetId() == id {
			return m.GetState()
		}
	}
	return "absent"
}

// waitStates waits until every observer (nil: every node) reports every
// member in ids in state want.
func waitStates(ctx context.Context, cls []*client.Statd, ids []string, observers []int, want string, timeout time.Duration) error {
	if observers == nil {
		for i := range cls {
			observers = append(observers, i)
		}
	}
	deadline := time.Now().Add(timeout)
	for {
		ok := true
		for _, o := range observers {
			st, err := status(ctx, cls[o])
			if err != nil {
				ok = false
				break
			}
			for _, id := range ids {
				if stateOf(st, id) != want {
					ok = false
				}
			}
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not every node reports every member %s after %v", want, timeout)
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

// watchState polls every observer until each reports id in one of the
// states in want, and returns when each first did (from t0), or false on
// timeout.
func watchState(ctx context.Context, cls []*client.Statd, observers []int, id string, want []string, t0 time.Time, timeout time.Duration) ([]time.Duration, bool) {
	at := make([]time.Duration, len(observers))
	var wg sync.WaitGroup
	okAll := true
	var mu sync.Mutex
	for k, o := range observers {
		wg.Go(func() {
			for time.Since(t0) < timeout && ctx.Err() == nil {
				if st, err := status(ctx, cls[o]); err == nil && slices.Contains(want, stateOf(st, id)) {
					at[k] = time.Since(t0)
					return
				}
				sleep(ctx, 25*time.Millisecond)
			}
			mu.Lock()
			okAll = false
			mu.Unlock()
		})
	}
	wg.Wait()
	return at, okAll
}

func measureKill(ctx context.Context, c config, cl *devcluster.Cluster, cls []*client.Statd, ids []string, victim int) killResult {
	r := killResult{node: victim}
	id := ids[victim-1]
	var observers []int
	for i := range cls {
		if i != victim-1 {
			observers = append(observers, i)
		}
	}
	check(waitStates(ctx, cls, ids, nil, "alive", time.Minute))
	sleep(ctx, c.settle)

	t0 := time.Now()
	check(cl.Kill(ctx, victim, "statd"))
	// Suspect or worse, and dead, are watched together from the kill.
	var suspect, dead []time.Duration
	var okS, okD bool
	var wg sync.WaitGroup
	wg.Go(func() { suspect, okS = watchState(ctx, cls, observers, id, []string{"suspect", "dead"}, t0, c.timeout) })
	wg.Go(func() { dead, okD = watchState(ctx, cls, observers, id, []string{"dead"}, t0, c.timeout) })
	wg.Wait()
	r.deadOK = okS && okD
	r.suspect, r.dead, r.deadFirst = slices.Max(suspect), slices.Max(dead), slices.Min(dead)

	t1 := time.Now()
	check(cl.Start(ctx, victim, "statd"))
	r.ready = time.Since(t1)
	alive, ok := watchState(ctx, cls, observers, id, []string{"alive"}, t1, c.timeout)
	r.alive, r.aliveOK = slices.Max(alive), ok
	return r
}

// ---- idle cost ----

type procSample struct {
	cpu   float64 // % of one core
	rssMB float64
}

type idleResult struct {
	window     time.Duration
	background float64 // CPUs other processes used meanwhile
	statd      []procSample
	solo       []procSample
	probes     []float64 // per node, probes sent per second
	rounds     []float64 // anti-entropy rounds started per second
	syncBps    []float64 // sync bytes counted per second
	wireBps    []float64 // bytes per second on the node's eth0, in + out
	wirePps    []float64 // packets per second on the node's eth0, in + out
}

// ifaceCounters returns the bytes and packets, received plus sent, of the
// interface eth0 in the network namespace of process pid.
func ifaceCounters(pid int) (bytes, packets uint64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/dev", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(name) != "eth0" {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 10 {
			break
		}
		// rx bytes, packets ... (8 fields), tx bytes, packets ...
		for _, i := range []int{0, 8} {
			v, _ := strconv.ParseUint(f[i], 10, 64)
			bytes += v
			v, _ = strconv.ParseUint(f[i+1], 10, 64)
			packets += v
		}
		return bytes, packets, nil
	}
	return 0, 0, fmt.Errorf("/proc/%d/net/dev: no eth0", pid)
}

type syncTotals struct{ probes, rounds, bytes uint64 }

func syncCounters(st *clusterv1.StatusResponse) syncTotals {
	t := syncTotals{probes: st.GetCounters()["probes_sent"]}
	for _, m := range st.GetMembers() {
		t.rounds += m.GetSync().GetRounds()
		t.bytes += m.GetSync().GetBytesSent() + m.GetSync().GetBytesReceived()
	}
	return t
}

// clusterPids returns the pids of every process of the cluster.
func clusterPids(ctx context.Context, cl *devcluster.Cluster) []int {
	var out []int
	for _, ps := range processes(ctx, cl) {
		out = append(out, ps...)
	}
	return out
}

// processes returns the pids of the cluster's processes by name, in node
// order.
func processes(ctx context.Context, cl *devcluster.Cluster) map[string][]int {
	st, err := cl.Status(ctx)
	check(err)
	pids := map[string][]int{}
	for _, n := range st.Nodes {
		for _, p := range n.Processes {
			if !p.Running {
				fail("node %d: %s is not running", n.Node, p.Name)
			}
			pids[p.Name] = append(pids[p.Name], p.PID)
		}
	}
	return pids
}

func measureIdle(ctx context.Context, c config, cl *devcluster.Cluster, cls []*client.Statd, all []int) idleResult {
	pids := processes(ctx, cl)
	waitQuiet(ctx, all, c.quiet)
	before := make([]syncTotals, len(cls))
	for i, x := range cls {
		s, err := status(ctx, x)
		check(err)
		before[i] = syncCounters(s)
	}
	read := func() map[int]uint64 {
		out := map[int]uint64{}
		for _, ps := range pids {
			for _, pid := range ps {
				t, err := cpuacct.ProcTicks(pid)
				check(err)
				out[pid] = t
			}
		}
		return out
	}
	type wire struct{ bytes, packets uint64 }
	readWire := func() []wire {
		var out []wire
		for _, pid := range pids["statd"] {
			b, p, err := ifaceCounters(pid)
			check(err)
			out = append(out, wire{b, p})
		}
		return out
	}
	l0 := takeLoad(all)
	w0, c0, t0 := readWire(), read(), time.Now()
	check(sleep(ctx, c.idle))
	c1, w1, t1 := read(), readWire(), time.Now()
	r := idleResult{window: t1.Sub(t0), background: l0.others(takeLoad(all))}
	sample := func(pid int) procSample {
		rss, err := cpuacct.RSSMiB(pid)
		check(err)
		return procSample{cpu: float64(c1[pid]-c0[pid]) / cpuacct.ClockTicks / r.window.Seconds() * 100, rssMB: rss}
	}
	for _, pid := range pids["statd"] {
		r.statd = append(r.statd, sample(pid))
	}
	for _, pid := range pids["solo"] {
		r.solo = append(r.solo, sample(pid))
	}
	for i := range w0 {
		r.wireBps = append(r.wireBps, float64(w1[i].bytes-w0[i].bytes)/r.window.Seconds())
		r.wirePps = append(r.wirePps, float64(w1[i].packets-w0[i].packets)/r.window.Seconds())
	}
	for i, x := range cls {
		s, err := status(ctx, x)
		check(err)
		a := syncCounters(s)
		// The window of the counters is a little longer than the CPU
		// window; the difference is a few milliseconds.
		secs := r.window.Seconds()
		r.probes = append(r.probes, float64(a.probes-before[i].probes)/secs)
		r.rounds = append(r.rounds, float64(a.rounds-before[i].rounds)/secs)
		r.syncBps = append(r.syncBps, float64(a.bytes-before[i].bytes)/secs)
	}
	return r
}

// ---- report ----

func (r *results) print(c config) {
	gcfg, mcfg := gossip.DefaultConfig(), member.DefaultConfig()
	fmt.Printf("Machine: %d CPUs, %s/%s. Cluster %s: %d nodes on %s, each a network namespace on a bridge running the real shoal-statd (%s) with default intervals (push fanout %d every %v, anti-entropy every %v ± 50%%, probe every %v, probe timeout %v, suspicion timeout %v), formed by `shoalctl cluster init` and `join` (devcluster.Up took %v). Everything below is driven from the host through each node's statd socket (pkg/client), as shoalctl would.\n\n",
		runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, r.name, c.nodes, r.subnet, orDash(r.version),
		gcfg.Fanout, gcfg.PushInterval, gcfg.AntiEntropyInterval, mcfg.ProbeInterval, mcfg.ProbeTimeout, mcfg.SuspicionTimeout, r.up.Round(100*time.Millisecond))

	cv := r.conv
	model := serfTime(c.nodes, gcfg.Fanout, gcfg.PushInterval, 0.999)
	fmt.Printf("### Convergence: write on one node, visible on all %d\n\n", c.nodes)
	fmt.Printf("%d writes (one 100-byte field, key /bench/conv/<i>), one at a time, each through a random node's statd and timed from just before the Put until the last node's watch (one Watch stream per node on /bench/, opened from the host before the first write) delivers it; up to 100 ms of pause between writes. Baselines from the same writes: the Put round trip (a durable write on the local node: Pebble fsync included) and the writer's own watch (the same path without the network). Model: Serf's gossip model for N = %d, fanout %d, %v rounds gives %s to 99.9%% (= every node).\n\n",
		c.writes, c.nodes, gcfg.Fanout, gcfg.PushInterval, dur(model))
	fmt.Printf("| from just before the Put until | writes | p50 | p90 | p99 | max |\n|---|---:|---:|---:|---:|---:|\n")
	row := func(name string, ds []time.Duration) {
		if len(ds) == 0 {
			fmt.Printf("| %s | 0 | – | – | – | – |\n", name)
			return
		}
		fmt.Printf("| %s | %d | %s | %s | %s | %s |\n", name, len(ds), dur(pctl(ds, 0.5)), dur(pctl(ds, 0.9)), dur(pctl(ds, 0.99)), dur(slices.Max(ds)))
	}
	row("the Put returned (durable local write)", cv.ack)
	row("the writer's own watch delivered it", cv.own)
	row("the first other node's watch delivered it", cv.first)
	row(fmt.Sprintf("**every node's watch delivered it (all %d)**", c.nodes), cv.all)
	fmt.Println()
	if len(cv.all) > 0 {
		p99 := pctl(cv.all, 0.99)
		fmt.Printf("All %d nodes: p50 %s = %.1f× the local write, p99 %s = %.2f× the Serf model (%s); %d of %d writes did not reach every node within %v; other processes on the machine used %.2f CPUs on average meanwhile. **Goal p99 ≤ 1 s: %s.**\n\n",
			c.nodes, dur(pctl(cv.all, 0.5)), ratio(pctl(cv.all, 0.5), pctl(cv.ack, 0.5)), dur(p99), ratio(p99, model), dur(model), cv.missed, c.writes, c.timeout, cv.background, metStr(cv.missed == 0 && p99 <= time.Second))
	}

	if len(r.kills) > 0 {
		fmt.Printf("### Failure detection\n\n")
		fmt.Printf("A node's statd is killed with SIGKILL (devcluster Kill); every other node's Cluster.Status (what `shoalctl cluster status` shows) is polled every 25 ms until it reports the node suspect, then dead. The statd is then started again (devcluster Start: until its socket serves) and the others are polled until they report it alive. Each cycle starts with every node seeing every node alive and %v of quiet. Times are from the kill, and from the restart. Reference (not measured here): a member is dead on a node no sooner than one probe round (%v) plus the suspicion timeout (%v) after the crash; pkg/member's simulations report about 3 s median and 4.5 s p99.\n\n",
			c.settle, mcfg.ProbeInterval, mcfg.SuspicionTimeout)
		fmt.Printf("| cycle | node killed | suspect on all others | dead on first other | **dead on all others** | restart until serving | alive on all others (from restart) |\n|---:|---:|---:|---:|---:|---:|---:|\n")
		var dead, alive []time.Duration
		allOK := true
		for k, kr := range r.kills {
			d, a := dur(kr.dead), dur(kr.alive)
			if !kr.deadOK {
				d, allOK = "> "+dur(c.timeout), false
			}
			if !kr.aliveOK {
				a, allOK = "> "+dur(c.timeout), false
			}
			fmt.Printf("| %d | %d | %s | %s | %s | %s | %s |\n", k+1, kr.node, dur(kr.suspect), dur(kr.deadFirst), d, dur(kr.ready), a)
			dead, alive = append(dead, kr.dead), append(alive, kr.alive)
		}
		fmt.Printf("| median | | | | %s | | %s |\n\n", dur(pctl(dead, 0.5)), dur(pctl(alive, 0.5)))
		fmt.Printf("Dead on all others: median %s, worst %s. **Goal ≤ 5 s: %s.**\n\n", dur(pctl(dead, 0.5)), dur(slices.Max(dead)), metStr(allOK && slices.Max(dead) <= 5*time.Second))
	}

	id := r.idle
	fmt.Printf("### Idle cost per node\n\n")
	fmt.Printf("Right after the cluster formed and %v of quiet, with no client activity but the measurement's own Status calls just before and after the window: CPU time (utime + stime from /proc/<pid>/stat) over %v as %% of one core, and VmRSS at the end. Baseline: on every node, the same shoal-statd binary started at the same time but never initialised (no peer port, membership or gossip). Probes, anti-entropy rounds started and sync payload bytes (protobuf message sizes of the anti-entropy and push calls this node made or received; no TLS, HTTP/2 or TCP overhead, and membership pings are not counted) come from Cluster.Status counters; eth0 is the node's only link (read from /proc/<statd pid>/net/dev, so inside its namespace) and carries everything: pings, anti-entropy, TCP and TLS.\n\n",
		c.settle, id.window.Round(10*time.Millisecond))
	fmt.Printf("| node | statd CPU | statd RSS | probes/s | anti-entropy rounds/s | sync payload B/s | eth0 B/s (packets/s), in + out | baseline CPU | baseline RSS |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for i, s := range id.statd {
		b := "– | –"
		if i < len(id.solo) {
			b = fmt.Sprintf("%.2f%% | %.1f MiB", id.solo[i].cpu, id.solo[i].rssMB)
		}
		fmt.Printf("| %d | %.2f%% | %.1f MiB | %.2f | %.2f | %.0f | %.0f (%.1f) | %s |\n", i+1, s.cpu, s.rssMB, id.probes[i], id.rounds[i], id.syncBps[i], id.wireBps[i], id.wirePps[i], b)
	}
	cpus := func(ps []procSample) []float64 {
		out := make([]float64, len(ps))
		for i, p := range ps {
			out[i] = p.cpu
		}
		return out
	}
	rss := func(ps []procSample) []float64 {
		out := make([]float64, len(ps))
		for i, p := range ps {
			out[i] = p.rssMB
		}
		return out
	}
	fmt.Printf("| median | %.2f%% | %.1f MiB | %.2f | %.2f | %.0f | %.0f (%.1f) |", median(cpus(id.statd)), median(rss(id.statd)), median(id.probes), median(id.rounds), median(id.syncBps), median(id.wireBps), median(id.wirePps))
	if len(id.solo) > 0 {
		fmt.Printf(" %.2f%% | %.1f MiB |\n\n", median(cpus(id.solo)), median(rss(id.solo)))
		fmt.Printf("Clustering costs %.2f%% of a core and %.1f MiB of RSS per node when idle, over the uninitialised daemon. ",
			median(cpus(id.statd))-median(cpus(id.solo)), median(rss(id.statd))-median(rss(id.solo)))
	} else {
		fmt.Printf(" – | – |\n\n")
	}
	fmt.Printf("CPU time is counted in ticks of 10 ms: over %v one tick is %.2f%% of a core. Other processes on the machine used %.2f CPUs on average during the window.\n\n",
		id.window.Round(10*time.Millisecond), 1.0/cpuacct.ClockTicks/id.window.Seconds()*100, id.background)
}

// serfTime is the Serf gossip model's time until fraction f of n nodes
// holds a message.
func serfTime(n, fanout int, interval time.Duration, f float64) time.Duration {
	x := (2 / float64(fanout)) * math.Log(float64(n+1)*f/(1-f))
	return time.Duration(x * float64(interval))
}

// ---- helpers ----

func metStr(ok bool) string {
	if ok {
		return "met"
	}
	return "not met"
}

func orDash(s string) string {
	if s == "" {
		return "–"
	}
	return s
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "cluster bench: "+format+"\n", args...)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// pctl is the nearest-rank percentile of ds.
func pctl(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }

func dur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= 10*time.Millisecond:
		return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	}
}

var (
	cleanMu  sync.Mutex
	cleanups []func()
)

// atCleanup registers f to run at exit (normal, failure or signal), last
// registered first.
func atCleanup(f func()) {
	cleanMu.Lock()
	defer cleanMu.Unlock()
	cleanups = append(cleanups, f)
}

// runCleanup runs the registered functions once; a concurrent caller
// waits until they are done.
func runCleanup() {
	cleanMu.Lock()
	defer cleanMu.Unlock()
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
	cleanups = nil
}

func check(err error) {
	if err != nil {
		fail("%v", err)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "cluster bench: "+format+"\n", args...)
	runCleanup()
	os.Exit(1)
}

// ---- background load ----

// loadSnap is the machine's busy CPU time and the part of it that is ours
// (this process and the cluster's daemons), so that the CPU other
// processes use during a measurement can be reported next to it.
type loadSnap struct {
	at            time.Time
	machine, ours time.Duration
}

func takeLoad(pids []int) loadSnap {
	s := loadSnap{at: time.Now()}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line)
		// cpu user nice system idle iowait irq softirq steal guest guest_nice
		for i, v := range f[1:] {
			if i == 3 || i == 4 || i >= 8 {
				continue
			}
			n, _ := strconv.ParseInt(v, 10, 64)
			s.machine += time.Duration(n) * time.Second / cpuacct.ClockTicks
		}
	}
	for _, pid := range append([]int{os.Getpid()}, pids...) {
		if t, err := cpuacct.ProcTicks(pid); err == nil {
			s.ours += time.Duration(t) * time.Second / cpuacct.ClockTicks
		}
	}
	return s
}

// others returns the CPUs (cores' worth) that other processes used
// between a and b.
func (a loadSnap) others(b loadSnap) float64 {
	busy := (b.machine - a.machine) - (b.ours - a.ours)
	return max(busy.Seconds(), 0) / b.at.Sub(a.at).Seconds()
}

// waitQuiet waits up to limit for a second in which other processes use
// less than quietCPU CPUs, and returns the load of the last second seen.
func waitQuiet(ctx context.Context, pids []int, limit time.Duration) float64 {
	const quietCPU = 0.25
	deadline := time.Now().Add(limit)
	for {
		a := takeLoad(pids)
		if sleep(ctx, time.Second) != nil {
			return 0
		}
		load := a.others(takeLoad(pids))
		if load < quietCPU || time.Now().After(deadline) {
			return load
		}
	}
}
