package crdt_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"testing"
	"unicode/utf8"

	"github.com/shoal-dev/shoal/pkg/crdt"
)

// fuzzSeeds are valid encodings covering every kind, tombstones, a document
// tombstone, limits and unusual stamps.
func fuzzSeeds() []crdt.Doc {
	long := func(n int) string { return string(bytes.Repeat([]byte{'n'}, n)) }
	return []crdt.Doc{
		{},
		crdt.DeleteDoc(st(5, 1, "n")),
		crdt.DeleteDoc(st(0, 0, "n")),
		{
			Deleted: st(5, 1, "n"),
			Fields: map[string]crdt.Field{
				"a": f2(crdt.Int(7), st(6, 0, "n")),
				"b": tomb(st(9, 2, "m")),
			},
		},
		{Fields: map[string]crdt.Field{
			"bool":   f2(crdt.Bool(true), st(1, 0, "")),
			"bytes":  f2(crdt.Bytes([]byte{0, 1, 2, 0xff}), st(1, 1, "a")),
			"empty":  f2(crdt.Bytes(nil), st(1, 2, "a")),
			"float":  f2(crdt.Float(-1.25), st(1<<62, 0xffffffff, "b")),
			"int":    f2(crdt.Int(-1), st(2, 0, "c")),
			"string": f2(crdt.String("héllo"), st(3, 0, "d")),
			"z\xff":  tomb(st(4, 0, "e")),
		}},
		{Fields: map[string]crdt.Field{
			long(crdt.MaxFieldName): f2(crdt.String(""), st(1_700_000_000_000_000_000, 3, long(crdt.MaxNodeID))),
		}},
	}
}

func FuzzUnmarshal(f *testing.F) {
	for _, d := range fuzzSeeds() {
		e := d.Marshal()
		if _, err := crdt.Unmarshal(e); err != nil {
			f.Fatalf("seed %s does not decode: %v", dump(d), err)
		}
		f.Add(e)
	}
	// A few near misses, so the corpus starts on both sides of the line.
	f.Add([]byte{})
	f.Add([]byte{1, 0, 0x80, 0x00})
	f.Add([]byte{1, 2, 0})
	f.Add([]byte{1, 0, 1, 1, 'a', 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 1, 0xff})

	f.Fuzz(func(t *testing.T, data []byte) {
		in := bytes.Clone(data)
		d, err := crdt.Unmarshal(in)
		if err != nil {
			if !errors.Is(err, crdt.ErrCorrupt) {
				t.Fatalf("error does not wrap ErrCorrupt: %v", err)
			}
			if !d.IsEmpty() {
				t.Fatalf("document returned alongside an error: %s", dump(d))
			}
			return
		}
		// Decoding must not alias the input.
		for i := range in {
			in[i] ^= 0x5a
		}
		out := d.Marshal()
		if !bytes.Equal(out, data) {
			t.Fatalf("decoded document re-encodes differently:\n in  %x\n out %x", data, out)
		}
		// Anything that decodes is a well-formed, normalized document
		// (checked here independently of Value.Validate).
		for name, fl := range d.Fields {
			if name == "" || len(name) > crdt.MaxFieldName || len(fl.Stamp.Node) > crdt.MaxNodeID {
				t.Fatalf("field %q (node %q) decoded beyond the limits", name, fl.Stamp.Node)
			}
			if fl.Stamp.TS.Wall < 0 {
				t.Fatalf("field %q decoded with a negative wall", name)
			}
			if !d.Deleted.IsZero() && fl.Stamp.Compare(d.Deleted) <= 0 {
				t.Fatalf("field %q decoded although hidden by the document tombstone", name)
			}
			if fl.Deleted {
				continue
			}
			v := fl.Value
			ok := false
			switch v.Kind {
			case crdt.KindString:
				ok = utf8.Valid(v.Data)
			case crdt.KindInt, crdt.KindFloat:
				ok = len(v.Data) == 8
			case crdt.KindBool:
				ok = len(v.Data) == 1 && v.Data[0] <= 1
			case crdt.KindBytes:
				ok = true
			}
			if !ok {
				t.Fatalf("field %q decoded with a non-canonical %v value %x", name, v.Kind, v.Data)
			}
		}
		mustEqualDocs(t, "0∨d", crdt.Merge(crdt.Doc{}, d), d)
		mustEqualDocs(t, "d∨d", crdt.Merge(d, d), d)
		if d.Digest() != sha256.Sum256(data) {
			t.Fatalf("Digest is not the SHA-256 of the canonical encoding")
		}
	})
}
