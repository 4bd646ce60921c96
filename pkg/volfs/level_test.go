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
// with the files open (new volds send holders, which old ones do not
// know) and Forgets (which old volds do not know).
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
		holder(volfs.Op{Kind: volfs.KindForget, Flags: volfs.ForgetSession}),                                                  //
		(&volfs.Op{Kind: volfs.KindMkdir, Parent: volfs.RootIno, Name: "dir", Mode: 0o755}).Encode(),                          // ino 5
		(&volfs.Op{Kind: volfs.KindSymlink, Parent: 5, Name: "l", Data: []byte("../d")}).Encode(),                             // ino 6
		(&volfs.Op{Kind: volfs.KindSetLimit, Size: 1 << 20}).Encode(),                                                         //
	}
}

// Applied by the volfs of 956708c, the last before levels, to the
// entries of mixedOps (at index i+1, each at time 2030-01-01 plus i+1
// seconds): the digest of its state, the SHA-256 of its snapshot and each
// entry's errno. A LevelBase volume must apply them alike, or replicas on
// volds of both sides would diverge in a rolling upgrade.
const (
	preLevelsDigest   = "a40e7e5f161bc05a66d2ee150523e0f97d161bdc98de9d213c891d20bd960ede"
	preLevelsSnapshot = "9bc9b1ba720703d31874c4307408159d9bdc8cf9d4d2b4d24c429a79743c562a"
)

var preLevelsErrnos = []syscall.Errno{0, 0, 0, 0, 0, 0, 0, syscall.EINVAL, 0, 0, 0}

func TestLevelBaseAppliesAsBeforeLevels(t *testing.T) {
	fs := volfs.New()
	if fs.Level() != volfs.LevelBase {
		t.Fatalf("a new volume is at level %d, want LevelBase", fs.Level())
	}
	for i, op := range mixedOps() {
		r, err := volfs.DecodeResult(applyOne(t, fs, uint64(i+1), op))
		if err != nil || r.Errno != preLevelsErrnos[i] {
			t.Errorf("entry %d: errno %d (%v), the volfs before levels gave %d", i+1, r.Errno, err, preLevelsErrnos[i])
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
	for _, tc := range []struct{ ask, want uint32 }{{volfs.LevelBase, volfs.LevelBase}, {volfs.LevelHeld, volfs.LevelHeld}, {volfs.LevelBase, volfs.LevelHeld}, {volfs.LevelHeld, volfs.LevelHeld}} {
		got, err := c.SetLevel(ctx, tc.ask)
		if err != nil || got != tc.want || l.FS.Level() != tc.want {
			t.Fatalf("SetLevel(%d): %d, %v (FS at %d), want %d", tc.ask, got, err, l.FS.Level(), tc.want)
		}
	}
	st, err := c.Statfs(ctx)
	if err != nil || st.Level != volfs.LevelHeld {
		t.Fatalf("statfs: %+v, %v", st, err)
	}
}

// TestLevelHeldKeepsFilesTheBaseFrees: the same entries free an open
// file at LevelBase and keep it once raised; snapshots carry the level,
// and a level this code does not know stops the replica.
func TestLevelHeldKeepsFilesTheBaseFrees(t *testing.T) {
	base, held := volfs.New(), volfs.New()
	mustApply(t, held, 1, volfs.Op{Kind: volfs.KindSetLevel, Size: uint64(volfs.LevelHeld)})
	for i, op := range mixedOps()[:7] {
		applyOne(t, base, uint64(i+2), op)
		applyOne(t, held, uint64(i+2), op)
	}
	if base.Held() != 0 || held.Held() != 2 {
		t.Fatalf("held files: %d at LevelBase, %d at LevelHeld; want 0 and 2", base.Held(), held.Held())
	}
	if r, _ := volfs.DecodeResult(applyOne(t, base, 9, mixedOps()[7])); r.Errno != syscall.EINVAL {
		t.Fatalf("Forget at LevelBase: errno %d, want EINVAL", r.Errno)
	}
	mustApply(t, held, 9, volfs.Op{Kind: volfs.KindForget, Node: "n1", Session: "s1", Flags: volfs.ForgetSession})
	if held.Held() != 0 {
		t.Fatalf("%d held after the session's Forget", held.Held())
	}

	// A snapshot says its level, and restores to it.
	x := mustApply(t, held, 10, volfs.Op{Kind: volfs.KindCreate, Parent: volfs.RootIno, Name: "x", Mode: 0o644}).Attr.Ino
	mustApply(t, held, 11, volfs.Op{Kind: volfs.KindUnlink, Parent: volfs.RootIno, Name: "x", Node: "n2", Session: "s9", Open: []uint64{x}})
	snap := must[[]byte](t)(held.Snapshot())
	r := volfs.New()
	if err := r.Restore(snap); err != nil || r.Level() != volfs.LevelHeld || r.Held() != 1 || r.Digest() != held.Digest() {
		t.Fatalf("restored: level %d, %d held, err %v", r.Level(), r.Held(), err)
	}

	// An entry raising the volume past MaxLevel stops the replica: it
	// would apply what follows with semantics it does not have.
	_, err := held.Apply([]raftgroup.Entry{{Index: 12, Data: (&volfs.Op{Kind: volfs.KindSetLevel, Size: uint64(volfs.MaxLevel) + 1}).Encode()}})
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
