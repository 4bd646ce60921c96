package member

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// memNet connects Lists run by Run through goroutines and channels. Inside
// a synctest bubble its sleeps and the Lists' timers run in virtual time,
// so this exercises the real driver (Run, exec, within, HandlePingReq)
// with the real clock, fast. Goroutine interleaving is the scheduler's, so
// the assertions leave wide margins; the exact protocol behaviour is
// covered by the deterministic simulation.
type memNet struct {
	mu    sync.Mutex
	nodes map[string]*List // by address
	down  map[string]bool
}

type memTransport struct {
	net  *memNet
	self string
}

var errUnreachable = errors.New("unreachable")

func (n *memNet) reach(ctx context.Context, addr string) (*List, error) {
	select {
	case <-time.After(time.Millisecond):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	n.mu.Lock()
	l, down := n.nodes[addr], n.down[addr]
	n.mu.Unlock()
	if l == nil || down {
		// A dead node does not refuse, it just never answers.
		<-ctx.Done()
		return nil, errUnreachable
	}
	return l, nil
}

func (t memTransport) Ping(ctx context.Context, target Member, ups []Update) ([]Update, error) {
	l, err := t.net.reach(ctx, target.Addr)
	if err != nil {
		return nil, err
	}
	return l.HandlePing(t.self, ups), nil
}

func (t memTransport) PingReq(ctx context.Context, via, target Member, ups []Update) (bool, []Update, error) {
	l, err := t.net.reach(ctx, via.Addr)
	if err != nil {
		return false, nil, err
	}
	acked, reply := l.HandlePingReq(ctx, t.self, target, ups)
	return acked, reply, nil
}

func TestRunDriver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		net := &memNet{nodes: map[string]*List{}, down: map[string]bool{}}
		ids := []string{"a", "b", "c", "d", "e"}
		lists := map[string]*List{}
		cancels := map[string]context.CancelFunc{}
		var wg sync.WaitGroup
		for i, id := range ids {
			l := New(Member{ID: id, Addr: id + ":1", Incarnation: uint64(time.Now().UnixMilli())}, DefaultConfig(),
				memTransport{net: net, self: id}, nil, rand.New(rand.NewPCG(uint64(i), 9)), nil)
			for _, other := range ids {
				l.Add(other, other+":1")
			}
			lists[id] = l
			net.nodes[id+":1"] = l
		}
		for _, id := range ids {
			ctx, cancel := context.WithCancel(context.Background())
			cancels[id] = cancel
			wg.Go(func() {
				if err := lists[id].Run(ctx); err != nil {
					t.Errorf("Run: %v", err)
				}
			})
		}
		// until polls, in virtual time, until every running node's view
		// passes ok, and fails the test after limit.
		until := func(what string, limit time.Duration, ok func(subj string, m Member) bool) time.Duration {
			t.Helper()
			start := time.Now()
			for {
				bad := ""
				for _, obs := range ids {
					net.mu.Lock()
					down := net.down[obs+":1"]
					net.mu.Unlock()
					for _, subj := range ids {
						if m, _ := lists[obs].Member(subj); !down && !ok(subj, m) && bad == "" {
							bad = fmt.Sprintf("%s sees %s as %v", obs, subj, m.Update())
						}
					}
				}
				if bad == "" {
					return time.Since(start)
				}
				if time.Since(start) > limit {
					t.Fatalf("%s: after %v %s", what, limit, bad)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}

		until("start", 10*time.Second, func(subj string, m Member) bool {
			return m.State == Alive && m.Incarnation == lists[subj].Self().Incarnation
		})
		time.Sleep(2 * time.Second)

		// Kill c: it stops answering and stops running.
		net.mu.Lock()
		net.down["c:1"] = true
		net.mu.Unlock()
		cancels["c"]()
		d := until("kill", detectBudget, func(subj string, m Member) bool { return (subj == "c") == (m.State == Dead) })
		t.Logf("Run driver, 5 nodes: c Dead everywhere %v after it stopped", d)

		lists["d"].Leave()
		until("leave", 2*time.Second, func(subj string, m Member) bool {
			return map[string]State{"c": Dead, "d": Left}[subj] == m.State
		})
		var total Stats
		for _, id := range ids {
			st := lists[id].Stats()
			total.ProbesSent += st.ProbesSent
			total.IndirectProbes += st.IndirectProbes
			total.GossipSent += st.GossipSent
			total.PingReqsServed += st.PingReqsServed
		}
		if total.IndirectProbes == 0 || total.PingReqsServed == 0 || total.GossipSent == 0 {
			t.Fatalf("driver never used some path: %+v", total)
		}
		for _, cancel := range cancels {
			cancel()
		}
		wg.Wait()
	})
}

func TestRunNeedsTransport(t *testing.T) {
	l := New(Member{ID: "a"}, Config{}, nil, nil, nil, nil)
	if err := l.Run(context.Background()); err == nil {
		t.Fatalf("Run without a transport succeeded")
	}
}
