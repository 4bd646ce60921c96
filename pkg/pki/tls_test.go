package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestHandshakeSameCluster(t *testing.T) {
	ca := newCA(t, "c")
	a, b := newID(t, ca, "node-a"), newID(t, ca, "node-b")

	r := handshake(t, ServerConfig(fixed(a), ca.Pool), ClientConfig(fixed(b), ca.Pool, ""))
	mustSucceed(t, r)
	if r.srv.Version != tls.VersionTLS13 || r.cli.Version != tls.VersionTLS13 {
		t.Fatalf("negotiated %x/%x, want TLS 1.3", r.srv.Version, r.cli.Version)
	}
	if id, ok := PeerNodeID(r.srv); !ok || id != "node-b" {
		t.Fatalf("server: PeerNodeID = %q, %v; want node-b, true", id, ok)
	}
	if got := r.cli.PeerCertificates[0].Subject.CommonName; got != "node-a" {
		t.Fatalf("client sees server %q, want node-a", got)
	}
	if _, ok := PeerNodeID(r.cli); ok {
		t.Fatalf("PeerNodeID reported true on the client side, which verifies by itself")
	}
}

func TestHandshakeForeignCA(t *testing.T) {
	ca := newCA(t, "c")
	// Same cluster name, different key: the name is not what is trusted.
	evil := newCA(t, "c")
	good, bad := newID(t, ca, "node-a"), newID(t, evil, "node-a")

	t.Run("foreign server", func(t *testing.T) {
		r := handshake(t, ServerConfig(fixed(bad), evil.Pool), ClientConfig(fixed(good), ca.Pool, ""))
		if r.cliErr == nil {
			t.Fatalf("client accepted a server certified by another CA")
		}
		if !strings.Contains(r.cliErr.Error(), "unknown authority") {
			t.Fatalf("client error = %v, want an unknown-authority error", r.cliErr)
		}
	})
	t.Run("foreign client", func(t *testing.T) {
		// The client trusts the real CA, so only the server can object.
		r := handshake(t, ServerConfig(fixed(good), ca.Pool), ClientConfig(fixed(bad), ca.Pool, ""))
		if r.srvErr == nil {
			t.Fatalf("server accepted a client certified by another CA")
		}
		if !strings.Contains(r.srvErr.Error(), "unknown authority") {
			t.Fatalf("server error = %v, want an unknown-authority error", r.srvErr)
		}
		if r.cliErr == nil {
			t.Fatalf("client did not learn that the server rejected it")
		}
	})
	t.Run("foreign CA certificate in the chain", func(t *testing.T) {
		// A leaf from the evil CA carrying the real CA certificate as its
		// chain must not pass for a member.
		spliced := *bad
		spliced.Cert.Certificate = [][]byte{bad.Cert.Certificate[0], ca.Cert().Raw}
		r := handshake(t, ServerConfig(fixed(&spliced), evil.Pool), ClientConfig(fixed(good), ca.Pool, ""))
		if r.cliErr == nil {
			t.Fatalf("client accepted a foreign leaf with the cluster CA spliced into its chain")
		}
	})
}

func TestHandshakeCAAsLeafRefused(t *testing.T) {
	// Every member holds the CA key, so one could present the CA
	// certificate itself; it must not pass for a node.
	ca := newCA(t, "c")
	caID := &Identity{Cert: tls.Certificate{Certificate: [][]byte{ca.Cert().Raw}, PrivateKey: ca.key, Leaf: ca.Cert()}}
	good := newID(t, ca, "node-a")

	r := handshake(t, ServerConfig(fixed(caID), ca.Pool), ClientConfig(fixed(good), ca.Pool, ""))
	if r.cliErr == nil || !strings.Contains(r.cliErr.Error(), "CA certificate") {
		t.Fatalf("client error = %v, want a refusal of the CA certificate as server identity", r.cliErr)
	}
	// As a client: crypto/tls verifies it (the CA is self-signed and in
	// the pool), but it must name no node.
	r = handshake(t, ServerConfig(fixed(good), ca.Pool), ClientConfig(fixed(caID), ca.Pool, ""))
	if r.srvErr == nil {
		if id, ok := PeerNodeID(r.srv); ok {
			t.Fatalf("PeerNodeID = %q, true for a client presenting the CA certificate", id)
		}
	}
}

func TestExpectNodeID(t *testing.T) {
	ca := newCA(t, "c")
	a, b := newID(t, ca, "node-a"), newID(t, ca, "node-b")

	mustSucceed(t, handshake(t, ServerConfig(fixed(a), ca.Pool), ClientConfig(fixed(b), ca.Pool, "node-a")))

	r := handshake(t, ServerConfig(fixed(a), ca.Pool), ClientConfig(fixed(b), ca.Pool, "node-c"))
	if r.cliErr == nil || !strings.Contains(r.cliErr.Error(), `server is node "node-a", want "node-c"`) {
		t.Fatalf("client error = %v, want a node ID mismatch", r.cliErr)
	}
}

func TestHostnameIgnored(t *testing.T) {
	// Peers are dialed by IP, and the certificate's SANs need not match
	// the address or ServerName in use.
	ca := newCA(t, "c")
	a, b := newID(t, ca, "node-a"), newID(t, ca, "node-b")
	cc := ClientConfig(fixed(b), ca.Pool, "")
	cc.ServerName = "203.0.113.9"
	mustSucceed(t, handshake(t, ServerConfig(fixed(a), ca.Pool), cc))
}

func TestJoinClientConfig(t *testing.T) {
	ca := newCA(t, "c")
	evil := newCA(t, "c")
	member := newID(t, ca, "node-a")
	mitm := newID(t, evil, "node-a")
	server := ServerConfig(fixed(member), ca.Pool)

	tok, err := NewToken(ca)
	if err != nil {
		t.Fatalf("NewToken: %v", err)
	}

	t.Run("right fingerprint", func(t *testing.T) {
		jc, err := JoinClientConfig(tok.Fingerprint)
		if err != nil {
			t.Fatalf("JoinClientConfig: %v", err)
		}
		r := handshake(t, server, jc)
		mustSucceed(t, r)
		if got := r.cli.PeerCertificates[0].Subject.CommonName; got != "node-a" {
			t.Fatalf("joined through %q, want node-a", got)
		}
		if Fingerprint(r.cli.PeerCertificates[1]) != ca.Fingerprint() {
			t.Fatalf("server did not send the cluster CA certificate")
		}
	})
	t.Run("wrong fingerprint", func(t *testing.T) {
		jc, _ := JoinClientConfig(evil.Fingerprint())
		r := handshake(t, server, jc)
		want := "server's CA fingerprint " + ca.Fingerprint() + " does not match the token's " + evil.Fingerprint()
		if r.cliErr == nil || !strings.Contains(r.cliErr.Error(), want) {
			t.Fatalf("client error = %v, want one containing %q", r.cliErr, want)
		}
	})
	t.Run("man in the middle", func(t *testing.T) {
		jc, _ := JoinClientConfig(tok.Fingerprint)
		r := handshake(t, ServerConfig(fixed(mitm), evil.Pool), jc)
		want := "server's CA fingerprint " + evil.Fingerprint() + " does not match the token's " + ca.Fingerprint()
		if r.cliErr == nil || !strings.Contains(r.cliErr.Error(), want) {
			t.Fatalf("client error = %v, want one containing %q", r.cliErr, want)
		}
	})
	t.Run("man in the middle replaying the real CA certificate", func(t *testing.T) {
		spliced := *mitm
		spliced.Cert.Certificate = [][]byte{mitm.Cert.Certificate[0], ca.Cert().Raw}
		jc, _ := JoinClientConfig(tok.Fingerprint)
		r := handshake(t, ServerConfig(fixed(&spliced), evil.Pool), jc)
		if r.cliErr == nil || !strings.Contains(r.cliErr.Error(), "not valid under the token's CA") {
			t.Fatalf("client error = %v, want the leaf rejected under the token's CA", r.cliErr)
		}
	})
	t.Run("server without CA in chain", func(t *testing.T) {
		bare := *member
		bare.Cert.Certificate = bare.Cert.Certificate[:1]
		jc, _ := JoinClientConfig(tok.Fingerprint)
		r := handshake(t, ServerConfig(fixed(&bare), ca.Pool), jc)
		if r.cliErr == nil || !strings.Contains(r.cliErr.Error(), "did not send its CA certificate") {
			t.Fatalf("client error = %v, want a missing-CA error", r.cliErr)
		}
	})
	t.Run("bad fingerprint", func(t *testing.T) {
		for _, fp := range []string{"", "abc", strings.Repeat("g", 64), ca.Fingerprint() + "0"} {
			if _, err := JoinClientConfig(fp); err == nil {
				t.Fatalf("JoinClientConfig(%q) succeeded", fp)
			}
		}
		// Case is not significant in hex.
		jc, err := JoinClientConfig(strings.ToUpper(ca.Fingerprint()))
		if err != nil {
			t.Fatalf("JoinClientConfig(upper case): %v", err)
		}
		mustSucceed(t, handshake(t, server, jc))
	})
}

func TestUnauthenticatedClient(t *testing.T) {
	ca := newCA(t, "c")
	a := newID(t, ca, "node-a")
	jc, err := JoinClientConfig(ca.Fingerprint())
	if err != nil {
		t.Fatalf("JoinClientConfig: %v", err)
	}
	r := handshake(t, ServerConfig(fixed(a), ca.Pool), jc)
	mustSucceed(t, r)
	if id, ok := PeerNodeID(r.srv); ok {
		t.Fatalf("PeerNodeID = %q, true for a client without a certificate", id)
	}
}

func TestRotationWithoutRestart(t *testing.T) {
	ca := newCA(t, "c")
	var cur atomic.Pointer[Identity]
	first := newID(t, ca, "node-a")
	cur.Store(first)
	server := ServerConfig(cur.Load, ca.Pool)
	client := ClientConfig(fixed(newID(t, ca, "node-b")), ca.Pool, "node-a")

	r := handshake(t, server, client)
	mustSucceed(t, r)
	if r.cli.PeerCertificates[0].SerialNumber.Cmp(first.Cert.Leaf.SerialNumber) != 0 {
		t.Fatalf("first handshake did not serve the first certificate")
	}

	second, err := Renew(ca, first, nodeValidity, time.Now())
	if err != nil {
		t.Fatalf("Renew: %v", err)
	}
	cur.Store(second)

	r = handshake(t, server, client)
	mustSucceed(t, r)
	if r.cli.PeerCertificates[0].SerialNumber.Cmp(second.Cert.Leaf.SerialNumber) != 0 {
		t.Fatalf("after rotation the server still serves serial %v, want %v",
			r.cli.PeerCertificates[0].SerialNumber, second.Cert.Leaf.SerialNumber)
	}
}

func TestClientRotation(t *testing.T) {
	ca := newCA(t, "c")
	var cur atomic.Pointer[Identity]
	cur.Store(newID(t, ca, "node-b"))
	server := ServerConfig(fixed(newID(t, ca, "node-a")), ca.Pool)
	client := ClientConfig(cur.Load, ca.Pool, "")

	mustSucceed(t, handshake(t, server, client))
	next := newID(t, ca, "node-b")
	cur.Store(next)
	r := handshake(t, server, client)
	mustSucceed(t, r)
	if r.srv.PeerCertificates[0].SerialNumber.Cmp(next.Cert.Leaf.SerialNumber) != 0 {
		t.Fatalf("client did not present its rotated certificate")
	}
}

func TestPoolRotation(t *testing.T) {
	// The pool getter is read per handshake: a server that starts trusting
	// a second CA accepts its nodes without a restart.
	ca, ca2 := newCA(t, "c"), newCA(t, "c")
	var pool atomic.Pointer[x509.CertPool]
	pool.Store(ca.Pool())
	server := ServerConfig(fixed(newID(t, ca, "node-a")), pool.Load)
	client := ClientConfig(fixed(newID(t, ca2, "node-b")), ca.Pool, "")

	if r := handshake(t, server, client); r.srvErr == nil {
		t.Fatalf("server accepted a client of a CA it does not trust yet")
	}
	both := ca.Pool()
	both.AddCert(ca2.Cert())
	pool.Store(both)
	r := handshake(t, server, client)
	mustSucceed(t, r)
	if id, ok := PeerNodeID(r.srv); !ok || id != "node-b" {
		t.Fatalf("PeerNodeID = %q, %v", id, ok)
	}
}

func TestExpiredRejected(t *testing.T) {
	ca := newCA(t, "c")
	old := t0.Add(-48 * time.Hour)
	expired, err := ca.NewIdentity("node-x", nil, time.Hour, old)
	if err != nil {
		t.Fatalf("NewIdentity: %v", err)
	}
	fresh := newID(t, ca, "node-a")

	t.Run("expired server", func(t *testing.T) {
		r := handshake(t, ServerConfig(fixed(expired), ca.Pool), ClientConfig(fixed(fresh), ca.Pool, ""))
		if r.cliErr == nil || !strings.Contains(r.cliErr.Error(), "expired") {
			t.Fatalf("client error = %v, want an expiry error", r.cliErr)
		}
	})
	t.Run("expired server at join", func(t *testing.T) {
		jc, _ := JoinClientConfig(ca.Fingerprint())
		r := handshake(t, ServerConfig(fixed(expired), ca.Pool), jc)
		if r.cliErr == nil || !strings.Contains(r.cliErr.Error(), "expired") {
			t.Fatalf("client error = %v, want an expiry error", r.cliErr)
		}
	})
	t.Run("expired client", func(t *testing.T) {
		r := handshake(t, ServerConfig(fixed(fresh), ca.Pool), ClientConfig(fixed(expired), ca.Pool, ""))
		if r.srvErr == nil || !strings.Contains(r.srvErr.Error(), "expired") {
			t.Fatalf("server error = %v, want an expiry error", r.srvErr)
		}
	})
	t.Run("clock moved past NotAfter", func(t *testing.T) {
		future := func() time.Time { return fresh.NotAfter.Add(time.Minute) }
		sc := ServerConfig(fixed(fresh), ca.Pool)
		cc := ClientConfig(fixed(newID(t, ca, "node-b")), ca.Pool, "")
		cc.Time = future
		if r := handshake(t, sc, cc); r.cliErr == nil {
			t.Fatalf("client accepted a server certificate past its NotAfter")
		}
		sc.Time = future
		cc.Time = nil
		if r := handshake(t, sc, cc); r.srvErr == nil {
			t.Fatalf("server accepted a client certificate past its NotAfter")
		}
	})
	t.Run("not yet valid", func(t *testing.T) {
		early, err := ca.NewIdentity("node-y", nil, time.Hour, t0.Add(24*time.Hour))
		if err != nil {
			t.Fatalf("NewIdentity: %v", err)
		}
		r := handshake(t, ServerConfig(fixed(early), ca.Pool), ClientConfig(fixed(fresh), ca.Pool, ""))
		if r.cliErr == nil {
			t.Fatalf("client accepted a certificate that is not valid yet")
		}
	})
}

func TestTLS12Refused(t *testing.T) {
	ca := newCA(t, "c")
	a, b := newID(t, ca, "node-a"), newID(t, ca, "node-b")
	cc := ClientConfig(fixed(b), ca.Pool, "")
	cc.MinVersion, cc.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
	if r := handshake(t, ServerConfig(fixed(a), ca.Pool), cc); r.srvErr == nil {
		t.Fatalf("server accepted TLS 1.2")
	}
}

func TestNoIdentity(t *testing.T) {
	ca := newCA(t, "c")
	none := func() *Identity { return nil }
	r := handshake(t, ServerConfig(none, ca.Pool), ClientConfig(fixed(newID(t, ca, "b")), ca.Pool, ""))
	if !errors.Is(r.srvErr, ErrNoIdentity) {
		t.Fatalf("server error = %v, want ErrNoIdentity", r.srvErr)
	}
	r = handshake(t, ServerConfig(fixed(newID(t, ca, "a")), ca.Pool), ClientConfig(none, ca.Pool, ""))
	if r.cliErr == nil {
		t.Fatalf("client without identity completed a member handshake")
	}
}

func TestLoopbackTCP(t *testing.T) {
	// The same configs over a real socket, as statd will use them.
	ca := newCA(t, "c")
	a, b := newID(t, ca, "node-a"), newID(t, ca, "node-b")
	ln, err := tls.Listen("tcp", "127.0.0.1:0", ServerConfig(fixed(a), ca.Pool))
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	defer ln.Close()
	got := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- "accept: " + err.Error()
			return
		}
		defer c.Close()
		tc := c.(*tls.Conn)
		_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
		if err := tc.Handshake(); err != nil {
			got <- "handshake: " + err.Error()
			return
		}
		id, _ := PeerNodeID(tc.ConnectionState())
		_, _ = tc.Write([]byte("ok"))
		got <- id
	}()
	d := &net.Dialer{Timeout: 10 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", ln.Addr().String(), ClientConfig(fixed(b), ca.Pool, "node-a"))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.Close()
	buf := make([]byte, 2)
	if _, err := c.Read(buf); err != nil {
		t.Fatalf("read: %v", err)
	}
	if id := <-got; id != "node-b" {
		t.Fatalf("server saw peer %q, want node-b", id)
	}
}
