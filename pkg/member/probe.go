package member

import (
	"time"
)

// The protocol is written as a deterministic state machine: round, handle,
// gossip and expire take the current time or a message's outcome and
// return the messages to send, and know nothing of goroutines, timers or
// networks. Run is one driver of it
// (real transport, real or injected clock); the package tests drive the
// very same methods from a discrete-event simulation in virtual time, which
// is what makes multi-minute runs of 100 nodes deterministic and fast.

// probe is one ping of the current round.
type probe struct {
	id       uint64
	target   Member // as it was when the probe started
	dead     bool   // a probe of a Dead member: no indirect step, no suspicion
	acked    bool
	indirect bool // ping requests already sent
}

// action is a message the driver must send for a probe. Via empty means a
// direct Ping of Target (bounded by ProbeTimeout); otherwise a PingReq
// through Via (bounded by the end of the round).
type action struct {
	probe   uint64
	via     Member
	target  Member
	updates []Update
}

func (a action) direct() bool { return a.via.ID == "" }

// result is what came of an action. from is who answered: the target for a
// direct ping, the via for a ping request. updates may be non-empty even
// when acked is false (a via that answered without reaching the target).
type result struct {
	probe   uint64
	direct  bool
	from    string
	acked   bool
	updates []Update
}

// round ends the previous round and starts the next one at now. A probe of
// the previous round that got no ack marks its target Suspect at the
// incarnation it had when the probe started: a refutation that arrived
// meanwhile is fresh proof of life and must not be overridden.
func (l *List) round(now time.Time) []action {
	l.mu.Lock()
	for _, p := range l.probes {
		if _, known := l.members[p.target.ID]; p.acked || p.dead || !known {
			continue
		}
		s := p.target.Update()
		s.State = Suspect
		if l.applyLocked(s, "", now) {
			l.stats.Suspicions++
			l.log.Info("member: suspect", "id", s.ID, "incarnation", s.Incarnation)
		}
	}
	l.probes = l.probes[:0]
	l.expireLocked(now)
	l.rounds++

	var acts []action
	if t, ok := l.nextTargetLocked(); ok {
		acts = append(acts, l.startProbeLocked(t, false))
		l.stats.ProbesSent++
	}
	if n := l.cfg.DeadProbeEvery; n > 0 && l.rounds%uint64(n) == 0 {
		if t, ok := l.randomDeadLocked(); ok {
			acts = append(acts, l.startProbeLocked(t, true))
			l.stats.DeadProbesSent++
		}
	}
	l.mu.Unlock()
	l.flush()
	return acts
}

func (l *List) startProbeLocked(t Member, dead bool) action {
	l.probeSeq++
	p := &probe{id: l.probeSeq, target: t, dead: dead}
	l.probes = append(l.probes, p)
	return action{probe: p.id, target: t, updates: l.messageLocked(t.ID, nil)}
}

// handle takes the outcome of an action and returns follow-up actions: the
// ping requests when a direct ping of a live-looking target failed.
// Piggybacked updates are applied even when the probe is over, since they
// are valid news whenever they arrive.
func (l *List) handle(r result) []action {
	l.mu.Lock()
	l.receiveLocked(r.from, r.updates)
	var acts []action
	var p *probe
	for _, q := range l.probes {
		if q.id == r.probe {
			p = q
		}
	}
	switch {
	case p == nil:
	case r.direct && r.acked:
		p.acked = true
		l.stats.Acks++
	case r.direct && !p.dead && !p.acked && !p.indirect:
		p.indirect = true
		for _, via := range l.pickViasLocked(p.target.ID) {
			acts = append(acts, action{probe: p.id, via: via, target: p.target, updates: l.messageLocked(via.ID, nil)})
		}
		l.stats.IndirectProbes += uint64(len(acts))
	case !r.direct && r.acked:
		if !p.acked {
			l.stats.IndirectAcks++
		}
		p.acked = true
	}
	l.mu.Unlock()
	l.flush()
	return acts
}

// gossip pushes queued updates to GossipFanout random Alive or Suspect
// members (a suspect is told of its suspicion this way too, see
// messageLocked). The pings carry probe 0: their acks only bring updates
// back, and a missing ack means nothing, since failure detection is the
// probes' job.
func (l *List) gossip() []action {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cfg.GossipFanout < 0 || len(l.queue) == 0 {
		return nil
	}
	var cand []string
	for _, id := range l.ids {
		if st := l.members[id].State; id != l.selfID && (st == Alive || st == Suspect) {
			cand = append(cand, id)
		}
	}
	var acts []action
	for i := range min(l.cfg.GossipFanout, len(cand)) {
		j := i + l.rnd.IntN(len(cand)-i)
		cand[i], cand[j] = cand[j], cand[i]
		m := l.members[cand[i]].Member
		msg := l.messageLocked(m.ID, nil)
		if len(msg) <= 1 { // only our own record: nothing new to say
			continue
		}
		acts = append(acts, action{target: m, updates: msg})
		l.stats.GossipSent++
	}
	return acts
}

// expire declares Dead every Suspect whose timer ran out by now.
func (l *List) expire(now time.Time) {
	l.mu.Lock()
	l.expireLocked(now)
	l.mu.Unlock()
	l.flush()
}

func (l *List) expireLocked(now time.Time) {
	for _, id := range l.ids {
		e := l.members[id]
		if e.State != Suspect || now.Before(e.suspectDeadline) {
			continue
		}
		d := e.Update()
		d.State = Dead
		if l.setLocked(e, d, "", now) {
			l.stats.DeadDeclared++
			l.log.Info("member: dead", "id", id, "incarnation", d.Incarnation)
		}
	}
}

// nextDeadline returns when the earliest suspicion runs out.
func (l *List) nextDeadline() (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var first time.Time
	for _, id := range l.ids {
		e := l.members[id]
		if e.State == Suspect && (first.IsZero() || e.suspectDeadline.Before(first)) {
			first = e.suspectDeadline
		}
	}
	return first, !first.IsZero()
}

// nextTargetLocked walks a shuffled round-robin of the other members, as
// SWIM's round-robin variant: every live member is probed by every node
// once per pass (bounded detection time), in an order that differs between
// nodes and passes (so probes of one member are spread out in time).
func (l *List) nextTargetLocked() (Member, bool) {
	for pass := 0; pass < 2; pass++ {
		for l.orderPos < len(l.order) {
			e := l.members[l.order[l.orderPos]]
			l.orderPos++
			if e != nil && (e.State == Alive || e.State == Suspect) {
				return e.Member, true
			}
		}
		l.order = l.order[:0]
		for _, id := range l.ids {
			if id != l.selfID {
				l.order = append(l.order, id)
			}
		}
		l.rnd.Shuffle(len(l.order), func(i, j int) { l.order[i], l.order[j] = l.order[j], l.order[i] })
		l.orderPos = 0
	}
	return Member{}, false
}

func (l *List) randomDeadLocked() (Member, bool) {
	var dead []string
	for _, id := range l.ids {
		if l.members[id].State == Dead {
			dead = append(dead, id)
		}
	}
	if len(dead) == 0 {
		return Member{}, false
	}
	return l.members[dead[l.rnd.IntN(len(dead))]].Member, true
}

// pickViasLocked chooses up to IndirectProbes random Alive members other
// than us and the target. Suspects are not asked: they may well be the
// ones with the broken network.
func (l *List) pickViasLocked(target string) []Member {
	var cand []string
	for _, id := range l.ids {
		if id != l.selfID && id != target && l.members[id].State == Alive {
			cand = append(cand, id)
		}
	}
	k := min(l.cfg.IndirectProbes, len(cand))
	vias := make([]Member, 0, k)
	for i := range k {
		j := i + l.rnd.IntN(len(cand)-i)
		cand[i], cand[j] = cand[j], cand[i]
		vias = append(vias, l.members[cand[i]].Member)
	}
	return vias
}

// HandlePing is the receiving side of Transport.Ping from the member
// from: it applies the sender's updates and returns the piggyback for the
// ack. If we believe the sender is not alive, the ack carries that record
// so the sender refutes it (this is how a node wrongly declared Dead finds
// out), and where the sender's news is older than ours, the ack carries
// ours.
func (l *List) HandlePing(from string, updates []Update) []Update {
	l.mu.Lock()
	behind := l.receiveLocked(from, updates)
	l.stats.PingsServed++
	out := l.messageLocked(from, behind)
	l.mu.Unlock()
	l.flush()
	return out
}

// pingReqStart and pingReqFinish are HandlePingReq without the ping in
// between, for drivers that send it themselves: start applies the
// requester's updates and returns the ping's piggyback, finish applies the
// target's ack (if any) and returns the reply's piggyback.
func (l *List) pingReqStart(from string, updates []Update, target Member) (msg []Update, behind []string) {
	l.mu.Lock()
	behind = l.receiveLocked(from, updates)
	l.stats.PingReqsServed++
	msg = l.messageLocked(target.ID, nil)
	l.mu.Unlock()
	l.flush()
	return msg, behind
}

func (l *List) pingReqFinish(from string, target Member, behind []string, acked bool, ack []Update) []Update {
	l.mu.Lock()
	if acked {
		l.receiveLocked(target.ID, ack)
	}
	out := l.messageLocked(from, behind)
	l.mu.Unlock()
	l.flush()
	return out
}
