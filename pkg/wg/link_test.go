package wg

import (
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

func readForwarding(t *testing.T, ns string) string {
	t.Helper()
	var v string
	if err := InNetns(ns, func() error {
		b, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
		v = strings.TrimSpace(string(b))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestNetlinkHelpers builds a node's plumbing in a namespace of its own:
// a bridge with the node's .1, a task namespace on it with eth0, address
// and default route, an overlay route with a source, forwarding.
func TestNetlinkHelpers(t *testing.T) {
	requireRoot(t)
	host, task := newNetns(t), newNetns(t)
	n := openNetlink(t, host)

	gw := netip.MustParseAddr("10.42.5.1")
	for range 2 { // idempotent
		if err := n.EnsureBridge("shoal0", netip.PrefixFrom(gw, 24), 1420); err != nil {
			t.Fatal(err)
		}
	}
	if mtu, err := n.LinkMTU("shoal0"); err != nil || mtu != 1420 {
		t.Fatalf("bridge mtu %d, %v", mtu, err)
	}
	if err := n.EnsureBridge("lo", netip.Prefix{}, 0); err == nil {
		t.Fatal("EnsureBridge accepted lo")
	}
	if err := n.SetLinkUp("lo", 0); err != nil {
		t.Fatal(err)
	}

	veth := "vt" + tag
	if err := n.AddTaskVeth(veth, "shoal0", task, 1420); err != nil {
		t.Fatal(err)
	}
	l, err := n.h.LinkByName(veth)
	if err != nil {
		t.Fatal(err)
	}
	br, _ := n.h.LinkByName("shoal0")
	// The bridge keeps its own MAC whatever ports come and go (tasks
	// cache it for their gateway).
	if got, want := br.Attrs().HardwareAddr.String(), BridgeMAC(gw).String(); got != want {
		t.Fatalf("bridge MAC %s, want %s", got, want)
	}
	for _, mac := range []string{"02:00:00:00:00:01", "00:00:00:00:00:01"} {
		hw, _ := net.ParseMAC(mac)
		if err := n.h.LinkSetHardwareAddr(l, hw); err != nil {
			t.Fatal(err)
		}
		if b, _ := n.h.LinkByName("shoal0"); b.Attrs().HardwareAddr.String() != BridgeMAC(gw).String() {
			t.Fatalf("bridge MAC %s after a port took %s", b.Attrs().HardwareAddr, mac)
		}
	}
	if l.Attrs().MasterIndex != br.Attrs().Index || l.Attrs().MTU != 1420 {
		t.Fatalf("veth master %d (bridge %d), mtu %d", l.Attrs().MasterIndex, br.Attrs().Index, l.Attrs().MTU)
	}
	taskAddr := netip.MustParsePrefix("10.42.5.2/24")
	for range 2 {
		if err := ConfigureTaskNetns(task, taskAddr, gw, 1420); err != nil {
			t.Fatal(err)
		}
	}
	tn := openNetlink(t, task)
	if mtu, err := tn.LinkMTU("eth0"); err != nil || mtu != 1420 {
		t.Fatalf("eth0 mtu %d, %v", mtu, err)
	}
	ping(t, task, gw.String())
	ping(t, host, taskAddr.Addr().String())

	// The host end exists only in the host namespace, eth0 only in the task's.
	root := openNetlink(t, "")
	if ok, _ := root.LinkExists(veth); ok {
		t.Fatalf("%s in the root namespace", veth)
	}
	if ok, _ := n.LinkExists("eth0"); ok {
		t.Fatal("eth0 in the host namespace")
	}

	// Route with a preferred source, replaceable, deletable.
	overlayNet := netip.MustParsePrefix("10.42.0.0/16")
	for range 2 {
		if err := n.ReplaceRoute(overlayNet, "shoal0", gw); err != nil {
			t.Fatal(err)
		}
	}
	rs, err := n.h.RouteGet(net.ParseIP("10.42.77.7"))
	if err != nil || len(rs) != 1 || rs[0].LinkIndex != br.Attrs().Index || !rs[0].Src.Equal(net.ParseIP("10.42.5.1")) {
		t.Fatalf("route to 10.42.77.7: %+v, %v", rs, err)
	}
	if mtu, err := n.RouteMTU(netip.MustParseAddr("10.42.77.7")); err != nil || mtu != 1420 {
		t.Fatalf("RouteMTU %d, %v", mtu, err)
	}
	if err := n.ReplaceRoute(netip.MustParsePrefix("10.43.0.0/16"), "shoal0", netip.MustParseAddr("192.0.2.1")); err == nil {
		t.Fatal("route with a foreign source accepted")
	}
	for range 2 {
		if err := n.DeleteRoute(overlayNet, "shoal0"); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.DeleteRoute(overlayNet, "nosuchlink"); err != nil {
		t.Fatal(err)
	}
	if _, err := n.h.RouteGet(net.ParseIP("10.42.77.7")); err == nil {
		t.Fatal("route still there")
	}

	// Forwarding, per namespace.
	before := readForwarding(t, "")
	if got := readForwarding(t, host); got != "0" {
		t.Fatalf("a new namespace forwards: %s", got)
	}
	if err := InNetns(host, EnableIPv4Forwarding); err != nil {
		t.Fatal(err)
	}
	if got := readForwarding(t, host); got != "1" {
		t.Fatalf("forwarding %s after enabling", got)
	}
	if got := readForwarding(t, ""); got != before {
		t.Fatalf("root namespace forwarding changed %s → %s", before, got)
	}

	// Deleting the host end removes eth0 too; deleting again is fine.
	for range 2 {
		if err := n.DeleteLink(veth); err != nil {
			t.Fatal(err)
		}
	}
	if ok, _ := tn.LinkExists("eth0"); ok {
		t.Fatal("eth0 survived its veth")
	}
	if _, err := n.LinkIndex(veth); err == nil {
		t.Fatal("LinkIndex of a deleted link")
	}
}

// TestAddVeth joins two namespaces, the plain underlay of the tunnel tests.
func TestAddVeth(t *testing.T) {
	requireRoot(t)
	a, b := newNetns(t), newNetns(t)
	na, nb := openNetlink(t, a), openNetlink(t, b)
	if err := na.AddVeth("ul0", "ul0", b, 1400); err != nil {
		t.Fatal(err)
	}
	if err := na.AddVeth("ul0", "ul1", b, 0); err == nil {
		t.Fatal("duplicate veth accepted")
	}
	for ns, n := range map[string]*Netlink{"a": na, "b": nb} {
		addr := netip.MustParsePrefix("172.31.0.1/24")
		if ns == "b" {
			addr = netip.MustParsePrefix("172.31.0.2/24")
		}
		if err := n.ReplaceAddr("ul0", addr); err != nil {
			t.Fatal(err)
		}
		if err := n.SetLinkUp("ul0", 0); err != nil {
			t.Fatal(err)
		}
		if mtu, _ := n.LinkMTU("ul0"); mtu != 1400 {
			t.Fatalf("%s: mtu %d", ns, mtu)
		}
	}
	ping(t, a, "172.31.0.2")
	if mtu, err := na.RouteMTU(netip.MustParseAddr("172.31.0.2")); err != nil || mtu != 1400 {
		t.Fatalf("RouteMTU %d, %v", mtu, err)
	}
}

// TestKernelAvailable compares the probe with `ip link add type wireguard`
// (in a namespace of its own) and checks that the probe leaves no link.
func TestKernelAvailable(t *testing.T) {
	requireRoot(t)
	ns := newNetns(t)
	_, ipErr := run(t, ns, 10*time.Second, "ip", "link", "add", "wgprobe", "type", "wireguard")
	got := KernelAvailable()
	t.Logf("KernelAvailable = %v (ip link add: %v)", got, ipErr)
	if got != (ipErr == nil) {
		t.Fatalf("KernelAvailable = %v, but ip link add type wireguard gave %v", got, ipErr)
	}
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, "shwgprobe") {
			t.Fatalf("probe link %s left behind", l.Attrs().Name)
		}
	}
	if got {
		n := openNetlink(t, ns)
		name := ifName("k")
		if err := n.AddKernelWireGuard(name, 1420); err != nil {
			t.Fatal(err)
		}
		if err := n.DeleteLink(name); err != nil {
			t.Fatal(err)
		}
	}
}
