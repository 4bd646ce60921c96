package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/shoal-dev/shoal/pkg/client"
	"github.com/shoal-dev/shoal/pkg/devcluster"
	"github.com/shoal-dev/shoal/pkg/volarchive"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
	volv1 "github.com/shoal-dev/shoal/proto/shoal/vol/v1"
)

// volCluster is a dev cluster whose nodes run statd, schedd (tasks on the
// host network) and vold, each node with its own containerd.
type volCluster struct {
	*devcluster.Cluster
	t    *testing.T // the running (sub)test
	root *testing.T // the test owning the cluster: clients live as long
	ids  []string   // node IDs, index 0 is node 1

	mu   sync.Mutex
	vols map[int]volv1.VolumesClient
	kvs  map[int]volv1.KVClient
	sms  map[int]volv1.StateMachinesClient
}

// replaceAfter is how long a volume's member may be dead before vold
// replaces it; short, so that the test does not wait for the default.
const replaceAfter = "4s"

func newVolCluster(t *testing.T, nodes int, voldArgs ...string) *volCluster {
	t.Helper()
	name := fmt.Sprintf("v%d", rand.IntN(1_000_000))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := devcluster.Up(ctx, devcluster.Spec{
		Name:    name,
		Nodes:   nodes,
		Subnet:  devcluster.AutoSubnet,
		BinDir:  binDir,
		Daemons: []string{"statd", "schedd", "vold"},
		Extra:   []devcluster.ProcessSpec{devcluster.ContainerdProcess("")},
		Args: map[string][]string{
			"statd":  {"--node-name", "n{node}"},
			"schedd": append(devcluster.ScheddArgs(), "--task-network", "host"),
			"vold":   append([]string{"--replace-after", replaceAfter}, voldArgs...),
		},
		Bootstrap: true,
	})
	if err != nil {
		t.Fatalf("dev cluster up: %v", err)
	}
	vc := &volCluster{Cluster: c, t: t, root: t, vols: map[int]volv1.VolumesClient{}, kvs: map[int]volv1.KVClient{}, sms: map[int]volv1.StateMachinesClient{}}
	t.Cleanup(vc.down)
	for i := 1; i <= nodes; i++ {
		vc.ids = append(vc.ids, clusterStatus(t, nodeClient(t, c, i)).GetNodeId())
	}
	waitFor(t, 60*time.Second, "schedd and vold ready on every node", func() bool {
		for i := 1; i <= nodes; i++ {
			if _, _, code := vc.ctl(i, "service", "ls"); code != 0 {
				return false
			}
			if _, _, code := vc.ctl(i, "volume", "ls"); code != 0 {
				return false
			}
		}
		return true
	})
	return vc
}

func (c *volCluster) loadImage() {
	c.t.Helper()
	c.mustCtl(1, "image", "load", writeTestImage(c.t))
}

func (c *volCluster) down() {
	t := c.t
	if t.Failed() || os.Getenv("SHOAL_E2E_LOGS") != "" {
		for i := 1; i <= c.Nodes(); i++ {
			for _, d := range []string{"vold", "schedd"} {
				if b, err := os.ReadFile(c.LogPath(i, d)); err == nil {
					lines := strings.Split(strings.TrimSpace(string(b)), "\n")
					t.Logf("node %d %s log:\n%s", i, d, strings.Join(lines[max(0, len(lines)-logTail):], "\n"))
				}
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Services first, so that their tasks release the volumes.
	c.Ctl(ctx, 1, "service", "rm", "writer")
	c.Ctl(ctx, 1, "service", "rm", "deployed")
	if err := c.Down(context.Background()); err != nil {
		t.Errorf("dev cluster down: %v", err)
	}
}

// run runs a subtest with the cluster's helpers failing that subtest.
func (c *volCluster) run(t *testing.T, name string, f func(t *testing.T)) {
	t.Run(name, func(st *testing.T) {
		c.t = st
		defer func() { c.t = t }()
		f(st)
	})
}

func (c *volCluster) ctl(i int, args ...string) (string, string, int) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, errOut, code, err := c.Ctl(ctx, i, args...)
	if err != nil {
		c.t.Fatal(err)
	}
	return out, errOut, code
}

func (c *volCluster) mustCtl(i int, args ...string) string {
	c.t.Helper()
	out, errOut, code := c.ctl(i, args...)
	if code != 0 {
		c.t.Fatalf("shoalctl %s on node %d: exit %d: %s%s", strings.Join(args, " "), i, code, out, errOut)
	}
	return out
}

func (c *volCluster) volumes(i int) volv1.VolumesClient {
	c.mu.Lock()
	defer c.mu.Unlock()
	if v := c.vols[i]; v != nil {
		return v
	}
	conn, err := client.Dial(c.RunDir(i), "vold", client.Retry{Attempts: 20, Max: 500 * time.Millisecond})
	if err != nil {
		c.t.Fatal(err)
	}
	c.root.Cleanup(func() { conn.Close() })
	c.vols[i] = volv1.NewVolumesClient(conn)
	c.kvs[i] = volv1.NewKVClient(conn)
	c.sms[i] = volv1.NewStateMachinesClient(conn)
	return c.vols[i]
}

func (c *volCluster) machines(i int) volv1.StateMachinesClient {
	c.volumes(i)
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sms[i]
}

func (c *volCluster) kv(i int) volv1.KVClient {
	c.volumes(i)
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.kvs[i]
}

func (c *volCluster) inspect(i int, name string) (*volv1.Volume, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// With digests: converged compares them.
	return c.volumes(i).InspectVolume(ctx, &volv1.InspectVolumeRequest{Name: name, Digests: true})
}

// node returns the index of the node with ID id (0 if none).
func (c *volCluster) node(id string) int {
	for k, v := range c.ids {
		if v == id {
			return k + 1
		}
	}
	return 0
}

// memberNodes returns the node indexes of a volume's members.
func (c *volCluster) memberNodes(v *volv1.Volume) []int {
	var out []int
	for _, m := range v.GetMembers() {
		out = append(out, c.node(m.GetNode()))
	}
	return out
}

// outsideNode returns the last node that holds no replica of the volume
// (0 if every node does).
func (c *volCluster) outsideNode(v *volv1.Volume) int {
	members, outside := c.memberNodes(v), 0
	for i := 1; i <= c.Nodes(); i++ {
		if !slices.Contains(members, i) {
			outside = i
		}
	}
	return outside
}

// converged reports whether every member of the volume is alive, has
// applied the same index and holds the same data digest.
func converged(v *volv1.Volume, want int) bool {
	ms := v.GetMembers()
	if len(ms) != want {
		return false
	}
	for _, m := range ms {
		if !m.GetAlive() || m.GetDigest() == "" || m.GetApplied() != ms[0].GetApplied() || m.GetDigest() != ms[0].GetDigest() {
			return false
		}
	}
	return true
}

// fileLines reads a file through node i's mount of the volume.
func (c *volCluster) readVolumeFile(i int, volume, file string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.volumes(i).Mount(ctx, &volv1.MountRequest{Name: volume, User: "e2e-reader"})
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(resp.GetPath(), file))
	return string(b), err
}

func (c *volCluster) releaseReader(i int, volume string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c.volumes(i).Unmount(ctx, &volv1.UnmountRequest{Name: volume, User: "e2e-reader"})
}

// openUnlinked writes a file with content into volume through node i's
// mount (mounted for user e2e-held), opens it and unlinks it: the open
// file it returns, closed when the test ends, is one the volume holds.
func (c *volCluster) openUnlinked(t *testing.T, i int, volume, content string) *os.File {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := c.volumes(i).Mount(ctx, &volv1.MountRequest{Name: volume, User: "e2e-held"})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(m.GetPath(), "held")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	return f
}

// writerTaskJSON is what tells a task from its restart.
type writerTaskJSON struct {
	ID, State, Started string
	Restarts           uint32
}

// writerTask returns the writer service's running task.
func (c *volCluster) writerTask(t *testing.T) writerTaskJSON {
	t.Helper()
	var ps []writerTaskJSON
	out := c.mustCtl(1, "service", "ps", "writer", "-o", "json")
	if err := json.Unmarshal([]byte(out), &ps); err != nil {
		t.Fatalf("service ps -o json: %v: %s", err, out)
	}
	if len(ps) != 1 || ps[0].State != "running" {
		t.Fatalf("writer tasks: %+v", ps)
	}
	return ps[0]
}

// lastCount returns the last counter a writer appended to its log.
func lastCount(s string) int {
	lines := strings.Fields(s)
	if len(lines) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(lines[len(lines)-1])
	return n
}

// levelSteps checks volume up on c before and after node 3's vold is
// upgraded by upgrade (a restart with something changed): before, the
// volume stays at level 1, where a file unlinked while open is held
// alike on every replica and mkfifo fails with EPERM; after, the leader
// raises it to level 2, and a FIFO made through node 1's mount is one on
// every replica.
func levelSteps(t *testing.T, c *volCluster, upgrade func()) {
	c.mustCtl(1, "volume", "create", "up")
	state := func(level uint32, held uint64) func() bool {
		return func() bool {
			v, err := c.inspect(2, "up")
			return err == nil && converged(v, 3) && v.GetLevel() == level && v.GetHeldFiles() == held
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := c.volumes(1).Mount(ctx, &volv1.MountRequest{Name: "up", User: "e2e-level"})
	if err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(m.GetPath(), "fifo")
	f := c.openUnlinked(t, 1, "up", "held at every level")
	waitFor(t, 10*time.Second, "up at level 1 holds the open file on three agreeing replicas", state(1, 1))
	if err := syscall.Mkfifo(fifo, 0o644); !errors.Is(err, syscall.EPERM) {
		t.Fatalf("mkfifo at level 1: %v, want EPERM", err)
	}
	c.heldBackBy(t, "up", 3)
	upgrade()
	start := time.Now()
	waitFor(t, 30*time.Second, "up raised to level 2 once node 3's vold lets it", state(2, 1))
	t.Logf("raised %v after node 3's vold was ready", time.Since(start).Round(time.Millisecond))
	if v, _ := c.inspect(2, "up"); !maps.Equal(memberVoldLevels(v), map[string]uint32{c.ids[0]: 2, c.ids[1]: 2, c.ids[2]: 2}) {
		t.Errorf("members' vold levels after the upgrade = %v, want 2 on every node", memberVoldLevels(v))
	}
	if out := c.mustCtl(3, "volume", "inspect", "up"); !regexp.MustCompile(`(?m)^LEVEL +2$`).MatchString(out) {
		t.Errorf("volume inspect does not show level 2:\n%s", out)
	}
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatalf("mkfifo at level 2: %v", err)
	}
	if b, err := io.ReadAll(f); err != nil || string(b) != "held at every level" {
		t.Fatalf("the file held across the upgrade reads %q, %v", b, err)
	}
	f.Close()
	waitFor(t, 10*time.Second, "up frees the file at its last close, its replicas agreeing", state(2, 0))
	var st syscall.Stat_t
	if err := syscall.Stat(fifo, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFIFO {
		t.Fatalf("stat of the FIFO: mode %o, %v", st.Mode, err)
	}
}

// memberVoldLevels returns the level each member's vold lets volumes
// reach, by node, as InspectVolume reports it.
func memberVoldLevels(v *volv1.Volume) map[string]uint32 {
	out := map[string]uint32{}
	for _, m := range v.GetMembers() {
		out[m.GetNode()] = m.GetVoldLevel()
	}
	return out
}

// heldBackBy checks that inspect shows volume at level 1 with node i's
// vold letting 1 and the others' 2, and that shoalctl's LEVEL line names
// node i as what holds it back.
func (c *volCluster) heldBackBy(t *testing.T, volume string, i int) {
	t.Helper()
	want := map[string]uint32{}
	for k, id := range c.ids {
		want[id] = 2
		if k+1 == i {
			want[id] = 1
		}
	}
	v, err := c.inspect(2, volume)
	if err != nil || v.GetLevel() != 1 || !maps.Equal(memberVoldLevels(v), want) {
		t.Fatalf("inspect %s: level %d, members' vold levels %v, err %v; want level 1 and %v", volume, v.GetLevel(), memberVoldLevels(v), err, want)
	}
	line := fmt.Sprintf("(?m)^LEVEL +1 \\(2 once every member's vold lets it: node %s's vold lets 1\\)$", regexp.QuoteMeta(c.ids[i-1]))
	if out := c.mustCtl(1, "volume", "inspect", volume); !regexp.MustCompile(line).MatchString(out) {
		t.Errorf("volume inspect %s does not name node %d as holding it back:\n%s", volume, i, out)
	}
}

// TestVolumeLevelRaisedAfterUpgrade runs levelSteps with node 3's vold
// pinned to level 1 (volume_level, what an operator does to keep a
// downgrade possible; a vold from before levels publishes no level,
// which counts as 1), then restarted without the pin.
func TestVolumeLevelRaisedAfterUpgrade(t *testing.T) {
	dir := t.TempDir()
	conf := func(i int, text string) {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("vold-%d.toml", i)), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	conf(1, "")
	conf(2, "")
	conf(3, "volume_level = 1\n")
	c := newVolCluster(t, 3, "--config", filepath.Join(dir, "vold-{node}.toml"))
	levelSteps(t, c, func() {
		conf(3, "")
		c.restartVold(t, 3)
	})
}

// restartVold stops node i's vold and starts it again.
func (c *volCluster) restartVold(t *testing.T, i int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Stop(ctx, i, "vold", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx, i, "vold"); err != nil {
		t.Fatal(err)
	}
}

// TestVolumeUpgradeFromOldVold runs levelSteps with a real old vold on
// node 3 (SHOAL_OLD_VOLD, which `make upgrade-check OLD=<rev>` builds from
// that commit, as `make test` does after e2e for the default OLD; the
// test is skipped without it), then that node's vold replaced with this
// one.
func TestVolumeUpgradeFromOldVold(t *testing.T) {
	old := os.Getenv("SHOAL_OLD_VOLD")
	if old == "" {
		t.Skip("SHOAL_OLD_VOLD is not set (make upgrade-check sets it)")
	}
	flag := oldOnNode3(t, "shoal-vold", old)
	c := newVolCluster(t, 3)
	levelSteps(t, c, func() {
		if err := os.Remove(flag); err != nil {
			t.Fatal(err)
		}
		c.restartVold(t, 3)
	})
	downgradeSteps(t, c, func() {
		if err := os.WriteFile(flag, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		c.restartVold(t, 3)
	})
}

// oldOnNode3 makes node 3 of the clusters the test starts run program
// (a daemon's binary) from path old while the returned flag file exists,
// and this build's elsewhere or once the flag is removed: binDir is a
// directory of links to this build's binaries and a wrapper for program,
// which reads the flag at each start.
func oldOnNode3(t *testing.T, program, old string) (flag string) {
	t.Helper()
	bin, flag := t.TempDir(), filepath.Join(t.TempDir(), "old")
	entries, err := os.ReadDir(binDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != program {
			if err := os.Symlink(filepath.Join(binDir, e.Name()), filepath.Join(bin, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}
	wrapper := fmt.Sprintf("#!/bin/sh\ncase \"$*\" in *\"/n3/\"*) [ -f %s ] && exec %s \"$@\";; esac\nexec %s \"$@\"\n",
		flag, old, filepath.Join(binDir, program))
	if err := os.WriteFile(filepath.Join(bin, program), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	prev := binDir
	t.Cleanup(func() { binDir = prev })
	binDir = bin
	return flag
}

// downgradeSteps follows levelSteps: node 3's vold goes back to one from
// before levels (downgrade), which publishes no level, so node 3's
// document still shows the level the newer vold published. A volume
// created on the three nodes then stays at level 1 through several
// repair rounds, its replicas agreeing: the volds ask each other's level
// (a ping's answer carries it) before they raise a volume, and the old
// vold's answer carries none. The raised volume goes first, as an
// operator would have to: the old vold would apply its entries its own
// way.
func downgradeSteps(t *testing.T, c *volCluster, downgrade func()) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, user := range []string{"e2e-level", "e2e-held"} {
		if _, err := c.volumes(1).Unmount(ctx, &volv1.UnmountRequest{Name: "up", User: user}); err != nil {
			t.Fatalf("unmount up for %s: %v", user, err)
		}
	}
	c.mustCtl(1, "volume", "rm", "up")
	downgrade()
	st := nodeClient(t, c.Cluster, 1)
	resp, err := st.Get(ctx, &statev1.GetRequest{Key: "/nodes/" + c.ids[2]})
	if err != nil {
		t.Fatal(err)
	}
	if l := resp.GetDocument().GetFields()["vold_fs_level"].GetIntValue(); l != 2 {
		t.Fatalf("node 3's document shows level %d after the downgrade, want the newer vold's 2 (what this test is about)", l)
	}

	c.mustCtl(1, "volume", "create", "down")
	f := c.openUnlinked(t, 1, "down", "held by the old rules")
	defer f.Close()
	var last string
	defer func() {
		if t.Failed() {
			t.Logf("down's last state: %s", last)
		}
	}()
	at1 := func() bool {
		v, err := c.inspect(2, "down")
		last = fmt.Sprintf("level %d, held %d, members %v, err %v", v.GetLevel(), v.GetHeldFiles(), v.GetMembers(), err)
		return err == nil && converged(v, 3) && v.GetLevel() == 1 && v.GetHeldFiles() == 1
	}
	waitFor(t, 30*time.Second, "down at level 1 holds the open file on three agreeing replicas", at1)
	// A leader raises a volume in the first repair round (every 2 s) in
	// which it may: wait four rounds.
	time.Sleep(8 * time.Second)
	if !at1() {
		t.Fatal("down with node 3 downgraded left level 1, or its replicas disagree")
	}
	// inspect judges node 3's vold as the raise does, not by its document.
	c.heldBackBy(t, "down", 3)
	m, err := c.volumes(1).Mount(ctx, &volv1.MountRequest{Name: "down", User: "e2e-level"})
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(m.GetPath(), "fifo"), 0o644); !errors.Is(err, syscall.EPERM) {
		t.Fatalf("mkfifo on down with node 3 downgraded: %v, want EPERM", err)
	}
	// The old vold exports nothing itself: shoalctl on its node says so
	// and copies through a mount.
	if err := os.WriteFile(filepath.Join(m.GetPath(), "kept"), []byte("kept\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "down.tar")
	if _, errOut, code := c.ctl(3, "volume", "export", "down", "-o", archive); code != 0 ||
		!strings.Contains(errOut, "older vold") || !strings.Contains(errOut, "copying through a mount") || !strings.Contains(errOut, "exported down: 2 entries, 5B") {
		t.Errorf("volume export on node 3 (the old vold): exit %d: %s", code, errOut)
	}
}

// TestVolumeUpdate grows a volume of one replica to three while it is
// written (the new replicas catch up from a snapshot as learners, then
// vote), changes its size limit, shrinks it to two replicas (never losing
// the leader's) and to one, and checks that updates that cannot be made
// are refused with nothing changed.
func TestVolumeUpdate(t *testing.T) {
	c := newVolCluster(t, 3)
	c.mustCtl(1, "volume", "create", "grow", "--replicas", "1", "--size", "64Mi")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	m, err := c.volumes(1).Mount(ctx, &volv1.MountRequest{Name: "grow", User: "e2e-writer"})
	if err != nil {
		t.Fatal(err)
	}
	write := func(file string, data []byte) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(m.GetPath(), file), data, 0o644); err != nil {
			t.Fatalf("write %s: %v", file, err)
		}
	}
	bulk := bytes.Repeat([]byte("0123456789abcdef"), 512<<10) // 8 MiB, for a snapshot worth sending
	write("bulk", bulk)
	write("before", []byte("written with one replica"))

	members := func() int {
		v, err := c.inspect(1, "grow")
		if err != nil {
			t.Fatal(err)
		}
		return len(v.GetMembers())
	}
	for _, args := range [][]string{{"--replicas", "4"}, {"--replicas", "0"}, {"--replicas", "8"}, {}} {
		out, errOut, code := c.ctl(1, append([]string{"volume", "update", "grow"}, args...)...)
		if code == 0 {
			t.Errorf("volume update grow %v succeeded: %s", args, out)
		}
		if len(args) > 0 && args[1] == "4" && !strings.Contains(errOut, "cannot have 4") {
			t.Errorf("volume update grow --replicas 4 on three nodes: %s", errOut)
		}
	}
	if _, _, code := c.ctl(1, "volume", "update", "nosuch", "--replicas", "3"); code == 0 {
		t.Error("volume update of a missing volume succeeded")
	}
	if n := members(); n != 1 {
		t.Fatalf("refused updates left %d members, want 1", n)
	}

	c.mustCtl(1, "volume", "update", "grow", "--replicas", "3", "--detach")
	write("during", []byte("written while replicas join"))
	// Asked again from another node, which waits until they vote.
	_, errOut, code := c.ctl(2, "volume", "update", "grow", "--replicas", "3")
	if code != 0 || !strings.Contains(errOut, "grow: 3 of 3 replicas voting, healthy") {
		t.Fatalf("volume update grow --replicas 3: exit %d: %s", code, errOut)
	}
	t.Logf("growing: %s", strings.ReplaceAll(strings.TrimSpace(errOut), "\n", " | "))
	var v *volv1.Volume
	waitFor(t, 30*time.Second, "grow on three voting replicas with agreeing digests", func() bool {
		v, err = c.inspect(1, "grow")
		return err == nil && converged(v, 3) && v.GetReplicas() == 3 && !slices.ContainsFunc(v.GetMembers(), func(m *volv1.Member) bool { return m.GetRole() == "learner" })
	})
	for file, want := range map[string]string{"before": "written with one replica", "during": "written while replicas join"} {
		if got, err := c.readVolumeFile(3, "grow", file); err != nil || got != want {
			t.Fatalf("read %s through node 3: %q, %v", file, got, err)
		}
	}
	c.releaseReader(3, "grow")

	// The size limit: not below what the volume holds, not beyond a
	// member's room; lowered, a write past it fails with ENOSPC, and
	// raised again it succeeds.
	size := func() int64 {
		v, err := c.inspect(1, "grow")
		if err != nil {
			t.Fatal(err)
		}
		return v.GetSizeBytes()
	}
	if _, errOut, code := c.ctl(1, "volume", "update", "grow", "--size", "4Mi"); code == 0 || !strings.Contains(errOut, "free space in it first") {
		t.Errorf("volume update grow --size 4Mi, holding 8 MiB: exit %d: %s", code, errOut)
	}
	var fs syscall.Statfs_t
	if err := syscall.Statfs(os.TempDir(), &fs); err != nil {
		t.Fatal(err)
	}
	if avail := int64(fs.Bavail) * fs.Bsize; avail < 1<<40-64<<20 {
		if _, errOut, code := c.ctl(1, "volume", "update", "grow", "--size", "1Ti", "--replicas", "2"); code == 0 || !strings.Contains(errOut, "cannot grow to 1.0 TiB") {
			t.Errorf("volume update grow --size 1Ti with %d bytes free: exit %d: %s", avail, code, errOut)
		}
	} else {
		t.Logf("not checked: growing beyond the nodes' room (%d bytes free is more than the largest size)", avail)
	}
	if got := size(); got != 64<<20 {
		t.Fatalf("refused size updates left %d bytes, want 64 MiB", got)
	}
	if n := members(); n != 3 {
		t.Fatalf("a refused update with --replicas 2 left %d members, want 3", n)
	}
	// The answer shows the volume as its members hold it: healthy, though
	// a spare follower receives the new limit up to 10 ms late.
	if out := c.mustCtl(2, "volume", "update", "grow", "--size", "12Mi", "-o", "json"); !strings.Contains(out, `"health": "healthy"`) {
		t.Errorf("volume update grow --size 12Mi answered a volume that is not healthy:\n%s", out)
	}
	// Node 1 reads the document from its statd, which hears of node 2's
	// write a moment later.
	waitFor(t, 10*time.Second, "node 1 shows the size of 12 MiB", func() bool { return size() == 12<<20 })
	more := bytes.Repeat([]byte{'x'}, 6<<20)
	if err := os.WriteFile(filepath.Join(m.GetPath(), "more"), more, 0o644); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("6 MiB more into 12 MiB holding 8: %v, want ENOSPC", err)
	}
	c.mustCtl(3, "volume", "update", "grow", "--size", "32Mi")
	write("more", more)

	// The growth's steps, counted before a node restarts below.
	sum := func(name string) float64 {
		total := 0.0
		for i := 1; i <= 3; i++ {
			total += max(metricValue(c.voldMetrics(t, i), name), 0)
		}
		return total
	}
	if steps := sum("shoal_vold_scale_steps_total"); steps < 2 {
		t.Errorf("scale steps counted: %v, want at least 2 (learners added, promoted)", steps)
	}

	// A shrink removes a voter whose node is dead before the newest: with
	// the leadership on node 1 (the writer's), kill the node of a replica
	// that is neither node 1's nor the newest, and shrink to two.
	k := 0
	waitFor(t, 20*time.Second, "the leadership on node 1, whose mount writes", func() bool {
		k++
		write(fmt.Sprintf("lead-%d", k), []byte("leadership follows the writer"))
		v, err = c.inspect(1, "grow")
		return err == nil && v.GetLeader() == c.ids[0]
	})
	var newest uint64
	for _, m := range v.GetMembers() {
		newest = max(newest, m.GetReplica())
	}
	victim := 0
	for _, m := range v.GetMembers() {
		if i := c.node(m.GetNode()); i != 1 && m.GetReplica() != newest && victim == 0 {
			victim = i
		}
	}
	if victim == 0 {
		t.Fatalf("no member to kill in %v", v.GetMembers())
	}
	if err := c.Kill(ctx, victim, ""); err != nil {
		t.Fatal(err)
	}
	// Shrink 1.5 s after the kill, when the volds have missed several of
	// each other's pings (an election timeout is 1 s) but statd does not
	// call the node dead yet: the leader goes by what it hears itself.
	// (Going by statd, it once removed the newest replica here, and the
	// two left, one of them dead, had no quorum.)
	time.Sleep(1500 * time.Millisecond)
	t.Logf("node %d's state in node 1's statd at the shrink: %s", victim, memberState(t, nodeClient(t, c.Cluster, 1), c.ids[victim-1]))
	c.mustCtl(1, "volume", "update", "grow", "--replicas", "2")
	waitFor(t, 30*time.Second, "grow on two replicas with agreeing digests", func() bool {
		v, err = c.inspect(1, "grow")
		return err == nil && converged(v, 2) && v.GetReplicas() == 2
	})
	if nodes := c.memberNodes(v); !slices.Contains(nodes, 1) || slices.Contains(nodes, victim) {
		t.Errorf("the shrink with node %d dead left the members on nodes %v, want node 1's and the newest replica's", victim, nodes)
	}
	if err := c.Start(ctx, victim, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, fmt.Sprintf("node %d's vold back", victim), func() bool {
		_, _, code := c.ctl(victim, "volume", "ls")
		return code == 0
	})
	write("after", []byte("written with two replicas"))
	if got, err := c.readVolumeFile(2, "grow", "bulk"); err != nil || got != string(bulk) {
		t.Fatalf("read bulk through node 2 after the shrink: %d bytes, %v", len(got), err)
	}
	if got, err := c.readVolumeFile(2, "grow", "after"); err != nil || got != "written with two replicas" {
		t.Fatalf("read after through node 2: %q, %v", got, err)
	}

	// Down to the leader's replica alone, while every node has the volume
	// mounted: the mounts on nodes whose replica goes carry on through the
	// remaining one.
	if _, err := c.readVolumeFile(3, "grow", "before"); err != nil {
		t.Fatal(err)
	}
	c.mustCtl(1, "volume", "update", "grow", "--replicas", "1")
	waitFor(t, 30*time.Second, "grow on one replica", func() bool {
		v, err = c.inspect(1, "grow")
		return err == nil && converged(v, 1) && v.GetReplicas() == 1
	})
	for i := 1; i <= 3; i++ {
		if got, err := c.readVolumeFile(i, "grow", "after"); err != nil || got != "written with two replicas" {
			t.Fatalf("read after through node %d with one replica left: %q, %v", i, got, err)
		}
	}
	write("last", []byte("written with one replica left"))
	if got, err := c.readVolumeFile(3, "grow", "last"); err != nil || got != "written with one replica left" {
		t.Fatalf("read last through node 3: %q, %v", got, err)
	}
	for i := 1; i <= 3; i++ {
		c.releaseReader(i, "grow")
	}
	// The replicas removed (one at each shrink) are destroyed on their
	// nodes once they retire (the dead one's once its node is back).
	waitFor(t, 30*time.Second, "the two replicas removed destroyed", func() bool { return sum("shoal_vold_replicas_destroyed_total") >= 2 })

	// A learner whose node dies before it votes is removed, and another
	// placed: grow to two and kill the new member's node as soon as the
	// volume's document names it. A learner is promoted two repair rounds
	// (2 s each) after it joins at the soonest, so it dies a learner, and
	// the leader's log says which step removed it.
	c.mustCtl(1, "volume", "update", "grow", "--replicas", "2", "--detach")
	dying := 0
	waitFor(t, 10*time.Second, "a second member named", func() bool {
		ictx, icancel := context.WithTimeout(ctx, 5*time.Second)
		defer icancel()
		v, err := c.volumes(1).InspectVolume(ictx, &volv1.InspectVolumeRequest{Name: "grow"})
		if err != nil {
			return false
		}
		for _, m := range v.GetMembers() {
			if i := c.node(m.GetNode()); i != 1 {
				dying = i
			}
		}
		return dying != 0
	})
	if err := c.Kill(ctx, dying, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "grow on two replicas again, none on the dead node", func() bool {
		v, err = c.inspect(1, "grow")
		return err == nil && converged(v, 2) && v.GetReplicas() == 2 && !slices.Contains(c.memberNodes(v), dying)
	})
	logged, err := os.ReadFile(c.LogPath(1, "vold"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(logged), "remove learners ["+c.ids[dying-1]+"/") {
		t.Errorf("node 1's vold did not log removing node %d's learner", dying)
	}
	if got, err := c.readVolumeFile(6-1-dying, "grow", "last"); err != nil || got != "written with one replica left" {
		t.Fatalf("read last through node %d, the new member's: %q, %v", 6-1-dying, got, err)
	}
	c.releaseReader(6-1-dying, "grow")
}

// TestVolumes is the volume acceptance on four nodes (three replicas and
// a spare): a service writes through its node's FUSE mount while the
// leader's node is killed and comes back, replicas end identical, and a
// node lost for good is replaced on the spare.
func TestVolumes(t *testing.T) {
	c := newVolCluster(t, 4)
	c.loadImage()

	c.run(t, "BadInput", func(t *testing.T) {
		for _, args := range [][]string{
			{"volume", "create", "Bad_Name"},
			{"volume", "create", "x", "--replicas", "0"},
			{"volume", "create", "x", "--size", "lots"},
			{"volume", "inspect", "nosuch"},
			{"volume", "rm", "nosuch"},
			{"volume", "mount", "nosuch"},
		} {
			if _, _, code := c.ctl(1, args...); code == 0 {
				t.Errorf("shoalctl %s succeeded", strings.Join(args, " "))
			}
		}
		// Bigger than any node's free space: refused, nothing written.
		if _, errOut, code := c.ctl(2, "volume", "create", "huge", "--size", "1T"); code == 0 || !strings.Contains(errOut, "does not fit on any node") {
			t.Errorf("volume create --size 1T: exit %d: %s", code, errOut)
		}
		if out := c.mustCtl(3, "volume", "ls", "-o", "json"); strings.Contains(out, "huge") {
			t.Errorf("a refused volume is listed: %s", out)
		}
		// More replicas than nodes: capped at one a node, and said so.
		if _, errOut, code := c.ctl(2, "volume", "create", "capped", "--replicas", "6", "--size", "1Mi"); code != 0 || !strings.Contains(errOut, "has 4 replicas, not the 6 asked for") {
			t.Errorf("volume create --replicas 6 on four nodes: exit %d: %s", code, errOut)
		}
		c.mustCtl(1, "volume", "rm", "capped")
		// Writes beyond the size limit fail with ENOSPC and corrupt nothing.
		c.mustCtl(1, "volume", "create", "tiny", "--size", "1Mi")
		if _, errOut, code := c.ctl(2, "volume", "create", "tiny"); code == 0 || !strings.Contains(errOut, "already exists") {
			t.Errorf("second volume create tiny: exit %d: %s", code, errOut)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		m, err := c.volumes(2).Mount(ctx, &volv1.MountRequest{Name: "tiny", User: "e2e-enospc"})
		if err != nil {
			t.Fatal(err)
		}
		big := make([]byte, 2<<20)
		for i := range big {
			big[i] = byte(i)
		}
		err = os.WriteFile(filepath.Join(m.GetPath(), "big"), big, 0o644)
		if !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("writing 2 MiB into a 1 MiB volume: %v, want ENOSPC", err)
		}
		if err := os.Remove(filepath.Join(m.GetPath(), "big")); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(m.GetPath(), "small"), big[:512<<10], 0o644); err != nil {
			t.Fatalf("a write within the limit after ENOSPC: %v", err)
		}
		if b, err := os.ReadFile(filepath.Join(m.GetPath(), "small")); err != nil || !bytes.Equal(b, big[:512<<10]) {
			t.Fatalf("read back after ENOSPC: %d bytes, %v", len(b), err)
		}
		// A file unlinked while open lives on through its descriptor, in
		// the volume's usage and in inspect, until its last close.
		heldPath := filepath.Join(m.GetPath(), "held")
		if err := os.WriteFile(heldPath, big[:1000], 0o644); err != nil {
			t.Fatal(err)
		}
		heldFile, err := os.Open(heldPath)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(heldPath); err != nil {
			t.Fatal(err)
		}
		if b, err := io.ReadAll(heldFile); err != nil || !bytes.Equal(b, big[:1000]) {
			heldFile.Close()
			t.Fatalf("reading a file unlinked while open: %d bytes, %v", len(b), err)
		}
		usage := func(held uint64, used int64) func() bool {
			return func() bool {
				v, err := c.inspect(3, "tiny")
				return err == nil && v.GetHeldFiles() == held && v.GetUsedBytes() == used
			}
		}
		waitFor(t, 10*time.Second, "tiny holds the unlinked open file", usage(1, 512<<10+1000))
		if out := c.mustCtl(1, "volume", "inspect", "tiny"); !strings.Contains(out, "1 unlinked files still open") {
			t.Errorf("volume inspect does not show the held file:\n%s", out)
		}
		heldFile.Close()
		waitFor(t, 10*time.Second, "tiny frees the file at its last close", usage(0, 512<<10))
		// The mount's node timed those operations, and every member's
		// vold its journal's syncs (the mount's node may hold no replica:
		// 3 of 4 nodes do).
		voldMetrics := func(i int) string { return c.voldMetrics(t, i) }
		metrics := voldMetrics(2)
		for _, name := range []string{`shoal_vold_fs_op_seconds_count{kind="mutate"}`, `shoal_vold_fs_op_seconds_count{kind="query"}`} {
			if v := metricValue(metrics, name); v <= 0 {
				t.Errorf("node 2's vold metrics: %s is %v, want > 0", name, v)
			}
		}
		tiny, err := c.inspect(1, "tiny")
		if err != nil {
			t.Fatal(err)
		}
		for _, i := range c.memberNodes(tiny) {
			if v := metricValue(voldMetrics(i), "shoal_vold_raft_sync_seconds_count"); v <= 0 {
				t.Errorf("node %d (a member of tiny) vold metrics: shoal_vold_raft_sync_seconds_count is %v, want > 0", i, v)
			}
		}
		if _, err := c.volumes(2).Unmount(ctx, &volv1.UnmountRequest{Name: "tiny", User: "e2e-enospc"}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "tiny's replicas identical", func() bool {
			v, err := c.inspect(1, "tiny")
			return err == nil && converged(v, 3)
		})
		// A listing has the members' live status but not their digests,
		// which hash every byte of every replica.
		ls, err := c.volumes(3).ListVolumes(ctx, &volv1.ListVolumesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		listed := false
		for _, v := range ls.GetVolumes() {
			if v.GetName() != "tiny" {
				continue
			}
			listed = true
			if v.GetLeader() == "" || len(v.GetMembers()) != 3 || v.GetUsedBytes() != 512<<10 {
				t.Errorf("volume ls: tiny has leader %q, %d members, %d bytes used; want a leader, 3, %d", v.GetLeader(), len(v.GetMembers()), v.GetUsedBytes(), 512<<10)
			}
			for _, m := range v.GetMembers() {
				if m.GetDigest() != "" || m.GetApplied() == 0 {
					t.Errorf("volume ls: member %s of tiny has digest %q, applied %d; want none, > 0", m.GetNode(), m.GetDigest(), m.GetApplied())
				}
			}
		}
		if !listed {
			t.Errorf("volume ls does not list tiny: %v", ls.GetVolumes())
		}
		// Nor does inspect unless asked: --digests has every replica hash
		// its data, and then the three are equal.
		type member struct{ Digest string }
		var plain, hashed struct{ Members []member }
		if err := json.Unmarshal([]byte(c.mustCtl(2, "volume", "inspect", "tiny", "-o", "json")), &plain); err != nil {
			t.Fatal(err)
		}
		if len(plain.Members) != 3 || slices.ContainsFunc(plain.Members, func(m member) bool { return m.Digest != "" }) {
			t.Errorf("volume inspect tiny without --digests: members %+v, want 3 without digests", plain.Members)
		}
		if table := c.mustCtl(2, "volume", "inspect", "tiny"); strings.Contains(table, "DIGEST") {
			t.Errorf("volume inspect tiny without --digests shows digests:\n%s", table)
		}
		if err := json.Unmarshal([]byte(c.mustCtl(2, "volume", "inspect", "tiny", "--digests", "-o", "json")), &hashed); err != nil {
			t.Fatal(err)
		}
		if len(hashed.Members) != 3 || hashed.Members[0].Digest == "" || hashed.Members[1].Digest != hashed.Members[0].Digest || hashed.Members[2].Digest != hashed.Members[0].Digest {
			t.Errorf("volume inspect tiny --digests: members %+v, want 3 equal digests", hashed.Members)
		}
		c.mustCtl(1, "volume", "rm", "tiny")
	})

	c.run(t, "ExportImport", func(t *testing.T) { testExportImport(t, c) })

	c.run(t, "RemoveAsksTheMountingNodes", func(t *testing.T) { testRemoveAsksTheMountingNodes(t, c) })

	var writerNode, leaderNode int
	c.run(t, "ServiceWritesThroughLeaderLoss", func(t *testing.T) {
		c.mustCtl(1, "volume", "create", "data", "--replicas", "3", "--size", "64Mi")
		var v *volv1.Volume
		waitFor(t, 30*time.Second, "volume data has a leader and 3 members", func() bool {
			var err error
			v, err = c.inspect(2, "data")
			return err == nil && v.GetLeader() != "" && len(v.GetMembers()) == 3
		})
		leaderNode = c.node(v.GetLeader())
		// The writer runs on a member that is not the leader, so that
		// killing the leader's node leaves the writer running.
		for _, n := range c.memberNodes(v) {
			if n != leaderNode {
				writerNode = n
				break
			}
		}
		// vold hands a volume's leadership to the node that proposes most
		// of its writes: a keeper on the leader's node writing faster
		// than the writer keeps it there, as a second writer would.
		c.mustCtl(1, "service", "create", "keeper", "--image", "local/busybox:latest", "--stop-grace", "1s",
			"--constraint", "node.id=="+c.ids[leaderNode-1], "--volume", "data:/data",
			"--", "sh", "-c", "while true; do echo k > /data/keep; sleep 0.01; done")
		removeIfFailed(t, c.Cluster, 1, "keeper")
		waitFor(t, 30*time.Second, "the keeper writing", func() bool {
			_, err := c.readVolumeFile(leaderNode, "data", "keep")
			return err == nil
		})
		c.mustCtl(1, "service", "create", "writer", "--image", "local/busybox:latest", "--stop-grace", "1s",
			"--constraint", "node.id=="+c.ids[writerNode-1], "--volume", "data:/data",
			"--", "sh", "-c", "i=$(tail -n 1 /data/log 2>/dev/null); i=${i:-0}; while true; do i=$((i+1)); echo $i >> /data/log; sleep 0.05; done")
		removeIfFailed(t, c.Cluster, 1, "writer")
		var before int
		waitFor(t, 30*time.Second, "the writer's log growing", func() bool {
			s, err := c.readVolumeFile(writerNode, "data", "log")
			before = lastCount(s)
			return err == nil && before > 20
		})
		if v, err := c.inspect(writerNode, "data"); err != nil || c.node(v.GetLeader()) != leaderNode {
			t.Fatalf("the leadership left node %d before the kill: %v %v", leaderNode, v, err)
		}
		if err := c.Kill(context.Background(), leaderNode, ""); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		waitFor(t, 30*time.Second, "writes continuing on a new leader", func() bool {
			s, err := c.readVolumeFile(writerNode, "data", "log")
			return err == nil && lastCount(s) > before+20
		})
		t.Logf("writes continued %v after the leader's node was killed", time.Since(killed).Round(100*time.Millisecond))
		// Two of three members serve: degraded, with the dead one shown.
		// (Checked at once: past --replace-after the dead member is
		// replaced and the volume is healthy again.)
		waitFor(t, 5*time.Second, "volume data degraded while a member's node is down", func() bool {
			v, err := c.inspect(writerNode, "data")
			if err != nil || v.GetHealth() != "degraded" {
				return false
			}
			for _, m := range v.GetMembers() {
				if c.node(m.GetNode()) == leaderNode {
					return !m.GetAlive()
				}
			}
			return false
		})
		if err := c.Start(context.Background(), leaderNode, ""); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 60*time.Second, "the restarted node's replica catching up", func() bool {
			v, err := c.inspect(writerNode, "data")
			if err != nil {
				return false
			}
			for _, m := range v.GetMembers() {
				if c.node(m.GetNode()) == leaderNode {
					return m.GetAlive() && m.GetLag() < 50
				}
			}
			return false
		})
		c.mustCtl(1, "service", "rm", "keeper")
	})

	c.run(t, "VoldRestartKeepsTheMount", func(t *testing.T) {
		// vold restarts, killed or stopped, under a task writing to its
		// mount: the mount's FUSE session outlives vold (a holder keeps
		// it), the next vold serves it again, and the task notices
		// nothing but a pause — it is not restarted, and its log has no
		// gap or repeat (checked below).
		task := c.writerTask(t)
		// A file unlinked while open on the mount stays readable across
		// both restarts. The vold after a restart does not know the
		// handles its predecessor gave out, so the file stays held after
		// its close, until the mount ends.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		heldFile := c.openUnlinked(t, writerNode, "data", "kept open\n")
		heldFiles := func() uint64 {
			v, err := c.inspect(1, "data")
			if err != nil {
				return 1 << 63
			}
			return v.GetHeldFiles()
		}
		waitFor(t, 10*time.Second, "data holds the unlinked open file", func() bool { return heldFiles() == 1 })
		for _, how := range []string{"kill", "stop"} {
			s, err := c.readVolumeFile(writerNode, "data", "log")
			if err != nil {
				t.Fatal(err)
			}
			c.releaseReader(writerNode, "data")
			at := lastCount(s)
			switch how {
			case "kill":
				err = c.Kill(context.Background(), writerNode, "vold")
			case "stop":
				err = c.Stop(context.Background(), writerNode, "vold", 30*time.Second)
			}
			if err != nil {
				t.Fatal(err)
			}
			// Long enough for the writer to block on its mount.
			time.Sleep(time.Second)
			if err := c.Start(context.Background(), writerNode, "vold"); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 60*time.Second, "the writer writing again after vold's "+how, func() bool {
				s, err := c.readVolumeFile(writerNode, "data", "log")
				return err == nil && lastCount(s) > at+40
			})
			if now := c.writerTask(t); now != task {
				t.Fatalf("after vold's %s the writer's task changed: %+v, was %+v", how, now, task)
			}
			if b, err := heldFile.ReadAt(make([]byte, 64), 0); b != 10 {
				t.Fatalf("after vold's %s the unlinked open file reads %d bytes: %v", how, b, err)
			}
		}
		heldFile.Close()
		if _, err := c.volumes(writerNode).Unmount(ctx, &volv1.UnmountRequest{Name: "data", User: "e2e-held"}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		if n := heldFiles(); n != 1 {
			t.Fatalf("after its close through the restarted vold, %d files held, want 1 (the handle was its predecessor's)", n)
		}
		c.mustCtl(1, "service", "scale", "writer=0")
		// The mount ends with its last user, the reader the loop above
		// left (mounted again after, for the removal check at the end).
		c.releaseReader(writerNode, "data")
		waitFor(t, 60*time.Second, "the held file freed when the writer's mount ends", func() bool { return heldFiles() == 0 })
		if _, err := c.readVolumeFile(writerNode, "data", "log"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 60*time.Second, "every replica identical (applied index and digest)", func() bool {
			v, err := c.inspect(1, "data")
			return err == nil && converged(v, 3)
		})
		// NB: health compares each member's applied index with the
		// leader's commit, asked at slightly different moments, so an entry
		// committing in between (a lease renewal, the KV) shows for an
		// instant as lag: it must settle, not hold at the first sample.
		waitFor(t, 10*time.Second, "volume data healthy with every member alive and caught up", func() bool {
			v, err := c.inspect(2, "data")
			return err == nil && v.GetHealth() == "healthy"
		})
		// The log is whole: 1..n with no gap or repeat, across the leader
		// loss and vold's restarts.
		s, err := c.readVolumeFile(leaderNode, "data", "log")
		if err != nil {
			t.Fatal(err)
		}
		c.releaseReader(leaderNode, "data")
		for k, line := range strings.Fields(s) {
			if line != strconv.Itoa(k+1) {
				t.Fatalf("log line %d is %q", k+1, line)
			}
		}
		// A volume in use cannot be removed.
		if _, errOut, code := c.ctl(3, "volume", "rm", "data"); code == 0 {
			t.Fatalf("volume rm succeeded while the reader mount is held")
		} else if !strings.Contains(errOut, "use") {
			t.Errorf("volume rm refusal does not say the volume is in use: %s", errOut)
		}
	})

	c.run(t, "StopHandsLeadershipOff", func(t *testing.T) {
		// A vold stopped on purpose first hands the volumes it leads to
		// other replicas: right after the stop a remaining member leads
		// data. Without the hand-off its followers would still name the
		// stopped node until an election timeout (1-2 s) had passed, and
		// the writes would wait that long (bench/vold's restart rows
		// time it).
		v, err := c.inspect(1, "data")
		if err != nil || v.GetLeader() == "" {
			t.Fatalf("data has no leader: %v %v", v, err)
		}
		old := c.node(v.GetLeader())
		var other int
		for _, n := range c.memberNodes(v) {
			if n != old {
				other = n
				break
			}
		}
		handedOff := func() int { return strings.Count(logOf(t, c.LogPath(old, "vold")), "leadership handed off") }
		before := handedOff()
		if err := c.Stop(context.Background(), old, "vold", 30*time.Second); err != nil {
			t.Fatal(err)
		}
		v, err = c.inspect(other, "data")
		if err != nil {
			t.Fatal(err)
		}
		if now := c.node(v.GetLeader()); now == old || now == 0 || !slices.ContainsFunc(v.GetMembers(), func(m *volv1.Member) bool { return m.GetRole() == "leader" }) {
			t.Errorf("right after node %d's vold stopped, data's leader is %q (members %v): not handed off", old, v.GetLeader(), v.GetMembers())
		}
		if handedOff() != before+1 {
			t.Errorf("node %d's vold did not log its hand-off:\n%s", old, logOf(t, c.LogPath(old, "vold")))
		}
		if err := c.Start(context.Background(), old, "vold"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 60*time.Second, "data healthy again", func() bool {
			v, err := c.inspect(other, "data")
			return err == nil && v.GetHealth() == "healthy"
		})
	})

	c.run(t, "MountWithoutReplica", func(t *testing.T) {
		// The node that holds no replica of data mounts it all the same:
		// its FUSE server proxies every operation to the group.
		v, err := c.inspect(1, "data")
		if err != nil {
			t.Fatal(err)
		}
		members, outside := c.memberNodes(v), c.outsideNode(v)
		if outside == 0 {
			t.Fatalf("every node holds a replica of data: %v", members)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		m, err := c.volumes(outside).Mount(ctx, &volv1.MountRequest{Name: "data", User: "e2e-proxy"})
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(m.GetPath(), "proxied")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		// 1 MiB in uneven chunks, fsynced, then renamed into place.
		blob := make([]byte, 1<<20)
		rng := rand.New(rand.NewPCG(1, 2))
		for i := range blob {
			blob[i] = byte(rng.Uint32())
		}
		f, err := os.Create(filepath.Join(dir, "blob.tmp"))
		if err != nil {
			t.Fatal(err)
		}
		for off := 0; off < len(blob); off += 100_000 {
			if _, err := f.Write(blob[off:min(off+100_000, len(blob))]); err != nil {
				t.Fatalf("write through the proxied mount: %v", err)
			}
		}
		if err := f.Sync(); err != nil {
			t.Fatalf("fsync through the proxied mount: %v", err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, "blob.tmp"), filepath.Join(dir, "blob")); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(filepath.Join(dir, "blob")); err != nil || !bytes.Equal(b, blob) {
			t.Fatalf("read back through the proxied mount: %d of %d bytes, %v", len(b), len(blob), err)
		}
		want := sha256.Sum256(blob)
		// Every member serves the file from its own replica.
		for _, n := range members {
			s, err := c.readVolumeFile(n, "data", "proxied/blob")
			if err != nil || sha256.Sum256([]byte(s)) != want {
				t.Fatalf("node %d's replica: %d bytes, %v; want the %d bytes written on node %d", n, len(s), err, len(blob), outside)
			}
			c.releaseReader(n, "data")
		}
		waitFor(t, 30*time.Second, "every replica identical after the proxied writes", func() bool {
			v, err := c.inspect(outside, "data")
			return err == nil && converged(v, 3)
		})
		if v, err := c.inspect(outside, "data"); err != nil || slices.Contains(c.memberNodes(v), outside) {
			t.Fatalf("node %d came to hold a replica of data: %v, %v", outside, v.GetMembers(), err)
		}

		// A service deployed from a spec file gets the volume mounted too,
		// here on the node without a replica.
		file := filepath.Join(c.NodeDir(outside), "deployed.yaml")
		spec := fmt.Sprintf(`name: deployed
image: local/busybox:latest
replicas: 1
constraints: ["node.id==%s"]
volumes: ["data:/data"]
stop_grace: 1s
args: ["sh", "-c", "echo from-spec > /data/deployed; cmp /data/proxied/blob /data/proxied/blob && echo ok >> /data/deployed; trap 'exit 0' TERM; sleep 1000000 & wait"]
`, c.ids[outside-1])
		if err := os.WriteFile(file, []byte(spec), 0o644); err != nil {
			t.Fatal(err)
		}
		c.mustCtl(outside, "service", "deploy", "-f", file)
		waitFor(t, 60*time.Second, "the deployed service's file on a replica", func() bool {
			s, err := c.readVolumeFile(members[0], "data", "deployed")
			return err == nil && s == "from-spec\nok\n"
		})
		c.releaseReader(members[0], "data")

		// The task ends while its node's vold is down: schedd cannot
		// release the volume then, and retries until vold is back. (Not
		// retried, the task stayed a user of the volume for ever, and
		// `volume rm` refused it: a CI run where schedd came back from a
		// node restart before vold hit that.)
		if err := c.Kill(context.Background(), outside, "vold"); err != nil {
			t.Fatal(err)
		}
		c.mustCtl(1, "service", "rm", "deployed")
		schedLog := c.LogPath(outside, "schedd")
		waitFor(t, 60*time.Second, "schedd failing to release the volume while vold is down", func() bool {
			b, _ := os.ReadFile(schedLog)
			return strings.Contains(string(b), "release volume: retried until vold takes it")
		})
		// schedd itself restarts before vold is back: the next schedd
		// takes the pending release over from its state dir.
		if err := c.Stop(context.Background(), outside, "schedd", 30*time.Second); err != nil {
			t.Fatal(err)
		}
		if err := c.Start(context.Background(), outside, "schedd"); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(logOf(t, schedLog), "volume releases left by the last run") {
			t.Fatalf("the restarted schedd did not load the pending release:\n%s", logOf(t, schedLog))
		}
		if err := c.Start(context.Background(), outside, "vold"); err != nil {
			t.Fatal(err)
		}
		mountDoc := "/volumemounts/data/" + c.ids[outside-1]
		var doc string
		waitFor(t, 60*time.Second, "the removed task no longer a user of the volume", func() bool {
			out, _, code := c.ctl(1, "state", "get", mountDoc, "-o", "json")
			doc = out
			return code == 0 && strings.Contains(out, "e2e-proxy") && !strings.Contains(out, "deployed.")
		})
		uctx, ucancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer ucancel()
		if _, err := c.volumes(outside).Unmount(uctx, &volv1.UnmountRequest{Name: "data", User: "e2e-proxy"}); err != nil {
			t.Fatalf("%v (mount record %s)", err, doc)
		}
	})

	c.run(t, "TasksPlacedNearTheirVolume", func(t *testing.T) {
		// A volume of one replica on one of the four nodes: the tasks of
		// three services that mount it run where the replica is
		// (placement prefers the nodes holding a task's volumes). By the
		// slots' tie-break alone each would land there one time in four.
		c.mustCtl(1, "volume", "create", "nearby", "--replicas", "1", "--size", "16Mi")
		v, err := c.inspect(1, "nearby")
		if err != nil {
			t.Fatal(err)
		}
		home := c.memberNodes(v)[0]
		names := []string{"near-a", "near-b", "near-c"}
		for _, name := range names {
			c.mustCtl(2, "service", "create", name, "--image", "local/busybox:latest", "--stop-grace", "1s",
				"--volume", "nearby:/data", "--", "sleep", "3600")
			removeIfFailed(t, c.Cluster, 1, name)
		}
		for _, name := range names {
			var ps []struct{ Node, State string }
			out := c.mustCtl(1, "service", "ps", name, "-o", "json")
			if err := json.Unmarshal([]byte(out), &ps); err != nil {
				t.Fatalf("service ps %s -o json: %v: %s", name, err, out)
			}
			if len(ps) != 1 || ps[0].State != "running" || ps[0].Node != c.ids[home-1] && ps[0].Node != fmt.Sprintf("n%d", home) {
				t.Errorf("%s's tasks %+v, want one running on node %d (%s), which holds the volume's replica", name, ps, home, c.ids[home-1])
			}
		}
		for _, name := range names {
			c.mustCtl(1, "service", "rm", name)
		}
		waitFor(t, 30*time.Second, "nearby removed once its users are gone", func() bool {
			_, _, code := c.ctl(1, "volume", "rm", "nearby")
			return code == 0
		})
	})

	c.run(t, "StateMachineAPI", func(t *testing.T) { testStateMachines(t, c) })

	c.run(t, "SilentVoldReplaced", func(t *testing.T) {
		// vold alone dies on a node for good while the node's statd
		// lives on (statd counts the node alive): the volume's leader
		// hears nothing from that vold for --replace-after and replaces
		// its replica on the spare node, as it would a dead node's.
		c.mustCtl(1, "volume", "create", "quiet", "--size", "8Mi")
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		m, err := c.volumes(1).Mount(ctx, &volv1.MountRequest{Name: "quiet", User: "e2e-silent"})
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(m.GetPath(), "note"), []byte("kept\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := c.volumes(1).Unmount(ctx, &volv1.UnmountRequest{Name: "quiet", User: "e2e-silent"}); err != nil {
			t.Fatal(err)
		}
		var v *volv1.Volume
		waitFor(t, 30*time.Second, "volume quiet on 3 caught-up members", func() bool {
			v, err = c.inspect(1, "quiet")
			return err == nil && converged(v, 3)
		})
		spare, victim := c.outsideNode(v), 0
		for _, n := range c.memberNodes(v) {
			if n != 1 {
				victim = n
			}
		}
		if spare == 0 || victim == 0 {
			t.Fatalf("members %v: want a member other than node 1 and a spare", c.memberNodes(v))
		}
		if err := c.Kill(context.Background(), victim, "vold"); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := c.Start(context.Background(), victim, "vold"); err != nil {
				t.Error(err)
			}
		}()
		waitFor(t, 90*time.Second, fmt.Sprintf("node %d's replica (vold killed, statd alive) replaced on spare node %d", victim, spare), func() bool {
			v, err := c.inspect(1, "quiet")
			if err != nil {
				return false
			}
			ms := c.memberNodes(v)
			return len(ms) == 3 && slices.Contains(ms, spare) && !slices.Contains(ms, victim) && converged(v, 3)
		})
		// The premise held throughout: statd never counted the node dead.
		var nodes []struct{ ID, State string }
		if err := json.Unmarshal([]byte(c.mustCtl(1, "node", "ls", "-o", "json")), &nodes); err != nil {
			t.Fatal(err)
		}
		for _, nd := range nodes {
			if nd.ID == c.ids[victim-1] && nd.State != "alive" {
				t.Fatalf("statd counts node %d %q: the test wants its vold alone down", victim, nd.State)
			}
		}
		if got, err := c.readVolumeFile(spare, "quiet", "note"); err != nil || got != "kept\n" {
			t.Fatalf("the new replica's node reads %q, %v", got, err)
		}
		c.releaseReader(spare, "quiet")
		c.mustCtl(1, "volume", "rm", "quiet")
		// So is volume data's, if it had one there: the next subtest
		// starts from three live members.
		waitFor(t, 90*time.Second, fmt.Sprintf("volume data on 3 live caught-up members, none on node %d", victim), func() bool {
			v, err := c.inspect(1, "data")
			return err == nil && converged(v, 3) && !slices.Contains(c.memberNodes(v), victim)
		})
		// A volume created now goes to the three nodes whose vold
		// answers. The victim hosts the fewest replicas, so placement by
		// count alone would pick it (and repair would replace that replica
		// a moment later: so the answer to create is what is checked).
		cctx, ccancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer ccancel()
		fresh, err := c.volumes(1).CreateVolume(cctx, &volv1.CreateVolumeRequest{Name: "fresh", SizeBytes: 8 << 20})
		if err != nil {
			t.Fatal(err)
		}
		if ms := c.memberNodes(fresh); len(ms) != 3 || slices.Contains(ms, victim) {
			t.Fatalf("volume fresh placed on nodes %v, with node %d whose vold is down", ms, victim)
		}
		waitFor(t, 30*time.Second, "volume fresh on 3 caught-up members", func() bool {
			v, err = c.inspect(1, "fresh")
			return err == nil && converged(v, 3)
		})
		c.mustCtl(1, "volume", "rm", "fresh")
	})

	c.run(t, "DeadReplicaReplacedOnSpare", func(t *testing.T) {
		c.mustCtl(1, "service", "rm", "writer")
		v, err := c.inspect(1, "data")
		if err != nil {
			t.Fatal(err)
		}
		members := c.memberNodes(v)
		spare, victim := c.outsideNode(v), 0
		for _, n := range members {
			if n != 1 && n != writerNode {
				victim = n
			}
		}
		if victim == 0 {
			victim = members[len(members)-1]
		}
		ask := 1
		if victim == 1 {
			ask = spare
		}
		// The victim's mount holds a file unlinked while open there: the
		// node's death frees it, once the node is past --replace-after.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		heldFile := c.openUnlinked(t, victim, "data", "held open\n")
		// Its last user gone, the busy mount is detached lazily and goes
		// on serving the open file; no record of a user is left to keep
		// the volume from being removed at the end.
		if _, err := c.volumes(victim).Unmount(ctx, &volv1.UnmountRequest{Name: "data", User: "e2e-held"}); err != nil {
			t.Fatal(err)
		}
		if b, err := io.ReadAll(heldFile); err != nil || string(b) != "held open\n" {
			t.Fatalf("the unlinked file after the lazy unmount: %q, %v", b, err)
		}
		waitFor(t, 10*time.Second, fmt.Sprintf("data holds the file unlinked on node %d", victim), func() bool {
			v, err := c.inspect(ask, "data")
			return err == nil && v.GetHeldFiles() == 1
		})
		// A global service has a task on every node, the victim's too:
		// removing the dead node drops that task's record.
		c.mustCtl(1, "service", "create", "everywhere", "--image", "local/busybox:latest", "--global", "--stop-grace", "1s", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 1, "everywhere")
		if err := c.Kill(context.Background(), victim, ""); err != nil {
			t.Fatal(err)
		}
		heldFile.Close()
		// Until it is replaced (--replace-after past its death), the dead
		// member makes the volume degraded.
		waitFor(t, 30*time.Second, fmt.Sprintf("volume data degraded with node %d dead", victim), func() bool {
			v, err := c.inspect(ask, "data")
			return err == nil && v.GetHealth() == "degraded" && slices.Contains(c.memberNodes(v), victim)
		})
		// A dead node that still holds a replica cannot be removed.
		victimName := fmt.Sprintf("n%d", victim)
		type nodeJSON struct{ ID, Name, State string }
		nodeState := func() string {
			var nodes []nodeJSON
			decode(t, c.mustCtl(ask, "node", "ls", "-o", "json"), &nodes)
			for _, n := range nodes {
				if n.Name == victimName {
					return n.State
				}
			}
			return "not listed"
		}
		waitFor(t, 15*time.Second, fmt.Sprintf("node %d dead", victim), func() bool { return nodeState() == "dead" })
		if _, errOut, code := c.ctl(ask, "node", "rm", victimName); code != 1 || !strings.Contains(errOut, "still holds a replica of volume") || !strings.Contains(errOut, "data") {
			t.Errorf("node rm of a dead node holding a replica of data: exit %d: %s", code, errOut)
		}
		if _, errOut, code := c.ctl(ask, "node", "rm", fmt.Sprintf("n%d", ask)); code != 1 || !strings.Contains(errOut, "is alive") {
			t.Errorf("node rm of a live node: exit %d: %s", code, errOut)
		}
		waitFor(t, 90*time.Second, fmt.Sprintf("node %d's replica replaced on spare node %d", victim, spare), func() bool {
			v, err := c.inspect(ask, "data")
			if err != nil {
				return false
			}
			ms := c.memberNodes(v)
			return len(ms) == 3 && slices.Contains(ms, spare) && !slices.Contains(ms, victim) && converged(v, 3)
		})
		if v, err := c.inspect(ask, "data"); err != nil || v.GetHealth() != "healthy" {
			t.Fatalf("volume data back to 3 caught-up members: health %q, %v", v.GetHealth(), err)
		}
		waitFor(t, 30*time.Second, fmt.Sprintf("the file held on dead node %d freed", victim), func() bool {
			v, err := c.inspect(ask, "data")
			return err == nil && v.GetHeldFiles() == 0
		})
		s, err := c.readVolumeFile(spare, "data", "log")
		if err != nil || lastCount(s) < 20 {
			t.Fatalf("the new replica's node does not serve the data: %v (%d lines)", err, lastCount(s))
		}
		c.releaseReader(spare, "data")
		c.releaseReader(writerNode, "data")
		for i := 1; i <= 4; i++ {
			if i != victim {
				c.releaseReader(i, "data")
			}
		}
		waitFor(t, 30*time.Second, "volume rm once nothing uses it", func() bool {
			_, _, code := c.ctl(ask, "volume", "rm", "data")
			return code == 0
		})
		// Its replicas moved, the dead node can go: no node lists it, no
		// member probes it.
		var victimID string
		var nodes []nodeJSON
		decode(t, c.mustCtl(ask, "node", "ls", "-o", "json"), &nodes)
		for _, n := range nodes {
			if n.Name == victimName {
				victimID = n.ID
			}
		}
		onVictim := func() int {
			var tasks []struct{ Service, Node string }
			decode(t, c.mustCtl(ask, "task", "ls", "-a", "-o", "json"), &tasks)
			k := 0
			for _, tk := range tasks {
				if tk.Service == "everywhere" && tk.Node == victimID {
					k++
				}
			}
			return k
		}
		if k := onVictim(); victimID == "" || k == 0 {
			t.Fatalf("the global service's tasks on dead node %s (%q): %d, want its last record", victimName, victimID, k)
		}
		// Its task on the dead node cannot stop before the node is back:
		// service rm does not wait for it.
		_, errOut, code := ctlBounded(t, c.Cluster, 20*time.Second, 1, "service", "rm", "everywhere")
		if code != 0 || !strings.Contains(errOut, "1 tasks on down nodes stop when their nodes are back") {
			t.Errorf("service rm of a service with a task on a dead node: exit %d: %s", code, errOut)
		}
		var rmOut string
		waitFor(t, 60*time.Second, fmt.Sprintf("node rm %s once no volume has a replica there", victimName), func() bool {
			out, _, code := c.ctl(ask, "node", "rm", victimName)
			rmOut = out
			return code == 0
		})
		if !strings.Contains(rmOut, "task records of it dropped") {
			t.Errorf("node rm output %q: want its task records dropped", rmOut)
		}
		if k := onVictim(); k != 0 {
			t.Errorf("task ls -a still lists %d tasks of everywhere on removed node %s", k, victimName)
		}
		for i := 1; i <= 4; i++ {
			if i == victim {
				continue
			}
			waitFor(t, 15*time.Second, fmt.Sprintf("node %d forgets node %d", i, victim), func() bool {
				var nodes []nodeJSON
				var st struct{ Members []nodeJSON }
				decode(t, c.mustCtl(i, "node", "ls", "-o", "json"), &nodes)
				decode(t, c.mustCtl(i, "cluster", "status", "-o", "json"), &st)
				listed := func(n nodeJSON) bool { return n.Name == victimName || n.ID == victimName }
				return len(nodes) == 3 && !slices.ContainsFunc(nodes, listed) && len(st.Members) == 3
			})
		}
	})
}

// testStateMachines drives a named state machine over vold.sock from the
// node that holds no replica of the system group: a follower there sees
// every command in order, compare on the last index is exact,
// a snapshot command compacts the log for later readers, and a Set fenced
// by a released lock's token is refused.
func testStateMachines(t *testing.T, c *volCluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	str := func(s string) *anypb.Any {
		a, err := anypb.New(wrapperspb.String(s))
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	valueOf := func(m *volv1.MachineCommand) string {
		var v wrapperspb.StringValue
		if err := m.GetCommand().UnmarshalTo(&v); err != nil {
			t.Fatalf("command %d: %v", m.GetIndex(), err)
		}
		return v.GetValue()
	}
	// The system group comes up on first use (a Set here).
	first, err := c.machines(1).Set(ctx, &volv1.SetRequest{Machine: "counter", Command: str("c0")})
	if err != nil {
		t.Fatal(err)
	}
	sys, err := c.inspect(1, "_system")
	if err != nil {
		t.Fatal(err)
	}
	members, outside := c.memberNodes(sys), c.outsideNode(sys)
	if outside == 0 {
		t.Fatalf("every node holds a replica of the system group: %v", members)
	}
	// A follower from the start of the log, on that node too: its reads
	// wait on a member for new commands.
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	w, err := c.machines(outside).Watch(wctx, &volv1.WatchRequest{Machine: "counter", Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	seen := make(chan *volv1.MachineCommand, 100)
	go func() {
		defer close(seen)
		for {
			m, err := w.Recv()
			if err != nil {
				return
			}
			seen <- m
		}
	}()
	sm := c.machines(outside)
	indexes := []uint64{first.GetIndex()}
	for i := 1; i <= 10; i++ {
		r, err := sm.Set(ctx, &volv1.SetRequest{Machine: "counter", Command: str(fmt.Sprint("c", i))})
		if err != nil || !r.GetApplied() || r.GetIndex() <= indexes[len(indexes)-1] {
			t.Fatalf("Set %d from node %d: %v, %v (after index %d)", i, outside, r, err, indexes[len(indexes)-1])
		}
		indexes = append(indexes, r.GetIndex())
	}
	for i, want := range indexes {
		select {
		case m, ok := <-seen:
			if !ok || m.GetIndex() != want || valueOf(m) != fmt.Sprint("c", i) || m.GetSnapshot() {
				t.Fatalf("follower's command %d: %v, want index %d c%d", i, m, want, i)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("the follower on node %d did not see command %d", outside, i)
		}
	}
	last := indexes[len(indexes)-1]
	if r, err := sm.Set(ctx, &volv1.SetRequest{Machine: "counter", Command: str("stale"), Compare: true, ExpectIndex: last - 1}); err != nil || r.GetApplied() || r.GetIndex() != last {
		t.Fatalf("Set compared on a stale index: %v, %v; want refused with index %d", r, err, last)
	}
	snap, err := sm.Set(ctx, &volv1.SetRequest{Machine: "counter", Command: str("sum"), Snapshot: true, Compare: true, ExpectIndex: last})
	if err != nil || !snap.GetApplied() {
		t.Fatalf("snapshot Set: %v, %v", snap, err)
	}
	// A reader from the start (on a member) now gets the snapshot alone.
	r, err := c.machines(members[1]).Watch(ctx, &volv1.WatchRequest{Machine: "counter"})
	if err != nil {
		t.Fatal(err)
	}
	var got []*volv1.MachineCommand
	for {
		m, err := r.Recv()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			break
		}
		got = append(got, m)
	}
	if len(got) != 1 || !got[0].GetSnapshot() || got[0].GetIndex() != snap.GetIndex() || valueOf(got[0]) != "sum" {
		t.Fatalf("reading counter after its compaction: %v", got)
	}
	// Fenced Sets: applied with the holder's token, refused once the lock
	// is released.
	l, err := c.kv(outside).AcquireLock(ctx, &volv1.AcquireLockRequest{Name: "counter-writer", Holder: "e2e", Ttl: durationpb.New(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sm.Set(ctx, &volv1.SetRequest{Machine: "counter", Command: str("fenced"), Lock: "counter-writer", LockToken: l.GetToken()}); err != nil {
		t.Fatalf("Set fenced by the current lease: %v", err)
	}
	if _, err := c.kv(outside).ReleaseLock(ctx, &volv1.ReleaseLockRequest{Name: "counter-writer", Holder: "e2e", Token: l.GetToken()}); err != nil {
		t.Fatal(err)
	}
	if _, err := sm.Set(ctx, &volv1.SetRequest{Machine: "counter", Command: str("late"), Lock: "counter-writer", LockToken: l.GetToken()}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Set fenced by a released lease: %v, want FailedPrecondition", err)
	}
	for _, want := range []string{"sum", "fenced"} {
		select {
		case m := <-seen:
			if valueOf(m) != want {
				t.Fatalf("follower's next command: %v, want %s", m, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("the follower did not see %s", want)
		}
	}
}

// kvIn and kvOut are the porcupine history of the KV API.
type kvIn struct {
	op    string // get, put, cas
	key   string
	value string
	old   string // cas: the value whose revision it expects
}

type kvOut struct {
	ok      bool
	value   string
	unknown bool // the client never learned the outcome
}

// kvModel is one register per key with put and compare-and-swap. Values
// are unique per write, so "expect the revision read with value v" is
// "expect value v". A write whose outcome is unknown may take effect at any
// point after its call (its return is at infinity).
var kvModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			k := op.Input.(kvIn).key
			if _, ok := by[k]; !ok {
				keys = append(keys, k)
			}
			by[k] = append(by[k], op)
		}
		var out [][]porcupine.Operation
		for _, k := range keys {
			out = append(out, by[k])
		}
		return out
	},
	Init: func() any { return "" },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(string), input.(kvIn), output.(kvOut)
		switch in.op {
		case "get":
			return out.value == s, s
		case "put":
			return true, in.value
		case "cas":
			if out.unknown {
				if s == in.old {
					return true, in.value
				}
				return true, s
			}
			if out.ok {
				return s == in.old, in.value
			}
			return s != in.old, s
		}
		return false, s
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(kvIn), output.(kvOut)
		return fmt.Sprintf("%s(%s %q old=%q) -> ok=%v %q unknown=%v", in.op, in.key, in.value, in.old, out.ok, out.value, out.unknown)
	},
}

// TestKVLinearizable runs concurrent clients on every node doing reads,
// puts and compare-and-swaps through vold's KV API while the test cuts
// the network into random partitions and kills the vold of the system
// group's leader, then checks the history with porcupine and that every
// acknowledged write survived.
func TestKVLinearizable(t *testing.T) {
	c := newVolCluster(t, 3)
	ctx := context.Background()
	// The system group comes up on first use.
	waitFor(t, 60*time.Second, "the KV API answering", func() bool {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := c.kv(1).Put(cctx, &volv1.PutRequest{Key: "hello", Value: []byte("world")})
		return err == nil
	})

	keys := []string{"a", "b"}
	var (
		hmu     sync.Mutex
		history []porcupine.Operation
	)
	start := time.Now()
	stamp := func() int64 { return int64(time.Since(start)) }
	record := func(id int, in kvIn, call int64, out kvOut) {
		hmu.Lock()
		defer hmu.Unlock()
		ret := stamp()
		if out.unknown {
			ret = int64(1 << 62)
		}
		history = append(history, porcupine.Operation{ClientId: id, Input: in, Call: call, Output: out, Return: ret})
	}
	deadline := time.Now().Add(20 * time.Second)
	var wg sync.WaitGroup
	for id := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			node := 1 + id%3
			kv := c.kv(node)
			rng := rand.New(rand.NewPCG(uint64(id), 7))
			for seq := 0; time.Now().Before(deadline); seq++ {
				key := keys[rng.IntN(len(keys))]
				call := stamp()
				cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				switch r := rng.IntN(3); r {
				case 0:
					resp, err := kv.Get(cctx, &volv1.GetRequest{Key: key})
					if err == nil {
						record(id, kvIn{op: "get", key: key}, call, kvOut{ok: true, value: string(resp.GetValue())})
					} // a failed read has no effect: leave it out
				case 1:
					val := fmt.Sprintf("c%d-%d", id, seq)
					_, err := kv.Put(cctx, &volv1.PutRequest{Key: key, Value: []byte(val), IdempotencyKey: val})
					record(id, kvIn{op: "put", key: key, value: val}, call, kvOut{ok: err == nil, unknown: err != nil})
				default:
					// Read, then swap against the revision read.
					g, err := kv.Get(cctx, &volv1.GetRequest{Key: key})
					if err != nil {
						break
					}
					old := string(g.GetValue())
					if !g.GetFound() {
						old = ""
					}
					call = stamp()
					val := fmt.Sprintf("c%d-%d", id, seq)
					resp, err := kv.Put(cctx, &volv1.PutRequest{Key: key, Value: []byte(val), Compare: true, ExpectRevision: g.GetRevision(), IdempotencyKey: val})
					switch {
					case err != nil:
						record(id, kvIn{op: "cas", key: key, value: val, old: old}, call, kvOut{unknown: true})
					default:
						record(id, kvIn{op: "cas", key: key, value: val, old: old}, call, kvOut{ok: resp.GetApplied()})
					}
				}
				cancel()
				// Keep the history small enough to check quickly.
				time.Sleep(3 * time.Millisecond)
			}
		}()
	}
	// Faults: kills of the leader's vold and random partitions, bounded.
	faults, leaderKills := 0, 0
	for time.Now().Add(4 * time.Second).Before(deadline) {
		time.Sleep(2 * time.Second)
		switch faults % 2 {
		case 0:
			// The system group's leader, as its members report it; a
			// fault round where no member names one kills nothing.
			victim := c.systemLeader()
			if victim == 0 {
				t.Logf("fault %d: no member names the system group's leader", faults)
				break
			}
			if err := c.Kill(ctx, victim, "vold"); err != nil {
				t.Fatal(err)
			}
			leaderKills++
			time.Sleep(time.Second)
			if err := c.Start(ctx, victim, "vold"); err != nil {
				t.Fatal(err)
			}
		case 1:
			iso := 1 + rand.IntN(3)
			if err := c.Partition(ctx, [][]int{{iso}, restInts(iso)}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2 * time.Second)
			if err := c.Heal(ctx); err != nil {
				t.Fatal(err)
			}
		}
		faults++
	}
	wg.Wait()
	if err := c.Heal(ctx); err != nil {
		t.Fatal(err)
	}
	// Durability: restart every vold, then read every key; the reads are
	// part of the history, so an acknowledged write lost by the restarts
	// makes it non-linearizable.
	for i := 1; i <= 3; i++ {
		if err := c.Kill(ctx, i, "vold"); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i <= 3; i++ {
		if err := c.Start(ctx, i, "vold"); err != nil {
			t.Fatal(err)
		}
	}
	for _, key := range keys {
		waitFor(t, 30*time.Second, "reading "+key+" after restarting every vold", func() bool {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			call := stamp()
			resp, err := c.kv(2).Get(cctx, &volv1.GetRequest{Key: key})
			if err != nil {
				return false
			}
			record(100, kvIn{op: "get", key: key}, call, kvOut{ok: true, value: string(resp.GetValue())})
			return true
		})
	}
	res, info := porcupine.CheckOperationsVerbose(kvModel, history, 60*time.Second)
	if res != porcupine.Ok {
		f := filepath.Join(os.TempDir(), "shoal-kv-history.html")
		if out, err := os.Create(f); err == nil {
			porcupine.Visualize(kvModel, info, out)
			out.Close()
		}
		t.Fatalf("history of %d operations is %v (visualisation: %s)", len(history), res, f)
	}
	ops := map[string]int{}
	for _, op := range history {
		ops[op.Input.(kvIn).op]++
	}
	t.Logf("linearizable: %d operations (%v) under %d faults (%d kills of the leader's vold)", len(history), ops, faults, leaderKills)
	if leaderKills == 0 {
		t.Fatalf("no fault killed the system group's leader")
	}
	if len(history) < 50 {
		t.Fatalf("only %d operations completed: the cluster was unavailable most of the time", len(history))
	}
	t.Run("Locks", func(t *testing.T) { testLocks(t, c) })
}

// testLocks: contenders on every node never share a fencing token and
// tokens grow with each grant; a holder cut off by a partition loses the
// lock when its lease expires, and its old token is refused afterwards.
func testLocks(t *testing.T, c *volCluster) {
	ctx := context.Background()
	dur := func(d time.Duration) *durationpb.Duration { return durationpb.New(d) }
	type grant struct {
		holder string
		token  uint64
	}
	var (
		mu     sync.Mutex
		grants []grant
	)
	deadline := time.Now().Add(6 * time.Second)
	var wg sync.WaitGroup
	for id := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			kv := c.kv(1 + id%3)
			holder := fmt.Sprintf("h%d", id)
			for time.Now().Before(deadline) {
				cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
				l, err := kv.AcquireLock(cctx, &volv1.AcquireLockRequest{Name: "M", Holder: holder, Ttl: dur(2 * time.Second)})
				cancel()
				if err != nil {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				mu.Lock()
				grants = append(grants, grant{holder, l.GetToken()})
				mu.Unlock()
				time.Sleep(10 * time.Millisecond)
				cctx, cancel = context.WithTimeout(ctx, 3*time.Second)
				kv.ReleaseLock(cctx, &volv1.ReleaseLockRequest{Name: "M", Holder: holder, Token: l.GetToken()})
				cancel()
			}
		}()
	}
	wg.Wait()
	seen := map[uint64]string{}
	for _, g := range grants {
		if h, ok := seen[g.token]; ok {
			t.Fatalf("token %d granted to both %s and %s", g.token, h, g.holder)
		}
		seen[g.token] = g.holder
	}
	if len(grants) < 6 {
		t.Fatalf("only %d grants in 6 s of contention", len(grants))
	}
	t.Logf("%d grants of lock M to 6 contenders on 3 nodes, every token distinct", len(grants))

	// A holder on node 1 is partitioned away; node 2's contender gets the
	// lock once the lease expired, with a greater token, and node 1's
	// holder cannot renew or release with its old one.
	a, err := c.kv(1).AcquireLock(ctx, &volv1.AcquireLockRequest{Name: "P", Holder: "a", Ttl: dur(2 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.kv(2).AcquireLock(ctx, &volv1.AcquireLockRequest{Name: "P", Holder: "b", Ttl: dur(2 * time.Second)}); err == nil {
		t.Fatal("b acquired a lock a holds")
	}
	if err := c.Partition(ctx, [][]int{{1}, {2, 3}}); err != nil {
		t.Fatal(err)
	}
	var b *volv1.Lease
	waitFor(t, 30*time.Second, "b acquiring the lock once a's lease expired", func() bool {
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		l, err := c.kv(2).AcquireLock(cctx, &volv1.AcquireLockRequest{Name: "P", Holder: "b", Ttl: dur(30 * time.Second)})
		b = l
		return err == nil
	})
	if b.GetToken() <= a.GetToken() {
		t.Fatalf("fencing token did not grow: a %d, b %d", a.GetToken(), b.GetToken())
	}
	if err := c.Heal(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "a's renewal with its old token refused (not unavailable)", func() bool {
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		_, err := c.kv(1).RenewLock(cctx, &volv1.RenewLockRequest{Name: "P", Holder: "a", Token: a.GetToken(), Ttl: dur(2 * time.Second)})
		return status.Code(err) == codes.FailedPrecondition
	})
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := c.kv(1).ReleaseLock(cctx, &volv1.ReleaseLockRequest{Name: "P", Holder: "a", Token: a.GetToken()}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("release with a's old token: %v, want FailedPrecondition", err)
	}
	ls, err := c.kv(3).ListLocks(cctx, &volv1.ListLocksRequest{})
	if err != nil {
		t.Fatal(err)
	}
	held := false
	for _, l := range ls.GetLeases() {
		if l.GetName() == "P" {
			held = l.GetHolder() == "b" && l.GetToken() == b.GetToken()
		}
	}
	if !held {
		t.Fatalf("lock P is not b's after a's stale release: %v", ls.GetLeases())
	}
}

// systemLeader returns the node whose replica of the system group says it
// leads (0 if none answers so within a few seconds).
func (c *volCluster) systemLeader() int {
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		for i := 1; i <= c.Nodes(); i++ {
			v, err := c.inspect(i, "_system")
			if err != nil || v.GetLeader() == "" {
				continue
			}
			for _, m := range v.GetMembers() {
				if m.GetNode() == v.GetLeader() && m.GetRole() == "leader" {
					return c.node(m.GetNode())
				}
			}
		}
	}
	return 0
}

func restInts(except int) []int {
	var out []int
	for i := 1; i <= 3; i++ {
		if i != except {
			out = append(out, i)
		}
	}
	return out
}

// TestVoldKill9MidWrite writes files through a node's mount while its vold
// is killed with SIGKILL, restarts it, and checks that every write that
// was acknowledged (its file closed after fsync) is there with the right
// content — and that the group's replicas agree.
func TestVoldKill9MidWrite(t *testing.T) {
	c := newVolCluster(t, 3)
	ctx := context.Background()
	c.mustCtl(1, "volume", "create", "k9", "--replicas", "3", "--size", "64Mi")
	var path string
	waitFor(t, 30*time.Second, "volume k9 mounted on node 1", func() bool {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		resp, err := c.volumes(1).Mount(cctx, &volv1.MountRequest{Name: "k9", User: "e2e-writer"})
		if err != nil {
			return false
		}
		path = resp.GetPath()
		return true
	})
	// The writer is a process of its own: while vold is down its write
	// waits in the kernel, and a process with a thread waiting on a FUSE
	// write cannot fork (this one must start vold again).
	w := exec.Command(os.Args[0])
	w.Env = append(os.Environ(), k9WriterEnv+"="+path)
	w.Stderr = os.Stderr
	out, err := w.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	var (
		mu    sync.Mutex
		acked []int
	)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			k, err := strconv.Atoi(sc.Text())
			if err != nil {
				continue
			}
			mu.Lock()
			acked = append(acked, k)
			mu.Unlock()
		}
		exited <- w.Wait()
	}()
	defer func() {
		_ = w.Process.Kill()
	}()
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(acked)
	}
	waitFor(t, 30*time.Second, "writes under way", func() bool { return count() > 30 })
	if err := c.Kill(ctx, 1, "vold"); err != nil {
		t.Fatal(err)
	}
	atKill := count()
	time.Sleep(time.Second)
	select {
	case err := <-exited:
		t.Fatalf("the writer failed when vold died: %v", err)
	default:
	}
	if err := c.Start(ctx, 1, "vold"); err != nil {
		t.Fatal(err)
	}
	// The mount outlived vold: the writer carries on through it.
	waitFor(t, 60*time.Second, "the writer writing again after the restart", func() bool { return count() > atKill+30 })
	_ = w.Process.Kill()
	<-exited
	mu.Lock()
	defer mu.Unlock()
	for _, k := range acked {
		b, err := os.ReadFile(filepath.Join(path, k9File(k)))
		if err != nil {
			t.Fatalf("acknowledged write %d lost after kill -9: %v", k, err)
		}
		if string(b) != string(k9Content(k)) {
			t.Fatalf("acknowledged write %d has %d bytes of wrong content", k, len(b))
		}
	}
	t.Logf("%d acknowledged writes present after kill -9 of vold (%d before the kill)", len(acked), atKill)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := c.volumes(1).Unmount(cctx, &volv1.UnmountRequest{Name: "k9", User: "e2e-writer"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "every replica identical", func() bool {
		v, err := c.inspect(2, "k9")
		return err == nil && converged(v, 3)
	})
}

// k9WriterEnv makes the test binary the writer of TestVoldKill9MidWrite,
// writing into the directory it names.
const k9WriterEnv = "SHOAL_E2E_K9_WRITER"

func k9File(k int) string { return fmt.Sprintf("f%04d", k) }

// k9Content is file k's content. Odd files are 17.5 KiB, so that their
// entries' data is in vold's segment log rather than Pebble (raftgroup
// Config.LargeEntry).
func k9Content(k int) []byte {
	sum := sha256.Sum256([]byte(strconv.Itoa(k)))
	return []byte(strings.Repeat(hex.EncodeToString(sum[:]), 20+260*(k%2)))
}

// k9Writer writes files into dir, each created, written, fsynced and
// closed, and prints the number of each once that is done, until
// killed; it returns 1 at the first error.
func k9Writer(dir string) int {
	write := func(k int) error {
		f, err := os.OpenFile(filepath.Join(dir, k9File(k)), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
		if err != nil {
			return err
		}
		if _, err := f.Write(k9Content(k)); err != nil {
			f.Close()
			return err
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	for k := 0; k < 10000; k++ {
		if err := write(k); err != nil {
			fmt.Fprintf(os.Stderr, "k9 writer: file %d: %v\n", k, err)
			return 1
		}
		fmt.Println(k)
	}
	return 0
}

// voldMetrics returns node i's vold's /metrics exposition.
func (c *volCluster) voldMetrics(t *testing.T, i int) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, _, code, err := c.Exec(ctx, i, []string{"busybox", "wget", "-qO-", "http://127.0.0.1:9464/metrics"}, nil)
	if err != nil || code != 0 {
		t.Fatalf("node %d's vold metrics: %v %d", i, err, code)
	}
	return out
}

// metricValue returns the value of the sample name (with its labels, as
// the exposition writes them) in a /metrics text exposition, or -1 if
// there is none.
func metricValue(metrics, name string) float64 {
	for _, line := range strings.Split(metrics, "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			if v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64); err == nil {
				return v
			}
		}
	}
	return -1
}

// testRemoveAsksTheMountingNodes: `volume rm` on a node whose statd has
// not heard of a mount or an unmount on another node yet goes by what
// that node's vold says, and a node that said it had no users does not
// mount the volume afterwards, though its statd has not heard of the
// removal yet. One node's statd is cut off from the others' for each case
// (its vold still reaches theirs), well within the 2 s a suspect has
// before it is declared dead.
func testRemoveAsksTheMountingNodes(t *testing.T, c *volCluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st1 := nodeClient(t, c.Cluster, 1)
	mountDoc := func(name string) bool {
		_, ok := getField(st1, "/volumemounts/"+name+"/"+c.ids[1], "users")
		return ok
	}
	cut := func(node int) func() {
		t.Helper()
		const rules = `table inet shoal_e2e_statd {
	chain input { type filter hook input priority -300; policy accept; iifname "lo" accept; tcp dport 7470 drop; udp dport 7470 drop; tcp sport 7470 drop; udp sport 7470 drop; }
	chain output { type filter hook output priority -300; policy accept; oifname "lo" accept; tcp dport 7470 drop; udp dport 7470 drop; tcp sport 7470 drop; udp sport 7470 drop; }
}`
		if out, errOut, code, err := c.Exec(ctx, node, []string{"sh", "-c", "nft -f - <<'EOF'\n" + rules + "\nEOF"}, nil); err != nil || code != 0 {
			t.Fatalf("cut node %d's statd off: %v %d %s %s", node, err, code, out, errOut)
		}
		healed := false
		heal := func() {
			if !healed {
				healed = true
				c.Exec(context.Background(), node, []string{"nft", "delete", "table", "inet", "shoal_e2e_statd"}, nil)
			}
		}
		t.Cleanup(heal)
		return heal
	}

	// An unmount node 1 has not heard of: the removal goes ahead.
	c.mustCtl(1, "volume", "create", "rmgone", "--replicas", "1", "--size", "1Mi")
	// Node 2 learns of the volume by gossip (a CI run's mount came first).
	var firstErr error
	waitFor(t, 15*time.Second, "node 2 mounting rmgone", func() bool {
		_, firstErr = c.volumes(2).Mount(ctx, &volv1.MountRequest{Name: "rmgone", User: "e2e-rm"})
		return status.Code(firstErr) != codes.NotFound
	})
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	waitFor(t, 15*time.Second, "node 1's statd has rmgone's mount on node 2", func() bool { return mountDoc("rmgone") })
	heal := cut(1)
	if _, err := c.volumes(2).Unmount(ctx, &volv1.UnmountRequest{Name: "rmgone", User: "e2e-rm"}); err != nil {
		t.Fatal(err)
	}
	stale := mountDoc("rmgone")
	_, errOut, code := c.ctl(1, "volume", "rm", "rmgone")
	heal()
	if !stale {
		t.Fatalf("node 1's statd heard of the unmount on node 2 while cut off: the case is not tested")
	}
	if code != 0 {
		t.Fatalf("volume rm on node 1 right after the unmount on node 2: exit %d: %s", code, errOut)
	}

	// A mount node 1 has not heard of: the removal is refused.
	c.mustCtl(1, "volume", "create", "rmnew", "--replicas", "1", "--size", "1Mi")
	waitFor(t, 15*time.Second, "node 2 knows rmnew", func() bool {
		_, _, code := c.ctl(2, "volume", "inspect", "rmnew")
		return code == 0
	})
	heal = cut(1)
	if _, err := c.volumes(2).Mount(ctx, &volv1.MountRequest{Name: "rmnew", User: "e2e-rm"}); err != nil {
		heal()
		t.Fatal(err)
	}
	stale = !mountDoc("rmnew")
	_, errOut, code = c.ctl(1, "volume", "rm", "rmnew")
	heal()
	if !stale {
		t.Fatalf("node 1's statd heard of the mount on node 2 while cut off: the case is not tested")
	}
	if code == 0 || !strings.Contains(errOut, "e2e-rm on "+c.ids[1]) {
		t.Fatalf("volume rm on node 1 right after a mount on node 2: exit %d: %s; want refused, in use by e2e-rm on %s", code, errOut, c.ids[1])
	}
	if _, err := c.volumes(2).Unmount(ctx, &volv1.UnmountRequest{Name: "rmnew", User: "e2e-rm"}); err != nil {
		t.Fatal(err)
	}
	// A mount asked for on node 2 after the removal, whose statd has not
	// heard of it: refused, where it used to mount the removed volume.
	c.mustCtl(1, "volume", "create", "rmlate", "--replicas", "1", "--size", "1Mi")
	waitFor(t, 15*time.Second, "node 2 knows rmlate", func() bool {
		_, _, code := c.ctl(2, "volume", "inspect", "rmlate")
		return code == 0
	})
	heal = cut(2)
	_, errOut, code = c.ctl(1, "volume", "rm", "rmlate")
	if code != 0 {
		heal()
		t.Fatalf("volume rm rmlate on node 1: exit %d: %s", code, errOut)
	}
	_, mountErr := c.volumes(2).Mount(ctx, &volv1.MountRequest{Name: "rmlate", User: "e2e-rm"})
	_, staleErr := nodeClient(t, c.Cluster, 2).Get(ctx, &statev1.GetRequest{Key: "/volumes/rmlate"})
	heal()
	if staleErr != nil {
		t.Fatalf("node 2's statd heard of rmlate's removal while cut off: the case is not tested")
	}
	if status.Code(mountErr) != codes.FailedPrecondition || !strings.Contains(mountErr.Error(), "is being removed") {
		if mountErr == nil {
			c.volumes(2).Unmount(ctx, &volv1.UnmountRequest{Name: "rmlate", User: "e2e-rm"})
		}
		t.Fatalf("mount of rmlate on node 2 right after its removal on node 1: %v; want FailedPrecondition, being removed", mountErr)
	}
	// The refused removal of rmnew lifted the fence it set on node 3,
	// which had no user then.
	if _, err := c.volumes(3).Mount(ctx, &volv1.MountRequest{Name: "rmnew", User: "e2e-rm"}); err != nil {
		t.Fatalf("mount of rmnew on node 3 after its refused removal: %v", err)
	}
	if _, err := c.volumes(3).Unmount(ctx, &volv1.UnmountRequest{Name: "rmnew", User: "e2e-rm"}); err != nil {
		t.Fatal(err)
	}
	// Several names: each is removed or reported, the status is the
	// first failure's (3: not found).
	if out, errOut, code := c.ctl(1, "volume", "rm", "rmnosuch", "rmnew"); code != 3 || strings.TrimSpace(out) != "rmnew" || !strings.Contains(errOut, `"rmnosuch" does not exist`) {
		t.Fatalf("volume rm rmnosuch rmnew: exit %d, out %q, err %q; want 3, rmnew removed, rmnosuch reported", code, out, errOut)
	}
	waitFor(t, 15*time.Second, "rmgone and rmnew gone from node 3's list", func() bool {
		out, _, code := c.ctl(3, "volume", "ls")
		return code == 0 && !strings.Contains(out, "rmgone") && !strings.Contains(out, "rmnew") && !strings.Contains(out, "rmlate")
	})
}

// testExportImport copies a volume's tree out through one node's mount
// and into another volume through a third node's, and checks the refusals
// that write nothing.
func testExportImport(t *testing.T, c *volCluster) {
	c.mustCtl(1, "volume", "create", "exp", "--size", "8Mi")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	src, err := c.volumes(1).Mount(ctx, &volv1.MountRequest{Name: "exp", User: "e2e-src"})
	if err != nil {
		t.Fatal(err)
	}
	old := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	big := bytes.Repeat([]byte("0123456789abcdef"), 128<<10) // 2 MiB
	for _, step := range []func(root string) error{
		func(root string) error { return os.MkdirAll(filepath.Join(root, "etc/app"), 0o750) },
		func(root string) error {
			return os.WriteFile(filepath.Join(root, "etc/app/conf"), []byte("port=80\n"), 0o640)
		},
		func(root string) error { return os.Chown(filepath.Join(root, "etc/app/conf"), 1000, 1000) },
		func(root string) error { return os.Chtimes(filepath.Join(root, "etc/app/conf"), old, old) },
		func(root string) error { return os.WriteFile(filepath.Join(root, "big"), big, 0o644) },
		func(root string) error { return os.Symlink("etc/app/conf", filepath.Join(root, "conf")) },
	} {
		if err := step(src.GetPath()); err != nil {
			t.Fatal(err)
		}
	}
	c.volumes(1).Unmount(ctx, &volv1.UnmountRequest{Name: "exp", User: "e2e-src"})

	// Exported on a replica's node: from a fork of its replica, at one
	// index. On the node without one: from a fork of a member's replica,
	// streamed through this node's vold.
	v, err := c.inspect(1, "exp")
	if err != nil {
		t.Fatal(err)
	}
	member, outside := c.memberNodes(v)[0], c.outsideNode(v)
	archive := filepath.Join(t.TempDir(), "exp.tar")
	_, errOut, code := c.ctl(member, "volume", "export", "exp", "-o", archive)
	want := fmt.Sprintf(`exported exp as of its entry \d+ \(from node %s's replica\): 6 entries, 2MiB`, c.ids[member-1])
	if code != 0 || !regexp.MustCompile(want).MatchString(errOut) {
		t.Fatalf("volume export on node %d (a replica's): exit %d: %s", member, code, errOut)
	}
	proxied := archive + ".proxied"
	_, errOut, code = c.ctl(outside, "volume", "export", "exp", "-o", proxied)
	from := regexp.MustCompile(`exported exp as of its entry \d+ \(from node (\S+)'s replica\): 6 entries, 2MiB`).FindStringSubmatch(errOut)
	if code != 0 || from == nil || !slices.Contains(c.memberNodes(v), c.node(from[1])) || strings.Contains(errOut, "warning") {
		t.Errorf("volume export on node %d (no replica): exit %d: %s", outside, code, errOut)
	}
	if f, err := os.Open(proxied); err != nil {
		t.Error(err)
	} else {
		entries, size, err := volarchive.Size(f)
		f.Close()
		if err != nil || entries != 6 || size != int64(len(big))+int64(len("port=80\n")) {
			t.Errorf("the proxied copy: %d entries, %d bytes, %v", entries, size, err)
		}
	}
	// With the leader's vold stopped (the member the outside node asks
	// first), another member's replica is copied once a leader is back.
	leader := c.node(v.GetLeader())
	if leader == 0 {
		t.Fatalf("exp has no leader: %v", v)
	}
	if err := c.Stop(ctx, leader, "vold", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	_, errOut, code = c.ctl(outside, "volume", "export", "exp", "-o", proxied)
	from = regexp.MustCompile(`exported exp as of its entry \d+ \(from node (\S+)'s replica\): 6 entries, 2MiB`).FindStringSubmatch(errOut)
	if code != 0 || from == nil || c.node(from[1]) == leader || !slices.Contains(c.memberNodes(v), c.node(from[1])) {
		t.Errorf("volume export on node %d with node %d's vold stopped: exit %d: %s", outside, leader, code, errOut)
	}
	if err := c.Start(ctx, leader, "vold"); err != nil {
		t.Fatal(err)
	}
	if _, _, code := c.ctl(2, "volume", "export", "nosuch", "-o", archive+".2"); code == 0 {
		t.Error("export of a missing volume succeeded")
	}
	if _, err := os.Stat(archive + ".2"); err == nil {
		t.Error("a failed export left its file")
	}

	// Refused, nothing written: more data than the volume has free.
	c.mustCtl(3, "volume", "create", "imp-small", "--size", "1Mi")
	if _, errOut, code := c.ctl(3, "volume", "import", "imp-small", archive); code == 0 || !strings.Contains(errOut, "nothing was written") {
		t.Errorf("import of 2 MiB into 1 MiB: exit %d: %s", code, errOut)
	}
	if v, err := c.inspect(3, "imp-small"); err != nil || v.GetUsedBytes() != 0 {
		t.Errorf("imp-small after a refused import: %v, %v", v, err)
	}
	c.mustCtl(3, "volume", "rm", "imp-small")

	// Imported through node 3, read back through node 4.
	c.mustCtl(3, "volume", "create", "imp", "--size", "8Mi")
	if _, errOut, code := c.ctl(3, "volume", "import", "imp", archive); code != 0 || !strings.Contains(errOut, "imported into imp: 6 entries, 2MiB") {
		t.Fatalf("volume import: exit %d: %s", code, errOut)
	}
	dst, err := c.volumes(4).Mount(ctx, &volv1.MountRequest{Name: "imp", User: "e2e-dst"})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dst.GetPath(), "big")); err != nil || !bytes.Equal(b, big) {
		t.Errorf("big: %d bytes, %v", len(b), err)
	}
	info, err := os.Stat(filepath.Join(dst.GetPath(), "etc/app/conf"))
	if err != nil {
		t.Fatal(err)
	}
	if sys := info.Sys().(*syscall.Stat_t); info.Mode().Perm() != 0o640 || sys.Uid != 1000 || !info.ModTime().Equal(old) {
		t.Errorf("etc/app/conf: mode %v, uid %d, time %v", info.Mode(), sys.Uid, info.ModTime())
	}
	if l, err := os.Readlink(filepath.Join(dst.GetPath(), "conf")); err != nil || l != "etc/app/conf" {
		t.Errorf("conf: %q, %v", l, err)
	}
	if d, err := os.Stat(filepath.Join(dst.GetPath(), "etc/app")); err != nil || d.Mode().Perm() != 0o750 {
		t.Errorf("etc/app: %v, %v", d, err)
	}
	c.volumes(4).Unmount(ctx, &volv1.UnmountRequest{Name: "imp", User: "e2e-dst"})
	// A second import without --force would mix trees: refused.
	if _, errOut, code := c.ctl(2, "volume", "import", "imp", archive); code == 0 || !strings.Contains(errOut, "is not empty") {
		t.Errorf("import into a volume with files: exit %d: %s", code, errOut)
	}
	// No mount is left in use: both volumes go.
	c.mustCtl(1, "volume", "rm", "exp", "imp")
}
