package raftgroup

import (
	"maps"
	"slices"
)

// Journal relief. An entry whose data is a blob keeps its journal segment
// (64 MiB by default) until its group's log is truncated past it, and a
// log is truncated after a snapshot, which a group takes every
// SnapshotEntries entries or SnapshotBytes of data. A group that falls
// idle before either — a volume written now and then — never truncates:
// its few blobs keep whole segments that every other group has long let
// go of, one segment per such group at worst, so the journal grows with
// the number of groups written now and then rather than with their data.
//
// So once more than journalPinLimit segments hold log entries, each
// quiesced group whose log reaches into one of the older segments (all but
// the newest journalPinLimit) truncates its whole log: at its stored
// snapshot if that covers the entries, else after taking a snapshot — but
// only when the snapshot would write no more than a segment (a state is at
// most its last snapshot and the data applied since), so that relief never
// writes more than it frees. A quiesced group's followers hold its whole
// log, so none of them needs what is truncated; a replica that comes back
// later gets a snapshot, as after any compaction. Busy groups are left to
// their own snapshots. A stored snapshot's own segment does not count: it
// is replaced, not outgrown.

// journalPinLimit is how many segments may hold log entries before the
// idle groups holding the older ones let them go.
const journalPinLimit = 16

// relieveJournal truncates the logs of the quiesced groups that hold old
// journal segments (see above). It runs after a round with ticks.
func (h *Host) relieveJournal() {
	refs := h.jnl.refs
	if len(refs) <= journalPinLimit {
		return
	}
	segs := slices.Sorted(maps.Keys(refs))
	// Each group once, at the highest index it holds in any old segment.
	upTo := map[GroupID]uint64{}
	for _, seg := range segs[:len(segs)-journalPinLimit] {
		for id, idx := range refs[seg] {
			upTo[id] = max(upTo[id], idx)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(upTo)) {
		g := h.groups[id]
		if g == nil || !g.quiesced {
			continue
		}
		if err := g.releaseJournal(upTo[id]); err != nil {
			h.log.Warn("truncate an idle group's log", "group", uint64(id), "err", err)
		}
	}
}

// releaseJournal truncates an idle group's whole log if that lets go of
// its entries up to index upTo, snapshotting first when the stored
// snapshot does not cover them and a snapshot is small enough (see
// above).
func (g *group) releaseJournal(upTo uint64) error {
	if g.bgSnap != nil || g.broken != nil || g.removed {
		return nil
	}
	var snapIdx uint64
	if s := g.st.snap; s != nil {
		snapIdx = s.GetIndex()
	}
	if upTo <= snapIdx {
		return g.truncateLog(snapIdx)
	}
	if g.applied < upTo || g.snapBytes+g.logBytes > uint64(g.h.jnl.maxSize) {
		return nil
	}
	if err := g.snapshotAndCompact(0); err != nil {
		return err
	}
	g.h.stats.JournalReliefSnapshots++
	return nil
}
