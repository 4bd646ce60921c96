package member

import (
	"os"
	"slices"
	"strconv"
	"testing"
	"time"
)

// detectBudget is the target from DefaultConfig's documentation: a killed
// node is Dead on every other node within 5 s.
const detectBudget = 5 * time.Second

func warmUp(t *testing.T, s *simNet) {
	t.Helper()
	if d, ok := s.runUntil(30*time.Second, 50*time.Millisecond, s.converged); !ok {
		t.Fatalf("seed %d: %d nodes did not converge within %v", s.seed, len(s.order), d)
	}
}

func TestSimKillAndRestart(t *testing.T) {
	var detect, back []time.Duration
	for seed := uint64(1); seed <= 20; seed++ {
		s := newSim(t, seed, DefaultConfig())
		ids := s.ids(5, "n")
		s.startAll(ids)
		warmUp(t, s)
		s.runFor(3 * time.Second)

		victim := ids[int(seed)%len(ids)]
		old := s.nodes[victim].l.Self().Incarnation
		s.kill(victim)
		d, ok := s.runUntil(30*time.Second, 10*time.Millisecond, func() bool { return s.allSee(victim, Dead, old) })
		if !ok {
			t.Fatalf("seed %d: %s not Dead everywhere after %v", seed, victim, d)
		}
		if d > detectBudget {
			t.Fatalf("seed %d: %s took %v to be Dead everywhere, budget %v", seed, victim, d, detectBudget)
		}
		detect = append(detect, d)

		s.runFor(5 * time.Second)
		n := s.start(victim)
		if inc := n.l.Self().Incarnation; inc <= old {
			t.Fatalf("seed %d: restarted incarnation %d not above %d", seed, inc, old)
		}
		d, ok = s.runUntil(30*time.Second, 10*time.Millisecond, s.converged)
		if !ok {
			t.Fatalf("seed %d: restarted %s not Alive everywhere after %v", seed, victim, d)
		}
		back = append(back, d)
	}
	t.Logf("5 nodes, 20 seeds: kill → Dead on all: %s; restart → Alive on all: %s", summary(detect), summary(back))
}

func TestSimPartitionHeal(t *testing.T) {
	var split, heal []time.Duration
	for seed := uint64(1); seed <= 20; seed++ {
		s := newSim(t, seed, DefaultConfig())
		ids := s.ids(5, "n")
		s.startAll(ids)
		warmUp(t, s)

		a, b := ids[:2], ids[2:]
		for _, id := range a {
			s.group[id] = 1
		}
		sidesDead := func() bool {
			for _, x := range a {
				for _, y := range b {
					if m, _ := s.nodes[x].l.Member(y); m.State != Dead {
						return false
					}
					if m, _ := s.nodes[y].l.Member(x); m.State != Dead {
						return false
					}
				}
			}
			return true
		}
		d, ok := s.runUntil(30*time.Second, 10*time.Millisecond, sidesDead)
		if !ok {
			t.Fatalf("seed %d: sides did not mark each other Dead within %v", seed, d)
		}
		split = append(split, d)
		// Half the seeds stay apart well past any suspicion and
		// retransmission; the others heal while the deaths are still news
		// queued on each side.
		apart := 20 * time.Second
		if seed > 10 {
			apart = time.Duration(seed-10) * 200 * time.Millisecond
		}
		s.runFor(apart)
		for _, x := range a {
			for _, y := range a {
				if m, _ := s.nodes[x].l.Member(y); m.State != Alive {
					t.Fatalf("seed %d: %s sees %s on its own side as %s", seed, x, y, m.State)
				}
			}
		}

		// While the heal spreads, the other side's news is stale: a node
		// must not take from it that a member of its own side, which it
		// heard from all along, died (schedd would replace its tasks).
		clear(s.group)
		sameSide := func() bool {
			for _, side := range [][]string{a, b} {
				for _, x := range side {
					for _, y := range side {
						if m, _ := s.nodes[x].l.Member(y); m.State == Dead {
							t.Fatalf("seed %d: after the heal %s took %s on its own side for dead", seed, x, y)
						}
					}
				}
			}
			return s.converged()
		}
		d, ok = s.runUntil(60*time.Second, 10*time.Millisecond, sameSide)
		if !ok {
			t.Fatalf("seed %d: not all Alive everywhere %v after healing", seed, d)
		}
		heal = append(heal, d)
	}
	t.Logf("5 nodes 2|3, 20 seeds: partition → other side Dead: %s; heal → all Alive everywhere: %s", summary(split), summary(heal))
}

// TestSimMessageLoss runs 20 nodes for three virtual minutes at 1%, 5%
// and 10% independent message loss. At 1% no live node may be declared
// Dead; at higher loss the false-positive rate is reported (none was seen
// with the defaults). Either way the cluster must converge once the loss
// stops.
func TestSimMessageLoss(t *testing.T) {
	const n, dur = 20, 3 * time.Minute
	for _, tc := range []struct {
		loss    float64
		allowFP bool
	}{
		{loss: 0.01},
		{loss: 0.05, allowFP: true},
		{loss: 0.10, allowFP: true},
	} {
		var probes, susp, refutes uint64
		falses := 0
		const seeds = 3
		for seed := uint64(1); seed <= seeds; seed++ {
			s := newSim(t, seed, DefaultConfig())
			s.logFalse = true
			s.startAll(s.ids(n, "n"))
			warmUp(t, s)
			before := s.totalStats()
			s.loss = tc.loss
			s.runFor(dur)
			st := s.totalStats()
			probes += st.ProbesSent - before.ProbesSent
			susp += st.Suspicions - before.Suspicions
			refutes += st.Refutations - before.Refutations
			falses += s.falseDead
			if s.falseDead > 0 && !tc.allowFP {
				t.Fatalf("%.0f%% loss, seed %d: %d live nodes declared Dead", tc.loss*100, seed, s.falseDead)
			}
			s.loss = 0
			if d, ok := s.runUntil(30*time.Second, 50*time.Millisecond, s.converged); !ok {
				t.Fatalf("%.0f%% loss, seed %d: not converged %v after the loss stopped", tc.loss*100, seed, d)
			}
		}
		nodeMinutes := float64(seeds * n * dur.Minutes())
		t.Logf("%d nodes, %2.0f%% loss, %d×%v: %d probes, %d suspicions (%.1g per probe), %d refutations, %d false Dead declarations (%.2g per node-minute)",
			n, tc.loss*100, seeds, dur, probes, susp, float64(susp)/float64(probes), refutes, falses, float64(falses)/nodeMinutes)
	}
}

func TestSimLeave(t *testing.T) {
	s := newSim(t, 7, DefaultConfig())
	ids := s.ids(5, "n")
	s.startAll(ids)
	warmUp(t, s)
	leaver := s.nodes[ids[1]]
	leaver.l.Leave()
	d, ok := s.runUntil(10*time.Second, 10*time.Millisecond, func() bool { return s.allSee(leaver.id, Left, 0) })
	if !ok {
		t.Fatalf("Left not everywhere after %v", d)
	}
	t.Logf("5 nodes: Leave → Left on all in %v", d)
	s.kill(leaver.id)
	s.runFor(30 * time.Second)
	if !s.allSee(leaver.id, Left, 0) {
		t.Fatalf("a node that left turned into something else after it stopped")
	}
	for _, n := range s.up() {
		if st := n.l.Stats(); st.Suspicions != 0 {
			t.Fatalf("%s raised %d suspicions; a node that left must not be probed", n.id, st.Suspicions)
		}
	}
	// It may come back with a newer incarnation.
	s.start(leaver.id)
	if d, ok := s.runUntil(10*time.Second, 10*time.Millisecond, s.converged); !ok {
		t.Fatalf("rejoin after leave not everywhere after %v", d)
	}
}

// TestSimDeterministic replays one run with the same seed and requires the
// same tables (including local timestamps), counters and message count.
func TestSimDeterministic(t *testing.T) {
	run := func() ([]string, Stats, int) {
		s := newSim(t, 42, DefaultConfig())
		ids := s.ids(8, "n")
		s.startAll(ids)
		s.loss = 0.05
		s.runFor(10 * time.Second)
		s.kill(ids[3])
		s.group[ids[0]] = 1
		s.runFor(10 * time.Second)
		clear(s.group)
		s.start(ids[3])
		s.runFor(10 * time.Second)
		return s.tables(), s.totalStats(), s.msgs
	}
	t1, st1, m1 := run()
	t2, st2, m2 := run()
	if !slices.Equal(t1, t2) || st1 != st2 || m1 != m2 {
		t.Fatalf("same seed, different runs:\n%v %v %d\n%v %v %d", st1, t1, m1, st2, t2, m2)
	}
}

// TestSimLarge measures a 100-node cluster (MEMBER_SIM_NODES and
// MEMBER_SIM_SEEDS change the size and the number of runs): how long until
// a killed node is suspected and then Dead everywhere, and how long a
// Leave and a restart take to reach everyone.
func TestSimLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("large simulation")
	}
	n, seeds := envInt(t, "MEMBER_SIM_NODES", 100), envInt(t, "MEMBER_SIM_SEEDS", 4)
	var detect, firstSusp, leave, join []time.Duration
	for seed := uint64(1); seed <= uint64(seeds); seed++ {
		s := newSim(t, seed, DefaultConfig())
		ids := s.ids(n, "n")
		s.startAll(ids)
		warmUp(t, s)
		s.runFor(10 * time.Second)

		victim := ids[n/5]
		s.kill(victim)
		from := s.now
		d, ok := s.runUntil(60*time.Second, 10*time.Millisecond, func() bool { return s.allSee(victim, Dead, 0) })
		if !ok {
			t.Fatalf("seed %d: victim not Dead everywhere after %v", seed, d)
		}
		if d > detectBudget {
			t.Errorf("seed %d: %d nodes: detection took %v, budget %v", seed, n, d, detectBudget)
		}
		detect = append(detect, d)
		firstSusp = append(firstSusp, firstSuspicion(s, victim, from))

		s.runFor(10 * time.Second)
		leaver := ids[n/2]
		s.nodes[leaver].l.Leave()
		d, ok = s.runUntil(30*time.Second, 10*time.Millisecond, func() bool { return s.allSee(leaver, Left, 0) })
		if !ok {
			t.Fatalf("seed %d: Left not everywhere after %v", seed, d)
		}
		leave = append(leave, d)
		s.kill(leaver)

		s.runFor(10 * time.Second)
		s.start(victim)
		inc := s.nodes[victim].l.Self().Incarnation
		d, ok = s.runUntil(30*time.Second, 10*time.Millisecond, func() bool { return s.allSee(victim, Alive, inc) })
		if !ok {
			t.Fatalf("seed %d: restarted node not Alive everywhere after %v", seed, d)
		}
		join = append(join, d)
		if s.falseDead > 0 {
			t.Fatalf("seed %d: %d false Dead declarations without loss", seed, s.falseDead)
		}
	}
	t.Logf("%d nodes, %d seeds: kill → first Suspect %s; → Dead on all %s", n, seeds, summary(firstSusp), summary(detect))
	t.Logf("%d nodes, %d seeds: Leave → Left on all %s; restart → Alive on all %s", n, seeds, summary(leave), summary(join))
}

func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// firstSuspicion returns how long after from some node first saw subject
// Suspect.
func firstSuspicion(s *simNet, subject string, from time.Time) time.Duration {
	best := time.Duration(-1)
	for k, o := range s.suspectSeen {
		if k[1] == subject && !o.Before(from) && (best < 0 || o.Sub(from) < best) {
			best = o.Sub(from)
		}
	}
	return best
}

func summary(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return "min " + s[0].Round(time.Millisecond).String() +
		" median " + s[len(s)/2].Round(time.Millisecond).String() +
		" max " + s[len(s)-1].Round(time.Millisecond).String() +
		" mean " + (sum / time.Duration(len(s))).Round(time.Millisecond).String()
}
