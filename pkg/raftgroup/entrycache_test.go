package raftgroup

import (
	"math/rand/v2"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// TestEntryCacheMatchesPebble appends (overwriting tails as new leaders
// do), compacts and evicts at random, and checks after every step that
// the storage with its entry cache answers Entries and Term exactly as a
// storage freshly loaded from Pebble (no cache) does.
func TestEntryCacheMatchesPebble(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	db := memDB(t)
	ks := keyspace{prefix: []byte("c")}
	s, err := loadStorage(db, ks, 1, memJournal(t), 0)
	if err != nil {
		t.Fatal(err)
	}
	term := uint64(1)
	for step := range 200 {
		switch r := rng.IntN(10); {
		case r < 7:
			// Append 1-4 entries of up to 3 MiB in all (the cache holds 8),
			// from anywhere after the truncation point to just past the end.
			lo := s.trunc.index + 1 + rng.Uint64N(s.last-s.trunc.index+1)
			if rng.IntN(3) > 0 {
				lo = s.last + 1
			} else {
				term++
			}
			var es []*pb.Entry
			for i := range uint64(1 + rng.IntN(4)) {
				es = append(es, &pb.Entry{Index: new(lo + i), Term: new(term), Type: pb.EntryNormal.Enum(), Data: make([]byte, rng.IntN(768<<10))})
			}
			persist(t, db, s, raft.Ready{Entries: es})
		case r < 9 && s.last > s.trunc.index+2:
			// Snapshot and compact somewhere in the log.
			at := s.trunc.index + 1 + rng.Uint64N(s.last-s.trunc.index-1)
			tm, err := s.Term(at)
			if err != nil {
				t.Fatal(err)
			}
			b := db.NewBatch()
			c1, err := s.stageSnapshot(b, &pb.Snapshot{Metadata: &pb.SnapshotMetadata{Index: new(at), Term: new(tm), ConfState: &pb.ConfState{}}})
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Commit(pebble.NoSync); err != nil {
				t.Fatal(err)
			}
			c1()
			b = db.NewBatch()
			c2, err := s.stageCompact(b, at)
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Commit(pebble.NoSync); err != nil {
				t.Fatal(err)
			}
			c2()
		default:
			s.cache.reset() // as quiescence does
		}
		fresh, err := loadStorage(db, ks, 1, memJournal(t), 0)
		if err != nil {
			t.Fatal(err)
		}
		if fresh.last != s.last || fresh.trunc != s.trunc {
			t.Fatalf("step %d: bounds %d %+v, fresh %d %+v", step, s.last, s.trunc, fresh.last, fresh.trunc)
		}
		if c := s.cache; len(c.ents) > 0 && c.ents[len(c.ents)-1].GetIndex() != s.last {
			t.Fatalf("step %d: cache ends at %d, log at %d", step, c.ents[len(c.ents)-1].GetIndex(), s.last)
		}
		for range 3 {
			lo := s.trunc.index + 1 + rng.Uint64N(s.last-s.trunc.index+1)
			hi := lo + rng.Uint64N(s.last+2-lo)
			max := rng.Uint64N(4 << 20)
			got, gerr := s.Entries(lo, hi, max)
			want, werr := fresh.Entries(lo, hi, max)
			if (gerr == nil) != (werr == nil) || len(got) != len(want) {
				t.Fatalf("step %d: Entries(%d, %d, %d): %d entries %v, fresh %d %v", step, lo, hi, max, len(got), gerr, len(want), werr)
			}
			for i := range got {
				if !proto.Equal(got[i], want[i]) {
					t.Fatalf("step %d: entry %d differs", step, got[i].GetIndex())
				}
			}
		}
		for i := s.trunc.index; i <= s.last; i++ {
			a, aerr := s.Term(i)
			b, berr := fresh.Term(i)
			if a != b || (aerr == nil) != (berr == nil) {
				t.Fatalf("step %d: Term(%d) %d %v, fresh %d %v", step, i, a, aerr, b, berr)
			}
		}
	}
	if s.cache.bytes > entryCacheBytes {
		t.Fatalf("cache holds %d bytes, bound %d", s.cache.bytes, entryCacheBytes)
	}
}

// TestEntryCacheCopiesSmallEntries checks that a cached small entry does
// not share memory with the buffer its data came from (a follower's
// received batch, which may be mostly other groups' data), while a large
// one is kept as it is.
func TestEntryCacheCopiesSmallEntries(t *testing.T) {
	batch := make([]byte, 4<<20)
	small := &pb.Entry{Index: new(uint64(1)), Term: new(uint64(1)), Type: pb.EntryNormal.Enum(), Data: batch[100:200:200]}
	large := &pb.Entry{Index: new(uint64(2)), Term: new(uint64(1)), Type: pb.EntryNormal.Enum(), Data: batch[1<<20 : 2<<20 : 2<<20]}
	var c entryCache
	c.add([]*pb.Entry{small, large})
	got, ok := c.slice(1, 3, 1<<30, true)
	if !ok || len(got) != 2 {
		t.Fatalf("slice(1, 3) = %d entries, %v; want 2, true", len(got), ok)
	}
	if &got[0].GetData()[0] == &batch[100] {
		t.Errorf("the cached small entry aliases the batch it came from")
	}
	if !proto.Equal(got[0], small) {
		t.Errorf("cached small entry %v, want %v", got[0], small)
	}
	if got[1] != large {
		t.Errorf("the cached large entry is a copy, want raft's own")
	}
	if small.GetData()[0] = 7; got[0].GetData()[0] == 7 {
		t.Errorf("the cached small entry changed with the batch")
	}
}
