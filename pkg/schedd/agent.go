package schedd

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	shoalrt "github.com/shoal-dev/shoal/pkg/runtime"
	"github.com/shoal-dev/shoal/pkg/sched"
	"github.com/shoal-dev/shoal/pkg/statepb"
	"github.com/shoal-dev/shoal/pkg/tasklog"
	netv1 "github.com/shoal-dev/shoal/proto/shoal/net/v1"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

// Labels schedd puts on its containers.
const (
	labelTask    = "io.shoal/task"
	labelService = "io.shoal/service"
	labelSlot    = "io.shoal/slot"
)

// localTask is a task this node accepted.
type localTask struct {
	sched.LocalTask
	// busy is set while a runtime operation (start, stop) runs for it.
	busy bool
	// stopProbe ends the task's health prober.
	stopProbe context.CancelFunc
}

// taskRecord is what schedd keeps on disk per accepted task: the task and
// the exact spec it runs, whatever the service document says later.
type taskRecord struct {
	Task sched.Task        `json:"task"`
	Spec sched.ServiceSpec `json:"spec"`
}

func (n *node) recordPath(id string) string {
	return filepath.Join(n.cfg.StateDir, "tasks", id+".json")
}

func (n *node) saveRecord(lt *localTask) error {
	data, err := json.Marshal(taskRecord{Task: lt.Task, Spec: lt.Spec})
	if err != nil {
		return err
	}
	return replaceFile(n.recordPath(lt.ID), data)
}

// replaceFile writes data to path whole: into a temporary file renamed
// over it, so that a crash leaves the old file or the new one, never a
// part.
func replaceFile(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// rawLogPath is the log of a task whose output the shim appends as
// printed (no shoal-logger, or a task started before it);
// recordLogPath that of one whose output shoal-logger writes as records
// (tasklog). A task has one or the other.
func (n *node) rawLogPath(id string) string {
	return filepath.Join(n.cfg.StateDir, "logs", id+".log")
}

func (n *node) recordLogPath(id string) string {
	return filepath.Join(n.cfg.StateDir, "logs", id+".records.log")
}

// acceptReserve is the target side of a Reserve: decide atomically against
// the ledger, and on accept write the task document and remember the task.
func (n *node) acceptReserve(ctx context.Context, a sched.Reserve) (bool, sched.Resources, sched.Reject, error) {
	if !n.isReady() {
		return false, sched.Resources{}, sched.Reject{}, errNotReady
	}
	now := time.Now()
	n.amu.Lock()
	defer n.amu.Unlock()
	if _, dup := n.local[a.TaskID]; dup {
		return true, n.ledger.Free(), sched.Reject{}, nil // a retried call
	}
	ok, free, why := n.ledger.Reserve(a.Reservation(), now)
	if !ok {
		n.reservesRejected.Add(1)
		return false, free, why, nil
	}
	n.reservesAccepted.Add(1)
	key := sched.TaskKey(a.TaskID)
	if err := n.put(ctx, key, sched.NewTaskFields(a, n.id, now)); err != nil {
		n.ledger.Release(a.TaskID)
		return false, n.ledger.Free(), sched.Reject{}, err
	}
	task := sched.NewTask(a, n.id)
	if d, err := n.getMeta(ctx, key); err == nil {
		if t, ok := sched.TaskFromDoc(a.TaskID, statepb.FromDocument(d)); ok {
			task = t
		}
	}
	lt := &localTask{LocalTask: sched.LocalTask{Task: task, Spec: a.Spec, Runtime: sched.Runtime{State: sched.RuntimeNone}}}
	if err := n.saveRecord(lt); err != nil {
		n.log.Warn("save task record", "task", a.TaskID, "err", err)
	}
	n.local[a.TaskID] = lt
	n.log.Info("task accepted", "task", a.TaskID, "service", a.Service, "slot", a.Slot, "version", a.Version)
	n.wake()
	return true, free, sched.Reject{}, nil
}

// view is what the agent decides from.
func (n *node) view() sched.NodeView {
	v := sched.NodeView{Node: n.id, Slots: map[string]sched.Slot{}, Removed: map[string]bool{}, Reservations: n.ledger.Reservations(), TTL: time.Duration(n.cfg.ReservationTTL)}
	n.amu.Lock()
	defer n.amu.Unlock()
	for _, lt := range n.local {
		v.Tasks = append(v.Tasks, lt.LocalTask)
		if n.mirror.Deleted(sched.ServiceKey(lt.Service)) {
			v.Removed[lt.Service] = true
		}
		k := sched.SlotKey(lt.Service, lt.Slot)
		if _, seen := v.Slots[k]; seen {
			continue
		}
		if d := n.mirror.Get(sched.SlotDocKey(lt.Service, lt.Slot)); d != nil {
			if sl, ok := sched.SlotFromDoc(lt.Service, lt.Slot, statepb.FromDocument(d)); ok {
				v.Slots[k] = sl
			}
		}
	}
	return v
}

// agentRounds runs the agent until it has nothing more to do now (a few
// rounds at most: one decision can enable the next).
func (n *node) agentRounds(ctx context.Context, now time.Time) {
	for range 3 {
		did := false
		for _, a := range sched.AgentDecide(n.view(), now) {
			if r, ok := a.(sched.Requeue); ok {
				if d := time.Until(r.At); d > 0 && d < time.Duration(n.cfg.Tick) {
					time.AfterFunc(d, n.wake)
				}
				continue
			}
			did = true
			n.execAgent(ctx, a)
		}
		if !did {
			return
		}
	}
}

func (n *node) execAgent(ctx context.Context, a sched.AgentAction) {
	switch a := a.(type) {
	case sched.StartTask:
		n.startTask(ctx, a.TaskID, false)
	case sched.RestartTask:
		n.startTask(ctx, a.TaskID, true)
	case sched.StopTask:
		n.stopTask(ctx, a)
	case sched.ClaimTask:
		n.log.Info("task claims its slot back", "task", a.TaskID, "against", a.Against)
		n.writeTask(ctx, a.TaskID, a.Apply, a.Fields())
	case sched.UpdateTask:
		lt := n.writeTask(ctx, a.TaskID, a.Apply, a.Fields())
		if lt == nil {
			return
		}
		// A task that will not run again gives its address back now, not
		// when its document is removed (an hour later): a node's /24 must
		// not fill up with the namespaces of stopped tasks.
		if a.State.Terminal() && n.usesNetd(lt.Spec) {
			if _, err := n.netd.Detach(ctx, &netv1.DetachRequest{Task: a.TaskID}); err != nil {
				n.log.Warn("release task network", "task", a.TaskID, "err", err)
			}
		}
		if a.State.Terminal() {
			n.unmountVolumes(ctx, a.TaskID, lt.Spec)
			n.unmountSecrets(a.TaskID)
		}
	case sched.ConfirmReservation:
		n.ledger.Confirm(a.TaskID)
	case sched.ReleaseReservation:
		n.ledger.Release(a.TaskID)
	case sched.RemoveTask:
		n.amu.Lock()
		lt := n.local[a.TaskID]
		delete(n.local, a.TaskID)
		n.amu.Unlock()
		if lt != nil && lt.stopProbe != nil {
			lt.stopProbe()
		}
		if err := n.rt.Remove(ctx, a.TaskID); err != nil {
			n.log.Warn("remove container", "task", a.TaskID, "err", err)
		}
		if lt != nil && n.usesNetd(lt.Spec) {
			if _, err := n.netd.Detach(ctx, &netv1.DetachRequest{Task: a.TaskID}); err != nil {
				n.log.Warn("release task network", "task", a.TaskID, "err", err)
			}
		}
		if lt != nil {
			n.unmountVolumes(ctx, a.TaskID, lt.Spec)
		}
		n.unmountSecrets(a.TaskID)
		n.statd.Delete(ctx, &statev1.DeleteRequest{Key: sched.TaskKey(a.TaskID)})
		os.Remove(n.recordPath(a.TaskID))
		os.Remove(n.rawLogPath(a.TaskID))
		if err := tasklog.Remove(n.recordLogPath(a.TaskID)); err != nil {
			n.log.Warn("remove task log", "task", a.TaskID, "err", err)
		}
	}
}

// writeTask applies a change to a local task's record and writes its
// fields into the task document; it returns the task (nil if unknown).
func (n *node) writeTask(ctx context.Context, id string, apply func(sched.Task) sched.Task, fields map[string]crdtValue) *localTask {
	n.amu.Lock()
	lt := n.local[id]
	if lt != nil {
		lt.Task = apply(lt.Task)
		n.saveRecord(lt)
	}
	n.amu.Unlock()
	if lt == nil {
		return nil
	}
	if err := n.put(ctx, sched.TaskKey(id), fields); err != nil {
		n.log.Warn("write task document", "task", id, "err", err)
	}
	return lt
}

// startTask starts (or restarts) a task's container in the background.
func (n *node) startTask(ctx context.Context, id string, restart bool) {
	n.amu.Lock()
	lt := n.local[id]
	if lt == nil || lt.busy || lt.Runtime.State == sched.RuntimeRunning {
		n.amu.Unlock()
		return
	}
	lt.busy = true
	lt.Runtime = sched.Runtime{State: sched.RuntimeStarting}
	spec, task := lt.Spec, lt.Task
	n.amu.Unlock()

	go func() {
		err := n.ensureImage(ctx, spec.Image)
		health := spec.Health
		if err == nil {
			health = n.imageHealth(ctx, spec)
		}
		if err == nil && restart {
			err = n.rt.Remove(ctx, id)
		}
		var ts shoalrt.TaskSpec
		if err == nil {
			ts, err = n.taskSpec(task, spec)
		}
		if err == nil {
			err = n.attach(ctx, task, spec, &ts)
		}
		if err == nil {
			err = n.mountVolumes(ctx, task, spec, &ts)
		}
		if err == nil {
			err = n.mountSecrets(ctx, task, spec, &ts)
		}
		if err == nil {
			err = n.rt.Run(ctx, ts)
			if errdefs.IsAlreadyExists(err) {
				// Left over from an attempt that failed half-way.
				if err = n.rt.Remove(ctx, id); err == nil {
					err = n.rt.Run(ctx, ts)
				}
			}
		}
		now := time.Now()
		n.amu.Lock()
		lt := n.local[id]
		if lt == nil {
			n.amu.Unlock()
			if err == nil {
				n.rt.Remove(context.Background(), id)
			}
			n.unmountSecrets(id)
			return
		}
		lt.busy = false
		if err != nil {
			lt.Runtime = sched.Runtime{State: sched.RuntimeExited, ExitCode: -1, Error: err.Error(), ExitedAt: now, StartFailed: true}
			n.amu.Unlock()
			n.log.Warn("task start failed", "task", id, "err", err)
			n.wake()
			return
		}
		lt.Runtime = sched.Runtime{State: sched.RuntimeRunning, StartedAt: now}
		if health.Enabled() && !lt.Spec.Health.Enabled() {
			// The image's check, kept with the task's spec: its restarts,
			// and a schedd restarted meanwhile, run the same.
			lt.Spec.Health = health
			if err := n.saveRecord(lt); err != nil {
				n.log.Warn("save task record", "task", id, "err", err)
			}
		}
		n.watchTask(ctx, lt)
		n.amu.Unlock()
		n.log.Info("task started", "task", id, "service", task.Service, "slot", task.Slot)
		n.wake()
	}()
}

// imageHealth is the health check a task of spec runs: its own, or,
// unless it disables it, its image's HEALTHCHECK (as Docker and Swarm
// run it).
func (n *node) imageHealth(ctx context.Context, spec sched.ServiceSpec) sched.HealthCheck {
	if spec.Health.Enabled() || spec.Health.Disable {
		return spec.Health
	}
	img, err := n.rt.Image(ctx, spec.Image)
	if err != nil || img.Healthcheck == nil {
		return spec.Health
	}
	h := img.Healthcheck
	return spec.Health.ImageHealthCheck(h.Test, h.Interval, h.Timeout, h.StartPeriod, h.Retries)
}

// usesNetd reports whether a task gets its network namespace from netd.
func (n *node) usesNetd(spec sched.ServiceSpec) bool {
	return n.cfg.TaskNetwork == "netd" && spec.Network != sched.NetworkHost
}

// attach asks netd for the task's network namespace (the same one again
// on a restart) and records the task's address in its document.
func (n *node) attach(ctx context.Context, t sched.Task, spec sched.ServiceSpec, ts *shoalrt.TaskSpec) error {
	if !n.usesNetd(spec) {
		return nil
	}
	resp, err := n.netd.Attach(ctx, &netv1.AttachRequest{Task: t.ID, Service: t.Service})
	if err != nil {
		return fmt.Errorf("task network from shoal-netd: %w", err)
	}
	ts.NetNSPath = resp.GetNetns()
	ts.Mounts = append(ts.Mounts, shoalrt.Mount{Source: resp.GetResolvConf(), Target: "/etc/resolv.conf", ReadOnly: true})
	return n.put(ctx, sched.TaskKey(t.ID), map[string]crdtValue{"ip": stringValue(resp.GetIp())})
}

// capabilities are the runtime's names of a spec's capabilities (checked
// at its creation; one a newer schedd knows and this one does not is
// left out).
func capabilities(names []string) []string {
	var out []string
	for _, n := range names {
		if c, err := sched.Capability(n); err == nil {
			out = append(out, c)
		}
	}
	return out
}

// hostLines are a spec's extra hosts as /etc/hosts lines.
func hostLines(entries []string) []string {
	var out []string
	for _, e := range entries {
		if name, ip, err := sched.ParseHost(e); err == nil { // checked at create
			out = append(out, ip.String()+"\t"+name)
		}
	}
	return out
}

// taskSpec is the container spec of a task.
func (n *node) taskSpec(t sched.Task, spec sched.ServiceSpec) (shoalrt.TaskSpec, error) {
	self := sched.Node{ID: n.id}
	if d := n.mirror.Get(sched.NodeKey(n.id)); d != nil {
		self = sched.NodeFromDoc(n.id, statepb.FromDocument(d), true)
	}
	tc := sched.NewTemplateContext(spec, t, self)
	hostname, err := spec.TaskHostname(tc)
	if err != nil {
		return shoalrt.TaskSpec{}, err
	}
	env, err := spec.TaskEnv(tc)
	if err != nil {
		return shoalrt.TaskSpec{}, err
	}
	initPath := ""
	if spec.Init {
		if initPath, err = besideSchedd("shoal-init"); err != nil {
			return shoalrt.TaskSpec{}, fmt.Errorf("--init: %w", err)
		}
	}
	ts := shoalrt.TaskSpec{
		ID:          t.ID,
		Image:       spec.Image,
		Args:        spec.Args,
		Entrypoint:  spec.Entrypoint,
		User:        spec.User,
		WorkDir:     spec.WorkDir,
		ReadOnly:    spec.ReadOnly,
		Init:        initPath,
		CapAdd:      capabilities(spec.CapAdd),
		CapDrop:     capabilities(spec.CapDrop),
		Ulimits:     spec.Ulimits,
		Sysctls:     spec.Sysctls,
		Hosts:       hostLines(spec.Hosts),
		StopSignal:  spec.StopSignal,
		Env:         env,
		Labels:      map[string]string{labelTask: t.ID, labelService: t.Service, labelSlot: t.Slot},
		CPUMillis:   spec.CPUMillis,
		MemoryBytes: spec.MemoryBytes,
		PidsLimit:   spec.PidsLimit,
		Groups:      spec.Groups,
		LogPath:     n.rawLogPath(t.ID),
		Hostname:    cmp.Or(hostname, strings.ReplaceAll(t.Service+"-"+t.Slot, ".", "-")),
	}
	switch {
	case spec.Log.Driver == sched.LogDriverNone:
		ts.LogPath = ""
	case n.logger != "":
		limits := n.logLimits
		if spec.Log.MaxSize > 0 {
			limits.MaxSize = spec.Log.MaxSize
		}
		if spec.Log.MaxFiles > 0 {
			limits.MaxFiles = spec.Log.MaxFiles
		}
		ts.LogPath, ts.LogBinary = n.recordLogPath(t.ID), n.logger
		ts.LogArgs = tasklog.LoggerArgs(ts.LogPath, limits)
	}
	for _, e := range spec.Binds {
		m, err := sched.ParseBind(e)
		if err != nil {
			continue // validated on create
		}
		// Said here, in the task's error: runc's would name neither the
		// path nor the node.
		if _, err := os.Stat(m.Source); err != nil {
			return shoalrt.TaskSpec{}, fmt.Errorf("bind %s: the host path on node %s: %w", e, n.id, err)
		}
		ts.Mounts = append(ts.Mounts, shoalrt.Mount{Source: m.Source, Target: m.Target, ReadOnly: m.ReadOnly})
	}
	for _, e := range spec.Tmpfs {
		if m, err := sched.ParseTmpfs(e); err == nil { // validated on create
			ts.Mounts = append(ts.Mounts, shoalrt.Mount{Target: m.Target, Tmpfs: true, SizeBytes: m.SizeBytes})
		}
	}
	return ts, nil
}

// watchTask follows a running container: its exit, and its health checks.
// Callers hold amu.
func (n *node) watchTask(ctx context.Context, lt *localTask) {
	id := lt.ID
	wctx, cancel := context.WithCancel(ctx)
	if lt.stopProbe != nil {
		lt.stopProbe()
	}
	lt.stopProbe = cancel
	go func() {
		for {
			ch, err := n.rt.Wait(wctx, id)
			if err == nil {
				select {
				case exit := <-ch:
					if exit.Err == nil {
						n.exited(id, exit)
						cancel()
						return
					}
				case <-wctx.Done():
					return
				}
			}
			select {
			case <-wctx.Done():
				return
			case <-time.After(time.Second): // containerd away: wait again
			}
		}
	}()
	if h := lt.Spec.WithDefaults().Health; h.Enabled() {
		go n.probe(wctx, id, h, n.usesNetd(lt.Spec))
	}
	if len(lt.Spec.Volumes) > 0 {
		go n.watchVolumes(wctx, id, lt.Spec)
	}
}

func (n *node) exited(id string, exit shoalrt.Exit) {
	n.amu.Lock()
	if lt := n.local[id]; lt != nil && (lt.Runtime.State == sched.RuntimeRunning || lt.Runtime.State == sched.RuntimeStopping) {
		at := exit.ExitedAt
		if at.IsZero() {
			at = time.Now()
		}
		lt.Runtime.State, lt.Runtime.ExitCode, lt.Runtime.ExitedAt = sched.RuntimeExited, exit.Code, at
		n.log.Info("task exited", "task", id, "code", exit.Code)
	}
	n.amu.Unlock()
	n.wake()
}

// probe runs a task's health check every interval. Failures within the
// start period do not count; a success always does
// (sched.Runtime.RecordHealthCheck).
func (n *node) probe(ctx context.Context, id string, h sched.HealthCheck, overlay bool) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(h.Interval.D()):
		}
		cctx, cancel := context.WithTimeout(ctx, h.Timeout.D())
		pass := n.checkHealth(cctx, id, h, overlay)
		cancel()
		if ctx.Err() != nil {
			return
		}
		n.amu.Lock()
		if lt := n.local[id]; lt != nil && lt.Runtime.State == sched.RuntimeRunning {
			lt.Runtime.RecordHealthCheck(h, pass, time.Now())
		}
		n.amu.Unlock()
		n.wake()
	}
}

// stopTask stops a container in the background (SIGTERM, grace, SIGKILL).
func (n *node) stopTask(ctx context.Context, a sched.StopTask) {
	n.amu.Lock()
	lt := n.local[a.TaskID]
	if lt == nil || lt.busy || (lt.Runtime.State != sched.RuntimeRunning && lt.Runtime.State != sched.RuntimeStarting) {
		n.amu.Unlock()
		return
	}
	lt.busy = true
	lt.Runtime.State = sched.RuntimeStopping
	if lt.stopProbe != nil {
		lt.stopProbe()
	}
	n.amu.Unlock()
	n.log.Info("stopping task", "task", a.TaskID, "reason", a.Reason)
	go func() {
		exit, err := n.rt.Stop(ctx, a.TaskID, a.Grace)
		n.amu.Lock()
		if lt := n.local[a.TaskID]; lt != nil {
			lt.busy = false
			lt.Runtime.State, lt.Runtime.ExitCode, lt.Runtime.ExitedAt = sched.RuntimeExited, exit.Code, time.Now()
			if err != nil && !errdefs.IsNotFound(err) {
				lt.Runtime.Error = err.Error()
			}
		}
		n.amu.Unlock()
		n.wake()
	}()
}

// adopt rebuilds the local task table after a (re)start from the records
// on disk and the containers containerd still has: running containers are
// watched again, never restarted.
func (n *node) adopt(ctx context.Context) error {
	infos, err := n.rt.List(ctx)
	if err != nil {
		return err
	}
	containers := map[string]shoalrt.TaskInfo{}
	for _, ti := range infos {
		if id := ti.Labels[labelTask]; id != "" {
			containers[id] = ti
		}
	}
	entries, _ := os.ReadDir(filepath.Join(n.cfg.StateDir, "tasks"))
	n.amu.Lock()
	defer n.amu.Unlock()
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			continue
		}
		data, err := os.ReadFile(filepath.Join(n.cfg.StateDir, "tasks", e.Name()))
		var rec taskRecord
		if err == nil {
			err = json.Unmarshal(data, &rec)
		}
		if err != nil {
			n.log.Warn("unreadable task record", "file", e.Name(), "err", err)
			continue
		}
		if d := n.mirror.Get(sched.TaskKey(id)); d != nil {
			if t, ok := sched.TaskFromDoc(id, statepb.FromDocument(d)); ok {
				rec.Task = t
			}
		}
		lt := &localTask{LocalTask: sched.LocalTask{Task: rec.Task, Spec: rec.Spec, Runtime: sched.Runtime{State: sched.RuntimeNone}}}
		if ti, ok := containers[id]; ok {
			delete(containers, id)
			switch ti.Status {
			case shoalrt.StatusRunning:
				started := ti.StartedAt
				if started.IsZero() {
					started = time.Now()
				}
				lt.Runtime = sched.Runtime{State: sched.RuntimeRunning, StartedAt: started, HealthPassed: lt.Health == sched.HealthHealthy}
				n.watchTask(ctx, lt)
			default:
				lt.Runtime = sched.Runtime{State: sched.RuntimeExited, ExitCode: ti.ExitCode, ExitedAt: ti.ExitedAt, StartedAt: ti.StartedAt}
			}
		}
		n.local[id] = lt
		if !lt.State.Terminal() {
			n.ledger.Adopt(sched.Reservation{TaskID: id, Service: lt.Service, Slot: lt.Slot, Version: lt.Version,
				Resources: lt.Resources, Ports: lt.Ports, Created: time.Now(), Confirmed: true})
		}
	}
	n.dropStaleSecrets()
	// Containers no record explains were started by a schedd that lost
	// its records: nothing will look after them, so remove them.
	for id := range containers {
		n.log.Warn("removing a container no task record explains", "container", id)
		if err := n.rt.Remove(ctx, id); err != nil && !errors.Is(err, context.Canceled) {
			n.log.Warn("remove orphan container", "container", id, "err", err)
		}
	}
	return nil
}
