package crdt_test

import (
	"bytes"
	"maps"
	"slices"
	"unicode/utf8"

	"pgregory.net/rapid"

	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/hlc"
)

// Shared helpers and rapid generators for the crdt tests.

func st(wall int64, logical uint32, node string) crdt.Stamp {
	return crdt.Stamp{TS: hlc.Timestamp{Wall: wall, Logical: logical}, Node: node}
}

func f2(v crdt.Value, s crdt.Stamp) crdt.Field { return crdt.Field{Value: v, Stamp: s} }
func tomb(s crdt.Stamp) crdt.Field             { return crdt.Field{Stamp: s, Deleted: true} }

// fataler is what the helpers need from *testing.T and *rapid.T.
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

// mustEqualDocs fails unless a and b are Equal and encode identically.
func mustEqualDocs(t fataler, what string, a, b crdt.Doc) {
	t.Helper()
	if !crdt.Equal(a, b) {
		t.Fatalf("%s: documents differ:\n  %s\n  %s", what, dump(a), dump(b))
	}
	if ea, eb := a.Marshal(), b.Marshal(); !bytes.Equal(ea, eb) {
		t.Fatalf("%s: Equal documents encode differently:\n  %x\n  %x", what, ea, eb)
	}
}

// dump renders a document deterministically for failure messages.
func dump(d crdt.Doc) string {
	var b bytes.Buffer
	b.WriteString("{")
	if !d.Deleted.IsZero() {
		b.WriteString("deleted@" + stampString(d.Deleted) + " ")
	}
	for i, name := range slices.Sorted(maps.Keys(d.Fields)) {
		if i > 0 {
			b.WriteString(" ")
		}
		f := d.Fields[name]
		b.WriteString(name + "@" + stampString(f.Stamp) + "=")
		if f.Deleted {
			b.WriteString("<del>")
		} else {
			b.WriteString(f.Value.Kind.String() + ":" + f.Value.Text())
		}
	}
	b.WriteString("}")
	return b.String()
}

func stampString(s crdt.Stamp) string { return s.TS.String() + "/" + s.Node }

// liveEqual compares two Live() maps.
func liveEqual(a, b map[string]crdt.Value) bool {
	return maps.EqualFunc(a, b, crdt.Value.Equal)
}

// --- generators -----------------------------------------------------------

// genValue draws any valid value.
func genValue() *rapid.Generator[crdt.Value] {
	return rapid.OneOf(
		rapid.Map(rapid.StringN(0, 16, 64).Filter(utf8.ValidString), crdt.String),
		rapid.Map(rapid.Int64(), crdt.Int),
		rapid.Map(rapid.Float64(), crdt.Float),
		rapid.Map(rapid.Bool(), crdt.Bool),
		rapid.Map(rapid.SliceOfN(rapid.Byte(), 0, 32), crdt.Bytes),
	)
}

// genTinyValue draws from a handful of values, so that two writes with the
// same stamp often carry different values (a hostile or buggy writer).
func genTinyValue() *rapid.Generator[crdt.Value] {
	return rapid.SampledFrom([]crdt.Value{
		crdt.Int(1), crdt.Int(2), crdt.String("x"), crdt.String(""), crdt.Bool(true), crdt.Bytes(nil),
	})
}

// genWideStamp draws stamps from the whole encodable space.
func genWideStamp() *rapid.Generator[crdt.Stamp] {
	return rapid.Custom(func(t *rapid.T) crdt.Stamp {
		var node string
		if rapid.Bool().Draw(t, "binaryNode") {
			node = string(rapid.SliceOfN(rapid.Byte(), 0, crdt.MaxNodeID).Draw(t, "nodeBytes"))
		} else {
			node = rapid.StringN(0, 8, crdt.MaxNodeID).Draw(t, "node")
		}
		return crdt.Stamp{
			TS: hlc.Timestamp{
				// Negative walls are not encodable (an hlc.Clock never
				// issues one; see TestUnmarshalRejects).
				Wall:    rapid.Int64Min(0).Draw(t, "wall"),
				Logical: rapid.Uint32().Draw(t, "logical"),
			},
			Node: node,
		}
	})
}

// genSmallStamp draws from a tiny stamp space so stamps collide often.
func genSmallStamp() *rapid.Generator[crdt.Stamp] {
	return rapid.Custom(func(t *rapid.T) crdt.Stamp {
		return st(
			rapid.Int64Range(1, 6).Draw(t, "wall"),
			rapid.Uint32Range(0, 1).Draw(t, "logical"),
			rapid.SampledFrom([]string{"a", "b"}).Draw(t, "node"),
		)
	})
}

// genName draws a valid (non-empty, within limit) field name.
func genName() *rapid.Generator[string] {
	return rapid.OneOf(
		rapid.SampledFrom([]string{"a", "b", "c", "image", "replicas", "x/y"}),
		rapid.StringN(1, 12, crdt.MaxFieldName),
		rapid.Map(rapid.SliceOfN(rapid.Byte(), 1, crdt.MaxFieldName), func(b []byte) string { return string(b) }),
	)
}

// genDoc draws a normalized document (no field hidden by the document
// tombstone), which is what Merge produces and Unmarshal accepts. The
// normalization here is independent of the package's own.
func genDoc(stamp *rapid.Generator[crdt.Stamp], name *rapid.Generator[string], value *rapid.Generator[crdt.Value], maxFields int) *rapid.Generator[crdt.Doc] {
	return rapid.Custom(func(t *rapid.T) crdt.Doc {
		var d crdt.Doc
		if rapid.IntRange(0, 2).Draw(t, "hasDocTombstone") == 0 {
			d.Deleted = stamp.Filter(func(s crdt.Stamp) bool { return !s.IsZero() }).Draw(t, "docTombstone")
		}
		names := rapid.SliceOfNDistinct(name, 0, maxFields, rapid.ID[string]).Draw(t, "names")
		if len(names) > 0 || rapid.Bool().Draw(t, "nonNilFields") {
			d.Fields = make(map[string]crdt.Field, len(names))
		}
		for _, n := range names {
			s := stamp.Draw(t, "stamp")
			if !d.Deleted.IsZero() && s.Compare(d.Deleted) <= 0 {
				continue // hidden: a normalized document does not hold it
			}
			if rapid.IntRange(0, 3).Draw(t, "tombstone") == 0 {
				d.Fields[n] = tomb(s)
			} else {
				d.Fields[n] = f2(value.Draw(t, "value"), s)
			}
		}
		return d
	})
}

// genWideDoc draws documents across the whole encodable space.
func genWideDoc() *rapid.Generator[crdt.Doc] {
	return genDoc(genWideStamp(), genName(), genValue(), 12)
}

// genSmallDoc draws documents from a tiny space of names, stamps and values
// so merges constantly conflict.
func genSmallDoc() *rapid.Generator[crdt.Doc] {
	return genDoc(genSmallStamp(), rapid.SampledFrom([]string{"a", "b", "c"}), genTinyValue(), 3)
}
