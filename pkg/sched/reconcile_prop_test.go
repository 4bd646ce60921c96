package sched_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/shoal-dev/shoal/pkg/sched"
)

// randomWorld draws a service in an arbitrary state: slots with or
// without documents, named tasks in any state (or missing), stray tasks,
// dead and drained nodes, reservations in flight, a rollout under way.
func randomWorld(t *rapid.T) *world {
	spec := webSpec(rapid.IntRange(0, 8).Draw(t, "replicas"))
	spec.CPUMillis = int64(rapid.IntRange(0, 8).Draw(t, "cpu")) * 250
	spec.Placement = rapid.SampledFrom([]sched.Strategy{sched.Spread, sched.Binpack}).Draw(t, "placement")
	spec.Update.Order = rapid.SampledFrom([]sched.UpdateOrder{sched.StopFirst, sched.StartFirst}).Draw(t, "order")
	if rapid.Bool().Draw(t, "global") {
		spec.Replicas, spec.Global = 0, true
	}
	w := newWorld(spec)
	w.nodes = nil
	for i := range rapid.IntRange(1, 5).Draw(t, "nodes") {
		n := node(fmt.Sprintf("n%d", i+1), int64(rapid.IntRange(0, 8).Draw(t, "capacity"))*500, 8*gib)
		n.Alive = rapid.IntRange(0, 4).Draw(t, "dead") != 0
		if rapid.IntRange(0, 4).Draw(t, "drained") == 0 {
			n.Availability = sched.Drain
		}
		w.nodes = append(w.nodes, n)
	}
	if rapid.Bool().Draw(t, "updated") {
		w.update(func(s *sched.ServiceSpec) { s.Image = "img:2" })
		w.svc.Converged = 1
	}
	states := []sched.TaskState{sched.TaskPending, sched.TaskStarting, sched.TaskRunning, sched.TaskRestarting,
		sched.TaskUnhealthy, sched.TaskExited, sched.TaskFailed, sched.TaskStopped}
	slots := []string{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}
	for _, n := range w.nodes {
		slots = append(slots, n.ID)
	}
	for i := range rapid.IntRange(0, 12).Draw(t, "tasks") {
		id := fmt.Sprintf("t%d", i)
		slot := rapid.SampledFrom(slots).Draw(t, "slot")
		nd := rapid.SampledFrom(w.nodes).Draw(t, "on").ID
		created := t0.Add(-time.Duration(rapid.IntRange(0, 120).Draw(t, "age")) * time.Second)
		version := int64(rapid.IntRange(1, int(w.svc.Version)).Draw(t, "version"))
		spec := w.svc.Spec
		if version < w.svc.Version {
			spec = *w.svc.PrevSpec
		}
		tk := w.taskOf(spec, version, id, slot, nd, rapid.SampledFrom(states).Draw(t, "state"), created)
		tk.Finished = created.Add(2 * time.Second)
		switch rapid.IntRange(0, 3).Draw(t, "named") {
		case 0, 1:
			w.slot(slot, id, nd, version, created.Add(time.Second))
		case 2:
			if s := w.findSlot(slot); s != nil {
				s.Next, s.NextNode, s.NextVersion = id, nd, version
			}
		}
	}
	for range rapid.IntRange(0, 2).Draw(t, "extra slots") {
		w.slot(rapid.SampledFrom(slots).Draw(t, "extra"), rapid.SampledFrom([]string{"", "ghost"}).Draw(t, "names"), "n1", 1, t0.Add(-time.Second))
	}
	if rapid.IntRange(0, 3).Draw(t, "inflight") == 0 {
		w.inflight = append(w.inflight, sched.InFlight{Slot: rapid.SampledFrom(slots).Draw(t, "ifslot"), TaskID: "x", Node: "n1", Sent: t0.Add(-time.Second)})
	}
	return w
}

func (w *world) findSlot(name string) *sched.Slot {
	for i := range w.slots {
		if w.slots[i].Slot == name {
			return &w.slots[i]
		}
	}
	return nil
}

func TestReconcileProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w := randomWorld(t)
		now := t0.Add(time.Duration(rapid.IntRange(0, 20).Draw(t, "now")) * time.Second)
		snap := w.snapshot()
		acts := sched.Reconcile(snap, now, counter())

		// Deterministic whatever the order of the inputs.
		rng := rand.New(rand.NewPCG(rapid.Uint64().Draw(t, "shuffle"), 0))
		shuffled := snap
		shuffled.Nodes = shuffle(rng, snap.Nodes)
		shuffled.Slots = shuffle(rng, snap.Slots)
		shuffled.Tasks = shuffle(rng, snap.Tasks)
		if a, b := render(acts), render(sched.Reconcile(shuffled, now, counter())); a != b {
			t.Fatalf("order of the inputs changed the decision:\n%s\nvs\n%s", a, b)
		}

		// One action per slot at most, none for a slot in flight, and
		// the plan fits every node by the owner's own knowledge.
		planned := map[string]sched.Resources{}
		touched := map[string]bool{}
		for _, a := range acts {
			var slot string
			switch a := a.(type) {
			case sched.Reserve:
				slot = a.Slot
				if len(a.Candidates) == 0 {
					t.Fatalf("%v has no candidates", a)
				}
				n := a.Candidates[0]
				planned[n] = planned[n].Add(a.Resources)
				for _, c := range a.Candidates {
					if nd := w.nodeRef(c); !nd.Alive || nd.Availability == sched.Drain {
						t.Fatalf("%v: candidate %s is down or drained", a, c)
					}
				}
			case sched.AssignSlot:
				slot = a.Slot
			case sched.DeleteSlot:
				slot = a.Slot
			default:
				continue
			}
			if touched[slot] {
				t.Fatalf("two actions for slot %s:\n%s", slot, render(acts))
			}
			touched[slot] = true
			for _, f := range w.inflight {
				if f.Slot == slot && now.Sub(f.Sent) < 10*time.Second {
					if _, del := a.(sched.DeleteSlot); !del {
						t.Fatalf("%v for a slot with a reservation in flight", a)
					}
				}
			}
		}
		for id, p := range planned {
			nd := w.nodeRef(id)
			if used := snap.Usage[id].Used.Add(p); !used.Fits(nd.Capacity) {
				t.Fatalf("plan overcommits %s: known %v + planned %v > %v\n%s", id, snap.Usage[id].Used, p, nd.Capacity, render(acts))
			}
		}
	})
}

func shuffle[T any](rng *rand.Rand, s []T) []T {
	out := append([]T(nil), s...)
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}
