package vold

import (
	"context"
	"testing"
	"time"
)

// TestAnsweringPingsOverVolPeer pings real peers over mutual TLS: one
// that serves answers, one whose server has stopped and one with no
// address do not, this node answers itself, and an outcome is
// remembered for probeTTL.
func TestAnsweringPingsOverVolPeer(t *testing.T) {
	peers := startCluster(t, "a1", "b2", "c3")
	n := &node{id: "a1", log: testLogger(t), pool: peers[0].pool}
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
