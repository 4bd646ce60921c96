// Package hlc implements a hybrid logical clock (Kulkarni et al., 2014).
//
// Shoal orders every write to replicated state by an HLC timestamp, with the
// writer's node ID breaking ties (see package crdt). An HLC stays close to
// physical time, so last-writer-wins behaves as an operator expects, yet it
// never goes backwards and always moves past any timestamp it has observed,
// so causally later writes win even when wall clocks disagree.
//
// A remote timestamp far ahead of the local wall clock would drag every
// later local timestamp with it and let one node with a broken clock win all
// conflicts. Clock.Observe rejects such timestamps (ErrSkew) instead; the
// caller counts and drops the update that carried it.
//
// The package is pure: the physical clock is injected, so tests are
// deterministic.
package hlc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
)

// Timestamp is a point in hybrid logical time. Wall is nanoseconds since the
// Unix epoch as seen by the clock that issued (or last advanced) it; Logical
// orders events within the same Wall value.
type Timestamp struct {
	Wall    int64
	Logical uint32
}

// EncodedLen is the length of Timestamp.AppendBinary's output.
const EncodedLen = 12

// Compare returns -1, 0 or +1 as t is before, equal to or after u.
func (t Timestamp) Compare(u Timestamp) int {
	switch {
	case t.Wall < u.Wall:
		return -1
	case t.Wall > u.Wall:
		return 1
	case t.Logical < u.Logical:
		return -1
	case t.Logical > u.Logical:
		return 1
	}
	return 0
}

// Less reports whether t is strictly before u.
func (t Timestamp) Less(u Timestamp) bool { return t.Compare(u) < 0 }

// IsZero reports whether t is the zero timestamp, which precedes all others.
func (t Timestamp) IsZero() bool { return t == Timestamp{} }

// String formats t as wall-time.logical, e.g. 1700000000000000000.3.
func (t Timestamp) String() string { return fmt.Sprintf("%d.%d", t.Wall, t.Logical) }

// Time returns the physical part of t.
func (t Timestamp) Time() time.Time { return time.Unix(0, t.Wall) }

// AppendBinary appends a big-endian encoding of t whose byte order matches
// Compare for non-negative Wall values, so encoded timestamps sort correctly
// as keys.
func (t Timestamp) AppendBinary(b []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(t.Wall))
	return binary.BigEndian.AppendUint32(b, t.Logical)
}

// Decode reads a timestamp written by AppendBinary.
func Decode(b []byte) (Timestamp, error) {
	if len(b) < EncodedLen {
		return Timestamp{}, fmt.Errorf("hlc: timestamp needs %d bytes, have %d", EncodedLen, len(b))
	}
	return Timestamp{
		Wall:    int64(binary.BigEndian.Uint64(b)),
		Logical: binary.BigEndian.Uint32(b[8:]),
	}, nil
}

// ErrSkew is returned by Observe for a timestamp further ahead of the local
// physical clock than the configured maximum skew.
var ErrSkew = errors.New("hlc: remote timestamp beyond max clock skew")

// Clock issues timestamps. It is safe for concurrent use.
type Clock struct {
	physical func() int64
	maxSkew  time.Duration

	mu   sync.Mutex
	last Timestamp
	// NB: rejected is read by Stats without a separate lock; both fields
	// share mu.
	rejected uint64
}

// DefaultMaxSkew is the default bound on how far ahead of the local clock a
// remote timestamp may be (CockroachDB uses the same default).
const DefaultMaxSkew = 500 * time.Millisecond

// NewClock returns a clock reading physical time from physical (nanoseconds
// since the epoch; time.Now().UnixNano when nil) that rejects remote
// timestamps more than maxSkew ahead (DefaultMaxSkew when zero).
func NewClock(physical func() int64, maxSkew time.Duration) *Clock {
	if physical == nil {
		physical = func() int64 { return time.Now().UnixNano() }
	}
	if maxSkew <= 0 {
		maxSkew = DefaultMaxSkew
	}
	return &Clock{physical: physical, maxSkew: maxSkew}
}

// Now returns a timestamp strictly after every timestamp previously returned
// by Now or passed to Observe or Restore.
func (c *Clock) Now() Timestamp {
	c.mu.Lock()
	defer c.mu.Unlock()
	pt := c.physical()
	if pt > c.last.Wall {
		c.last = Timestamp{Wall: pt}
	} else {
		c.last.Logical++
		if c.last.Logical == 0 { // overflow: borrow a nanosecond
			c.last.Wall++
		}
	}
	return c.last
}

// Observe advances the clock past a timestamp received from another node so
// that later local events order after it. A timestamp more than the max skew
// ahead of local physical time is rejected with ErrSkew and counted; the
// clock is unchanged.
func (c *Clock) Observe(remote Timestamp) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	pt := c.physical()
	// Compare in uint64: remote.Wall-pt overflows int64 for extreme
	// (corrupt or hostile) walls, which would reject the far past and
	// accept the far future.
	if remote.Wall > pt && uint64(remote.Wall)-uint64(pt) > uint64(c.maxSkew) {
		c.rejected++
		return fmt.Errorf("%w: %v ahead (max %v)", ErrSkew, time.Duration(min(uint64(remote.Wall)-uint64(pt), math.MaxInt64)), c.maxSkew)
	}
	if c.last.Less(remote) {
		c.last = remote
	}
	return nil
}

// Restore advances the clock to at least t without a skew check. It is used
// at start-up with the highest timestamp persisted locally, so a restart
// never issues a timestamp at or below one issued before it, even if the
// wall clock moved backwards.
func (c *Clock) Restore(t Timestamp) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last.Less(t) {
		c.last = t
	}
}

// Last returns the most recent timestamp issued or observed.
func (c *Clock) Last() Timestamp {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// Rejected returns how many remote timestamps Observe has rejected.
func (c *Clock) Rejected() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rejected
}

// MaxSkew returns the configured maximum skew.
func (c *Clock) MaxSkew() time.Duration { return c.maxSkew }
