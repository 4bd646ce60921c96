package runtime

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Fake is an in-memory Runtime for protocol tests: no daemon, no
// processes. Tasks follow a Program (what they print, when they exit, how
// they answer signals), chosen per task by a function tests may replace;
// tests can also make a task exit or crash at any moment (Exit), make
// calls fail (FailNext, SetUnavailable), and open a second handle on the
// same state (Reopen) to play a schedd restart. Images are read from the
// same tars containerd imports, and blobs are verified the same way.
//
// Everything is deterministic but the clock: pids count up from 1000,
// lists are sorted, and tasks change state only when a call, Exit or a
// Program's ExitAfter says so.
type Fake struct {
	b      *fakeBackend
	closed atomic.Bool
}

var _ Runtime = (*Fake)(nil)

// fakeBackend is the state Fake handles share: what a containerd holds.
type fakeBackend struct {
	mu sync.Mutex
	// blobs by digest; images by normalized name; tasks by ID.
	blobs   map[digest.Digest][]byte
	images  map[string]fakeImageRec
	tasks   map[string]*fakeTask
	nextPid uint32
	program func(TaskSpec) Program
	exec    ExecFunc
	// down makes every call fail with Unavailable; failNext fails the next
	// call of a method.
	down     bool
	failNext map[string][]error
	// lost is closed when the runtime goes down: pending Waits fail then,
	// as their connection to containerd would.
	lost chan struct{}
}

type fakeImageRec struct {
	fakeImage
	stored time.Time
}

type fakeTask struct {
	spec    TaskSpec
	image   string // normalized name
	program Program
	status  Status
	pid     uint32
	created time.Time
	started time.Time
	exit    Exit
	done    chan struct{} // closed on exit
	timer   *time.Timer
}

// Program is what a fake task does.
type Program struct {
	// Output is appended to the task's log when it starts.
	Output string
	// Exits makes the task exit on its own with ExitCode, ExitAfter after
	// it starts (0: at once, before Run returns).
	Exits     bool
	ExitCode  int
	ExitAfter time.Duration
	// OnSignal gives the exit code of the task when sent a signal. Other
	// signals are ignored, as pid 1 of a container ignores signals it has
	// no handler for; SIGKILL always kills (exit 137).
	OnSignal map[syscall.Signal]int
}

// ExecFunc plays a command exec'd in a fake task; it returns the exit
// code.
type ExecFunc func(task TaskSpec, args []string, stdin io.Reader, stdout, stderr io.Writer) int

// NewFake returns an empty fake runtime using DefaultProgram and
// DefaultExec.
func NewFake() *Fake {
	return &Fake{b: &fakeBackend{
		blobs:    map[digest.Digest][]byte{},
		images:   map[string]fakeImageRec{},
		tasks:    map[string]*fakeTask{},
		nextPid:  1000,
		program:  DefaultProgram,
		exec:     DefaultExec,
		failNext: map[string][]error{},
		lost:     make(chan struct{}),
	}}
}

// Reopen returns a new handle on the same state, as a restarted schedd
// connects again to the same containerd.
func (f *Fake) Reopen() *Fake { return &Fake{b: f.b} }

// SetProgram sets how tasks started from now on behave (nil:
// DefaultProgram).
func (f *Fake) SetProgram(p func(TaskSpec) Program) {
	f.b.mu.Lock()
	defer f.b.mu.Unlock()
	if p == nil {
		p = DefaultProgram
	}
	f.b.program = p
}

// SetExec sets what Exec runs (nil: DefaultExec).
func (f *Fake) SetExec(e ExecFunc) {
	f.b.mu.Lock()
	defer f.b.mu.Unlock()
	if e == nil {
		e = DefaultExec
	}
	f.b.exec = e
}

// SetUnavailable makes every call fail with errdefs.ErrUnavailable while
// down, as when containerd is not running, and pending Waits return an
// Exit with Err. Tasks keep running.
func (f *Fake) SetUnavailable(down bool) {
	f.b.mu.Lock()
	defer f.b.mu.Unlock()
	switch {
	case down && !f.b.down:
		close(f.b.lost)
	case !down && f.b.down:
		f.b.lost = make(chan struct{})
	}
	f.b.down = down
}

// FailNext makes the next call of method (its name in Runtime: "Run",
// "Stop", ...) fail with err, before it does anything. Calls queue up.
func (f *Fake) FailNext(method string, err error) {
	f.b.mu.Lock()
	defer f.b.mu.Unlock()
	f.b.failNext[method] = append(f.b.failNext[method], err)
}

// Exit makes running task id exit now with code (a crash: 137 for an OOM
// kill, 139 for a segfault, ...).
func (f *Fake) Exit(id string, code int) error {
	f.b.mu.Lock()
	defer f.b.mu.Unlock()
	t, ok := f.b.tasks[id]
	if !ok {
		return fmt.Errorf("task %s: %w", id, errdefs.ErrNotFound)
	}
	if t.status != StatusRunning {
		return fmt.Errorf("task %s is %s: %w", id, t.status, errdefs.ErrFailedPrecondition)
	}
	f.b.exitLocked(t, code)
	return nil
}

// Spec returns the spec task id was run with.
func (f *Fake) Spec(id string) (TaskSpec, bool) {
	f.b.mu.Lock()
	defer f.b.mu.Unlock()
	t, ok := f.b.tasks[id]
	if !ok {
		return TaskSpec{}, false
	}
	return t.spec, true
}

// DefaultProgram reads a task's command the way busybox would run it, for
// the commands tests use most: `echo ...` prints and exits 0, `true` and
// `false` exit 0 and 1, `cat`, `ls`, `env`, `hostname` and `date` exit 0
// (printing nothing), `sh -c 'exit N'` exits N, `sleep N` exits 0 after
// N seconds; anything else (`sleep inf`, `httpd -f`, scripts) runs until
// stopped. No program handles SIGTERM (they are pid 1): Stop kills them
// after the grace period, with 137.
func DefaultProgram(spec TaskSpec) Program {
	args := spec.Args
	if len(args) == 0 {
		return Program{Exits: true} // the image's sh, with no input
	}
	switch args[0] {
	case "echo":
		return Program{Output: strings.Join(args[1:], " ") + "\n", Exits: true}
	case "true":
		return Program{Exits: true}
	case "cat", "ls", "env", "hostname", "date":
		return Program{Exits: true} // stdin is empty
	case "false":
		return Program{Exits: true, ExitCode: 1}
	case "sleep":
		if len(args) == 2 {
			if s, err := strconv.ParseFloat(args[1], 64); err == nil && s < 1e6 {
				return Program{Exits: true, ExitAfter: time.Duration(s * float64(time.Second))}
			}
		}
	case "sh":
		if len(args) == 3 && args[1] == "-c" {
			if n, ok := strings.CutPrefix(strings.TrimSpace(args[2]), "exit "); ok {
				if code, err := strconv.Atoi(strings.TrimSpace(n)); err == nil {
					return Program{Exits: true, ExitCode: code}
				}
			}
		}
	}
	return Program{}
}

// DefaultExec plays a few commands: `cat /etc/hostname`, `hostname`,
// `cat` (copies stdin), `echo ...`, `true`, `false`, `sh -c 'exit N'`,
// `env`. Others fail with 127, as when not found.
func DefaultExec(task TaskSpec, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	w := func(out io.Writer, s string) {
		if out != nil {
			io.WriteString(out, s)
		}
	}
	switch {
	case len(args) == 2 && args[0] == "cat" && args[1] == "/etc/hostname", len(args) == 1 && args[0] == "hostname":
		w(stdout, hostnameOf(task)+"\n")
		return 0
	case len(args) == 1 && args[0] == "cat":
		if stdin != nil && stdout != nil {
			io.Copy(stdout, stdin)
		}
		return 0
	case args[0] == "echo":
		w(stdout, strings.Join(args[1:], " ")+"\n")
		return 0
	case args[0] == "true":
		return 0
	case args[0] == "false":
		return 1
	case args[0] == "env":
		w(stdout, strings.Join(task.Env, "\n")+"\n")
		return 0
	case len(args) == 3 && args[0] == "sh" && args[1] == "-c":
		if n, ok := strings.CutPrefix(strings.TrimSpace(args[2]), "exit "); ok {
			if code, err := strconv.Atoi(strings.TrimSpace(n)); err == nil {
				return code
			}
		}
	}
	w(stderr, fmt.Sprintf("sh: %s: not found\n", args[0]))
	return 127
}

// enter checks a call may proceed: the handle is open, the runtime up,
// and no failure is queued for method. It returns with b.mu held on
// success.
func (f *Fake) enter(ctx context.Context, method string) error {
	if f.closed.Load() {
		return fmt.Errorf("%s: runtime closed: %w", method, errdefs.ErrUnavailable)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	f.b.mu.Lock()
	if f.b.down {
		f.b.mu.Unlock()
		return fmt.Errorf("%s: containerd is unreachable (fake): %w", method, errdefs.ErrUnavailable)
	}
	if q := f.b.failNext[method]; len(q) > 0 {
		f.b.failNext[method] = q[1:]
		f.b.mu.Unlock()
		return q[0]
	}
	return nil
}

// Close implements Runtime. Tasks keep running; other handles keep
// working.
func (f *Fake) Close() error {
	f.closed.Store(true)
	return nil
}

// Import implements Runtime.
func (f *Fake) Import(ctx context.Context, r io.Reader) ([]Image, error) {
	blobs, imgs, err := parseArchive(r)
	if err != nil {
		return nil, err
	}
	if err := f.enter(ctx, "Import"); err != nil {
		return nil, err
	}
	defer f.b.mu.Unlock()
	maps.Copy(f.b.blobs, blobs)
	var out []Image
	for _, im := range imgs {
		if _, err := walkImage(im.target, f.b.getLocked); err != nil {
			return nil, fmt.Errorf("import %s: %w", familiarName(im.name), err)
		}
		rec := fakeImageRec{fakeImage: im, stored: time.Now().UTC()}
		f.b.images[im.name] = rec
		out = append(out, f.b.toImageLocked(rec))
	}
	return out, nil
}

func (b *fakeBackend) getLocked(d digest.Digest) ([]byte, bool) {
	data, ok := b.blobs[d]
	return data, ok
}

func (b *fakeBackend) toImageLocked(rec fakeImageRec) Image {
	out := Image{Name: familiarName(rec.name), Digest: rec.target.Digest, Created: rec.stored}
	descs, err := walkImage(rec.target, b.getLocked)
	if err != nil {
		return out
	}
	for _, d := range descs {
		out.Size += d.Size
	}
	for _, d := range descs {
		if !images.IsConfigType(d.MediaType) {
			continue
		}
		if data, ok := b.getLocked(d.Digest); ok {
			if created, hc, err := parseImageConfig(data); err == nil {
				if !created.IsZero() {
					out.Created = created
				}
				out.Healthcheck = hc
			}
		}
	}
	return out
}

// lookupLocked finds an image as Containerd.lookup does.
func (b *fakeBackend) lookupLocked(ref string) (fakeImageRec, error) {
	if ref == "" {
		return fakeImageRec{}, fmt.Errorf("no image given: %w", errdefs.ErrInvalidArgument)
	}
	want := refDigest(ref)
	if want == "" {
		for _, name := range []string{ref, normalizeName(ref)} {
			if rec, ok := b.images[name]; ok {
				return rec, nil
			}
		}
		return fakeImageRec{}, fmt.Errorf("image %s: %w", ref, errdefs.ErrNotFound)
	}
	names := slices.Sorted(maps.Keys(b.images))
	for _, n := range names {
		if b.images[n].target.Digest == want {
			return b.images[n], nil
		}
	}
	return fakeImageRec{}, fmt.Errorf("image %s: %w", ref, errdefs.ErrNotFound)
}

// Images implements Runtime.
func (f *Fake) Images(ctx context.Context) ([]Image, error) {
	if err := f.enter(ctx, "Images"); err != nil {
		return nil, err
	}
	defer f.b.mu.Unlock()
	var out []Image
	for _, n := range slices.Sorted(maps.Keys(f.b.images)) {
		out = append(out, f.b.toImageLocked(f.b.images[n]))
	}
	slices.SortFunc(out, func(a, b Image) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Image implements Runtime.
func (f *Fake) Image(ctx context.Context, ref string) (Image, error) {
	if err := f.enter(ctx, "Image"); err != nil {
		return Image{}, err
	}
	defer f.b.mu.Unlock()
	rec, err := f.b.lookupLocked(ref)
	if err != nil {
		return Image{}, err
	}
	return f.b.toImageLocked(rec), nil
}

// RemoveImage implements Runtime. Blobs stay (the fake collects no
// garbage).
func (f *Fake) RemoveImage(ctx context.Context, ref string) error {
	if err := f.enter(ctx, "RemoveImage"); err != nil {
		return err
	}
	defer f.b.mu.Unlock()
	rec, err := f.b.lookupLocked(ref)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	delete(f.b.images, rec.name)
	return nil
}

// ImageBlobs implements Runtime.
func (f *Fake) ImageBlobs(ctx context.Context, ref string) ([]ocispec.Descriptor, error) {
	if err := f.enter(ctx, "ImageBlobs"); err != nil {
		return nil, err
	}
	defer f.b.mu.Unlock()
	rec, err := f.b.lookupLocked(ref)
	if err != nil {
		return nil, err
	}
	return walkImage(rec.target, f.b.getLocked)
}

// ReadBlob implements Runtime.
func (f *Fake) ReadBlob(ctx context.Context, dgst digest.Digest) (io.ReadCloser, int64, error) {
	if err := dgst.Validate(); err != nil {
		return nil, 0, fmt.Errorf("blob %q: %w: %w", dgst, err, errdefs.ErrInvalidArgument)
	}
	if err := f.enter(ctx, "ReadBlob"); err != nil {
		return nil, 0, err
	}
	defer f.b.mu.Unlock()
	data, ok := f.b.blobs[dgst]
	if !ok {
		return nil, 0, fmt.Errorf("blob %s: %w", dgst, errdefs.ErrNotFound)
	}
	return io.NopCloser(strings.NewReader(string(data))), int64(len(data)), nil
}

// WriteBlob implements Runtime.
func (f *Fake) WriteBlob(ctx context.Context, desc ocispec.Descriptor, r io.Reader) error {
	if err := desc.Digest.Validate(); err != nil {
		return fmt.Errorf("blob %q: %w: %w", desc.Digest, err, errdefs.ErrInvalidArgument)
	}
	if desc.Size < 0 {
		return fmt.Errorf("blob %s: size %d: %w", desc.Digest, desc.Size, errdefs.ErrInvalidArgument)
	}
	if err := f.enter(ctx, "WriteBlob"); err != nil {
		return err
	}
	_, ok := f.b.blobs[desc.Digest]
	f.b.mu.Unlock()
	if ok {
		return nil
	}
	data, err := readLimited(r, desc.Size)
	if err != nil {
		return fmt.Errorf("blob %s: write: %w", desc.Digest, err)
	}
	if err := verifyBlob(desc, data); err != nil {
		return err
	}
	f.b.mu.Lock()
	defer f.b.mu.Unlock()
	f.b.blobs[desc.Digest] = data
	return nil
}

// CreateImage implements Runtime.
func (f *Fake) CreateImage(ctx context.Context, name string, target ocispec.Descriptor) (Image, error) {
	if err := f.enter(ctx, "CreateImage"); err != nil {
		return Image{}, err
	}
	defer f.b.mu.Unlock()
	if _, err := parseRef(name); err != nil {
		return Image{}, fmt.Errorf("image name %q: %w: %w", name, err, errdefs.ErrInvalidArgument)
	}
	if !images.IsManifestType(target.MediaType) && !images.IsIndexType(target.MediaType) {
		return Image{}, fmt.Errorf("image %s: target media type %q is neither a manifest nor an index: %w", name, target.MediaType, errdefs.ErrInvalidArgument)
	}
	data, ok := f.b.blobs[target.Digest]
	if !ok {
		return Image{}, fmt.Errorf("image %s: target %s: %w", name, target.Digest, errdefs.ErrNotFound)
	}
	if int64(len(data)) != target.Size {
		return Image{}, fmt.Errorf("image %s: target %s has %d bytes, not %d: %w", name, target.Digest, len(data), target.Size, errdefs.ErrInvalidArgument)
	}
	if _, err := walkImage(target, f.b.getLocked); err != nil {
		return Image{}, fmt.Errorf("image %s: %w", name, err)
	}
	rec := fakeImageRec{fakeImage: fakeImage{name: normalizeName(name), target: target}, stored: time.Now().UTC()}
	f.b.images[rec.name] = rec
	return f.b.toImageLocked(rec), nil
}

// Run implements Runtime.
func (f *Fake) Run(ctx context.Context, spec TaskSpec) error {
	if err := validateSpec(spec); err != nil {
		return err
	}
	if err := f.enter(ctx, "Run"); err != nil {
		return err
	}
	defer f.b.mu.Unlock()
	rec, err := f.b.lookupLocked(spec.Image)
	if err != nil {
		return fmt.Errorf("task %s: %w", spec.ID, err)
	}
	if _, ok := f.b.tasks[spec.ID]; ok {
		return fmt.Errorf("task %s: %w", spec.ID, errdefs.ErrAlreadyExists)
	}
	spec.Labels = maps.Clone(spec.Labels)
	spec.Args = slices.Clone(spec.Args)
	spec.Env = slices.Clone(spec.Env)
	prog := f.b.program(spec)
	now := time.Now().UTC()
	t := &fakeTask{
		spec:    spec,
		image:   rec.name,
		program: prog,
		status:  StatusRunning,
		pid:     f.b.nextPid,
		created: now,
		started: now,
		done:    make(chan struct{}),
	}
	f.b.nextPid++
	f.b.tasks[spec.ID] = t
	if spec.LogPath != "" {
		if err := appendFile(spec.LogPath, prog.Output); err != nil {
			delete(f.b.tasks, spec.ID)
			return fmt.Errorf("task %s: log: %w", spec.ID, err)
		}
	}
	if prog.Exits {
		if prog.ExitAfter <= 0 {
			f.b.exitLocked(t, prog.ExitCode)
		} else {
			t.timer = time.AfterFunc(prog.ExitAfter, func() {
				f.b.mu.Lock()
				defer f.b.mu.Unlock()
				if t.status == StatusRunning {
					f.b.exitLocked(t, prog.ExitCode)
				}
			})
		}
	}
	return nil
}

func appendFile(path, s string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	fh, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	_, err = io.WriteString(fh, s)
	if cerr := fh.Close(); err == nil {
		err = cerr
	}
	return err
}

// exitLocked ends t with code.
func (b *fakeBackend) exitLocked(t *fakeTask, code int) {
	if t.status == StatusStopped {
		return
	}
	if t.timer != nil {
		t.timer.Stop()
	}
	t.status = StatusStopped
	t.exit = Exit{Code: code, ExitedAt: time.Now().UTC()}
	close(t.done)
}

// Stop implements Runtime.
func (f *Fake) Stop(ctx context.Context, id string, grace time.Duration) (Exit, error) {
	if err := f.enter(ctx, "Stop"); err != nil {
		return Exit{}, err
	}
	t, ok := f.b.tasks[id]
	if !ok {
		f.b.mu.Unlock()
		return Exit{}, fmt.Errorf("stop task %s: %w", id, errdefs.ErrNotFound)
	}
	if t.status == StatusStopped {
		e := t.exit
		f.b.mu.Unlock()
		return e, nil
	}
	if grace > 0 {
		sig := syscall.SIGTERM
		if t.spec.StopSignal != "" {
			sig, _ = parseSignal(t.spec.StopSignal)
		}
		if code, ok := t.program.OnSignal[sig]; ok {
			f.b.exitLocked(t, code)
			e := t.exit
			f.b.mu.Unlock()
			return e, nil
		}
		f.b.mu.Unlock()
		timer := time.NewTimer(grace)
		select {
		case <-t.done:
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return Exit{}, fmt.Errorf("stop task %s: %w", id, ctx.Err())
		}
		timer.Stop()
		f.b.mu.Lock()
	}
	f.b.exitLocked(t, 128+int(syscall.SIGKILL))
	e := t.exit
	f.b.mu.Unlock()
	return e, nil
}

// Remove implements Runtime.
func (f *Fake) Remove(ctx context.Context, id string) error {
	if err := f.enter(ctx, "Remove"); err != nil {
		return err
	}
	defer f.b.mu.Unlock()
	t, ok := f.b.tasks[id]
	if !ok {
		return nil
	}
	f.b.exitLocked(t, 128+int(syscall.SIGKILL))
	delete(f.b.tasks, id)
	return nil
}

// List implements Runtime.
func (f *Fake) List(ctx context.Context) ([]TaskInfo, error) {
	if err := f.enter(ctx, "List"); err != nil {
		return nil, err
	}
	defer f.b.mu.Unlock()
	out := make([]TaskInfo, 0, len(f.b.tasks))
	for _, id := range slices.Sorted(maps.Keys(f.b.tasks)) {
		t := f.b.tasks[id]
		ti := TaskInfo{
			ID:        id,
			Image:     familiarName(t.image),
			Labels:    maps.Clone(t.spec.Labels),
			Status:    t.status,
			Pid:       t.pid,
			LogPath:   t.spec.LogPath,
			CreatedAt: t.created,
		}
		if ti.Labels == nil {
			ti.Labels = map[string]string{}
		}
		if t.status == StatusRunning {
			ti.StartedAt = t.started
		} else {
			ti.ExitCode, ti.ExitedAt = t.exit.Code, t.exit.ExitedAt
		}
		out = append(out, ti)
	}
	return out, nil
}

// Wait implements Runtime.
func (f *Fake) Wait(ctx context.Context, id string) (<-chan Exit, error) {
	if err := f.enter(ctx, "Wait"); err != nil {
		return nil, err
	}
	t, ok := f.b.tasks[id]
	lost := f.b.lost
	f.b.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("wait for task %s: %w", id, errdefs.ErrNotFound)
	}
	out := make(chan Exit, 1)
	go func() {
		defer close(out)
		select {
		case <-t.done:
			f.b.mu.Lock()
			e := t.exit
			f.b.mu.Unlock()
			out <- e
		case <-ctx.Done():
			out <- Exit{Code: -1, Err: fmt.Errorf("wait for task %s: %w", id, ctx.Err())}
		case <-lost:
			out <- Exit{Code: -1, Err: fmt.Errorf("wait for task %s: connection lost: %w", id, errdefs.ErrUnavailable)}
		}
	}()
	return out, nil
}

// Exec implements Runtime.
func (f *Fake) Exec(ctx context.Context, id string, args []string, stdin io.Reader, stdout, stderr io.Writer, tty *Terminal) (int, error) {
	if len(args) == 0 {
		return -1, fmt.Errorf("exec in task %s: no command: %w", id, errdefs.ErrInvalidArgument)
	}
	if err := f.enter(ctx, "Exec"); err != nil {
		return -1, err
	}
	t, ok := f.b.tasks[id]
	var spec TaskSpec
	var status Status
	if ok {
		spec, status = t.spec, t.status
	}
	run := f.b.exec
	f.b.mu.Unlock()
	if !ok {
		return -1, fmt.Errorf("exec in task %s: %w", id, errdefs.ErrNotFound)
	}
	if status != StatusRunning {
		return -1, fmt.Errorf("exec in task %s: task is %s: %w", id, status, errdefs.ErrFailedPrecondition)
	}
	if tty != nil {
		stderr = stdout
	}
	return run(spec, args, stdin, stdout, stderr), nil
}

// Pull implements Runtime. The fake reaches no registry: a pullable ref
// fails with Unavailable, as with a registry that cannot be reached.
func (f *Fake) Pull(ctx context.Context, ref string, _ PullOptions) (Image, error) {
	if _, err := PullableRef(ref); err != nil {
		return Image{}, err
	}
	return Image{}, fmt.Errorf("pull image %s: the fake runtime reaches no registry: %w", ref, errdefs.ErrUnavailable)
}

// Fake tasks used fakeStartCPU to start, then use fakeCPUShare of a core,
// and fakeMemory bytes (less if their limit is lower).
const (
	fakeStartCPU = time.Millisecond
	fakeCPUShare = 0.01
	fakeMemory   = 4 << 20
)

// Stats implements Runtime: the sample of a task that idles, with a
// counter that grows and gauges that stay.
func (f *Fake) Stats(ctx context.Context, id string) (Stats, error) {
	if err := f.enter(ctx, "Stats"); err != nil {
		return Stats{}, err
	}
	defer f.b.mu.Unlock()
	t, ok := f.b.tasks[id]
	if !ok {
		return Stats{}, fmt.Errorf("stats of task %s: %w", id, errdefs.ErrNotFound)
	}
	if t.status != StatusRunning {
		return Stats{}, fmt.Errorf("stats of task %s: task is %s: %w", id, t.status, errdefs.ErrFailedPrecondition)
	}
	now := time.Now()
	// NB: t.started has no monotonic reading (UTC strips it): a clock
	// stepped back must not make the counter wrap.
	s := Stats{
		Time:             now,
		CPUNanos:         uint64(fakeStartCPU + time.Duration(float64(max(0, now.Sub(t.started)))*fakeCPUShare)),
		MemoryBytes:      fakeMemory,
		MemoryLimitBytes: uint64(t.spec.MemoryBytes),
		Pids:             1,
	}
	if s.MemoryLimitBytes > 0 {
		s.MemoryBytes = min(s.MemoryBytes, s.MemoryLimitBytes)
	}
	return s, nil
}
