// Command schedd measures shoal-schedd on a real cluster: three nodes
// (network namespaces on one machine, pkg/devcluster), each running
// shoal-statd, shoal-schedd and a containerd of its own, driven from the
// host through each node's schedd socket as shoalctl does (pkg/client). It
// prints a Markdown section on stdout (docs/BENCHMARKS.md style):
//
//   - start latency: `service create NAME --image local/busybox:latest
//     --replicas 1 -- sleep 1000000` through a random node's API, timed
//     until that node reports the replica running, against a raw
//     containerd create + start of the same image (pkg/runtime
//     Containerd.Run) measured in the same run; the first task on each
//     node (image present, or fetched from a peer) separately; and a
//     30-replica service until all run;
//   - failover: a 6-replica service, a node killed with its daemons and
//     containers (devcluster Kill), timed until its replicas run on the
//     other nodes (containerd's own view, pkg/runtime List), with the time
//     until membership declares it dead; then the node restarted and timed
//     until no duplicate and no stale task is left.
//
// Every phase reports the CPU other processes used meanwhile (the machine
// less this benchmark, its cluster and the cluster's containers, counted
// exactly through a cpuacct cgroup of its own when the kernel has one).
//
// It needs root, containerd and runc, and the binaries of `make build`.
// The cluster is torn down at the end, on failure and on SIGINT, SIGTERM
// or SIGHUP. BENCH_QUICK=1 in the environment scales the defaults down
// (bench/run.sh).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/shoal-dev/shoal/bench/internal/cpuacct"
	"github.com/shoal-dev/shoal/pkg/client"
	"github.com/shoal-dev/shoal/pkg/devcluster"
	"github.com/shoal-dev/shoal/pkg/member"
	shoalrt "github.com/shoal-dev/shoal/pkg/runtime"
	"github.com/shoal-dev/shoal/pkg/sched"
	"github.com/shoal-dev/shoal/pkg/testimage"
	clusterv1 "github.com/shoal-dev/shoal/proto/shoal/cluster/v1"
	schedv1 "github.com/shoal-dev/shoal/proto/shoal/sched/v1"
)

const (
	nodes     = 3
	imageRef  = "local/busybox:latest"
	labelSvc  = "io.shoal/service" // schedd's container label
	defaultTk = 250 * time.Millisecond
)

var command = []string{"sleep", "1000000"}

type config struct {
	bin          string
	services     int
	manyReplicas int
	manyRuns     int
	failovers    int
	foReplicas   int
	timeout      time.Duration
	settle       time.Duration
	observe      time.Duration
	quiet        time.Duration
	poll         time.Duration
	converged    int
	verbose      bool
}

func main() {
	quick := os.Getenv("BENCH_QUICK") == "1"
	var c config
	defServices, defMany, defFail, defQuiet := 30, 3, 3, 10*time.Second
	if quick {
		defServices, defMany, defFail, defQuiet = 10, 1, 1, 0
	}
	flag.StringVar(&c.bin, "bin", "bin", "directory with shoal-statd, shoal-schedd and shoalctl (make build)")
	flag.IntVar(&c.services, "services", defServices, "single-replica services timed for start latency (and raw containerd runs)")
	flag.IntVar(&c.manyReplicas, "many", 30, "replicas of the large service")
	flag.IntVar(&c.manyRuns, "many-runs", defMany, "runs of the large service (the table shows the median)")
	flag.IntVar(&c.failovers, "failovers", defFail, "node kill-and-return cycles")
	flag.IntVar(&c.foReplicas, "failover-replicas", 6, "replicas of the service whose node is killed")
	flag.DurationVar(&c.timeout, "timeout", 60*time.Second, "give up on a convergence, a failover or a return after this long")
	flag.DurationVar(&c.settle, "settle", 2*time.Second, "quiet time before each kill")
	flag.DurationVar(&c.observe, "observe", 5*time.Second, "after a killed node is back and clean, keep watching for duplicates this long")
	flag.DurationVar(&c.quiet, "quiet-wait", defQuiet, "before each phase, wait up to this long for other processes to use less than 0.25 CPUs")
	flag.IntVar(&c.converged, "converged", 5, "of the single-replica services, how many are also timed until converged (each takes the update monitor period, 5 s by default)")
	flag.DurationVar(&c.poll, "poll", 10*time.Millisecond, "polling interval of the start-latency waits")
	flag.BoolVar(&c.verbose, "v", false, "print devcluster progress on stderr")
	seed := flag.Uint64("seed", 1, "random seed (API node choice)")
	flag.Parse()
	if c.services < 1 || c.manyReplicas < 1 || c.manyRuns < 0 || c.failovers < 0 || c.foReplicas < nodes-1 {
		fail("-services and -many must be positive, -failover-replicas at least %d", nodes-1)
	}

	fmt.Printf("## Scheduler on %d real nodes (shoal-schedd on containerd)\n\n", nodes)
	if os.Geteuid() != 0 {
		fmt.Printf("Skipped: this benchmark needs root (network namespaces, containerd, cgroups).\n\n")
		fmt.Fprintf(os.Stderr, "schedd bench: not root, skipped\n")
		return
	}
	if _, err := exec.LookPath("containerd"); err != nil {
		fmt.Printf("Skipped: containerd is not installed (Debian: apt-get install containerd runc).\n\n")
		fmt.Fprintf(os.Stderr, "schedd bench: no containerd, skipped\n")
		return
	}
	bin, err := filepath.Abs(c.bin)
	check(err)
	c.bin = bin
	for _, b := range []string{"shoal-statd", "shoal-schedd", "shoalctl"} {
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
		fmt.Fprintf(os.Stderr, "schedd bench: %v, tearing the cluster down\n", s)
		interrupted.Store(true)
		cancel()
		select {
		case <-mainDone:
		case <-time.After(3 * time.Second):
		}
		runCleanup()
		os.Exit(1)
	}()

	name := fmt.Sprintf("bs%d", rand.IntN(1_000_000))
	// The cgroup first, so that the cluster's processes are born in it;
	// it goes last, once they are gone.
	acct := cpuacct.New("shoal-bench-schedd-", name, progress)
	atCleanup(acct.Close)
	tmp, err := os.MkdirTemp("", "shoal-bench-schedd-")
	check(err)
	atCleanup(func() { os.RemoveAll(tmp) })

	var cmu sync.Mutex
	var cl *devcluster.Cluster
	atCleanup(func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer dcancel()
		cmu.Lock()
		cur := cl
		cmu.Unlock()
		if cur != nil {
			if err := cur.Down(dctx); err != nil {
				fmt.Fprintf(os.Stderr, "schedd bench: %v\n", err)
			}
		}
		if found, err := devcluster.Purge(dctx, name); err != nil {
			fmt.Fprintf(os.Stderr, "schedd bench: purge %s: %v\n", name, err)
		} else if found {
			fmt.Fprintf(os.Stderr, "schedd bench: purged what was left of %s\n", name)
		}
	})

	b := &bench{c: c, name: name, tmp: tmp, acct: acct, rng: rand.New(rand.NewPCG(*seed, 0x5c4edd))}
	r := b.run(ctx, func(x *devcluster.Cluster) { cmu.Lock(); cl = x; cmu.Unlock() })
	b.closeClients()
	runCleanup()
	close(mainDone)
	r.print(c)
}

// ---- the cluster and its clients ----

type bench struct {
	c    config
	name string
	tmp  string
	acct *cpuacct.Acct
	rng  *rand.Rand

	cl     *devcluster.Cluster
	ids    []string // node IDs; index 0 is node 1
	schedd []*client.Schedd
	statd  []*client.Statd
	rt     []*shoalrt.Containerd // schedd's containerd namespace
	raw    []*shoalrt.Containerd // the baseline's namespace, same containerd
	rawLog *runLog
}

func (b *bench) openClients(i int) {
	var err error
	if b.schedd[i-1] != nil {
		b.schedd[i-1].Close()
		b.statd[i-1].Close()
	}
	b.schedd[i-1], err = client.NewSchedd(b.cl.RunDir(i), client.Retry{Attempts: 3})
	check(err)
	b.statd[i-1], err = client.NewStatd(b.cl.RunDir(i), client.Retry{Attempts: 3})
	check(err)
}

func (b *bench) closeClients() {
	for _, x := range b.schedd {
		if x != nil {
			x.Close()
		}
	}
	for _, x := range b.statd {
		if x != nil {
			x.Close()
		}
	}
	for _, x := range append(slices.Clone(b.rt), b.raw...) {
		if x != nil {
			x.Close()
		}
	}
}

// runtimeFor opens a client of node i's containerd in namespace ns.
func (b *bench) runtimeFor(i int, ns, stateDir string, log *slog.Logger) *shoalrt.Containerd {
	l := b.cl.Containerd(i)
	r, err := shoalrt.NewContainerd(shoalrt.Config{Address: l.Address, Namespace: ns, RuncRoot: l.RuncRoot,
		CgroupParent: l.CgroupParent, StateDir: stateDir, Logger: log})
	check(err)
	return r
}

type results struct {
	name, subnet, version string
	containerd, runc      string
	up, load              time.Duration
	imageSize             int64
	rawFirst              []time.Duration
	cold                  []coldResult
	lat                   latResult
	many                  []manyResult
	manyLoad              cpuacct.Phase
	fo                    []foResult
	foLoad                cpuacct.Phase
	acctExact             bool
	ttl, grace            time.Duration
	member                member.Config
}

func (b *bench) run(ctx context.Context, setCluster func(*devcluster.Cluster)) *results {
	c := b.c
	spec := devcluster.Spec{
		Name:      b.name,
		Nodes:     nodes,
		Subnet:    devcluster.AutoSubnet,
		BinDir:    c.bin,
		Daemons:   []string{"statd", "schedd"},
		Extra:     []devcluster.ProcessSpec{devcluster.ContainerdProcess("")},
		Args:      map[string][]string{"statd": {"--node-name", "n{node}"}, "schedd": append(devcluster.ScheddArgs(), "--task-network", "host")},
		Bootstrap: true,
	}
	if c.verbose {
		spec.Logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, "devcluster: "+format+"\n", args...) }
	}
	progress("starting %d nodes (cluster %s)", nodes, b.name)
	start := time.Now()
	cl, err := devcluster.Up(ctx, spec)
	check(err)
	setCluster(cl)
	b.cl = cl
	atFailure(b.dumpLogs)
	r := &results{name: b.name, subnet: cl.Subnet().String(), up: time.Since(start), acctExact: b.acct.Exact,
		ttl: sched.DefaultTTL, grace: sched.DefaultStopGrace, member: member.DefaultConfig()}
	r.containerd = firstLine(exec.Command("containerd", "--version"))
	r.runc = firstLine(exec.Command("runc", "--version"))
	if out, _, code, err := cl.Exec(ctx, 1, []string{filepath.Join(c.bin, "shoal-schedd"), "--version"}, nil); err == nil && code == 0 {
		r.version = strings.TrimSpace(out)
	}
	for i := 1; i <= cl.Nodes(); i++ {
		b.acct.AddParents(cl.Containerd(i).CgroupParent)
	}

	b.schedd = make([]*client.Schedd, nodes)
	b.statd = make([]*client.Statd, nodes)
	for i := 1; i <= nodes; i++ {
		b.openClients(i)
		st, err := status(ctx, b.statd[i-1])
		check(err)
		b.ids = append(b.ids, st.GetNodeId())
		l := cl.Containerd(i)
		b.rt = append(b.rt, b.runtimeFor(i, l.Namespace, filepath.Join(cl.NodeDir(i), "bench-rt"), nil))
	}
	progress("waiting until every node sees every node alive and every scheduler is ready")
	check(b.waitAlive(ctx, []int{1, 2, 3}, b.ids, time.Minute))
	check(b.waitSchedReady(ctx, time.Minute))

	// The image, on node 1 only (the others fetch it from a peer), as
	// `shoalctl image load` does.
	img := filepath.Join(b.tmp, "busybox.tar")
	built, err := testimage.WriteFile(img, "oci", testimage.Default())
	check(err)
	for _, l := range built[0].Layers {
		r.imageSize += l.Size
	}
	r.imageSize += built[0].Config.Size + built[0].Manifest.Size
	t0 := time.Now()
	if out, errOut, code, err := cl.Ctl(ctx, 1, "image", "load", img); err != nil || code != 0 {
		fail("node 1: shoalctl image load: exit %d %v\n%s%s", code, err, out, errOut)
	}
	r.load = time.Since(t0)

	// The baseline's runtime: the same containerd, cgroup parent and runc
	// root as the node's schedd, its own namespace (so schedd never sees
	// its containers), the image imported there from the same archive.
	b.rawLog = &runLog{runs: map[string]runParts{}}
	for i := 1; i <= nodes; i++ {
		l := cl.Containerd(i)
		x := b.runtimeFor(i, l.Namespace+"-raw", filepath.Join(cl.NodeDir(i), "bench-raw"), slog.New(b.rawLog))
		f, err := os.Open(img)
		check(err)
		_, err = x.Import(ctx, f)
		f.Close()
		check(err)
		b.raw = append(b.raw, x)
		// The first run in a fresh namespace prepares what later runs
		// reuse; it is shown apart.
		d, err := b.rawRun(ctx, i, fmt.Sprintf("raw-warm-%d", i))
		check(err)
		r.rawFirst = append(r.rawFirst, d)
	}

	b.waitQuiet(ctx)
	l0 := b.acct.Take()
	progress("first task on each node")
	for i := 1; i <= nodes; i++ {
		r.cold = append(r.cold, b.coldStart(ctx, i))
	}
	progress("start latency: %d services and %d raw containerd runs", c.services, c.services)
	r.lat = b.latency(ctx)
	r.lat.load = cpuacct.Phase{A: l0, B: b.acct.Take()}
	progress("waiting for the removed services' containers to stop")
	r.lat.drain, r.lat.drainOK = b.waitNoContainers(ctx, "", 90*time.Second)

	if c.manyRuns > 0 {
		b.waitQuiet(ctx)
		l0 := b.acct.Take()
		for k := range c.manyRuns {
			progress("%d replicas, run %d of %d", c.manyReplicas, k+1, c.manyRuns)
			r.many = append(r.many, b.many(ctx, k))
		}
		r.manyLoad = cpuacct.Phase{A: l0, B: b.acct.Take()}
	}
	if c.failovers > 0 {
		b.waitQuiet(ctx)
		l0 := b.acct.Take()
		for k := range c.failovers {
			victim := nodes - k%nodes
			progress("failover %d of %d: node %d", k+1, c.failovers, victim)
			r.fo = append(r.fo, b.failover(ctx, k, victim))
		}
		r.foLoad = cpuacct.Phase{A: l0, B: b.acct.Take()}
	}
	return r
}

func (b *bench) dumpLogs() {
	if b.cl == nil {
		return
	}
	for i := 1; i <= nodes; i++ {
		data, err := os.ReadFile(b.cl.LogPath(i, "schedd"))
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		fmt.Fprintf(os.Stderr, "---- node %d schedd log (tail)\n%s\n", i, strings.Join(lines[max(0, len(lines)-40):], "\n"))
	}
}

func status(ctx context.Context, x *client.Statd) (*clusterv1.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
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

// waitAlive waits until every observer node reports every member of ids
// alive.
func (b *bench) waitAlive(ctx context.Context, observers []int, ids []string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		ok := true
		for _, o := range observers {
			st, err := status(ctx, b.statd[o-1])
			if err != nil {
				ok = false
				break
			}
			for _, id := range ids {
				if stateOf(st, id) != "alive" {
					ok = false
				}
			}
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not every node reports every member alive after %v", timeout)
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

// waitSchedReady waits until every schedd answers its API (it is
// UNAVAILABLE until it joined the cluster and loaded state).
func (b *bench) waitSchedReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for i := 1; i <= nodes; i++ {
		for {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := b.schedd[i-1].ListServices(cctx, &schedv1.ListServicesRequest{})
			cancel()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("node %d: scheduler not ready after %v: %v", i, timeout, err)
			}
			if err := sleep(ctx, 100*time.Millisecond); err != nil {
				return err
			}
		}
	}
	return nil
}

// ---- services through the API ----

func serviceSpec(name string, replicas int, constraints ...string) []byte {
	data, err := json.Marshal(sched.ServiceSpec{Name: name, Image: imageRef, Replicas: replicas, Args: command, Constraints: constraints})
	check(err)
	return data
}

func (b *bench) create(ctx context.Context, i int, name string, replicas int, constraints ...string) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := b.schedd[i-1].CreateService(cctx, &schedv1.CreateServiceRequest{Spec: serviceSpec(name, replicas, constraints...)})
	return err
}

func (b *bench) remove(ctx context.Context, i int, name string) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := b.schedd[i-1].RemoveService(cctx, &schedv1.GetServiceRequest{Name: name}); err != nil {
		fail("node %d: remove service %s: %v", i, name, err)
	}
}

func (b *bench) getService(ctx context.Context, i int, name string) (*schedv1.Service, error) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return b.schedd[i-1].GetService(cctx, &schedv1.GetServiceRequest{Name: name})
}

func (b *bench) tasks(ctx context.Context, i int, name string, all bool) ([]*schedv1.Task, error) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := b.schedd[i-1].ListTasks(cctx, &schedv1.ListTasksRequest{Service: name, All: all})
	return resp.GetTasks(), err
}

// waitRunning polls node i's GetService until the service's running
// count reaches desired (running), then until it is also converged (what
// `shoalctl service create` waits for), both measured from t0.
//
// With !conv it returns once running (converged 0).
func (b *bench) waitRunning(ctx context.Context, i int, name string, t0 time.Time, poll time.Duration, conv bool) (running, converged time.Duration, ok bool) {
	deadline := t0.Add(b.c.timeout)
	for time.Now().Before(deadline) {
		s, err := b.getService(ctx, i, name)
		now := time.Since(t0)
		if err == nil && s.GetDesired() > 0 && s.GetRunning() == s.GetDesired() {
			if running == 0 {
				running = now
			}
			if !conv {
				return running, 0, true
			}
			if s.GetState() == "active" && s.GetConverged() >= s.GetVersion() {
				return running, now, true
			}
		}
		if sleep(ctx, poll) != nil {
			break
		}
	}
	return running, 0, false
}

func (b *bench) nodeIndex(id string) int {
	return slices.Index(b.ids, id) + 1
}

// ---- containers, as containerd sees them ----

// containers returns, per node index, the running containers of a
// service ("" for every service) on the given nodes (nil: all). A node
// whose containerd is down runs none.
func (b *bench) containers(ctx context.Context, service string, on []int) (map[int][]string, error) {
	if on == nil {
		on = []int{1, 2, 3}
	}
	out := map[int][]string{}
	for _, i := range on {
		if _, err := os.Stat(b.cl.Containerd(i).Address); err != nil {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		infos, err := b.rt[i-1].List(cctx)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("node %d: %w", i, err)
		}
		for _, ti := range infos {
			if ti.Status == shoalrt.StatusRunning && ti.Labels[labelSvc] != "" && (service == "" || ti.Labels[labelSvc] == service) {
				out[i] = append(out[i], ti.ID)
			}
		}
	}
	return out, nil
}

func total(m map[int][]string) int {
	n := 0
	for _, v := range m {
		n += len(v)
	}
	return n
}

// waitNoContainers waits until no node runs a container of service (""
// for any service).
func (b *bench) waitNoContainers(ctx context.Context, service string, timeout time.Duration) (time.Duration, bool) {
	t0 := time.Now()
	for time.Since(t0) < timeout {
		cs, err := b.containers(ctx, service, nil)
		if err == nil && total(cs) == 0 {
			return time.Since(t0), true
		}
		if sleep(ctx, 100*time.Millisecond) != nil {
			break
		}
	}
	return time.Since(t0), false
}

// ---- raw containerd, the baseline ----

// rawRun creates and starts a container of the image on node i's
// containerd (returning once its task runs), then removes it; it returns
// the time Run took.
func (b *bench) rawRun(ctx context.Context, i int, id string) (time.Duration, error) {
	x := b.raw[i-1]
	t0 := time.Now()
	err := x.Run(ctx, b.rawSpec(i, id))
	d := time.Since(t0)
	if err != nil {
		return d, fmt.Errorf("node %d: raw run: %w", i, err)
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return d, x.Remove(cctx, id)
}

// rawSpec is the baseline's container: the service's, with a log file as
// schedd gives its tasks.
func (b *bench) rawSpec(i int, id string) shoalrt.TaskSpec {
	spec := shoalrt.TaskSpec{ID: id, Image: imageRef, Args: command,
		LogPath: filepath.Join(b.cl.NodeDir(i), "bench-raw", "logs", id+".log")}
	os.MkdirAll(filepath.Dir(spec.LogPath), 0o755)
	return spec
}

// rawMany starts n containers at once, going round the nodes'
// containerds, and returns the time until every Run returned (every task
// running); then it removes them.
func (b *bench) rawMany(ctx context.Context, k, n int) (time.Duration, error) {
	errs := make([]error, n)
	var wg sync.WaitGroup
	t0 := time.Now()
	for j := range n {
		wg.Go(func() {
			i := j%nodes + 1
			errs[j] = b.raw[i-1].Run(ctx, b.rawSpec(i, fmt.Sprintf("rawmany-%d-%03d", k, j)))
		})
	}
	wg.Wait()
	d := time.Since(t0)
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for j := range n {
		wg.Go(func() {
			i := j%nodes + 1
			if err := b.raw[i-1].Remove(cctx, fmt.Sprintf("rawmany-%d-%03d", k, j)); err != nil && errs[j] == nil {
				errs[j] = err
			}
		})
	}
	wg.Wait()
	return d, errors.Join(errs...)
}

// runParts is containerd Run's own split, as pkg/runtime logs it.
type runParts struct{ container, create, start float64 } // ms

func (p runParts) total() float64 { return p.container + p.create + p.start }

// runLog is a slog handler keeping the "task started" records of a
// pkg/runtime Containerd.
type runLog struct {
	mu   sync.Mutex
	runs map[string]runParts
}

func (h *runLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *runLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *runLog) WithGroup(string) slog.Handler            { return h }
func (h *runLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "task started" {
		return nil
	}
	var id string
	var p runParts
	r.Attrs(func(a slog.Attr) bool {
		f, _ := a.Value.Any().(float64)
		switch a.Key {
		case "task":
			id = a.Value.String()
		case "container_ms":
			p.container = f
		case "create_ms":
			p.create = f
		case "start_ms":
			p.start = f
		}
		return true
	})
	h.mu.Lock()
	h.runs[id] = p
	h.mu.Unlock()
	return nil
}

func (h *runLog) get(id string) (runParts, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	p, ok := h.runs[id]
	return p, ok
}

// scheddLog reads what node i's schedd logged: containerd Run's split per
// task, and image fetches from peers (duration per image name).
func (b *bench) scheddLog(i int) (runs map[string]runParts, fetches []time.Duration) {
	runs = map[string]runParts{}
	f, err := os.Open(b.cl.LogPath(i, "schedd"))
	if err != nil {
		return runs, nil
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.Contains(line, `msg="task started"`) && strings.Contains(line, "container_ms="):
			kv := logFields(line)
			num := func(k string) float64 { v, _ := strconv.ParseFloat(kv[k], 64); return v }
			runs[kv["task"]] = runParts{container: num("container_ms"), create: num("create_ms"), start: num("start_ms")}
		case strings.Contains(line, `msg="image fetched from peer"`):
			if d, err := time.ParseDuration(logFields(line)["duration"]); err == nil {
				fetches = append(fetches, d)
			}
		}
	}
	return runs, fetches
}

// logFields splits a log/slog text line into its key=value pairs.
func logFields(line string) map[string]string {
	out := map[string]string{}
	for len(line) > 0 {
		line = strings.TrimLeft(line, " ")
		eq := strings.IndexByte(line, '=')
		if eq < 0 {
			break
		}
		key := line[:eq]
		line = line[eq+1:]
		var val string
		if strings.HasPrefix(line, `"`) {
			if s, err := strconv.QuotedPrefix(line); err == nil {
				val, _ = strconv.Unquote(s)
				line = line[len(s):]
			} else {
				val, line = line, ""
			}
		} else if sp := strings.IndexByte(line, ' '); sp >= 0 {
			val, line = line[:sp], line[sp:]
		} else {
			val, line = line, ""
		}
		out[key] = val
	}
	return out
}

// ---- start latency ----

// sample is one single-replica service, timed from just before the
// CreateService call.
type sample struct {
	api, node, owner int           // API node, the node that ran the task, the owner the API node named
	call             time.Duration // CreateService returned
	accepted         time.Duration // the target wrote the task document (its created stamp)
	started          time.Duration // the target's runtime started the container (task started)
	running          time.Duration // the API node reported running == desired
	converged        time.Duration // ... and converged
	run              runParts      // containerd Run inside schedd, from its log
	ok               bool
}

type latResult struct {
	raw     []time.Duration
	rawRuns []runParts
	svc     []sample
	failed  int
	load    cpuacct.Phase
	drain   time.Duration
	drainOK bool
}

// timeOne creates service name through node api, waits until it runs,
// reads its task, and removes the service (without waiting for its
// container to stop).
func (b *bench) timeOne(ctx context.Context, api int, name string, conv bool, constraints ...string) sample {
	s := sample{api: api}
	t0 := time.Now()
	if err := b.create(ctx, api, name, 1, constraints...); err != nil {
		fail("node %d: create service %s: %v", api, name, err)
	}
	s.call = time.Since(t0)
	s.running, s.converged, s.ok = b.waitRunning(ctx, api, name, t0, b.c.poll, conv)
	if sv, err := b.getService(ctx, api, name); err == nil {
		s.owner = b.nodeIndex(sv.GetOwner())
	}
	ts, err := b.tasks(ctx, api, name, false)
	check(err)
	for _, t := range ts {
		if !t.GetCurrent() {
			continue
		}
		s.node = b.nodeIndex(t.GetNode())
		if t.GetCreated() != nil {
			s.accepted = t.GetCreated().AsTime().Sub(t0)
		}
		if t.GetStarted() != nil {
			s.started = t.GetStarted().AsTime().Sub(t0)
		}
		if s.node > 0 {
			runs, _ := b.scheddLog(s.node)
			s.run = runs[t.GetId()]
		}
	}
	if !s.ok {
		fmt.Fprintf(os.Stderr, "schedd bench: %s did not converge within %v\n", name, b.c.timeout)
	}
	b.remove(ctx, api, name)
	return s
}

type coldResult struct {
	node     int
	hadImage bool
	s        sample
	fetch    time.Duration // image fetch from a peer, as schedd logged it
}

// coldStart times the first task on node i (the image loaded on node 1
// only: the others fetch it from a peer first).
func (b *bench) coldStart(ctx context.Context, i int) coldResult {
	_, err := b.rt[i-1].Image(ctx, imageRef)
	r := coldResult{node: i, hadImage: err == nil}
	api := 1 + b.rng.IntN(nodes)
	r.s = b.timeOne(ctx, api, fmt.Sprintf("first-n%d", i), true, fmt.Sprintf("node.name==n%d", i))
	if _, fetches := b.scheddLog(i); len(fetches) > 0 {
		r.fetch = fetches[0]
	}
	return r
}

func (b *bench) latency(ctx context.Context) latResult {
	var r latResult
	for k := range b.c.services {
		// Interleaved, so that both see the same conditions; the raw run
		// goes round the nodes.
		node := k%nodes + 1
		id := fmt.Sprintf("raw-%03d", k)
		d, err := b.rawRun(ctx, node, id)
		check(err)
		r.raw = append(r.raw, d)
		if p, ok := b.rawLog.get(id); ok {
			r.rawRuns = append(r.rawRuns, p)
		}
		s := b.timeOne(ctx, 1+b.rng.IntN(nodes), fmt.Sprintf("lat-%03d", k), k < b.c.converged)
		if !s.ok {
			r.failed++
		}
		r.svc = append(r.svc, s)
	}
	return r
}

// ---- many replicas ----

type manyResult struct {
	api                int
	raw                time.Duration
	running, converged time.Duration
	ok                 bool
	perNode            [nodes]int
	rm                 time.Duration
	rmOK               bool
}

func (b *bench) many(ctx context.Context, k int) manyResult {
	name := fmt.Sprintf("many-%d", k)
	r := manyResult{api: 1 + b.rng.IntN(nodes)}
	var err error
	r.raw, err = b.rawMany(ctx, k, b.c.manyReplicas)
	check(err)
	t0 := time.Now()
	if err := b.create(ctx, r.api, name, b.c.manyReplicas); err != nil {
		fail("create %s: %v", name, err)
	}
	r.running, r.converged, r.ok = b.waitRunning(ctx, r.api, name, t0, 20*time.Millisecond, true)
	if cs, err := b.containers(ctx, name, nil); err == nil {
		for i := range nodes {
			r.perNode[i] = len(cs[i+1])
		}
	}
	t1 := time.Now()
	b.remove(ctx, r.api, name)
	_, r.rmOK = b.waitNoContainers(ctx, name, 90*time.Second)
	r.rm = time.Since(t1)
	return r
}

// ---- failover ----

type foResult struct {
	victim, api     int
	wasOwner        bool
	before          [nodes]int
	kill            time.Duration // devcluster Kill returned (daemons, containerd and containers gone)
	suspectFirst    time.Duration // the first surviving node's statd reports the victim suspect (or dead)
	suspectAll      time.Duration
	deadFirst       time.Duration // the first surviving node's statd reports the victim dead
	deadAll         time.Duration // every surviving node's statd does
	deadOK          bool
	firstRepl       time.Duration // the first replacement container runs on a survivor
	allRepl         time.Duration // all replicas run as containers on the survivors
	replOK          bool
	apiRepl         time.Duration // the API node lists all replicas current and running off the victim
	apiOK           bool
	apiMinRunning   uint32        // lowest running count GetService reported after the kill
	apiStale        time.Duration // GetService first reported fewer running than desired
	apiStaleOK      bool
	restart         time.Duration
	aliveAll        time.Duration // from the restart: the survivors report the victim alive
	aliveOK         bool
	clean           time.Duration // from the restart: replicas containers exactly, no stale task left on the victim
	cleanOK         bool
	peak            int // most running containers of the service seen after the restart
	after           [nodes]int
	rm              time.Duration
	rmOK            bool
	victimContainer int // containers running on the victim at the end
}

// firstAt records the first time a condition held.
type firstAt struct {
	mu sync.Mutex
	d  time.Duration
	ok bool
}

func (f *firstAt) set(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.ok {
		f.d, f.ok = d, true
	}
}

func (f *firstAt) get() (time.Duration, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.d, f.ok
}

func (b *bench) failover(ctx context.Context, k, victim int) foResult {
	c := b.c
	want := c.foReplicas
	name := fmt.Sprintf("fail-%d", k)
	var survivors []int
	for i := 1; i <= nodes; i++ {
		if i != victim {
			survivors = append(survivors, i)
		}
	}
	r := foResult{victim: victim, api: survivors[b.rng.IntN(len(survivors))]}
	vid := b.ids[victim-1]

	if err := b.create(ctx, r.api, name, want); err != nil {
		fail("create %s: %v", name, err)
	}
	if _, _, ok := b.waitRunning(ctx, r.api, name, time.Now(), 50*time.Millisecond, false); !ok {
		fail("%s: %d replicas did not run within %v", name, want, c.timeout)
	}
	check(b.waitAlive(ctx, []int{1, 2, 3}, b.ids, time.Minute))
	sleep(ctx, c.settle)
	cs, err := b.containers(ctx, name, nil)
	check(err)
	for i := range nodes {
		r.before[i] = len(cs[i+1])
	}
	if total(cs) != want {
		fail("%s: %d containers run before the kill, want %d", name, total(cs), want)
	}
	if sv, err := b.getService(ctx, r.api, name); err == nil {
		r.wasOwner = sv.GetOwner() == vid
	}
	onSurvivors := want - r.before[victim-1]

	// The kill, and three watchers from it: membership on the survivors,
	// containers on the survivors, the service through the API node.
	t0 := time.Now()
	deadline := t0.Add(c.timeout)
	var dead, suspect [nodes]firstAt
	var firstRepl, allRepl, apiRepl, apiStale firstAt
	minRunning := uint32(math.MaxUint32)
	var wg sync.WaitGroup
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	killed := make(chan struct{})
	for _, o := range survivors {
		wg.Go(func() {
			<-killed
			for time.Now().Before(deadline) && wctx.Err() == nil {
				if st, err := status(wctx, b.statd[o-1]); err == nil {
					switch stateOf(st, vid) {
					case "suspect":
						suspect[o-1].set(time.Since(t0))
					case "dead":
						suspect[o-1].set(time.Since(t0))
						dead[o-1].set(time.Since(t0))
						return
					}
				}
				sleep(wctx, 25*time.Millisecond)
			}
		})
	}
	wg.Go(func() {
		<-killed
		for time.Now().Before(deadline) && wctx.Err() == nil {
			if cs, err := b.containers(wctx, name, survivors); err == nil {
				n := total(cs)
				if n > onSurvivors {
					firstRepl.set(time.Since(t0))
				}
				if n >= want {
					allRepl.set(time.Since(t0))
					return
				}
			}
			sleep(wctx, 25*time.Millisecond)
		}
	})
	var mu sync.Mutex
	wg.Go(func() {
		<-killed
		for time.Now().Before(deadline) && wctx.Err() == nil {
			if sv, err := b.getService(wctx, r.api, name); err == nil {
				mu.Lock()
				minRunning = min(minRunning, sv.GetRunning())
				mu.Unlock()
				if sv.GetRunning() < sv.GetDesired() {
					apiStale.set(time.Since(t0))
				}
			}
			if ts, err := b.tasks(wctx, r.api, name, false); err == nil {
				n := 0
				for _, t := range ts {
					if t.GetCurrent() && t.GetState() == string(sched.TaskRunning) && t.GetNode() != vid {
						n++
					}
				}
				if n >= want {
					apiRepl.set(time.Since(t0))
					return
				}
			}
			sleep(wctx, 25*time.Millisecond)
		}
	})
	check(b.cl.Kill(ctx, victim, ""))
	r.kill = time.Since(t0)
	close(killed)
	wg.Wait()
	var ds, ss []time.Duration
	r.deadOK = true
	for _, o := range survivors {
		if d, ok := suspect[o-1].get(); ok {
			ss = append(ss, d)
		}
		d, ok := dead[o-1].get()
		if !ok {
			r.deadOK = false
			continue
		}
		ds = append(ds, d)
	}
	if len(ds) > 0 {
		r.deadFirst, r.deadAll = slices.Min(ds), slices.Max(ds)
	}
	if len(ss) > 0 {
		r.suspectFirst, r.suspectAll = slices.Min(ss), slices.Max(ss)
	}
	r.firstRepl, _ = firstRepl.get()
	r.allRepl, r.replOK = allRepl.get()
	r.apiRepl, r.apiOK = apiRepl.get()
	r.apiStale, r.apiStaleOK = apiStale.get()
	mu.Lock()
	if minRunning == math.MaxUint32 {
		minRunning = 0
	}
	r.apiMinRunning = minRunning
	mu.Unlock()

	// The return: restart the node, and watch membership, containers on
	// every node and the victim's stale task documents.
	t1 := time.Now()
	deadline = t1.Add(c.timeout)
	check(b.cl.Start(ctx, victim, ""))
	r.restart = time.Since(t1)
	b.openClients(victim)
	var alive firstAt
	wg.Go(func() {
		for time.Now().Before(deadline) && ctx.Err() == nil {
			ok := true
			for _, o := range survivors {
				if st, err := status(ctx, b.statd[o-1]); err != nil || stateOf(st, vid) != "alive" {
					ok = false
				}
			}
			if ok {
				alive.set(time.Since(t1))
				return
			}
			sleep(ctx, 25*time.Millisecond)
		}
	})
	var cleanAt time.Time
	for time.Now().Before(deadline) {
		cs, err := b.containers(ctx, name, nil)
		if err != nil {
			sleep(ctx, 25*time.Millisecond)
			continue
		}
		n := total(cs)
		r.peak = max(r.peak, n)
		stale := 0
		if ts, err := b.tasks(ctx, r.api, name, false); err == nil {
			for _, t := range ts {
				if t.GetNode() == vid && !sched.TaskState(t.GetState()).Terminal() {
					stale++
				}
			}
		} else {
			stale = -1
		}
		_, isAlive := alive.get()
		switch {
		case n == want && stale == 0 && isAlive:
			if cleanAt.IsZero() {
				cleanAt = time.Now()
				r.clean, r.cleanOK = cleanAt.Sub(t1), true
			}
		default:
			cleanAt, r.cleanOK = time.Time{}, false // not clean (again)
		}
		if !cleanAt.IsZero() && time.Since(cleanAt) >= c.observe {
			break
		}
		sleep(ctx, 25*time.Millisecond)
	}
	wg.Wait()
	r.aliveAll, r.aliveOK = alive.get()
	if cs, err := b.containers(ctx, name, nil); err == nil {
		for i := range nodes {
			r.after[i] = len(cs[i+1])
		}
		r.victimContainer = len(cs[victim])
	}
	check(b.waitAlive(ctx, []int{1, 2, 3}, b.ids, time.Minute))
	check(b.waitSchedReady(ctx, time.Minute))

	t2 := time.Now()
	b.remove(ctx, r.api, name)
	_, r.rmOK = b.waitNoContainers(ctx, name, 90*time.Second)
	r.rm = time.Since(t2)
	return r
}

// ---- report ----

func (r *results) print(c config) {
	fmt.Printf("Machine: %s. %s; %s.\n\n", machine(), orDash(r.containerd), orDash(r.runc))
	fmt.Printf("Cluster %s: %d nodes on %s, each a network namespace on a bridge running its own containerd, shoal-statd and shoal-schedd (%s) with default settings (schedd tick %v, reservation TTL %v; membership probe every %v, suspicion timeout %v), formed by `shoalctl cluster init` and `join` (devcluster.Up took %v). Each node offers the whole machine (%d CPUs, 90%% of RAM): the three nodes share %d CPUs. The image is the test image local/busybox:latest (pkg/testimage, %s), loaded on node 1 only with `shoalctl image load` (%v); the other nodes fetch it from a peer the first time they need it. Services are `service create NAME --image local/busybox:latest --replicas N -- sleep 1000000` sent as a JSON spec through a node's schedd socket (pkg/client CreateService), as shoalctl does; \"running\" is what that node's GetService reports (running == desired), \"converged\" adds the owner's converged mark, which is what `shoalctl service create` waits for. Times are from just before the CreateService call.\n\n",
		r.name, nodes, r.subnet, orDash(r.version), defaultTk, r.ttl, r.member.ProbeInterval, r.member.SuspicionTimeout, r.up.Round(100*time.Millisecond),
		runtime.NumCPU(), runtime.NumCPU(), bytesText(r.imageSize), r.load.Round(time.Millisecond))

	// First task per node.
	if len(r.cold) > 0 {
		fmt.Printf("### First task on each node\n\n")
		fmt.Printf("One single-replica service pinned to each node in turn (`--constraint node.name==nN`), through a random node's API, before anything else ran there. A node without the image fetches it from a peer that holds it (schedd's peer API, blob by blob, digests verified) before containerd creates the container. Raw containerd's first run in a fresh namespace (image imported beforehand): %s.\n\n", durList(r.rawFirst))
		fmt.Printf("| node | image there before | API node | task accepted | container started | **running (API)** | converged | of which image fetch from a peer | containerd Run in schedd |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, x := range r.cold {
			f := "–"
			if x.fetch > 0 {
				f = dur(x.fetch)
			}
			fmt.Printf("| %d | %s | %d | %s | %s | **%s** | %s | %s | %s |\n", x.node, yesNo(x.hadImage), x.s.api, dur(x.s.accepted), dur(x.s.started),
				okDur(x.s.running, x.s.ok || x.s.running > 0, c.timeout), okDur(x.s.converged, x.s.ok, c.timeout), f, msText(x.s.run.total()))
		}
		fmt.Println()
	}

	// Start latency.
	l := r.lat
	var acc, st, run, conv, call []time.Duration
	var inSchedd []time.Duration
	var sameNode, sameOwner int
	for _, s := range l.svc {
		if !s.ok {
			continue
		}
		call = append(call, s.call)
		acc = append(acc, s.accepted)
		st = append(st, s.started)
		run = append(run, s.running)
		if s.converged > 0 {
			conv = append(conv, s.converged)
		}
		if s.run.total() > 0 {
			inSchedd = append(inSchedd, time.Duration(s.run.total()*float64(time.Millisecond)))
		}
		if s.node == s.api {
			sameNode++
		}
		if s.owner == s.api {
			sameOwner++
		}
	}
	var rawParts []time.Duration
	for _, p := range l.rawRuns {
		rawParts = append(rawParts, time.Duration(p.total()*float64(time.Millisecond)))
	}
	fmt.Printf("### Start latency: one replica, create to running\n\n")
	fmt.Printf("%d single-replica services, one at a time, each through a random node's API (%d placed on that node, %d owned by it), polled every %v until running; each removed once measured (its container stops in the background: a task whose slot is gone waits out the reservation TTL since its creation, then the stop grace, since `sleep` as PID 1 ignores SIGTERM). Interleaved with each: the baseline, raw containerd create + start of the same image on one node's containerd (pkg/runtime Containerd.Run, which returns once the task runs, in a namespace of its own on the same containerd, going round the nodes; removed after). Converged (what `shoalctl service create` waits for) needs every new task to have run through the update monitor period (%v by default), as Swarm's `service create` verification does, so it is timed for the first few services only. Task accepted and container started come from the task document (its created stamp, written when the target accepted the reservation, and its started time, taken when containerd's Run returned in schedd); the nodes share one clock.\n\n",
		len(l.svc), sameNode, sameOwner, c.poll, sched.DefaultMonitor)
	fmt.Printf("| from just before the call until | n | p50 | p90 | p99 | min | max |\n|---|---:|---:|---:|---:|---:|---:|\n")
	row := func(name string, ds []time.Duration) {
		if len(ds) == 0 {
			fmt.Printf("| %s | 0 | – | – | – | – | – |\n", name)
			return
		}
		fmt.Printf("| %s | %d | %s | %s | %s | %s | %s |\n", name, len(ds), dur(pctl(ds, 0.5)), dur(pctl(ds, 0.9)), dur(pctl(ds, 0.99)), dur(slices.Min(ds)), dur(slices.Max(ds)))
	}
	row("baseline: raw containerd create + start returned (task running)", l.raw)
	row("the CreateService call returned", call)
	row("the target accepted the reservation (task document written)", acc)
	row("the target's containerd started the container", st)
	row("**the API node reports it running (running == desired)**", run)
	row(fmt.Sprintf("the API node reports the service converged (`shoalctl service create` returns; first %d services only)", len(conv)), conv)
	fmt.Println()
	if len(run) > 0 && len(l.raw) > 0 {
		p50, raw50 := pctl(run, 0.5), pctl(l.raw, 0.5)
		fmt.Printf("Where the time goes (medians of each service's own intervals): create → accepted %s (the service document reaches the owner, which reconciles and sends Reserve; the target writes the task), accepted → started %s (the target's agent picks the task up, checks the image, and containerd's Run, %s of it in schedd's runtime against %s for the raw baseline's Run), started → reported running by the API node %s (the task document's update reaches that node; up to one %v poll).\n\n",
			dur(medianOf(acc)), dur(medianOf(diffs(st, acc))), msDur(medianOf(inSchedd)), msDur(medianOf(rawParts)), dur(medianOf(diffs(run, st))), c.poll)
		fmt.Printf("**Running: p50 %s = %.1f× raw containerd (p50 %s), %s over it; p99 %s.** %d of %d services did not run within %v. **Goal p50 ≤ 500 ms: %s.** Other processes on the machine used %.2f CPUs on average during the phase (this benchmark, its cluster and containers %.2f)%s.\n\n",
			dur(p50), ratio(p50, raw50), dur(raw50), dur(p50-raw50), dur(pctl(run, 0.99)), l.failed, len(l.svc), c.timeout, metStr(l.failed == 0 && p50 <= 500*time.Millisecond),
			l.load.Others(), l.load.Ours(), acctNote(r.acctExact))
	}

	if len(r.many) > 0 {
		fmt.Printf("### %d replicas over %d nodes\n\n", c.manyReplicas, nodes)
		fmt.Printf("One service with `--replicas %d` through a random node's API, timed until that node reports all running (polled every 20 ms); the containers each node runs counted in containerd afterwards; then `service rm`, timed until no container of it runs (reservation TTL since creation, then the %v stop grace). Baseline, just before each run: the same number of raw containerd create + start (Containerd.Run) all at once, going round the three nodes' containerds, until every one returned (then removed). Runs one after the other, each after the previous one's containers are gone.\n\n", c.manyReplicas, r.grace)
		fmt.Printf("| run | baseline: raw containerd, all at once | API node | **all running (API)** | converged | containers per node | rm until all stopped |\n|---:|---:|---:|---:|---:|---|---:|\n")
		var runs, raws []time.Duration
		allOK := true
		for k, m := range r.many {
			fmt.Printf("| %d | %s | %d | **%s** | %s | %s | %s |\n", k+1, dur(m.raw), m.api, okDur(m.running, m.ok || m.running > 0, c.timeout), okDur(m.converged, m.ok, c.timeout),
				perNode(m.perNode[:]), okDur(m.rm, m.rmOK, 90*time.Second))
			if m.running > 0 {
				runs = append(runs, m.running)
			}
			raws = append(raws, m.raw)
			allOK = allOK && m.ok
		}
		if len(runs) > 0 {
			p, rp := medianOf(runs), medianOf(raws)
			fmt.Printf("\n**Median %s until all %d run (%.0f replicas/s) = %.1f× raw containerd starting as many at once (%s)**%s. Other processes used %.2f CPUs on average during the phase (this benchmark, its cluster and containers %.2f).\n\n",
				dur(p), c.manyReplicas, float64(c.manyReplicas)/p.Seconds(), ratio(p, rp), dur(rp), ifText(!allOK, "; some runs did not converge"), r.manyLoad.Others(), r.manyLoad.Ours())
		}
	}

	if len(r.fo) > 0 {
		fmt.Printf("### Failover: a node dies, then returns\n\n")
		fmt.Printf("A %d-replica service (spread: two per node), created through a survivor's API and running, every node alive and %v of quiet; then the node is killed with devcluster Kill (SIGKILL to its containerd, statd and schedd, then to every process in its namespace, and its containers killed by cgroup). From the start of the kill, survivors are polled every 25 ms: their statd's membership (when they declare the node dead), their containerd (when replacement containers run: the truth), and the API node's task list (when it lists %d current running tasks off the dead node) and its GetService (whose running count goes on counting the dead node's tasks until their slots are repointed). Then the node is started again (devcluster Start: containerd, statd, schedd, until each serves) and, from the restart, watched until the survivors report it alive and it is clean: exactly %d running containers of the service cluster-wide and no task on the returned node left in a non-terminal state; then %v more to catch late duplicates (peak column). Default settings throughout.\n\n",
			c.foReplicas, c.settle, c.foReplicas, c.foReplicas, c.observe)
		fmt.Printf("| cycle | node killed | it owned the service | kill took | suspect on first survivor | dead on first survivor | dead on all survivors | first replacement running | **all %d running on survivors** | API lists all %d running off it | API's running count first below %d | lowest running count the API reported | restart until serving | alive on survivors (from restart) | clean (from restart) | peak containers after restart | containers per node after |\n|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
			c.foReplicas, c.foReplicas, c.foReplicas)
		var repl, suspectFirst, deadAll, fromSuspect, clean []time.Duration
		allOK := true
		for k, f := range r.fo {
			stale := "never"
			if f.apiStaleOK {
				stale = dur(f.apiStale)
			}
			fmt.Printf("| %d | %d | %s | %s | %s | %s | %s | %s | **%s** | %s | %s | %d | %s | %s | %s | %d | %s |\n",
				k+1, f.victim, yesNo(f.wasOwner), dur(f.kill), dur(f.suspectFirst), dur(f.deadFirst), okDur(f.deadAll, f.deadOK, c.timeout), dur(f.firstRepl),
				okDur(f.allRepl, f.replOK, c.timeout), okDur(f.apiRepl, f.apiOK, c.timeout), stale, f.apiMinRunning, dur(f.restart),
				okDur(f.aliveAll, f.aliveOK, c.timeout), okDur(f.clean, f.cleanOK, c.timeout), f.peak, perNode(f.after[:]))
			allOK = allOK && f.replOK && f.cleanOK && f.peak <= c.foReplicas
			if f.replOK {
				repl = append(repl, f.allRepl)
				if f.suspectFirst > 0 {
					suspectFirst = append(suspectFirst, f.suspectFirst)
					fromSuspect = append(fromSuspect, f.allRepl-f.suspectFirst)
				}
			}
			if f.deadOK {
				deadAll = append(deadAll, f.deadAll)
			}
			if f.cleanOK {
				clean = append(clean, f.clean)
			}
		}
		if len(repl) > 0 {
			fmt.Printf("| median | | | | %s | | %s | | **%s** | | | | | | %s | | |\n\n", dur(medianOf(suspectFirst)), dur(medianOf(deadAll)), dur(medianOf(repl)), dur(medianOf(clean)))
			fmt.Printf("**All replicas running elsewhere: median %s, worst %s. Goal ≤ 10 s: %s.** Breakdown (medians): the first survivor suspects the node after %s and every survivor declares it dead after %s (probe every %v, suspicion timeout %v); all replicas run on the survivors %s after the first suspicion (schedd counts only members statd reports alive, so a suspect node's tasks are already replaced; the rest is the owner's round, Reserve on the survivors and containerd). The returned node is clean a median %s after its restart; at most %d containers of the service ran at once after it (%s). Other processes used %.2f CPUs on average during the phase (this benchmark, its cluster and containers %.2f).\n\n",
				dur(medianOf(repl)), dur(slices.Max(repl)), metStr(allOK && slices.Max(repl) <= 10*time.Second), dur(medianOf(suspectFirst)), dur(medianOf(deadAll)),
				r.member.ProbeInterval, r.member.SuspicionTimeout, dur(medianOf(fromSuspect)), dur(medianOf(clean)), maxPeak(r.fo), dupText(r.fo, c.foReplicas),
				r.foLoad.Others(), r.foLoad.Ours())
		}
	}
	fmt.Printf("Placement throughput on 100 simulated nodes is bench/sched (its own section).\n\n")
}

// ---- helpers ----

func machine() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	mem := "?"
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
				kb, _ := strconv.ParseFloat(f[1], 64)
				mem = fmt.Sprintf("%.1f GiB RAM", kb/1048576)
			}
		}
	}
	kernel := "?"
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = strings.TrimSpace(string(b))
	}
	return fmt.Sprintf("%d CPUs (%s), %s, Linux %s %s, %s", runtime.NumCPU(), model, mem, kernel, runtime.GOARCH, runtime.Version())
}

func maxPeak(fo []foResult) int {
	m := 0
	for _, f := range fo {
		m = max(m, f.peak)
	}
	return m
}

func dupText(fo []foResult, want int) string {
	if maxPeak(fo) > want {
		return "duplicates seen"
	}
	return "no duplicate seen"
}

func firstLine(cmd *exec.Cmd) string {
	out, err := cmd.Output()
	if err != nil {
		return ""
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "schedd bench: "+format+"\n", args...)
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
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

// medianOf is the median (the mean of the middle two for an even count).
func medianOf(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

// diffs returns a[i] - b[i].
func diffs(a, b []time.Duration) []time.Duration {
	out := make([]time.Duration, 0, len(a))
	for i := range min(len(a), len(b)) {
		out = append(out, a[i]-b[i])
	}
	return out
}

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return math.NaN()
	}
	return float64(a) / float64(b)
}

func dur(d time.Duration) string {
	neg := ""
	if d < 0 {
		neg, d = "−", -d
	}
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%s%.2f s", neg, d.Seconds())
	case d >= 10*time.Millisecond:
		return fmt.Sprintf("%s%.0f ms", neg, float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%s%.1f ms", neg, float64(d)/float64(time.Millisecond))
	}
}

func msDur(d time.Duration) string {
	if d == 0 {
		return "–"
	}
	return dur(d)
}

func msText(ms float64) string {
	if ms == 0 {
		return "–"
	}
	return dur(time.Duration(ms * float64(time.Millisecond)))
}

func okDur(d time.Duration, ok bool, limit time.Duration) string {
	if !ok {
		return "> " + dur(limit)
	}
	return dur(d)
}

func durList(ds []time.Duration) string {
	var s []string
	for _, d := range ds {
		s = append(s, dur(d))
	}
	return strings.Join(s, ", ")
}

func perNode(xs []int) string {
	var s []string
	for _, x := range xs {
		s = append(s, strconv.Itoa(x))
	}
	return strings.Join(s, " / ")
}

func bytesText(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.0f KiB", float64(n)/(1<<10))
	default:
		return fmt.Sprintf("%d B", n)
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func ifText(b bool, s string) string {
	if b {
		return s
	}
	return ""
}

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

func acctNote(exact bool) string {
	if exact {
		return ""
	}
	return "; approximate: no cpuacct cgroup, so the short-lived processes of container starts (shims, runc) count as other processes"
}

var (
	cleanMu   sync.Mutex
	cleanups  []func()
	onFailure []func()
)

// atCleanup registers f to run at exit (normal, failure or signal), last
// registered first.
func atCleanup(f func()) {
	cleanMu.Lock()
	defer cleanMu.Unlock()
	cleanups = append(cleanups, f)
}

// atFailure registers f to run before the cleanups when the benchmark
// fails.
func atFailure(f func()) {
	cleanMu.Lock()
	defer cleanMu.Unlock()
	onFailure = append(onFailure, f)
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

// interrupted is set on SIGINT, SIGTERM or SIGHUP: what fails then is
// only the benchmark being stopped.
var interrupted atomic.Bool

func fail(format string, args ...any) {
	cleanMu.Lock()
	fs := onFailure
	onFailure = nil
	cleanMu.Unlock()
	if !interrupted.Load() {
		fmt.Fprintf(os.Stderr, "schedd bench: "+format+"\n", args...)
		for _, f := range fs {
			f()
		}
	}
	runCleanup()
	os.Exit(1)
}

// ---- CPU accounting ----

// waitQuiet waits up to the configured limit for a second in which other
// processes use less than a quarter of a CPU.
func (b *bench) waitQuiet(ctx context.Context) {
	const quietCPU = 0.25
	deadline := time.Now().Add(b.c.quiet)
	for time.Now().Before(deadline) {
		a := b.acct.Take()
		if sleep(ctx, time.Second) != nil {
			return
		}
		load := cpuacct.Phase{A: a, B: b.acct.Take()}.Others()
		if load < quietCPU {
			return
		}
		if time.Now().After(deadline) {
			progress("other processes still use %.2f CPUs; measuring anyway", load)
		}
	}
}
