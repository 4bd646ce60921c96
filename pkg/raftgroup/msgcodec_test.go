package raftgroup

import (
	"bytes"
	"math/rand/v2"
	"testing"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// sameAsProto checks decodeMessage against proto.Unmarshal on data: both
// fail, or both decode equal messages.
func sameAsProto(t *testing.T, data []byte) {
	t.Helper()
	want := &pb.Message{}
	werr := proto.Unmarshal(data, want)
	got, err := decodeMessage(data)
	if (err == nil) != (werr == nil) {
		t.Fatalf("decodeMessage error %v, proto.Unmarshal error %v", err, werr)
	}
	if err == nil && !proto.Equal(got, want) {
		t.Fatalf("decodeMessage\n%v\nproto.Unmarshal\n%v", got, want)
	}
}

func randomMessage(rng *rand.Rand) *pb.Message {
	m := &pb.Message{Type: pb.MessageType(rng.IntN(20)).Enum(), To: new(rng.Uint64N(9)), From: new(rng.Uint64N(9)), Term: new(rng.Uint64())}
	if rng.IntN(2) == 0 {
		m.Commit, m.Index, m.LogTerm = new(rng.Uint64()), new(rng.Uint64()), new(rng.Uint64())
	}
	if rng.IntN(3) == 0 {
		m.Context = []byte("ctx")
	}
	for range rng.IntN(4) {
		e := &pb.Entry{Index: new(rng.Uint64()), Term: new(rng.Uint64()), Type: pb.EntryType(rng.IntN(3)).Enum()}
		if n := rng.IntN(3000); n > 0 || rng.IntN(2) == 0 {
			e.Data = make([]byte, n)
			for i := range e.Data {
				e.Data[i] = byte(rng.Uint32())
			}
		}
		m.Entries = append(m.Entries, e)
	}
	if rng.IntN(4) == 0 {
		m.Responses = []*pb.Message{{Type: pb.MsgAppResp.Enum(), Entries: []*pb.Entry{{Data: []byte("r")}}}}
	}
	return m
}

func TestDecodeMessageMatchesProto(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for range 500 {
		data, err := proto.Marshal(randomMessage(rng))
		if err != nil {
			t.Fatal(err)
		}
		sameAsProto(t, data)
		// Fields after the entries, and entries not in a row.
		sameAsProto(t, protowire.AppendVarint(protowire.AppendTag(bytes.Clone(data), 8, protowire.VarintType), 42))
		two, _ := proto.Marshal(&pb.Message{Entries: []*pb.Entry{{Data: []byte("x")}}})
		sameAsProto(t, append(append(bytes.Clone(two), data...), two...))
	}
	// An entry with a field or a type this decoder does not know: proto
	// decides (and keeps the unknown field).
	odd := protowire.AppendVarint(protowire.AppendTag(nil, 9, protowire.VarintType), 1)
	odd = protowire.AppendVarint(protowire.AppendTag(odd, fEntryType, protowire.VarintType), 77)
	msg := protowire.AppendBytes(protowire.AppendTag(nil, fMessageEntries, protowire.BytesType), odd)
	sameAsProto(t, msg)
	// Truncated input fails both ways.
	data, _ := proto.Marshal(&pb.Message{Entries: []*pb.Entry{{Data: []byte("abc")}}})
	for i := 1; i < len(data); i++ {
		sameAsProto(t, data[:i])
	}
}

func TestDecodedEntriesAliasTheInput(t *testing.T) {
	data, _ := proto.Marshal(&pb.Message{Type: pb.MsgApp.Enum(), Entries: []*pb.Entry{{Index: new(uint64(5)), Data: []byte("payload")}}})
	m, err := decodeMessage(data)
	if err != nil {
		t.Fatal(err)
	}
	d := m.GetEntries()[0].GetData()
	if i := bytes.Index(data, []byte("payload")); i < 0 || &data[i] != &d[0] {
		t.Fatalf("entry data was copied")
	}
	if cap(d) != len(d) {
		t.Fatalf("entry data has room to append into the buffer: len %d cap %d", len(d), cap(d))
	}
}
