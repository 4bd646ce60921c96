package member

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"pgregory.net/rapid"
)

// genUpdate draws a claim about one of a few members, this node included.
// A member's address depends only on its incarnation, as in Shoal, where a
// new address means a restart and so a new incarnation.
func genUpdate(ids ...string) *rapid.Generator[Update] {
	return rapid.Custom(func(t *rapid.T) Update {
		id := rapid.SampledFrom(ids).Draw(t, "id")
		inc := rapid.Uint64Range(0, 6).Draw(t, "inc")
		return Update{
			ID:          id,
			Addr:        fmt.Sprintf("%s:%d", id, 7000+inc%3),
			Incarnation: inc,
			State:       State(rapid.IntRange(0, 3).Draw(t, "state")),
		}
	})
}

// settled lets every suspicion on l run out. Until then the tables of two
// nodes may differ: a Dead claim about a member a node holds alive is a
// suspicion there, timed by that node (see applyLocked), so whether it
// arrived before or after the member was first heard of matters for a
// while. Once the timers ran, every node holds the greatest claim.
func settled(l *List) *List {
	clk := l.clk.(*manualClock)
	clk.now = clk.now.Add(l.cfg.SuspicionTimeout)
	l.expire(clk.now)
	return l
}

func table(l *List) []Update {
	var out []Update
	for _, m := range l.Members() {
		out = append(out, m.Update())
	}
	return out
}

func freshList(selfInc uint64) *List {
	return New(Member{ID: "self", Addr: "self:1", Incarnation: selfInc}, Config{}, nil, &manualClock{now: t0}, rand.New(rand.NewPCG(1, 2)), nil)
}

// TestPropertyOrderIndependent: the same updates delivered in any order,
// in any batches, with any duplicates, give the same table on every node
// once suspicions have run out, including this node's own incarnation
// after refutations.
func TestPropertyOrderIndependent(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ups := rapid.SliceOfN(genUpdate("self", "a", "b", "c"), 0, 40).Draw(t, "updates")
		selfInc := rapid.Uint64Range(0, 4).Draw(t, "selfInc")

		a := freshList(selfInc)
		a.Apply(ups)

		b := freshList(selfInc)
		perm := rapid.Permutation(ups).Draw(t, "perm")
		for len(perm) > 0 {
			n := rapid.IntRange(1, len(perm)).Draw(t, "batch")
			b.Apply(perm[:n])
			if rapid.Bool().Draw(t, "dup") {
				b.Apply(perm[:n])
			}
			perm = perm[n:]
		}

		ta, tb := table(settled(a)), table(settled(b))
		if fmt.Sprint(ta) != fmt.Sprint(tb) {
			t.Fatalf("tables differ:\n%v\n%v", ta, tb)
		}
	})
}

// TestPropertyModel checks Apply against the rules stated directly: each
// other member ends, once suspicions have run out, at the greatest claim
// about it (Dead where that was Suspect), and this node at the
// least incarnation that is at least every Alive claim and above every
// other claim (and at least its own).
func TestPropertyModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ups := rapid.SliceOfN(genUpdate("self", "a", "b"), 0, 30).Draw(t, "updates")
		selfInc := rapid.Uint64Range(0, 4).Draw(t, "selfInc")
		l := freshList(selfInc)
		l.Apply(ups)
		settled(l)

		best := map[string]Update{}
		wantSelf := selfInc
		for _, u := range ups {
			if u.ID == "self" {
				if u.State == Alive {
					wantSelf = max(wantSelf, u.Incarnation)
				} else {
					wantSelf = max(wantSelf, u.Incarnation+1)
				}
				continue
			}
			if cur, ok := best[u.ID]; !ok || u.Supersedes(cur) {
				best[u.ID] = u
			}
		}
		if me := l.Self(); me.Incarnation != wantSelf || me.State != Alive {
			t.Fatalf("self %v, want alive@%d", me.Update(), wantSelf)
		}
		for id, want := range best {
			if want.State == Suspect {
				want.State = Dead // nobody refuted in time
			}
			if m, _ := l.Member(id); m.Update() != want {
				t.Fatalf("%s = %v, want %v", id, m.Update(), want)
			}
		}
		if len(l.Members()) != len(best)+1 {
			t.Fatalf("members %v, want %d", l.Members(), len(best)+1)
		}
	})
}
