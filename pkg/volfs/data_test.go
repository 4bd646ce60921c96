package volfs

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// TestFileDataMatchesASlice runs random writes, truncations and reads on
// a fileData and on a plain byte slice: they must always hold the same
// bytes, across page boundaries and holes. The writes' bytes come from one
// pool, which pages share (page-aligned offsets and sizes make that
// common): nothing may ever change the pool.
func TestFileDataMatchesASlice(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	pool := make([]byte, 3*pageSize)
	for i := range pool {
		pool[i] = byte(rng.Uint32())
	}
	pristine := bytes.Clone(pool)
	sharedSeen := 0
	var d fileData
	var model []byte
	for step := range 400 {
		switch r := rng.IntN(10); {
		case r < 6:
			off := rng.IntN(3*pageSize + 10)
			switch rng.IntN(4) {
			case 0, 1:
				off = len(model) // appends, the common case
			case 2:
				off = rng.IntN(4) * pageSize
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
			switch rng.IntN(3) {
			case 0:
				size = rng.IntN(len(model) + 1)
			case 1:
				size = rng.IntN(4) * pageSize
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
		if !bytes.Equal(pool, pristine) {
			t.Fatalf("step %d: a write changed the bytes of an earlier one's source", step)
		}
		for _, sh := range d.shared {
			if sh {
				sharedSeen++
			}
		}
		if d.len() != len(model) {
			t.Fatalf("step %d: size %d, want %d", step, d.len(), len(model))
		}
	}
	if sharedSeen == 0 {
		t.Fatal("no page ever shared a write's bytes: the test does not cover sharing")
	}
	var all bytes.Buffer
	d.writeTo(&all)
	if !bytes.Equal(all.Bytes(), model) {
		t.Fatalf("contents differ")
	}
}
