package netd

import (
	"net/netip"
	"slices"
	"strings"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/shoal-dev/shoal/pkg/portproxy"
	"github.com/shoal-dev/shoal/pkg/sched"
	"github.com/shoal-dev/shoal/pkg/statepb"
)

func parseKey(s string) (wgtypes.Key, error) { return wgtypes.ParseKey(s) }

// endpoint is a task that can take traffic: current (its slot names it),
// running, and healthy if the service has a health check.
type endpoint struct {
	service, slot string
	ip            netip.Addr
}

func (n *node) endpoints() []endpoint {
	current := map[string]bool{}
	for _, d := range n.mirror.List(prefixSlots) {
		svc, slot, ok := sched.ParseSlotDocKey(d.GetKey())
		if !ok {
			continue
		}
		if sl, ok := sched.SlotFromDoc(svc, slot, statepb.FromDocument(d)); ok && sl.Task != "" {
			current[sl.Task] = true
		}
	}
	var out []endpoint
	for _, d := range n.mirror.List(prefixTasks) {
		id := strings.TrimPrefix(d.GetKey(), prefixTasks)
		f := d.GetFields()
		if !current[id] || f["state"].GetStringValue() != string(sched.TaskRunning) {
			continue
		}
		if h := f["health"].GetStringValue(); h != "" && h != string(sched.HealthHealthy) {
			continue
		}
		ip, err := netip.ParseAddr(f["ip"].GetStringValue())
		if err != nil {
			continue
		}
		out = append(out, endpoint{service: f["service"].GetStringValue(), slot: f["slot"].GetStringValue(), ip: ip})
	}
	return out
}

// records are the DNS names of the healthy tasks: <service>.shoal. for
// all of a service's, <slot>.<service>.shoal. for each.
func (n *node) records() map[string][]netip.Addr {
	out := map[string][]netip.Addr{}
	for _, e := range n.endpoints() {
		svc := e.service + ".shoal."
		out[svc] = append(out[svc], e.ip)
		out[e.slot+"."+svc] = []netip.Addr{e.ip}
	}
	return out
}

type portKey struct {
	port  uint16
	proto portproxy.Proto
}

// applyPorts points every published (ingress) port of every service at
// that service's healthy tasks, and unbinds ports no service publishes.
func (n *node) applyPorts() {
	byService := map[string][]netip.Addr{}
	for _, e := range n.endpoints() {
		byService[e.service] = append(byService[e.service], e.ip)
	}
	want := map[portKey][]netip.AddrPort{}
	for _, d := range n.mirror.List(prefixServices) {
		name := strings.TrimPrefix(d.GetKey(), prefixServices)
		svc, err := sched.ServiceFromDoc(name, statepb.FromDocument(d))
		if err != nil || svc == nil || svc.Spec.Network == sched.NetworkHost {
			continue
		}
		for _, p := range svc.Spec.Ports {
			if p.Mode == sched.PortHost {
				continue
			}
			k := portKey{uint16(p.Host), portproxy.Proto(cmpProto(p.Protocol))}
			var backs []netip.AddrPort
			for _, ip := range byService[name] {
				backs = append(backs, netip.AddrPortFrom(ip, uint16(p.Container)))
			}
			want[k] = backs
		}
	}
	for _, st := range n.proxy.Ports() {
		if _, ok := want[portKey{st.Port, st.Proto}]; !ok {
			n.proxy.Remove(st.Port, st.Proto)
		}
	}
	for k, backs := range want {
		slices.SortFunc(backs, func(a, b netip.AddrPort) int { return a.Compare(b) })
		if err := n.proxy.Set(k.port, k.proto, backs); err != nil {
			n.log.Warn("publish port", "port", k.port, "proto", k.proto, "err", err)
		}
	}
}

func cmpProto(p string) string {
	if p == "" {
		return "tcp"
	}
	return p
}
