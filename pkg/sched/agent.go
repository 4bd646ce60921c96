package sched

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// DefaultRetention is how long a node keeps a finished task that no slot
// names (document and container) before removing it, so `service ps` can
// show recent history. It applies to tasks whose slot lives on (a task
// superseded by its replacement); a task whose service or slot is gone
// (service rm, scale down) is removed as soon as it has stopped, for
// there is no history left to show it in.
const DefaultRetention = time.Hour

// HistoryLimit is how many finished tasks of one slot a node keeps within
// the retention, newest first (Swarm's task history limit is 5 too): a
// task that cannot start is replaced by a new one at every attempt, and
// an hour of attempts would otherwise leave a hundred documents per slot.
const HistoryLimit = 5

// NodeView is what a node's agent decides from: its tasks, the slot
// documents that name (or no longer name) them, and its ledger.
type NodeView struct {
	// Node is this node's ID.
	Node string
	// Tasks are the tasks this node runs or ran.
	Tasks []LocalTask
	// Slots are the slot documents of those tasks' slots, by
	// SlotKey(service, slot); a missing entry means no document.
	Slots map[string]Slot
	// Reservations is the ledger's content (Ledger.Reservations).
	Reservations []Reservation
	// Removed holds services this node saw deleted: their tasks stop at
	// once, without waiting out the TTL that covers a slot document not
	// written yet.
	Removed map[string]bool
	// TTL is the reservation TTL (DefaultTTL when zero); Retention how
	// long superseded finished tasks are kept (DefaultRetention when
	// zero; not for tasks of removed services or slots).
	TTL, Retention time.Duration
}

// LocalTask is one task on this node: its document as this node last wrote
// it, the spec it runs, and what the container runtime says.
type LocalTask struct {
	Task
	Spec    ServiceSpec
	Runtime Runtime
}

// RuntimeState is the container's state as the executor sees it.
type RuntimeState string

// Runtime states.
const (
	// RuntimeNone: no container (not created yet, or gone).
	RuntimeNone RuntimeState = "none"
	// RuntimeStarting: the executor is fetching the image, creating or
	// starting the container.
	RuntimeStarting RuntimeState = "starting"
	RuntimeRunning  RuntimeState = "running"
	// RuntimeStopping: a stop was sent and the container has not exited
	// yet (within the grace period).
	RuntimeStopping RuntimeState = "stopping"
	RuntimeExited   RuntimeState = "exited"
)

// Runtime is the container's status, as the executor observes it.
type Runtime struct {
	State RuntimeState
	// ExitCode and Error describe the last exit (Error: it could not be
	// started, or was killed by the runtime).
	ExitCode int
	Error    string
	// StartFailed: the runtime could not create or start the container
	// (Error says why); it never ran.
	StartFailed         bool
	StartedAt, ExitedAt time.Time
	// HealthPassed is whether a health check has passed since the
	// container started. HealthFailures counts consecutive failed checks
	// since the last pass, not counting those that ended within the
	// spec's StartPeriod of the start (the prober's job).
	HealthPassed   bool
	HealthFailures int
}

// RecordHealthCheck folds the result of one health check, ended at at,
// into the runtime status (the prober calls it): a pass marks the task
// passed and clears the failures; a failure counts unless it ended within
// h.StartPeriod of the container's start, so a slow starter is not
// declared unhealthy before it could have passed.
func (r *Runtime) RecordHealthCheck(h HealthCheck, pass bool, at time.Time) {
	switch {
	case pass:
		r.HealthPassed, r.HealthFailures = true, 0
	case at.Sub(r.StartedAt) >= h.StartPeriod.D():
		r.HealthFailures++
	}
}

// AgentAction is one step AgentDecide asks the node's executor to take:
// StartTask, RestartTask, StopTask, UpdateTask, ClaimTask, ConfirmReservation,
// ReleaseReservation, RemoveTask or Requeue. Each is idempotent given the
// runtime state: the executor ignores a start of a running container, a
// stop of a stopped one, and so on.
type AgentAction interface {
	fmt.Stringer
	isAgentAction()
}

// StartTask creates and starts the task's container (state pending).
type StartTask struct{ TaskID string }

// RestartTask starts the exited container of a task again in place.
type RestartTask struct{ TaskID string }

// StopTask stops a task's container: SIGTERM, then SIGKILL after Grace.
type StopTask struct {
	TaskID string
	Grace  time.Duration
	Reason string
}

// UpdateTask writes the lifecycle fields of the task document.
type UpdateTask struct {
	TaskID            string
	State             TaskState
	Health            Health
	Restarts          int
	ExitCode          int
	Error             string
	Started, Finished time.Time
	// SupersededAt, when set, is the time of the slot write that
	// superseded the task (Task.SupersededAt).
	SupersededAt time.Time
	// RestartTimes, when not nil, replaces Task.RestartTimes (empty:
	// none).
	RestartTimes []time.Time
}

// ShutDownReason is the error recorded on a task that its node stopped
// because its machine shut down.
const ShutDownReason = "stopped: its node shut down"

// StoppedForShutDown is how a node records a task that it stopped because
// its machine shuts down (rt is the stopped container): stopped, a
// terminal state, so that neither the node, once it is back, nor the
// owner's restart policy runs the task again, and the owner replaces it
// at once (as a task stopped by hand; its node is no longer Up either).
func StoppedForShutDown(t Task, rt Runtime, now time.Time) UpdateTask {
	return UpdateTask{TaskID: t.ID, State: TaskStopped, Health: HealthNone, Restarts: t.Restarts, ExitCode: rt.ExitCode,
		Error: ShutDownReason, Started: rt.StartedAt, Finished: cmp.Or(rt.ExitedAt, now)}
}

// ReplacementRuns reports whether task t's slot, handed over at its
// node's shutdown, names another task, next, that runs on another node,
// healthy if it has a health check: a start-first service's task may then
// stop without a gap in service.
func ReplacementRuns(t Task, slot Slot, next Task) bool {
	return slot.Task != "" && slot.Task != t.ID && next.ID == slot.Task && next.Node != t.Node &&
		next.State == TaskRunning && (next.Health == HealthNone || next.Health == HealthHealthy)
}

// ClaimTask writes into a task's document that its container runs although
// the slot write naming Against replaced it as lost (Slot.Lost): the owner
// then gives the slot to the older of the two.
type ClaimTask struct {
	TaskID  string
	Against string
	At      time.Time
}

// ConfirmReservation makes a reservation permanent: its slot names it.
type ConfirmReservation struct{ TaskID string }

// ReleaseReservation returns a reservation's resources to the node.
type ReleaseReservation struct{ TaskID string }

// RemoveTask deletes a finished task's container and document.
type RemoveTask struct{ TaskID string }

func (a StartTask) String() string   { return "start " + a.TaskID }
func (a RestartTask) String() string { return "restart " + a.TaskID }
func (a StopTask) String() string {
	return fmt.Sprintf("stop %s grace=%v: %s", a.TaskID, a.Grace, a.Reason)
}
func (a UpdateTask) String() string {
	s := fmt.Sprintf("update %s state=%s", a.TaskID, a.State)
	if a.Health != "" {
		s += " health=" + string(a.Health)
	}
	if a.Restarts != 0 {
		s += fmt.Sprintf(" restarts=%d", a.Restarts)
	}
	if a.ExitCode != 0 {
		s += fmt.Sprintf(" exit=%d", a.ExitCode)
	}
	if a.Error != "" {
		s += fmt.Sprintf(" error=%q", a.Error)
	}
	if !a.SupersededAt.IsZero() {
		s += " superseded_at=" + a.SupersededAt.UTC().Format(time.RFC3339Nano)
	}
	return s
}
func (a ClaimTask) String() string {
	return fmt.Sprintf("claim %s: still runs, slot given to %s as if it were lost", a.TaskID, a.Against)
}
func (a ConfirmReservation) String() string { return "confirm " + a.TaskID }
func (a ReleaseReservation) String() string { return "release " + a.TaskID }
func (a RemoveTask) String() string         { return "remove " + a.TaskID }

func (StartTask) isAgentAction()          {}
func (RestartTask) isAgentAction()        {}
func (StopTask) isAgentAction()           {}
func (UpdateTask) isAgentAction()         {}
func (ClaimTask) isAgentAction()          {}
func (ConfirmReservation) isAgentAction() {}
func (ReleaseReservation) isAgentAction() {}
func (RemoveTask) isAgentAction()         {}
func (Requeue) isAgentAction()            {}

// SlotKey is the key of a slot in NodeView.Slots: "<service>/<slot>".
func SlotKey(service, slot string) string { return service + "/" + slot }

// AgentDecide decides what a node does about its own tasks now. It is a
// pure function of its arguments. Per task, in order:
//
//   - Wanted or not. A task is wanted while its slot document names it
//     (as task or next; its reservation is then confirmed). It is
//     superseded, and stopped at once, when the slot document was written
//     after the task was created and names another task (or none). A task
//     that no slot names otherwise is waited for until TTL after its
//     creation (its owner may still write the slot), then stopped: its
//     reservation expired, or its slot or service was deleted.
//   - Lifecycle of a wanted task: start a pending task; report starting,
//     then running once the health check passed (at once without one);
//     mark it unhealthy and stop it after Retries consecutive failed
//     checks past StartPeriod; restart an exited container in place per
//     the restart policy with exponential backoff (Delay doubling to
//     MaxDelay) while MaxAttempts allows, showing it as restarting in
//     the meantime; otherwise record it exited or failed for good. A
//     container that could not start at all is failed for its owner to
//     place again, unless the slot is this node's (global).
//   - Bookkeeping: release the reservation of a task that will not run
//     again, release reservations whose task is gone, and remove
//     finished tasks no slot names: at once when their service or slot
//     is gone, after Retention (or HistoryLimit newer ones of the slot)
//     when the slot lives on under another task.
func AgentDecide(v NodeView, now time.Time) []AgentAction {
	d := agent{v: v, now: now, ttl: cmp.Or(v.TTL, DefaultTTL), retention: cmp.Or(v.Retention, DefaultRetention)}
	d.reserved = make(map[string]Reservation, len(v.Reservations))
	for _, r := range v.Reservations {
		d.reserved[r.TaskID] = r
	}
	tasks := slices.Clone(v.Tasks)
	slices.SortFunc(tasks, func(a, b LocalTask) int { return strings.Compare(a.ID, b.ID) })
	known := make(map[string]bool, len(tasks))
	for i := range tasks {
		known[tasks[i].ID] = true
		d.task(&tasks[i])
	}
	for _, r := range v.Reservations {
		if !known[r.TaskID] && !now.Before(r.Created.Add(cmp.Or(r.TTL, d.ttl))) {
			d.emit(ReleaseReservation{TaskID: r.TaskID}) // no task: a leak
		}
	}
	if !d.wake.IsZero() {
		d.out = append(d.out, Requeue{At: d.wake, Why: d.why})
	}
	return d.out
}

type agent struct {
	v              NodeView
	now            time.Time
	ttl, retention time.Duration
	reserved       map[string]Reservation
	history        map[string][]*LocalTask // pastHistory's, by slot key
	out            []AgentAction
	wake           time.Time
	why            string
}

func (d *agent) emit(a AgentAction) { d.out = append(d.out, a) }

func (d *agent) wakeAt(t time.Time, why string) {
	if !t.After(d.now) {
		t = d.now.Add(time.Millisecond)
	}
	if d.wake.IsZero() || t.Before(d.wake) {
		d.wake, d.why = t, why
	}
}

// confirmed reports whether the ledger holds id's reservation confirmed:
// its slot document named it at some point.
func (d *agent) confirmed(id string) bool {
	for _, r := range d.v.Reservations {
		if r.TaskID == id {
			return r.Confirmed
		}
	}
	return false
}

// verdict is what wanted decides about a task.
type verdict struct {
	want bool
	// why says why a task is not wanted.
	why string
	// gone: the task's slot document or service is gone, so no `service
	// ps` history will show it; once stopped it is removed at once.
	gone bool
	// by is the time of the slot write that superseded the task (zero
	// when it is unwanted for another reason).
	by time.Time
}

// wanted says whether t should run, and if not, why.
func (d *agent) wanted(t *LocalTask) verdict {
	sl, ok := d.v.Slots[SlotKey(t.Service, t.Slot)]
	if ok && sl.Names(t.ID) {
		return verdict{want: true}
	}
	if ok && sl.Stamp.Compare(t.Created) > 0 {
		if d.contested(t, sl) {
			return verdict{want: true}
		}
		if sl.Task == "" {
			return verdict{why: "slot vacated", by: sl.Stamp.TS.Time()}
		}
		return verdict{why: "superseded by " + sl.Task, by: sl.Stamp.TS.Time()}
	}
	if !ok && d.v.Removed[t.Service] {
		return verdict{why: "service removed", gone: true}
	}
	if !ok && d.confirmed(t.ID) {
		// The slot once named the task, so a missing document is a
		// deleted one (scale-down, drain), not one not written yet.
		return verdict{why: "slot deleted", gone: true}
	}
	if exp := t.CreatedAt().Add(d.ttl); d.now.Before(exp) {
		d.wakeAt(exp, "unconfirmed task")
		return verdict{want: true}
	}
	if ok {
		return verdict{why: "reservation expired: the slot never named the task"}
	}
	return verdict{why: "slot deleted", gone: true}
}

// contested reports whether t keeps running although the slot write sl
// replaced it as lost: its container runs, so its node was cut off, not
// dead (a partition that healed). Both copies run until the owner, seeing
// t's claim, gives the slot to the older one (DESIGN.md 2: the smaller
// (HLC, node ID) wins) or confirms the replacement; should it not answer
// within the TTL of the claim, t is superseded after all.
//
// A fresh write (Slot.Fresh) is contested the same way by a task the
// slot had named (its reservation confirmed): the write's owner knew
// nothing of the slot, so it did not know of t either. An unconfirmed
// task has no such claim; its reservation expires as usual.
func (d *agent) contested(t *LocalTask, sl Slot) bool {
	if sl.Task == "" || t.State.Terminal() || t.Runtime.State != RuntimeRunning {
		return false
	}
	if sl.Lost != t.ID && (!sl.Fresh || sl.Names(t.ID) || !d.confirmed(t.ID)) {
		return false
	}
	if t.Claim != sl.Task {
		d.emit(ClaimTask{TaskID: t.ID, Against: sl.Task, At: d.now})
		d.wakeAt(d.now.Add(d.ttl), "slot claimed back")
		return true
	}
	if until := t.ClaimedAt.Add(d.ttl); d.now.Before(until) {
		d.wakeAt(until, "slot claimed back")
		return true
	}
	return false
}

func (d *agent) task(t *LocalTask) {
	rt := t.Runtime
	if rt.State == "" {
		rt.State = RuntimeNone
	}
	spec := t.Spec.WithDefaults()
	v := d.wanted(t)
	if res, ok := d.reserved[t.ID]; ok && v.want && !res.Confirmed {
		if sl, ok := d.v.Slots[SlotKey(t.Service, t.Slot)]; ok && sl.Names(t.ID) {
			d.emit(ConfirmReservation{TaskID: t.ID})
		}
	}
	if !v.want || t.State.Terminal() {
		d.finish(t, rt, spec, v)
		return
	}
	switch rt.State {
	case RuntimeNone:
		if t.State == TaskPending {
			d.emit(StartTask{TaskID: t.ID})
			return
		}
		// The container vanished under a task that had one (a host
		// reboot, someone removed it): like a crash.
		rt.State, rt.ExitedAt, rt.ExitCode = RuntimeExited, d.now, -1
		rt.Error = cmp.Or(rt.Error, "container is gone")
		d.exited(t, rt, spec)
	case RuntimeStarting:
		d.update(t, TaskStarting, healthOf(spec, false), t.Restarts, t.ExitCode, t.Error, t.Started, t.Finished)
	case RuntimeRunning:
		d.running(t, rt, spec)
	case RuntimeStopping:
		// A stop is under way (an unhealthy task being stopped is
		// terminal and handled by finish).
	case RuntimeExited:
		d.exited(t, rt, spec)
	}
}

func healthOf(spec ServiceSpec, passed bool) Health {
	switch {
	case !spec.Health.Enabled():
		return HealthNone
	case passed:
		return HealthHealthy
	}
	return HealthStarting
}

func (d *agent) running(t *LocalTask, rt Runtime, spec ServiceSpec) {
	if spec.Health.Enabled() && rt.HealthFailures >= spec.Health.Retries {
		d.update(t, TaskUnhealthy, HealthUnhealthy, t.Restarts, 0,
			fmt.Sprintf("health check failed %d times in a row", rt.HealthFailures), rt.StartedAt, d.now)
		d.emit(StopTask{TaskID: t.ID, Grace: spec.StopGrace.D(), Reason: "unhealthy"})
		return
	}
	// The last exit's code, error and time stay on record while the
	// container runs again.
	if spec.Health.Enabled() && !rt.HealthPassed {
		d.update(t, TaskStarting, HealthStarting, t.Restarts, t.ExitCode, t.Error, rt.StartedAt, t.Finished)
		return
	}
	d.update(t, TaskRunning, healthOf(spec, true), t.Restarts, t.ExitCode, t.Error, rt.StartedAt, t.Finished)
}

// InPlaceRestarts is how many times a task whose container fails is
// restarted on its node before it fails for good there and its owner
// places the replacement, ranking this node after the others (Nomad
// restarts twice in place, then reschedules; Swarm reschedules every
// time). A crash that follows its node (a missing device or kernel
// feature, a full disk, bad memory) thus moves; one that follows the
// image goes round the nodes with the same backoff as in place.
const InPlaceRestarts = 3

// StableRun is how long a container must have run for its failure not to
// count towards moving its task: a crash after that long is no crash loop,
// and the task restarts in place whatever its count (kubelet likewise
// forgets a container's crash backoff after ten minutes of running).
const StableRun = 10 * time.Minute

// exited applies the restart policy to a wanted task whose container
// exited.
//
// A container that exited is restarted in place, a failed one at most
// InPlaceRestarts times unless it ran for StableRun; one that could not
// start at all (StartFailed) is not. Either way the task then fails, unless its slot belongs to this
// node (a global service's), and its owner places the replacement (with
// the same backoff), ranking last the nodes where the spec just failed
// (Request.Failures). What stops a start is often the node's (a missing
// bind path, a host port taken by another process, its containerd or vold
// down), where another node would run the task.
func (d *agent) exited(t *LocalTask, rt Runtime, spec ServiceSpec) {
	failed := rt.ExitCode != 0 || rt.Error != ""
	pol := spec.Restart
	restart := pol.Policy == RestartAlways || pol.Policy == RestartOnFailure && failed
	stable := !rt.StartedAt.IsZero() && rt.ExitedAt.Sub(rt.StartedAt) >= StableRun
	if !spec.Global && (rt.StartFailed || failed && !stable && t.Restarts-t.Inherited >= InPlaceRestarts) {
		restart = false
	}
	if restart && pol.Allows(t.Restarts, t.RestartTimes, rt.ExitedAt) {
		at := rt.ExitedAt.Add(Backoff(pol, t.Restarts))
		if d.now.Before(at) {
			d.update(t, TaskRestarting, healthOf(spec, false), t.Restarts, rt.ExitCode, rt.Error, rt.StartedAt, rt.ExitedAt)
			d.wakeAt(at, "restart backoff")
			return
		}
		d.emit(RestartTask{TaskID: t.ID})
		d.emit(UpdateTask{TaskID: t.ID, State: TaskStarting, Health: healthOf(spec, false), Restarts: t.Restarts + 1,
			ExitCode: rt.ExitCode, Error: rt.Error, Started: rt.StartedAt, Finished: rt.ExitedAt,
			RestartTimes: pol.track(t.RestartTimes, rt.ExitedAt)})
		return
	}
	st := TaskExited
	if failed {
		st = TaskFailed
	}
	d.update(t, st, HealthNone, t.Restarts, rt.ExitCode, rt.Error, rt.StartedAt, rt.ExitedAt)
	d.release(t.ID)
}

// finish winds down a task that is not wanted or is terminal: stop its
// container, record it stopped, release its reservation, and remove it
// once no slot names it: at once if its service or slot is gone, else
// after the retention period.
func (d *agent) finish(t *LocalTask, rt Runtime, spec ServiceSpec, v verdict) {
	why := v.why
	switch rt.State {
	case RuntimeStarting, RuntimeRunning:
		reason := why
		if reason == "" {
			reason = "task is " + string(t.State)
		}
		d.emit(StopTask{TaskID: t.ID, Grace: spec.StopGrace.D(), Reason: reason})
		return
	case RuntimeStopping:
		return
	}
	finished := t.Finished
	if !t.State.Terminal() {
		finished = cmp.Or(rt.ExitedAt, d.now)
		// In the same write as the state: an owner that sees the task
		// stopped also sees that a slot write it may not have yet
		// stopped it.
		d.emit(UpdateTask{TaskID: t.ID, State: TaskStopped, Health: HealthNone, Restarts: t.Restarts, ExitCode: rt.ExitCode,
			Error: cmp.Or(why, rt.Error), Started: rt.StartedAt, Finished: finished, SupersededAt: v.by})
	}
	d.release(t.ID)
	if sl, ok := d.v.Slots[SlotKey(t.Service, t.Slot)]; ok && sl.Names(t.ID) {
		return // its owner still has to replace it
	}
	if v.gone {
		d.emit(RemoveTask{TaskID: t.ID})
		return
	}
	if gone := finished.Add(keepFinished(spec, finished, d.retention)); !d.now.Before(gone) || d.pastHistory(t) {
		d.emit(RemoveTask{TaskID: t.ID})
	} else {
		d.wakeAt(gone, "remove finished task")
	}
}

// keepFinished is how long a superseded task that finished at finished is
// kept: the retention, or for a scheduled job about three runs, so that a
// job run every minute keeps its last few runs' tasks, not sixty.
func keepFinished(spec ServiceSpec, finished time.Time, retention time.Duration) time.Duration {
	if spec.Schedule == "" {
		return retention
	}
	sch, err := ParseSchedule(spec.Schedule)
	if err != nil {
		return retention
	}
	next := sch.Next(finished)
	after := sch.Next(next)
	if next.IsZero() || after.IsZero() {
		return retention
	}
	return min(retention, 3*after.Sub(next))
}

// pastHistory reports whether the finished task t, which no slot names,
// has HistoryLimit newer finished tasks of its slot on this node.
func (d *agent) pastHistory(t *LocalTask) bool {
	if d.history == nil {
		d.history = map[string][]*LocalTask{}
		for i := range d.v.Tasks {
			o := &d.v.Tasks[i]
			k := SlotKey(o.Service, o.Slot)
			if sl, ok := d.v.Slots[k]; o.State.Terminal() && !(ok && sl.Names(o.ID)) {
				d.history[k] = append(d.history[k], o)
			}
		}
		for _, ts := range d.history {
			slices.SortFunc(ts, func(a, b *LocalTask) int {
				return cmp.Or(b.Finished.Compare(a.Finished), strings.Compare(b.ID, a.ID))
			})
		}
	}
	ts := d.history[SlotKey(t.Service, t.Slot)]
	i := slices.IndexFunc(ts, func(o *LocalTask) bool { return o.ID == t.ID })
	return i >= HistoryLimit
}

func (d *agent) release(id string) {
	if _, ok := d.reserved[id]; ok {
		d.emit(ReleaseReservation{TaskID: id})
	}
}

// update emits an UpdateTask when the document differs from what it
// should say.
func (d *agent) update(t *LocalTask, st TaskState, h Health, restarts, exit int, errMsg string, started, finished time.Time) {
	u := UpdateTask{TaskID: t.ID, State: st, Health: h, Restarts: restarts, ExitCode: exit, Error: errMsg, Started: started, Finished: finished}
	if t.State == st && t.Health == h && t.Restarts == restarts && t.ExitCode == exit && t.Error == errMsg &&
		t.Started.Equal(started) && t.Finished.Equal(finished) {
		return
	}
	d.emit(u)
}
