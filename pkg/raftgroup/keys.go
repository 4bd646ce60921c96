package raftgroup

import "encoding/binary"

// Key layout (all under the keyspace's prefix, empty in a host):
//
//	prefix 0x01 group(8) 0x01             local replica record (replicaMeta)
//	prefix 0x01 group(8) 0x02             HardState
//	prefix 0x01 group(8) 0x03             truncated state: index(8) term(8)
//	prefix 0x01 group(8) 0x04             latest snapshot (raftpb.Snapshot)
//	prefix 0x01 group(8) 0x05             (was the applied index: never read, no longer written)
//	prefix 0x01 group(8) 0x10 index(8)    log entry (raftpb.Entry)
//	prefix 0x02 group(8)                  tombstone: the greatest replica ID destroyed here
//	prefix 0x03                           sequence number of the last journal record applied
//
// Integers are big-endian so that a group's keys and its log sort
// together and in index order: one range deletion drops a group, one
// drops a log prefix.
const (
	tagGroup     = 0x01
	tagTombstone = 0x02
	tagJournal   = 0x03

	sufMeta      = 0x01
	sufHardState = 0x02
	sufTruncated = 0x03
	sufSnapshot  = 0x04
	sufLog       = 0x10
)

type keyspace struct{ prefix []byte }

func (k keyspace) groupPrefix(g GroupID) []byte {
	b := make([]byte, 0, len(k.prefix)+1+8+1+8)
	b = append(b, k.prefix...)
	b = append(b, tagGroup)
	return binary.BigEndian.AppendUint64(b, uint64(g))
}

// groupEnd is the exclusive upper bound of every key of group g.
func (k keyspace) groupEnd(g GroupID) []byte {
	b := append([]byte(nil), k.prefix...)
	b = append(b, tagGroup)
	if uint64(g) == ^uint64(0) {
		return append(b[:len(k.prefix)], tagGroup+1)
	}
	return binary.BigEndian.AppendUint64(b, uint64(g)+1)
}

func (k keyspace) groupKey(g GroupID, suffix byte) []byte {
	return append(k.groupPrefix(g), suffix)
}

func (k keyspace) logKey(g GroupID, index uint64) []byte {
	return binary.BigEndian.AppendUint64(k.groupKey(g, sufLog), index)
}

// logEnd bounds the log of g (exclusive).
func (k keyspace) logEnd(g GroupID) []byte { return k.groupKey(g, sufLog+1) }

// seqKey holds the sequence number of the journal's batch record that
// wrote it (every batch writes it): after a crash, how far Pebble got.
func (k keyspace) seqKey() []byte {
	return append(append([]byte(nil), k.prefix...), tagJournal)
}

func (k keyspace) tombstoneKey(g GroupID) []byte {
	b := append([]byte(nil), k.prefix...)
	b = append(b, tagTombstone)
	return binary.BigEndian.AppendUint64(b, uint64(g))
}

// parseGroupKey returns the group and suffix of a group key.
func (k keyspace) parseGroupKey(key []byte) (GroupID, byte, bool) {
	n := len(k.prefix)
	if len(key) < n+10 || key[n] != tagGroup {
		return 0, 0, false
	}
	return GroupID(binary.BigEndian.Uint64(key[n+1:])), key[n+9], true
}

func (k keyspace) parseLogIndex(key []byte) uint64 {
	return binary.BigEndian.Uint64(key[len(key)-8:])
}
