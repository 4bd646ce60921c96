package vold

import (
	"os"
	"runtime"
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
// CPU of sequential writes by 9–16% (docs/VOLUMES-PERFORMANCE.md).
// Syscalls (fdatasync, socket and FUSE I/O) still run in parallel: the
// runtime hands a processor blocked in one to another thread.
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
// the configured MiB (-1: automatic) with mem bytes of memory (0:
// unknown; meminfo.Available, so that an automatic reserve never
// populates a memory cgroup into its OOM killer). Automatic is 1 GiB, at
// most a sixteenth of the memory. On the project's VMs, alternating
// binaries in bench/vold (2 runs each, 3 × 64 MiB sequential rounds per
// mount), sequential writes into a fresh volume went from 72.6 / 83.3 to
// 129.3 / 178.4 MB/s through the leader's mount at 20 / 18 -> 10 / 7.5 ms
// of CPU per MiB, and from 70.5 / 79.2 to 72.2 / 111.2 MB/s through a
// follower's (docs/VOLUMES-PERFORMANCE.md); a 512 MiB reserve ran out
// during the follower's rounds, which allocate twice (the proposal, then
// the leader's append of it).
func heapReserve(configuredMiB int, mem int64) int {
	if configuredMiB >= 0 {
		return configuredMiB << 20
	}
	const auto = 1 << 30
	if mem <= 0 {
		return 0
	}
	return int(min(auto, mem/16))
}
