package volfs_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"syscall"
	"testing"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	"github.com/shoal-dev/shoal/pkg/volfs"
	"github.com/shoal-dev/shoal/pkg/volfs/volfstest"
)

// mixedOps are entries that a volume's log can hold while its replicas
// run volds of both sides of levels: unlinks and renames from a mount
// with the files open, Forgets, and a Mknod (which volds before levels
// do not know).
func mixedOps() [][]byte {
	holder := func(op volfs.Op, open ...uint64) []byte {
		op.Node, op.Session, op.Open = "n1", "s1", open
		return op.Encode()
	}
	return [][]byte{
		(&volfs.Op{Kind: volfs.KindCreate, Parent: volfs.RootIno, Name: "a", Mode: 0o644}).Encode(),                           // ino 2
		(&volfs.Op{Kind: volfs.KindWrite, Ino: 2, Data: []byte("hello")}).Encode(),                                            //
		(&volfs.Op{Kind: volfs.KindCreate, Parent: volfs.RootIno, Name: "b", Mode: 0o600, UID: 7}).Encode(),                   // ino 3
		(&volfs.Op{Kind: volfs.KindCreate, Parent: volfs.RootIno, Name: "d", Mode: 0o600}).Encode(),                           // ino 4
		(&volfs.Op{Kind: volfs.KindWrite, Ino: 4, Offset: 3, Data: []byte("replaced")}).Encode(),                              //
		holder(volfs.Op{Kind: volfs.KindUnlink, Parent: volfs.RootIno, Name: "a"}, 2),                                         // open, unlinked
		holder(volfs.Op{Kind: volfs.KindRename, Parent: volfs.RootIno, Name: "b", NewParent: volfs.RootIno, NewName: "d"}, 4), // open, replaced
		holder(volfs.Op{Kind: volfs.KindForget, Ino: 2}),                                                                      //
		(&volfs.Op{Kind: volfs.KindMkdir, Parent: volfs.RootIno, Name: "dir", Mode: 0o755}).Encode(),                          // ino 5
		(&volfs.Op{Kind: volfs.KindSymlink, Parent: 5, Name: "l", Data: []byte("../d")}).Encode(),                             // ino 6
		(&volfs.Op{Kind: volfs.KindSetLimit, Size: 1 << 20}).Encode(),                                                         //
		(&volfs.Op{Kind: volfs.KindMknod, Parent: volfs.RootIno, Name: "fifo", Mode: volfs.ModeFIFO | 0o644}).Encode(),        // refused
	}
}

// Applied by the volfs of 3fcf164, the last before levels, to the
// entries of mixedOps (at index i+1, each at time 2030-01-01 plus i+1
// seconds): the digest of its state, the SHA-256 of its snapshot and each
// entry's errno. A LevelBase volume must apply them alike, or replicas on
// volds of both sides would diverge in a rolling upgrade.
const (
	preLevelsDigest   = "39bae5d1127ef4a6690fa2b69be5d4d0db98f4829426ee07339fa5cf36dd846b"
	preLevelsSnapshot = "24acc969fa1f903e033838eca0655fe4834955a0947e3a6ec2c341b03e6a7e30"
)

var preLevelsErrnos = []syscall.Errno{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, syscall.EINVAL}

func TestLevelBaseAppliesAsBeforeLevels(t *testing.T) {
	fs := volfs.New()
	if fs.Level() != volfs.LevelBase {
		t.Fatalf("a new volume is at level %d, want LevelBase", fs.Level())
	}
	for i, op := range mixedOps() {
		want := preLevelsErrnos[i]
		if o, _ := volfs.DecodeOp(op); o.Kind == volfs.KindMknod {
			// Unknown there (EINVAL), refused here: results are the
			// proposer's alone, only the state must agree.
			want = syscall.EPERM
		}
		r, err := volfs.DecodeResult(applyOne(t, fs, uint64(i+1), op))
		if err != nil || r.Errno != want {
			t.Errorf("entry %d: errno %d (%v), want %d", i+1, r.Errno, err, want)
		}
	}
	d := fs.Digest()
	snap, err := fs.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(snap)
	if hex.EncodeToString(d[:]) != preLevelsDigest || hex.EncodeToString(s[:]) != preLevelsSnapshot {
		t.Fatalf("LevelBase state: digest %x, snapshot's hash %x; the volfs before levels had %s and %s", d, s, preLevelsDigest, preLevelsSnapshot)
	}
}

func TestSetLevelRaisesOnlyUp(t *testing.T) {
	l := &volfstest.Local{FS: volfs.New()}
	c := &volfs.Client{B: l}
	ctx := context.Background()
	if _, err := c.SetLevel(ctx, 0); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("SetLevel(0): %v, want EINVAL", err)
	}
	for _, tc := range []struct{ ask, want uint32 }{{volfs.LevelBase, volfs.LevelBase}, {volfs.LevelSpecial, volfs.LevelSpecial}, {volfs.LevelBase, volfs.LevelSpecial}, {volfs.LevelSpecial, volfs.LevelSpecial}} {
		got, err := c.SetLevel(ctx, tc.ask)
		if err != nil || got != tc.want || l.FS.Level() != tc.want {
			t.Fatalf("SetLevel(%d): %d, %v (FS at %d), want %d", tc.ask, got, err, l.FS.Level(), tc.want)
		}
	}
	st, err := c.Statfs(ctx)
	if err != nil || st.Level != volfs.LevelSpecial {
		t.Fatalf("statfs: %+v, %v", st, err)
	}
}

// TestLevelSpecialMakesFIFOsAndSockets: the same Mknod entries are
// refused at LevelBase and make FIFOs and sockets once raised; snapshots
// carry the level, and a level this code does not know stops the
// replica.
func TestLevelSpecialMakesFIFOsAndSockets(t *testing.T) {
	base, special := volfs.New(), volfs.New()
	mustApply(t, special, 1, volfs.Op{Kind: volfs.KindSetLevel, Size: uint64(volfs.LevelSpecial)})
	mknod := func(name string, mode uint32) []byte {
		return (&volfs.Op{Kind: volfs.KindMknod, Parent: volfs.RootIno, Name: name, Mode: mode, UID: 5}).Encode()
	}
	for i, tc := range []struct {
		name string
		mode uint32
		ok   bool
	}{{"fifo", volfs.ModeFIFO | 0o640, true}, {"sock", volfs.ModeSocket | 0o755, true}, {"chr", 0o020000 | 0o600, false}, {"reg", volfs.ModeRegular | 0o600, false}} {
		if r, _ := volfs.DecodeResult(applyOne(t, base, uint64(i+2), mknod(tc.name, tc.mode))); r.Errno != syscall.EPERM {
			t.Errorf("mknod %s at LevelBase: errno %d, want EPERM", tc.name, r.Errno)
		}
		r, _ := volfs.DecodeResult(applyOne(t, special, uint64(i+2), mknod(tc.name, tc.mode)))
		switch {
		case tc.ok && (r.Errno != 0 || r.Attr == nil || r.Attr.Mode != tc.mode || r.Attr.UID != 5 || r.Attr.Size != 0):
			t.Errorf("mknod %s at LevelSpecial: %+v", tc.name, r)
		case !tc.ok && r.Errno != syscall.EPERM:
			t.Errorf("mknod %s (no FIFO or socket) at LevelSpecial: errno %d, want EPERM", tc.name, r.Errno)
		}
	}
	if base.Digest() != volfs.New().Digest() {
		t.Error("refused mknods changed a LevelBase volume")
	}
	fifo := must[[]byte](t)(special.Query((&volfs.Op{Kind: volfs.KindLookup, Parent: volfs.RootIno, Name: "fifo"}).Encode()))
	r, _ := volfs.DecodeResult(fifo)
	for _, op := range []volfs.Op{{Kind: volfs.KindWrite, Ino: r.Attr.Ino, Data: []byte("x")}, {Kind: volfs.KindSetattr, Ino: r.Attr.Ino, Valid: volfs.SetSize, Size: 1}} {
		if res, _ := volfs.DecodeResult(applyOne(t, special, 9, op.Encode())); res.Errno != syscall.EINVAL {
			t.Errorf("%v of a FIFO: errno %d, want EINVAL", op.Kind, res.Errno)
		}
	}

	// A snapshot says its level, and restores to it; one of LevelBase
	// cannot hold a FIFO.
	snap := must[[]byte](t)(special.Snapshot())
	restored := volfs.New()
	if err := restored.Restore(snap); err != nil || restored.Level() != volfs.LevelSpecial || restored.Digest() != special.Digest() {
		t.Fatalf("restored: level %d, err %v", restored.Level(), err)
	}
	snap[1] = byte(volfs.LevelBase)
	if err := volfs.New().Restore(snap); !errors.Is(err, volfs.ErrMalformed) {
		t.Fatalf("a LevelBase snapshot with a FIFO restored: %v", err)
	}

	// An entry raising the volume past MaxLevel stops the replica: it
	// would apply what follows with semantics it does not have.
	_, err := special.Apply([]raftgroup.Entry{{Index: 12, Data: (&volfs.Op{Kind: volfs.KindSetLevel, Size: uint64(volfs.MaxLevel) + 1}).Encode()}})
	if !errors.Is(err, volfs.ErrLevel) {
		t.Fatalf("applying a level above MaxLevel: %v, want ErrLevel", err)
	}
}

func TestRestoreRefusesAnUnknownLevel(t *testing.T) {
	snap := must[[]byte](t)(volfs.New().Snapshot())
	if snap[0] != 0x08 || snap[1] != byte(volfs.LevelBase) {
		t.Fatalf("a snapshot begins % x, not with its level", snap[:2])
	}
	snap[1] = byte(volfs.MaxLevel) + 1
	if err := volfs.New().Restore(snap); !errors.Is(err, volfs.ErrLevel) {
		t.Fatalf("restoring a snapshot of level %d: %v, want ErrLevel", snap[1], err)
	}
}
