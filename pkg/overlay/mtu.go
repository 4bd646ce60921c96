package overlay

const (
	// WireGuardOverhead is what WireGuard adds to each packet in the worst
	// case: outer IPv6 header (40) + UDP (8) + WireGuard data header (16) +
	// Poly1305 tag (16). Over an IPv4 underlay it is 60; Shoal uses 80 for
	// both so that an underlay can change family without a new MTU.
	WireGuardOverhead = 80
	// MinMTU is the smallest MTU the overlay uses: IPv6's minimum link MTU.
	MinMTU = 1280
	// DefaultUnderlayMTU is assumed when the underlay's MTU is unknown.
	DefaultUnderlayMTU = 1500
)

// MTU is the overlay MTU for an underlay MTU: underlay minus
// WireGuardOverhead, at least MinMTU. An unknown underlay (0 or less) counts
// as DefaultUnderlayMTU, giving 1420.
//
// Below 1360 the floor wins and encapsulated packets can exceed the
// underlay MTU (IPv4 underlays fragment them; IPv6 ones drop them).
func MTU(underlay int) int {
	if underlay <= 0 {
		underlay = DefaultUnderlayMTU
	}
	return max(underlay-WireGuardOverhead, MinMTU)
}
