package vold

import (
	"slices"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
)

func TestRaftNodeID(t *testing.T) {
	for _, tc := range []struct {
		id   string
		want raftgroup.NodeID
		ok   bool
	}{
		{"c905aab72d29", 0xc905aab72d29, true},
		{"0a", 0xa, true},
		{"ffffffffffffffff", 0xffffffffffffffff, true},
		{"", 0, false},
		{"0", 0, false},
		{"000000", 0, false},
		{"node1", 0, false},
		{"1ffffffffffffffff", 0, false},
	} {
		got, err := raftNodeID(tc.id)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("raftNodeID(%q) = %d, %v; want %d, ok=%v", tc.id, got, err, tc.want, tc.ok)
		}
		if err != nil && !errdefs.IsInvalidArgument(err) {
			t.Errorf("raftNodeID(%q): error %v is not INVALID_ARGUMENT", tc.id, err)
		}
	}
	names := newNodeNames()
	r, _ := names.add("0a1b")
	if got := names.name(r); got != "0a1b" {
		t.Errorf("name(%d) = %q, want the ID it was parsed from", r, got)
	}
	if got := names.name(0xbeef); got != "beef" {
		t.Errorf("name of an unseen node = %q, want hex", got)
	}
}

func TestValidateName(t *testing.T) {
	for _, ok := range []string{"a", "data", "web-1", "0", "a-b-c", "x123456789012345678901234567890123456789012345678901234567890ab"} {
		if err := validateName(ok); err != nil {
			t.Errorf("validateName(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "-a", "a-", "A", "a_b", "a.b", "a/b", "_system", "x1234567890123456789012345678901234567890123456789012345678901ab"} {
		if err := validateName(bad); err == nil || !errdefs.IsInvalidArgument(err) {
			t.Errorf("validateName(%q) = %v, want INVALID_ARGUMENT", bad, err)
		}
	}
}

func TestCheckSizeAndReplicas(t *testing.T) {
	if s, err := checkSize(0); err != nil || s != DefaultSizeBytes {
		t.Errorf("checkSize(0) = %d, %v", s, err)
	}
	if s, err := checkSize(64 << 20); err != nil || s != 64<<20 {
		t.Errorf("checkSize(64Mi) = %d, %v", s, err)
	}
	for _, bad := range []int64{-1, 1, 1<<20 - 1, 1<<40 + 1} {
		if _, err := checkSize(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("checkSize(%d) = %v, want INVALID_ARGUMENT", bad, err)
		}
	}
	if r, err := checkReplicas(0); err != nil || r != 3 {
		t.Errorf("checkReplicas(0) = %d, %v", r, err)
	}
	if r, err := checkReplicas(2); err != nil || r != 2 {
		t.Errorf("checkReplicas(2) = %d, %v", r, err)
	}
	for _, bad := range []int32{-1, 8} {
		if _, err := checkReplicas(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("checkReplicas(%d) = %v, want INVALID_ARGUMENT", bad, err)
		}
	}
}

func TestPlaceFewestHostedThenNodeID(t *testing.T) {
	cands := []candidate{{"d4", 0, unknownFree}, {"a1", 2, unknownFree}, {"c3", 0, unknownFree}, {"b2", 1, unknownFree}, {"e5", 2, unknownFree}}
	if got := place(cands, 3, nil, 0); !slices.Equal(got, []string{"c3", "d4", "b2"}) {
		t.Errorf("place 3 = %v", got)
	}
	if got := place(cands, 10, nil, 0); len(got) != 5 {
		t.Errorf("place more than there are = %v", got)
	}
	if got := place(cands, 2, map[string]bool{"c3": true}, 0); !slices.Equal(got, []string{"d4", "b2"}) {
		t.Errorf("place with exclusion = %v", got)
	}
	// The input order does not matter.
	rev := slices.Clone(cands)
	slices.Reverse(rev)
	if !slices.Equal(place(rev, 3, nil, 0), place(cands, 3, nil, 0)) {
		t.Errorf("placement depends on input order")
	}
	docs := []*volumeDoc{
		{SizeBytes: 1 << 20, Members: []docMember{{Node: "a1"}, {Node: "b2"}}},
		{SizeBytes: 4 << 20, Members: []docMember{{Node: "a1"}}},
	}
	h, b := hostedCounts(docs)
	if h["a1"] != 2 || h["b2"] != 1 || h["c3"] != 0 {
		t.Errorf("hostedCounts = %v", h)
	}
	if b["a1"] != 5<<20 || b["b2"] != 1<<20 {
		t.Errorf("hosted bytes = %v", b)
	}
}

func TestGroupIDKinds(t *testing.T) {
	for range 100 {
		v := newGroupID(false)
		if v == 0 || isSystemGroup(v) {
			t.Fatalf("volume group ID %x", uint64(v))
		}
		s := newGroupID(true)
		if !isSystemGroup(s) || int64(s) < 0 {
			t.Fatalf("system group ID %x", uint64(s))
		}
	}
}

func TestVolumeDocRoundTrip(t *testing.T) {
	d := &volumeDoc{Group: 42, Replicas: 3, SizeBytes: 1 << 30, Created: time.Unix(100, 0).UTC(), Members: []docMember{
		{Node: "a1", Replica: 1, Boot: true}, {Node: "b2", Replica: 2, Boot: true}, {Node: "c3", Replica: 4, Added: time.Unix(200, 0).UTC()},
	}}
	fields, err := encodeVolume(d)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeVolume(docWith(fields))
	if err != nil {
		t.Fatal(err)
	}
	if got.Group != 42 || len(got.Members) != 3 || !got.Members[2].Added.Equal(d.Members[2].Added) || got.maxReplica() != 4 {
		t.Fatalf("round trip: %+v", got)
	}
	names := newNodeNames()
	boot, err := got.bootMembers(names)
	if err != nil || len(boot) != 2 || boot[1].Node != 0xb2 || boot[1].Replica != 2 {
		t.Fatalf("bootMembers = %v, %v", boot, err)
	}
}

func TestPlaceOnlyWhereItFits(t *testing.T) {
	cands := []candidate{{"a1", 0, 10 << 30}, {"b2", 0, 1 << 30}, {"c3", 3, 100 << 30}, {"d4", 1, unknownFree}}
	if got := place(cands, 3, nil, 5<<30); !slices.Equal(got, []string{"a1", "d4", "c3"}) {
		t.Errorf("place 5 GiB = %v", got)
	}
	if got := place(cands, 3, nil, 50<<30); !slices.Equal(got, []string{"d4", "c3"}) {
		t.Errorf("place 50 GiB = %v", got)
	}
	if node, most := largestFree(cands[:3]); node != "c3" || most != 100<<30 {
		t.Errorf("largestFree = %s %d", node, most)
	}
	if got := humanBytes(3 << 30); got != "3.0 GiB" {
		t.Errorf("humanBytes = %q", got)
	}
}

func TestPlaceAnsweringPassesOverSilentVolds(t *testing.T) {
	cands := []candidate{{"a1", 0, unknownFree}, {"b2", 0, unknownFree}, {"c3", 1, unknownFree}, {"d4", 2, unknownFree}, {"e5", 3, unknownFree}}
	down := map[string]bool{"a1": true, "d4": true}
	var asked [][]string
	answers := func(ids []string) map[string]bool {
		asked = append(asked, slices.Clone(ids))
		out := map[string]bool{}
		for _, id := range ids {
			out[id] = !down[id]
		}
		return out
	}
	picked, silent := placeAnswering(cands, 3, nil, 0, answers, false)
	if !slices.Equal(picked, []string{"b2", "c3", "e5"}) || !slices.Equal(silent, []string{"a1", "d4"}) {
		t.Errorf("placeAnswering = %v (silent %v)", picked, silent)
	}
	// Asked in batches of what is still missing, each node once.
	if want := [][]string{{"a1", "b2", "c3"}, {"d4"}, {"e5"}}; !slices.EqualFunc(asked, want, slices.Equal) {
		t.Errorf("asked %v, want %v", asked, want)
	}

	// Not enough answering nodes: strict placement comes up short, with
	// fallback the silent nodes fill the gap in placement order.
	few := cands[:4]
	if picked, _ := placeAnswering(few, 3, nil, 0, answers, false); !slices.Equal(picked, []string{"b2", "c3"}) {
		t.Errorf("strict = %v", picked)
	}
	if picked, _ := placeAnswering(few, 3, nil, 0, answers, true); !slices.Equal(picked, []string{"b2", "c3", "a1"}) {
		t.Errorf("fallback = %v", picked)
	}
	// Exclusions and room still apply, and the caller's map is untouched.
	ex := map[string]bool{"b2": true}
	if picked, _ := placeAnswering(cands, 1, ex, 0, answers, false); !slices.Equal(picked, []string{"c3"}) || len(ex) != 1 {
		t.Errorf("with exclusion = %v, exclude now %v", picked, ex)
	}
	tight := []candidate{{"a1", 0, 10}, {"b2", 0, 1}, {"c3", 0, 10}}
	if picked, _ := placeAnswering(tight, 2, nil, 5, answers, true); !slices.Equal(picked, []string{"c3", "a1"}) {
		t.Errorf("with size = %v", picked)
	}
	// Everyone answering: the same choice as place.
	all := func(ids []string) map[string]bool {
		out := map[string]bool{}
		for _, id := range ids {
			out[id] = true
		}
		return out
	}
	if picked, _ := placeAnswering(cands, 3, nil, 0, all, false); !slices.Equal(picked, place(cands, 3, nil, 0)) {
		t.Errorf("all answering = %v, place = %v", picked, place(cands, 3, nil, 0))
	}
}
