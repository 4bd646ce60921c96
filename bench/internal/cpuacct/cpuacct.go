// Package cpuacct tells a benchmark's CPU use apart from the rest of the
// machine's, and reads per-process CPU time and memory from /proc. The
// machine here has 2 cores: a figure is only comparable when the other
// processes' share during its phase is known, so every benchmark that
// runs a cluster reports it.
package cpuacct

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ClockTicks is USER_HZ, the unit of /proc/stat and /proc/<pid>/stat; it
// is 100 on every Linux architecture Go supports.
const ClockTicks = 100

// Acct counts the CPU time of this benchmark and everything it starts.
// With a cpuacct cgroup (v1) or cgroup v2, New moves this process into a
// cgroup of its own before the cluster starts, so every process it starts
// (daemons, containerd, shims, runc, restarted ones too) is counted there,
// short-lived ones included. Otherwise only this process and its reaped
// children are counted (approximate: Exact says which).
type Acct struct {
	Exact   bool
	v2      bool
	root    string // the hierarchy's mount point
	dir     string // our cgroup
	orig    string // the cgroup we came from (relative to root)
	parents []string
	logf    func(format string, args ...any)
}

// New makes the cgroup <prefix><name>, removing those of earlier runs
// with the same prefix that were killed before they could (rmdir fails
// on a cgroup in use, so a live one is never touched). logf reports
// problems (progress output).
func New(prefix, name string, logf func(format string, args ...any)) *Acct {
	a := &Acct{logf: logf}
	root, v2 := mount()
	if root == "" {
		return a
	}
	a.root, a.v2 = root, v2
	a.orig = ownCgroup(v2)
	if old, _ := filepath.Glob(filepath.Join(root, prefix+"*")); len(old) > 0 {
		for _, d := range old {
			syscall.Rmdir(d)
		}
	}
	dir := filepath.Join(root, prefix+name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		logf("cpu accounting: %v (falling back to this process only)", err)
		return a
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
		logf("cpu accounting: %v (falling back to this process only)", err)
		syscall.Rmdir(dir)
		return a
	}
	a.dir, a.Exact = dir, true
	return a
}

// AddParents counts the cgroups at these paths (relative to the
// hierarchy's root, e.g. containerd cgroup parents, whose containers run
// outside our cgroup) as ours too. A parent that disappears (its node was
// killed) counts no more from then on.
func (a *Acct) AddParents(rel ...string) {
	if a.root == "" {
		return
	}
	for _, r := range rel {
		a.parents = append(a.parents, filepath.Join(a.root, r))
	}
}

// Close moves this process back and removes the cgroup.
func (a *Acct) Close() {
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
	a.logf("could not remove cgroup %s", a.dir)
}

// Snap is the machine's busy CPU time and the part of it that is ours.
type Snap struct {
	at            time.Time
	machine, ours time.Duration
	parents       []time.Duration // per AddParents cgroup
}

// Take snapshots the machine's and our CPU time.
func (a *Acct) Take() Snap {
	s := Snap{at: time.Now()}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line)
		// cpu user nice system idle iowait irq softirq steal guest guest_nice
		for i, v := range f[1:] {
			if i == 3 || i == 4 || i >= 7 {
				continue
			}
			n, _ := strconv.ParseInt(v, 10, 64)
			s.machine += time.Duration(n) * time.Second / ClockTicks
		}
	}
	if a.Exact {
		s.ours = a.usage(a.dir)
		for _, p := range a.parents {
			s.parents = append(s.parents, a.usage(p))
		}
	} else if t, c, err := procTicks(os.Getpid()); err == nil {
		s.ours = time.Duration(t+c) * time.Second / ClockTicks
	}
	return s
}

// usage returns the CPU time counted in cgroup dir (0 if it is gone).
func (a *Acct) usage(dir string) time.Duration {
	if a.v2 {
		data, err := os.ReadFile(filepath.Join(dir, "cpu.stat"))
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
	data, err := os.ReadFile(filepath.Join(dir, "cpuacct.usage"))
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	return time.Duration(n)
}

// Phase is a phase's first and last snapshot.
type Phase struct{ A, B Snap }

func (p Phase) oursDelta() time.Duration {
	d := p.B.ours - p.A.ours
	for i := range min(len(p.A.parents), len(p.B.parents)) {
		d += max(p.B.parents[i]-p.A.parents[i], 0)
	}
	return d
}

// Others returns the CPUs (cores' worth) other processes used.
func (p Phase) Others() float64 {
	secs := p.B.at.Sub(p.A.at).Seconds()
	if secs <= 0 {
		return 0
	}
	busy := (p.B.machine - p.A.machine) - p.oursDelta()
	return max(busy.Seconds(), 0) / secs
}

// OursTime returns the CPU time this benchmark and what it started used.
func (p Phase) OursTime() time.Duration { return p.oursDelta() }

// Ours returns the CPUs this benchmark and what it started used.
func (p Phase) Ours() float64 {
	secs := p.B.at.Sub(p.A.at).Seconds()
	if secs <= 0 {
		return 0
	}
	return p.oursDelta().Seconds() / secs
}

// ProcTicks returns utime+stime of pid (its own, without children), in
// ClockTicks.
func ProcTicks(pid int) (uint64, error) {
	t, _, err := procTicks(pid)
	return t, err
}

// procTicks returns pid's own utime+stime and its reaped children's.
func procTicks(pid int) (self, children uint64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// The command name may contain spaces: fields start after the last ')'.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 15 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	// fields[0] is field 3 (state): utime, stime, cutime and cstime are
	// fields 14 to 17.
	var v [4]uint64
	for i := range v {
		if v[i], err = strconv.ParseUint(fields[11+i], 10, 64); err != nil {
			return 0, 0, fmt.Errorf("/proc/%d/stat: bad CPU times: %w", pid, err)
		}
	}
	return v[0] + v[1], v[2] + v[3], nil
}

// RSSMiB returns pid's resident set size (VmRSS) in MiB.
func RSSMiB(pid int) (float64, error) {
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

// mount finds the cpuacct v1 hierarchy, or else the cgroup v2 one.
func mount() (string, bool) {
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
