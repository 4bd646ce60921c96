package vold

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
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

// raftProto is the ALPN protocol of Raft connections on the peer port
// (transport.go); the rest of its connections are VolPeer's gRPC. A vold
// that speaks another version of it refuses the handshake.
const raftProto = "shoal-raft/1"

// maxPeerMessage bounds a VolPeer message (a forwarded write).
const maxPeerMessage = 64 << 20

// peerServer serves the peer port: Raft connections and
// shoal.vol.v1.VolPeer. Every connection and call must come with a
// cluster certificate; the calling node is the certificate's, never a
// field of a message.
type peerServer struct {
	volv1.UnimplementedVolPeerServer
	log *slog.Logger
	// deliver hands an inbound batch to the Raft host (nil until it runs).
	deliver func(from raftgroup.NodeID, b *raftgroup.Batch) bool
	// forward runs a forwarded request.
	forward func(ctx context.Context, from string, req *volv1.ForwardRequest) (*volv1.ForwardResponse, error)
	// export runs an export for another node.
	export func(req *volv1.ExportVolumeRequest, stream volv1.VolPeer_ExportServer) error
	names  *nodeNames
}

// Flow-control windows of VolPeer connections, fixed. gRPC's default
// estimates the bandwidth-delay product by answering data with pings:
// about one ping and one ack per message for a lone synchronous caller,
// two more frames, syscalls and wake-ups on each side of every hop. A fixed
// window as large as the estimate could grow to (16 MiB) costs nothing on
// these links, and holds a forwarded 1 MiB write in flight many times.
const (
	peerStreamWindow = 16 << 20
	peerConnWindow   = 32 << 20
)

// peerWriteBuffer is what a VolPeer client's gRPC gathers before it
// writes: a forwarded 1 MiB write's message, its HTTP/2 frames' headers
// and room.
const peerWriteBuffer = 1<<20 + 64<<10

// newPeerGRPC returns the gRPC server of VolPeer; it serves the
// connections of a peerListener, whose handshake it trusts.
func newPeerGRPC(log *slog.Logger, svc volv1.VolPeerServer) *grpc.Server {
	unary, stream := rpc.ServerInterceptors(log)
	srv := grpc.NewServer(
		grpc.Creds(rpc.HandshakenTLS()),
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

// peerListener wraps the peer port's listener: it does the mutual-TLS
// handshakes, serves Raft connections itself and hands the others to
// newPeerGRPC's server, which closes it (and with it the Raft
// connections) when it stops.
func (s *peerServer) peerListener(lis net.Listener, id func() *pki.Identity, ca func() *x509.CertPool) *rpc.ALPNListener {
	return rpc.NewALPNListener(lis, pki.ServerConfig(id, ca), map[string]func(*tls.Conn){raftProto: s.serveRaft}, s.log)
}

// serveRaft receives one node's batches for as long as it keeps the
// connection.
func (s *peerServer) serveRaft(c *tls.Conn) {
	id, ok := pki.PeerNodeID(c.ConnectionState())
	if !ok {
		// Debug: anyone can connect, and must not be able to fill the log.
		s.log.Debug("raft connection without a cluster certificate refused", "remote_addr", c.RemoteAddr().String())
		return
	}
	from, err := s.names.add(id)
	if err != nil {
		s.log.Info("raft connection refused", "remote_addr", c.RemoteAddr().String(), "err", err)
		return
	}
	r := bufio.NewReaderSize(c, receiveBuffer)
	for {
		b, err := readFrame(r)
		if err != nil {
			lvl := slog.LevelDebug
			if errors.Is(err, errdefs.ErrInvalidArgument) {
				lvl = slog.LevelInfo
			}
			s.log.Log(context.Background(), lvl, "raft connection closed", "from", id, "err", err)
			return
		}
		// NB: the sender is who the certificate says, whatever the batch
		// claims.
		b.From = from
		if s.deliver != nil {
			s.deliver(from, b) // false: not running yet, Raft retransmits
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

// Export streams an export of this node's replica for another node.
func (s *peerServer) Export(req *volv1.ExportVolumeRequest, stream volv1.VolPeer_ExportServer) error {
	if s.export == nil {
		return errNotReady
	}
	return s.export(req, stream)
}

// peerPool keeps one client connection per node's VolPeer.
type peerPool struct {
	id   func() *pki.Identity
	ca   func() *x509.CertPool
	addr func(node string) (string, error)
	// dial, if set, opens VolPeer's TCP connections (tests count their
	// writes).
	dial func(ctx context.Context, addr string) (net.Conn, error)

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
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(gatheredCreds{cfg: pki.ClientConfig(p.id, p.ca, node)}),
		// A forwarded 1 MiB write and its frames reach the connection in
		// one Write, and so the socket in one syscall (gatheredCreds); gRPC
		// returns the buffer to a pool between writes.
		grpc.WithWriteBufferSize(peerWriteBuffer),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxPeerMessage), grpc.MaxCallSendMsgSize(maxPeerMessage)),
		grpc.WithStaticStreamWindowSize(peerStreamWindow),
		grpc.WithStaticConnWindowSize(peerConnWindow),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 5 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
	}
	if p.dial != nil {
		opts = append(opts, grpc.WithContextDialer(p.dial))
	}
	conn, err := grpc.NewClient("passthrough:///"+addr, opts...)
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

// raftDialer opens Raft connections: TCP to the node's peer port, then
// the TLS handshake with protocol raftProto, in which the server must
// present that node's certificate.
func (p *peerPool) raftDialer(names *nodeNames) raftDialer {
	return func(ctx context.Context, to raftgroup.NodeID) (net.Conn, error) {
		node := names.name(to)
		addr, err := p.addr(node)
		if err != nil {
			return nil, err
		}
		d := net.Dialer{
			KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 5 * time.Second, Interval: 5 * time.Second, Count: 3},
			// A peer that is gone without a reset leaves sent data
			// unacknowledged, and keepalives do not run while it is; the
			// user timeout is what ends such a connection, as gRPC's
			// client set it to its keepalive timeout.
			ControlContext: func(_ context.Context, _, _ string, rc syscall.RawConn) error {
				var serr error
				err := rc.Control(func(fd uintptr) {
					serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(writeTimeout/time.Millisecond))
				})
				return errors.Join(err, serr)
			},
		}
		raw, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		c, err := handshakeGathered(ctx, raw, pki.ClientConfig(p.id, p.ca, node), raftProto)
		if errors.Is(err, errOtherProtocol) {
			return nil, fmt.Errorf("node %s at %s: %w: it runs another vold version", node, addr, err)
		} else if err != nil {
			return nil, fmt.Errorf("raft handshake with node %s at %s: %w", node, addr, err)
		}
		return c, nil
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
