package member

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Run drives the protocol until ctx ends, then returns nil: a probe round
// every ProbeInterval, ping requests when a direct ping times out,
// suspicion timers, and gossip while there is news. It needs the Transport
// given to New. Run may be stopped and started again, but only one Run may
// be active at a time. HandlePing and HandlePingReq work whether or not
// Run is running.
func (l *List) Run(ctx context.Context) error {
	if l.tr == nil {
		return errors.New("member: Run needs a Transport")
	}
	results := make(chan result)
	var wg sync.WaitGroup
	defer wg.Wait()
	// Each round's messages share a context that the next round cancels.
	var round struct {
		ctx context.Context
		end context.CancelFunc
	}
	round.ctx, round.end = context.WithCancel(ctx)
	defer func() { round.end() }()
	send := func(acts []action) {
		for _, a := range acts {
			rctx := round.ctx
			wg.Go(func() { l.exec(rctx, results, a) })
		}
	}

	// Nodes started together would otherwise probe in lockstep. Probes
	// left by an earlier Run lost their answers with it.
	l.mu.Lock()
	l.probes = l.probes[:0]
	stagger := time.Duration(l.rnd.Int64N(int64(l.cfg.ProbeInterval)))
	l.mu.Unlock()
	tick := l.clk.After(stagger)
	gtick := l.clk.After(l.cfg.GossipInterval)
	var suspTimer <-chan time.Time
	var suspAt time.Time
	for {
		if at, ok := l.nextDeadline(); ok && (suspTimer == nil || at.Before(suspAt)) {
			suspAt = at
			suspTimer = l.clk.After(max(at.Sub(l.clk.Now()), 0))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick:
			// Whatever the last round still waits for is too late now:
			// round() turns missing acks into suspicions.
			round.end()
			round.ctx, round.end = context.WithCancel(ctx)
			send(l.round(l.clk.Now()))
			tick = l.clk.After(l.cfg.ProbeInterval)
		case <-gtick:
			send(l.gossip())
			gtick = l.clk.After(l.cfg.GossipInterval)
		case r := <-results:
			send(l.handle(r))
		case <-suspTimer:
			suspTimer = nil
			l.expire(l.clk.Now())
		}
	}
}

// exec sends one action and reports its result, unless the round ends
// first. A direct ping gets ProbeTimeout; a ping request may take the rest
// of the round, since the via spends up to ProbeTimeout on its own ping.
func (l *List) exec(ctx context.Context, results chan<- result, a action) {
	r := result{probe: a.probe, direct: a.direct(), from: a.via.ID}
	timeout := time.Duration(0)
	call := func(ctx context.Context) answer {
		acked, ups, err := l.tr.PingReq(ctx, a.via, a.target, a.updates)
		return answer{acked && err == nil, ups}
	}
	if a.direct() {
		r.from, timeout = a.target.ID, l.cfg.ProbeTimeout
		call = func(ctx context.Context) answer {
			ups, err := l.tr.Ping(ctx, a.target, a.updates)
			return answer{err == nil, ups}
		}
	}
	if ans, ok := within(l, ctx, timeout, call); ok {
		r.acked, r.updates = ans.acked, ans.ups
	}
	select {
	case results <- r:
	case <-ctx.Done():
	}
}

// HandlePingReq is the receiving side of Transport.PingReq: from asks us to
// ping target. It applies from's updates, pings target with ProbeTimeout,
// and returns whether target acked plus the piggyback for the reply (with
// the same rules as HandlePing).
func (l *List) HandlePingReq(ctx context.Context, from string, target Member, updates []Update) (acked bool, piggyback []Update) {
	msg, behind := l.pingReqStart(from, updates, target)
	var ack answer
	if l.tr != nil {
		ack, _ = within(l, ctx, l.cfg.ProbeTimeout, func(ctx context.Context) answer {
			ups, err := l.tr.Ping(ctx, target, msg)
			return answer{err == nil, ups}
		})
	}
	acked = ack.acked
	return acked, l.pingReqFinish(from, target, behind, acked, ack.ups)
}

// answer is what a Ping or PingReq call brought back.
type answer struct {
	acked bool
	ups   []Update
}

// within runs fn with a context that is cancelled after d on l's clock
// (never if d <= 0) and returns its result, or false if it did not return
// in time; a late fn is left to notice its cancelled context. The deadline
// is not a context deadline because those follow the real clock, not the
// injected one.
func within[T any](l *List, ctx context.Context, d time.Duration, fn func(context.Context) T) (T, bool) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan T, 1)
	go func() { done <- fn(ctx) }()
	var timeout <-chan time.Time
	if d > 0 {
		timeout = l.clk.After(d)
	}
	select {
	case v := <-done:
		return v, true
	case <-timeout:
	case <-ctx.Done():
	}
	var zero T
	return zero, false
}
