package raftgroup

import (
	"bytes"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// A fresh journal that syncs large blobs grows its segments and writes no
// zeros; once syncs are small, it prepares a spare of zeros and moves its
// records there.
func TestJournalSpareOnlyForSmallSyncs(t *testing.T) {
	s := openJournalStore(t, vfs.NewMem(), 1<<20)
	defer s.close()
	big := bytes.Repeat([]byte{7}, 256<<10)
	for i := range 8 { // two segments' worth
		ref, err := s.j.blob(big)
		if err != nil {
			t.Fatal(err)
		}
		s.j.addRef(1, uint64(i), ref.seg)
		b := s.db.NewBatch()
		_ = b.Set(key(i), ref.header(), nil)
		if err := s.j.batch(b, s.ks, true); err != nil {
			t.Fatal(err)
		}
		b.Close()
	}
	if s.j.spare != nil || len(s.j.free) > 0 {
		t.Fatal("a spare was prepared for syncs of 256 KiB")
	}
	if !s.j.active.grown {
		t.Fatal("the active segment is not a grown one")
	}
	grown := s.j.active.id
	deadline := time.Now().Add(30 * time.Second)
	for i := 100; s.j.active.grown; i += 2 {
		if time.Now().After(deadline) {
			t.Fatal("small synced records stayed in a grown segment")
		}
		s.apply(t, op{put: i, sync: true})
		time.Sleep(time.Millisecond) // let the spare's goroutine run
	}
	if s.j.active.id == grown {
		t.Fatal("the active segment changed kind without rotating")
	}
}
