package main

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The leader's vold restarted under writes: stopped as systemd stops it
// (SIGTERM; vold hands the leadership of its groups to other replicas
// first) or killed (SIGKILL: the followers wait an election timeout), then
// started again, while a writer appends through a follower's mount.

const (
	restartStop = "stop"
	restartKill = "kill"
)

type rsResult struct {
	how            string
	leader, writer int
	// stall is the longest time between two acknowledgements from the
	// signal until 300 ms after vold serves again; down the Stop or Kill
	// call (until vold exited), up the Start call (until it serves).
	stall, down, up time.Duration
	failed          int
	// handedOff is the groups the stopped vold said it handed off, -1
	// when killed or not said.
	handedOff int
}

var handedOffRE = regexp.MustCompile(`msg="leadership handed off".* groups=(\d+)`)

// handedOff returns the groups of the last hand-off in node's vold log
// after offset off, or -1.
func (b *bench) handedOff(node int, off int) int {
	data, err := os.ReadFile(b.cl.LogPath(node, "vold"))
	if err != nil || len(data) < off {
		return -1
	}
	ms := handedOffRE.FindAllStringSubmatch(string(data[off:]), -1)
	if len(ms) == 0 {
		return -1
	}
	n, _ := strconv.Atoi(ms[len(ms)-1][1])
	return n
}

func (b *bench) logSize(node int) int {
	st, err := os.Stat(b.cl.LogPath(node, "vold"))
	if err != nil {
		return 0
	}
	return int(st.Size())
}

// restartCycle restarts the leader's vold (how: restartStop or
// restartKill) under a writer on a follower's node.
func (b *bench) restartCycle(ctx context.Context, k int, how string) rsResult {
	c := b.c
	for attempt := 0; ; attempt++ {
		if attempt == 10 {
			fail("restart cycle %d: the leadership kept moving before the %s", k+1, how)
		}
		check(b.waitHealthy(ctx, 1+k%nodes, benchVol, c.timeout))
		sleep(ctx, c.settle)
		leader, writer, err := b.leaderAndFollower(ctx, benchVol)
		check(err)
		r := rsResult{how: how, leader: leader, writer: writer, handedOff: -1}
		user := fmt.Sprintf("bench-restart-%d-%s-%d", k, how, attempt)
		a, stopWriter := b.writeThrough(ctx, writer, user, "restart.log")
		// The leader's own view: it knows at once when it handed the
		// leadership to the writer's node (raftgroup FollowProposers),
		// which another node learns a heartbeat later.
		if now := b.leaderSeenBy(ctx, leader); now != leader {
			progress("  the leadership moved from node %d to node %d before the %s: starting the cycle again", leader, now, how)
			stopWriter()
			b.unmount(ctx, writer, benchVol, user)
			continue
		}
		off := b.logSize(leader)
		t0 := time.Now()
		switch how {
		case restartStop:
			check(b.cl.Stop(ctx, leader, "vold", c.timeout))
		case restartKill:
			check(b.cl.Kill(ctx, leader, "vold"))
		}
		r.down = time.Since(t0)
		t1 := time.Now()
		check(b.cl.Start(ctx, leader, "vold"))
		r.up = time.Since(t1)
		b.openClients(leader)
		// Writes acknowledged for a while after vold is back, so that the
		// gap is judged over the whole restart.
		t2 := time.Now()
		for deadline := t2.Add(c.timeout); ; {
			if _, ok := a.after(t2); ok {
				break
			}
			if time.Now().After(deadline) {
				progress("  no write acknowledged %v after node %d's vold was back", c.timeout, leader)
				break
			}
			sleep(ctx, 5*time.Millisecond)
		}
		sleep(ctx, 300*time.Millisecond)
		stopWriter()
		r.stall, r.failed = a.stall(t0), a.failed
		b.unmount(ctx, writer, benchVol, user)
		if how == restartStop {
			r.handedOff = b.handedOff(leader, off)
			if r.handedOff == 0 {
				// The leadership moved between the check above and the
				// signal: nothing was handed off, and nothing measured.
				progress("  node %d's vold led no group when stopped: starting the cycle again", leader)
				continue
			}
		} else if r.stall < noFailover {
			progress("  the writes went on through the kill (longest gap %s): node %d no longer led; starting the cycle again", dur(r.stall), leader)
			continue
		}
		progress("  %s of node %d's vold (leader), writer on node %d: longest gap %s (%s took %s, start %s)", how, leader, writer, dur(r.stall), how, dur(r.down), dur(r.up))
		return r
	}
}

func (r *results) printRestarts(c config) {
	if len(r.rs) == 0 {
		return
	}
	fmt.Printf("### The leader's vold restarted under writes\n\n")
	fmt.Printf("A writer on the host appends 10-byte lines, one `write` at a time, through the volume's mount on a follower's node, as in the failover phase; once it has made 20 writes, the leader's vold alone is restarted, its node's statd left running: *stop* is devcluster Stop (SIGTERM, as `systemctl stop` sends; vold first hands the leadership of the groups it leads to other replicas, raftgroup `HandOff`, and says how many it handed off), *kill* is devcluster Kill (SIGKILL: the followers elect a new leader once an election timeout, 10–20 ticks of 100 ms, has passed without one). vold is then started again (devcluster Start, until it serves). *Longest gap* is the longest time between two consecutive acknowledgements from the signal until 300 ms after vold serves again. A cycle whose vold turned out not to lead at the signal (the leadership had moved to the writer's node: a stopped vold that handed nothing off, or a kill the writes did not notice) is run again. Each cycle starts with the volume healthy and %v of quiet.\n\n", c.settle)
	fmt.Printf("| cycle | how | leader | writer | groups handed off | stop or kill took | start took | **longest gap** | failed writes |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|\n")
	gaps := map[string][]time.Duration{}
	for k, x := range r.rs {
		h := "–"
		if x.handedOff >= 0 {
			h = strconv.Itoa(x.handedOff)
		}
		fmt.Printf("| %d | %s | %d | %d | %s | %s | %s | %s | %d |\n", k+1, x.how, x.leader, x.writer, h, dur(x.down), dur(x.up), dur(x.stall), x.failed)
		gaps[x.how] = append(gaps[x.how], x.stall)
	}
	var parts []string
	for _, how := range []string{restartStop, restartKill} {
		if g := gaps[how]; len(g) > 0 {
			parts = append(parts, fmt.Sprintf("%s median %s, worst %s", how, dur(medianDur(g)), dur(slices.Max(g))))
		}
	}
	fmt.Printf("\nLongest gap: %s", strings.Join(parts, "; "))
	if s, k := gaps[restartStop], gaps[restartKill]; len(s) > 0 && len(k) > 0 {
		fmt.Printf(" (stop / kill: %.2f× of the medians)", medianDur(s).Seconds()/medianDur(k).Seconds())
	}
	fmt.Printf(". Meanwhile %s.\n\n", r.rsLoad)
}
