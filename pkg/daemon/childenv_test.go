package daemon

import (
	"slices"
	"testing"
)

func TestChildEnv(t *testing.T) {
	env := []string{"PATH=/bin", "NOTIFY_SOCKET=/run/systemd/notify", "LISTEN_FDS=1", "LISTEN_PID=7", "WATCHDOG_USEC=1", "SHOAL_RUN_DIR=/run/x", "GODEBUG=madvdontneed=0"}
	in := slices.Clone(env)
	got := ChildEnv(env, "SHOAL_RUN_DIR")
	want := []string{"PATH=/bin", "GODEBUG=madvdontneed=0"}
	if !slices.Equal(got, want) {
		t.Errorf("ChildEnv = %q, want %q", got, want)
	}
	if !slices.Equal(env, in) {
		t.Errorf("ChildEnv changed its argument to %q", env)
	}
}
