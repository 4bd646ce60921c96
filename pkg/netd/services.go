package netd

import (
	"cmp"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/portproxy"
	"github.com/shoal-dev/shoal/pkg/sched"
	"github.com/shoal-dev/shoal/pkg/statepb"
	netv1 "github.com/shoal-dev/shoal/proto/shoal/net/v1"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

func parseKey(s string) (wgtypes.Key, error) { return wgtypes.ParseKey(s) }

// endpoint is a task that can take traffic: its slot names it (as the
// slot's task, or as the replacement being started: a replacement serves
// as soon as it is healthy, as in a start-first update, rather than once
// its owner has promoted it, which took seconds), running, and healthy if
// the service has a health check.
type endpoint struct {
	service, slot string
	ip            netip.Addr
}

// handOverWindow is how long after the slot write that replaced it a task
// of a node that shut down may still take traffic (endpoints): as long as
// such a node's schedd may take to stop its tasks, and bounded, should
// the machine die before it records them stopped.
const handOverWindow = 30 * time.Second

// endpoints picks the tasks that can take traffic out of the slot and
// task documents. A task without an overlay address (a --network host
// task, or one netd has not attached yet) is none.
//
// A task its slot replaced as lost (Slot.Lost) because its node shut down
// (sched.Node.ShutDown) still takes traffic while it runs, for
// handOverWindow at most: its node stops it once the replacement runs
// (start-first) or at once, and until then it serves, so that a service
// handed over at a shutdown has no gap (TestSystemdCluster).
func endpoints(slots, tasks, nodes []*statev1.Document, now time.Time) []endpoint {
	current := map[string]bool{}
	handedOver := map[string]bool{}
	for _, d := range slots {
		svc, slot, ok := sched.ParseSlotDocKey(d.GetKey())
		if !ok {
			continue
		}
		if sl, ok := sched.SlotFromDoc(svc, slot, statepb.FromDocument(d)); ok {
			for _, id := range []string{sl.Task, sl.Next} {
				if sl.Names(id) {
					current[id] = true
				}
			}
			if sl.Lost != "" && now.Before(sl.Stamp.TS.Time().Add(handOverWindow)) {
				handedOver[sl.Lost] = true
			}
		}
	}
	shutDown := map[string]bool{}
	for _, d := range nodes {
		id := strings.TrimPrefix(d.GetKey(), prefixNodes)
		if sched.NodeFromDoc(id, statepb.FromDocument(d), false).ShutDown {
			shutDown[id] = true
		}
	}
	var out []endpoint
	for _, d := range tasks {
		id := strings.TrimPrefix(d.GetKey(), prefixTasks)
		f := d.GetFields()
		serves := current[id] || handedOver[id] && shutDown[f["node"].GetStringValue()]
		if !serves || f["state"].GetStringValue() != string(sched.TaskRunning) {
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

// decodeServices decodes the service documents once for records and
// publications, sorted by name (the mirror lists them in no order; the
// records and the network listing must not depend on it). A service
// whose spec does not decode (a newer schedd's?) keeps its name, and so
// its DNS name, with an empty spec: no alias, no published port.
func decodeServices(docs []*statev1.Document) []*sched.Service {
	out := make([]*sched.Service, 0, len(docs))
	for _, d := range docs {
		doc := statepb.FromDocument(d)
		if !doc.Exists() {
			continue
		}
		name := strings.TrimPrefix(d.GetKey(), prefixServices)
		svc, err := sched.ServiceFromDoc(name, doc)
		if err != nil || svc == nil {
			svc = &sched.Service{Name: name}
		}
		out = append(out, svc)
	}
	slices.SortFunc(out, func(a, b *sched.Service) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// records are the DNS names of the endpoints: <service>.shoal. for all of
// a service's, <slot>.<service>.shoal. for each slot's (two while a
// replacement starts). Every service in services has its name, with no
// addresses while none of its tasks can take traffic: NODATA, not
// NXDOMAIN, which resolvers would cache as "no such service".
//
// A stack's service also answers as <alias>.<stack>.shoal. (and its slots
// under that): the name its Compose file gives it, which the stack's
// tasks resolve alone through their search list (stackSearch).
//
// A service's network aliases (ServiceSpec.Aliases) are names of the
// same addresses, <alias>.shoal. (<alias>.<stack>.shoal. for a stack's),
// seen on their network only. Services may share an alias, as in Docker:
// it answers with the addresses of those that share a network with the
// client asking (dnsScope), and with all of them in the records. A
// service's own name is never an alias: the alias is not made.
//
// owners maps each name to its service, and an alias to the services
// that claim it, in service order, each with its networks and addresses
// (for dnsScope).
func records(services []*sched.Service, eps []endpoint) (out map[string][]netip.Addr, owners map[string][]nameOwner) {
	out, owners = map[string][]netip.Addr{}, map[string][]nameOwner{}
	names := map[string][]string{} // service -> its DNS names
	for _, svc := range services {
		name := svc.Name
		names[name] = []string{name + ".shoal."}
		if alias := svc.Spec.StackAlias(); alias != "" {
			names[name] = append(names[name], alias+"."+svc.Spec.Stack+".shoal.")
		}
		for _, n := range names[name] {
			out[n], owners[n] = nil, []nameOwner{{service: name}}
		}
	}
	aliases := map[string][]string{} // service -> its alias names, not its slots'
	for _, svc := range services {
		domain := "shoal."
		if svc.Spec.StackAlias() != "" {
			domain = svc.Spec.Stack + ".shoal."
		}
		for _, network := range slices.Sorted(maps.Keys(svc.Spec.Aliases)) {
			for _, a := range svc.Spec.Aliases[network] {
				n := a + "." + domain
				claims, taken := owners[n]
				if taken && len(claims[0].networks) == 0 { // a service's own name
					continue
				}
				if i := slices.IndexFunc(claims, func(o nameOwner) bool { return o.service == svc.Name }); i >= 0 {
					claims[i].networks = append(claims[i].networks, network) // its alias on another network too
					continue
				}
				out[n], owners[n] = nil, append(claims, nameOwner{service: svc.Name, networks: []string{network}})
				aliases[svc.Name] = append(aliases[svc.Name], n)
			}
		}
	}
	for _, e := range eps {
		for _, svc := range names[e.service] {
			out[svc] = append(out[svc], e.ip)
			out[e.slot+"."+svc] = append(out[e.slot+"."+svc], e.ip)
			owners[e.slot+"."+svc] = []nameOwner{{service: e.service}}
		}
		for _, n := range aliases[e.service] {
			out[n] = append(out[n], e.ip)
			claims := owners[n]
			i := slices.IndexFunc(claims, func(o nameOwner) bool { return o.service == e.service })
			claims[i].addrs = append(claims[i].addrs, e.ip)
		}
	}
	return out, owners
}

// nameOwner is whose a DNS name is: a service's, and for a network alias
// on those networks only, with the service's addresses.
type nameOwner struct {
	service  string
	networks []string     // an alias's; none for the service's own names
	addrs    []netip.Addr // an alias's
}

// dnsScope hides the names of services on no network of the task asking:
// it gets NXDOMAIN, as from a separate Swarm network. Clients that are
// not tasks on an overlay network (the node, a host-network task, a
// task not known yet) see every name. A network alias is seen only by
// tasks on its networks, and answers them with the addresses of the
// services that claim it there.
type dnsScope struct {
	owners   map[string][]nameOwner  // DNS name -> its service, or an alias's claims
	networks map[string][]string     // service -> its networks
	clients  map[netip.Addr][]string // task address -> its networks
	sealed   map[netip.Addr]bool     // tasks on internal networks only
}

func newDNSScope(services []*sched.Service, owners map[string][]nameOwner, iso isolation) *dnsScope {
	sc := &dnsScope{owners: owners, networks: map[string][]string{}, clients: map[netip.Addr][]string{}, sealed: map[netip.Addr]bool{}}
	for _, a := range iso.sealed {
		sc.sealed[a] = true
	}
	for _, s := range services {
		sc.networks[s.Name] = s.Spec.OnNetworks()
	}
	for _, n := range iso.networks {
		for _, a := range n.addrs {
			sc.clients[a] = append(sc.clients[a], n.name)
		}
	}
	return sc
}

// scope is dns.Config.Scope: the addresses of name that client sees, and
// whether it sees the name at all.
func (sc *dnsScope) scope(client netip.Addr, name string, addrs []netip.Addr) ([]netip.Addr, bool) {
	owners, ok := sc.owners[strings.ToLower(name)]
	if !ok {
		return addrs, true
	}
	nets, ok := sc.clients[client]
	if !ok {
		return addrs, true
	}
	shares := func(networks []string) bool {
		return slices.ContainsFunc(networks, func(n string) bool { return slices.Contains(nets, n) })
	}
	if len(owners[0].networks) == 0 {
		return addrs, shares(sc.networks[owners[0].service])
	}
	var out []netip.Addr
	seen := false
	for _, o := range owners {
		if shares(o.networks) {
			out, seen = append(out, o.addrs...), true
		}
	}
	return out, seen
}

// forwards is dns.Config.Forwards: a task on internal networks only gets
// no name from outside the overlay either, as from Docker's resolver.
func (sc *dnsScope) forwards(client netip.Addr) bool { return !sc.sealed[client] }

// aliases lists, per network, the aliases answered on it, by name, with
// each service that claims one there.
func (sc *dnsScope) aliases() map[string][]*netv1.NetworkAlias {
	out := map[string][]*netv1.NetworkAlias{}
	if sc == nil {
		return out
	}
	for _, name := range slices.Sorted(maps.Keys(sc.owners)) {
		for _, o := range sc.owners[name] {
			for _, nw := range o.networks {
				out[nw] = append(out[nw], &netv1.NetworkAlias{Name: name, Service: o.service})
			}
		}
	}
	return out
}

// specOf is service's spec as get (the mirror's Get) has it; nil if it
// has none (yet) or cannot decode it.
func specOf(get func(key string) *statev1.Document, service string) *sched.ServiceSpec {
	d := get(prefixServices + service)
	if d == nil {
		return nil
	}
	svc, err := sched.ServiceFromDoc(service, statepb.FromDocument(d))
	if err != nil || svc == nil {
		return nil
	}
	return &svc.Spec
}

// stackSearch is the DNS search list of a task of spec's service: a stack's
// tasks look names up in their stack first, so that "db" is the stack's
// db, then among all services.
func stackSearch(spec *sched.ServiceSpec) string {
	if spec != nil && spec.StackAlias() != "" {
		return spec.Stack + ".shoal shoal"
	}
	return "shoal"
}

type portKey struct {
	port  uint16
	proto portproxy.Proto
}

// publication is what one published port forwards to.
type publication struct {
	// service holds the port.
	service  string
	backends []netip.AddrPort // sorted
	// conflicting are the other services that publish the port, in the
	// order they would take it over.
	conflicting []string
}

// claim is a service's claim on a published port.
type claim struct {
	service   string
	created   crdt.Stamp
	container uint16
}

// publications maps every published (ingress) port of the services to the
// healthy tasks of the service that holds it. schedd refuses a port that
// another service publishes, but it checks against its own node's state,
// so two services created at about the same time on two nodes can both
// get it. Then the older service keeps it — the smaller creation stamp
// (HLC, node), then the smaller name — on every node alike, whatever the
// order the documents arrive in, and the others are reported as
// conflicting. --network host services publish nothing: their tasks have
// no overlay address to forward to (schedd refuses such specs).
func publications(services []*sched.Service, eps []endpoint) map[portKey]*publication {
	byService := map[string][]netip.Addr{}
	for _, e := range eps {
		byService[e.service] = append(byService[e.service], e.ip)
	}
	claims := map[portKey][]claim{}
	for _, svc := range services {
		name := svc.Name
		if svc.Spec.Network == sched.NetworkHost {
			continue
		}
		for _, p := range svc.Spec.Ports {
			if p.Mode == sched.PortHost {
				continue
			}
			k := portKey{uint16(p.Host), portproxy.Proto(cmpProto(p.Protocol))}
			claims[k] = append(claims[k], claim{service: name, created: svc.Created, container: uint16(p.Container)})
		}
	}
	out := make(map[portKey]*publication, len(claims))
	for k, cs := range claims {
		slices.SortFunc(cs, func(a, b claim) int {
			return cmp.Or(a.created.Compare(b.created), strings.Compare(a.service, b.service))
		})
		holder := cs[0]
		pub := &publication{service: holder.service}
		for _, ip := range byService[holder.service] {
			pub.backends = append(pub.backends, netip.AddrPortFrom(ip, holder.container))
		}
		slices.SortFunc(pub.backends, func(a, b netip.AddrPort) int { return a.Compare(b) })
		for _, c := range cs[1:] {
			pub.conflicting = append(pub.conflicting, c.service)
		}
		out[k] = pub
	}
	return out
}

// applyPorts points every published port at its service's healthy tasks,
// and unbinds ports no service publishes.
func (n *node) applyPorts(services []*sched.Service, eps []endpoint) {
	pubs := publications(services, eps)
	for _, st := range n.proxy.Ports() {
		if _, ok := pubs[portKey{st.Port, st.Proto}]; !ok {
			n.proxy.Remove(st.Port, st.Proto)
		}
	}
	for k, p := range pubs {
		if err := n.proxy.Set(k.port, k.proto, p.backends); err != nil {
			n.log.Warn("publish port", "port", k.port, "proto", k.proto, "err", err)
		}
		if old := n.pubs[k]; len(p.conflicting) > 0 && (old == nil || old.service != p.service || !slices.Equal(old.conflicting, p.conflicting)) {
			n.log.Warn("port published by several services; the oldest keeps it", "port", k.port, "proto", k.proto,
				"service", p.service, "conflicting", p.conflicting)
		}
	}
	n.pubMu.Lock()
	n.pubs = pubs
	n.pubMu.Unlock()
}

func cmpProto(p string) string {
	if p == "" {
		return "tcp"
	}
	return p
}
