package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"
)

// vold hands a volume's leadership to the node that proposes most of its
// writes (raftgroup Config.FollowProposers): after a run through the
// follower's mount the leadership is likely on the follower's node. So
// before every volume run the leader's node of the phase writes through
// its mount until it leads again (lead), and the rows keep their meaning:
// a run through the leader's mount starts, and one through the
// follower's mount starts, with the phase's leader leading.

// leadWait bounds lead's writes.
const leadWait = 20 * time.Second

// leadership is what lead and the runs found of where the volume's
// leader was.
type leadership struct {
	waits  []time.Duration // lead's writes before each volume run
	failed int             // runs lead gave up before (leader still elsewhere)
	// followerRuns counts the runs through the follower's mount, moved
	// those of them that ended with the follower's node leading.
	followerRuns, moved int
}

// leaderNode is the node that leads the bench volume now (0 if unknown).
// It inspects the volume without the members' digests (each would hash
// a replica's whole filesystem: around a run of 64 MiB written, that
// cost the three volds more CPU than the run's last megabytes, and lead
// asks every 100 ms).
func (b *bench) leaderNode(ctx context.Context) int { return b.leaderSeenBy(ctx, 1) }

// leaderSeenBy is the bench volume's leader as node i's vold sees it.
func (b *bench) leaderSeenBy(ctx context.Context, i int) int {
	v, err := b.inspect(ctx, i, benchVol)
	if err != nil {
		return 0
	}
	return b.nodeOf(v.GetLeader())
}

// lead writes 4 KiB O_DSYNC blocks through node's mount at dir until node
// leads the bench volume, for leadWait at most, and records how long it
// wrote (0 when node led already).
func (b *bench) lead(ctx context.Context, l *leadership, node int, dir string) {
	if b.leaderNode(ctx) == node {
		l.waits = append(l.waits, 0)
		return
	}
	t0 := time.Now()
	path := filepath.Join(dir, "lead.dat")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|syscall.O_DSYNC, 0o644)
	if err != nil {
		fail("lead: %v", err)
	}
	blk := make([]byte, block)
	ok, check := false, t0
	for !ok && time.Since(t0) < leadWait && ctx.Err() == nil {
		if _, err := f.WriteAt(blk, 0); err != nil {
			fail("lead: write through node %d's mount: %v", node, err)
		}
		if time.Since(check) >= 100*time.Millisecond {
			check = time.Now()
			ok = b.leaderNode(ctx) == node
		}
	}
	f.Close()
	if err := os.Remove(path); err != nil {
		fail("lead: %v", err)
	}
	d := time.Since(t0)
	l.waits = append(l.waits, d)
	if !ok {
		l.failed++
		progress("  node %d still does not lead the volume after %v of writes through its mount", node, d.Round(time.Millisecond))
	} else {
		progress("  node %d leads the volume again after %v of writes through its mount", node, d.Round(time.Millisecond))
	}
}

// ranOnFollower records a run through the follower's mount on node,
// which did not lead at its start, and whether it leads now.
func (b *bench) ranOnFollower(ctx context.Context, l *leadership, node int) {
	l.followerRuns++
	if b.leaderNode(ctx) == node {
		l.moved++
		progress("  leadership moved to node %d during the run", node)
	}
}

// note says how the leadership moved in a phase whose follower's mount
// was on node follower.
func (l leadership) note(follower int) string {
	if len(l.waits) == 0 {
		return ""
	}
	var took []time.Duration
	for _, d := range l.waits {
		if d > 0 {
			took = append(took, d)
		}
	}
	s := fmt.Sprintf("vold hands a volume's leadership to the node whose replica proposes most of its writes (judged over 300 ms windows, at most once per 600 ms of a leader's term; a bulk writer's 8 writes and 4 MiB move it from 100 ms into a term; raftgroup `FollowProposers`), so before every volume run the phase's leader takes it back if need be, writing 4 KiB blocks through its mount: it had to before %d of the %d volume runs", len(took), len(l.waits))
	if len(took) > 0 {
		s += fmt.Sprintf(", for %s (median; longest %s)", dur(medianDur(took)), dur(slices.Max(took)))
	}
	if l.failed > 0 {
		s += fmt.Sprintf(", and in %d runs it did not lead after %v", l.failed, leadWait)
	}
	if l.followerRuns > 0 {
		s += fmt.Sprintf("; %d of the %d runs through node %d's mount (%s) ended with that node leading", l.moved, l.followerRuns, follower, rowFollower)
	}
	return s + "."
}
