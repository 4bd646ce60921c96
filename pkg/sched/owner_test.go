package sched_test

import (
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/shoal-dev/shoal/pkg/sched"
)

func nodeIDs(t *rapid.T, label string) []string {
	return rapid.SliceOfNDistinct(rapid.StringMatching(`n[0-9a-z]{1,6}`), 1, 30, rapid.ID[string]).Draw(t, label)
}

func TestOwnerStable(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		nodes := nodeIDs(t, "nodes")
		svc := rapid.StringMatching(`[a-z][a-z0-9-]{0,20}`).Draw(t, "service")
		o := sched.Owner(svc, nodes)
		if !slices.Contains(nodes, o) {
			t.Fatalf("owner %q is not among %v", o, nodes)
		}
		shuffled := rapid.Permutation(nodes).Draw(t, "shuffled")
		if o2 := sched.Owner(svc, shuffled); o2 != o {
			t.Fatalf("owner depends on order: %q vs %q", o, o2)
		}
	})
	if o := sched.Owner("web", nil); o != "" {
		t.Fatalf("Owner over no nodes = %q", o)
	}
}

// TestOwnerMinimalDisruption: removing a node moves only the services it
// owned; adding one moves services only to the newcomer.
func TestOwnerMinimalDisruption(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		nodes := nodeIDs(t, "nodes")
		extra := rapid.StringMatching(`x[0-9a-z]{1,6}`).Draw(t, "joiner")
		services := rapid.SliceOfNDistinct(rapid.StringMatching(`[a-z]{1,8}`), 1, 50, rapid.ID[string]).Draw(t, "services")
		gone := rapid.SampledFrom(nodes).Draw(t, "leaver")
		without := slices.DeleteFunc(slices.Clone(nodes), func(n string) bool { return n == gone })
		with := append(slices.Clone(nodes), extra)
		for _, s := range services {
			before := sched.Owner(s, nodes)
			if after := sched.Owner(s, without); before != gone && after != before {
				t.Fatalf("%s moved from %s to %s when %s left", s, before, after, gone)
			}
			if after := sched.Owner(s, with); after != before && after != extra {
				t.Fatalf("%s moved from %s to %s when %s joined", s, before, after, extra)
			}
		}
	})
}

func TestOwnerUniform(t *testing.T) {
	const nodes, services = 10, 10000
	var ids []string
	for i := range nodes {
		ids = append(ids, fmt.Sprintf("n%d", i+1))
	}
	count := map[string]int{}
	for i := range services {
		count[sched.Owner(fmt.Sprintf("svc-%d", i), ids)]++
	}
	// Expect 1000 each; a binomial's standard deviation is 30.
	for _, id := range ids {
		if c := count[id]; c < 850 || c > 1150 {
			t.Errorf("%s owns %d of %d services, want about %d: %v", id, c, services, services/nodes, count)
		}
	}
}
