package overlay

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
)

// ErrFull means every address of the subnet is allocated.
var ErrFull = errors.New("overlay: subnet full")

// IPAM allocates task addresses in a node's subnet. The network address,
// .1 (the node's bridge, Gateway) and the broadcast address are never
// handed out: a /24 has 253 addresses, .2–.254.
//
// Allocation is next-fit: the search starts after the address allocated
// last and wraps, so a released address is reused as late as possible
// (stale DNS answers and conntrack entries for a removed task do not reach
// its successor). It is deterministic: the same operations from the same
// state give the same addresses. An IPAM is not safe for concurrent use;
// MarshalJSON/UnmarshalJSON persist it (<state-dir>/ipam.json).
type IPAM struct {
	subnet  netip.Prefix
	first   netip.Addr // .2
	last    netip.Addr // broadcast - 1
	cursor  netip.Addr // the address allocated last (Gateway when none)
	byAddr  map[netip.Addr]string
	byOwner map[string]netip.Addr
}

// Allocation is one allocated address and its owner (a task ID).
type Allocation struct {
	Addr  netip.Addr `json:"addr"`
	Owner string     `json:"owner"`
}

// NewIPAM returns an empty IPAM for subnet, an IPv4 prefix from /8 to /30
// with no host bits set.
func NewIPAM(subnet netip.Prefix) (*IPAM, error) {
	if !subnet.IsValid() || !subnet.Addr().Is4() || subnet.Bits() < 8 || subnet.Bits() > 30 || subnet.Masked() != subnet {
		return nil, fmt.Errorf("overlay: IPAM subnet %v must be an IPv4 network prefix from /8 to /30", subnet)
	}
	a := subnet.Addr().As4()
	n := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	bcast := n | (1<<(32-subnet.Bits()) - 1)
	gw := subnet.Addr().Next()
	return &IPAM{
		subnet:  subnet,
		first:   gw.Next(),
		last:    addrFromUint32(bcast - 1),
		cursor:  gw,
		byAddr:  map[netip.Addr]string{},
		byOwner: map[string]netip.Addr{},
	}, nil
}

func addrFromUint32(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// Subnet is the IPAM's subnet.
func (p *IPAM) Subnet() netip.Prefix { return p.subnet }

// Gateway is the subnet's .1, the node's bridge address.
func (p *IPAM) Gateway() netip.Addr { return p.subnet.Addr().Next() }

// Cap is the number of addresses the IPAM can hand out.
func (p *IPAM) Cap() int { return 1<<(32-p.subnet.Bits()) - 3 }

// Len is the number of allocated addresses.
func (p *IPAM) Len() int { return len(p.byAddr) }

// Lookup returns owner's address.
func (p *IPAM) Lookup(owner string) (netip.Addr, bool) {
	a, ok := p.byOwner[owner]
	return a, ok
}

// Owner returns the owner of addr.
func (p *IPAM) Owner(addr netip.Addr) (string, bool) {
	o, ok := p.byAddr[addr]
	return o, ok
}

// Allocate returns an address for owner: the one it already has, or the
// next free one after the address allocated last. It returns ErrFull when
// no address is free.
func (p *IPAM) Allocate(owner string) (netip.Addr, error) {
	if owner == "" {
		return netip.Addr{}, errors.New("overlay: IPAM owner is empty")
	}
	if a, ok := p.byOwner[owner]; ok {
		return a, nil
	}
	if p.Len() >= p.Cap() {
		return netip.Addr{}, fmt.Errorf("%w: %v has %d addresses allocated", ErrFull, p.subnet, p.Len())
	}
	a := p.cursor
	for {
		a = a.Next()
		if a.Compare(p.last) > 0 {
			a = p.first
		}
		if _, used := p.byAddr[a]; !used {
			break
		}
	}
	p.byAddr[a], p.byOwner[owner], p.cursor = owner, a, a
	return a, nil
}

// Release frees owner's address and returns it; ok is false when owner
// had none.
func (p *IPAM) Release(owner string) (addr netip.Addr, ok bool) {
	a, ok := p.byOwner[owner]
	if ok {
		delete(p.byOwner, owner)
		delete(p.byAddr, a)
	}
	return a, ok
}

// Allocations lists the allocated addresses in address order.
func (p *IPAM) Allocations() []Allocation {
	out := make([]Allocation, 0, len(p.byAddr))
	for a, o := range p.byAddr {
		out = append(out, Allocation{Addr: a, Owner: o})
	}
	slices.SortFunc(out, func(x, y Allocation) int { return x.Addr.Compare(y.Addr) })
	return out
}

type ipamJSON struct {
	Subnet      netip.Prefix `json:"subnet"`
	Last        netip.Addr   `json:"last"`
	Allocations []Allocation `json:"allocations"`
}

// MarshalJSON encodes the subnet, the address allocated last and the
// allocations in address order, so equal IPAMs encode to equal bytes.
func (p *IPAM) MarshalJSON() ([]byte, error) {
	return json.Marshal(ipamJSON{Subnet: p.subnet, Last: p.cursor, Allocations: p.Allocations()})
}

// UnmarshalJSON replaces p with the decoded IPAM, after checking that every
// address is allocatable in the subnet and that no address or owner
// appears twice.
func (p *IPAM) UnmarshalJSON(b []byte) error {
	var j ipamJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	q, err := NewIPAM(j.Subnet)
	if err != nil {
		return err
	}
	if j.Last.IsValid() {
		if !q.subnet.Contains(j.Last) || j.Last.Compare(q.Gateway()) < 0 || j.Last.Compare(q.last) > 0 {
			return fmt.Errorf("overlay: IPAM last %v outside %v–%v", j.Last, q.Gateway(), q.last)
		}
		q.cursor = j.Last
	}
	for _, a := range j.Allocations {
		switch {
		case a.Owner == "":
			return fmt.Errorf("overlay: IPAM address %v has no owner", a.Addr)
		case !a.Addr.IsValid() || !q.subnet.Contains(a.Addr) || a.Addr.Compare(q.first) < 0 || a.Addr.Compare(q.last) > 0:
			return fmt.Errorf("overlay: IPAM address %v is not allocatable in %v", a.Addr, q.subnet)
		}
		if _, dup := q.byAddr[a.Addr]; dup {
			return fmt.Errorf("overlay: IPAM address %v allocated twice", a.Addr)
		}
		if _, dup := q.byOwner[a.Owner]; dup {
			return fmt.Errorf("overlay: IPAM owner %q has two addresses", a.Owner)
		}
		q.byAddr[a.Addr], q.byOwner[a.Owner] = a.Owner, a.Addr
	}
	*p = *q
	return nil
}
