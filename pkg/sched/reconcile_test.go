package sched_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/hlc"
	"github.com/shoal-dev/shoal/pkg/sched"
)

// world is a small cluster as an owner sees it, built up by the cases.
type world struct {
	svc      *sched.Service
	nodes    []sched.Node
	slots    []sched.Slot
	tasks    []sched.Task
	inflight []sched.InFlight
	rejoined time.Time
}

func stampAt(at time.Time, node string) crdt.Stamp {
	return crdt.Stamp{TS: hlc.Timestamp{Wall: at.UnixNano()}, Node: node}
}

func webSpec(replicas int) sched.ServiceSpec {
	return sched.ServiceSpec{Name: "web", Image: "img:1", Replicas: replicas, CPUMillis: 100, MemoryBytes: 128 << 20}
}

// newWorld: nodes n1..n3 (4 CPU, 8GiB), service web version 1 settled.
func newWorld(spec sched.ServiceSpec) *world {
	w := &world{svc: &sched.Service{Name: "web", Spec: spec, Version: 1, Converged: 1, State: sched.ServiceActive}}
	for _, id := range []string{"n1", "n2", "n3"} {
		w.nodes = append(w.nodes, node(id, 4000, 8*gib))
	}
	return w
}

// update changes the spec as `service update` does.
func (w *world) update(change func(*sched.ServiceSpec)) {
	prev := w.svc.Spec
	next := prev
	change(&next)
	w.svc.PrevSpec, w.svc.Spec = &prev, next
	w.svc.Version++
	w.svc.Updated = t0.Add(-time.Minute)
}

func (w *world) nodeRef(id string) *sched.Node {
	for i := range w.nodes {
		if w.nodes[i].ID == id {
			return &w.nodes[i]
		}
	}
	panic("no node " + id)
}

// task adds a task document of the current spec, created at created.
func (w *world) task(id, slot, node string, st sched.TaskState, created time.Time) *sched.Task {
	return w.taskOf(w.svc.Spec, w.svc.Version, id, slot, node, st, created)
}

// crashed adds a task of the current version that exited with code a
// second after it started (within any monitor period), in state st.
func (w *world) crashed(id, slot, node string, st sched.TaskState, created time.Time, code int) {
	t := w.task(id, slot, node, st, created)
	t.Finished, t.ExitCode = t.Started.Add(time.Second), code
}

func (w *world) taskOf(spec sched.ServiceSpec, version int64, id, slot, node string, st sched.TaskState, created time.Time) *sched.Task {
	t := sched.Task{ID: id, Service: "web", Slot: slot, Node: node, Version: version, SpecDigest: spec.Digest(),
		State: st, Created: stampAt(created, node), Resources: spec.Resources()}
	if st == sched.TaskRunning || st.Terminal() || st == sched.TaskRestarting {
		t.Started = created.Add(time.Second)
	}
	w.tasks = append(w.tasks, t)
	return &w.tasks[len(w.tasks)-1]
}

// slot writes a slot document naming task on node at stamp time at.
func (w *world) slot(slot, task, node string, version int64, at time.Time) *sched.Slot {
	for i := range w.slots {
		if w.slots[i].Slot == slot {
			w.slots = slices.Delete(w.slots, i, i+1)
			break
		}
	}
	w.slots = append(w.slots, sched.Slot{Service: "web", Slot: slot, Task: task, Node: node, Version: version, Stamp: stampAt(at, "owner")})
	return &w.slots[len(w.slots)-1]
}

// finished adds a terminal task of the current version named by its slot,
// which ended a second before t0 after restarts restarts.
func (w *world) finished(slot, node string, st sched.TaskState, restarts int) {
	id := "t" + slot
	t := w.task(id, slot, node, st, t0.Add(-time.Hour))
	t.Finished, t.Restarts = t0.Add(-time.Second), restarts
	if st == sched.TaskFailed {
		t.ExitCode = 1
	}
	w.slot(slot, id, node, w.svc.Version, t0.Add(-time.Hour))
}

func jobSpec(completions, maxConcurrent int) sched.ServiceSpec {
	s := webSpec(completions)
	s.Job, s.MaxConcurrent = true, maxConcurrent
	return s
}

func scheduled(s sched.ServiceSpec, schedule string) sched.ServiceSpec {
	s.Schedule = schedule
	return s
}

// ranTwoScaledToThree is a scheduled job whose run (v2, 5 s ago) ran two
// slots to completion, scaled to three since.
func ranTwoScaledToThree(w *world) {
	w.svc.Version, w.svc.RunVersion, w.svc.RunSlots, w.svc.Run = 2, 2, 2, t0.Add(-5*time.Second)
	w.finished("0", "n1", sched.TaskExited, 0)
	w.finished("1", "n2", sched.TaskExited, 0)
	w.update(func(s *sched.ServiceSpec) { s.Replicas = 3 })
}

// globalJobRanOnTwo makes the world's global service a job run every 10
// s whose run (v1, ago before t0) completed on n1 and n2; n4 (zone eu)
// has joined since.
func globalJobRanOnTwo(w *world, ago time.Duration) {
	w.svc.Spec.Job, w.svc.Spec.Schedule, w.svc.Spec.Restart.Policy = true, "@every 10s", sched.RestartOnFailure
	w.finished("n1", "n1", sched.TaskExited, 0)
	w.finished("n2", "n2", sched.TaskExited, 0)
	w.svc.Version, w.svc.RunVersion, w.svc.RunNodes, w.svc.Run = 1, 1, []string{"n1", "n2"}, t0.Add(-ago)
	w.nodes = append(w.nodes, node("n4", 1000, 2*gib, "zone", "eu"))
}

// runningOnEach runs slots 0, 1 and 2 on n1, n2 and n3.
func runningOnEach(w *world) {
	w.running("0", "n1")
	w.running("1", "n2")
	w.running("2", "n3")
}

// running adds a running task of the current version named by its slot.
func (w *world) running(slot, node string) {
	id := "t" + slot
	w.task(id, slot, node, sched.TaskRunning, t0.Add(-time.Hour))
	w.slot(slot, id, node, w.svc.Version, t0.Add(-time.Hour))
}

func (w *world) snapshot() sched.Snapshot {
	return sched.Snapshot{Service: w.svc, Slots: w.slots, Tasks: w.tasks, Nodes: w.nodes,
		Usage: sched.UsageFromTasks(w.tasks), InFlight: w.inflight, TTL: 10 * time.Second, Rejoined: w.rejoined}
}

func counter() func() string {
	i := 0
	return func() string { i++; return fmt.Sprintf("new%d", i) }
}

func render[A fmt.Stringer](acts []A) string {
	var b strings.Builder
	for _, a := range acts {
		b.WriteString(a.String())
		b.WriteByte('\n')
	}
	return b.String()
}

func TestReconcile(t *testing.T) {
	for _, tc := range []struct {
		name  string
		build func(w *world)
		spec  sched.ServiceSpec // webSpec(3) when zero
		now   time.Duration     // after t0
		want  string
	}{
		{
			name:  "initial placement spreads",
			build: func(w *world) { w.svc.Converged = 0 },
			want: `reserve web/0 task=new1 v1 as=task on=n2,n3,n1 fresh
reserve web/1 task=new2 v1 as=task on=n3,n1,n2 fresh
reserve web/2 task=new3 v1 as=task on=n1,n3,n2 fresh
`,
		},
		{
			// n3 alone in zone b takes half the tasks, as Swarm's
			// --placement-pref spread=node.labels.zone does.
			name: "spread over a label's values",
			spec: func() sched.ServiceSpec {
				s := webSpec(4)
				s.Preferences = []string{"spread=node.labels.zone"}
				return s
			}(),
			build: func(w *world) {
				w.svc.Converged = 0
				w.nodeRef("n1").Labels["zone"] = "a"
				w.nodeRef("n2").Labels["zone"] = "a"
				w.nodeRef("n3").Labels["zone"] = "b"
			},
			want: `reserve web/0 task=new1 v1 as=task on=n2,n3,n1 fresh
reserve web/1 task=new2 v1 as=task on=n3,n1,n2 fresh
reserve web/2 task=new3 v1 as=task on=n1,n3,n2 fresh
reserve web/3 task=new4 v1 as=task on=n3,n2,n1 fresh
`,
		},
		{
			name:  "max per node: the slots beyond it stay unschedulable",
			spec:  func() sched.ServiceSpec { s := webSpec(4); s.MaxPerNode = 1; return s }(),
			build: func(w *world) { w.svc.Converged = 0 },
			want: `reserve web/0 task=new1 v1 as=task on=n2 fresh
reserve web/1 task=new2 v1 as=task on=n3 fresh
reserve web/2 task=new3 v1 as=task on=n1 fresh
unschedulable web/3: 3 nodes: 3 run the service's maximum per node (1)
requeue at 00:00:10.000 (retry unschedulable)
`,
		},
		{
			// The owner's slot write can reach it before the task's own
			// document: the task counts on the node the slot names.
			name: "max per node counts a named task whose document has not arrived",
			spec: func() sched.ServiceSpec { s := webSpec(3); s.MaxPerNode = 1; return s }(),
			build: func(w *world) {
				w.running("0", "n3")
				w.slot("1", "t1", "n1", 1, t0.Add(-time.Second))
				// n2 is the smaller node: spread alone would choose n1.
				w.nodeRef("n2").Capacity.MemoryBytes = gib
			},
			want: "reserve web/2 task=new1 v1 as=task on=n2 fresh\nrequeue at 00:00:09.000 (task document not seen yet)\n",
		},
		{
			name: "max per node counts the tasks already there",
			spec: func() sched.ServiceSpec { s := webSpec(4); s.MaxPerNode = 2; return s }(),
			build: func(w *world) {
				w.running("0", "n1")
				w.running("1", "n1")
				w.running("2", "n2")
			},
			want: "reserve web/3 task=new1 v1 as=task on=n3 fresh\n",
		},
		{
			name:  "job: at most max concurrent slots start",
			spec:  jobSpec(3, 1),
			build: func(w *world) { w.svc.Converged = 0 },
			want:  "reserve web/0 task=new1 v1 as=task on=n2,n3,n1 fresh\n",
		},
		{
			name: "job: a completed slot makes room for the next",
			spec: jobSpec(4, 2),
			build: func(w *world) {
				w.svc.Converged = 0
				w.finished("0", "n1", sched.TaskExited, 0)
				w.running("1", "n2")
			},
			want: "reserve web/2 task=new1 v1 as=task on=n3,n1,n2 fresh\n",
		},
		{
			name: "job: a failed slot's replacement holds its room",
			spec: jobSpec(3, 1),
			build: func(w *world) {
				w.svc.Converged = 0
				w.finished("0", "n1", sched.TaskFailed, 0)
			},
			want: "reserve web/0 task=new1 v1 as=task on=n2,n3,n1 restarts=1\n",
		},
		{
			name: "job: running tasks do not converge it",
			spec: jobSpec(2, 0),
			build: func(w *world) {
				w.svc.Converged = 0
				w.running("0", "n1")
				w.finished("1", "n2", sched.TaskExited, 0)
			},
			want: "",
		},
		{
			name: "job: converged once every slot completed or failed for good",
			spec: func() sched.ServiceSpec { s := jobSpec(3, 1); s.Restart.MaxAttempts = 1; return s }(),
			build: func(w *world) {
				w.svc.Converged = 0
				w.finished("0", "n1", sched.TaskExited, 0)
				w.finished("1", "n2", sched.TaskFailed, 1)
				w.finished("2", "n3", sched.TaskExited, 0)
			},
			want: "service web state=active converged=v1: every slot runs version 1\n",
		},
		{
			name: "job: an update runs it again, max concurrent at a time",
			spec: jobSpec(3, 2),
			build: func(w *world) {
				for i, n := range []string{"n1", "n2", "n3"} {
					w.finished(fmt.Sprint(i), n, sched.TaskExited, 0)
				}
				w.update(func(s *sched.ServiceSpec) { s.ForceUpdate++ })
			},
			want: "reserve web/0 task=new1 v2 as=task on=n2,n3,n1\nreserve web/1 task=new2 v2 as=task on=n3,n1,n2\n",
		},
		{
			name: "scheduled job: nothing before its first run",
			spec: scheduled(jobSpec(2, 0), "@every 10s"),
			build: func(w *world) {
				w.svc.Created = stampAt(t0.Add(-5*time.Second), "n1")
			},
			want: "requeue at 00:00:05.000 (next scheduled run)\n",
		},
		{
			// The latest time due, not every missed one.
			name: "scheduled job: its time came",
			spec: scheduled(jobSpec(2, 0), "@every 10s"),
			build: func(w *world) {
				w.svc.Created = stampAt(t0.Add(-25*time.Second), "n1")
			},
			want: "service web state=active run 23:59:55 as v2 of 2 slots: scheduled run of 2024-12-31T23:59:55Z (@every 10s) as version 2\n",
		},
		{
			name: "scheduled job: a run starts its slots again",
			spec: func() sched.ServiceSpec {
				s := scheduled(jobSpec(2, 1), "@every 10s")
				s.Restart.MaxAttempts = 1
				return s
			}(),
			build: func(w *world) {
				w.finished("0", "n1", sched.TaskExited, 0)
				w.finished("1", "n2", sched.TaskFailed, 1) // for good
				w.svc.Version, w.svc.RunVersion, w.svc.Run = 2, 2, t0.Add(-5*time.Second)
			},
			want: "reserve web/0 task=new1 v2 as=task on=n3,n1,n2\nrequeue at 00:00:05.000 (next scheduled run)\n", // n2 last: its task failed
		},
		{
			// The slot of a task of the previous run still running
			// starts the new run once it finishes.
			name: "scheduled job: runs do not overlap in a slot",
			spec: scheduled(jobSpec(1, 0), "@every 10s"),
			build: func(w *world) {
				w.running("0", "n1")
				w.svc.Version, w.svc.RunVersion, w.svc.Run = 2, 2, t0.Add(-5*time.Second)
			},
			want: "requeue at 00:00:05.000 (next scheduled run)\n",
		},
		{
			name: "scheduled job: an update applies from the next run",
			spec: scheduled(jobSpec(2, 0), "@every 10s"),
			build: func(w *world) {
				w.svc.Version, w.svc.RunVersion, w.svc.Run = 2, 2, t0.Add(-5*time.Second)
				w.finished("0", "n1", sched.TaskExited, 0)
				w.finished("1", "n2", sched.TaskExited, 0)
				w.update(func(s *sched.ServiceSpec) { s.Image = "img:2" })
			},
			want: "service web state=active converged=v3: every slot runs version 3\nrequeue at 00:00:05.000 (next scheduled run)\n",
		},
		{
			// A cron job's backup half done is not killed by an update.
			name: "scheduled job: an update leaves the run's running task alone",
			spec: scheduled(jobSpec(2, 0), "@every 10s"),
			build: func(w *world) {
				w.svc.Version, w.svc.RunVersion, w.svc.Run = 2, 2, t0.Add(-5*time.Second)
				w.finished("0", "n1", sched.TaskExited, 0)
				w.running("1", "n2")
				w.update(func(s *sched.ServiceSpec) { s.Image = "img:2" })
			},
			want: "requeue at 00:00:05.000 (next scheduled run)\n",
		},
		{
			// As a Kubernetes CronJob's completions: a scale-up
			// applies from the next run.
			name:  "scheduled job: a scale-up waits for the next run",
			spec:  scheduled(jobSpec(2, 0), "@every 10s"),
			build: ranTwoScaledToThree,
			want:  "service web state=active converged=v3: every slot runs version 3\nrequeue at 00:00:05.000 (next scheduled run)\n",
		},
		{
			name: "scheduled job: the next run runs the scaled-up slots",
			spec: scheduled(jobSpec(2, 0), "@every 10s"),
			build: func(w *world) {
				ranTwoScaledToThree(w)
				w.svc.Version, w.svc.RunVersion, w.svc.RunSlots, w.svc.Run = 4, 4, 3, t0.Add(-time.Second)
			},
			want: `reserve web/0 task=new1 v4 as=task on=n2,n3,n1
reserve web/1 task=new2 v4 as=task on=n3,n1,n2
reserve web/2 task=new3 v4 as=task on=n1,n3,n2 fresh
requeue at 00:00:09.000 (next scheduled run)
`,
		},
		{
			name:  "settled: nothing to do",
			build: func(w *world) { w.running("0", "n1"); w.running("1", "n2"); w.running("2", "n3") },
			want:  ``,
		},
		{
			name: "rollout converged",
			build: func(w *world) {
				w.svc.Converged = 0
				runningOnEach(w)
			},
			want: "service web state=active converged=v1: every slot runs version 1\n",
		},
		{
			name: "scale down deletes the highest slots",
			build: func(w *world) {
				for i, n := range []string{"n1", "n2", "n3", "n1", "n2"} {
					w.running(fmt.Sprint(i), n)
				}
			},
			want: "delete web/3\ndelete web/4\n",
		},
		{
			name: "scale up adds slots on the emptiest nodes",
			spec: webSpec(5),
			build: func(w *world) {
				runningOnEach(w)
				w.running("3", "n1")
			},
			want: "reserve web/4 task=new1 v1 as=task on=n3,n2,n1 fresh\n",
		},
		{
			name: "service removed",
			build: func(w *world) {
				w.running("0", "n1")
				w.running("1", "n2")
				w.svc = nil
			},
			want: "delete web/0\ndelete web/1\n",
		},
		{
			name: "dead node: replace elsewhere, keep the restart count",
			build: func(w *world) {
				runningOnEach(w)
				w.tasks[1].Restarts = 2
				w.nodeRef("n2").Alive = false
			},
			want: "reserve web/1 task=new1 v1 as=task on=n3,n1 restarts=2 lost=t1\n",
		},
		{
			name: "dead node while views converge after a node came back: wait",
			build: func(w *world) {
				runningOnEach(w)
				w.nodeRef("n2").Alive = false
				w.rejoined = t0.Add(-time.Second) // n3 or n1 was just seen alive again
			},
			want: "requeue at 00:00:02.000 (membership converging after a node came back)\n",
		},
		{
			// A partition began as the slot was written: the owner has
			// the task's document but not the slot's.
			name: "slot document not seen, its task on a dead node: replace it as lost",
			build: func(w *world) {
				w.running("0", "n1")
				w.running("2", "n3")
				w.task("t1", "1", "n2", sched.TaskRunning, t0.Add(-time.Second)).Restarts = 2
				w.nodeRef("n2").Alive = false
			},
			want: "reserve web/1 task=new1 v1 as=task on=n3,n1 restarts=2 lost=t1\n",
		},
		{
			name: "slot document not seen, its task on a dead node, views converging: wait",
			build: func(w *world) {
				w.running("0", "n1")
				w.running("2", "n3")
				w.task("t1", "1", "n2", sched.TaskRunning, t0.Add(-time.Second))
				w.nodeRef("n2").Alive = false
				w.rejoined = t0.Add(-time.Second)
			},
			want: "requeue at 00:00:02.000 (membership converging after a node came back)\n",
		},
		{
			name: "dead node, the last node came back long ago: replace at once",
			build: func(w *world) {
				runningOnEach(w)
				w.nodeRef("n2").Alive = false
				w.rejoined = t0.Add(-sched.DefaultSettle)
			},
			want: "reserve web/1 task=new1 v1 as=task on=n3,n1 lost=t1\n",
		},
		{
			name: "replaced as lost, claimed back after the heal: the older task keeps the slot",
			build: func(w *world) {
				runningOnEach(w)
				w.task("x", "1", "n3", sched.TaskRunning, t0.Add(-time.Minute))
				w.slot("1", "x", "n3", 1, t0.Add(-time.Minute)).Lost = "t1"
				w.tasks[1].Claim, w.tasks[1].ClaimedAt = "x", t0.Add(-time.Second)
			},
			want: "assign web/1 task=t1 node=n2 v1\n",
		},
		{
			// A partition began before the slot's and the task's documents
			// reached the other side, whose owner filled the slot knowing
			// nothing of it (fresh) and whose newer write won after the heal.
			name: "fresh write claimed back by the task the slot had named: the older task keeps the slot",
			build: func(w *world) {
				runningOnEach(w)
				w.task("x", "1", "n3", sched.TaskRunning, t0.Add(-time.Minute))
				w.slot("1", "x", "n3", 1, t0.Add(-time.Minute)).Fresh = true
				w.tasks[1].Claim, w.tasks[1].ClaimedAt = "x", t0.Add(-time.Second)
			},
			want: "assign web/1 task=t1 node=n2 v1\n",
		},
		{
			name: "fresh write claimed by a newer task: the fresh write's task keeps the slot, no longer fresh",
			build: func(w *world) {
				w.running("0", "n1")
				w.running("2", "n3")
				w.task("x", "1", "n3", sched.TaskRunning, t0.Add(-time.Hour))
				w.slot("1", "x", "n3", 1, t0.Add(-time.Minute)).Fresh = true
				w.task("y", "1", "n2", sched.TaskRunning, t0.Add(-2*time.Minute)).Claim = "x"
			},
			want: "assign web/1 task=x node=n3 v1\n",
		},
		{
			name: "fresh write claimed by a task from before the service was created again: the fresh write's task keeps it",
			build: func(w *world) {
				runningOnEach(w)
				w.svc.Created = stampAt(t0.Add(-2*time.Minute), "n1")
				w.task("x", "1", "n3", sched.TaskRunning, t0.Add(-time.Minute))
				w.slot("1", "x", "n3", 1, t0.Add(-time.Minute)).Fresh = true
				w.tasks[1].Claim, w.tasks[1].ClaimedAt = "x", t0.Add(-time.Second)
			},
			want: "assign web/1 task=x node=n3 v1\n",
		},
		{
			name: "a claim against a write neither lost nor fresh: nothing to settle",
			build: func(w *world) {
				runningOnEach(w)
				w.task("x", "1", "n3", sched.TaskRunning, t0.Add(-time.Minute))
				w.slot("1", "x", "n3", 1, t0.Add(-time.Minute))
				w.tasks[1].Claim, w.tasks[1].ClaimedAt = "x", t0.Add(-time.Second)
			},
			want: "",
		},
		{
			name: "claimed back by an outdated task: the replacement keeps the slot, without lost",
			build: func(w *world) {
				runningOnEach(w)
				w.update(func(s *sched.ServiceSpec) { s.Image = "img:2" })
				w.svc.Converged = 2
				for i := range w.tasks {
					w.tasks[i].Version, w.tasks[i].SpecDigest = 2, w.svc.Spec.Digest()
				}
				w.tasks[1].SpecDigest = "old"
				w.task("x", "1", "n3", sched.TaskRunning, t0.Add(-time.Minute))
				w.slot("1", "x", "n3", 2, t0.Add(-time.Minute)).Lost = "t1"
				w.tasks[1].Claim, w.tasks[1].ClaimedAt = "x", t0.Add(-time.Second)
			},
			want: "assign web/1 task=x node=n3 v2\n",
		},
		{
			name: "replaced as lost by the other side, the task it replaced runs here: wait for its claim",
			build: func(w *world) {
				w.running("0", "n1")
				w.running("1", "n2")
				w.running("2", "n1")
				w.task("x", "1", "n3", sched.TaskRunning, t0.Add(-time.Minute))
				w.slot("1", "x", "n3", 1, t0.Add(-time.Minute)).Lost = "t1"
				w.nodeRef("n3").Alive = false
			},
			want: "requeue at 00:00:01.000 (slot contested: waiting for t1 to claim it back or stop)\n",
		},
		{
			name: "claimed back, its node still seen dead here: neither revert nor replace",
			build: func(w *world) {
				runningOnEach(w)
				w.slot("1", "t1", "n2", 1, t0.Add(-time.Second))
				w.tasks[1].Claim, w.tasks[1].ClaimedAt = "x", t0.Add(-time.Second)
				w.nodeRef("n2").Alive = false
			},
			want: "requeue at 00:00:02.000 (node of a task that claimed its slot seen dead)\n",
		},
		{
			name: "failed task: replaced after the backoff, counting a restart",
			build: func(w *world) {
				w.running("0", "n1")
				w.tasks[0].State, w.tasks[0].Finished, w.tasks[0].ExitCode = sched.TaskFailed, t0.Add(-2*time.Second), 1
			},
			spec: webSpec(1),
			want: "reserve web/0 task=new1 v1 as=task on=n2,n3,n1 restarts=1\n",
		},
		{
			name: "failed task within its backoff: wait",
			build: func(w *world) {
				w.running("0", "n1")
				w.tasks[0].State, w.tasks[0].Finished, w.tasks[0].Restarts = sched.TaskFailed, t0.Add(-time.Second), 2 // backoff 4s
			},
			spec: webSpec(1),
			want: "requeue at 00:00:03.000 (restart backoff)\n",
		},
		{
			name: "failed task out of restart attempts: leave it",
			build: func(w *world) {
				w.running("0", "n1")
				w.tasks[0].State, w.tasks[0].Finished, w.tasks[0].Restarts = sched.TaskFailed, t0.Add(-time.Hour), 3
			},
			spec: func() sched.ServiceSpec { s := webSpec(1); s.Restart.MaxAttempts = 3; return s }(),
			want: ``,
		},
		{
			name: "exited task under on-failure: done",
			build: func(w *world) {
				w.running("0", "n1")
				w.tasks[0].State, w.tasks[0].Finished = sched.TaskExited, t0.Add(-time.Hour)
			},
			spec: func() sched.ServiceSpec { s := webSpec(1); s.Restart.Policy = sched.RestartOnFailure; return s }(),
			want: ``,
		},
		{
			name: "failed task under never: done",
			build: func(w *world) {
				w.running("0", "n1")
				w.tasks[0].State, w.tasks[0].Finished = sched.TaskFailed, t0.Add(-time.Hour)
			},
			spec: func() sched.ServiceSpec { s := webSpec(1); s.Restart.Policy = sched.RestartNever; return s }(),
			want: ``,
		},
		{
			name: "unhealthy task: replaced",
			build: func(w *world) {
				w.running("0", "n1")
				w.tasks[0].State, w.tasks[0].Finished = sched.TaskUnhealthy, t0.Add(-5*time.Second)
			},
			spec: webSpec(1),
			want: "reserve web/0 task=new1 v1 as=task on=n2,n3,n1 restarts=1\n",
		},
		{
			name: "stopped task (not by its policy): replaced at once",
			build: func(w *world) {
				w.running("0", "n1")
				w.tasks[0].State, w.tasks[0].Finished = sched.TaskStopped, t0
			},
			spec: webSpec(1),
			want: "reserve web/0 task=new1 v1 as=task on=n2,n3,n1\n",
		},
		{
			// Its node stopped it for a slot write this copy of the slot
			// predates (gossip brought the task's stop first): the write
			// decided the slot already.
			name: "task stopped for a slot write not seen yet: wait for it",
			build: func(w *world) {
				w.running("0", "n1")
				w.tasks[0].State, w.tasks[0].Finished = sched.TaskStopped, t0
				w.tasks[0].SupersededAt = t0.Add(-time.Second)
			},
			spec: webSpec(1),
			want: "requeue at 00:00:10.000 (slot write that superseded t0 not seen yet)\n",
		},
		{
			name: "task stopped for a slot write never seen within the TTL: replaced",
			build: func(w *world) {
				w.running("0", "n1")
				w.tasks[0].State, w.tasks[0].Finished = sched.TaskStopped, t0.Add(-10*time.Second)
				w.tasks[0].SupersededAt = t0.Add(-11 * time.Second)
			},
			spec: webSpec(1),
			want: "reserve web/0 task=new1 v1 as=task on=n2,n3,n1\n",
		},
		{
			name: "task stopped for the slot write this copy has: replaced",
			build: func(w *world) {
				w.running("0", "n1")
				w.tasks[0].State, w.tasks[0].Finished = sched.TaskStopped, t0
				w.tasks[0].SupersededAt = t0.Add(-time.Hour)
			},
			spec: webSpec(1),
			want: "reserve web/0 task=new1 v1 as=task on=n2,n3,n1\n",
		},
		{
			name: "drained node: start the replacement first",
			build: func(w *world) {
				runningOnEach(w)
				w.nodeRef("n3").Availability = sched.Drain
			},
			want: "reserve web/2 task=new1 v1 as=next on=n1,n2\n",
		},
		{
			// Swarm's pause: n3 keeps its task and gets no new one.
			name: "paused node: its task stays, a scale-up goes elsewhere",
			spec: webSpec(4),
			build: func(w *world) {
				runningOnEach(w)
				w.nodeRef("n3").Availability = sched.Pause
			},
			want: "reserve web/3 task=new1 v1 as=task on=n2,n1 fresh\n",
		},
		{
			name: "paused node: a failed task is replaced elsewhere",
			build: func(w *world) {
				w.running("0", "n1")
				w.running("1", "n2")
				w.finished("2", "n3", sched.TaskFailed, 0)
				w.nodeRef("n3").Availability = sched.Pause
			},
			want: "reserve web/2 task=new1 v1 as=task on=n1,n2 restarts=1\n",
		},
		{
			name: "labels changed: move the task, replacement first",
			spec: func() sched.ServiceSpec { s := webSpec(1); s.Constraints = []string{"node.labels.zone==eu"}; return s }(),
			build: func(w *world) {
				w.nodeRef("n2").Labels["zone"] = "eu"
				w.running("0", "n1")
			},
			want: "reserve web/0 task=new1 v1 as=next on=n2\n",
		},
		{
			name: "replacement pending: wait",
			build: func(w *world) {
				runningOnEach(w)
				w.nodeRef("n3").Availability = sched.Drain
				w.task("r2", "2", "n1", sched.TaskStarting, t0.Add(-time.Second))
				w.slots[2].Next, w.slots[2].NextNode, w.slots[2].NextVersion = "r2", "n1", 1
			},
			want: ``,
		},
		{
			name: "replacement running: it takes the slot",
			build: func(w *world) {
				runningOnEach(w)
				w.nodeRef("n3").Availability = sched.Drain
				w.task("r2", "2", "n1", sched.TaskRunning, t0.Add(-time.Second))
				w.slots[2].Next, w.slots[2].NextNode, w.slots[2].NextVersion = "r2", "n1", 1
			},
			want: "assign web/2 task=r2 node=n1 v1\n",
		},
		{
			name: "replacement failed: try again",
			build: func(w *world) {
				runningOnEach(w)
				w.nodeRef("n3").Availability = sched.Drain
				w.task("r2", "2", "n1", sched.TaskFailed, t0.Add(-time.Second))
				w.slots[2].Next, w.slots[2].NextNode, w.slots[2].NextVersion = "r2", "n1", 1
			},
			want: "reserve web/2 task=new1 v1 as=next on=n1,n2\n",
		},
		{
			name: "reservation in flight: leave the slot alone",
			spec: webSpec(1),
			build: func(w *world) {
				w.svc.Converged = 0
				w.inflight = []sched.InFlight{{Slot: "0", TaskID: "x", Node: "n1", Sent: t0.Add(-time.Second)}}
			},
			want: "requeue at 00:00:09.000 (reservation in flight)\n",
		},
		{
			name: "reservation in flight past the TTL: place again",
			spec: webSpec(1),
			build: func(w *world) {
				w.svc.Converged = 0
				w.inflight = []sched.InFlight{{Slot: "0", TaskID: "x", Node: "n1", Sent: t0.Add(-11 * time.Second)}}
			},
			want: "reserve web/0 task=new1 v1 as=task on=n2,n3,n1 fresh\n",
		},
		{
			name: "slot names a task not seen yet: wait for it",
			spec: webSpec(1),
			build: func(w *world) {
				w.svc.Converged = 0
				w.slot("0", "x", "n1", 1, t0.Add(-2*time.Second))
			},
			want: "requeue at 00:00:08.000 (task document not seen yet)\n",
		},
		{
			name: "slot names a task that never appeared: place again",
			spec: webSpec(1),
			build: func(w *world) {
				w.svc.Converged = 0
				w.slot("0", "x", "n1", 1, t0.Add(-20*time.Second))
			},
			want: "reserve web/0 task=new1 v1 as=task on=n2,n3,n1\n",
		},
		{
			name: "a previous owner's task without its slot write: adopt it",
			spec: webSpec(1),
			build: func(w *world) {
				w.svc.Converged = 0
				w.task("late", "0", "n2", sched.TaskPending, t0.Add(-2*time.Second))
				w.task("older", "0", "n3", sched.TaskRunning, t0.Add(-3*time.Second))
			},
			want: "assign web/0 task=older node=n3 v1\n",
		},
		{
			name: "an unnamed task past the TTL is not adopted",
			spec: webSpec(1),
			build: func(w *world) {
				w.svc.Converged = 0
				w.task("stale", "0", "n2", sched.TaskRunning, t0.Add(-time.Minute))
			},
			// n2 stops it (no slot named it within the TTL), so it does
			// not count against n2.
			want: "reserve web/0 task=new1 v1 as=task on=n2,n3,n1\n",
		},
		{
			name: "scale up right after a scale down: the stopping tasks do not count",
			spec: webSpec(2),
			build: func(w *world) {
				// Scaled 4 -> 0 -> 2: the slots were deleted, and the four
				// old tasks on n1 and n2 are still stopping.
				for i, n := range []string{"n1", "n2", "n1", "n2"} {
					w.task(fmt.Sprint("old", i), fmt.Sprint(i), n, sched.TaskRunning, t0.Add(-time.Hour))
				}
			},
			want: `reserve web/0 task=new1 v1 as=task on=n2,n3,n1
reserve web/1 task=new2 v1 as=task on=n3,n1,n2
`,
		},
		{
			name: "scale down, update, scale up within the TTL: the old spec's stopping tasks do not count",
			spec: webSpec(2),
			build: func(w *world) {
				old := w.svc.Spec
				for i, n := range []string{"n1", "n2", "n1", "n2"} {
					w.taskOf(old, 1, fmt.Sprint("old", i), fmt.Sprint(i), n, sched.TaskRunning, t0.Add(-2*time.Second))
				}
				w.update(func(s *sched.ServiceSpec) { s.Constraints = []string{"node.name!=nowhere"} })
				w.svc.Converged = 0
			},
			want: `reserve web/0 task=new1 v2 as=task on=n2,n3,n1
reserve web/1 task=new2 v2 as=task on=n3,n1,n2
`,
		},
		{
			name: "a superseded task still stopping does not count",
			build: func(w *world) {
				w.running("0", "n3")
				w.running("1", "n2")
				// n1's task of slot 0, which the slot's write of t0 on n3
				// superseded, has not stopped yet.
				w.task("old0", "0", "n1", sched.TaskRunning, t0.Add(-2*time.Hour))
			},
			want: "reserve web/2 task=new1 v1 as=task on=n1,n3,n2 fresh\n",
		},
		{
			name: "nothing fits: say why",
			spec: func() sched.ServiceSpec { s := webSpec(1); s.MemoryBytes = 16 * gib; return s }(),
			build: func(w *world) {
				w.svc.Converged = 0
				w.nodeRef("n1").Alive = false
			},
			want: `unschedulable web/0: 3 nodes: 2 lack memory (need 16GiB, most free 8GiB), 1 is down
requeue at 00:00:10.000 (retry unschedulable)
`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := tc.spec
			if spec.Name == "" {
				spec = webSpec(3)
			}
			w := newWorld(spec)
			tc.build(w)
			got := render(sched.Reconcile(w.snapshot(), t0.Add(tc.now), counter()))
			if got != tc.want {
				t.Fatalf("actions:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}

func TestReconcileUpdate(t *testing.T) {
	v1 := webSpec(3)
	img2 := func(s *sched.ServiceSpec) { s.Image = "img:2" }
	// settled: v1 everywhere, then `service update --image img:2`.
	settled := func(w *world, upd ...func(*sched.ServiceSpec)) {
		w.running("0", "n1")
		w.running("1", "n2")
		w.running("2", "n3")
		w.update(func(s *sched.ServiceSpec) {
			for _, u := range upd {
				u(s)
			}
		})
	}
	for _, tc := range []struct {
		name  string
		build func(w *world)
		want  string
	}{
		{
			name:  "stop-first: vacate the first slot",
			build: func(w *world) { settled(w, img2) },
			want:  "assign web/0 task=-\n",
		},
		{
			name: "stop-first: wait for the old task to stop",
			build: func(w *world) {
				settled(w, img2)
				w.slot("0", "", "", 0, t0.Add(-time.Second))
			},
			want: "requeue at 00:00:19.000 (waiting for the old task to stop)\n",
		},
		{
			name: "stop-first: old task stopped, place the new version",
			build: func(w *world) {
				settled(w, img2)
				w.slot("0", "", "", 0, t0.Add(-time.Second))
				w.tasks[0].State = sched.TaskStopped
			},
			want: "reserve web/0 task=new1 v2 as=task on=n1,n2,n3\n",
		},
		{
			name: "start-first, parallelism 2: two replacements next to the old tasks",
			build: func(w *world) {
				settled(w, img2, func(s *sched.ServiceSpec) { s.Update.Order, s.Update.Parallelism = sched.StartFirst, 2 })
			},
			want: `reserve web/0 task=new1 v2 as=next on=n2,n3,n1
reserve web/1 task=new2 v2 as=next on=n3,n1,n2
`,
		},
		{
			// Every node runs its one task: no room next to any.
			name: "start-first at the maximum per node: stop-first for the slot",
			build: func(w *world) {
				settled(w, img2, func(s *sched.ServiceSpec) { s.Update.Order, s.MaxPerNode = sched.StartFirst, 1 })
			},
			want: "assign web/0 task=-\n",
		},
		{
			name: "start-first with room under the maximum: next to the old task",
			build: func(w *world) {
				settled(w, img2, func(s *sched.ServiceSpec) { s.Update.Order, s.MaxPerNode = sched.StartFirst, 2 })
			},
			want: "reserve web/0 task=new1 v2 as=next on=n2\n",
		},
		{
			name: "parallelism counts the slots still updating",
			build: func(w *world) {
				settled(w, img2, func(s *sched.ServiceSpec) { s.Update.Order, s.Update.Parallelism = sched.StartFirst, 2 })
				w.task("new0", "0", "n2", sched.TaskStarting, t0.Add(-time.Second))
				w.slots[0].Next, w.slots[0].NextNode, w.slots[0].NextVersion = "new0", "n2", 2
			},
			want: "reserve web/1 task=new1 v2 as=next on=n3,n1,n2\n",
		},
		{
			name: "update delay between batches",
			build: func(w *world) {
				settled(w, img2, func(s *sched.ServiceSpec) { s.Update.Delay = sched.Duration(10 * time.Second) })
				w.task("new0", "0", "n1", sched.TaskRunning, t0.Add(-3*time.Second)) // started t0-2s
				w.slot("0", "new0", "n1", 2, t0.Add(-3*time.Second))
			},
			want: "requeue at 00:00:03.000 (monitoring new task)\n",
		},
		{
			name: "update delay passed: next slot",
			build: func(w *world) {
				settled(w, img2, func(s *sched.ServiceSpec) { s.Update.Delay = sched.Duration(time.Second) })
				w.task("new0", "0", "n1", sched.TaskRunning, t0.Add(-time.Minute))
				w.slot("0", "new0", "n1", 2, t0.Add(-time.Minute))
			},
			want: "assign web/1 task=-\n",
		},
		{
			name: "new task failed within the monitor period: roll back",
			build: func(w *world) {
				settled(w, img2, func(s *sched.ServiceSpec) { s.Update.FailureAction = sched.ActionRollback })
				w.crashed("new0", "0", "n1", sched.TaskFailed, t0.Add(-3*time.Second), 2)
				w.slot("0", "new0", "n1", 2, t0.Add(-3*time.Second))
			},
			want: "service web state=rolling-back rollback to v3: update to version 2 failed: task new0 (slot 0) is failed (exit code 2); rolling back\n",
		},
		{
			name: "new task crash-looping: pause",
			build: func(w *world) {
				settled(w, img2)
				w.crashed("new0", "0", "n1", sched.TaskRestarting, t0.Add(-3*time.Second), 1)
				w.slot("0", "new0", "n1", 2, t0.Add(-3*time.Second))
			},
			want: "service web state=paused: update to version 2 paused: task new0 (slot 0) is restarting (exit code 1)\n",
		},
		{
			name: "a failure within the max failure ratio: repaired, the update goes on",
			build: func(w *world) {
				settled(w, img2, func(s *sched.ServiceSpec) { s.Update.MaxFailureRatio = 0.34 })
				w.crashed("new0", "0", "n1", sched.TaskFailed, t0.Add(-3*time.Second), 2)
				w.slot("0", "new0", "n1", 2, t0.Add(-3*time.Second))
			},
			// n1 ranks last: the spec just failed there.
			want: "reserve web/0 task=new1 v2 as=task on=n2,n3,n1 restarts=1\nassign web/1 task=-\n",
		},
		{
			name: "failures past the max failure ratio: pause",
			build: func(w *world) {
				settled(w, img2, func(s *sched.ServiceSpec) { s.Update.MaxFailureRatio = 0.34 })
				// Slot 0's first new task failed and was replaced; its
				// replacement failed too: two of three slots' worth.
				w.crashed("new0", "0", "n1", sched.TaskFailed, t0.Add(-9*time.Second), 2)
				w.crashed("new1", "0", "n2", sched.TaskFailed, t0.Add(-3*time.Second), 2)
				w.slot("0", "new1", "n2", 2, t0.Add(-3*time.Second))
			},
			want: "service web state=paused: update to version 2 paused: task new0 (slot 0) is failed (exit code 2)\n",
		},
		{
			name: "a failure after the monitor period is no update failure",
			build: func(w *world) {
				settled(w, img2)
				nt := w.task("new0", "0", "n1", sched.TaskFailed, t0.Add(-time.Hour))
				nt.Finished = t0.Add(-time.Minute)
				w.slot("0", "new0", "n1", 2, t0.Add(-time.Hour))
			},
			// Slot 0 is repaired (not throttled) and the rollout goes on;
			// n1's old task t0 is superseded, so n1 runs none that stays,
			// yet it ranks last: the spec failed there a minute ago.
			want: "reserve web/0 task=new1 v2 as=task on=n2,n3,n1 restarts=1\nassign web/1 task=-\n",
		},
		{
			name: "paused: no update steps, repairs keep the old spec",
			build: func(w *world) {
				settled(w, img2)
				w.svc.State = sched.ServicePaused
				w.nodeRef("n2").Alive = false
			},
			want: "reserve web/1 task=new1 v1 as=task on=n3,n1 lost=t1\n",
		},
		{
			name: "rollback done: the old tasks are current again",
			build: func(w *world) {
				settled(w, img2)
				// The rollback wrote spec := v1's under version 3.
				w.svc.Spec, w.svc.PrevSpec = v1, &sched.ServiceSpec{Name: "web", Image: "img:2", Replicas: 3}
				w.svc.Version, w.svc.State = 3, sched.ServiceRollingBack
			},
			want: "service web state=active converged=v3: every slot runs version 3\n",
		},
		{
			name: "rolling back: the rollback's parallelism",
			build: func(w *world) {
				settled(w, img2, func(s *sched.ServiceSpec) { s.Rollback = &sched.UpdateConfig{Parallelism: 2} })
				// The rollback wrote the spec it returns to (its own
				// rollback settings included) under version 3.
				back := webSpec(3)
				back.Image, back.Rollback = "img:0", &sched.UpdateConfig{Parallelism: 2}
				w.svc.Spec, w.svc.Version, w.svc.State = back, 3, sched.ServiceRollingBack
			},
			want: "assign web/0 task=-\nassign web/1 task=-\n",
		},
		{
			name: "updating: the rollback's settings wait for a rollback",
			build: func(w *world) {
				settled(w, img2, func(s *sched.ServiceSpec) { s.Rollback = &sched.UpdateConfig{Parallelism: 2} })
			},
			want: "assign web/0 task=-\n",
		},
		{
			name: "failure during a rollback: pause",
			build: func(w *world) {
				settled(w, img2, func(s *sched.ServiceSpec) { s.Update.FailureAction = sched.ActionRollback })
				w.svc.State = sched.ServiceRollingBack
				w.task("new0", "0", "n1", sched.TaskUnhealthy, t0.Add(-3*time.Second))
				w.slot("0", "new0", "n1", 2, t0.Add(-3*time.Second))
			},
			want: "service web state=paused: rollback to version 2 paused: task new0 (slot 0) is unhealthy\n",
		},
		{
			name: "a lost replacement and an outdated task: one write for the slot",
			build: func(w *world) {
				settled(w, img2)
				w.taskOf(v1, 1, "r", "0", "n2", sched.TaskRunning, t0.Add(-time.Hour)) // an old drain's replacement
				w.nodeRef("n2").Alive = false
				w.slots[0].Next, w.slots[0].NextNode, w.slots[0].NextVersion = "r", "n2", 1
			},
			want: "reserve web/1 task=new1 v2 as=task on=n3,n1 lost=t1\nassign web/0 task=-\n", // n2 is dead: slot 1 too
		},
		{
			name: "a lost replacement next to a fine task: drop it",
			build: func(w *world) {
				runningOnEach(w)
				w.update(func(s *sched.ServiceSpec) {})
				w.svc.Converged = w.svc.Version
				w.taskOf(v1, 1, "r", "0", "n2", sched.TaskFailed, t0.Add(-time.Hour))
				w.slots[0].Next, w.slots[0].NextNode, w.slots[0].NextVersion = "r", "n2", 1
			},
			want: "assign web/0 task=t0 node=n1 v1\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(v1)
			tc.build(w)
			got := render(sched.Reconcile(w.snapshot(), t0, counter()))
			if got != tc.want {
				t.Fatalf("actions:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}

func TestReconcileGlobal(t *testing.T) {
	spec := sched.ServiceSpec{Name: "web", Image: "img:1", Global: true, MemoryBytes: gib, Constraints: []string{"node.labels.zone==eu"}}
	for _, tc := range []struct {
		name  string
		build func(w *world)
		want  string
	}{
		{
			name:  "one slot per eligible node",
			build: func(w *world) {},
			want:  "reserve web/n1 task=new1 v1 as=task on=n1 fresh\nreserve web/n2 task=new2 v1 as=task on=n2 fresh\n",
		},
		{
			name: "a node joins",
			build: func(w *world) {
				w.running("n1", "n1")
				w.running("n2", "n2")
				w.nodes = append(w.nodes, node("n4", 1000, 2*gib, "zone", "eu"))
			},
			want: "reserve web/n4 task=new1 v1 as=task on=n4 fresh\n",
		},
		{
			name: "drained and relabelled nodes lose their slots",
			build: func(w *world) {
				w.running("n1", "n1")
				w.running("n2", "n2")
				w.running("n3", "n3") // labelled eu once
				w.nodeRef("n2").Availability = sched.Drain
			},
			want: "delete web/n2\ndelete web/n3\n",
		},
		{
			// n2's task stays; n3, paused without one, gets none.
			name: "paused nodes keep their tasks and get no new ones",
			build: func(w *world) {
				w.running("n1", "n1")
				w.running("n2", "n2")
				w.nodeRef("n2").Availability = sched.Pause
				w.nodeRef("n3").Availability = sched.Pause
			},
			want: ``,
		},
		{
			// The global counterpart of a scale-up: n4 eligible since
			// the run (n1, n2) runs at the next.
			name:  "global scheduled job: a node that joins waits for the next run",
			build: func(w *world) { globalJobRanOnTwo(w, 5*time.Second) },
			want:  "requeue at 00:00:05.000 (next scheduled run)\n",
		},
		{
			name:  "global scheduled job: the run records its nodes",
			build: func(w *world) { globalJobRanOnTwo(w, 15*time.Second) },
			want:  "service web state=active run 23:59:55 as v2 on n1,n2,n4: scheduled run of 2024-12-31T23:59:55Z (@every 10s) as version 2\n",
		},
		{
			name: "a dead node keeps its slot and gets no replacement",
			build: func(w *world) {
				w.running("n1", "n1")
				w.running("n2", "n2")
				w.nodeRef("n2").Alive = false
			},
			want: ``,
		},
		{
			name: "a node without room",
			build: func(w *world) {
				w.running("n2", "n2")
				w.nodeRef("n1").Capacity.MemoryBytes = gib / 2
			},
			want: `unschedulable web/n1: 1 node: 1 lacks memory (need 1GiB, most free 512MiB)
requeue at 00:00:10.000 (retry unschedulable)
`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(spec)
			w.nodeRef("n1").Labels["zone"] = "eu"
			w.nodeRef("n2").Labels["zone"] = "eu"
			tc.build(w)
			got := render(sched.Reconcile(w.snapshot(), t0, counter()))
			if got != tc.want {
				t.Fatalf("actions:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}

// TestReconcilePlacesNearVolumes: the snapshot's volume replicas reach
// placement. A single task that mounts a volume held on n3 goes there
// first, where without the replicas known the slot's tie-break would
// send it elsewhere; and a replicated service still spreads one task per
// node before any doubles up on the replicas' nodes.
func TestReconcilePlacesNearVolumes(t *testing.T) {
	spec := webSpec(1)
	spec.Volumes = []string{"data:/data"}
	for _, tc := range []struct {
		name     string
		replicas map[string][]string
		want     string
	}{
		{"replicas unknown", nil, "reserve web/0 task=new1 v1 as=task on=n2,n3,n1 fresh\n"},
		{"replica on n3", map[string][]string{"data": {"n3"}}, "reserve web/0 task=new1 v1 as=task on=n3,n2,n1 fresh\n"},
		{"replicas of another volume", map[string][]string{"other": {"n1"}}, "reserve web/0 task=new1 v1 as=task on=n2,n3,n1 fresh\n"},
	} {
		w := newWorld(spec)
		w.svc.Converged = 0
		snap := w.snapshot()
		snap.VolumeReplicas = tc.replicas
		if got := render(sched.Reconcile(snap, t0, counter())); got != tc.want {
			t.Errorf("%s:\ngot  %s\nwant %s", tc.name, got, tc.want)
		}
	}
	spec = webSpec(3)
	spec.Volumes = []string{"data:/data"}
	w := newWorld(spec)
	w.svc.Converged = 0
	snap := w.snapshot()
	snap.VolumeReplicas = map[string][]string{"data": {"n1", "n2"}}
	got := render(sched.Reconcile(snap, t0, counter()))
	firsts := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(got), "\n") {
		_, on, _ := strings.Cut(line, " on=")
		firsts[strings.SplitN(on, ",", 2)[0]] = true
	}
	if len(firsts) != 3 {
		t.Errorf("three slots of a service with a volume on n1 and n2 should each prefer another node:\n%s", got)
	}
}
