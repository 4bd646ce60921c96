package volfs_test

import (
	"bytes"
	"context"
	"syscall"
	"testing"

	"github.com/shoal-dev/shoal/pkg/volfs"
)

// TestOpenUnlinkedFilesAreHeld checks the life of a file unlinked while a
// mount has it open: it keeps its data and inode number without a name,
// counts in the volume's usage, survives a snapshot, and goes with the
// holder's Forget, and only with the holder's.
func TestOpenUnlinkedFilesAreHeld(t *testing.T) {
	ctx := context.Background()
	c, l := newClient(t)
	statfs := func() volfs.Statfs { return must[volfs.Statfs](t)(c.Statfs(ctx)) }
	file := func(name, data string) volfs.Attr {
		a := must[volfs.Attr](t)(c.Create(ctx, volfs.RootIno, name, 0o644, 0, 0, 0))
		must[int](t)(c.Write(ctx, a.Ino, 0, []byte(data), false))
		return a
	}
	a, b := volfs.Holder{Node: "n1", Session: "s1"}, volfs.Holder{Node: "n2", Session: "s2"}

	// Unlinked by a mount without it open: freed at once.
	gone := file("gone", "12345")
	a.Open = []uint64{volfs.RootIno}
	if held, err := c.UnlinkHolding(ctx, volfs.RootIno, "gone", a); err != nil || held != 0 {
		t.Fatalf("unlink of a file not open: held %d, %v", held, err)
	}
	_, err := c.GetAttr(ctx, gone.Ino)
	wantErrno(t, "getattr of a freed file", err, syscall.ENOENT)
	if st := statfs(); st.Used != 0 || st.Held != 0 {
		t.Fatalf("after freeing: %+v", st)
	}

	// Unlinked by the mount that has it open: held.
	f := file("f", "hello")
	a.Open = []uint64{f.Ino}
	if held, err := c.UnlinkHolding(ctx, volfs.RootIno, "f", a); err != nil || held != f.Ino {
		t.Fatalf("unlink of an open file: held %d, %v; want %d", held, err, f.Ino)
	}
	_, err = c.Lookup(ctx, volfs.RootIno, "f")
	wantErrno(t, "lookup of the unlinked name", err, syscall.ENOENT)
	if got := must[volfs.Attr](t)(c.GetAttr(ctx, f.Ino)); got.Nlink != 0 || got.Size != 5 {
		t.Fatalf("held file: %+v, want nlink 0 and size 5", got)
	}
	must[int](t)(c.Write(ctx, f.Ino, 5, []byte(" world"), false))
	if got := must[[]byte](t)(c.Read(ctx, f.Ino, 0, 64)); string(got) != "hello world" {
		t.Fatalf("held file reads %q", got)
	}
	_, err = c.Link(ctx, f.Ino, volfs.RootIno, "back")
	wantErrno(t, "link of a held file", err, syscall.ENOENT)
	if st := statfs(); st.Used != 11 || st.Held != 1 {
		t.Fatalf("with one held file: %+v, want 11 bytes used and 1 held", st)
	}

	// The state with a held file replicates through a snapshot.
	snap := must[[]byte](t)(l.FS.Snapshot())
	restored := volfs.New()
	if err := restored.Restore(snap); err != nil {
		t.Fatal(err)
	}
	if restored.Digest() != l.FS.Digest() {
		t.Fatal("the restored state differs")
	}
	if err := restored.CheckInvariants(); err != nil {
		t.Fatal(err)
	}

	// Another session's forgets leave it; the holder's frees it.
	wantErrno(t, "forget by another session", c.Forget(ctx, b, f.Ino), 0)
	wantErrno(t, "forget of another node's sessions", c.ForgetOthers(ctx, b), 0)
	wantErrno(t, "forget of the same node's other sessions", c.ForgetOthers(ctx, a), 0)
	if st := statfs(); st.Held != 1 {
		t.Fatalf("others' forgets freed the file: %+v", st)
	}
	wantErrno(t, "forget by the holder", c.Forget(ctx, a, f.Ino), 0)
	_, err = c.GetAttr(ctx, f.Ino)
	wantErrno(t, "getattr of a forgotten file", err, syscall.ENOENT)
	if st := statfs(); st.Used != 0 || st.Held != 0 {
		t.Fatalf("after the forget: %+v", st)
	}

	// A rename over an open file holds the target; a hard link keeps a
	// file alive without holding it.
	old := file("target", "old")
	repl := file("new", "new!")
	linked := file("linked", "x")
	must[volfs.Attr](t)(c.Link(ctx, linked.Ino, volfs.RootIno, "linked2"))
	b.Open = []uint64{old.Ino, linked.Ino}
	if held, err := c.RenameHolding(ctx, volfs.RootIno, "new", volfs.RootIno, "target", 0, b); err != nil || held != old.Ino {
		t.Fatalf("rename over an open file: held %d, %v; want %d", held, err, old.Ino)
	}
	if held, err := c.UnlinkHolding(ctx, volfs.RootIno, "linked", b); err != nil || held != 0 {
		t.Fatalf("unlink of one of two names: held %d, %v", held, err)
	}
	if got := must[[]byte](t)(c.Read(ctx, old.Ino, 0, 64)); !bytes.Equal(got, []byte("old")) {
		t.Fatalf("the replaced file reads %q", got)
	}
	if got := must[volfs.Attr](t)(c.Lookup(ctx, volfs.RootIno, "target")); got.Ino != repl.Ino {
		t.Fatalf("target is inode %d, want %d", got.Ino, repl.Ino)
	}
	if st := statfs(); st.Held != 1 {
		t.Fatalf("after the rename: %+v, want 1 held", st)
	}

	// Sessions end: ForgetSession frees what one session holds,
	// ForgetOthers what a node's other sessions hold.
	b2 := volfs.Holder{Node: "n2", Session: "s3", Open: []uint64{repl.Ino}}
	must[uint64](t)(c.UnlinkHolding(ctx, volfs.RootIno, "target", b2))
	a.Open = []uint64{linked.Ino}
	must[uint64](t)(c.UnlinkHolding(ctx, volfs.RootIno, "linked2", a))
	if st := statfs(); st.Held != 3 {
		t.Fatalf("three held files: %+v", st)
	}
	wantErrno(t, "forget session s2", c.ForgetSession(ctx, b), 0)
	if _, err := c.GetAttr(ctx, old.Ino); err == nil {
		t.Fatal("the ended session's file is still there")
	}
	wantErrno(t, "n2 mounts afresh as s4", c.ForgetOthers(ctx, volfs.Holder{Node: "n2", Session: "s4"}), 0)
	if _, err := c.GetAttr(ctx, repl.Ino); err == nil {
		t.Fatal("the node's earlier session's file is still there")
	}
	if st := statfs(); st.Held != 1 || st.Used != 1 {
		t.Fatalf("after n2's forgets: %+v, want n1's one held byte", st)
	}
	wantErrno(t, "forget without a session", c.ForgetSession(ctx, volfs.Holder{Node: "n1"}), syscall.EINVAL)
	wantErrno(t, "forget of a file without a session", c.Forget(ctx, volfs.Holder{Node: "n1"}, linked.Ino), syscall.EINVAL)

	// A node gone for good: ForgetOthers naming no session frees all it
	// holds, and nothing of other nodes'.
	more := file("more", "ab")
	must[uint64](t)(c.UnlinkHolding(ctx, volfs.RootIno, "more", volfs.Holder{Node: "n2", Session: "s5", Open: []uint64{more.Ino}}))
	wantErrno(t, "forget all of n1", c.ForgetOthers(ctx, volfs.Holder{Node: "n1"}), 0)
	if st := statfs(); st.Held != 1 || st.Used != 2 {
		t.Fatalf("after n1's files went: %+v, want n2's one held file of 2 bytes", st)
	}
}
