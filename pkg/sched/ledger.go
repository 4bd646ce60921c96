package sched

import (
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
)

// DefaultTTL is how long an unconfirmed reservation lives: the time an
// owner has between an accepted Reserve and the slot write that names the
// task. It also bounds how long an owner waits for the task document of a
// task its slot names, and how long a task of a deleted slot outlives it.
const DefaultTTL = 10 * time.Second

// Reservation is a claim on a node's resources for one task.
type Reservation struct {
	TaskID  string
	Service string
	Slot    string
	Version int64
	// Resources and the host-mode Ports are what the ledger counts.
	Resources Resources
	Ports     []Port
	// TTL is how long the reservation lives unconfirmed (the ledger's
	// default when zero).
	TTL time.Duration
	// Created and Confirmed are set by the Ledger.
	Created   time.Time
	Confirmed bool
}

// Expired reports whether r is unconfirmed and older than its TTL at now.
func (r Reservation) Expired(now time.Time) bool {
	return !r.Confirmed && !now.Before(r.Created.Add(r.TTL))
}

// Ledger is a node's record of the reservations it has accepted: the only
// stateful piece of the scheduler, and the one that keeps a node from being
// overcommitted whatever owners believe. Every method is atomic; it is safe
// for concurrent use.
//
// A reservation lives from Reserve until Release. Until Confirm (the slot
// document names its task) it expires TTL after its creation: Expire drops
// it and returns it, so the node stops the task, and an owner that crashed
// between Reserve and its slot write leaks nothing.
type Ledger struct {
	ttl time.Duration

	mu sync.Mutex
	// capacity, used and ports are guarded by mu; used and ports are
	// always the sums over res.
	capacity Resources
	used     Resources
	ports    map[string]string // host port key → task ID
	res      map[string]*Reservation
}

// NewLedger returns an empty ledger for a node of the given capacity;
// unconfirmed reservations without their own TTL live ttl (DefaultTTL when
// zero).
func NewLedger(capacity Resources, ttl time.Duration) *Ledger {
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	return &Ledger{ttl: ttl, capacity: capacity, ports: map[string]string{}, res: map[string]*Reservation{}}
}

// Reserve records r if it fits: the sum of the live reservations plus r
// stays within capacity and none of r's host ports is taken. It returns
// whether r is (now) recorded, the free resources after the decision, and
// why it was rejected. Reserving a task ID that is already recorded is
// accepted without counting it twice (a retried call).
func (l *Ledger) Reserve(r Reservation, now time.Time) (ok bool, free Resources, why Reject) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, dup := l.res[r.TaskID]; dup {
		return true, l.capacity.Sub(l.used), Reject{}
	}
	var bound map[string]bool
	for _, p := range r.Ports {
		if _, taken := l.ports[p.hostPortKey()]; taken {
			if bound == nil {
				bound = map[string]bool{}
			}
			bound[p.hostPortKey()] = true
		}
	}
	free = l.capacity.Sub(l.used)
	if why = fits(r.Resources, r.Ports, free, bound); !why.OK() {
		return false, free, why
	}
	r.Created, r.Confirmed = now, false
	if r.TTL <= 0 {
		r.TTL = l.ttl
	}
	r.Ports = slices.Clone(r.Ports)
	l.insert(&r)
	return true, l.capacity.Sub(l.used), Reject{}
}

// Adopt records r as confirmed without checking capacity. schedd uses it
// on start to rebuild the ledger from the tasks it finds running (they
// were admitted before; the capacity may have shrunk since).
func (l *Ledger) Adopt(r Reservation) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, dup := l.res[r.TaskID]; dup {
		return
	}
	r.Confirmed = true
	r.Ports = slices.Clone(r.Ports)
	l.insert(&r)
}

func (l *Ledger) insert(r *Reservation) {
	l.res[r.TaskID] = r
	l.used = l.used.Add(r.Resources)
	for _, p := range r.Ports {
		l.ports[p.hostPortKey()] = r.TaskID
	}
}

// Confirm makes the reservation of task permanent (until Release). It
// reports whether the ledger holds it.
func (l *Ledger) Confirm(taskID string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.res[taskID]
	if ok {
		r.Confirmed = true
	}
	return ok
}

// Release drops the reservation of task and reports whether there was
// one.
func (l *Ledger) Release(taskID string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.remove(taskID)
}

func (l *Ledger) remove(taskID string) bool {
	r, ok := l.res[taskID]
	if !ok {
		return false
	}
	delete(l.res, taskID)
	l.used = l.used.Sub(r.Resources)
	for _, p := range r.Ports {
		if l.ports[p.hostPortKey()] == taskID {
			delete(l.ports, p.hostPortKey())
		}
	}
	return true
}

// Expire drops the unconfirmed reservations older than their TTL and
// returns them (sorted by task ID) so the caller stops their tasks.
func (l *Ledger) Expire(now time.Time) []Reservation {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Reservation
	for id, r := range l.res {
		if r.Expired(now) {
			out = append(out, *r)
			l.remove(id)
		}
	}
	slices.SortFunc(out, func(a, b Reservation) int { return strings.Compare(a.TaskID, b.TaskID) })
	return out
}

// Usage returns the sum of the live reservations.
func (l *Ledger) Usage() Resources {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.used
}

// Free returns capacity minus usage (negative after a capacity cut below
// adopted usage).
func (l *Ledger) Free() Resources {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.capacity.Sub(l.used)
}

// Capacity returns the node's capacity.
func (l *Ledger) Capacity() Resources {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.capacity
}

// SetCapacity changes the node's capacity (a configuration change). Live
// reservations stay; new ones must fit the new capacity.
func (l *Ledger) SetCapacity(c Resources) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.capacity = c
}

// Reservations returns a copy of every live reservation, sorted by task ID:
// the ledger part of an agent's NodeView.
func (l *Ledger) Reservations() []Reservation {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Reservation, 0, len(l.res))
	for _, id := range slices.Sorted(maps.Keys(l.res)) {
		out = append(out, *l.res[id])
	}
	return out
}

// Get returns the reservation of task, if any.
func (l *Ledger) Get(taskID string) (Reservation, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.res[taskID]
	if !ok {
		return Reservation{}, false
	}
	return *r, true
}
