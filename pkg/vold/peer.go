package vold

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/shoal-dev/shoal/pkg/peerauth"
	"github.com/shoal-dev/shoal/pkg/pki"
	"github.com/shoal-dev/shoal/pkg/raftgroup"
	"github.com/shoal-dev/shoal/pkg/rpc"
	volv1 "github.com/shoal-dev/shoal/proto/shoal/vol/v1"
)

// DefaultPeerPort is the TCP port of VolPeer, the Raft transport and
// request forwarding between volds.
const DefaultPeerPort = 7472

// maxPeerMessage bounds a VolPeer message (a forwarded write, a Raft
// chunk is smaller).
const maxPeerMessage = 64 << 20

// peerServer serves shoal.vol.v1.VolPeer. Every call must come with a
// cluster certificate; the calling node is the certificate's, never a
// field of the message.
type peerServer struct {
	volv1.UnimplementedVolPeerServer
	log *slog.Logger
	// deliver hands an inbound batch to the Raft host (nil until it runs).
	deliver func(from raftgroup.NodeID, b *raftgroup.Batch) bool
	// forward runs a forwarded request.
	forward func(ctx context.Context, from string, req *volv1.ForwardRequest) (*volv1.ForwardResponse, error)
	names   *nodeNames
}

// Flow-control windows of VolPeer connections, fixed. gRPC's default
// estimates the bandwidth-delay product by answering data with pings:
// about one ping and one ack per Raft batch for a lone synchronous writer,
// two more frames, syscalls and wake-ups on each side of every hop. A fixed
// window as large as the estimate could grow to (16 MiB) costs nothing on
// these links, and holds a 4 MiB chunk of a snapshot in flight.
const (
	peerStreamWindow = 16 << 20
	peerConnWindow   = 32 << 20
)

// newPeerGRPC returns the mutual-TLS gRPC server of VolPeer.
func newPeerGRPC(log *slog.Logger, id func() *pki.Identity, ca func() *x509.CertPool, svc volv1.VolPeerServer) *grpc.Server {
	unary, stream := rpc.ServerInterceptors(log)
	srv := grpc.NewServer(
		grpc.Creds(credentials.NewTLS(pki.ServerConfig(id, ca))),
		grpc.ChainUnaryInterceptor(unary, peerauth.Unary),
		grpc.ChainStreamInterceptor(stream, peerauth.Stream),
		grpc.MaxRecvMsgSize(maxPeerMessage),
		grpc.StaticStreamWindowSize(peerStreamWindow),
		grpc.StaticConnWindowSize(peerConnWindow),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 2 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 10 * time.Second, Timeout: 5 * time.Second}),
	)
	volv1.RegisterVolPeerServer(srv, svc)
	return srv
}

// Raft receives one node's batches for as long as it keeps the stream.
func (s *peerServer) Raft(stream volv1.VolPeer_RaftServer) error {
	id, err := peerauth.NodeID(stream.Context())
	if err != nil {
		return err
	}
	from, err := s.names.add(id)
	if err != nil {
		return err
	}
	var r raftReceiver
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return stream.SendAndClose(&volv1.RaftAck{})
		}
		if err != nil {
			return err
		}
		b, err := r.add(m)
		if err != nil {
			return fmt.Errorf("raft batch from %s: %v: %w", id, err, errdefs.ErrInvalidArgument)
		}
		if b == nil {
			continue
		}
		// NB: the sender is who the certificate says, whatever the batch
		// claims.
		b.From = from
		if s.deliver == nil || !s.deliver(from, b) {
			continue // not running yet: Raft retransmits
		}
	}
}

// Forward runs a request for another node.
func (s *peerServer) Forward(ctx context.Context, req *volv1.ForwardRequest) (*volv1.ForwardResponse, error) {
	id, err := peerauth.NodeID(ctx)
	if err != nil {
		return nil, err
	}
	if s.forward == nil {
		return nil, errNotReady
	}
	return s.forward(ctx, id, req)
}

// peerPool keeps one client connection per node's VolPeer.
type peerPool struct {
	id   func() *pki.Identity
	ca   func() *x509.CertPool
	addr func(node string) (string, error)

	mu    sync.Mutex
	conns map[string]*peerConn
}

type peerConn struct {
	addr string
	conn *grpc.ClientConn
	api  volv1.VolPeerClient
}

func newPeerPool(id func() *pki.Identity, ca func() *x509.CertPool, addr func(string) (string, error)) *peerPool {
	return &peerPool{id: id, ca: ca, addr: addr, conns: map[string]*peerConn{}}
}

// client returns the VolPeer client of node, (re)dialing when its address
// changed. The server must present that node's certificate.
func (p *peerPool) client(node string) (volv1.VolPeerClient, error) {
	addr, err := p.addr(node)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if pc := p.conns[node]; pc != nil && pc.addr == addr {
		return pc.api, nil
	} else if pc != nil {
		pc.conn.Close()
	}
	conn, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(credentials.NewTLS(pki.ClientConfig(p.id, p.ca, node))),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxPeerMessage), grpc.MaxCallSendMsgSize(maxPeerMessage)),
		grpc.WithStaticStreamWindowSize(peerStreamWindow),
		grpc.WithStaticConnWindowSize(peerConnWindow),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 5 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
	)
	if err != nil {
		return nil, err
	}
	pc := &peerConn{addr: addr, conn: conn, api: volv1.NewVolPeerClient(conn)}
	p.conns[node] = pc
	return pc.api, nil
}

// Close closes every connection.
func (p *peerPool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, pc := range p.conns {
		pc.conn.Close()
		delete(p.conns, id)
	}
}

// raftOpener opens Raft streams through the pool.
func (p *peerPool) raftOpener(names *nodeNames) streamOpener {
	return func(ctx context.Context, to raftgroup.NodeID) (volv1.VolPeer_RaftClient, error) {
		c, err := p.client(names.name(to))
		if err != nil {
			return nil, err
		}
		return c.Raft(ctx)
	}
}

// listenPeers listens on ip:port for VolPeer.
func listenPeers(ip string, port uint32) (net.Listener, error) {
	lis, err := net.Listen("tcp", net.JoinHostPort(ip, fmt.Sprint(port)))
	if err != nil {
		return nil, fmt.Errorf("vold peer listener: %w", err)
	}
	return lis, nil
}
