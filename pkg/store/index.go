package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/mst"
)

// indexState is the index as last persisted by the indexer: its root and
// the sequence number of the last index op applied to it.
type indexState struct {
	root mst.Hash
	seq  uint64
}

const (
	// indexBatchMin is how many durable ops the indexer waits for before
	// applying them, unless a reader waits or indexBatchDelay has passed:
	// a batch pays once for the path copies and hashes its ops share.
	indexBatchMin = 1024
	// indexBatchDelay bounds how long durable ops wait for the indexer.
	indexBatchDelay = 10 * time.Millisecond
	// indexBatchMax bounds the ops applied in one tree commit.
	indexBatchMax = 16384
	// indexTrimEvery is how many applied ops accumulate in the op log
	// before one range deletion drops them.
	indexTrimEvery = 4096
	// indexWaitMax bounds how long a reader (Root, Status, View) waits for
	// the index to catch up, e.g. while a damaged index is rebuilt.
	indexWaitMax = 10 * time.Second
	// indexRetry spaces out attempts after a failed index commit.
	indexRetry = 100 * time.Millisecond
)

// rebuildResult is what a rebuild reports to the committer.
type rebuildResult struct {
	st  committed
	err error
}

// indexer is the goroutine that owns the MST. It follows the index op log
// (i<seq>), which the committer writes in the same synced batch as the
// documents, and applies the durable ops to the tree in batches; each
// batch's node changes, root and applied sequence number (sindexed) go to
// Pebble as one unsynced batch. A crash loses at most the index's progress,
// never an op: the next start replays the log from sindexed. Acknowledging
// a write thus never waits for the tree.
func (s *Store) indexer() {
	defer close(s.indexDone)
	var delay *time.Timer
	for {
		applied := s.index.Load().seq
		target := s.opSeq.Load()
		if applied < target && !s.damaged && !s.indexHeld() {
			if target-applied < indexBatchMin {
				// Let a few more ops join the batch, unless someone waits.
				if delay == nil {
					delay = time.NewTimer(indexBatchDelay)
				} else {
					delay.Reset(indexBatchDelay)
				}
				select {
				case <-delay.C:
				case <-s.indexKick:
					delay.Stop()
				case <-s.indexStop:
					delay.Stop()
				case res := <-s.indexReqs:
					delay.Stop()
					res <- s.rebuildFromDocs()
					continue
				}
				target = s.opSeq.Load()
			}
			s.indexTo(target)
			continue
		}
		select {
		case <-s.indexWake:
		case <-s.indexKick:
		case res := <-s.indexReqs:
			res <- s.rebuildFromDocs()
		case <-s.indexStop:
			// The committer and syncer have stopped: apply what is left
			// and persist it, so the next start replays nothing.
			for !s.damaged && !s.indexHeld() && s.index.Load().seq < s.opSeq.Load() {
				if err := s.indexTo(s.opSeq.Load()); err != nil {
					break
				}
			}
			return
		}
	}
}

// indexHeld reports whether a test holds the indexer back (simulating an
// index that lags, as after a crash).
func (s *Store) indexHeld() bool { return s.testHoldIndex.Load() }

// indexTo applies the index ops after the index's sequence number up to
// target (at most indexBatchMax of them) and persists the result.
func (s *Store) indexTo(target uint64) error {
	err := s.applyOps(target)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, mst.ErrCorruptNode) || errors.Is(err, mst.ErrNodeNotFound) || errors.Is(err, crdt.ErrCorrupt):
		// The tree, or the op log, is damaged: rebuild from the documents,
		// which the committer coordinates (it pauses writes meanwhile).
		s.stats.corruptNodes.Add(1)
		s.log.Error("index damaged; rebuilding from documents", "err", err)
		s.damaged = true
		s.RequestRepair()
	default:
		s.log.Error("index commit failed; retrying", "err", err)
		select {
		case <-time.After(indexRetry):
		case <-s.indexStop:
		}
	}
	return err
}

func (s *Store) applyOps(target uint64) (err error) {
	cur := s.index.Load()
	from := cur.seq
	upto := min(target, from+indexBatchMax)
	defer func() {
		if err != nil {
			s.tree.Rollback()
		}
	}()
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: indexOpKey(from + 1), UpperBound: indexOpKey(upto + 1)})
	if err != nil {
		return err
	}
	var prevKey, nextKey []byte
	want := from + 1
	for it.First(); it.Valid(); it.Next() {
		seq := binary.BigEndian.Uint64(it.Key()[1:])
		if seq != want {
			break
		}
		op, err := decodeIndexOp(it.Value())
		if err != nil {
			it.Close()
			return fmt.Errorf("index op %d: %w", seq, err)
		}
		if err := s.applyOp(op, &prevKey, &nextKey); err != nil {
			it.Close()
			return fmt.Errorf("index op %d (%s): %w", seq, op.key, err)
		}
		want++
	}
	if err := it.Close(); err != nil {
		return err
	}
	if want != upto+1 {
		return fmt.Errorf("%w: index op log has no op %d (applying %d..%d)", crdt.ErrCorrupt, want, from+1, upto)
	}
	ch, err := s.tree.Commit()
	if err != nil {
		return err
	}
	b := s.db.NewBatch()
	defer b.Close()
	for _, n := range ch.Added {
		b.Set(nodeKey(n.Hash), n.Data, nil)
	}
	for _, h := range ch.Removed {
		b.Delete(nodeKey(h), nil)
	}
	b.Set(keyRoot, ch.Root[:], nil)
	b.Set(keyIndexed, u64(upto), nil)
	trim := upto-s.trimmed >= indexTrimEvery
	if trim {
		b.DeleteRange([]byte{prefixIndexOp}, indexOpKey(upto+1), nil)
	}
	// NB: no sync. The ops are durable already; losing this batch only
	// means replaying them at the next start, and a later synced commit
	// makes it durable anyway (one WAL, in order).
	if err := b.Commit(pebble.NoSync); err != nil {
		// The tree has committed in memory; reopen it at the last
		// persisted root so that it matches the database again.
		s.tree = s.openTree(cur.root)
		return fmt.Errorf("write index: %w", err)
	}
	if trim {
		s.trimmed = upto
	}
	s.stats.indexBatches.Add(1)
	s.publishIndex(&indexState{root: ch.Root, seq: upto})
	return nil
}

// applyOp moves one document's entry in the tree. prevKey and nextKey are
// scratch buffers.
func (s *Store) applyOp(op indexOp, prevKey, nextKey *[]byte) error {
	if op.prev != nil && (op.next == nil || !bytes.Equal(op.prev, op.next)) {
		*prevKey = indexKeyOf(*prevKey, op.prev, op.key)
		if _, err := s.tree.Delete(*prevKey); err != nil {
			return err
		}
	}
	if op.next == nil {
		return nil
	}
	*nextKey = indexKeyOf(*nextKey, op.next, op.key)
	err := s.tree.Put(*nextKey, op.digest)
	if errors.Is(err, mst.ErrLimit) {
		// Only keys mined to crowd one node get here. The document stays
		// stored but unindexed (anti-entropy will not offer it) rather
		// than stopping the index for everyone.
		s.stats.indexRejected.Add(1)
		s.log.Error("document left out of the index", "key", op.key, "err", err)
		return nil
	}
	return err
}

func (s *Store) publishIndex(st *indexState) {
	s.indexMu.Lock()
	s.index.Store(st)
	close(s.indexNotify)
	s.indexNotify = make(chan struct{})
	s.indexMu.Unlock()
}

// waitIndexed waits until the index covers every write that was durable
// when it was called, so that what a caller reads after an acknowledged
// write reflects it. It gives up after indexWaitMax (a damaged index being
// rebuilt) or when the store closes, leaving the caller an older root.
func (s *Store) waitIndexed() {
	target := s.opSeq.Load()
	if s.index.Load().seq >= target {
		return
	}
	var timeout <-chan time.Time
	for {
		s.indexMu.Lock()
		ch := s.indexNotify
		s.indexMu.Unlock()
		if s.index.Load().seq >= target {
			return
		}
		select {
		case s.indexKick <- struct{}{}:
		default:
		}
		if timeout == nil {
			t := time.NewTimer(indexWaitMax)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-ch:
		case <-s.indexDone:
			return
		case <-timeout:
			s.log.Warn("index still behind the documents", "indexed", s.index.Load().seq, "want", target)
			return
		}
	}
}

// rebuildIndex (committer) rebuilds the MST from the documents with writes
// paused, so that the rebuilt tree and the recount of live documents and
// tombstones match the documents exactly.
func (s *Store) rebuildIndex() error {
	s.drainSync()
	res := make(chan rebuildResult, 1)
	select {
	case s.indexReqs <- res:
	case <-s.indexDone:
		return ErrClosed
	}
	r := <-res
	if r.err != nil {
		return r.err
	}
	s.next.st = r.st
	st := r.st
	s.state.Store(&st)
	return nil
}

// rebuildFromDocs (indexer) replaces the tree and every stored node with a
// tree built from the documents, as of every op the committer has applied
// (it waits in rebuildIndex meanwhile).
func (s *Store) rebuildFromDocs() rebuildResult {
	start := time.Now()
	snap := s.db.NewSnapshot()
	defer snap.Close()
	cs, err := readCommitScalars(snap)
	if err != nil {
		return rebuildResult{err: err}
	}
	seq := cs.opSeq
	it, err := snap.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixDoc}, UpperBound: []byte{prefixDoc + 1}})
	if err != nil {
		return rebuildResult{err: err}
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
		return rebuildResult{err: err}
	}
	slices.SortFunc(entries, func(a, b mst.Entry) int { return bytes.Compare(a.Key, b.Key) })
	ch, err := mst.Build(mst.Entries(entries), s.mstOptions())
	if err != nil {
		return rebuildResult{err: fmt.Errorf("build index: %w", err)}
	}
	b := s.db.NewBatch()
	defer b.Close()
	b.DeleteRange([]byte{prefixNode}, []byte{prefixNode + 1}, nil)
	for _, n := range ch.Added {
		b.Set(nodeKey(n.Hash), n.Data, nil)
	}
	b.Set(keyRoot, ch.Root[:], nil)
	b.Set(keyIndexed, u64(seq), nil)
	b.DeleteRange([]byte{prefixIndexOp}, indexOpKey(seq+1), nil)
	cs.live, cs.tombstones = st.live, st.tombstones
	b.Set(keyCommit, cs.encode(), nil)
	if err := b.Commit(pebble.Sync); err != nil {
		return rebuildResult{err: fmt.Errorf("write rebuilt index: %w", err)}
	}
	s.tree = s.openTree(ch.Root)
	s.trimmed = seq
	s.damaged = false
	s.publishIndex(&indexState{root: ch.Root, seq: seq})
	s.stats.repairs.Add(1)
	s.log.Warn("index rebuilt from documents", "entries", len(entries), "skipped_corrupt", skipped,
		"root", fmt.Sprintf("%x", ch.Root[:8]), "duration", time.Since(start).Round(time.Millisecond))
	return rebuildResult{st: st}
}
