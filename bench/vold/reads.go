package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The read phase: 4 KiB random reads (pread, one thread) of a file in the
// volume through the leader's mount, alone and beside one O_DSYNC writer
// writing another file of the volume through the same mount. Every read
// is a FUSE request that vold answers from its replica after a ReadIndex;
// beside a writer the reads meet the loop busy with the writes' rounds,
// which is what the row measures against the reads alone.

const (
	readAlone  = "reads alone"
	readBeside = "reads beside one O_DSYNC writer"
)

// readRun is one run of reads: their latencies, and the writer's writes
// meanwhile (beside a writer).
type readRun struct {
	lat     []time.Duration
	elapsed time.Duration
	writes  int
}

func (r readRun) rate() float64 { return perSecond(len(r.lat), r.elapsed) }

type readResult struct {
	leader int
	runs   map[string][]readRun
}

// reads runs the read phase, c.reps runs of c.readDur per row, the rows
// alternating.
func (b *bench) reads(ctx context.Context) readResult {
	c := b.c
	leader, _, err := b.leaderAndFollower(ctx, benchVol)
	check(err)
	dir, err := b.mount(ctx, leader, benchVol, "bench-read")
	check(err)
	defer b.unmount(ctx, leader, benchVol, "bench-read")
	size := int64(c.randMiB) << 20
	buf := make([]byte, chunk)
	for i := range buf {
		buf[i] = byte(b.rng.Uint32())
	}
	rf, wf := filepath.Join(dir, "read.dat"), filepath.Join(dir, "read-writer.dat")
	for _, p := range []string{rf, wf} {
		if _, err := seqWrite(p, buf, size); err != nil {
			fail("preallocate %s: %v", p, err)
		}
	}
	b.waitQuiet(ctx)
	r := readResult{leader: leader, runs: map[string][]readRun{}}
	rows := []string{readAlone, readBeside}
	var led leadership // only to make sure the leader leads before each run
	for rep := range c.reps {
		for k := range rows {
			row := rows[(rep+k)%len(rows)]
			b.lead(ctx, &led, leader, dir)
			run, err := readWhile(rf, wf, size, c.readDur, row == readBeside, b.rng.Uint64())
			if err != nil {
				fail("%s: %v", row, err)
			}
			r.runs[row] = append(r.runs[row], run)
			progress("  %s: %.0f reads/s, p50 %s, p99 %s; %d writes", row, run.rate(), dur(pctl(run.lat, 0.5)), dur(pctl(run.lat, 0.99)), run.writes)
		}
	}
	for _, p := range []string{rf, wf} {
		if err := os.Remove(p); err != nil {
			fail("remove %s: %v", p, err)
		}
	}
	return r
}

// readWhile reads 4 KiB blocks of rf at random offsets below size for d,
// with a writer writing wf meanwhile as the random write phase does
// (randWrite) if writer is set.
func readWhile(rf, wf string, size int64, d time.Duration, writer bool, seed uint64) (readRun, error) {
	var run readRun
	var wrote randRow
	n := 1
	if writer {
		n = 2
	}
	_, err := together(n, func(w int) (time.Duration, error) {
		if w == 1 {
			var err error
			wrote, err = randWrite(wf, make([]byte, block), size, d, rand.New(rand.NewPCG(seed, 3)).Int64N)
			return 0, err
		}
		f, err := os.Open(rf)
		if err != nil {
			return 0, err
		}
		defer f.Close()
		rng := rand.New(rand.NewPCG(seed, 2))
		blk := make([]byte, block)
		t0 := time.Now()
		for time.Since(t0) < d {
			s := time.Now()
			if _, err := f.ReadAt(blk, rng.Int64N(size/block)*block); err != nil {
				return 0, err
			}
			run.lat = append(run.lat, time.Since(s))
		}
		run.elapsed = time.Since(t0)
		return 0, nil
	})
	run.writes = len(wrote.lat)
	return run, err
}

func (r *results) printReads(c config) {
	s := r.reads
	if len(s.runs) == 0 {
		return
	}
	fmt.Printf("### Random 4 KiB reads\n\n")
	fmt.Printf("One thread reading 4 KiB blocks (`pread`) at random 4 KiB-aligned offsets of a %d MiB file in the volume through the leader's mount (node %d), for %v per run, %d runs per row alternating: alone, and beside one writer writing 4 KiB blocks with O_DSYNC to another file of the volume through the same mount. Every read is a FUSE request (direct I/O, no page cache) that vold answers from its replica after a ReadIndex, so it is linearizable. *Writes/s* is the writer's rate meanwhile.\n\n", c.randMiB, s.leader, c.readDur, c.reps)
	fmt.Printf("| reads | reads/s per run | median reads/s | p50 | p99 | writes/s | × alone |\n|---|---|---:|---:|---:|---:|---:|\n")
	alone := medianRate(s.runs[readAlone])
	for _, row := range []string{readAlone, readBeside} {
		runs := s.runs[row]
		var per []string
		var lat []time.Duration
		var writes int
		var secs float64
		for _, x := range runs {
			per = append(per, fmt.Sprintf("%.0f", x.rate()))
			lat = append(lat, x.lat...)
			writes += x.writes
			secs += x.elapsed.Seconds()
		}
		m := medianRate(runs)
		w, rat := "–", "–"
		if row == readBeside {
			if secs > 0 {
				w = fmt.Sprintf("%.0f", float64(writes)/secs)
			}
			if alone > 0 {
				rat = fmt.Sprintf("%.2f×", m/alone)
			}
		}
		fmt.Printf("| %s | %s | %.0f | %s | %s | %s | %s |\n", row, strings.Join(per, ", "), m, dur(pctl(lat, 0.5)), dur(pctl(lat, 0.99)), w, rat)
	}
	fmt.Printf("\n")
}

// medianRate is the median of the runs' read rates.
func medianRate(runs []readRun) float64 {
	var v []float64
	for _, x := range runs {
		v = append(v, x.rate())
	}
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	return v[len(v)/2]
}
