package vold

import (
	"bytes"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

func docWith(fields map[string]*statev1.Value) *statev1.Document {
	return &statev1.Document{Key: volumeKey("v"), Fields: fields}
}

func put(s *kvStore, index uint64, at time.Time, p kvPut) kvPutResult {
	return s.Apply(raftgroup.Command{Index: index, Time: at, Msg: &p}).(kvPutResult)
}

func TestKVCompareAndSwapOnRevision(t *testing.T) {
	s := newKVStore()
	t0 := time.Unix(1000, 0)
	if r := put(s, 5, t0, kvPut{Key: "k", Value: []byte("a"), Compare: true, Expect: 0}); !r.Applied || r.Revision != 5 {
		t.Fatalf("create-if-absent: %+v", r)
	}
	if r := put(s, 6, t0, kvPut{Key: "k", Value: []byte("b"), Compare: true, Expect: 0}); r.Applied || r.Revision != 5 {
		t.Fatalf("second create-if-absent: %+v", r)
	}
	if r := put(s, 7, t0, kvPut{Key: "k", Value: []byte("c"), Compare: true, Expect: 5}); !r.Applied || r.Revision != 7 {
		t.Fatalf("cas on the current revision: %+v", r)
	}
	if r := put(s, 8, t0, kvPut{Key: "k", Value: []byte("d")}); !r.Applied || r.Revision != 8 {
		t.Fatalf("blind put: %+v", r)
	}
	if e, ok := s.get("k"); !ok || string(e.Value) != "d" || e.Revision != 8 {
		t.Fatalf("get = %+v, %v", e, ok)
	}
}

func TestKVIdempotencyKey(t *testing.T) {
	s := newKVStore()
	t0 := time.Unix(1000, 0)
	first := put(s, 3, t0, kvPut{Key: "k", Value: []byte("a"), IdemKey: "x"})
	put(s, 4, t0, kvPut{Key: "k", Value: []byte("b")})
	again := put(s, 5, t0.Add(time.Minute), kvPut{Key: "k", Value: []byte("a"), IdemKey: "x"})
	if again != first {
		t.Fatalf("retry got %+v, want the first result %+v", again, first)
	}
	if e, _ := s.get("k"); string(e.Value) != "b" {
		t.Fatalf("retry applied again: k=%q", e.Value)
	}
	// Past the window the key is forgotten.
	late := put(s, 9, t0.Add(idemWindow+2*time.Minute), kvPut{Key: "k", Value: []byte("a"), IdemKey: "x"})
	if late.Revision != 9 {
		t.Fatalf("expired key still deduplicated: %+v", late)
	}
}

func TestKVSnapshotRestore(t *testing.T) {
	s := newKVStore()
	t0 := time.Unix(1000, 0)
	put(s, 3, t0, kvPut{Key: "a", Value: []byte("1"), IdemKey: "x"})
	put(s, 4, t0, kvPut{Key: "b", Value: []byte("2")})
	snap, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	r := newKVStore()
	if err := r.Restore(snap); err != nil {
		t.Fatal(err)
	}
	again, _ := r.Snapshot()
	if !bytes.Equal(snap, again) {
		t.Fatalf("snapshot of a restored store differs")
	}
	if res := put(r, 9, t0, kvPut{Key: "a", Value: []byte("1"), IdemKey: "x"}); res.Revision != 3 {
		t.Fatalf("idempotency lost in the snapshot: %+v", res)
	}
	if err := r.Restore(nil); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.get("a"); ok {
		t.Fatalf("Restore(nil) kept data")
	}
}

func TestSystemMachineTypedRoundTrip(t *testing.T) {
	sm, kv := newSystemMachine()
	typed := sm.(*raftgroup.Typed)
	snap, err := typed.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sm2, kv2 := newSystemMachine()
	if err := sm2.Restore(snap); err != nil {
		t.Fatal(err)
	}
	if kv == nil || kv2 == nil {
		t.Fatal("no KV applier")
	}
}
