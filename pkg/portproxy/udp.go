package portproxy

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// maxDatagram is the largest UDP payload (IPv4, 65535 − 8 − 20, rounded up).
const maxDatagram = 65535

// epoch makes flow activity times monotonic (immune to clock steps).
var epoch = time.Now()

func monoNow() int64 { return int64(time.Since(epoch)) }

// udpSocket is a published UDP port on one node address. Each client
// address gets a flow: a connected socket to one backend, whose answers go
// back to the client from this socket (the address the client sent to).
type udpSocket struct {
	pt *entry
	pc *net.UDPConn

	mu     sync.Mutex
	closed bool
	flows  map[netip.AddrPort]*flow
}

type flow struct {
	client  netip.AddrPort
	backend netip.AddrPort
	conn    *net.UDPConn
	last    atomic.Int64 // monoNow of the last datagram either way
	ended   bool         // guarded by udpSocket.mu
}

func (u *udpSocket) close() {
	u.mu.Lock()
	u.closed = true
	flows := make([]*flow, 0, len(u.flows))
	for _, f := range u.flows {
		flows = append(flows, f)
	}
	u.mu.Unlock()
	u.pc.Close()
	for _, f := range flows {
		u.end(f, nil)
	}
}

func (u *udpSocket) serve() {
	p := u.pt.p
	defer p.wg.Done()
	buf := make([]byte, maxDatagram)
	var backoff time.Duration
	for {
		n, client, err := u.pc.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			p.log.Warn("udp read", "addr", u.pc.LocalAddr(), "err", err, "retry_in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		client = netip.AddrPortFrom(client.Addr().Unmap(), client.Port())
		f := u.flowFor(client)
		if f == nil {
			continue // dropped: no backend, too many flows, or closing
		}
		f.last.Store(monoNow())
		if _, err := f.conn.Write(buf[:n]); err != nil {
			// Typically ECONNREFUSED left by an ICMP unreachable: end the
			// flow, the client's next datagram picks another backend.
			u.end(f, err)
		}
	}
}

// flowFor returns the client's flow, creating it (and picking its backend)
// if there is none; nil drops the datagram.
func (u *udpSocket) flowFor(client netip.AddrPort) *flow {
	pt, p := u.pt, u.pt.p
	u.mu.Lock()
	defer u.mu.Unlock()
	if f := u.flows[client]; f != nil {
		return f
	}
	if u.closed {
		return nil
	}
	if pt.active.Load() >= int64(p.cfg.UDPMaxFlows) {
		p.log.Debug("udp flow limit reached, datagram dropped", "port", pt.port, "client", client)
		return nil
	}
	for _, b := range pt.order() {
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(b))
		if err != nil {
			pt.markFailed(b)
			p.log.Debug("udp backend", "port", pt.port, "backend", b, "err", err)
			continue
		}
		f := &flow{client: client, backend: b, conn: c}
		f.last.Store(monoNow())
		u.flows[client] = f
		pt.active.Add(1)
		p.wg.Add(1)
		go u.reply(f)
		return f
	}
	return nil
}

// reply copies the backend's datagrams back to the client until the flow
// has been idle for UDPIdleTimeout, fails, or is closed.
func (u *udpSocket) reply(f *flow) {
	p := u.pt.p
	defer p.wg.Done()
	idle := p.cfg.UDPIdleTimeout
	buf := make([]byte, maxDatagram)
	var err error
	for {
		f.conn.SetReadDeadline(epoch.Add(time.Duration(f.last.Load()) + idle))
		n, rerr := f.conn.Read(buf)
		if rerr != nil {
			if errors.Is(rerr, os.ErrDeadlineExceeded) && time.Duration(monoNow()-f.last.Load()) < idle {
				continue // the client sent something meanwhile
			}
			err = rerr
			break
		}
		f.last.Store(monoNow())
		if _, werr := u.pc.WriteToUDPAddrPort(buf[:n], f.client); errors.Is(werr, net.ErrClosed) {
			break
		}
	}
	u.end(f, err)
}

// end removes and closes a flow (once). An ICMP-refused backend is marked
// failed so the next flows avoid it.
func (u *udpSocket) end(f *flow, err error) {
	u.mu.Lock()
	if f.ended {
		u.mu.Unlock()
		return
	}
	f.ended = true
	if u.flows[f.client] == f {
		delete(u.flows, f.client)
	}
	u.mu.Unlock()
	u.pt.active.Add(-1)
	f.conn.Close()
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) {
		u.pt.markFailed(f.backend)
		u.pt.p.log.Debug("udp backend unreachable", "port", u.pt.port, "backend", f.backend, "err", err)
	}
}
