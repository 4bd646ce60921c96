package tasklog

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/runtime/v2/logging"
)

// loggerEnv makes the test binary shoal-logger (TestMain).
const loggerEnv = "SHOAL_TASKLOG_TEST_LOGGER"

func TestMain(m *testing.M) {
	if os.Getenv(loggerEnv) != "" {
		logging.Run(Logger(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// startLogger starts the logger as containerd's shim does (stdout,
// stderr and the ready pipe on descriptors 3, 4, 5) and waits until it
// is ready; it returns the pipes' write ends.
func startLogger(t *testing.T, args ...string) (cmd *exec.Cmd, stdout, stderr *os.File) {
	t.Helper()
	outR, outW, _ := os.Pipe()
	errR, errW, _ := os.Pipe()
	readyR, readyW, _ := os.Pipe()
	cmd = exec.Command(os.Args[0], args...)
	cmd.Env = []string{loggerEnv + "=1", "CONTAINER_ID=t1", "CONTAINER_NAMESPACE=test"}
	cmd.ExtraFiles = []*os.File{outR, errR, readyW}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	outR.Close()
	errR.Close()
	readyW.Close()
	b := make([]byte, 1)
	if _, err := readyR.Read(b); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	readyR.Close()
	return cmd, outW, errW
}

func TestLoggerProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.log")
	var args []string
	for k, v := range LoggerArgs(path, Limits{MaxSize: 1 << 20, MaxFiles: 2}) {
		args = append(args, k, v) // as the shim passes them: in map order
	}
	cmd, stdout, stderr := startLogger(t, args...)
	io.WriteString(stdout, "hello\n")
	io.WriteString(stderr, "oops\n")
	io.WriteString(stdout, "bye")
	stdout.Close()
	stderr.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("logger: %v", err)
	}
	recs := readAll(t, path, ReadOptions{})
	var got []string
	for _, r := range recs {
		got = append(got, r.Stream+":"+string(r.Content))
	}
	// The two streams are copied concurrently: only each one's order is
	// kept.
	all := strings.Join(got, ",")
	if len(got) != 3 || !strings.Contains(all, "stderr:oops") || strings.Index(all, "stdout:hello") > strings.Index(all, "stdout:bye") {
		t.Fatalf("records %v", got)
	}
}

// TestLoggerThatCannotWriteStillDrains: a logger whose log cannot be
// made reads the task's output to its end (the task would block, or get
// SIGPIPE, otherwise) and then fails.
func TestLoggerThatCannotWriteStillDrains(t *testing.T) {
	cmd, stdout, stderr := startLogger(t, "--path", filepath.Join(t.TempDir(), "missing", "t.log"))
	chunk := strings.Repeat("x", 4096) + "\n"
	for range 64 { // 256 KiB: four times a pipe's buffer
		if _, err := io.WriteString(stdout, chunk); err != nil {
			t.Fatalf("write to the logger's pipe: %v", err)
		}
	}
	stdout.Close()
	stderr.Close()
	if err := cmd.Wait(); err == nil {
		t.Fatal("the logger reported no error for a log it could not create")
	}
}
