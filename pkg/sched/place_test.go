package sched_test

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/sched"
)

const gib = 1 << 30

func node(id string, cpu, mem int64, labels ...string) sched.Node {
	n := sched.Node{ID: id, Name: id, Hostname: id, Alive: true, Availability: sched.Active,
		Capacity: sched.Resources{CPUMillis: cpu, MemoryBytes: mem}, Labels: map[string]string{}}
	for i := 0; i+1 < len(labels); i += 2 {
		n.Labels[labels[i]] = labels[i+1]
	}
	return n
}

func request(t *testing.T, spec sched.ServiceSpec) sched.Request {
	t.Helper()
	r, err := sched.NewRequest(spec, "0")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestFilter(t *testing.T) {
	spec := sched.ServiceSpec{Name: "web", Image: "x", CPUMillis: 500, MemoryBytes: 512 << 20,
		Constraints: []string{"node.labels.zone==eu"},
		Ports:       []sched.Port{{Host: 8080, Container: 80, Mode: sched.PortHost}, {Host: 9090, Container: 90}}}
	req := request(t, spec)
	base := node("n1", 1000, gib, "zone", "eu")
	for _, tc := range []struct {
		name string
		n    func(sched.Node) sched.Node
		u    sched.NodeUsage
		want string
	}{
		{"fits", func(n sched.Node) sched.Node { return n }, sched.NodeUsage{}, "fits"},
		{"down", func(n sched.Node) sched.Node { n.Alive = false; return n }, sched.NodeUsage{}, "node is down"},
		{"drained", func(n sched.Node) sched.Node { n.Availability = sched.Drain; return n }, sched.NodeUsage{}, "node is drained"},
		{"paused", func(n sched.Node) sched.Node { n.Availability = sched.Pause; return n }, sched.NodeUsage{}, "node is paused"},
		{"constraint", func(n sched.Node) sched.Node { n.Labels = nil; return n }, sched.NodeUsage{}, "fails constraint node.labels.zone==eu"},
		{"host port", func(n sched.Node) sched.Node { return n }, sched.NodeUsage{Ports: map[string]bool{"8080/tcp": true}}, "host port 8080/tcp is in use"},
		{"ingress port is no node resource", func(n sched.Node) sched.Node { return n }, sched.NodeUsage{Ports: map[string]bool{"9090/tcp": true}}, "fits"},
		{"cpu", func(n sched.Node) sched.Node { return n }, sched.NodeUsage{Used: sched.Resources{CPUMillis: 600}}, "lacks CPU (need 500m, free 400m)"},
		{"memory", func(n sched.Node) sched.Node { return n }, sched.NodeUsage{Used: sched.Resources{MemoryBytes: 768 << 20}}, "lacks memory (need 512MiB, free 256MiB)"},
		{"exactly full fits", func(n sched.Node) sched.Node { return n }, sched.NodeUsage{Used: sched.Resources{CPUMillis: 500, MemoryBytes: 512 << 20}}, "fits"},
	} {
		if got := sched.Filter(req, tc.n(base), tc.u).String(); got != tc.want {
			t.Errorf("%s: Filter = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// MaxPerNode bounds the service's tasks on a node; below it, a node is
// only ranked by spread.
func TestFilterMaxPerNode(t *testing.T) {
	req := request(t, sched.ServiceSpec{Name: "web", Image: "x", Replicas: 4, MaxPerNode: 2})
	req.Tasks = map[string]int{"n1": 2, "n2": 1}
	for id, want := range map[string]string{"n1": "runs the service's maximum per node (2)", "n2": "fits", "n3": "fits"} {
		if got := sched.Filter(req, node(id, 1000, gib), sched.NodeUsage{}).String(); got != want {
			t.Errorf("%s: Filter = %q, want %q", id, got, want)
		}
	}
	ranked, why := sched.Place(req, []sched.Node{node("n1", 1000, gib), node("n2", 1000, gib)}, nil)
	if !slices.Equal(ranked, []string{"n2"}) || why != "" {
		t.Errorf("Place = %v %q, want n2 alone", ranked, why)
	}
	req.Tasks["n2"] = 2
	if _, why := sched.Place(req, []sched.Node{node("n1", 1000, gib), node("n2", 1000, gib)}, nil); why != "2 nodes: 2 run the service's maximum per node (2)" {
		t.Errorf("Place's reason = %q", why)
	}
}

func TestPlaceSpread(t *testing.T) {
	nodes := []sched.Node{node("n1", 4000, 8*gib), node("n2", 4000, 8*gib), node("n3", 4000, 8*gib)}
	req := request(t, sched.ServiceSpec{Name: "web", Image: "x", CPUMillis: 500, MemoryBytes: gib})
	// Fewer tasks of the service first, even on a fuller node.
	req.Tasks = map[string]int{"n1": 2, "n2": 1, "n3": 2}
	usage := sched.Usage{"n2": {Used: sched.Resources{CPUMillis: 3000, MemoryBytes: 6 * gib}}}
	ranked, why := sched.Place(req, nodes, usage)
	if why != "" || ranked[0] != "n2" {
		t.Fatalf("Place = %v %q, want n2 first", ranked, why)
	}
	// Equal counts: more free resources first.
	req.Tasks = nil
	usage = sched.Usage{"n1": {Used: sched.Resources{CPUMillis: 1000}}, "n3": {Used: sched.Resources{CPUMillis: 2000}}}
	ranked, _ = sched.Place(req, nodes, usage)
	if !slices.Equal(ranked, []string{"n2", "n1", "n3"}) {
		t.Fatalf("Place = %v, want [n2 n1 n3]", ranked)
	}
}

func TestPlaceBinpack(t *testing.T) {
	nodes := []sched.Node{node("n1", 4000, 8*gib), node("n2", 4000, 8*gib), node("n3", 4000, 8*gib)}
	req := request(t, sched.ServiceSpec{Name: "db", Image: "x", CPUMillis: 1000, MemoryBytes: 2 * gib, Placement: sched.Binpack})
	usage := sched.Usage{
		"n1": {Used: sched.Resources{CPUMillis: 2000, MemoryBytes: 4 * gib}},
		"n2": {Used: sched.Resources{CPUMillis: 3500, MemoryBytes: 7 * gib}}, // fullest, but does not fit
		"n3": {Used: sched.Resources{CPUMillis: 1000, MemoryBytes: 2 * gib}},
	}
	ranked, _ := sched.Place(req, nodes, usage)
	if !slices.Equal(ranked, []string{"n1", "n3"}) {
		t.Fatalf("Place = %v, want [n1 n3]", ranked)
	}
}

// TestPlaceNearVolumes: a task that mounts volumes goes to the nodes that
// hold their replicas, before emptier ones (spread) and fuller ones
// (binpack); spread's task count still comes first, and nodes that cannot
// take the task are not made to.
func TestPlaceNearVolumes(t *testing.T) {
	nodes := []sched.Node{node("n1", 4000, 8*gib), node("n2", 4000, 8*gib), node("n3", 4000, 8*gib), node("n4", 4000, 8*gib)}
	replicas := map[string][]string{"data": {"n3"}, "logs": {"n2", "n3"}, "other": {"n1"}}
	spec := sched.ServiceSpec{Name: "db", Image: "x", CPUMillis: 1000, MemoryBytes: gib, Volumes: []string{"data:/var/lib/db", "logs:/var/log:ro"}}
	near := sched.NearVolumes(spec.Volumes, replicas)
	if near["n3"] != 1 || near["n2"] != 0.5 || near["n1"] != 0 || near["n4"] != 0 {
		t.Fatalf("NearVolumes = %v, want n3 1, n2 0.5", near)
	}
	if got := sched.NearVolumes(nil, replicas); got != nil {
		t.Fatalf("NearVolumes of no volumes = %v, want nil", got)
	}
	if got := sched.NearVolumes([]string{"data:/d", "data:/e"}, map[string][]string{"data": {"n1", "n1"}}); got["n1"] != 1 {
		t.Fatalf("a volume mounted twice, a node listed twice: %v, want n1 1", got)
	}

	req := request(t, spec)
	req.Near = near
	// n3 is the fullest that fits, n4 the emptiest: n3 holds both volumes.
	usage := sched.Usage{
		"n3": {Used: sched.Resources{CPUMillis: 2500, MemoryBytes: 5 * gib}},
		"n1": {Used: sched.Resources{CPUMillis: 1000, MemoryBytes: 2 * gib}},
	}
	ranked, _ := sched.Place(req, nodes, usage)
	if !slices.Equal(ranked[:2], []string{"n3", "n2"}) {
		t.Fatalf("spread Place = %v, want n3 (both volumes) then n2 (one)", ranked)
	}
	// The service's own task count comes first.
	req.Tasks = map[string]int{"n3": 1}
	if ranked, _ = sched.Place(req, nodes, usage); ranked[0] != "n2" || ranked[len(ranked)-1] != "n3" {
		t.Fatalf("spread Place with a task on n3 = %v, want n2 first and n3 last", ranked)
	}
	req.Tasks = nil
	// Binpack: the replicas' node before the fullest.
	bp := request(t, sched.ServiceSpec{Name: "db", Image: "x", CPUMillis: 1000, MemoryBytes: gib, Placement: sched.Binpack, Volumes: spec.Volumes})
	bp.Near = near
	usage["n1"] = sched.NodeUsage{Used: sched.Resources{CPUMillis: 3000, MemoryBytes: 7 * gib}}
	if ranked, _ = sched.Place(bp, nodes, usage); ranked[0] != "n3" || ranked[1] != "n2" || ranked[2] != "n1" {
		t.Fatalf("binpack Place = %v, want n3, n2, then n1 (the fullest)", ranked)
	}
	// A replica's node that cannot take the task is passed over.
	usage["n3"] = sched.NodeUsage{Used: sched.Resources{CPUMillis: 3500}}
	if ranked, _ = sched.Place(req, nodes, usage); slices.Contains(ranked, "n3") || ranked[0] != "n2" {
		t.Fatalf("Place with n3 full = %v, want n2 first and no n3", ranked)
	}
}

// TestPlaceTieBreak: on identical nodes different slots prefer different
// nodes, deterministically.
func TestPlaceTieBreak(t *testing.T) {
	var nodes []sched.Node
	for _, id := range []string{"n1", "n2", "n3", "n4", "n5"} {
		nodes = append(nodes, node(id, 1000, gib))
	}
	req := request(t, sched.ServiceSpec{Name: "web", Image: "x"})
	first := map[string]bool{}
	for _, slot := range []string{"0", "1", "2", "3", "4", "5", "6", "7"} {
		req.Slot = slot
		a, _ := sched.Place(req, nodes, nil)
		rev := slices.Clone(nodes)
		slices.Reverse(rev)
		b, _ := sched.Place(req, rev, nil)
		if !slices.Equal(a, b) {
			t.Fatalf("ranking depends on node order: %v vs %v", a, b)
		}
		first[a[0]] = true
	}
	if len(first) < 3 {
		t.Fatalf("8 slots all preferred %v", first)
	}
}

func TestPlaceReason(t *testing.T) {
	nodes := []sched.Node{
		node("n1", 4000, gib, "zone", "eu"),
		node("n2", 4000, gib, "zone", "eu"),
		node("n3", 4000, 8*gib, "zone", "us"),
	}
	req := request(t, sched.ServiceSpec{Name: "web", Image: "x", MemoryBytes: 512 << 20, Constraints: []string{"node.labels.zone==eu"}})
	usage := sched.Usage{"n1": {Used: sched.Resources{MemoryBytes: 768 << 20}}, "n2": {Used: sched.Resources{MemoryBytes: 900 << 20}}}
	ranked, why := sched.Place(req, nodes, usage)
	want := "3 nodes: 2 lack memory (need 512MiB, most free 256MiB), 1 fails constraint node.labels.zone==eu"
	if ranked != nil || why != want {
		t.Fatalf("Place = %v, %q\nwant nil, %q", ranked, why, want)
	}
	nodes[0].Alive = false
	nodes[1].Availability = sched.Drain
	_, why = sched.Place(req, nodes, usage)
	if want := "3 nodes: 1 fails constraint node.labels.zone==eu, 1 is down, 1 is drained"; why != want {
		t.Fatalf("reason %q, want %q", why, want)
	}
	nodes[1].Availability = sched.Pause
	if _, why = sched.Place(req, nodes, usage); !strings.Contains(why, "1 is paused") {
		t.Fatalf("reason %q, want a paused node counted", why)
	}
	if _, why := sched.Place(req, nil, nil); why != "no nodes" {
		t.Fatalf("reason with no nodes: %q", why)
	}
}

func TestUsageFromTasks(t *testing.T) {
	u := sched.UsageFromTasks([]sched.Task{
		{Node: "n1", State: sched.TaskRunning, Resources: sched.Resources{CPUMillis: 100, MemoryBytes: 10}, Ports: []sched.Port{{Host: 80, Container: 80}}},
		{Node: "n1", State: sched.TaskPending, Resources: sched.Resources{CPUMillis: 200, MemoryBytes: 20}},
		{Node: "n1", State: sched.TaskFailed, Resources: sched.Resources{CPUMillis: 400, MemoryBytes: 40}},
		{Node: "n2", State: sched.TaskRestarting, Resources: sched.Resources{CPUMillis: 800, MemoryBytes: 80}},
	})
	if got := u["n1"].Used; got != (sched.Resources{CPUMillis: 300, MemoryBytes: 30}) {
		t.Errorf("n1 uses %v", got)
	}
	if !u["n1"].Ports["80/tcp"] {
		t.Errorf("n1 ports %v", u["n1"].Ports)
	}
	if got := u["n2"].Used; got != (sched.Resources{CPUMillis: 800, MemoryBytes: 80}) {
		t.Errorf("n2 uses %v", got)
	}
}

// TestPlaceSpreadPreference: the zone with fewer of the service's tasks
// comes first, whatever the nodes' scores; a node without the label is a
// zone of its own; a second preference orders within the first's ties.
func TestPlaceSpreadPreference(t *testing.T) {
	nodes := []sched.Node{
		node("a1", 1000, gib, "zone", "a", "rack", "1"), node("a2", 8000, 8*gib, "zone", "a", "rack", "2"),
		node("b1", 1000, gib, "zone", "b", "rack", "1"), node("x1", 1000, gib),
	}
	req := request(t, sched.ServiceSpec{Name: "web", Image: "x", Preferences: []string{"spread=node.labels.zone", "spread=node.labels.rack"}})
	if !slices.Equal(req.Spread, []string{"zone", "rack"}) {
		t.Fatalf("Spread = %v", req.Spread)
	}
	// Zone a holds one task (on a1), zone b one, the unlabelled x1 none.
	req.Tasks = map[string]int{"a1": 1, "b1": 1}
	if ranked, _ := sched.Place(req, nodes, nil); ranked[0] != "x1" {
		t.Fatalf("Place = %v, want x1 (the empty zone) first", ranked)
	}
	// x1 taken too: zones tie at one; rack 2 (a2) is the emptier rack.
	req.Tasks["x1"] = 1
	if ranked, _ := sched.Place(req, nodes, nil); ranked[0] != "a2" {
		t.Fatalf("Place = %v, want a2 (rack 2 empty) first", ranked)
	}
	// Zone a full, b and the unlabelled empty: x1 (its rack empty too),
	// then b1 (rack 1 holds a1's task), then zone a, though a2 scores
	// higher than all.
	req.Tasks = map[string]int{"a1": 1, "a2": 1}
	if ranked, _ := sched.Place(req, nodes, nil); !slices.Equal(ranked[:2], []string{"x1", "b1"}) {
		t.Fatalf("Place = %v, want x1, b1 first", ranked)
	}
}

func TestPlaceFailures(t *testing.T) {
	nodes := []sched.Node{node("n1", 4000, 8*gib, "zone=a"), node("n2", 4000, 8*gib, "zone=b"), node("n3", 4000, 8*gib, "zone=b")}
	req := request(t, sched.ServiceSpec{Name: "web", Image: "x", CPUMillis: 500, Preferences: []string{"spread=node.labels.zone"}})
	// n1 has no task and the emptiest zone, yet its failure puts it
	// after both others; n3's two after n2's one. A failure ranks, never
	// rejects.
	req.Tasks = map[string]int{"n2": 1, "n3": 1}
	req.Failures = map[string]int{"n1": 1, "n3": 2}
	ranked, why := sched.Place(req, nodes, nil)
	if why != "" || !slices.Equal(ranked, []string{"n2", "n1", "n3"}) {
		t.Fatalf("Place = %v %q, want [n2 n1 n3]", ranked, why)
	}
}

func TestFailuresOf(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	task := func(node string, st sched.TaskState, started bool, digest string, ago time.Duration) sched.Task {
		tk := sched.Task{Node: node, State: st, SpecDigest: digest, Finished: now.Add(-ago)}
		if started {
			tk.Started = now.Add(-ago - time.Second)
		}
		return tk
	}
	tasks := []sched.Task{
		task("n1", sched.TaskFailed, false, "d1", time.Minute),
		task("n1", sched.TaskFailed, false, "d1", 4*time.Minute),
		task("n2", sched.TaskFailed, false, "d1", 6*time.Minute), // too long ago
		task("n2", sched.TaskFailed, true, "d1", time.Minute),    // it ran, then failed
		task("n2", sched.TaskUnhealthy, true, "d1", 2*time.Minute),
		task("n2", sched.TaskExited, true, "d1", time.Minute),   // exited 0: no failure
		task("n3", sched.TaskFailed, false, "d0", time.Minute),  // another spec
		task("n3", sched.TaskStopped, false, "d1", time.Minute), // stopped, not failed
		task("n3", sched.TaskRunning, false, "d1", 0),
	}
	if got := sched.FailuresOf(tasks, "d1", now); !maps.Equal(got, map[string]int{"n1": 2, "n2": 2}) {
		t.Fatalf("FailuresOf = %v, want map[n1:2 n2:2]", got)
	}
	if got := sched.FailuresOf(tasks, "d9", now); got != nil {
		t.Fatalf("FailuresOf of an unknown digest = %v", got)
	}
}
