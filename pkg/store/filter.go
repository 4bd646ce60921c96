package store

import (
	"hash/maphash"
	"math/bits"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// keyFilter is an in-memory Bloom filter over the keys that have a
// document record, so that a write to a brand-new key skips the Pebble
// read of a document that does not exist (a miss costs a seek in every
// memtable and a filter probe per level, several µs). A "no" is exact; a
// "maybe" means read. Purged keys stay in the filter (a false "maybe").
//
// It is blocked: each key sets filterProbes bits of one 64-bit word, so a
// probe is one memory access. At filterBitsPerKey bits per key the false
// positive rate is about 1%.
type keyFilter struct {
	words    []atomic.Uint64
	mask     uint64 // len(words) - 1
	seed     maphash.Seed
	capacity int64        // keys it was sized for
	count    atomic.Int64 // keys added
}

const (
	filterBitsPerKey = 16
	filterProbes     = 4
)

// filterMinKeys is the smallest capacity a filter is sized for (a
// variable for tests).
var filterMinKeys int64 = 1 << 18

func newKeyFilter(capacity int64) *keyFilter {
	capacity = max(capacity, filterMinKeys)
	n := uint64(1) << bits.Len64(uint64(capacity*filterBitsPerKey/64-1))
	return &keyFilter{words: make([]atomic.Uint64, n), mask: n - 1, seed: maphash.MakeSeed(), capacity: capacity}
}

// probe returns the word and bits of key.
func (f *keyFilter) probe(key string) (*atomic.Uint64, uint64) {
	return f.probeHash(maphash.String(f.seed, key))
}

func (f *keyFilter) probeHash(h uint64) (*atomic.Uint64, uint64) {
	w := &f.words[(h>>32)&f.mask]
	var m uint64
	for i := range filterProbes {
		m |= 1 << ((h >> (6 * i)) & 63)
	}
	return w, m
}

func (f *keyFilter) add(key string) {
	w, m := f.probe(key)
	w.Or(m)
	f.count.Add(1)
}

// addBytes adds key (maphash.Bytes hashes like maphash.String).
func (f *keyFilter) addBytes(key []byte) {
	w, m := f.probeHash(maphash.Bytes(f.seed, key))
	w.Or(m)
	f.count.Add(1)
}

// mayContain reports whether key may have a record; false is certain.
func (f *keyFilter) mayContain(key string) bool {
	w, m := f.probe(key)
	return w.Load()&m == m
}

// full reports whether the filter holds more keys than it was sized for.
func (f *keyFilter) full() bool { return f.count.Load() > f.capacity }

// The filter's life (committer side): a filter is built from a snapshot of
// the document keys in the background, while the committer adds every key
// it creates to it, so that once published (s.filter) it holds every key.
// The committer starts a build at start-up and whenever the filter in use
// is full; until a build is published, the previous filter (or none:
// always read) stays in use and keeps receiving new keys too.

// maybeBuildFilter starts a filter build if none is running and the
// filter in use is missing or full. Committer only.
func (s *Store) maybeBuildFilter() {
	if s.fbuilding != nil {
		if s.filter.Load() != s.fbuilding {
			return // still building
		}
		s.fbuilding = nil // published
	}
	cur := s.filter.Load()
	if cur != nil && !cur.full() {
		return
	}
	if s.isClosed() {
		return
	}
	st := s.next.st
	docs := int64(st.live + st.tombstones)
	if cur != nil {
		docs = max(docs, cur.count.Load())
	}
	f := newKeyFilter(2 * docs)
	s.fbuilding = f
	// Every create committed after this snapshot is added to f by the
	// committer (noteCreate); every key before it is in the snapshot.
	snap := s.db.NewSnapshot()
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		defer snap.Close()
		start := time.Now()
		n, err := fillFilter(f, snap, s.closing)
		if err != nil {
			if !s.isClosed() {
				s.log.Error("build key filter", "err", err)
			}
			return // s.fbuilding stays set: no retry until restart
		}
		s.filter.Store(f)
		s.log.Debug("key filter built", "keys", n, "words", len(f.words), "duration", time.Since(start).Round(time.Millisecond))
	}()
}

// fillFilter adds every document key of snap to f.
func fillFilter(f *keyFilter, snap *pebble.Snapshot, stop <-chan struct{}) (int, error) {
	it, err := snap.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixDoc}, UpperBound: []byte{prefixDoc + 1}})
	if err != nil {
		return 0, err
	}
	n := 0
	for it.First(); it.Valid(); it.Next() {
		f.addBytes(it.Key()[1:])
		n++
		if n%4096 == 0 {
			select {
			case <-stop:
				it.Close()
				return n, ErrClosed
			default:
			}
		}
	}
	return n, it.Close()
}

// noteCreate adds a key that is about to get its first record to the
// filters, before the record is applied. Committer only.
func (s *Store) noteCreate(key string) {
	f := s.filter.Load()
	if f != nil {
		f.add(key)
	}
	if b := s.fbuilding; b != nil && b != f {
		b.add(key)
	}
}

// absent reports whether key certainly has no document record as of the
// last applied group.
func (s *Store) absent(key string) bool {
	f := s.filter.Load()
	return f != nil && !f.mayContain(key)
}
