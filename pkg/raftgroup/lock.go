package raftgroup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Locks and leases on the typed state machine.
//
// A lease is granted by a committed entry; its fencing token is that
// entry's log index, so tokens of successive holders strictly increase. A
// lease expires TTL after the group time of the entry that granted or last
// renewed it. Expiry is decided when an entry applies, from the group
// clock (the greatest proposer wall time in the log so far), never from a
// replica's local clock: every replica makes the same decision. A holder
// that cannot renew must stop acting before its TTL runs out by its own
// clock (counted from before it proposed); a resource that must not be
// touched by a stale holder checks the token (SetFenced, or comparing
// tokens), which is safe whatever the clocks do.

// Lease is a granted lock.
type Lease struct {
	Name   string `json:"name"`
	Holder string `json:"holder"`
	// Token is the fencing token: the index of the acquiring entry.
	Token uint64 `json:"token"`
	// Expires is the group time at which the lease lapses unless renewed.
	Expires time.Time `json:"expires"`
}

var (
	// ErrLockHeld is returned when another holder has the lock.
	ErrLockHeld = errors.New("raftgroup: lock held")
	// ErrLeaseLost is returned when renewing or releasing a lease that is
	// not the lock's current one (expired and taken, or released).
	ErrLeaseLost = errors.New("raftgroup: lease lost")
)

type lockAcquire struct {
	Name   string        `json:"name"`
	Holder string        `json:"holder"`
	TTL    time.Duration `json:"ttl"`
}

type lockRenew struct {
	Name   string        `json:"name"`
	Holder string        `json:"holder"`
	Token  uint64        `json:"token"`
	TTL    time.Duration `json:"ttl"`
}

type lockRelease struct {
	Name   string `json:"name"`
	Holder string `json:"holder"`
	Token  uint64 `json:"token"`
}

type lockResult struct {
	Granted bool   `json:"granted"`
	Lease   *Lease `json:"lease,omitempty"` // the current lease, if any
}

// lockTable is the replicated lock state.
type lockTable struct {
	leases map[string]*Lease
}

func newLockTable() *lockTable { return &lockTable{leases: map[string]*Lease{}} }

// live returns the lock's lease if it has not expired at group time now.
func (t *lockTable) live(name string, now time.Time) *Lease {
	l := t.leases[name]
	if l == nil || !now.Before(l.Expires) {
		return nil
	}
	return l
}

func (t *lockTable) valid(name string, token uint64, now time.Time) bool {
	l := t.live(name, now)
	return l != nil && l.Token == token
}

// apply handles the lock messages; ok is false for other messages.
func (t *lockTable) apply(c Command) (any, bool) {
	switch m := c.Msg.(type) {
	case *lockAcquire:
		cur := t.live(m.Name, c.Time)
		switch {
		case cur != nil && cur.Holder != m.Holder:
			return lockResult{Lease: copyLease(cur)}, true
		case cur != nil:
			// Acquiring again while holding: the same lease, extended.
			cur.Expires = c.Time.Add(m.TTL)
		default:
			cur = &Lease{Name: m.Name, Holder: m.Holder, Token: c.Index, Expires: c.Time.Add(m.TTL)}
			t.leases[m.Name] = cur
		}
		return lockResult{Granted: true, Lease: copyLease(cur)}, true
	case *lockRenew:
		cur := t.live(m.Name, c.Time)
		if cur == nil || cur.Holder != m.Holder || cur.Token != m.Token {
			return lockResult{Lease: copyLease(cur)}, true
		}
		cur.Expires = c.Time.Add(m.TTL)
		return lockResult{Granted: true, Lease: copyLease(cur)}, true
	case *lockRelease:
		cur := t.leases[m.Name]
		if cur == nil || cur.Holder != m.Holder || cur.Token != m.Token {
			return lockResult{Lease: copyLease(t.live(m.Name, c.Time))}, true
		}
		delete(t.leases, m.Name)
		return lockResult{Granted: true}, true
	}
	return nil, false
}

func copyLease(l *Lease) *Lease {
	if l == nil {
		return nil
	}
	c := *l
	return &c
}

func (t *lockTable) list() []Lease {
	out := make([]Lease, 0, len(t.leases))
	for _, l := range t.leases {
		out = append(out, *l)
	}
	slices.SortFunc(out, func(a, b Lease) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func (t *lockTable) snapshot() ([]byte, error) { return json.Marshal(t.list()) }

func restoreLockTable(data []byte) (*lockTable, error) {
	t := newLockTable()
	if len(data) == 0 {
		return t, nil
	}
	var ls []Lease
	if err := json.Unmarshal(data, &ls); err != nil {
		return nil, fmt.Errorf("raftgroup: lock table: %w", err)
	}
	for i := range ls {
		t.leases[ls[i].Name] = &ls[i]
	}
	return t, nil
}

// AcquireLock takes lock name of group id for holder, for ttl (group
// time). If another holder has it and it has not expired, the error is
// ErrLockHeld and the returned lease is the current one. Acquiring a lock
// one already holds extends it and keeps its token.
func (h *Host) AcquireLock(ctx context.Context, id GroupID, name, holder string, ttl time.Duration) (Lease, error) {
	return h.AcquireLockAsync(id, name, holder, ttl).Wait(ctx)
}

// AcquireLockAsync is AcquireLock's asynchronous form.
func (h *Host) AcquireLockAsync(id GroupID, name, holder string, ttl time.Duration) *Future[Lease] {
	return h.lockOp(&lockAcquire{Name: name, Holder: holder, TTL: ttl}, id, ErrLockHeld)
}

// RenewLock extends lease l by ttl from now (group time); ErrLeaseLost if
// it is no longer the lock's current lease.
func (h *Host) RenewLock(ctx context.Context, id GroupID, l Lease, ttl time.Duration) (Lease, error) {
	return h.RenewLockAsync(id, l, ttl).Wait(ctx)
}

// RenewLockAsync is RenewLock's asynchronous form.
func (h *Host) RenewLockAsync(id GroupID, l Lease, ttl time.Duration) *Future[Lease] {
	return h.lockOp(&lockRenew{Name: l.Name, Holder: l.Holder, Token: l.Token, TTL: ttl}, id, ErrLeaseLost)
}

// ReleaseLock releases lease l; ErrLeaseLost if it was not current.
func (h *Host) ReleaseLock(ctx context.Context, id GroupID, l Lease) error {
	_, err := h.ReleaseLockAsync(id, l).Wait(ctx)
	return err
}

// ReleaseLockAsync is ReleaseLock's asynchronous form.
func (h *Host) ReleaseLockAsync(id GroupID, l Lease) *Future[Lease] {
	return h.lockOp(&lockRelease{Name: l.Name, Holder: l.Holder, Token: l.Token}, id, ErrLeaseLost)
}

func (h *Host) lockOp(msg any, id GroupID, denied error) *Future[Lease] {
	return thenMap(h.submitTyped(id, msg, nil, false), func(r Result) (Lease, error) {
		var res lockResult
		if err := decodeResult(r.Data, &res); err != nil {
			return Lease{}, err
		}
		var l Lease
		if res.Lease != nil {
			l = *res.Lease
		}
		if !res.Granted {
			return l, denied
		}
		return l, nil
	})
}

// Locks lists the leases of group id, linearizably (after a ReadIndex).
// Expired leases are listed until an entry replaces or releases them:
// compare Expires with the group clock (Status) to tell.
func (h *Host) Locks(ctx context.Context, id GroupID) ([]Lease, error) {
	if _, err := h.ReadIndex(ctx, id); err != nil {
		return nil, err
	}
	var (
		out []Lease
		err error
	)
	if werr := h.WithStateMachine(id, func(sm StateMachine, _ uint64) {
		t, ok := sm.(*Typed)
		if !ok {
			err = ErrNotTyped
			return
		}
		t.mu.RLock()
		out = t.locks.list()
		t.mu.RUnlock()
	}); werr != nil {
		return nil, werr
	}
	return out, err
}
