package raftgroup

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
)

// Formats of what the host itself writes into the log and snapshots. Each
// starts with a version byte so that it can evolve.
const (
	envelopeV1 = 1
	confCtxV1  = 1
	metaV1     = 1
	snapV1     = 1
)

var errShort = errors.New("raftgroup: truncated encoding")

// reader decodes the host's small binary formats.
type reader struct {
	b   []byte
	err error
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errShort
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = errShort
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) byte() byte {
	if r.err != nil {
		return 0
	}
	if len(r.b) == 0 {
		r.err = errShort
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *reader) bytes() []byte {
	n := r.uvarint()
	if r.err != nil {
		return nil
	}
	if uint64(len(r.b)) < n {
		r.err = errShort
		return nil
	}
	out := r.b[:n:n]
	r.b = r.b[n:]
	return out
}

func appendBytes(b, v []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

// envelope wraps every normal entry the host proposes.
type envelope struct {
	key      string
	time     int64 // proposer wall time, Unix nanoseconds
	proposer NodeID
	quorum   bool // the proposer waits for a quorum to apply it
	payload  []byte
}

func (e *envelope) encode() []byte {
	b := make([]byte, 0, 32+len(e.key)+len(e.payload))
	b = append(b, envelopeV1)
	b = appendBytes(b, []byte(e.key))
	b = binary.AppendVarint(b, e.time)
	b = binary.AppendUvarint(b, uint64(e.proposer))
	var flags byte
	if e.quorum {
		flags |= 1
	}
	b = append(b, flags)
	return append(b, e.payload...)
}

func decodeEnvelope(data []byte) (envelope, error) {
	r := reader{b: data}
	if v := r.byte(); r.err == nil && v != envelopeV1 {
		return envelope{}, fmt.Errorf("raftgroup: entry format %d", v)
	}
	var e envelope
	e.key = string(r.bytes())
	e.time = r.varint()
	e.proposer = NodeID(r.uvarint())
	e.quorum = r.byte()&1 != 0
	if r.err != nil {
		return envelope{}, fmt.Errorf("raftgroup: entry: %w", r.err)
	}
	e.payload = r.b
	return e, nil
}

// confContext rides in ConfChangeV2.Context: the request key (for
// idempotency and to resolve the proposer's future) and the node of every
// replica the change adds, which every replica needs to route to it.
type confContext struct {
	key      string
	proposer NodeID
	nodes    []Member
}

func (c *confContext) encode() []byte {
	b := []byte{confCtxV1}
	b = appendBytes(b, []byte(c.key))
	b = binary.AppendUvarint(b, uint64(c.proposer))
	b = binary.AppendUvarint(b, uint64(len(c.nodes)))
	for _, m := range c.nodes {
		b = binary.AppendUvarint(b, uint64(m.Replica))
		b = binary.AppendUvarint(b, uint64(m.Node))
	}
	return b
}

func decodeConfContext(data []byte) (confContext, error) {
	if len(data) == 0 {
		return confContext{}, nil // raft's own (leave-joint) changes
	}
	r := reader{b: data}
	if v := r.byte(); r.err == nil && v != confCtxV1 {
		return confContext{}, fmt.Errorf("raftgroup: conf change context format %d", v)
	}
	var c confContext
	c.key = string(r.bytes())
	c.proposer = NodeID(r.uvarint())
	n := r.uvarint()
	for i := uint64(0); i < n && r.err == nil; i++ {
		c.nodes = append(c.nodes, Member{Replica: ReplicaID(r.uvarint()), Node: NodeID(r.uvarint())})
	}
	if r.err != nil {
		return confContext{}, fmt.Errorf("raftgroup: conf change context: %w", r.err)
	}
	return c, nil
}

// groupMeta is the part of a group's replicated state the host owns: it
// evolves only by applying entries, identically on every replica, and
// travels in snapshots next to the state machine's data.
type groupMeta struct {
	// members routes the replicas of the current configuration to nodes.
	members map[ReplicaID]NodeID
	// maxReplica is the greatest replica ID the group ever admitted; new
	// replicas must exceed it, so IDs are never reused.
	maxReplica ReplicaID
	// clock is the group clock (Unix ns): the greatest proposer time seen.
	clock int64
	dedup dedupTable
}

func newGroupMeta() *groupMeta {
	return &groupMeta{members: map[ReplicaID]NodeID{}, dedup: newDedupTable()}
}

func (m *groupMeta) encode() []byte {
	b := []byte{metaV1}
	b = binary.AppendUvarint(b, uint64(m.maxReplica))
	b = binary.AppendVarint(b, m.clock)
	ids := make([]ReplicaID, 0, len(m.members))
	for id := range m.members {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	b = binary.AppendUvarint(b, uint64(len(ids)))
	for _, id := range ids {
		b = binary.AppendUvarint(b, uint64(id))
		b = binary.AppendUvarint(b, uint64(m.members[id]))
	}
	live := m.dedup.live()
	b = binary.AppendUvarint(b, uint64(len(live)))
	for _, d := range live {
		b = appendBytes(b, []byte(d.key))
		b = binary.AppendUvarint(b, d.index)
		b = binary.AppendVarint(b, d.time)
		b = appendBytes(b, d.result)
	}
	return b
}

func decodeGroupMeta(data []byte) (*groupMeta, error) {
	r := reader{b: data}
	if v := r.byte(); r.err == nil && v != metaV1 {
		return nil, fmt.Errorf("raftgroup: group meta format %d", v)
	}
	m := newGroupMeta()
	m.maxReplica = ReplicaID(r.uvarint())
	m.clock = r.varint()
	n := r.uvarint()
	for i := uint64(0); i < n && r.err == nil; i++ {
		id := ReplicaID(r.uvarint())
		m.members[id] = NodeID(r.uvarint())
	}
	n = r.uvarint()
	for i := uint64(0); i < n && r.err == nil; i++ {
		key := string(r.bytes())
		index := r.uvarint()
		t := r.varint()
		res := r.bytes()
		m.dedup.add(key, index, t, append([]byte(nil), res...))
	}
	if r.err != nil {
		return nil, fmt.Errorf("raftgroup: group meta: %w", r.err)
	}
	return m, nil
}

// Deduplication bounds: a key is remembered for dedupWindow of group time
// and at most dedupMax keys are kept (the oldest go first). Both are
// constants because every replica must prune identically.
const (
	dedupWindow = 5 * 60 * 1e9 // 5 minutes, in ns
	dedupMax    = 100_000
)

type dedupEntry struct {
	key    string
	index  uint64
	time   int64
	result []byte
}

// dedupTable remembers recently applied proposal keys and their results,
// in apply order.
type dedupTable struct {
	order []*dedupEntry // FIFO from order[head]
	head  int
	byKey map[string]*dedupEntry
}

func newDedupTable() dedupTable { return dedupTable{byKey: map[string]*dedupEntry{}} }

func (d *dedupTable) get(key string) (*dedupEntry, bool) {
	e, ok := d.byKey[key]
	return e, ok
}

func (d *dedupTable) add(key string, index uint64, t int64, result []byte) {
	e := &dedupEntry{key: key, index: index, time: t, result: result}
	d.order = append(d.order, e)
	d.byKey[key] = e
}

// prune forgets keys older than the window (in group time) and the
// oldest beyond the size bound.
func (d *dedupTable) prune(now int64) {
	for d.head < len(d.order) {
		e := d.order[d.head]
		if len(d.order)-d.head <= dedupMax && now-e.time <= dedupWindow {
			break
		}
		if d.byKey[e.key] == e {
			delete(d.byKey, e.key)
		}
		d.order[d.head] = nil
		d.head++
	}
	if d.head > 1024 && d.head > len(d.order)/2 {
		d.order = slices.Clone(d.order[d.head:])
		d.head = 0
	}
}

func (d *dedupTable) live() []*dedupEntry {
	if d.byKey == nil {
		return d.frozenLive()
	}
	out := make([]*dedupEntry, 0, len(d.byKey))
	for _, e := range d.order[d.head:] {
		if d.byKey[e.key] == e {
			out = append(out, e)
		}
	}
	return out
}

// frozenLive is live for a frozen table, which has no index by key: an
// entry is live if no later one has its key (byKey holds the latest).
func (d *dedupTable) frozenLive() []*dedupEntry {
	order := d.order[d.head:]
	last := make(map[string]int, len(order))
	for i, e := range order {
		last[e.key] = i
	}
	out := make([]*dedupEntry, 0, len(last))
	for i, e := range order {
		if last[e.key] == i {
			out = append(out, e)
		}
	}
	return out
}

// frozen returns a copy of m to encode off the loop while m goes on
// changing. Encoding a busy group's meta took 3–22 ms on the loop (a
// volume's dedup table holds up to dedupMax keys); the copy takes its
// members and the dedup table's order, a slice of pointers: an entry is
// not changed once the round that applied it is over.
func (m *groupMeta) frozen() *groupMeta {
	f := &groupMeta{members: maps.Clone(m.members), maxReplica: m.maxReplica, clock: m.clock}
	f.dedup.order = slices.Clone(m.dedup.order[m.dedup.head:])
	return f
}

// snapshotData is what the host stores in raftpb.Snapshot.Data: its own
// replicated meta and, once the state machine took a snapshot, its data.
type snapshotData struct {
	meta   *groupMeta
	hasFSM bool
	fsm    []byte
}

func (s *snapshotData) encode() []byte {
	b := s.header()
	if s.hasFSM {
		return append(b, s.fsm...)
	}
	return b
}

// header is the encoding up to the state machine's snapshot, which follows
// it to the end.
func (s *snapshotData) header() []byte {
	b := []byte{snapV1}
	b = appendBytes(b, s.meta.encode())
	if s.hasFSM {
		return append(b, 1)
	}
	return append(b, 0)
}

func decodeSnapshotData(data []byte) (snapshotData, error) {
	r := reader{b: data}
	if v := r.byte(); r.err == nil && v != snapV1 {
		return snapshotData{}, fmt.Errorf("raftgroup: snapshot format %d", v)
	}
	mb := r.bytes()
	has := r.byte() == 1
	if r.err != nil {
		return snapshotData{}, fmt.Errorf("raftgroup: snapshot: %w", r.err)
	}
	meta, err := decodeGroupMeta(mb)
	if err != nil {
		return snapshotData{}, err
	}
	return snapshotData{meta: meta, hasFSM: has, fsm: r.b}, nil
}

// replicaRecord is a host's local (unreplicated) record of its replica.
type replicaRecord struct {
	replica ReplicaID
}

func (r replicaRecord) encode() []byte {
	return binary.AppendUvarint([]byte{1}, uint64(r.replica))
}

func decodeReplicaRecord(b []byte) (replicaRecord, error) {
	r := reader{b: b}
	if v := r.byte(); r.err == nil && v != 1 {
		return replicaRecord{}, fmt.Errorf("raftgroup: replica record format %d", v)
	}
	rec := replicaRecord{replica: ReplicaID(r.uvarint())}
	return rec, r.err
}
