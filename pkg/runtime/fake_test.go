package runtime_test

import (
	"context"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/shoal-dev/shoal/pkg/runtime"
)

// fakeProgram plays the suite's shell scripts on the fake.
func fakeProgram(spec runtime.TaskSpec) runtime.Program {
	switch {
	case slices.Equal(spec.Args, trapArgs):
		return runtime.Program{Output: "ready\n", OnSignal: map[syscall.Signal]int{syscall.SIGTERM: 42}}
	case slices.Equal(spec.Args, usr1Args):
		return runtime.Program{Output: "ready\n", OnSignal: map[syscall.Signal]int{syscall.SIGUSR1: 7}}
	case slices.Equal(spec.Args, statsArgs):
		return runtime.Program{Output: "done\n"}
	}
	return runtime.DefaultProgram(spec)
}

// TestFake runs the suite against the fake.
func TestFake(t *testing.T) {
	fakes := map[string]*runtime.Fake{}
	h := harness{
		node: func(t *testing.T, name string) runtime.Runtime {
			f, ok := fakes[name]
			if !ok {
				f = runtime.NewFake()
				f.SetProgram(fakeProgram)
				fakes[name] = f
			}
			return f.Reopen()
		},
	}
	h.down = func(t *testing.T) { fakes["a"].SetUnavailable(true) }
	h.up = func(t *testing.T) { fakes["a"].SetUnavailable(false) }
	runSuite(t, h)
}

// TestFakeInjection covers what only the fake does: crashes on demand and
// failing calls.
func TestFakeInjection(t *testing.T) {
	ctx := context.Background()
	f := runtime.NewFake()
	importOCI(t, f)
	if err := f.Run(ctx, runtime.TaskSpec{ID: "t1", Image: "local/busybox:latest", Args: []string{"httpd", "-f"}}); err != nil {
		t.Fatal(err)
	}
	exitC, err := f.Wait(ctx, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Exit("t1", 139); err != nil {
		t.Fatal(err)
	}
	if e := <-exitC; e.Code != 139 {
		t.Errorf("exit %+v, want the injected 139", e)
	}
	if err := f.Exit("t1", 1); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Exit of a stopped task: %v", err)
	}
	f.FailNext("Run", errdefs.ErrResourceExhausted)
	if err := f.Run(ctx, runtime.TaskSpec{ID: "t2", Image: "local/busybox:latest"}); !errdefs.IsResourceExhausted(err) {
		t.Errorf("Run after FailNext: %v", err)
	}
	if err := f.Run(ctx, runtime.TaskSpec{ID: "t2", Image: "local/busybox:latest", Args: []string{"sleep", "0.05"}}); err != nil {
		t.Errorf("second Run: %v", err)
	}
	if e := waitExit(t, f, "t2"); e.Code != 0 {
		t.Errorf("sleep 0.05 exit %+v", e)
	}
	// Pids count up deterministically.
	tasks, err := f.List(ctx)
	if err != nil || len(tasks) != 2 || tasks[0].Pid != 1000 || tasks[1].Pid != 1001 {
		t.Errorf("List = %+v, %v", tasks, err)
	}
	// A closed handle fails; others go on.
	g := f.Reopen()
	f.Close()
	if _, err := f.List(ctx); !errdefs.IsUnavailable(err) {
		t.Errorf("List on a closed handle: %v", err)
	}
	if _, err := g.List(ctx); err != nil {
		t.Errorf("List on another handle: %v", err)
	}
	// Stop with a grace period waits for a program that exits on its own.
	if err := g.Run(ctx, runtime.TaskSpec{ID: "t3", Image: "local/busybox:latest", Args: []string{"sleep", "0.05"}}); err != nil {
		t.Fatal(err)
	}
	if e, err := g.Stop(ctx, "t3", 10*time.Second); err != nil || e.Code != 0 {
		t.Errorf("Stop of a task that exits during the grace period: %+v, %v", e, err)
	}
}

// TestFakeStats covers the fake's samples: CPU that grows, memory within
// the limit, and injected failures.
func TestFakeStats(t *testing.T) {
	ctx := context.Background()
	f := runtime.NewFake()
	importOCI(t, f)
	if err := f.Run(ctx, runtime.TaskSpec{ID: "small", Image: "local/busybox:latest", Args: sleepArgs, MemoryBytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	s1, err := f.Stats(ctx, "small")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	s2, err := f.Stats(ctx, "small")
	if err != nil || s2.CPUNanos <= s1.CPUNanos || !s2.Time.After(s1.Time) {
		t.Errorf("samples %+v then %+v, %v: want CPU to grow", s1, s2, err)
	}
	if s2.MemoryLimitBytes != 1<<20 || s2.MemoryBytes == 0 || s2.MemoryBytes > 1<<20 || s2.Pids != 1 {
		t.Errorf("sample %+v: want memory within the 1 MiB limit, one process", s2)
	}
	f.FailNext("Stats", errdefs.ErrResourceExhausted)
	if _, err := f.Stats(ctx, "small"); !errdefs.IsResourceExhausted(err) {
		t.Errorf("Stats after FailNext: %v", err)
	}
	f.SetUnavailable(true)
	if _, err := f.Stats(ctx, "small"); !errdefs.IsUnavailable(err) {
		t.Errorf("Stats while down: %v", err)
	}
	f.SetUnavailable(false)
	if err := f.Exit("small", 137); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Stats(ctx, "small"); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Stats of a crashed task: %v, want FailedPrecondition", err)
	}
}
