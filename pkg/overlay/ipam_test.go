package overlay

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

func TestIPAMBasics(t *testing.T) {
	p, err := NewIPAM(netip.MustParsePrefix("10.42.7.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	if p.Gateway() != netip.MustParseAddr("10.42.7.1") || p.Cap() != 253 {
		t.Fatalf("gateway %v cap %d", p.Gateway(), p.Cap())
	}
	a, _ := p.Allocate("t1")
	b, _ := p.Allocate("t2")
	if a != netip.MustParseAddr("10.42.7.2") || b != netip.MustParseAddr("10.42.7.3") {
		t.Fatalf("first addresses %v %v", a, b)
	}
	if again, _ := p.Allocate("t1"); again != a {
		t.Fatalf("Allocate is not idempotent: %v", again)
	}
	if got, ok := p.Release("t1"); !ok || got != a {
		t.Fatalf("Release = %v, %v", got, ok)
	}
	if _, ok := p.Release("t1"); ok {
		t.Fatal("double release")
	}
	// Next-fit: the released .2 is not reused before the rest.
	c, _ := p.Allocate("t3")
	if c != netip.MustParseAddr("10.42.7.4") {
		t.Fatalf("after release got %v", c)
	}
	if _, err := p.Allocate(""); err == nil {
		t.Fatal("empty owner accepted")
	}
	for i := p.Len(); i < p.Cap(); i++ {
		if _, err := p.Allocate(fmt.Sprint("fill", i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.Allocate("one-too-many"); !errors.Is(err, ErrFull) {
		t.Fatalf("full: %v", err)
	}
	if o, ok := p.Owner(netip.MustParseAddr("10.42.7.254")); !ok || o == "" {
		t.Fatal(".254 not allocated when full")
	}
	for _, s := range []string{"10.42.7.0/31", "10.42.7.1/24", "fd00::/64", "10.0.0.0/7"} {
		if _, err := NewIPAM(netip.MustParsePrefix(s)); err == nil {
			t.Errorf("NewIPAM(%s) accepted", s)
		}
	}
}

func TestIPAMJSON(t *testing.T) {
	p, _ := NewIPAM(netip.MustParsePrefix("10.42.7.0/24"))
	p.Allocate("b")
	p.Allocate("a")
	p.Allocate("c")
	p.Release("a")
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"subnet":"10.42.7.0/24","last":"10.42.7.4","allocations":[{"addr":"10.42.7.2","owner":"b"},{"addr":"10.42.7.4","owner":"c"}]}`
	if string(b) != want {
		t.Fatalf("JSON\n got %s\nwant %s", b, want)
	}
	var q IPAM
	if err := json.Unmarshal(b, &q); err != nil {
		t.Fatal(err)
	}
	if a, _ := q.Allocate("d"); a != netip.MustParseAddr("10.42.7.5") {
		t.Fatalf("after decode allocated %v", a)
	}
	for _, bad := range []string{
		`{"subnet":"10.42.7.0/24","allocations":[{"addr":"10.42.7.1","owner":"x"}]}`,
		`{"subnet":"10.42.7.0/24","allocations":[{"addr":"10.42.7.255","owner":"x"}]}`,
		`{"subnet":"10.42.7.0/24","allocations":[{"addr":"10.42.8.2","owner":"x"}]}`,
		`{"subnet":"10.42.7.0/24","allocations":[{"addr":"10.42.7.2","owner":""}]}`,
		`{"subnet":"10.42.7.0/24","allocations":[{"addr":"10.42.7.2","owner":"x"},{"addr":"10.42.7.2","owner":"y"}]}`,
		`{"subnet":"10.42.7.0/24","allocations":[{"addr":"10.42.7.2","owner":"x"},{"addr":"10.42.7.3","owner":"x"}]}`,
		`{"subnet":"10.42.7.0/24","last":"10.42.8.1"}`,
		`{"subnet":"10.42.7.5/24"}`,
		`{"subnet":""}`,
		`[]`,
	} {
		var r IPAM
		if err := json.Unmarshal([]byte(bad), &r); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
}

// TestPropertyIPAM runs random allocations and releases (with JSON round
// trips in between) against a model: addresses are unique, allocatable,
// stable per owner, ErrFull exactly when full; a decoded copy behaves
// exactly like the original.
func TestPropertyIPAM(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		bits := rapid.IntRange(26, 30).Draw(t, "bits")
		subnet := netip.PrefixFrom(netip.MustParseAddr("10.42.7.0"), bits).Masked()
		p, err := NewIPAM(subnet)
		if err != nil {
			t.Fatal(err)
		}
		first, last := p.Gateway().Next(), netip.Addr{}
		model := map[string]netip.Addr{}
		owners := []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q", "r", "s", "t", "u", "v", "w", "x", "y", "z"}
		for step := range rapid.IntRange(1, 120).Draw(t, "steps") {
			owner := rapid.SampledFrom(owners).Draw(t, "owner")
			switch rapid.IntRange(0, 4).Draw(t, "op") {
			case 0, 1, 2:
				a, err := p.Allocate(owner)
				if prev, ok := model[owner]; ok {
					if err != nil || a != prev {
						t.Fatalf("step %d: re-allocate %s = %v, %v; had %v", step, owner, a, err, prev)
					}
					continue
				}
				if len(model) == p.Cap() {
					if !errors.Is(err, ErrFull) {
						t.Fatalf("step %d: full but %v, %v", step, a, err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("step %d: %v with %d of %d", step, err, len(model), p.Cap())
				}
				if !subnet.Contains(a) || a.Compare(first) < 0 || a == p.Gateway() || !subnet.Contains(a.Next()) {
					t.Fatalf("step %d: allocated %v", step, a)
				}
				for o, b := range model {
					if b == a {
						t.Fatalf("step %d: %v given to %s and %s", step, a, o, owner)
					}
				}
				// Next-fit: nothing free strictly between the previous
				// allocation and this one (cyclically).
				if last.IsValid() {
					for x := next(p, last); x != a; x = next(p, x) {
						if _, used := p.Owner(x); !used {
							t.Fatalf("step %d: skipped free %v (last %v, got %v)", step, x, last, a)
						}
					}
				}
				model[owner], last = a, a
			case 3:
				a, ok := p.Release(owner)
				prev, had := model[owner]
				if ok != had || a != prev {
					t.Fatalf("step %d: release %s = %v, %v; model %v, %v", step, owner, a, ok, prev, had)
				}
				delete(model, owner)
			case 4:
				b, err := json.Marshal(p)
				if err != nil {
					t.Fatal(err)
				}
				var q IPAM
				if err := json.Unmarshal(b, &q); err != nil {
					t.Fatalf("step %d: decode %s: %v", step, b, err)
				}
				b2, _ := json.Marshal(&q)
				if string(b) != string(b2) {
					t.Fatalf("round trip\n%s\n%s", b, b2)
				}
				// The copy allocates like the original would.
				c1, c2 := deepCopy(p), clone(t, &q)
				for _, o := range owners[:5] {
					x, e1 := c1.Allocate(o + "-probe")
					y, e2 := c2.Allocate(o + "-probe")
					if x != y || (e1 == nil) != (e2 == nil) {
						t.Fatalf("decoded copy diverges: %v %v / %v %v", x, e1, y, e2)
					}
				}
				p = &q
			}
			if p.Len() != len(model) {
				t.Fatalf("Len %d, model %d", p.Len(), len(model))
			}
			allocs := p.Allocations()
			if !slices.IsSortedFunc(allocs, func(x, y Allocation) int { return x.Addr.Compare(y.Addr) }) {
				t.Fatalf("allocations not sorted: %v", allocs)
			}
			for _, al := range allocs {
				if model[al.Owner] != al.Addr {
					t.Fatalf("allocation %v not in model", al)
				}
			}
		}
	})
}

func next(p *IPAM, a netip.Addr) netip.Addr {
	a = a.Next()
	if !p.Subnet().Contains(a.Next()) { // a is the broadcast address
		a = p.Gateway().Next()
	}
	return a
}

func deepCopy(p *IPAM) *IPAM {
	q := *p
	q.byAddr, q.byOwner = maps.Clone(p.byAddr), maps.Clone(p.byOwner)
	return &q
}

func clone(t *rapid.T, p *IPAM) *IPAM {
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var q IPAM
	if err := json.Unmarshal(b, &q); err != nil {
		t.Fatal(err)
	}
	return &q
}

// FuzzIPAMUnmarshal: any ipam.json either fails to decode or decodes to an
// IPAM that re-encodes to the same thing and allocates only valid,
// unused addresses.
func FuzzIPAMUnmarshal(f *testing.F) {
	f.Add([]byte(`{"subnet":"10.42.7.0/24","last":"10.42.7.4","allocations":[{"addr":"10.42.7.2","owner":"b"},{"addr":"10.42.7.4","owner":"c"}]}`))
	f.Add([]byte(`{"subnet":"10.42.7.0/30","allocations":[{"addr":"10.42.7.2","owner":"x"}]}`))
	f.Add([]byte(`{"subnet":"10.42.7.0/24","last":"10.42.7.1"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var p IPAM
		if json.Unmarshal(b, &p) != nil {
			return
		}
		enc, err := json.Marshal(&p)
		if err != nil {
			t.Fatal(err)
		}
		var q IPAM
		if err := json.Unmarshal(enc, &q); err != nil {
			t.Fatalf("re-decode %s: %v", enc, err)
		}
		if enc2, _ := json.Marshal(&q); string(enc2) != string(enc) {
			t.Fatalf("not stable:\n%s\n%s", enc, enc2)
		}
		before := p.Len()
		a, err := p.Allocate("fuzz-new-owner")
		if errors.Is(err, ErrFull) {
			if before != p.Cap() {
				t.Fatalf("ErrFull at %d of %d", before, p.Cap())
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if !p.Subnet().Contains(a) || a == p.Gateway() || a == p.Subnet().Addr() || !p.Subnet().Contains(a.Next()) {
			t.Fatalf("allocated %v in %v", a, p.Subnet())
		}
		if _, used := q.Owner(a); used {
			t.Fatalf("allocated %v, already in use", a)
		}
	})
}
