package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/containerd/errdefs"

	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/mst"
)

// Get returns the record of an existing document and the revision it was
// read at. A document that was never written or is deleted is NotFound.
func (s *Store) Get(key string) (Record, uint64, error) {
	if err := ValidateKey(key); err != nil {
		return Record{}, 0, err
	}
	if s.isClosed() {
		return Record{}, 0, ErrClosed
	}
	snap := s.db.NewSnapshot()
	defer snap.Close()
	cs, err := readCommitScalars(snap)
	if err != nil {
		return Record{}, 0, err
	}
	rev := cs.rev
	rec, err := readRecord(snap, key)
	if err != nil {
		if errors.Is(err, crdt.ErrCorrupt) {
			return Record{}, rev, fmt.Errorf("%w: %w", err, errdefs.ErrDataLoss)
		}
		return Record{}, rev, err
	}
	if !rec.Doc.Exists() {
		return Record{}, rev, fmt.Errorf("%s: %w", key, errdefs.ErrNotFound)
	}
	return rec, rev, nil
}

// GetRaw returns the stored record of key, tombstones included; an
// unknown key gives an empty document.
func (s *Store) GetRaw(key string) (Record, error) {
	if s.isClosed() {
		return Record{}, ErrClosed
	}
	return readRecord(s.db, key)
}

// ListOptions select a page of List.
type ListOptions struct {
	Prefix string
	// After is the last key of the previous page; the page starts after it.
	After string
	// Limit is the page size.
	Limit int
	// Tombstones includes deleted documents that are still remembered.
	Tombstones bool
}

// List returns up to Limit documents under Prefix in key order, read from
// one snapshot at revision rev; more reports whether another page follows.
func (s *Store) List(opts ListOptions) (recs []Record, rev uint64, more bool, err error) {
	if err := ValidatePrefix(opts.Prefix); err != nil {
		return nil, 0, false, err
	}
	if opts.Limit <= 0 {
		opts.Limit = 100
	}
	if s.isClosed() {
		return nil, 0, false, ErrClosed
	}
	snap := s.db.NewSnapshot()
	defer snap.Close()
	cs, err := readCommitScalars(snap)
	if err != nil {
		return nil, 0, false, err
	}
	rev = cs.rev
	lower := docKey(opts.Prefix)
	if opts.After != "" {
		if !strings.HasPrefix(opts.After, opts.Prefix) {
			return nil, 0, false, fmt.Errorf("page token is not under prefix %q: %w", opts.Prefix, errdefs.ErrInvalidArgument)
		}
		lower = append(docKey(opts.After), 0)
	}
	it, err := snap.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: prefixEnd(docKey(opts.Prefix))})
	if err != nil {
		return nil, 0, false, err
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		key := string(it.Key()[1:])
		r, d, err := DecodeRecord(it.Value())
		if err != nil {
			return nil, rev, false, fmt.Errorf("record %s: %w: %w", key, err, errdefs.ErrDataLoss)
		}
		if !d.Exists() && !opts.Tombstones {
			continue
		}
		if len(recs) == opts.Limit {
			return recs, rev, true, nil
		}
		recs = append(recs, Record{Key: key, Rev: r, Doc: d})
	}
	return recs, rev, false, it.Error()
}

// prefixEnd returns the smallest key greater than every key with prefix p.
func prefixEnd(p []byte) []byte {
	end := bytes.Clone(p)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

// Event is one change: the document at Key right after revision Rev.
type Event struct {
	Rev uint64
	Key string
	Doc crdt.Doc
}

// WatchBatch is what Watch hands its callback: the events in (from, Rev]
// that match the prefix, possibly none (a progress notification).
type WatchBatch struct {
	Events []Event
	Rev    uint64
}

// maxWatchBatch bounds the events in one callback.
const maxWatchBatch = 256

// progressEvery spaces out notifications that carry no events.
const progressEvery = time.Second

// Watch calls fn with every change under prefix after revision after, in
// order, then with each new commit until ctx ends or fn fails. (To start
// from now, pass Revision().) Watch first calls fn with an empty batch at
// its starting revision. If the change log no longer reaches back to
// after+1, it fails with ErrCompacted (FailedPrecondition).
func (s *Store) Watch(ctx context.Context, prefix string, after uint64, fn func(WatchBatch) error) error {
	if err := ValidatePrefix(prefix); err != nil {
		return err
	}
	if cur := s.rev.Load(); after > cur {
		return fmt.Errorf("revision %d is in the future (current %d): %w", after, cur, errdefs.ErrOutOfRange)
	}
	if err := s.checkRetained(after); err != nil {
		return err
	}
	if err := fn(WatchBatch{Rev: after}); err != nil {
		return err
	}
	lastProgress := time.Now()
	for {
		wake := s.commitNotify()
		cur := s.rev.Load()
		for after < cur {
			events, upto, err := s.readChanges(prefix, after, cur)
			if err != nil {
				return err
			}
			after = upto
			if len(events) > 0 || time.Since(lastProgress) >= progressEvery {
				if err := fn(WatchBatch{Events: events, Rev: upto}); err != nil {
					return err
				}
				lastProgress = time.Now()
			}
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.closing:
			return ErrClosed
		}
	}
}

func (s *Store) checkRetained(after uint64) error {
	if oldest := s.oldest.Load(); after+1 < oldest {
		return fmt.Errorf("%w: revision %d is older than the change log (oldest %d); list again and watch from the list's revision: %w",
			ErrCompacted, after+1, oldest, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// readChanges reads the change log in (after, upto], returning at most
// maxWatchBatch matching events and the revision it read up to. Revisions
// are contiguous, so a gap means the log was trimmed under the reader.
func (s *Store) readChanges(prefix string, after, upto uint64) ([]Event, uint64, error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: changeKey(after + 1), UpperBound: changeKey(upto + 1)})
	if err != nil {
		return nil, after, err
	}
	defer it.Close()
	var events []Event
	next := after + 1
	for it.First(); it.Valid(); it.Next() {
		rev := binary.BigEndian.Uint64(it.Key()[1:])
		if rev != next {
			return nil, after, s.checkRetainedOrGap(after, rev)
		}
		next++
		key, d, err := DecodeChange(it.Value())
		if err != nil {
			return nil, after, fmt.Errorf("change %d: %w: %w", rev, err, errdefs.ErrDataLoss)
		}
		if strings.HasPrefix(key, prefix) {
			events = append(events, Event{Rev: rev, Key: key, Doc: d})
		}
		if len(events) == maxWatchBatch {
			return events, rev, nil
		}
	}
	if err := it.Error(); err != nil {
		return nil, after, err
	}
	if next != upto+1 {
		return nil, after, s.checkRetainedOrGap(after, next)
	}
	return events, upto, nil
}

func (s *Store) checkRetainedOrGap(after, found uint64) error {
	if err := s.checkRetained(after); err != nil {
		return err
	}
	return fmt.Errorf("change log gap after revision %d (found %d): %w", after, found, errdefs.ErrDataLoss)
}

// Status describes the store.
type Status struct {
	NodeID     string
	Live       uint64
	Tombstones uint64
	Root       mst.Hash
	Revision   uint64
	Oldest     uint64
	Counters   map[string]uint64
}

// Status returns the store's status. Like Root, it waits for the index to
// cover the writes acknowledged before the call.
func (s *Store) Status() Status {
	s.waitIndexed()
	st := s.state.Load()
	return Status{
		NodeID:     s.nodeID,
		Live:       st.live,
		Tombstones: st.tombstones,
		Root:       s.index.Load().root,
		Revision:   s.rev.Load(),
		Oldest:     s.oldest.Load(),
		Counters:   s.stats.snapshot(s.clock.Rejected()),
	}
}

func (s *Store) isClosed() bool {
	select {
	case <-s.closing:
		return true
	default:
		return false
	}
}

// Scan calls fn with every stored document, tombstones included, in key
// order from one snapshot, until fn returns false.
func (s *Store) Scan(fn func(key string, d crdt.Doc) bool) error {
	if s.isClosed() {
		return ErrClosed
	}
	snap := s.db.NewSnapshot()
	defer snap.Close()
	it, err := snap.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixDoc}, UpperBound: []byte{prefixDoc + 1}})
	if err != nil {
		return err
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		_, d, err := DecodeRecord(it.Value())
		if err != nil {
			continue // reported by readers and the scrub
		}
		if !fn(string(it.Key()[1:]), d) {
			break
		}
	}
	return it.Error()
}

// SetMeta stores a node-local value that is not replicated (e.g. when the
// node last synchronised with a peer).
func (s *Store) SetMeta(name string, value []byte) error {
	return s.db.Set(append([]byte("smeta/"), name...), value, pebble.Sync)
}

// Meta returns a value stored by SetMeta, nil if none.
func (s *Store) Meta(name string) ([]byte, error) {
	return readBytes(s.db, append([]byte("smeta/"), name...))
}
