package mst

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

const encodingVersion = 1

// Child tags in the encoding.
const (
	tagNoChild = 0
	tagChild   = 1
)

// Node is the exported view of one tree node, for EncodeNode and DecodeNode.
// Keys are strictly ascending and all have level Level; Children has
// len(Keys)+1 entries, Children[i] being the subtree of keys between
// Keys[i-1] and Keys[i] (zero Hash: none).
type Node struct {
	Level    uint8
	Keys     [][]byte
	Values   [][]byte
	Children []Hash
}

// EncodeNode returns the canonical encoding of n:
//
//	version:1 | level:1 | uvarint n | child_0 | n × (key | value | child_i+1)
//	key   = uvarint shared | uvarint len(suffix) | suffix
//	value = uvarint len | bytes
//	child = 0x00 (none) | 0x01 hash:32
//
// shared is the longest common prefix with the previous key of the node (0
// for the first). EncodeNode does not validate n; DecodeNode(levelBits)
// accepts exactly the encodings of valid nodes.
func EncodeNode(n *Node) []byte {
	in := &node{level: n.Level, keys: n.Keys, vals: n.Values, kids: make([]ref, len(n.Children))}
	for i, h := range n.Children {
		in.kids[i] = ref{h: h}
	}
	return appendNode(nil, in)
}

// DecodeNode decodes and validates one node encoded by EncodeNode. It
// rejects anything that is not the canonical encoding of a valid node —
// unknown version, level above MaxLevel, zero or too many entries, keys not
// strictly ascending or of another level than the node, non-maximal shared
// prefixes, non-minimal varints, children under a level-0 node, a child
// tagged present with a zero hash, trailing bytes — so a decoded node
// re-encodes to exactly data. The result does not alias data.
func DecodeNode(data []byte, levelBits int) (*Node, error) {
	if levelBits < 1 || levelBits > 8 {
		return nil, fmt.Errorf("%w: levelBits %d outside [1, 8]", ErrInvalidEncoding, levelBits)
	}
	in, err := decodeNode(data, levelBits)
	if err != nil {
		return nil, err
	}
	out := &Node{Level: in.level, Keys: in.keys, Values: in.vals, Children: make([]Hash, len(in.kids))}
	for i, k := range in.kids {
		out.Children[i] = k.h
	}
	return out, nil
}

// appendNode appends the encoding of n. Dirty children must be hashed.
func appendNode(dst []byte, n *node) []byte {
	dst = append(dst, encodingVersion, n.level)
	dst = binary.AppendUvarint(dst, uint64(len(n.keys)))
	dst = appendChild(dst, n.kids[0].hash())
	var prev []byte
	for i, k := range n.keys {
		p := commonPrefix(prev, k)
		dst = binary.AppendUvarint(dst, uint64(p))
		dst = binary.AppendUvarint(dst, uint64(len(k)-p))
		dst = append(dst, k[p:]...)
		dst = binary.AppendUvarint(dst, uint64(len(n.vals[i])))
		dst = append(dst, n.vals[i]...)
		dst = appendChild(dst, n.kids[i+1].hash())
		prev = k
	}
	return dst
}

func appendChild(dst []byte, h Hash) []byte {
	if h.IsZero() {
		return append(dst, tagNoChild)
	}
	dst = append(dst, tagChild)
	return append(dst, h[:]...)
}

// encodedSize is an upper bound on len(appendNode(nil, n)), to size buffers.
func encodedSize(n *node) int {
	s := 2 + binary.MaxVarintLen64 + 33*len(n.kids)
	for i, k := range n.keys {
		s += 3*binary.MaxVarintLen32 + len(k) + len(n.vals[i])
	}
	return s
}

func commonPrefix(a, b []byte) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// minEntrySize is the fewest bytes one entry can take (shared, suffix
// length, value length, child tag), used to reject counts that the input
// cannot possibly hold before allocating for them.
const minEntrySize = 4

func decodeNode(data []byte, levelBits int) (*node, error) {
	d := decoder{b: data}
	if v := d.byte(); d.err == nil && v != encodingVersion {
		return nil, d.fail(fmt.Errorf("unknown version %d", v))
	}
	level := d.byte()
	if d.err == nil && int(level) > MaxLevel(levelBits) {
		return nil, d.fail(fmt.Errorf("level %d above max %d", level, MaxLevel(levelBits)))
	}
	count := d.uvarint()
	if d.err != nil {
		return nil, d.fail(d.err)
	}
	if count == 0 || count > MaxNodeEntries || count > uint64(len(data)-d.off)/minEntrySize {
		return nil, d.fail(fmt.Errorf("entry count %d out of range", count))
	}
	n := &node{
		level: level,
		keys:  make([][]byte, count),
		vals:  make([][]byte, count),
		kids:  make([]ref, count+1),
	}
	n.kids[0].h = d.child(level)
	// All key and value bytes go to one private buffer: keys must be
	// materialised anyway (prefix compression), and the store's buffer is
	// not ours to keep. Entries are recorded as offsets and sliced once buf
	// has its final size, so a cached node holds no slack.
	buf := make([]byte, 0, len(data))
	ends := make([]int, 2*count) // end of key i at 2i, of value i at 2i+1
	var prev []byte
	for i := range n.keys {
		shared := d.uvarint()
		suffix := d.uvarint()
		if d.err != nil {
			break
		}
		if shared > uint64(len(prev)) || shared+suffix > MaxKeyLen || suffix > uint64(len(data)-d.off) {
			d.setErr(fmt.Errorf("key %d: shared %d suffix %d out of range", i, shared, suffix))
			break
		}
		start := len(buf)
		buf = append(buf, prev[:shared]...)
		buf = append(buf, data[d.off:d.off+int(suffix)]...)
		d.off += int(suffix)
		key := buf[start:]
		if i > 0 && bytes.Compare(prev, key) >= 0 {
			d.setErr(fmt.Errorf("key %d not above the previous key", i))
			break
		}
		if commonPrefix(prev, key) != int(shared) {
			d.setErr(fmt.Errorf("key %d: shared prefix %d is not maximal", i, shared))
			break
		}
		sum := sha256.Sum256(key)
		if l := hashLevel(&sum, levelBits); l != int(level) {
			d.setErr(fmt.Errorf("key %d has level %d in a node of level %d", i, l, level))
			break
		}
		vlen := d.uvarint()
		if d.err != nil {
			break
		}
		if vlen > MaxValueLen || vlen > uint64(len(data)-d.off) {
			d.setErr(fmt.Errorf("value %d: length %d out of range", i, vlen))
			break
		}
		ends[2*i] = len(buf)
		buf = append(buf, data[d.off:d.off+int(vlen)]...)
		d.off += int(vlen)
		ends[2*i+1] = len(buf)
		n.kids[i+1].h = d.child(level)
		prev = key
	}
	if d.err == nil && d.off != len(data) {
		d.setErr(fmt.Errorf("%d trailing bytes", len(data)-d.off))
	}
	if d.err != nil {
		return nil, d.fail(d.err)
	}
	if cap(buf) > len(buf) {
		buf = slices.Clip(bytes.Clone(buf))
	}
	start := 0
	for i := range n.keys {
		n.keys[i] = buf[start:ends[2*i]:ends[2*i]]
		n.vals[i] = buf[ends[2*i]:ends[2*i+1]:ends[2*i+1]]
		start = ends[2*i+1]
	}
	return n, nil
}

type decoder struct {
	b   []byte
	off int
	err error
}

func (d *decoder) setErr(err error) {
	if d.err == nil {
		d.err = err
	}
}

func (d *decoder) fail(err error) error { return fmt.Errorf("%w: %v", ErrInvalidEncoding, err) }

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if d.off >= len(d.b) {
		d.setErr(errors.New("truncated"))
		return 0
	}
	c := d.b[d.off]
	d.off++
	return c
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b[d.off:])
	if n <= 0 {
		d.setErr(errors.New("bad varint"))
		return 0
	}
	// Canonical varints only, or one node would have two encodings and
	// two hashes. A varint is minimal iff its last byte is not a zero
	// continuation of a shorter one.
	if n > 1 && d.b[d.off+n-1] == 0 {
		d.setErr(errors.New("non-minimal varint"))
		return 0
	}
	d.off += n
	return v
}

func (d *decoder) child(level uint8) Hash {
	var h Hash
	switch tag := d.byte(); {
	case d.err != nil:
	case tag == tagNoChild:
	case tag != tagChild:
		d.setErr(fmt.Errorf("bad child tag %d", tag))
	case level == 0:
		// Children hold keys of lower level than their parent.
		d.setErr(errors.New("child under a level-0 node"))
	case len(d.b)-d.off < len(h):
		d.setErr(errors.New("truncated child hash"))
	default:
		copy(h[:], d.b[d.off:])
		d.off += len(h)
		if h.IsZero() {
			d.setErr(errors.New("present child with zero hash"))
		}
	}
	return h
}
