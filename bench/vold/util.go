package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
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

// ---- per-process figures ----

// clockTicks is USER_HZ, the unit of /proc/stat and /proc/<pid>/stat.
const clockTicks = 100

// procTicks returns utime+stime of pid (without children), in ticks.
func procTicks(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may contain spaces: fields start after the last ')'.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	// fields[0] is field 3 (state); utime and stime are fields 14 and 15.
	ut, err1 := strconv.ParseUint(fields[11], 10, 64)
	st, err2 := strconv.ParseUint(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad utime/stime", pid)
	}
	return ut + st, nil
}

func rssMiB(pid int) (float64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return kb / 1024, err
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no VmRSS", pid)
}

// ---- background load ----

// cpuAcct counts the CPU time of this benchmark and its cluster, to tell
// it apart from the machine's. With a cpuacct cgroup (v1) or cgroup v2,
// this process moves into a cgroup of its own before the cluster starts,
// so every process it starts (the daemons, restarted ones too) is counted
// there. Otherwise only this process is counted (approximate).
type cpuAcct struct {
	exact bool
	v2    bool
	root  string // the hierarchy's mount point
	dir   string // our cgroup
	orig  string // the cgroup we came from (relative to root)
}

const cgroupPrefix = "shoal-bench-vold-"

func newCPUAcct(name string) *cpuAcct {
	a := &cpuAcct{}
	root, v2 := cpuacctMount()
	if root == "" {
		return a
	}
	a.root, a.v2 = root, v2
	a.orig = ownCgroup(v2)
	// Cgroups of earlier runs killed before they could clean up (rmdir
	// fails on a cgroup in use, so this never touches a live one).
	if old, _ := filepath.Glob(filepath.Join(root, cgroupPrefix+"*")); len(old) > 0 {
		for _, d := range old {
			syscall.Rmdir(d)
		}
	}
	dir := filepath.Join(root, cgroupPrefix+name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		progress("cpu accounting: %v (falling back to this process only)", err)
		return a
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
		progress("cpu accounting: %v (falling back to this process only)", err)
		syscall.Rmdir(dir)
		return a
	}
	a.dir, a.exact = dir, true
	return a
}

// cpuacctMount finds the cpuacct v1 hierarchy, or else the cgroup v2 one.
func cpuacctMount() (string, bool) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", false
	}
	var v2 string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		sep := slices.Index(f, "-")
		if sep < 0 || sep+3 >= len(f) {
			continue
		}
		switch f[sep+1] {
		case "cgroup":
			if slices.Contains(strings.Split(f[sep+3], ","), "cpuacct") {
				return f[4], false
			}
		case "cgroup2":
			v2 = f[4]
		}
	}
	if v2 != "" {
		if _, err := os.Stat(filepath.Join(v2, "cgroup.controllers")); err == nil {
			return v2, true
		}
	}
	return "", false
}

func ownCgroup(v2 bool) string {
	data, _ := os.ReadFile("/proc/self/cgroup")
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		if (v2 && f[0] == "0" && f[1] == "") || (!v2 && slices.Contains(strings.Split(f[1], ","), "cpuacct")) {
			return f[2]
		}
	}
	return "/"
}

// usage returns the CPU time counted in our cgroup.
func (a *cpuAcct) usage() time.Duration {
	if a.v2 {
		data, err := os.ReadFile(filepath.Join(a.dir, "cpu.stat"))
		if err != nil {
			return 0
		}
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return time.Duration(n) * time.Microsecond
			}
		}
		return 0
	}
	data, err := os.ReadFile(filepath.Join(a.dir, "cpuacct.usage"))
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	return time.Duration(n)
}

func (a *cpuAcct) close() {
	if a.dir == "" {
		return
	}
	os.WriteFile(filepath.Join(a.root, a.orig, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0)
	for range 50 {
		if err := syscall.Rmdir(a.dir); err == nil || errors.Is(err, syscall.ENOENT) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	progress("could not remove cgroup %s", a.dir)
}

// loadSnap is the machine's busy CPU time and the part of it that is
// ours.
type loadSnap struct {
	at            time.Time
	machine, ours time.Duration
}

func (a *cpuAcct) take() loadSnap {
	s := loadSnap{at: time.Now()}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line)
		// cpu user nice system idle iowait irq softirq steal guest guest_nice
		for i, v := range f[1:] {
			if i == 3 || i == 4 || i >= 7 {
				continue
			}
			n, _ := strconv.ParseInt(v, 10, 64)
			s.machine += time.Duration(n) * time.Second / clockTicks
		}
	}
	if a.exact {
		s.ours = a.usage()
	} else if t, err := procTicks(os.Getpid()); err == nil {
		s.ours = time.Duration(t) * time.Second / clockTicks
	}
	return s
}

// phaseLoad is a phase's first and last snapshot.
type phaseLoad struct{ a, b loadSnap }

// others returns the CPUs (cores' worth) that other processes used.
func (l phaseLoad) others() float64 {
	secs := l.b.at.Sub(l.a.at).Seconds()
	if secs <= 0 {
		return 0
	}
	busy := (l.b.machine - l.a.machine) - (l.b.ours - l.a.ours)
	return max(busy.Seconds(), 0) / secs
}

// ours returns the CPUs this benchmark and its cluster used.
func (l phaseLoad) ours() float64 {
	secs := l.b.at.Sub(l.a.at).Seconds()
	if secs <= 0 {
		return 0
	}
	return (l.b.ours - l.a.ours).Seconds() / secs
}

func (l phaseLoad) String() string {
	return fmt.Sprintf("this benchmark and its cluster used %.2f CPUs, other processes %.2f", l.ours(), l.others())
}
