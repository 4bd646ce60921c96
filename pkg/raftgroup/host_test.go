package raftgroup_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	rgt "github.com/shoal-dev/shoal/pkg/raftgroup/raftgrouptest"
)

func put(k, v string) []byte { return rgt.KVOp{Op: "put", Key: k, Value: v}.Encode() }

func kvOf(c *rgt.Cluster, n raftgroup.NodeID, g raftgroup.GroupID) *rgt.KV {
	switch sm := c.SM(n, g).(type) {
	case *rgt.AppendingKV:
		return sm.KV
	case *rgt.WritingKV:
		return sm.KV
	case *rgt.ForkingKV:
		return sm.KV
	}
	return c.SM(n, g).(*rgt.KV)
}

func TestElectAndReplicate(t *testing.T) {
	c := rgt.New(t, rgt.Options{Nodes: 3, Seed: 1})
	c.CreateGroup(1, 1, 2, 3)
	leader := c.WaitLeader(1, 100)
	t.Logf("leader on node %d", leader)
	for i := range 10 {
		f := c.Host(leader).Submit(1, raftgroup.Proposal{Data: put(fmt.Sprint("k", i), "v")})
		res, err := rgt.Await(c, f, 50)
		if err != nil {
			t.Fatal(err)
		}
		if res.Index == 0 {
			t.Fatal("no index")
		}
	}
	c.RunTicks(5)
	for _, n := range c.Up() {
		d, _ := kvOf(c, n, 1).Dump()
		if len(d) != 10 {
			t.Fatalf("node %d has %d keys\n%s", n, len(d), c.String(1))
		}
	}
	t.Log(c.String(1))
}

// write proposes put(k, v) on node n and waits for it.
func write(t *testing.T, c *rgt.Cluster, n raftgroup.NodeID, g raftgroup.GroupID, k, v string) raftgroup.Result {
	t.Helper()
	res, err := rgt.Await(c, c.Host(n).Submit(g, raftgroup.Proposal{Data: put(k, v)}), 200)
	if err != nil {
		t.Fatalf("write %s=%s on node %d: %v\n%s", k, v, n, err, c.String(g))
	}
	return res
}

// otherThan returns a node of a three-node cluster other than n (1 or 2).
func otherThan(n raftgroup.NodeID) raftgroup.NodeID {
	if n == 1 {
		return 2
	}
	return 1
}

// settledGroup creates group 1 on nodes 1 to 3 and returns its leader and
// followers once a write went through and a few ticks passed.
func settledGroup(t *testing.T, c *rgt.Cluster) (raftgroup.NodeID, []raftgroup.NodeID) {
	t.Helper()
	c.CreateGroup(1, 1, 2, 3)
	leader := c.WaitLeader(1, 100)
	write(t, c, leader, 1, "warm", "up")
	c.RunTicks(3)
	var followers []raftgroup.NodeID
	for _, n := range c.Up() {
		if n != leader {
			followers = append(followers, n)
		}
	}
	return leader, followers
}

// converge ticks until every live replica of g applied the same index and
// holds the same data, and returns that data.
func converge(t *testing.T, c *rgt.Cluster, g raftgroup.GroupID, nodes ...raftgroup.NodeID) map[string]string {
	t.Helper()
	var data map[string]string
	ok := c.RunUntil(300, func() bool {
		data = nil
		var applied uint64
		for i, n := range nodes {
			if c.Host(n) == nil {
				return false
			}
			d, a := kvOf(c, n, g).Dump()
			if i == 0 {
				data, applied = d, a
				continue
			}
			if a != applied || len(d) != len(data) {
				return false
			}
			for k, v := range data {
				if d[k] != v {
					return false
				}
			}
		}
		return true
	})
	if !ok {
		t.Fatalf("group %d did not converge on %v\n%s", g, nodes, c.String(g))
	}
	return data
}

func TestManyGroups(t *testing.T) {
	c := rgt.New(t, rgt.Options{Nodes: 3, Seed: 2})
	const groups = 20
	for g := raftgroup.GroupID(1); g <= groups; g++ {
		c.CreateGroup(g, 1, 2, 3)
	}
	for g := raftgroup.GroupID(1); g <= groups; g++ {
		l := c.WaitLeader(g, 100)
		write(t, c, l, g, "k", fmt.Sprint("g", g))
	}
	for g := raftgroup.GroupID(1); g <= groups; g++ {
		d := converge(t, c, g, 1, 2, 3)
		if d["k"] != fmt.Sprint("g", g) {
			t.Fatalf("group %d: %v", g, d)
		}
	}
	// Persisting is batched across groups: far fewer synced commits than
	// groups × writes × replicas.
	for _, n := range c.Up() {
		t.Logf("node %d: %+v", n, c.Host(n).Stats())
	}
}

func TestProposeOnFollower(t *testing.T) {
	c := rgt.New(t, rgt.Options{Nodes: 3, Seed: 3})
	c.CreateGroup(7, 1, 2, 3)
	l := c.WaitLeader(7, 100)
	f := raftgroup.NodeID(1)
	if f == l {
		f = 2
	}
	res := write(t, c, f, 7, "a", "1")
	if r, _ := rgt.DecodeKVResult(res.Data); !r.OK {
		t.Fatalf("result %+v", r)
	}
	if got := kvOf(c, f, 7).Get("a"); got != "1" {
		t.Fatalf("follower read %q after its own write applied", got)
	}
}

func TestCrashRestartCatchesUp(t *testing.T) {
	c := rgt.New(t, rgt.Options{Nodes: 3, Seed: 4})
	c.CreateGroup(1, 1, 2, 3)
	l := c.WaitLeader(1, 100)
	write(t, c, l, 1, "before", "x")
	victim := raftgroup.NodeID(1)
	if victim == l {
		victim = 3
	}
	c.Crash(victim)
	for i := range 20 {
		write(t, c, l, 1, fmt.Sprint("k", i), "v")
	}
	c.Restart(victim)
	d := converge(t, c, 1, 1, 2, 3)
	if len(d) != 21 {
		t.Fatalf("%d keys", len(d))
	}
}

// A replica that missed compacted entries gets a snapshot, from a state
// machine that returns it (Snapshot), appends it to the host's header
// (SnapshotAppender), or writes it (SnapshotWriter: the host's own
// snapshots, of at least LargeEntry bytes, go straight into its journal,
// and a restart restores from them).
func TestCatchUpBySnapshot(t *testing.T) {
	t.Run("Snapshot", func(t *testing.T) { testCatchUpBySnapshot(t, "") })
	t.Run("AppendSnapshot", func(t *testing.T) { testCatchUpBySnapshot(t, "append") })
	t.Run("WriteSnapshot", func(t *testing.T) { testCatchUpBySnapshot(t, "write") })
}

func testCatchUpBySnapshot(t *testing.T, mode string) {
	appending, writing := mode == "append", mode == "write"
	opts := rgt.Options{Nodes: 3, Seed: 5, Configure: func(cfg *raftgroup.Config) {
		cfg.SnapshotEntries = 10
		cfg.CompactionMargin = 2
		if writing {
			cfg.LargeEntry = 64 // the snapshots of 10+ keys are larger
		}
	}}
	if appending {
		opts.NewStateMachine = func(raftgroup.NodeID, raftgroup.GroupID) raftgroup.StateMachine {
			return &rgt.AppendingKV{KV: rgt.NewKV()}
		}
	}
	if writing {
		opts.NewStateMachine = func(raftgroup.NodeID, raftgroup.GroupID) raftgroup.StateMachine {
			return &rgt.WritingKV{KV: rgt.NewKV()}
		}
	}
	c := rgt.New(t, opts)
	// Sends to the crashed node fail: the leader reports it unreachable
	// (and its snapshots as failed) instead of losing batches silently.
	c.Net.SendErrors = true
	c.CreateGroup(1, 1, 2, 3)
	l := c.WaitLeader(1, 100)
	victim := otherThan(l)
	c.Crash(victim)
	for i := range 50 {
		write(t, c, l, 1, fmt.Sprint("k", i), fmt.Sprint(i))
	}
	st, _ := c.Host(l).Status(1)
	if st.FirstIndex <= 5 {
		t.Fatalf("log not compacted: %+v", st)
	}
	before := c.Host(l).Stats().SnapshotsSent
	c.Restart(victim)
	d := converge(t, c, 1, 1, 2, 3)
	if len(d) != 50 {
		t.Fatalf("%d keys", len(d))
	}
	if c.Host(l).Stats().SnapshotsSent == before {
		// Leadership may have moved; count on every node.
		sent := uint64(0)
		for _, n := range c.Up() {
			sent += c.Host(n).Stats().SnapshotsSent
		}
		if sent == 0 {
			t.Fatal("the restarted node caught up without a snapshot")
		}
	}
	// And it keeps working: a write after the catch-up reaches everyone.
	l = c.WaitLeader(1, 100)
	write(t, c, l, 1, "after", "y")
	converge(t, c, 1, 1, 2, 3)
	if appending {
		if a := c.SM(l, 1).(*rgt.AppendingKV).Appends.Load(); a == 0 {
			t.Fatal("the leader's snapshots were not appended by its state machine")
		}
	}
	if writing {
		// WriteSnapshot is called twice per stored snapshot (sized, then
		// written); the leader compacted its log (the caught-up node
		// applied too few entries since its snapshot to).
		if w := c.SM(l, 1).(*rgt.WritingKV).Writes.Load(); w < 2 {
			t.Fatalf("the leader's state machine was asked to write %d times", w)
		}
		if st, _ := c.Host(l).Status(1); st.FirstIndex <= 5 {
			t.Fatalf("the leader's log not compacted: %+v", st)
		}
		// Every node restarts from its own stored snapshot and log.
		for _, n := range c.NodeIDs() {
			c.Crash(n)
			c.Restart(n)
		}
		l = c.WaitLeader(1, 200)
		write(t, c, l, 1, "after restart", "z")
		if d := converge(t, c, 1, 1, 2, 3); len(d) != 52 {
			t.Fatalf("%d keys after the restarts", len(d))
		}
	}
}

func TestPartitionedMinorityCannotCommit(t *testing.T) {
	c := rgt.New(t, rgt.Options{Nodes: 5, Seed: 6})
	c.CreateGroup(1, 1, 2, 3, 4, 5)
	old := c.WaitLeader(1, 100)
	write(t, c, old, 1, "a", "0")
	var minority, majority []raftgroup.NodeID
	minority = append(minority, old)
	for _, n := range c.NodeIDs() {
		if n != old && len(minority) < 2 {
			minority = append(minority, n)
		} else if n != old {
			majority = append(majority, n)
		}
	}
	c.Net.Partition(minority, majority)
	// The old leader accepts the proposal but cannot commit it.
	stuck := c.Host(old).Submit(1, raftgroup.Proposal{Data: put("minority", "x")})
	c.RunTicks(40)
	select {
	case <-stuck.Done():
		r, err := stuck.Result()
		t.Fatalf("minority proposal resolved: %+v %v", r, err)
	default:
	}
	for _, n := range c.NodeIDs() {
		if got := kvOf(c, n, 1).Get("minority"); got != "" {
			t.Fatalf("node %d applied a minority write", n)
		}
	}
	// The majority elects a leader and commits.
	var newLeader raftgroup.NodeID
	c.RunUntil(100, func() bool {
		for _, n := range majority {
			if st, _ := c.Host(n).Status(1); st.Role == "leader" {
				newLeader = n
				return true
			}
		}
		return false
	})
	c.Require(newLeader != 0, "majority elected no leader\n%s", c.String(1))
	write(t, c, newLeader, 1, "majority", "y")
	// CheckQuorum: the isolated old leader stepped down.
	if st, _ := c.Host(old).Status(1); st.Role == "leader" {
		t.Fatalf("old leader still leads in the minority\n%s", c.String(1))
	}
	c.Net.Heal()
	// The stuck proposal is retried by its host and lands exactly once.
	if _, err := rgt.Await(c, stuck, 200); err != nil {
		t.Fatal(err)
	}
	d := converge(t, c, 1, c.NodeIDs()...)
	if d["majority"] != "y" || d["minority"] != "x" {
		t.Fatalf("data %v", d)
	}
}

func TestLeaderKilledMidStream(t *testing.T) {
	c := rgt.New(t, rgt.Options{Nodes: 3, Seed: 7})
	c.CreateGroup(1, 1, 2, 3)
	leader := c.WaitLeader(1, 100)
	acked := map[string]string{}
	var pending []*raftgroup.Future[raftgroup.Result]
	var pendingKeys []string
	proposer := raftgroup.NodeID(1)
	if proposer == leader {
		proposer = 2
	}
	killed := false
	for i := range 60 {
		k := fmt.Sprint("k", i)
		pending = append(pending, c.Host(proposer).Submit(1, raftgroup.Proposal{Data: put(k, "v")}))
		pendingKeys = append(pendingKeys, k)
		c.Tick()
		if i == 20 {
			c.Crash(leader)
			killed = true
		}
		for j := 0; j < len(pending); j++ {
			select {
			case <-pending[j].Done():
				if _, err := pending[j].Result(); err == nil {
					acked[pendingKeys[j]] = "v"
				}
				pending = append(pending[:j], pending[j+1:]...)
				pendingKeys = append(pendingKeys[:j], pendingKeys[j+1:]...)
				j--
			default:
			}
		}
	}
	c.Require(killed, "not killed")
	for _, f := range pending {
		if _, err := rgt.Await(c, f, 200); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range pendingKeys {
		acked[k] = "v"
	}
	c.Restart(leader)
	d := converge(t, c, 1, 1, 2, 3)
	for k := range acked {
		if d[k] != "v" {
			t.Fatalf("acknowledged write %s lost", k)
		}
	}
	if len(acked) != 60 {
		t.Fatalf("%d of 60 acknowledged", len(acked))
	}
	if n := kvOf(c, 1, 1).Applies; n > 61 {
		t.Logf("applies on node 1 (incarnation): %d", n)
	}
}

// TestIdempotentKey checks that a proposal retried by a client with the
// same key (here: on another host, as after a reconnect) is applied once
// and the retry gets the first result.
func TestIdempotentKey(t *testing.T) {
	c := rgt.New(t, rgt.Options{Nodes: 3, Seed: 8})
	c.CreateGroup(1, 1, 2, 3)
	l := c.WaitLeader(1, 100)
	cas := rgt.KVOp{Op: "cas", Key: "x", Old: "", Value: "first"}.Encode()
	r1, err := rgt.Await(c, c.Host(l).Submit(1, raftgroup.Proposal{Data: cas, Key: "client-7/req-1"}), 100)
	if err != nil {
		t.Fatal(err)
	}
	other := raftgroup.NodeID(l%3 + 1)
	r2, err := rgt.Await(c, c.Host(other).Submit(1, raftgroup.Proposal{Data: cas, Key: "client-7/req-1"}), 100)
	if err != nil {
		t.Fatal(err)
	}
	if r2.Index != r1.Index || string(r2.Data) != string(r1.Data) {
		t.Fatalf("retry got %+v, first %+v", r2, r1)
	}
	if res, _ := rgt.DecodeKVResult(r2.Data); !res.OK {
		t.Fatalf("the retry's result is not the first's: %+v", res)
	}
	converge(t, c, 1, 1, 2, 3)
	for _, n := range c.Up() {
		if a := kvOf(c, n, 1).Applies; a != 1 {
			t.Fatalf("node %d applied the command %d times", n, a)
		}
	}
}

func TestTransferLeadership(t *testing.T) {
	c := rgt.New(t, rgt.Options{Nodes: 3, Seed: 9})
	c.CreateGroup(1, 1, 2, 3)
	l := c.WaitLeader(1, 100)
	write(t, c, l, 1, "a", "1")
	to := raftgroup.NodeID(l%3 + 1)
	c.Host(l).TransferLeadership(1, raftgroup.ReplicaID(to))
	if !c.RunUntil(50, func() bool { n, _, ok := c.Leader(1); return ok && n == to }) {
		t.Fatalf("leadership not transferred to %d\n%s", to, c.String(1))
	}
	write(t, c, to, 1, "b", "2")
	converge(t, c, 1, 1, 2, 3)
}

// syncHookedCluster is a cluster of three whose journal syncs are hooked.
func syncHookedCluster(t *testing.T, seed uint64) (*rgt.Cluster, map[raftgroup.NodeID]*raftgroup.SegmentHookFS) {
	hooks := map[raftgroup.NodeID]*raftgroup.SegmentHookFS{}
	c := rgt.New(t, rgt.Options{Nodes: 3, Seed: seed, Configure: func(cfg *raftgroup.Config) {
		h := &raftgroup.SegmentHookFS{FS: cfg.FS}
		hooks[cfg.NodeID] = h
		cfg.FS = h
	}})
	return c, hooks
}

// TestCommittedAnsweredBeforeNextSync: a leader round that learns a
// proposal is committed and appends the next proposal answers the first
// before it syncs the second (appliesEarly) — its proposer does not wait
// for another write's sync — and both still commit everywhere.
func TestCommittedAnsweredBeforeNextSync(t *testing.T) {
	c, hooks := syncHookedCluster(t, 11)
	leader, followers := settledGroup(t, c)
	before := c.Host(leader).Stats().EarlyApplies

	// The leader appends, sends and syncs the first proposal; the
	// followers append, sync and acknowledge it; the acknowledgements
	// wait in the leader's inbox.
	f1 := c.Host(leader).Submit(1, raftgroup.Proposal{Data: put("a", "1")})
	c.Host(leader).Round()
	c.Net.Deliver()
	for _, n := range followers {
		c.Host(n).Round()
	}
	c.Net.Deliver()
	if rgt.Resolved(f1) {
		t.Fatal("first proposal answered before the followers' acknowledgements were handled")
	}

	// One leader round: the acknowledgements commit the first proposal,
	// and the second is appended and synced.
	f2 := c.Host(leader).Submit(1, raftgroup.Proposal{Data: put("b", "2")})
	syncs, answeredAtSync := 0, false
	hooks[leader].OnSync = func(string) {
		if syncs == 0 {
			answeredAtSync = rgt.Resolved(f1)
		}
		syncs++
	}
	c.Host(leader).Round()
	hooks[leader].OnSync = nil
	if syncs == 0 {
		t.Fatalf("the leader's round synced nothing\n%s", c.String(1))
	}
	if !answeredAtSync {
		t.Fatalf("the committed proposal was answered only after the next proposal's sync\n%s", c.String(1))
	}
	if got := c.Host(leader).Stats().EarlyApplies - before; got == 0 {
		t.Fatal("EarlyApplies did not count the round")
	}
	if _, err := rgt.Await(c, f1, 10); err != nil {
		t.Fatal(err)
	}
	if _, err := rgt.Await(c, f2, 50); err != nil {
		t.Fatal(err)
	}
	data := converge(t, c, 1, c.Up()...)
	if data["a"] != "1" || data["b"] != "2" {
		t.Fatalf("replicas hold %v", data)
	}
}

// TestSnapshotsWeighTheLogAgainstTheState: a group whose state is large
// snapshots after SnapshotEntries small writes only once they weigh as
// much as its last snapshot, not after every SnapshotEntries of them; a
// group with a small state still snapshots every SnapshotEntries.
func TestSnapshotsWeighTheLogAgainstTheState(t *testing.T) {
	c := rgt.New(t, rgt.Options{Nodes: 3, Seed: 3, Configure: func(cfg *raftgroup.Config) {
		cfg.SnapshotEntries = 10
		cfg.CompactionMargin = 2
	}})
	c.CreateGroup(1, 1, 2, 3)
	l := c.WaitLeader(1, 100)
	taken := func() uint64 { return c.Host(l).Stats().SnapshotsTaken }
	// A small state: a snapshot every 10 entries.
	start := taken()
	for i := range 40 {
		write(t, c, l, 1, fmt.Sprint("k", i%4), "v")
	}
	if got := taken() - start; got < 3 || got > 4 {
		t.Fatalf("%d snapshots over 40 small writes into a small state, want 3-4", got)
	}
	// A state of 200 KiB: its first snapshot follows at most 10 entries
	// later, and the next one only once the log weighs 200 KiB (about 180
	// entries of a few bytes and 1 KiB each), not 10 entries later.
	big := strings.Repeat("x", 200<<10)
	write(t, c, l, 1, "big", big)
	for i := range 10 {
		write(t, c, l, 1, fmt.Sprint("k", i%4), "v")
	}
	start = taken()
	for i := range 150 {
		write(t, c, l, 1, fmt.Sprint("k", i%4), "v")
	}
	if got := taken() - start; got != 0 {
		t.Fatalf("%d snapshots of a 200 KiB state over 150 small writes, want none", got)
	}
	for i := range 60 {
		write(t, c, l, 1, fmt.Sprint("k", i%4), "v")
	}
	if got := taken() - start; got != 1 {
		t.Fatalf("%d snapshots of a 200 KiB state over 210 small writes, want 1", got)
	}
	if d := converge(t, c, 1, 1, 2, 3); len(d["big"]) != len(big) {
		t.Fatalf("big value has %d bytes", len(d["big"]))
	}
}

// TestCheckSyncsTheJournal: Check returns once a round has synced the
// journal; while the sync does not finish (a stuck disk) it does not
// return, and a closed host fails it.
func TestCheckSyncsTheJournal(t *testing.T) {
	hook := &raftgroup.SegmentHookFS{}
	c := rgt.New(t, rgt.Options{Nodes: 1, Seed: 5, Configure: func(cfg *raftgroup.Config) {
		hook.FS = cfg.FS
		cfg.FS = hook
	}})
	h := c.Host(1)

	syncs := 0
	hook.OnSync = func(string) { syncs++ }
	f := h.CheckAsync()
	if rgt.Resolved(f) {
		t.Fatal("Check answered before a round")
	}
	h.Round()
	hook.OnSync = nil
	if !rgt.Resolved(f) {
		t.Fatal("Check not answered after a round")
	}
	if _, err := f.Result(); err != nil {
		t.Fatal(err)
	}
	if syncs == 0 {
		t.Fatal("Check's round synced nothing")
	}

	// A sync that does not finish holds Check until it does.
	stuck, entered := make(chan struct{}), make(chan struct{}, 1)
	hook.OnSync = func(string) {
		entered <- struct{}{}
		<-stuck
	}
	f = h.CheckAsync()
	round := make(chan struct{})
	go func() { h.Round(); close(round) }()
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := h.Check(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Check during a stuck sync returned %v, want the deadline", err)
	}
	if rgt.Resolved(f) {
		t.Fatal("Check answered while its sync was stuck")
	}
	close(stuck)
	<-round
	hook.OnSync = nil
	if _, err := f.Result(); err != nil {
		t.Fatal(err)
	}

	c.Crash(1)
	if err := h.Check(context.Background()); !errors.Is(err, raftgroup.ErrClosed) {
		t.Fatalf("Check on a closed host returned %v, want ErrClosed", err)
	}
}

// TestSoleVoterLeadsWithoutElectionTimeout: a group whose only voter is
// this replica has a leader after a host's first round, when created and
// after a restart, without ticks; a three-voter group does not.
func TestSoleVoterLeadsWithoutElectionTimeout(t *testing.T) {
	c := rgt.New(t, rgt.Options{Nodes: 3, Seed: 9})
	c.CreateGroup(1, 1)
	c.CreateGroup(2, 1, 2, 3)
	leads := func(g raftgroup.GroupID) bool {
		st, err := c.Host(1).Status(g)
		return err == nil && st.Leader == st.Replica
	}
	c.Step()
	if !leads(1) {
		t.Fatalf("a created single-replica group has no leader after a round\n%s", c.String(1))
	}
	if leads(2) {
		t.Fatal("a three-replica group elected a leader without ticks")
	}
	write(t, c, 1, 1, "k", "v")
	ticks := c.Ticks
	c.Crash(1)
	c.Restart(1)
	c.Step()
	if !leads(1) {
		t.Fatalf("a restarted single-replica group has no leader after a round\n%s", c.String(1))
	}
	if c.Ticks != ticks {
		t.Fatalf("%d ticks ran", c.Ticks-ticks)
	}
}
