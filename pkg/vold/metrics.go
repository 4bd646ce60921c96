package vold

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shoal-dev/shoal/pkg/hugeheap"
)

// collector exports vold's figures at scrape time.
type collector struct {
	n     *node
	descs map[string]*prometheus.Desc
}

var metricHelp = map[string]string{
	"groups":                              "Raft groups this node holds a replica of.",
	"groups_leading":                      "Raft groups whose leader is this node's replica.",
	"groups_awake":                        "Raft groups ticking on this node (not quiesced).",
	"groups_retiring":                     "Replicas of this node that their groups removed and that still vote until every voter of the group confirmed the removal (one that stays is waiting on a voter that is down).",
	"raft_entry_cache_bytes":              "Bytes of log entries the groups keep in memory (idle groups keep none).",
	"mounts":                              "Volumes mounted on this node.",
	"proposals_total":                     "Proposals made through this node's replicas.",
	"forwarded_out_total":                 "Requests forwarded to other nodes' replicas.",
	"forwarded_in_total":                  "Requests other nodes forwarded here.",
	"forward_errors_total":                "Forwarded requests that failed.",
	"replicas_created_total":              "Replicas created or joined on this node.",
	"replicas_destroyed_total":            "Replicas destroyed on this node.",
	"replicas_replaced_total":             "Dead replicas this node replaced as leader (node dead, or its vold silent on a live node).",
	"scale_steps_total":                   "Membership changes this node made as leader to bring a volume to the replica count asked for (learners added, promoted or removed; voters removed).",
	"raft_batches_sent_total":             "Raft batches sent to other nodes.",
	"raft_bytes_sent_total":               "Bytes of Raft batches sent to other nodes.",
	"raft_batches_sent_here_total":        "Raft batches the Raft loop wrote to an idle connection itself (no hand-off to the connection's goroutine).",
	"raft_batches_dropped_total":          "Raft batches dropped (queue full or peer unreachable).",
	"raft_stream_failures_total":          "Raft connections that failed to open or broke.",
	"raft_rounds_total":                   "Rounds of the Raft loop (each handles what arrived since the last for every group).",
	"raft_syncs_total":                    "Synced journal writes (at most one per round).",
	"raft_early_applies_total":            "Readies whose committed entries were applied before the Ready's own entries were synced.",
	"raft_leader_transfers_total":         "Leaderships this node handed to the replica that proposed most of a group's entries (a volume written through another node's mount).",
	"raft_commit_notices_held_total":      "Commit-only appends a leader held back because no follower waits for them (superseded by the next append or sent at the next tick).",
	"raft_commit_notices_released_total":  "Held commit-only appends sent at a tick rather than superseded by an append.",
	"raft_appends_deferred_total":         "Appends a leader held back from followers its quorum did not need (sent together after a short wait).",
	"raft_deferred_sends_total":           "Queues of deferred appends sent to a follower.",
	"raft_notice_heartbeats_total":        "Commit notices sent as heartbeats that want no answer.",
	"raft_snapshots_taken_total":          "Snapshots the groups stored of their state machines.",
	"raft_background_snapshots_total":     "Snapshots started off the Raft loop (forked on the loop, written to a file of their own meanwhile: volumes' and the system group's); the others are written on the loop, which waits for them.",
	"raft_journal_relief_snapshots_total": "Snapshots taken so that an idle group's log lets go of old journal segments (more than 16 held log entries).",
	"heap_reserve_bytes":                  "Heap reserved at start (heap_reserve_mib): a ballast counted in the Go heap's in-use bytes that is never touched.",
}

func newCollector(n *node) *collector {
	c := &collector{n: n, descs: map[string]*prometheus.Desc{}}
	for name, help := range metricHelp {
		c.descs[name] = prometheus.NewDesc("shoal_vold_"+name, help, nil, nil)
	}
	return c
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	n := c.n
	emit := func(name string, typ prometheus.ValueType, v uint64) {
		ch <- prometheus.MustNewConstMetric(c.descs[name], typ, float64(v))
	}
	g, ct := prometheus.GaugeValue, prometheus.CounterValue
	if h := n.host.Load(); h != nil {
		groups := h.Groups()
		leading, retiring := 0, 0
		for _, id := range groups {
			st, err := h.Status(id)
			if err != nil {
				continue
			}
			if st.Role == "leader" {
				leading++
			}
			if st.Retiring {
				retiring++
			}
		}
		emit("groups", g, uint64(len(groups)))
		emit("groups_leading", g, uint64(leading))
		emit("groups_retiring", g, uint64(retiring))
		st := h.Stats()
		emit("groups_awake", g, uint64(st.AwakeGroups))
		emit("raft_entry_cache_bytes", g, st.EntryCacheBytes)
		emit("raft_rounds_total", ct, st.Rounds)
		emit("raft_syncs_total", ct, st.Syncs)
		emit("raft_early_applies_total", ct, st.EarlyApplies)
		emit("raft_leader_transfers_total", ct, st.LeaderTransfers)
		emit("raft_commit_notices_held_total", ct, st.NoticesHeld)
		emit("raft_commit_notices_released_total", ct, st.NoticesReleased)
		emit("raft_appends_deferred_total", ct, st.AppendsDeferred)
		emit("raft_deferred_sends_total", ct, st.DeferredSent)
		emit("raft_notice_heartbeats_total", ct, st.NoticeHeartbeats)
		emit("raft_snapshots_taken_total", ct, st.SnapshotsTaken)
		emit("raft_background_snapshots_total", ct, st.BackgroundSnapshots)
		emit("raft_journal_relief_snapshots_total", ct, st.JournalReliefSnapshots)
	}
	emit("heap_reserve_bytes", g, uint64(hugeheap.Reserved()))
	n.mountMu.Lock()
	emit("mounts", g, uint64(len(n.mounts)))
	n.mountMu.Unlock()
	emit("proposals_total", ct, n.stats.proposals.Load())
	emit("forwarded_out_total", ct, n.stats.forwardedOut.Load())
	emit("forwarded_in_total", ct, n.stats.forwardedIn.Load())
	emit("forward_errors_total", ct, n.stats.forwardErrors.Load())
	emit("replicas_created_total", ct, n.stats.created.Load())
	emit("replicas_destroyed_total", ct, n.stats.destroyed.Load())
	emit("replicas_replaced_total", ct, n.stats.replaced.Load())
	emit("scale_steps_total", ct, n.stats.scaleSteps.Load())
	emit("raft_batches_sent_total", ct, n.trans.sentBatches.Load())
	emit("raft_bytes_sent_total", ct, n.trans.sentBytes.Load())
	emit("raft_batches_sent_here_total", ct, n.trans.sentHere.Load())
	emit("raft_batches_dropped_total", ct, n.trans.dropped.Load())
	emit("raft_stream_failures_total", ct, n.trans.failures.Load())
}
