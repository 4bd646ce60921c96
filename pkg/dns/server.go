package dns

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	mdns "github.com/miekg/dns"
)

// Defaults for Config.
const (
	DefaultZone           = "shoal."
	DefaultTTL            = 5 * time.Second
	DefaultForwardTimeout = 2 * time.Second
	DefaultForwardStagger = 250 * time.Millisecond
)

// ednsSize is the largest UDP answer we send (and advertise): the DNS flag
// day 2020 value, which avoids IP fragmentation on any sane path.
const ednsSize = 1232

// Config configures a Server.
type Config struct {
	// Zone is the zone the server is authoritative for. Default "shoal.".
	Zone string
	// Listen lists host:port addresses, each served over UDP and TCP (e.g.
	// "10.42.3.1:53"). Port 0 picks a free port, the same for UDP and TCP
	// (see Server.Addrs).
	Listen []string
	// Upstreams are the resolvers names outside the zone are forwarded to,
	// host:port or a bare IP (port 53). None: such names are SERVFAIL.
	Upstreams []string
	// TTL of the answers and of negative caching (SOA minimum). Default 5s.
	TTL time.Duration
	// ForwardTimeout bounds a forwarded query as a whole. Default 2s.
	ForwardTimeout time.Duration
	// ForwardStagger is how long an upstream gets before the next one is
	// asked as well (an upstream that fails is followed at once). Default
	// 250ms.
	ForwardStagger time.Duration
	// Records is the table to serve; nil: a new empty one (see
	// Server.Records and Server.Update).
	Records *Records
	// Scope narrows a name of the zone (canonical: lower case, with the
	// final dot) to what the client asking may see: the addresses it is
	// answered with, of those the records hold (addrs, not to be
	// modified), and whether the name exists for it at all (NXDOMAIN
	// otherwise). nil: every name and address for every client. It is
	// called for each query of a name the records hold.
	Scope func(client netip.Addr, name string, addrs []netip.Addr) ([]netip.Addr, bool)
	// Forwards reports whether names outside the zone are forwarded for
	// the client asking; it is REFUSED them otherwise (a task on
	// internal networks only, as Docker's resolver does). nil: for all.
	Forwards func(client netip.Addr) bool
	// Logger; nil discards.
	Logger *slog.Logger
}

// Stats counts queries since the server was created.
type Stats struct {
	Queries   uint64 // all queries handled
	Local     uint64 // answered from the zone with NOERROR (incl. NODATA)
	NXDomain  uint64 // unknown names in the zone
	Forwarded uint64 // answered by an upstream
	ServFail  uint64 // SERVFAIL sent (no or failing upstreams, internal errors)
}

// Server is a per-node DNS server: authoritative for the zone from Records,
// forwarding for the rest.
type Server struct {
	zone      string
	listen    []string
	upstreams []string
	ttl       uint32
	fwdTO     time.Duration
	stagger   time.Duration
	records   *Records
	scope     func(netip.Addr, string, []netip.Addr) ([]netip.Addr, bool)
	forwards  func(netip.Addr) bool
	log       *slog.Logger

	ctx    context.Context // cancelled by Close: aborts forwarding
	cancel context.CancelFunc

	mu      sync.Mutex
	state   int // 0 new, 1 started, 2 closed
	servers []*mdns.Server
	addrs   []string
	done    chan struct{} // closed when Close has finished

	queries, local, nxdomain, forwarded, servfail atomic.Uint64
}

// New validates cfg and returns a server that is not yet listening.
func New(cfg Config) (*Server, error) {
	zone := cfg.Zone
	if zone == "" {
		zone = DefaultZone
	}
	if _, ok := mdns.IsDomainName(zone); !ok || zone == "." {
		return nil, fmt.Errorf("dns: invalid zone %q", cfg.Zone)
	}
	zone = canonical(zone)
	if len(cfg.Listen) == 0 {
		return nil, errors.New("dns: no listen address")
	}
	for _, l := range cfg.Listen {
		if _, _, err := net.SplitHostPort(l); err != nil {
			return nil, fmt.Errorf("dns: listen address %q: %w", l, err)
		}
	}
	var ups []string
	for _, u := range cfg.Upstreams {
		hp, err := upstreamAddr(u)
		if err != nil {
			return nil, err
		}
		ups = append(ups, hp)
	}
	ttl := cfg.TTL
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	fwd := cfg.ForwardTimeout
	if fwd <= 0 {
		fwd = DefaultForwardTimeout
	}
	stagger := cfg.ForwardStagger
	if stagger <= 0 {
		stagger = DefaultForwardStagger
	}
	recs := cfg.Records
	if recs == nil {
		recs = &Records{}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{
		zone:      zone,
		listen:    append([]string(nil), cfg.Listen...),
		upstreams: ups,
		ttl:       uint32(max(1, ttl/time.Second)),
		fwdTO:     fwd,
		stagger:   stagger,
		records:   recs,
		scope:     cfg.Scope,
		forwards:  cfg.Forwards,
		log:       log.With("component", "dns"),
		ctx:       ctx,
		cancel:    cancel,
		done:      make(chan struct{}),
	}, nil
}

func upstreamAddr(u string) (string, error) {
	if ip, err := netip.ParseAddr(u); err == nil {
		return netip.AddrPortFrom(ip, 53).String(), nil
	}
	host, port, err := net.SplitHostPort(u)
	if err != nil {
		return "", fmt.Errorf("dns: upstream %q: want IP or host:port", u)
	}
	if _, err := netip.ParseAddr(host); err != nil {
		return "", fmt.Errorf("dns: upstream %q: host must be an IP address", u)
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
		return "", fmt.Errorf("dns: upstream %q: bad port", u)
	}
	return u, nil
}

// Records returns the table the server answers from.
func (s *Server) Records() *Records { return s.records }

// Update replaces the served names atomically (see Records.Set); the next
// query sees them.
func (s *Server) Update(m map[string][]netip.Addr) { s.records.Set(m) }

// Stats returns the query counters.
func (s *Server) Stats() Stats {
	return Stats{
		Queries:   s.queries.Load(),
		Local:     s.local.Load(),
		NXDomain:  s.nxdomain.Load(),
		Forwarded: s.forwarded.Load(),
		ServFail:  s.servfail.Load(),
	}
}

// Addrs returns the bound addresses (host:port, with the actual port when
// Listen asked for port 0), in Listen order; nil before Start.
func (s *Server) Addrs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.addrs...)
}

// Start binds every listen address over UDP and TCP and serves them until
// ctx is done or Close is called. It returns once all sockets are bound and
// being served; a bind failure closes what was bound and is returned.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch s.state {
	case 1:
		return errors.New("dns: server already started")
	case 2:
		return errors.New("dns: server closed")
	}
	var (
		pcs   []net.PacketConn
		lns   []net.Listener
		addrs []string
	)
	closeAll := func() {
		for _, pc := range pcs {
			pc.Close()
		}
		for _, ln := range lns {
			ln.Close()
		}
	}
	for _, l := range s.listen {
		pc, ln, err := bindPair(l)
		if err != nil {
			closeAll()
			return err
		}
		pcs, lns = append(pcs, pc), append(lns, ln)
		addrs = append(addrs, pc.LocalAddr().String())
	}

	started := make(chan struct{}, 2*len(pcs))
	errs := make(chan error, 2*len(pcs))
	handler := mdns.HandlerFunc(s.serveDNS)
	for i := range pcs {
		for _, srv := range []*mdns.Server{
			{PacketConn: pcs[i], Handler: handler, UDPSize: ednsSize},
			{Listener: lns[i], Handler: handler, ReadTimeout: 2 * time.Second},
		} {
			srv.NotifyStartedFunc = func() { started <- struct{}{} }
			s.servers = append(s.servers, srv)
			go func() {
				if err := srv.ActivateAndServe(); err != nil {
					errs <- err
					s.log.Error("dns listener stopped", "addr", addrs[i], "err", err)
				}
			}()
		}
	}
	// Wait until every server runs: shutting down a server that has not
	// started yet would fail and leave it serving.
	for range s.servers {
		select {
		case <-started:
		case err := <-errs:
			for _, srv := range s.servers {
				srv.Shutdown() // fails harmlessly for those not started
			}
			s.servers = nil
			closeAll()
			return fmt.Errorf("dns: serve: %w", err)
		}
	}
	s.addrs = addrs
	s.state = 1
	s.log.Info("dns serving", "zone", s.zone, "addrs", addrs, "upstreams", s.upstreams)
	go func() {
		select {
		case <-ctx.Done():
			s.Close()
		case <-s.done:
		}
	}()
	return nil
}

// bindPair binds addr over UDP and TCP on the same port. With port 0 the
// kernel picks the UDP port and TCP is bound to it too; if that TCP port is
// taken, it tries again with another UDP port.
func bindPair(addr string) (net.PacketConn, net.Listener, error) {
	host, port, _ := net.SplitHostPort(addr)
	var lastErr error
	tries := 1
	if port == "0" {
		tries = 20
	}
	for range tries {
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			return nil, nil, fmt.Errorf("dns: listen udp %s: %w", addr, err)
		}
		_, p, _ := net.SplitHostPort(pc.LocalAddr().String())
		ln, err := net.Listen("tcp", net.JoinHostPort(host, p))
		if err == nil {
			return pc, ln, nil
		}
		pc.Close()
		lastErr = fmt.Errorf("dns: listen tcp %s: %w", net.JoinHostPort(host, p), err)
		if port != "0" || !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	return nil, nil, lastErr
}

// Close stops serving, aborts queries being forwarded and waits for the
// listeners to be released, so the same addresses can be bound again at
// once. It is idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.state == 2 {
		s.mu.Unlock()
		<-s.done
		return nil
	}
	s.state = 2
	servers := s.servers
	s.servers = nil
	s.mu.Unlock()

	s.cancel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var errs []error
	for _, srv := range servers {
		if err := srv.ShutdownContext(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	close(s.done)
	return errors.Join(errs...)
}

func (s *Server) serveDNS(w mdns.ResponseWriter, req *mdns.Msg) {
	s.queries.Add(1)
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("dns handler panic", "panic", p)
			s.servfail.Add(1)
			m := new(mdns.Msg)
			m.SetRcode(req, mdns.RcodeServerFailure)
			w.WriteMsg(m)
		}
	}()
	var client netip.Addr
	if ap, err := netip.ParseAddrPort(w.RemoteAddr().String()); err == nil {
		client = ap.Addr().Unmap()
	}
	resp := s.answer(req, client)
	if resp == nil {
		return
	}
	switch resp.Rcode {
	case mdns.RcodeServerFailure:
		s.servfail.Add(1)
	case mdns.RcodeNameError:
		if resp.Authoritative {
			s.nxdomain.Add(1)
		}
	}
	// Fit the answer to the transport: the client's UDP buffer (TC set when
	// records had to go; the client retries over TCP), 64 KiB over TCP.
	size := mdns.MaxMsgSize
	if isUDP(w) {
		size = mdns.MinMsgSize
		if opt := req.IsEdns0(); opt != nil {
			size = max(mdns.MinMsgSize, min(int(opt.UDPSize()), ednsSize))
		}
	}
	resp.Compress = true
	resp.Truncate(size)
	if err := w.WriteMsg(resp); err != nil {
		s.log.Debug("dns write", "client", w.RemoteAddr(), "err", err)
	}
}

func isUDP(w mdns.ResponseWriter) bool {
	_, ok := w.LocalAddr().(*net.UDPAddr)
	return ok
}

// answer builds the response to req from client; nil sends nothing.
func (s *Server) answer(req *mdns.Msg, client netip.Addr) *mdns.Msg {
	if req.Opcode != mdns.OpcodeQuery {
		m := new(mdns.Msg)
		m.SetRcode(req, mdns.RcodeNotImplemented)
		return m
	}
	if len(req.Question) != 1 {
		m := new(mdns.Msg)
		m.SetRcode(req, mdns.RcodeFormatError)
		return m
	}
	q := req.Question[0]
	if !mdns.IsSubDomain(s.zone, q.Name) {
		if s.forwards != nil && !s.forwards(client) {
			m := new(mdns.Msg)
			m.SetRcode(req, mdns.RcodeRefused)
			return m
		}
		return s.forward(req)
	}
	m := s.authoritative(req, q, client)
	if req.IsEdns0() != nil {
		m.SetEdns0(ednsSize, false)
	}
	return m
}

// authoritative answers a question in the zone.
func (s *Server) authoritative(req *mdns.Msg, q mdns.Question, client netip.Addr) *mdns.Msg {
	m := new(mdns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	m.RecursionAvailable = len(s.upstreams) > 0
	if q.Qclass != mdns.ClassINET && q.Qclass != mdns.ClassANY {
		m.Authoritative = false
		m.Rcode = mdns.RcodeRefused
		return m
	}
	switch q.Qtype {
	case mdns.TypeAXFR, mdns.TypeIXFR:
		m.Rcode = mdns.RcodeRefused
		return m
	}
	name := canonical(q.Name)
	if name == s.zone {
		if q.Qtype == mdns.TypeSOA || q.Qtype == mdns.TypeANY {
			m.Answer = append(m.Answer, s.soa())
		} else {
			m.Ns = append(m.Ns, s.soa())
		}
		s.local.Add(1)
		return m
	}
	addrs, ok := s.records.Lookup(name)
	if ok && s.scope != nil {
		addrs, ok = s.scope(client, name, addrs)
	}
	if !ok {
		m.Rcode = mdns.RcodeNameError
		m.Ns = append(m.Ns, s.soa())
		return m
	}
	hdr := mdns.RR_Header{Name: q.Name, Class: mdns.ClassINET, Ttl: s.ttl}
	for _, a := range shuffled(addrs) {
		switch {
		case a.Is4() && (q.Qtype == mdns.TypeA || q.Qtype == mdns.TypeANY):
			h := hdr
			h.Rrtype = mdns.TypeA
			m.Answer = append(m.Answer, &mdns.A{Hdr: h, A: net.IP(a.AsSlice())})
		case a.Is6() && (q.Qtype == mdns.TypeAAAA || q.Qtype == mdns.TypeANY):
			h := hdr
			h.Rrtype = mdns.TypeAAAA
			m.Answer = append(m.Answer, &mdns.AAAA{Hdr: h, AAAA: net.IP(a.AsSlice())})
		}
	}
	if len(m.Answer) == 0 {
		m.Ns = append(m.Ns, s.soa()) // NODATA
	}
	s.local.Add(1)
	return m
}

func (s *Server) soa() *mdns.SOA {
	return &mdns.SOA{
		Hdr:     mdns.RR_Header{Name: s.zone, Rrtype: mdns.TypeSOA, Class: mdns.ClassINET, Ttl: s.ttl},
		Ns:      "ns." + s.zone,
		Mbox:    "hostmaster." + s.zone,
		Serial:  s.records.serial(),
		Refresh: 3600,
		Retry:   600,
		Expire:  86400,
		Minttl:  s.ttl,
	}
}

func shuffled(a []netip.Addr) []netip.Addr {
	if len(a) < 2 {
		return a
	}
	c := append([]netip.Addr(nil), a...)
	rand.Shuffle(len(c), func(i, j int) { c[i], c[j] = c[j], c[i] })
	return c
}

// forward asks the upstreams and returns the first useful answer, SERVFAIL
// when there is none.
func (s *Server) forward(req *mdns.Msg) *mdns.Msg {
	resp, err := s.ask(req)
	if err != nil {
		s.log.Debug("dns forward failed", "name", req.Question[0].Name, "err", err)
		m := new(mdns.Msg)
		m.SetRcode(req, mdns.RcodeServerFailure)
		m.RecursionAvailable = len(s.upstreams) > 0
		if req.IsEdns0() != nil {
			m.SetEdns0(ednsSize, false)
		}
		return m
	}
	s.forwarded.Add(1)
	resp.Id = req.Id
	resp.Question = req.Question // the client's spelling (0x20)
	if opt := resp.IsEdns0(); opt != nil {
		opt.SetUDPSize(ednsSize) // our buffer, not the upstream's
	}
	if req.IsEdns0() == nil {
		// We added EDNS0 upstream; a client that did not ask for it must
		// not get an OPT record back.
		extra := resp.Extra[:0]
		for _, rr := range resp.Extra {
			if rr.Header().Rrtype != mdns.TypeOPT {
				extra = append(extra, rr)
			}
		}
		resp.Extra = extra
	}
	return resp
}

var errNoUpstreams = errors.New("no upstream resolvers")

type result struct {
	m   *mdns.Msg
	err error
}

// ask queries the upstreams in order, starting the next one when the
// previous fails or has not answered within the stagger, and returns the
// first answer that is not SERVFAIL/REFUSED/NOTIMP.
func (s *Server) ask(req *mdns.Msg) (*mdns.Msg, error) {
	if len(s.upstreams) == 0 {
		return nil, errNoUpstreams
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.fwdTO)
	defer cancel()

	q := req.Copy()
	if q.IsEdns0() == nil {
		q.SetEdns0(ednsSize, false)
	}
	results := make(chan result, len(s.upstreams))
	next, pending := 0, 0
	launch := func() {
		up := s.upstreams[next]
		next++
		pending++
		m := q.Copy()
		m.Id = mdns.Id()
		go func() {
			r, err := exchange(ctx, m, up)
			if err != nil {
				err = fmt.Errorf("%s: %w", up, err)
			}
			results <- result{r, err}
		}()
	}
	launch()
	stagger := time.NewTimer(s.stagger)
	defer stagger.Stop()
	var errs []error
	for pending > 0 {
		select {
		case res := <-results:
			pending--
			if res.err == nil {
				switch res.m.Rcode {
				case mdns.RcodeServerFailure, mdns.RcodeRefused, mdns.RcodeNotImplemented:
					res.err = fmt.Errorf("upstream answered %s", mdns.RcodeToString[res.m.Rcode])
				default:
					return res.m, nil
				}
			}
			errs = append(errs, res.err)
			if next < len(s.upstreams) {
				launch()
				stagger.Reset(s.stagger)
			}
		case <-stagger.C:
			if next < len(s.upstreams) {
				launch()
				stagger.Reset(s.stagger)
			}
		case <-ctx.Done():
			return nil, errors.Join(append(errs, ctx.Err())...)
		}
	}
	return nil, errors.Join(errs...)
}

// exchange sends m to addr over UDP, and again over TCP when the UDP answer
// is truncated. Cancelling ctx aborts it.
func exchange(ctx context.Context, m *mdns.Msg, addr string) (*mdns.Msg, error) {
	r, err := exchangeNet(ctx, "udp", m, addr)
	if err == nil && r.Truncated {
		r, err = exchangeNet(ctx, "tcp", m, addr)
	}
	return r, err
}

func exchangeNet(ctx context.Context, network string, m *mdns.Msg, addr string) (*mdns.Msg, error) {
	c := &mdns.Client{Net: network, UDPSize: ednsSize}
	conn, err := c.DialContext(ctx, addr)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	// ExchangeWithConnContext honours only the deadline; close the
	// connection to honour cancellation (Close) too.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	r, _, err := c.ExchangeWithConnContext(ctx, m, conn)
	if err != nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	return r, err
}

// String describes the server for logs.
func (s *Server) String() string {
	return fmt.Sprintf("dns(%s on %s)", s.zone, strings.Join(s.Addrs(), ","))
}
