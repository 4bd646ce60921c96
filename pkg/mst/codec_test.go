package mst

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
)

func TestKeyLevel(t *testing.T) {
	for _, lb := range []int{1, 2, 4, 8} {
		counts := make(map[int]int)
		for i := 0; i < 4096; i++ {
			counts[KeyLevel(binary.AppendUvarint(nil, uint64(i)), lb)]++
		}
		// About 1 - 2^-lb of the keys are level 0.
		want := 4096 - 4096>>lb
		if got := counts[0]; got < want*9/10 || got > want*11/10 {
			t.Errorf("levelBits %d: %d level-0 keys of 4096, want about %d", lb, got, want)
		}
	}
	var zero [32]byte
	if got, want := hashLevel(&zero, 4), MaxLevel(4); got != want {
		t.Errorf("level of the zero hash = %d, want the cap %d", got, want)
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	for _, lb := range []int{2, 4} {
		s, root := sequentialStore(t, 3000, lb)
		n := 0
		err := Walk(s, root, Options{LevelBits: lb}, func(h Hash, nd *Node) error {
			data, _ := s.GetNode(h)
			if enc := EncodeNode(nd); !bytes.Equal(enc, data) {
				t.Fatalf("node %s re-encodes differently", h)
			}
			n++
			return nil
		})
		if err != nil {
			t.Fatalf("Walk: %v", err)
		}
		if n < 10 {
			t.Fatalf("levelBits %d: only %d nodes", lb, n)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	const lb = 4
	k0a := keyOfLevel(t, "a", 0, lb)
	k0b := keyOfLevel(t, "b", 0, lb)
	k1 := keyOfLevel(t, "c", 1, lb)
	child := Hash{1, 2, 3}
	leaf := &Node{Level: 0, Keys: [][]byte{k0a, k0b}, Values: [][]byte{[]byte("x"), []byte("y")}, Children: make([]Hash, 3)}
	valid := EncodeNode(leaf)
	if _, err := DecodeNode(valid, lb); err != nil {
		t.Fatalf("valid leaf rejected: %v", err)
	}
	inner := &Node{Level: 1, Keys: [][]byte{k1}, Values: [][]byte{nil}, Children: []Hash{child, {}}}
	if _, err := DecodeNode(EncodeNode(inner), lb); err != nil {
		t.Fatalf("valid inner node rejected: %v", err)
	}
	// A hand-built leaf with one key "ab" and then "ac" with a chosen
	// shared-prefix length.
	ka, kb := keyOfLevel(t, "ab", 0, lb), keyOfLevel(t, "ac", 0, lb)
	abac := func(shared byte) []byte {
		suffix := kb[min(int(shared), len(kb)):]
		b := []byte{encodingVersion, 0, 2, tagNoChild}
		b = append(b, 0, byte(len(ka)))
		b = append(b, ka...)
		b = append(b, 0, tagNoChild, shared, byte(len(suffix)))
		b = append(b, suffix...)
		return append(b, 0, tagNoChild)
	}
	if _, err := DecodeNode(abac(1), lb); err != nil {
		t.Fatalf("maximal shared prefix rejected: %v", err)
	}
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"empty input", nil, "truncated"},
		{"unknown version", append([]byte{2}, valid[1:]...), "version"},
		{"level above cap", append([]byte{encodingVersion, byte(MaxLevel(lb) + 1)}, valid[2:]...), "above max"},
		{"trailing byte", append(bytes.Clone(valid), 0), "trailing"},
		{"truncated", valid[:len(valid)-1], "truncated"},
		{"non-minimal count", append([]byte{encodingVersion, 0, 0x82, 0x00}, valid[3:]...), "non-minimal"},
		{"zero entries", []byte{encodingVersion, 0, 0, tagNoChild}, "out of range"},
		{"count above bound", binary.AppendUvarint([]byte{encodingVersion, 0}, MaxNodeEntries+1), "out of range"},
		{"count above input", append([]byte{encodingVersion, 0, 100}, valid[3:]...), "out of range"},
		{"keys descending", EncodeNode(&Node{Keys: [][]byte{k0b, k0a}, Values: leaf.Values, Children: leaf.Children}), "not above"},
		{"duplicate keys", EncodeNode(&Node{Keys: [][]byte{k0a, k0a}, Values: leaf.Values, Children: leaf.Children}), "not above"},
		{"key of other level", EncodeNode(&Node{Level: 1, Keys: [][]byte{k0a}, Values: [][]byte{nil}, Children: make([]Hash, 2)}), "has level"},
		{"non-maximal prefix", abac(0), "not maximal"},
		{"prefix longer than previous key", abac(100), "out of range"},
		{"child under level 0", EncodeNode(&Node{Keys: [][]byte{k0a}, Values: [][]byte{nil}, Children: []Hash{child, {}}}), "level-0"},
		{"bad child tag", append(append([]byte{}, valid[:3]...), append([]byte{7}, valid[4:]...)...), "tag"},
		{"present zero child", append(append([]byte{encodingVersion, 1, 1, tagChild}, make([]byte, 32)...), EncodeNode(inner)[3+33:]...), "zero hash"},
		{"key too long", append([]byte{encodingVersion, 0, 1, tagNoChild, 0, 0x81, 0x40}, make([]byte, MaxKeyLen+1)...), "out of range"},
		{"value too long", append(append(append([]byte{encodingVersion, 0, 1, tagNoChild, 0, byte(len(k0a))}, k0a...), 0x81, 0x08), make([]byte, MaxValueLen+1)...), "out of range"},
	}
	for _, c := range cases {
		_, err := DecodeNode(c.data, lb)
		if !errors.Is(err, ErrInvalidEncoding) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want ErrInvalidEncoding mentioning %q", c.name, err, c.want)
		}
	}
}
