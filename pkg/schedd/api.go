package schedd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	shoalrt "github.com/shoal-dev/shoal/pkg/runtime"
	"github.com/shoal-dev/shoal/pkg/sched"
	"github.com/shoal-dev/shoal/pkg/tasklog"
	schedv1 "github.com/shoal-dev/shoal/proto/shoal/sched/v1"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

// api serves shoal.sched.v1.Scheduler on the local socket.
type api struct {
	schedv1.UnimplementedSchedulerServer
	n *node
}

func (s *api) ready() error {
	if !s.n.isReady() {
		return errNotReady
	}
	return nil
}

// decodeSpec parses and validates a spec from the API.
func decodeSpec(data []byte) (sched.ServiceSpec, error) {
	var spec sched.ServiceSpec
	if err := json.Unmarshal(data, &spec); err != nil {
		return spec, fmt.Errorf("malformed service spec: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	spec = spec.WithDefaults()
	if err := spec.Validate(); err != nil {
		return spec, fmt.Errorf("%v: %w", err, errdefs.ErrInvalidArgument)
	}
	return spec, nil
}

// checkPlaceable rejects specs no node could ever run, before anything is
// written: an image the cluster does not have, more memory or CPU than any
// node offers, a host port another service already publishes, a secret or
// config that does not exist and is not pending (keyed as in state).
func (s *api) checkPlaceable(ctx context.Context, spec sched.ServiceSpec, pending map[string]bool) error {
	n := s.n
	var most sched.Resources
	for _, nd := range n.nodes() {
		most.CPUMillis = max(most.CPUMillis, nd.Capacity.CPUMillis)
		most.MemoryBytes = max(most.MemoryBytes, nd.Capacity.MemoryBytes)
	}
	if spec.MemoryBytes > most.MemoryBytes {
		return fmt.Errorf("memory %s per task is more than any node offers (largest: %s): %w",
			sched.FormatBytes(spec.MemoryBytes), sched.FormatBytes(most.MemoryBytes), errdefs.ErrInvalidArgument)
	}
	if spec.CPUMillis > most.CPUMillis {
		return fmt.Errorf("cpu %s per task is more than any node offers (largest: %s): %w",
			sched.FormatCPU(spec.CPUMillis), sched.FormatCPU(most.CPUMillis), errdefs.ErrInvalidArgument)
	}
	w := n.readWorld()
	for name, other := range w.services {
		if name == spec.Name {
			continue
		}
		for _, p := range spec.Ports {
			for _, q := range other.Spec.Ports {
				if p.Host == q.Host && strings.EqualFold(cmpProto(p.Protocol), cmpProto(q.Protocol)) {
					return fmt.Errorf("port %d/%s is already published by service %s: %w", p.Host, cmpProto(p.Protocol), name, errdefs.ErrAlreadyExists)
				}
			}
		}
	}
	if err := n.checkSecrets(ctx, spec, pending); err != nil {
		return err
	}
	// An image that names its registry is pulled by the first node that
	// needs it; any other must already be in the cluster. Checked last:
	// an image no node holds waits imageArrival before it is refused.
	if _, perr := shoalrt.PullableRef(spec.Image); perr != nil && !n.awaitImage(ctx, spec.Image, imageArrival) {
		return fmt.Errorf("image %q is not on any node (none reported it within %v): load it with `shoalctl image load FILE`, or name its registry (host[:port]/path:tag) to pull it: %w", spec.Image, imageArrival, errdefs.ErrInvalidArgument)
	}
	return nil
}

func cmpProto(p string) string {
	if p == "" {
		return "tcp"
	}
	return p
}

// service reads a service from statd directly (not the mirror): writes
// base their version on it.
func (s *api) service(ctx context.Context, name string) (*sched.Service, error) {
	d, err := s.n.getMeta(ctx, sched.ServiceKey(name))
	if err != nil {
		if errdefs.IsNotFound(err) || strings.Contains(err.Error(), "not found") {
			return nil, fmt.Errorf("service %s not found: %w", name, errdefs.ErrNotFound)
		}
		return nil, err
	}
	svc, err := serviceFromDoc(name, d)
	if err != nil {
		return nil, err
	}
	if svc == nil {
		return nil, fmt.Errorf("service %s not found: %w", name, errdefs.ErrNotFound)
	}
	return svc, nil
}

func (s *api) CreateService(ctx context.Context, req *schedv1.CreateServiceRequest) (*schedv1.Service, error) {
	if err := s.ready(); err != nil {
		return nil, err
	}
	spec, err := decodeSpec(req.GetSpec())
	if err != nil {
		return nil, err
	}
	if _, err := s.service(ctx, spec.Name); err == nil {
		return nil, fmt.Errorf("service %s already exists (use `shoalctl service update` or `deploy`): %w", spec.Name, errdefs.ErrAlreadyExists)
	} else if !errdefs.IsNotFound(err) {
		return nil, err
	}
	if err := s.checkPlaceable(ctx, spec, nil); err != nil {
		return nil, err
	}
	return s.write(ctx, nextVersion(nil, spec))
}

func (s *api) write(ctx context.Context, svc sched.Service) (*schedv1.Service, error) {
	fields := sched.ServiceFields(svc)
	fields[fieldUnschedulable] = stringValue("")
	if svc.PrevSpec == nil {
		// A create (updates always keep a previous spec): reset the
		// rollout record a leftover of a removed service of the same
		// name may hold (see serviceFromDoc), or the new service would
		// count as converged up to the old version and its updates
		// would not be watched for failure.
		fields[fieldConverged] = intValue(0)
	}
	if err := s.n.put(ctx, sched.ServiceKey(svc.Name), fields); err != nil {
		return nil, err
	}
	s.n.wake()
	return s.describe(&svc), nil
}

// update makes spec the service's new version, keeping the old for
// rollback.
func (s *api) update(ctx context.Context, spec sched.ServiceSpec) (*schedv1.Service, error) {
	cur, err := s.service(ctx, spec.Name)
	if err != nil {
		return nil, err
	}
	if err := s.checkPlaceable(ctx, spec, nil); err != nil {
		return nil, err
	}
	return s.write(ctx, nextVersion(cur, spec))
}

func (s *api) UpdateService(ctx context.Context, req *schedv1.UpdateServiceRequest) (*schedv1.Service, error) {
	if err := s.ready(); err != nil {
		return nil, err
	}
	spec, err := decodeSpec(req.GetSpec())
	if err != nil {
		return nil, err
	}
	return s.update(ctx, spec)
}

func (s *api) DeployService(ctx context.Context, req *schedv1.UpdateServiceRequest) (*schedv1.Service, error) {
	if err := s.ready(); err != nil {
		return nil, err
	}
	spec, err := decodeSpec(req.GetSpec())
	if err != nil {
		return nil, err
	}
	svc, change, err := s.planDeploy(ctx, spec, nil)
	if err != nil {
		return nil, err
	}
	if !change {
		return s.describe(&svc), nil
	}
	return s.write(ctx, svc)
}

func (s *api) CheckDeploy(ctx context.Context, req *schedv1.CheckDeployRequest) (*schedv1.Service, error) {
	if err := s.ready(); err != nil {
		return nil, err
	}
	spec, err := decodeSpec(req.GetSpec())
	if err != nil {
		return nil, err
	}
	pending := map[string]bool{}
	for _, name := range req.GetNewSecrets() {
		pending[secretKind.prefix+name] = true
	}
	for _, name := range req.GetNewConfigs() {
		pending[configKind.prefix+name] = true
	}
	svc, _, err := s.planDeploy(ctx, spec, pending)
	if err != nil {
		return nil, err
	}
	return s.describe(&svc), nil
}

// planDeploy is what deploying spec would make of its service, checked
// (with pending as checkPlaceable takes it) but not written: change is
// false when the deploy would leave the service as it is. Deploy is
// declarative: a file that asks for what an active service already is
// changes nothing. Without this, every re-deploy bumped the version and
// overwrote prev_spec with the current spec, so a later rollback went
// nowhere. A paused or rolling-back service gets a new version, which
// resumes the rollout.
func (s *api) planDeploy(ctx context.Context, spec sched.ServiceSpec, pending map[string]bool) (sched.Service, bool, error) {
	cur, err := s.service(ctx, spec.Name)
	switch {
	case errdefs.IsNotFound(err):
		cur = nil
	case err != nil:
		return sched.Service{}, false, err
	case cur.State == sched.ServiceActive && sameSpec(cur.Spec, spec):
		return *cur, false, nil
	}
	if err := s.checkPlaceable(ctx, spec, pending); err != nil {
		return sched.Service{}, false, err
	}
	return nextVersion(cur, spec), true, nil
}

// nextVersion is service cur (nil: none yet) with spec as its new
// version, the current one kept for rollback.
func nextVersion(cur *sched.Service, spec sched.ServiceSpec) sched.Service {
	if cur == nil {
		return sched.Service{Name: spec.Name, Spec: spec, Version: 1, State: sched.ServiceActive, Updated: time.Now()}
	}
	prev := cur.Spec
	return sched.Service{Name: spec.Name, Spec: spec, Version: cur.Version + 1, PrevSpec: &prev, State: sched.ServiceActive, Converged: cur.Converged, Updated: time.Now()}
}

// sameSpec reports whether two specs are the same once defaults are
// applied (replicas and update config included: they are part of what a
// deploy asks for, though not of the task digest).
func sameSpec(a, b sched.ServiceSpec) bool {
	ja, err1 := json.Marshal(a.WithDefaults())
	jb, err2 := json.Marshal(b.WithDefaults())
	return err1 == nil && err2 == nil && bytes.Equal(ja, jb)
}

func (s *api) ScaleService(ctx context.Context, req *schedv1.ScaleServiceRequest) (*schedv1.Service, error) {
	if err := s.ready(); err != nil {
		return nil, err
	}
	cur, err := s.service(ctx, req.GetName())
	if err != nil {
		return nil, err
	}
	if cur.Spec.Global {
		return nil, fmt.Errorf("service %s is global: it runs on every eligible node and cannot be scaled: %w", req.GetName(), errdefs.ErrInvalidArgument)
	}
	spec := cur.Spec
	spec.Replicas = int(req.GetReplicas())
	return s.update(ctx, spec)
}

func (s *api) RollbackService(ctx context.Context, req *schedv1.GetServiceRequest) (*schedv1.Service, error) {
	if err := s.ready(); err != nil {
		return nil, err
	}
	cur, err := s.service(ctx, req.GetName())
	if err != nil {
		return nil, err
	}
	if cur.PrevSpec == nil {
		return nil, fmt.Errorf("service %s has no previous spec to roll back to: %w", req.GetName(), errdefs.ErrFailedPrecondition)
	}
	return s.write(ctx, nextVersion(cur, *cur.PrevSpec))
}

func (s *api) RemoveService(ctx context.Context, req *schedv1.GetServiceRequest) (*schedv1.RemoveServiceResponse, error) {
	if err := s.ready(); err != nil {
		return nil, err
	}
	if _, err := s.service(ctx, req.GetName()); err != nil {
		return nil, err
	}
	if _, err := s.n.statd.Delete(ctx, &statev1.DeleteRequest{Key: sched.ServiceKey(req.GetName())}); err != nil {
		return nil, err
	}
	s.n.wake()
	return &schedv1.RemoveServiceResponse{}, nil
}

func (s *api) GetService(ctx context.Context, req *schedv1.GetServiceRequest) (*schedv1.Service, error) {
	if err := s.ready(); err != nil {
		return nil, err
	}
	svc, err := s.service(ctx, req.GetName())
	if err != nil {
		return nil, err
	}
	return s.describe(svc), nil
}

func (s *api) ListServices(ctx context.Context, _ *schedv1.ListServicesRequest) (*schedv1.ListServicesResponse, error) {
	if err := s.ready(); err != nil {
		return nil, err
	}
	w := s.n.readWorld()
	resp := &schedv1.ListServicesResponse{}
	for _, name := range sortedKeys(w.services) {
		resp.Services = append(resp.Services, s.describe(w.services[name]))
	}
	return resp, nil
}

// describe adds the status every node can compute from state: running
// and desired counts, owner, unschedulable reasons.
func (s *api) describe(svc *sched.Service) *schedv1.Service {
	n := s.n
	w := n.readWorld()
	spec, _ := json.Marshal(svc.Spec)
	out := &schedv1.Service{
		Name: svc.Name, Spec: spec, Version: uint64(svc.Version), State: string(svc.State),
		Owner: sched.Owner(svc.Name, n.aliveNodes()), Updated: timestamppb.New(svc.Updated), HasPrevious: svc.PrevSpec != nil,
		Converged: uint64(svc.Converged),
	}
	if svc.State == "" {
		out.State = string(sched.ServiceActive)
	}
	if svc.RunVersion > 0 {
		out.LastRun = timestamppb.New(svc.Run)
	}
	if next := svc.NextRun(); !next.IsZero() {
		out.NextRun = timestamppb.New(next)
	}
	if svc.Spec.Global {
		// A paused node counts while its slot still names a task.
		held := map[string]bool{}
		for _, sl := range w.slots[svc.Name] {
			held[sl.Slot] = sl.Task != ""
		}
		for _, nd := range w.nodes {
			if nd.Alive && (nd.Availability == sched.Active || nd.Availability == sched.Pause && held[nd.ID]) && matches(svc.Spec, nd) {
				out.Desired++
			}
		}
	} else {
		out.Desired = uint32(svc.Spec.Replicas)
	}
	current := currentTasks(w.slots[svc.Name])
	up := map[string]bool{}
	for _, id := range n.aliveNodes() {
		up[id] = true
	}
	digest := svc.Spec.Digest()
	for _, t := range w.tasks[svc.Name] {
		// A dead node's tasks are not running, whatever they last said.
		if !current[t.ID] || t.SpecDigest != digest {
			continue
		}
		if up[t.Node] && t.State == sched.TaskRunning {
			out.Running++
		}
		// A job's task that exited 0 is complete, whether or not its
		// node is up now.
		if svc.Spec.Job && t.State == sched.TaskExited && t.ExitCode == 0 {
			out.Completed++
		}
	}
	if d := n.mirror.Get(sched.ServiceKey(svc.Name)); d != nil {
		if u := d.GetFields()[fieldUnschedulable].GetStringValue(); u != "" {
			out.Unschedulable = strings.Split(u, "\n")
		}
	}
	return out
}

// matches reports whether a node satisfies a spec's constraints.
func matches(spec sched.ServiceSpec, nd sched.Node) bool {
	cs, err := sched.ParseConstraints(spec.Constraints)
	if err != nil {
		return false
	}
	for _, c := range cs {
		if !c.Match(nd) {
			return false
		}
	}
	return true
}

// currentTasks returns the task IDs the slots name (current or next).
func currentTasks(slots []sched.Slot) map[string]bool {
	out := map[string]bool{}
	for _, sl := range slots {
		if sl.Task != "" {
			out[sl.Task] = true
		}
		if sl.Next != "" {
			out[sl.Next] = true
		}
	}
	return out
}

func taskProto(t sched.Task, current bool) *schedv1.Task {
	out := &schedv1.Task{
		Id: t.ID, Service: t.Service, Slot: t.Slot, Node: t.Node, Version: uint64(t.Version), State: string(t.State),
		Health: string(t.Health), Restarts: uint32(t.Restarts), ExitCode: int32(t.ExitCode), Error: t.Error,
		Current: current, Image: t.Image,
	}
	if !t.Created.TS.IsZero() {
		out.Created = timestamppb.New(t.Created.TS.Time())
	}
	if !t.Started.IsZero() {
		out.Started = timestamppb.New(t.Started)
	}
	if !t.Finished.IsZero() {
		out.Finished = timestamppb.New(t.Finished)
	}
	return out
}

func (s *api) ListTasks(ctx context.Context, req *schedv1.ListTasksRequest) (*schedv1.ListTasksResponse, error) {
	if err := s.ready(); err != nil {
		return nil, err
	}
	w := s.n.readWorld()
	nodeFilter := req.GetNode()
	if nodeFilter != "" {
		for _, nd := range w.nodes {
			if nd.Name == nodeFilter {
				nodeFilter = nd.ID
			}
		}
	}
	up := map[string]bool{}
	for _, id := range s.n.aliveNodes() {
		up[id] = true
	}
	resp := &schedv1.ListTasksResponse{}
	for svc, tasks := range w.tasks {
		if req.GetService() != "" && svc != req.GetService() {
			continue
		}
		current := currentTasks(w.slots[svc])
		for _, t := range tasks {
			if nodeFilter != "" && t.Node != nodeFilter {
				continue
			}
			if !req.GetAll() && t.State.Terminal() && !current[t.ID] {
				continue
			}
			tp := taskProto(t, current[t.ID])
			if !up[t.Node] {
				tp.NodeDown = true
				if tp.Error == "" {
					tp.Error = "node is down: state as last reported"
				}
			}
			resp.Tasks = append(resp.Tasks, tp)
		}
	}
	return resp, nil
}

func (s *api) GetTask(ctx context.Context, req *schedv1.GetTaskRequest) (*schedv1.Task, error) {
	if err := s.ready(); err != nil {
		return nil, err
	}
	t, current, err := s.n.task(req.GetId())
	if err != nil {
		return nil, err
	}
	return taskProto(t, current), nil
}

// task finds a task by ID (or unique ID prefix) in the mirror.
func (n *node) task(ref string) (sched.Task, bool, error) {
	return n.readWorld().task(ref)
}

// task resolves ref (an ID or a unique prefix of one) in w, and says
// whether the task is its slot's current one.
func (w world) task(ref string) (sched.Task, bool, error) {
	var hits []sched.Task
	for _, t := range w.allTasks {
		if t.ID == ref {
			hits = []sched.Task{t}
			break
		}
		if strings.HasPrefix(t.ID, ref) {
			hits = append(hits, t)
		}
	}
	switch len(hits) {
	case 0:
		return sched.Task{}, false, fmt.Errorf("task %s not found: %w", ref, errdefs.ErrNotFound)
	case 1:
		return hits[0], currentTasks(w.slots[hits[0].Service])[hits[0].ID], nil
	}
	return sched.Task{}, false, fmt.Errorf("task %q is ambiguous (%d tasks): %w", ref, len(hits), errdefs.ErrInvalidArgument)
}

func (s *api) TaskLogs(req *schedv1.TaskLogsRequest, stream schedv1.Scheduler_TaskLogsServer) error {
	ctx := stream.Context()
	return s.onTaskNode(ctx, req.GetTask(), func(id string) error {
		req.Task = id
		return s.n.localLogs(ctx, req, stream.Send)
	}, func(peer schedv1.SchedPeerClient, id string) error {
		req.Task = id
		remote, err := peer.TaskLogs(ctx, req)
		if err != nil {
			return err
		}
		return forward(remote.Recv, stream.Send)
	})
}

// onTaskNode resolves task ref and runs local with its ID when the task
// is on this node, else remote with its ID and the peer client of its
// node: what the calls that act on one task do first, from any node.
func (s *api) onTaskNode(ctx context.Context, ref string, local func(id string) error, remote func(peer schedv1.SchedPeerClient, id string) error) error {
	if err := s.ready(); err != nil {
		return err
	}
	t, _, err := s.n.task(ref)
	if err != nil {
		return err
	}
	if t.Node == s.n.id {
		return local(t.ID)
	}
	peer, err := s.n.peers.client(ctx, t.Node)
	if err != nil {
		return err
	}
	return remote(peer, t.ID)
}

// forward sends what recv gives until it ends (io.EOF: not an error).
func forward[T any](recv func() (T, error), send func(T) error) error {
	for {
		m, err := recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := send(m); err != nil {
			return err
		}
	}
}

// localLogs sends a local task's log, following it if asked: a log of
// records (shoal-logger's) as req asks, a raw one (the shim's, of a task
// started without shoal-logger) as it is.
func (n *node) localLogs(ctx context.Context, req *schedv1.TaskLogsRequest, send func(*schedv1.LogChunk) error) error {
	id := req.GetTask()
	if lt, ok := n.localTask(id); ok && lt.Spec.Log.Driver == sched.LogDriverNone {
		return fmt.Errorf("task %s keeps no log: its service discards its output (log driver none): %w", id, errdefs.ErrFailedPrecondition)
	}
	records, raw := n.recordLogPath(id), n.rawLogPath(id)
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }
	for !exists(records) && !exists(raw) {
		if _, ok := n.localTask(id); !ok {
			return fmt.Errorf("task %s does not run on this node: %w", id, errdefs.ErrNotFound)
		}
		if !req.GetFollow() || n.taskFinished(id) {
			return nil // it has printed nothing, or never started and will not
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(200 * time.Millisecond):
		}
	}
	if exists(records) {
		return n.sendRecords(ctx, records, req, send)
	}
	if req.GetSince() != nil || req.GetUntil() != nil {
		return nil // a raw log has no times: no line is known to be in the window
	}
	return n.sendRaw(ctx, raw, req, send)
}

// logChunkMax is about the most a LogChunk carries.
const logChunkMax = 32 << 10

// sendRecords sends the log of records at path, the lines of a stream
// gathered into chunks.
func (n *node) sendRecords(ctx context.Context, path string, req *schedv1.TaskLogsRequest, send func(*schedv1.LogChunk) error) error {
	id := req.GetTask()
	var (
		buf    []byte
		stderr bool
		// midLine: the stream's last record was a line's first part.
		midLine = map[bool]bool{}
	)
	flush := func() error {
		if len(buf) == 0 {
			return nil
		}
		err := send(&schedv1.LogChunk{Data: buf, Task: id, Stderr: stderr})
		buf = nil
		return err
	}
	opt := tasklog.ReadOptions{
		Tail:     int(req.GetTail()),
		Follow:   req.GetFollow(),
		Finished: func() bool { return n.taskFinished(id) },
		AtEnd:    flush,
	}
	if ts := req.GetSince(); ts != nil {
		opt.Since = ts.AsTime()
	}
	if ts := req.GetUntil(); ts != nil {
		opt.Until = ts.AsTime()
	}
	err := tasklog.Read(ctx, path, opt, func(r tasklog.Record) error {
		isErr := r.Stream == tasklog.Stderr
		if isErr != stderr || len(buf) >= logChunkMax {
			if err := flush(); err != nil {
				return err
			}
			stderr = isErr
		}
		if req.GetTimestamps() && !midLine[isErr] && !r.Time.IsZero() {
			buf = r.Time.UTC().AppendFormat(buf, tasklog.TimeLayout)
			buf = append(buf, ' ')
		}
		buf = append(buf, r.Content...)
		if !r.Partial {
			buf = append(buf, '\n')
		}
		midLine[isErr] = r.Partial
		return nil
	})
	if err != nil {
		return err
	}
	return flush()
}

// sendRaw sends the raw log at path.
func (n *node) sendRaw(ctx context.Context, path string, req *schedv1.TaskLogsRequest, send func(*schedv1.LogChunk) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if tail := req.GetTail(); tail > 0 {
		if err := seekTail(f, int(tail)); err != nil {
			return err
		}
	}
	buf := make([]byte, 64<<10)
	// A follow ends once the task has finished for good (like docker logs
	// -f when the container exits): at the first end of file after it was
	// seen finished, so lines written as it stopped are still sent.
	ended := false
	for {
		k, err := f.Read(buf)
		if k > 0 {
			if err := send(&schedv1.LogChunk{Data: append([]byte(nil), buf[:k]...), Task: req.GetTask()}); err != nil {
				return err
			}
			continue
		}
		if err != nil && err != io.EOF {
			return err
		}
		if !req.GetFollow() || ended {
			return nil
		}
		ended = n.taskFinished(req.GetTask())
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// seekTail positions f at the start of its last n lines.
func seekTail(f *os.File, n int) error {
	st, err := f.Stat()
	if err != nil {
		return err
	}
	size := st.Size()
	pos, lines := size, 0
	buf := make([]byte, 8<<10)
	for pos > 0 {
		step := min(int64(len(buf)), pos)
		pos -= step
		if _, err := f.ReadAt(buf[:step], pos); err != nil && err != io.EOF {
			return err
		}
		for i := step - 1; i >= 0; i-- {
			if buf[i] == '\n' && pos+i != size-1 {
				lines++
				if lines == n {
					_, err := f.Seek(pos+i+1, io.SeekStart)
					return err
				}
			}
		}
	}
	_, err = f.Seek(0, io.SeekStart)
	return err
}

// taskFinished reports whether a local task will write no more output:
// gone from this node, or terminal with its container no longer running
// (an unhealthy task is terminal while it stops).
func (n *node) taskFinished(id string) bool {
	n.amu.Lock()
	defer n.amu.Unlock()
	lt, ok := n.local[id]
	if !ok {
		return true
	}
	rs := lt.Runtime.State
	return lt.State.Terminal() && (rs == sched.RuntimeExited || rs == sched.RuntimeNone || rs == "")
}

func (n *node) localTask(id string) (*localTask, bool) {
	n.amu.Lock()
	defer n.amu.Unlock()
	lt, ok := n.local[id]
	return lt, ok
}

// execStream is what both the local API and the peer API give exec.
type execStream interface {
	Send(*schedv1.ExecOutput) error
	Recv() (*schedv1.ExecInput, error)
	Context() context.Context
}

func (s *api) TaskExec(stream schedv1.Scheduler_TaskExecServer) error {
	if err := s.ready(); err != nil {
		return err
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	return s.onTaskNode(stream.Context(), first.GetTask(), func(id string) error {
		first.Task = id
		return s.n.execWith(stream, first)
	}, func(peer schedv1.SchedPeerClient, id string) error {
		first.Task = id
		remote, err := peer.TaskExec(stream.Context())
		if err != nil {
			return err
		}
		if err := remote.Send(first); err != nil {
			return err
		}
		go func() {
			for {
				in, err := stream.Recv()
				if err != nil {
					remote.CloseSend()
					return
				}
				if remote.Send(in) != nil {
					return
				}
			}
		}()
		return forward(remote.Recv, stream.Send)
	})
}

func (n *node) localExec(stream schedv1.SchedPeer_TaskExecServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	return n.execWith(stream, first)
}

// execWith runs a command in a local task, streaming its I/O.
func (n *node) execWith(stream execStream, first *schedv1.ExecInput) error {
	if _, ok := n.localTask(first.GetTask()); !ok {
		return fmt.Errorf("task %s does not run on this node: %w", first.GetTask(), errdefs.ErrNotFound)
	}
	if len(first.GetArgs()) == 0 {
		return fmt.Errorf("no command given: %w", errdefs.ErrInvalidArgument)
	}
	var stdin io.Reader
	var pw *io.PipeWriter
	if !first.GetStdinClosed() {
		var pr *io.PipeReader
		pr, pw = io.Pipe()
		stdin = pr
	}
	var tty *shoalrt.Terminal
	var resize chan shoalrt.TerminalSize
	if first.GetTty() {
		resize = make(chan shoalrt.TerminalSize, 4)
		tty = &shoalrt.Terminal{Width: clampSize(first.GetWidth()), Height: clampSize(first.GetHeight()), Resize: resize}
	}
	if pw != nil || resize != nil {
		go execInput(stream, first, pw, resize)
	}
	out := &execWriter{send: stream.Send}
	code, err := n.rt.Exec(stream.Context(), first.GetTask(), first.GetArgs(), stdin, out.stdout(), out.stderr(), tty)
	if err != nil {
		return err
	}
	out.mu.Lock()
	defer out.mu.Unlock()
	return stream.Send(&schedv1.ExecOutput{Exited: true, ExitCode: int32(code)})
}

// execInput feeds what the client sends after its first message to an
// exec: stdin bytes to pw (closed at stdin's end; nil: stdin closed from
// the start) and terminal sizes to resize (nil: no terminal), until the
// stream ends. A resize that finds resize full replaces the oldest
// waiting there, so the last size the client sent is the one that stays.
func execInput(stream execStream, first *schedv1.ExecInput, pw *io.PipeWriter, resize chan shoalrt.TerminalSize) {
	if resize != nil {
		defer close(resize)
	}
	if pw != nil && len(first.GetStdin()) > 0 {
		if _, err := pw.Write(first.GetStdin()); err != nil {
			pw = nil
		}
	}
	for {
		in, err := stream.Recv()
		if err != nil {
			if pw != nil {
				pw.CloseWithError(err)
			}
			return
		}
		if pw != nil && len(in.GetStdin()) > 0 {
			if _, err := pw.Write(in.GetStdin()); err != nil {
				pw = nil
			}
		}
		if pw != nil && in.GetStdinClosed() {
			pw.Close()
			pw = nil
		}
		if resize != nil && in.GetWidth() > 0 && in.GetHeight() > 0 {
			size := shoalrt.TerminalSize{Width: clampSize(in.GetWidth()), Height: clampSize(in.GetHeight())}
			select {
			case resize <- size:
			default: // full: the oldest size goes, the newest counts
				select {
				case <-resize:
				default:
				}
				select {
				case resize <- size:
				default:
				}
			}
		}
		if pw == nil && resize == nil {
			return
		}
	}
}

// clampSize fits a terminal dimension into the runtime's uint16.
func clampSize(v uint32) uint16 { return uint16(min(v, 1<<16-1)) }

// execWriter turns writes on stdout and stderr into stream messages; a
// gRPC stream takes one sender at a time.
type execWriter struct {
	mu   sync.Mutex
	send func(*schedv1.ExecOutput) error
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

func (w *execWriter) stdout() io.Writer {
	return writerFunc(func(b []byte) (int, error) {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(b), w.send(&schedv1.ExecOutput{Stdout: append([]byte(nil), b...)})
	})
}

func (w *execWriter) stderr() io.Writer {
	return writerFunc(func(b []byte) (int, error) {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(b), w.send(&schedv1.ExecOutput{Stderr: append([]byte(nil), b...)})
	})
}

func (s *api) LoadImage(stream schedv1.Scheduler_LoadImageServer) error {
	imgs, err := s.n.loadImage(stream.Context(), func() ([]byte, error) {
		chunk, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		return chunk.GetData(), nil
	})
	if err != nil {
		return err
	}
	resp := &schedv1.LoadImageResponse{}
	for _, img := range imgs {
		resp.Images = append(resp.Images, &schedv1.Image{Name: familiar(img.Name), Digest: img.Digest.String(), Size: img.Size})
	}
	return stream.SendAndClose(resp)
}

func (s *api) ListImages(ctx context.Context, _ *schedv1.ListImagesRequest) (*schedv1.ListImagesResponse, error) {
	imgs, err := s.n.rt.Images(ctx)
	if err != nil {
		return nil, err
	}
	resp := &schedv1.ListImagesResponse{}
	seen := map[string]bool{}
	for _, img := range imgs {
		out := &schedv1.Image{Name: familiar(img.Name), Digest: img.Digest.String(), Size: img.Size}
		if s.n.isReady() {
			_, out.Nodes = s.n.imageHolders(img.Digest.String())
			slices.Sort(out.Nodes)
		}
		seen[out.Digest] = true
		resp.Images = append(resp.Images, out)
	}
	if s.n.isReady() {
		for _, d := range s.n.mirror.List(imagesPrefix) {
			dg := strings.TrimPrefix(d.GetKey(), imagesPrefix)
			if seen[dg] || imageRemoved(d) {
				continue
			}
			_, holders := s.n.imageHolders(dg)
			slices.Sort(holders)
			resp.Images = append(resp.Images, &schedv1.Image{Name: d.GetFields()["name"].GetStringValue(), Digest: dg, Size: d.GetFields()["size"].GetIntValue(), Nodes: holders})
		}
	}
	return resp, nil
}

func (s *api) RemoveImage(ctx context.Context, req *schedv1.RemoveImageRequest) (*schedv1.RemoveImageResponse, error) {
	if err := s.ready(); err != nil {
		return nil, err
	}
	return s.n.removeImage(ctx, req.GetRef(), removeWait(req.GetWait()))
}

func (s *api) RemoveSecret(ctx context.Context, req *schedv1.RemoveSecretRequest) (*schedv1.RemoveSecretResponse, error) {
	if err := s.ready(); err != nil {
		return nil, err
	}
	if err := s.n.removeSecret(ctx, kindOf(req.GetConfig()), req.GetName()); err != nil {
		return nil, err
	}
	return &schedv1.RemoveSecretResponse{}, nil
}

func (s *api) ForgetNodeTasks(ctx context.Context, req *schedv1.ForgetNodeTasksRequest) (*schedv1.ForgetNodeTasksResponse, error) {
	if err := s.ready(); err != nil {
		return nil, err
	}
	id := req.GetNodeId()
	switch {
	case id == "":
		return nil, fmt.Errorf("no node given: %w", errdefs.ErrInvalidArgument)
	case id == s.n.id:
		return nil, fmt.Errorf("node %s is this node: %w", id, errdefs.ErrFailedPrecondition)
	}
	// The node's document must be gone here, so that this node's view
	// agrees the node was removed (statd's RemoveNode deletes it locally).
	switch d, err := s.n.getMeta(ctx, sched.NodeKey(id)); {
	case err == nil && d != nil:
		return nil, fmt.Errorf("node %s is still a member (remove it first: `shoalctl node rm`): %w", id, errdefs.ErrFailedPrecondition)
	case err != nil && status.Code(err) != codes.NotFound:
		return nil, err
	}
	resp := &schedv1.ForgetNodeTasksResponse{}
	for _, t := range s.n.readWorld().allTasks {
		if t.Node != id {
			continue
		}
		if _, err := s.n.statd.Delete(ctx, &statev1.DeleteRequest{Key: sched.TaskKey(t.ID)}); err != nil {
			return resp, fmt.Errorf("task %s: %w", t.ID, err)
		}
		resp.Forgotten++
	}
	if resp.Forgotten > 0 {
		s.n.log.Info("task records of a removed node deleted", "node", id, "tasks", resp.Forgotten)
		s.n.wake()
	}
	return resp, nil
}

func (s *api) SetNodeAvailability(ctx context.Context, req *schedv1.SetNodeAvailabilityRequest) (*schedv1.SetNodeAvailabilityResponse, error) {
	if err := s.ready(); err != nil {
		return nil, err
	}
	a := sched.Availability(req.GetAvailability())
	if a != sched.Active && a != sched.Drain && a != sched.Pause {
		return nil, fmt.Errorf("availability %q: want active, pause or drain: %w", a, errdefs.ErrInvalidArgument)
	}
	if s.n.mirror.Get(sched.NodeKey(req.GetNode())) == nil {
		return nil, fmt.Errorf("node %s not found: %w", req.GetNode(), errdefs.ErrNotFound)
	}
	if err := s.n.put(ctx, sched.NodeKey(req.GetNode()), map[string]crdtValue{"availability": stringValue(string(a))}); err != nil {
		return nil, err
	}
	s.n.wake()
	if a != sched.Drain || !req.GetWait() {
		return &schedv1.SetNodeAvailabilityResponse{}, nil
	}
	// Wait until no task runs on the node any more.
	running := func() int {
		left := 0
		for _, t := range s.n.readWorld().allTasks {
			if t.Node == req.GetNode() && !t.State.Terminal() {
				left++
			}
		}
		return left
	}
	moved := running()
	for {
		left := running()
		if left == 0 {
			return &schedv1.SetNodeAvailabilityResponse{Moved: uint32(moved)}, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%d tasks still on node %s: %w", left, req.GetNode(), errors.Join(ctx.Err(), errdefs.ErrUnavailable))
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
