package vold

import (
	"testing"
	"time"

	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

func TestDocCache(t *testing.T) {
	enc := func(d *volumeDoc) *statev1.Document {
		fields, err := encodeVolume(d)
		if err != nil {
			t.Fatal(err)
		}
		return docWith(fields)
	}
	d := &volumeDoc{Group: 7, Replicas: 2, SizeBytes: 1 << 20, Created: time.Unix(100, 0).UTC(), Members: []docMember{
		{Node: "a1", Replica: 1, Boot: true}, {Node: "b2", Replica: 2, Boot: true},
	}}
	var c docCache
	first, err := c.decode(enc(d))
	if err != nil {
		t.Fatal(err)
	}
	// A caller changing what it got does not change the next answer.
	first.Members[0].Node = "zz"
	first.Members = append(first.Members, docMember{Node: "c3"})
	again, err := c.decode(enc(d))
	if err != nil {
		t.Fatal(err)
	}
	if len(again.Members) != 2 || again.Members[0].Node != "a1" || again.Group != 7 {
		t.Fatalf("cached document changed by a caller: %+v", again)
	}
	// A changed document is decoded again.
	d.Members = append(d.Members, docMember{Node: "c3", Replica: 3})
	changed, err := c.decode(enc(d))
	if err != nil {
		t.Fatal(err)
	}
	if len(changed.Members) != 3 {
		t.Fatalf("changed document served from the cache: %+v", changed)
	}
	// Bad documents are errors, every time; removed ones leave the cache.
	bad := docWith(map[string]*statev1.Value{fieldVolume: {Kind: &statev1.Value_StringValue{StringValue: "{"}}})
	for range 2 {
		if _, err := c.decode(bad); err == nil {
			t.Fatal("bad document decoded")
		}
	}
	c.keep(map[string]bool{})
	if len(c.m) != 0 {
		t.Fatalf("cache keeps %d removed documents", len(c.m))
	}
}
