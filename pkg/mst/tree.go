package mst

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
)

// ref is a child (or root) reference. A clean reference holds only the hash
// of an immutable node that lives in the store and, maybe, the cache;
// holding no pointer is what lets the cache bound memory. A dirty reference
// points at a private node this Tree created since its last Commit; its hash
// is known only once the node is hashed (node.hashed).
type ref struct {
	h Hash  // clean: the node's hash (zero: empty). Dirty: unused.
	n *node // non-nil iff dirty
}

func (r ref) empty() bool { return r.n == nil && r.h.IsZero() }

// hash returns the hash of the subtree; dirty nodes must be hashed.
func (r ref) hash() Hash {
	if r.n != nil {
		return r.n.hash
	}
	return r.h
}

// node is a decoded node. A clean node (loaded, or committed) is shared and
// never modified; all its kids are clean. A dirty node is owned by one Tree
// and modified in place until Commit turns it clean.
type node struct {
	level uint8
	keys  [][]byte
	vals  [][]byte
	kids  []ref // len(keys)+1
	// hash is the node's hash: always set for clean nodes, and for dirty
	// nodes while hashed is true. Every mutation clears hashed on the node
	// and, because mutations copy or touch the whole path, on all its
	// ancestors; so a hashed node has only hashed dirty descendants.
	hash   Hash
	hashed bool
	enc    []byte // dirty and hashed: the encoding, kept for Commit
}

// search returns the index of the first key >= key and whether it is equal.
func (n *node) search(key []byte) (int, bool) {
	return slices.BinarySearchFunc(n.keys, key, bytes.Compare)
}

// Tree is a Merkle Search Tree over a NodeSource, loaded lazily. Changes are
// held in memory (copy-on-write) until Commit hands them to the caller.
//
// A Tree is not safe for concurrent use, reads included: they update the
// cache. Byte slices passed to Put are copied; slices handed out by Ascend
// belong to the tree and must not be modified.
type Tree struct {
	src       NodeSource
	levelBits int
	cache     *cache
	root      ref
	committed Hash
	// dropped holds the clean nodes that were replaced since the last
	// Commit. Every clean node in the tree was reachable from the
	// committed root, and a hash occurs at most once in a tree (distinct
	// positions hold distinct keys), so these are exactly the committed
	// nodes that may have left the tree — minus any that a dirty node
	// re-creates, which Commit cancels.
	dropped map[Hash]struct{}
}

// Open returns the tree with the given root (zero: empty) over src. It
// reads nothing until it is used. src must hold every node of that tree.
// Open panics if opts.LevelBits is outside [1, 8].
func Open(src NodeSource, root Hash, opts Options) *Tree {
	opts = opts.withDefaults()
	return &Tree{
		src:       src,
		levelBits: opts.LevelBits,
		cache:     newCache(opts.CacheNodes),
		root:      ref{h: root},
		committed: root,
		dropped:   make(map[Hash]struct{}),
	}
}

// LevelBits returns the tree's LevelBits.
func (t *Tree) LevelBits() int { return t.levelBits }

// Committed returns the root hash as of the last Commit (or Open).
func (t *Tree) Committed() Hash { return t.committed }

// Dirty reports whether the tree has uncommitted changes.
func (t *Tree) Dirty() bool { return t.root.n != nil }

// CachedNodes returns how many clean nodes the cache holds.
func (t *Tree) CachedNodes() int { return t.cache.len() }

func (t *Tree) level(key []byte) int { return KeyLevel(key, t.levelBits) }

// load returns the node r refers to, nil for an empty ref.
func (t *Tree) load(r ref) (*node, error) {
	if r.n != nil {
		return r.n, nil
	}
	if r.h.IsZero() {
		return nil, nil
	}
	if n := t.cache.get(r.h); n != nil {
		return n, nil
	}
	data, err := t.src.GetNode(r.h)
	if err != nil {
		if errors.Is(err, ErrNodeNotFound) {
			return nil, fmt.Errorf("node %s missing: %w: %w", r.h, ErrCorruptNode, err)
		}
		return nil, fmt.Errorf("mst: read node %s: %w", r.h, err)
	}
	if sha256.Sum256(data) != r.h {
		return nil, fmt.Errorf("%w %s: content does not match hash", ErrCorruptNode, r.h)
	}
	n, err := decodeNode(data, t.levelBits)
	if err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrCorruptNode, r.h, err)
	}
	n.hash = r.h
	t.cache.add(r.h, n)
	return n, nil
}

// Get returns a copy of the value stored under key.
func (t *Tree) Get(key []byte) (value []byte, ok bool, err error) {
	r := t.root
	for {
		n, err := t.load(r)
		if n == nil || err != nil {
			return nil, false, err
		}
		i, found := n.search(key)
		if found {
			return bytes.Clone(n.vals[i]), true, nil
		}
		r = n.kids[i]
	}
}

// Put sets key to value. Putting the value a key already has changes
// nothing (and dirties nothing). On error the tree is unchanged.
func (t *Tree) Put(key, value []byte) error {
	if len(key) > MaxKeyLen {
		return fmt.Errorf("%w: key of %d bytes (max %d)", ErrLimit, len(key), MaxKeyLen)
	}
	if len(value) > MaxValueLen {
		return fmt.Errorf("%w: value of %d bytes (max %d)", ErrLimit, len(value), MaxValueLen)
	}
	r, changed, err := t.insert(t.root, bytes.Clone(key), bytes.Clone(value), t.level(key))
	if err == nil && changed {
		t.root = r
	}
	return err
}

// Delete removes key and reports whether it was present. On error the tree
// is unchanged.
func (t *Tree) Delete(key []byte) (existed bool, err error) {
	r, changed, err := t.remove(t.root, key, t.level(key))
	if err == nil && changed {
		t.root = r
	}
	return changed, err
}

// The structural operations below follow one discipline that makes a
// failed operation leave the tree untouched: each step does all its loads
// and checks, then recurses, and mutates only after the recursion
// succeeded. Loads are the only thing that can fail, so either every step
// mutates or none does.

// insert returns the tree r with key set to val; key has level lvl.
func (t *Tree) insert(r ref, key, val []byte, lvl int) (ref, bool, error) {
	n, err := t.load(r)
	if err != nil {
		return r, false, err
	}
	if n == nil {
		return ref{n: newNode(lvl, [][]byte{key}, [][]byte{val}, []ref{{}, {}})}, true, nil
	}
	if int(n.level) < lvl {
		// key becomes the root of this subtree; everything else in it
		// falls to its left or right.
		left, right, err := t.split(r, key)
		if err != nil {
			return r, false, err
		}
		return ref{n: newNode(lvl, [][]byte{key}, [][]byte{val}, []ref{left, right})}, true, nil
	}
	i, found := n.search(key)
	if int(n.level) > lvl {
		c, changed, err := t.insert(n.kids[i], key, val, lvl)
		if err != nil || !changed {
			return r, false, err
		}
		m := t.cow(r, n)
		m.kids[i] = c
		return ref{n: m}, true, nil
	}
	if found {
		if bytes.Equal(n.vals[i], val) {
			return r, false, nil
		}
		m := t.cow(r, n)
		m.vals[i] = val
		return ref{n: m}, true, nil
	}
	if len(n.keys) >= MaxNodeEntries {
		return r, false, fmt.Errorf("%w: node of level %d already holds %d keys", ErrLimit, n.level, len(n.keys))
	}
	// The child between keys[i-1] and keys[i] is cut in two by key.
	left, right, err := t.split(n.kids[i], key)
	if err != nil {
		return r, false, err
	}
	m := t.cow(r, n)
	m.keys = slices.Insert(m.keys, i, key)
	m.vals = slices.Insert(m.vals, i, val)
	m.kids[i] = left
	m.kids = slices.Insert(m.kids, i+1, right)
	return ref{n: m}, true, nil
}

// split returns the trees of the keys of r below and above key, which r
// does not hold. Only the nodes on key's search path are rebuilt: subtrees
// wholly on one side are moved by reference.
func (t *Tree) split(r ref, key []byte) (ref, ref, error) {
	n, err := t.load(r)
	if n == nil || err != nil {
		return ref{}, ref{}, err
	}
	i, found := n.search(key)
	if found {
		return ref{}, ref{}, fmt.Errorf("mst: split at present key %q (node %s)", key, r.h)
	}
	cl, cr, err := t.split(n.kids[i], key)
	if err != nil {
		return ref{}, ref{}, err
	}
	// By induction, a split with an empty side returns its input, so a
	// subtree wholly on one side of key is returned as is, not rebuilt.
	if i == len(n.keys) && cr.empty() {
		return r, ref{}, nil
	}
	if i == 0 && cl.empty() {
		return ref{}, r, nil
	}
	left, right := cl, cr
	if i > 0 {
		left = ref{n: newNode(int(n.level), slices.Clone(n.keys[:i]), slices.Clone(n.vals[:i]),
			append(slices.Clone(n.kids[:i]), cl))}
	}
	if i < len(n.keys) {
		right = ref{n: newNode(int(n.level), slices.Clone(n.keys[i:]), slices.Clone(n.vals[i:]),
			append([]ref{cr}, n.kids[i+1:]...))}
	}
	t.discard(r)
	return left, right, nil
}

// remove returns the tree r without key, which has level lvl.
func (t *Tree) remove(r ref, key []byte, lvl int) (ref, bool, error) {
	n, err := t.load(r)
	if n == nil || err != nil || int(n.level) < lvl {
		// A key of level lvl can only sit in a node of level lvl, and
		// levels only decrease downwards.
		return r, false, err
	}
	i, found := n.search(key)
	if int(n.level) > lvl {
		c, changed, err := t.remove(n.kids[i], key, lvl)
		if err != nil || !changed {
			return r, false, err
		}
		m := t.cow(r, n)
		m.kids[i] = c
		return ref{n: m}, true, nil
	}
	if !found {
		return r, false, nil
	}
	// The two children around key now share one gap: join them.
	joined, err := t.merge(n.kids[i], n.kids[i+1])
	if err != nil {
		return r, false, err
	}
	if len(n.keys) == 1 {
		// No empty nodes: the joined child takes this node's place,
		// even if that skips levels.
		t.discard(r)
		return joined, true, nil
	}
	m := t.cow(r, n)
	m.keys = slices.Delete(m.keys, i, i+1)
	m.vals = slices.Delete(m.vals, i, i+1)
	m.kids[i] = joined
	m.kids = slices.Delete(m.kids, i+1, i+2)
	return ref{n: m}, true, nil
}

// merge joins two trees whose keys are all ordered a < b. Only the right
// spine of a and the left spine of b are rebuilt.
func (t *Tree) merge(a, b ref) (ref, error) {
	if a.empty() {
		return b, nil
	}
	if b.empty() {
		return a, nil
	}
	na, err := t.load(a)
	if err != nil {
		return ref{}, err
	}
	nb, err := t.load(b)
	if err != nil {
		return ref{}, err
	}
	last := len(na.kids) - 1
	switch {
	case na.level > nb.level:
		c, err := t.merge(na.kids[last], b)
		if err != nil {
			return ref{}, err
		}
		m := t.cow(a, na)
		m.kids[last] = c
		return ref{n: m}, nil
	case na.level < nb.level:
		c, err := t.merge(a, nb.kids[0])
		if err != nil {
			return ref{}, err
		}
		m := t.cow(b, nb)
		m.kids[0] = c
		return ref{n: m}, nil
	}
	if len(na.keys)+len(nb.keys) > MaxNodeEntries {
		return ref{}, fmt.Errorf("%w: joined node of level %d would hold %d keys",
			ErrLimit, na.level, len(na.keys)+len(nb.keys))
	}
	c, err := t.merge(na.kids[last], nb.kids[0])
	if err != nil {
		return ref{}, err
	}
	kids := make([]ref, 0, len(na.kids)+len(nb.kids)-1)
	kids = append(kids, na.kids[:last]...)
	kids = append(kids, c)
	kids = append(kids, nb.kids[1:]...)
	m := newNode(int(na.level), slices.Concat(na.keys, nb.keys), slices.Concat(na.vals, nb.vals), kids)
	t.discard(a)
	t.discard(b)
	return ref{n: m}, nil
}

func newNode(level int, keys, vals [][]byte, kids []ref) *node {
	return &node{level: uint8(level), keys: keys, vals: vals, kids: kids}
}

// cow returns a node that may be modified in place of n (which r refers
// to): n itself if dirty, else a private copy, with the clean original
// recorded as dropped. Key and value bytes are shared: nothing mutates them.
func (t *Tree) cow(r ref, n *node) *node {
	if r.n != nil {
		n.hashed, n.enc = false, nil
		return n
	}
	t.discard(r)
	// Room for one more entry: most copies are made to insert one.
	return &node{
		level: n.level,
		keys:  append(make([][]byte, 0, len(n.keys)+1), n.keys...),
		vals:  append(make([][]byte, 0, len(n.vals)+1), n.vals...),
		kids:  append(make([]ref, 0, len(n.kids)+1), n.kids...),
	}
}

// discard records that the node r refers to left the tree.
func (t *Tree) discard(r ref) {
	if r.n == nil && !r.h.IsZero() {
		t.dropped[r.h] = struct{}{}
	}
}

// Root returns the root hash, hashing the dirty nodes that changed since
// the last Root or Commit — and only those, so a batch of Puts costs one
// hash per touched node, not one path per Put.
func (t *Tree) Root() (Hash, error) { return t.hashRef(t.root), nil }

func (t *Tree) hashRef(r ref) Hash {
	n := r.n
	if n == nil {
		return r.h
	}
	if n.hashed {
		return n.hash
	}
	for _, k := range n.kids {
		t.hashRef(k)
	}
	n.enc = appendNode(make([]byte, 0, encodedSize(n)), n)
	n.hash = sha256.Sum256(n.enc)
	n.hashed = true
	return n.hash
}

// Commit makes the current tree the committed one and returns what the
// store must do to hold exactly its nodes; see Changes. The caller must
// apply the Changes before the tree reads any node it dropped from its
// cache — in practice, before using the tree again. If persisting fails,
// discard the Tree and Open the last durable root.
func (t *Tree) Commit() (Changes, error) {
	root := t.hashRef(t.root)
	var added []NodeBlob
	t.collect(t.root, &added)
	// Net effect: a node dropped and re-created (say, a Put undone by a
	// Delete) is still in the store and must be neither written nor
	// deleted.
	out := added[:0]
	for _, b := range added {
		if _, ok := t.dropped[b.Hash]; ok {
			delete(t.dropped, b.Hash)
			continue
		}
		out = append(out, b)
	}
	removed := make([]Hash, 0, len(t.dropped))
	for h := range t.dropped {
		removed = append(removed, h)
	}
	slices.SortFunc(removed, compareHash)
	clear(t.dropped)
	t.root = ref{h: root}
	t.committed = root
	return Changes{Root: root, Added: out, Removed: removed}, nil
}

// collect appends the dirty nodes under r in post-order and turns them
// into clean, cached nodes that no longer point at their children.
func (t *Tree) collect(r ref, out *[]NodeBlob) {
	n := r.n
	if n == nil {
		return
	}
	for i, k := range n.kids {
		t.collect(k, out)
		n.kids[i] = ref{h: k.hash()}
	}
	*out = append(*out, NodeBlob{Hash: n.hash, Data: n.enc})
	n.enc = nil
	t.cache.add(n.hash, n)
}

// Rollback discards the changes made since the last Commit.
func (t *Tree) Rollback() {
	t.root = ref{h: t.committed}
	clear(t.dropped)
}

// Ascend calls fn for each entry with key >= start in ascending key order
// until fn returns false. fn must not modify the tree or the slices it is
// given. Only the nodes of the current path are held, so a scan of any
// size runs in the cache's memory.
func (t *Tree) Ascend(start []byte, fn func(key, value []byte) bool) error {
	_, err := t.ascend(t.root, start, fn)
	return err
}

func (t *Tree) ascend(r ref, start []byte, fn func(key, value []byte) bool) (bool, error) {
	n, err := t.load(r)
	if n == nil || err != nil {
		return err == nil, err
	}
	i := 0
	if start != nil {
		var found bool
		i, found = n.search(start)
		// kids[i] holds keys below keys[i]; some are >= start unless
		// keys[i] is start itself.
		if !found {
			if more, err := t.ascend(n.kids[i], start, fn); !more || err != nil {
				return false, err
			}
		}
	} else if more, err := t.ascend(n.kids[0], nil, fn); !more || err != nil {
		return false, err
	}
	for ; i < len(n.keys); i++ {
		if !fn(n.keys[i], n.vals[i]) {
			return false, nil
		}
		if more, err := t.ascend(n.kids[i+1], nil, fn); !more || err != nil {
			return false, err
		}
	}
	return true, nil
}

// Last returns the greatest key in the tree and its value; ok is false for
// an empty tree. statd orders its index by time, so this is the latest
// write: the watermark two peers share after a round that left them equal.
func (t *Tree) Last() (key, value []byte, ok bool, err error) {
	r := t.root
	for {
		n, err := t.load(r)
		if err != nil || n == nil {
			return key, value, ok, err
		}
		if len(n.keys) > 0 {
			key, value, ok = n.keys[len(n.keys)-1], n.vals[len(n.vals)-1], true
		}
		r = n.kids[len(n.kids)-1]
	}
}
