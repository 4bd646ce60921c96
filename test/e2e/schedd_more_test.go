package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/moby/sys/mountinfo"

	"github.com/shoal-dev/shoal/pkg/client"
	"github.com/shoal-dev/shoal/pkg/devcluster"
	shoalrt "github.com/shoal-dev/shoal/pkg/runtime"
	"github.com/shoal-dev/shoal/pkg/testimage"
	"github.com/shoal-dev/shoal/pkg/volarchive"
	schedv1 "github.com/shoal-dev/shoal/proto/shoal/sched/v1"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

// moreCluster is a schedCluster with one containerd client per node, made
// once, so that samplers can poll every 100 ms without a connection per
// poll and without calling t.Fatal off the test goroutine.
type moreCluster struct {
	*schedCluster
	rts [3]*shoalrt.Containerd
}

func newMoreCluster(t *testing.T) *moreCluster {
	c := &moreCluster{schedCluster: newSchedCluster(t)}
	for i := 1; i <= 3; i++ {
		c.rts[i-1] = c.runtime(i)
	}
	// newSchedCluster returns once the daemons serve, not once schedd is
	// in the cluster (it polls statd for its identity every second) and
	// every node's capacity has reached every node: wait for both, or the
	// first placements see fewer nodes.
	statds := [3]*client.Statd{nodeClient(t, c.Cluster, 1), nodeClient(t, c.Cluster, 2), nodeClient(t, c.Cluster, 3)}
	waitFor(t, 30*time.Second, "schedd ready and every node published on every node", func() bool {
		for i := 1; i <= 3; i++ {
			if _, _, code := c.ctl(i, "service", "ls"); code != 0 {
				return false
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			resp, err := statds[i-1].List(ctx, &statev1.ListRequest{Prefix: "/nodes/"})
			cancel()
			if err != nil {
				return false
			}
			published := 0
			for _, d := range resp.GetDocuments() {
				if d.GetFields()["schedd_port"] != nil && d.GetFields()["availability"] != nil {
					published++
				}
			}
			if published != 3 {
				return false
			}
		}
		return true
	})
	return c
}

// ctlWithin is ctl bounded by a timeout, for commands that wait (a drain
// that never finishes fails the test instead of hanging it).
func (c *moreCluster) ctlWithin(d time.Duration, i int, args ...string) (string, string, int) {
	c.t.Helper()
	return ctlBounded(c.t, c.Cluster, d, i, args...)
}

// ctlBounded runs shoalctl args on node i of dc, failing t if it has not
// exited within d.
func ctlBounded(t *testing.T, dc *devcluster.Cluster, d time.Duration, i int, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	out, errOut, code, err := dc.Ctl(ctx, i, args...)
	if err != nil {
		t.Fatalf("node %d: shoalctl %s: %v\n%s%s", i, strings.Join(args, " "), err, out, errOut)
	}
	return out, errOut, code
}

func (c *moreCluster) mustCtlWithin(d time.Duration, i int, args ...string) string {
	c.t.Helper()
	out, errOut, code := c.ctlWithin(d, i, args...)
	if code != 0 {
		c.t.Fatalf("node %d: shoalctl %s: exit %d\n%s%s", i, strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// running lists the running containers of a service on every node, by
// node index (1-based): container ID -> pid. It does not touch t, so
// samplers may call it from any goroutine.
func (c *moreCluster) running(service string) (map[int]map[string]uint32, error) {
	out := map[int]map[string]uint32{}
	for i := 1; i <= 3; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		infos, err := c.rts[i-1].List(ctx)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("node %d: list containers: %w", i, err)
		}
		out[i] = map[string]uint32{}
		for _, ti := range infos {
			if ti.Status == shoalrt.StatusRunning && ti.Labels["io.shoal/service"] == service {
				out[i][ti.ID] = ti.Pid
			}
		}
	}
	return out, nil
}

func (c *moreCluster) mustRunning(service string) map[int]map[string]uint32 {
	c.t.Helper()
	m, err := c.running(service)
	if err != nil {
		c.t.Fatal(err)
	}
	return m
}

func total(m map[int]map[string]uint32) int {
	n := 0
	for _, s := range m {
		n += len(s)
	}
	return n
}

func ids(m map[int]map[string]uint32) map[string]bool {
	out := map[string]bool{}
	for _, s := range m {
		for id := range s {
			out[id] = true
		}
	}
	return out
}

// sampler counts a service's running containers (over all nodes) at a
// fixed interval until stopped, keeping the lowest and highest count.
type sampler struct {
	stop chan struct{}
	done chan struct{}

	mu       sync.Mutex
	min, max int
	samples  int
	errs     []string
	low      string // the containers when the minimum was seen
}

func (c *moreCluster) sample(service string, every time.Duration) *sampler {
	s := &sampler{stop: make(chan struct{}), done: make(chan struct{}), min: 1 << 30, max: -1}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			m, err := c.running(service)
			s.mu.Lock()
			if err != nil {
				s.errs = append(s.errs, err.Error())
			} else {
				n := total(m)
				s.samples++
				if n < s.min {
					s.min, s.low = n, fmt.Sprint(m)
				}
				s.max = max(s.max, n)
			}
			s.mu.Unlock()
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

// finish stops the sampler and fails the test when it could not sample.
func (s *sampler) finish(t *testing.T, minSamples int) (lo, hi int) {
	t.Helper()
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.errs) > 0 {
		t.Fatalf("sampling failed %d times, first: %s", len(s.errs), s.errs[0])
	}
	if s.samples < minSamples {
		t.Fatalf("only %d samples, want at least %d", s.samples, minSamples)
	}
	t.Logf("%d samples: running containers between %d and %d", s.samples, s.min, s.max)
	return s.min, s.max
}

// currentTasks returns the current (slot-named) tasks of a service.
func (c *moreCluster) currentTasks(service string) []*schedv1.Task {
	var out []*schedv1.Task
	for _, tk := range c.tasks(service) {
		if tk.GetCurrent() {
			out = append(out, tk)
		}
	}
	return out
}

// movedOffNode3 checks that service's current tasks all run on nodes 1
// and 2, and returns the tasks of any version node 1 lists on node 3.
func (c *moreCluster) movedOffNode3(t *testing.T, service string) []*schedv1.Task {
	t.Helper()
	perNode := map[string]int{}
	for _, tk := range c.currentTasks(service) {
		perNode[tk.GetNode()]++
	}
	if perNode[c.ids[2]] != 0 || perNode[c.ids[0]]+perNode[c.ids[1]] != 3 {
		t.Errorf("current tasks per node %v: want 3 on nodes 1 and 2 (node 3 is %s)", perNode, c.ids[2])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	all, err := c.schedd(1).ListTasks(ctx, &schedv1.ListTasksRequest{Service: service, All: true})
	if err != nil {
		t.Fatal(err)
	}
	var out []*schedv1.Task
	for _, tk := range all.GetTasks() {
		if tk.GetNode() == c.ids[2] {
			out = append(out, tk)
		}
	}
	return out
}

// settledTasks waits until node 1 lists want current tasks of a service,
// all of the given version, and returns them. A command on another node
// returns once that node sees the service converged; node 1 learns of the
// new slots and tasks a gossip round later.
func (c *moreCluster) settledTasks(service string, want int, version uint64) []*schedv1.Task {
	c.t.Helper()
	var cur []*schedv1.Task
	deadline := time.Now().Add(15 * time.Second)
	for {
		cur = c.currentTasks(service)
		ok := len(cur) == want
		for _, tk := range cur {
			ok = ok && tk.GetVersion() == version
		}
		if ok {
			return cur
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("node 1 lists %d current tasks of %s (%v), want %d of version %d", len(cur), service, cur, want, version)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// nodeIndex returns the 1-based index of a node ID.
func (c *moreCluster) nodeIndex(id string) int {
	for i, n := range c.ids {
		if n == id {
			return i + 1
		}
	}
	c.t.Fatalf("unknown node %s", id)
	return 0
}

// serviceJSON is the part of `service inspect -o json` the tests read.
type serviceJSON struct {
	Name    string `json:"name"`
	Version uint64 `json:"version"`
	State   string `json:"state"`
	Running uint32 `json:"running"`
	Desired uint32 `json:"desired"`
	Spec    struct {
		Image string   `json:"image"`
		Env   []string `json:"env"`
	} `json:"spec"`
}

// waitLabel waits until every node's shoalctl shows node's label key
// with value.
func (c *moreCluster) waitLabel(t *testing.T, node, key, value string) {
	t.Helper()
	waitFor(t, 15*time.Second, fmt.Sprintf("label %s=%s of %s on every node", key, value, node), func() bool {
		for i := 1; i <= 3; i++ {
			var n struct{ Labels map[string]string }
			if out, _, code := c.ctl(i, "node", "inspect", node, "-o", "json"); code != 0 || json.Unmarshal([]byte(out), &n) != nil || n.Labels[key] != value {
				return false
			}
		}
		return true
	})
}

func (c *moreCluster) inspect(i int, name string) serviceJSON {
	c.t.Helper()
	out := c.mustCtl(i, "service", "inspect", name, "-o", "json")
	var v serviceJSON
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		c.t.Fatalf("service inspect %s -o json: %v\n%s", name, err, out)
	}
	return v
}

// termSleep runs forever and exits at once on SIGTERM (a bare sleep as
// PID 1 ignores it and lives until the grace period's SIGKILL): a gap
// between an old task stopping and its replacement running shows up in
// the running containers instead of being hidden by the grace period.
var termSleep = []string{"sh", "-c", "trap 'exit 0' TERM; sleep 1000000 & wait"}

func TestSchedulerMore(t *testing.T) {
	c := newMoreCluster(t)
	const img = "local/busybox:latest"

	t.Run("JSONOutput", func(t *testing.T) {
		c.mustCtl(1, "service", "create", "js", "--image", img, "--replicas", "2", "--stop-grace", "1s", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 1, "js")
		var task string
		for _, tk := range c.currentTasks("js") {
			task = tk.GetId()
		}
		if task == "" {
			t.Fatal("no current task of js")
		}
		// Each read command, mostly on nodes other than the one the
		// service was created on, decoded and checked for what it must
		// contain.
		var svcs []serviceJSON
		decode(t, c.mustCtl(2, "service", "ls", "-o", "json"), &svcs)
		if len(svcs) != 1 || svcs[0].Name != "js" || svcs[0].Running != 2 || svcs[0].Desired != 2 || svcs[0].Spec.Image != img {
			t.Errorf("service ls -o json: %+v", svcs)
		}
		// docker's --format, and -o template=: a line an item.
		if out := c.mustCtl(2, "service", "ls", "--format", "{{.Name}} {{.Running}}/{{.Desired}} {{.Spec.Image}}"); out != "js 2/2 "+img+"\n" {
			t.Errorf("service ls --format: %q", out)
		}
		if out := c.mustCtl(3, "service", "ps", "js", "-o", "template={{.Slot}}:{{.State}}"); out != "0:running\n1:running\n" {
			t.Errorf("service ps -o template=: %q", out)
		}
		if out := c.mustCtl(1, "service", "ls", "-q"); out != "js\n" {
			t.Errorf("service ls -q: %q", out)
		}
		// docker's --filter.
		if out := c.mustCtl(2, "service", "ls", "-q", "-f", "name=j", "-f", "mode=replicated"); out != "js\n" {
			t.Errorf("service ls -f name=j -f mode=replicated: %q", out)
		}
		if out := c.mustCtl(2, "service", "ls", "-q", "-f", "mode=global"); out != "" {
			t.Errorf("service ls -f mode=global: %q", out)
		}
		if out := c.mustCtl(3, "service", "ps", "js", "-q", "-f", "desired-state=running", "-f", "state=running"); strings.Count(out, "\n") != 2 {
			t.Errorf("service ps -f desired-state=running: %q", out)
		}
		if out := c.mustCtl(1, "node", "ls", "-q", "-f", "name=n2"); out != c.ids[1]+"\n" {
			t.Errorf("node ls -f name=n2: %q, want %s", out, c.ids[1])
		}
		if _, errOut, code := c.ctl(1, "task", "ls", "-f", "colour=red"); code != 2 || !strings.Contains(errOut, "unknown key colour") {
			t.Errorf("task ls -f colour=red: exit %d, %q", code, errOut)
		}
		if ids := strings.Fields(c.mustCtl(1, "node", "ls", "-q")); len(ids) != 3 || !slices.Contains(ids, c.ids[0]) {
			t.Errorf("node ls -q: %v, want the three node IDs", ids)
		}
		var svc serviceJSON
		decode(t, c.mustCtl(3, "service", "inspect", "js", "-o", "json"), &svc)
		if svc.Name != "js" || svc.Version != 1 || svc.State != "active" {
			t.Errorf("service inspect -o json: %+v", svc)
		}
		type taskJSON struct {
			ID, Service, Slot, Node, State string
			Current                        bool
		}
		var ps []taskJSON
		decode(t, c.mustCtl(3, "service", "ps", "js", "-o", "json"), &ps)
		if len(ps) != 2 || ps[0].Service != "js" || ps[0].State != "running" || !ps[0].Current || ps[0].Slot != "0" || ps[1].Slot != "1" {
			t.Errorf("service ps -o json: %+v", ps)
		}
		var tl []taskJSON
		decode(t, c.mustCtl(2, "task", "ls", "-o", "json"), &tl)
		if !slices.ContainsFunc(tl, func(x taskJSON) bool { return x.ID == task }) {
			t.Errorf("task ls -o json lacks %s: %+v", task, tl)
		}
		var tl3 []taskJSON
		decode(t, c.mustCtl(1, "task", "ls", "--node", "n3", "-o", "json"), &tl3)
		on3 := 0
		for _, x := range tl {
			if x.Node == c.ids[2] {
				on3++
			}
		}
		if len(tl3) != on3 || slices.ContainsFunc(tl3, func(x taskJSON) bool { return x.Node != c.ids[2] }) {
			t.Errorf("task ls --node n3 -o json: %+v; task ls has %d tasks on n3", tl3, on3)
		}
		var ti taskJSON
		decode(t, c.mustCtl(1, "task", "inspect", task, "-o", "json"), &ti)
		if ti.ID != task || ti.Service != "js" || ti.State != "running" {
			t.Errorf("task inspect -o json: %+v", ti)
		}
		type imageJSON struct {
			Name, Digest string
			Size         int64
			Nodes        []string
		}
		var imgs []imageJSON
		decode(t, c.mustCtl(3, "image", "ls", "-o", "json"), &imgs)
		i := slices.IndexFunc(imgs, func(x imageJSON) bool { return x.Name == img })
		if i < 0 || !strings.HasPrefix(imgs[i].Digest, "sha256:") || imgs[i].Size <= 0 || !slices.Contains(imgs[i].Nodes, c.ids[0]) {
			t.Errorf("image ls -o json: %+v", imgs)
		}
		type nodeJSON struct {
			ID, Name, Addr, State, Availability string
			CPUs                                int64
			Tasks                               int
		}
		var nodes []nodeJSON
		decode(t, c.mustCtl(2, "node", "ls", "-o", "json"), &nodes)
		var names []string
		tasks := 0
		for _, n := range nodes {
			names = append(names, n.Name)
			tasks += n.Tasks
			if n.State != "alive" || n.Availability != "active" || n.CPUs <= 0 || n.Addr == "" || !slices.Contains(c.ids, n.ID) {
				t.Errorf("node ls -o json: node %+v", n)
			}
		}
		if tasks != 2 {
			t.Errorf("node ls -o json counts %d tasks on the nodes, want js's 2", tasks)
		}
		if fmt.Sprint(names) != "[n1 n2 n3]" {
			t.Errorf("node ls -o json names %v", names)
		}
		var n2 nodeJSON
		decode(t, c.mustCtl(1, "node", "inspect", "n2", "-o", "json"), &n2)
		if n2.ID != c.ids[1] || n2.Name != "n2" {
			t.Errorf("node inspect -o json: %+v", n2)
		}
		c.mustCtl(1, "service", "rm", "js")
	})

	t.Run("GlobalService", func(t *testing.T) {
		c.mustCtl(1, "service", "create", "g", "--image", img, "--global", "--stop-grace", "1s", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 1, "g")
		if got := c.perNode("g", 3); got != [3]int{1, 1, 1} {
			t.Fatalf("global service runs %v tasks per node, want 1/1/1", got)
		}
		before := c.mustRunning("g")
		for i := 1; i <= 3; i++ {
			if len(before[i]) != 1 {
				t.Fatalf("node %d runs %d containers of g, want 1: %v", i, len(before[i]), before)
			}
		}
		// Slots of a global service are node IDs.
		for _, tk := range c.currentTasks("g") {
			if tk.GetSlot() != tk.GetNode() {
				t.Errorf("global task %s has slot %s on node %s", tk.GetId(), tk.GetSlot(), tk.GetNode())
			}
		}

		out := c.mustCtlWithin(time.Minute, 3, "node", "drain", "n2")
		if !strings.Contains(out, "drained (1 tasks moved)") {
			t.Errorf("drain output %q, want 1 task moved", out)
		}
		after := c.mustRunning("g")
		if len(after[2]) != 0 || fmt.Sprint(after[1]) != fmt.Sprint(before[1]) || fmt.Sprint(after[3]) != fmt.Sprint(before[3]) {
			t.Fatalf("after draining n2: containers %v, before %v; want n2 empty, n1 and n3 untouched", after, before)
		}
		if got := c.perNode("g", 2); got != [3]int{1, 0, 1} {
			t.Fatalf("after draining n2: %v tasks per node, want 1/0/1", got)
		}
		// Every node's view follows (the drain was asked on node 3).
		waitFor(t, 10*time.Second, "node 1 shows g at 2/2 running", func() bool {
			s := c.inspect(1, "g")
			return s.Desired == 2 && s.Running == 2
		})
		// Nothing comes back while n2 stays drained.
		time.Sleep(2 * time.Second)
		if m := c.mustRunning("g"); len(m[2]) != 0 {
			t.Fatalf("drained n2 runs %v", m[2])
		}

		c.mustCtl(1, "node", "activate", "n2")
		waitFor(t, 30*time.Second, "a task of g on n2 again", func() bool { return c.perNode("g", 3) == [3]int{1, 1, 1} })
		back := c.mustRunning("g")
		if len(back[2]) != 1 || ids(back)[firstKey(before[2])] {
			t.Fatalf("after activate n2: containers %v, want one new container on n2 (old %v)", back, before[2])
		}
		waitFor(t, 10*time.Second, "node 2 shows g at 3/3 running", func() bool {
			s := c.inspect(2, "g")
			return s.Desired == 3 && s.Running == 3
		})

		// A paused node keeps g's task (same container) and gets none of
		// a new global service, until it is active again.
		if out := c.mustCtl(2, "node", "pause", "n3"); !strings.Contains(out, "paused") {
			t.Errorf("node pause output %q", out)
		}
		c.mustCtl(1, "service", "create", "g2", "--image", img, "--global", "--stop-grace", "1s", "-d", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 1, "g2")
		waitFor(t, 30*time.Second, "g2 on n1 and n2", func() bool { return c.perNode("g2", 2) == [3]int{1, 1, 0} })
		time.Sleep(2 * time.Second) // nothing comes to n3 meanwhile
		if got, m := c.perNode("g2", 2), c.mustRunning("g"); got != [3]int{1, 1, 0} || fmt.Sprint(m[3]) != fmt.Sprint(back[3]) {
			t.Fatalf("n3 paused: g2 %v per node (want 1/1/0), g's containers on n3 %v (want %v, untouched)", got, m[3], back[3])
		}
		waitFor(t, 10*time.Second, "node 3 shows g at 3/3 and g2 at 2/2", func() bool {
			g, g2 := c.inspect(3, "g"), c.inspect(3, "g2")
			return g.Desired == 3 && g.Running == 3 && g2.Desired == 2 && g2.Running == 2
		})
		// By docker node update's spelling.
		if out := c.mustCtl(3, "node", "update", "n3", "--availability", "active"); !strings.Contains(out, "active") {
			t.Errorf("node update --availability active output %q", out)
		}
		waitFor(t, 30*time.Second, "g2 on n3 once it is active", func() bool { return c.perNode("g2", 3) == [3]int{1, 1, 1} })
		c.mustCtl(1, "service", "rm", "g2")

		// A constraint on a label set with `node label` narrows the nodes a
		// global service runs on; every node's schedd must see the label.
		c.mustCtl(3, "node", "label", "n1", "tier=edge")
		c.waitLabel(t, "n1", "tier", "edge")
		c.mustCtl(2, "service", "create", "gone", "--image", img, "--global", "--constraint", "node.labels.tier==edge", "--stop-grace", "1s", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 2, "gone")
		if got := c.perNode("gone", 1); got != [3]int{1, 0, 0} {
			t.Fatalf("global service constrained to tier=edge (n1) runs %v tasks per node, want 1/0/0", got)
		}
		time.Sleep(time.Second)
		if m := c.mustRunning("gone"); len(m[1]) != 1 || len(m[2])+len(m[3]) != 0 {
			t.Fatalf("global service constrained to tier=edge (n1): containers %v", m)
		}
		if s := c.inspect(3, "gone"); s.Desired != 1 {
			t.Errorf("global service constrained to tier=edge (n1): desired %d, want 1", s.Desired)
		}
		c.mustCtl(1, "service", "rm", "g", "gone")
		c.mustCtl(1, "node", "label", "n1", "--rm", "tier")
		if m := c.mustRunning("g"); total(m) != 0 {
			t.Fatalf("g still runs %v after rm", m)
		}
	})

	t.Run("RegistryPull", func(t *testing.T) {
		// A registry of our own (go-containerregistry's, in memory) on the
		// bridge: the nodes reach it over the underlay, nothing else does.
		lis, err := net.Listen("tcp", net.JoinHostPort(c.BridgeAddr(), "0"))
		if err != nil {
			t.Fatal(err)
		}
		// Once the image is pushed, it asks for a password, which the
		// schedds find in their --registry-auth file.
		var pulls, refused atomic.Int32
		var requireAuth atomic.Bool
		password := fmt.Sprintf("pw-%d", rand.Int64())
		var want atomic.Pointer[string] // the password the registry takes
		want.Store(&password)
		reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if user, pass, ok := r.BasicAuth(); requireAuth.Load() && (!ok || user != "puller" || pass != *want.Load()) {
				refused.Add(1)
				w.Header().Set("WWW-Authenticate", `Basic realm="shoal-e2e"`)
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
			if r.Method == http.MethodGet || r.Method == http.MethodHead {
				pulls.Add(1)
			}
			reg.ServeHTTP(w, r)
		})}
		go srv.Serve(lis)
		defer srv.Close()
		ref := lis.Addr().String() + "/shoal/busybox:reg"
		pushTestImage(t, lis.Addr().String(), "shoal/busybox", "reg")
		pulls.Store(0)
		requireAuth.Store(true)
		auth := base64.StdEncoding.EncodeToString([]byte("puller:" + password))
		if err := os.WriteFile(c.registryAuth, []byte(`{"auths": {"`+lis.Addr().String()+`": {"auth": "`+auth+`"}}}`), 0o600); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.ctl(1, "service", "rm", "pulled") })
		// Not loaded anywhere: the first node pulls it from the registry and
		// the others from the registry or from that node.
		c.mustCtl(2, "service", "create", "pulled", "--image", ref, "--replicas", "3", "--stop-grace", "1s", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 2, "pulled")
		if got := c.perNode("pulled", 3); got != [3]int{1, 1, 1} {
			t.Fatalf("pulled image service runs %v per node, want 1/1/1", got)
		}
		if pulls.Load() == 0 || refused.Load() == 0 {
			t.Fatalf("%d fetches from the registry with the password, %d refused without it: want both", pulls.Load(), refused.Load())
		}
		c.mustCtl(1, "service", "rm", "pulled")

		// The password changes; the nodes' files keep the old one. Stored
		// once for the cluster with registry login, the new one is what
		// every node pulls with.
		requireAuth.Store(false)
		ref2 := lis.Addr().String() + "/shoal/busybox:reg2"
		pushTestImage(t, lis.Addr().String(), "shoal/busybox", "reg2")
		password2 := fmt.Sprintf("pw2-%d", rand.Int64())
		want.Store(&password2)
		requireAuth.Store(true)
		pulls.Store(0)
		host := lis.Addr().String()
		if out := c.mustCtl(3, "registry", "login", host, "-u", "puller", "-p", password2); !strings.Contains(out, "credentials of "+host+" stored") {
			t.Fatalf("registry login: %q", out)
		}
		t.Cleanup(func() { c.ctl(1, "registry", "logout", host) })
		var listed []struct{ Host, Secret string }
		if err := json.Unmarshal([]byte(c.mustCtl(1, "registry", "ls", "-o", "json")), &listed); err != nil || len(listed) != 1 || listed[0].Host != host {
			t.Fatalf("registry ls: %+v, %v", listed, err)
		}
		if out := c.mustCtl(2, "secret", "ls"); strings.Contains(out, password2) {
			t.Fatalf("secret ls shows the password:\n%s", out)
		}
		t.Cleanup(func() { c.ctl(1, "service", "rm", "pulled2") })
		c.mustCtl(1, "service", "create", "pulled2", "--image", ref2, "--replicas", "3", "--replicas-max-per-node", "1", "--stop-grace", "1s", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 1, "pulled2")
		if got := c.perNode("pulled2", 3); got != [3]int{1, 1, 1} || pulls.Load() == 0 {
			t.Fatalf("pulled2 runs %v per node after %d fetches with the cluster's password, want 1/1/1", got, pulls.Load())
		}
		c.mustCtl(1, "service", "rm", "pulled2")

		// A third password, in the user's docker login file:
		// --with-registry-auth stores it for the cluster, as Swarm's.
		requireAuth.Store(false)
		ref3 := host + "/shoal/busybox:reg3"
		pushTestImage(t, host, "shoal/busybox", "reg3")
		password3 := fmt.Sprintf("pw3-%d", rand.Int64())
		want.Store(&password3)
		requireAuth.Store(true)
		dockerDir := t.TempDir()
		login := base64.StdEncoding.EncodeToString([]byte("puller:" + password3))
		if err := os.WriteFile(filepath.Join(dockerDir, "config.json"), []byte(`{"auths": {"`+host+`": {"auth": "`+login+`"}}}`), 0o600); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.ctl(1, "service", "rm", "pulled3") })
		out, errOut, code, err := c.Exec(context.Background(), 2, []string{bin("shoalctl"), "service", "create", "pulled3", "--image", ref3, "--with-registry-auth",
			"--replicas", "3", "--replicas-max-per-node", "1", "--stop-grace", "1s", "--", "sleep", "1000000"}, []string{"DOCKER_CONFIG=" + dockerDir})
		if err != nil || code != 0 || !strings.Contains(errOut, "credentials of "+host+" from "+dockerDir) {
			t.Fatalf("service create --with-registry-auth: exit %d, %v\n%s%s", code, err, out, errOut)
		}
		if got := c.perNode("pulled3", 3); got != [3]int{1, 1, 1} {
			t.Fatalf("pulled3 runs %v per node, want 1/1/1", got)
		}
		// The login's secret was replaced by one made beside it, then
		// removed: one is left, under the next name.
		var replaced []struct{ Host, Secret string }
		decode(t, c.mustCtl(1, "registry", "ls", "-o", "json"), &replaced)
		if len(replaced) != 1 || replaced[0].Host != host || !strings.HasSuffix(replaced[0].Secret, "-2") {
			t.Errorf("registry ls after --with-registry-auth: %+v, want one secret of %s, the second", replaced, host)
		}
		c.mustCtl(1, "service", "rm", "pulled3")
		c.mustCtl(2, "registry", "logout", host)
		if out := c.mustCtl(1, "registry", "ls"); strings.Contains(out, host) {
			t.Errorf("registry ls after logout:\n%s", out)
		}
		if _, errOut, code := c.ctl(1, "registry", "logout", host); code != 3 || !strings.Contains(errOut, "no credentials") {
			t.Errorf("a second logout: exit %d, %q; want 3, no credentials", code, errOut)
		}
	})

	t.Run("DockerSaveLoad", func(t *testing.T) {
		// A docker save tarball (not an OCI layout) through the CLI, with
		// a layer of its own that only node 1 has: node 3 must fetch it
		// from node 1 to run the task.
		tarball := filepath.Join(t.TempDir(), "saved.tar")
		spec := testimage.Spec{Name: "local/saved:1", Extra: map[string]string{"etc/saved": "from docker save\n"}}
		if _, err := testimage.WriteFile(tarball, "docker", spec); err != nil {
			t.Fatal(err)
		}
		if out := c.mustCtl(1, "image", "load", tarball); !strings.HasPrefix(out, "loaded local/saved:1 (sha256:") {
			t.Fatalf("image load of a docker save tarball: %q", out)
		}
		type imageJSON struct {
			Name  string
			Nodes []string
		}
		waitFor(t, 15*time.Second, "node 3 knows node 1 holds local/saved:1", func() bool {
			out, _, code := c.ctl(3, "image", "ls", "-o", "json")
			var imgs []imageJSON
			return code == 0 && json.Unmarshal([]byte(out), &imgs) == nil && slices.ContainsFunc(imgs, func(x imageJSON) bool {
				return x.Name == "local/saved:1" && slices.Equal(x.Nodes, []string{c.ids[0]})
			})
		})
		if out := c.catInPinned(t, "saved", "local/saved:1", 3, "/etc/saved"); out != "from docker save\n" {
			t.Errorf("the docker save image's own file in the task on n3: %q", out)
		}
		if _, err := c.rts[2].Image(context.Background(), "local/saved:1"); err != nil {
			t.Errorf("node 3 lacks the image it ran: %v", err)
		}
		c.mustCtl(1, "service", "rm", "saved")
	})

	t.Run("ImageRemove", func(t *testing.T) {
		// An image held by nodes 1 and 3: refused while a service names
		// it; then removed from every node, node 3 (its schedd down at
		// the time) dropping its copy when it runs again; then loaded
		// again and usable.
		ctx := context.Background()
		const ref = "local/gone:1"
		tarball := filepath.Join(t.TempDir(), "gone.tar")
		built, err := testimage.WriteFile(tarball, "oci", testimage.Spec{Name: ref, Extra: map[string]string{"etc/gone": "gone\n"}})
		if err != nil {
			t.Fatal(err)
		}
		manifest := built[0].Manifest.Digest
		c.mustCtl(1, "image", "load", tarball)
		c.mustCtl(2, "service", "create", "gone", "--image", ref, "--constraint", "node.name==n3", "--stop-grace", "1s", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 2, "gone")
		if got := c.perNode("gone", 1); got != [3]int{0, 0, 1} {
			t.Fatalf("gone runs %v per node, want one on n3", got)
		}
		if _, errOut, code := c.ctl(2, "image", "rm", ref); code != 1 || !strings.Contains(errOut, "named by service gone") {
			t.Fatalf("image rm of an image a service names: exit %d, %q; want 1 and the service named", code, errOut)
		}
		for _, i := range []int{1, 3} {
			if _, err := c.rts[i-1].Image(ctx, ref); err != nil {
				t.Fatalf("node %d lost the image a refused rm named: %v", i, err)
			}
		}
		c.mustCtl(1, "service", "rm", "gone")

		held := func(i int) bool {
			_, err := c.rts[i-1].Image(ctx, ref)
			r, _, berr := c.rts[i-1].ReadBlob(ctx, manifest)
			if berr == nil {
				r.Close()
			}
			return err == nil || berr == nil
		}
		if err := c.Kill(ctx, 3, "schedd"); err != nil {
			t.Fatal(err)
		}
		out, errOut, code := c.ctl(2, "image", "rm", ref, "-o", "json", "--timeout", "6s")
		if code != 0 {
			t.Fatalf("image rm: exit %d: %s", code, errOut)
		}
		var removed []struct {
			Name, Digest string
			RemovedFrom  []string `json:"removed_from"`
			Pending      []string
		}
		decode(t, out, &removed)
		if len(removed) != 1 || removed[0].Name != ref || removed[0].Digest != manifest.String() ||
			!slices.Equal(removed[0].RemovedFrom, []string{c.ids[0]}) || !slices.Equal(removed[0].Pending, []string{c.ids[2]}) {
			t.Fatalf("image rm -o json: %s; want removed from %s, pending on %s (its schedd down)", out, c.ids[0], c.ids[2])
		}
		if held(1) {
			t.Error("node 1 still holds the image or its manifest blob after image rm answered")
		}
		if !held(3) {
			t.Error("node 3 dropped the image with its schedd down")
		}
		if err := c.Start(ctx, 3, "schedd"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "node 3's schedd, back, drops its copy", func() bool { return !held(3) })
		type imageJSON struct{ Name string }
		for i := 1; i <= 3; i++ {
			waitFor(t, 10*time.Second, fmt.Sprintf("node %d lists no %s", i, ref), func() bool {
				var imgs []imageJSON
				out, _, code := c.ctl(i, "image", "ls", "-o", "json")
				return code == 0 && json.Unmarshal([]byte(out), &imgs) == nil && !slices.ContainsFunc(imgs, func(x imageJSON) bool { return x.Name == ref })
			})
		}
		if _, _, code := c.ctl(1, "image", "rm", ref); code != 3 {
			t.Errorf("image rm of a removed image: exit %d, want 3 (not found)", code)
		}

		// Loaded again on node 2: live again, and a task on node 1 gets it.
		c.mustCtl(2, "image", "load", tarball)
		if out := c.catInPinned(t, "back", ref, 1, "/etc/gone"); out != "gone\n" {
			t.Errorf("the loaded-again image's file in the task on n1: %q", out)
		}
		c.mustCtl(1, "service", "rm", "back")

		// image prune removes what no service names (ref, now), and keeps
		// what one does (the test image, under a service made for it).
		c.mustCtl(1, "service", "create", "keeper", "--image", img, "--stop-grace", "1s", "-d", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 1, "keeper")
		if _, errOut, code := c.ctl(3, "image", "prune"); code != 2 || !strings.Contains(errOut, "give -f") {
			t.Errorf("image prune without -f and without a terminal: exit %d, %q", code, errOut)
		}
		out = c.mustCtl(3, "image", "prune", "-f", "-o", "json")
		var pruned struct {
			Removed []struct{ Name string }
			Kept    []struct{ Name, Reason string }
		}
		decode(t, out, &pruned)
		if !slices.ContainsFunc(pruned.Removed, func(x struct{ Name string }) bool { return x.Name == ref }) ||
			!slices.ContainsFunc(pruned.Kept, func(x struct{ Name, Reason string }) bool {
				return x.Name == img && strings.Contains(x.Reason, "keeper")
			}) {
			t.Errorf("image prune: %s; want %s removed and %s kept for keeper", out, ref, img)
		}
		waitFor(t, 30*time.Second, "every node drops the pruned image", func() bool { return !held(1) && !held(2) && !held(3) })
		c.mustCtl(1, "service", "rm", "keeper")
	})

	t.Run("Secrets", func(t *testing.T) {
		// A secret created on node 1 reaches tasks on nodes 2 and 3 as
		// read-only files on a tmpfs, is sealed in every node's store,
		// survives a schedd restart, goes with its task, and cannot be
		// removed while a service names it.
		plain := fmt.Sprintf("s3cret-%d", time.Now().UnixNano())
		dir := t.TempDir()
		file := filepath.Join(dir, "pw")
		if err := os.WriteFile(file, []byte(plain), 0o600); err != nil {
			t.Fatal(err)
		}
		empty := filepath.Join(dir, "empty")
		if err := os.WriteFile(empty, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		for _, bad := range [][]string{{"secret", "create", "a/b", file}, {"secret", "create", "e", empty}} {
			if _, errOut, code := c.ctl(1, bad...); code != 2 {
				t.Errorf("shoalctl %v: exit %d (%s), want 2", bad, code, errOut)
			}
		}
		if out := c.mustCtl(1, "secret", "create", "db-pass", file, "--label", "team=a"); !strings.Contains(out, "created secret db-pass (") {
			t.Fatalf("secret create: %q", out)
		}
		// A config: the same files, in plain text, that inspect shows.
		conf := filepath.Join(dir, "app.conf")
		if err := os.WriteFile(conf, []byte("listen 80;\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		c.mustCtl(2, "config", "create", "app.conf", conf)
		waitFor(t, 10*time.Second, "node 3 shows the config's data", func() bool {
			var v struct{ Name, Data string }
			out, _, code := c.ctl(3, "config", "inspect", "app.conf", "-o", "json")
			return code == 0 && json.Unmarshal([]byte(out), &v) == nil && v.Data == "listen 80;\n"
		})
		type secretJSON struct {
			Name   string
			Size   int
			Labels map[string]string
		}
		for i := 2; i <= 3; i++ {
			waitFor(t, 10*time.Second, fmt.Sprintf("node %d lists the secret", i), func() bool {
				var ss []secretJSON
				out, _, code := c.ctl(i, "secret", "ls", "-o", "json")
				return code == 0 && json.Unmarshal([]byte(out), &ss) == nil && len(ss) == 1 &&
					ss[0].Name == "db-pass" && ss[0].Size == len(plain) && ss[0].Labels["team"] == "a"
			})
		}
		if _, errOut, code := c.ctl(2, "secret", "create", "db-pass", file); code != 1 || !strings.Contains(errOut, "already exists") {
			t.Errorf("secret create of a taken name: exit %d, %q; want 1, already exists", code, errOut)
		}
		if _, _, code := c.ctl(3, "secret", "inspect", "nope"); code != 3 {
			t.Errorf("secret inspect of a missing secret: exit %d, want 3", code)
		}
		if _, errOut, code := c.ctl(3, "service", "create", "nosecret", "--image", img, "--secret", "nope", "--", "sleep", "1"); code != 2 || !strings.Contains(errOut, "secret nope does not exist") {
			t.Errorf("service create with a missing secret: exit %d, %q; want 2, does not exist", code, errOut)
		}

		c.mustCtl(1, "service", "create", "sec", "--image", img, "--replicas", "2", "--constraint", "node.name!=n1",
			"--secret", "db-pass", "--secret", "db-pass:/etc/app/pw", "--config", "app.conf:/etc/app.conf", "--stop-grace", "1s", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 1, "sec")
		if got := c.perNode("sec", 2); got != [3]int{0, 1, 1} {
			t.Fatalf("sec runs %v per node, want one on n2 and one on n3", got)
		}
		tasks := c.currentTasks("sec")
		check := func(task *schedv1.Task) {
			t.Helper()
			out := c.mustCtl(1, "task", "exec", task.GetId(), "--", "sh", "-c",
				`cat /run/secrets/db-pass; echo; cat /etc/app/pw; echo; stat -c %a /run/secrets/db-pass; grep " /run/secrets/db-pass " /proc/mounts; (echo x > /run/secrets/db-pass) 2>/dev/null && echo written; cat /etc/app.conf`)
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if len(lines) != 5 || lines[0] != plain || lines[1] != plain || lines[2] != "444" ||
				!strings.HasPrefix(lines[3], "tmpfs /run/secrets/db-pass tmpfs ro,") || lines[4] != "listen 80;" {
				t.Errorf("task %s: secrets as the task sees them:\n%s\nwant the secret twice, mode 444, a read-only tmpfs, no write, and the config", task.GetId(), out)
			}
		}
		hostMount := func(i int, task string) bool {
			mounted, err := mountinfo.Mounted(filepath.Join(c.StateDir(i, "schedd"), "secrets", task))
			return err == nil && mounted
		}
		for _, task := range tasks {
			check(task)
			if i := c.nodeIndex(task.GetNode()); !hostMount(i, task.GetId()) {
				t.Errorf("task %s: its secrets are not on a tmpfs of their own on n%d", task.GetId(), i)
			}
		}
		// Sealed at rest: no node's statd files hold the plain text.
		for i := 1; i <= 3; i++ {
			filepath.WalkDir(c.StateDir(i, "statd"), func(path string, d fs.DirEntry, err error) error {
				if err != nil || d.IsDir() {
					return nil
				}
				if b, err := os.ReadFile(path); err == nil && bytes.Contains(b, []byte(plain)) {
					t.Errorf("node %d: %s holds the secret in plain text", i, path)
				}
				return nil
			})
		}

		// A schedd restart keeps a running task's secrets.
		on3 := tasks[slices.IndexFunc(tasks, func(x *schedv1.Task) bool { return x.GetNode() == c.ids[2] })]
		ctx := context.Background()
		if err := c.Kill(ctx, 3, "schedd"); err != nil {
			t.Fatal(err)
		}
		if err := c.Start(ctx, 3, "schedd"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 20*time.Second, "node 3's schedd serves again", func() bool {
			_, _, code := c.ctl(3, "service", "ls")
			return code == 0
		})
		check(on3)

		if _, errOut, code := c.ctl(2, "secret", "rm", "db-pass"); code != 1 || !strings.Contains(errOut, "used by service sec") {
			t.Fatalf("secret rm of a secret in use: exit %d, %q; want 1 and the service named", code, errOut)
		}
		if _, errOut, code := c.ctl(1, "config", "rm", "app.conf"); code != 1 || !strings.Contains(errOut, "config app.conf is used by service sec") {
			t.Fatalf("config rm of a config in use: exit %d, %q; want 1 and the service named", code, errOut)
		}
		c.mustCtl(1, "service", "rm", "sec")
		for _, task := range tasks {
			i := c.nodeIndex(task.GetNode())
			waitFor(t, 10*time.Second, fmt.Sprintf("the secrets of task %s gone from n%d", task.GetId(), i), func() bool {
				_, err := os.Stat(filepath.Join(c.StateDir(i, "schedd"), "secrets", task.GetId()))
				return !hostMount(i, task.GetId()) && errors.Is(err, fs.ErrNotExist)
			})
		}
		c.mustCtl(2, "secret", "rm", "db-pass")
		c.mustCtl(3, "config", "rm", "app.conf")
		waitFor(t, 10*time.Second, "node 3 lists no secret", func() bool {
			out, _, code := c.ctl(3, "secret", "ls", "-o", "json")
			return code == 0 && strings.TrimSpace(out) == "[]"
		})
		if _, _, code := c.ctl(3, "secret", "rm", "db-pass"); code != 3 {
			t.Errorf("secret rm of a removed secret: exit %d, want 3", code)
		}
	})

	t.Run("HealthHTTPAndTCP", func(t *testing.T) {
		// The node checks a task by HTTP and by TCP (here on 127.0.0.1:
		// these tasks share their node's network namespace). A check that
		// fails makes the task unhealthy and restarts it.
		c.mustCtl(1, "service", "create", "hchttp", "--image", img, "--health-http", "18471/index.html", "--health-interval", "1s",
			"--stop-grace", "1s", "-d", "--", "httpd", "-f", "-p", "18471", "-h", "/www")
		removeIfFailed(t, c.Cluster, 1, "hchttp")
		c.mustCtl(2, "service", "create", "hctcp", "--image", img, "--health-tcp", "18472", "--health-interval", "1s",
			"--stop-grace", "1s", "-d", "--", "httpd", "-f", "-p", "18472", "-h", "/www")
		removeIfFailed(t, c.Cluster, 2, "hctcp")
		c.mustCtl(3, "service", "create", "hcsick", "--image", img, "--health-tcp", "18473", "--health-interval", "1s",
			"--health-retries", "2", "--stop-grace", "1s", "-d", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 3, "hcsick")
		for _, svc := range []string{"hchttp", "hctcp"} {
			waitFor(t, 30*time.Second, svc+"'s task healthy", func() bool {
				ts := c.currentTasks(svc)
				return len(ts) == 1 && ts[0].GetHealth() == "healthy"
			})
		}
		waitFor(t, 30*time.Second, "hcsick's task restarted as unhealthy", func() bool {
			out, _, code := c.ctl(1, "service", "ps", "hcsick", "-a", "-o", "json")
			var ts []struct{ Restarts int }
			return code == 0 && json.Unmarshal([]byte(out), &ts) == nil && slices.ContainsFunc(ts, func(x struct{ Restarts int }) bool { return x.Restarts > 0 })
		})
		if ts := c.currentTasks("hcsick"); len(ts) == 1 && ts[0].GetHealth() == "healthy" {
			t.Errorf("hcsick's task is healthy with nothing on its port")
		}
		c.mustCtl(1, "service", "rm", "hchttp", "hctcp", "hcsick")
	})

	t.Run("ImageHealthcheck", func(t *testing.T) {
		// An image's HEALTHCHECK runs when the service gives no check of
		// its own, as in Swarm; --no-healthcheck turns it off.
		tarball := filepath.Join(t.TempDir(), "healthy.tar")
		hc := &testimage.Healthcheck{Test: []string{"CMD-SHELL", "test -e /tmp/ok"}, Interval: 500 * time.Millisecond, Retries: 1000}
		if _, err := testimage.WriteFile(tarball, "docker", testimage.Spec{Name: "local/healthy:1", Healthcheck: hc}); err != nil {
			t.Fatal(err)
		}
		c.mustCtl(1, "image", "load", tarball)
		c.mustCtl(1, "service", "create", "ih", "--image", "local/healthy:1", "--stop-grace", "1s", "-d", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 1, "ih")
		c.mustCtl(2, "service", "create", "ihoff", "--image", "local/healthy:1", "--no-healthcheck", "--stop-grace", "1s", "-d", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 2, "ihoff")
		var task *schedv1.Task
		waitFor(t, 30*time.Second, "ih's task started, its image's check not passed", func() bool {
			ts := c.currentTasks("ih")
			if len(ts) == 1 && ts[0].GetHealth() == "starting" && ts[0].GetStarted() != nil {
				task = ts[0]
				return true
			}
			return false
		})
		// Six checks' time: none can pass without the file.
		time.Sleep(3 * time.Second)
		if ts := c.currentTasks("ih"); len(ts) != 1 || ts[0].GetHealth() != "starting" {
			t.Fatalf("ih's task without /tmp/ok: %v, want it still starting", ts)
		}
		c.mustCtl(3, "task", "exec", task.GetId(), "--", "touch", "/tmp/ok")
		waitFor(t, 30*time.Second, "ih's task healthy by its image's check", func() bool {
			ts := c.currentTasks("ih")
			return len(ts) == 1 && ts[0].GetHealth() == "healthy" && ts[0].GetId() == task.GetId()
		})
		waitFor(t, 30*time.Second, "ihoff's task running without a check", func() bool {
			ts := c.currentTasks("ihoff")
			return len(ts) == 1 && ts[0].GetState() == "running" && ts[0].GetHealth() == ""
		})
		c.mustCtl(1, "service", "rm", "ih", "ihoff")
	})

	t.Run("MaxPerNode", func(t *testing.T) {
		// Four replicas, at most one per node, on three nodes: three run,
		// one on each, and the fourth says why it waits.
		c.mustCtl(1, "service", "create", "mpn", "--image", img, "--replicas", "4", "--replicas-max-per-node", "1",
			"--stop-grace", "1s", "-d", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 1, "mpn")
		if got := c.perNode("mpn", 3); got != [3]int{1, 1, 1} {
			t.Fatalf("mpn runs %v per node, want one on each", got)
		}
		waitFor(t, 10*time.Second, "the fourth slot reported unschedulable", func() bool {
			_, errOut, code := c.ctl(2, "service", "ps", "mpn")
			return code == 0 && strings.Contains(errOut, "3 run the service's maximum per node (1)")
		})
		c.mustCtl(3, "service", "scale", "mpn=3")
		// A start-first update with every node at its maximum: no room
		// next to any old task, so each slot goes stop-first, and the
		// update converges (it waits for that) where it would stay stuck.
		c.mustCtlWithin(2*time.Minute, 2, "service", "update", "mpn", "--update-order", "start-first", "--force")
		if got := c.perNode("mpn", 3); got != [3]int{1, 1, 1} {
			t.Errorf("after the start-first update mpn runs %v per node, want one on each", got)
		}
		c.mustCtl(1, "service", "rm", "mpn")
	})

	t.Run("Jobs", func(t *testing.T) {
		// A replicated job: three completions, one task at a time. The
		// create waits for the job to complete.
		c.mustCtlWithin(2*time.Minute, 1, "service", "create", "job", "--image", img, "--mode", "replicated-job",
			"--replicas", "3", "--max-concurrent", "1", "--", "sh", "-c", "sleep 1; echo ran")
		removeIfFailed(t, c.Cluster, 1, "job")
		ran := func(version uint64) []*schedv1.Task {
			var done []*schedv1.Task
			waitFor(t, 15*time.Second, fmt.Sprintf("node 1 sees the job's 3 tasks of version %d exited", version), func() bool {
				done = done[:0]
				for _, tk := range c.currentTasks("job") {
					if tk.GetVersion() == version && tk.GetState() == "exited" && tk.GetExitCode() == 0 {
						done = append(done, tk)
					}
				}
				return len(done) == 3
			})
			slices.SortFunc(done, func(a, b *schedv1.Task) int { return a.GetStarted().AsTime().Compare(b.GetStarted().AsTime()) })
			slots := map[string]bool{}
			for i, tk := range done {
				slots[tk.GetSlot()] = true
				if i > 0 && tk.GetStarted().AsTime().Before(done[i-1].GetFinished().AsTime()) {
					t.Errorf("max concurrent 1: task %s (slot %s) started at %v, before %s (slot %s) finished at %v",
						tk.GetId(), tk.GetSlot(), tk.GetStarted().AsTime(), done[i-1].GetId(), done[i-1].GetSlot(), done[i-1].GetFinished().AsTime())
				}
			}
			if len(slots) != 3 {
				t.Errorf("the job's tasks ran in slots %v, want 0, 1 and 2", slots)
			}
			return done
		}
		first := ran(1)
		ls := c.mustCtl(2, "service", "ls")
		if !regexp.MustCompile(`job\s+replicated-job\s+0/3 \(3/3 completed\)`).MatchString(ls) {
			t.Errorf("service ls:\n%s", ls)
		}
		// Complete tasks are not run again.
		time.Sleep(3 * time.Second)
		if n := len(c.tasks("job")); n != 3 {
			t.Errorf("the complete job has %d tasks, want 3", n)
		}
		// An update runs it again.
		c.mustCtlWithin(2*time.Minute, 3, "service", "update", "job", "--force")
		for i, tk := range ran(2) {
			if tk.GetId() == first[i].GetId() {
				t.Errorf("the update did not run slot %s again", tk.GetSlot())
			}
		}
		c.mustCtl(1, "service", "rm", "job")

		// A job that fails for good: the create says so; the policy's
		// one restart happened and no more.
		_, errOut, code := c.ctlWithin(2*time.Minute, 2, "service", "create", "badjob", "--image", img, "--mode", "replicated-job",
			"--restart-max-attempts", "1", "--", "sh", "-c", "exit 3")
		removeIfFailed(t, c.Cluster, 1, "badjob")
		if code == 0 || !strings.Contains(errOut, "job badjob finished with 0 of 1 tasks completed") {
			t.Errorf("create of a failing job: exit %d, stderr:\n%s", code, errOut)
		}
		waitFor(t, 15*time.Second, "node 1 sees badjob's task failed after one restart", func() bool {
			cur := c.currentTasks("badjob")
			return len(cur) == 1 && cur[0].GetState() == "failed" && cur[0].GetExitCode() == 3 && cur[0].GetRestarts() == 1
		})
		c.mustCtl(1, "service", "rm", "badjob")

		// A global job: one completion on every node.
		c.mustCtlWithin(2*time.Minute, 3, "service", "create", "gjob", "--image", img, "--mode", "global-job", "--", "true")
		removeIfFailed(t, c.Cluster, 1, "gjob")
		waitFor(t, 15*time.Second, "node 1 sees gjob exited on each node", func() bool {
			nodes := map[string]bool{}
			for _, tk := range c.currentTasks("gjob") {
				if tk.GetState() == "exited" {
					nodes[tk.GetNode()] = true
				}
			}
			return len(nodes) == 3
		})
		c.mustCtl(1, "service", "rm", "gjob")

		// A scheduled job: not run at its creation, then once every 4 s,
		// each run a new version whose task exits 0.
		created := time.Now()
		_, errOut, code = c.ctl(2, "service", "create", "cron", "--image", img, "--mode", "replicated-job", "--schedule", "@every 4s",
			"--", "true")
		removeIfFailed(t, c.Cluster, 1, "cron")
		if code != 0 || !strings.Contains(errOut, "job cron scheduled (@every 4s): next run ") {
			t.Fatalf("create cron: exit %d, stderr:\n%s", code, errOut)
		}
		if n := len(c.tasks("cron")); n != 0 && time.Since(created) < 3*time.Second {
			t.Errorf("the scheduled job has %d tasks right after its creation", n)
		}
		defer func() {
			if t.Failed() {
				out, errOut, _ := c.ctl(1, "service", "inspect", "cron", "-o", "json")
				ps, psErr, _ := c.ctl(1, "service", "ps", "cron", "-a")
				t.Logf("cron at the end:\n%s%s\nservice ps -a:\n%s%s", out, errOut, ps, psErr)
			}
		}()
		var runs map[uint64]*schedv1.Task
		waitFor(t, 30*time.Second, "two runs of the scheduled job", func() bool {
			runs = map[uint64]*schedv1.Task{}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, err := c.schedd(1).ListTasks(ctx, &schedv1.ListTasksRequest{Service: "cron", All: true})
			if err != nil {
				t.Logf("list cron's tasks: %v", err)
				return false
			}
			for _, tk := range resp.GetTasks() {
				if tk.GetState() == "exited" && tk.GetExitCode() == 0 {
					runs[tk.GetVersion()] = tk
				}
			}
			return len(runs) >= 2
		})
		for v, tk := range runs {
			if started := tk.GetStarted().AsTime(); started.Before(created.Add(2 * time.Second)) {
				t.Errorf("run of version %d started %v after the job's creation, before its first scheduled time", v, started.Sub(created))
			}
		}
		// A scale-up applies from the next run: slot 1's first task
		// carries a run's version, newer than the scale's.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		scaled, err := c.schedd(1).ScaleService(ctx, &schedv1.ScaleServiceRequest{Name: "cron", Replicas: 2})
		cancel()
		if err != nil {
			t.Fatalf("scale cron to 2: %v", err)
		}
		var slot1 *schedv1.Task
		waitFor(t, 30*time.Second, "slot 1 of the scaled-up scheduled job run", func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, err := c.schedd(1).ListTasks(ctx, &schedv1.ListTasksRequest{Service: "cron", All: true})
			if err != nil {
				return false
			}
			slot1 = nil
			for _, tk := range resp.GetTasks() {
				if tk.GetSlot() == "1" && (slot1 == nil || tk.GetVersion() < slot1.GetVersion()) {
					slot1 = tk
				}
			}
			return slot1 != nil
		})
		if slot1.GetVersion() <= scaled.GetVersion() {
			t.Errorf("slot 1 first ran version %d, the scale's (%d), not a later run's: it did not wait for the next run", slot1.GetVersion(), scaled.GetVersion())
		}
		var view struct {
			LastRun *time.Time `json:"last_run"`
			NextRun *time.Time `json:"next_run"`
		}
		if err := json.Unmarshal([]byte(c.mustCtl(3, "service", "inspect", "cron", "-o", "json")), &view); err != nil ||
			view.LastRun == nil || view.NextRun == nil || view.NextRun.Sub(*view.LastRun) != 4*time.Second {
			t.Errorf("inspect cron: last and next run %v, %v (%v)", view.LastRun, view.NextRun, err)
		}
		c.mustCtl(1, "service", "rm", "cron")
	})

	t.Run("PlacementPreference", func(t *testing.T) {
		// Zones a (n1, n2) and b (n3): four replicas spread over the
		// zones first put two on n3, where spreading over nodes puts one
		// on each and the fourth anywhere.
		// n3 by docker node update's spelling.
		c.mustCtl(1, "node", "label", "n1", "zone=a")
		c.mustCtl(1, "node", "label", "n2", "zone=a")
		c.mustCtl(1, "node", "update", "n3", "--label-add", "zone=b", "--label-add", "spare=1")
		defer func() {
			for i := 1; i <= 3; i++ {
				c.ctl(1, "node", "update", fmt.Sprintf("n%d", i), "--label-rm", "zone", "--label-rm", "spare")
			}
		}()
		for i, zone := range []string{"a", "a", "b"} {
			c.waitLabel(t, fmt.Sprintf("n%d", i+1), "zone", zone)
		}
		c.mustCtl(2, "service", "create", "zoned", "--image", img, "--replicas", "4", "--placement-pref", "spread=node.labels.zone",
			"--stop-grace", "1s", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 2, "zoned")
		if got := c.perNode("zoned", 4); got != [3]int{1, 1, 2} {
			t.Errorf("zoned runs %v tasks per node, want 1/1/2 (two per zone)", got)
		}
		c.mustCtl(1, "service", "rm", "zoned")
	})

	t.Run("Copy", func(t *testing.T) {
		// shoalctl task cp on a node that does not run the task: out of
		// it and into it, relayed, with no tar in the task's image used.
		c.mustCtl(1, "service", "create", "cp", "--image", img, "--replicas", "1", "--stop-grace", "1s", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 1, "cp")
		cur := c.currentTasks("cp")
		if len(cur) != 1 {
			t.Fatalf("%d current tasks, want 1", len(cur))
		}
		task := cur[0].GetId()
		asker := c.nodeIndex(cur[0].GetNode())%3 + 1
		c.mustCtl(asker, "task", "exec", task, "--", "sh", "-c",
			"mkdir -p /data/sub && echo hi > /data/sub/f && ln -s sub/f /data/link && ln -s / /data/up && ln /data/sub/f /data/hard")
		local := t.TempDir()
		c.mustCtl(asker, "task", "cp", task+":/data", local)
		if b, err := os.ReadFile(filepath.Join(local, "data/sub/f")); err != nil || string(b) != "hi\n" {
			t.Errorf("data/sub/f copied out: %q, %v", b, err)
		}
		if l, err := os.Readlink(filepath.Join(local, "data/link")); err != nil || l != "sub/f" {
			t.Errorf("data/link copied out: %q, %v", l, err)
		}
		if a, b := statOf(t, filepath.Join(local, "data/sub/f")), statOf(t, filepath.Join(local, "data/hard")); a == nil || b == nil || a.Ino != b.Ino {
			t.Error("the hard link was not kept")
		}
		// To a name of its own, and as a tar stream.
		c.mustCtl(asker, "task", "cp", task+":/data/sub/f", filepath.Join(local, "renamed"))
		if b, err := os.ReadFile(filepath.Join(local, "renamed")); err != nil || string(b) != "hi\n" {
			t.Errorf("renamed: %q, %v", b, err)
		}
		out := c.mustCtl(asker, "task", "cp", task+":/data/sub", "-")
		if entries, size, err := volarchive.Size(strings.NewReader(out)); err != nil || entries != 2 || size != 3 {
			t.Errorf("tar stream of /data/sub: %d entries, %d bytes, %v", entries, size, err)
		}
		// A link to / leads to the task's root, not the node's.
		hostname := c.mustCtl(asker, "task", "exec", task, "--", "cat", "/etc/hostname")
		c.mustCtl(asker, "task", "cp", task+":/data/up/etc/hostname", filepath.Join(local, "hostname"))
		if b, err := os.ReadFile(filepath.Join(local, "hostname")); err != nil || string(b) != hostname {
			t.Errorf("/data/up/etc/hostname copied out: %q, %v; want the task's %q", b, err, hostname)
		}
		// Refused: a missing path.
		if _, errOut, code := c.ctl(asker, "task", "cp", task+":/nosuch", local); code != 3 {
			t.Errorf("copy of a missing path: exit %d, %q; want 3 (not found)", code, errOut)
		}

		// Into the task: owned by its root, or with -a by the owner here.
		in := filepath.Join(t.TempDir(), "in")
		if err := os.MkdirAll(filepath.Join(in, "deep"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(in, "deep/a.txt"), []byte("from here\n"), 0o640); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(filepath.Join(in, "deep/a.txt"), 1234, 1234); err != nil {
			t.Fatal(err)
		}
		c.mustCtl(asker, "task", "cp", in, task+":/data")
		c.mustCtl(asker, "task", "cp", "-a", in, task+":/data/kept")
		if out := c.mustCtl(asker, "task", "exec", task, "--", "sh", "-c",
			"cat /data/in/deep/a.txt; stat -c '%u %a' /data/in/deep/a.txt /data/kept/deep/a.txt"); out != "from here\n0 640\n1234 640\n" {
			t.Errorf("copied in: %q", out)
		}
		// A tar stream from stdin goes into a directory only.
		archive := filepath.Join(t.TempDir(), "in.tar")
		tarOut, errOut, code, err := c.Exec(context.Background(), asker, []string{"sh", "-c",
			fmt.Sprintf("shoalctl task cp %s:/data/sub - > %s && shoalctl task cp - %s:/data/fromtar < %s", task, archive, task, archive)}, nil)
		if err != nil || code == 0 || !strings.Contains(errOut, "not a directory") {
			t.Errorf("tar stream into a missing directory: exit %d, %v, %q %q", code, err, tarOut, errOut)
		}
		c.mustCtl(asker, "task", "exec", task, "--", "mkdir", "/data/fromtar")
		if _, errOut, code, err := c.Exec(context.Background(), asker, []string{"sh", "-c",
			fmt.Sprintf("shoalctl task cp - %s:/data/fromtar < %s", task, archive)}, nil); err != nil || code != 0 {
			t.Errorf("tar stream into a directory: exit %d, %v, %q", code, err, errOut)
		}
		if out := c.mustCtl(asker, "task", "exec", task, "--", "cat", "/data/fromtar/sub/f"); out != "hi\n" {
			t.Errorf("from the tar stream: %q", out)
		}
		c.mustCtl(asker, "task", "cp", in, task+":/data/up/tmp")
		if out := c.mustCtl(asker, "task", "exec", task, "--", "cat", "/tmp/in/deep/a.txt"); out != "from here\n" {
			t.Errorf("copied in through a link to /: %q", out)
		}
		c.mustCtl(1, "service", "rm", "cp")
	})

	t.Run("Binds", func(t *testing.T) {
		// A host directory (the nodes share this machine's files) bound
		// read-only and read-write; a missing one fails the task, saying
		// which path and node.
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "greeting"), []byte("hello from the host\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		c.mustCtl(1, "service", "create", "bd", "--image", img, "--replicas", "1", "--stop-grace", "1s",
			"--bind", dir+":/host:ro", "--mount", "type=bind,source="+dir+",target=/rw", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 1, "bd")
		cur := c.currentTasks("bd")
		if len(cur) != 1 {
			t.Fatalf("%d current tasks, want 1", len(cur))
		}
		task := cur[0].GetId()
		if out := c.mustCtl(2, "task", "exec", task, "--", "cat", "/host/greeting"); out != "hello from the host\n" {
			t.Errorf("/host/greeting in the task: %q", out)
		}
		if _, errOut, code := c.ctl(2, "task", "exec", task, "--", "sh", "-c", "echo x > /host/new"); code == 0 || !strings.Contains(errOut, "Read-only") {
			t.Errorf("a write to the read-only bind: exit %d, %q", code, errOut)
		}
		c.mustCtl(2, "task", "exec", task, "--", "sh", "-c", "echo from the task > /rw/written")
		if b, err := os.ReadFile(filepath.Join(dir, "written")); err != nil || string(b) != "from the task\n" {
			t.Errorf("written through the read-write bind: %q, %v", b, err)
		}
		c.mustCtl(1, "service", "rm", "bd")

		missing := filepath.Join(dir, "missing")
		c.mustCtl(1, "service", "create", "bm", "--image", img, "--replicas", "1", "--stop-grace", "1s", "--detach",
			"--bind", missing+":/x", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 1, "bm")
		var why string
		waitFor(t, 30*time.Second, "a task of bm failed for its missing host path", func() bool {
			for _, tk := range c.tasks("bm") {
				if strings.Contains(tk.GetError(), "bind "+missing+":/x: the host path on node "+tk.GetNode()) && strings.Contains(tk.GetError(), "no such file") {
					why = tk.GetError()
					return true
				}
			}
			return false
		})
		t.Logf("bm's task: %s", why)
		c.mustCtl(1, "service", "rm", "bm")
	})

	t.Run("StartFailureMoves", func(t *testing.T) {
		// Node 3's containerd is down: the task placed there cannot
		// start, fails instead of retrying in place, and its
		// replacement goes to another node, though spread prefers the
		// node with no task; the service converges 3/3 on nodes 1 and 2.
		ctx := context.Background()
		if err := c.Stop(ctx, 3, "containerd", 10*time.Second); err != nil {
			t.Fatal(err)
		}
		restarted := false
		restart := func() {
			if !restarted {
				restarted = true
				if err := c.Start(ctx, 3, "containerd"); err != nil {
					t.Errorf("start node 3's containerd again: %v", err)
				}
			}
		}
		defer restart()
		out, errOut, code := c.ctlWithin(2*time.Minute, 1, "service", "create", "sf", "--image", img, "--replicas", "3", "--stop-grace", "1s",
			"--restart-delay", "200ms", "--wait-timeout", "60s", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 1, "sf")
		if code != 0 {
			t.Fatalf("service create with node 3's containerd down: exit %d\n%s%s", code, out, errOut)
		}
		var failed *schedv1.Task
		for _, tk := range c.movedOffNode3(t, "sf") {
			if tk.GetState() == "failed" {
				failed = tk
			}
		}
		if failed == nil {
			t.Fatalf("no failed task on node 3: the test placed nothing there and shows nothing")
		}
		t.Logf("the task on node 3: %s, %q", failed.GetState(), failed.GetError())
		restart()
		c.mustCtl(1, "service", "rm", "sf")
	})

	t.Run("CrashMoves", func(t *testing.T) {
		// The container crashes on node 3 only (its env names the node
		// through a template): restarted there InPlaceRestarts times,
		// the task fails and its replacement goes to another node,
		// though spread prefers the node with no task.
		out, errOut, code := c.ctlWithin(2*time.Minute, 1, "service", "create", "cm", "--image", img, "--replicas", "3", "--stop-grace", "1s",
			"--restart-delay", "200ms", "--env", "NODE={{.Node.ID}}", "--wait-timeout", "60s", "--",
			"sh", "-c", fmt.Sprintf(`if [ "$NODE" = %q ]; then exit 139; fi; exec sleep 1000000`, c.ids[2]))
		removeIfFailed(t, c.Cluster, 1, "cm")
		if code != 0 {
			t.Fatalf("service create of a task that crashes on node 3: exit %d\n%s%s", code, out, errOut)
		}
		failed := c.movedOffNode3(t, "cm")
		if len(failed) != 1 || failed[0].GetState() != "failed" || failed[0].GetExitCode() != 139 || failed[0].GetRestarts() != 3 {
			t.Fatalf("node 3's tasks %v: want one, failed with exit 139 after 3 restarts in place", failed)
		}
		c.mustCtl(1, "service", "rm", "cm")
	})

	t.Run("RestartWindow", func(t *testing.T) {
		// One restart allowed within 2 s, and each run lasts 3 s: no
		// failure finds a restart within the window before it, so the
		// slot restarts past --restart-max-attempts (without the window
		// it would fail for good after one).
		c.mustCtl(1, "service", "create", "rw", "--image", img, "--replicas", "1", "--stop-grace", "1s", "--detach",
			"--restart-condition", "on-failure", "--restart-max-attempts", "1", "--restart-window", "2s", "--restart-delay", "100ms",
			"--", "sh", "-c", "sleep 3; exit 1")
		removeIfFailed(t, c.Cluster, 1, "rw")
		waitFor(t, 40*time.Second, "rw restarted 3 times", func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			all, err := c.schedd(1).ListTasks(ctx, &schedv1.ListTasksRequest{Service: "rw", All: true})
			if err != nil {
				return false
			}
			for _, tk := range all.GetTasks() {
				if tk.GetRestarts() >= 3 {
					return true
				}
			}
			return false
		})
		c.mustCtl(1, "service", "rm", "rw")
	})

	t.Run("Init", func(t *testing.T) {
		// --init: shoal-init is PID 1, reaps an orphan that PID 1 sleep
		// leaves a zombie, and passes a signal on to a command that
		// installs no handler for it.
		c.mustCtl(1, "service", "create", "in", "--image", img, "--replicas", "1", "--stop-grace", "1s", "--init", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 1, "in")
		c.mustCtl(1, "service", "create", "noin", "--image", img, "--replicas", "1", "--stop-grace", "1s", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 1, "noin")
		withInit, without := c.currentTasks("in"), c.currentTasks("noin")
		if len(withInit) != 1 || len(without) != 1 {
			t.Fatalf("current tasks: %d and %d, want 1 each", len(withInit), len(without))
		}
		if out := c.mustCtl(2, "task", "exec", withInit[0].GetId(), "--", "cat", "/proc/1/cmdline"); out != "/sbin/shoal-init\x00--\x00sleep\x001000000\x00" {
			t.Errorf("PID 1 of the --init task: %q", out)
		}
		const orphan = `sh -c "sleep 0.2 &"; sleep 1.5; grep -s '^State:.*zombie' /proc/[0-9]*/status || echo none`
		if out := c.mustCtl(2, "task", "exec", without[0].GetId(), "--", "sh", "-c", orphan); !strings.Contains(out, "zombie") {
			t.Errorf("the orphan under PID 1 sleep: %q; want a zombie (else this test shows nothing)", out)
		}
		if out := c.mustCtl(2, "task", "exec", withInit[0].GetId(), "--", "sh", "-c", orphan); out != "none\n" {
			t.Errorf("the orphan under shoal-init: %q; want it reaped", out)
		}
		c.mustCtl(1, "service", "rm", "noin")
		// SIGTERM to PID 1 reaches sleep, which it ends (exit 143): PID 1
		// sleep itself would not even see it.
		c.mustCtl(2, "task", "exec", withInit[0].GetId(), "--", "kill", "-TERM", "1")
		var last *schedv1.Task
		waitFor(t, 15*time.Second, "the --init task ended by SIGTERM", func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, err := c.schedd(1).ListTasks(ctx, &schedv1.ListTasksRequest{Service: "in", All: true})
			if err != nil {
				return false
			}
			for _, tk := range resp.GetTasks() {
				if tk.GetId() == withInit[0].GetId() {
					last = tk
					return tk.GetExitCode() == 143 && (tk.GetState() != "running" || tk.GetRestarts() > 0)
				}
			}
			return false
		})
		t.Logf("the --init task after SIGTERM: %s, exit %d, %d restarts", last.GetState(), last.GetExitCode(), last.GetRestarts())
		c.mustCtl(1, "service", "rm", "in")
	})

	t.Run("NewerSpecFields", func(t *testing.T) {
		// A spec written by a newer schedd or shoalctl, with a field this
		// schedd does not know: its owner starts no task from what it
		// could decode, and says why.
		c.mustCtl(1, "service", "create", "nf", "--image", img, "--replicas", "0", "--stop-grace", "1s", "--detach", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 1, "nf")
		var v struct {
			Spec map[string]any `json:"spec"`
		}
		decode(t, c.mustCtl(1, "service", "inspect", "nf", "-o", "json"), &v)
		v.Spec["replicas"], v.Spec["future_field"] = 1, true
		spec, err := json.Marshal(v.Spec)
		if err != nil {
			t.Fatal(err)
		}
		c.mustCtl(1, "state", "put", "/services/nf", "spec="+string(spec))
		const why = "runs a schedd that does not know spec field future_field (upgrade it)"
		waitFor(t, 20*time.Second, "nf reported unschedulable by its owner", func() bool {
			out, _, code := c.ctl(2, "service", "inspect", "nf", "-o", "json")
			return code == 0 && strings.Contains(out, why)
		})
		if tasks := c.tasks("nf"); len(tasks) != 0 {
			t.Errorf("tasks of a spec with an unknown field: %v", tasks)
		}
		c.mustCtl(1, "service", "rm", "nf")
	})

	t.Run("ProcessOptions", func(t *testing.T) {
		// --cap-add and --cap-drop reach the task's process: its
		// effective set has NET_ADMIN (bit 12), which the default set
		// lacks, and lacks CHOWN (bit 0), which the default set has.
		c.mustCtl(1, "service", "create", "caps", "--image", img, "--cap-add", "net_admin", "--cap-drop", "CAP_CHOWN", "--stop-grace", "1s",
			"--ulimit", "nofile=1024:2048", "--sysctl", "kernel.msgmax=65536", "--host", "db.internal:10.1.2.3", "--limit-pids", "20",
			"--group", "4321", "--group", "nogroup", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 1, "caps")
		cur := c.currentTasks("caps")
		if len(cur) != 1 {
			t.Fatalf("caps's tasks: %v", cur)
		}
		capEff := func(task string) uint64 {
			out := c.mustCtl(2, "task", "exec", task, "--", "grep", "CapEff", "/proc/1/status")
			f := strings.Fields(out)
			v, err := strconv.ParseUint(f[len(f)-1], 16, 64)
			if len(f) != 2 || err != nil {
				t.Fatalf("CapEff of task %s: %q", task, out)
			}
			return v
		}
		if v := capEff(cur[0].GetId()); v&(1<<12) == 0 || v&1 != 0 {
			t.Errorf("caps's effective capabilities %#x: want NET_ADMIN (1<<12) and no CHOWN (1)", v)
		}
		// --ulimit, --sysctl (msgmax is the task's IPC namespace's) and
		// --host too.
		if out := c.mustCtl(3, "task", "exec", cur[0].GetId(), "--", "sh", "-c", "ulimit -Sn; ulimit -Hn; cat /proc/sys/kernel/msgmax; tail -1 /etc/hosts"); out != "1024\n2048\n65536\n10.1.2.3\tdb.internal\n" {
			t.Errorf("caps's soft and hard nofile, msgmax and last hosts line: %q, want 1024, 2048, 65536, 10.1.2.3 db.internal", out)
		}
		// --group: supplementary groups, by GID and by the image's name.
		if out := c.mustCtl(3, "task", "exec", cur[0].GetId(), "--", "id", "-G"); !slices.Equal(strings.Fields(out), []string{"0", "4321", "65534"}) {
			t.Errorf("caps's groups: %q, want 0 4321 65534", out)
		}
		// task exec -t gives the command a terminal, from every node (the
		// task's own and relayed); without -t it has none. Before the
		// pids limit's check, which leaves zombies behind (the shell that
		// cannot fork exits, and PID 1, sleep, reaps none): an exec at
		// the limit could not start.
		for i := 1; i <= 3; i++ {
			if out, _, _ := c.ctl(i, "task", "exec", "-t", cur[0].GetId(), "--", "busybox", "tty"); !strings.HasPrefix(out, "/dev/pts/") {
				t.Errorf("task exec -t from node %d: tty says %q, want /dev/pts/N", i, out)
			}
		}
		if out, _, code := c.ctl(2, "task", "exec", cur[0].GetId(), "--", "busybox", "tty"); code != 1 || !strings.Contains(out, "not a tty") {
			t.Errorf("task exec without -t: tty says %q, exit %d; want not a tty, 1", out, code)
		}
		// --limit-pids: the task's pids cgroup refuses a 21st task (sleep
		// 1000000 and the exec'd shell are two; of its 30 sleeps, the
		// 19th fork fails). The limit counts threads too, and runc's exec
		// starts a Go runtime inside the cgroup: under a limit of 6 the
		// exec itself sometimes failed ("read init-p: connection reset").
		out, errOut, _ := c.ctl(2, "task", "exec", cur[0].GetId(), "--", "sh", "-c", "i=0; while [ $i -lt 30 ]; do sleep 3 & i=$((i+1)); done; wait")
		if !strings.Contains(out+errOut, "can't fork") {
			t.Errorf("30 processes under --limit-pids 20 all started: %q %q", out, errOut)
		}
		_, errOut, code := c.ctl(2, "service", "create", "badsysctl", "--image", img, "--sysctl", "vm.swappiness=1", "--", "true")
		if code != 2 || !strings.Contains(errOut, "sysctl vm.swappiness is not one of a task's own namespaces") {
			t.Errorf("create with a node-wide sysctl: exit %d, stderr %q", code, errOut)
		}
		// An update of one list replaces the task, the other list kept.
		c.mustCtlWithin(time.Minute, 3, "service", "update", "caps", "--cap-drop", "NET_RAW")
		cur = c.currentTasks("caps")
		if len(cur) != 1 {
			t.Fatalf("caps's tasks after the update: %v", cur)
		}
		if v := capEff(cur[0].GetId()); v&(1<<12) == 0 || v&1 == 0 || v&(1<<13) != 0 {
			t.Errorf("caps's effective capabilities after --cap-drop NET_RAW %#x: want NET_ADMIN (1<<12) and CHOWN (1), no NET_RAW (1<<13)", v)
		}
		_, errOut, code = c.ctl(1, "service", "create", "badcap", "--image", img, "--cap-add", "FLY", "--", "true")
		if code != 2 || !strings.Contains(errOut, `capability "FLY" is unknown`) {
			t.Errorf("create with an unknown capability: exit %d, stderr %q", code, errOut)
		}
		c.mustCtl(1, "service", "rm", "caps")
	})

	t.Run("Templates", func(t *testing.T) {
		// Swarm's service templates: the hostname and environment values
		// are expanded on the node that starts each task.
		c.mustCtl(1, "service", "create", "tpl", "--image", img, "--replicas", "2", "--stop-grace", "1s",
			"--hostname", "{{.Service.Name}}-{{.Task.Slot}}-{{.Node.ID}}", "--env", "NODE_HOST={{.Node.Hostname}}", "--env", "TASK={{.Task.ID}}",
			"--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 1, "tpl")
		statd := nodeClient(t, c.Cluster, 1)
		for _, tk := range c.currentTasks("tpl") {
			host, ok := getField(statd, "/nodes/"+tk.GetNode(), "hostname")
			if !ok {
				t.Fatalf("node %s has no hostname in its document", tk.GetNode())
			}
			want := fmt.Sprintf("tpl-%s-%s\n%s\n%s\n", tk.GetSlot(), tk.GetNode(), host, tk.GetId())
			if out := c.mustCtl(2, "task", "exec", tk.GetId(), "--", "sh", "-c", "hostname; echo $NODE_HOST; echo $TASK"); out != want {
				t.Errorf("task %s: hostname, node and task %q, want %q", tk.GetId(), out, want)
			}
			// node ps lists it, named or (on its node) not.
			home := c.nodeIndex(tk.GetNode())
			for _, args := range [][]string{{"node", "ps", tk.GetNode(), "-o", "json"}, {"node", "ps", "-o", "json"}} {
				var listed []struct{ ID, Node string }
				decode(t, c.mustCtl(home, args...), &listed)
				if !slices.ContainsFunc(listed, func(x struct{ ID, Node string }) bool { return x.ID == tk.GetId() }) ||
					slices.ContainsFunc(listed, func(x struct{ ID, Node string }) bool { return x.Node != tk.GetNode() }) {
					t.Errorf("%v on node %d: %+v, want %s's tasks with %s", args, home, listed, tk.GetNode(), tk.GetId())
				}
			}
		}
		// A template that cannot be expanded is refused before anything
		// changes.
		if _, errOut, code := c.ctl(1, "service", "update", "tpl", "--hostname", "{{.Node.Name}}"); code == 0 || !strings.Contains(errOut, "hostname: template") {
			t.Errorf("update with a bad template: exit %d, %q", code, errOut)
		}
		c.mustCtl(1, "service", "rm", "tpl")
	})

	t.Run("Stats", func(t *testing.T) {
		// Each node samples its own tasks from containerd's cgroup
		// figures; shoalctl on any node shows them all, relayed.
		c.mustCtl(1, "service", "create", "st", "--image", img, "--replicas", "2", "--cpu", "0.2", "--memory", "48MiB", "--stop-grace", "1s",
			"--", "sh", "-c", "trap 'exit 0' TERM; while :; do :; done")
		removeIfFailed(t, c.Cluster, 1, "st")
		cur := c.currentTasks("st")
		if len(cur) != 2 {
			t.Fatalf("%d current tasks, want 2", len(cur))
		}
		holders := map[string]bool{}
		for _, tk := range cur {
			holders[tk.GetNode()] = true
		}
		asker := 1
		for i := 1; i <= 3; i++ {
			if !holders[c.ids[i-1]] {
				asker = i // a node running neither: every figure is relayed
			}
		}
		type statJSON struct {
			Task, Service, Node, Error string
			CPUPercent                 *float64 `json:"cpu_percent"`
			MemoryBytes                uint64   `json:"memory_bytes"`
			MemoryLimit                uint64   `json:"memory_limit_bytes"`
			Pids                       uint64
		}
		var stats []statJSON
		decode(t, c.mustCtlWithin(30*time.Second, asker, "service", "stats", "st", "--no-stream", "--interval", "500ms", "-o", "json"), &stats)
		if len(stats) != 2 {
			t.Fatalf("service stats: %+v, want the two tasks", stats)
		}
		for _, s := range stats {
			if s.Error != "" || s.Service != "st" || !holders[s.Node] || s.CPUPercent == nil || *s.CPUPercent <= 0 ||
				s.MemoryBytes == 0 || s.MemoryLimit != 48<<20 || s.Pids == 0 {
				t.Errorf("sample of a busy task with 0.2 CPU and 48 MiB: %+v (cpu %v)", s, s.CPUPercent)
			}
		}
		// A node's own tasks, by name.
		home := c.nodeIndex(cur[0].GetNode())
		stats = nil
		decode(t, c.mustCtlWithin(30*time.Second, asker, "task", "stats", "--node", fmt.Sprintf("n%d", home), "--no-stream", "-o", "json"), &stats)
		for _, s := range stats {
			if s.Node != cur[0].GetNode() {
				t.Errorf("task stats --node n%d listed a task of %s", home, s.Node)
			}
		}
		if !slices.ContainsFunc(stats, func(s statJSON) bool { return s.Task == cur[0].GetId() }) {
			t.Errorf("task stats --node n%d: %+v, want %s", home, stats, cur[0].GetId())
		}
		// Streaming: a JSON document a round until interrupted; the task
		// named by a prefix of its ID.
		id := cur[1].GetId()
		bg := c.startCtl(asker, "task", "stats", id[:len(id)-2], "--interval", "200ms", "-o", "json")
		waitFor(t, 20*time.Second, "three rounds of task stats", func() bool { return strings.Count(bg.out.String(), "\n") >= 3 })
		if code := bg.interrupt(t); code != 0 {
			t.Errorf("task stats after SIGINT: exit %d, stderr %q", code, bg.errOut.String())
		}
		lines := strings.Split(strings.TrimSpace(bg.out.String()), "\n")
		var last []statJSON
		decode(t, lines[len(lines)-1], &last)
		if len(last) != 1 || last[0].Task != cur[1].GetId() || last[0].CPUPercent == nil {
			t.Errorf("last round %+v, want %s with its CPU rate", last, cur[1].GetId())
		}
		// Following: a service's stream takes in the tasks that start
		// after it and drops those that stop.
		bg = c.startCtl(asker, "service", "stats", "st", "--interval", "200ms", "-o", "json")
		round := func() map[string]string {
			lines := strings.Split(strings.TrimSpace(bg.out.String()), "\n")
			var r []statJSON
			if json.Unmarshal([]byte(lines[len(lines)-1]), &r) != nil {
				return nil
			}
			out := map[string]string{}
			for _, s := range r {
				out[s.Task] = s.Error
			}
			return out
		}
		waitFor(t, 20*time.Second, "the two tasks in service stats", func() bool { return len(round()) == 2 })
		c.mustCtl(1, "service", "scale", "st=3")
		waitFor(t, 30*time.Second, "a third task in the same service stats", func() bool {
			r := round()
			return len(r) == 3 && r[cur[0].GetId()] == "" && r[cur[1].GetId()] == "" && !slices.ContainsFunc(slices.Collect(maps.Values(r)), func(e string) bool { return e != "" })
		})
		c.mustCtl(1, "service", "scale", "st=1")
		var kept map[string]string
		waitFor(t, 30*time.Second, "one task left in the same service stats", func() bool {
			kept = round()
			return len(kept) == 1
		})
		if code := bg.interrupt(t); code != 0 {
			t.Errorf("service stats after SIGINT: exit %d, stderr %q", code, bg.errOut.String())
		}
		if now := c.currentTasks("st"); len(now) != 1 || !maps.Equal(kept, map[string]string{now[0].GetId(): ""}) {
			t.Errorf("service stats followed %v, want the one current task %v", kept, now)
		}
		// A service removed while followed ends the stream, with exit 0.
		bg = c.startCtl(asker, "service", "stats", "st", "--interval", "200ms", "-o", "json")
		waitFor(t, 20*time.Second, "the task in service stats again", func() bool { return len(round()) == 1 })
		c.mustCtl(1, "service", "rm", "st")
		if code, ok := bg.wait(30 * time.Second); !ok || code != 0 || !strings.Contains(bg.errOut.String(), "service st was removed") {
			t.Errorf("service stats of a removed service: ended %v, exit %d, stderr %q", ok, code, bg.errOut.String())
		}
		if _, errOut, code := c.ctl(asker, "task", "stats", cur[0].GetId(), "--no-stream"); code == 0 || !strings.Contains(errOut, "not found") {
			t.Errorf("stats of a removed task: exit %d, %q; want not found", code, errOut)
		}
	})

	t.Run("Events", func(t *testing.T) {
		// shoalctl events on one node follows what another node's
		// commands and every node's tasks do, then replays it.
		// Since the test's start, so that what happens before its watch
		// is under way is replayed, not missed.
		start := time.Now()
		live := c.startCtl(2, "events", "--since", start.UTC().Format(time.RFC3339Nano), "-o", "json", "-f", "service=ev")
		c.mustCtl(1, "service", "create", "ev", "--image", img, "--replicas", "1", "--stop-grace", "1s", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 1, "ev")
		cur := c.currentTasks("ev")
		if len(cur) != 1 {
			t.Fatalf("%d current tasks, want 1", len(cur))
		}
		task := cur[0].GetId()
		type eventJSON struct {
			Type, Action, ID string
			Attributes       map[string]string
		}
		seen := func(out string) []string {
			var got []string
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				var e eventJSON
				if line == "" || json.Unmarshal([]byte(line), &e) != nil {
					continue
				}
				if e.Type == "task" && e.ID != task {
					continue
				}
				got = append(got, e.Type+" "+e.Action)
			}
			return got
		}
		want := []string{"service create", "task create", "task starting", "task running", "service converge"}
		hasAll := func(got, want []string) bool {
			for _, w := range want {
				if !slices.Contains(got, w) {
					return false
				}
			}
			return true
		}
		waitFor(t, 20*time.Second, "the service's and its task's events", func() bool { return hasAll(seen(live.out.String()), want) })
		c.mustCtlWithin(time.Minute, 1, "service", "rm", "ev")
		waitFor(t, 20*time.Second, "the removal's events", func() bool {
			return hasAll(seen(live.out.String()), []string{"service remove", "task stopped"})
		})
		if code := live.interrupt(t); code != 0 {
			t.Errorf("events after SIGINT: exit %d, stderr %q", code, live.errOut.String())
		}
		for _, line := range strings.Split(strings.TrimSpace(live.out.String()), "\n") {
			var e eventJSON
			decode(t, line, &e)
			if (e.Type == "service" && e.ID != "ev") || (e.Type == "task" && e.Attributes["service"] != "ev") || e.Type == "node" {
				t.Errorf("-f service=ev let through %+v", e)
			}
		}
		// Replayed from another node's statd, up to now, in the table's
		// format: the same story, then the command ends by itself.
		since := time.Since(start).Round(time.Second) + 5*time.Second
		out := c.mustCtlWithin(30*time.Second, 3, "events", "--since", since.String(), "--until", "0s", "-f", "service=ev", "-f", "type=service")
		t.Logf("events --since %v --until 0s:\n%s", since, out)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		var actions []string
		for _, l := range lines {
			f := strings.Fields(l)
			if len(f) < 4 || f[1] != "service" || f[3] != "ev" {
				t.Fatalf("replayed line %q: want TIME service ACTION ev", l)
			}
			actions = append(actions, f[2])
		}
		if !slices.Equal(actions, []string{"create", "converge", "remove"}) {
			t.Errorf("replayed service events %v, want create, converge, remove:\n%s", actions, out)
		}
	})

	t.Run("StopSignal", func(t *testing.T) {
		// --stop-signal reaches the task: its trap for SIGUSR1 ends it with
		// status 0, where the default signal would have been ignored (the
		// shell is the container's init) until SIGKILL ended the grace.
		c.mustCtl(1, "service", "create", "sig", "--image", img, "--stop-signal", "SIGUSR1", "--stop-grace", "30s", "--",
			"sh", "-c", `trap "echo got-usr1; exit 0" USR1; while true; do sleep 1; done`)
		removeIfFailed(t, c.Cluster, 1, "sig")
		cur := c.currentTasks("sig")
		if len(cur) != 1 {
			t.Fatalf("sig's tasks: %v", cur)
		}
		id := cur[0].GetId()
		// Replaced, not scaled away: a replaced task stays in its slot's
		// history, where a task whose slot is gone is removed once stopped.
		c.mustCtlWithin(60*time.Second, 2, "service", "update", "sig", "--force")
		var last string
		defer func() {
			if t.Failed() {
				out, errOut, _ := c.ctl(1, "service", "ps", "sig", "-a")
				t.Logf("sig's task at the end: %s\nservice ps -a:\n%s%s", last, out, errOut)
			}
		}()
		waitFor(t, 40*time.Second, "sig's task stopped by its trap", func() bool {
			out, _, code := c.ctl(3, "task", "inspect", id, "-o", "json")
			last = out
			var v struct {
				State    string
				ExitCode int `json:"exit_code"`
			}
			return code == 0 && json.Unmarshal([]byte(out), &v) == nil && v.State == "stopped" && v.ExitCode == 0
		})
		if out := c.mustCtl(3, "task", "logs", id); !strings.Contains(out, "got-usr1") {
			t.Errorf("sig's task logs %q lack its trap's line (inspect: %s)", out, last)
		}
		c.mustCtl(1, "service", "rm", "sig")
	})

	t.Run("ScaleUpRightAfterScaleDown", func(t *testing.T) {
		// Four tasks on n1 and n2, scaled to 0 and, while they are still
		// in their stop grace (sleep ignores SIGTERM), back to 2 with n3
		// allowed: the stopping tasks must not count against n1 and n2,
		// or both new tasks crowd onto n3.
		c.mustCtl(1, "service", "create", "rescale", "--image", img, "--replicas", "4", "--constraint", "node.name!=n3", "--stop-grace", "10s", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 1, "rescale")
		if got := c.perNode("rescale", 4); got != [3]int{2, 2, 0} {
			t.Fatalf("rescale runs %v per node, want 2/2/0", got)
		}
		start := time.Now()
		c.mustCtl(1, "service", "scale", "rescale=0")
		c.mustCtl(2, "service", "update", "rescale", "--constraint", "node.name!=nowhere")
		c.mustCtl(3, "service", "scale", "rescale=2")
		// Past the grace (a very slow machine) the old tasks are gone and
		// the check below holds either way, without showing the rule.
		t.Logf("scaled to 0, updated and scaled to 2 in %v (the old tasks' grace: 10s)", time.Since(start).Round(time.Millisecond))
		got := c.perNode("rescale", 2)
		if got[0] > 1 || got[1] > 1 || got[2] > 1 || got[0]+got[1]+got[2] != 2 {
			t.Errorf("after scaling 4 -> 0 -> 2 within the old tasks' stop grace: %v per node, want two nodes with one each", got)
		}
		c.mustCtl(1, "service", "rm", "rescale")
	})

	t.Run("DrainReplicated", func(t *testing.T) {
		c.mustCtl(1, append([]string{"service", "create", "dr", "--image", img, "--replicas", "3", "--stop-grace", "1s", "--"}, termSleep...)...)
		removeIfFailed(t, c.Cluster, 1, "dr")
		if got := c.perNode("dr", 3); got != [3]int{1, 1, 1} {
			t.Fatalf("3 replicas spread as %v, want 1/1/1", got)
		}
		before := c.mustRunning("dr")
		s := c.sample("dr", 100*time.Millisecond)
		out := c.mustCtlWithin(90*time.Second, 2, "node", "drain", "n3")
		time.Sleep(time.Second) // keep sampling a little after the drain returned
		lo, hi := s.finish(t, 5)
		if !strings.Contains(out, "drained (1 tasks moved)") {
			t.Errorf("drain output %q, want 1 task moved", out)
		}
		if lo < 3 {
			t.Errorf("running replicas dropped to %d during the drain (at %s)", lo, s.low)
		}
		if hi > 4 {
			t.Errorf("%d replicas ran at once during the drain; one replacement at a time means at most 4", hi)
		}
		after := c.mustRunning("dr")
		if len(after[3]) != 0 || total(after) != 3 {
			t.Fatalf("after draining n3: containers %v, want 3 on n1 and n2", after)
		}
		// node ls says so, as docker node ls does: n3 drained, no task.
		var ls []struct {
			Name, Availability string
			Tasks              int
		}
		decode(t, c.mustCtl(1, "node", "ls", "-o", "json"), &ls)
		for _, n := range ls {
			if (n.Name == "n3") != (n.Availability == "drain") || (n.Name == "n3" && n.Tasks != 0) {
				t.Errorf("node ls after draining n3: %+v", n)
			}
		}
		// The replicas on n1 and n2 were not touched.
		for i := 1; i <= 2; i++ {
			for id, pid := range before[i] {
				if after[i][id] != pid {
					t.Errorf("node %d: container %s (pid %d) was replaced or restarted by the drain: %v", i, id, pid, after[i])
				}
			}
		}
		if got := c.perNode("dr", 3); got[2] != 0 || got[0]+got[1] != 3 {
			t.Fatalf("after draining n3: %v tasks per node", got)
		}
		if ts := c.tasks("dr"); slices.ContainsFunc(ts, func(tk *schedv1.Task) bool {
			return tk.GetNode() == c.ids[2] && tk.GetState() == "running"
		}) {
			t.Errorf("a task still runs on drained n3")
		}
		// While drained, new placements avoid n3.
		c.mustCtl(1, "service", "scale", "dr=4")
		if got := c.perNode("dr", 4); got[2] != 0 {
			t.Fatalf("scaled while n3 drained: %v tasks per node", got)
		}

		c.mustCtl(3, "node", "activate", "n3")
		c.mustCtl(1, "service", "scale", "dr=6")
		got := c.perNode("dr", 6)
		if got[2] == 0 || got[0]+got[1]+got[2] != 6 {
			t.Fatalf("scaled to 6 after activating n3: %v tasks per node, want some on n3", got)
		}
		if m := c.mustRunning("dr"); len(m[3]) != got[2] || total(m) != 6 {
			t.Fatalf("containers %v disagree with tasks per node %v", m, got)
		}
		c.mustCtl(1, "service", "rm", "dr")
	})

	t.Run("LogsAndExecFromAnyNode", func(t *testing.T) {
		c.mustCtl(1, "service", "create", "lx", "--image", img, "--replicas", "2", "--stop-grace", "1s", "--",
			"sh", "-c", "echo hello-$HOSTNAME; exec sleep 1000000")
		removeIfFailed(t, c.Cluster, 1, "lx")
		cur := c.currentTasks("lx")
		if len(cur) != 2 {
			t.Fatalf("%d current tasks, want 2", len(cur))
		}
		for _, tk := range cur {
			home := c.nodeIndex(tk.GetNode())
			host := "lx-" + tk.GetSlot()
			marker := "hello-" + host + "\n"
			for i := 1; i <= 3; i++ {
				if i == home {
					continue
				}
				var out string
				waitFor(t, 10*time.Second, "marker in task logs from node "+fmt.Sprint(i), func() bool {
					out = c.mustCtl(i, "task", "logs", tk.GetId())
					return strings.Contains(out, marker)
				})
				if out != marker {
					t.Errorf("task logs %s from node %d: %q, want exactly %q", tk.GetId(), i, out, marker)
				}
				out = c.mustCtl(i, "task", "exec", tk.GetId(), "--", "cat", "/etc/hostname")
				if strings.TrimSpace(out) != host {
					t.Errorf("task exec cat /etc/hostname from node %d: %q, want %q", i, out, host)
				}
			}
			other := home%3 + 1
			out, errOut, code := c.ctl(other, "task", "exec", tk.GetId(), "--", "sh", "-c", "echo out; echo err >&2; exit 5")
			if code != 5 || out != "out\n" || !strings.Contains(errOut, "err\n") {
				t.Errorf("task exec exit 5 from node %d: exit %d, stdout %q, stderr %q", other, code, out, errOut)
			}
			if _, _, code := c.ctl(other, "task", "exec", tk.GetId(), "--", "sh", "-c", "exit 0"); code != 0 {
				t.Errorf("task exec exit 0: exit %d", code)
			}
		}
		// service logs: every current task's lines, each prefixed with
		// its own task (service.slot@node).
		for i := 1; i <= 3; i++ {
			out := c.mustCtl(i, "service", "logs", "lx")
			lines := strings.Split(strings.TrimSpace(out), "\n")
			var want []string
			for _, tk := range cur {
				want = append(want, fmt.Sprintf("lx.%s@%s | hello-lx-%s", tk.GetSlot(), tk.GetNode(), tk.GetSlot()))
			}
			slices.Sort(lines)
			slices.Sort(want)
			if !slices.Equal(lines, want) {
				t.Errorf("service logs lx on node %d:\n%s\nwant lines %q", i, out, want)
			}
		}
		// A task that does not exist is reported as such.
		if _, errOut, code := c.ctl(2, "task", "logs", "lx.nope"); code != 3 {
			t.Errorf("task logs of a missing task: exit %d %q, want 3", code, errOut)
		}
		if out, errOut, code := c.ctl(2, "service", "logs", "nope"); code != 3 || !strings.Contains(errOut, "not found") {
			t.Errorf("service logs of a missing service: exit %d, stdout %q, stderr %q; want 3 and not found", code, out, errOut)
		}
		c.mustCtl(1, "service", "rm", "lx")
	})

	t.Run("LogsFollow", func(t *testing.T) {
		c.mustCtl(1, "service", "create", "lf", "--image", img, "--replicas", "1", "--stop-grace", "1s", "--env", "GEN=1", "--",
			"sh", "-c", "trap 'exit 0' TERM; i=0; while true; do echo gen$GEN-line$i; i=$((i+1)); sleep 0.2; done")
		removeIfFailed(t, c.Cluster, 1, "lf")
		cur := c.currentTasks("lf")
		if len(cur) != 1 {
			t.Fatalf("%d current tasks, want 1", len(cur))
		}
		first := cur[0]
		// Followed from nodes that may not run the task (relayed), and
		// started before the lines they must show are written.
		svcLogs := c.startCtl(3, "service", "logs", "-f", "lf")
		taskLogs := c.startCtl(2, "task", "logs", "-f", first.GetId())
		firstPrefix := fmt.Sprintf("lf.0@%s | ", first.GetNode())
		waitFor(t, 15*time.Second, "new lines in service logs -f and task logs -f", func() bool {
			return strings.Contains(svcLogs.out.String(), firstPrefix+"gen1-line15\n") && strings.Contains(taskLogs.out.String(), "gen1-line15\n")
		})

		// An update replaces the task: service logs -f picks up the new
		// one, task logs -f of the old one ends when it has stopped.
		c.mustCtlWithin(time.Minute, 1, "service", "update", "lf", "--env", "GEN=2", "--update-monitor", "1s")
		cur = c.currentTasks("lf")
		if len(cur) != 1 || cur[0].GetId() == first.GetId() {
			t.Fatalf("current tasks after the update: %v, want one replacing %s", cur, first.GetId())
		}
		secondPrefix := fmt.Sprintf("lf.0@%s | ", cur[0].GetNode())
		waitFor(t, 15*time.Second, "the replacement's lines in service logs -f", func() bool {
			return strings.Contains(svcLogs.out.String(), secondPrefix+"gen2-line5\n")
		})
		if code, ok := taskLogs.wait(15 * time.Second); !ok || code != 0 {
			t.Errorf("task logs -f of the replaced task: exited %v with %d, want it to end by itself with 0; stderr %q", ok, code, taskLogs.errOut.String())
		}
		if out := taskLogs.out.String(); strings.Contains(out, "gen2") || !strings.HasPrefix(out, "gen1-line0\n") {
			t.Errorf("task logs -f of the first task:\n%s", out)
		}
		if code := svcLogs.interrupt(t); code != 0 {
			t.Errorf("service logs -f after SIGINT: exit %d, stderr %q", code, svcLogs.errOut.String())
		}
		for _, line := range strings.Split(strings.TrimSuffix(svcLogs.out.String(), "\n"), "\n") {
			if !strings.HasPrefix(line, firstPrefix+"gen1-line") && !strings.HasPrefix(line, secondPrefix+"gen2-line") {
				t.Errorf("service logs -f line %q is neither the first task's nor its replacement's", line)
				break
			}
		}
		c.mustCtl(1, "service", "rm", "lf")
	})

	t.Run("LogsTimesAndRotation", func(t *testing.T) {
		// The task's lines go through shoal-logger: stamped, by stream, in
		// a log rotated at 64 KiB with two files kept (newSchedCluster).
		c.mustCtl(1, "service", "create", "lt", "--image", img, "--replicas", "1", "--stop-grace", "1s", "--",
			"sh", "-c", "echo first; echo oops >&2; sleep 1; echo second; while [ ! -e /tmp/fill ]; do sleep 0.1; done; "+
				"i=0; while [ $i -lt 4000 ]; do echo fill-$i-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx; i=$((i+1)); done; echo last; exec sleep 1000000")
		removeIfFailed(t, c.Cluster, 1, "lt")
		cur := c.currentTasks("lt")
		if len(cur) != 1 {
			t.Fatalf("%d current tasks, want 1", len(cur))
		}
		id, home := cur[0].GetId(), c.nodeIndex(cur[0].GetNode())
		other := home%3 + 1 // relayed through another node's schedd
		waitFor(t, 15*time.Second, "second in the task's log", func() bool {
			return strings.Contains(c.mustCtl(other, "task", "logs", id), "second")
		})
		out, errOut, code := c.ctl(other, "task", "logs", id)
		if code != 0 || out != "first\nsecond\n" || errOut != "oops\n" {
			t.Fatalf("task logs: exit %d, stdout %q, stderr %q; want the output on stdout and the error on stderr", code, out, errOut)
		}
		out, errOut, _ = c.ctl(other, "task", "logs", "--timestamps", id)
		stamped := regexp.MustCompile(`^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z) (\S+)$`)
		stamps := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(out)+"\n"+strings.TrimSpace(errOut), "\n") {
			m := stamped.FindStringSubmatch(line)
			if m == nil {
				t.Fatalf("task logs --timestamps line %q is not a time and the line", line)
			}
			stamps[m[2]] = m[1]
		}
		if len(stamps) != 3 || !(stamps["first"] < stamps["second"]) {
			t.Fatalf("stamps %v: want first, oops and second, second after first", stamps)
		}
		// --since the second line's time: only it; --until the first's:
		// only it on stdout.
		if out, errOut, _ := c.ctl(other, "task", "logs", "--since", stamps["second"], id); out != "second\n" || errOut != "" {
			t.Errorf("--since %s: stdout %q, stderr %q; want only second", stamps["second"], out, errOut)
		}
		if out, _, _ := c.ctl(other, "task", "logs", "--until", stamps["first"], id); out != "first\n" {
			t.Errorf("--until %s: stdout %q, want only first", stamps["first"], out)
		}
		out = c.mustCtl(home, "service", "logs", "--timestamps", "--since", stamps["second"], "lt")
		if want := fmt.Sprintf("lt.0@%s | %s second\n", cur[0].GetNode(), stamps["second"]); out != want {
			t.Errorf("service logs --timestamps --since: %q, want %q", out, want)
		}

		// 4,000 lines of about 100 bytes a record: the log is rotated
		// six times and keeps its newest two files.
		c.mustCtl(other, "task", "exec", id, "--", "touch", "/tmp/fill")
		waitFor(t, 30*time.Second, "the last line in the task's log", func() bool {
			return c.mustCtl(other, "task", "logs", "--tail", "1", id) == "last\n"
		})
		files, _ := filepath.Glob(filepath.Join(c.StateDir(home, "schedd"), "logs", id+"*"))
		var total int64
		for _, f := range files {
			if st, err := os.Stat(f); err == nil {
				total += st.Size()
			}
		}
		if len(files) != 2 || total > 2*64<<10+200 {
			t.Errorf("the task's log is %d files of %d bytes (%v), want 2 of at most 64 KiB each", len(files), total, files)
		}
		out = c.mustCtl(other, "task", "logs", id)
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		var firstKept int
		if _, err := fmt.Sscanf(lines[0], "fill-%d-", &firstKept); err != nil || strings.Contains(out, "first") {
			t.Fatalf("after the rotations the log begins with %q, want a fill line (the oldest gone)", lines[0])
		}
		if want := 4000 - firstKept + 1; len(lines) != want || lines[len(lines)-1] != "last" || firstKept < 2000 {
			t.Errorf("the log holds %d lines from fill-%d, want the %d from there to last, about 1,300", len(lines), firstKept, want)
		}
		if out := c.mustCtl(other, "task", "logs", "--tail", "2", id); !strings.HasPrefix(out, "fill-3999-") || !strings.HasSuffix(out, "\nlast\n") {
			t.Errorf("--tail 2: %q", out)
		}
		c.mustCtl(1, "service", "rm", "lt")
		waitFor(t, 30*time.Second, "the task's log removed with it", func() bool {
			files, _ := filepath.Glob(filepath.Join(c.StateDir(home, "schedd"), "logs", id+"*"))
			return len(files) == 0
		})

		// A service's own rotation replaces the node's; log driver none
		// keeps nothing.
		c.mustCtl(1, "service", "create", "lo", "--image", img, "--stop-grace", "1s", "--log-opt", "max-size=16k", "--log-opt", "max-file=3", "--",
			"sh", "-c", "i=0; while [ $i -lt 2000 ]; do echo own-$i-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx; i=$((i+1)); done; echo last; exec sleep 1000000")
		removeIfFailed(t, c.Cluster, 1, "lo")
		c.mustCtl(1, "service", "create", "ln", "--image", img, "--stop-grace", "1s", "--log-driver", "none", "--", "sh", "-c", "echo unseen; exec sleep 1000000")
		removeIfFailed(t, c.Cluster, 1, "ln")
		own := c.currentTasks("lo")[0]
		waitFor(t, 30*time.Second, "the last line in lo's log", func() bool {
			return c.mustCtl(1, "task", "logs", "--tail", "1", own.GetId()) == "last\n"
		})
		files, _ = filepath.Glob(filepath.Join(c.StateDir(c.nodeIndex(own.GetNode()), "schedd"), "logs", own.GetId()+"*"))
		for _, f := range files {
			if st, err := os.Stat(f); err != nil || st.Size() > 16<<10+200 {
				t.Errorf("lo's log file %s: %v bytes, want at most 16 KiB", f, st.Size())
			}
		}
		if len(files) != 3 {
			t.Errorf("lo's log is %d files, want 3 (--log-opt max-file=3)", len(files))
		}
		quiet := c.currentTasks("ln")[0]
		if out, errOut, code := c.ctl(2, "task", "logs", quiet.GetId()); code == 0 || out != "" || !strings.Contains(errOut, "log driver none") {
			t.Errorf("task logs of a task whose output is discarded: exit %d, stdout %q, stderr %q", code, out, errOut)
		}
		c.mustCtl(1, "service", "rm", "lo")
		c.mustCtl(1, "service", "rm", "ln")
	})

	t.Run("DeclarativeDeploy", func(t *testing.T) {
		file := filepath.Join(c.NodeDir(2), "web.yaml")
		spec := func(color string) {
			data := fmt.Sprintf(`name: web
image: %s
replicas: 2
args: ["sh", "-c", "trap 'exit 0' TERM; sleep 1000000 & wait"]
env:
  - COLOR=%s
stop_grace: 1s
update:
  monitor: 1s
`, img, color)
			if err := os.WriteFile(file, []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		envOf := func(task string) string {
			return c.mustCtl(1, "task", "exec", task, "--", "env")
		}
		spec("blue")
		_, errOut, code := c.ctlWithin(2*time.Minute, 2, "service", "deploy", "-f", file)
		if code != 0 || !strings.Contains(errOut, "web deployed (version 1)") {
			t.Fatalf("first deploy: exit %d %q", code, errOut)
		}
		v1 := c.settledTasks("web", 2, 1)
		for _, tk := range v1 {
			if env := envOf(tk.GetId()); !strings.Contains(env, "COLOR=blue\n") {
				t.Fatalf("task %s env:\n%s", tk.GetId(), env)
			}
		}

		spec("green")
		s := c.sample("web", 100*time.Millisecond)
		_, errOut, code = c.ctlWithin(2*time.Minute, 3, "service", "deploy", "-f", file)
		lo, hi := s.finish(t, 10)
		if code != 0 || !strings.Contains(errOut, "web deployed (version 2)") {
			t.Fatalf("second deploy: exit %d %q", code, errOut)
		}
		// Rolling (stop-first, one at a time): one replica down at most.
		if lo < 1 || hi > 2 {
			t.Errorf("running replicas between %d and %d during the update, want 1..2", lo, hi)
		}
		v2 := c.settledTasks("web", 2, 2)
		if v := c.inspect(1, "web"); v.Version != 2 || !slices.Equal(v.Spec.Env, []string{"COLOR=green"}) {
			t.Fatalf("after the second deploy: %+v", v)
		}
		for _, tk := range v2 {
			if slices.ContainsFunc(v1, func(o *schedv1.Task) bool { return o.GetId() == tk.GetId() }) {
				t.Errorf("task %s of version 1 was not replaced", tk.GetId())
			}
			if tk.GetVersion() != 2 {
				t.Errorf("task %s runs version %d, want 2", tk.GetId(), tk.GetVersion())
			}
			if env := envOf(tk.GetId()); !strings.Contains(env, "COLOR=green\n") || strings.Contains(env, "COLOR=blue") {
				t.Errorf("task %s env after the update:\n%s", tk.GetId(), env)
			}
		}
		if m := c.mustRunning("web"); total(m) != 2 || !maps.Equal(ids(m), taskSet(v2)) {
			t.Errorf("containers %v, want exactly the tasks %v", m, taskSet(v2))
		}

		// The same file again: nothing to do.
		before := c.mustRunning("web")
		_, errOut, code = c.ctlWithin(time.Minute, 1, "service", "deploy", "-f", file)
		if code != 0 {
			t.Fatalf("third deploy: exit %d %q", code, errOut)
		}
		time.Sleep(3 * time.Second)
		if v := c.inspect(3, "web"); v.Version != 2 || v.State != "active" {
			t.Errorf("deploying an unchanged spec: version %d state %s, want version 2 active", v.Version, v.State)
		}
		if after := c.mustRunning("web"); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Errorf("deploying an unchanged spec changed the containers: %v -> %v", before, after)
		}
		if v3 := c.currentTasks("web"); !maps.Equal(taskSet(v3), taskSet(v2)) {
			t.Errorf("deploying an unchanged spec changed the tasks: %v -> %v", taskSet(v2), taskSet(v3))
		}
		// Rollback still returns to the blue spec: an unchanged deploy
		// did not overwrite the previous spec.
		c.mustCtlWithin(2*time.Minute, 2, "service", "rollback", "web")
		if v := c.inspect(2, "web"); !slices.Equal(v.Spec.Env, []string{"COLOR=blue"}) {
			t.Errorf("rollback after an unchanged deploy: env %v, want COLOR=blue", v.Spec.Env)
		}
		c.mustCtl(1, "service", "rm", "web")
	})

	t.Run("LeftoverOfRemovedService", func(t *testing.T) {
		// statd has no conditional writes: an owner whose view has not
		// seen a removal yet may write its state fields (state,
		// converged, unschedulable) into the service document just
		// after the delete, and being later they outlive it. Write
		// exactly such a leftover.
		c.mustCtl(1, "service", "create", "zombie", "--image", img, "--replicas", "1", "--stop-grace", "1s", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 1, "zombie")
		c.mustCtl(1, "service", "rm", "zombie")
		statds := []*client.Statd{nodeClient(t, c.Cluster, 1), nodeClient(t, c.Cluster, 2), nodeClient(t, c.Cluster, 3)}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := statds[1].Put(ctx, &statev1.PutRequest{Key: "/services/zombie", Fields: map[string]*statev1.Value{
			"state":     {Kind: &statev1.Value_StringValue{StringValue: "active"}},
			"converged": {Kind: &statev1.Value_IntValue{IntValue: 99}},
		}}); err != nil {
			t.Fatal(err)
		}
		// It is no service, on any node.
		waitFor(t, 10*time.Second, "the leftover on every node", func() bool {
			for _, st := range statds {
				if _, ok := getField(st, "/services/zombie", "converged"); !ok {
					return false
				}
			}
			return true
		})
		for i := 1; i <= 3; i++ {
			var svcs []serviceJSON
			decode(t, c.mustCtl(i, "service", "ls", "-o", "json"), &svcs)
			if len(svcs) != 0 {
				t.Errorf("node %d lists %+v", i, svcs)
			}
			if _, errOut, code := c.ctl(i, "service", "inspect", "zombie"); code != 3 {
				t.Errorf("node %d: inspect of the removed service: exit %d %q, want 3 (not found)", i, code, errOut)
			}
		}
		// The name can be used again, and the new service's updates are
		// watched from version 1 on: a bad update rolls back.
		c.mustCtl(3, "service", "create", "zombie", "--image", img, "--replicas", "1", "--stop-grace", "1s", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 3, "zombie")
		_, errOut, code := c.ctlWithin(time.Minute, 2, "service", "update", "zombie", "--update-failure-action", "rollback", "--update-monitor", "3s",
			"--restart-max-attempts", "1", "--wait-timeout", "30s", "--", "sh", "-c", "exit 7")
		if code == 0 || !strings.Contains(errOut, "rolled back") {
			t.Errorf("bad update of the re-created service: exit %d %q, want it rolled back", code, errOut)
		}
		c.mustCtl(1, "service", "rm", "zombie")
	})

	t.Run("RollingUpdateOrder", func(t *testing.T) {
		// A bare sleep ignores SIGTERM: a replaced task runs on for the
		// 1s grace period, so tasks started together overlap and too
		// many at once would show. The default monitor period (5s)
		// between batches outlasts the grace.
		c.mustCtl(1, "service", "create", "ru", "--image", img, "--replicas", "4", "--stop-grace", "1s",
			"--update-parallelism", "2", "--update-order", "start-first", "--", "sleep", "1000000")
		removeIfFailed(t, c.Cluster, 1, "ru")
		v1 := ids(c.mustRunning("ru"))
		if len(v1) != 4 {
			t.Fatalf("%d containers, want 4", len(v1))
		}

		// start-first, 2 at a time: never fewer than 4, never more than
		// 4+2.
		s := c.sample("ru", 100*time.Millisecond)
		c.mustCtlWithin(2*time.Minute, 2, "service", "update", "ru", "--env", "V=2")
		time.Sleep(1500 * time.Millisecond) // the last old tasks stop
		lo, hi := s.finish(t, 20)
		if lo < 4 {
			t.Errorf("start-first update: running replicas dropped to %d (at %s)", lo, s.low)
		}
		if hi > 6 {
			t.Errorf("start-first update with parallelism 2: %d replicas at once, want at most 6", hi)
		}
		v2 := ids(c.mustRunning("ru"))
		if len(v2) != 4 || len(intersect(v1, v2)) != 0 {
			t.Fatalf("after the start-first update: containers %v, before %v; want 4, all new", v2, v1)
		}

		// stop-first, 1 at a time: never fewer than 3, never more than 4.
		s = c.sample("ru", 100*time.Millisecond)
		c.mustCtlWithin(2*time.Minute, 3, "service", "update", "ru", "--update-order", "stop-first", "--update-parallelism", "1", "--env", "V=3")
		lo, hi = s.finish(t, 20)
		if lo < 3 {
			t.Errorf("stop-first update with parallelism 1: running replicas dropped to %d (at %s)", lo, s.low)
		}
		if hi > 4 {
			t.Errorf("stop-first update: %d replicas at once, want at most 4", hi)
		}
		v3 := ids(c.mustRunning("ru"))
		if len(v3) != 4 || len(intersect(v2, v3)) != 0 {
			t.Fatalf("after the stop-first update: containers %v, before %v; want 4, all new", v3, v2)
		}
		for _, tk := range c.currentTasks("ru") {
			if env := c.mustCtl(1, "task", "exec", tk.GetId(), "--", "env"); !strings.Contains(env, "V=3\n") {
				t.Errorf("task %s env after the update:\n%s", tk.GetId(), env)
			}
		}
		c.mustCtl(1, "service", "rm", "ru")
	})
}

// bgCtl is a shoalctl command running in the background (a follow).
type bgCtl struct {
	cmd         *exec.Cmd
	out, errOut *syncBuffer
	done        chan struct{}
	err         error // valid once done is closed
}

// catInPinned runs service name from image on node i alone (created
// from the next node), and returns file as its task reads it.
func (c *moreCluster) catInPinned(t *testing.T, name, image string, i int, file string) string {
	t.Helper()
	other := i%3 + 1
	c.mustCtl(other, "service", "create", name, "--image", image, "--constraint", fmt.Sprintf("node.name==n%d", i), "--stop-grace", "1s", "--", "sleep", "1000000")
	removeIfFailed(t, c.Cluster, other, name)
	cur := c.currentTasks(name)
	if len(cur) != 1 || cur[0].GetNode() != c.ids[i-1] {
		t.Fatalf("current tasks of %s: %v, want one on n%d", name, cur, i)
	}
	return c.mustCtl(other, "task", "exec", cur[0].GetId(), "--", "cat", file)
}

// startCtl starts shoalctl args on node i; the test's end kills it.
func (c *schedCluster) startCtl(i int, args ...string) *bgCtl {
	c.t.Helper()
	cmd, err := c.Command(context.Background(), i, append([]string{"shoalctl"}, args...)...)
	if err != nil {
		c.t.Fatal(err)
	}
	b := &bgCtl{cmd: cmd, out: &syncBuffer{}, errOut: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = b.out, b.errOut
	if err := c.StartIn(i, cmd); err != nil {
		c.t.Fatalf("start shoalctl %v: %v", args, err)
	}
	go func() { b.err = cmd.Wait(); close(b.done) }()
	c.t.Cleanup(func() { cmd.Process.Kill(); <-b.done })
	return b
}

// wait waits up to d for the command to exit and returns its exit code.
func (b *bgCtl) wait(d time.Duration) (int, bool) {
	select {
	case <-b.done:
		code, _ := devcluster.ExitCode(b.err)
		return code, true
	case <-time.After(d):
		return -1, false
	}
}

// interrupt sends SIGINT (Ctrl-C) and returns the exit code.
func (b *bgCtl) interrupt(t *testing.T) int {
	t.Helper()
	b.cmd.Process.Signal(os.Interrupt)
	code, ok := b.wait(10 * time.Second)
	if !ok {
		t.Fatalf("%v did not exit within 10s of SIGINT", b.cmd.Args)
	}
	return code
}

func decode(t *testing.T, out string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("not JSON (%v):\n%s", err, out)
	}
}

func firstKey[V any](m map[string]V) string {
	for k := range m {
		return k
	}
	return ""
}

func taskSet(ts []*schedv1.Task) map[string]bool {
	out := map[string]bool{}
	for _, tk := range ts {
		out[tk.GetId()] = true
	}
	return out
}

func intersect(a, b map[string]bool) []string {
	var out []string
	for k := range a {
		if b[k] {
			out = append(out, k)
		}
	}
	return out
}

// pushTestImage pushes the default test image to the registry at host as
// repo:tag over plain http, by the distribution API: each blob of its OCI
// layout (a POST opens an upload, a PUT with the digest completes it), then
// the manifest under the tag.
func pushTestImage(t *testing.T, host, repo, tag string) {
	t.Helper()
	data, built, err := testimage.OCI(testimage.Default())
	if err != nil {
		t.Fatal(err)
	}
	blobs := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if hex, ok := strings.CutPrefix(h.Name, "blobs/sha256/"); ok && hex != "" {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			blobs["sha256:"+hex] = b
		}
	}
	base := "http://" + host + "/v2/" + repo
	do := func(method, url, contentType string, body []byte, want int) *http.Response {
		req, err := http.NewRequest(method, url, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("%s %s: %s", method, url, resp.Status)
		}
		return resp
	}
	manifest := built[0].Manifest.Digest.String()
	for d, b := range blobs {
		if d == manifest {
			continue
		}
		loc := do(http.MethodPost, base+"/blobs/uploads/", "", nil, http.StatusAccepted).Header.Get("Location")
		if !strings.HasPrefix(loc, "http") {
			loc = "http://" + host + loc
		}
		sep := "?"
		if strings.Contains(loc, "?") {
			sep = "&"
		}
		do(http.MethodPut, loc+sep+"digest="+d, "application/octet-stream", b, http.StatusCreated)
	}
	do(http.MethodPut, base+"/manifests/"+tag, built[0].Manifest.MediaType, blobs[manifest], http.StatusCreated)
}

// statOf returns the stat of a file (nil, and an error reported, when
// it cannot).
func statOf(t *testing.T, name string) *syscall.Stat_t {
	t.Helper()
	info, err := os.Lstat(name)
	if err != nil {
		t.Error(err)
		return nil
	}
	return info.Sys().(*syscall.Stat_t)
}
