package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/shoal-dev/shoal/pkg/client"
	"github.com/shoal-dev/shoal/pkg/devcluster"
	"github.com/shoal-dev/shoal/pkg/overlay"
	"github.com/shoal-dev/shoal/pkg/sched"
	"github.com/shoal-dev/shoal/pkg/statepb"
	netv1 "github.com/shoal-dev/shoal/proto/shoal/net/v1"
	schedv1 "github.com/shoal-dev/shoal/proto/shoal/sched/v1"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

// netCluster is a dev cluster whose nodes run statd, schedd and netd (tasks
// get their network namespaces from netd), each with its own containerd,
// and the test image loaded on node 1.
type netCluster struct {
	*devcluster.Cluster
	t   *testing.T
	ids []string // node IDs, index 0 is node 1

	statds map[int]*client.Statd // by node index, made on first use

	mu    sync.Mutex
	tasks map[string]bool // every task ID seen, to check nothing is left behind
	ifs   map[string]bool // every WireGuard interface name seen
}

// statd is a statd client of node i, kept for the cluster's life (it
// reconnects across restarts of the node).
func (c *netCluster) statd(i int) *client.Statd {
	c.t.Helper()
	if s := c.statds[i]; s != nil {
		return s
	}
	s, err := client.NewStatd(c.RunDir(i), client.Retry{Attempts: 3})
	if err != nil {
		c.t.Fatal(err)
	}
	c.statds[i] = s
	return s
}

// run runs a subtest with the cluster's helpers failing that subtest
// (FailNow must be called from the subtest's own goroutine).
func (c *netCluster) run(t *testing.T, name string, f func(t *testing.T)) {
	t.Run(name, func(st *testing.T) {
		c.t = st
		defer func() { c.t = t }()
		f(st)
	})
}

func newNetCluster(t *testing.T, nodes int) *netCluster {
	t.Helper()
	name := fmt.Sprintf("n%d", rand.IntN(1_000_000))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	args := map[string][]string{"statd": {"--node-name", "n{node}"}, "schedd": devcluster.ScheddArgs(),
		// Names outside .shoal go to a resolver of the test's own
		// (DNSForwarding), never to the machine's. With --debug-pprof a
		// failing subtest can dump netd's goroutines (goroutines).
		"netd": {"--upstream", fmt.Sprintf("127.0.0.1:%d", fakeUpstreamPort), "--debug-pprof"}}
	c, err := devcluster.Up(ctx, devcluster.Spec{
		Name:      name,
		Nodes:     nodes,
		Subnet:    devcluster.AutoSubnet,
		BinDir:    binDir,
		Daemons:   []string{"statd", "schedd", "netd"},
		Extra:     []devcluster.ProcessSpec{devcluster.ContainerdProcess("")},
		Args:      args,
		Bootstrap: true,
	})
	if err != nil {
		t.Fatalf("dev cluster up: %v", err)
	}
	nc := &netCluster{Cluster: c, t: t, statds: map[int]*client.Statd{}, tasks: map[string]bool{}, ifs: map[string]bool{}}
	t.Cleanup(func() { nc.down() })
	for i := 1; i <= nodes; i++ {
		nc.ids = append(nc.ids, clusterStatus(t, nc.statd(i)).GetNodeId())
	}
	waitFor(t, 60*time.Second, "schedd and netd ready, every node published on every node", func() bool {
		for i := 1; i <= nodes; i++ {
			if _, _, code := nc.ctl(i, "service", "ls"); code != 0 {
				return false
			}
			out, _, code := nc.ctl(i, "state", "ls", "/nodes/", "-o", "json")
			if code != 0 || strings.Count(out, `"schedd_port"`) != nodes || strings.Count(out, `"wg_pubkey"`) != nodes {
				return false
			}
			st, err := nc.tryStatus(i)
			if err != nil || len(st.GetPeers()) != nodes-1 {
				return false
			}
		}
		return true
	})
	for i := 1; i <= nodes; i++ {
		nc.noteIface(nc.status(i).GetInterface())
	}
	nc.mustCtl(1, "image", "load", writeTestImage(t))
	waitFor(t, 15*time.Second, "the image recorded on every node", func() bool {
		for i := 1; i <= nodes; i++ {
			if out, _, _ := nc.ctl(i, "image", "ls", "-o", "json"); !strings.Contains(out, nc.ids[0]) {
				return false
			}
		}
		return true
	})
	return nc
}

// goroutines returns the goroutine dump of the daemon of node i whose
// metrics (and, with --debug-pprof, profiler) listen on 127.0.0.1:port in
// the node's namespace, or why it could not be had. The connection is
// dialled on the namespace's thread, so the request is written by hand
// (http.Client dials from goroutines of its own).
func (c *netCluster) goroutines(i, port int) string {
	var out []byte
	err := c.InNetns(i, func() error {
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second)
		if err != nil {
			return err
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(conn, "GET /debug/pprof/goroutine?debug=1 HTTP/1.0\r\nHost: localhost\r\n\r\n"); err != nil {
			return err
		}
		out, err = io.ReadAll(conn)
		return err
	})
	if err != nil {
		return fmt.Sprintf("(no goroutine dump: %v)", err)
	}
	return string(out)
}

// down removes every service (so that netd detaches their tasks), tears
// the cluster down and checks that no task namespace or WireGuard socket
// of the cluster is left on the machine.
func (c *netCluster) down() {
	t := c.t
	if t.Failed() || os.Getenv("SHOAL_E2E_LOGS") != "" {
		for i := 1; i <= c.Nodes(); i++ {
			for _, d := range []string{"netd", "schedd"} {
				if b, err := os.ReadFile(c.LogPath(i, d)); err == nil {
					lines := strings.Split(strings.TrimSpace(string(b)), "\n")
					t.Logf("node %d %s log:\n%s", i, d, strings.Join(lines[max(0, len(lines)-logTail):], "\n"))
				}
			}
		}
	}
	// Services left by a failed subtest. Nothing here may call FailNow:
	// Down must run.
	ctl := func(args ...string) (string, int) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		out, _, code, err := c.Ctl(ctx, 1, args...)
		if err != nil {
			return "", -1
		}
		return out, code
	}
	if out, code := ctl("service", "ls", "-o", "json"); code == 0 {
		var svcs []struct {
			Name string `json:"name"`
		}
		json.Unmarshal([]byte(out), &svcs)
		for _, s := range svcs {
			ctl("service", "rm", s.Name)
		}
	}
	for i := 1; i <= c.Nodes(); i++ {
		if entries, err := os.ReadDir(filepath.Join(c.StateDir(i, "netd"), "resolv")); err == nil {
			for _, e := range entries {
				c.noteTask(strings.TrimSuffix(e.Name(), ".conf"))
			}
		}
	}
	for _, s := range c.statds {
		s.Close()
	}
	if err := c.Down(context.Background()); err != nil {
		t.Errorf("dev cluster down: %v", err)
	}
	// Down removes what netd made outside the cluster's dirs: the task
	// namespaces in the machine-wide /var/run/netns (those of tasks still
	// running when the cluster goes down) and the UAPI sockets the WireGuard holders leave when killed. Anything of
	// this cluster still there is a bug of Down; remove it anyway, so the
	// machine stays clean.
	c.mu.Lock()
	defer c.mu.Unlock()
	for id := range c.tasks {
		p := filepath.Join("/var/run/netns", "shoal-"+id)
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("dev cluster down left task namespace %s", p)
			syscall.Unmount(p, syscall.MNT_DETACH)
			os.Remove(p)
		}
	}
	for iface := range c.ifs {
		p := filepath.Join("/var/run/wireguard", iface+".sock")
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("dev cluster down left WireGuard socket %s", p)
			os.Remove(p)
		}
	}
}

func (c *netCluster) noteTask(id string) {
	if id == "" {
		return
	}
	c.mu.Lock()
	c.tasks[id] = true
	c.mu.Unlock()
}

func (c *netCluster) noteIface(name string) {
	if name == "" {
		return
	}
	c.mu.Lock()
	c.ifs[name] = true
	c.mu.Unlock()
}

func (c *netCluster) ctlWithin(d time.Duration, i int, args ...string) (string, string, int) {
	c.t.Helper()
	return ctlBounded(c.t, c.Cluster, d, i, args...)
}

func (c *netCluster) ctl(i int, args ...string) (string, string, int) {
	c.t.Helper()
	return c.ctlWithin(90*time.Second, i, args...)
}

func (c *netCluster) mustCtl(i int, args ...string) string {
	c.t.Helper()
	out, errOut, code := c.ctl(i, args...)
	if code != 0 {
		c.t.Fatalf("node %d: shoalctl %s: exit %d\n%s%s", i, strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// tryStatus is netd's Status on node i.
func (c *netCluster) tryStatus(i int) (*netv1.StatusResponse, error) {
	n, err := client.NewNetd(c.RunDir(i), client.Retry{Attempts: 1})
	if err != nil {
		return nil, err
	}
	defer n.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return n.Status(ctx, &netv1.StatusRequest{})
}

func (c *netCluster) status(i int) *netv1.StatusResponse {
	c.t.Helper()
	st, err := c.tryStatus(i)
	if err != nil {
		c.t.Fatalf("node %d: netd status: %v", i, err)
	}
	return st
}

// peer is node i's WireGuard peer entry for node ID id (nil if none).
func peerOf(st *netv1.StatusResponse, id string) *netv1.Peer {
	for _, p := range st.GetPeers() {
		if p.GetNode() == id {
			return p
		}
	}
	return nil
}

func (c *netCluster) nodeIndex(id string) int {
	for i, x := range c.ids {
		if x == id {
			return i + 1
		}
	}
	return 0
}

// running returns a service's current, running tasks by node index.
func (c *netCluster) running(service string) map[int][]string {
	c.t.Helper()
	s, err := client.NewSchedd(c.RunDir(1), client.Retry{Attempts: 3})
	if err != nil {
		c.t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := s.ListTasks(ctx, &schedv1.ListTasksRequest{Service: service})
	if err != nil {
		c.t.Fatal(err)
	}
	out := map[int][]string{}
	for _, tk := range resp.GetTasks() {
		c.noteTask(tk.GetId())
		if tk.GetCurrent() && tk.GetState() == "running" {
			i := c.nodeIndex(tk.GetNode())
			out[i] = append(out[i], tk.GetId())
		}
	}
	return out
}

// taskOn waits for the one running task of service on node i.
func (c *netCluster) taskOn(service string, i int) string {
	c.t.Helper()
	var id string
	waitFor(c.t, 60*time.Second, fmt.Sprintf("a running task of %s on node %d", service, i), func() bool {
		if ts := c.running(service)[i]; len(ts) == 1 {
			id = ts[0]
			return true
		}
		return false
	})
	return id
}

// taskField reads a field of a task document through node i's statd.
func (c *netCluster) taskField(i int, id, field string) string {
	s := c.statd(i)
	v, _ := getField(s, "/tasks/"+id, field)
	return v
}

// exec runs a command in a task (from node i) and returns its output and
// exit code.
func (c *netCluster) exec(i int, task string, args ...string) (string, string, int) {
	c.t.Helper()
	return c.ctl(i, append([]string{"task", "exec", task, "--"}, args...)...)
}

func (c *netCluster) mustExec(i int, task string, args ...string) string {
	c.t.Helper()
	out, errOut, code := c.exec(i, task, args...)
	if code != 0 {
		c.t.Fatalf("task %s: %v: exit %d\n%s%s", task, args, code, out, errOut)
	}
	return out
}

// create makes a service pinned to node i (0: anywhere), waiting until it
// runs.
func (c *netCluster) create(name string, i int, flags []string, cmd ...string) {
	c.t.Helper()
	args := []string{"service", "create", name, "--image", "local/busybox:latest", "--stop-grace", "1s"}
	if i > 0 {
		args = append(args, "--constraint", fmt.Sprintf("node.name==n%d", i))
	}
	args = append(args, flags...)
	args = append(args, "--")
	args = append(args, cmd...)
	c.mustCtl(1, args...)
}

func (c *netCluster) rm(names ...string) {
	c.t.Helper()
	for _, n := range names {
		c.running(n) // note the task IDs
	}
	c.mustCtl(1, append([]string{"service", "rm"}, names...)...)
}

// rmReleased removes services and waits until netd has released their
// tasks' network namespaces: gone from /var/run/netns, and each node's
// netd counting that many tasks fewer.
func (c *netCluster) rmReleased(t *testing.T, names ...string) {
	t.Helper()
	byNode := map[int][]string{}
	for _, n := range names {
		for i, ids := range c.running(n) {
			byNode[i] = append(byNode[i], ids...)
		}
	}
	before := map[int]uint32{}
	for i := range byNode {
		before[i] = c.status(i).GetTasks()
	}
	c.rm(names...)
	waitFor(t, 30*time.Second, fmt.Sprintf("the namespaces of %v's tasks %v released", names, byNode), func() bool {
		for i, ids := range byNode {
			for _, id := range ids {
				if _, err := os.Lstat(filepath.Join("/var/run/netns", "shoal-"+id)); err == nil {
					return false
				}
			}
			st, err := c.tryStatus(i)
			if err != nil || st.GetTasks()+uint32(len(ids)) > before[i] {
				return false
			}
		}
		return true
	})
}

// lookup resolves name from inside task (on node i) with busybox
// nslookup and returns the addresses of the answer (none for NXDOMAIN or
// NODATA).
func (c *netCluster) lookup(i int, task, name string) []string {
	c.t.Helper()
	out, _, _ := c.exec(i, task, "nslookup", name)
	var addrs []string
	_, answer, _ := strings.Cut(out, "Name:")
	for _, line := range strings.Split(answer, "\n") {
		if a, ok := strings.CutPrefix(strings.TrimSpace(line), "Address:"); ok {
			addrs = append(addrs, strings.TrimSpace(a))
		}
	}
	slices.Sort(addrs)
	return addrs
}

// wgetArgs fetch url from inside a task. (busybox 1.35's wget -T
// crashes with SIGSEGV, so the timeout comes from the timeout applet.)
func wgetArgs(url string) []string {
	return []string{"timeout", "5", "wget", "-qO-", url}
}

// reach waits until task (on node i) fetches the test image's page from
// http://<service>.shoal/, and returns when it did. On failure it shows
// what the task resolves and the node's view of the mesh.
func (c *netCluster) reach(t *testing.T, within time.Duration, i int, task, service string) time.Time {
	t.Helper()
	deadline := time.Now().Add(within)
	var out, errOut string
	var code int
	for {
		out, errOut, code = c.exec(i, task, wgetArgs("http://"+service+".shoal/")...)
		if strings.Contains(out, "shoal test image") {
			return time.Now()
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	ns, nsErr, _ := c.exec(i, task, "nslookup", service+".shoal")
	route, _, _ := c.exec(i, task, "ip", "route")
	var peers []string
	if st, err := c.tryStatus(i); err == nil {
		for _, p := range st.GetPeers() {
			peers = append(peers, fmt.Sprintf("%s %s %s hs=%v rx=%d tx=%d", p.GetNode(), p.GetSubnet(), p.GetEndpoint(), p.GetLastHandshake().AsTime(), p.GetRxBytes(), p.GetTxBytes()))
		}
	}
	t.Fatalf("node %d task %s did not reach http://%s.shoal/ within %v: exit %d %q %q\nnslookup: %s%s\nroutes: %s\npeers:\n%s",
		i, task, service, within, code, out, errOut, ns, nsErr, route, strings.Join(peers, "\n"))
	return time.Time{}
}

// httpGet fetches url from the host, on a new connection.
func httpGet(url string) (string, error) {
	cl := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := cl.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("%s: %s", url, resp.Status)
	}
	return string(b), nil
}

// dnsProbe is a shell loop that ends once name resolves to ip. Each
// nslookup gets at most 200 ms: while nothing listens on the DNS port, the
// kernel rate-limits its ICMP port-unreachable replies, and an nslookup that
// gets none waits seconds before it retries, which would hide when the
// server came back.
func dnsProbe(name, ip string) string {
	return fmt.Sprintf(`probe() {
	nslookup %s > /tmp/ns.out 2>&1 & p=$!
	i=0; while [ $i -lt 10 ] && kill -0 $p 2>/dev/null; do usleep 20000; i=$((i+1)); done
	kill $p 2>/dev/null; wait $p 2>/dev/null
	grep -q '^Address:[[:space:]]*%s$' /tmp/ns.out
}
until probe; do usleep 20000; done`, name, regexp.QuoteMeta(ip))
}

// capture is a tcpdump on the host.
type capture struct {
	cmd  *exec.Cmd
	file string
	errb *syncBuffer
}

func startCapture(t *testing.T, iface, file string, filter ...string) *capture {
	t.Helper()
	// --immediate-mode: without it packets wait in the kernel's ring for a
	// block to fill or time out, and SIGINT loses them.
	args := append([]string{"-i", iface, "-n", "--immediate-mode", "-B", "32768", "-U", "-s", "0", "-Z", "root", "-w", file}, filter...)
	cmd := exec.Command("tcpdump", args...)
	cp := &capture{cmd: cmd, file: file, errb: &syncBuffer{}}
	cmd.Stderr = cp.errb
	if err := cmd.Start(); err != nil {
		t.Fatalf("tcpdump: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	waitFor(t, 10*time.Second, "tcpdump listening", func() bool { return strings.Contains(cp.errb.String(), "listening on") })
	return cp
}

func (cp *capture) stop(t *testing.T) []byte {
	t.Helper()
	time.Sleep(300 * time.Millisecond) // the last packets
	cp.cmd.Process.Signal(syscall.SIGINT)
	cp.cmd.Wait()
	b, err := os.ReadFile(cp.file)
	if err != nil {
		t.Fatalf("capture: %v (tcpdump: %s)", err, cp.errb)
	}
	t.Logf("tcpdump %s: %s", cp.file, strings.Join(strings.Fields(cp.errb.String()), " "))
	return b
}

// udpPacket is a UDP datagram of a capture.
type udpPacket struct {
	src, dst netip.AddrPort
	payload  []byte
}

// pcapUDP returns the IPv4 UDP datagrams of an Ethernet pcap file.
func pcapUDP(t *testing.T, b []byte) (udp []udpPacket, total int) {
	t.Helper()
	if len(b) < 24 {
		t.Fatalf("capture of %d bytes", len(b))
	}
	var bo binary.ByteOrder
	switch binary.LittleEndian.Uint32(b) {
	case 0xa1b2c3d4, 0xa1b23c4d:
		bo = binary.LittleEndian
	case 0xd4c3b2a1, 0x4d3cb2a1:
		bo = binary.BigEndian
	default:
		t.Fatalf("not a pcap file")
	}
	if lt := bo.Uint32(b[20:]); lt != 1 {
		t.Fatalf("capture link type %d, want Ethernet", lt)
	}
	for off := 24; off+16 <= len(b); {
		n := int(bo.Uint32(b[off+8:]))
		off += 16
		if off+n > len(b) {
			break
		}
		pkt := b[off : off+n]
		off += n
		total++
		if len(pkt) < 14+20 || binary.BigEndian.Uint16(pkt[12:]) != 0x0800 {
			continue
		}
		ip := pkt[14:]
		ihl := int(ip[0]&0x0f) * 4
		if ip[9] != 17 || len(ip) < ihl+8 {
			continue
		}
		src, _ := netip.AddrFromSlice(ip[12:16])
		dst, _ := netip.AddrFromSlice(ip[16:20])
		u := ip[ihl:]
		udp = append(udp, udpPacket{
			src:     netip.AddrPortFrom(src, binary.BigEndian.Uint16(u[0:])),
			dst:     netip.AddrPortFrom(dst, binary.BigEndian.Uint16(u[2:])),
			payload: u[8:],
		})
	}
	return udp, total
}

// fakeUpstreamPort is where every node's netd forwards names outside
// .shoal: the node namespace's own loopback, where DNSForwarding serves.
const fakeUpstreamPort = 5354

// fakeResolver answers every A query for a name under example.test. with
// 192.0.2.77 and anything else with NXDOMAIN, on 127.0.0.1:port of node
// i's namespace, and counts the queries it got.
func (c *netCluster) fakeResolver(t *testing.T, i, port int) *atomic.Int64 {
	t.Helper()
	var pc net.PacketConn
	err := c.InNetns(i, func() (err error) {
		pc, err = net.ListenPacket("udp4", fmt.Sprintf("127.0.0.1:%d", port))
		return err
	})
	if err != nil {
		t.Fatalf("fake resolver on node %d: %v", i, err)
	}
	var n atomic.Int64
	srv := &mdns.Server{PacketConn: pc, Handler: mdns.HandlerFunc(func(w mdns.ResponseWriter, req *mdns.Msg) {
		n.Add(1)
		m := new(mdns.Msg)
		m.SetReply(req)
		q := req.Question[0]
		if !mdns.IsSubDomain("example.test.", q.Name) {
			m.Rcode = mdns.RcodeNameError
		} else if q.Qtype == mdns.TypeA {
			m.Answer = append(m.Answer, &mdns.A{Hdr: mdns.RR_Header{Name: q.Name, Rrtype: mdns.TypeA, Class: mdns.ClassINET, Ttl: 60}, A: net.IPv4(192, 0, 2, 77)})
		}
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	return &n
}

func TestNetwork(t *testing.T) {
	began := time.Now()
	c := newNetCluster(t, 4)
	t.Logf("4-node cluster with netd up in %v", time.Since(began).Round(time.Millisecond))
	ctx := context.Background()

	// `daemon status` shows netd's overlay as netd's own status does.
	c.run(t, "DaemonStatusShowsOverlay", func(t *testing.T) {
		st := c.status(2)
		out := c.mustCtl(2, "daemon", "status", "-o", "json")
		type row struct {
			Name    string            `json:"name"`
			Details map[string]string `json:"details"`
		}
		var rows []row
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			t.Fatalf("daemon status -o json: %v\n%s", err, out)
		}
		i := slices.IndexFunc(rows, func(r row) bool { return r.Name == "netd" })
		if i < 0 {
			t.Fatalf("daemon status -o json has no netd:\n%s", out)
		}
		d := rows[i].Details
		if d["subnet"] != st.GetSubnet() || d["interface"] != st.GetInterface() || d["wireguard"] != st.GetMode() || d["node_id"] != c.ids[1] {
			t.Errorf("netd's details %v, want subnet %s, interface %s, wireguard %s, node %s", d, st.GetSubnet(), st.GetInterface(), st.GetMode(), c.ids[1])
		}
	})

	// 1. A task on node 1 reaches a task on node 3 by name, through the
	// WireGuard tunnel, and the underlay carries only ciphertext.
	c.run(t, "EncryptedTunnelByName", func(t *testing.T) {
		c.create("dst", 3, nil, "sh", "-c", "httpd -p 80 -h /www; sleep 1000000 | nc -l -p 9000 > /tmp/recv")
		c.create("src", 1, nil, "sleep", "1000000")
		dst, src := c.taskOn("dst", 3), c.taskOn("src", 1)
		c.reach(t, 45*time.Second, 1, src, "dst")
		before := peerOf(c.status(1), c.ids[2])
		if before == nil {
			t.Fatalf("node 1 has no peer for node 3: %v", c.status(1).GetPeers())
		}

		// 64 KiB of a token made of two halves, so that no command line
		// (which travels between nodes) holds the marker itself.
		a, b := fmt.Sprintf("SHOALPLAIN%06d", rand.IntN(1_000_000)), fmt.Sprintf("MARK%012x", rand.Int64N(1<<48))
		marker := a + b // 32 bytes
		dir := t.TempDir()
		bridge := "shbr-" + c.Name()
		wgCap := startCapture(t, bridge, filepath.Join(dir, "wg.pcap"), "udp", "port", "51820")
		allCap := startCapture(t, bridge, filepath.Join(dir, "all.pcap"))
		c.mustExec(1, src, "sh", "-c", fmt.Sprintf(`a=%s; b=%s; i=0; while [ $i -lt 2048 ]; do printf '%%s%%s' "$a" "$b"; i=$((i+1)); done | nc dst.shoal 9000`, a, b))
		wgPcap, allPcap := wgCap.stop(t), allCap.stop(t)
		got := c.mustExec(3, dst, "sh", "-c", "wc -c < /tmp/recv; head -c 32 /tmp/recv")
		if want := fmt.Sprintf("65536\n%s", marker); strings.TrimSpace(got) != want {
			t.Fatalf("receiver got %q, want %q", got, want)
		}

		after := peerOf(c.status(1), c.ids[2])
		if after.GetLastHandshake() == nil {
			t.Fatalf("node 1's peer node 3 shows no handshake: %v", after)
		}
		drx, dtx := after.GetRxBytes()-before.GetRxBytes(), after.GetTxBytes()-before.GetTxBytes()
		t.Logf("node 1 -> node 3 peer: handshake %v ago, rx +%d B, tx +%d B over the 64 KiB transfer",
			time.Since(after.GetLastHandshake().AsTime()).Round(time.Millisecond), drx, dtx)
		if dtx < 65536 || drx <= 0 {
			t.Fatalf("node 1's WireGuard counters for node 3 moved rx +%d tx +%d over a 64 KiB transfer", drx, dtx)
		}

		// The capture holds the transfer as WireGuard data messages
		// (type 4) between nodes 1 and 3, and the marker nowhere.
		n1, n3 := netip.MustParseAddr(c.Addr(1)), netip.MustParseAddr(c.Addr(3))
		wgPkts, _ := pcapUDP(t, wgPcap)
		var dataBytes int
		for _, p := range wgPkts {
			if len(p.payload) > 16 && p.payload[0] == 4 && p.src.Addr() == n1 && p.dst.Addr() == n3 && p.dst.Port() == 51820 {
				dataBytes += len(p.payload)
			}
		}
		allUDP, allN := pcapUDP(t, allPcap)
		t.Logf("capture on %s: %d packets (%d UDP), %d WireGuard packets with %d B of data messages from node 1 to node 3",
			bridge, allN, len(allUDP), len(wgPkts), dataBytes)
		if dataBytes < 65536 {
			t.Fatalf("only %d B of WireGuard data from node 1 to node 3 on the underlay for a 64 KiB transfer", dataBytes)
		}
		for name, pcap := range map[string][]byte{"udp port 51820": wgPcap, "all": allPcap} {
			for _, m := range []string{marker, b, a} {
				if bytes.Contains(pcap, []byte(m)) {
					t.Fatalf("plaintext %q in the %s capture on the underlay", m, name)
				}
			}
		}
		// Removing the services releases their tasks' namespaces.
		c.rmReleased(t, "dst", "src")
	})

	// Names outside .shoal are forwarded by the node's netd, from the
	// node's namespace, to its upstream (here a loopback one, as
	// systemd-resolved's 127.0.0.53 would be).
	c.run(t, "DNSForwarding", func(t *testing.T) {
		queries := c.fakeResolver(t, 1, fakeUpstreamPort)
		c.create("fwd", 1, nil, "sleep", "1000000")
		task := c.taskOn("fwd", 1)
		if got := c.lookup(1, task, "probe.example.test"); !slices.Equal(got, []string{"192.0.2.77"}) {
			out, errOut, _ := c.exec(1, task, "nslookup", "probe.example.test")
			t.Fatalf("probe.example.test from a task resolves to %v, want the fake upstream's 192.0.2.77\n%s%s", got, out, errOut)
		}
		if queries.Load() == 0 {
			t.Fatal("the fake upstream got no query")
		}
		// Its NXDOMAIN comes back as such; .shoal names never go upstream.
		before := queries.Load()
		out, _, _ := c.exec(1, task, "nslookup", "fwd.shoal")
		if !strings.Contains(out, c.taskField(1, task, "ip")) || queries.Load() != before {
			t.Fatalf("fwd.shoal: %q, upstream queries %d -> %d", out, before, queries.Load())
		}
		if out, errOut, _ := c.exec(1, task, "nslookup", "nothing.invalid"); strings.Contains(out, "192.0.2.77") || !strings.Contains(out+errOut, "NXDOMAIN") {
			t.Fatalf("nothing.invalid: %q %q, want NXDOMAIN", out, errOut)
		}
		t.Logf("fake upstream answered %d queries", queries.Load())
		c.rm("fwd")
	})

	// --network host keeps a service in its node's namespace: reachable
	// on the node's address, no task namespace; publishing its ports is
	// refused.
	c.run(t, "HostNetwork", func(t *testing.T) {
		tasksBefore := c.status(2).GetTasks()
		c.create("hostnet", 2, []string{"--network", "host"}, "httpd", "-f", "-p", "18080", "-h", "/www")
		task := c.taskOn("hostnet", 2)
		url := fmt.Sprintf("http://%s:18080/", c.Addr(2))
		waitFor(t, 15*time.Second, url+" answers", func() bool {
			b, err := httpGet(url)
			return err == nil && strings.Contains(b, "shoal test image")
		})
		if ip := c.taskField(2, task, "ip"); ip != "" {
			t.Errorf("--network host task %s has overlay address %s", task, ip)
		}
		if _, err := os.Lstat(filepath.Join("/var/run/netns", "shoal-"+task)); err == nil {
			t.Errorf("--network host task %s has a network namespace", task)
		}
		if n := c.status(2).GetTasks(); n != tasksBefore {
			t.Errorf("node 2's netd counts %d tasks, %d before the --network host one", n, tasksBefore)
		}
		_, errOut, code := c.ctl(1, "service", "create", "hostpub", "--image", "local/busybox:latest", "--network", "host", "--publish", "8095:80", "--", "sleep", "1000000")
		t.Logf("--network host --publish: exit %d: %s", code, strings.TrimSpace(errOut))
		if code != 2 || !strings.Contains(errOut, "8095/tcp") || !strings.Contains(errOut, "--network host service cannot publish") {
			t.Errorf("--network host --publish 8095:80: exit %d %q, want exit 2 saying why", code, errOut)
		}
		if _, _, code := c.ctl(1, "service", "inspect", "hostpub"); code != 3 {
			t.Errorf("rejected service hostpub exists (inspect exit %d)", code)
		}
		c.rm("hostnet")
	})

	// An HTTP health check reaches a task on the overlay at its own
	// address (port 80 of the node itself answers nothing).
	// Overlay networks keep services apart: tasks reach each other, on
	// one node or two, only on a network they share (none named: the
	// default network); a node reaches every task (a health check).
	c.run(t, "NetworkIsolation", func(t *testing.T) {
		web := []string{"httpd", "-f", "-p", "80", "-h", "/www"}
		for _, s := range []struct {
			name string
			node int
			nets []string
		}{
			{"red1", 1, []string{"red"}}, {"redb1", 1, []string{"red"}}, {"blue1", 1, []string{"blue"}}, {"plain1", 1, nil},
			{"red3", 3, []string{"red"}}, {"both3", 3, []string{"red", "blue"}}, {"plain3", 3, nil},
		} {
			var flags []string
			for _, n := range s.nets {
				switch {
				case s.name == "both3" && n == "blue", s.name == "blue1":
					n = "name=blue,alias=bothb" // a name on blue, of two services
				case s.name == "redb1":
					n = "name=red,alias=bothb" // and on red, of another
				}
				flags = append(flags, "--network", n)
			}
			if s.name == "red3" {
				flags = append(flags, "--health-http", "80/", "--health-interval", "1s")
			}
			c.create(s.name, s.node, flags, web...)
		}
		task := map[string]string{}
		ip := map[string]string{}
		for _, name := range []string{"red1", "redb1", "blue1", "plain1", "red3", "both3", "plain3"} {
			i := 1
			if strings.HasSuffix(name, "3") {
				i = 3
			}
			task[name] = c.taskOn(name, i)
			ip[name] = c.taskField(i, task[name], "ip")
		}
		node := func(name string) int {
			if strings.HasSuffix(name, "3") {
				return 3
			}
			return 1
		}
		get := func(from, to string) (string, string, int) {
			return c.exec(node(from), task[from], "timeout", "3", "wget", "-qO-", "http://"+ip[to]+"/")
		}
		for _, p := range [][2]string{{"redb1", "red1"}, {"red3", "red1"}, {"both3", "red1"}, {"both3", "blue1"}, {"plain3", "plain1"}, {"red1", "red3"}} {
			waitFor(t, 30*time.Second, p[0]+" reaches "+p[1]+" ("+ip[p[1]]+")", func() bool {
				out, _, _ := get(p[0], p[1])
				return strings.Contains(out, "shoal test image")
			})
		}
		if h := c.taskField(3, task["red3"], "health"); h != "healthy" {
			t.Errorf("red3's task is %q: its node's health check does not reach it", h)
		}
		for _, p := range [][2]string{{"blue1", "red1"}, {"plain1", "red1"}, {"red3", "blue1"}, {"plain3", "red1"}, {"red1", "plain1"}} {
			if out, errOut, code := get(p[0], p[1]); code == 0 || strings.Contains(out, "shoal test image") {
				t.Errorf("%s (node %d) reached %s (%s) on no shared network: exit %d %q %q", p[0], node(p[0]), p[1], ip[p[1]], code, out, errOut)
			}
		}
		// Names resolve only on a shared network: NXDOMAIN, as from a
		// separate Swarm network.
		if got := c.lookup(1, task["red1"], "red3.shoal"); !slices.Equal(got, []string{ip["red3"]}) {
			t.Errorf("red3.shoal from red1: %v, want %s", got, ip["red3"])
		}
		if got := c.lookup(3, task["both3"], "blue1.shoal"); !slices.Equal(got, []string{ip["blue1"]}) {
			t.Errorf("blue1.shoal from both3: %v, want %s", got, ip["blue1"])
		}
		for _, p := range [][2]string{{"red1", "blue1"}, {"plain3", "red1"}, {"red3", "plain1"}} {
			out, errOut, _ := c.exec(node(p[0]), task[p[0]], "nslookup", p[1]+".shoal")
			if strings.Contains(out, ip[p[1]]) || !strings.Contains(out+errOut, "NXDOMAIN") {
				t.Errorf("%s.shoal from %s: %q %q, want NXDOMAIN", p[1], p[0], out, errOut)
			}
		}
		// The alias bothb is both3's and blue1's on blue, by itself too
		// (the search list), redb1's on red (which both3 is on as well)
		// and no name on the default network.
		if got, want := c.lookup(1, task["blue1"], "bothb"), slices.Sorted(slices.Values([]string{ip["both3"], ip["blue1"]})); !slices.Equal(got, want) {
			t.Errorf("bothb from blue1: %v, want both3's and blue1's %v", got, want)
		}
		if got := c.lookup(1, task["red1"], "bothb.shoal"); !slices.Equal(got, []string{ip["redb1"]}) {
			t.Errorf("bothb.shoal from red1 (red, not blue): %v, want redb1's %s", got, ip["redb1"])
		}
		if out, errOut, _ := c.exec(3, task["plain3"], "nslookup", "bothb.shoal"); strings.Contains(out, ip["both3"]) || !strings.Contains(out+errOut, "NXDOMAIN") {
			t.Errorf("bothb.shoal from plain3 (default network): %q %q, want NXDOMAIN", out, errOut)
		}
		// network ls names the networks, their services and tasks.
		var v struct {
			Networks []struct {
				Name      string   `json:"name"`
				Services  []string `json:"services"`
				Addresses []string `json:"addresses"`
			} `json:"networks"`
		}
		decode(t, c.mustCtl(2, "network", "ls", "-o", "json"), &v)
		nets := map[string]string{}
		for _, n := range v.Networks {
			nets[n.Name] = fmt.Sprintf("%v %d", n.Services, len(n.Addresses))
		}
		if nets["red"] != "[both3 red1 red3 redb1] 4" || nets["blue"] != "[blue1 both3] 2" || nets["default"] != "[plain1 plain3] 2" {
			t.Errorf("network ls -o json: networks %v", nets)
		}
		if table := c.mustCtl(1, "network", "ls"); !strings.Contains(table, "NETWORK") || !regexp.MustCompile(`(?m)^red +4 +both3,red1,red3,redb1$`).MatchString(table) {
			t.Errorf("network ls lacks red's line:\n%s", table)
		}
		var red struct {
			Name      string   `json:"name"`
			Services  []string `json:"services"`
			Addresses []string `json:"addresses"`
		}
		decode(t, c.mustCtl(3, "network", "inspect", "red", "-o", "json"), &red)
		if red.Name != "red" || len(red.Services) != 4 || !slices.Contains(red.Addresses, ip["red1"]) || slices.Contains(red.Addresses, ip["blue1"]) {
			t.Errorf("network inspect red: %+v", red)
		}
		if table := c.mustCtl(3, "network", "inspect", "blue"); !regexp.MustCompile(`(?m)^ALIASES +bothb\.shoal \(blue1, both3\)$`).MatchString(table) {
			t.Errorf("network inspect blue lacks blue1's and both3's alias:\n%s", table)
		}
		if table := c.mustCtl(3, "network", "inspect", "red"); !regexp.MustCompile(`(?m)^ALIASES +bothb\.shoal \(redb1\)$`).MatchString(table) {
			t.Errorf("network inspect red lacks redb1's alias:\n%s", table)
		}
		if table := c.mustCtl(3, "network", "inspect", "default"); !regexp.MustCompile(`(?m)^ALIASES +-$`).MatchString(table) {
			t.Errorf("network inspect default lists aliases:\n%s", table)
		}
		if _, errOut, code := c.ctl(3, "network", "inspect", "green"); code != 3 || !strings.Contains(errOut, "no service is on it") {
			t.Errorf("network inspect green: exit %d %q, want 3", code, errOut)
		}
		_, errOut, code := c.ctl(1, "service", "create", "hostred", "--image", "local/busybox:latest", "--network", "host", "--network", "red", "--", "sleep", "1000000")
		if code != 2 || !strings.Contains(errOut, "network host") {
			t.Errorf("--network host --network red: exit %d %q, want exit 2 saying why", code, errOut)
		}
		// Last, for forge1 also answers ARP for the address it takes,
		// which misleads node 1's other tasks until they go.
		// A task cannot pass for its node: forge1 (blue, NET_ADMIN) takes
		// node 1's bridge address and pings red1 from it; no echo
		// arrives (red1's ICMP counters), where the node's own address
		// reaches every task. (Another node's address, WireGuard already
		// refuses: it is not in the sender's allowed IPs. Across nodes,
		// forge1's pings from its node's address do not even leave it,
		// its gateway now being its own: TestApplyIsolation has that
		// rule.)
		gw1 := strings.TrimSuffix(c.status(1).GetSubnet(), ".0/24") + ".1"
		c.create("forge1", 1, []string{"--network", "blue", "--cap-add", "NET_ADMIN"}, "sleep", "1000000")
		forge := c.taskOn("forge1", 1)
		c.mustExec(1, forge, "ip", "addr", "add", gw1+"/32", "dev", "eth0")
		inEchos := func(target string) string {
			out := c.mustExec(node(target), task[target], "sh", "-c", "grep '^Icmp:' /proc/net/snmp | tail -1 | cut -d' ' -f10")
			return strings.TrimSpace(out)
		}
		// Nor for another task: forge1 takes redb1's address too, and
		// pings red3 (across nodes, on red like redb1) from it; and
		// when red1 asks by ARP who has redb1's address, only redb1
		// answers.
		c.mustExec(1, forge, "ip", "addr", "add", ip["redb1"]+"/32", "dev", "eth0")
		before := inEchos("red3")
		c.exec(1, forge, "ping", "-c", "3", "-W", "1", "-I", ip["redb1"], ip["red3"])
		if after := inEchos("red3"); after != before {
			t.Errorf("pings from forge1 with redb1's address %s reached red3: its ICMP InEchos went %s -> %s", ip["redb1"], before, after)
		}
		redbMAC := strings.TrimSpace(c.mustExec(1, task["redb1"], "cat", "/sys/class/net/eth0/address"))
		out, errOut, _ := c.exec(1, task["red1"], "busybox", "arping", "-b", "-c", "3", "-w", "3", "-I", "eth0", ip["redb1"])
		macs := map[string]bool{}
		for _, m := range regexp.MustCompile(`\[([0-9a-fA-F:]{17})\]`).FindAllStringSubmatch(out, -1) {
			macs[strings.ToLower(m[1])] = true
		}
		if len(macs) != 1 || !macs[strings.ToLower(redbMAC)] {
			t.Errorf("ARP replies for redb1's address %s came from %v, want redb1's %s alone\n%s%s", ip["redb1"], slices.Collect(maps.Keys(macs)), redbMAC, out, errOut)
		}
		// Duplicate address detection: red1's ARP probes (sender
		// 0.0.0.0) pass, and redb1 answers them: arping -D exits 1
		// when it gets an answer.
		if out, errOut, code := c.exec(1, task["red1"], "busybox", "arping", "-D", "-c", "2", "-w", "3", "-I", "eth0", ip["redb1"]); code != 1 {
			t.Errorf("red1's duplicate address probe for redb1's %s: exit %d, want 1 (an answer)\n%s%s", ip["redb1"], code, out, errOut)
		}
		for _, target := range []string{"red1"} {
			// The counter counts: both3, on red, pings first.
			before := inEchos(target)
			c.mustExec(3, task["both3"], "ping", "-c", "2", "-W", "1", ip[target])
			if after := inEchos(target); after == before {
				t.Fatalf("%s's ICMP InEchos stayed %s over both3's pings", target, before)
			}
			before = inEchos(target)
			c.exec(1, forge, "ping", "-c", "3", "-W", "1", "-I", gw1, ip[target])
			if after := inEchos(target); after != before {
				t.Errorf("pings from forge1 with node 1's address %s reached %s: its ICMP InEchos went %s -> %s", gw1, target, before, after)
			}
		}
		c.rm("red1", "redb1", "blue1", "plain1", "red3", "both3", "plain3", "forge1")
	})

	// An internal network (Docker's network create --internal, Compose's
	// internal): a task on internal networks only reaches the tasks on
	// them and its node's DNS, and nothing outside the overlay, not even
	// a node's address; names outside .shoal are refused it. The nodes
	// still reach it: its published port answers.
	c.run(t, "InternalNetwork", func(t *testing.T) {
		queries := c.fakeResolver(t, 1, fakeUpstreamPort)
		web := []string{"httpd", "-f", "-p", "80", "-h", "/www"}
		// vault1 makes vault internal, for vault3 too; open1 is also on
		// outer, so it is not sealed.
		c.create("vault1", 1, []string{"--network", "name=vault,internal", "--publish", "8097:80"}, web...)
		c.create("vault3", 3, []string{"--network", "vault"}, web...)
		c.create("open1", 1, []string{"--network", "vault", "--network", "outer"}, web...)
		vault1, vault3, open1 := c.taskOn("vault1", 1), c.taskOn("vault3", 3), c.taskOn("open1", 1)
		for _, i := range []int{1, 3} {
			waitFor(t, 30*time.Second, fmt.Sprintf("node %d's netd has vault internal with its 3 tasks", i), func() bool {
				var v struct {
					Internal  bool     `json:"internal"`
					Addresses []string `json:"addresses"`
				}
				out, _, code := c.ctl(i, "network", "inspect", "vault", "-o", "json")
				return code == 0 && json.Unmarshal([]byte(out), &v) == nil && v.Internal && len(v.Addresses) == 3
			})
		}
		// Within the overlay, by name: DNS and the other node's task.
		waitFor(t, 30*time.Second, "vault3 reaches vault1 by name", func() bool {
			out, _, _ := c.exec(3, vault3, "timeout", "3", "wget", "-qO-", "http://vault1.shoal/")
			return strings.Contains(out, "shoal test image")
		})
		// The nodes reach vault1: its published port on node 1 (its own
		// node's proxy) and on node 3 (across the overlay).
		for _, i := range []int{1, 3} {
			url := fmt.Sprintf("http://%s:8097/", c.Addr(i))
			waitFor(t, 15*time.Second, url+" answers from vault1", func() bool {
				b, err := httpGet(url)
				return err == nil && strings.Contains(b, "shoal test image")
			})
		}
		// A task that is not sealed reaches a node's address; sealed
		// ones reach neither another node's nor their own node's.
		url3 := fmt.Sprintf("http://%s:8097/", c.Addr(3))
		if out, errOut, code := c.exec(1, open1, "timeout", "3", "wget", "-qO-", url3); code != 0 || !strings.Contains(out, "shoal test image") {
			t.Errorf("open1 (vault and outer) to %s: exit %d %q %q, want the page", url3, code, out, errOut)
		}
		for _, p := range []struct {
			node       int
			task, name string
			addr       int
		}{{1, vault1, "vault1", 3}, {3, vault3, "vault3", 1}, {3, vault3, "vault3", 3}} {
			url := fmt.Sprintf("http://%s:8097/", c.Addr(p.addr))
			if out, errOut, code := c.exec(p.node, p.task, "timeout", "3", "wget", "-qO-", url); code == 0 || strings.Contains(out, "shoal test image") {
				t.Errorf("%s (node %d, internal only) reached %s (node %d): exit %d %q %q", p.name, p.node, url, p.addr, code, out, errOut)
			}
		}
		// DNS forwarding: open1 gets the fake upstream's answer, vault1
		// is refused and the upstream is not asked.
		if got := c.lookup(1, open1, "probe.example.test"); !slices.Equal(got, []string{"192.0.2.77"}) {
			t.Errorf("probe.example.test from open1: %v, want the fake upstream's 192.0.2.77", got)
		}
		before := queries.Load()
		if out, errOut, _ := c.exec(1, vault1, "nslookup", "probe.example.test"); strings.Contains(out, "192.0.2.77") || queries.Load() != before {
			t.Errorf("probe.example.test from vault1 (internal only): %q %q, upstream queries %d -> %d; want no answer and none asked",
				out, errOut, before, queries.Load())
		}
		if table := c.mustCtl(3, "network", "inspect", "vault"); !regexp.MustCompile(`(?m)^INTERNAL +yes`).MatchString(table) {
			t.Errorf("network inspect vault does not say internal:\n%s", table)
		}
		if table := c.mustCtl(3, "network", "inspect", "outer"); !regexp.MustCompile(`(?m)^INTERNAL +no$`).MatchString(table) {
			t.Errorf("network inspect outer says internal:\n%s", table)
		}
		c.rm("vault1", "vault3", "open1")
	})

	c.run(t, "HealthCheckOnOverlay", func(t *testing.T) {
		c.create("hcov", 2, []string{"--health-http", "80/", "--health-interval", "1s", "-d"}, "httpd", "-f", "-p", "80", "-h", "/www")
		task := c.taskOn("hcov", 2)
		waitFor(t, 30*time.Second, "hcov's task healthy", func() bool { return c.taskField(2, task, "health") == "healthy" })
		c.rm("hcov")
	})

	// shoalctl network ls|inspect, as tables and as JSON.
	c.run(t, "NetworkCommands", func(t *testing.T) {
		table := c.mustCtl(1, "network", "ls")
		for _, want := range []string{"OVERLAY", "10.42.0.0/16", c.status(3).GetSubnet()} {
			if !strings.Contains(table, want) {
				t.Fatalf("network ls lacks %q:\n%s", want, table)
			}
		}
		if table := c.mustCtl(1, "network", "inspect"); !strings.Contains(table, "LAST HANDSHAKE") || !strings.Contains(table, c.ids[2]) {
			t.Fatalf("network inspect:\n%s", table)
		}
		var v struct {
			OverlayCIDR string `json:"overlay_cidr"`
			Subnets     []struct {
				Subnet, Node string
			} `json:"subnets"`
			Peers []map[string]any `json:"peers"`
		}
		for _, cmd := range []string{"ls", "inspect"} {
			out := c.mustCtl(1, "network", cmd, "-o", "json")
			if err := json.Unmarshal([]byte(out), &v); err != nil {
				t.Fatalf("network %s -o json: %v\n%s", cmd, err, out)
			}
			if v.OverlayCIDR != "10.42.0.0/16" || len(v.Subnets) != c.Nodes() || len(v.Peers) != c.Nodes()-1 {
				t.Fatalf("network %s -o json: %s", cmd, out)
			}
			for _, p := range v.Peers {
				for _, k := range []string{"node", "public_key", "endpoint", "subnet", "last_handshake", "rx_bytes", "tx_bytes"} {
					if _, ok := p[k]; !ok {
						t.Fatalf("network %s -o json: peer without %s: %v", cmd, k, p)
					}
				}
				// Node 3 and node 1 exchanged traffic in the first subtest.
				if p["node"] == c.ids[2] {
					hs, _ := p["last_handshake"].(string)
					if at, err := time.Parse(time.RFC3339, hs); err != nil || time.Since(at) > 10*time.Minute {
						t.Fatalf("network %s -o json: last handshake with node 3 %q (%v)", cmd, hs, err)
					}
					if rx, _ := p["rx_bytes"].(float64); rx <= 0 {
						t.Fatalf("network %s -o json: rx_bytes from node 3 %v", cmd, p["rx_bytes"])
					}
				}
			}
		}
		if out := c.mustCtl(1, "network", "inspect", "-o", "yaml"); !strings.Contains(out, "overlay_cidr: 10.42.0.0/16") {
			t.Fatalf("network inspect -o yaml:\n%s", out)
		}
		if _, errOut, code := c.ctl(1, "network", "ls", "-o", "xml"); code != 2 || !strings.Contains(errOut, "xml") {
			t.Fatalf("network ls -o xml: exit %d %q", code, errOut)
		}
	})

	// 2. Published ports answer on every node, replica or not, and skip
	// unhealthy replicas.
	c.run(t, "PublishedPorts", func(t *testing.T) {
		c.create("pub", 1, []string{"--publish", "8080:80"}, "httpd", "-f", "-p", "80", "-h", "/www")
		for i := 1; i <= c.Nodes(); i++ {
			url := fmt.Sprintf("http://%s:8080/", c.Addr(i))
			var body string
			var err error
			func() {
				// On a timeout (Fatalf runs deferred calls), what this
				// node's statd holds of the service's tasks and the
				// backends its netd derived from them: whether the state
				// or the proxy lagged.
				defer func() {
					if t.Failed() {
						ps, psErr, _ := c.ctl(i, "service", "ps", "pub", "-o", "json")
						net, netErr, _ := c.ctl(i, "network", "inspect", "-o", "json")
						t.Logf("node %d service ps: %s%s\nnode %d network inspect: %s%s", i, ps, psErr, i, net, netErr)
						slots, slotsErr, _ := c.ctl(i, "state", "ls", "/slots/pub/", "-o", "json")
						t.Logf("node %d slot documents: %s%s", i, slots, slotsErr)
						t.Logf("node %d netd goroutines:\n%s", i, c.goroutines(i, 9463))
					}
				}()
				waitFor(t, 15*time.Second, url+" answers", func() bool {
					body, err = httpGet(url)
					return err == nil
				})
			}()
			if !strings.Contains(body, "shoal test image") {
				t.Fatalf("%s: %q", url, body)
			}
		}
		c.rm("pub")

		c.create("hc", 0, []string{"--replicas", "2", "--constraint", "node.name!=n4", "--publish", "8081:80",
			"--health-cmd", "test -f /www/ok", "--health-interval", "500ms", "--health-retries", "1"},
			"sh", "-c", `echo "$(hostname) $(cat /proc/sys/kernel/random/uuid)" > /www/index.html; touch /www/ok; exec httpd -f -p 80 -h /www`)
		// Removed however the subtest ends, so that a failure here does not
		// leave port 8081 published for the subtests after it.
		defer c.rm("hc")
		var tasks []string
		waitFor(t, 30*time.Second, "2 healthy replicas", func() bool {
			tasks = tasks[:0]
			for _, ts := range c.running("hc") {
				for _, id := range ts {
					if c.taskField(1, id, "health") == "healthy" {
						tasks = append(tasks, id)
					}
				}
			}
			return len(tasks) == 2
		})
		content := map[string]string{} // body -> task
		var victimBody string
		for _, id := range tasks {
			node := c.nodeIndex(c.taskField(1, id, "node"))
			b := c.mustExec(node, id, "cat", "/www/index.html")
			content[b] = id
			if victimBody == "" {
				victimBody = b
			}
		}
		victim := content[victimBody]
		// Both replicas by name, each by its slot's name too, asked
		// from the other replica (its node's DNS).
		other := tasks[0]
		if other == victim {
			other = tasks[1]
		}
		otherNode := c.nodeIndex(c.taskField(1, other, "node"))
		var ips []string
		for _, id := range tasks {
			ip, slot := c.taskField(1, id, "ip"), c.taskField(1, id, "slot")
			ips = append(ips, ip)
			if got := c.lookup(otherNode, other, slot+".hc.shoal"); !slices.Equal(got, []string{ip}) {
				t.Fatalf("%s.hc.shoal resolves to %v, want task %s's %s", slot, got, id, ip)
			}
		}
		slices.Sort(ips)
		if got := c.lookup(otherNode, other, "hc.shoal"); !slices.Equal(got, ips) {
			t.Fatalf("hc.shoal resolves to %v, want %v", got, ips)
		}
		victimIP := c.taskField(1, victim, "ip")
		urls := make([]string, c.Nodes())
		for i := range urls {
			urls[i] = fmt.Sprintf("http://%s:8081/", c.Addr(i+1))
		}
		seen := map[string]bool{}
		waitFor(t, 15*time.Second, "both replicas answer on the published port", func() bool {
			for _, u := range urls {
				if b, err := httpGet(u); err == nil {
					seen[b] = true
				}
			}
			return seen[victimBody] && len(seen) >= 2
		})

		type result struct {
			at   time.Time
			took time.Duration
			url  string
			body string
			err  error
		}
		var mu sync.Mutex
		var results []result
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var stopOnce sync.Once
		// halt stops the clients and waits for them; deferred too, so a
		// failure on the way does not leave them polling.
		halt := func() {
			stopOnce.Do(func() { close(stop) })
			wg.Wait()
		}
		defer halt()
		for _, u := range urls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					at := time.Now()
					b, err := httpGet(u)
					mu.Lock()
					results = append(results, result{at, time.Since(at), u, b, err})
					mu.Unlock()
					time.Sleep(20 * time.Millisecond)
				}
			}()
		}
		victimNode := c.nodeIndex(c.taskField(1, victim, "node"))
		rmAt := time.Now()
		c.mustExec(victimNode, victim, "rm", "/www/ok")
		var unhealthyAt time.Time
		waitFor(t, 15*time.Second, "the replica marked unhealthy", func() bool {
			h, _ := getField(c.statd(1), "/tasks/"+victim, "health")
			st, ok := getField(c.statd(1), "/tasks/"+victim, "state")
			if h == "unhealthy" || (ok && st != "running") {
				unhealthyAt = time.Now()
				return true
			}
			return false
		})
		// It leaves the DNS answer (its replacement, once healthy, joins).
		waitFor(t, 10*time.Second, "the unhealthy replica's address out of hc.shoal", func() bool {
			got := c.lookup(otherNode, other, "hc.shoal")
			return len(got) > 0 && !slices.Contains(got, victimIP)
		})
		// The proxies of other nodes learn of it through state: allow them
		// the second the design promises.
		const grace = time.Second
		// Enough requests after the grace to show none fails: at least 3 s
		// of them, longer (bounded) on a machine slow enough that 3 s
		// holds fewer than 40.
		sent := func() int {
			mu.Lock()
			defer mu.Unlock()
			n := 0
			for _, r := range results {
				if r.at.After(unhealthyAt.Add(grace)) {
					n++
				}
			}
			return n
		}
		time.Sleep(3 * time.Second)
		for end := time.Now().Add(20 * time.Second); sent() < 40 && time.Now().Before(end); {
			time.Sleep(100 * time.Millisecond)
		}
		halt()
		var lastVictim time.Time
		var after, afterErrs int
		var slowest result
		counts, perURL := map[string]int{}, map[string]int{}
		for _, r := range results {
			if r.took > slowest.took {
				slowest = r
			}
			if r.err == nil && r.body == victimBody && r.at.After(lastVictim) {
				lastVictim = r.at
			}
			if r.at.After(unhealthyAt.Add(grace)) {
				after++
				if r.err != nil {
					afterErrs++
					t.Errorf("%s at +%v after unhealthy: %v", r.url, r.at.Sub(unhealthyAt).Round(time.Millisecond), r.err)
				}
				counts[strings.TrimSpace(r.body)]++
				perURL[r.url]++
			}
		}
		t.Logf("unhealthy replica: rm at 0, marked unhealthy at +%v, last served at %+v; %d requests from +%v on: %v, by address %v; slowest %v (%s at +%v)",
			unhealthyAt.Sub(rmAt).Round(time.Millisecond), lastVictim.Sub(rmAt).Round(time.Millisecond), after, grace, counts, perURL,
			slowest.took.Round(time.Millisecond), slowest.url, slowest.at.Sub(rmAt).Round(time.Millisecond))
		if lastVictim.After(unhealthyAt.Add(grace)) {
			t.Fatalf("the unhealthy replica got a new connection %v after it was marked unhealthy", lastVictim.Sub(unhealthyAt))
		}
		if after < 20 || afterErrs > 0 {
			t.Fatalf("after the replica went unhealthy: %d requests, %d failed", after, afterErrs)
		}
	})

	// 3. Restarting netd neither drops a transfer between tasks nor DNS
	// for long.
	c.run(t, "NetdRestartDuringTransfer", func(t *testing.T) {
		c.create("recv", 1, nil, "sh", "-c", "sleep 1000000 | nc -l -p 9000 > /tmp/recv")
		c.create("send", 2, nil, "sleep", "1000000")
		recv, send := c.taskOn("recv", 1), c.taskOn("send", 2)
		recvIP := c.taskField(1, recv, "ip")
		const chunks = 64 // MiB
		sum := strings.Fields(c.mustExec(2, send, "sh", "-c", fmt.Sprintf("dd if=/dev/urandom of=/tmp/data bs=1048576 count=%d 2>/dev/null && md5sum /tmp/data", chunks)))[0]
		// Resolve before the restart: the transfer must not depend on DNS.
		c.mustExec(2, send, "nslookup", "recv.shoal")

		type res struct {
			out, errOut string
			code        int
		}
		// The commands in the background end with the subtest.
		bg, stopBg := context.WithCancel(ctx)
		defer stopBg()
		done := make(chan res, 1)
		sendStart := time.Now()
		go func() {
			out, errOut, code, err := c.Ctl(bg, 2, "task", "exec", send, "--", "sh", "-c",
				fmt.Sprintf("i=0; while [ $i -lt %d ]; do dd if=/tmp/data bs=1048576 skip=$i count=1 2>/dev/null; i=$((i+1)); usleep 100000; done | nc %s 9000", chunks, recvIP))
			if err != nil {
				errOut += err.Error()
			}
			done <- res{out, errOut, code}
		}()
		time.Sleep(2 * time.Second)
		keyBefore := c.status(2).GetPublicKey()
		if err := c.Kill(ctx, 2, "netd"); err != nil {
			t.Fatal(err)
		}
		killedAt := time.Now()
		// DNS of node 2 is down with netd: probe it from the sender's node
		// until it answers with the receiver's address again.
		dnsDone := make(chan time.Time, 1)
		go func() {
			c.Ctl(bg, 2, "task", "exec", send, "--", "sh", "-c", dnsProbe("recv.shoal", recvIP))
			dnsDone <- time.Now()
		}()
		time.Sleep(time.Second)
		restartAt := time.Now()
		if err := c.Start(ctx, 2, "netd"); err != nil {
			t.Fatal(err)
		}
		readyAt := time.Now()
		select {
		case r := <-done:
			t.Fatalf("the transfer ended before netd was back (%v after it started): exit %d %s%s", time.Since(sendStart), r.code, r.out, r.errOut)
		default:
		}
		var dnsAt time.Time
		select {
		case dnsAt = <-dnsDone:
		case <-time.After(30 * time.Second):
			t.Fatal("node 2's DNS did not answer within 30s of netd's restart")
		}
		dnsDelay := dnsAt.Sub(restartAt)
		t.Logf("netd on node 2 killed at +%v of the transfer, down %v, ready %v after start; DNS answered %v after the restart",
			killedAt.Sub(sendStart).Round(time.Millisecond), restartAt.Sub(killedAt).Round(time.Millisecond),
			readyAt.Sub(restartAt).Round(time.Millisecond), dnsDelay.Round(time.Millisecond))
		if dnsDelay > 5*time.Second {
			t.Errorf("DNS answered %v after netd's restart", dnsDelay)
		}
		var r res
		select {
		case r = <-done:
		case <-time.After(90 * time.Second):
			t.Fatal("the transfer did not finish within 90s")
		}
		if r.code != 0 {
			t.Fatalf("sender: exit %d %s%s", r.code, r.out, r.errOut)
		}
		t.Logf("transfer of %d MiB took %v", chunks, time.Since(sendStart).Round(time.Millisecond))
		got := strings.Fields(c.mustExec(1, recv, "sh", "-c", "wc -c < /tmp/recv; md5sum /tmp/recv"))
		if len(got) < 2 || got[0] != fmt.Sprint(chunks<<20) || got[1] != sum {
			t.Fatalf("receiver has %v, want %d bytes with md5 %s", got, chunks<<20, sum)
		}
		if k := c.status(2).GetPublicKey(); k != keyBefore {
			t.Fatalf("node 2's key changed across a netd restart: %s -> %s", keyBefore, k)
		}
		c.rm("recv", "send")
	})

	// 6. Bad input: clear errors, nothing half-applied.
	c.run(t, "BadInput", func(t *testing.T) {
		n := newNode(t)
		n.start("statd")
		for _, cidr := range []string{"10.42.0.0/33", "nonsense"} {
			_, errOut, code := n.ctl("cluster", "init", "--advertise", "127.0.0.1", "--overlay-cidr", cidr)
			t.Logf("cluster init --overlay-cidr %s: exit %d: %s", cidr, code, strings.TrimSpace(errOut))
			if code != 2 || !strings.Contains(errOut, "overlay CIDR") || !strings.Contains(errOut, cidr) {
				t.Errorf("cluster init --overlay-cidr %s: exit %d %q, want exit 2 naming the CIDR", cidr, code, errOut)
			}
			out := n.mustCtl("cluster", "status", "-o", "json")
			if !strings.Contains(out, `"initialized": false`) {
				t.Fatalf("after a rejected init the node is in a cluster:\n%s", out)
			}
		}

		c.create("p1", 1, []string{"--publish", "8090:80"}, "sh", "-c", "echo p1 > /www/index.html; exec httpd -f -p 80 -h /www")
		url := fmt.Sprintf("http://%s:8090/", c.Addr(2))
		waitFor(t, 15*time.Second, url+" answers p1", func() bool {
			b, _ := httpGet(url)
			return strings.TrimSpace(b) == "p1"
		})
		_, errOut, code := c.ctl(2, "service", "create", "p2", "--image", "local/busybox:latest", "--publish", "8090:80",
			"--", "sh", "-c", "echo p2 > /www/index.html; exec httpd -f -p 80 -h /www")
		t.Logf("second service on port 8090: exit %d: %s", code, strings.TrimSpace(errOut))
		if code == 0 || !strings.Contains(errOut, "8090") || !strings.Contains(errOut, "already published by service p1") {
			t.Errorf("second service on published port 8090: exit %d %q", code, errOut)
		}
		_, errOut, code = c.ctl(1, "service", "create", "p3", "--image", "local/busybox:latest", "--publish", "70000:80", "--", "sleep", "1000000")
		t.Logf("--publish 70000:80: exit %d: %s", code, strings.TrimSpace(errOut))
		if code != 2 || !strings.Contains(errOut, "70000") || !strings.Contains(errOut, "1-65535") {
			t.Errorf("--publish 70000:80: exit %d %q, want exit 2 naming the range", code, errOut)
		}
		for _, s := range []string{"p2", "p3"} {
			if _, _, code := c.ctl(3, "service", "inspect", s); code != 3 {
				t.Errorf("rejected service %s exists (inspect exit %d)", s, code)
			}
			if ts := c.running(s); len(ts) != 0 {
				t.Errorf("rejected service %s has tasks %v", s, ts)
			}
		}
		for i := 1; i <= c.Nodes(); i++ {
			st := c.status(i)
			var n8090 int
			for _, p := range st.GetPublished() {
				if p.GetPort() == 8090 {
					n8090++
					if p.GetProtocol() != "tcp" || p.GetService() != "p1" || len(p.GetBackends()) != 1 || len(p.GetConflicting()) != 0 {
						t.Errorf("node %d publishes %v", i, p)
					}
				}
				if p.GetPort() == 70000 {
					t.Errorf("node %d publishes %v", i, p)
				}
			}
			if n8090 != 1 {
				t.Errorf("node %d publishes %v", i, st.GetPublished())
			}
			var v struct {
				Published []struct {
					Port        int      `json:"port"`
					Protocol    string   `json:"protocol"`
					Service     string   `json:"service"`
					Backends    []string `json:"backends"`
					Conflicting []string `json:"conflicting"`
				} `json:"published"`
			}
			out := c.mustCtl(i, "network", "inspect", "-o", "json")
			if err := json.Unmarshal([]byte(out), &v); err != nil || len(v.Published) != 1 || v.Published[0].Port != 8090 || v.Published[0].Protocol != "tcp" ||
				v.Published[0].Service != "p1" || len(v.Published[0].Backends) != 1 || v.Published[0].Conflicting == nil || len(v.Published[0].Conflicting) != 0 {
				t.Errorf("node %d: network inspect -o json: %v\n%s", i, err, out)
			}
			b, err := httpGet(fmt.Sprintf("http://%s:8090/", c.Addr(i)))
			if err != nil || strings.TrimSpace(b) != "p1" {
				t.Errorf("node %d port 8090 after the rejected service: %q %v", i, b, err)
			}
		}

		// The race schedd's check cannot see: a service publishing 8090
		// written on node 3 as if node 3 had not yet heard of p1 (its
		// check passed). Every node resolves it alike: p1, the older,
		// keeps the port; p4 is reported as conflicting.
		spec := sched.ServiceSpec{Name: "p4", Image: "local/busybox:latest", Replicas: 1, Args: []string{"sleep", "1000000"},
			Ports: []sched.Port{{Host: 8090, Container: 80}}, StopGrace: sched.Duration(time.Second)}.WithDefaults()
		fields := map[string]*statev1.Value{}
		for k, v := range sched.ServiceFields(sched.Service{Name: "p4", Spec: spec, Version: 1, State: sched.ServiceActive, Updated: time.Now()}) {
			fields[k] = statepb.ToValue(v)
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := c.statd(3).Put(cctx, &statev1.PutRequest{Key: sched.ServiceKey("p4"), Fields: fields})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		racedAt := time.Now()
		waitFor(t, 15*time.Second, "every node: 8090 held by p1, p4 conflicting", func() bool {
			for i := 1; i <= c.Nodes(); i++ {
				st, err := c.tryStatus(i)
				if err != nil {
					return false
				}
				held := false
				for _, p := range st.GetPublished() {
					if p.GetPort() == 8090 {
						held = p.GetService() == "p1" && slices.Equal(p.GetConflicting(), []string{"p4"})
					}
				}
				if !held {
					return false
				}
			}
			return true
		})
		t.Logf("raced service p4: every node has p1 holding 8090 and p4 conflicting %v after the write", time.Since(racedAt).Round(time.Millisecond))
		for i := 1; i <= c.Nodes(); i++ {
			if b, err := httpGet(fmt.Sprintf("http://%s:8090/", c.Addr(i))); err != nil || strings.TrimSpace(b) != "p1" {
				t.Errorf("node %d port 8090 with p4 conflicting: %q %v", i, b, err)
			}
		}
		c.rm("p1", "p4")
	})

	// 4a. A restarted node keeps its key and subnet, and its tasks are
	// reachable through the mesh again.
	c.run(t, "NodeRestartKeepsIdentity", func(t *testing.T) {
		c.create("far", 3, nil, "httpd", "-f", "-p", "80", "-h", "/www")
		c.create("near", 1, nil, "sleep", "1000000")
		near := c.taskOn("near", 1)
		c.taskOn("far", 3)
		c.reach(t, 15*time.Second, 1, near, "far")
		before := c.status(3)
		if err := c.Kill(ctx, 3, ""); err != nil {
			t.Fatal(err)
		}
		restartAt := time.Now()
		if err := c.Start(ctx, 3, ""); err != nil {
			t.Fatal(err)
		}
		var after *netv1.StatusResponse
		waitFor(t, 30*time.Second, "node 3's netd ready", func() bool {
			st, err := c.tryStatus(3)
			after = st
			return err == nil
		})
		if after.GetPublicKey() != before.GetPublicKey() || after.GetSubnet() != before.GetSubnet() {
			t.Fatalf("node 3 restarted as key %s subnet %s, was key %s subnet %s",
				after.GetPublicKey(), after.GetSubnet(), before.GetPublicKey(), before.GetSubnet())
		}
		reach := c.reach(t, 30*time.Second, 1, near, "far")
		p := peerOf(c.status(1), c.ids[2])
		if p.GetLastHandshake() == nil || p.GetLastHandshake().AsTime().Before(restartAt.Add(-time.Second)) {
			t.Fatalf("node 1's peer node 3 has no handshake since the restart: %v", p)
		}
		t.Logf("node 3 restarted with key and subnet %s kept; its task reachable by name %v after the restart",
			after.GetSubnet(), reach.Sub(restartAt).Round(time.Millisecond))
		// schedd restarts the task within about a second; the rest is the
		// mesh (a stale session on node 1 used to cost ~15 s).
		if d := reach.Sub(restartAt); d > 10*time.Second {
			t.Fatalf("node 3's task reachable only %v after the node restarted", d)
		}
		c.rm("far", "near")
	})

	// 4b. A brand-new node is reachable from every other node within
	// seconds of joining.
	c.run(t, "NewNodeReachable", func(t *testing.T) {
		const i = 4
		old := c.status(i)
		if err := c.Kill(ctx, i, ""); err != nil {
			t.Fatal(err)
		}
		for _, d := range []string{"statd", "schedd", "netd"} {
			if err := os.RemoveAll(c.StateDir(i, d)); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Start(ctx, i, ""); err != nil {
			t.Fatal(err)
		}
		token := strings.TrimSpace(c.mustCtl(1, "cluster", "token"))
		if f := strings.Fields(token); len(f) > 0 {
			token = f[len(f)-1]
		}
		joinStart := time.Now()
		c.mustCtl(i, "cluster", "join", "--token", token, c.Addr(1))
		joined := time.Now()
		newID := clusterStatus(t, c.statd(i)).GetNodeId()
		if newID == "" || newID == c.ids[i-1] {
			t.Fatalf("node 4 rejoined as %q, was %q", newID, c.ids[i-1])
		}
		// Its subnet, as the other nodes learn it from state.
		var gw netip.Addr
		waitFor(t, 30*time.Second, "node 4's subnet in state", func() bool {
			s, _ := getField(c.statd(1), "/nodes/"+newID, "subnet")
			p, err := netip.ParsePrefix(s)
			if err != nil {
				return false
			}
			gw = p.Addr().Next()
			return true
		})
		subnetAt := time.Now()
		reached := make([]time.Duration, 3)
		var wg sync.WaitGroup
		errs := make(chan error, 3)
		for k := 1; k <= 3; k++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				defer cancel()
				cmd, err := c.Command(pctx, k, "busybox", "ping", "-i", "0.05", "-W", "1", "-c", "600", gw.String())
				if err != nil {
					errs <- err
					return
				}
				out, _ := cmd.StdoutPipe()
				if err := c.StartIn(k, cmd); err != nil {
					errs <- err
					return
				}
				sc := bufio.NewScanner(out)
				for sc.Scan() {
					if strings.Contains(sc.Text(), "bytes from") {
						reached[k-1] = time.Since(joined)
						break
					}
				}
				cancel()
				io.Copy(io.Discard, out)
				cmd.Wait()
				if reached[k-1] == 0 {
					errs <- fmt.Errorf("node %d never reached %s", k, gw)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if t.Failed() {
			return
		}
		worst := slices.Max(reached)
		t.Logf("new node 4 (%s, subnet gateway %s): join took %v; subnet in state %v after join; reachable from nodes 1-3 after %v (worst %v)",
			newID, gw, joined.Sub(joinStart).Round(time.Millisecond), subnetAt.Sub(joined).Round(time.Millisecond), reached, worst)
		if worst > 5*time.Second {
			t.Fatalf("new node reachable from every node only %v after joining", worst)
		}
		c.ids[i-1] = newID
		st := c.status(i)
		c.noteIface(st.GetInterface())
		if st.GetPublicKey() == old.GetPublicKey() || st.GetSubnet() != gw.Prev().String()+"/24" {
			t.Fatalf("wiped node 4 has key %s subnet %s (was %s %s; state says gateway %s)",
				st.GetPublicKey(), st.GetSubnet(), old.GetPublicKey(), old.GetSubnet(), gw)
		}
	})

	// 5. Two nodes claiming one subnet end with distinct subnets and
	// working routes.
	c.run(t, "SubnetConflict", func(t *testing.T) {
		// claim writes node's claim on subnet through node via's statd.
		claim := func(via int, subnet, node string) {
			t.Helper()
			key := "/network/subnets/" + overlay.SubnetKey(netip.MustParsePrefix(subnet))
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if _, err := c.statd(via).Put(cctx, &statev1.PutRequest{Key: key, Fields: map[string]*statev1.Value{"node": str(node)}}); err != nil {
				t.Fatal(err)
			}
		}
		// settled waits until nodes 2 and 3 hold distinct subnets, node 2
		// another than was2, and every node agrees on both claims and both
		// peers' subnets.
		settled := func(was2 string) (n2, n3 string) {
			t.Helper()
			waitFor(t, 30*time.Second, "nodes 2 and 3 on distinct subnets, node 2 renumbered, every node agreeing", func() bool {
				st2, err2 := c.tryStatus(2)
				st3, err3 := c.tryStatus(3)
				if err2 != nil || err3 != nil {
					return false
				}
				n2, n3 = st2.GetSubnet(), st3.GetSubnet()
				if n2 == n3 || n2 == was2 {
					return false
				}
				want := map[int]string{2: n2, 3: n3}
				for i := 1; i <= c.Nodes(); i++ {
					st, err := c.tryStatus(i)
					if err != nil {
						return false
					}
					owner := map[string]string{}
					for _, s := range st.GetSubnets() {
						owner[s.GetSubnet()] = s.GetNode()
					}
					if owner[n2] != c.ids[1] || owner[n3] != c.ids[2] {
						return false
					}
					for _, k := range []int{2, 3} {
						if p := peerOf(st, c.ids[k-1]); i != k && (p == nil || p.GetSubnet() != want[k]) {
							return false
						}
					}
				}
				return true
			})
			return n2, n3
		}
		// routes checks that new tasks on nodes 2 and 3 get addresses of
		// their node's subnet and reach each other by name.
		routes := func(a, b, n2, n3 string) {
			t.Helper()
			c.create(a, 2, nil, "httpd", "-f", "-p", "80", "-h", "/www")
			c.create(b, 3, nil, "httpd", "-f", "-p", "80", "-h", "/www")
			ta, tb := c.taskOn(a, 2), c.taskOn(b, 3)
			for _, x := range []struct {
				id, subnet string
			}{{ta, n2}, {tb, n3}} {
				ip, err := netip.ParseAddr(c.taskField(1, x.id, "ip"))
				if err != nil || !netip.MustParsePrefix(x.subnet).Contains(ip) {
					t.Errorf("task %s has address %v outside its node's subnet %s", x.id, ip, x.subnet)
				}
			}
			for _, tc := range []struct {
				node       int
				task, name string
			}{{2, ta, b}, {3, tb, a}} {
				c.reach(t, 15*time.Second, tc.node, tc.task, tc.name)
			}
			c.rm(a, b)
		}

		// Forced: node 3 is written as the owner of node 2's subnet (through
		// node 2's statd, so node 2 sees it before node 3 gives it back).
		s2, s3 := c.status(2).GetSubnet(), c.status(3).GetSubnet()
		forcedAt := time.Now()
		claim(2, s2, c.ids[2])
		n2, n3 := settled(s2)
		t.Logf("forced node 2's subnet %s to node 3 (on %s): node 2 renumbered to %s, node 3 on %s, %v later",
			s2, s3, n2, n3, time.Since(forcedAt).Round(time.Millisecond))
		routes("sa", "sb", n2, n3)

		// Real: node 3 comes back claiming node 2's subnet as its own (its
		// persisted claim says so, and so does state, last writer). Node 2
		// must give it up entirely: node 3's new tasks get addresses in it.
		if err := c.Kill(ctx, 3, "netd"); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(c.StateDir(3, "netd"), "subnet"), []byte(n2+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		claim(3, n2, c.ids[2])
		if err := c.Start(ctx, 3, "netd"); err != nil {
			t.Fatal(err)
		}
		took := n2
		n2, n3 = settled(took)
		if n3 != took {
			t.Fatalf("node 3 is on %s, not on the subnet %s it claimed", n3, took)
		}
		t.Logf("node 3 took node 2's subnet %s: node 2 renumbered to %s", took, n2)
		routes("sc", "sd", n2, n3)
	})
}
