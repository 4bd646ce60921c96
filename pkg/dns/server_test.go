package dns

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
)

var (
	web1 = netip.MustParseAddr("10.42.1.2")
	web2 = netip.MustParseAddr("10.42.2.7")
	web3 = netip.MustParseAddr("10.42.3.9")
)

func baseRecords() map[string][]netip.Addr {
	return map[string][]netip.Addr{
		"web.shoal.":   {web1, web2, web3},
		"0.web.shoal.": {web1},
		"1.web.shoal.": {web2},
		"2.web.shoal.": {web3},
	}
}

// start runs a server on a random loopback port and returns it and its
// address.
func start(t *testing.T, cfg Config) (*Server, string) {
	t.Helper()
	if len(cfg.Listen) == 0 {
		cfg.Listen = []string{"127.0.0.1:0"}
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, s.Addrs()[0]
}

type qopt struct {
	net  string // "udp" (default) or "tcp"
	edns uint16 // EDNS0 buffer size; 0: no OPT
}

func query(t *testing.T, addr, name string, qtype uint16, o qopt) *mdns.Msg {
	t.Helper()
	m, err := tryQuery(addr, name, qtype, o)
	if err != nil {
		t.Fatalf("query %s %s over %s: %v", name, mdns.TypeToString[qtype], o.net, err)
	}
	return m
}

func tryQuery(addr, name string, qtype uint16, o qopt) (*mdns.Msg, error) {
	if o.net == "" {
		o.net = "udp"
	}
	m := new(mdns.Msg)
	m.SetQuestion(name, qtype)
	if o.edns != 0 {
		m.SetEdns0(o.edns, false)
	}
	c := &mdns.Client{Net: o.net, Timeout: 2 * time.Second}
	r, _, err := c.Exchange(m, addr)
	return r, err
}

func aAddrs(t *testing.T, m *mdns.Msg) []netip.Addr {
	t.Helper()
	var out []netip.Addr
	for _, rr := range m.Answer {
		a, ok := rr.(*mdns.A)
		if !ok {
			t.Fatalf("unexpected answer %v", rr)
		}
		ip, _ := netip.AddrFromSlice(a.A)
		out = append(out, ip.Unmap())
	}
	return out
}

func sorted(a []netip.Addr) []netip.Addr {
	a = slices.Clone(a)
	slices.SortFunc(a, netip.Addr.Compare)
	return a
}

func wantSOA(t *testing.T, m *mdns.Msg) {
	t.Helper()
	if len(m.Ns) != 1 {
		t.Fatalf("authority = %v, want one SOA", m.Ns)
	}
	soa, ok := m.Ns[0].(*mdns.SOA)
	if !ok || soa.Hdr.Name != "shoal." || soa.Minttl != 5 || soa.Hdr.Ttl != 5 {
		t.Fatalf("authority = %v, want SOA of shoal. with minimum 5", m.Ns[0])
	}
}

func TestAQueries(t *testing.T) {
	_, addr := start(t, Config{Records: NewRecords(baseRecords())})
	for _, tr := range []string{"udp", "tcp"} {
		m := query(t, addr, "web.shoal.", mdns.TypeA, qopt{net: tr})
		if m.Rcode != mdns.RcodeSuccess || !m.Authoritative {
			t.Fatalf("%s: rcode %s aa %v", tr, mdns.RcodeToString[m.Rcode], m.Authoritative)
		}
		if got, want := sorted(aAddrs(t, m)), []netip.Addr{web1, web2, web3}; !slices.Equal(got, want) {
			t.Fatalf("%s: web.shoal. = %v, want %v", tr, got, want)
		}
		for _, rr := range m.Answer {
			if rr.Header().Ttl != 5 {
				t.Fatalf("ttl = %d, want 5", rr.Header().Ttl)
			}
		}
	}
	// Slots, and case-insensitivity (the owner name keeps the client's case).
	m := query(t, addr, "1.WeB.sHoAl.", mdns.TypeA, qopt{})
	if got := aAddrs(t, m); !slices.Equal(got, []netip.Addr{web2}) {
		t.Fatalf("1.WeB.sHoAl. = %v", got)
	}
	if m.Answer[0].Header().Name != "1.WeB.sHoAl." {
		t.Fatalf("owner name %q, want the question's spelling", m.Answer[0].Header().Name)
	}
}

func TestShuffledPerAnswer(t *testing.T) {
	var addrs []netip.Addr
	for i := range 6 {
		addrs = append(addrs, netip.AddrFrom4([4]byte{10, 42, 0, byte(i + 2)}))
	}
	_, addr := start(t, Config{Records: NewRecords(map[string][]netip.Addr{"svc.shoal.": addrs})})
	first := map[netip.Addr]int{}
	orders := map[string]bool{}
	for range 200 {
		got := aAddrs(t, query(t, addr, "svc.shoal.", mdns.TypeA, qopt{}))
		if !slices.Equal(sorted(got), addrs) {
			t.Fatalf("answer %v, want a permutation of %v", got, addrs)
		}
		first[got[0]]++
		orders[fmt.Sprint(got)] = true
	}
	// P(some address never first in 200 answers) ≈ 6·(5/6)^200 ≈ 1e-15.
	if len(first) != len(addrs) {
		t.Fatalf("first addresses %v: not shuffled", first)
	}
	t.Logf("200 answers, %d distinct orders, first-position counts %v", len(orders), first)
}

func TestNoDataAndNXDomain(t *testing.T) {
	recs := baseRecords()
	recs["empty.shoal."] = nil                // a service with no healthy task
	recs["0.api.shoal."] = []netip.Addr{web1} // api.shoal. is an empty non-terminal
	_, addr := start(t, Config{Records: NewRecords(recs)})

	for _, c := range []struct {
		name  string
		qtype uint16
	}{
		{"web.shoal.", mdns.TypeAAAA},
		{"0.web.shoal.", mdns.TypeAAAA},
		{"web.shoal.", mdns.TypeMX},
		{"empty.shoal.", mdns.TypeA},
		{"api.shoal.", mdns.TypeA},
		{"shoal.", mdns.TypeA},
	} {
		m := query(t, addr, c.name, c.qtype, qopt{})
		if m.Rcode != mdns.RcodeSuccess || len(m.Answer) != 0 || !m.Authoritative {
			t.Fatalf("%s %s: rcode %s, %d answers; want authoritative NODATA",
				c.name, mdns.TypeToString[c.qtype], mdns.RcodeToString[m.Rcode], len(m.Answer))
		}
		wantSOA(t, m)
	}
	for _, name := range []string{"nope.shoal.", "3.web.shoal.", "x.0.web.shoal."} {
		for _, qt := range []uint16{mdns.TypeA, mdns.TypeAAAA} {
			m := query(t, addr, name, qt, qopt{})
			if m.Rcode != mdns.RcodeNameError || !m.Authoritative || len(m.Answer) != 0 {
				t.Fatalf("%s %s: rcode %s aa %v; want authoritative NXDOMAIN",
					name, mdns.TypeToString[qt], mdns.RcodeToString[m.Rcode], m.Authoritative)
			}
			wantSOA(t, m)
		}
	}
	m := query(t, addr, "shoal.", mdns.TypeSOA, qopt{})
	if len(m.Answer) != 1 || m.Answer[0].Header().Rrtype != mdns.TypeSOA {
		t.Fatalf("SOA query: %v", m.Answer)
	}
	// EDNS0 clients get an OPT back.
	if m := query(t, addr, "web.shoal.", mdns.TypeA, qopt{edns: 4096}); m.IsEdns0() == nil {
		t.Fatal("no OPT in answer to an EDNS0 query")
	}
}

// fakeUpstream serves h on a random loopback port over UDP and TCP.
func fakeUpstream(t *testing.T, h mdns.HandlerFunc) string {
	t.Helper()
	pc, ln, err := bindPair("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, srv := range []*mdns.Server{{PacketConn: pc, Handler: h}, {Listener: ln, Handler: h}} {
		wg.Add(1)
		srv.NotifyStartedFunc = wg.Done
		go srv.ActivateAndServe()
		t.Cleanup(func() { srv.Shutdown() })
	}
	wg.Wait()
	return pc.LocalAddr().String()
}

// answering answers every A query with n addresses 192.0.2.x.
func answering(n int, seen *sync.Map) mdns.HandlerFunc {
	return func(w mdns.ResponseWriter, r *mdns.Msg) {
		if seen != nil {
			_, tcp := w.RemoteAddr().(*net.TCPAddr)
			seen.Store(fmt.Sprintf("%s/%v", r.Question[0].Name, tcp), true)
		}
		m := new(mdns.Msg)
		m.SetReply(r)
		m.RecursionAvailable = true
		for i := range n {
			m.Answer = append(m.Answer, &mdns.A{
				Hdr: mdns.RR_Header{Name: r.Question[0].Name, Rrtype: mdns.TypeA, Class: mdns.ClassINET, Ttl: 60},
				A:   net.IPv4(192, 0, 2, byte(i+1)),
			})
		}
		size := mdns.MinMsgSize
		if o := r.IsEdns0(); o != nil {
			size = int(o.UDPSize())
			m.SetEdns0(o.UDPSize(), false)
		}
		if _, tcp := w.RemoteAddr().(*net.TCPAddr); tcp {
			size = mdns.MaxMsgSize
		}
		m.Truncate(size)
		w.WriteMsg(m)
	}
}

func rcodeHandler(rcode int) mdns.HandlerFunc {
	return func(w mdns.ResponseWriter, r *mdns.Msg) {
		m := new(mdns.Msg)
		m.SetRcode(r, rcode)
		w.WriteMsg(m)
	}
}

// deadUDP returns a loopback address where nothing listens (queries get
// ICMP port unreachable).
func deadUDP(t *testing.T) string {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := pc.LocalAddr().String()
	pc.Close()
	return a
}

// blackhole returns a loopback address that swallows queries.
func blackhole(t *testing.T) string {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	return pc.LocalAddr().String()
}

func TestForward(t *testing.T) {
	good := fakeUpstream(t, answering(1, nil))
	servfail := fakeUpstream(t, rcodeHandler(mdns.RcodeServerFailure))
	nxdomain := fakeUpstream(t, rcodeHandler(mdns.RcodeNameError))

	cases := []struct {
		name      string
		upstreams []string
		rcode     int
		maxTime   time.Duration
	}{
		{"good", []string{good}, mdns.RcodeSuccess, time.Second},
		{"dead then good", []string{deadUDP(t), good}, mdns.RcodeSuccess, time.Second},
		{"servfail then good", []string{servfail, good}, mdns.RcodeSuccess, time.Second},
		// The blackhole gets the stagger (50ms), then good is asked too.
		{"blackhole then good", []string{blackhole(t), good}, mdns.RcodeSuccess, time.Second},
		{"nxdomain is an answer", []string{nxdomain, good}, mdns.RcodeNameError, time.Second},
		{"none", nil, mdns.RcodeServerFailure, time.Second},
		{"all fail", []string{deadUDP(t), servfail}, mdns.RcodeServerFailure, time.Second},
		// Bounded by ForwardTimeout (300ms), well before the client's 2s.
		{"all silent", []string{blackhole(t)}, mdns.RcodeServerFailure, time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, addr := start(t, Config{
				Upstreams:      c.upstreams,
				ForwardTimeout: 300 * time.Millisecond,
				ForwardStagger: 50 * time.Millisecond,
			})
			for _, tr := range []string{"udp", "tcp"} {
				t0 := time.Now()
				m := query(t, addr, "Example.COM.", mdns.TypeA, qopt{net: tr})
				el := time.Since(t0)
				if m.Rcode != c.rcode {
					t.Fatalf("%s: rcode %s, want %s", tr, mdns.RcodeToString[m.Rcode], mdns.RcodeToString[c.rcode])
				}
				if el > c.maxTime {
					t.Fatalf("%s: took %v", tr, el)
				}
				if c.rcode == mdns.RcodeSuccess {
					if got := aAddrs(t, m); len(got) != 1 || got[0] != netip.MustParseAddr("192.0.2.1") {
						t.Fatalf("%s: answer %v", tr, got)
					}
					if m.Question[0].Name != "Example.COM." || m.Authoritative {
						t.Fatalf("%s: question %v aa %v", tr, m.Question, m.Authoritative)
					}
					if m.IsEdns0() != nil {
						t.Fatalf("%s: OPT in the answer to a query without one", tr)
					}
				}
				t.Logf("%s: %s in %v", tr, mdns.RcodeToString[m.Rcode], el.Round(time.Millisecond))
			}
		})
	}
}

func TestTruncation(t *testing.T) {
	var many []netip.Addr
	for i := range 100 {
		many = append(many, netip.AddrFrom4([4]byte{10, 42, byte(i), 2}))
	}
	var seen sync.Map
	up := fakeUpstream(t, answering(100, &seen))
	_, addr := start(t, Config{
		Records:   NewRecords(map[string][]netip.Addr{"big.shoal.": many, "mid.shoal.": many[:50]}),
		Upstreams: []string{up},
	})
	for _, name := range []string{"big.shoal.", "big.example."} {
		m := query(t, addr, name, mdns.TypeA, qopt{})
		if !m.Truncated || len(m.Answer) >= 100 {
			t.Fatalf("%s over UDP: TC %v with %d answers; want truncated", name, m.Truncated, len(m.Answer))
		}
		m.Compress = true // as sent
		if n := m.Len(); n > mdns.MinMsgSize {
			t.Fatalf("%s over UDP: %d bytes > 512", name, n)
		}
		m = query(t, addr, name, mdns.TypeA, qopt{net: "tcp"})
		if m.Truncated || len(m.Answer) != 100 {
			t.Fatalf("%s over TCP: TC %v with %d answers; want all 100", name, m.Truncated, len(m.Answer))
		}
	}
	// The answer to the UDP query came from upstream over TCP, after its
	// own UDP answer was truncated.
	if _, ok := seen.Load("big.example./true"); !ok {
		t.Fatal("upstream was never asked over TCP")
	}
	// 50 records fit an EDNS0 buffer but not 512 bytes.
	if m := query(t, addr, "mid.shoal.", mdns.TypeA, qopt{}); !m.Truncated {
		t.Fatal("mid.shoal. without EDNS0 not truncated")
	}
	if m := query(t, addr, "mid.shoal.", mdns.TypeA, qopt{edns: 4096}); m.Truncated || len(m.Answer) != 50 {
		t.Fatalf("mid.shoal. with EDNS0: TC %v, %d answers", m.Truncated, len(m.Answer))
	}
}

func TestMalformedPackets(t *testing.T) {
	_, addr := start(t, Config{Records: NewRecords(baseRecords())})
	ok := func() {
		t.Helper()
		if got := aAddrs(t, query(t, addr, "0.web.shoal.", mdns.TypeA, qopt{})); !slices.Equal(got, []netip.Addr{web1}) {
			t.Fatalf("after garbage: %v", got)
		}
	}
	hdr := func(id, flags, qd, an, ns, ar uint16) []byte {
		b := make([]byte, 12)
		for i, v := range []uint16{id, flags, qd, an, ns, ar} {
			binary.BigEndian.PutUint16(b[2*i:], v)
		}
		return b
	}
	valid, _ := new(mdns.Msg).SetQuestion("web.shoal.", mdns.TypeA).Pack()
	packets := [][]byte{
		{},
		{0x01},
		[]byte("definitely not dns"),
		hdr(1, 0, 1, 0, 0, 0),                // question count 1, no question
		hdr(2, 0, 0, 0, 0, 0),                // no question
		hdr(3, 0, 2, 0, 0, 0),                // two questions, none there
		hdr(4, 0x8000, 1, 0, 0, 0),           // a response
		hdr(5, 0, 0xffff, 0xffff, 0xffff, 9), // absurd counts
		append(hdr(6, 0, 1, 0, 0, 0), 0xc0, 0x0c, 0, 1, 0, 1), // compression loop
		append(hdr(7, 0, 1, 0, 0, 0), 63, 'a', 'b'),           // label past the end
		valid[:len(valid)-3],                                  // cut short
	}
	for i := range 50 {
		b := slices.Clone(valid)
		b[12+i%(len(b)-12)] ^= byte(0x5a + i)
		packets = append(packets, b)
	}
	uc, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	for _, p := range packets {
		uc.Write(p)
	}
	ok()
	for _, p := range packets {
		tc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		l := make([]byte, 2)
		binary.BigEndian.PutUint16(l, uint16(len(p)))
		tc.Write(append(l, p...))
		tc.Close()
	}
	// A TCP length prefix promising more than is sent, then a hang-up.
	tc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	tc.Write([]byte{0xff, 0xff, 1, 2, 3})
	tc.Close()
	ok()

	// Wrong opcodes and classes get an error, not silence.
	m := new(mdns.Msg)
	m.SetQuestion("web.shoal.", mdns.TypeA)
	m.Opcode = mdns.OpcodeNotify
	r, err := mdns.Exchange(m, addr)
	if err != nil || r.Rcode != mdns.RcodeNotImplemented {
		t.Fatalf("NOTIFY: %v %v", r, err)
	}
	m = new(mdns.Msg)
	m.SetQuestion("web.shoal.", mdns.TypeA)
	m.Question[0].Qclass = mdns.ClassCHAOS
	if r, err := mdns.Exchange(m, addr); err != nil || r.Rcode != mdns.RcodeRefused {
		t.Fatalf("CHAOS: %v %v", r, err)
	}
	ok()
}

func TestUpdateIsImmediate(t *testing.T) {
	s, addr := start(t, Config{Records: NewRecords(baseRecords())})
	next := netip.MustParseAddr("10.42.9.9")
	for i := range 20 {
		recs := baseRecords()
		recs["web.shoal."] = []netip.Addr{next}
		delete(recs, "2.web.shoal.")
		if i%2 == 1 {
			recs = baseRecords()
		}
		s.Update(recs)
		m := query(t, addr, "web.shoal.", mdns.TypeA, qopt{})
		m2 := query(t, addr, "2.web.shoal.", mdns.TypeA, qopt{})
		if i%2 == 0 {
			if got := aAddrs(t, m); !slices.Equal(got, []netip.Addr{next}) {
				t.Fatalf("round %d: web.shoal. = %v right after Update", i, got)
			}
			if m2.Rcode != mdns.RcodeNameError {
				t.Fatalf("round %d: removed name answered %s", i, mdns.RcodeToString[m2.Rcode])
			}
		} else if len(m.Answer) != 3 || m2.Rcode != mdns.RcodeSuccess {
			t.Fatalf("round %d: %d answers, %s", i, len(m.Answer), mdns.RcodeToString[m2.Rcode])
		}
	}
}

// Queries racing with updates always see one whole table (run with -race).
func TestConcurrentUpdates(t *testing.T) {
	s, addr := start(t, Config{})
	a := map[string][]netip.Addr{"x.shoal.": {web1, web2}}
	b := map[string][]netip.Addr{"x.shoal.": {web3}}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	go func() {
		for i := 0; ctx.Err() == nil; i++ {
			if i%2 == 0 {
				s.Update(a)
			} else {
				s.Update(b)
			}
		}
	}()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				m, err := tryQuery(addr, "x.shoal.", mdns.TypeA, qopt{})
				if err != nil {
					t.Error(err)
					return
				}
				if m.Rcode == mdns.RcodeNameError {
					continue // before the first Update
				}
				if got := sorted(aAddrs(t, m)); !slices.Equal(got, []netip.Addr{web1, web2}) && !slices.Equal(got, []netip.Addr{web3}) {
					t.Errorf("torn answer %v", got)
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestRestartSameAddress(t *testing.T) {
	s, addr := start(t, Config{Records: NewRecords(baseRecords())})
	// Leave a TCP connection's state behind, as a real client would.
	query(t, addr, "web.shoal.", mdns.TypeA, qopt{net: "tcp"})
	query(t, addr, "web.shoal.", mdns.TypeA, qopt{})

	t0 := time.Now()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	closed := time.Since(t0)
	s2, err := New(Config{Listen: []string{addr}, Records: NewRecords(baseRecords())})
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Start(context.Background()); err != nil {
		t.Fatalf("restart on %s: %v", addr, err)
	}
	defer s2.Close()
	for _, tr := range []string{"udp", "tcp"} {
		if got := aAddrs(t, query(t, addr, "web.shoal.", mdns.TypeA, qopt{net: tr})); len(got) != 3 {
			t.Fatalf("%s after restart: %v", tr, got)
		}
	}
	el := time.Since(t0)
	t.Logf("restart on %s: Close %v, answering again (UDP and TCP) %v after Close began", addr, closed.Round(time.Microsecond), el.Round(time.Microsecond))
	if el > time.Second {
		t.Fatalf("restart took %v", el)
	}
	if s2.Addrs()[0] != addr {
		t.Fatalf("bound %v, want %s", s2.Addrs(), addr)
	}
}

func TestStartContextAndLifecycle(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	s, err := New(Config{Listen: []string{"127.0.0.1:0", "127.0.0.1:0"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	addrs := s.Addrs()
	if len(addrs) != 2 || addrs[0] == addrs[1] {
		t.Fatalf("addrs %v", addrs)
	}
	for _, a := range addrs {
		if m := query(t, a, "nope.shoal.", mdns.TypeA, qopt{}); m.Rcode != mdns.RcodeNameError {
			t.Fatal(m)
		}
	}
	if err := s.Start(ctx); err == nil {
		t.Fatal("second Start succeeded")
	}
	cancel()
	// Cancelling the context closes the server; its ports come free.
	deadline := time.Now().Add(2 * time.Second)
	for {
		pc, ln, err := bindPair(addrs[0])
		if err == nil {
			pc.Close()
			ln.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("port still bound after cancel: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	s.Close()
	if err := s.Start(context.Background()); err == nil {
		t.Fatal("Start after Close succeeded")
	}

	// A taken address is a Start error, and nothing stays bound.
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	s3, _ := New(Config{Listen: []string{"127.0.0.1:0", busy.Addr().String()}})
	if err := s3.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("Start on a busy port: %v", err)
	}
	s3.Close()
}

func TestConfigValidation(t *testing.T) {
	for _, cfg := range []Config{
		{},
		{Listen: []string{"127.0.0.1"}},
		{Listen: []string{"127.0.0.1:0"}, Upstreams: []string{"dns.google:53"}},
		{Listen: []string{"127.0.0.1:0"}, Upstreams: []string{"1.1.1.1:0"}},
		{Listen: []string{"127.0.0.1:0"}, Zone: "bad..zone"},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) succeeded", cfg)
		}
	}
	s, err := New(Config{Listen: []string{"127.0.0.1:0"}, Upstreams: []string{"192.0.2.53", "[2001:db8::53]:5353"}, Zone: "Cluster.Local"})
	if err != nil {
		t.Fatal(err)
	}
	if s.zone != "cluster.local." || !slices.Equal(s.upstreams, []string{"192.0.2.53:53", "[2001:db8::53]:5353"}) {
		t.Fatalf("zone %q upstreams %v", s.zone, s.upstreams)
	}
}

func TestRecords(t *testing.T) {
	in := map[string][]netip.Addr{
		"Web.Shoal":    {web1, netip.MustParseAddr("::ffff:10.42.2.7"), {}},
		"0.web.shoal.": {web1},
		"v6.shoal.":    {netip.MustParseAddr("fd00::1")},
	}
	r := NewRecords(in)
	in["web.shoal."] = nil // Set copied the map
	if got, ok := r.Lookup("WEB.shoal."); !ok || !slices.Equal(got, []netip.Addr{web1, web2}) {
		t.Fatalf("web = %v %v", got, ok)
	}
	if _, ok := r.Lookup("shoal."); !ok {
		t.Fatal("ancestor shoal. does not exist")
	}
	if _, ok := r.Lookup("1.web.shoal."); ok {
		t.Fatal("1.web.shoal. exists")
	}
	if r.Len() != 3 {
		t.Fatalf("Len %d", r.Len())
	}
	s1 := r.serial()
	r.Set(nil)
	if r.Len() != 0 || r.serial() <= s1 {
		t.Fatalf("after Set(nil): len %d serial %d → %d", r.Len(), s1, r.serial())
	}
	var zero Records
	if _, ok := zero.Lookup("web.shoal."); ok || zero.Len() != 0 {
		t.Fatal("zero Records not empty")
	}

	// IPv6 addresses are served as AAAA.
	_, addr := start(t, Config{Records: r})
	r.Set(in)
	m := query(t, addr, "v6.shoal.", mdns.TypeAAAA, qopt{})
	if len(m.Answer) != 1 || m.Answer[0].(*mdns.AAAA).AAAA.String() != "fd00::1" {
		t.Fatalf("AAAA v6.shoal. = %v", m.Answer)
	}
}

// TestScope: a name Scope hides from a client is NXDOMAIN to it, over UDP
// and TCP; the client is answered with the addresses Scope gives; and the
// client Scope is asked about is the one asking.
func TestScope(t *testing.T) {
	var mu sync.Mutex
	var asked []string
	_, addr := start(t, Config{Records: NewRecords(baseRecords()), Scope: func(client netip.Addr, name string, addrs []netip.Addr) ([]netip.Addr, bool) {
		mu.Lock()
		asked = append(asked, client.String()+" "+name)
		mu.Unlock()
		if name == "web.shoal." {
			return addrs[:2], true
		}
		return addrs, name != "1.web.shoal."
	}})
	for _, tr := range []string{"udp", "tcp"} {
		m := query(t, addr, "web.shoal.", mdns.TypeA, qopt{net: tr})
		if got := sorted(aAddrs(t, m)); m.Rcode != mdns.RcodeSuccess || !slices.Equal(got, []netip.Addr{web1, web2}) {
			t.Fatalf("%s: web.shoal.: rcode %s, answers %v; want %v and %v, the two Scope gives", tr, mdns.RcodeToString[m.Rcode], got, web1, web2)
		}
		m = query(t, addr, "1.Web.shoal.", mdns.TypeA, qopt{net: tr})
		if m.Rcode != mdns.RcodeNameError || len(m.Answer) != 0 || !m.Authoritative {
			t.Fatalf("%s: hidden 1.web.shoal.: rcode %s, %d answers", tr, mdns.RcodeToString[m.Rcode], len(m.Answer))
		}
		wantSOA(t, m)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 4 || asked[1] != "127.0.0.1 1.web.shoal." {
		t.Fatalf("Scope asked %q, want the client's address and the canonical name", asked)
	}
}

// TestForwards: a client Forwards refuses is REFUSED names outside the
// zone, and the upstream never asked; names in the zone it still gets;
// other clients are forwarded as before.
func TestForwards(t *testing.T) {
	var seen sync.Map
	up := fakeUpstream(t, answering(1, &seen))
	_, addr := start(t, Config{Records: NewRecords(baseRecords()), Upstreams: []string{up},
		Forwards: func(client netip.Addr) bool { return client != netip.MustParseAddr("127.0.0.1") }})
	if m := query(t, addr, "example.test.", mdns.TypeA, qopt{}); m.Rcode != mdns.RcodeRefused || len(m.Answer) != 0 {
		t.Fatalf("example.test. for a refused client: rcode %s, %d answers; want REFUSED", mdns.RcodeToString[m.Rcode], len(m.Answer))
	}
	seen.Range(func(k, _ any) bool { t.Errorf("the upstream was asked %v", k); return true })
	if m := query(t, addr, "web.shoal.", mdns.TypeA, qopt{}); m.Rcode != mdns.RcodeSuccess || len(m.Answer) != 3 {
		t.Fatalf("web.shoal. for a refused client: rcode %s, %d answers", mdns.RcodeToString[m.Rcode], len(m.Answer))
	}
	_, other := start(t, Config{Upstreams: []string{up}, Forwards: func(netip.Addr) bool { return true }})
	if m := query(t, other, "example.test.", mdns.TypeA, qopt{}); m.Rcode != mdns.RcodeSuccess || len(m.Answer) != 1 {
		t.Fatalf("example.test. forwarded: rcode %s, %d answers", mdns.RcodeToString[m.Rcode], len(m.Answer))
	}
}
