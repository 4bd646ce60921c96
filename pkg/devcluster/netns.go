package devcluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// netnsDir is where `ip netns add` pins named namespaces.
const netnsDir = "/run/netns"

// inNetns runs fn on an OS thread that has entered the network namespace
// pinned at path. Sockets fn creates belong to that namespace; so does a
// process fn starts (the child is forked from the thread). Only the network
// namespace changes: mounts and the rest stay the host's.
func inNetns(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		// NB: the thread stays locked unless it returns to the host
		// namespace, so a thread in another namespace is never reused: the
		// runtime ends it when this goroutine exits.
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		target, err := os.Open(path)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open network namespace: %w", err)
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter network namespace %s: %w", path, err)
			return
		}
		ferr := fn()
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		errc <- ferr
	}()
	return <-errc
}

// run runs a command in the host namespace and returns its error with its
// output.
func run(ctx context.Context, name string, args ...string) error {
	_, err := output(ctx, nil, name, args...)
	return err
}

// output runs a command with stdin and returns its stdout; a failure says
// what ran and what it printed.
func output(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.Bytes(), nil
}

func linkExists(name string) bool {
	_, err := net.InterfaceByName(name)
	return err == nil
}

func netnsExists(name string) bool {
	_, err := os.Stat(filepath.Join(netnsDir, name))
	return err == nil
}

// writeSysctl writes a sysctl of the current network namespace; a missing
// file (no IPv6 in the kernel) is not an error.
func writeSysctl(path, value string) error {
	err := os.WriteFile(filepath.Join("/proc/sys", path), []byte(value), 0o644)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// hostLock serialises the parts of Up that pick and claim host-wide
// resources (subnets, interface names) across processes. It is an abstract
// Unix socket: it leaves no file behind and the kernel frees it however
// its holder dies.
func hostLock(ctx context.Context) (func(), error) {
	for {
		l, err := net.Listen("unix", "@shoal-devcluster.lock")
		if err == nil {
			var once sync.Once
			return func() { once.Do(func() { l.Close() }) }, nil
		}
		if !errors.Is(err, unix.EADDRINUSE) {
			return nil, fmt.Errorf("take host lock: %w", err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for another shoal dev cluster to finish starting: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// hostPrefixes returns the IPv4 prefixes of the host's addresses and
// routes: a subnet overlapping any of them is taken.
func hostPrefixes(ctx context.Context) (map[netip.Prefix]string, error) {
	used := map[netip.Prefix]string{}
	out, err := output(ctx, nil, "ip", "-j", "-4", "addr", "show")
	if err != nil {
		return nil, err
	}
	var links []struct {
		IfName   string `json:"ifname"`
		AddrInfo []struct {
			Local     string `json:"local"`
			PrefixLen int    `json:"prefixlen"`
		} `json:"addr_info"`
	}
	if err := json.Unmarshal(out, &links); err != nil {
		return nil, fmt.Errorf("parse ip addr: %w", err)
	}
	for _, l := range links {
		for _, a := range l.AddrInfo {
			if p, err := netip.ParsePrefix(a.Local + "/" + strconv.Itoa(a.PrefixLen)); err == nil {
				used[p.Masked()] = "address on " + l.IfName
			}
		}
	}
	out, err = output(ctx, nil, "ip", "-j", "-4", "route", "show", "table", "all")
	if err != nil {
		return nil, err
	}
	var routes []struct {
		Dst string `json:"dst"`
		Dev string `json:"dev"`
	}
	if err := json.Unmarshal(out, &routes); err != nil {
		return nil, fmt.Errorf("parse ip route: %w", err)
	}
	for _, r := range routes {
		if r.Dst == "" || r.Dst == "default" {
			continue
		}
		dst := r.Dst
		if !strings.Contains(dst, "/") {
			dst += "/32"
		}
		if p, err := netip.ParsePrefix(dst); err == nil && p.Addr().Is4() {
			if _, ok := used[p.Masked()]; !ok {
				used[p.Masked()] = "route via " + r.Dev
			}
		}
	}
	return used, nil
}

// subnetConflict says what on the host overlaps p, or "".
func subnetConflict(used map[netip.Prefix]string, p netip.Prefix) string {
	for q, what := range used {
		// Loopback and link-local routes are everywhere and never ours.
		if q.Addr().IsLoopback() || q.Addr().IsLinkLocalUnicast() {
			continue
		}
		if q.Overlaps(p) {
			return fmt.Sprintf("%s (%s)", q, what)
		}
	}
	return ""
}

// pickSubnet returns the first /24 of 10.99.0.0/16 with room for nodes
// that overlaps nothing on the host.
func pickSubnet(used map[netip.Prefix]string) (netip.Prefix, error) {
	for third := 0; third < 256; third++ {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 99, byte(third), 0}), 24)
		if subnetConflict(used, p) == "" {
			return p, nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("no free /24 in 10.99.0.0/16: give a subnet")
}

// createNetwork makes the bridge and every node's namespace and veth.
// It records each resource in rec before creating it, so that Down
// finds even what a failure left half-made.
func (c *Cluster) createNetwork(ctx context.Context) error {
	br := c.rec.Bridge
	brAddr := c.BridgeAddr() + "/" + strconv.Itoa(c.prefix.Bits())
	if err := run(ctx, "ip", "link", "add", br, "type", "bridge", "forward_delay", "0"); err != nil {
		return err
	}
	writeSysctl("net/ipv6/conf/"+br+"/disable_ipv6", "1")
	if err := run(ctx, "ip", "addr", "add", brAddr, "dev", br); err != nil {
		return err
	}
	if err := run(ctx, "ip", "link", "set", br, "up"); err != nil {
		return err
	}
	c.logf("bridge %s %s", br, brAddr)
	for i := 1; i <= c.spec.Nodes; i++ {
		if err := c.createNode(ctx, i); err != nil {
			return fmt.Errorf("node %d: %w", i, err)
		}
	}
	return nil
}

func (c *Cluster) createNode(ctx context.Context, i int) error {
	ns, veth := c.Netns(i), c.rec.Veths[i-1]
	if err := run(ctx, "ip", "netns", "add", ns); err != nil {
		return err
	}
	if err := run(ctx, "ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns); err != nil {
		return err
	}
	writeSysctl("net/ipv6/conf/"+veth+"/disable_ipv6", "1")
	if err := run(ctx, "ip", "link", "set", veth, "master", c.rec.Bridge, "up"); err != nil {
		return err
	}
	err := inNetns(c.NetnsPath(i), func() error {
		return writeSysctl("net/ipv6/conf/eth0/disable_ipv6", "1")
	})
	if err != nil {
		return err
	}
	addr := c.Addr(i) + "/" + strconv.Itoa(c.prefix.Bits())
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"addr", "add", addr, "dev", "eth0"},
		{"link", "set", "eth0", "up"},
		{"route", "add", "default", "via", c.BridgeAddr()},
	} {
		if err := run(ctx, "ip", append([]string{"-n", ns}, args...)...); err != nil {
			return err
		}
	}
	c.logf("node %d: netns %s, %s on eth0 (host side %s)", i, ns, addr, veth)
	return nil
}

// deleteNetwork removes the veths, namespaces and bridge of the cluster:
// those in its record and those its naming scheme finds (a namespace
// shoal-NAME-<n>), never anything else. Missing pieces are fine.
func (c *Cluster) deleteNetwork(ctx context.Context) error {
	var errs []error
	// NB: delete each veth before its namespace: namespaces are destroyed
	// asynchronously, and a quick re-Up would otherwise race the old links.
	for _, v := range c.allVeths() {
		if linkExists(v) {
			if err := run(ctx, "ip", "link", "del", v); err != nil && linkExists(v) {
				errs = append(errs, err)
			}
		}
	}
	for _, ns := range c.allNetns() {
		if netnsExists(ns) {
			if err := run(ctx, "ip", "netns", "del", ns); err != nil && netnsExists(ns) {
				errs = append(errs, err)
			}
		}
	}
	if br := c.rec.Bridge; br != "" && linkExists(br) {
		if err := run(ctx, "ip", "link", "del", br); err != nil && linkExists(br) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// allNetns returns the recorded namespaces and any other shoal-NAME-<n>.
func (c *Cluster) allNetns() []string {
	out := append([]string(nil), c.rec.Netns...)
	re := regexp.MustCompile(`^` + regexp.QuoteMeta("shoal-"+c.spec.Name+"-") + `[0-9]+$`)
	entries, _ := os.ReadDir(netnsDir)
	for _, e := range entries {
		if re.MatchString(e.Name()) && !slices.Contains(out, e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out
}

// allVeths returns the recorded veths and those of any extra namespace
// shoal-NAME-<n> found.
func (c *Cluster) allVeths() []string {
	out := append([]string(nil), c.rec.Veths...)
	prefix := "shoal-" + c.spec.Name + "-"
	for _, ns := range c.allNetns() {
		if i, err := strconv.Atoi(strings.TrimPrefix(ns, prefix)); err == nil {
			if v := vethName(c.spec.Name, i); !slices.Contains(out, v) {
				out = append(out, v)
			}
		}
	}
	return out
}

// nsPids returns the processes in the namespace pinned at path (what `ip
// netns pids` does, for a namespace of any type), zombies excluded.
func nsPids(path string) ([]int, error) {
	var want unix.Stat_t
	if err := unix.Stat(path, &want); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, nil
		}
		return nil, err
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		for _, kind := range []string{"net", "mnt", "pid", "uts", "ipc", "user", "cgroup"} {
			var st unix.Stat_t
			if unix.Stat("/proc/"+e.Name()+"/ns/"+kind, &st) == nil && st.Dev == want.Dev && st.Ino == want.Ino {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids, nil
}

// unmountUnder detaches every mount at or below one of dirs, deepest
// first, and reports any that remain.
func unmountUnder(dirs ...string) error {
	mounts, err := mountsUnder(dirs...)
	if err != nil {
		return err
	}
	for _, m := range mounts {
		unix.Unmount(m, unix.MNT_DETACH)
	}
	left, err := mountsUnder(dirs...)
	if err != nil {
		return err
	}
	if len(left) > 0 {
		return fmt.Errorf("could not unmount %s", strings.Join(left, ", "))
	}
	return nil
}

// mountsUnder lists the mount points at or below dirs, deepest first.
func mountsUnder(dirs ...string) ([]string, error) {
	return mountsOfType("", dirs...)
}

// mountsOfType lists the mount points at or below dirs of file system
// type fstype ("": any), deepest first.
func mountsOfType(fstype string, dirs ...string) ([]string, error) {
	ms, err := mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) {
		if fstype != "" && m.FSType != fstype {
			return true, false
		}
		for _, d := range dirs {
			if m.Mountpoint == d || strings.HasPrefix(m.Mountpoint, d+"/") {
				return false, false
			}
		}
		return true, false
	})
	if err != nil {
		return nil, err
	}
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.Mountpoint
	}
	// Deeper paths first: a child mount must go before its parent.
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out, nil
}
