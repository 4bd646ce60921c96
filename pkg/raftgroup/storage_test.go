package raftgroup

import (
	"errors"
	"log/slog"
	"reflect"
	"slices"
	"strconv"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

func memDB(t *testing.T) *pebble.DB {
	t.Helper()
	db, err := pebble.Open("/db", &pebble.Options{FS: vfs.NewMem(), Logger: pebbleLogger{slog.New(slog.DiscardHandler)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// memJournal returns an empty journal on an in-memory filesystem.
func memJournal(t *testing.T) *journal {
	t.Helper()
	j, err := openJournal(vfs.NewMem(), "/entries")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(j.close)
	return j
}

func ents(term uint64, lo, hi uint64) []*pb.Entry {
	var out []*pb.Entry
	for i := lo; i <= hi; i++ {
		out = append(out, &pb.Entry{Index: new(i), Term: new(term), Type: pb.EntryNormal.Enum(), Data: []byte{byte(i)}})
	}
	return out
}

func persist(t *testing.T, db *pebble.DB, s *groupStorage, rd raft.Ready) {
	t.Helper()
	b := db.NewBatch()
	commit, err := s.stage(b, &rd, s.commitMustPersist(&rd))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	commit()
}

func TestStorage(t *testing.T) {
	db := memDB(t)
	ks := keyspace{prefix: []byte("x")}
	s, err := loadStorage(db, ks, 7, memJournal(t), 0)
	if err != nil {
		t.Fatal(err)
	}
	if hs, cs, _ := s.InitialState(); hs != nil || len(cs.GetVoters()) != 0 {
		t.Fatalf("fresh state %v %v", hs, cs)
	}
	persist(t, db, s, raft.Ready{Entries: ents(1, 1, 10), HardState: &pb.HardState{Term: new(uint64(1)), Commit: new(uint64(7))}})
	if last, _ := s.LastIndex(); last != 10 {
		t.Fatalf("last %d", last)
	}
	got, err := s.Entries(3, 8, 1<<20)
	if err != nil || len(got) != 5 || got[0].GetIndex() != 3 {
		t.Fatalf("entries %v %v", got, err)
	}
	// The size limit returns at least one entry.
	if got, _ := s.Entries(3, 8, 1); len(got) != 1 {
		t.Fatalf("limited entries %d", len(got))
	}
	// A new leader overwrites the tail from 6: 8..10 are gone.
	persist(t, db, s, raft.Ready{Entries: ents(2, 6, 7)})
	if last, _ := s.LastIndex(); last != 7 {
		t.Fatalf("last after overwrite %d", last)
	}
	if term, _ := s.Term(6); term != 2 {
		t.Fatalf("term(6) %d", term)
	}
	if _, err := s.Term(8); !errors.Is(err, raft.ErrUnavailable) {
		t.Fatalf("term(8): %v", err)
	}
	// Snapshot at 6 and compact to 4.
	b := db.NewBatch()
	snap := &pb.Snapshot{Data: []byte("state"), Metadata: &pb.SnapshotMetadata{Index: new(uint64(6)), Term: new(uint64(2)), ConfState: &pb.ConfState{Voters: []uint64{1, 2, 3}}}}
	c1, err := s.stageSnapshot(b, snap)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	c1()
	b = db.NewBatch()
	c2, err := s.stageCompact(b, 4)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	c2()
	if first, _ := s.FirstIndex(); first != 5 {
		t.Fatalf("first %d", first)
	}
	if _, err := s.Entries(4, 6, 1<<20); !errors.Is(err, raft.ErrCompacted) {
		t.Fatalf("compacted entries: %v", err)
	}
	if term, err := s.Term(4); err != nil || term != 1 {
		t.Fatalf("term at the truncation point %d %v", term, err)
	}
	if _, err := s.Term(3); !errors.Is(err, raft.ErrCompacted) {
		t.Fatalf("term(3): %v", err)
	}
	// Reload: the same durable state.
	r, err := loadStorage(db, ks, 7, memJournal(t), 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.last != 7 || r.trunc != s.trunc || r.snap.GetIndex() != 6 || r.hs.GetCommit() != 7 {
		t.Fatalf("reloaded %+v", r)
	}
	_, cs, _ := r.InitialState()
	if len(cs.GetVoters()) != 3 {
		t.Fatalf("conf state %v", cs)
	}
	// A received snapshot replaces the whole log.
	rs := &pb.Snapshot{Data: []byte("new"), Metadata: &pb.SnapshotMetadata{Index: new(uint64(20)), Term: new(uint64(3)), ConfState: &pb.ConfState{Voters: []uint64{1}}}}
	persist(t, db, r, raft.Ready{Snapshot: rs, Entries: ents(3, 21, 22), HardState: &pb.HardState{Term: new(uint64(3)), Commit: new(uint64(20))}})
	if first, _ := r.FirstIndex(); first != 21 {
		t.Fatalf("first after snapshot %d", first)
	}
	if got, err := r.Entries(21, 23, 1<<20); err != nil || len(got) != 2 {
		t.Fatalf("entries after snapshot %v %v", got, err)
	}
	it, _ := db.NewIter(&pebble.IterOptions{LowerBound: ks.logKey(7, 0), UpperBound: ks.logKey(7, 21)})
	if it.First() {
		t.Fatalf("stale entry %d left", ks.parseLogIndex(it.Key()))
	}
	it.Close()
	loaded, _ := r.loadSnapshot()
	if loaded.GetMetadata().GetIndex() != 20 || string(loaded.GetData()) != "new" || !proto.Equal(loaded.GetMetadata().GetConfState(), pb.EnsureConfState(rs.GetMetadata().GetConfState())) {
		t.Fatalf("snapshot %v", loaded)
	}
}

func TestBatchRoundTrip(t *testing.T) {
	b := &Batch{
		From: 3,
		Messages: []GroupMessage{
			{Group: 1, Msg: &pb.Message{Type: pb.MsgApp.Enum(), To: new(uint64(2)), From: new(uint64(1)), Term: new(uint64(4)), Entries: ents(4, 5, 6)}},
			{Group: 1 << 40, Msg: &pb.Message{Type: pb.MsgSnap.Enum(), Snapshot: &pb.Snapshot{Data: []byte("s")}}},
		},
		Heartbeats:     []Heartbeat{{Group: 5, From: 1, To: 2, Term: 3, Commit: 9, Quiesce: true}, {Group: 6, From: 7, To: 8}, {Group: 6, From: 7, To: 9, Term: 2, Commit: 4, Notice: true}},
		HeartbeatResps: []Heartbeat{{Group: 5, From: 2, To: 1, Term: 3}},
		Acks:           []ApplyAck{{Group: 9, Replica: 2, Applied: 100}},
		AckQueries:     []GroupID{9, 10},
		Removed:        []RemovedNotice{{Group: 4, Replica: 3, From: 5, Conf: 77, Voters: []Member{{Replica: 1, Node: 2}, {Replica: 5, Node: 6}}}},
		Leaving:        true,
		RetireQueries:  []GroupReplica{{Group: 4, Replica: 3}, {Group: 8, Replica: 1}},
	}
	data, err := b.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := UnmarshalBatch(data)
	if err != nil {
		t.Fatal(err)
	}
	if got.From != b.From || len(got.Messages) != 2 || !proto.Equal(got.Messages[0].Msg, b.Messages[0].Msg) ||
		got.Messages[1].Group != 1<<40 || !proto.Equal(got.Messages[1].Msg, b.Messages[1].Msg) {
		t.Fatalf("messages %+v", got.Messages)
	}
	if !slices.Equal(got.Heartbeats, b.Heartbeats) ||
		len(got.HeartbeatResps) != 1 || got.HeartbeatResps[0] != b.HeartbeatResps[0] {
		t.Fatalf("heartbeats %+v %+v", got.Heartbeats, got.HeartbeatResps)
	}
	if len(got.Acks) != 1 || got.Acks[0] != b.Acks[0] || len(got.AckQueries) != 2 || got.AckQueries[1] != 10 ||
		!reflect.DeepEqual(got.Removed, b.Removed) || !got.Leaving || !slices.Equal(got.RetireQueries, b.RetireQueries) {
		t.Fatalf("host messages %+v", got)
	}
	empty, _ := (&Batch{From: 1}).Marshal()
	if e, err := UnmarshalBatch(empty); err != nil || !e.Empty() || e.From != 1 || e.Leaving {
		t.Fatalf("ping %+v %v", e, err)
	}
}

// FuzzUnmarshalBatch decodes and re-encodes batches; each input is also
// decoded as a lone Raft message, by decodeMessage and by proto, which
// must agree.
func FuzzUnmarshalBatch(f *testing.F) {
	b := &Batch{From: 1, Heartbeats: []Heartbeat{{Group: 1, From: 1, To: 2, Term: 1}}, Messages: []GroupMessage{{Group: 2, Msg: &pb.Message{Type: pb.MsgVote.Enum()}}}}
	data, _ := b.Marshal()
	f.Add(data)
	app, _ := proto.Marshal(&pb.Message{Type: pb.MsgApp.Enum(), Term: new(uint64(2)), Entries: ents(2, 3, 4), Commit: new(uint64(3))})
	f.Add(app)
	retire, _ := (&Batch{From: 2, Removed: []RemovedNotice{{Group: 1, Replica: 3, From: 1, Conf: 9, Voters: []Member{{Replica: 1, Node: 1}}}},
		RetireQueries: []GroupReplica{{Group: 4, Replica: 5}}}).Marshal()
	f.Add(retire)
	f.Fuzz(func(t *testing.T, data []byte) {
		sameAsProto(t, data)
		b, err := UnmarshalBatch(data)
		if err != nil {
			return
		}
		again, err := b.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := UnmarshalBatch(again); err != nil {
			t.Fatalf("re-encoded batch does not decode: %v", err)
		}
	})
}

func FuzzDecodeEnvelope(f *testing.F) {
	f.Add((&envelope{key: "k", time: 5, proposer: 2, quorum: true, payload: []byte("p")}).encode())
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := decodeEnvelope(data)
		if err != nil {
			return
		}
		d, err := decodeEnvelope(e.encode())
		if err != nil || d.key != e.key || d.time != e.time || d.proposer != e.proposer || d.quorum != e.quorum || string(d.payload) != string(e.payload) {
			t.Fatalf("round trip %+v -> %+v %v", e, d, err)
		}
	})
}

func TestDedupTable(t *testing.T) {
	d := newDedupTable()
	d.add("a", 1, 0, []byte("ra"))
	d.add("b", 2, int64(dedupWindow)/2, nil)
	d.prune(int64(dedupWindow))
	if _, ok := d.get("a"); !ok {
		t.Fatal("a pruned inside the window")
	}
	d.prune(int64(dedupWindow) + 1)
	if _, ok := d.get("a"); ok {
		t.Fatal("a kept past the window")
	}
	if _, ok := d.get("b"); !ok {
		t.Fatal("b pruned early")
	}
	// Meta (and its table) survives encoding, in order.
	m := newGroupMeta()
	m.members[1], m.members[5] = 10, 50
	m.maxReplica, m.clock = 5, 99
	m.dedup = d
	got, err := decodeGroupMeta(m.encode())
	if err != nil {
		t.Fatal(err)
	}
	if got.maxReplica != 5 || got.clock != 99 || got.members[5] != 50 || len(got.dedup.live()) != 1 {
		t.Fatalf("meta %+v", got)
	}
	for i := range dedupMax + 10 {
		got.dedup.add(strconv.Itoa(i), uint64(i), 100, nil)
		got.dedup.prune(100)
	}
	if n := len(got.dedup.live()); n != dedupMax {
		t.Fatalf("%d keys kept, bound %d", n, dedupMax)
	}
}

// TestFrozenMeta: a frozen copy of a group's meta encodes as the meta did
// when it was taken — the latest entry of each key, in order — however the
// meta changes after (entries added, a key applied again, the oldest
// pruned), which is what lets a snapshot's header be encoded off the loop.
func TestFrozenMeta(t *testing.T) {
	m := newGroupMeta()
	m.members[1], m.members[2] = 10, 20
	m.maxReplica, m.clock = 2, 500
	for i := range 50 {
		// Keys come back: k0..k9 five times each, the last one live.
		m.dedup.add("k"+strconv.Itoa(i%10), uint64(i+1), int64(i), []byte{byte(i)})
	}
	m.dedup.prune(int64(dedupWindow) + 20) // drops the entries of times 0..19
	want := m.encode()
	f := m.frozen()
	if got := f.encode(); string(got) != string(want) {
		t.Fatal("a fresh frozen copy encodes otherwise than the meta")
	}
	m.members[3] = 30
	m.maxReplica, m.clock = 3, 900
	m.dedup.add("k3", 51, 50, []byte("again"))
	m.dedup.add("new", 52, 51, nil)
	m.dedup.prune(int64(dedupWindow) + 45)
	if got := f.encode(); string(got) != string(want) {
		t.Fatal("the frozen copy changed with the meta")
	}
	d, err := decodeGroupMeta(want)
	if err != nil {
		t.Fatal(err)
	}
	live := d.dedup.live()
	if len(live) != 10 {
		t.Fatalf("%d live keys, want 10", len(live))
	}
	for i, e := range live {
		// The last round of keys, times 40..49, in order.
		if e.key != "k"+strconv.Itoa(i) || e.index != uint64(41+i) {
			t.Fatalf("live entry %d is %s at %d", i, e.key, e.index)
		}
	}
}

// TestDefaultLargeEntryKeepsPageWritesInTheJournal: with the default
// Config, a 4 KiB write's entry keeps its data in the journal (Pebble holds
// a reference), so that synchronous 4 KiB writes do not fill Pebble's
// memtable; a small entry, such as a metadata operation, is stored whole
// in Pebble.
func TestDefaultLargeEntryKeepsPageWritesInTheJournal(t *testing.T) {
	cfg := Config{NodeID: 1, Dir: t.TempDir(), Transport: nopTransport{}, NewStateMachine: func(GroupID) StateMachine { return nil }}
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	db := memDB(t)
	ks := keyspace{prefix: []byte("x")}
	s, err := loadStorage(db, ks, 7, memJournal(t), cfg.LargeEntry)
	if err != nil {
		t.Fatal(err)
	}
	sizes := map[uint64]int{1: 100, 2: 1 << 10, 3: 4<<10 + 200, 4: 1 << 20}
	var es []*pb.Entry
	for i := uint64(1); i <= 4; i++ {
		es = append(es, &pb.Entry{Index: new(i), Term: new(uint64(1)), Type: pb.EntryNormal.Enum(), Data: make([]byte, sizes[i])})
	}
	persist(t, db, s, raft.Ready{Entries: es, HardState: &pb.HardState{Term: new(uint64(1))}})
	for i := uint64(1); i <= 4; i++ {
		v, closer, err := db.Get(ks.logKey(7, i))
		if err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
		_, ref, err := decodeStored(v)
		closer.Close()
		if err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
		if inJournal, want := ref != nil, sizes[i] >= 4<<10; inJournal != want {
			t.Errorf("entry %d of %d bytes: data in the journal %v, want %v", i, sizes[i], inJournal, want)
		}
	}
	// And they read back whole.
	got, err := s.Entries(1, 5, 1<<30)
	if err != nil || len(got) != 4 {
		t.Fatalf("entries: %d, %v", len(got), err)
	}
	for _, e := range got {
		if len(e.GetData()) != sizes[e.GetIndex()] {
			t.Errorf("entry %d read back with %d bytes, want %d", e.GetIndex(), len(e.GetData()), sizes[e.GetIndex()])
		}
	}
}

// nopTransport sends nothing: for a Config that only needs its defaults.
type nopTransport struct{}

func (nopTransport) Send(NodeID, *Batch) error { return nil }
