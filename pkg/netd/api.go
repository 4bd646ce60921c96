package netd

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/shoal-dev/shoal/pkg/overlay"
	"github.com/shoal-dev/shoal/pkg/wg"
	netv1 "github.com/shoal-dev/shoal/proto/shoal/net/v1"
)

// api serves shoal.net.v1 on the local socket.
type api struct {
	netv1.UnimplementedNetworkServer
	n *node
}

// taskNames are the kernel names of a task's namespace and host veth. The
// namespace name is visible to every node of a dev cluster on one machine,
// so it carries the (cluster-unique) task ID; the veth name is at most 15
// bytes, so it carries a hash of it.
func taskNames(task string) (netns, veth string) {
	sum := sha256.Sum256([]byte(task))
	return "shoal-" + task, "ve" + hex.EncodeToString(sum[:6])
}

func validTask(task string) error {
	if task == "" || len(task) > 200 || strings.ContainsAny(task, "/ \x00") {
		return fmt.Errorf("task ID %q: %w", task, errdefs.ErrInvalidArgument)
	}
	return nil
}

func (s *api) Attach(ctx context.Context, req *netv1.AttachRequest) (*netv1.AttachResponse, error) {
	n := s.n
	if !n.isReady() {
		return nil, errNotReady
	}
	if err := validTask(req.GetTask()); err != nil {
		return nil, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	ip, err := n.ipam.Allocate(req.GetTask())
	if err != nil {
		return nil, fmt.Errorf("address for task %s: %v: %w", req.GetTask(), err, errdefs.ErrResourceExhausted)
	}
	if err := n.saveIPAM(); err != nil {
		return nil, err
	}
	spec := specOf(n.mirror.Get, req.GetService())
	n.guardPorts(ip, spec)
	nsName, veth := taskNames(req.GetTask())
	nsPath := wg.NetnsPath(nsName)
	gw := n.ipam.Gateway()
	if _, err := os.Stat(nsPath); err != nil {
		if nsPath, err = wg.CreateNetns(nsName); err != nil {
			return nil, fmt.Errorf("netns for task %s: %w", req.GetTask(), err)
		}
	}
	if ok, _ := n.nl.LinkExists(veth); !ok {
		if err := n.nl.AddTaskVeth(veth, n.cfg.Bridge, nsPath, n.mtu); err != nil {
			return nil, fmt.Errorf("veth for task %s: %w", req.GetTask(), err)
		}
	}
	sub := n.ipam.Subnet()
	if err := wg.ConfigureTaskNetns(nsPath, netip.PrefixFrom(ip, sub.Bits()), gw, n.mtu); err != nil {
		return nil, fmt.Errorf("configure task %s: %w", req.GetTask(), err)
	}
	resolv := filepath.Join(n.cfg.StateDir, "resolv", req.GetTask()+".conf")
	conf := fmt.Sprintf("nameserver %s\nsearch %s\noptions ndots:1\n", gw, stackSearch(spec))
	if err := os.WriteFile(resolv, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	return &netv1.AttachResponse{Netns: nsPath, Ip: ip.String(), Gateway: gw.String(), Mtu: int32(n.mtu), ResolvConf: resolv}, nil
}

func (s *api) Detach(ctx context.Context, req *netv1.DetachRequest) (*netv1.DetachResponse, error) {
	n := s.n
	if !n.isReady() {
		return nil, errNotReady
	}
	if err := validTask(req.GetTask()); err != nil {
		return nil, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	nsName, veth := taskNames(req.GetTask())
	if err := n.nl.DeleteLink(veth); err != nil {
		n.log.Warn("delete task veth", "task", req.GetTask(), "err", err)
	}
	if err := wg.DeleteNetns(nsName); err != nil && !os.IsNotExist(err) {
		n.log.Warn("delete task netns", "task", req.GetTask(), "err", err)
	}
	if _, ok := n.ipam.Release(req.GetTask()); ok {
		if err := n.saveIPAM(); err != nil {
			return nil, err
		}
	}
	os.Remove(filepath.Join(n.cfg.StateDir, "resolv", req.GetTask()+".conf"))
	return &netv1.DetachResponse{}, nil
}

func (s *api) Status(ctx context.Context, _ *netv1.StatusRequest) (*netv1.StatusResponse, error) {
	n := s.n
	if !n.isReady() {
		return nil, errNotReady
	}
	resp := &netv1.StatusResponse{
		NodeId: n.id, OverlayCidr: n.overlay.String(), Subnet: n.subnet.Load().String(), Interface: n.iface,
		Mode: n.mode, PublicKey: n.key.PublicKey().String(), Mtu: int32(n.mtu),
		Dns: fmt.Sprintf("%s:%d", n.ipam.Gateway(), n.cfg.DNSPort),
	}
	byKey := map[string]string{}
	subnets := map[string]string{}
	for _, d := range n.mirror.List(prefixNodes) {
		id := strings.TrimPrefix(d.GetKey(), prefixNodes)
		byKey[d.GetFields()["wg_pubkey"].GetStringValue()] = id
		subnets[id] = d.GetFields()["subnet"].GetStringValue()
	}
	peers, err := n.dev.Peers()
	if err != nil {
		return nil, err
	}
	for _, p := range peers {
		id := byKey[p.PublicKey.String()]
		out := &netv1.Peer{Node: id, PublicKey: p.PublicKey.String(), Subnet: subnets[id], RxBytes: p.RxBytes, TxBytes: p.TxBytes}
		if p.Endpoint.IsValid() {
			out.Endpoint = p.Endpoint.String()
		}
		if !p.LastHandshake.IsZero() {
			out.LastHandshake = timestamppb.New(p.LastHandshake)
		}
		resp.Peers = append(resp.Peers, out)
	}
	for _, d := range n.mirror.List(prefixSubnets) {
		p, err := overlay.ParseSubnetKey(strings.TrimPrefix(d.GetKey(), prefixSubnets))
		if err == nil {
			resp.Subnets = append(resp.Subnets, &netv1.Subnet{Subnet: p.String(), Node: d.GetFields()["node"].GetStringValue()})
		}
	}
	n.mu.Lock()
	resp.Tasks = uint32(n.ipam.Len())
	n.mu.Unlock()
	n.pubMu.Lock()
	pubs := n.pubs
	n.pubMu.Unlock()
	for _, p := range n.proxy.Ports() {
		out := &netv1.PublishedPort{Port: uint32(p.Port), Protocol: string(p.Proto), Active: uint32(p.Active)}
		if pub := pubs[portKey{p.Port, p.Proto}]; pub != nil {
			out.Service, out.Conflicting = pub.service, pub.conflicting
		}
		for _, b := range p.Backends {
			out.Backends = append(out.Backends, b.String())
		}
		for _, b := range p.Bound {
			out.Bound = append(out.Bound, b.String())
		}
		for a, err := range p.BindErrors {
			out.BindErrors = append(out.BindErrors, fmt.Sprintf("%s: %v", a, err))
		}
		slices.Sort(out.BindErrors)
		resp.Published = append(resp.Published, out)
	}
	n.isoMu.Lock()
	iso := n.iso
	n.isoMu.Unlock()
	aliases := n.scope.Load().aliases()
	for _, nw := range iso.networks {
		out := &netv1.OverlayNetwork{Name: nw.name, Services: nw.services, Aliases: aliases[nw.name], Internal: nw.internal}
		for _, a := range nw.addrs {
			out.Addresses = append(out.Addresses, a.String())
		}
		resp.Networks = append(resp.Networks, out)
	}
	slices.SortFunc(resp.Published, func(a, b *netv1.PublishedPort) int {
		return cmp.Or(cmp.Compare(a.GetPort(), b.GetPort()), strings.Compare(a.GetProtocol(), b.GetProtocol()))
	})
	return resp, nil
}
