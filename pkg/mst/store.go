package mst

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
)

// NodeSource reads encoded nodes by hash. statd implements it over Pebble
// (key = hash, value = encoding). GetNode returns an error wrapping
// ErrNodeNotFound when the node is absent. The Tree verifies and copies what
// it reads, so the returned bytes need only be valid until GetNode is called
// again.
type NodeSource interface {
	GetNode(h Hash) ([]byte, error)
}

// NodeBlob is one encoded node and its hash.
type NodeBlob struct {
	Hash Hash
	Data []byte
}

// Changes is what a Commit (or Build) asks the caller to persist: write
// Added and delete Removed in one atomic batch, and record Root. Applied to
// a store that held exactly the nodes of the previous tree, it leaves
// exactly the nodes of the new one — the invariant Pull's has-checks rely
// on.
type Changes struct {
	Root Hash
	// Added are the nodes of the new tree that the previous tree did not
	// have, children before parents.
	Added []NodeBlob
	// Removed are the nodes of the previous tree that the new tree does not
	// have, sorted by hash.
	Removed []Hash
}

// Entry is one key and its value.
type Entry struct {
	Key, Value []byte
}

// MemStore is an in-memory node store for tests and simulations. It is safe
// for concurrent use.
type MemStore struct {
	mu    sync.RWMutex
	nodes map[Hash][]byte
}

// NewMemStore returns an empty store.
func NewMemStore() *MemStore { return &MemStore{nodes: make(map[Hash][]byte)} }

// GetNode implements NodeSource.
func (s *MemStore) GetNode(h Hash) ([]byte, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	data, ok := s.nodes[h]
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrNodeNotFound, h)
	}
	return data, nil
}

// Has reports whether the store holds h; it fits Pull's has argument.
func (s *MemStore) Has(h Hash) (bool, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	_, ok := s.nodes[h]
	return ok, nil
}

// Fetch returns the encodings of hs, as a peer would serve them to Pull.
func (s *MemStore) Fetch(ctx context.Context, hs []Hash) ([][]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := make([][]byte, len(hs))
	for i, h := range hs {
		data, err := s.GetNode(h)
		if err != nil {
			return nil, err
		}
		out[i] = data
	}
	return out, nil
}

// Apply writes c.Added and deletes c.Removed, atomically.
func (s *MemStore) Apply(c Changes) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range c.Added {
		s.nodes[b.Hash] = b.Data
	}
	for _, h := range c.Removed {
		delete(s.nodes, h)
	}
}

// Set stores data under h without checking it; tests use it to corrupt.
func (s *MemStore) Set(h Hash, data []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nodes[h] = data
}

// Len returns the number of nodes held.
func (s *MemStore) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.nodes)
}

// Bytes returns the total size of the encodings held.
func (s *MemStore) Bytes() int64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var n int64
	for _, d := range s.nodes {
		n += int64(len(d))
	}
	return n
}

// Hashes returns the hashes held, sorted.
func (s *MemStore) Hashes() []Hash {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return slices.SortedFunc(maps.Keys(s.nodes), compareHash)
}

// Clone returns an independent copy (encodings are shared: never mutated).
func (s *MemStore) Clone() *MemStore {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return &MemStore{nodes: maps.Clone(s.nodes)}
}

func compareHash(a, b Hash) int { return bytes.Compare(a[:], b[:]) }
