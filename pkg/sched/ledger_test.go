package sched_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/shoal-dev/shoal/pkg/sched"
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func res(id string, cpu, mem int64, ports ...int) sched.Reservation {
	r := sched.Reservation{TaskID: id, Service: "web", Resources: sched.Resources{CPUMillis: cpu, MemoryBytes: mem}}
	for _, p := range ports {
		r.Ports = append(r.Ports, sched.Port{Host: p, Container: p, Mode: sched.PortHost})
	}
	return r
}

func TestLedger(t *testing.T) {
	l := sched.NewLedger(sched.Resources{CPUMillis: 1000, MemoryBytes: 1000}, 10*time.Second)
	step := func(what string, ok, want bool) {
		t.Helper()
		if ok != want {
			t.Fatalf("%s = %v, want %v", what, ok, want)
		}
	}
	ok, free, _ := l.Reserve(res("a", 600, 100, 80), t0)
	step("reserve a", ok, true)
	if free != (sched.Resources{CPUMillis: 400, MemoryBytes: 900}) {
		t.Fatalf("free after a = %v", free)
	}
	ok, free, why := l.Reserve(res("b", 500, 100), t0)
	step("reserve b (cpu)", ok, false)
	if why.Class != sched.RejectCPU || free.CPUMillis != 400 {
		t.Fatalf("reject b: %v, free %v", why, free)
	}
	ok, _, why = l.Reserve(res("c", 100, 100, 80), t0)
	step("reserve c (port 80 taken)", ok, false)
	if why.Class != sched.RejectPort || why.Detail != "80/tcp" {
		t.Fatalf("reject c: %v", why)
	}
	ok, _, _ = l.Reserve(res("a", 600, 100, 80), t0.Add(time.Second))
	step("reserve a again (a retried call)", ok, true)
	if u := l.Usage(); u.CPUMillis != 600 {
		t.Fatalf("a counted twice: %v", u)
	}
	ok, _, _ = l.Reserve(res("d", 400, 900), t0.Add(2*time.Second))
	step("reserve d (exactly full)", ok, true)
	step("confirm a", l.Confirm("a"), true)
	step("confirm unknown", l.Confirm("zz"), false)

	// Unconfirmed d expires 10s after it was made; confirmed a never.
	if got := l.Expire(t0.Add(11 * time.Second)); len(got) != 0 {
		t.Fatalf("expired early: %v", got)
	}
	got := l.Expire(t0.Add(12 * time.Second))
	if len(got) != 1 || got[0].TaskID != "d" {
		t.Fatalf("Expire = %+v, want d", got)
	}
	step("release a", l.Release("a"), true)
	step("release a twice", l.Release("a"), false)
	if u := l.Usage(); u != (sched.Resources{}) {
		t.Fatalf("usage after releasing everything: %v", u)
	}
	ok, _, _ = l.Reserve(res("e", 100, 100, 80), t0)
	step("port 80 is free again", ok, true)

	// Adopt ignores capacity (the tasks were admitted before a cut).
	l.SetCapacity(sched.Resources{CPUMillis: 50, MemoryBytes: 50})
	l.Adopt(res("f", 100, 100))
	if f := l.Free(); f.CPUMillis != -150 {
		t.Fatalf("free after adopting over capacity: %v", f)
	}
	if r, ok := l.Get("f"); !ok || !r.Confirmed {
		t.Fatalf("adopted reservation: %+v %v", r, ok)
	}
	ok, _, _ = l.Reserve(res("g", 0, 0), t0)
	step("even a zero reservation on an overfull node", ok, false)
	l.SetCapacity(sched.Resources{CPUMillis: 300, MemoryBytes: 300}) // e and f hold 200
	ok, _, _ = l.Reserve(res("h", 100, 100), t0)
	step("reserve h after the capacity grew back", ok, true)
}

// TestLedgerNeverOvercommits: whatever several owners reserve, confirm,
// release and let expire, in any order, the live reservations never
// exceed capacity and the ledger's sums match its entries.
func TestLedgerNeverOvercommits(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		capa := sched.Resources{CPUMillis: rapid.Int64Range(0, 4000).Draw(t, "cpu"), MemoryBytes: rapid.Int64Range(0, 4096).Draw(t, "mem")}
		l := sched.NewLedger(capa, 5*time.Second)
		now := t0
		ids := 0
		owners := rapid.IntRange(1, 4).Draw(t, "owners")
		held := make([][]string, owners)
		for range rapid.IntRange(1, 200).Draw(t, "steps") {
			o := rapid.IntRange(0, owners-1).Draw(t, "owner")
			switch rapid.IntRange(0, 4).Draw(t, "op") {
			case 0, 1:
				ids++
				id := fmt.Sprintf("o%d-%d", o, ids)
				var ports []int
				if rapid.Bool().Draw(t, "port") {
					ports = []int{rapid.IntRange(1, 3).Draw(t, "portnum")}
				}
				r := res(id, rapid.Int64Range(0, 1500).Draw(t, "rcpu"), rapid.Int64Range(0, 1500).Draw(t, "rmem"), ports...)
				if ok, _, _ := l.Reserve(r, now); ok {
					held[o] = append(held[o], id)
				}
			case 2:
				if len(held[o]) > 0 {
					i := rapid.IntRange(0, len(held[o])-1).Draw(t, "which")
					l.Release(held[o][i])
					held[o] = append(held[o][:i], held[o][i+1:]...)
				}
			case 3:
				if len(held[o]) > 0 {
					l.Confirm(held[o][rapid.IntRange(0, len(held[o])-1).Draw(t, "which")])
				}
			case 4:
				now = now.Add(time.Duration(rapid.IntRange(0, 3000).Draw(t, "ms")) * time.Millisecond)
				l.Expire(now)
			}
			var sum sched.Resources
			ports := map[string]bool{}
			for _, r := range l.Reservations() {
				sum = sum.Add(r.Resources)
				for _, p := range r.Ports {
					k := p.String()
					if ports[k] {
						t.Fatalf("host port %s held twice", k)
					}
					ports[k] = true
				}
			}
			if sum != l.Usage() {
				t.Fatalf("Usage() = %v, entries sum to %v", l.Usage(), sum)
			}
			if !sum.Fits(capa) {
				t.Fatalf("overcommitted: %v on capacity %v", sum, capa)
			}
		}
	})
}

// TestLedgerConcurrent hammers one ledger from several goroutines (run with
// -race): the usage never exceeds capacity and returns to zero.
func TestLedgerConcurrent(t *testing.T) {
	capa := sched.Resources{CPUMillis: 1000, MemoryBytes: 1000}
	l := sched.NewLedger(capa, time.Second)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var overs int
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				id := fmt.Sprintf("g%d-%d", g, i)
				if ok, _, _ := l.Reserve(res(id, 70, 30), t0); ok {
					if u := l.Usage(); !u.Fits(capa) {
						mu.Lock()
						overs++
						mu.Unlock()
					}
					if i%3 == 0 {
						l.Confirm(id)
					}
					l.Release(id)
				}
			}
		}()
	}
	wg.Wait()
	if overs > 0 || l.Usage() != (sched.Resources{}) {
		t.Fatalf("overcommitted %d times; final usage %v", overs, l.Usage())
	}
}
