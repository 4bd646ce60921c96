package raftgroup_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	rgt "github.com/shoal-dev/shoal/pkg/raftgroup/raftgrouptest"
)

// KV is a JSON message for the typed API.
type KV struct {
	Key, Val string
}

// db is a state machine in the seed's style: a map fed by an Applier.
type db struct {
	mu   sync.Mutex
	m    map[string]string
	seen int // messages applied, of any type
}

func (d *db) Apply(c raftgroup.Command) any {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.seen++
	switch m := c.Msg.(type) {
	case *KV:
		if m.Key == "" {
			return errors.New("empty key")
		}
		old := d.m[m.Key]
		d.m[m.Key] = m.Val
		return old
	case *wrapperspb.StringValue:
		d.m["proto"] = m.GetValue()
	}
	return nil
}

func (d *db) Snapshot() ([]byte, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return json.Marshal(d.m)
}

func (d *db) Restore(b []byte) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.m = map[string]string{}
	if b == nil {
		return nil
	}
	return json.Unmarshal(b, &d.m)
}

func (d *db) get(k string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.m[k]
}

type typedCluster struct {
	*rgt.Cluster
	mu  sync.Mutex
	dbs map[raftgroup.NodeID]*db
}

func newTypedCluster(t *testing.T, nodes int, seed uint64, cfg func(*raftgroup.Config)) *typedCluster {
	tc := &typedCluster{dbs: map[raftgroup.NodeID]*db{}}
	reg := raftgroup.NewRegistry()
	if err := reg.Register(&KV{}, &wrapperspb.StringValue{}); err != nil {
		t.Fatal(err)
	}
	tc.Cluster = rgt.New(t, rgt.Options{Nodes: nodes, Seed: seed, Configure: cfg,
		NewStateMachine: func(n raftgroup.NodeID, g raftgroup.GroupID) raftgroup.StateMachine {
			sm := raftgroup.NewTyped(reg)
			d := &db{m: map[string]string{}}
			sm.Use(d)
			tc.mu.Lock()
			tc.dbs[n] = d
			tc.mu.Unlock()
			return sm
		}})
	return tc
}

func (tc *typedCluster) db(n raftgroup.NodeID) *db {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	return tc.dbs[n]
}

func TestTypedSetUse(t *testing.T) {
	c := newTypedCluster(t, 3, 41, func(cfg *raftgroup.Config) {
		cfg.SnapshotEntries = 5
		cfg.CompactionMargin = 1
	})
	c.CreateGroup(1, 1, 2, 3)
	l := c.WaitLeader(1, 100)
	for i := range 10 {
		idx, err := rgt.Await(c.Cluster, c.Host(l).SetAsync(1, &KV{Key: fmt.Sprint("k", i), Val: "v"}), 100)
		if err != nil || idx == 0 {
			t.Fatalf("set: %d %v", idx, err)
		}
		// Set returned: a quorum (2 of 3) has applied it.
		n := 0
		for _, id := range c.Up() {
			if c.db(id).get(fmt.Sprint("k", i)) == "v" {
				n++
			}
		}
		if n < 2 {
			t.Fatalf("set k%d returned with %d replicas applied", i, n)
		}
	}
	// DoQuorum too returns once a quorum has applied, with the result.
	for i := range 5 {
		r, err := rgt.Await(c.Cluster, c.Host(l).DoQuorumAsync(1, &KV{Key: fmt.Sprint("q", i), Val: "v"}), 100)
		if err != nil || r.Index == 0 {
			t.Fatalf("do quorum: %+v %v", r, err)
		}
		if err := raftgroup.DecodeResult(r.Data, nil); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, id := range c.Up() {
			if c.db(id).get(fmt.Sprint("q", i)) == "v" {
				n++
			}
		}
		if n < 2 {
			t.Fatalf("DoQuorum q%d returned with %d replicas applied", i, n)
		}
	}
	// Protobuf messages are typed too.
	if _, err := rgt.Await(c.Cluster, c.Host(l).SetAsync(1, wrapperspb.String("pb")), 100); err != nil {
		t.Fatal(err)
	}
	// An applier's error reaches the proposer.
	_, err := rgt.Await(c.Cluster, c.Host(l).SetAsync(1, &KV{}), 100)
	var ae *raftgroup.ApplyError
	if !errors.As(err, &ae) {
		t.Fatalf("want ApplyError, got %v", err)
	}
	// Unregistered types are refused before proposing.
	if _, err := rgt.Await(c.Cluster, c.Host(l).SetAsync(1, struct{ X int }{1}), 10); err == nil {
		t.Fatal("unregistered type accepted")
	}
	// Appliers' state travels in snapshots: a replica that missed it all
	// catches up from one.
	victim := otherThan(l)
	c.Crash(victim)
	for i := range 20 {
		if _, err := rgt.Await(c.Cluster, c.Host(l).SetAsync(1, &KV{Key: fmt.Sprint("late", i), Val: "v"}), 100); err != nil {
			t.Fatal(err)
		}
	}
	c.Restart(victim)
	ok := c.RunUntil(200, func() bool { return c.db(victim).get("late19") == "v" && c.db(victim).get("proto") == "pb" })
	if !ok {
		t.Fatalf("restarted replica did not catch up\n%s", c.String(1))
	}
}

func TestLocksFencing(t *testing.T) {
	c := newTypedCluster(t, 3, 42, nil)
	c.CreateGroup(1, 1, 2, 3)
	c.WaitLeader(1, 100)
	ttl := 2 * time.Second // 20 ticks of group time
	a, b := c.Host(1), c.Host(2)

	la, err := rgt.Await(c.Cluster, a.AcquireLockAsync(1, "L", "a", ttl), 100)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := rgt.Await(c.Cluster, b.AcquireLockAsync(1, "L", "b", ttl), 100)
	if !errors.Is(err, raftgroup.ErrLockHeld) || lb.Holder != "a" || lb.Token != la.Token {
		t.Fatalf("contender got %+v %v", lb, err)
	}
	// a keeps renewing; b keeps failing.
	for range 5 {
		c.RunTicks(10)
		la, err = rgt.Await(c.Cluster, a.RenewLockAsync(1, la, ttl), 100)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rgt.Await(c.Cluster, b.AcquireLockAsync(1, "L", "b", ttl), 100); !errors.Is(err, raftgroup.ErrLockHeld) {
			t.Fatalf("b acquired a renewed lock: %v", err)
		}
	}
	// a is cut off and cannot renew; its lease expires in group time and b
	// takes over with a greater token.
	c.Net.Isolate(1, c.NodeIDs())
	var lb2 raftgroup.Lease
	ok := c.RunUntil(200, func() bool {
		l, err := rgt.Await(c.Cluster, b.AcquireLockAsync(1, "L", "b", ttl), 100)
		if err == nil {
			lb2 = l
			return true
		}
		return false
	})
	if !ok {
		t.Fatal("b never got the expired lock")
	}
	if lb2.Token <= la.Token {
		t.Fatalf("fencing token did not increase: a %d, b %d", la.Token, lb2.Token)
	}
	// b's fenced writes go through; a's (once it can talk again) are refused.
	if _, err := rgt.Await(c.Cluster, b.SetFencedAsync(1, lb2, &KV{Key: "fenced", Val: "b"}), 100); err != nil {
		t.Fatal(err)
	}
	stale := a.SetFencedAsync(1, la, &KV{Key: "fenced", Val: "a"})
	c.RunTicks(5)
	c.Net.Heal()
	if _, err := rgt.Await(c.Cluster, stale, 200); !errors.Is(err, raftgroup.ErrFenced) {
		t.Fatalf("stale holder's fenced write: %v", err)
	}
	if _, err := rgt.Await(c.Cluster, a.RenewLockAsync(1, la, ttl), 100); !errors.Is(err, raftgroup.ErrLeaseLost) {
		t.Fatalf("stale renew: %v", err)
	}
	c.RunTicks(5)
	for _, n := range c.Up() {
		if got := c.db(n).get("fenced"); got != "b" {
			t.Fatalf("node %d: fenced value %q", n, got)
		}
	}
	// Tokens strictly increase over a sequence of holders.
	prev := lb2
	for i := range 6 {
		h := c.Host(raftgroup.NodeID(i%3 + 1))
		who := fmt.Sprint("holder", i)
		if _, err := rgt.Await(c.Cluster, c.Host(3).ReleaseLockAsync(1, prev), 100); err != nil {
			t.Fatal(err)
		}
		l, err := rgt.Await(c.Cluster, h.AcquireLockAsync(1, "L", who, ttl), 100)
		if err != nil {
			t.Fatal(err)
		}
		if l.Token <= prev.Token {
			t.Fatalf("token %d after %d", l.Token, prev.Token)
		}
		prev = l
	}
}
