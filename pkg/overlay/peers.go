package overlay

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Peer is a desired WireGuard peer: another node.
type Peer struct {
	PublicKey wgtypes.Key
	// Endpoint is the peer's underlay address and WireGuard port. The zero
	// value means "none configured": a new peer gets no endpoint (it must
	// contact us first), an existing one keeps whatever it has.
	Endpoint netip.AddrPort
	// AllowedIPs are the overlay prefixes routed to the peer (its subnet).
	AllowedIPs []netip.Prefix
	// PersistentKeepalive, in whole seconds; 0 turns it off.
	PersistentKeepalive time.Duration
}

// PeerFromWG converts a peer as the device reports it.
func PeerFromWG(p wgtypes.Peer) Peer {
	out := Peer{
		PublicKey:           p.PublicKey,
		PersistentKeepalive: p.PersistentKeepaliveInterval,
	}
	if p.Endpoint != nil {
		out.Endpoint = udpAddrPort(p.Endpoint)
	}
	for _, n := range p.AllowedIPs {
		if pr, ok := ipNetPrefix(n); ok {
			out.AllowedIPs = append(out.AllowedIPs, pr)
		}
	}
	out.AllowedIPs = canonicalPrefixes(out.AllowedIPs)
	return out
}

// ValidatePeers reports desired sets that DiffPeers cannot apply
// faithfully: a public key listed twice, or one allowed prefix given to two
// peers (WireGuard routes a prefix to one peer only, the last configured).
// Overlapping prefixes of different lengths are fine (longest match wins).
func ValidatePeers(desired []Peer) error {
	keys := map[wgtypes.Key]bool{}
	owner := map[netip.Prefix]wgtypes.Key{}
	for _, p := range desired {
		if keys[p.PublicKey] {
			return fmt.Errorf("overlay: peer %v listed twice", p.PublicKey)
		}
		keys[p.PublicKey] = true
		for _, pr := range canonicalPrefixes(p.AllowedIPs) {
			if k, dup := owner[pr]; dup {
				return fmt.Errorf("overlay: allowed IP %v given to peers %v and %v", pr, k, p.PublicKey)
			}
			owner[pr] = p.PublicKey
		}
	}
	return nil
}

// DiffPeers returns the peer changes that turn current (as the device
// reports them) into desired, and nothing else: no entry for a peer that is
// already as desired, Remove for a peer not desired, UpdateOnly with just
// the fields that differ for a changed peer (allowed IPs are replaced as a
// whole when they differ), and a full entry for a new peer. Apply them with
// ReplacePeers false, so sessions with unchanged peers are left alone.
//
// Allowed IPs are compared as sets of masked prefixes; endpoints after
// unmapping IPv4-in-IPv6; keepalives in whole seconds. If desired lists a
// key twice the last entry counts (see ValidatePeers). The order is fixed:
// removals first, then the rest, each by public key.
func DiffPeers(current []wgtypes.Peer, desired []Peer) []wgtypes.PeerConfig {
	want := make(map[wgtypes.Key]Peer, len(desired))
	for _, p := range desired {
		want[p.PublicKey] = p
	}
	have := make(map[wgtypes.Key]Peer, len(current))
	var out []wgtypes.PeerConfig
	for _, c := range current {
		have[c.PublicKey] = PeerFromWG(c)
		if _, ok := want[c.PublicKey]; !ok {
			out = append(out, wgtypes.PeerConfig{PublicKey: c.PublicKey, Remove: true})
		}
	}
	sortConfigs(out)
	removals := len(out)
	for k, w := range want {
		w.AllowedIPs = canonicalPrefixes(w.AllowedIPs)
		w.Endpoint = unmapAddrPort(w.Endpoint)
		w.PersistentKeepalive = w.PersistentKeepalive.Truncate(time.Second)
		h, exists := have[k]
		if !exists {
			pc := wgtypes.PeerConfig{
				PublicKey:         k,
				ReplaceAllowedIPs: true,
				AllowedIPs:        ipNets(w.AllowedIPs),
			}
			if w.Endpoint.IsValid() {
				pc.Endpoint = net.UDPAddrFromAddrPort(w.Endpoint)
			}
			if w.PersistentKeepalive > 0 {
				ka := w.PersistentKeepalive
				pc.PersistentKeepaliveInterval = &ka
			}
			out = append(out, pc)
			continue
		}
		pc := wgtypes.PeerConfig{PublicKey: k, UpdateOnly: true}
		changed := false
		if w.Endpoint.IsValid() && w.Endpoint != h.Endpoint {
			pc.Endpoint = net.UDPAddrFromAddrPort(w.Endpoint)
			changed = true
		}
		if !slices.Equal(w.AllowedIPs, h.AllowedIPs) {
			pc.ReplaceAllowedIPs = true
			pc.AllowedIPs = ipNets(w.AllowedIPs)
			changed = true
		}
		if w.PersistentKeepalive != h.PersistentKeepalive.Truncate(time.Second) {
			ka := w.PersistentKeepalive
			pc.PersistentKeepaliveInterval = &ka
			changed = true
		}
		if changed {
			out = append(out, pc)
		}
	}
	sortConfigs(out[removals:])
	return out
}

func sortConfigs(cs []wgtypes.PeerConfig) {
	slices.SortFunc(cs, func(a, b wgtypes.PeerConfig) int { return bytes.Compare(a.PublicKey[:], b.PublicKey[:]) })
}

// canonicalPrefixes masks, sorts and de-duplicates prefixes, dropping
// invalid ones and unmapping IPv4-in-IPv6.
func canonicalPrefixes(ps []netip.Prefix) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(ps))
	for _, p := range ps {
		if !p.IsValid() {
			continue
		}
		if a := p.Addr(); a.Is4In6() {
			bits := p.Bits() - 96
			if bits < 0 {
				continue
			}
			p = netip.PrefixFrom(a.Unmap(), bits)
		}
		out = append(out, p.Masked())
	}
	slices.SortFunc(out, comparePrefix)
	return slices.Compact(out)
}

func ipNets(ps []netip.Prefix) []net.IPNet {
	out := make([]net.IPNet, 0, len(ps))
	for _, p := range ps {
		out = append(out, net.IPNet{
			IP:   net.IP(p.Addr().AsSlice()),
			Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen()),
		})
	}
	return out
}

func ipNetPrefix(n net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, bits := n.Mask.Size()
	if bits == 0 { // non-canonical mask
		return netip.Prefix{}, false
	}
	if a.Is4In6() {
		a = a.Unmap()
		if bits == 128 {
			ones -= 96
		}
	}
	if ones < 0 || ones > a.BitLen() {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(a, ones).Masked(), true
}

func udpAddrPort(u *net.UDPAddr) netip.AddrPort {
	return unmapAddrPort(u.AddrPort())
}

func unmapAddrPort(ap netip.AddrPort) netip.AddrPort {
	if !ap.IsValid() {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}
