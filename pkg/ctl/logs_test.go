package ctl

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/shoal-dev/shoal/pkg/sched"
	schedv1 "github.com/shoal-dev/shoal/proto/shoal/sched/v1"
)

// TaskLogs answers with a line on each stream and records the request.
func (f *fakeSchedd) TaskLogs(req *schedv1.TaskLogsRequest, stream schedv1.Scheduler_TaskLogsServer) error {
	f.mu.Lock()
	f.logRequests = append(f.logRequests, req)
	f.mu.Unlock()
	stream.Send(&schedv1.LogChunk{Task: req.GetTask(), Data: []byte("out\n")})
	return stream.Send(&schedv1.LogChunk{Task: req.GetTask(), Data: []byte("err\n"), Stderr: true})
}

func TestTaskLogsFlags(t *testing.T) {
	dir, fake := startFakeSchedd(t)
	before := time.Now()
	out, errOut, code := ctlRun(t, "--run-dir", dir, "task", "logs", "web.1.x", "--since", "10m", "--until", "2099-01-02", "-t", "--tail", "5")
	if code != 0 || out != "out\n" || errOut != "err\n" {
		t.Fatalf("exit %d, stdout %q, stderr %q; want the task's output on stdout and its errors on stderr", code, out, errOut)
	}
	req := fake.logRequests[0]
	since := req.GetSince().AsTime()
	if since.Before(before.Add(-10*time.Minute-time.Second)) || since.After(time.Now().Add(-10*time.Minute)) {
		t.Errorf("--since 10m asked since %s", since)
	}
	if until := req.GetUntil().AsTime(); until.Year() != 2099 || !req.GetTimestamps() || req.GetTail() != 5 || req.GetTask() != "web.1.x" {
		t.Errorf("request %v", req)
	}
	for _, bad := range [][]string{{"--since", "yesterday"}, {"--until", "-5m"}, {"--since", "1m", "--until", "1h"}, {"--since", "12.3456789012"}} {
		_, errOut, code := ctlRun(t, append([]string{"--run-dir", dir, "task", "logs", "web.1.x"}, bad...)...)
		if code != 2 || !strings.Contains(errOut, strings.TrimPrefix(bad[0], "--")) {
			t.Errorf("%v: exit %d, %q; want a usage error naming the flag", bad, code, errOut)
		}
	}
	if len(fake.logRequests) != 1 {
		t.Errorf("bad flags still asked schedd for logs: %v", fake.logRequests[1:])
	}
}

func TestParseLogTime(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"90s":                            now.Add(-90 * time.Second),
		"2026-12-07T10:00:00Z":           time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC),
		"2026-12-07T10:00:00.5+01:00":    time.Date(2026, 12, 7, 9, 0, 0, 5e8, time.UTC),
		"2026-12-07T10:00":               time.Date(2026, 12, 7, 10, 0, 0, 0, time.Local),
		"2026-12-07":                     time.Date(2026, 12, 7, 0, 0, 0, 0, time.Local),
		"1765100000":                     time.Unix(1765100000, 0),
		"1765100000.25":                  time.Unix(1765100000, 25e7),
		"2026-12-07T10:00:00.123456789Z": time.Date(2026, 12, 7, 10, 0, 0, 123456789, time.UTC),
	} {
		got, err := parseLogTime(in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("parseLogTime(%q) = %s, %v; want %s", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "soon", "-1h", "1.", "2026-13-01", "12:00"} {
		if _, err := parseLogTime(bad, now); err == nil {
			t.Errorf("parseLogTime(%q) accepted", bad)
		}
	}
}

// TestApplyLogOnUpdate: on update, options given replace the service's,
// a driver alone keeps them unless it changes.
func TestApplyLogOnUpdate(t *testing.T) {
	rotated := sched.LogConfig{MaxSize: 1 << 20, MaxFiles: 2}
	for _, tc := range []struct {
		args []string
		want sched.LogConfig
	}{
		{[]string{"--log-opt", "max-file=4"}, sched.LogConfig{MaxFiles: 4}},
		{[]string{"--log-driver", "json-file"}, rotated},
		{[]string{"--log-driver", "none"}, sched.LogConfig{Driver: sched.LogDriverNone}},
	} {
		var f specFlags
		fs := pflag.NewFlagSet("update", pflag.ContinueOnError)
		f.bind(fs, false)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		spec := sched.ServiceSpec{Log: rotated}
		if err := f.applyLog(fs, &spec); err != nil || spec.Log != tc.want {
			t.Errorf("%v on %+v: %+v, %v; want %+v", tc.args, rotated, spec.Log, err, tc.want)
		}
	}
	// And from none back to the node's log.
	var f specFlags
	fs := pflag.NewFlagSet("update", pflag.ContinueOnError)
	f.bind(fs, false)
	fs.Parse([]string{"--log-driver", "local"})
	spec := sched.ServiceSpec{Log: sched.LogConfig{Driver: sched.LogDriverNone}}
	if err := f.applyLog(fs, &spec); err != nil || spec.Log != (sched.LogConfig{}) {
		t.Errorf("--log-driver local on a discarding service: %+v, %v", spec.Log, err)
	}
}
