package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/devcluster"
)

// nspawnRootEnv names the Debian root (with systemd) that make e2e
// prepares (make nspawn-root) for TestSystemdNode.
const nspawnRootEnv = "SHOAL_NSPAWN_ROOT"

// TestSystemdNode boots a real systemd in a container (systemd-nspawn on
// a copy of a minimal Debian root with containerd and runc: PID 1 of this
// machine is not systemd) and runs a whole node
// from the project's own unit files, as `make install` and `systemctl
// enable --now shoal.target` leave them. Two workloads run meanwhile: a
// service of that systemd appending to a volume through its mount, and
// a Shoal service (a container on containerd, on the overlay network,
// with the volume bind-mounted and a published port) serving a file from
// the volume. Each daemon is then restarted on its own: vold (stopped,
// killed with SIGKILL, hung with SIGSTOP until systemd's watchdog kills
// it), statd, netd, schedd (stopped and killed) and containerd. Through
// all of it the writer stays the same process, its writes never fail
// and the file has no gap; the task stays the same task, never
// restarted, and its published port serves the volume's file after
// every step (the units' KillMode=process lets the FUSE session holder,
// the WireGuard device's holder and containerd's shims outlive each
// restart). At last the container powers off, and schedd stops the task
// before vold goes: the task's SIGTERM handler can still write to its
// volume. Booted again, the node comes back by itself, with the volume's
// data, that last write included, and web running again.
func TestSystemdNode(t *testing.T) {
	root, units, image := nspawnInputs(t)
	// The machine's disk: a copy of the root, which keeps what the node
	// wrote from one boot to the next (the reboot step).
	disk := machineDisk(t, root)
	node := machine{name: fmt.Sprintf("shoal-e2e-%d", os.Getpid())}
	c := bootContainer(t, disk, units, filepath.Dir(image), node)
	c.installNode(t, "")
	c.must("shoalctl", "cluster", "init", "--advertise", "127.0.0.1")
	waitFor(t, 60*time.Second, "vold in the cluster", func() bool {
		_, err := c.run("shoalctl", "volume", "ls")
		return err == nil
	})
	c.must("shoalctl", "volume", "create", "v1", "--replicas", "1", "--size", "16m")
	mnt := strings.TrimSpace(c.must("shoalctl", "volume", "mount", "v1"))
	log := mnt + "/log"
	c.must("sh", "-c", "echo hello from v1 > "+mnt+"/hello")

	// The task: busybox's httpd serving the volume on a published port.
	c.must("shoalctl", "image", "load", "/opt/shoal/images/"+filepath.Base(image))
	// On SIGTERM the task appends to the volume, and exits 0 only if that
	// write succeeded (the shutdown step below).
	c.must("shoalctl", "service", "create", "web", "--image", "local/busybox:latest", "-p", "8080:80",
		"--volume", "v1:/data", "--stop-grace", "5s", "--", "sh", "-c",
		`trap 'echo bye >> /data/bye && exit 0; exit 9' TERM; httpd -p 80 -h /data; while true; do sleep 0.2; done`)
	t.Cleanup(func() { _, _ = c.run("shoalctl", "service", "rm", "web") }) // before the container stops, if it still runs
	task := c.task()
	c.serves()

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
		c.restart(t, "shoal-vold")
		c.progress(log)
		c.still(task)
	})
	begin("kill9")
	t.Run("kill9", func(t *testing.T) {
		c.kill9(t, "shoal-vold")
		c.progress(log)
		c.still(task)
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
		c.still(task)
	})
	begin("statd restart")
	t.Run("statd restart", func(t *testing.T) {
		vold := c.prop("shoal-vold", "MainPID")
		c.restart(t, "shoal-statd")
		c.progress(log)
		if got := c.prop("shoal-vold", "MainPID"); got != vold {
			t.Fatalf("statd's restart restarted vold (main PID %s, was %s)", got, vold)
		}
		c.must("shoalctl", "volume", "inspect", "v1")
		c.still(task)
	})
	begin("netd restart")
	t.Run("netd restart", func(t *testing.T) {
		holder := c.pid("wg-holder")
		c.restart(t, "shoal-netd")
		if got := c.pid("wg-holder"); got != holder {
			t.Fatalf("the WireGuard device's holder is %q after netd's restart, was %q", got, holder)
		}
		c.progress(log)
		c.still(task)
	})
	for _, st := range []struct {
		name string
		do   func(*testing.T, string)
		unit string
	}{{"schedd restart", c.restart, "shoal-schedd"}, {"schedd kill9", c.kill9, "shoal-schedd"}, {"containerd restart", c.restart, "containerd"}} {
		begin(st.name)
		t.Run(st.name, func(t *testing.T) {
			st.do(t, st.unit)
			c.progress(log)
			c.still(task)
		})
	}
	// The holders vold and netd started (FUSE sessions, the WireGuard
	// device) run in scopes of their own, so the daemons' restarts above
	// left no process behind in their units, which systemd would log.
	for _, h := range []struct{ pattern, scope string }{{"fd-holder", "/shoal-vold-fds-"}, {"wg-holder", "/shoal-netd-wg-"}} {
		pid := c.pid(h.pattern)
		cg, err := os.ReadFile("/proc/" + pid + "/cgroup")
		if err != nil || !strings.Contains(string(cg), h.scope) || !strings.Contains(string(cg), ".scope") {
			t.Errorf("the %s (pid %s) is not in a %s*.scope: %v\n%s", h.pattern, pid, h.scope, err, cg)
		}
	}
	if out := c.must("journalctl", "--boot", "--no-pager", "-u", "shoal-vold", "-u", "shoal-netd"); strings.Contains(out, "left-over process") || strings.Contains(out, "remains running") {
		t.Errorf("systemd found processes left behind in vold's or netd's unit:\n%s", out)
	}
	for _, d := range daemons {
		if n := c.restarts("shoal-" + d); d != "vold" && d != "schedd" && n != 0 {
			t.Errorf("shoal-%s was restarted %d times by systemd, by no step of the test's\n%s", d, n, c.journal("shoal-"+d))
		}
	}

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

	// The machine shuts down: schedd, ordered after vold, netd and
	// containerd, stops first and stops the task while its volume still
	// serves it (its SIGTERM handler's write succeeds: exit code 0), not
	// leaving it to systemd's last SIGTERM and SIGKILL. The journal goes
	// to the console (journald.conf.d in bootContainer).
	t.Run("shutdown", func(t *testing.T) {
		_, _ = c.run("systemctl", "poweroff")
		select {
		case <-c.done:
		case <-time.After(90 * time.Second):
			t.Fatalf("the container did not power off within 90 s; console:\n%s", c.tail(80))
		}
		want := regexp.MustCompile(`task stopped for the system's shutdown.* task=` + regexp.QuoteMeta(task) + ` exit_code=(\d+)`)
		m := want.FindStringSubmatch(c.console.String())
		if m == nil || m[1] != "0" {
			t.Fatalf("want schedd to stop %s at shutdown, with exit code 0 (its write to the volume succeeded); got %q; console:\n%s",
				task, m, c.tail(80))
		}
		t.Logf("at shutdown: %s", m[0])
	})

	// The machine boots again: the enabled units start the node, the
	// volume holds everything written before (the task's last write at
	// shutdown included), and schedd runs web again.
	lines := len(at)
	t.Run("reboot", func(t *testing.T) {
		c := bootContainer(t, disk, units, filepath.Dir(image), node)
		c.allActive(t)
		var mnt string
		waitFor(t, 60*time.Second, "the volume mounted after the reboot", func() bool {
			out, err := c.run("shoalctl", "volume", "mount", "v1")
			mnt = strings.TrimSpace(out)
			return err == nil
		})
		if got := c.must("cat", mnt+"/hello", mnt+"/bye"); got != "hello from v1\nbye\n" {
			t.Fatalf("after the reboot the volume holds %q, want hello's and bye's lines", got)
		}
		if n := c.lines(mnt + "/log"); n < lines {
			t.Fatalf("after the reboot the writer's file has %d lines, had %d", n, lines)
		}
		var tasks []taskState
		waitFor(t, 90*time.Second, "web running again after the reboot", func() bool {
			tasks = c.tasks("web")
			for _, ts := range tasks {
				if ts.State == "running" {
					return true
				}
			}
			return false
		})
		c.serves()
		t.Logf("after the reboot: web's tasks %+v (before: %s)", tasks, task)
		// schedd recorded the task it stopped at the shutdown as stopped
		// for it, so that its owner replaced it (here, once the node was
		// back: it is the only one), and it did not run it again.
		tasks = c.allTasks("web")
		var old, running []taskState
		for _, ts := range tasks {
			switch {
			case ts.ID == task:
				old = append(old, ts)
			case ts.State == "running":
				running = append(running, ts)
			}
		}
		if len(old) != 1 || old[0].State != "stopped" || old[0].Error != "stopped: its node shut down" ||
			len(running) != 1 || len(tasks) != 2 {
			t.Fatalf("after the reboot web's tasks are %+v; want %s stopped for the shutdown, and one new task running", tasks, task)
		}
		// The node's word that it shut down is gone: it takes tasks again.
		waitFor(t, 30*time.Second, "the node's shutdown word cleared", func() bool {
			nodes := c.nodes()
			return len(nodes) == 1 && !nodes[0].ShutDown
		})
	})
}

// restart restarts unit with systemctl and waits until it is active
// with another main process.
func (c *container) restart(t *testing.T, unit string) {
	t.Helper()
	before := c.prop(unit, "MainPID")
	c.must("systemctl", "restart", unit)
	waitFor(t, 60*time.Second, unit+" active again", func() bool {
		return c.prop(unit, "ActiveState") == "active" && c.prop(unit, "MainPID") != before
	})
}

// kill9 kills unit's main process with SIGKILL and waits until systemd
// has restarted it (Restart=always).
func (c *container) kill9(t *testing.T, unit string) {
	t.Helper()
	restarts := c.restarts(unit)
	c.must("systemctl", "kill", "--signal=KILL", "--kill-whom=main", unit)
	waitFor(t, 60*time.Second, unit+" restarted by systemd", func() bool {
		return c.restarts(unit) > restarts && c.prop(unit, "ActiveState") == "active"
	})
}

// allActive waits until every daemon's unit is active.
func (c *container) allActive(t *testing.T) {
	t.Helper()
	waitFor(t, 60*time.Second, "every daemon active", func() bool {
		for _, d := range daemons {
			if c.prop("shoal-"+d, "ActiveState") != "active" {
				return false
			}
		}
		return true
	})
}

// daemons are a node's Shoal daemons, each a unit shoal-<name>.
var daemons = []string{"statd", "vold", "netd", "schedd"}

// taskState is a task as `service ps -o json` shows it.
type taskState struct {
	ID       string     `json:"id"`
	Node     string     `json:"node"`
	State    string     `json:"state"`
	Restarts int        `json:"restarts"`
	Error    string     `json:"error"`
	Started  *time.Time `json:"started"`
	Finished *time.Time `json:"finished"`
}

// tasks returns the service's current tasks.
func (c *container) tasks(service string) []taskState {
	c.t.Helper()
	var ts []taskState
	out := c.must("shoalctl", "service", "ps", service, "-o", "json")
	if err := json.Unmarshal([]byte(out), &ts); err != nil {
		c.t.Fatalf("service ps %s -o json: %v\n%s", service, err, out)
	}
	return ts
}

// allTasks returns the service's tasks, finished ones included.
func (c *container) allTasks(service string) []taskState {
	c.t.Helper()
	var ts []taskState
	out := c.must("shoalctl", "service", "ps", service, "--all", "-o", "json")
	if err := json.Unmarshal([]byte(out), &ts); err != nil {
		c.t.Fatalf("service ps %s --all -o json: %v\n%s", service, err, out)
	}
	return ts
}

// task returns the ID of web's one task, which must be running.
func (c *container) task() string {
	c.t.Helper()
	ts := c.tasks("web")
	if len(ts) != 1 || ts[0].State != "running" {
		c.t.Fatalf("want one running task of web, got %+v\n%s", ts, c.journal("shoal-schedd", "containerd"))
	}
	return ts[0].ID
}

// still checks that web has had no task but task, running and never
// restarted (waiting up to 30 s for a restarted schedd to say so), and
// that it serves the volume's file.
func (c *container) still(task string) {
	c.t.Helper()
	want := []taskState{{ID: task, State: "running"}}
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := c.tasks("web")
		if len(got) == 1 {
			// The node's ID, which this test does not know, and the
			// times, which it does not judge here.
			got[0].Node, got[0].Started, got[0].Finished = "", nil, nil
		}
		if slices.Equal(got, want) {
			break
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("web's tasks are %+v, want %+v\n%s", got, want, c.journal("shoal-schedd", "containerd"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	c.serves()
}

// serves waits until web's published port answers with the file the
// test wrote into the volume (the port may be down while netd restarts).
func (c *container) serves() {
	c.t.Helper()
	c.servesAt("127.0.0.1", "hello from v1")
}

// servesAt checks that port 8080 at addr, seen from the container,
// serves /hello with want in it, within 30 s.
func (c *container) servesAt(addr, want string) {
	c.t.Helper()
	get := `exec 3<>/dev/tcp/` + addr + `/8080 && printf 'GET /hello HTTP/1.0\r\n\r\n' >&3 && cat <&3`
	var out string
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, _ = c.run("timeout", "5", "bash", "-c", get)
		if strings.Contains(out, want) {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("port 8080 at %s answered %q, want %q\n%s", addr, out, want, c.journal("shoal-netd", "shoal-schedd", "shoal-vold"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// pid returns the PID (as this machine numbers it) of the container's
// one process whose command line contains pattern. The container's root
// has no pgrep.
func (c *container) pid(pattern string) string {
	c.t.Helper()
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", c.init))
	if err != nil {
		c.t.Fatal(err)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	var found []string
	for _, p := range procs {
		cmdline, err := os.ReadFile(p + "/cmdline")
		if err != nil || !strings.Contains(string(cmdline), pattern) {
			continue
		}
		if pns, err := os.Readlink(p + "/ns/pid"); err == nil && pns == ns {
			found = append(found, filepath.Base(p))
		}
	}
	if len(found) != 1 {
		c.t.Fatalf("want one process of the container matching %q, got %v", pattern, found)
	}
	return found[0]
}

// nspawnInputs returns what the systemd tests boot: the Debian root
// that make e2e prepares ($SHOAL_NSPAWN_ROOT; the test is skipped
// without it), the project's units and the test image's file.
func nspawnInputs(t *testing.T) (root, units, image string) {
	t.Helper()
	root = os.Getenv(nspawnRootEnv)
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
	return root, units, writeTestImage(t)
}

// installNode installs the units as `make install` does and enables the
// node (systemctl enable --now shoal.target), with statdConf as
// /etc/shoal/statd.toml if it is not empty. The tasks' cgroups go under
// a parent named after the container, which stop removes.
func (c *container) installNode(t *testing.T, statdConf string) {
	t.Helper()
	c.must("sh", "-c", "mkdir -p /etc/shoal && echo 'cgroup_parent = \"/"+c.name+"\"' > /etc/shoal/schedd.toml")
	if statdConf != "" {
		c.must("sh", "-c", "cat > /etc/shoal/statd.toml <<'EOF'\n"+statdConf+"EOF\n")
	}
	c.must("sh", "-c", "cp /opt/shoal/systemd/* /etc/systemd/system/ && systemctl daemon-reload && "+
		"systemctl enable --now shoal.target")
	c.allActive(t)
}

// machine is what tells containers that bootContainer boots apart.
type machine struct {
	name string // the machine's name, also its cgroups' and its tasks' cgroup parent
	zone string // nspawn's --network-zone, a bridge shared with the zone's other machines; "" for loopback only
	addr string // with a zone: the machine's address on it (CIDR)
}

// container is a booted systemd-nspawn container.
type container struct {
	t       *testing.T
	name    string // the machine's name, also the tasks' cgroup parent
	addr    string // its address on its zone (machine.addr without the prefix length)
	nspawn  *exec.Cmd
	console *syncBuffer // its console, with the journal (journald.conf.d)
	init    int         // the container's PID 1, as this machine numbers it
	done    chan struct{}
}

// bootContainer boots root's systemd in a container named m.name, with
// a network of its own (loopback only, or m's zone), with this run's
// binaries in /usr/local/bin, units in
// /opt/shoal/systemd and images (a directory) in /opt/shoal/images; the
// end of t powers it off. root is written to: it is the machine's disk
// (a copy; containerd's overlayfs snapshots could not stack on nspawn's
// --volatile=overlay). runc may use the kernel's keyrings, which nspawn's
// system call filter refuses by default.
func bootContainer(t *testing.T, root, units, images string, m machine) *container {
	t.Helper()
	name := m.name
	// The journal goes to the console too, which the test reads: it is
	// all that is left of the container's log once it powered off.
	journald := t.TempDir()
	if err := os.WriteFile(filepath.Join(journald, "console.conf"), []byte("[Journal]\nForwardToConsole=yes\nMaxLevelConsole=info\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	network := "--private-network"
	if m.zone != "" {
		network = "--network-zone=" + m.zone
	}
	// nspawn puts the container in a cgroup "payload" below its own, in
	// the systemd and unified hierarchies: each container gets a cgroup
	// of its own there (named after it, which stop removes), so that two
	// of them do not share one payload.
	enter := ""
	for _, h := range []string{"systemd", "unified"} {
		dir := filepath.Join("/sys/fs/cgroup", h, name)
		if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
			t.Fatalf("cgroup for the container: %v", err)
		}
		enter += "echo $$ > " + dir + "/cgroup.procs && "
	}
	cmd := exec.Command("sh", "-c", enter+`exec systemd-nspawn "$@"`, "sh",
		"--directory", root, "--boot", "--machine", name,
		"--register=no", "--keep-unit", network, "--console=read-only",
		"--system-call-filter=@keyring",
		"--bind=/dev/fuse", "--bind=/dev/net/tun", "--bind-ro="+binDir+":/usr/local/bin",
		"--bind-ro="+units+":/opt/shoal/systemd", "--bind-ro="+images+":/opt/shoal/images",
		"--bind-ro="+journald+":/etc/systemd/journald.conf.d")
	console := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = console, console
	if err := cmd.Start(); err != nil {
		t.Fatalf("systemd-nspawn: %v", err)
	}
	c := &container{t: t, name: name, addr: strings.Split(m.addr, "/")[0], nspawn: cmd, console: console, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(c.done) }()
	t.Cleanup(func() { c.stop() })
	waitFor(t, 30*time.Second, "the container's PID 1", func() bool {
		c.init = childOf(cmd.Process.Pid)
		return c.init != 0
	})
	if m.zone != "" {
		// nspawn makes the zone's links as the container starts: wait for
		// them rather than race it.
		deadline := time.Now().Add(30 * time.Second)
		for {
			c.init = childOf(cmd.Process.Pid)
			err := c.zoneUp(m)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the container's links on its zone: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
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

// zoneUp brings up m's zone: its bridge and this machine's ends of the
// containers' veths (nspawn makes them and leaves them down, as
// systemd-networkd, which would bring them up, does not run here), and
// the container's end (host0) with m's address, set from here: the root
// has no ip(8). It can be called again.
func (c *container) zoneUp(m machine) error {
	bridge := "vz-" + m.zone
	out, err := exec.Command("ip", "-o", "link", "show", "master", bridge).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip link show master %s: %v: %s", bridge, err, out)
	}
	links := []string{bridge}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(line); len(f) > 1 {
			links = append(links, strings.SplitN(strings.TrimSuffix(f[1], ":"), "@", 2)[0])
		}
	}
	if len(links) == 1 {
		return fmt.Errorf("no veth on %s yet", bridge)
	}
	for _, l := range links {
		if out, err := exec.Command("ip", "link", "set", l, "up").CombinedOutput(); err != nil {
			return fmt.Errorf("ip link set %s up: %v: %s", l, err, out)
		}
	}
	ns := []string{"--target", strconv.Itoa(c.init), "--net", "--", "ip"}
	for _, args := range [][]string{{"addr", "replace", m.addr, "dev", "host0"}, {"link", "set", "host0", "up"}} {
		if out, err := exec.Command("nsenter", append(ns, args...)...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s in the container: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// machineDisk returns a machine's disk: a copy of root in a temporary
// directory, which keeps what the machine wrote from one boot to the next
// (containerd's overlayfs snapshots could not stack on nspawn's
// --volatile=overlay), with writable cgroups (writableCgroups).
func machineDisk(t *testing.T, root string) string {
	t.Helper()
	disk := t.TempDir()
	if out, err := exec.Command("cp", "-a", root+"/.", disk).CombinedOutput(); err != nil {
		t.Fatalf("copy the container's root: %v\n%s", err, out)
	}
	writableCgroups(t, disk)
	return disk
}

// writableCgroups installs and enables, in the machine's root, a unit
// that remounts the cgroup v1 controller hierarchies read-write at every
// boot before containerd and schedd start. On a cgroup v1 host nspawn
// mounts them read-only; a real node's are writable, and runc needs them
// so to make a task's cgroups. Remounted from outside once the machine
// was up, schedd's first start of a task after a reboot could come first
// and fail ("cgroup.procs: read-only file system").
func writableCgroups(t *testing.T, root string) {
	t.Helper()
	unit := `[Unit]
Description=cgroup v1 hierarchies writable, as on a real node (test machine only)
DefaultDependencies=no
Before=sysinit.target containerd.service shoal-schedd.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'for h in /sys/fs/cgroup/*/; do mount -o remount,bind,rw $h; done'

[Install]
WantedBy=sysinit.target
`
	dir := filepath.Join(root, "etc/systemd/system")
	if err := os.MkdirAll(filepath.Join(dir, "sysinit.target.wants"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroups-writable.service"), []byte(unit), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../cgroups-writable.service", filepath.Join(dir, "sysinit.target.wants/cgroups-writable.service")); err != nil {
		t.Fatal(err)
	}
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
		c.t.Fatalf("in the container, %s: %v\n%s\n%s", strings.Join(argv, " "), err, out,
			c.journal("shoal-statd", "shoal-vold", "shoal-netd", "shoal-schedd", "containerd"))
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

// tail returns the console's last n lines.
func (c *container) tail(n int) string {
	lines := strings.Split(c.console.String(), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
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
	case <-time.After(30 * time.Second):
		if c.init != 0 {
			_ = syscall.Kill(c.init, syscall.SIGKILL) // ends every process of its PID namespace
		}
		_ = c.nspawn.Process.Kill()
		<-c.done
	}
	c.removeCgroups()
}

// removeCgroups removes the cgroups the container leaves behind in this
// machine's hierarchies: those of its tasks, under their parent (c.name;
// runc deletes a task's own when the task is removed, not the parent,
// nor those of a task killed with the container), and nspawn's
// "payload", the container's own, which it leaves under this process's
// cgroup when no systemd runs it as a unit.
func (c *container) removeCgroups() {
	var roots []string
	_ = filepath.WalkDir("/sys/fs/cgroup", func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if d.Name() == c.name {
			roots = append(roots, path)
			return filepath.SkipDir
		}
		if strings.Count(strings.TrimPrefix(path, "/sys/fs/cgroup"), "/") >= 4 {
			return filepath.SkipDir // parents are at most a few levels down
		}
		return nil
	})
	own, _ := os.ReadFile("/proc/self/cgroup")
	for _, line := range strings.Split(strings.TrimSpace(string(own)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		switch f[1] {
		case "name=systemd":
			roots = append(roots, filepath.Join("/sys/fs/cgroup/systemd", f[2], "payload"))
		case "":
			roots = append(roots, filepath.Join("/sys/fs/cgroup/unified", f[2], "payload"))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := devcluster.RemoveCgroupTrees(ctx, roots...); err != nil {
		c.t.Errorf("cgroups left behind: %v", err)
	}
}
