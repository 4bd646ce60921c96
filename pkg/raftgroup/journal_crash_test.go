package raftgroup

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// journalStore is what the host keeps of the journal: Pebble without a
// WAL and the journal beside it, on a filesystem that can crash.
type journalStore struct {
	fs *vfs.MemFS
	db *pebble.DB
	j  *journal
	ks keyspace
}

func openJournalStore(t *testing.T, fs *vfs.MemFS, segSize int64) *journalStore {
	t.Helper()
	o := pebbleOptions(pebbleLogger{slog.New(slog.DiscardHandler)})
	o.FS = fs
	db, err := pebble.Open("/db", o)
	o.Cache.Unref()
	if err != nil {
		t.Fatal(err)
	}
	j, err := openJournal(fs, "/db/entries")
	if err != nil {
		t.Fatal(err)
	}
	j.maxSize = segSize
	s := &journalStore{fs: fs, db: db, j: j}
	if _, err := j.replay(db, s.ks); err != nil {
		t.Fatalf("replay: %v", err)
	}
	return s
}

func (s *journalStore) close() {
	s.j.close()
	s.db.Close()
}

// op is one batch of the test: a put of key put (with, for odd keys, a
// blob the value references) or, with trunc, the deletion of every key
// below trunc, as log truncation does.
type op struct {
	put, trunc int
	sync       bool
}

func (s *journalStore) apply(t *testing.T, o op) {
	t.Helper()
	b := s.db.NewBatch()
	defer b.Close()
	if o.trunc > 0 {
		if err := b.DeleteRange(key(0), key(o.trunc), nil); err != nil {
			t.Fatal(err)
		}
	} else {
		val := fmt.Appendf(nil, "value %d", o.put)
		if o.put%2 == 1 {
			ref, err := s.j.blob(blobOf(o.put))
			if err != nil {
				t.Fatal(err)
			}
			s.j.addRef(1, uint64(o.put), ref.seg)
			val = append(ref.header(), val...)
		}
		if err := b.Set(key(o.put), val, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.j.batch(b, s.ks, o.sync); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(pebble.NoSync); err != nil {
		t.Fatal(err)
	}
	if o.trunc > 0 {
		// As stageCompact's commit does, once the batch is written.
		if s.j.release(1, uint64(o.trunc-1)) {
			s.j.releasedWritten()
		}
	}
}

func blobOf(i int) []byte { return bytes.Repeat(fmt.Appendf(nil, "blob %d;", i), 100) }

func key(i int) []byte { return binary.BigEndian.AppendUint64([]byte("k"), uint64(i)) }

// model returns the keys that the first n ops leave.
func model(ops []op, n int) map[int]bool {
	m := map[int]bool{}
	for _, o := range ops[:n] {
		if o.trunc > 0 {
			for k := range m {
				if k < o.trunc {
					delete(m, k)
				}
			}
		} else {
			m[o.put] = true
		}
	}
	return m
}

// TestJournalCrashKeepsAPrefixAndEverySyncedWrite writes batches, some
// synced and some not, with blobs, truncations, segment rotation, Pebble
// flushes and segments dropped and written over, then crashes at random
// moments keeping a random part of what was not synced. After each
// restart the store must be the state after some prefix of the batches
// that includes every synced one, and every blob a value references must
// read back intact.
func TestJournalCrashKeepsAPrefixAndEverySyncedWrite(t *testing.T) {
	for seed := range uint64(40) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 77))
			fs := vfs.NewCrashableMem()
			s := openJournalStore(t, fs, 8<<10)
			var ops []op
			next, synced := 0, 0 // synced: ops[:synced] must survive
			for crash := range 5 {
				for range 20 + rng.IntN(60) {
					o := op{put: next, sync: rng.IntN(3) == 0}
					if rng.IntN(8) == 0 && next > 4 {
						o = op{trunc: next - 4, sync: rng.IntN(3) == 0}
					} else {
						next++
					}
					s.apply(t, o)
					ops = append(ops, o)
					if o.sync {
						synced = len(ops)
					}
					if rng.IntN(15) == 0 {
						if err := s.db.Flush(); err != nil {
							t.Fatal(err)
						}
					}
					if err := s.j.collect(s.db); err != nil {
						t.Fatal(err)
					}
				}
				crashed := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: rng.IntN(101), RNG: rand.New(rand.NewPCG(seed, uint64(crash)))})
				s.close()
				fs = crashed
				s = openJournalStore(t, fs, 8<<10)
				got := map[int]bool{}
				it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte("k"), UpperBound: []byte("l")})
				if err != nil {
					t.Fatal(err)
				}
				for valid := it.First(); valid; valid = it.Next() {
					i := int(binary.BigEndian.Uint64(it.Key()[1:]))
					got[i] = true
					ref, rest, err := splitRef(it.Value())
					if err != nil {
						t.Fatal(err)
					}
					if string(rest) != fmt.Sprint("value ", i) {
						t.Fatalf("crash %d: key %d = %q", crash, i, rest)
					}
					if ref != nil {
						s.j.addRef(1, uint64(i), ref.seg)
						data, err := s.j.read(*ref)
						if err != nil {
							t.Fatalf("crash %d: blob of key %d: %v", crash, i, err)
						}
						if !bytes.Equal(data, blobOf(i)) {
							t.Fatalf("crash %d: blob of key %d differs", crash, i)
						}
					}
				}
				it.Close()
				kept := -1
				for n := len(ops); n >= synced; n-- {
					if maps.Equal(model(ops, n), got) {
						kept = n
						break
					}
				}
				if kept < 0 {
					t.Fatalf("crash %d: the store holds %v, not the state after %d or more of %d batches; ops %v; model %v", crash, slices.Sorted(maps.Keys(got)), synced, len(ops), ops, slices.Sorted(maps.Keys(model(ops, synced))))
				}
				// Go on from what survived.
				ops = ops[:kept]
				synced = kept
				next = 0
				for _, o := range ops {
					if o.trunc == 0 {
						next = o.put + 1
					}
				}
				if err := s.j.dropUnreferenced(); err != nil {
					t.Fatal(err)
				}
			}
			s.close()
		})
	}
}

// TestJournalKeepsBlobsUntilTheirReleaseIsDurable: a segment whose blobs
// a truncation released stays until that truncation is durable, even when
// Pebble flushed the segment's own batches before: otherwise a crash that
// loses the truncation brings back references to a segment that is gone.
func TestJournalKeepsBlobsUntilTheirReleaseIsDurable(t *testing.T) {
	fs := vfs.NewCrashableMem()
	s := openJournalStore(t, fs, 4<<10)
	s.apply(t, op{put: 1, sync: true}) // a blob in the first segment
	first := s.j.active.id
	for i := 2; s.j.active.id == first; i += 2 {
		s.apply(t, op{put: i, sync: true}) // no blobs: only batches
	}
	// Pebble holds every batch of the first segment in its tables.
	if err := s.db.Flush(); err != nil {
		t.Fatal(err)
	}
	s.j.flushed = s.j.seq
	if err := s.j.collect(s.db); err != nil {
		t.Fatal(err)
	}
	if s.j.segs[first] == nil {
		t.Fatal("the segment holding a referenced blob was dropped")
	}
	s.apply(t, op{trunc: 2})  // releases the blob, unsynced
	s.apply(t, op{put: 1002}) // unsynced too (no blob)
	if err := s.j.collect(s.db); err != nil {
		t.Fatal(err)
	}
	if s.j.segs[first] == nil {
		t.Fatal("the segment was dropped before the truncation that released it was durable")
	}
	// Once a sync made the truncation durable (and the flush that collect
	// started in the background ended), it goes.
	s.apply(t, op{put: 1003, sync: true})
	for deadline := time.Now().Add(10 * time.Second); s.j.segs[first] != nil; {
		if time.Now().After(deadline) {
			t.Fatal("the segment outlived a durable truncation")
		}
		if err := s.j.collect(s.db); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	s.close()
}

// TestJournalEndStaysPut: a crash leaves the last record torn with its
// header intact. The replay ends there, and the journal goes on in a new
// segment with that record's sequence number. After a second crash the
// replay must read the new records, not end again at the torn one.
func TestJournalEndStaysPut(t *testing.T) {
	fs := vfs.NewCrashableMem()
	s := openJournalStore(t, fs, 1<<20)
	for i := 2; i <= 10; i += 2 { // even keys: no blobs, one record each
		s.apply(t, op{put: i, sync: true})
	}
	seg := s.j.active
	path := s.fs.PathJoin(s.j.dir, segmentName(seg.id))
	crashed := fs.CrashClone(vfs.CrashCloneCfg{}) // synced data only: Pebble's memtable is lost
	s.close()
	fs = crashed
	// Tear the last record's payload: its last byte.
	st, err := fs.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := fs.OpenReadWrite(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{0xff}, st.Size()-1); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()

	keys := func(s *journalStore) []int {
		var got []int
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte("k"), UpperBound: []byte("l")})
		if err != nil {
			t.Fatal(err)
		}
		defer it.Close()
		for valid := it.First(); valid; valid = it.Next() {
			got = append(got, int(binary.BigEndian.Uint64(it.Key()[1:])))
		}
		return got
	}
	s = openJournalStore(t, fs, 1<<20)
	if got := keys(s); !slices.Equal(got, []int{2, 4, 6, 8}) {
		t.Fatalf("after the first crash: %v, want the torn record's batch gone", got)
	}
	s.apply(t, op{put: 12, sync: true}) // takes the torn record's sequence number
	s.apply(t, op{put: 14, sync: true})
	crashed = fs.CrashClone(vfs.CrashCloneCfg{})
	s.close()
	s = openJournalStore(t, crashed, 1<<20)
	defer s.close()
	if got := keys(s); !slices.Equal(got, []int{2, 4, 6, 8, 12, 14}) {
		t.Fatalf("after the second crash: %v, want the writes since the first", got)
	}
}
