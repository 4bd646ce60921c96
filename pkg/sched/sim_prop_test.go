package sched_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/shoal-dev/shoal/pkg/sched"
	"github.com/shoal-dev/shoal/pkg/sched/sim"
)

// chaos drives a random cluster through random operations. tight makes
// capacity scarce and lets containers crash (safety only); otherwise every
// node could hold every task and images behave (convergence).
type chaos struct {
	c        *sim.Cluster
	nodes    []string
	services []string
	tight    bool
}

func newChaos(t *rapid.T, tight bool) *chaos {
	n := rapid.IntRange(2, 5).Draw(t, "nodes")
	cfg := sim.Config{
		Seed:      rapid.Uint64().Draw(t, "seed"),
		GossipLag: time.Duration(rapid.IntRange(0, 5).Draw(t, "lag")) * 100 * time.Millisecond,
		Images:    map[string]sim.Behavior{"crash": {RunFor: 700 * time.Millisecond, ExitCode: 1}},
	}
	ch := &chaos{tight: tight}
	for i := 1; i <= n; i++ {
		capa := sched.Resources{CPUMillis: 64000, MemoryBytes: 64 * gib}
		if tight {
			capa = sched.Resources{
				CPUMillis:   int64(rapid.IntRange(1, 8).Draw(t, "cpu")) * 250,
				MemoryBytes: int64(rapid.IntRange(1, 8).Draw(t, "mem")) * 256 << 20,
			}
		}
		id := fmt.Sprintf("n%d", i)
		zone := "eu" // n1: so that a constrained service has somewhere to go
		if i > 1 {
			zone = rapid.SampledFrom([]string{"eu", "us"}).Draw(t, "zone")
		}
		cfg.Nodes = append(cfg.Nodes, sim.NodeConfig{ID: id, Capacity: capa, Labels: map[string]string{"zone": zone}})
		ch.nodes = append(ch.nodes, id)
	}
	ch.c = sim.New(cfg)
	for i := range rapid.IntRange(1, 3).Draw(t, "services") {
		spec := sched.ServiceSpec{
			Name:        fmt.Sprintf("s%d", i),
			Image:       "ok1",
			CPUMillis:   int64(rapid.IntRange(0, 4).Draw(t, "scpu")) * 250,
			MemoryBytes: int64(rapid.IntRange(0, 4).Draw(t, "smem")) * 256 << 20,
			Placement:   rapid.SampledFrom([]sched.Strategy{sched.Spread, sched.Binpack}).Draw(t, "placement"),
			Update: sched.UpdateConfig{
				Parallelism: rapid.IntRange(1, 3).Draw(t, "parallelism"),
				Order:       rapid.SampledFrom([]sched.UpdateOrder{sched.StopFirst, sched.StartFirst}).Draw(t, "order"),
				Monitor:     sched.Duration(time.Second),
			},
		}
		if rapid.IntRange(0, 4).Draw(t, "global") == 0 {
			spec.Global = true
		} else {
			spec.Replicas = rapid.IntRange(0, 8).Draw(t, "replicas")
		}
		if rapid.IntRange(0, 3).Draw(t, "constrained") == 0 {
			spec.Constraints = []string{"node.labels.zone==eu"}
		}
		if err := ch.c.CreateService(spec); err != nil {
			t.Fatal(err)
		}
		ch.services = append(ch.services, spec.Name)
	}
	return ch
}

func (ch *chaos) step(t *rapid.T) {
	c := ch.c
	node := rapid.SampledFrom(ch.nodes).Draw(t, "node")
	svc := rapid.SampledFrom(ch.services).Draw(t, "service")
	switch rapid.IntRange(0, 10).Draw(t, "op") {
	case 0:
		if !c.Service(svc).Spec.Global {
			_ = c.Scale(svc, rapid.IntRange(0, 8).Draw(t, "scale"))
		}
	case 1:
		images := []string{"ok1", "ok2"}
		if ch.tight {
			images = append(images, "crash")
		}
		img := rapid.SampledFrom(images).Draw(t, "image")
		_ = c.UpdateService(svc, func(s *sched.ServiceSpec) { s.Image = img })
	case 2:
		c.Kill(node)
	case 3:
		c.Revive(node)
	case 4:
		c.SetAvailability(node, sched.Drain)
	case 5:
		c.SetAvailability(node, sched.Active)
	case 6: // a split view: the node sees only some of the others
		var view []string
		for _, id := range ch.nodes {
			if id == node || rapid.Bool().Draw(t, "sees") {
				view = append(view, id)
			}
		}
		c.SetAliveView(node, view)
	case 7:
		c.SetAliveView(node, nil)
	case 8:
		if run := c.Node(node).RunningTasks(); len(run) > 0 {
			c.Node(node).Crash(rapid.SampledFrom(run).Draw(t, "victim").ID, 1)
		}
	case 9:
		// just let time pass
	case 10: // its machine shuts down: schedd stops and hands over its tasks
		if !c.Node(node).Down() {
			c.ShutDown(node)
		}
	}
	c.RunFor(time.Duration(rapid.IntRange(0, 30).Draw(t, "wait")) * 100 * time.Millisecond)
}

func (ch *chaos) heal() {
	for _, id := range ch.nodes {
		ch.c.Revive(id)
		ch.c.SetAliveView(id, nil)
		ch.c.SetAvailability(id, sched.Active)
	}
}

func (ch *chaos) violations(t *rapid.T) {
	if v := ch.c.Violations; len(v) > 0 {
		t.Fatalf("invariants broken:\n%s", strings.Join(v, "\n"))
	}
}

// TestSimNeverOvercommits: under any interleaving of placements by owners
// that disagree, node failures, drains, crashes and updates, no node ever
// holds reservations or runs containers beyond its capacity, and no
// container runs without a reservation (checked at every tick).
func TestSimNeverOvercommits(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ch := newChaos(t, true)
		for range rapid.IntRange(1, 25).Draw(t, "steps") {
			ch.step(t)
			ch.violations(t)
		}
	})
}

// TestSimConverges: whatever happened, once every node is back, views
// agree and nodes are active again, every service settles: each slot runs
// exactly one task, nothing else of the service runs.
func TestSimConverges(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ch := newChaos(t, false)
		for range rapid.IntRange(0, 20).Draw(t, "steps") {
			ch.step(t)
		}
		ch.heal()
		if !ch.c.RunUntil(ch.c.AllSettled, 3*time.Minute) {
			var b strings.Builder
			for _, s := range ch.services {
				fmt.Fprintf(&b, "%s: settled=%v %+v\n  running %v\n  slots %s\n", s, ch.c.Settled(s), ch.c.Service(s), ch.c.Running(s), simSlots(ch.c, s))
			}
			t.Fatalf("not settled 3 minutes after healing:\n%s", b.String())
		}
		ch.violations(t)
	})
}

func simSlots(c *sim.Cluster, service string) string {
	var parts []string
	for _, sl := range c.Slots(service) {
		parts = append(parts, fmt.Sprintf("%s=%s@%s/v%d next=%s", sl.Slot, sl.Task, sl.Node, sl.Version, sl.Next))
	}
	return strings.Join(parts, " ")
}
