package devcluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"al.essio.dev/pkg/shellescape"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// ContainerdProcessName is the name of the containerd extra process.
const ContainerdProcessName = "containerd"

// ContainerdLayout is where one node's containerd keeps its files and how
// the node's containers are kept apart from other nodes'.
//
// Every node of a dev cluster can run a containerd of its own, as an extra
// process (Spec.Extra = []ProcessSpec{ContainerdProcess("")}). On one
// machine several containerds must not share anything: containerd 1.6
// keeps runc's state under /run/containerd/runc/<namespace> and puts
// containers in cgroup /<namespace>/<id> whatever its --root and --state
// say, so two nodes using the same namespace and task ID collide, and one
// node's cleanup kills the other's container. Each node therefore gets
// (the fields of ContainerdLayout):
//
//	root           <nodedir>/containerd/root       images, snapshots, metadata
//	state          <rundir>/ctrd                   shim state, rootfs mounts (short: under the run root)
//	address        <rundir>/containerd.sock        gRPC (and containerd.sock.ttrpc)
//	config         <nodedir>/containerd/config.toml  written at each start
//	namespace      shoal-<cluster>-<n>             containerd namespace of the node's schedd
//	runc root      <rundir>/runc                   runc options Root of every container
//	cgroup parent  /shoal-<cluster>-<n>            containers get <parent>/<task id>
//
// The last three are for the node's schedd to use (runtime.Config
// Namespace, RuncRoot, CgroupParent); ContainerdTemplate has them with
// placeholders for Spec.Args, Cluster.Containerd(i) expanded.
//
// Containers outlive their node's processes: their shims are children of
// nobody, and a container given a network namespace of its own is not in
// the node's. KillContainers finds and kills them by cgroup and by shim
// address, and removes what they leave (mounts, cgroups, shim sockets);
// Down must call it for every node that runs a containerd.
type ContainerdLayout struct {
	// Config is the containerd config file.
	Config string `json:"config"`
	// Root and State are containerd's --root and --state.
	Root  string `json:"root"`
	State string `json:"state"`
	// Address is containerd's gRPC socket.
	Address string `json:"address"`
	// Namespace is the containerd namespace of the node's tasks.
	Namespace string `json:"namespace"`
	// RuncRoot is runc's state dir for the node's containers.
	RuncRoot string `json:"runc_root"`
	// CgroupParent is the cgroup (cgroupfs path) under which the node's
	// containers get theirs.
	CgroupParent string `json:"cgroup_parent"`
}

// ContainerdTemplate is the layout of a node's containerd with
// placeholders, for Spec.Args of the daemons (say, schedd's flags).
var ContainerdTemplate = ContainerdLayout{
	Config:       "{nodedir}/" + ContainerdProcessName + "/config.toml",
	Root:         "{nodedir}/" + ContainerdProcessName + "/root",
	State:        "{rundir}/ctrd",
	Address:      "{rundir}/containerd.sock",
	Namespace:    "shoal-{cluster}-{node}",
	RuncRoot:     "{rundir}/runc",
	CgroupParent: "/shoal-{cluster}-{node}",
}

// Containerd returns node i's containerd layout (meaningful when the
// cluster runs ContainerdProcess).
func (c *Cluster) Containerd(i int) ContainerdLayout {
	r := c.expander(i, ContainerdProcessName)
	l := ContainerdTemplate
	for _, p := range []*string{&l.Config, &l.Root, &l.State, &l.Address, &l.Namespace, &l.RuncRoot, &l.CgroupParent} {
		*p = r.Replace(*p)
	}
	return l
}

// HasContainerd reports whether the cluster's nodes run a containerd
// (an extra process named ContainerdProcessName).
func (c *Cluster) HasContainerd() bool {
	return slices.ContainsFunc(c.spec.Extra, func(p ProcessSpec) bool { return p.Name == ContainerdProcessName })
}

// ContainerdDisabledPlugins are the plugins a dev node's containerd goes
// without: CRI (Shoal is not Kubernetes), the /opt/containerd installer
// (it would create /opt/containerd), snapshotters this machine lacks, and
// tracing.
var ContainerdDisabledPlugins = []string{
	"io.containerd.grpc.v1.cri",
	"io.containerd.internal.v1.opt",
	"io.containerd.snapshotter.v1.aufs",
	"io.containerd.snapshotter.v1.btrfs",
	"io.containerd.snapshotter.v1.devmapper",
	"io.containerd.snapshotter.v1.zfs",
	"io.containerd.tracing.processor.v1.otlp",
	"io.containerd.internal.v1.tracing",
}

// ContainerdConfig returns the TOML config of a containerd with layout l
// (Config, Root, State and Address are used) logging at level ("" for
// "warn").
func ContainerdConfig(l ContainerdLayout, level string) string {
	if level == "" {
		level = "warn"
	}
	q := strconv.Quote
	var b strings.Builder
	fmt.Fprintf(&b, "# containerd of a Shoal dev node, written by devcluster\n")
	fmt.Fprintf(&b, "version = 2\nroot = %s\nstate = %s\n", q(l.Root), q(l.State))
	quoted := make([]string, len(ContainerdDisabledPlugins))
	for i, p := range ContainerdDisabledPlugins {
		quoted[i] = q(p)
	}
	fmt.Fprintf(&b, "disabled_plugins = [%s]\n\n", strings.Join(quoted, ", "))
	fmt.Fprintf(&b, "[grpc]\n  address = %s\n\n", q(l.Address))
	fmt.Fprintf(&b, "[debug]\n  level = %s\n", q(level))
	return b.String()
}

// WriteContainerdConfig writes l's config to l.Config, making its
// directory.
func WriteContainerdConfig(l ContainerdLayout, level string) error {
	if err := os.MkdirAll(filepath.Dir(l.Config), 0o755); err != nil {
		return err
	}
	return os.WriteFile(l.Config, []byte(ContainerdConfig(l, level)), 0o644)
}

// ContainerdProcess returns the extra process of a per-node containerd
// laid out as ContainerdTemplate. binary is the containerd executable
// ("" for "containerd" from $PATH). The process is a shell that writes the
// node's config, then execs containerd (so its pid is containerd's); it is
// ready when the gRPC socket accepts connections.
//
//	spec.Extra = append(spec.Extra, devcluster.ContainerdProcess(""))
//	t := devcluster.ContainerdTemplate // placeholders, expanded per node
//	spec.Args["schedd"] = []string{ // (whatever schedd's flags are called)
//		"--containerd-address", t.Address, "--containerd-namespace", t.Namespace,
//		"--runc-root", t.RuncRoot, "--cgroup-parent", t.CgroupParent}
func ContainerdProcess(binary string) ProcessSpec {
	if binary == "" {
		binary = "containerd"
	}
	l := ContainerdTemplate
	script := fmt.Sprintf("set -e\nmkdir -p %s %s\ncat > %s <<'EOF'\n%sEOF\nexec %s --config %s\n",
		shellescape.Quote(filepath.Dir(l.Config)), shellescape.Quote(l.State), shellescape.Quote(l.Config),
		ContainerdConfig(l, ""), shellescape.Quote(binary), shellescape.Quote(l.Config))
	return ProcessSpec{
		Name:        ContainerdProcessName,
		Path:        "/bin/sh",
		Args:        []string{"-c", script},
		ReadySocket: l.Address,
	}
}

// KillContainers kills every container of the containerd laid out as l,
// and its shims, whether or not containerd still runs, then removes what
// they leave behind: rootfs mounts under l.State and l.Root, the cgroups
// under l.CgroupParent (in every hierarchy), and the shims' sockets in
// /run/containerd/s. It does not stop containerd itself, nor remove its
// directories. It is idempotent.
//
// Containers are found by cgroup (every process under l.CgroupParent),
// shims by their -address argument (l.Address).
func KillContainers(ctx context.Context, l ContainerdLayout) error {
	if l.CgroupParent == "" || l.CgroupParent == "/" || l.Address == "" {
		return invalidf("containerd layout without a cgroup parent or address: %+v", l)
	}
	var errs []error
	hierarchies, err := cgroupMounts()
	if err != nil {
		return err
	}
	// A paused task's processes are frozen, and a frozen process does not
	// die of SIGKILL until thawed.
	thaw(hierarchies, l.CgroupParent)
	// Containers first: a shim outlives its container's processes, not the
	// reverse.
	for round := 0; ; round++ {
		pids := cgroupPids(hierarchies, l.CgroupParent)
		if len(pids) == 0 {
			break
		}
		if round == 10 {
			errs = append(errs, fmt.Errorf("processes keep appearing in cgroup %s", l.CgroupParent))
			break
		}
		for _, pid := range pids {
			unix.Kill(pid, unix.SIGKILL)
		}
		for _, pid := range pids {
			if err := killWait(ctx, pid, 0); err != nil {
				errs = append(errs, err)
			}
		}
	}
	shims := findShims(l.Address)
	for _, s := range shims {
		if err := killWait(ctx, s.pid, s.start); err != nil {
			errs = append(errs, err)
		}
	}
	// Shim sockets: /run/containerd/s/<sha256 of address/namespace/id>.
	ids := map[[2]string]bool{}
	for _, s := range shims {
		ids[[2]string{s.namespace, s.id}] = true
	}
	taskRoot := filepath.Join(l.State, "io.containerd.runtime.v2.task")
	if nss, err := os.ReadDir(taskRoot); err == nil {
		for _, ns := range nss {
			cs, _ := os.ReadDir(filepath.Join(taskRoot, ns.Name()))
			for _, c := range cs {
				ids[[2]string{ns.Name(), c.Name()}] = true
			}
		}
	}
	for k := range ids {
		sum := sha256.Sum256([]byte(filepath.Join(l.Address, k[0], k[1])))
		sock := filepath.Join(shimSocketDir, hex.EncodeToString(sum[:]))
		if err := os.Remove(sock); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	var dirs []string
	for _, d := range []string{l.State, l.Root} {
		if d != "" {
			dirs = append(dirs, d)
		}
	}
	if err := unmountUnder(dirs...); err != nil {
		errs = append(errs, err)
	}
	if err := removeCgroups(ctx, hierarchies, l.CgroupParent); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// shimSocketDir is where containerd 1.6's runc shims listen (whatever
// containerd's --state).
const shimSocketDir = "/run/containerd/s"

type shimProc struct {
	pid           int
	start         uint64
	namespace, id string
}

// findShims returns the containerd shims serving the containerd at
// address, from their command lines.
func findShims(address string) []shimProc {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []shimProc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(data) == 0 {
			continue
		}
		args := strings.Split(string(bytes.TrimRight(data, "\x00")), "\x00")
		if !strings.HasPrefix(filepath.Base(args[0]), "containerd-shim") {
			continue
		}
		var s shimProc
		match := false
		for k := 1; k+1 < len(args); k++ {
			switch args[k] {
			case "-address", "--address":
				match = args[k+1] == address
			case "-namespace", "--namespace":
				s.namespace = args[k+1]
			case "-id", "--id":
				s.id = args[k+1]
			}
		}
		if !match {
			continue
		}
		s.pid = pid
		s.start, _ = procStart(pid)
		out = append(out, s)
	}
	return out
}

// cgroupMounts returns the mount points of the cgroup hierarchies (v1
// controllers, named hierarchies and the v2 unified one).
func cgroupMounts() ([]string, error) {
	ms, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup", "cgroup2"))
	if err != nil {
		return nil, err
	}
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.Mountpoint
	}
	return out, nil
}

// cgroupDirs returns the directories of cgroup parent (and below) in
// every hierarchy, deepest first.
func cgroupDirs(hierarchies []string, parent string) []string {
	var out []string
	for _, h := range hierarchies {
		root := filepath.Join(h, parent)
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				out = append(out, p)
			}
			return nil
		})
	}
	slices.SortFunc(out, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	return out
}

// cgroupPids returns the processes in cgroup parent and below.
func cgroupPids(hierarchies []string, parent string) []int {
	seen := map[int]bool{}
	var out []int
	for _, d := range cgroupDirs(hierarchies, parent) {
		data, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 0 && !seen[pid] {
				seen[pid] = true
				out = append(out, pid)
			}
		}
	}
	return out
}

// thaw unfreezes cgroup parent and everything below it (v1 freezer,
// v2 cgroup.freeze).
func thaw(hierarchies []string, parent string) {
	for _, d := range cgroupDirs(hierarchies, parent) {
		if _, err := os.Stat(filepath.Join(d, "freezer.state")); err == nil {
			os.WriteFile(filepath.Join(d, "freezer.state"), []byte("THAWED"), 0)
		}
		if _, err := os.Stat(filepath.Join(d, "cgroup.freeze")); err == nil {
			os.WriteFile(filepath.Join(d, "cgroup.freeze"), []byte("0"), 0)
		}
	}
}

// removeCgroups removes cgroup parent and everything below it, in every
// hierarchy. A cgroup whose last process just died may refuse (EBUSY) for
// a moment: it retries for a few seconds.
func removeCgroups(ctx context.Context, hierarchies []string, parent string) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		var left []string
		for _, d := range cgroupDirs(hierarchies, parent) {
			if err := unix.Rmdir(d); err != nil && !errors.Is(err, unix.ENOENT) {
				left = append(left, d)
			}
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("could not remove cgroups %s", strings.Join(left, ", "))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// RemoveCgroupTrees removes each cgroup directory in dirs and everything
// below it, deepest first, retrying for a few seconds while one refuses
// (EBUSY, its last process just died). A directory that does not exist
// is fine.
func RemoveCgroupTrees(ctx context.Context, dirs ...string) error {
	return removeCgroups(ctx, dirs, "")
}

// ScheddArgs are shoal-schedd's flags pointing it at its node's
// containerd (placeholders expanded per node), for Spec.Args["schedd"].
func ScheddArgs() []string {
	l := ContainerdTemplate
	return []string{"--containerd", l.Address, "--namespace", l.Namespace, "--runc-root", l.RuncRoot, "--cgroup-parent", l.CgroupParent}
}
