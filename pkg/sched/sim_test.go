package sched_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/sched"
	"github.com/shoal-dev/shoal/pkg/sched/sim"
)

// newCluster builds n nodes n1..nN with the given capacity.
func newCluster(t *testing.T, n int, capa sched.Resources, tweak func(*sim.Config)) *sim.Cluster {
	t.Helper()
	cfg := sim.Config{Seed: 1}
	for i := 1; i <= n; i++ {
		cfg.Nodes = append(cfg.Nodes, sim.NodeConfig{ID: fmt.Sprintf("n%d", i), Capacity: capa})
	}
	if tweak != nil {
		tweak(&cfg)
	}
	c := sim.New(cfg)
	if testing.Verbose() {
		start := c.Now()
		c.Trace = func(now time.Time, node, what string) {
			t.Logf("%8s %-3s %s", now.Sub(start).Truncate(time.Millisecond), node, what)
		}
	}
	t.Cleanup(func() {
		if len(c.Violations) > 0 {
			t.Errorf("invariants broken:\n%s", strings.Join(c.Violations, "\n"))
		}
	})
	return c
}

var roomy = sched.Resources{CPUMillis: 8000, MemoryBytes: 16 * gib}

func create(t *testing.T, c *sim.Cluster, spec sched.ServiceSpec) {
	t.Helper()
	if err := c.CreateService(spec); err != nil {
		t.Fatal(err)
	}
}

func settle(t *testing.T, c *sim.Cluster, service string, within time.Duration) {
	t.Helper()
	if !c.RunUntil(func() bool { return c.Settled(service) }, within) {
		t.Fatalf("%s did not settle within %v: running %v, slots %v, unschedulable %v",
			service, within, c.Running(service), slotSummary(c, service), c.LastUnschedulable)
	}
}

// ownerRunning returns the owner of service, which both node-loss tests
// take down, and the tasks of it that the owner runs.
func ownerRunning(c *sim.Cluster, service string) (owner string, ids []string) {
	owner = sched.Owner(service, c.NodeIDs())
	for _, lt := range c.Node(owner).RunningTasks() {
		ids = append(ids, lt.ID)
	}
	return owner, ids
}

// movedOff reports whether service runs want tasks on nodes other than
// node, and no slot of it names node any more.
func movedOff(c *sim.Cluster, service, node string, want int) func() bool {
	return func() bool {
		up := 0
		for at, n := range c.Running(service) {
			if at != node {
				up += n
			}
		}
		for _, sl := range c.Slots(service) {
			if sl.Node == node {
				return false
			}
		}
		return up == want
	}
}

func slotSummary(c *sim.Cluster, service string) string {
	var parts []string
	for _, sl := range c.Slots(service) {
		p := fmt.Sprintf("%s=%s@%s", sl.Slot, sl.Task, sl.Node)
		if sl.Next != "" {
			p += fmt.Sprintf("(next %s@%s)", sl.Next, sl.NextNode)
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, " ")
}

func TestSimSpread(t *testing.T) {
	c := newCluster(t, 3, roomy, nil)
	create(t, c, sched.ServiceSpec{Name: "web", Image: "img", Replicas: 6, CPUMillis: 500, MemoryBytes: 256 << 20})
	settle(t, c, "web", 5*time.Second)
	if got := c.Running("web"); !maps.Equal(got, map[string]int{"n1": 2, "n2": 2, "n3": 2}) {
		t.Fatalf("running %v, want 2/2/2", got)
	}
	if svc := c.Service("web"); !c.RunUntil(func() bool { return c.Service("web").Converged == 1 }, 10*time.Second) {
		t.Fatalf("rollout not recorded as converged: %+v", svc)
	}
}

func TestSimScaleDown(t *testing.T) {
	c := newCluster(t, 3, roomy, nil)
	create(t, c, sched.ServiceSpec{Name: "web", Image: "img", Replicas: 9, CPUMillis: 100})
	settle(t, c, "web", 5*time.Second)
	if err := c.Scale("web", 3); err != nil {
		t.Fatal(err)
	}
	settle(t, c, "web", 15*time.Second)
	var names []string
	for _, sl := range c.Slots("web") {
		names = append(names, sl.Slot)
	}
	if !slices.Equal(names, []string{"0", "1", "2"}) {
		t.Fatalf("slots %v, want 0 1 2", names)
	}
	var held int64
	for _, id := range c.NodeIDs() {
		held += c.Node(id).Ledger.Usage().CPUMillis
	}
	if held != 300 {
		t.Fatalf("ledgers hold %dm for 3 tasks of 100m: reservations not released", held)
	}
	if err := c.Scale("web", 0); err != nil {
		t.Fatal(err)
	}
	settle(t, c, "web", 15*time.Second)
	c.RemoveService("web")
	settle(t, c, "web", 15*time.Second)
	if n := len(c.Slots("web")); n != 0 {
		t.Fatalf("%d slots left after the service was removed", n)
	}
}

// TestSimNodeDies: the tasks of a dead node are replaced elsewhere. When
// it comes back, a copy whose container died with it is stale and stops;
// one whose container ran on (the node was only cut off) claims its slot
// back and, being the older, keeps it while the replacement stops
// (DESIGN.md 2). Either way no slot runs twice.
func TestSimNodeDies(t *testing.T) {
	for _, tc := range []struct {
		name       string
		containers bool // the victim's containers survive
	}{
		{name: "containers died with it", containers: false},
		{name: "containers ran on", containers: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, 3, roomy, nil)
			create(t, c, sched.ServiceSpec{Name: "web", Image: "img", Replicas: 6, CPUMillis: 500})
			settle(t, c, "web", 5*time.Second)
			victim, had := ownerRunning(c, "web") // the owner dies too
			c.Kill(victim)
			ok := c.RunUntil(movedOff(c, "web", victim, 6), 20*time.Second)
			if !ok {
				t.Fatalf("not replaced: running %v, slots %s", c.Running("web"), slotSummary(c, "web"))
			}
			if c.Running("web")[victim] != 2 {
				t.Fatalf("the partitioned node's containers should still run: %v", c.Running("web"))
			}
			if !tc.containers {
				for _, id := range had {
					c.Node(victim).Crash(id, 137)
				}
			}
			c.Revive(victim)
			settle(t, c, "web", 15*time.Second)
			var has []string
			for _, lt := range c.Node(victim).RunningTasks() {
				has = append(has, lt.ID)
			}
			want := []string(nil)
			if tc.containers {
				want = had
			}
			if !slices.Equal(has, want) {
				t.Fatalf("%s runs %v after its return, want %v (it ran %v)", victim, has, want, had)
			}
		})
	}
}

// TestSimTwoOwners: two nodes both believe they own the service while
// capacity is exactly enough. No node is ever overcommitted (newCluster
// checks every tick), and once views agree the service converges.
func TestSimTwoOwners(t *testing.T) {
	c := newCluster(t, 3, sched.Resources{CPUMillis: 1000, MemoryBytes: gib}, func(cfg *sim.Config) {
		cfg.GossipLag = 300 * time.Millisecond
	})
	owner := sched.Owner("web", c.NodeIDs())
	var other string
	for _, id := range c.NodeIDs() {
		if id != owner {
			other = id
			break
		}
	}
	c.SetAliveView(other, []string{other}) // it thinks it is alone
	create(t, c, sched.ServiceSpec{Name: "web", Image: "img", Replicas: 6, CPUMillis: 500, MemoryBytes: 256 << 20})
	c.RunFor(10 * time.Second)
	if c.Stats.Rejects == 0 {
		t.Logf("no Reserve was rejected: the race did not happen? stats %+v", c.Stats)
	}
	c.SetAliveView(other, nil)
	settle(t, c, "web", 30*time.Second)
	t.Logf("stats %+v", c.Stats)
}

// TestSimCrashLoopBacksOff: a crashing task restarts in place with the
// backoff InPlaceRestarts times, then fails and its replacement, after
// the backoff too, goes to the other node.
func TestSimCrashLoopBacksOff(t *testing.T) {
	c := newCluster(t, 2, roomy, func(cfg *sim.Config) {
		cfg.Images = map[string]sim.Behavior{"crash": {RunFor: 500 * time.Millisecond, ExitCode: 1}}
	})
	create(t, c, sched.ServiceSpec{Name: "web", Image: "crash", Replicas: 1})
	c.RunFor(20 * time.Second)
	tasks := c.Tasks("web")
	if len(tasks) != 2 {
		t.Fatalf("%d tasks, want the first and its replacement", len(tasks))
	}
	slices.SortFunc(tasks, func(a, b sched.Task) int { return a.Restarts - b.Restarts })
	// Starts at about 0.1s, then 0.6+1, 2.1+2, 4.6+4: three restarts in
	// place; it fails at 9.1s, and its replacement comes 8s later on the
	// other node, where it crashes at once and waits 16s.
	first, next := tasks[0], tasks[1]
	if first.State != sched.TaskFailed || first.Restarts != sched.InPlaceRestarts || first.Inherited != 0 {
		t.Fatalf("first task %s: %s after %d restarts (%d inherited), want failed after %d", first.ID, first.State, first.Restarts, first.Inherited, sched.InPlaceRestarts)
	}
	if next.Node == first.Node || next.Restarts != 4 || next.Inherited != 4 || next.State != sched.TaskRestarting {
		t.Fatalf("replacement %s on %s: %s, %d restarts (%d inherited); want restarting on the other node than %s, 4 inherited",
			next.ID, next.Node, next.State, next.Restarts, next.Inherited, first.Node)
	}
	if next.Started.Sub(first.Finished) < 8*time.Second {
		t.Fatalf("replacement started %v after the failure, want the 8s backoff", next.Started.Sub(first.Finished))
	}
	if c.Stats.Starts != 5 {
		t.Fatalf("%d starts, want 5", c.Stats.Starts)
	}
}

// TestSimCrashMoves: containers crash on one node only; its tasks move
// to the others after their restarts in place, and stay there.
func TestSimCrashMoves(t *testing.T) {
	c := newCluster(t, 3, roomy, func(cfg *sim.Config) {
		cfg.Nodes[1].Images = map[string]sim.Behavior{"img": {RunFor: 2 * time.Second, ExitCode: 139}}
	})
	create(t, c, sched.ServiceSpec{Name: "web", Image: "img", Replicas: 3,
		Restart: sched.RestartPolicy{Delay: sched.Duration(100 * time.Millisecond), MaxDelay: sched.Duration(time.Second)}})
	if !c.RunUntil(func() bool {
		got := c.Running("web")
		return got["n2"] == 0 && got["n1"]+got["n3"] == 3 && c.Settled("web")
	}, time.Minute) {
		t.Fatalf("not moved off n2: running %v, slots %s", c.Running("web"), slotSummary(c, "web"))
	}
	failed := 0
	for _, tk := range c.Tasks("web") {
		if tk.Node == "n2" {
			if tk.State != sched.TaskFailed || tk.ExitCode != 139 || tk.Restarts-tk.Inherited != sched.InPlaceRestarts {
				t.Errorf("task %s on n2: %s exit %d after %d restarts in place", tk.ID, tk.State, tk.ExitCode, tk.Restarts-tk.Inherited)
			}
			failed++
		}
	}
	if failed != 1 {
		t.Errorf("%d failed tasks on n2, want 1: the replacement avoids it", failed)
	}
	c.RunFor(time.Minute)
	if got := c.Running("web"); got["n2"] != 0 || got["n1"]+got["n3"] != 3 {
		t.Fatalf("running %v a minute later", got)
	}
}

// TestSimRestartWindow: with a window, max attempts count only the
// restarts within it: runs longer than the window restart for ever, runs
// shorter stop after max attempts within it, moves included.
func TestSimRestartWindow(t *testing.T) {
	for _, tc := range []struct {
		window   time.Duration
		max      int
		settles  bool
		restarts int // the least (for ever) or the exact count (settles)
	}{
		{3 * time.Second, 2, false, 10},
		{30 * time.Second, 2, true, 2},
		// Three restarts in place, the fourth a move: the replacement
		// counts the four, and stops after one more.
		{time.Minute, 5, true, 5},
	} {
		t.Run(tc.window.String(), func(t *testing.T) {
			c := newCluster(t, 2, roomy, func(cfg *sim.Config) {
				cfg.Images = map[string]sim.Behavior{"crash": {RunFor: 5 * time.Second, ExitCode: 1}}
			})
			create(t, c, sched.ServiceSpec{Name: "web", Image: "crash", Replicas: 1,
				Restart: sched.RestartPolicy{Policy: sched.RestartOnFailure, MaxAttempts: tc.max, Window: sched.Duration(tc.window),
					Delay: sched.Duration(100 * time.Millisecond), MaxDelay: sched.Duration(100 * time.Millisecond)}})
			c.RunFor(2 * time.Minute)
			most, failedForGood := 0, false
			for _, tk := range c.Tasks("web") {
				most = max(most, tk.Restarts)
				if tk.State == sched.TaskFailed && c.Slots("web")[0].Task == tk.ID {
					failedForGood = true
				}
			}
			switch {
			case tc.settles && (!failedForGood || most != tc.restarts):
				t.Fatalf("window %v: %d restarts, failed for good %v; want failed after %d", tc.window, most, failedForGood, tc.restarts)
			case !tc.settles && (failedForGood || most < tc.restarts):
				t.Fatalf("window %v: %d restarts, failed for good %v; want restarting still, at least %d", tc.window, most, failedForGood, tc.restarts)
			}
		})
	}
}

// TestSimStableCrashInPlace: a container that fails after running for
// StableRun or longer is no crash loop: it restarts in place whatever its
// count.
func TestSimStableCrashInPlace(t *testing.T) {
	c := newCluster(t, 2, roomy, func(cfg *sim.Config) {
		cfg.Images = map[string]sim.Behavior{"img": {RunFor: sched.StableRun + time.Minute, ExitCode: 1}}
	})
	create(t, c, sched.ServiceSpec{Name: "web", Image: "img", Replicas: 1})
	c.RunFor(time.Minute)
	first := c.Slots("web")[0].Task
	c.RunFor(time.Hour)
	tasks := c.Tasks("web")
	if len(tasks) != 1 || tasks[0].ID != first || tasks[0].Restarts <= sched.InPlaceRestarts || tasks[0].State.Terminal() {
		t.Fatalf("tasks %+v, want the first, %s, restarted in place more than %d times", tasks, first, sched.InPlaceRestarts)
	}
}

// TestSimGlobalCrashInPlace: a global service's crashing task has nowhere
// else to go and keeps restarting in place.
func TestSimGlobalCrashInPlace(t *testing.T) {
	c := newCluster(t, 2, roomy, func(cfg *sim.Config) {
		cfg.Nodes[1].Images = map[string]sim.Behavior{"img": {RunFor: time.Second, ExitCode: 1}}
	})
	create(t, c, sched.ServiceSpec{Name: "agent", Image: "img", Global: true,
		Restart: sched.RestartPolicy{Delay: sched.Duration(100 * time.Millisecond), MaxDelay: sched.Duration(time.Second)}})
	c.RunFor(30 * time.Second)
	var on2 []sched.Task
	for _, tk := range c.Tasks("agent") {
		if tk.Node == "n2" {
			on2 = append(on2, tk)
		}
	}
	if len(on2) != 1 || on2[0].Restarts <= sched.InPlaceRestarts || on2[0].State.Terminal() {
		t.Fatalf("n2's tasks %+v, want one restarted in place more than %d times", on2, sched.InPlaceRestarts)
	}
}

func TestSimMaxAttempts(t *testing.T) {
	c := newCluster(t, 2, roomy, func(cfg *sim.Config) {
		cfg.Images = map[string]sim.Behavior{"crash": {RunFor: 100 * time.Millisecond, ExitCode: 3}}
	})
	create(t, c, sched.ServiceSpec{Name: "web", Image: "crash", Replicas: 1,
		Restart: sched.RestartPolicy{Policy: sched.RestartOnFailure, MaxAttempts: 2}})
	c.RunFor(30 * time.Second)
	tasks := c.Tasks("web")
	if len(tasks) != 1 || tasks[0].State != sched.TaskFailed || tasks[0].Restarts != 2 || tasks[0].ExitCode != 3 {
		t.Fatalf("tasks %+v, want one failed after 2 restarts", tasks)
	}
	if u := c.Node(tasks[0].Node).Ledger.Usage(); u != (sched.Resources{}) {
		t.Fatalf("failed task still holds %v", u)
	}
}

func TestSimUnhealthyReplaced(t *testing.T) {
	c := newCluster(t, 3, roomy, nil)
	create(t, c, sched.ServiceSpec{Name: "web", Image: "img", Replicas: 3,
		Health: sched.HealthCheck{Cmd: []string{"check"}, Interval: sched.Duration(time.Second), Retries: 2}})
	settle(t, c, "web", 10*time.Second)
	sick := c.Slots("web")[1]
	c.Node(sick.Node).Sicken(sick.Task)
	if !c.RunUntil(func() bool { return c.Slots("web")[1].Task != sick.Task && c.Settled("web") }, 30*time.Second) {
		t.Fatalf("not replaced: slots %s", slotSummary(c, "web"))
	}
	for _, tk := range c.Tasks("web") {
		if tk.ID == sick.Task && tk.State != sched.TaskUnhealthy {
			t.Fatalf("the sick task is %s, want unhealthy", tk.State)
		}
	}
}

// A health check that fails from the start: failures within the start
// period do not count, so the task turns unhealthy only once the period
// is over (and at once without one).
func TestSimHealthStartPeriod(t *testing.T) {
	for _, tc := range []struct {
		start          time.Duration
		healthyUntil   time.Duration // no task unhealthy yet
		unhealthyAfter time.Duration // the first task is unhealthy
	}{
		{start: 0, healthyUntil: 0, unhealthyAfter: 2 * time.Second},
		{start: 5 * time.Second, healthyUntil: 4800 * time.Millisecond, unhealthyAfter: 7 * time.Second},
	} {
		t.Run(fmt.Sprint("start period ", tc.start), func(t *testing.T) {
			c := newCluster(t, 2, roomy, func(cfg *sim.Config) {
				cfg.Images = map[string]sim.Behavior{"sick": {Unhealthy: true}}
			})
			create(t, c, sched.ServiceSpec{Name: "web", Image: "sick", Replicas: 1,
				Health: sched.HealthCheck{Cmd: []string{"check"}, Interval: sched.Duration(500 * time.Millisecond), Retries: 2,
					StartPeriod: sched.Duration(tc.start)}})
			unhealthy := func() bool {
				return slices.ContainsFunc(c.Tasks("web"), func(tk sched.Task) bool { return tk.State == sched.TaskUnhealthy })
			}
			if tc.healthyUntil > 0 {
				c.RunFor(tc.healthyUntil)
				if tasks := c.Tasks("web"); len(tasks) != 1 || unhealthy() {
					t.Fatalf("after %v within a %v start period: tasks %+v, want the first one, not unhealthy", tc.healthyUntil, tc.start, tasks)
				}
			}
			c.RunFor(tc.unhealthyAfter - tc.healthyUntil)
			if !unhealthy() {
				t.Fatalf("after %v with a %v start period: no task unhealthy: %+v", tc.unhealthyAfter, tc.start, c.Tasks("web"))
			}
		})
	}
}

func TestRecordHealthCheck(t *testing.T) {
	start := t0
	h := sched.HealthCheck{Cmd: []string{"check"}, StartPeriod: sched.Duration(10 * time.Second)}
	r := sched.Runtime{State: sched.RuntimeRunning, StartedAt: start}
	for _, step := range []struct {
		at       time.Duration
		pass     bool
		passed   bool
		failures int
	}{
		{1 * time.Second, false, false, 0},  // within the start period: ignored
		{9 * time.Second, false, false, 0},  // still within
		{10 * time.Second, false, false, 1}, // the period is over
		{11 * time.Second, false, false, 2},
		{12 * time.Second, true, true, 0}, // a pass clears the failures
		{13 * time.Second, false, true, 1},
	} {
		r.RecordHealthCheck(h, step.pass, start.Add(step.at))
		if r.HealthPassed != step.passed || r.HealthFailures != step.failures {
			t.Fatalf("after a check at +%v (pass %v): passed %v failures %d, want %v %d", step.at, step.pass, r.HealthPassed, r.HealthFailures, step.passed, step.failures)
		}
	}
	// A pass within the start period counts at once.
	r = sched.Runtime{State: sched.RuntimeRunning, StartedAt: start}
	if r.RecordHealthCheck(h, true, start.Add(time.Second)); !r.HealthPassed {
		t.Fatal("a pass within the start period did not count")
	}
}

func TestSimDrain(t *testing.T) {
	c := newCluster(t, 3, roomy, nil)
	create(t, c, sched.ServiceSpec{Name: "web", Image: "img", Replicas: 6})
	settle(t, c, "web", 5*time.Second)
	minRunning := 6
	c.SetAvailability("n2", sched.Drain)
	ok := c.RunUntil(func() bool {
		n := 0
		for _, k := range c.Running("web") {
			n += k
		}
		minRunning = min(minRunning, n)
		return c.Settled("web") && c.Running("web")["n2"] == 0
	}, 20*time.Second)
	if !ok {
		t.Fatalf("drain did not finish: running %v", c.Running("web"))
	}
	if minRunning < 6 {
		t.Fatalf("capacity dipped to %d running tasks during the drain; the replacement should start first", minRunning)
	}
}

func TestSimGlobal(t *testing.T) {
	c := newCluster(t, 3, roomy, nil)
	create(t, c, sched.ServiceSpec{Name: "agent", Image: "img", Global: true, CPUMillis: 100})
	settle(t, c, "agent", 5*time.Second)
	c.AddNode(sim.NodeConfig{ID: "n4", Capacity: roomy})
	settle(t, c, "agent", 5*time.Second)
	if got := c.Running("agent"); !maps.Equal(got, map[string]int{"n1": 1, "n2": 1, "n3": 1, "n4": 1}) {
		t.Fatalf("running %v, want one per node", got)
	}
	c.SetAvailability("n1", sched.Drain)
	settle(t, c, "agent", 20*time.Second)
	if c.Running("agent")["n1"] != 0 {
		t.Fatalf("the drained node still runs the global task")
	}
}

// TestSimRollingUpdate: start-first keeps the full count running
// throughout; every task ends on the new spec.
func TestSimRollingUpdate(t *testing.T) {
	c := newCluster(t, 3, roomy, nil)
	create(t, c, sched.ServiceSpec{Name: "web", Image: "img:1", Replicas: 5,
		Update: sched.UpdateConfig{Parallelism: 2, Order: sched.StartFirst, Monitor: sched.Duration(time.Second)}})
	settle(t, c, "web", 5*time.Second)
	if err := c.UpdateService("web", func(s *sched.ServiceSpec) { s.Image = "img:2" }); err != nil {
		t.Fatal(err)
	}
	minRunning, maxRunning := 5, 0
	ok := c.RunUntil(func() bool {
		n := 0
		for _, k := range c.Running("web") {
			n += k
		}
		minRunning, maxRunning = min(minRunning, n), max(maxRunning, n)
		return c.Settled("web") && c.Service("web").Converged == 2
	}, 60*time.Second)
	if !ok {
		t.Fatalf("update did not finish: slots %s", slotSummary(c, "web"))
	}
	for _, sl := range c.Slots("web") {
		if sl.Version != 2 {
			t.Fatalf("slot %s runs version %d", sl.Slot, sl.Version)
		}
	}
	if minRunning < 5 || maxRunning > 7 {
		t.Fatalf("running went from %d to %d; start-first with parallelism 2 keeps it in [5, 7]", minRunning, maxRunning)
	}
}

// TestSimBadUpdateRollsBack: the new version crashes; the owner rolls back
// to the previous spec, and only the first batch ever ran the bad one.
func TestSimBadUpdateRollsBack(t *testing.T) {
	c := newCluster(t, 3, roomy, func(cfg *sim.Config) {
		cfg.Images = map[string]sim.Behavior{"bad": {RunFor: time.Second, ExitCode: 1}}
	})
	create(t, c, sched.ServiceSpec{Name: "web", Image: "good", Replicas: 4,
		Update: sched.UpdateConfig{FailureAction: sched.ActionRollback, Monitor: sched.Duration(10 * time.Second)}})
	settle(t, c, "web", 5*time.Second)
	if err := c.UpdateService("web", func(s *sched.ServiceSpec) { s.Image = "bad" }); err != nil {
		t.Fatal(err)
	}
	if !c.RunUntil(func() bool { return c.Service("web").State == sched.ServiceRollingBack }, 30*time.Second) {
		t.Fatalf("no rollback: %+v", c.Service("web"))
	}
	if !c.RunUntil(func() bool {
		s := c.Service("web")
		return s.State == sched.ServiceActive && s.Converged == s.Version && c.Settled("web")
	}, 60*time.Second) {
		t.Fatalf("rollback did not finish: %+v, slots %s", c.Service("web"), slotSummary(c, "web"))
	}
	svc := c.Service("web")
	if svc.Version != 3 || svc.Spec.Image != "good" || svc.PrevSpec.Image != "bad" {
		t.Fatalf("service after rollback: version %d image %s prev %s", svc.Version, svc.Spec.Image, svc.PrevSpec.Image)
	}
	bad := 0
	for _, tk := range c.Tasks("web") {
		if tk.Image == "bad" {
			bad++
		}
	}
	if bad != 1 {
		t.Fatalf("%d tasks ran the bad image; parallelism 1 should stop after the first", bad)
	}
}

// TestSimPausedUpdate: with the default failure action the rollout pauses
// and the remaining slots keep the old version.
func TestSimPausedUpdate(t *testing.T) {
	c := newCluster(t, 3, roomy, func(cfg *sim.Config) {
		cfg.Images = map[string]sim.Behavior{"bad": {StartError: "exec format error"}}
	})
	create(t, c, sched.ServiceSpec{Name: "web", Image: "good", Replicas: 3})
	settle(t, c, "web", 5*time.Second)
	if err := c.UpdateService("web", func(s *sched.ServiceSpec) { s.Image = "bad" }); err != nil {
		t.Fatal(err)
	}
	if !c.RunUntil(func() bool { return c.Service("web").State == sched.ServicePaused }, 30*time.Second) {
		t.Fatalf("not paused: %+v", c.Service("web"))
	}
	c.RunFor(30 * time.Second)
	good := 0
	for _, n := range c.Running("web") {
		good += n
	}
	if good != 2 {
		t.Fatalf("%d tasks run; want the 2 old ones left alone by the paused rollout", good)
	}
}

// TestSimStartFailureMoves: a node that cannot start containers (its
// runtime down, a missing bind path) fails the task instead of retrying it
// in place, and the owner places the replacement on another node, though
// spread alone would put it back on the node with no task.
func TestSimStartFailureMoves(t *testing.T) {
	c := newCluster(t, 3, roomy, func(cfg *sim.Config) {
		cfg.Nodes[1].StartError = "containerd is not reachable"
	})
	create(t, c, sched.ServiceSpec{Name: "web", Image: "img", Replicas: 3})
	settle(t, c, "web", 10*time.Second)
	if got := c.Running("web"); got["n2"] != 0 || got["n1"]+got["n3"] != 3 {
		t.Fatalf("running %v, want all 3 on n1 and n3", got)
	}
	failed := 0
	for _, tk := range c.Tasks("web") {
		switch {
		case tk.Node == "n2":
			if tk.State != sched.TaskFailed || !tk.Started.IsZero() || tk.Error != "containerd is not reachable" {
				t.Errorf("task %s on n2: %s, started %v, error %q; want failed, never started", tk.ID, tk.State, tk.Started, tk.Error)
			}
			failed++
		case tk.State == sched.TaskRunning && tk.Slot == slotOf(c, "web", "n2") && tk.Restarts != 1:
			t.Errorf("the replacement %s has %d restarts, want the failed task's 1", tk.ID, tk.Restarts)
		}
	}
	if failed != 1 {
		t.Errorf("%d failed tasks on n2, want 1: the replacement avoids it", failed)
	}
	c.RunFor(time.Minute)
	if got := c.Running("web"); got["n2"] != 0 {
		t.Fatalf("running %v a minute later", got)
	}
}

// slotOf names the slot of service whose first task ran on node ("" if
// none did).
func slotOf(c *sim.Cluster, service, node string) string {
	for _, tk := range c.Tasks(service) {
		if tk.Node == node {
			return tk.Slot
		}
	}
	return ""
}

// TestSimStartFailureEverywhere: a spec that starts nowhere goes round the
// nodes with the restart backoff, and each node keeps at most
// HistoryLimit finished tasks of the slot.
func TestSimStartFailureEverywhere(t *testing.T) {
	c := newCluster(t, 3, roomy, func(cfg *sim.Config) {
		cfg.Images = map[string]sim.Behavior{"bad": {StartError: "exec: no such file"}}
		cfg.Retention = time.Hour
	})
	create(t, c, sched.ServiceSpec{Name: "web", Image: "bad", Replicas: 1,
		Restart: sched.RestartPolicy{Delay: sched.Duration(100 * time.Millisecond), MaxDelay: sched.Duration(time.Second)}})
	c.RunFor(2 * time.Minute)
	perNode := map[string]int{}
	most := 0
	for _, tk := range c.Tasks("web") {
		perNode[tk.Node]++
		most = max(most, tk.Restarts)
	}
	if len(perNode) != 3 {
		t.Errorf("tasks per node %v: want every node tried", perNode)
	}
	for n, k := range perNode {
		if k > sched.HistoryLimit+1 {
			t.Errorf("node %s keeps %d tasks of the slot, want at most %d finished and the current one", n, k, sched.HistoryLimit)
		}
	}
	// About one attempt a second once the backoff is at its cap.
	if most < 60 {
		t.Errorf("%d restarts in 2 minutes, want the backoff capped at 1s", most)
	}
}

// TestSimGlobalStartFailureInPlace: a global service's task has nowhere
// else to go, so a start failure is retried on its node.
func TestSimGlobalStartFailureInPlace(t *testing.T) {
	c := newCluster(t, 2, roomy, func(cfg *sim.Config) {
		cfg.Nodes[1].StartError = "containerd is not reachable"
	})
	create(t, c, sched.ServiceSpec{Name: "agent", Image: "img", Global: true})
	c.RunFor(10 * time.Second)
	var onN2 []sched.Task
	for _, tk := range c.Tasks("agent") {
		if tk.Node == "n2" {
			onN2 = append(onN2, tk)
		}
	}
	if len(onN2) != 1 || onN2[0].Restarts < 2 || onN2[0].State == sched.TaskFailed {
		t.Fatalf("n2's tasks %+v: want one, restarted in place", onN2)
	}
}
