package raftgroup

import (
	"fmt"
	"slices"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Transport carries batches between hosts. The host calls Send from its
// loop, once per destination node per round; Send must not block for long
// (queue and return). A nil error means the batch was handed to the
// network (it may still be lost: Raft tolerates loss, duplication and
// reordering); an error means the node is unreachable, and the host
// reports every replica the batch was for as unreachable to Raft (and
// every snapshot in it as failed). Inbound batches are handed to
// Host.Deliver.
type Transport interface {
	Send(to NodeID, b *Batch) error
}

// Batch is everything one host sends another in one round: Raft messages
// of any number of groups, plus coalesced heartbeats and the host's own
// small messages. An empty batch is a liveness ping.
type Batch struct {
	// From is the sending node.
	From NodeID
	// Messages are Raft messages, except heartbeats without context
	// (coalesced below). A MsgSnap travels alone, in a batch of its own,
	// after the round's batch to the same node: a transport may stream it.
	Messages []GroupMessage
	// Heartbeats are coalesced MsgHeartbeats (one struct per group, no
	// per-message envelope); a Quiesce heartbeat also tells the follower
	// that the leader has gone quiet, and a Notice heartbeat only carries
	// a commit index and wants no answer (lazycommit.go).
	Heartbeats []Heartbeat
	// HeartbeatResps are coalesced MsgHeartbeatResps.
	HeartbeatResps []Heartbeat
	// Acks report a replica's applied index to a proposer waiting for a
	// quorum to apply its entry.
	Acks []ApplyAck
	// AckQueries ask for Acks of these groups (the proposer lost some).
	AckQueries []GroupID
	// Removed tells the receiver its replica was removed from the group,
	// in answer to a message or a RetireQuery from it (leaving.go).
	Removed []RemovedNotice
	// RetireQueries ask the receiver to answer with a RemovedNotice if
	// its replica of the group counts the sender's replica removed.
	RetireQueries []GroupReplica
	// Leaving says the sender is handing its leaderships off before it
	// stops (handoff.go): it is to be given none.
	Leaving bool
}

// GroupMessage is a Raft message of one group.
type GroupMessage struct {
	Group GroupID
	Msg   *pb.Message
}

// Heartbeat is a coalesced MsgHeartbeat or MsgHeartbeatResp.
type Heartbeat struct {
	Group    GroupID
	From, To ReplicaID
	Term     uint64
	Commit   uint64
	Quiesce  bool
	Notice   bool
}

// ApplyAck reports that Replica of Group applied up to Applied.
type ApplyAck struct {
	Group   GroupID
	Replica ReplicaID
	Applied uint64
}

// GroupReplica names a replica of a group.
type GroupReplica struct {
	Group   GroupID
	Replica ReplicaID
}

// RemovedNotice tells Replica that From, a replica of the same group,
// applied a configuration without it: the one made at Conf, whose voters
// are Voters.
type RemovedNotice struct {
	Group   GroupID
	Replica ReplicaID
	From    ReplicaID
	Conf    uint64
	Voters  []Member
}

// Empty reports whether the batch carries nothing but the sender's ID.
func (b *Batch) Empty() bool {
	return len(b.Messages) == 0 && len(b.Heartbeats) == 0 && len(b.HeartbeatResps) == 0 &&
		len(b.Acks) == 0 && len(b.AckQueries) == 0 && len(b.Removed) == 0 && len(b.RetireQueries) == 0
}

// Marshal encodes the batch (protobuf wire format; see batch.go for the
// field numbers) for transports that carry bytes.
func (b *Batch) Marshal() ([]byte, error) {
	return b.AppendMarshal(nil)
}

// AppendMarshal appends Marshal's encoding of the batch to dst, so that a
// transport can put several batches (and its own framing) into one buffer
// it reuses. dst is grown once, to the size computed first, and every
// message is encoded straight into it: a batch carrying a 1 MiB entry
// costs one copy of it. On error it returns dst as it was.
func (b *Batch) AppendMarshal(dst []byte) ([]byte, error) {
	sizes := make([]int, len(b.Messages))
	n := protowire.SizeTag(1) + protowire.SizeVarint(uint64(b.From))
	for i, m := range b.Messages {
		sizes[i] = proto.Size(m.Msg)
		n += protowire.SizeTag(2) + protowire.SizeBytes(groupMessageSize(m.Group, sizes[i]))
	}
	// Heartbeats and the host's own messages are a few varints each; the
	// estimate only saves regrowing.
	n += 64 * (len(b.Heartbeats) + len(b.HeartbeatResps) + len(b.Acks) + len(b.AckQueries) + 4*len(b.Removed) + len(b.RetireQueries))
	out := slices.Grow(dst, n)
	out = protowire.AppendTag(out, 1, protowire.VarintType)
	out = protowire.AppendVarint(out, uint64(b.From))
	for i, m := range b.Messages {
		out = protowire.AppendTag(out, 2, protowire.BytesType)
		out = protowire.AppendVarint(out, uint64(groupMessageSize(m.Group, sizes[i])))
		out = appendVarintField(out, 1, uint64(m.Group))
		out = protowire.AppendTag(out, 2, protowire.BytesType)
		out = protowire.AppendVarint(out, uint64(sizes[i]))
		start := len(out)
		var err error
		out, err = proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(out, m.Msg)
		if err != nil {
			return dst, err
		}
		if len(out)-start != sizes[i] {
			return dst, fmt.Errorf("raftgroup: batch: message of group %d changed while it was encoded", m.Group)
		}
	}
	for field, hbs := range [][]Heartbeat{3: b.Heartbeats, 4: b.HeartbeatResps} {
		for _, h := range hbs {
			var sub []byte
			sub = appendVarintField(sub, 1, uint64(h.Group))
			sub = appendVarintField(sub, 2, uint64(h.From))
			sub = appendVarintField(sub, 3, uint64(h.To))
			sub = appendVarintField(sub, 4, h.Term)
			sub = appendVarintField(sub, 5, h.Commit)
			if h.Quiesce {
				sub = appendVarintField(sub, 6, 1)
			}
			if h.Notice {
				sub = appendVarintField(sub, 7, 1)
			}
			out = protowire.AppendTag(out, protowire.Number(field), protowire.BytesType)
			out = protowire.AppendBytes(out, sub)
		}
	}
	for _, a := range b.Acks {
		var sub []byte
		sub = appendVarintField(sub, 1, uint64(a.Group))
		sub = appendVarintField(sub, 2, uint64(a.Replica))
		sub = appendVarintField(sub, 3, a.Applied)
		out = protowire.AppendTag(out, 5, protowire.BytesType)
		out = protowire.AppendBytes(out, sub)
	}
	for _, g := range b.AckQueries {
		out = appendVarintField(out, 6, uint64(g))
	}
	for _, r := range b.Removed {
		var sub []byte
		sub = appendVarintField(sub, 1, uint64(r.Group))
		sub = appendVarintField(sub, 2, uint64(r.Replica))
		sub = appendVarintField(sub, 3, uint64(r.From))
		sub = appendVarintField(sub, 4, r.Conf)
		for _, m := range r.Voters {
			sub = appendPair(sub, 5, uint64(m.Replica), uint64(m.Node))
		}
		out = protowire.AppendTag(out, 7, protowire.BytesType)
		out = protowire.AppendBytes(out, sub)
	}
	if b.Leaving {
		out = appendVarintField(out, 8, 1)
	}
	for _, r := range b.RetireQueries {
		out = appendPair(out, 9, uint64(r.Group), uint64(r.Replica))
	}
	return out, nil
}

// groupMessageSize is the encoded size of a GroupMessage whose Raft
// message encodes to msgSize bytes.
func groupMessageSize(g GroupID, msgSize int) int {
	n := protowire.SizeTag(2) + protowire.SizeBytes(msgSize)
	if g != 0 {
		n += protowire.SizeTag(1) + protowire.SizeVarint(uint64(g))
	}
	return n
}

func appendVarintField(b []byte, n protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, n, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

// appendPair appends field n as a message of two varint fields, 1 and 2.
func appendPair(b []byte, n protowire.Number, v1, v2 uint64) []byte {
	var sub []byte
	sub = appendVarintField(sub, 1, v1)
	sub = appendVarintField(sub, 2, v2)
	b = protowire.AppendTag(b, n, protowire.BytesType)
	return protowire.AppendBytes(b, sub)
}

// decodePair decodes a message appended by appendPair.
func decodePair(b []byte) (v1, v2 uint64, err error) {
	err = eachField(b, func(n protowire.Number, v uint64, _ []byte) error {
		switch n {
		case 1:
			v1 = v
		case 2:
			v2 = v
		}
		return nil
	})
	return v1, v2, err
}

// UnmarshalBatch decodes a batch encoded by Marshal. The entries of its
// messages alias data (they are not copied), so data must not be modified
// afterwards.
func UnmarshalBatch(data []byte) (*Batch, error) {
	b := &Batch{}
	err := eachField(data, func(n protowire.Number, v uint64, sub []byte) error {
		switch n {
		case 1:
			b.From = NodeID(v)
		case 2:
			var gm GroupMessage
			err := eachField(sub, func(n protowire.Number, v uint64, raw []byte) error {
				switch n {
				case 1:
					gm.Group = GroupID(v)
				case 2:
					m, err := decodeMessage(raw)
					gm.Msg = m
					return err
				}
				return nil
			})
			if err != nil {
				return err
			}
			if gm.Msg == nil {
				return fmt.Errorf("raftgroup: batch: message without body")
			}
			b.Messages = append(b.Messages, gm)
		case 3, 4:
			var h Heartbeat
			err := eachField(sub, func(n protowire.Number, v uint64, _ []byte) error {
				switch n {
				case 1:
					h.Group = GroupID(v)
				case 2:
					h.From = ReplicaID(v)
				case 3:
					h.To = ReplicaID(v)
				case 4:
					h.Term = v
				case 5:
					h.Commit = v
				case 6:
					h.Quiesce = v != 0
				case 7:
					h.Notice = v != 0
				}
				return nil
			})
			if err != nil {
				return err
			}
			if n == 3 {
				b.Heartbeats = append(b.Heartbeats, h)
			} else {
				b.HeartbeatResps = append(b.HeartbeatResps, h)
			}
		case 5:
			var a ApplyAck
			err := eachField(sub, func(n protowire.Number, v uint64, _ []byte) error {
				switch n {
				case 1:
					a.Group = GroupID(v)
				case 2:
					a.Replica = ReplicaID(v)
				case 3:
					a.Applied = v
				}
				return nil
			})
			if err != nil {
				return err
			}
			b.Acks = append(b.Acks, a)
		case 6:
			b.AckQueries = append(b.AckQueries, GroupID(v))
		case 7:
			var r RemovedNotice
			err := eachField(sub, func(n protowire.Number, v uint64, raw []byte) error {
				switch n {
				case 1:
					r.Group = GroupID(v)
				case 2:
					r.Replica = ReplicaID(v)
				case 3:
					r.From = ReplicaID(v)
				case 4:
					r.Conf = v
				case 5:
					replica, node, err := decodePair(raw)
					r.Voters = append(r.Voters, Member{Replica: ReplicaID(replica), Node: NodeID(node)})
					return err
				}
				return nil
			})
			if err != nil {
				return err
			}
			b.Removed = append(b.Removed, r)
		case 8:
			b.Leaving = v != 0
		case 9:
			group, replica, err := decodePair(sub)
			if err != nil {
				return err
			}
			b.RetireQueries = append(b.RetireQueries, GroupReplica{Group: GroupID(group), Replica: ReplicaID(replica)})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return b, nil
}

// eachField walks the fields of a protobuf message: fn gets the number
// and the value (varint fields) or the bytes (length-delimited fields).
func eachField(data []byte, fn func(n protowire.Number, v uint64, b []byte) error) error {
	for len(data) > 0 {
		n, typ, l := protowire.ConsumeTag(data)
		if l < 0 {
			return fmt.Errorf("raftgroup: batch: %w", protowire.ParseError(l))
		}
		data = data[l:]
		switch typ {
		case protowire.VarintType:
			v, l := protowire.ConsumeVarint(data)
			if l < 0 {
				return fmt.Errorf("raftgroup: batch: %w", protowire.ParseError(l))
			}
			data = data[l:]
			if err := fn(n, v, nil); err != nil {
				return err
			}
		case protowire.BytesType:
			v, l := protowire.ConsumeBytes(data)
			if l < 0 {
				return fmt.Errorf("raftgroup: batch: %w", protowire.ParseError(l))
			}
			data = data[l:]
			if err := fn(n, 0, v); err != nil {
				return err
			}
		default:
			l := protowire.ConsumeFieldValue(n, typ, data)
			if l < 0 {
				return fmt.Errorf("raftgroup: batch: %w", protowire.ParseError(l))
			}
			data = data[l:]
		}
	}
	return nil
}
