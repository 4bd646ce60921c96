package volarchive

import (
	"archive/tar"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func openRoot(t *testing.T, dir string) *os.Root {
	t.Helper()
	r, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// TestRoundTrip copies a tree out and into an empty directory: contents,
// kinds, modes, owners, times and hard links survive; a FIFO is skipped.
func TestRoundTrip(t *testing.T) {
	src := t.TempDir()
	old := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "a/b"), 0o755))
	must(os.WriteFile(filepath.Join(src, "a/b/data"), bytes.Repeat([]byte("x"), 100_000), 0o640))
	must(os.WriteFile(filepath.Join(src, "empty"), nil, 0o600))
	must(os.Link(filepath.Join(src, "a/b/data"), filepath.Join(src, "hard")))
	must(os.Symlink("a/b/data", filepath.Join(src, "soft")))
	must(os.Mkdir(filepath.Join(src, "private"), 0o700))
	must(os.Chmod(filepath.Join(src, "private"), 0o710|fs.ModeSetgid))
	must(os.Chown(filepath.Join(src, "empty"), 1234, 5678))
	must(syscall.Mkfifo(filepath.Join(src, "pipe"), 0o600))
	must(os.Chtimes(filepath.Join(src, "a/b/data"), old, old))
	must(os.Chtimes(filepath.Join(src, "a"), old, old))

	var buf bytes.Buffer
	var progressed int64
	st, err := Write(openRoot(t, src), &buf, func(b int64) { progressed = b })
	if err != nil {
		t.Fatal(err)
	}
	// ., a, a/b, a/b/data, empty, hard, private, soft
	if st.Entries != 8 || st.Bytes != 100_000 || progressed != 100_000 || len(st.Skipped) != 1 || st.Skipped[0] != "pipe" {
		t.Fatalf("write: %+v (progress %d)", st, progressed)
	}
	entries, size, err := Size(bytes.NewReader(buf.Bytes()))
	if err != nil || entries != 8 || size != 100_000 {
		t.Fatalf("Size: %d entries, %d bytes, %v", entries, size, err)
	}

	dst := t.TempDir()
	st, err = Read(openRoot(t, dst), bytes.NewReader(buf.Bytes()), ReadOptions{})
	if err != nil || st.Entries != 8 || st.Bytes != 100_000 {
		t.Fatalf("read: %+v, %v", st, err)
	}
	// A bound below the data stops the copy with ErrTooLarge.
	if _, err := Read(openRoot(t, t.TempDir()), bytes.NewReader(buf.Bytes()), ReadOptions{MaxBytes: 99_999}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("100,000 bytes under a 99,999 bound: %v", err)
	}
	if _, err := Read(openRoot(t, t.TempDir()), bytes.NewReader(buf.Bytes()), ReadOptions{MaxBytes: 100_000}); err != nil {
		t.Errorf("100,000 bytes under a 100,000 bound: %v", err)
	}
	got, err := os.ReadFile(filepath.Join(dst, "a/b/data"))
	if err != nil || len(got) != 100_000 {
		t.Fatalf("data: %d bytes, %v", len(got), err)
	}
	stat := func(p string) (fs.FileInfo, *syscall.Stat_t) {
		t.Helper()
		info, err := os.Lstat(filepath.Join(dst, p))
		if err != nil {
			t.Fatal(err)
		}
		return info, info.Sys().(*syscall.Stat_t)
	}
	if info, _ := stat("a/b/data"); info.Mode().Perm() != 0o640 || !info.ModTime().Equal(old) {
		t.Errorf("data: mode %v, time %v", info.Mode(), info.ModTime())
	}
	if info, _ := stat("a"); !info.ModTime().Equal(old) {
		t.Errorf("directory a's time %v, want %v (set after its contents)", info.ModTime(), old)
	}
	if info, sys := stat("empty"); info.Size() != 0 || sys.Uid != 1234 || sys.Gid != 5678 {
		t.Errorf("empty: size %d, owner %d:%d", info.Size(), sys.Uid, sys.Gid)
	}
	if _, data := stat("a/b/data"); data.Nlink != 2 {
		t.Errorf("data has %d links, want 2 (hard)", data.Nlink)
	}
	if _, hard := stat("hard"); hard.Ino != func() uint64 { _, s := stat("a/b/data"); return s.Ino }() {
		t.Error("hard is not the same file as a/b/data")
	}
	if l, err := os.Readlink(filepath.Join(dst, "soft")); err != nil || l != "a/b/data" {
		t.Errorf("soft: %q, %v", l, err)
	}
	if info, _ := stat("private"); info.Mode()&fs.ModePerm != 0o710 || info.Mode()&fs.ModeSetgid == 0 {
		t.Errorf("private: mode %v, want setgid 0710", info.Mode())
	}
	if _, err := os.Lstat(filepath.Join(dst, "pipe")); err == nil {
		t.Error("the FIFO was made")
	}
}

// TestReadStaysInside: names and links that point out of the tree fail
// without writing outside it; absolute names land inside.
func TestReadStaysInside(t *testing.T) {
	base := t.TempDir()
	dst := filepath.Join(base, "vol")
	if err := os.Mkdir(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	archive := func(hdrs ...*tar.Header) *bytes.Reader {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range hdrs {
			if h.Typeflag == tar.TypeReg {
				h.Size = int64(len("evil"))
			}
			h.Mode = 0o644
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
			if h.Typeflag == tar.TypeReg {
				tw.Write([]byte("evil"))
			}
		}
		tw.Close()
		return bytes.NewReader(buf.Bytes())
	}
	for name, r := range map[string]*bytes.Reader{
		"dot-dot":         archive(&tar.Header{Name: "../outside", Typeflag: tar.TypeReg}),
		"through symlink": archive(&tar.Header{Name: "link", Typeflag: tar.TypeSymlink, Linkname: base}, &tar.Header{Name: "link/outside", Typeflag: tar.TypeReg}),
		"hard link out":   archive(&tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "../outside"}),
	} {
		if _, err := Read(openRoot(t, dst), r, ReadOptions{}); err == nil {
			t.Errorf("%s: extracted", name)
		}
		if _, err := os.Lstat(filepath.Join(base, "outside")); err == nil {
			t.Fatalf("%s: wrote outside the tree", name)
		}
	}
	if _, err := Read(openRoot(t, dst), archive(&tar.Header{Name: "/etc/abs", Typeflag: tar.TypeReg}), ReadOptions{}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "etc/abs")); err != nil || string(b) != "evil" {
		t.Errorf("an absolute name: %q, %v; want it under the tree", b, err)
	}
	// A file replaces a file; a directory in the way fails the entry.
	if _, err := Read(openRoot(t, dst), archive(&tar.Header{Name: "etc", Typeflag: tar.TypeReg}), ReadOptions{}); err == nil || !strings.Contains(err.Error(), "directory") {
		t.Errorf("a file over a directory: %v", err)
	}
}

// FuzzRead: whatever the archive, nothing is made outside the tree.
func FuzzRead(f *testing.F) {
	add := func(hdrs ...*tar.Header) {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range hdrs {
			if h.Typeflag == tar.TypeReg {
				h.Size = 1
			}
			tw.WriteHeader(h)
			if h.Typeflag == tar.TypeReg {
				tw.Write([]byte("x"))
			}
		}
		tw.Close()
		f.Add(buf.Bytes())
	}
	add(&tar.Header{Name: "a/b", Typeflag: tar.TypeReg, Mode: 0o644})
	add(&tar.Header{Name: "../up", Typeflag: tar.TypeReg, Mode: 0o644})
	add(&tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: ".."}, &tar.Header{Name: "l/up", Typeflag: tar.TypeReg, Mode: 0o644})
	add(&tar.Header{Name: "d", Typeflag: tar.TypeDir, Mode: 0o4777}, &tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "../../etc/passwd"})
	f.Fuzz(func(t *testing.T, data []byte) {
		base := t.TempDir()
		dst := filepath.Join(base, "vol")
		if err := os.Mkdir(dst, 0o755); err != nil {
			t.Fatal(err)
		}
		root, err := os.OpenRoot(dst)
		if err != nil {
			t.Fatal(err)
		}
		defer root.Close()
		Read(root, bytes.NewReader(data), ReadOptions{MaxBytes: 1 << 20})
		entries, err := os.ReadDir(base)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 1 || entries[0].Name() != "vol" {
			t.Fatalf("made outside the tree: %v", entries)
		}
	})
}

// TestCopyPath copies one path as docker cp does: named from its last
// element, into an existing directory under its own name, or renamed to
// a destination that does not exist yet, with hard links renamed too and
// owners set as asked.
func TestCopyPath(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "etc/app/sub"), 0o755))
	must(os.WriteFile(filepath.Join(src, "etc/app/sub/conf"), []byte("port=80\n"), 0o644))
	must(os.Link(filepath.Join(src, "etc/app/sub/conf"), filepath.Join(src, "etc/app/again")))
	must(os.WriteFile(filepath.Join(src, "etc/other"), []byte("not copied"), 0o644))
	must(os.Chown(filepath.Join(src, "etc/app/sub/conf"), 1000, 1000))
	must(os.Mkdir(filepath.Join(dst, "into"), 0o755))
	must(os.WriteFile(filepath.Join(dst, "afile"), nil, 0o644))

	var buf bytes.Buffer
	st, err := WritePath(openRoot(t, filepath.Join(src, "etc")), "app", &buf, nil)
	if err != nil || st.Entries != 4 {
		t.Fatalf("write app: %+v, %v", st, err)
	}
	root := openRoot(t, dst)
	for _, c := range []struct {
		dst, dir, rename, want string
	}{
		{"into", "into", "", "into/app/sub/conf"},
		{"/into/", "into", "", "into/app/sub/conf"},
		{"renamed", ".", "renamed", "renamed/sub/conf"},
		{"into/renamed", "into", "renamed", "into/renamed/sub/conf"},
	} {
		dir, rename, err := Target(root, c.dst)
		if err != nil || dir != c.dir || rename != c.rename {
			t.Errorf("Target(%q) = %q, %q, %v; want %q, %q", c.dst, dir, rename, err, c.dir, c.rename)
			continue
		}
		sub, err := root.OpenRoot(dir)
		must(err)
		_, err = Read(sub, bytes.NewReader(buf.Bytes()), ReadOptions{Rename: rename, Owner: &Owner{UID: 7, GID: 8}})
		sub.Close()
		must(err)
		info, err := os.Stat(filepath.Join(dst, c.want))
		if err != nil {
			t.Errorf("copy to %q: %v", c.dst, err)
			continue
		}
		again, err := os.Stat(filepath.Join(filepath.Dir(filepath.Dir(filepath.Join(dst, c.want))), "again"))
		if sys := info.Sys().(*syscall.Stat_t); err != nil || !os.SameFile(info, again) || sys.Uid != 7 || sys.Gid != 8 {
			t.Errorf("copy to %q: hard link %v, owner %d:%d", c.dst, err, sys.Uid, sys.Gid)
		}
	}
	if _, _, err := Target(root, "afile/x"); !errors.Is(err, syscall.ENOTDIR) {
		t.Errorf("Target under a file: %v", err)
	}
	if _, _, err := Target(root, "missing/x"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Target under a missing directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dst, "into/other")); err == nil {
		t.Error("a sibling of the path was copied")
	}
}

// TestResolve: links resolve inside root as under a chroot (absolute
// ones from root, ".." stopping at it); the last element only when
// asked; loops end.
func TestResolve(t *testing.T) {
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "run/app"), 0o755))
	must(os.MkdirAll(filepath.Join(dir, "var"), 0o755))
	must(os.MkdirAll(filepath.Join(dir, "etc"), 0o755))
	must(os.Symlink("/run", filepath.Join(dir, "var/run")))
	must(os.Symlink("../../../../etc", filepath.Join(dir, "var/up")))
	must(os.Symlink("/run/app", filepath.Join(dir, "app")))
	must(os.Symlink("loop", filepath.Join(dir, "loop")))
	root := openRoot(t, dir)
	for _, c := range []struct {
		name       string
		followLast bool
		want       string
	}{
		{"/var/run/app/x", false, "run/app/x"},
		{"var/run", false, "var/run"},
		{"var/run", true, "run"},
		{"/var/up/passwd", false, "etc/passwd"},
		{"/../../var/run/app", false, "run/app"},
		{"/app", true, "run/app"},
		{"/app/new", true, "run/app/new"},
		{"/", false, "."},
		{"run/..", true, "."},
	} {
		got, err := Resolve(root, c.name, c.followLast)
		if err != nil || got != c.want {
			t.Errorf("Resolve(%q, %v) = %q, %v; want %q", c.name, c.followLast, got, err, c.want)
		}
	}
	if _, err := Resolve(root, "/loop/x", false); !errors.Is(err, syscall.ELOOP) {
		t.Errorf("a loop: %v", err)
	}
	if _, err := Resolve(root, "/missing/x", false); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing directory: %v", err)
	}
}
