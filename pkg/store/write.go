package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/containerd/errdefs"

	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/mst"
)

type opKind int

const (
	opPut opKind = iota
	opDelete
	opMerge
	opPurge
)

type writeReq struct {
	op     opKind
	key    string
	fields map[string]crdt.Value // opPut
	names  []string              // opDelete; empty deletes the document
	remote crdt.Doc              // opMerge
	purge  func(crdt.Doc) bool   // opPurge: whether to forget the document
	res    chan WriteResult
}

// WriteResult reports one write.
type WriteResult struct {
	// Rev is the revision of the change, or the current revision when the
	// write changed nothing.
	Rev uint64
	// Record is the document after the write.
	Record Record
	// Changed is false when the write was already reflected (a repeated
	// merge, a delete of something absent).
	Changed bool
	// Existed reports whether the document (for Delete: any of the named
	// fields) existed before the write.
	Existed bool
	Err     error
}

// Put sets fields of the document at key, creating it if needed, and
// returns once the change is durable.
func (s *Store) Put(ctx context.Context, key string, fields map[string]crdt.Value) (WriteResult, error) {
	if err := ValidateKey(key); err != nil {
		return WriteResult{}, err
	}
	if len(fields) == 0 {
		return WriteResult{}, fmt.Errorf("put %s: no fields: %w", key, errdefs.ErrInvalidArgument)
	}
	if len(fields) > crdt.MaxFields {
		return WriteResult{}, fmt.Errorf("put %s: %d fields, limit %d: %w", key, len(fields), crdt.MaxFields, errdefs.ErrInvalidArgument)
	}
	for name, v := range fields {
		if err := ValidateFieldName(name); err != nil {
			return WriteResult{}, err
		}
		if err := v.Validate(); err != nil {
			return WriteResult{}, fmt.Errorf("field %q: %v: %w", name, err, errdefs.ErrInvalidArgument)
		}
		if len(v.Data) > crdt.MaxDocSize {
			return WriteResult{}, fmt.Errorf("field %q is %d bytes, documents are limited to %d: %w", name, len(v.Data), crdt.MaxDocSize, errdefs.ErrInvalidArgument)
		}
	}
	return s.submit(ctx, &writeReq{op: opPut, key: key, fields: fields})
}

// Delete deletes the named fields of the document at key, or the whole
// document when names is empty.
func (s *Store) Delete(ctx context.Context, key string, names []string) (WriteResult, error) {
	if err := ValidateKey(key); err != nil {
		return WriteResult{}, err
	}
	for _, name := range names {
		if err := ValidateFieldName(name); err != nil {
			return WriteResult{}, err
		}
	}
	return s.submit(ctx, &writeReq{op: opDelete, key: key, names: names})
}

// Merge merges a document received from a peer. Its stamps advance the
// local clock; a document stamped beyond the max clock skew is rejected
// with an error wrapping hlc.ErrSkew and counted.
func (s *Store) Merge(ctx context.Context, key string, remote crdt.Doc) (WriteResult, error) {
	if err := ValidateKey(key); err != nil {
		return WriteResult{}, err
	}
	if err := s.observe(remote); err != nil {
		s.stats.skewRejected.Add(1)
		return WriteResult{}, fmt.Errorf("merge %s: %w", key, err)
	}
	return s.submit(ctx, &writeReq{op: opMerge, key: key, remote: remote})
}

// observe checks every stamp of a remote document against the clock. The
// newest stamp decides: if it is within the skew bound, all are.
func (s *Store) observe(d crdt.Doc) error {
	if err := s.clock.Observe(d.MaxStamp().TS); err != nil {
		return fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	}
	return nil
}

func (s *Store) submit(ctx context.Context, r *writeReq) (WriteResult, error) {
	r.res = make(chan WriteResult, 1)
	select {
	case s.reqs <- r:
	case <-s.closing:
		return WriteResult{}, ErrClosed
	case <-ctx.Done():
		return WriteResult{}, ctx.Err()
	}
	// NB: once queued, the write happens whether or not the caller waits,
	// so the caller must not assume a cancelled write did not apply.
	select {
	case res := <-r.res:
		return res, res.Err
	case <-ctx.Done():
		return WriteResult{}, ctx.Err()
	}
}

// run is the committer loop: the only goroutine that writes. It applies a
// group and moves on to the next while the syncer waits for the first
// group's fsync: preparing group N+1 overlaps the WAL sync of group N.
func (s *Store) run() {
	syncDone := make(chan struct{})
	go func() { s.syncer(); close(syncDone) }()
	defer func() {
		close(s.syncq)
		<-syncDone
		close(s.done)
	}()
	for {
		select {
		case r := <-s.reqs:
			group := []*writeReq{r}
		drain:
			for len(group) < s.opts.MaxGroup {
				select {
				case r := <-s.reqs:
					group = append(group, r)
				default:
					break drain
				}
			}
			s.commitGroup(group)
		case <-s.repairs:
			if err := s.rebuildIndex(); err != nil {
				s.log.Error("rebuild index", "err", err)
			}
		case <-s.closing:
			for {
				select {
				case r := <-s.reqs:
					r.res <- WriteResult{Err: ErrClosed}
				default:
					return
				}
			}
		}
	}
}

// inflight is a group applied to Pebble whose WAL sync the syncer awaits
// before it publishes the new state and answers the writers.
type inflight struct {
	batch   *pebble.Batch // nil when the group changed nothing
	group   []*writeReq
	results []WriteResult
	next    pending
	changed int
	start   time.Time
	barrier chan struct{} // set for drainSync's marker instead of a group
}

// pending is the committer's view of the state: what the last applied
// group left, durable or not yet.
type pending struct {
	rev    uint64
	st     committed
	oldest uint64
}

// syncer completes groups in the order they were applied.
func (s *Store) syncer() {
	for inf := range s.syncq {
		if inf.barrier != nil {
			close(inf.barrier)
			continue
		}
		if inf.batch != nil {
			err := inf.batch.SyncWait()
			inf.batch.Close()
			if err != nil {
				// A failed WAL sync leaves the database in an unknown state:
				// refuse every later write rather than acknowledge it.
				s.log.Error("wal sync failed; the store refuses further writes", "err", err)
				s.broken.Store(&err)
				for _, r := range inf.group {
					r.res <- WriteResult{Err: fmt.Errorf("commit: %w: %w", err, errdefs.ErrDataLoss)}
				}
				continue
			}
		}
		if inf.changed > 0 {
			s.stats.observeCommit(time.Since(inf.start), inf.changed)
			st := inf.next.st
			s.oldest.Store(inf.next.oldest)
			s.state.Store(&st)
			s.rev.Store(inf.next.rev)
			s.broadcast()
		}
		for i, r := range inf.group {
			r.res <- inf.results[i]
		}
	}
}

// drainSync waits until every group applied so far is synced and
// published.
func (s *Store) drainSync() {
	done := make(chan struct{})
	s.syncq <- &inflight{barrier: done}
	<-done
}

// commitGroup applies a group of writes, repairing the index and retrying
// once if it turns out to be damaged, and hands it to the syncer.
func (s *Store) commitGroup(group []*writeReq) {
	inf, err := s.tryCommit(group)
	if errors.Is(err, mst.ErrCorruptNode) || errors.Is(err, mst.ErrNodeNotFound) {
		s.stats.corruptNodes.Add(1)
		s.log.Error("index damaged; rebuilding from documents", "err", err)
		if rerr := s.rebuildIndex(); rerr != nil {
			err = fmt.Errorf("%w (rebuild failed: %v)", err, rerr)
		} else {
			inf, err = s.tryCommit(group)
		}
	}
	if err != nil {
		for _, r := range group {
			r.res <- WriteResult{Err: fmt.Errorf("commit: %w", err)}
		}
		return
	}
	// NB: even a group that changed nothing goes through the syncer, so a
	// "nothing to do" answer never overtakes the sync of the write it saw.
	s.syncq <- inf
}

// tryCommit applies a group to the tree and to Pebble as one batch without
// waiting for its sync. On a group-wide error nothing is written and the
// tree is rolled back; per-write errors (a document that would grow too
// large) fail only that write.
func (s *Store) tryCommit(group []*writeReq) (_ *inflight, err error) {
	if p := s.broken.Load(); p != nil {
		return nil, fmt.Errorf("store failed earlier: %w: %w", *p, errdefs.ErrDataLoss)
	}
	next := s.next
	st, rev := &next.st, next.rev
	overlay := make(map[string]Record, len(group))
	inf := &inflight{group: group, results: make([]WriteResult, len(group)), start: time.Now()}
	results := inf.results
	b := s.db.NewBatch()
	defer func() {
		if err != nil {
			s.tree.Rollback()
			b.Close()
		}
	}()
	changed := 0
	for i, r := range group {
		cur, ok := overlay[r.key]
		if !ok {
			cur, err = s.readRecord(r.key)
			if errors.Is(err, crdt.ErrCorrupt) {
				results[i] = WriteResult{Err: fmt.Errorf("document %s is corrupt on disk: %w", r.key, errdefs.ErrDataLoss)}
				err = nil
				continue
			}
			if err != nil {
				return nil, err
			}
		}
		if r.op == opPurge {
			purged, err := s.purge(b, st, r, cur)
			if err != nil {
				return nil, err
			}
			if purged {
				overlay[r.key] = Record{Key: r.key}
				changed++
			}
			results[i] = WriteResult{Rev: rev, Changed: purged, Existed: cur.Doc.Exists()}
			continue
		}
		delta, existed := s.delta(r, cur.Doc)
		merged := crdt.Merge(cur.Doc, delta)
		if crdt.Equal(merged, cur.Doc) {
			results[i] = WriteResult{Rev: rev, Record: cur, Existed: existed}
			continue
		}
		if len(merged.Fields) > crdt.MaxFields {
			results[i] = WriteResult{Err: fmt.Errorf("document %s would have %d fields (tombstones included), limit %d: %w", r.key, len(merged.Fields), crdt.MaxFields, errdefs.ErrInvalidArgument)}
			continue
		}
		enc := merged.Marshal()
		if len(enc) > crdt.MaxDocSize {
			results[i] = WriteResult{Err: fmt.Errorf("document %s would be %d bytes, limit %d: %w", r.key, len(enc), crdt.MaxDocSize, errdefs.ErrInvalidArgument)}
			continue
		}
		if !cur.Doc.IsEmpty() {
			if _, err := s.tree.Delete(IndexKey(cur.Doc, r.key)); err != nil {
				return nil, err
			}
		}
		digest := merged.Digest()
		if err := s.tree.Put(IndexKey(merged, r.key), digest[:]); err != nil {
			return nil, err
		}
		countDoc(st, cur.Doc, -1)
		countDoc(st, merged, +1)
		rev++
		changed++
		rec := Record{Key: r.key, Rev: rev, Doc: merged}
		overlay[r.key] = rec
		b.Set(docKey(r.key), encodeRecord(rev, enc), nil)
		b.Set(changeKey(rev), encodeChange(r.key, enc), nil)
		results[i] = WriteResult{Rev: rev, Record: rec, Changed: true, Existed: existed}
	}
	if changed == 0 {
		b.Close()
		return inf, nil
	}
	ch, err := s.tree.Commit()
	if err != nil {
		return nil, err
	}
	for _, n := range ch.Added {
		b.Set(nodeKey(n.Hash), n.Data, nil)
	}
	for _, h := range ch.Removed {
		b.Delete(nodeKey(h), nil)
	}
	st.root = ch.Root
	b.Set(keyRoot, st.root[:], nil)
	b.Set(keyRev, u64(rev), nil)
	b.Set(keyHLC, s.clock.Last().AppendBinary(nil), nil)
	b.Set(keyLive, u64(st.live), nil)
	b.Set(keyTombstones, u64(st.tombstones), nil)
	// Trim the change log in steps rather than every commit, so the range
	// deletions stay few.
	if keep := s.opts.WatchHistory; rev >= next.oldest+keep+keep/8 {
		newOldest := rev - keep + 1
		b.DeleteRange(changeKey(next.oldest), changeKey(newOldest), nil)
		b.Set(keyOldest, u64(newOldest), nil)
		next.oldest = newOldest
	}
	next.rev = rev
	if err := s.db.ApplyNoSyncWait(b, pebble.Sync); err != nil {
		// The tree already committed in memory; reopen it at the last
		// applied root so it matches the database again.
		s.tree = s.openTree(s.next.st.root)
		return nil, fmt.Errorf("pebble apply: %w", err)
	}
	s.next = next
	inf.batch, inf.next, inf.changed = b, next, changed
	return inf, nil
}

// purge forgets a document entirely (no tombstone left, no change logged)
// if r.purge says so.
func (s *Store) purge(b *pebble.Batch, st *committed, r *writeReq, cur Record) (bool, error) {
	d := cur.Doc
	if d.IsEmpty() || !r.purge(d) {
		return false, nil
	}
	if _, err := s.tree.Delete(IndexKey(d, r.key)); err != nil {
		return false, err
	}
	countDoc(st, d, -1)
	b.Delete(docKey(r.key), nil)
	return true, nil
}

// Purge forgets entirely the documents among keys for which forget
// returns true, judged by the committer on their current state (so a write
// racing the purge is never lost to a stale judgement). It serves
// tombstone garbage collection, and a node that was away longer than the
// tombstone retention dropping what it may hold stale. A purge is not a
// change: watchers see nothing and the revision stays.
func (s *Store) Purge(ctx context.Context, keys []string, forget func(crdt.Doc) bool) (int, error) {
	reqs := make([]*writeReq, 0, len(keys))
	for _, k := range keys {
		r := &writeReq{op: opPurge, key: k, purge: forget, res: make(chan WriteResult, 1)}
		select {
		case s.reqs <- r:
			reqs = append(reqs, r)
		case <-s.closing:
			return 0, ErrClosed
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	n := 0
	for _, r := range reqs {
		select {
		case res := <-r.res:
			if res.Err != nil {
				return n, res.Err
			}
			if res.Changed {
				n++
			}
		case <-ctx.Done():
			return n, ctx.Err()
		}
	}
	return n, nil
}

// delta turns a request into the document delta it merges, and reports
// whether its target existed.
func (s *Store) delta(r *writeReq, cur crdt.Doc) (crdt.Doc, bool) {
	live := cur.Live()
	switch r.op {
	case opPut:
		return crdt.Set(r.fields, s.stamp()), len(live) > 0
	case opDelete:
		if len(r.names) == 0 {
			if len(live) == 0 {
				return crdt.Doc{}, false
			}
			return crdt.DeleteDoc(s.stamp()), true
		}
		var present []string
		for _, n := range r.names {
			if _, ok := live[n]; ok {
				present = append(present, n)
			}
		}
		if len(present) == 0 {
			return crdt.Doc{}, false
		}
		return crdt.DeleteFields(present, s.stamp()), true
	default:
		return r.remote, len(live) > 0
	}
}

func (s *Store) stamp() crdt.Stamp { return crdt.Stamp{TS: s.clock.Now(), Node: s.nodeID} }

func countDoc(st *committed, d crdt.Doc, sign int) {
	switch {
	case d.IsEmpty():
	case d.Exists():
		st.live = uint64(int64(st.live) + int64(sign))
	default:
		st.tombstones = uint64(int64(st.tombstones) + int64(sign))
	}
}

// readRecord reads the committed record of key; a missing key is an empty
// record.
func (s *Store) readRecord(key string) (Record, error) {
	return readRecord(s.db, key)
}

func readRecord(r pebble.Reader, key string) (Record, error) {
	v, c, err := r.Get(docKey(key))
	if errors.Is(err, pebble.ErrNotFound) {
		return Record{Key: key}, nil
	}
	if err != nil {
		return Record{}, fmt.Errorf("read %s: %w", key, err)
	}
	defer c.Close()
	rev, d, err := DecodeRecord(v)
	if err != nil {
		return Record{}, fmt.Errorf("record %s: %w", key, err)
	}
	return Record{Key: key, Rev: rev, Doc: d}, nil
}

// rebuildIndex rebuilds the MST from the documents, replacing every stored
// node, and recounts live documents and tombstones.
func (s *Store) rebuildIndex() error {
	s.drainSync()
	start := time.Now()
	snap := s.db.NewSnapshot()
	defer snap.Close()
	it, err := snap.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixDoc}, UpperBound: []byte{prefixDoc + 1}})
	if err != nil {
		return err
	}
	var entries []mst.Entry
	var st committed
	skipped := 0
	for it.First(); it.Valid(); it.Next() {
		key := string(it.Key()[1:])
		_, d, err := DecodeRecord(it.Value())
		if err != nil {
			skipped++
			s.log.Error("skipping corrupt document during index rebuild", "key", key, "err", err)
			continue
		}
		if d.IsEmpty() {
			continue
		}
		digest := d.Digest()
		entries = append(entries, mst.Entry{Key: IndexKey(d, key), Value: digest[:]})
		countDoc(&st, d, +1)
	}
	if err := it.Close(); err != nil {
		return err
	}
	slices.SortFunc(entries, func(a, b mst.Entry) int { return bytes.Compare(a.Key, b.Key) })
	ch, err := mst.Build(mst.Entries(entries), s.mstOptions())
	if err != nil {
		return fmt.Errorf("build index: %w", err)
	}
	b := s.db.NewBatch()
	defer b.Close()
	b.DeleteRange([]byte{prefixNode}, []byte{prefixNode + 1}, nil)
	for _, n := range ch.Added {
		b.Set(nodeKey(n.Hash), n.Data, nil)
	}
	st.root = ch.Root
	b.Set(keyRoot, st.root[:], nil)
	b.Set(keyLive, u64(st.live), nil)
	b.Set(keyTombstones, u64(st.tombstones), nil)
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("write rebuilt index: %w", err)
	}
	s.tree = s.openTree(st.root)
	s.next.st = st
	s.state.Store(&st)
	s.stats.repairs.Add(1)
	s.log.Warn("index rebuilt from documents", "entries", len(entries), "skipped_corrupt", skipped,
		"root", fmt.Sprintf("%x", st.root[:8]), "duration", time.Since(start).Round(time.Millisecond))
	return nil
}

// RequestRepair asks the committer to rebuild the index from documents.
func (s *Store) RequestRepair() {
	select {
	case s.repairs <- struct{}{}:
	default:
	}
}

func (s *Store) broadcast() {
	s.notifyMu.Lock()
	close(s.notify)
	s.notify = make(chan struct{})
	s.notifyMu.Unlock()
}

// commitNotify returns a channel closed at the next commit.
func (s *Store) commitNotify() <-chan struct{} {
	s.notifyMu.Lock()
	defer s.notifyMu.Unlock()
	return s.notify
}

func u64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }
