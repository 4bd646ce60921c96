package member

import (
	"cmp"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// List is one node's membership table and protocol state. All methods are
// safe for concurrent use.
type List struct {
	cfg Config
	tr  Transport
	clk Clock
	log *slog.Logger

	mu      sync.Mutex
	rnd     *rand.Rand
	selfID  string
	members map[string]*entry
	// ids is every member's ID, sorted: iterating it instead of the map
	// keeps the protocol a deterministic function of its inputs and seed,
	// which is what lets the simulation tests replay exactly.
	ids   []string
	queue map[string]*bcast
	bseq  uint64

	order    []string // this pass of the shuffled round-robin over peers
	orderPos int
	rounds   uint64
	probes   []*probe // the current round's probes
	probeSeq uint64

	stats Stats

	subs     []func(Member)
	pending  []Member
	flushing bool
}

type entry struct {
	Member
	suspectDeadline time.Time // when State is Suspect
	// guessed: Add made the record up and no claim about the member has
	// come since, so there is nothing to hold against a verdict of Dead.
	guessed bool
}

// bcast is an update waiting to be piggybacked. There is at most one per
// member: a newer update replaces the older, which nobody needs any more.
type bcast struct {
	u         Update
	from      string // who told us; sending it back to them is wasted
	transmits int
	seq       uint64 // enqueue order; newer first among equally-sent
}

// New returns a List for the node self. self.ID must not be empty;
// self.Incarnation should exceed anything this node ever claimed before
// (statd passes its start time in Unix milliseconds, so a restarted node
// outranks every old claim about it without persisting anything); self's
// State and Since are ignored. A nil clk means SystemClock, a nil rnd a
// randomly seeded one, a nil log discards. tr may be nil if Run is never
// called (for instance when a caller drives the protocol itself).
func New(self Member, cfg Config, tr Transport, clk Clock, rnd *rand.Rand, log *slog.Logger) *List {
	if self.ID == "" {
		panic("member: New with an empty self ID")
	}
	if clk == nil {
		clk = SystemClock()
	}
	if rnd == nil {
		rnd = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := &List{
		cfg:     cfg.withDefaults(),
		tr:      tr,
		clk:     clk,
		log:     log,
		rnd:     rnd,
		selfID:  self.ID,
		members: make(map[string]*entry),
		queue:   make(map[string]*bcast),
	}
	me := &entry{Member: Member{ID: self.ID, Addr: self.Addr, Incarnation: self.Incarnation, State: Alive, Since: clk.Now()}}
	l.insertLocked(me)
	// Announce ourselves: a restarted node must outrank its old Dead record
	// everywhere, not only on the nodes it happens to ping.
	l.enqueueLocked(me.Update(), "")
	return l
}

// Add makes a member known from outside the protocol (statd's node
// documents, a join address). An unknown member starts Alive at
// incarnation 0, which any real update about it outranks; for a known one
// only a changed address is taken, since its state is the protocol's
// business.
func (l *List) Add(id, addr string) {
	if id == "" || id == l.selfID {
		return
	}
	l.mu.Lock()
	if e := l.members[id]; e != nil {
		if addr != "" && e.Addr != addr {
			e.Addr = addr
			l.changedLocked(e)
		}
	} else {
		e := &entry{Member: Member{ID: id, Addr: addr, State: Alive, Since: l.clk.Now()}, guessed: true}
		l.insertLocked(e)
		l.changedLocked(e)
	}
	l.mu.Unlock()
	l.flush()
}

// Leave marks this node Left at a new incarnation and queues that for
// dissemination. The caller should keep answering and running the probe
// loop for a few rounds (a couple of seconds) so the news spreads; a node
// that left ignores every later claim about itself.
func (l *List) Leave() {
	l.mu.Lock()
	me := l.members[l.selfID]
	if me.State != Left {
		me.Incarnation++
		me.State = Left
		me.Since = l.clk.Now()
		l.enqueueLocked(me.Update(), "")
		l.changedLocked(me)
		l.log.Info("member: leaving", "incarnation", me.Incarnation)
	}
	l.mu.Unlock()
	l.flush()
}

// Forget drops a Dead or Left member, one that is gone for good (statd
// calls it when the node's document is deleted), so that it is no longer
// probed as Dead forever. It refuses, and returns false for, members that
// are Alive or Suspect and this node itself. A later claim about the
// member brings it back as if new.
func (l *List) Forget(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.members[id]
	if e == nil || id == l.selfID || e.State == Alive || e.State == Suspect {
		return false
	}
	delete(l.members, id)
	delete(l.queue, id)
	if i, ok := slices.BinarySearch(l.ids, id); ok {
		l.ids = slices.Delete(l.ids, i, i+1)
	}
	return true
}

// Apply merges updates learned from any channel (statd piggybacks them on
// its data gossip). Updates that change the table are queued to be passed
// on; updates about this node that contradict it make it refute.
func (l *List) Apply(updates []Update) {
	l.mu.Lock()
	l.receiveLocked("", updates)
	l.mu.Unlock()
	l.flush()
}

// Outgoing returns up to max queued updates to piggyback on a message,
// least-transmitted and then newest first, and counts them as sent. max <= 0
// means Config.MaxPiggyback.
func (l *List) Outgoing(max int) []Update {
	if max <= 0 {
		max = l.cfg.MaxPiggyback
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.outgoingLocked("", nil, max)
}

// Snapshot returns the whole table as updates. Exchanging snapshots when a
// node joins (memberlist's push-pull, over whatever channel statd uses)
// teaches the newcomer current incarnations at once instead of by gossip.
func (l *List) Snapshot() []Update {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Update, 0, len(l.ids))
	for _, id := range l.ids {
		out = append(out, l.members[id].Update())
	}
	return out
}

// Members returns every known member, this node included, sorted by ID.
func (l *List) Members() []Member {
	return l.filter(func(*entry) bool { return true })
}

// Alive returns the members whose state is Alive, this node included
// unless it left, sorted by ID.
func (l *List) Alive() []Member {
	return l.filter(func(e *entry) bool { return e.State == Alive })
}

func (l *List) filter(keep func(*entry) bool) []Member {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Member, 0, len(l.ids))
	for _, id := range l.ids {
		if e := l.members[id]; keep(e) {
			out = append(out, e.Member)
		}
	}
	return out
}

// Member returns what this node believes about id.
func (l *List) Member(id string) (Member, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.members[id]; e != nil {
		return e.Member, true
	}
	return Member{}, false
}

// Self returns this node's own record.
func (l *List) Self() Member {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.members[l.selfID].Member
}

// Stats returns the event counters.
func (l *List) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stats
}

// OnChange registers fn to receive a member's new record each time its
// state, incarnation or address changes, this node included. Calls are made
// one at a time, in the order of the changes, without the List's lock held
// (so fn may call the List), on whichever goroutine made or is already
// delivering a change; fn must not block for long.
func (l *List) OnChange(fn func(Member)) {
	l.mu.Lock()
	l.subs = append(l.subs, fn)
	l.mu.Unlock()
}

func (l *List) insertLocked(e *entry) {
	l.members[e.ID] = e
	i, _ := slices.BinarySearch(l.ids, e.ID)
	l.ids = slices.Insert(l.ids, i, e.ID)
	if e.ID != l.selfID && l.order != nil {
		// A newcomer joins the current pass at a random place, as in
		// memberlist, rather than waiting up to a whole pass (N rounds).
		p := l.orderPos + l.rnd.IntN(len(l.order)-l.orderPos+1)
		l.order = slices.Insert(l.order, p, e.ID)
	}
}

// receiveLocked applies updates that from sent, and returns the IDs of
// the members about which from is behind: the reply should carry our
// records of them. Without this, a node that missed an update (gossip
// retransmission is finite) could stay wrong until the next change; with
// it, stale news is corrected wherever it is repeated.
func (l *List) receiveLocked(from string, updates []Update) (behind []string) {
	now := l.clk.Now()
	for _, u := range updates {
		if l.applyLocked(u, from, now) {
			continue
		}
		if e := l.members[u.ID]; e != nil && e.Update().Supersedes(u) {
			behind = append(behind, u.ID)
		}
	}
	return behind
}

// applyLocked merges one update and reports whether it changed the table.
func (l *List) applyLocked(u Update, from string, now time.Time) bool {
	if u.ID == "" || u.State > Left {
		l.stats.UpdatesIgnored++
		return false
	}
	if u.ID == l.selfID {
		return l.applySelfLocked(u)
	}
	e := l.members[u.ID]
	if e != nil && !e.guessed && u.State == Dead && (e.State == Alive || e.State == Suspect) {
		// Only this node's own suspicion timer kills a member it holds
		// alive; another's verdict is a suspicion here (see the package
		// doc, "Partitions and returning nodes"). A suspicion already
		// running goes on to its own end.
		u.State = Suspect
	}
	return l.setLocked(e, u, from, now)
}

// setLocked makes u, if it supersedes it, the record of e (a new member if
// e is nil) and reports whether the table changed.
func (l *List) setLocked(e *entry, u Update, from string, now time.Time) bool {
	if e == nil {
		e = &entry{Member: Member{ID: u.ID, Addr: u.Addr, Incarnation: u.Incarnation, State: u.State, Since: now}}
		l.insertLocked(e)
	} else {
		if !u.Supersedes(e.Update()) {
			l.stats.UpdatesIgnored++
			return false
		}
		if u.State != e.State {
			e.Since = now
		}
		e.Incarnation, e.State, e.guessed = u.Incarnation, u.State, false
		if u.Addr != "" {
			e.Addr = u.Addr
		}
	}
	if e.State == Suspect {
		// Each node times a suspicion from when it heard of it; the suspect
		// then has the same grace everywhere to hear of it and refute.
		e.suspectDeadline = now.Add(l.cfg.SuspicionTimeout)
	}
	l.stats.UpdatesApplied++
	l.enqueueLocked(e.Update(), from)
	l.changedLocked(e)
	return true
}

// applySelfLocked handles a claim about this node. Nobody else may decide
// our state: any claim that we are not alive at our incarnation or above is
// refuted by moving above it. The resulting incarnation is the maximum of
// ours, every Alive claim, and every other claim plus one, which does not
// depend on the order the claims arrive in.
func (l *List) applySelfLocked(u Update) bool {
	me := l.members[l.selfID]
	if me.State == Left {
		// Leaving is final; the claim can only be older news.
		l.stats.UpdatesIgnored++
		return false
	}
	inc := me.Incarnation
	switch {
	case u.State == Alive && u.Incarnation > inc:
		inc = u.Incarnation
	case u.State != Alive && u.Incarnation >= inc && u.Incarnation < math.MaxUint64:
		inc = u.Incarnation + 1
		l.stats.Refutations++
		l.log.Info("member: refuting", "claim", u.State.String(), "incarnation", u.Incarnation)
	}
	if inc == me.Incarnation {
		l.stats.UpdatesIgnored++
		return false
	}
	me.Incarnation = inc
	l.stats.UpdatesApplied++
	l.enqueueLocked(me.Update(), "")
	l.changedLocked(me)
	return true
}

func (l *List) enqueueLocked(u Update, from string) {
	l.bseq++
	l.queue[u.ID] = &bcast{u: u, from: from, seq: l.bseq}
}

// retransmitLimit is memberlist's: enough sends that an epidemic reaches
// every node with high probability, growing with log N.
func (l *List) retransmitLimit() int {
	scale := int(math.Ceil(math.Log10(float64(len(l.members) + 1))))
	return l.cfg.RetransmitMult * max(scale, 1)
}

// outgoingLocked appends up to max queued updates to carried, the records
// a message to the member to already holds. A queued update counts as sent
// when it goes out or when carried holds the same member's record, except
// that nothing counts that to cannot pass on: news about to itself (it
// knows better, or carried has what it needs to refute) or news that to
// told us. Those stay queued for others, so every transmission can reach
// a node that does not yet know.
func (l *List) outgoingLocked(to string, carried []Update, max int) []Update {
	if len(l.queue) == 0 {
		return carried
	}
	bs := make([]*bcast, 0, len(l.queue))
	for _, b := range l.queue {
		if to == "" || (b.u.ID != to && b.from != to) {
			bs = append(bs, b)
		}
	}
	slices.SortFunc(bs, func(a, b *bcast) int {
		if c := cmp.Compare(a.transmits, b.transmits); c != 0 {
			return c
		}
		return cmp.Compare(b.seq, a.seq)
	})
	limit := l.retransmitLimit()
	out := carried
	taken := 0
	for _, b := range bs {
		if !slices.ContainsFunc(carried, func(c Update) bool { return c.ID == b.u.ID }) {
			if taken >= max {
				continue
			}
			taken++
			out = append(out, b.u)
		}
		b.transmits++
		if b.transmits >= limit {
			delete(l.queue, b.u.ID)
		}
	}
	return out
}

// messageLocked builds the piggyback for a message to the member to. It
// carries our own record first (it introduces us and carries any
// refutation); then to's record if we do not think it alive, so that a
// suspected, dead or forgotten node learns it at the first contact and
// refutes at once instead of waiting for gossip; then our records of the
// members in behind (see receiveLocked); then the queue.
func (l *List) messageLocked(to string, behind []string) []Update {
	carried := make([]Update, 0, l.cfg.MaxPiggyback+2+len(behind))
	carried = append(carried, l.members[l.selfID].Update())
	if e := l.members[to]; e != nil && to != l.selfID && e.State != Alive {
		carried = append(carried, e.Update())
	}
	for _, id := range behind {
		if !slices.ContainsFunc(carried, func(c Update) bool { return c.ID == id }) {
			carried = append(carried, l.members[id].Update())
		}
	}
	return l.outgoingLocked(to, carried, max(l.cfg.MaxPiggyback-len(carried), 0))
}

func (l *List) changedLocked(e *entry) {
	if len(l.subs) > 0 {
		l.pending = append(l.pending, e.Member)
	}
}

// flush delivers pending change notifications. Only one goroutine delivers
// at a time, draining changes others queue meanwhile, so subscribers see
// changes in table order and may call back into the List.
func (l *List) flush() {
	l.mu.Lock()
	if l.flushing {
		l.mu.Unlock()
		return
	}
	l.flushing = true
	for len(l.pending) > 0 {
		evs, subs := l.pending, l.subs
		l.pending = nil
		l.mu.Unlock()
		for _, m := range evs {
			for _, fn := range subs {
				fn(m)
			}
		}
		l.mu.Lock()
	}
	l.flushing = false
	l.mu.Unlock()
}
