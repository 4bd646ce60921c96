package sim

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/sched"
)

func itoa(i int) string { return strconv.Itoa(i) }

// ID is the node's ID.
func (n *Node) ID() string { return n.cfg.ID }

// Down reports whether the node is down (killed or partitioned).
func (n *Node) Down() bool { return n.down }

// write sets fields of key at this node's next HLC stamp and returns the
// stamp.
func (n *Node) write(key string, fields map[string]crdt.Value) crdt.Stamp {
	s := crdt.Stamp{TS: n.clock.Now(), Node: n.cfg.ID}
	n.c.st.write(n.cfg.ID, key, crdt.Set(fields, s), n.c.now)
	return s
}

func (n *Node) delete(key string) {
	s := crdt.Stamp{TS: n.clock.Now(), Node: n.cfg.ID}
	n.c.st.write(n.cfg.ID, key, crdt.DeleteDoc(s), n.c.now)
}

// read returns key as this node's replica shows it now.
func (n *Node) read(key string) any {
	lag, longest := n.lag, -1
	for prefix, l := range n.keyLag {
		if strings.HasPrefix(key, prefix) && len(prefix) > longest {
			lag, longest = l, len(prefix)
		}
	}
	return n.c.st.read(n.cfg.ID, key, n.c.now, lag)
}

// Alive is this node's liveness view, sorted.
func (n *Node) Alive() []string {
	if n.alive != nil {
		return slices.Clone(n.alive)
	}
	var out []string
	for _, id := range n.c.order {
		if n.c.seenAlive(n.cfg.ID, id) {
			out = append(out, id)
		}
	}
	return out
}

// seenAlive is the cluster's liveness truth as membership reports it to
// observer: a node that went down, or that a partition put on another
// side, is seen dead DetectDelay later.
func (c *Cluster) seenAlive(observer, id string) bool {
	m := c.nodes[id]
	if m.down && c.now.Sub(m.downAt) >= c.cfg.DetectDelay {
		return false
	}
	return c.reachable(observer, id) || c.now.Sub(c.partAt) < c.cfg.DetectDelay
}

// reachable reports whether a partition leaves a and b on the same side.
func (c *Cluster) reachable(a, b string) bool {
	if c.part == nil {
		return true
	}
	return c.part[a] == c.part[b]
}

func (c *Cluster) tick() {
	for _, id := range c.order {
		if n := c.nodes[id]; !n.down {
			n.step()
		}
	}
	c.check()
	c.scheduleTick(c.now.Add(c.cfg.Tick))
}

// step is one round of a node: its containers move on, its agent acts,
// then it reconciles every service it owns.
func (n *Node) step() {
	n.advanceRuntime()
	for range n.c.cfg.AgentRounds {
		if !n.agentRound() {
			break
		}
	}
	for id, o := range n.observed {
		if n.c.now.Sub(o.At) > n.c.cfg.ObservationAge {
			delete(n.observed, id)
			delete(n.fresh, id)
		}
	}
	alive := sched.Up(n.Alive(), n.cfg.ID, func(id string) bool {
		nd, ok := n.read(sched.NodeKey(id)).(sched.Node)
		return ok && nd.ShutDown
	})
	n.followAlive(alive)
	for _, svc := range slices.Sorted(maps.Keys(n.c.st.services)) {
		if sched.Owner(svc, alive) == n.cfg.ID {
			n.reconcile(svc, alive)
		}
	}
}

// followAlive notes when a node this one had seen alive, then dead, is
// seen alive again (Snapshot.Rejoined), as schedd does from statd's
// membership.
func (n *Node) followAlive(alive []string) {
	now := make(map[string]bool, len(alive))
	for _, id := range alive {
		now[id] = true
		if n.seen[id] && !n.wasAlive[id] {
			n.rejoined = n.c.now
		}
		n.seen[id] = true
	}
	n.wasAlive = now
}

// Owner side.

func (n *Node) reconcile(svc string, alive []string) {
	snap, ok := n.snapshot(svc, alive)
	if !ok {
		return
	}
	n.c.Stats.Reconciles++
	acts := sched.Reconcile(snap, n.c.now, n.c.newID)
	for _, a := range acts {
		n.execOwner(svc, a)
	}
}

func (n *Node) snapshot(svc string, alive []string) (sched.Snapshot, bool) {
	c := n.c
	s := sched.Snapshot{TTL: c.cfg.TTL, Usage: c.st.knownUsage(), Rejoined: n.rejoined, Settle: c.cfg.Settle}
	if v, ok := n.read(sched.ServiceKey(svc)).(*sched.Service); ok {
		s.Service = v
	}
	for _, name := range slices.Sorted(maps.Keys(c.st.slotsBySvc[svc])) {
		if sl, ok := n.read(sched.SlotDocKey(svc, name)).(sched.Slot); ok {
			s.Slots = append(s.Slots, sl)
		}
	}
	if s.Service == nil && len(s.Slots) == 0 {
		return s, false // removed and cleaned up
	}
	for _, id := range slices.Sorted(maps.Keys(c.st.tasksBySvc[svc])) {
		if t, ok := n.read(sched.TaskKey(id)).(sched.Task); ok {
			s.Tasks = append(s.Tasks, t)
		}
	}
	up := make(map[string]bool, len(alive))
	for _, id := range alive {
		up[id] = true
	}
	for _, id := range c.order {
		if nd, ok := n.read(sched.NodeKey(id)).(sched.Node); ok {
			nd.Alive = up[id]
			s.Nodes = append(s.Nodes, nd)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(n.inflight[svc])) {
		s.InFlight = append(s.InFlight, n.inflight[svc][name])
	}
	if c.cfg.ObservationAge > 0 {
		s.Usage = s.Usage.WithObservations(s.Nodes, n.observed, c.now, c.cfg.ObservationAge)
	}
	return s, true
}

func (n *Node) execOwner(svc string, a sched.Action) {
	c := n.c
	switch a := a.(type) {
	case sched.Reserve:
		n.startReserve(a)
	case sched.AssignSlot:
		c.trace(n.cfg.ID, "%v", a)
		n.write(sched.SlotDocKey(a.Service, a.Slot), a.Fields())
		c.Stats.SlotWrites++
	case sched.DeleteSlot:
		c.trace(n.cfg.ID, "%v", a)
		n.delete(sched.SlotDocKey(a.Service, a.Slot))
		c.Stats.SlotWrites++
	case sched.SetServiceState:
		c.trace(n.cfg.ID, "%v", a)
		n.write(sched.ServiceKey(a.Service), a.Fields(c.now))
	case sched.Unschedulable:
		c.trace(n.cfg.ID, "%v", a)
		c.Stats.Unschedulable++
		c.LastUnschedulable[a.Service+"/"+a.Slot] = a.Reason
	case sched.Requeue:
		// Every node reconciles every tick anyway.
	default:
		panic(fmt.Sprintf("sim: unknown action %T", a))
	}
}

// attempt is one Reserve being walked through its candidates.
type attempt struct {
	owner *Node
	a     sched.Reserve
	sent  time.Time
	tried map[string]bool
	why   []sched.Reject
}

func (n *Node) startReserve(a sched.Reserve) {
	if _, busy := n.inflight[a.Service][a.Slot]; busy {
		return
	}
	n.c.trace(n.cfg.ID, "%v", a)
	n.c.Stats.Reserves++
	at := &attempt{owner: n, a: a, sent: n.c.now, tried: map[string]bool{}}
	first, ok := sched.NextCandidate(a, at.tried, n.fresh)
	if !ok {
		first = a.Candidates[0] // every candidate looks full: ask anyway
	}
	n.send(at, first)
}

func (n *Node) send(at *attempt, target string) {
	c := n.c
	m := n.inflight[at.a.Service]
	if m == nil {
		m = map[string]sched.InFlight{}
		n.inflight[at.a.Service] = m
	}
	m[at.a.Slot] = sched.InFlight{Slot: at.a.Slot, TaskID: at.a.TaskID, Node: target, Sent: at.sent}
	c.Stats.Calls++
	c.schedule(c.now.Add(c.cfg.RPCDelay), func() { c.deliver(at, target) })
}

// deliver is the target's Reserve handler.
func (c *Cluster) deliver(at *attempt, target string) {
	t := c.nodes[target]
	if t == nil || t.down || !c.reachable(at.owner.cfg.ID, target) {
		c.schedule(c.now.Add(max(0, c.cfg.RPCTimeout-c.cfg.RPCDelay)), func() {
			at.owner.reply(at, target, false, sched.Resources{}, sched.Reject{Class: sched.RejectGone})
		})
		return
	}
	ok, free, why := t.Ledger.Reserve(at.a.Reservation(), c.now)
	if ok {
		t.accept(at.a)
	} else {
		c.Stats.Rejects++
		c.trace(target, "reject %s/%s task=%s: %v", at.a.Service, at.a.Slot, at.a.TaskID, why)
	}
	c.schedule(c.now.Add(c.cfg.RPCDelay), func() { at.owner.reply(at, target, ok, free, why) })
}

// accept records an accepted task: its document, state pending.
func (n *Node) accept(a sched.Reserve) {
	if _, dup := n.local[a.TaskID]; dup {
		return
	}
	stamp := n.write(sched.TaskKey(a.TaskID), sched.NewTaskFields(a, n.cfg.ID, n.c.now))
	task := sched.NewTask(a, n.cfg.ID)
	task.Created = stamp
	n.local[a.TaskID] = &sched.LocalTask{Task: task, Spec: a.Spec}
	n.c.trace(n.cfg.ID, "accept %s/%s task=%s", a.Service, a.Slot, a.TaskID)
}

func (n *Node) reply(at *attempt, target string, ok bool, free sched.Resources, why sched.Reject) {
	c := n.c
	if n.down {
		return // the owner is gone; its reservation expires on the target
	}
	if why.Class != sched.RejectGone && c.cfg.ObservationAge > 0 {
		n.observed[target] = sched.Observation{Free: free, At: c.now}
		n.fresh[target] = free
	}
	if cur, busy := n.inflight[at.a.Service][at.a.Slot]; !busy || cur.TaskID != at.a.TaskID {
		return // forgotten (the owner restarted)
	}
	if ok {
		c.Stats.Accepts++
		a := at.a.Accepted(target)
		c.trace(n.cfg.ID, "%v", a)
		n.write(sched.SlotDocKey(a.Service, a.Slot), a.Fields())
		c.Stats.SlotWrites++
		delete(n.inflight[at.a.Service], at.a.Slot)
		return
	}
	at.tried[target] = true
	at.why = append(at.why, why)
	next, more := sched.NextCandidate(at.a, at.tried, n.fresh)
	if !more {
		delete(n.inflight[at.a.Service], at.a.Slot)
		c.Stats.Unschedulable++
		reason := sched.SummarizeRejects(len(at.why), at.why)
		c.LastUnschedulable[at.a.Service+"/"+at.a.Slot] = "every candidate refused: " + reason
		c.trace(n.cfg.ID, "unschedulable %s/%s: every candidate refused: %s", at.a.Service, at.a.Slot, reason)
		return
	}
	c.Stats.Retries++
	n.send(at, next)
}

// Agent side.

// advanceRuntime moves the fake containers on to now: exits and health
// checks.
func (n *Node) advanceRuntime() {
	now := n.c.now
	for _, id := range slices.Sorted(maps.Keys(n.runtime)) {
		ct := n.runtime[id]
		lt := n.local[id]
		if ct.state != sched.RuntimeRunning || lt == nil {
			continue
		}
		exitAt := time.Time{}
		if ct.behavior.RunFor > 0 {
			exitAt = ct.started.Add(ct.behavior.RunFor)
		}
		h := lt.Spec.WithDefaults().Health
		for h.Enabled() && !ct.nextCheck.After(now) && (exitAt.IsZero() || ct.nextCheck.Before(exitAt)) {
			r := sched.Runtime{StartedAt: ct.started, HealthPassed: ct.passed, HealthFailures: ct.failures}
			r.RecordHealthCheck(h, !ct.behavior.Unhealthy, ct.nextCheck)
			ct.passed, ct.failures = r.HealthPassed, r.HealthFailures
			ct.nextCheck = ct.nextCheck.Add(h.Interval.D())
		}
		if !exitAt.IsZero() && !exitAt.After(now) {
			ct.state, ct.exited, ct.exitCode = sched.RuntimeExited, exitAt, ct.behavior.ExitCode
		}
	}
}

// View is what this node's agent decides from.
func (n *Node) View() sched.NodeView {
	v := sched.NodeView{
		Node: n.cfg.ID, Slots: map[string]sched.Slot{}, Reservations: n.Ledger.Reservations(),
		TTL: n.c.cfg.TTL, Retention: n.c.cfg.Retention,
	}
	for _, id := range slices.Sorted(maps.Keys(n.local)) {
		lt := *n.local[id]
		lt.Runtime = sched.Runtime{State: sched.RuntimeNone}
		if ct := n.runtime[id]; ct != nil {
			lt.Runtime = sched.Runtime{
				State: ct.state, ExitCode: ct.exitCode, Error: ct.err, StartFailed: ct.notRun, StartedAt: ct.started, ExitedAt: ct.exited,
				HealthPassed: ct.passed, HealthFailures: ct.failures,
			}
		}
		v.Tasks = append(v.Tasks, lt)
		k := sched.SlotKey(lt.Service, lt.Slot)
		if _, seen := v.Slots[k]; !seen {
			if sl, ok := n.read(sched.SlotDocKey(lt.Service, lt.Slot)).(sched.Slot); ok {
				v.Slots[k] = sl
			}
		}
	}
	return v
}

// agentRound runs AgentDecide once and executes its actions; it reports
// whether there were any.
func (n *Node) agentRound() bool {
	acts := sched.AgentDecide(n.View(), n.c.now)
	did := false
	for _, a := range acts {
		if _, ok := a.(sched.Requeue); ok {
			continue
		}
		did = true
		n.execAgent(a)
	}
	return did
}

func (n *Node) execAgent(a sched.AgentAction) {
	c := n.c
	now := c.now
	switch a := a.(type) {
	case sched.StartTask:
		n.start(a.TaskID)
	case sched.RestartTask:
		n.start(a.TaskID)
	case sched.StopTask:
		if ct := n.runtime[a.TaskID]; ct != nil && (ct.state == sched.RuntimeRunning || ct.state == sched.RuntimeStarting) {
			c.trace(n.cfg.ID, "%v", a)
			c.Stats.Stops++
			ct.state, ct.exited, ct.exitCode = sched.RuntimeExited, now, 0
		}
	case sched.UpdateTask:
		n.writeTask(a, a.TaskID, a.Fields(), a.Apply)
	case sched.ClaimTask:
		n.writeTask(a, a.TaskID, a.Fields(), a.Apply)
	case sched.ConfirmReservation:
		n.Ledger.Confirm(a.TaskID)
	case sched.ReleaseReservation:
		c.trace(n.cfg.ID, "%v", a)
		n.Ledger.Release(a.TaskID)
	case sched.RemoveTask:
		c.trace(n.cfg.ID, "%v", a)
		delete(n.runtime, a.TaskID)
		delete(n.local, a.TaskID)
		n.delete(sched.TaskKey(a.TaskID))
	default:
		panic(fmt.Sprintf("sim: unknown agent action %T", a))
	}
}

// writeTask writes fields of a local task's document and applies the same
// change to the node's record of it.
func (n *Node) writeTask(a sched.AgentAction, id string, fields map[string]crdt.Value, apply func(sched.Task) sched.Task) {
	lt := n.local[id]
	if lt == nil {
		return
	}
	n.c.trace(n.cfg.ID, "%v", a)
	n.c.Stats.StateWrites++
	n.write(sched.TaskKey(id), fields)
	lt.Task = apply(lt.Task)
}

func (n *Node) start(id string) {
	lt := n.local[id]
	if lt == nil {
		return
	}
	if ct := n.runtime[id]; ct != nil && (ct.state == sched.RuntimeRunning || ct.state == sched.RuntimeStarting) {
		return
	}
	c := n.c
	b, ok := n.cfg.Images[lt.Spec.Image]
	if !ok {
		b = c.cfg.Images[lt.Spec.Image]
	}
	ct := &container{behavior: b, started: c.now, state: sched.RuntimeRunning}
	if why := cmp.Or(n.cfg.StartError, b.StartError); why != "" {
		ct.state, ct.exited, ct.exitCode, ct.err, ct.notRun, ct.started = sched.RuntimeExited, c.now, -1, why, true, time.Time{}
	}
	if h := lt.Spec.WithDefaults().Health; h.Enabled() {
		ct.nextCheck = c.now.Add(h.Interval.D())
	}
	n.runtime[id] = ct
	c.Stats.Starts++
	c.trace(n.cfg.ID, "start %s (%s/%s)", id, lt.Service, lt.Slot)
}

// Crash makes a task's running container exit now with code.
func (n *Node) Crash(taskID string, code int) {
	if ct := n.runtime[taskID]; ct != nil && ct.state == sched.RuntimeRunning {
		ct.state, ct.exited, ct.exitCode = sched.RuntimeExited, n.c.now, code
	}
}

// Sicken makes every later health check of a task's container fail.
func (n *Node) Sicken(taskID string) {
	if ct := n.runtime[taskID]; ct != nil {
		ct.behavior.Unhealthy = true
	}
}

// RunningTasks returns the tasks whose containers run on this node (node
// down or not), by ID.
func (n *Node) RunningTasks() []sched.LocalTask {
	var out []sched.LocalTask
	n.eachRunning(func(lt *sched.LocalTask) { out = append(out, *lt) })
	slices.SortFunc(out, func(a, b sched.LocalTask) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// eachRunning calls f for every task with a running (or starting)
// container, in no particular order.
func (n *Node) eachRunning(f func(*sched.LocalTask)) {
	for id, ct := range n.runtime {
		if ct.state == sched.RuntimeRunning || ct.state == sched.RuntimeStarting {
			if lt := n.local[id]; lt != nil {
				f(lt)
			}
		}
	}
}

// check records broken invariants: a node's ledger over capacity, running
// containers beyond capacity, or a running container without a
// reservation.
func (c *Cluster) check() {
	for _, id := range c.order {
		n := c.nodes[id]
		capa := n.Ledger.Capacity()
		if u := n.Ledger.Usage(); !u.Fits(capa) {
			c.violate("node %s ledger holds %v, capacity %v", id, u, capa)
		}
		var run sched.Resources
		n.eachRunning(func(lt *sched.LocalTask) {
			run = run.Add(lt.Resources)
			if _, ok := n.Ledger.Get(lt.ID); !ok {
				c.violate("node %s runs task %s (%s/%s) without a reservation", id, lt.ID, lt.Service, lt.Slot)
			}
		})
		if !run.Fits(capa) {
			c.violate("node %s runs %v, capacity %v", id, run, capa)
		}
	}
}

func (c *Cluster) violate(format string, args ...any) {
	c.Violations = append(c.Violations, c.now.Sub(c.cfg.Start).String()+": "+fmt.Sprintf(format, args...))
}

// Admin: what the CLI does, written from a "cli" writer.

func (c *Cluster) writeAdmin(key string, d crdt.Doc) { c.st.write("cli", key, d, c.now) }

func (c *Cluster) adminStamp() crdt.Stamp { return crdt.Stamp{TS: c.admin.Now(), Node: "cli"} }

// CreateService stores a new service (version 1).
func (c *Cluster) CreateService(spec sched.ServiceSpec) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	svc := sched.Service{Name: spec.Name, Spec: spec, Version: 1, State: sched.ServiceActive, Updated: c.now}
	c.writeAdmin(sched.ServiceKey(spec.Name), crdt.Set(sched.ServiceFields(svc), c.adminStamp()))
	return nil
}

// Service returns the latest service document.
func (c *Cluster) Service(name string) *sched.Service {
	s, _ := c.st.latest(sched.ServiceKey(name)).(*sched.Service)
	return s
}

// UpdateService applies change to the spec as `service update` does:
// version+1, the old spec kept as prev_spec, state active.
func (c *Cluster) UpdateService(name string, change func(*sched.ServiceSpec)) error {
	cur := c.Service(name)
	if cur == nil {
		return fmt.Errorf("no service %q", name)
	}
	spec := cur.Spec
	spec.Args, spec.Constraints = slices.Clone(spec.Args), slices.Clone(spec.Constraints)
	change(&spec)
	if err := spec.Validate(); err != nil {
		return err
	}
	prev := cur.Spec
	svc := sched.Service{Name: name, Spec: spec, PrevSpec: &prev, Version: cur.Version + 1, State: sched.ServiceActive, Updated: c.now}
	c.writeAdmin(sched.ServiceKey(name), crdt.Set(sched.ServiceFields(svc), c.adminStamp()))
	return nil
}

// Scale sets the replicas of a service.
func (c *Cluster) Scale(name string, replicas int) error {
	return c.UpdateService(name, func(s *sched.ServiceSpec) { s.Replicas = replicas })
}

// RemoveService deletes the service document.
func (c *Cluster) RemoveService(name string) {
	c.writeAdmin(sched.ServiceKey(name), crdt.DeleteDoc(c.adminStamp()))
}

// SetAvailability drains or activates a node.
func (c *Cluster) SetAvailability(node string, a sched.Availability) {
	c.writeAdmin(sched.NodeKey(node), crdt.Set(map[string]crdt.Value{"availability": crdt.String(string(a))}, c.adminStamp()))
}

// Kill takes a node down: it stops acting and answering (its containers
// keep running, as in a partition); others see it dead after DetectDelay.
func (c *Cluster) Kill(id string) {
	n := c.nodes[id]
	n.down, n.downAt = true, c.now
}

// ShutDown shuts a node's machine down as schedd does when systemd stops
// it: it stops its containers, records their tasks stopped
// (sched.StoppedForShutDown), says in its node document that it shut
// down, then goes down as Kill does. Revive brings it back.
func (c *Cluster) ShutDown(id string) {
	n := c.nodes[id]
	n.write(sched.NodeKey(id), sched.ShutDownFields(true))
	for _, lt := range n.RunningTasks() {
		ct := n.runtime[lt.ID]
		ct.state, ct.exited, ct.exitCode = sched.RuntimeExited, c.now, 0
		c.Stats.Stops++
		a := sched.StoppedForShutDown(lt.Task, sched.Runtime{State: ct.state, StartedAt: ct.started, ExitedAt: ct.exited}, c.now)
		n.writeTask(a, lt.ID, a.Fields(), a.Apply)
		n.Ledger.Release(lt.ID)
	}
	c.Kill(id)
}

// Revive brings a node back. The Reserve calls it had in flight are
// forgotten (its executor restarted), the rest is as it was; a node that
// shut down says it is up again (schedd's start writes its node fields).
func (c *Cluster) Revive(id string) {
	n := c.nodes[id]
	n.down = false
	n.inflight = map[string]map[string]sched.InFlight{}
	if nd, ok := n.read(sched.NodeKey(id)).(sched.Node); ok && nd.ShutDown {
		n.write(sched.NodeKey(id), sched.ShutDownFields(false))
	}
}

// Partition splits the cluster into sides, each a list of node IDs (every
// node must be on exactly one). Nodes go on acting on their side: they see
// only its writes, reach only its nodes, and see the others dead after
// DetectDelay; containers keep running everywhere.
func (c *Cluster) Partition(sides ...[]string) {
	part := map[string]int{}
	for i, side := range sides {
		for _, id := range side {
			if _, dup := part[id]; dup || c.nodes[id] == nil {
				panic("sim: bad partition side member " + id)
			}
			part[id] = i
		}
	}
	if len(part) != len(c.nodes) {
		panic("sim: a partition must place every node")
	}
	c.part, c.partAt = part, c.now
	c.st.partition(part, c.now)
}

// Heal ends a partition: every node reads the merged history of both
// sides at once, and the cluster's liveness truth sees everyone alive
// again (SetAliveView can make a node's view converge later).
func (c *Cluster) Heal() {
	c.part = nil
	c.st.partition(nil, c.now)
}

// SetAliveView overrides a node's liveness view (nil restores the
// cluster's truth).
func (c *Cluster) SetAliveView(id string, alive []string) {
	c.nodes[id].alive = slices.Clone(alive)
}

// SetKeyLag makes node id see the keys under prefix lag late (0: as its
// other keys again; the longest prefix set decides), whatever its lag
// for the rest: gossip does not
// deliver one node's writes in the order they were made, so a reader can
// see a later write to one document before an earlier one to another.
// The store keeps history from now on for readers up to lag late.
func (c *Cluster) SetKeyLag(id, prefix string, lag time.Duration) {
	n := c.nodes[id]
	if lag == 0 {
		delete(n.keyLag, prefix)
		return
	}
	if n.keyLag == nil {
		n.keyLag = map[string]time.Duration{}
	}
	n.keyLag[prefix] = lag
	c.st.maxLag = max(c.st.maxLag, lag)
}

// Inspection.

// Slots returns the latest slot documents of a service, in slot order.
func (c *Cluster) Slots(service string) []sched.Slot {
	var out []sched.Slot
	for name := range c.st.slotsBySvc[service] {
		if sl, ok := c.st.latest(sched.SlotDocKey(service, name)).(sched.Slot); ok {
			out = append(out, sl)
		}
	}
	slices.SortFunc(out, func(a, b sched.Slot) int {
		ai, aok := sched.IsReplicaSlot(a.Slot)
		bi, bok := sched.IsReplicaSlot(b.Slot)
		if aok && bok {
			return ai - bi
		}
		return strings.Compare(a.Slot, b.Slot)
	})
	return out
}

// Tasks returns the latest task documents of a service, by ID.
func (c *Cluster) Tasks(service string) []sched.Task {
	var out []sched.Task
	for _, id := range slices.Sorted(maps.Keys(c.st.tasksBySvc[service])) {
		if t, ok := c.st.latest(sched.TaskKey(id)).(sched.Task); ok {
			out = append(out, t)
		}
	}
	return out
}

// Running counts the containers of a service running per node (down nodes
// included: a partitioned node's containers still run).
func (c *Cluster) Running(service string) map[string]int {
	out := map[string]int{}
	for _, id := range c.order {
		c.nodes[id].eachRunning(func(lt *sched.LocalTask) {
			if lt.Service == service {
				out[id]++
			}
		})
	}
	return out
}

// running maps service → task → node for every running container.
func (c *Cluster) running() map[string]map[string]string {
	out := map[string]map[string]string{}
	for _, id := range c.order {
		c.nodes[id].eachRunning(func(lt *sched.LocalTask) {
			m := out[lt.Service]
			if m == nil {
				m = map[string]string{}
				out[lt.Service] = m
			}
			m[lt.ID] = id
		})
	}
	return out
}

// Settled reports whether a service is exactly as its spec asks: every
// slot names a task whose container runs on an up node and whose document
// says running, and no other container of the service runs anywhere. (For
// a global service, slots of down nodes are left out.)
func (c *Cluster) Settled(service string) bool {
	return c.settled(service, c.running()[service])
}

// AllSettled reports whether every service ever created is Settled.
func (c *Cluster) AllSettled() bool {
	run := c.running()
	for name := range c.st.services {
		if !c.settled(name, run[name]) {
			return false
		}
	}
	return true
}

func (c *Cluster) settled(service string, running map[string]string) bool {
	svc := c.Service(service)
	if svc == nil {
		return len(running) == 0
	}
	var slots []sched.Slot
	for _, sl := range c.Slots(service) {
		if svc.Spec.Global && c.nodes[sl.Slot] != nil && c.nodes[sl.Slot].down {
			continue
		}
		slots = append(slots, sl)
	}
	want := svc.Spec.Replicas
	if svc.Spec.Global {
		want = 0
		for _, id := range c.order {
			nd, _ := c.st.latest(sched.NodeKey(id)).(sched.Node)
			if nd.Availability == sched.Drain || c.nodes[id].down {
				continue
			}
			ok := true
			for _, e := range svc.Spec.Constraints {
				if k, err := sched.ParseConstraint(e); err == nil && !k.Match(nd) {
					ok = false
				}
			}
			if ok {
				want++
			}
		}
	}
	if len(slots) != want || len(running) != want {
		return false
	}
	for _, sl := range slots {
		node, ok := running[sl.Task]
		if !ok || sl.Next != "" || c.nodes[node].down {
			return false
		}
		t, _ := c.st.latest(sched.TaskKey(sl.Task)).(sched.Task)
		if t.State != sched.TaskRunning {
			return false
		}
	}
	return true
}

// WriteCount is the number of document writes so far.
func (c *Cluster) WriteCount() int { return c.st.writes }
