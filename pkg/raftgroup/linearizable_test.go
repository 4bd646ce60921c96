package raftgroup_test

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	rgt "github.com/shoal-dev/shoal/pkg/raftgroup/raftgrouptest"
)

// kvInput and kvOutput are the porcupine history of the KV state machine.
type kvInput struct {
	group raftgroup.GroupID
	op    string // get, put, cas
	key   string
	value string
	old   string
}

type kvOutput struct {
	ok      bool
	value   string // get: the value read; put/cas: the value before
	unknown bool   // the client never learned the outcome
}

// kvModel is a register per (group, key) with put and compare-and-swap.
// A write whose outcome is unknown may take effect at any point after its
// call (its return is at infinity).
var kvModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			in := op.Input.(kvInput)
			k := fmt.Sprint(in.group, "/", in.key)
			if _, ok := by[k]; !ok {
				keys = append(keys, k)
			}
			by[k] = append(by[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, by[k])
		}
		return out
	},
	Init: func() any { return "" },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(string), input.(kvInput), output.(kvOutput)
		switch in.op {
		case "get":
			return out.value == s, s
		case "put":
			if out.unknown {
				return true, in.value
			}
			return out.ok && out.value == s, in.value
		case "cas":
			if out.unknown {
				if s == in.old {
					return true, in.value
				}
				return true, s
			}
			if out.ok {
				return s == in.old && out.value == s, in.value
			}
			return s != in.old && out.value == s, s
		}
		return false, s
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(kvInput), output.(kvOutput)
		return fmt.Sprintf("%s(%s %q %q) -> %v %q unknown=%v", in.op, in.key, in.value, in.old, out.ok, out.value, out.unknown)
	},
}

// client is a logical client with at most one operation in flight.
type client struct {
	id      int
	node    raftgroup.NodeID
	in      kvInput
	call    int64
	started int
	write   *raftgroup.Future[raftgroup.Result]
	read    *raftgroup.Future[uint64]
	busy    bool
	seq     int
}

// lockedBuffer is a log sink for several hosts and their goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func seedFromEnv(def uint64) uint64 {
	if s := os.Getenv("RAFTGROUP_SEED"); s != "" {
		if v, err := strconv.ParseUint(s, 10, 64); err == nil {
			return v
		}
	}
	return def
}

// TestLinearizableKV runs concurrent clients doing reads (ReadIndex, then
// a local read on whichever host they talk to), puts and compare-and-swaps
// on two groups of five nodes, under message loss, delay and reordering,
// random partitions and leader kills (crashes that lose unsynced data),
// and checks the history with porcupine. Then it heals everything and
// checks that every replica holds the same data and that no acknowledged
// write was lost (final reads are part of the history).
func TestLinearizableKV(t *testing.T) {
	seed := seedFromEnv(31)
	t.Logf("seed %d (RAFTGROUP_SEED)", seed)
	linearizableKV(t, seed, lkvOptions{})
}

// TestLinearizableKVSegments is TestLinearizableKV with every entry's data
// in the segment log (segments.go), so that its crashes, restarts,
// snapshots and truncations go through the segment files.
func TestLinearizableKVSegments(t *testing.T) {
	seed := seedFromEnv(32)
	t.Logf("seed %d (RAFTGROUP_SEED)", seed)
	linearizableKV(t, seed, lkvOptions{largeEntry: 1})
}

// TestLinearizableKVFollow is TestLinearizableKV with FollowProposers on
// and most operations sent to one node (a different one every 10 s), so
// that leadership moves to it under the same faults.
func TestLinearizableKVFollow(t *testing.T) {
	seed := seedFromEnv(33)
	t.Logf("seed %d (RAFTGROUP_SEED)", seed)
	linearizableKV(t, seed, lkvOptions{follow: true})
}

// TestLinearizableKVMembership is TestLinearizableKV with groups of three
// replicas on the five nodes whose members are replaced under the faults,
// as vold's repair does: while a node is down, a replica on a spare node
// joins, and one joint change adds it and removes the down node's. The
// removed replicas retire once they learn it (on restart, or told as vold
// tells them) and are destroyed once Removed; clients use the nodes whose
// replica is a voter.
func TestLinearizableKVMembership(t *testing.T) {
	seed := seedFromEnv(34)
	t.Logf("seed %d (RAFTGROUP_SEED)", seed)
	linearizableKV(t, seed, lkvOptions{churn: true})
}

// TestLinearizableKVMembershipLive is TestLinearizableKVMembership whose
// changes also remove live members: a follower, the leader.
func TestLinearizableKVMembershipLive(t *testing.T) {
	seed := seedFromEnv(35)
	t.Logf("seed %d (RAFTGROUP_SEED)", seed)
	linearizableKV(t, seed, lkvOptions{churn: true, liveVictims: true})
}

// lkvOptions vary linearizableKV: entry data in the segment log
// (largeEntry), leadership following the busiest proposer (follow), and
// membership changes under the faults (churn).
type lkvOptions struct {
	largeEntry int
	follow     bool
	churn      bool
	// liveVictims: churn also replaces live members (a follower, the
	// leader), not only the crashed node's.
	liveVictims bool
	// trail keeps every delivered batch's digest (rgt.Network.Trail).
	trail bool
}

// lkvRun is what a run of linearizableKV did, for comparing two runs of a
// seed.
type lkvRun struct {
	digest     uint64 // rgt.Network.Digest
	deliveries []rgt.Delivery
	history    []porcupine.Operation
}

func linearizableKV(t *testing.T, seed uint64, o lkvOptions) lkvRun {
	largeEntry, follow := o.largeEntry, o.follow
	// RAFTGROUP_LOG=1 keeps the hosts' logs and prints them if the run
	// fails or panics.
	var logs *lockedBuffer
	if os.Getenv("RAFTGROUP_LOG") != "" {
		logs = &lockedBuffer{}
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("hosts' log:\n%s", logs.String())
			}
		})
		defer func() {
			if r := recover(); r != nil {
				fmt.Fprintf(os.Stderr, "hosts' log:\n%s", logs.String())
				panic(r)
			}
		}()
	}
	c := rgt.New(t, rgt.Options{Nodes: 5, Seed: seed, CrashKeepsUnsynced: 50, Configure: func(cfg *raftgroup.Config) {
		if logs != nil {
			cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		}
		cfg.SnapshotEntries = 20
		cfg.CompactionMargin = 2
		cfg.LargeEntry = largeEntry
		cfg.FollowProposers = follow
	}})
	c.Net.DropRate = 0.03
	c.Net.MaxDelay = 2
	c.Net.Trail = o.trail
	groups := []raftgroup.GroupID{1, 2}
	for i, g := range groups {
		if o.churn {
			// Three replicas each, sharing node 3: two spare nodes per group.
			c.CreateGroup(g, raftgroup.NodeID(2*i+1), raftgroup.NodeID(2*i+2), raftgroup.NodeID(2*i+3))
		} else {
			c.CreateGroup(g, 1, 2, 3, 4, 5)
		}
		c.WaitLeader(g, 100)
	}
	// voters returns the live nodes whose replica of g is an initialized
	// voter, as that replica knows.
	voters := func(g raftgroup.GroupID) []raftgroup.NodeID {
		var out []raftgroup.NodeID
		for _, n := range c.Up() {
			st, err := c.Host(n).Status(g)
			if err != nil || st.Removed || !st.Initialized || st.Err != nil {
				continue
			}
			for _, v := range st.Voters {
				if v.Replica == st.Replica {
					out = append(out, n)
					break
				}
			}
		}
		return out
	}
	rng := c.Rand
	keys := []string{"a", "b", "c"}
	var (
		history []porcupine.Operation
		now     int64
		clients []*client
		acked   int
	)
	nclients := 8
	if follow {
		// Enough writes through one node to move leadership, and more
		// keys, so that porcupine still checks a history with that many
		// clients (and their unknown outcomes) in seconds.
		nclients = 32
		keys = append(keys, "d", "e", "f")
	}
	for i := range nclients {
		clients = append(clients, &client{id: i})
	}
	// The index of the last acknowledged successful write of each key, and
	// the index each acknowledged value was written at.
	type gkey struct {
		g raftgroup.GroupID
		k string
	}
	lastAcked := map[gkey]uint64{}
	ackedAt := map[string]uint64{}
	record := func(cl *client, out kvOutput, ret int64) {
		history = append(history, porcupine.Operation{ClientId: cl.id, Input: cl.in, Call: cl.call, Output: out, Return: ret})
		cl.busy = false
	}
	const opTimeout = 40 // ticks
	poll := func() {
		for _, cl := range clients {
			if !cl.busy {
				continue
			}
			switch {
			case cl.write != nil:
				select {
				case <-cl.write.Done():
					res, err := cl.write.Result()
					cl.write = nil
					if err != nil {
						record(cl, kvOutput{unknown: true}, math.MaxInt64)
						continue
					}
					r, derr := rgt.DecodeKVResult(res.Data)
					if derr != nil {
						t.Fatal(derr)
					}
					acked++
					if r.OK {
						k := gkey{cl.in.group, cl.in.key}
						lastAcked[k] = max(lastAcked[k], res.Index)
						ackedAt[cl.in.value] = res.Index
					}
					record(cl, kvOutput{ok: r.OK, value: r.Value}, now)
				default:
					if c.Ticks-cl.started > opTimeout {
						cl.write.Cancel()
						cl.write = nil
						record(cl, kvOutput{unknown: true}, math.MaxInt64)
					}
				}
			case cl.read != nil:
				select {
				case <-cl.read.Done():
					_, err := cl.read.Result()
					cl.read = nil
					if err != nil || c.Host(cl.node) == nil || c.SM(cl.node, cl.in.group) == nil {
						cl.busy = false // a failed read has no effect: drop it
						continue
					}
					v := kvOf(c, cl.node, cl.in.group).Get(cl.in.key)
					record(cl, kvOutput{ok: true, value: v}, now)
				default:
					if c.Ticks-cl.started > opTimeout {
						cl.read.Cancel()
						cl.read = nil
						cl.busy = false
					}
				}
			}
		}
	}
	var hot raftgroup.NodeID // with follow: the node most operations go to
	start := func(cl *client) {
		in := kvInput{group: groups[rng.IntN(len(groups))], key: keys[rng.IntN(len(keys))]}
		up := c.Up()
		if o.churn {
			up = voters(in.group)
			if len(up) == 0 {
				return
			}
		}
		cl.node = up[rng.IntN(len(up))]
		if follow && c.Host(hot) != nil && rng.Float64() < 0.8 {
			cl.node = hot
		}
		cl.seq++
		h := c.Host(cl.node)
		switch p := rng.IntN(10); {
		case p < 4:
			in.op = "get"
			cl.read = h.ReadIndexAsync(in.group)
		case p < 7:
			in.op = "put"
			in.value = fmt.Sprintf("c%d-%d", cl.id, cl.seq)
			cl.write = h.Submit(in.group, raftgroup.Proposal{Data: rgt.KVOp{Op: "put", Key: in.key, Value: in.value}.Encode()})
		default:
			in.op = "cas"
			in.value = fmt.Sprintf("c%d-%d", cl.id, cl.seq)
			// Expect what this client's host has now (often current, sometimes
			// stale): both outcomes get exercised.
			in.old = kvOf(c, cl.node, in.group).Get(in.key)
			cl.write = h.Submit(in.group, raftgroup.Proposal{Data: rgt.KVOp{Op: "cas", Key: in.key, Value: in.value, Old: in.old}.Encode()})
		}
		cl.in, cl.call, cl.started, cl.busy = in, now, c.Ticks, true
	}

	var quiesced, snaps, retries, transfers uint64
	addStats := func(s raftgroup.Stats) {
		quiesced += s.QuiesceEntered
		snaps += s.SnapshotsSent
		retries += s.ProposalRetries
		transfers += s.LeaderTransfers
	}
	var (
		partitioned   = -1 // tick the partition started, -1: none
		crashed       raftgroup.NodeID
		crashedAt     int
		crashes, cuts int
	)
	// Membership churn (o.churn): at most one change in flight per group.
	// A replica whose change failed stays until the group's applied
	// configuration shows its ID can no longer be added (the group admitted
	// a greater one without it): destroying it earlier could take a voter's
	// state away if the change still commits.
	type pendingChange struct {
		fut *raftgroup.Future[raftgroup.Membership]
		at  int
	}
	var (
		changing           = map[raftgroup.GroupID]*pendingChange{}
		changed, unchanged int
	)
	isMember := func(st raftgroup.GroupStatus, r raftgroup.ReplicaID) bool {
		for _, ms := range [][]raftgroup.Member{st.Voters, st.VotersOutgoing, st.Learners} {
			for _, m := range ms {
				if m.Replica == r {
					return true
				}
			}
		}
		return false
	}
	tidy := func() {
		for _, g := range groups {
			_, lst, led := c.Leader(g)
			for _, n := range c.Up() {
				st, err := c.Host(n).Status(g)
				if err != nil {
					continue
				}
				// A replica the leader's configuration dropped is
				// told so, as vold does from the volume's document: it
				// retires, and is destroyed once Removed.
				orphan := led && len(lst.VotersOutgoing) == 0 && lst.MaxReplica >= st.Replica && !isMember(lst, st.Replica)
				switch {
				case st.Removed:
					if err := c.Host(n).DestroyGroup(g); err != nil {
						t.Fatalf("destroy group %d on node %d: %v", g, n, err)
					}
				case orphan && !st.Retiring:
					if err := c.Host(n).Retire(g, lst.Voters); err != nil && !errors.Is(err, raftgroup.ErrRemoved) {
						t.Fatalf("retire group %d on node %d: %v", g, n, err)
					}
				}
			}
		}
	}
	churn := func(tick int) {
		tidy()
		for _, g := range groups {
			if ch := changing[g]; ch != nil {
				select {
				case <-ch.fut.Done():
					if _, err := ch.fut.Result(); err != nil {
						t.Logf("tick %d: group %d: change failed: %v", tick, g, err)
						unchanged++
					} else {
						changed++
					}
					delete(changing, g)
				default:
					if tick-ch.at > 100 {
						ch.fut.Cancel()
						unchanged++
						delete(changing, g)
					}
				}
				continue
			}
			if rng.Float64() >= 0.2 {
				continue
			}
			l, st, ok := c.Leader(g)
			if !ok || len(st.VotersOutgoing) > 0 {
				continue
			}
			var spares []raftgroup.NodeID
			for _, n := range c.Up() {
				if _, err := c.Host(n).Status(g); errors.Is(err, raftgroup.ErrGroupNotFound) {
					spares = append(spares, n)
				}
			}
			if len(spares) == 0 {
				continue
			}
			// The victim is the crashed node's replica, as vold's repair
			// replaces a member whose node is dead.
			var victim raftgroup.ReplicaID
			for _, v := range st.Voters {
				if v.Node == crashed {
					victim = v.Replica
				}
			}
			if victim == 0 && o.liveVictims {
				victim = st.Voters[rng.IntN(len(st.Voters))].Replica
			}
			if victim == 0 {
				continue
			}
			n := spares[rng.IntN(len(spares))]
			next, err := c.Host(l).NextReplicaID(g)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Host(n).JoinGroup(g, next); err != nil {
				t.Fatalf("join group %d on node %d as %d: %v", g, n, next, err)
			}
			t.Logf("tick %d: group %d: replica %d on node %d replaces %d, proposed on node %d", tick, g, next, n, victim, l)
			changing[g] = &pendingChange{fut: c.Host(l).ChangeMembershipAsync(g, raftgroup.Replace(victim, next, n)...), at: tick}
		}
	}
	const chaosTicks = 800
	// With churn a crashed node stays down longer: its groups need a new
	// leader first, and only then can one replace its member (vold waits
	// for a node to be dead past a timeout). 15 ticks left one seed in
	// about 900 without a single change.
	minDown := 15
	if o.churn {
		minDown = 40
	}
	for tick := range chaosTicks {
		if follow && tick%100 == 0 {
			up := c.Up()
			hot = up[rng.IntN(len(up))]
		}
		// Faults.
		switch {
		case partitioned < 0 && rng.Float64() < 0.03:
			nodes := c.NodeIDs()
			rng.Shuffle(len(nodes), func(i, j int) { nodes[i], nodes[j] = nodes[j], nodes[i] })
			k := 1 + rng.IntN(2)
			c.Net.Partition(nodes[:k], nodes[k:])
			partitioned = tick
			cuts++
		case partitioned >= 0 && tick-partitioned > 10 && rng.Float64() < 0.1:
			c.Net.Heal()
			partitioned = -1
		}
		if crashed == 0 && rng.Float64() < 0.02 {
			if l, _, ok := c.Leader(groups[rng.IntN(len(groups))]); ok {
				addStats(c.Host(l).Stats())
				c.Crash(l)
				crashed, crashedAt = l, tick
				crashes++
			}
		} else if crashed != 0 && tick-crashedAt > minDown && rng.Float64() < 0.1 {
			c.Restart(crashed)
			crashed = 0
		}
		if o.churn {
			churn(tick)
		}
		// Clients, with idle stretches in which groups quiesce (and faults
		// still happen).
		if idle := tick%80 >= 60; !idle {
			for _, cl := range clients {
				if !cl.busy && rng.Float64() < 0.5 {
					start(cl)
				}
			}
		}
		c.Clock.Advance(100 * time.Millisecond)
		c.Ticks++
		for _, n := range c.Up() {
			c.Host(n).Tick()
		}
		for range 3 {
			now++
			c.Step()
			now++
			poll()
		}
	}
	// Heal, restart, settle; finish the clients' operations.
	c.Net.Heal()
	c.Net.DropRate, c.Net.MaxDelay = 0, 0
	if crashed != 0 {
		c.Restart(crashed)
	}
	for _, g := range groups {
		c.WaitLeader(g, 200)
	}
	for range 100 {
		c.Tick()
		now++
		poll()
	}
	// Final members: every node without churn; with it, the voters of the
	// leader's configuration once the last changes settled and removed or
	// orphaned replicas are gone.
	final := map[raftgroup.GroupID][]raftgroup.NodeID{}
	for _, g := range groups {
		final[g] = c.NodeIDs()
	}
	if o.churn {
		for _, g := range groups {
			ch := changing[g]
			if ch == nil {
				continue
			}
			if !c.RunUntil(300, func() bool { return rgt.Resolved(ch.fut) }) {
				t.Fatalf("membership change of group %d not resolved\n%s", g, c.String(g))
			}
			if _, err := ch.fut.Result(); err != nil {
				unchanged++
			} else {
				changed++
			}
		}
		for _, g := range groups {
			var st raftgroup.GroupStatus
			if !c.RunUntil(300, func() bool {
				var ok bool
				_, st, ok = c.Leader(g)
				return ok && len(st.VotersOutgoing) == 0
			}) {
				t.Fatalf("group %d left no joint configuration\n%s", g, c.String(g))
			}
			final[g] = nil
			for _, v := range st.Voters {
				final[g] = append(final[g], v.Node)
			}
		}
		// With every node up, every voter answers: each replica the
		// groups removed is Removed (and destroyed) in a few pings.
		var left []string
		if !c.RunUntil(100, func() bool {
			tidy()
			left = nil
			for _, g := range groups {
				for _, n := range c.NodeIDs() {
					// (A replica that joined for a change that failed
					// never held the group's state: nothing waits for it.)
					if st, err := c.Host(n).Status(g); err == nil && st.Initialized && !slices.Contains(final[g], n) {
						left = append(left, fmt.Sprintf("group %d on node %d: %+v", g, n, st))
					}
				}
			}
			return len(left) == 0
		}) {
			var all strings.Builder
			for _, g := range groups {
				fmt.Fprintf(&all, "group %d:\n%s\n", g, c.String(g))
				if l, st, ok := c.Leader(g); ok {
					fmt.Fprintf(&all, "leader %d's progress: %+v\n", l, st.Progress)
				}
			}
			t.Fatalf("removed replicas never retired: %v\n%s", left, all.String())
		}
		t.Logf("membership changes: %d made, %d failed or given up", changed, unchanged)
		if changed == 0 {
			t.Fatalf("no membership change was made")
		}
	}
	for _, cl := range clients {
		if cl.busy {
			if cl.write != nil {
				cl.write.Cancel()
				record(cl, kvOutput{unknown: true}, math.MaxInt64)
			} else {
				cl.read.Cancel()
				cl.busy = false
			}
		}
	}
	// Final reads of every key on every node: an acknowledged write that
	// was lost (or applied twice over a later one) shows up here.
	for _, g := range groups {
		for _, n := range final[g] {
			for _, k := range keys {
				cl := &client{id: len(clients), node: n}
				cl.in, cl.call = kvInput{group: g, op: "get", key: k}, now
				f := c.Host(n).ReadIndexAsync(g)
				if !c.RunUntil(200, func() bool { return rgt.Resolved(f) }) {
					t.Fatalf("final read of group %d on node %d not resolved\n%s", g, n, c.String(g))
				}
				if _, err := f.Result(); err != nil {
					t.Fatalf("final read on node %d: %v", n, err)
				}
				now++
				record(cl, kvOutput{ok: true, value: kvOf(c, n, g).Get(k)}, now)
			}
		}
		data := converge(t, c, g, final[g]...)
		// No acknowledged write lost: each key holds a value written no
		// earlier than its last acknowledged write (values are unique; one
		// whose outcome was unknown to its client is not in ackedAt, and
		// porcupine placed it).
		for _, k := range keys {
			last, ok := lastAcked[gkey{g, k}]
			if !ok {
				continue
			}
			v := data[k]
			if v == "" {
				t.Fatalf("group %d key %s: empty after a write acknowledged at %d", g, k, last)
			}
			if at, known := ackedAt[v]; known && at < last {
				t.Fatalf("group %d key %s: final value %q written at %d, before the write acknowledged at %d", g, k, v, at, last)
			}
		}
	}
	unknown := 0
	for _, op := range history {
		if op.Output.(kvOutput).unknown {
			unknown++
		}
	}
	for _, n := range c.Up() {
		addStats(c.Host(n).Stats())
	}
	t.Logf("%d operations (%d acknowledged writes, %d unknown outcomes), %d partitions, %d leader kills; %d quiescences, %d snapshots sent, %d proposal retries, %d leadership transfers to the busiest proposer",
		len(history), acked, unknown, cuts, crashes, quiesced, snaps, retries, transfers)
	if acked < 100 || crashes == 0 || cuts == 0 {
		t.Fatalf("too little happened: %d acknowledged writes, %d crashes, %d partitions", acked, crashes, cuts)
	}
	if follow && transfers == 0 {
		t.Fatalf("leadership never followed the busiest proposer")
	}
	res, info := porcupine.CheckOperationsVerbose(kvModel, history, 30*time.Second)
	if res != porcupine.Ok {
		path := t.TempDir() + "/history.html"
		if f, err := os.Create(path); err == nil {
			_ = porcupine.Visualize(kvModel, info, f)
			f.Close()
		}
		t.Fatalf("history is not linearizable (%s); visualization in %s", res, path)
	}
	return lkvRun{digest: c.Net.Digest(), deliveries: c.Net.Deliveries(), history: history}
}
