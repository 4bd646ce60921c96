package hugeheap

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// madvPopulateWrite is MADV_POPULATE_WRITE (Linux 5.14): the kernel
// faults the range in writable in one call.
const madvPopulateWrite = 23

var (
	// reserveMu is held while a reserve is made, in the background too.
	reserveMu sync.Mutex
	// ballast is never touched: it only counts as live heap, so that the
	// collector's goal, and the memory its scavenger keeps, stay above
	// the reserve. Its pages are never faulted in.
	ballast []byte
	// reserved is len(ballast), read without waiting for a reserve being
	// made.
	reserved atomic.Int64
)

// Reserve makes n bytes of heap memory resident before anything uses
// them, and keeps the runtime from handing them back to the kernel, so
// that the process's allocations up to that size land on pages that are
// already mapped: what -Xms with AlwaysPreTouch does for a JVM.
//
// Why: a page touched for the first time is a page fault, and on the
// project's paravirtualized VMs each fault exits to the hypervisor:
// touching fresh memory cost 2.7 ms per MiB in 4 KiB pages and 0.2–1.8
// ms in huge pages, where the kernel populating the same range with
// madvise took 0.05–0.13 ms per MiB. vold holds each volume's data
// in memory and allocates a megabyte buffer per written megabyte on
// every replica, so fresh heap was the largest cost of sequential
// writes.
//
// How: n fresh bytes are allocated (a span straight from the kernel,
// which the runtime does not zero), advised for huge pages if huge,
// populated with MADV_POPULATE_WRITE (or touched page by page where the
// kernel lacks it) and dropped; a ballast of n bytes that is never
// touched stays live. The collector then next runs once the heap reaches
// twice n plus the live data, so until then the heap grows into the
// reserve, and its scavenger, which keeps about 1.1 times that goal,
// returns none of it: what a collection frees stays mapped for the next
// cycle. The cost is resident memory: n from the start, and up to n plus
// twice the live data (the first cycle's excess over n faults in fresh
// pages as before). Call it early, before the heap has free spans of n
// bytes (a reused span is zeroed by the runtime, a slow first touch).
// When huge pages were asked for and the kernel populated small ones,
// Reserve gives the reserve up (ErrSmallPages) and returns its memory to
// the kernel at once: on the project's VMs,
// runs with reserves populated in small pages were slower in every
// figure, the local file system's included, and an idle vold whose
// reserve was in small pages used 1.8% of a core where two in huge pages
// used 1.2–1.3%, which suggests the hypervisor's cost of mapping many
// small pages. It returns how many bytes the kernel populated with madvise
// (0 when it fell back to touching). Later calls do nothing.
func Reserve(n int, huge bool) (int, error) {
	reserveMu.Lock()
	defer reserveMu.Unlock()
	if !makeBallast(n) {
		return 0, nil
	}
	return fill(n, huge)
}

// ReserveInBackground is Reserve with the reserve allocated and
// populated on a goroutine of its own, which takes seconds for a GiB on
// the project's VMs (more when the runtime zeroes the span it hands out,
// page by page in small pages): the ballast is made before it returns,
// so the collector's goal is as with Reserve, and only allocations made
// while the population runs land on fresh pages, as without a reserve.
// A daemon that calls it serves at once (vold's mounts wait while no
// vold runs). done, when not nil, gets Reserve's results on that
// goroutine.
func ReserveInBackground(n int, huge bool, done func(populated int, err error)) {
	reserveMu.Lock()
	if !makeBallast(n) {
		reserveMu.Unlock()
		if done != nil {
			done(0, nil)
		}
		return
	}
	go func() {
		p, err := fill(n, huge)
		reserveMu.Unlock()
		if done != nil {
			done(p, err)
		}
	}()
}

// makeBallast makes the ballast of a reserve of n bytes, unless there is
// one. reserveMu is held.
func makeBallast(n int) bool {
	if n <= 0 || ballast != nil {
		return false
	}
	// The ballast first, and a collection that sees it: the heap's goal
	// is then above the reserve when the reserve is allocated, so growing
	// the heap for it does not make the scavenger return memory.
	ballast = make([]byte, n)
	reserved.Store(int64(n))
	runtime.GC()
	return true
}

// fill allocates the reserve, populates it and drops it, or gives the
// reserve up. reserveMu is held.
func fill(n int, huge bool) (int, error) {
	// Faults are counted from before the allocation: the runtime
	// sometimes hands out a span it has to zero, and then make itself
	// touches every page, before the advice below could ask for huge ones.
	// They are this thread's: other goroutines fault pages meanwhile.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start := threadFaults()
	faults := func() int64 { return threadFaults() - start }
	giveUp := func(err error) (int, error) {
		ballast = nil
		reserved.Store(0)
		// Collected and returned now, the dead ballast and reserve leave
		// the process as one that never made a reserve. Left to the
		// collector's next cycles and the scavenger, they stayed free
		// heap that allocations kept faulting pages in from: ten times
		// the faults per MiB written (TestGivenUpReserveLeavesNoChurn),
		// and a third of the sequential write rate in bench/vold.
		debug.FreeOSMemory()
		return 0, err
	}
	b := make([]byte, n)
	if huge {
		adviseRange(b)
	}
	var populated int
	var err error
	if head := hugeHead(b); huge && n > head+probeSize {
		// probeSize bytes tell whether the kernel gives huge pages: in
		// small ones the whole reserve would be a page fault per 4 KiB,
		// only to be given up. They are counted from the reserve's first
		// huge-page boundary, and only while they are populated: the
		// kernel maps the head before that boundary in small pages
		// whatever the advice, and making the span faults the runtime's
		// own pages (about 300 here). Counted from before the make, as
		// they were, those alone passed the probe's bound for most
		// reserves that did not start on a boundary, and vold gave up
		// reserves that were in huge pages (docs/VOLUMES-PERFORMANCE.md).
		populated, err = populate(b[:head])
		if err == nil {
			before := threadFaults()
			var probe, rest int
			probe, err = populate(b[head : head+probeSize])
			populated += probe
			if f := threadFaults() - before; err == nil && f > int64(probeSize/smallPageShare) {
				return giveUp(fmt.Errorf("hugeheap: %d bytes of a reserve of %d were populated in small pages (%d faults): %w", probeSize, n, f, ErrSmallPages))
			}
			if err == nil {
				rest, err = populate(b[head+probeSize:])
				populated += rest
			}
		}
	} else {
		populated, err = populate(b)
	}
	if err == nil && huge && faults() > int64(n/smallPageShare) {
		// Huge pages were asked for and the kernel populated small ones:
		// on the project's VMs a heap kept in small pages made every
		// process slower (see above), so no reserve at all.
		return giveUp(fmt.Errorf("hugeheap: a reserve of %d bytes was populated in small pages (%d faults): %w", n, faults(), ErrSmallPages))
	}
	switch {
	case errors.Is(err, unix.EINVAL):
		// A kernel before 5.14: touch each page, the same memory in the end.
		for i := 0; i < len(b); i += pageSize {
			b[i] = 0
		}
	case err != nil:
		return giveUp(fmt.Errorf("hugeheap: populating a reserve of %d bytes: %w", n, err))
	}
	runtime.KeepAlive(b)
	b = nil
	runtime.GC()
	return populated, nil
}

// ErrSmallPages is why Reserve gave up a reserve of huge pages.
var ErrSmallPages = errors.New("no huge pages")

// probeSize is how much of a reserve is populated before the rest, to
// learn whether the kernel gives it huge pages.
const probeSize = 32 << 20

// smallPageShare is the page size below which a reserve's average fault
// counts as small pages: huge pages take one fault per 2 MiB, small ones
// one per 4 KiB.
const smallPageShare = 64 << 10

// threadFaults is the calling thread's minor faults (lock the goroutine
// to it).
func threadFaults() int64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		return 0
	}
	return ru.Minflt
}

// pageSize is the smallest page a touch has to reach.
var pageSize = unix.Getpagesize()

// populateChunk is how much one MADV_POPULATE_WRITE call faults in. The
// call holds the process's mmap lock for reading throughout, and once the
// Go runtime asks for it for writing (mapping more heap) every other
// thread's page fault queues behind that: one call for a whole GiB
// stalled a starting vold's gRPC answers for 0.77 s on this VM (the
// population took 1.9 s), and for over 2 s in a CI run. In chunks of
// this size the lock is let go every few milliseconds.
const populateChunk = 8 << 20

// populate faults b's whole pages in writable, populateChunk at a time.
func populate(b []byte) (int, error) {
	lo, hi := pages(b)
	for at := lo; at < hi; at += populateChunk {
		n := min(hi-at, populateChunk)
		if _, _, e := unix.Syscall(unix.SYS_MADVISE, at, n, madvPopulateWrite); e != 0 {
			return 0, e
		}
	}
	return int(max(hi, lo) - lo), nil
}

// adviseRange asks for huge pages for b's whole pages (best effort).
func adviseRange(b []byte) {
	if lo, hi := pages(b); hi > lo {
		_, _, _ = unix.Syscall(unix.SYS_MADVISE, lo, hi-lo, unix.MADV_HUGEPAGE)
	}
}

// hugePage is the size of a transparent huge page on x86-64 and arm64
// (with 4 KiB pages).
const hugePage = 2 << 20

// hugeHead returns how many of b's bytes come before its first huge-page
// boundary.
func hugeHead(b []byte) int {
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return min(int((hugePage-start%hugePage)%hugePage), len(b))
}

// pages returns the page-aligned address range inside b.
func pages(b []byte) (lo, hi uintptr) {
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	end := start + uintptr(len(b))
	ps := uintptr(pageSize)
	return (start + ps - 1) &^ (ps - 1), end &^ (ps - 1)
}

// Reserved returns the bytes Reserve holds (0 before it ran, or once it
// gave the reserve up).
func Reserved() int { return int(reserved.Load()) }
