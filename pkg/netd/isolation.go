package netd

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/shoal-dev/shoal/pkg/sched"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

// isolation is what keeps services on different overlay networks apart:
// per network, the addresses of its tasks. A task reaches another task
// only if one network holds both; the nodes' bridge addresses (gateways:
// a node's own connections, health checks, published ports' proxies)
// reach every task.
type isolation struct {
	gateways []netip.Addr
	tasks    []netip.Addr
	networks []overlayNetwork
	// sealed are the tasks on internal networks only: they reach
	// nothing outside the overlay but the DNS of the nodes.
	sealed []netip.Addr
	// ports are this node's task veths with their tasks' addresses:
	// what comes in through one must come from its address.
	ports []taskPort
}

// taskPort is a task's veth on this node's bridge and its address.
type taskPort struct {
	veth string
	addr netip.Addr
}

// localPorts lists the ports of this node's tasks from its IPAM; n.mu
// held.
func (n *node) localPorts() []taskPort {
	allocs := n.ipam.Allocations()
	out := make([]taskPort, 0, len(allocs))
	for _, a := range allocs {
		_, veth := taskNames(a.Owner)
		out = append(out, taskPort{veth: veth, addr: a.Addr})
	}
	return out
}

// overlayNetwork is one network of isolation: its tasks' addresses and
// the services on it.
type overlayNetwork struct {
	name     string
	services []string
	addrs    []netip.Addr
	internal bool
}

func (iso isolation) equal(o isolation) bool {
	return slices.Equal(iso.gateways, o.gateways) && slices.Equal(iso.tasks, o.tasks) && slices.Equal(iso.ports, o.ports) &&
		slices.Equal(iso.sealed, o.sealed) &&
		slices.EqualFunc(iso.networks, o.networks, func(a, b overlayNetwork) bool {
			return a.name == b.name && a.internal == b.internal && slices.Equal(a.services, b.services) && slices.Equal(a.addrs, b.addrs)
		})
}

// isolationOf derives the isolation from the service, task and node
// documents. Every task with an overlay address that is not finished
// counts, running or not: an address reached before its task is healthy
// is still that service's. A task whose service is unknown here (its
// document not arrived) is on no network, so nothing reaches it but the
// nodes until it is known. A network is internal if a service on it says
// so, whatever the others say: the safer reading, and every node's alike.
func isolationOf(services []*sched.Service, tasks, nodes []*statev1.Document) isolation {
	var iso isolation
	for _, d := range nodes {
		if sub, err := netip.ParsePrefix(d.GetFields()["subnet"].GetStringValue()); err == nil && sub.Addr().Is4() {
			iso.gateways = append(iso.gateways, sub.Masked().Addr().Next())
		}
	}
	bySvc := map[string]*sched.Service{}
	for _, s := range services {
		bySvc[s.Name] = s
	}
	nets := map[string]*overlayNetwork{}
	for _, s := range services {
		for _, n := range s.Spec.OnNetworks() {
			if nets[n] == nil {
				nets[n] = &overlayNetwork{name: n}
			}
			nets[n].services = append(nets[n].services, s.Name)
			nets[n].internal = nets[n].internal || slices.Contains(s.Spec.Internal, n)
		}
	}
	for _, d := range tasks {
		f := d.GetFields()
		ip, err := netip.ParseAddr(f["ip"].GetStringValue())
		if err != nil || !ip.Is4() || sched.TaskState(f["state"].GetStringValue()).Terminal() {
			continue
		}
		iso.tasks = append(iso.tasks, ip)
		if s := bySvc[f["service"].GetStringValue()]; s != nil {
			for _, n := range s.Spec.OnNetworks() {
				nets[n].addrs = append(nets[n].addrs, ip)
			}
			if allInternal(s.Spec, func(n string) bool { return nets[n].internal }) {
				iso.sealed = append(iso.sealed, ip)
			}
		}
	}
	for _, n := range nets {
		slices.Sort(n.services)
		n.addrs = sortedAddrs(n.addrs)
		iso.networks = append(iso.networks, *n)
	}
	slices.SortFunc(iso.networks, func(a, b overlayNetwork) int { return strings.Compare(a.name, b.name) })
	iso.gateways, iso.tasks, iso.sealed = sortedAddrs(iso.gateways), sortedAddrs(iso.tasks), sortedAddrs(iso.sealed)
	return iso
}

func sortedAddrs(a []netip.Addr) []netip.Addr {
	slices.SortFunc(a, func(x, y netip.Addr) int { return x.Compare(y) })
	return slices.Compact(a)
}

// isolate applies iso, the isolation the documents now call for, with
// the ports of this node's tasks as its IPAM has them, when it changed.
//
// Lock order: n.mu, then isoMu. The ports are read under n.mu, and isoMu
// is taken before n.mu is let go, so that every application of the rules
// (this one and guardPorts') reads the IPAM after the one before it: no
// application can undo a newer port's check.
func (n *node) isolate(iso isolation) {
	n.mu.Lock()
	iso.ports = n.localPorts()
	n.keepSealing(&iso)
	n.isoMu.Lock()
	n.mu.Unlock()
	defer n.isoMu.Unlock()
	n.applyLocked(iso)
}

// guardPorts applies the rules last applied again with the ports of this
// node's tasks as its IPAM now has them, and with the new task at addr
// sealed if spec, its service's (nil: not known here yet), is on internal
// networks only. Attach calls it (n.mu held) once a task has its address
// and before its veth exists, so that the task's packets are checked from
// the first: the reconcile after its start comes a fraction of a second
// later. Before the first reconcile there are no rules of this netd's to
// add to (those of the one before it stay), and that reconcile reads the
// IPAM anew.
func (n *node) guardPorts(addr netip.Addr, spec *sched.ServiceSpec) {
	ports := n.localPorts()
	n.isoMu.Lock()
	defer n.isoMu.Unlock()
	if !n.applied {
		return
	}
	iso := n.iso
	iso.ports = ports
	internal := func(name string) bool {
		i := slices.IndexFunc(iso.networks, func(n overlayNetwork) bool { return n.name == name })
		return slices.Contains(spec.Internal, name) || i >= 0 && iso.networks[i].internal
	}
	if spec != nil && allInternal(*spec, internal) {
		if n.sealing == nil {
			n.sealing = map[netip.Addr]bool{}
		}
		n.sealing[addr] = true
		n.keepSealing(&iso)
	}
	n.applyLocked(iso)
}

// keepSealing adds to iso.sealed the tasks sealed at their attach whose
// documents iso does not count yet, and forgets those it counts (it
// decides from now on) or that lost their address; n.mu held, iso.ports
// read.
func (n *node) keepSealing(iso *isolation) {
	if len(n.sealing) == 0 {
		return
	}
	sealed := slices.Clone(iso.sealed)
	for a := range n.sealing {
		_, known := slices.BinarySearchFunc(iso.tasks, a, netip.Addr.Compare)
		if known || !slices.ContainsFunc(iso.ports, func(p taskPort) bool { return p.addr == a }) {
			delete(n.sealing, a)
			continue
		}
		sealed = append(sealed, a)
	}
	iso.sealed = sortedAddrs(sealed)
}

// allInternal reports whether a task of spec is sealed: every network it is
// on is internal (isolationOf and guardPorts know that differently).
func allInternal(spec sched.ServiceSpec, internal func(network string) bool) bool {
	on := spec.OnNetworks()
	return len(on) > 0 && !slices.ContainsFunc(on, func(n string) bool { return !internal(n) })
}

// applyLocked applies iso unless it is what was applied last; isoMu held.
func (n *node) applyLocked(iso isolation) {
	if n.applied && iso.equal(n.iso) {
		return
	}
	if err := applyIsolation(n.nft, iso, n.overlay, n.cfg.Bridge, uint16(n.cfg.DNSPort)); err != nil {
		n.log.Warn("apply network isolation", "err", err)
		return
	}
	n.iso, n.applied = iso, true
}

// isolationTable names netd's nftables tables (one inet, one bridge).
const isolationTable = "shoal"

// applyIsolation replaces netd's tables with iso's rules, in one
// transaction, so that no packet sees a half-built ruleset. The inet
// table filters traffic routed between the node's bridge and WireGuard
// (tasks of different nodes), the bridge table traffic between two ports
// of the bridge (tasks of this node), which never reaches the IP forward
// hook. For IPv4:
//
//	inet:   iifname BRIDGE ip saddr @gateways drop
//	inet:   ip saddr @gateways accept
//	both:   ip saddr @net_N ip daddr @net_N accept    (one per network)
//	both:   ip saddr OVERLAY ip daddr @tasks drop
//
// so traffic from outside the overlay (the node's masqueraded or proxied
// connections) and to anything but a task passes, but from a sealed task
// (on internal networks only):
//
//	inet forward: ip saddr @sealed ip daddr != OVERLAY drop
//	inet input:   ip saddr @sealed ct state established,related accept
//	inet input:   ip saddr @sealed udp/tcp dport DNS accept
//	inet input:   ip saddr @sealed drop
//
// (it reaches no host outside the overlay, nor a node but for its DNS
// and the replies to the node's own connections: health checks,
// published ports' proxies); other tasks' traffic out of the overlay is
// masqueraded:
//
//	inet postrouting (nat): ip saddr OVERLAY ip daddr != OVERLAY masquerade
//
// and before all that,
// in the bridge table's prerouting, a task's packets and ARP messages
// must come from its own address (antiSpoof). A node's own traffic
// leaves it through the output hook, never forward: a forwarded packet
// from a gateway's address that came in from the bridge, or crosses
// between two of its ports, is a task's forgery, and it is dropped (the
// first rule; the bridge table has no gateway rule at all).
func applyIsolation(conn *nftables.Conn, iso isolation, overlay netip.Prefix, bridge string, dnsPort uint16) error {
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyINet, nftables.TableFamilyBridge} {
		t := &nftables.Table{Name: isolationTable, Family: fam}
		conn.AddTable(t)
		conn.DelTable(t)
		t = conn.AddTable(&nftables.Table{Name: isolationTable, Family: fam})
		accept := nftables.ChainPolicyAccept
		ch := conn.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
		set := func(name string, addrs []netip.Addr) (*nftables.Set, error) {
			s := &nftables.Set{Table: t, Name: name, KeyType: nftables.TypeIPAddr}
			elems := make([]nftables.SetElement, 0, len(addrs))
			for _, a := range addrs {
				elems = append(elems, nftables.SetElement{Key: a.AsSlice()})
			}
			if err := conn.AddSet(s, elems); err != nil {
				return nil, fmt.Errorf("nftables set %s: %w", name, err)
			}
			return s, nil
		}
		ruleIn := func(ch *nftables.Chain, parts ...[]expr.Any) {
			exprs := ipv4Only(fam)
			for _, p := range parts {
				exprs = append(exprs, p...)
			}
			conn.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: exprs})
		}
		rule := func(parts ...[]expr.Any) { ruleIn(ch, parts...) }
		if fam == nftables.TableFamilyINet {
			gw, err := set("gateways", iso.gateways)
			if err != nil {
				return err
			}
			rule(ifname(expr.MetaKeyIIFNAME, bridge), addrIn(saddrOffset, gw), verdict(expr.VerdictDrop))
			rule(addrIn(saddrOffset, gw), verdict(expr.VerdictAccept))
			sealed, err := set("sealed", iso.sealed)
			if err != nil {
				return err
			}
			rule(addrIn(saddrOffset, sealed), prefixCmp(daddrOffset, overlay, expr.CmpOpNeq), verdict(expr.VerdictDrop))
			input := conn.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
				Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
			ruleIn(input, addrIn(saddrOffset, sealed), ctReply(), verdict(expr.VerdictAccept))
			for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
				ruleIn(input, addrIn(saddrOffset, sealed), dport(proto, dnsPort), verdict(expr.VerdictAccept))
			}
			ruleIn(input, addrIn(saddrOffset, sealed), verdict(expr.VerdictDrop))
			// Tasks' own traffic out of the overlay leaves with the node's
			// address, as Docker's bridge masquerades: nothing outside
			// routes the overlay back, and WireGuard would drop a reply
			// from another node's address anyway.
			nat := conn.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
				Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
			ruleIn(nat, prefixCmp(saddrOffset, overlay, expr.CmpOpEq), prefixCmp(daddrOffset, overlay, expr.CmpOpNeq), []expr.Any{&expr.Masq{}})
		}
		for i, n := range iso.networks {
			s, err := set(fmt.Sprintf("net_%d", i), n.addrs)
			if err != nil {
				return err
			}
			rule(addrIn(saddrOffset, s), addrIn(daddrOffset, s), verdict(expr.VerdictAccept))
		}
		tasks, err := set("tasks", iso.tasks)
		if err != nil {
			return err
		}
		rule(prefixCmp(saddrOffset, overlay, expr.CmpOpEq), addrIn(daddrOffset, tasks), verdict(expr.VerdictDrop))
		if fam == nftables.TableFamilyBridge {
			antiSpoof(conn, t, iso.ports)
		}
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	return nil
}

// antiSpoof adds the bridge table's prerouting chain: an IPv4 packet or
// an ARP message that comes in through a task's veth must carry that
// task's address as its source (the ARP sender's), so that no task
// passes for another, or for its node, in a packet or in an ARP answer.
// An ARP probe, whose sender is 0.0.0.0 (duplicate address detection,
// RFC 5227: `arping -D`), passes: no host learns a mapping from it.
func antiSpoof(conn *nftables.Conn, t *nftables.Table, ports []taskPort) {
	accept := nftables.ChainPolicyAccept
	ch := conn.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	for _, p := range ports {
		for _, proto := range []struct {
			ethertype uint16
			offset    uint32 // of the source address in the network header
		}{{unix.ETH_P_IP, saddrOffset}, {unix.ETH_P_ARP, arpSenderIPOffset}} {
			exprs := append(ifname(expr.MetaKeyIIFNAME, p.veth), etherType(proto.ethertype)...)
			exprs = append(exprs,
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: proto.offset, Len: 4},
				&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: p.addr.AsSlice()})
			if proto.ethertype == unix.ETH_P_ARP {
				exprs = append(exprs, &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: netip.IPv4Unspecified().AsSlice()})
			}
			exprs = append(exprs, &expr.Verdict{Kind: expr.VerdictDrop})
			conn.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: exprs})
		}
	}
}

const (
	saddrOffset = 12 // in the IPv4 header
	daddrOffset = 16
	// arpSenderIPOffset is where an Ethernet/IPv4 ARP message holds
	// its sender's IPv4 address (after hardware and protocol types and
	// sizes, the operation and the sender's MAC).
	arpSenderIPOffset = 14
)

// ipv4Only matches IPv4 packets: in the inet family by netfilter
// protocol, in the bridge family by EtherType.
func ipv4Only(fam nftables.TableFamily) []expr.Any {
	if fam == nftables.TableFamilyBridge {
		return etherType(unix.ETH_P_IP)
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
	}
}

// ifname matches an interface name (IFNAMSIZ bytes, zero padded).
func ifname(key expr.MetaKey, name string) []expr.Any {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b},
	}
}

// etherType matches frames of one EtherType (bridge family).
func etherType(t uint16) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(t)},
	}
}

func addrIn(offset uint32, s *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID},
	}
}

// prefixCmp matches an address in p (CmpOpEq) or outside it (CmpOpNeq).
func prefixCmp(offset uint32, p netip.Prefix, op expr.CmpOp) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: net.CIDRMask(p.Bits(), 32), Xor: make([]byte, 4)},
		&expr.Cmp{Op: op, Register: 1, Data: p.Masked().Addr().AsSlice()},
	}
}

// ctReply matches packets of connections already seen both ways, or
// related to one (ct state established,related).
func ctReply() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

// dport matches a transport protocol and destination port.
func dport(proto byte, port uint16) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }
