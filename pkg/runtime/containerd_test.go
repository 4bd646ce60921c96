package runtime_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/shoal-dev/shoal/pkg/runtime"
	"github.com/shoal-dev/shoal/pkg/runtime/runtimetest"
	"github.com/shoal-dev/shoal/pkg/tasklog"
)

// TestContainerd runs the suite against real containerds (as root).
func TestContainerd(t *testing.T) {
	da := runtimetest.Start(t)
	var (
		mu   sync.Mutex
		db   *runtimetest.Daemon
		cfgs = map[string]runtime.Config{}
	)
	logger := testLogger(t)
	h := harness{
		real:         true,
		cgroupParent: da.Layout.CgroupParent,
		node: func(st *testing.T, name string) runtime.Runtime {
			mu.Lock()
			defer mu.Unlock()
			d := da
			if strings.HasPrefix(name, "b") {
				if db == nil {
					db = runtimetest.Start(t)
				}
				d = db
			}
			cfg, ok := cfgs[name]
			if !ok {
				ns := ""
				if name != "a" && name != "b" {
					ns = d.Layout.Namespace + "-" + name
				}
				cfg = d.Config(ns)
				cfg.Logger = logger.With("node", name)
				cfgs[name] = cfg
			}
			return d.RuntimeWith(st, cfg)
		},
		ingests: func(t *testing.T, rt runtime.Runtime) int {
			c := rt.(*runtime.Containerd)
			ctx := c.WithNamespace(context.Background())
			st, err := c.Client().ContentStore().ListStatuses(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return len(st)
		},
		down: func(t *testing.T) { da.Stop(t) },
		up:   func(t *testing.T) { da.Start(t) },
	}
	t.Run("Limits", func(t *testing.T) { testLimits(t, h) })
	t.Run("Isolation", func(t *testing.T) { testIsolation(t, h) })
	t.Run("Process", func(t *testing.T) { testProcess(t, h) })
	t.Run("BinaryLog", func(t *testing.T) { testBinaryLog(t, h) })
	runSuite(t, h)
}

// testProcess checks the process settings a Compose file or `service
// create` may give: the entrypoint (replacing the image's, and its Cmd),
// the user (by number and by name from the image's /etc/passwd), the
// working directory, and a read-only root that still takes its mounts (a
// bind mount, and a tmpfs of a given size the user may write to).
func testProcess(t *testing.T, h harness) {
	ctx := context.Background()
	rt := h.node(t, "a")
	importOCI(t, rt)
	dir := t.TempDir()
	mounted := filepath.Join(dir, "mounted")
	if err := os.WriteFile(mounted, []byte("m\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		spec runtime.TaskSpec
		want string
	}{
		{"numbers", runtime.TaskSpec{User: "1000:1001", WorkDir: "/tmp", ReadOnly: true,
			Entrypoint: []string{"sh", "-c"}, Args: []string{"id -u; id -g; pwd; touch /x 2>/dev/null && echo rw || echo ro; cat /etc/m; " +
				"touch /scratch/x && echo scratch-rw; grep ' /scratch ' /proc/mounts | grep -o 'size=[0-9]*k'"},
			Mounts: []runtime.Mount{{Source: mounted, Target: "/etc/m", ReadOnly: true}, {Target: "/scratch", Tmpfs: true, SizeBytes: 2 << 20}}},
			"1000\n1001\n/tmp\nro\nm\nscratch-rw\nsize=2048k\n"},
		{"name", runtime.TaskSpec{User: "nobody", Entrypoint: []string{"sh", "-c", "id -u; pwd; touch /x 2>/dev/null && echo rw"}}, "65534\n/\n"},
		{"defaults", runtime.TaskSpec{Args: []string{"sh", "-c", "id -u; pwd; touch /x && echo rw"}}, "0\n/\nrw\n"},
	} {
		id := "process-" + tc.name
		tc.spec.ID, tc.spec.Image = id, "local/busybox:latest"
		tc.spec.LogPath = filepath.Join(dir, id+".log")
		if err := rt.Run(ctx, tc.spec); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		waitExit(t, rt, id)
		if got := readFile(t, tc.spec.LogPath); got != tc.want {
			t.Errorf("%s: the process printed %q, want %q", tc.name, got, tc.want)
		}
		removeTask(t, rt, id)
	}
	if err := rt.Run(ctx, runtime.TaskSpec{ID: "process-bad", Image: "local/busybox:latest", WorkDir: "tmp"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("a relative working directory: %v, want invalid argument", err)
	}
}

// testBinaryLog runs a task whose output goes through shoal-logger, as
// schedd's do: the shim starts the logger, which stamps each line with
// its stream, and the logger ends with the task.
func testBinaryLog(t *testing.T, h harness) {
	ctx := context.Background()
	rt := h.node(t, "a")
	importOCI(t, rt)
	dir := t.TempDir()
	logger := buildLogger(t, dir)
	spec := runtime.TaskSpec{ID: "binary-log", Image: "local/busybox:latest",
		Args:      []string{"sh", "-c", "echo out; echo err >&2; echo -n end"},
		LogPath:   filepath.Join(dir, "binary-log.log"),
		LogBinary: logger,
	}
	spec.LogArgs = tasklog.LoggerArgs(spec.LogPath, tasklog.DefaultLimits)
	start := time.Now()
	if err := rt.Run(ctx, spec); err != nil {
		t.Fatal(err)
	}
	waitExit(t, rt, spec.ID)
	removeTask(t, rt, spec.ID)
	// Remove closes the task's I/O: the shim stops the logger, which
	// first writes what the pipes still held.
	var got []string
	err := tasklog.Read(ctx, spec.LogPath, tasklog.ReadOptions{}, func(r tasklog.Record) error {
		if r.Time.Before(start.Add(-time.Second)) || r.Time.After(time.Now()) {
			t.Errorf("record %+v stamped outside the task's run", r)
		}
		got = append(got, fmt.Sprintf("%s:%s:%v", r.Stream, r.Content, r.Partial))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	if want := []string{"stderr:err:false", "stdout:end:true", "stdout:out:false"}; !slices.Equal(got, want) {
		t.Fatalf("records %q, want %q", got, want)
	}
	if out, err := exec.Command("pgrep", "-f", logger).Output(); err == nil {
		t.Fatalf("the logger still runs after the task's removal: %s", out)
	}
}

// buildLogger builds shoal-logger into dir and returns its path.
func buildLogger(tb testing.TB, dir string) string {
	tb.Helper()
	logger := filepath.Join(dir, "shoal-logger")
	if out, err := exec.Command("go", "build", "-o", logger, "github.com/shoal-dev/shoal/cmd/logger").CombinedOutput(); err != nil {
		tb.Fatalf("build shoal-logger: %v\n%s", err, out)
	}
	return logger
}

// testLimits checks that CPU and memory limits reach the task's cgroup
// under the runtime's cgroup parent.
func testLimits(t *testing.T, h harness) {
	ctx := context.Background()
	rt := h.node(t, "a")
	importOCI(t, rt)
	if err := rt.Run(ctx, runtime.TaskSpec{ID: "limited", Image: "local/busybox:latest", Args: sleepArgs, MemoryBytes: 64 << 20, CPUMillis: 250}); err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]int64{
		"memory/" + h.cgroupParent + "/limited/memory.limit_in_bytes": 64 << 20,
		"cpu/" + h.cgroupParent + "/limited/cpu.cfs_quota_us":         25000,
		"cpu/" + h.cgroupParent + "/limited/cpu.cfs_period_us":        100000,
	} {
		data, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", file))
		if err != nil {
			t.Errorf("cgroup: %v", err)
			continue
		}
		if got, _ := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64); got != want {
			t.Errorf("%s = %d, want %d", file, got, want)
		}
	}
	removeTask(t, rt, "limited")
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/memory", h.cgroupParent, "limited")); !os.IsNotExist(err) {
		t.Errorf("task cgroup after Remove: %v, want it gone", err)
	}
}

// testLogger logs to the test log with -v, and nowhere otherwise.
func testLogger(t *testing.T) *slog.Logger {
	if !testing.Verbose() {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// testIsolation checks network namespaces and bind mounts.
func testIsolation(t *testing.T, h harness) {
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("no ip (iproute2)")
	}
	ctx := context.Background()
	rt := h.node(t, "a")
	importOCI(t, rt)
	netns := fmt.Sprintf("shct-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", netns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	defer exec.Command("ip", "netns", "delete", netns).Run()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "hello"), []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := runtime.TaskSpec{
		ID: "isolated", Image: "local/busybox:latest", Args: sleepArgs,
		NetNSPath: "/var/run/netns/" + netns,
		Mounts:    []runtime.Mount{{Source: dir, Target: "/data", ReadOnly: true}},
	}
	if err := rt.Run(ctx, spec); err != nil {
		t.Fatal(err)
	}
	defer removeTask(t, rt, "isolated")
	spec.ID, spec.NetNSPath = "hostnet", ""
	if err := rt.Run(ctx, spec); err != nil {
		t.Fatal(err)
	}
	defer removeTask(t, rt, "hostnet")
	sh := func(id, script string) (string, int) {
		t.Helper()
		var out bytes.Buffer
		code, err := rt.Exec(ctx, id, []string{"sh", "-c", script}, nil, &out, &out, nil)
		if err != nil {
			t.Fatal(err)
		}
		return out.String(), code
	}
	links := func(id string) []string {
		out, _ := sh(id, "tail -n +3 /proc/net/dev | cut -d: -f1")
		return strings.Fields(out)
	}
	if got := links("isolated"); !slices.Equal(got, []string{"lo"}) {
		t.Errorf("links in a netns of its own: %v, want just lo", got)
	}
	if got := links("hostnet"); len(got) < 2 {
		t.Errorf("links in the node's netns: %v, want the node's", got)
	}
	if out, code := sh("isolated", "cat /data/hello"); out != "from the host\n" || code != 0 {
		t.Errorf("read a bind mount: %q, %d", out, code)
	}
	if _, code := sh("isolated", "touch /data/x 2>/dev/null"); code == 0 {
		t.Error("wrote to a read-only mount")
	}
}
