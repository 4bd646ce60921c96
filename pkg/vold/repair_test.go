package vold

import (
	"maps"
	"slices"
	"testing"
	"time"
)

// TestSilentLongerThan checks which silent volds repair replaces: only a
// silence longer than the limit that also began after statd last saw the
// node come alive — not a restarting node whose statd is back before its
// vold, nor a node statd counts suspect or dead (deadFor's case).
func TestSilentLongerThan(t *testing.T) {
	const limit = 60 * time.Second
	silence := map[string]time.Duration{
		"crashed":    5 * time.Minute, // vold down, node alive for an hour
		"restarting": 5 * time.Minute, // node back 10 s ago, vold not yet
		"slow-start": 5 * time.Minute, // node back 61 s ago, vold never came
		"quiet":      2 * time.Second, // vold pinging as it should
		"suspect":    5 * time.Minute, // statd not sure: not alive here
		"unknown":    5 * time.Minute, // not in statd's view at all
		"at-limit":   limit,           // not longer than the limit
	}
	alive := map[string]time.Duration{
		"crashed":    time.Hour,
		"restarting": 10 * time.Second,
		"slow-start": 61 * time.Second,
		"quiet":      time.Hour,
		"at-limit":   time.Hour,
	}
	got := silentLongerThan(silence, func(n string) time.Duration { return alive[n] }, limit)
	want := []string{"crashed", "slow-start"}
	if keys := slices.Sorted(maps.Keys(got)); !slices.Equal(keys, want) {
		t.Fatalf("silent nodes %v, want %v", keys, want)
	}
	if got := silentLongerThan(map[string]time.Duration{}, func(string) time.Duration { return time.Hour }, limit); got != nil {
		t.Fatalf("no peers: %v", got)
	}
}
