package raftgroup_test

import (
	"fmt"
	"slices"
	"testing"
)

// TestSeedReplays runs the porcupine simulations twice with one seed and
// requires the same run both times: the same batches delivered in the
// same order, and the same history. A seed that fails a sweep then fails
// again when run on its own (RAFTGROUP_SEED), with its logs.
func TestSeedReplays(t *testing.T) {
	for _, c := range []struct {
		name string
		o    lkvOptions
	}{
		{"kv", lkvOptions{}},
		{"segments", lkvOptions{largeEntry: 1}},
		{"follow", lkvOptions{follow: true}},
		{"membership", lkvOptions{churn: true}},
		{"membership-live", lkvOptions{churn: true, liveVictims: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			seed := seedFromEnv(36)
			c.o.trail = true
			var runs [2]lkvRun
			for i := range runs {
				t.Run(fmt.Sprint(i), func(t *testing.T) { runs[i] = linearizableKV(t, seed, c.o) })
			}
			if t.Failed() {
				return // a run failed: the comparison would say nothing more
			}
			a, b := runs[0], runs[1]
			if a.digest == b.digest && slices.Equal(a.history, b.history) {
				return
			}
			for i := range min(len(a.deliveries), len(b.deliveries)) {
				if a.deliveries[i] != b.deliveries[i] {
					t.Fatalf("seed %d: runs part at delivery %d of %d / %d: %+v against %+v", seed, i, len(a.deliveries), len(b.deliveries), a.deliveries[i], b.deliveries[i])
				}
			}
			t.Fatalf("seed %d: %d and %d deliveries, %d and %d operations", seed, len(a.deliveries), len(b.deliveries), len(a.history), len(b.history))
		})
	}
}
