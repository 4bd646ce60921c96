package runtime_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shoal-dev/shoal/pkg/devcluster"
	"github.com/shoal-dev/shoal/pkg/runtime"
	"github.com/shoal-dev/shoal/pkg/runtime/runtimetest"
)

// TestKillContainers kills a node's containerd, as a crash or `dev down`
// does: its containers run on, and KillContainers must find and kill them
// and remove what they leave.
func TestKillContainers(t *testing.T) {
	ctx := context.Background()
	d := runtimetest.Start(t)
	rt := d.Runtime(t, nil)
	importOCI(t, rt)
	for _, id := range []string{"orphan-1", "orphan-2"} {
		if err := rt.Run(ctx, runtime.TaskSpec{ID: id, Image: "local/busybox:latest", Args: sleepArgs}); err != nil {
			t.Fatal(err)
		}
	}
	tasks, err := rt.List(ctx)
	if err != nil || len(tasks) != 2 {
		t.Fatalf("List = %+v, %v", tasks, err)
	}
	// A paused task too: its processes are frozen.
	cctx := rt.WithNamespace(ctx)
	c, err := rt.Client().LoadContainer(cctx, "orphan-2")
	if err != nil {
		t.Fatal(err)
	}
	task, err := c.Task(cctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Pause(cctx); err != nil {
		t.Fatal(err)
	}
	if ti := findTask(t, rt, "orphan-2"); ti.Status != runtime.StatusPaused {
		t.Fatalf("paused task: %+v", ti)
	}
	d.Kill(t)
	for _, ti := range tasks {
		if !processAlive(int(ti.Pid)) {
			t.Fatalf("task %s died with containerd", ti.ID)
		}
	}
	if err := devcluster.KillContainers(ctx, d.Layout); err != nil {
		t.Fatalf("KillContainers: %v", err)
	}
	for _, ti := range tasks {
		if processAlive(int(ti.Pid)) {
			t.Errorf("task %s (pid %d) survived KillContainers", ti.ID, ti.Pid)
		}
	}
	checkNothingLeft(t, d.Layout, []string{"orphan-1", "orphan-2"})
	// Idempotent.
	if err := devcluster.KillContainers(ctx, d.Layout); err != nil {
		t.Errorf("second KillContainers: %v", err)
	}
}

// TestDevclusterContainerd brings up a two-node dev cluster whose nodes
// run only a containerd (devcluster.ContainerdProcess), runs a task of the
// same ID on both, and checks that the nodes do not collide: each task is
// in its node's network namespace, and one node's teardown leaves the
// other's task alone.
func TestDevclusterContainerd(t *testing.T) {
	if why := runtimetest.Available(); why != "" {
		t.Skip(why)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("no ip (iproute2)")
	}
	runtimetest.UsesShimDir(t)
	ctx := context.Background()
	root, err := os.MkdirTemp("/tmp", "shdc-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(root)
	c, err := devcluster.Up(ctx, devcluster.Spec{
		Name:      fmt.Sprintf("rt%d", os.Getpid()%100000),
		Nodes:     2,
		BinDir:    root,
		Daemons:   []string{},
		Subnet:    devcluster.AutoSubnet,
		StateRoot: filepath.Join(root, "s"),
		RunRoot:   filepath.Join(root, "r"),
		Extra:     []devcluster.ProcessSpec{devcluster.ContainerdProcess("")},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		// What devcluster.Down should do first for a cluster with
		// containerd (see the report): kill every node's containers.
		for i := 1; i <= c.Nodes(); i++ {
			if err := devcluster.KillContainers(ctx, c.Containerd(i)); err != nil {
				t.Errorf("node %d: KillContainers: %v", i, err)
			}
		}
		if err := c.Down(ctx); err != nil {
			t.Errorf("down: %v", err)
		}
		for i := 1; i <= c.Nodes(); i++ {
			checkNothingLeft(t, c.Containerd(i), []string{"web"})
		}
	}()
	rts := make([]*runtime.Containerd, c.Nodes()+1)
	for i := 1; i <= c.Nodes(); i++ {
		l := c.Containerd(i)
		rt, err := runtime.NewContainerd(runtime.Config{
			Address: l.Address, Namespace: l.Namespace, RuncRoot: l.RuncRoot, CgroupParent: l.CgroupParent,
			StateDir: filepath.Join(c.NodeDir(i), "schedd", "tasks"),
		})
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close()
		rts[i] = rt
		importOCI(t, rt)
		if err := rt.Run(ctx, runtime.TaskSpec{ID: "web", Image: "local/busybox:latest", Args: sleepArgs}); err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
	}
	for i := 1; i <= c.Nodes(); i++ {
		var out bytes.Buffer
		if _, err := rts[i].Exec(ctx, "web", []string{"ip", "-o", "-4", "addr"}, nil, &out, &out, nil); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), c.Addr(i)+"/") {
			t.Errorf("node %d: the task's addresses %q lack the node's %s", i, out.String(), c.Addr(i))
		}
	}
	if err := devcluster.KillContainers(ctx, c.Containerd(1)); err != nil {
		t.Fatal(err)
	}
	if ti := findTask(t, rts[2], "web"); ti.Status != runtime.StatusRunning || !processAlive(int(ti.Pid)) {
		t.Errorf("node 2's task after node 1's teardown: %+v", ti)
	}
}

// processAlive reports whether pid is a live process (not a zombie).
func processAlive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X'
}

// checkNothingLeft checks that no process, cgroup, mount, shim or shim
// socket of layout l is left.
func checkNothingLeft(t *testing.T, l devcluster.ContainerdLayout, ids []string) {
	t.Helper()
	hier, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, h := range hier {
		if _, err := os.Stat(filepath.Join(h, l.CgroupParent)); err == nil {
			t.Errorf("cgroup %s left in %s", l.CgroupParent, h)
		}
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mi), "\n") {
		for _, d := range []string{l.State, l.Root} {
			if strings.Contains(line, " "+d+"/") {
				t.Errorf("mount left: %s", line)
			}
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		cmd, _ := os.ReadFile(p)
		if bytes.Contains(cmd, []byte("containerd-shim")) && bytes.Contains(cmd, []byte(l.Address+"\x00")) && processAlive(pidOf(p)) {
			t.Errorf("shim left: %s", bytes.ReplaceAll(cmd, []byte{0}, []byte{' '}))
		}
	}
	for _, id := range ids {
		sum := sha256.Sum256([]byte(filepath.Join(l.Address, l.Namespace, id)))
		if _, err := os.Stat(filepath.Join("/run/containerd/s", hex.EncodeToString(sum[:]))); err == nil {
			t.Errorf("shim socket of %s left", id)
		}
	}
}

func pidOf(procPath string) int {
	var pid int
	fmt.Sscanf(strings.TrimPrefix(procPath, "/proc/"), "%d", &pid)
	return pid
}
