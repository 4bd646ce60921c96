package devcluster

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Defaults of a Spec.
const (
	DefaultName      = "dev"
	DefaultNodes     = 3
	DefaultSubnet    = "10.99.0.0/24"
	DefaultStateRoot = "/var/lib/shoal-dev"
	DefaultRunRoot   = "/run/shoal-dev"
	// AutoSubnet as Spec.Subnet picks the first /24 of 10.99.0.0/16 that
	// no address or route of the host overlaps. Concurrent Ups (say, test
	// packages run in parallel) pick distinct subnets.
	AutoSubnet          = "auto"
	DefaultStartTimeout = 20 * time.Second
)

// DefaultDaemons are the daemons a node runs unless Spec.Daemons says
// otherwise.
var DefaultDaemons = []string{"statd", "schedd", "netd", "vold"}

// metricsPorts are the daemons' usual metrics ports; every node has a
// loopback of its own, so they never collide.
var metricsPorts = map[string]int{"statd": 9461, "schedd": 9462, "netd": 9463, "vold": 9464}

// firstNodeOffset puts node i at host number firstNodeOffset+i of the
// subnet, leaving room below for the bridge and later helpers.
const firstNodeOffset = 10

// Spec describes a cluster. It is recorded in cluster.json, so everything
// in it but KeepOnFailure and Logf survives to later commands.
type Spec struct {
	// Name names the cluster and everything made for it (default "dev"):
	// lowercase letters, digits and inner hyphens, at most 10 characters
	// (the bridge shbr-NAME must fit the 15 bytes of an interface name).
	Name string `json:"name"`
	// Nodes is the number of nodes (default 3).
	Nodes int `json:"nodes"`
	// Subnet is the IPv4 subnet of the bridge (default 10.99.0.0/24, or
	// AutoSubnet). The bridge has host 1, node i host 10+i.
	Subnet string `json:"subnet"`
	// BinDir holds shoal-<daemon> and shoalctl. Required.
	BinDir string `json:"bin_dir"`
	// Daemons run on every node, in order (nil: DefaultDaemons; empty: none).
	Daemons []string `json:"daemons"`
	// Args are extra arguments of a daemon, by daemon name, given to it on
	// every node after the standard ones (--state-dir, --run-dir,
	// --metrics-addr, --config ""). Placeholders are expanded per node.
	Args map[string][]string `json:"args,omitempty"`
	// Env is added to the environment of every process (placeholders expanded).
	Env []string `json:"env,omitempty"`
	// Extra processes run on every node before the daemons, e.g. a
	// containerd per node.
	Extra []ProcessSpec `json:"extra,omitempty"`
	// Bootstrap makes Up run `shoalctl cluster init` on node 1 and
	// `shoalctl cluster join` on the others once the daemons serve.
	Bootstrap bool `json:"bootstrap"`
	// StateRoot and RunRoot hold the cluster's directories (default
	// /var/lib/shoal-dev and /run/shoal-dev). Keep RunRoot short: socket
	// paths are limited to 108 bytes.
	StateRoot string `json:"state_root"`
	RunRoot   string `json:"run_root"`
	// StartTimeout bounds the wait for one process to become ready
	// (default 20s).
	StartTimeout time.Duration `json:"start_timeout"`

	// KeepOnFailure makes a failed Up leave what it made (for post-mortems)
	// instead of tearing it down; the caller then calls Down.
	KeepOnFailure bool `json:"-"`
	// Logf, when set, receives progress lines.
	Logf func(format string, args ...any) `json:"-"`
}

// ProcessSpec is an extra process run on every node (see Spec.Extra).
type ProcessSpec struct {
	// Name is unique among the node's processes: it names the log file,
	// the pid file and the default state dir ({statedir}).
	Name string `json:"name"`
	// Path is the executable: absolute, or looked up in BinDir, then $PATH.
	Path string `json:"path"`
	// Args and Env (KEY=VALUE) may use placeholders.
	Args []string `json:"args,omitempty"`
	Env  []string `json:"env,omitempty"`
	// ReadySocket, when set, is a Unix socket path (placeholders allowed)
	// that must accept connections before the process counts as started;
	// with ReadyHealth, it must also answer grpc.health.v1 SERVING.
	// Without it a process is ready as soon as it has been started.
	ReadySocket string `json:"ready_socket,omitempty"`
	ReadyHealth bool   `json:"ready_health,omitempty"`
}

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?$`)

// procNameRE keeps process names safe as file names.
var procNameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._-]{0,63}$`)

// ValidName reports whether name can name a cluster, and why not.
func ValidName(name string) error {
	if !nameRE.MatchString(name) {
		return invalidf("cluster name %q: want 1-10 lowercase letters, digits or inner hyphens", name)
	}
	return nil
}

// withDefaults returns s with defaults filled in and checks it.
func (s Spec) withDefaults() (Spec, error) {
	if s.Name == "" {
		s.Name = DefaultName
	}
	if err := ValidName(s.Name); err != nil {
		return s, err
	}
	if s.Nodes == 0 {
		s.Nodes = DefaultNodes
	}
	if s.Subnet == "" {
		s.Subnet = DefaultSubnet
	}
	if s.Daemons == nil {
		s.Daemons = slices.Clone(DefaultDaemons)
	}
	if s.StateRoot == "" {
		s.StateRoot = DefaultStateRoot
	}
	if s.RunRoot == "" {
		s.RunRoot = DefaultRunRoot
	}
	if s.StartTimeout <= 0 {
		s.StartTimeout = DefaultStartTimeout
	}
	if s.BinDir == "" {
		return s, invalidf("no bin dir: set Spec.BinDir to the directory of shoal-<daemon> and shoalctl")
	}
	for _, p := range []*string{&s.BinDir, &s.StateRoot, &s.RunRoot} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			return s, err
		}
		*p = abs
	}
	if s.Nodes < 1 {
		return s, invalidf("nodes: want at least 1, got %d", s.Nodes)
	}
	if s.Subnet != AutoSubnet {
		p, err := parseSubnet(s.Subnet)
		if err != nil {
			return s, err
		}
		s.Subnet = p.String()
		if max := maxNodes(p); s.Nodes > max {
			return s, invalidf("subnet %s has room for %d nodes, not %d", p, max, s.Nodes)
		}
	} else if s.Nodes > maxNodes(netip.MustParsePrefix(DefaultSubnet)) {
		return s, invalidf("%d nodes do not fit a /24: give a larger --subnet", s.Nodes)
	}
	seen := map[string]bool{}
	for _, p := range s.Extra {
		if !procNameRE.MatchString(p.Name) {
			return s, invalidf("extra process name %q: want letters, digits, '.', '_' or '-'", p.Name)
		}
		if p.Path == "" {
			return s, invalidf("extra process %s: no path", p.Name)
		}
		if seen[p.Name] {
			return s, invalidf("process %s given twice", p.Name)
		}
		seen[p.Name] = true
	}
	for _, d := range s.Daemons {
		if !procNameRE.MatchString(d) {
			return s, invalidf("daemon name %q: want letters, digits, '.', '_' or '-'", d)
		}
		if seen[d] {
			return s, invalidf("process %s given twice", d)
		}
		seen[d] = true
	}
	for d := range s.Args {
		if !slices.Contains(s.Daemons, d) {
			return s, invalidf("args given for %s, which is not one of the daemons (%s)", d, strings.Join(s.Daemons, ", "))
		}
	}
	// Socket paths: <run-dir>/<name>.sock must fit sun_path (108 bytes with
	// its NUL).
	longest := len(filepath.Join(s.RunRoot, s.Name, "n"+strconv.Itoa(s.Nodes)))
	for name := range seen {
		if l := longest + len("/"+name+".sock"); l > 107 {
			return s, invalidf("run root %s is too long: the socket of %s would take %d bytes, more than 107", s.RunRoot, name, l)
		}
	}
	return s, nil
}

func parseSubnet(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return p, invalidf("subnet %q: want an IPv4 CIDR such as %s, or %q", s, DefaultSubnet, AutoSubnet)
	}
	if !p.Addr().Is4() {
		return p, invalidf("subnet %s: only IPv4 subnets are supported", s)
	}
	if p.Bits() > 28 {
		return p, invalidf("subnet %s is too small: want /28 or larger", s)
	}
	return p.Masked(), nil
}

// maxNodes is how many nodes fit in p: host numbers 11.. up to the last
// one before broadcast.
func maxNodes(p netip.Prefix) int {
	size := 1 << (32 - p.Bits())
	return min(size-2-firstNodeOffset, 1000)
}

// hostAddr returns host number n of p.
func hostAddr(p netip.Prefix, n int) netip.Addr {
	b := p.Masked().Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(n)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// Resource names. Everything is named after the cluster, so teardown
// never needs to touch anything else.

func bridgeName(cluster string) string { return "shbr-" + cluster }

func netnsName(cluster string, i int) string { return fmt.Sprintf("shoal-%s-%d", cluster, i) }

// vethName is the host end of node i's veth pair: sh<cluster>-<i>, or,
// when that exceeds 15 bytes, sh<hash of cluster>-<i>.
func vethName(cluster string, i int) string {
	n := fmt.Sprintf("sh%s-%d", cluster, i)
	if len(n) <= 15 {
		return n
	}
	sum := sha256.Sum256([]byte(cluster))
	suffix := "-" + strconv.Itoa(i)
	return "sh" + hex.EncodeToString(sum[:])[:15-2-len(suffix)] + suffix
}

// expander returns the placeholder expansion for process proc on node i.
func (c *Cluster) expander(i int, proc string) *strings.Replacer {
	return strings.NewReplacer(
		"{node}", strconv.Itoa(i),
		"{addr}", c.Addr(i),
		"{seed}", c.Addr(1),
		"{cluster}", c.spec.Name,
		"{netns}", c.Netns(i),
		"{nodedir}", c.NodeDir(i),
		"{statedir}", filepath.Join(c.NodeDir(i), proc),
		"{rundir}", c.RunDir(i),
		"{logdir}", filepath.Join(c.NodeDir(i), "logs"),
		"{bridge}", c.BridgeAddr(),
		"{prefixlen}", strconv.Itoa(c.prefix.Bits()),
	)
}

func expandAll(r *strings.Replacer, in []string) []string {
	out := make([]string, len(in))
	for i, s := range in {
		out[i] = r.Replace(s)
	}
	return out
}
