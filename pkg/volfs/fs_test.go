package volfs_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	"github.com/shoal-dev/shoal/pkg/volfs"
	"github.com/shoal-dev/shoal/pkg/volfs/volfstest"
)

func newClient(t *testing.T) (*volfs.Client, *volfstest.Local) {
	t.Helper()
	l := volfstest.NewLocal()
	t.Cleanup(func() {
		if err := l.FS.CheckInvariants(); err != nil {
			t.Errorf("invariants: %v", err)
		}
	})
	return &volfs.Client{B: l}, l
}

func must[T any](t *testing.T) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func wantErrno(t *testing.T, what string, err error, want syscall.Errno) {
	t.Helper()
	if want == 0 {
		if err != nil {
			t.Fatalf("%s: %v, want success", what, err)
		}
		return
	}
	var got syscall.Errno
	if !errors.As(err, &got) || got != want {
		t.Fatalf("%s: %v, want %v", what, err, want)
	}
}

// TestErrnos checks every op's errors, one row each, against a small
// tree: /d (dir), /d/f (file, "hello"), /f (file), /e (empty dir), /l
// (symlink to f).
func TestErrnos(t *testing.T) {
	long := strings.Repeat("x", 256)
	type row struct {
		name string
		do   func(c *volfs.Client, ino map[string]uint64) error
		want syscall.Errno
	}
	ctx := context.Background()
	rows := []row{
		{"create excl existing", func(c *volfs.Client, i map[string]uint64) error {
			_, err := c.Create(ctx, volfs.RootIno, "f", 0o644, 0, 0, volfs.CreateExcl)
			return err
		}, syscall.EEXIST},
		{"create existing opens", func(c *volfs.Client, i map[string]uint64) error {
			a, err := c.Create(ctx, volfs.RootIno, "f", 0o644, 0, 0, 0)
			if err == nil && a.Ino != i["f"] {
				return errors.New("other inode")
			}
			return err
		}, 0},
		{"create over dir", func(c *volfs.Client, i map[string]uint64) error {
			_, err := c.Create(ctx, volfs.RootIno, "d", 0o644, 0, 0, 0)
			return err
		}, syscall.EISDIR},
		{"create in missing dir", func(c *volfs.Client, i map[string]uint64) error {
			_, err := c.Create(ctx, 999, "x", 0o644, 0, 0, 0)
			return err
		}, syscall.ENOENT},
		{"create in file", func(c *volfs.Client, i map[string]uint64) error {
			_, err := c.Create(ctx, i["f"], "x", 0o644, 0, 0, 0)
			return err
		}, syscall.ENOTDIR},
		{"create long name", func(c *volfs.Client, i map[string]uint64) error {
			_, err := c.Create(ctx, volfs.RootIno, long, 0o644, 0, 0, 0)
			return err
		}, syscall.ENAMETOOLONG},
		{"create slash", func(c *volfs.Client, i map[string]uint64) error {
			_, err := c.Create(ctx, volfs.RootIno, "a/b", 0o644, 0, 0, 0)
			return err
		}, syscall.EINVAL},
		{"create dotdot", func(c *volfs.Client, i map[string]uint64) error {
			_, err := c.Create(ctx, volfs.RootIno, "..", 0o644, 0, 0, 0)
			return err
		}, syscall.EINVAL},
		{"mkdir existing", func(c *volfs.Client, i map[string]uint64) error {
			_, err := c.Mkdir(ctx, volfs.RootIno, "f", 0o755, 0, 0)
			return err
		}, syscall.EEXIST},
		{"symlink empty target", func(c *volfs.Client, i map[string]uint64) error {
			_, err := c.Symlink(ctx, volfs.RootIno, "s", "", 0, 0)
			return err
		}, syscall.ENOENT},
		{"symlink existing", func(c *volfs.Client, i map[string]uint64) error {
			_, err := c.Symlink(ctx, volfs.RootIno, "d", "x", 0, 0)
			return err
		}, syscall.EEXIST},
		{"readlink of file", func(c *volfs.Client, i map[string]uint64) error {
			_, err := c.Readlink(ctx, i["f"])
			return err
		}, syscall.EINVAL},
		{"link dir", func(c *volfs.Client, i map[string]uint64) error {
			_, err := c.Link(ctx, i["d"], volfs.RootIno, "d2")
			return err
		}, syscall.EPERM},
		{"link onto existing", func(c *volfs.Client, i map[string]uint64) error {
			_, err := c.Link(ctx, i["f"], volfs.RootIno, "e")
			return err
		}, syscall.EEXIST},
		{"link missing", func(c *volfs.Client, i map[string]uint64) error {
			_, err := c.Link(ctx, 999, volfs.RootIno, "x")
			return err
		}, syscall.ENOENT},
		{"unlink dir", func(c *volfs.Client, i map[string]uint64) error {
			return c.Unlink(ctx, volfs.RootIno, "d")
		}, syscall.EISDIR},
		{"unlink missing", func(c *volfs.Client, i map[string]uint64) error {
			return c.Unlink(ctx, volfs.RootIno, "nope")
		}, syscall.ENOENT},
		{"rmdir non-empty", func(c *volfs.Client, i map[string]uint64) error {
			return c.Rmdir(ctx, volfs.RootIno, "d")
		}, syscall.ENOTEMPTY},
		{"rmdir file", func(c *volfs.Client, i map[string]uint64) error {
			return c.Rmdir(ctx, volfs.RootIno, "f")
		}, syscall.ENOTDIR},
		{"rmdir empty", func(c *volfs.Client, i map[string]uint64) error {
			return c.Rmdir(ctx, volfs.RootIno, "e")
		}, 0},
		{"rename missing", func(c *volfs.Client, i map[string]uint64) error {
			return c.Rename(ctx, volfs.RootIno, "nope", volfs.RootIno, "x", 0)
		}, syscall.ENOENT},
		{"rename dir into itself", func(c *volfs.Client, i map[string]uint64) error {
			return c.Rename(ctx, volfs.RootIno, "d", i["d"], "x", 0)
		}, syscall.EINVAL},
		{"rename dir into own subdir", func(c *volfs.Client, i map[string]uint64) error {
			sub, err := c.Mkdir(ctx, i["d"], "sub", 0o755, 0, 0)
			if err != nil {
				return err
			}
			return c.Rename(ctx, volfs.RootIno, "d", sub.Ino, "x", 0)
		}, syscall.EINVAL},
		{"rename dir over file", func(c *volfs.Client, i map[string]uint64) error {
			return c.Rename(ctx, volfs.RootIno, "e", volfs.RootIno, "f", 0)
		}, syscall.ENOTDIR},
		{"rename file over dir", func(c *volfs.Client, i map[string]uint64) error {
			return c.Rename(ctx, volfs.RootIno, "f", volfs.RootIno, "e", 0)
		}, syscall.EISDIR},
		{"rename dir over non-empty dir", func(c *volfs.Client, i map[string]uint64) error {
			return c.Rename(ctx, volfs.RootIno, "e", volfs.RootIno, "d", 0)
		}, syscall.ENOTEMPTY},
		{"rename noreplace", func(c *volfs.Client, i map[string]uint64) error {
			return c.Rename(ctx, volfs.RootIno, "f", volfs.RootIno, "l", volfs.RenameNoReplace)
		}, syscall.EEXIST},
		{"rename exchange missing", func(c *volfs.Client, i map[string]uint64) error {
			return c.Rename(ctx, volfs.RootIno, "f", volfs.RootIno, "nope", volfs.RenameExchange)
		}, syscall.ENOENT},
		{"rename bad flags", func(c *volfs.Client, i map[string]uint64) error {
			return c.Rename(ctx, volfs.RootIno, "f", volfs.RootIno, "x", 8)
		}, syscall.EINVAL},
		{"rename onto own hard link", func(c *volfs.Client, i map[string]uint64) error {
			if _, err := c.Link(ctx, i["f"], volfs.RootIno, "f2"); err != nil {
				return err
			}
			if err := c.Rename(ctx, volfs.RootIno, "f", volfs.RootIno, "f2", 0); err != nil {
				return err
			}
			a, err := c.Lookup(ctx, volfs.RootIno, "f")
			if err == nil && a.Nlink != 2 {
				err = errors.New("nlink changed")
			}
			return err
		}, 0},
		{"truncate dir", func(c *volfs.Client, i map[string]uint64) error {
			_, err := c.Setattr(ctx, i["d"], volfs.SetAttr{Valid: volfs.SetSize})
			return err
		}, syscall.EISDIR},
		{"truncate symlink", func(c *volfs.Client, i map[string]uint64) error {
			_, err := c.Setattr(ctx, i["l"], volfs.SetAttr{Valid: volfs.SetSize})
			return err
		}, syscall.EINVAL},
		{"truncate huge", func(c *volfs.Client, i map[string]uint64) error {
			_, err := c.Setattr(ctx, i["f"], volfs.SetAttr{Valid: volfs.SetSize, Size: 1 << 50})
			return err
		}, syscall.EFBIG},
		{"setattr missing", func(c *volfs.Client, i map[string]uint64) error {
			_, err := c.Setattr(ctx, 999, volfs.SetAttr{Valid: volfs.SetMode})
			return err
		}, syscall.ENOENT},
		{"write dir", func(c *volfs.Client, i map[string]uint64) error {
			_, err := c.Write(ctx, i["d"], 0, []byte("x"), false)
			return err
		}, syscall.EISDIR},
		{"write symlink", func(c *volfs.Client, i map[string]uint64) error {
			_, err := c.Write(ctx, i["l"], 0, []byte("x"), false)
			return err
		}, syscall.EINVAL},
		{"write huge offset", func(c *volfs.Client, i map[string]uint64) error {
			_, err := c.Write(ctx, i["f"], 1<<50, []byte("x"), false)
			return err
		}, syscall.EFBIG},
		{"read dir", func(c *volfs.Client, i map[string]uint64) error {
			_, err := c.Read(ctx, i["d"], 0, 10)
			return err
		}, syscall.EISDIR},
		{"read missing", func(c *volfs.Client, i map[string]uint64) error {
			_, err := c.Read(ctx, 999, 0, 10)
			return err
		}, syscall.ENOENT},
		{"readdir file", func(c *volfs.Client, i map[string]uint64) error {
			_, err := c.Readdir(ctx, i["f"])
			return err
		}, syscall.ENOTDIR},
		{"lookup missing", func(c *volfs.Client, i map[string]uint64) error {
			_, err := c.Lookup(ctx, volfs.RootIno, "nope")
			return err
		}, syscall.ENOENT},
		{"lookup in file", func(c *volfs.Client, i map[string]uint64) error {
			_, err := c.Lookup(ctx, i["f"], "x")
			return err
		}, syscall.ENOTDIR},
		{"getattr missing", func(c *volfs.Client, i map[string]uint64) error {
			_, err := c.GetAttr(ctx, 999)
			return err
		}, syscall.ENOENT},
		{"setlimit negative", func(c *volfs.Client, i map[string]uint64) error {
			return c.SetLimit(ctx, -1)
		}, syscall.EINVAL},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			c, _ := newClient(t)
			ino := map[string]uint64{}
			ino["d"] = must[volfs.Attr](t)(c.Mkdir(ctx, volfs.RootIno, "d", 0o755, 0, 0)).Ino
			ino["d/f"] = must[volfs.Attr](t)(c.Create(ctx, ino["d"], "f", 0o644, 0, 0, volfs.CreateExcl)).Ino
			must[int](t)(c.Write(ctx, ino["d/f"], 0, []byte("hello"), false))
			ino["f"] = must[volfs.Attr](t)(c.Create(ctx, volfs.RootIno, "f", 0o644, 0, 0, volfs.CreateExcl)).Ino
			ino["e"] = must[volfs.Attr](t)(c.Mkdir(ctx, volfs.RootIno, "e", 0o755, 0, 0)).Ino
			ino["l"] = must[volfs.Attr](t)(c.Symlink(ctx, volfs.RootIno, "l", "f", 0, 0)).Ino
			wantErrno(t, r.name, r.do(c, ino), r.want)
		})
	}
}

// TestMalformed checks that garbage and misrouted requests are errors, not
// crashes, and that Apply never fails.
func TestMalformed(t *testing.T) {
	fs := volfs.New()
	q := (&volfs.Op{Kind: volfs.KindGetattr, Ino: 1}).Encode()
	for _, data := range [][]byte{nil, {0xff}, {0x08, 0x00}, q} {
		res, err := fs.Apply([]raftgroup.Entry{{Index: 1, Data: data}})
		if err != nil {
			t.Fatal(err)
		}
		r, err := volfs.DecodeResult(res[0])
		if err != nil || r.Errno != syscall.EINVAL {
			t.Fatalf("apply %x: %v %v", data, r.Errno, err)
		}
	}
	if _, err := fs.Query((&volfs.Op{Kind: volfs.KindMkdir}).Encode()); err == nil {
		t.Fatal("mutation accepted as a query")
	}
	if _, err := fs.Query([]byte{0xff}); err == nil {
		t.Fatal("garbage accepted as a query")
	}
}

func TestFileLifecycle(t *testing.T) {
	ctx := context.Background()
	c, l := newClient(t)
	f := must[volfs.Attr](t)(c.Create(ctx, volfs.RootIno, "a", 0o640, 1000, 100, volfs.CreateExcl))
	if f.Ino != 2 || f.Mode != volfs.ModeRegular|0o640 || f.UID != 1000 || f.GID != 100 || f.Nlink != 1 {
		t.Fatalf("created %+v", f)
	}
	// Writes, a hole, overwrites and appends.
	must[int](t)(c.Write(ctx, f.Ino, 0, []byte("hello"), false))
	must[int](t)(c.Write(ctx, f.Ino, 10, []byte("world"), false))
	must[int](t)(c.Write(ctx, f.Ino, 0, []byte("J"), false))
	must[int](t)(c.Write(ctx, f.Ino, 999, []byte("!"), true))
	got := must[[]byte](t)(c.Read(ctx, f.Ino, 0, 100))
	if want := "Jello\x00\x00\x00\x00\x00world!"; string(got) != want {
		t.Fatalf("read %q, want %q", got, want)
	}
	if got := must[[]byte](t)(c.Read(ctx, f.Ino, 14, 100)); string(got) != "d!" {
		t.Fatalf("tail read %q", got)
	}
	if got := must[[]byte](t)(c.Read(ctx, f.Ino, 100, 10)); len(got) != 0 {
		t.Fatalf("read past end %q", got)
	}
	if l.FS.Used() != 16 {
		t.Fatalf("used %d", l.FS.Used())
	}
	// Truncate down and up: the regrown bytes are zero.
	must[volfs.Attr](t)(c.Setattr(ctx, f.Ino, volfs.SetAttr{Valid: volfs.SetSize, Size: 2}))
	a := must[volfs.Attr](t)(c.Setattr(ctx, f.Ino, volfs.SetAttr{Valid: volfs.SetSize, Size: 4}))
	if a.Size != 4 || string(must[[]byte](t)(c.Read(ctx, f.Ino, 0, 10))) != "Je\x00\x00" {
		t.Fatal("truncate did not zero")
	}
	// Create without O_EXCL opens; with O_TRUNC it truncates.
	a = must[volfs.Attr](t)(c.Create(ctx, volfs.RootIno, "a", 0o600, 0, 0, volfs.CreateTrunc))
	if a.Ino != f.Ino || a.Size != 0 || a.Mode&volfs.ModePerm != 0o640 {
		t.Fatalf("create-open %+v", a)
	}
	// chmod keeps the type; chown; times.
	a = must[volfs.Attr](t)(c.Setattr(ctx, f.Ino, volfs.SetAttr{
		Valid: volfs.SetMode | volfs.SetUID | volfs.SetGID | volfs.SetAtime | volfs.SetMtime,
		Mode:  0o4755, UID: 7, GID: 8, Atime: 11, Mtime: 12,
	}))
	if a.Mode != volfs.ModeRegular|0o4755 || a.UID != 7 || a.GID != 8 || a.Atime != 11 || a.Mtime != 12 || a.Ctime <= 12 {
		t.Fatalf("setattr %+v", a)
	}
	before := a.Ctime
	a = must[volfs.Attr](t)(c.Setattr(ctx, f.Ino, volfs.SetAttr{Valid: volfs.SetMtimeNow}))
	if a.Mtime != a.Ctime || a.Mtime <= before {
		t.Fatalf("mtime now %+v", a)
	}
	// Hard link, unlink one name, data stays; the last name frees it.
	must[volfs.Attr](t)(c.Link(ctx, f.Ino, volfs.RootIno, "b"))
	wantErrno(t, "unlink a", c.Unlink(ctx, volfs.RootIno, "a"), 0)
	must[int](t)(c.Write(ctx, f.Ino, 0, []byte("xy"), false))
	if a := must[volfs.Attr](t)(c.Lookup(ctx, volfs.RootIno, "b")); a.Nlink != 1 || a.Size != 2 {
		t.Fatalf("after unlink %+v", a)
	}
	wantErrno(t, "unlink b", c.Unlink(ctx, volfs.RootIno, "b"), 0)
	_, err := c.GetAttr(ctx, f.Ino)
	wantErrno(t, "getattr freed", err, syscall.ENOENT)
	if l.FS.Used() != 0 {
		t.Fatalf("used %d after unlink", l.FS.Used())
	}
	// Inode numbers are never reused.
	if a := must[volfs.Attr](t)(c.Create(ctx, volfs.RootIno, "a", 0o644, 0, 0, 0)); a.Ino != 3 {
		t.Fatalf("new inode %d", a.Ino)
	}
}

func TestDirectoriesAndRename(t *testing.T) {
	ctx := context.Background()
	c, _ := newClient(t)
	d1 := must[volfs.Attr](t)(c.Mkdir(ctx, volfs.RootIno, "d1", 0o755, 0, 0))
	d2 := must[volfs.Attr](t)(c.Mkdir(ctx, volfs.RootIno, "d2", 0o2775, 0, 50))
	sub := must[volfs.Attr](t)(c.Mkdir(ctx, d1.Ino, "sub", 0o700, 0, 0))
	if root := must[volfs.Attr](t)(c.GetAttr(ctx, volfs.RootIno)); root.Nlink != 4 {
		t.Fatalf("root nlink %d", root.Nlink)
	}
	// setgid directory: group and bit inherited.
	inh := must[volfs.Attr](t)(c.Mkdir(ctx, d2.Ino, "inh", 0o755, 1, 1))
	if inh.GID != 50 || inh.Mode&volfs.ModeSetgid == 0 {
		t.Fatalf("setgid not inherited: %+v", inh)
	}
	// Move sub from d1 to d2: link counts follow.
	wantErrno(t, "rename", c.Rename(ctx, d1.Ino, "sub", d2.Ino, "moved", 0), 0)
	if a := must[volfs.Attr](t)(c.GetAttr(ctx, d1.Ino)); a.Nlink != 2 {
		t.Fatalf("d1 nlink %d", a.Nlink)
	}
	if a := must[volfs.Attr](t)(c.GetAttr(ctx, d2.Ino)); a.Nlink != 4 {
		t.Fatalf("d2 nlink %d", a.Nlink)
	}
	if a := must[volfs.Attr](t)(c.Lookup(ctx, d2.Ino, "moved")); a.Ino != sub.Ino {
		t.Fatal("moved dir lost")
	}
	if a := must[volfs.Attr](t)(c.Lookup(ctx, sub.Ino, "..")); a.Ino != d2.Ino {
		t.Fatal(".. not updated")
	}
	// Replace an empty directory.
	wantErrno(t, "replace empty dir", c.Rename(ctx, d2.Ino, "moved", d2.Ino, "inh", 0), 0)
	if _, err := c.GetAttr(ctx, inh.Ino); !errors.Is(err, syscall.ENOENT) {
		t.Fatal("replaced dir still exists")
	}
	// Replace a file: the old target is freed.
	x := must[volfs.Attr](t)(c.Create(ctx, volfs.RootIno, "x", 0o644, 0, 0, 0))
	y := must[volfs.Attr](t)(c.Create(ctx, volfs.RootIno, "y", 0o644, 0, 0, 0))
	must[int](t)(c.Write(ctx, y.Ino, 0, []byte("yyy"), false))
	wantErrno(t, "replace file", c.Rename(ctx, volfs.RootIno, "x", volfs.RootIno, "y", 0), 0)
	if a := must[volfs.Attr](t)(c.Lookup(ctx, volfs.RootIno, "y")); a.Ino != x.Ino {
		t.Fatal("rename did not replace")
	}
	if st := must[volfs.Statfs](t)(c.Statfs(ctx)); st.Used != 0 {
		t.Fatalf("replaced file's data still counted: %d", st.Used)
	}
	// Exchange a file and a directory across directories.
	wantErrno(t, "exchange", c.Rename(ctx, volfs.RootIno, "y", d2.Ino, "inh", volfs.RenameExchange), 0)
	if a := must[volfs.Attr](t)(c.Lookup(ctx, volfs.RootIno, "y")); a.Ino != sub.Ino {
		t.Fatal("exchange: y is not the dir")
	}
	if a := must[volfs.Attr](t)(c.Lookup(ctx, d2.Ino, "inh")); a.Ino != x.Ino {
		t.Fatal("exchange: inh is not the file")
	}
	// Readdir in order, across pages.
	for i := range 2500 {
		must[volfs.Attr](t)(c.Create(ctx, d1.Ino, fmt.Sprintf("%s%c%04d", strings.Repeat("n", 1+i%7), 'a'+i%26, i), 0o644, 0, 0, 0))
	}
	ents := must[[]volfs.DirEntry](t)(c.Readdir(ctx, d1.Ino))
	if len(ents) != 2500 {
		t.Fatalf("readdir %d entries", len(ents))
	}
	for i := 1; i < len(ents); i++ {
		if ents[i-1].Name >= ents[i].Name {
			t.Fatalf("readdir out of order at %d", i)
		}
	}
	root := must[[]volfs.DirEntry](t)(c.Readdir(ctx, volfs.RootIno))
	if len(root) != 3 || root[0].Name != "d1" || root[0].Mode&volfs.ModeType != volfs.ModeDir {
		t.Fatalf("root listing %+v", root)
	}
}

func TestSymlink(t *testing.T) {
	ctx := context.Background()
	c, _ := newClient(t)
	l := must[volfs.Attr](t)(c.Symlink(ctx, volfs.RootIno, "l", "../some/where", 5, 6))
	if !l.IsSymlink() || l.Size != 13 || l.UID != 5 {
		t.Fatalf("symlink %+v", l)
	}
	if got := must[string](t)(c.Readlink(ctx, l.Ino)); got != "../some/where" {
		t.Fatalf("readlink %q", got)
	}
}

func TestLimit(t *testing.T) {
	ctx := context.Background()
	c, l := newClient(t)
	wantErrno(t, "setlimit", c.SetLimit(ctx, 100), 0)
	f := must[volfs.Attr](t)(c.Create(ctx, volfs.RootIno, "f", 0o644, 0, 0, 0))
	must[int](t)(c.Write(ctx, f.Ino, 0, make([]byte, 60), false))
	g := must[volfs.Attr](t)(c.Create(ctx, volfs.RootIno, "g", 0o644, 0, 0, 0))
	_, err := c.Write(ctx, g.Ino, 0, make([]byte, 41), false)
	wantErrno(t, "write over limit", err, syscall.ENOSPC)
	must[int](t)(c.Write(ctx, g.Ino, 0, make([]byte, 40), false))
	// Overwriting in place needs no room.
	must[int](t)(c.Write(ctx, g.Ino, 0, make([]byte, 40), false))
	_, err = c.Setattr(ctx, f.Ino, volfs.SetAttr{Valid: volfs.SetSize, Size: 61})
	wantErrno(t, "truncate over limit", err, syscall.ENOSPC)
	st := must[volfs.Statfs](t)(c.Statfs(ctx))
	if st.Limit != 100 || st.Used != 100 || st.Inodes != 3 || l.FS.Used() != 100 {
		t.Fatalf("statfs %+v", st)
	}
	// Freeing space makes room; lifting the limit removes it.
	wantErrno(t, "unlink", c.Unlink(ctx, volfs.RootIno, "f"), 0)
	must[int](t)(c.Write(ctx, g.Ino, 40, make([]byte, 60), false))
	wantErrno(t, "unlimit", c.SetLimit(ctx, 0), 0)
	must[int](t)(c.Write(ctx, g.Ino, 100, make([]byte, 1000), false))
}

// TestLargeIO checks that Client splits writes and reads into chunks.
func TestLargeIO(t *testing.T) {
	ctx := context.Background()
	c, _ := newClient(t)
	f := must[volfs.Attr](t)(c.Create(ctx, volfs.RootIno, "big", 0o644, 0, 0, 0))
	data := make([]byte, 2*volfs.MaxReadChunk+12345)
	for i := range data {
		data[i] = byte(i * 7)
	}
	if n := must[int](t)(c.Write(ctx, f.Ino, 3, data, false)); n != len(data) {
		t.Fatalf("wrote %d", n)
	}
	got := must[[]byte](t)(c.Read(ctx, f.Ino, 3, len(data)+100))
	if !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes, differ", len(got))
	}
}

// TestSnapshotRoundTrip checks that a restored FS is identical (same
// digest, same snapshot bytes) and that Restore refuses garbage without
// touching the state.
func TestSnapshotRoundTrip(t *testing.T) {
	ctx := context.Background()
	c, l := newClient(t)
	d := must[volfs.Attr](t)(c.Mkdir(ctx, volfs.RootIno, "d", 0o755, 0, 0))
	f := must[volfs.Attr](t)(c.Create(ctx, d.Ino, "f", 0o644, 0, 0, 0))
	must[int](t)(c.Write(ctx, f.Ino, 0, []byte("data"), false))
	must[volfs.Attr](t)(c.Symlink(ctx, volfs.RootIno, "l", "d/f", 0, 0))
	must[volfs.Attr](t)(c.Link(ctx, f.Ino, volfs.RootIno, "hard"))
	wantErrno(t, "limit", c.SetLimit(ctx, 1<<20), 0)
	snap := must[[]byte](t)(l.FS.Snapshot())
	fs2 := volfs.New()
	if err := fs2.Restore(snap); err != nil {
		t.Fatal(err)
	}
	if fs2.Digest() != l.FS.Digest() || fs2.Used() != 4 || fs2.Applied() != l.FS.Applied() {
		t.Fatal("restored state differs")
	}
	if snap2 := must[[]byte](t)(fs2.Snapshot()); !bytes.Equal(snap, snap2) {
		t.Fatal("snapshot not deterministic")
	}
	// WriteSnapshot writes the same bytes, and reports its writer's error.
	var written bytes.Buffer
	if err := l.FS.WriteSnapshot(&written); err != nil || !bytes.Equal(written.Bytes(), snap) {
		t.Fatalf("WriteSnapshot: %v, %d bytes, equal to Snapshot's %v", err, written.Len(), bytes.Equal(written.Bytes(), snap))
	}
	if err := l.FS.WriteSnapshot(failingWriter{}); !errors.Is(err, errWriteFailed) {
		t.Fatalf("WriteSnapshot to a failing writer: %v", err)
	}
	if err := fs2.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	before := fs2.Digest()
	for _, bad := range [][]byte{{0xff}, snap[:len(snap)/2]} {
		if err := fs2.Restore(bad); err == nil {
			t.Fatalf("restore of %d garbage bytes succeeded", len(bad))
		}
	}
	if fs2.Digest() != before {
		t.Fatal("failed restore changed the state")
	}
	if volfs.New().Digest() == before {
		t.Fatal("digest ignores content")
	}
}

var errWriteFailed = errors.New("write failed")

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errWriteFailed }

// TestTimesFromEntries checks that times come from the entry, not the
// local clock.
func TestTimesFromEntries(t *testing.T) {
	fs := volfs.New()
	at := time.Date(2031, 2, 3, 4, 5, 6, 7, time.UTC)
	op := (&volfs.Op{Kind: volfs.KindMkdir, Parent: volfs.RootIno, Name: "d", Mode: 0o755}).Encode()
	res, err := fs.Apply([]raftgroup.Entry{{Index: 1, Time: at, Data: op}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := volfs.DecodeResult(res[0])
	if err != nil || r.Attr == nil {
		t.Fatal(r, err)
	}
	if r.Attr.Mtime != at.UnixNano() || r.Attr.Ctime != at.UnixNano() || r.Attr.Atime != at.UnixNano() {
		t.Fatalf("times %+v", r.Attr)
	}
}
