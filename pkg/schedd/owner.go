package schedd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/shoal-dev/shoal/pkg/sched"
	"github.com/shoal-dev/shoal/pkg/statepb"
	schedv1 "github.com/shoal-dev/shoal/proto/shoal/sched/v1"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

// observationAge is how long a free-capacity figure from a Reserve answer
// is trusted over the task documents (which lag the target's ledger).
const observationAge = 2 * time.Second

// world is one round's read of the mirror, grouped by service.
type world struct {
	services map[string]*sched.Service
	slots    map[string][]sched.Slot
	tasks    map[string][]sched.Task
	allTasks []sched.Task
	nodes    []sched.Node
}

func (n *node) readWorld() world {
	w := world{services: map[string]*sched.Service{}, slots: map[string][]sched.Slot{}, tasks: map[string][]sched.Task{}}
	for _, d := range n.mirror.List(sched.ServicesPrefix) {
		name := strings.TrimPrefix(d.GetKey(), sched.ServicesPrefix)
		s, err := serviceFromDoc(name, d)
		if err != nil {
			n.log.Warn("unreadable service document", "service", name, "err", err)
			continue
		}
		if s != nil {
			w.services[name] = s
		}
	}
	for _, d := range n.mirror.List(sched.SlotsPrefix) {
		svc, slot, ok := sched.ParseSlotDocKey(d.GetKey())
		if !ok {
			continue
		}
		if sl, ok := sched.SlotFromDoc(svc, slot, statepb.FromDocument(d)); ok {
			w.slots[svc] = append(w.slots[svc], sl)
		}
	}
	for _, d := range n.mirror.List(sched.TasksPrefix) {
		id := strings.TrimPrefix(d.GetKey(), sched.TasksPrefix)
		if t, ok := sched.TaskFromDoc(id, statepb.FromDocument(d)); ok {
			w.tasks[t.Service] = append(w.tasks[t.Service], t)
			w.allTasks = append(w.allTasks, t)
		}
	}
	w.nodes = n.nodes()
	return w
}

// serviceFromDoc decodes a service document; nil (no error) when there is
// no service.
//
// NB: statd has no conditional writes. An owner whose view has not seen a
// removal yet may write its own fields (state, converged, unschedulable)
// into the service document just after the delete; being later, they
// outlive it and leave a document without a spec. That leftover is no
// service: without this, every node logged it as unreadable every round,
// `service inspect` failed instead of saying not found, and the name could
// never be created again. A create overwrites the leftover fields.
func serviceFromDoc(name string, d *statev1.Document) (*sched.Service, error) {
	doc := statepb.FromDocument(d)
	if spec, _ := doc.Live()[fieldSpec].AsString(); spec == "" {
		return nil, nil
	}
	return sched.ServiceFromDoc(name, doc)
}

// fieldSpec and fieldConverged are fields of the service document (see
// sched.ServiceFields).
const (
	fieldSpec      = "spec"
	fieldConverged = "converged"
)

// ownerRound reconciles every service this node owns.
func (n *node) ownerRound(ctx context.Context, now time.Time) {
	w := n.readWorld()
	alive := n.aliveNodes()
	names := map[string]bool{}
	for s := range w.services {
		names[s] = true
	}
	for s := range w.slots {
		names[s] = true
	}
	usage := sched.UsageFromTasks(w.allTasks)
	n.omu.Lock()
	for id, o := range n.observed {
		if now.Sub(o.At) > observationAge {
			delete(n.observed, id)
		}
	}
	usage = usage.WithObservations(w.nodes, n.observed, now, observationAge)
	n.omu.Unlock()
	ownAll := n.ownsAll()
	for svc := range names {
		if !ownAll && sched.Owner(svc, alive) != n.id {
			continue
		}
		snap := sched.Snapshot{
			Service: w.services[svc], Slots: w.slots[svc], Tasks: w.tasks[svc],
			Nodes: w.nodes, Usage: usage, TTL: time.Duration(n.cfg.ReservationTTL),
			VolumeReplicas: n.replicas.of(ctx, n.vold, w.services[svc], now),
		}
		if ns := n.rejoined.Load(); ns != 0 {
			snap.Rejoined = time.Unix(0, ns)
		}
		n.omu.Lock()
		n.pruneAcceptedLocked(svc, w.slots[svc], now)
		for _, f := range n.inflight[svc] {
			snap.InFlight = append(snap.InFlight, f)
		}
		n.omu.Unlock()
		sort.Slice(snap.InFlight, func(i, j int) bool { return snap.InFlight[i].Slot < snap.InFlight[j].Slot })
		var unknown []string // asked at the round's first Reserve only: rounds run 4 times a second
		checked := false
		for _, a := range sched.Reconcile(snap, now, newTaskID(svc)) {
			if _, quiet := a.(sched.Requeue); !quiet {
				n.log.Debug("owner action", "service", svc, "action", fmt.Sprint(a))
			}
			if r, ok := a.(sched.Reserve); ok {
				if !checked {
					unknown, checked = n.unknownSpecFields(svc), true
				}
				if len(unknown) > 0 {
					// Its spec, as decoded here, lacks those fields: a
					// task started from it would run without them.
					n.setUnschedulable(svc, r.Slot, fmt.Sprintf("its owner, node %s, runs a schedd that does not know spec field %s (upgrade it)", n.id, strings.Join(unknown, ",")))
					continue
				}
			}
			n.execOwner(ctx, svc, a, now)
		}
		n.publishUnschedulable(ctx, svc, w.services[svc])
	}
}

// unknownSpecFields lists the fields of service svc's stored spec that
// this schedd does not know.
func (n *node) unknownSpecFields(svc string) []string {
	d := n.mirror.Get(sched.ServiceKey(svc))
	if d == nil {
		return nil
	}
	spec, _ := statepb.FromDocument(d).Live()[fieldSpec].AsString()
	return sched.UnknownSpecFields([]byte(spec))
}

// newTaskID returns a generator of task IDs for a service: readable, and
// valid as container IDs.
func newTaskID(svc string) func() string {
	return func() string {
		var b [4]byte
		rand.Read(b[:])
		return svc + "." + hex.EncodeToString(b[:])
	}
}

func (n *node) execOwner(ctx context.Context, svc string, a sched.Action, now time.Time) {
	switch a := a.(type) {
	case sched.Reserve:
		n.startReserve(ctx, a, now)
	case sched.AssignSlot:
		if err := n.put(ctx, sched.SlotDocKey(a.Service, a.Slot), a.Fields()); err != nil {
			n.log.Warn("assign slot", "slot", a.String(), "err", err)
		}
		n.clearUnschedulable(a.Service, a.Slot)
	case sched.DeleteSlot:
		if _, err := n.statd.Delete(ctx, &statev1.DeleteRequest{Key: sched.SlotDocKey(a.Service, a.Slot)}); err != nil {
			n.log.Warn("delete slot", "slot", a.String(), "err", err)
		}
		n.clearUnschedulable(a.Service, a.Slot)
	case sched.SetServiceState:
		if err := n.put(ctx, sched.ServiceKey(a.Service), a.Fields(now)); err != nil {
			n.log.Warn("set service state", "service", a.Service, "err", err)
		} else if a.Reason != "" {
			n.log.Info("service state", "service", a.Service, "state", a.State, "reason", a.Reason)
		}
	case sched.Unschedulable:
		n.setUnschedulable(a.Service, a.Slot, a.Reason)
	case sched.Requeue:
		d := time.Until(a.At)
		if d > 0 && d < time.Duration(n.cfg.Tick) {
			time.AfterFunc(d, n.wake)
		}
	}
}

// startReserve walks a Reserve through its candidates in the background:
// the first node that accepts runs the task, and the slot is pointed at it.
func (n *node) startReserve(ctx context.Context, a sched.Reserve, now time.Time) {
	n.omu.Lock()
	if _, busy := n.inflight[a.Service][a.Slot]; busy {
		n.omu.Unlock()
		return
	}
	tried := map[string]bool{}
	fresh := n.freshLocked()
	first, ok := sched.NextCandidate(a, tried, fresh)
	if !ok {
		first = a.Candidates[0] // every candidate looks full: ask anyway
	}
	n.setInflightLocked(a, first, now)
	n.omu.Unlock()

	go func() {
		var why []sched.Reject
		target := first
		for {
			ok, free, reject, err := n.reserveOn(ctx, target, a)
			n.omu.Lock()
			if err == nil {
				n.observed[target] = sched.Observation{Free: free, At: time.Now()}
			}
			if cur, busy := n.inflight[a.Service][a.Slot]; !busy || cur.TaskID != a.TaskID {
				n.omu.Unlock()
				return
			}
			if ok {
				// NB: the slot stays in flight until the mirror shows the
				// slot document naming the task; a round in between would
				// otherwise see a vacant slot and place it again.
				n.accepted[a.Service+"/"+a.Slot] = a.TaskID
				n.omu.Unlock()
				as := a.Accepted(target)
				if err := n.put(ctx, sched.SlotDocKey(as.Service, as.Slot), as.Fields()); err != nil {
					n.log.Warn("assign slot after accept", "slot", as.String(), "err", err)
				}
				n.clearUnschedulable(a.Service, a.Slot)
				n.wake()
				return
			}
			if err != nil {
				reject = sched.Reject{Class: sched.RejectGone, Detail: err.Error()}
			}
			tried[target] = true
			why = append(why, reject)
			next, more := sched.NextCandidate(a, tried, n.freshLocked())
			if !more {
				delete(n.inflight[a.Service], a.Slot)
				n.omu.Unlock()
				n.setUnschedulable(a.Service, a.Slot, "every candidate refused: "+sched.SummarizeRejects(len(why), why))
				return
			}
			target = next
			n.setInflightLocked(a, target, time.Now())
			n.omu.Unlock()
		}
	}()
}

// pruneAcceptedLocked ends the in-flight state of accepted reservations
// once the slot documents name their tasks (or the TTL passed).
func (n *node) pruneAcceptedLocked(svc string, slots []sched.Slot, now time.Time) {
	named := map[string]bool{}
	for _, sl := range slots {
		named[sl.Slot+"="+sl.Task] = true
		named[sl.Slot+"="+sl.Next] = true
	}
	for slot, f := range n.inflight[svc] {
		id, ok := n.accepted[svc+"/"+slot]
		if !ok || id != f.TaskID {
			continue
		}
		if named[slot+"="+id] || now.Sub(f.Sent) > time.Duration(n.cfg.ReservationTTL) {
			delete(n.inflight[svc], slot)
			delete(n.accepted, svc+"/"+slot)
		}
	}
}

func (n *node) setInflightLocked(a sched.Reserve, target string, sent time.Time) {
	m := n.inflight[a.Service]
	if m == nil {
		m = map[string]sched.InFlight{}
		n.inflight[a.Service] = m
	}
	m[a.Slot] = sched.InFlight{Slot: a.Slot, TaskID: a.TaskID, Node: target, Sent: sent}
}

func (n *node) freshLocked() map[string]sched.Resources {
	out := make(map[string]sched.Resources, len(n.observed))
	for id, o := range n.observed {
		out[id] = o.Free
	}
	return out
}

// reserveOn sends one Reserve to a target's schedd (or this node's own
// ledger, without a network hop).
func (n *node) reserveOn(ctx context.Context, target string, a sched.Reserve) (bool, sched.Resources, sched.Reject, error) {
	a.Candidates = nil
	n.reservesSent.Add(1)
	if target == n.id {
		return n.acceptReserve(ctx, a)
	}
	body, err := json.Marshal(a)
	if err != nil {
		return false, sched.Resources{}, sched.Reject{}, err
	}
	p, err := n.peers.client(ctx, target)
	if err != nil {
		return false, sched.Resources{}, sched.Reject{}, err
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := p.Reserve(cctx, &schedv1.ReserveRequest{Reserve: body, Owner: n.id})
	if err != nil {
		return false, sched.Resources{}, sched.Reject{}, err
	}
	var rej sched.Reject
	if len(resp.GetReject()) > 0 {
		json.Unmarshal(resp.GetReject(), &rej)
	}
	free := sched.Resources{CPUMillis: resp.GetFreeCpuMillis(), MemoryBytes: resp.GetFreeMemoryBytes()}
	return resp.GetAccepted(), free, rej, nil
}

func (n *node) setUnschedulable(svc, slot, reason string) {
	n.omu.Lock()
	defer n.omu.Unlock()
	m := n.unsched[svc]
	if m == nil {
		m = map[string]string{}
		n.unsched[svc] = m
	}
	m[slot] = reason
}

func (n *node) clearUnschedulable(svc, slot string) {
	n.omu.Lock()
	defer n.omu.Unlock()
	delete(n.unsched[svc], slot)
}

// unschedulableReasons returns the distinct reasons slots of svc cannot
// be placed, as this node (its owner) last saw them.
func (n *node) unschedulableReasons(svc string) []string {
	n.omu.Lock()
	defer n.omu.Unlock()
	seen := map[string]bool{}
	var out []string
	for _, r := range n.unsched[svc] {
		if !seen[r] {
			seen[r] = true
			out = append(out, r)
		}
	}
	slices.Sort(out)
	return out
}

// publishUnschedulable records the owner's unschedulable reasons in the
// service document, so every node can show them; written on change only.
func (n *node) publishUnschedulable(ctx context.Context, svc string, s *sched.Service) {
	if s == nil {
		return
	}
	want := strings.Join(n.unschedulableReasons(svc), "\n")
	d := n.mirror.Get(sched.ServiceKey(svc))
	if d == nil || d.GetFields()[fieldUnschedulable].GetStringValue() == want {
		return
	}
	if err := n.put(ctx, sched.ServiceKey(svc), map[string]crdtValue{fieldUnschedulable: stringValue(want)}); err != nil {
		n.log.Warn("publish unschedulable", "service", svc, "err", err)
	}
}

// fieldUnschedulable is the service document field holding why slots
// cannot be placed (one reason per line).
const fieldUnschedulable = "unschedulable"
