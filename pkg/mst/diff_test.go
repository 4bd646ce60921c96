package mst

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// pullWant is what Pull(local ← remote) must return: the remote entries
// that local lacks or holds with another value.
func pullWant(local, remote model) []string {
	var out []string
	for _, k := range remote.sortedKeys() {
		if v, ok := local[k]; !ok || v != remote[k] {
			out = append(out, k+"="+remote[k])
		}
	}
	return out
}

func entryStrings(es []Entry) []string {
	var out []string
	for _, e := range es {
		out = append(out, string(e.Key)+"="+string(e.Value))
	}
	return out
}

func deltaWant(a, b model) []Delta {
	var out []Delta
	for _, k := range (model(mergeKeys(a, b))).sortedKeys() {
		va, ina := a[k]
		vb, inb := b[k]
		if ina != inb || va != vb {
			d := Delta{Key: []byte(k), InA: ina, InB: inb}
			if ina {
				d.A = []byte(va)
			}
			if inb {
				d.B = []byte(vb)
			}
			out = append(out, d)
		}
	}
	return out
}

func mergeKeys(a, b model) map[string]string {
	out := make(map[string]string)
	for k := range a {
		out[k] = ""
	}
	for k := range b {
		out[k] = ""
	}
	return out
}

func deltaEqual(a, b Delta) bool {
	return bytes.Equal(a.Key, b.Key) && a.InA == b.InA && a.InB == b.InB &&
		(!a.InA || bytes.Equal(a.A, b.A)) && (!a.InB || bytes.Equal(a.B, b.B))
}

// Two replicas diverge from a common base; Pull in each direction returns
// exactly what the other has that it lacks, and Diff the symmetric
// difference (uncommitted changes included).
func TestPullAndDiffMatchModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		lb := rapid.SampledFrom([]int{2, 4}).Draw(t, "levelBits")
		opts := Options{LevelBits: lb, CacheNodes: rapid.SampledFrom([]int{-1, 0}).Draw(t, "cache")}
		base := model(rapid.MapOfN(keyGen(), valueGen(), 0, 250).Draw(t, "base"))
		for _, o := range bulkOps(t, "bulkBase", 2000, 0) {
			base[o.key] = o.value
		}
		c := mustBuild(t, base, lb)
		sa := NewMemStore()
		sa.Apply(c)
		sb := sa.Clone()
		ta, tb := Open(sa, c.Root, opts), Open(sb, c.Root, opts)
		ma, mb := maps_clone(base), maps_clone(base)
		for _, o := range append(rapid.SliceOfN(opGen(), 0, 40).Draw(t, "opsA"), bulkOps(t, "bulkA", 60, 30)...) {
			o.apply(t, ta, ma)
		}
		for _, o := range append(rapid.SliceOfN(opGen(), 0, 40).Draw(t, "opsB"), bulkOps(t, "bulkB", 60, 30)...) {
			o.apply(t, tb, mb)
		}
		ca, cb := mustCommit(t, ta, sa), mustCommit(t, tb, sb)

		ctx := context.Background()
		got, _, err := Pull(ctx, ta, sa.Has, cb.Root, sb.Fetch)
		if err != nil {
			t.Fatalf("Pull a←b: %v", err)
		}
		if g, w := entryStrings(got), pullWant(ma, mb); !slices.Equal(g, w) {
			t.Fatalf("Pull a←b = %q, want %q", g, w)
		}
		got, _, err = Pull(ctx, tb, sb.Has, ca.Root, sa.Fetch)
		if err != nil {
			t.Fatalf("Pull b←a: %v", err)
		}
		if g, w := entryStrings(got), pullWant(mb, ma); !slices.Equal(g, w) {
			t.Fatalf("Pull b←a = %q, want %q", g, w)
		}

		for _, o := range rapid.SliceOfN(opGen(), 0, 10).Draw(t, "uncommittedA") {
			o.apply(t, ta, ma)
		}
		deltas, err := Diff(ta, tb)
		if err != nil {
			t.Fatalf("Diff: %v", err)
		}
		if want := deltaWant(ma, mb); !slices.EqualFunc(deltas, want, deltaEqual) {
			t.Fatalf("Diff = %v, want %v", deltas, want)
		}
	})
}

// countingStore counts reads, to check that diffs visit few nodes.
type countingStore struct {
	*MemStore
	reads int
}

func (s *countingStore) GetNode(h Hash) ([]byte, error) {
	s.reads++
	return s.MemStore.GetNode(h)
}

// Trees that differ in a few keys cost a few paths, not the tree.
func TestPullFetchesOnlyDifferingPaths(t *testing.T) {
	for _, lb := range []int{2, 4} {
		const n = 20000
		sa, root := sequentialStore(t, n, lb)
		sb := sa.Clone()
		tb := Open(sb, root, Options{LevelBits: lb})
		changed := []string{"k/000007", "k/009000", "k/019999"}
		for _, k := range changed {
			mustPut(t, tb, k, "changed")
		}
		cb := mustCommit(t, tb, sb)
		ta := Open(sa, root, Options{LevelBits: lb})
		total := sb.Len()
		depth := len(reachablePath(t, sb, cb.Root, lb, "k/009000"))

		ctx := context.Background()
		got, st, err := Pull(ctx, ta, sa.Has, cb.Root, sb.Fetch)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(changed) {
			t.Fatalf("levelBits %d: Pull returned %d entries, want %d", lb, len(got), len(changed))
		}
		if st.NodesFetched > len(changed)*depth || st.RoundTrips > depth {
			t.Fatalf("levelBits %d: %+v for %d changes in %d nodes of depth %d", lb, st, len(changed), total, depth)
		}
		// Identical trees: nothing to fetch.
		_, st, err = Pull(ctx, ta, sa.Has, root, sa.Fetch)
		if err != nil || st.RoundTrips != 0 {
			t.Fatalf("Pull of an identical tree: %+v, %v", st, err)
		}

		ca, cbs := &countingStore{MemStore: sa}, &countingStore{MemStore: sb}
		deltas, err := Diff(Open(ca, root, Options{LevelBits: lb, CacheNodes: -1}), Open(cbs, cb.Root, Options{LevelBits: lb, CacheNodes: -1}))
		if err != nil {
			t.Fatal(err)
		}
		if len(deltas) != len(changed) {
			t.Fatalf("Diff found %d deltas, want %d", len(deltas), len(changed))
		}
		if reads := ca.reads + cbs.reads; reads > 2*len(changed)*depth {
			t.Fatalf("levelBits %d: Diff read %d nodes for %d changes at depth %d", lb, reads, len(changed), depth)
		}
	}
}

func reachablePath(t fataler, s *MemStore, root Hash, lb int, key string) []Hash {
	t.Helper()
	tr := Open(s, root, Options{LevelBits: lb})
	var path []Hash
	for r := (ref{h: root}); !r.empty(); {
		path = append(path, r.h)
		n, err := tr.load(r)
		if err != nil {
			t.Fatalf("load: %v", err)
		}
		i, found := n.search([]byte(key))
		if found {
			break
		}
		r = n.kids[i]
	}
	return path
}

// A peer cannot make Pull accept nodes that do not fit where they hang.
func TestPullRejectsBadRemoteNodes(t *testing.T) {
	const lb = 4
	local := Open(NewMemStore(), Hash{}, Options{})
	none := func(Hash) (bool, error) { return false, nil }
	serve := func(m map[Hash][]byte) func(context.Context, []Hash) ([][]byte, error) {
		return func(_ context.Context, hs []Hash) ([][]byte, error) {
			var out [][]byte
			for _, h := range hs {
				out = append(out, m[h])
			}
			return out, nil
		}
	}
	node := func(n *Node) (Hash, []byte) {
		data := EncodeNode(n)
		if _, err := DecodeNode(data, lb); err != nil {
			t.Fatalf("test node invalid: %v", err)
		}
		return sha256.Sum256(data), data
	}
	k1 := keyOfLevel(t, "m", 1, lb)
	high := keyOfLevel(t, "z", 0, lb)
	k1b := keyOfLevel(t, "n", 1, lb)
	low := keyOfLevel(t, "a", 0, lb)
	leafHigh, leafHighData := node(&Node{Keys: [][]byte{high}, Values: [][]byte{nil}, Children: make([]Hash, 2)})
	leafLow, leafLowData := node(&Node{Keys: [][]byte{low}, Values: [][]byte{nil}, Children: make([]Hash, 2)})
	innerB, innerBData := node(&Node{Level: 1, Keys: [][]byte{k1b}, Values: [][]byte{nil}, Children: make([]Hash, 2)})
	// The root has one key k1: its child 0 must hold keys below k1, its
	// child 1 keys above.
	cases := []struct {
		name     string
		children []Hash
		nodes    map[Hash][]byte
	}{
		{"keys above range", []Hash{leafHigh, {}}, map[Hash][]byte{leafHigh: leafHighData}},
		{"keys below range", []Hash{{}, leafLow}, map[Hash][]byte{leafLow: leafLowData}},
		{"level not below parent", []Hash{innerB, {}}, map[Hash][]byte{innerB: innerBData}},
		{"content does not match hash", []Hash{leafHigh, {}}, map[Hash][]byte{leafHigh: innerBData}},
	}
	for _, c := range cases {
		root, rootData := node(&Node{Level: 1, Keys: [][]byte{k1}, Values: [][]byte{nil}, Children: c.children})
		c.nodes[root] = rootData
		_, _, err := Pull(context.Background(), local, none, root, serve(c.nodes))
		if !errors.Is(err, ErrBadRemoteNode) || errors.Is(err, ErrCorruptNode) {
			t.Errorf("%s: err = %v, want ErrBadRemoteNode only", c.name, err)
		}
	}
	mustPut(t, local, "x", "")
	if _, _, err := Pull(context.Background(), local, none, Hash{1}, serve(nil)); !errors.Is(err, ErrUncommitted) {
		t.Errorf("Pull on a dirty tree: err = %v, want ErrUncommitted", err)
	}
}

func ExamplePull() {
	ctx := context.Background()
	// Two replicas with the same 1000 documents, then one more on b.
	var es []Entry
	for i := 0; i < 1000; i++ {
		es = append(es, Entry{Key: []byte(fmt.Sprintf("/tasks/%04d", i)), Value: []byte("digest")})
	}
	c, _ := Build(Entries(es), Options{})
	storeA, storeB := NewMemStore(), NewMemStore()
	storeA.Apply(c)
	storeB.Apply(c)
	a, b := Open(storeA, c.Root, Options{}), Open(storeB, c.Root, Options{})
	b.Put([]byte("/tasks/0500b"), []byte("new"))
	cb, _ := b.Commit()
	storeB.Apply(cb)

	// a compares roots with b and pulls only what differs.
	missing, _, _ := Pull(ctx, a, storeA.Has, cb.Root, storeB.Fetch)
	for _, e := range missing {
		fmt.Printf("%s=%s\n", e.Key, e.Value)
	}
	// Output: /tasks/0500b=new
}
