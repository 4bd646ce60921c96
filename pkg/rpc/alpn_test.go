package rpc

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/pki"
)

func TestALPNListenerSortsByProtocol(t *testing.T) {
	ca, err := pki.NewCA("test", time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	id, err := ca.NewIdentity("a1", []net.IP{net.ParseIP("127.0.0.1")}, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
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
