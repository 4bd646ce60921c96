// Package crdt defines Shoal's replicated document: a map of named fields,
// each a last-writer-wins register, plus a document-level tombstone.
//
// Every field carries the Stamp of the write that set it: an HLC timestamp
// with the writer's node ID as tie-break, so any two writes are totally
// ordered and every replica picks the same winner. A deleted field keeps a
// tombstone (Deleted set, no value) so that an older concurrent write cannot
// bring it back. Deleting a whole document sets the document's Deleted stamp,
// which hides (and drops) every field written at or before it.
//
// Merge is the join of a semilattice: commutative, associative and
// idempotent (the property tests check this over random histories). Local
// writes are expressed as small delta documents merged into the current one,
// so a write, a replicated delta and a full-state repair are the same
// operation.
//
// Documents have one canonical binary encoding (Marshal); equal documents
// encode to equal bytes, so Digest can index them in a Merkle Search Tree.
// The package is pure: no I/O.
package crdt

import (
	"bytes"
	"crypto/sha256"
	"maps"
	"slices"
	"strings"

	"github.com/shoal-dev/shoal/pkg/hlc"
)

// Stamp totally orders writes: by HLC timestamp, then by node ID.
type Stamp struct {
	TS   hlc.Timestamp
	Node string
}

// Compare returns -1, 0 or +1 as s orders before, equal to or after o.
func (s Stamp) Compare(o Stamp) int {
	if c := s.TS.Compare(o.TS); c != 0 {
		return c
	}
	return strings.Compare(s.Node, o.Node)
}

// IsZero reports whether s is the zero stamp, which precedes all others.
func (s Stamp) IsZero() bool { return s.TS.IsZero() && s.Node == "" }

// Field is one LWW register. A field with Deleted set is a tombstone and has
// no value.
type Field struct {
	Value   Value
	Stamp   Stamp
	Deleted bool
}

// Doc is a replicated document. The zero value is an empty document that
// has never been written. Treat a Doc as immutable once shared: every
// function here returns a new Doc instead of modifying its arguments.
type Doc struct {
	Fields map[string]Field
	// Deleted is the stamp of the latest whole-document delete, zero if
	// none. Fields stamped at or before it are gone.
	Deleted Stamp
}

// Merge returns the join of a and b: per field the register with the
// greater stamp, and the later document tombstone.
func Merge(a, b Doc) Doc {
	out := Doc{Deleted: a.Deleted, Fields: make(map[string]Field, max(len(a.Fields), len(b.Fields)))}
	if out.Deleted.Compare(b.Deleted) < 0 {
		out.Deleted = b.Deleted
	}
	for name, f := range a.Fields {
		out.Fields[name] = f
	}
	for name, f := range b.Fields {
		if cur, ok := out.Fields[name]; !ok || fieldLess(cur, f) {
			out.Fields[name] = f
		}
	}
	out.normalize()
	return out
}

// fieldLess orders registers by stamp. Two different registers with one
// stamp can only come from a buggy or hostile writer; ordering them by
// content keeps Merge commutative even then.
func fieldLess(a, b Field) bool {
	if c := a.Stamp.Compare(b.Stamp); c != 0 {
		return c < 0
	}
	if a.Deleted != b.Deleted {
		return b.Deleted // a tombstone wins a tie
	}
	if a.Value.Kind != b.Value.Kind {
		return a.Value.Kind < b.Value.Kind
	}
	return bytes.Compare(a.Value.Data, b.Value.Data) < 0
}

// normalize drops fields hidden by the document tombstone. Dropping them is
// what makes the encoding canonical: two replicas that merged the same
// writes in different orders hold the same bytes.
func (d *Doc) normalize() {
	if d.Deleted.IsZero() {
		return
	}
	for name, f := range d.Fields {
		if f.Stamp.Compare(d.Deleted) <= 0 {
			delete(d.Fields, name)
		}
	}
}

// Set returns the delta that writes fields at stamp s.
func Set(fields map[string]Value, s Stamp) Doc {
	d := Doc{Fields: make(map[string]Field, len(fields))}
	for name, v := range fields {
		d.Fields[name] = Field{Value: v, Stamp: s}
	}
	return d
}

// DeleteFields returns the delta that deletes the named fields at stamp s.
func DeleteFields(names []string, s Stamp) Doc {
	d := Doc{Fields: make(map[string]Field, len(names))}
	for _, name := range names {
		d.Fields[name] = Field{Stamp: s, Deleted: true}
	}
	return d
}

// DeleteDoc returns the delta that deletes the whole document at stamp s.
func DeleteDoc(s Stamp) Doc { return Doc{Deleted: s} }

// Live returns the visible fields of d: those neither deleted nor hidden by
// the document tombstone.
func (d Doc) Live() map[string]Value {
	out := make(map[string]Value, len(d.Fields))
	for name, f := range d.Fields {
		if !f.Deleted && f.Stamp.Compare(d.Deleted) > 0 {
			out[name] = f.Value
		}
	}
	return out
}

// Exists reports whether d has at least one visible field.
func (d Doc) Exists() bool {
	for _, f := range d.Fields {
		if !f.Deleted && f.Stamp.Compare(d.Deleted) > 0 {
			return true
		}
	}
	return false
}

// IsEmpty reports whether d holds nothing at all, not even a tombstone: it
// is the document that was never written.
func (d Doc) IsEmpty() bool { return len(d.Fields) == 0 && d.Deleted.IsZero() }

// MaxStamp returns the latest stamp anywhere in d: the stamp of the last
// write merged into it.
func (d Doc) MaxStamp() Stamp {
	m := d.Deleted
	for _, f := range d.Fields {
		if m.Compare(f.Stamp) < 0 {
			m = f.Stamp
		}
	}
	return m
}

// Equal reports whether a and b are the same document.
func Equal(a, b Doc) bool {
	if a.Deleted != b.Deleted || len(a.Fields) != len(b.Fields) {
		return false
	}
	for name, f := range a.Fields {
		g, ok := b.Fields[name]
		if !ok || f.Stamp != g.Stamp || f.Deleted != g.Deleted || !f.Value.Equal(g.Value) {
			return false
		}
	}
	return true
}

// Dominates reports whether merging delta into d would change nothing.
func Dominates(d, delta Doc) bool { return Equal(Merge(d, delta), d) }

// Digest is the SHA-256 of a document's canonical encoding.
type Digest [sha256.Size]byte

// Digest returns the digest of d's canonical encoding.
func (d Doc) Digest() Digest { return sha256.Sum256(d.Marshal()) }

// fieldNames returns the field names of d in canonical (sorted) order.
func (d Doc) fieldNames() []string { return slices.Sorted(maps.Keys(d.Fields)) }
