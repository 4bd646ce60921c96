package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
	"github.com/containerd/errdefs"

	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/mst"
)

// View is a consistent read-only view of the store at one commit: its MST
// root, the tree's nodes and the documents, as anti-entropy needs them
// while writes go on. Close it when done.
type View struct {
	snap *pebble.Snapshot
	root mst.Hash
	opts mst.Options
}

// View opens a view of the latest index commit, once the index covers the
// writes acknowledged before the call. The view's documents may be newer
// than its tree (writes go on while the indexer works), never older.
func (s *Store) View() (*View, error) {
	if s.isClosed() {
		return nil, ErrClosed
	}
	s.waitIndexed()
	snap := s.db.NewSnapshot()
	b, err := readBytes(snap, keyRoot)
	if err != nil {
		snap.Close()
		return nil, err
	}
	v := &View{snap: snap, opts: mst.Options{LevelBits: s.opts.MSTLevelBits, CacheNodes: 1024}}
	copy(v.root[:], b)
	return v, nil
}

// Close releases the view.
func (v *View) Close() error { return v.snap.Close() }

// Root returns the view's MST root.
func (v *View) Root() mst.Hash { return v.root }

// Tree opens the view's MST (for mst.Pull).
func (v *View) Tree() *mst.Tree { return mst.Open(pebbleNodes{v.snap}, v.root, v.opts) }

// HasNode reports whether the view's tree contains the node h. The store
// holds exactly the nodes of its current tree, so a present node means an
// identical subtree.
func (v *View) HasNode(h mst.Hash) (bool, error) {
	_, c, err := v.snap.Get(nodeKey(h))
	if errors.Is(err, pebble.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	c.Close()
	return true, nil
}

// Nodes returns the encodings of the nodes hs, failing NotFound on the
// first one the view does not hold.
func (v *View) Nodes(hs []mst.Hash) ([][]byte, error) {
	out := make([][]byte, len(hs))
	for i, h := range hs {
		b, err := pebbleNodes{v.snap}.GetNode(h)
		if errors.Is(err, mst.ErrNodeNotFound) {
			return nil, fmt.Errorf("node %x: %w", h[:8], errdefs.ErrNotFound)
		}
		if err != nil {
			return nil, err
		}
		out[i] = b
	}
	return out, nil
}

// Doc returns the stored document of key, tombstones included; a key the
// view does not hold gives an empty document.
func (v *View) Doc(key string) (crdt.Doc, error) {
	rec, err := readRecord(v.snap, key)
	return rec.Doc, err
}

// KeyedDoc is a document with its key, as exchanged between peers.
type KeyedDoc struct {
	Key string
	Doc crdt.Doc
}

// MergeBatch merges documents received from a peer, letting them share
// commits, and returns one result per document (in order). Documents
// beyond the clock skew bound fail alone with an error wrapping
// hlc.ErrSkew.
func (s *Store) MergeBatch(ctx context.Context, docs []KeyedDoc) []WriteResult {
	results := make([]WriteResult, len(docs))
	reqs := make([]*writeReq, len(docs))
	for i, d := range docs {
		if err := ValidateKey(d.Key); err != nil {
			results[i].Err = err
			continue
		}
		if err := s.observe(d.Doc); err != nil {
			s.stats.skewRejected.Add(1)
			results[i].Err = fmt.Errorf("merge %s: %w", d.Key, err)
			continue
		}
		r := &writeReq{op: opMerge, key: d.Key, remote: d.Doc, res: make(chan WriteResult, 1)}
		s.prepareAhead(r)
		select {
		case s.reqs <- r:
			reqs[i] = r
		case <-s.closing:
			results[i].Err = ErrClosed
		case <-ctx.Done():
			results[i].Err = ctx.Err()
		}
	}
	for i, r := range reqs {
		if r == nil {
			continue
		}
		var err error
		if results[i], err = s.await(ctx, r); err != nil && results[i].Err == nil {
			results[i].Err = err
		}
	}
	return results
}

// Tail returns the index entries after key after (exclusive), in order, at
// most limit of them; truncated reports that more follow. Because the index
// is ordered by write time, these are the writes since after.
func (v *View) Tail(after []byte, limit int) (entries []mst.Entry, truncated bool, err error) {
	err = v.Tree().Ascend(after, func(key, value []byte) bool {
		if after != nil && bytes.Equal(key, after) {
			return true
		}
		if len(entries) == limit {
			truncated = true
			return false
		}
		entries = append(entries, mst.Entry{Key: bytes.Clone(key), Value: bytes.Clone(value)})
		return true
	})
	return entries, truncated, err
}

// Last returns the view's greatest index key: its latest write.
func (v *View) Last() ([]byte, error) {
	k, _, _, err := v.Tree().Last()
	return bytes.Clone(k), err
}

// HasEntry reports whether the view's index holds key with value.
func (v *View) HasEntry(key, value []byte) (bool, error) {
	got, ok, err := v.Tree().Get(key)
	return ok && bytes.Equal(got, value), err
}
