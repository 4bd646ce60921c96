package fdhold

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// startHolder runs a holder in this process, as the holder process would.
func startHolder(t *testing.T, orphanAfter time.Duration) (string, chan error) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "fds.sock")
	done := make(chan error, 1)
	go func() { done <- Serve(sock, orphanAfter, 20*time.Millisecond) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if c, err := dial(sock); err == nil {
			c.Close()
			return sock, done
		}
		if time.Now().After(deadline) {
			t.Fatal("holder does not listen")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func mustDial(t *testing.T, sock string) *Client {
	t.Helper()
	c, err := dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestFilesOutliveTheClientAndComeBack(t *testing.T) {
	sock, _ := startHolder(t, time.Minute)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	c := mustDial(t, sock)
	if err := c.Put("vol-a", r, []byte("meta-a")); err != nil {
		t.Fatal(err)
	}
	// The daemon's own copy goes away with it; the holder's stays.
	r.Close()
	c.Close()

	c2 := mustDial(t, sock)
	held, err := c2.Take()
	if err != nil {
		t.Fatal(err)
	}
	if len(held) != 1 || held[0].Name != "vol-a" || string(held[0].Meta) != "meta-a" {
		t.Fatalf("took %+v", held)
	}
	if _, err := w.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if _, err := io.ReadFull(held[0].File, b); err != nil || b[0] != 'x' {
		t.Fatalf("read through the held file: %q %v", b, err)
	}
	held[0].File.Close()

	if err := c2.Remove("vol-a"); err != nil {
		t.Fatal(err)
	}
	if held, err := c2.Take(); err != nil || len(held) != 0 {
		t.Fatalf("after Remove: %+v %v", held, err)
	}
}

func TestDeadFilesAreDropped(t *testing.T) {
	sock, _ := startHolder(t, time.Minute)
	c := mustDial(t, sock)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Put("p", r, nil); err != nil {
		t.Fatal(err)
	}
	r.Close()
	w.Close() // the read end now reports POLLHUP
	deadline := time.Now().Add(5 * time.Second)
	for {
		held, err := c.Take()
		if err != nil {
			t.Fatal(err)
		}
		if len(held) == 0 {
			return
		}
		closeHeld(held)
		if time.Now().After(deadline) {
			t.Fatal("a file whose other end is gone is still held")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestOrphanedHolderLetsGoAndExits(t *testing.T) {
	sock, done := startHolder(t, 200*time.Millisecond)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	c := mustDial(t, sock)
	if err := c.Put("p", r, nil); err != nil {
		t.Fatal(err)
	}
	r.Close()
	c.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("orphaned holder still runs")
	}
	// It closed its copy: the pipe has no reader left.
	if _, err := w.Write([]byte("x")); err == nil {
		t.Fatal("the holder's copy of the pipe is still open")
	}
}

func TestPutReplacesAndBadMessagesAreRefused(t *testing.T) {
	sock, _ := startHolder(t, time.Minute)
	c := mustDial(t, sock)
	r1, w1, _ := os.Pipe()
	r2, w2, _ := os.Pipe()
	defer w2.Close()
	if err := c.Put("x", r1, []byte("1")); err != nil {
		t.Fatal(err)
	}
	if err := c.Put("x", r2, []byte("2")); err != nil {
		t.Fatal(err)
	}
	r1.Close()
	r2.Close()
	// The first copy was closed when replaced: its pipe has no reader.
	if _, err := w1.Write([]byte("x")); err == nil {
		t.Fatal("replaced file still held")
	}
	w1.Close()
	held, err := c.Take()
	if err != nil || len(held) != 1 || string(held[0].Meta) != "2" {
		t.Fatalf("took %+v %v", held, err)
	}
	closeHeld(held)
	if err := c.send(opPut, entry("y", nil), -1); err != nil {
		t.Fatal(err)
	}
	if err := c.ack(); err == nil {
		t.Fatal("a put without a file was accepted")
	}
	if err := c.send('?', nil, -1); err != nil {
		t.Fatal(err)
	}
	if err := c.ack(); err == nil {
		t.Fatal("an unknown message was accepted")
	}
}

// TestMain lets Connect start this test binary as the holder.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == Command {
		os.Exit(Main(os.Args[2:]))
	}
	os.Exit(m.Run())
}

// TestConnectStartsAHolderWithoutTheServiceEnv: a holder started under
// systemd must not inherit the service's notify socket or activation.
func TestConnectStartsAHolderWithoutTheServiceEnv(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "/run/systemd/notify") // as under Type=notify
	t.Setenv("SHOAL_FDHOLD_TEST", "1")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "fds.sock")
	c, err := Connect(sock, exe, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	raw, err := c.conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) { cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil || credErr != nil {
		t.Fatal(err, credErr)
	}
	t.Cleanup(func() { _ = unix.Kill(int(cred.Pid), unix.SIGKILL) })
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", cred.Pid))
	if err != nil {
		t.Fatal(err)
	}
	env := "\x00" + string(environ)
	if strings.Contains(env, "\x00NOTIFY_SOCKET=") || !strings.Contains(env, "\x00SHOAL_FDHOLD_TEST=1\x00") {
		t.Errorf("holder (pid %d) environment: %q", cred.Pid, environ)
	}
}
