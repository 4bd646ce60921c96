package statd

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/hlc"
)

// Tombstone garbage collection.
//
// A deleted document leaves a tombstone so that an older copy arriving
// later cannot bring it back. Tombstones are dropped once older than the
// retention window, which must exceed any partition the cluster tolerates.
// Three rules keep a dropped tombstone's document from coming back:
//
//  1. every node drops expired tombstones by the same rule (their stamp is
//     older than now minus the retention), so they disappear everywhere;
//  2. a node does not accept an expired tombstone for a key it does not
//     hold, so anti-entropy cannot copy a dropped tombstone back;
//  3. a node that has not completed an anti-entropy round for longer than
//     the retention (partitioned or down that long) may hold documents the
//     others deleted and forgot: before it exchanges anything with a peer
//     that has synced more recently, it drops every document whose latest
//     write is not its own since it was last in sync, and fetches the
//     cluster's current state instead.
//
// NB: the limit. Rule 3 knows a node is stale only from its own last
// anti-entropy round with any peer, so it catches a node cut off alone,
// not a group. Partitions longer than the retention can undo deletes:
//
//   - two or more nodes cut off together keep syncing among themselves, so
//     no side looks stale when the partition heals: a document deleted on
//     either side during the partition, whose tombstone that side has
//     collected, comes back from the other side, which still holds it;
//   - a node cut off alone loses the deletes it made itself while cut off
//     once it has collected their tombstones: on return, rule 3 takes the
//     cluster's copies of those documents. (Deletes made by the others
//     are safe: that is what rule 3 is for.)
//
// So the retention (72h by default) must exceed the longest partition
// after which deletes must hold; docs/STATE.md says so to operators.
// Dropping a tombstone only once every member has acknowledged it would
// lift the limit at the price of keeping tombstones while any member is
// unreachable.

// expiry returns the HLC time before which tombstones are expired.
func (c *cluster) expiry() hlc.Timestamp {
	return hlc.Timestamp{Wall: time.Now().Add(-time.Duration(c.cfg.TombstoneRetention)).UnixNano()}
}

// accept implements rule 2 for documents received from peers.
func (c *cluster) accept(key string, d crdt.Doc) bool {
	if d.Exists() || !d.MaxStamp().TS.Less(c.expiry()) {
		return true
	}
	cur, err := c.st.GetRaw(key)
	return err != nil || !cur.Doc.IsEmpty()
}

// gcLoop implements rule 1.
func (c *cluster) gcLoop(ctx context.Context) {
	every := min(time.Duration(c.cfg.TombstoneRetention)/10, 10*time.Minute)
	every = max(every, 500*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		before := c.expiry()
		var keys []string
		c.st.Scan(func(key string, d crdt.Doc) bool {
			if !d.Exists() && !d.IsEmpty() && d.MaxStamp().TS.Less(before) {
				keys = append(keys, key)
			}
			return ctx.Err() == nil
		})
		if len(keys) == 0 {
			continue
		}
		n, err := c.st.Purge(ctx, keys, func(d crdt.Doc) bool {
			return !d.Exists() && d.MaxStamp().TS.Less(before)
		})
		if err != nil {
			c.log.Error("tombstone gc", "err", err)
			continue
		}
		c.log.Info("tombstones collected", "count", n)
	}
}

// loadLastSync reads when this node last completed an anti-entropy round,
// as persisted by lastSyncLoop.
func (c *cluster) loadLastSync() (time.Time, error) {
	b, err := c.st.Meta("last_sync")
	if err != nil || b == nil {
		return time.Time{}, err
	}
	ns, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return time.Time{}, err
	}
	return time.Unix(0, ns), nil
}

// onPeerLastSync implements rule 3. It runs before this node exchanges
// anything with a peer in an anti-entropy round. The node is stale if it
// has not completed a round for longer than the retention while the peer
// has: the peer's side may have deleted and forgotten documents this node
// still holds. Requiring the peer to be fresher means two nodes that were
// both away never drop anything on each other's word.
func (c *cluster) onPeerLastSync(ctx context.Context, peer string, theirs time.Time) {
	c.staleMu.Lock()
	defer c.staleMu.Unlock()
	mine := c.gossip.LastSync()
	retention := time.Duration(c.cfg.TombstoneRetention)
	if mine.IsZero() || theirs.IsZero() || time.Since(mine) <= retention || !theirs.After(mine) {
		return
	}
	since := hlc.Timestamp{Wall: mine.UnixNano()}
	// Keep what this node itself wrote while it was away: nobody else has
	// it. Everything else came from peers, who still hold it unless they
	// deleted it, and then the peer's state is the one to take.
	stale := func(d crdt.Doc) bool {
		last := d.MaxStamp()
		return last.Node != c.nodeID || last.TS.Less(since)
	}
	var keys []string
	c.st.Scan(func(key string, d crdt.Doc) bool {
		// Cluster settings and node descriptions are never deleted by the
		// cluster, and are needed to reconnect.
		if strings.HasPrefix(key, "/cluster/") || strings.HasPrefix(key, prefixNodes) {
			return true
		}
		if stale(d) {
			keys = append(keys, key)
		}
		return true
	})
	n, err := c.st.Purge(ctx, keys, stale)
	if err != nil {
		c.log.Error("drop stale documents", "err", err)
		return
	}
	// Count this as fresh from now on: what remains is either written
	// since, or about to be fetched from the peer.
	c.gossip.SetLastSync(time.Now())
	c.log.Warn("out of sync longer than the tombstone retention: dropped documents not written since, to fetch them afresh",
		"last_sync", mine.Format(time.RFC3339), "peer", peer, "peer_last_sync", theirs.Format(time.RFC3339), "dropped", n)
}
