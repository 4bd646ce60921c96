package hugeheap

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// childEnv runs the test binary as a child that allocates with or without
// a reserve: the parent's heap, shaped by every other test, would not
// show what a fresh process gets.
const childEnv = "HUGEHEAP_RESERVE_CHILD"

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(reserveChild(mode))
	}
	os.Exit(m.Run())
}

const (
	hugeTestReserve = 1 << 30
	testReserve     = 96 << 20
	testAlloc       = 16 << 20
	testRounds      = 4 // 64 MiB kept: a volume's data filling the heap
)

// reserveChild prints its RSS after the optional reserve, the page faults
// that allocating and writing testRounds fresh buffers took (all kept
// live, the collector left to itself), the collections that ran
// meanwhile and its RSS at the end.
func reserveChild(mode string) int {
	switch mode {
	case "small":
		return smallPagesChild()
	case "huge":
		// vold's size: smaller spans tend to start on a boundary.
		// The process's page faults tell a reserve that really was in
		// small pages from one the probe misjudged.
		before := minorFaults()
		_, err := Reserve(hugeTestReserve, true)
		fmt.Printf("%v %d %d\n", errors.Is(err, ErrSmallPages), Reserved(), minorFaults()-before)
		return 0
	case "stall":
		return stallChild()
	case "churn-none":
		return churnChild(false)
	case "churn-given-up":
		return churnChild(true)
	}
	switch mode {
	case "reserve":
		if _, err := Reserve(testReserve, false); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	case "background":
		done := make(chan error, 1)
		ReserveInBackground(testReserve, false, func(_ int, err error) { done <- err })
		if Reserved() != testReserve {
			fmt.Fprintln(os.Stderr, "Reserved", Reserved(), "while the reserve is populated")
			return 1
		}
		if err := <-done; err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	rss := vmRSS()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	gcs := ms.NumGC
	var sink [][]byte
	before := minorFaults()
	for r := 0; r < testRounds; r++ {
		b := make([]byte, testAlloc)
		for i := range b {
			b[i] = byte(i)
		}
		sink = append(sink, b)
	}
	runtime.KeepAlive(sink)
	faults := minorFaults() - before
	runtime.ReadMemStats(&ms)
	fmt.Printf("%d %d %d %d\n", rss, faults, ms.NumGC-gcs, vmRSS())
	return 0
}

func vmRSS() int64 {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		panic(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				panic(err)
			}
			return kb << 10
		}
	}
	panic("no VmRSS")
}

type childResult struct{ rss, faults, gcs, endRSS int64 }

// childOutput runs the test binary as a child in mode and returns what it
// printed; GOGC and GOMEMLIMIT are left out, so the child's collector
// runs as in a daemon.
func childOutput(t *testing.T, mode string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GOGC=") && !strings.HasPrefix(kv, "GOMEMLIMIT=") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, childEnv+"="+mode)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child %s: %v", mode, err)
	}
	return string(out)
}

func runReserveChild(t *testing.T, mode string) childResult {
	t.Helper()
	out := childOutput(t, mode)
	var r childResult
	if _, err := fmt.Sscan(out, &r.rss, &r.faults, &r.gcs, &r.endRSS); err != nil {
		t.Fatalf("child %s printed %q: %v", mode, out, err)
	}
	return r
}

// TestReserveFaultsMemoryInAhead: a process with a reserve is resident
// by the reserve's size at once, and its heap then grows into the
// reserve with next to no page faults and no more RSS, where a process
// without one faults in every page its heap grows into.
func TestReserveFaultsMemoryInAhead(t *testing.T) {
	for _, mode := range []string{"reserve", "background"} {
		t.Run(mode, func(t *testing.T) { testReserveFaultsMemoryInAhead(t, mode) })
	}
}

func testReserveFaultsMemoryInAhead(t *testing.T, mode string) {
	if raceEnabled {
		t.Skip("the race detector's shadow memory faults in beside the heap: see raceEnabled")
	}
	plain := runReserveChild(t, "none")
	res := runReserveChild(t, mode)
	t.Logf("%d × %d MiB written; without a reserve: RSS %d → %d MiB, %d faults, %d collections; with %d MiB reserved: RSS %d → %d MiB, %d faults, %d collections",
		testRounds, testAlloc>>20, plain.rss>>20, plain.endRSS>>20, plain.faults, plain.gcs, testReserve>>20, res.rss>>20, res.endRSS>>20, res.faults, res.gcs)
	if res.rss < plain.rss+testReserve*9/10 {
		t.Errorf("RSS after the reserve %d MiB, want at least %d MiB more than without (%d MiB)", res.rss>>20, testReserve*9/10>>20, plain.rss>>20)
	}
	// 16 MiB is at least 8 faults even in huge pages, 4096 in small ones.
	if plain.faults < testAlloc/(2<<20) {
		t.Fatalf("without a reserve, writing %d MiB faulted %d times: the measure does not see faults", testAlloc>>20, plain.faults)
	}
	if res.faults*4 > plain.faults {
		t.Errorf("with a reserve, %d faults; want under a quarter of the %d without", res.faults, plain.faults)
	}
	if res.endRSS > res.rss+16<<20 {
		t.Errorf("RSS grew from %d to %d MiB: the heap outgrew its reserve", res.rss>>20, res.endRSS>>20)
	}
}

// smallPagesChild asks for a reserve in huge pages with transparent huge
// pages disabled for the process, and prints what Reserve said.
func smallPagesChild() int {
	if !disableTHP() {
		return 1
	}
	before := minorFaults()
	_, err := Reserve(testReserve, true)
	fmt.Printf("%v %d %d\n", errors.Is(err, ErrSmallPages), Reserved(), minorFaults()-before)
	return 0
}

// churnChild, with THP off for the process, gives a reserve up for small
// pages (when giveUp) or makes none, then allocates, writes and drops
// churnMiB buffers of 1 MiB, eight of them live at a time, as vold's
// writes do, and prints the page faults per MiB written.
func churnChild(giveUp bool) int {
	if !disableTHP() {
		return 1
	}
	if giveUp {
		if _, err := Reserve(testReserve, true); !errors.Is(err, ErrSmallPages) {
			fmt.Fprintln(os.Stderr, "Reserve did not give up:", err)
			return 1
		}
	}
	live := make([][]byte, 8)
	before := minorFaults()
	for i := range churnMiB {
		b := make([]byte, 1<<20)
		for j := 0; j < len(b); j += pageSize {
			b[j] = byte(i)
		}
		live[i%len(live)] = b
	}
	runtime.KeepAlive(live)
	fmt.Printf("%.1f\n", float64(minorFaults()-before)/churnMiB)
	return 0
}

const churnMiB = 2048

// disableTHP turns transparent huge pages off for this process, so that
// the kernel populates a reserve in small pages.
func disableTHP() bool {
	if err := unix.Prctl(unix.PR_SET_THP_DISABLE, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "prctl:", err)
		return false
	}
	return true
}

func minorFaults() int64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Minflt
}

// TestReserveGivesUpSmallPages: where huge pages were asked for and the
// kernel populated small ones, there is no reserve, and the reserve was
// given up after its first probeSize bytes, not populated whole. In about
// one child in ten the runtime hands the reserve out in a span it zeroes
// itself, touching every page before the probe can look (see fill); so a
// child that faulted the whole reserve in is run again, up to three times.
func TestReserveGivesUpSmallPages(t *testing.T) {
	if raceEnabled {
		// Returning the given-up reserve faults in its shadow pages.
		t.Skip("the race detector's shadow memory faults in beside the heap: see raceEnabled")
	}
	whole := testReserve / pageSize
	var tries []int
	for range 3 {
		out := childOutput(t, "small")
		var small bool
		var reserved, faults int
		if _, err := fmt.Sscan(out, &small, &reserved, &faults); err != nil {
			t.Fatalf("child printed %q: %v", out, err)
		}
		if !small || reserved != 0 {
			t.Fatalf("a reserve populated in small pages: ErrSmallPages %v, Reserved %d; want true, 0", small, reserved)
		}
		// 96 MiB in small pages is 24,576 faults; the probe's 32 MiB 8,192.
		if faults <= whole/2 {
			return
		}
		tries = append(tries, faults)
	}
	t.Fatalf("giving up a reserve in small pages took %v faults in three children: it was populated whole (%d pages)", tries, whole)
}

// TestReserveKeepsHugePages: where the kernel gives huge pages for
// advice, a reserve asked for in them is made, wherever its span starts.
// Before the probe counted only its own population from the first
// huge-page boundary, the small pages of an unaligned head and the
// runtime's faults making the span passed its bound, and reserves in
// huge pages were given up (here 3 of 5 spans did not start on a
// boundary).
func TestReserveKeepsHugePages(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's shadow memory faults in beside the heap: see raceEnabled")
	}
	if b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled"); err != nil || strings.Contains(string(b), "[never]") {
		t.Skipf("no transparent huge pages here (%q, %v)", b, err)
	}
	givenUp, reallySmall := 0, 0
	const children = 6
	for range children {
		out := childOutput(t, "huge")
		var small bool
		var reserved int
		var faults int64
		if _, err := fmt.Sscan(out, &small, &reserved, &faults); err != nil {
			t.Fatalf("child printed %q: %v", out, err)
		}
		switch {
		case small && faults >= int64(probeSize/pageSize/2):
			reallySmall++
		case small || reserved != hugeTestReserve:
			givenUp++
		}
	}
	// A reserve whose probe, or whole, took a fault per small page was
	// in small pages, and right to be given up: on this project's VMs
	// 1 of 20 to 2 of 6 fresh processes met that for a while after a CI
	// run, with memory free and no THP fallback counted: their pages
	// were mapped small before a huge one was tried, why is not known
	// (the runtime zeroing the span before the advice, as fill's comment
	// allows, is one way). The
	// probe's mistake, which this test is for, gives up a reserve in huge
	// pages after a few hundred faults over its bound: one may be a race
	// with the kernel, more is the probe.
	t.Logf("%d of %d reserves in huge pages given up; %d more were in small pages", givenUp, children, reallySmall)
	if reallySmall == children {
		t.Fatalf("every child's reserve was populated in small pages: nothing checked")
	}
	if givenUp > 1 {
		t.Fatalf("%d of %d reserves asked for in huge pages were given up for small pages", givenUp, children)
	}
}

// TestGivenUpReserveLeavesNoChurn: a process whose reserve was given up
// for small pages writes fresh buffers with about as few page faults as
// one that never made a reserve. Before the reserve and its ballast were
// collected and returned at once, the writes after a give-up faulted
// about 26 pages per MiB, against 2.5–8.4 with no reserve, all along (a
// vold in that state wrote sequentially at 28–38 MB/s where one without
// a reserve wrote 105–130).
//
// Each kind of child runs three times, alternated, and the fewest faults
// of each kind are compared (a measurement, taken up to three times): on a loaded machine (the unit tests'
// packages run at once) single children of either kind fault 8–25 pages
// per MiB now and then, where the churn this test is about faulted every
// time.
func TestGivenUpReserveLeavesNoChurn(t *testing.T) {
	per := func(mode string) float64 {
		var f float64
		out := childOutput(t, mode)
		if _, err := fmt.Sscan(out, &f); err != nil {
			t.Fatalf("child %s printed %q: %v", mode, out, err)
		}
		return f
	}
	// The churn showed in every measurement; load can spoil one (`go
	// test ./pkg/...` once saw 20.1 against 4.5), so a failing one is taken
	// again, up to three times, and only a failure in every one counts.
	var none, givenUp float64
	for attempt := 1; attempt <= 3; attempt++ {
		var nones, givenUps []float64
		for range 3 {
			nones = append(nones, per("churn-none"))
			givenUps = append(givenUps, per("churn-given-up"))
		}
		none, givenUp = slices.Min(nones), slices.Min(givenUps)
		t.Logf("measurement %d: page faults per MiB written: %.1f with no reserve, %.1f after one given up (fewest of %v and %v)", attempt, none, givenUp, nones, givenUps)
		if givenUp <= none+10 {
			return
		}
	}
	t.Fatalf("after a reserve was given up the writes faulted %.1f pages per MiB, with none %.1f, in three measurements", givenUp, none)
}

func TestReserveTwiceAndZero(t *testing.T) {
	if n, err := Reserve(0, false); n != 0 || err != nil || Reserved() != 0 {
		t.Fatalf("Reserve(0, false) = %d, %v; Reserved %d", n, err, Reserved())
	}
	if _, err := Reserve(4<<20, false); err != nil {
		t.Fatal(err)
	}
	if Reserved() != 4<<20 {
		t.Fatalf("Reserved %d, want %d", Reserved(), 4<<20)
	}
	if n, err := Reserve(8<<20, false); n != 0 || err != nil || Reserved() != 4<<20 {
		t.Fatalf("second Reserve = %d, %v; Reserved %d, want the first one's", n, err, Reserved())
	}
}

const stallReserve = 512 << 20

// stallChild populates a reserve in the background while its main thread
// maps and unmaps memory, which takes the mmap lock for writing as the
// runtime does when it grows the heap, and prints how long the
// population took and the longest of those calls.
func stallChild() int {
	runtime.LockOSThread()
	done := make(chan error, 1)
	start := time.Now()
	ReserveInBackground(stallReserve, false, func(_ int, err error) { done <- err })
	var longest time.Duration
	for {
		select {
		case err := <-done:
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			fmt.Printf("%d %d\n", time.Since(start), longest)
			return 0
		default:
		}
		t := time.Now()
		m, err := unix.Mmap(-1, 0, 64<<10, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		unix.Munmap(m)
		longest = max(longest, time.Since(t))
	}
}

// TestReserveLetsTheProcessMapMemory: populating a reserve does not hold
// the process's mmap lock throughout, which stalled every thread that
// touched a fresh page once the runtime asked for it to grow the heap (a
// starting vold did not answer gRPC for 0.77 s). A thread mapping memory
// meanwhile waits for a chunk at most, a small part of the whole
// population. The median of three runs counts: a thread descheduled by a
// busy machine does not fail it, and neither does a population whose one
// call the kernel happened to let go of the lock in (it does when a fault
// has to wait, as in a slow one).
func TestReserveLetsTheProcessMapMemory(t *testing.T) {
	var ratios []float64
	for range 3 {
		out := childOutput(t, "stall")
		var took, longest time.Duration
		if _, err := fmt.Sscan(out, &took, &longest); err != nil {
			t.Fatalf("child printed %q: %v", out, err)
		}
		t.Logf("populating %d MiB took %v; the longest mmap meanwhile %v", stallReserve>>20, took, longest)
		ratios = append(ratios, float64(longest)/float64(took))
	}
	slices.Sort(ratios)
	if ratios[1] > 0.5 {
		t.Fatalf("mappings waited for %.0f%% of the population (median of %.2f): it holds the mmap lock throughout", ratios[1]*100, ratios)
	}
}
