// Package sim runs a Shoal cluster's scheduling in one process, in virtual
// time, deterministically: N nodes, each with a real sched.Ledger, a fake
// container runtime (instant start), its own view of replicated state (a
// shared store read with a per-node lag, standing in for gossip delay),
// its own liveness view (so two nodes can both believe they own a
// service), and Reserve calls delivered as messages after a delay.
//
// Every node runs the real decisions: sched.Owner picks who reconciles a
// service, sched.Reconcile decides, sched.AgentDecide runs the node's
// tasks. What this package adds is the executor around them, the part
// schedd does with gRPC, statd and containerd, written as plainly as
// possible so it can serve as the reference for schedd's own.
//
// The tests of package sched drive scenarios with it; bench/sched measures
// placement throughput with it. Given the same Config and the same calls,
// a run is identical every time.
package sim

import (
	"cmp"
	"container/heap"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/hlc"
	"github.com/shoal-dev/shoal/pkg/sched"
)

// Config describes a simulated cluster.
type Config struct {
	Nodes []NodeConfig
	// Seed makes task IDs (and nothing else: the rest is deterministic).
	Seed uint64
	// Start is the virtual time at the start (2025-01-01 when zero).
	Start time.Time
	// Tick is how often every node runs its agent and reconciles the
	// services it owns (100ms when zero).
	Tick time.Duration
	// RPCDelay is the one-way delay of a Reserve call (1ms when zero;
	// negative for none).
	RPCDelay time.Duration
	// RPCTimeout is when an owner gives up on a node that does not
	// answer (1s when zero).
	RPCTimeout time.Duration
	// GossipLag is how late each node sees other nodes' writes (none
	// when zero); NodeConfig.Lag overrides it per node.
	GossipLag time.Duration
	// DetectDelay is how long after a node goes down the others see it
	// dead (2s when zero).
	DetectDelay time.Duration
	// TTL is the reservation TTL (sched.DefaultTTL when zero).
	TTL time.Duration
	// Settle is Snapshot.Settle (sched.DefaultSettle when zero).
	Settle time.Duration
	// Retention is how long finished tasks are kept (10m when zero).
	Retention time.Duration
	// Images gives fake containers a behaviour per image; an image not
	// listed runs forever and passes its health checks.
	Images map[string]Behavior
	// AgentRounds bounds how many times a node re-runs AgentDecide in one
	// tick while it keeps producing actions (3 when zero).
	AgentRounds int
	// ObservationAge is how long an owner trusts the free capacity a
	// node reported in a Reserve answer over the task documents (1s when
	// zero; negative: never use observations).
	ObservationAge time.Duration
}

// NodeConfig describes one node.
type NodeConfig struct {
	ID       string
	Name     string
	Labels   map[string]string
	Capacity sched.Resources
	// Lag overrides Config.GossipLag for this node's view.
	Lag time.Duration
	// StartError, when set, makes every container start on this node
	// fail with it (a node that cannot run anything: its runtime down).
	StartError string
	// Images overrides Config.Images on this node (an image that crashes
	// on one node only: a device or kernel feature it lacks).
	Images map[string]Behavior
}

// Behavior is what a fake container does.
type Behavior struct {
	// RunFor is how long it runs before exiting (0: forever) with
	// ExitCode.
	RunFor   time.Duration
	ExitCode int
	// Unhealthy makes every health check fail.
	Unhealthy bool
	// StartError makes every start fail with this error.
	StartError string
}

// Stats counts what happened.
type Stats struct {
	Reconciles    int
	Reserves      int // Reserve actions started
	Calls         int // Reserve calls sent (first tries and retries)
	Accepts       int
	Rejects       int // calls a ledger refused
	Retries       int // calls after a rejection
	Unschedulable int // Unschedulable actions and Reserves that ran out of candidates
	SlotWrites    int
	Starts        int // containers started (including restarts)
	Stops         int
	StateWrites   int
}

// Cluster is a simulated cluster. It is not safe for concurrent use.
type Cluster struct {
	cfg   Config
	now   time.Time
	seq   uint64
	queue eventQueue
	st    *store
	nodes map[string]*Node
	order []string
	rng   *rand.Rand
	// admin writes (service create/update) come from this node's clock.
	admin *hlc.Clock
	// part maps each node to its side while a partition lasts (nil:
	// none); partAt is when the last one began.
	part   map[string]int
	partAt time.Time

	Stats Stats
	// Violations lists broken invariants, with the time they were seen.
	Violations []string
	// LastUnschedulable holds the latest reason per service/slot.
	LastUnschedulable map[string]string
	// Trace, when set, receives every action taken, for debugging.
	Trace func(now time.Time, node string, what string)
}

// Node is one simulated node.
type Node struct {
	c      *Cluster
	cfg    NodeConfig
	Ledger *sched.Ledger
	clock  *hlc.Clock
	down   bool
	downAt time.Time
	lag    time.Duration
	// keyLag overrides lag for the keys under a prefix (SetKeyLag).
	keyLag   map[string]time.Duration
	alive    []string // liveness view override; nil: the cluster's truth
	runtime  map[string]*container
	local    map[string]*sched.LocalTask
	inflight map[string]map[string]sched.InFlight // service → slot
	// observed and fresh hold what Reserve answers said of each node's
	// free capacity (fresh: the same figures, for NextCandidate).
	observed map[string]sched.Observation
	fresh    map[string]sched.Resources
	// seen, wasAlive and rejoined follow the liveness view: the nodes
	// ever seen alive, those alive at the last step, and when one came
	// back last.
	seen, wasAlive map[string]bool
	rejoined       time.Time
}

type container struct {
	state     sched.RuntimeState
	behavior  Behavior
	started   time.Time
	exited    time.Time
	exitCode  int
	err       string
	notRun    bool // the start failed
	passed    bool
	failures  int
	nextCheck time.Time
}

// New builds a cluster; nodes start up, active and empty.
func New(cfg Config) *Cluster {
	cfg.Start = cmp.Or(cfg.Start, time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	cfg.Tick = cmp.Or(cfg.Tick, 100*time.Millisecond)
	switch {
	case cfg.RPCDelay == 0:
		cfg.RPCDelay = time.Millisecond
	case cfg.RPCDelay < 0:
		cfg.RPCDelay = 0
	}
	cfg.RPCTimeout = cmp.Or(cfg.RPCTimeout, time.Second)
	cfg.DetectDelay = cmp.Or(cfg.DetectDelay, 2*time.Second)
	cfg.TTL = cmp.Or(cfg.TTL, sched.DefaultTTL)
	cfg.Retention = cmp.Or(cfg.Retention, 10*time.Minute)
	cfg.AgentRounds = cmp.Or(cfg.AgentRounds, 3)
	cfg.ObservationAge = cmp.Or(cfg.ObservationAge, time.Second)
	maxLag := cfg.GossipLag
	for _, n := range cfg.Nodes {
		maxLag = max(maxLag, n.Lag)
	}
	c := &Cluster{
		cfg: cfg, now: cfg.Start, st: newStore(maxLag), nodes: map[string]*Node{},
		rng:               rand.New(rand.NewPCG(cfg.Seed, 0x5ced)),
		LastUnschedulable: map[string]string{},
	}
	c.admin = hlc.NewClock(func() int64 { return c.now.UnixNano() }, time.Hour)
	for _, nc := range cfg.Nodes {
		c.AddNode(nc)
	}
	c.scheduleTick(c.now.Add(cfg.Tick))
	return c
}

// AddNode adds a node (a join): up, active, empty. Its lag must not exceed
// the largest lag given to New.
func (c *Cluster) AddNode(nc NodeConfig) *Node {
	if c.nodes[nc.ID] != nil {
		panic("sim: duplicate node " + nc.ID)
	}
	n := &Node{
		c: c, cfg: nc, Ledger: sched.NewLedger(nc.Capacity, c.cfg.TTL),
		lag: cmp.Or(nc.Lag, c.cfg.GossipLag), runtime: map[string]*container{},
		local: map[string]*sched.LocalTask{}, inflight: map[string]map[string]sched.InFlight{},
		observed: map[string]sched.Observation{}, fresh: map[string]sched.Resources{},
		seen: map[string]bool{}, wasAlive: map[string]bool{},
	}
	n.clock = hlc.NewClock(func() int64 { return c.now.UnixNano() }, time.Hour)
	c.nodes[nc.ID] = n
	c.order = append(c.order, nc.ID)
	slices.Sort(c.order)
	fields := map[string]crdt.Value{"name": crdt.String(cmp.Or(nc.Name, nc.ID)), "hostname": crdt.String(cmp.Or(nc.Name, nc.ID))}
	for k, v := range nc.Labels {
		fields["label."+k] = crdt.String(v)
	}
	maps.Copy(fields, sched.NodeFields(nc.Capacity, sched.Active))
	n.write(sched.NodeKey(nc.ID), fields)
	return n
}

// Now is the virtual time.
func (c *Cluster) Now() time.Time { return c.now }

// Node returns a node by ID.
func (c *Cluster) Node(id string) *Node { return c.nodes[id] }

// NodeIDs lists the nodes in ID order.
func (c *Cluster) NodeIDs() []string { return slices.Clone(c.order) }

func (c *Cluster) newID() string {
	return strconv.FormatUint(c.rng.Uint64()>>16, 36)
}

func (c *Cluster) trace(node, format string, args ...any) {
	if c.Trace != nil {
		c.Trace(c.now, node, fmt.Sprintf(format, args...))
	}
}

// Events.

type event struct {
	at   time.Time
	seq  uint64
	fn   func()
	tick bool // a node tick: RunUntil checks its condition after these
}

type eventQueue []event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if !q[i].at.Equal(q[j].at) {
		return q[i].at.Before(q[j].at)
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

func (c *Cluster) schedule(at time.Time, fn func()) {
	c.seq++
	heap.Push(&c.queue, event{at: at, seq: c.seq, fn: fn})
}

func (c *Cluster) scheduleTick(at time.Time) {
	c.seq++
	heap.Push(&c.queue, event{at: at, seq: c.seq, fn: c.tick, tick: true})
}

// RunFor advances virtual time by d, processing every event due.
func (c *Cluster) RunFor(d time.Duration) { c.RunUntil(func() bool { return false }, d) }

// RunUntil advances virtual time until cond holds (checked after every
// tick) or d has passed; it reports whether cond held.
func (c *Cluster) RunUntil(cond func() bool, d time.Duration) bool {
	end := c.now.Add(d)
	for len(c.queue) > 0 && !c.queue[0].at.After(end) {
		e := heap.Pop(&c.queue).(event)
		c.now = e.at
		e.fn()
		if e.tick && cond() {
			return true
		}
	}
	c.now = end
	return cond()
}
