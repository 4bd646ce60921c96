package volfuse_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/rpc"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/fdhold"
	"github.com/shoal-dev/shoal/pkg/volfs"
	"github.com/shoal-dev/shoal/pkg/volfs/volfstest"
	"github.com/shoal-dev/shoal/pkg/volfuse"
)

// TestMountOutlivesItsServer is a vold restart seen from a mount: a
// server process mounts a volume and hands its session to a holder; a
// file is opened and written; a write is in flight (read by the server,
// not answered) when the server is killed with SIGKILL; a new server
// process takes the session back. The open file carries on (same
// descriptor, same inode numbers), the write in flight completes once
// through the new server (an append applied twice would show), and
// nothing saw ENOTCONN. The volume itself lives in this process (as it
// lives in the Raft group, not in vold's FUSE server), served to the
// server processes over a socket, and remembers the keys of the
// mutations it applied as the Raft host does.
func TestMountOutlivesItsServer(t *testing.T) {
	if spec := os.Getenv("VOLFUSE_TEST_ADOPT"); spec != "" {
		serveSessionChild(spec)
		return
	}
	needFUSE(t)
	// The old server's last write never reached the group.
	t.Run("WriteNotApplied", func(t *testing.T) { restartWithWriteInFlight(t, false) })
	// It did, and the answer was lost with the server: the resent
	// request has the same key and is not applied again.
	t.Run("WriteAppliedNotAnswered", func(t *testing.T) { restartWithWriteInFlight(t, true) })
}

func restartWithWriteInFlight(t *testing.T, applied bool) {
	tmp := t.TempDir()
	dir := filepath.Join(tmp, "mnt")
	check(t, os.Mkdir(dir, 0o755))
	backendSock := filepath.Join(tmp, "backend.sock")
	holderSock := filepath.Join(tmp, "holder.sock")

	be := &gatedBackend{l: volfstest.NewLocal(), release: make(chan struct{}), results: map[string][]byte{}}
	serveBackend(t, be, backendSock)
	go func() { _ = fdhold.Serve(holderSock, time.Minute, 50*time.Millisecond) }()

	first := startChild(t, "mount", dir, backendSock, holderSock)
	f, err := os.OpenFile(filepath.Join(dir, "log"), os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o644)
	check(t, err)
	defer f.Close()
	_, err = f.WriteString("one\n")
	check(t, err)
	check(t, os.Mkdir(filepath.Join(dir, "sub"), 0o755))
	logIno, subIno := inoOf(t, filepath.Join(dir, "log")), inoOf(t, filepath.Join(dir, "sub"))

	// A write the server reads and never answers: the backend holds it.
	// Another process writes it: a process with a thread waiting on a
	// FUSE write cannot fork until the write returns (the kernel holds
	// the pages it writes from), and this one must start the next server.
	be.gate(true, applied)
	wrote := make(chan error, 1)
	go func() {
		out, err := exec.Command("sh", "-c", `printf 'two\n' >> "$0"`, filepath.Join(dir, "log")).CombinedOutput()
		if err != nil {
			err = fmt.Errorf("%w: %s", err, out)
		}
		wrote <- err
	}()
	be.waitHeld(t)
	check(t, first.Process.Kill())
	_ = first.Wait()
	// The dead server's held call ends without an answer to anyone.
	be.gate(false, false)
	select {
	case err := <-wrote:
		t.Fatalf("write returned while no server serves the mount: %v", err)
	case <-time.After(200 * time.Millisecond):
	}

	startChild(t, "adopt", dir, backendSock, holderSock)
	select {
	case err := <-wrote:
		check(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("the write in flight at the kill never completed")
	}
	_, err = f.WriteString("three\n")
	check(t, err)
	b := make([]byte, 64)
	n, err := f.ReadAt(b, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	if got := string(b[:n]); got != "one\ntwo\nthree\n" {
		t.Fatalf("log after the takeover: %q", got)
	}
	if inoOf(t, filepath.Join(dir, "log")) != logIno || inoOf(t, filepath.Join(dir, "sub")) != subIno {
		t.Fatal("inode numbers changed across the takeover")
	}
	ents, err := os.ReadDir(dir)
	check(t, err)
	if len(ents) != 2 {
		t.Fatalf("listing after the takeover: %v", ents)
	}
	check(t, f.Close())
}

// startChild starts a server process (mode "mount" or "adopt") and waits
// until it serves; it is killed, and its mount undone, when the test ends.
func startChild(t *testing.T, mode, dir, backendSock, holderSock string) *exec.Cmd {
	t.Helper()
	cmd := startServer(t, "TestMountOutlivesItsServer", "VOLFUSE_TEST_ADOPT="+strings.Join([]string{mode, dir, backendSock, holderSock}, ","))
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = volfuse.CleanStale(dir)
		_ = syscall.Unmount(dir, syscall.MNT_DETACH)
	})
	return cmd
}

// serveSessionChild is the server process: it mounts (handing the
// session to the holder) or takes the session back from the holder, and
// serves until killed.
func serveSessionChild(spec string) {
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	parts := strings.Split(spec, ",")
	mode, dir, backendSock, holderSock := parts[0], parts[1], parts[2], parts[3]
	rc, err := rpc.Dial("unix", backendSock)
	if err != nil {
		fail(err)
	}
	c := &volfs.Client{B: rpcBackend{rc}}
	holder, err := fdhold.Connect(holderSock, "/nonexistent", nil)
	if err != nil {
		fail(err)
	}
	switch mode {
	case "mount":
		srv, err := volfuse.Mount(dir, c, volfuse.Options{})
		if err != nil {
			fail(err)
		}
		sess, err := srv.Session()
		if err != nil {
			fail(err)
		}
		if err := holder.Put("vol", sess.FD, sess.Meta()); err != nil {
			fail(err)
		}
		sess.FD.Close()
	case "adopt":
		held, err := holder.Take()
		if err != nil || len(held) != 1 {
			fail(fmt.Errorf("take: %v %v", held, err))
		}
		sess, err := volfuse.SessionFromMeta(held[0].File, held[0].Meta)
		if err != nil {
			fail(err)
		}
		if _, err := volfuse.Adopt(dir, sess, c, volfuse.Options{}); err != nil {
			fail(err)
		}
		sess.FD.Close()
	}
	fmt.Println("ready")
	select {}
}

// gatedBackend is a Local backend that remembers the result of each
// keyed mutation (a mutation with a known key is not applied again, as
// in the Raft host) and whose mutations can be held: a held call never
// answers (its caller, the server, is meant to die), after applying the
// mutation or not.
type gatedBackend struct {
	l       *volfstest.Local
	mu      sync.Mutex
	closed  bool
	apply   bool
	held    int
	release chan struct{}
	results map[string][]byte
}

func (g *gatedBackend) gate(closed, apply bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed, g.apply = closed, apply
	if !closed {
		close(g.release)
		g.release = make(chan struct{})
	}
}

func (g *gatedBackend) waitHeld(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		g.mu.Lock()
		h := g.held
		g.mu.Unlock()
		if h > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the write never reached the backend")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// BackendRPC serves a gatedBackend over net/rpc.
type BackendRPC struct{ g *gatedBackend }

// MutateArgs is a keyed mutation.
type MutateArgs struct {
	Key string
	Op  []byte
}

func (b *BackendRPC) Mutate(args MutateArgs, out *[]byte) error {
	g := b.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if args.Key == "" {
		return errors.New("mutation without a request key")
	}
	if res, ok := g.results[args.Key]; ok {
		*out = res
		return nil
	}
	if g.closed {
		g.held++
		if g.apply {
			if err := g.applyLocked(args); err != nil {
				return err
			}
		}
		rel := g.release
		g.mu.Unlock()
		<-rel
		g.mu.Lock()
		return errors.New("dropped: its server is gone")
	}
	if err := g.applyLocked(args); err != nil {
		return err
	}
	*out = g.results[args.Key]
	return nil
}

func (g *gatedBackend) applyLocked(args MutateArgs) error {
	res, err := g.l.Mutate(context.Background(), args.Op)
	if err != nil {
		return err
	}
	g.results[args.Key] = res
	return nil
}

func (b *BackendRPC) Query(req []byte, out *[]byte) error {
	res, err := b.g.l.Query(context.Background(), req)
	*out = res
	return err
}

func serveBackend(t *testing.T, g *gatedBackend, sock string) {
	t.Helper()
	srv := rpc.NewServer()
	check(t, srv.Register(&BackendRPC{g: g}))
	l, err := net.Listen("unix", sock)
	check(t, err)
	t.Cleanup(func() { l.Close() })
	go srv.Accept(l)
}

// rpcBackend is a server process's side of serveBackend.
type rpcBackend struct{ c *rpc.Client }

func (b rpcBackend) Mutate(ctx context.Context, op []byte) ([]byte, error) {
	var out []byte
	err := b.c.Call("BackendRPC.Mutate", MutateArgs{Key: volfs.RequestKey(ctx), Op: op}, &out)
	return out, err
}

func (b rpcBackend) Query(_ context.Context, req []byte) ([]byte, error) {
	var out []byte
	err := b.c.Call("BackendRPC.Query", req, &out)
	return out, err
}

// TestAdoptRefuses: a session is served again only where it is mounted,
// and only by a kernel that can resend what the old server left
// unanswered.
func TestAdoptRefuses(t *testing.T) {
	needFUSE(t)
	c := &volfs.Client{B: volfstest.NewLocal()}
	dir, srv := mount(t, c)
	sess, err := srv.Session()
	check(t, err)
	defer sess.FD.Close()
	if sess.ID == "" || sess.Conn != volfuse.MountedConn(dir) || len(sess.Init) == 0 {
		t.Fatalf("session: id %q conn %d (mount's %d), %d bytes of INIT", sess.ID, sess.Conn, volfuse.MountedConn(dir), len(sess.Init))
	}
	if _, err := volfuse.Adopt(t.TempDir(), sess, c, volfuse.Options{}); err == nil || !strings.Contains(err.Error(), "not the session's") {
		t.Fatalf("adopt where the session is not mounted: %v", err)
	}
	old := sess
	old.Init = slices.Clone(sess.Init)
	binary.NativeEndian.PutUint32(old.Init[44:], 38) // FUSE 7.38: Linux 6.5
	if _, err := volfuse.Adopt(dir, old, c, volfuse.Options{}); err == nil || !strings.Contains(err.Error(), "cannot resend") {
		t.Fatalf("adopt on a kernel without resend: %v", err)
	}
	noID := sess
	noID.ID = ""
	if _, err := volfuse.Adopt(dir, noID, c, volfuse.Options{}); err == nil {
		t.Fatal("adopt of a session without an ID succeeded")
	}
	// The refusals left the mount as it was.
	check(t, os.WriteFile(filepath.Join(dir, "still"), []byte("ok"), 0o644))
}
