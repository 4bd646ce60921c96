package volfs_test

import (
	"bytes"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	"github.com/shoal-dev/shoal/pkg/volfs"
)

// opGen generates random ops over a small namespace. It learns the
// inodes that exist from the results it is shown (observe), so that most
// ops meet existing names and inodes; many still fail, and failures must
// replicate just as deterministically.
type opGen struct {
	rng  *rand.Rand
	dirs []uint64
	inos []uint64
}

func newOpGen(rng *rand.Rand) *opGen {
	return &opGen{rng: rng, dirs: []uint64{volfs.RootIno}, inos: []uint64{volfs.RootIno}}
}

func (g *opGen) observe(res []byte) {
	r, err := volfs.DecodeResult(res)
	if err != nil || r.Attr == nil {
		return
	}
	if r.Attr.IsDir() {
		g.dirs = append(g.dirs, r.Attr.Ino)
	}
	g.inos = append(g.inos, r.Attr.Ino)
}

func (g *opGen) next() []byte {
	rng := g.rng
	names := []string{"a", "b", "c", "dd"}
	name := func() string { return names[rng.IntN(len(names))] }
	dir := func() uint64 {
		if rng.IntN(20) == 0 {
			return g.inos[rng.IntN(len(g.inos))]
		}
		return g.dirs[rng.IntN(len(g.dirs))]
	}
	ino := func() uint64 { return g.inos[rng.IntN(len(g.inos))] }
	op := volfs.Op{Parent: dir(), Name: name(), Ino: ino(), UID: rng.Uint32N(3), GID: rng.Uint32N(3)}
	// Unlinks and renames come from one of three mounts on two nodes,
	// each with a few files open: some files outlive their names.
	holder := func() {
		m := rng.IntN(4)
		if m == 3 {
			return
		}
		op.Node, op.Session = []string{"n1", "n1", "n2"}[m], []string{"s1", "s2", "s3"}[m]
		for range rng.IntN(4) {
			op.Open = append(op.Open, ino())
		}
	}
	switch r := rng.IntN(100); {
	case r < 15:
		op.Kind, op.Mode, op.Flags = volfs.KindCreate, rng.Uint32N(0o1000), rng.Uint32N(4)
	case r < 25:
		op.Kind, op.Mode = volfs.KindMkdir, 0o755|rng.Uint32N(2)*volfs.ModeSetgid
	case r < 28:
		op.Kind, op.Data = volfs.KindSymlink, []byte(name())
	case r < 32:
		op.Kind, op.NewParent, op.NewName = volfs.KindLink, dir(), name()
	case r < 40:
		op.Kind = volfs.KindUnlink
		holder()
	case r < 45:
		op.Kind = volfs.KindRmdir
	case r < 55:
		op.Kind, op.NewParent, op.NewName, op.Flags = volfs.KindRename, dir(), name(), rng.Uint32N(3)
		holder()
	case r < 68:
		op.Kind, op.Valid = volfs.KindSetattr, rng.Uint32N(256)
		op.Mode, op.Size, op.Atime, op.Mtime = rng.Uint32N(0o10000), rng.Uint64N(300), rng.Int64N(1e18), rng.Int64N(1e18)
	case r < 60:
		op.Kind, op.Flags = volfs.KindForget, rng.Uint32N(4)
		holder()
	case r < 94:
		op.Kind, op.Offset, op.Flags = volfs.KindWrite, rng.Uint64N(200), rng.Uint32N(2)
		op.Data = make([]byte, rng.IntN(100))
		for j := range op.Data {
			op.Data[j] = byte(rng.Uint32())
		}
	case r < 97:
		// FIFOs, sockets and (refused) character devices.
		op.Kind, op.Mode = volfs.KindMknod, []uint32{volfs.ModeFIFO, volfs.ModeSocket, 0o020000}[rng.IntN(3)]|rng.Uint32N(0o1000)
	case r < 98:
		op.Kind, op.Size = volfs.KindSetLimit, rng.Uint64N(2000)
	default:
		// Raises (or repeats) a level now and then: histories begin at
		// LevelBase, where FIFOs and sockets are refused.
		op.Kind, op.Size = volfs.KindSetLevel, rng.Uint64N(uint64(volfs.MaxLevel)+1)
	}
	return op.Encode()
}

// randomOps generates n ops, learning from a scratch FS that applies them.
func randomOps(rng *rand.Rand, n int) [][]byte {
	g := newOpGen(rng)
	fs := volfs.New()
	out := make([][]byte, n)
	for i := range out {
		out[i] = g.next()
		res, _ := fs.Apply([]raftgroup.Entry{{Index: uint64(i + 1), Data: out[i]}})
		g.observe(res[0])
	}
	return out
}

func randomOpsSeed(seed uint64, n int) [][]byte {
	return randomOps(rand.New(rand.NewPCG(seed, seed)), n)
}

func applyOne(t testing.TB, fs *volfs.FS, index uint64, data []byte) []byte {
	t.Helper()
	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(index) * time.Second)
	res, err := fs.Apply([]raftgroup.Entry{{Index: index, Term: 1, Time: at, Data: data}})
	if err != nil {
		t.Fatalf("apply %d: %v", index, err)
	}
	return res[0]
}

// mustApply applies op as entry index and returns its result, which must
// be a success.
func mustApply(t testing.TB, fs *volfs.FS, index uint64, op volfs.Op) volfs.Result {
	t.Helper()
	r, err := volfs.DecodeResult(applyOne(t, fs, index, op.Encode()))
	if err != nil || r.Errno != 0 {
		t.Fatalf("op %d (%v): %v errno %d", index, op.Kind, err, r.Errno)
	}
	return r
}

// TestReplicasAgree applies random op sequences to three FS instances: A
// from the start, B restored from A's snapshot midway, C replaying every
// entry from an empty state in batches. Results and digests must agree.
func TestReplicasAgree(t *testing.T) {
	heldSeen, baseSeen, mknods := 0, 0, map[syscall.Errno]int{}
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, seed*31+7))
		ops := randomOps(rng, 400)
		a, b := volfs.New(), volfs.New()
		mid := rng.IntN(len(ops))
		succeeded := 0
		for i, op := range ops {
			if i == mid {
				snap, err := a.Snapshot()
				if err != nil {
					t.Fatal(err)
				}
				if err := b.Restore(snap); err != nil {
					t.Fatalf("seed %d: restore: %v", seed, err)
				}
			}
			ra := applyOne(t, a, uint64(i+1), op)
			r, _ := volfs.DecodeResult(ra)
			if r.Errno == 0 {
				succeeded++
			}
			if o, _ := volfs.DecodeOp(op); o.Kind == volfs.KindMknod {
				mknods[r.Errno]++
			}
			if i >= mid {
				if rb := applyOne(t, b, uint64(i+1), op); !bytes.Equal(ra, rb) {
					t.Fatalf("seed %d op %d: results differ", seed, i)
				}
			}
			if i%50 == 0 {
				if err := a.CheckInvariants(); err != nil {
					t.Fatalf("seed %d op %d: %v", seed, i, err)
				}
				r, _ := volfs.DecodeResult(must[[]byte](t)(a.Query((&volfs.Op{Kind: volfs.KindStatfs}).Encode())))
				if r.Statfs.Held > 0 {
					heldSeen++
				}
				if r.Statfs.Level == volfs.LevelBase && i > 0 {
					baseSeen++
				}
			}
		}
		c := volfs.New()
		for i := 0; i < len(ops); {
			n := min(1+rng.IntN(10), len(ops)-i)
			ents := make([]raftgroup.Entry, n)
			for j := range ents {
				idx := uint64(i + j + 1)
				ents[j] = raftgroup.Entry{Index: idx, Term: 1, Time: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(idx) * time.Second), Data: ops[i+j]}
			}
			if _, err := c.Apply(ents); err != nil {
				t.Fatal(err)
			}
			i += n
		}
		for _, fs := range []*volfs.FS{a, b, c} {
			if err := fs.CheckInvariants(); err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
		}
		if a.Digest() != b.Digest() || a.Digest() != c.Digest() {
			t.Fatalf("seed %d: digests differ", seed)
		}
		if seed == 0 {
			t.Logf("seed 0: %d of %d ops succeeded", succeeded, len(ops))
		}
		if succeeded < 100 {
			t.Fatalf("seed %d: only %d of %d ops succeeded: the generator is too weak", seed, succeeded, len(ops))
		}
	}
	// Some states must hold open-unlinked files, or their replication
	// went untested.
	t.Logf("%d of %d checkpoints held open-unlinked files, %d after the first were at LevelBase", heldSeen, 40*8, baseSeen)
	if heldSeen == 0 {
		t.Fatal("no checkpoint held an open-unlinked file: the generator is too weak")
	}
	if baseSeen == 0 {
		t.Fatal("no checkpoint but the first was at LevelBase: the levels' difference went untested")
	}
	t.Logf("mknods by errno: %v", mknods)
	if mknods[0] == 0 || mknods[syscall.EPERM] == 0 {
		t.Fatal("no mknod made a FIFO or socket, or none was refused: the levels' difference went untested")
	}
}
