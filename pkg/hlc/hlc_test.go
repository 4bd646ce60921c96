package hlc_test

import (
	"bytes"
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/shoal-dev/shoal/pkg/hlc"
)

// fakePhysical is an injectable physical clock.
type fakePhysical struct{ ns int64 }

func (p *fakePhysical) read() int64 { return p.ns }

func ts(wall int64, logical uint32) hlc.Timestamp {
	return hlc.Timestamp{Wall: wall, Logical: logical}
}

const base = int64(1_700_000_000_000_000_000)

// ---------------------------------------------------------------------------
// Timestamp basics

func TestTimestampCompare(t *testing.T) {
	cases := []struct {
		a, b hlc.Timestamp
		want int
	}{
		{ts(0, 0), ts(0, 0), 0},
		{ts(1, 0), ts(1, 0), 0},
		{ts(1, 5), ts(1, 5), 0},
		{ts(1, 0), ts(2, 0), -1},
		{ts(2, 0), ts(1, 0), 1},
		{ts(1, 1), ts(1, 2), -1},
		{ts(1, 2), ts(1, 1), 1},
		{ts(1, math.MaxUint32), ts(2, 0), -1}, // wall dominates logical
		{ts(-1, 0), ts(0, 0), -1},
		{ts(math.MinInt64, 0), ts(math.MaxInt64, 0), -1},
		{ts(0, math.MaxUint32), ts(0, 0), 1},
	}
	for _, c := range cases {
		if got := c.a.Compare(c.b); got != c.want {
			t.Errorf("%v.Compare(%v) = %d, want %d", c.a, c.b, got, c.want)
		}
		if got := c.b.Compare(c.a); got != -c.want {
			t.Errorf("%v.Compare(%v) = %d, want %d", c.b, c.a, got, -c.want)
		}
		if got := c.a.Less(c.b); got != (c.want < 0) {
			t.Errorf("%v.Less(%v) = %v, want %v", c.a, c.b, got, c.want < 0)
		}
	}
}

func TestTimestampIsZeroStringTime(t *testing.T) {
	if !(hlc.Timestamp{}).IsZero() {
		t.Errorf("zero timestamp: IsZero = false")
	}
	for _, x := range []hlc.Timestamp{ts(1, 0), ts(0, 1), ts(-1, 0)} {
		if x.IsZero() {
			t.Errorf("%v.IsZero() = true", x)
		}
		// The zero timestamp precedes every timestamp a Clock can issue
		// (walls are never negative); a negative wall sorts below it.
		if got, want := (hlc.Timestamp{}).Less(x), x.Wall >= 0; got != want {
			t.Errorf("zero.Less(%v) = %v, want %v", x, got, want)
		}
	}
	if got, want := ts(1700000000000000000, 3).String(), "1700000000000000000.3"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	if got, want := ts(-5, 0).String(), "-5.0"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	now := time.Date(2024, 9, 17, 12, 0, 0, 123456789, time.UTC)
	if got := ts(now.UnixNano(), 42).Time(); !got.Equal(now) {
		t.Errorf("Time() = %v, want %v", got, now)
	}
}

// ---------------------------------------------------------------------------
// Binary encoding

func TestAppendBinaryLayout(t *testing.T) {
	x := ts(0x0102030405060708, 0x090a0b0c)
	want := []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	got := x.AppendBinary(nil)
	if !bytes.Equal(got, want) {
		t.Fatalf("AppendBinary = %x, want %x", got, want)
	}
	if len(got) != hlc.EncodedLen {
		t.Fatalf("len = %d, want EncodedLen %d", len(got), hlc.EncodedLen)
	}
	// Appends after an existing prefix without touching it.
	prefix := []byte("key/")
	got = x.AppendBinary(bytes.Clone(prefix))
	if !bytes.Equal(got, append(bytes.Clone(prefix), want...)) {
		t.Fatalf("AppendBinary with prefix = %x", got)
	}
	// Decode reads the first EncodedLen bytes and ignores the rest.
	dec, err := hlc.Decode(append(bytes.Clone(want), 0xff, 0xee))
	if err != nil || dec != x {
		t.Fatalf("Decode with trailing bytes = %v, %v; want %v", dec, err, x)
	}
	// Negative walls survive a round trip too.
	neg := ts(-1, 7)
	if dec, err := hlc.Decode(neg.AppendBinary(nil)); err != nil || dec != neg {
		t.Fatalf("Decode(negative) = %v, %v; want %v", dec, err, neg)
	}
}

func TestDecodeShort(t *testing.T) {
	full := ts(base, 9).AppendBinary(nil)
	for n := 0; n < hlc.EncodedLen; n++ {
		got, err := hlc.Decode(full[:n])
		if err == nil {
			t.Errorf("Decode(%d bytes) succeeded: %v", n, got)
		}
		if !got.IsZero() {
			t.Errorf("Decode(%d bytes) returned non-zero %v with error", n, got)
		}
	}
}

func TestBinaryRoundTripAndOrderProperty(t *testing.T) {
	anyTS := rapid.Custom(func(t *rapid.T) hlc.Timestamp {
		return ts(rapid.Int64().Draw(t, "wall"), rapid.Uint32().Draw(t, "logical"))
	})
	nonNegTS := rapid.Custom(func(t *rapid.T) hlc.Timestamp {
		// Draw walls close together sometimes so the logical part matters.
		w := rapid.Int64Min(0).Draw(t, "wall")
		return ts(w, rapid.Uint32().Draw(t, "logical"))
	})
	t.Run("roundtrip", rapid.MakeCheck(func(t *rapid.T) {
		x := anyTS.Draw(t, "x")
		b := x.AppendBinary(nil)
		if len(b) != hlc.EncodedLen {
			t.Fatalf("len(AppendBinary) = %d", len(b))
		}
		got, err := hlc.Decode(b)
		if err != nil {
			t.Fatalf("Decode: %v", err)
		}
		if got != x {
			t.Fatalf("round trip %v -> %x -> %v", x, b, got)
		}
	}))
	t.Run("order", rapid.MakeCheck(func(t *rapid.T) {
		a := nonNegTS.Draw(t, "a")
		var b hlc.Timestamp
		switch rapid.IntRange(0, 2).Draw(t, "shape") {
		case 0:
			b = nonNegTS.Draw(t, "b")
		case 1: // same wall, different logical
			b = ts(a.Wall, rapid.Uint32().Draw(t, "logical"))
		case 2: // neighbouring wall
			w := a.Wall + rapid.Int64Range(-1, 1).Draw(t, "dw")
			if w < 0 {
				w = 0
			}
			b = ts(w, rapid.Uint32().Draw(t, "logical"))
		}
		got := bytes.Compare(a.AppendBinary(nil), b.AppendBinary(nil))
		if want := a.Compare(b); got != want {
			t.Fatalf("bytes.Compare(enc(%v), enc(%v)) = %d, Compare = %d", a, b, got, want)
		}
	}))
}

// ---------------------------------------------------------------------------
// Clock

func TestNewClockDefaults(t *testing.T) {
	for _, skew := range []time.Duration{0, -time.Second} {
		if got := hlc.NewClock(func() int64 { return base }, skew).MaxSkew(); got != hlc.DefaultMaxSkew {
			t.Errorf("NewClock(skew=%v).MaxSkew() = %v, want %v", skew, got, hlc.DefaultMaxSkew)
		}
	}
	if got := hlc.NewClock(nil, 3*time.Second).MaxSkew(); got != 3*time.Second {
		t.Errorf("MaxSkew() = %v, want 3s", got)
	}
	// A nil physical clock means the system clock: the first timestamp is
	// the physical reading taken during the call.
	c := hlc.NewClock(nil, 0)
	before := time.Now().UnixNano()
	got := c.Now()
	after := time.Now().UnixNano()
	if got.Wall < before || got.Wall > after || got.Logical != 0 {
		t.Errorf("Now() = %v, want wall in [%d, %d] and logical 0", got, before, after)
	}
	if fresh := hlc.NewClock(nil, 0); !fresh.Last().IsZero() || fresh.Rejected() != 0 {
		t.Errorf("fresh clock: Last = %v, Rejected = %d", fresh.Last(), fresh.Rejected())
	}
}

func TestNowFollowsPhysicalTime(t *testing.T) {
	p := &fakePhysical{ns: base}
	c := hlc.NewClock(p.read, 0)
	steps := []struct {
		name    string
		advance int64
		want    hlc.Timestamp
	}{
		{"first reading", 0, ts(base, 0)},
		{"stalled", 0, ts(base, 1)},
		{"stalled again", 0, ts(base, 2)},
		{"forward", 10, ts(base+10, 0)},
		{"backward jump", -1000, ts(base+10, 1)},
		{"still behind", 500, ts(base+10, 2)},
		{"catches up exactly", 500, ts(base+10, 3)}, // physical == wall: not ahead
		{"passes", 1, ts(base+11, 0)},
		{"big forward jump", int64(time.Hour), ts(base+11+int64(time.Hour), 0)},
	}
	for _, s := range steps {
		p.ns += s.advance
		got := c.Now()
		if got != s.want {
			t.Fatalf("%s (physical %d): Now() = %v, want %v", s.name, p.ns, got, s.want)
		}
		if c.Last() != got {
			t.Fatalf("%s: Last() = %v, want %v", s.name, c.Last(), got)
		}
	}
}

func TestNowAfterObserveIsLater(t *testing.T) {
	p := &fakePhysical{ns: base}
	c := hlc.NewClock(p.read, time.Second)
	c.Now()
	for _, remote := range []hlc.Timestamp{
		ts(base+int64(time.Millisecond), 5),              // ahead, within skew
		ts(base+int64(time.Millisecond), 6),              // same wall, later logical
		ts(base+int64(time.Millisecond), math.MaxUint32), // logical at its maximum
		ts(base-int64(time.Hour), 99),                    // far behind: no effect
	} {
		before := c.Last()
		if err := c.Observe(remote); err != nil {
			t.Fatalf("Observe(%v): %v", remote, err)
		}
		want := before
		if want.Less(remote) {
			want = remote
		}
		if c.Last() != want {
			t.Fatalf("after Observe(%v): Last() = %v, want %v", remote, c.Last(), want)
		}
		got := c.Now()
		if !remote.Less(got) || !before.Less(got) {
			t.Fatalf("Now() = %v after Observe(%v) (previous %v): not strictly later", got, remote, before)
		}
	}
	// Observe does not itself issue a timestamp: observing a past timestamp
	// leaves Last alone, and the next Now is the ordinary successor.
	last := c.Last()
	if err := c.Observe(ts(1, 0)); err != nil {
		t.Fatal(err)
	}
	if c.Last() != last {
		t.Fatalf("Observe of the past moved Last from %v to %v", last, c.Last())
	}
}

func TestObserveSkewBound(t *testing.T) {
	const skew = 250 * time.Millisecond
	p := &fakePhysical{ns: base}
	c := hlc.NewClock(p.read, skew)
	start := c.Now()

	// One nanosecond beyond the bound: rejected, counted, clock unchanged.
	tooFar := ts(base+int64(skew)+1, 0)
	err := c.Observe(tooFar)
	if !errors.Is(err, hlc.ErrSkew) {
		t.Fatalf("Observe(%v) = %v, want error wrapping ErrSkew", tooFar, err)
	}
	if err == hlc.ErrSkew {
		t.Errorf("Observe returned bare ErrSkew; want a wrapped error with detail")
	}
	if c.Rejected() != 1 {
		t.Fatalf("Rejected() = %d, want 1", c.Rejected())
	}
	if c.Last() != start {
		t.Fatalf("rejected Observe moved Last from %v to %v", start, c.Last())
	}
	if got, want := c.Now(), ts(base, 1); got != want {
		t.Fatalf("Now after rejected Observe = %v, want %v", got, want)
	}

	// The logical part does not matter for the bound.
	if err := c.Observe(ts(base+int64(skew)+1, math.MaxUint32)); !errors.Is(err, hlc.ErrSkew) {
		t.Fatalf("Observe beyond bound with logical = %v, want ErrSkew", err)
	}
	if c.Rejected() != 2 {
		t.Fatalf("Rejected() = %d, want 2", c.Rejected())
	}

	// Exactly at the bound: accepted.
	atBound := ts(base+int64(skew), 7)
	if err := c.Observe(atBound); err != nil {
		t.Fatalf("Observe(%v) exactly at max skew: %v", atBound, err)
	}
	if c.Last() != atBound {
		t.Fatalf("Last() = %v, want %v", c.Last(), atBound)
	}
	if c.Rejected() != 2 {
		t.Fatalf("accepted Observe changed Rejected to %d", c.Rejected())
	}
	if got, want := c.Now(), ts(base+int64(skew), 8); got != want {
		t.Fatalf("Now() = %v, want %v", got, want)
	}

	// The bound is relative to physical time at the moment of Observe, not
	// to the clock's (possibly advanced) last timestamp.
	p.ns += int64(time.Second)
	if err := c.Observe(ts(p.ns+int64(skew), 0)); err != nil {
		t.Fatalf("Observe at bound after physical advance: %v", err)
	}
	if err := c.Observe(ts(p.ns+int64(skew)+1, 0)); !errors.Is(err, hlc.ErrSkew) {
		t.Fatalf("Observe beyond bound after physical advance = %v, want ErrSkew", err)
	}
	if c.Rejected() != 3 {
		t.Fatalf("Rejected() = %d, want 3", c.Rejected())
	}

	// Default skew.
	d := hlc.NewClock(p.read, 0)
	if err := d.Observe(ts(p.ns+int64(hlc.DefaultMaxSkew), 0)); err != nil {
		t.Fatalf("default skew, at bound: %v", err)
	}
	if err := d.Observe(ts(p.ns+int64(hlc.DefaultMaxSkew)+1, 0)); !errors.Is(err, hlc.ErrSkew) {
		t.Fatalf("default skew, beyond bound: %v", err)
	}
}

// A timestamp far in the past (here: so far that remote-physical overflows
// int64) is never "ahead" of the local clock.
func TestObserveFarPastIsNotSkew(t *testing.T) {
	p := &fakePhysical{ns: base}
	c := hlc.NewClock(p.read, 0)
	c.Now()
	for _, remote := range []hlc.Timestamp{ts(math.MinInt64, 0), ts(-base, 0), ts(0, 0)} {
		if err := c.Observe(remote); err != nil {
			t.Errorf("Observe(%v): %v", remote, err)
		}
	}
	if c.Rejected() != 0 {
		t.Errorf("Rejected() = %d, want 0", c.Rejected())
	}
	// A timestamp far in the future is rejected even when the difference
	// overflows.
	if err := c.Observe(ts(math.MaxInt64, 0)); !errors.Is(err, hlc.ErrSkew) {
		t.Errorf("Observe(max) = %v, want ErrSkew", err)
	}
	q := &fakePhysical{ns: -base} // a (broken) pre-1970 physical clock
	d := hlc.NewClock(q.read, 0)
	if err := d.Observe(ts(math.MaxInt64, 0)); !errors.Is(err, hlc.ErrSkew) {
		t.Errorf("pre-epoch clock: Observe(max) = %v, want ErrSkew", err)
	}
	if !d.Last().IsZero() {
		t.Errorf("pre-epoch clock: Last() = %v after rejected Observe", d.Last())
	}
}

func TestRestore(t *testing.T) {
	p := &fakePhysical{ns: base}
	c := hlc.NewClock(p.read, time.Millisecond)
	c.Now()

	// Restore ignores the skew bound: the persisted timestamp may be far
	// ahead if the wall clock went backwards across a restart.
	persisted := ts(base+int64(time.Hour), 3)
	c.Restore(persisted)
	if c.Last() != persisted {
		t.Fatalf("Last() = %v, want %v", c.Last(), persisted)
	}
	if got, want := c.Now(), ts(persisted.Wall, 4); got != want {
		t.Fatalf("Now after Restore = %v, want %v", got, want)
	}
	// Restoring an older timestamp never moves the clock back.
	c.Restore(ts(base, 0))
	if got, want := c.Now(), ts(persisted.Wall, 5); got != want {
		t.Fatalf("Now after stale Restore = %v, want %v", got, want)
	}
	if c.Rejected() != 0 {
		t.Fatalf("Restore counted a rejection")
	}

	// Fresh clock, physical time behind the restored value.
	q := &fakePhysical{ns: base - int64(time.Minute)}
	d := hlc.NewClock(q.read, 0)
	d.Restore(ts(base, math.MaxUint32))
	if got, want := d.Now(), ts(base+1, 0); got != want {
		t.Fatalf("Now after Restore at max logical = %v, want %v", got, want)
	}
}

func TestLogicalOverflowCarriesIntoWall(t *testing.T) {
	p := &fakePhysical{ns: 100}
	c := hlc.NewClock(p.read, 0)
	c.Restore(ts(100, math.MaxUint32-2))
	want := []hlc.Timestamp{
		ts(100, math.MaxUint32-1),
		ts(100, math.MaxUint32),
		ts(101, 0), // borrowed a nanosecond
		ts(101, 1),
	}
	for i, w := range want {
		if got := c.Now(); got != w {
			t.Fatalf("Now #%d = %v, want %v", i, got, w)
		}
	}
	// Physical time reaching the borrowed nanosecond is not ahead of it.
	p.ns = 101
	if got, w := c.Now(), ts(101, 2); got != w {
		t.Fatalf("Now at physical 101 = %v, want %v", got, w)
	}
	p.ns = 102
	if got, w := c.Now(), ts(102, 0); got != w {
		t.Fatalf("Now at physical 102 = %v, want %v", got, w)
	}
	// Overflow reached through Observe.
	if err := c.Observe(ts(102, math.MaxUint32)); err != nil {
		t.Fatal(err)
	}
	if got, w := c.Now(), ts(103, 0); got != w {
		t.Fatalf("Now after Observe at max logical = %v, want %v", got, w)
	}
}

func TestNowConcurrentUnique(t *testing.T) {
	p := &fakePhysical{ns: base} // stalled: every timestamp comes from the logical counter
	c := hlc.NewClock(p.read, 0)
	const workers, per = 8, 500
	results := make([][]hlc.Timestamp, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range per {
				results[w] = append(results[w], c.Now())
			}
		}()
	}
	wg.Wait()
	seen := make(map[hlc.Timestamp]bool, workers*per)
	for w, rs := range results {
		for i, r := range rs {
			if seen[r] {
				t.Fatalf("timestamp %v issued twice", r)
			}
			seen[r] = true
			if i > 0 && !rs[i-1].Less(r) {
				t.Fatalf("worker %d: %v then %v", w, rs[i-1], r)
			}
		}
	}
	if got, want := c.Last(), ts(base, workers*per-1); got != want {
		t.Fatalf("Last() = %v, want %v", got, want)
	}
}

// ---------------------------------------------------------------------------
// Property: arbitrary interleavings of physical-clock behaviour and clock
// operations, checked against an executable model and against the abstract
// guarantees (strict monotonicity, never behind physical time).

// model is a reference implementation of the clock.
type model struct {
	last     hlc.Timestamp
	rejected uint64
}

func (m *model) now(pt int64) hlc.Timestamp {
	switch {
	case pt > m.last.Wall:
		m.last = ts(pt, 0)
	case m.last.Logical == math.MaxUint32:
		m.last = ts(m.last.Wall+1, 0)
	default:
		m.last.Logical++
	}
	return m.last
}

func (m *model) advance(t hlc.Timestamp) {
	if m.last.Less(t) {
		m.last = t
	}
}

func TestClockProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := &fakePhysical{ns: rapid.Int64Range(0, 1<<61).Draw(t, "start")}
		skew := time.Duration(rapid.SampledFrom([]int64{
			0, 1, 1000, int64(time.Millisecond), int64(hlc.DefaultMaxSkew), int64(2 * time.Second),
		}).Draw(t, "maxSkew"))
		c := hlc.NewClock(p.read, skew)
		effSkew := int64(c.MaxSkew())
		if skew == 0 && effSkew != int64(hlc.DefaultMaxSkew) {
			t.Fatalf("MaxSkew() = %d with zero config", effSkew)
		}

		m := &model{}
		var high hlc.Timestamp // greatest timestamp issued, accepted or restored
		issued := 0

		logical := rapid.OneOf(
			rapid.Uint32Range(0, 3),
			rapid.Uint32Range(math.MaxUint32-3, math.MaxUint32),
			rapid.Uint32(),
		)
		offset := rapid.OneOf(
			rapid.SampledFrom([]int64{
				-effSkew - 1, -effSkew, -1, 0, 1, effSkew - 1, effSkew, effSkew + 1, 2 * effSkew,
			}),
			rapid.Int64Range(-3*effSkew-10, 3*effSkew+10),
		)

		t.Repeat(map[string]func(*rapid.T){
			"stall": func(t *rapid.T) {},
			"forward": func(t *rapid.T) {
				p.ns += rapid.Int64Range(1, int64(10*time.Second)).Draw(t, "forward")
			},
			"tick": func(t *rapid.T) {
				p.ns += rapid.Int64Range(1, 3).Draw(t, "tick")
			},
			"backward": func(t *rapid.T) {
				p.ns -= rapid.Int64Range(1, int64(10*time.Second)).Draw(t, "backward")
			},
			"now": func(t *rapid.T) {
				got := c.Now()
				issued++
				want := m.now(p.ns)
				if got != want {
					t.Fatalf("Now() = %v, model says %v (physical %d)", got, want, p.ns)
				}
				if !high.Less(got) {
					t.Fatalf("Now() = %v not after %v", got, high)
				}
				if got.Wall < p.ns {
					t.Fatalf("Now() = %v behind physical time %d", got, p.ns)
				}
				high = got
			},
			"now-burst": func(t *rapid.T) {
				n := rapid.IntRange(2, 20).Draw(t, "n")
				for range n {
					got := c.Now()
					if !high.Less(got) {
						t.Fatalf("Now() = %v not after %v", got, high)
					}
					high = got
					m.now(p.ns)
				}
			},
			"observe": func(t *rapid.T) {
				remote := ts(p.ns+offset.Draw(t, "offset"), logical.Draw(t, "logical"))
				before := c.Last()
				err := c.Observe(remote)
				ahead := remote.Wall - p.ns
				if ahead > effSkew {
					if !errors.Is(err, hlc.ErrSkew) {
						t.Fatalf("Observe(%v) %dns ahead (max %d) = %v, want ErrSkew", remote, ahead, effSkew, err)
					}
					m.rejected++
					if c.Last() != before {
						t.Fatalf("rejected Observe changed Last from %v to %v", before, c.Last())
					}
					return
				}
				if err != nil {
					t.Fatalf("Observe(%v) %dns ahead (max %d) = %v, want nil", remote, ahead, effSkew, err)
				}
				m.advance(remote)
				if high.Less(remote) {
					high = remote
				}
			},
			"restore": func(t *rapid.T) {
				r := ts(p.ns+rapid.Int64Range(-int64(time.Hour), int64(time.Hour)).Draw(t, "delta"), logical.Draw(t, "logical"))
				c.Restore(r)
				m.advance(r)
				if high.Less(r) {
					high = r
				}
			},
			"": func(t *rapid.T) {
				if c.Last() != m.last {
					t.Fatalf("Last() = %v, model %v", c.Last(), m.last)
				}
				if c.Last() != high {
					t.Fatalf("Last() = %v, want greatest seen %v", c.Last(), high)
				}
				if c.Rejected() != m.rejected {
					t.Fatalf("Rejected() = %d, model %d", c.Rejected(), m.rejected)
				}
			},
		})
		// Whatever happened, the next timestamp is after everything.
		if got := c.Now(); !high.Less(got) {
			t.Fatalf("final Now() = %v not after %v", got, high)
		}
	})
}
