package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/shoal-dev/shoal/pkg/client"
	"github.com/shoal-dev/shoal/pkg/testimage"
)

var binDir string

func TestMain(m *testing.M) {
	if dir := os.Getenv(k9WriterEnv); dir != "" {
		os.Exit(k9Writer(dir))
	}
	binDir = os.Getenv("SHOAL_BIN_DIR")
	cleanup := func() {}
	if binDir == "" {
		dir, err := os.MkdirTemp("", "shoal-e2e-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		cleanup = func() { os.RemoveAll(dir) }
		for _, d := range []string{"statd", "schedd", "netd", "vold", "logger", "ctl"} {
			out := filepath.Join(dir, "shoal-"+d)
			if d == "ctl" {
				out = filepath.Join(dir, "shoalctl")
			}
			cmd := exec.Command("go", "build", "-o", out, "github.com/shoal-dev/shoal/cmd/"+d)
			if d == "vold" {
				cmd.Env = append(os.Environ(), "CGO_ENABLED=0") // as the Makefile builds it
			}
			cmd.Stderr = os.Stderr
			if err := cmd.Run(); err != nil {
				fmt.Fprintln(os.Stderr, "build", d, err)
				os.Exit(1)
			}
		}
		binDir = dir
	}
	code := m.Run()
	cleanup()
	os.Exit(code)
}

func bin(name string) string { return filepath.Join(binDir, name) }

// writeTestImage writes local/busybox:latest as an OCI archive in a
// temporary directory of t and returns its path, for `image load`.
func writeTestImage(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "busybox.tar")
	if _, err := testimage.WriteFile(path, "oci", testimage.Default()); err != nil {
		t.Fatal(err)
	}
	return path
}

// node is one node's directories; tests keep paths short because Unix
// socket paths are limited to 108 bytes.
type node struct {
	t        *testing.T
	root     string
	stateDir string
	runDir   string
}

func newNode(t *testing.T) *node {
	t.Helper()
	root, err := os.MkdirTemp("/tmp", "se2e-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	return &node{t: t, root: root, stateDir: filepath.Join(root, "state"), runDir: filepath.Join(root, "run")}
}

// proc is a running daemon.
type proc struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	exited chan struct{} // closed when the process has been waited for
	err    error         // exit error, valid after exited is closed
}

// syncBuffer is a bytes.Buffer safe for the writer goroutine of exec and a
// reading test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start runs a daemon of the node and waits until its socket serves health.
func (n *node) start(daemon string, extra ...string) *proc {
	n.t.Helper()
	p := n.spawn(daemon, nil, extra...)
	n.waitHealthy(daemon, p)
	return p
}

func (n *node) spawn(daemon string, env []string, extra ...string) *proc {
	n.t.Helper()
	config := filepath.Join(n.root, daemon+".toml")
	if _, err := os.Stat(config); err != nil {
		config = ""
	}
	args := append([]string{
		"--state-dir", filepath.Join(n.stateDir, daemon),
		"--run-dir", n.runDir,
		"--metrics-addr", "",
		"--config", config,
	}, extra...)
	cmd := exec.Command(bin("shoal-"+daemon), args...)
	p := &proc{cmd: cmd, stderr: &syncBuffer{}, exited: make(chan struct{})}
	cmd.Stderr = p.stderr
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Start(); err != nil {
		n.t.Fatalf("start %s: %v", daemon, err)
	}
	go func() { p.err = cmd.Wait(); close(p.exited) }()
	n.t.Cleanup(func() { p.kill() })
	return p
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *proc) kill() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// stop sends SIGTERM and returns the exit error.
func (p *proc) stop(t *testing.T) error {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return p.err
	case <-time.After(15 * time.Second):
		t.Fatalf("daemon did not exit on SIGTERM; stderr:\n%s", p.stderr)
		return nil
	}
}

func (n *node) waitHealthy(daemon string, p *proc) {
	n.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-p.exited:
			n.t.Fatalf("%s exited early (%v); stderr:\n%s", daemon, p.err, p.stderr)
		default:
		}
		conn, err := client.Dial(n.runDir, daemon, client.Retry{Attempts: 1})
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
			cancel()
			conn.Close()
			if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	n.t.Fatalf("%s not healthy within 20s; stderr:\n%s", daemon, p.stderr)
}

func (n *node) statd() *client.Statd {
	n.t.Helper()
	c, err := client.NewStatd(n.runDir, client.Retry{Attempts: 50, Max: 200 * time.Millisecond})
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { c.Close() })
	return c
}

// ctl runs shoalctl against the node and returns stdout, stderr and the
// exit code.
func (n *node) ctl(args ...string) (string, string, int) {
	n.t.Helper()
	cmd := exec.Command(bin("shoalctl"), args...)
	cmd.Env = append(os.Environ(), "SHOAL_RUN_DIR="+n.runDir)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		n.t.Fatalf("run shoalctl: %v", err)
	}
	return out.String(), errb.String(), code
}

// follow starts a long-running shoalctl against the node (a watch) and
// returns its growing stdout; it is killed when the test ends.
func (n *node) follow(args ...string) *syncBuffer {
	n.t.Helper()
	cmd := exec.Command(bin("shoalctl"), args...)
	cmd.Env = append(os.Environ(), "SHOAL_RUN_DIR="+n.runDir)
	out := &syncBuffer{}
	cmd.Stdout = out
	if err := cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return out
}

func (n *node) mustCtl(args ...string) string {
	n.t.Helper()
	out, errOut, code := n.ctl(args...)
	if code != 0 {
		n.t.Fatalf("shoalctl %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}
