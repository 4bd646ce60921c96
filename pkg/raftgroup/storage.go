package raftgroup

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// groupStorage is one group's raft.Storage over the node's shared Pebble.
//
// It reads only what is durable (committed to Pebble); the write side
// stages a Ready into the round's shared batch (stage) and updates the
// cached bounds once that batch committed (the returned closure). All
// methods run on the host loop: no locking.
type groupStorage struct {
	db *pebble.DB
	ks keyspace
	g  GroupID
	// jnl holds the data of entries of at least large bytes (large <= 0:
	// none) and of large snapshots.
	jnl   *journal
	large int

	// Cached durable state.
	hs       *pb.HardState
	trunc    truncState // entries up to trunc.index are gone (in a snapshot)
	last     uint64     // last durable log index (trunc.index if the log is empty)
	lastTerm uint64
	// snap is the metadata of the latest stored snapshot (nil: none).
	snap *pb.SnapshotMetadata
	// hasSnap is set once snap is: Host.Serves reads it off the loop.
	hasSnap atomic.Bool
	// cache holds the latest durable entries, in order and ending at last:
	// raft reads entries back soon after they are written (to apply them,
	// to send them to a follower) and asks for terms, and a read from
	// Pebble copies and decodes each entry again.
	cache entryCache

	// snapshotFor, set by the group, returns a snapshot for raft to send.
	snapshotFor func() (*pb.Snapshot, error)

	// confWatch holds the indexes of the configuration changes in the log
	// above the durable commit index, ascending; up to unsureUpTo (the last
	// index when the storage was loaded) the log may hold others not
	// looked for. See commitMustPersist.
	confWatch  []uint64
	unsureUpTo uint64
}

type truncState struct{ index, term uint64 }

func (t truncState) encode() []byte {
	b := binary.BigEndian.AppendUint64(nil, t.index)
	return binary.BigEndian.AppendUint64(b, t.term)
}

func decodeTrunc(b []byte) (truncState, error) {
	if len(b) != 16 {
		return truncState{}, fmt.Errorf("truncated state: %d bytes", len(b))
	}
	return truncState{binary.BigEndian.Uint64(b), binary.BigEndian.Uint64(b[8:])}, nil
}

// get reads a key; nil if absent.
func get(db pebble.Reader, key []byte) ([]byte, error) {
	v, closer, err := db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := append([]byte(nil), v...)
	return out, closer.Close()
}

// loadStorage reads a group's durable raft state. Every entry of the log
// is visited to report its references to the journal.
func loadStorage(db *pebble.DB, ks keyspace, g GroupID, jnl *journal, large int) (*groupStorage, error) {
	s := &groupStorage{db: db, ks: ks, g: g, jnl: jnl, large: large}
	v, err := get(db, ks.groupKey(g, sufHardState))
	if err != nil {
		return nil, err
	}
	if v != nil {
		s.hs = &pb.HardState{}
		if err := proto.Unmarshal(v, s.hs); err != nil {
			return nil, fmt.Errorf("group %d: hard state: %w", g, err)
		}
	}
	if v, err = get(db, ks.groupKey(g, sufTruncated)); err != nil {
		return nil, err
	} else if v != nil {
		if s.trunc, err = decodeTrunc(v); err != nil {
			return nil, fmt.Errorf("group %d: %w", g, err)
		}
	}
	// NB: only the metadata: openGroup reads the data to restore from.
	snap, ref, err := s.readSnapshot(false)
	if err != nil {
		return nil, err
	}
	if ref != nil {
		jnl.setSnapshot(g, ref.seg)
	}
	if snap != nil {
		s.setSnap(snap.GetMetadata())
	}
	s.last, s.lastTerm = s.trunc.index, s.trunc.term
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: ks.logKey(g, 0), UpperBound: ks.logEnd(g)})
	if err != nil {
		return nil, err
	}
	for valid := it.First(); valid; valid = it.Next() {
		ref, _, err := splitRef(it.Value())
		if err != nil {
			it.Close()
			return nil, fmt.Errorf("group %d: entry: %w", g, err)
		}
		if ref != nil {
			jnl.addRef(g, ks.parseLogIndex(it.Key()), ref.seg)
		}
	}
	if it.Last() {
		e, _, err := decodeStored(bytes.Clone(it.Value()))
		if err != nil {
			it.Close()
			return nil, fmt.Errorf("group %d: entry: %w", g, err)
		}
		if e.GetIndex() > s.last {
			s.last, s.lastTerm = e.GetIndex(), e.GetTerm()
		}
	}
	if err := it.Close(); err != nil {
		return nil, err
	}
	// NB: a snapshot is committed by definition. The hard state is written
	// before any snapshot that covers it and Pebble recovers a prefix of its
	// WAL, so this only guards against hand-edited state.
	if s.snap != nil && s.hs != nil && s.hs.GetCommit() < s.snap.GetIndex() {
		s.hs.Commit = new(s.snap.GetIndex())
	}
	s.unsureUpTo = s.last
	return s, nil
}

// commitMustPersist reports whether rd's hard state must be written, and
// synced, although only its commit index changed: the new commit index
// covers a configuration change above the durable one. Otherwise a commit
// index alone is not written (see stage), and a replica restarting
// would go back to the configuration of its last durable commit index,
// which may be several changes old. A restarted leader that had committed
// the change removing a member, and told that member (which then fell
// silent once the other voters said they knew, see retiring.go), could
// then need that member's vote under its old configuration while the
// others need its own — its log being the longest — and the group would
// have no leader for good. So such a
// Ready's commit index is made durable before it is applied or sent
// (sendsEarly).
func (s *groupStorage) commitMustPersist(rd *raft.Ready) bool {
	hs := rd.HardState
	if raft.IsEmptyHardState(hs) {
		return false
	}
	durable := s.durableCommit()
	c := hs.GetCommit()
	if c <= durable {
		return false
	}
	if durable < s.unsureUpTo || len(s.confWatch) > 0 && s.confWatch[0] <= c {
		return true
	}
	for _, e := range rd.Entries {
		if e.GetIndex() > c {
			break
		}
		if isConfChange(e) {
			return true
		}
	}
	return false
}

// durableCommit is the commit index a restart would find: the stored hard
// state's, or the stored snapshot's if greater.
func (s *groupStorage) durableCommit() uint64 {
	return max(s.hs.GetCommit(), s.snap.GetIndex())
}

// isConfChange reports whether e changes the group's configuration.
func isConfChange(e *pb.Entry) bool {
	t := e.GetType()
	return t == pb.EntryConfChange || t == pb.EntryConfChangeV2
}

// watchConf is the configuration changes to watch after a Ready's writes:
// those above the commit index made durable (hsCommit) among the
// previous ones, less those its entries overwrote, and its own.
func (s *groupStorage) watchConf(rd *raft.Ready, snap bool, hsCommit uint64) []uint64 {
	w := s.confWatch
	if snap {
		w = nil
	}
	if len(rd.Entries) > 0 {
		first := rd.Entries[0].GetIndex()
		w = slices.DeleteFunc(slices.Clone(w), func(i uint64) bool { return i >= first })
		for _, e := range rd.Entries {
			if isConfChange(e) {
				w = append(w, e.GetIndex())
			}
		}
	}
	return slices.DeleteFunc(w, func(i uint64) bool { return i <= hsCommit })
}

func (s *groupStorage) loadSnapshot() (*pb.Snapshot, error) {
	snap, _, err := s.readSnapshot(true)
	return snap, err
}

// readSnapshot reads the stored snapshot (nil: none) and, when its data is
// in a segment, the reference to it; withData also reads that data.
func (s *groupStorage) readSnapshot(withData bool) (*pb.Snapshot, *segmentRef, error) {
	v, err := get(s.db, s.ks.groupKey(s.g, sufSnapshot))
	if err != nil || v == nil {
		return nil, nil, err
	}
	ref, body, err := splitRef(v)
	if err != nil {
		return nil, nil, fmt.Errorf("group %d: snapshot: %w", s.g, err)
	}
	snap := &pb.Snapshot{}
	if err := proto.Unmarshal(body, snap); err != nil {
		return nil, nil, fmt.Errorf("group %d: snapshot: %w", s.g, err)
	}
	if ref != nil && withData {
		if snap.Data, err = s.readRef(ref); err != nil {
			return nil, nil, fmt.Errorf("group %d: snapshot: %w", s.g, err)
		}
	}
	return pb.EnsureSnapshot(snap), ref, nil
}

// setSnapshot adds snap to b as the group's stored snapshot. Large data
// goes to the journal as a blob (which the journal syncs before b).
func (s *groupStorage) setSnapshot(b *pebble.Batch, snap *pb.Snapshot) error {
	key := s.ks.groupKey(s.g, sufSnapshot)
	if s.large <= 0 || len(snap.GetData()) < s.large {
		data, err := proto.Marshal(snap)
		if err != nil {
			return err
		}
		return b.Set(key, data, nil)
	}
	ref, err := s.jnl.blob(snap.GetData())
	if err != nil {
		return err
	}
	return s.setSnapshotRef(b, ref, snap.GetMetadata())
}

// setSnapshotRef adds to b, as the group's stored snapshot, one whose
// data is the journal's blob at ref.
func (s *groupStorage) setSnapshotRef(b *pebble.Batch, ref segmentRef, meta *pb.SnapshotMetadata) error {
	s.jnl.setSnapshot(s.g, ref.seg)
	v, err := proto.MarshalOptions{}.MarshalAppend(ref.header(), &pb.Snapshot{Metadata: meta})
	if err != nil {
		return err
	}
	return b.Set(s.ks.groupKey(s.g, sufSnapshot), v, nil)
}

// InitialState implements raft.Storage.
func (s *groupStorage) InitialState() (*pb.HardState, *pb.ConfState, error) {
	var hs *pb.HardState
	if s.hs != nil {
		hs = proto.Clone(s.hs).(*pb.HardState)
	}
	cs := &pb.ConfState{}
	if s.snap != nil && s.snap.GetConfState() != nil {
		cs = proto.Clone(s.snap.GetConfState()).(*pb.ConfState)
	}
	return hs, pb.EnsureConfState(cs), nil
}

// Entries implements raft.Storage.
func (s *groupStorage) Entries(lo, hi, maxSize uint64) ([]*pb.Entry, error) {
	if lo <= s.trunc.index {
		return nil, raft.ErrCompacted
	}
	if hi > s.last+1 {
		return nil, fmt.Errorf("group %d: entries [%d,%d) beyond last index %d: %w", s.g, lo, hi, s.last, raft.ErrUnavailable)
	}
	if lo >= hi {
		return nil, nil
	}
	if out, ok := s.cache.slice(lo, hi, maxSize, true); ok {
		return out, nil
	}
	// NB: only the part before the cache is read from Pebble; the cached
	// rest follows if the size limit leaves room.
	end := hi
	if first := s.cache.first(); first > lo && first < hi {
		end = first
	}
	out, size, err := s.readEntries(lo, end, maxSize)
	if err != nil || end == hi || uint64(len(out)) < end-lo || size >= maxSize {
		return out, err // done, or stopped by the size limit
	}
	more, _ := s.cache.slice(end, hi, maxSize-size, false)
	return append(out, more...), nil
}

// readEntries reads entries [lo, hi) from Pebble, at most maxSize bytes of
// them but at least one, and returns them with their size.
func (s *groupStorage) readEntries(lo, hi, maxSize uint64) ([]*pb.Entry, uint64, error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: s.ks.logKey(s.g, lo), UpperBound: s.ks.logKey(s.g, hi)})
	if err != nil {
		return nil, 0, err
	}
	defer it.Close()
	var (
		out  []*pb.Entry
		size uint64
		next = lo
	)
	for valid := it.First(); valid; valid = it.Next() {
		// NB: an entry is stored as its encoding (or a reference to its data
		// and the rest of it), so its size is known before its data is read
		// or decoded: the limit is checked first.
		v := it.Value()
		n := uint64(len(v))
		ref, body, err := splitRef(v)
		if err != nil {
			return nil, 0, fmt.Errorf("group %d: entry: %w", s.g, err)
		}
		if ref != nil {
			n += ref.n
		}
		if len(out) > 0 && size+n > maxSize {
			break
		}
		e, err := decodeEntry(bytes.Clone(body))
		if err == nil && ref != nil {
			e.Data, err = s.readRef(ref)
		}
		if err != nil {
			return nil, 0, fmt.Errorf("group %d: entry: %w", s.g, err)
		}
		if e.GetIndex() != next {
			return nil, 0, fmt.Errorf("group %d: log gap at %d (found %d): %w", s.g, next, e.GetIndex(), raft.ErrUnavailable)
		}
		size += n
		out = append(out, e)
		next++
	}
	if err := it.Error(); err != nil {
		return nil, 0, err
	}
	if len(out) == 0 {
		return nil, 0, fmt.Errorf("group %d: entry %d missing: %w", s.g, lo, raft.ErrUnavailable)
	}
	return out, size, nil
}

// Term implements raft.Storage.
func (s *groupStorage) Term(i uint64) (uint64, error) {
	switch {
	case i == s.trunc.index:
		return s.trunc.term, nil
	case i < s.trunc.index:
		return 0, raft.ErrCompacted
	case i > s.last:
		return 0, raft.ErrUnavailable
	case i == s.last:
		return s.lastTerm, nil
	}
	if t, ok := s.cache.term(i); ok {
		return t, nil
	}
	v, err := get(s.db, s.ks.logKey(s.g, i))
	if err != nil {
		return 0, err
	}
	if v == nil {
		return 0, raft.ErrUnavailable
	}
	e, _, err := decodeStored(v)
	if err != nil {
		return 0, err
	}
	return e.GetTerm(), nil
}

// LastIndex implements raft.Storage.
func (s *groupStorage) LastIndex() (uint64, error) { return s.last, nil }

// FirstIndex implements raft.Storage.
func (s *groupStorage) FirstIndex() (uint64, error) { return s.trunc.index + 1, nil }

// Snapshot implements raft.Storage: raft asks for one to send to a
// follower that needs entries the log no longer has.
func (s *groupStorage) Snapshot() (*pb.Snapshot, error) {
	if s.snapshotFor != nil {
		return s.snapshotFor()
	}
	snap, err := s.loadSnapshot()
	if err != nil {
		return nil, err
	}
	if snap == nil {
		return nil, raft.ErrSnapshotTemporarilyUnavailable
	}
	return snap, nil
}

// stage adds a Ready's durable parts (snapshot, entries, hard state) to
// the round's batch and returns the cache update to run once the batch
// committed. persistCommit is commitMustPersist's answer for rd, judged
// once per Ready by the host, which also decides its send and its sync by
// it.
func (s *groupStorage) stage(b *pebble.Batch, rd *raft.Ready, persistCommit bool) (func(), error) {
	trunc, last, lastTerm := s.trunc, s.last, s.lastTerm
	var snapMeta *pb.SnapshotMetadata
	if !raft.IsEmptySnap(rd.Snapshot) {
		// The snapshot replaces the whole log: raft only hands one over when
		// the log does not match it.
		m := rd.Snapshot.GetMetadata()
		if err := b.DeleteRange(s.ks.logKey(s.g, 0), s.ks.logEnd(s.g), nil); err != nil {
			return nil, err
		}
		// NB: before the snapshot and the entries below add theirs; the
		// whole log goes in this synced batch, and segments are removed only
		// once Pebble flushed it.
		s.jnl.dropGroup(s.g)
		if err := s.setSnapshot(b, rd.Snapshot); err != nil {
			return nil, err
		}
		trunc = truncState{m.GetIndex(), m.GetTerm()}
		if err := b.Set(s.ks.groupKey(s.g, sufTruncated), trunc.encode(), nil); err != nil {
			return nil, err
		}
		last, lastTerm = trunc.index, trunc.term
		snapMeta = proto.Clone(m).(*pb.SnapshotMetadata)
	}
	var fresh []*pb.Entry // the entries written, for the cache
	if n := len(rd.Entries); n > 0 {
		first := rd.Entries[0].GetIndex()
		if first > last+1 {
			return nil, fmt.Errorf("group %d: appending at %d leaves a gap after %d", s.g, first, last)
		}
		for _, e := range rd.Entries {
			if e.GetIndex() <= trunc.index {
				continue
			}
			key := s.ks.logKey(s.g, e.GetIndex())
			if s.large > 0 && len(e.GetData()) >= s.large {
				ref, err := s.jnl.appendEntry(s.g, e.GetIndex(), e.GetData())
				if err != nil {
					return nil, err
				}
				if err := setRefEntry(b, key, e, ref); err != nil {
					return nil, err
				}
			} else if err := setEntry(b, key, e); err != nil {
				return nil, err
			}
			fresh = append(fresh, e)
		}
		newLast := rd.Entries[n-1].GetIndex()
		if newLast < last {
			// A new leader overwrote our tail: the rest of it is gone too.
			if err := b.DeleteRange(s.ks.logKey(s.g, newLast+1), s.ks.logKey(s.g, last+1), nil); err != nil {
				return nil, err
			}
		}
		if newLast > trunc.index {
			last, lastTerm = newLast, rd.Entries[n-1].GetTerm()
		}
	}
	var hs *pb.HardState
	// NB: a HardState whose term and vote did not change is not written: of
	// its commit index raft needs no durable copy (a restarted replica
	// learns it again from its leader, and loadStorage never reports one
	// below the stored snapshot), and writing it cost every replica a
	// journal record and a Pebble write for every commit it heard of —
	// unless it commits a configuration change (commitMustPersist).
	if newHS := rd.HardState; !raft.IsEmptyHardState(newHS) && (s.hs == nil || newHS.GetTerm() != s.hs.GetTerm() || newHS.GetVote() != s.hs.GetVote() || persistCommit) {
		hs = proto.Clone(newHS).(*pb.HardState)
		data, err := proto.Marshal(hs)
		if err != nil {
			return nil, err
		}
		if err := b.Set(s.ks.groupKey(s.g, sufHardState), data, nil); err != nil {
			return nil, err
		}
	}
	durable := max(s.durableCommit(), snapMeta.GetIndex())
	if hs != nil {
		durable = max(durable, hs.GetCommit())
	}
	watch := s.watchConf(rd, snapMeta != nil, durable)
	return func() {
		s.confWatch = watch
		if durable >= s.unsureUpTo {
			s.unsureUpTo = 0
		}
		s.trunc, s.last, s.lastTerm = trunc, last, lastTerm
		if snapMeta != nil {
			s.setSnap(snapMeta)
			s.cache.reset()
		}
		if hs != nil {
			s.hs = hs
		}
		s.cache.add(fresh)
	}, nil
}

// setEntry adds entry e at key to b, encoded straight into the batch.
func setEntry(b *pebble.Batch, key []byte, e *pb.Entry) error {
	n := proto.Size(e)
	op := b.SetDeferred(len(key), n)
	copy(op.Key, key)
	v, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(op.Value[:0], e)
	if err != nil {
		return err
	}
	if len(v) != n || n > 0 && &v[0] != &op.Value[0] {
		return fmt.Errorf("raftgroup: entry %d changed while it was encoded", e.GetIndex())
	}
	return op.Finish()
}

// stageSnapshot stores snap as the group's latest snapshot.
func (s *groupStorage) stageSnapshot(b *pebble.Batch, snap *pb.Snapshot) (func(), error) {
	if err := s.setSnapshot(b, snap); err != nil {
		return nil, err
	}
	return s.snapshotStaged(snap.GetMetadata()), nil
}

// stageSnapshotStream is stageSnapshot for a snapshot of at least large
// bytes whose data (n bytes, checksum crc) write streams into the
// journal (journal.streamBlob).
func (s *groupStorage) stageSnapshotStream(b *pebble.Batch, meta *pb.SnapshotMetadata, n int, crc uint32, write func(io.Writer) error) (func(), error) {
	ref, err := s.jnl.streamBlob(n, crc, write)
	if err != nil {
		return nil, err
	}
	return s.stageSnapshotRef(b, ref, meta)
}

// stageSnapshotRef stores, as the group's latest snapshot, one whose data
// is already in the journal at ref.
func (s *groupStorage) stageSnapshotRef(b *pebble.Batch, ref segmentRef, meta *pb.SnapshotMetadata) (func(), error) {
	if err := s.setSnapshotRef(b, ref, meta); err != nil {
		return nil, err
	}
	return s.snapshotStaged(meta), nil
}

// snapshotStaged is the commit of a staged snapshot: it becomes the
// group's latest once its batch is written.
func (s *groupStorage) snapshotStaged(meta *pb.SnapshotMetadata) func() {
	meta = proto.Clone(meta).(*pb.SnapshotMetadata)
	return func() { s.setSnap(meta) }
}

// setSnap records meta as the latest stored snapshot.
func (s *groupStorage) setSnap(meta *pb.SnapshotMetadata) {
	s.snap = meta
	s.hasSnap.Store(true)
}

// stageCompact drops the log up to and including index (which must be
// covered by the stored snapshot).
func (s *groupStorage) stageCompact(b *pebble.Batch, index uint64) (func(), error) {
	if index <= s.trunc.index {
		return func() {}, nil
	}
	if s.snap == nil || index > s.snap.GetIndex() || index > s.last {
		return nil, fmt.Errorf("group %d: compacting to %d beyond the snapshot", s.g, index)
	}
	term, err := s.Term(index)
	if err != nil {
		return nil, err
	}
	if err := b.DeleteRange(s.ks.logKey(s.g, 0), s.ks.logKey(s.g, index+1), nil); err != nil {
		return nil, err
	}
	t := truncState{index, term}
	if err := b.Set(s.ks.groupKey(s.g, sufTruncated), t.encode(), nil); err != nil {
		return nil, err
	}
	return func() {
		s.trunc = t
		s.cache.dropTo(index)
		if s.jnl.release(s.g, index) {
			// The commit closure runs once b is written (maybeCompact).
			s.jnl.releasedWritten()
		}
	}, nil
}

// readRef reads data the journal holds.
func (s *groupStorage) readRef(ref *segmentRef) ([]byte, error) {
	return s.jnl.read(*ref)
}
