package volfs

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// TestFileDataMatchesASlice runs random writes, truncations and reads on
// a fileData and on a plain byte slice: they must always hold the same
// bytes, across page boundaries and holes.
func TestFileDataMatchesASlice(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	pool := make([]byte, 3*pageSize)
	for i := range pool {
		pool[i] = byte(rng.Uint32())
	}
	var d fileData
	var model []byte
	for step := range 400 {
		switch r := rng.IntN(10); {
		case r < 6:
			off := rng.IntN(3*pageSize + 10)
			if rng.IntN(2) == 0 {
				off = len(model) // appends, the common case
			}
			n := []int{1, 4096, pageSize, pageSize + 1, rng.IntN(2 * pageSize)}[rng.IntN(5)]
			start := rng.IntN(len(pool) - n)
			b := pool[start : start+n]
			d.writeAt(b, off)
			if off > len(model) {
				model = append(model, make([]byte, off-len(model))...)
			}
			model = append(model[:off], append(bytes.Clone(b), model[min(len(model), off+len(b)):]...)...)
		case r < 8:
			size := rng.IntN(3*pageSize + 10)
			if rng.IntN(2) == 0 {
				size = rng.IntN(len(model) + 1)
			}
			d.resize(size)
			if size > len(model) {
				model = append(model, make([]byte, size-len(model))...)
			}
			model = model[:size]
		default:
			off, n := rng.IntN(len(model)+2), rng.IntN(2*pageSize)
			want := model[min(off, len(model)):min(len(model), off+n)]
			if got := d.readAt(off, n); !bytes.Equal(got, want) {
				t.Fatalf("step %d: readAt(%d, %d): %d bytes, want %d", step, off, n, len(got), len(want))
			}
		}
		if err := d.check(); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if d.len() != len(model) {
			t.Fatalf("step %d: size %d, want %d", step, d.len(), len(model))
		}
	}
	var all bytes.Buffer
	d.writeTo(&all)
	if !bytes.Equal(all.Bytes(), model) {
		t.Fatalf("contents differ")
	}
}
