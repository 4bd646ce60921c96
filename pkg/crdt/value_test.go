package crdt_test

import (
	"bytes"
	"math"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"pgregory.net/rapid"

	"github.com/shoal-dev/shoal/pkg/crdt"
)

var allKinds = []crdt.Kind{crdt.KindString, crdt.KindInt, crdt.KindFloat, crdt.KindBool, crdt.KindBytes}

func TestKindNames(t *testing.T) {
	want := map[crdt.Kind]string{
		crdt.KindInvalid: "invalid",
		crdt.KindString:  "string",
		crdt.KindInt:     "int",
		crdt.KindFloat:   "float",
		crdt.KindBool:    "bool",
		crdt.KindBytes:   "bytes",
		6:                "kind(6)",
		255:              "kind(255)",
	}
	for k, name := range want {
		if got := k.String(); got != name {
			t.Errorf("Kind(%d).String() = %q, want %q", uint8(k), got, name)
		}
	}
	// The numbers are part of the encoding.
	for i, k := range allKinds {
		if uint8(k) != uint8(i+1) {
			t.Errorf("%v = %d, want %d", k, uint8(k), i+1)
		}
	}
	for _, k := range allKinds {
		got, err := crdt.ParseKind(k.String())
		if err != nil || got != k {
			t.Errorf("ParseKind(%q) = %v, %v; want %v", k.String(), got, err, k)
		}
	}
}

func TestParseKindRejects(t *testing.T) {
	for _, name := range []string{"", "invalid", "String", "INT", " int", "int ", "int64", "float64", "boolean", "byte", "kind(6)", "strings"} {
		k, err := crdt.ParseKind(name)
		if err == nil {
			t.Errorf("ParseKind(%q) = %v, want error", name, k)
			continue
		}
		if k != crdt.KindInvalid {
			t.Errorf("ParseKind(%q) returned kind %v with its error", name, k)
		}
		msg := err.Error()
		if !strings.Contains(msg, strconv.Quote(name)) {
			t.Errorf("ParseKind(%q) error %q does not quote the input", name, msg)
		}
		for _, valid := range []string{"string", "int", "float", "bool", "bytes"} {
			if !strings.Contains(msg, valid) {
				t.Errorf("ParseKind(%q) error %q does not list %q", name, msg, valid)
			}
		}
	}
}

func TestParseValueAndText(t *testing.T) {
	cases := []struct {
		kind crdt.Kind
		text string
		want crdt.Value
		// canon is Text(want); empty means text is already canonical.
		canon string
	}{
		{crdt.KindString, "", crdt.String(""), ""},
		{crdt.KindString, "héllo wörld", crdt.String("héllo wörld"), ""},
		{crdt.KindString, "a=b:c, \"quoted\"\n", crdt.String("a=b:c, \"quoted\"\n"), ""},
		{crdt.KindInt, "0", crdt.Int(0), ""},
		{crdt.KindInt, "42", crdt.Int(42), ""},
		{crdt.KindInt, "-7", crdt.Int(-7), ""},
		{crdt.KindInt, "+7", crdt.Int(7), "7"},
		{crdt.KindInt, "007", crdt.Int(7), "7"},
		{crdt.KindInt, "9223372036854775807", crdt.Int(math.MaxInt64), ""},
		{crdt.KindInt, "-9223372036854775808", crdt.Int(math.MinInt64), ""},
		{crdt.KindFloat, "1.5", crdt.Float(1.5), ""},
		{crdt.KindFloat, "0", crdt.Float(0), ""},
		{crdt.KindFloat, "-0", crdt.Float(math.Copysign(0, -1)), ""},
		{crdt.KindFloat, "1e+300", crdt.Float(1e300), ""},
		{crdt.KindFloat, "5e-324", crdt.Float(5e-324), ""},
		{crdt.KindFloat, "+Inf", crdt.Float(math.Inf(1)), ""},
		{crdt.KindFloat, "-Inf", crdt.Float(math.Inf(-1)), ""},
		{crdt.KindFloat, "0.1", crdt.Float(0.1), ""},
		{crdt.KindFloat, "1e3", crdt.Float(1000), "1000"},
		{crdt.KindBool, "true", crdt.Bool(true), ""},
		{crdt.KindBool, "false", crdt.Bool(false), ""},
		{crdt.KindBool, "1", crdt.Bool(true), "true"},
		{crdt.KindBool, "F", crdt.Bool(false), "false"},
		{crdt.KindBytes, "", crdt.Bytes(nil), ""},
		{crdt.KindBytes, "AP8=", crdt.Bytes([]byte{0, 0xff}), ""},
		{crdt.KindBytes, "aGVsbG8=", crdt.Bytes([]byte("hello")), ""},
	}
	for _, c := range cases {
		got, err := crdt.ParseValue(c.kind, c.text)
		if err != nil {
			t.Errorf("ParseValue(%v, %q): %v", c.kind, c.text, err)
			continue
		}
		if !got.Equal(c.want) {
			t.Errorf("ParseValue(%v, %q) = %v %x, want %x", c.kind, c.text, got.Kind, got.Data, c.want.Data)
		}
		if err := got.Validate(); err != nil {
			t.Errorf("ParseValue(%v, %q) is invalid: %v", c.kind, c.text, err)
		}
		canon := c.canon
		if canon == "" {
			canon = c.text
		}
		if txt := got.Text(); txt != canon {
			t.Errorf("Text() of ParseValue(%v, %q) = %q, want %q", c.kind, c.text, txt, canon)
		}
	}
}

func TestParseValueRejects(t *testing.T) {
	cases := []struct {
		kind crdt.Kind
		text string
	}{
		{crdt.KindInt, ""},
		{crdt.KindInt, "1.5"},
		{crdt.KindInt, "0x10"},
		{crdt.KindInt, "1_000"},
		{crdt.KindInt, " 1"},
		{crdt.KindInt, "9223372036854775808"},
		{crdt.KindInt, "-9223372036854775809"},
		{crdt.KindFloat, ""},
		{crdt.KindFloat, "abc"},
		{crdt.KindFloat, "1.2.3"},
		{crdt.KindFloat, "1e400"}, // out of range
		{crdt.KindBool, ""},
		{crdt.KindBool, "yes"},
		{crdt.KindBool, "2"},
		{crdt.KindBytes, "!!!!"},
		{crdt.KindBytes, "AP8"},   // missing padding
		{crdt.KindBytes, "AP8=="}, // too much padding
		{crdt.KindString, "\xff"}, // not UTF-8: Validate would reject it
		{crdt.KindString, "ok\xed\xa0\x80"},
		{crdt.KindInvalid, "x"},
		{6, "x"},
	}
	for _, c := range cases {
		v, err := crdt.ParseValue(c.kind, c.text)
		if err == nil {
			t.Errorf("ParseValue(%v, %q) = %v %x, want error", c.kind, c.text, v.Kind, v.Data)
			continue
		}
		if v.Kind != crdt.KindInvalid || v.Data != nil {
			t.Errorf("ParseValue(%v, %q) returned %v %x with its error", c.kind, c.text, v.Kind, v.Data)
		}
		if err.Error() == "" {
			t.Errorf("ParseValue(%v, %q): empty error message", c.kind, c.text)
		}
	}
	if _, err := crdt.ParseValue(9, "x"); err == nil || !strings.Contains(err.Error(), "unknown field type") {
		t.Errorf("ParseValue(kind 9) error = %v, want unknown field type", err)
	}
}

func TestTextParseRoundTripProperty(t *testing.T) {
	roundTrip := func(t *rapid.T, v crdt.Value) {
		if err := v.Validate(); err != nil {
			t.Fatalf("constructor produced an invalid value: %v", err)
		}
		text := v.Text()
		got, err := crdt.ParseValue(v.Kind, text)
		if err != nil {
			t.Fatalf("ParseValue(%v, Text() = %q): %v", v.Kind, text, err)
		}
		if !got.Equal(v) {
			t.Fatalf("ParseValue(%v, %q) = %x, want %x", v.Kind, text, got.Data, v.Data)
		}
		if got.Text() != text {
			t.Fatalf("Text not stable: %q then %q", text, got.Text())
		}
	}
	t.Run("string", rapid.MakeCheck(func(t *rapid.T) {
		s := rapid.String().Draw(t, "s")
		if !utf8.ValidString(s) {
			t.Skip("generator produced invalid UTF-8")
		}
		roundTrip(t, crdt.String(s))
	}))
	t.Run("int", rapid.MakeCheck(func(t *rapid.T) {
		i := rapid.Int64().Draw(t, "i")
		v := crdt.Int(i)
		if got, ok := v.AsInt(); !ok || got != i {
			t.Fatalf("AsInt() = %d, %v", got, ok)
		}
		roundTrip(t, v)
	}))
	t.Run("float", rapid.MakeCheck(func(t *rapid.T) {
		bits := rapid.Uint64().Draw(t, "bits")
		f := math.Float64frombits(bits)
		if math.IsNaN(f) {
			t.Skip("NaN payloads do not survive Text (see TestFloatNaN)")
		}
		v := crdt.Float(f)
		if got, ok := v.AsFloat(); !ok || math.Float64bits(got) != bits {
			t.Fatalf("AsFloat() = %v, %v", got, ok)
		}
		roundTrip(t, v)
	}))
	t.Run("float-generated", rapid.MakeCheck(func(t *rapid.T) {
		f := rapid.Float64().Draw(t, "f")
		if math.IsNaN(f) {
			t.Skip("NaN")
		}
		roundTrip(t, crdt.Float(f))
	}))
	t.Run("bool", rapid.MakeCheck(func(t *rapid.T) {
		b := rapid.Bool().Draw(t, "b")
		v := crdt.Bool(b)
		if got, ok := v.AsBool(); !ok || got != b {
			t.Fatalf("AsBool() = %v, %v", got, ok)
		}
		roundTrip(t, v)
	}))
	t.Run("bytes", rapid.MakeCheck(func(t *rapid.T) {
		roundTrip(t, crdt.Bytes(rapid.SliceOfN(rapid.Byte(), 0, 100).Draw(t, "b")))
	}))
}

func TestFloatNaN(t *testing.T) {
	v := crdt.Float(math.NaN())
	if got := v.Text(); got != "NaN" {
		t.Fatalf("Text(NaN) = %q", got)
	}
	p, err := crdt.ParseValue(crdt.KindFloat, "NaN")
	if err != nil {
		t.Fatal(err)
	}
	if f, ok := p.AsFloat(); !ok || !math.IsNaN(f) {
		t.Fatalf("ParseValue(float, NaN) = %v, %v", f, ok)
	}
}

func TestValueValidateAndAccessors(t *testing.T) {
	valid := []crdt.Value{
		crdt.String(""), crdt.String("ü"), crdt.Int(-1), crdt.Float(-0.5), crdt.Bool(false), crdt.Bool(true),
		crdt.Bytes(nil), crdt.Bytes([]byte{0xff}),
		{Kind: crdt.KindBytes, Data: []byte("\xff not utf-8 is fine for bytes")},
	}
	for _, v := range valid {
		if err := v.Validate(); err != nil {
			t.Errorf("Validate(%v %x) = %v", v.Kind, v.Data, err)
		}
	}
	invalid := []crdt.Value{
		{},
		{Kind: crdt.KindString, Data: []byte{0xc0, 0x80}}, // overlong NUL
		{Kind: crdt.KindInt, Data: make([]byte, 4)},
		{Kind: crdt.KindFloat, Data: make([]byte, 16)},
		{Kind: crdt.KindBool, Data: []byte{2}},
		{Kind: crdt.KindBool, Data: nil},
		{Kind: 6},
	}
	for _, v := range invalid {
		if err := v.Validate(); err == nil {
			t.Errorf("Validate(%v %x) = nil, want error", v.Kind, v.Data)
		}
	}

	if s, ok := crdt.String("x").AsString(); !ok || s != "x" {
		t.Errorf("AsString = %q, %v", s, ok)
	}
	if _, ok := crdt.Bytes([]byte("x")).AsString(); ok {
		t.Errorf("AsString ok on bytes")
	}
	if _, ok := crdt.Float(1).AsInt(); ok {
		t.Errorf("AsInt ok on float")
	}
	if _, ok := (crdt.Value{Kind: crdt.KindInt, Data: []byte{1}}).AsInt(); ok {
		t.Errorf("AsInt ok on a short int")
	}
	if _, ok := crdt.Int(1).AsFloat(); ok {
		t.Errorf("AsFloat ok on int")
	}
	if _, ok := crdt.Int(1).AsBool(); ok {
		t.Errorf("AsBool ok on int")
	}
	if got := (crdt.Value{}).Text(); got != "" {
		t.Errorf("Text(invalid) = %q", got)
	}
	// Float and Int share a byte form but are different values.
	if crdt.Int(0).Equal(crdt.Float(0)) {
		t.Errorf("Int(0) equals Float(0)")
	}
	if crdt.Float(0).Equal(crdt.Float(math.Copysign(0, -1))) {
		t.Errorf("+0 and -0 are the same value; they encode differently")
	}
	// Bytes copies its argument.
	src := []byte("abc")
	v := crdt.Bytes(src)
	src[0] = 'X'
	if !bytes.Equal(v.Data, []byte("abc")) {
		t.Errorf("Bytes aliases its argument")
	}
}
