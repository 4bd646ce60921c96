package raftgroup

import (
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// entryCacheBytes bounds a group's entry cache. It holds a few of a
// volume's 1 MiB writes: enough for those in flight, which raft reads
// back to apply them and to send them to followers. A quiesced group
// drops its cache.
const entryCacheBytes = 8 << 20

// entryCopyBelow: cached entries with less data than this are copied. A
// follower's entries alias the whole received batch (msgcodec.go), up to
// 4 MiB that may carry other groups' data; a busy group of small writes
// would otherwise keep one batch alive per cached entry — far more memory
// than entryCacheBytes counts. Copying a small entry costs little; a large
// one is most of its batch anyway, so at most entryCacheBytes/entryCopyBelow
// batches stay pinned per group.
const entryCopyBelow = 256 << 10

// entryCache is a group's latest durable log entries: consecutive, and
// ending at the storage's last index whenever it is not empty. The
// entries are raft's own (never modified, by raft or by us).
type entryCache struct {
	ents  []*pb.Entry
	bytes uint64
}

func (c *entryCache) first() uint64 {
	if len(c.ents) == 0 {
		return 0
	}
	return c.ents[0].GetIndex()
}

func (c *entryCache) reset() {
	clear(c.ents)
	c.ents, c.bytes = nil, 0
}

// add appends entries just made durable (consecutive), replacing any
// cached entries at or after the first of them (a new leader overwrote
// the tail).
func (c *entryCache) add(ents []*pb.Entry) {
	if len(ents) == 0 {
		return
	}
	lo := ents[0].GetIndex()
	if first := c.first(); len(c.ents) > 0 && lo >= first && lo <= first+uint64(len(c.ents)) {
		for _, e := range c.ents[lo-first:] {
			c.bytes -= uint64(proto.Size(e))
		}
		clear(c.ents[lo-first:])
		c.ents = c.ents[:lo-first]
	} else {
		c.reset()
	}
	for _, e := range ents {
		if len(e.GetData()) < entryCopyBelow {
			// NB: a copy, not e with new Data: raft holds e too.
			e = proto.CloneOf(e)
		}
		c.ents = append(c.ents, e)
		c.bytes += uint64(proto.Size(e))
	}
	n := 0
	for n < len(c.ents) && c.bytes > entryCacheBytes {
		c.bytes -= uint64(proto.Size(c.ents[n]))
		n++
	}
	if n > 0 {
		clear(c.ents[:n])
		c.ents = c.ents[n:]
	}
}

// dropTo forgets the entries up to and including index (compacted).
func (c *entryCache) dropTo(index uint64) {
	first := c.first()
	if len(c.ents) == 0 || index < first {
		return
	}
	n := min(index-first+1, uint64(len(c.ents)))
	for _, e := range c.ents[:n] {
		c.bytes -= uint64(proto.Size(e))
	}
	clear(c.ents[:n])
	c.ents = c.ents[n:]
}

// slice returns the cached entries [lo, hi) up to maxSize bytes — with
// atLeastOne, at least one whatever its size, as raft.Storage.Entries
// does — and whether the cache holds lo (hi must not exceed the storage's
// last index + 1).
func (c *entryCache) slice(lo, hi, maxSize uint64, atLeastOne bool) ([]*pb.Entry, bool) {
	first := c.first()
	if len(c.ents) == 0 || lo < first || hi > first+uint64(len(c.ents)) {
		return nil, false
	}
	var (
		out  []*pb.Entry
		size uint64
	)
	for _, e := range c.ents[lo-first : hi-first] {
		size += uint64(proto.Size(e))
		if size > maxSize && (len(out) > 0 || !atLeastOne) {
			break
		}
		out = append(out, e)
	}
	// NB: a new slice, so that raft may append to it (Storage's contract).
	return out, true
}

// term returns the term of entry i if it is cached.
func (c *entryCache) term(i uint64) (uint64, bool) {
	first := c.first()
	if len(c.ents) == 0 || i < first || i >= first+uint64(len(c.ents)) {
		return 0, false
	}
	return c.ents[i-first].GetTerm(), true
}
