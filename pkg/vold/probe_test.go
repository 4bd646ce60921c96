package vold

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	"github.com/shoal-dev/shoal/pkg/volfs"
	volv1 "github.com/shoal-dev/shoal/proto/shoal/vol/v1"
)

// TestAnsweringPingsOverVolPeer pings real peers over mutual TLS: one
// that serves answers, one whose server has stopped and one with no
// address do not, this node answers itself, and an outcome is
// remembered for probeTTL.
func TestAnsweringPingsOverVolPeer(t *testing.T) {
	peers := startCluster(t, "a1", "b2", "c3")
	n := &node{id: "a1", log: testLogger(t), pool: peers[0].pool, cfg: &Config{}}
	peers[2].srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	start := time.Now()
	got := n.answering(ctx, []string{"a1", "b2", "c3", "d4"})
	if !got["a1"] || !got["b2"] || got["c3"] || got["d4"] || len(got) != 4 {
		t.Fatalf("answering = %v, want a1 and b2 only", got)
	}
	if d := time.Since(start); d > probeTimeout+time.Second {
		t.Errorf("pings took %s: a stopped server should refuse at once", d)
	}

	// Within probeTTL the outcomes are remembered: b2 stopping now is
	// not seen, and c3 is not asked again.
	peers[1].srv.Stop()
	if got := n.answering(ctx, []string{"b2", "c3"}); !got["b2"] || got["c3"] {
		t.Fatalf("remembered = %v, want b2 answering, c3 not", got)
	}
	// Once it is out of date, asked again.
	n.probes.mu.Lock()
	for id, r := range n.probes.last {
		r.at = r.at.Add(-probeTTL)
		n.probes.last[id] = r
	}
	n.probes.mu.Unlock()
	if got := n.answering(ctx, []string{"b2"}); got["b2"] {
		t.Fatalf("b2 stopped but answering = %v", got)
	}
}

// TestPingWaitsForTheHost: a vold answers a ping only once its Raft
// host's loop has synced its journal, so a process that still serves
// VolPeer while its loop is stuck is passed over like a silent one.
func TestPingWaitsForTheHost(t *testing.T) {
	peers := startClusterWith(t, clusterOpts{forward: func(p *testPeer) func(context.Context, string, *volv1.ForwardRequest) (*volv1.ForwardResponse, error) {
		n := &node{id: p.id, log: testLogger(t), ready: make(chan struct{}), cfg: &Config{}}
		close(n.ready)
		n.host.Store(p.host)
		return n.serveForward
	}}, "a1", "b2")
	n := &node{id: "a1", log: testLogger(t), pool: peers[0].pool}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if n.ping(ctx, "b2") == 0 {
		t.Fatal("b2's vold does not answer a ping")
	}

	release := holdLoop(t, peers[1])
	start := time.Now()
	answered := n.ping(ctx, "b2")
	release()
	if answered != 0 {
		t.Fatal("b2 answered a ping while its host's loop was stuck")
	}
	if d := time.Since(start); d < probeTimeout/2 {
		t.Errorf("the ping gave up after %s, before its timeout", d)
	}
	if n.ping(ctx, "b2") == 0 {
		t.Fatal("b2 does not answer once its loop runs again")
	}
}

// TestLiveWaitsForTheHost: vold's watchdog check passes while its Raft
// host's loop turns and fails while it is stuck, so systemd restarts a
// vold whose loop or disk hangs; a vold with no host yet is live.
func TestLiveWaitsForTheHost(t *testing.T) {
	peers := startCluster(t, "a1")
	n := &node{id: "a1", log: testLogger(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.live(ctx); err != nil {
		t.Fatalf("a vold with no host yet: %v", err)
	}
	n.host.Store(peers[0].host)
	if err := n.live(ctx); err != nil {
		t.Fatalf("a running host: %v", err)
	}
	release := holdLoop(t, peers[0])
	short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancelShort()
	err := n.live(short)
	release()
	if err == nil {
		t.Fatal("live passed while the host's loop was stuck")
	}
	if err := n.live(ctx); err != nil {
		t.Fatalf("once the loop runs again: %v", err)
	}
}

// holdLoop holds p's host loop until release is called: WithStateMachine
// runs on the loop's lock.
func holdLoop(t *testing.T, p *testPeer) (release func()) {
	t.Helper()
	g := raftgroup.GroupID(3000 + p.rid)
	if err := p.host.CreateGroup(g, 1, []raftgroup.Member{{Replica: 1, Node: p.rid}}); err != nil {
		t.Fatal(err)
	}
	held, done := make(chan struct{}), make(chan struct{})
	go func() {
		_ = p.host.WithStateMachine(g, func(raftgroup.StateMachine, uint64) {
			close(held)
			<-done
		})
	}()
	<-held
	return func() { close(done) }
}

// TestPingCarriesTheLevel: a ping's answer carries the level the vold
// lets volumes reach (its pin, when it has one), one from a vold before
// levels (no payload) counts as the base level, and answeringAt passes
// over the volds below the level asked for as it does silent ones. A
// node's document keeps the level of the last vold that published one,
// so these answers are what tells a node downgraded to a vold before
// levels (level.go's behind; test/e2e TestVolumeUpgradeFromOldVold).
func TestPingCarriesTheLevel(t *testing.T) {
	peers := startClusterWith(t, clusterOpts{forward: func(p *testPeer) func(context.Context, string, *volv1.ForwardRequest) (*volv1.ForwardResponse, error) {
		if p.id == "d4" {
			return func(context.Context, string, *volv1.ForwardRequest) (*volv1.ForwardResponse, error) {
				return &volv1.ForwardResponse{}, nil // a vold before levels
			}
		}
		cfg := &Config{}
		if p.id == "c3" {
			cfg.VolumeLevel = volfs.LevelBase // pinned
		}
		n := &node{id: p.id, log: testLogger(t), ready: make(chan struct{}), cfg: cfg}
		close(n.ready)
		n.host.Store(p.host)
		return n.serveForward
	}}, "a1", "b2", "c3", "d4", "e5")
	peers[4].srv.Stop()
	n := &node{id: "a1", log: testLogger(t), pool: peers[0].pool, cfg: &Config{}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	all := []string{"a1", "b2", "c3", "d4", "e5"}
	want := map[string]uint32{"a1": volfs.MaxLevel, "b2": volfs.MaxLevel, "c3": volfs.LevelBase, "d4": volfs.LevelBase, "e5": 0}
	if got := n.pingedLevels(ctx, all, false); !maps.Equal(got, want) {
		t.Fatalf("pinged levels = %v, want %v", got, want)
	}
	if got := n.answeringAt(ctx, all, volfs.MaxLevel); !maps.Equal(got, map[string]bool{"a1": true, "b2": true, "c3": false, "d4": false, "e5": false}) {
		t.Errorf("answering at the top level = %v, want a1 and b2", got)
	}
	if got := n.answering(ctx, all); !maps.Equal(got, map[string]bool{"a1": true, "b2": true, "c3": true, "d4": true, "e5": false}) {
		t.Errorf("answering = %v, want all but e5", got)
	}

	// b2's vold goes away: its level is remembered for placement, but a
	// fresh ask (what a raise decides on) asks again.
	peers[1].srv.Stop()
	if got := n.pingedLevels(ctx, []string{"b2"}, false)["b2"]; got != volfs.MaxLevel {
		t.Errorf("remembered level of b2 = %d, want %d", got, volfs.MaxLevel)
	}
	if got := n.pingedLevels(ctx, []string{"b2"}, true)["b2"]; got != 0 {
		t.Errorf("fresh level of b2, stopped = %d, want 0", got)
	}
}
