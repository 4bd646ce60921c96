package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
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
// vold (started with --debug-pprof) over the next -profile-duration, into
// DIR/<phase>-node<i>.pprof; the returned function waits for them.
// Without -profile it does nothing.
func (b *bench) startProfiles(ctx context.Context, phase string) func() {
	if b.c.profileDir == "" {
		return func() {}
	}
	query := fmt.Sprintf("profile?seconds=%d", int(b.c.profileFor.Seconds()))
	var wg sync.WaitGroup
	for i := 1; i <= nodes; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			path := filepath.Join(b.c.profileDir, fmt.Sprintf("%s-node%d.pprof", phase, i))
			if err := b.fetchProfile(ctx, i, query, path); err != nil {
				progress("CPU profile of node %d's vold: %v", i, err)
				return
			}
			progress("  CPU profile of node %d's vold: %s", i, path)
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

// fetchProfile gets /debug/pprof/<query> from node i's vold metrics
// address (inside the node's network namespace) and writes it to path.
func (b *bench) fetchProfile(ctx context.Context, i int, query, path string) error {
	hc := &http.Client{
		Timeout: b.c.profileFor + 30*time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var conn net.Conn
			err := b.cl.InNetns(i, func() error {
				var err error
				conn, err = (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, network, addr)
				return err
			})
			return conn, err
		}},
	}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/debug/pprof/%s", voldMetricsAddr, query), nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s", resp.Status, msg)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
