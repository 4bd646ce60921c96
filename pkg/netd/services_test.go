package netd

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/hlc"
	"github.com/shoal-dev/shoal/pkg/portproxy"
	"github.com/shoal-dev/shoal/pkg/sched"
	"github.com/shoal-dev/shoal/pkg/statepb"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

// stamp is a write at wall time w (any unit) by node.
func stamp(w int64, node string) crdt.Stamp {
	return crdt.Stamp{TS: hlc.Timestamp{Wall: w}, Node: node}
}

// doc is the mirrored document key holding fields, written at s.
func doc(key string, fields map[string]crdt.Value, s crdt.Stamp) *statev1.Document {
	return statepb.ToDocument(key, 1, crdt.Set(fields, s), true)
}

// slotDoc names task as the current task of service's slot, and next as
// the replacement being started ("": none).
func slotDoc(service, slot, task, next string) *statev1.Document {
	a := sched.AssignSlot{Service: service, Slot: slot, Task: task, Node: "n1", Version: 1, Next: next}
	return doc(sched.SlotDocKey(service, slot), a.Fields(), stamp(1, "n1"))
}

// taskDoc is a task of service's slot in state with health, at ip ("":
// none written, as for a --network host task).
func taskDoc(id, service, slot string, state sched.TaskState, health sched.Health, ip string) *statev1.Document {
	f := sched.NewTaskFields(sched.Reserve{Service: service, Slot: slot, TaskID: id, Version: 1}, "n1", time.Unix(1, 0))
	for k, v := range (sched.UpdateTask{TaskID: id, State: state, Health: health}).Fields() {
		f[k] = v
	}
	if ip != "" {
		f["ip"] = crdt.String(ip)
	}
	return doc(sched.TaskKey(id), f, stamp(2, "n1"))
}

// serviceDoc is a service created at created (by node) with spec.
func serviceDoc(spec sched.ServiceSpec, created crdt.Stamp) *statev1.Document {
	spec = spec.WithDefaults()
	svc := sched.Service{Name: spec.Name, Spec: spec, Version: 1, State: sched.ServiceActive, Updated: time.Unix(1, 0)}
	return doc(sched.ServiceKey(spec.Name), sched.ServiceFields(svc), created)
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// recordsText is a map of records as sorted lines, for comparisons.
func recordsText(m map[string][]netip.Addr) string {
	var lines []string
	for name, as := range m {
		as = slices.Clone(as)
		slices.SortFunc(as, func(a, b netip.Addr) int { return a.Compare(b) })
		lines = append(lines, fmt.Sprintf("%s %v", name, as))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

func TestRecords(t *testing.T) {
	slots := []*statev1.Document{
		slotDoc("web", "0", "web.a", ""),
		slotDoc("web", "1", "web.b", ""),
		slotDoc("web", "2", "web.c", ""),
		slotDoc("web", "3", "web.d", ""),
		slotDoc("web", "4", "web.e", ""),
		// A replacement being started serves once healthy, beside the
		// task it replaces; one not yet healthy does not.
		slotDoc("web", "5", "web.f", "web.f2"),
		slotDoc("web", "6", "web.g", "web.g2"),
		slotDoc("db", "0", "db.a", ""),
		slotDoc("hostnet", "0", "hostnet.a", ""),
		{Key: "/slots/malformed"},
	}
	tasks := []*statev1.Document{
		taskDoc("web.a", "web", "0", sched.TaskRunning, sched.HealthHealthy, "10.42.1.2"),
		taskDoc("web.b", "web", "1", sched.TaskRunning, "", "10.42.2.2"), // no health check
		taskDoc("web.c", "web", "2", sched.TaskRunning, sched.HealthUnhealthy, "10.42.1.3"),
		taskDoc("web.d", "web", "3", sched.TaskRunning, sched.HealthStarting, "10.42.1.4"),
		taskDoc("web.e", "web", "4", sched.TaskRestarting, sched.HealthHealthy, "10.42.1.5"),
		// Slot 1's previous task: no longer current, still running.
		taskDoc("web.old", "web", "1", sched.TaskRunning, sched.HealthHealthy, "10.42.2.9"),
		taskDoc("web.f", "web", "5", sched.TaskRunning, sched.HealthHealthy, "10.42.1.6"),
		taskDoc("web.f2", "web", "5", sched.TaskRunning, sched.HealthHealthy, "10.42.2.6"),
		taskDoc("web.g", "web", "6", sched.TaskRunning, sched.HealthHealthy, "10.42.1.7"),
		taskDoc("web.g2", "web", "6", sched.TaskStarting, sched.HealthStarting, "10.42.2.7"),
		taskDoc("db.a", "db", "0", sched.TaskRunning, "", "10.42.3.2"),
		// --network host: no overlay address.
		taskDoc("hostnet.a", "hostnet", "0", sched.TaskRunning, "", ""),
		// A task no slot names at all.
		taskDoc("stray.a", "stray", "0", sched.TaskRunning, "", "10.42.3.9"),
	}
	services := []*statev1.Document{
		serviceDoc(sched.ServiceSpec{Name: "web", Image: "x"}, stamp(1, "n1")),
		serviceDoc(sched.ServiceSpec{Name: "db", Image: "x"}, stamp(1, "n1")),
		serviceDoc(sched.ServiceSpec{Name: "hostnet", Image: "x", Network: sched.NetworkHost}, stamp(1, "n1")),
		// Removed: no name.
		statepb.ToDocument(sched.ServiceKey("gone"), 1, crdt.DeleteDoc(stamp(2, "n1")), true),
	}
	recs, _ := records(decodeServices(services), endpoints(slots, tasks, nil, time.Unix(1, 0)))
	got := recordsText(recs)
	want := recordsText(map[string][]netip.Addr{
		"web.shoal.":   addrs("10.42.1.2", "10.42.2.2", "10.42.1.6", "10.42.2.6", "10.42.1.7"),
		"0.web.shoal.": addrs("10.42.1.2"),
		"1.web.shoal.": addrs("10.42.2.2"),
		"5.web.shoal.": addrs("10.42.1.6", "10.42.2.6"),
		"6.web.shoal.": addrs("10.42.1.7"),
		"db.shoal.":    addrs("10.42.3.2"),
		"0.db.shoal.":  addrs("10.42.3.2"),
		// A service none of whose tasks can take traffic exists, empty.
		"hostnet.shoal.": nil,
	})
	if got != want {
		t.Fatalf("records\n got:\n%s\nwant:\n%s", got, want)
	}
	if got, _ := records(nil, endpoints(slots, nil, nil, time.Unix(1, 0))); len(got) != 0 {
		t.Fatalf("records without services and tasks: %v", got)
	}
}

// A stack's service answers under its stack's domain too, and its tasks
// search that domain first; a service outside a stack does neither.
func TestStackNames(t *testing.T) {
	slots := []*statev1.Document{slotDoc("app-db", "0", "app-db.a", ""), slotDoc("db", "0", "db.a", "")}
	tasks := []*statev1.Document{
		taskDoc("app-db.a", "app-db", "0", sched.TaskRunning, "", "10.42.1.2"),
		taskDoc("db.a", "db", "0", sched.TaskRunning, "", "10.42.2.2"),
	}
	services := []*statev1.Document{
		serviceDoc(sched.ServiceSpec{Name: "app-db", Stack: "app", Image: "x"}, stamp(1, "n1")),
		serviceDoc(sched.ServiceSpec{Name: "db", Image: "x"}, stamp(1, "n1")),
		serviceDoc(sched.ServiceSpec{Name: "app-web", Stack: "app", Image: "x"}, stamp(1, "n1")),
	}
	recs, _ := records(decodeServices(services), endpoints(slots, tasks, nil, time.Unix(1, 0)))
	got := recordsText(recs)
	want := recordsText(map[string][]netip.Addr{
		"app-db.shoal.":   addrs("10.42.1.2"),
		"0.app-db.shoal.": addrs("10.42.1.2"),
		"db.app.shoal.":   addrs("10.42.1.2"),
		"0.db.app.shoal.": addrs("10.42.1.2"),
		"db.shoal.":       addrs("10.42.2.2"),
		"0.db.shoal.":     addrs("10.42.2.2"),
		"app-web.shoal.":  nil,
		"web.app.shoal.":  nil,
	})
	if got != want {
		t.Fatalf("records\n got:\n%s\nwant:\n%s", got, want)
	}
	byKey := map[string]*statev1.Document{}
	for _, d := range services {
		byKey[d.GetKey()] = d
	}
	get := func(key string) *statev1.Document { return byKey[key] }
	for service, want := range map[string]string{"app-web": "app.shoal shoal", "db": "shoal", "unknown": "shoal"} {
		if got := stackSearch(specOf(get, service)); got != want {
			t.Errorf("stackSearch(%s) = %q, want %q", service, got, want)
		}
	}
}

// TestEndpointsHandedOverAtShutdown checks that a task its slot replaced
// as lost keeps taking traffic while it runs if its node shut down (it is
// being handed over, not gone), for handOverWindow after the slot write;
// not if its node is merely seen down.
func TestEndpointsHandedOverAtShutdown(t *testing.T) {
	written := time.Unix(1000, 0)
	replaced := func(slot, task, lost string) *statev1.Document {
		a := sched.AssignSlot{Service: "web", Slot: slot, Task: task, Node: "n1", Version: 1, Lost: lost}
		return doc(sched.SlotDocKey("web", slot), a.Fields(), stamp(written.UnixNano(), "n1"))
	}
	onNode := func(d *statev1.Document, node string) *statev1.Document {
		f := statepb.FromDocument(d).Live()
		f["node"] = crdt.String(node)
		return doc(d.GetKey(), f, stamp(3, node))
	}
	slots := []*statev1.Document{replaced("0", "web.new0", "web.old0"), replaced("1", "web.new1", "web.old1")}
	tasks := []*statev1.Document{
		// The replacement of slot 0 is starting; its old task, on the
		// node that shut down, still runs.
		taskDoc("web.new0", "web", "0", sched.TaskStarting, "", "10.42.1.2"),
		onNode(taskDoc("web.old0", "web", "0", sched.TaskRunning, "", "10.42.2.2"), "n2"),
		// Slot 1's old task is on a node seen dead, not shut down.
		taskDoc("web.new1", "web", "1", sched.TaskRunning, "", "10.42.1.3"),
		onNode(taskDoc("web.old1", "web", "1", sched.TaskRunning, "", "10.42.3.3"), "n3"),
	}
	nodes := []*statev1.Document{doc(sched.NodeKey("n2"), sched.ShutDownFields(true), stamp(2, "n2"))}
	ips := func(now time.Time) string {
		var out []string
		for _, e := range endpoints(slots, tasks, nodes, now) {
			out = append(out, e.slot+"="+e.ip.String())
		}
		slices.Sort(out)
		return strings.Join(out, " ")
	}
	if got, want := ips(written.Add(time.Second)), "0=10.42.2.2 1=10.42.1.3"; got != want {
		t.Fatalf("during the hand-over: %q, want %q", got, want)
	}
	if got, want := ips(written.Add(handOverWindow)), "1=10.42.1.3"; got != want {
		t.Fatalf("past the window: %q, want %q", got, want)
	}
	tasks[1] = onNode(taskDoc("web.old0", "web", "0", sched.TaskStopped, "", "10.42.2.2"), "n2")
	if got, want := ips(written.Add(time.Second)), "1=10.42.1.3"; got != want {
		t.Fatalf("once the old task stopped: %q, want %q", got, want)
	}
}

func pubText(m map[portKey]*publication) string {
	var lines []string
	for k, p := range m {
		lines = append(lines, fmt.Sprintf("%d/%s %s %v conflicting %v", k.port, k.proto, p.service, p.backends, p.conflicting))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

func TestPublications(t *testing.T) {
	eps := []endpoint{
		{service: "web", slot: "0", ip: netip.MustParseAddr("10.42.2.2")},
		{service: "web", slot: "1", ip: netip.MustParseAddr("10.42.1.2")},
		{service: "late", slot: "0", ip: netip.MustParseAddr("10.42.1.7")},
		{service: "dns", slot: "0", ip: netip.MustParseAddr("10.42.1.8")},
		{service: "hostnet", slot: "0", ip: netip.MustParseAddr("10.42.1.9")},
	}
	port := func(host, container int, proto, mode string) sched.Port {
		return sched.Port{Host: host, Container: container, Protocol: proto, Mode: mode}
	}
	services := []*statev1.Document{
		serviceDoc(sched.ServiceSpec{Name: "web", Image: "x", Ports: []sched.Port{port(8080, 80, "", ""), port(9000, 9000, "", sched.PortHost)}}, stamp(100, "n2")),
		// Created later on another node: loses 8080/tcp, keeps 8443.
		serviceDoc(sched.ServiceSpec{Name: "late", Image: "x", Ports: []sched.Port{port(8080, 81, "tcp", ""), port(8443, 443, "", "")}}, stamp(200, "n1")),
		// 8080/udp is another port.
		serviceDoc(sched.ServiceSpec{Name: "dns", Image: "x", Ports: []sched.Port{port(8080, 53, "udp", "")}}, stamp(300, "n1")),
		// --network host services publish nothing.
		serviceDoc(sched.ServiceSpec{Name: "hostnet", Image: "x", Network: sched.NetworkHost, Ports: []sched.Port{port(7000, 7000, "", "")}}, stamp(50, "n1")),
		// No replica yet: the port is bound with no backends.
		serviceDoc(sched.ServiceSpec{Name: "idle", Image: "x", Ports: []sched.Port{port(8500, 80, "", "")}}, stamp(400, "n3")),
	}
	want := strings.Join([]string{
		"8080/tcp web [10.42.1.2:80 10.42.2.2:80] conflicting [late]",
		"8080/udp dns [10.42.1.8:53] conflicting []",
		"8443/tcp late [10.42.1.7:443] conflicting []",
		"8500/tcp idle [] conflicting []",
	}, "\n")
	// Every node decides alike, whatever order its mirror lists in.
	for i := range services {
		order := append(slices.Clone(services[i:]), services[:i]...)
		if got := pubText(publications(decodeServices(order), eps)); got != want {
			t.Fatalf("publications (rotated by %d)\n got:\n%s\nwant:\n%s", i, got, want)
		}
	}
	if _, ok := publications(decodeServices(services), eps)[portKey{8080, portproxy.TCP}]; !ok {
		t.Fatalf("no 8080/tcp among %s", pubText(publications(decodeServices(services), eps)))
	}

	// Equal creation stamps (or services written before they had one):
	// the smaller name keeps the port.
	tie := []*statev1.Document{
		serviceDoc(sched.ServiceSpec{Name: "b", Image: "x", Ports: []sched.Port{port(80, 80, "", "")}}, stamp(1, "n1")),
		serviceDoc(sched.ServiceSpec{Name: "a", Image: "x", Ports: []sched.Port{port(80, 80, "", "")}}, stamp(1, "n1")),
	}
	for _, ds := range [][]*statev1.Document{tie, {tie[1], tie[0]}} {
		if got, want := pubText(publications(decodeServices(ds), nil)), "80/tcp a [] conflicting [b]"; got != want {
			t.Fatalf("tie: got %s, want %s", got, want)
		}
	}
}

func TestPublicationsOlderServiceUpdated(t *testing.T) {
	// An update rewrites the service's fields but not created: the older
	// service keeps the port.
	spec := sched.ServiceSpec{Name: "old", Image: "x", Ports: []sched.Port{{Host: 80, Container: 80}}}.WithDefaults()
	created := crdt.Set(sched.ServiceFields(sched.Service{Name: "old", Spec: spec, Version: 1, Updated: time.Unix(1, 0)}), stamp(1, "n1"))
	updated := sched.Service{Name: "old", Spec: spec, Version: 2, PrevSpec: &spec, Updated: time.Unix(9, 0)}
	old := statepb.ToDocument(sched.ServiceKey("old"), 2, crdt.Merge(created, crdt.Set(sched.ServiceFields(updated), stamp(9, "n2"))), true)
	young := serviceDoc(sched.ServiceSpec{Name: "new", Image: "x", Ports: []sched.Port{{Host: 80, Container: 80}}}, stamp(5, "n3"))
	if got, want := pubText(publications(decodeServices([]*statev1.Document{young, old}), nil)), "80/tcp old [] conflicting [new]"; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}

func TestResolvConfUpstreams(t *testing.T) {
	conf := `# written by systemd-resolved
nameserver 127.0.0.53
nameserver 10.42.7.1
nameserver 192.0.2.53
nameserver 2001:db8::53
nameserver not-an-address
options edns0 trust-ad
search example.org
`
	got := resolvConfUpstreams(strings.NewReader(conf), netip.MustParseAddrPort("10.42.7.1:53"))
	// Loopback stays (netd forwards from the node's namespace); the
	// service DNS itself goes (a loop).
	if want := []string{"127.0.0.53", "192.0.2.53", "2001:db8::53"}; !slices.Equal(got, want) {
		t.Fatalf("upstreams %v, want %v", got, want)
	}
	// On another port the bridge address is another server.
	got = resolvConfUpstreams(strings.NewReader("nameserver 10.42.7.1\n"), netip.MustParseAddrPort("10.42.7.1:5353"))
	if want := []string{"10.42.7.1"}; !slices.Equal(got, want) {
		t.Fatalf("upstreams %v, want %v", got, want)
	}
}
