package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/shoal-dev/shoal/bench/internal/cpuacct"
)

// target is where one row of the write measurements writes: the local
// filesystem, or a volume's mount on some node.
type target struct {
	label string
	dir   string
}

type seqResult struct {
	leader, follower int
	rows             []string // labels, in table order
	mbps             map[string][]float64
	cpu              map[string][]time.Duration // CPU time of each run (see runCPU)
	load             phaseLoad
}

type randRow struct {
	lat     []time.Duration
	elapsed time.Duration
	errs    int
	cpu     time.Duration // see runCPU
}

// cpuPerWrite is the run's CPU time (see runCPU) per acknowledged write.
func (r randRow) cpuPerWrite() time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	return r.cpu / time.Duration(len(r.lat))
}

func (r randRow) iops() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(len(r.lat)) / r.elapsed.Seconds()
}

type randResult struct {
	leader, follower int
	rows             []string
	runs             map[string][]randRow
	load             phaseLoad
}

const (
	rowLocal    = "local filesystem"
	rowLeader   = "volume, mounted on the leader's node"
	rowFollower = "volume, mounted on a follower's node"
)

// mountTargets mounts the bench volume on its leader's and a follower's
// node and returns the three targets (local first) and the two nodes.
func (b *bench) mountTargets(ctx context.Context, user string) ([]target, int, int) {
	leader, follower, err := b.leaderAndFollower(ctx, benchVol)
	check(err)
	lp, err := b.mount(ctx, leader, benchVol, user)
	check(err)
	fp, err := b.mount(ctx, follower, benchVol, user)
	check(err)
	return []target{{rowLocal, b.local}, {rowLeader, lp}, {rowFollower, fp}}, leader, follower
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
	r := seqResult{leader: leader, follower: follower, mbps: map[string][]float64{}, cpu: map[string][]time.Duration{}}
	for _, t := range targets {
		r.rows = append(r.rows, t.label)
	}
	buf := make([]byte, chunk)
	for i := range buf {
		buf[i] = byte(b.rng.Uint32())
	}
	size := int64(c.seqMiB) << 20
	b.waitQuiet(ctx)
	profiled := b.startProfiles(ctx, "seq")
	defer profiled()
	l0 := b.acct.Take()
	for rep := range c.reps {
		for k := range targets {
			t := targets[(k+rep)%len(targets)]
			if ctx.Err() != nil {
				fail("%v", ctx.Err())
			}
			path := filepath.Join(t.dir, fmt.Sprintf("seq-%d.dat", rep))
			a := b.acct.Take()
			d, err := seqWrite(path, buf, size)
			if err != nil {
				fail("sequential write to %s (%s): %v", t.label, path, err)
			}
			cpu := cpuacct.Phase{A: a, B: b.acct.Take()}.OursTime()
			mbps := float64(size) / d.Seconds() / 1e6
			r.mbps[t.label] = append(r.mbps[t.label], mbps)
			r.cpu[t.label] = append(r.cpu[t.label], cpu)
			progress("  %s: %.1f MB/s (%v), CPU %v per MiB", t.label, mbps, d.Round(time.Millisecond), (cpu / time.Duration(c.seqMiB)).Round(10*time.Microsecond))
			if err := os.Remove(path); err != nil {
				fail("remove %s: %v", path, err)
			}
		}
	}
	r.load = phaseLoad{cpuacct.Phase{A: l0, B: b.acct.Take()}}
	return r
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
func (b *bench) random(ctx context.Context) randResult {
	c := b.c
	targets, leader, follower := b.mountTargets(ctx, "bench-rand")
	defer func() {
		b.unmount(ctx, leader, benchVol, "bench-rand")
		b.unmount(ctx, follower, benchVol, "bench-rand")
	}()
	r := randResult{leader: leader, follower: follower, runs: map[string][]randRow{}}
	for _, t := range targets {
		r.rows = append(r.rows, t.label)
	}
	size := int64(c.randMiB) << 20
	buf := make([]byte, chunk)
	for i := range buf {
		buf[i] = byte(b.rng.Uint32())
	}
	// One file on the local filesystem, one in the volume (both mounts
	// see the same file).
	files := map[string]string{}
	for _, t := range targets[:2] {
		path := filepath.Join(t.dir, "rand.dat")
		if _, err := seqWrite(path, buf, size); err != nil {
			fail("preallocate %s: %v", path, err)
		}
		files[t.label] = path
	}
	files[rowFollower] = filepath.Join(targets[2].dir, "rand.dat")
	b.waitQuiet(ctx)
	profiled := b.startProfiles(ctx, "rand")
	defer profiled()
	l0 := b.acct.Take()
	for rep := range c.reps {
		for k := range targets {
			t := targets[(k+rep)%len(targets)]
			if ctx.Err() != nil {
				fail("%v", ctx.Err())
			}
			a := b.acct.Take()
			row, err := randWrite(files[t.label], buf[:block], size, c.randDur, b.rng.Int64N)
			if err != nil {
				fail("random writes to %s: %v", t.label, err)
			}
			row.cpu = cpuacct.Phase{A: a, B: b.acct.Take()}.OursTime()
			r.runs[t.label] = append(r.runs[t.label], row)
			progress("  %s: %.0f IOPS, p50 %s, p99 %s, CPU %s per write", t.label, row.iops(), dur(pctl(row.lat, 0.5)), dur(pctl(row.lat, 0.99)), dur(row.cpuPerWrite()))
		}
	}
	r.load = phaseLoad{cpuacct.Phase{A: l0, B: b.acct.Take()}}
	for _, p := range []string{files[rowLocal], files[rowLeader]} {
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
