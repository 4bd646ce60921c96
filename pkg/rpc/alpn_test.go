package rpc

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/pki"
)

// newTestIdentity makes a CA and node a1's identity, for 127.0.0.1.
func newTestIdentity(t *testing.T) (*pki.CA, *pki.Identity) {
	t.Helper()
	ca, err := pki.NewCA("test", time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	id, err := ca.NewIdentity("a1", []net.IP{net.ParseIP("127.0.0.1")}, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return ca, id
}

func TestALPNListenerSortsByProtocol(t *testing.T) {
	ca, id := newTestIdentity(t)
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan *tls.Conn, 1)
	returned := make(chan struct{})
	lis := NewALPNListener(inner,
		pki.ServerConfig(func() *pki.Identity { return id }, func() *x509.CertPool { return ca.Pool() }),
		map[string]func(*tls.Conn){"test/1": func(c *tls.Conn) {
			served <- c
			_, _ = io.Copy(io.Discard, c) // until Close
			close(returned)
		}},
		slog.New(slog.DiscardHandler))
	defer lis.Close()
	addr := inner.Addr().String()

	// A client that never says hello holds up nobody.
	stalled, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()

	dial := func(proto string) *tls.Conn {
		t.Helper()
		// Shorter than HandshakeTimeout: a listener that handshook in
		// turn would keep this client waiting on the stalled one.
		d := &net.Dialer{Timeout: HandshakeTimeout / 2}
		c, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{proto}})
		if err != nil {
			t.Fatalf("dial %s: %v", proto, err)
		}
		if got := c.ConnectionState().NegotiatedProtocol; got != proto {
			t.Fatalf("negotiated %q, want %q", got, proto)
		}
		return c
	}
	h2 := dial("h2")
	defer h2.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			t.Errorf("Accept: %v", err)
		}
		accepted <- c
	}()
	select {
	case c := <-accepted:
		if _, ok := c.(*tls.Conn); !ok {
			t.Fatalf("Accept returned a %T, want a *tls.Conn", c)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("h2 connection not accepted while another client stalls")
	}

	own := dial("test/1")
	defer own.Close()
	select {
	case <-served:
	case <-time.After(5 * time.Second):
		t.Fatalf("test/1 connection not given to its handler")
	}

	// Close ends the handler's connection and waits for it.
	if err := lis.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-returned:
	default:
		t.Fatalf("Close returned before the handler")
	}
	if _, err := lis.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
	}
}

// countingListener counts the reads of the connections it accepts, whose
// socket buffers hold a whole test stream.
type countingListener struct {
	net.Listener
	reads atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4 << 20)
	}
	return &countingConn{Conn: c, reads: &l.reads}, nil
}

type countingConn struct {
	net.Conn
	reads *atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	c.reads.Add(1)
	return c.Conn.Read(p)
}

// A handler's connection reads what the socket holds at once, not a TLS
// record (16 KiB) per read, and gets every byte in order.
func TestALPNHandlerReadsAhead(t *testing.T) {
	ca, id := newTestIdentity(t)
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	inner := &countingListener{Listener: tcp}
	const size = 256 << 10 // 16 records
	want := make([]byte, size)
	for i := range want {
		want[i] = byte(i * 7)
	}
	written := make(chan struct{})
	got := make(chan []byte, 1)
	lis := NewALPNListener(inner,
		pki.ServerConfig(func() *pki.Identity { return id }, func() *x509.CertPool { return ca.Pool() }),
		map[string]func(*tls.Conn){"test/1": func(c *tls.Conn) {
			<-written // the whole stream waits in the socket
			b := make([]byte, size)
			_, err := io.ReadFull(c, b)
			if err != nil {
				b = nil
			}
			got <- b
		}},
		slog.New(slog.DiscardHandler))
	defer lis.Close()

	raw, err := net.Dial("tcp", tcp.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	_ = raw.(*net.TCPConn).SetWriteBuffer(4 << 20)
	c := tls.Client(raw, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"test/1"}})
	if _, err := c.Write(want); err != nil {
		t.Fatal(err)
	}
	close(written)
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("the handler read %d bytes, not the %d written, or not in order", len(b), size)
	}
	// The handshake takes a few reads; 16 records without reading ahead
	// take at least 16.
	if n := inner.reads.Load(); n >= 10 {
		t.Fatalf("%d reads from the socket for %d bytes, want fewer than 10", n, size)
	}
}
