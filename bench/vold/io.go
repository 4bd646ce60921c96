package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/shoal-dev/shoal/bench/internal/cpuacct"
)

// target is where one row of the write measurements writes: the local
// filesystem, or a volume's mount on some node. writers > 1 runs that many
// writers at once, each on its own file: the local filesystem with three
// is what the one disk gives each of a volume's three replicas when they
// all write, the ceiling of a volume on this machine.
type target struct {
	label   string
	dir     string
	writers int
	// total: the row's IOPS are those of all its writers together.
	total bool
	// profile names the -profile files of the target's first random
	// write run ("" for none).
	profile string
	// node is the node whose mount the target is (0: the local
	// filesystem).
	node int
}

type seqResult struct {
	leader, follower int
	rows             []string // labels, in table order
	mbps             map[string][]float64
	cpu              map[string][]time.Duration // CPU time of each run (see runCPU)
	// sentPerMiB is what the three volds sent each other in Raft
	// batches during each round of a volume row, per MiB written;
	// transfers and snapshots the leadership transfers they made and the
	// snapshots they took in the row's rounds.
	sentPerMiB           map[string][]float64
	transfers, snapshots map[string]uint64
	load                 phaseLoad
	led                  leadership
}

type randRow struct {
	lat     []time.Duration // of every writer
	elapsed time.Duration
	errs    int
	cpu     time.Duration // see runCPU
	writers int           // 0 means 1
	total   bool          // IOPS of all writers together, not per writer
	// syncs and rounds are the journal syncs and Raft rounds of the
	// three volds together per write (volume rows; from their metrics).
	syncs, rounds float64
	// snapshots is how many snapshots the three volds took during the
	// run (see snapshotNote).
	snapshots uint64
	// syncTime is each node's synced journal writes during the run,
	// mutateTime the filesystem mutations of the mount's node (volume
	// rows; see timeNote).
	syncTime   []hist
	mutateTime hist
}

// cpuPerWrite is the run's CPU time (see runCPU) per acknowledged write.
func (r randRow) cpuPerWrite() time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	return r.cpu / time.Duration(len(r.lat))
}

// iops is the rate of one writer (the mean of several), or of all of
// them together for a total row.
func (r randRow) iops() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	n := float64(len(r.lat))
	if !r.total {
		n /= float64(max(r.writers, 1))
	}
	return n / r.elapsed.Seconds()
}

type randResult struct {
	leader, follower int
	rows             []string
	runs             map[string][]randRow
	load             phaseLoad
	led              leadership
}

const (
	rowLocal    = "local filesystem"
	rowLocal3   = "local filesystem, three writers at once (each)"
	rowLeader   = "volume, mounted on the leader's node"
	rowFollower = "volume, mounted on a follower's node"
	// The several-writer rows of the random writes (-rand-writers): the
	// rate of concurrent synchronous writers, which a volume's leader
	// commits together (one journal sync and one message per follower for
	// whatever is pending), against the same number on the local disk.
	rowLocalMany  = "local filesystem, several writers at once (total)"
	rowLeaderMany = "volume on the leader's node, several writers at once (total)"
)

// localWriters is the writer count of rowLocal3: one per replica.
const localWriters = 3

// mountTargets mounts the bench volume on its leader's and a follower's
// node and returns the three targets (local first) and the two nodes.
func (b *bench) mountTargets(ctx context.Context, user string) ([]target, int, int) {
	leader, follower, err := b.leaderAndFollower(ctx, benchVol)
	check(err)
	lp, err := b.mount(ctx, leader, benchVol, user)
	check(err)
	fp, err := b.mount(ctx, follower, benchVol, user)
	check(err)
	return []target{{label: rowLocal, dir: b.local, writers: 1}, {label: rowLocal3, dir: b.local, writers: localWriters}, {label: rowLeader, dir: lp, writers: 1, profile: "leader", node: leader}, {label: rowFollower, dir: fp, writers: 1, profile: "follower", node: follower}}, leader, follower
}

// sequential writes c.seqMiB MiB in 1 MiB writes, then fsyncs, to each
// target in turn, c.reps times (the order rotating so that no target
// always goes first).
func (b *bench) sequential(ctx context.Context) seqResult {
	c := b.c
	targets, leader, follower := b.mountTargets(ctx, "bench-seq")
	defer func() {
		b.unmount(ctx, leader, benchVol, "bench-seq")
		b.unmount(ctx, follower, benchVol, "bench-seq")
	}()
	r := seqResult{leader: leader, follower: follower, mbps: map[string][]float64{}, cpu: map[string][]time.Duration{}, sentPerMiB: map[string][]float64{}, transfers: map[string]uint64{}, snapshots: map[string]uint64{}}
	for _, t := range targets {
		r.rows = append(r.rows, t.label)
	}
	buf := make([]byte, chunk)
	for i := range buf {
		buf[i] = byte(b.rng.Uint32())
	}
	size := int64(c.seqMiB) << 20
	b.waitQuiet(ctx)
	profiled := b.startProfiles(ctx, "seq", c.profileFor)
	defer profiled()
	l0 := b.acct.Take()
	for rep := range c.reps {
		for k := range targets {
			t := targets[(k+rep)%len(targets)]
			if ctx.Err() != nil {
				fail("%v", ctx.Err())
			}
			paths := make([]string, t.writers)
			for w := range paths {
				paths[w] = filepath.Join(t.dir, fmt.Sprintf("seq-%d-%d.dat", rep, w))
			}
			var m0 []raftCounters
			if t.dir != b.local {
				b.lead(ctx, &r.led, leader, targets[2].dir)
				m0 = b.raftCounters(ctx)
			}
			a := b.acct.Take()
			d, err := together(t.writers, func(w int) (time.Duration, error) { return seqWrite(paths[w], buf, size) })
			// Taken before the counters and the leadership are asked for,
			// which cost the volds CPU of their own.
			aEnd := b.acct.Take()
			if err != nil {
				fail("sequential write to %s: %v", t.label, err)
			}
			if m0 != nil {
				var sent uint64
				for i, m := range b.raftCounters(ctx) {
					sent += m.sent - m0[i].sent
					r.transfers[t.label] += m.transfers - m0[i].transfers
					r.snapshots[t.label] += m.snapshots - m0[i].snapshots
				}
				r.sentPerMiB[t.label] = append(r.sentPerMiB[t.label], float64(sent)/float64(size))
			}
			if t.label == rowFollower {
				b.ranOnFollower(ctx, &r.led, t.node)
			}
			// CPU per MiB written, MB/s per writer.
			cpu := cpuacct.Phase{A: a, B: aEnd}.OursTime() / time.Duration(t.writers)
			mbps := float64(size) / d.Seconds() / 1e6
			r.mbps[t.label] = append(r.mbps[t.label], mbps)
			r.cpu[t.label] = append(r.cpu[t.label], cpu)
			progress("  %s: %.1f MB/s (%v), CPU %v per MiB", t.label, mbps, d.Round(time.Millisecond), (cpu / time.Duration(c.seqMiB)).Round(10*time.Microsecond))
			for _, path := range paths {
				if err := os.Remove(path); err != nil {
					fail("remove %s: %v", path, err)
				}
			}
		}
	}
	r.load = phaseLoad{cpuacct.Phase{A: l0, B: b.acct.Take()}}
	return r
}

// together runs fn for n writers at once and returns the longest time one
// took, or the first error.
func together(n int, fn func(w int) (time.Duration, error)) (time.Duration, error) {
	ds := make([]time.Duration, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for w := range n {
		wg.Add(1)
		go func() { defer wg.Done(); ds[w], errs[w] = fn(w) }()
	}
	wg.Wait()
	return slices.Max(ds), errors.Join(errs...)
}

// seqWrite creates path, writes size bytes of buf in len(buf) writes,
// fsyncs and closes it, and returns the time all that took.
func seqWrite(path string, buf []byte, size int64) (time.Duration, error) {
	t0 := time.Now()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return 0, err
	}
	for off := int64(0); off < size; off += int64(len(buf)) {
		if _, err := f.Write(buf[:min(int64(len(buf)), size-off)]); err != nil {
			f.Close()
			return 0, err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return 0, err
	}
	if err := f.Close(); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

// random writes 4 KiB blocks at random aligned offsets of a preallocated
// file with O_DSYNC, one at a time, for c.randDur per target and rep.
//
// full adds the several-writer rows and the -profile captures; the
// second pass (haltpoll.go) leaves them out.
func (b *bench) random(ctx context.Context, full bool) randResult {
	c := b.c
	if !full {
		c.randWriters = 0
	}
	targets, leader, follower := b.mountTargets(ctx, "bench-rand")
	defer func() {
		b.unmount(ctx, leader, benchVol, "bench-rand")
		b.unmount(ctx, follower, benchVol, "bench-rand")
	}()
	if n := c.randWriters; n > 1 {
		targets = append(targets, target{label: rowLocalMany, dir: b.local, writers: n, total: true}, target{label: rowLeaderMany, dir: targets[2].dir, writers: n, total: true, node: leader, profile: "leader-many"})
	}
	r := randResult{leader: leader, follower: follower, runs: map[string][]randRow{}}
	for _, t := range targets {
		r.rows = append(r.rows, t.label)
	}
	size := int64(c.randMiB) << 20
	buf := make([]byte, chunk)
	for i := range buf {
		buf[i] = byte(b.rng.Uint32())
	}
	// Files on the local filesystem (one per writer of the three-writer
	// row, the first also the one-writer row's), one in the volume (both
	// mounts see the same file).
	files := map[string][]string{}
	var made []string
	for w := range max(localWriters, c.randWriters) {
		path := filepath.Join(b.local, fmt.Sprintf("rand-%d.dat", w))
		files[rowLocalMany] = append(files[rowLocalMany], path)
		made = append(made, path)
	}
	files[rowLocal3] = files[rowLocalMany][:localWriters]
	files[rowLocal] = files[rowLocalMany][:1]
	files[rowLeader] = []string{filepath.Join(targets[2].dir, "rand.dat")}
	files[rowFollower] = []string{filepath.Join(targets[3].dir, "rand.dat")}
	made = append(made, files[rowLeader][0])
	for w := range c.randWriters {
		if c.randWriters < 2 {
			break // no several-writer rows
		}
		path := filepath.Join(targets[2].dir, fmt.Sprintf("rand-%d.dat", w))
		files[rowLeaderMany] = append(files[rowLeaderMany], path)
		made = append(made, path)
	}
	for _, path := range made {
		if _, err := seqWrite(path, buf, size); err != nil {
			fail("preallocate %s: %v", path, err)
		}
	}
	b.waitQuiet(ctx)
	l0 := b.acct.Take()
	for rep := range c.reps {
		for k := range targets {
			t := targets[(k+rep)%len(targets)]
			if ctx.Err() != nil {
				fail("%v", ctx.Err())
			}
			var m0 []raftCounters
			if t.dir != b.local {
				b.lead(ctx, &r.led, leader, targets[2].dir)
				m0 = b.raftCounters(ctx)
			}
			runProfiled := func() {}
			if rep == 0 && t.profile != "" && full {
				// Of one mount's run, not of the phase: a profile that
				// mixed the targets would hide which mount costs what.
				runProfiled = b.startProfiles(ctx, "rand-"+t.profile, c.randDur)
			}
			a := b.acct.Take()
			rows := make([]randRow, t.writers)
			seeds := make([]uint64, t.writers)
			for w := range seeds {
				seeds[w] = b.rng.Uint64()
			}
			_, err := together(t.writers, func(w int) (time.Duration, error) {
				rng := rand.New(rand.NewPCG(seeds[w], 1))
				var err error
				rows[w], err = randWrite(files[t.label][w], buf[:block], size, c.randDur, rng.Int64N)
				return 0, err
			})
			aEnd := b.acct.Take()
			runProfiled()
			if err != nil {
				fail("random writes to %s: %v", t.label, err)
			}
			if t.label == rowFollower {
				b.ranOnFollower(ctx, &r.led, t.node)
			}
			// One row for all writers: IOPS per writer, CPU per write.
			row := rows[0]
			for _, x := range rows[1:] {
				row.lat = append(row.lat, x.lat...)
				row.errs += x.errs
				row.elapsed = max(row.elapsed, x.elapsed)
			}
			row.writers, row.total = t.writers, t.total
			row.cpu = cpuacct.Phase{A: a, B: aEnd}.OursTime()
			var byNode []string
			if m0 != nil && len(row.lat) > 0 {
				m1 := b.raftCounters(ctx)
				row.mutateTime = m1[t.node-1].mutateTime.minus(m0[t.node-1].mutateTime)
				for i := range m1 {
					row.syncTime = append(row.syncTime, m1[i].syncTime.minus(m0[i].syncTime))
					s := float64(m1[i].syncs-m0[i].syncs) / float64(len(row.lat))
					r := float64(m1[i].rounds-m0[i].rounds) / float64(len(row.lat))
					row.syncs += s
					row.rounds += r
					row.snapshots += m1[i].snapshots - m0[i].snapshots
					byNode = append(byNode, fmt.Sprintf("%.2f/%.2f", s, r))
				}
			}
			r.runs[t.label] = append(r.runs[t.label], row)
			times := ""
			if row.syncTime != nil {
				var syncP50 []string
				for _, h := range row.syncTime {
					syncP50 = append(syncP50, dur(h.quantile(0.5)))
				}
				times = fmt.Sprintf("; node %d's vold answered its mutations in %s, journal syncs took %s (p50s; node 1/2/3)", t.node, dur(row.mutateTime.quantile(0.5)), strings.Join(syncP50, " / "))
			}
			progress("  %s: %.0f IOPS, p50 %s, p99 %s, CPU %s per write, %.2f journal syncs and %.2f Raft rounds per write (node 1/2/3: %s), %d snapshots taken%s", t.label, row.iops(), dur(pctl(row.lat, 0.5)), dur(pctl(row.lat, 0.99)), dur(row.cpuPerWrite()), row.syncs, row.rounds, strings.Join(byNode, ", "), row.snapshots, times)
		}
	}
	r.load = phaseLoad{cpuacct.Phase{A: l0, B: b.acct.Take()}}
	for _, p := range made {
		if err := os.Remove(p); err != nil {
			fail("remove %s: %v", p, err)
		}
	}
	return r
}

// randWrite opens path with O_DSYNC and writes blk at random multiples of
// its size below size, one at a time, for d.
func randWrite(path string, blk []byte, size int64, d time.Duration, rnd func(int64) int64) (randRow, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_DSYNC, 0)
	if err != nil {
		return randRow{}, err
	}
	defer f.Close()
	var row randRow
	blocks := size / int64(len(blk))
	t0 := time.Now()
	for time.Since(t0) < d {
		off := rnd(blocks) * int64(len(blk))
		s := time.Now()
		if _, err := f.WriteAt(blk, off); err != nil {
			row.errs++
			if row.errs > 10 {
				return row, err
			}
			continue
		}
		row.lat = append(row.lat, time.Since(s))
	}
	row.elapsed = time.Since(t0)
	return row, nil
}
