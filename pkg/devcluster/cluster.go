package devcluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
)

// recordVersion is the format version of cluster.json.
const recordVersion = 1

// record is cluster.json: the spec, and the names of the host resources
// made for the cluster, written before they are made.
type record struct {
	Version   int       `json:"version"`
	Spec      Spec      `json:"spec"`
	Created   time.Time `json:"created"`
	Bridge    string    `json:"bridge"`
	Netns     []string  `json:"netns"`
	Veths     []string  `json:"veths"`
	Partition [][]int   `json:"partition,omitempty"`
}

// Cluster is a dev cluster brought up by Up or found by Load. Its methods
// are safe for concurrent use.
type Cluster struct {
	spec   Spec
	prefix netip.Prefix
	logf   func(string, ...any)

	// mu guards rec and writes of cluster.json.
	mu  sync.Mutex
	rec record
}

// Up creates the cluster spec describes, starts every node's processes,
// waits until they are ready and, with spec.Bootstrap, forms the Shoal
// cluster. On failure it tears down what it made, unless
// spec.KeepOnFailure: then it returns the half-made cluster with the error,
// for the caller to inspect and Down.
func Up(ctx context.Context, spec Spec) (*Cluster, error) {
	spec, err := spec.withDefaults()
	if err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("dev clusters need root: they create network namespaces, a bridge and veth pairs")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("ip (iproute2) not found: install iproute2")
	}
	c := &Cluster{spec: spec, logf: spec.Logf}
	if c.logf == nil {
		c.logf = func(string, ...any) {}
	}
	var bins []string
	for _, d := range spec.Daemons {
		bins = append(bins, filepath.Join(spec.BinDir, "shoal-"+d))
	}
	if spec.Bootstrap {
		bins = append(bins, filepath.Join(spec.BinDir, "shoalctl"))
	}
	for _, p := range spec.Extra {
		bins = append(bins, p.Path)
	}
	for _, b := range bins {
		if _, err := c.lookPath(b); err != nil {
			return nil, invalidf("%v (build with `make build`, or give the bin dir)", err)
		}
	}

	unlock, err := hostLock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	dir := c.clusterStateDir()
	if _, err := os.Stat(c.recordPath()); err == nil {
		return nil, existsError{fmt.Errorf("dev cluster %q already exists (%s)", spec.Name, c.recordPath())}
	}
	if _, err := os.Stat(dir); err == nil {
		return nil, existsError{fmt.Errorf("%s exists but holds no cluster.json (left over from an interrupted teardown? `shoalctl dev down --name %s` removes it)", dir, spec.Name)}
	}
	if err := c.claim(ctx); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := c.save(true); err != nil {
		os.Remove(dir)
		return nil, err
	}
	c.logf("cluster %s: %d nodes on %s, state in %s", spec.Name, spec.Nodes, c.prefix, dir)

	// NB: the node dirs are made under the host lock, like the cluster dir:
	// Down of another cluster removes the roots when they are empty, under
	// the lock too.
	err = c.makeNodeDirs()
	if err == nil {
		err = c.createNetwork(ctx)
	}
	unlock()
	if err == nil {
		err = c.startAll(ctx)
	}
	if err == nil && spec.Bootstrap {
		err = c.Bootstrap(ctx)
	}
	if err != nil {
		if spec.KeepOnFailure {
			return c, err
		}
		c.logf("start failed: tearing down")
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if derr := c.Down(dctx); derr != nil {
			return nil, errors.Join(err, fmt.Errorf("tear down after failure: %w", derr))
		}
		return nil, fmt.Errorf("%w\n(the half-made cluster was torn down with its logs; Spec.KeepOnFailure keeps it)", err)
	}
	return c, nil
}

func (c *Cluster) makeNodeDirs() error {
	for i := 1; i <= c.spec.Nodes; i++ {
		if err := c.makeNodeDir(i); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) makeNodeDir(i int) error {
	for _, d := range []string{filepath.Join(c.NodeDir(i), "logs"), c.RunDir(i)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	return nil
}

// AddNode adds a node to a cluster that is up: node Nodes()+1, with its
// namespace, veth, address and directories, running the Spec's processes
// (extras, then daemons). With Spec.Bootstrap it also joins the Shoal
// cluster, with a token from node 1's `shoalctl cluster token`. It returns
// the new node's index; the node is recorded in cluster.json before
// anything is made for it, so on an error Down still removes what was
// made. A partition in effect leaves the new node in no group: it
// reaches every node.
//
// NB: unlike the other methods, AddNode must not run concurrently with
// other calls on c: they read the number of nodes without a lock.
func (c *Cluster) AddNode(ctx context.Context) (int, error) {
	i := c.spec.Nodes + 1
	grown := c.spec
	grown.Nodes = i
	if _, err := grown.withDefaults(); err != nil { // room in the subnet, socket paths
		return 0, err
	}
	unlock, err := hostLock(ctx)
	if err != nil {
		return 0, err
	}
	ns, veth := netnsName(c.spec.Name, i), vethName(c.spec.Name, i)
	if netnsExists(ns) || linkExists(veth) {
		unlock()
		return 0, existsError{fmt.Errorf("network namespace %s or interface %s already exists (left over from an earlier cluster %s? `shoalctl dev down --name %s` removes it)", ns, veth, c.spec.Name, c.spec.Name)}
	}
	c.mu.Lock()
	c.spec.Nodes = i
	c.rec.Netns = append(c.rec.Netns, ns)
	c.rec.Veths = append(c.rec.Veths, veth)
	err = c.save(false)
	c.mu.Unlock()
	if err == nil {
		err = c.makeNodeDir(i)
	}
	if err == nil {
		err = c.createNode(ctx, i)
	}
	unlock()
	if err != nil {
		return i, fmt.Errorf("node %d: %w", i, err)
	}
	if err := c.startNode(ctx, i); err != nil {
		return i, err
	}
	if c.spec.Bootstrap {
		token, err := c.joinToken(ctx)
		if err != nil {
			return i, err
		}
		if err := c.join(ctx, i, token); err != nil {
			return i, err
		}
	}
	c.logf("node %d: added", i)
	return i, nil
}

// claim picks the subnet and checks that nothing of the host uses it or
// the names the cluster needs. It runs under the host lock.
func (c *Cluster) claim(ctx context.Context) error {
	used, err := hostPrefixes(ctx)
	if err != nil {
		return err
	}
	if c.spec.Subnet == AutoSubnet {
		p, err := pickSubnet(used)
		if err != nil {
			return err
		}
		c.spec.Subnet = p.String()
	}
	p, err := parseSubnet(c.spec.Subnet)
	if err != nil {
		return err
	}
	c.prefix = p
	if what := subnetConflict(used, p); what != "" {
		return existsError{fmt.Errorf("subnet %s overlaps %s on this host (another dev cluster?): choose another subnet, or %q", p, what, AutoSubnet)}
	}
	c.rec = record{Version: recordVersion, Created: time.Now().UTC(), Bridge: bridgeName(c.spec.Name)}
	for i := 1; i <= c.spec.Nodes; i++ {
		c.rec.Netns = append(c.rec.Netns, netnsName(c.spec.Name, i))
		c.rec.Veths = append(c.rec.Veths, vethName(c.spec.Name, i))
	}
	// Anything already named like ours was not made by this cluster (it has
	// no cluster.json): refuse rather than adopt it.
	leftover := func(what, name string) error {
		return existsError{fmt.Errorf("%s %s already exists but no dev cluster %q is recorded (left over from a crash? `shoalctl dev down --name %s` removes it)", what, name, c.spec.Name, c.spec.Name)}
	}
	if linkExists(c.rec.Bridge) {
		return leftover("interface", c.rec.Bridge)
	}
	for _, v := range c.rec.Veths {
		if linkExists(v) {
			return leftover("interface", v)
		}
	}
	for _, ns := range c.allNetns() {
		if netnsExists(ns) {
			return leftover("network namespace", ns)
		}
	}
	return nil
}

// startAll starts every node's processes, the nodes in parallel.
func (c *Cluster) startAll(ctx context.Context) error {
	errs := make([]error, c.spec.Nodes+1)
	var wg sync.WaitGroup
	for i := 1; i <= c.spec.Nodes; i++ {
		wg.Go(func() { errs[i] = c.startNode(ctx, i) })
	}
	wg.Wait()
	var first error
	failed := 0
	for _, err := range errs {
		if err != nil {
			if first == nil {
				first = err
			}
			failed++
		}
	}
	if failed > 1 {
		more := "node"
		if failed > 2 {
			more = "nodes"
		}
		return fmt.Errorf("%w\n(and %d more %s failed)", first, failed-1, more)
	}
	return first
}

func (c *Cluster) startNode(ctx context.Context, i int) error {
	for _, p := range c.procDefs(i) {
		pid, err := c.startProc(ctx, i, p)
		if err != nil {
			return err
		}
		c.logf("node %d: %s ready (pid %d)", i, p.name, pid)
	}
	return nil
}

// Bootstrap forms the Shoal cluster: `shoalctl cluster init` on node 1,
// then `shoalctl cluster join` with its token on every other node. Up
// calls it when Spec.Bootstrap is set.
func (c *Cluster) Bootstrap(ctx context.Context) error {
	if _, err := c.clusterCtl(ctx, 1, "init", "--advertise", c.Addr(1), "--cluster-name", c.spec.Name); err != nil {
		return err
	}
	c.logf("node 1: initialised cluster %s", c.spec.Name)
	token, err := c.joinToken(ctx)
	if err != nil {
		return err
	}
	for i := 2; i <= c.spec.Nodes; i++ {
		if err := c.join(ctx, i, token); err != nil {
			return err
		}
	}
	return nil
}

// joinToken returns a join token from node 1.
func (c *Cluster) joinToken(ctx context.Context) (string, error) {
	out, err := c.clusterCtl(ctx, 1, "token")
	if err != nil {
		return "", err
	}
	token, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
	token = strings.TrimSpace(token)
	if token == "" {
		return "", fmt.Errorf("node 1: shoalctl cluster token printed no token")
	}
	return token, nil
}

// join makes node i join the cluster through node 1.
func (c *Cluster) join(ctx context.Context, i int, token string) error {
	// NB: the token is an argument here and so visible in ps; fine for a
	// dev cluster on one machine.
	if _, err := c.clusterCtl(ctx, i, "join", "--token", token, c.Addr(1)); err != nil {
		return err
	}
	c.logf("node %d: joined", i)
	return nil
}

// clusterCtl runs `shoalctl cluster ARGS` on node i and returns its
// output; errors show the command without a join token.
func (c *Cluster) clusterCtl(ctx context.Context, i int, args ...string) (string, error) {
	args = append([]string{"--run-dir", c.RunDir(i), "cluster"}, args...)
	out, errOut, code, err := c.Ctl(ctx, i, args...)
	shown := slices.Clone(args)
	for k := 1; k < len(shown); k++ {
		if shown[k-1] == "--token" {
			shown[k] = "<token>"
		}
	}
	if err != nil {
		return "", fmt.Errorf("node %d: shoalctl %s: %w", i, strings.Join(shown, " "), err)
	}
	if code != 0 {
		return "", fmt.Errorf("node %d: shoalctl %s: exit %d: %s", i, strings.Join(shown, " "), code, strings.TrimSpace(errOut+"\n"+out))
	}
	return out, nil
}

// Load finds the cluster called name under DefaultStateRoot.
func Load(name string) (*Cluster, error) { return LoadAt(DefaultStateRoot, name) }

// LoadAt finds the cluster called name under stateRoot.
func LoadAt(stateRoot, name string) (*Cluster, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	path := filepath.Join(stateRoot, name, "cluster.json")
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, notFoundError{fmt.Errorf("no dev cluster named %q (no %s)", name, path)}
	}
	if err != nil {
		return nil, err
	}
	var rec record
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if rec.Version != recordVersion {
		return nil, fmt.Errorf("%s: format version %d, this shoalctl reads %d", path, rec.Version, recordVersion)
	}
	c := &Cluster{spec: rec.Spec, rec: rec, logf: func(string, ...any) {}}
	if c.prefix, err = parseSubnet(rec.Spec.Subnet); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// SetLogf sets where progress lines go (nil: nowhere).
func (c *Cluster) SetLogf(logf func(string, ...any)) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	c.logf = logf
}

// save writes cluster.json atomically; with excl it must not exist yet.
func (c *Cluster) save(excl bool) error {
	c.rec.Spec = c.spec
	data, err := json.MarshalIndent(c.rec, "", "  ")
	if err != nil {
		return err
	}
	data = append(data, '\n')
	path := c.recordPath()
	if excl {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			if errors.Is(err, os.ErrExist) {
				return existsError{fmt.Errorf("dev cluster %q already exists (%s)", c.spec.Name, path)}
			}
			return err
		}
		if _, err := f.Write(data); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Down kills every process of every node, unmounts whatever is mounted
// under the cluster's directories, deletes its veths, namespaces and
// bridge (with the nftables tables inside the namespaces) and removes its
// directories. It is idempotent and works on a cluster that Up left
// half-made. If a step fails, the directories (with cluster.json and the
// logs) are kept so that Down can be run again.
func (c *Cluster) Down(ctx context.Context) error {
	var errs []error
	for i := 1; i <= c.spec.Nodes; i++ {
		if err := c.killNode(ctx, i); err != nil {
			errs = append(errs, err)
		}
	}
	// Namespaces named like ours beyond the recorded nodes (an earlier,
	// larger cluster of the same name that crashed) go too.
	for _, ns := range c.allNetns() {
		if err := killNetns(ctx, filepath.Join(netnsDir, ns)); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", ns, err))
		}
	}
	// Namespaces pinned under the cluster's dirs (say, a task's network
	// namespace that a node's netd made) hold processes of the cluster too.
	pinned, err := mountsOfType("nsfs", c.clusterStateDir(), c.clusterRunDir())
	if err != nil {
		errs = append(errs, err)
	}
	for _, p := range pinned {
		if err := killNetns(ctx, p); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
		}
	}
	for i := 1; i <= c.spec.Nodes; i++ {
		if err := c.netdLeftovers(ctx, i); err != nil {
			errs = append(errs, err)
		}
	}
	if err := unmountUnder(c.clusterStateDir(), c.clusterRunDir()); err != nil {
		errs = append(errs, err)
	}
	if err := c.deleteNetwork(ctx); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("tear down dev cluster %s: %w", c.spec.Name, errors.Join(errs...))
	}
	if err := c.removeDirs(); err != nil {
		return fmt.Errorf("tear down dev cluster %s: %w", c.spec.Name, err)
	}
	c.logf("cluster %s: down", c.spec.Name)
	return nil
}

// Leftovers lists what of the cluster is still on the machine: those of
// pids that still run, network namespaces named like its nodes', its
// bridge and veths, its directories and its record. It is empty after a
// successful Down; tests check that.
func (c *Cluster) Leftovers(pids ...int) []string {
	var out []string
	for _, pid := range pids {
		if alive(pid, 0) {
			out = append(out, fmt.Sprintf("process %d", pid))
		}
	}
	for _, ns := range c.allNetns() {
		if netnsExists(ns) {
			out = append(out, "network namespace "+ns)
		}
	}
	links := append([]string{bridgeName(c.spec.Name)}, c.allVeths()...)
	for i := 1; i <= c.spec.Nodes; i++ {
		if v := vethName(c.spec.Name, i); !slices.Contains(links, v) {
			links = append(links, v)
		}
	}
	for _, l := range links {
		if linkExists(l) {
			out = append(out, "link "+l)
		}
	}
	for _, d := range []string{c.clusterStateDir(), c.clusterRunDir()} {
		if _, err := os.Stat(d); err == nil {
			out = append(out, "directory "+d)
		}
	}
	if _, err := LoadAt(c.spec.StateRoot, c.spec.Name); !errdefs.IsNotFound(err) {
		out = append(out, fmt.Sprintf("cluster record (Load: %v)", err))
	}
	return out
}

// Purge removes what a cluster called name left under the default roots
// without a cluster.json to say so (a crash between steps, or a format
// this version cannot read): the processes in its namespaces
// shoal-NAME-<n>, their veths, the bridge shbr-NAME and the directories.
// It reports whether it found anything.
func Purge(ctx context.Context, name string) (bool, error) {
	if err := ValidName(name); err != nil {
		return false, err
	}
	c := &Cluster{
		spec: Spec{Name: name, StateRoot: DefaultStateRoot, RunRoot: DefaultRunRoot},
		rec:  record{Bridge: bridgeName(name)},
		logf: func(string, ...any) {},
	}
	found := linkExists(c.rec.Bridge) || len(c.allNetns()) > 0
	for _, d := range []string{c.clusterStateDir(), c.clusterRunDir()} {
		if _, err := os.Stat(d); err == nil {
			found = true
		}
	}
	if !found {
		return false, nil
	}
	return true, c.Down(ctx)
}

// removeDirs removes the run dir, then the state dir with cluster.json
// last, so an interrupted removal still leaves a cluster Down can find.
func (c *Cluster) removeDirs() error {
	if err := os.RemoveAll(c.clusterRunDir()); err != nil {
		return err
	}
	dir := c.clusterStateDir()
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, e := range entries {
		if e.Name() == "cluster.json" {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	// The default roots go too once no cluster is left in them, under the
	// host lock so that a concurrent Up does not lose them between its
	// MkdirAll and its Mkdir.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if unlock, err := hostLock(ctx); err == nil {
		if c.spec.StateRoot == DefaultStateRoot {
			os.Remove(DefaultStateRoot)
		}
		if c.spec.RunRoot == DefaultRunRoot {
			os.Remove(DefaultRunRoot)
		}
		unlock()
	}
	return nil
}

// CheckNode returns an error unless node i exists.
func (c *Cluster) CheckNode(i int) error {
	if i < 1 || i > c.spec.Nodes {
		return invalidf("node %d out of range: cluster %s has nodes 1 to %d", i, c.spec.Name, c.spec.Nodes)
	}
	return nil
}

// Start starts node i's process name (a daemon or an extra process; ""
// for all of them, in order) unless it runs, and waits until it is ready.
func (c *Cluster) Start(ctx context.Context, i int, name string) error {
	if err := c.CheckNode(i); err != nil {
		return err
	}
	if name == "" {
		return c.startNode(ctx, i)
	}
	p, err := c.procDef(i, name)
	if err != nil {
		return err
	}
	pid, err := c.startProc(ctx, i, p)
	if err != nil {
		return err
	}
	c.logf("node %d: %s ready (pid %d)", i, p.name, pid)
	return nil
}

// Kill sends SIGKILL to node i's process name and waits until it is gone;
// name "" kills every process of the node, including any other process in
// its network namespace. Killing what does not run is not an error.
func (c *Cluster) Kill(ctx context.Context, i int, name string) error {
	if err := c.CheckNode(i); err != nil {
		return err
	}
	if name == "" {
		return c.killNode(ctx, i)
	}
	if _, err := c.procDef(i, name); err != nil {
		return err
	}
	return c.killProc(ctx, i, name)
}

// Stop stops node i's process name gracefully, as `systemctl stop` would:
// SIGTERM, and SIGKILL if it has not exited within grace. Stopping what
// does not run is not an error.
func (c *Cluster) Stop(ctx context.Context, i int, name string, grace time.Duration) error {
	if err := c.CheckNode(i); err != nil {
		return err
	}
	if _, err := c.procDef(i, name); err != nil {
		return err
	}
	return c.stopProc(ctx, i, name, grace)
}

// Command returns a command that runs argv on node i once started with
// StartIn: argv[0] is looked up in BinDir first, then $PATH; the
// environment is ours with BinDir first in PATH and SHOAL_RUN_DIR set to
// the node's run dir. The process is killed when ctx ends (never, for
// context.Background()).
func (c *Cluster) Command(ctx context.Context, i int, argv ...string) (*exec.Cmd, error) {
	if err := c.CheckNode(i); err != nil {
		return nil, err
	}
	if len(argv) == 0 {
		return nil, invalidf("no command given")
	}
	path, err := c.lookPath(argv[0])
	if err != nil {
		return nil, notFoundError{err}
	}
	cmd := exec.CommandContext(ctx, path, argv[1:]...)
	cmd.Args[0] = argv[0]
	cmd.Env = c.env(i)
	cmd.WaitDelay = 2 * time.Second
	return cmd, nil
}

// StartIn starts cmd inside node i's network namespace (only the network
// namespace: the file system is the host's). The caller waits for it.
func (c *Cluster) StartIn(i int, cmd *exec.Cmd) error {
	if err := c.CheckNode(i); err != nil {
		return err
	}
	if !netnsExists(c.Netns(i)) {
		return fmt.Errorf("node %d: network namespace %s does not exist (cluster down?)", i, c.Netns(i))
	}
	return inNetns(c.NetnsPath(i), cmd.Start)
}

// InNetns runs fn on a thread inside node i's network namespace. Sockets
// that fn itself creates (net.Listen, net.Dial with an IP address) belong
// to the node; goroutines fn starts do not run in the namespace.
func (c *Cluster) InNetns(i int, fn func() error) error {
	if err := c.CheckNode(i); err != nil {
		return err
	}
	return inNetns(c.NetnsPath(i), fn)
}

// Exec runs argv on node i (see Command) with env added, and returns its
// output and exit code (128+n for death by signal n). err is set only when
// the command could not be run or ctx ended.
func (c *Cluster) Exec(ctx context.Context, i int, argv []string, env []string) (stdout, stderr string, code int, err error) {
	if ctx == nil {
		ctx = context.Background()
	}
	cmd, err := c.Command(ctx, i, argv...)
	if err != nil {
		return "", "", -1, err
	}
	cmd.Env = append(cmd.Env, env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := c.StartIn(i, cmd); err != nil {
		return "", "", -1, err
	}
	err = cmd.Wait()
	if ctx.Err() != nil {
		return out.String(), errb.String(), -1, fmt.Errorf("node %d: %s: %w", i, argv[0], ctx.Err())
	}
	code, err = ExitCode(err)
	return out.String(), errb.String(), code, err
}

// ExitCode turns the error of exec.Cmd.Wait into an exit code: 0 for nil,
// the code for an exit, 128+n for death by signal n. Other errors are
// returned.
func ExitCode(err error) (int, error) {
	if err == nil {
		return 0, nil
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return -1, err
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal()), nil
	}
	return ee.ExitCode(), nil
}

// Ctl runs BinDir/shoalctl with args on node i (see Exec).
func (c *Cluster) Ctl(ctx context.Context, i int, args ...string) (stdout, stderr string, code int, err error) {
	return c.Exec(ctx, i, append([]string{filepath.Join(c.spec.BinDir, "shoalctl")}, args...), nil)
}

// Status is a snapshot of a cluster.
type Status struct {
	Name       string       `json:"name"`
	Subnet     string       `json:"subnet"`
	Bridge     string       `json:"bridge"`
	BridgeAddr string       `json:"bridge_addr"`
	BridgeUp   bool         `json:"bridge_up"`
	BinDir     string       `json:"bin_dir"`
	Created    time.Time    `json:"created"`
	Partition  [][]int      `json:"partition,omitempty"`
	Nodes      []NodeStatus `json:"nodes"`
}

// NodeStatus is one node of a Status.
type NodeStatus struct {
	Node      int             `json:"node"`
	Addr      string          `json:"addr"`
	Netns     string          `json:"netns"`
	NetnsUp   bool            `json:"netns_up"`
	RunDir    string          `json:"run_dir"`
	Processes []ProcessStatus `json:"processes"`
}

// ProcessStatus is one process of a NodeStatus.
type ProcessStatus struct {
	Name    string `json:"name"`
	Running bool   `json:"running"`
	PID     int    `json:"pid,omitempty"`
	// Ready: a process with a ready socket answers on it (daemons: health
	// SERVING); any other process is ready when it runs.
	Ready bool   `json:"ready"`
	Log   string `json:"log"`
}

// Status reports the nodes, their addresses and whether each process runs
// and is ready.
func (c *Cluster) Status(ctx context.Context) (Status, error) {
	st := Status{
		Name:       c.spec.Name,
		Subnet:     c.prefix.String(),
		Bridge:     c.rec.Bridge,
		BridgeAddr: c.BridgeAddr(),
		BridgeUp:   linkExists(c.rec.Bridge),
		BinDir:     c.spec.BinDir,
		Created:    c.rec.Created,
		Partition:  c.currentPartition(),
	}
	var wg sync.WaitGroup
	for i := 1; i <= c.spec.Nodes; i++ {
		ns := NodeStatus{Node: i, Addr: c.Addr(i), Netns: c.Netns(i), NetnsUp: netnsExists(c.Netns(i)), RunDir: c.RunDir(i)}
		defs := c.procDefs(i)
		ns.Processes = make([]ProcessStatus, len(defs))
		for j, p := range defs {
			ps := &ns.Processes[j]
			*ps = ProcessStatus{Name: p.name, Log: c.LogPath(i, p.name)}
			ps.PID, ps.Running = c.running(i, p.name)
			if !ps.Running {
				ps.PID = 0
				continue
			}
			if p.readySocket == "" {
				ps.Ready = true
				continue
			}
			wg.Go(func() { ps.Ready = probe(ctx, p.readySocket, p.readyHealth) })
		}
		st.Nodes = append(st.Nodes, ns)
	}
	wg.Wait()
	return st, nil
}

// currentPartition reads the partition from cluster.json, which another
// process may have changed.
func (c *Cluster) currentPartition() [][]int {
	data, err := os.ReadFile(c.recordPath())
	if err == nil {
		var rec record
		if json.Unmarshal(data, &rec) == nil {
			return rec.Partition
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rec.Partition
}

// Spec returns the cluster's spec, defaults filled in.
func (c *Cluster) Spec() Spec { return c.spec }

// Name returns the cluster's name.
func (c *Cluster) Name() string { return c.spec.Name }

// Nodes returns the number of nodes.
func (c *Cluster) Nodes() int { return c.spec.Nodes }

// Processes returns the names of the processes every node runs, in start
// order.
func (c *Cluster) Processes() []string {
	var out []string
	for _, p := range c.spec.Extra {
		out = append(out, p.Name)
	}
	return append(out, c.spec.Daemons...)
}

// Subnet returns the cluster's subnet.
func (c *Cluster) Subnet() netip.Prefix { return c.prefix }

// BridgeAddr returns the bridge's address: how nodes reach the host.
func (c *Cluster) BridgeAddr() string { return hostAddr(c.prefix, 1).String() }

// Addr returns node i's address. Like the other accessors it panics on a
// node out of range (see CheckNode).
func (c *Cluster) Addr(i int) string {
	c.mustNode(i)
	return hostAddr(c.prefix, firstNodeOffset+i).String()
}

// Netns returns the name of node i's network namespace.
func (c *Cluster) Netns(i int) string { c.mustNode(i); return netnsName(c.spec.Name, i) }

// NetnsPath returns the path that pins node i's network namespace.
func (c *Cluster) NetnsPath(i int) string { return filepath.Join(netnsDir, c.Netns(i)) }

// NodeDir returns node i's directory: state dirs and logs.
func (c *Cluster) NodeDir(i int) string {
	c.mustNode(i)
	return filepath.Join(c.clusterStateDir(), "n"+strconv.Itoa(i))
}

// StateDir returns the --state-dir of node i's daemon (or the {statedir}
// of an extra process).
func (c *Cluster) StateDir(i int, name string) string { return filepath.Join(c.NodeDir(i), name) }

// LogPath returns the log file of node i's process name.
func (c *Cluster) LogPath(i int, name string) string {
	return filepath.Join(c.NodeDir(i), "logs", name+".log")
}

// RunDir returns node i's --run-dir, where its daemons' sockets are.
func (c *Cluster) RunDir(i int) string {
	c.mustNode(i)
	return filepath.Join(c.clusterRunDir(), "n"+strconv.Itoa(i))
}

// mustNode panics on a node out of range; only accessors use it, since a
// bad index there is a programming error.
func (c *Cluster) mustNode(i int) {
	if i < 1 || i > c.spec.Nodes {
		panic(fmt.Sprintf("devcluster: node %d out of range 1..%d", i, c.spec.Nodes))
	}
}

func (c *Cluster) clusterStateDir() string { return filepath.Join(c.spec.StateRoot, c.spec.Name) }
func (c *Cluster) clusterRunDir() string   { return filepath.Join(c.spec.RunRoot, c.spec.Name) }
func (c *Cluster) recordPath() string      { return filepath.Join(c.clusterStateDir(), "cluster.json") }
