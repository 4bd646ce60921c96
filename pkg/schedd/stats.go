package schedd

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/shoal-dev/shoal/pkg/sched"
	schedv1 "github.com/shoal-dev/shoal/proto/shoal/sched/v1"
)

// minStatsInterval keeps a streaming sampler from turning into a busy
// loop against containerd.
const minStatsInterval = 100 * time.Millisecond

func (s *api) TaskStats(req *schedv1.TaskStatsRequest, stream schedv1.Scheduler_TaskStatsServer) error {
	if err := s.ready(); err != nil {
		return err
	}
	interval := req.GetInterval().AsDuration()
	if req.GetInterval() != nil && interval < minStatsInterval {
		return fmt.Errorf("stats interval %v is below %v: %w", interval, minStatsInterval, errdefs.ErrInvalidArgument)
	}
	tasks, err := s.n.statsTasks(req)
	if err != nil {
		return err
	}
	byNode := map[string][]sched.Task{}
	for _, t := range tasks {
		byNode[t.Node] = append(byNode[t.Node], t)
	}
	var mu sync.Mutex
	send := func(r *schedv1.TaskStatsReply) error {
		mu.Lock()
		defer mu.Unlock()
		return stream.Send(r)
	}
	g, ctx := errgroup.WithContext(stream.Context())
	for node, ts := range byNode {
		ids := make([]string, len(ts))
		for i, t := range ts {
			ids[i] = t.ID
		}
		if node == s.n.id {
			g.Go(func() error { return s.n.localStats(ctx, ids, interval, req.GetCount(), send) })
			continue
		}
		g.Go(func() error {
			err := s.n.relayStats(ctx, node, &schedv1.TaskStatsRequest{Tasks: ids, Interval: req.GetInterval(), Count: req.GetCount()}, send)
			if err == nil || ctx.Err() != nil {
				return err
			}
			// A node that does not answer costs its own tasks' figures,
			// not the others': its tasks carry the reason.
			reply := &schedv1.TaskStatsReply{}
			for _, t := range ts {
				reply.Stats = append(reply.Stats, &schedv1.TaskStat{Task: t.ID, Service: t.Service, Slot: t.Slot, Node: t.Node,
					Time: timestamppb.Now(), Error: fmt.Sprintf("node %s did not answer: %v", t.Node, err)})
			}
			return send(reply)
		})
	}
	return g.Wait()
}

// statsTasks resolves what a stats request names: its tasks (each must
// exist), else the running tasks of its service or node, or every one.
func (n *node) statsTasks(req *schedv1.TaskStatsRequest) ([]sched.Task, error) {
	if len(req.GetTasks()) > 0 {
		var out []sched.Task
		seen := map[string]bool{}
		for _, ref := range req.GetTasks() {
			t, _, err := n.task(ref)
			if err != nil {
				return nil, err
			}
			if !seen[t.ID] {
				seen[t.ID] = true
				out = append(out, t)
			}
		}
		return out, nil
	}
	w := n.readWorld()
	node := req.GetNode()
	if node != "" {
		for _, nd := range w.nodes {
			if nd.Name == node {
				node = nd.ID
			}
		}
	}
	if svc := req.GetService(); svc != "" {
		if _, ok := w.services[svc]; !ok {
			return nil, fmt.Errorf("service %s not found: %w", svc, errdefs.ErrNotFound)
		}
	}
	out := []sched.Task{}
	for _, t := range w.allTasks {
		if t.State != sched.TaskRunning || (req.GetService() != "" && t.Service != req.GetService()) || (node != "" && t.Node != node) {
			continue
		}
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// relayStats streams node's samples of its tasks to send.
func (n *node) relayStats(ctx context.Context, node string, req *schedv1.TaskStatsRequest, send func(*schedv1.TaskStatsReply) error) error {
	api, err := n.peers.client(ctx, node)
	if err != nil {
		return err
	}
	remote, err := api.TaskStats(ctx, req)
	if err != nil {
		return err
	}
	return forward(remote.Recv, send)
}

// localStats samples this node's tasks ids, once with interval 0, else
// every interval, count times or (count 0) until ctx ends; each round is
// one reply.
func (n *node) localStats(ctx context.Context, ids []string, interval time.Duration, count uint32, send func(*schedv1.TaskStatsReply) error) error {
	for round := uint32(1); ; round++ {
		reply := &schedv1.TaskStatsReply{}
		for _, id := range ids {
			reply.Stats = append(reply.Stats, n.sampleTask(ctx, id))
		}
		if err := send(reply); err != nil {
			return err
		}
		if interval <= 0 || round == count {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
	}
}

// sampleTask takes one sample of local task id; what stops it is said in
// the sample's error.
func (n *node) sampleTask(ctx context.Context, id string) *schedv1.TaskStat {
	out := &schedv1.TaskStat{Task: id, Node: n.id, Time: timestamppb.Now()}
	n.amu.Lock()
	lt, ok := n.local[id]
	running := false
	if ok {
		out.Service, out.Slot = lt.Task.Service, lt.Task.Slot
		running = lt.Runtime.State == sched.RuntimeRunning
	}
	n.amu.Unlock()
	switch {
	case !ok:
		out.Error = "task does not run on this node"
		return out
	case !running:
		out.Error = "task is not running"
		return out
	}
	st, err := n.rt.Stats(ctx, id)
	if err != nil {
		// "not running" from the runtime, say, in a task that just exited.
		out.Error = strings.TrimSpace(err.Error())
		return out
	}
	out.Time = timestamppb.New(st.Time)
	out.CpuNanos, out.MemoryBytes, out.MemoryLimitBytes, out.Pids = st.CPUNanos, st.MemoryBytes, st.MemoryLimitBytes, st.Pids
	out.NetRxBytes, out.NetTxBytes = st.NetRxBytes, st.NetTxBytes
	out.BlockReadBytes, out.BlockWriteBytes = st.BlockReadBytes, st.BlockWriteBytes
	return out
}
