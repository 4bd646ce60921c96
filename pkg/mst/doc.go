// Package mst implements a Merkle Search Tree (Auvolat & Taïani, "Merkle
// Search Trees: Efficient State-Based CRDTs in Open Networks", SRDS 2019):
// a persistent, content-addressed index of key → value (statd: index key →
// digest of the replicated document) whose root hash depends only on the set
// of entries, so that two replicas can find what they disagree on by
// comparing hashes from the root down.
//
// # Shape: a function of the key set
//
// Every key has a level, read off its own hash: the number of leading zero
// groups of LevelBits bits in SHA-256(key) (KeyLevel). With LevelBits = 4,
// 15/16 of the keys are level 0, 1/16 are level 1 or more, 1/256 level 2 or
// more, and so on. The tree of a set S is defined, not built:
//
//   - if S is empty, there is no tree (the zero Hash);
//   - otherwise the root is a node at level L = the highest level in S,
//     holding the keys of level L in order, k_1 < … < k_n, and n+1 children:
//     child i is the tree of the keys of S strictly between k_i and k_i+1
//     (with k_0 = -∞, k_n+1 = +∞).
//
// A child's level is below its parent's but may skip levels (a gap with no
// key of level L-1 holds a lower node, or nothing), and there are no empty
// nodes. Keys of level L thus split the keys below them into runs of about
// 2^LevelBits, which is the expected fanout; the depth is about
// log_fanout(N). Because the definition mentions only S, any history of Puts
// and Deletes that ends at S ends at the same tree, node for node — the
// property tests check this against Build.
//
// Put and Delete keep the shape canonical by local surgery on one path:
// inserting a key of level l into a node of lower level splits that subtree
// in two around the key; deleting a key merges the two children that
// flanked it. Subtrees off the path move by reference.
//
// # Content addressing
//
// A node is named by the SHA-256 of its canonical encoding (EncodeNode),
// which includes its children's hashes, so the root hash commits to every
// entry, and equal hashes mean equal subtrees. The decoder accepts exactly
// one encoding per node (minimal varints, maximal key-prefix sharing, keys
// of the node's level in strict order, no trailing bytes, bounded sizes) —
// otherwise one tree would have several hashes, and a hostile peer could
// make us allocate or loop.
//
// The store (statd: Pebble, key = hash) holds exactly the nodes of the
// current tree. Commit returns the Changes that keep it so — nodes added
// and nodes no longer reachable, net of any node removed and re-created in
// the same batch — to be written in one atomic batch together with the new
// root. No garbage collection is ever needed, and "the store has node h"
// means "my tree contains that subtree", which is what Pull relies on.
//
// # Lazy loading and copy-on-write
//
// Open reads nothing. A clean node — committed, loaded and verified — is
// immutable and lives in a bounded LRU cache keyed by hash; clean nodes do
// not point at their children, only name them, so a scan of a million keys
// holds one path plus the cache (Options.CacheNodes), and a restart costs
// nothing until the tree is used. A node is verified on every read from the
// store: bytes that do not hash to their name, or do not decode, yield an
// error wrapping ErrCorruptNode that names the node. Nothing panics; statd
// answers by rebuilding the tree from its documents (BuildTo, O(N),
// constant memory).
//
// Put and Delete copy the nodes on their path into private dirty nodes,
// which point at their dirty children. Hashes of dirty nodes are computed
// only when asked for (Root, Commit), bottom-up and once per node, so a
// batch of Puts touching the same path pays for it once. Rollback drops the
// dirty nodes.
//
// # Anti-entropy: what Pull fetches
//
// Pull walks the remote tree breadth-first from its root, one round trip
// per level. A remote node whose hash the local store holds is an identical
// subtree and is never fetched; every other node is fetched, verified (hash,
// encoding, level below its parent's, keys inside the range its parent
// assigns it), its entries compared with the local tree, and its children
// considered in turn. A peer that sends a bad node gets ErrBadRemoteNode,
// which, unlike ErrCorruptNode, says nothing about the local tree.
//
// The cost is the union of the paths from the root to the changed entries,
// whole nodes at a time. d changes scattered over 100k keys cost tens of
// times the bytes of the changed entries themselves (more at fanout 16,
// whose nodes are bigger, than at fanout 4); d changes adjacent in key
// order share their nodes and cost close to the entries alone. Keys that
// change together should be close in key order (bench/mst measures this).
//
// # Limits
//
// Keys are at most MaxKeyLen bytes, values MaxValueLen, and a node holds at
// most MaxNodeEntries keys. The last cannot be enforced by splitting — the
// shape is fixed by the key set — so a write that would overfill a node
// fails with ErrLimit; keys mined to share one low-level run are the only
// realistic way to get there. Levels are capped at MaxLevel, which also
// caps the depth.
//
// A Tree is not safe for concurrent use, reads included (they update the
// cache). The package is pure: the store is the NodeSource interface and
// the network is Pull's fetch callback.
package mst
