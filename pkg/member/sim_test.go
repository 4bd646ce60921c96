package member

import (
	"container/heap"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// simNet is a discrete-event simulation of a cluster: every List is driven
// through the same round/handle/expire/HandlePing methods Run uses, but in
// virtual time on one goroutine, with a seeded network that adds latency,
// drops messages and partitions. The same seed replays the same run.
type simNet struct {
	t      testing.TB
	cfg    Config
	seed   uint64
	now    time.Time
	t0     time.Time
	seq    uint64
	events eventHeap
	rnd    *rand.Rand

	loss           float64 // probability that any one message is lost
	minLat, maxLat time.Duration

	nodes  map[string]*simNode // the current node with each ID
	order  []string            // IDs in creation order
	byAddr map[string]*simNode
	group  map[string]int // partition group of each ID

	// falseDead counts a live node being declared Dead by another (only
	// meaningful in runs without kills or restarts).
	falseDead int
	// seen records, per observer and subject, the last state change.
	seen map[[2]string]observation
	// suspectSeen records when each observer last saw a subject turn Suspect.
	suspectSeen map[[2]string]time.Time
	msgs        int  // messages sent, lost or not
	logFalse    bool // log false Dead declarations
}

type observation struct {
	m  Member
	at time.Time
}

type simNode struct {
	id, addr string
	gen      int
	l        *List
	up       bool
	armed    time.Time // pending suspicion check, zero if none
}

type event struct {
	at  time.Time
	seq uint64
	fn  func()
}

type eventHeap []*event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(*event)) }
func (h *eventHeap) Pop() (x any) { old := *h; x = old[len(old)-1]; *h = old[:len(old)-1]; return x }
func (s *simNet) at(t time.Time, fn func()) {
	s.seq++
	heap.Push(&s.events, &event{at: t, seq: s.seq, fn: fn})
}
func (s *simNet) after(d time.Duration, fn func()) { s.at(s.now.Add(d), fn) }

type simClock struct{ s *simNet }

func (c simClock) Now() time.Time { return c.s.now }
func (c simClock) After(d time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	c.s.after(d, func() { ch <- c.s.now })
	return ch
}

func newSim(t testing.TB, seed uint64, cfg Config) *simNet {
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	return &simNet{
		t: t, cfg: cfg.withDefaults(), seed: seed, now: start, t0: start,
		rnd:    rand.New(rand.NewPCG(seed, 0x5eed)),
		minLat: 200 * time.Microsecond, maxLat: 2 * time.Millisecond,
		nodes: map[string]*simNode{}, byAddr: map[string]*simNode{},
		group: map[string]int{}, seen: map[[2]string]observation{},
		suspectSeen: map[[2]string]time.Time{},
	}
}

func hashID(id string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(id))
	return h.Sum64()
}

// start creates (or restarts) node id at its usual address, with an
// incarnation from the virtual wall clock as statd does, knowing every
// other node by Add as statd would from its node documents.
func (s *simNet) start(id string) *simNode {
	gen := 0
	if old := s.nodes[id]; old != nil {
		old.up = false
		gen = old.gen + 1
	} else {
		s.order = append(s.order, id)
	}
	n := &simNode{id: id, addr: id + ":7946", gen: gen, up: true}
	rnd := rand.New(rand.NewPCG(s.seed^hashID(id), uint64(gen)))
	n.l = New(Member{ID: id, Addr: n.addr, Incarnation: uint64(s.now.UnixMilli())}, s.cfg, nil, simClock{s}, rnd, nil)
	n.l.OnChange(func(m Member) { s.observe(n, m) })
	for _, other := range s.order {
		if other != id {
			n.l.Add(other, s.nodes[other].addr)
		}
	}
	s.nodes[id] = n
	s.byAddr[n.addr] = n
	s.after(time.Duration(s.rnd.Int64N(int64(s.cfg.ProbeInterval))), func() { s.round(n) })
	s.after(time.Duration(s.rnd.Int64N(int64(s.cfg.GossipInterval))), func() { s.gossip(n) })
	return n
}

func (s *simNet) kill(id string) { s.nodes[id].up = false }

func (s *simNet) observe(n *simNode, m Member) {
	if m.ID == n.id {
		return
	}
	s.seen[[2]string{n.id, m.ID}] = observation{m: m, at: s.now}
	if m.State == Suspect {
		s.suspectSeen[[2]string{n.id, m.ID}] = s.now
	}
	if m.State == Dead && s.nodes[m.ID] != nil && s.nodes[m.ID].up {
		s.falseDead++
		if s.logFalse {
			s.t.Logf("t=%v: %s declared live %s dead (incarnation %d)", s.elapsed(), n.id, m.ID, m.Incarnation)
		}
	}
}

func (s *simNet) elapsed() time.Duration { return s.now.Sub(s.t0) }

func (s *simNet) round(n *simNode) {
	if !n.up {
		return
	}
	s.exec(n, n.l.round(s.now))
	s.arm(n)
	s.after(s.cfg.ProbeInterval, func() { s.round(n) })
}

func (s *simNet) gossip(n *simNode) {
	if !n.up {
		return
	}
	s.exec(n, n.l.gossip())
	s.after(s.cfg.GossipInterval, func() { s.gossip(n) })
}

// arm schedules n's next suspicion check, as Run's timer does.
func (s *simNet) arm(n *simNode) {
	at, ok := n.l.nextDeadline()
	if !ok || (!n.armed.IsZero() && !at.Before(n.armed)) {
		return
	}
	n.armed = at
	s.at(at, func() {
		if n.armed.Equal(at) {
			n.armed = time.Time{}
		}
		if n.up {
			n.l.expire(s.now)
			s.arm(n)
		}
	})
}

func (s *simNet) result(n *simNode, r result) {
	if !n.up {
		return
	}
	s.exec(n, n.l.handle(r))
	s.arm(n)
}

func (s *simNet) exec(n *simNode, acts []action) {
	for _, a := range acts {
		if a.direct() {
			s.ping(n, a.target, a.updates, func(acked bool, ups []Update) {
				s.result(n, result{probe: a.probe, direct: true, from: a.target.ID, acked: acked, updates: ups})
			})
			continue
		}
		s.deliver(n, a.via.Addr, func(via *simNode) {
			msg, behind := via.l.pingReqStart(n.id, a.updates, a.target)
			s.arm(via)
			s.ping(via, a.target, msg, func(acked bool, ack []Update) {
				if !via.up {
					return
				}
				reply := via.l.pingReqFinish(n.id, a.target, behind, acked, ack)
				s.arm(via)
				s.deliver(via, n.addr, func(dst *simNode) {
					if dst == n {
						s.result(n, result{probe: a.probe, from: via.id, acked: acked, updates: reply})
					}
				})
			})
		})
	}
}

// ping models Transport.Ping with ProbeTimeout: done gets the ack, or a
// failure once the timeout passes.
func (s *simNet) ping(src *simNode, target Member, ups []Update, done func(bool, []Update)) {
	finished := false
	finish := func(acked bool, ack []Update) {
		if !finished {
			finished = true
			done(acked, ack)
		}
	}
	s.after(s.cfg.ProbeTimeout, func() { finish(false, nil) })
	s.deliver(src, target.Addr, func(dst *simNode) {
		ack := dst.l.HandlePing(src.id, ups)
		s.arm(dst)
		s.deliver(dst, src.addr, func(back *simNode) {
			if back == src {
				finish(true, ack)
			}
		})
	})
}

// deliver sends one message from src to addr: it may be lost, is cut by
// partitions, takes a random latency, and reaches only a running node.
func (s *simNet) deliver(src *simNode, addr string, fn func(dst *simNode)) {
	s.msgs++
	if s.loss > 0 && s.rnd.Float64() < s.loss {
		return
	}
	dst := s.byAddr[addr]
	if dst == nil || s.group[src.id] != s.group[dst.id] {
		return
	}
	lat := s.minLat + time.Duration(s.rnd.Int64N(int64(s.maxLat-s.minLat)+1))
	s.after(lat, func() {
		if dst.up && src.up {
			fn(dst)
		}
	})
}

// runFor advances virtual time by d.
func (s *simNet) runFor(d time.Duration) {
	end := s.now.Add(d)
	for len(s.events) > 0 && !s.events[0].at.After(end) {
		e := heap.Pop(&s.events).(*event)
		s.now = e.at
		e.fn()
	}
	s.now = end
}

// runUntil advances virtual time until cond holds (checked every step) or
// limit passes, and returns the time taken and whether cond held.
func (s *simNet) runUntil(limit, step time.Duration, cond func() bool) (time.Duration, bool) {
	begin := s.now
	for s.now.Sub(begin) < limit {
		s.runFor(step)
		if cond() {
			return s.now.Sub(begin), true
		}
	}
	return s.now.Sub(begin), false
}

// up returns the running nodes in creation order.
func (s *simNet) up() []*simNode {
	var out []*simNode
	for _, id := range s.order {
		if n := s.nodes[id]; n.up {
			out = append(out, n)
		}
	}
	return out
}

// allSee reports whether every running node other than subject believes
// subject is in state st (at incarnation at least minInc).
func (s *simNet) allSee(subject string, st State, minInc uint64) bool {
	for _, n := range s.up() {
		if n.id == subject {
			continue
		}
		m, ok := n.l.Member(subject)
		if !ok || m.State != st || m.Incarnation < minInc {
			return false
		}
	}
	return true
}

// converged reports whether every running node sees every running node
// Alive at its current incarnation, and no node sees another as anything
// but Alive.
func (s *simNet) converged() bool {
	ups := s.up()
	for _, n := range ups {
		for _, o := range ups {
			m, ok := n.l.Member(o.id)
			if !ok || m.State != Alive || m.Incarnation != o.l.Self().Incarnation {
				return false
			}
		}
	}
	return true
}

func (s *simNet) ids(n int, prefix string) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%03d", prefix, i)
	}
	return out
}

func (s *simNet) startAll(ids []string) {
	for _, id := range ids {
		s.start(id)
	}
}

func (s *simNet) totalStats() Stats {
	var t Stats
	for _, id := range s.order {
		st := s.nodes[id].l.Stats()
		t.ProbesSent += st.ProbesSent
		t.DeadProbesSent += st.DeadProbesSent
		t.Acks += st.Acks
		t.IndirectProbes += st.IndirectProbes
		t.IndirectAcks += st.IndirectAcks
		t.PingsServed += st.PingsServed
		t.PingReqsServed += st.PingReqsServed
		t.Suspicions += st.Suspicions
		t.DeadDeclared += st.DeadDeclared
		t.Refutations += st.Refutations
		t.UpdatesApplied += st.UpdatesApplied
		t.UpdatesIgnored += st.UpdatesIgnored
	}
	return t
}

// tables renders every running node's table, for comparing runs.
func (s *simNet) tables() []string {
	var out []string
	for _, n := range s.up() {
		for _, m := range n.l.Members() {
			out = append(out, fmt.Sprintf("%s: %s %s %d %v", n.id, m.ID, m.State, m.Incarnation, m.Since.Sub(s.t0)))
		}
	}
	slices.Sort(out)
	return out
}
