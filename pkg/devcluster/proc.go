package devcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/shoal-dev/shoal/pkg/daemon"
	"github.com/shoal-dev/shoal/pkg/rpc"
)

// procDef is one process of a node with its placeholders expanded.
type procDef struct {
	name        string
	path        string
	args        []string
	env         []string
	readySocket string
	readyHealth bool
}

// procDefs returns node i's processes in start order: extras, then
// daemons.
func (c *Cluster) procDefs(i int) []procDef {
	var out []procDef
	for _, p := range c.spec.Extra {
		r := c.expander(i, p.Name)
		out = append(out, procDef{
			name:        p.Name,
			path:        p.Path,
			args:        expandAll(r, p.Args),
			env:         expandAll(r, p.Env),
			readySocket: r.Replace(p.ReadySocket),
			readyHealth: p.ReadyHealth,
		})
	}
	for idx, d := range c.spec.Daemons {
		port, ok := metricsPorts[d]
		if !ok {
			port = 9470 + idx
		}
		args := []string{
			"--state-dir", c.StateDir(i, d),
			"--run-dir", c.RunDir(i),
			"--metrics-addr", "127.0.0.1:" + strconv.Itoa(port),
			"--config", "",
		}
		args = append(args, expandAll(c.expander(i, d), c.spec.Args[d])...)
		out = append(out, procDef{
			name:        d,
			path:        filepath.Join(c.spec.BinDir, "shoal-"+d),
			args:        args,
			readySocket: filepath.Join(c.RunDir(i), d+".sock"),
			readyHealth: true,
		})
	}
	return out
}

// procDef returns node i's process called name, or an error naming the
// processes there are.
func (c *Cluster) procDef(i int, name string) (procDef, error) {
	for _, p := range c.procDefs(i) {
		if p.name == name {
			return p, nil
		}
	}
	return procDef{}, invalidf("unknown daemon %q: cluster %s runs %s", name, c.spec.Name, strings.Join(c.Processes(), ", "))
}

// lookPath resolves an executable: absolute paths as they are, names with
// a slash relative to BinDir, bare names in BinDir first, then $PATH.
func (c *Cluster) lookPath(name string) (string, error) {
	if filepath.IsAbs(name) || strings.Contains(name, "/") {
		p := name
		if !filepath.IsAbs(p) {
			p = filepath.Join(c.spec.BinDir, name)
		}
		if !isExecutable(p) {
			return "", fmt.Errorf("%s: no executable there", p)
		}
		return p, nil
	}
	if p := filepath.Join(c.spec.BinDir, name); isExecutable(p) {
		return p, nil
	}
	if lp, err := exec.LookPath(name); err == nil {
		return lp, nil
	}
	return "", fmt.Errorf("%s: not found in %s or $PATH", name, c.spec.BinDir)
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// dropEnv lists variables a node's processes must not inherit besides
// systemd's (daemon.ChildEnv): they belong to whoever started us
// (journald) or are set per node.
var dropEnv = []string{"SHOAL_RUN_DIR", "JOURNAL_STREAM", "PATH"}

// env returns the environment of a command on node i: ours, with BinDir
// first in PATH and SHOAL_RUN_DIR set to the node's run dir, plus
// Spec.Env and extra.
func (c *Cluster) env(i int, extra ...string) []string {
	out := daemon.ChildEnv(os.Environ(), dropEnv...)
	path := c.spec.BinDir
	if p := os.Getenv("PATH"); p != "" {
		path += ":" + p
	}
	out = append(out, "PATH="+path, "SHOAL_RUN_DIR="+c.RunDir(i))
	out = append(out, expandAll(c.expander(i, ""), c.spec.Env)...)
	return append(out, extra...)
}

func (c *Cluster) pidPath(i int, name string) string {
	return filepath.Join(c.RunDir(i), name+".pid")
}

// startProc starts process p of node i unless it runs, and waits until it
// is ready. It returns the pid.
func (c *Cluster) startProc(ctx context.Context, i int, p procDef) (int, error) {
	if pid, ok := c.running(i, p.name); ok {
		return pid, nil
	}
	if !netnsExists(c.Netns(i)) {
		return 0, fmt.Errorf("node %d: network namespace %s does not exist", i, c.Netns(i))
	}
	for _, d := range []string{filepath.Join(c.NodeDir(i), "logs"), c.RunDir(i)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return 0, err
		}
	}
	path, err := c.lookPath(p.path)
	if err != nil {
		return 0, fmt.Errorf("node %d: %s: %w", i, p.name, err)
	}
	logPath := c.LogPath(i, p.name)
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return 0, err
	}
	fmt.Fprintf(logf, "--- devcluster %s: node %d: starting %s\n", time.Now().Format(time.RFC3339Nano), i, quoteArgs(append([]string{path}, p.args...)))
	cmd := exec.Command(path, p.args...)
	cmd.Env = c.env(i, p.env...)
	cmd.Dir = c.NodeDir(i)
	cmd.Stdout, cmd.Stderr = logf, logf // stdin is /dev/null
	// A session of its own: no terminal signals, and it outlives us.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = inNetns(c.NetnsPath(i), cmd.Start)
	logf.Close()
	if err != nil {
		return 0, fmt.Errorf("node %d: start %s: %w", i, p.name, err)
	}
	pid := cmd.Process.Pid
	start, _ := procStart(pid)
	// Reap it should it die while we live; once we exit, init adopts it.
	go cmd.Wait()
	if err := os.WriteFile(c.pidPath(i, p.name), []byte(fmt.Sprintf("%d %d\n", pid, start)), 0o644); err != nil {
		return pid, err
	}
	if err := c.waitReady(ctx, i, p, pid, start); err != nil {
		return pid, err
	}
	return pid, nil
}

// waitReady waits until p answers on its ready socket, failing early if
// it exits.
func (c *Cluster) waitReady(ctx context.Context, i int, p procDef, pid int, start uint64) error {
	deadline := time.Now().Add(c.spec.StartTimeout)
	for {
		if !alive(pid, start) {
			return fmt.Errorf("node %d: %s exited during start-up; %s", i, p.name, logTail(c.LogPath(i, p.name)))
		}
		if p.readySocket == "" || probe(ctx, p.readySocket, p.readyHealth) {
			return nil
		}
		if time.Now().After(deadline) {
			what := "accept connections"
			if p.readyHealth {
				what = "serve health SERVING"
			}
			return fmt.Errorf("node %d: %s (pid %d) did not %s on %s within %s; %s", i, p.name, pid, what, p.readySocket, c.spec.StartTimeout, logTail(c.LogPath(i, p.name)))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node %d: wait for %s: %w", i, p.name, ctx.Err())
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// probe reports whether the Unix socket at path accepts connections and,
// with health, answers grpc.health.v1 SERVING.
func probe(ctx context.Context, path string, health bool) bool {
	conn, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return false
	}
	conn.Close()
	if !health {
		return true
	}
	cc, err := grpc.NewClient("passthrough:///devcluster",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(rpc.DialUnix(path)))
	if err != nil {
		return false
	}
	defer cc.Close()
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(cc).Check(cctx, &healthpb.HealthCheckRequest{})
	return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
}

// running returns the pid of node i's process name if its pid file names
// a live process.
func (c *Cluster) running(i int, name string) (int, bool) {
	pid, start, err := readPidFile(c.pidPath(i, name))
	if err != nil || !alive(pid, start) {
		return 0, false
	}
	return pid, true
}

func readPidFile(path string) (pid int, start uint64, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, err
	}
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return 0, 0, fmt.Errorf("%s: empty", path)
	}
	if pid, err = strconv.Atoi(f[0]); err != nil {
		return 0, 0, fmt.Errorf("%s: %w", path, err)
	}
	if len(f) > 1 {
		start, _ = strconv.ParseUint(f[1], 10, 64)
	}
	return pid, start, nil
}

// procStat returns the state letter and start time (in clock ticks since
// boot) of pid from /proc/<pid>/stat.
func procStat(pid int) (state byte, start uint64, err error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// The command name is in parentheses and may hold anything: fields
	// start after the last ')'.
	j := bytes.LastIndexByte(data, ')')
	if j < 0 {
		return 0, 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	f := strings.Fields(string(data[j+1:]))
	if len(f) < 20 {
		return 0, 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	return f[0][0], start, err
}

func procStart(pid int) (uint64, error) {
	_, start, err := procStat(pid)
	return start, err
}

// alive reports whether pid is a live (not zombie) process started at
// start (0: any).
func alive(pid int, start uint64) bool {
	if pid <= 0 {
		return false
	}
	state, s, err := procStat(pid)
	if err != nil || state == 'X' {
		return false
	}
	if start != 0 && s != start {
		return false
	}
	if state == 'Z' {
		// NB: a multi-threaded process's leader turns zombie as soon as it
		// exits, while its other threads may still be exiting and holding
		// its files (a state dir lock, a listening socket). It is gone only
		// when the leader is the last task left.
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		return err == nil && len(tasks) > 1
	}
	return true
}

// killWait sends SIGKILL to pid (if it is still the process started at
// start) and waits until it is gone.
func killWait(ctx context.Context, pid int, start uint64) error {
	return signalWait(ctx, pid, start, unix.SIGKILL, 10*time.Second)
}

// signalWait sends sig to pid (if it is still the process that started
// at start) and waits up to wait for it to exit.
func signalWait(ctx context.Context, pid int, start uint64, sig unix.Signal, wait time.Duration) error {
	if !alive(pid, start) {
		return nil
	}
	if err := unix.Kill(pid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("kill %d: %w", pid, err)
	}
	deadline := time.Now().Add(wait)
	for alive(pid, start) {
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d did not exit within %v of %v", pid, wait, sig)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}

// killProc kills node i's process name and removes its pid file.
func (c *Cluster) killProc(ctx context.Context, i int, name string) error {
	path := c.pidPath(i, name)
	pid, start, err := readPidFile(path)
	if err != nil {
		return nil // never started, or already killed
	}
	if err := killWait(ctx, pid, start); err != nil {
		return fmt.Errorf("node %d: %s: %w", i, name, err)
	}
	os.Remove(path)
	return nil
}

// stopProc stops node i's process name as a service manager would: SIGTERM,
// then SIGKILL if it has not exited within grace.
func (c *Cluster) stopProc(ctx context.Context, i int, name string, grace time.Duration) error {
	path := c.pidPath(i, name)
	pid, start, err := readPidFile(path)
	if err != nil {
		return nil // never started, or already gone
	}
	if err := signalWait(ctx, pid, start, unix.SIGTERM, grace); err != nil {
		c.logf("node %d: %s: %v; killing it", i, name, err)
		if err := killWait(ctx, pid, start); err != nil {
			return fmt.Errorf("node %d: %s: %w", i, name, err)
		}
	}
	os.Remove(path)
	return nil
}

// killNode kills every process of node i: those it started and anything
// else in its network namespace.
func (c *Cluster) killNode(ctx context.Context, i int) error {
	var errs []error
	for _, p := range c.procDefs(i) {
		if err := c.killProc(ctx, i, p.name); err != nil {
			errs = append(errs, err)
		}
	}
	if err := killNetns(ctx, c.NetnsPath(i)); err != nil {
		errs = append(errs, fmt.Errorf("node %d: %w", i, err))
	}
	// Containers run under containerd's shims, outside the node's netns
	// unless given one: a node that dies takes them with it.
	if c.HasContainerd() {
		if err := KillContainers(ctx, c.Containerd(i)); err != nil {
			errs = append(errs, fmt.Errorf("node %d: %w", i, err))
		}
	}
	c.removeDeadHolderSocket(i)
	return errors.Join(errs...)
}

// killNetns kills every process in the namespace pinned at path, in
// rounds, since a dying process's parent may still fork.
func killNetns(ctx context.Context, path string) error {
	if hostNamespace(path) {
		return fmt.Errorf("%s pins a namespace of the host: refusing to kill its processes", path)
	}
	for round := 0; round < 10; round++ {
		pids, err := nsPids(path)
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			unix.Kill(pid, unix.SIGKILL)
		}
		for _, pid := range pids {
			if err := killWait(ctx, pid, 0); err != nil {
				return err
			}
		}
	}
	return fmt.Errorf("processes keep appearing in %s", path)
}

// hostNamespace reports whether path pins a namespace of this process or
// of init, whose processes are never the cluster's to kill.
func hostNamespace(path string) bool {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return false
	}
	for _, proc := range []string{"self", "1"} {
		for _, kind := range []string{"net", "mnt", "pid", "uts", "ipc", "user", "cgroup"} {
			var h unix.Stat_t
			if unix.Stat("/proc/"+proc+"/ns/"+kind, &h) == nil && h.Dev == st.Dev && h.Ino == st.Ino {
				return true
			}
		}
	}
	return false
}

// logTail returns the end of a log file for error messages.
func logTail(path string) string {
	const tailBytes = 4096
	f, err := os.Open(path)
	if err != nil {
		return "no log at " + path
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "log " + path
	}
	off := max(0, fi.Size()-tailBytes)
	buf := make([]byte, fi.Size()-off)
	n, _ := f.ReadAt(buf, off)
	lines := strings.Split(strings.TrimRight(string(buf[:n]), "\n"), "\n")
	if off > 0 && len(lines) > 1 {
		lines = lines[1:] // a partial first line
	}
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return fmt.Sprintf("log %s ends:\n    %s", path, strings.Join(lines, "\n    "))
}

// quoteArgs renders argv for a log line, quoting what needs it.
func quoteArgs(argv []string) string {
	out := make([]string, len(argv))
	for i, a := range argv {
		if a == "" || strings.ContainsAny(a, " \t\n'\"\\$") {
			a = strconv.Quote(a)
		}
		out[i] = a
	}
	return strings.Join(out, " ")
}
