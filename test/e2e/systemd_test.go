package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// nspawnRootEnv names the Debian root (with systemd) that make e2e
// prepares (make nspawn-root) for TestSystemdNode.
const nspawnRootEnv = "SHOAL_NSPAWN_ROOT"

// TestSystemdNode boots a real systemd in a container (systemd-nspawn on
// a minimal Debian root, over a throwaway overlay: PID 1 of this machine
// is not systemd) and runs statd and vold from the project's own unit
// files, as `make install` and `systemctl enable` leave them. A service
// of that systemd writes to a volume through its mount while vold is
// restarted, killed with SIGKILL, hung (SIGSTOP) until systemd's watchdog
// kills it, and while statd restarts: the writer stays the same process,
// its writes never fail, and the file has no gap (the unit's
// KillMode=process lets the FUSE session holder outlive each restart).
func TestSystemdNode(t *testing.T) {
	root := os.Getenv(nspawnRootEnv)
	if root == "" {
		t.Skipf("$%s is not set: make e2e prepares the container's root (make nspawn-root) and sets it", nspawnRootEnv)
	}
	if _, err := os.Stat(filepath.Join(root, "lib/systemd/systemd")); err != nil {
		t.Fatalf("$%s=%s holds no systemd: %v", nspawnRootEnv, root, err)
	}
	units, err := filepath.Abs("../../systemd")
	if err != nil {
		t.Fatal(err)
	}
	c := bootContainer(t, root, units)

	// Install the units as `make install` does and enable them.
	c.must("sh", "-c", "cp /opt/shoal/systemd/* /etc/systemd/system/ && systemctl daemon-reload && "+
		"systemctl enable --now shoal-statd.socket shoal-vold.socket shoal-statd.service shoal-vold.service")
	waitFor(t, 60*time.Second, "statd and vold active", func() bool {
		return c.prop("shoal-statd", "ActiveState") == "active" && c.prop("shoal-vold", "ActiveState") == "active"
	})
	c.must("shoalctl", "cluster", "init", "--advertise", "127.0.0.1")
	waitFor(t, 60*time.Second, "vold in the cluster", func() bool {
		_, err := c.run("shoalctl", "volume", "ls")
		return err == nil
	})
	c.must("shoalctl", "volume", "create", "v1", "--replicas", "1", "--size", "16m")
	mnt := strings.TrimSpace(c.must("shoalctl", "volume", "mount", "v1"))
	log := mnt + "/log"

	// The writer: a service of the container's systemd, appending a
	// counter to a file it keeps open; a failed write ends it (exit 7).
	c.must("systemd-run", "--unit=shoal-writer", "bash", "-c",
		`exec 3>>`+log+`; i=0; while [ $i -lt 200000 ]; do echo $i $EPOCHREALTIME >&3 || exit 7; i=$((i+1)); sleep 0.02; done`)
	writer := c.prop("shoal-writer", "MainPID")
	c.progress(log)
	type step struct {
		name string
		line int // the writer's lines when the step began
	}
	var steps []step
	begin := func(name string) { steps = append(steps, step{name, c.lines(log)}) }

	begin("restart")
	t.Run("restart", func(t *testing.T) {
		before := c.prop("shoal-vold", "MainPID")
		c.must("systemctl", "restart", "shoal-vold")
		waitFor(t, 60*time.Second, "vold active again", func() bool {
			return c.prop("shoal-vold", "ActiveState") == "active" && c.prop("shoal-vold", "MainPID") != before
		})
		c.progress(log)
	})
	begin("kill9")
	t.Run("kill9", func(t *testing.T) {
		restarts := c.restarts("shoal-vold")
		c.must("systemctl", "kill", "--signal=KILL", "--kill-whom=main", "shoal-vold")
		waitFor(t, 60*time.Second, "vold restarted by systemd", func() bool {
			return c.restarts("shoal-vold") > restarts && c.prop("shoal-vold", "ActiveState") == "active"
		})
		c.progress(log)
	})
	begin("watchdog")
	t.Run("watchdog", func(t *testing.T) {
		// A short watchdog, so that the test waits seconds, not a minute.
		c.must("sh", "-c", `mkdir -p /run/systemd/system/shoal-vold.service.d && `+
			`printf '[Service]\nWatchdogSec=3s\nTimeoutAbortSec=5s\n' > /run/systemd/system/shoal-vold.service.d/watchdog.conf && `+
			`systemctl daemon-reload && systemctl restart shoal-vold`)
		waitFor(t, 60*time.Second, "vold active with the short watchdog", func() bool {
			return c.prop("shoal-vold", "ActiveState") == "active" && c.prop("shoal-vold", "WatchdogUSec") == "3s"
		})
		c.progress(log)
		restarts := c.restarts("shoal-vold")
		hung := c.prop("shoal-vold", "MainPID")
		c.must("sh", "-c", "kill -STOP "+hung)
		waitFor(t, 60*time.Second, "hung vold restarted by the watchdog", func() bool {
			return c.restarts("shoal-vold") > restarts && c.prop("shoal-vold", "ActiveState") == "active"
		})
		if out := c.must("journalctl", "--boot", "-u", "shoal-vold", "--no-pager"); !strings.Contains(out, "Watchdog timeout") {
			t.Fatalf("vold was restarted, but not by its watchdog:\n%s", out)
		}
		c.progress(log)
	})
	begin("statd restart")
	t.Run("statd restart", func(t *testing.T) {
		vold := c.prop("shoal-vold", "MainPID")
		statd := c.prop("shoal-statd", "MainPID")
		c.must("systemctl", "restart", "shoal-statd")
		waitFor(t, 60*time.Second, "statd active again", func() bool {
			return c.prop("shoal-statd", "ActiveState") == "active" && c.prop("shoal-statd", "MainPID") != statd
		})
		c.progress(log)
		if got := c.prop("shoal-vold", "MainPID"); got != vold {
			t.Fatalf("statd's restart restarted vold (main PID %s, was %s)", got, vold)
		}
		c.must("shoalctl", "volume", "inspect", "v1")
	})

	if got := c.prop("shoal-writer", "MainPID"); got != writer || c.prop("shoal-writer", "ActiveState") != "active" {
		t.Fatalf("the writer is %s (main PID %s, was %s): its mount did not survive\n%s", c.prop("shoal-writer", "ActiveState"), got, writer,
			c.journal("shoal-writer"))
	}
	// The file is whole; and how long the writer waited at most in each
	// step (a write that waits for vold to be back).
	var at []float64
	for k, line := range strings.Split(strings.TrimSpace(c.must("cat", log)), "\n") {
		var i int
		var ts float64
		if _, err := fmt.Sscan(line, &i, &ts); err != nil || i != k {
			t.Fatalf("line %d of the writer's file is %q, want %d and a time", k+1, line, k)
		}
		at = append(at, ts)
	}
	var waits []string
	for k, st := range steps {
		end := len(at)
		if k+1 < len(steps) {
			end = steps[k+1].line
		}
		longest := 0.0
		for i := max(st.line, 1); i < end; i++ {
			longest = max(longest, at[i]-at[i-1])
		}
		waits = append(waits, fmt.Sprintf("%s %.2f s", st.name, longest))
	}
	t.Logf("the writer wrote %d lines without a gap; its longest wait for a write in each step: %s", len(at), strings.Join(waits, ", "))
}

// container is a booted systemd-nspawn container.
type container struct {
	t      *testing.T
	nspawn *exec.Cmd
	init   int // the container's PID 1, as this machine numbers it
	done   chan struct{}
}

// bootContainer boots root's systemd in a container of its own network
// (loopback only) over a tmpfs overlay, with this run's binaries in
// /usr/local/bin and units in /opt/shoal/systemd; the test's end powers
// it off.
func bootContainer(t *testing.T, root, units string) *container {
	t.Helper()
	name := fmt.Sprintf("shoal-e2e-%d", os.Getpid())
	cmd := exec.Command("systemd-nspawn", "--directory", root, "--boot", "--machine", name,
		"--register=no", "--keep-unit", "--private-network", "--console=read-only", "--volatile=overlay",
		"--bind=/dev/fuse", "--bind-ro="+binDir+":/usr/local/bin", "--bind-ro="+units+":/opt/shoal/systemd")
	console := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = console, console
	if err := cmd.Start(); err != nil {
		t.Fatalf("systemd-nspawn: %v", err)
	}
	c := &container{t: t, nspawn: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(c.done) }()
	t.Cleanup(func() { c.stop() })
	waitFor(t, 30*time.Second, "the container's PID 1", func() bool {
		c.init = childOf(cmd.Process.Pid)
		return c.init != 0
	})
	var state string
	deadline := time.Now().Add(90 * time.Second)
	for {
		state, _ = c.run("systemctl", "is-system-running")
		state = strings.TrimSpace(state)
		if state == "running" || state == "degraded" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the container's systemd is %q after 90s; console:\n%s", state, console.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	return c
}

// childOf returns a child process of pid, or 0.
func childOf(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(f[0])
	return n
}

// run runs argv inside the container (all its namespaces).
func (c *container) run(argv ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	args := append([]string{"--target", strconv.Itoa(c.init), "--all", "--"}, argv...)
	out, err := exec.CommandContext(ctx, "nsenter", args...).CombinedOutput()
	return string(out), err
}

func (c *container) must(argv ...string) string {
	c.t.Helper()
	out, err := c.run(argv...)
	if err != nil {
		c.t.Fatalf("in the container, %s: %v\n%s\n%s", strings.Join(argv, " "), err, out, c.journal("shoal-statd", "shoal-vold"))
	}
	return out
}

// prop returns a unit's property as systemctl shows it.
func (c *container) prop(unit, name string) string {
	out, _ := c.run("systemctl", "show", unit, "--property", name, "--value")
	return strings.TrimSpace(out)
}

func (c *container) restarts(unit string) int {
	n, _ := strconv.Atoi(c.prop(unit, "NRestarts"))
	return n
}

// journal returns the units' recent log.
func (c *container) journal(units ...string) string {
	args := []string{"journalctl", "--no-pager", "--boot", "-n", "60"}
	for _, u := range units {
		args = append(args, "-u", u)
	}
	out, _ := c.run(args...)
	return out
}

// lines counts the lines of the file at path (-1: unknown).
func (c *container) lines(path string) int {
	out, err := c.run("wc", "-l", path)
	if err != nil {
		return -1
	}
	f := strings.Fields(out)
	if len(f) == 0 {
		return -1
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return -1
	}
	return n
}

// progress waits for the file at path to gain 20 lines.
func (c *container) progress(path string) {
	c.t.Helper()
	start := c.lines(path)
	deadline := time.Now().Add(60 * time.Second)
	for {
		n := c.lines(path)
		if start >= 0 && n >= start+20 {
			return
		}
		if start < 0 {
			start = n
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%s stopped growing at %d lines\n%s", path, n, c.journal("shoal-writer", "shoal-vold"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop powers the container off (nspawn asks its systemd on SIGTERM),
// and kills it if it does not go within 30 s.
func (c *container) stop() {
	_ = c.nspawn.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
		return
	case <-time.After(30 * time.Second):
	}
	if c.init != 0 {
		_ = syscall.Kill(c.init, syscall.SIGKILL) // ends every process of its PID namespace
	}
	_ = c.nspawn.Process.Kill()
	<-c.done
}
