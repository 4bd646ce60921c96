package mst

import (
	"bytes"
	"fmt"
	"testing"
)

// FuzzDecodeNode checks that DecodeNode never panics and accepts only
// canonical encodings: whatever it accepts re-encodes to the same bytes.
func FuzzDecodeNode(f *testing.F) {
	for _, lb := range []int{2, 4} {
		var es []Entry
		for i := 0; i < 300; i++ {
			es = append(es, Entry{Key: []byte(fmt.Sprintf("/tasks/%03d", i)), Value: []byte{byte(i), 1, 2}})
		}
		c, err := Build(Entries(es), Options{LevelBits: lb})
		if err != nil {
			f.Fatal(err)
		}
		seen := make(map[uint8]int)
		for _, b := range c.Added {
			// A few nodes of each level are enough seeds.
			if seen[b.Data[1]] < 3 {
				f.Add(b.Data)
				seen[b.Data[1]]++
			}
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, lb := range []int{2, 4} {
			n, err := DecodeNode(data, lb)
			if err != nil {
				continue
			}
			if enc := EncodeNode(n); !bytes.Equal(enc, data) {
				t.Fatalf("levelBits %d: decode→encode changed the bytes:\n in %x\nout %x", lb, data, enc)
			}
		}
	})
}
