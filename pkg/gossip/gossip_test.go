package gossip

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/hlc"
	"github.com/shoal-dev/shoal/pkg/store"
)

type simNode struct {
	id string
	st *store.Store
	g  *Gossip
}

func startSim(t *testing.T, n int, cfg Config, run bool) (*MemNetwork, []*simNode) {
	t.Helper()
	net := NewMemNetwork()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var nodes []*simNode
	for i := range n {
		id := fmt.Sprintf("n%d", i+1)
		st, err := store.Open(store.Options{Dir: "/" + id, NodeID: id, InMemory: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		g := New(cfg, st, net.Peers(id), nil, log)
		net.Add(id, g)
		nodes = append(nodes, &simNode{id: id, st: st, g: g})
		if run {
			go g.Run(ctx)
		}
	}
	return net, nodes
}

func put(t *testing.T, n *simNode, key, field, val string) {
	t.Helper()
	if _, err := n.st.Put(context.Background(), key, map[string]crdt.Value{field: crdt.String(val)}); err != nil {
		t.Fatal(err)
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within 15s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func sameRoots(nodes []*simNode) bool {
	for _, n := range nodes[1:] {
		if n.st.Root() != nodes[0].st.Root() {
			return false
		}
	}
	return true
}

func TestPushSpreadsWrites(t *testing.T) {
	cfg := DefaultConfig()
	cfg.AntiEntropyInterval = time.Hour // push only
	_, nodes := startSim(t, 8, cfg, true)
	for i, n := range nodes {
		put(t, n, fmt.Sprintf("/k/%d", i), "v", "x")
	}
	eventually(t, "all nodes hold all writes", func() bool {
		for _, n := range nodes {
			if n.st.Status().Live != uint64(len(nodes)) {
				return false
			}
		}
		return true
	})
	if !sameRoots(nodes) {
		t.Fatal("roots differ after push converged")
	}
}

func TestAntiEntropyRepairsBothWays(t *testing.T) {
	_, nodes := startSim(t, 2, DefaultConfig(), false)
	a, b := nodes[0], nodes[1]
	for i := range 300 {
		put(t, a, fmt.Sprintf("/a/%03d", i), "v", "x")
	}
	for i := range 200 {
		put(t, b, fmt.Sprintf("/b/%03d", i), "v", "y")
	}
	// The same field written on both sides: the later write wins on both.
	put(t, a, "/both", "f", "from-a")
	put(t, b, "/both", "f", "from-b")
	res, err := a.g.SyncWith(context.Background(), "n2")
	if err != nil {
		t.Fatal(err)
	}
	if res.Pulled != 201 || res.Pushed != 300 {
		t.Fatalf("round %+v, want 201 pulled and 300 pushed (/both already equal)", res)
	}
	if !sameRoots(nodes) {
		t.Fatal("roots differ after a two-way round")
	}
	rec, _, _ := a.st.Get("/both")
	if v, _ := rec.Doc.Live()["f"].AsString(); v != "from-b" {
		t.Fatalf("/both = %q, want the later write", v)
	}
	res, err = b.g.SyncWith(context.Background(), "n1")
	if err != nil || !res.Equal {
		t.Fatalf("second round not idle: %+v %v", res, err)
	}
	st := b.g.Counters.Snapshot()["n1"]
	if st.Rounds != 1 || st.LastSync.IsZero() {
		t.Fatalf("counters %+v", st)
	}
}

func TestPartitionHealConverges(t *testing.T) {
	net, nodes := startSim(t, 5, DefaultConfig(), true)
	ids := func(ns []*simNode) []string {
		var out []string
		for _, n := range ns {
			out = append(out, n.id)
		}
		return out
	}
	net.Partition(ids(nodes[:2]), ids(nodes[2:]))
	put(t, nodes[0], "/doc", "same", "left")
	put(t, nodes[0], "/fields", "l", "1")
	time.Sleep(5 * time.Millisecond)
	put(t, nodes[4], "/doc", "same", "right")
	put(t, nodes[4], "/fields", "r", "2")
	time.Sleep(300 * time.Millisecond)
	if sameRoots(nodes) {
		t.Fatal("roots equal across a partition")
	}
	net.Heal()
	eventually(t, "roots equal after heal", func() bool { return sameRoots(nodes) })
	for _, n := range nodes {
		rec, _, err := n.st.Get("/fields")
		if err != nil {
			t.Fatal(err)
		}
		live := rec.Doc.Live()
		if len(live) != 2 {
			t.Fatalf("%s: /fields = %v, want both fields", n.id, live)
		}
		rec, _, _ = n.st.Get("/doc")
		if v, _ := rec.Doc.Live()["same"].AsString(); v != "right" {
			t.Fatalf("%s: /doc same = %q, want the later write", n.id, v)
		}
	}
}

func TestMalformedAndSkewedDocsRejected(t *testing.T) {
	_, nodes := startSim(t, 1, DefaultConfig(), false)
	n := nodes[0]
	future := crdt.Set(map[string]crdt.Value{"a": crdt.String("x")},
		crdt.Stamp{TS: hlc.Timestamp{Wall: time.Now().Add(time.Hour).UnixNano()}, Node: "evil"})
	good := crdt.Set(map[string]crdt.Value{"a": crdt.String("x")},
		crdt.Stamp{TS: hlc.Timestamp{Wall: time.Now().UnixNano()}, Node: "n9"})
	rej, err := n.g.HandlePush(context.Background(), "n9", []WireDoc{
		{Key: "/bad", Data: []byte{1, 2, 3}},
		{Key: "no-slash", Data: good.Marshal()},
		{Key: "/future", Data: future.Marshal()},
		{Key: "/good", Data: good.Marshal()},
	})
	if err != nil || rej != 3 {
		t.Fatalf("rejected %d (%v), want 3", rej, err)
	}
	if st := n.st.Status(); st.Live != 1 || st.Counters["skew_rejected"] != 1 {
		t.Fatalf("status %+v", st)
	}
	if got := n.g.Counters.Snapshot()["n9"].Rejected; got != 3 {
		t.Fatalf("peer rejected counter %d", got)
	}
}

// After a round leaves two peers equal, the next rounds repair fresh
// writes and updates of old documents from the index tails alone, with
// the same result as a tree walk.
func TestTailRoundsAfterEquality(t *testing.T) {
	_, nodes := startSim(t, 2, DefaultConfig(), false)
	a, b := nodes[0], nodes[1]
	for i := range 200 {
		put(t, a, fmt.Sprintf("/t/%03d", i), "v", "x")
	}
	ctx := context.Background()
	if _, err := b.g.SyncWith(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	if !sameRoots(nodes) {
		t.Fatal("first round did not converge")
	}
	// Fresh writes on both sides and updates of old documents on one.
	put(t, a, "/t/new-a", "v", "1")
	put(t, b, "/t/new-b", "v", "2")
	put(t, a, "/t/007", "v", "updated")
	put(t, b, "/t/100", "w", "added")
	before := a.g.Counters.Snapshot()["n2"].BytesReceived + a.g.Counters.Snapshot()["n2"].BytesSent
	res, err := a.g.SyncWith(ctx, "n2")
	if err != nil {
		t.Fatal(err)
	}
	if !res.Tail || res.Pulled != 2 || res.Pushed != 2 {
		t.Fatalf("round %+v, want a tail round pulling 2 and pushing 2", res)
	}
	if !sameRoots(nodes) {
		t.Fatal("roots differ after a tail round")
	}
	after := a.g.Counters.Snapshot()["n2"].BytesReceived + a.g.Counters.Snapshot()["n2"].BytesSent
	if cost := after - before; cost > 2000 {
		t.Fatalf("tail round cost %d bytes for 4 documents", cost)
	}
	for _, n := range nodes {
		rec, _, err := n.st.Get("/t/100")
		if err != nil || len(rec.Doc.Live()) != 2 {
			t.Fatalf("%s: /t/100 = %v %v", n.id, rec.Doc.Live(), err)
		}
	}
	// A write older than the watermark that reaches one side late is not
	// in either tail: the round falls back to the tree walk.
	old := crdt.Set(map[string]crdt.Value{"v": crdt.String("late")}, crdt.Stamp{TS: hlc.Timestamp{Wall: 1}, Node: "n9"})
	if _, err := a.st.Merge(ctx, "/t/late", old); err != nil {
		t.Fatal(err)
	}
	res, err = b.g.SyncWith(ctx, "n1")
	if err != nil || res.Tail || res.Pulled != 1 {
		t.Fatalf("late write round %+v %v, want a walk pulling 1", res, err)
	}
	if !sameRoots(nodes) {
		t.Fatal("roots differ after the fallback walk")
	}
}
