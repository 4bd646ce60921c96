package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/shoal-dev/shoal/pkg/mst"
)

// Scrub walks the committed tree and verifies every node against its hash.
// Damage is counted, reported in the returned error, and repaired by
// rebuilding the tree from the documents in the committer. statd runs it
// once after start-up, so damage is found without waiting for a write to
// reach it.
func (s *Store) Scrub(ctx context.Context) (entries int, err error) {
	if s.isClosed() {
		return 0, ErrClosed
	}
	snap := s.db.NewSnapshot()
	defer snap.Close()
	var root mst.Hash
	if b, err := readBytes(snap, keyRoot); err != nil {
		return 0, err
	} else if len(b) == len(root) {
		copy(root[:], b)
	}
	tree := mst.Open(pebbleNodes{snap}, root, mst.Options{LevelBits: s.opts.MSTLevelBits, CacheNodes: 64})
	err = tree.Ascend(nil, func(_, _ []byte) bool {
		entries++
		return ctx.Err() == nil
	})
	if err == nil {
		err = ctx.Err()
	}
	if errors.Is(err, mst.ErrCorruptNode) || errors.Is(err, mst.ErrNodeNotFound) {
		s.stats.corruptNodes.Add(1)
		s.log.Error("scrub found a damaged index node; rebuilding from documents", "err", err)
		s.RequestRepair()
		return entries, fmt.Errorf("scrub: %w", err)
	}
	return entries, err
}
