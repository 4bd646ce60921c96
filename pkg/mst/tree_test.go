package mst

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

type op struct {
	del   bool
	key   string
	value string
}

func opGen() *rapid.Generator[op] {
	return rapid.Custom(func(t *rapid.T) op {
		return op{
			del:   rapid.IntRange(0, 3).Draw(t, "del") == 0,
			key:   keyGen().Draw(t, "key"),
			value: valueGen().Draw(t, "value"),
		}
	})
}

func (o op) apply(t fataler, tr *Tree, m model) {
	t.Helper()
	if o.del {
		_, want := m[o.key]
		existed, err := tr.Delete([]byte(o.key))
		if err != nil {
			t.Fatalf("Delete(%q): %v", o.key, err)
		}
		if existed != want {
			t.Fatalf("Delete(%q) = %v, want %v", o.key, existed, want)
		}
		delete(m, o.key)
		return
	}
	mustPut(t, tr, o.key, o.value)
	m[o.key] = o.value
}

// The shape depends only on the final set: any history of Puts and
// Deletes, in any order and with or without intermediate commits, ends in
// the tree Build makes of that set, node for node.
func TestShapeIndependentOfHistory(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		lb := rapid.SampledFrom([]int{1, 2, 4}).Draw(t, "levelBits")
		final := rapid.MapOfN(keyGen(), valueGen(), 0, 150).Draw(t, "final")
		for _, o := range bulkOps(t, "bulk", 1500, 0) {
			final[o.key] = o.value
		}
		extra := rapid.SliceOfN(keyGen(), 0, 30).Draw(t, "extra")
		for _, o := range bulkOps(t, "bulkExtra", 300, 0) {
			extra = append(extra, o.key)
		}
		var ops []op
		for k, v := range final {
			ops = append(ops, op{key: k, value: v + "old"}, op{key: k, value: v})
		}
		for _, k := range extra {
			if _, ok := final[k]; !ok {
				ops = append(ops, op{key: k, value: "tmp"}, op{key: k, del: true})
			}
		}
		// Shuffle, keeping each key's own operations in order.
		perm := slices.Clone(ops)
		rng := rand.New(rand.NewPCG(rapid.Uint64().Draw(t, "orderSeed"), 0))
		rng.Shuffle(len(perm), func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
		perKey := make(map[string][]op)
		for _, o := range ops {
			perKey[o.key] = append(perKey[o.key], o)
		}
		store := NewMemStore()
		tr := Open(store, Hash{}, Options{LevelBits: lb, CacheNodes: rapid.SampledFrom([]int{-1, 2, 0}).Draw(t, "cache")})
		m := make(model)
		commitEvery := rapid.IntRange(0, 400).Draw(t, "commitEvery")
		// Root between commits hashes dirty nodes that later Puts modify
		// again: their cached hashes must be dropped.
		rootEvery := rapid.IntRange(0, 50).Draw(t, "rootEvery")
		for i, o := range perm {
			next := perKey[o.key][0]
			perKey[o.key] = perKey[o.key][1:]
			next.apply(t, tr, m)
			if rootEvery > 0 && i%rootEvery == 0 {
				mustRoot(t, tr)
			}
			if commitEvery > 0 && i%commitEvery == 0 {
				mustCommit(t, tr, store)
			}
		}
		want := mustBuild(t, m, lb)
		if got := mustRoot(t, tr); got != want.Root {
			t.Fatalf("root %s, Build gives %s", got, want.Root)
		}
		mustCommit(t, tr, store)
		if got, want := store.Hashes(), blobHashes(want.Added); !slices.Equal(got, want) {
			t.Fatalf("store holds %d nodes, Build makes %d", len(got), len(want))
		}
		checkAgainst(t, tr, m, extra)
	})
}

// Reopening from (store, root) after any history of commits and rollbacks
// gives the same contents, and the store holds exactly the reachable nodes.
func TestCommitKeepsStoreExact(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		lb := rapid.SampledFrom([]int{2, 4}).Draw(t, "levelBits")
		opts := Options{LevelBits: lb, CacheNodes: rapid.SampledFrom([]int{-1, 3, 0}).Draw(t, "cache")}
		store := NewMemStore()
		tr := Open(store, Hash{}, opts)
		committed := make(model)
		for batch := range rapid.IntRange(1, 8).Draw(t, "batches") {
			m := maps_clone(committed)
			ops := rapid.SliceOfN(opGen(), 0, 60).Draw(t, fmt.Sprintf("ops%d", batch))
			ops = append(ops, bulkOps(t, fmt.Sprintf("bulk%d", batch), 400, 30)...)
			for _, o := range ops {
				o.apply(t, tr, m)
			}
			if rapid.IntRange(0, 4).Draw(t, "rollback") == 0 {
				tr.Rollback()
				if tr.Dirty() || mustRoot(t, tr) != tr.Committed() {
					t.Fatalf("Rollback left changes")
				}
				checkAgainst(t, tr, committed, nil)
				continue
			}
			before := store.Hashes()
			c := mustCommit(t, tr, store)
			for _, b := range c.Added {
				if slices.Contains(before, b.Hash) {
					t.Fatalf("Added %s, which the store already holds", b.Hash)
				}
			}
			for _, h := range c.Removed {
				if !slices.Contains(before, h) {
					t.Fatalf("Removed %s, which the store does not hold", h)
				}
			}
			committed = m
			if got, want := store.Hashes(), reachable(t, store, c.Root, lb); !slices.Equal(got, want) {
				t.Fatalf("store holds %d nodes [%s], tree has %d [%s]", len(got), hashList(got), len(want), hashList(want))
			}
			checkAgainst(t, Open(store, c.Root, opts), committed, nil)
			checkAgainst(t, tr, committed, nil)
		}
	})
}

func maps_clone(m model) model {
	out := make(model, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func TestAscendFrom(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		lb := rapid.SampledFrom([]int{1, 2, 4}).Draw(t, "levelBits")
		m := model(rapid.MapOfN(keyGen(), valueGen(), 0, 200).Draw(t, "set"))
		c := mustBuild(t, m, lb)
		store := NewMemStore()
		store.Apply(c)
		tr := Open(store, c.Root, Options{LevelBits: lb})
		start := keyGen().Draw(t, "start")
		limit := rapid.IntRange(1, 50).Draw(t, "limit")
		var want []string
		for _, k := range m.sortedKeys() {
			if k >= start && len(want) < limit {
				want = append(want, k)
			}
		}
		var got []string
		err := tr.Ascend([]byte(start), func(k, _ []byte) bool {
			got = append(got, string(k))
			return len(got) < limit
		})
		if err != nil {
			t.Fatalf("Ascend: %v", err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("Ascend(%q) = %q, want %q", start, got, want)
		}
	})
}

// A batch that ends where it started writes and deletes nothing.
func TestCommitNetEffect(t *testing.T) {
	store, root := sequentialStore(t, 2000, 2)
	tr := Open(store, root, Options{LevelBits: 2})
	mustPut(t, tr, "k/000100", "changed")
	mustPut(t, tr, "k/000100b", "new")
	mustPut(t, tr, "zzz", "new")
	if _, err := tr.Delete([]byte("k/000100b")); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Delete([]byte("zzz")); err != nil {
		t.Fatal(err)
	}
	mustPut(t, tr, "k/000100", "v100")
	if !tr.Dirty() {
		t.Fatalf("tree not dirty after changes")
	}
	c, err := tr.Commit()
	if err != nil {
		t.Fatal(err)
	}
	if c.Root != root || len(c.Added) != 0 || len(c.Removed) != 0 {
		t.Fatalf("Commit = root %s, %d added, %d removed; want root %s and nothing", c.Root, len(c.Added), len(c.Removed), root)
	}
	// Putting the same value dirties nothing.
	mustPut(t, tr, "k/000200", "v200")
	if tr.Dirty() {
		t.Fatalf("Put of an unchanged value dirtied the tree")
	}
}

// One change touches one path: a Commit adds and removes about depth nodes.
func TestCommitTouchesOnePath(t *testing.T) {
	store, root := sequentialStore(t, 20000, 4)
	tr := Open(store, root, Options{})
	depth := 0
	for r := (ref{h: root}); !r.empty(); depth++ {
		n, err := tr.load(r)
		if err != nil {
			t.Fatal(err)
		}
		r = n.kids[0]
	}
	mustPut(t, tr, "k/012345", "changed")
	c := mustCommit(t, tr, store)
	if len(c.Added) > depth+1 || len(c.Removed) > depth+1 || len(c.Added) == 0 {
		t.Fatalf("one change added %d and removed %d nodes; depth is %d", len(c.Added), len(c.Removed), depth)
	}
}

func TestLimits(t *testing.T) {
	tr := Open(NewMemStore(), Hash{}, Options{})
	if err := tr.Put(make([]byte, MaxKeyLen+1), nil); !errors.Is(err, ErrLimit) {
		t.Errorf("long key: %v", err)
	}
	if err := tr.Put([]byte("k"), make([]byte, MaxValueLen+1)); !errors.Is(err, ErrLimit) {
		t.Errorf("long value: %v", err)
	}
	if err := tr.Put(make([]byte, MaxKeyLen), make([]byte, MaxValueLen)); err != nil {
		t.Errorf("largest key and value: %v", err)
	}
	_, err := Build(Entries([]Entry{{Key: []byte("b")}, {Key: []byte("a")}}), Options{})
	if !errors.Is(err, ErrUnsorted) {
		t.Errorf("unsorted Build: %v", err)
	}
}

func TestEmptyTree(t *testing.T) {
	store := NewMemStore()
	tr := Open(store, Hash{}, Options{})
	if h := mustRoot(t, tr); !h.IsZero() {
		t.Fatalf("empty root %s", h)
	}
	mustPut(t, tr, "a", "1")
	mustCommit(t, tr, store)
	if _, err := tr.Delete([]byte("a")); err != nil {
		t.Fatal(err)
	}
	c := mustCommit(t, tr, store)
	if !c.Root.IsZero() || store.Len() != 0 || len(c.Removed) != 1 {
		t.Fatalf("after deleting the last key: root %s, %d nodes stored, %d removed", c.Root, store.Len(), len(c.Removed))
	}
}

// A corrupt or missing node makes every operation through it fail with
// ErrCorruptNode naming the node, and leaves the tree unchanged.
func TestCorruptNode(t *testing.T) {
	for _, lb := range []int{2, 4} {
		store, root := sequentialStore(t, 5000, lb)
		key := []byte("k/003000")
		// Find the nodes on key's path: the root and the node holding key.
		var path []Hash
		r := ref{h: root}
		tr := Open(store, root, Options{LevelBits: lb})
		for !r.empty() {
			path = append(path, r.h)
			n, err := tr.load(r)
			if err != nil {
				t.Fatal(err)
			}
			i, found := n.search(key)
			if found {
				break
			}
			r = n.kids[i]
		}
		for _, victim := range []Hash{path[0], path[len(path)-1]} {
			good, _ := store.GetNode(victim)
			for _, mode := range []string{"flip", "missing", "garbage"} {
				switch mode {
				case "flip":
					bad := bytes.Clone(good)
					bad[len(bad)/2] ^= 0x40
					store.Set(victim, bad)
				case "missing":
					store.Apply(Changes{Removed: []Hash{victim}})
				case "garbage":
					// Right hash, wrong store key: the bytes of another
					// node do not match the name.
					store.Set(victim, []byte{encodingVersion})
				}
				tr := Open(store, root, Options{LevelBits: lb})
				check := func(what string, err error) {
					t.Helper()
					if !errors.Is(err, ErrCorruptNode) || !strings.Contains(err.Error(), victim.String()) {
						t.Fatalf("levelBits %d, %s %s node: %s: err = %v, want ErrCorruptNode naming it", lb, mode, victim, what, err)
					}
					if mode == "missing" && !errors.Is(err, ErrNodeNotFound) {
						t.Fatalf("missing node: %s: err = %v, want ErrNodeNotFound too", what, err)
					}
				}
				_, _, err := tr.Get(key)
				check("Get", err)
				check("Put", tr.Put(key, []byte("x")))
				_, err = tr.Delete(key)
				check("Delete", err)
				check("Ascend", tr.Ascend(nil, func(_, _ []byte) bool { return true }))
				if tr.Dirty() {
					t.Fatalf("failed operations dirtied the tree")
				}
				store.Set(victim, good)
			}
		}
	}
}

// Both fanouts give sensible depths on a large tree.
func TestDepth(t *testing.T) {
	for _, c := range []struct{ lb, maxDepth int }{{2, 14}, {4, 7}} {
		store, root := sequentialStore(t, 30000, c.lb)
		depth := 0
		var walk func(h Hash, d int)
		tr := Open(store, root, Options{LevelBits: c.lb})
		walk = func(h Hash, d int) {
			depth = max(depth, d)
			n, err := tr.load(ref{h: h})
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range n.kids {
				if !k.h.IsZero() {
					walk(k.h, d+1)
				}
			}
		}
		walk(root, 1)
		if depth > c.maxDepth {
			t.Errorf("levelBits %d: depth %d for 30000 keys", c.lb, depth)
		}
	}
}

func TestLast(t *testing.T) {
	st := NewMemStore()
	tr := Open(st, Hash{}, Options{})
	if _, _, ok, err := tr.Last(); ok || err != nil {
		t.Fatalf("empty tree: ok=%v err=%v", ok, err)
	}
	max := ""
	for i := range 500 {
		k := fmt.Sprintf("k%05d", (i*7919)%500)
		if k > max {
			max = k
		}
		if err := tr.Put([]byte(k), []byte("v"+k)); err != nil {
			t.Fatal(err)
		}
	}
	k, v, ok, err := tr.Last()
	if !ok || err != nil || string(k) != max || string(v) != "v"+max {
		t.Fatalf("Last = %q %q %v %v, want %q", k, v, ok, err, max)
	}
}
