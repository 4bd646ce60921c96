package portproxy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Proto is a published port's transport.
type Proto string

// Transports.
const (
	TCP Proto = "tcp"
	UDP Proto = "udp"
)

// Defaults for Config.
const (
	DefaultDialTimeout    = time.Second
	DefaultFailCooldown   = 5 * time.Second
	DefaultUDPIdleTimeout = 60 * time.Second
	DefaultUDPMaxFlows    = 1024
)

// ErrClosed is returned by calls on a closed Proxy.
var ErrClosed = errors.New("portproxy: closed")

// Config configures a Proxy. Zero values take the defaults.
type Config struct {
	// DialTimeout bounds connecting to one backend before the next is
	// tried. Default 1s.
	DialTimeout time.Duration
	// FailCooldown is how long a backend that failed is tried only after
	// the others. Default 5s.
	FailCooldown time.Duration
	// UDPIdleTimeout closes a UDP flow without traffic. Default 60s.
	UDPIdleTimeout time.Duration
	// UDPMaxFlows bounds the UDP flows per port (each holds a socket);
	// datagrams that would open more are dropped. Default 1024.
	UDPMaxFlows int
	// Logger; nil discards.
	Logger *slog.Logger
}

// BindError is a published port that could not be bound on a node address.
type BindError struct {
	Port  uint16
	Proto Proto
	Addr  netip.Addr
	Err   error
}

func (e *BindError) Error() string {
	return fmt.Sprintf("portproxy: cannot publish %d/%s on %s: %v", e.Port, e.Proto, e.Addr, e.Err)
}

func (e *BindError) Unwrap() error { return e.Err }

// PortStatus describes one published port (see Proxy.Ports).
type PortStatus struct {
	Port     uint16
	Proto    Proto
	Backends []netip.AddrPort
	// Bound lists the node addresses the port listens on.
	Bound []netip.AddrPort
	// BindErrors holds the node addresses where binding failed, with why.
	BindErrors map[netip.Addr]error
	// Active counts the port's open TCP connections (including those still
	// connecting to a backend) or UDP flows.
	Active int
}

// Proxy forwards published ports to backends. It is safe for concurrent use.
type Proxy struct {
	cfg Config
	log *slog.Logger

	ctx    context.Context // cancelled by Close: aborts dials
	cancel context.CancelFunc
	wg     sync.WaitGroup // every goroutine the proxy started

	mu     sync.Mutex // guards the fields below and every port's sockets
	closed bool
	addrs  []netip.Addr
	ports  map[key]*entry

	connMu     sync.Mutex // guards conns and connClosed
	conns      map[net.Conn]struct{}
	connClosed bool
}

type key struct {
	port  uint16
	proto Proto
}

// New returns a proxy with no addresses and no ports.
func New(cfg Config) *Proxy {
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.FailCooldown <= 0 {
		cfg.FailCooldown = DefaultFailCooldown
	}
	if cfg.UDPIdleTimeout <= 0 {
		cfg.UDPIdleTimeout = DefaultUDPIdleTimeout
	}
	if cfg.UDPMaxFlows <= 0 {
		cfg.UDPMaxFlows = DefaultUDPMaxFlows
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Proxy{
		cfg:    cfg,
		log:    log.With("component", "portproxy"),
		ctx:    ctx,
		cancel: cancel,
		ports:  make(map[key]*entry),
		conns:  make(map[net.Conn]struct{}),
	}
}

// Listen adds a node address: every published port is bound on it now, and
// every port published later too. Adding an address twice does nothing.
// Binding errors are returned (joined *BindError) but the address stays
// added; the failed ports are retried on their next Set.
func (p *Proxy) Listen(addr netip.Addr) error {
	if !addr.IsValid() {
		return errors.New("portproxy: invalid listen address")
	}
	addr = addr.Unmap()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	if slices.Contains(p.addrs, addr) {
		return nil
	}
	p.addrs = append(p.addrs, addr)
	var errs []error
	for _, pt := range p.sortedPorts() {
		if err := pt.bind(addr); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Set publishes port/proto with the given backends (the healthy replicas),
// replacing the previous set atomically: the next connection uses the new
// set. The port is bound on every node address the first time, and binding
// is retried on addresses where it failed before; the returned error
// (joined *BindError) names those that still fail. An empty set keeps the
// port bound but resets new connections (see the package doc).
func (p *Proxy) Set(port uint16, proto Proto, backends []netip.AddrPort) error {
	if port == 0 {
		return errors.New("portproxy: port 0")
	}
	if proto != TCP && proto != UDP {
		return fmt.Errorf("portproxy: unknown protocol %q", proto)
	}
	list := make([]netip.AddrPort, 0, len(backends))
	for _, b := range backends {
		if !b.IsValid() || b.Port() == 0 {
			return fmt.Errorf("portproxy: %d/%s: invalid backend %v", port, proto, b)
		}
		b = netip.AddrPortFrom(b.Addr().Unmap(), b.Port())
		if !slices.Contains(list, b) {
			list = append(list, b)
		}
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	k := key{port, proto}
	pt := p.ports[k]
	if pt == nil {
		pt = &entry{
			key:    k,
			p:      p,
			failed: make(map[netip.AddrPort]time.Time),
			socks:  make(map[netip.Addr]socket),
			errs:   make(map[netip.Addr]error),
		}
		p.ports[k] = pt
		p.log.Info("port published", "port", port, "proto", proto, "backends", list)
	}
	pt.backends.Store(&list)
	var errs []error
	for _, a := range p.addrs {
		if err := pt.bind(a); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Remove unpublishes port/proto: its listeners and UDP flows are closed,
// established TCP connections are left to finish. Removing a port that is
// not published does nothing.
func (p *Proxy) Remove(port uint16, proto Proto) {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := key{port, proto}
	if pt := p.ports[k]; pt != nil {
		pt.closeSockets()
		delete(p.ports, k)
		p.log.Info("port unpublished", "port", port, "proto", proto)
	}
}

// Ports lists the published ports, sorted by port then protocol.
func (p *Proxy) Ports() []PortStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []PortStatus
	for _, pt := range p.sortedPorts() {
		st := PortStatus{
			Port:     pt.port,
			Proto:    pt.proto,
			Backends: slices.Clone(*pt.backends.Load()),
			Active:   int(pt.active.Load()),
		}
		for _, a := range p.addrs {
			if _, ok := pt.socks[a]; ok {
				st.Bound = append(st.Bound, netip.AddrPortFrom(a, pt.port))
			} else if err := pt.errs[a]; err != nil {
				if st.BindErrors == nil {
					st.BindErrors = make(map[netip.Addr]error)
				}
				st.BindErrors[a] = err
			}
		}
		out = append(out, st)
	}
	return out
}

// Close stops every listener, closes every connection and flow, and waits
// for the proxy's goroutines to end. Later calls return ErrClosed or do
// nothing (Close).
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.wg.Wait()
		return nil
	}
	p.closed = true
	for _, pt := range p.ports {
		pt.closeSockets()
	}
	p.ports = map[key]*entry{}
	p.mu.Unlock()

	p.cancel()
	p.connMu.Lock()
	p.connClosed = true
	for c := range p.conns {
		c.Close()
	}
	p.connMu.Unlock()
	p.wg.Wait()
	return nil
}

func (p *Proxy) sortedPorts() []*entry {
	out := make([]*entry, 0, len(p.ports))
	for _, pt := range p.ports {
		out = append(out, pt)
	}
	slices.SortFunc(out, func(a, b *entry) int {
		return cmp.Or(cmp.Compare(a.port, b.port), cmp.Compare(a.proto, b.proto))
	})
	return out
}

// track registers a connection so Close can close it; false if the proxy
// is closed (the connection is then closed).
func (p *Proxy) track(cs ...net.Conn) bool {
	p.connMu.Lock()
	defer p.connMu.Unlock()
	if p.connClosed {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *Proxy) untrack(cs ...net.Conn) {
	p.connMu.Lock()
	defer p.connMu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
	}
}

// socket is a bound socket of a port on one node address.
type socket interface{ close() }

// entry is one published port/proto.
type entry struct {
	key
	p        *Proxy
	backends atomic.Pointer[[]netip.AddrPort]
	next     atomic.Uint64 // round-robin position
	active   atomic.Int64  // TCP connections or UDP flows

	failMu sync.Mutex
	failed map[netip.AddrPort]time.Time // backend → last failure

	// guarded by Proxy.mu
	socks map[netip.Addr]socket
	errs  map[netip.Addr]error
}

// bind binds the port on addr unless it already is. Called with Proxy.mu
// held.
func (pt *entry) bind(addr netip.Addr) error {
	if _, ok := pt.socks[addr]; ok {
		return nil
	}
	ap := netip.AddrPortFrom(addr, pt.port)
	var (
		s   socket
		err error
	)
	switch pt.proto {
	case TCP:
		var ln *net.TCPListener
		if ln, err = net.ListenTCP("tcp", net.TCPAddrFromAddrPort(ap)); err == nil {
			t := &tcpListener{pt: pt, ln: ln}
			pt.p.wg.Add(1)
			go t.serve()
			s = t
		}
	case UDP:
		var pc *net.UDPConn
		if pc, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(ap)); err == nil {
			u := &udpSocket{pt: pt, pc: pc, flows: make(map[netip.AddrPort]*flow)}
			pt.p.wg.Add(1)
			go u.serve()
			s = u
		}
	}
	if err != nil {
		be := &BindError{Port: pt.port, Proto: pt.proto, Addr: addr, Err: err}
		pt.errs[addr] = be
		pt.p.log.Warn("cannot bind published port", "port", pt.port, "proto", pt.proto, "addr", addr, "err", err)
		return be
	}
	delete(pt.errs, addr)
	pt.socks[addr] = s
	pt.p.log.Debug("published port bound", "port", pt.port, "proto", pt.proto, "addr", addr)
	return nil
}

// closeSockets closes the port's listeners (and UDP flows). Called with
// Proxy.mu held.
func (pt *entry) closeSockets() {
	for a, s := range pt.socks {
		s.close()
		delete(pt.socks, a)
	}
}

// order returns the backends to try for the next connection: round-robin
// over the ones that have not failed recently, then those that have, oldest
// failure first, as a last resort.
func (pt *entry) order() []netip.AddrPort {
	list := *pt.backends.Load()
	if len(list) == 0 {
		return nil
	}
	now := time.Now()
	cool := pt.p.cfg.FailCooldown
	var fresh, failed []netip.AddrPort
	pt.failMu.Lock()
	for _, b := range list {
		if t, ok := pt.failed[b]; ok && now.Sub(t) < cool {
			failed = append(failed, b)
		} else {
			fresh = append(fresh, b)
		}
	}
	slices.SortStableFunc(failed, func(a, b netip.AddrPort) int { return pt.failed[a].Compare(pt.failed[b]) })
	pt.failMu.Unlock()
	if len(fresh) > 0 {
		i := int(pt.next.Add(1)-1) % len(fresh)
		fresh = append(fresh[i:], fresh[:i]...)
	}
	return append(fresh, failed...)
}

func (pt *entry) markFailed(b netip.AddrPort) {
	pt.failMu.Lock()
	defer pt.failMu.Unlock()
	pt.failed[b] = time.Now()
	// Forget backends that are gone, so the map does not grow forever.
	if len(pt.failed) > 2*len(*pt.backends.Load())+8 {
		for k := range pt.failed {
			if !slices.Contains(*pt.backends.Load(), k) {
				delete(pt.failed, k)
			}
		}
	}
}

func (pt *entry) markOK(b netip.AddrPort) {
	pt.failMu.Lock()
	defer pt.failMu.Unlock()
	delete(pt.failed, b)
}
