package vold

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"sync"
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

// testPeer is one node of an in-process cluster: a VolPeer server on
// loopback with a real certificate, a transport and a Raft host.
type testPeer struct {
	id    string
	rid   raftgroup.NodeID
	ident *pki.Identity
	addr  string
	srv   *grpc.Server
	trans *transport
	pool  *peerPool
	host  *raftgroup.Host
	sms   sync.Map // raftgroup.GroupID -> raftgroup.StateMachine (a *raftgrouptest.KV by default)
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
		p := &testPeer{id: id, ident: newTestIdentity(t, ca, id)}
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
		p.trans = newTransport(testLogger(t), p.pool.raftOpener(names))
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
			h.Deliver(from, b)
			return true
		}}
		p.srv = newPeerGRPC(testLogger(t), getID, getCA, svc)
		go p.srv.Serve(lis)
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
}

func TestPeerRejectsCallersWithoutClusterCertificate(t *testing.T) {
	peers := startCluster(t, "a1")
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

	// A certificate from another cluster's CA fails the handshake.
	other := newTestCA(t)
	stranger := newTestIdentity(t, other, "b2")
	scfg := pki.ClientConfig(func() *pki.Identity { return stranger }, func() *x509.CertPool { return other.Pool() }, "")
	scfg.VerifyConnection = nil
	sconn, err := grpc.NewClient("passthrough:///"+peers[0].addr, grpc.WithTransportCredentials(credentials.NewTLS(scfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer sconn.Close()
	stream, err := volv1.NewVolPeerClient(sconn).Raft(ctx)
	if err == nil {
		_ = stream.Send(&volv1.RaftBatch{})
		_, err = stream.CloseAndRecv()
	}
	if err == nil {
		t.Fatalf("raft stream with a foreign certificate was accepted")
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
	tr := newTransport(testLogger(t), pool.raftOpener(newNodeNames()))
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

// chunkRecorder is a Raft client stream that records what is sent.
type chunkRecorder struct {
	volv1.VolPeer_RaftClient
	msgs []*volv1.RaftBatch
}

func (r *chunkRecorder) Send(m *volv1.RaftBatch) error {
	r.msgs = append(r.msgs, &volv1.RaftBatch{Batch: bytes.Clone(m.GetBatch()), More: m.GetMore()})
	return nil
}

func TestLargeBatchTravelsInChunks(t *testing.T) {
	snap := bytes.Repeat([]byte("snapshot"), (3*chunkSize)/8+5)
	typ := pb.MsgSnap
	b := &raftgroup.Batch{From: 0xa1, Messages: []raftgroup.GroupMessage{{Group: 3, Msg: &pb.Message{
		Type:     &typ,
		To:       new(uint64),
		Snapshot: &pb.Snapshot{Data: snap, Metadata: &pb.SnapshotMetadata{}},
	}}}}
	data, err := b.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	var rec chunkRecorder
	if err := sendChunks(&rec, data); err != nil {
		t.Fatal(err)
	}
	if len(rec.msgs) != 4 {
		t.Fatalf("%d bytes went in %d messages, want 4", len(data), len(rec.msgs))
	}
	var r raftReceiver
	var got *raftgroup.Batch
	for i, m := range rec.msgs {
		out, err := r.add(m)
		if err != nil {
			t.Fatalf("chunk %d: %v", i, err)
		}
		if (out != nil) != (i == len(rec.msgs)-1) {
			t.Fatalf("chunk %d: batch complete = %v", i, out != nil)
		}
		got = out
	}
	if len(got.Messages) != 1 || !bytes.Equal(got.Messages[0].Msg.GetSnapshot().GetData(), snap) {
		t.Fatalf("joined batch differs from the one sent")
	}
	// A small batch is one message, and the receiver takes it at once.
	small, _ := (&raftgroup.Batch{From: 0xa1}).Marshal()
	rec.msgs = nil
	_ = sendChunks(&rec, small)
	if len(rec.msgs) != 1 || rec.msgs[0].GetMore() {
		t.Fatalf("small batch sent as %d messages", len(rec.msgs))
	}
	if out, err := r.add(rec.msgs[0]); err != nil || out == nil {
		t.Fatalf("small batch: %v, %v", out, err)
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
