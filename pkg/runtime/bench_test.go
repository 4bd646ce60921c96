package runtime_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/runtime"
	"github.com/shoal-dev/shoal/pkg/runtime/runtimetest"
	"github.com/shoal-dev/shoal/pkg/tasklog"
)

// BenchmarkContainerdRun measures Run (create the container and its task
// and start it) of a long-running task against a real containerd, and
// Remove separately, for a task whose output is discarded, appended by
// the shim to a file, and written by shoal-logger (the shim starts it
// and waits until it is ready, and stops it at Remove); it reports the
// logger's resident memory. As root:
//
//	go test ./pkg/runtime -run '^$' -bench ContainerdRun -benchtime 20x
func BenchmarkContainerdRun(b *testing.B) {
	rt := benchRuntime(b)
	ctx := context.Background()
	dir := b.TempDir()
	logger := buildLogger(b, dir)
	for _, mode := range []string{"discarded", "file", "logger"} {
		b.Run(mode, func(b *testing.B) {
			var run, remove time.Duration
			var rssKiB, rssN int64
			for i := 0; b.Loop(); i++ {
				id := fmt.Sprintf("bench-%s-%d", mode, i)
				spec := runtime.TaskSpec{ID: id, Image: "local/busybox:latest", Args: []string{"sh", "-c", "echo started; exec sleep 1000000"}}
				switch mode {
				case "file":
					spec.LogPath = filepath.Join(dir, id+".log")
				case "logger":
					spec.LogPath, spec.LogBinary = filepath.Join(dir, id+".log"), logger
					spec.LogArgs = tasklog.LoggerArgs(spec.LogPath, tasklog.DefaultLimits)
				}
				t0 := time.Now()
				if err := rt.Run(ctx, spec); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if mode == "logger" {
					if kib := loggerRSS(spec.LogPath); kib > 0 {
						rssKiB += kib
						rssN++
					}
				}
				t2 := time.Now()
				if err := rt.Remove(ctx, id); err != nil {
					b.Fatal(err)
				}
				run += t1.Sub(t0)
				remove += time.Since(t2)
			}
			b.ReportMetric(float64(run.Microseconds())/1000/float64(b.N), "run-ms/op")
			b.ReportMetric(float64(remove.Microseconds())/1000/float64(b.N), "remove-ms/op")
			if rssN > 0 {
				b.ReportMetric(float64(rssKiB)/float64(rssN), "logger-rss-KiB")
			}
		})
	}
}

// loggerRSS is the VmRSS in KiB of the logger writing path, 0 if not
// found.
func loggerRSS(path string) int64 {
	out, err := exec.Command("pgrep", "-f", "--", path).Output()
	if err != nil {
		return 0
	}
	pid := strings.Fields(string(out))[0]
	status, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kib, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kib
		}
	}
	return 0
}

// BenchmarkContainerdStats is what a sample of one task costs (containerd's
// metrics call through the shim, and the task's /proc/PID/net/dev), for
// `task stats`, which takes one a task a second per watcher. Baseline in
// the same run: List, which schedd calls to re-adopt its tasks (one
// containerd call for the containers, one a task for its state).
func BenchmarkContainerdStats(b *testing.B) {
	rt := benchRuntime(b)
	ctx := context.Background()
	if err := rt.Run(ctx, runtime.TaskSpec{ID: "bench-stats", Image: "local/busybox:latest", Args: []string{"sleep", "1000000"}, MemoryBytes: 64 << 20}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { rt.Remove(context.Background(), "bench-stats") })
	b.Run("stats", func(b *testing.B) {
		for b.Loop() {
			if _, err := rt.Stats(ctx, "bench-stats"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("list-baseline", func(b *testing.B) {
		for b.Loop() {
			if _, err := rt.List(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// benchRuntime is a runtime on a private containerd holding the test
// images.
func benchRuntime(b *testing.B) *runtime.Containerd {
	rt := runtimetest.Start(b).Runtime(b, nil)
	oci, _, _, _ := testImages(b)
	if _, err := rt.Import(context.Background(), bytes.NewReader(oci)); err != nil {
		b.Fatal(err)
	}
	return rt
}
