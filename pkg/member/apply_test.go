package member

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// manualClock is a Clock the test moves by hand.
type manualClock struct{ now time.Time }

func (c *manualClock) Now() time.Time { return c.now }
func (c *manualClock) After(d time.Duration) <-chan time.Time {
	panic("manualClock.After: the core must not wait")
}

func newTestList(t *testing.T, selfInc uint64) (*List, *manualClock) {
	t.Helper()
	clk := &manualClock{now: t0}
	l := New(Member{ID: "self", Addr: "self:1", Incarnation: selfInc}, Config{}, nil, clk, rand.New(rand.NewPCG(1, 2)), nil)
	return l, clk
}

// drain empties l's retransmission queue.
func drain(l *List) {
	for len(l.Outgoing(1000)) > 0 {
	}
}

func up(id string, inc uint64, st State) Update {
	return Update{ID: id, Addr: id + ":1", Incarnation: inc, State: st}
}

func TestStateString(t *testing.T) {
	for st, want := range map[State]string{Alive: "alive", Suspect: "suspect", Dead: "dead", Left: "left", 9: "state(9)"} {
		if got := st.String(); got != want {
			t.Fatalf("%d.String() = %q, want %q", st, got, want)
		}
	}
}

// TestSupersedes spells out the SWIM precedence rules one by one.
func TestSupersedes(t *testing.T) {
	for _, tc := range []struct {
		name string
		u, v Update
		want bool
	}{
		{"alive over older alive", up("x", 2, Alive), up("x", 1, Alive), true},
		{"alive over same alive", up("x", 1, Alive), up("x", 1, Alive), false},
		{"alive over newer alive", up("x", 1, Alive), up("x", 2, Alive), false},
		{"alive over older suspect", up("x", 2, Alive), up("x", 1, Suspect), true},
		{"alive over same suspect", up("x", 1, Alive), up("x", 1, Suspect), false},
		{"suspect over same alive", up("x", 1, Suspect), up("x", 1, Alive), true},
		{"suspect over older alive", up("x", 2, Suspect), up("x", 1, Alive), true},
		{"suspect over newer alive", up("x", 1, Suspect), up("x", 2, Alive), false},
		{"suspect over older suspect", up("x", 2, Suspect), up("x", 1, Suspect), true},
		{"suspect over same suspect", up("x", 1, Suspect), up("x", 1, Suspect), false},
		{"dead over same alive", up("x", 1, Dead), up("x", 1, Alive), true},
		{"dead over same suspect", up("x", 1, Dead), up("x", 1, Suspect), true},
		{"dead over older suspect", up("x", 3, Dead), up("x", 1, Suspect), true},
		{"dead over newer alive", up("x", 1, Dead), up("x", 2, Alive), false},
		{"left over same alive", up("x", 1, Left), up("x", 1, Alive), true},
		{"left over same suspect", up("x", 1, Left), up("x", 1, Suspect), true},
		{"left over same dead", up("x", 1, Left), up("x", 1, Dead), true},
		{"dead over same left", up("x", 1, Dead), up("x", 1, Left), false},
		{"alive over same dead", up("x", 1, Alive), up("x", 1, Dead), false},
		{"alive over older dead", up("x", 2, Alive), up("x", 1, Dead), true},
		{"suspect over same dead", up("x", 1, Suspect), up("x", 1, Dead), false},
		{"alive over same left", up("x", 1, Alive), up("x", 1, Left), false},
		{"alive over older left (rejoin)", up("x", 2, Alive), up("x", 1, Left), true},
	} {
		if got := tc.u.Supersedes(tc.v); got != tc.want {
			t.Fatalf("%s: %v.Supersedes(%v) = %v, want %v", tc.name, tc.u, tc.v, got, tc.want)
		}
	}
}

func TestApplyTable(t *testing.T) {
	for _, tc := range []struct {
		name    string
		have    []Update
		u       Update
		want    Update
		applied bool
	}{
		{"unknown member is learned", nil, up("x", 3, Alive), up("x", 3, Alive), true},
		{"unknown member learned dead", nil, up("x", 3, Dead), up("x", 3, Dead), true},
		{"suspect at same incarnation", []Update{up("x", 3, Alive)}, up("x", 3, Suspect), up("x", 3, Suspect), true},
		{"stale suspect ignored", []Update{up("x", 3, Alive)}, up("x", 2, Suspect), up("x", 3, Alive), false},
		{"refutation clears suspicion", []Update{up("x", 3, Suspect)}, up("x", 4, Alive), up("x", 4, Alive), true},
		{"alive at same incarnation does not clear suspicion", []Update{up("x", 3, Suspect)}, up("x", 3, Alive), up("x", 3, Suspect), false},
		{"another's dead is a suspicion here", []Update{up("x", 3, Alive)}, up("x", 3, Dead), up("x", 3, Suspect), true},
		{"another's dead leaves a suspicion to its own timer", []Update{up("x", 3, Suspect)}, up("x", 3, Dead), up("x", 3, Suspect), false},
		{"another's dead at a newer incarnation restarts suspicion", []Update{up("x", 2, Suspect)}, up("x", 3, Dead), up("x", 3, Suspect), true},
		{"dead again at a newer incarnation", []Update{up("x", 3, Dead)}, up("x", 4, Dead), up("x", 4, Dead), true},
		{"dead stays dead at same incarnation", []Update{up("x", 3, Dead)}, up("x", 3, Alive), up("x", 3, Dead), false},
		{"dead comes back only above", []Update{up("x", 3, Dead)}, up("x", 4, Alive), up("x", 4, Alive), true},
		{"left is final for its incarnation", []Update{up("x", 3, Left)}, up("x", 3, Dead), up("x", 3, Left), false},
		{"left rejoins above", []Update{up("x", 3, Left)}, up("x", 4, Alive), up("x", 4, Alive), true},
		{"duplicate ignored", []Update{up("x", 3, Dead)}, up("x", 3, Dead), up("x", 3, Dead), false},
		{"new incarnation brings new address", []Update{up("x", 3, Alive)}, Update{ID: "x", Addr: "new:1", Incarnation: 4}, Update{ID: "x", Addr: "new:1", Incarnation: 4}, true},
		{"empty address keeps the old", []Update{up("x", 3, Alive)}, Update{ID: "x", Incarnation: 3, State: Left}, up("x", 3, Left), true},
		{"empty ID ignored", nil, Update{Incarnation: 1}, Update{}, false},
		{"unknown state ignored", nil, Update{ID: "x", State: 7}, Update{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, clk := newTestList(t, 10)
			l.Apply(tc.have)
			before := l.Stats()
			clk.now = clk.now.Add(time.Second)
			l.Apply([]Update{tc.u})
			after := l.Stats()
			if got := after.UpdatesApplied - before.UpdatesApplied; got != map[bool]uint64{true: 1}[tc.applied] {
				t.Fatalf("applied %d updates, want applied=%v", got, tc.applied)
			}
			if got := after.UpdatesIgnored - before.UpdatesIgnored; got != map[bool]uint64{false: 1}[tc.applied] {
				t.Fatalf("ignored %d updates, want applied=%v", got, tc.applied)
			}
			m, ok := l.Member(tc.u.ID)
			if tc.want.ID == "" {
				if ok {
					t.Fatalf("member %q exists: %+v", tc.u.ID, m)
				}
				return
			}
			if !ok || m.Update() != tc.want {
				t.Fatalf("member = %+v (known %v), want %+v", m.Update(), ok, tc.want)
			}
			stateChanged := len(tc.have) == 0 || tc.have[0].State != tc.want.State
			if wantSince := map[bool]time.Time{true: clk.now, false: t0}[stateChanged]; !m.Since.Equal(wantSince) {
				t.Fatalf("Since = %v, want %v (state changed: %v)", m.Since, wantSince, stateChanged)
			}
		})
	}
}

func TestSelfRefutation(t *testing.T) {
	for _, tc := range []struct {
		name    string
		u       Update
		wantInc uint64
		refuted bool
	}{
		{"suspect at our incarnation", up("self", 10, Suspect), 11, true},
		{"dead above our incarnation", up("self", 12, Dead), 13, true},
		{"left at our incarnation", up("self", 10, Left), 11, true},
		{"stale suspect", up("self", 9, Suspect), 10, false},
		{"stale dead", up("self", 3, Dead), 10, false},
		{"alive at our incarnation", up("self", 10, Alive), 10, false},
		{"alive above ours is adopted", up("self", 15, Alive), 15, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, _ := newTestList(t, 10)
			drain(l) // the announcement
			l.Apply([]Update{tc.u})
			me := l.Self()
			if me.Incarnation != tc.wantInc || me.State != Alive {
				t.Fatalf("self = %v, want alive@%d", me.Update(), tc.wantInc)
			}
			if got := l.Stats().Refutations; got != map[bool]uint64{true: 1}[tc.refuted] {
				t.Fatalf("refutations = %d, want refuted=%v", got, tc.refuted)
			}
			out := l.Outgoing(0)
			if changed := tc.wantInc != 10; changed != slices.Contains(out, me.Update()) {
				t.Fatalf("outgoing %v: self update queued = %v, want %v", out, !changed, changed)
			}
		})
	}
	// Claims arriving in any order end at the same incarnation.
	a, _ := newTestList(t, 10)
	b, _ := newTestList(t, 10)
	claims := []Update{up("self", 11, Alive), up("self", 10, Suspect), up("self", 11, Dead), up("self", 12, Alive)}
	a.Apply(claims)
	rev := slices.Clone(claims)
	slices.Reverse(rev)
	b.Apply(rev)
	if a.Self().Incarnation != 12 || b.Self().Incarnation != 12 {
		t.Fatalf("incarnations %d and %d, want 12", a.Self().Incarnation, b.Self().Incarnation)
	}
}

func TestAddAndLeave(t *testing.T) {
	l, _ := newTestList(t, 10)
	var changes []Member
	l.OnChange(func(m Member) { changes = append(changes, m) })
	l.Add("x", "x:1")
	if m, _ := l.Member("x"); m.Update() != up("x", 0, Alive) {
		t.Fatalf("added %+v", m)
	}
	l.Add("x", "x:2")
	l.Add("x", "x:2")
	l.Add("self", "elsewhere:1")
	if m, _ := l.Member("x"); m.Addr != "x:2" {
		t.Fatalf("address not updated: %+v", m)
	}
	if l.Self().Addr != "self:1" {
		t.Fatalf("Add changed our own record: %+v", l.Self())
	}
	if len(changes) != 2 {
		t.Fatalf("changes %+v, want the add and the address change", changes)
	}
	// Any real update outranks what Add guessed; Add never changes state.
	l.Apply([]Update{up("x", 1, Dead)})
	l.Add("x", "x:3")
	if m, _ := l.Member("x"); m.State != Dead || m.Incarnation != 1 || m.Addr != "x:3" {
		t.Fatalf("after Dead and Add: %+v", m)
	}

	l.Leave()
	me := l.Self()
	if me.State != Left || me.Incarnation != 11 {
		t.Fatalf("after Leave: %+v", me)
	}
	if out := l.Outgoing(0); !slices.Contains(out, me.Update()) {
		t.Fatalf("Leave not queued: %v", out)
	}
	l.Apply([]Update{up("self", 20, Dead), up("self", 30, Alive)})
	l.Leave()
	if got := l.Self(); got.Update() != me.Update() {
		t.Fatalf("a node that left changed to %+v", got)
	}
	if alive := l.Alive(); len(alive) != 0 {
		t.Fatalf("Alive() = %+v after leaving with x dead", alive)
	}
}

func TestOutgoing(t *testing.T) {
	l, _ := newTestList(t, 10)
	drain(l)
	// 9 members with us: limit = RetransmitMult × ceil(log10(10)) = 6.
	for i := range 8 {
		l.Add(string(rune('a'+i)), "")
	}
	limit := l.retransmitLimit()
	if limit != 6 {
		t.Fatalf("retransmit limit %d, want 6", limit)
	}
	l.Apply([]Update{up("a", 1, Alive), up("b", 1, Alive), up("c", 1, Alive)})
	first := l.Outgoing(2)
	if want := []Update{up("c", 1, Alive), up("b", 1, Alive)}; !slices.Equal(first, want) {
		t.Fatalf("first Outgoing(2) = %v, want newest first %v", first, want)
	}
	if second := l.Outgoing(1); !slices.Equal(second, []Update{up("a", 1, Alive)}) {
		t.Fatalf("second Outgoing(1) = %v, want the least-sent", second)
	}
	sent := map[string]int{"a": 1, "b": 1, "c": 1}
	for range 20 {
		for _, u := range l.Outgoing(0) {
			sent[u.ID]++
		}
	}
	for id, n := range sent {
		if n != limit {
			t.Fatalf("%s sent %d times, want %d", id, n, limit)
		}
	}
	if out := l.Outgoing(0); len(out) != 0 {
		t.Fatalf("queue not drained: %v", out)
	}
	// A newer update replaces the queued one and starts afresh.
	l.Apply([]Update{up("d", 1, Alive)})
	l.Outgoing(0)
	l.Apply([]Update{up("d", 1, Suspect)})
	if out := l.Outgoing(0); !slices.Equal(out, []Update{up("d", 1, Suspect)}) {
		t.Fatalf("after replacement: %v", out)
	}
}

// TestMessagePiggyback checks what a message to a given member carries:
// our record, its record if we think it is not alive, fresher records
// where it is behind, and never queued news about it or from it.
func TestMessagePiggyback(t *testing.T) {
	a, _ := newTestList(t, 10)
	drain(a)
	a.Apply([]Update{up("b", 5, Dead)})
	a.HandlePing("c", []Update{up("x", 7, Alive)}) // x's news came from c

	// A member we think dead pings us: the ack tells it so, and carries
	// fresher news where its own is stale.
	ack := a.HandlePing("b", []Update{up("b", 5, Alive), up("x", 6, Alive)})
	if len(ack) < 3 || ack[0] != a.Self().Update() || ack[1] != up("b", 5, Dead) || ack[2] != up("x", 7, Alive) {
		t.Fatalf("ack to a dead sender = %v", ack)
	}
	// The sender refutes on reading it.
	b2 := New(Member{ID: "b", Addr: "b:1", Incarnation: 5}, Config{}, nil, &manualClock{now: t0}, rand.New(rand.NewPCG(3, 4)), nil)
	b2.Apply(ack)
	if me := b2.Self(); me.Incarnation != 6 || me.State != Alive {
		t.Fatalf("b after the ack: %+v", me)
	}
	if b2.Stats().Refutations != 1 {
		t.Fatalf("b did not count a refutation")
	}

	// News about c, or learned from c, is not sent back to c.
	a.Apply([]Update{up("c", 2, Alive)})
	msg := a.HandlePing("c", nil)
	for _, u := range msg[1:] {
		if u.ID == "c" || u.ID == "x" {
			t.Fatalf("message to c carries %v", u)
		}
	}
	if out := a.Outgoing(0); !slices.Contains(out, up("c", 2, Alive)) || !slices.Contains(out, up("x", 7, Alive)) {
		t.Fatalf("news held back from c is not kept for others: %v", out)
	}
}
