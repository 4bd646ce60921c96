package mst

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/bits"
)

// Hash names a node: the SHA-256 of its canonical encoding. The zero Hash
// stands for the empty tree, or for "no child" inside a node.
type Hash [sha256.Size]byte

// IsZero reports whether h is the zero Hash (empty tree / no child).
func (h Hash) IsZero() bool { return h == Hash{} }

// String returns h in hex, the form error messages use.
func (h Hash) String() string { return hex.EncodeToString(h[:]) }

// Defaults for Options.
const (
	// DefaultLevelBits gives an expected fanout of 2^4 = 16.
	DefaultLevelBits = 4
	// DefaultCacheNodes bounds the decoded-node cache. At fanout 16 with
	// 32-byte keys and values a decoded node costs about 180 bytes per key:
	// 2.9 KiB for an average node, more for the large nodes random reads
	// favour. The default thus costs 45–75 MiB and keeps every interior
	// node of a 1M-key tree (about 4k of them) plus a working set of leaves.
	DefaultCacheNodes = 16384
)

// Options configure a Tree. The zero value selects the defaults.
type Options struct {
	// LevelBits is the number of leading zero bits of SHA-256(key) that
	// make up one level, so the expected fanout is 2^LevelBits. It must be
	// in [1, 8] and must be the same on every replica: it decides the
	// shape, hence every hash. 0 means DefaultLevelBits. Open, Build and
	// Walk panic on a value outside [1, 8]: it is a configuration bug.
	LevelBits int
	// CacheNodes is how many clean decoded nodes a Tree keeps in memory.
	// 0 means DefaultCacheNodes; a negative value disables the cache
	// (every clean node is read from the NodeSource each time it is
	// visited), which tests use to count reads.
	CacheNodes int
}

func (o Options) withDefaults() Options {
	if o.LevelBits == 0 {
		o.LevelBits = DefaultLevelBits
	}
	if o.LevelBits < 1 || o.LevelBits > 8 {
		// NB: a wrong LevelBits is a configuration bug, not a runtime
		// condition: every hash would silently differ from the peers'.
		panic(fmt.Sprintf("mst: LevelBits %d outside [1, 8]", o.LevelBits))
	}
	switch {
	case o.CacheNodes == 0:
		o.CacheNodes = DefaultCacheNodes
	case o.CacheNodes < 0:
		o.CacheNodes = 0
	}
	return o
}

// MaxLevel is the highest level a key can have: 255/levelBits, so the level
// always fits the encoding's level byte (the hash has at most 256/levelBits
// zero groups, and at 4 bits the cap only matters for an all-zero hash).
// The cap also bounds the depth of every tree, hence the recursion of every
// operation. Reaching level 10 at fanout 16 already takes ~2^40 hashes of
// mining, so in practice depth is log_fanout(N) plus a few.
func MaxLevel(levelBits int) int { return 255 / levelBits }

// KeyLevel returns the level of key: the number of leading zero groups of
// levelBits bits in SHA-256(key), capped at MaxLevel(levelBits). A key of
// level L sits in a node of level L; a fraction 2^-levelBits of the keys of
// each level also reach the next, which is what gives the expected fanout.
func KeyLevel(key []byte, levelBits int) int {
	sum := sha256.Sum256(key)
	return hashLevel(&sum, levelBits)
}

func hashLevel(sum *[sha256.Size]byte, levelBits int) int {
	zeros := 0
	for i := 0; i < sha256.Size; i += 8 {
		w := binary.BigEndian.Uint64(sum[i:])
		zeros += bits.LeadingZeros64(w)
		if w != 0 {
			break
		}
	}
	return min(zeros/levelBits, MaxLevel(levelBits))
}

// Limits on what a node may hold. They bound what a corrupt store or a
// hostile peer can make a node decode and allocate, and they are enforced on
// writes too so that every tree this package builds can also be decoded.
const (
	// MaxNodeEntries is the most keys in one node. The canonical shape
	// cannot split a node, so keys mined to share one level-0 run (easy:
	// 15/16 of keys are level 0) would otherwise grow a node without
	// bound; past this, Put and Delete fail with ErrLimit.
	MaxNodeEntries = 1 << 16
	// MaxKeyLen is the longest key, in bytes.
	MaxKeyLen = 4096
	// MaxValueLen is the longest value, in bytes (statd stores 32-byte
	// digests).
	MaxValueLen = 1024
)

var (
	// ErrNodeNotFound is what a NodeSource wraps when it does not hold a
	// node. Reaching a missing node from the tree's root means the store
	// lost part of the tree, so the Tree wraps it with ErrCorruptNode too.
	ErrNodeNotFound = errors.New("mst: node not found")
	// ErrCorruptNode wraps every failure to trust a local node: bytes whose
	// hash is not their name, bytes that do not decode, or a node missing
	// from the store. The message names the hash. The local tree cannot be
	// used any more: rebuild it from the documents (see Build).
	ErrCorruptNode = errors.New("mst: corrupt node")
	// ErrBadRemoteNode wraps every failure to trust a node fetched from a
	// peer during Pull. It says nothing about the local tree: do not
	// rebuild on it, drop the session (and count it against the peer).
	ErrBadRemoteNode = errors.New("mst: bad remote node")
	// ErrInvalidEncoding wraps every DecodeNode failure.
	ErrInvalidEncoding = errors.New("mst: invalid node encoding")
	// ErrLimit reports a key, value or node beyond the limits above.
	ErrLimit = errors.New("mst: limit exceeded")
	// ErrUnsorted reports Build input that is not strictly ascending.
	ErrUnsorted = errors.New("mst: entries not strictly ascending")
	// ErrUncommitted reports a Pull on a tree with uncommitted changes:
	// the store's has-checks would describe the committed tree, not it.
	ErrUncommitted = errors.New("mst: tree has uncommitted changes")
)
