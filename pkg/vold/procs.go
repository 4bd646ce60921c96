package vold

import (
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
)

// ownProcess is set by Main: only the shoal-vold binary sets the Go
// scheduler's processor count, never a test that runs vold in its process.
var ownProcess bool

// maxProcs is the GOMAXPROCS vold runs with for the configured value
// (0: automatic) on a machine of cpus CPUs, and whether to set it at all.
//
// Why fewer processors than CPUs: vold's work is one Raft host loop and
// short request handlers that hand each other messages, so a second
// processor mostly buys wake-ups — an idle processor's thread woken to
// spin for the goroutine just readied, and futex and nanosleep calls —
// while statd, schedd, netd and the workloads want the same CPUs. On the
// project's 2-CPU VMs one processor cut the CPU of a 4 KiB synchronous
// write through a volume by 13–15% and raised its rate by 4–14%, and the
// CPU of sequential writes by 9–16% (docs/VOLUMES.md). Syscalls (fdatasync, socket and FUSE I/O) still run
// in parallel: the runtime hands a processor blocked in one to another
// thread.
func maxProcs(configured, cpus int, env string) (int, bool) {
	switch {
	case configured > 0:
		return configured, true
	case env != "":
		return 0, false
	default:
		return max(1, cpus/4), true
	}
}

func applyMaxProcs(configured int) int {
	if !ownProcess {
		return runtime.GOMAXPROCS(0)
	}
	if n, ok := maxProcs(configured, runtime.NumCPU(), os.Getenv("GOMAXPROCS")); ok {
		runtime.GOMAXPROCS(n)
	}
	return runtime.GOMAXPROCS(0)
}

// hugePremap is the heap address space mapped ahead when huge pages are
// advised (hugeheap.Enable): it is never touched unless used, and spares
// a fresh volume's first writes the small pages of heap growth that the
// next collection has not advised yet.
const hugePremap = 256 << 20

// heapReserve is the bytes of heap vold reserves (hugeheap.Reserve) for
// the configured MiB (-1: automatic) on a machine of memTotal bytes (0:
// unknown; memAvailable). Automatic is 1 GiB, at most a sixteenth of
// the memory. On
// the project's VMs, alternating binaries in bench/vold (2 runs each, 3
// × 64 MiB sequential rounds per mount), sequential writes into a fresh
// volume went from 72.6 / 83.3 to 129.3 / 178.4 MB/s through the leader's
// mount at 20 / 18 -> 10 / 7.5 ms of CPU per MiB, and from 70.5 / 79.2 to
// 72.2 / 111.2 MB/s through a follower's (docs/VOLUMES.md); a 512 MiB
// reserve ran out during the follower's rounds, which allocate twice
// (the proposal, then the leader's append of it).
func heapReserve(configuredMiB int, memTotal int64) int {
	if configuredMiB >= 0 {
		return configuredMiB << 20
	}
	const auto = 1 << 30
	if memTotal <= 0 {
		return 0
	}
	return int(min(auto, memTotal/16))
}

// memTotal reads MemTotal from /proc/meminfo (0 if it cannot).
func memTotal() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

// memAvailable is the memory vold may use as far as it can tell: the
// machine's, or its memory cgroup's limit when that is lower (a unit's
// MemoryMax=), so that an automatic reserve never populates a cgroup
// into its OOM killer.
func memAvailable() int64 {
	mem := memTotal()
	if b, err := os.ReadFile("/proc/self/cgroup"); err == nil {
		if lim := cgroupMemLimit(string(b), os.ReadFile); lim > 0 && (mem == 0 || lim < mem) {
			mem = lim
		}
	}
	return mem
}

// cgroupMemLimit returns the memory limit of the cgroup that selfCgroup
// (/proc/self/cgroup) names, cgroup v2 or v1, or 0 when there is none
// or it cannot be read. read reads a file.
func cgroupMemLimit(selfCgroup string, read func(string) ([]byte, error)) int64 {
	for _, line := range strings.Split(selfCgroup, "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		var path string
		switch {
		case f[0] == "0" && f[1] == "":
			path = "/sys/fs/cgroup" + f[2] + "/memory.max"
		case slices.Contains(strings.Split(f[1], ","), "memory"):
			path = "/sys/fs/cgroup/memory" + f[2] + "/memory.limit_in_bytes"
		default:
			continue
		}
		b, err := read(path)
		if err != nil {
			continue
		}
		v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil || v <= 0 || v >= 1<<62 {
			continue // "max", or v1's page-rounded "unlimited"
		}
		return v
	}
	return 0
}
