package taskinit

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The test binary runs as shoal-init when this is set: the processes
// under test are real ones, signalled and reaped by the kernel.
const asInit = "SHOAL_TASKINIT_TEST_AS_INIT"

func TestMain(m *testing.M) {
	if os.Getenv(asInit) != "" {
		os.Exit(Run(os.Args[1:], os.Stderr))
	}
	os.Exit(m.Run())
}

// start runs the test binary as init over args.
func start(t *testing.T, args ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), asInit+"=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, &out
}

func exitCode(t *testing.T, cmd *exec.Cmd) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
		return cmd.ProcessState.ExitCode()
	case <-time.After(20 * time.Second):
		t.Fatal("init did not exit")
		return -1
	}
}

// TestForwardsSignals: SIGTERM reaches the child, which a PID 1 without
// a handler would not get (the kernel drops it); init exits as the child.
func TestForwardsSignals(t *testing.T) {
	cmd, out := start(t, "sleep", "100")
	time.Sleep(200 * time.Millisecond)
	cmd.Process.Signal(syscall.SIGTERM)
	if code := exitCode(t, cmd); code != 128+int(syscall.SIGTERM) {
		t.Errorf("sleep after SIGTERM: exit %d, %q; want %d", code, out, 128+int(syscall.SIGTERM))
	}
	cmd, out = start(t, "sh", "-c", "trap 'exit 7' TERM; while :; do sleep 0.05; done")
	time.Sleep(200 * time.Millisecond)
	cmd.Process.Signal(syscall.SIGTERM)
	if code := exitCode(t, cmd); code != 7 {
		t.Errorf("a child that traps SIGTERM: exit %d, %q; want 7", code, out)
	}
}

// TestReapsOrphans: a grandchild whose parent exited is re-parented to
// init, and once it ends it is reaped rather than left a zombie.
func TestReapsOrphans(t *testing.T) {
	script := `sh -c 'sleep 0.1 & echo $!' > "$0"; sleep 1; grep '^State' /proc/$(cat "$0")/status || echo reaped`
	cmd, out := start(t, "sh", "-c", script, t.TempDir()+"/pid")
	if code := exitCode(t, cmd); code != 0 || !strings.Contains(out.String(), "reaped") {
		t.Errorf("exit %d, %q; want the orphan reaped", code, out)
	}
}

func TestMissingCommand(t *testing.T) {
	cmd, out := start(t, "no-such-command-here")
	if code := exitCode(t, cmd); code != 127 || !strings.Contains(out.String(), "command not found") {
		t.Errorf("exit %d, %q", code, out)
	}
	cmd, out = start(t, "sh", "-c", "exit 3")
	if code := exitCode(t, cmd); code != 3 {
		t.Errorf("exit %d, %q; want 3", code, out)
	}
}
