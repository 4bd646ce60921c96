package vold

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"

	"google.golang.org/grpc/credentials"
)

// keepGathered bounds the buffer a gatherConn keeps between writes: a
// snapshot's chunk is let go.
const keepGathered = 2 * coalesceBytes

// gatherConn sits under the TLS of an outgoing Raft connection. tls.Conn
// writes every record (16 KiB of data at most) to the socket in its own
// write syscall: 64 per MiB of entries, each also running the loopback's or
// the veth's receive path in the sender's context. While held, gatherConn
// keeps the records, and flush writes them all in one syscall; what is
// written outside a hold (the handshake, close_notify) goes straight
// through.
type gatherConn struct {
	net.Conn

	// mu guards hold and buf: tls.Conn's Close may write its close_notify
	// alert from another goroutine.
	mu   sync.Mutex
	hold bool
	buf  []byte
}

func (g *gatherConn) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.hold {
		return g.Conn.Write(p)
	}
	g.buf = append(g.buf, p...)
	return len(p), nil
}

func (g *gatherConn) gather() {
	g.mu.Lock()
	g.hold = true
	g.mu.Unlock()
}

// flush ends the hold and writes what it gathered.
func (g *gatherConn) flush() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.hold = false
	_, err := g.Conn.Write(g.buf)
	if cap(g.buf) <= keepGathered {
		g.buf = g.buf[:0]
	} else {
		g.buf = nil
	}
	return err
}

// gatheredTLS is a TLS connection whose every Write reaches the socket in
// one syscall (see gatherConn).
type gatheredTLS struct {
	*tls.Conn
	raw *gatherConn
}

// newGatheredTLS starts the client side of a TLS connection on raw.
func newGatheredTLS(raw net.Conn, cfg *tls.Config) *gatheredTLS {
	g := &gatherConn{Conn: raw}
	return &gatheredTLS{Conn: tls.Client(g, cfg), raw: g}
}

// handshakeGathered starts TLS as a client on raw, gathered (see
// gatherConn), offering protocol proto alone, and fails unless the server
// agrees to it: a server that speaks another would not understand what
// follows. Frames are written whole, so small records at the start of a
// connection would only cost more of them. On an error raw is closed.
func handshakeGathered(ctx context.Context, raw net.Conn, cfg *tls.Config, proto string) (*gatheredTLS, error) {
	cfg = cfg.Clone()
	cfg.NextProtos = []string{proto}
	cfg.DynamicRecordSizingDisabled = true
	c := newGatheredTLS(raw, cfg)
	if err := c.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, err
	}
	if got := c.ConnectionState().NegotiatedProtocol; got != proto {
		raw.Close()
		return nil, fmt.Errorf("negotiated %q, not %s: %w", got, proto, errOtherProtocol)
	}
	return c, nil
}

// errOtherProtocol: the peer did not agree to the protocol offered.
var errOtherProtocol = errors.New("the peer speaks another protocol")

// Write encrypts p into records and writes them at once. On an error,
// the count is of what was encrypted, not of what reached the peer: the
// connection is broken either way.
func (c *gatheredTLS) Write(p []byte) (int, error) {
	c.raw.gather()
	n, err := c.Conn.Write(p)
	if ferr := c.raw.flush(); err == nil && ferr != nil {
		return 0, ferr
	}
	return n, err
}

// gatheredCreds are the transport credentials of VolPeer's gRPC clients:
// credentials.NewTLS's handshake, on a gatheredTLS connection. gRPC
// writes what it framed at once (up to its write buffer, which peerPool
// sizes for a forwarded 1 MiB write), and through a plain tls.Conn each
// 16 KiB record of that would be a syscall of its own: a node that holds
// no replica of a volume forwards every write of its mounts.
type gatheredCreds struct {
	cfg *tls.Config
}

func (c gatheredCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	cfg := c.cfg
	if cfg.ServerName == "" {
		host, _, err := net.SplitHostPort(authority)
		if err != nil {
			host = authority
		}
		cfg = cfg.Clone()
		cfg.ServerName = host
	}
	conn, err := handshakeGathered(ctx, raw, cfg, "h2")
	if err != nil {
		return nil, nil, fmt.Errorf("peer at %s: %w", authority, err)
	}
	return conn, credentials.TLSInfo{
		State:          conn.ConnectionState(),
		CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity},
	}, nil
}

func (gatheredCreds) ServerHandshake(net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("vold: gatheredCreds are for clients")
}

func (gatheredCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls"}
}

func (c gatheredCreds) Clone() credentials.TransportCredentials {
	return gatheredCreds{cfg: c.cfg.Clone()}
}

func (gatheredCreds) OverrideServerName(string) error { return nil }
