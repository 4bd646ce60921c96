package runtime

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	cg1 "github.com/containerd/cgroups/v3/cgroup1/stats"
	cg2 "github.com/containerd/cgroups/v3/cgroup2/stats"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
)

// unlimited: the kernel reports "no limit" as a page-rounded MaxInt64
// (cgroup v1) or containerd as MaxUint64 (cgroup v2 "max"); no real limit
// comes near.
const unlimited = 1 << 62

// Stats implements Runtime.
func (r *Containerd) Stats(ctx context.Context, id string) (Stats, error) {
	ctx = r.WithNamespace(ctx)
	c, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return Stats{}, wrapf(err, "stats of task %s", id)
	}
	task, err := c.Task(ctx, nil)
	if errdefs.IsNotFound(classify(err)) {
		// The container is there but was never started: it exists, so
		// this is not NotFound.
		return Stats{}, fmt.Errorf("stats of task %s: no task started: %w", id, errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		return Stats{}, wrapf(err, "stats of task %s", id)
	}
	// The state is asked only when the metrics fail (a task that is not
	// running has no cgroup to read): a round trip less a sample.
	metric, err := task.Metrics(ctx)
	if err != nil {
		// containerd skips tasks whose metrics fail, which one that just
		// exited does: say so rather than "no metrics received".
		if rerr := r.statsRunning(ctx, task, id); rerr != nil {
			return Stats{}, rerr
		}
		return Stats{}, wrapf(err, "stats of task %s: metrics", id)
	}
	s := Stats{Time: time.Now()}
	if err := decodeMetrics(metric.GetData(), &s); err != nil {
		return Stats{}, fmt.Errorf("stats of task %s: %w", id, err)
	}
	rx, tx, err := readNetDev(task.Pid())
	if err != nil {
		if rerr := r.statsRunning(ctx, task, id); rerr != nil {
			return Stats{}, rerr
		}
		return Stats{}, fmt.Errorf("stats of task %s: network: %w", id, err)
	}
	s.NetRxBytes, s.NetTxBytes = rx, tx
	return s, nil
}

// statsRunning returns nil if task runs, else FailedPrecondition (or why its
// status is unknown).
func (r *Containerd) statsRunning(ctx context.Context, task client.Task, id string) error {
	st, err := task.Status(ctx)
	if err != nil {
		return wrapf(err, "stats of task %s", id)
	}
	if st.Status != client.Running {
		return fmt.Errorf("stats of task %s: task is %s: %w", id, st.Status, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// decodeMetrics fills s from the cgroup metrics the shim reports, v1 or
// v2 depending on the node's cgroup hierarchy.
func decodeMetrics(data typeurl.Any, s *Stats) error {
	if data == nil || data.GetTypeUrl() == "" {
		return errors.New("metrics carry no data")
	}
	v, err := typeurl.UnmarshalAny(data)
	if err != nil {
		return fmt.Errorf("decode metrics of type %s: %w", data.GetTypeUrl(), err)
	}
	switch m := v.(type) {
	case *cg1.Metrics:
		s.CPUNanos = m.GetCPU().GetUsage().GetTotal()
		mem := m.GetMemory()
		s.MemoryBytes = mem.GetUsage().GetUsage()
		if inactive := mem.GetTotalInactiveFile(); inactive < s.MemoryBytes {
			s.MemoryBytes -= inactive
		}
		s.MemoryLimitBytes = limitOf(mem.GetUsage().GetLimit())
		s.Pids = m.GetPids().GetCurrent()
		for _, e := range m.GetBlkio().GetIoServiceBytesRecursive() {
			switch {
			case strings.EqualFold(e.GetOp(), "read"):
				s.BlockReadBytes += e.GetValue()
			case strings.EqualFold(e.GetOp(), "write"):
				s.BlockWriteBytes += e.GetValue()
			}
		}
	case *cg2.Metrics:
		s.CPUNanos = m.GetCPU().GetUsageUsec() * 1000
		mem := m.GetMemory()
		s.MemoryBytes = mem.GetUsage()
		if inactive := mem.GetInactiveFile(); inactive < s.MemoryBytes {
			s.MemoryBytes -= inactive
		}
		s.MemoryLimitBytes = limitOf(mem.GetUsageLimit())
		s.Pids = m.GetPids().GetCurrent()
		for _, e := range m.GetIo().GetUsage() {
			s.BlockReadBytes += e.GetRbytes()
			s.BlockWriteBytes += e.GetWbytes()
		}
	default:
		return fmt.Errorf("metrics of type %s (%T): neither cgroup v1 nor v2: %w", data.GetTypeUrl(), v, errdefs.ErrNotImplemented)
	}
	return nil
}

func limitOf(v uint64) uint64 {
	if v >= unlimited {
		return 0
	}
	return v
}

// readNetDev sums the traffic of the network namespace of process pid;
// none for a task in our own namespace (host network, no netd), whose
// figures would be the node's, as docker stats shows none for such
// containers. NB: cgroups do not count network traffic, hence /proc; pid
// is in the shim's pid namespace, which is ours as long as schedd runs on
// the host.
func readNetDev(pid uint32) (rx, tx uint64, err error) {
	theirs, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return 0, 0, err
	}
	if ours, err := os.Readlink("/proc/self/ns/net"); err == nil && ours == theirs {
		return 0, 0, nil
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/net/dev", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	return parseNetDev(f)
}

// parseNetDev sums the received and transmitted bytes of a
// /proc/net/dev's interfaces but lo.
func parseNetDev(r io.Reader) (rx, tx uint64, err error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		// The two header lines have no colon; on old kernels a large
		// counter touches it ("eth0:123"), so split there, not on space.
		name, counters, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		name = strings.TrimSpace(name)
		if name == "lo" {
			continue
		}
		f := strings.Fields(counters)
		if len(f) < 16 {
			return 0, 0, fmt.Errorf("net/dev: interface %s: %d fields, want 16", name, len(f))
		}
		r, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("net/dev: interface %s: %w", name, err)
		}
		t, err := strconv.ParseUint(f[8], 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("net/dev: interface %s: %w", name, err)
		}
		rx += r
		tx += t
	}
	return rx, tx, sc.Err()
}
