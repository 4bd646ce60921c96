package devcluster

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// binDir holds the binaries under test: $SHOAL_BIN_DIR, or built once by
// TestMain when the tests can run (as root).
var binDir string

// The test binary doubles as a helper run inside node namespaces: with
// helperEnv=dial it connects to helperAddrEnv and prints its local address
// and the peer's greeting.
const (
	helperEnv     = "DEVCLUSTER_TEST_HELPER"
	helperAddrEnv = "DEVCLUSTER_TEST_ADDR"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "dial" {
		os.Exit(helperDial(os.Getenv(helperAddrEnv)))
	}
	binDir = os.Getenv("SHOAL_BIN_DIR")
	cleanup := func() {}
	if binDir == "" && os.Geteuid() == 0 {
		dir, err := os.MkdirTemp("", "shoal-devcluster-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		cleanup = func() { os.RemoveAll(dir) }
		if err := buildBinaries(dir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			cleanup()
			os.Exit(1)
		}
		binDir = dir
	}
	code := m.Run()
	cleanup()
	os.Exit(code)
}

func buildBinaries(dir string) error {
	var wg sync.WaitGroup
	daemons := []string{"statd", "schedd", "netd", "vold", "logger", "ctl"}
	errs := make([]error, len(daemons))
	for k, d := range daemons {
		wg.Go(func() {
			out := filepath.Join(dir, "shoal-"+d)
			if d == "ctl" {
				out = filepath.Join(dir, "shoalctl")
			}
			cmd := exec.Command("go", "build", "-o", out, "github.com/shoal-dev/shoal/cmd/"+d)
			if d == "vold" {
				cmd.Env = append(os.Environ(), "CGO_ENABLED=0") // as the Makefile builds it
			}
			if b, err := cmd.CombinedOutput(); err != nil {
				errs[k] = fmt.Errorf("build %s: %v\n%s", d, err, b)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func helperDial(addr string) int {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("%s %s", conn.LocalAddr(), line)
	return 0
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces, bridges, veths")
	}
}

// uniqueName returns a cluster name no other test run uses.
func uniqueName(t *testing.T) string {
	b := make([]byte, 3)
	rand.Read(b)
	return "t" + hex.EncodeToString(b)
}

func testSpec(t *testing.T, nodes int) Spec {
	return Spec{
		Name:         uniqueName(t),
		Nodes:        nodes,
		Subnet:       AutoSubnet,
		BinDir:       binDir,
		Daemons:      []string{"statd"},
		StartTimeout: 15 * time.Second,
		Logf:         t.Logf,
	}
}

// up brings a cluster up and downs it when the test ends.
func up(t *testing.T, ctx context.Context, spec Spec) *Cluster {
	t.Helper()
	c, err := Up(ctx, spec)
	if err != nil {
		t.Fatalf("Up: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Down(context.Background()); err != nil {
			t.Errorf("Down: %v", err)
		}
	})
	return c
}

// listen serves a greeting naming node i on its address, port 7000, from
// inside its namespace.
func listen(t *testing.T, c *Cluster, i int) string {
	t.Helper()
	addr := net.JoinHostPort(c.Addr(i), "7000")
	var l net.Listener
	err := c.InNetns(i, func() (err error) {
		l, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		t.Fatalf("listen on node %d: %v", i, err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(conn, "hello from node %d\n", i)
			conn.Close()
		}
	}()
	return addr
}

// dialFrom connects from node i (0: the host) to addr and reports whether
// the greeting came back.
func dialFrom(c *Cluster, i int, addr string) bool {
	dial := func() error {
		conn, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
		if err != nil {
			return err
		}
		defer conn.Close()
		// The socket must belong to the dialling node.
		if local := conn.LocalAddr().(*net.TCPAddr).IP.String(); i > 0 && local != c.Addr(i) {
			return fmt.Errorf("dialled from %s, not from node %d", local, i)
		}
		conn.SetDeadline(time.Now().Add(time.Second))
		_, err = bufio.NewReader(conn).ReadString('\n')
		return err
	}
	if i == 0 {
		return dial() == nil
	}
	return c.InNetns(i, dial) == nil
}

func mustCtl(t *testing.T, ctx context.Context, c *Cluster, i int, args ...string) string {
	t.Helper()
	out, errOut, code, err := c.Ctl(ctx, i, args...)
	if err != nil || code != 0 {
		t.Fatalf("node %d: shoalctl %s: exit %d, %v\n%s%s", i, strings.Join(args, " "), code, err, out, errOut)
	}
	return out
}

func TestCluster(t *testing.T) {
	needRoot(t)
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	spec := testSpec(t, 3)
	c := up(t, ctx, spec)

	// A second cluster of the same name is refused and harms nothing.
	if _, err := Up(ctx, spec); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("second Up of %s: got %v, want already exists", spec.Name, err)
	}

	// Load finds the same cluster.
	l, err := Load(spec.Name)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	for i := 1; i <= 3; i++ {
		if l.Addr(i) != c.Addr(i) || l.RunDir(i) != c.RunDir(i) || l.LogPath(i, "statd") != c.LogPath(i, "statd") {
			t.Fatalf("Load: node %d differs: %s %s vs %s %s", i, l.Addr(i), l.RunDir(i), c.Addr(i), c.RunDir(i))
		}
	}
	if !strings.HasPrefix(c.Addr(1), strings.TrimSuffix(c.Subnet().Masked().Addr().String(), "0")) || c.Addr(2) == c.Addr(1) {
		t.Fatalf("addresses %s %s not in %s", c.Addr(1), c.Addr(2), c.Subnet())
	}

	// Every node's statd serves its own node; without bootstrap the nodes
	// share nothing.
	for i := 1; i <= 3; i++ {
		key := fmt.Sprintf("/n%d/hello", i)
		mustCtl(t, ctx, c, i, "state", "put", key, fmt.Sprintf("msg=node%d", i))
		if out := mustCtl(t, ctx, c, i, "state", "get", key, "-o", "json"); !strings.Contains(out, fmt.Sprintf("node%d", i)) {
			t.Fatalf("node %d: get %s: %s", i, key, out)
		}
	}
	if _, _, code, err := c.Ctl(ctx, 2, "state", "get", "/n1/hello"); err != nil || code != 3 {
		t.Fatalf("node 2: get /n1/hello: exit %d, %v; want 3 (not found)", code, err)
	}

	st, err := c.Status(ctx)
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	if len(st.Nodes) != 3 {
		t.Fatalf("Status: %d nodes", len(st.Nodes))
	}
	for _, n := range st.Nodes {
		if !n.NetnsUp || len(n.Processes) != 1 || !n.Processes[0].Running || !n.Processes[0].Ready || n.Processes[0].PID <= 0 {
			t.Fatalf("Status: node %d: %+v", n.Node, n)
		}
	}

	// Exec runs in the node's namespace and passes the exit code through.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	addrs := map[int]string{}
	for i := 1; i <= 3; i++ {
		addrs[i] = listen(t, c, i)
	}
	out, errOut, code, err := c.Exec(ctx, 1, []string{self}, []string{helperEnv + "=dial", helperAddrEnv + "=" + addrs[3]})
	if err != nil || code != 0 || !strings.HasPrefix(out, c.Addr(1)+":") || !strings.Contains(out, "hello from node 3") {
		t.Fatalf("dial node 3 from node 1: exit %d, %v: %q %q", code, err, out, errOut)
	}
	if _, _, code, err := c.Exec(ctx, 2, []string{"sh", "-c", "exit 7"}, nil); err != nil || code != 7 {
		t.Fatalf("exit 7 on node 2: got %d, %v", code, err)
	}
	if out, _, _, _ := c.Exec(ctx, 2, []string{"sh", "-c", "echo $SHOAL_RUN_DIR"}, nil); strings.TrimSpace(out) != c.RunDir(2) {
		t.Fatalf("SHOAL_RUN_DIR on node 2: %q, want %s", out, c.RunDir(2))
	}
	for _, p := range [][2]int{{3, 1}, {2, 3}, {0, 1}, {0, 3}} {
		if !dialFrom(c, p[0], addrs[p[1]]) {
			t.Fatalf("node %d cannot reach node %d", p[0], p[1])
		}
	}

	// Partition: 1 alone, 2 and 3 together; the host reaches everyone.
	groups := [][]int{{1}, {2, 3}}
	if err := c.Partition(ctx, groups); err != nil {
		t.Fatalf("Partition: %v", err)
	}
	for _, p := range [][2]int{{1, 3}, {3, 1}, {1, 2}, {2, 1}} {
		if dialFrom(c, p[0], addrs[p[1]]) {
			t.Fatalf("partitioned: node %d still reaches node %d", p[0], p[1])
		}
	}
	if _, _, code, _ := c.Exec(ctx, 1, []string{self}, []string{helperEnv + "=dial", helperAddrEnv + "=" + addrs[3]}); code == 0 {
		t.Fatalf("partitioned: a process on node 1 still reaches node 3")
	}
	for _, p := range [][2]int{{2, 3}, {3, 2}, {0, 1}, {0, 2}} {
		if !dialFrom(c, p[0], addrs[p[1]]) {
			t.Fatalf("partitioned: node %d cannot reach node %d", p[0], p[1])
		}
	}
	if st, _ := c.Status(ctx); !reflect.DeepEqual(st.Partition, groups) {
		t.Fatalf("Status.Partition = %v, want %v", st.Partition, groups)
	}
	if err := c.Partition(ctx, [][]int{{1, 2}, {2}}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("Partition with node 2 twice: %v", err)
	}
	if err := c.Heal(ctx); err != nil {
		t.Fatalf("Heal: %v", err)
	}
	for _, p := range [][2]int{{1, 3}, {3, 1}, {1, 2}, {2, 3}} {
		if !dialFrom(c, p[0], addrs[p[1]]) {
			t.Fatalf("healed: node %d cannot reach node %d", p[0], p[1])
		}
	}
	if st, _ := c.Status(ctx); st.Partition != nil {
		t.Fatalf("healed: Status.Partition = %v", st.Partition)
	}

	// A node added to the running cluster gets its own namespace,
	// address and daemons, reaches the others, and is recorded for Load.
	if i, err := c.AddNode(ctx); err != nil || i != 4 {
		t.Fatalf("AddNode: node %d, %v; want node 4", i, err)
	}
	if c.Nodes() != 4 || c.Addr(4) == c.Addr(3) {
		t.Fatalf("after AddNode: %d nodes, node 4 at %s", c.Nodes(), c.Addr(4))
	}
	mustCtl(t, ctx, c, 4, "state", "put", "/n4/hello", "msg=node4")
	addrs[4] = listen(t, c, 4)
	for _, p := range [][2]int{{4, 1}, {1, 4}, {0, 4}} {
		if !dialFrom(c, p[0], addrs[p[1]]) {
			t.Fatalf("added node: node %d cannot reach node %d", p[0], p[1])
		}
	}
	if l4, err := Load(spec.Name); err != nil || l4.Nodes() != 4 || l4.Addr(4) != c.Addr(4) {
		t.Fatalf("Load after AddNode: %v, %v", l4, err)
	}
	if st, err = c.Status(ctx); err != nil || len(st.Nodes) != 4 || !st.Nodes[3].Processes[0].Ready {
		t.Fatalf("Status after AddNode: %+v, %v", st.Nodes, err)
	}

	// Kill and Start one daemon; its state survives.
	pid := st.Nodes[1].Processes[0].PID
	if err := c.Kill(ctx, 2, "statd"); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if alive(pid, 0) {
		t.Fatalf("statd (pid %d) of node 2 survived Kill", pid)
	}
	if st, _ := c.Status(ctx); st.Nodes[1].Processes[0].Running || !st.Nodes[0].Processes[0].Running {
		t.Fatalf("after Kill: %+v", st.Nodes)
	}
	if err := c.Kill(ctx, 2, "nosuchd"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("Kill of an unknown daemon: %v", err)
	}
	if err := c.Kill(ctx, 5, ""); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("Kill on node 5 of 4: %v", err)
	}
	if err := c.Start(ctx, 2, "statd"); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if out := mustCtl(t, ctx, c, 2, "state", "get", "/n2/hello"); !strings.Contains(out, "node2") {
		t.Fatalf("node 2 lost its state across a restart: %s", out)
	}

	// A process of our own in a namespace is killed too.
	sleeper, err := c.Command(context.Background(), 3, "sleep", "300")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.StartIn(3, sleeper); err != nil {
		t.Fatalf("StartIn: %v", err)
	}
	go sleeper.Wait()

	pids := []int{sleeper.Process.Pid}

	// So is one in a namespace pinned under the cluster's dirs (as netd
	// might pin a task's), and the pin is unmounted.
	if _, err := exec.LookPath("unshare"); err == nil {
		pin := filepath.Join(c.RunDir(3), "task-netns")
		if err := os.WriteFile(pin, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		u := exec.Command("unshare", "--net="+pin, "sleep", "300")
		if err := u.Start(); err != nil {
			t.Fatal(err)
		}
		go u.Wait()
		pids = append(pids, u.Process.Pid)
		for deadline := time.Now().Add(5 * time.Second); ; {
			if m, _ := mountsOfType("nsfs", pin); len(m) == 1 {
				if ns, _ := nsPids(pin); len(ns) == 1 {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("unshare did not pin a namespace at %s", pin)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	st, _ = c.Status(ctx)
	for _, n := range st.Nodes {
		pids = append(pids, n.Processes[0].PID)
	}
	if err := l.Down(ctx); err != nil { // the loaded copy downs it as well
		t.Fatalf("Down: %v", err)
	}
	checkGone(t, c, pids)
	if err := c.Down(ctx); err != nil {
		t.Fatalf("second Down: %v", err)
	}
}

// checkGone fails unless nothing of c is left: processes, namespaces,
// links, directories.
func checkGone(t *testing.T, c *Cluster, pids []int) {
	t.Helper()
	for _, what := range c.Leftovers(pids...) {
		t.Errorf("%s survived Down", what)
	}
}

func TestUpFailure(t *testing.T) {
	needRoot(t)
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()

	// A daemon that cannot start: Up cleans up after itself, and says why.
	spec := testSpec(t, 2)
	spec.Args = map[string][]string{"statd": {"--no-such-flag"}}
	c, err := Up(ctx, spec)
	if err == nil || c != nil || !strings.Contains(err.Error(), "no-such-flag") {
		t.Fatalf("Up with a bad flag: %v, %v; want an error quoting the log", c, err)
	}
	t.Logf("Up with a bad flag: %v", err)
	checkGone(t, &Cluster{spec: mustDefaults(t, spec), rec: record{Bridge: bridgeName(spec.Name)}}, nil)

	// With KeepOnFailure the wreck stays until Down, which works on it.
	spec = testSpec(t, 2)
	spec.Args = map[string][]string{"statd": {"--no-such-flag"}}
	spec.KeepOnFailure = true
	c, err = Up(ctx, spec)
	if err == nil || c == nil {
		t.Fatalf("Up with a bad flag and KeepOnFailure: %v, %v", c, err)
	}
	t.Cleanup(func() { c.Down(context.Background()) })
	if !netnsExists(c.Netns(2)) || !linkExists(bridgeName(spec.Name)) {
		t.Fatalf("KeepOnFailure: the half-made cluster is gone")
	}
	if _, err := os.Stat(c.LogPath(1, "statd")); err != nil {
		t.Fatalf("KeepOnFailure: no log: %v", err)
	}
	l, err := Load(spec.Name)
	if err != nil {
		t.Fatalf("Load of a failed cluster: %v", err)
	}
	if err := l.Down(ctx); err != nil {
		t.Fatalf("Down of a failed cluster: %v", err)
	}
	checkGone(t, c, nil)

	// Bad specs fail before touching anything.
	for _, bad := range []Spec{
		{Name: "Bad_Name", BinDir: binDir},
		{Name: "waytoolongname", BinDir: binDir},
		{Name: "x", Subnet: "10.1.2.0/30", BinDir: binDir},
		{Name: "x", Nodes: 300, BinDir: binDir},
		{Name: "x", BinDir: "/nonexistent"},
		{Name: "x", BinDir: binDir, Args: map[string][]string{"nosuchd": {"-v"}}},
	} {
		if _, err := Up(ctx, bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Up(%+v): %v, want invalid argument", bad, err)
		}
	}
}

func mustDefaults(t *testing.T, s Spec) Spec {
	t.Helper()
	s, err := s.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestNames(t *testing.T) {
	for _, name := range []string{"dev", "a", "abcdefghij", "t-1"} {
		if err := ValidName(name); err != nil {
			t.Errorf("ValidName(%q): %v", name, err)
		}
		if br := bridgeName(name); len(br) > 15 {
			t.Errorf("bridge %s too long", br)
		}
	}
	for _, name := range []string{"", "-a", "a-", "A", "abcdefghijk", "a_b", "a.b", "../x"} {
		if ValidName(name) == nil {
			t.Errorf("ValidName(%q) accepted", name)
		}
	}
	seen := map[string]string{}
	for _, name := range []string{"dev", "abcdefghij", "abcdefghik", "abcdefghi"} {
		for i := 1; i <= 244; i++ {
			v := vethName(name, i)
			if len(v) > 15 {
				t.Fatalf("vethName(%s, %d) = %s: longer than 15", name, i, v)
			}
			if other, dup := seen[v]; dup {
				t.Fatalf("vethName(%s, %d) = %s, also %s", name, i, v, other)
			}
			seen[v] = fmt.Sprintf("%s/%d", name, i)
		}
	}
	if v := vethName("dev", 2); v != "shdev-2" {
		t.Errorf("vethName(dev, 2) = %s", v)
	}
}

func TestSubnets(t *testing.T) {
	p, err := parseSubnet("10.99.0.7/24")
	if err != nil || p.String() != "10.99.0.0/24" {
		t.Fatalf("parseSubnet: %v %v", p, err)
	}
	if got := hostAddr(p, 11).String(); got != "10.99.0.11" {
		t.Errorf("hostAddr = %s", got)
	}
	if got := hostAddr(mustPrefix(t, "10.98.0.0/16"), 300).String(); got != "10.98.1.44" {
		t.Errorf("hostAddr across a byte = %s", got)
	}
	if n := maxNodes(p); n != 244 {
		t.Errorf("maxNodes(/24) = %d", n)
	}
	for _, bad := range []string{"fd00::/64", "10.0.0.0/30", "nonsense"} {
		if _, err := parseSubnet(bad); err == nil {
			t.Errorf("parseSubnet(%s) accepted", bad)
		}
	}
	used := map[netip.Prefix]string{
		mustPrefix(t, "10.99.0.0/24"): "address on shbr-dev",
		mustPrefix(t, "10.99.1.5/32"): "route via eth0",
		mustPrefix(t, "127.0.0.0/8"):  "address on lo",
	}
	got, err := pickSubnet(used)
	if err != nil || got.String() != "10.99.2.0/24" {
		t.Errorf("pickSubnet = %v, %v; want 10.99.2.0/24", got, err)
	}
	if subnetConflict(used, mustPrefix(t, "10.99.0.0/16")) == "" {
		t.Errorf("10.99.0.0/16 should conflict")
	}
}

// TestMountsUnder: a mount whose path mountinfo escapes (a space) is
// found under its parent and detached.
func TestMountsUnder(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	root := t.TempDir()
	dir := filepath.Join(root, "a b")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	got, err := mountsOfType("tmpfs", root)
	if err != nil || len(got) != 1 || got[0] != dir {
		t.Fatalf("mountsOfType(tmpfs, %s) = %q, %v", root, got, err)
	}
	if got, _ := mountsOfType("ext4", root); len(got) != 0 {
		t.Fatalf("mountsOfType(ext4) = %q", got)
	}
	if err := unmountUnder(root); err != nil {
		t.Fatal(err)
	}
	if got, _ := mountsUnder(root); len(got) != 0 {
		t.Fatalf("after unmountUnder: %q", got)
	}
}

func mustPrefix(t *testing.T, s string) netip.Prefix {
	t.Helper()
	p, err := netip.ParsePrefix(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestProcDefs(t *testing.T) {
	spec, err := Spec{
		Name:    "dev",
		Nodes:   2,
		BinDir:  "/opt/shoal/bin",
		Daemons: []string{"statd", "extrad"},
		Args:    map[string][]string{"statd": {"--advertise-addr", "{addr}", "--seed", "{seed}:7470"}},
		Extra: []ProcessSpec{{
			Name:        "containerd",
			Path:        "/usr/bin/containerd",
			Args:        []string{"--root", "{statedir}", "--address", "{rundir}/containerd.sock"},
			ReadySocket: "{rundir}/containerd.sock",
		}},
	}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{spec: spec, prefix: mustPrefix(t, spec.Subnet)}
	defs := c.procDefs(2)
	if len(defs) != 3 || defs[0].name != "containerd" || defs[1].name != "statd" || defs[2].name != "extrad" {
		t.Fatalf("procDefs order: %+v", defs)
	}
	wantCtrd := []string{"--root", "/var/lib/shoal-dev/dev/n2/containerd", "--address", "/run/shoal-dev/dev/n2/containerd.sock"}
	if !reflect.DeepEqual(defs[0].args, wantCtrd) || defs[0].readySocket != "/run/shoal-dev/dev/n2/containerd.sock" || defs[0].readyHealth {
		t.Errorf("containerd: %+v", defs[0])
	}
	wantStatd := []string{
		"--state-dir", "/var/lib/shoal-dev/dev/n2/statd",
		"--run-dir", "/run/shoal-dev/dev/n2",
		"--metrics-addr", "127.0.0.1:9461",
		"--config", "",
		"--advertise-addr", "10.99.0.12", "--seed", "10.99.0.11:7470",
	}
	if !reflect.DeepEqual(defs[1].args, wantStatd) || defs[1].path != "/opt/shoal/bin/shoal-statd" || !defs[1].readyHealth {
		t.Errorf("statd: %+v", defs[1])
	}
	if defs[2].args[5] != "127.0.0.1:9471" {
		t.Errorf("extrad metrics: %v", defs[2].args)
	}
	if got := c.Processes(); !reflect.DeepEqual(got, []string{"containerd", "statd", "extrad"}) {
		t.Errorf("Processes = %v", got)
	}
}
