package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/shoal-dev/shoal/pkg/client"
	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/devcluster"
	"github.com/shoal-dev/shoal/pkg/hlc"
	"github.com/shoal-dev/shoal/pkg/pki"
	clusterv1 "github.com/shoal-dev/shoal/proto/shoal/cluster/v1"
	peerv1 "github.com/shoal-dev/shoal/proto/shoal/peer/v1"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

// devCluster starts an n-node cluster of statd daemons in network
// namespaces, bootstrapped with cluster init and join, and tears it down
// when the test ends.
func devCluster(t *testing.T, n int, statdArgs ...string) *devcluster.Cluster {
	t.Helper()
	name := fmt.Sprintf("e%d", rand.IntN(1_000_000))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := devcluster.Up(ctx, devcluster.Spec{
		Name:      name,
		Nodes:     n,
		Subnet:    devcluster.AutoSubnet,
		BinDir:    binDir,
		Daemons:   []string{"statd"},
		Args:      map[string][]string{"statd": append([]string{"--node-name", "n{node}"}, statdArgs...)},
		Bootstrap: true,
	})
	if err != nil {
		t.Fatalf("dev cluster up: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("SHOAL_E2E_LOGS") != "" {
			for i := 1; i <= n; i++ {
				if b, err := os.ReadFile(c.LogPath(i, "statd")); err == nil {
					lines := strings.Split(strings.TrimSpace(string(b)), "\n")
					t.Logf("node %d statd log:\n%s", i, strings.Join(lines[max(0, len(lines)-logTail):], "\n"))
				}
			}
		}
		if err := c.Down(context.Background()); err != nil {
			t.Errorf("dev cluster down: %v", err)
		}
	})
	return c
}

// nodeClient is a statd client of node i (its socket is a path on the
// shared file system, reachable from the host).
func nodeClient(t *testing.T, c *devcluster.Cluster, i int) *client.Statd {
	t.Helper()
	cl, err := client.NewStatd(c.RunDir(i), client.Retry{Attempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

func clusterStatus(t *testing.T, cl *client.Statd) *clusterv1.StatusResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := cl.Cluster.Status(ctx, &clusterv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func roots(t *testing.T, cls []*client.Statd) []string {
	var out []string
	for _, cl := range cls {
		out = append(out, clusterStatus(t, cl).GetRootHash())
	}
	return out
}

func allEqual(ss []string) bool {
	for _, s := range ss[1:] {
		if s != ss[0] {
			return false
		}
	}
	return true
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %v", what, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func getField(cl *client.Statd, key, field string) (string, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cl.Get(ctx, &statev1.GetRequest{Key: key})
	if err != nil {
		return "", false
	}
	v, ok := resp.GetDocument().GetFields()[field]
	return v.GetStringValue(), ok
}

func clients(t *testing.T, c *devcluster.Cluster) []*client.Statd {
	var out []*client.Statd
	for i := 1; i <= c.Nodes(); i++ {
		out = append(out, nodeClient(t, c, i))
	}
	return out
}

func memberState(t *testing.T, cl *client.Statd, id string) string {
	for _, m := range clusterStatus(t, cl).GetMembers() {
		if m.GetId() == id {
			return m.GetState()
		}
	}
	return "absent"
}

// One 5-node cluster runs the convergence, partition, restart and failure
// detection scenarios in turn, to keep the suite fast.
func TestFiveNodeCluster(t *testing.T) {
	c := devCluster(t, 5)
	cls := clients(t, c)
	ctx := context.Background()
	ids := make([]string, 5)
	for i, cl := range cls {
		ids[i] = clusterStatus(t, cl).GetNodeId()
	}

	t.Run("WriteAnywhereReadEverywhere", func(t *testing.T) {
		for i, cl := range cls {
			if _, err := put(ctx, cl, fmt.Sprintf("/conv/from-%d", i+1), "v", fmt.Sprint(i+1)); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, 15*time.Second, "every write on every node", func() bool {
			for _, cl := range cls {
				for i := range cls {
					if v, _ := getField(cl, fmt.Sprintf("/conv/from-%d", i+1), "v"); v != fmt.Sprint(i+1) {
						return false
					}
				}
			}
			return true
		})
		waitFor(t, 15*time.Second, "equal roots", func() bool { return allEqual(roots(t, cls)) })
		// Every member sees every other alive.
		for _, cl := range cls {
			for _, id := range ids {
				if s := memberState(t, cl, id); s != "alive" {
					t.Fatalf("member %s is %s", id, s)
				}
			}
		}
	})

	t.Run("SyncCountersInStatusAndMetrics", func(t *testing.T) {
		out, errOut, code, err := c.Ctl(ctx, 2, "cluster", "status", "-o", "json")
		if err != nil || code != 0 {
			t.Fatalf("cluster status: %v %d %s", err, code, errOut)
		}
		for _, want := range []string{`"bytes_sent"`, `"entries_received"`, `"rounds"`, `"rejected"`, `"last_sync"`, `"state": "alive"`} {
			if !strings.Contains(out, want) {
				t.Fatalf("cluster status -o json lacks %s:\n%s", want, out)
			}
		}
		// Node 2 received the writes of the other nodes above, so some peer
		// has sent it bytes and entries in completed rounds.
		var st struct {
			Members []struct {
				ID   string `json:"id"`
				Sync *struct {
					BytesSent       uint64 `json:"bytes_sent"`
					EntriesReceived uint64 `json:"entries_received"`
					Rounds          uint64 `json:"rounds"`
				} `json:"sync"`
			} `json:"members"`
		}
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("cluster status -o json: %v\n%s", err, out)
		}
		var sent, received, rounds uint64
		for _, m := range st.Members {
			if m.Sync != nil {
				sent, received, rounds = max(sent, m.Sync.BytesSent), max(received, m.Sync.EntriesReceived), max(rounds, m.Sync.Rounds)
			}
		}
		if sent == 0 || received == 0 || rounds == 0 {
			t.Fatalf("cluster status -o json: largest per-peer bytes_sent %d, entries_received %d, rounds %d; want all > 0:\n%s", sent, received, rounds, out)
		}
		metrics, _, code, err := c.Exec(ctx, 2, []string{"busybox", "wget", "-qO-", "http://127.0.0.1:9461/metrics"}, nil)
		if err != nil || code != 0 {
			t.Fatalf("metrics: %v %d", err, code)
		}
		for _, want := range []string{"shoal_statd_sync_rejected_total{peer=", "shoal_statd_documents "} {
			if !strings.Contains(metrics, want) {
				t.Fatalf("metrics lack %s", want)
			}
		}
		for _, name := range []string{"shoal_statd_sync_bytes_sent_total", "shoal_statd_sync_entries_received_total", "shoal_statd_sync_rounds_total"} {
			if v := maxPerPeer(metrics, name); v <= 0 {
				t.Fatalf("metrics: largest per-peer %s is %v, want > 0:\n%s", name, v, metrics)
			}
		}
	})

	t.Run("PartitionMergesOnHeal", func(t *testing.T) {
		if err := c.Partition(ctx, [][]int{{1, 2}, {3, 4, 5}}); err != nil {
			t.Fatal(err)
		}
		acked := map[string]string{}
		write := func(node int, key, field, val string) {
			t.Helper()
			if _, err := put(ctx, cls[node-1], key, field, val); err != nil {
				t.Fatalf("write on node %d during partition: %v", node, err)
			}
			acked[key+"#"+field] = val
		}
		write(1, "/part/same", "f", "left")
		write(2, "/part/fields", "left", "1")
		for i := range 20 {
			write(1+i%2, fmt.Sprintf("/part/l/%d", i), "v", "x")
			write(3+i%3, fmt.Sprintf("/part/r/%d", i), "v", "y")
		}
		time.Sleep(20 * time.Millisecond)
		write(4, "/part/same", "f", "right") // later: wins
		write(5, "/part/fields", "right", "2")
		time.Sleep(time.Second)
		if v, _ := getField(cls[0], "/part/same", "f"); v != "left" {
			t.Fatalf("node 1 saw the other side during the partition: %q", v)
		}
		if err := c.Heal(ctx); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "equal roots after heal", func() bool { return allEqual(roots(t, cls)) })
		for i, cl := range cls {
			if v, _ := getField(cl, "/part/same", "f"); v != "right" {
				t.Fatalf("node %d: same field = %q, want the later write", i+1, v)
			}
			l, okl := getField(cl, "/part/fields", "left")
			r, okr := getField(cl, "/part/fields", "right")
			if !okl || !okr || l != "1" || r != "2" {
				t.Fatalf("node %d: different fields did not both survive: left=%q right=%q", i+1, l, r)
			}
			for k, want := range acked {
				key, field, _ := strings.Cut(k, "#")
				if key == "/part/same" {
					continue
				}
				if got, _ := getField(cl, key, field); got != want {
					t.Fatalf("node %d lost acknowledged write %s = %s (has %q)", i+1, k, want, got)
				}
			}
		}
	})

	t.Run("KilledStatdCatchesUpAndWatchersSeeEverything", func(t *testing.T) {
		// A watcher on node 3 that survives its statd's restart.
		wctx, wcancel := context.WithCancel(ctx)
		defer wcancel()
		var mu sync.Mutex
		seen := map[string]int{}
		w := nodeClient(t, c, 3)
		go w.Watch(wctx, "/restart/", client.FromNow, func(resp *statev1.WatchResponse) error {
			mu.Lock()
			defer mu.Unlock()
			for _, e := range resp.GetEvents() {
				seen[e.GetDocument().GetKey()]++
			}
			return nil
		})
		time.Sleep(200 * time.Millisecond)
		if _, err := put(ctx, cls[0], "/restart/before", "v", "x"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "watcher sees the first write", func() bool { mu.Lock(); defer mu.Unlock(); return seen["/restart/before"] == 1 })
		if err := c.Kill(ctx, 3, "statd"); err != nil {
			t.Fatal(err)
		}
		for i := range 50 {
			if _, err := put(ctx, cls[i%2], fmt.Sprintf("/restart/k%02d", i), "v", "x"); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Start(ctx, 3, "statd"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "node 3 caught up", func() bool { return allEqual(roots(t, cls)) })
		waitFor(t, 10*time.Second, "watcher saw every change", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(seen) == 51
		})
		mu.Lock()
		defer mu.Unlock()
		for k, n := range seen {
			if n != 1 {
				t.Fatalf("watcher saw %s %d times", k, n)
			}
		}
	})

	t.Run("DeadNodeMarkedDeadEverywhereThenAliveAgain", func(t *testing.T) {
		if err := c.Kill(ctx, 5, ""); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		waitFor(t, 20*time.Second, "node 5 dead on all others", func() bool {
			for _, cl := range cls[:4] {
				if memberState(t, cl, ids[4]) != "dead" {
					return false
				}
			}
			return true
		})
		t.Logf("node 5 dead everywhere after %v", time.Since(start).Round(time.Millisecond))
		if err := c.Start(ctx, 5, ""); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 20*time.Second, "node 5 alive on all others", func() bool {
			for _, cl := range cls[:4] {
				if memberState(t, cl, ids[4]) != "alive" {
					return false
				}
			}
			return true
		})
	})

	t.Run("NodeLabelsSetAndRemovedSeenElsewhere", func(t *testing.T) {
		mustCtlOn(t, c, 1, "node", "label", "n2", "zone=eu", "disk=ssd")
		waitFor(t, 15*time.Second, "labels of n2 on node 4", func() bool {
			n := inspectNode(t, c, 4, "n2")
			return n.Labels["zone"] == "eu" && n.Labels["disk"] == "ssd"
		})
		mustCtlOn(t, c, 3, "node", "label", "n2", "--rm", "disk")
		waitFor(t, 15*time.Second, "label disk of n2 removed on node 4", func() bool {
			n := inspectNode(t, c, 4, "n2")
			_, has := n.Labels["disk"]
			return !has && n.Labels["zone"] == "eu"
		})
		if n := inspectNode(t, c, 4, "n2"); n.ID != ids[1] || len(n.Labels) != 1 {
			t.Fatalf("node inspect n2 on node 4: %+v, want node %s with only zone=eu", n, ids[1])
		}
	})

	// Last: node 5 leaves for good.
	t.Run("LeaveMarksNodeLeftEverywhere", func(t *testing.T) {
		mustCtlOn(t, c, 5, "cluster", "leave")
		if st := clusterStatus(t, cls[4]); st.GetInitialized() {
			t.Fatalf("node 5 still in cluster %q after leave", st.GetClusterName())
		}
		waitFor(t, 20*time.Second, "node 5 left on all others", func() bool {
			for _, cl := range cls[:4] {
				if memberState(t, cl, ids[4]) != "left" {
					return false
				}
			}
			return true
		})
		waitFor(t, 15*time.Second, "node 5's document says left on all others", func() bool {
			for i := range 4 {
				if n := inspectNode(t, c, i+1, ids[4]); !n.Left || n.State != "left" {
					return false
				}
			}
			return true
		})
		// The others stop syncing with it: its counters stay still while
		// the remaining four keep converging.
		sync5 := func() []string {
			var out []string
			for _, cl := range cls[:4] {
				for _, m := range clusterStatus(t, cl).GetMembers() {
					if m.GetId() == ids[4] {
						s := m.GetSync()
						out = append(out, fmt.Sprintf("rounds=%d sent=%d/%d error=%q", s.GetRounds(), s.GetBytesSent(), s.GetEntriesSent(), s.GetLastError()))
					}
				}
			}
			return out
		}
		time.Sleep(time.Second) // calls begun before the news arrived
		before := sync5()
		for i := range 4 {
			if _, err := put(ctx, cls[i], fmt.Sprintf("/left/from-%d", i+1), "v", "x"); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, 15*time.Second, "equal roots among the four", func() bool { return allEqual(roots(t, cls[:4])) })
		time.Sleep(3 * time.Second) // a few anti-entropy rounds
		if after := sync5(); !slices.Equal(before, after) {
			t.Fatalf("the others still sync with the node that left:\nbefore %v\nafter  %v", before, after)
		}
		for _, cl := range cls[:4] {
			for _, m := range clusterStatus(t, cl).GetMembers() {
				if m.GetId() != ids[4] && m.GetState() != "alive" {
					t.Fatalf("member %s is %s after node 5 left", m.GetId(), m.GetState())
				}
			}
		}
	})
}

// peerConn dials a node's peer port with the given TLS config.
func peerConn(t *testing.T, c *devcluster.Cluster, i int, cfg *tls.Config) peerv1.PeerClient {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+net.JoinHostPort(c.Addr(i), "7470"), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return peerv1.NewPeerClient(conn)
}

func TestJoinSecurityAndHostileInput(t *testing.T) {
	c := devCluster(t, 2)
	ctx := context.Background()
	tok, _, code, err := c.Ctl(ctx, 1, "cluster", "token")
	if err != nil || code != 0 {
		t.Fatalf("token: %v %d", err, code)
	}
	token := strings.TrimSpace(tok)
	parsed, err := pki.ParseToken(token)
	if err != nil {
		t.Fatal(err)
	}
	// A third, fresh statd that tries to join in various wrong ways: run
	// it as an extra daemon of node 2's namespace would collide; use a
	// standalone one in the host namespace instead (it reaches node 1).
	outsider := newNode(t)
	outsider.start("statd", "--peer-port", "17999")
	addr1 := c.Addr(1)

	t.Run("WrongToken", func(t *testing.T) {
		bad := pki.Token{Fingerprint: parsed.Fingerprint, Secret: strings.Repeat("a", len(parsed.Secret))}
		_, errOut, code := outsider.ctl("cluster", "join", "--token", bad.String(), "--advertise", "127.0.0.1", addr1)
		if code == 0 || !strings.Contains(errOut, "invalid or has been rotated") {
			t.Fatalf("join with a wrong secret: exit %d %q", code, errOut)
		}
	})
	t.Run("RotatedToken", func(t *testing.T) {
		if _, _, code, _ := c.Ctl(ctx, 1, "cluster", "token", "--rotate"); code != 0 {
			t.Fatal("rotate failed")
		}
		// The rotated token reaches node 2 by gossip; the old one is then
		// refused by every member. Each node is tried only once it holds
		// the new token's hash: a node that still had the old one would let
		// the outsider in.
		rotated, ok := getField(nodeClient(t, c, 1), "/cluster/join", "token_hash")
		if !ok {
			t.Fatal("node 1 has no join token hash after rotating")
		}
		for _, i := range []int{1, 2} {
			cl := nodeClient(t, c, i)
			waitFor(t, 10*time.Second, fmt.Sprintf("the rotated token on node %d", i), func() bool {
				h, _ := getField(cl, "/cluster/join", "token_hash")
				return h == rotated
			})
			_, errOut, code := outsider.ctl("cluster", "join", "--token", token, "--advertise", "127.0.0.1", c.Addr(i))
			if code == 0 || !strings.Contains(errOut, "invalid or has been rotated") {
				t.Fatalf("join through node %d with the rotated-out token: exit %d %q", i, code, errOut)
			}
		}
	})
	t.Run("WrongCA", func(t *testing.T) {
		other, _ := pki.NewCA("other", time.Hour, time.Now())
		fake, _ := pki.NewToken(other)
		_, errOut, code := outsider.ctl("cluster", "join", "--token", fake.String(), "--advertise", "127.0.0.1", addr1)
		if code == 0 || !strings.Contains(errOut, "does not match the token") {
			t.Fatalf("join with another cluster's fingerprint: exit %d %q", code, errOut)
		}
	})
	t.Run("MalformedToken", func(t *testing.T) {
		_, errOut, code := outsider.ctl("cluster", "join", "--token", "SHOAL-1-nope", addr1)
		if code != 2 || !strings.Contains(errOut, "malformed join token") {
			t.Fatalf("malformed token: exit %d %q", code, errOut)
		}
	})
	t.Run("CertificateFromAnotherCluster", func(t *testing.T) {
		other, _ := pki.NewCA("other", time.Hour, time.Now())
		id, _ := other.NewIdentity("intruder", []net.IP{net.ParseIP("127.0.0.1")}, time.Hour, time.Now())
		cfg := pki.ClientConfig(func() *pki.Identity { return id }, other.Pool, "")
		cfg.InsecureSkipVerify, cfg.VerifyConnection = true, nil // even if the client trusted the server
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := peerConn(t, c, 1, cfg).Root(cctx, &peerv1.RootRequest{Root: make([]byte, 32)})
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("foreign certificate accepted: %v", err)
		}
		// On the TLS level the refusal is explicit: in TLS 1.3 the
		// server's alert arrives at the client's first read.
		cfg.NextProtos = []string{"h2"}
		conn, err := tls.Dial("tcp", net.JoinHostPort(addr1, "7470"), cfg)
		if err == nil {
			conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err = conn.Read(make([]byte, 1))
			conn.Close()
		}
		if err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Fatalf("foreign certificate: want a certificate alert, got %v", err)
		}
	})
	t.Run("UnauthenticatedTLSGetsNothing", func(t *testing.T) {
		cfg, err := pki.JoinClientConfig(parsed.Fingerprint)
		if err != nil {
			t.Fatal(err)
		}
		p := peerConn(t, c, 1, cfg)
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if _, err := p.Root(cctx, &peerv1.RootRequest{Root: make([]byte, 32)}); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("Root without a certificate: %v", err)
		}
		if _, err := p.GetDocs(cctx, &peerv1.GetDocsRequest{Keys: []string{"/cluster/config"}}); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("GetDocs without a certificate: %v", err)
		}
		if _, err := p.Join(cctx, &peerv1.JoinRequest{TokenSecret: "x"}); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("Join with a bad secret: %v", err)
		}
	})
	t.Run("PlainTCPGetsNothing", func(t *testing.T) {
		conn, err := net.DialTimeout("tcp", net.JoinHostPort(addr1, "7470"), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, _ := io.ReadAll(conn)
		if strings.Contains(string(b), "HTTP") || strings.Contains(string(b), "shoal") {
			t.Fatalf("plain TCP got a readable answer: %q", b)
		}
	})

	// A member's identity for the hostile-input checks: join as a fake
	// node through the API, as a real joiner would.
	cur, _, _, _ := c.Ctl(ctx, 1, "cluster", "token")
	curTok, _ := pki.ParseToken(strings.TrimSpace(cur))
	key, _ := pki.NewNodeKey()
	pub, _ := pki.MarshalPublicKey(key.Public())
	jcfg, _ := pki.JoinClientConfig(curTok.Fingerprint)
	jresp, err := peerConn(t, c, 1, jcfg).Join(ctx, &peerv1.JoinRequest{
		TokenSecret: curTok.Secret, NodeId: "hostile", PublicKey: pub, AdvertiseAddr: c.BridgeAddr(), PeerPort: 1,
	})
	if err != nil {
		t.Fatalf("join as a test peer: %v", err)
	}
	keyPEM, _ := pki.EncodeKeyPEM(key)
	id, err := pki.LoadIdentity(jresp.GetNodeCertPem(), keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := pki.LoadCA(jresp.GetCaCertPem(), jresp.GetCaKeyPem())
	member := peerConn(t, c, 1, pki.ClientConfig(func() *pki.Identity { return id }, ca.Pool, ""))
	cl1 := nodeClient(t, c, 1)

	t.Run("SkewedTimestampsRejectedAndCounted", func(t *testing.T) {
		before := clusterStatus(t, cl1).GetCounters()["skew_rejected"]
		future := crdt.Set(map[string]crdt.Value{"v": crdt.String("from the future")},
			crdt.Stamp{TS: hlc.Timestamp{Wall: time.Now().Add(time.Minute).UnixNano()}, Node: "hostile"})
		resp, err := member.Push(ctx, &peerv1.PushRequest{Docs: []*peerv1.Doc{{Key: "/skew/x", Data: future.Marshal()}}})
		if err != nil || resp.GetRejected() != 1 {
			t.Fatalf("push from the future: %v %v", resp, err)
		}
		if after := clusterStatus(t, cl1).GetCounters()["skew_rejected"]; after != before+1 {
			t.Fatalf("skew_rejected %d -> %d", before, after)
		}
		if _, ok := getField(cl1, "/skew/x", "v"); ok {
			t.Fatal("skewed document was stored")
		}
		var rejected uint64
		for _, m := range clusterStatus(t, cl1).GetMembers() {
			if m.GetId() == "hostile" {
				rejected = m.GetSync().GetRejected()
			}
		}
		if rejected == 0 {
			t.Fatal("rejection not counted against the peer")
		}
	})
	t.Run("MalformedSyncMessagesRejected", func(t *testing.T) {
		resp, err := member.Push(ctx, &peerv1.PushRequest{Docs: []*peerv1.Doc{
			{Key: "/bad/1", Data: []byte{0xff, 0x00, 0x13}},
			{Key: "relative", Data: crdt.Doc{}.Marshal()},
		}, Updates: []*peerv1.Member{{Id: "bad id!", Addr: "nope", State: 99}}})
		if err != nil || resp.GetRejected() != 2 {
			t.Fatalf("malformed push: %v %v", resp, err)
		}
		if _, err := member.GetNodes(ctx, &peerv1.GetNodesRequest{Hashes: [][]byte{{1, 2, 3}}}); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("short hash: %v", err)
		}
		if _, err := member.PullFrom(ctx, &peerv1.PullFromRequest{Root: []byte("short")}); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("short root: %v", err)
		}
		// Still healthy and converging.
		if _, err := put(ctx, cl1, "/bad/after", "v", "ok"); err != nil {
			t.Fatal(err)
		}
		cl2 := nodeClient(t, c, 2)
		waitFor(t, 10*time.Second, "write after hostile input reaches node 2", func() bool {
			v, _ := getField(cl2, "/bad/after", "v")
			return v == "ok"
		})
	})
}

// Tombstones are collected after the retention window, and a node that was
// partitioned for longer does not bring a deleted document back. Node
// certificates (short-lived here) rotate meanwhile without restarts.
func TestTombstoneGCAndCertRotation(t *testing.T) {
	c := devCluster(t, 3, "--tombstone-retention", "5s", "--cert-validity", "9s")
	cls := clients(t, c)
	ctx := context.Background()
	if _, err := put(ctx, cls[0], "/gc/doomed", "v", "x"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "doc everywhere", func() bool {
		for _, cl := range cls {
			if _, ok := getField(cl, "/gc/doomed", "v"); !ok {
				return false
			}
		}
		return true
	})
	certBefore := clusterStatus(t, cls[1]).GetCertNotAfter().AsTime()
	if err := c.Partition(ctx, [][]int{{1, 2}, {3}}); err != nil {
		t.Fatal(err)
	}
	if _, err := cls[0].Delete(ctx, &statev1.DeleteRequest{Key: "/gc/doomed"}); err != nil {
		t.Fatal(err)
	}
	tombstones := func(cl *client.Statd) uint64 {
		st, err := cl.Status(ctx, &statev1.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return st.GetTombstones()
	}
	waitFor(t, 10*time.Second, "tombstone on node 2", func() bool { return tombstones(cls[1]) == 1 })
	waitFor(t, 20*time.Second, "tombstones collected on nodes 1 and 2", func() bool {
		return tombstones(cls[0]) == 0 && tombstones(cls[1]) == 0
	})
	time.Sleep(6 * time.Second) // node 3 is now out of sync for longer than the retention
	if _, ok := getField(cls[2], "/gc/doomed", "v"); !ok {
		t.Fatal("node 3 lost the document while partitioned")
	}
	if err := c.Heal(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "equal roots after heal", func() bool { return allEqual(roots(t, cls)) })
	for i, cl := range cls {
		if v, ok := getField(cl, "/gc/doomed", "v"); ok {
			t.Fatalf("node %d: deleted document came back: %q", i+1, v)
		}
	}
	// The certificates rotated (validity 9s) while the cluster kept working.
	if after := clusterStatus(t, cls[1]).GetCertNotAfter().AsTime(); !after.After(certBefore) {
		t.Fatalf("node 2's certificate did not rotate: %v then %v", certBefore, after)
	}
	if _, err := put(ctx, cls[1], "/gc/after-rotation", "v", "ok"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "write after rotation reaches node 3", func() bool {
		v, _ := getField(cls[2], "/gc/after-rotation", "v")
		return v == "ok"
	})
}

// mustCtlOn runs shoalctl on node i and returns its output; it fails the
// test unless the command succeeds.
func mustCtlOn(t *testing.T, c *devcluster.Cluster, i int, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, errOut, code, err := c.Ctl(ctx, i, args...)
	if err != nil || code != 0 {
		t.Fatalf("node %d: shoalctl %s: exit %d %v\n%s%s", i, strings.Join(args, " "), code, err, out, errOut)
	}
	return out
}

// inspectNode runs `node inspect REF -o json` on node i.
func inspectNode(t *testing.T, c *devcluster.Cluster, i int, ref string) nodeJSON {
	t.Helper()
	var n nodeJSON
	if err := json.Unmarshal([]byte(mustCtlOn(t, c, i, "node", "inspect", ref, "-o", "json")), &n); err != nil {
		t.Fatalf("node inspect %s -o json on node %d: %v", ref, i, err)
	}
	return n
}

// nodeJSON is what `node inspect -o json` prints.
type nodeJSON struct {
	ID     string            `json:"id"`
	Name   string            `json:"name"`
	State  string            `json:"state"`
	Labels map[string]string `json:"labels"`
	Left   bool              `json:"left"`
}

// maxPerPeer returns the largest value of the Prometheus counter name over
// its peer label in a /metrics text exposition, or -1 if there is none.
func maxPerPeer(metrics, name string) float64 {
	best := -1.0
	for _, line := range strings.Split(metrics, "\n") {
		rest, ok := strings.CutPrefix(line, name+"{peer=")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil && v > best {
			best = v
		}
	}
	return best
}

// logTail is how many lines of each node's log a failed test prints.
var logTail = 60
