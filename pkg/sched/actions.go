package sched

import (
	"fmt"
	"strings"
	"time"
)

// Action is one step Reconcile asks the owner's executor to take. The
// concrete types are Reserve, AssignSlot, DeleteSlot, SetServiceState,
// Unschedulable and Requeue. Every action's String is one line, used by
// logs and by the test transcripts.
type Action interface {
	fmt.Stringer
	isAction()
}

// Reserve asks the executor to reserve a new task on the first candidate
// that accepts: send the Reserve call to Candidates[0]; on a rejection,
// call NextCandidate with the nodes tried and the free capacity they
// reported, and try the node it returns. On the first accept, write the
// slot document Accepted(node). When every candidate refused, record
// Unschedulable (see SummarizeRejects) and let the next reconcile try again
// with fresher usage.
type Reserve struct {
	Service string
	Slot    string
	TaskID  string
	Version int64
	// Spec is the spec (with defaults) the task runs: the target node
	// starts exactly this, whatever /services/<name> says by then.
	Spec       ServiceSpec
	SpecDigest string
	Resources  Resources
	Ports      []Port // host-mode ports
	// Restarts is the restart count the new task inherits, and
	// RestartTimes the times within the policy's window.
	Restarts     int
	RestartTimes []time.Time `json:",omitempty"`
	// TTL is how long the reservation lives unconfirmed.
	TTL time.Duration
	// Candidates are the nodes that fit, best first (Place's ranking).
	Candidates []string
	// Assign is the slot document to write after an accept; Accepted
	// fills in the node.
	Assign AssignSlot
}

// Reservation is the ledger entry a target records for r.
func (r Reserve) Reservation() Reservation {
	return Reservation{
		TaskID: r.TaskID, Service: r.Service, Slot: r.Slot, Version: r.Version,
		Resources: r.Resources, Ports: r.Ports, TTL: r.TTL,
	}
}

// Accepted is the slot document to write once node accepted r.
func (r Reserve) Accepted(node string) AssignSlot {
	a := r.Assign
	if a.Next == r.TaskID {
		a.NextNode = node
	} else {
		a.Node = node
	}
	return a
}

// AsNext reports whether r starts a replacement next to a running task
// (start-first) rather than filling the slot directly.
func (r Reserve) AsNext() bool { return r.Assign.Next == r.TaskID }

func (r Reserve) String() string {
	as := "task"
	if r.AsNext() {
		as = "next"
	}
	c := strings.Join(r.Candidates, ",")
	if len(r.Candidates) > 4 {
		c = strings.Join(r.Candidates[:4], ",") + fmt.Sprintf(",…(%d)", len(r.Candidates))
	}
	s := fmt.Sprintf("reserve %s/%s task=%s v%d as=%s on=%s", r.Service, r.Slot, r.TaskID, r.Version, as, c)
	if r.Restarts > 0 {
		s += fmt.Sprintf(" restarts=%d", r.Restarts)
	}
	if r.Assign.Lost != "" {
		s += " lost=" + r.Assign.Lost
	}
	if r.Assign.Fresh {
		s += " fresh"
	}
	return s
}

// AssignSlot writes a slot document: every field, so that the write
// replaces the document as a whole (all fields share one stamp). An empty
// Task makes the slot vacant; an empty Next clears the replacement.
type AssignSlot struct {
	Service string
	Slot    string
	Task    string
	Node    string
	Version int64

	Next        string
	NextNode    string
	NextVersion int64

	// Lost is the task the write replaces because its node is seen down
	// (Slot.Lost).
	Lost string
	// Fresh: the owner knew no document of the slot and no task of it
	// (Slot.Fresh).
	Fresh bool
}

func (a AssignSlot) String() string {
	s := fmt.Sprintf("assign %s/%s task=%s", a.Service, a.Slot, orDash(a.Task))
	if a.Task != "" {
		s += fmt.Sprintf(" node=%s v%d", a.Node, a.Version)
	}
	if a.Next != "" {
		s += fmt.Sprintf(" next=%s node=%s v%d", a.Next, orDash(a.NextNode), a.NextVersion)
	}
	if a.Lost != "" {
		s += " lost=" + a.Lost
	}
	if a.Fresh {
		s += " fresh"
	}
	return s
}

// DeleteSlot deletes a slot document (scale down, node no longer eligible
// for a global service, service removed). The node running the slot's task
// stops it.
type DeleteSlot struct {
	Service string
	Slot    string
}

func (d DeleteSlot) String() string { return fmt.Sprintf("delete %s/%s", d.Service, d.Slot) }

// SetServiceState writes the owner's fields of the service document.
type SetServiceState struct {
	Service string
	State   ServiceState
	// Converged, when non-zero, records that every slot runs that
	// version: the rollout is over (field `converged`).
	Converged int64
	// Rollback, when non-nil, also writes spec, prev_spec and version.
	Rollback *Rollback
	// Run, when non-nil, starts a scheduled job's run: it writes run,
	// run_version and version.
	Run *ScheduledRun
	// Reason explains the change (for events and logs).
	Reason string
}

// ScheduledRun is a scheduled job's run: its scheduled time, the new
// version of the service, which the run's tasks carry, and for a
// replicated job its replica count, for a global one its nodes (what a
// scale-up or a new node adds waits for the next run).
type ScheduledRun struct {
	At      time.Time
	Version int64
	Slots   int64
	Nodes   []string
}

// Rollback is the service update a rollback writes: the previous spec
// becomes the spec again, under a new version.
type Rollback struct {
	Spec     ServiceSpec
	PrevSpec ServiceSpec
	Version  int64
}

func (s SetServiceState) String() string {
	out := fmt.Sprintf("service %s state=%s", s.Service, s.State)
	if s.Converged != 0 {
		out += fmt.Sprintf(" converged=v%d", s.Converged)
	}
	if s.Rollback != nil {
		out += fmt.Sprintf(" rollback to v%d", s.Rollback.Version)
	}
	if s.Run != nil {
		out += fmt.Sprintf(" run %s as v%d", s.Run.At.UTC().Format(time.TimeOnly), s.Run.Version)
		if s.Run.Slots > 0 {
			out += fmt.Sprintf(" of %d slots", s.Run.Slots)
		}
		if len(s.Run.Nodes) > 0 {
			out += " on " + strings.Join(s.Run.Nodes, ",")
		}
	}
	if s.Reason != "" {
		out += ": " + s.Reason
	}
	return out
}

// Unschedulable reports that no node can take a slot's task now.
type Unschedulable struct {
	Service string
	Slot    string
	Reason  string
}

func (u Unschedulable) String() string {
	return fmt.Sprintf("unschedulable %s/%s: %s", u.Service, u.Slot, u.Reason)
}

// Requeue asks to run Reconcile again at At even if nothing changes (a
// timer: update delay, backoff, a TTL running out).
type Requeue struct {
	At  time.Time
	Why string
}

func (r Requeue) String() string {
	return fmt.Sprintf("requeue at %s (%s)", r.At.UTC().Format("15:04:05.000"), r.Why)
}

func (Reserve) isAction()         {}
func (AssignSlot) isAction()      {}
func (DeleteSlot) isAction()      {}
func (SetServiceState) isAction() {}
func (Unschedulable) isAction()   {}
func (Requeue) isAction()         {}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// NextCandidate returns the node to try after the nodes in tried refused
// r (or could not be reached): the next of r.Candidates not yet tried
// whose free capacity, if a recent rejection reported it in fresh, still
// fits r. ok is false when none is left.
func NextCandidate(r Reserve, tried map[string]bool, fresh map[string]Resources) (node string, ok bool) {
	for _, c := range r.Candidates {
		if tried[c] {
			continue
		}
		if free, known := fresh[c]; known && !r.Resources.Fits(free) {
			continue
		}
		return c, true
	}
	return "", false
}
