package sched_test

import (
	"maps"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/sched"
	"github.com/shoal-dev/shoal/pkg/sched/sim"
)

// TestSimPartitionHeal: 3 replicas spread 1/1/1, a partition {n1,n2} | {n3}
// long enough for each side to replace the other's replicas, then a heal
// after which membership converges node by node. Every slot goes back to
// the task that held it before the split (the older copy wins, DESIGN.md
// 2); only the copies made during the split stop, and nothing is placed
// after the heal. (Before: every original was superseded by the other
// side's newer slot write, and the two owners, disagreeing about who is
// alive, replaced each other's tasks every tick until the views agreed.)
func TestSimPartitionHeal(t *testing.T) {
	for _, tc := range []struct {
		name  string
		views map[string][]string // liveness views for the first second after the heal
		// slotLag: how late these nodes see slot documents (not task
		// documents) in the first second after the heal.
		slotLag map[string]time.Duration
	}{
		{
			// The report: n3, owner while it sees {n1, n3}, already sees
			// n1 but not n2.
			name:  "n3 sees n1 before n2",
			views: map[string][]string{"n3": {"n1", "n3"}},
		},
		{
			// And n2, owner while it sees {n1, n2}, still sees n3 dead
			// although n3's writes reach it through n1.
			name:  "n3 sees n1 before n2, n2 still sees n3 dead",
			views: map[string][]string{"n1": {"n1", "n2", "n3"}, "n2": {"n1", "n2"}, "n3": {"n1", "n3"}},
		},
		{
			// Seen in the e2e test: the other side's writes reach n3
			// before membership shows it anyone alive.
			name:  "n3 gets the majority's writes before it sees anyone alive",
			views: map[string][]string{"n3": {"n3"}},
		},
		{
			// Seen in the e2e test: n2, owner while it still sees n3
			// dead, gets the task documents of the heal (n1's copy
			// stopped as superseded by n3's original) before the slot
			// write that gave the slot back to n3's original.
			name:    "n2 sees a superseded task stopped before the slot write",
			views:   map[string][]string{"n1": {"n1", "n2", "n3"}, "n2": {"n1", "n2"}, "n3": {"n1", "n3"}},
			slotLag: map[string]time.Duration{"n2": 500 * time.Millisecond},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, 3, roomy, nil)
			// "web" is owned by n2 in {n1, n2} and by n3 in {n1, n3}.
			if sched.Owner("web", []string{"n1", "n2"}) != "n2" || sched.Owner("web", []string{"n1", "n3"}) != "n3" {
				t.Fatal("ownership of web changed: pick another name")
			}
			create(t, c, sched.ServiceSpec{Name: "web", Image: "img", Replicas: 3, CPUMillis: 500})
			settle(t, c, "web", 5*time.Second)
			if got := c.Running("web"); !maps.Equal(got, map[string]int{"n1": 1, "n2": 1, "n3": 1}) {
				t.Fatalf("running %v, want 1/1/1", got)
			}
			before := map[string]string{} // task → node
			for _, sl := range c.Slots("web") {
				before[sl.Task] = sl.Node
			}
			splitAndReplace(t, c)
			c.RunFor(5 * time.Second)
			c.Heal()
			for id, v := range tc.views {
				c.SetAliveView(id, v)
			}
			for id, lag := range tc.slotLag {
				c.SetKeyLag(id, sched.SlotsPrefix, lag)
			}
			reserves := c.Stats.Reserves
			c.RunFor(time.Second)
			for id := range tc.views {
				c.SetAliveView(id, nil)
			}
			for id := range tc.slotLag {
				c.SetKeyLag(id, sched.SlotsPrefix, 0)
			}
			settle(t, c, "web", 30*time.Second)
			c.RunFor(5 * time.Second)

			running := runningTasks(c)
			stopped := 0
			for task, node := range before {
				if node != "n3" && running[task] != node {
					stopped++
				}
			}
			if stopped != 0 || !maps.Equal(running, before) {
				t.Fatalf("%d replicas that ran on the majority side before the partition were stopped after the heal; running %v, before %v",
					stopped, running, before)
			}
			if n := c.Stats.Reserves - reserves; n != 0 {
				t.Fatalf("%d tasks placed after the heal, want none (slots %s)", n, slotSummary(c, "web"))
			}
		})
	}
}

// TestSimFailoverNotDelayed: a plain node death (no node coming back) is
// replaced as soon as it is detected, also when a node came back from the
// dead earlier (its settle window long over).
func TestSimFailoverNotDelayed(t *testing.T) {
	c := newCluster(t, 3, roomy, nil)
	create(t, c, sched.ServiceSpec{Name: "web", Image: "img", Replicas: 6, CPUMillis: 500})
	settle(t, c, "web", 5*time.Second)
	// replacedOff: the service runs in full without victim's containers.
	replacedOff := func(victim string) func() bool {
		return func() bool {
			up := 0
			for node, n := range c.Running("web") {
				if node != victim {
					up += n
				}
			}
			return up == 6
		}
	}
	// n1 is cut off and returns (its owners see a node come back) ...
	c.Kill("n1")
	if !c.RunUntil(replacedOff("n1"), 20*time.Second) {
		t.Fatalf("n1's replicas not replaced: running %v", c.Running("web"))
	}
	c.Revive("n1")
	settle(t, c, "web", 20*time.Second)
	c.RunFor(sched.DefaultSettle)
	// ... then the owner of web dies for good.
	victim := sched.Owner("web", c.NodeIDs())
	died := c.Now()
	c.Kill(victim)
	replaced := replacedOff(victim)
	if !c.RunUntil(replaced, 20*time.Second) {
		t.Fatalf("not replaced: running %v, slots %s", c.Running("web"), slotSummary(c, "web"))
	}
	// Detection (2s), the next tick's Reserve, the accept, the tick that
	// starts the container: the same as before the settle window existed.
	if took, want := c.Now().Sub(died), 2300*time.Millisecond; took > want {
		t.Fatalf("failover took %v of virtual time, want at most %v", took, want)
	}
}

// TestSimPartitionBeforeSlotsSeen: the e2e failure of 2026-12-04. The
// partition {n1,n2} | {n3} came half a second after the service started,
// before the slot documents naming n1's and n2's replicas had reached n3
// (their task documents had). n3, alone, found those slots vacant and
// filled them without naming the task it replaced; after the heal its
// newer writes superseded the majority's originals, which never claimed
// their slots back. The owner filling a slot whose only task is on a node
// it sees dead now replaces that task as lost, so the heal gives the slot
// back to the older task as for any other lost replacement.
//
// And when n3 has seen neither the slot documents nor the task documents
// (the slots are new to it), its writes are fresh (Slot.Fresh) and the
// tasks the slots had named claim them back in the same way; before,
// n3 kept all three copies.
func TestSimPartitionBeforeSlotsSeen(t *testing.T) {
	for _, tc := range []struct {
		name   string
		unseen []string // key prefixes n3 has not seen when the split begins
	}{
		{"task documents seen", []string{sched.SlotsPrefix}},
		{"task documents not seen either", []string{sched.SlotsPrefix, sched.TasksPrefix}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, 3, roomy, nil)
			if o := sched.Owner("web", []string{"n1", "n2", "n3"}); o == "n3" {
				t.Fatalf("web is owned by %s with all three alive: pick another name", o)
			}
			for _, p := range tc.unseen {
				c.SetKeyLag("n3", p, 3*time.Second)
			}
			create(t, c, sched.ServiceSpec{Name: "web", Image: "img", Replicas: 3, CPUMillis: 500})
			if !c.RunUntil(func() bool {
				return maps.Equal(c.Running("web"), map[string]int{"n1": 1, "n2": 1, "n3": 1}) && len(c.Slots("web")) == 3
			}, 5*time.Second) {
				t.Fatalf("running %v, want 1/1/1", c.Running("web"))
			}
			before := map[string]string{} // task → node
			for _, sl := range c.Slots("web") {
				if sl.Node == "" {
					t.Fatalf("slot %s names no node yet: %s", sl.Slot, slotSummary(c, "web"))
				}
				before[sl.Task] = sl.Node
			}
			splitAndReplace(t, c)
			c.RunFor(2 * time.Second)
			c.Heal()
			for _, p := range tc.unseen {
				c.SetKeyLag("n3", p, 0)
			}
			settle(t, c, "web", 30*time.Second)
			c.RunFor(5 * time.Second)
			running := runningTasks(c)
			if !maps.Equal(running, before) {
				t.Fatalf("running %v after the heal, want the replicas from before the partition %v (slots %s)", running, before, slotSummary(c, "web"))
			}
		})
	}
}

// splitAndReplace partitions {n1,n2} | {n3} and runs until each side has
// replaced the other's replicas of web (3 replicas).
func splitAndReplace(t *testing.T, c *sim.Cluster) {
	t.Helper()
	c.Partition([]string{"n1", "n2"}, []string{"n3"})
	if !c.RunUntil(func() bool {
		r := c.Running("web")
		return r["n1"]+r["n2"] == 3 && r["n3"] == 3
	}, 20*time.Second) {
		t.Fatalf("not replaced on both sides: running %v", c.Running("web"))
	}
}

// runningTasks maps every running task to its node.
func runningTasks(c *sim.Cluster) map[string]string {
	running := map[string]string{}
	for _, id := range c.NodeIDs() {
		for _, lt := range c.Node(id).RunningTasks() {
			running[lt.ID] = id
		}
	}
	return running
}
