// Command netd measures Shoal's overlay as shoal-netd builds it (issue 5)
// against its baselines, all in one run on this machine, and prints a
// Markdown section on stdout (docs/BENCHMARKS.md style): TCP throughput
// (iperf3, one stream, median of several runs, interleaved) and round-trip
// latency (busybox ping, and a TCP echo timed in process) over
//
//	(a) a raw veth between two network namespaces (the underlay, as
//	    bench/wg measures it);
//	(b) a bare wireguard-go tunnel over that veth, built as bench/wg does
//	    with pkg/wg: one holder process per namespace (shoal-netd
//	    wg-holder, the very binary netd runs), keys and peers by wgctrl;
//	(c) task to task across two nodes through Shoal's overlay: a 2-node
//	    dev cluster (pkg/devcluster) with shoal-statd, shoal-schedd,
//	    shoal-netd and a containerd per node, two 1-replica services
//	    pinned to n1 and n2 running sleep, and iperf3 (the host's binary)
//	    run inside the tasks' network namespaces /var/run/netns/shoal-<task
//	    id>, to the server task's address (its /tasks/<id> field ip).
//
// and, to tell where a difference between (b) and (c) comes from, two
// paths between the dev cluster's node namespaces:
//
//	(d) node 1 → node 2 on the dev cluster's underlay (veth, host bridge,
//	    veth), no tunnel;
//	(e) node 1 → node 2's bridge address through netd's WireGuard tunnel,
//	    without the task hops (task veth and node bridge on both ends).
//
// The goal of issue 5 is (c) ≥ 0.8 × (b). Every iperf3 run also records
// where the machine's CPU went (iperf3, the wireguard-go holders, ksoftirqd,
// Shoal's daemons with containerd and this benchmark, and other processes),
// since on a small machine the tunnel competes with everything else.
//
// On the same cluster, services.go then measures the rest of issue 5:
// published-port requests/s through a node without the replica against
// straight to the task, service DNS queries/s and latency, the time from
// a task turning healthy (or unhealthy) to its address entering (or
// leaving) the DNS answer, DNS back after netd restarts (goal ≤ 1 s), and
// a new node reachable from the others after joining (goal ≤ 2 s; the
// node is added to the running dev cluster for it).
//
// It needs root, iperf3, busybox, containerd and runc, and the binaries of
// `make build`. Everything it makes (namespaces, holders, iperf3 servers,
// the dev cluster with its task namespaces) is removed on exit, on failure
// and on SIGINT/SIGTERM/SIGHUP. BENCH_QUICK=1 scales it down.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/shoal-dev/shoal/pkg/client"
	"github.com/shoal-dev/shoal/pkg/devcluster"
	"github.com/shoal-dev/shoal/pkg/overlay"
	"github.com/shoal-dev/shoal/pkg/sched"
	"github.com/shoal-dev/shoal/pkg/testimage"
	"github.com/shoal-dev/shoal/pkg/wg"
	netv1 "github.com/shoal-dev/shoal/proto/shoal/net/v1"
	schedv1 "github.com/shoal-dev/shoal/proto/shoal/sched/v1"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

const (
	benchWGPort = 51820 // the bare tunnel's, in namespaces of its own
	iperfPort   = 5201
	underlayMTU = 1500
	imageRef    = "local/busybox:latest"
	nodes       = 2
)

type config struct {
	bin     string
	seconds int
	runs    int
	pings   int
	echoes  int
	size    int
	diag    bool
	quiet   time.Duration
	timeout time.Duration
	verbose bool

	// published ports, service DNS and netd's timed points (services.go)
	loadFor     time.Duration
	loadMax     int
	loadConns   int
	dnsFor      time.Duration
	healthTasks int
	restarts    int
	newNode     bool
}

// path is one way from a source namespace to an address in a destination
// namespace.
type path struct {
	key, name string
	src, dst  string // netns paths
	dstAddr   netip.Addr
	mtu       int
	// dev is the WireGuard device on the source side whose counters show
	// the traffic went through the tunnel (nil: no tunnel).
	dev *wg.Device
}

type measured struct {
	gbps      []float64 // per iperf3 run, received
	retrans   []int
	bytes     float64 // received by the server, all runs
	tunnelTx  float64 // bytes the source's WireGuard device sent meanwhile
	cpu       []cpuUse
	pingMin   float64 // ms
	pingAvg   float64
	pingMax   float64
	pingLoss  string
	echo      []time.Duration
	hasTunnel bool
}

func main() {
	quick := os.Getenv("BENCH_QUICK") == "1"
	def := config{seconds: 5, runs: 3, pings: 20, echoes: 2000, size: 64, diag: true, quiet: 5 * time.Second,
		loadFor: 3 * time.Second, loadMax: 300_000, loadConns: 4, dnsFor: 3 * time.Second, healthTasks: 6, restarts: 3, newNode: true}
	if quick {
		def = config{seconds: 2, runs: 1, pings: 10, echoes: 500, size: 64, diag: false, quiet: 0,
			loadFor: time.Second, loadMax: 50_000, loadConns: 4, dnsFor: time.Second, healthTasks: 2, restarts: 1, newNode: true}
	}
	var c config
	flag.StringVar(&c.bin, "bin", "bin", "directory with shoal-statd, shoal-schedd, shoal-netd and shoalctl (make build)")
	flag.IntVar(&c.seconds, "t", def.seconds, "seconds per iperf3 run")
	flag.IntVar(&c.runs, "runs", def.runs, "iperf3 runs per path (the median is reported)")
	flag.IntVar(&c.pings, "pings", def.pings, "busybox pings per path (0.2 s apart)")
	flag.IntVar(&c.echoes, "echoes", def.echoes, "TCP echo round trips per path")
	flag.IntVar(&c.size, "echo-size", def.size, "bytes per TCP echo message")
	flag.BoolVar(&c.diag, "diag", def.diag, "also measure (d) and (e), node to node, to locate a difference between (b) and (c)")
	flag.DurationVar(&c.quiet, "quiet-wait", def.quiet, "before measuring, wait up to this long for other processes to use less than 0.25 CPUs")
	flag.DurationVar(&c.timeout, "timeout", 90*time.Second, "give up on the cluster's network or tasks after this long")
	flag.BoolVar(&c.verbose, "v", false, "print devcluster progress on stderr")
	flag.DurationVar(&c.loadFor, "load-duration", def.loadFor, "published ports: length of each HTTP load run (one per path, keep-alive mode and -runs)")
	flag.IntVar(&c.loadMax, "load-requests", def.loadMax, "published ports: at most this many requests per load run")
	flag.IntVar(&c.loadConns, "load-conns", def.loadConns, "published ports and DNS: concurrent clients")
	flag.DurationVar(&c.dnsFor, "dns-duration", def.dnsFor, "DNS: length of each query load run")
	flag.IntVar(&c.healthTasks, "health-tasks", def.healthTasks, "DNS updates: replicas of the health-checked service, and samples of each transition")
	flag.IntVar(&c.restarts, "restarts", def.restarts, "netd restarts timed (DNS and the published port back)")
	flag.BoolVar(&c.newNode, "new-node", def.newNode, "add a third node and time until the others reach it after it joins")
	flag.Parse()
	if c.seconds < 1 || c.runs < 1 || c.pings < 1 || c.echoes < 1 || c.size < 1 {
		fail("-t, -runs, -pings, -echoes and -echo-size must be positive")
	}
	if c.loadFor <= 0 || c.loadMax < 1 || c.loadConns < 1 || c.dnsFor <= 0 || c.healthTasks < 1 || c.restarts < 0 {
		fail("-load-duration, -load-requests, -load-conns, -dns-duration and -health-tasks must be positive, -restarts not negative")
	}

	fmt.Printf("## Overlay: task to task through shoal-netd vs a bare WireGuard tunnel\n\n")
	if os.Geteuid() != 0 {
		fmt.Printf("Skipped: this benchmark needs root (network namespaces, TUN, containerd).\n\n")
		progress("not root, skipped")
		return
	}
	for _, b := range []string{"iperf3", "busybox", "containerd", "runc"} {
		if _, err := exec.LookPath(b); err != nil {
			fmt.Printf("Skipped: %s is missing (Debian: apt-get install -y --no-install-recommends iperf3 busybox containerd runc).\n\n", b)
			progress("%s missing, skipped", b)
			return
		}
	}
	bin, err := filepath.Abs(c.bin)
	check(err)
	c.bin = bin
	for _, b := range []string{"shoal-statd", "shoal-schedd", "shoal-netd", "shoalctl"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			fail("%v (run make build first, or pass -bin)", err)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		s := <-sigs
		fmt.Fprintf(os.Stderr, "netd bench: %v, cleaning up\n", s)
		interrupted.Store(true)
		cancel()
		runCleanup()
		os.Exit(1)
	}()
	defer runCleanup()

	b := &bench{c: c, start: time.Now()}
	b.ownPid = os.Getpid()
	progress("bare namespaces and tunnel for (a) and (b)")
	b.setupBare()
	progress("2-node dev cluster with statd, schedd, netd and containerd")
	b.setupCluster(ctx)
	b.setupServers()
	b.paths = []path{
		{key: "a", name: "(a) raw veth, namespace to namespace", src: b.nsA, dst: b.nsB, dstAddr: b.bUnder, mtu: underlayMTU},
		{key: "b", name: "(b) bare wireguard-go tunnel over (a)", src: b.nsA, dst: b.nsB, dstAddr: b.bGW, mtu: b.bareMTU, dev: b.aDev},
		{key: "c", name: "(c) task → task across 2 nodes through netd", src: b.taskNs[0], dst: b.taskNs[1], dstAddr: b.taskIP[1], mtu: b.netdMTU, dev: b.netdDev[0]},
	}
	if c.diag {
		b.paths = append(b.paths,
			path{key: "d", name: "(d) node → node, dev cluster underlay", src: b.cl.NetnsPath(1), dst: b.cl.NetnsPath(2), dstAddr: b.nodeAddr[1], mtu: b.nodeMTU},
			path{key: "e", name: "(e) node → node bridge through netd's tunnel", src: b.cl.NetnsPath(1), dst: b.cl.NetnsPath(2), dstAddr: b.nodeGW[1], mtu: b.netdMTU, dev: b.netdDev[0]},
		)
	}
	b.warmUp()
	b.res = make([]measured, len(b.paths))
	b.waitQuiet(ctx)
	// Interleave the runs so drift on the machine hits every path alike.
	for r := range c.runs {
		for i, p := range b.paths {
			progress("iperf3 run %d/%d over %s", r+1, c.runs, p.name)
			b.iperf(i)
		}
	}
	for i, p := range b.paths {
		progress("ping and TCP echo over %s", p.name)
		m := &b.res[i]
		m.pingMin, m.pingAvg, m.pingMax, m.pingLoss = b.pingRTT(p)
		m.echo = b.tcpEcho(p)
	}
	b.collectInfo(ctx)
	b.measureServices(ctx)
	b.elapsed = time.Since(b.start)
	runCleanup()
	b.report()
	b.reportServices()
}

type bench struct {
	c       config
	start   time.Time
	elapsed time.Duration
	ownPid  int

	// (a) and (b)
	nsA, nsB      string
	bUnder, bGW   netip.Addr
	bareMTU       int
	aIface, bIfc  string
	aDev, bDev    *wg.Device
	benchHolders  []int
	kernelWG      bool
	bareLogDir    string
	bareHolderExe string

	// the cluster
	cl         *devcluster.Cluster
	name       string
	nodeIDs    []string
	nodeAddr   []netip.Addr
	nodeGW     []netip.Addr
	nodeMTU    int
	netdMTU    int
	netdMode   string
	netdIfaces []string
	netdDev    []*wg.Device
	netdPids   []int
	services   []string
	taskIDs    []string
	taskIP     []netip.Addr
	taskNs     []string
	clusterUp  time.Duration
	tasksUp    time.Duration
	version    string
	containerd string

	servers map[string]*exec.Cmd // iperf3 server per destination netns
	paths   []path
	res     []measured

	peerInfo string

	statds []*client.Statd
	scheds []*client.Schedd
	svc    svcResults
}

// ---- (a) and (b): as bench/wg ----

func (b *bench) setupBare() {
	tag := fmt.Sprintf("%05x", os.Getpid()&0xfffff)
	b.bUnder = netip.MustParseAddr("172.31.0.2")
	b.bGW = netip.MustParseAddr("10.42.2.1")
	aGW := netip.MustParseAddr("10.42.1.1")
	b.aIface, b.bIfc = "nb"+tag+"a", "nb"+tag+"b"
	b.kernelWG = wg.KernelAvailable()
	logDir, err := os.MkdirTemp("", "shoal-bench-netd-")
	check(err)
	b.bareLogDir = logDir
	atCleanup(func() { os.RemoveAll(logDir) })
	ns := func(suffix string) string {
		name := "shnb-" + tag + "-" + suffix
		p, err := wg.CreateNetns(name)
		check(err)
		atCleanup(func() {
			if err := wg.DeleteNetns(name); err != nil {
				progress("%v", err)
			}
		})
		return p
	}
	b.nsA, b.nsB = ns("a"), ns("b")
	na, err := wg.OpenNetlink(b.nsA)
	check(err)
	atCleanup(na.Close)
	nb, err := wg.OpenNetlink(b.nsB)
	check(err)
	atCleanup(nb.Close)
	check(na.AddVeth("ul0", "ul0", b.nsB, underlayMTU))
	atCleanup(func() { na.DeleteLink("ul0") })
	for i, n := range []*wg.Netlink{na, nb} {
		check(n.ReplaceAddr("ul0", netip.PrefixFrom(netip.AddrFrom4([4]byte{172, 31, 0, byte(i + 1)}), 24)))
		check(n.SetLinkUp("ul0", 0))
		check(n.SetLinkUp("lo", 0))
	}
	under, err := na.RouteMTU(b.bUnder)
	check(err)
	b.bareMTU = overlay.MTU(under)

	// The holder is the binary netd runs its own holders with.
	b.bareHolderExe = filepath.Join(b.c.bin, "shoal-netd")
	type side struct {
		ns, iface string
		n         *wg.Netlink
		gw, under netip.Addr
		dev       **wg.Device
		key       wgtypes.Key
	}
	sides := []*side{
		{ns: b.nsA, iface: b.aIface, n: na, gw: aGW, under: netip.MustParseAddr("172.31.0.1"), dev: &b.aDev},
		{ns: b.nsB, iface: b.bIfc, n: nb, gw: b.bGW, under: b.bUnder, dev: &b.bDev},
	}
	for _, s := range sides {
		check(s.n.EnsureBridge("shoal0", netip.PrefixFrom(s.gw, 24), b.bareMTU))
		pid, err := wg.StartHolderWith(b.bareHolderExe, []string{"wg-holder", "--iface", s.iface, "--mtu", strconv.Itoa(b.bareMTU)}, s.iface,
			wg.HolderOptions{Netns: s.ns, Log: filepath.Join(logDir, s.iface+".log")})
		check(err)
		b.benchHolders = append(b.benchHolders, pid)
		iface := s.iface
		atCleanup(func() {
			if err := wg.StopHolder(iface, 3*time.Second); err != nil {
				progress("%v", err)
			}
			var ws unix.WaitStatus
			unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		})
		d, err := wg.Open(s.iface)
		check(err)
		atCleanup(func() { d.Close() })
		*s.dev = d
		s.key, err = wgtypes.GeneratePrivateKey()
		check(err)
		check(d.SetPrivateKey(s.key))
		check(d.SetListenPort(benchWGPort))
		check(s.n.ReplaceRoute(netip.MustParsePrefix("10.42.0.0/16"), s.iface, s.gw))
	}
	for i, s := range sides {
		o := sides[1-i]
		_, err := (*s.dev).ApplyPeers([]overlay.Peer{{
			PublicKey:  o.key.PublicKey(),
			Endpoint:   netip.AddrPortFrom(o.under, benchWGPort),
			AllowedIPs: []netip.Prefix{netip.PrefixFrom(o.gw, 24).Masked()},
		}})
		check(err)
	}
}

// ---- (c): the dev cluster ----

func (b *bench) setupCluster(ctx context.Context) {
	c := b.c
	b.name = fmt.Sprintf("bn%d", rand.IntN(1_000_000))
	tmp, err := os.MkdirTemp("", "shoal-bench-netd-img-")
	check(err)
	atCleanup(func() { os.RemoveAll(tmp) })

	var cmu sync.Mutex
	var cl *devcluster.Cluster
	// Registered before Up, so an interrupted Up is purged too.
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
		if found, err := devcluster.Purge(dctx, b.name); err != nil {
			progress("purge %s: %v", b.name, err)
		} else if found {
			progress("purged what was left of %s", b.name)
		}
		// netd pins task namespaces at /var/run/netns/shoal-<task id>,
		// outside the cluster's directories; Down does not know them.
		for _, id := range append(slices.Clone(b.taskIDs), b.svc.tasks()...) {
			name := "shoal-" + id
			if _, err := os.Stat(wg.NetnsPath(name)); err == nil {
				progress("dev cluster Down left task namespace %s; removing it", name)
				if err := wg.DeleteNetns(name); err != nil {
					progress("%v", err)
				}
			}
		}
		// Holders killed by Down leave their UAPI sockets.
		for _, iface := range b.netdIfaces {
			if !wg.HolderAlive(iface) {
				if err := os.Remove(wg.SocketPath(iface)); err == nil {
					progress("removed stale WireGuard socket %s", wg.SocketPath(iface))
				}
			}
		}
	})

	spec := devcluster.Spec{
		Name:      b.name,
		Nodes:     nodes,
		Subnet:    devcluster.AutoSubnet,
		BinDir:    c.bin,
		Daemons:   []string{"statd", "schedd", "netd"},
		Extra:     []devcluster.ProcessSpec{devcluster.ContainerdProcess("")},
		Args:      map[string][]string{"statd": {"--node-name", "n{node}"}, "schedd": devcluster.ScheddArgs()},
		Bootstrap: true,
	}
	if c.verbose {
		spec.Logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, "devcluster: "+format+"\n", args...) }
	}
	t0 := time.Now()
	x, err := devcluster.Up(ctx, spec)
	check(err)
	cmu.Lock()
	cl = x
	cmu.Unlock()
	b.cl = x
	atFailure(b.dumpLogs)
	if out, err := exec.Command("containerd", "--version").Output(); err == nil {
		b.containerd = strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
	}
	if out, _, code, err := x.Exec(ctx, 1, []string{filepath.Join(c.bin, "shoal-netd"), "--version"}, nil); err == nil && code == 0 {
		b.version = strings.TrimSpace(out)
	}

	statds := make([]*client.Statd, nodes)
	scheds := make([]*client.Schedd, nodes)
	netds := make([]*client.Netd, nodes)
	b.statds, b.scheds = statds, scheds
	for i := range nodes {
		statds[i], err = client.NewStatd(x.RunDir(i+1), client.Retry{Attempts: 3})
		check(err)
		atCleanup(func() { statds[i].Close() })
		scheds[i], err = client.NewSchedd(x.RunDir(i+1), client.Retry{Attempts: 3})
		check(err)
		atCleanup(func() { scheds[i].Close() })
		netds[i], err = client.NewNetd(x.RunDir(i+1), client.Retry{Attempts: 3})
		check(err)
		defer netds[i].Close()
		a, err := netip.ParseAddr(x.Addr(i + 1))
		check(err)
		b.nodeAddr = append(b.nodeAddr, a)
	}
	nl, err := wg.OpenNetlink(x.NetnsPath(1))
	check(err)
	b.nodeMTU, err = nl.RouteMTU(b.nodeAddr[1])
	nl.Close()
	check(err)

	// The overlay: every netd ready, with the other node as its peer.
	progress("waiting for netd's overlay on both nodes")
	deadline := time.Now().Add(c.timeout)
	sts := make([]*netv1.StatusResponse, nodes)
	for i := range nodes {
		for {
			cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
			st, err := netds[i].Status(cctx, &netv1.StatusRequest{})
			ccancel()
			if err == nil && len(st.GetPeers()) == nodes-1 && st.GetPeers()[0].GetEndpoint() != "" {
				sts[i] = st
				break
			}
			if time.Now().After(deadline) {
				fail("node %d: netd's overlay not ready after %v (status %v, err %v)", i+1, c.timeout, st, err)
			}
			check(sleep(ctx, 100*time.Millisecond))
		}
		st := sts[i]
		b.nodeIDs = append(b.nodeIDs, st.GetNodeId())
		b.netdIfaces = append(b.netdIfaces, st.GetInterface())
		b.netdMode = st.GetMode()
		b.netdMTU = int(st.GetMtu())
		sub, err := netip.ParsePrefix(st.GetSubnet())
		check(err)
		b.nodeGW = append(b.nodeGW, sub.Masked().Addr().Next())
		d, err := wg.Open(st.GetInterface())
		check(err)
		atCleanup(func() { d.Close() })
		b.netdDev = append(b.netdDev, d)
		if b.netdMode == "userspace" {
			pid, err := wg.HolderPID(st.GetInterface())
			check(err)
			b.netdPids = append(b.netdPids, pid)
		}
	}

	// Schedulers ready, the image on both nodes (loaded in parallel).
	for i := range nodes {
		for {
			cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := scheds[i].ListServices(cctx, &schedv1.ListServicesRequest{})
			ccancel()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				fail("node %d: scheduler not ready after %v: %v", i+1, c.timeout, err)
			}
			check(sleep(ctx, 100*time.Millisecond))
		}
	}
	img := filepath.Join(tmp, "busybox.tar")
	_, err = testimage.WriteFile(img, "oci", testimage.Default())
	check(err)
	var wgr sync.WaitGroup
	errs := make([]error, nodes)
	for i := range nodes {
		wgr.Go(func() {
			if out, errOut, code, err := x.Ctl(ctx, i+1, "image", "load", img); err != nil || code != 0 {
				errs[i] = fmt.Errorf("node %d: shoalctl image load: exit %d %v\n%s%s", i+1, code, err, out, errOut)
			}
		})
	}
	wgr.Wait()
	check(errors.Join(errs...))
	b.clusterUp = time.Since(t0)

	// Two services, one task on each node; perf1's task also takes the
	// published port's load (its server runs in this process, in the task's
	// namespace: see services.go).
	t1 := time.Now()
	for i := range nodes {
		name := fmt.Sprintf("perf%d", i+1)
		s := sched.ServiceSpec{Name: name, Image: imageRef, Replicas: 1,
			Args: []string{"sleep", "1000000"}, Constraints: []string{fmt.Sprintf("node.name==n%d", i+1)}}
		if i == 0 {
			s.Ports = []sched.Port{{Host: publishedPort, Container: httpPort}}
		}
		spec, err := json.Marshal(s)
		check(err)
		cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = scheds[0].CreateService(cctx, &schedv1.CreateServiceRequest{Spec: spec})
		ccancel()
		check(err)
		b.services = append(b.services, name)
	}
	progress("waiting for the tasks to run and get their addresses")
	for i, name := range b.services {
		var id string
		for {
			cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
			resp, err := scheds[0].ListTasks(cctx, &schedv1.ListTasksRequest{Service: name})
			ccancel()
			if err == nil {
				for _, t := range resp.GetTasks() {
					if t.GetState() == string(sched.TaskRunning) && t.GetCurrent() {
						if t.GetNode() != b.nodeIDs[i] {
							fail("service %s: task %s runs on %s, not on n%d (%s)", name, t.GetId(), t.GetNode(), i+1, b.nodeIDs[i])
						}
						id = t.GetId()
					}
				}
			}
			if id != "" {
				break
			}
			if time.Now().After(deadline) {
				fail("service %s: no running task after %v (err %v)", name, c.timeout, err)
			}
			check(sleep(ctx, 100*time.Millisecond))
		}
		b.taskIDs = append(b.taskIDs, id)
		var ip netip.Addr
		for {
			cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
			resp, err := statds[i].Get(cctx, &statev1.GetRequest{Key: sched.TaskKey(id)})
			ccancel()
			if err == nil {
				if a, perr := netip.ParseAddr(resp.GetDocument().GetFields()["ip"].GetStringValue()); perr == nil {
					ip = a
					break
				}
			}
			if time.Now().After(deadline) {
				fail("task %s: no ip field after %v (err %v)", id, c.timeout, err)
			}
			check(sleep(ctx, 100*time.Millisecond))
		}
		ns := wg.NetnsPath("shoal-" + id)
		if _, err := os.Stat(ns); err != nil {
			fail("task %s: %v", id, err)
		}
		b.taskIP = append(b.taskIP, ip)
		b.taskNs = append(b.taskNs, ns)
		progress("task %s of %s on n%d: %s in %s", id, name, i+1, ip, ns)
	}
	b.tasksUp = time.Since(t1)
}

func (b *bench) dumpLogs() {
	if b.cl == nil {
		return
	}
	for i := 1; i <= nodes; i++ {
		for _, d := range []string{"netd", "schedd"} {
			data, err := os.ReadFile(b.cl.LogPath(i, d))
			if err != nil {
				continue
			}
			lines := strings.Split(strings.TrimSpace(string(data)), "\n")
			fmt.Fprintf(os.Stderr, "---- node %d %s log (tail)\n%s\n", i, d, strings.Join(lines[max(0, len(lines)-25):], "\n"))
		}
	}
}

// ---- iperf3 servers and the runs ----

// setupServers starts a long-running iperf3 server in every destination
// namespace: B, node 2's task and node 2 itself.
func (b *bench) setupServers() {
	b.servers = map[string]*exec.Cmd{}
	dsts := []string{b.nsB, b.taskNs[1]}
	if b.c.diag {
		dsts = append(dsts, b.cl.NetnsPath(2))
	}
	for _, ns := range dsts {
		srv := exec.Command("iperf3", "-s", "-p", strconv.Itoa(iperfPort))
		srv.Stdout, srv.Stderr = io.Discard, io.Discard
		check(wg.InNetns(ns, srv.Start))
		b.servers[ns] = srv
		atCleanup(func() {
			srv.Process.Kill()
			srv.Wait()
		})
	}
	// Runs first at cleanup: clients still running would otherwise linger.
	atCleanup(func() {
		running.Range(func(k, _ any) bool {
			k.(*exec.Cmd).Process.Kill()
			return true
		})
	})
}

// warmUp waits until every path reaches its server (WireGuard handshakes,
// ARP, servers listening).
func (b *bench) warmUp() {
	deadline := time.Now().Add(15 * time.Second)
	for _, p := range b.paths {
		for {
			var c net.Conn
			err := wg.InNetns(p.src, func() (err error) {
				c, err = net.DialTimeout("tcp4", netip.AddrPortFrom(p.dstAddr, iperfPort).String(), time.Second)
				return err
			})
			if err == nil {
				c.Close()
				break
			}
			if time.Now().After(deadline) {
				fail("the iperf3 server is not reachable over %s: %v", p.name, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	time.Sleep(200 * time.Millisecond) // the servers see the probes out
}

// running holds the commands inNs is waiting for.
var running sync.Map

// inNs runs a command in the namespace at ns and returns it once done,
// with its stdout.
func inNs(ns string, timeout time.Duration, name string, args ...string) (*exec.Cmd, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	if interrupted.Load() { // cleaning up: start nothing more
		return cmd, nil, errors.New("interrupted")
	}
	if err := wg.InNetns(ns, cmd.Start); err != nil {
		return cmd, nil, err
	}
	running.Store(cmd, struct{}{})
	err := cmd.Wait()
	running.Delete(cmd)
	if err != nil {
		return cmd, []byte(out.String()), fmt.Errorf("%s: %w: %s", name, err, errb.String())
	}
	return cmd, []byte(out.String()), nil
}

func (b *bench) iperf(i int) {
	p := b.paths[i]
	m := &b.res[i]
	var tx0 int64
	if p.dev != nil {
		m.hasTunnel = true
		tx0 = txBytes(p.dev)
	}
	var s0 sample
	var cmd *exec.Cmd
	var out []byte
	var err error
	for try := range 3 { // the server takes one client at a time; retry if it is still busy
		s0 = b.sample()
		cmd, out, err = inNs(p.src, time.Duration(b.c.seconds+20)*time.Second, "iperf3", "-c", p.dstAddr.String(), "-p", strconv.Itoa(iperfPort), "-t", strconv.Itoa(b.c.seconds), "-J")
		if err == nil {
			break
		}
		if interrupted.Load() {
			break
		}
		progress("iperf3 try %d: %v", try+1, err)
		time.Sleep(time.Second)
	}
	check(err)
	s1 := b.sample()
	var r struct {
		End struct {
			SumSent struct {
				Retransmits int `json:"retransmits"`
			} `json:"sum_sent"`
			SumReceived struct {
				Bytes         float64 `json:"bytes"`
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
		Error string `json:"error"`
	}
	check(json.Unmarshal(out, &r))
	if r.Error != "" {
		fail("iperf3 over %s: %s", p.name, r.Error)
	}
	m.gbps = append(m.gbps, r.End.SumReceived.BitsPerSecond/1e9)
	m.retrans = append(m.retrans, r.End.SumSent.Retransmits)
	m.bytes += r.End.SumReceived.Bytes
	if p.dev != nil {
		m.tunnelTx += float64(txBytes(p.dev) - tx0)
	}
	var client time.Duration
	if cmd.ProcessState != nil {
		client = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}
	m.cpu = append(m.cpu, s0.use(s1, client))
}

func txBytes(d *wg.Device) int64 {
	ps, err := d.Peers()
	if err != nil {
		return 0
	}
	var n int64
	for _, p := range ps {
		n += p.TxBytes
	}
	return n
}

var rttRE = regexp.MustCompile(`round-trip min/avg/max = ([0-9.]+)/([0-9.]+)/([0-9.]+) ms`)
var lossRE = regexp.MustCompile(`(\d+) packets transmitted, (\d+) packets received`)

func (b *bench) pingRTT(p path) (minMs, avgMs, maxMs float64, loss string) {
	n := b.c.pings
	_, out, err := inNs(p.src, time.Duration(n)*time.Second+10*time.Second, "busybox", "ping", "-c", strconv.Itoa(n), "-i", "0.2", "-W", "3", p.dstAddr.String())
	check(err)
	m := rttRE.FindSubmatch(out)
	if m == nil {
		fail("unexpected ping output: %s", out)
	}
	f := func(b []byte) float64 { v, _ := strconv.ParseFloat(string(b), 64); return v }
	if l := lossRE.FindSubmatch(out); l != nil {
		loss = string(l[2]) + "/" + string(l[1])
	}
	return f(m[1]), f(m[2]), f(m[3]), loss
}

// tcpEcho times round trips of a message over one TCP connection (Nagle
// off) from the path's source to an echo server in its destination.
func (b *bench) tcpEcho(p path) []time.Duration {
	n, size := b.c.echoes, b.c.size
	var ln net.Listener
	check(wg.InNetns(p.dst, func() (err error) {
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(p.dstAddr, 0).String())
		return err
	}))
	defer ln.Close()
	var wgr sync.WaitGroup
	wgr.Go(func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c)
	})
	var c net.Conn
	check(wg.InNetns(p.src, func() (err error) {
		c, err = net.DialTimeout("tcp4", ln.Addr().String(), 5*time.Second)
		return err
	}))
	msg, buf := make([]byte, size), make([]byte, size)
	for i := range msg {
		msg[i] = byte(i)
	}
	c.SetDeadline(time.Now().Add(2 * time.Minute))
	out := make([]time.Duration, 0, n)
	for i := range n + n/10 { // the first tenth warms up
		t0 := time.Now()
		if _, err := c.Write(msg); err != nil {
			check(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			check(err)
		}
		if i >= n/10 {
			out = append(out, time.Since(t0))
		}
	}
	c.Close()
	wgr.Wait()
	slices.Sort(out)
	return out
}

// ---- CPU accounting ----

// clockTicks is USER_HZ, the unit of /proc/stat and /proc/<pid>/stat.
const clockTicks = 100

// sample is the machine's CPU time and that of the processes the
// benchmark knows, at one instant.
type sample struct {
	at                         time.Time
	busy, softirq, steal       time.Duration // machine: user+nice+system+irq+softirq; of which softirq; steal apart
	servers, holders, ksoftirq time.Duration
	shoal                      time.Duration // the cluster's daemons and containerds, and this process
}

// cpuUse is what one iperf3 run cost, in CPUs (cores' worth).
type cpuUse struct {
	busy, softirq, steal  float64
	iperf, wireguard      float64
	ksoftirqd, shoal      float64
	others                float64
	wall                  time.Duration
	clientCPU, serversCPU time.Duration
}

func (b *bench) sample() sample {
	s := sample{at: time.Now()}
	if data, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(data), "\n")
		f := strings.Fields(line)
		// cpu user nice system idle iowait irq softirq steal guest guest_nice
		for i, v := range f[1:] {
			n, _ := strconv.ParseInt(v, 10, 64)
			d := time.Duration(n) * time.Second / clockTicks
			switch i {
			case 0, 1, 2, 5:
				s.busy += d
			case 6:
				s.busy += d
				s.softirq += d
			case 7:
				s.steal += d
			}
		}
	}
	for _, srv := range b.servers {
		s.servers += procCPU(srv.Process.Pid)
	}
	for _, pid := range append(slices.Clone(b.benchHolders), b.netdPids...) {
		s.holders += procCPU(pid)
	}
	for _, pid := range ksoftirqdPids() {
		s.ksoftirq += procCPU(pid)
	}
	for _, pid := range append(b.clusterPids(), b.ownPid) {
		s.shoal += procCPU(pid)
	}
	return s
}

func (a sample) use(b sample, client time.Duration) cpuUse {
	wall := b.at.Sub(a.at)
	secs := wall.Seconds()
	u := func(d time.Duration) float64 { return max(d.Seconds(), 0) / secs }
	r := cpuUse{wall: wall, clientCPU: client, serversCPU: b.servers - a.servers}
	r.busy, r.softirq, r.steal = u(b.busy-a.busy), u(b.softirq-a.softirq), u(b.steal-a.steal)
	r.iperf = u(client + b.servers - a.servers)
	r.wireguard = u(b.holders - a.holders)
	r.ksoftirqd = u(b.ksoftirq - a.ksoftirq)
	r.shoal = u(b.shoal - a.shoal)
	r.others = max(r.busy-r.iperf-r.wireguard-r.ksoftirqd-r.shoal, 0)
	return r
}

var clusterPidsOnce struct {
	sync.Once
	pids []int
}

// clusterPids are the dev cluster's daemons and containerds.
func (b *bench) clusterPids() []int {
	clusterPidsOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := b.cl.Status(ctx)
		if err != nil {
			return
		}
		for _, n := range st.Nodes {
			for _, p := range n.Processes {
				if p.Running {
					clusterPidsOnce.pids = append(clusterPidsOnce.pids, p.PID)
				}
			}
		}
	})
	return clusterPidsOnce.pids
}

var ksoftirqd struct {
	sync.Once
	pids []int
}

func ksoftirqdPids() []int {
	ksoftirqd.Do(func() {
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err == nil && strings.HasPrefix(string(comm), "ksoftirqd/") {
				ksoftirqd.pids = append(ksoftirqd.pids, pid)
			}
		}
	})
	return ksoftirqd.pids
}

// procCPU is the user+system time of process pid (its threads, not its
// reaped children); 0 if it is gone.
func procCPU(pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	var t int64
	for _, i := range []int{11, 12} { // utime stime
		v, _ := strconv.ParseInt(f[i], 10, 64)
		t += v
	}
	return time.Duration(t) * time.Second / clockTicks
}

// waitQuiet waits up to the configured limit for a second in which
// processes other than ours use less than a quarter of a CPU.
func (b *bench) waitQuiet(ctx context.Context) {
	const quietCPU = 0.25
	deadline := time.Now().Add(b.c.quiet)
	for time.Now().Before(deadline) {
		a := b.sample()
		if sleep(ctx, time.Second) != nil {
			return
		}
		load := a.use(b.sample(), 0).others
		if load < quietCPU {
			return
		}
		if time.Now().After(deadline) {
			progress("other processes still use %.2f CPUs; measuring anyway", load)
		}
	}
}

// collectInfo records the tunnel's peers as netd on node 1 sees them.
func (b *bench) collectInfo(ctx context.Context) {
	nd, err := client.NewNetd(b.cl.RunDir(1), client.Retry{Attempts: 3})
	if err != nil {
		return
	}
	defer nd.Close()
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := nd.Status(cctx, &netv1.StatusRequest{})
	if err != nil || len(st.GetPeers()) == 0 {
		return
	}
	p := st.GetPeers()[0]
	hs := "never"
	if p.GetLastHandshake() != nil {
		hs = time.Since(p.GetLastHandshake().AsTime()).Round(time.Second).String() + " ago"
	}
	b.peerInfo = fmt.Sprintf("netd on n1: interface %s (%s), subnet %s, MTU %d; peer n2 at %s (subnet %s), last handshake %s, tx %.2f GiB, rx %.2f GiB.",
		st.GetInterface(), st.GetMode(), st.GetSubnet(), st.GetMtu(), p.GetEndpoint(), p.GetSubnet(), hs,
		float64(p.GetTxBytes())/(1<<30), float64(p.GetRxBytes())/(1<<30))
}

// ---- the report ----

func (b *bench) report() {
	c := b.c
	res := func(k string) *measured {
		for i, p := range b.paths {
			if p.key == k {
				return &b.res[i]
			}
		}
		return nil
	}
	fmt.Printf("Machine: %s. Kernel WireGuard: %v (netd runs %s wireguard-go holders; the bare tunnel uses the same `shoal-netd wg-holder`).\n\n",
		machine(), b.kernelWG, b.netdMode)
	fmt.Printf("All paths measured in one run (%s; dev cluster %s up with its image in %s, both tasks running with addresses %s later). "+
		"Throughput: iperf3 -t %d, one TCP stream, median of %d runs [min–max], runs interleaved across the paths. "+
		"Latency: busybox ping -c %d -i 0.2 (avg, min–max), and %d round trips of a %d-byte message on one TCP connection (Nagle off) timed in process (p50 / p99). "+
		"iperf3, ping and the echo client run from the host's binaries inside the source namespace (for (c), the client task's `/var/run/netns/shoal-<task id>`, as `ip netns exec` would).\n\n",
		durText(b.elapsed), b.name, durText(b.clusterUp), durText(b.tasksUp), c.seconds, c.runs, c.pings, c.echoes, c.size)
	fmt.Printf("- (a) two namespaces joined by a veth (MTU %d); (b) a wireguard-go tunnel over it (pkg/wg: one holder per namespace, keys and peers by wgctrl, MTU %d = overlay.MTU), between the namespaces' bridge addresses — bench/wg's set-up.\n", underlayMTU, b.bareMTU)
	fmt.Printf("- (c) a 2-node dev cluster (statd, schedd, netd, containerd per node; %s); services perf1 and perf2 (`sleep`, 1 replica, `node.name==n1` / `==n2`); client in task %s (%s, n1), server in task %s (%s, n2). "+
		"Path: task eth0 → veth → n1's bridge shoal0 → netd's WireGuard (%s, MTU %d) → n1 eth0 → host bridge → n2 eth0 → WireGuard → shoal0 → veth → task.\n",
		orDash(b.version), b.taskIDs[0], b.taskIP[0], b.taskIDs[1], b.taskIP[1], b.netdIfaces[0], b.netdMTU)
	if c.diag {
		fmt.Printf("- (d) node 1 → node 2's address on the dev cluster underlay (veth → host bridge → veth, MTU %d), no tunnel; (e) node 1 → node 2's bridge address %s through netd's tunnel: (c) without the task veths and bridges.\n", b.nodeMTU, b.nodeGW[1])
	}
	fmt.Println()
	fmt.Println("| path | MTU | TCP Gbit/s | retransmits (median) | ping RTT avg (min–max) | ping replies | TCP echo RTT p50 / p99 |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|")
	for i, p := range b.paths {
		r := b.res[i]
		g := medianRange(r.gbps)
		if p.key == "c" {
			g = "**" + g + "**"
		}
		fmt.Printf("| %s | %d | %s | %d | %.3f ms (%.3f–%.3f) | %s | %s / %s |\n", p.name, p.mtu, g, medianInt(r.retrans),
			r.pingAvg, r.pingMin, r.pingMax, r.pingLoss, us(pct(r.echo, 50)), us(pct(r.echo, 99)))
	}
	a, bb, cc := res("a"), res("b"), res("c")
	ratio := median(cc.gbps) / median(bb.gbps)
	met := "not met"
	if ratio >= 0.8 {
		met = "met"
	}
	fmt.Printf("\n**(c) ÷ (b) = %.2f — goal ≥ 0.8 of the bare tunnel: %s.** (c) ÷ (a) = %.3f (%.1f× slower than the raw veth); (b) ÷ (a) = %.3f. "+
		"Ratios of medians; the per-run spread is in brackets above. Latency, (c) vs (b): ping avg %.2f×, TCP echo p50 %.2f×.\n\n",
		ratio, met, median(cc.gbps)/median(a.gbps), median(a.gbps)/median(cc.gbps), median(bb.gbps)/median(a.gbps),
		cc.pingAvg/bb.pingAvg, float64(pct(cc.echo, 50))/float64(pct(bb.echo, 50)))
	if c.diag {
		d, e := res("d"), res("e")
		fmt.Printf("Where (b) → (c) goes (ratios of medians): tunnel over the dev cluster's underlay, node to node, (e) ÷ (b) = %.2f "+
			"(its underlay alone: (d) ÷ (a) = %.2f); adding the task hops (veth and bridge on each end), (c) ÷ (e) = %.2f. "+
			"Product (e)/(b) × (c)/(e) = (c)/(b).\n\n",
			median(e.gbps)/median(bb.gbps), median(d.gbps)/median(a.gbps), median(cc.gbps)/median(e.gbps))
	}

	fmt.Printf("CPU during the iperf3 runs (cores' worth, mean over the path's runs; the machine has %d): everything busy (user+system+irq+softirq, of which softirq in brackets); "+
		"iperf3 client and server; the wireguard-go holders (both tunnels' — the idle pair uses next to nothing); ksoftirqd; Shoal's daemons, the containerds and this benchmark; "+
		"and other processes, the rest of the machine (other work on it, and kernel threads). The kernel has no IRQ time accounting, so softirq work done on a process's time is counted as that process's.\n\n", runtime.NumCPU())
	fmt.Println("| path | busy (softirq) | iperf3 | wireguard-go | ksoftirqd | Shoal + bench | other processes | steal |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|")
	for i, p := range b.paths {
		u := meanUse(b.res[i].cpu)
		fmt.Printf("| %s | %.2f (%.2f) | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", p.key, u.busy, u.softirq, u.iperf, u.wireguard, u.ksoftirqd, u.shoal, u.others, u.steal)
	}
	fmt.Println()
	var parts []string
	for i, p := range b.paths {
		r := b.res[i]
		if r.hasTunnel && r.bytes > 0 {
			parts = append(parts, fmt.Sprintf("(%s) %.2f GiB by iperf3, %.2f GiB sent by the WireGuard device (%.3f×)", p.key, r.bytes/(1<<30), r.tunnelTx/(1<<30), r.tunnelTx/r.bytes))
		}
	}
	if len(parts) > 0 {
		fmt.Printf("Traffic through the tunnels during the iperf3 runs, as the client side's WireGuard device counts it (bytes sent to the peer, WireGuard headers included) against what iperf3 moved: %s.", strings.Join(parts, "; "))
		if b.peerInfo != "" {
			fmt.Printf(" %s", b.peerInfo)
		}
		fmt.Printf("\n\n")
	}
}

func meanUse(us []cpuUse) cpuUse {
	var m cpuUse
	if len(us) == 0 {
		return m
	}
	for _, u := range us {
		m.busy += u.busy
		m.softirq += u.softirq
		m.steal += u.steal
		m.iperf += u.iperf
		m.wireguard += u.wireguard
		m.ksoftirqd += u.ksoftirqd
		m.shoal += u.shoal
		m.others += u.others
	}
	n := float64(len(us))
	m.busy, m.softirq, m.steal, m.iperf, m.wireguard, m.ksoftirqd, m.shoal, m.others =
		m.busy/n, m.softirq/n, m.steal/n, m.iperf/n, m.wireguard/n, m.ksoftirqd/n, m.shoal/n, m.others/n
	return m
}

// ---- helpers ----

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func medianInt(v []int) int {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func medianRange(v []float64) string {
	if len(v) == 1 {
		return fmt.Sprintf("%.2f", v[0])
	}
	return fmt.Sprintf("%.2f [%.2f–%.2f]", median(v), slices.Min(v), slices.Max(v))
}

func pct(sorted []time.Duration, p int) time.Duration {
	i := (len(sorted)*p+99)/100 - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func us(d time.Duration) string { return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond)) }

func durText(d time.Duration) string {
	if d >= time.Second {
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
	return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
}

func orDash(s string) string {
	if s == "" {
		return "–"
	}
	return s
}

func machine() string {
	model := "unknown CPU"
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	mem := "?"
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
				kb, _ := strconv.ParseFloat(f[1], 64)
				mem = fmt.Sprintf("%.1f GiB RAM", kb/1048576)
			}
		}
	}
	var u unix.Utsname
	kernel := "unknown kernel"
	if unix.Uname(&u) == nil {
		kernel = "Linux " + unix.ByteSliceToString(u.Release[:])
	}
	iperfVersion := "iperf3"
	if out, err := exec.Command("iperf3", "--version").Output(); err == nil {
		iperfVersion = strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
	}
	return fmt.Sprintf("%d CPUs (%s), %s, %s %s, %s, %s", runtime.NumCPU(), model, mem, kernel, runtime.GOARCH, runtime.Version(), iperfVersion)
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "netd bench: "+format+"\n", args...)
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

var (
	cleanupMu   sync.Mutex
	cleanups    []func()
	onFailure   []func()
	cleanupOnce sync.Once
	cleanupDone = make(chan struct{})
	interrupted atomic.Bool
)

// atCleanup registers f to run at exit (normal, failure or signal).
func atCleanup(f func()) {
	cleanupMu.Lock()
	defer cleanupMu.Unlock()
	cleanups = append(cleanups, f)
}

// atFailure registers f to run before the cleanups when the benchmark
// fails.
func atFailure(f func()) {
	cleanupMu.Lock()
	defer cleanupMu.Unlock()
	onFailure = append(onFailure, f)
}

// runCleanup runs the registered functions, newest first, once; a
// concurrent caller (a signal during a failure) waits until they are done.
func runCleanup() {
	cleanupOnce.Do(func() {
		cleanupMu.Lock()
		fs := cleanups
		cleanups = nil
		cleanupMu.Unlock()
		for _, f := range slices.Backward(fs) {
			f()
		}
		close(cleanupDone)
	})
	<-cleanupDone
}

func check(err error) {
	if err != nil {
		fail("%v", err)
	}
}

func fail(format string, args ...any) {
	if !interrupted.Load() {
		fmt.Fprintf(os.Stderr, "netd bench: "+format+"\n", args...)
		cleanupMu.Lock()
		fs := onFailure
		onFailure = nil
		cleanupMu.Unlock()
		for _, f := range fs {
			f()
		}
	}
	runCleanup()
	os.Exit(1)
}
