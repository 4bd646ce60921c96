package vold

import (
	"slices"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

// TestRemoveOrder checks which voters a shrink removes first: those down,
// then the newest replicas, and never the leader.
func TestRemoveOrder(t *testing.T) {
	voters := []raftgroup.Member{{Replica: 1, Node: 10}, {Replica: 2, Node: 20}, {Replica: 4, Node: 40}, {Replica: 5, Node: 50}, {Replica: 7, Node: 70}}
	ids := func(ms []raftgroup.Member) []raftgroup.ReplicaID {
		var out []raftgroup.ReplicaID
		for _, m := range ms {
			out = append(out, m.Replica)
		}
		return out
	}
	none := func(raftgroup.Member) bool { return false }
	if got := ids(removeOrder(voters, 7, none)); !slices.Equal(got, []raftgroup.ReplicaID{5, 4, 2, 1}) {
		t.Errorf("leader 7, none down: %v, want 5 4 2 1", got)
	}
	down := func(m raftgroup.Member) bool { return m.Node == 20 || m.Node == 70 }
	if got := ids(removeOrder(voters, 7, down)); !slices.Equal(got, []raftgroup.ReplicaID{2, 5, 4, 1}) {
		t.Errorf("leader 7 (down), 2 down: %v, want 2 5 4 1", got)
	}
	if got := ids(removeOrder(voters, 1, down)); !slices.Equal(got, []raftgroup.ReplicaID{7, 2, 5, 4}) {
		t.Errorf("leader 1, 2 and 7 down: %v, want 7 2 5 4", got)
	}
	if got := ids(removeOrder(voters[:1], 1, none)); len(got) != 0 {
		t.Errorf("a lone leader: %v, want none", got)
	}
	if voters[0].Replica != 1 || voters[4].Replica != 7 {
		t.Errorf("removeOrder reordered its argument: %v", voters)
	}
}

// TestMembersForLearners checks that the document's members follow the
// group's voters and learners, learners marked, and that members added
// for a change not made yet stay pending.
func TestMembersForLearners(t *testing.T) {
	n := &node{names: newNodeNames()}
	a, b, c, d := "0000000000aa", "0000000000bb", "0000000000cc", "0000000000dd"
	id := func(s string) raftgroup.NodeID {
		r, err := n.names.add(s)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	added := time.Now().UTC()
	doc := []docMember{
		{Node: a, Replica: 1, Boot: true},
		{Node: b, Replica: 2, Added: added, Learner: true},
		{Node: c, Replica: 3, Added: added, Learner: true},
	}
	voters := []raftgroup.Member{{Replica: 1, Node: id(a)}}
	learners := []raftgroup.Member{{Replica: 2, Node: id(b)}}
	// Replica 3 is not in the group yet (its change comes next): pending.
	got := n.membersFor(doc, voters, learners, 2)
	if !slices.Equal(got, doc) {
		t.Fatalf("learner 2, pending 3: %+v, want %+v", got, doc)
	}
	// 2 promoted, 3 a learner now.
	got = n.membersFor(doc, []raftgroup.Member{voters[0], {Replica: 2, Node: id(b)}}, []raftgroup.Member{{Replica: 3, Node: id(c)}}, 3)
	want := []docMember{doc[0], {Node: b, Replica: 2, Added: added}, doc[2]}
	if !slices.Equal(got, want) {
		t.Fatalf("2 promoted: %+v, want %+v", got, want)
	}
	// 3 removed (no longer wanted): it goes, as does a replica the
	// document never had that the group has (d, added to the document).
	got = n.membersFor(want, []raftgroup.Member{voters[0], {Replica: 2, Node: id(b)}, {Replica: 4, Node: id(d)}}, nil, 4)
	if len(got) != 3 || got[2].Node != d || got[2].Replica != 4 || got[2].Learner || slices.ContainsFunc(got, func(m docMember) bool { return m.Replica == 3 }) {
		t.Fatalf("3 removed, 4 a voter: %+v", got)
	}
}

// TestScaling checks which documents ask their leader for a step.
func TestScaling(t *testing.T) {
	three := []docMember{{Node: "a", Replica: 1}, {Node: "b", Replica: 2}, {Node: "c", Replica: 3}}
	for _, tc := range []struct {
		d    volumeDoc
		want bool
	}{
		{volumeDoc{Replicas: 3, Members: three}, false},
		{volumeDoc{Replicas: 1, Members: three}, true},
		{volumeDoc{Replicas: 5, Members: three}, true},
		{volumeDoc{Replicas: 3, Members: []docMember{three[0], three[1], {Node: "c", Replica: 3, Learner: true}}}, true},
		{volumeDoc{Replicas: 0, Members: three}, false}, // no count: nothing to do
	} {
		if got := tc.d.scaling(); got != tc.want {
			t.Errorf("%+v: scaling %v, want %v", tc.d, got, tc.want)
		}
	}
}

// TestSettingsOverrideTheDescription checks that UpdateVolume's fields
// win over the description's values, only for the group they name, and
// that the cache of decoded documents sees them change.
func TestSettingsOverrideTheDescription(t *testing.T) {
	fields, err := encodeVolume(&volumeDoc{Group: 7, Replicas: 3, SizeBytes: 1 << 30, Members: []docMember{{Node: "a", Replica: 1, Boot: true}}})
	if err != nil {
		t.Fatal(err)
	}
	fields[fieldReplicasSet] = settingField(7, 5)
	fields[fieldSizeSet] = settingField(8, 2<<30) // a removed volume's
	doc := &statev1.Document{Key: volumeKey("data"), Fields: fields}
	var c docCache
	d, err := c.decode(doc)
	if err != nil || d.Replicas != 5 || d.SizeBytes != 1<<30 {
		t.Fatalf("decoded %+v, %v: want 5 replicas (set) and 1 GiB (the other group's setting ignored)", d, err)
	}
	fields[fieldReplicasSet] = settingField(7, 1)
	fields[fieldSizeSet] = settingField(7, 64<<20)
	if d, err = c.decode(doc); err != nil || d.Replicas != 1 || d.SizeBytes != 64<<20 {
		t.Fatalf("after new settings: %+v, %v: want 1 replica and 64 MiB", d, err)
	}
	fields[fieldReplicasSet] = &statev1.Value{Kind: &statev1.Value_StringValue{StringValue: "not json"}}
	if d, err = c.decode(doc); err != nil || d.Replicas != 3 {
		t.Fatalf("a setting that does not parse: %+v, %v: want the description's 3", d, err)
	}
}

// TestLearnerStep checks what a leader does with learners: promote those
// that follow the log and hold the round before's commit, up to the count
// wanted; remove those whose node is down and those no longer wanted;
// leave the others to catch up.
func TestLearnerStep(t *testing.T) {
	l2, l3, l4 := raftgroup.Member{Replica: 2, Node: 20}, raftgroup.Member{Replica: 3, Node: 30}, raftgroup.Member{Replica: 4, Node: 40}
	// The learners below that follow hold the mark the step is given.
	const mark = 500
	following := raftgroup.ReplicaProgress{State: "StateReplicate", Match: mark}
	snapshotting := raftgroup.ReplicaProgress{State: "StateSnapshot"}
	none := func(raftgroup.Member) bool { return false }
	type step struct{ promoted, removed []raftgroup.ReplicaID }
	run := func(voters, want int, learners []raftgroup.Member, progress map[raftgroup.ReplicaID]raftgroup.ReplicaProgress, mark uint64, down, quiet func(raftgroup.Member) bool) step {
		changes, promoted, removed := learnerStep(voters, want, learners, progress, mark, down, func(m raftgroup.Member) bool { return !down(m) && !quiet(m) })
		var s step
		for _, m := range promoted {
			s.promoted = append(s.promoted, m.Replica)
		}
		for _, m := range removed {
			s.removed = append(s.removed, m.Replica)
		}
		if len(changes) != len(promoted)+len(removed) {
			t.Errorf("%d changes for %d promoted and %d removed", len(changes), len(promoted), len(removed))
		}
		for _, c := range changes {
			if c.Type == raftgroup.AddVoter && c.Node == 0 {
				t.Errorf("a promotion without the learner's node: %+v", c)
			}
		}
		return s
	}
	for _, tc := range []struct {
		name          string
		voters, want  int
		learners      []raftgroup.Member
		progress      map[raftgroup.ReplicaID]raftgroup.ReplicaProgress
		down          func(raftgroup.Member) bool
		promoted, out []raftgroup.ReplicaID
		quiet         func(raftgroup.Member) bool
	}{
		{"both follow: both vote", 1, 3, []raftgroup.Member{l2, l3}, map[raftgroup.ReplicaID]raftgroup.ReplicaProgress{2: following, 3: following}, none, []raftgroup.ReplicaID{2, 3}, nil, nil},
		{"one still takes its snapshot", 1, 3, []raftgroup.Member{l2, l3}, map[raftgroup.ReplicaID]raftgroup.ReplicaProgress{2: snapshotting, 3: following}, none, []raftgroup.ReplicaID{3}, nil, nil},
		{"a learner's node died", 1, 3, []raftgroup.Member{l2, l3}, map[raftgroup.ReplicaID]raftgroup.ReplicaProgress{2: following, 3: snapshotting}, func(m raftgroup.Member) bool { return m.Node == 30 }, []raftgroup.ReplicaID{2}, []raftgroup.ReplicaID{3}, nil},
		{"fewer wanted since: the rest go", 2, 3, []raftgroup.Member{l2, l3, l4}, map[raftgroup.ReplicaID]raftgroup.ReplicaProgress{2: following, 3: following, 4: following}, none, []raftgroup.ReplicaID{2}, []raftgroup.ReplicaID{3, 4}, nil},
		{"a shrink below the voters: every learner goes", 3, 1, []raftgroup.Member{l2}, map[raftgroup.ReplicaID]raftgroup.ReplicaProgress{2: following}, none, nil, []raftgroup.ReplicaID{2}, nil},
		{"unknown progress (a new leader's): wait", 1, 2, []raftgroup.Member{l2}, nil, none, nil, nil, nil},
		// Promoted, it would make two voters with one silent: no quorum.
		{"a learner silent, not dead yet: wait", 1, 2, []raftgroup.Member{l2}, map[raftgroup.ReplicaID]raftgroup.ReplicaProgress{2: following}, none, nil, nil, func(m raftgroup.Member) bool { return m.Node == 20 }},
	} {
		quiet := tc.quiet
		if quiet == nil {
			quiet = none
		}
		got := run(tc.voters, tc.want, tc.learners, tc.progress, mark, tc.down, quiet)
		if !slices.Equal(got.promoted, tc.promoted) || !slices.Equal(got.removed, tc.out) {
			t.Errorf("%s: promoted %v, removed %v; want %v, %v", tc.name, got.promoted, got.removed, tc.promoted, tc.out)
		}
	}
	// How far a learner that follows the log has come: it votes only once
	// it holds the mark, the commit index of the leader's round before.
	behind := raftgroup.ReplicaProgress{State: "StateReplicate", Match: mark - 1}
	ahead := raftgroup.ReplicaProgress{State: "StateReplicate", Match: mark + 40}
	for _, tc := range []struct {
		name     string
		progress map[raftgroup.ReplicaID]raftgroup.ReplicaProgress
		mark     uint64
		promoted []raftgroup.ReplicaID
	}{
		{"past its snapshot, still behind the mark: wait", map[raftgroup.ReplicaID]raftgroup.ReplicaProgress{2: behind, 3: following}, mark, []raftgroup.ReplicaID{3}},
		{"past the mark (writes went on since): vote", map[raftgroup.ReplicaID]raftgroup.ReplicaProgress{2: ahead, 3: following}, mark, []raftgroup.ReplicaID{2, 3}},
		{"no mark yet (the leader's first round with them): wait", map[raftgroup.ReplicaID]raftgroup.ReplicaProgress{2: ahead, 3: following}, 0, nil},
	} {
		got := run(1, 3, []raftgroup.Member{l2, l3}, tc.progress, tc.mark, none, none)
		if !slices.Equal(got.promoted, tc.promoted) || got.removed != nil {
			t.Errorf("%s: promoted %v, removed %v; want %v promoted", tc.name, got.promoted, got.removed, tc.promoted)
		}
	}
}

// TestShrinkStep checks that a shrink removes the voters that do not
// answer first, and removes none when those left would lack a quorum that
// answers. The first case is what an e2e run met: a voter whose node had
// just died, which statd did not call dead yet, and the newest replica
// removed instead left the group without a quorum.
func TestShrinkStep(t *testing.T) {
	three := []raftgroup.Member{{Replica: 1, Node: 10}, {Replica: 2, Node: 20}, {Replica: 3, Node: 30}}
	five := []raftgroup.Member{{Replica: 1, Node: 10}, {Replica: 2, Node: 20}, {Replica: 3, Node: 30}, {Replica: 4, Node: 40}, {Replica: 5, Node: 50}}
	silent := func(nodes ...raftgroup.NodeID) func(raftgroup.Member) bool {
		return func(m raftgroup.Member) bool { return !slices.Contains(nodes, m.Node) }
	}
	for _, tc := range []struct {
		name    string
		voters  []raftgroup.Member
		leader  raftgroup.ReplicaID
		want    int
		answers func(raftgroup.Member) bool
		victims []raftgroup.ReplicaID
		ok      bool
	}{
		{"the voter that does not answer goes", three, 2, 2, silent(10), []raftgroup.ReplicaID{1}, true},
		{"all answer: the newest goes", three, 2, 2, silent(), []raftgroup.ReplicaID{3}, true},
		{"two silent, one to go: no quorum left", three, 2, 2, silent(10, 30), []raftgroup.ReplicaID{3}, false},
		{"two silent, both go", three, 2, 1, silent(10, 30), []raftgroup.ReplicaID{3, 1}, true},
		{"five to three, the silent two go", five, 1, 3, silent(40, 50), []raftgroup.ReplicaID{5, 4}, true},
		{"five to four with two silent: a quorum of four answers", five, 1, 4, silent(20, 30), []raftgroup.ReplicaID{3}, true},
	} {
		victims, ok := shrinkStep(tc.voters, tc.leader, tc.want, tc.answers)
		var got []raftgroup.ReplicaID
		for _, v := range victims {
			got = append(got, v.Replica)
		}
		if !slices.Equal(got, tc.victims) || ok != tc.ok {
			t.Errorf("%s: victims %v, ok %v; want %v, %v", tc.name, got, ok, tc.victims, tc.ok)
		}
	}
}
