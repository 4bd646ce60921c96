package crdt_test

import (
	"crypto/sha256"
	"testing"

	"github.com/shoal-dev/shoal/pkg/crdt"
)

// permutations returns every ordering of ops (n is small in the tables).
func permutations(ops []crdt.Doc) [][]crdt.Doc {
	if len(ops) <= 1 {
		return [][]crdt.Doc{append([]crdt.Doc(nil), ops...)}
	}
	var out [][]crdt.Doc
	for i := range ops {
		rest := make([]crdt.Doc, 0, len(ops)-1)
		rest = append(rest, ops[:i]...)
		rest = append(rest, ops[i+1:]...)
		for _, p := range permutations(rest) {
			out = append(out, append([]crdt.Doc{ops[i]}, p...))
		}
	}
	return out
}

func TestLWWSemantics(t *testing.T) {
	s10 := st(10, 0, "n1")
	cases := []struct {
		name      string
		ops       []crdt.Doc
		want      crdt.Doc // exact merged document
		wantLive  map[string]crdt.Value
		wantStamp crdt.Stamp // MaxStamp
	}{
		{
			name: "later wall wins",
			ops: []crdt.Doc{
				crdt.Set(map[string]crdt.Value{"a": crdt.Int(1)}, st(10, 0, "n1")),
				crdt.Set(map[string]crdt.Value{"a": crdt.Int(2)}, st(11, 0, "n1")),
			},
			want:      crdt.Doc{Fields: map[string]crdt.Field{"a": f2(crdt.Int(2), st(11, 0, "n1"))}},
			wantLive:  map[string]crdt.Value{"a": crdt.Int(2)},
			wantStamp: st(11, 0, "n1"),
		},
		{
			name: "later logical wins, regardless of node",
			ops: []crdt.Doc{
				crdt.Set(map[string]crdt.Value{"a": crdt.Int(1)}, st(10, 1, "a")),
				crdt.Set(map[string]crdt.Value{"a": crdt.Int(2)}, st(10, 0, "z")),
			},
			want:      crdt.Doc{Fields: map[string]crdt.Field{"a": f2(crdt.Int(1), st(10, 1, "a"))}},
			wantLive:  map[string]crdt.Value{"a": crdt.Int(1)},
			wantStamp: st(10, 1, "a"),
		},
		{
			name: "node ID breaks a timestamp tie (bytewise: n9 > n10)",
			ops: []crdt.Doc{
				crdt.Set(map[string]crdt.Value{"a": crdt.String("from n10")}, st(10, 0, "n10")),
				crdt.Set(map[string]crdt.Value{"a": crdt.String("from n9")}, st(10, 0, "n9")),
				crdt.Set(map[string]crdt.Value{"a": crdt.String("from n1")}, st(10, 0, "n1")),
			},
			want:      crdt.Doc{Fields: map[string]crdt.Field{"a": f2(crdt.String("from n9"), st(10, 0, "n9"))}},
			wantLive:  map[string]crdt.Value{"a": crdt.String("from n9")},
			wantStamp: st(10, 0, "n9"),
		},
		{
			name: "concurrent writes to different fields both survive",
			ops: []crdt.Doc{
				crdt.Set(map[string]crdt.Value{"image": crdt.String("nginx")}, st(10, 0, "n1")),
				crdt.Set(map[string]crdt.Value{"replicas": crdt.Int(3)}, st(10, 0, "n2")),
			},
			want: crdt.Doc{Fields: map[string]crdt.Field{
				"image":    f2(crdt.String("nginx"), st(10, 0, "n1")),
				"replicas": f2(crdt.Int(3), st(10, 0, "n2")),
			}},
			wantLive:  map[string]crdt.Value{"image": crdt.String("nginx"), "replicas": crdt.Int(3)},
			wantStamp: st(10, 0, "n2"),
		},
		{
			name: "multi-field set is per field, not per write",
			ops: []crdt.Doc{
				crdt.Set(map[string]crdt.Value{"a": crdt.Int(1), "b": crdt.Int(1)}, st(10, 0, "n1")),
				crdt.Set(map[string]crdt.Value{"b": crdt.Int(2), "c": crdt.Int(2)}, st(9, 0, "n2")),
			},
			want: crdt.Doc{Fields: map[string]crdt.Field{
				"a": f2(crdt.Int(1), st(10, 0, "n1")),
				"b": f2(crdt.Int(1), st(10, 0, "n1")),
				"c": f2(crdt.Int(2), st(9, 0, "n2")),
			}},
			wantLive:  map[string]crdt.Value{"a": crdt.Int(1), "b": crdt.Int(1), "c": crdt.Int(2)},
			wantStamp: st(10, 0, "n1"),
		},
		{
			name: "field tombstone beats older set",
			ops: []crdt.Doc{
				crdt.Set(map[string]crdt.Value{"a": crdt.Int(1), "b": crdt.Int(1)}, st(10, 0, "n1")),
				crdt.DeleteFields([]string{"a"}, st(11, 0, "n2")),
			},
			want: crdt.Doc{Fields: map[string]crdt.Field{
				"a": tomb(st(11, 0, "n2")),
				"b": f2(crdt.Int(1), st(10, 0, "n1")),
			}},
			wantLive:  map[string]crdt.Value{"b": crdt.Int(1)},
			wantStamp: st(11, 0, "n2"),
		},
		{
			name: "field tombstone loses to newer set",
			ops: []crdt.Doc{
				crdt.Set(map[string]crdt.Value{"a": crdt.Int(1)}, st(10, 0, "n1")),
				crdt.DeleteFields([]string{"a"}, st(11, 0, "n2")),
				crdt.Set(map[string]crdt.Value{"a": crdt.Int(3)}, st(12, 0, "n1")),
			},
			want:      crdt.Doc{Fields: map[string]crdt.Field{"a": f2(crdt.Int(3), st(12, 0, "n1"))}},
			wantLive:  map[string]crdt.Value{"a": crdt.Int(3)},
			wantStamp: st(12, 0, "n1"),
		},
		{
			name: "field tombstone wins a node tie against a lower node's set",
			ops: []crdt.Doc{
				crdt.Set(map[string]crdt.Value{"a": crdt.Int(1)}, st(10, 0, "n1")),
				crdt.DeleteFields([]string{"a"}, st(10, 0, "n2")),
			},
			want:      crdt.Doc{Fields: map[string]crdt.Field{"a": tomb(st(10, 0, "n2"))}},
			wantLive:  map[string]crdt.Value{},
			wantStamp: st(10, 0, "n2"),
		},
		{
			name: "deleting a never-written field leaves a tombstone",
			ops: []crdt.Doc{
				crdt.DeleteFields([]string{"ghost"}, s10),
				crdt.Set(map[string]crdt.Value{"ghost": crdt.Int(1)}, st(9, 0, "n9")),
			},
			want:      crdt.Doc{Fields: map[string]crdt.Field{"ghost": tomb(s10)}},
			wantLive:  map[string]crdt.Value{},
			wantStamp: s10,
		},
		{
			name: "document delete hides fields written before it",
			ops: []crdt.Doc{
				crdt.Set(map[string]crdt.Value{"a": crdt.Int(1)}, st(10, 0, "n1")),
				crdt.DeleteFields([]string{"b"}, st(10, 5, "n1")),
				crdt.DeleteDoc(st(11, 0, "n2")),
			},
			want:      crdt.Doc{Deleted: st(11, 0, "n2"), Fields: map[string]crdt.Field{}},
			wantLive:  map[string]crdt.Value{},
			wantStamp: st(11, 0, "n2"),
		},
		{
			name: "document delete hides a field written at its stamp",
			ops: []crdt.Doc{
				crdt.Set(map[string]crdt.Value{"a": crdt.Int(1)}, s10),
				crdt.DeleteDoc(s10),
			},
			want:      crdt.Doc{Deleted: s10},
			wantLive:  map[string]crdt.Value{},
			wantStamp: s10,
		},
		{
			name: "document delete vs set at the same timestamp: node decides",
			ops: []crdt.Doc{
				crdt.Set(map[string]crdt.Value{"lo": crdt.Int(1)}, st(10, 0, "n1")),
				crdt.Set(map[string]crdt.Value{"hi": crdt.Int(2)}, st(10, 0, "n3")),
				crdt.DeleteDoc(st(10, 0, "n2")),
			},
			want: crdt.Doc{Deleted: st(10, 0, "n2"), Fields: map[string]crdt.Field{
				"hi": f2(crdt.Int(2), st(10, 0, "n3")),
			}},
			wantLive:  map[string]crdt.Value{"hi": crdt.Int(2)},
			wantStamp: st(10, 0, "n3"),
		},
		{
			name: "document delete does not hide later writes",
			ops: []crdt.Doc{
				crdt.Set(map[string]crdt.Value{"old": crdt.Int(1)}, st(10, 0, "n1")),
				crdt.DeleteDoc(st(11, 0, "n1")),
				crdt.Set(map[string]crdt.Value{"new": crdt.Int(2)}, st(11, 1, "n1")),
			},
			want: crdt.Doc{Deleted: st(11, 0, "n1"), Fields: map[string]crdt.Field{
				"new": f2(crdt.Int(2), st(11, 1, "n1")),
			}},
			wantLive:  map[string]crdt.Value{"new": crdt.Int(2)},
			wantStamp: st(11, 1, "n1"),
		},
		{
			name: "a later document delete supersedes an earlier one",
			ops: []crdt.Doc{
				crdt.DeleteDoc(st(9, 0, "n1")),
				crdt.Set(map[string]crdt.Value{"a": crdt.Int(1)}, st(10, 0, "n1")),
				crdt.DeleteDoc(st(12, 0, "n2")),
				crdt.Set(map[string]crdt.Value{"b": crdt.Int(2)}, st(11, 0, "n1")),
			},
			want:      crdt.Doc{Deleted: st(12, 0, "n2")},
			wantLive:  map[string]crdt.Value{},
			wantStamp: st(12, 0, "n2"),
		},
		{
			name: "field tombstone after a document delete survives it",
			ops: []crdt.Doc{
				crdt.DeleteDoc(st(10, 0, "n1")),
				crdt.DeleteFields([]string{"a"}, st(11, 0, "n1")),
				crdt.Set(map[string]crdt.Value{"a": crdt.Int(1)}, st(10, 1, "n2")),
			},
			want:      crdt.Doc{Deleted: st(10, 0, "n1"), Fields: map[string]crdt.Field{"a": tomb(st(11, 0, "n1"))}},
			wantLive:  map[string]crdt.Value{},
			wantStamp: st(11, 0, "n1"),
		},
		{
			name: "same stamp, set vs tombstone: the tombstone wins",
			ops: []crdt.Doc{
				crdt.Set(map[string]crdt.Value{"a": crdt.Int(1)}, s10),
				crdt.DeleteFields([]string{"a"}, s10),
			},
			want:      crdt.Doc{Fields: map[string]crdt.Field{"a": tomb(s10)}},
			wantLive:  map[string]crdt.Value{},
			wantStamp: s10,
		},
		{
			name: "same stamp, different values: decided by kind then bytes",
			ops: []crdt.Doc{
				crdt.Set(map[string]crdt.Value{"a": crdt.Int(1), "b": crdt.String("zzz")}, s10),
				crdt.Set(map[string]crdt.Value{"a": crdt.Int(2), "b": crdt.Int(0)}, s10),
				crdt.Set(map[string]crdt.Value{"a": crdt.Int(-1)}, s10), // 0xff... sorts last bytewise
			},
			want: crdt.Doc{Fields: map[string]crdt.Field{
				"a": f2(crdt.Int(-1), s10),
				"b": f2(crdt.Int(0), s10), // KindInt > KindString
			}},
			wantLive:  map[string]crdt.Value{"a": crdt.Int(-1), "b": crdt.Int(0)},
			wantStamp: s10,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, order := range permutations(c.ops) {
				var d crdt.Doc
				for _, op := range order {
					d = crdt.Merge(d, op)
				}
				mustEqualDocs(t, "merged history", d, c.want)
				if got := d.Live(); !liveEqual(got, c.wantLive) {
					t.Fatalf("Live() = %v, want %v (doc %s)", got, c.wantLive, dump(d))
				}
				if got, want := d.Exists(), len(c.wantLive) > 0; got != want {
					t.Fatalf("Exists() = %v, want %v (doc %s)", got, want, dump(d))
				}
				if got := d.MaxStamp(); got != c.wantStamp {
					t.Fatalf("MaxStamp() = %v, want %v", got, c.wantStamp)
				}
				for _, op := range c.ops {
					if !crdt.Dominates(d, op) {
						t.Fatalf("result %s does not dominate op %s", dump(d), dump(op))
					}
				}
			}
		})
	}
}

func TestConstructors(t *testing.T) {
	s := st(5, 1, "n")
	in := map[string]crdt.Value{"a": crdt.Int(1), "b": crdt.String("x")}
	d := crdt.Set(in, s)
	in["a"] = crdt.Int(99) // the delta must not share the caller's map
	in["c"] = crdt.Bool(true)
	mustEqualDocs(t, "Set", d, crdt.Doc{Fields: map[string]crdt.Field{
		"a": f2(crdt.Int(1), s),
		"b": f2(crdt.String("x"), s),
	}})
	if !d.Deleted.IsZero() {
		t.Fatalf("Set delta has a document tombstone")
	}

	names := []string{"a", "b"}
	del := crdt.DeleteFields(names, s)
	names[0] = "zzz"
	mustEqualDocs(t, "DeleteFields", del, crdt.Doc{Fields: map[string]crdt.Field{"a": tomb(s), "b": tomb(s)}})

	mustEqualDocs(t, "DeleteDoc", crdt.DeleteDoc(s), crdt.Doc{Deleted: s})
	if crdt.DeleteDoc(s).IsEmpty() {
		t.Fatalf("DeleteDoc delta IsEmpty")
	}
	if !crdt.Set(nil, s).IsEmpty() || !crdt.DeleteFields(nil, s).IsEmpty() {
		t.Fatalf("empty Set/DeleteFields deltas are not empty")
	}
}

func TestLiveExistsMaxStamp(t *testing.T) {
	var zero crdt.Doc
	if !zero.IsEmpty() || zero.Exists() || len(zero.Live()) != 0 || !zero.MaxStamp().IsZero() {
		t.Fatalf("zero doc: IsEmpty=%v Exists=%v Live=%v MaxStamp=%v", zero.IsEmpty(), zero.Exists(), zero.Live(), zero.MaxStamp())
	}
	if zero.Live() == nil {
		t.Errorf("Live() of the zero doc is nil; want an empty, writable map")
	}

	// A hand-built, non-normalized document: Live and Exists must still
	// hide what the document tombstone covers.
	d := crdt.Doc{
		Deleted: st(10, 0, "n"),
		Fields: map[string]crdt.Field{
			"hidden":  f2(crdt.Int(1), st(9, 0, "n")),
			"at":      f2(crdt.Int(2), st(10, 0, "n")),
			"dead":    tomb(st(20, 0, "n")),
			"visible": f2(crdt.Int(3), st(11, 0, "n")),
		},
	}
	if got, want := d.Live(), map[string]crdt.Value{"visible": crdt.Int(3)}; !liveEqual(got, want) {
		t.Fatalf("Live() = %v, want %v", got, want)
	}
	if !d.Exists() {
		t.Fatalf("Exists() = false with a visible field")
	}
	if got, want := d.MaxStamp(), st(20, 0, "n"); got != want {
		t.Fatalf("MaxStamp() = %v, want %v (tombstones count)", got, want)
	}
	live := d.Live()
	live["visible"] = crdt.Int(100)
	delete(live, "visible")
	if got := d.Fields["visible"].Value; !got.Equal(crdt.Int(3)) {
		t.Fatalf("mutating Live() result changed the doc")
	}

	// Only hidden fields (non-normalized): nothing exists.
	hiddenOnly := crdt.Doc{Deleted: st(10, 0, "n"), Fields: map[string]crdt.Field{
		"old": f2(crdt.Int(1), st(9, 0, "n")),
		"at":  f2(crdt.Int(2), st(10, 0, "n")),
	}}
	if hiddenOnly.Exists() || len(hiddenOnly.Live()) != 0 {
		t.Fatalf("doc with only hidden fields: Exists=%v Live=%v", hiddenOnly.Exists(), hiddenOnly.Live())
	}

	only := crdt.Doc{Fields: map[string]crdt.Field{"x": tomb(st(1, 0, "n"))}}
	if only.Exists() || len(only.Live()) != 0 || only.IsEmpty() {
		t.Fatalf("tombstone-only doc: Exists=%v Live=%v IsEmpty=%v", only.Exists(), only.Live(), only.IsEmpty())
	}

	dd := crdt.DeleteDoc(st(7, 0, "n"))
	if dd.Exists() || dd.IsEmpty() {
		t.Fatalf("deleted doc: Exists=%v IsEmpty=%v", dd.Exists(), dd.IsEmpty())
	}
	if got, want := dd.MaxStamp(), st(7, 0, "n"); got != want {
		t.Fatalf("MaxStamp() = %v, want document tombstone %v", got, want)
	}
	// Document tombstone later than every field.
	dd2 := crdt.Doc{Deleted: st(30, 0, "n"), Fields: map[string]crdt.Field{"a": f2(crdt.Int(1), st(31, 0, "a"))}}
	if got, want := dd2.MaxStamp(), st(31, 0, "a"); got != want {
		t.Fatalf("MaxStamp() = %v, want %v", got, want)
	}
	dd2.Fields["a"] = f2(crdt.Int(1), st(29, 0, "a"))
	if got, want := dd2.MaxStamp(), st(30, 0, "n"); got != want {
		t.Fatalf("MaxStamp() = %v, want %v", got, want)
	}
}

func TestStampCompare(t *testing.T) {
	cases := []struct {
		a, b crdt.Stamp
		want int
	}{
		{st(1, 0, "a"), st(1, 0, "a"), 0},
		{st(1, 0, "b"), st(1, 0, "a"), 1},
		{st(1, 0, "z"), st(2, 0, "a"), -1},
		{st(1, 1, "a"), st(1, 0, "z"), 1},
		{st(1, 0, ""), st(1, 0, "a"), -1},
		{crdt.Stamp{}, st(0, 0, "a"), -1},
	}
	for _, c := range cases {
		if got := c.a.Compare(c.b); got != c.want {
			t.Errorf("%v.Compare(%v) = %d, want %d", c.a, c.b, got, c.want)
		}
		if got := c.b.Compare(c.a); got != -c.want {
			t.Errorf("%v.Compare(%v) = %d, want %d", c.b, c.a, got, -c.want)
		}
	}
	if !(crdt.Stamp{}).IsZero() || st(0, 0, "a").IsZero() || st(1, 0, "").IsZero() {
		t.Errorf("IsZero wrong")
	}
}

func TestEqual(t *testing.T) {
	s := st(1, 0, "n")
	base := crdt.Doc{Deleted: st(0, 5, "n"), Fields: map[string]crdt.Field{"a": f2(crdt.Int(1), s)}}
	same := crdt.Doc{Deleted: st(0, 5, "n"), Fields: map[string]crdt.Field{"a": f2(crdt.Int(1), s)}}
	if !crdt.Equal(base, same) {
		t.Fatalf("identical docs not Equal")
	}
	if !crdt.Equal(crdt.Doc{}, crdt.Doc{Fields: map[string]crdt.Field{}}) {
		t.Fatalf("nil and empty Fields not Equal")
	}
	if !crdt.Equal(
		crdt.Doc{Fields: map[string]crdt.Field{"a": f2(crdt.Bytes(nil), s)}},
		crdt.Doc{Fields: map[string]crdt.Field{"a": f2(crdt.Bytes([]byte{}), s)}},
	) {
		t.Fatalf("nil and empty bytes values not Equal")
	}
	differ := map[string]crdt.Doc{
		"doc tombstone": {Deleted: st(0, 6, "n"), Fields: base.Fields},
		"no tombstone":  {Fields: base.Fields},
		"value":         {Deleted: base.Deleted, Fields: map[string]crdt.Field{"a": f2(crdt.Int(2), s)}},
		"kind":          {Deleted: base.Deleted, Fields: map[string]crdt.Field{"a": f2(crdt.Value{Kind: crdt.KindBytes, Data: crdt.Int(1).Data}, s)}},
		"stamp":         {Deleted: base.Deleted, Fields: map[string]crdt.Field{"a": f2(crdt.Int(1), st(1, 0, "m"))}},
		"deleted flag":  {Deleted: base.Deleted, Fields: map[string]crdt.Field{"a": {Value: crdt.Int(1), Stamp: s, Deleted: true}}},
		"name":          {Deleted: base.Deleted, Fields: map[string]crdt.Field{"b": f2(crdt.Int(1), s)}},
		"extra field":   {Deleted: base.Deleted, Fields: map[string]crdt.Field{"a": f2(crdt.Int(1), s), "b": f2(crdt.Int(1), s)}},
		"empty":         {},
	}
	for name, d := range differ {
		if crdt.Equal(base, d) || crdt.Equal(d, base) {
			t.Errorf("%s: Equal reports different docs equal", name)
		}
	}
}

func TestDominates(t *testing.T) {
	older := crdt.Set(map[string]crdt.Value{"a": crdt.Int(1)}, st(1, 0, "n"))
	newer := crdt.Set(map[string]crdt.Value{"a": crdt.Int(2)}, st(2, 0, "n"))
	other := crdt.Set(map[string]crdt.Value{"b": crdt.Int(1)}, st(1, 0, "n"))
	cases := []struct {
		name     string
		d, delta crdt.Doc
		want     bool
	}{
		{"empty dominates empty", crdt.Doc{}, crdt.Doc{}, true},
		{"anything dominates empty", newer, crdt.Doc{}, true},
		{"empty does not dominate a write", crdt.Doc{}, older, false},
		{"newer dominates older", newer, older, true},
		{"older does not dominate newer", older, newer, false},
		{"disjoint fields", older, other, false},
		{"self", newer, newer, true},
		{"doc delete dominates older write", crdt.DeleteDoc(st(5, 0, "n")), newer, true},
		{"write does not dominate doc delete", newer, crdt.DeleteDoc(st(5, 0, "n")), false},
		{"field tombstone dominates older write", crdt.DeleteFields([]string{"a"}, st(3, 0, "n")), newer, true},
	}
	for _, c := range cases {
		if got := crdt.Dominates(c.d, c.delta); got != c.want {
			t.Errorf("%s: Dominates(%s, %s) = %v, want %v", c.name, dump(c.d), dump(c.delta), got, c.want)
		}
	}
}

func TestMergeDoesNotShareOrMutate(t *testing.T) {
	a := crdt.Set(map[string]crdt.Value{"a": crdt.Int(1), "x": crdt.Int(1)}, st(1, 0, "n"))
	b := crdt.Merge(crdt.DeleteDoc(st(1, 5, "n")), crdt.Set(map[string]crdt.Value{"b": crdt.Int(2)}, st(2, 0, "n")))
	encA, encB := a.Marshal(), b.Marshal()
	m := crdt.Merge(a, b)
	if got, want := m.Live(), map[string]crdt.Value{"b": crdt.Int(2)}; !liveEqual(got, want) {
		t.Fatalf("Merge live = %v, want %v", got, want)
	}
	if string(a.Marshal()) != string(encA) || string(b.Marshal()) != string(encB) {
		t.Fatalf("Merge modified an argument")
	}
	m.Fields["new"] = f2(crdt.Int(3), st(9, 0, "n"))
	delete(m.Fields, "b")
	if string(a.Marshal()) != string(encA) || string(b.Marshal()) != string(encB) {
		t.Fatalf("result of Merge shares its Fields map with an argument")
	}
	// Merging with the zero doc must not alias either.
	m2 := crdt.Merge(a, crdt.Doc{})
	m2.Fields["new"] = f2(crdt.Int(3), st(9, 0, "n"))
	if _, ok := a.Fields["new"]; ok {
		t.Fatalf("Merge(a, zero) shares a's Fields map")
	}
}

func TestMergeNormalizesHiddenFields(t *testing.T) {
	// A non-normalized input (hand-built, not produced by this package).
	raw := crdt.Doc{
		Deleted: st(10, 0, "n"),
		Fields: map[string]crdt.Field{
			"old": f2(crdt.Int(1), st(9, 0, "n")),
			"at":  tomb(st(10, 0, "n")),
			"new": f2(crdt.Int(2), st(11, 0, "n")),
		},
	}
	want := crdt.Doc{Deleted: st(10, 0, "n"), Fields: map[string]crdt.Field{"new": f2(crdt.Int(2), st(11, 0, "n"))}}
	mustEqualDocs(t, "Merge(raw, zero)", crdt.Merge(raw, crdt.Doc{}), want)
	mustEqualDocs(t, "Merge(zero, raw)", crdt.Merge(crdt.Doc{}, raw), want)
	if _, err := crdt.Unmarshal(raw.Marshal()); err == nil {
		t.Fatalf("Unmarshal accepted a document with fields hidden by its tombstone")
	}
	if _, err := crdt.Unmarshal(crdt.Merge(raw, raw).Marshal()); err != nil {
		t.Fatalf("normalized document does not decode: %v", err)
	}
}

func TestDigest(t *testing.T) {
	a := crdt.Merge(
		crdt.Set(map[string]crdt.Value{"a": crdt.Int(1), "b": crdt.String("x")}, st(1, 0, "n1")),
		crdt.DeleteFields([]string{"c"}, st(2, 0, "n2")),
	)
	// Same content, built in a different order.
	b := crdt.Merge(
		crdt.DeleteFields([]string{"c"}, st(2, 0, "n2")),
		crdt.Merge(
			crdt.Set(map[string]crdt.Value{"b": crdt.String("x")}, st(1, 0, "n1")),
			crdt.Set(map[string]crdt.Value{"a": crdt.Int(1)}, st(1, 0, "n1")),
		),
	)
	if a.Digest() != b.Digest() {
		t.Fatalf("equal docs have different digests")
	}
	if got, want := a.Digest(), crdt.Digest(sha256.Sum256(a.Marshal())); got != want {
		t.Fatalf("Digest is not SHA-256 of Marshal")
	}
	c := crdt.Merge(a, crdt.Set(map[string]crdt.Value{"a": crdt.Int(2)}, st(3, 0, "n1")))
	if a.Digest() == c.Digest() {
		t.Fatalf("different docs share a digest")
	}
	if (crdt.Doc{}).Digest() == crdt.DeleteDoc(st(1, 0, "n")).Digest() {
		t.Fatalf("empty and deleted docs share a digest")
	}
}
