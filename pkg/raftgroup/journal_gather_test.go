package raftgroup

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestRoundWritesItsSegmentOnce: a round whose batch references a 4 KiB
// blob (a synchronous 4 KiB write's entry) writes the blob's header, its
// data and the batch record to the segment file in one write, not three;
// a blob read back before the round's sync reads what was gathered; and a
// restart replays the round (blob included) from the file.
func TestRoundWritesItsSegmentOnce(t *testing.T) {
	mem := vfs.NewMem()
	var writes int
	fs := &SegmentHookFS{FS: mem, OnWrite: func(name string) {
		if strings.HasSuffix(name, ".log") {
			writes++
		}
	}}
	j, err := openJournal(fs, "/entries")
	if err != nil {
		t.Fatal(err)
	}
	db, err := pebble.Open("/db", &pebble.Options{FS: vfs.NewMem(), Logger: pebbleLogger{slog.New(slog.DiscardHandler)}})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ks := keyspace{prefix: []byte("x")}
	data := bytes.Repeat([]byte("d"), 4<<10)
	round := func(i byte, readBack bool) segmentRef {
		t.Helper()
		ref, err := j.appendEntry(7, uint64(i), append([]byte{i}, data...))
		if err != nil {
			t.Fatal(err)
		}
		if readBack {
			got, err := j.read(ref)
			if err != nil || got[0] != i || len(got) != len(data)+1 {
				t.Fatalf("blob %d read back before its round's sync: %d bytes, %v", i, len(got), err)
			}
		}
		b := db.NewBatch()
		if err := b.Set([]byte{'k', i}, ref.header(), nil); err != nil {
			t.Fatal(err)
		}
		if err := j.batch(b, ks, true); err != nil {
			t.Fatal(err)
		}
		if err := b.Commit(pebble.NoSync); err != nil {
			t.Fatal(err)
		}
		return ref
	}
	round(1, true) // creates the first segment
	before := writes
	ref := round(2, false)
	if n := writes - before; n != 1 {
		t.Errorf("a round with a 4 KiB blob wrote its segment %d times, want 1", n)
	}
	// A large blob goes to the file directly, after what was gathered.
	big := bytes.Repeat([]byte("b"), 1<<20)
	bigRef, err := j.blob(big)
	if err != nil {
		t.Fatal(err)
	}
	if err := j.batch(db.NewBatch(), ks, true); err != nil {
		t.Fatal(err)
	}
	j.close()

	j2, err := openJournal(mem, "/entries")
	if err != nil {
		t.Fatal(err)
	}
	defer j2.close()
	db2, err := pebble.Open("/db2", &pebble.Options{FS: vfs.NewMem(), Logger: pebbleLogger{slog.New(slog.DiscardHandler)}})
	if err != nil {
		t.Fatal(err)
	}
	defer db2.Close()
	if _, err := j2.replay(db2, ks); err != nil {
		t.Fatal(err)
	}
	if _, closer, err := db2.Get([]byte{'k', 2}); err != nil {
		t.Fatalf("round 2's batch not replayed: %v", err)
	} else {
		closer.Close()
	}
	for _, r := range []struct {
		ref  segmentRef
		want []byte
	}{{ref, append([]byte{2}, data...)}, {bigRef, big}} {
		got, err := j2.read(r.ref)
		if err != nil || !bytes.Equal(got, r.want) {
			t.Fatalf("blob at %d+%d after a restart: %d bytes, %v", r.ref.off, r.ref.n, len(got), err)
		}
	}
}
