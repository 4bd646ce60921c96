package portproxy

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

var lo = netip.MustParseAddr("127.0.0.1")

// echoServer accepts TCP connections, greets each with "<name>\n" and then
// echoes, half-closing when the client does.
type echoServer struct {
	name     string
	addr     netip.AddrPort
	ln       net.Listener
	accepted atomic.Int64
}

func newEcho(t *testing.T, name string) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echoServer{name: name, addr: ln.Addr().(*net.TCPAddr).AddrPort(), ln: ln}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.accepted.Add(1)
			wg.Go(func() {
				defer c.Close()
				fmt.Fprintf(c, "%s\n", name)
				io.Copy(c, c)
				c.(*net.TCPConn).CloseWrite()
			})
		}
	})
	return e
}

// freePort returns a port free for TCP and UDP on 127.0.0.1.
func freePort(t *testing.T) uint16 {
	t.Helper()
	for range 20 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := pc.LocalAddr().(*net.UDPAddr).Port
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		pc.Close()
		if err == nil {
			ln.Close()
			return uint16(port)
		}
	}
	t.Fatal("no free port")
	return 0
}

func newProxy(t *testing.T, cfg Config) *Proxy {
	t.Helper()
	p := New(cfg)
	t.Cleanup(func() { p.Close() })
	if err := p.Listen(lo); err != nil {
		t.Fatal(err)
	}
	return p
}

type client struct {
	net.Conn
	r    *bufio.Reader
	name string // the backend's greeting
}

func dial(t *testing.T, port uint16) *client {
	t.Helper()
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	name, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("greeting through port %d: %v", port, err)
	}
	return &client{Conn: c, r: r, name: strings.TrimSpace(name)}
}

// echo checks that a line goes through and comes back.
func (c *client) echo(t *testing.T, s string) {
	t.Helper()
	if _, err := fmt.Fprintf(c, "%s\n", s); err != nil {
		t.Fatal(err)
	}
	got, err := c.r.ReadString('\n')
	if err != nil || strings.TrimSpace(got) != s {
		t.Fatalf("echo via %s: %q, %v", c.name, got, err)
	}
}

func TestRoundRobin(t *testing.T) {
	a, b, c := newEcho(t, "a"), newEcho(t, "b"), newEcho(t, "c")
	p := newProxy(t, Config{})
	port := freePort(t)
	if err := p.Set(port, TCP, []netip.AddrPort{a.addr, b.addr, c.addr}); err != nil {
		t.Fatal(err)
	}
	var got []string
	for i := range 9 {
		cl := dial(t, port)
		cl.echo(t, fmt.Sprint("hello ", i))
		got = append(got, cl.name)
		cl.Close()
	}
	if want := strings.Split("a b c a b c a b c", " "); !slices.Equal(got, want) {
		t.Fatalf("backends %v, want %v", got, want)
	}
	st := p.Ports()
	if len(st) != 1 || st[0].Port != port || st[0].Proto != TCP ||
		!slices.Equal(st[0].Backends, []netip.AddrPort{a.addr, b.addr, c.addr}) ||
		!slices.Equal(st[0].Bound, []netip.AddrPort{netip.AddrPortFrom(lo, port)}) || st[0].BindErrors != nil {
		t.Fatalf("Ports() = %+v", st)
	}
}

func TestRemovedBackendKeepsEstablished(t *testing.T) {
	a, b := newEcho(t, "a"), newEcho(t, "b")
	p := newProxy(t, Config{})
	port := freePort(t)
	if err := p.Set(port, TCP, []netip.AddrPort{a.addr, b.addr}); err != nil {
		t.Fatal(err)
	}
	est := dial(t, port)
	if est.name != "a" {
		t.Fatalf("first connection went to %s", est.name)
	}
	est.echo(t, "before")
	// a turns unhealthy.
	if err := p.Set(port, TCP, []netip.AddrPort{b.addr}); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if cl := dial(t, port); cl.name != "b" {
			t.Fatalf("new connection %d went to removed backend %s", i, cl.name)
		}
	}
	if n := a.accepted.Load(); n != 1 {
		t.Fatalf("removed backend accepted %d connections, want 1", n)
	}
	est.echo(t, "after") // established connection unaffected
	if got := p.Ports()[0].Active; got != 6 {
		t.Fatalf("Active = %d, want 6", got)
	}
}

// deadAddr returns a loopback address where nothing listens.
func deadAddr(t *testing.T) netip.AddrPort {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ap := ln.Addr().(*net.TCPAddr).AddrPort()
	ln.Close()
	return ap
}

// stuckAddr returns a loopback address whose listener never accepts and
// whose accept queue is full: connecting to it times out (the kernel drops
// the SYNs), like a replica on a host that went away.
func stuckAddr(t *testing.T) netip.AddrPort {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	ap := netip.AddrPortFrom(lo, uint16(sa.(*syscall.SockaddrInet4).Port))
	for range 8 {
		c, err := net.DialTimeout("tcp", ap.String(), 50*time.Millisecond)
		if err != nil {
			return ap // the queue is full
		}
		t.Cleanup(func() { c.Close() })
	}
	t.Skip("cannot fill a listen queue here")
	return ap
}

func TestDeadBackendSkipped(t *testing.T) {
	a, b := newEcho(t, "a"), newEcho(t, "b")
	p := newProxy(t, Config{DialTimeout: 100 * time.Millisecond})
	port := freePort(t)
	// A refusing backend fails at once, a stuck one after DialTimeout.
	if err := p.Set(port, TCP, []netip.AddrPort{deadAddr(t), a.addr, stuckAddr(t), b.addr}); err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	t0 := time.Now()
	for i := range 8 {
		cl := dial(t, port)
		cl.echo(t, fmt.Sprint(i))
		count[cl.name]++
	}
	el := time.Since(t0)
	// Each dead backend costs at most one failed dial (then FailCooldown),
	// and the live ones share the rest evenly.
	if count["a"] != 4 || count["b"] != 4 {
		t.Fatalf("connections per backend %v, want a:4 b:4", count)
	}
	if el > time.Second {
		t.Fatalf("8 connections took %v", el)
	}
	t.Logf("8 connections past 2 dead backends in %v", el.Round(time.Millisecond))

	// With no live backend the client is reset, not left hanging.
	if err := p.Set(port, TCP, []netip.AddrPort{deadAddr(t)}); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if errors.Is(err, syscall.ECONNRESET) {
		return // the reset beat the end of connect(2)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read with no backend: %v, want connection reset", err)
	}
}

// udpEcho answers each datagram with "<name>:<datagram>".
func udpEcho(t *testing.T, name string) netip.AddrPort {
	pc, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { pc.Close(); <-done })
	go func() {
		defer close(done)
		buf := make([]byte, 65535)
		for {
			n, from, err := pc.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			pc.WriteToUDPAddrPort(append([]byte(name+":"), buf[:n]...), from)
		}
	}()
	return pc.LocalAddr().(*net.UDPAddr).AddrPort()
}

// udpAsk sends msg and returns the answer, retrying a few times (UDP).
func udpAsk(t *testing.T, c *net.UDPConn, msg string) string {
	t.Helper()
	buf := make([]byte, 65535)
	for range 10 {
		if _, err := c.Write([]byte(msg)); err != nil && !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		n, err := c.Read(buf)
		if err == nil {
			return string(buf[:n])
		}
	}
	t.Fatalf("no answer to %q", msg)
	return ""
}

func udpClient(t *testing.T, port uint16) *net.UDPConn {
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(lo, port)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestUDP(t *testing.T) {
	a, b := udpEcho(t, "a"), udpEcho(t, "b")
	p := newProxy(t, Config{UDPIdleTimeout: 300 * time.Millisecond})
	port := freePort(t)
	if err := p.Set(port, UDP, []netip.AddrPort{a, b}); err != nil {
		t.Fatal(err)
	}
	c1, c2 := udpClient(t, port), udpClient(t, port)
	// Each client is a flow pinned to one backend; flows go round-robin.
	for i := range 5 {
		if got, want := udpAsk(t, c1, fmt.Sprint("one ", i)), fmt.Sprint("a:one ", i); got != want {
			t.Fatalf("c1: %q, want %q", got, want)
		}
		if got, want := udpAsk(t, c2, fmt.Sprint("two ", i)), fmt.Sprint("b:two ", i); got != want {
			t.Fatalf("c2: %q, want %q", got, want)
		}
	}
	// A large datagram goes through whole.
	big := strings.Repeat("x", 60000)
	if got := udpAsk(t, c1, big); got != "a:"+big {
		t.Fatalf("60000-byte datagram came back as %d bytes", len(got))
	}
	if n := p.Ports()[0].Active; n != 2 {
		t.Fatalf("Active = %d, want 2 flows", n)
	}
	// Idle flows are closed.
	waitFor(t, 3*time.Second, "idle flows closed", func() bool { return p.Ports()[0].Active == 0 })

	// A dead backend answers with ICMP unreachable: the flow ends and the
	// client's retry lands on a live backend.
	dead := netip.AddrPortFrom(lo, deadAddr(t).Port())
	if err := p.Set(port, UDP, []netip.AddrPort{dead, b}); err != nil {
		t.Fatal(err)
	}
	c3 := udpClient(t, port)
	if got := udpAsk(t, c3, "three"); got != "b:three" {
		t.Fatalf("c3: %q", got)
	}
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestPortConflict(t *testing.T) {
	a := newEcho(t, "a")
	p := newProxy(t, Config{})
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	busy := uint16(taken.Addr().(*net.TCPAddr).Port)
	free := freePort(t)

	err = p.Set(busy, TCP, []netip.AddrPort{a.addr})
	var be *BindError
	if !errors.As(err, &be) || !errors.Is(err, syscall.EADDRINUSE) || be.Port != busy || be.Addr != lo {
		t.Fatalf("Set on a taken port: %v", err)
	}
	if msg := err.Error(); !strings.Contains(msg, fmt.Sprintf("%d/tcp", busy)) || !strings.Contains(msg, "address already in use") {
		t.Fatalf("unclear error %q", msg)
	}
	t.Logf("error: %v", err)
	// Other ports work.
	if err := p.Set(free, TCP, []netip.AddrPort{a.addr}); err != nil {
		t.Fatal(err)
	}
	dial(t, free).echo(t, "fine")
	st := p.Ports()
	byPort := map[uint16]PortStatus{st[0].Port: st[0], st[1].Port: st[1]}
	if s := byPort[busy]; len(s.Bound) != 0 || s.BindErrors[lo] == nil {
		t.Fatalf("busy port status %+v", s)
	}
	if s := byPort[free]; len(s.Bound) != 1 || s.BindErrors != nil {
		t.Fatalf("free port status %+v", s)
	}
	// Once the port is released, the next Set binds it.
	taken.Close()
	if err := p.Set(busy, TCP, []netip.AddrPort{a.addr}); err != nil {
		t.Fatalf("Set after the port came free: %v", err)
	}
	dial(t, busy).echo(t, "now")
}

func TestListenAddsAddressesAndRemove(t *testing.T) {
	a := newEcho(t, "a")
	p := newProxy(t, Config{})
	port := freePort(t)
	if err := p.Set(port, TCP, []netip.AddrPort{a.addr}); err != nil {
		t.Fatal(err)
	}
	// A second node address binds the ports published so far.
	lo2 := netip.MustParseAddr("127.0.0.2")
	if err := p.Listen(lo2); err != nil {
		if errors.Is(err, syscall.EADDRNOTAVAIL) {
			t.Skip("127.0.0.2 not usable here")
		}
		t.Fatal(err)
	}
	if err := p.Listen(lo2); err != nil {
		t.Fatalf("second Listen of the same address: %v", err)
	}
	c, err := net.Dial("tcp", netip.AddrPortFrom(lo2, port).String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := p.Ports()[0].Bound; len(got) != 2 {
		t.Fatalf("Bound = %v", got)
	}
	est := dial(t, port)
	// Remove frees the port everywhere; established connections go on.
	p.Remove(port, TCP)
	if len(p.Ports()) != 0 {
		t.Fatalf("Ports after Remove: %+v", p.Ports())
	}
	for _, addr := range []netip.Addr{lo, lo2} {
		if c, err := net.Dial("tcp", netip.AddrPortFrom(addr, port).String()); err == nil {
			c.Close()
			t.Fatalf("%s:%d still accepts after Remove", addr, port)
		}
	}
	est.echo(t, "still here")
}

func TestClose(t *testing.T) {
	a := newEcho(t, "a")
	u := udpEcho(t, "u")
	p := New(Config{})
	if err := p.Listen(lo); err != nil {
		t.Fatal(err)
	}
	tp, up := freePort(t), freePort(t)
	if err := p.Set(tp, TCP, []netip.AddrPort{a.addr}); err != nil {
		t.Fatal(err)
	}
	if err := p.Set(up, UDP, []netip.AddrPort{u}); err != nil {
		t.Fatal(err)
	}
	est := dial(t, tp)
	udpAsk(t, udpClient(t, up), "x")

	done := make(chan struct{})
	go func() { p.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close hangs")
	}
	if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", tp)); err == nil {
		c.Close()
		t.Fatal("TCP port still accepts after Close")
	}
	// The ports are free again.
	for _, bind := range []func() (io.Closer, error){
		func() (io.Closer, error) { return net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", tp)) },
		func() (io.Closer, error) { return net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", up)) },
	} {
		c, err := bind()
		if err != nil {
			t.Fatalf("port still bound after Close: %v", err)
		}
		c.Close()
	}
	// Connections are closed too.
	est.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := est.r.ReadByte(); err == nil {
		t.Fatal("established connection still open after Close")
	}
	if err := p.Set(tp, TCP, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Set after Close: %v", err)
	}
	if err := p.Listen(lo); !errors.Is(err, ErrClosed) {
		t.Fatalf("Listen after Close: %v", err)
	}
	if len(p.Ports()) != 0 {
		t.Fatal("ports after Close")
	}
	p.Close()
}

func TestLargeTransferIntact(t *testing.T) {
	a := newEcho(t, "a")
	p := newProxy(t, Config{})
	port := freePort(t)
	if err := p.Set(port, TCP, []netip.AddrPort{a.addr}); err != nil {
		t.Fatal(err)
	}
	const size = 20 << 20
	data := make([]byte, size)
	rand.NewChaCha8([32]byte{1, 2, 3}).Read(data)
	want := sha256.Sum256(data)

	cl := dial(t, port)
	cl.SetDeadline(time.Now().Add(20 * time.Second))
	t0 := time.Now()
	werr := make(chan error, 1)
	go func() {
		// Write everything, then half-close: the echo server sees EOF only
		// if the proxy passes the half-close on, and the answer must still
		// come back in full after it.
		_, err := io.Copy(cl, bytes.NewReader(data))
		if err == nil {
			err = cl.Conn.(*net.TCPConn).CloseWrite()
		}
		werr <- err
	}()
	h := sha256.New()
	n, err := io.Copy(h, cl.r)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	el := time.Since(t0)
	if n != size || !bytes.Equal(h.Sum(nil), want[:]) {
		t.Fatalf("got %d bytes, sha256 %x; want %d bytes, %x", n, h.Sum(nil), size, want)
	}
	t.Logf("20 MiB echoed through the proxy intact in %v (%.0f MiB/s each way)", el.Round(time.Millisecond), 20/el.Seconds())
}

func TestSetValidation(t *testing.T) {
	p := New(Config{})
	defer p.Close()
	good := []netip.AddrPort{netip.MustParseAddrPort("10.42.1.2:80")}
	for _, c := range []struct {
		port     uint16
		proto    Proto
		backends []netip.AddrPort
	}{
		{0, TCP, good},
		{80, "sctp", good},
		{80, TCP, []netip.AddrPort{{}}},
		{80, TCP, []netip.AddrPort{netip.MustParseAddrPort("10.42.1.2:0")}},
	} {
		if err := p.Set(c.port, c.proto, c.backends); err == nil {
			t.Errorf("Set(%d, %q, %v) succeeded", c.port, c.proto, c.backends)
		}
	}
	if err := p.Listen(netip.Addr{}); err == nil {
		t.Error("Listen(invalid) succeeded")
	}
	// Without addresses nothing is bound, but the port is recorded, and
	// duplicates collapse.
	if err := p.Set(80, TCP, append(good, good...)); err != nil {
		t.Fatal(err)
	}
	if st := p.Ports(); len(st) != 1 || len(st[0].Bound) != 0 || !slices.Equal(st[0].Backends, good) {
		t.Fatalf("Ports() = %+v", st)
	}
}
