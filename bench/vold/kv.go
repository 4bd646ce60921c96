package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
	volv1 "github.com/shoal-dev/shoal/proto/shoal/vol/v1"

	"github.com/shoal-dev/shoal/bench/internal/cpuacct"
)

// voldMetricsAddr is where a node's vold serves Prometheus metrics inside
// its network namespace (devcluster's default for vold).
const voldMetricsAddr = "127.0.0.1:9464"

// metrics scrapes node i's vold metrics (shoal_vold_*, prefix dropped,
// go_memstats_heap_inuse_bytes, go_memstats_heap_released_bytes and
// go_gc_duration_seconds_count), from a socket made inside the node's
// network namespace.
func (b *bench) metrics(i int) (map[string]float64, error) {
	var conn net.Conn
	if err := b.cl.InNetns(i, func() error {
		var err error
		conn, err = net.DialTimeout("tcp", voldMetricsAddr, 2*time.Second)
		return err
	}); err != nil {
		return nil, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(conn, "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n"); err != nil {
		return nil, err
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(conn)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "shoal_vold_") && !strings.HasPrefix(line, "go_memstats_heap_inuse_bytes ") &&
			!strings.HasPrefix(line, "go_gc_duration_seconds_count ") && !strings.HasPrefix(line, "go_memstats_heap_released_bytes ") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		if v, err := strconv.ParseFloat(f[1], 64); err == nil {
			out[strings.TrimPrefix(f[0], "shoal_vold_")] = v
		}
	}
	return out, sc.Err()
}

// allMetrics scrapes every node (nil maps for nodes that do not answer).
func (b *bench) allMetrics() []map[string]float64 {
	out := make([]map[string]float64, nodes)
	for i := 1; i <= nodes; i++ {
		m, err := b.metrics(i)
		if err != nil {
			progress("metrics of node %d: %v", i, err)
			continue
		}
		out[i-1] = m
	}
	return out
}

type kvRun struct {
	lat     []time.Duration
	elapsed time.Duration
	errs    int
	perNode [nodes]int // acknowledged puts by the node whose socket served them
	// vold only: differences of the nodes' counters over the run.
	fwdOut, proposals [nodes]float64
	load              phaseLoad
}

func (r kvRun) rate() float64 { return perSecond(len(r.lat), r.elapsed) }

type kvResult struct {
	clients     int
	clientNodes [nodes]int // clients per node
	statd, vold kvRun
	// machines is the StateMachines API's Set (the issue's "state-machine
	// API": a typed command appended to a named machine's log once a
	// quorum applied it).
	machines kvRun
}

// kvPhase runs, for each client count, statd's durable Put (the baseline)
// and then vold's KV Put, with the clients spread over the three nodes'
// sockets. It returns the results and the system group's leader node.
func (b *bench) kvPhase(ctx context.Context) ([]kvResult, int) {
	c := b.c
	// The system group comes up on first use.
	deadline := time.Now().Add(c.timeout)
	for {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := b.vold[0].KV.Put(pctx, &volv1.PutRequest{Key: "bench/warmup", Value: []byte("x")})
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			fail("the KV API did not answer within %v: %v", c.timeout, err)
		}
		sleep(ctx, 200*time.Millisecond)
	}
	check(b.waitHealthy(ctx, 1, "_system", c.timeout))
	v, err := b.inspect(ctx, 1, "_system")
	check(err)
	leader := b.nodeOf(v.GetLeader())
	// Client k uses node first+k mod 3, first being a follower: a single
	// client goes through a node whose replica is not the leader.
	first := 0
	if leader == 1 {
		first = 1
	}
	value := []byte(strings.Repeat("v", 100))
	command, err := anypb.New(wrapperspb.Bytes(value))
	check(err)
	fields := map[string]*statev1.Value{"v": {Kind: &statev1.Value_StringValue{StringValue: string(value)}}}
	var out []kvResult
	for _, n := range c.kvClients {
		res := kvResult{clients: n}
		for k := range n {
			res.clientNodes[(first+k)%nodes]++
		}
		progress("  statd Put, %d clients", n)
		b.waitQuiet(ctx)
		res.statd = b.load(ctx, n, first, func(ctx context.Context, node, client, seq int) error {
			_, err := b.statd[node-1].Put(ctx, &statev1.PutRequest{Key: fmt.Sprintf("/bench/kv/c%d", client), Fields: fields})
			return err
		})
		progress("  statd: %.0f puts/s, p50 %s, p99 %s", res.statd.rate(), dur(pctl(res.statd.lat, 0.5)), dur(pctl(res.statd.lat, 0.99)))
		progress("  vold KV Put, %d clients", n)
		b.waitQuiet(ctx)
		m0 := b.allMetrics()
		res.vold = b.load(ctx, n, first, func(ctx context.Context, node, client, seq int) error {
			_, err := b.vold[node-1].KV.Put(ctx, &volv1.PutRequest{Key: fmt.Sprintf("bench/c%d", client), Value: value})
			return err
		})
		m1 := b.allMetrics()
		for i := range nodes {
			if m0[i] != nil && m1[i] != nil {
				res.vold.fwdOut[i] = m1[i]["forwarded_out_total"] - m0[i]["forwarded_out_total"]
				res.vold.proposals[i] = m1[i]["proposals_total"] - m0[i]["proposals_total"]
			}
		}
		progress("  vold: %.0f puts/s, p50 %s, p99 %s", res.vold.rate(), dur(pctl(res.vold.lat, 0.5)), dur(pctl(res.vold.lat, 0.99)))
		progress("  vold state machine Set, %d clients", n)
		b.waitQuiet(ctx)
		run := len(out)
		res.machines = b.load(ctx, n, first, func(ctx context.Context, node, client, seq int) error {
			// A machine per client and run: each log stays far below
			// its 8 MiB limit.
			_, err := b.vold[node-1].Machines.Set(ctx, &volv1.SetRequest{Machine: fmt.Sprintf("bench/r%d/c%d", run, client), Command: command})
			return err
		})
		progress("  vold Set: %.0f sets/s, p50 %s, p99 %s", res.machines.rate(), dur(pctl(res.machines.lat, 0.5)), dur(pctl(res.machines.lat, 0.99)))
		out = append(out, res)
	}
	return out, leader
}

// load runs n clients for c.kvDur, client k on node first+k mod 3, each
// calling op in a loop, and collects the latencies of those that
// succeeded.
func (b *bench) load(ctx context.Context, n, first int, op func(ctx context.Context, node, client, seq int) error) kvRun {
	var (
		mu  sync.Mutex
		run kvRun
		wg  sync.WaitGroup
	)
	l0 := b.acct.Take()
	t0 := time.Now()
	end := t0.Add(b.c.kvDur)
	for k := range n {
		node := 1 + (first+k)%nodes
		wg.Go(func() {
			var lat []time.Duration
			errs := 0
			for seq := 0; time.Now().Before(end) && ctx.Err() == nil; seq++ {
				octx, cancel := context.WithTimeout(ctx, 10*time.Second)
				s := time.Now()
				err := op(octx, node, k, seq)
				d := time.Since(s)
				cancel()
				if err != nil {
					errs++
					if errs == 1 {
						progress("  client %d on node %d: %v", k, node, err)
					}
					continue
				}
				lat = append(lat, d)
			}
			mu.Lock()
			run.lat = append(run.lat, lat...)
			run.errs += errs
			run.perNode[node-1] += len(lat)
			mu.Unlock()
		})
	}
	wg.Wait()
	run.elapsed = time.Since(t0)
	run.load = phaseLoad{cpuacct.Phase{A: l0, B: b.acct.Take()}}
	return run
}
