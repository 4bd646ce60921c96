package vold

import (
	"bytes"
	"fmt"
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

// A fork of the KV store encodes, from another goroutine while puts,
// machine commands (a machine's log growing and one replaced by a
// snapshot command) and idempotency expiry go on, exactly the snapshot of
// the fork's moment.
func TestKVForkSnapshot(t *testing.T) {
	s := newKVStore()
	t0 := time.Unix(1000, 0)
	set := func(index uint64, at time.Time, m machineSet) {
		s.Apply(raftgroup.Command{Index: index, Time: at, Msg: &m})
	}
	idx := uint64(1)
	for i := range 50 {
		put(s, idx, t0, kvPut{Key: fmt.Sprint("k", i%20), Value: []byte(fmt.Sprint(i)), IdemKey: fmt.Sprint("p", i)})
		idx++
		set(idx, t0, machineSet{Machine: fmt.Sprint("m", i%3), Value: []byte(fmt.Sprint(i)), IdemKey: fmt.Sprint("s", i)})
		idx++
	}
	want, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	fork, err := s.ForkSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		later := t0.Add(2 * idemWindow) // expires every idempotency record
		for i := range 200 {
			put(s, idx, later, kvPut{Key: fmt.Sprint("k", i%30), Value: []byte("later"), IdemKey: fmt.Sprint("q", i)})
			idx++
			set(idx, later, machineSet{Machine: fmt.Sprint("m", i%4), Value: []byte("later"), Snapshot: i%50 == 0})
			idx++
		}
	}()
	got, err := fork()
	<-done
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("the fork encoded %d bytes, the snapshot at the fork was %d", len(got), len(want))
	}
	if again, _ := fork(); !bytes.Equal(again, want) {
		t.Fatal("the fork encoded something else the second time")
	}
	if now, _ := s.Snapshot(); bytes.Equal(now, want) {
		t.Fatal("the later commands changed nothing")
	}
}

// BenchmarkKVSnapshotOnLoop measures what a snapshot of a full system
// group (eight named state machines at their 8 MiB log limit, 64 MiB of
// 4 KiB commands, and 10,000 keys) costs the Raft loop: encoding it there
// (Snapshot, as before the fork) against forking it (ForkSnapshot; the
// encoding then runs off the loop).
//
//	go test -run - -bench KVSnapshotOnLoop ./pkg/vold/
func BenchmarkKVSnapshotOnLoop(b *testing.B) {
	s := newKVStore()
	t0 := time.Unix(1000, 0)
	idx := uint64(1)
	value := bytes.Repeat([]byte{'x'}, 4<<10)
	for m := range 8 {
		for range (maxMachineBytes / len(value)) - 1 {
			s.Apply(raftgroup.Command{Index: idx, Time: t0, Msg: &machineSet{Machine: fmt.Sprint("m", m), Value: value}})
			idx++
		}
	}
	for i := range 10000 {
		put(s, idx, t0, kvPut{Key: fmt.Sprint("k", i), Value: []byte("v")})
		idx++
	}
	b.Run("encode", func(b *testing.B) {
		for range b.N {
			if _, err := s.Snapshot(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("fork", func(b *testing.B) {
		for range b.N {
			if _, err := s.ForkSnapshot(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
