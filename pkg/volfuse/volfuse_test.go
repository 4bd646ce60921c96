package volfuse_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shoal-dev/shoal/pkg/volfs"
	"github.com/shoal-dev/shoal/pkg/volfs/volfstest"
	"github.com/shoal-dev/shoal/pkg/volfuse"
)

// needFUSE skips a test that needs a real FUSE mount when the machine
// cannot provide one (no /dev/fuse, or not root: allow_other needs it).
func needFUSE(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("no FUSE on this machine: %v", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("mounting with allow_other needs root")
	}
}

// mount mounts c on a new temporary directory; it is unmounted when the
// test ends, whatever happened.
func mount(t *testing.T, c *volfs.Client) (string, *volfuse.Server) {
	t.Helper()
	dir := t.TempDir()
	srv, err := volfuse.Mount(dir, c, volfuse.Options{FsName: "shoal:test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
		}
		srv.Wait()
	})
	return dir, srv
}

func check(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func wantErrno(t *testing.T, what string, err error, want syscall.Errno) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: %v, want %v", what, err, want)
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	check(t, err)
	return string(b)
}

func inoOf(t *testing.T, p string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	check(t, syscall.Lstat(p, &st))
	return st.Ino
}

// TestPOSIX exercises the mount with plain system calls, backed by one
// in-process replica.
func TestPOSIX(t *testing.T) {
	needFUSE(t)
	local := volfstest.NewLocal()
	c := &volfs.Client{B: local}
	dir, _ := mount(t, c)
	p := func(s string) string { return filepath.Join(dir, s) }

	// Create, write, read.
	check(t, os.WriteFile(p("a"), []byte("hello"), 0o640))
	if got := readFile(t, p("a")); got != "hello" {
		t.Fatalf("read %q", got)
	}
	fi, err := os.Stat(p("a"))
	check(t, err)
	if fi.Mode() != 0o640 || fi.Size() != 5 {
		t.Fatalf("stat %v %d", fi.Mode(), fi.Size())
	}
	// O_EXCL on an existing file.
	_, err = os.OpenFile(p("a"), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	wantErrno(t, "O_EXCL", err, syscall.EEXIST)
	// Append.
	f, err := os.OpenFile(p("a"), os.O_APPEND|os.O_WRONLY, 0)
	check(t, err)
	_, err = f.WriteString(" world")
	check(t, err)
	check(t, f.Sync())
	check(t, f.Close())
	if got := readFile(t, p("a")); got != "hello world" {
		t.Fatalf("after append %q", got)
	}
	// Truncate (by path and by O_TRUNC), and a write past the end.
	check(t, os.Truncate(p("a"), 4))
	if got := readFile(t, p("a")); got != "hell" {
		t.Fatalf("after truncate %q", got)
	}
	f, err = os.OpenFile(p("a"), os.O_RDWR, 0)
	check(t, err)
	_, err = f.WriteAt([]byte("X"), 6)
	check(t, err)
	check(t, f.Close())
	if got := readFile(t, p("a")); got != "hell\x00\x00X" {
		t.Fatalf("after sparse write %q", got)
	}
	check(t, os.WriteFile(p("a"), []byte("new"), 0o600))
	if got := readFile(t, p("a")); got != "new" {
		t.Fatalf("after O_TRUNC rewrite %q", got)
	}
	// Large file across several write and read requests.
	big := bytes.Repeat([]byte("0123456789abcdef"), 300_000) // 4.8 MB
	check(t, os.WriteFile(p("big"), big, 0o644))
	if got, err := os.ReadFile(p("big")); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("big file differs (%d bytes, %v)", len(got), err)
	}

	// Directories.
	check(t, os.MkdirAll(p("d/e/f"), 0o755))
	check(t, os.WriteFile(p("d/x"), nil, 0o644))
	ents, err := os.ReadDir(p("d"))
	check(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"e", "x"}) || !ents[0].IsDir() {
		t.Fatalf("readdir %v", names)
	}
	wantErrno(t, "rmdir non-empty", syscall.Rmdir(p("d/e")), syscall.ENOTEMPTY)
	wantErrno(t, "unlink dir", syscall.Unlink(p("d/e")), syscall.EISDIR)
	check(t, os.Remove(p("d/e/f")))
	check(t, os.Remove(p("d/e")))
	wantErrno(t, "mkdir existing", syscall.Mkdir(p("d"), 0o755), syscall.EEXIST)

	// Rename over an existing file; the old target is gone.
	check(t, os.WriteFile(p("src"), []byte("src"), 0o644))
	check(t, os.WriteFile(p("dst"), []byte("dst"), 0o644))
	srcIno := inoOf(t, p("src"))
	check(t, os.Rename(p("src"), p("dst")))
	if got := readFile(t, p("dst")); got != "src" || inoOf(t, p("dst")) != srcIno {
		t.Fatalf("rename over: %q", got)
	}
	_, err = os.Stat(p("src"))
	wantErrno(t, "stat renamed", err, syscall.ENOENT)
	check(t, os.Rename(p("dst"), p("d/moved")))
	wantErrno(t, "rename dir into itself", os.Rename(p("d"), p("d/sub")), syscall.EINVAL)
	check(t, unix.Renameat2(unix.AT_FDCWD, p("d/moved"), unix.AT_FDCWD, p("d/x"), unix.RENAME_EXCHANGE))
	if got := readFile(t, p("d/x")); got != "src" {
		t.Fatalf("after exchange %q", got)
	}
	wantErrno(t, "noreplace", unix.Renameat2(unix.AT_FDCWD, p("d/x"), unix.AT_FDCWD, p("d/moved"), unix.RENAME_NOREPLACE), syscall.EEXIST)

	// Unlink.
	check(t, os.Remove(p("d/moved")))
	_, err = os.Stat(p("d/moved"))
	wantErrno(t, "stat unlinked", err, syscall.ENOENT)

	// chown, chmod, utimes (chown first: it clears setuid, as on Linux).
	check(t, os.Chown(p("a"), 1234, 5678))
	check(t, syscall.Chmod(p("a"), 0o4711)) // os.Chmod would drop the raw setuid bit
	mt := time.Date(2001, 2, 3, 4, 5, 6, 7000, time.UTC)
	check(t, os.Chtimes(p("a"), mt, mt))
	var st syscall.Stat_t
	check(t, syscall.Stat(p("a"), &st))
	if st.Mode != syscall.S_IFREG|0o4711 || st.Uid != 1234 || st.Gid != 5678 || st.Mtim.Sec != mt.Unix() || st.Mtim.Nsec != 7000 {
		t.Fatalf("stat after chmod/chown/chtimes: mode %o uid %d gid %d mtime %v", st.Mode, st.Uid, st.Gid, st.Mtim)
	}

	// Symlinks and hard links.
	check(t, os.Symlink("d/x", p("l")))
	if target, err := os.Readlink(p("l")); err != nil || target != "d/x" {
		t.Fatalf("readlink %q %v", target, err)
	}
	if got := readFile(t, p("l")); got != "src" {
		t.Fatalf("read through symlink %q", got)
	}
	check(t, os.Link(p("d/x"), p("hard")))
	check(t, syscall.Stat(p("hard"), &st))
	if st.Nlink != 2 || st.Ino != inoOf(t, p("d/x")) {
		t.Fatalf("hard link: nlink %d", st.Nlink)
	}

	// Inode numbers are the volume's: stable, and the same on a second
	// mount of the same volume.
	if got := inoOf(t, dir); got != volfs.RootIno {
		t.Fatalf("root inode %d", got)
	}
	aIno := inoOf(t, p("a"))
	if a, err := c.Lookup(context.Background(), volfs.RootIno, "a"); err != nil || a.Ino != aIno {
		t.Fatalf("inode %d, volume says %d (%v)", aIno, a.Ino, err)
	}
	dir2, _ := mount(t, c)
	if got := inoOf(t, filepath.Join(dir2, "a")); got != aIno {
		t.Fatalf("second mount: inode %d, want %d", got, aIno)
	}

	// A binary on the volume runs (exec maps it privately, which direct
	// I/O allows). A shell execs it: a Go process that forks stays
	// suspended, holding one of its runtime's processors, until the child
	// has read the binary — which this process serves; a garbage
	// collection meanwhile would wait for that processor forever.
	bin, err := os.ReadFile("/bin/true")
	check(t, err)
	check(t, os.WriteFile(p("true"), bin, 0o755))
	if out, err := exec.Command("sh", "-c", `exec "$0"`, p("true")).CombinedOutput(); err != nil {
		t.Fatalf("exec from the volume: %v %s", err, out)
	}

	// The size limit: ENOSPC, and statfs reports it.
	check(t, c.SetLimit(context.Background(), local.FS.Used()+1000))
	err = os.WriteFile(p("full"), make([]byte, 2000), 0o644)
	wantErrno(t, "write over limit", err, syscall.ENOSPC)
	var sfs syscall.Statfs_t
	check(t, syscall.Statfs(dir, &sfs))
	if sfs.Bsize != 4096 || uint64(sfs.Blocks) != uint64(local.FS.Used()+1000)/4096 {
		t.Fatalf("statfs blocks %d bsize %d", sfs.Blocks, sfs.Bsize)
	}
	check(t, c.SetLimit(context.Background(), 0))
}

// TestPermissions checks that the kernel enforces mode bits
// (default_permissions) for a non-root caller.
func TestPermissions(t *testing.T) {
	needFUSE(t)
	dir, _ := mount(t, &volfs.Client{B: volfstest.NewLocal()})
	// t.TempDir's parent is 0700: let the other user reach the mount.
	check(t, os.Chmod(filepath.Dir(dir), 0o755))
	secret := filepath.Join(dir, "secret")
	check(t, os.WriteFile(secret, []byte("x"), 0o600))
	open := filepath.Join(dir, "open")
	check(t, os.WriteFile(open, []byte("y"), 0o644))

	// Drop to uid 1000 on this thread only (fsuid is per thread and the
	// kernel checks file access with it).
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	unix.Setfsuid(1000)
	unix.Setfsgid(1000)
	_, errSecret := os.ReadFile(secret)
	_, errOpen := os.ReadFile(open)
	errCreate := os.WriteFile(filepath.Join(dir, "new"), nil, 0o644)
	unix.Setfsuid(0)
	unix.Setfsgid(0)
	wantErrno(t, "read 0600 file as another user", errSecret, syscall.EACCES)
	check(t, errOpen)
	wantErrno(t, "create in root-owned 0755 dir", errCreate, syscall.EACCES)
}

// TestTwoNodes mounts one volume twice, through two different replicas of
// a three-host Raft group (as on two nodes): each mount sees the other's
// writes at once, and the replicas end identical.
func TestTwoNodes(t *testing.T) {
	needFUSE(t)
	rt := volfstest.StartRealtime(t, 3)
	a, _ := mount(t, rt.Client(1))
	b, _ := mount(t, rt.Client(2))
	pa := func(s string) string { return filepath.Join(a, s) }
	pb := func(s string) string { return filepath.Join(b, s) }

	check(t, os.Mkdir(pa("shared"), 0o755))
	check(t, os.WriteFile(pa("shared/f"), []byte("from a"), 0o644))
	if got := readFile(t, pb("shared/f")); got != "from a" {
		t.Fatalf("b reads %q", got)
	}
	// An open file on b sees a's later writes (no page cache).
	fb, err := os.Open(pb("shared/f"))
	check(t, err)
	defer fb.Close()
	check(t, os.WriteFile(pa("shared/f"), []byte("second"), 0o644))
	buf := make([]byte, 100)
	n, err := fb.ReadAt(buf, 0)
	if string(buf[:n]) != "second" {
		t.Fatalf("open file on b reads %q (%v)", buf[:n], err)
	}
	// Appends from both mounts interleave without overwriting.
	fa, err := os.OpenFile(pa("shared/log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	check(t, err)
	defer fa.Close()
	fb2, err := os.OpenFile(pb("shared/log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	check(t, err)
	defer fb2.Close()
	for i := range 10 {
		_, err := fmt.Fprintf(fa, "a%d\n", i)
		check(t, err)
		_, err = fmt.Fprintf(fb2, "b%d\n", i)
		check(t, err)
	}
	lines := strings.Split(strings.TrimSpace(readFile(t, pa("shared/log"))), "\n")
	if len(lines) != 20 || lines[0] != "a0" || lines[1] != "b0" || lines[19] != "b9" {
		t.Fatalf("interleaved appends: %q", lines)
	}
	// Renames and removals on one are seen by the other.
	check(t, os.Rename(pb("shared/f"), pb("shared/g")))
	if _, err := os.Stat(pa("shared/f")); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("a still sees renamed file: %v", err)
	}
	if got := readFile(t, pa("shared/g")); got != "second" {
		t.Fatalf("a reads renamed %q", got)
	}
	check(t, os.Remove(pa("shared/g")))
	if _, err := os.Stat(pb("shared/g")); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("b still sees removed file: %v", err)
	}
	if inoOf(t, pa("shared/log")) != inoOf(t, pb("shared/log")) {
		t.Fatal("inode numbers differ between nodes")
	}
	// All three replicas converge on the same state.
	deadline := time.Now().Add(10 * time.Second)
	for {
		d1, d2, d3 := rt.FS(1).Digest(), rt.FS(2).Digest(), rt.FS(3).Digest()
		if d1 == d2 && d2 == d3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("replicas differ")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestUnmountBusy checks that Unmount detaches a busy mount lazily
// instead of failing, and that Wait returns once the last file closes.
func TestUnmountBusy(t *testing.T) {
	needFUSE(t)
	dir := t.TempDir()
	srv, err := volfuse.Mount(dir, &volfs.Client{B: volfstest.NewLocal()}, volfuse.Options{})
	check(t, err)
	f, err := os.Create(filepath.Join(dir, "open"))
	if err != nil {
		_ = srv.Unmount()
		t.Fatal(err)
	}
	if err := srv.Unmount(); err != nil {
		f.Close()
		t.Fatalf("unmount busy: %v", err)
	}
	// The open file still works until closed.
	if _, err := f.WriteString("still here"); err != nil {
		t.Errorf("write after lazy unmount: %v", err)
	}
	f.Close()
	done := make(chan struct{})
	go func() { srv.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("server still running after the last file closed")
	}
}

// TestCleanStale kills a process serving a mount (as a crashed vold
// leaves it: ENOTCONN), cleans the mount point, and mounts there again.
func TestCleanStale(t *testing.T) {
	if dir := os.Getenv("VOLFUSE_TEST_SERVE"); dir != "" {
		serveForever(dir, false)
		return
	}
	needFUSE(t)
	dir := t.TempDir()
	check(t, volfuse.CleanStale(dir)) // nothing mounted: a no-op
	cmd := startServer(t, "TestCleanStale", "VOLFUSE_TEST_SERVE="+dir)
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		_ = unix.Unmount(dir, unix.MNT_DETACH)
	})
	if got := readFile(t, filepath.Join(dir, "hello")); got != "hi" {
		t.Fatalf("helper's mount reads %q", got)
	}
	check(t, volfuse.CleanStale(dir)) // a live mount is left alone
	if got := readFile(t, filepath.Join(dir, "hello")); got != "hi" {
		t.Fatal("CleanStale touched a live mount")
	}
	check(t, cmd.Process.Kill())
	_ = cmd.Wait()
	killed = true
	_, err := os.Stat(dir)
	wantErrno(t, "stat dead mount", err, syscall.ENOTCONN)
	check(t, volfuse.CleanStale(dir))
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("after CleanStale: %v", err)
	}
	remountWorks(t, dir)
}

// TestCleanStaleAfterSelfDeadlock kills a server while a thread of its
// own waits on its mount for an answer that never comes (a vold whose
// group has no quorum when it mounts): the killed process cannot finish
// dying, keeps the connection open, and its mount neither answers nor
// says ENOTCONN. CleanStale must still clean it (aborting the
// connection), which lets the old process exit, and a new mount works.
func TestCleanStaleAfterSelfDeadlock(t *testing.T) {
	if dir := os.Getenv("VOLFUSE_TEST_SERVE_STUCK"); dir != "" {
		serveForever(dir, true)
		return
	}
	needFUSE(t)
	if !volfuse.IsMountPointForTest(volfuse.FusectlDirForTest) {
		// CleanStale mounts fusectl where nothing had: undo that.
		t.Cleanup(func() { _ = unix.Unmount(volfuse.FusectlDirForTest, 0) })
	}
	dir := t.TempDir()
	cmd := startServer(t, "TestCleanStaleAfterSelfDeadlock", "VOLFUSE_TEST_SERVE_STUCK="+dir)
	exited := make(chan error, 1)
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = volfuse.CleanStale(dir) // what the test checks; here only to clean up
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			t.Error("the killed server never exited")
		}
	})
	go func() { exited <- cmd.Wait() }()
	check(t, cmd.Process.Kill())
	select {
	case <-exited:
		t.Fatal("the killed server exited: its thread was not stuck on its mount, nothing to test")
	case <-time.After(time.Second):
	}
	done := make(chan error, 1)
	go func() { done <- volfuse.CleanStale(dir) }()
	select {
	case err := <-done:
		check(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("CleanStale hangs on the stuck mount")
	}
	select {
	case <-exited:
		exited <- nil // for the cleanup
	case <-time.After(10 * time.Second):
		t.Fatal("the killed server is still stuck after CleanStale")
	}
	remountWorks(t, dir)
}

// startServer runs test name in a child process with env added, and
// waits for it to print "ready" (its mount is up).
func startServer(t *testing.T, name, env string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$")
	cmd.Env = append(os.Environ(), env)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	check(t, err)
	check(t, cmd.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("helper: %q %v", line, err)
	}
	return cmd
}

// remountWorks mounts a fresh server at dir, where a stale mount was
// cleaned, and writes through it.
func remountWorks(t *testing.T, dir string) {
	t.Helper()
	srv, err := volfuse.Mount(dir, &volfs.Client{B: volfstest.NewLocal()}, volfuse.Options{})
	check(t, err)
	t.Cleanup(func() {
		if err := srv.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
		}
		srv.Wait()
	})
	check(t, os.WriteFile(filepath.Join(dir, "again"), []byte("ok"), 0o644))
}

// stuckBackend answers until stuck is set, then never.
type stuckBackend struct {
	volfs.Backend
	stuck atomic.Bool
}

func (b *stuckBackend) Query(ctx context.Context, req []byte) ([]byte, error) {
	if b.stuck.Load() {
		select {}
	}
	return b.Backend.Query(ctx, req)
}

// serveForever is the helper process of TestCleanStale: it mounts a
// volume with one file at dir and serves until killed. With stuck, once
// mounted, its filesystem stops answering queries and one of its own
// goroutines looks a file up there (and waits forever).
func serveForever(dir string, stuck bool) {
	b := &stuckBackend{Backend: volfstest.NewLocal()}
	c := &volfs.Client{B: b}
	ctx := context.Background()
	a, err := c.Create(ctx, volfs.RootIno, "hello", 0o644, 0, 0, 0)
	if err == nil {
		_, err = c.Write(ctx, a.Ino, 0, []byte("hi"), false)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if _, err := volfuse.Mount(dir, c, volfuse.Options{}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if stuck {
		b.stuck.Store(true)
		go func() { _, _ = os.Stat(filepath.Join(dir, "hello")) }()
		time.Sleep(200 * time.Millisecond) // until the kernel has sent the lookup
	}
	fmt.Println("ready")
	select {}
}
