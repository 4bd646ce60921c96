package store

import (
	"bytes"
	"testing"

	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/hlc"
)

func seedDoc() crdt.Doc {
	s := crdt.Stamp{TS: hlc.Timestamp{Wall: 1700000000000000000, Logical: 2}, Node: "n1"}
	return crdt.Merge(
		crdt.Set(map[string]crdt.Value{"a": crdt.String("x"), "n": crdt.Int(7)}, s),
		crdt.DeleteFields([]string{"gone"}, s))
}

// FuzzDecodeRecord: stored document records never crash the decoder, and
// what decodes re-encodes to the same bytes.
func FuzzDecodeRecord(f *testing.F) {
	f.Add(encodeRecord(42, seedDoc().Marshal()))
	f.Add(encodeRecord(0, crdt.Doc{}.Marshal()))
	f.Add([]byte{0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		rev, d, err := DecodeRecord(b)
		if err != nil {
			return
		}
		if got := encodeRecord(rev, d.Marshal()); !bytes.Equal(got, b) {
			t.Fatalf("record does not round-trip: %x -> %x", b, got)
		}
	})
}

// FuzzDecodeChange: change-log entries never crash the decoder.
func FuzzDecodeChange(f *testing.F) {
	f.Add(encodeChange("/a/b", seedDoc().Marshal()))
	f.Add(encodeChange("/x", crdt.Doc{}.Marshal()))
	f.Add([]byte{0x80})
	f.Fuzz(func(t *testing.T, b []byte) {
		key, d, err := DecodeChange(b)
		if err != nil {
			return
		}
		if got := encodeChange(key, d.Marshal()); !bytes.Equal(got, b) {
			t.Fatalf("change does not round-trip: %x -> %x", b, got)
		}
	})
}
