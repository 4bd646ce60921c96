package main

// The rest of issue 5's benchmarks, on the same dev cluster as the overlay
// measurements:
//
//   - published ports: HTTP requests/s and latency through node 2's
//     published port (the replica is on node 1, so netd's proxy on node 2
//     forwards over the overlay) against the same requests sent straight
//     to the task from node 2's namespace, with keep-alive and with a new
//     connection per request. The server is net/http in this process,
//     listening inside the task's network namespace (as tcpEcho's
//     listener), so it costs the same on every path;
//   - service DNS: queries/s and latency against node 2's DNS server from
//     inside a task's namespace, for <service>.shoal and
//     <slot>.<service>.shoal, against pkg/dns serving the same records in
//     this process over loopback in that namespace (the server alone);
//   - DNS updates: time from a task's document saying healthy (watched on
//     every node's statd) until its address is in node 2's answer, and from
//     it saying unhealthy until the address is gone;
//   - issue 5's timed points: DNS (and the published port) back after
//     netd restarts (goal ≤ 1 s), and a new node reachable from the others
//     after it joins (goal ≤ 2 s).

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/shoal-dev/shoal/pkg/client"
	"github.com/shoal-dev/shoal/pkg/dns"
	"github.com/shoal-dev/shoal/pkg/sched"
	"github.com/shoal-dev/shoal/pkg/wg"
	clusterv1 "github.com/shoal-dev/shoal/proto/shoal/cluster/v1"
	netv1 "github.com/shoal-dev/shoal/proto/shoal/net/v1"
	schedv1 "github.com/shoal-dev/shoal/proto/shoal/sched/v1"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

const (
	publishedPort = 8080 // perf1's published port
	httpPort      = 80   // where the benchmark's HTTP server listens in perf1's task
	dnsPort       = 53   // netd's default, on each node's bridge address
	restartTarget = time.Second
	joinTarget    = 2 * time.Second
)

// svcResults are the measurements of this file.
type svcResults struct {
	loads    []loadRow
	dnsRows  []loadRow
	appear   []update // healthy → in the answer
	leave    []update // unhealthy → out of the answer
	updOther float64  // other processes' CPUs during the update runs
	restarts []restart
	join     *joinResult

	mu    sync.Mutex
	extra []string // task IDs of the health-checked service, for cleanup
}

func (r *svcResults) noteTask(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !slices.Contains(r.extra, id) {
		r.extra = append(r.extra, id)
	}
}

func (r *svcResults) tasks() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.extra)
}

// load is what one load run (or several, merged) did.
type load struct {
	reqs, errs int
	wall       time.Duration
	lat        []time.Duration // sorted
	firstErr   error
}

func (l load) rate() float64 { return float64(l.reqs) / l.wall.Seconds() }

func (l *load) merge(o load) {
	l.reqs += o.reqs
	l.errs += o.errs
	l.wall += o.wall
	l.lat = append(l.lat, o.lat...)
	slices.Sort(l.lat)
	if l.firstErr == nil {
		l.firstErr = o.firstErr
	}
}

type loadRow struct {
	key, name, mode string
	rates           []float64 // per run
	all             load
	others          float64 // other processes' CPUs meanwhile
}

// runLoad runs conns workers, each on a thread in the network namespace
// ns ("" for ours) so that the sockets it opens are there, until d has
// passed or max requests have been made in all. Each worker gets its own
// request function from newWorker (called on its thread) and a function
// that releases what it holds.
func runLoad(ns string, conns int, d time.Duration, max int, newWorker func() (one func() error, done func())) load {
	var issued atomic.Int64
	results := make([]load, conns)
	var wgr sync.WaitGroup
	t0 := time.Now()
	deadline := t0.Add(d)
	for w := range conns {
		wgr.Go(func() {
			r := &results[w]
			work := func() error {
				one, done := newWorker()
				defer done()
				for time.Now().Before(deadline) && issued.Add(1) <= int64(max) {
					t := time.Now()
					if err := one(); err != nil {
						r.errs++
						if r.firstErr == nil {
							r.firstErr = err
						}
						time.Sleep(10 * time.Millisecond)
						continue
					}
					r.reqs++
					r.lat = append(r.lat, time.Since(t))
				}
				return nil
			}
			if ns == "" {
				work()
			} else if err := wg.InNetns(ns, work); err != nil {
				r.firstErr = err
			}
		})
	}
	wgr.Wait()
	out := load{wall: time.Since(t0)}
	for _, r := range results {
		out.merge(r)
	}
	out.wall = time.Since(t0)
	return out
}

// httpWorker makes HTTP/1.1 GET requests to addr, on one connection
// (keepAlive) or on a new connection per request (Connection: close).
func httpWorker(addr netip.AddrPort, keepAlive bool) func() (func() error, func()) {
	req := "GET / HTTP/1.1\r\nHost: bench\r\n\r\n"
	if !keepAlive {
		req = "GET / HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"
	}
	return func() (func() error, func()) {
		var c net.Conn
		var br *bufio.Reader
		drop := func() {
			if c != nil {
				c.Close()
				c = nil
			}
		}
		one := func() error {
			if c == nil {
				var err error
				if c, err = net.DialTimeout("tcp4", addr.String(), 2*time.Second); err != nil {
					c = nil
					return err
				}
				br = bufio.NewReader(c)
			}
			c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.WriteString(c, req); err != nil {
				drop()
				return err
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				drop()
				return err
			}
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK {
				drop()
				return cmp.Or(err, fmt.Errorf("%s", resp.Status))
			}
			if !keepAlive || resp.Close {
				drop()
			}
			return nil
		}
		return one, drop
	}
}

// dnsWorker asks server for name (type A) over UDP, one query at a time,
// and wants want in every answer.
func dnsWorker(server netip.AddrPort, name string, want netip.Addr) func() (func() error, func()) {
	return func() (func() error, func()) {
		var co *mdns.Conn
		drop := func() {
			if co != nil {
				co.Close()
				co = nil
			}
		}
		one := func() error {
			if co == nil {
				c, err := net.Dial("udp4", server.String())
				if err != nil {
					return err
				}
				co = &mdns.Conn{Conn: c}
			}
			_, err := dnsAsk(co, name, want, time.Second)
			if err != nil {
				drop() // a late answer must not be taken for the next one's
			}
			return err
		}
		return one, drop
	}
}

// dnsAsk sends one A query for name on co and returns the addresses of
// the answer; with want valid, an answer without it is an error.
func dnsAsk(co *mdns.Conn, name string, want netip.Addr, timeout time.Duration) ([]netip.Addr, error) {
	m := new(mdns.Msg)
	m.SetQuestion(name, mdns.TypeA)
	co.SetDeadline(time.Now().Add(timeout))
	if err := co.WriteMsg(m); err != nil {
		return nil, err
	}
	r, err := co.ReadMsg()
	if err != nil {
		return nil, err
	}
	// A service with no servable task is NODATA (no answers); a name
	// netd does not know (yet) is NXDOMAIN: both no addresses.
	if r.Id == m.Id && r.Rcode == mdns.RcodeNameError && !want.IsValid() {
		return nil, nil
	}
	if r.Id != m.Id || r.Rcode != mdns.RcodeSuccess {
		return nil, fmt.Errorf("answer id %d rcode %s", r.Id, mdns.RcodeToString[r.Rcode])
	}
	var out []netip.Addr
	for _, rr := range r.Answer {
		if a, ok := rr.(*mdns.A); ok {
			if ip, ok := netip.AddrFromSlice(a.A.To4()); ok {
				out = append(out, ip)
			}
		}
	}
	if want.IsValid() && !slices.Contains(out, want) {
		return out, fmt.Errorf("%s: answer %v without %s", name, out, want)
	}
	return out, nil
}

// dnsOnce asks server for name from namespace ns on a new socket.
func dnsOnce(ns string, server netip.AddrPort, name string, want netip.Addr, timeout time.Duration) ([]netip.Addr, error) {
	var out []netip.Addr
	err := wg.InNetns(ns, func() error {
		c, err := net.Dial("udp4", server.String())
		if err != nil {
			return err
		}
		co := &mdns.Conn{Conn: c}
		defer co.Close()
		out, err = dnsAsk(co, name, want, timeout)
		return err
	})
	return out, err
}

// measureServices runs this file's measurements.
func (b *bench) measureServices(ctx context.Context) {
	b.publishedPorts(ctx)
	b.dnsQueries(ctx)
	b.dnsUpdates(ctx)
	b.netdRestarts(ctx)
	if b.c.newNode {
		b.joinReachable(ctx)
	}
}

// ---- published ports ----

// serveHTTP serves a 3-byte page on perf1's task address, port 80, from
// inside its namespace.
func (b *bench) serveHTTP() {
	var ln net.Listener
	check(wg.InNetns(b.taskNs[0], func() (err error) {
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(b.taskIP[0], httpPort).String())
		return err
	}))
	body := []byte("ok\n")
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Length", "3")
			w.Write(body)
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go srv.Serve(ln)
	atCleanup(func() { srv.Close() })
}

func (b *bench) publishedPorts(ctx context.Context) {
	c := b.c
	b.serveHTTP()
	type target struct {
		key, name, ns string
		addr          netip.AddrPort
	}
	targets := []target{
		{"p2", "host → n2:8080, published (replica on n1: netd's proxy on n2 → overlay → task)", "", netip.AddrPortFrom(b.nodeAddr[1], publishedPort)},
		{"p1", "host → n1:8080, published (replica on n1: proxy → bridge → task)", "", netip.AddrPortFrom(b.nodeAddr[0], publishedPort)},
		{"d2", "n2 → task:80 directly (overlay, the proxy's own path to the task)", b.cl.NetnsPath(2), netip.AddrPortFrom(b.taskIP[0], httpPort)},
	}
	// Until netd's proxies on both nodes forward to the task.
	progress("waiting for the published port %d on both nodes", publishedPort)
	for _, t := range targets {
		deadline := time.Now().Add(c.timeout)
		for {
			l := runLoad(t.ns, 1, time.Second, 1, httpWorker(t.addr, false))
			if l.reqs == 1 {
				break
			}
			if time.Now().After(deadline) {
				fail("%s does not answer after %v: %v", t.addr, c.timeout, l.firstErr)
			}
			check(sleep(ctx, 100*time.Millisecond))
		}
	}
	for _, keep := range []bool{true, false} {
		mode := "keep-alive"
		if !keep {
			mode = "new connection per request"
		}
		for _, t := range targets {
			b.svc.loads = append(b.svc.loads, loadRow{key: t.key, name: t.name, mode: mode})
		}
	}
	b.waitQuiet(ctx)
	// Runs interleaved, as the iperf3 runs are.
	for r := range c.runs {
		for i := range b.svc.loads {
			row := &b.svc.loads[i]
			t := targets[i%len(targets)]
			keep := i < len(targets)
			progress("HTTP load run %d/%d: %s, %s", r+1, c.runs, t.addr, row.mode)
			runLoad(t.ns, c.loadConns, c.loadFor/10, c.loadMax/10, httpWorker(t.addr, keep)) // warm-up
			s0 := b.sample()
			l := runLoad(t.ns, c.loadConns, c.loadFor, c.loadMax, httpWorker(t.addr, keep))
			row.others += s0.use(b.sample(), 0).others / float64(c.runs)
			row.rates = append(row.rates, l.rate())
			row.all.merge(l)
			if l.reqs == 0 {
				fail("no request over %s succeeded: %v", t.name, l.firstErr)
			}
		}
	}
}

// ---- DNS queries ----

func (b *bench) dnsQueries(ctx context.Context) {
	c := b.c
	ns := b.taskNs[1]
	server := netip.AddrPortFrom(b.nodeGW[1], dnsPort)
	names := []string{b.services[0] + ".shoal.", "0." + b.services[0] + ".shoal."}
	for _, n := range names {
		if _, err := dnsOnce(ns, server, n, b.taskIP[0], 2*time.Second); err != nil {
			fail("node 2's DNS from task %s: %v", b.taskIDs[1], err)
		}
	}
	// The baseline: pkg/dns with the same records, in this process, on
	// the task namespace's loopback.
	recs := map[string][]netip.Addr{}
	for _, n := range names {
		recs[n] = []netip.Addr{b.taskIP[0]}
	}
	srv, err := dns.New(dns.Config{Listen: []string{"127.0.0.1:0"}, Records: dns.NewRecords(recs)})
	check(err)
	sctx, scancel := context.WithCancel(ctx)
	atCleanup(func() { scancel(); srv.Close() })
	check(wg.InNetns(ns, func() error { return srv.Start(sctx) }))
	base, err := netip.ParseAddrPort(srv.Addrs()[0])
	check(err)

	type target struct {
		key, name string
		server    netip.AddrPort
		qname     string
	}
	var targets []target
	for _, n := range names {
		targets = append(targets,
			target{"n2", "node 2's netd, from task " + b.taskIDs[1] + " (UDP to " + server.String() + ")", server, n},
			target{"base", "pkg/dns in this process, same records, loopback of the same namespace", base, n})
	}
	for _, t := range targets {
		b.svc.dnsRows = append(b.svc.dnsRows, loadRow{key: t.key, name: t.name, mode: t.qname})
	}
	b.waitQuiet(ctx)
	for r := range c.runs {
		for i, t := range targets {
			row := &b.svc.dnsRows[i]
			progress("DNS load run %d/%d: %s at %s", r+1, c.runs, t.qname, t.server)
			s0 := b.sample()
			l := runLoad(ns, c.loadConns, c.dnsFor, 1<<30, dnsWorker(t.server, t.qname, b.taskIP[0]))
			row.others += s0.use(b.sample(), 0).others / float64(c.runs)
			row.rates = append(row.rates, l.rate())
			row.all.merge(l)
			if l.reqs == 0 {
				fail("no DNS query to %s succeeded: %v", t.server, l.firstErr)
			}
		}
	}
}

// ---- DNS updates ----

// update is one task's transition and when node 2's DNS reflected it.
type update struct {
	task     string
	sameNode bool // the task runs on node 2, whose DNS is asked
	delay    time.Duration
	state    time.Duration // of which until node 2's statd showed the change
}

// taskSeen is what the watches saw of one task of the health-checked
// service.
type taskSeen struct {
	ip                 netip.Addr
	node               string
	healthyAt, goneAt  time.Time // first seen servable; first seen not servable after that
	appearAt, leaveAt  time.Time // in node 2's answer; out of it after appearAt
	appeared, departed bool
	// by node index: when that node's statd showed the change
	healthyOn, goneOn [nodes]time.Time
}

// dnsUpdates runs a service whose replicas turn healthy, and 3 s later
// unhealthy (then schedd replaces them, and the new ones do the same),
// while node 2's DNS is asked for the service every few milliseconds.
func (b *bench) dnsUpdates(ctx context.Context) {
	c := b.c
	const name = "hc"
	spec := sched.ServiceSpec{Name: name, Image: imageRef, Replicas: c.healthTasks,
		Args:   []string{"sh", "-c", "sleep 3; touch /tmp/bad; exec sleep 1000000"},
		Health: sched.HealthCheck{Cmd: []string{"sh", "-c", "test ! -f /tmp/bad"}, Interval: sched.Duration(500 * time.Millisecond), Retries: 1},
		// Only the task's own node may be asked for it: the constraint
		// keeps it off a node added later.
		Constraints: []string{"node.name!=n3"}, StopGrace: sched.Duration(time.Second)}
	raw, err := json.Marshal(spec)
	check(err)

	var mu sync.Mutex
	seen := map[string]*taskSeen{}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	var wgr sync.WaitGroup
	for i := range nodes {
		wgr.Go(func() {
			b.statds[i].Watch(wctx, sched.TasksPrefix, client.FromNow, func(r *statev1.WatchResponse) error {
				now := time.Now()
				mu.Lock()
				defer mu.Unlock()
				for _, ev := range r.GetEvents() {
					f := ev.GetDocument().GetFields()
					if f["service"].GetStringValue() != name {
						continue
					}
					id := strings.TrimPrefix(ev.GetDocument().GetKey(), sched.TasksPrefix)
					b.svc.noteTask(id)
					ts := seen[id]
					if ts == nil {
						ts = &taskSeen{}
						seen[id] = ts
					}
					if ip, err := netip.ParseAddr(f["ip"].GetStringValue()); err == nil {
						ts.ip = ip
					}
					if n := f["node"].GetStringValue(); n != "" {
						ts.node = n
					}
					servable := ev.GetType() == statev1.Event_TYPE_PUT && f["state"].GetStringValue() == string(sched.TaskRunning) &&
						f["health"].GetStringValue() == string(sched.HealthHealthy)
					// Both nodes' watches see every change; the earlier
					// sighting counts (the task's own node, mostly).
					switch {
					case servable && ts.healthyOn[i].IsZero() && ts.goneOn[i].IsZero():
						ts.healthyOn[i] = now
						if ts.healthyAt.IsZero() || now.Before(ts.healthyAt) {
							ts.healthyAt = now
						}
					case !servable && !ts.healthyOn[i].IsZero() && ts.goneOn[i].IsZero():
						ts.goneOn[i] = now
						if ts.goneAt.IsZero() || now.Before(ts.goneAt) {
							ts.goneAt = now
						}
					}
				}
				return nil
			})
		})
	}
	// The DNS poller: node 2's answer for hc.shoal, every 5 ms.
	pollDone := make(chan struct{})
	var polls, pollErrs atomic.Int64
	wgr.Go(func() {
		defer close(pollDone)
		server := netip.AddrPortFrom(b.nodeGW[1], dnsPort)
		wg.InNetns(b.taskNs[1], func() error {
			for wctx.Err() == nil {
				addrs, err := dnsOnceHere(server, name+".shoal.", 200*time.Millisecond)
				now := time.Now()
				polls.Add(1)
				if err != nil {
					pollErrs.Add(1)
					time.Sleep(5 * time.Millisecond)
					continue
				}
				mu.Lock()
				for _, ts := range seen {
					if !ts.ip.IsValid() {
						continue
					}
					in := slices.Contains(addrs, ts.ip)
					if in && !ts.appeared && !ts.healthyAt.IsZero() {
						ts.appeared, ts.appearAt = true, now
					}
					if !in && ts.appeared && !ts.departed && !ts.goneAt.IsZero() {
						ts.departed, ts.leaveAt = true, now
					}
				}
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
			return nil
		})
	})

	progress("DNS updates: service %s, %d health-checked replicas on n1 and n2", name, c.healthTasks)
	s0 := b.sample()
	cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = b.scheds[0].CreateService(cctx, &schedv1.CreateServiceRequest{Spec: raw})
	ccancel()
	check(err)
	deadline := time.Now().Add(c.timeout)
	count := func() (in, out int) {
		mu.Lock()
		defer mu.Unlock()
		for _, ts := range seen {
			if ts.appeared {
				in++
			}
			if ts.departed {
				out++
			}
		}
		return in, out
	}
	for {
		in, out := count()
		if in >= c.healthTasks && out >= c.healthTasks {
			break
		}
		if time.Now().After(deadline) {
			progress("DNS updates: after %v only %d tasks entered and %d left the answer; reporting those", c.timeout, in, out)
			break
		}
		check(sleep(ctx, 100*time.Millisecond))
	}
	b.svc.updOther = s0.use(b.sample(), 0).others
	cctx, ccancel = context.WithTimeout(ctx, 10*time.Second)
	_, err = b.scheds[0].RemoveService(cctx, &schedv1.GetServiceRequest{Name: name})
	ccancel()
	check(err)
	wcancel()
	<-pollDone
	wgr.Wait()
	if polls.Load() == 0 || pollErrs.Load() == polls.Load() {
		fail("DNS updates: node 2's DNS never answered (%d polls)", polls.Load())
	}
	n2 := b.nodeIDs[1]
	for id, ts := range seen {
		// state: until node 2's statd showed the change (gossip, for a
		// task on node 1).
		if ts.appeared {
			b.svc.appear = append(b.svc.appear, update{task: id, sameNode: ts.node == n2, delay: ts.appearAt.Sub(ts.healthyAt), state: ts.healthyOn[1].Sub(ts.healthyAt)})
		}
		if ts.departed {
			b.svc.leave = append(b.svc.leave, update{task: id, sameNode: ts.node == n2, delay: ts.leaveAt.Sub(ts.goneAt), state: ts.goneOn[1].Sub(ts.goneAt)})
		}
	}
}

// dnsOnceHere is dnsOnce on the calling thread's namespace.
func dnsOnceHere(server netip.AddrPort, name string, timeout time.Duration) ([]netip.Addr, error) {
	c, err := net.Dial("udp4", server.String())
	if err != nil {
		return nil, err
	}
	co := &mdns.Conn{Conn: c}
	defer co.Close()
	return dnsAsk(co, name, netip.Addr{}, timeout)
}

// ---- netd restarts ----

type restart struct {
	down       time.Duration // killed until started again
	ready      time.Duration // Start until devcluster saw netd ready
	dns, port  time.Duration // Start until DNS answered / the published port served a request
	dnsOK, pOK bool
}

// netdRestarts kills node 2's netd and starts it again, timing from the
// start until node 2's DNS answers a task again and until node 2's
// published port serves again (new connection each probe).
func (b *bench) netdRestarts(ctx context.Context) {
	c := b.c
	server := netip.AddrPortFrom(b.nodeGW[1], dnsPort)
	qname := b.services[0] + ".shoal."
	port := netip.AddrPortFrom(b.nodeAddr[1], publishedPort)
	probeDNS := func(timeout time.Duration) bool {
		_, err := dnsOnce(b.taskNs[1], server, qname, b.taskIP[0], timeout)
		return err == nil
	}
	probePort := func() bool {
		return runLoad("", 1, 200*time.Millisecond, 1, httpWorker(port, false)).reqs == 1
	}
	for r := range c.restarts {
		deadline := time.Now().Add(c.timeout)
		for !probeDNS(time.Second) || !probePort() {
			if time.Now().After(deadline) {
				fail("node 2's DNS or published port not answering before restart %d", r+1)
			}
			check(sleep(ctx, 100*time.Millisecond))
		}
		progress("netd restart %d/%d on n2", r+1, c.restarts)
		check(b.cl.Kill(ctx, 2, "netd"))
		killed := time.Now()
		check(sleep(ctx, 500*time.Millisecond))
		var res restart
		t0 := time.Now()
		res.down = t0.Sub(killed)
		started := make(chan error, 1)
		go func() {
			err := b.cl.Start(ctx, 2, "netd")
			res.ready = time.Since(t0)
			started <- err
		}()
		var wgr sync.WaitGroup
		limit := t0.Add(30 * time.Second)
		wgr.Go(func() {
			for time.Now().Before(limit) {
				// Short timeouts: while nothing listens, an answer may
				// never come (ICMP replies are rate-limited).
				if probeDNS(50 * time.Millisecond) {
					res.dns, res.dnsOK = time.Since(t0), true
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
		wgr.Go(func() {
			for time.Now().Before(limit) {
				if probePort() {
					res.port, res.pOK = time.Since(t0), true
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
		wgr.Wait()
		check(<-started)
		b.svc.restarts = append(b.svc.restarts, res)
	}
}

// ---- a new node joins ----

type joinResult struct {
	node      int
	id, gw    string
	join      time.Duration   // `shoalctl cluster join` on the new node
	inState   time.Duration   // join returned until its subnet was in node 1's state
	reached   []time.Duration // join returned until node k reached it (by index)
	reachedOK []bool
}

// joinReachable adds node 3 (its daemons and containerd, then `shoalctl
// cluster join` on it: devcluster.AddNode), and times from the join until
// nodes 1 and 2 reach its bridge address through the overlay. A reach is
// a TCP handshake with the new node's DNS port on that address, or a
// reset: either way packets went both ways. A new attempt starts every
// 20 ms (each waits up to a second), so a path that comes up is seen
// within about 20 ms.
func (b *bench) joinReachable(ctx context.Context) {
	c := b.c
	progress("adding node 3 (statd, schedd, netd, containerd) and joining it")
	res := &joinResult{}
	t0 := time.Now()
	// With Spec.Bootstrap, AddNode ends with `shoalctl cluster join` on
	// the new node, with a token from node 1.
	i, err := b.cl.AddNode(ctx)
	check(err)
	joined := time.Now()
	res.node, res.join = i, joined.Sub(t0)
	st, err := client.NewStatd(b.cl.RunDir(i), client.Retry{Attempts: 3})
	check(err)
	defer st.Close()
	cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
	idr, err := st.Cluster.Identity(cctx, &clusterv1.IdentityRequest{})
	ccancel()
	check(err)
	res.id = idr.GetNodeId()
	// Its subnet, as the others learn it: from node 1's state.
	var gw netip.Addr
	deadline := time.Now().Add(c.timeout)
	for {
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		d, err := b.statds[0].Get(cctx, &statev1.GetRequest{Key: sched.NodeKey(res.id)})
		ccancel()
		if err == nil {
			if p, err := netip.ParsePrefix(d.GetDocument().GetFields()["subnet"].GetStringValue()); err == nil {
				gw = p.Masked().Addr().Next()
				break
			}
		}
		if time.Now().After(deadline) {
			fail("node %d's subnet not in node 1's state %v after joining", i, c.timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
	res.inState = time.Since(joined)
	res.gw = gw.String()
	to := netip.AddrPortFrom(gw, dnsPort)
	res.reached = make([]time.Duration, nodes)
	res.reachedOK = make([]bool, nodes)
	var wgr sync.WaitGroup
	for k := range nodes {
		wgr.Go(func() {
			pctx, pcancel := context.WithTimeout(ctx, c.timeout)
			defer pcancel()
			hit := make(chan time.Duration, 1)
			var attempts sync.WaitGroup
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
		loop:
			for {
				attempts.Go(func() {
					wg.InNetns(b.cl.NetnsPath(k+1), func() error {
						conn, err := net.DialTimeout("tcp4", to.String(), time.Second)
						if err == nil {
							conn.Close()
						}
						if err == nil || errors.Is(err, syscall.ECONNREFUSED) {
							select {
							case hit <- time.Since(joined):
							default:
							}
						}
						return nil
					})
				})
				select {
				case d := <-hit:
					res.reached[k], res.reachedOK[k] = d, true
					break loop
				case <-pctx.Done():
					break loop
				case <-tick.C:
				}
			}
			attempts.Wait()
		})
	}
	wgr.Wait()
	// Its netd's interface, for the cleanup of a stale UAPI socket.
	if nd, err := client.NewNetd(b.cl.RunDir(i), client.Retry{Attempts: 3}); err == nil {
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		if s, err := nd.Status(cctx, &netv1.StatusRequest{}); err == nil {
			b.netdIfaces = append(b.netdIfaces, s.GetInterface())
		}
		ccancel()
		nd.Close()
	}
	b.svc.join = res
}

// ---- the report ----

func (b *bench) reportServices() {
	c := b.c
	r := &b.svc
	fmt.Printf("## Published ports: through a node without the replica vs straight to the task\n\n")
	fmt.Printf("Same run and cluster as above. perf1 (its task on n1, %s) publishes port %d → %d; the HTTP server is Go's net/http in the benchmark process, listening inside the task's namespace (a 3-byte page), so it costs the same on every path. "+
		"The load generator is Go too: %d clients, each sending HTTP/1.1 GETs one after the other, on one connection (keep-alive) or on a new connection per request (`Connection: close`); each run lasts %v or %d requests, after a warm-up of a tenth of that; "+
		"%d run(s) per row, interleaved; req/s is the median of the runs [min–max], latency percentiles over all of a row's requests. "+
		"Clients on the host dial the nodes' addresses on the dev cluster bridge; the direct row runs in node 2's namespace and dials the task's overlay address, which is the path netd's proxy on node 2 takes to the task.\n\n",
		b.taskIP[0], publishedPort, httpPort, c.loadConns, c.loadFor, c.loadMax, c.runs)
	fmt.Println("| path | connections | req/s | p50 | p99 | errors | other processes (CPUs) |")
	fmt.Println("|---|---|---:|---:|---:|---:|---:|")
	for _, row := range r.loads {
		fmt.Printf("| %s | %s | %s | %s | %s | %d | %.2f |\n", row.name, row.mode, rateRange(row.rates), us(pct(row.all.lat, 50)), us(pct(row.all.lat, 99)), row.all.errs, row.others)
	}
	fmt.Println()
	var parts []string
	for _, mode := range []string{"keep-alive", "new connection per request"} {
		var p2, p1, d2 *loadRow
		for i := range r.loads {
			row := &r.loads[i]
			if row.mode != mode {
				continue
			}
			switch row.key {
			case "p2":
				p2 = row
			case "p1":
				p1 = row
			case "d2":
				d2 = row
			}
		}
		if p2 == nil || d2 == nil || p1 == nil {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s: published via n2 ÷ direct = **%.2f** (p50 latency %.2f×), published via n1 (the replica's node) ÷ direct = %.2f",
			mode, median(p2.rates)/median(d2.rates), float64(pct(p2.all.lat, 50))/float64(pct(d2.all.lat, 50)), median(p1.rates)/median(d2.rates)))
	}
	fmt.Printf("Ratios of median req/s: %s. Through n2 a request crosses netd's userspace proxy (accept, dial the task over the overlay, copy both ways) on top of the direct path.\n\n", strings.Join(parts, "; "))

	fmt.Printf("## Service DNS: queries/s and latency\n\n")
	fmt.Printf("%d clients inside task %s's namespace (perf2, on n2), each sending A queries one after the other over its own UDP socket for %v, %d run(s) per row, interleaved; every answer must hold perf1's task address %s. "+
		"The baseline serves the same two names with pkg/dns — the server netd runs — in the benchmark process, on the same namespace's loopback: the difference is the path to the node (veth, bridge) and netd's process.\n\n",
		c.loadConns, b.taskIDs[1], c.dnsFor, c.runs, b.taskIP[0])
	fmt.Println("| server | name | queries/s | p50 | p99 | errors | other processes (CPUs) |")
	fmt.Println("|---|---|---:|---:|---:|---:|---:|")
	for _, row := range r.dnsRows {
		fmt.Printf("| %s | `%s` | %s | %s | %s | %d | %.2f |\n", row.name, row.mode, rateRange(row.rates), us(pct(row.all.lat, 50)), us(pct(row.all.lat, 99)), row.all.errs, row.others)
	}
	fmt.Println()
	var dparts []string
	for i := 0; i+1 < len(r.dnsRows); i += 2 {
		n, base := r.dnsRows[i], r.dnsRows[i+1]
		dparts = append(dparts, fmt.Sprintf("`%s` %.2f", n.mode, median(n.rates)/median(base.rates)))
	}
	fmt.Printf("Node's DNS ÷ baseline, median queries/s: %s.\n\n", strings.Join(dparts, ", "))

	fmt.Printf("## DNS updates: a task healthy → in the answer, unhealthy → out of it\n\n")
	fmt.Printf("Service hc: %d replicas of `sleep 3; touch /tmp/bad; sleep …` with the health check `test ! -f /tmp/bad` every 500 ms (1 retry), so each task turns healthy and, about 3 s later, unhealthy (and schedd replaces it; the new ones do the same). "+
		"The moment a task turns is when a watch of `/tasks/` on either node's statd (the task's own node first, mostly) first shows its document running and healthy, or no longer so; "+
		"node 2's DNS is asked for `hc.shoal` from perf2's task every 5 ms, and the delay ends at the first answer that has (or no longer has) the task's address. "+
		"\"n2\" tasks are on the node whose DNS is asked (state reaches netd through the local statd), \"n1\" tasks on the other (through gossip first). Other processes used %.2f CPUs meanwhile.\n\n", c.healthTasks, r.updOther)
	fmt.Println("| transition | tasks (n2 / n1) | p50 | p99 | max | p50 n2 / n1 | of which state to n2's statd, p50 / max (n1 tasks) |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|")
	for _, u := range []struct {
		name string
		us   []update
	}{{"healthy → in the answer", r.appear}, {"unhealthy → out of the answer", r.leave}} {
		all, same, other := updateDelays(u.us)
		if len(all) == 0 {
			fmt.Printf("| %s | 0 | – | – | – | – | – |\n", u.name)
			continue
		}
		var gossip []time.Duration
		for _, x := range u.us {
			if !x.sameNode {
				gossip = append(gossip, x.state)
			}
		}
		slices.Sort(gossip)
		maxGossip := "–"
		if len(gossip) > 0 {
			maxGossip = ms(gossip[len(gossip)-1])
		}
		fmt.Printf("| %s | %d (%d / %d) | %s | %s | %s | %s / %s | %s / %s |\n", u.name, len(all), len(same), len(other),
			ms(pct(all, 50)), ms(pct(all, 99)), ms(all[len(all)-1]), msOr(same, 50), msOr(other, 50), msOr(gossip, 50), maxGossip)
	}
	fmt.Printf("\nThe design's promise is \"within a second\" of the change.\n\n")

	fmt.Printf("## Issue 5's timed points\n\n")
	fmt.Println("| point | goal | measured | met |")
	fmt.Println("|---|---|---|---|")
	if len(r.restarts) > 0 {
		var dnsT, portT, readyT []time.Duration
		allDNS := true
		for _, x := range r.restarts {
			if !x.dnsOK {
				allDNS = false
			}
			dnsT, portT, readyT = append(dnsT, x.dns), append(portT, x.port), append(readyT, x.ready)
		}
		worst := slices.Max(dnsT)
		met := allDNS && worst <= restartTarget
		fmt.Printf("| DNS answers a task again after netd restarts (node 2, %d restarts; from the start of the new netd) | ≤ %v | %s (worst %s) | %s |\n",
			len(r.restarts), restartTarget, durList(dnsT), durText(worst), yesNo(met))
		fmt.Printf("| published port serves again after the same restarts (host → n2:%d, new connection) | – | %s | – |\n", publishedPort, durList(portT))
		fmt.Printf("| … for reference: start until devcluster saw netd serve its socket | – | %s | – |\n", durList(readyT))
	}
	if j := r.join; j != nil {
		allOK := !slices.Contains(j.reachedOK, false)
		worst := slices.Max(j.reached)
		fmt.Printf("| a new node (n%d, %s) reachable from every other node after joining (TCP to its bridge address %s through the overlay, from n1 and n2; from the join command's return) | ≤ %v | %s (worst %s) | %s |\n",
			j.node, j.id, j.gw, joinTarget, durList(j.reached), durText(worst), yesNo(allOK && worst <= joinTarget))
		fmt.Printf("| … for reference: adding the node (its processes started, then the join command); from the join until its subnet was in n1's state | – | %s; %s | – |\n", durText(j.join), durText(j.inState))
	}
	fmt.Println()
	if len(r.restarts) > 0 {
		var dnsT []time.Duration
		for _, x := range r.restarts {
			dnsT = append(dnsT, x.dns)
		}
		if slices.Max(dnsT) > restartTarget {
			fmt.Printf("**DNS after a netd restart missed its goal of %v.**\n\n", restartTarget)
		}
	}
	if j := r.join; j != nil && slices.Max(j.reached) > joinTarget {
		fmt.Printf("**A new node was not reachable from every node within %v of joining.**\n\n", joinTarget)
	}
}

func updateDelays(us []update) (all, same, other []time.Duration) {
	for _, u := range us {
		all = append(all, u.delay)
		if u.sameNode {
			same = append(same, u.delay)
		} else {
			other = append(other, u.delay)
		}
	}
	slices.Sort(all)
	slices.Sort(same)
	slices.Sort(other)
	return all, same, other
}

func rateRange(v []float64) string {
	if len(v) == 1 {
		return fmt.Sprintf("%.0f", v[0])
	}
	return fmt.Sprintf("%.0f [%.0f–%.0f]", median(v), slices.Min(v), slices.Max(v))
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

func msOr(sorted []time.Duration, p int) string {
	if len(sorted) == 0 {
		return "–"
	}
	return ms(pct(sorted, p))
}

func durList(ds []time.Duration) string {
	var s []string
	for _, d := range ds {
		s = append(s, durText(d))
	}
	return strings.Join(s, ", ")
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}
