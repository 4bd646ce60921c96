package mst

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// model is the reference a tree is checked against.
type model map[string]string

func (m model) sortedKeys() []string { return slices.Sorted(maps.Keys(m)) }

func (m model) entries() []Entry {
	var es []Entry
	for _, k := range m.sortedKeys() {
		es = append(es, Entry{Key: []byte(k), Value: []byte(m[k])})
	}
	return es
}

// keyGen draws keys from a small space so histories revisit keys, share
// prefixes (exercising prefix compression) and include the empty key.
func keyGen() *rapid.Generator[string] {
	return rapid.OneOf(
		rapid.Map(rapid.SliceOfN(rapid.ByteRange('a', 'd'), 0, 4), func(b []byte) string { return string(b) }),
		rapid.Map(rapid.IntRange(0, 400), func(i int) string { return fmt.Sprintf("key/%04d", i) }),
	)
}

func valueGen() *rapid.Generator[string] {
	return rapid.Map(rapid.SliceOfN(rapid.ByteRange(0, 3), 0, 3), func(b []byte) string { return string(b) })
}

// bulkOps returns up to maxN pseudo-random operations on keys "b/<i>",
// delPct percent of them deletes. rapid favours small collections, which
// at fanout 16 are one or two nodes; this gives trees several levels deep
// while rapid can still shrink the count and the seed.
func bulkOps(t *rapid.T, label string, maxN, delPct int) []op {
	n := rapid.IntRange(0, maxN).Draw(t, label+"N")
	rng := rand.New(rand.NewPCG(rapid.Uint64().Draw(t, label+"Seed"), 0))
	space := max(2*n, 10)
	ops := make([]op, n)
	for i := range ops {
		ops[i] = op{
			key:   fmt.Sprintf("b/%d", rng.IntN(space)),
			value: string(rune('a' + rng.IntN(3))),
			del:   rng.IntN(100) < delPct,
		}
	}
	return ops
}

// fataler is what testing.T and rapid.T have in common.
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

func mustRoot(t fataler, tr *Tree) Hash {
	t.Helper()
	h, err := tr.Root()
	if err != nil {
		t.Fatalf("Root: %v", err)
	}
	return h
}

func mustPut(t fataler, tr *Tree, k, v string) {
	t.Helper()
	if err := tr.Put([]byte(k), []byte(v)); err != nil {
		t.Fatalf("Put(%q): %v", k, err)
	}
}

func mustCommit(t fataler, tr *Tree, s *MemStore) Changes {
	t.Helper()
	c, err := tr.Commit()
	if err != nil {
		t.Fatalf("Commit: %v", err)
	}
	s.Apply(c)
	return c
}

func mustBuild(t fataler, m model, lb int) Changes {
	t.Helper()
	c, err := Build(Entries(m.entries()), Options{LevelBits: lb})
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	return c
}

// checkAgainst checks Get and Ascend of tr against m.
func checkAgainst(t fataler, tr *Tree, m model, probes []string) {
	t.Helper()
	for _, k := range append(m.sortedKeys(), probes...) {
		v, ok, err := tr.Get([]byte(k))
		if err != nil {
			t.Fatalf("Get(%q): %v", k, err)
		}
		want, wantOK := m[k]
		if ok != wantOK || string(v) != want {
			t.Fatalf("Get(%q) = %q, %v; want %q, %v", k, v, ok, want, wantOK)
		}
	}
	var got []string
	err := tr.Ascend(nil, func(k, v []byte) bool {
		if want := m[string(k)]; want != string(v) {
			t.Fatalf("Ascend: %q = %q, want %q", k, v, want)
		}
		got = append(got, string(k))
		return true
	})
	if err != nil {
		t.Fatalf("Ascend: %v", err)
	}
	if want := m.sortedKeys(); !slices.Equal(got, want) {
		t.Fatalf("Ascend keys = %q, want %q", got, want)
	}
}

// reachable returns the hashes of the nodes of the tree rooted at root.
func reachable(t fataler, s *MemStore, root Hash, lb int) []Hash {
	t.Helper()
	var hs []Hash
	err := Walk(s, root, Options{LevelBits: lb}, func(h Hash, _ *Node) error {
		hs = append(hs, h)
		return nil
	})
	if err != nil {
		t.Fatalf("Walk: %v", err)
	}
	slices.SortFunc(hs, compareHash)
	return hs
}

func blobHashes(bs []NodeBlob) []Hash {
	var hs []Hash
	for _, b := range bs {
		hs = append(hs, b.Hash)
	}
	slices.SortFunc(hs, compareHash)
	return hs
}

// keyOfLevel returns the first key "<prefix><n>" of exactly level lvl.
func keyOfLevel(tb testing.TB, prefix string, lvl, lb int) []byte {
	tb.Helper()
	for i := 0; i < 1<<24; i++ {
		k := []byte(fmt.Sprintf("%s%d", prefix, i))
		if KeyLevel(k, lb) == lvl {
			return k
		}
	}
	tb.Fatalf("no key of level %d", lvl)
	return nil
}

// sequentialStore builds a tree of n keys "k/<i>" and returns its store.
func sequentialStore(tb testing.TB, n, lb int) (*MemStore, Hash) {
	tb.Helper()
	var es []Entry
	for i := 0; i < n; i++ {
		es = append(es, Entry{Key: []byte(fmt.Sprintf("k/%06d", i)), Value: []byte(fmt.Sprintf("v%d", i))})
	}
	c, err := Build(Entries(es), Options{LevelBits: lb})
	if err != nil {
		tb.Fatalf("Build: %v", err)
	}
	s := NewMemStore()
	s.Apply(c)
	return s, c.Root
}

func hashList(hs []Hash) string {
	var b strings.Builder
	for _, h := range hs {
		b.WriteString(h.String()[:8])
		b.WriteByte(' ')
	}
	return b.String()
}
