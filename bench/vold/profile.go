package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// runCPU: every write run also reports the CPU time this benchmark and
// its cluster (the writer, and every node's statd and vold) used during
// it, from the cpuacct cgroup. On a machine shared with other work it is
// a steadier measure of what a change costs than wall-clock throughput.
// Kernel work done outside those processes (block-layer flushes by
// kworkers) is not in it, for the local filesystem and the volume alike.

// startProfiles, with -profile DIR, fetches a CPU profile of every node's
// vold (started with --debug-pprof) over the next d (whole seconds, at
// least one), into DIR/<phase>-node<i>.pprof, or with -profile-trace an
// execution trace into DIR/<phase>-node<i>.trace (where goroutines wait:
// `go tool trace -pprof=sync` or `=sched`); the returned function waits
// for them. Without -profile it does nothing.
func (b *bench) startProfiles(ctx context.Context, phase string, d time.Duration) func() {
	if b.c.profileDir == "" {
		return func() {}
	}
	query, what, ext := fmt.Sprintf("profile?seconds=%d", max(1, int(d.Seconds()))), "CPU profile", "pprof"
	if b.c.profileTrace {
		query, what, ext = fmt.Sprintf("trace?seconds=%d", max(1, int(d.Seconds()))), "execution trace", "trace"
	}
	var wg sync.WaitGroup
	for i := 1; i <= nodes; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			path := filepath.Join(b.c.profileDir, fmt.Sprintf("%s-node%d.%s", phase, i, ext))
			if err := b.fetchProfile(ctx, i, query, path); err != nil {
				progress("%s of node %d's vold: %v", what, i, err)
				return
			}
			progress("  %s of node %d's vold: %s", what, i, path)
		}()
	}
	return wg.Wait
}

// heapProfiles, with -profile DIR, fetches every node's vold heap profile
// (after a GC, so in-use figures are live memory) into
// DIR/<phase>-heap-node<i>.pprof.
func (b *bench) heapProfiles(ctx context.Context, phase string) {
	if b.c.profileDir == "" {
		return
	}
	for i := 1; i <= nodes; i++ {
		path := filepath.Join(b.c.profileDir, fmt.Sprintf("%s-heap-node%d.pprof", phase, i))
		if err := b.fetchProfile(ctx, i, "heap?gc=1", path); err != nil {
			progress("heap profile of node %d's vold: %v", i, err)
			continue
		}
		progress("  heap profile of node %d's vold: %s", i, path)
	}
}

// nodeGet gets path from node i's vold metrics address (inside the
// node's network namespace); the caller closes the body.
func (b *bench) nodeGet(ctx context.Context, i int, path string, timeout time.Duration) (io.ReadCloser, error) {
	hc := &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var conn net.Conn
			err := b.cl.InNetns(i, func() error {
				var err error
				conn, err = (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, network, addr)
				return err
			})
			return conn, err
		}},
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s%s", voldMetricsAddr, path), nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		return nil, fmt.Errorf("%s: %s", resp.Status, msg)
	}
	return resp.Body, nil
}

// raftCounters is what a vold's metrics say of its Raft loop so far.
type raftCounters struct {
	syncs, rounds, snapshots uint64
	// sent is shoal_vold_raft_bytes_sent_total (Raft batches to other
	// nodes), transfers shoal_vold_raft_leader_transfers_total.
	sent, transfers uint64
	// syncTime is shoal_vold_raft_sync_seconds (the journal's synced
	// writes), mutateTime shoal_vold_fs_op_seconds{kind="mutate"} (the
	// filesystem mutations the node's mounts asked for).
	syncTime, mutateTime hist
}

// raftCounters reads every node's vold Raft counters (zero for a node
// that does not answer).
func (b *bench) raftCounters(ctx context.Context) []raftCounters {
	out := make([]raftCounters, nodes)
	for i := range out {
		body, err := b.nodeGet(ctx, i+1, "/metrics", 5*time.Second)
		if err != nil {
			progress("metrics of node %d's vold: %v", i+1, err)
			continue
		}
		out[i].syncTime, out[i].mutateTime = hist{}, hist{}
		sc := bufio.NewScanner(body)
		for sc.Scan() {
			parseBucket(out[i].syncTime, sc.Text(), "shoal_vold_raft_sync_seconds", "")
			parseBucket(out[i].mutateTime, sc.Text(), "shoal_vold_fs_op_seconds", `kind="mutate",`)
			name, v, ok := strings.Cut(sc.Text(), " ")
			if !ok {
				continue
			}
			n, _ := strconv.ParseFloat(v, 64)
			switch name {
			case "shoal_vold_raft_syncs_total":
				out[i].syncs = uint64(n)
			case "shoal_vold_raft_rounds_total":
				out[i].rounds = uint64(n)
			case "shoal_vold_raft_snapshots_taken_total":
				out[i].snapshots = uint64(n)
			case "shoal_vold_raft_bytes_sent_total":
				out[i].sent = uint64(n)
			case "shoal_vold_raft_leader_transfers_total":
				out[i].transfers = uint64(n)
			}
		}
		body.Close()
	}
	return out
}

// fetchProfile gets /debug/pprof/<query> from node i's vold and writes it
// to path.
func (b *bench) fetchProfile(ctx context.Context, i int, query, path string) error {
	body, err := b.nodeGet(ctx, i, "/debug/pprof/"+query, b.c.profileFor+30*time.Second)
	if err != nil {
		return err
	}
	defer body.Close()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
