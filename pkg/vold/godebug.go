package vold

import (
	"os"
	"slices"
	"strings"
	"syscall"
)

// freeMemoryLazily is the GODEBUG setting vold runs with: the Go runtime
// returns freed heap memory to the kernel with MADV_FREE instead of
// MADV_DONTNEED, so pages it takes back before the kernel needs them are
// not faulted in again. A file write through a volume allocates and frees
// megabyte buffers at a high rate (the FUSE request's data encoded into
// an op, the Raft entry, each received frame), and with MADV_DONTNEED
// every scavenged one costs 256 page faults and zeroings when reused: on
// the project's VMs a tenth of the volds' CPU in sequential writes.
// Alternating binaries in bench/vold (3 runs each, medians of six;
// leader's / follower's mount): sequential writes 57.5 / 46.7 -> 64.8 /
// 48.1 MB/s at 30.0 / 28.2 -> 27.5 / 24.0 ms of CPU per MiB, and 51.1 /
// 45.0 -> 63.5 / 50.2 MB/s in an earlier sitting with the setting in
// every process's environment; 4 KiB synchronous writes unchanged within
// the scatter (docs/VOLUMES-PERFORMANCE.md). The cost: freed memory stays
// in the RSS until the kernel reclaims it.
const freeMemoryLazily = "madvdontneed=0"

// withGODEBUG returns the environment env with setting added to GODEBUG,
// and whether it changed anything: a GODEBUG that already says anything
// about the setting's name is left as it is, so an operator can override.
func withGODEBUG(env []string, setting string) ([]string, bool) {
	name, _, _ := strings.Cut(setting, "=")
	for i, kv := range env {
		v, ok := strings.CutPrefix(kv, "GODEBUG=")
		if !ok {
			continue
		}
		for _, f := range strings.Split(v, ",") {
			if k, _, _ := strings.Cut(f, "="); k == name {
				return env, false
			}
		}
		out := slices.Clone(env)
		if v == "" {
			out[i] = "GODEBUG=" + setting
		} else {
			out[i] = "GODEBUG=" + setting + "," + v
		}
		return out, true
	}
	return append(slices.Clone(env), "GODEBUG="+setting), true
}

// reexecWithGODEBUG replaces the process with itself under the GODEBUG
// vold wants, since the runtime reads that setting only at start. It
// returns only if there is nothing to do or the exec failed (vold then
// runs with the runtime's default). The process keeps its PID, so
// systemd's notify and watchdog see the same service.
func reexecWithGODEBUG(exe string) {
	env, changed := withGODEBUG(os.Environ(), freeMemoryLazily)
	if !changed || exe == "" {
		return
	}
	_ = syscall.Exec(exe, os.Args, env)
}
