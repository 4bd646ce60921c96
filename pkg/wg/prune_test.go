package wg

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
)

// TestPruneAddrs: a bridge that held other subnets of the overlay keeps
// only the current one (and addresses outside the overlay).
func TestPruneAddrs(t *testing.T) {
	requireRoot(t)
	n := openNetlink(t, newNetns(t))
	keep := netip.MustParsePrefix("10.42.6.1/24")
	for _, a := range []string{"10.42.5.1/24", "10.42.6.1/24", "192.168.9.1/24", "10.42.7.1/24"} {
		if err := n.EnsureBridge("shoal0", netip.MustParsePrefix(a), 1420); err != nil {
			t.Fatal(err)
		}
	}
	overlay := netip.MustParsePrefix("10.42.0.0/16")
	removed, err := n.PruneAddrs("shoal0", keep, overlay)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(removed, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	if want := []netip.Prefix{netip.MustParsePrefix("10.42.5.1/24"), netip.MustParsePrefix("10.42.7.1/24")}; !slices.Equal(removed, want) {
		t.Fatalf("removed %v, want %v", removed, want)
	}
	l, _ := n.h.LinkByName("shoal0")
	addrs, _ := n.h.AddrList(l, netlink.FAMILY_V4)
	var left []string
	for _, a := range addrs {
		left = append(left, a.IPNet.String())
	}
	slices.Sort(left)
	if want := []string{"10.42.6.1/24", "192.168.9.1/24"}; !slices.Equal(left, want) {
		t.Fatalf("bridge has %v, want %v", left, want)
	}
	// Nothing more to do the second time.
	if removed, err := n.PruneAddrs("shoal0", keep, overlay); err != nil || len(removed) != 0 {
		t.Fatalf("second prune: %v %v", removed, err)
	}
}
