package volfs_test

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	"github.com/shoal-dev/shoal/pkg/volfs"
)

// forkBytes is what a fork writes.
func forkBytes(t *testing.T, f raftgroup.SnapshotWriter) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := f.WriteSnapshot(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestForkSnapshot: a fork writes the snapshot of the state at the fork
// whatever is applied after it, while it is applied (each fork writes from
// a goroutine of its own: go test -race checks they share nothing that
// changes), and forking changes nothing of what the forked replica does
// (random histories, against a replica never forked).
func TestForkSnapshot(t *testing.T) {
	for seed := range uint64(30) {
		rng := rand.New(rand.NewPCG(seed, seed*17+3))
		ops := randomOps(rng, 300)
		a, plain := volfs.New(), volfs.New()
		type pending struct {
			got  chan []byte
			want []byte
			at   int
		}
		var forks []pending
		for i, op := range ops {
			if rng.IntN(40) == 0 {
				want, err := a.Snapshot()
				if err != nil {
					t.Fatal(err)
				}
				f, err := a.ForkSnapshot()
				if err != nil {
					t.Fatal(err)
				}
				p := pending{make(chan []byte, 1), want, i}
				go func() {
					var buf bytes.Buffer
					_ = f.WriteSnapshot(&buf)
					p.got <- buf.Bytes()
				}()
				forks = append(forks, p)
			}
			ra := applyOne(t, a, uint64(i+1), op)
			if rp := applyOne(t, plain, uint64(i+1), op); !bytes.Equal(ra, rp) {
				t.Fatalf("seed %d op %d: results differ from a replica never forked", seed, i)
			}
		}
		for _, p := range forks {
			if got := <-p.got; !bytes.Equal(got, p.want) {
				t.Fatalf("seed %d: the fork before op %d wrote other bytes (%d) than the state then (%d)", seed, p.at, len(got), len(p.want))
			}
		}
		if err := a.CheckInvariants(); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if a.Digest() != plain.Digest() {
			t.Fatalf("seed %d: digest differs from a replica never forked", seed)
		}
	}
}

// TestForkSnapshotPages: whole pages a write shared, pages the file owns
// and a last page with room to grow all stay as they were in a fork while
// the file is written over in place, extended, truncated and grown again.
func TestForkSnapshotPages(t *testing.T) {
	const mib = 1 << 20
	fs := volfs.New()
	idx := uint64(0)
	apply := func(op volfs.Op) volfs.Result {
		idx++
		r, err := volfs.DecodeResult(applyOne(t, fs, idx, op.Encode()))
		if err != nil || r.Errno != 0 {
			t.Fatalf("op %d (%v): %v errno %d", idx, op.Kind, err, r.Errno)
		}
		return r
	}
	fill := func(n int, b byte) []byte { return bytes.Repeat([]byte{b}, n) }
	apply(volfs.Op{Kind: volfs.KindSetLimit, Size: 64 * mib})
	ino := apply(volfs.Op{Kind: volfs.KindCreate, Parent: volfs.RootIno, Name: "f", Mode: 0o644}).Attr.Ino
	apply(volfs.Op{Kind: volfs.KindWrite, Ino: ino, Offset: 0, Data: fill(mib, 1)})           // a shared page
	apply(volfs.Op{Kind: volfs.KindWrite, Ino: ino, Offset: mib, Data: fill(mib/2, 2)})       // an owned page
	apply(volfs.Op{Kind: volfs.KindWrite, Ino: ino, Offset: 3 * mib / 2, Data: fill(100, 3)}) // room left
	want, err := fs.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	fork, err := fs.ForkSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	apply(volfs.Op{Kind: volfs.KindWrite, Ino: ino, Offset: 10, Data: fill(4096, 9)})
	apply(volfs.Op{Kind: volfs.KindWrite, Ino: ino, Offset: mib + 5, Data: fill(10, 9)})
	apply(volfs.Op{Kind: volfs.KindWrite, Ino: ino, Offset: 3*mib/2 + 100, Data: fill(5000, 9)})
	apply(volfs.Op{Kind: volfs.KindSetattr, Ino: ino, Valid: volfs.SetSize, Size: mib + 7})
	apply(volfs.Op{Kind: volfs.KindSetattr, Ino: ino, Valid: volfs.SetSize, Size: 2 * mib})
	apply(volfs.Op{Kind: volfs.KindRename, Parent: volfs.RootIno, Name: "f", NewParent: volfs.RootIno, NewName: "g"})
	if got := forkBytes(t, fork); !bytes.Equal(got, want) {
		t.Fatalf("the fork wrote other bytes (%d) than the state at the fork (%d)", len(got), len(want))
	}
	if err := fs.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	// The file reads as written after the fork.
	plain := volfs.New()
	snap, _ := fs.Snapshot()
	if err := plain.Restore(snap); err != nil {
		t.Fatal(err)
	}
	if plain.Digest() != fs.Digest() {
		t.Fatal("digest changed through a snapshot round trip")
	}
}
