package sched_test

import (
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/sched"
)

// agentCase builds a view of one task "a" of web/0 on node n1, created a
// minute before t0, named by its slot (written then), reserved and
// confirmed; the cases change what they need.
type agentView struct {
	task *sched.LocalTask
	v    sched.NodeView
}

func newAgentView(st sched.TaskState, rt sched.RuntimeState) *agentView {
	created := t0.Add(-time.Minute)
	lt := sched.LocalTask{
		Task: sched.Task{ID: "a", Service: "web", Slot: "0", Node: "n1", Version: 1, State: st,
			Created: stampAt(created, "n1"), Resources: sched.Resources{CPUMillis: 100}},
		Spec:    sched.ServiceSpec{Name: "web", Image: "img", Replicas: 1},
		Runtime: sched.Runtime{State: rt},
	}
	if rt != sched.RuntimeNone {
		lt.Runtime.StartedAt = created.Add(time.Second)
		lt.Started = lt.Runtime.StartedAt
	}
	a := &agentView{v: sched.NodeView{
		Node:         "n1",
		Slots:        map[string]sched.Slot{"web/0": {Service: "web", Slot: "0", Task: "a", Node: "n1", Version: 1, Stamp: stampAt(created, "owner")}},
		Reservations: []sched.Reservation{{TaskID: "a", Resources: lt.Resources, Created: created, TTL: 10 * time.Second, Confirmed: true}},
		TTL:          10 * time.Second, Retention: time.Hour,
	}}
	a.v.Tasks = []sched.LocalTask{lt}
	a.task = &a.v.Tasks[0]
	return a
}

func (a *agentView) exited(code int, ago time.Duration) {
	a.task.Runtime.State, a.task.Runtime.ExitCode, a.task.Runtime.ExitedAt = sched.RuntimeExited, code, t0.Add(-ago)
}

func TestAgentDecide(t *testing.T) {
	for _, tc := range []struct {
		name  string
		st    sched.TaskState
		rt    sched.RuntimeState
		build func(a *agentView)
		want  string
	}{
		{
			name: "named pending task: confirm and start",
			st:   sched.TaskPending, rt: sched.RuntimeNone,
			build: func(a *agentView) { a.v.Reservations[0].Confirmed = false },
			want:  "confirm a\nstart a\n",
		},
		{
			name: "unconfirmed task: start, and wait for its slot until the TTL",
			st:   sched.TaskPending, rt: sched.RuntimeNone,
			build: func(a *agentView) {
				a.task.Created = stampAt(t0.Add(-2*time.Second), "n1")
				a.v.Reservations[0].Confirmed = false
				delete(a.v.Slots, "web/0")
			},
			want: "start a\nrequeue at 00:00:08.000 (unconfirmed task)\n",
		},
		{
			name: "starting",
			st:   sched.TaskPending, rt: sched.RuntimeStarting,
			want: "update a state=starting\n",
		},
		{
			name: "running without a health check",
			st:   sched.TaskStarting, rt: sched.RuntimeRunning,
			want: "update a state=running\n",
		},
		{
			name: "nothing new",
			st:   sched.TaskRunning, rt: sched.RuntimeRunning,
			want: "",
		},
		{
			name: "health check not passed yet",
			st:   sched.TaskStarting, rt: sched.RuntimeRunning,
			build: func(a *agentView) { a.task.Spec.Health.Cmd = []string{"true"} },
			want:  "update a state=starting health=starting\n",
		},
		{
			name: "health check passed",
			st:   sched.TaskStarting, rt: sched.RuntimeRunning,
			build: func(a *agentView) {
				a.task.Spec.Health.Cmd = []string{"true"}
				a.task.Runtime.HealthPassed = true
			},
			want: "update a state=running health=healthy\n",
		},
		{
			name: "health check failed Retries times: unhealthy, stop",
			st:   sched.TaskRunning, rt: sched.RuntimeRunning,
			build: func(a *agentView) {
				a.task.Spec.Health = sched.HealthCheck{Cmd: []string{"true"}, Retries: 2}
				a.task.Runtime.HealthPassed, a.task.Runtime.HealthFailures = true, 2
			},
			want: "update a state=unhealthy health=unhealthy error=\"health check failed 2 times in a row\"\nstop a grace=10s: unhealthy\n",
		},
		{
			name: "unhealthy task stopping: wait",
			st:   sched.TaskUnhealthy, rt: sched.RuntimeStopping,
			want: "",
		},
		{
			name: "replaced as lost while it runs (a healed partition): keep it, claim the slot back",
			st:   sched.TaskRunning, rt: sched.RuntimeRunning,
			build: func(a *agentView) {
				a.v.Slots["web/0"] = sched.Slot{Service: "web", Slot: "0", Task: "b", Node: "n2", Lost: "a", Stamp: stampAt(t0.Add(-time.Minute), "owner")}
			},
			want: "claim a: still runs, slot given to b as if it were lost\nrequeue at 00:00:10.000 (slot claimed back)\n",
		},
		{
			name: "superseded by a fresh write while it runs, the slot had named it: claim the slot back",
			st:   sched.TaskRunning, rt: sched.RuntimeRunning,
			build: func(a *agentView) {
				a.v.Slots["web/0"] = sched.Slot{Service: "web", Slot: "0", Task: "b", Node: "n2", Fresh: true, Stamp: stampAt(t0.Add(-time.Minute), "owner")}
			},
			want: "claim a: still runs, slot given to b as if it were lost\nrequeue at 00:00:10.000 (slot claimed back)\n",
		},
		{
			name: "superseded by a fresh write, the slot never named it: superseded",
			st:   sched.TaskRunning, rt: sched.RuntimeRunning,
			build: func(a *agentView) {
				a.v.Slots["web/0"] = sched.Slot{Service: "web", Slot: "0", Task: "b", Node: "n2", Fresh: true, Stamp: stampAt(t0.Add(-time.Minute), "owner")}
				a.v.Reservations[0].Confirmed = false
			},
			want: "stop a grace=10s: superseded by b\n",
		},
		{
			name: "a fresh write naming it: run on",
			st:   sched.TaskRunning, rt: sched.RuntimeRunning,
			build: func(a *agentView) {
				a.v.Slots["web/0"] = sched.Slot{Service: "web", Slot: "0", Task: "a", Node: "n1", Fresh: true, Stamp: stampAt(t0.Add(-time.Minute), "owner")}
			},
			want: "",
		},
		{
			name: "claimed: wait for the owner's answer",
			st:   sched.TaskRunning, rt: sched.RuntimeRunning,
			build: func(a *agentView) {
				a.v.Slots["web/0"] = sched.Slot{Service: "web", Slot: "0", Task: "b", Node: "n2", Lost: "a", Stamp: stampAt(t0.Add(-time.Minute), "owner")}
				a.task.Claim, a.task.ClaimedAt = "b", t0.Add(-time.Second)
			},
			want: "requeue at 00:00:09.000 (slot claimed back)\n",
		},
		{
			name: "claimed, no answer within the TTL: superseded after all",
			st:   sched.TaskRunning, rt: sched.RuntimeRunning,
			build: func(a *agentView) {
				a.v.Slots["web/0"] = sched.Slot{Service: "web", Slot: "0", Task: "b", Node: "n2", Lost: "a", Stamp: stampAt(t0.Add(-time.Minute), "owner")}
				a.task.Claim, a.task.ClaimedAt = "b", t0.Add(-10*time.Second)
			},
			want: "stop a grace=10s: superseded by b\n",
		},
		{
			name: "replaced as lost, container gone (the node died): superseded",
			st:   sched.TaskRunning, rt: sched.RuntimeNone,
			build: func(a *agentView) {
				a.v.Slots["web/0"] = sched.Slot{Service: "web", Slot: "0", Task: "b", Node: "n2", Lost: "a", Stamp: stampAt(t0.Add(-time.Minute), "owner")}
			},
			want: "update a state=stopped error=\"superseded by b\" superseded_at=2024-12-31T23:59:00Z\nrelease a\nrequeue at 01:00:00.000 (remove finished task)\n",
		},
		{
			name: "superseded: stop at once",
			st:   sched.TaskRunning, rt: sched.RuntimeRunning,
			build: func(a *agentView) {
				a.v.Slots["web/0"] = sched.Slot{Service: "web", Slot: "0", Task: "b", Node: "n2", Stamp: stampAt(t0.Add(-time.Second), "owner")}
			},
			want: "stop a grace=10s: superseded by b\n",
		},
		{
			name: "vacated by a stop-first update: stop",
			st:   sched.TaskRunning, rt: sched.RuntimeRunning,
			build: func(a *agentView) {
				a.v.Slots["web/0"] = sched.Slot{Service: "web", Slot: "0", Stamp: stampAt(t0.Add(-time.Second), "owner")}
			},
			want: "stop a grace=10s: slot vacated\n",
		},
		{
			name: "the slot names another task, written before this one existed: wait",
			st:   sched.TaskRunning, rt: sched.RuntimeRunning,
			build: func(a *agentView) {
				a.task.Created = stampAt(t0.Add(-time.Second), "n1")
				a.v.Slots["web/0"] = sched.Slot{Service: "web", Slot: "0", Task: "old", Node: "n2", Stamp: stampAt(t0.Add(-time.Hour), "owner")}
			},
			want: "requeue at 00:00:09.000 (unconfirmed task)\n",
		},
		{
			name: "never named within the TTL: stop",
			st:   sched.TaskRunning, rt: sched.RuntimeRunning,
			build: func(a *agentView) {
				a.v.Slots["web/0"] = sched.Slot{Service: "web", Slot: "0", Task: "old", Node: "n2", Stamp: stampAt(t0.Add(-time.Hour), "owner")}
			},
			want: "stop a grace=10s: reservation expired: the slot never named the task\n",
		},
		{
			name: "slot deleted (scale down, service removed): stop",
			st:   sched.TaskRunning, rt: sched.RuntimeRunning,
			build: func(a *agentView) { delete(a.v.Slots, "web/0") },
			want:  "stop a grace=10s: slot deleted\n",
		},
		{
			name: "superseded and stopped: record it, release, keep it for a while (service ps history)",
			st:   sched.TaskRunning, rt: sched.RuntimeExited,
			build: func(a *agentView) {
				a.v.Slots["web/0"] = sched.Slot{Service: "web", Slot: "0", Task: "b", Node: "n2", Stamp: stampAt(t0.Add(-time.Second), "owner")}
				a.exited(0, time.Second)
			},
			want: "update a state=stopped error=\"superseded by b\" superseded_at=2024-12-31T23:59:59Z\nrelease a\nrequeue at 00:59:59.000 (remove finished task)\n",
		},
		{
			name: "a scheduled job's task run again: kept for three runs, not the retention",
			st:   sched.TaskExited, rt: sched.RuntimeExited,
			build: func(a *agentView) {
				a.task.Spec.Job, a.task.Spec.Schedule = true, "@every 10s"
				a.v.Slots["web/0"] = sched.Slot{Service: "web", Slot: "0", Task: "b", Node: "n2", Stamp: stampAt(t0.Add(-time.Second), "owner")}
				a.exited(0, time.Second)
				a.task.Finished = t0.Add(-time.Second)
				a.v.Reservations = nil
			},
			want: "requeue at 00:00:29.000 (remove finished task)\n",
		},
		{
			name: "superseded, finished long ago: remove",
			st:   sched.TaskStopped, rt: sched.RuntimeExited,
			build: func(a *agentView) {
				a.v.Slots["web/0"] = sched.Slot{Service: "web", Slot: "0", Task: "b", Node: "n2", Stamp: stampAt(t0.Add(-time.Second), "owner")}
				a.v.Reservations = nil
				a.task.Finished = t0.Add(-2 * time.Hour)
			},
			want: "remove a\n",
		},
		{
			name: "slot deleted and stopped: record it, release, remove it at once",
			st:   sched.TaskRunning, rt: sched.RuntimeExited,
			build: func(a *agentView) {
				delete(a.v.Slots, "web/0")
				a.exited(0, time.Second)
			},
			want: "update a state=stopped error=\"slot deleted\"\nrelease a\nremove a\n",
		},
		{
			name: "service removed while running: stop first",
			st:   sched.TaskRunning, rt: sched.RuntimeRunning,
			build: func(a *agentView) {
				delete(a.v.Slots, "web/0")
				a.v.Reservations[0].Confirmed = false
				a.v.Removed = map[string]bool{"web": true}
			},
			want: "stop a grace=10s: service removed\n",
		},
		{
			name: "service removed, task stopped: remove it at once",
			st:   sched.TaskRunning, rt: sched.RuntimeExited,
			build: func(a *agentView) {
				delete(a.v.Slots, "web/0")
				a.v.Reservations[0].Confirmed = false
				a.v.Removed = map[string]bool{"web": true}
				a.exited(143, 100*time.Millisecond)
			},
			want: "update a state=stopped exit=143 error=\"service removed\"\nrelease a\nremove a\n",
		},
		{
			name: "superseded long ago, then the service was removed: remove",
			st:   sched.TaskStopped, rt: sched.RuntimeExited,
			build: func(a *agentView) {
				delete(a.v.Slots, "web/0")
				a.v.Reservations = nil
				a.v.Removed = map[string]bool{"web": true}
				a.task.Finished = t0.Add(-time.Minute)
			},
			want: "remove a\n",
		},
		{
			name: "a failed task its slot still names is kept for its owner",
			st:   sched.TaskFailed, rt: sched.RuntimeExited,
			build: func(a *agentView) {
				a.v.Reservations = nil
				a.task.Finished = t0.Add(-2 * time.Hour)
			},
			want: "",
		},
		{
			name: "crashed: restarting after the first backoff (1s)",
			st:   sched.TaskRunning, rt: sched.RuntimeExited,
			build: func(a *agentView) { a.exited(1, 300*time.Millisecond) },
			want:  "update a state=restarting exit=1\nrequeue at 00:00:00.700 (restart backoff)\n",
		},
		{
			name: "backoff over: restart in place",
			st:   sched.TaskRestarting, rt: sched.RuntimeExited,
			build: func(a *agentView) { a.exited(1, 2*time.Second) },
			want:  "restart a\nupdate a state=starting restarts=1 exit=1\n",
		},
		{
			name: "the backoff doubles",
			st:   sched.TaskRunning, rt: sched.RuntimeExited,
			build: func(a *agentView) { a.task.Restarts, a.task.Inherited = 3, 1; a.exited(1, time.Second) },
			want:  "update a state=restarting restarts=3 exit=1\nrequeue at 00:00:07.000 (restart backoff)\n",
		},
		{
			name: "up to a cap",
			st:   sched.TaskRunning, rt: sched.RuntimeExited,
			build: func(a *agentView) { a.task.Restarts, a.task.Inherited = 12, 12; a.exited(1, time.Second) },
			want:  "update a state=restarting restarts=12 exit=1\nrequeue at 00:00:29.000 (restart backoff)\n",
		},
		{
			name: "failed after its restarts in place: failed, to move",
			st:   sched.TaskRunning, rt: sched.RuntimeExited,
			build: func(a *agentView) {
				a.task.Restarts, a.task.Inherited = 2+sched.InPlaceRestarts, 2
				a.exited(1, time.Second)
			},
			want: "update a state=failed restarts=5 exit=1\nrelease a\n",
		},
		{
			name: "a failure after a stable run stays in place, whatever the count",
			st:   sched.TaskRunning, rt: sched.RuntimeExited,
			build: func(a *agentView) {
				a.task.Restarts = 2 + sched.InPlaceRestarts
				a.exited(1, time.Second)
				a.task.Runtime.StartedAt = a.task.Runtime.ExitedAt.Add(-sched.StableRun)
			},
			want: "update a state=restarting restarts=5 exit=1\nrequeue at 00:00:29.000 (restart backoff)\n",
		},
		{
			name: "a global task's restarts stay in place",
			st:   sched.TaskRunning, rt: sched.RuntimeExited,
			build: func(a *agentView) {
				a.task.Spec.Global, a.task.Spec.Replicas = true, 0
				a.task.Restarts = sched.InPlaceRestarts
				a.exited(1, time.Second)
			},
			want: "update a state=restarting restarts=3 exit=1\nrequeue at 00:00:07.000 (restart backoff)\n",
		},
		{
			name: "exit 0 under always is no failure: in place",
			st:   sched.TaskRunning, rt: sched.RuntimeExited,
			build: func(a *agentView) { a.task.Restarts = sched.InPlaceRestarts; a.exited(0, time.Second) },
			want:  "update a state=restarting restarts=3\nrequeue at 00:00:07.000 (restart backoff)\n",
		},
		{
			name: "could not start: failed at once, to move",
			st:   sched.TaskStarting, rt: sched.RuntimeExited,
			build: func(a *agentView) {
				a.exited(-1, time.Second)
				a.task.Runtime.Error, a.task.Runtime.StartFailed = "no such file", true
			},
			want: "update a state=failed exit=-1 error=\"no such file\"\nrelease a\n",
		},
		{
			name: "a window counts only the restarts within it",
			st:   sched.TaskRunning, rt: sched.RuntimeExited,
			build: func(a *agentView) {
				a.task.Spec.Restart.MaxAttempts, a.task.Spec.Restart.Window = 2, sched.Duration(time.Minute)
				a.task.Restarts, a.task.Inherited = 5, 5
				a.task.RestartTimes = []time.Time{t0.Add(-3 * time.Minute), t0.Add(-50 * time.Second)}
				a.exited(1, time.Second)
			},
			want: "update a state=restarting restarts=5 exit=1\nrequeue at 00:00:29.000 (restart backoff)\n",
		},
		{
			name: "as many restarts within the window as allowed: failed for good",
			st:   sched.TaskRunning, rt: sched.RuntimeExited,
			build: func(a *agentView) {
				a.task.Spec.Restart.MaxAttempts, a.task.Spec.Restart.Window = 2, sched.Duration(time.Minute)
				a.task.Restarts, a.task.Inherited = 5, 5
				a.task.RestartTimes = []time.Time{t0.Add(-50 * time.Second), t0.Add(-10 * time.Second)}
				a.exited(1, time.Second)
			},
			want: "update a state=failed restarts=5 exit=1\nrelease a\n",
		},
		{
			name: "out of attempts: failed for good",
			st:   sched.TaskRunning, rt: sched.RuntimeExited,
			build: func(a *agentView) {
				a.task.Spec.Restart.MaxAttempts, a.task.Restarts = 3, 3
				a.exited(1, time.Second)
			},
			want: "update a state=failed restarts=3 exit=1\nrelease a\n",
		},
		{
			name: "on-failure, exit 0: done",
			st:   sched.TaskRunning, rt: sched.RuntimeExited,
			build: func(a *agentView) {
				a.task.Spec.Restart.Policy = sched.RestartOnFailure
				a.exited(0, time.Second)
			},
			want: "update a state=exited\nrelease a\n",
		},
		{
			name: "never: failed",
			st:   sched.TaskRunning, rt: sched.RuntimeExited,
			build: func(a *agentView) {
				a.task.Spec.Restart.Policy = sched.RestartNever
				a.exited(137, time.Second)
			},
			want: "update a state=failed exit=137\nrelease a\n",
		},
		{
			name: "the container vanished: a crash",
			st:   sched.TaskRunning, rt: sched.RuntimeNone,
			want: "update a state=restarting exit=-1 error=\"container is gone\"\nrequeue at 00:00:01.000 (restart backoff)\n",
		},
		{
			name: "a reservation without a task is released after the TTL",
			st:   sched.TaskRunning, rt: sched.RuntimeRunning,
			build: func(a *agentView) {
				a.v.Reservations = append(a.v.Reservations,
					sched.Reservation{TaskID: "ghost", Created: t0.Add(-time.Minute)},
					sched.Reservation{TaskID: "young", Created: t0.Add(-time.Second)})
			},
			want: "release ghost\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newAgentView(tc.st, tc.rt)
			if tc.build != nil {
				tc.build(a)
			}
			got := render(sched.AgentDecide(a.v, t0))
			if got != tc.want {
				t.Fatalf("actions:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}

// TestReplacementRuns checks when a start-first task may stop at its
// node's shutdown: only once its slot names another task that runs, and
// is healthy if checked, on another node.
func TestReplacementRuns(t *testing.T) {
	old := sched.Task{ID: "web.1", Service: "web", Slot: "1", Node: "a", State: sched.TaskRunning}
	next := sched.Task{ID: "web.2", Service: "web", Slot: "1", Node: "b", State: sched.TaskRunning}
	slot := sched.Slot{Service: "web", Slot: "1", Task: "web.2", Node: "b", Lost: "web.1"}
	for _, c := range []struct {
		name string
		slot sched.Slot
		next func(sched.Task) sched.Task
		want bool
	}{
		{"runs elsewhere", slot, func(n sched.Task) sched.Task { return n }, true},
		{"healthy", slot, func(n sched.Task) sched.Task { n.Health = sched.HealthHealthy; return n }, true},
		{"health still starting", slot, func(n sched.Task) sched.Task { n.Health = sched.HealthStarting; return n }, false},
		{"unhealthy", slot, func(n sched.Task) sched.Task { n.Health = sched.HealthUnhealthy; return n }, false},
		{"still pending", slot, func(n sched.Task) sched.Task { n.State = sched.TaskPending; return n }, false},
		{"on the same node", slot, func(n sched.Task) sched.Task { n.Node = "a"; return n }, false},
		{"slot still names the old task", sched.Slot{Service: "web", Slot: "1", Task: "web.1"}, func(n sched.Task) sched.Task { return n }, false},
		{"slot names a task not read", slot, func(n sched.Task) sched.Task { n.ID = "web.3"; return n }, false},
		{"vacant slot", sched.Slot{Service: "web", Slot: "1"}, func(n sched.Task) sched.Task { n.ID = ""; return n }, false},
	} {
		if got := sched.ReplacementRuns(old, c.slot, c.next(next)); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
