// Command vold measures shoal-vold on a real cluster: three nodes (network
// namespaces on one machine, pkg/devcluster), each running shoal-statd and
// shoal-vold, driven from the host through each node's vold socket as
// shoalctl does (pkg/client). Volume data is written from the host through
// the FUSE mount a node's vold makes (Mount returns its host path). It
// prints a Markdown section on stdout (docs/BENCHMARKS.md style):
//
//   - sequential writes: a file written in 1 MiB writes and fsynced,
//     through the mount of a 3-replica volume on the group leader's node
//     and on a follower's, against the same on the local filesystem that
//     holds the cluster's state, interleaved in the same run;
//   - synchronous random 4 KiB writes (O_DSYNC, one thread) into a
//     preallocated file, the same three ways, with latency percentiles;
//     on a KVM guest whose haltpoll driver runs with guest halt polling
//     set otherwise, the single-writer rows again with the kernel's
//     default (haltpoll.go: the setting is put back afterwards);
//   - random 4 KiB reads (one thread) through the leader's mount, alone
//     and beside one O_DSYNC writer (reads.go);
//   - leader failover: a writer appending through a follower's mount while
//     the leader's whole node is killed (devcluster Kill), timed until a
//     write begun after the kill is acknowledged; then the node restarted
//     and timed until the group is healthy again;
//   - the leader's vold restarted under the same writer: stopped (SIGTERM:
//     it hands its leaderships off first) or killed, and started again,
//     timed by the writer's longest wait;
//   - KV Put throughput and latency with 1 and 64 clients spread over the
//     three nodes, against statd's durable local Put on the same nodes;
//   - idle cost: each vold's CPU and RSS with no volume, and with 1,000
//     idle 3-replica volumes once quiescent.
//
// Every phase reports the CPU other processes used meanwhile (the machine
// less this benchmark and its cluster, counted through a cpuacct cgroup of
// its own when the kernel has one).
//
// It needs root, FUSE and the binaries of `make build`. The cluster is
// torn down at the end, on failure and on SIGINT, SIGTERM or SIGHUP.
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/shoal-dev/shoal/bench/internal/cpuacct"
	"github.com/shoal-dev/shoal/pkg/client"
	"github.com/shoal-dev/shoal/pkg/devcluster"
	clusterv1 "github.com/shoal-dev/shoal/proto/shoal/cluster/v1"
	volv1 "github.com/shoal-dev/shoal/proto/shoal/vol/v1"
)

const (
	nodes      = 3
	benchVol   = "bench"
	chunk      = 1 << 20 // sequential write size
	block      = 4096    // random write size
	volumeSize = 512 << 20
)

type config struct {
	bin         string
	seqMiB      int
	reps        int
	randMiB     int
	randDur     time.Duration
	randWriters int
	failovers   int
	restarts    int
	idleVols    int
	idleWindow  time.Duration
	createPar   int
	quiesceMax  time.Duration
	kvDur       time.Duration
	kvClients   []int
	timeout     time.Duration
	settle      time.Duration
	quiet       time.Duration
	verbose     bool
	profileDir  string
	profileFor  time.Duration
	// profileTrace takes execution traces instead of CPU profiles.
	profileTrace bool
	readDur      time.Duration
	replicas     int
	// haltPollNs: the 4 KiB rows' second pass (haltpoll.go).
	haltPollNs int
}

func main() {
	var c config
	var clients string
	flag.StringVar(&c.bin, "bin", "bin", "directory with shoal-statd, shoal-vold and shoalctl (make build)")
	flag.IntVar(&c.seqMiB, "seq-mib", 64, "MiB written by each sequential write run")
	flag.IntVar(&c.reps, "reps", 5, "interleaved repetitions of the sequential and random write runs (the local baseline of one 64 MiB write scatters twofold and more between rounds: medians of 5)")
	flag.IntVar(&c.randMiB, "rand-file-mib", 16, "size of the file the random writes go to")
	flag.DurationVar(&c.randDur, "rand-duration", 3*time.Second, "length of each random write run")
	flag.IntVar(&c.randWriters, "rand-writers", 4, "writers at once, a file each, of the random writes' several-writer rows (local filesystem and the leader's mount); 0 or 1 leaves those rows out")
	flag.IntVar(&c.failovers, "failovers", 3, "leader kill-and-restart cycles")
	flag.IntVar(&c.restarts, "restarts", 3, "cycles of the leader's vold restarted under writes, each a stop (SIGTERM) and a kill (SIGKILL)")
	flag.IntVar(&c.idleVols, "idle-volumes", 1000, "idle volumes created for the idle cost")
	flag.DurationVar(&c.idleWindow, "idle", 10*time.Second, "length of each idle CPU measurement")
	flag.IntVar(&c.createPar, "create-parallel", 16, "concurrent CreateVolume calls")
	flag.DurationVar(&c.quiesceMax, "quiesce-wait", 3*time.Minute, "after creating the idle volumes, wait up to this long for every vold to use under 2% of a core")
	flag.DurationVar(&c.kvDur, "kv-duration", 5*time.Second, "length of each KV (and statd baseline) run")
	flag.StringVar(&clients, "kv-clients", "1,64", "concurrent KV clients of each run, comma-separated")
	flag.DurationVar(&c.timeout, "timeout", 60*time.Second, "give up on a failover, a restart or a wait after this long")
	flag.DurationVar(&c.settle, "settle", 3*time.Second, "quiet time after the cluster formed and before each kill")
	flag.DurationVar(&c.quiet, "quiet-wait", 10*time.Second, "before each phase, wait up to this long for other processes to use less than 0.25 CPUs")
	flag.BoolVar(&c.verbose, "v", false, "print devcluster progress on stderr")
	flag.IntVar(&c.replicas, "replicas", 3, "replicas of the write phases' volume (1 to 3; fewer than 3 needs -failovers 0): a measure of what each replica costs, the goals are for 3; with 1 the second mount is on a node that holds no replica")
	flag.StringVar(&c.profileDir, "profile", "", "directory for CPU profiles of every vold over the first -profile-duration of the sequential write phase, over the first random write run through each mount and of the several writers (rand-leader-node<i>.pprof, rand-follower-node<i>.pprof, rand-leader-many-node<i>.pprof), and over -profile-duration after the idle measurement with volumes, then a heap profile (vold runs with --debug-pprof)")
	flag.DurationVar(&c.profileFor, "profile-duration", 10*time.Second, "length of each -profile capture")
	flag.DurationVar(&c.readDur, "read-duration", 3*time.Second, "length of each run of the random read phase (4 KiB reads through the leader's mount, alone and beside a writer); 0 leaves the phase out")
	flag.BoolVar(&c.profileTrace, "profile-trace", false, "with -profile, take Go execution traces (<phase>-node<i>.trace) where CPU profiles would be taken")
	flag.IntVar(&c.haltPollNs, "halt-poll-ns", 200000, "measure the single-writer 4 KiB rows a second time with a KVM guest's halt polling ("+haltPollParam+") at this many ns, the kernel's default, when the machine runs with another value (put back afterwards); 0 leaves the second pass out")
	seed := flag.Uint64("seed", 1, "random seed (offsets, payloads)")
	flag.Parse()
	for _, s := range strings.Split(clients, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			fail("-kv-clients %q: want positive numbers separated by commas", clients)
		}
		c.kvClients = append(c.kvClients, n)
	}
	if c.seqMiB < 1 || c.reps < 1 || c.randMiB < 1 || c.randDur <= 0 || c.failovers < 0 || c.restarts < 0 || c.idleVols < 0 || c.createPar < 1 || c.idleWindow <= 0 || c.kvDur <= 0 {
		fail("-seq-mib, -reps, -rand-file-mib, -rand-duration, -idle, -kv-duration and -create-parallel must be positive")
	}
	if c.replicas < 1 || c.replicas > nodes {
		fail("-replicas %d: want 1 to %d", c.replicas, nodes)
	}
	if c.replicas < nodes && (c.failovers > 0 || c.restarts > 0) {
		fail("-replicas %d: the failover and restart phases need %d replicas (pass -failovers 0 -restarts 0)", c.replicas, nodes)
	}

	fmt.Printf("## Replicated volumes on %d real nodes (shoal-vold)\n\n", nodes)
	if os.Geteuid() != 0 {
		fmt.Printf("Skipped: this benchmark needs root (network namespaces, FUSE mounts).\n\n")
		progress("not root, skipped")
		return
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		fmt.Printf("Skipped: no /dev/fuse on this machine.\n\n")
		progress("no /dev/fuse, skipped")
		return
	}
	bin, err := filepath.Abs(c.bin)
	check(err)
	c.bin = bin
	for _, b := range []string{"shoal-statd", "shoal-vold", "shoalctl"} {
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
		progress("%v, tearing the cluster down", s)
		interrupted.Store(true)
		cancel()
		select {
		case <-mainDone:
		case <-time.After(3 * time.Second):
		}
		runCleanup()
		os.Exit(1)
	}()

	name := fmt.Sprintf("bv%d", rand.IntN(1_000_000))
	// The cgroup first, so that the cluster's processes are born in it; it
	// goes last, once they are gone.
	acct := cpuacct.New("shoal-bench-vold-", name, progress)
	atCleanup(acct.Close)

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
				progress("%v", err)
			}
		}
		// Whatever an interrupted Up or Down left under the default roots.
		if found, err := devcluster.Purge(dctx, name); err != nil {
			progress("purge %s: %v", name, err)
		} else if found {
			progress("purged what was left of %s", name)
		}
	})

	b := &bench{c: c, name: name, acct: acct, rng: rand.New(rand.NewPCG(*seed, 0x701d))}
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
	acct *cpuacct.Acct
	rng  *rand.Rand

	cl    *devcluster.Cluster
	ids   []string // node IDs; index 0 is node 1
	vold  []*client.Vold
	statd []*client.Statd
	local string // the local-filesystem baseline's directory
}

func (b *bench) openClients(i int) {
	var err error
	if b.vold[i-1] != nil {
		b.vold[i-1].Close()
		b.statd[i-1].Close()
	}
	b.vold[i-1], err = client.NewVold(b.cl.RunDir(i), client.Retry{Attempts: 3})
	check(err)
	b.statd[i-1], err = client.NewStatd(b.cl.RunDir(i), client.Retry{Attempts: 3})
	check(err)
}

func (b *bench) closeClients() {
	for i := range b.vold {
		if b.vold[i] != nil {
			b.vold[i].Close()
			b.statd[i].Close()
		}
	}
}

// nodeOf returns the index of the node with ID id (0 if none).
func (b *bench) nodeOf(id string) int {
	if k := slices.Index(b.ids, id); k >= 0 {
		return k + 1
	}
	return 0
}

func (b *bench) dumpLogs() {
	if b.cl == nil {
		return
	}
	for i := 1; i <= nodes; i++ {
		for _, d := range []string{"vold", "statd"} {
			if data, err := os.ReadFile(b.cl.LogPath(i, d)); err == nil {
				lines := strings.Split(strings.TrimSpace(string(data)), "\n")
				fmt.Fprintf(os.Stderr, "--- node %d %s log (tail) ---\n%s\n", i, d, strings.Join(lines[max(0, len(lines)-30):], "\n"))
			}
		}
	}
}

type results struct {
	name, subnet, version string
	fs                    string
	up                    time.Duration
	idle0                 idleResult
	seq                   seqResult
	rnd                   randResult
	rndPolled             *polledRand
	kv                    []kvResult
	kvLeader              int
	fo                    []foResult
	foLoad                phaseLoad
	rs                    []rsResult
	rsLoad                phaseLoad
	reads                 readResult
	create                createResult
	idleN                 idleResult
	acctExact             bool
}

func (b *bench) run(ctx context.Context, setCluster func(*devcluster.Cluster)) *results {
	c := b.c
	spec := devcluster.Spec{
		Name:      b.name,
		Nodes:     nodes,
		Subnet:    devcluster.AutoSubnet,
		BinDir:    c.bin,
		Daemons:   []string{"statd", "vold"},
		Args:      map[string][]string{"statd": {"--node-name", "n{node}"}},
		Bootstrap: true,
	}
	if c.profileDir != "" {
		check(os.MkdirAll(c.profileDir, 0o755))
		spec.Args["vold"] = []string{"--debug-pprof"}
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
	r := &results{name: b.name, subnet: cl.Subnet().String(), up: time.Since(start), acctExact: b.acct.Exact}
	if out, _, code, err := cl.Exec(ctx, 1, []string{filepath.Join(c.bin, "shoal-vold"), "--version"}, nil); err == nil && code == 0 {
		r.version = strings.TrimSpace(out)
	}
	// The local baseline lives next to the nodes' state (same filesystem);
	// Down removes it with them.
	b.local = filepath.Join(filepath.Dir(cl.NodeDir(1)), "local-baseline")
	check(os.MkdirAll(b.local, 0o755))
	r.fs = fsOf(b.local)

	b.vold = make([]*client.Vold, nodes)
	b.statd = make([]*client.Statd, nodes)
	for i := 1; i <= nodes; i++ {
		b.openClients(i)
		st, err := b.status(ctx, i)
		check(err)
		b.ids = append(b.ids, st.GetNodeId())
	}
	progress("waiting until every node sees every node alive and vold serves")
	check(b.waitReady(ctx, c.timeout))
	sleep(ctx, c.settle)

	progress("idle cost with no volume")
	r.idle0 = b.measureIdle(ctx, 0, false, nil)

	progress("creating volume %s (%d replicas)", benchVol, c.replicas)
	_, err = b.create(ctx, 1, benchVol, int32(c.replicas), volumeSize)
	check(err)
	check(b.waitHealthy(ctx, 1, benchVol, c.timeout))

	progress("sequential writes: %d × %d MiB", c.reps, c.seqMiB)
	r.seq = b.sequential(ctx)
	progress("random 4 KiB O_DSYNC writes: %d × %v", c.reps, c.randDur)
	r.rnd = b.random(ctx, true)
	r.rndPolled = b.randomPolled(ctx)

	if c.readDur > 0 {
		progress("random 4 KiB reads: %d × %v, alone and beside a writer", c.reps, c.readDur)
		r.reads = b.reads(ctx)
	}

	progress("KV puts")
	r.kv, r.kvLeader = b.kvPhase(ctx)

	l0 := b.acct.Take()
	for k := range c.failovers {
		progress("failover %d of %d", k+1, c.failovers)
		r.fo = append(r.fo, b.failover(ctx, k))
	}
	r.foLoad = phaseLoad{cpuacct.Phase{A: l0, B: b.acct.Take()}}

	l0 = b.acct.Take()
	for k := range c.restarts {
		for _, how := range []string{restartStop, restartKill} {
			progress("restart %d of %d: %s", k+1, c.restarts, how)
			r.rs = append(r.rs, b.restartCycle(ctx, k, how))
		}
	}
	r.rsLoad = phaseLoad{cpuacct.Phase{A: l0, B: b.acct.Take()}}

	if c.idleVols > 0 {
		b.removeBenchVolume(ctx)
		since := b.allMetrics()
		progress("creating %d idle volumes, %d at a time", c.idleVols, c.createPar)
		r.create = b.createMany(ctx)
		progress("waiting for quiescence")
		r.idleN = b.measureIdle(ctx, c.idleVols, true, since)
		// After the measurement, so that profiling does not add to it.
		b.startProfiles(ctx, "idle", c.profileFor)()
		b.heapProfiles(ctx, "idle")
	}
	return r
}

// status returns node i's statd cluster status.
func (b *bench) status(ctx context.Context, i int) (*clusterv1.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return b.statd[i-1].Cluster.Status(ctx, &clusterv1.StatusRequest{})
}

// waitReady waits until every statd reports every node alive and every
// vold lists volumes.
func (b *bench) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		ok := true
		for i := 1; i <= nodes && ok; i++ {
			st, err := b.status(ctx, i)
			if err != nil {
				ok = false
				break
			}
			alive := 0
			for _, m := range st.GetMembers() {
				if slices.Contains(b.ids, m.GetId()) && m.GetState() == "alive" {
					alive++
				}
			}
			ok = alive == nodes
			if ok {
				lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := b.vold[i-1].Volumes.ListVolumes(lctx, &volv1.ListVolumesRequest{})
				cancel()
				ok = err == nil
			}
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the cluster was not ready (every node alive everywhere, vold serving) after %v", timeout)
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

func (b *bench) create(ctx context.Context, i int, name string, replicas int32, size int64) (*volv1.Volume, error) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return b.vold[i-1].Volumes.CreateVolume(cctx, &volv1.CreateVolumeRequest{Name: name, Replicas: replicas, SizeBytes: size})
}

// inspect returns the volume's live status as node i sees it, without
// the members' digests.
func (b *bench) inspect(ctx context.Context, i int, name string) (*volv1.Volume, error) {
	ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return b.vold[i-1].Volumes.InspectVolume(ictx, &volv1.InspectVolumeRequest{Name: name})
}

// settled reports whether every member of v is alive with a small lag and
// the group has a leader.
func settled(v *volv1.Volume, maxLag uint64) bool {
	if v.GetLeader() == "" || v.GetHealth() == "unavailable" || len(v.GetMembers()) == 0 {
		return false
	}
	for _, m := range v.GetMembers() {
		if !m.GetAlive() || m.GetLag() > maxLag {
			return false
		}
	}
	return true
}

// waitHealthy waits until node i reports the volume healthy (every member
// alive and caught up, a leader).
func (b *bench) waitHealthy(ctx context.Context, i int, name string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		v, err := b.inspect(ctx, i, name)
		if err == nil && v.GetHealth() == "healthy" && settled(v, 0) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("volume %s not healthy after %v (last: %v %v)", name, timeout, v, err)
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

// mount mounts the volume on node i for user and returns its host path.
func (b *bench) mount(ctx context.Context, i int, name, user string) (string, error) {
	mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := b.vold[i-1].Volumes.Mount(mctx, &volv1.MountRequest{Name: name, User: user})
	if err != nil {
		return "", fmt.Errorf("mount %s on node %d: %w", name, i, err)
	}
	return resp.GetPath(), nil
}

func (b *bench) unmount(ctx context.Context, i int, name, user string) {
	mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := b.vold[i-1].Volumes.Unmount(mctx, &volv1.UnmountRequest{Name: name, User: user}); err != nil {
		progress("unmount %s for %s on node %d: %v", name, user, i, err)
	}
}

// leaderAndFollower returns the nodes of the volume's leader and of one
// follower member.
func (b *bench) leaderAndFollower(ctx context.Context, name string) (int, int, error) {
	v, err := b.inspect(ctx, 1, name)
	if err != nil {
		return 0, 0, err
	}
	leader := b.nodeOf(v.GetLeader())
	if leader == 0 {
		return 0, 0, fmt.Errorf("volume %s has no leader", name)
	}
	members := map[int]bool{}
	for _, m := range v.GetMembers() {
		if n := b.nodeOf(m.GetNode()); n != 0 && n != leader {
			return leader, n, nil
		}
		members[b.nodeOf(m.GetNode())] = true
	}
	if b.c.replicas == 1 {
		// No follower: the second mount is on a node without a replica,
		// which forwards every operation to the leader.
		for n := 1; n <= nodes; n++ {
			if !members[n] {
				return leader, n, nil
			}
		}
	}
	return 0, 0, fmt.Errorf("volume %s has no follower member", name)
}

// removeBenchVolume removes the bench volume. A refusal because it is
// in use is retried for a while: the last phase unmounts it on another
// node, and should that node's vold not answer node 1's question about
// its mounts, node 1 goes by its statd, which learns of the unmount
// through gossip.
func (b *bench) removeBenchVolume(ctx context.Context) {
	for deadline := time.Now().Add(b.c.timeout); ; {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := b.vold[0].Volumes.RemoveVolume(rctx, &volv1.RemoveVolumeRequest{Name: benchVol})
		cancel()
		if err == nil {
			return
		}
		if status.Code(err) != codes.FailedPrecondition || time.Now().After(deadline) {
			fail("remove %s: %v", benchVol, err)
		}
		sleep(ctx, 200*time.Millisecond)
	}
}

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
		load := phaseLoad{cpuacct.Phase{A: a, B: b.acct.Take()}}.Others()
		if load < quietCPU {
			return
		}
		if time.Now().After(deadline) {
			progress("other processes still use %.2f CPUs; measuring anyway", load)
		}
	}
}
