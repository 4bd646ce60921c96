package sched

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/shoal-dev/shoal/pkg/crdt"
)

// Key prefixes of the scheduler's documents in replicated state.
const (
	ServicesPrefix = "/services/"
	SlotsPrefix    = "/slots/"
	TasksPrefix    = "/tasks/"
	NodesPrefix    = "/nodes/"
)

// ServiceKey, SlotDocKey, TaskKey and NodeKey name documents.
func ServiceKey(name string) string { return ServicesPrefix + name }

// SlotDocKey is /slots/<service>/<slot>.
func SlotDocKey(service, slot string) string { return SlotsPrefix + service + "/" + slot }

// TaskKey is /tasks/<id>.
func TaskKey(id string) string { return TasksPrefix + id }

// NodeKey is /nodes/<id>.
func NodeKey(id string) string { return NodesPrefix + id }

// ParseSlotDocKey splits /slots/<service>/<slot>.
func ParseSlotDocKey(key string) (service, slot string, ok bool) {
	rest, ok := strings.CutPrefix(key, SlotsPrefix)
	if !ok {
		return "", "", false
	}
	service, slot, ok = strings.Cut(rest, "/")
	return service, slot, ok && service != "" && slot != ""
}

// Field names of the service document.
const (
	fSpec      = "spec"
	fVersion   = "version"
	fPrevSpec  = "prev_spec"
	fState     = "state"
	fUpdated   = "updated"
	fConverged = "converged"
	// fRun and fRunVersion are Service.Run and RunVersion: owner fields
	// like converged, which updates leave alone.
	fRun        = "run"
	fRunVersion = "run_version"
	fRunSlots   = "run_slots"
	fRunNodes   = "run_nodes"
)

// ServiceFromDoc decodes a service document; nil (and no error) when the
// document does not exist (never written, or deleted).
func ServiceFromDoc(name string, d crdt.Doc) (*Service, error) {
	f := d.Live()
	if len(f) == 0 {
		return nil, nil
	}
	s := &Service{Name: name, State: ServiceActive}
	raw, _ := f[fSpec].AsString()
	spec, err := DecodeSpec([]byte(raw))
	if err != nil {
		return nil, fmt.Errorf("service %s: %w", name, err)
	}
	spec.Name = name
	s.Spec = spec
	if p, ok := f[fPrevSpec].AsString(); ok && p != "" {
		prev, err := DecodeSpec([]byte(p))
		if err != nil {
			return nil, fmt.Errorf("service %s: previous %w", name, err)
		}
		prev.Name = name
		s.PrevSpec = &prev
	}
	s.Version, _ = f[fVersion].AsInt()
	s.Converged, _ = f[fConverged].AsInt()
	s.RunVersion, _ = f[fRunVersion].AsInt()
	s.RunSlots, _ = f[fRunSlots].AsInt()
	if nodes, _ := f[fRunNodes].AsString(); nodes != "" {
		s.RunNodes = strings.Split(nodes, ",")
	}
	s.Run = timeField(f, fRun)
	if st, ok := f[fState].AsString(); ok && st != "" {
		s.State = ServiceState(st)
	}
	s.Updated = timeField(f, fUpdated)
	s.Created = d.Fields[fCreated].Stamp
	return s, nil
}

// ServiceFields are the fields a create or update writes: the spec, its
// version, the previous spec, state active and the update time; a create
// (no previous spec: updates always keep one) also writes created, whose
// stamp is Service.Created from then on, and clears the run of a
// scheduled job a removed service of the same name may have left.
func ServiceFields(s Service) map[string]crdt.Value {
	f := map[string]crdt.Value{
		fSpec:    crdt.String(specJSON(s.Spec)),
		fVersion: crdt.Int(s.Version),
		fState:   crdt.String(string(cmpState(s.State))),
		fUpdated: timeValue(s.Updated),
	}
	if s.PrevSpec != nil {
		f[fPrevSpec] = crdt.String(specJSON(*s.PrevSpec))
	} else {
		f[fCreated] = timeValue(s.Updated)
		f[fRunVersion] = crdt.Int(0)
		f[fRunSlots] = crdt.Int(0)
		f[fRunNodes] = crdt.String("")
	}
	return f
}

func cmpState(s ServiceState) ServiceState {
	if s == "" {
		return ServiceActive
	}
	return s
}

func specJSON(s ServiceSpec) string {
	b, err := json.Marshal(s)
	if err != nil { // plain types only
		panic(err)
	}
	return string(b)
}

// Fields are the service document fields a SetServiceState writes.
func (a SetServiceState) Fields(now time.Time) map[string]crdt.Value {
	f := map[string]crdt.Value{fState: crdt.String(string(a.State))}
	if a.Converged != 0 {
		f[fConverged] = crdt.Int(a.Converged)
	}
	if run := a.Run; run != nil {
		f[fRun] = timeValue(run.At)
		f[fRunVersion] = crdt.Int(run.Version)
		f[fRunSlots] = crdt.Int(run.Slots)
		f[fRunNodes] = crdt.String(strings.Join(run.Nodes, ","))
		f[fVersion] = crdt.Int(run.Version)
	}
	if rb := a.Rollback; rb != nil {
		f[fSpec] = crdt.String(specJSON(rb.Spec))
		f[fPrevSpec] = crdt.String(specJSON(rb.PrevSpec))
		f[fVersion] = crdt.Int(rb.Version)
		f[fUpdated] = timeValue(now)
	}
	return f
}

// Field names of the slot document.
const (
	fTask        = "task"
	fNode        = "node"
	fNext        = "next"
	fNextNode    = "next_node"
	fNextVersion = "next_version"
	fLost        = "lost"
	fFresh       = "fresh"
)

// SlotFromDoc decodes a slot document; ok is false when it does not exist.
func SlotFromDoc(service, slot string, d crdt.Doc) (Slot, bool) {
	f := d.Live()
	if len(f) == 0 {
		return Slot{}, false
	}
	s := Slot{Service: service, Slot: slot, Stamp: d.MaxStamp()}
	s.Task, _ = f[fTask].AsString()
	s.Node, _ = f[fNode].AsString()
	s.Version, _ = f[fVersion].AsInt()
	s.Next, _ = f[fNext].AsString()
	s.NextNode, _ = f[fNextNode].AsString()
	s.NextVersion, _ = f[fNextVersion].AsInt()
	s.Lost, _ = f[fLost].AsString()
	s.Fresh, _ = f[fFresh].AsBool()
	return s, true
}

// Fields are the slot document's fields: all of them, so one write
// replaces the whole document under one stamp.
func (a AssignSlot) Fields() map[string]crdt.Value {
	return map[string]crdt.Value{
		fTask:        crdt.String(a.Task),
		fNode:        crdt.String(a.Node),
		fVersion:     crdt.Int(a.Version),
		fNext:        crdt.String(a.Next),
		fNextNode:    crdt.String(a.NextNode),
		fNextVersion: crdt.Int(a.NextVersion),
		fLost:        crdt.String(a.Lost),
		fFresh:       crdt.Bool(a.Fresh),
	}
}

// Field names of the task document.
const (
	fService    = "service"
	fSlot       = "slot"
	fSpecDigest = "spec_digest"
	fHealth     = "health"
	fRestarts   = "restarts"
	fInherited  = "inherited_restarts"
	fRestartsAt = "restart_times"
	fExitCode   = "exit_code"
	fError      = "error"
	fCPU        = "cpu"
	fMemory     = "memory"
	fCreated    = "created"
	fStarted    = "started"
	fFinished   = "finished"
	fImage      = "image"
	fPorts      = "ports"
	fClaim      = "claim"
	fClaimedAt  = "claimed_at"
	fSuperseded = "superseded_at"
)

// TaskFromDoc decodes a task document; ok is false when it does not exist.
// Created is the stamp of the `created` field: the node's first write.
func TaskFromDoc(id string, d crdt.Doc) (Task, bool) {
	f := d.Live()
	if len(f) == 0 {
		return Task{}, false
	}
	t := Task{ID: id}
	t.Service, _ = f[fService].AsString()
	t.Slot, _ = f[fSlot].AsString()
	t.Node, _ = f[fNode].AsString()
	t.Version, _ = f[fVersion].AsInt()
	t.SpecDigest, _ = f[fSpecDigest].AsString()
	st, _ := f[fState].AsString()
	t.State = TaskState(st)
	h, _ := f[fHealth].AsString()
	t.Health = Health(h)
	t.Restarts = int(intField(f, fRestarts))
	t.Inherited = int(intField(f, fInherited))
	t.RestartTimes = timesField(f, fRestartsAt)
	t.ExitCode = int(intField(f, fExitCode))
	t.Error, _ = f[fError].AsString()
	t.Resources = Resources{CPUMillis: intField(f, fCPU), MemoryBytes: intField(f, fMemory)}
	t.Created = d.Fields[fCreated].Stamp
	t.Started = timeField(f, fStarted)
	t.Finished = timeField(f, fFinished)
	t.Image, _ = f[fImage].AsString()
	t.Claim, _ = f[fClaim].AsString()
	t.ClaimedAt = timeField(f, fClaimedAt)
	t.SupersededAt = timeField(f, fSuperseded)
	if p, ok := f[fPorts].AsString(); ok && p != "" {
		t.Ports = parsePorts(p)
	}
	return t, true
}

// NewTask is the task a node holds once it accepts r (NewTaskFields is its
// document), before it reads the document back for Created.
func NewTask(r Reserve, node string) Task {
	return Task{ID: r.TaskID, Service: r.Service, Slot: r.Slot, Node: node, Version: r.Version, SpecDigest: r.SpecDigest,
		State: TaskPending, Restarts: r.Restarts, Inherited: r.Restarts, RestartTimes: r.RestartTimes, Resources: r.Resources, Ports: r.Ports,
		Image: r.Spec.Image}
}

// NewTaskFields is the task document a node writes when it accepts r: state
// pending, created now (the write's stamp becomes the task's Created).
func NewTaskFields(r Reserve, node string, now time.Time) map[string]crdt.Value {
	f := map[string]crdt.Value{
		fService:    crdt.String(r.Service),
		fSlot:       crdt.String(r.Slot),
		fNode:       crdt.String(node),
		fVersion:    crdt.Int(r.Version),
		fSpecDigest: crdt.String(r.SpecDigest),
		fState:      crdt.String(string(TaskPending)),
		fHealth:     crdt.String(""),
		fRestarts:   crdt.Int(int64(r.Restarts)),
		fInherited:  crdt.Int(int64(r.Restarts)),
		fExitCode:   crdt.Int(0),
		fError:      crdt.String(""),
		fCPU:        crdt.Int(r.Resources.CPUMillis),
		fMemory:     crdt.Int(r.Resources.MemoryBytes),
		fCreated:    timeValue(now),
		fStarted:    crdt.String(""),
		fFinished:   crdt.String(""),
		fImage:      crdt.String(r.Spec.Image),
	}
	if len(r.Ports) > 0 {
		f[fPorts] = crdt.String(formatPorts(r.Ports))
	}
	if len(r.RestartTimes) > 0 {
		f[fRestartsAt] = timesValue(r.RestartTimes)
	}
	return f
}

// Fields are the task document fields an UpdateTask writes
// (superseded_at only when set: it is written once, with the stop).
func (u UpdateTask) Fields() map[string]crdt.Value {
	f := map[string]crdt.Value{
		fState:    crdt.String(string(u.State)),
		fHealth:   crdt.String(string(u.Health)),
		fRestarts: crdt.Int(int64(u.Restarts)),
		fExitCode: crdt.Int(int64(u.ExitCode)),
		fError:    crdt.String(u.Error),
		fStarted:  timeValue(u.Started),
		fFinished: timeValue(u.Finished),
	}
	if !u.SupersededAt.IsZero() {
		f[fSuperseded] = timeValue(u.SupersededAt)
	}
	if u.RestartTimes != nil {
		f[fRestartsAt] = timesValue(u.RestartTimes)
	}
	return f
}

// Apply returns t with u's fields (what the document says after u).
func (u UpdateTask) Apply(t Task) Task {
	t.State, t.Health, t.Restarts, t.ExitCode, t.Error = u.State, u.Health, u.Restarts, u.ExitCode, u.Error
	t.Started, t.Finished = u.Started, u.Finished
	if !u.SupersededAt.IsZero() {
		t.SupersededAt = u.SupersededAt
	}
	if u.RestartTimes != nil {
		t.RestartTimes = nil
		if len(u.RestartTimes) > 0 {
			t.RestartTimes = u.RestartTimes
		}
	}
	return t
}

// Fields are the task document fields a ClaimTask writes.
func (c ClaimTask) Fields() map[string]crdt.Value {
	return map[string]crdt.Value{fClaim: crdt.String(c.Against), fClaimedAt: timeValue(c.At)}
}

// Apply returns t with c's fields (what the document says after c).
func (c ClaimTask) Apply(t Task) Task {
	t.Claim, t.ClaimedAt = c.Against, c.At
	return t
}

// Field names of the node document written by schedd (statd writes name,
// hostname, cpus, memory; labels are label.<key>).
const (
	fName           = "name"
	fHostname       = "hostname"
	fLabelPrefix    = "label."
	fAvailability   = "availability"
	fCapacityCPU    = "capacity.cpu"
	fCapacityMemory = "capacity.memory"
	fCPUs           = "cpus"
	fShutDown       = "shutdown"
)

// NodeFromDoc decodes a node document; alive comes from the observer's
// membership view. Capacity is schedd's capacity.cpu (millicores) and
// capacity.memory (bytes), falling back to statd's cpus and memory.
func NodeFromDoc(id string, d crdt.Doc, alive bool) Node {
	f := d.Live()
	n := Node{ID: id, Alive: alive, Availability: Active, Labels: map[string]string{}}
	n.Name, _ = f[fName].AsString()
	n.Hostname, _ = f[fHostname].AsString()
	n.ShutDown, _ = f[fShutDown].AsBool()
	if a, ok := f[fAvailability].AsString(); ok && a != "" {
		n.Availability = Availability(a)
	}
	for k, v := range f {
		if l, ok := strings.CutPrefix(k, fLabelPrefix); ok {
			n.Labels[l], _ = v.AsString()
		}
	}
	if c, ok := f[fCapacityCPU].AsInt(); ok {
		n.Capacity.CPUMillis = c
	} else if c, ok := f[fCPUs].AsInt(); ok {
		n.Capacity.CPUMillis = 1000 * c
	}
	if m, ok := f[fCapacityMemory].AsInt(); ok {
		n.Capacity.MemoryBytes = m
	} else if m, ok := f[fMemory].AsInt(); ok {
		n.Capacity.MemoryBytes = m
	}
	// Written with the capacity at each start: a schedd from before that
	// starts later (a downgrade) writes the capacity alone, and leaves
	// the list older than it.
	if v, ok := f[NodeSpecFieldsField].AsString(); ok && d.Fields[NodeSpecFieldsField].Stamp.Compare(d.Fields[fCapacityCPU].Stamp) >= 0 {
		n.SpecFields = ParseNodeSpecFields(v)
	}
	return n
}

// NodeFields are the fields schedd writes into its node document.
func NodeFields(capacity Resources, availability Availability) map[string]crdt.Value {
	return map[string]crdt.Value{
		fCapacityCPU:    crdt.Int(capacity.CPUMillis),
		fCapacityMemory: crdt.Int(capacity.MemoryBytes),
		fAvailability:   crdt.String(string(availability)),
		fShutDown:       crdt.Bool(false), // up (again)
		// With the capacity, in one write (NodeFromDoc).
		NodeSpecFieldsField: crdt.String(strings.Join(SpecFieldsBeyondBaseline(), ",")),
	}
}

// ShutDownFields are the node document's fields by which a node's
// scheduler says that its machine is shutting down (down true, see Up),
// or that it is up again (NodeFields, written at every start, say so too).
func ShutDownFields(down bool) map[string]crdt.Value {
	return map[string]crdt.Value{fShutDown: crdt.Bool(down)}
}

func intField(f map[string]crdt.Value, name string) int64 {
	i, _ := f[name].AsInt()
	return i
}

func timeValue(t time.Time) crdt.Value {
	if t.IsZero() {
		return crdt.String("")
	}
	return crdt.String(t.UTC().Format(time.RFC3339Nano))
}

// timesValue renders times as RFC 3339 times joined by commas.
func timesValue(ts []time.Time) crdt.Value {
	parts := make([]string, len(ts))
	for i, t := range ts {
		parts[i] = t.UTC().Format(time.RFC3339Nano)
	}
	return crdt.String(strings.Join(parts, ","))
}

func timesField(f map[string]crdt.Value, name string) []time.Time {
	s, _ := f[name].AsString()
	var out []time.Time
	for _, p := range strings.Split(s, ",") {
		if t, err := time.Parse(time.RFC3339Nano, p); err == nil {
			out = append(out, t)
		}
	}
	return out
}

func timeField(f map[string]crdt.Value, name string) time.Time {
	s, _ := f[name].AsString()
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}
	}
	return t
}

// formatPorts renders host ports as "8080:80/tcp,53:53/udp".
func formatPorts(ps []Port) string {
	parts := make([]string, len(ps))
	for i, p := range ps {
		parts[i] = fmt.Sprintf("%d:%d/%s", p.Host, p.Container, p.proto())
	}
	return strings.Join(parts, ",")
}

func parsePorts(s string) []Port {
	var out []Port
	for _, part := range strings.Split(s, ",") {
		hc, proto, _ := strings.Cut(part, "/")
		h, c, _ := strings.Cut(hc, ":")
		hp, err1 := strconv.Atoi(h)
		cp, err2 := strconv.Atoi(c)
		if err1 != nil || err2 != nil {
			continue
		}
		out = append(out, Port{Host: hp, Container: cp, Protocol: proto, Mode: PortHost})
	}
	return out
}
