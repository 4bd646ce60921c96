package dns

import (
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	mdns "github.com/miekg/dns"
)

// Records is the table of names the server answers for. The netd wiring
// computes it from state and replaces it as a whole with Set; readers never
// block and always see either the old or the new table. The zero value is an
// empty table, ready to use; it must not be copied after first use.
type Records struct {
	t atomic.Pointer[table]
}

type table struct {
	names map[string][]netip.Addr // lower-case FQDN → addresses
	// inner holds every proper ancestor of a name in names (empty
	// non-terminals): "web.shoal." exists when only "0.web.shoal." is set,
	// so it is NODATA, not NXDOMAIN (RFC 8020).
	inner  map[string]struct{}
	serial uint32
}

// NewRecords returns a table holding m (see Set).
func NewRecords(m map[string][]netip.Addr) *Records {
	r := &Records{}
	r.Set(m)
	return r
}

// Set replaces the whole table. Keys are fully qualified names such as
// "web.shoal." and "0.web.shoal."; they are matched case-insensitively and a
// missing final dot is added. A key with no addresses still exists (NODATA,
// e.g. a service without healthy tasks). IPv4-mapped IPv6 addresses are
// stored as IPv4; invalid addresses are dropped. Set copies m, so the caller
// may reuse it.
func (r *Records) Set(m map[string][]netip.Addr) {
	t := &table{
		names: make(map[string][]netip.Addr, len(m)),
		inner: make(map[string]struct{}),
	}
	for name, addrs := range m {
		key := canonical(name)
		if key == "" {
			continue
		}
		list := t.names[key]
		if list == nil {
			list = make([]netip.Addr, 0, len(addrs))
		}
		for _, a := range addrs {
			if a.IsValid() {
				list = append(list, a.Unmap())
			}
		}
		t.names[key] = list
		for i, end := mdns.NextLabel(key, 0); !end; i, end = mdns.NextLabel(key, i) {
			t.inner[key[i:]] = struct{}{}
		}
	}
	// The serial only has to move forward (no zone transfers use it); a
	// clock-based start keeps it moving across restarts.
	serial := uint32(time.Now().Unix())
	if old := r.t.Load(); old != nil && serial <= old.serial {
		serial = old.serial + 1
	}
	t.serial = serial
	r.t.Store(t)
}

// Lookup returns the addresses of name and whether the name exists (is set,
// or is an ancestor of a name that is set). The returned slice must not be
// modified.
func (r *Records) Lookup(name string) (addrs []netip.Addr, exists bool) {
	t := r.t.Load()
	if t == nil {
		return nil, false
	}
	key := canonical(name)
	if a, ok := t.names[key]; ok {
		return a, true
	}
	_, ok := t.inner[key]
	return nil, ok
}

// Len is the number of names set.
func (r *Records) Len() int {
	if t := r.t.Load(); t != nil {
		return len(t.names)
	}
	return 0
}

func (r *Records) serial() uint32 {
	if t := r.t.Load(); t != nil {
		return t.serial
	}
	return 1
}

// canonical lower-cases name and makes it fully qualified.
func canonical(name string) string {
	name = strings.TrimSpace(name)
	if name == "" || name == "." {
		return name
	}
	return strings.ToLower(mdns.Fqdn(name))
}
