package netd

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/overlay"
	"github.com/shoal-dev/shoal/pkg/sched"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

func isoText(iso isolation) string {
	lines := []string{fmt.Sprintf("gateways %v", iso.gateways), fmt.Sprintf("tasks %v", iso.tasks)}
	for _, n := range iso.networks {
		internal := ""
		if n.internal {
			internal = " internal"
		}
		lines = append(lines, fmt.Sprintf("%s%s %v %v", n.name, internal, n.services, n.addrs))
	}
	lines = append(lines, fmt.Sprintf("sealed %v", iso.sealed))
	return strings.Join(lines, "\n")
}

func TestIsolationOf(t *testing.T) {
	svcDocs := []*statev1.Document{
		serviceDoc(sched.ServiceSpec{Name: "web", Image: "x", Replicas: 1, Networks: []string{"front", "back"}}, stamp(1, "n1")),
		// db makes back internal for web too; web is on front as well.
		serviceDoc(sched.ServiceSpec{Name: "db", Image: "x", Replicas: 1, Networks: []string{"back"}, Internal: []string{"back"}}, stamp(1, "n1")),
		serviceDoc(sched.ServiceSpec{Name: "old", Image: "x", Replicas: 1}, stamp(1, "n1")),
		serviceDoc(sched.ServiceSpec{Name: "agent", Image: "x", Global: true, Network: sched.NetworkHost}, stamp(1, "n1")),
	}
	tasks := []*statev1.Document{
		taskDoc("w1", "web", "0", sched.TaskRunning, sched.HealthNone, "10.42.1.2"),
		taskDoc("w2", "web", "1", sched.TaskStarting, sched.HealthStarting, "10.42.2.2"), // not healthy yet: still web's
		taskDoc("d1", "db", "0", sched.TaskRunning, sched.HealthNone, "10.42.1.3"),
		taskDoc("d0", "db", "0", sched.TaskFailed, sched.HealthNone, "10.42.1.9"), // finished: its address may be reused
		taskDoc("o1", "old", "0", sched.TaskRunning, sched.HealthNone, "10.42.2.3"),
		taskDoc("a1", "agent", "n1", sched.TaskRunning, sched.HealthNone, ""), // host network: no address
		taskDoc("x1", "unknown", "0", sched.TaskRunning, sched.HealthNone, "10.42.2.4"),
	}
	nodes := []*statev1.Document{
		doc(prefixNodes+"n1", map[string]crdt.Value{"subnet": crdt.String("10.42.1.0/24")}, stamp(1, "n1")),
		doc(prefixNodes+"n2", map[string]crdt.Value{"subnet": crdt.String("10.42.2.0/24")}, stamp(1, "n2")),
		doc(prefixNodes+"n3", map[string]crdt.Value{}, stamp(1, "n3")), // no subnet yet
	}
	iso := isolationOf(decodeServices(svcDocs), tasks, nodes)
	got := isoText(iso)
	// x1's service is not known here: it is a task (dropped from the
	// overlay) on no network (reached by none) until it is.
	want := strings.Join([]string{
		"gateways [10.42.1.1 10.42.2.1]",
		"tasks [10.42.1.2 10.42.1.3 10.42.2.2 10.42.2.3 10.42.2.4]",
		"back internal [db web] [10.42.1.2 10.42.1.3 10.42.2.2]",
		"default [old] [10.42.2.3]",
		"front [web] [10.42.1.2 10.42.2.2]",
		"sealed [10.42.1.3]", // db's task; the finished one is not a task
	}, "\n")
	if got != want {
		t.Fatalf("isolationOf:\n%s\nwant:\n%s", got, want)
	}
	// The sealed task's names outside the overlay are not forwarded.
	sc := newDNSScope(decodeServices(svcDocs), nil, iso)
	if sc.forwards(netip.MustParseAddr("10.42.1.3")) || !sc.forwards(netip.MustParseAddr("10.42.1.2")) || !sc.forwards(netip.MustParseAddr("10.42.1.1")) {
		t.Errorf("forwards: db's task %v, web's %v, the node %v; want false, true, true", sc.forwards(netip.MustParseAddr("10.42.1.3")),
			sc.forwards(netip.MustParseAddr("10.42.1.2")), sc.forwards(netip.MustParseAddr("10.42.1.1")))
	}
}

// TestDNSScope: a task sees the names (service, stack alias, slots) of
// services on a network it is on, and network aliases on that network;
// the node and unknown clients see all.
func TestDNSScope(t *testing.T) {
	svcDocs := []*statev1.Document{
		// Shares cache's alias on back, as Docker allows; listed first,
		// as the mirror may, and still after cache, by name.
		serviceDoc(sched.ServiceSpec{Name: "replica", Image: "x", Replicas: 1, Networks: []string{"back"},
			Aliases: map[string][]string{"back": {"kv"}}}, stamp(1, "n1")),
		// web is also www on back; its alias db is db's name already.
		serviceDoc(sched.ServiceSpec{Name: "web", Image: "x", Replicas: 1, Networks: []string{"front", "back"},
			Aliases: map[string][]string{"back": {"www", "db"}}}, stamp(1, "n1")),
		serviceDoc(sched.ServiceSpec{Name: "db", Image: "x", Replicas: 1, Networks: []string{"back"}}, stamp(1, "n1")),
		serviceDoc(sched.ServiceSpec{Name: "app-api", Stack: "app", Image: "x", Replicas: 1, Networks: []string{"front"},
			Aliases: map[string][]string{"front": {"rest"}}}, stamp(1, "n1")),
		// The same alias on both its networks.
		serviceDoc(sched.ServiceSpec{Name: "cache", Image: "x", Replicas: 1, Networks: []string{"back", "front"},
			Aliases: map[string][]string{"back": {"kv"}, "front": {"kv"}}}, stamp(1, "n1")),
		serviceDoc(sched.ServiceSpec{Name: "old", Image: "x", Replicas: 1}, stamp(1, "n1")),
	}
	tasks := []*statev1.Document{
		taskDoc("w1", "web", "0", sched.TaskRunning, sched.HealthNone, "10.42.1.2"),
		taskDoc("d1", "db", "0", sched.TaskRunning, sched.HealthNone, "10.42.1.3"),
		taskDoc("a1", "app-api", "0", sched.TaskRunning, sched.HealthNone, "10.42.1.4"),
		taskDoc("o1", "old", "0", sched.TaskRunning, sched.HealthNone, "10.42.1.5"),
		taskDoc("c1", "cache", "0", sched.TaskRunning, sched.HealthNone, "10.42.1.6"),
		taskDoc("r1", "replica", "0", sched.TaskRunning, sched.HealthNone, "10.42.1.7"),
	}
	slots := []*statev1.Document{slotDoc("web", "0", "w1", ""), slotDoc("db", "0", "d1", ""), slotDoc("app-api", "0", "a1", ""), slotDoc("old", "0", "o1", ""),
		slotDoc("cache", "0", "c1", ""), slotDoc("replica", "0", "r1", "")}
	services := decodeServices(svcDocs)
	recs, owners := records(services, endpoints(slots, tasks, nil, time.Unix(1, 0)))
	for name, want := range map[string][]netip.Addr{
		"www.shoal.": addrs("10.42.1.2"), "db.shoal.": addrs("10.42.1.3"), "rest.app.shoal.": addrs("10.42.1.4"),
		"kv.shoal.": addrs("10.42.1.6", "10.42.1.7"),
	} {
		if got := slices.SortedFunc(slices.Values(recs[name]), netip.Addr.Compare); !slices.Equal(got, want) {
			t.Errorf("records[%s] = %v, want %v", name, got, want)
		}
	}
	sc := newDNSScope(services, owners, isolationOf(services, tasks, nil))
	aliasText := func(nw string) string {
		var out []string
		for _, a := range sc.aliases()[nw] {
			out = append(out, a.GetName()+" "+a.GetService())
		}
		return strings.Join(out, ", ")
	}
	if got, want := aliasText("back"), "kv.shoal. cache, kv.shoal. replica, www.shoal. web"; got != want {
		t.Errorf("aliases on back: %s, want %s", got, want)
	}
	if got, want := aliasText("front"), "kv.shoal. cache, rest.app.shoal. app-api"; got != want {
		t.Errorf("aliases on front: %s, want %s", got, want)
	}
	for _, c := range []struct {
		client, name string
		want         bool
	}{
		{"10.42.1.3", "web.shoal.", true},      // db and web share back
		{"10.42.1.3", "0.WEB.shoal.", true},    // a slot's name, any case
		{"10.42.1.3", "api.app.shoal.", false}, // api is on front only
		{"10.42.1.3", "app-api.shoal.", false},
		{"10.42.1.4", "web.shoal.", true}, // front
		{"10.42.1.4", "db.shoal.", false},
		{"10.42.1.5", "db.shoal.", false}, // default
		{"10.42.1.5", "old.shoal.", true},
		{"10.42.1.1", "db.shoal.", true},      // a node's address
		{"10.42.9.9", "db.shoal.", true},      // not known as a task
		{"10.42.1.3", "nothing.shoal.", true}, // no service's: the records say
		{"10.42.1.3", "www.shoal.", true},     // web's alias on back
		{"10.42.1.4", "www.shoal.", false},    // api shares front with web, not back
		{"10.42.1.2", "rest.app.shoal.", true},
		{"10.42.1.3", "rest.app.shoal.", false},
		{"10.42.9.9", "www.shoal.", true},
		{"10.42.1.3", "kv.shoal.", true}, // cache's alias on back
		{"10.42.1.4", "kv.shoal.", true}, // and on front
		{"10.42.1.5", "kv.shoal.", false},
	} {
		if _, got := sc.scope(netip.MustParseAddr(c.client), c.name, nil); got != c.want {
			t.Errorf("scope(%s, %s) sees it: %v, want %v", c.client, c.name, got, c.want)
		}
	}
	// The addresses of a shared alias: of the services on a network the
	// client is on; all of them for a client that is no task. Names of
	// one service's are the records' own.
	for _, c := range []struct {
		client, name string
		want         []netip.Addr
	}{
		{"10.42.1.3", "kv.shoal.", addrs("10.42.1.6", "10.42.1.7")}, // cache and replica on back
		{"10.42.1.4", "kv.shoal.", addrs("10.42.1.6")},              // cache alone on front
		{"10.42.1.1", "kv.shoal.", addrs("10.42.1.6", "10.42.1.7")}, // the node
		{"10.42.1.3", "www.shoal.", addrs("10.42.1.2")},
		{"10.42.1.4", "web.shoal.", addrs("10.42.1.2")},
	} {
		name := c.name
		got, _ := sc.scope(netip.MustParseAddr(c.client), name, recs[name])
		if got = slices.SortedFunc(slices.Values(got), netip.Addr.Compare); !slices.Equal(got, c.want) {
			t.Errorf("scope(%s, %s) answers %v, want %v", c.client, name, got, c.want)
		}
	}
}

// TestApplyIsolation writes the rules into a network namespace of its own
// through netlink, twice (the second replaces the first whole), and reads
// them back.
// nftInNetns opens an nftables connection in a network namespace of the
// test's own, deleted at its end.
func nftInNetns(t *testing.T) *nftables.Conn {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	name := fmt.Sprintf("shoal-isotest-%d", os.Getpid())
	ns, err := netns.NewNamed(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close(); netns.DeleteNamed(name) })
	if err := netns.Set(orig); err != nil {
		t.Fatal(err)
	}
	conn, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

func TestApplyIsolation(t *testing.T) {
	conn := nftInNetns(t)
	overlay := netip.MustParsePrefix("10.42.0.0/16")
	first := isolation{gateways: addrs("10.42.1.1"), tasks: addrs("10.42.1.2", "10.42.1.3", "10.42.1.4"),
		networks: []overlayNetwork{{name: "a", addrs: addrs("10.42.1.2")}, {name: "b", addrs: addrs("10.42.1.3", "10.42.1.4")}}}
	second := isolation{gateways: addrs("10.42.1.1", "10.42.2.1"), tasks: addrs("10.42.1.2"),
		networks: []overlayNetwork{{name: "a", addrs: addrs("10.42.1.2"), internal: true}}, sealed: addrs("10.42.1.2"),
		ports: []taskPort{{veth: "ve0011223344", addr: netip.MustParseAddr("10.42.1.2")}}}
	for _, iso := range []isolation{first, second} {
		if err := applyIsolation(conn, iso, overlay, "shoal0", 53); err != nil {
			t.Fatal(err)
		}
	}
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyINet, nftables.TableFamilyBridge} {
		table := &nftables.Table{Name: isolationTable, Family: fam}
		sets, err := conn.GetSets(table)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string][]string{}
		for _, s := range sets {
			elems, err := conn.GetSetElements(s)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range elems {
				a, _ := netip.AddrFromSlice(e.Key)
				got[s.Name] = append(got[s.Name], a.String())
			}
			slices.Sort(got[s.Name])
		}
		want := map[string][]string{"gateways": {"10.42.1.1", "10.42.2.1"}, "net_0": {"10.42.1.2"}, "sealed": {"10.42.1.2"}, "tasks": {"10.42.1.2"}}
		// A forged gateway's drop, gateways accept, the sealed tasks'
		// drop out of the overlay, a's accept, the overlay's drop.
		wantRules := 5
		if fam == nftables.TableFamilyBridge {
			// A node's own packets never cross the bridge's ports, nor
			// a packet out of the overlay.
			delete(want, "gateways")
			delete(want, "sealed")
			wantRules = 2
		} else {
			// The sealed tasks' replies and DNS over UDP and TCP accepted,
			// the rest dropped.
			in, err := conn.GetRules(table, &nftables.Chain{Name: "input", Table: table})
			if err != nil || len(in) != 4 {
				t.Errorf("inet input: %d rules (%v), want 4", len(in), err)
			}
			// The masquerade of tasks' traffic out of the overlay.
			post, err := conn.GetRules(table, &nftables.Chain{Name: "postrouting", Table: table})
			if err != nil || len(post) != 1 {
				t.Errorf("inet postrouting: %d rules (%v), want 1", len(post), err)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("family %v: sets %v, want %v (the second ruleset alone)", fam, got, want)
		}
		rules, err := conn.GetRules(table, &nftables.Chain{Name: "forward", Table: table})
		if err != nil {
			t.Fatal(err)
		}
		if len(rules) != wantRules {
			t.Errorf("family %v: %d rules in forward, want %d", fam, len(rules), wantRules)
		}
		if fam == nftables.TableFamilyBridge {
			// The one port's IPv4 and ARP source checks.
			pre, err := conn.GetRules(table, &nftables.Chain{Name: "prerouting", Table: table})
			if err != nil || len(pre) != 2 {
				t.Errorf("bridge prerouting: %d rules (%v), want 2", len(pre), err)
			}
		}
	}
	if err := removeIsolation(conn); err != nil {
		t.Fatal(err)
	}
	tables, err := conn.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	if len(tables) != 0 {
		t.Errorf("%d tables left after removeIsolation", len(tables))
	}
}

// removeIsolation deletes netd's tables.
func removeIsolation(conn *nftables.Conn) error {
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyINet, nftables.TableFamilyBridge} {
		t := &nftables.Table{Name: isolationTable, Family: fam}
		conn.AddTable(t)
		conn.DelTable(t)
	}
	return conn.Flush()
}

// TestGuardPorts: a task attached between two reconciles has its port
// checked at once, with the rest of the rules as last applied; before the
// first reconcile nothing is written. An ARP probe's sender (0.0.0.0)
// is let through, no other.
func TestGuardPorts(t *testing.T) {
	conn := nftInNetns(t)
	ipam, err := overlay.NewIPAM(netip.MustParsePrefix("10.42.1.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	n := &node{cfg: &Config{Bridge: "shoal0"}, log: slog.New(slog.DiscardHandler), nft: conn, ipam: ipam,
		overlay: netip.MustParsePrefix("10.42.0.0/16")}
	prerouting := func() []*nftables.Rule {
		t.Helper()
		table := &nftables.Table{Name: isolationTable, Family: nftables.TableFamilyBridge}
		rules, err := conn.GetRules(table, &nftables.Chain{Name: "prerouting", Table: table})
		if err != nil {
			t.Fatal(err)
		}
		return rules
	}
	attach := func(task string, spec *sched.ServiceSpec) netip.Addr {
		n.mu.Lock()
		defer n.mu.Unlock()
		a, err := n.ipam.Allocate(task)
		if err != nil {
			t.Fatal(err)
		}
		n.guardPorts(a, spec)
		return a
	}
	attach("web.a", nil)
	if tables, err := conn.ListTables(); err != nil || len(tables) != 0 {
		t.Fatalf("before any reconcile: tables %v (%v), want none", tables, err)
	}
	iso := isolation{gateways: addrs("10.42.1.1"), tasks: addrs("10.42.1.2"), networks: []overlayNetwork{{name: "default", addrs: addrs("10.42.1.2")}}}
	n.isolate(iso)
	if got := len(prerouting()); got != 2 {
		t.Fatalf("after the reconcile: %d prerouting rules, want web.a's 2", got)
	}
	b := attach("web.b", &sched.ServiceSpec{Name: "web"})
	rules := prerouting()
	if len(rules) != 4 {
		t.Fatalf("after web.b's attach: %d prerouting rules, want 4", len(rules))
	}
	_, veth := taskNames("web.b")
	var arp *nftables.Rule
	for _, r := range rules {
		if ruleHas(r, []byte(veth)) && ruleHas(r, binaryutil.BigEndian.PutUint16(unix.ETH_P_ARP)) {
			arp = r
		}
	}
	if arp == nil || !ruleHas(arp, b.AsSlice()) || !ruleHas(arp, []byte{0, 0, 0, 0}) {
		t.Fatalf("no ARP rule for %s that lets its own address and probes through: %v", veth, arp)
	}
	n.isoMu.Lock()
	kept := isoText(n.iso) == isoText(iso) && len(n.iso.ports) == 2
	n.isoMu.Unlock()
	if !kept {
		t.Fatalf("rules after the attach: %s, %d ports; want the reconcile's and 2 ports", isoText(n.iso), len(n.iso.ports))
	}
	// A task on internal networks only is sealed from its attach: by its
	// own spec's say, or by the rules' (another service's); not one also
	// on a network that is not internal.
	n.isoMu.Lock()
	n.iso.networks = append(n.iso.networks, overlayNetwork{name: "vault", internal: true})
	n.isoMu.Unlock()
	own := attach("db.a", &sched.ServiceSpec{Name: "db", Networks: []string{"back"}, Internal: []string{"back"}})
	other := attach("db.b", &sched.ServiceSpec{Name: "db2", Networks: []string{"vault"}})
	attach("db.c", &sched.ServiceSpec{Name: "db3", Networks: []string{"vault", "front"}})
	n.isoMu.Lock()
	sealed := fmt.Sprint(n.iso.sealed)
	n.isoMu.Unlock()
	if want := fmt.Sprint([]netip.Addr{own, other}); sealed != want {
		t.Fatalf("sealed after the attaches: %s, want %s", sealed, want)
	}
	table := &nftables.Table{Name: isolationTable, Family: nftables.TableFamilyINet}
	set, err := conn.GetSetByName(table, "sealed")
	if err != nil {
		t.Fatal(err)
	}
	if elems, err := conn.GetSetElements(set); err != nil || len(elems) != 2 {
		t.Fatalf("the sealed set: %v (%v), want 2 addresses", elems, err)
	}
	// A reconcile before their documents arrive keeps them sealed; once
	// the documents count a task, they decide (here: db.a's says it is
	// not sealed any more).
	sealedAfter := func(iso isolation) string {
		n.isolate(iso)
		n.isoMu.Lock()
		defer n.isoMu.Unlock()
		return fmt.Sprint(n.iso.sealed)
	}
	if got, want := sealedAfter(iso), fmt.Sprint([]netip.Addr{own, other}); got != want {
		t.Fatalf("sealed after a reconcile without their documents: %s, want %s", got, want)
	}
	withOwn := iso
	withOwn.tasks = sortedAddrs(append(slices.Clone(iso.tasks), own))
	if got, want := sealedAfter(withOwn), fmt.Sprint([]netip.Addr{other}); got != want {
		t.Fatalf("sealed after db.a's document: %s, want %s", got, want)
	}
	if err := removeIsolation(conn); err != nil {
		t.Fatal(err)
	}
}

// ruleHas reports whether one of r's comparisons holds data (an interface
// name's bytes match as a prefix of their zero-padded field).
func ruleHas(r *nftables.Rule, data []byte) bool {
	for _, e := range r.Exprs {
		if c, ok := e.(*expr.Cmp); ok && bytes.HasPrefix(c.Data, data) && (len(c.Data) == len(data) || c.Data[len(data)] == 0) {
			return true
		}
	}
	return false
}
