package volfs_test

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

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
		return mustApply(t, fs, idx, op)
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

// TestSummaryOutsideLock: a digest is hashed while writes go on (an Apply
// during the hashing returns without waiting for it), it is the digest of
// the state when it was asked for, and it is kept until the state
// changes.
func TestSummaryOutsideLock(t *testing.T) {
	const mib = 1 << 20
	ino := volfs.RootIno + 1
	ops := []volfs.Op{
		{Kind: volfs.KindSetLimit, Size: 64 * mib},
		{Kind: volfs.KindCreate, Parent: volfs.RootIno, Name: "f", Mode: 0o644},
		{Kind: volfs.KindWrite, Ino: ino, Offset: 0, Data: bytes.Repeat([]byte{1}, 3*mib+5)},
		{Kind: volfs.KindSetattr, Ino: ino, Valid: volfs.SetMode, Mode: 0o600},
		// Applied while the state before it is hashed.
		{Kind: volfs.KindWrite, Ino: ino, Offset: mib + 7, Data: bytes.Repeat([]byte{2}, 4096)},
	}
	apply := func(fs *volfs.FS, i int) { mustApply(t, fs, uint64(i+1), ops[i]) }
	// The digests of the states after 3, 4 and 5 ops, from replicas that
	// were never hashed concurrently.
	var want [][32]byte
	for n := 3; n <= 5; n++ {
		plain := volfs.New()
		for i := range n {
			apply(plain, i)
		}
		want = append(want, plain.Digest())
	}

	fs := volfs.New()
	for i := range 3 {
		apply(fs, i)
	}
	if fs.Digest() != want[0] {
		t.Fatal("digest differs from a replica's that applied the same")
	}
	apply(fs, 3)
	hashes := 0
	done := make(chan struct{})
	volfs.OnHashing(t, func() {
		hashes++
		if hashes > 1 {
			return
		}
		go func() {
			defer close(done)
			apply(fs, 4)
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			// Held up by the lock Summary holds: let Summary go on.
			t.Error("Apply waited for the digest being hashed")
		}
	})
	d, used, applied := fs.Summary()
	<-done
	if hashes != 1 || d != want[1] || used != 3*mib+5 || applied != 4 {
		t.Fatalf("Summary = %x, %d, %d after %d hashes; want the state before the concurrent write (%x, %d, 4) after 1", d, used, applied, hashes, want[1], 3*mib+5)
	}
	// The state changed meanwhile: hashed again, now with the write.
	if d, _, applied := fs.Summary(); d != want[2] || applied != 5 || hashes != 2 {
		t.Fatalf("after the write: digest %x at %d (hashes %d), want %x at 5 (2 hashes)", d, applied, hashes, want[2])
	}
	// Unchanged: kept, not hashed.
	if d := fs.Digest(); d != want[2] || hashes != 2 {
		t.Fatalf("unchanged state: %d hashes, digest %x; want 2, %x", hashes, d, want[2])
	}
	if err := fs.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkWritesDuringDigest: 4 KiB writes into a 256 MiB volume while
// another goroutine asks for its digest over and over (an operator
// inspecting it; the state changes with every write, so each Summary
// hashes it again). Reports the writes' longest and p99 Apply and the
// mean Summary: an Apply that waited for a whole hash would take as long.
//
//	go test -run - -bench WritesDuringDigest ./pkg/volfs/
func BenchmarkWritesDuringDigest(b *testing.B) {
	const mib = 1 << 20
	const size = 256 * mib
	fs := volfs.New()
	idx := uint64(0)
	apply := func(op volfs.Op) {
		idx++
		mustApply(b, fs, idx, op)
	}
	ino := volfs.RootIno + 1
	apply(volfs.Op{Kind: volfs.KindSetLimit, Size: 2 * size})
	apply(volfs.Op{Kind: volfs.KindCreate, Parent: volfs.RootIno, Name: "f", Mode: 0o644})
	page := bytes.Repeat([]byte{7}, mib)
	for off := 0; off < size; off += mib {
		apply(volfs.Op{Kind: volfs.KindWrite, Ino: ino, Offset: uint64(off), Data: page})
	}
	stop := make(chan struct{})
	digests := make(chan []time.Duration, 1)
	go func() {
		var took []time.Duration
		for {
			select {
			case <-stop:
				digests <- took
				return
			default:
			}
			t0 := time.Now()
			fs.Summary()
			took = append(took, time.Since(t0))
		}
	}()
	rng := rand.New(rand.NewPCG(1, 2))
	var lat []time.Duration
	for b.Loop() {
		op := volfs.Op{Kind: volfs.KindWrite, Ino: ino, Offset: uint64(rng.IntN(size/4096)) * 4096, Data: page[:4096]}
		t0 := time.Now()
		apply(op)
		lat = append(lat, time.Since(t0))
		// About a write per 100 µs, as a busy writer on this VM.
		time.Sleep(100 * time.Microsecond)
	}
	close(stop)
	took := <-digests
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds()), "max-apply-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-apply-µs")
	var sum time.Duration
	for _, d := range took {
		sum += d
	}
	if len(took) > 0 {
		b.ReportMetric(float64(sum.Milliseconds())/float64(len(took)), "digest-ms")
	}
}
