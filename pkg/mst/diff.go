package mst

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"slices"
)

// DiffStats counts the work of one Pull.
type DiffStats struct {
	NodesFetched    int   // remote nodes received
	BytesFetched    int64 // their encoded size
	RoundTrips      int   // calls to fetch: one per level of the remote tree that differs
	EntriesCompared int   // remote entries looked up in the local tree
}

// pullTask is a remote subtree to fetch, with what its parent promised
// about it: a lower level and keys strictly inside (lo, hi).
type pullTask struct {
	h            Hash
	parentLevel  int
	lo, hi       []byte
	hasLo, hasHi bool
}

// Pull returns the entries of the remote tree (root remoteRoot) that local
// lacks or holds with another value, sorted by key. Run it in both
// directions for a two-way sync; deletions are the CRDT layer's business
// (tombstones are entries).
//
// has must report whether local's store holds a node. Because the store
// holds exactly the nodes of local (the Changes contract), a hash it holds
// names a subtree local already has, entry for entry, so Pull never
// fetches it; everything else under a differing node is fetched, one level
// per round trip: fetch gets every hash needed at one depth (it may split
// them into several requests) and must return their encodings in order.
// Pull checks every fetched node — hash, encoding, level below its
// parent's, keys inside the range its parent gives it — so a peer cannot
// make it loop or return entries from outside the subtree it names;
// failures wrap ErrBadRemoteNode. local must have no uncommitted changes
// (ErrUncommitted), and its LevelBits must match the peer's.
func Pull(ctx context.Context, local *Tree, has func(Hash) (bool, error), remoteRoot Hash,
	fetch func(ctx context.Context, hs []Hash) ([][]byte, error)) ([]Entry, DiffStats, error) {
	var st DiffStats
	if local.Dirty() {
		return nil, st, ErrUncommitted
	}
	var out []Entry
	var frontier []pullTask
	add := func(task pullTask) error {
		if task.h.IsZero() || task.h == local.committed {
			return nil
		}
		ok, err := has(task.h)
		if err == nil && !ok {
			frontier = append(frontier, task)
		}
		return err
	}
	if err := add(pullTask{h: remoteRoot, parentLevel: MaxLevel(local.levelBits) + 1}); err != nil {
		return nil, st, err
	}
	for len(frontier) > 0 {
		if err := ctx.Err(); err != nil {
			return nil, st, err
		}
		tasks := frontier
		frontier = nil
		hs := make([]Hash, len(tasks))
		for i, task := range tasks {
			hs[i] = task.h
		}
		blobs, err := fetch(ctx, hs)
		st.RoundTrips++
		if err != nil {
			return nil, st, fmt.Errorf("mst: fetch %d nodes: %w", len(hs), err)
		}
		if len(blobs) != len(hs) {
			return nil, st, fmt.Errorf("%w: asked for %d nodes, got %d", ErrBadRemoteNode, len(hs), len(blobs))
		}
		for i, task := range tasks {
			st.NodesFetched++
			st.BytesFetched += int64(len(blobs[i]))
			n, err := checkRemote(task, blobs[i], local.levelBits)
			if err != nil {
				return nil, st, err
			}
			for j, key := range n.keys {
				st.EntriesCompared++
				v, ok, err := local.Get(key)
				if err != nil {
					return nil, st, err
				}
				if !ok || !bytes.Equal(v, n.vals[j]) {
					out = append(out, Entry{Key: key, Value: n.vals[j]})
				}
			}
			for j, k := range n.kids {
				sub := pullTask{h: k.h, parentLevel: int(n.level), lo: task.lo, hi: task.hi, hasLo: task.hasLo, hasHi: task.hasHi}
				if j > 0 {
					sub.lo, sub.hasLo = n.keys[j-1], true
				}
				if j < len(n.keys) {
					sub.hi, sub.hasHi = n.keys[j], true
				}
				if err := add(sub); err != nil {
					return nil, st, err
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b Entry) int { return bytes.Compare(a.Key, b.Key) })
	return out, st, nil
}

func checkRemote(task pullTask, data []byte, levelBits int) (*node, error) {
	if sha256.Sum256(data) != task.h {
		return nil, fmt.Errorf("%w %s: content does not match hash", ErrBadRemoteNode, task.h)
	}
	n, err := decodeNode(data, levelBits)
	if err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrBadRemoteNode, task.h, err)
	}
	if int(n.level) >= task.parentLevel {
		return nil, fmt.Errorf("%w %s: level %d under a parent of level %d", ErrBadRemoteNode, task.h, n.level, task.parentLevel)
	}
	if (task.hasLo && bytes.Compare(n.keys[0], task.lo) <= 0) ||
		(task.hasHi && bytes.Compare(n.keys[len(n.keys)-1], task.hi) >= 0) {
		return nil, fmt.Errorf("%w %s: keys outside the parent's range", ErrBadRemoteNode, task.h)
	}
	return n, nil
}

// Delta is one key on which two trees differ. InA and InB say whether the
// key is in each tree; A and B are its values there.
type Delta struct {
	Key      []byte
	A, B     []byte
	InA, InB bool
}

// Diff returns the keys on which a and b differ, sorted. Both trees are
// local (uncommitted changes included) and must have the same LevelBits.
//
// It walks both trees in key order at once, as sequences of entries and
// subtrees, and skips any pair of subtrees with equal hashes: equal hashes
// mean equal entry sets, and removing the same entries from two sorted
// sequences does not change how the rest compare. Because the shape is
// canonical, the parts of two trees that hold the same keys line up as
// equal subtrees once the walk has descended past the differences, so the
// cost follows the differences, not the size of the trees.
func Diff(a, b *Tree) ([]Delta, error) {
	if a.levelBits != b.levelBits {
		return nil, fmt.Errorf("mst: diff of trees with LevelBits %d and %d", a.levelBits, b.levelBits)
	}
	a.Root()
	b.Root()
	ca, cb := newCursor(a), newCursor(b)
	var out []Delta
	for {
		aok, bok := ca.settle(), cb.settle()
		if !aok && !bok {
			return out, nil
		}
		aSub, bSub := aok && ca.atSubtree(), bok && cb.atSubtree()
		if aSub && bSub {
			ra, rb := ca.subtree(), cb.subtree()
			if ra.hash() == rb.hash() {
				ca.next()
				cb.next()
				continue
			}
			na, err := a.load(ra)
			if err != nil {
				return nil, err
			}
			nb, err := b.load(rb)
			if err != nil {
				return nil, err
			}
			// Descend the higher subtree only: the lower one may match
			// one of its children.
			if na.level >= nb.level {
				ca.push(na)
			}
			if nb.level >= na.level {
				cb.push(nb)
			}
			continue
		}
		if aSub {
			if err := ca.descend(); err != nil {
				return nil, err
			}
			continue
		}
		if bSub {
			if err := cb.descend(); err != nil {
				return nil, err
			}
			continue
		}
		switch {
		case !bok:
			k, v := ca.entry()
			out = append(out, Delta{Key: bytes.Clone(k), A: bytes.Clone(v), InA: true})
			ca.next()
		case !aok:
			k, v := cb.entry()
			out = append(out, Delta{Key: bytes.Clone(k), B: bytes.Clone(v), InB: true})
			cb.next()
		default:
			ka, va := ca.entry()
			kb, vb := cb.entry()
			switch c := bytes.Compare(ka, kb); {
			case c < 0:
				out = append(out, Delta{Key: bytes.Clone(ka), A: bytes.Clone(va), InA: true})
				ca.next()
			case c > 0:
				out = append(out, Delta{Key: bytes.Clone(kb), B: bytes.Clone(vb), InB: true})
				cb.next()
			default:
				if !bytes.Equal(va, vb) {
					out = append(out, Delta{Key: bytes.Clone(ka), A: bytes.Clone(va), B: bytes.Clone(vb), InA: true, InB: true})
				}
				ca.next()
				cb.next()
			}
		}
	}
}

// cursor walks a tree in key order as a sequence of items: a node with
// keys k0..kn-1 reads as child0, k0, child1, …, kn-1, childn. A child
// item can be skipped whole (next) or opened (descend).
type cursor struct {
	t     *Tree
	stack []cursorFrame
}

type cursorFrame struct {
	n   *node
	pos int // even: child pos/2; odd: entry pos/2
}

func newCursor(t *Tree) *cursor {
	// A keyless frame whose only child is the root.
	root := &node{kids: []ref{t.root}}
	return &cursor{t: t, stack: []cursorFrame{{n: root}}}
}

// settle moves past empty children and finished nodes; it reports whether
// an item remains.
func (c *cursor) settle() bool {
	for len(c.stack) > 0 {
		f := &c.stack[len(c.stack)-1]
		switch {
		case f.pos > 2*len(f.n.keys):
			c.stack = c.stack[:len(c.stack)-1]
		case f.pos%2 == 0 && f.n.kids[f.pos/2].empty():
			f.pos++
		default:
			return true
		}
	}
	return false
}

func (c *cursor) top() *cursorFrame { return &c.stack[len(c.stack)-1] }

func (c *cursor) atSubtree() bool { return c.top().pos%2 == 0 }

func (c *cursor) subtree() ref { f := c.top(); return f.n.kids[f.pos/2] }

func (c *cursor) entry() ([]byte, []byte) {
	f := c.top()
	return f.n.keys[f.pos/2], f.n.vals[f.pos/2]
}

func (c *cursor) next() { c.top().pos++ }

// push opens the current subtree item, whose node is n.
func (c *cursor) push(n *node) {
	c.top().pos++
	c.stack = append(c.stack, cursorFrame{n: n})
}

func (c *cursor) descend() error {
	n, err := c.t.load(c.subtree())
	if err != nil {
		return err
	}
	c.push(n)
	return nil
}
