package vold

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// latencyBuckets spans a synced journal write on a fast disk (tens of
// microseconds) to a volume operation that waited out an election
// (seconds), densest where a replicated write falls on this project's
// machines (0.2–2 ms).
var latencyBuckets = []float64{
	25e-6, 50e-6, 75e-6, 100e-6, 150e-6, 200e-6, 300e-6, 400e-6, 500e-6, 750e-6,
	1e-3, 1.5e-3, 2e-3, 3e-3, 5e-3, 7.5e-3, 10e-3, 25e-3, 50e-3, 100e-3,
	250e-3, 500e-3, 1, 2.5,
}

// latencies are vold's timing histograms. They say where the time of a
// volume operation goes: in the operation as a whole on the node that
// served its FUSE request, and in each node's synced journal writes.
type latencies struct {
	sync prometheus.Histogram
	fsOp *prometheus.HistogramVec
	// fs are fsOp's series by fsKind, resolved once: every volume
	// operation records into one.
	fs [2]prometheus.Observer
}

// fsKind is the kind of a filesystem operation, fsOp's label.
type fsKind int

const (
	fsMutate fsKind = iota
	fsQuery
)

func newLatencies() *latencies {
	l := &latencies{
		sync: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "shoal_vold_raft_sync_seconds",
			Help:    "Synced journal writes of the Raft loop: the write and its fdatasync (one per round that needs one, for all groups of the node).",
			Buckets: latencyBuckets,
		}),
		fsOp: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "shoal_vold_fs_op_seconds",
			Help:    "Volume filesystem operations this node's mounts asked for, from the request to its answer (kind mutate: proposed, committed and applied, here or on the member it was forwarded to; query: a ReadIndex and the read).",
			Buckets: latencyBuckets,
		}, []string{"kind"}),
	}
	l.fs[fsMutate] = l.fsOp.WithLabelValues("mutate")
	l.fs[fsQuery] = l.fsOp.WithLabelValues("query")
	return l
}

func (l *latencies) collectors() []prometheus.Collector {
	return []prometheus.Collector{l.sync, l.fsOp}
}

// observeSync records a synced journal write (raftgroup.Config.ObserveSync).
func (l *latencies) observeSync(d time.Duration) {
	if l != nil {
		l.sync.Observe(d.Seconds())
	}
}

// observeFS records a filesystem operation of kind that began at start.
func (l *latencies) observeFS(kind fsKind, start time.Time) {
	if l != nil {
		l.fs[kind].Observe(time.Since(start).Seconds())
	}
}
