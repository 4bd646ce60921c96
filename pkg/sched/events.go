package sched

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shoal-dev/shoal/pkg/crdt"
)

// Event is a change of the cluster as a user follows it with `shoalctl
// events` (docker events, Nomad's event stream): what changed (Type and
// ID), how (Action) and the facts around it.
type Event struct {
	Time time.Time `json:"time"`
	// Type is service, task or node.
	Type string `json:"type"`
	// Action: for a service create, update (a new version), pause,
	// rollback, converge (every slot runs the current version) or remove;
	// for a task create, a state it entered (starting, running, exited,
	// failed, ...), health_status: STATUS, or remove; for a node join,
	// update (availability, labels), shutdown, up or remove (and, told by
	// shoalctl from statd's membership, alive, suspect, dead or left).
	Action string `json:"action"`
	// ID is the service's name, the task's ID or the node's ID.
	ID         string            `json:"id"`
	Attributes map[string]string `json:"attributes,omitempty"`
}

// Event types.
const (
	EventService = "service"
	EventTask    = "task"
	EventNode    = "node"
)

// DocEvents describes the change of the document at key from before to
// after (either may be a document without fields: not there yet, or
// removed) at time at, in the events a user reads; none for a key that is
// no service, task or node, or a change of fields no one follows (owner
// bookkeeping, claims, ports).
func DocEvents(key string, before, after crdt.Doc, at time.Time) []Event {
	switch {
	case strings.HasPrefix(key, ServicesPrefix):
		return serviceEvents(strings.TrimPrefix(key, ServicesPrefix), before, after, at)
	case strings.HasPrefix(key, TasksPrefix):
		return taskEvents(strings.TrimPrefix(key, TasksPrefix), before, after, at)
	case strings.HasPrefix(key, NodesPrefix):
		return nodeEvents(strings.TrimPrefix(key, NodesPrefix), before, after, at)
	}
	return nil
}

func serviceEvents(name string, before, after crdt.Doc, at time.Time) []Event {
	old, err1 := ServiceFromDoc(name, before)
	cur, err2 := ServiceFromDoc(name, after)
	if err1 != nil || err2 != nil {
		return nil // a document no schedd could read either
	}
	ev := func(action string, s *Service) Event {
		a := map[string]string{"version": strconv.FormatInt(s.Version, 10), "image": s.Spec.Image}
		if s.Spec.Global {
			a["mode"] = "global"
		} else {
			a["replicas"] = strconv.Itoa(s.Spec.Replicas)
		}
		return Event{Time: at, Type: EventService, Action: action, ID: name, Attributes: a}
	}
	switch {
	case old == nil && cur == nil:
		return nil
	case cur == nil:
		return []Event{{Time: at, Type: EventService, Action: "remove", ID: name}}
	case old == nil || cur.Version < old.Version:
		// A version that went back is a service removed and made again
		// between the two looks.
		return []Event{ev("create", cur)}
	}
	var out []Event
	if cur.Version > old.Version {
		action := "update"
		if cur.State == ServiceRollingBack && old.State != ServiceRollingBack {
			action = "rollback"
		}
		out = append(out, ev(action, cur))
	} else if cur.State != old.State && cur.State == ServiceRollingBack {
		out = append(out, ev("rollback", cur))
	}
	if cur.State == ServicePaused && old.State != ServicePaused {
		out = append(out, ev("pause", cur))
	}
	if cur.Converged == cur.Version && old.Converged != cur.Version {
		out = append(out, ev("converge", cur))
	}
	return out
}

func taskEvents(id string, before, after crdt.Doc, at time.Time) []Event {
	old, hadOld := TaskFromDoc(id, before)
	cur, hasCur := TaskFromDoc(id, after)
	attrs := func(t Task) map[string]string {
		a := map[string]string{"service": t.Service, "slot": t.Slot, "node": t.Node, "version": strconv.FormatInt(t.Version, 10)}
		if t.Image != "" {
			a["image"] = t.Image
		}
		return a
	}
	switch {
	case !hadOld && !hasCur:
		return nil
	case !hasCur:
		return []Event{{Time: at, Type: EventTask, Action: "remove", ID: id, Attributes: attrs(old)}}
	}
	var out []Event
	if !hadOld {
		out = append(out, Event{Time: at, Type: EventTask, Action: "create", ID: id, Attributes: attrs(cur)})
		old = Task{State: TaskPending}
	}
	if cur.State != old.State || cur.Restarts != old.Restarts {
		a := attrs(cur)
		if cur.State.Terminal() || cur.State == TaskRestarting || cur.State == TaskUnhealthy {
			a["exit_code"] = strconv.Itoa(cur.ExitCode)
		}
		if cur.Error != "" {
			a["error"] = cur.Error
		}
		if cur.Restarts > 0 {
			a["restarts"] = strconv.Itoa(cur.Restarts)
		}
		out = append(out, Event{Time: at, Type: EventTask, Action: string(cur.State), ID: id, Attributes: a})
	}
	if cur.Health != old.Health && cur.Health != HealthNone {
		out = append(out, Event{Time: at, Type: EventTask, Action: "health_status: " + string(cur.Health), ID: id, Attributes: attrs(cur)})
	}
	return out
}

func nodeEvents(id string, before, after crdt.Doc, at time.Time) []Event {
	hadOld, hasCur := len(before.Live()) > 0, len(after.Live()) > 0
	old, cur := NodeFromDoc(id, before, true), NodeFromDoc(id, after, true)
	attrs := func(n Node) map[string]string {
		a := map[string]string{}
		if n.Name != "" {
			a["name"] = n.Name
		}
		return a
	}
	switch {
	case !hadOld && !hasCur:
		return nil
	case !hasCur:
		return []Event{{Time: at, Type: EventNode, Action: "remove", ID: id, Attributes: attrs(old)}}
	case !hadOld:
		return []Event{{Time: at, Type: EventNode, Action: "join", ID: id, Attributes: attrs(cur)}}
	}
	var out []Event
	a := attrs(cur)
	if cur.Availability != old.Availability {
		a["availability.old"], a["availability.new"] = string(old.Availability), string(cur.Availability)
	}
	for _, k := range slices.Sorted(maps.Keys(cur.Labels)) {
		if v, ok := old.Labels[k]; !ok || v != cur.Labels[k] {
			a["label."+k] = cur.Labels[k]
		}
	}
	for k := range old.Labels {
		if _, ok := cur.Labels[k]; !ok {
			a["label."+k] = "(removed)"
		}
	}
	if len(a) > len(attrs(cur)) {
		out = append(out, Event{Time: at, Type: EventNode, Action: "update", ID: id, Attributes: a})
	}
	switch {
	case cur.ShutDown && !old.ShutDown:
		out = append(out, Event{Time: at, Type: EventNode, Action: "shutdown", ID: id, Attributes: attrs(cur)})
	case !cur.ShutDown && old.ShutDown:
		out = append(out, Event{Time: at, Type: EventNode, Action: "up", ID: id, Attributes: attrs(cur)})
	}
	return out
}
