package store

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/containerd/errdefs"

	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/hlc"
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
	// stamp is the stamp of a local write (opPut, opDelete), taken by the
	// writer's goroutine; the committer takes another if a write with a
	// later stamp committed first (Store.lastStamp).
	stamp crdt.Stamp
	// pre is the document as the writer's goroutine read it, after every
	// op up to preSeq was applied, and prep the write prepared on it. The
	// committer uses them if no op touched the key since (recentWrites):
	// reading, merging, encoding and hashing then happen in the writers'
	// goroutines, in parallel, and the committer only sequences.
	pre    Record
	hasPre bool
	preSeq uint64
	prep   prepared
}

// reqPool recycles the requests of Put, Delete and Merge, with their
// result channels, once their result has been received.
var reqPool = sync.Pool{New: func() any { return &writeReq{res: make(chan WriteResult, 1)} }}

func newReq(op opKind, key string) *writeReq {
	r := reqPool.Get().(*writeReq)
	r.op, r.key = op, key
	return r
}

// release returns a request whose result was received to the pool.
func release(r *writeReq) {
	*r = writeReq{res: r.res}
	reqPool.Put(r)
}

// prepared is a write applied to a document, not yet committed.
type prepared struct {
	existed bool
	changed bool
	merged  crdt.Doc
	enc     []byte // merged's encoding, when changed
	digest  crdt.Digest
	err     error // the write is refused (the document would be too large)
}

// prepareAhead reads r's document and prepares r on it in the caller's
// goroutine (see writeReq.pre).
func (s *Store) prepareAhead(r *writeReq) {
	if r.op == opPut || r.op == opDelete {
		r.stamp = s.stamp()
	}
	s.aheadMu.RLock()
	defer s.aheadMu.RUnlock()
	if s.isClosed() {
		return // submit fails with ErrClosed
	}
	seq := s.applied.Load()
	if s.absent(r.key) {
		r.pre = Record{Key: r.key}
	} else if rec, err := s.readRecord(r.key); err == nil {
		r.pre = rec
	} else {
		return
	}
	r.hasPre, r.preSeq = true, seq
	r.prep = s.prepare(r, r.pre.Doc)
}

// prepare applies r to the document cur.
func (s *Store) prepare(r *writeReq, cur crdt.Doc) prepared {
	delta, existed := s.delta(r, cur)
	var merged crdt.Doc
	if r.op == opPut && cur.IsEmpty() {
		// Merge would copy the fresh delta: it is the document.
		merged = delta
	} else {
		merged = crdt.Merge(cur, delta)
	}
	if crdt.Equal(merged, cur) {
		return prepared{existed: existed, merged: cur}
	}
	if len(merged.Fields) > crdt.MaxFields {
		return prepared{err: fmt.Errorf("document %s would have %d fields (tombstones included), limit %d: %w", r.key, len(merged.Fields), crdt.MaxFields, errdefs.ErrInvalidArgument)}
	}
	enc := merged.Marshal()
	if len(enc) > crdt.MaxDocSize {
		return prepared{err: fmt.Errorf("document %s would be %d bytes, limit %d: %w", r.key, len(enc), crdt.MaxDocSize, errdefs.ErrInvalidArgument)}
	}
	return prepared{existed: existed, changed: true, merged: merged, enc: enc, digest: sha256.Sum256(enc)}
}

// recentWrites remembers, for the committer, which keys the latest ops
// changed, to tell whether a pre-read document is still current. It covers
// every op after since; older pre-reads are read again.
type recentWrites struct {
	cur, old        map[string]uint64 // key → last op that changed it
	curSince, since uint64            // cur holds ops > curSince, old ops in (since, curSince]
}

// recentWindow is how many ops a generation of recentWrites covers.
const recentWindow = 1 << 15

func newRecentWrites(seq uint64) recentWrites {
	return recentWrites{cur: map[string]uint64{}, old: map[string]uint64{}, curSince: seq, since: seq}
}

// current reports whether a document read after op seq is still current:
// no later op changed key.
func (w *recentWrites) current(key string, seq uint64) bool {
	if seq < w.since {
		return false
	}
	if last, ok := w.cur[key]; ok && last > seq {
		return false
	}
	if last, ok := w.old[key]; ok && last > seq {
		return false
	}
	return true
}

// note records that op seq (or an earlier op of its group) changed keys,
// and starts a new generation when the current one is full.
func (w *recentWrites) note(keys []string, seq uint64) {
	for _, k := range keys {
		w.cur[k] = seq
	}
	if seq-w.curSince >= recentWindow {
		w.old, w.since = w.cur, w.curSince
		w.cur, w.curSince = make(map[string]uint64, len(w.old)), seq
	}
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
	r := newReq(opPut, key)
	r.fields = fields
	return s.submit(ctx, r)
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
	r := newReq(opDelete, key)
	r.names = names
	return s.submit(ctx, r)
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
	r := newReq(opMerge, key)
	r.remote = remote
	return s.submit(ctx, r)
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
	s.prepareAhead(r)
	select {
	case s.reqs <- r:
	case <-s.closing:
		release(r)
		return WriteResult{}, ErrClosed
	case <-ctx.Done():
		release(r)
		return WriteResult{}, ctx.Err()
	}
	// NB: once queued, the write happens whether or not the caller waits,
	// so the caller must not assume a cancelled write did not apply.
	res, err := s.await(ctx, r)
	if err == nil || res.Err != nil {
		release(r)
	}
	// Else (the caller gave up) the committer may still hold r: it is not
	// reused.
	return res, err
}

// await waits for the result of a queued request. A request queued as the
// store closed, after the committer's last look at the queue, is never
// answered: once the committer is done, it fails with ErrClosed (it did
// not apply).
func (s *Store) await(ctx context.Context, r *writeReq) (WriteResult, error) {
	select {
	case res := <-r.res:
		return res, res.Err
	case <-ctx.Done():
		return WriteResult{}, ctx.Err()
	case <-s.done:
		select {
		case res := <-r.res:
			return res, res.Err
		default:
			return WriteResult{Err: ErrClosed}, ErrClosed
		}
	}
}

// run is the committer loop: the only goroutine that writes documents. It
// applies a group and moves on to the next while the syncer waits for the
// first group's fsync: preparing group N+1 overlaps the WAL sync of group
// N.
func (s *Store) run() {
	syncDone := make(chan struct{})
	go func() { s.syncer(); close(syncDone) }()
	defer func() {
		close(s.syncq)
		<-syncDone
		s.bg.Wait()
		// The indexer applies what is durable, persists it and stops.
		close(s.indexStop)
		<-s.indexDone
		close(s.done)
	}()
	for {
		s.maybeBuildFilter()
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
	opSeq  uint64
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
			s.opSeq.Store(inf.next.opSeq)
			s.rev.Store(inf.next.rev)
			s.broadcast()
			select {
			case s.indexWake <- struct{}{}:
			default:
			}
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

// commitGroup applies a group of writes and hands it to the syncer.
func (s *Store) commitGroup(group []*writeReq) {
	inf, err := s.tryCommit(group)
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

// tryCommit applies a group to Pebble as one batch without waiting for its
// sync: documents, change log, index ops and scalars. The MST is not
// touched here: the indexer applies the index ops once they are durable.
// On a group-wide error nothing is written; per-write errors (a document
// that would grow too large) fail only that write.
func (s *Store) tryCommit(group []*writeReq) (_ *inflight, err error) {
	if p := s.broken.Load(); p != nil {
		return nil, fmt.Errorf("store failed earlier: %w: %w", *p, errdefs.ErrDataLoss)
	}
	next := s.next
	st, rev := &next.st, next.rev
	w := &s.writes
	w.reset()
	inf := &inflight{group: group, results: make([]WriteResult, len(group)), start: time.Now()}
	results := inf.results
	for i, r := range group {
		restamped := false
		if (r.op == opPut || r.op == opDelete) && r.stamp.TS.Compare(s.lastStamp) <= 0 {
			// A write stamped later committed first: stamp this one again,
			// so that a local write's stamp exceeds every stamp committed
			// before it, as if it had been stamped here.
			r.stamp, restamped = s.stamp(), true
			s.stats.restamped.Add(1)
		}
		var cur Record
		var p prepared
		j, ok := w.byKey[r.key]
		switch {
		case ok:
			cur = w.docs[j].rec
			p = s.prepare(r, cur.Doc)
		case r.hasPre && s.recent.current(r.key, r.preSeq):
			cur, p = r.pre, r.prep
			if restamped {
				p = s.prepare(r, cur.Doc)
			}
		default:
			cur, err = s.readRecord(r.key)
			if errors.Is(err, crdt.ErrCorrupt) {
				results[i] = WriteResult{Err: fmt.Errorf("document %s is corrupt on disk: %w", r.key, errdefs.ErrDataLoss)}
				err = nil
				continue
			}
			if err != nil {
				return nil, err
			}
			if r.op != opPurge {
				p = s.prepare(r, cur.Doc)
			}
		}
		if r.op == opPurge {
			d := cur.Doc
			purged := !d.IsEmpty() && r.purge(d)
			if purged {
				// No tombstone left and no change logged; the index entry
				// goes through the op log like any other.
				next.opSeq++
				w.ops = append(w.ops, opWrite{seq: next.opSeq, key: r.key, prev: d.MaxStamp().TS, hasPrev: true})
				countDoc(st, d, -1)
				w.setDoc(r.key, Record{Key: r.key}, nil)
			}
			results[i] = WriteResult{Rev: rev, Changed: purged, Existed: d.Exists()}
			continue
		}
		if p.err != nil {
			results[i] = WriteResult{Err: p.err}
			continue
		}
		existed, merged, enc := p.existed, p.merged, p.enc
		if !p.changed {
			results[i] = WriteResult{Rev: rev, Record: cur, Existed: existed}
			continue
		}
		next.opSeq++
		w.ops = append(w.ops, opWrite{seq: next.opSeq, key: r.key, prev: cur.Doc.MaxStamp().TS, next: merged.MaxStamp().TS,
			hasPrev: !cur.Doc.IsEmpty(), hasNext: true, digest: p.digest})
		countDoc(st, cur.Doc, -1)
		countDoc(st, merged, +1)
		if ts := merged.MaxStamp().TS; s.lastStamp.Less(ts) {
			s.lastStamp = ts
		}
		rev++
		rec := Record{Key: r.key, Rev: rev, Doc: merged}
		if cur.Doc.IsEmpty() {
			s.noteCreate(r.key)
		}
		w.setDoc(r.key, rec, enc)
		w.changes = append(w.changes, changeWrite{rev: rev, key: r.key, enc: enc})
		results[i] = WriteResult{Rev: rev, Record: rec, Changed: true, Existed: existed}
	}
	changed := len(w.ops)
	if changed == 0 {
		return inf, nil
	}
	b := s.db.NewBatch()
	w.write(b)
	b.Set(keyCommit, commitScalars{rev: rev, opSeq: next.opSeq, live: st.live, tombstones: st.tombstones,
		hlc: s.clock.Last()}.encode(), nil)
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
		b.Close()
		return nil, fmt.Errorf("pebble apply: %w", err)
	}
	s.recent.note(w.touched(), next.opSeq)
	s.applied.Store(next.opSeq)
	s.next = next
	inf.batch, inf.next, inf.changed = b, next, changed
	return inf, nil
}

// groupWrites collects what a group writes, so that its batch is laid out
// in key order: the change log entries, the final record of each document
// (sorted), the index ops. Consecutive log entries then land next to each
// other in the memtable, where an insert costs almost nothing, instead of
// each insert searching the skiplist from the top. Owned by the committer
// and reused.
type groupWrites struct {
	docs    []docWrite
	byKey   map[string]int // index in docs
	changes []changeWrite
	ops     []opWrite
	keys    []string
}

type docWrite struct {
	rec Record
	enc []byte // nil: delete the record (purge)
}

type changeWrite struct {
	rev uint64
	key string
	enc []byte
}

type opWrite struct {
	seq              uint64
	key              string
	prev, next       hlc.Timestamp
	hasPrev, hasNext bool
	digest           crdt.Digest
}

func (w *groupWrites) reset() {
	if w.byKey == nil {
		w.byKey = make(map[string]int)
	}
	clear(w.byKey)
	clear(w.docs) // drop references to documents
	clear(w.changes)
	w.docs, w.changes, w.ops, w.keys = w.docs[:0], w.changes[:0], w.ops[:0], w.keys[:0]
}

// setDoc records the state of key after the group so far.
func (w *groupWrites) setDoc(key string, rec Record, enc []byte) {
	if j, ok := w.byKey[key]; ok {
		w.docs[j] = docWrite{rec: rec, enc: enc}
		return
	}
	w.byKey[key] = len(w.docs)
	w.docs = append(w.docs, docWrite{rec: rec, enc: enc})
}

// touched returns the keys the group changed.
func (w *groupWrites) touched() []string {
	for _, d := range w.docs {
		w.keys = append(w.keys, d.rec.Key)
	}
	return w.keys
}

// write adds the group's records to b in key order.
func (w *groupWrites) write(b *pebble.Batch) {
	for _, c := range w.changes {
		setChange(b, c.rev, c.key, c.enc)
	}
	slices.SortFunc(w.docs, func(a, b docWrite) int { return strings.Compare(a.rec.Key, b.rec.Key) })
	clear(w.byKey) // indexes into docs are stale now
	for _, d := range w.docs {
		if d.enc == nil {
			b.Delete(docKey(d.rec.Key), nil)
		} else {
			setRecord(b, d.rec.Key, d.rec.Rev, d.enc)
		}
	}
	for _, op := range w.ops {
		if op.hasNext {
			setIndexOp(b, op.seq, op.key, op.prev, op.next, op.hasPrev, &op.digest)
		} else {
			b.Set(indexOpKey(op.seq), encodeIndexOp(op.key, op.prev, op.next, op.hasPrev, false, nil), nil)
		}
	}
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
		res, err := s.await(ctx, r)
		if err != nil {
			return n, err
		}
		if res.Changed {
			n++
		}
	}
	return n, nil
}

// delta turns a request into the document delta it merges, and reports
// whether its target existed.
func (s *Store) delta(r *writeReq, cur crdt.Doc) (crdt.Doc, bool) {
	switch r.op {
	case opPut:
		return crdt.Set(r.fields, r.stamp), cur.Exists()
	case opDelete:
		if len(r.names) == 0 {
			if !cur.Exists() {
				return crdt.Doc{}, false
			}
			return crdt.DeleteDoc(r.stamp), true
		}
		live := cur.Live()
		var present []string
		for _, n := range r.names {
			if _, ok := live[n]; ok {
				present = append(present, n)
			}
		}
		if len(present) == 0 {
			return crdt.Doc{}, false
		}
		return crdt.DeleteFields(present, r.stamp), true
	default:
		return r.remote, cur.Exists()
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

// readRecord reads the applied record of key; a missing key is an empty
// record.
func (s *Store) readRecord(key string) (Record, error) {
	if s.absent(key) {
		return Record{Key: key}, nil
	}
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

// RequestRepair asks for the index to be rebuilt from the documents.
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
