package member

import (
	"slices"
	"testing"
	"time"
)

func TestProbeCycle(t *testing.T) {
	l, clk := newTestList(t, 10)
	for _, id := range []string{"a", "b", "c", "d"} {
		l.Add(id, id+":1")
	}
	cfg := l.cfg
	acts := l.round(clk.now)
	if len(acts) != 1 || !acts[0].direct() {
		t.Fatalf("first round sent %+v, want one direct ping", acts)
	}
	target := acts[0].target
	if acts[0].updates[0] != l.Self().Update() {
		t.Fatalf("ping does not start with our own record: %v", acts[0].updates)
	}

	// The direct ping fails: ask k others, never the target or ourselves.
	fail := result{probe: acts[0].probe, direct: true, from: target.ID}
	reqs := l.handle(fail)
	if len(reqs) != cfg.IndirectProbes {
		t.Fatalf("%d ping requests, want %d", len(reqs), cfg.IndirectProbes)
	}
	for _, r := range reqs {
		if r.direct() || r.via.ID == target.ID || r.via.ID == "self" || r.target.ID != target.ID {
			t.Fatalf("bad ping request %+v", r)
		}
	}
	if more := l.handle(fail); len(more) != 0 {
		t.Fatalf("a repeated failure sent %d more requests", len(more))
	}
	// One via got an ack through: no suspicion when the round ends.
	l.handle(result{probe: reqs[0].probe, from: reqs[0].via.ID, acked: true})
	clk.now = clk.now.Add(cfg.ProbeInterval)
	acts = l.round(clk.now)
	if m, _ := l.Member(target.ID); m.State != Alive {
		t.Fatalf("target acked indirectly is %v", m.State)
	}
	if st := l.Stats(); st.ProbesSent != 2 || st.IndirectProbes != 3 || st.IndirectAcks != 1 || st.Suspicions != 0 {
		t.Fatalf("stats %+v", st)
	}

	// This round's probe gets nothing back: Suspect when the round ends,
	// Dead when the suspicion runs out.
	victim := acts[0].target
	l.handle(result{probe: acts[0].probe, direct: true, from: victim.ID})
	clk.now = clk.now.Add(cfg.ProbeInterval)
	acts = l.round(clk.now)
	if m, _ := l.Member(victim.ID); m.State != Suspect || m.Incarnation != 0 {
		t.Fatalf("unanswered target is %+v, want suspect@0", m)
	}
	at, ok := l.nextDeadline()
	if !ok || !at.Equal(clk.now.Add(cfg.SuspicionTimeout)) {
		t.Fatalf("suspicion deadline %v %v, want %v", at, ok, clk.now.Add(cfg.SuspicionTimeout))
	}
	l.expire(at.Add(-time.Nanosecond))
	if m, _ := l.Member(victim.ID); m.State != Suspect {
		t.Fatalf("declared %v before the deadline", m.State)
	}
	l.expire(at)
	if m, _ := l.Member(victim.ID); m.State != Dead {
		t.Fatalf("not Dead at the deadline: %v", m.State)
	}
	if st := l.Stats(); st.Suspicions != 1 || st.DeadDeclared != 1 {
		t.Fatalf("stats %+v", st)
	}

	// From now on normal rounds skip the dead member, and every
	// DeadProbeEvery-th round pings it, with no ping requests and no
	// suspicion when it does not answer.
	deadProbes := 0
	for range 4 * cfg.DeadProbeEvery {
		for _, a := range acts {
			if a.target.ID != victim.ID {
				l.handle(result{probe: a.probe, direct: true, from: a.target.ID, acked: true})
				continue
			}
			deadProbes++
			if a.updates[1] != (Update{ID: victim.ID, Addr: victim.Addr, State: Dead}) {
				t.Fatalf("ping to a dead member does not tell it: %v", a.updates)
			}
			if reqs := l.handle(result{probe: a.probe, direct: true, from: victim.ID}); len(reqs) != 0 {
				t.Fatalf("dead probe led to ping requests %+v", reqs)
			}
		}
		clk.now = clk.now.Add(cfg.ProbeInterval)
		acts = l.round(clk.now)
	}
	if deadProbes != 4 || l.Stats().DeadProbesSent != 4 {
		t.Fatalf("%d dead probes (stats %d) in %d rounds, want 4", deadProbes, l.Stats().DeadProbesSent, 4*cfg.DeadProbeEvery)
	}
	if m, _ := l.Member(victim.ID); m.State != Dead || l.Stats().Suspicions != 1 {
		t.Fatalf("dead member %v after failed dead probes, suspicions %d", m.State, l.Stats().Suspicions)
	}
}

// TestRoundRobin: in each pass every live member is probed exactly once.
func TestRoundRobin(t *testing.T) {
	l, clk := newTestList(t, 1)
	ids := []string{"a", "b", "c", "d", "e", "f"}
	for _, id := range ids {
		l.Add(id, "")
	}
	for pass := range 5 {
		var got []string
		for range ids {
			acts := l.round(clk.now)
			for _, a := range acts {
				got = append(got, a.target.ID)
				l.handle(result{probe: a.probe, direct: true, from: a.target.ID, acked: true})
			}
			clk.now = clk.now.Add(l.cfg.ProbeInterval)
		}
		slices.Sort(got)
		if !slices.Equal(got, ids) {
			t.Fatalf("pass %d probed %v", pass, got)
		}
	}
}

// TestRefutationDuringProbe: a refutation that arrives while a probe is
// out is proof of life, so the failed probe does not suspect the newer
// incarnation.
func TestRefutationDuringProbe(t *testing.T) {
	l, clk := newTestList(t, 1)
	l.Apply([]Update{up("a", 3, Alive)})
	acts := l.round(clk.now)
	l.Apply([]Update{up("a", 4, Alive)})
	l.handle(result{probe: acts[0].probe, direct: true, from: "a"})
	l.round(clk.now.Add(l.cfg.ProbeInterval))
	if m, _ := l.Member("a"); m.State != Alive || m.Incarnation != 4 {
		t.Fatalf("a = %+v", m.Update())
	}
}

func TestGossip(t *testing.T) {
	l, _ := newTestList(t, 1)
	drain(l)
	if acts := l.gossip(); len(acts) != 0 {
		t.Fatalf("gossip without news: %+v", acts)
	}
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		l.Add(id, "")
	}
	l.Apply([]Update{up("x", 1, Dead)})
	acts := l.gossip()
	if len(acts) != l.cfg.GossipFanout {
		t.Fatalf("gossip to %d members, want %d", len(acts), l.cfg.GossipFanout)
	}
	seen := map[string]bool{}
	for _, a := range acts {
		if !a.direct() || a.probe != 0 || seen[a.target.ID] || a.target.ID == "x" || !slices.Contains(a.updates, up("x", 1, Dead)) {
			t.Fatalf("bad gossip %+v", a)
		}
		seen[a.target.ID] = true
	}
	l.cfg.GossipFanout = -1
	if acts := l.gossip(); len(acts) != 0 {
		t.Fatalf("disabled gossip sent %+v", acts)
	}
}

func TestOnChangeReentrant(t *testing.T) {
	l, _ := newTestList(t, 1)
	var got []string
	l.OnChange(func(m Member) {
		// Calling back into the List, even changing it, must not deadlock,
		// and the nested change is delivered after this one.
		got = append(got, m.Update().String())
		if m.ID == "a" && m.State == Suspect {
			l.Apply([]Update{up("b", 1, Alive)})
			if _, ok := l.Member("b"); !ok {
				t.Errorf("nested Apply not visible")
			}
		}
	})
	l.Apply([]Update{up("a", 1, Suspect), up("c", 1, Alive)})
	want := []string{"a/suspect@1", "c/alive@1", "b/alive@1"}
	if !slices.Equal(got, want) {
		t.Fatalf("notifications %v, want %v", got, want)
	}
}

func TestForget(t *testing.T) {
	l, clk := newTestList(t, 1)
	l.Apply([]Update{up("a", 1, Alive), up("b", 1, Suspect), up("c", 1, Dead), up("d", 1, Left)})
	for id, want := range map[string]bool{"a": false, "b": false, "c": true, "d": true, "self": false, "zz": false} {
		if got := l.Forget(id); got != want {
			t.Fatalf("Forget(%s) = %v, want %v", id, got, want)
		}
	}
	if ms := l.Members(); len(ms) != 3 {
		t.Fatalf("members after Forget: %+v", ms)
	}
	for range 3 * l.cfg.DeadProbeEvery {
		for _, a := range l.round(clk.now) {
			if a.target.ID == "c" || a.target.ID == "d" {
				t.Fatalf("probed forgotten %s", a.target.ID)
			}
		}
		clk.now = clk.now.Add(l.cfg.ProbeInterval)
	}
	l.Apply([]Update{up("c", 2, Alive)})
	if m, ok := l.Member("c"); !ok || m.State != Alive {
		t.Fatalf("forgotten member did not come back: %+v", m)
	}
}
