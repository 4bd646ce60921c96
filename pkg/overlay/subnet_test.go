package overlay

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

var defaultOverlay = netip.MustParsePrefix("10.42.0.0/16")

func TestValidateOverlay(t *testing.T) {
	for _, s := range []string{"10.42.0.0/16", "10.0.0.0/8", "192.168.7.0/24", "10.42.0.0/23"} {
		if err := ValidateOverlay(netip.MustParsePrefix(s)); err != nil {
			t.Errorf("%s: %v", s, err)
		}
	}
	for _, s := range []string{"10.42.1.0/16", "10.0.0.0/7", "10.42.0.0/25", "fd00::/48"} {
		if err := ValidateOverlay(netip.MustParsePrefix(s)); err == nil {
			t.Errorf("%s: accepted", s)
		}
	}
	if err := ValidateOverlay(netip.Prefix{}); err == nil {
		t.Error("zero prefix accepted")
	}
}

func TestSubnetAtIndex(t *testing.T) {
	n, err := SubnetCount(defaultOverlay)
	if err != nil || n != 256 {
		t.Fatalf("SubnetCount = %d, %v", n, err)
	}
	if got := SubnetAt(defaultOverlay, 7); got != netip.MustParsePrefix("10.42.7.0/24") {
		t.Errorf("SubnetAt(7) = %v", got)
	}
	if i, ok := SubnetIndex(defaultOverlay, netip.MustParsePrefix("10.42.255.0/24")); !ok || i != 255 {
		t.Errorf("SubnetIndex(10.42.255.0/24) = %d, %v", i, ok)
	}
	for _, s := range []string{"10.43.0.0/24", "10.42.7.0/25", "10.42.7.1/24", "10.42.0.0/16"} {
		if _, ok := SubnetIndex(defaultOverlay, netip.MustParsePrefix(s)); ok {
			t.Errorf("SubnetIndex(%s) ok", s)
		}
	}
	wide := netip.MustParsePrefix("10.0.0.0/8")
	if got := SubnetAt(wide, 65535); got != netip.MustParsePrefix("10.255.255.0/24") {
		t.Errorf("SubnetAt(/8, 65535) = %v", got)
	}
}

func TestReservedAndUsable(t *testing.T) {
	for _, c := range []struct {
		subnet string
		want   bool
	}{
		{"10.42.0.0/24", false},
		{"10.42.1.0/24", true},
		{"10.42.254.0/24", true},
		{"10.42.255.0/24", false},
		{"10.43.1.0/24", false},
	} {
		if got := Usable(defaultOverlay, netip.MustParsePrefix(c.subnet)); got != c.want {
			t.Errorf("Usable(%s) = %v", c.subnet, got)
		}
	}
	// An overlay of two /24s keeps both.
	small := netip.MustParsePrefix("10.42.0.0/23")
	if !Usable(small, netip.MustParsePrefix("10.42.0.0/24")) || !Usable(small, netip.MustParsePrefix("10.42.1.0/24")) {
		t.Error("a /23 overlay reserves a subnet")
	}
}

func TestSubnetKey(t *testing.T) {
	p := netip.MustParsePrefix("10.42.7.0/24")
	if k := SubnetKey(p); k != "10.42.7.0" {
		t.Errorf("SubnetKey = %q", k)
	}
	if got, err := ParseSubnetKey("10.42.7.0"); err != nil || got != p {
		t.Errorf("ParseSubnetKey = %v, %v", got, err)
	}
	for _, k := range []string{"10.42.7.1", "10.42.7.0/24", "fd00::", ""} {
		if _, err := ParseSubnetKey(k); err == nil {
			t.Errorf("ParseSubnetKey(%q) accepted", k)
		}
	}
}

// TestPreferredIndexStable pins the hash: changing it would move every
// node that restarts without its local claim.
func TestPreferredIndexStable(t *testing.T) {
	// SHA-256("a") = ca978112ca1bbdca…; 0xca978112ca1bbdca mod 256 = 0xca.
	if got := PreferredIndex("a", 256); got != 0xca {
		t.Errorf("PreferredIndex(a, 256) = %#x, want 0xca", got)
	}
	if got := PreferredIndex("a", 0); got != 0 {
		t.Errorf("PreferredIndex(a, 0) = %d", got)
	}
}

func TestClaimSubnetExamples(t *testing.T) {
	id := "a" // prefers index 0xca = 10.42.202.0/24
	pref := netip.MustParsePrefix("10.42.202.0/24")
	next := netip.MustParsePrefix("10.42.203.0/24")

	d, err := ClaimSubnet(defaultOverlay, id, netip.Prefix{}, nil)
	if err != nil || d.Subnet != pref || !d.Write || d.Previous != ClaimNone {
		t.Errorf("fresh: %+v, %v", d, err)
	}
	// The preferred subnet is taken: probe upward.
	d, _ = ClaimSubnet(defaultOverlay, id, netip.Prefix{}, Claims{pref: "b"})
	if d.Subnet != next || !d.Write {
		t.Errorf("taken: %+v", d)
	}
	// Held: nothing to write.
	d, _ = ClaimSubnet(defaultOverlay, id, next, Claims{pref: "b", next: id})
	if d.Subnet != next || d.Write || d.Previous != ClaimHeld {
		t.Errorf("held: %+v", d)
	}
	// Pending: write it again.
	d, _ = ClaimSubnet(defaultOverlay, id, next, Claims{pref: "b"})
	if d.Subnet != next || !d.Write || d.Previous != ClaimPending {
		t.Errorf("pending: %+v", d)
	}
	// Lost to c: claim again, the preferred one is b's, so the one after.
	d, _ = ClaimSubnet(defaultOverlay, id, next, Claims{pref: "b", next: "c"})
	if want := netip.MustParsePrefix("10.42.204.0/24"); d.Subnet != want || !d.Write || d.Previous != ClaimLost {
		t.Errorf("lost: %+v", d)
	}
	// Invalid (overlay changed): state already gives us one; adopt it and
	// release the other.
	old := netip.MustParsePrefix("10.42.9.0/24")
	mine := netip.MustParsePrefix("10.42.30.0/24")
	d, _ = ClaimSubnet(defaultOverlay, id, netip.MustParsePrefix("10.43.5.0/24"), Claims{mine: id, old: id, next: id})
	if d.Subnet != next || d.Write || d.Previous != ClaimInvalid || !slices.Equal(d.Release, []netip.Prefix{old, mine}) {
		t.Errorf("invalid: %+v", d)
	}
	// Wrap around past the reserved last subnet.
	claims := Claims{}
	for i := 202; i < 256; i++ {
		claims[SubnetAt(defaultOverlay, i)] = "x"
	}
	d, _ = ClaimSubnet(defaultOverlay, id, netip.Prefix{}, claims)
	if want := netip.MustParsePrefix("10.42.1.0/24"); d.Subnet != want {
		t.Errorf("wrap: %+v", d)
	}
	// Full.
	for i := 1; i < 255; i++ {
		claims[SubnetAt(defaultOverlay, i)] = fmt.Sprint("n", i)
	}
	if _, err := ClaimSubnet(defaultOverlay, id, netip.Prefix{}, claims); !errors.Is(err, ErrNoSubnet) {
		t.Errorf("full: %v", err)
	}
	if _, err := ClaimSubnet(defaultOverlay, "", netip.Prefix{}, nil); err == nil {
		t.Error("empty node ID accepted")
	}
	if _, err := ClaimSubnet(netip.MustParsePrefix("10.42.0.0/25"), id, netip.Prefix{}, nil); err == nil {
		t.Error("bad overlay accepted")
	}
}

// genOverlay draws a small overlay, so that claims collide often.
func genOverlay() *rapid.Generator[netip.Prefix] {
	return rapid.Custom(func(t *rapid.T) netip.Prefix {
		bits := rapid.IntRange(19, 24).Draw(t, "bits")
		return netip.PrefixFrom(netip.MustParseAddr("10.42.0.0"), bits).Masked()
	})
}

func genClaims(t *rapid.T, overlay netip.Prefix, ids []string) Claims {
	n, _ := SubnetCount(overlay)
	claims := Claims{}
	for range rapid.IntRange(0, n).Draw(t, "nclaims") {
		s := SubnetAt(overlay, rapid.IntRange(0, n-1).Draw(t, "claim"))
		claims[s] = rapid.SampledFrom(ids).Draw(t, "owner")
	}
	return claims
}

func TestPropertyProbeOrder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		overlay := genOverlay().Draw(t, "overlay")
		id := rapid.String().Draw(t, "id")
		order, err := ProbeOrder(overlay, id)
		if err != nil {
			t.Fatal(err)
		}
		n, _ := SubnetCount(overlay)
		var usable []netip.Prefix
		for i := range n {
			if !Reserved(i, n) {
				usable = append(usable, SubnetAt(overlay, i))
			}
			if j, ok := SubnetIndex(overlay, SubnetAt(overlay, i)); !ok || j != i {
				t.Fatalf("SubnetIndex(SubnetAt(%d)) = %d, %v", i, j, ok)
			}
		}
		sorted := slices.Clone(order)
		slices.SortFunc(sorted, comparePrefix)
		if !slices.Equal(sorted, usable) {
			t.Fatalf("probe order %v is not a permutation of the usable subnets %v", order, usable)
		}
		// It starts at the preferred index, or the first usable one after.
		start := PreferredIndex(id, n)
		for Reserved(start, n) {
			start = (start + 1) % n
		}
		if order[0] != SubnetAt(overlay, start) {
			t.Fatalf("order starts at %v, want index %d", order[0], start)
		}
		// Consecutive entries are consecutive indices, modulo reserved ones.
		for k := 1; k < len(order); k++ {
			i, _ := SubnetIndex(overlay, order[k-1])
			j, _ := SubnetIndex(overlay, order[k])
			want := (i + 1) % n
			for Reserved(want, n) {
				want = (want + 1) % n
			}
			if j != want {
				t.Fatalf("after index %d comes %d, want %d", i, j, want)
			}
		}
	})
}

func TestPropertyClaimSubnet(t *testing.T) {
	ids := []string{"a", "b", "c", "d"}
	rapid.Check(t, func(t *rapid.T) {
		overlay := genOverlay().Draw(t, "overlay")
		claims := genClaims(t, overlay, ids)
		id := rapid.SampledFrom(ids).Draw(t, "id")
		n, _ := SubnetCount(overlay)
		var current netip.Prefix
		if rapid.Bool().Draw(t, "hasCurrent") {
			current = SubnetAt(overlay, rapid.IntRange(0, n-1).Draw(t, "current"))
		}
		d, err := ClaimSubnet(overlay, id, current, claims)
		d2, err2 := ClaimSubnet(overlay, id, current, claims)
		if fmt.Sprint(d, err) != fmt.Sprint(d2, err2) {
			t.Fatalf("not deterministic: %+v %v / %+v %v", d, err, d2, err2)
		}
		if err != nil {
			if !errors.Is(err, ErrNoSubnet) {
				t.Fatal(err)
			}
			for _, s := range mustProbe(overlay, id) {
				if o := claims[s]; o == "" || o == id {
					t.Fatalf("ErrNoSubnet but %v is free (owner %q)", s, o)
				}
			}
			return
		}
		if !Usable(overlay, d.Subnet) {
			t.Fatalf("chose unusable %v", d.Subnet)
		}
		if o := claims[d.Subnet]; o != "" && o != id {
			t.Fatalf("chose %v owned by %q", d.Subnet, o)
		}
		if d.Write != (claims[d.Subnet] != id) {
			t.Fatalf("Write = %v but state owner of %v is %q", d.Write, d.Subnet, claims[d.Subnet])
		}
		if d.Previous != CheckClaim(overlay, id, current, claims) {
			t.Fatalf("Previous = %v", d.Previous)
		}
		if (d.Previous == ClaimHeld || d.Previous == ClaimPending) != (d.Subnet == current) {
			t.Fatalf("previous %v but subnet %v, current %v", d.Previous, d.Subnet, current)
		}
		for _, r := range d.Release {
			if claims[r] != id || r == d.Subnet {
				t.Fatalf("release %v (owner %q, chosen %v)", r, claims[r], d.Subnet)
			}
		}
		owned := 0
		for _, o := range claims {
			if o == id {
				owned++
			}
		}
		if claims[d.Subnet] == id {
			owned--
		}
		if owned != len(d.Release) {
			t.Fatalf("release %v, but %d other claims are ours", d.Release, owned)
		}
		// A fresh node (no current claim, none in state) takes the first
		// free subnet of its probe order.
		if d.Previous == ClaimNone && owned == 0 && claims[d.Subnet] != id {
			for _, s := range mustProbe(overlay, id) {
				if s == d.Subnet {
					break
				}
				if claims[s] == "" {
					t.Fatalf("skipped free %v for %v", s, d.Subnet)
				}
			}
		}
		// Applying the decision makes it stable.
		after := Claims{}
		for k, v := range claims {
			after[k] = v
		}
		after[d.Subnet] = id
		d3, err := ClaimSubnet(overlay, id, d.Subnet, after)
		if err != nil || d3.Subnet != d.Subnet || d3.Write || d3.Previous != ClaimHeld {
			t.Fatalf("after applying %+v: %+v, %v", d, d3, err)
		}
	})
}

func mustProbe(overlay netip.Prefix, id string) []netip.Prefix {
	o, err := ProbeOrder(overlay, id)
	if err != nil {
		panic(err)
	}
	return o
}

// TestPropertyClaimsConverge simulates nodes claiming concurrently: each
// round every node decides from the same snapshot of state, the writes
// land in a random order and the last writer of a subnet wins (the CRDT's
// LWW). Within a round per node, every node that can have a subnet holds
// one of its own, no two the same, and nothing changes afterwards.
func TestPropertyClaimsConverge(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		overlay := genOverlay().Draw(t, "overlay")
		n, _ := SubnetCount(overlay)
		usable := n
		if n > 2 {
			usable -= 2
		}
		nodes := rapid.IntRange(1, min(usable+2, 12)).Draw(t, "nodes")
		ids := make([]string, nodes)
		current := make([]netip.Prefix, nodes)
		for i := range ids {
			// Few distinct hashes mod a small count: many collisions.
			ids[i] = fmt.Sprintf("node-%d", i)
		}
		state := Claims{}
		for round := 0; ; round++ {
			if round > nodes+1 {
				t.Fatalf("no convergence after %d rounds: %v", round, state)
			}
			type write struct {
				node   int
				subnet netip.Prefix
			}
			var writes []write
			for i, id := range ids {
				d, err := ClaimSubnet(overlay, id, current[i], state)
				if err != nil {
					current[i] = netip.Prefix{}
					continue
				}
				current[i] = d.Subnet
				if d.Write {
					writes = append(writes, write{i, d.Subnet})
				}
			}
			if len(writes) == 0 {
				break
			}
			order := rapid.Permutation(writes).Draw(t, "order")
			for _, w := range order {
				state[w.subnet] = ids[w.node]
			}
		}
		holders := 0
		seen := map[netip.Prefix]bool{}
		for i, id := range ids {
			if !current[i].IsValid() {
				continue
			}
			holders++
			if state[current[i]] != id {
				t.Fatalf("%s holds %v owned by %q", id, current[i], state[current[i]])
			}
			if seen[current[i]] {
				t.Fatalf("%v held twice", current[i])
			}
			seen[current[i]] = true
		}
		if holders != min(nodes, usable) {
			t.Fatalf("%d of %d nodes hold a subnet, %d usable", holders, nodes, usable)
		}
	})
}
