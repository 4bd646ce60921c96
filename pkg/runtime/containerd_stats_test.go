package runtime

import (
	"strings"
	"testing"

	cg1 "github.com/containerd/cgroups/v3/cgroup1/stats"
	cg2 "github.com/containerd/cgroups/v3/cgroup2/stats"
	"github.com/containerd/typeurl/v2"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

const netDevHeader = `Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
`

func TestParseNetDev(t *testing.T) {
	for _, tc := range []struct {
		name   string
		in     string
		rx, tx uint64
		err    bool
	}{
		{name: "empty"},
		{name: "header only", in: netDevHeader},
		{name: "lo only", in: netDevHeader +
			"    lo:    3193      29    0    0    0     0          0         0     3193      29    0    0    0     0       0          0\n"},
		{name: "interfaces summed, lo left out", in: netDevHeader +
			"    lo:    3193      29    0    0    0     0          0         0     3193      29    0    0    0     0       0          0\n" +
			"  eth0: 191760016   10461    0    0    0     0          0         0   755652    7251    0    0    0     0       0          0\n" +
			"  veth1:    1000      10    0    0    0     0          0         0       24       1    0    0    0     0       0          0\n",
			rx: 191761016, tx: 755676},
		{name: "counter touching the colon", in: netDevHeader +
			"  eth0:18446744073709551615 1 0 0 0 0 0 0 7 1 0 0 0 0 0 0\n",
			rx: 18446744073709551615, tx: 7},
		{name: "no final newline", in: netDevHeader + "eth0: 5 1 0 0 0 0 0 0 6 1 0 0 0 0 0 0", rx: 5, tx: 6},
		{name: "too few fields", in: netDevHeader + "  eth0: 5 1 0 0\n", err: true},
		{name: "not a number", in: netDevHeader + "  eth0: x 1 0 0 0 0 0 0 6 1 0 0 0 0 0 0\n", err: true},
	} {
		rx, tx, err := parseNetDev(strings.NewReader(tc.in))
		if (err != nil) != tc.err || rx != tc.rx || tx != tc.tx {
			t.Errorf("%s: got %d, %d, %v; want %d, %d, error %v", tc.name, rx, tx, err, tc.rx, tc.tx, tc.err)
		}
	}
}

// TestDecodeMetrics covers cgroup v2, which this machine's tests do not
// reach, and the corners of v1.
func TestDecodeMetrics(t *testing.T) {
	pack := func(m any) *anypb.Any {
		t.Helper()
		a, err := typeurl.MarshalAnyToProto(m)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	for _, tc := range []struct {
		name string
		data *anypb.Any
		want Stats
	}{
		{"v1", pack(&cg1.Metrics{
			CPU:    &cg1.CPUStat{Usage: &cg1.CPUUsage{Total: 1500, User: 1000, Kernel: 500}},
			Memory: &cg1.MemoryStat{TotalInactiveFile: 1 << 20, InactiveFile: 7, Usage: &cg1.MemoryEntry{Usage: 5 << 20, Limit: 64 << 20}},
			Pids:   &cg1.PidsStat{Current: 3},
			Blkio: &cg1.BlkIOStat{IoServiceBytesRecursive: []*cg1.BlkIOEntry{
				{Op: "Read", Major: 8, Value: 100}, {Op: "Write", Major: 8, Value: 10},
				{Op: "read", Major: 9, Value: 1}, {Op: "Total", Major: 8, Value: 110}, {Op: "Sync", Major: 8, Value: 110},
			}},
		}), Stats{CPUNanos: 1500, MemoryBytes: 4 << 20, MemoryLimitBytes: 64 << 20, Pids: 3, BlockReadBytes: 101, BlockWriteBytes: 10}},
		{"v1 unlimited, more cache than usage", pack(&cg1.Metrics{
			Memory: &cg1.MemoryStat{TotalInactiveFile: 9 << 20, Usage: &cg1.MemoryEntry{Usage: 5 << 20, Limit: 9223372036854771712}},
		}), Stats{MemoryBytes: 5 << 20}},
		{"v1 empty", pack(&cg1.Metrics{}), Stats{}},
		{"v2", pack(&cg2.Metrics{
			CPU:    &cg2.CPUStat{UsageUsec: 1500},
			Memory: &cg2.MemoryStat{Usage: 5 << 20, InactiveFile: 1 << 20, UsageLimit: 32 << 20},
			Pids:   &cg2.PidsStat{Current: 2},
			Io:     &cg2.IOStat{Usage: []*cg2.IOEntry{{Major: 8, Rbytes: 100, Wbytes: 10}, {Major: 9, Rbytes: 1, Wbytes: 2}}},
		}), Stats{CPUNanos: 1_500_000, MemoryBytes: 4 << 20, MemoryLimitBytes: 32 << 20, Pids: 2, BlockReadBytes: 101, BlockWriteBytes: 12}},
		{"v2 max", pack(&cg2.Metrics{Memory: &cg2.MemoryStat{Usage: 5 << 20, UsageLimit: 1<<64 - 1}}), Stats{MemoryBytes: 5 << 20}},
	} {
		var got Stats
		if err := decodeMetrics(tc.data, &got); err != nil || got != tc.want {
			t.Errorf("%s: %+v, %v; want %+v", tc.name, got, err, tc.want)
		}
	}
	for name, data := range map[string]*anypb.Any{
		"nil":          nil,
		"another type": pack(durationpb.New(1)),
		"unknown type": {TypeUrl: "example.com/nothing.Metrics", Value: []byte{1}},
	} {
		var got Stats
		err := decodeMetrics(data, &got)
		if err == nil {
			t.Errorf("%s: no error", name)
			continue
		}
		if data != nil && !strings.Contains(err.Error(), data.TypeUrl) {
			t.Errorf("%s: error %q does not name the type %s", name, err, data.TypeUrl)
		}
	}
}
