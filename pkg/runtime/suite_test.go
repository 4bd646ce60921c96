package runtime_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/shoal-dev/shoal/pkg/runtime"
	"github.com/shoal-dev/shoal/pkg/testimage"
)

// The behaviour every Runtime shares, run against containerd
// (containerd_test.go) and the fake (fake_test.go).

// harness gives the suite the nodes of one implementation.
type harness struct {
	// node returns a new Runtime for node name: the same name gives the
	// same backend (a new instance plays a restarted schedd), another name
	// a node of its own. Names starting with "b" are on a second daemon
	// (for the real runtime: a second containerd).
	node func(t *testing.T, name string) runtime.Runtime
	// real: the containerd runtime (cgroups, processes, ingests exist).
	real bool
	// cgroupParent is the real runtime's cgroup parent.
	cgroupParent string
	// ingests counts unfinished blob writes of a node (real only).
	ingests func(t *testing.T, rt runtime.Runtime) int
	// down and up stop and restart node a's backend (containerd).
	down, up func(t *testing.T)
}

// Commands the suite runs. The fake's programs for them are in
// fakeProgram.
var (
	// trapArgs exits 42 on SIGTERM, once it has said "ready".
	trapArgs = []string{"sh", "-c", "trap 'exit 42' TERM; echo ready; while :; do sleep 0.05; done"}
	// usr1Args exits 7 on SIGUSR1.
	usr1Args = []string{"sh", "-c", "trap 'exit 7' USR1; echo ready; while :; do sleep 0.05; done"}
	// sleepArgs runs until killed: pid 1 ignores SIGTERM without a trap.
	sleepArgs = []string{"sleep", "1000"}
	// statsArgs burns some 0.2 s of CPU, fills 8 MiB of the tmpfs at
	// /scratch (memory, charged to the task), says "done" and waits.
	statsArgs = []string{"sh", "-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; " +
		"dd if=/dev/zero of=/scratch/f bs=1M count=8 2>/dev/null; echo done; exec sleep 1000"}
)

// testImages returns the test images as an OCI tar (latest and v2) and a
// docker-save tar (latest), built once.
var testImages = func() func(t testing.TB) (oci []byte, ociBuilt []testimage.Built, docker []byte, dockerBuilt []testimage.Built) {
	var (
		oci, docker           []byte
		ociBuilt, dockerBuilt []testimage.Built
		err                   error
	)
	return func(t testing.TB) ([]byte, []testimage.Built, []byte, []testimage.Built) {
		t.Helper()
		if oci == nil {
			if oci, ociBuilt, err = testimage.OCI(testimage.Default(), testimage.V2()); err != nil {
				t.Fatal(err)
			}
			if docker, dockerBuilt, err = testimage.Docker(testimage.Default()); err != nil {
				t.Fatal(err)
			}
		}
		return oci, ociBuilt, docker, dockerBuilt
	}
}()

func importOCI(t *testing.T, rt runtime.Runtime) []runtime.Image {
	t.Helper()
	oci, _, _, _ := testImages(t)
	imgs, err := rt.Import(context.Background(), bytes.NewReader(oci))
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	return imgs
}

// testImageHealthcheck: an image's HEALTHCHECK (Docker's config field,
// in an OCI and a docker-save archive) is reported with the image; an
// image without one has none.
func testImageHealthcheck(t *testing.T, h harness) {
	ctx := context.Background()
	rt := h.node(t, "health")
	hc := &testimage.Healthcheck{Test: []string{"CMD-SHELL", "test -e /tmp/ok"}, Interval: 2 * time.Second, Timeout: time.Second, StartPeriod: 5 * time.Second, Retries: 4}
	for _, format := range []string{"oci", "docker"} {
		name := "local/health-" + format + ":1"
		path := filepath.Join(t.TempDir(), "image.tar")
		if _, err := testimage.WriteFile(path, format, testimage.Spec{Name: name, Healthcheck: hc}, testimage.Spec{Name: "local/plain-" + format + ":1"}); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		_, err = rt.Import(ctx, f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: import: %v", format, err)
		}
		img, err := rt.Image(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		want := runtime.Healthcheck{Test: hc.Test, Interval: hc.Interval, Timeout: hc.Timeout, StartPeriod: hc.StartPeriod, Retries: hc.Retries}
		if img.Healthcheck == nil || !slices.Equal(img.Healthcheck.Test, want.Test) || img.Healthcheck.Interval != want.Interval ||
			img.Healthcheck.Timeout != want.Timeout || img.Healthcheck.StartPeriod != want.StartPeriod || img.Healthcheck.Retries != want.Retries {
			t.Errorf("%s: healthcheck %+v, want %+v", format, img.Healthcheck, want)
		}
		if plain, err := rt.Image(ctx, "local/plain-"+format+":1"); err != nil || plain.Healthcheck != nil {
			t.Errorf("%s: an image without a HEALTHCHECK: %+v, %v", format, plain.Healthcheck, err)
		}
	}
}

func runSuite(t *testing.T, h harness) {
	t.Run("ImportOCI", func(t *testing.T) { testImportOCI(t, h) })
	t.Run("ImportDocker", func(t *testing.T) { testImportDocker(t, h) })
	t.Run("ImageHealthcheck", func(t *testing.T) { testImageHealthcheck(t, h) })
	t.Run("RunEcho", func(t *testing.T) { testRunEcho(t, h) })
	t.Run("Readopt", func(t *testing.T) { testReadopt(t, h) })
	t.Run("StopKillsAfterGrace", func(t *testing.T) { testStopKill(t, h) })
	t.Run("StopSignal", func(t *testing.T) { testStopSignal(t, h) })
	t.Run("Exec", func(t *testing.T) { testExec(t, h) })
	t.Run("Stats", func(t *testing.T) { testStats(t, h) })
	t.Run("BlobTransfer", func(t *testing.T) { testBlobTransfer(t, h) })
	t.Run("Errors", func(t *testing.T) { testErrors(t, h) })
	// Last: it stops node a's backend.
	t.Run("Unavailable", func(t *testing.T) { testUnavailable(t, h) })
}

func testImportOCI(t *testing.T, h harness) {
	ctx := context.Background()
	rt := h.node(t, "oci")
	_, built, _, _ := testImages(t)
	imgs := importOCI(t, rt)
	if len(imgs) != 2 {
		t.Fatalf("imported %d images, want 2: %+v", len(imgs), imgs)
	}
	for i, want := range built {
		got := imgs[i]
		if got.Name != want.Name || got.Digest != want.Manifest.Digest {
			t.Errorf("image %d: got %s %s, want %s %s", i, got.Name, got.Digest, want.Name, want.Manifest.Digest)
		}
		if !got.Created.Equal(testimage.Epoch) {
			t.Errorf("image %s: created %v, want %v", got.Name, got.Created, testimage.Epoch)
		}
		if got.Size < 1<<20 {
			t.Errorf("image %s: size %d, want the size of busybox at least", got.Name, got.Size)
		}
	}
	list, err := rt.Images(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(list, imgs) {
		t.Errorf("Images = %+v, want %+v", list, imgs)
	}
	// One image, three references.
	for _, ref := range []string{"local/busybox:latest", "docker.io/local/busybox:latest", built[0].Manifest.Digest.String()} {
		img, err := rt.Image(ctx, ref)
		if err != nil || img != imgs[0] {
			t.Errorf("Image(%s) = %+v, %v; want %+v", ref, img, err, imgs[0])
		}
	}
	if _, err := rt.Image(ctx, "local/nothing:latest"); !errdefs.IsNotFound(err) {
		t.Errorf("Image of a missing image: %v, want NotFound", err)
	}
	// Importing again changes nothing.
	if again := importOCI(t, rt); !slices.Equal(again, imgs) {
		t.Errorf("second import = %+v, want %+v", again, imgs)
	}
	if _, err := rt.Import(ctx, strings.NewReader("not a tar at all, not even close..................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................")); !errdefs.IsInvalidArgument(err) {
		t.Errorf("import of garbage: %v, want InvalidArgument", err)
	}
	if err := rt.RemoveImage(ctx, "local/busybox:v2"); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Image(ctx, "local/busybox:v2"); !errdefs.IsNotFound(err) {
		t.Errorf("Image after RemoveImage: %v, want NotFound", err)
	}
	if err := rt.RemoveImage(ctx, "local/busybox:v2"); err != nil {
		t.Errorf("RemoveImage of a missing image: %v", err)
	}
	// Removing the last name frees the blobs at once (the fake collects
	// no garbage).
	if h.real {
		if err := rt.RemoveImage(ctx, "local/busybox:latest"); err != nil {
			t.Fatal(err)
		}
		if r, _, err := rt.ReadBlob(ctx, built[0].Manifest.Digest); !errdefs.IsNotFound(err) {
			if err == nil {
				r.Close()
			}
			t.Errorf("manifest blob after its image was removed: %v, want NotFound", err)
		}
	}
}

func testImportDocker(t *testing.T, h harness) {
	ctx := context.Background()
	rt := h.node(t, "docker")
	_, _, docker, built := testImages(t)
	imgs, err := rt.Import(ctx, bytes.NewReader(docker))
	if err != nil {
		t.Fatal(err)
	}
	if len(imgs) != 1 || imgs[0].Name != "local/busybox:latest" {
		t.Fatalf("imported %+v, want local/busybox:latest", imgs)
	}
	blobs, err := rt.ImageBlobs(ctx, "local/busybox:latest")
	if err != nil {
		t.Fatal(err)
	}
	var digests []string
	for _, b := range blobs {
		digests = append(digests, b.Digest.String())
	}
	want := []string{imgs[0].Digest.String(), built[0].Config.Digest.String(), built[0].Layers[0].Digest.String()}
	if !slices.Equal(digests, want) {
		t.Errorf("blobs %v, want manifest, config, layer %v", digests, want)
	}
	log := filepath.Join(t.TempDir(), "docker.log")
	if err := rt.Run(ctx, runtime.TaskSpec{ID: "from-docker", Image: "local/busybox:latest", Args: []string{"echo", "from docker"}, LogPath: log}); err != nil {
		t.Fatal(err)
	}
	if e := waitExit(t, rt, "from-docker"); e.Code != 0 {
		t.Errorf("exit %+v, want 0", e)
	}
	if got := readFile(t, log); got != "from docker\n" {
		t.Errorf("log %q, want %q", got, "from docker\n")
	}
	removeTask(t, rt, "from-docker")
}

func testRunEcho(t *testing.T, h harness) {
	ctx := context.Background()
	rt := h.node(t, "a")
	importOCI(t, rt)
	log := filepath.Join(t.TempDir(), "logs", "echo.log")
	spec := runtime.TaskSpec{ID: "echo", Image: "local/busybox:latest", Args: []string{"echo", "hi"}, LogPath: log, Labels: map[string]string{"shoal.task": "echo"}}
	start := time.Now()
	if err := rt.Run(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Logf("Run (create and start) took %v", time.Since(start))
	if e := waitExit(t, rt, "echo"); e.Code != 0 || e.ExitedAt.IsZero() {
		t.Errorf("exit %+v, want 0 with a time", e)
	}
	if got := readFile(t, log); got != "hi\n" {
		t.Errorf("log %q, want %q", got, "hi\n")
	}
	ti := findTask(t, rt, "echo")
	if ti.Status != runtime.StatusStopped || ti.ExitCode != 0 || ti.ExitedAt.IsZero() || ti.LogPath != log {
		t.Errorf("List: %+v, want stopped with exit 0 and the log path", ti)
	}
	// An exit code.
	if err := rt.Run(ctx, runtime.TaskSpec{ID: "exit3", Image: "local/busybox:latest", Args: []string{"sh", "-c", "exit 3"}}); err != nil {
		t.Fatal(err)
	}
	if e := waitExit(t, rt, "exit3"); e.Code != 3 {
		t.Errorf("exit %+v, want 3", e)
	}
	removeTask(t, rt, "exit3")
	// Removed tasks leave List; their ID can be used again, and the log
	// is appended to.
	removeTask(t, rt, "echo")
	if err := rt.Run(ctx, spec); err != nil {
		t.Fatalf("run again after remove: %v", err)
	}
	waitExit(t, rt, "echo")
	if got := readFile(t, log); got != "hi\nhi\n" {
		t.Errorf("log %q after a second run, want %q", got, "hi\nhi\n")
	}
	removeTask(t, rt, "echo")
}

func testReadopt(t *testing.T, h harness) {
	ctx := context.Background()
	rt := h.node(t, "a")
	importOCI(t, rt)
	log := filepath.Join(t.TempDir(), "svc.log")
	labels := map[string]string{"shoal.task": "svc-1", "shoal.service": "web", "shoal.slot": "0"}
	if err := rt.Run(ctx, runtime.TaskSpec{ID: "svc-1", Image: "local/busybox:latest", Args: trapArgs, LogPath: log, Labels: labels}); err != nil {
		t.Fatal(err)
	}
	waitLog(t, log, "ready")
	ti := findTask(t, rt, "svc-1")
	if ti.Status != runtime.StatusRunning || ti.Pid == 0 || ti.Image != "local/busybox:latest" || ti.LogPath != log || !maps.Equal(ti.Labels, labels) {
		t.Fatalf("List: %+v, want running with its labels", ti)
	}
	if ti.StartedAt.IsZero() || time.Since(ti.StartedAt) > time.Minute || ti.CreatedAt.IsZero() {
		t.Errorf("List: started %v, created %v: want recent times", ti.StartedAt, ti.CreatedAt)
	}

	// A new instance (schedd restarted) finds the task as it was.
	rt.Close()
	rt2 := h.node(t, "a")
	ti2 := findTask(t, rt2, "svc-1")
	if ti2.Status != runtime.StatusRunning || ti2.Pid != ti.Pid || !maps.Equal(ti2.Labels, labels) {
		t.Fatalf("List after restart: %+v, want %+v", ti2, ti)
	}
	exitC, err := rt2.Wait(ctx, "svc-1")
	if err != nil {
		t.Fatal(err)
	}
	e, err := rt2.Stop(ctx, "svc-1", 20*time.Second)
	if err != nil || e.Code != 42 {
		t.Fatalf("Stop = %+v, %v; want exit 42 from the trap", e, err)
	}
	select {
	case w := <-exitC:
		if w.Code != 42 || w.Err != nil {
			t.Errorf("Wait gave %+v, want 42", w)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return after the task stopped")
	}
	if again, err := rt2.Stop(ctx, "svc-1", time.Second); err != nil || again.Code != 42 {
		t.Errorf("second Stop = %+v, %v; want 42 again", again, err)
	}
	// Wait on a stopped task returns at once.
	if w := waitExit(t, rt2, "svc-1"); w.Code != 42 {
		t.Errorf("Wait on a stopped task: %+v", w)
	}
	ti3 := findTask(t, rt2, "svc-1")
	if ti3.Status != runtime.StatusStopped || ti3.ExitCode != 42 || ti3.ExitedAt.IsZero() {
		t.Errorf("List after Stop: %+v, want stopped with 42", ti3)
	}
	removeTask(t, rt2, "svc-1")
	if err := rt2.Remove(ctx, "svc-1"); err != nil {
		t.Errorf("second Remove: %v", err)
	}
}

func testStopKill(t *testing.T, h harness) {
	ctx := context.Background()
	rt := h.node(t, "a")
	importOCI(t, rt)
	if err := rt.Run(ctx, runtime.TaskSpec{ID: "stubborn", Image: "local/busybox:latest", Args: sleepArgs}); err != nil {
		t.Fatal(err)
	}
	e, err := rt.Stop(ctx, "stubborn", 200*time.Millisecond)
	if err != nil || e.Code != 128+int(syscall.SIGKILL) {
		t.Fatalf("Stop = %+v, %v; want 137 (killed after the grace period)", e, err)
	}
	removeTask(t, rt, "stubborn")
}

func testStopSignal(t *testing.T, h harness) {
	ctx := context.Background()
	rt := h.node(t, "a")
	importOCI(t, rt)
	log := filepath.Join(t.TempDir(), "usr1.log")
	if err := rt.Run(ctx, runtime.TaskSpec{ID: "usr1", Image: "local/busybox:latest", Args: usr1Args, StopSignal: "SIGUSR1", LogPath: log}); err != nil {
		t.Fatal(err)
	}
	waitLog(t, log, "ready")
	e, err := rt.Stop(ctx, "usr1", 20*time.Second)
	if err != nil || e.Code != 7 {
		t.Fatalf("Stop = %+v, %v; want 7 from the USR1 trap", e, err)
	}
	removeTask(t, rt, "usr1")
}

func testExec(t *testing.T, h harness) {
	ctx := context.Background()
	rt := h.node(t, "a")
	importOCI(t, rt)
	if err := rt.Run(ctx, runtime.TaskSpec{ID: "shell", Image: "local/busybox:latest", Args: sleepArgs, Hostname: "web-1", Env: []string{"GREETING=hello"}}); err != nil {
		t.Fatal(err)
	}
	defer removeTask(t, rt, "shell")
	exec := func(stdin io.Reader, tty bool, args ...string) (string, string, int) {
		t.Helper()
		var out, errb bytes.Buffer
		var term *runtime.Terminal
		if tty {
			term = &runtime.Terminal{}
		}
		code, err := rt.Exec(ctx, "shell", args, stdin, &out, &errb, term)
		if err != nil {
			t.Fatalf("exec %q: %v", args, err)
		}
		return out.String(), errb.String(), code
	}
	if out, _, code := exec(nil, false, "cat", "/etc/hostname"); out != "web-1\n" || code != 0 {
		t.Errorf("cat /etc/hostname: %q, exit %d; want web-1", out, code)
	}
	if out, _, code := exec(strings.NewReader("some input\n"), false, "cat"); out != "some input\n" || code != 0 {
		t.Errorf("cat with stdin: %q, exit %d", out, code)
	}
	if _, _, code := exec(nil, false, "sh", "-c", "exit 5"); code != 5 {
		t.Errorf("sh -c 'exit 5': exit %d", code)
	}
	if out, _, _ := exec(nil, false, "env"); !strings.Contains(out, "GREETING=hello") {
		t.Errorf("env: %q, want GREETING=hello", out)
	}
	if out, _, code := exec(nil, true, "echo", "tty"); !strings.Contains(out, "tty") || code != 0 {
		t.Errorf("echo on a tty: %q, exit %d", out, code)
	}
	if h.real {
		if out, errOut, _ := exec(nil, false, "sh", "-c", "echo out; echo err >&2"); out != "out\n" || errOut != "err\n" {
			t.Errorf("stdout %q, stderr %q; want them apart", out, errOut)
		}
		testExecTerminal(t, rt)
	}
	if _, err := rt.Exec(ctx, "nothing", []string{"true"}, nil, nil, nil, nil); !errdefs.IsNotFound(err) {
		t.Errorf("exec in a missing task: %v, want NotFound", err)
	}
	// A cancelled exec is killed.
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if h.real {
		if _, err := rt.Exec(cctx, "shell", []string{"sleep", "1000"}, nil, nil, nil, nil); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("exec past its deadline: %v, want DeadlineExceeded", err)
		}
	}
	if _, err := rt.Stop(ctx, "shell", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Exec(ctx, "shell", []string{"true"}, nil, nil, nil, nil); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("exec in a stopped task: %v, want FailedPrecondition", err)
	}
}

// testStats samples a task that has done some work, under a memory
// limit, and one without a limit.
func testStats(t *testing.T, h harness) {
	ctx := context.Background()
	rt := h.node(t, "a")
	importOCI(t, rt)
	const limit = 64 << 20
	log := filepath.Join(t.TempDir(), "stats.log")
	spec := runtime.TaskSpec{ID: "stats", Image: "local/busybox:latest", Args: statsArgs, MemoryBytes: limit, LogPath: log,
		Mounts: []runtime.Mount{{Target: "/scratch", Tmpfs: true}}}
	if err := rt.Run(ctx, spec); err != nil {
		t.Fatal(err)
	}
	waitLog(t, log, "done")
	before := time.Now()
	s, err := rt.Stats(ctx, "stats")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sample: %+v", s)
	if s.Time.Before(before) || s.Time.After(time.Now()) {
		t.Errorf("sample taken at %v, not during the call (from %v)", s.Time, before)
	}
	if s.CPUNanos == 0 || s.MemoryBytes == 0 || s.MemoryBytes > limit || s.MemoryLimitBytes != limit || s.Pids < 1 {
		t.Errorf("sample %+v: want CPU, memory within the limit %d, the limit, a process", s, limit)
	}
	if h.real {
		if s.CPUNanos < uint64(50*time.Millisecond) {
			t.Errorf("CPU %v, want the loop's 50ms at least", time.Duration(s.CPUNanos))
		}
		if s.MemoryBytes < 8<<20 {
			t.Errorf("memory %d, want the tmpfs's 8 MiB at least", s.MemoryBytes)
		}
	}
	s2, err := rt.Stats(ctx, "stats")
	if err != nil || s2.CPUNanos < s.CPUNanos || s2.Time.Before(s.Time) {
		t.Errorf("second sample %+v, %v: want the counters and time on from %+v", s2, err, s)
	}

	if err := rt.Run(ctx, runtime.TaskSpec{ID: "stats-unlimited", Image: "local/busybox:latest", Args: sleepArgs}); err != nil {
		t.Fatal(err)
	}
	if u, err := rt.Stats(ctx, "stats-unlimited"); err != nil || u.MemoryLimitBytes != 0 || u.Pids < 1 {
		t.Errorf("task without a limit: %+v, %v; want no limit", u, err)
	}
	removeTask(t, rt, "stats-unlimited")

	if _, err := rt.Stop(ctx, "stats", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Stats(ctx, "stats"); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Stats of a stopped task: %v, want FailedPrecondition", err)
	}
	removeTask(t, rt, "stats")
	if _, err := rt.Stats(ctx, "stats"); !errdefs.IsNotFound(err) {
		t.Errorf("Stats of a removed task: %v, want NotFound", err)
	}
}

func testBlobTransfer(t *testing.T, h harness) {
	ctx := context.Background()
	a := h.node(t, "a")
	importOCI(t, a)
	b := h.node(t, "b")
	const name = "local/busybox:v2"
	src, err := a.Image(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	blobs, err := a.ImageBlobs(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if len(blobs) != 4 || blobs[0].Digest != src.Digest {
		t.Fatalf("blobs of %s: %+v; want manifest (the target) first, config, two layers", name, blobs)
	}
	read := func(d ocispec.Descriptor) []byte {
		t.Helper()
		rc, size, err := a.ReadBlob(ctx, d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		data, err := io.ReadAll(rc)
		if err != nil || int64(len(data)) != size || size != d.Size {
			t.Fatalf("read %s: %d bytes (size %d, want %d): %v", d.Digest, len(data), size, d.Size, err)
		}
		return data
	}

	// Corrupted blobs are refused and leave nothing behind.
	layer := blobs[2]
	data := read(layer)
	flipped := bytes.Clone(data)
	flipped[len(flipped)/2] ^= 0x40
	for what, bad := range map[string][]byte{"a flipped byte": flipped, "a short blob": data[:len(data)-1], "a long blob": append(bytes.Clone(data), 0)} {
		if err := b.WriteBlob(ctx, layer, bytes.NewReader(bad)); !errdefs.IsDataLoss(err) {
			t.Errorf("write of %s: %v, want DataLoss", what, err)
		}
	}
	if _, _, err := b.ReadBlob(ctx, layer.Digest); !errdefs.IsNotFound(err) {
		t.Errorf("read of a refused blob: %v, want NotFound", err)
	}
	if h.ingests != nil {
		if n := h.ingests(t, b); n != 0 {
			t.Errorf("%d unfinished writes left after refused blobs", n)
		}
	}
	// An image whose blobs are not all there is refused.
	if err := b.WriteBlob(ctx, blobs[0], bytes.NewReader(read(blobs[0]))); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateImage(ctx, name, blobs[0]); !errdefs.IsNotFound(err) {
		t.Errorf("CreateImage with blobs missing: %v, want NotFound", err)
	}
	if _, err := b.Image(ctx, name); !errdefs.IsNotFound(err) {
		t.Errorf("image after a refused CreateImage: %v, want NotFound", err)
	}

	// The real transfer.
	for _, d := range blobs {
		if err := b.WriteBlob(ctx, d, bytes.NewReader(read(d))); err != nil {
			t.Fatalf("write %s: %v", d.Digest, err)
		}
	}
	// Writing a blob again reads nothing.
	if err := b.WriteBlob(ctx, layer, errReader{}); err != nil {
		t.Errorf("write of a blob already there: %v", err)
	}
	img, err := b.CreateImage(ctx, name, blobs[0])
	if err != nil {
		t.Fatal(err)
	}
	if img != src {
		t.Errorf("created %+v, want %+v", img, src)
	}
	if got, err := b.ImageBlobs(ctx, name); err != nil || !slices.EqualFunc(got, blobs, sameDesc) {
		t.Errorf("blobs on b: %+v, %v; want %+v", got, err, blobs)
	}
	log := filepath.Join(t.TempDir(), "v2.log")
	if err := b.Run(ctx, runtime.TaskSpec{ID: "v2", Image: name, Args: []string{"cat", "/etc/shoal-version", "/www/index.html"}, LogPath: log}); err != nil {
		t.Fatal(err)
	}
	if e := waitExit(t, b, "v2"); e.Code != 0 {
		t.Errorf("exit %+v", e)
	}
	if h.real {
		if got := readFile(t, log); got != "v2\nshoal test image v2\n" {
			t.Errorf("log %q: want the files of v2", got)
		}
	}
	removeTask(t, b, "v2")
}

func sameDesc(a, b ocispec.Descriptor) bool {
	return a.Digest == b.Digest && a.Size == b.Size && a.MediaType == b.MediaType
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) {
	return 0, errors.New("read a blob that was already there")
}

func testErrors(t *testing.T, h harness) {
	ctx := context.Background()
	rt := h.node(t, "a")
	importOCI(t, rt)
	spec := runtime.TaskSpec{ID: "errs", Image: "local/busybox:latest", Args: sleepArgs}
	cases := []struct {
		name string
		err  error
		is   func(error) bool
	}{
		{"missing image", rt.Run(ctx, runtime.TaskSpec{ID: "x", Image: "local/nothing:1"}), errdefs.IsNotFound},
		{"bad ID", rt.Run(ctx, runtime.TaskSpec{ID: "bad/id", Image: spec.Image}), errdefs.IsInvalidArgument},
		{"no image", rt.Run(ctx, runtime.TaskSpec{ID: "x"}), errdefs.IsInvalidArgument},
		{"relative log", rt.Run(ctx, runtime.TaskSpec{ID: "x", Image: spec.Image, LogPath: "x.log"}), errdefs.IsInvalidArgument},
		{"reserved label", rt.Run(ctx, runtime.TaskSpec{ID: "x", Image: spec.Image, Labels: map[string]string{"io.shoal.runtime/x": "1"}}), errdefs.IsInvalidArgument},
		{"bad stop signal", rt.Run(ctx, runtime.TaskSpec{ID: "x", Image: spec.Image, StopSignal: "SIGNOPE"}), errdefs.IsInvalidArgument},
		{"stop missing", second(rt.Stop(ctx, "nothing", time.Second)), errdefs.IsNotFound},
		{"wait missing", second(rt.Wait(ctx, "nothing")), errdefs.IsNotFound},
		{"read missing blob", third(rt.ReadBlob(ctx, "sha256:0000000000000000000000000000000000000000000000000000000000000000")), errdefs.IsNotFound},
		{"write bad digest", rt.WriteBlob(ctx, ocispec.Descriptor{Digest: "sha256:nope", Size: 1}, strings.NewReader("x")), errdefs.IsInvalidArgument},
		{"create bad name", second(rt.CreateImage(ctx, "Bad Name!", ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest})), errdefs.IsInvalidArgument},
		{"create config as target", second(rt.CreateImage(ctx, "local/x:1", ocispec.Descriptor{MediaType: ocispec.MediaTypeImageConfig})), errdefs.IsInvalidArgument},
	}
	for _, c := range cases {
		if !c.is(c.err) {
			t.Errorf("%s: %v", c.name, c.err)
		}
	}
	if err := rt.Run(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := rt.Run(ctx, spec); !errdefs.IsAlreadyExists(err) {
		t.Errorf("Run of an ID in use: %v, want AlreadyExists", err)
	}
	// The failed Run did not disturb the first.
	if ti := findTask(t, rt, "errs"); ti.Status != runtime.StatusRunning {
		t.Errorf("task after a duplicate Run: %+v", ti)
	}
	if err := rt.Remove(ctx, "nothing"); err != nil {
		t.Errorf("Remove of a missing task: %v", err)
	}
	if h.real {
		// A command that cannot be run fails Run, and leaves nothing.
		bad := runtime.TaskSpec{ID: "noexec", Image: spec.Image, Args: []string{"/nonexistent"}}
		if err := rt.Run(ctx, bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Run of a missing command: %v, want InvalidArgument", err)
		}
		bad.Args = []string{"true"}
		if err := rt.Run(ctx, bad); err != nil {
			t.Errorf("Run after a failed Run of the same ID: %v", err)
		}
		removeTask(t, rt, "noexec")
	}
	// Remove kills a running task.
	removeTask(t, rt, "errs")
}

func testUnavailable(t *testing.T, h harness) {
	ctx := context.Background()
	rt := h.node(t, "a")
	importOCI(t, rt)
	if err := rt.Run(ctx, runtime.TaskSpec{ID: "survivor", Image: "local/busybox:latest", Args: sleepArgs}); err != nil {
		t.Fatal(err)
	}
	before := findTask(t, rt, "survivor")
	exitC, err := rt.Wait(ctx, "survivor")
	if err != nil {
		t.Fatal(err)
	}
	h.down(t)
	for name, err := range map[string]error{
		"List":   second(rt.List(ctx)),
		"Images": second(rt.Images(ctx)),
		"Run":    rt.Run(ctx, runtime.TaskSpec{ID: "x", Image: "local/busybox:latest"}),
		"Stop":   second(rt.Stop(ctx, "survivor", time.Second)),
		"Stats":  second(rt.Stats(ctx, "survivor")),
	} {
		if !errdefs.IsUnavailable(err) {
			t.Errorf("%s while containerd is down: %v, want Unavailable", name, err)
		}
	}
	select {
	case e := <-exitC:
		if e.Err == nil || e.Code != -1 {
			t.Errorf("Wait while containerd went down: %+v, want an error", e)
		}
	case <-time.After(10 * time.Second):
		t.Error("Wait did not return when containerd went down")
	}
	h.up(t)
	// The same instance works again, and the task ran on.
	deadline := time.Now().Add(10 * time.Second)
	var after runtime.TaskInfo
	for {
		tasks, err := rt.List(ctx)
		if err == nil {
			for _, ti := range tasks {
				if ti.ID == "survivor" {
					after = ti
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("List after containerd came back: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if after.Status != runtime.StatusRunning || after.Pid != before.Pid {
		t.Errorf("task after a containerd restart: %+v, want it running as before (%+v)", after, before)
	}
	removeTask(t, rt, "survivor")
}

// Helpers.

func second[T any](_ T, err error) error        { return err }
func third[T, U any](_ T, _ U, err error) error { return err }

func waitExit(t *testing.T, rt runtime.Runtime, id string) runtime.Exit {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ch, err := rt.Wait(ctx, id)
	if err != nil {
		t.Fatalf("wait for %s: %v", id, err)
	}
	e := <-ch
	if e.Err != nil {
		t.Fatalf("wait for %s: %v", id, e.Err)
	}
	return e
}

func removeTask(t *testing.T, rt runtime.Runtime, id string) {
	t.Helper()
	if err := rt.Remove(context.Background(), id); err != nil {
		t.Fatalf("remove %s: %v", id, err)
	}
	tasks, err := rt.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, ti := range tasks {
		if ti.ID == id {
			t.Fatalf("task %s still listed after Remove: %+v", id, ti)
		}
	}
}

func findTask(t *testing.T, rt runtime.Runtime, id string) runtime.TaskInfo {
	t.Helper()
	tasks, err := rt.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, ti := range tasks {
		if ti.ID == id {
			return ti
		}
	}
	t.Fatalf("task %s not in List: %+v", id, tasks)
	return runtime.TaskInfo{}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// waitLog waits until the log at path contains s.
func waitLog(t *testing.T, path, s string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		data, _ := os.ReadFile(path)
		if strings.Contains(string(data), s) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("log %s: no %q within 10s (it has %q)", path, s, data)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// testExecTerminal: a terminal has the size asked for at the start, and a
// resize reaches it while the process runs.
func testExecTerminal(t *testing.T, rt runtime.Runtime) {
	ctx := context.Background()
	var out bytes.Buffer
	code, err := rt.Exec(ctx, "shell", []string{"busybox", "stty", "size"}, nil, &out, &out, &runtime.Terminal{Width: 100, Height: 30})
	if err != nil || code != 0 || strings.TrimSpace(out.String()) != "30 100" {
		t.Errorf("stty size on a 100x30 terminal: %q, exit %d, %v", out.String(), code, err)
	}

	// Each line in prints the size; q ends it.
	resize := make(chan runtime.TerminalSize, 1)
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := rt.Exec(ctx, "shell", []string{"sh", "-c", `while read x; do [ "$x" = q ] && exit 0; busybox stty size; done`}, inR, outW, outW,
			&runtime.Terminal{Width: 80, Height: 24, Resize: resize})
		outW.Close()
		done <- err
	}()
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(outR)
		for sc.Scan() {
			lines <- strings.TrimSpace(sc.Text())
		}
		close(lines)
	}()
	size := func() string { // the next size line (the terminal echoes each x)
		inW.Write([]byte("x\n"))
		for l := range lines {
			if l != "x" {
				return l
			}
		}
		return ""
	}
	if got := size(); got != "24 80" {
		t.Errorf("first size %q, want 24 80", got)
	}
	resize <- runtime.TerminalSize{Width: 120, Height: 40}
	got := ""
	for range 200 { // the resize is applied apart from the input: ask again until it shows
		if got = size(); got != "24 80" {
			break
		}
	}
	if got != "40 120" {
		t.Errorf("size after a resize to 120x40: %q", got)
	}
	inW.Write([]byte("q\n"))
	if err := <-done; err != nil {
		t.Errorf("exec: %v", err)
	}
}
