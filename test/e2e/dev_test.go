package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/client"
	"github.com/shoal-dev/shoal/pkg/devcluster"
	volv1 "github.com/shoal-dev/shoal/proto/shoal/vol/v1"
)

// The `shoalctl dev` commands end to end, as a user types them: a
// two-node statd-only cluster brought up, inspected, exec'd into, killed
// and restarted, partitioned and healed, and taken down without a trace.
func TestDevCommands(t *testing.T) {
	name := fmt.Sprintf("d%d", rand.IntN(1_000_000))
	dev := func(args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(bin("shoalctl"), append([]string{"dev", "--name", name}, args...)...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code, err := devcluster.ExitCode(err)
		if err != nil {
			t.Fatalf("run shoalctl dev %s: %v", strings.Join(args, " "), err)
		}
		return out.String(), errb.String(), code
	}
	mustDev := func(args ...string) string {
		t.Helper()
		out, errOut, code := dev(args...)
		if code != 0 {
			t.Fatalf("shoalctl dev %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errOut)
		}
		return out
	}
	status := func() devcluster.Status {
		t.Helper()
		var st devcluster.Status
		if err := json.Unmarshal([]byte(mustDev("status", "-o", "json")), &st); err != nil {
			t.Fatalf("dev status -o json: %v", err)
		}
		return st
	}
	statd := func(st devcluster.Status, node int) devcluster.ProcessStatus {
		t.Helper()
		for _, p := range st.Nodes[node-1].Processes {
			if p.Name == "statd" {
				return p
			}
		}
		t.Fatalf("dev status: node %d has no statd: %+v", node, st.Nodes[node-1])
		return devcluster.ProcessStatus{}
	}
	// get reads /dev/x on a node through dev exec.
	get := func(node int) string {
		out, _, _ := dev("exec", fmt.Sprint(node), "--", "shoalctl", "state", "get", "/dev/x", "-o", "json")
		return out
	}

	out := mustDev("up", "--nodes", "2", "--daemons", "statd", "--subnet", "auto")
	var pids []int
	t.Cleanup(func() {
		if t.Failed() {
			dev("down") // whatever the test left
		}
	})
	if !strings.Contains(out, fmt.Sprintf("dev cluster %q is up: 2 nodes", name)) || !strings.Contains(out, "dev exec --name "+name+" 1 --") {
		t.Fatalf("dev up output:\n%s", out)
	}
	c, err := devcluster.Load(name)
	if err != nil {
		t.Fatal(err)
	}

	st := status()
	if st.Name != name || len(st.Nodes) != 2 || !st.BridgeUp {
		t.Fatalf("dev status: %+v", st)
	}
	for i, n := range st.Nodes {
		if p := statd(st, i+1); !n.NetnsUp || !p.Running || !p.Ready || p.PID == 0 || n.Addr != c.Addr(i+1) {
			t.Fatalf("dev status: node %d: %+v", i+1, n)
		}
		pids = append(pids, statd(st, i+1).PID)
	}

	// exec runs in the node's namespace with SHOAL_RUN_DIR set, and passes
	// the exit code through.
	out, errOut, code := dev("exec", "1", "--", "sh", "-c", `echo "$SHOAL_RUN_DIR"; ip -o -4 addr show; exit 7`)
	if code != 7 || !strings.HasPrefix(out, st.Nodes[0].RunDir+"\n") || !strings.Contains(out, c.Addr(1)+"/") || strings.Contains(out, c.Addr(2)+"/") {
		t.Fatalf("dev exec 1: exit %d, want 7, the run dir %s and the address %s only:\n%s%s", code, st.Nodes[0].RunDir, c.Addr(1), out, errOut)
	}
	// The two nodes form one cluster.
	mustDev("exec", "1", "--", "shoalctl", "state", "put", "/dev/x", "v=one")
	waitFor(t, 15*time.Second, "node 1's write on node 2", func() bool { return strings.Contains(get(2), `"v": "one"`) })

	mustDev("kill", "2", "statd")
	if p := statd(status(), 2); p.Running {
		t.Fatalf("dev status after dev kill 2 statd: %+v", p)
	}
	mustDev("start", "2", "statd")
	p := statd(status(), 2)
	if !p.Running || !p.Ready || p.PID == pids[1] {
		t.Fatalf("dev status after dev start 2 statd: %+v (old pid %d)", p, pids[1])
	}
	pids = append(pids, p.PID)

	mustDev("partition", "1", "2")
	if st := status(); !slices.EqualFunc(st.Partition, [][]int{{1}, {2}}, slices.Equal) {
		t.Fatalf("dev status after dev partition 1 2: partition %v", st.Partition)
	}
	mustDev("exec", "1", "--", "shoalctl", "state", "put", "/dev/x", "v=two")
	time.Sleep(2 * time.Second) // several push and anti-entropy rounds
	if got := get(2); !strings.Contains(got, `"v": "one"`) {
		t.Fatalf("a write crossed the partition:\n%s", got)
	}
	mustDev("heal")
	if st := status(); len(st.Partition) != 0 {
		t.Fatalf("dev status after dev heal: partition %v", st.Partition)
	}
	waitFor(t, 15*time.Second, "node 1's write on node 2 after heal", func() bool { return strings.Contains(get(2), `"v": "two"`) })

	if out := mustDev("down"); !strings.Contains(out, "is down") {
		t.Fatalf("dev down output:\n%s", out)
	}
	for _, what := range c.Leftovers(pids...) {
		t.Errorf("%s survived dev down", what)
	}
	if _, errOut, code := dev("status"); code == 0 || !strings.Contains(errOut, "no dev cluster named") {
		t.Fatalf("dev status after down: exit %d %q", code, errOut)
	}
}

// TestDemo runs `make demo`'s script, the README's first command, as a
// newcomer would (on a dev cluster of its own name and subnet), and checks
// what it shows: state read on every node, the published port answering
// on every node, the scribe's task surviving its vold's restart, and, once
// the scribe stops writing, the volume's three replicas identical.
func TestDemo(t *testing.T) {
	name := fmt.Sprintf("m%d", rand.IntN(1_000_000))
	image := writeTestImage(t)
	dev := func(args ...string) (string, error) {
		out, err := exec.Command(bin("shoalctl"), append([]string{"dev", "--name", name}, args...)...).CombinedOutput()
		return string(out), err
	}
	t.Cleanup(func() {
		if out, err := dev("down"); err != nil {
			t.Errorf("dev down: %v\n%s", err, out)
		}
	})

	cmd := exec.Command("../../scripts/demo.sh")
	cmd.Env = append(os.Environ(), "SHOAL_CTL="+bin("shoalctl"), "DEMO_NAME="+name, "DEMO_SUBNET=auto", "DEMO_IMAGE="+image)
	start := time.Now()
	b, err := cmd.CombinedOutput()
	out := string(b)
	if err != nil {
		t.Fatalf("scripts/demo.sh: %v\n%s", err, out)
	}
	t.Logf("scripts/demo.sh ran in %v", time.Since(start).Round(time.Second))
	count := func(re string) int { return len(regexp.MustCompile(re).FindAllString(out, -1)) }
	for _, c := range []struct {
		what, re string
		want     int
	}{
		{"every node reads node 1's state", `(?m)^node [123]:\s+"text": "hello from node 1"$`, 3},
		{"port 8080 answers on every node", `(?m)^http://\S+:8080/ -> hello from hello-\d$`, 3},
		{"the scribe's task outlives its vold's restart", `(?m)^\(the same task scribe\.\S+, never restarted`, 1},
		{"service stats prints a table", `(?m)^TASK\s+SERVICE\s+SLOT\s+NODE\s+CPU %\s+MEM USAGE / LIMIT`, 1},
	} {
		if got := count(c.re); got != c.want {
			t.Errorf("%s: %d lines match %s, want %d", c.what, got, c.re, c.want)
		}
	}
	if t.Failed() {
		t.Fatalf("demo output:\n%s", out)
	}

	// With the scribe stopped, the replicas reach the same index; their
	// data must then hash alike.
	if o, err := dev("exec", "1", "--", "shoalctl", "service", "rm", "scribe"); err != nil {
		t.Fatalf("service rm scribe: %v\n%s", err, o)
	}
	dc, err := devcluster.Load(name)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := client.Dial(dc.RunDir(1), "vold", client.Retry{Attempts: 20, Max: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	vols := volv1.NewVolumesClient(conn)
	var last *volv1.Volume
	defer func() {
		if t.Failed() {
			t.Logf("last volume inspect: %v", last)
		}
	}()
	waitFor(t, 60*time.Second, "the volume's 3 replicas alive, at one applied index, with one digest", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		v, err := vols.InspectVolume(ctx, &volv1.InspectVolumeRequest{Name: "notes", Digests: true})
		last = v
		return err == nil && v.GetHealth() == "healthy" && converged(v, 3)
	})
	t.Logf("volume notes: %v", last)

	// The replicas that answered the demo's requests, each in a network
	// namespace of its own, show that traffic in their stats.
	o, err := dev("exec", "1", "--", "shoalctl", "service", "stats", "hello", "--no-stream", "-o", "json")
	if err != nil {
		t.Fatalf("service stats hello: %v\n%s", err, o)
	}
	type netStat struct {
		Task  string
		Rx    uint64 `json:"net_rx_bytes"`
		Tx    uint64 `json:"net_tx_bytes"`
		Error string
	}
	var stats []netStat
	decode(t, o, &stats)
	if !slices.ContainsFunc(stats, func(s netStat) bool { return s.Error == "" && s.Rx > 0 && s.Tx > 0 }) {
		t.Errorf("no replica of hello shows the traffic it answered: %+v", stats)
	}

	testStack(t, name)
}

// testStack deploys a Compose file on the demo's cluster (every daemon,
// netd's DNS included): its services reach each other by their names in
// the file, its secret, config and volume are created with it, a second
// deploy changes nothing, --prune removes what the file dropped, and
// `stack rm` takes the services, the secret and the config.
func testStack(t *testing.T, name string) {
	dir := t.TempDir()
	pass := fmt.Sprintf("pw-%d", rand.Int64())
	write := func(name, data string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	write("db_pass.txt", pass)
	compose := write("compose.yml", `
services:
  web:
    image: local/busybox:latest
    command: ["sh", "-c", "mkdir -p /www && echo stack-web > /www/index.html && exec httpd -f -p 80 -h /www"]
    deploy: {replicas: 2}
    stop_grace_period: 1s
    depends_on: [client]
  client:
    image: local/busybox:latest
    entrypoint: ["sh", "-c"]
    command: ["exec sleep 1000000"]
    user: "1000:1000"
    working_dir: /tmp
    read_only: true
    tmpfs: ["/cache:size=1m"]
    stop_grace_period: 1s
    secrets: [db_pass]
    configs: [{source: site, target: /etc/site.conf}]
    volumes: ["data:/data"]
configs:
  site: {content: "site-config"}
volumes:
  data:
    driver_opts: {size: 16M}
secrets:
  db_pass: {file: ./db_pass.txt}
`)
	ctl := func(i int, args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(bin("shoalctl"), append([]string{"dev", "--name", name, "exec", strconv.Itoa(i), "--", "shoalctl"}, args...)...)
		out, err := cmd.CombinedOutput()
		code, err := devcluster.ExitCode(err)
		if err != nil {
			t.Fatalf("shoalctl %v: %v", args, err)
		}
		return string(out), code
	}
	out, code := ctl(1, "stack", "deploy", "app", "-c", compose, "--dry-run")
	for _, want := range []string{"secret app_db_pass would be created", "config app_site would be created", "volume app-data would be created",
		"service app-client would be created", "service app-web would be created"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("stack deploy --dry-run: exit %d, want 0 and %q:\n%s", code, want, out)
		}
	}
	if out, _ := ctl(2, "secret", "ls", "-o", "json"); strings.TrimSpace(out) != "[]" {
		t.Errorf("secrets after a dry run: %s", out)
	}
	out, code = ctl(1, "stack", "deploy", "app", "-c", compose)
	if code != 0 {
		t.Fatalf("stack deploy: exit %d\n%s", code, out)
	}
	for _, want := range []string{"warning: service web: depends_on is ignored", "secret app_db_pass created", "config app_site created", "volume app-data created",
		"service app-client created", "service app-web created", "app-client converged: 1/1", "app-web converged: 2/2"} {
		if !strings.Contains(out, want) {
			t.Errorf("stack deploy's output lacks %q:\n%s", want, out)
		}
	}
	type taskJSON struct {
		ID, Service string
		Restarts    int
	}
	var tasks []taskJSON
	out, code = ctl(2, "stack", "ps", "app", "-o", "json")
	if code != 0 || json.Unmarshal([]byte(out), &tasks) != nil || len(tasks) != 3 {
		t.Fatalf("stack ps: exit %d, %s; want 3 tasks", code, out)
	}
	clientTask := tasks[slices.IndexFunc(tasks, func(x taskJSON) bool { return x.Service == "app-client" })]
	client := clientTask.ID
	// Its secret and config were created on node 1 a moment before: a
	// task elsewhere waits for them rather than failing its first start.
	if clientTask.Restarts != 0 {
		t.Errorf("the client's task restarted %d times", clientTask.Restarts)
	}
	var got string
	defer func() {
		if t.Failed() {
			t.Logf("the client's last answer: %q", got)
		}
	}()
	waitFor(t, 30*time.Second, "the client reaches web by its name in the file", func() bool {
		got, _ = ctl(3, "task", "exec", client, "--", "sh", "-c", "timeout 5 wget -qO- http://web/ && cat /run/secrets/db_pass && echo && cat /etc/site.conf && echo && id -u && pwd && (touch /x 2>/dev/null && echo rw || echo ro) && touch /cache/x && echo cache-rw && df -k /data | tail -1")
		return strings.HasPrefix(got, "stack-web\n"+pass+"\nsite-config\n1000\n/tmp\nro\ncache-rw\n")
	})
	if !strings.Contains(got, "shoal:app-data") {
		t.Errorf("the client's /data is not volume app-data: %q", got)
	}

	// The same file again changes nothing; a changed secret is refused.
	out, code = ctl(3, "stack", "deploy", "app", "-c", compose)
	if code != 0 || strings.Count(out, " unchanged") != 2 || strings.Contains(out, "created") {
		t.Errorf("second stack deploy: exit %d, want both services unchanged:\n%s", code, out)
	}
	write("db_pass.txt", pass+"-new")
	if out, code = ctl(1, "stack", "deploy", "app", "-c", compose); code != 1 || !strings.Contains(out, "secret app_db_pass changed") {
		t.Errorf("deploy with a changed secret: exit %d, want 1:\n%s", code, out)
	}
	bad := write("bad.yml", "services:\n  x:\n    image: local/busybox:latest\n    volumes: [{type: bind, source: /srv, target: /srv, bind: {propagation: shared}}]\n")
	if out, code = ctl(1, "stack", "deploy", "other", "-c", bad); code != 2 || !strings.Contains(out, "bind propagation shared is not supported") {
		t.Errorf("deploy of a shared bind mount: exit %d, want 2:\n%s", code, out)
	}
	var stacks []struct {
		Name     string
		Services int
	}
	out, _ = ctl(2, "stack", "ls", "-o", "json")
	if json.Unmarshal([]byte(out), &stacks) != nil || len(stacks) != 1 || stacks[0].Name != "app" || stacks[0].Services != 2 {
		t.Errorf("stack ls: %s; want app with 2 services (and no stack other)", out)
	}

	// A file without the client: kept, unless --prune.
	webOnly := write("web.yml", "services:\n  web:\n    image: local/busybox:latest\n    command: [\"sh\", \"-c\", \"mkdir -p /www && echo stack-web > /www/index.html && exec httpd -f -p 80 -h /www\"]\n    deploy: {replicas: 2}\n    stop_grace_period: 1s\n")
	if out, code = ctl(1, "stack", "deploy", "app", "-c", webOnly); code != 0 || !strings.Contains(out, "service app-client is not in the files: kept") || !strings.Contains(out, "service app-web unchanged") {
		t.Errorf("deploy without the client: exit %d, want it kept and web unchanged:\n%s", code, out)
	}
	if out, code = ctl(1, "stack", "deploy", "app", "-c", webOnly, "--prune", "--dry-run"); code != 0 || !strings.Contains(out, "service app-client would be removed") || !strings.Contains(out, "service app-web unchanged") {
		t.Errorf("deploy --prune --dry-run without the client: exit %d, want it to say the client would go:\n%s", code, out)
	}
	if out, code = ctl(1, "stack", "deploy", "app", "-c", webOnly, "--prune"); code != 0 || !strings.Contains(out, "service app-client removed") {
		t.Errorf("deploy --prune without the client: exit %d, want it removed:\n%s", code, out)
	}
	out, code = ctl(2, "stack", "rm", "app")
	if code != 0 || !strings.Contains(out, "service app-web removed") || !strings.Contains(out, "secret app_db_pass removed") || !strings.Contains(out, "config app_site removed") {
		t.Fatalf("stack rm: exit %d\n%s", code, out)
	}
	for _, noun := range []string{"secret", "config"} {
		if out, _ := ctl(1, noun, "ls", "-o", "json"); strings.TrimSpace(out) != "[]" {
			t.Errorf("%ss after stack rm: %s", noun, out)
		}
	}
	if _, code := ctl(1, "stack", "rm", "app"); code != 3 {
		t.Errorf("stack rm of a removed stack: exit %d, want 3", code)
	}
	// A deploy that would fail (no such images; the check waits for
	// them a moment) changes nothing, and says why for every service.
	half := write("half.yml", "services:\n  x:\n    image: local/missing:1\n    secrets: [s]\n  y:\n    image: local/missing:2\nsecrets:\n  s: {file: ./db_pass.txt}\n")
	if out, code = ctl(1, "stack", "deploy", "half", "-c", half); code != 2 || strings.Contains(out, "created") ||
		!strings.Contains(out, "nothing was changed") || !strings.Contains(out, `service half-x: image "local/missing:1" is not on any node`) || !strings.Contains(out, `service half-y: image "local/missing:2"`) {
		t.Errorf("deploy with missing images: exit %d, want 2 with both services' problems and nothing created:\n%s", code, out)
	}
	if out, _ := ctl(2, "secret", "ls", "-o", "json"); strings.TrimSpace(out) != "[]" {
		t.Errorf("secrets after the refused deploy: %s", out)
	}
	// A stack whose deploy stopped before its first service (the
	// cluster changed between the check and the deploy) has only its
	// secrets; stack rm finds them by their label.
	if out, code = ctl(1, "secret", "create", "half_s", filepath.Join(dir, "db_pass.txt"), "--label", "shoal.stack=half"); code != 0 {
		t.Errorf("secret create half_s: exit %d\n%s", code, out)
	}
	if out, code = ctl(2, "stack", "rm", "half"); code != 0 || !strings.Contains(out, "secret half_s removed") {
		t.Errorf("stack rm of a stack without services: exit %d, want its secret removed:\n%s", code, out)
	}
	if _, code := ctl(3, "stack", "rm", "half"); code != 3 {
		t.Errorf("stack rm of it again: exit %d, want 3", code)
	}
	if out, code := ctl(1, "volume", "rm", "app-data"); code != 0 {
		t.Errorf("volume rm app-data (kept by stack rm): exit %d\n%s", code, out)
	}
}
