package raftgroup

import (
	"fmt"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Raft messages and entries cross the host twice (network, disk), and a
// volume's 1 MiB write is one entry: protobuf's decoder copies every bytes
// field, so the host decodes the parts that carry data itself and lets
// the entries' Data alias the input. Everything else still goes through
// proto, so a field this code does not know about is kept, not dropped.

// Field numbers of raftpb (raft.proto).
const (
	fEntryType  protowire.Number = 1
	fEntryTerm  protowire.Number = 2
	fEntryIndex protowire.Number = 3
	fEntryData  protowire.Number = 4

	fMessageEntries protowire.Number = 7
)

// decodeMessage decodes a raftpb.Message like proto.Unmarshal, except that
// its entries' Data alias b: b must not change while the message or its
// entries are in use.
func decodeMessage(b []byte) (*pb.Message, error) {
	var (
		ents []*pb.Entry
		rest []byte // every field but the entries, for proto
		seen bool
	)
	for data := b; len(data) > 0; {
		n, typ, l := protowire.ConsumeTag(data)
		if l < 0 {
			return nil, protowire.ParseError(l)
		}
		vl := protowire.ConsumeFieldValue(n, typ, data[l:])
		if vl < 0 {
			return nil, protowire.ParseError(vl)
		}
		field := data[:l+vl]
		data = data[l+vl:]
		if n != fMessageEntries || typ != protowire.BytesType {
			if seen {
				rest = append(rest, field...)
			}
			continue
		}
		if !seen {
			// The fields before the first entry, which are all but entries.
			seen = true
			rest = append(rest, b[:len(b)-len(data)-len(field)]...)
		}
		v, _ := protowire.ConsumeBytes(field[l:])
		e, err := decodeEntry(v)
		if err != nil {
			return nil, err
		}
		ents = append(ents, e)
	}
	if !seen {
		rest = b
	}
	m := &pb.Message{}
	if err := proto.Unmarshal(rest, m); err != nil {
		return nil, err
	}
	m.Entries = ents
	return m, nil
}

// decodeEntry decodes a raftpb.Entry whose Data aliases b. An entry with
// anything this code does not know (a field, an entry type) is decoded by
// proto instead, copied.
func decodeEntry(b []byte) (*pb.Entry, error) {
	e := &pb.Entry{}
	for data := b; len(data) > 0; {
		n, typ, l := protowire.ConsumeTag(data)
		if l < 0 {
			return nil, protowire.ParseError(l)
		}
		data = data[l:]
		switch {
		case typ == protowire.VarintType && (n == fEntryType || n == fEntryTerm || n == fEntryIndex):
			v, l := protowire.ConsumeVarint(data)
			if l < 0 {
				return nil, protowire.ParseError(l)
			}
			data = data[l:]
			switch n {
			case fEntryType:
				t := pb.EntryType(v)
				if _, known := pb.EntryType_name[int32(t)]; !known || uint64(int32(t)) != v {
					return slowEntry(b)
				}
				e.Type = t.Enum()
			case fEntryTerm:
				e.Term = new(v)
			case fEntryIndex:
				e.Index = new(v)
			}
		case typ == protowire.BytesType && n == fEntryData:
			v, l := protowire.ConsumeBytes(data)
			if l < 0 {
				return nil, protowire.ParseError(l)
			}
			data = data[l:]
			e.Data = v[:len(v):len(v)]
		default:
			return slowEntry(b)
		}
	}
	return e, nil
}

func slowEntry(b []byte) (*pb.Entry, error) {
	e := &pb.Entry{}
	if err := proto.Unmarshal(b, e); err != nil {
		return nil, fmt.Errorf("raftgroup: entry: %w", err)
	}
	return e, nil
}
