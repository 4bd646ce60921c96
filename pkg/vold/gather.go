package vold

import (
	"crypto/tls"
	"net"
	"sync"
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
