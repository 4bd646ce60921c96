// Package raftgroup runs many Raft groups in one process: the multi-Raft
// host under vold's replicated volumes and its replicated state-machine
// and lock API. It is built on go.etcd.io/raft/v3's RawNode; this comment
// explains what the host adds around it and why.
//
// # Shape
//
// A Host is one node (one vold). It holds a replica of any number of
// groups (one per volume, or per state machine), all stored in one Pebble
// database behind one journal and all driven by one loop: Run ticks a logical clock every
// TickInterval and runs a round whenever work arrives. There is no
// goroutine per group: an idle group costs a few hundred bytes and no CPU.
//
//	    Deliver(batch)            Submit / ReadIndex / ChangeMembership
//	         │                                   │
//	         ▼                                   ▼
//	  ┌──────────────────────── inbox ─────────────────────────┐
//	  │ round: step messages, start requests, tick,            │
//	  │        Readies of every group with work:               │
//	  │          persist all (one journal record, one sync)    │
//	  │          → queue messages per node → apply → Advance   │
//	  │        flush: one Batch per destination node           │
//	  └────────────────────────────────────────────────────────┘
//	         │                                   │
//	         ▼                                   ▼
//	Transport.Send(node, batch)        futures resolved on apply
//
// Groups are identified by GroupID, hosts by NodeID, and a group's members
// by ReplicaID. A replica ID is never reused within a group (raft requires
// that an ID names one member for all time): a node that leaves a group and
// comes back gets a new replica ID, the group refuses to re-admit an old
// one (ErrReplicaIDReused), and a destroyed replica leaves a tombstone.
// A replica that learns it was removed retires: it takes no requests but
// stays a Raft peer, its vote perhaps still needed by a member that has
// not applied the change, until every voter of the newest configuration
// it heard of says it counts it removed; then it is Removed and may be
// destroyed (retiring.go).
// Replica-to-node routing is part of the replicated state (it rides in the
// configuration change that adds a replica), so every member can reach
// every other; a new replica learns its leader's node from its first
// message.
//
// # The Ready contract
//
// RawNode hands out work as a Ready; the host handles the Readies of all
// groups of a round together, in the order raft requires:
//
//  1. Persist every Ready's snapshot, log entries (discarding any
//     overwritten tail) and hard state — all groups in one Pebble batch,
//     written to the journal and synced if any Ready says MustSync, then
//     applied to Pebble. One fdatasync covers every
//     group of the round: that is what makes a thousand groups per disk
//     affordable.
//  2. Send: queue every message by destination node. Nothing leaves before
//     step 1 committed — with one exception, a leader's messages, below.
//  3. Apply: restore a received snapshot (state machine and the host's own
//     replicated metadata), apply committed entries in order — normal
//     entries in runs through StateMachine.Apply, configuration changes one
//     at a time through ApplyConfChange — and serve read states.
//  4. Advance. A leader's own acknowledgement often commits more at once,
//     so the round repeats steps 1–4 (up to a few times) before flushing.
//
// A leader does not wait for its own disk before replicating: when a
// Ready needs a sync, comes from a leader, and changes neither the term nor
// the vote, its messages are sent before the batch is committed, so that
// the followers' writes overlap the leader's (the Raft thesis, §10.2.1).
// This is what etcd raft's contract allows — messages may be sent while
// the same Ready's entries are being persisted, provided the entries of
// earlier Readies are durable (they are: each iteration commits before
// the next) and the latest HardState is too. The HardState a leader has
// not yet persisted differs from the durable one only in its commit
// index, which is not needed for safety: it only ever names entries that
// a quorum already holds, and a restarted leader learns it again. The
// safety argument is the thesis's: the leader's acknowledgement of its
// own entries reaches raft only at Advance, after the sync, so an entry
// commits only once a quorum has it on disk (with or without the leader),
// and a caller's proposal resolves only once it is committed and applied.
// A leader that crashes before its sync loses entries that no quorum
// acknowledged, which raft tolerates like any lost message. Readies of
// followers and candidates (votes, append responses) still wait for the
// sync, and so do snapshots.
//
// Nor does a Ready's apply always wait for its own sync: when every entry
// it commits is already durable on this replica (and on a quorum, being
// committed) and none is a configuration change or snapshot, those
// entries are applied, and their proposers answered, before the Ready's
// new entries are persisted (appliesEarly) — as etcd's server applies
// concurrently with its WAL write. Otherwise a leader's round that learns
// one batch is committed and appends the next would answer the first only
// after syncing the second. What a replica has applied stays within its
// durable log, so a snapshot or a restart never finds the state machine
// ahead of it.
//
// A leader holds back the appends that only carry a new commit index
// when no follower waits for them: every entry they commit was proposed
// on the leader's node and waits for no quorum to apply it. The next
// append to that follower carries the index anyway, and the next tick
// sends what is still held (lazycommit.go). A follower's own proposals
// and quorum-waiting ones are told at once; reads on followers go
// through a ReadIndex, whose heartbeat carries the index.
//
// A leader also defers the appends to the followers its quorum does not
// need — with three replicas, one of the two followers: the one that is
// behind or, among equals, has the greater replica ID; never the one on
// whose node the entries were proposed — for up to Config.DeferAppends
// (10ms), so that this spare follower writes and syncs several entries
// at once instead of contending, once per entry, with the two syncs a
// write waits for (deferappend.go). Heartbeats and everything else go at
// once; an entry still commits only on a quorum's disks.
//
// With Config.FollowProposers a leader counts each 300 ms window's
// proposals by the replica they came from and hands leadership to a voter
// that made most of them (at least 8, and twice as many as all others
// together), no sooner than two windows into its term — a bulk writer
// sooner, within the window (follow.go): a volume written through one
// node's mount is then led from that node, and its writes no longer go
// to another node and back before they are replicated.
//
// A host about to stop hands the groups it leads to their most up-to-date
// voters on other live nodes (Host.HandOff, handoff.go): their writes
// then wait for one election round instead of an election timeout. Its
// batches say it is leaving, so that no peer hands a group back to it.
//
// After sending, a MsgSnap is always followed by ReportSnapshot (finished or
// failed), and a batch the transport refuses makes the host report every
// replica in it unreachable. Raft's storage reads (Entries, Term, ...) only
// ever see durable state: the cached log bounds move when the batch has
// committed.
//
// # Storage
//
// Log entries, hard state and snapshots live under group-prefixed keys
// (keys.go) in one Pebble, which runs without its own WAL: the host's
// journal (journal.go) is its write-ahead log. Every batch the host
// commits is first appended to the journal as one record, synced when the
// round must be durable, and then applied to Pebble's memtable; on open,
// the records after the last batch Pebble flushed are replayed. The
// journal's segment files are written over once they are free, so a sync
// is one fdatasync of a file whose size does not change — measured here at
// about half the time of a synced Pebble commit, which appends to a
// growing WAL and so commits the filesystem's journal too.
//
// The data of entries and snapshots of 2 KiB or more (Config.LargeEntry)
// stays in the journal as blob records that Pebble values reference: a
// volume's file data lives in its log until a snapshot covers it, and in
// Pebble each such entry was copied into the WAL, the memtable and then a
// blob file, half of a replica's CPU for sequential writes; 4 KiB writes
// filled the memtable, whose flushes then slowed the journal's syncs on
// the shared disk. Smaller entries (metadata operations, state machine
// commands) stay in Pebble, where a blob's record and bookkeeping would
// cost more than they save. A segment is
// dropped, or kept to be written over, once nothing references its
// blobs, the truncation that released them is durable and Pebble has
// flushed its batches. Past 16 segments holding log entries, the idle
// groups whose logs reach into the older ones truncate them, after a
// snapshot of at most a segment's size if need be (journalrelief.go):
// a group written once and left idle would otherwise keep a whole
// segment for its few entries. Pebble's blocks are not compressed (file data
// rarely compresses and Snappy cost more CPU than the disk time it saved),
// and what large values remain go to its blob files. The latest durable
// entries of each group (8 MiB) stay in memory in an entry cache, because
// raft reads them back right away — to apply them, to send them to
// followers, for their terms — and a read from Pebble copies and decodes
// each one again; a quiesced group drops its cache. Entries cross the
// network and the disk with as few copies as the formats allow: batches
// and Pebble values are encoded into buffers sized up front, and decoding
// a received batch lets entries' data alias the received bytes
// (msgcodec.go) instead of copying them as protobuf would.
//
// # Batching and coalescing
//
// A round produces at most one Batch per destination node, carrying the
// messages of every group (snapshots travel in batches of their own, so a
// transport can stream them and they never delay heartbeats). Heartbeats
// without a read context are coalesced: each is a small struct (group,
// replicas, term, commit) in the batch rather than a full message, and all
// groups are ticked in the same round, so the heartbeats of a tick between
// two nodes travel together — with 100 active groups on three nodes, a tick
// is six batches of heartbeats and six of responses, not 400 messages.
// They are expanded back into MsgHeartbeat(Resp) on receipt.
//
// # Quiescence
//
// An idle group should cost nothing. A leader whose group has had no
// request for QuiesceAfterTicks ticks, with everything committed and
// applied, every live follower replicating and caught up (a dead one
// too unless it has acknowledged something in the leader's term: one
// added while its node was down has no state, no election timer, and
// only the leader's heartbeats find it when it is back), and no
// configuration or leadership change under way, stops ticking and sends
// its followers a final heartbeat marked Quiesce (with the commit index);
// a follower that agrees (same leader and term, fully caught up, nothing
// pending) stops ticking too. A quiesced group sends nothing. Any message
// but a heartbeat response or a quiesce heartbeat, any local request, or a
// campaign wakes it.
//
// Quiesced followers cannot notice a dead leader by missing heartbeats, so
// the host keeps node liveness instead: every batch counts as a sign of
// life, and a host that has sent nothing to a peer for a third of an
// election timeout sends an empty batch — one ping per node pair, whatever
// the number of groups. When a peer is silent for an election timeout, every
// quiesced group with a replica there wakes, and the usual election (with
// PreVote and CheckQuorum) takes over. A restarted replica wakes its group
// by campaigning (PreVote), which reaches the leader too. A group whose
// only voter is this replica campaigns as soon as it is opened: no one
// else could lead it, so an election timeout would only leave it without
// a leader for a second or two after every restart.
//
// # Requests
//
// Proposals and ReadIndex requests can be dropped silently by raft (no
// leader yet, a forward lost, a leader change). The host keeps every
// request of a local caller until it resolves, and proposes it again every
// RetryTicks, or at once when the replica learns of a new leader.
// Proposals carry a key, recorded in the replicated state with the result
// for a while (five minutes of group time, at most 100,000 keys): a retry
// of an applied proposal is not applied again, and its caller gets the
// first result. Callers that retry across restarts pass their own Key.
//
// Every normal entry carries its proposer's wall time. The group clock —
// the greatest such time applied so far — is the same on every replica and
// never goes backwards; state machines read it as Entry.Time and decide
// time-dependent things (lease expiry, key expiry above) with it, never
// with their local clock.
//
// ReadIndex returns once the local replica applied everything committed
// before the call (raft's ReadOnlySafe: the leader confirms its leadership
// with a quorum first). Reading the state machine after that is
// linearizable, on followers too. Reads that arrive in the same round
// share one ReadIndex.
//
// Membership changes use ConfChangeV2: one change is simple, several (see
// Replace) go through a joint configuration that the group leaves
// automatically, and ChangeMembership returns once it has. Changes are
// checked when they apply, identically on every replica, so a refused
// change never reaches ApplyConfChange (which would panic). A replica
// being added catches up from a snapshot; snapshots are taken by the state
// machine every SnapshotEntries entries once they weigh as much as the
// last snapshot (the log keeps CompactionMargin entries before it), or
// once SnapshotBytes of entry data and four times the last snapshot's size
// were applied (the log keeps half of those entries), and on demand when
// the stored one predates the configuration the new replica is in. With
// Config.BackgroundSnapshots, a state machine that can fork
// (SnapshotForker) has the first two kinds written off the loop, to a
// file of their own that the journal then adopts (bgsnapshot.go): a large
// state no longer stalls every group of the host while it is written.
//
// # State machines
//
// StateMachine is the raw interface (Apply a run of entries, Snapshot,
// Restore); the volume filesystem implements it. Typed is a StateMachine
// in the style of the seed design: messages are registered Go values
// (protobuf or JSON), Set proposes one and returns once a quorum of voters
// has applied it (replicas acknowledge applied indexes to the proposer),
// and appliers added with Use see every message. Typed is a
// SnapshotForker: appliers that are ForkingSnapshotters are forked, the
// other Snapshotters snapshotted at the fork, on the loop. Typed also keeps locks:
// a lease's fencing token is the index of the entry that granted it, so
// tokens of successive holders strictly increase, and a lease expires TTL
// after the group time of its last grant or renewal; SetFenced applies a
// message only while the caller's lease is still the current one.
//
// # Testing
//
// Package raftgrouptest runs hosts deterministically — an in-memory
// network whose loss, delay and partitions the test controls, manual
// clocks and ticks, crashes that keep exactly what was synced, and every
// random choice, Raft's election timeouts included, drawn from one seed
// (Config.Deterministic keeps the hosts' own work on their loops), so
// that a seed replays its run exactly (TestSeedReplays) — and the
// tests here check elections, replication, catch-up by log and by
// snapshot, partitions, leader loss mid-stream, membership changes,
// quiescence, coalescing, locks, and (with porcupine) the linearizability
// of a compare-and-swap store under all of those faults at once.
package raftgroup
