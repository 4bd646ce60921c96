package store

import (
	"sync/atomic"
	"time"
)

// counters are the store's monotonic counters, exported through Status and
// (by statd) as Prometheus metrics.
type counters struct {
	commits      atomic.Uint64
	changes      atomic.Uint64
	commitNanos  atomic.Uint64
	skewRejected atomic.Uint64
	corruptNodes atomic.Uint64
	repairs      atomic.Uint64
	// The indexer's tree commits, and documents it could not index.
	indexBatches  atomic.Uint64
	indexRejected atomic.Uint64
	// Local writes stamped again by the committer (see writeReq.stamp).
	restamped atomic.Uint64
}

func (c *counters) observeCommit(d time.Duration, changes int) {
	c.commits.Add(1)
	c.changes.Add(uint64(changes))
	c.commitNanos.Add(uint64(d))
}

func (c *counters) snapshot(clockRejected uint64) map[string]uint64 {
	return map[string]uint64{
		"commits":           c.commits.Load(),
		"changes":           c.changes.Load(),
		"commit_micros":     c.commitNanos.Load() / 1000,
		"skew_rejected":     c.skewRejected.Load(),
		"clock_rejected":    clockRejected,
		"mst_corrupt_nodes": c.corruptNodes.Load(),
		"mst_repairs":       c.repairs.Load(),
		"index_batches":     c.indexBatches.Load(),
		"index_rejected":    c.indexRejected.Load(),
		"writes_restamped":  c.restamped.Load(),
	}
}
