package crdt_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/shoal-dev/shoal/pkg/crdt"
)

// enc builds encodings by hand, independently of Marshal. Every method
// returns a fresh slice, so a prefix can be shared between cases.
type enc []byte

func (e enc) b(bs ...byte) enc    { return append(slices.Clip(e), bs...) }
func (e enc) uv(v uint64) enc     { return binary.AppendUvarint(slices.Clip(e), v) }
func (e enc) str(s string) enc    { return e.uv(uint64(len(s))).b([]byte(s)...) }
func (e enc) rawStr(s string) enc { return e.b([]byte(s)...) }
func (e enc) ts(wall int64, logical uint32) enc {
	return binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint64(slices.Clip(e), uint64(wall)), logical)
}
func (e enc) stamp(s crdt.Stamp) enc { return e.ts(s.TS.Wall, s.TS.Logical).str(s.Node) }

// field appends a live field with the given kind byte and data.
func (e enc) field(name string, s crdt.Stamp, kind byte, data []byte) enc {
	return e.str(name).stamp(s).b(0, kind).uv(uint64(len(data))).b(data...)
}
func (e enc) intField(name string, s crdt.Stamp, i int64) enc {
	return e.field(name, s, byte(crdt.KindInt), crdt.Int(i).Data)
}
func (e enc) tombField(name string, s crdt.Stamp) enc { return e.str(name).stamp(s).b(1) }

var (
	hdr = enc{1, 0} // version 1, no document tombstone
	s1  = st(1_000, 0, "n1")
	s2  = st(2_000, 0, "n1")
)

func hdrDel(s crdt.Stamp) enc { return enc{1, 1}.stamp(s) }

func TestMarshalGolden(t *testing.T) {
	d := crdt.Doc{
		Deleted: st(5, 1, "n"),
		Fields: map[string]crdt.Field{
			"b": tomb(st(9, 2, "m")),
			"a": f2(crdt.Int(7), st(6, 0, "n")),
		},
	}
	want := []byte{
		0x01,                                          // version
		0x01,                                          // has document tombstone
		0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 1, 0x01, 'n', // stamp 5.1/n
		0x02,                                                     // two fields
		0x01, 'a', 0, 0, 0, 0, 0, 0, 0, 6, 0, 0, 0, 0, 0x01, 'n', // "a" @ 6.0/n
		0x00, 0x02, 0x08, 0, 0, 0, 0, 0, 0, 0, 7, // flags 0, kind int, 8 bytes
		0x01, 'b', 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 2, 0x01, 'm', // "b" @ 9.2/m
		0x01, // tombstone
	}
	if got := d.Marshal(); !bytes.Equal(got, want) {
		t.Fatalf("Marshal =\n %x\nwant\n %x", got, want)
	}
	if got := (crdt.Doc{}).Marshal(); !bytes.Equal(got, []byte{1, 0, 0}) {
		t.Fatalf("Marshal(zero) = %x, want 010000", got)
	}
	// All kinds, to pin the kind numbers.
	all := crdt.Doc{Fields: map[string]crdt.Field{
		"1": f2(crdt.String("hé"), s1),
		"2": f2(crdt.Float(1.5), s1),
		"3": f2(crdt.Bool(true), s1),
		"4": f2(crdt.Bytes([]byte{0, 0xff}), s1),
	}}
	wantAll := hdr.uv(4).
		field("1", s1, 1, []byte("hé")).
		field("2", s1, 3, []byte{0x3f, 0xf8, 0, 0, 0, 0, 0, 0}).
		field("3", s1, 4, []byte{1}).
		field("4", s1, 5, []byte{0, 0xff})
	if got := all.Marshal(); !bytes.Equal(got, wantAll) {
		t.Fatalf("Marshal(all kinds) =\n %x\nwant\n %x", got, []byte(wantAll))
	}
	for _, e := range [][]byte{want, wantAll, {1, 0, 0}} {
		dec, err := crdt.Unmarshal(e)
		if err != nil {
			t.Fatalf("Unmarshal(%x): %v", e, err)
		}
		if got := dec.Marshal(); !bytes.Equal(got, e) {
			t.Fatalf("re-Marshal = %x, want %x", got, e)
		}
	}
}

func TestMarshalCanonical(t *testing.T) {
	// Same content, different in-memory shapes.
	a := crdt.Doc{Fields: map[string]crdt.Field{}}
	b := crdt.Doc{}
	if !bytes.Equal(a.Marshal(), b.Marshal()) {
		t.Fatalf("nil and empty Fields encode differently")
	}
	c := crdt.Doc{Fields: map[string]crdt.Field{"x": f2(crdt.Bytes(nil), s1)}}
	d := crdt.Doc{Fields: map[string]crdt.Field{"x": f2(crdt.Value{Kind: crdt.KindBytes, Data: []byte{}}, s1)}}
	if !bytes.Equal(c.Marshal(), d.Marshal()) {
		t.Fatalf("nil and empty bytes encode differently")
	}
	// Insertion order of many fields never matters.
	names := make([]string, 50)
	for i := range names {
		names[i] = fmt.Sprintf("f%02d", (i*37)%50)
	}
	x := crdt.Doc{Fields: map[string]crdt.Field{}}
	y := crdt.Doc{Fields: map[string]crdt.Field{}}
	for i := range names {
		x.Fields[names[i]] = f2(crdt.Int(int64(i)), s1)
		y.Fields[names[len(names)-1-i]] = f2(crdt.Int(int64(len(names)-1-i)), s1)
	}
	ex := x.Marshal()
	for range 5 {
		if !bytes.Equal(ex, y.Marshal()) || !bytes.Equal(ex, x.Marshal()) {
			t.Fatalf("encoding depends on map order")
		}
	}
}

func TestCodecRoundTripProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		d := genWideDoc().Draw(t, "doc")
		e := d.Marshal()
		dec, err := crdt.Unmarshal(e)
		if err != nil {
			t.Fatalf("Unmarshal(Marshal(%s)): %v", dump(d), err)
		}
		mustEqualDocs(t, "round trip", dec, d)
		if got := dec.Marshal(); !bytes.Equal(got, e) {
			t.Fatalf("re-Marshal differs:\n %x\n %x", got, e)
		}
		if dec.Digest() != d.Digest() {
			t.Fatalf("digest changed across round trip")
		}
		// The decoded document does not alias the input buffer.
		for i := range e {
			e[i] ^= 0xff
		}
		mustEqualDocs(t, "after scribbling on the input", dec, d)
	})
}

func TestUnmarshalDoesNotAlias(t *testing.T) {
	d := crdt.Doc{Fields: map[string]crdt.Field{
		"a": f2(crdt.Bytes([]byte("aaaa")), s1),
		"b": f2(crdt.String("bbbb"), s1),
		"c": f2(crdt.Bytes([]byte("cccc")), s1),
	}}
	buf := d.Marshal()
	dec, err := crdt.Unmarshal(buf)
	if err != nil {
		t.Fatal(err)
	}
	for i := range buf {
		buf[i] = 0xaa
	}
	mustEqualDocs(t, "after overwriting the input", dec, d)
	// Appending to one decoded value must not overwrite its neighbour.
	_ = append(dec.Fields["a"].Value.Data, "XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX"...)
	mustEqualDocs(t, "after appending to a decoded value", dec, d)
}

func TestUnmarshalRejects(t *testing.T) {
	long := func(n int) string { return strings.Repeat("x", n) }
	nodeOf := func(n int) crdt.Stamp { return st(1_000, 0, long(n)) }
	manyFields := func(n int) enc {
		e := hdr.uv(uint64(n))
		for i := range n {
			e = e.intField(fmt.Sprintf("f%04d", i), s1, int64(i))
		}
		return e
	}
	intData := crdt.Int(1).Data

	// Each case has a good encoding and a bad one that differs only in the
	// defect, so a rejection cannot be blamed on something else.
	cases := []struct {
		name      string
		good, bad enc
	}{
		{"unsorted fields",
			hdr.uv(2).intField("a", s1, 1).intField("b", s1, 2),
			hdr.uv(2).intField("b", s1, 2).intField("a", s1, 1)},
		{"unsorted fields (byte order, not length)",
			hdr.uv(2).intField("Z", s1, 1).intField("a", s1, 2),
			hdr.uv(2).intField("a", s1, 2).intField("Z", s1, 1)},
		{"duplicate names",
			hdr.uv(2).intField("a", s1, 1).intField("b", s2, 2),
			hdr.uv(2).intField("a", s1, 1).intField("a", s2, 2)},
		{"duplicate names (value then tombstone)",
			hdr.uv(2).intField("a", s1, 1).tombField("b", s2),
			hdr.uv(2).intField("a", s1, 1).tombField("a", s2)},
		{"empty name",
			hdr.uv(1).intField("a", s1, 1),
			hdr.uv(1).intField("", s1, 1)},
		{"trailing byte",
			hdr.uv(1).intField("a", s1, 1),
			hdr.uv(1).intField("a", s1, 1).b(0)},
		{"trailing field beyond count",
			hdr.uv(1).intField("a", s1, 1),
			hdr.uv(1).intField("a", s1, 1).intField("b", s1, 1)},
		{"count larger than fields present",
			hdr.uv(1).intField("a", s1, 1),
			hdr.uv(2).intField("a", s1, 1)},
		{"empty document with trailing byte", hdr.uv(0), hdr.uv(0).b(0)},
		{"non-minimal varint: field count",
			hdr.b(0x01).intField("a", s1, 1),
			hdr.b(0x81, 0x00).intField("a", s1, 1)},
		{"non-minimal varint: zero field count", hdr.b(0x00), hdr.b(0x80, 0x00)},
		{"non-minimal varint: name length",
			hdr.uv(1).b(0x01).rawStr("a").stamp(s1).b(0, 2, 8).b(intData...),
			hdr.uv(1).b(0x81, 0x00).rawStr("a").stamp(s1).b(0, 2, 8).b(intData...)},
		{"non-minimal varint: node length",
			hdr.uv(1).str("a").ts(1, 0).b(0x02).rawStr("n1").b(0, 2, 8).b(intData...),
			hdr.uv(1).str("a").ts(1, 0).b(0x82, 0x80, 0x00).rawStr("n1").b(0, 2, 8).b(intData...)},
		{"non-minimal varint: value length",
			hdr.uv(1).str("a").stamp(s1).b(0, 2, 0x08).b(intData...),
			hdr.uv(1).str("a").stamp(s1).b(0, 2, 0x88, 0x00).b(intData...)},
		{"varint overflow", hdr.uv(0), hdr.b(0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f)},
		{"invalid UTF-8 in a string value",
			hdr.uv(1).field("s", s1, byte(crdt.KindString), []byte("ok")),
			hdr.uv(1).field("s", s1, byte(crdt.KindString), []byte("o\xff"))},
		{"UTF-16 surrogate in a string value",
			hdr.uv(1).field("s", s1, byte(crdt.KindString), []byte("\xe2\x82\xac")), // €
			hdr.uv(1).field("s", s1, byte(crdt.KindString), []byte("\xed\xa0\x80"))},
		{"truncated UTF-8 in a string value",
			hdr.uv(1).field("s", s1, byte(crdt.KindString), []byte("\xc3\xa9")),
			hdr.uv(1).field("s", s1, byte(crdt.KindString), []byte("\xc3"))},
		{"int with 7 bytes",
			hdr.uv(1).field("i", s1, byte(crdt.KindInt), make([]byte, 8)),
			hdr.uv(1).field("i", s1, byte(crdt.KindInt), make([]byte, 7))},
		{"int with 9 bytes",
			hdr.uv(1).field("i", s1, byte(crdt.KindInt), make([]byte, 8)),
			hdr.uv(1).field("i", s1, byte(crdt.KindInt), make([]byte, 9))},
		{"int with 0 bytes",
			hdr.uv(1).field("i", s1, byte(crdt.KindInt), make([]byte, 8)),
			hdr.uv(1).field("i", s1, byte(crdt.KindInt), nil)},
		{"float with 4 bytes",
			hdr.uv(1).field("f", s1, byte(crdt.KindFloat), make([]byte, 8)),
			hdr.uv(1).field("f", s1, byte(crdt.KindFloat), make([]byte, 4))},
		{"bool 2",
			hdr.uv(1).field("b", s1, byte(crdt.KindBool), []byte{1}),
			hdr.uv(1).field("b", s1, byte(crdt.KindBool), []byte{2})},
		{"bool with 2 bytes",
			hdr.uv(1).field("b", s1, byte(crdt.KindBool), []byte{0}),
			hdr.uv(1).field("b", s1, byte(crdt.KindBool), []byte{0, 0})},
		{"bool with 0 bytes",
			hdr.uv(1).field("b", s1, byte(crdt.KindBool), []byte{0}),
			hdr.uv(1).field("b", s1, byte(crdt.KindBool), nil)},
		{"unknown kind 6",
			hdr.uv(1).field("k", s1, byte(crdt.KindBytes), []byte{1}),
			hdr.uv(1).field("k", s1, 6, []byte{1})},
		{"unknown kind 255",
			hdr.uv(1).field("k", s1, byte(crdt.KindBytes), []byte{1}),
			hdr.uv(1).field("k", s1, 255, []byte{1})},
		{"invalid kind 0",
			hdr.uv(1).field("k", s1, byte(crdt.KindBytes), nil),
			hdr.uv(1).field("k", s1, byte(crdt.KindInvalid), nil)},
		{"bad field flags",
			hdr.uv(1).tombField("a", s1),
			hdr.uv(1).str("a").stamp(s1).b(2)},
		{"tombstone followed by a value",
			hdr.uv(1).tombField("a", s1),
			hdr.uv(1).tombField("a", s1).b(2, 8).b(intData...)},
		{"field older than the document tombstone",
			hdrDel(s1).uv(1).intField("a", s2, 1),
			hdrDel(s2).uv(1).intField("a", s1, 1)},
		{"field at the document tombstone",
			hdrDel(s1).uv(1).intField("a", st(1_000, 0, "n2"), 1),
			hdrDel(s1).uv(1).intField("a", s1, 1)},
		{"field tombstone hidden by the document tombstone",
			hdrDel(s1).uv(1).tombField("a", st(1_000, 1, "n1")),
			hdrDel(s1).uv(1).tombField("a", st(999, 9, "zz"))},
		{"hidden field after a visible one",
			hdrDel(s1).uv(2).intField("a", s2, 1).intField("b", s2, 1),
			hdrDel(s1).uv(2).intField("a", s2, 1).intField("b", s1, 1)},
		{"zero document tombstone",
			enc{1, 1}.stamp(st(0, 0, "n")).uv(0), // zero time but a node: not the zero stamp
			enc{1, 1}.stamp(crdt.Stamp{}).uv(0)},
		{"bad tombstone flag", enc{1, 0}.uv(0), enc{1, 2}.uv(0)},
		{"tombstone flag 0xff", enc{1, 0}.uv(0), enc{1, 0xff}.uv(0)},
		{"version 0", enc{1, 0}.uv(0), enc{0, 0}.uv(0)},
		{"version 2", enc{1, 0}.uv(0), enc{2, 0}.uv(0)},
		{"negative wall in the document tombstone",
			enc{1, 1}.ts(1, 0).str("n").uv(0),
			enc{1, 1}.ts(-1, 0).str("n").uv(0)},
		{"negative wall in a field stamp",
			hdr.uv(1).str("a").ts(1<<62, 0).str("n").b(1),
			hdr.uv(1).str("a").ts(-1<<62, 0).str("n").b(1)},
		{"too many fields", manyFields(crdt.MaxFields), manyFields(crdt.MaxFields + 1)},
		{"field count far over the limit", hdr.uv(0), hdr.uv(1 << 40)},
		{"field name too long",
			hdr.uv(1).intField(long(crdt.MaxFieldName), s1, 1),
			hdr.uv(1).intField(long(crdt.MaxFieldName+1), s1, 1)},
		{"node ID too long in a field stamp",
			hdr.uv(1).intField("a", nodeOf(crdt.MaxNodeID), 1),
			hdr.uv(1).intField("a", nodeOf(crdt.MaxNodeID+1), 1)},
		{"node ID too long in the document tombstone",
			hdrDel(nodeOf(crdt.MaxNodeID)).uv(0),
			hdrDel(nodeOf(crdt.MaxNodeID + 1)).uv(0)},
		{"value length beyond the input",
			hdr.uv(1).str("a").stamp(s1).b(0, byte(crdt.KindBytes)).uv(3).b(1, 2, 3),
			hdr.uv(1).str("a").stamp(s1).b(0, byte(crdt.KindBytes)).uv(4).b(1, 2, 3)},
		{"value length far beyond the input",
			hdr.uv(1).str("a").stamp(s1).b(0, byte(crdt.KindBytes)).uv(0),
			hdr.uv(1).str("a").stamp(s1).b(0, byte(crdt.KindBytes)).uv(1 << 62)},
		{"truncated timestamp",
			hdr.uv(1).tombField("a", s1),
			hdr.uv(1).str("a").b(0, 0, 0)},
		{"empty input", hdr.uv(0), nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := crdt.Unmarshal(c.good)
			if err != nil {
				t.Fatalf("good twin rejected: %v\n %x", err, []byte(c.good))
			}
			if got := d.Marshal(); !bytes.Equal(got, c.good) {
				t.Fatalf("good twin is not canonical:\n got  %x\n want %x", got, []byte(c.good))
			}
			err = expectCorrupt(t, c.bad)
			why, ok := rejectReasons[c.name]
			if !ok {
				t.Fatalf("no expected reason for case %q", c.name)
			}
			if !strings.Contains(err.Error(), why) {
				t.Fatalf("rejected for the wrong reason: %v (want %q)", err, why)
			}
		})
	}
}

// rejectReasons is the substring each TestUnmarshalRejects case's error
// must contain, so a case cannot pass by failing for an unrelated reason.
var rejectReasons = map[string]string{
	"unsorted fields":                                  "out of order",
	"unsorted fields (byte order, not length)":         "out of order",
	"duplicate names":                                  "out of order",
	"duplicate names (value then tombstone)":           "out of order",
	"empty name":                                       "empty",
	"trailing byte":                                    "trailing",
	"trailing field beyond count":                      "trailing",
	"count larger than fields present":                 "varint",
	"empty document with trailing byte":                "trailing",
	"non-minimal varint: field count":                  "non-minimal varint",
	"non-minimal varint: zero field count":             "non-minimal varint",
	"non-minimal varint: name length":                  "non-minimal varint",
	"non-minimal varint: node length":                  "non-minimal varint",
	"non-minimal varint: value length":                 "non-minimal varint",
	"varint overflow":                                  "varint",
	"invalid UTF-8 in a string value":                  "UTF-8",
	"UTF-16 surrogate in a string value":               "UTF-8",
	"truncated UTF-8 in a string value":                "UTF-8",
	"int with 7 bytes":                                 "7 bytes",
	"int with 9 bytes":                                 "9 bytes",
	"int with 0 bytes":                                 "0 bytes",
	"float with 4 bytes":                               "4 bytes",
	"bool 2":                                           "bool",
	"bool with 2 bytes":                                "bool",
	"bool with 0 bytes":                                "bool",
	"unknown kind 6":                                   "unknown field type",
	"unknown kind 255":                                 "unknown field type",
	"invalid kind 0":                                   "unknown field type",
	"bad field flags":                                  "flags",
	"tombstone followed by a value":                    "trailing",
	"field older than the document tombstone":          "hidden",
	"field at the document tombstone":                  "hidden",
	"field tombstone hidden by the document tombstone": "hidden",
	"hidden field after a visible one":                 "hidden",
	"zero document tombstone":                          "zero document tombstone",
	"bad tombstone flag":                               "tombstone flag",
	"tombstone flag 0xff":                              "tombstone flag",
	"version 0":                                        "version",
	"version 2":                                        "version",
	"negative wall in the document tombstone":          "negative",
	"negative wall in a field stamp":                   "negative",
	"too many fields":                                  "exceeds limit",
	"field count far over the limit":                   "exceeds limit",
	"field name too long":                              "129",
	"node ID too long in a field stamp":                "65",
	"node ID too long in the document tombstone":       "65",
	"value length beyond the input":                    "out of range",
	"value length far beyond the input":                "out of range",
	"truncated timestamp":                              "truncated",
	"empty input":                                      "version",
}

func expectCorrupt(t *testing.T, b []byte) error {
	t.Helper()
	d, err := crdt.Unmarshal(b)
	if err == nil {
		t.Fatalf("Unmarshal accepted %x as %s", b, dump(d))
	}
	if !errors.Is(err, crdt.ErrCorrupt) {
		t.Fatalf("error %v does not wrap ErrCorrupt", err)
	}
	if !d.IsEmpty() {
		t.Fatalf("Unmarshal returned %s alongside an error", dump(d))
	}
	return err
}

func TestUnmarshalSizeLimit(t *testing.T) {
	// A document whose encoding is exactly MaxDocSize bytes decodes; one
	// byte more does not.
	withData := func(n int) []byte {
		return crdt.Doc{Fields: map[string]crdt.Field{"blob": f2(crdt.Bytes(make([]byte, n)), s1)}}.Marshal()
	}
	overhead := len(withData(crdt.MaxDocSize/2)) - crdt.MaxDocSize/2
	atLimit := withData(crdt.MaxDocSize - overhead)
	if len(atLimit) != crdt.MaxDocSize {
		t.Fatalf("test setup: built %d bytes, want %d", len(atLimit), crdt.MaxDocSize)
	}
	d, err := crdt.Unmarshal(atLimit)
	if err != nil {
		t.Fatalf("document of exactly MaxDocSize rejected: %v", err)
	}
	if !bytes.Equal(d.Marshal(), atLimit) {
		t.Fatalf("round trip at the limit differs")
	}
	over := withData(crdt.MaxDocSize - overhead + 1)
	if len(over) != crdt.MaxDocSize+1 {
		t.Fatalf("test setup: built %d bytes, want %d", len(over), crdt.MaxDocSize+1)
	}
	expectCorrupt(t, over)
	// Size is checked before anything else: garbage over the limit is
	// still ErrCorrupt.
	expectCorrupt(t, make([]byte, crdt.MaxDocSize+1))
}

func TestUnmarshalTruncated(t *testing.T) {
	d := crdt.Doc{
		Deleted: st(5, 1, "node"),
		Fields: map[string]crdt.Field{
			"a": f2(crdt.String("hello"), st(6, 0, "n")),
			"b": tomb(st(7, 0, "m")),
			"c": f2(crdt.Float(2.5), st(8, 3, "")),
			"d": f2(crdt.Bool(false), st(9, 0, "n")),
			"e": f2(crdt.Bytes(nil), st(10, 0, "n")),
		},
	}
	e := d.Marshal()
	if _, err := crdt.Unmarshal(e); err != nil {
		t.Fatalf("full encoding rejected: %v", err)
	}
	for n := range len(e) {
		t.Run(fmt.Sprint(n), func(t *testing.T) { expectCorrupt(t, e[:n]) })
	}
}
