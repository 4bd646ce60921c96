package raftgroup_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	rgt "github.com/shoal-dev/shoal/pkg/raftgroup/raftgrouptest"
)

// TestRunRealTime drives three hosts with Run (real ticks, the loop woken
// by deliveries and requests) and uses the blocking API from concurrent
// goroutines, as vold does.
func TestRunRealTime(t *testing.T) {
	net := rgt.NewNetwork(rand.New(rand.NewPCG(1, 2)))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	go net.AutoDeliver(ctx, 200*time.Microsecond)
	reg := raftgroup.NewRegistry()
	_ = reg.Register(&KV{})
	hosts := map[raftgroup.NodeID]*raftgroup.Host{}
	type nodeGroup struct {
		n raftgroup.NodeID
		g raftgroup.GroupID
	}
	var dbMu sync.Mutex
	dbs := map[nodeGroup]*db{}
	for n := raftgroup.NodeID(1); n <= 3; n++ {
		h, err := raftgroup.Open(raftgroup.Config{
			NodeID:       n,
			Dir:          "/db",
			FS:           vfs.NewMem(),
			Transport:    net.Transport(n),
			TickInterval: 10 * time.Millisecond,
			NewStateMachine: func(g raftgroup.GroupID) raftgroup.StateMachine {
				sm := raftgroup.NewTyped(reg)
				d := &db{m: map[string]string{}}
				sm.Use(d)
				dbMu.Lock()
				dbs[nodeGroup{n, g}] = d
				dbMu.Unlock()
				return sm
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		hosts[n] = h
		net.Attach(n, h)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := h.Run(ctx); err != nil {
				t.Error(err)
			}
		}()
		defer h.Close()
	}
	members := []raftgroup.Member{{Replica: 1, Node: 1}, {Replica: 2, Node: 2}, {Replica: 3, Node: 3}}
	for g := raftgroup.GroupID(1); g <= 5; g++ {
		for n, h := range hosts {
			if err := h.CreateGroup(g, raftgroup.ReplicaID(n), members); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Concurrent writers on every host and group; proposals on followers
	// are forwarded, and dropped ones retried, until the context ends.
	var cw sync.WaitGroup
	errs := make(chan error, 100)
	for n, h := range hosts {
		for g := raftgroup.GroupID(1); g <= 5; g++ {
			cw.Add(1)
			go func() {
				defer cw.Done()
				for i := range 10 {
					if err := h.Set(ctx, g, &KV{Key: fmt.Sprint(n, "-", i), Val: "v"}); err != nil {
						errs <- fmt.Errorf("set on node %d group %d: %w", n, g, err)
						return
					}
				}
			}()
		}
	}
	cw.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Linearizable read: after ReadIndex every write above is visible on
	// any host.
	for n, h := range hosts {
		if _, err := h.ReadIndex(ctx, 3); err != nil {
			t.Fatal(err)
		}
		dbMu.Lock()
		d := dbs[nodeGroup{n, 3}]
		dbMu.Unlock()
		for w := 1; w <= 3; w++ {
			if k := fmt.Sprint(w, "-9"); d.get(k) != "v" {
				t.Errorf("node %d misses %s after ReadIndex", n, k)
			}
		}
	}
	// Locks through the blocking API.
	l, err := hosts[1].AcquireLock(ctx, 2, "job", "one", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hosts[2].AcquireLock(ctx, 2, "job", "two", time.Minute); !errors.Is(err, raftgroup.ErrLockHeld) {
		t.Fatalf("second holder: %v", err)
	}
	ls, err := hosts[3].Locks(ctx, 2)
	if err != nil || len(ls) != 1 || ls[0].Token != l.Token {
		t.Fatalf("locks %v %v", ls, err)
	}
	if err := hosts[1].ReleaseLock(ctx, 2, l); err != nil {
		t.Fatal(err)
	}
	// Membership of a running group, and status.
	st, err := hosts[1].Status(1)
	if err != nil || len(st.Voters) != 3 || st.Applied == 0 {
		t.Fatalf("status %+v %v", st, err)
	}
	// A request for a missing group fails fast.
	if _, _, err := hosts[1].Propose(ctx, 99, []byte("x")); !errors.Is(err, raftgroup.ErrGroupNotFound) {
		t.Fatalf("missing group: %v", err)
	}
	// Closing fails pending requests instead of hanging them.
	hosts[1].Close()
	if _, _, err := hosts[1].Propose(ctx, 1, []byte("x")); !errors.Is(err, raftgroup.ErrClosed) {
		t.Fatalf("closed host: %v", err)
	}
}
