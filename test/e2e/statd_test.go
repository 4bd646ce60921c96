package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/yaml"

	"github.com/shoal-dev/shoal/pkg/client"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

func str(s string) *statev1.Value {
	return &statev1.Value{Kind: &statev1.Value_StringValue{StringValue: s}}
}

func put(ctx context.Context, c *client.Statd, key, field, val string) (*statev1.PutResponse, error) {
	return c.Put(ctx, &statev1.PutRequest{Key: key, Fields: map[string]*statev1.Value{field: str(val)}})
}

func storeStatus(t *testing.T, c *client.Statd) *statev1.StatusResponse {
	t.Helper()
	st, err := c.Status(context.Background(), &statev1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// Put, kill -9, restart: every acknowledged value is there and the root is
// the same as before the kill.
func TestKill9KeepsAcknowledgedWritesAndRoot(t *testing.T) {
	n := newNode(t)
	p := n.start("statd")
	c := n.statd()
	ctx := context.Background()
	for i := range 200 {
		if _, err := put(ctx, c, fmt.Sprintf("/kv/%03d", i), "v", fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Delete(ctx, &statev1.DeleteRequest{Key: "/kv/007"}); err != nil {
		t.Fatal(err)
	}
	before := storeStatus(t, c)
	p.kill()
	n.start("statd")
	after := storeStatus(t, c)
	if after.RootHash != before.RootHash || after.Revision != before.Revision || after.Keys != before.Keys {
		t.Fatalf("restart changed the state:\nbefore %v\nafter  %v", before, after)
	}
	for i := range 200 {
		resp, err := c.Get(ctx, &statev1.GetRequest{Key: fmt.Sprintf("/kv/%03d", i)})
		if i == 7 {
			if err == nil {
				t.Fatalf("deleted key came back: %v", resp)
			}
			continue
		}
		if err != nil || resp.GetDocument().GetFields()["v"].GetStringValue() != fmt.Sprint(i) {
			t.Fatalf("get /kv/%03d after kill -9: %v %v", i, resp, err)
		}
	}
}

// kill -9 in the middle of concurrent writes: every write that was
// acknowledged before the kill survives it.
func TestKill9MidWriteLosesNoAcknowledgedWrite(t *testing.T) {
	n := newNode(t)
	p := n.start("statd")
	c, err := client.NewStatd(n.runDir, client.Retry{Attempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var mu sync.Mutex
	acked := map[string]string{}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key, val := fmt.Sprintf("/mid/%d", w), fmt.Sprint(i)
				if _, err := put(context.Background(), c, key, "v", val); err != nil {
					return
				}
				mu.Lock()
				acked[key] = val
				mu.Unlock()
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	p.kill()
	close(stop)
	wg.Wait()
	n.start("statd")
	c2 := n.statd()
	mu.Lock()
	defer mu.Unlock()
	if len(acked) == 0 {
		t.Fatal("no write was acknowledged before the kill")
	}
	for key, val := range acked {
		resp, err := c2.Get(context.Background(), &statev1.GetRequest{Key: key})
		if err != nil {
			t.Fatalf("get %s: %v", key, err)
		}
		// A write in flight at the kill may have landed after the last
		// acknowledged one: the stored value is at least as new.
		got := resp.GetDocument().GetFields()["v"].GetStringValue()
		if len(got) < len(val) || (len(got) == len(val) && got < val) {
			t.Fatalf("%s = %s after kill -9, but %s was acknowledged", key, got, val)
		}
	}
}

// A watcher sees every change exactly once, across its own reconnect and
// across a statd kill -9 and restart.
func TestWatchExactlyOnceAcrossReconnectAndRestart(t *testing.T) {
	n := newNode(t)
	p := n.start("statd")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var mu sync.Mutex
	seen := map[uint64]string{} // revision -> key
	dups := 0
	last := uint64(0)
	record := func(resp *statev1.WatchResponse) error {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range resp.GetEvents() {
			if _, ok := seen[e.GetRevision()]; ok {
				dups++
			}
			seen[e.GetRevision()] = e.GetDocument().GetKey()
			last = e.GetRevision()
		}
		return nil
	}
	// First watcher: its own client, closed after a while (a client-side
	// reconnect: the second watcher resumes from the last revision seen).
	c1, err := client.NewStatd(n.runDir, client.Retry{})
	if err != nil {
		t.Fatal(err)
	}
	w1ctx, w1cancel := context.WithCancel(ctx)
	w1done := make(chan error, 1)
	go func() { w1done <- c1.Watch(w1ctx, "/w/", client.FromNow, record) }()

	writer := n.statd()
	write := func(from, to int) {
		for i := from; i < to; i++ {
			// A write that fails during the restart is retried; its
			// second attempt is a new change with its own revision.
			for {
				_, err := put(ctx, writer, fmt.Sprintf("/w/%04d", i), "v", "x")
				if err == nil {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if i%10 == 0 {
				put(ctx, writer, "/other/x", "v", fmt.Sprint(i)) // not watched
			}
		}
	}
	time.Sleep(100 * time.Millisecond) // let the watch start at revision 0
	write(0, 100)
	waitUntil(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(seen) >= 100 })
	w1cancel()
	<-w1done
	c1.Close()
	mu.Lock()
	resume := last
	mu.Unlock()

	write(100, 150) // written while nobody watches

	c2 := n.statd()
	w2done := make(chan error, 1)
	go func() { w2done <- c2.Watch(ctx, "/w/", resume, record) }()
	write(150, 200)
	p.kill()
	writeDone := make(chan struct{})
	go func() { write(200, 300); close(writeDone) }()
	time.Sleep(200 * time.Millisecond)
	n.start("statd")
	<-writeDone

	final := storeStatus(t, writer).Revision
	// Every /w/ change in the log must be seen exactly once: compare with a
	// fresh watch replaying the whole log.
	var want []uint64
	full := n.statd()
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	full.Watch(wctx, "/w/", 0, func(resp *statev1.WatchResponse) error {
		for _, e := range resp.GetEvents() {
			want = append(want, e.GetRevision())
		}
		if resp.GetRevision() >= final {
			return errDone
		}
		return nil
	})
	waitUntil(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return last >= want[len(want)-1]
	})
	mu.Lock()
	defer mu.Unlock()
	if dups != 0 {
		t.Fatalf("%d changes delivered twice", dups)
	}
	if len(want) < 300 {
		t.Fatalf("log holds only %d /w/ changes", len(want))
	}
	for _, rev := range want {
		if _, ok := seen[rev]; !ok {
			t.Fatalf("change at revision %d never delivered (resume point %d)", rev, resume)
		}
	}
	if len(seen) != len(want) {
		t.Fatalf("saw %d changes, log has %d", len(seen), len(want))
	}
}

var errDone = errors.New("done")

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached within 20s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestSecondStatdOnSameStateDirRefuses(t *testing.T) {
	n := newNode(t)
	first := n.start("statd")
	second := n.spawn("statd", nil, "--run-dir", filepath.Join(n.root, "run2"))
	select {
	case <-second.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("second statd did not exit")
	}
	if second.err == nil {
		t.Fatal("second statd exited 0")
	}
	msg := second.stderr.String()
	if !strings.Contains(msg, "in use by another shoal-statd") || !strings.Contains(msg, fmt.Sprint(first.cmd.Process.Pid)) {
		t.Fatalf("unclear refusal: %q", msg)
	}
	// The first one is unharmed.
	if _, err := put(context.Background(), n.statd(), "/still/ok", "v", "1"); err != nil {
		t.Fatal(err)
	}
}

func TestCLIBadInputClearErrorsNothingChanged(t *testing.T) {
	n := newNode(t)
	n.start("statd")
	n.mustCtl("state", "put", "/app/web", "image=busybox", "replicas:int=3")
	before := n.mustCtl("state", "get", "/app/web", "-o", "json")
	cases := []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"state", "put", "app/web", "a=1"}, 2, "must start with /"},
		{[]string{"state", "put", "/app/web", "a:complex=1"}, 2, `unknown field type "complex"`},
		{[]string{"state", "put", "/app/web", "replicas:int=three"}, 2, "not an int"},
		{[]string{"state", "put", "/app/web", "noequals"}, 2, "want name=value"},
		{[]string{"state", "put", "/app/web", "bad name=1"}, 2, "may only contain"},
		{[]string{"state", "get", "/app/missing"}, 3, "not found"},
		{[]string{"state", "get", "/app/web", "-o", "xml"}, 2, "unknown output format"},
		{[]string{"state", "ls", "nope"}, 2, "must start with /"},
	}
	for _, c := range cases {
		out, errOut, code := n.ctl(c.args...)
		if code != c.code || !strings.Contains(errOut, c.msg) {
			t.Errorf("shoalctl %v: exit %d, stderr %q, stdout %q; want exit %d and %q", c.args, code, errOut, out, c.code, c.msg)
		}
	}
	// An oversized value (documents are limited to 1 MiB).
	big := filepath.Join(n.root, "big")
	os.WriteFile(big, make([]byte, 1<<20), 0o600)
	if out, errOut, code := n.ctl("state", "put", "/app/web", "--from-file", "blob="+big); code != 2 || !strings.Contains(errOut, "limit") {
		t.Errorf("oversized put: exit %d %s%s", code, out, errOut)
	}
	// Over gRPC, a value with no type set fails the whole Put, the valid
	// field beside it included.
	_, err := n.statd().Put(context.Background(), &statev1.PutRequest{Key: "/app/web", Fields: map[string]*statev1.Value{
		"image": {}, "extra": str("x"),
	}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `field "image"`) {
		t.Errorf("Put of a value with no type: %v, want InvalidArgument naming the field", err)
	}
	if after := n.mustCtl("state", "get", "/app/web", "-o", "json"); after != before {
		t.Fatalf("bad input changed the document:\n%s\n%s", before, after)
	}
	// Unreachable daemon: exit 4 and a message naming the socket.
	other := newNode(t)
	_, errOut, code := other.ctl("state", "get", "/x", "--timeout", "3s")
	if code != 4 || !strings.Contains(errOut, "statd.sock") {
		t.Fatalf("unreachable statd: exit %d %q", code, errOut)
	}
}

func TestCLIStateCommands(t *testing.T) {
	n := newNode(t)
	n.start("statd")
	n.mustCtl("state", "put", "/app/web", "image=busybox", "replicas:int=3", "ratio:float=0.5", "enabled:bool=true")
	n.mustCtl("state", "put", "/app/db", "image=postgres")
	out := n.mustCtl("state", "get", "/app/web", "-o", "yaml")
	for _, want := range []string{"key: /app/web", "replicas: 3", "ratio: 0.5", "enabled: true"} {
		if !strings.Contains(out, want) {
			t.Fatalf("yaml output lacks %q:\n%s", want, out)
		}
	}
	out = n.mustCtl("state", "ls", "/app/")
	if !strings.Contains(out, "/app/db") || !strings.Contains(out, "replicas=3") {
		t.Fatalf("ls:\n%s", out)
	}
	n.mustCtl("state", "rm", "/app/web", "ratio")
	out = n.mustCtl("state", "get", "/app/web", "--meta")
	// Rows, not substrings: a stamp such as 02:57:10.542… contains "0.5".
	valueRow, tombstone := false, false
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == "ratio" {
			valueRow = valueRow || f[1] == "float"
			tombstone = tombstone || f[2] == "true"
		}
	}
	if valueRow || !tombstone {
		t.Fatalf("field delete (value gone, tombstone in meta):\n%s", out)
	}
	n.mustCtl("state", "rm", "/app/db")
	out = n.mustCtl("state", "ls", "/app/", "-o", "json")
	if strings.Contains(out, "/app/db") {
		t.Fatalf("deleted doc listed:\n%s", out)
	}
	// watch replays from a revision and prints JSON lines.
	stdout := n.follow("state", "watch", "/app/", "--after", "1", "-o", "json")
	waitUntil(t, func() bool { return strings.Count(stdout.String(), "\n") >= 3 })
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if !strings.Contains(lines[0], `"revision":2`) || !strings.Contains(lines[2], `"type":"DELETE"`) {
		t.Fatalf("watch output:\n%s", stdout)
	}
	// -o yaml is a stream of YAML documents, one per event.
	yout := n.follow("state", "watch", "/app/", "--after", "1", "-o", "yaml")
	waitUntil(t, func() bool {
		return strings.Count(yout.String(), "---\n") >= 3 && strings.Contains(yout.String(), "DELETE")
	})
	docs := strings.Split(yout.String(), "---\n")
	type event struct {
		Type     string `json:"type"`
		Revision uint64 `json:"revision"`
		Document struct {
			Key string `json:"key"`
		} `json:"document"`
	}
	var events []event
	for _, d := range docs[1:4] {
		var e event
		if err := yaml.Unmarshal([]byte(d), &e); err != nil {
			t.Fatalf("watch -o yaml document %q: %v", d, err)
		}
		events = append(events, e)
	}
	if docs[0] != "" || events[0].Revision != 2 || events[0].Type != "PUT" || events[2].Type != "DELETE" || events[2].Document.Key != "/app/db" {
		t.Fatalf("watch -o yaml: %+v\n%s", events, yout)
	}
}

func TestDaemonsServeHealthStatusAndStopCleanly(t *testing.T) {
	n := newNode(t)
	procs := map[string]*proc{}
	for _, d := range client.Daemons {
		procs[d] = n.start(d)
	}
	out := n.mustCtl("daemon", "status", "-o", "json")
	var rows []struct {
		Name      string `json:"name"`
		Reachable bool   `json:"reachable"`
		Version   string `json:"version"`
		Uptime    string `json:"uptime"`
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("daemon status -o json: %v\n%s", err, out)
	}
	for i, d := range client.Daemons {
		if i >= len(rows) || rows[i].Name != d || !rows[i].Reachable || rows[i].Version == "" {
			t.Fatalf("daemon status -o json: want %s reachable with a version:\n%s", d, out)
		}
		if up, err := time.ParseDuration(rows[i].Uptime); err != nil || up < 0 {
			t.Fatalf("daemon status -o json: %s uptime %q: %v", d, rows[i].Uptime, err)
		}
	}
	table := n.mustCtl("daemon", "status")
	if !strings.Contains(table, "VERSION") || !strings.Contains(table, "UPTIME") || !strings.Contains(table, rows[0].Version) {
		t.Fatalf("daemon status lacks version or uptime:\n%s", table)
	}
	for _, d := range client.Daemons {
		// Every socket is the daemon's own, group-accessible only, and
		// answers server reflection (so grpcurl works).
		sock := filepath.Join(n.runDir, d+".sock")
		if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o660 || fi.Mode().Type() != os.ModeSocket {
			t.Fatalf("%s: %v, mode %v; want a socket with mode 0660", sock, err, fi.Mode())
		}
		services := reflectServices(t, n.runDir, d)
		for _, want := range []string{"grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection", "shoal.daemon.v1.Daemon"} {
			if !slices.Contains(services, want) {
				t.Fatalf("%s reflection lists %v, lacks %s", d, services, want)
			}
		}
		if d == "statd" && !slices.Contains(services, "shoal.state.v1.State") {
			t.Fatalf("statd reflection lists %v, lacks shoal.state.v1.State", services)
		}
	}
	procs["vold"].stop(t)
	out = n.mustCtl("daemon", "status")
	if !strings.Contains(out, "vold    no") {
		t.Fatalf("stopped vold shown reachable:\n%s", out)
	}
	for d, p := range procs {
		if d == "vold" {
			continue
		}
		if err := p.stop(t); err != nil {
			t.Fatalf("%s exited with %v on SIGTERM; stderr:\n%s", d, err, p.stderr)
		}
		if _, err := os.Stat(filepath.Join(n.runDir, d+".sock")); !os.IsNotExist(err) {
			t.Fatalf("%s left its socket behind", d)
		}
	}
	// --help says what the daemon does and what it needs.
	help, _ := exec.Command(bin("shoal-vold"), "--help").CombinedOutput()
	if !strings.Contains(string(help), "replicated volumes") || !strings.Contains(string(help), "--replace-after") {
		t.Fatalf("vold --help:\n%s", help)
	}
}

// reflectServices lists the services a daemon's socket names through
// server reflection, and checks that the descriptor of each resolves.
func reflectServices(t *testing.T, runDir, daemon string) []string {
	t.Helper()
	conn, err := client.Dial(runDir, daemon, client.Retry{Attempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatalf("%s reflection: %v", daemon, err)
	}
	ask := func(req *reflectionpb.ServerReflectionRequest) *reflectionpb.ServerReflectionResponse {
		t.Helper()
		if err := stream.Send(req); err != nil {
			t.Fatalf("%s reflection: %v", daemon, err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("%s reflection: %v", daemon, err)
		}
		if e := resp.GetErrorResponse(); e != nil {
			t.Fatalf("%s reflection %v: %s", daemon, req, e.GetErrorMessage())
		}
		return resp
	}
	var names []string
	for _, s := range ask(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}).GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
		files := ask(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: s.GetName()}})
		if len(files.GetFileDescriptorResponse().GetFileDescriptorProto()) == 0 {
			t.Fatalf("%s reflection: no descriptor for %s", daemon, s.GetName())
		}
	}
	return names
}

func TestStrictConfig(t *testing.T) {
	n := newNode(t)
	os.MkdirAll(n.root, 0o755)
	os.WriteFile(filepath.Join(n.root, "statd.toml"), []byte("log_level = \"debug\"\nwatch_histroy = 5\n"), 0o600)
	p := n.spawn("statd", nil)
	<-p.exited
	if p.err == nil || !strings.Contains(p.stderr.String(), "watch_histroy") {
		t.Fatalf("unknown config key accepted: %v %q", p.err, p.stderr)
	}
	os.WriteFile(filepath.Join(n.root, "statd.toml"), []byte("watch_history = \"many\"\n"), 0o600)
	p = n.spawn("statd", nil)
	<-p.exited
	if p.err == nil || !strings.Contains(p.stderr.String(), "statd.toml") {
		t.Fatalf("mistyped config accepted: %v %q", p.err, p.stderr)
	}
	// A valid file is used, and flags win over it.
	os.WriteFile(filepath.Join(n.root, "statd.toml"), []byte("watch_history = 1234\nlog_level = \"debug\"\n"), 0o600)
	out, err := exec.Command(bin("shoal-statd"), "--config", filepath.Join(n.root, "statd.toml"), "--log-level", "warn", "--print-config").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "watch_history = 1234") || !strings.Contains(string(out), "log_level = 'warn'") {
		t.Fatalf("print-config: %v\n%s", err, out)
	}
}

// Under systemd the socket comes from socket activation and the daemon
// reports READY, WATCHDOG and STOPPING through NOTIFY_SOCKET.
func TestSocketActivationAndSdNotify(t *testing.T) {
	n := newNode(t)
	os.MkdirAll(n.runDir, 0o755)
	notifyPath := filepath.Join(n.root, "notify")
	notify, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notifyPath, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer notify.Close()
	msgs := make(chan string, 100)
	go func() {
		buf := make([]byte, 4096)
		for {
			k, err := notify.Read(buf)
			if err != nil {
				close(msgs)
				return
			}
			msgs <- string(buf[:k])
		}
	}()
	sock := filepath.Join(n.runDir, "statd.sock")
	cmd := exec.Command("systemd-socket-activate", "-l", sock,
		"-E", "NOTIFY_SOCKET="+notifyPath, "-E", "WATCHDOG_USEC=200000",
		bin("shoal-statd"), "--state-dir", n.stateDir, "--run-dir", n.runDir, "--metrics-addr", "")
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	waitUntil(t, func() bool { _, err := os.Stat(sock); return err == nil })
	// The first connection makes systemd-socket-activate exec statd with
	// the listening socket.
	c := n.statd()
	if _, err := put(context.Background(), c, "/act/x", "v", "1"); err != nil {
		t.Fatalf("put over activated socket: %v\n%s", err, stderr)
	}
	got := map[string]bool{}
	timeout := time.After(10 * time.Second)
	for !got["READY=1"] || !got["WATCHDOG=1"] {
		select {
		case m := <-msgs:
			got[m] = true
		case <-timeout:
			t.Fatalf("notifications so far: %v\n%s", got, stderr)
		}
	}
	if !strings.Contains(stderr.String(), "socket_activated=true") {
		t.Fatalf("statd did not use the activated socket:\n%s", stderr)
	}
	cmd.Process.Signal(os.Interrupt)
	for !got["STOPPING=1"] {
		select {
		case m, ok := <-msgs:
			if !ok {
				t.Fatal("notify socket closed")
			}
			got[m] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("no STOPPING=1: %v", got)
		}
	}
	cmd.Wait()
	// The activated socket belongs to systemd: statd must not delete it.
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("activated socket removed by statd: %v", err)
	}
}
