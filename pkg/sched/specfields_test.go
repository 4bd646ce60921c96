package sched_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/sched"
)

// TestSpecFieldsBeyondBaseline: what schedd publishes is what was added
// after the baseline, and the baseline names only fields that still exist
// (a frozen list that a rename would leave behind).
func TestSpecFieldsBeyondBaseline(t *testing.T) {
	beyond := sched.SpecFieldsBeyondBaseline()
	for _, want := range []string{"binds", "groups", "pids_limit"} {
		if !slices.Contains(beyond, want) {
			t.Errorf("beyond the baseline: %v, want %s in it", beyond, want)
		}
	}
	for _, old := range []string{"image", "health.interval", "update.order", "ports.host"} {
		if slices.Contains(beyond, old) {
			t.Errorf("%s is listed beyond the baseline", old)
		}
	}
	for p := range sched.BaselineSpecFields() {
		if !sched.SpecSchemaHas(p) {
			t.Errorf("baseline field %s is not in the spec any more", p)
		}
	}
}

// TestSpecNeeds: a spec needs the fields beyond the baseline it sets.
func TestSpecNeeds(t *testing.T) {
	spec := webSpec(2)
	spec.Health = sched.HealthCheck{Cmd: []string{"true"}, Interval: sched.Duration(time.Second)}
	if n := sched.SpecNeeds(spec); len(n) != 0 {
		t.Errorf("a spec of baseline fields needs %v", n)
	}
	spec.PidsLimit = 64
	spec.Groups = []string{"audio"}
	if n := sched.SpecNeeds(spec); !slices.Equal(n, []string{"groups", "pids_limit"}) {
		t.Errorf("needs %v, want groups and pids_limit", n)
	}
}

// TestUnknownSpecFields: fields a newer writer added, at the top level or
// inside a known object, are found; map keys and names in another case
// are not fields.
func TestUnknownSpecFields(t *testing.T) {
	raw := `{"name":"web","Image":"busybox","future":1,"labels":{"any":"x"},"health":{"cmd":["true"],"newer":"y"},
		"ports":[{"container":80,"host":8080,"later":true}],"sysctls":{"net.x":"1"}}`
	if got := sched.UnknownSpecFields([]byte(raw)); !slices.Equal(got, []string{"future", "health.newer", "ports.later"}) {
		t.Errorf("unknown fields %v", got)
	}
	if got := sched.UnknownSpecFields([]byte(`not json`)); got != nil {
		t.Errorf("not JSON: %v", got)
	}
}

// TestFilterSpecFields: a node whose schedd does not publish a field the
// task needs is passed over, and says why; one that does fits.
func TestFilterSpecFields(t *testing.T) {
	spec := webSpec(1)
	spec.PidsLimit = 64
	req, err := sched.NewRequest(spec, "1")
	if err != nil {
		t.Fatal(err)
	}
	old := sched.Node{ID: "old", Alive: true, Availability: sched.Active, Capacity: sched.Resources{CPUMillis: 4000, MemoryBytes: 8 << 30}}
	cur := old
	cur.ID = "new"
	cur.SpecFields = sched.ParseNodeSpecFields(strings.Join(sched.SpecFieldsBeyondBaseline(), ","))
	r := sched.Filter(req, old, sched.NodeUsage{})
	if r.Class != sched.RejectSchedd || r.Detail != "pids_limit" {
		t.Errorf("old schedd: %+v", r)
	}
	if r := sched.Filter(req, cur, sched.NodeUsage{}); !r.OK() {
		t.Errorf("new schedd: %v", r)
	}
	if s := sched.SummarizeRejects(2, []sched.Reject{r, r}); s != "2 nodes: 2 run a schedd that does not know spec field pids_limit (upgrade it)" {
		t.Errorf("summary %q", s)
	}
	if ranked, _ := sched.Place(req, []sched.Node{old, cur}, sched.Usage{}); !slices.Equal(ranked, []string{"new"}) {
		t.Errorf("placed on %v", ranked)
	}
}

// TestNodeSpecFieldsStamp: the list counts only while no later start
// (a schedd from before, which writes the capacity alone) followed it.
func TestNodeSpecFieldsStamp(t *testing.T) {
	fields := sched.NodeFields(sched.Resources{CPUMillis: 1000, MemoryBytes: 1 << 30}, sched.Active)
	doc := crdt.Set(fields, stampAt(t0, "n1"))
	if n := sched.NodeFromDoc("n1", doc, true); !n.SpecFields["pids_limit"] {
		t.Fatalf("a new schedd's node: %v", n.SpecFields)
	}
	older := map[string]crdt.Value{}
	for k, v := range fields {
		if k != sched.NodeSpecFieldsField {
			older[k] = v
		}
	}
	doc = crdt.Merge(doc, crdt.Set(older, stampAt(t0.Add(time.Minute), "n1")))
	if n := sched.NodeFromDoc("n1", doc, true); n.SpecFields != nil {
		t.Errorf("after a downgrade: %v", n.SpecFields)
	}
	doc = crdt.Merge(doc, crdt.Set(fields, stampAt(t0.Add(2*time.Minute), "n1")))
	if n := sched.NodeFromDoc("n1", doc, true); !n.SpecFields["groups"] {
		t.Errorf("upgraded again: %v", n.SpecFields)
	}
}
