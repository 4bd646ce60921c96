// Package store keeps statd's replicated documents on Pebble and indexes
// them with a persisted Merkle Search Tree.
//
// # Layout
//
// One Pebble database per node holds, under one-byte prefixes:
//
//	d<key>          document record: uvarint revision | crdt encoding
//	c<rev:8>        change log: the record of <key> right after revision rev
//	m<hash:32>      MST node, content-addressed (exactly the current tree)
//	s<name>         scalars: root hash, revision, oldest revision, HLC
//	                high-water mark, counters, node ID
//
// # Writes
//
// Every write (a local Put or Delete, or a document merged from a peer) is
// a delta merged into the current document. One committer goroutine applies
// writes in groups: it merges each delta, assigns the next local revision,
// moves the document's MST entry, appends the change log, and commits the
// whole group (documents, log, added and removed MST nodes, root and
// revision) as one synced Pebble batch. Waiting writers are acknowledged
// after the fsync, so a write is durable when acknowledged, concurrent
// writers share one fsync, and the MST on disk always matches the
// documents.
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
// corrupt or missing node is reported, counted and repaired by rebuilding
// the tree from the documents, which are the source of truth; a scrub after
// start-up walks the whole tree so damage is found without waiting for a
// write to trip over it.
package store
