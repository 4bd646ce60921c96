package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

type foResult struct {
	leader, writer int
	// recovered: from the kill until the first write begun after the
	// node was gone was acknowledged; stall: the longest time between two
	// acknowledgements from the kill on; killTook: the Kill call (SIGKILL
	// until every process of the node is gone).
	recovered, stall, killTook time.Duration
	ok                         bool
	failed                     int // writes that returned an error meanwhile
	newLeader                  int
	restart                    time.Duration // devcluster Start until the daemons serve
	healthy                    time.Duration // from the restart until every member is alive and caught up
	healthyOK                  bool
}

// ack is one acknowledged append.
type ack struct{ start, end time.Time }

// appender appends small lines to a file through a mount in a loop and
// records every acknowledgement.
type appender struct {
	mu     sync.Mutex
	acks   []ack
	failed int
	stop   atomic.Bool
	done   chan struct{}
}

func startAppender(path string) (*appender, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	a := &appender{done: make(chan struct{})}
	go func() {
		defer close(a.done)
		defer f.Close()
		for k := 0; !a.stop.Load(); k++ {
			line := []byte(fmt.Sprintf("%09d\n", k))
			s := time.Now()
			_, err := f.Write(line)
			e := time.Now()
			a.mu.Lock()
			if err != nil {
				a.failed++
			} else {
				a.acks = append(a.acks, ack{s, e})
			}
			a.mu.Unlock()
			if err != nil {
				time.Sleep(10 * time.Millisecond)
			}
		}
	}()
	return a, nil
}

func (a *appender) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.acks)
}

// after returns the first acknowledgement of a write begun at or after
// t0, and whether there is one.
func (a *appender) after(t0 time.Time) (ack, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := len(a.acks) - 1; i >= 0 && !a.acks[i].start.Before(t0); i-- {
		if i == 0 || a.acks[i-1].start.Before(t0) {
			return a.acks[i], true
		}
	}
	return ack{}, false
}

// stall returns the longest time between consecutive acknowledgements
// (or between t0's last acknowledgement before and the first after) over
// the acknowledgements ending after from.
func (a *appender) stall(from time.Time) time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	var worst time.Duration
	for i := 1; i < len(a.acks); i++ {
		if a.acks[i].end.After(from) {
			worst = max(worst, a.acks[i].end.Sub(a.acks[i-1].end))
		}
	}
	return worst
}

// writeThrough mounts the bench volume on node writer for user, starts an
// appender on file there and returns once it has made 20 writes; stop
// stops it.
func (b *bench) writeThrough(ctx context.Context, writer int, user, file string) (a *appender, stop func()) {
	c := b.c
	dir, err := b.mount(ctx, writer, benchVol, user)
	check(err)
	a, err = startAppender(filepath.Join(dir, file))
	check(err)
	stop = func() {
		a.stop.Store(true)
		select {
		case <-a.done:
		case <-time.After(c.timeout):
			fail("the writer on node %d did not return within %v", writer, c.timeout)
		}
	}
	for deadline := time.Now().Add(c.timeout); a.count() < 20; {
		if time.Now().After(deadline) {
			fail("the writer on node %d made %d writes in %v", writer, a.count(), c.timeout)
		}
		sleep(ctx, 10*time.Millisecond)
	}
	return a, stop
}

func (b *bench) failover(ctx context.Context, k int) foResult {
	c := b.c
	check(b.waitHealthy(ctx, 1+k%nodes, benchVol, c.timeout))
	sleep(ctx, c.settle)
	leader, writer, err := b.leaderAndFollower(ctx, benchVol)
	check(err)
	r := foResult{leader: leader, writer: writer}
	user := fmt.Sprintf("bench-failover-%d", k)
	a, stopWriter := b.writeThrough(ctx, writer, user, "failover.log")
	if now := b.leaderNode(ctx); now != leader {
		// vold moves leadership to the node that proposes most writes: a
		// window may have closed on the writer's first ones.
		progress("  the leadership moved from node %d to node %d before the kill: starting the cycle again", leader, now)
		stopWriter()
		b.unmount(ctx, writer, benchVol, user)
		return b.failover(ctx, k)
	}
	progress("  killing node %d (leader), writer on node %d", leader, writer)
	t0 := time.Now()
	check(b.cl.Kill(ctx, leader, ""))
	// Writes begun before Kill returned may still have reached the old
	// leader: only those begun once the node is gone count.
	tk := time.Now()
	r.killTook = tk.Sub(t0)
	for deadline := t0.Add(c.timeout); ; {
		if x, ok := a.after(tk); ok {
			r.recovered, r.ok = x.end.Sub(t0), true
			break
		}
		if time.Now().After(deadline) {
			progress("  no write acknowledged %v after the kill", c.timeout)
			break
		}
		sleep(ctx, 5*time.Millisecond)
	}
	if r.ok {
		// A few more writes, so that the stall is judged on a steady
		// writer again.
		sleep(ctx, 200*time.Millisecond)
	}
	stopWriter()
	r.stall = a.stall(t0)
	r.failed = a.failed
	progress("  writes acknowledged again %s after the kill (longest gap %s, %d failed writes)", dur(r.recovered), dur(r.stall), r.failed)
	if v, err := b.inspect(ctx, writer, benchVol); err == nil {
		r.newLeader = b.nodeOf(v.GetLeader())
	}
	b.unmount(ctx, writer, benchVol, user)

	t1 := time.Now()
	check(b.cl.Start(ctx, leader, ""))
	r.restart = time.Since(t1)
	b.openClients(leader)
	for deadline := t1.Add(c.timeout); ; {
		v, err := b.inspect(ctx, writer, benchVol)
		if err == nil && v.GetHealth() == "healthy" && settled(v, 0) {
			r.healthy, r.healthyOK = time.Since(t1), true
			break
		}
		if time.Now().After(deadline) {
			progress("  volume not healthy %v after the restart: %v %v", c.timeout, v, err)
			break
		}
		sleep(ctx, 50*time.Millisecond)
	}
	progress("  node %d back: serving after %s, volume healthy after %s", leader, dur(r.restart), dur(r.healthy))
	if r.ok && r.stall < noFailover {
		// The writes never waited for an election: the leadership had
		// moved to the writer's node between the check above and the
		// kill (a window closed on the writer's writes).
		progress("  the writes went on through the kill (longest gap %s): node %d no longer led; starting the cycle again", dur(r.stall), leader)
		return b.failover(ctx, k)
	}
	return r
}

// noFailover is a longest gap between acknowledgements too short for an
// election (vold's followers wait at least an election timeout, 10 ticks
// of 100 ms, before they campaign): a cycle whose writes never stalled
// that long did not kill the leader.
const noFailover = 300 * time.Millisecond
