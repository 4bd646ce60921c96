// Command wg measures the network baseline of Shoal's overlay (issue 5)
// and prints a Markdown section on stdout (docs/BENCHMARKS.md style):
// TCP throughput (iperf3, median of several runs) and round-trip latency
// (busybox ping, and a TCP echo timed in process) between two network
// namespaces joined by a veth, over
//
//	(a) the raw veth (the underlay), and
//	(b) a bare wireguard-go tunnel built with pkg/wg: one holder process
//	    per namespace (this binary in wg-holder mode, as shoal-netd
//	    wg-holder), keys and peers set through wgctrl, traffic between the
//	    namespaces' bridge addresses routed over the WireGuard interface.
//
// The ratio (b)/(a) is the cost of encryption in userspace; the overlay
// as netd builds it (task namespace → bridge → WireGuard → bridge → task
// namespace) is to be compared with (b).
//
// Needs root, iperf3 and busybox. Everything it creates (namespaces
// shwgb-<pid>-*, holders, the iperf3 server) is removed on exit, on
// failure and on SIGINT/SIGTERM/SIGHUP. BENCH_QUICK=1 scales it down.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
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
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/shoal-dev/shoal/pkg/overlay"
	"github.com/shoal-dev/shoal/pkg/wg"
)

const (
	wgPort     = 51820
	iperfPort  = 5201
	underlayMT = 1500
)

type config struct {
	seconds int
	runs    int
	pings   int
	echoes  int
	size    int
}

// path is one way from namespace A to namespace B.
type path struct {
	name string
	dst  netip.Addr // in B
	mtu  int
}

type measured struct {
	gbps     []float64 // per iperf3 run, received
	retrans  []int
	pingMin  float64 // ms
	pingAvg  float64
	pingMax  float64
	pingLoss string
	echo     []time.Duration
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "wg-holder" {
		os.Exit(wg.HolderMain(os.Args[2:]))
	}
	quick := os.Getenv("BENCH_QUICK") == "1"
	def := config{seconds: 5, runs: 3, pings: 20, echoes: 2000, size: 64}
	if quick {
		def = config{seconds: 2, runs: 1, pings: 10, echoes: 500, size: 64}
	}
	var c config
	flag.IntVar(&c.seconds, "t", def.seconds, "seconds per iperf3 run")
	flag.IntVar(&c.runs, "runs", def.runs, "iperf3 runs per path (the median is reported)")
	flag.IntVar(&c.pings, "pings", def.pings, "busybox pings per path (0.2 s apart)")
	flag.IntVar(&c.echoes, "echoes", def.echoes, "TCP echo round trips per path")
	flag.IntVar(&c.size, "echo-size", def.size, "bytes per TCP echo message")
	flag.Parse()
	if c.seconds < 1 || c.runs < 1 || c.pings < 1 || c.echoes < 1 || c.size < 1 {
		fail("-t, -runs, -pings, -echoes and -echo-size must be positive")
	}
	if os.Geteuid() != 0 {
		fail("needs root (network namespaces, TUN)")
	}
	for _, bin := range []string{"iperf3", "busybox"} {
		if _, err := exec.LookPath(bin); err != nil {
			fail("%s is missing (apt-get install -y --no-install-recommends iperf3 busybox)", bin)
		}
	}

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		s := <-sigs
		fmt.Fprintf(os.Stderr, "wg bench: %v, cleaning up\n", s)
		runCleanup()
		os.Exit(1)
	}()
	defer runCleanup()

	env := setup()
	paths := []path{
		{name: "(a) raw veth", dst: env.bUnder, mtu: underlayMT},
		{name: "(b) wireguard-go tunnel (pkg/wg holders)", dst: env.bGW, mtu: env.overlayMTU},
	}
	res := make([]measured, len(paths))
	// Interleave the runs so drift on the machine hits both paths alike.
	for r := range c.runs {
		for i, p := range paths {
			progress("iperf3 run %d/%d over %s", r+1, c.runs, p.name)
			g, rt := iperf(env, p.dst, c.seconds)
			res[i].gbps = append(res[i].gbps, g)
			res[i].retrans = append(res[i].retrans, rt)
		}
	}
	for i, p := range paths {
		progress("ping and TCP echo over %s", p.name)
		res[i].pingMin, res[i].pingAvg, res[i].pingMax, res[i].pingLoss = pingRTT(env, p.dst, c.pings)
		res[i].echo = tcpEcho(env, p.dst, c.echoes, c.size)
	}
	report(c, env, paths, res)
}

// env is the test bed: namespaces A and B, a veth between them
// (172.31.0.1/24 – 172.31.0.2/24), a bridge in each (10.42.1.1/24,
// 10.42.2.1/24) and a WireGuard tunnel routing 10.42.0.0/16.
type env struct {
	a, b            string // netns paths
	bUnder          netip.Addr
	aGW, bGW        netip.Addr
	overlayMTU      int
	aIface, bIface  string
	aDev, bDev      *wg.Device
	kernelWireGuard bool
}

func setup() *env {
	tag := fmt.Sprintf("%05x", os.Getpid()&0xfffff)
	e := &env{
		bUnder: netip.MustParseAddr("172.31.0.2"),
		aGW:    netip.MustParseAddr("10.42.1.1"),
		bGW:    netip.MustParseAddr("10.42.2.1"),
		aIface: "wb" + tag + "a",
		bIface: "wb" + tag + "b",
	}
	e.kernelWireGuard = wg.KernelAvailable()
	logDir, err := os.MkdirTemp("", "shoal-bench-wg-")
	check(err)
	atCleanup(func() { os.RemoveAll(logDir) })
	ns := func(suffix string) string {
		name := "shwgb-" + tag + "-" + suffix
		p, err := wg.CreateNetns(name)
		check(err)
		atCleanup(func() {
			if err := wg.DeleteNetns(name); err != nil {
				fmt.Fprintln(os.Stderr, "wg bench:", err)
			}
		})
		return p
	}
	e.a, e.b = ns("a"), ns("b")
	na, err := wg.OpenNetlink(e.a)
	check(err)
	atCleanup(na.Close)
	nb, err := wg.OpenNetlink(e.b)
	check(err)
	atCleanup(nb.Close)
	check(na.AddVeth("ul0", "ul0", e.b, underlayMT))
	atCleanup(func() { na.DeleteLink("ul0") })
	for i, n := range []*wg.Netlink{na, nb} {
		check(n.ReplaceAddr("ul0", netip.PrefixFrom(netip.AddrFrom4([4]byte{172, 31, 0, byte(i + 1)}), 24)))
		check(n.SetLinkUp("ul0", 0))
		check(n.SetLinkUp("lo", 0))
	}
	under, err := na.RouteMTU(e.bUnder)
	check(err)
	e.overlayMTU = overlay.MTU(under)

	exe, err := os.Executable()
	check(err)
	type side struct {
		ns, iface string
		n         *wg.Netlink
		gw        netip.Addr
		under     netip.Addr
		dev       **wg.Device
		key       wgtypes.Key
	}
	sides := []*side{
		{ns: e.a, iface: e.aIface, n: na, gw: e.aGW, under: netip.MustParseAddr("172.31.0.1"), dev: &e.aDev},
		{ns: e.b, iface: e.bIface, n: nb, gw: e.bGW, under: e.bUnder, dev: &e.bDev},
	}
	for _, s := range sides {
		check(s.n.EnsureBridge("shoal0", netip.PrefixFrom(s.gw, 24), e.overlayMTU))
		pid, err := wg.StartHolderWith(exe, []string{"wg-holder", "--iface", s.iface, "--mtu", strconv.Itoa(e.overlayMTU)}, s.iface,
			wg.HolderOptions{Netns: s.ns, Log: filepath.Join(logDir, s.iface+".log")})
		check(err)
		iface := s.iface
		atCleanup(func() {
			if err := wg.StopHolder(iface, 3*time.Second); err != nil {
				fmt.Fprintln(os.Stderr, "wg bench:", err)
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
		check(d.SetListenPort(wgPort))
		check(s.n.ReplaceRoute(netip.MustParsePrefix("10.42.0.0/16"), s.iface, s.gw))
	}
	for i, s := range sides {
		o := sides[1-i]
		_, err := (*s.dev).ApplyPeers([]overlay.Peer{{
			PublicKey:  o.key.PublicKey(),
			Endpoint:   netip.AddrPortFrom(o.under, wgPort),
			AllowedIPs: []netip.Prefix{netip.PrefixFrom(o.gw, 24).Masked()},
		}})
		check(err)
	}

	// The iperf3 server in B, for both paths.
	srv := exec.Command("iperf3", "-s", "-p", strconv.Itoa(iperfPort))
	srv.Stdout, srv.Stderr = io.Discard, io.Discard
	check(wg.InNetns(e.b, srv.Start))
	atCleanup(func() {
		srv.Process.Kill()
		srv.Wait()
	})
	// Warm up: handshake, ARP, and the server listening.
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok := true
		for _, dst := range []netip.Addr{e.bUnder, e.bGW} {
			var c net.Conn
			err := wg.InNetns(e.a, func() (err error) {
				c, err = net.DialTimeout("tcp4", netip.AddrPortFrom(dst, iperfPort).String(), time.Second)
				return err
			})
			if err != nil {
				ok = false
				break
			}
			c.Close()
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			fail("the iperf3 server is not reachable over both paths")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Runs first at cleanup: clients still running would otherwise linger,
	// talking to a namespace that is gone.
	atCleanup(func() {
		running.Range(func(k, _ any) bool {
			k.(*exec.Cmd).Process.Kill()
			return true
		})
	})
	return e
}

// running holds the commands inA is waiting for.
var running sync.Map

// inA runs a command in namespace A and returns its stdout.
func inA(e *env, timeout time.Duration, name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := wg.InNetns(e.a, cmd.Start); err != nil {
		return nil, err
	}
	running.Store(cmd, struct{}{})
	err := cmd.Wait()
	running.Delete(cmd)
	if err != nil {
		return []byte(out.String()), fmt.Errorf("%s: %w: %s", name, err, errb.String())
	}
	return []byte(out.String()), nil
}

func iperf(e *env, dst netip.Addr, seconds int) (gbps float64, retransmits int) {
	var out []byte
	var err error
	for try := range 3 { // the server takes one client at a time; retry if it is still busy
		out, err = inA(e, time.Duration(seconds+20)*time.Second, "iperf3", "-c", dst.String(), "-p", strconv.Itoa(iperfPort), "-t", strconv.Itoa(seconds), "-J")
		if err == nil {
			break
		}
		progress("iperf3 try %d: %v", try+1, err)
		time.Sleep(time.Second)
	}
	check(err)
	var r struct {
		End struct {
			SumSent struct {
				Retransmits int `json:"retransmits"`
			} `json:"sum_sent"`
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
		Error string `json:"error"`
	}
	check(json.Unmarshal(out, &r))
	if r.Error != "" {
		fail("iperf3: %s", r.Error)
	}
	return r.End.SumReceived.BitsPerSecond / 1e9, r.End.SumSent.Retransmits
}

var rttRE = regexp.MustCompile(`round-trip min/avg/max = ([0-9.]+)/([0-9.]+)/([0-9.]+) ms`)
var lossRE = regexp.MustCompile(`(\d+) packets transmitted, (\d+) packets received`)

func pingRTT(e *env, dst netip.Addr, n int) (minMs, avgMs, maxMs float64, loss string) {
	out, err := inA(e, time.Duration(n)*time.Second+10*time.Second, "busybox", "ping", "-c", strconv.Itoa(n), "-i", "0.2", "-W", "3", dst.String())
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

// tcpEcho times n round trips of a size-byte message over one TCP
// connection (Nagle off) from A to an echo server in B.
func tcpEcho(e *env, dst netip.Addr, n, size int) []time.Duration {
	var ln net.Listener
	check(wg.InNetns(e.b, func() (err error) {
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(dst, 0).String())
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
	check(wg.InNetns(e.a, func() (err error) {
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

func report(c config, e *env, paths []path, res []measured) {
	fmt.Printf("## WireGuard baseline (pkg/wg)\n\n")
	fmt.Printf("Machine: %s. Kernel WireGuard: %v (the tunnel here is userspace wireguard-go either way).\n\n", machine(), e.kernelWireGuard)
	fmt.Printf("Two network namespaces joined by a veth (MTU %d). (a) is the veth itself; (b) is a bare wireguard-go tunnel over it, "+
		"built with pkg/wg: a holder process per namespace, keys and peers by wgctrl, MTU %d (overlay.MTU), traffic between the namespaces' "+
		"bridge addresses routed over the WireGuard interface. Throughput: iperf3 -t %d, one TCP stream A→B, median of %d runs "+
		"(range in brackets), interleaved (a)/(b). Latency: busybox ping -c %d -i 0.2 (min/avg/max), and %d round trips of a %d-byte "+
		"message on one TCP connection (Nagle off) timed in process (p50/p99/max).\n\n",
		underlayMT, e.overlayMTU, c.seconds, c.runs, c.pings, c.echoes, c.size)
	fmt.Println("| path | MTU | TCP Gbit/s | retransmits (median) | ping RTT ms min/avg/max | ping replies | TCP echo RTT p50 / p99 / max |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|")
	for i, p := range paths {
		r := res[i]
		fmt.Printf("| %s | %d | %s | %d | %.3f / %.3f / %.3f | %s | %s / %s / %s |\n", p.name, p.mtu, medianRange(r.gbps), medianInt(r.retrans),
			r.pingMin, r.pingAvg, r.pingMax, r.pingLoss, us(pct(r.echo, 50)), us(pct(r.echo, 99)), us(r.echo[len(r.echo)-1]))
	}
	if len(res) == 2 {
		a, b := res[0], res[1]
		fmt.Printf("\n(b) ÷ (a): throughput %.3f× (%.1f× slower), ping avg RTT %.1f×, TCP echo p50 %.1f×.\n",
			median(b.gbps)/median(a.gbps), median(a.gbps)/median(b.gbps), b.pingAvg/a.pingAvg,
			float64(pct(b.echo, 50))/float64(pct(a.echo, 50)))
	}
	if st, err := e.aDev.Peers(); err == nil && len(st) == 1 {
		fmt.Printf("\nWireGuard counters on A after the run: tx %.1f MiB, rx %.1f MiB, last handshake %s ago.\n",
			float64(st[0].TxBytes)/(1<<20), float64(st[0].RxBytes)/(1<<20), time.Since(st[0].LastHandshake).Round(time.Second))
	}
	fmt.Println()
}

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

func machine() string {
	var u unix.Utsname
	kernel := "unknown kernel"
	if unix.Uname(&u) == nil {
		kernel = "Linux " + unix.ByteSliceToString(u.Release[:])
	}
	model := ""
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = " (" + strings.TrimSpace(v) + ")"
				break
			}
		}
	}
	iperfVersion := "iperf3"
	if out, err := exec.Command("iperf3", "--version").Output(); err == nil {
		iperfVersion = strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
	}
	return fmt.Sprintf("%d CPUs%s, %s, %s/%s, %s, %s", runtime.NumCPU(), model, kernel, runtime.GOOS, runtime.GOARCH, runtime.Version(), iperfVersion)
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "wg bench: "+format+"\n", args...)
}

var (
	cleanupMu   sync.Mutex
	cleanups    []func()
	cleanupOnce sync.Once
)

// atCleanup registers f to run at exit (normal, failure or signal).
func atCleanup(f func()) {
	cleanupMu.Lock()
	defer cleanupMu.Unlock()
	cleanups = append(cleanups, f)
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
	})
}

func check(err error) {
	if err != nil {
		fail("%v", err)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "wg bench: "+format+"\n", args...)
	runCleanup()
	os.Exit(1)
}
