package crdt_test

import (
	"bytes"
	"maps"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/hlc"
)

// checkLaws checks the semilattice laws on normalized documents a, b, c,
// comparing results both with crdt.Equal and byte-for-byte.
func checkLaws(t *rapid.T, a, b, c crdt.Doc) {
	encA, encB, encC := a.Marshal(), b.Marshal(), c.Marshal()
	var zero crdt.Doc
	ab := crdt.Merge(a, b)

	mustEqualDocs(t, "commutative: a∨b = b∨a", ab, crdt.Merge(b, a))
	mustEqualDocs(t, "associative: (a∨b)∨c = a∨(b∨c)", crdt.Merge(ab, c), crdt.Merge(a, crdt.Merge(b, c)))
	mustEqualDocs(t, "associative: (a∨c)∨b = a∨(b∨c)", crdt.Merge(crdt.Merge(a, c), b), crdt.Merge(a, crdt.Merge(b, c)))
	mustEqualDocs(t, "idempotent: a∨a = a", crdt.Merge(a, a), a)
	mustEqualDocs(t, "idempotent: (a∨b)∨b = a∨b", crdt.Merge(ab, b), ab)
	mustEqualDocs(t, "idempotent: (a∨b)∨a = a∨b", crdt.Merge(ab, a), ab)
	mustEqualDocs(t, "identity: 0∨a = a", crdt.Merge(zero, a), a)
	mustEqualDocs(t, "identity: a∨0 = a", crdt.Merge(a, zero), a)
	if !crdt.Merge(zero, zero).IsEmpty() {
		t.Fatalf("0∨0 is not empty")
	}

	if !crdt.Dominates(ab, a) || !crdt.Dominates(ab, b) {
		t.Fatalf("a∨b = %s does not dominate a = %s and b = %s", dump(ab), dump(a), dump(b))
	}
	if !crdt.Dominates(a, a) || !crdt.Dominates(a, zero) {
		t.Fatalf("a = %s does not dominate itself or the zero doc", dump(a))
	}
	// a∨b is the least upper bound: c dominates a∨b iff it dominates a and b.
	if got, want := crdt.Dominates(c, ab), crdt.Dominates(c, a) && crdt.Dominates(c, b); got != want {
		t.Fatalf("Dominates(c, a∨b) = %v, but Dominates(c, a) && Dominates(c, b) = %v\n a=%s\n b=%s\n c=%s", got, want, dump(a), dump(b), dump(c))
	}
	// Dominance agrees with the merge order: a dominates b iff a∨b = a.
	if got, want := crdt.Dominates(a, b), bytes.Equal(ab.Marshal(), encA); got != want {
		t.Fatalf("Dominates(a, b) = %v but (a∨b == a) = %v", got, want)
	}

	// No write is lost: the merge's latest stamp is the latest of either.
	wantMax := a.MaxStamp()
	if wantMax.Compare(b.MaxStamp()) < 0 {
		wantMax = b.MaxStamp()
	}
	if got := ab.MaxStamp(); got != wantMax {
		t.Fatalf("MaxStamp(a∨b) = %v, want %v", got, wantMax)
	}

	// Every merge result is a canonical, decodable document.
	dec, err := crdt.Unmarshal(ab.Marshal())
	if err != nil {
		t.Fatalf("Unmarshal(Marshal(a∨b)): %v\n a∨b = %s", err, dump(ab))
	}
	mustEqualDocs(t, "decode(encode(a∨b))", dec, ab)

	// Merge treats its arguments as immutable.
	if !bytes.Equal(a.Marshal(), encA) || !bytes.Equal(b.Marshal(), encB) || !bytes.Equal(c.Marshal(), encC) {
		t.Fatalf("Merge modified an argument")
	}
}

func TestMergeLaws(t *testing.T) {
	gens := []struct {
		name string
		gen  *rapid.Generator[crdt.Doc]
	}{
		{"small", genSmallDoc()}, // constant conflicts, including same-stamp ties
		{"wide", genWideDoc()},
	}
	for _, g := range gens {
		t.Run(g.name, rapid.MakeCheck(func(t *rapid.T) {
			a := g.gen.Draw(t, "a")
			b := g.gen.Draw(t, "b")
			c := g.gen.Draw(t, "c")
			checkLaws(t, a, b, c)
		}))
	}
}

// --- simulated replicas ------------------------------------------------------

type opKind int

const (
	opSet opKind = iota
	opDeleteFields
	opDeleteDoc
)

// op is one local write and the delta it produced.
type op struct {
	kind   opKind
	stamp  crdt.Stamp
	values map[string]crdt.Value // opSet
	names  []string              // opDeleteFields
	delta  crdt.Doc
}

// message is a document in flight: a delta or a full-state snapshot, with
// the ops it carries.
type message struct {
	doc crdt.Doc
	ops []int
}

type replica struct {
	node   string
	offset int64 // this node's physical clock error, ns
	clock  *hlc.Clock
	state  crdt.Doc
	seen   map[int]bool
	inbox  []message
}

type simulation struct {
	global   int64 // "true" time, ns
	replicas []*replica
	ops      []op
	stamps   map[crdt.Stamp]bool
	pool     []crdt.Doc // deltas and states seen, for the law checks
}

// Field names in the simulation: few, so writes collide.
var simNames = []string{"image", "replicas", "env", "port"}

// expectDoc computes, independently of Merge, the document that results
// from applying the given set of ops in any order.
func (s *simulation) expectDoc(ids map[int]bool) crdt.Doc {
	var docDeleted crdt.Stamp
	winners := map[string]crdt.Field{}
	consider := func(name string, f crdt.Field) {
		if cur, ok := winners[name]; !ok || cur.Stamp.Compare(f.Stamp) < 0 {
			winners[name] = f
		}
	}
	for id := range ids {
		o := s.ops[id]
		switch o.kind {
		case opSet:
			for name, v := range o.values {
				consider(name, f2(v, o.stamp))
			}
		case opDeleteFields:
			for _, name := range o.names {
				consider(name, tomb(o.stamp))
			}
		case opDeleteDoc:
			if docDeleted.Compare(o.stamp) < 0 {
				docDeleted = o.stamp
			}
		}
	}
	d := crdt.Doc{Deleted: docDeleted, Fields: map[string]crdt.Field{}}
	for name, f := range winners {
		if docDeleted.IsZero() || docDeleted.Compare(f.Stamp) < 0 {
			d.Fields[name] = f
		}
	}
	return d
}

// expectLive is the visible content of the ops, computed from first
// principles: the newest write per field, if it is a set newer than the
// newest document delete.
func (s *simulation) expectLive(ids map[int]bool) map[string]crdt.Value {
	d := s.expectDoc(ids)
	out := map[string]crdt.Value{}
	for name, f := range d.Fields {
		if !f.Deleted {
			out[name] = f.Value
		}
	}
	return out
}

func (s *simulation) local(t *rapid.T, r *replica, o op) {
	if s.stamps[o.stamp] {
		t.Fatalf("stamp %v issued twice", o.stamp)
	}
	s.stamps[o.stamp] = true
	if r.state.MaxStamp().Compare(o.stamp) >= 0 {
		t.Fatalf("%s: new stamp %v not after everything it has seen (%v)", r.node, o.stamp, r.state.MaxStamp())
	}
	id := len(s.ops)
	s.ops = append(s.ops, o)
	s.pool = append(s.pool, o.delta)
	r.state = crdt.Merge(r.state, o.delta)
	r.seen[id] = true
	for _, other := range s.replicas {
		if other != r {
			other.inbox = append(other.inbox, message{doc: o.delta, ops: []int{id}})
		}
	}
}

func (s *simulation) apply(t *rapid.T, r *replica, m message, flip bool) {
	if ms := m.doc.MaxStamp(); !ms.IsZero() {
		if err := r.clock.Observe(ms.TS); err != nil {
			t.Fatalf("%s: Observe(%v): %v", r.node, ms.TS, err)
		}
	}
	if flip {
		r.state = crdt.Merge(m.doc, r.state)
	} else {
		r.state = crdt.Merge(r.state, m.doc)
	}
	for _, id := range m.ops {
		r.seen[id] = true
	}
	s.pool = append(s.pool, r.state)
}

func (s *simulation) check(t *rapid.T) {
	for _, r := range s.replicas {
		want := s.expectDoc(r.seen)
		mustEqualDocs(t, r.node+" state vs model", r.state, want)
		live := s.expectLive(r.seen)
		if got := r.state.Live(); !liveEqual(got, live) {
			t.Fatalf("%s: Live() = %v, want %v", r.node, got, live)
		}
		if got := r.state.Exists(); got != (len(live) > 0) {
			t.Fatalf("%s: Exists() = %v with live %v", r.node, got, live)
		}
		var maxStamp crdt.Stamp
		for id := range r.seen {
			if maxStamp.Compare(s.ops[id].stamp) < 0 {
				maxStamp = s.ops[id].stamp
			}
			if !crdt.Dominates(r.state, s.ops[id].delta) {
				t.Fatalf("%s: state does not dominate applied op %d", r.node, id)
			}
		}
		if got := r.state.MaxStamp(); got != maxStamp {
			t.Fatalf("%s: MaxStamp() = %v, want %v", r.node, got, maxStamp)
		}
	}
}

func pickNames(t *rapid.T, label string) []string {
	return rapid.SliceOfNDistinct(rapid.SampledFrom(simNames), 1, 3, rapid.ID[string]).Draw(t, label)
}

func TestReplicasConverge(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(2, 4).Draw(t, "replicas")
		nodeIDs := []string{"n2", "n10", "n1", "zeta"} // deliberately not in sort order
		s := &simulation{global: 1_700_000_000_000_000_000, stamps: map[crdt.Stamp]bool{}}
		for i := range n {
			r := &replica{node: nodeIDs[i], seen: map[int]bool{}}
			// Coarse offsets (µs) make equal timestamps across nodes likely,
			// so node-ID tie-breaks are exercised.
			r.offset = 1000 * rapid.Int64Range(-50_000, 50_000).Draw(t, "offset")
			r.clock = hlc.NewClock(func() int64 { return s.global + r.offset }, time.Hour)
			s.replicas = append(s.replicas, r)
		}
		pickReplica := func(t *rapid.T, label string) *replica {
			return s.replicas[rapid.IntRange(0, n-1).Draw(t, label)]
		}
		stampFor := func(r *replica) crdt.Stamp { return crdt.Stamp{TS: r.clock.Now(), Node: r.node} }

		// rapid favours the first and last of its choices, so the frequent
		// ones sit at the ends: action keys are sampled in sorted order
		// (deliver < gossip < jitter < write).
		writeKinds := []opKind{opSet, opDeleteFields, opSet, opDeleteDoc, opSet, opDeleteFields, opSet}
		t.Repeat(map[string]func(*rapid.T){
			"write": func(t *rapid.T) {
				// A burst of local writes, possibly on several replicas.
				for range rapid.IntRange(1, 4).Draw(t, "burst") {
					r := pickReplica(t, "writer")
					st := stampFor(r)
					switch kind := rapid.SampledFrom(writeKinds).Draw(t, "kind"); kind {
					case opSet:
						values := map[string]crdt.Value{}
						for _, name := range pickNames(t, "names") {
							values[name] = genValue().Draw(t, "value")
						}
						s.local(t, r, op{kind: kind, stamp: st, values: maps.Clone(values), delta: crdt.Set(values, st)})
					case opDeleteFields:
						names := pickNames(t, "names")
						s.local(t, r, op{kind: kind, stamp: st, names: slices.Clone(names), delta: crdt.DeleteFields(names, st)})
					case opDeleteDoc:
						s.local(t, r, op{kind: kind, stamp: st, delta: crdt.DeleteDoc(st)})
					}
				}
			},
			"jitter": func(t *rapid.T) {
				if rapid.Bool().Draw(t, "tick") {
					// Time passes (or stalls).
					s.global += rapid.SampledFrom([]int64{0, 1000, 3000, int64(time.Millisecond)}).Draw(t, "dt")
					return
				}
				// A node's physical clock jumps backwards or forwards.
				r := pickReplica(t, "jumper")
				r.offset += 1000 * rapid.Int64Range(-20_000, 20_000).Draw(t, "jump")
			},
			"deliver": func(t *rapid.T) {
				var ready []*replica
				for _, r := range s.replicas {
					if len(r.inbox) > 0 {
						ready = append(ready, r)
					}
				}
				if len(ready) == 0 {
					t.Skip("nothing in flight")
				}
				r := ready[rapid.IntRange(0, len(ready)-1).Draw(t, "receiver")]
				i := rapid.IntRange(0, len(r.inbox)-1).Draw(t, "message") // any order
				m := r.inbox[i]
				s.apply(t, r, m, rapid.Bool().Draw(t, "flip"))
				if !rapid.Bool().Draw(t, "duplicate") { // else: delivered again later
					r.inbox = slices.Delete(r.inbox, i, i+1)
				}
			},
			"gossip": func(t *rapid.T) {
				if rapid.Bool().Draw(t, "replay") {
					// A stale or duplicate delta arrives again.
					if len(s.ops) == 0 {
						t.Skip("no ops yet")
					}
					id := rapid.IntRange(0, len(s.ops)-1).Draw(t, "op")
					s.apply(t, pickReplica(t, "receiver"), message{doc: s.ops[id].delta, ops: []int{id}}, rapid.Bool().Draw(t, "flip"))
					return
				}
				// Anti-entropy: one replica ships its whole state to another.
				src, dst := pickReplica(t, "src"), pickReplica(t, "dst")
				if src == dst {
					t.Skip("same replica")
				}
				m := message{doc: src.state, ops: slices.Collect(maps.Keys(src.seen))}
				if rapid.Bool().Draw(t, "queue") {
					dst.inbox = append(dst.inbox, m)
				} else {
					s.apply(t, dst, m, rapid.Bool().Draw(t, "flip"))
				}
			},
			"": s.check,
		})

		// Deliver everything still in flight, in a random order.
		for {
			var ready []*replica
			for _, r := range s.replicas {
				if len(r.inbox) > 0 {
					ready = append(ready, r)
				}
			}
			if len(ready) == 0 {
				break
			}
			r := ready[rapid.IntRange(0, len(ready)-1).Draw(t, "drainReceiver")]
			i := rapid.IntRange(0, len(r.inbox)-1).Draw(t, "drainMessage")
			s.apply(t, r, r.inbox[i], rapid.Bool().Draw(t, "flip"))
			r.inbox = slices.Delete(r.inbox, i, i+1)
		}
		s.check(t)

		all := map[int]bool{}
		var folded crdt.Doc
		for id, o := range s.ops {
			all[id] = true
			folded = crdt.Merge(folded, o.delta)
		}
		want := s.expectDoc(all)
		mustEqualDocs(t, "all deltas folded in order", folded, want)
		first := s.replicas[0].state.Marshal()
		for _, r := range s.replicas {
			if len(r.seen) != len(s.ops) {
				t.Fatalf("%s saw %d of %d ops after full delivery", r.node, len(r.seen), len(s.ops))
			}
			mustEqualDocs(t, "converged "+r.node, r.state, want)
			if enc := r.state.Marshal(); !bytes.Equal(enc, first) {
				t.Fatalf("replicas %s and %s differ after full delivery:\n %x\n %x", s.replicas[0].node, r.node, first, enc)
			}
			if r.state.Digest() != s.replicas[0].state.Digest() {
				t.Fatalf("digests differ after full delivery")
			}
		}

		// The states and deltas of a real history satisfy the laws too.
		if len(s.pool) > 0 {
			pick := func(label string) crdt.Doc {
				return s.pool[rapid.IntRange(0, len(s.pool)-1).Draw(t, label)]
			}
			checkLaws(t, pick("a"), pick("b"), pick("c"))
		}
	})
}

// A small fixed history that exercises every delivery hazard at once, with
// a readable expected outcome.
func TestReplicasConvergeScenario(t *testing.T) {
	var now int64 = 1000
	clockA := hlc.NewClock(func() int64 { return now }, 0)
	clockB := hlc.NewClock(func() int64 { return now - 500 }, 0) // B runs behind
	stamp := func(c *hlc.Clock, node string) crdt.Stamp { return crdt.Stamp{TS: c.Now(), Node: node} }

	d1 := crdt.Set(map[string]crdt.Value{"image": crdt.String("v1"), "replicas": crdt.Int(1)}, stamp(clockA, "a"))
	// B has seen d1 before writing, so its write orders after despite its slow clock.
	if err := clockB.Observe(d1.MaxStamp().TS); err != nil {
		t.Fatal(err)
	}
	d2 := crdt.Set(map[string]crdt.Value{"image": crdt.String("v2")}, stamp(clockB, "b"))
	d3 := crdt.DeleteDoc(stamp(clockB, "b"))
	now += 10
	d4 := crdt.Set(map[string]crdt.Value{"replicas": crdt.Int(3)}, stamp(clockA, "a")) // concurrent with d3; A's clock is ahead
	d5 := crdt.DeleteFields([]string{"replicas"}, stamp(clockB, "b"))                  // B has not seen d4: ordered before it

	want := map[string]crdt.Value{"replicas": crdt.Int(3)}
	orders := [][]crdt.Doc{
		{d1, d2, d3, d4, d5},
		{d5, d4, d3, d2, d1},
		{d3, d1, d5, d1, d4, d2, d3},
		{crdt.Merge(d4, d5), crdt.Merge(d1, d2), d3},
	}
	var first []byte
	for i, order := range orders {
		var d crdt.Doc
		for _, delta := range order {
			d = crdt.Merge(d, delta)
		}
		if got := d.Live(); !liveEqual(got, want) {
			t.Fatalf("order %d: Live() = %v, want %v (%s)", i, got, want, dump(d))
		}
		enc := d.Marshal()
		if first == nil {
			first = enc
		} else if !bytes.Equal(first, enc) {
			t.Fatalf("order %d: encoding differs", i)
		}
	}
}
