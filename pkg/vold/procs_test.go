package vold

import (
	"slices"
	"testing"

	"github.com/shoal-dev/shoal/pkg/volfs"
)

func TestMaxProcs(t *testing.T) {
	for _, c := range []struct {
		configured, cpus int
		env              string
		want             int
		set              bool
	}{
		{0, 1, "", 1, true},
		{0, 2, "", 1, true},
		{0, 8, "", 2, true},
		{0, 64, "", 16, true},
		{0, 8, "4", 0, false}, // GOMAXPROCS in the environment wins over automatic
		{3, 8, "4", 3, true},  // the configuration wins over the environment
		{5, 2, "", 5, true},
	} {
		got, set := maxProcs(c.configured, c.cpus, c.env)
		if got != c.want || set != c.set {
			t.Errorf("maxProcs(%d, %d, %q) = %d, %v; want %d, %v", c.configured, c.cpus, c.env, got, set, c.want, c.set)
		}
	}
	if err := (&Config{PeerPort: 1, ReplaceAfter: 1, RepairInterval: 1, CreateTimeout: 1, RaftTick: 1, MaxProcs: -1}).check(); err == nil {
		t.Error("check accepted max_procs -1")
	}
}

func TestHeapReserve(t *testing.T) {
	const gib = 1 << 30
	for _, c := range []struct {
		configured int
		mem        int64
		want       int
	}{
		{-1, 24 * gib, 1 << 30},
		{-1, 2 * gib, 128 << 20}, // a sixteenth of a small machine
		{-1, 0, 0},               // memory unknown: none
		{0, 24 * gib, 0},
		{100, 1 * gib, 100 << 20}, // as configured, whatever the machine
	} {
		if got := heapReserve(c.configured, c.mem); got != c.want {
			t.Errorf("heapReserve(%d, %d) = %d, want %d", c.configured, c.mem, got, c.want)
		}
	}
	if err := (&Config{PeerPort: 1, ReplaceAfter: 1, RepairInterval: 1, CreateTimeout: 1, RaftTick: 1, HeapReserveMiB: -2}).check(); err == nil {
		t.Error("check accepted heap_reserve_mib -2")
	}
}

func TestWithGODEBUG(t *testing.T) {
	for _, c := range []struct {
		env     []string
		want    []string
		changed bool
	}{
		{[]string{"A=1"}, []string{"A=1", "GODEBUG=madvdontneed=0"}, true},
		{[]string{"GODEBUG="}, []string{"GODEBUG=madvdontneed=0"}, true},
		{[]string{"GODEBUG=gctrace=1", "B=2"}, []string{"GODEBUG=madvdontneed=0,gctrace=1", "B=2"}, true},
		{[]string{"GODEBUG=gctrace=1,madvdontneed=1"}, []string{"GODEBUG=gctrace=1,madvdontneed=1"}, false}, // the operator's choice stays
		{[]string{"GODEBUG=madvdontneed=0"}, []string{"GODEBUG=madvdontneed=0"}, false},
	} {
		in := slices.Clone(c.env)
		got, changed := withGODEBUG(in, freeMemoryLazily)
		if !slices.Equal(got, c.want) || changed != c.changed {
			t.Errorf("withGODEBUG(%q) = %q, %v; want %q, %v", c.env, got, changed, c.want, c.changed)
		}
		if !slices.Equal(in, c.env) {
			t.Errorf("withGODEBUG(%q) changed its argument to %q", c.env, in)
		}
	}
}

func TestVolumeLevelConfig(t *testing.T) {
	base := Config{PeerPort: 1, ReplaceAfter: 1, RepairInterval: 1, CreateTimeout: 1, RaftTick: 1}
	for _, l := range []uint32{0, volfs.LevelBase, volfs.MaxLevel} {
		c := base
		c.VolumeLevel = l
		if err := c.check(); err != nil {
			t.Errorf("volume_level %d: %v", l, err)
		}
		if want := map[bool]uint32{true: volfs.MaxLevel, false: l}[l == 0]; (&node{cfg: &c}).level() != want {
			t.Errorf("volume_level %d: level %d, want %d", l, (&node{cfg: &c}).level(), want)
		}
	}
	c := base
	c.VolumeLevel = volfs.MaxLevel + 1
	if err := c.check(); err == nil {
		t.Errorf("volume_level %d (above what this vold knows) accepted", c.VolumeLevel)
	}
}
