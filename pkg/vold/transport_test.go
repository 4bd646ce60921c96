package vold

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/shoal-dev/shoal/pkg/pki"
	"github.com/shoal-dev/shoal/pkg/raftgroup"
	"github.com/shoal-dev/shoal/pkg/raftgroup/raftgrouptest"
	volv1 "github.com/shoal-dev/shoal/proto/shoal/vol/v1"
)

// testPeer is one node of an in-process cluster: a peer port on loopback
// (Raft connections and VolPeer) with a real certificate, a transport and
// a Raft host.
type testPeer struct {
	id    string
	rid   raftgroup.NodeID
	ident *pki.Identity
	ca    *pki.CA
	addr  string
	srv   *grpc.Server
	trans *transport
	pool  *peerPool
	host  *raftgroup.Host
	sms   sync.Map // raftgroup.GroupID -> raftgroup.StateMachine (a *raftgrouptest.KV by default)
	// restartServer stops the peer's server, closing its connections, and
	// serves again on the same address.
	restartServer func() error
	// tap, when set, gets the batches the peer receives instead of its
	// host.
	tap atomic.Pointer[func(from raftgroup.NodeID, b *raftgroup.Batch)]
}

// clusterOpts vary startClusterWith's nodes; zero fields take the
// defaults of startCluster.
type clusterOpts struct {
	// dir returns a node's Pebble directory on the OS filesystem (default:
	// an in-memory filesystem).
	dir func() string
	// newSM returns a group's state machine (default raftgrouptest.KV).
	newSM func() raftgroup.StateMachine
	// tick is the hosts' tick (default 10ms).
	tick time.Duration
	// forward, when set, returns what serves a peer's forwarded requests
	// (default: an answer naming the caller's node).
	forward func(p *testPeer) func(context.Context, string, *volv1.ForwardRequest) (*volv1.ForwardResponse, error)
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func newTestCA(t testing.TB) *pki.CA {
	t.Helper()
	ca, err := pki.NewCA("test", 24*time.Hour, time.Now())
	if err != nil {
		t.Fatalf("NewCA: %v", err)
	}
	return ca
}

func newTestIdentity(t testing.TB, ca *pki.CA, id string) *pki.Identity {
	t.Helper()
	ident, err := ca.NewIdentity(id, []net.IP{net.ParseIP("127.0.0.1")}, time.Hour, time.Now())
	if err != nil {
		t.Fatalf("NewIdentity(%s): %v", id, err)
	}
	return ident
}

// startCluster starts one peer per ID; they find each other's addresses
// through addrs.
func startCluster(t testing.TB, ids ...string) []*testPeer {
	t.Helper()
	return startClusterWith(t, clusterOpts{}, ids...)
}

func startClusterWith(t testing.TB, o clusterOpts, ids ...string) []*testPeer {
	t.Helper()
	if o.newSM == nil {
		o.newSM = func() raftgroup.StateMachine { return raftgrouptest.NewKV() }
	}
	if o.tick == 0 {
		o.tick = 10 * time.Millisecond
	}
	ca := newTestCA(t)
	pool := ca.Pool()
	names := newNodeNames()
	var mu sync.Mutex
	addrs := map[string]string{}
	addrOf := func(node string) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		a, ok := addrs[node]
		if !ok {
			return "", io.ErrUnexpectedEOF
		}
		return a, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	var peers []*testPeer
	for _, id := range ids {
		p := &testPeer{id: id, ident: newTestIdentity(t, ca, id), ca: ca}
		rid, err := names.add(id)
		if err != nil {
			t.Fatal(err)
		}
		p.rid = rid
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p.addr = lis.Addr().String()
		mu.Lock()
		addrs[id] = p.addr
		mu.Unlock()
		getID := func() *pki.Identity { return p.ident }
		getCA := func() *x509.CertPool { return pool }
		p.pool = newPeerPool(getID, getCA, addrOf)
		p.trans = newTransport(testLogger(t), p.pool.raftDialer(names))
		cfg := raftgroup.Config{
			NodeID:    rid,
			FS:        vfs.NewMem(),
			Dir:       "/raft",
			Transport: p.trans,
			NewStateMachine: func(g raftgroup.GroupID) raftgroup.StateMachine {
				sm := o.newSM()
				p.sms.Store(g, sm)
				return sm
			},
			TickInterval: o.tick,
		}
		if o.dir != nil {
			cfg.FS, cfg.Dir = nil, o.dir()
		}
		h, err := raftgroup.Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		p.host = h
		svc := &peerServer{log: testLogger(t), names: names, deliver: func(from raftgroup.NodeID, b *raftgroup.Batch) bool {
			if tap := p.tap.Load(); tap != nil {
				(*tap)(from, b)
				return true
			}
			h.Deliver(from, b)
			return true
		}}
		// Forward answers with the caller's node, as the certificate says.
		svc.forward = func(_ context.Context, from string, _ *volv1.ForwardRequest) (*volv1.ForwardResponse, error) {
			return &volv1.ForwardResponse{Payload: []byte(from)}, nil
		}
		if o.forward != nil {
			svc.forward = o.forward(p)
		}
		p.srv = newPeerGRPC(testLogger(t), svc)
		go p.srv.Serve(svc.peerListener(lis, getID, getCA))
		p.restartServer = func() error {
			p.srv.Stop() // closes every connection
			lis, err := net.Listen("tcp", p.addr)
			if err != nil {
				return err
			}
			p.srv = newPeerGRPC(testLogger(t), svc)
			go p.srv.Serve(svc.peerListener(lis, getID, getCA))
			return nil
		}
		go h.Run(ctx)
		peers = append(peers, p)
	}
	t.Cleanup(func() {
		cancel()
		for _, p := range peers {
			p.srv.Stop()
			p.trans.Close()
			p.host.Close()
			p.pool.Close()
		}
	})
	return peers
}

func TestTransportReplicatesOverMutualTLS(t *testing.T) {
	peers := startCluster(t, "c905aab72d29", "0a1b2c3d4e5f", "ffee01")
	const g = raftgroup.GroupID(7)
	var members []raftgroup.Member
	for i, p := range peers {
		members = append(members, raftgroup.Member{Replica: raftgroup.ReplicaID(i + 1), Node: p.rid})
	}
	for i, p := range peers {
		if err := p.host.CreateGroup(g, raftgroup.ReplicaID(i+1), members); err != nil {
			t.Fatalf("CreateGroup on %s: %v", p.id, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 20 {
		op := raftgrouptest.KVOp{Op: "put", Key: "k", Value: string(rune('a' + i))}
		p := peers[i%len(peers)]
		if _, err := p.host.Submit(g, raftgroup.Proposal{Data: op.Encode(), WaitQuorum: true}).Wait(ctx); err != nil {
			t.Fatalf("put %d through %s: %v", i, p.id, err)
		}
	}
	// Every replica converges on the last write.
	deadline := time.Now().Add(10 * time.Second)
	for _, p := range peers {
		for {
			v, _ := p.sms.Load(g)
			if v != nil && v.(*raftgrouptest.KV).Get("k") == "t" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s did not converge: k=%q", p.id, v.(*raftgrouptest.KV).Get("k"))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if peers[0].trans.sentBatches.Load() == 0 {
		t.Fatalf("no batches counted as sent")
	}
	// Forward shares the port, over gRPC, and knows its caller.
	c, err := peers[0].pool.client(peers[1].id)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Forward(ctx, &volv1.ForwardRequest{Kind: kindStatus})
	if err != nil || string(resp.GetPayload()) != peers[0].id {
		t.Fatalf("Forward from %s: %q, %v", peers[0].id, resp.GetPayload(), err)
	}
}

func TestPeerRejectsCallersWithoutClusterCertificate(t *testing.T) {
	peers := startCluster(t, "a1")
	var delivered atomic.Int32
	peers[0].tapBatches(func(raftgroup.NodeID, *raftgroup.Batch) { delivered.Add(1) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// TLS without a client certificate: the handshake passes (joining
	// nodes have none), the RPC layer refuses.
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true}
	conn, err := grpc.NewClient("passthrough:///"+peers[0].addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = volv1.NewVolPeerClient(conn).Forward(ctx, &volv1.ForwardRequest{Kind: kindStatus})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("call without a certificate: got %v, want UNAUTHENTICATED", err)
	}

	// A Raft connection without a client certificate is closed unread.
	rc, err := tls.Dial("tcp", peers[0].addr, &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true, NextProtos: []string{raftProto}})
	if err != nil {
		t.Fatalf("raft handshake without a certificate: %v", err)
	}
	if p := rc.ConnectionState().NegotiatedProtocol; p != raftProto {
		t.Fatalf("negotiated %q, want %q", p, raftProto)
	}
	_, _ = rc.Write(testFrame(t, &raftgroup.Batch{From: 0xb2, AckQueries: []raftgroup.GroupID{1}}))
	requireClosed(t, rc)

	// A certificate from another cluster's CA fails the handshake, for
	// gRPC and for Raft.
	other := newTestCA(t)
	stranger := newTestIdentity(t, other, "b2")
	scfg := pki.ClientConfig(func() *pki.Identity { return stranger }, func() *x509.CertPool { return other.Pool() }, "")
	scfg.VerifyConnection = nil
	sconn, err := grpc.NewClient("passthrough:///"+peers[0].addr, grpc.WithTransportCredentials(credentials.NewTLS(scfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer sconn.Close()
	if _, err := volv1.NewVolPeerClient(sconn).Forward(ctx, &volv1.ForwardRequest{Kind: kindStatus}); err == nil {
		t.Fatalf("call with a foreign certificate was accepted")
	}
	rcfg := scfg.Clone()
	rcfg.NextProtos = []string{raftProto}
	if rc, err := tls.Dial("tcp", peers[0].addr, rcfg); err == nil {
		// In TLS 1.3 the client finishes first; the server's refusal
		// comes with the first read.
		_, _ = rc.Write(testFrame(t, &raftgroup.Batch{From: 0xb2, AckQueries: []raftgroup.GroupID{1}}))
		requireClosed(t, rc)
	}

	// Plain text is refused too.
	pconn, err := grpc.NewClient("passthrough:///"+peers[0].addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer pconn.Close()
	if _, err := volv1.NewVolPeerClient(pconn).Forward(ctx, &volv1.ForwardRequest{}); err == nil {
		t.Fatalf("plain-text call was accepted")
	}
	if n := delivered.Load(); n != 0 {
		t.Fatalf("%d batches from callers without a cluster certificate were delivered", n)
	}
}

// tapBatches routes the batches p receives to fn instead of its host.
func (p *testPeer) tapBatches(fn func(from raftgroup.NodeID, b *raftgroup.Batch)) {
	p.tap.Store(&fn)
}

// testFrame is b as the transport frames it.
func testFrame(t testing.TB, b *raftgroup.Batch) []byte {
	t.Helper()
	out, err := b.AppendMarshal([]byte{0, 0, 0, 0})
	if err != nil {
		t.Fatal(err)
	}
	binary.BigEndian.PutUint32(out, uint32(len(out)-4))
	return out
}

// requireClosed fails unless the other end closes c (reading ends in an
// error other than a timeout).
func requireClosed(t testing.TB, c net.Conn) {
	t.Helper()
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("connection left open: read returned %v", err)
	}
}

func TestSendNeverBlocksAndReportsUnreachable(t *testing.T) {
	// A port nothing listens on.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	lis.Close()
	ca := newTestCA(t)
	ident := newTestIdentity(t, ca, "a1")
	pool := newPeerPool(func() *pki.Identity { return ident }, ca.Pool, func(string) (string, error) { return dead, nil })
	defer pool.Close()
	tr := newTransport(testLogger(t), pool.raftDialer(newNodeNames()))
	defer tr.Close()
	failed := false
	deadline := time.Now().Add(10 * time.Second)
	for !failed && time.Now().Before(deadline) {
		start := time.Now()
		err := tr.Send(0xb2, &raftgroup.Batch{From: 0xa1})
		if d := time.Since(start); d > 50*time.Millisecond {
			t.Fatalf("Send blocked for %s", d)
		}
		failed = err != nil
		time.Sleep(5 * time.Millisecond)
	}
	if !failed {
		t.Fatalf("Send to an unreachable node never failed")
	}
}

func TestLargeAndCoalescedBatchesArriveIntact(t *testing.T) {
	peers := startCluster(t, "a1", "b2")
	var mu sync.Mutex
	var snaps [][]byte
	var acks []uint64
	peers[1].tapBatches(func(from raftgroup.NodeID, b *raftgroup.Batch) {
		if from != peers[0].rid || b.From != from {
			t.Errorf("batch from %x (claims %x), want %x", from, b.From, peers[0].rid)
		}
		mu.Lock()
		defer mu.Unlock()
		for _, m := range b.Messages {
			if m.Msg.GetType() == pb.MsgSnap {
				snaps = append(snaps, m.Msg.GetSnapshot().GetData())
			}
		}
		for _, a := range b.Acks {
			acks = append(acks, a.Applied)
		}
	})

	// Larger than any old chunk, and than a gRPC message could be.
	snap := make([]byte, 20<<20)
	for i := range snap {
		snap[i] = byte(i * 7 / 5)
	}
	typ := pb.MsgSnap
	big := &raftgroup.Batch{From: peers[0].rid, Messages: []raftgroup.GroupMessage{{Group: 3, Msg: &pb.Message{
		Type:     &typ,
		To:       new(uint64),
		Snapshot: &pb.Snapshot{Data: snap, Metadata: &pb.SnapshotMetadata{}},
	}}}}
	if err := peers[0].trans.Send(peers[1].rid, big); err != nil {
		t.Fatal(err)
	}
	// Queued faster than the lane connects, so they go out together.
	const small = 100
	for i := range small {
		b := &raftgroup.Batch{From: peers[0].rid, Acks: []raftgroup.ApplyAck{{Group: 5, Replica: 1, Applied: uint64(i + 1)}}}
		if err := peers[0].trans.Send(peers[1].rid, b); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}

	deadline := time.Now().Add(20 * time.Second)
	for {
		mu.Lock()
		done := len(snaps) >= 1 && len(acks) >= small
		mu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("received %d snapshots and %d small batches, want 1 and %d", len(snaps), len(acks), small)
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(snaps) != 1 || !bytes.Equal(snaps[0], snap) {
		t.Fatalf("snapshot differs from the one sent (%d received)", len(snaps))
	}
	for i, a := range acks {
		if a != uint64(i+1) {
			t.Fatalf("small batches out of order: %v", acks)
		}
	}
	if len(acks) != small {
		t.Fatalf("received %d small batches, want %d", len(acks), small)
	}
}

// numbered sends numbered batches from peers[0] to peers[1] (the number
// rides in an ApplyAck) and records the numbers peers[1] receives.
type numbered struct {
	from, to *testPeer
	mu       sync.Mutex
	got      []uint64
}

func newNumbered(from, to *testPeer) *numbered {
	n := &numbered{from: from, to: to}
	to.tapBatches(func(_ raftgroup.NodeID, b *raftgroup.Batch) {
		n.mu.Lock()
		defer n.mu.Unlock()
		for _, a := range b.Acks {
			n.got = append(n.got, a.Applied)
		}
	})
	return n
}

func (n *numbered) send(i int) error {
	return n.from.trans.Send(n.to.rid, &raftgroup.Batch{From: n.from.rid, Acks: []raftgroup.ApplyAck{{Group: 5, Replica: 1, Applied: uint64(i)}}})
}

// received returns the numbers received so far, in order of arrival.
func (n *numbered) received() []uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.got)
}

// wait waits until k numbers arrived.
func (n *numbered) wait(t *testing.T, k int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); len(n.received()) < k; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("received %d batches, want %d", len(n.received()), k)
		}
	}
}

// TestSendWritesHereInOrder: once a lane is connected and idle, Send
// writes a small batch itself; while the lane's goroutine has batches to
// write, Send queues behind them; either way batches arrive in order.
func TestSendWritesHereInOrder(t *testing.T) {
	peers := startCluster(t, "a1", "b2")
	n := newNumbered(peers[0], peers[1])
	send := func(i int) {
		t.Helper()
		if err := n.send(i); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	tr := peers[0].trans
	send(1) // connects the lane
	n.wait(t, 1)
	here := tr.sentHere.Load()
	send(2)
	if tr.sentHere.Load() != here+1 {
		t.Fatalf("a batch to an idle, connected lane went through its queue")
	}
	// The lane busy writing (its lock held): Send queues, and goes on
	// queueing while anything is queued.
	p, _ := tr.peer(peers[1].rid)
	p.normal.mu.Lock()
	for i := 3; i <= 50; i++ {
		send(i)
	}
	p.normal.mu.Unlock()
	for i := 51; i <= 100; i++ {
		send(i)
	}
	n.wait(t, 100)
	got := n.received()
	for i, a := range got {
		if a != uint64(i+1) {
			t.Fatalf("batches out of order: %v", got)
		}
	}
	if len(got) != 100 {
		t.Fatalf("received %d batches, want 100", len(got))
	}
}

// TestLaneReconnectsAfterThePeerRestarts: a connection the peer closed
// fails the write Send makes itself, and the lane then connects again, so
// batches flow once the peer is back.
func TestLaneReconnectsAfterThePeerRestarts(t *testing.T) {
	peers := startCluster(t, "a1", "b2")
	n := newNumbered(peers[0], peers[1])
	for i := 1; i <= 2; i++ { // the second one written by Send itself
		if err := n.send(i); err != nil {
			t.Fatal(err)
		}
		n.wait(t, i)
	}
	if err := peers[1].restartServer(); err != nil {
		t.Fatal(err)
	}
	// Sends fail for a while (the old connection is broken, then the lane
	// backs off); one must arrive within a few backoffs.
	for i, deadline := 3, time.Now().Add(15*time.Second); len(n.received()) <= 2; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("no batch arrived after the peer restarted (%d sends)", i-3)
		}
		_ = n.send(i)
		time.Sleep(20 * time.Millisecond)
	}
}

func TestMalformedFrameClosesOnlyItsConnection(t *testing.T) {
	peers := startCluster(t, "a1")
	var mu sync.Mutex
	var got []raftgroup.NodeID
	peers[0].tapBatches(func(from raftgroup.NodeID, b *raftgroup.Batch) {
		mu.Lock()
		got = append(got, b.From)
		mu.Unlock()
	})
	sender := newTestIdentity(t, peers[0].ca, "d4")
	dial := func() *tls.Conn {
		cfg := pki.ClientConfig(func() *pki.Identity { return sender }, peers[0].ca.Pool, peers[0].id)
		cfg.NextProtos = []string{raftProto}
		c, err := tls.Dial("tcp", peers[0].addr, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	good := testFrame(t, &raftgroup.Batch{From: 0x99, AckQueries: []raftgroup.GroupID{1}})
	for name, frame := range map[string][]byte{
		"over 2 GiB": {0xff, 0xff, 0xff, 0xff},
		"garbage":    append([]byte{0, 0, 0, 16}, bytes.Repeat([]byte{0xff}, 16)...),
	} {
		c := dial()
		if _, err := c.Write(append(frame, good...)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		requireClosed(t, c)
	}
	mu.Lock()
	n := len(got)
	mu.Unlock()
	if n != 0 {
		t.Fatalf("malformed frames delivered %d batches", n)
	}

	// The server still takes other connections, and the sender is the
	// certificate's node whatever the batch says.
	c := dial()
	defer c.Close()
	if _, err := c.Write(good); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		got := slices.Clone(got)
		mu.Unlock()
		if len(got) > 0 {
			if len(got) != 1 || got[0] != 0xd4 {
				t.Fatalf("delivered batches from %x, want one from d4", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("well-formed batch not delivered after malformed ones")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestHasSnapshotPicksTheSnapshotLane(t *testing.T) {
	typ := pb.MsgSnap
	app := pb.MsgApp
	if hasSnapshot(&raftgroup.Batch{Messages: []raftgroup.GroupMessage{{Msg: &pb.Message{Type: &app}}}}) {
		t.Fatalf("MsgApp counted as a snapshot")
	}
	if !hasSnapshot(&raftgroup.Batch{Messages: []raftgroup.GroupMessage{{Msg: &pb.Message{Type: &typ}}}}) {
		t.Fatalf("MsgSnap not counted as a snapshot")
	}
}
