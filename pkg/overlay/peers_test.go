package overlay

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	"pgregory.net/rapid"
)

func key(i int) wgtypes.Key { return wgtypes.Key{31: byte(i + 1)} }

func ipnet(s string) net.IPNet {
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	return *n
}

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func TestDiffPeersExample(t *testing.T) {
	current := []wgtypes.Peer{
		{PublicKey: key(1), Endpoint: &net.UDPAddr{IP: net.ParseIP("192.0.2.1"), Port: 51820}, AllowedIPs: []net.IPNet{ipnet("10.42.1.0/24")}},
		{PublicKey: key(2), Endpoint: &net.UDPAddr{IP: net.ParseIP("192.0.2.2"), Port: 51820}, AllowedIPs: []net.IPNet{ipnet("10.42.2.0/24")}},
		{PublicKey: key(3), Endpoint: &net.UDPAddr{IP: net.ParseIP("192.0.2.3"), Port: 51820}, AllowedIPs: []net.IPNet{ipnet("10.42.3.0/24")}},
		{PublicKey: key(4), AllowedIPs: []net.IPNet{ipnet("10.42.4.0/24")}, PersistentKeepaliveInterval: 25 * time.Second},
	}
	desired := []Peer{
		// 1: unchanged (IPv4 written as IPv4-in-IPv6, host bits set).
		{PublicKey: key(1), Endpoint: netip.MustParseAddrPort("[::ffff:192.0.2.1]:51820"), AllowedIPs: []netip.Prefix{pfx("10.42.1.7/24")}},
		// 2: new endpoint.
		{PublicKey: key(2), Endpoint: netip.MustParseAddrPort("192.0.2.22:51820"), AllowedIPs: []netip.Prefix{pfx("10.42.2.0/24")}},
		// 3: removed. 4: keepalive off, no endpoint (keep what it has).
		{PublicKey: key(4), AllowedIPs: []netip.Prefix{pfx("10.42.4.0/24")}},
		// 5: new.
		{PublicKey: key(5), Endpoint: netip.MustParseAddrPort("192.0.2.5:51820"), AllowedIPs: []netip.Prefix{pfx("10.42.5.0/24"), pfx("10.42.5.0/24")}},
	}
	if err := ValidatePeers(desired); err != nil {
		t.Fatal(err)
	}
	got := DiffPeers(current, desired)
	zero := time.Duration(0)
	want := []wgtypes.PeerConfig{
		{PublicKey: key(3), Remove: true},
		{PublicKey: key(2), UpdateOnly: true, Endpoint: &net.UDPAddr{IP: net.IP{192, 0, 2, 22}, Port: 51820}},
		{PublicKey: key(4), UpdateOnly: true, PersistentKeepaliveInterval: &zero},
		{PublicKey: key(5), Endpoint: &net.UDPAddr{IP: net.IP{192, 0, 2, 5}, Port: 51820}, ReplaceAllowedIPs: true, AllowedIPs: []net.IPNet{{IP: net.IP{10, 42, 5, 0}, Mask: net.CIDRMask(24, 32)}}},
	}
	if fmt.Sprint(configStrings(got)) != fmt.Sprint(configStrings(want)) {
		t.Fatalf("diff\n got %v\nwant %v", configStrings(got), configStrings(want))
	}
	// Allowed IPs changed: replaced as a whole.
	got = DiffPeers(current[:1], []Peer{{PublicKey: key(1), AllowedIPs: []netip.Prefix{pfx("10.42.1.0/24"), pfx("10.42.9.0/24")}}})
	if len(got) != 1 || !got[0].UpdateOnly || !got[0].ReplaceAllowedIPs || len(got[0].AllowedIPs) != 2 || got[0].Endpoint != nil {
		t.Fatalf("allowed IPs change: %v", configStrings(got))
	}
	if got := DiffPeers(nil, nil); len(got) != 0 {
		t.Fatalf("empty diff: %v", got)
	}
}

func TestValidatePeers(t *testing.T) {
	if err := ValidatePeers([]Peer{{PublicKey: key(1)}, {PublicKey: key(1)}}); err == nil {
		t.Error("duplicate key accepted")
	}
	if err := ValidatePeers([]Peer{
		{PublicKey: key(1), AllowedIPs: []netip.Prefix{pfx("10.42.1.0/24")}},
		{PublicKey: key(2), AllowedIPs: []netip.Prefix{pfx("10.42.1.9/24")}},
	}); err == nil {
		t.Error("shared prefix accepted")
	}
	if err := ValidatePeers([]Peer{
		{PublicKey: key(1), AllowedIPs: []netip.Prefix{pfx("10.42.0.0/16")}},
		{PublicKey: key(2), AllowedIPs: []netip.Prefix{pfx("10.42.1.0/24")}},
	}); err != nil {
		t.Errorf("nested prefixes rejected: %v", err)
	}
}

func configStrings(cs []wgtypes.PeerConfig) []string {
	var out []string
	for _, c := range cs {
		ka := "-"
		if c.PersistentKeepaliveInterval != nil {
			ka = c.PersistentKeepaliveInterval.String()
		}
		out = append(out, fmt.Sprintf("%d rm=%v upd=%v ep=%v ka=%s repl=%v ips=%v", c.PublicKey[31], c.Remove, c.UpdateOnly, c.Endpoint, ka, c.ReplaceAllowedIPs, c.AllowedIPs))
	}
	return out
}

// applyModel applies configs to peers as WireGuard does (ReplacePeers
// false): Remove deletes, UpdateOnly skips unknown peers, unset fields are
// left alone, allowed IPs are appended or replaced, and a prefix given to
// one peer is taken from any other.
func applyModel(peers []wgtypes.Peer, cfgs []wgtypes.PeerConfig) []wgtypes.Peer {
	out := slices.Clone(peers)
	find := func(k wgtypes.Key) int {
		return slices.IndexFunc(out, func(p wgtypes.Peer) bool { return p.PublicKey == k })
	}
	for _, c := range cfgs {
		i := find(c.PublicKey)
		if c.Remove {
			if i >= 0 {
				out = slices.Delete(out, i, i+1)
			}
			continue
		}
		if i < 0 {
			if c.UpdateOnly {
				continue
			}
			out = append(out, wgtypes.Peer{PublicKey: c.PublicKey})
			i = len(out) - 1
		}
		p := &out[i]
		if c.Endpoint != nil {
			p.Endpoint = c.Endpoint
		}
		if c.PersistentKeepaliveInterval != nil {
			p.PersistentKeepaliveInterval = *c.PersistentKeepaliveInterval
		}
		if c.ReplaceAllowedIPs {
			p.AllowedIPs = nil
		}
		for _, n := range c.AllowedIPs {
			for j := range out {
				out[j].AllowedIPs = slices.DeleteFunc(slices.Clone(out[j].AllowedIPs), func(m net.IPNet) bool { return m.String() == n.String() })
			}
			out[i].AllowedIPs = append(out[i].AllowedIPs, n)
		}
	}
	return out
}

// genDesired draws a valid desired set from small pools of keys, prefixes
// (in odd spellings) and endpoints.
func genDesired(t *rapid.T, label string) []Peer {
	keys := rapid.SliceOfNDistinct(rapid.IntRange(0, 7), 0, 8, rapid.ID[int]).Draw(t, label+"-keys")
	var out []Peer
	used := map[int]bool{}
	for _, k := range keys {
		p := Peer{PublicKey: key(k)}
		if rapid.IntRange(0, 3).Draw(t, "hasEndpoint") > 0 {
			ep := netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(rapid.IntRange(1, 3).Draw(t, "ep"))}), uint16(rapid.SampledFrom([]int{51820, 51821}).Draw(t, "port")))
			if rapid.Bool().Draw(t, "mapped") {
				ep = netip.AddrPortFrom(netip.AddrFrom16(ep.Addr().As16()), ep.Port())
			}
			p.Endpoint = ep
		}
		for range rapid.IntRange(0, 3).Draw(t, "nips") {
			s := rapid.IntRange(0, 9).Draw(t, "subnet")
			if used[s] {
				continue
			}
			used[s] = true
			pr := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 42, byte(s), byte(rapid.IntRange(0, 3).Draw(t, "host"))}), 24)
			p.AllowedIPs = append(p.AllowedIPs, pr)
			if rapid.IntRange(0, 4).Draw(t, "dup") == 0 {
				p.AllowedIPs = append(p.AllowedIPs, pr.Masked())
			}
		}
		p.PersistentKeepalive = rapid.SampledFrom([]time.Duration{0, 0, 25 * time.Second, 25*time.Second + 300*time.Millisecond}).Draw(t, "keepalive")
		out = append(out, p)
	}
	return out
}

// asCurrent turns a desired set into what a device would report.
func asCurrent(ps []Peer) []wgtypes.Peer {
	var out []wgtypes.Peer
	for _, p := range ps {
		w := wgtypes.Peer{PublicKey: p.PublicKey, PersistentKeepaliveInterval: p.PersistentKeepalive.Truncate(time.Second)}
		if p.Endpoint.IsValid() {
			w.Endpoint = net.UDPAddrFromAddrPort(p.Endpoint)
		}
		w.AllowedIPs = ipNets(canonicalPrefixes(p.AllowedIPs))
		out = append(out, w)
	}
	return out
}

// TestPropertyDiffPeers: applying the diff from any current set to a valid
// desired one gives the desired peers; diffing again gives nothing; only
// peers that differ are touched; nothing outside desired survives.
func TestPropertyDiffPeers(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		current := asCurrent(genDesired(t, "current"))
		// The device may hold an endpoint the desired set leaves out.
		desired := genDesired(t, "desired")
		if err := ValidatePeers(desired); err != nil {
			t.Fatal(err)
		}
		cfgs := DiffPeers(current, desired)
		if fmt.Sprint(configStrings(cfgs)) != fmt.Sprint(configStrings(DiffPeers(current, desired))) {
			t.Fatal("not deterministic")
		}
		// Shape: removals first, each part sorted, one entry per key.
		seenAdd := false
		keys := map[wgtypes.Key]bool{}
		for i, c := range cfgs {
			if keys[c.PublicKey] {
				t.Fatalf("key %d twice", c.PublicKey[31])
			}
			keys[c.PublicKey] = true
			if c.Remove && seenAdd {
				t.Fatalf("removal after an update: %v", configStrings(cfgs))
			}
			seenAdd = seenAdd || !c.Remove
			if i > 0 && cfgs[i-1].Remove == c.Remove && bytes.Compare(cfgs[i-1].PublicKey[:], c.PublicKey[:]) >= 0 {
				t.Fatalf("not sorted: %v", configStrings(cfgs))
			}
		}
		after := applyModel(current, cfgs)
		if again := DiffPeers(after, desired); len(again) != 0 {
			t.Fatalf("second diff not empty: %v\ncurrent %v\nfirst %v", configStrings(again), current, configStrings(cfgs))
		}
		// The result is desired, with endpoints left alone where desired
		// has none.
		if len(after) != len(desired) {
			t.Fatalf("after has %d peers, want %d", len(after), len(desired))
		}
		for _, d := range desired {
			i := slices.IndexFunc(after, func(p wgtypes.Peer) bool { return p.PublicKey == d.PublicKey })
			if i < 0 {
				t.Fatalf("peer %d missing", d.PublicKey[31])
			}
			got := PeerFromWG(after[i])
			if !slices.Equal(got.AllowedIPs, canonicalPrefixes(d.AllowedIPs)) {
				t.Fatalf("peer %d allowed %v, want %v", d.PublicKey[31], got.AllowedIPs, d.AllowedIPs)
			}
			if d.Endpoint.IsValid() && got.Endpoint != unmapAddrPort(d.Endpoint) {
				t.Fatalf("peer %d endpoint %v, want %v", d.PublicKey[31], got.Endpoint, d.Endpoint)
			}
			if got.PersistentKeepalive != d.PersistentKeepalive.Truncate(time.Second) {
				t.Fatalf("peer %d keepalive %v, want %v", d.PublicKey[31], got.PersistentKeepalive, d.PersistentKeepalive)
			}
		}
		// Untouched peers: those already as desired get no entry.
		for _, c := range current {
			i := slices.IndexFunc(desired, func(p Peer) bool { return p.PublicKey == c.PublicKey })
			if i < 0 {
				continue
			}
			if len(DiffPeers([]wgtypes.Peer{c}, desired[i:i+1])) == 0 && keys[c.PublicKey] {
				t.Fatalf("unchanged peer %d in the diff", c.PublicKey[31])
			}
		}
	})
}
