package sched_test

import (
	"slices"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/sched"
	"github.com/shoal-dev/shoal/pkg/sched/sim"
)

// A node whose machine shuts down (schedd told so by systemd) stops its
// tasks, records them stopped and says so in its node document: the other
// nodes replace them at once, long before the failure detector would
// declare the node dead, and the node, once back, runs none of them again
// and takes new tasks. A node that dies without a word (Kill) is the
// control: its tasks wait for the failure detector.
func TestSimShutDownHandsOver(t *testing.T) {
	const detect = 30 * time.Second // the failure detector, slower than the hand-over
	for _, tc := range []struct {
		name     string
		shutDown bool
	}{
		{"shut down", true},
		{"killed", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, 3, roomy, func(cfg *sim.Config) { cfg.DetectDelay = detect })
			create(t, c, sched.ServiceSpec{Name: "web", Image: "img", Replicas: 6, CPUMillis: 500})
			settle(t, c, "web", 5*time.Second)
			victim, had := ownerRunning(c, "web") // the owner goes too
			if len(had) == 0 {
				t.Fatalf("%s runs no task of web: %v", victim, c.Running("web"))
			}
			start := c.Now()
			if tc.shutDown {
				c.ShutDown(victim)
			} else {
				c.Kill(victim)
			}
			replaced := c.RunUntil(movedOff(c, "web", victim, 6), detect-5*time.Second)
			if !tc.shutDown {
				if replaced {
					t.Fatalf("a killed node's tasks were replaced after %v, before its death was detected (%v)", c.Now().Sub(start), detect)
				}
				return
			}
			if !replaced {
				t.Fatalf("not replaced within %v of the shutdown: running %v, slots %s", detect-5*time.Second, c.Running("web"), slotSummary(c, "web"))
			}
			t.Logf("replaced %v after the shutdown", c.Now().Sub(start))
			if n := c.Running("web")[victim]; n != 0 {
				t.Fatalf("%s still runs %d tasks after it shut down", victim, n)
			}
			for _, task := range c.Tasks("web") {
				if slices.Contains(had, task.ID) && (task.State != sched.TaskStopped || task.Error != sched.ShutDownReason) {
					t.Fatalf("task %s, stopped at the shutdown, is %s (%q)", task.ID, task.State, task.Error)
				}
			}

			// Back: it runs none of its old tasks, and takes new ones.
			c.Revive(victim)
			settle(t, c, "web", 15*time.Second)
			if rt := c.Node(victim).RunningTasks(); len(rt) != 0 {
				t.Fatalf("%s runs %d tasks after its return, want none (it had %v)", victim, len(rt), had)
			}
			if err := c.Scale("web", 12); err != nil {
				t.Fatal(err)
			}
			settle(t, c, "web", 15*time.Second)
			if c.Running("web")[victim] == 0 {
				t.Fatalf("%s takes no new task after its return: %v", victim, c.Running("web"))
			}
		})
	}
}
