package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/containerd/errdefs"

	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/hlc"
	"github.com/shoal-dev/shoal/pkg/mst"
)

func openTest(t *testing.T, dir string, opts ...func(*Options)) *Store {
	t.Helper()
	o := Options{Dir: dir, NodeID: "n1"}
	for _, f := range opts {
		f(&o)
	}
	s, err := Open(o)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func mustPut(t *testing.T, s *Store, key string, kv ...string) WriteResult {
	t.Helper()
	fields := map[string]crdt.Value{}
	for i := 0; i+1 < len(kv); i += 2 {
		fields[kv[i]] = crdt.String(kv[i+1])
	}
	res, err := s.Put(context.Background(), key, fields)
	if err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
	return res
}

func liveText(d crdt.Doc) string {
	var parts []string
	live := d.Live()
	for _, name := range slices.Sorted(maps.Keys(live)) {
		parts = append(parts, name+"="+live[name].Text())
	}
	return strings.Join(parts, " ")
}

func TestPutGetDelete(t *testing.T) {
	s := openTest(t, t.TempDir())
	ctx := context.Background()
	r1 := mustPut(t, s, "/a/b", "x", "1", "y", "2")
	if r1.Rev != 1 || !r1.Changed || r1.Existed {
		t.Fatalf("first put: %+v", r1)
	}
	r2 := mustPut(t, s, "/a/b", "y", "3")
	if r2.Rev != 2 || !r2.Existed {
		t.Fatalf("second put: %+v", r2)
	}
	rec, rev, err := s.Get("/a/b")
	if err != nil || rev != 2 || rec.Rev != 2 {
		t.Fatalf("get: %+v rev=%d err=%v", rec, rev, err)
	}
	if got := liveText(rec.Doc); got != "x=1 y=3" {
		t.Fatalf("fields = %q", got)
	}
	res, err := s.Delete(ctx, "/a/b", []string{"x"})
	if err != nil || !res.Existed || res.Rev != 3 {
		t.Fatalf("delete field: %+v %v", res, err)
	}
	res, err = s.Delete(ctx, "/a/b", []string{"x"})
	if err != nil || res.Existed || res.Changed || res.Rev != 3 {
		t.Fatalf("delete absent field changed something: %+v %v", res, err)
	}
	if _, err := s.Delete(ctx, "/a/b", nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Get("/a/b"); !errdefs.IsNotFound(err) {
		t.Fatalf("get deleted: %v, want not found", err)
	}
	st := s.Status()
	if st.Live != 0 || st.Tombstones != 1 || st.Revision != 4 {
		t.Fatalf("status after delete: %+v", st)
	}
	// A document re-created after a delete holds only the new fields.
	mustPut(t, s, "/a/b", "z", "9")
	rec, _, _ = s.Get("/a/b")
	if got := liveText(rec.Doc); got != "z=9" {
		t.Fatalf("re-created doc = %q", got)
	}
}

func TestBadInputChangesNothing(t *testing.T) {
	s := openTest(t, t.TempDir())
	ctx := context.Background()
	mustPut(t, s, "/ok", "a", "1")
	before := s.Status()
	big := crdt.Bytes(bytes.Repeat([]byte{1}, crdt.MaxDocSize))
	cases := []struct {
		name string
		do   func() error
	}{
		{"empty key", func() error { _, err := s.Put(ctx, "", map[string]crdt.Value{"a": crdt.String("x")}); return err }},
		{"relative key", func() error { _, err := s.Put(ctx, "a/b", map[string]crdt.Value{"a": crdt.String("x")}); return err }},
		{"trailing slash", func() error { _, err := s.Put(ctx, "/a/", map[string]crdt.Value{"a": crdt.String("x")}); return err }},
		{"empty segment", func() error { _, err := s.Put(ctx, "/a//b", map[string]crdt.Value{"a": crdt.String("x")}); return err }},
		{"control char", func() error { _, err := s.Put(ctx, "/a\nb", map[string]crdt.Value{"a": crdt.String("x")}); return err }},
		{"long key", func() error {
			_, err := s.Put(ctx, "/"+strings.Repeat("k", MaxKeyLen), map[string]crdt.Value{"a": crdt.String("x")})
			return err
		}},
		{"no fields", func() error { _, err := s.Put(ctx, "/ok", nil); return err }},
		{"bad field name", func() error { _, err := s.Put(ctx, "/ok", map[string]crdt.Value{"a b": crdt.String("x")}); return err }},
		{"unknown kind", func() error {
			_, err := s.Put(ctx, "/ok", map[string]crdt.Value{"a": {Kind: 42, Data: []byte{1}}})
			return err
		}},
		{"bad int", func() error {
			_, err := s.Put(ctx, "/ok", map[string]crdt.Value{"a": {Kind: crdt.KindInt, Data: []byte{1}}})
			return err
		}},
		{"oversized value", func() error { _, err := s.Put(ctx, "/ok", map[string]crdt.Value{"a": big}); return err }},
		{"oversized doc", func() error {
			half := crdt.Bytes(bytes.Repeat([]byte{2}, crdt.MaxDocSize/2+10))
			_, err := s.Put(ctx, "/ok", map[string]crdt.Value{"h1": half, "h2": half})
			return err
		}},
		{"bad prefix", func() error { _, _, _, err := s.List(ListOptions{Prefix: "x"}); return err }},
	}
	for _, c := range cases {
		err := c.do()
		if !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: err = %v, want invalid argument", c.name, err)
		}
	}
	after := s.Status()
	if after.Revision != before.Revision || after.Root != before.Root || after.Live != before.Live {
		t.Fatalf("bad input changed the store: before %+v after %+v", before, after)
	}
	rec, _, err := s.Get("/ok")
	if err != nil || liveText(rec.Doc) != "a=1" {
		t.Fatalf("/ok changed: %v %v", liveText(rec.Doc), err)
	}
}

func TestRestartKeepsStateAndRoot(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, NodeID: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 300 {
		mustPut(t, s, fmt.Sprintf("/k/%03d", i), "v", fmt.Sprint(i))
	}
	for i := 0; i < 300; i += 7 {
		if _, err := s.Delete(context.Background(), fmt.Sprintf("/k/%03d", i), nil); err != nil {
			t.Fatal(err)
		}
	}
	before := s.Status()
	last := s.Clock().Last()
	s.Close()

	s2 := openTest(t, dir)
	after := s2.Status()
	if after.Root != before.Root || after.Revision != before.Revision || after.Live != before.Live || after.Tombstones != before.Tombstones {
		t.Fatalf("restart changed status:\nbefore %+v\nafter  %+v", before, after)
	}
	if now := s2.Clock().Now(); !last.Less(now) {
		t.Fatalf("clock went backwards across restart: %v then %v", last, now)
	}
	rec, _, err := s2.Get("/k/001")
	if err != nil || liveText(rec.Doc) != "v=1" {
		t.Fatalf("get after restart: %v %v", rec, err)
	}
	if s2.NodeID() != "n1" {
		t.Fatalf("node id %q", s2.NodeID())
	}
	if _, err := Open(Options{Dir: t.TempDir() + "/x", NodeID: "n1"}); err != nil {
		t.Fatal(err)
	}
}

func TestNodeIDMismatchRefused(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, NodeID: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := Open(Options{Dir: dir, NodeID: "n2"}); err == nil || !strings.Contains(err.Error(), "belongs to node") {
		t.Fatalf("open with other node id: %v", err)
	}
}

// The index of a store equals the index built from scratch from its
// documents, whatever order the writes came in: the root depends only on
// the content.
func TestRootIndependentOfWriteOrder(t *testing.T) {
	a := openTest(t, t.TempDir())
	b := openTest(t, t.TempDir(), func(o *Options) { o.NodeID = "n2" })
	ctx := context.Background()
	// Build documents on a, then replay them into b in reverse via Merge.
	for i := range 50 {
		mustPut(t, a, fmt.Sprintf("/d/%02d", i), "f", fmt.Sprint(i))
	}
	recs, _, _, err := a.List(ListOptions{Limit: 1000, Tombstones: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := len(recs) - 1; i >= 0; i-- {
		if _, err := b.Merge(ctx, recs[i].Key, recs[i].Doc); err != nil {
			t.Fatal(err)
		}
	}
	if a.Root() != b.Root() {
		t.Fatalf("roots differ: %x vs %x", a.Root(), b.Root())
	}
	// Merging again changes nothing.
	res, err := b.Merge(ctx, recs[0].Key, recs[0].Doc)
	if err != nil || res.Changed {
		t.Fatalf("repeated merge changed: %+v %v", res, err)
	}
}

func TestMergeRejectsSkew(t *testing.T) {
	now := time.Now().UnixNano()
	clock := hlc.NewClock(func() int64 { return now }, 500*time.Millisecond)
	s := openTest(t, t.TempDir(), func(o *Options) { o.Clock = clock })
	future := crdt.Set(map[string]crdt.Value{"a": crdt.String("x")},
		crdt.Stamp{TS: hlc.Timestamp{Wall: now + int64(2*time.Second)}, Node: "evil"})
	_, err := s.Merge(context.Background(), "/a", future)
	if !errors.Is(err, hlc.ErrSkew) || !errdefs.IsInvalidArgument(err) {
		t.Fatalf("merge from the future: %v", err)
	}
	if st := s.Status(); st.Revision != 0 || st.Counters["skew_rejected"] != 1 {
		t.Fatalf("status after rejected merge: %+v", st)
	}
}

func TestConcurrentWritersGroupCommit(t *testing.T) {
	s := openTest(t, t.TempDir())
	const writers, each = 32, 20
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if _, err := s.Put(context.Background(), fmt.Sprintf("/w/%d/%d", w, i), map[string]crdt.Value{"v": crdt.Int(int64(i))}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st := s.Status()
	if st.Live != writers*each || st.Revision != writers*each {
		t.Fatalf("status %+v", st)
	}
	// Writers wait for the WAL sync while the committer applies the next
	// group: with 32 of them, some group holds more than one write (every
	// group being a single write would take 640 syncs in a row, each
	// finishing before any other writer queued).
	if st.Counters["commits"] >= st.Counters["changes"] {
		t.Fatalf("no grouping: %d commits for %d changes", st.Counters["commits"], st.Counters["changes"])
	}
	// The index matches a from-scratch rebuild.
	root := s.Root()
	s.RequestRepair()
	waitFor(t, func() bool { return s.Status().Counters["mst_repairs"] == 1 })
	if s.Root() != root {
		t.Fatalf("rebuilt root %x differs from incremental %x", s.Root(), root)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestListPagination(t *testing.T) {
	s := openTest(t, t.TempDir())
	for i := range 25 {
		mustPut(t, s, fmt.Sprintf("/p/%02d", i), "v", "x")
	}
	mustPut(t, s, "/q", "v", "x")
	if _, err := s.Delete(context.Background(), "/p/03", nil); err != nil {
		t.Fatal(err)
	}
	var keys []string
	after := ""
	pages := 0
	for {
		recs, _, more, err := s.List(ListOptions{Prefix: "/p/", After: after, Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, r := range recs {
			keys = append(keys, r.Key)
		}
		if !more {
			break
		}
		after = recs[len(recs)-1].Key
	}
	if len(keys) != 24 || pages != 3 || keys[0] != "/p/00" || keys[3] != "/p/04" {
		t.Fatalf("pages=%d keys=%v", pages, keys)
	}
	recs, _, _, _ := s.List(ListOptions{Prefix: "/p/", Tombstones: true, Limit: 100})
	if len(recs) != 25 {
		t.Fatalf("with tombstones: %d", len(recs))
	}
}

func TestWatchReplayAndFollow(t *testing.T) {
	s := openTest(t, t.TempDir())
	for i := range 5 {
		mustPut(t, s, fmt.Sprintf("/w/%d", i), "v", "x")
	}
	mustPut(t, s, "/other", "v", "x")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan Event, 100)
	go s.Watch(ctx, "/w/", 2, func(b WatchBatch) error {
		for _, e := range b.Events {
			got <- e
		}
		return nil
	})
	for i := 5; i < 8; i++ {
		mustPut(t, s, fmt.Sprintf("/w/%d", i), "v", "x")
	}
	if _, err := s.Delete(context.Background(), "/w/0", nil); err != nil {
		t.Fatal(err)
	}
	want := []uint64{3, 4, 5, 7, 8, 9, 10}
	for _, rev := range want {
		select {
		case e := <-got:
			if e.Rev != rev {
				t.Fatalf("event rev %d, want %d", e.Rev, rev)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no event for rev %d", rev)
		}
	}
	select {
	case e := <-got:
		t.Fatalf("unexpected event %+v", e)
	case <-time.After(50 * time.Millisecond):
	}
}

func TestWatchCompacted(t *testing.T) {
	s := openTest(t, t.TempDir(), func(o *Options) { o.WatchHistory = 8 })
	for i := range 40 {
		mustPut(t, s, "/c", "v", fmt.Sprint(i))
	}
	err := s.Watch(context.Background(), "", 1, func(WatchBatch) error { return nil })
	if !errors.Is(err, ErrCompacted) || !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("watch from compacted revision: %v", err)
	}
	if st := s.Status(); st.Oldest <= 1 || st.Revision-st.Oldest+1 < 8 {
		t.Fatalf("log retention: %+v", st)
	}
	// A watcher within the retained window works.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	n := 0
	err = s.Watch(ctx, "", s.Status().Revision-5, func(b WatchBatch) error {
		n += len(b.Events)
		if n == 5 {
			return errStop
		}
		return nil
	})
	if !errors.Is(err, errStop) {
		t.Fatalf("watch in window: %v (n=%d)", err, n)
	}
}

var errStop = errors.New("stop")

// corruptOneNode overwrites a stored MST node that is not the root with
// garbage, directly in Pebble.
func corruptOneNode(t *testing.T, dir string, root mst.Hash) {
	t.Helper()
	db, err := pebble.Open(dir, &pebble.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixNode}, UpperBound: []byte{prefixNode + 1}})
	if err != nil {
		t.Fatal(err)
	}
	var victim []byte
	for it.First(); it.Valid(); it.Next() {
		if !bytes.Equal(it.Key()[1:], root[:]) {
			victim = bytes.Clone(it.Key())
			break
		}
	}
	it.Close()
	if victim == nil {
		t.Fatal("no non-root node to corrupt")
	}
	if err := db.Set(victim, []byte("garbage"), pebble.Sync); err != nil {
		t.Fatal(err)
	}
}

func TestCorruptNodeFoundByScrubAndRepaired(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, NodeID: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2000 {
		mustPut(t, s, fmt.Sprintf("/k/%04d", i), "v", fmt.Sprint(i))
	}
	root := s.Root()
	s.Close()
	corruptOneNode(t, dir, root)

	s2 := openTest(t, dir)
	_, err = s2.Scrub(context.Background())
	if !errors.Is(err, mst.ErrCorruptNode) {
		t.Fatalf("scrub: %v, want corrupt node", err)
	}
	waitFor(t, func() bool { return s2.Status().Counters["mst_repairs"] == 1 })
	if s2.Root() != root {
		t.Fatalf("repaired root %x, want %x", s2.Root(), root)
	}
	if _, err := s2.Scrub(context.Background()); err != nil {
		t.Fatalf("scrub after repair: %v", err)
	}
	mustPut(t, s2, "/k/0001", "v", "new")
	if st := s2.Status(); st.Live != 2000 || st.Counters["mst_corrupt_nodes"] != 1 {
		t.Fatalf("status: %+v", st)
	}
}

func TestCorruptNodeFoundByWriteAndRepaired(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, NodeID: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2000 {
		mustPut(t, s, fmt.Sprintf("/k/%04d", i), "v", fmt.Sprint(i))
	}
	root := s.Root()
	s.Close()
	corruptOneNode(t, dir, root)

	s2 := openTest(t, dir)
	// Touch every document so some write walks through the damaged node.
	for i := range 2000 {
		mustPut(t, s2, fmt.Sprintf("/k/%04d", i), "v", fmt.Sprint(i), "w", "x")
	}
	st := s2.Status()
	if st.Counters["mst_repairs"] != 1 || st.Live != 2000 {
		t.Fatalf("status after writes over damage: %+v", st)
	}
	if _, err := s2.Scrub(context.Background()); err != nil {
		t.Fatalf("scrub: %v", err)
	}
	// The incremental root equals a fresh rebuild.
	r := s2.Root()
	s2.RequestRepair()
	waitFor(t, func() bool { return s2.Status().Counters["mst_repairs"] == 2 })
	if s2.Root() != r {
		t.Fatal("index diverged from documents after repair")
	}
}

func TestPurgeTombstonesAndStale(t *testing.T) {
	s := openTest(t, t.TempDir())
	ctx := context.Background()
	mustPut(t, s, "/live", "v", "1")
	mustPut(t, s, "/dead", "v", "1")
	if _, err := s.Delete(ctx, "/dead", nil); err != nil {
		t.Fatal(err)
	}
	rev := s.Revision()
	cut := s.Clock().Now()
	mustPut(t, s, "/new-dead", "v", "1")
	if _, err := s.Delete(ctx, "/new-dead", nil); err != nil {
		t.Fatal(err)
	}
	expired := func(d crdt.Doc) bool { return !d.Exists() && d.MaxStamp().TS.Less(cut) }
	n, err := s.Purge(ctx, []string{"/live", "/dead", "/new-dead", "/absent"}, expired)
	if err != nil || n != 1 {
		t.Fatalf("purged %d (%v), want only /dead", n, err)
	}
	if rec, _ := s.GetRaw("/dead"); !rec.Doc.IsEmpty() {
		t.Fatal("/dead still stored")
	}
	if rec, _ := s.GetRaw("/new-dead"); rec.Doc.IsEmpty() {
		t.Fatal("young tombstone purged")
	}
	if st := s.Status(); st.Tombstones != 1 || st.Live != 1 || st.Revision != rev+2 {
		t.Fatalf("status %+v", st)
	}
	n, err = s.Purge(ctx, []string{"/live"}, func(d crdt.Doc) bool { return d.MaxStamp().TS.Less(cut) })
	if err != nil || n != 1 {
		t.Fatalf("stale purge: %d %v", n, err)
	}
	// The index still matches the documents.
	root := s.Root()
	s.RequestRepair()
	waitFor(t, func() bool { return s.Status().Counters["mst_repairs"] == 1 })
	if s.Root() != root {
		t.Fatal("index diverged after purge")
	}
}
