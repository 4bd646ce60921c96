package netd

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/google/nftables"

	"github.com/shoal-dev/shoal/pkg/client"
	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/daemon"
	"github.com/shoal-dev/shoal/pkg/dns"
	"github.com/shoal-dev/shoal/pkg/overlay"
	"github.com/shoal-dev/shoal/pkg/portproxy"
	"github.com/shoal-dev/shoal/pkg/statepb"
	"github.com/shoal-dev/shoal/pkg/wg"
	clusterv1 "github.com/shoal-dev/shoal/proto/shoal/cluster/v1"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

var errUnavailable = errdefs.ErrUnavailable

// State prefixes netd reads.
const (
	prefixNodes    = "/nodes/"
	prefixSubnets  = "/network/subnets/"
	prefixTasks    = "/tasks/"
	prefixSlots    = "/slots/"
	prefixServices = "/services/"
	keyCluster     = "/cluster/config"
)

// run waits until the node is in a cluster, brings the overlay up, and then
// keeps peers, DNS and published ports in step with the cluster's state.
func (n *node) run(ctx context.Context) error {
	if err := n.waitIdentity(ctx); err != nil {
		return nil
	}
	n.log = n.log.With("node", n.id)
	n.mirror = client.NewMirror(n.statd, n.log.With("component", "mirror"),
		prefixNodes, prefixSubnets, prefixTasks, prefixSlots, prefixServices, "/cluster/")
	changes := n.mirror.Changes()
	go n.mirror.Run(ctx)
	for !n.mirror.Ready() {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err := n.setup(ctx); err != nil {
		return err
	}
	close(n.ready)
	n.log.Info("overlay ready", "interface", n.iface, "mode", n.mode, "subnet", n.subnet.Load().String(), "mtu", n.mtu)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		n.reconcile(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-changes:
		}
	}
}

func (n *node) waitIdentity(ctx context.Context) error {
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := n.statd.Cluster.Identity(cctx, &clusterv1.IdentityRequest{})
		cancel()
		if err == nil {
			ip, perr := netip.ParseAddr(resp.GetAdvertiseIp())
			if perr == nil {
				n.id, n.advertise = resp.GetNodeId(), ip
				return nil
			}
		}
		// Poll often: a node that just joined is unreachable until netd
		// has seen it join, and the goal is reachable within 2 s of the
		// join (a 1 s poll alone cost about 1 s of that). The call is to
		// the local statd socket.
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// setup brings up (or re-adopts) the node's overlay: key, subnet,
// WireGuard device, bridge, routes, DNS and the port proxy.
func (n *node) setup(ctx context.Context) error {
	var err error
	if n.key, err = wg.LoadOrCreateKey(filepath.Join(n.cfg.StateDir, "wg.key")); err != nil {
		return err
	}
	n.overlay = netip.MustParsePrefix(DefaultOverlay)
	if d := n.mirror.Get(keyCluster); d != nil {
		if s := d.GetFields()["overlay_cidr"].GetStringValue(); s != "" {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				return fmt.Errorf("cluster overlay %q: %w", s, err)
			}
			n.overlay = p
		}
	}
	if err := n.claimSubnet(ctx); err != nil {
		return err
	}
	if n.nl, err = wg.OpenNetlink(""); err != nil {
		return err
	}
	// Lasting: its socket lives in this namespace whatever thread
	// flushes later.
	if n.nft, err = nftables.New(nftables.AsLasting()); err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	underlay := 1500
	if m, err := n.nl.AddrMTU(n.advertise); err == nil && m > 0 {
		underlay = m
	}
	n.mtu = overlay.MTU(underlay)
	n.iface = "shwg" + n.id[:min(8, len(n.id))]
	// Recorded for tooling that cleans up after a node (dev clusters).
	os.WriteFile(filepath.Join(n.cfg.StateDir, "iface"), []byte(n.iface+"\n"), 0o600)
	if err := n.device(); err != nil {
		return err
	}
	if err := n.loadIPAM(); err != nil {
		return err
	}
	if err := n.network(); err != nil {
		return err
	}
	// Peers before the node document: once the others read this node's
	// key they add it and send it a handshake at once (see peerKeepalive),
	// which this device drops unless it knows them already; a new node's
	// first handshakes with some peers then waited for WireGuard's 5 s
	// retry.
	if _, err := n.dev.ApplyPeers(n.desiredPeers()); err != nil {
		n.log.Warn("apply peers", "err", err)
	}
	if err := n.publish(ctx); err != nil {
		return err
	}
	gw := n.ipam.Gateway()
	listen := netip.AddrPortFrom(gw, uint16(n.cfg.DNSPort))
	n.scope.Store(&dnsScope{})
	n.dns, err = dns.New(dns.Config{
		Listen:    []string{listen.String()},
		Upstreams: n.upstreams(listen),
		Logger:    n.log.With("component", "dns"),
		Scope: func(client netip.Addr, name string, addrs []netip.Addr) ([]netip.Addr, bool) {
			return n.scope.Load().scope(client, name, addrs)
		},
		Forwards: func(client netip.Addr) bool { return n.scope.Load().forwards(client) },
	})
	if err != nil {
		return err
	}
	if err := n.dns.Start(ctx); err != nil {
		return fmt.Errorf("service DNS on %s: %w", gw, err)
	}
	n.proxy = portproxy.New(portproxy.Config{Logger: n.log.With("component", "ports")})
	if err := n.proxy.Listen(n.advertise); err != nil {
		return err
	}
	return nil
}

// device starts the WireGuard device, or re-adopts the one a previous
// netd left: kernel WireGuard when the kernel has it, else a userspace
// holder process.
func (n *node) device() error {
	if wg.KernelAvailable() {
		n.mode = "kernel"
		if ok, _ := n.nl.LinkExists(n.iface); !ok {
			if err := n.nl.AddKernelWireGuard(n.iface, n.mtu); err != nil {
				return err
			}
		}
	} else {
		n.mode = "userspace"
		if !wg.HolderAlive(n.iface) {
			pid, err := wg.StartHolderWith(n.cfg.HolderExe, []string{"wg-holder", "--iface", n.iface, "--mtu", strconv.Itoa(n.mtu)}, n.iface,
				wg.HolderOptions{Log: filepath.Join(n.cfg.StateDir, "wg-holder.log")})
			if err != nil && !errors.Is(err, wg.ErrHolderRunning) {
				return fmt.Errorf("start WireGuard holder: %w", err)
			}
			n.log.Info("WireGuard holder started", "interface", n.iface, "pid", pid)
			if err == nil {
				daemon.MoveToOwnScope(n.log, pid, "shoal-netd-wg", "Shoal netd's WireGuard device holder ("+n.iface+")",
					"shoal-netd.service", "shoal-schedd.service")
			}
		} else {
			n.log.Info("WireGuard holder re-adopted", "interface", n.iface)
		}
	}
	dev, err := wg.Open(n.iface)
	if err != nil {
		return err
	}
	n.dev = dev
	if err := dev.SetPrivateKey(n.key); err != nil {
		return err
	}
	return dev.SetListenPort(n.cfg.WGPort)
}

// network configures the bridge, the WireGuard link and the routes.
func (n *node) network() error {
	sub := *n.subnet.Load()
	gw := n.ipam.Gateway()
	if err := n.nl.EnsureBridge(n.cfg.Bridge, netip.PrefixFrom(gw, sub.Bits()), n.mtu); err != nil {
		return fmt.Errorf("bridge: %w", err)
	}
	// A subnet this node held before (lost to another node, or left at a
	// restart with another claim) must go from the bridge: its connected
	// route would keep that subnet, now routed to its new owner over
	// WireGuard, on the local bridge. Tasks still on such an address are
	// cut off until replaced; other nodes route it elsewhere anyway.
	if removed, err := n.nl.PruneAddrs(n.cfg.Bridge, netip.PrefixFrom(gw, sub.Bits()), n.overlay); err != nil {
		return fmt.Errorf("bridge: %w", err)
	} else if len(removed) > 0 {
		n.log.Warn("removed addresses of subnets this node no longer holds from the bridge", "bridge", n.cfg.Bridge, "addrs", removed)
	}
	if err := n.nl.SetLinkUp(n.iface, n.mtu); err != nil {
		return fmt.Errorf("wireguard link: %w", err)
	}
	if err := wg.EnableIPv4Forwarding(); err != nil {
		return err
	}
	// The overlay goes through WireGuard; the node's own subnet stays on
	// the bridge (a more specific route, added with the bridge address).
	if err := n.nl.ReplaceRoute(n.overlay, n.iface, gw); err != nil {
		return fmt.Errorf("overlay route: %w", err)
	}
	return nil
}

// publish writes this node's WireGuard identity into its node document.
func (n *node) publish(ctx context.Context) error {
	fields := map[string]crdt.Value{
		"wg_pubkey": crdt.String(n.key.PublicKey().String()),
		"wg_port":   crdt.Int(int64(n.cfg.WGPort)),
		"subnet":    crdt.String(n.subnet.Load().String()),
	}
	if d := n.mirror.Get(prefixNodes + n.id); d != nil {
		same := true
		for k, v := range fields {
			if cur := d.GetFields()[k]; cur == nil || statepb.ToValue(v).String() != cur.String() {
				same = false
			}
		}
		if same {
			return nil
		}
	}
	return n.put(ctx, prefixNodes+n.id, fields)
}

func (n *node) put(ctx context.Context, key string, fields map[string]crdt.Value) error {
	pf := make(map[string]*statev1.Value, len(fields))
	for k, v := range fields {
		pf[k] = statepb.ToValue(v)
	}
	_, err := n.statd.Put(ctx, &statev1.PutRequest{Key: key, Fields: pf})
	return err
}

// claimSubnet keeps this node's claim on a /24: the one it held (from
// disk), or a new one; a claim lost to another node is replaced.
func (n *node) claimSubnet(ctx context.Context) error {
	path := filepath.Join(n.cfg.StateDir, "subnet")
	var current netip.Prefix
	if b, err := os.ReadFile(path); err == nil {
		current, _ = netip.ParsePrefix(strings.TrimSpace(string(b)))
	}
	if p := n.subnet.Load(); p != nil {
		current = *p
	}
	claims := overlay.Claims{}
	for _, d := range n.mirror.List(prefixSubnets) {
		p, err := overlay.ParseSubnetKey(strings.TrimPrefix(d.GetKey(), prefixSubnets))
		if err == nil {
			claims[p] = d.GetFields()["node"].GetStringValue()
		}
	}
	dec, err := overlay.ClaimSubnet(n.overlay, n.id, current, claims)
	if err != nil {
		return err
	}
	if dec.Write {
		if err := n.put(ctx, prefixSubnets+overlay.SubnetKey(dec.Subnet), map[string]crdt.Value{"node": crdt.String(n.id)}); err != nil {
			return err
		}
	}
	for _, r := range dec.Release {
		n.statd.Delete(ctx, &statev1.DeleteRequest{Key: prefixSubnets + overlay.SubnetKey(r)})
	}
	if current.IsValid() && dec.Subnet != current {
		n.log.Warn("subnet claim lost; claimed another", "lost", current, "subnet", dec.Subnet)
	}
	if err := os.WriteFile(path, []byte(dec.Subnet.String()+"\n"), 0o600); err != nil {
		return err
	}
	sub := dec.Subnet
	n.subnet.Store(&sub)
	return nil
}

// loadIPAM reads the task address allocations of the node's subnet.
func (n *node) loadIPAM() error {
	sub := *n.subnet.Load()
	ipam, err := overlay.NewIPAM(sub)
	if err != nil {
		return err
	}
	if b, err := os.ReadFile(n.ipamPath()); err == nil {
		var saved overlay.IPAM
		if err := json.Unmarshal(b, &saved); err == nil && saved.Subnet() == sub {
			ipam = &saved
		}
	}
	n.mu.Lock()
	n.ipam = ipam
	n.mu.Unlock()
	return nil
}

func (n *node) ipamPath() string { return filepath.Join(n.cfg.StateDir, "ipam.json") }

// saveIPAM persists the allocations; callers hold mu.
func (n *node) saveIPAM() error {
	b, err := json.Marshal(n.ipam)
	if err != nil {
		return err
	}
	tmp := n.ipamPath() + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, n.ipamPath())
}

// upstreams are the configured resolvers, or those of /etc/resolv.conf.
// self is the service DNS's own address.
func (n *node) upstreams(self netip.AddrPort) []string {
	if len(n.cfg.Upstreams) > 0 {
		return n.cfg.Upstreams
	}
	f, err := os.Open("/etc/resolv.conf")
	if err != nil {
		return nil
	}
	defer f.Close()
	return resolvConfUpstreams(f, self)
}

// resolvConfUpstreams are the nameservers of a resolv.conf, but self (the
// service DNS itself: forwarding to it would loop).
//
// NB: loopback resolvers such as systemd-resolved's 127.0.0.53 are kept.
// netd forwards from its own network namespace, the node's, where they
// answer; a task never asks them (its resolv.conf names the node's service
// DNS, and 127.0.0.53 in a task's namespace is the task's own loopback).
// Dropping them, as netd once did, left nodes on such hosts with nothing
// to forward to. On a dev cluster node, whose namespace has a loopback of
// its own, give netd --upstream instead.
func resolvConfUpstreams(r io.Reader, self netip.AddrPort) []string {
	var out []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 2 || fs[0] != "nameserver" {
			continue
		}
		a, err := netip.ParseAddr(fs[1])
		if err != nil || (self.Port() == 53 && a.Unmap() == self.Addr()) {
			continue
		}
		out = append(out, a.String())
	}
	return out
}

// reconcileStall is how long a reconcile may run before netd says, while
// it is still running, where it is stuck: peers, DNS and published ports
// all wait for it, and a stage that never returns otherwise leaves no
// trace ("slow reconcile" is logged only once it ends).
const reconcileStall = 5 * time.Second

// statdCallTimeout bounds the reconcile's calls to statd, so that a statd
// that does not answer delays the next round instead of stopping them.
const statdCallTimeout = 10 * time.Second

// reconcile brings peers, the subnet claim, DNS and published ports in
// line with the mirrored state.
func (n *node) reconcile(ctx context.Context) {
	t0 := time.Now()
	var stage atomic.Pointer[string]
	enter := func(s string) { stage.Store(&s) }
	enter("subnet")
	stall := time.AfterFunc(reconcileStall, func() {
		n.log.Warn("reconcile stalled", "stage", *stage.Load(), "for", time.Since(t0).Round(time.Millisecond))
	})
	defer stall.Stop()
	before := *n.subnet.Load()
	sctx, cancel := context.WithTimeout(ctx, statdCallTimeout)
	err := n.claimSubnet(sctx)
	cancel()
	if err != nil {
		n.log.Warn("subnet claim", "err", err)
	} else if after := *n.subnet.Load(); after != before {
		// ctx, not sctx: the moved DNS server lives as long as it.
		enter("renumber")
		n.renumber(ctx, before, after)
	}
	t1 := time.Now()
	enter("peers")
	if _, err := n.dev.ApplyPeers(n.desiredPeers()); err != nil {
		n.log.Warn("apply peers", "err", err)
	}
	t2 := time.Now()
	enter("dns")
	// One listing of each prefix for the endpoints and the isolation.
	tasks, nodes := n.mirror.List(prefixTasks), n.mirror.List(prefixNodes)
	eps, services := endpoints(n.mirror.List(prefixSlots), tasks, nodes, time.Now()), decodeServices(n.mirror.List(prefixServices))
	iso := isolationOf(services, tasks, nodes)
	recs, owners := records(services, eps)
	n.scope.Store(newDNSScope(services, owners, iso))
	n.dns.Update(recs)
	t3 := time.Now()
	enter("ports")
	n.applyPorts(services, eps)
	t4 := time.Now()
	enter("isolation")
	n.isolate(iso)
	if d := time.Since(t0); d > 100*time.Millisecond {
		n.log.Warn("slow reconcile", "took", d, "subnet", t1.Sub(t0), "peers", t2.Sub(t1), "dns", t3.Sub(t2), "ports", t4.Sub(t3),
			"isolation", time.Since(t4))
	}
}

// renumber moves the node to a new subnet after losing a claim: a new
// bridge address and IPAM; tasks keep running on their old addresses
// until they are replaced.
func (n *node) renumber(ctx context.Context, from, to netip.Prefix) {
	if err := n.loadIPAM(); err != nil {
		n.log.Error("renumber", "err", err)
		return
	}
	n.mu.Lock()
	n.saveIPAM()
	n.mu.Unlock()
	if err := n.network(); err != nil {
		n.log.Error("renumber", "err", err)
	}
	// The service DNS listens on the bridge address, which has just
	// changed, and new tasks' resolv.conf names the new one: move the
	// server there (sharing the record table), as a restart of netd would.
	// Without this, tasks attached after a renumbering had no DNS.
	if err := n.moveDNS(ctx); err != nil {
		n.log.Error("renumber: service DNS", "err", err)
	}
	if err := n.publish(ctx); err != nil {
		n.log.Error("renumber", "err", err)
	}
	n.log.Warn("node renumbered", "from", from, "to", to)
}

// moveDNS rebinds the service DNS to the current bridge address: a new
// server on the same record table replaces the old one, which is closed
// first so that the port is free. Called from the run loop only (which is
// the only user of n.dns besides close, after the loop has ended).
func (n *node) moveDNS(ctx context.Context) error {
	n.mu.Lock()
	gw := n.ipam.Gateway()
	n.mu.Unlock()
	listen := netip.AddrPortFrom(gw, uint16(n.cfg.DNSPort))
	addr := listen.String()
	if slices.Equal(n.dns.Addrs(), []string{addr}) {
		return nil
	}
	srv, err := dns.New(dns.Config{
		Listen:    []string{addr},
		Upstreams: n.upstreams(listen),
		Records:   n.dns.Records(),
		Logger:    n.log.With("component", "dns"),
	})
	if err != nil {
		return err
	}
	n.dns.Close()
	n.dns = srv
	return srv.Start(ctx)
}

// peerKeepalive is every peer's persistent keepalive. Besides keeping
// sessions warm, it makes a fresh WireGuard device (a node restarted with
// its holder, or a new node) send a keepalive, and so a handshake, to each
// peer as soon as the peer is configured. Without it, a peer that still
// holds a session with the device's previous incarnation keeps sending on
// it into the void until WireGuard gives up on it (keepalive + rekey
// timeout, about 15 s): a restarted node's tasks stayed unreachable from
// the other nodes for that long.
const peerKeepalive = 25 * time.Second

// desiredPeers are the other nodes with a WireGuard key.
func (n *node) desiredPeers() []overlay.Peer {
	var out []overlay.Peer
	for _, d := range n.mirror.List(prefixNodes) {
		id := strings.TrimPrefix(d.GetKey(), prefixNodes)
		f := d.GetFields()
		if id == n.id || f["left"].GetBoolValue() {
			continue
		}
		key, err := parseKey(f["wg_pubkey"].GetStringValue())
		if err != nil {
			continue
		}
		addr, err1 := netip.ParseAddr(f["addr"].GetStringValue())
		sub, err2 := netip.ParsePrefix(f["subnet"].GetStringValue())
		port := f["wg_port"].GetIntValue()
		if err1 != nil || err2 != nil || port <= 0 || port > 65535 {
			continue
		}
		out = append(out, overlay.Peer{PublicKey: key, Endpoint: netip.AddrPortFrom(addr, uint16(port)), AllowedIPs: []netip.Prefix{sub},
			PersistentKeepalive: peerKeepalive})
	}
	return out
}
