package overlay

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
)

// SubnetBits is the size of a node's subnet.
const SubnetBits = 24

// Overlay prefix limits: at least one /24, at most 65536 of them.
const (
	minOverlayBits = 8
	maxOverlayBits = SubnetBits
)

// ErrNoSubnet means every usable subnet of the overlay is claimed by
// another node.
var ErrNoSubnet = errors.New("overlay: no free subnet")

// Claims maps a subnet to the node that owns it, as read from state
// (/network/subnets/<a.b.c.0> field node, after last-writer-wins). Keys are
// /24 network prefixes, as ParseSubnetKey and SubnetAt return them; other
// keys never match.
type Claims map[netip.Prefix]string

// ClaimStatus says what became of a node's previous claim.
type ClaimStatus int

const (
	// ClaimNone: the node had no claim (first start, lost local state).
	ClaimNone ClaimStatus = iota
	// ClaimHeld: state says the node owns its claim; keep it.
	ClaimHeld
	// ClaimPending: the claim is usable and nobody owns it in state (the
	// write has not been made or not been seen yet); (re)write it.
	ClaimPending
	// ClaimLost: another node owns the subnet (it won last-writer-wins, or
	// claimed it while this node was away); claim again.
	ClaimLost
	// ClaimInvalid: the claim is not a usable subnet of the overlay (the
	// overlay CIDR changed, or the file is corrupt); claim again.
	ClaimInvalid
)

func (s ClaimStatus) String() string {
	switch s {
	case ClaimNone:
		return "none"
	case ClaimHeld:
		return "held"
	case ClaimPending:
		return "pending"
	case ClaimLost:
		return "lost"
	case ClaimInvalid:
		return "invalid"
	}
	return fmt.Sprintf("ClaimStatus(%d)", int(s))
}

// Decision is the outcome of ClaimSubnet.
type Decision struct {
	// Subnet is the node's subnet from now on.
	Subnet netip.Prefix
	// Write is true when the claim must be written to state (a new claim,
	// or one state does not show yet). It is false when state already says
	// the node owns Subnet.
	Write bool
	// Previous is what became of the claim passed in.
	Previous ClaimStatus
	// Release lists other subnets that state says this node owns (an
	// earlier claim that was given up, or two claims made concurrently), in
	// address order. The node may delete those claims.
	Release []netip.Prefix
}

// ValidateOverlay checks that overlay can be split into node subnets: an
// IPv4 prefix from /8 to /24 with no host bits set.
func ValidateOverlay(overlay netip.Prefix) error {
	if !overlay.IsValid() || !overlay.Addr().Is4() {
		return fmt.Errorf("overlay: %v is not an IPv4 prefix", overlay)
	}
	if overlay.Bits() < minOverlayBits || overlay.Bits() > maxOverlayBits {
		return fmt.Errorf("overlay: %v must be /%d to /%d", overlay, minOverlayBits, maxOverlayBits)
	}
	if overlay.Masked() != overlay {
		return fmt.Errorf("overlay: %v has host bits set (want %v)", overlay, overlay.Masked())
	}
	return nil
}

// SubnetCount is the number of /24 subnets in overlay (reserved ones
// included).
func SubnetCount(overlay netip.Prefix) (int, error) {
	if err := ValidateOverlay(overlay); err != nil {
		return 0, err
	}
	return 1 << (SubnetBits - overlay.Bits()), nil
}

// SubnetAt is the i-th /24 of overlay, 0 ≤ i < SubnetCount(overlay).
func SubnetAt(overlay netip.Prefix, i int) netip.Prefix {
	a := overlay.Addr().As4()
	base := binary.BigEndian.Uint32(a[:])
	binary.BigEndian.PutUint32(a[:], base+uint32(i)<<(32-SubnetBits))
	return netip.PrefixFrom(netip.AddrFrom4(a), SubnetBits)
}

// SubnetIndex is the index of subnet in overlay, the inverse of SubnetAt;
// ok is false when subnet is not a /24 of overlay.
func SubnetIndex(overlay, subnet netip.Prefix) (i int, ok bool) {
	if ValidateOverlay(overlay) != nil || !subnet.IsValid() || subnet.Bits() != SubnetBits ||
		!subnet.Addr().Is4() || subnet.Masked() != subnet || !overlay.Contains(subnet.Addr()) {
		return 0, false
	}
	o, s := overlay.Addr().As4(), subnet.Addr().As4()
	return int((binary.BigEndian.Uint32(s[:]) - binary.BigEndian.Uint32(o[:])) >> (32 - SubnetBits)), true
}

// Reserved reports whether the i-th of count subnets is never handed out:
// the first and the last, when there are more than two. They hold the
// overlay's network and broadcast addresses (a.b.0.0, a.b.255.255 in a /16)
// and are kept free for cluster-wide uses (service VIPs, say) rather than
// for one node; IPAM never uses a subnet's .0 and .255 anyway, so this is a
// choice, not a necessity.
func Reserved(i, count int) bool {
	return count > 2 && (i == 0 || i == count-1)
}

// Usable reports whether subnet is a /24 of overlay that a node may own.
func Usable(overlay, subnet netip.Prefix) bool {
	i, ok := SubnetIndex(overlay, subnet)
	if !ok {
		return false
	}
	n, _ := SubnetCount(overlay)
	return !Reserved(i, n)
}

// PreferredIndex is the index a node prefers among count subnets: the first
// 8 bytes of SHA-256(node ID), big-endian, mod count. It is stable across
// versions and machines (it decides where restarted nodes land).
func PreferredIndex(nodeID string, count int) int {
	if count <= 0 {
		return 0
	}
	h := sha256.Sum256([]byte(nodeID))
	return int(binary.BigEndian.Uint64(h[:8]) % uint64(count))
}

// ProbeOrder lists the usable subnets of overlay in the order nodeID tries
// them: from its preferred index upward, wrapping around, skipping
// reserved ones.
func ProbeOrder(overlay netip.Prefix, nodeID string) ([]netip.Prefix, error) {
	n, err := SubnetCount(overlay)
	if err != nil {
		return nil, err
	}
	start := PreferredIndex(nodeID, n)
	out := make([]netip.Prefix, 0, n)
	for k := range n {
		i := (start + k) % n
		if !Reserved(i, n) {
			out = append(out, SubnetAt(overlay, i))
		}
	}
	return out, nil
}

// CheckClaim says whether nodeID's claim current (the zero Prefix for none)
// still stands, given the claims in state.
func CheckClaim(overlay netip.Prefix, nodeID string, current netip.Prefix, claims Claims) ClaimStatus {
	switch {
	case !current.IsValid():
		return ClaimNone
	case !Usable(overlay, current):
		return ClaimInvalid
	}
	owner, ok := claims[current]
	switch {
	case !ok || owner == "":
		return ClaimPending
	case owner == nodeID:
		return ClaimHeld
	default:
		return ClaimLost
	}
}

// ClaimSubnet decides nodeID's subnet of overlay, given its current claim
// (the zero Prefix for none; netd persists it locally) and the claims in
// state:
//
//   - a current claim that state shows as this node's, or as nobody's, is
//     kept (written again in the second case);
//   - otherwise a subnet that state already shows as this node's is adopted
//     (the first in probe order, when there are several);
//   - otherwise the first subnet in ProbeOrder that no other node claims is
//     claimed, or ErrNoSubnet returned.
//
// Two nodes that pick the same subnet both write a claim; last-writer-wins
// in state picks the owner, and the loser sees ClaimLost on its next call
// and moves on. The result depends only on the arguments.
func ClaimSubnet(overlay netip.Prefix, nodeID string, current netip.Prefix, claims Claims) (Decision, error) {
	if err := ValidateOverlay(overlay); err != nil {
		return Decision{}, err
	}
	if nodeID == "" {
		return Decision{}, errors.New("overlay: empty node ID")
	}
	d := Decision{Previous: CheckClaim(overlay, nodeID, current, claims)}
	switch d.Previous {
	case ClaimHeld:
		d.Subnet = current
	case ClaimPending:
		d.Subnet, d.Write = current, true
	default:
		order, _ := ProbeOrder(overlay, nodeID)
		for _, s := range order { // adopt a claim state already gives us
			if claims[s] == nodeID {
				d.Subnet = s
				break
			}
		}
		if !d.Subnet.IsValid() {
			for _, s := range order {
				if owner := claims[s]; owner == "" {
					d.Subnet, d.Write = s, true
					break
				}
			}
		}
		if !d.Subnet.IsValid() {
			return d, ErrNoSubnet
		}
	}
	for s, owner := range claims {
		if owner == nodeID && s != d.Subnet {
			d.Release = append(d.Release, s)
		}
	}
	slices.SortFunc(d.Release, comparePrefix)
	return d, nil
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// SubnetKey is the name of subnet's claim document under
// /network/subnets/: its network address, "10.42.7.0".
func SubnetKey(subnet netip.Prefix) string { return subnet.Addr().String() }

// ParseSubnetKey is the inverse of SubnetKey: "10.42.7.0" → 10.42.7.0/24.
func ParseSubnetKey(key string) (netip.Prefix, error) {
	a, err := netip.ParseAddr(key)
	if err != nil || !a.Is4() {
		return netip.Prefix{}, fmt.Errorf("overlay: bad subnet key %q", key)
	}
	p := netip.PrefixFrom(a, SubnetBits)
	if p.Masked() != p {
		return netip.Prefix{}, fmt.Errorf("overlay: subnet key %q is not a /%d network address", key, SubnetBits)
	}
	return p, nil
}
