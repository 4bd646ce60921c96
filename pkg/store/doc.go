// Package store keeps statd's replicated documents on Pebble and indexes
// them with a persisted Merkle Search Tree.
//
// # Layout
//
// One Pebble database per node holds, under one-byte prefixes:
//
//	d<key>          document record: uvarint revision | crdt encoding
//	c<rev:8>        change log: the record of <key> right after revision rev
//	i<seq:8>        index op log: how op seq moves a document's MST entry
//	m<hash:32>      MST node, content-addressed (exactly the current tree)
//	s<name>         scalars: commit state (revision, last op, live and
//	                deleted counts, HLC high-water mark), index root and
//	                applied op, oldest revision, counters, node ID
//
// # Writes
//
// Every write (a local Put or Delete, or a document merged from a peer) is
// a delta merged into the current document. The writer's goroutine does
// the work: it stamps a local write, reads the document (or knows from an
// in-memory Bloom filter of the stored keys that there is none), merges,
// encodes and hashes. One committer goroutine then sequences writes in
// groups: it uses each prepared write if no write to its key was applied
// since the read (else it prepares it again), assigns revisions and index
// op numbers, and applies the group (documents, change log, index ops,
// scalars) as one synced Pebble batch, moving on to the next group while a
// syncer goroutine waits for the WAL sync. Waiting writers are
// acknowledged after the fsync, so a write is durable when acknowledged
// and concurrent writers share one fsync. A local write's stamp exceeds
// every stamp committed before it (the committer stamps it again if a
// later-stamped write overtook it).
//
// # The index
//
// The MST key of a document is its latest write's HLC timestamp followed by
// its key, and the value is the digest of the document's canonical
// encoding. Two nodes that merged the same writes hold the same documents,
// so the same entries and the same root. Ordering by time makes the entries
// two peers disagree on — the recent writes one of them missed — sit next
// to each other in the tree, so anti-entropy finds them in a few nodes
// instead of scattered paths (FIELD-NOTES: clustered differences cost ≈1.5×
// the payload, scattered 35–65×).
//
// The tree is kept off the write path. Each write's batch carries an index
// op (old entry, new entry and digest); an indexer goroutine applies the
// durable ops to the tree in batches of up to thousands, so that the path
// copies and hashes they share are paid once, and persists the nodes
// added and removed, the root and the last op applied (sindexed) in one
// unsynced batch, trimming the ops it applied. A crash loses at most the
// indexer's progress: Open replays the op log from sindexed, reaching the
// root the lost batches had. Root, Status and View wait until the index
// covers every write acknowledged before the call, so a caller never sees
// a root older than its own writes, and the root reported before a crash
// is the one the replay reproduces.
// # Watching
//
// The change log gives every change a revision. A watcher replays the log
// after the revision it last saw and then follows new commits, so it
// resumes across reconnects and restarts without gaps or duplicates, as
// long as the log still holds its revision (WatchHistory changes are kept).
//
// # Damage
//
// MST nodes are verified against their hash whenever they are loaded. A
// corrupt or missing node (or index op) is reported, counted and repaired
// by rebuilding the tree from the documents, which are the source of
// truth, while the committer holds writes back; a scrub after start-up
// walks the whole tree so damage is found without waiting for the indexer
// to trip over it.
package store
