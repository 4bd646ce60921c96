package crdt

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"
)

// Kind is the type of a field value. The set is closed: a decoder or API
// that meets another kind rejects it, so every replica interprets a value
// the same way.
type Kind uint8

// Value kinds. The numbers are part of the encoding; never renumber.
const (
	KindInvalid Kind = iota
	KindString
	KindInt
	KindFloat
	KindBool
	KindBytes
)

var kindNames = [...]string{"invalid", "string", "int", "float", "bool", "bytes"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", k)
}

// ParseKind maps a kind name (as used by shoalctl's field:kind=value syntax)
// to a Kind.
func ParseKind(name string) (Kind, error) {
	for k, n := range kindNames {
		if k != int(KindInvalid) && n == name {
			return Kind(k), nil
		}
	}
	return KindInvalid, fmt.Errorf("unknown field type %q (want string, int, float, bool or bytes)", name)
}

// Value is a typed field value held in its canonical byte form: UTF-8 for
// strings, 8 big-endian bytes for ints and IEEE-754 floats, one byte 0/1 for
// bools, raw bytes for bytes.
type Value struct {
	Kind Kind
	Data []byte
}

// String, Int, Float, Bool and Bytes construct values.
func String(s string) Value { return Value{Kind: KindString, Data: []byte(s)} }

// Int returns an int value.
func Int(i int64) Value {
	return Value{Kind: KindInt, Data: binary.BigEndian.AppendUint64(nil, uint64(i))}
}

// Float returns a float value.
func Float(f float64) Value {
	return Value{Kind: KindFloat, Data: binary.BigEndian.AppendUint64(nil, math.Float64bits(f))}
}

// Bool returns a bool value.
func Bool(b bool) Value {
	if b {
		return Value{Kind: KindBool, Data: []byte{1}}
	}
	return Value{Kind: KindBool, Data: []byte{0}}
}

// Bytes returns a bytes value.
func Bytes(b []byte) Value { return Value{Kind: KindBytes, Data: bytes.Clone(b)} }

// Validate checks that Data is a canonical encoding for Kind.
func (v Value) Validate() error {
	switch v.Kind {
	case KindString:
		if !utf8.Valid(v.Data) {
			return fmt.Errorf("string value is not valid UTF-8")
		}
	case KindInt, KindFloat:
		if len(v.Data) != 8 {
			return fmt.Errorf("%v value has %d bytes, want 8", v.Kind, len(v.Data))
		}
	case KindBool:
		if len(v.Data) != 1 || v.Data[0] > 1 {
			return fmt.Errorf("bool value must be one byte 0 or 1")
		}
	case KindBytes:
	default:
		return fmt.Errorf("unknown field type %v", v.Kind)
	}
	return nil
}

// Equal reports whether v and w are the same value.
func (v Value) Equal(w Value) bool { return v.Kind == w.Kind && bytes.Equal(v.Data, w.Data) }

// AsString returns the value of a string; the others report false.
func (v Value) AsString() (string, bool) { return string(v.Data), v.Kind == KindString }

// AsInt returns the value of an int.
func (v Value) AsInt() (int64, bool) {
	if v.Kind != KindInt || len(v.Data) != 8 {
		return 0, false
	}
	return int64(binary.BigEndian.Uint64(v.Data)), true
}

// AsFloat returns the value of a float.
func (v Value) AsFloat() (float64, bool) {
	if v.Kind != KindFloat || len(v.Data) != 8 {
		return 0, false
	}
	return math.Float64frombits(binary.BigEndian.Uint64(v.Data)), true
}

// AsBool returns the value of a bool.
func (v Value) AsBool() (bool, bool) {
	if v.Kind != KindBool || len(v.Data) != 1 {
		return false, false
	}
	return v.Data[0] == 1, true
}

// Text renders v for humans: strings as is, numbers and bools in Go
// syntax, bytes as standard base64.
func (v Value) Text() string {
	switch v.Kind {
	case KindString:
		return string(v.Data)
	case KindInt:
		i, _ := v.AsInt()
		return strconv.FormatInt(i, 10)
	case KindFloat:
		f, _ := v.AsFloat()
		return strconv.FormatFloat(f, 'g', -1, 64)
	case KindBool:
		b, _ := v.AsBool()
		return strconv.FormatBool(b)
	case KindBytes:
		return base64.StdEncoding.EncodeToString(v.Data)
	}
	return ""
}

// ParseValue parses text as a value of kind k (the inverse of Text).
func ParseValue(k Kind, text string) (Value, error) {
	switch k {
	case KindString:
		if !utf8.ValidString(text) {
			return Value{}, fmt.Errorf("string value is not valid UTF-8: %q", text)
		}
		return String(text), nil
	case KindInt:
		i, err := strconv.ParseInt(text, 10, 64)
		if err != nil {
			return Value{}, fmt.Errorf("not an int: %q", text)
		}
		return Int(i), nil
	case KindFloat:
		f, err := strconv.ParseFloat(text, 64)
		if err != nil {
			return Value{}, fmt.Errorf("not a float: %q", text)
		}
		return Float(f), nil
	case KindBool:
		b, err := strconv.ParseBool(text)
		if err != nil {
			return Value{}, fmt.Errorf("not a bool: %q", text)
		}
		return Bool(b), nil
	case KindBytes:
		b, err := base64.StdEncoding.DecodeString(text)
		if err != nil {
			return Value{}, fmt.Errorf("bytes value is not base64: %q", text)
		}
		return Bytes(b), nil
	}
	return Value{}, fmt.Errorf("unknown field type %v", k)
}
