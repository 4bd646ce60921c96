package vold

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Every figure the collector emits is described: a name without help
// would fail the whole scrape.
func TestMetricsScrape(t *testing.T) {
	c, _, _ := newSystemCluster(t, 3)
	n := &node{trans: &transport{}}
	n.host.Store(c.Host(1))
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(newCollector(n)); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != len(metricHelp) {
		t.Fatalf("scrape has %d metrics, %d are described", len(mfs), len(metricHelp))
	}
	for _, mf := range mfs {
		if mf.GetName() == "shoal_vold_groups" && mf.GetMetric()[0].GetGauge().GetValue() != 1 {
			t.Fatalf("groups = %v, want 1", mf.GetMetric()[0].GetGauge().GetValue())
		}
	}
}
