package raftgrouptest

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"testing/cryptotest"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
)

// Options configure a Cluster.
type Options struct {
	// Nodes is the number of hosts to start with (IDs 1..Nodes).
	Nodes int
	// Seed seeds every random choice of the environment.
	Seed uint64
	// NewStateMachine returns the state machine of group g on node n
	// (default: a KV).
	NewStateMachine func(n raftgroup.NodeID, g raftgroup.GroupID) raftgroup.StateMachine
	// Configure adjusts each host's configuration.
	Configure func(*raftgroup.Config)
	// StepsPerTick is how many steps follow each tick (default 3).
	StepsPerTick int
	// TickInterval is how far the clock moves per tick (default 100ms).
	TickInterval time.Duration
	// CrashKeepsUnsynced is the percentage of unsynced writes a crash
	// keeps (0: exactly what was synced).
	CrashKeepsUnsynced int
}

// Cluster is a set of hosts over a Network with a manual clock.
type Cluster struct {
	t     testing.TB
	opts  Options
	Rand  *rand.Rand
	Net   *Network
	Clock *Clock
	nodes map[raftgroup.NodeID]*Node
	next  raftgroup.NodeID
	// Ticks counts ticks so far.
	Ticks int
}

// Node is one host of the cluster.
type Node struct {
	ID   raftgroup.NodeID
	Host *raftgroup.Host // nil while down
	FS   *vfs.MemFS
	// SMs are the state machines of the current incarnation, by group.
	SMs  map[raftgroup.GroupID]raftgroup.StateMachine
	smMu sync.Mutex
	seed uint64
	runs int
}

// Clock is a manual clock.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// New starts a cluster; it is closed when the test ends. In a test (not
// a benchmark) it also seeds crypto/rand from opts.Seed for the test's
// duration: etcd raft draws its randomized election timeouts from it, and
// a run is then a function of its seed. So a test with a Cluster cannot
// be parallel.
func New(t testing.TB, opts Options) *Cluster {
	if tt, ok := t.(*testing.T); ok {
		cryptotest.SetGlobalRandom(tt, opts.Seed)
	}
	if opts.StepsPerTick <= 0 {
		opts.StepsPerTick = 3
	}
	if opts.TickInterval <= 0 {
		opts.TickInterval = 100 * time.Millisecond
	}
	if opts.NewStateMachine == nil {
		opts.NewStateMachine = func(raftgroup.NodeID, raftgroup.GroupID) raftgroup.StateMachine { return NewKV() }
	}
	rng := rand.New(rand.NewPCG(opts.Seed, opts.Seed^0x9e3779b97f4a7c15))
	c := &Cluster{
		t:     t,
		opts:  opts,
		Rand:  rng,
		Net:   NewNetwork(rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))),
		Clock: &Clock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)},
		nodes: map[raftgroup.NodeID]*Node{},
	}
	for range opts.Nodes {
		c.AddNode()
	}
	t.Cleanup(c.Close)
	return c
}

// AddNode starts a new host with an empty disk and returns its ID.
func (c *Cluster) AddNode() raftgroup.NodeID {
	c.next++
	n := &Node{ID: c.next, FS: vfs.NewCrashableMem(), seed: c.Rand.Uint64() | 1}
	c.nodes[n.ID] = n
	c.start(n)
	return n.ID
}

func (c *Cluster) start(n *Node) {
	n.runs++
	n.SMs = map[raftgroup.GroupID]raftgroup.StateMachine{}
	cfg := raftgroup.Config{
		NodeID:    n.ID,
		Dir:       "/pebble",
		FS:        n.FS,
		Transport: c.Net.Transport(n.ID),
		NewStateMachine: func(g raftgroup.GroupID) raftgroup.StateMachine {
			sm := c.opts.NewStateMachine(n.ID, g)
			n.smMu.Lock()
			n.SMs[g] = sm
			n.smMu.Unlock()
			return sm
		},
		Now:           c.Clock.Now,
		Seed:          n.seed + uint64(n.runs)<<32,
		Deterministic: true,
		// Small journal segments: rotation and reuse happen often, and a
		// spare segment costs 1 MiB of zeros in memory, not 64.
		SegmentSize: 1 << 20,
	}
	if c.opts.Configure != nil {
		c.opts.Configure(&cfg)
	}
	h, err := raftgroup.Open(cfg)
	if err != nil {
		c.t.Fatalf("start node %d: %v", n.ID, err)
	}
	n.Host = h
	c.Net.Attach(n.ID, h)
}

// Close stops every host.
func (c *Cluster) Close() {
	for _, id := range c.NodeIDs() {
		if n := c.nodes[id]; n.Host != nil {
			_ = n.Host.Close()
			n.Host = nil
		}
	}
}

// NodeIDs lists every node, up or down, in order.
func (c *Cluster) NodeIDs() []raftgroup.NodeID {
	ids := make([]raftgroup.NodeID, 0, len(c.nodes))
	for id := range c.nodes {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Up lists the running nodes.
func (c *Cluster) Up() []raftgroup.NodeID {
	var ids []raftgroup.NodeID
	for _, id := range c.NodeIDs() {
		if c.nodes[id].Host != nil {
			ids = append(ids, id)
		}
	}
	return ids
}

// Node returns node id.
func (c *Cluster) Node(id raftgroup.NodeID) *Node { return c.nodes[id] }

// Host returns node id's host (nil while it is down).
func (c *Cluster) Host(id raftgroup.NodeID) *raftgroup.Host { return c.nodes[id].Host }

// SM returns the state machine of group g on node id (current
// incarnation).
func (c *Cluster) SM(id raftgroup.NodeID, g raftgroup.GroupID) raftgroup.StateMachine {
	n := c.nodes[id]
	n.smMu.Lock()
	defer n.smMu.Unlock()
	return n.SMs[g]
}

// CreateGroup bootstraps group g on nodes, with replica i+1 on nodes[i].
func (c *Cluster) CreateGroup(g raftgroup.GroupID, nodes ...raftgroup.NodeID) {
	members := make([]raftgroup.Member, len(nodes))
	for i, n := range nodes {
		members[i] = raftgroup.Member{Replica: raftgroup.ReplicaID(i + 1), Node: n}
	}
	for i, n := range nodes {
		if err := c.Host(n).CreateGroup(g, raftgroup.ReplicaID(i+1), members); err != nil {
			c.t.Fatalf("create group %d on node %d: %v", g, n, err)
		}
	}
}

// Step runs one round on every live host, then delivers due messages.
func (c *Cluster) Step() {
	for _, id := range c.Up() {
		c.nodes[id].Host.Round()
	}
	c.Net.Deliver()
}

// Tick advances the clock and every live host's logical clock by one
// tick, then runs StepsPerTick steps.
func (c *Cluster) Tick() {
	c.tick(nil)
}

// tick is Tick; it stops before a step once cond, if not nil, holds.
func (c *Cluster) tick(cond func() bool) bool {
	c.Ticks++
	c.Clock.Advance(c.opts.TickInterval)
	for _, id := range c.Up() {
		c.nodes[id].Host.Tick()
	}
	for range c.opts.StepsPerTick {
		if cond != nil && cond() {
			return true
		}
		c.Step()
	}
	return false
}

// RunTicks runs n ticks.
func (c *Cluster) RunTicks(n int) {
	for range n {
		c.Tick()
	}
}

// RunUntil ticks until cond holds (checked before each tick) or maxTicks
// passed; it reports whether cond held.
func (c *Cluster) RunUntil(maxTicks int, cond func() bool) bool {
	for range maxTicks {
		if cond() {
			return true
		}
		c.Tick()
	}
	return cond()
}

// RunUntilStep is RunUntil with cond checked before every step too, for
// a test that must act between two rounds.
func (c *Cluster) RunUntilStep(maxTicks int, cond func() bool) bool {
	for range maxTicks {
		if cond() || c.tick(cond) {
			return true
		}
	}
	return cond()
}

// Await ticks until f resolves (at most maxTicks) and returns its outcome;
// an unresolved future fails the test.
func Await[T any](c *Cluster, f *raftgroup.Future[T], maxTicks int) (T, error) {
	done := func() bool { return Resolved(f) }
	// A step first: a request queued just now may resolve within a round.
	for range c.opts.StepsPerTick {
		if done() {
			break
		}
		c.Step()
	}
	if !c.RunUntil(maxTicks, done) {
		c.t.Fatalf("future not resolved after %d ticks", maxTicks)
	}
	return f.Result()
}

// Resolved reports whether f has resolved, without waiting.
func Resolved[T any](f *raftgroup.Future[T]) bool {
	select {
	case <-f.Done():
		return true
	default:
		return false
	}
}

// Leader returns the node holding the leader of group g with the highest
// term among live nodes.
func (c *Cluster) Leader(g raftgroup.GroupID) (raftgroup.NodeID, raftgroup.GroupStatus, bool) {
	var (
		best   raftgroup.NodeID
		bestSt raftgroup.GroupStatus
	)
	for _, id := range c.Up() {
		st, err := c.Host(id).Status(g)
		if err != nil || st.Role != "leader" || st.Removed {
			continue
		}
		if best == 0 || st.Term > bestSt.Term {
			best, bestSt = id, st
		}
	}
	return best, bestSt, best != 0
}

// WaitLeader ticks until group g has a leader that a majority of its live
// voters follow, and returns its node.
func (c *Cluster) WaitLeader(g raftgroup.GroupID, maxTicks int) raftgroup.NodeID {
	var leader raftgroup.NodeID
	ok := c.RunUntil(maxTicks, func() bool {
		id, st, ok := c.Leader(g)
		if !ok {
			return false
		}
		agree := 0
		for _, m := range st.Voters {
			h := c.nodes[m.Node]
			if h == nil || h.Host == nil {
				continue
			}
			s, err := h.Host.Status(g)
			if err == nil && s.Leader == st.Replica && s.Term == st.Term {
				agree++
			}
		}
		if agree*2 > len(st.Voters) {
			leader = id
			return true
		}
		return false
	})
	if !ok {
		c.t.Fatalf("group %d: no leader after %d ticks\n%s", g, maxTicks, c.String(g))
	}
	return leader
}

// Crash kills node id: its host stops at once and its disk keeps what was
// synced (plus CrashKeepsUnsynced percent of the rest).
func (c *Cluster) Crash(id raftgroup.NodeID) {
	n := c.nodes[id]
	if n.Host == nil {
		return
	}
	c.Net.Detach(id)
	var rng *rand.Rand
	if c.opts.CrashKeepsUnsynced > 0 {
		rng = rand.New(rand.NewPCG(c.Rand.Uint64(), c.Rand.Uint64()))
	}
	crashed, err := crashDisk(n.FS, c.opts.CrashKeepsUnsynced, rng)
	if err != nil {
		c.t.Fatalf("crash node %d: %v", id, err)
	}
	_ = n.Host.Close()
	n.Host = nil
	n.FS = crashed
}

// Restart starts a crashed node again from its disk.
func (c *Cluster) Restart(id raftgroup.NodeID) {
	n := c.nodes[id]
	if n.Host != nil {
		c.t.Fatalf("node %d is running", id)
	}
	c.start(n)
}

// Require fails the test unless cond holds.
func (c *Cluster) Require(cond bool, format string, args ...any) {
	c.t.Helper()
	if !cond {
		c.t.Fatalf(format, args...)
	}
}

// String describes the cluster's view of group g (for failure messages).
func (c *Cluster) String(g raftgroup.GroupID) string {
	s := ""
	for _, id := range c.NodeIDs() {
		h := c.Host(id)
		if h == nil {
			s += fmt.Sprintf("node %d: down\n", id)
			continue
		}
		st, err := h.Status(g)
		if err != nil {
			s += fmt.Sprintf("node %d: %v\n", id, err)
			continue
		}
		s += fmt.Sprintf("node %d: replica %d %s term %d lead %d commit %d applied %d last %d first %d quiesced %v voters %v",
			id, st.Replica, st.Role, st.Term, st.Leader, st.Commit, st.Applied, st.LastIndex, st.FirstIndex, st.Quiesced, st.Voters)
		if len(st.VotersOutgoing) > 0 {
			s += fmt.Sprintf(" outgoing %v", st.VotersOutgoing)
		}
		if st.Removed || !st.Initialized || st.Err != nil {
			s += fmt.Sprintf(" removed %v initialized %v err %v", st.Removed, st.Initialized, st.Err)
		}
		s += "\n"
	}
	return s
}
