package volfuse_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/volfs"
	"github.com/shoal-dev/shoal/pkg/volfs/volfstest"
	"github.com/shoal-dev/shoal/pkg/volfuse"
)

// statfsEventually waits (bounded) until the volume's held files and
// used bytes are as wanted: the kernel sends RELEASE after close(2) has
// returned, so the last close's forget lands a moment later.
func statfsEventually(t *testing.T, c *volfs.Client, held uint64, used int64) {
	t.Helper()
	var st volfs.Statfs
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		var err error
		if st, err = c.Statfs(context.Background()); err != nil {
			t.Fatal(err)
		}
		if st.Held == held && st.Used == used {
			return
		}
	}
	t.Fatalf("volume has %d held files and %d bytes used, want %d and %d", st.Held, st.Used, held, used)
}

// TestOpenUnlinkedFileLivesUntilClosed checks POSIX's open-unlinked
// files through a real mount: a file unlinked, or replaced by a rename,
// while a process has it open stays readable and writable through its
// descriptors until the last of them closes, and then its space is freed.
func TestOpenUnlinkedFileLivesUntilClosed(t *testing.T) {
	needFUSE(t)
	c := &volfs.Client{B: volfstest.NewLocal()}
	dir, _ := mount(t, c)
	p := filepath.Join(dir, "f")
	check(t, os.WriteFile(p, []byte("hello"), 0o644))
	f1, err := os.OpenFile(p, os.O_RDWR, 0)
	check(t, err)
	f2, err := os.Open(p)
	check(t, err)
	// Closed before the unmount, which would wait for them otherwise.
	t.Cleanup(func() { f1.Close(); f2.Close() })

	check(t, os.Remove(p))
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Fatalf("stat of the removed name: %v", err)
	}
	_, err = f1.WriteAt([]byte(" world"), 5)
	check(t, err)
	got := make([]byte, 64)
	n, err := f2.ReadAt(got, 0)
	if err != nil && err != io.EOF || string(got[:n]) != "hello world" {
		t.Fatalf("the unlinked file reads %q, %v", got[:n], err)
	}
	var st syscall.Stat_t
	check(t, syscall.Fstat(int(f1.Fd()), &st))
	if st.Nlink != 0 || st.Size != 11 {
		t.Fatalf("fstat of the unlinked file: nlink %d size %d, want 0 and 11", st.Nlink, st.Size)
	}
	statfsEventually(t, c, 1, 11)

	check(t, f1.Close())
	if n, err := f2.ReadAt(got, 0); string(got[:n]) != "hello world" {
		t.Fatalf("after the first close the file reads %q, %v", got[:n], err)
	}
	statfsEventually(t, c, 1, 11)
	check(t, f2.Close())
	statfsEventually(t, c, 0, 0)

	// A rename over an open file keeps the old file for its reader.
	check(t, os.WriteFile(p, []byte("old"), 0o644))
	old, err := os.Open(p)
	check(t, err)
	t.Cleanup(func() { old.Close() })
	check(t, os.WriteFile(p+".new", []byte("new!"), 0o644))
	check(t, os.Rename(p+".new", p))
	if b, err := io.ReadAll(old); err != nil || string(b) != "old" {
		t.Fatalf("the replaced file reads %q, %v", b, err)
	}
	if s := readFile(t, p); s != "new!" {
		t.Fatalf("the new file reads %q", s)
	}
	statfsEventually(t, c, 1, 7)
	check(t, old.Close())
	statfsEventually(t, c, 0, 4)

	// A file nobody has open goes at once.
	check(t, os.Remove(p))
	statfsEventually(t, c, 0, 0)

	// With more files open than an unlink carries, it looks the name up
	// and carries its inode alone: the open file is still kept, another
	// still freed.
	var many []*os.File
	t.Cleanup(func() {
		for _, f := range many {
			f.Close()
		}
	})
	for i := range 70 {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("many%02d", i)))
		check(t, err)
		many = append(many, f)
	}
	check(t, os.WriteFile(p, []byte("shut"), 0o644))
	_, err = many[7].Write([]byte("open"))
	check(t, err)
	check(t, os.Remove(p))
	check(t, os.Remove(filepath.Join(dir, "many07")))
	statfsEventually(t, c, 1, 4)
	if n, err := many[7].ReadAt(got, 0); string(got[:n]) != "open" {
		t.Fatalf("with 70 files open, the unlinked one reads %q, %v", got[:n], err)
	}
	check(t, many[7].Close())
	statfsEventually(t, c, 0, 0)
}

// TestNewMountFreesItsNodesEarlierHolds checks the sweeps: a mount made
// afresh frees what its node's earlier sessions held (their processes
// are gone), not what other nodes hold; an unmount frees what its own
// session held.
func TestNewMountFreesItsNodesEarlierHolds(t *testing.T) {
	needFUSE(t)
	ctx := context.Background()
	c := &volfs.Client{B: volfstest.NewLocal()}
	hold := func(name string, h volfs.Holder) {
		a, err := c.Create(ctx, volfs.RootIno, name, 0o644, 0, 0, 0)
		check(t, err)
		_, err = c.Write(ctx, a.Ino, 0, []byte("x"), false)
		check(t, err)
		h.Open = []uint64{a.Ino}
		if held, err := c.UnlinkHolding(ctx, volfs.RootIno, name, h); err != nil || held != a.Ino {
			t.Fatalf("hold %s: %d, %v", name, held, err)
		}
	}
	hold("earlier", volfs.Holder{Node: "n1", Session: "gone"})
	hold("other", volfs.Holder{Node: "n2", Session: "live"})
	statfsEventually(t, c, 2, 2)

	dir := t.TempDir()
	srv, err := volfuse.Mount(dir, c, volfuse.Options{Node: "n1"})
	check(t, err)
	statfsEventually(t, c, 1, 1)

	f, err := os.Create(filepath.Join(dir, "mine"))
	check(t, err)
	t.Cleanup(func() { f.Close() })
	_, err = f.Write([]byte("yz"))
	check(t, err)
	check(t, os.Remove(filepath.Join(dir, "mine")))
	statfsEventually(t, c, 2, 3)
	check(t, f.Close())
	statfsEventually(t, c, 1, 1)
	check(t, srv.Unmount())
	srv.Wait()
	statfsEventually(t, c, 1, 1)
}
