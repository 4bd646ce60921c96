package hugeheap

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"

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
	testReserve = 96 << 20
	testAlloc   = 16 << 20
	testRounds  = 4
)

// reserveChild prints its RSS after the optional reserve and the page
// faults that allocating and writing testRounds fresh buffers took, with
// a collection between rounds.
func reserveChild(mode string) int {
	if mode == "reserve" {
		if _, err := Reserve(testReserve, false); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	rss := vmRSS()
	var sink [][]byte
	before := minorFaults()
	for r := 0; r < testRounds; r++ {
		b := make([]byte, testAlloc)
		for i := range b {
			b[i] = byte(i)
		}
		sink = append(sink[:0], b)
		runtime.GC()
	}
	runtime.KeepAlive(sink)
	fmt.Printf("%d %d\n", rss, minorFaults()-before)
	return 0
}

func minorFaults() int64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return ru.Minflt
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

func runReserveChild(t *testing.T, mode string) (rss, faults int64) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+mode, "GOGC=100", "GOMEMLIMIT=off")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child %s: %v", mode, err)
	}
	if _, err := fmt.Sscan(string(out), &rss, &faults); err != nil {
		t.Fatalf("child %s printed %q: %v", mode, out, err)
	}
	return rss, faults
}

// TestReserveFaultsMemoryInAhead: a process with a reserve is resident
// by the reserve's size at once, and writing new buffers afterwards, a
// collection between each, faults next to nothing, where a process
// without one faults in every page it writes.
func TestReserveFaultsMemoryInAhead(t *testing.T) {
	plainRSS, plainFaults := runReserveChild(t, "none")
	rss, faults := runReserveChild(t, "reserve")
	t.Logf("without a reserve: RSS %d MiB, %d faults for %d × %d MiB; with %d MiB reserved: RSS %d MiB, %d faults",
		plainRSS>>20, plainFaults, testRounds, testAlloc>>20, testReserve>>20, rss>>20, faults)
	if rss < plainRSS+testReserve*9/10 {
		t.Errorf("RSS after the reserve %d MiB, want at least %d MiB more than without (%d MiB)", rss>>20, testReserve*9/10>>20, plainRSS>>20)
	}
	// 16 MiB is at least 8 faults even in huge pages, 4096 in small ones.
	if plainFaults < testAlloc/(2<<20) {
		t.Fatalf("without a reserve, writing %d MiB faulted %d times: the measure does not see faults", testAlloc>>20, plainFaults)
	}
	if faults*4 > plainFaults {
		t.Errorf("with a reserve, %d faults; want under a quarter of the %d without", faults, plainFaults)
	}
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
