package pki

import (
	"crypto/tls"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// t0 anchors every test clock; real time, because the handshakes that do
// not override tls.Config.Time check certificates against it.
var t0 = time.Now()

const (
	caValidity   = 10 * 365 * 24 * time.Hour
	nodeValidity = 72 * time.Hour
)

func newCA(t *testing.T, cluster string) *CA {
	t.Helper()
	ca, err := NewCA(cluster, caValidity, t0)
	if err != nil {
		t.Fatalf("NewCA(%q): %v", cluster, err)
	}
	return ca
}

func newID(t *testing.T, ca *CA, nodeID string) *Identity {
	t.Helper()
	id, err := ca.NewIdentity(nodeID, []net.IP{net.ParseIP("127.0.0.1")}, nodeValidity, t0)
	if err != nil {
		t.Fatalf("NewIdentity(%q): %v", nodeID, err)
	}
	return id
}

func fixed(id *Identity) func() *Identity { return func() *Identity { return id } }

type result struct {
	srv, cli       tls.ConnectionState
	srvErr, cliErr error
}

// handshake runs one TLS connection over net.Pipe. The server writes a
// byte once its handshake succeeds and the client reads it, because in TLS
// 1.3 the client's Handshake returns before the server has judged the
// client's certificate: a rejection shows up on the client's first read.
func handshake(t *testing.T, sc, cc *tls.Config) result {
	t.Helper()
	a, b := net.Pipe()
	deadline := time.Now().Add(10 * time.Second)
	_ = a.SetDeadline(deadline)
	_ = b.SetDeadline(deadline)

	var r result
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer a.Close()
		s := tls.Server(a, sc)
		if err := s.Handshake(); err != nil {
			r.srvErr = err
			return
		}
		r.srv = s.ConnectionState()
		if _, err := s.Write([]byte{1}); err != nil {
			r.srvErr = err
		}
	}()
	c := tls.Client(b, cc)
	err := c.Handshake()
	if err == nil {
		r.cli = c.ConnectionState()
		_, err = io.ReadFull(c, make([]byte, 1))
	}
	r.cliErr = err
	b.Close()
	wg.Wait()
	return r
}

func mustSucceed(t *testing.T, r result) {
	t.Helper()
	if r.srvErr != nil || r.cliErr != nil {
		t.Fatalf("handshake failed: server: %v; client: %v", r.srvErr, r.cliErr)
	}
}
