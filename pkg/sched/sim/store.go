package sim

import (
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/sched"
)

// store stands in for replicated state. Writes are merged (crdt.Merge,
// the real LWW) into one global history per key; a node reads each key as
// it stood lag ago, plus its own writes at once, which is how gossip delay
// looks from one replica.
type store struct {
	docs map[string]*entry
	// maxLag bounds how much history entries keep.
	maxLag time.Duration

	services    map[string]bool            // service names ever written
	slotsBySvc  map[string]map[string]bool // service → slot names
	tasksBySvc  map[string]map[string]bool // service → task IDs
	tasksByNode map[string]map[string]bool // node → task IDs
	nodes       map[string]bool

	// usage is the known usage derived from the latest task documents.
	used     map[string]sched.Resources
	ports    map[string]map[string]int
	usageGen uint64
	usage    sched.Usage
	usageAt  uint64

	writes int

	// part, while a partition lasts, maps each node to its side; split
	// lists the entries written since it began, at partAt.
	part   map[string]int
	split  []*entry
	partAt time.Time
}

type entry struct {
	key      string
	versions []version
	// own holds each writer's own writes merged, so that a lagging
	// reader still sees what it wrote itself.
	own map[string]crdt.Doc
	// During a partition: base is the document as it stood when the
	// partition began, side the writes made since on each side. A reader
	// sees base (or, if it lags, what it had seen of it when the
	// partition began) merged with its side's writes, these without lag.
	base crdt.Doc
	side map[int]crdt.Doc
}

type version struct {
	at  time.Time
	doc crdt.Doc
	val any // decoded document (sched.Task, sched.Slot, *sched.Service, sched.Node) or nil
}

func newStore(maxLag time.Duration) *store {
	return &store{
		docs: map[string]*entry{}, maxLag: maxLag,
		services: map[string]bool{}, slotsBySvc: map[string]map[string]bool{},
		tasksBySvc: map[string]map[string]bool{}, tasksByNode: map[string]map[string]bool{},
		nodes: map[string]bool{},
		used:  map[string]sched.Resources{}, ports: map[string]map[string]int{},
	}
}

func addIndex(m map[string]map[string]bool, k, v string) {
	s := m[k]
	if s == nil {
		s = map[string]bool{}
		m[k] = s
	}
	s[v] = true
}

// write merges delta, written by node at now, into key.
func (s *store) write(node, key string, delta crdt.Doc, now time.Time) {
	s.writes++
	e := s.docs[key]
	if e == nil {
		e = &entry{key: key}
		s.docs[key] = e
	}
	var cur crdt.Doc
	var oldVal any
	if n := len(e.versions); n > 0 {
		cur, oldVal = e.versions[n-1].doc, e.versions[n-1].val
	}
	if s.part != nil {
		s.writeSide(e, cur, node, delta)
	}
	doc := crdt.Merge(cur, delta)
	val := decode(key, doc)
	e.versions = append(e.versions, version{at: now, doc: doc, val: val})
	if s.maxLag > 0 {
		if e.own == nil {
			e.own = map[string]crdt.Doc{}
		}
		e.own[node] = crdt.Merge(e.own[node], delta)
	}
	s.prune(e, now)
	s.index(key, val)
	if strings.HasPrefix(key, sched.TasksPrefix) {
		s.account(oldVal, -1)
		s.account(val, +1)
	}
}

// writeSide records delta on the writer's side of the partition (on every
// side for a writer in none, such as the CLI).
func (s *store) writeSide(e *entry, cur crdt.Doc, node string, delta crdt.Doc) {
	if e.side == nil {
		e.base, e.side = cur, map[int]crdt.Doc{}
		s.split = append(s.split, e)
	}
	g, in := s.part[node]
	for _, side := range slices.Sorted(maps.Keys(groupsOf(s.part))) {
		if !in || side == g {
			e.side[side] = crdt.Merge(e.side[side], delta)
		}
	}
}

func groupsOf(part map[string]int) map[int]bool {
	out := map[int]bool{}
	for _, g := range part {
		out[g] = true
	}
	return out
}

// partition splits the readers into sides at now (nil: heal, everyone
// sees the merged history again).
func (s *store) partition(part map[string]int, now time.Time) {
	for _, e := range s.split {
		e.base, e.side = crdt.Doc{}, nil
	}
	s.part, s.split, s.partAt = part, nil, now
}

// prune keeps the versions a reader lagging up to maxLag may still need:
// while a partition lasts, a lagging reader still needs what it had seen
// when it began.
func (s *store) prune(e *entry, now time.Time) {
	if s.part != nil {
		now = s.partAt
	}
	cut := now.Add(-s.maxLag)
	i := 0
	for i+1 < len(e.versions) && !e.versions[i+1].at.After(cut) {
		i++
	}
	if i > 0 {
		e.versions = append(e.versions[:0], e.versions[i:]...)
	}
}

func (s *store) index(key string, val any) {
	switch v := val.(type) {
	case sched.Task:
		addIndex(s.tasksBySvc, v.Service, v.ID)
		addIndex(s.tasksByNode, v.Node, v.ID)
	case sched.Slot:
		addIndex(s.slotsBySvc, v.Service, v.Slot)
	case *sched.Service:
		s.services[v.Name] = true
	case sched.Node:
		s.nodes[v.ID] = true
	}
}

func (s *store) account(val any, sign int64) {
	t, ok := val.(sched.Task)
	if !ok || t.State.Terminal() || t.Node == "" {
		return
	}
	r := t.Resources
	s.used[t.Node] = sched.Resources{
		CPUMillis:   s.used[t.Node].CPUMillis + sign*r.CPUMillis,
		MemoryBytes: s.used[t.Node].MemoryBytes + sign*r.MemoryBytes,
	}
	for _, p := range t.Ports {
		m := s.ports[t.Node]
		if m == nil {
			m = map[string]int{}
			s.ports[t.Node] = m
		}
		m[portKey(p)] += int(sign)
	}
	s.usageGen++
}

func portKey(p sched.Port) string {
	proto := p.Protocol
	if proto == "" {
		proto = sched.ProtoTCP
	}
	return strings.Join([]string{itoa(p.Host), proto}, "/")
}

// knownUsage is the usage the latest task documents imply. (Readers see it
// without lag: a simplification; the ledger is what keeps nodes safe.)
func (s *store) knownUsage() sched.Usage {
	if s.usage != nil && s.usageAt == s.usageGen {
		return s.usage
	}
	u := make(sched.Usage, len(s.used))
	for n, r := range s.used {
		nu := sched.NodeUsage{Used: r}
		for k, c := range s.ports[n] {
			if c > 0 {
				if nu.Ports == nil {
					nu.Ports = map[string]bool{}
				}
				nu.Ports[k] = true
			}
		}
		u[n] = nu
	}
	s.usage, s.usageAt = u, s.usageGen
	return u
}

// read returns key as node sees it at now with the given lag, decoded
// (nil when the document does not exist in that view).
func (s *store) read(node, key string, now time.Time, lag time.Duration) any {
	e := s.docs[key]
	if e == nil || len(e.versions) == 0 {
		return nil
	}
	if g, in := s.part[node]; in && node != "" {
		// Gossip from the other side stops at the split, and so does
		// what a lagging reader had not yet received of the writes
		// before it.
		if lag > 0 {
			pre := s.lagged(e, node, s.partAt.Add(-lag))
			if e.side != nil {
				pre = crdt.Merge(pre, e.side[g])
			}
			return decode(key, pre)
		}
		if e.side != nil {
			return decode(key, crdt.Merge(e.base, e.side[g]))
		}
	}
	if lag <= 0 {
		return e.versions[len(e.versions)-1].val
	}
	base := e.at(now.Add(-lag))
	own, mine := e.own[node]
	switch {
	case !mine && base == nil:
		return nil
	case !mine:
		return base.val
	case base == nil:
		return decode(key, own)
	}
	return decode(key, crdt.Merge(base.doc, own))
}

// at returns the latest version of e written at or before cut (nil if
// none).
func (e *entry) at(cut time.Time) *version {
	for i := len(e.versions) - 1; i >= 0; i-- {
		if !e.versions[i].at.After(cut) {
			return &e.versions[i]
		}
	}
	return nil
}

// lagged is e as node saw it at cut: the history up to then and its own
// writes.
func (s *store) lagged(e *entry, node string, cut time.Time) crdt.Doc {
	var d crdt.Doc
	if v := e.at(cut); v != nil {
		d = v.doc
	}
	return crdt.Merge(d, e.own[node])
}

// latest returns the latest global document of key, decoded.
func (s *store) latest(key string) any { return s.read("", key, time.Time{}, 0) }

// decode maps a document to its scheduler type by its key.
func decode(key string, d crdt.Doc) any {
	switch {
	case strings.HasPrefix(key, sched.TasksPrefix):
		if t, ok := sched.TaskFromDoc(strings.TrimPrefix(key, sched.TasksPrefix), d); ok {
			return t
		}
	case strings.HasPrefix(key, sched.SlotsPrefix):
		svc, slot, _ := sched.ParseSlotDocKey(key)
		if sl, ok := sched.SlotFromDoc(svc, slot, d); ok {
			return sl
		}
	case strings.HasPrefix(key, sched.ServicesPrefix):
		if svc, err := sched.ServiceFromDoc(strings.TrimPrefix(key, sched.ServicesPrefix), d); err == nil && svc != nil {
			return svc
		}
	case strings.HasPrefix(key, sched.NodesPrefix):
		if d.Exists() {
			// Liveness is the reader's: filled in when read.
			return sched.NodeFromDoc(strings.TrimPrefix(key, sched.NodesPrefix), d, false)
		}
	}
	return nil
}
