package vold

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Every figure the collector emits is described: a name without help
// would fail the whole scrape.
func TestMetricsScrape(t *testing.T) {
	c, _, g := newSystemCluster(t, 3)
	n := &node{trans: &transport{}}
	n.host.Store(c.Host(1))
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(newCollector(n)); err != nil {
		t.Fatal(err)
	}
	gauges := func() map[string]float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		if len(mfs) != len(metricHelp) {
			t.Fatalf("scrape has %d metrics, %d are described", len(mfs), len(metricHelp))
		}
		out := map[string]float64{}
		for _, mf := range mfs {
			out[mf.GetName()] = mf.GetMetric()[0].GetGauge().GetValue()
		}
		return out
	}
	if got := gauges(); got["shoal_vold_groups"] != 1 || got["shoal_vold_groups_retiring"] != 0 {
		t.Fatalf("groups = %v, retiring = %v; want 1, 0", got["shoal_vold_groups"], got["shoal_vold_groups_retiring"])
	}
	// Told it was removed while it is still a member, node 1's replica
	// retires and is never confirmed: it stays in the gauge.
	st, err := c.Host(1).Status(g)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Host(1).Retire(g, st.Voters); err != nil {
		t.Fatal(err)
	}
	c.RunTicks(20)
	if got := gauges(); got["shoal_vold_groups"] != 1 || got["shoal_vold_groups_retiring"] != 1 {
		t.Fatalf("after Retire: groups = %v, retiring = %v; want 1, 1", got["shoal_vold_groups"], got["shoal_vold_groups_retiring"])
	}
}
