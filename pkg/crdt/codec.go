package crdt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/shoal-dev/shoal/pkg/hlc"
)

// Limits on documents. They bound what a peer or client can make a node
// store or decode; the API rejects larger input before anything is written.
const (
	// MaxDocSize is the largest canonical encoding of a document.
	MaxDocSize = 1 << 20
	// MaxFields is the most fields (live or tombstoned) a document holds.
	MaxFields = 1024
	// MaxFieldName is the longest field name, in bytes.
	MaxFieldName = 128
	// MaxNodeID is the longest node ID in a stamp, in bytes.
	MaxNodeID = 64
)

const encodingVersion = 1

const (
	flagDeleted = 1 << iota
)

// ErrCorrupt wraps every decoding error.
var ErrCorrupt = errors.New("crdt: corrupt document encoding")

// Marshal returns the canonical encoding of d:
//
//	version:1 | hasDeleted:1 [stamp] | uvarint n | n × field
//	field = name:str | stamp | flags:1 [kind:1 data:str]
//	stamp = hlc:12 | node:str     str = uvarint len | bytes
//
// Fields are sorted by name, so equal documents encode identically.
func (d Doc) Marshal() []byte {
	b := make([]byte, 0, 32+len(d.Fields)*48)
	b = append(b, encodingVersion)
	if d.Deleted.IsZero() {
		b = append(b, 0)
	} else {
		b = append(b, 1)
		b = appendStamp(b, d.Deleted)
	}
	b = binary.AppendUvarint(b, uint64(len(d.Fields)))
	for _, name := range d.fieldNames() {
		f := d.Fields[name]
		b = appendString(b, name)
		b = appendStamp(b, f.Stamp)
		if f.Deleted {
			b = append(b, flagDeleted)
			continue
		}
		b = append(b, 0, byte(f.Value.Kind))
		b = binary.AppendUvarint(b, uint64(len(f.Value.Data)))
		b = append(b, f.Value.Data...)
	}
	return b
}

func appendStamp(b []byte, s Stamp) []byte {
	b = s.TS.AppendBinary(b)
	return appendString(b, s.Node)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// Unmarshal decodes a document and checks that it is canonical and within
// the limits: a decoded document re-encodes to exactly the input bytes.
func Unmarshal(b []byte) (Doc, error) {
	if len(b) > MaxDocSize {
		return Doc{}, fmt.Errorf("%w: %d bytes exceeds limit %d", ErrCorrupt, len(b), MaxDocSize)
	}
	// NB: decoded values alias the input; callers often pass buffers
	// they do not own (Pebble's), so decode from a private copy.
	b = bytes.Clone(b)
	r := reader{b: b}
	if v := r.byte(); v != encodingVersion {
		return Doc{}, r.fail(fmt.Errorf("unknown version %d", v))
	}
	var d Doc
	switch r.byte() {
	case 0:
	case 1:
		d.Deleted = r.stamp()
		if d.Deleted.IsZero() {
			r.setErr(errors.New("zero document tombstone"))
		}
	default:
		r.setErr(errors.New("bad tombstone flag"))
	}
	n := r.uvarint()
	if n > MaxFields {
		return Doc{}, r.fail(fmt.Errorf("%d fields exceeds limit %d", n, MaxFields))
	}
	d.Fields = make(map[string]Field, n)
	prev := ""
	for i := uint64(0); i < n && r.err == nil; i++ {
		name := r.string(MaxFieldName)
		if name == "" || (i > 0 && name <= prev) {
			r.setErr(fmt.Errorf("field %q empty or out of order", name))
			break
		}
		prev = name
		f := Field{Stamp: r.stamp()}
		switch r.byte() {
		case flagDeleted:
			f.Deleted = true
		case 0:
			f.Value.Kind = Kind(r.byte())
			f.Value.Data = r.bytes(MaxDocSize)
			if r.err == nil {
				if err := f.Value.Validate(); err != nil {
					r.setErr(fmt.Errorf("field %q: %w", name, err))
				}
			}
		default:
			r.setErr(fmt.Errorf("field %q: bad flags", name))
		}
		if r.err == nil && !d.Deleted.IsZero() && f.Stamp.Compare(d.Deleted) <= 0 {
			r.setErr(fmt.Errorf("field %q hidden by document tombstone", name))
		}
		d.Fields[name] = f
	}
	if r.err == nil && r.off != len(b) {
		r.setErr(fmt.Errorf("%d trailing bytes", len(b)-r.off))
	}
	if r.err != nil {
		return Doc{}, r.fail(r.err)
	}
	return d, nil
}

type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) setErr(err error) {
	if r.err == nil {
		r.err = err
	}
}

func (r *reader) fail(err error) error { return fmt.Errorf("%w: %v", ErrCorrupt, err) }

func (r *reader) byte() byte {
	if r.err != nil {
		return 0
	}
	if r.off >= len(r.b) {
		r.setErr(errors.New("truncated"))
		return 0
	}
	c := r.b[r.off]
	r.off++
	return c
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b[r.off:])
	if n <= 0 {
		r.setErr(errors.New("bad varint"))
		return 0
	}
	// Canonical varints only, or two encodings of one document would exist.
	if n != len(binary.AppendUvarint(nil, v)) {
		r.setErr(errors.New("non-minimal varint"))
		return 0
	}
	r.off += n
	return v
}

func (r *reader) bytes(limit int) []byte {
	n := r.uvarint()
	if r.err != nil {
		return nil
	}
	if n > uint64(limit) || n > uint64(len(r.b)-r.off) {
		r.setErr(fmt.Errorf("length %d out of range", n))
		return nil
	}
	out := r.b[r.off : r.off+int(n) : r.off+int(n)]
	r.off += int(n)
	return out
}

func (r *reader) string(limit int) string { return string(r.bytes(limit)) }

func (r *reader) stamp() Stamp {
	if r.err != nil {
		return Stamp{}
	}
	if len(r.b)-r.off < hlc.EncodedLen {
		r.setErr(errors.New("truncated timestamp"))
		return Stamp{}
	}
	ts, _ := hlc.Decode(r.b[r.off:])
	r.off += hlc.EncodedLen
	// An hlc.Clock never issues a negative wall, and such a stamp would
	// order below the zero stamp that Merge and Live treat as "none".
	if ts.Wall < 0 {
		r.setErr(errors.New("negative timestamp"))
		return Stamp{}
	}
	return Stamp{TS: ts, Node: r.string(MaxNodeID)}
}
