package sched

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Request is what one task needs from a node.
type Request struct {
	Service string
	// Slot only breaks ties between equally good nodes, so that the
	// slots of one service and different services fan out over
	// different nodes instead of all picking the same first one.
	Slot        string
	Resources   Resources
	Ports       []Port // host-mode ports only
	Constraints []Constraint
	Strategy    Strategy
	// Tasks counts the service's live tasks per node (spread, and
	// MaxPerNode).
	Tasks map[string]int
	// MaxPerNode, if above 0, bounds the service's tasks on one node.
	MaxPerNode int
	// Spread are node label keys, strongest first: a node whose value of
	// one (missing is a value too) has fewer of the service's tasks
	// (Tasks) on all nodes sharing it ranks first, whatever its score.
	Spread []string
	// Near is, per node, the share of the task's volumes that the node
	// holds a replica of (NearVolumes): a volume mounted there is served
	// by its own replica, where elsewhere every operation is forwarded to
	// the group's leader, and leadership follows the writer's node only
	// among replicas.
	Near map[string]float64
	// Needs are the spec's fields beyond the baseline (SpecNeeds): a node
	// whose schedd does not know one would run the task without it.
	Needs []string
	// Failures counts, per node, the tasks of this spec that failed
	// there within FailureWindow (FailuresOf): nodes with fewer rank
	// first, before spread and score. It ranks and never rejects, so a
	// spec that fails everywhere still tries every node.
	Failures map[string]int
}

// FailureWindow is how long a task that failed on a node makes placement
// try other nodes first (swarmkit deprioritises a node for five minutes
// after a service's tasks failed there too).
const FailureWindow = 5 * time.Minute

// FailuresOf counts per node the tasks of the spec with digest that
// failed (could not start, failed past their in-place restarts, or went
// unhealthy) and finished within FailureWindow before now; nil when there
// are none. Only tasks of that spec count: an update that fixes what
// stopped them starts afresh.
func FailuresOf(tasks []Task, digest string, now time.Time) map[string]int {
	var out map[string]int
	for _, t := range tasks {
		if t.State != TaskFailed && t.State != TaskUnhealthy || t.SpecDigest != digest || now.Sub(t.Finished) >= FailureWindow {
			continue
		}
		if out == nil {
			out = map[string]int{}
		}
		out[t.Node]++
	}
	return out
}

// NearVolumes returns Request.Near for a task that mounts volumes (as in
// ServiceSpec.Volumes), given the nodes that hold a replica of each
// volume by name; nil when it mounts none or nothing is known.
func NearVolumes(volumes []string, replicas map[string][]string) map[string]float64 {
	if len(volumes) == 0 || len(replicas) == 0 {
		return nil
	}
	out := map[string]float64{}
	for _, v := range volumes {
		m, err := ParseVolume(v)
		if err != nil {
			continue
		}
		for _, node := range slices.Compact(slices.Sorted(slices.Values(replicas[m.Name]))) {
			out[node] += 1 / float64(len(volumes))
		}
	}
	return out
}

// NewRequest builds the request of one task of spec for slot. The spec
// must be valid (its constraints parse).
func NewRequest(spec ServiceSpec, slot string) (Request, error) {
	cs, err := ParseConstraints(spec.Constraints)
	if err != nil {
		return Request{}, err
	}
	st := spec.Placement
	if st == "" {
		st = Spread
	}
	var spread []string
	for _, p := range spec.Preferences {
		label, err := ParsePreference(p)
		if err != nil {
			return Request{}, err
		}
		spread = append(spread, label)
	}
	return Request{
		Spread:      spread,
		Service:     spec.Name,
		Slot:        slot,
		Resources:   spec.Resources(),
		Ports:       spec.WithDefaults().HostPorts(),
		Constraints: cs,
		Strategy:    st,
		MaxPerNode:  spec.MaxPerNode,
		Needs:       SpecNeeds(spec),
	}, nil
}

// NodeUsage is what a node is known to have committed: the sum of the
// reservations of its live tasks and the host ports they bind. It is the
// observer's belief, not the truth: the node's own Ledger is the truth.
type NodeUsage struct {
	Used  Resources
	Ports map[string]bool // "8080/tcp"
}

// Usage is the known usage of every node by ID.
type Usage map[string]NodeUsage

// UsageFromTasks sums the live (non-terminal) tasks per node.
func UsageFromTasks(tasks []Task) Usage {
	u := Usage{}
	for _, t := range tasks {
		if t.State.Terminal() || t.Node == "" {
			continue
		}
		u.add(t.Node, t.Resources, t.Ports)
	}
	return u
}

// add records a task on node. It copies the node's port set before
// changing it, so a Usage copied with maps.Clone can be changed without
// touching the original.
func (u Usage) add(node string, r Resources, ports []Port) {
	nu := u[node]
	nu.Used = nu.Used.Add(r)
	if len(ports) > 0 {
		ps := make(map[string]bool, len(nu.Ports)+len(ports))
		maps.Copy(ps, nu.Ports)
		for _, p := range ports {
			ps[p.hostPortKey()] = true
		}
		nu.Ports = ps
	}
	u[node] = nu
}

// Observation is a node's free capacity as its ledger reported it: every
// answer to a Reserve call, accepted or not, carries one.
type Observation struct {
	Free Resources
	At   time.Time
}

// WithObservations returns u where every node observed within maxAge of
// now counts as using at least its capacity minus the observed free
// capacity. Owners placing from documents alone learn of other owners'
// reservations only when the task documents arrive; the ledgers' own
// figures are fresher. (Taking the larger of the two errs on the side of
// fewer rejected calls for at most maxAge.)
func (u Usage) WithObservations(nodes []Node, obs map[string]Observation, now time.Time, maxAge time.Duration) Usage {
	if len(obs) == 0 {
		return u
	}
	out := maps.Clone(u)
	if out == nil {
		out = Usage{}
	}
	for _, n := range nodes {
		o, ok := obs[n.ID]
		if !ok || now.Sub(o.At) > maxAge {
			continue
		}
		nu := out[n.ID]
		seen := n.Capacity.Sub(o.Free)
		nu.Used = Resources{max(nu.Used.CPUMillis, seen.CPUMillis), max(nu.Used.MemoryBytes, seen.MemoryBytes)}
		out[n.ID] = nu
	}
	return out
}

// Free is what n has left according to u.
func (u NodeUsage) Free(n Node) Resources { return n.Capacity.Sub(u.Used) }

// RejectClass is why a node cannot take a task.
type RejectClass string

// Reject classes, in the order Filter checks them.
const (
	RejectDown       RejectClass = "down"
	RejectDrained    RejectClass = "drained"
	RejectPaused     RejectClass = "paused"
	RejectConstraint RejectClass = "constraint"
	RejectMaxPerNode RejectClass = "max-per-node"
	RejectPort       RejectClass = "port"
	RejectCPU        RejectClass = "cpu"
	RejectMemory     RejectClass = "memory"
	RejectGone       RejectClass = "unreachable" // the Reserve call failed
	// RejectSchedd: the node's schedd does not know spec fields (Detail,
	// comma-separated) the task uses; checked after availability.
	RejectSchedd RejectClass = "schedd"
)

// Reject says why a node refused (or would refuse) a task. The zero
// Reject means it fits.
type Reject struct {
	Class RejectClass
	// Detail is the failing constraint or port.
	Detail string
	// Need and Free are the request and the node's free resources.
	Need, Free Resources
}

// OK reports whether r is the zero Reject: the node fits.
func (r Reject) OK() bool { return r.Class == "" }

func (r Reject) String() string {
	switch r.Class {
	case "":
		return "fits"
	case RejectDown:
		return "node is down"
	case RejectDrained:
		return "node is drained"
	case RejectPaused:
		return "node is paused"
	case RejectConstraint:
		return "fails constraint " + r.Detail
	case RejectMaxPerNode:
		return "runs the service's maximum per node (" + r.Detail + ")"
	case RejectSchedd:
		return "runs a schedd that does not know spec field " + r.Detail + " (upgrade it)"
	case RejectPort:
		return "host port " + r.Detail + " is in use"
	case RejectCPU:
		return fmt.Sprintf("lacks CPU (need %s, free %s)", FormatCPU(r.Need.CPUMillis), FormatCPU(r.Free.CPUMillis))
	case RejectMemory:
		return fmt.Sprintf("lacks memory (need %s, free %s)", FormatBytes(r.Need.MemoryBytes), FormatBytes(r.Free.MemoryBytes))
	}
	return string(r.Class) + " " + r.Detail
}

// Filter checks whether n can take req given its known usage u: alive,
// active (neither drained nor paused), every constraint holds, fewer than MaxPerNode of the service's
// tasks there, host ports free, CPU and memory fit. It
// returns the first failing check, or the zero Reject.
func Filter(req Request, n Node, u NodeUsage) Reject {
	switch {
	case !n.Alive:
		return Reject{Class: RejectDown}
	case n.Availability == Drain:
		return Reject{Class: RejectDrained}
	case n.Availability == Pause:
		return Reject{Class: RejectPaused}
	}
	if r, bad := specFieldsReject(req.Needs, n.SpecFields); bad {
		return r
	}
	for _, c := range req.Constraints {
		if !c.Match(n) {
			return Reject{Class: RejectConstraint, Detail: c.Expr}
		}
	}
	if req.MaxPerNode > 0 && req.Tasks[n.ID] >= req.MaxPerNode {
		return Reject{Class: RejectMaxPerNode, Detail: strconv.Itoa(req.MaxPerNode)}
	}
	return fits(req.Resources, req.Ports, u.Free(n), u.Ports)
}

// fits is the resource part of Filter, shared with the Ledger.
func fits(need Resources, ports []Port, free Resources, bound map[string]bool) Reject {
	for _, p := range ports {
		if k := p.hostPortKey(); bound[k] {
			return Reject{Class: RejectPort, Detail: k, Need: need, Free: free}
		}
	}
	switch {
	case need.CPUMillis > free.CPUMillis:
		return Reject{Class: RejectCPU, Need: need, Free: free}
	case need.MemoryBytes > free.MemoryBytes:
		return Reject{Class: RejectMemory, Need: need, Free: free}
	}
	return Reject{}
}

// ScoreBuckets is how finely Score distinguishes free capacity.
const ScoreBuckets = 16

// Score rates a node that passed Filter: higher is better.
//
// spread: fewer tasks of the service first, then nodes near the task's
// volumes (Request.Near), then more free resources after placing the
// task; binpack: nodes near the task's volumes first, then less free
// resources after placing. Free resources are the mean of the free CPU
// and memory fractions, so both count equally whatever their units.
//
// NB: the fraction is rounded down to 1/ScoreBuckets. Owners decide
// concurrently from the same, slightly stale figures; exact scores would
// send them all to the same emptiest (spread) or fullest (binpack) node,
// where all but one are rejected (the conflict problem of optimistic
// schedulers such as Omega). Rounded, near-equal nodes tie, and Place's
// per-slot tie-break fans the owners out over them.
func Score(req Request, n Node, u NodeUsage) float64 {
	f := math.Floor(freeFraction(n.Capacity, u.Used.Add(req.Resources))*ScoreBuckets) / ScoreBuckets
	near := req.Near[n.ID]
	if req.Strategy == Binpack {
		// near is in [0, 1] and 0.5*f too: a node holding every volume
		// comes before the fullest that holds none.
		return near - 0.5*f
	}
	// f and near are in [0, 1]: the task count dominates (0.5 + 0.25 <
	// 1), then a node holding every volume beats the emptiest.
	return -float64(req.Tasks[n.ID]) + 0.5*near + 0.25*f
}

func freeFraction(capacity, used Resources) float64 {
	frac := func(c, u int64) float64 {
		if c <= 0 {
			return 0
		}
		return max(0, float64(c-u)/float64(c))
	}
	return (frac(capacity.CPUMillis, used.CPUMillis) + frac(capacity.MemoryBytes, used.MemoryBytes)) / 2
}

// Place ranks the nodes that can take req, best first. When none can, it
// returns a human-readable reason that counts the nodes per rejection
// class, e.g. "3 nodes: 2 lack memory (need 512MiB, most free 256MiB),
// 1 fails constraint node.labels.zone==eu".
//
// Nodes where fewer tasks of the spec recently failed (req.Failures)
// come first; then req.Spread's label values with fewer of the service's
// tasks; then the higher score; equal scores are ordered by a rendezvous weight
// of (service/slot, node): deterministic, yet different slots prefer
// different nodes.
func Place(req Request, nodes []Node, usage Usage) (ranked []string, reason string) {
	type cand struct {
		id     string
		failed int
		spread []int // the service's tasks on the nodes sharing each Spread label's value
		score  float64
		tie    uint64
	}
	groups := make([]map[string]int, len(req.Spread))
	for i, key := range req.Spread {
		groups[i] = map[string]int{}
		for _, n := range nodes {
			groups[i][n.Labels[key]] += req.Tasks[n.ID]
		}
	}
	cands := make([]cand, 0, len(nodes))
	var rejects []Reject
	h := keyHash(req.Service + "/" + req.Slot)
	for _, n := range nodes {
		u := usage[n.ID]
		if r := Filter(req, n, u); !r.OK() {
			rejects = append(rejects, r)
			continue
		}
		c := cand{id: n.ID, failed: req.Failures[n.ID], score: Score(req, n, u), tie: weight(h, n.ID)}
		for i, key := range req.Spread {
			c.spread = append(c.spread, groups[i][n.Labels[key]])
		}
		cands = append(cands, c)
	}
	if len(cands) == 0 {
		return nil, SummarizeRejects(len(nodes), rejects)
	}
	slices.SortFunc(cands, func(a, b cand) int {
		if a.failed != b.failed {
			return a.failed - b.failed
		}
		if c := slices.Compare(a.spread, b.spread); c != 0 {
			return c
		}
		switch {
		case a.score > b.score:
			return -1
		case a.score < b.score:
			return 1
		case a.tie > b.tie:
			return -1
		case a.tie < b.tie:
			return 1
		}
		return strings.Compare(a.id, b.id)
	})
	ranked = make([]string, len(cands))
	for i, c := range cands {
		ranked[i] = c.id
	}
	return ranked, ""
}

// SummarizeRejects explains why none of total nodes could take a task:
// one phrase per rejection class (per constraint, per port), most common
// first.
func SummarizeRejects(total int, rejects []Reject) string {
	if total == 0 {
		return "no nodes"
	}
	type group struct {
		key      string
		n        int
		first    Reject
		mostFree Resources
	}
	groups := map[string]*group{}
	for _, r := range rejects {
		key := string(r.Class) + " " + r.Detail
		g := groups[key]
		if g == nil {
			g = &group{key: key, first: r, mostFree: r.Free}
			groups[key] = g
		}
		g.n++
		g.mostFree.CPUMillis = max(g.mostFree.CPUMillis, r.Free.CPUMillis)
		g.mostFree.MemoryBytes = max(g.mostFree.MemoryBytes, r.Free.MemoryBytes)
	}
	gs := slices.Collect(maps.Values(groups))
	slices.SortFunc(gs, func(a, b *group) int {
		if a.n != b.n {
			return b.n - a.n
		}
		return strings.Compare(a.key, b.key)
	})
	parts := make([]string, 0, len(gs))
	for _, g := range gs {
		verb := func(one, many string) string {
			if g.n == 1 {
				return one
			}
			return many
		}
		var p string
		switch r := g.first; r.Class {
		case RejectDown:
			p = verb("is down", "are down")
		case RejectDrained:
			p = verb("is drained", "are drained")
		case RejectPaused:
			p = verb("is paused", "are paused")
		case RejectConstraint:
			p = verb("fails", "fail") + " constraint " + r.Detail
		case RejectMaxPerNode:
			p = verb("runs", "run") + " the service's maximum per node (" + r.Detail + ")"
		case RejectSchedd:
			p = verb("runs", "run") + " a schedd that does not know spec field " + r.Detail + " (upgrade it)"
		case RejectPort:
			p = verb("has", "have") + " host port " + r.Detail + " in use"
		case RejectCPU:
			p = fmt.Sprintf("%s CPU (need %s, most free %s)", verb("lacks", "lack"), FormatCPU(r.Need.CPUMillis), FormatCPU(g.mostFree.CPUMillis))
		case RejectMemory:
			p = fmt.Sprintf("%s memory (need %s, most free %s)", verb("lacks", "lack"), FormatBytes(r.Need.MemoryBytes), FormatBytes(g.mostFree.MemoryBytes))
		case RejectGone:
			p = verb("is unreachable", "are unreachable")
		default:
			p = r.String()
		}
		parts = append(parts, fmt.Sprintf("%d %s", g.n, p))
	}
	noun := "nodes"
	if total == 1 {
		noun = "node"
	}
	return fmt.Sprintf("%d %s: %s", total, noun, strings.Join(parts, ", "))
}
