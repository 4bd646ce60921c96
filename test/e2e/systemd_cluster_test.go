package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestSystemdCluster boots three machines, each a whole node under a real
// systemd (as TestSystemdNode), on one network of their own (an nspawn
// zone: a bridge on this machine and a veth into each), joins them into a
// cluster by token, and runs a service's task on one of them, serving a
// file of a volume with a replica on each machine, whose published port
// serves on all three (the others reach it through the overlay:
// WireGuard between the machines' netds). That machine then powers off:
// its schedd says in its node document that it shut down, and another
// machine runs a replacement at once. The statds' suspicion timeout is
// two minutes here, so the failure detector cannot have done it: the
// replacement must come, and the powered-off node must still not be dead,
// within one minute. The service is start-first (its update order), so
// the task that shut down stops only once its replacement runs (its
// finish is after the replacement's start) and is recorded stopped for
// the shutdown. The replacement serves the volume's file, whose group a
// machine that is up leads.
func TestSystemdCluster(t *testing.T) {
	root, units, image := nspawnInputs(t)
	// The zone's bridge is vz-<zone>, at most 15 characters; the subnet is
	// the zone's alone (nothing else on this machine routes it).
	zone := fmt.Sprintf("se%d", os.Getpid()%10000000)
	const subnet = "10.254.77."
	var ms [3]*container
	for i, x := range []string{"a", "b", "c"} {
		m := machine{name: fmt.Sprintf("shoal-e2e-%d-%s", os.Getpid(), x), zone: zone, addr: fmt.Sprintf("%s%d/24", subnet, i+1)}
		ms[i] = bootContainer(t, machineDisk(t, root), units, filepath.Dir(image), m)
	}
	// Failure detection far slower than any hand-over.
	for _, c := range ms {
		c.installNode(t, "suspicion_timeout = \"120s\"\n")
	}
	a := ms[0]
	a.must("shoalctl", "cluster", "init", "--advertise", subnet+"1")
	token := strings.TrimSpace(a.must("shoalctl", "cluster", "token"))
	for i, c := range ms[1:] {
		c.must("shoalctl", "cluster", "join", "--token", token, "--advertise", fmt.Sprintf("%s%d", subnet, i+2), subnet+"1")
	}
	addrOf := map[string]*container{}
	waitFor(t, 60*time.Second, "the three nodes alive in the cluster", func() bool {
		nodes := a.nodes()
		alive := 0
		for _, n := range nodes {
			if n.State == "alive" {
				alive++
			}
			addrOf[n.ID] = map[string]*container{subnet + "1": ms[0], subnet + "2": ms[1], subnet + "3": ms[2]}[n.Addr]
		}
		return alive == 3
	})
	for _, c := range ms {
		c.must("shoalctl", "image", "load", "/opt/shoal/images/"+filepath.Base(image))
	}
	// web serves a file of a volume with a replica on each machine.
	a.must("shoalctl", "volume", "create", "v1", "--replicas", "3", "--size", "16m")
	mnt := strings.TrimSpace(a.must("shoalctl", "volume", "mount", "v1"))
	a.must("sh", "-c", "echo hello from the volume > "+mnt+"/hello")
	a.must("shoalctl", "volume", "unmount", "v1")
	a.must("shoalctl", "service", "create", "web", "--image", "local/busybox:latest", "-p", "8080:80", "--volume", "v1:/www",
		"--stop-grace", "2s", "--update-order", "start-first", "--", "sh", "-c",
		`trap 'exit 0' TERM; httpd -p 80 -h /www; while true; do sleep 0.2; done`)
	var task taskState
	waitFor(t, 60*time.Second, "web's task running", func() bool {
		ts := a.tasks("web")
		if len(ts) == 1 && ts[0].State == "running" {
			task = ts[0]
			return true
		}
		return false
	})
	victim := addrOf[task.Node]
	if victim == nil {
		t.Fatalf("web's task %s is on node %q, which is no machine of the test's (%v)", task.ID, task.Node, addrOf)
	}
	survivor := ms[0]
	if victim == survivor {
		survivor = ms[1]
	}
	// The published port answers on every machine: on the others
	// through the overlay, WireGuard between the netds' devices.
	for _, c := range ms {
		c.servesAt(c.addr, "hello from the volume")
	}
	t.Logf("web's task %s runs on %s, and port 8080 serves it on every machine; %s powers off", task.ID, victim.name, victim.name)

	// Meanwhile the survivor's port is asked every few milliseconds, for
	// the figure of the longest gap (logged, not judged: timing).
	stopPolls := make(chan struct{})
	var stopOnce sync.Once
	stopPolling := func() { stopOnce.Do(func() { close(stopPolls) }) }
	defer stopPolling()
	type pollFigures struct {
		longest        time.Duration
		answers, fails int
	}
	gap := make(chan pollFigures, 1)
	go func() {
		get := `exec 3<>/dev/tcp/` + survivor.addr + `/8080 && printf 'GET /hello HTTP/1.0\r\n\r\n' >&3 && cat <&3`
		var f pollFigures
		lastOK := time.Now()
		for {
			select {
			case <-stopPolls:
				gap <- f
				return
			default:
			}
			out, _ := survivor.run("timeout", "2", "bash", "-c", get)
			if strings.Contains(out, "hello from the volume") {
				f.longest = max(f.longest, time.Since(lastOK))
				lastOK = time.Now()
				f.answers++
			} else {
				f.fails++
			}
		}
	}()
	start := time.Now()
	_, _ = victim.run("systemctl", "poweroff")
	var replacement taskState
	waitFor(t, 60*time.Second, "web's task replaced on another machine", func() bool {
		var stopped bool
		for _, ts := range survivor.allTasks("web") {
			switch {
			case ts.ID == task.ID:
				stopped = ts.State == "stopped" && ts.Error == "stopped: its node shut down"
			case ts.State == "running" && addrOf[ts.Node] != nil && addrOf[ts.Node] != victim:
				replacement = ts
			}
		}
		return stopped && replacement.ID != ""
	})
	took := time.Since(start)
	var seen nodeState
	for _, n := range survivor.nodes() {
		if n.ID == task.Node {
			seen = n
		}
	}
	if seen.State == "dead" || !seen.ShutDown {
		t.Fatalf("%s sees the node that shut down as %+v; want it not dead yet (its failure detector takes minutes), and shut down", survivor.name, seen)
	}
	t.Logf("%s ran %s in place of %s %.1f s after the poweroff began; %s sees the node that shut down as %q (shut down)",
		addrOf[replacement.Node].name, replacement.ID, task.ID, took.Seconds(), survivor.name, seen.State)
	// The replacement serves the volume's file (while the machine that
	// shuts down may still lead its group: its vold stops after schedd).
	survivor.servesAt(survivor.addr, "hello from the volume")
	// web is start-first: its task on the machine that shut down stopped
	// only once the replacement ran.
	var old taskState
	for _, ts := range survivor.allTasks("web") {
		switch ts.ID {
		case task.ID:
			old = ts
		case replacement.ID:
			replacement = ts
		}
	}
	if old.Finished == nil || replacement.Started == nil || old.Finished.Before(*replacement.Started) {
		t.Fatalf("web is start-first, yet its task %s finished at %v, before its replacement %s started at %v",
			old.ID, old.Finished, replacement.ID, replacement.Started)
	}
	stopPolling()
	polls := <-gap
	t.Logf("%s started %.2f s after the poweroff began, and %s stopped %.2f s after that; port 8080 on %s answered %d times and failed %d, the longest wait between answers %.2f s",
		replacement.ID, replacement.Started.Sub(start).Seconds(), old.ID, old.Finished.Sub(*replacement.Started).Seconds(), survivor.name,
		polls.answers, polls.fails, polls.longest.Seconds())
	select {
	case <-victim.done:
	case <-time.After(90 * time.Second):
		t.Fatalf("%s did not power off within 90 s; console:\n%s", victim.name, victim.tail(80))
	}
	// Powered off, its vold has handed the volume's leadership over (or
	// the others elected a leader): the group goes on with two of three.
	waitFor(t, 30*time.Second, "volume v1 led by a machine that is up", func() bool {
		var vol struct {
			Leader string `json:"leader"`
		}
		out, _ := survivor.run("shoalctl", "volume", "inspect", "v1", "-o", "json")
		return json.Unmarshal([]byte(out), &vol) == nil && vol.Leader != "" && vol.Leader != task.Node
	})
	survivor.servesAt(survivor.addr, "hello from the volume")
	_, _ = survivor.run("shoalctl", "service", "rm", "web")
}

// nodeState is a node as `node ls -o json` shows it.
type nodeState struct {
	ID       string `json:"id"`
	Addr     string `json:"addr"`
	State    string `json:"state"`
	ShutDown bool   `json:"shutdown"`
}

// nodes returns the cluster's nodes as this machine's node sees them.
func (c *container) nodes() []nodeState {
	c.t.Helper()
	var ns []nodeState
	out := c.must("shoalctl", "node", "ls", "-o", "json")
	if err := json.Unmarshal([]byte(out), &ns); err != nil {
		c.t.Fatalf("node ls -o json: %v\n%s", err, out)
	}
	return ns
}
