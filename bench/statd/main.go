// Command statd measures pkg/store and the shoal-statd binary against
// baselines measured in the same run, and prints a Markdown section on
// stdout (docs/BENCHMARKS.md style):
//
//   - durable Put throughput through store.Store with 1, 16 and 64
//     concurrent writers, against raw Pebble synced writes of the same
//     value at the same concurrency (fresh database per run, same Pebble
//     options, same filesystem);
//   - restart of the real shoal-statd binary on a state dir holding -keys
//     documents: exec to READY=1 on NOTIFY_SOCKET, and RSS after READY,
//     after the start-up index scrub and after a client listed every key,
//     against the same binary started on an empty state dir.
//
// Flags scale every part down for a quick run (see bench/run.sh).
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2"
	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sys/unix"

	"github.com/shoal-dev/shoal/pkg/client"
	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/store"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

type config struct {
	dir          string
	writers      []int
	reps         int
	duration     time.Duration
	warmup       time.Duration
	valueSize    int
	keys         int
	popWriters   int
	restarts     int
	listRuns     int
	statdBin     string
	skipPut      bool
	skipRestart  bool
	readyTimeout time.Duration
	quietWait    time.Duration
	quietCPU     float64
}

func main() {
	var c config
	var writers string
	flag.StringVar(&c.dir, "dir", os.TempDir(), "directory for the databases and state dirs (its filesystem is the one measured)")
	flag.StringVar(&writers, "writers", "1,16,64", "concurrent writers for the throughput table")
	flag.IntVar(&c.reps, "reps", 5, "repetitions of each throughput run (store and raw Pebble alternate)")
	flag.DurationVar(&c.duration, "duration", 2*time.Second, "measured time of each throughput run")
	flag.DurationVar(&c.warmup, "warmup", 250*time.Millisecond, "unmeasured time at the start of each throughput run")
	flag.IntVar(&c.valueSize, "value-size", 100, "bytes in the one field of each document")
	flag.IntVar(&c.keys, "keys", 1_000_000, "documents in the restart state dir")
	flag.IntVar(&c.popWriters, "populate-writers", 256, "concurrent writers populating the restart state dir")
	flag.IntVar(&c.restarts, "restarts", 5, "starts of shoal-statd on each state dir (populated and empty)")
	flag.IntVar(&c.listRuns, "list-runs", 2, "of those starts, how many (the first ones) also list every key through the State API")
	flag.StringVar(&c.statdBin, "statd-bin", "bin/shoal-statd", "shoal-statd binary (make build)")
	flag.BoolVar(&c.skipPut, "skip-put", false, "skip the throughput table")
	flag.BoolVar(&c.skipRestart, "skip-restart", false, "skip the restart table")
	flag.DurationVar(&c.readyTimeout, "ready-timeout", 2*time.Minute, "give up on a start that takes longer")
	flag.DurationVar(&c.quietWait, "quiet-wait", 5*time.Second, "before each measured pair, wait up to this long for other processes to use less than -quiet-cpu CPUs (0: never wait)")
	flag.Float64Var(&c.quietCPU, "quiet-cpu", 0.25, "CPUs other processes may use for the machine to count as quiet")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of this process (the in-process store and Pebble runs) to this file")
	flag.Parse()
	c.writers = parseInts(writers)
	if c.reps < 1 || c.restarts < 1 || c.keys < 1 || c.valueSize < 1 {
		fail("-reps, -restarts, -keys and -value-size must be positive")
	}
	if !c.skipRestart {
		bin, err := filepath.Abs(c.statdBin)
		check(err)
		if _, err := os.Stat(bin); err != nil {
			fail("%v (run make build first, or pass -statd-bin)", err)
		}
		c.statdBin = bin
	}

	root, err := os.MkdirTemp(c.dir, "shoal-bench-statd-")
	check(err)
	atCleanup(func() { os.RemoveAll(root) })
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		s := <-sigs
		fmt.Fprintf(os.Stderr, "statd bench: %v, cleaning up\n", s)
		runCleanup()
		os.Exit(1)
	}()
	defer runCleanup()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		check(err)
		check(pprof.StartCPUProfile(f))
		atCleanup(func() { pprof.StopCPUProfile(); f.Close() })
	}

	fmt.Printf("## statd: store and daemon (pkg/store, shoal-statd)\n\n")
	fmt.Printf("Machine: %s. Bench dir %s on %s.\n\n", machine(), root, filesystem(root))
	if !c.skipPut {
		putTable(c, root)
	}
	if !c.skipRestart {
		restartTable(c, root)
	}
}

// ---- durable Put throughput ----

// pebbleOptions are the options store.Open gives Pebble (pkg/store/store.go).
// putTable checks that the OPTIONS files both databases write are
// identical, so a change in the store's options shows up here.
// pebbleOptions are the store's own Pebble options, so the baseline is
// like for like. NB: the cache reference is never released: each bench
// database lives to the end of the run.
func pebbleOptions() *pebble.Options {
	return store.PebbleOptions(quietLogger{})
}

type quietLogger struct{}

func (quietLogger) Infof(string, ...any) {}
func (quietLogger) Errorf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "pebble: "+format+"\n", args...)
}
func (quietLogger) Fatalf(format string, args ...any) {
	fail("pebble: "+format, args...)
}

// runStats is one measured run.
type runStats struct {
	ops     int
	elapsed time.Duration
	lat     []time.Duration
	// syncs is the number of WAL fsyncs (store commits) in the window.
	syncs uint64
	// syncTime is the time spent in the synced commits (store only).
	syncTime time.Duration
	// otherCPU is the CPU other processes used in the window, in CPUs.
	otherCPU float64
	// selfCPU is the CPU time this process used in the window (writers,
	// store, Pebble's flushes and compactions, GC).
	selfCPU time.Duration
	// diskBytes is what this process wrote to storage in the window.
	diskBytes int64
}

func (r runStats) rate() float64 { return float64(r.ops) / r.elapsed.Seconds() }

// drive runs n writers calling write until warmup+d has passed, and counts
// the operations that started and finished in the measured window. before
// and after bracket the window (for counters).
func drive(n int, warmup, d time.Duration, write func(w, i int) error, before, after func()) runStats {
	var measuring, stop atomic.Bool
	var done atomic.Int64
	lats := make([][]time.Duration, n)
	var wg sync.WaitGroup
	var firstErr atomic.Pointer[error]
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				m := measuring.Load()
				start := time.Now()
				if err := write(w, i); err != nil {
					firstErr.CompareAndSwap(nil, &err)
					return
				}
				if m && measuring.Load() {
					lats[w] = append(lats[w], time.Since(start))
					done.Add(1)
				}
			}
		}()
	}
	time.Sleep(warmup)
	before()
	c0 := cpuSample()
	t0 := time.Now()
	measuring.Store(true)
	time.Sleep(d)
	measuring.Store(false)
	elapsed := time.Since(t0)
	ops := done.Load()
	c1 := cpuSample()
	other := c1.otherSince(c0, elapsed)
	after()
	stop.Store(true)
	wg.Wait()
	if p := firstErr.Load(); p != nil {
		fail("write: %v", *p)
	}
	var all []time.Duration
	for _, l := range lats {
		all = append(all, l...)
	}
	return runStats{ops: int(ops), elapsed: elapsed, lat: all, otherCPU: other,
		selfCPU: c1.self - c0.self, diskBytes: c1.written - c0.written}
}

// quiet tracks how often measurements began on a busy machine.
type quiet struct {
	c           config
	pairs, busy int
}

// wait waits up to c.quietWait for other processes to use less than
// c.quietCPU CPUs over half a second, and counts the pairs that start
// without such a lull.
func (q *quiet) wait(c config) {
	q.pairs++
	q.c = c
	if c.quietWait <= 0 {
		return
	}
	deadline := time.Now().Add(c.quietWait)
	for {
		c0 := cpuSample()
		time.Sleep(500 * time.Millisecond)
		if cpuSample().otherSince(c0, 500*time.Millisecond) < c.quietCPU {
			return
		}
		if time.Now().After(deadline) {
			q.busy++
			return
		}
	}
}

func (q *quiet) String() string {
	if q.c.quietWait <= 0 {
		return "The bench did not wait for a quiet machine (-quiet-wait 0)"
	}
	return fmt.Sprintf("Before each of the %d measured pairs the bench waited up to %s for other processes to use < %.2f CPUs; %d pairs ran without such a lull",
		q.pairs, q.c.quietWait, q.c.quietCPU, q.busy)
}

// cpuTimes samples the machine's busy CPU time and this process's.
type cpuTimes struct {
	machine, self time.Duration
	// written is this process's write_bytes - cancelled_write_bytes from
	// /proc/self/io: bytes it sent (or will send) to storage.
	written int64
}

func cpuSample() cpuTimes {
	var c cpuTimes
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line)
		// cpu user nice system idle iowait irq softirq steal ...
		for i, v := range f[1:] {
			if i == 3 || i == 4 || i >= 8 {
				continue
			}
			n, _ := strconv.ParseInt(v, 10, 64)
			c.machine += time.Duration(n) * time.Second / 100 // USER_HZ
		}
	}
	if b, err := os.ReadFile("/proc/self/io"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			k, v, _ := strings.Cut(line, ": ")
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			switch k {
			case "write_bytes":
				c.written += n
			case "cancelled_write_bytes":
				c.written -= n
			}
		}
	}
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) == nil {
		c.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return c
}

// otherSince is the CPU time other processes used since c0, in CPUs.
func (c cpuTimes) otherSince(c0 cpuTimes, elapsed time.Duration) float64 {
	other := (c.machine - c0.machine) - (c.self - c0.self)
	return max(0, other.Seconds()/elapsed.Seconds())
}

func value(size int, seed uint64) []byte {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	r := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, size)
	for i := range b {
		b[i] = alphabet[r.IntN(len(alphabet))]
	}
	return b
}

func runStore(dir string, n int, c config) (runStats, string) {
	st, err := store.Open(store.Options{Dir: dir})
	check(err)
	val := crdt.String(string(value(c.valueSize, uint64(n))))
	ctx := context.Background()
	var s0, s1 store.Status
	r := drive(n, c.warmup, c.duration, func(w, i int) error {
		_, err := st.Put(ctx, fmt.Sprintf("/bench/w%d/%d", w, i), map[string]crdt.Value{"v": val})
		return err
	}, func() { s0 = st.Status() }, func() { s1 = st.Status() })
	r.syncs = s1.Counters["commits"] - s0.Counters["commits"]
	r.syncTime = time.Duration(s1.Counters["commit_micros"]-s0.Counters["commit_micros"]) * time.Microsecond
	check(st.Close())
	opts := optionsFile(dir)
	check(os.RemoveAll(dir))
	return r, opts
}

func runRaw(dir string, n int, c config) (runStats, string) {
	db, err := pebble.Open(dir, pebbleOptions())
	check(err)
	val := value(c.valueSize, uint64(n))
	var f0, f1 uint64
	r := drive(n, c.warmup, c.duration, func(w, i int) error {
		return db.Set(fmt.Appendf(nil, "/bench/w%d/%d", w, i), val, pebble.Sync)
	}, func() { f0 = fsyncs(db) }, func() { f1 = fsyncs(db) })
	r.syncs = f1 - f0
	check(db.Close())
	opts := optionsFile(dir)
	check(os.RemoveAll(dir))
	return r, opts
}

// fsyncs is the number of WAL fsyncs Pebble has done.
func fsyncs(db *pebble.DB) uint64 {
	h := db.Metrics().LogWriter.FsyncLatency
	if h == nil {
		return 0
	}
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		return 0
	}
	return m.GetHistogram().GetSampleCount()
}

// optionsFile returns the OPTIONS file Pebble wrote in dir.
func optionsFile(dir string) string {
	ms, _ := filepath.Glob(filepath.Join(dir, "OPTIONS-*"))
	if len(ms) == 0 {
		return ""
	}
	slices.Sort(ms)
	b, err := os.ReadFile(ms[len(ms)-1])
	check(err)
	return string(b)
}

// fdatasyncRate is the local disk's baseline: one writer appending
// valueSize bytes to a file and calling fdatasync, for d.
func fdatasyncRate(dir string, size int, d time.Duration) (float64, time.Duration) {
	f, err := os.CreateTemp(dir, "fsync-")
	check(err)
	defer os.Remove(f.Name())
	defer f.Close()
	buf := value(size, 1)
	var lats []time.Duration
	t0 := time.Now()
	for time.Since(t0) < d {
		s := time.Now()
		_, err := f.Write(buf)
		check(err)
		check(unix.Fdatasync(int(f.Fd())))
		lats = append(lats, time.Since(s))
	}
	return float64(len(lats)) / time.Since(t0).Seconds(), pct(lats, 50)
}

func putTable(c config, root string) {
	type cell struct{ store, raw []runStats }
	fmt.Fprintf(os.Stderr, "statd bench: put throughput, writers %v, %d × %s\n", c.writers, c.reps, c.duration)
	cells := make([]cell, len(c.writers))
	var storeOpts, rawOpts string
	diskRates := []float64{}
	var diskLat []time.Duration
	seq := 0
	var q quiet
	for rep := range c.reps {
		r, l := fdatasyncRate(root, c.valueSize, c.duration/4)
		diskRates = append(diskRates, r)
		diskLat = append(diskLat, l)
		for i, n := range c.writers {
			// Alternate the order so that neither side always runs on a
			// disk the other has just dirtied.
			order := []bool{true, false}
			if rep%2 == 1 {
				order = []bool{false, true}
			}
			q.wait(c)
			for _, isStore := range order {
				seq++
				dir := filepath.Join(root, fmt.Sprintf("put-%d", seq))
				// The labels (inherited by the goroutines Pebble starts)
				// split a -cpuprofile by side: go tool pprof -tagfocus=run=store.
				if isStore {
					pprof.Do(context.Background(), pprof.Labels("run", "store"), func(context.Context) {
						r, o := runStore(dir, n, c)
						cells[i].store = append(cells[i].store, r)
						storeOpts = o
					})
				} else {
					pprof.Do(context.Background(), pprof.Labels("run", "raw"), func(context.Context) {
						r, o := runRaw(dir, n, c)
						cells[i].raw = append(cells[i].raw, r)
						rawOpts = o
					})
				}
			}
			last := cells[i]
			fmt.Fprintf(os.Stderr, "statd bench: put rep %d/%d writers %d: store %.0f/s raw %.0f/s\n",
				rep+1, c.reps, n, last.store[len(last.store)-1].rate(), last.raw[len(last.raw)-1].rate())
		}
	}

	fmt.Printf("### Durable Put throughput\n\n")
	fmt.Printf("Each writer Puts new keys (`/bench/w<writer>/<i>`), one field of %d bytes, and waits for the acknowledgement; "+
		"*store* is `store.Store.Put` (group commit: one synced Pebble batch per group), *raw Pebble* is `db.Set(key, value, pebble.Sync)` "+
		"with the same key, value, concurrency and Pebble options (Pebble's commit pipeline groups the fsyncs of concurrent writers). "+
		"Fresh database per run, %d runs of %s each (after %s unmeasured) per cell, store and raw alternating, in a temp dir on the bench filesystem. "+
		"Figures are the median, range in brackets; the ratio is the median of the per-repetition ratios store ÷ raw (each store run paired with the raw run next to it). "+
		"Latencies are percentiles over every measured Put of the cell.\n\n",
		c.valueSize, c.reps, c.duration, c.warmup)
	if storeOpts != rawOpts {
		fmt.Printf("**Warning: the store's Pebble OPTIONS file differs from the baseline's; the comparison is not like for like.**\n\n")
	} else {
		fmt.Printf("The OPTIONS files Pebble wrote for both databases are identical.\n\n")
	}
	fmt.Printf("| writers | store ops/s | raw Pebble ops/s | store ÷ raw | store p50 / p99 latency | raw p50 / p99 latency |\n")
	fmt.Printf("|---:|---:|---:|---:|---:|---:|\n")
	type diag struct {
		sw, rw, scpu, rcpu, sbytes, rbytes, share, other []float64
	}
	diags := make([]diag, len(c.writers))
	var goal16 []float64
	for i, n := range c.writers {
		cl := cells[i]
		d := &diags[i]
		var sr, rr, ratio []float64
		var sl, rl []time.Duration
		for j := range cl.store {
			s, r := cl.store[j], cl.raw[j]
			sr = append(sr, s.rate())
			rr = append(rr, r.rate())
			ratio = append(ratio, s.rate()/r.rate())
			if s.syncs > 0 {
				d.sw = append(d.sw, float64(s.ops)/float64(s.syncs))
			}
			if r.syncs > 0 {
				d.rw = append(d.rw, float64(r.ops)/float64(r.syncs))
			}
			d.scpu = append(d.scpu, perOp(s.selfCPU.Seconds()*1e6, s.ops))
			d.rcpu = append(d.rcpu, perOp(r.selfCPU.Seconds()*1e6, r.ops))
			d.sbytes = append(d.sbytes, perOp(float64(s.diskBytes), s.ops))
			d.rbytes = append(d.rbytes, perOp(float64(r.diskBytes), r.ops))
			d.share = append(d.share, 100*s.syncTime.Seconds()/s.elapsed.Seconds())
			d.other = append(d.other, s.otherCPU, r.otherCPU)
			sl = append(sl, s.lat...)
			rl = append(rl, r.lat...)
		}
		if n == 16 {
			goal16 = ratio
		}
		fmt.Printf("| %d | %s | %s | %s | %s / %s | %s / %s |\n", n,
			spread(sr, "%.0f"), spread(rr, "%.0f"), spread(ratio, "%.2f"),
			dur(pct(sl, 50)), dur(pct(sl, 99)), dur(pct(rl, 50)), dur(pct(rl, 99)))
	}
	fmt.Println()
	fmt.Printf("Where the time goes, same runs. *Writes per fsync*: store Puts per store commit, raw Sets per Pebble WAL fsync. "+
		"*CPU per Put*: CPU time of the whole bench process (writers, store, Pebble flushes and compactions, GC) over the Puts in the window. "+
		"*Bytes written per Put*: the process's write_bytes − cancelled_write_bytes (/proc/self/io) over the Puts: WAL, flushes and compactions. "+
		"*Synced commit share*: the part of the window the store's committer goroutine spent in `Batch.Commit(pebble.Sync)`. "+
		"*Other processes' CPU*: the CPU the rest of the machine used during the runs, in CPUs (of %d): figures are only comparable when it is near 0. %s.\n\n",
		runtime.NumCPU(), &q)
	fmt.Printf("| writers | writes per fsync store / raw | CPU per Put store / raw µs | bytes written per Put store / raw | synced commit share (store) | other processes' CPU |\n")
	fmt.Printf("|---:|---:|---:|---:|---:|---:|\n")
	for i, n := range c.writers {
		d := diags[i]
		fmt.Printf("| %d | %s / %s | %s / %s | %s / %s | %s%% | %s |\n", n,
			spreadOrNA(d.sw, "%.1f"), spreadOrNA(d.rw, "%.1f"),
			spread(d.scpu, "%.0f"), spread(d.rcpu, "%.0f"),
			spread(d.sbytes, "%.0f"), spread(d.rbytes, "%.0f"),
			spread(d.share, "%.0f"), spread(d.other, "%.2f"))
	}
	fmt.Println()
	fmt.Printf("Local disk baseline: one writer appending %d bytes and calling fdatasync on a file in the bench dir: %s fsyncs/s (median of %d runs of %s, median latency %s).\n\n",
		c.valueSize, spread(diskRates, "%.0f"), len(diskRates), c.duration/4, dur(median(diskLat)))
	if goal16 != nil {
		m := medianF(goal16)
		verdict := "met"
		if m < 0.5 {
			verdict = "**not met**"
		}
		fmt.Printf("Goal (issue 2): store ÷ raw ≥ 0.5 at 16 writers: %.2f, %s.\n\n", m, verdict)
	}
}

// ---- restart with many keys ----

func populate(c config, stateDir string) (time.Duration, int64) {
	st, err := store.Open(store.Options{
		Dir:    filepath.Join(stateDir, "db"),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		// statd's defaults (pkg/statd).
		WatchHistory:  100_000,
		MSTCacheNodes: 16_384,
	})
	check(err)
	val := crdt.String(string(value(c.valueSize, 42)))
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	var done atomic.Int64
	start := time.Now()
	stopProgress := make(chan struct{})
	go func() {
		t := time.NewTicker(10 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stopProgress:
				return
			case <-t.C:
				d := done.Load()
				fmt.Fprintf(os.Stderr, "statd bench: populate %d/%d (%.0f docs/s)\n", d, c.keys, float64(d)/time.Since(start).Seconds())
			}
		}
	}()
	for range c.popWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				n := next.Add(1) - 1
				if n >= int64(c.keys) {
					return
				}
				if _, err := st.Put(ctx, fmt.Sprintf("/bench/%07d", n), map[string]crdt.Value{"v": val}); err != nil {
					fail("populate: %v", err)
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	close(stopProgress)
	elapsed := time.Since(start)
	if live := st.Status().Live; live != uint64(c.keys) {
		fail("populate: store holds %d live documents, want %d", live, c.keys)
	}
	check(st.Close())
	return elapsed, dirSize(stateDir)
}

// startStats is one start of shoal-statd.
type startStats struct {
	ready        time.Duration // exec to READY=1
	logged       time.Duration // the daemon's own "startup" figure
	rssReady     uint64        // VmRSS right after READY, bytes
	hwmReady     uint64
	scrub        time.Duration // exec to "index scrub clean"
	scrubEntries int
	rssScrub     uint64
	hwmScrub     uint64
	listed       int
	list         time.Duration
	rssList      uint64
	hwmList      uint64
	stop         time.Duration // SIGTERM to exit
	wal          int64         // bytes of WAL in the db dir before the start
}

var (
	reStartup = regexp.MustCompile(`msg=ready .*startup=(\S+)`)
	reScrub   = regexp.MustCompile(`msg="index scrub clean".* entries=(\d+)`)
)

// startStatd runs one start of the binary on stateDir and measures it.
func startStatd(c config, stateDir, runDir string, list bool, wantKeys int) startStats {
	var s startStats
	s.wal = walBytes(filepath.Join(stateDir, "db"))
	notifyPath := filepath.Join(runDir, "notify")
	os.Remove(notifyPath)
	notify, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notifyPath, Net: "unixgram"})
	check(err)
	defer notify.Close()
	readyCh := make(chan time.Time, 1)
	go func() {
		buf := make([]byte, 4096)
		for {
			k, err := notify.Read(buf)
			if err != nil {
				return
			}
			for _, line := range strings.Split(string(buf[:k]), "\n") {
				if line == "READY=1" {
					select {
					case readyCh <- time.Now():
					default:
					}
				}
			}
		}
	}()

	cmd := exec.Command(c.statdBin, "--state-dir", stateDir, "--run-dir", runDir, "--metrics-addr", "", "--config", "")
	// Only our NOTIFY_SOCKET: no inherited socket activation, watchdog or
	// journal from whatever runs the bench.
	cmd.Env = slices.DeleteFunc(os.Environ(), func(e string) bool {
		return strings.HasPrefix(e, "LISTEN_") || strings.HasPrefix(e, "WATCHDOG_") ||
			strings.HasPrefix(e, "JOURNAL_STREAM=") || strings.HasPrefix(e, "NOTIFY_SOCKET=")
	})
	cmd.Env = append(cmd.Env, "NOTIFY_SOCKET="+notifyPath)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	check(err)
	var logMu sync.Mutex
	var logBuf strings.Builder
	scrubCh := make(chan time.Time, 1)
	scrubFailed := make(chan string, 1)
	loggedCh := make(chan time.Duration, 1)
	scrubEntries := 0
	logDone := make(chan struct{})
	go func() {
		defer close(logDone)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			logMu.Lock()
			logBuf.WriteString(line + "\n")
			logMu.Unlock()
			// NB: never block here: statd would block on a full stderr pipe.
			if m := reStartup.FindStringSubmatch(line); m != nil {
				if d, err := time.ParseDuration(m[1]); err == nil {
					select {
					case loggedCh <- d:
					default:
					}
				}
			}
			if m := reScrub.FindStringSubmatch(line); m != nil {
				scrubEntries, _ = strconv.Atoi(m[1])
				select {
				case scrubCh <- time.Now():
				default:
				}
			} else if strings.Contains(line, `msg="index scrub"`) {
				select {
				case scrubFailed <- line:
				default:
				}
			}
		}
	}()
	logs := func() string { logMu.Lock(); defer logMu.Unlock(); return logBuf.String() }

	t0 := time.Now()
	check(cmd.Start())
	pid := cmd.Process.Pid
	unregister := atCleanup(func() { cmd.Process.Kill() })
	defer unregister()
	exited := make(chan error, 1)
	go func() {
		<-logDone
		exited <- cmd.Wait()
	}()
	wait := func(what string, ch <-chan time.Time) time.Time {
		select {
		case t := <-ch:
			return t
		case err := <-exited:
			fail("shoal-statd exited (%v) before %s:\n%s", err, what, logs())
		case line := <-scrubFailed:
			cmd.Process.Kill()
			fail("shoal-statd's index scrub failed: %s\n%s", line, logs())
		case <-time.After(c.readyTimeout):
			cmd.Process.Kill()
			fail("shoal-statd: no %s after %s:\n%s", what, c.readyTimeout, logs())
		}
		panic("unreachable")
	}

	s.ready = wait("READY=1", readyCh).Sub(t0)
	s.rssReady, s.hwmReady = memOf(pid)
	s.scrub = wait(`"index scrub clean"`, scrubCh).Sub(t0)
	s.rssScrub, s.hwmScrub = memOf(pid)
	s.scrubEntries = scrubEntries
	select {
	case s.logged = <-loggedCh:
	default:
	}

	if list {
		start := time.Now()
		s.listed = listAll(runDir)
		s.list = time.Since(start)
		if s.listed != wantKeys {
			fail("listed %d documents, want %d", s.listed, wantKeys)
		}
		s.rssList, s.hwmList = memOf(pid)
	}

	start := time.Now()
	check(cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		if err != nil {
			fail("shoal-statd exited with %v after SIGTERM:\n%s", err, logs())
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		fail("shoal-statd did not stop within 30s of SIGTERM:\n%s", logs())
	}
	s.stop = time.Since(start)
	return s
}

// listAll lists every document through the State API, in pages of the
// largest size statd serves.
func listAll(runDir string) int {
	cl, err := client.NewStatd(runDir, client.Retry{})
	check(err)
	defer cl.Close()
	ctx := context.Background()
	n := 0
	tok := ""
	for {
		resp, err := cl.List(ctx, &statev1.ListRequest{Prefix: "/bench/", PageSize: 1000, PageToken: tok})
		check(err)
		n += len(resp.GetDocuments())
		tok = resp.GetNextPageToken()
		if tok == "" {
			return n
		}
	}
}

// memOf returns VmRSS and VmHWM of pid, in bytes.
func memOf(pid int) (rss, hwm uint64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	check(err)
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseUint(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			rss = v << 10
		case "VmHWM:":
			hwm = v << 10
		}
	}
	return rss, hwm
}

func restartTable(c config, root string) {
	full := filepath.Join(root, "state-full")
	empty := filepath.Join(root, "state-empty")
	// Socket paths are limited to ~108 bytes: the run dir lives in /tmp
	// whatever -dir is (it holds only sockets).
	runDir, err := os.MkdirTemp("/tmp", "sbr-")
	check(err)
	atCleanup(func() { os.RemoveAll(runDir) })

	fmt.Fprintf(os.Stderr, "statd bench: populating %d documents with %d writers\n", c.keys, c.popWriters)
	popTime, popBytes := populate(c, full)
	check(os.MkdirAll(empty, 0o700))

	var fulls, empties []startStats
	var q quiet
	for i := range c.restarts {
		list := i < c.listRuns
		q.wait(c)
		e := startStatd(c, empty, runDir, false, 0)
		f := startStatd(c, full, runDir, list, c.keys)
		if f.scrubEntries != c.keys {
			fail("scrub saw %d entries, want %d", f.scrubEntries, c.keys)
		}
		empties = append(empties, e)
		fulls = append(fulls, f)
		fmt.Fprintf(os.Stderr, "statd bench: start %d/%d: ready %s (empty %s), scrub %s, rss %s MiB\n",
			i+1, c.restarts, dur(f.ready), dur(e.ready), dur(f.scrub), mib(f.rssReady))
	}

	durs := func(ss []startStats, f func(startStats) time.Duration) string {
		var ds []time.Duration
		for _, s := range ss {
			ds = append(ds, f(s))
		}
		return durSpread(ds)
	}
	mem := func(ss []startStats, f func(startStats) uint64) string {
		var xs []float64
		for _, s := range ss {
			xs = append(xs, float64(f(s))/(1<<20))
		}
		return spread(xs, "%.0f")
	}
	readyMed := func(ss []startStats) time.Duration {
		var ds []time.Duration
		for _, s := range ss {
			ds = append(ds, s.ready)
		}
		return median(ds)
	}
	listed := fulls[:min(c.listRuns, len(fulls))]

	fmt.Printf("### Restart with %d documents\n\n", c.keys)
	fmt.Printf("Populate: %d documents (`/bench/<n>`, one %d-byte field) Put through `store.Store` by %d concurrent writers in %s (%.0f docs/s); state dir %.0f MiB on disk. "+
		"Then `%s --state-dir D --run-dir R --metrics-addr '' --config ''` is started %d times on it with `NOTIFY_SOCKET` set, and stopped with SIGTERM each time; "+
		"the baseline is the same binary on an empty state dir, started alternately with it. The page cache is warm (nothing is dropped between starts). "+
		"*exec → READY* runs from `exec` to the `READY=1` datagram; *logged startup* is what statd logs (from its runtime's start, after flag parsing, to READY); "+
		"*scrub* is exec to the \"index scrub clean\" log line (the start-up walk of the whole index). "+
		"RSS is VmRSS (peak VmHWM in brackets after it) from /proc/<pid>/status. *WAL* is what Pebble replays at open: Pebble does not flush its memtable on Close, "+
		"so the first start after the populate replays the populate's last writes, and later starts (with no writes in between) replay almost nothing. "+
		"Median over the starts, range in brackets. %s.\n\n",
		c.keys, c.valueSize, c.popWriters, dur(popTime), float64(c.keys)/popTime.Seconds(), float64(popBytes)/(1<<20),
		filepath.Base(c.statdBin), c.restarts, &q)
	fmt.Printf("| state dir | starts | WAL MiB | exec → READY | logged startup | exec → scrub clean | RSS at READY MiB | RSS after scrub MiB | SIGTERM → exit |\n")
	fmt.Printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	rows := []struct {
		name string
		ss   []startStats
	}{{fmt.Sprintf("%d docs, all starts", c.keys), fulls}}
	if len(fulls) > 1 {
		rows = append(rows, struct {
			name string
			ss   []startStats
		}{"… first start after populate", fulls[:1]}, struct {
			name string
			ss   []startStats
		}{"… later starts", fulls[1:]})
	}
	rows = append(rows, struct {
		name string
		ss   []startStats
	}{"empty (baseline)", empties})
	for _, row := range rows {
		var wal []float64
		for _, s := range row.ss {
			wal = append(wal, float64(s.wal)/(1<<20))
		}
		fmt.Printf("| %s | %d | %s | %s | %s | %s | %s (%s) | %s (%s) | %s |\n", row.name, len(row.ss), spread(wal, "%.1f"),
			durs(row.ss, func(s startStats) time.Duration { return s.ready }),
			loggedSpread(row.ss),
			durs(row.ss, func(s startStats) time.Duration { return s.scrub }),
			mem(row.ss, func(s startStats) uint64 { return s.rssReady }), mem(row.ss, func(s startStats) uint64 { return s.hwmReady }),
			mem(row.ss, func(s startStats) uint64 { return s.rssScrub }), mem(row.ss, func(s startStats) uint64 { return s.hwmScrub }),
			durs(row.ss, func(s startStats) time.Duration { return s.stop }))
	}
	fmt.Println()
	fRdy, eRdy := readyMed(fulls), readyMed(empties)
	var worst time.Duration
	for _, s := range fulls {
		worst = max(worst, s.ready)
	}
	fmt.Printf("exec → READY with %d documents ÷ empty: %.2f× (medians %s vs %s); worst start %s.\n\n", c.keys, float64(fRdy)/float64(eRdy), dur(fRdy), dur(eRdy), dur(worst))
	if len(listed) > 0 {
		fmt.Printf("Listing every document through the State API (`client.Statd.List`, prefix `/bench/`, pages of 1000) after the scrub, on the first %d start(s):\n\n", len(listed))
		fmt.Printf("| documents listed | time | docs/s | RSS after list MiB | peak (VmHWM) MiB |\n|---:|---:|---:|---:|---:|\n")
		var rates []float64
		for _, s := range listed {
			rates = append(rates, float64(s.listed)/s.list.Seconds())
		}
		fmt.Printf("| %d | %s | %s | %s | %s |\n\n", listed[0].listed,
			durs(listed, func(s startStats) time.Duration { return s.list }), spread(rates, "%.0f"),
			mem(listed, func(s startStats) uint64 { return s.rssList }), mem(listed, func(s startStats) uint64 { return s.hwmList }))
	}
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "**not met**"
	}
	var peak uint64
	for _, s := range fulls {
		peak = max(peak, s.hwmReady, s.hwmScrub, s.hwmList)
	}
	fmt.Printf("Goals (issue 2), with %d documents: exec → READY ≤ 2 s: worst of %d starts %s (median %s), %s. RSS ≤ 300 MB: highest VmHWM seen over all starts, scrubs and lists %.0f MB (%s MiB), %s.\n\n",
		c.keys, len(fulls), dur(worst), dur(fRdy), verdict(worst <= 2*time.Second), float64(peak)/1e6, mib(peak), verdict(peak <= 300e6))
}

// ---- machine and formatting ----

func machine() string {
	var u unix.Utsname
	kernel := "unknown kernel"
	if unix.Uname(&u) == nil {
		kernel = "Linux " + unix.ByteSliceToString(u.Release[:])
	}
	model := ""
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = " (" + strings.TrimSpace(v) + ")"
				break
			}
		}
	}
	memTotal := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) >= 2 && f[0] == "MemTotal:" {
				kb, _ := strconv.ParseUint(f[1], 10, 64)
				memTotal = fmt.Sprintf(", %.1f GiB RAM", float64(kb)/(1<<20))
			}
		}
	}
	return fmt.Sprintf("%d CPUs%s%s, %s, %s/%s, %s", runtime.NumCPU(), model, memTotal, kernel, runtime.GOOS, runtime.GOARCH, runtime.Version())
}

// filesystem names the filesystem holding dir, from /proc/self/mountinfo.
func filesystem(dir string) string {
	path, err := filepath.EvalSymlinks(dir)
	if err != nil {
		path = dir
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "unknown filesystem"
	}
	best, desc := -1, "unknown filesystem"
	for _, line := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 2 {
			continue
		}
		mp := f[4]
		if (path == mp || strings.HasPrefix(path, strings.TrimSuffix(mp, "/")+"/")) && len(mp) > best {
			best = len(mp)
			desc = fmt.Sprintf("%s (%s, mounted on %s)", g[0], g[1], mp)
		}
	}
	return desc
}

// walBytes is the size of the Pebble WAL files in dir: what the next open
// replays.
func walBytes(dir string) int64 {
	ms, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	var n int64
	for _, m := range ms {
		if info, err := os.Stat(m); err == nil {
			n += info.Size()
		}
	}
	return n
}

// loggedSpread formats the startup times statd logs, which it rounds to
// the millisecond.
func loggedSpread(ss []startStats) string {
	var xs []float64
	for _, s := range ss {
		xs = append(xs, float64(s.logged)/float64(time.Millisecond))
	}
	return spread(xs, "%.0f ms")
}

func dirSize(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}

func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

func medianF(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

// spread formats the median of xs and, if they differ, their range.
func spread(xs []float64, format string) string {
	s := slices.Clone(xs)
	slices.Sort(s)
	out := fmt.Sprintf(format, medianF(s))
	if fmt.Sprintf(format, s[0]) != fmt.Sprintf(format, s[len(s)-1]) {
		out += " [" + fmt.Sprintf(format, s[0]) + "–" + fmt.Sprintf(format, s[len(s)-1]) + "]"
	}
	return out
}

func perOp(x float64, ops int) float64 {
	if ops == 0 {
		return 0
	}
	return x / float64(ops)
}

func spreadOrNA(xs []float64, format string) string {
	if len(xs) == 0 {
		return "n/a"
	}
	return spread(xs, format)
}

func durSpread(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	out := dur(median(s))
	if len(s) > 1 && dur(s[0]) != dur(s[len(s)-1]) {
		out += " [" + dur(s[0]) + "–" + dur(s[len(s)-1]) + "]"
	}
	return out
}

func dur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
	}
}

func mib(b uint64) string { return fmt.Sprintf("%.0f", float64(b)/(1<<20)) }

func parseInts(s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		check(err)
		out = append(out, n)
	}
	return out
}

// ---- cleanup and errors ----

var (
	cleanupMu sync.Mutex
	cleanups  = map[int]func(){}
	cleanupID int
)

// atCleanup registers f to run at exit (normal, failure or signal) and
// returns a function that unregisters it.
func atCleanup(f func()) func() {
	cleanupMu.Lock()
	defer cleanupMu.Unlock()
	cleanupID++
	id := cleanupID
	cleanups[id] = f
	return func() {
		cleanupMu.Lock()
		defer cleanupMu.Unlock()
		delete(cleanups, id)
	}
}

// runCleanup runs the registered functions, newest first.
func runCleanup() {
	cleanupMu.Lock()
	ids := make([]int, 0, len(cleanups))
	for id := range cleanups {
		ids = append(ids, id)
	}
	fs := make([]func(), 0, len(ids))
	slices.Sort(ids)
	for _, id := range slices.Backward(ids) {
		fs = append(fs, cleanups[id])
		delete(cleanups, id)
	}
	cleanupMu.Unlock()
	for _, f := range fs {
		f()
	}
}

func check(err error) {
	if err != nil {
		fail("%v", err)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "statd bench: "+format+"\n", args...)
	runCleanup()
	os.Exit(1)
}
