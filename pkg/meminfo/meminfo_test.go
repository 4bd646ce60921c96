package meminfo

import (
	"os"
	"testing"
)

func TestCgroupLimit(t *testing.T) {
	files := map[string]string{
		"/sys/fs/cgroup/system.slice/shoal-vold.service/memory.max":                   "536870912\n",
		"/sys/fs/cgroup/system.slice/other.service/memory.max":                        "max\n",
		"/sys/fs/cgroup/memory/system.slice/shoal-vold.service/memory.limit_in_bytes": "268435456\n",
		"/sys/fs/cgroup/memory/memory.limit_in_bytes":                                 "9223372036854771712\n",
	}
	read := func(p string) ([]byte, error) {
		if v, ok := files[p]; ok {
			return []byte(v), nil
		}
		return nil, os.ErrNotExist
	}
	for _, c := range []struct {
		self string
		want int64
	}{
		{"0::/system.slice/shoal-vold.service\n", 512 << 20},
		{"0::/system.slice/other.service\n", 0}, // "max"
		{"12:pids:/\n9:memory:/system.slice/shoal-vold.service\n1:name=systemd:/\n", 256 << 20},
		{"9:memory:/\n", 0},                 // v1's unlimited
		{"0::/nosuch\n", 0},                 // unreadable
		{"4:cpu,cpuacct:/\n3:blkio:/\n", 0}, // no memory controller
	} {
		if got := CgroupLimit(c.self, read); got != c.want {
			t.Errorf("CgroupLimit(%q) = %d, want %d", c.self, got, c.want)
		}
	}
	if m := Available(); m <= 0 || m > Total() {
		t.Errorf("Available() = %d, want 1..%d", m, Total())
	}
}

func TestTotal(t *testing.T) {
	if Total() <= 0 {
		t.Error("Total read nothing from /proc/meminfo")
	}
}
