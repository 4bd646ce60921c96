package runtime

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	capability "github.com/containerd/containerd/v2/pkg/cap"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/identifiers"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	units "github.com/docker/go-units"
	"github.com/moby/sys/signal"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Internal container labels.
const (
	labelLogPath    = labelPrefix + "log-path"
	labelStopSignal = labelPrefix + "stop-signal"
)

// CFS period used for CPU limits: 100 ms, the kernel's default.
const cfsPeriod = 100_000

// taskDir holds a task's /etc files.
func (r *Containerd) taskDir(id string) string { return filepath.Join(r.cfg.StateDir, "tasks", id) }

// cleanupCtx returns a context for cleaning up after a failure: not
// cancelled with ctx, but bounded.
func cleanupCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
}

// Run implements Runtime.
func (r *Containerd) Run(ctx context.Context, spec TaskSpec) (retErr error) {
	if err := validateSpec(spec); err != nil {
		return err
	}
	ctx = r.WithNamespace(ctx)
	t0 := time.Now()
	rec, err := r.lookup(ctx, spec.Image)
	if err != nil {
		return fmt.Errorf("task %s: %w", spec.ID, err)
	}
	img := client.NewImageWithPlatform(r.client, rec, r.platform)
	if ok, err := img.IsUnpacked(ctx, r.cfg.Snapshotter); err != nil {
		return wrapf(err, "task %s: image %s", spec.ID, spec.Image)
	} else if !ok {
		if err := img.Unpack(ctx, r.cfg.Snapshotter); err != nil {
			return wrapf(err, "task %s: unpack image %s", spec.ID, spec.Image)
		}
	}
	// Refuse an ID in use before touching the task's files.
	if _, err := r.client.ContainerService().Get(ctx, spec.ID); err == nil {
		return fmt.Errorf("task %s: %w", spec.ID, errdefs.ErrAlreadyExists)
	} else if !errdefs.IsNotFound(classify(err)) {
		return wrapf(err, "task %s", spec.ID)
	}

	dir := r.taskDir(spec.ID)
	mounts, err := writeTaskFiles(dir, spec)
	if err != nil {
		return fmt.Errorf("task %s: %w", spec.ID, err)
	}
	defer func() {
		if retErr != nil && !errdefs.IsAlreadyExists(retErr) {
			os.RemoveAll(dir)
		}
	}()

	stopSignal := spec.StopSignal
	if stopSignal == "" {
		if stopSignal, err = client.GetOCIStopSignal(ctx, img, "SIGTERM"); err != nil {
			return wrapf(err, "task %s: image %s", spec.ID, spec.Image)
		}
	}
	labels := maps.Clone(spec.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[labelStopSignal] = stopSignal
	if spec.LogPath != "" {
		labels[labelLogPath] = spec.LogPath
	}

	specOpts, err := r.specOpts(img, spec, mounts)
	if err != nil {
		return fmt.Errorf("task %s: %w", spec.ID, err)
	}
	var runtimeOpts any
	if r.cfg.RuncRoot != "" {
		runtimeOpts = &runcoptions.Options{Root: r.cfg.RuncRoot}
	}
	c, err := r.client.NewContainer(ctx, spec.ID,
		client.WithImage(img),
		client.WithSnapshotter(r.cfg.Snapshotter),
		client.WithNewSnapshot(spec.ID, img),
		client.WithRuntime(r.cfg.Runtime, runtimeOpts),
		client.WithNewSpec(specOpts...),
		client.WithContainerLabels(labels),
	)
	if err != nil {
		return wrapf(err, "task %s: create container", spec.ID)
	}
	defer func() {
		if retErr != nil {
			cctx, cancel := cleanupCtx(ctx)
			defer cancel()
			if err := c.Delete(cctx, client.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(classify(err)) {
				r.log.Warn("delete container after failed run", "task", spec.ID, "err", err)
			}
		}
	}()
	t1 := time.Now()

	ioc := cio.NullIO
	switch {
	case spec.LogBinary != "":
		ioc = cio.BinaryIO(spec.LogBinary, spec.LogArgs)
	case spec.LogPath != "":
		ioc = cio.LogFile(spec.LogPath)
	}
	task, err := c.NewTask(ctx, ioc)
	if err != nil {
		err = classify(err)
		if errdefs.IsUnknown(err) && strings.Contains(err.Error(), "unable to start container process: exec:") {
			// runc could not exec the command (missing, not executable):
			// the spec's fault.
			err = fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
		}
		return fmt.Errorf("task %s: create task: %w", spec.ID, err)
	}
	t2 := time.Now()
	if err := task.Start(ctx); err != nil {
		cctx, cancel := cleanupCtx(ctx)
		defer cancel()
		if _, derr := task.Delete(cctx, client.WithProcessKill); derr != nil && !errdefs.IsNotFound(classify(derr)) {
			r.log.Warn("delete task after failed start", "task", spec.ID, "err", derr)
		}
		return wrapf(err, "task %s: start", spec.ID)
	}
	t3 := time.Now()
	r.log.Info("task started", "task", spec.ID, "image", familiarName(rec.Name), "pid", task.Pid(),
		"container_ms", ms(t1.Sub(t0)), "create_ms", ms(t2.Sub(t1)), "start_ms", ms(t3.Sub(t2)))
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// specOpts builds the OCI spec of a task.
func (r *Containerd) specOpts(img client.Image, spec TaskSpec, mounts []specs.Mount) ([]oci.SpecOpts, error) {
	opts := []oci.SpecOpts{}
	if len(spec.Args) > 0 {
		opts = append(opts, oci.WithImageConfigArgs(img, spec.Args))
	} else {
		opts = append(opts, oci.WithImageConfig(img))
	}
	if len(spec.Entrypoint) > 0 {
		opts = append(opts, oci.WithProcessArgs(append(slices.Clone(spec.Entrypoint), spec.Args...)...))
	}
	if spec.User != "" {
		opts = append(opts, oci.WithUser(spec.User))
	}
	if len(spec.Groups) > 0 {
		opts = append(opts, oci.WithAppendAdditionalGroups(spec.Groups...))
	}
	if spec.WorkDir != "" {
		opts = append(opts, oci.WithProcessCwd(spec.WorkDir))
	}
	if spec.ReadOnly {
		opts = append(opts, oci.WithRootFSReadonly())
	}
	opts = append(opts, capabilityOpts(spec.CapAdd, spec.CapDrop)...)
	for _, u := range spec.Ulimits {
		l, err := units.ParseUlimit(u)
		if err != nil {
			return nil, fmt.Errorf("ulimit %q: %v: %w", u, err, errdefs.ErrInvalidArgument)
		}
		opts = append(opts, oci.WithRlimit(&specs.POSIXRlimit{Type: "RLIMIT_" + strings.ToUpper(l.Name), Soft: uint64(l.Soft), Hard: uint64(l.Hard)}))
	}
	if len(spec.Sysctls) > 0 {
		opts = append(opts, withSysctls(spec.Sysctls))
	}
	opts = append(opts,
		oci.WithEnv(spec.Env),
		oci.WithHostname(hostnameOf(spec)),
		oci.WithMounts(mounts),
		oci.WithCgroup(path.Join(r.cfg.CgroupParent, spec.ID)),
	)
	if spec.Init != "" {
		opts = append(opts, withInit(spec.Init))
	}
	if spec.NetNSPath != "" {
		opts = append(opts, oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: spec.NetNSPath}))
	} else {
		opts = append(opts, oci.WithHostNamespace(specs.NetworkNamespace))
	}
	if spec.CPUMillis > 0 {
		opts = append(opts,
			oci.WithCPUCFS(spec.CPUMillis*cfsPeriod/1000, cfsPeriod),
			oci.WithCPUShares(uint64(max(2, spec.CPUMillis*1024/1000))))
	}
	if spec.MemoryBytes > 0 {
		opts = append(opts, oci.WithMemoryLimit(uint64(spec.MemoryBytes)))
	}
	if spec.PidsLimit > 0 {
		opts = append(opts, oci.WithPidsLimit(spec.PidsLimit))
	}
	return opts, nil
}

// InitPath is where a task's shoal-init is mounted.
const InitPath = "/sbin/shoal-init"

// withInit runs the process under shoal-init (host path init), mounted
// read-only at InitPath; it follows the options that set the arguments.
func withInit(init string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Process == nil || len(s.Process.Args) == 0 {
			return fmt.Errorf("--init: the task has no command: %w", errdefs.ErrInvalidArgument)
		}
		s.Process.Args = append([]string{InitPath, "--"}, s.Process.Args...)
		s.Mounts = append(s.Mounts, specs.Mount{Type: "bind", Source: init, Destination: InitPath, Options: []string{"rbind", "rprivate", "ro"}})
		return nil
	}
}

// withSysctls sets kernel parameters of the container's namespaces.
func withSysctls(kv map[string]string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Linux == nil {
			s.Linux = &specs.Linux{}
		}
		if s.Linux.Sysctl == nil {
			s.Linux.Sysctl = map[string]string{}
		}
		maps.Copy(s.Linux.Sysctl, kv)
		return nil
	}
}

// capabilityOpts applies Docker's rules for added and dropped
// capabilities to the default set.
func capabilityOpts(add, drop []string) []oci.SpecOpts {
	switch {
	case slices.Contains(add, "ALL"):
		return []oci.SpecOpts{oci.WithCapabilities(slices.DeleteFunc(slices.Clone(capability.Known()), func(c string) bool {
			return slices.Contains(drop, c)
		}))}
	case slices.Contains(drop, "ALL"):
		return []oci.SpecOpts{oci.WithCapabilities(slices.Clone(add))}
	}
	var opts []oci.SpecOpts
	if len(drop) > 0 {
		opts = append(opts, oci.WithDroppedCapabilities(drop))
	}
	if len(add) > 0 {
		opts = append(opts, oci.WithAddedCapabilities(add))
	}
	return opts
}

func hostnameOf(spec TaskSpec) string {
	if spec.Hostname != "" {
		return spec.Hostname
	}
	return spec.ID[:min(len(spec.ID), 63)]
}

// writeTaskFiles writes the task's /etc/hostname, /etc/hosts and
// /etc/resolv.conf (a copy of the host's) under dir, unless spec mounts
// its own, and returns all the task's mounts.
func writeTaskFiles(dir string, spec TaskSpec) ([]specs.Mount, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	hostname := hostnameOf(spec)
	files := []struct {
		target string
		data   func() ([]byte, error)
	}{
		{"/etc/hostname", func() ([]byte, error) { return []byte(hostname + "\n"), nil }},
		{"/etc/hosts", func() ([]byte, error) {
			hosts := "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t" + hostname + "\n"
			for _, h := range spec.Hosts {
				hosts += h + "\n"
			}
			return []byte(hosts), nil
		}},
		{"/etc/resolv.conf", func() ([]byte, error) {
			b, err := os.ReadFile("/etc/resolv.conf")
			if errors.Is(err, os.ErrNotExist) {
				return nil, nil
			}
			return b, err
		}},
	}
	var out []specs.Mount
	for _, f := range files {
		if slices.ContainsFunc(spec.Mounts, func(m Mount) bool { return path.Clean(m.Target) == f.target }) {
			continue
		}
		data, err := f.data()
		if err != nil {
			return nil, err
		}
		src := filepath.Join(dir, path.Base(f.target))
		if err := os.WriteFile(src, data, 0o644); err != nil {
			return nil, err
		}
		out = append(out, specs.Mount{Type: "bind", Source: src, Destination: f.target, Options: []string{"rbind", "rprivate", "rw"}})
	}
	for _, m := range spec.Mounts {
		mode := "rw"
		if m.ReadOnly {
			mode = "ro"
		}
		if m.Tmpfs {
			opts := []string{"nosuid", "nodev", "mode=1777", mode}
			if m.SizeBytes > 0 {
				opts = append(opts, "size="+strconv.FormatInt(m.SizeBytes, 10))
			}
			out = append(out, specs.Mount{Type: "tmpfs", Source: "tmpfs", Destination: m.Target, Options: opts})
			continue
		}
		out = append(out, specs.Mount{Type: "bind", Source: m.Source, Destination: m.Target, Options: []string{"rbind", "rprivate", mode}})
	}
	return out, nil
}

// validateSpec checks what containerd would reject late, or not at all.
func validateSpec(spec TaskSpec) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("task %s: %s: %w", spec.ID, fmt.Sprintf(format, args...), errdefs.ErrInvalidArgument)
	}
	if err := validID(spec.ID); err != nil {
		return err
	}
	if spec.Image == "" {
		return bad("no image")
	}
	if spec.CPUMillis < 0 || spec.MemoryBytes < 0 {
		return bad("negative resources")
	}
	if spec.LogPath != "" && !filepath.IsAbs(spec.LogPath) {
		return bad("log path %q is not absolute", spec.LogPath)
	}
	if spec.LogBinary != "" && !filepath.IsAbs(spec.LogBinary) {
		return bad("log binary %q is not absolute", spec.LogBinary)
	}
	if spec.NetNSPath != "" && !filepath.IsAbs(spec.NetNSPath) {
		return bad("netns path %q is not absolute", spec.NetNSPath)
	}
	if spec.WorkDir != "" && !filepath.IsAbs(spec.WorkDir) {
		return bad("working directory %q is not absolute", spec.WorkDir)
	}
	if strings.ContainsAny(spec.User, " \t\n") {
		return bad("user %q", spec.User)
	}
	for _, m := range spec.Mounts {
		switch {
		case m.Tmpfs && (m.Source != "" || !filepath.IsAbs(m.Target) || m.SizeBytes < 0):
			return bad("tmpfs mount %s: want an absolute target, no source and a size of 0 or more", m.Target)
		case !m.Tmpfs && (!filepath.IsAbs(m.Source) || !filepath.IsAbs(m.Target)):
			return bad("mount %s:%s: want absolute paths", m.Source, m.Target)
		}
	}
	for k := range spec.Labels {
		if strings.HasPrefix(k, labelPrefix) || strings.HasPrefix(k, containerdLabelsFrom) {
			return bad("label %q uses a reserved prefix", k)
		}
	}
	if spec.StopSignal != "" {
		if _, err := parseSignal(spec.StopSignal); err != nil {
			return bad("stop signal: %v", err)
		}
	}
	if len(spec.Hostname) > 63 || strings.ContainsAny(spec.Hostname, " \t\n/") {
		return bad("hostname %q", spec.Hostname)
	}
	return nil
}

// validID checks a task ID as containerd does (it names a container, a
// snapshot, a runc state dir and a cgroup).
func validID(id string) error {
	if err := identifiers.Validate(id); err != nil {
		return fmt.Errorf("task ID: %w", err)
	}
	return nil
}

// parseSignal parses "SIGTERM", "TERM" or "15".
func parseSignal(s string) (syscall.Signal, error) {
	return signal.ParseSignal(s)
}

// toExit converts a containerd exit status.
func toExit(es client.ExitStatus) Exit {
	code, at, err := es.Result()
	if err != nil {
		return Exit{Code: -1, Err: classify(err)}
	}
	return Exit{Code: int(code), ExitedAt: at}
}

// Stop implements Runtime.
func (r *Containerd) Stop(ctx context.Context, id string, grace time.Duration) (Exit, error) {
	ctx = r.WithNamespace(ctx)
	c, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return Exit{}, wrapf(err, "stop task %s", id)
	}
	task, err := c.Task(ctx, nil)
	if errdefs.IsNotFound(classify(err)) {
		return Exit{Code: -1}, nil
	}
	if err != nil {
		return Exit{}, wrapf(err, "stop task %s", id)
	}
	st, err := task.Status(ctx)
	if err != nil {
		return Exit{}, wrapf(err, "stop task %s", id)
	}
	if st.Status == client.Stopped {
		return Exit{Code: int(st.ExitStatus), ExitedAt: st.ExitTime}, nil
	}
	if st.Status == client.Paused || st.Status == client.Pausing {
		// A frozen process does not die of SIGKILL until thawed.
		if err := task.Resume(ctx); err != nil {
			r.log.Warn("resume before stop", "task", id, "err", err)
		}
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	exitC, err := task.Wait(wctx)
	if err != nil {
		return Exit{}, wrapf(err, "stop task %s: wait", id)
	}
	wait := func(timeout <-chan time.Time) (Exit, bool, error) {
		select {
		case es := <-exitC:
			e := toExit(es)
			if e.Err != nil {
				return Exit{}, true, fmt.Errorf("stop task %s: wait: %w", id, e.Err)
			}
			return e, true, nil
		case <-timeout:
			return Exit{}, false, nil
		case <-ctx.Done():
			return Exit{}, true, fmt.Errorf("stop task %s: %w", id, ctx.Err())
		}
	}
	if grace > 0 && st.Status != client.Created {
		sig := syscall.SIGTERM
		if info, err := c.Info(ctx, client.WithoutRefreshedMetadata); err == nil {
			if s, err := parseSignal(info.Labels[labelStopSignal]); err == nil {
				sig = s
			}
		}
		if err := task.Kill(ctx, sig); err != nil && !errdefs.IsNotFound(classify(err)) {
			return Exit{}, wrapf(err, "stop task %s: signal %s", id, sig)
		}
		timer := time.NewTimer(grace)
		defer timer.Stop()
		if e, done, err := wait(timer.C); done {
			return e, err
		}
		r.log.Info("task ignored its stop signal: killing it", "task", id, "grace", grace)
	}
	if err := task.Kill(ctx, syscall.SIGKILL); err != nil && !errdefs.IsNotFound(classify(err)) {
		return Exit{}, wrapf(err, "stop task %s: kill", id)
	}
	e, _, err := wait(nil)
	return e, err
}

// Remove implements Runtime.
func (r *Containerd) Remove(ctx context.Context, id string) error {
	ctx = r.WithNamespace(ctx)
	c, err := r.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(classify(err)) {
		// A Run that failed half-way may have left the container's
		// snapshot (until GC collects it): make the ID usable now.
		if sn := r.client.SnapshotService(r.cfg.Snapshotter); sn != nil {
			if err := sn.Remove(ctx, id); err != nil && !errdefs.IsNotFound(classify(err)) {
				return wrapf(err, "remove task %s: snapshot", id)
			}
		}
		os.RemoveAll(r.taskDir(id))
		return nil
	}
	if err != nil {
		return wrapf(err, "remove task %s", id)
	}
	task, err := c.Task(ctx, nil)
	switch {
	case err == nil:
		if _, err := task.Delete(ctx, client.WithProcessKill); err != nil && !errdefs.IsNotFound(classify(err)) {
			return wrapf(err, "remove task %s: delete task", id)
		}
	case !errdefs.IsNotFound(classify(err)):
		return wrapf(err, "remove task %s", id)
	}
	if err := c.Delete(ctx, client.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(classify(err)) {
		return wrapf(err, "remove task %s: delete container", id)
	}
	if err := os.RemoveAll(r.taskDir(id)); err != nil {
		return fmt.Errorf("remove task %s: %w", id, err)
	}
	r.log.Info("task removed", "task", id)
	return nil
}

// List implements Runtime.
func (r *Containerd) List(ctx context.Context) ([]TaskInfo, error) {
	ctx = r.WithNamespace(ctx)
	recs, err := r.client.ContainerService().List(ctx)
	if err != nil {
		return nil, wrapf(err, "list containers")
	}
	resp, err := r.client.TaskService().List(ctx, &tasksapi.ListTasksRequest{})
	if err != nil {
		return nil, wrapf(err, "list tasks")
	}
	procs := map[string]*tasktypes.Process{}
	for _, p := range resp.Tasks {
		id := p.ContainerID
		if id == "" {
			id = p.ID
		}
		procs[id] = p
	}
	out := make([]TaskInfo, 0, len(recs))
	for _, rec := range recs {
		ti := TaskInfo{
			ID:        rec.ID,
			Image:     familiarName(rec.Image),
			Labels:    userLabels(rec.Labels),
			Status:    StatusCreated,
			LogPath:   rec.Labels[labelLogPath],
			CreatedAt: rec.CreatedAt,
		}
		if p, ok := procs[rec.ID]; ok {
			ti.Pid = p.Pid
			switch p.Status {
			case tasktypes.Status_CREATED:
				ti.Status = StatusCreated
			case tasktypes.Status_RUNNING:
				ti.Status = StatusRunning
			case tasktypes.Status_STOPPED:
				ti.Status = StatusStopped
				ti.ExitCode = int(p.ExitStatus)
				if p.ExitedAt != nil {
					ti.ExitedAt = p.ExitedAt.AsTime()
				}
			case tasktypes.Status_PAUSED, tasktypes.Status_PAUSING:
				ti.Status = StatusPaused
			default:
				ti.Status = StatusUnknown
			}
			if ti.Status == StatusRunning || ti.Status == StatusPaused {
				ti.StartedAt = procStartTime(p.Pid)
			}
		}
		out = append(out, ti)
	}
	slices.SortFunc(out, func(a, b TaskInfo) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// userLabels drops the runtime's and containerd's own labels.
func userLabels(in map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range in {
		if !strings.HasPrefix(k, labelPrefix) && !strings.HasPrefix(k, containerdLabelsFrom) {
			out[k] = v
		}
	}
	return out
}

// Wait implements Runtime.
func (r *Containerd) Wait(ctx context.Context, id string) (<-chan Exit, error) {
	ctx = r.WithNamespace(ctx)
	c, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return nil, wrapf(err, "wait for task %s", id)
	}
	task, err := c.Task(ctx, nil)
	if err != nil {
		return nil, wrapf(err, "wait for task %s", id)
	}
	exitC, err := task.Wait(ctx)
	if err != nil {
		return nil, wrapf(err, "wait for task %s", id)
	}
	out := make(chan Exit, 1)
	go func() {
		defer close(out)
		es, ok := <-exitC
		if !ok {
			out <- Exit{Code: -1, Err: fmt.Errorf("wait for task %s: no exit status: %w", id, errdefs.ErrUnavailable)}
			return
		}
		out <- toExit(es)
	}()
	return out, nil
}

// Exec implements Runtime.
func (r *Containerd) Exec(ctx context.Context, id string, args []string, stdin io.Reader, stdout, stderr io.Writer, tty *Terminal) (int, error) {
	if len(args) == 0 {
		return -1, fmt.Errorf("exec in task %s: no command: %w", id, errdefs.ErrInvalidArgument)
	}
	ctx = r.WithNamespace(ctx)
	c, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return -1, wrapf(err, "exec in task %s", id)
	}
	task, err := c.Task(ctx, nil)
	if err != nil {
		return -1, wrapf(err, "exec in task %s", id)
	}
	if st, err := task.Status(ctx); err != nil {
		return -1, wrapf(err, "exec in task %s", id)
	} else if st.Status != client.Running {
		return -1, fmt.Errorf("exec in task %s: task is %s: %w", id, st.Status, errdefs.ErrFailedPrecondition)
	}
	spec, err := c.Spec(ctx)
	if err != nil {
		return -1, wrapf(err, "exec in task %s", id)
	}
	if spec.Process == nil {
		return -1, fmt.Errorf("exec in task %s: container spec has no process: %w", id, errdefs.ErrFailedPrecondition)
	}
	pspec := *spec.Process
	pspec.Args = args
	pspec.Terminal = tty != nil
	pspec.ConsoleSize = nil
	if tty != nil && tty.Width > 0 && tty.Height > 0 {
		pspec.ConsoleSize = &specs.Box{Width: uint(tty.Width), Height: uint(tty.Height)}
	}

	// NB: the shim holds the stdin FIFO open for writing too, so the
	// process sees EOF only after CloseIO. cio copies stdin before the
	// process exists: closing must wait until it does.
	var (
		proc  client.Process
		ready = make(chan struct{})
		once  sync.Once
	)
	markReady := func() { once.Do(func() { close(ready) }) }
	defer markReady()
	if stdin != nil {
		stdin = &eofReader{r: stdin, onEOF: func() {
			<-ready
			if proc != nil {
				cctx, cancel := cleanupCtx(ctx)
				defer cancel()
				proc.CloseIO(cctx, client.WithStdinCloser)
			}
		}}
	}
	if stdout != nil && stderr != nil {
		// NB: cio copies stdout and stderr in two goroutines (with
		// ReadFrom where the writer has it): one writer given as both, say
		// a bytes.Buffer, would be written concurrently and lose output.
		var mu sync.Mutex
		stdout, stderr = &lockedWriter{mu: &mu, w: stdout}, &lockedWriter{mu: &mu, w: stderr}
	}
	opts := []cio.Opt{cio.WithStreams(stdin, stdout, stderr), cio.WithFIFODir(filepath.Join(r.cfg.StateDir, "fifo"))}
	if tty != nil {
		opts = append(opts, cio.WithTerminal)
	}
	execID := "exec-" + randomHex(8)
	p, err := task.Exec(ctx, execID, &pspec, cio.NewCreator(opts...))
	if err != nil {
		return -1, wrapf(err, "exec in task %s", id)
	}
	proc = p
	markReady()
	defer func() {
		cctx, cancel := cleanupCtx(ctx)
		defer cancel()
		if _, err := p.Delete(cctx, client.WithProcessKill); err != nil && !errdefs.IsNotFound(classify(err)) {
			r.log.Warn("delete exec process", "task", id, "exec", execID, "err", err)
		}
	}()
	// Wait with a context of its own: when ctx ends we kill the process
	// and still collect its exit.
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	exitC, err := p.Wait(wctx)
	if err != nil {
		return -1, wrapf(err, "exec in task %s", id)
	}
	if err := p.Start(ctx); err != nil {
		return -1, wrapf(err, "exec in task %s: start", id)
	}
	if tty != nil && tty.Resize != nil {
		go func() {
			for {
				select {
				case size, ok := <-tty.Resize:
					if !ok {
						return
					}
					if err := p.Resize(wctx, uint32(size.Width), uint32(size.Height)); err != nil {
						r.log.Debug("resize exec terminal", "task", id, "err", err)
					}
				case <-wctx.Done():
					return
				}
			}
		}()
	}
	var es client.ExitStatus
	select {
	case es = <-exitC:
	case <-ctx.Done():
		kctx, kcancel := cleanupCtx(ctx)
		p.Kill(kctx, syscall.SIGKILL)
		kcancel()
		<-exitC
		return -1, fmt.Errorf("exec in task %s: %w", id, ctx.Err())
	}
	p.IO().Wait() // all output copied
	e := toExit(es)
	if e.Err != nil {
		return -1, fmt.Errorf("exec in task %s: %w", id, e.Err)
	}
	return e.Code, nil
}

// lockedWriter serializes writes to w with writes to other writers
// sharing mu.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// eofReader calls onEOF (once) when r reaches EOF.
type eofReader struct {
	r     io.Reader
	once  sync.Once
	onEOF func()
}

func (e *eofReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err == io.EOF {
		e.once.Do(e.onEOF)
	}
	return n, err
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// procStartTime returns when process pid started, from /proc (zero if
// it cannot tell: another pid namespace, a process gone).
func procStartTime(pid uint32) time.Time {
	if pid == 0 {
		return time.Time{}
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return time.Time{}
	}
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 {
		return time.Time{}
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 20 {
		return time.Time{}
	}
	var ticks int64
	if _, err := fmt.Sscan(f[19], &ticks); err != nil {
		return time.Time{}
	}
	bt := bootTime()
	if bt.IsZero() {
		return time.Time{}
	}
	// NB: the kernel counts in USER_HZ, 100 per second on Linux.
	return bt.Add(time.Duration(ticks) * 10 * time.Millisecond)
}

var (
	bootOnce sync.Once
	boot     time.Time
)

func bootTime() time.Time {
	bootOnce.Do(func() {
		data, err := os.ReadFile("/proc/stat")
		if err != nil {
			return
		}
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "btime "); ok {
				var s int64
				if _, err := fmt.Sscan(v, &s); err == nil {
					boot = time.Unix(s, 0)
				}
				return
			}
		}
	})
	return boot
}
