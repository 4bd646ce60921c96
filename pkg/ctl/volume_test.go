package ctl

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	volv1 "github.com/shoal-dev/shoal/proto/shoal/vol/v1"
)

// TestRenderVolumeDigests checks that the table has a digest column only
// when the members have digests (volume inspect --digests).
func TestRenderVolumeDigests(t *testing.T) {
	v := &volv1.Volume{Name: "data", Replicas: 2, Health: "healthy", Leader: "n1", Members: []*volv1.Member{
		{Node: "n1", Replica: 1, Role: "leader", Applied: 7, Alive: true},
		{Node: "n2", Replica: 2, Role: "follower", Applied: 7, Alive: true},
	}}
	var buf bytes.Buffer
	a := &app{out: &buf}
	if err := a.renderVolume("table", v); err != nil {
		t.Fatal(err)
	}
	if out := buf.String(); strings.Contains(out, "DIGEST") || !strings.Contains(out, "ALIVE") {
		t.Fatalf("without digests:\n%s", out)
	}
	for _, m := range v.Members {
		m.Digest = strings.Repeat("ab", 32)
	}
	buf.Reset()
	if err := a.renderVolume("table", v); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if !strings.Contains(out, "DIGEST") || strings.Count(out, strings.Repeat("ab", 8)) != 2 || strings.Contains(out, strings.Repeat("ab", 9)) {
		t.Fatalf("with digests (16 hex digits each):\n%s", out)
	}
}

func TestUnreachableReplicasWarned(t *testing.T) {
	v := &volv1.Volume{Name: "data", Members: []*volv1.Member{
		{Node: "n1", Replica: 1, Role: "leader", Alive: true},
		{Node: "n2", Replica: 2, Role: "unreachable"},
		{Node: "n3", Replica: 3, Role: "follower", Alive: true},
	}}
	got := unreachableReplicas(v)
	if len(got) != 1 || !strings.Contains(got[0], "replica 2 on node n2") {
		t.Fatalf("warnings = %q", got)
	}
	v.Members[1].Alive = true
	if got := unreachableReplicas(v); len(got) != 0 {
		t.Fatalf("all alive: warnings = %q", got)
	}
}

// TestRenderVolumeHeldFiles checks that inspect names held open-unlinked
// files only when there are some, and that JSON always has the count.
func TestRenderVolumeHeldFiles(t *testing.T) {
	v := &volv1.Volume{Name: "data", Replicas: 1, UsedBytes: 10}
	var buf bytes.Buffer
	a := &app{out: &buf}
	if err := a.renderVolume("table", v); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "HELD") {
		t.Fatalf("no held files, yet:\n%s", buf.String())
	}
	v.HeldFiles, v.Level = 2, 2
	buf.Reset()
	if err := a.renderVolume("table", v); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "HELD OPEN") || !strings.Contains(buf.String(), "2 unlinked files still open") || !strings.Contains(buf.String(), "LEVEL      2") {
		t.Fatalf("two held files, level 2:\n%s", buf.String())
	}
	buf.Reset()
	if err := a.renderVolume("json", v); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), `"held_files": 2`) || !strings.Contains(buf.String(), `"level": 2`) {
		t.Fatalf("json:\n%s", buf.String())
	}
}

// TestRenderVolumeLevelHeldBack checks that inspect names the members
// whose vold holds a volume's level back, shows each member's vold level,
// and says nothing once the volume is at the highest level its members'
// volds let it reach.
func TestRenderVolumeLevelHeldBack(t *testing.T) {
	v := &volv1.Volume{Name: "data", Replicas: 3, Level: 1, Members: []*volv1.Member{
		{Node: "n1", Replica: 1, Role: "leader", VoldLevel: 2},
		{Node: "n2", Replica: 2, Role: "follower", VoldLevel: 2},
		{Node: "n3", Replica: 3, Role: "follower", VoldLevel: 1},
	}}
	var buf bytes.Buffer
	a := &app{out: &buf}
	render := func(format string) string {
		t.Helper()
		buf.Reset()
		if err := a.renderVolume(format, v); err != nil {
			t.Fatal(err)
		}
		return buf.String()
	}
	out := render("table")
	if !regexp.MustCompile(`(?m)^LEVEL +1 \(2 once every member's vold lets it: node n3's vold lets 1\)$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^NODE .* VOLD LEVEL$`).MatchString(out) || !regexp.MustCompile(`(?m)^n3 +3 +follower .* 1$`).MatchString(out) {
		t.Fatalf("n3's vold at level 1 holds the volume back:\n%s", out)
	}
	if out := render("json"); !strings.Contains(out, `"vold_level": 1`) || !strings.Contains(out, `"vold_level": 2`) {
		t.Fatalf("json:\n%s", out)
	}

	v.Members[2].VoldLevel = 0 // n3's vold does not answer
	if out := render("table"); !strings.Contains(out, "node n3's vold does not answer") || !regexp.MustCompile(`(?m)^n3 .* -$`).MatchString(out) {
		t.Fatalf("n3's vold silent:\n%s", out)
	}
	v.Members[2].VoldLevel = 2
	if out := render("table"); !strings.Contains(out, "(every member's vold lets 2: the leader raises it)") {
		t.Fatalf("every vold lets 2:\n%s", out)
	}
	v.Level = 2
	if out := render("table"); !regexp.MustCompile(`(?m)^LEVEL +2$`).MatchString(out) {
		t.Fatalf("raised:\n%s", out)
	}
	// A vold that reports no members' levels (an older one): no column.
	for _, m := range v.Members {
		m.VoldLevel = 0
	}
	if out := render("table"); strings.Contains(out, "VOLD LEVEL") || !regexp.MustCompile(`(?m)^LEVEL +2$`).MatchString(out) {
		t.Fatalf("no levels reported:\n%s", out)
	}
}

// TestScaleProgress checks when volume update stops waiting: the count
// reached, every member voting, the volume healthy.
func TestScaleProgress(t *testing.T) {
	m := func(node, role string) *volv1.Member { return &volv1.Member{Node: node, Role: role} }
	for _, tc := range []struct {
		v    *volv1.Volume
		line string
		done bool
	}{
		{&volv1.Volume{Name: "d", Health: "healthy", Members: []*volv1.Member{m("a", "leader")}}, "d: 1 of 3 replicas voting, healthy", false},
		{&volv1.Volume{Name: "d", Health: "degraded", Members: []*volv1.Member{m("a", "leader"), m("b", "joining"), m("c", "learner")}}, "d: 1 of 3 replicas voting, degraded (b joining, c learner)", false},
		{&volv1.Volume{Name: "d", Health: "degraded", Members: []*volv1.Member{m("a", "leader"), m("b", "follower"), m("c", "follower")}}, "d: 3 of 3 replicas voting, degraded", false},
		{&volv1.Volume{Name: "d", Health: "healthy", Members: []*volv1.Member{m("a", "leader"), m("b", "follower"), m("c", "follower")}}, "d: 3 of 3 replicas voting, healthy", true},
		// Shrinking: done once the members removed are gone.
		{&volv1.Volume{Name: "d", Health: "healthy", Members: []*volv1.Member{m("a", "leader"), m("b", "follower"), m("c", "follower")}}, "d: 3 of 2 replicas voting, healthy", false},
	} {
		want := 3
		if strings.Contains(tc.line, "of 2") {
			want = 2
		}
		line, done := scaleProgress(tc.v, want)
		if line != tc.line || done != tc.done {
			t.Errorf("got %q, %v; want %q, %v", line, done, tc.line, tc.done)
		}
	}
}
