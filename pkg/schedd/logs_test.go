package schedd

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/shoal-dev/shoal/pkg/sched"
	"github.com/shoal-dev/shoal/pkg/tasklog"
	schedv1 "github.com/shoal-dev/shoal/proto/shoal/sched/v1"
)

// logsOf runs localLogs and returns what it sent on each stream, and the
// number of chunks.
func logsOf(t *testing.T, n *node, req *schedv1.TaskLogsRequest) (stdout, stderr string, chunks int, err error) {
	t.Helper()
	var out, errs strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = n.localLogs(ctx, req, func(c *schedv1.LogChunk) error {
		chunks++
		if c.GetTask() != req.GetTask() {
			t.Errorf("chunk of task %q, want %q", c.GetTask(), req.GetTask())
		}
		if c.GetStderr() {
			errs.Write(c.GetData())
		} else {
			out.Write(c.GetData())
		}
		return nil
	})
	return out.String(), errs.String(), chunks, err
}

func TestLocalLogs(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "logs"), 0o700)
	n := &node{cfg: &Config{}, local: map[string]*localTask{}}
	n.cfg.StateDir = dir

	// A log of records, as shoal-logger writes it.
	start := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	tick := start
	clock := func() time.Time { tick = tick.Add(time.Second); return tick }
	w, err := tasklog.Create(n.recordLogPath("rec"), tasklog.DefaultLimits, clock)
	if err != nil {
		t.Fatal(err)
	}
	w.Copy(tasklog.Stdout, strings.NewReader("one\n"))
	w.Copy(tasklog.Stderr, strings.NewReader("oops\n"))
	w.Copy(tasklog.Stdout, strings.NewReader(strings.Repeat("y", tasklog.MaxLine)+"z\ntwo\n"))
	w.Close()
	long := strings.Repeat("y", tasklog.MaxLine) + "z\n"

	out, errs, chunks, err := logsOf(t, n, &schedv1.TaskLogsRequest{Task: "rec"})
	if err != nil || out != "one\n"+long+"two\n" || errs != "oops\n" || chunks != 3 {
		t.Fatalf("all: stdout %d bytes, stderr %q, %d chunks, %v; want the output by stream in 3 chunks", len(out), errs, chunks, err)
	}
	out, errs, _, _ = logsOf(t, n, &schedv1.TaskLogsRequest{Task: "rec", Timestamps: true, Tail: 1})
	if out != "2026-12-07T12:00:05.000000000Z two\n" || errs != "" {
		t.Errorf("--tail 1 --timestamps: %q, %q", out, errs)
	}
	// The long line's second record carries no time of its own.
	out, _, _, _ = logsOf(t, n, &schedv1.TaskLogsRequest{Task: "rec", Timestamps: true, Since: timestamppb.New(start.Add(3 * time.Second)), Until: timestamppb.New(start.Add(4 * time.Second))})
	if want := "2026-12-07T12:00:03.000000000Z " + long; out != want {
		t.Errorf("a window around the long line: %d bytes, want %d", len(out), len(want))
	}
	// Following a task that is not (any more) on this node ends at the
	// end of its log.
	if out, _, _, err := logsOf(t, n, &schedv1.TaskLogsRequest{Task: "rec", Follow: true, Since: timestamppb.New(start.Add(5 * time.Second))}); err != nil || out != "two\n" {
		t.Errorf("follow of a finished task: %q, %v", out, err)
	}

	// A raw log, of a task a schedd without shoal-logger started.
	os.WriteFile(n.rawLogPath("raw"), []byte("a\nb\nc\n"), 0o600)
	if out, errs, _, err := logsOf(t, n, &schedv1.TaskLogsRequest{Task: "raw", Tail: 2}); err != nil || out != "b\nc\n" || errs != "" {
		t.Errorf("raw --tail 2: %q, %q, %v", out, errs, err)
	}
	if out, _, _, err := logsOf(t, n, &schedv1.TaskLogsRequest{Task: "raw", Since: timestamppb.New(start)}); err != nil || out != "" {
		t.Errorf("raw --since: %q, %v; want nothing (no line has a time)", out, err)
	}

	// No log: an unknown task is not found, a known one has printed
	// nothing yet.
	if _, _, _, err := logsOf(t, n, &schedv1.TaskLogsRequest{Task: "nope"}); !errdefs.IsNotFound(err) {
		t.Errorf("unknown task: %v, want not found", err)
	}
	discarded := &localTask{}
	discarded.Spec.Log.Driver = sched.LogDriverNone
	n.local["discarded"] = discarded
	if _, _, _, err := logsOf(t, n, &schedv1.TaskLogsRequest{Task: "discarded"}); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "log driver none") {
		t.Errorf("a task whose output is discarded: %v, want failed precondition", err)
	}
	n.local["quiet"] = &localTask{}
	if out, _, _, err := logsOf(t, n, &schedv1.TaskLogsRequest{Task: "quiet"}); err != nil || out != "" {
		t.Errorf("a task without a log yet: %q, %v", out, err)
	}
}
