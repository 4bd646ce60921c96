package sched

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Snapshot is everything the owner of one service knows about it, as its
// local replica of state shows it at one moment.
type Snapshot struct {
	// Service is the service document; nil when the service was removed.
	Service *Service
	// Slots are the service's slot documents.
	Slots []Slot
	// Tasks are the service's task documents (any state).
	Tasks []Task
	// Nodes are all nodes that have not left, with the owner's view of
	// their liveness.
	Nodes []Node
	// Usage is the known usage of every node by all services (see
	// UsageFromTasks).
	Usage Usage
	// InFlight are the Reserve calls the executor has sent for this
	// service and not yet finished.
	InFlight []InFlight
	// TTL is the reservation TTL (DefaultTTL when zero).
	TTL time.Duration
	// Rejoined is when a node last came back to life in the owner's
	// membership view (a dead node seen alive again; zero if none).
	// Views converge node by node after a partition heals, so for Settle
	// after that (DefaultSettle when zero) tasks of nodes still seen
	// dead are not replaced: they are likely alive and about to be seen
	// so. A plain node death, with no node coming back, is not delayed.
	Rejoined time.Time
	Settle   time.Duration
	// VolumeReplicas are, per replicated volume by name, the nodes that
	// hold a replica of it (nil when unknown): placement prefers the
	// nodes near a task's volumes (Request.Near).
	VolumeReplicas map[string][]string
}

// DefaultSettle is how long after a node comes back an owner waits before
// replacing the tasks of nodes it still sees dead: about membership's
// suspicion timeout (2s) plus a gossip round, the time other nodes' views
// need to catch up after a heal.
const DefaultSettle = 3 * time.Second

// InFlight is a Reserve the executor is working on: its slot is left
// alone until it finishes (accepted and slot written, or given up) or the
// TTL passes.
type InFlight struct {
	Slot   string
	TaskID string
	// Node is the candidate being asked.
	Node string
	Sent time.Time
}

// Reconcile decides what the owner of one service must do now to move the
// service toward its spec. It is a pure function of its arguments: newID
// supplies task IDs (random in schedd, a counter in tests).
//
// In order, it:
//   - deletes slots the spec no longer has (scale down: the highest; a
//     global service: nodes no longer eligible; everything when the
//     service was removed);
//   - stops a rollout that fails (a new task failed or turned unhealthy
//     within the monitor period) with the update's failure action;
//   - per slot: promotes a started replacement (Next), adopts an
//     unnamed task placed by a previous owner, places a task where the
//     slot is vacant, its task is lost (node down, document never
//     appeared), terminal and replaceable under the restart policy, or
//     misplaced (node drained, labels changed: start the replacement
//     first);
//   - walks outdated slots in batches of update parallelism, update delay
//     apart, start-first (Reserve as Next) or stop-first (vacate the slot,
//     then place once the old task has stopped);
//   - records a completed rollout (SetServiceState with Converged).
//
// A slot with a Reserve in flight, or whose named task has not shown its
// document yet, is left alone until the TTL passes: Reconcile never
// places twice for one slot while an answer may still come.
func Reconcile(s Snapshot, now time.Time, newID func() string) []Action {
	if s.Service == nil {
		var out []Action
		for _, sl := range sortedSlots(s.Slots) {
			out = append(out, DeleteSlot{Service: sl.Service, Slot: sl.Slot})
		}
		return out
	}
	r := newReconciler(s, now, newID)
	r.run()
	return r.finish()
}

// taskStatus is a task's condition as the owner sees it.
type taskStatus int

const (
	stMissing   taskStatus = iota // named, but no task document yet
	stPending                     // pending, starting or restarting on a live node
	stRunning                     // running on a live, active node
	stMisplaced                   // running, but its node is drained or fails the constraints
	stLost                        // its node is down or gone
	stDown                        // terminal: exited, failed, stopped, unhealthy
)

var statusNames = [...]string{"missing", "pending", "running", "misplaced", "lost", "down"}

func (s taskStatus) String() string { return statusNames[s] }

// slotInfo is one desired slot with what the snapshot says about it.
type slotInfo struct {
	name string
	pin  string // global services: the node the slot belongs to
	doc  *Slot  // nil: no slot document
	cur  *Task
	next *Task
	// curSt and nextSt are meaningful when doc names a task / a next.
	curSt, nextSt taskStatus
	// unnamed are the slot's other tasks, oldest first.
	unnamed []*Task
}

type reconciler struct {
	now   time.Time
	newID func() string
	ttl   time.Duration
	// settleUntil: tasks of nodes seen dead are not replaced before.
	settle      time.Duration
	settleUntil time.Time

	svc        *Service
	spec       ServiceSpec // current spec, with defaults
	digest     string
	prev       *ServiceSpec // previous spec, with defaults
	prevDigest string
	req        Request // placement request of the current spec
	reqErr     error
	prevReq    Request

	nodes    map[string]*Node
	nodeList []Node
	tasks    map[string]*Task
	bySlot   map[string][]*Task
	docs     map[string]*Slot
	inflight map[string]InFlight
	allSlots []Slot

	usage  Usage
	counts map[string]int
	// unplaceable remembers, per spec digest, why no node could take a
	// task: usage only grows during a reconcile, so the next slot of
	// the same spec fails the same way without another pass over the
	// nodes.
	unplaceable map[string]string
	// clearNext holds slot writes that only drop a failed replacement;
	// they are emitted at the end unless another action for the slot,
	// which rewrites the whole document anyway, came first.
	clearNext map[string]AssignSlot

	// jobRoom is how many more slots of a replicated job with
	// MaxConcurrent may start this round (-1: no bound).
	jobRoom int

	out  []Action
	wake time.Time
	why  string
}

func newReconciler(s Snapshot, now time.Time, newID func() string) *reconciler {
	r := &reconciler{
		now: now, newID: newID, ttl: cmp.Or(s.TTL, DefaultTTL),
		svc:      s.Service,
		nodes:    make(map[string]*Node, len(s.Nodes)),
		nodeList: s.Nodes,
		tasks:    make(map[string]*Task, len(s.Tasks)),
		bySlot:   map[string][]*Task{},
		docs:     make(map[string]*Slot, len(s.Slots)),
		inflight: map[string]InFlight{},
		allSlots: s.Slots,
		usage:    maps.Clone(s.Usage),
		counts:   map[string]int{},
	}
	if r.usage == nil {
		r.usage = Usage{}
	}
	r.settle = cmp.Or(s.Settle, DefaultSettle)
	if !s.Rejoined.IsZero() {
		r.settleUntil = s.Rejoined.Add(r.settle)
	}
	r.spec = s.Service.Spec.WithDefaults()
	r.spec.Name = s.Service.Name
	r.digest = r.spec.Digest()
	r.req, r.reqErr = NewRequest(r.spec, "")
	r.req.Near = NearVolumes(r.spec.Volumes, s.VolumeReplicas)
	r.req.Failures = FailuresOf(s.Tasks, r.digest, now)
	if s.Service.PrevSpec != nil {
		p := s.Service.PrevSpec.WithDefaults()
		p.Name = s.Service.Name
		r.prev, r.prevDigest = &p, p.Digest()
		r.prevReq, _ = NewRequest(p, "")
		r.prevReq.Near = NearVolumes(p.Volumes, s.VolumeReplicas)
		r.prevReq.Failures = FailuresOf(s.Tasks, r.prevDigest, now)
	}
	for i := range s.Nodes {
		r.nodes[s.Nodes[i].ID] = &s.Nodes[i]
	}
	for i := range s.Tasks {
		t := &s.Tasks[i]
		r.tasks[t.ID] = t
		r.bySlot[t.Slot] = append(r.bySlot[t.Slot], t)
	}
	for _, ts := range r.bySlot {
		slices.SortFunc(ts, func(a, b *Task) int {
			return cmp.Or(a.Created.Compare(b.Created), strings.Compare(a.ID, b.ID))
		})
	}
	for i := range s.Slots {
		r.docs[s.Slots[i].Slot] = &s.Slots[i]
	}
	for _, f := range s.InFlight {
		if now.Before(f.Sent.Add(r.ttl)) {
			r.inflight[f.Slot] = f
			r.counts[f.Node]++
		}
	}
	return r
}

func (r *reconciler) finish() []Action {
	if !r.wake.IsZero() {
		r.out = append(r.out, Requeue{At: r.wake, Why: r.why})
	}
	return r.out
}

// wakeAt asks for a requeue at t (the earliest one wins).
func (r *reconciler) wakeAt(t time.Time, why string) {
	if !t.After(r.now) {
		t = r.now.Add(time.Millisecond)
	}
	if r.wake.IsZero() || t.Before(r.wake) {
		r.wake, r.why = t, why
	}
}

func (r *reconciler) emit(a Action) {
	switch a := a.(type) {
	case AssignSlot:
		delete(r.clearNext, a.Slot)
	case Reserve:
		delete(r.clearNext, a.Slot)
	}
	r.out = append(r.out, a)
}

func (r *reconciler) run() {
	if r.reqErr != nil {
		r.emit(Unschedulable{Service: r.svc.Name, Reason: "invalid spec: " + r.reqErr.Error()})
		return
	}
	if r.spec.Schedule != "" && r.runDue() {
		return // the next round reconciles the run's version
	}
	desired := r.desiredSlots()
	want := make(map[string]bool, len(desired))
	for _, d := range desired {
		want[d.name] = true
	}
	for _, sl := range sortedSlots(r.allSlots) {
		if !want[sl.Slot] {
			r.emit(DeleteSlot{Service: r.svc.Name, Slot: sl.Slot})
		}
	}
	r.countStaying(want)
	infos := make([]*slotInfo, len(desired))
	for i, d := range desired {
		infos[i] = r.classify(d.name, d.pin)
	}
	r.jobRoom = r.jobStartsAllowed(infos)
	rolling := r.svc.Converged < r.svc.Version
	// A job's failed task is its restart policy's business, not a
	// failed update's (Swarm ignores a job's update config).
	if rolling && r.svc.State != ServicePaused && !r.spec.Job && r.checkUpdateFailure(len(desired)) {
		return
	}
	var outdated []*slotInfo
	busy := 0 // slots of the rollout not finished yet
	converged := true
	for _, si := range infos {
		st := r.reconcileSlot(si)
		if st.outdated {
			outdated = append(outdated, si)
		}
		if st.busy {
			busy++
		}
		if !st.done {
			converged = false
		}
	}
	if len(outdated) > 0 {
		converged = false
		if r.svc.State != ServicePaused {
			r.rollout(outdated, busy)
		}
	}
	for _, si := range infos {
		if a, ok := r.clearNext[si.name]; ok {
			r.emit(a)
		}
	}
	if rolling && converged && r.svc.State != ServicePaused {
		r.emit(SetServiceState{Service: r.svc.Name, State: ServiceActive, Converged: r.svc.Version,
			Reason: fmt.Sprintf("every slot runs version %d", r.svc.Version)})
	}
}

// countStaying counts, per node, the service's tasks that will go on
// running (spread). A task its node is stopping does not count: one in a
// slot the spec no longer has, one its slot's document superseded, one
// no document named within the TTL (AgentDecide's rule, less the claims
// of contested tasks, which still count), or an unnamed one of another
// spec, which no owner adopts. Otherwise a scale-up right
// after a scale-down, or a replacement while a superseded task stops,
// would crowd the new tasks onto the nodes the stopping ones leave.
func (r *reconciler) countStaying(want map[string]bool) {
	for _, t := range r.tasks {
		if n := r.nodes[t.Node]; t.State.Terminal() || n == nil || !n.Alive || !want[t.Slot] {
			continue
		}
		if d := r.docs[t.Slot]; t.Claim == "" && (d == nil || !d.Names(t.ID)) {
			superseded := d != nil && d.Stamp.Compare(t.Created) > 0
			// An unnamed task of another spec is never adopted (vacant),
			// so its node stops it once the TTL passes, if not sooner.
			if superseded || !r.current(t) || !r.now.Before(t.CreatedAt().Add(r.ttl)) {
				continue
			}
		}
		r.counts[t.Node]++
	}
	// A task its slot's document names whose own document has not
	// arrived yet (its node writes it, the owner the slot's, and either
	// may come first) counts on the node the slot names, unless it is
	// still in flight here (counted as such): else the next round sees
	// its node without it, and MaxPerNode would not hold.
	for _, d := range r.docs {
		if !want[d.Slot] {
			continue
		}
		for _, named := range [][2]string{{d.Task, d.Node}, {d.Next, d.NextNode}} {
			id, node := named[0], named[1]
			if id == "" || r.tasks[id] != nil || r.inflight[d.Slot].TaskID == id {
				continue
			}
			if n := r.nodes[node]; n != nil && n.Alive {
				r.counts[node]++
			}
		}
	}
}

type desiredSlot struct{ name, pin string }

// desiredSlots lists the slots the spec asks for, in order: 0..replicas-1,
// or one per eligible node (active, or paused with the slot's task still
// named; constraints hold; alive or not, so a node that reboots keeps its
// slot) in node ID order.
func (r *reconciler) desiredSlots() []desiredSlot {
	if r.spec.Schedule != "" && r.svc.RunVersion == 0 {
		return nil // a scheduled job before its first run
	}
	if !r.spec.Global {
		n := r.spec.Replicas
		if r.spec.Schedule != "" && r.svc.RunSlots > 0 {
			n = min(n, int(r.svc.RunSlots))
		}
		out := make([]desiredSlot, n)
		for i := range out {
			out[i].name = strconv.Itoa(i)
		}
		return out
	}
	var out []desiredSlot
	for _, id := range r.eligibleNodes() {
		if r.spec.Schedule != "" && len(r.svc.RunNodes) > 0 && !slices.Contains(r.svc.RunNodes, id) {
			continue // eligible since the run: from the next one
		}
		out = append(out, desiredSlot{name: id, pin: id})
	}
	return out
}

// eligibleNodes are the nodes a global service has a slot on, sorted:
// not drained, its constraints hold, and not paused unless the slot still
// names a task there (a paused node keeps its task and gets none).
func (r *reconciler) eligibleNodes() []string {
	var out []string
	for _, n := range r.nodeList {
		if n.Availability == Drain || !r.matches(&n) {
			continue
		}
		if d := r.docs[n.ID]; n.Availability == Pause && (d == nil || d.Task == "") {
			continue
		}
		out = append(out, n.ID)
	}
	slices.Sort(out)
	return out
}

func (r *reconciler) matches(n *Node) bool {
	for _, c := range r.req.Constraints {
		if !c.Match(*n) {
			return false
		}
	}
	return true
}

// current reports whether t runs the current spec.
func (r *reconciler) current(t *Task) bool {
	if t.SpecDigest == "" {
		return t.Version == r.svc.Version
	}
	return t.SpecDigest == r.digest
}

// status classifies the task id that a slot says runs on node.
func (r *reconciler) status(id, node string) (*Task, taskStatus) {
	t := r.tasks[id]
	if t == nil {
		if n := r.nodes[node]; n == nil || !n.Alive {
			return nil, stLost
		}
		return nil, stMissing
	}
	if t.State.Terminal() {
		return t, stDown
	}
	n := r.nodes[t.Node]
	switch {
	case n == nil || !n.Alive:
		return t, stLost
	case t.State != TaskRunning:
		return t, stPending
	case n.Availability == Drain, r.current(t) && !r.matches(n):
		return t, stMisplaced
	}
	return t, stRunning
}

func (r *reconciler) classify(name, pin string) *slotInfo {
	si := &slotInfo{name: name, pin: pin, doc: r.docs[name]}
	if d := si.doc; d != nil {
		if d.Task != "" {
			si.cur, si.curSt = r.status(d.Task, d.Node)
		}
		if d.Next != "" {
			si.next, si.nextSt = r.status(d.Next, d.NextNode)
		}
	}
	for _, t := range r.bySlot[name] {
		if si.doc == nil || !si.doc.Names(t.ID) {
			si.unnamed = append(si.unnamed, t)
		}
	}
	return si
}

// checkUpdateFailure applies the update's failure action when a task of
// the current version failed within the monitor period (more of them than
// MaxFailureRatio of the service's slots tolerates). It reports whether
// it did (then nothing else happens this round).
func (r *reconciler) checkUpdateFailure(slots int) bool {
	if r.prev == nil {
		return false // a creation, not an update
	}
	monitor := r.walk().Monitor.D()
	var bad *Task
	failures := 0 // of this version's tasks, replaced ones included
	for _, t := range r.tasksSorted() {
		if t.Version != r.svc.Version || !r.current(t) {
			continue
		}
		switch t.State {
		case TaskFailed, TaskUnhealthy, TaskRestarting:
		default:
			continue
		}
		if t.Started.IsZero() || t.Finished.Sub(t.Started) < monitor {
			failures++
			if bad == nil {
				bad = t
			}
		}
	}
	if bad == nil {
		return false
	}
	// Swarm's max_failure_ratio: so many failed slots are tolerated (and
	// repaired as any failed task is) before the update fails.
	if ratio := r.walk().MaxFailureRatio; ratio > 0 && float64(failures) <= ratio*float64(max(1, slots)) {
		return false
	}
	why := fmt.Sprintf("task %s (slot %s) is %s", bad.ID, bad.Slot, bad.State)
	if bad.Error != "" {
		why += ": " + bad.Error
	} else if bad.ExitCode != 0 {
		why += fmt.Sprintf(" (exit code %d)", bad.ExitCode)
	}
	if r.spec.Update.FailureAction == ActionRollback && r.svc.State != ServiceRollingBack {
		r.emit(SetServiceState{
			Service: r.svc.Name, State: ServiceRollingBack,
			Rollback: &Rollback{Spec: *r.svc.PrevSpec, PrevSpec: r.svc.Spec, Version: r.svc.Version + 1},
			Reason:   fmt.Sprintf("update to version %d failed: %s; rolling back", r.svc.Version, why),
		})
		return true
	}
	what := "update"
	if r.svc.State == ServiceRollingBack {
		what = "rollback"
	}
	r.emit(SetServiceState{Service: r.svc.Name, State: ServicePaused,
		Reason: fmt.Sprintf("%s to version %d paused: %s", what, r.svc.Version, why)})
	return true
}

func (r *reconciler) tasksSorted() []*Task {
	out := slices.Collect(maps.Values(r.tasks))
	slices.SortFunc(out, func(a, b *Task) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// slotResult is what reconcileSlot found.
type slotResult struct {
	outdated bool // the slot's running task runs an old spec: update it
	busy     bool // a rollout step of the slot is under way (or monitored)
	done     bool // the slot runs the current version, settled
}

// reconcileSlot repairs one slot; see Reconcile.
func (r *reconciler) reconcileSlot(si *slotInfo) slotResult {
	if f, ok := r.inflight[si.name]; ok {
		r.wakeAt(f.Sent.Add(r.ttl), "reservation in flight")
		return slotResult{busy: true}
	}
	if n := r.nodes[si.pin]; si.pin != "" && !n.Alive {
		// A global slot waits for its node to come back; the rollout
		// does not wait for it.
		return slotResult{done: true}
	}
	d := si.doc
	if d != nil && d.Next != "" {
		switch si.nextSt {
		case stRunning, stMisplaced:
			// The replacement runs: it takes the slot; the old task
			// is now superseded and its node stops it.
			r.emit(AssignSlot{Service: r.svc.Name, Slot: si.name, Task: d.Next, Node: d.NextNode, Version: d.NextVersion})
			return slotResult{busy: true}
		case stPending:
			return slotResult{busy: true}
		case stMissing:
			if r.now.Before(d.Stamp.TS.Time().Add(r.ttl)) {
				r.wakeAt(d.Stamp.TS.Time().Add(r.ttl), "replacement not seen yet")
				return slotResult{busy: true}
			}
		}
		// The replacement is lost or down: forget it and look at the
		// slot again as if it never had one.
		cleared := *d
		cleared.Next, cleared.NextNode, cleared.NextVersion = "", "", 0
		d = &cleared
		if r.clearNext == nil {
			r.clearNext = map[string]AssignSlot{}
		}
		r.clearNext[si.name] = AssignSlot{Service: r.svc.Name, Slot: si.name, Task: d.Task, Node: d.Node, Version: d.Version}
	}
	if d == nil || d.Task == "" {
		return r.vacant(si, d)
	}
	if r.resolveClaim(si, d) {
		return slotResult{}
	}
	t := si.cur
	switch si.curSt {
	case stMissing:
		if r.now.Before(d.Stamp.TS.Time().Add(r.ttl)) {
			r.wakeAt(d.Stamp.TS.Time().Add(r.ttl), "task document not seen yet")
			return slotResult{busy: d.Version == r.svc.Version}
		}
		r.place(si, d, false, "task "+d.Task+" never appeared", 0, nil, "")
	case stPending:
		if r.current(t) {
			return slotResult{busy: t.Version == r.svc.Version}
		}
		return slotResult{}
	case stRunning:
		if !r.current(t) && r.spec.Schedule == "" {
			// A scheduled job's running task is never replaced: an
			// update applies from the next run, which its slot starts
			// once the task finishes (runs do not overlap in a slot).
			return slotResult{outdated: true}
		}
		// A new task counts against the update's parallelism until it
		// has run through the monitor period.
		done := r.monitored(t)
		if r.spec.Job {
			// A job's slot is done when its task finishes: the
			// service converges once the job has run.
			return slotResult{busy: !done}
		}
		return slotResult{done: done, busy: !done}
	case stMisplaced:
		why := "node " + t.Node + " is drained"
		if n := r.nodes[t.Node]; n != nil && n.Availability != Drain {
			why = "node " + t.Node + " no longer meets the constraints"
		}
		r.place(si, d, true, why, t.Restarts, t, "")
	case stLost:
		// Not while membership converges, nor when t claimed its slot
		// back moments ago (see resolveClaim): written by its node
		// then, it is alive and this view of it is late.
		if wait, why := r.holdLost(t); !wait.IsZero() {
			r.wakeAt(wait, why)
			return slotResult{}
		}
		// The task this one replaced as lost is on a node this owner sees
		// alive: the write came from the other side of a partition, so
		// this task's node is likely alive too. Its node will claim the
		// slot back (resolveClaim) or stop it as superseded; meanwhile
		// that task still runs and fills the slot.
		if old := r.tasks[d.Lost]; old != nil && !old.State.Terminal() {
			if n := r.nodes[old.Node]; n != nil && n.Alive {
				r.wakeAt(r.now.Add(time.Second), "slot contested: waiting for "+old.ID+" to claim it back or stop")
				return slotResult{}
			}
		}
		restarts, node := 0, d.Node
		if t != nil {
			restarts, node = t.Restarts, t.Node
		}
		r.place(si, d, false, "node "+node+" is down", restarts, t, d.Task)
	case stDown:
		return r.replaceDown(si, d, t)
	}
	return slotResult{}
}

// resolveClaim settles a slot whose write replaced a task as lost (Lost)
// while that task, its node back from a partition, says it still runs
// (Task.Claim): the older of the two keeps the slot (DESIGN.md 2: the
// smaller (HLC, node ID) wins), and the other's node stops its copy. So a
// heal puts back the tasks that ran before the split instead of stopping
// every one the other side replaced. The replacement keeps the slot when
// the old task could not have it now (outdated, its node drained or no
// longer eligible); that is written too, without Lost, so the old task
// stops at once. It reports whether it wrote the slot.
//
// A fresh write (Slot.Fresh, by an owner that knew nothing of the slot)
// is settled the same way against the oldest task of the slot that
// claims it.
func (r *reconciler) resolveClaim(si *slotInfo, d *Slot) bool {
	if d.Next != "" {
		return false
	}
	var old *Task
	switch {
	case d.Lost != "":
		old = r.tasks[d.Lost]
	case d.Fresh:
		for _, t := range si.unnamed {
			if t.Claim == d.Task && !t.State.Terminal() {
				old = t
				break
			}
		}
	}
	if old == nil || old.Claim != d.Task || old.State.Terminal() {
		return false // no claim against this write (yet)
	}
	n := r.nodes[old.Node]
	if n == nil || !n.Alive {
		return false // its node still looks dead here: wait for the view
	}
	// A task from before the service was last created (removed and
	// created again while it stopped) is not this service's.
	keepOld := old.State == TaskRunning && n.Availability != Drain && r.current(old) && r.matches(n) &&
		(si.cur == nil || old.Created.Compare(si.cur.Created) < 0) && old.Created.Compare(r.svc.Created) > 0
	a := AssignSlot{Service: r.svc.Name, Slot: si.name, Task: d.Task, Node: d.Node, Version: d.Version}
	if keepOld {
		a.Task, a.Node, a.Version = old.ID, old.Node, old.Version
	}
	r.emit(a)
	return true
}

// monitored reports whether a running task of the current version has run
// through the monitor period (the rollout may count it as done).
func (r *reconciler) monitored(t *Task) bool {
	if t.Version != r.svc.Version || r.svc.Converged >= r.svc.Version {
		return true
	}
	end := t.Started.Add(r.walk().Monitor.D())
	if r.now.Before(end) {
		r.wakeAt(end, "monitoring new task")
		return false
	}
	return true
}

// vacant handles a slot without a task: adopt a task placed by an owner
// that did not get to write the slot, wait for a stop-first update's old
// task to stop, or place a new one.
func (r *reconciler) vacant(si *slotInfo, d *Slot) slotResult {
	var created time.Time
	if d != nil {
		created = d.Stamp.TS.Time()
	}
	for _, t := range si.unnamed {
		if d != nil && t.Created.Compare(d.Stamp) <= 0 {
			continue // superseded by the vacating write
		}
		n := r.nodes[t.Node]
		if t.State.Terminal() || n == nil || !n.Alive || n.Availability == Drain || !r.current(t) {
			continue
		}
		if !r.now.Before(t.CreatedAt().Add(r.ttl)) {
			continue // its node stops it: the reservation expired
		}
		r.emit(AssignSlot{Service: r.svc.Name, Slot: si.name, Task: t.ID, Node: t.Node, Version: t.Version})
		return slotResult{busy: t.Version == r.svc.Version}
	}
	// Stop-first: the previous task is still stopping; its capacity
	// frees when it is gone.
	if d != nil {
		limit := created.Add(r.spec.StopGrace.D() + r.ttl)
		for _, t := range si.unnamed {
			n := r.nodes[t.Node]
			if t.State.Terminal() || n == nil || !n.Alive || t.Created.Compare(d.Stamp) > 0 {
				continue
			}
			if r.now.Before(limit) {
				r.wakeAt(limit, "waiting for the old task to stop")
				return slotResult{busy: true}
			}
		}
	}
	restarts := 0
	if d != nil {
		// A slot vacated to update it starts the new version afresh;
		// any other vacancy keeps the count of its last task.
		for _, t := range slices.Backward(si.unnamed) {
			if r.current(t) {
				restarts = t.Restarts
			}
			break
		}
	}
	// A task of this slot on a node seen dead, newer than any vacating
	// write: the slot document naming it has not reached this owner (a
	// partition that began as the slot was written), so the slot only
	// looks vacant. The new task replaces it as lost, so that should its
	// node come back with it still running, it claims the slot back and
	// the older of the two keeps it, as for any lost task (stLost).
	if lost := r.lostUnnamed(si, d); lost != nil {
		if wait, why := r.holdLost(lost); !wait.IsZero() {
			r.wakeAt(wait, why)
			return slotResult{}
		}
		r.place(si, d, false, "node "+lost.Node+" is down", lost.Restarts, lost, lost.ID)
		return slotResult{busy: true}
	}
	if !r.jobStart() {
		return slotResult{}
	}
	r.place(si, d, false, "", restarts, nil, "")
	return slotResult{busy: true}
}

// jobStartsAllowed is how many slots of a replicated job with
// MaxConcurrent may start now: the bound less the slots under way (a
// task named and not finished under its restart policy, or a Reserve in
// flight); -1 when nothing bounds them.
func (r *reconciler) jobStartsAllowed(infos []*slotInfo) int {
	if !r.spec.Job || r.spec.Global || r.spec.MaxConcurrent <= 0 {
		return -1
	}
	room := r.spec.MaxConcurrent
	for _, si := range infos {
		if _, ok := r.inflight[si.name]; ok {
			room--
			continue
		}
		d := si.doc
		if d == nil || (d.Task == "" && d.Next == "") {
			continue
		}
		if d.Next == "" && si.curSt == stDown && r.settled(si.cur) {
			continue // complete, failed for good, or waiting to run again
		}
		room--
	}
	return max(room, 0)
}

// jobStart takes one start from a bounded job's room for this round; it
// reports false when there is none left (the slot waits for a running one
// to finish).
func (r *reconciler) jobStart() bool {
	switch {
	case r.jobRoom < 0:
		return true
	case r.jobRoom == 0:
		return false
	}
	r.jobRoom--
	return true
}

// lostUnnamed returns the newest task of a slot without one that runs, as
// far as this owner knows, on a node it sees dead, and was created after
// the write that vacated the slot (nil if none).
func (r *reconciler) lostUnnamed(si *slotInfo, d *Slot) *Task {
	for _, t := range slices.Backward(si.unnamed) {
		if d != nil && t.Created.Compare(d.Stamp) <= 0 {
			continue
		}
		if n := r.nodes[t.Node]; t.State.Terminal() || (n != nil && n.Alive) {
			continue
		}
		return t
	}
	return nil
}

// holdLost says until when a lost task t is not replaced yet, and why
// (zero: replace it now): while membership converges after a node came
// back, and for a while after t claimed its slot back (its node is alive,
// this view of it is late).
func (r *reconciler) holdLost(t *Task) (time.Time, string) {
	if r.now.Before(r.settleUntil) {
		return r.settleUntil, "membership converging after a node came back"
	}
	if t != nil && t.Claim != "" && r.now.Before(t.ClaimedAt.Add(r.settle)) {
		return t.ClaimedAt.Add(r.settle), "node of a task that claimed its slot seen dead"
	}
	return time.Time{}, ""
}

// replaceDown decides about a slot whose task is terminal.
func (r *reconciler) replaceDown(si *slotInfo, d *Slot, t *Task) slotResult {
	if t.State == TaskStopped && d.Stamp.TS.Time().Before(t.SupersededAt) {
		// t's node stopped it for a slot write newer than this copy of
		// the slot, which gossip has not brought here yet: that write
		// already gave the slot to another task (or vacated it), and a
		// replacement written now would overrule it. Wait for it, for a
		// TTL at most.
		if until := t.Finished.Add(r.ttl); r.now.Before(until) {
			r.wakeAt(until, "slot write that superseded "+t.ID+" not seen yet")
			return slotResult{}
		}
	}
	pol := r.specFor(t).Restart
	restarts := t.Restarts + 1
	if t.State == TaskStopped {
		// Not the restart policy's doing (the reservation expired
		// before the slot named it, or it was stopped by hand):
		// replace at once.
		restarts = t.Restarts
	}
	if r.settled(t) {
		if r.spec.Job && r.runAgain(t) {
			// A new run, or an update of an unscheduled job (--force
			// too): the slot starts afresh with the current spec.
			if !r.jobStart() {
				return slotResult{}
			}
			r.place(si, d, false, "", 0, t, "")
			return slotResult{busy: true}
		}
		// Finished under its restart policy: the slot stays as it is
		// (a scheduled job's, with the spec it ran: an update applies
		// from the next run).
		return slotResult{done: r.current(t) || r.spec.Schedule != ""}
	}
	if t.State != TaskStopped {
		at := t.Finished.Add(Backoff(pol, t.Restarts))
		if r.now.Before(at) {
			r.wakeAt(at, "restart backoff")
			return slotResult{}
		}
	}
	r.place(si, d, false, "task "+t.ID+" is "+string(t.State), restarts, t, "")
	return slotResult{}
}

// runAgain reports whether a job's slot whose task t finished runs again:
// a scheduled job's run came after t's version, or another job's spec
// changed since t (an update runs it again).
func (r *reconciler) runAgain(t *Task) bool {
	if r.spec.Schedule != "" {
		return t.Version < r.svc.RunVersion
	}
	return !r.current(t) && !r.keepPrev(t)
}

// runDue starts a scheduled job's run when its time has come: the latest
// time the schedule names after the last run (or after the service's
// creation) and not after now. Runs missed while no owner was there are
// not made up for, but the latest is. Otherwise it asks to be woken at the
// next one. Every owner computes the same time, so two owners at once
// write the same run.
func (r *reconciler) runDue() bool {
	sch, err := ParseSchedule(r.spec.Schedule)
	if err != nil {
		r.emit(Unschedulable{Service: r.svc.Name, Reason: "invalid spec: " + err.Error()})
		return true
	}
	next := r.svc.nextRun(sch)
	if next.IsZero() {
		return false // a schedule that names no time (Feb 30)
	}
	if next.After(r.now) {
		r.wakeAt(next, "next scheduled run")
		return false
	}
	for range 100_000 { // bounded: a second's schedule over a day's absence
		n := sch.Next(next)
		if n.IsZero() || n.After(r.now) {
			break
		}
		next = n
	}
	v := r.svc.Version + 1
	run := &ScheduledRun{At: next, Version: v}
	if !r.spec.Global {
		run.Slots = int64(r.spec.Replicas)
	} else {
		run.Nodes = r.eligibleNodes()
	}
	r.emit(SetServiceState{Service: r.svc.Name, State: r.svc.State, Run: run,
		Reason: fmt.Sprintf("scheduled run of %s (%s) as version %d", next.UTC().Format(time.RFC3339), r.spec.Schedule, v)})
	return true
}

// settled reports whether the restart policy leaves the slot of the
// terminal task t as it is: t exited and the policy restarts only
// failures (a job's task is then complete), or t failed and the policy
// allows no more restarts.
func (r *reconciler) settled(t *Task) bool {
	pol := r.specFor(t).Restart
	budget := pol.Allows(t.Restarts, t.RestartTimes, t.Finished)
	switch t.State {
	case TaskStopped:
		return false
	case TaskUnhealthy:
		return !budget
	case TaskFailed:
		return !budget || pol.Policy == RestartNever
	case TaskExited:
		return !budget || pol.Policy != RestartAlways
	}
	return false
}

// specFor is the spec a replacement of t runs: the current one, except
// that a paused rollout keeps the slots still on the previous spec there.
func (r *reconciler) specFor(t *Task) ServiceSpec {
	if r.keepPrev(t) {
		return *r.prev
	}
	return r.spec
}

func (r *reconciler) keepPrev(t *Task) bool {
	return r.svc.State == ServicePaused && r.prev != nil && t != nil &&
		t.SpecDigest == r.prevDigest && r.prevDigest != r.digest
}

// walk is how the rollout goes: the update's settings, or during a
// rollback the rollback's if the spec has them (the spec rolled back to,
// as Swarm takes them).
func (r *reconciler) walk() UpdateConfig {
	if r.svc.State == ServiceRollingBack && r.spec.Rollback != nil {
		return *r.spec.Rollback
	}
	return r.spec.Update
}

// rollout starts the next batch of the rolling update.
func (r *reconciler) rollout(outdated []*slotInfo, busy int) {
	u := r.walk()
	var last time.Time
	for _, t := range r.tasks {
		if t.Version == r.svc.Version && r.current(t) && t.Started.After(last) {
			last = t.Started
		}
	}
	if !last.IsZero() && u.Delay > 0 {
		if gate := last.Add(u.Delay.D()); r.now.Before(gate) {
			r.wakeAt(gate, "update delay")
			return
		}
	}
	n := u.Parallelism - busy
	for _, si := range outdated {
		if n <= 0 {
			break
		}
		n--
		if u.Order == StartFirst && !r.startFirstBlocked(si) {
			r.place(si, si.doc, true, "update", 0, si.cur, "")
			continue
		}
		// Stop-first: vacate the slot; its task is superseded and
		// stops. The next rounds place the new one once it is gone.
		r.emit(AssignSlot{Service: r.svc.Name, Slot: si.name})
	}
}

// startFirstBlocked reports whether no node can take a start-first
// replacement of si's task only because of the service's maximum per
// node, which the old task itself takes up on its node (three replicas at
// most one per node on three nodes): the slot is then updated stop-first,
// where Swarm's update would stay stuck.
func (r *reconciler) startFirstBlocked(si *slotInfo) bool {
	if r.req.MaxPerNode == 0 || si.pin != "" || si.cur == nil {
		return false
	}
	req := r.req
	req.Slot, req.Tasks = si.name, r.counts
	if ranked, _ := Place(req, r.nodeList, r.usage); len(ranked) > 0 {
		return false
	}
	req.Tasks = maps.Clone(r.counts)
	req.Tasks[si.cur.Node]--
	ranked, _ := Place(req, r.nodeList, r.usage)
	return len(ranked) > 0
}

// place asks for a new task for si: as the slot's task, or asNext as a
// replacement started next to the running one. old is the task being
// replaced, if any; lost names the task replaced because its node is seen
// down (AssignSlot.Lost).
func (r *reconciler) place(si *slotInfo, d *Slot, asNext bool, why string, restarts int, old *Task, lost string) {
	spec, req, digest, version := r.spec, r.req, r.digest, r.svc.Version
	if r.keepPrev(old) {
		spec, req, digest, version = *r.prev, r.prevReq, r.prevDigest, old.Version
	}
	req.Slot, req.Tasks = si.name, r.counts
	var ranked []string
	var reason string
	if si.pin != "" {
		n := r.nodes[si.pin]
		if n == nil {
			return
		}
		if !n.Alive {
			return // a global slot waits for its node
		}
		if rej := Filter(req, *n, r.usage[n.ID]); rej.OK() {
			ranked = []string{n.ID}
		} else {
			reason = SummarizeRejects(1, []Reject{rej})
		}
	} else if why, known := r.unplaceable[digest]; known {
		reason = why
	} else {
		ranked, reason = Place(req, r.nodeList, r.usage)
		if len(ranked) == 0 {
			if r.unplaceable == nil {
				r.unplaceable = map[string]string{}
			}
			r.unplaceable[digest] = reason
		}
	}
	if len(ranked) == 0 {
		if why != "" {
			reason = why + "; " + reason
		}
		r.emit(Unschedulable{Service: r.svc.Name, Slot: si.name, Reason: reason})
		r.wakeAt(r.now.Add(r.ttl), "retry unschedulable")
		return
	}
	if req.MaxPerNode > 0 && len(ranked) > 1 {
		// The first choice only: the fallbacks were ranked before this
		// round's other slots took their nodes, and a fallback taken
		// after a reject could put one task too many on a node. A
		// rejected reserve is placed again, with fresh counts, next round.
		ranked = ranked[:1]
	}
	id := r.newID()
	// An owner that knows nothing of the slot says so (Slot.Fresh).
	fresh := d == nil && len(si.unnamed) == 0
	assign := AssignSlot{Service: r.svc.Name, Slot: si.name, Task: id, Version: version, Lost: lost, Fresh: fresh}
	if asNext && d != nil {
		assign = AssignSlot{Service: r.svc.Name, Slot: si.name, Task: d.Task, Node: d.Node, Version: d.Version,
			Next: id, NextVersion: version}
	}
	var times []time.Time
	if old != nil && restarts > 0 && spec.Restart.windowed() {
		// The slot's restarts within the window go with it, this
		// replacement's too if it is one (restarts one more).
		times = old.RestartTimes
		if restarts > old.Restarts {
			times = spec.Restart.track(times, old.Finished)
		}
	}
	r.emit(Reserve{
		Service: r.svc.Name, Slot: si.name, TaskID: id, Version: version,
		Spec: spec, SpecDigest: digest, Resources: req.Resources, Ports: req.Ports,
		Restarts: restarts, RestartTimes: times, TTL: r.ttl, Candidates: ranked, Assign: assign,
	})
	r.usage.add(ranked[0], req.Resources, req.Ports)
	r.counts[ranked[0]]++
}

// Backoff is the delay before restart number restarts+1: the policy's
// Delay doubled per restart already made, capped at MaxDelay.
func Backoff(p RestartPolicy, restarts int) time.Duration {
	d, maxD := p.Delay.D(), p.MaxDelay.D()
	if d <= 0 {
		d = DefaultRestartDelay
	}
	if maxD <= 0 {
		maxD = max(DefaultRestartMaxDelay, d)
	}
	for range restarts {
		if d >= maxD {
			break
		}
		d *= 2
	}
	return min(d, maxD)
}

// sortedSlots orders slot documents: replica numbers numerically, then
// other names.
func sortedSlots(slots []Slot) []Slot {
	out := slices.Clone(slots)
	slices.SortFunc(out, func(a, b Slot) int { return compareSlotNames(a.Slot, b.Slot) })
	return out
}

func compareSlotNames(a, b string) int {
	ai, aok := IsReplicaSlot(a)
	bi, bok := IsReplicaSlot(b)
	switch {
	case aok && bok:
		return cmp.Compare(ai, bi)
	case aok:
		return -1
	case bok:
		return 1
	}
	return strings.Compare(a, b)
}
