package volfuse_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/shoal-dev/shoal/pkg/volfs"
	"github.com/shoal-dev/shoal/pkg/volfs/volfstest"
)

// TestFIFOsAndSocketsOnceRaised: mkfifo and a Unix socket's bind fail
// with EPERM on a volume at LevelBase; raised to LevelSpecial, a FIFO
// carries bytes between two processes' ends and a socket accepts a
// connection, both on this node, and both show their type in stat.
func TestFIFOsAndSocketsOnceRaised(t *testing.T) {
	needFUSE(t)
	l := &volfstest.Local{FS: volfs.New()}
	c := &volfs.Client{B: l}
	dir, _ := mount(t, c)
	fifo, sock := filepath.Join(dir, "fifo"), filepath.Join(dir, "sock")

	if err := syscall.Mkfifo(fifo, 0o640); !errors.Is(err, syscall.EPERM) {
		t.Fatalf("mkfifo at LevelBase: %v, want EPERM", err)
	}
	if _, err := net.Listen("unix", sock); !errors.Is(err, syscall.EPERM) {
		t.Fatalf("binding a Unix socket at LevelBase: %v, want EPERM", err)
	}
	if err := syscall.Mknod(filepath.Join(dir, "null"), syscall.S_IFCHR|0o666, 0x103); !errors.Is(err, syscall.EPERM) {
		t.Fatalf("mknod of a character device: %v, want EPERM", err)
	}

	if _, err := c.SetLevel(context.Background(), volfs.LevelSpecial); err != nil {
		t.Fatal(err)
	}
	check(t, syscall.Mkfifo(fifo, 0o640))
	done := make(chan error, 1)
	go func() {
		w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
		if err == nil {
			_, err = w.Write([]byte("through the fifo"))
			w.Close()
		}
		done <- err
	}()
	r, err := os.Open(fifo)
	check(t, err)
	buf := make([]byte, 64)
	n, _ := r.Read(buf)
	r.Close()
	check(t, <-done)
	if string(buf[:n]) != "through the fifo" {
		t.Fatalf("the FIFO carried %q", buf[:n])
	}

	ln, err := net.Listen("unix", sock)
	check(t, err)
	defer ln.Close()
	go func() {
		if conn, err := ln.Accept(); err == nil {
			conn.Write([]byte("through the socket"))
			conn.Close()
		}
	}()
	conn, err := net.Dial("unix", sock)
	check(t, err)
	n, _ = conn.Read(buf)
	conn.Close()
	if string(buf[:n]) != "through the socket" {
		t.Fatalf("the socket carried %q", buf[:n])
	}

	for path, mode := range map[string]uint32{fifo: syscall.S_IFIFO, sock: syscall.S_IFSOCK} {
		var st syscall.Stat_t
		check(t, syscall.Lstat(path, &st))
		if st.Mode&syscall.S_IFMT != mode || st.Size != 0 {
			t.Errorf("%s: mode %o size %d", filepath.Base(path), st.Mode, st.Size)
		}
	}
	ents, err := os.ReadDir(dir)
	check(t, err)
	for _, e := range ents {
		if want := map[string]os.FileMode{"fifo": os.ModeNamedPipe, "sock": os.ModeSocket}[e.Name()]; e.Type() != want {
			t.Errorf("readdir: %s has type %v, want %v", e.Name(), e.Type(), want)
		}
	}
	check(t, os.Remove(fifo))
	check(t, os.Remove(sock))
	if st, err := c.Statfs(context.Background()); err != nil || st.Inodes != 1 {
		t.Fatalf("after removing both: %+v, %v", st, err)
	}
}
