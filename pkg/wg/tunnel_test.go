package wg

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/shoal-dev/shoal/pkg/overlay"
)

const wgPort = 51820

var overlayCIDR = netip.MustParsePrefix("10.42.0.0/16")

// node is one simulated machine: a network namespace with an underlay
// address on ul0, a bridge shoal0 with its subnet's .1, and a userspace
// WireGuard device whose holder a netd stand-in (netd-sim) started.
type node struct {
	ns     string
	nl     *Netlink
	iface  string
	under  netip.Prefix
	subnet netip.Prefix
	key    wgtypes.Key
	dev    *Device
	holder int
	sim    *exec.Cmd
}

func (n *node) gw() netip.Addr { return n.subnet.Addr().Next() }

func (n *node) peer() overlay.Peer {
	return overlay.Peer{
		PublicKey:  n.key.PublicKey(),
		Endpoint:   netip.AddrPortFrom(n.under.Addr(), wgPort),
		AllowedIPs: []netip.Prefix{n.subnet},
	}
}

// startSim starts netd-sim for n, which starts n's holder detached and
// reports its pid.
func startSim(t *testing.T, n *node, mtu int) {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), n.iface+".log")
	cmd := exec.Command(selfExe(t), "netd-sim", n.ns, n.iface, strconv.Itoa(mtu), logPath)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // killed as a group, like a daemon's
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n.sim = cmd
	t.Cleanup(func() { killSim(n) })
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(out).ReadString('\n')
		line <- strings.TrimSpace(s)
	}()
	select {
	case s := <-line:
		pid, err := strconv.Atoi(s)
		if err != nil {
			b, _ := os.ReadFile(logPath)
			t.Fatalf("netd-sim: %s\nholder log:\n%s", s, b)
		}
		n.holder = pid
		stopHolderAtCleanup(t, n.iface, pid)
	case <-time.After(15 * time.Second):
		t.Fatal("netd-sim: no pid")
	}
}

// killSim kills netd-sim's whole process group, as a crash or a
// `systemctl kill` of a daemon would.
func killSim(n *node) {
	if n.sim == nil {
		return
	}
	_ = unix.Kill(-n.sim.Process.Pid, unix.SIGKILL)
	_ = n.sim.Wait()
	n.sim = nil
}

func setupNode(t *testing.T, n *node) {
	t.Helper()
	if err := n.nl.ReplaceAddr("ul0", n.under); err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{"ul0", "lo"} {
		if err := n.nl.SetLinkUp(l, 0); err != nil {
			t.Fatal(err)
		}
	}
}

// newPair builds two nodes joined by a veth and a WireGuard tunnel.
func newPair(t *testing.T) (a, b *node) {
	t.Helper()
	a = &node{under: netip.MustParsePrefix("172.31.0.1/24"), subnet: netip.MustParsePrefix("10.42.1.0/24"), iface: ifName("a")}
	b = &node{under: netip.MustParsePrefix("172.31.0.2/24"), subnet: netip.MustParsePrefix("10.42.2.0/24"), iface: ifName("b")}
	a.ns, b.ns = newNetns(t), newNetns(t)
	a.nl, b.nl = openNetlink(t, a.ns), openNetlink(t, b.ns)
	if err := a.nl.AddVeth("ul0", "ul0", b.ns, 1500); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.nl.DeleteLink("ul0") })
	setupNode(t, a)
	setupNode(t, b)
	under, err := a.nl.RouteMTU(b.under.Addr())
	if err != nil {
		t.Fatal(err)
	}
	mtu := overlay.MTU(under)
	if mtu != 1420 {
		t.Fatalf("overlay MTU %d from underlay %d", mtu, under)
	}
	dir := t.TempDir()
	for _, n := range []*node{a, b} {
		if err := n.nl.EnsureBridge("shoal0", netip.PrefixFrom(n.gw(), 24), mtu); err != nil {
			t.Fatal(err)
		}
		startSim(t, n, mtu)
		if n.key, err = LoadOrCreateKey(filepath.Join(dir, n.iface+".key")); err != nil {
			t.Fatal(err)
		}
		if n.dev, err = Open(n.iface); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.dev.Close() })
		if err := n.dev.SetPrivateKey(n.key); err != nil {
			t.Fatal(err)
		}
		if err := n.dev.SetListenPort(wgPort); err != nil {
			t.Fatal(err)
		}
		if err := n.nl.SetLinkUp(n.iface, mtu); err != nil {
			t.Fatal(err)
		}
		if err := n.nl.ReplaceRoute(overlayCIDR, n.iface, n.gw()); err != nil {
			t.Fatal(err)
		}
		if err := InNetns(n.ns, EnableIPv4Forwarding); err != nil {
			t.Fatal(err)
		}
	}
	return a, b
}

func applyPeers(t *testing.T, n *node, desired ...overlay.Peer) []wgtypes.PeerConfig {
	t.Helper()
	cfgs, err := n.dev.ApplyPeers(desired)
	if err != nil {
		t.Fatal(err)
	}
	return cfgs
}

func peersOf(t *testing.T, n *node) map[wgtypes.Key]PeerStatus {
	t.Helper()
	ps, err := n.dev.Peers()
	if err != nil {
		t.Fatal(err)
	}
	out := map[wgtypes.Key]PeerStatus{}
	for _, p := range ps {
		out[p.PublicKey] = p
	}
	return out
}

func TestTunnel(t *testing.T) {
	requireRoot(t)
	start := time.Now().Add(-time.Second) // handshake times have second-ish granularity
	a, b := newPair(t)

	if cfgs := applyPeers(t, a, b.peer(), a.peer()); len(cfgs) != 1 || cfgs[0].UpdateOnly || cfgs[0].PublicKey != b.key.PublicKey() {
		t.Fatalf("first apply on a (own key listed too): %+v", cfgs)
	}
	applyPeers(t, b, a.peer())

	ok := t.Run("ping", func(t *testing.T) {
		ping(t, a.ns, b.gw().String())
		ping(t, b.ns, a.gw().String())
		// A task behind a's bridge reaches b through a's forwarding.
		task := newNetns(t)
		veth := "vt" + tag + "a"
		if err := a.nl.AddTaskVeth(veth, "shoal0", task, 1420); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.nl.DeleteLink(veth) })
		if err := ConfigureTaskNetns(task, netip.MustParsePrefix("10.42.1.2/24"), a.gw(), 1420); err != nil {
			t.Fatal(err)
		}
		ping(t, task, b.gw().String())
		ping(t, b.ns, "10.42.1.2")
	})
	ok = ok && t.Run("status", func(t *testing.T) {
		for _, pair := range [][2]*node{{a, b}, {b, a}} {
			self, other := pair[0], pair[1]
			ps := peersOf(t, self)
			p, found := ps[other.key.PublicKey()]
			if len(ps) != 1 || !found {
				t.Fatalf("peers %v", ps)
			}
			if p.LastHandshake.Before(start) || p.LastHandshake.After(time.Now().Add(time.Second)) {
				t.Fatalf("last handshake %v (test started %v)", p.LastHandshake, start)
			}
			if p.RxBytes == 0 || p.TxBytes == 0 {
				t.Fatalf("counters rx %d tx %d", p.RxBytes, p.TxBytes)
			}
			if p.Endpoint != netip.AddrPortFrom(other.under.Addr(), wgPort) {
				t.Fatalf("endpoint %v", p.Endpoint)
			}
			if len(p.AllowedIPs) != 1 || p.AllowedIPs[0] != other.subnet {
				t.Fatalf("allowed %v", p.AllowedIPs)
			}
		}
	})
	ok = ok && t.Run("reapply-is-noop", func(t *testing.T) {
		before := peersOf(t, a)[b.key.PublicKey()]
		if cfgs := applyPeers(t, a, b.peer()); len(cfgs) != 0 {
			t.Fatalf("re-apply changed %+v", cfgs)
		}
		if err := a.dev.SetPrivateKey(a.key); err != nil {
			t.Fatal(err)
		}
		if err := a.dev.SetListenPort(wgPort); err != nil {
			t.Fatal(err)
		}
		after := peersOf(t, a)[b.key.PublicKey()]
		if !after.LastHandshake.Equal(before.LastHandshake) || after.RxBytes < before.RxBytes {
			t.Fatalf("session disturbed: %+v → %+v", before, after)
		}
		ping(t, a.ns, b.gw().String())
		if again := peersOf(t, a)[b.key.PublicKey()]; !again.LastHandshake.Equal(before.LastHandshake) || again.TxBytes <= after.TxBytes {
			t.Fatalf("ping after re-apply: %+v → %+v", after, again)
		}
	})
	ok = ok && t.Run("remove-one", func(t *testing.T) {
		ck, _ := wgtypes.GeneratePrivateKey()
		c := overlay.Peer{
			PublicKey:  ck.PublicKey(),
			Endpoint:   netip.MustParseAddrPort("172.31.0.3:51820"),
			AllowedIPs: []netip.Prefix{netip.MustParsePrefix("10.42.3.0/24")},
		}
		if cfgs := applyPeers(t, a, b.peer(), c); len(cfgs) != 1 || cfgs[0].PublicKey != c.PublicKey {
			t.Fatalf("add c: %+v", cfgs)
		}
		if ps := peersOf(t, a); len(ps) != 2 {
			t.Fatalf("peers after adding c: %d", len(ps))
		}
		before := peersOf(t, a)[b.key.PublicKey()]
		cfgs := applyPeers(t, a, b.peer())
		if len(cfgs) != 1 || !cfgs[0].Remove || cfgs[0].PublicKey != c.PublicKey {
			t.Fatalf("remove c: %+v", cfgs)
		}
		ps := peersOf(t, a)
		after, found := ps[b.key.PublicKey()]
		if len(ps) != 1 || !found {
			t.Fatalf("peers after removing c: %v", ps)
		}
		if !after.LastHandshake.Equal(before.LastHandshake) || after.RxBytes < before.RxBytes || after.TxBytes < before.TxBytes {
			t.Fatalf("b disturbed by c's removal: %+v → %+v", before, after)
		}
		ping(t, a.ns, b.gw().String())
	})
	ok = ok && t.Run("no-plaintext-on-underlay", func(t *testing.T) {
		marker := make([]byte, 24)
		rand.Read(marker)
		mark := []byte("SHOAL-" + hex.EncodeToString(marker))

		// Control: the capture does see plaintext sent on the underlay.
		capt := startCapture(t, b.ns, b.nl, "ul0")
		var udp net.Conn
		if err := InNetns(a.ns, func() (err error) {
			udp, err = net.Dial("udp4", netip.AddrPortFrom(b.under.Addr(), 9).String())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		udp.Write(mark)
		udp.Close()
		time.Sleep(100 * time.Millisecond)
		if got := capt.stop(); !bytes.Contains(got, mark) {
			t.Fatalf("control capture (%d bytes) lacks the plaintext marker", len(got))
		}

		// Through the tunnel: encrypted.
		capt = startCapture(t, b.ns, b.nl, "ul0")
		const reps = 200
		got := transfer(t, a, b, func(w io.Writer) {
			for range reps {
				w.Write(mark)
			}
		})
		if got.n != int64(reps*len(mark)) || !bytes.Contains(got.head, mark) {
			t.Fatalf("received %d bytes, want %d with the marker", got.n, reps*len(mark))
		}
		frames := capt.stop()
		if len(frames) < reps*len(mark) {
			t.Fatalf("captured only %d bytes on the underlay", len(frames))
		}
		if bytes.Contains(frames, mark) || bytes.Contains(frames, mark[:16]) {
			t.Fatal("plaintext marker on the underlay")
		}
		t.Logf("captured %d bytes on ul0, no marker", len(frames))
	})
	ok = ok && t.Run("netd-restart-keeps-tunnel", func(t *testing.T) {
		const total, chunk = 24 << 20, 64 << 10
		var written atomic.Int64
		mid := make(chan struct{})
		var finishedEarly atomic.Bool
		done := make(chan result, 1)
		sent := sha256.New()
		go func() {
			done <- transfer(t, a, b, func(w io.Writer) {
				rng := mrand.New(mrand.NewPCG(1, 2))
				buf := make([]byte, chunk)
				for i := 0; i < total/chunk; i++ {
					for j := range buf {
						buf[j] = byte(rng.Uint32())
					}
					if _, err := w.Write(buf); err != nil {
						return
					}
					sent.Write(buf)
					written.Add(chunk)
					if i == 16 {
						close(mid)
					}
					time.Sleep(2 * time.Millisecond)
				}
			})
		}()
		select {
		case <-mid:
		case <-time.After(20 * time.Second):
			t.Fatal("transfer did not get going")
		}
		// netd dies (its process group killed, holders started by it
		// included if they were not detached) and its handles go away...
		for _, n := range []*node{a, b} {
			killSim(n)
			n.dev.Close()
		}
		time.Sleep(100 * time.Millisecond)
		// ...and a new netd finds the same holders and changes nothing.
		for _, n := range []*node{a, b} {
			if pid, err := HolderPID(n.iface); err != nil || pid != n.holder || !HolderAlive(n.iface) {
				t.Fatalf("holder %s: pid %d, %v (was %d)", n.iface, pid, err, n.holder)
			}
			d, err := Open(n.iface)
			if err != nil {
				t.Fatal(err)
			}
			n.dev = d
			if err := d.SetPrivateKey(n.key); err != nil {
				t.Fatal(err)
			}
			if err := d.SetListenPort(wgPort); err != nil {
				t.Fatal(err)
			}
		}
		if cfgs := applyPeers(t, a, b.peer()); len(cfgs) != 0 {
			t.Fatalf("re-apply after restart on a: %+v", cfgs)
		}
		if cfgs := applyPeers(t, b, a.peer()); len(cfgs) != 0 {
			t.Fatalf("re-apply after restart on b: %+v", cfgs)
		}
		w := written.Load()
		if w >= total {
			finishedEarly.Store(true)
		}
		var got result
		select {
		case got = <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("transfer stalled")
		}
		if finishedEarly.Load() {
			t.Fatal("the transfer finished before the restart did; it proves nothing")
		}
		if got.n != total || got.sum != hex.EncodeToString(sent.Sum(nil)) {
			t.Fatalf("received %d bytes (want %d), sum match %v", got.n, total, got.sum == hex.EncodeToString(sent.Sum(nil)))
		}
		t.Logf("%d MiB through the tunnel across a netd restart (%d MiB sent before it)", total>>20, w>>20)
		st := peersOf(t, a)[b.key.PublicKey()]
		if st.TxBytes < total {
			t.Fatalf("a's tx counter %d < %d", st.TxBytes, total)
		}
	})
	_ = ok
}

type result struct {
	n    int64
	sum  string
	head []byte
}

// transfer opens a TCP connection from a's bridge address to b's through
// the tunnel, lets send write to it, and returns what b received.
func transfer(t *testing.T, a, b *node, send func(io.Writer)) result {
	var ln net.Listener
	if err := InNetns(b.ns, func() (err error) {
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(b.gw(), 0).String())
		return err
	}); err != nil {
		t.Error(err)
		return result{}
	}
	defer ln.Close()
	got := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- result{}
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(60 * time.Second))
		h := sha256.New()
		var head bytes.Buffer
		n, _ := io.Copy(io.MultiWriter(h, &limitWriter{&head, 4096}), c)
		got <- result{n: n, sum: hex.EncodeToString(h.Sum(nil)), head: head.Bytes()}
	}()
	var c net.Conn
	if err := InNetns(a.ns, func() (err error) {
		c, err = net.DialTimeout("tcp4", ln.Addr().String(), 5*time.Second)
		return err
	}); err != nil {
		t.Error(err)
		return result{}
	}
	if la := c.LocalAddr().(*net.TCPAddr).AddrPort().Addr(); la != a.gw() {
		t.Errorf("connection from %v, want a's bridge address %v (route src)", la, a.gw())
	}
	send(c)
	c.Close()
	return <-got
}

type limitWriter struct {
	w *bytes.Buffer
	n int
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if room := l.n - l.w.Len(); room > 0 {
		l.w.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

// capture records every frame on one link of a namespace through an
// AF_PACKET socket.
type capture struct {
	fd   int
	quit atomic.Bool
	wg   sync.WaitGroup
	buf  bytes.Buffer
}

func startCapture(t *testing.T, ns string, n *Netlink, link string) *capture {
	t.Helper()
	idx, err := n.LinkIndex(link)
	if err != nil {
		t.Fatal(err)
	}
	c := &capture{fd: -1}
	allProto := int(htons(unix.ETH_P_ALL))
	if err := InNetns(ns, func() (err error) {
		// Protocol 0 receives nothing until bind names the link, so no
		// frame from another link (the tunnel's, in the clear) slips in.
		c.fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		return unix.Bind(c.fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: idx})
	}); err != nil {
		if c.fd >= 0 {
			unix.Close(c.fd)
		}
		t.Fatal(fmt.Errorf("capture socket (proto %#x): %w", allProto, err))
	}
	tv := unix.NsecToTimeval((20 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(c.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	c.wg.Go(func() {
		// Stop only once a read times out after quit: the frames the
		// socket queued while this goroutine lagged behind (a busy
		// machine) are read, not dropped.
		frame := make([]byte, 256<<10)
		for {
			n, _, err := unix.Recvfrom(c.fd, frame, 0)
			if err == nil && n > 0 {
				c.buf.Write(frame[:n])
				continue
			}
			if c.quit.Load() {
				return
			}
		}
	})
	t.Cleanup(func() { c.stop() })
	return c
}

func (c *capture) stop() []byte {
	if c.quit.Swap(true) {
		return c.buf.Bytes()
	}
	c.wg.Wait()
	unix.Close(c.fd)
	return c.buf.Bytes()
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
