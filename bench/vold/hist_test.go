package main

import (
	"math"
	"testing"
	"time"
)

func TestHistQuantile(t *testing.T) {
	exposition := []string{
		`shoal_vold_fs_op_seconds_bucket{kind="query",le="0.001"} 7`,
		`shoal_vold_fs_op_seconds_bucket{kind="mutate",le="0.0001"} 0`,
		`shoal_vold_fs_op_seconds_bucket{kind="mutate",le="0.0002"} 10`,
		`shoal_vold_fs_op_seconds_bucket{kind="mutate",le="0.0004"} 30`,
		`shoal_vold_fs_op_seconds_bucket{kind="mutate",le="+Inf"} 40`,
		`shoal_vold_fs_op_seconds_count{kind="mutate"} 40`,
	}
	h := hist{}
	for _, line := range exposition {
		parseBucket(h, line, "shoal_vold_fs_op_seconds", `kind="mutate",`)
	}
	if len(h) != 4 || h.count() != 40 {
		t.Fatalf("parsed %v", h)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{
		{0.25, 200 * time.Microsecond}, // the 10th of 40: the top of (100, 200]
		{0.5, 300 * time.Microsecond},  // the 20th: half way through (200, 400]
		{0.95, 400 * time.Microsecond}, // in +Inf: the largest finite bound
	} {
		if got := h.quantile(c.q); got != c.want {
			t.Errorf("quantile(%v) = %v, want %v", c.q, got, c.want)
		}
	}
	earlier := hist{0.0001: 0, 0.0002: 10, 0.0004: 10, math.Inf(1): 10}
	if d := h.minus(earlier); d.count() != 30 || d.quantile(0.5) != 350*time.Microsecond { // the 15th of 20 in (200, 400]
		t.Errorf("minus: %v, median %v", d, d.quantile(0.5))
	}
	if got := (hist{}).quantile(0.5); got != 0 {
		t.Errorf("empty quantile = %v", got)
	}
}
