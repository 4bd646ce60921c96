package main

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// hist is a Prometheus histogram as scraped: cumulative counts by bucket
// upper bound (+Inf included).
type hist map[float64]float64

// parseBucket reads one sample line of histogram name's buckets (labels
// other than le must equal want, e.g. `kind="mutate",`) into h.
func parseBucket(h hist, line, name, want string) {
	rest, ok := strings.CutPrefix(line, name+"_bucket{"+want+`le="`)
	if !ok {
		return
	}
	le, rest, ok := strings.Cut(rest, `"}`)
	if !ok {
		return
	}
	bound, err1 := strconv.ParseFloat(le, 64)
	n, err2 := strconv.ParseFloat(strings.TrimSpace(rest), 64)
	if err1 == nil && err2 == nil {
		h[bound] = n
	}
}

// minus returns the observations of h that o (an earlier scrape) lacks.
func (h hist) minus(o hist) hist {
	out := hist{}
	for le, n := range h {
		out[le] = n - o[le]
	}
	return out
}

// add adds o's observations to h.
func (h hist) add(o hist) {
	for le, n := range o {
		h[le] += n
	}
}

// count is how many observations h holds.
func (h hist) count() float64 { return h[math.Inf(1)] }

// quantile estimates h's q-quantile as Prometheus' histogram_quantile
// does: linearly within the bucket that holds it (the largest finite
// bound if that is +Inf); zero when h is empty.
func (h hist) quantile(q float64) time.Duration {
	total := h.count()
	if total <= 0 {
		return 0
	}
	les := make([]float64, 0, len(h))
	for le := range h {
		les = append(les, le)
	}
	slices.Sort(les)
	rank := q * total
	lo, below := 0.0, 0.0
	for _, le := range les {
		n := h[le]
		if n >= rank {
			if math.IsInf(le, 1) {
				return time.Duration(lo * float64(time.Second))
			}
			frac := 1.0
			if n > below {
				frac = (rank - below) / (n - below)
			}
			return time.Duration((lo + (le-lo)*frac) * float64(time.Second))
		}
		lo, below = le, n
	}
	return time.Duration(lo * float64(time.Second))
}
