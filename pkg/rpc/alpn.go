package rpc

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"
)

// HandshakeTimeout bounds the TLS handshake of a connection an
// ALPNListener accepted.
const HandshakeTimeout = 10 * time.Second

// ALPNListener lets a gRPC server share its TCP port with protocols of
// its own: it does the TLS handshake of every connection it accepts,
// offering the protocols it has handlers for and "h2", and sorts the
// connections by the protocol the client chose (ALPN). A connection that
// chose a handler's protocol is served by that handler, in the goroutine
// of its handshake; every other one comes out of Accept with its handshake
// done, for a grpc.Server built with HandshakenTLS.
//
// Handshakes run in a goroutine per connection, each bounded by
// HandshakeTimeout, so a client that stalls never holds up the others.
// Close closes the listener and every connection a handler still holds,
// and waits for the handlers to return, so grpc.Server.Stop (which closes
// its listeners) also stops them.
type ALPNListener struct {
	inner    net.Listener
	cfg      *tls.Config
	handlers map[string]func(*tls.Conn)
	log      *slog.Logger

	// ready holds connections for Accept.
	ready chan *tls.Conn
	done  chan struct{}
	wg    sync.WaitGroup

	// mu guards open, the raw connections being handshaken or served by a
	// handler, and closed.
	mu     sync.Mutex
	open   map[net.Conn]struct{}
	closed bool
}

// NewALPNListener starts accepting on inner. cfg is the server's TLS
// configuration; it is cloned with NextProtos set to handlers' protocols
// and "h2", including into the configurations its GetConfigForClient
// returns (pki.ServerConfig uses one). A handler owns its connection until
// it returns; the listener closes it then.
func NewALPNListener(inner net.Listener, cfg *tls.Config, handlers map[string]func(*tls.Conn), log *slog.Logger) *ALPNListener {
	protos := append(slices.Sorted(maps.Keys(handlers)), "h2")
	cfg = cfg.Clone()
	cfg.NextProtos = protos
	if get := cfg.GetConfigForClient; get != nil {
		cfg.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			c, err := get(hello)
			if err != nil || c == nil {
				return c, err
			}
			c = c.Clone()
			c.NextProtos = protos
			return c, nil
		}
	}
	l := &ALPNListener{
		inner: inner, cfg: cfg, handlers: handlers, log: log,
		ready: make(chan *tls.Conn), done: make(chan struct{}),
		open: map[net.Conn]struct{}{},
	}
	l.wg.Add(1)
	go l.acceptLoop()
	return l
}

// Accept returns the next connection that negotiated none of the
// handlers' protocols, its handshake done.
func (l *ALPNListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Addr is the address of the inner listener.
func (l *ALPNListener) Addr() net.Addr { return l.inner.Addr() }

// Close stops accepting, closes every connection not yet handed out by
// Accept and waits for the handlers to return.
func (l *ALPNListener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	close(l.done)
	for c := range l.open {
		c.Close()
	}
	l.mu.Unlock()
	err := l.inner.Close()
	l.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

func (l *ALPNListener) acceptLoop() {
	defer l.wg.Done()
	var wait time.Duration
	for {
		raw, err := l.inner.Accept()
		if err != nil {
			select {
			case <-l.done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				// Closed under us: Accept must fail too.
				go l.Close()
				return
			}
			// Out of file descriptors and the like: back off as net/http
			// does rather than spin.
			wait = min(max(2*wait, 5*time.Millisecond), time.Second)
			l.log.Warn("accept failed", "addr", l.inner.Addr().String(), "retry_in", wait, "err", err)
			select {
			case <-l.done:
				return
			case <-time.After(wait):
			}
			continue
		}
		wait = 0
		if !l.track(raw) {
			raw.Close()
			return
		}
		l.wg.Add(1)
		go l.serve(raw)
	}
}

// track adds raw to the connections Close closes; it reports false once
// the listener is closed.
func (l *ALPNListener) track(raw net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.open[raw] = struct{}{}
	return true
}

func (l *ALPNListener) untrack(raw net.Conn) {
	l.mu.Lock()
	delete(l.open, raw)
	l.mu.Unlock()
}

// serve handshakes raw, then runs the handler of the negotiated protocol
// or hands the connection to Accept.
func (l *ALPNListener) serve(raw net.Conn) {
	defer l.wg.Done()
	ra := &readAhead{Conn: raw}
	c := tls.Server(ra, l.cfg)
	ctx, cancel := context.WithTimeout(context.Background(), HandshakeTimeout)
	err := c.HandshakeContext(ctx)
	cancel()
	if err != nil {
		l.untrack(raw)
		raw.Close()
		l.log.Debug("tls handshake failed", "remote_addr", raw.RemoteAddr().String(), "err", err)
		return
	}
	if h := l.handlers[c.ConnectionState().NegotiatedProtocol]; h != nil {
		ra.r = bufio.NewReaderSize(raw, handlerReadAhead)
		h(c)
		l.untrack(raw)
		// NB: closing raw rather than c sends no close_notify, which could
		// wait on a peer that does not read.
		raw.Close()
		return
	}
	// From here the gRPC server owns the connection and closes it on Stop.
	l.untrack(raw)
	select {
	case l.ready <- c:
	case <-l.done:
		raw.Close()
	}
}

// handlerReadAhead is what a handler's connection reads from the socket
// at once (see readAhead).
const handlerReadAhead = 256 << 10

// readAhead sits under the TLS of an accepted connection. tls.Conn reads
// about one record (16 KiB of data at most) per read syscall; once r is
// set, which serve does for the handlers' connections after their
// handshake, whatever the socket holds is read at once, up to r's size.
// gRPC's connections, buffered above TLS already and many of them idle,
// read straight through.
type readAhead struct {
	net.Conn
	r *bufio.Reader
}

func (c *readAhead) Read(p []byte) (int, error) {
	if c.r == nil {
		return c.Conn.Read(p)
	}
	return c.r.Read(p)
}

// HandshakenTLS returns the transport credentials of a grpc.Server that
// serves an ALPNListener: the handshake is done, and these only report
// its state, so that callers' certificates reach the handlers (as
// credentials.TLSInfo, what peerauth reads) exactly as with
// credentials.NewTLS. They are for servers only.
func HandshakenTLS() credentials.TransportCredentials { return handshakenTLS{} }

type handshakenTLS struct{}

func (handshakenTLS) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	c, ok := conn.(*tls.Conn)
	if !ok {
		return nil, nil, fmt.Errorf("rpc: %T is not a TLS connection: serve an ALPNListener", conn)
	}
	return c, credentials.TLSInfo{
		State:          c.ConnectionState(),
		CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity},
	}, nil
}

func (handshakenTLS) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("rpc: HandshakenTLS is for servers")
}

func (handshakenTLS) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls"}
}

func (h handshakenTLS) Clone() credentials.TransportCredentials { return h }

func (handshakenTLS) OverrideServerName(string) error { return nil }
