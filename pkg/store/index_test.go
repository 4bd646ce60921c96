package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/hlc"
	"github.com/shoal-dev/shoal/pkg/mst"
)

// rebuiltRoot rebuilds the index from the documents and returns the new
// root; the caller compares it with the incremental one.
func rebuiltRoot(t *testing.T, s *Store) mst.Hash {
	t.Helper()
	n := s.Status().Counters["mst_repairs"]
	s.RequestRepair()
	waitFor(t, func() bool { return s.Status().Counters["mst_repairs"] == n+1 })
	return s.Root()
}

// checkStoredNodes checks that the database holds exactly the nodes of the
// tree at its persisted root.
func checkStoredNodes(t *testing.T, s *Store) {
	t.Helper()
	v, err := s.View()
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	reachable := map[mst.Hash]bool{}
	err = mst.Walk(pebbleNodes{v.snap}, v.Root(), mst.Options{LevelBits: s.opts.MSTLevelBits}, func(h mst.Hash, _ *mst.Node) error {
		reachable[h] = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	it, err := v.snap.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixNode}, UpperBound: []byte{prefixNode + 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	stored := 0
	for it.First(); it.Valid(); it.Next() {
		var h mst.Hash
		copy(h[:], it.Key()[1:])
		if !reachable[h] {
			t.Fatalf("stored node %x is not in the tree", h[:8])
		}
		stored++
	}
	if stored != len(reachable) {
		t.Fatalf("%d nodes stored, the tree has %d", stored, len(reachable))
	}
}

func TestIndexOpEncoding(t *testing.T) {
	digest := crdt.Digest{1, 2, 3}
	prev := hlc.Timestamp{Wall: 1700000000000000000, Logical: 3}
	next := hlc.Timestamp{Wall: 1700000000000000001}
	for _, hasPrev := range []bool{false, true} {
		want := encodeIndexOp("/a/b", prev, next, hasPrev, true, &digest)
		b := new(pebble.Batch)
		setIndexOp(b, 7, "/a/b", prev, next, hasPrev, &digest)
		setRecord(b, "/a/b", 300, []byte("doc"))
		setChange(b, 9, "/a/b", []byte("doc"))
		r := b.Reader()
		for i, exp := range []struct{ key, val []byte }{
			{indexOpKey(7), want},
			{docKey("/a/b"), encodeRecord(300, []byte("doc"))},
			{changeKey(9), encodeChange("/a/b", []byte("doc"))},
		} {
			_, k, v, ok, err := r.Next()
			if !ok || err != nil || !bytes.Equal(k, exp.key) || !bytes.Equal(v, exp.val) {
				t.Fatalf("record %d: %q=%x, want %q=%x (%v)", i, k, v, exp.key, exp.val, err)
			}
		}
		op, err := decodeIndexOp(want)
		if err != nil {
			t.Fatal(err)
		}
		if op.key != "/a/b" || !bytes.Equal(op.next, next.AppendBinary(nil)) || !bytes.Equal(op.digest, digest[:]) ||
			(op.prev != nil) != hasPrev || (hasPrev && !bytes.Equal(op.prev, prev.AppendBinary(nil))) {
			t.Fatalf("decoded %+v", op)
		}
	}
	purge := encodeIndexOp("/x", prev, hlc.Timestamp{}, true, false, nil)
	op, err := decodeIndexOp(purge)
	if err != nil || op.next != nil || op.key != "/x" {
		t.Fatalf("purge op %+v %v", op, err)
	}
	for _, bad := range [][]byte{nil, {0}, {4, '/'}, {opHasNext, '/'}, append([]byte{opHasPrev}, make([]byte, 12)...)} {
		if _, err := decodeIndexOp(bad); err == nil {
			t.Fatalf("decoded bad op %x", bad)
		}
	}
	for _, v := range []uint64{0, 1, 127, 128, 1 << 14, 1<<63 + 5} {
		if uvarintLen(v) != len(binary.AppendUvarint(nil, v)) {
			t.Fatalf("uvarintLen(%d)", v)
		}
	}
}

// FuzzDecodeIndexOp: index op log entries never crash the decoder, and what
// decodes re-encodes to the same bytes.
func FuzzDecodeIndexOp(f *testing.F) {
	d := crdt.Digest{9}
	ts := hlc.Timestamp{Wall: 5, Logical: 1}
	f.Add(encodeIndexOp("/k", ts, ts, true, true, &d))
	f.Add(encodeIndexOp("/k", ts, ts, false, true, &d))
	f.Add(encodeIndexOp("/k", ts, ts, true, false, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		op, err := decodeIndexOp(b)
		if err != nil {
			return
		}
		var prev, next hlc.Timestamp
		var digest crdt.Digest
		if op.prev != nil {
			prev, _ = hlc.Decode(op.prev)
		}
		if op.next != nil {
			next, _ = hlc.Decode(op.next)
			copy(digest[:], op.digest)
		}
		if got := encodeIndexOp(op.key, prev, next, op.prev != nil, op.next != nil, &digest); !bytes.Equal(got, b) {
			t.Fatalf("index op does not round-trip: %x -> %x", b, got)
		}
	})
}

// Writes acknowledged while the indexer is held back (as if the process
// died before the index caught up) are indexed at the next start, from
// the op log, to the same root a rebuild from the documents gives.
func TestIndexReplaysOpLogAfterRestart(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	s, err := Open(Options{Dir: dir, NodeID: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 300 {
		mustPut(t, s, fmt.Sprintf("/k/%03d", i), "v", fmt.Sprint(i))
	}
	indexed := s.Root()
	s.testHoldIndex.Store(true)
	for i := range 300 {
		mustPut(t, s, fmt.Sprintf("/k/%03d", (i*7)%400), "v", fmt.Sprint(-i))
	}
	for i := 0; i < 300; i += 11 {
		if _, err := s.Delete(ctx, fmt.Sprintf("/k/%03d", i), nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Purge(ctx, []string{"/k/011", "/k/022", "/k/005"}, func(d crdt.Doc) bool { return !d.Exists() }); err != nil {
		t.Fatal(err)
	}
	if s.index.Load().root != indexed {
		t.Fatal("the held indexer moved")
	}
	rev := s.Revision()
	s.Close()

	db, err := pebble.Open(dir, &pebble.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cs, err := readCommitScalars(db)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := readBytes(db, keyIndexed)
	db.Close()
	if lag := cs.opSeq - binary.BigEndian.Uint64(b); lag < 300 {
		t.Fatalf("index lags %d ops, want ≥ 300", lag)
	}

	s2 := openTest(t, dir)
	root := s2.Root()
	if root == indexed || s2.Revision() != rev {
		t.Fatalf("restart did not replay: root %x rev %d (want %d)", root[:8], s2.Revision(), rev)
	}
	checkStoredNodes(t, s2)
	if r := rebuiltRoot(t, s2); r != root {
		t.Fatalf("replayed root %x, rebuilt %x", root[:8], r[:8])
	}
}

// The index is applied in batches off the write path; after any mix of
// writes, Root (which waits for the index) equals a rebuild, and the
// database holds exactly the tree's nodes.
func TestIndexMatchesRebuildUnderConcurrentWrites(t *testing.T) {
	s := openTest(t, t.TempDir())
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for i := range 400 {
				key := fmt.Sprintf("/c/%d", r.IntN(150))
				var err error
				switch r.IntN(6) {
				case 0:
					_, err = s.Delete(ctx, key, nil)
				case 1:
					_, err = s.Delete(ctx, key, []string{"a"})
				default:
					_, err = s.Put(ctx, key, map[string]crdt.Value{fmt.Sprintf("f%d", r.IntN(3)): crdt.Int(int64(i))})
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	root := s.Root()
	checkStoredNodes(t, s)
	if r := rebuiltRoot(t, s); r != root {
		t.Fatalf("incremental root %x, rebuilt %x", root[:8], r[:8])
	}
	if st := s.Status(); st.Counters["index_batches"] == 0 {
		t.Fatalf("no index batch counted: %+v", st.Counters)
	}
}

// Concurrent writers to the same keys lose nothing: a document read ahead
// by a writer is used only if no later write changed it.
func TestConcurrentWritesToSameKeysLoseNothing(t *testing.T) {
	s := openTest(t, t.TempDir())
	const writers, each, keys = 8, 300, 3
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				key := fmt.Sprintf("/same/%d", i%keys)
				if _, err := s.Put(context.Background(), key, map[string]crdt.Value{fmt.Sprintf("w%d", w): crdt.Int(int64(i))}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for k := range keys {
		rec, _, err := s.Get(fmt.Sprintf("/same/%d", k))
		if err != nil {
			t.Fatal(err)
		}
		live := rec.Doc.Live()
		for w := range writers {
			last := each - keys + k
			if v, _ := live[fmt.Sprintf("w%d", w)].AsInt(); v != int64(last) {
				t.Fatalf("/same/%d field w%d = %d, want %d (lost update)", k, w, v, last)
			}
		}
	}
	if st := s.Status(); st.Revision != writers*each {
		t.Fatalf("revision %d, want %d", st.Revision, writers*each)
	}
}

func TestRecentWrites(t *testing.T) {
	w := newRecentWrites(100)
	if !w.current("/a", 100) || w.current("/a", 99) {
		t.Fatal("window start")
	}
	w.note([]string{"/a"}, 105)
	if w.current("/a", 104) || !w.current("/a", 105) || !w.current("/b", 101) {
		t.Fatal("after one group")
	}
	// Fill two generations: /a's write leaves the window, old reads of
	// anything become unverifiable.
	for seq := uint64(106); seq < 106+3*recentWindow; seq += 1000 {
		w.note([]string{"/x"}, seq)
	}
	if w.current("/b", 101) {
		t.Fatal("a read older than the window counts as current")
	}
	if !w.current("/a", w.since) {
		t.Fatal("a read at the window start after no write to the key")
	}
}

func TestKeyFilter(t *testing.T) {
	f := newKeyFilter(1000)
	for i := range 20000 {
		k := fmt.Sprintf("/f/%d", i)
		if i%2 == 0 {
			f.add(k)
		} else {
			f.addBytes([]byte(k))
		}
	}
	fp := 0
	for i := range 20000 {
		if !f.mayContain(fmt.Sprintf("/f/%d", i)) {
			t.Fatalf("false negative for /f/%d", i)
		}
		if f.mayContain(fmt.Sprintf("/g/%d", i)) {
			fp++
		}
	}
	if fp > 20000/20 {
		t.Fatalf("%d false positives in 20000", fp)
	}
	if f.full() {
		t.Fatal("full after 20000 keys")
	}
	seed := maphash.MakeSeed()
	if maphash.String(seed, "/k") != maphash.Bytes(seed, []byte("/k")) {
		t.Fatal("maphash.String and Bytes disagree")
	}
}

// Keys created while the filter is being built, and keys that existed
// before, are all in the filter once it is published, so updates after a
// restart merge into the stored documents.
func TestKeyFilterBuiltWhileWriting(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, NodeID: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3000 {
		mustPut(t, s, fmt.Sprintf("/old/%d", i), "a", "1")
	}
	s.Close()

	s2 := openTest(t, dir)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				if _, err := s2.Put(context.Background(), fmt.Sprintf("/new/%d/%d", w, i), map[string]crdt.Value{"a": crdt.String("1")}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	waitFor(t, func() bool { return s2.filter.Load() != nil })
	f := s2.filter.Load()
	for i := range 3000 {
		if !f.mayContain(fmt.Sprintf("/old/%d", i)) {
			t.Fatalf("filter misses /old/%d", i)
		}
	}
	for w := range 4 {
		for i := range 500 {
			if !f.mayContain(fmt.Sprintf("/new/%d/%d", w, i)) {
				t.Fatalf("filter misses /new/%d/%d", w, i)
			}
		}
	}
	// An update through the filter merges into the stored document.
	mustPut(t, s2, "/old/7", "b", "2")
	rec, _, err := s2.Get("/old/7")
	if err != nil || liveText(rec.Doc) != "a=1 b=2" {
		t.Fatalf("update after restart: %q %v", liveText(rec.Doc), err)
	}
	if st := s2.Status(); st.Live != 3000+4*500 {
		t.Fatalf("live %d", st.Live)
	}
}

// A format 1 store (separate scalars, no op log) opens as format 2 with the
// same state and root, and takes writes.
func TestUpgradeFromFormat1(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, NodeID: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		mustPut(t, s, fmt.Sprintf("/u/%03d", i), "v", fmt.Sprint(i))
	}
	if _, err := s.Delete(context.Background(), "/u/003", nil); err != nil {
		t.Fatal(err)
	}
	before := s.Status()
	last := s.Clock().Last()
	s.Close()

	// Rewrite the scalars the way format 1 kept them.
	db, err := pebble.Open(dir, &pebble.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cs, err := readCommitScalars(db)
	if err != nil {
		t.Fatal(err)
	}
	b := db.NewBatch()
	b.Set(keyFormat, u64(1), nil)
	b.Set(keyRevV1, u64(cs.rev), nil)
	b.Set(keyHLCV1, cs.hlc.AppendBinary(nil), nil)
	b.Set(keyLiveV1, u64(cs.live), nil)
	b.Set(keyTombstonesV1, u64(cs.tombstones), nil)
	b.Delete(keyCommit, nil)
	b.Delete(keyIndexed, nil)
	b.DeleteRange([]byte{prefixIndexOp}, []byte{prefixIndexOp + 1}, nil)
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	db.Close()

	s2 := openTest(t, dir)
	after := s2.Status()
	if after.Root != before.Root || after.Revision != before.Revision || after.Live != before.Live || after.Tombstones != before.Tombstones {
		t.Fatalf("upgrade changed the state:\nbefore %+v\nafter  %+v", before, after)
	}
	if now := s2.Clock().Now(); !last.Less(now) {
		t.Fatal("clock not restored from format 1")
	}
	mustPut(t, s2, "/u/001", "w", "x")
	mustPut(t, s2, "/u/900", "w", "x")
	if r := rebuiltRoot(t, s2); r != s2.Root() {
		t.Fatal("index diverged after upgrade")
	}
	if f, _ := s2.getUint(keyFormat); f != formatVersion {
		t.Fatalf("format %d after upgrade", f)
	}
}

// Local writes are stamped by the writers' goroutines, ahead of the
// commit; a write that a later-stamped one overtook is stamped again, so
// that, as when the committer stamped every write, each local write's
// stamp exceeds every stamp committed before it.
func TestLocalStampsIncreaseWithRevision(t *testing.T) {
	s := openTest(t, t.TempDir())
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				key := fmt.Sprintf("/s/%d/%d", w, i%7)
				var err error
				if i%5 == 4 {
					_, err = s.Delete(context.Background(), key, nil)
				} else {
					_, err = s.Put(context.Background(), key, map[string]crdt.Value{"v": crdt.Int(int64(i))})
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	events, upto, err := s.readChanges("", 0, s.Revision())
	for err == nil && upto < s.Revision() {
		var more []Event
		more, upto, err = s.readChanges("", upto, s.Revision())
		events = append(events, more...)
	}
	if err != nil {
		t.Fatal(err)
	}
	var last hlc.Timestamp
	for _, e := range events {
		ts := e.Doc.MaxStamp().TS
		if !last.Less(ts) {
			t.Fatalf("revision %d has stamp %v, not after %v", e.Rev, ts, last)
		}
		last = ts
	}
	if len(events) == 0 || uint64(len(events)) != s.Revision() {
		t.Fatalf("%d events for revision %d", len(events), s.Revision())
	}
}

// A full filter is replaced by a bigger one built in the background, and
// no key is lost on the way.
func TestKeyFilterGrows(t *testing.T) {
	defer func(n int64) { filterMinKeys = n }(filterMinKeys)
	filterMinKeys = 16
	s := openTest(t, t.TempDir())
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				if _, err := s.Put(context.Background(), fmt.Sprintf("/g/%d/%d", w, i), map[string]crdt.Value{"a": crdt.Int(1)}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	// Updates go through whichever filter is in use (and keep the
	// committer checking whether it needs a bigger one).
	for i := range 300 {
		mustPut(t, s, fmt.Sprintf("/g/2/%d", i), "b", "2")
	}
	waitFor(t, func() bool { f := s.filter.Load(); return f != nil && f.capacity >= 1200 })
	f := s.filter.Load()
	for w := range 4 {
		for i := range 300 {
			if !f.mayContain(fmt.Sprintf("/g/%d/%d", w, i)) {
				t.Fatalf("grown filter misses /g/%d/%d", w, i)
			}
		}
	}
	rec, _, err := s.Get("/g/2/7")
	if err != nil || len(rec.Doc.Live()) != 2 {
		t.Fatalf("update after growth: %v %v", rec.Doc.Live(), err)
	}
	if st := s.Status(); st.Live != 1200 {
		t.Fatalf("live %d", st.Live)
	}
}

// Writers racing Close get ErrClosed (or succeed), and nothing reads the
// database after it closed.
func TestCloseWhileWriting(t *testing.T) {
	s, err := Open(Options{Dir: t.TempDir(), NodeID: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				key := fmt.Sprintf("/x/%d/%d", w, i%50)
				var err error
				if w%2 == 0 {
					_, err = s.Put(context.Background(), key, map[string]crdt.Value{"v": crdt.Int(int64(i))})
				} else {
					err = s.MergeBatch(context.Background(), []KeyedDoc{{Key: key, Doc: crdt.Set(map[string]crdt.Value{"v": crdt.Int(int64(i))},
						crdt.Stamp{TS: s.Clock().Now(), Node: "n2"})}})[0].Err
				}
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	time.Sleep(50 * time.Millisecond)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}
