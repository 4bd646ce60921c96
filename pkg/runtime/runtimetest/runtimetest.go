// Package runtimetest starts private containerd daemons for tests that
// need a real container runtime: each in a directory of its own under
// /tmp (short, for socket paths), with its own namespace, runc root and
// cgroup parent, and everything removed when the test ends — containers,
// shims, mounts, cgroups, files. Tests are skipped where containerd cannot
// run (not root, no containerd or runc).
//
//	d := runtimetest.Start(t)
//	rt := d.Runtime(t)          // a runtime.Containerd on it, closed at cleanup
//	rt2 := d.Runtime(t)         // another client: a restarted schedd
//	d.Stop(t); d.Start(t)       // containerd down and up again (tasks survive)
package runtimetest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/devcluster"
	"github.com/shoal-dev/shoal/pkg/runtime"
)

// Available returns why a real containerd cannot run here, or "" if it
// can.
func Available() string {
	if os.Geteuid() != 0 {
		return "not root"
	}
	for _, bin := range []string{"containerd", "containerd-shim-runc-v2", "runc"} {
		if _, err := exec.LookPath(bin); err != nil {
			return bin + " not found (apt-get install containerd runc)"
		}
	}
	return ""
}

// The shims of containerd 1.6 put their sockets in /run/containerd/s
// whatever containerd's --state. If that directory did not exist before
// the first daemon of this process, the last teardown removes it (when
// empty, and no containerd runs on the machine any more).
var (
	shimDirMu      sync.Mutex
	shimDirChecked bool
	shimDirOurs    bool
	daemons        int
)

const shimDir = "/run/containerd/s"

// UsesShimDir is for tests that run containerds other than through Start
// (say, in a devcluster): /run/containerd/s is then left as it was found
// once t and every Daemon are done. Call it before the first containerd
// starts.
func UsesShimDir(t testing.TB) {
	shimDirStarted()
	t.Cleanup(shimDirDone)
}

func shimDirStarted() {
	shimDirMu.Lock()
	defer shimDirMu.Unlock()
	if !shimDirChecked {
		shimDirChecked = true
		_, err := os.Stat(filepath.Dir(shimDir))
		shimDirOurs = os.IsNotExist(err)
	}
	daemons++
}

func shimDirDone() {
	shimDirMu.Lock()
	defer shimDirMu.Unlock()
	daemons--
	if daemons > 0 || !shimDirOurs {
		return
	}
	// Shims that were told to exit may take a moment.
	for deadline := time.Now().Add(time.Second); containerdRuns(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			return
		}
	}
	os.Remove(shimDir) // only when empty
	os.Remove(filepath.Dir(shimDir))
}

// containerdRuns reports whether any containerd or shim runs on the
// machine (whose sockets might be on their way into /run/containerd/s).
// Zombies do not count.
func containerdRuns() bool {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ...
		s := string(stat)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open || end+3 > len(s) {
			continue
		}
		if strings.HasPrefix(s[open+1:end], "containerd") && s[end+2] != 'Z' {
			return true
		}
	}
	return false
}

// Daemon is a private containerd.
type Daemon struct {
	// Dir holds everything of the daemon but its cgroups.
	Dir string
	// Layout is its layout (as a devcluster node's).
	Layout devcluster.ContainerdLayout
	// Log is containerd's log file.
	Log string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	n    int // runtimes made, for state dirs
}

// Start starts a containerd for t (skipping t if Available says no) and
// registers its teardown with t.Cleanup.
func Start(t testing.TB) *Daemon {
	t.Helper()
	if why := Available(); why != "" {
		t.Skipf("no real containerd: %s", why)
	}
	dir, err := os.MkdirTemp("/tmp", "shct-")
	if err != nil {
		t.Fatal(err)
	}
	suffix := strings.TrimPrefix(filepath.Base(dir), "shct-")
	d := &Daemon{
		Dir: dir,
		Layout: devcluster.ContainerdLayout{
			Config:       filepath.Join(dir, "config.toml"),
			Root:         filepath.Join(dir, "root"),
			State:        filepath.Join(dir, "state"),
			Address:      filepath.Join(dir, "c.sock"),
			Namespace:    "shoal-test-" + strings.ToLower(suffix),
			RuncRoot:     filepath.Join(dir, "runc"),
			CgroupParent: "/shoal-test-" + strings.ToLower(suffix),
		},
		Log: filepath.Join(dir, "containerd.log"),
	}
	shimDirStarted()
	t.Cleanup(func() {
		d.teardown(t)
		shimDirDone()
	})
	if err := devcluster.WriteContainerdConfig(d.Layout, "info"); err != nil {
		t.Fatal(err)
	}
	d.Start(t)
	return d
}

// Start starts the daemon again after Stop or Kill.
func (d *Daemon) Start(t testing.TB) {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd != nil {
		t.Fatal("runtimetest: containerd already runs")
	}
	logf, err := os.OpenFile(d.Log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command("containerd", "--config", d.Layout.Config)
	cmd.Stdout, cmd.Stderr = logf, logf
	// A process group of its own: a test's ^C does not reach it directly,
	// and the shims it starts are not ours to signal.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start containerd: %v", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	d.cmd, d.done = cmd, done
	deadline := time.Now().Add(10 * time.Second)
	for {
		if c, err := net.Dial("unix", d.Layout.Address); err == nil {
			c.Close()
			return
		}
		select {
		case <-done:
			t.Fatalf("containerd exited during start-up; %s", d.logTail())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("containerd did not serve on %s within 10s; %s", d.Layout.Address, d.logTail())
		}
	}
}

// Stop stops the daemon (SIGTERM; SIGKILL after 5s). Its containers keep
// running.
func (d *Daemon) Stop(t testing.TB) { t.Helper(); d.stop(t, syscall.SIGTERM) }

// Kill kills the daemon with SIGKILL. Its containers keep running.
func (d *Daemon) Kill(t testing.TB) { t.Helper(); d.stop(t, syscall.SIGKILL) }

func (d *Daemon) stop(t testing.TB, sig syscall.Signal) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd == nil {
		return
	}
	d.cmd.Process.Signal(sig)
	select {
	case <-d.done:
	case <-time.After(5 * time.Second):
		d.cmd.Process.Kill()
		<-d.done
	}
	d.cmd = nil
	// containerd removes its sockets on a clean exit only.
	os.Remove(d.Layout.Address)
	os.Remove(d.Layout.Address + ".ttrpc")
}

// Config returns a runtime.Config for the daemon, with a state dir of its
// own; namespace "" is the daemon's (a node's), another gives a separate
// node on the same daemon.
func (d *Daemon) Config(namespace string) runtime.Config {
	d.mu.Lock()
	d.n++
	n := d.n
	d.mu.Unlock()
	if namespace == "" {
		namespace = d.Layout.Namespace
	}
	return runtime.Config{
		Address:      d.Layout.Address,
		Namespace:    namespace,
		RuncRoot:     d.Layout.RuncRoot,
		CgroupParent: d.Layout.CgroupParent,
		StateDir:     filepath.Join(d.Dir, fmt.Sprintf("rt%d", n)),
		// Fail fast while a test has containerd down.
		DialTimeout: 500 * time.Millisecond,
	}
}

// Runtime returns a new runtime on the daemon's namespace, closed when t
// ends. logger may be nil.
func (d *Daemon) Runtime(t testing.TB, logger *slog.Logger) *runtime.Containerd {
	t.Helper()
	cfg := d.Config("")
	cfg.Logger = logger
	return d.RuntimeWith(t, cfg)
}

// RuntimeWith returns a new runtime with cfg, closed when t ends.
func (d *Daemon) RuntimeWith(t testing.TB, cfg runtime.Config) *runtime.Containerd {
	t.Helper()
	rt, err := runtime.NewContainerd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	return rt
}

// teardown kills every container and shim of the daemon, stops it,
// unmounts and removes its directory and cgroups.
func (d *Daemon) teardown(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	// Remove tasks through containerd first, so its shims exit cleanly and
	// remove their sockets; then make sure with KillContainers.
	d.mu.Lock()
	running := d.cmd != nil
	d.mu.Unlock()
	if running {
		if err := d.removeAll(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if err := devcluster.KillContainers(ctx, d.Layout); err != nil {
		errs = append(errs, err)
	}
	d.Stop(t)
	if err := devcluster.KillContainers(ctx, d.Layout); err != nil {
		errs = append(errs, err)
	}
	tail := d.logTail()
	if err := os.RemoveAll(d.Dir); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		t.Errorf("runtimetest: teardown: %v; %s", errors.Join(errs...), tail)
	} else if t.Failed() {
		t.Logf("runtimetest: %s", tail)
	}
}

// removeAll removes every task of every namespace of the daemon.
func (d *Daemon) removeAll(ctx context.Context) error {
	nss, err := os.ReadDir(filepath.Join(d.Layout.State, "io.containerd.runtime.v2.task"))
	if err != nil {
		return nil // no task ever ran
	}
	var errs []error
	for _, ns := range nss {
		cfg := d.Config(ns.Name())
		rt, err := runtime.NewContainerd(cfg)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		tasks, err := rt.List(ctx)
		if err != nil {
			errs = append(errs, err)
		}
		for _, ti := range tasks {
			if err := rt.Remove(ctx, ti.ID); err != nil {
				errs = append(errs, err)
			}
		}
		rt.Close()
	}
	return errors.Join(errs...)
}

func (d *Daemon) logTail() string {
	data, err := os.ReadFile(d.Log)
	if err != nil {
		return "no containerd log"
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return "containerd log ends:\n    " + strings.Join(lines, "\n    ")
}
