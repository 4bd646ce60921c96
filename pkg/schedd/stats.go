package schedd

import (
	"context"
	"fmt"
	"slices"
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
	var mu sync.Mutex
	send := func(r *schedv1.TaskStatsReply) error {
		mu.Lock()
		defer mu.Unlock()
		return stream.Send(r)
	}
	if len(req.GetTasks()) == 0 && req.GetCount() == 0 && interval > 0 {
		return s.n.followStats(stream.Context(), req, tasks, send)
	}
	g, ctx := errgroup.WithContext(stream.Context())
	for node, ts := range tasksByNode(tasks) {
		g.Go(func() error { return s.n.sampleNode(ctx, node, ts, req, send) })
	}
	return g.Wait()
}

// tasksByNode groups tasks by the node that runs them.
func tasksByNode(tasks []sched.Task) map[string][]sched.Task {
	out := map[string][]sched.Task{}
	for _, t := range tasks {
		out[t.Node] = append(out[t.Node], t)
	}
	return out
}

// sampleNode streams the samples of node's tasks ts to send: taken here,
// or relayed from that node's schedd. A node that does not answer costs
// its own tasks' figures, not the others': its tasks carry the reason.
func (n *node) sampleNode(ctx context.Context, node string, ts []sched.Task, req *schedv1.TaskStatsRequest, send func(*schedv1.TaskStatsReply) error) error {
	ids := make([]string, len(ts))
	for i, t := range ts {
		ids[i] = t.ID
	}
	interval := req.GetInterval().AsDuration()
	if node == n.id {
		return n.localStats(ctx, ids, interval, req.GetCount(), send)
	}
	err := n.relayStats(ctx, node, &schedv1.TaskStatsRequest{Tasks: ids, Interval: req.GetInterval(), Count: req.GetCount()}, send)
	if err == nil || ctx.Err() != nil {
		return err
	}
	reply := &schedv1.TaskStatsReply{}
	for _, t := range ts {
		reply.Stats = append(reply.Stats, &schedv1.TaskStat{Task: t.ID, Service: t.Service, Slot: t.Slot, Node: t.Node,
			Time: timestamppb.Now(), Error: fmt.Sprintf("node %s did not answer: %v", t.Node, err)})
	}
	return send(reply)
}

// closed reports whether c is closed.
func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// followStats streams the samples of a request that names no tasks until
// ctx ends, resolving its tasks again every interval (as docker stats
// follows containers that start): a node whose set changed is sampled
// anew, and tasks no longer in the set are sent as gone once their
// node's old sampler has stopped, so no sample of theirs follows. Once
// the service it follows is removed, every task is sent as gone and the
// stream ends without an error.
func (n *node) followStats(ctx context.Context, req *schedv1.TaskStatsRequest, tasks []sched.Task, send func(*schedv1.TaskStatsReply) error) error {
	type sampler struct {
		ids    []string
		cancel context.CancelFunc
		done   chan struct{}
	}
	samplers := map[string]*sampler{}
	stop := func(s *sampler) {
		s.cancel()
		<-s.done
	}
	defer func() {
		for _, s := range samplers {
			stop(s)
		}
	}()
	tick := time.NewTicker(req.GetInterval().AsDuration())
	defer tick.Stop()
	removed := false
	for {
		want := tasksByNode(tasks)
		var gone []string
		for node, s := range samplers {
			ts := want[node]
			if slices.EqualFunc(s.ids, ts, func(id string, t sched.Task) bool { return id == t.ID }) && !closed(s.done) {
				delete(want, node) // unchanged and sampling: kept
				continue
			}
			// Changed, or ended (its node did not answer): sampled anew.
			stop(s)
			delete(samplers, node)
			for _, id := range s.ids {
				if !slices.ContainsFunc(tasks, func(t sched.Task) bool { return t.ID == id }) {
					gone = append(gone, id)
				}
			}
		}
		if len(gone) > 0 {
			sort.Strings(gone)
			if err := send(&schedv1.TaskStatsReply{Gone: gone}); err != nil {
				return err
			}
		}
		if removed {
			return nil // every task sent as gone
		}
		for node, ts := range want {
			sctx, cancel := context.WithCancel(ctx)
			s := &sampler{cancel: cancel, done: make(chan struct{})}
			for _, t := range ts {
				s.ids = append(s.ids, t.ID)
			}
			samplers[node] = s
			go func() {
				defer close(s.done)
				// Its errors are the stream's, which ends with ctx.
				_ = n.sampleNode(sctx, node, ts, req, send)
			}()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		var err error
		if tasks, err = n.statsTasks(req); errdefs.IsNotFound(err) {
			// The service was removed (or the node) since the
			// stream began: its tasks go, and the stream ends as
			// docker stats ends with its containers.
			tasks, removed = nil, true
		} else if err != nil {
			return err
		}
	}
}

// statsTasks resolves what a stats request names: its tasks (each must
// exist), else the running tasks of its service or node, or every one.
func (n *node) statsTasks(req *schedv1.TaskStatsRequest) ([]sched.Task, error) {
	w := n.readWorld()
	if len(req.GetTasks()) > 0 {
		var out []sched.Task
		seen := map[string]bool{}
		for _, ref := range req.GetTasks() {
			t, _, err := w.task(ref)
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
