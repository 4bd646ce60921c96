package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shoal-dev/shoal/bench/internal/cpuacct"
)

// ---- cleanup and failure ----

var (
	cleanMu   sync.Mutex
	cleanups  []func()
	onFailure []func()
)

// atCleanup registers f to run at exit (normal, failure or signal), last
// registered first.
func atCleanup(f func()) {
	cleanMu.Lock()
	defer cleanMu.Unlock()
	cleanups = append(cleanups, f)
}

// atFailure registers f to run before the cleanups when the benchmark
// fails.
func atFailure(f func()) {
	cleanMu.Lock()
	defer cleanMu.Unlock()
	onFailure = append(onFailure, f)
}

// runCleanup runs the registered functions once; a concurrent caller
// waits until they are done.
func runCleanup() {
	cleanMu.Lock()
	defer cleanMu.Unlock()
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
	cleanups = nil
}

// interrupted is set on SIGINT, SIGTERM or SIGHUP: what fails then is
// only the benchmark being stopped.
var interrupted atomic.Bool

func check(err error) {
	if err != nil {
		fail("%v", err)
	}
}

func fail(format string, args ...any) {
	cleanMu.Lock()
	fs := onFailure
	onFailure = nil
	cleanMu.Unlock()
	if !interrupted.Load() {
		fmt.Fprintf(os.Stderr, "vold bench: "+format+"\n", args...)
		for _, f := range fs {
			f()
		}
	}
	runCleanup()
	os.Exit(1)
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "vold bench: "+format+"\n", args...)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ---- statistics and formatting ----

// perSecond is n over d (0 for no time).
func perSecond(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// pctl is the nearest-rank percentile of ds (0 for none).
func pctl(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

// slowShare is the share of the time spent in the writes ds that took
// longer than over: the sum of those latencies over the sum of all.
func slowShare(ds []time.Duration, over time.Duration) float64 {
	var all, slow time.Duration
	for _, d := range ds {
		all += d
		if d > over {
			slow += d
		}
	}
	if all == 0 {
		return 0
	}
	return float64(slow) / float64(all)
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

func medianDur(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

func dur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= 10*time.Millisecond:
		return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
	case d >= time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
	}
}

func durList(ds []time.Duration) string {
	var s []string
	for _, d := range ds {
		s = append(s, dur(d))
	}
	return strings.Join(s, ", ")
}

func metStr(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

func orDash(s string) string {
	if s == "" {
		return "–"
	}
	return s
}

// machine describes the machine: CPUs, RAM, kernel.
func machine() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	mem := "?"
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
				kb, _ := strconv.ParseFloat(f[1], 64)
				mem = fmt.Sprintf("%.1f GiB RAM", kb/1048576)
			}
		}
	}
	kernel := "?"
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = strings.TrimSpace(string(b))
	}
	return fmt.Sprintf("%d CPUs (%s), %s, Linux %s %s, %s", runtime.NumCPU(), model, mem, kernel, runtime.GOARCH, runtime.Version())
}

// fsOf names the filesystem holding dir (type and device) as
// /proc/self/mountinfo says.
func fsOf(dir string) string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "?"
	}
	best, out := -1, "?"
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		sep := slices.Index(f, "-")
		if sep < 5 || sep+2 >= len(f) {
			continue
		}
		mp := f[4]
		if (dir == mp || strings.HasPrefix(dir, strings.TrimSuffix(mp, "/")+"/")) && len(mp) > best {
			best, out = len(mp), f[sep+1]+" on "+f[sep+2]
		}
	}
	return out
}

// ---- background load ----

// phaseLoad is a phase's CPU use: this benchmark's and its cluster's, and
// the rest of the machine's.
type phaseLoad struct{ cpuacct.Phase }

func (l phaseLoad) String() string {
	return fmt.Sprintf("this benchmark and its cluster used %.2f CPUs, other processes %.2f", l.Ours(), l.Others())
}
