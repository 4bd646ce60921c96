package wg

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Netlink configures links, addresses and routes in one network namespace.
// Its sockets are opened in that namespace when it is created, so its
// methods work from any goroutine without switching threads. Methods are
// idempotent where the name says so (Ensure…, Replace…, Delete…).
type Netlink struct {
	h *netlink.Handle
}

// OpenNetlink opens a Netlink for the network namespace at nsPath, or for
// the process's own when nsPath is "".
func OpenNetlink(nsPath string) (*Netlink, error) {
	if nsPath == "" {
		h, err := netlink.NewHandle()
		if err != nil {
			return nil, fmt.Errorf("wg: netlink: %w", err)
		}
		return &Netlink{h: h}, nil
	}
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return nil, fmt.Errorf("wg: open netns %s: %w", nsPath, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("wg: netlink in %s: %w", nsPath, err)
	}
	return &Netlink{h: h}, nil
}

// Close releases the netlink sockets.
func (n *Netlink) Close() { n.h.Close() }

func (n *Netlink) link(name string) (netlink.Link, error) {
	l, err := n.h.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("wg: link %s: %w", name, err)
	}
	return l, nil
}

// LinkIndex returns the index of link name.
func (n *Netlink) LinkIndex(name string) (int, error) {
	l, err := n.link(name)
	if err != nil {
		return 0, err
	}
	return l.Attrs().Index, nil
}

// LinkExists reports whether link name exists.
func (n *Netlink) LinkExists(name string) (bool, error) {
	_, err := n.h.LinkByName(name)
	var nf netlink.LinkNotFoundError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &nf):
		return false, nil
	}
	return false, fmt.Errorf("wg: link %s: %w", name, err)
}

// LinkMTU returns the MTU of link name.
func (n *Netlink) LinkMTU(name string) (int, error) {
	l, err := n.link(name)
	if err != nil {
		return 0, err
	}
	return l.Attrs().MTU, nil
}

// SetLinkUp sets link name's MTU (unless mtu is 0) and brings it up.
func (n *Netlink) SetLinkUp(name string, mtu int) error {
	l, err := n.link(name)
	if err != nil {
		return err
	}
	if mtu > 0 && l.Attrs().MTU != mtu {
		if err := n.h.LinkSetMTU(l, mtu); err != nil {
			return fmt.Errorf("wg: set %s mtu %d: %w", name, mtu, err)
		}
	}
	if err := n.h.LinkSetUp(l); err != nil {
		return fmt.Errorf("wg: set %s up: %w", name, err)
	}
	return nil
}

// ReplaceAddr puts addr (address and prefix length, 10.42.7.1/24) on link
// name, keeping any other addresses; it is a no-op if it is already there.
func (n *Netlink) ReplaceAddr(name string, addr netip.Prefix) error {
	l, err := n.link(name)
	if err != nil {
		return err
	}
	if err := n.h.AddrReplace(l, &netlink.Addr{IPNet: prefixIPNet(addr)}); err != nil {
		return fmt.Errorf("wg: address %v on %s: %w", addr, name, err)
	}
	return nil
}

// PruneAddrs removes the IPv4 addresses of link name that lie in within,
// except keep, and returns those it removed. (Added for netd: a node that
// moved to another subnet must drop its old bridge address, whose
// connected route would otherwise keep the old subnet, now another
// node's, on the local bridge.)
func (n *Netlink) PruneAddrs(name string, keep, within netip.Prefix) ([]netip.Prefix, error) {
	l, err := n.link(name)
	if err != nil {
		return nil, err
	}
	addrs, err := n.h.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("wg: addresses of %s: %w", name, err)
	}
	var removed []netip.Prefix
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ones, _ := a.Mask.Size()
		p := netip.PrefixFrom(ip.Unmap(), ones)
		if p == keep || !within.Contains(p.Addr()) {
			continue
		}
		if err := n.h.AddrDel(l, &a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return removed, fmt.Errorf("wg: delete address %v from %s: %w", p, name, err)
		}
		removed = append(removed, p)
	}
	return removed, nil
}

// ReplaceRoute routes dst directly through link name (scope link, no
// gateway) with the preferred source src (the zero Addr for none),
// replacing any route to dst in the main table. src must already be an
// address of this namespace (the kernel refuses it otherwise).
func (n *Netlink) ReplaceRoute(dst netip.Prefix, name string, src netip.Addr) error {
	l, err := n.link(name)
	if err != nil {
		return err
	}
	r := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: prefixIPNet(dst.Masked()), Scope: netlink.SCOPE_LINK}
	if src.IsValid() {
		r.Src = net.IP(src.AsSlice())
	}
	if err := n.h.RouteReplace(r); err != nil {
		return fmt.Errorf("wg: route %v dev %s src %v: %w", dst, name, src, err)
	}
	return nil
}

// DeleteRoute removes the route to dst through link name; a missing route
// or link is not an error.
func (n *Netlink) DeleteRoute(dst netip.Prefix, name string) error {
	l, err := n.h.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("wg: link %s: %w", name, err)
	}
	err = n.h.RouteDel(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: prefixIPNet(dst.Masked()), Scope: netlink.SCOPE_NOWHERE})
	if err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("wg: delete route %v dev %s: %w", dst, name, err)
	}
	return nil
}

// ReplaceDefaultRoute sets the IPv4 default route to gateway gw through
// link name.
func (n *Netlink) ReplaceDefaultRoute(gw netip.Addr, name string) error {
	l, err := n.link(name)
	if err != nil {
		return err
	}
	r := &netlink.Route{
		LinkIndex: l.Attrs().Index,
		Dst:       &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)},
		Gw:        net.IP(gw.AsSlice()),
	}
	if err := n.h.RouteReplace(r); err != nil {
		return fmt.Errorf("wg: default via %v dev %s: %w", gw, name, err)
	}
	return nil
}

// RouteMTU is the MTU packets to dst leave with: the MTU of the route the
// kernel picks for dst if it has one, otherwise its link's. Use it on the
// underlay (dst a peer's address, or 0.0.0.0 for the default route) to
// derive the overlay MTU.
func (n *Netlink) RouteMTU(dst netip.Addr) (int, error) {
	rs, err := n.h.RouteGet(net.IP(dst.AsSlice()))
	if err != nil {
		return 0, fmt.Errorf("wg: route to %v: %w", dst, err)
	}
	if len(rs) == 0 {
		return 0, fmt.Errorf("wg: no route to %v", dst)
	}
	if rs[0].MTU > 0 {
		return rs[0].MTU, nil
	}
	l, err := n.h.LinkByIndex(rs[0].LinkIndex)
	if err != nil {
		return 0, fmt.Errorf("wg: link %d of the route to %v: %w", rs[0].LinkIndex, dst, err)
	}
	return l.Attrs().MTU, nil
}

// EnsureBridge creates bridge name if it does not exist, sets its MTU
// (unless 0), puts addr on it (unless zero) and brings it up. It fails if
// name exists and is not a bridge.
func (n *Netlink) EnsureBridge(name string, addr netip.Prefix, mtu int) error {
	l, err := n.h.LinkByName(name)
	var nf netlink.LinkNotFoundError
	switch {
	case errors.As(err, &nf):
		br := &netlink.Bridge{LinkAttrs: linkAttrs(name, mtu)}
		if err := n.h.LinkAdd(br); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("wg: add bridge %s: %w", name, err)
		}
	case err != nil:
		return fmt.Errorf("wg: link %s: %w", name, err)
	case l.Type() != "bridge":
		return fmt.Errorf("wg: %s exists and is a %s, not a bridge", name, l.Type())
	}
	if addr.IsValid() {
		if err := n.ReplaceAddr(name, addr); err != nil {
			return err
		}
		// NB: a bridge without an address of its own set takes the
		// smallest MAC of its ports, so it changed whenever a task's
		// veth came or went, and every task on the node kept sending to
		// the gateway's old MAC until its ARP entry was probed again:
		// about 5 s without DNS or any routed traffic. A set address
		// stays.
		mac := BridgeMAC(addr.Addr())
		if l, err := n.h.LinkByName(name); err != nil {
			return fmt.Errorf("wg: link %s: %w", name, err)
		} else if !bytes.Equal(l.Attrs().HardwareAddr, mac) {
			if err := n.h.LinkSetHardwareAddr(l, mac); err != nil {
				return fmt.Errorf("wg: set bridge %s address %s: %w", name, mac, err)
			}
		}
	}
	return n.SetLinkUp(name, mtu)
}

// BridgeMAC is the MAC address of the bridge whose address is gw: locally
// administered, and unique in the cluster because the subnet is.
func BridgeMAC(gw netip.Addr) net.HardwareAddr {
	b := gw.Unmap().AsSlice()
	if len(b) != 4 {
		sum := sha256.Sum256(b)
		b = sum[:4]
	}
	return net.HardwareAddr{0x02, 0x53, b[0], b[1], b[2], b[3]}
}

// AddVeth creates a veth pair: hostName in this namespace and peerName
// created directly in the namespace at peerNsPath (so peerName only needs
// to be free there: "eth0" is fine even if this namespace has one). Both
// ends get mtu (unless 0); hostName is brought up, peerName is left down.
func (n *Netlink) AddVeth(hostName, peerName, peerNsPath string, mtu int) error {
	peerNs, err := os.Open(peerNsPath)
	if err != nil {
		return fmt.Errorf("wg: open netns %s: %w", peerNsPath, err)
	}
	defer peerNs.Close()
	v := &netlink.Veth{
		LinkAttrs:     linkAttrs(hostName, mtu),
		PeerName:      peerName,
		PeerNamespace: netlink.NsFd(peerNs.Fd()),
		PeerMTU:       uint32(max(mtu, 0)),
		PeerTxQLen:    -1,
	}
	if err := n.h.LinkAdd(v); err != nil {
		return fmt.Errorf("wg: add veth %s (peer %s in %s): %w", hostName, peerName, peerNsPath, err)
	}
	return n.SetLinkUp(hostName, 0)
}

// AddTaskVeth connects the task network namespace at taskNsPath to
// bridge: a veth whose end hostName is a port of bridge (up) and whose
// other end is eth0 in the task namespace (down; see ConfigureTaskNetns).
func (n *Netlink) AddTaskVeth(hostName, bridge, taskNsPath string, mtu int) error {
	br, err := n.link(bridge)
	if err != nil {
		return err
	}
	if err := n.AddVeth(hostName, "eth0", taskNsPath, mtu); err != nil {
		return err
	}
	l, err := n.link(hostName)
	if err != nil {
		return err
	}
	if err := n.h.LinkSetMaster(l, br); err != nil {
		return fmt.Errorf("wg: attach %s to %s: %w", hostName, bridge, err)
	}
	return nil
}

// DeleteLink deletes link name (for a veth, both ends); a missing link is
// not an error.
func (n *Netlink) DeleteLink(name string) error {
	l, err := n.h.LinkByName(name)
	var nf netlink.LinkNotFoundError
	switch {
	case errors.As(err, &nf):
		return nil
	case err != nil:
		return fmt.Errorf("wg: link %s: %w", name, err)
	}
	if err := n.h.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("wg: delete link %s: %w", name, err)
	}
	return nil
}

// AddKernelWireGuard creates a kernel WireGuard link name with mtu (unless
// 0), down; wgctrl then configures it like a userspace device. It needs
// KernelAvailable.
func (n *Netlink) AddKernelWireGuard(name string, mtu int) error {
	if err := n.h.LinkAdd(&netlink.Wireguard{LinkAttrs: linkAttrs(name, mtu)}); err != nil {
		return fmt.Errorf("wg: add wireguard link %s: %w", name, err)
	}
	return nil
}

// ConfigureTaskNetns sets up the inside of a task network namespace whose
// eth0 AddTaskVeth created: lo up, eth0 with addr (10.42.7.5/24) and mtu,
// up, and a default route via gw (the bridge's .1).
func ConfigureTaskNetns(nsPath string, addr netip.Prefix, gw netip.Addr, mtu int) error {
	n, err := OpenNetlink(nsPath)
	if err != nil {
		return err
	}
	defer n.Close()
	if err := n.SetLinkUp("lo", 0); err != nil {
		return err
	}
	if err := n.ReplaceAddr("eth0", addr); err != nil {
		return err
	}
	if err := n.SetLinkUp("eth0", mtu); err != nil {
		return err
	}
	return n.ReplaceDefaultRoute(gw, "eth0")
}

// EnableIPv4Forwarding turns on IPv4 forwarding in the calling thread's
// network namespace (net.ipv4.ip_forward = 1), which is the process's
// unless called inside InNetns.
func EnableIPv4Forwarding() error {
	const path = "/proc/sys/net/ipv4/ip_forward"
	b, err := os.ReadFile(path)
	if err == nil && len(b) > 0 && b[0] == '1' {
		return nil
	}
	if err := os.WriteFile(path, []byte("1\n"), 0o644); err != nil {
		return fmt.Errorf("wg: enable forwarding: %w", err)
	}
	return nil
}

// linkAttrs are the attributes of a new link: the kernel's defaults but
// for name and mtu (the zero LinkAttrs would ask for a txqueuelen of 0).
func linkAttrs(name string, mtu int) netlink.LinkAttrs {
	a := netlink.NewLinkAttrs()
	a.Name, a.MTU = name, max(mtu, 0)
	return a
}

func prefixIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// AddrMTU returns the MTU of the link that holds addr: the underlay a node
// advertises, whose MTU bounds the tunnel's. (A route to one's own address
// goes through lo, whose MTU says nothing about the wire.)
func (n *Netlink) AddrMTU(addr netip.Addr) (int, error) {
	links, err := n.h.LinkList()
	if err != nil {
		return 0, fmt.Errorf("wg: list links: %w", err)
	}
	for _, l := range links {
		addrs, err := n.h.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == addr.Unmap() {
				return l.Attrs().MTU, nil
			}
		}
	}
	return 0, fmt.Errorf("wg: no link holds %v", addr)
}
