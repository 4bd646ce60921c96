package raftgroup_test

import (
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	rgt "github.com/shoal-dev/shoal/pkg/raftgroup/raftgrouptest"
)

const scaleGroups = 100

func startGroups(t *testing.T, c *rgt.Cluster, n int) {
	t.Helper()
	for g := raftgroup.GroupID(1); g <= raftgroup.GroupID(n); g++ {
		c.CreateGroup(g, 1, 2, 3)
		// Spread leadership: replica g%3+1 campaigns first.
		c.Host(raftgroup.NodeID(int(g)%3 + 1)).Campaign(g)
	}
	for g := raftgroup.GroupID(1); g <= raftgroup.GroupID(n); g++ {
		c.WaitLeader(g, 100)
	}
}

// TestHeartbeatsCoalesced checks that with 100 active groups on 3 nodes a
// host sends at most one batch per destination per round, and that the
// heartbeats of all groups travel in those batches.
func TestHeartbeatsCoalesced(t *testing.T) {
	c := rgt.New(t, rgt.Options{Nodes: 3, Seed: 11, Configure: func(cfg *raftgroup.Config) {
		cfg.DisableQuiesce = true
	}})
	startGroups(t, c, scaleGroups)
	c.RunTicks(5)
	perStep := map[[2]raftgroup.NodeID]int{}
	c.Net.Tap = func(from, to raftgroup.NodeID, b *raftgroup.Batch) { perStep[[2]raftgroup.NodeID{from, to}]++ }
	c.Net.ResetStats()
	const ticks = 10
	for range ticks {
		c.Clock.Advance(100e6)
		for _, n := range c.Up() {
			c.Host(n).Tick()
		}
		for range 3 {
			clear(perStep)
			c.Step()
			for link, n := range perStep {
				if n > 1 {
					t.Fatalf("link %v: %d batches in one round", link, n)
				}
			}
		}
	}
	totalHB, totalMsgs, totalBatches := 0, 0, 0
	for _, link := range c.Net.Links() {
		s := c.Net.Stats(link[0], link[1])
		totalHB += s.Heartbeats
		totalMsgs += s.Messages
		totalBatches += s.Batches
		t.Logf("link %v: %+v", link, s)
	}
	// Every group's leader heartbeats its 2 followers every tick, and each
	// answers: 400 heartbeats per tick, in a handful of batches.
	if want := scaleGroups * 2 * 2 * ticks; totalHB < want*9/10 {
		t.Fatalf("%d heartbeats in %d ticks, want about %d", totalHB, ticks, want)
	}
	if totalMsgs-totalHB > 10 {
		t.Fatalf("%d non-heartbeat messages while idle", totalMsgs-totalHB)
	}
	// 6 directed links, at most 3 rounds with traffic per tick.
	if totalBatches > 6*3*ticks {
		t.Fatalf("%d batches in %d ticks", totalBatches, ticks)
	}
	t.Logf("%d heartbeats in %d batches over %d ticks", totalHB, totalBatches, ticks)
}

// TestQuiescedGroupsSendNothing checks that idle groups stop ticking and
// sending: only one liveness ping per node pair per tick remains,
// whatever the number of groups. Nor do they hold log entries in memory:
// their entry caches are dropped, leader's and followers' alike.
func TestQuiescedGroupsSendNothing(t *testing.T) {
	c := rgt.New(t, rgt.Options{Nodes: 3, Seed: 12})
	startGroups(t, c, scaleGroups)
	for g := raftgroup.GroupID(1); g <= scaleGroups; g++ {
		l, _, _ := c.Leader(g)
		write(t, c, l, g, "k", "v")
	}
	for _, n := range c.Up() {
		if st := c.Host(n).Stats(); st.EntryCacheBytes == 0 || st.AwakeGroups == 0 {
			t.Fatalf("node %d right after the writes: %d groups awake, %d bytes of entries cached; want some of both", n, st.AwakeGroups, st.EntryCacheBytes)
		}
	}
	idleMemory := func() {
		t.Helper()
		for _, n := range c.Up() {
			if st := c.Host(n).Stats(); st.EntryCacheBytes != 0 || st.AwakeGroups != 0 {
				t.Fatalf("node %d quiesced: %d groups awake, %d bytes of entries cached; want none", n, st.AwakeGroups, st.EntryCacheBytes)
			}
		}
	}
	allQuiet := func() bool {
		for _, n := range c.Up() {
			for g := raftgroup.GroupID(1); g <= scaleGroups; g++ {
				if st, _ := c.Host(n).Status(g); !st.Quiesced {
					return false
				}
			}
		}
		return true
	}
	if !c.RunUntil(50, allQuiet) {
		t.Fatalf("groups did not quiesce\n%s", c.String(1))
	}
	idleMemory()
	c.Net.ResetStats()
	ticked := map[raftgroup.NodeID]uint64{}
	for _, n := range c.Up() {
		ticked[n] = c.Host(n).Stats().Ticked
	}
	const ticks = 50
	c.RunTicks(ticks)
	for _, link := range c.Net.Links() {
		s := c.Net.Stats(link[0], link[1])
		if s.Messages != 0 {
			t.Fatalf("link %v sent %d messages while idle", link, s.Messages)
		}
		if s.Batches > ticks {
			t.Fatalf("link %v: %d pings in %d ticks", link, s.Batches, ticks)
		}
	}
	for _, n := range c.Up() {
		if d := c.Host(n).Stats().Ticked - ticked[n]; d != 0 {
			t.Fatalf("node %d ticked %d groups while idle", n, d)
		}
	}
	// A proposal wakes its group, which commits and quiesces again.
	l, _, _ := c.Leader(42)
	write(t, c, l, 42, "k", "again")
	converge(t, c, 42, 1, 2, 3)
	if !c.RunUntil(50, allQuiet) {
		t.Fatal("group 42 did not quiesce again")
	}
	idleMemory()
}

// startQuiesced starts n groups on nodes 1-3, writes once to each and
// runs until every group is quiesced.
func startQuiesced(t *testing.T, c *rgt.Cluster, n int) {
	t.Helper()
	startGroups(t, c, n)
	for g := raftgroup.GroupID(1); g <= raftgroup.GroupID(n); g++ {
		l, _, _ := c.Leader(g)
		write(t, c, l, g, "k", "v")
	}
	c.RunTicks(20)
	for g := raftgroup.GroupID(1); g <= raftgroup.GroupID(n); g++ {
		if st, _ := c.Host(1).Status(g); !st.Quiesced {
			t.Fatalf("group %d not quiesced", g)
		}
	}
}

// TestQuiescedFollowersNoticeDeadLeader checks that a quiesced group whose
// leader's node dies elects a new leader (liveness pings stop).
func TestQuiescedFollowersNoticeDeadLeader(t *testing.T) {
	c := rgt.New(t, rgt.Options{Nodes: 3, Seed: 13})
	startQuiesced(t, c, 10)
	c.Crash(1)
	for g := raftgroup.GroupID(1); g <= 10; g++ {
		l := c.WaitLeader(g, 100)
		c.Require(l != 1, "dead leader")
		write(t, c, l, g, "after", "crash")
	}
	c.Restart(1)
	for g := raftgroup.GroupID(1); g <= 10; g++ {
		converge(t, c, g, 1, 2, 3)
	}
}

// TestOneSyncPerRound checks that the Readies of every group handled in a
// round are persisted by one synced Pebble commit.
func TestOneSyncPerRound(t *testing.T) {
	c := rgt.New(t, rgt.Options{Nodes: 3, Seed: 14})
	const groups = 30
	for g := raftgroup.GroupID(1); g <= groups; g++ {
		c.CreateGroup(g, 1, 2, 3)
		c.Host(1).Campaign(g)
	}
	for g := raftgroup.GroupID(1); g <= groups; g++ {
		if l := c.WaitLeader(g, 100); l != 1 {
			t.Skipf("group %d elected node %d", g, l)
		}
	}
	c.RunTicks(3)
	h := c.Host(1)
	var futs []*raftgroup.Future[raftgroup.Result]
	for g := raftgroup.GroupID(1); g <= groups; g++ {
		futs = append(futs, h.Submit(g, raftgroup.Proposal{Data: put("k", "v")}))
	}
	before := h.Stats().Syncs
	h.Round() // appends the 30 proposals: one synced commit
	if d := h.Stats().Syncs - before; d != 1 {
		t.Fatalf("%d synced commits for %d groups' appends", d, groups)
	}
	for _, f := range futs {
		if _, err := rgt.Await(c, f, 50); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range c.Up() {
		s := c.Host(n).Stats()
		t.Logf("node %d: %d rounds, %d synced commits", n, s.Rounds, s.Syncs)
	}
}

// TestPeerSilenceTellsADownHostFromAQuietOne checks PeerSilence, by which
// vold replaces a replica whose process is down on a node the cluster
// still counts alive: between hosts whose groups are all quiesced it
// stays within the liveness pings' period, for a crashed host it grows
// with the ticks, and it falls back once that host runs again.
func TestPeerSilenceTellsADownHostFromAQuietOne(t *testing.T) {
	c := rgt.New(t, rgt.Options{Nodes: 3, Seed: 15})
	startQuiesced(t, c, 5)
	tick := 100 * time.Millisecond // rgt's default TickInterval
	// Pings go every third of an election timeout (10 ticks): a live
	// peer is never silent for a whole one.
	quiet := 10 * tick
	for _, id := range []raftgroup.NodeID{1, 2, 3} {
		s := c.Host(id).PeerSilence()
		if len(s) != 2 {
			t.Fatalf("node %d knows peers %v, want the other two", id, s)
		}
		for p, d := range s {
			if d >= quiet {
				t.Errorf("node %d: live peer %d silent for %v with every group quiesced", id, p, d)
			}
		}
	}
	c.Crash(3)
	c.RunTicks(50)
	for _, id := range []raftgroup.NodeID{1, 2} {
		s := c.Host(id).PeerSilence()
		if d := s[3]; d < 50*tick {
			t.Errorf("node %d: crashed peer 3 silent for %v after 50 ticks, want at least %v", id, d, 50*tick)
		}
		if other := 3 - id; s[other] >= quiet {
			t.Errorf("node %d: live peer %d silent for %v", id, other, s[other])
		}
	}
	c.Restart(3)
	c.RunTicks(20)
	for _, id := range []raftgroup.NodeID{1, 2} {
		if d := c.Host(id).PeerSilence()[3]; d >= quiet {
			t.Errorf("node %d: restarted peer 3 still silent for %v", id, d)
		}
	}
}

// TestLeaderFindsAMemberAddedWhileDown adds a replica on a node that dies
// before the replica received anything, and that holds no other replica:
// its host has no peer to ping. The leader quiesced with a dead follower
// before, counting on it to speak up once back; but a replica without
// the group's state has no election timer and never does, so the group
// stayed short of a member for good. A follower that has acknowledged
// nothing in the leader's term now keeps the leader awake.
func TestLeaderFindsAMemberAddedWhileDown(t *testing.T) {
	c := rgt.New(t, rgt.Options{Nodes: 4, Seed: 42})
	l, _ := settledGroup(t, c)
	const late = raftgroup.NodeID(4)
	next, err := c.Host(l).NextReplicaID(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Host(late).JoinGroup(1, next); err != nil {
		t.Fatal(err)
	}
	c.Crash(late)
	if _, err := rgt.Await(c, c.Host(l).ChangeMembershipAsync(1, raftgroup.Change{Type: raftgroup.AddVoter, Replica: next, Node: late}), 300); err != nil {
		t.Fatal(err)
	}
	c.RunTicks(100)
	c.Restart(late)
	ok := c.RunUntil(200, func() bool {
		st, err := c.Host(late).Status(1)
		return err == nil && st.Initialized
	})
	c.Require(ok, "the new member never received the group's state\n%s", c.String(1))
	write(t, c, l, 1, "after", "the late member")
	if d := converge(t, c, 1, 1, 2, 3, late); d["after"] != "the late member" {
		t.Fatalf("%v", d)
	}
	// With every member caught up, the group quiesces as before.
	ok = c.RunUntil(200, func() bool {
		st, _ := c.Host(l).Status(1)
		return st.Quiesced
	})
	c.Require(ok, "the group never quiesced again\n%s", c.String(1))
}
