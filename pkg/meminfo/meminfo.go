// Package meminfo reads how much memory this machine has, and how much a
// process may use under its memory cgroup, for the daemons that size
// themselves (vold's heap reserve) or report it (statd's node document,
// schedd's placement).
package meminfo

import (
	"os"
	"slices"
	"strconv"
	"strings"
)

// Total is MemTotal from /proc/meminfo in bytes (0 if it cannot be read).
func Total() int64 {
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

// Available is the memory this process may use as far as it can tell:
// the machine's, or its memory cgroup's limit when that is lower (a
// systemd unit's MemoryMax=). 0 if neither can be read.
func Available() int64 {
	mem := Total()
	if b, err := os.ReadFile("/proc/self/cgroup"); err == nil {
		if lim := CgroupLimit(string(b), os.ReadFile); lim > 0 && (mem == 0 || lim < mem) {
			mem = lim
		}
	}
	return mem
}

// CgroupLimit returns the memory limit of the cgroup that selfCgroup
// (the text of /proc/self/cgroup) names, cgroup v2 or v1, or 0 when there
// is none or it cannot be read. read reads a file.
func CgroupLimit(selfCgroup string, read func(string) ([]byte, error)) int64 {
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
