package vold

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/pki"
	volv1 "github.com/shoal-dev/shoal/proto/shoal/vol/v1"
)

// countingConn counts the writes that reach the socket.
type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// A large write through a gatheredTLS reaches the socket in one write
// (tls.Conn alone makes one per 16 KiB record), and the peer reads every
// byte in order; the handshake and the close_notify still pass.
func TestGatheredTLSOneSyscallPerWrite(t *testing.T) {
	ca := newTestCA(t)
	srvID, cliID := newTestIdentity(t, ca, "server"), newTestIdentity(t, ca, "client")
	pool := func() *x509.CertPool { return ca.Pool() }
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()

	const size = 1 << 20
	want := make([]byte, 3*size)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range want {
		want[i] = byte(rng.Uint32())
	}
	got := make(chan []byte, 1)
	go func() {
		raw, err := lis.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer raw.Close()
		c := tls.Server(raw, pki.ServerConfig(func() *pki.Identity { return srvID }, pool))
		b, _ := io.ReadAll(c) // until close_notify
		got <- b
	}()

	raw, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	counted := &countingConn{Conn: raw}
	c := newGatheredTLS(counted, pki.ClientConfig(func() *pki.Identity { return cliID }, pool, "server"))
	if err := c.Handshake(); err != nil {
		t.Fatalf("handshake: %v", err)
	}
	for i := 0; i < 3; i++ {
		before := counted.writes.Load()
		n, err := c.Write(want[i*size : (i+1)*size])
		if err != nil || n != size {
			t.Fatalf("Write = %d, %v; want %d, nil", n, err, size)
		}
		if w := counted.writes.Load() - before; w != 1 {
			t.Fatalf("a 1 MiB write reached the socket in %d writes, want 1", w)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("the peer read %d bytes, not the %d written, or not in order", len(b), len(want))
	}
}

// A forwarded 1 MiB write leaves a VolPeer client in a few writes to the
// socket (gRPC's frames gathered under TLS: gatheredCreds and the write
// buffer; with credentials.NewTLS it took 66, about one per TLS record), and the
// server still knows the caller by its certificate.
func TestForwardedWriteReachesTheSocketGathered(t *testing.T) {
	peers := startCluster(t, "a1", "b2")
	var conns []*countingConn
	var mu sync.Mutex
	peers[1].pool.dial = func(ctx context.Context, addr string) (net.Conn, error) {
		raw, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		c := &countingConn{Conn: raw}
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
		return c, nil
	}
	writes := func() (n int64) {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			n += c.writes.Load()
		}
		return n
	}
	api, err := peers[1].pool.client("a1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	payload := bytes.Repeat([]byte{0x5a}, 1<<20)
	for i := 0; i < 4; i++ {
		before := writes()
		resp, err := api.Forward(ctx, &volv1.ForwardRequest{Kind: kindStatus, Payload: payload})
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if string(resp.Payload) != "b2" {
			t.Fatalf("call %d: the server saw caller %q, want b2", i, resp.Payload)
		}
		// The first call also dials and handshakes.
		if w := writes() - before; i > 0 && w > 4 {
			t.Fatalf("call %d: a 1 MiB request took %d writes to the socket, want at most 4", i, w)
		}
	}
}
