package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/client"
	"github.com/shoal-dev/shoal/pkg/devcluster"
	shoalrt "github.com/shoal-dev/shoal/pkg/runtime"
	"github.com/shoal-dev/shoal/pkg/testimage"
	daemonv1 "github.com/shoal-dev/shoal/proto/shoal/daemon/v1"
	schedv1 "github.com/shoal-dev/shoal/proto/shoal/sched/v1"
)

// schedCluster is a 3-node cluster running statd and schedd, each node
// with its own containerd, and the test image loaded on node 1 only.
type schedCluster struct {
	*devcluster.Cluster
	t     *testing.T
	ids   []string // node IDs, index 0 is node 1
	image string   // path of the test image archive
	// registryAuth is the schedds' --registry-auth file (absent until a
	// test writes it).
	registryAuth string
}

func newSchedCluster(t *testing.T) *schedCluster {
	t.Helper()
	name := fmt.Sprintf("s%d", rand.IntN(1_000_000))
	registryAuth := filepath.Join(t.TempDir(), "registry-auth.json")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := devcluster.Up(ctx, devcluster.Spec{
		Name:    name,
		Nodes:   3,
		Subnet:  devcluster.AutoSubnet,
		BinDir:  binDir,
		Daemons: []string{"statd", "schedd"},
		Extra:   []devcluster.ProcessSpec{devcluster.ContainerdProcess("")},
		Args: map[string][]string{"statd": {"--node-name", "n{node}"}, "schedd": append(devcluster.ScheddArgs(), "--task-network", "host",
			// The registry of RegistryPull listens on the bridge, over http.
			"--insecure-registry", "10.99.0.0/16", "--registry-auth", registryAuth,
			// Small task logs, so that TestSchedulerMore/LogsTimesAndRotation
			// rotates one quickly.
			"--log-max-size", "64KiB", "--log-max-files", "2")},
		Bootstrap: true,
	})
	if err != nil {
		t.Fatalf("dev cluster up: %v", err)
	}
	sc := &schedCluster{Cluster: c, t: t, registryAuth: registryAuth}
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("SHOAL_E2E_LOGS") != "" {
			for i := 1; i <= c.Nodes(); i++ {
				for _, d := range []string{"statd", "schedd"} {
					if b, err := os.ReadFile(c.LogPath(i, d)); err == nil {
						lines := strings.Split(strings.TrimSpace(string(b)), "\n")
						t.Logf("node %d %s log:\n%s", i, d, strings.Join(lines[max(0, len(lines)-logTail):], "\n"))
					}
				}
			}
		}
		if err := c.Down(context.Background()); err != nil {
			t.Errorf("dev cluster down: %v", err)
		}
	})
	for i := 1; i <= 3; i++ {
		sc.ids = append(sc.ids, clusterStatus(t, nodeClient(t, c, i)).GetNodeId())
	}
	// The daemons serve before schedd is in the cluster (it waits for
	// statd's identity) and before every node's capacity reached every
	// node: wait for both, or the first placements see fewer nodes.
	waitFor(t, 30*time.Second, "schedd ready and every node published on every node", func() bool {
		for i := 1; i <= 3; i++ {
			if _, _, code := sc.ctl(i, "service", "ls"); code != 0 {
				return false
			}
			out, _, code := sc.ctl(i, "state", "ls", "/nodes/", "-o", "json")
			if code != 0 || strings.Count(out, `"schedd_port"`) != 3 {
				return false
			}
		}
		return true
	})
	sc.image = writeTestImage(t)
	sc.mustCtl(1, "image", "load", sc.image)
	waitFor(t, 15*time.Second, "the image recorded on every node", func() bool {
		for i := 1; i <= 3; i++ {
			if out, _, _ := sc.ctl(i, "image", "ls", "-o", "json"); !strings.Contains(out, sc.ids[0]) {
				return false
			}
		}
		return true
	})
	return sc
}

func (c *schedCluster) ctl(i int, args ...string) (string, string, int) {
	c.t.Helper()
	out, errOut, code, err := c.Ctl(context.Background(), i, args...)
	if err != nil {
		c.t.Fatalf("shoalctl %v: %v", args, err)
	}
	return out, errOut, code
}

func (c *schedCluster) mustCtl(i int, args ...string) string {
	c.t.Helper()
	out, errOut, code := c.ctl(i, args...)
	if code != 0 {
		c.t.Fatalf("node %d: shoalctl %s: exit %d\n%s%s", i, strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// removeIfFailed removes service name (through node i of c) when t
// fails, so that a failed subtest does not leave its tasks, ports or
// volume users to the subtests after it.
func removeIfFailed(t *testing.T, c *devcluster.Cluster, i int, name string) {
	t.Cleanup(func() {
		if t.Failed() {
			_, _, _, _ = c.Ctl(context.Background(), i, "service", "rm", "--detach", name)
		}
	})
}

// partitionFor cuts c into groups until the returned heal is called or
// the test ends, so that a failed test leaves no partition behind.
func partitionFor(t *testing.T, c *devcluster.Cluster, groups [][]int) (heal func() error) {
	t.Helper()
	if err := c.Partition(context.Background(), groups); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	var err error
	heal = func() error {
		once.Do(func() { err = c.Heal(context.Background()) })
		return err
	}
	t.Cleanup(func() { heal() })
	return heal
}

func (c *schedCluster) schedd(i int) *client.Schedd {
	c.t.Helper()
	// A schedd that was just restarted answers UNAVAILABLE until it has
	// found its cluster again (about a second): retry through that.
	s, err := client.NewSchedd(c.RunDir(i), client.Retry{Attempts: 40, Max: 500 * time.Millisecond})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { s.Close() })
	return s
}

// runtime opens a client of node i's containerd, in its namespace.
func (c *schedCluster) runtime(i int) *shoalrt.Containerd {
	c.t.Helper()
	l := c.Containerd(i)
	rt, err := shoalrt.NewContainerd(shoalrt.Config{Address: l.Address, Namespace: l.Namespace, RuncRoot: l.RuncRoot, CgroupParent: l.CgroupParent, StateDir: c.t.TempDir()})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { rt.Close() })
	return rt
}

// containers returns the running Shoal containers of each node, by node
// index (1-based), as task ID -> pid. A node whose containerd is down
// (killed with the node) runs none.
func (c *schedCluster) containers(service string) map[int]map[string]uint32 {
	c.t.Helper()
	return c.listContainers(service, true)
}

// existing is containers, stopped ones included (their pid is 0).
func (c *schedCluster) existing(service string) map[int]map[string]uint32 {
	c.t.Helper()
	return c.listContainers(service, false)
}

func (c *schedCluster) listContainers(service string, running bool) map[int]map[string]uint32 {
	c.t.Helper()
	out := map[int]map[string]uint32{}
	for i := 1; i <= c.Nodes(); i++ {
		out[i] = map[string]uint32{}
		if _, err := os.Stat(c.Containerd(i).Address); err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		infos, err := c.runtime(i).List(ctx)
		cancel()
		if err != nil {
			if strings.Contains(err.Error(), "connection refused") {
				continue
			}
			c.t.Fatalf("node %d containers: %v", i, err)
		}
		for _, ti := range infos {
			if (!running || ti.Status == shoalrt.StatusRunning) && (service == "" || ti.Labels["io.shoal/service"] == service) {
				out[i][ti.ID] = ti.Pid
			}
		}
	}
	return out
}

// scheddInfo asks node i's schedd for its Info (pid, scheduler_ready,
// ledger figures) over a connection of its own, closed before it
// returns: it does not touch t, so samplers may call it.
func (c *schedCluster) scheddInfo(ctx context.Context, i int) (*daemonv1.InfoResponse, error) {
	conn, err := client.Dial(c.RunDir(i), "schedd", client.Retry{Attempts: 1})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return daemonv1.NewDaemonClient(conn).Info(ictx, &daemonv1.InfoRequest{})
}

func (c *schedCluster) tasks(service string) []*schedv1.Task {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := c.schedd(1).ListTasks(ctx, &schedv1.ListTasksRequest{Service: service})
	if err != nil {
		c.t.Fatal(err)
	}
	return resp.GetTasks()
}

// perNode counts the current running tasks of a service per node index,
// as node 1 lists them once none of them is still pending or starting and
// want of them run (for up to 10 s; then it returns what it counted). A
// command on another node returns once that node sees its tasks run;
// node 1 hears of the last one's start a gossip round later, or of the
// task itself: counting at once found a task short now and then, and so
// did counting once none was pending (CI: 9 replicas as [3 3 2]).
func (c *schedCluster) perNode(service string, want int) [3]int {
	deadline := time.Now().Add(10 * time.Second)
	for {
		var out [3]int
		settled := true
		for _, t := range c.tasks(service) {
			if !t.GetCurrent() {
				continue
			}
			switch t.GetState() {
			case "pending", "starting":
				settled = false
				continue
			case "running":
			default:
				continue
			}
			for i, id := range c.ids {
				if t.GetNode() == id {
					out[i]++
				}
			}
		}
		if (settled && out[0]+out[1]+out[2] == want) || time.Now().After(deadline) {
			return out
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestScheduler(t *testing.T) {
	c := newSchedCluster(t)
	ctx := context.Background()

	t.Run("SpreadScaleRemove", func(t *testing.T) {
		c.mustCtl(2, "service", "create", "spread", "--image", "local/busybox:latest", "--stop-grace", "1s", "--replicas", "6", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 2, "spread")
		if got := c.perNode("spread", 6); got != [3]int{2, 2, 2} {
			t.Fatalf("6 replicas spread as %v, want 2/2/2", got)
		}
		// The image was loaded on node 1 only; nodes 2 and 3 fetched it.
		for i := 2; i <= 3; i++ {
			if _, err := c.runtime(i).Image(ctx, "local/busybox:latest"); err != nil {
				t.Fatalf("node %d lacks the image: %v", i, err)
			}
		}
		c.mustCtl(3, "service", "scale", "spread=9")
		if got := c.perNode("spread", 9); got != [3]int{3, 3, 3} {
			t.Fatalf("9 replicas spread as %v, want 3/3/3", got)
		}
		c.mustCtl(1, "service", "scale", "spread=3")
		// The containers of the slots scaled away are removed, not just
		// stopped: no history is kept for a slot that is gone.
		waitFor(t, 30*time.Second, "3 containers left, none stopped", func() bool {
			n := 0
			for _, m := range c.existing("spread") {
				n += len(m)
			}
			return n == 3
		})
		if got := c.perNode("spread", 3); got != [3]int{1, 1, 1} {
			t.Fatalf("3 replicas spread as %v, want 1/1/1", got)
		}
		c.mustCtl(2, "service", "rm", "spread")
		// rm returns once every task has stopped; removing the stopped
		// containers (and their snapshots) follows in the same agent
		// round.
		waitFor(t, 10*time.Second, "no container of spread on any node", func() bool {
			for _, m := range c.existing("spread") {
				if len(m) != 0 {
					return false
				}
			}
			return true
		})
		if m := c.existing(""); len(m[1])+len(m[2])+len(m[3]) != 0 {
			t.Fatalf("containers left on the nodes after rm: %v", m)
		}
	})

	t.Run("BadInput", func(t *testing.T) {
		cases := []struct {
			args []string
			msg  string
		}{
			{[]string{"service", "create", "ghost", "--image", "local/nope:1"}, "not on any node"},
			{[]string{"service", "create", "huge", "--image", "local/busybox:latest", "--memory", "100TiB"}, "more than any node offers"},
			{[]string{"service", "create", "Bad_Name", "--image", "local/busybox:latest"}, "name"},
			{[]string{"service", "create", "neg", "--image", "local/busybox:latest", "--replicas", "-1"}, "replicas"},
			{[]string{"service", "create", "badc", "--image", "local/busybox:latest", "--constraint", "node.labels.zone~eu"}, "constraint"},
		}
		for _, tc := range cases {
			_, errOut, code := c.ctl(1, tc.args...)
			if code != 2 || !strings.Contains(errOut, tc.msg) {
				t.Errorf("shoalctl %v: exit %d %q, want exit 2 and %q", tc.args, code, errOut, tc.msg)
			}
		}
		bad := filepath.Join(c.NodeDir(1), "bad.yaml")
		os.WriteFile(bad, []byte("name: web\nimage: local/busybox:latest\nreplicaz: 3\n"), 0o644)
		if _, errOut, code := c.ctl(1, "service", "deploy", "-f", bad); code != 2 || !strings.Contains(errOut, "replicaz") {
			t.Errorf("malformed spec file: exit %d %q", code, errOut)
		}
		c.mustCtl(1, "service", "create", "dup", "--image", "local/busybox:latest", "--replicas", "1", "--stop-grace", "1s", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 1, "dup")
		if _, errOut, code := c.ctl(2, "service", "create", "dup", "--image", "local/busybox:latest"); code == 0 || !strings.Contains(errOut, "already exists") {
			t.Errorf("duplicate service: exit %d %q", code, errOut)
		}
		// An impossible constraint is accepted but reported unschedulable,
		// with the reason.
		c.mustCtl(1, "service", "create", "nowhere", "--image", "local/busybox:latest", "--constraint", "node.labels.zone==mars", "--detach", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 1, "nowhere")
		// The reason is the owner's placement verdict, published in the
		// service document: every node's inspect and ps show it. (The
		// constraint itself is in spec.constraints whatever happens, so
		// only the unschedulable field tells.)
		const reason = "3 nodes: 3 fail constraint node.labels.zone==mars"
		waitFor(t, 15*time.Second, "unschedulable reason in service inspect", func() bool {
			var v struct {
				Running       uint32   `json:"running"`
				Unschedulable []string `json:"unschedulable"`
			}
			out, _, code := c.ctl(3, "service", "inspect", "nowhere", "-o", "json")
			if code != 0 {
				return false // not on node 3 yet
			}
			if err := json.Unmarshal([]byte(out), &v); err != nil {
				t.Fatalf("service inspect -o json: %v\n%s", err, out)
			}
			return v.Running == 0 && slices.Contains(v.Unschedulable, reason)
		})
		if out, errOut, code := c.ctl(2, "service", "ps", "nowhere"); code != 0 || !strings.Contains(errOut, reason) || strings.Count(out, "\n") != 1 {
			t.Errorf("service ps of an unschedulable service: exit %d, stdout %q, stderr %q; want only the header and %q on stderr", code, out, errOut, reason)
		}
		for _, s := range []string{"ghost", "huge", "Bad_Name", "neg", "badc"} {
			if _, _, code := c.ctl(1, "service", "inspect", s); code != 3 {
				t.Errorf("rejected service %s exists (exit %d)", s, code)
			}
		}
		c.mustCtl(1, "service", "rm", "dup", "nowhere")
	})

	t.Run("CreateRightAfterLoadElsewhere", func(t *testing.T) {
		// Node 3 learns by gossip, a moment later, of an image node 1 has
		// just loaded: a create on node 3 right away waits for that record
		// rather than refusing the image as on no node.
		tarball := filepath.Join(t.TempDir(), "fresh.tar")
		if _, err := testimage.WriteFile(tarball, "oci", testimage.Spec{Name: "local/fresh:1"}); err != nil {
			t.Fatal(err)
		}
		// Node 3 cut off while node 1 loads it, so that the record is
		// surely late: node 3's create starts before the heal.
		heal := partitionFor(t, c.Cluster, [][]int{{1, 2}, {3}})
		c.mustCtl(1, "image", "load", tarball)
		removeIfFailed(t, c.Cluster, 3, "fresh")
		created := make(chan error, 1)
		start := time.Now()
		go func() {
			_, errOut, code := c.ctl(3, "service", "create", "fresh", "--image", "local/fresh:1", "--replicas", "1", "--stop-grace", "1s", "--constraint", "node.name==n3", "--detach", "--", "sleep", "1000000")
			if code != 0 {
				created <- fmt.Errorf("exit %d: %s", code, errOut)
			}
			close(created)
		}()
		time.Sleep(300 * time.Millisecond)
		if err := heal(); err != nil {
			t.Fatal(err)
		}
		if err := <-created; err != nil {
			t.Fatalf("service create on node 3 right after the load on node 1: %v", err)
		}
		t.Logf("the create took %v, 300 ms of them cut off", time.Since(start).Round(time.Millisecond))
		waitFor(t, 30*time.Second, "fresh running on node 3 with the image fetched from node 1", func() bool {
			return c.perNode("fresh", 1) == [3]int{0, 0, 1}
		})
		c.mustCtl(3, "service", "rm", "fresh")
	})

	t.Run("ScheddKill9KeepsContainers", func(t *testing.T) {
		c.mustCtl(1, "service", "create", "steady", "--image", "local/busybox:latest", "--stop-grace", "1s", "--replicas", "3", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 1, "steady")
		// The victim is the service's owner, which runs one of its tasks
		// too: both roles restart.
		var svc struct{ Owner string }
		if err := json.Unmarshal([]byte(c.mustCtl(2, "service", "inspect", "steady", "-o", "json")), &svc); err != nil {
			t.Fatal(err)
		}
		victim := 0
		for i, id := range c.ids {
			if id == svc.Owner {
				victim = i + 1
			}
		}
		before := c.containers("steady")
		if victim == 0 || len(before[victim]) != 1 {
			t.Fatalf("owner %q, containers %v: want the owner to run one task", svc.Owner, before)
		}
		first, err := c.scheddInfo(ctx, victim)
		if err != nil {
			t.Fatal(err)
		}
		tasks := first.GetDetails()["tasks"]
		unchanged := func(when string) {
			t.Helper()
			if now := c.containers("steady"); fmt.Sprint(now) != fmt.Sprint(before) {
				t.Fatalf("%s: containers %v, before %v", when, now, before)
			}
		}
		pid := first.GetPid()
		for k := range 10 {
			if err := c.Kill(ctx, victim, "schedd"); err != nil {
				t.Fatal(err)
			}
			unchanged(fmt.Sprintf("schedd kill %d", k+1))
			if err := c.Start(ctx, victim, "schedd"); err != nil {
				t.Fatal(err)
			}
			// Start returns once the socket serves; the scheduler is ready
			// once it has caught up with state and re-adopted its tasks.
			waitFor(t, 30*time.Second, fmt.Sprintf("schedd restart %d ready with its %s tasks", k+1, tasks), func() bool {
				in, err := c.scheddInfo(ctx, victim)
				return err == nil && in.GetPid() != pid && in.GetDetails()["scheduler_ready"] == "true" && in.GetDetails()["tasks"] == tasks
			})
			in, err := c.scheddInfo(ctx, victim)
			if err != nil {
				t.Fatal(err)
			}
			pid = in.GetPid()
			unchanged(fmt.Sprintf("schedd restart %d", k+1))
			// Converged, as the restarted node itself reports it.
			var st struct {
				State            string
				Running, Desired uint32
			}
			if err := json.Unmarshal([]byte(c.mustCtl(victim, "service", "inspect", "steady", "-o", "json")), &st); err != nil {
				t.Fatal(err)
			}
			if st.State != "active" || st.Running != 3 || st.Desired != 3 {
				t.Fatalf("after schedd restart %d, node %d reports %+v, want active 3/3", k+1, victim, st)
			}
		}
		for _, tk := range c.tasks("steady") {
			if tk.GetRestarts() != 0 || tk.GetState() != "running" {
				t.Fatalf("task %s %s, restarted %d times", tk.GetId(), tk.GetState(), tk.GetRestarts())
			}
		}
		c.mustCtl(1, "service", "rm", "steady")
	})

	t.Run("CrashLoopBacksOff", func(t *testing.T) {
		c.mustCtl(1, "service", "create", "crash", "--image", "local/busybox:latest", "--stop-grace", "1s", "--replicas", "1", "--detach", "--", "sh", "-c", "exit 3")
		removeIfFailed(t, c.Cluster, 1, "crash")
		time.Sleep(8 * time.Second)
		var restarts uint32
		for _, tk := range c.tasks("crash") {
			restarts = max(restarts, tk.GetRestarts())
		}
		// Backoff 1s, 2s, 4s: about 3 restarts in 8s; without backoff a
		// task that exits at once would restart dozens of times.
		if restarts < 1 || restarts > 5 {
			t.Fatalf("crash-looping task restarted %d times in 8s", restarts)
		}
		c.mustCtl(1, "service", "rm", "crash")
	})

	t.Run("UnhealthyTaskReplaced", func(t *testing.T) {
		c.mustCtl(1, "service", "create", "health", "--image", "local/busybox:latest", "--stop-grace", "1s", "--replicas", "1",
			"--health-cmd", "test -f /tmp/ok", "--health-interval", "500ms", "--health-retries", "2",
			"--", "sh", "-c", "touch /tmp/ok; exec sleep 1000000")
		removeIfFailed(t, c.Cluster, 1, "health")
		var first *schedv1.Task
		for _, tk := range c.tasks("health") {
			if tk.GetCurrent() {
				first = tk
			}
		}
		if first == nil || first.GetHealth() != "healthy" {
			t.Fatalf("task not healthy: %v", first)
		}
		c.mustCtl(2, "task", "exec", first.GetId(), "--", "rm", "/tmp/ok")
		waitFor(t, 30*time.Second, "unhealthy task replaced", func() bool {
			for _, tk := range c.tasks("health") {
				if tk.GetCurrent() && tk.GetId() != first.GetId() && tk.GetState() == "running" {
					return true
				}
			}
			return false
		})
		c.mustCtl(1, "service", "rm", "health")
	})

	t.Run("BadUpdateRollsBack", func(t *testing.T) {
		c.mustCtl(1, "service", "create", "roll", "--image", "local/busybox:latest", "--stop-grace", "1s", "--replicas", "2", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 1, "roll")
		_, errOut, code := c.ctl(2, "service", "update", "roll", "--update-failure-action", "rollback", "--update-monitor", "3s",
			"--restart-max-attempts", "1", "--", "sh", "-c", "exit 7")
		if code == 0 || !strings.Contains(errOut, "rolled back") {
			t.Fatalf("bad update: exit %d %q", code, errOut)
		}
		out := c.mustCtl(3, "service", "inspect", "roll", "-o", "json")
		if !strings.Contains(out, `"sleep"`) || strings.Contains(out, "exit 7") {
			t.Fatalf("spec after rollback:\n%s", out)
		}
		waitFor(t, 30*time.Second, "2 running after rollback", func() bool {
			n := 0
			for _, m := range c.containers("roll") {
				n += len(m)
			}
			return n == 2
		})
		c.mustCtl(1, "service", "rm", "roll")
	})

	t.Run("NeverOvercommitWithTwoOwners", func(t *testing.T) {
		// Nodes 1 and 2 both reconcile every service: owners disagree.
		for _, i := range []int{1, 2} {
			os.WriteFile(filepath.Join(c.StateDir(i, "schedd"), "debug-own-all"), nil, 0o644)
			defer os.Remove(filepath.Join(c.StateDir(i, "schedd"), "debug-own-all"))
		}
		info := func(i int) map[string]string {
			resp, err := c.scheddInfo(ctx, i)
			if err != nil {
				return nil
			}
			return resp.GetDetails()
		}
		counter := func(d map[string]string, name string) int64 {
			v, err := strconv.ParseInt(d[name], 10, 64)
			if err != nil {
				t.Fatalf("schedd detail %s: %q: %v", name, d[name], err)
			}
			return v
		}
		// Whether a second owner places before the first one's slot
		// documents reach it depends on gossip timing (the node that
		// created the service may own it and place at once), so a run
		// without a race is repeated, a bounded number of times; every
		// run must be free of overcommit.
		race := func(name string) bool {
			var sent0, rejected0 [3]int64
			for i := 1; i <= 3; i++ {
				d := info(i)
				sent0[i-1], rejected0[i-1] = counter(d, "reserves_sent"), counter(d, "reserves_rejected")
			}
			capMem, _ := strconv.ParseInt(info(1)["capacity_memory"], 10, 64)
			per := capMem/2 - 1<<20 // two tasks fit a node, three do not
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var violation string
			var samples int
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					for i := 1; i <= 3; i++ {
						d := info(i)
						used, _ := strconv.ParseInt(d["reserved_memory"], 10, 64)
						capa, _ := strconv.ParseInt(d["capacity_memory"], 10, 64)
						if d != nil {
							samples++
						}
						if used > capa {
							violation = fmt.Sprintf("node %d reserved %d of %d bytes", i, used, capa)
						}
					}
					time.Sleep(20 * time.Millisecond)
				}
			}()
			c.mustCtl(3, "service", "create", name, "--image", "local/busybox:latest", "--stop-grace", "1s", "--replicas", "6", "--memory", strconv.FormatInt(per, 10), "--", "sleep", "1000000")
			waitFor(t, 30*time.Second, "6 containers, 2 per node", func() bool {
				cs := c.containers(name)
				return len(cs[1]) == 2 && len(cs[2]) == 2 && len(cs[3]) == 2
			})
			time.Sleep(2 * time.Second)
			close(stop)
			wg.Wait()
			if violation != "" {
				t.Fatalf("overcommit observed: %s", violation)
			}
			if samples < 50 {
				t.Fatalf("only %d ledger samples", samples)
			}
			// The race happened: at least two owners placed (nodes 1 and 2,
			// and the service's own owner if it is node 3), and the targets'
			// ledgers turned some of their Reserves down.
			var rejected int64
			var sent [3]int64
			owners := 0
			for i := 1; i <= 3; i++ {
				d := info(i)
				sent[i-1] = counter(d, "reserves_sent") - sent0[i-1]
				rejected += counter(d, "reserves_rejected") - rejected0[i-1]
				if sent[i-1] > 0 {
					owners++
				}
			}
			t.Logf("%s: Reserves sent by nodes 1, 2, 3: %v; rejected: %d", name, sent, rejected)
			return owners >= 2 && rejected > 0
		}
		raced := false
		for attempt := 1; attempt <= 4 && !raced; attempt++ {
			name := fmt.Sprintf("big%d", attempt)
			raced = race(name)
			c.mustCtl(1, "service", "rm", name)
			waitFor(t, 30*time.Second, "the containers of "+name+" removed", func() bool {
				n := 0
				for _, m := range c.existing(name) {
					n += len(m)
				}
				return n == 0
			})
		}
		if !raced {
			t.Fatalf("in 4 runs never two owners placing with some Reserves rejected: no race was tested")
		}
	})

	t.Run("CorruptBlobRejected", func(t *testing.T) {
		v2 := filepath.Join(t.TempDir(), "v2.tar")
		built, err := testimage.WriteFile(v2, "oci", testimage.V2())
		if err != nil {
			t.Fatal(err)
		}
		c.mustCtl(1, "image", "load", v2)
		// Flip a byte of the image's own layer in node 1's content store.
		layer := built[0].Layers[len(built[0].Layers)-1].Digest
		blob := filepath.Join(c.Containerd(1).Root, "io.containerd.content.v1.content", "blobs", "sha256", layer.Encoded())
		data, err := os.ReadFile(blob)
		if err != nil {
			t.Fatal(err)
		}
		data[len(data)/2] ^= 0xff
		if err := os.WriteFile(blob, data, 0o644); err != nil {
			t.Fatal(err)
		}
		c.mustCtl(1, "service", "create", "corrupt", "--image", "local/busybox:v2", "--stop-grace", "1s", "--constraint", "node.name==n2", "--detach", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 1, "corrupt")
		waitFor(t, 30*time.Second, "digest error reported", func() bool {
			for _, tk := range c.tasks("corrupt") {
				if strings.Contains(tk.GetError(), "digest") || strings.Contains(tk.GetError(), "data loss") {
					return true
				}
			}
			return false
		})
		if _, err := c.runtime(2).Image(ctx, "local/busybox:v2"); err == nil {
			t.Fatal("node 2 has the image built from a corrupted blob")
		}
		c.mustCtl(1, "service", "rm", "corrupt")
	})

	t.Run("NodeDeathAndReturn", func(t *testing.T) {
		c.mustCtl(1, "service", "create", "survive", "--image", "local/busybox:latest", "--stop-grace", "1s", "--replicas", "3", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 1, "survive")
		// shoalctl events on node 1 tells node 3's death and return, as
		// node 1's failure detector sees them.
		liveness := c.startCtl(1, "events", "-f", "type=node", "-f", "node="+c.ids[2], "--format", "{{.Action}}")
		// Its watch is under way (so its first look at the members is
		// done) once it shows a label put on node 3. A label put before
		// it listed the nodes is in the list, not an event: put another
		// each second until one shows.
		round := 0
		waitFor(t, 30*time.Second, "a label's update in shoalctl events", func() bool {
			if strings.Contains(liveness.out.String(), "update\n") {
				return true
			}
			round++
			c.mustCtl(2, "node", "update", c.ids[2], "--label-add", fmt.Sprintf("events=seen%d", round))
			time.Sleep(time.Second)
			return strings.Contains(liveness.out.String(), "update\n")
		})
		if err := c.Kill(ctx, 3, ""); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 40*time.Second, "3 replicas on nodes 1 and 2", func() bool {
			cs := c.containers("survive")
			return len(cs[1])+len(cs[2]) == 3
		})
		if err := c.Start(ctx, 3, ""); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Second)
		waitFor(t, 40*time.Second, "no duplicates after node 3 returns", func() bool {
			cs := c.containers("survive")
			return len(cs[1])+len(cs[2])+len(cs[3]) == 3
		})
		defer func() {
			if t.Failed() {
				t.Logf("shoalctl events: %q, stderr %q", liveness.out.String(), liveness.errOut.String())
			}
		}()
		// Suspect, or dead too, as the failure detector got to before
		// node 3 was back (a CI run saw suspect then alive).
		waitFor(t, 20*time.Second, "node 3 suspect or dead, then alive, in shoalctl events", func() bool {
			out := liveness.out.String()
			down := strings.Index(out, "suspect\n")
			if d := strings.Index(out, "dead\n"); down < 0 || (d >= 0 && d < down) {
				down = d
			}
			return down >= 0 && strings.Contains(out[down:], "alive\n")
		})
		if code := liveness.interrupt(t); code != 0 {
			t.Errorf("events after SIGINT: exit %d, %q", code, liveness.errOut.String())
		}
		c.mustCtl(2, "service", "rm", "survive")
	})

	t.Run("PartitionStaleCopiesStopped", func(t *testing.T) {
		// Unlike NodeDeathAndReturn, node 3 lives on through the partition:
		// its containers keep running, and alone it owns every service
		// and replaces the replicas of nodes 1 and 2 on itself. After the
		// heal every slot goes back to the older task, the one it had
		// before the split (DESIGN.md 2), and the copies each side made
		// during it stop.
		c.mustCtl(1, append([]string{"service", "create", "split", "--image", "local/busybox:latest", "--stop-grace", "1s", "--replicas", "3", "--"}, termSleep...)...)
		removeIfFailed(t, c.Cluster, 1, "split")
		before := c.containers("split")
		if len(before[1]) != 1 || len(before[2]) != 1 || len(before[3]) != 1 {
			t.Fatalf("containers %v, want one per node", before)
		}
		stale := firstKey(before[3])
		heal := partitionFor(t, c.Cluster, [][]int{{1, 2}, {3}})
		waitFor(t, 40*time.Second, "node 3's replica replaced on nodes 1 and 2", func() bool {
			cs := c.containers("split")
			return len(cs[1])+len(cs[2]) == 3
		})
		// And the other side: node 3 declares nodes 1 and 2 dead, owns
		// the service alone and replaces their replicas on itself.
		st3 := nodeClient(t, c.Cluster, 3)
		waitFor(t, 40*time.Second, "node 3 running all 3 replicas itself", func() bool {
			return len(c.containers("split")[3]) == 3
		})
		for _, m := range clusterStatus(t, st3).GetMembers() {
			if !m.GetSelf() && m.GetState() != "dead" {
				t.Fatalf("node 3 sees %s as %s during the partition", m.GetId(), m.GetState())
			}
		}
		if m := c.containers("split"); m[3][stale] == 0 {
			t.Fatalf("node 3's container %s stopped during the partition: %v", stale, m)
		}
		if err := heal(); err != nil {
			t.Fatal(err)
		}
		// One running container per slot, and exactly the current tasks.
		converged := func() bool {
			cs := c.containers("split")
			running := map[string]bool{}
			for _, m := range cs {
				for id := range m {
					running[id] = true
				}
			}
			slots := map[string]bool{}
			current := map[string]bool{}
			for _, tk := range c.tasks("split") {
				if tk.GetCurrent() && tk.GetState() == "running" {
					slots[tk.GetSlot()] = true
					current[tk.GetId()] = true
				}
			}
			return len(running) == 3 && len(slots) == 3 && fmt.Sprint(running) == fmt.Sprint(current)
		}
		// The replicas that ran before the split are the ones left, node
		// 3's included, although the majority had replaced it. That and
		// the convergence are waited for together: a side that still
		// thinks the other dead as the partition heals may accept one more
		// replacement, which a listing can miss while its container is
		// being created and the next shows, until it stops as superseded.
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			m := c.containers("split")
			if converged() && fmt.Sprint(m) == fmt.Sprint(before) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("containers %v 60s after the heal, want the ones from before the partition %v (node 3's: %s), one per slot and current", m, before, stale)
			}
		}
		time.Sleep(2 * time.Second)
		if !converged() {
			t.Fatalf("not converged 2s later: containers %v", c.containers("split"))
		}
		c.mustCtl(2, "service", "rm", "split")
	})

	// Last: it leaves the cluster with four nodes.
	t.Run("GlobalOnLateJoiner", func(t *testing.T) {
		c.mustCtl(1, "service", "create", "everywhere", "--image", "local/busybox:latest", "--global", "--stop-grace", "1s", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 1, "everywhere")
		if got := c.perNode("everywhere", 3); got != [3]int{1, 1, 1} {
			t.Fatalf("global service runs %v per node, want 1/1/1", got)
		}
		i, err := c.AddNode(ctx)
		if err != nil {
			t.Fatalf("add node: %v", err)
		}
		id := clusterStatus(t, nodeClient(t, c.Cluster, i)).GetNodeId()
		// The image was loaded on node 1 only and names no registry: the
		// new node can only have fetched it from a peer.
		waitFor(t, 60*time.Second, "a task of the global service running on the new node", func() bool {
			for _, tk := range c.tasks("everywhere") {
				if tk.GetNode() == id && tk.GetCurrent() && tk.GetState() == "running" && tk.GetSlot() == id {
					return true
				}
			}
			return false
		})
		if m := c.containers("everywhere"); len(m[1]) != 1 || len(m[2]) != 1 || len(m[3]) != 1 || len(m[i]) != 1 {
			t.Fatalf("containers of the global service per node: %v, want one on each of 4", m)
		}
		if _, err := c.runtime(i).Image(ctx, "local/busybox:latest"); err != nil {
			t.Fatalf("node %d lacks the image: %v", i, err)
		}
		if !strings.Contains(logOf(t, c.LogPath(i, "schedd")), "image fetched from peer") {
			t.Errorf("node %d's schedd log does not show the image fetched from a peer", i)
		}
		waitFor(t, 10*time.Second, "the new node shows everywhere at 4/4", func() bool {
			out, _, code := c.ctl(i, "service", "inspect", "everywhere", "-o", "json")
			var v struct{ Running, Desired uint32 }
			return code == 0 && json.Unmarshal([]byte(out), &v) == nil && v.Running == 4 && v.Desired == 4
		})
		c.mustCtl(i, "service", "rm", "everywhere")
	})
}

// logOf returns a log file's content ("" when unreadable).
func logOf(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Logf("read %s: %v", path, err)
	}
	return string(b)
}
