package mst

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"iter"
)

// Entries adapts a slice of entries, sorted by key, to Build's input.
func Entries(es []Entry) iter.Seq2[[]byte, []byte] {
	return func(yield func(key, value []byte) bool) {
		for _, e := range es {
			if !yield(e.Key, e.Value) {
				return
			}
		}
	}
}

// Build returns the tree of entries, which must be strictly ascending by
// key, as Changes: Root and every node in Added, children first. It gives
// the same tree as Putting the entries one by one in any order, in O(N)
// time. Removed is empty: Build does not know what the store held, so a
// rebuild after corruption must first delete every node in the store.
func Build(entries iter.Seq2[[]byte, []byte], opts Options) (Changes, error) {
	var c Changes
	root, err := BuildTo(entries, opts, func(b NodeBlob) error {
		c.Added = append(c.Added, b)
		return nil
	})
	c.Root = root
	return c, err
}

// BuildTo is Build that streams each node to emit as soon as it is
// complete, children before parents, and holds only one partial node per
// level: a rebuild of any size runs in constant memory. The entries'
// slices are copied when kept, so the iterator may reuse its buffers.
func BuildTo(entries iter.Seq2[[]byte, []byte], opts Options, emit func(NodeBlob) error) (Hash, error) {
	levelBits := opts.withDefaults().LevelBits
	// stack holds the open nodes of the right spine, levels strictly
	// decreasing upwards; cur is the finished subtree of the keys after
	// the top's last key. A key of level l closes every open node of lower
	// level (their range ends at the key), then joins the open node of
	// level l or opens one.
	var stack []*node
	var cur Hash
	var prev []byte
	closeTop := func() error {
		top := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		top.kids = append(top.kids, ref{h: cur})
		enc := appendNode(make([]byte, 0, encodedSize(top)), top)
		cur = sha256.Sum256(enc)
		return emit(NodeBlob{Hash: cur, Data: enc})
	}
	first := true
	for key, value := range entries {
		if !first && bytes.Compare(prev, key) >= 0 {
			return Hash{}, fmt.Errorf("%w: %q after %q", ErrUnsorted, key, prev)
		}
		first = false
		if len(key) > MaxKeyLen || len(value) > MaxValueLen {
			return Hash{}, fmt.Errorf("%w: key of %d bytes, value of %d", ErrLimit, len(key), len(value))
		}
		key, value = bytes.Clone(key), bytes.Clone(value)
		prev = key
		lvl := KeyLevel(key, levelBits)
		for len(stack) > 0 && int(stack[len(stack)-1].level) < lvl {
			if err := closeTop(); err != nil {
				return Hash{}, err
			}
		}
		if len(stack) > 0 && int(stack[len(stack)-1].level) == lvl {
			top := stack[len(stack)-1]
			if len(top.keys) >= MaxNodeEntries {
				return Hash{}, fmt.Errorf("%w: node of level %d would exceed %d keys", ErrLimit, lvl, MaxNodeEntries)
			}
			top.keys = append(top.keys, key)
			top.vals = append(top.vals, value)
			top.kids = append(top.kids, ref{h: cur})
		} else {
			stack = append(stack, newNode(lvl, [][]byte{key}, [][]byte{value}, []ref{{h: cur}}))
		}
		cur = Hash{}
	}
	for len(stack) > 0 {
		if err := closeTop(); err != nil {
			return Hash{}, err
		}
	}
	return cur, nil
}

// Walk calls fn for every node of the tree rooted at root in src, parents
// before children, verifying each node's hash and encoding, and that each
// child's level is below its parent's (errors wrap ErrCorruptNode). statd
// can use it to check a store against its root.
func Walk(src NodeSource, root Hash, opts Options, fn func(h Hash, n *Node) error) error {
	t := Open(src, Hash{}, Options{LevelBits: opts.LevelBits, CacheNodes: -1})
	return t.walk(ref{h: root}, MaxLevel(t.levelBits)+1, fn)
}

func (t *Tree) walk(r ref, parentLevel int, fn func(h Hash, n *Node) error) error {
	n, err := t.load(r)
	if n == nil || err != nil {
		return err
	}
	if int(n.level) >= parentLevel {
		return fmt.Errorf("%w %s: level %d under a parent of level %d", ErrCorruptNode, r.h, n.level, parentLevel)
	}
	out := &Node{Level: n.level, Keys: n.keys, Values: n.vals, Children: make([]Hash, len(n.kids))}
	for i, k := range n.kids {
		out.Children[i] = k.h
	}
	if err := fn(r.h, out); err != nil {
		return err
	}
	for _, k := range n.kids {
		if err := t.walk(k, int(n.level), fn); err != nil {
			return err
		}
	}
	return nil
}
