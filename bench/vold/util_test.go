package main

import (
	"math"
	"testing"
	"time"
)

func TestSlowShare(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		ds   []time.Duration
		want float64
	}{
		{nil, 0},
		{[]time.Duration{ms, ms}, 0},
		{[]time.Duration{2 * ms}, 0}, // at the threshold is not over it
		{[]time.Duration{ms, ms, 3 * ms, 5 * ms}, 0.8},
		{[]time.Duration{4 * ms}, 1},
	} {
		if got := slowShare(c.ds, 2*ms); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("slowShare(%v) = %v, want %v", c.ds, got, c.want)
		}
	}
}
