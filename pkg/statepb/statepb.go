// Package statepb converts between the pure crdt types and the
// shoal.state.v1 protobuf messages, in both directions, for statd's server
// and for its clients. Keeping the mapping in one place keeps the wire
// format and the stored format from drifting apart.
package statepb

import (
	"fmt"

	"github.com/containerd/errdefs"

	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/hlc"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

// ToValue converts a crdt value to its protobuf form.
func ToValue(v crdt.Value) *statev1.Value {
	switch v.Kind {
	case crdt.KindString:
		s, _ := v.AsString()
		return &statev1.Value{Kind: &statev1.Value_StringValue{StringValue: s}}
	case crdt.KindInt:
		i, _ := v.AsInt()
		return &statev1.Value{Kind: &statev1.Value_IntValue{IntValue: i}}
	case crdt.KindFloat:
		f, _ := v.AsFloat()
		return &statev1.Value{Kind: &statev1.Value_FloatValue{FloatValue: f}}
	case crdt.KindBool:
		b, _ := v.AsBool()
		return &statev1.Value{Kind: &statev1.Value_BoolValue{BoolValue: b}}
	case crdt.KindBytes:
		return &statev1.Value{Kind: &statev1.Value_BytesValue{BytesValue: v.Data}}
	}
	return &statev1.Value{}
}

// FromValue converts a protobuf value; a value with no kind set (or one
// this version does not know) is an InvalidArgument error.
func FromValue(v *statev1.Value) (crdt.Value, error) {
	switch k := v.GetKind().(type) {
	case *statev1.Value_StringValue:
		out := crdt.String(k.StringValue)
		return out, out.Validate()
	case *statev1.Value_IntValue:
		return crdt.Int(k.IntValue), nil
	case *statev1.Value_FloatValue:
		return crdt.Float(k.FloatValue), nil
	case *statev1.Value_BoolValue:
		return crdt.Bool(k.BoolValue), nil
	case *statev1.Value_BytesValue:
		return crdt.Bytes(k.BytesValue), nil
	}
	return crdt.Value{}, fmt.Errorf("unknown field type (no value kind set): %w", errdefs.ErrInvalidArgument)
}

// FromFields converts a protobuf field map.
func FromFields(fields map[string]*statev1.Value) (map[string]crdt.Value, error) {
	out := make(map[string]crdt.Value, len(fields))
	for name, v := range fields {
		cv, err := FromValue(v)
		if err != nil {
			return nil, fmt.Errorf("field %q: %w", name, err)
		}
		out[name] = cv
	}
	return out, nil
}

// ToStamp converts a stamp; the zero stamp becomes nil.
func ToStamp(s crdt.Stamp) *statev1.Stamp {
	if s.IsZero() {
		return nil
	}
	return &statev1.Stamp{Wall: s.TS.Wall, Logical: s.TS.Logical, Node: s.Node}
}

// FromStamp converts a protobuf stamp; nil is the zero stamp.
func FromStamp(s *statev1.Stamp) crdt.Stamp {
	if s == nil {
		return crdt.Stamp{}
	}
	return crdt.Stamp{TS: hlc.Timestamp{Wall: s.Wall, Logical: s.Logical}, Node: s.Node}
}

// ToDocument converts a stored document. withMeta adds the registers
// behind every field, tombstones included, and the document tombstone.
func ToDocument(key string, rev uint64, d crdt.Doc, withMeta bool) *statev1.Document {
	out := &statev1.Document{
		Key:      key,
		Revision: rev,
		Fields:   map[string]*statev1.Value{},
		Updated:  ToStamp(d.MaxStamp()),
	}
	for name, v := range d.Live() {
		out.Fields[name] = ToValue(v)
	}
	if withMeta || !d.Exists() {
		out.Deleted = ToStamp(d.Deleted)
	}
	if withMeta {
		out.Meta = make(map[string]*statev1.FieldMeta, len(d.Fields))
		for name, f := range d.Fields {
			out.Meta[name] = &statev1.FieldMeta{Stamp: ToStamp(f.Stamp), Deleted: f.Deleted}
		}
	}
	return out
}

// FromDocument rebuilds the CRDT document behind a Document read with
// meta (per-field stamps and tombstones): what a daemon needs to apply
// rules that compare stamps. Without meta, fields get zero stamps.
func FromDocument(d *statev1.Document) crdt.Doc {
	out := crdt.Doc{Fields: make(map[string]crdt.Field, len(d.GetMeta())+len(d.GetFields())), Deleted: FromStamp(d.GetDeleted())}
	for name, v := range d.GetFields() {
		cv, err := FromValue(v)
		if err != nil {
			continue
		}
		// Without meta, the document's latest stamp stands in: a zero stamp
		// would make the field invisible (hidden by the zero tombstone).
		f := crdt.Field{Value: cv, Stamp: FromStamp(d.GetUpdated())}
		if m := d.GetMeta()[name]; m != nil {
			f.Stamp = FromStamp(m.GetStamp())
		}
		out.Fields[name] = f
	}
	for name, m := range d.GetMeta() {
		if m.GetDeleted() {
			out.Fields[name] = crdt.Field{Stamp: FromStamp(m.GetStamp()), Deleted: true}
		}
	}
	return out
}
