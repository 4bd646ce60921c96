package volfuse

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/shoal-dev/shoal/pkg/volfs"
)

// Options configure a mount.
type Options struct {
	// FsName is the mount's source as mount(8) and /proc/mounts show it,
	// e.g. "shoal:<volume>" (default "shoal").
	FsName string
	// Name is the filesystem subtype: the mount's type is "fuse.<Name>"
	// (default "shoal").
	Name string
	// Debug logs every FUSE request (through Logger, at debug level).
	Debug bool
	// Logger receives the adapter's messages (default: discarded).
	Logger *slog.Logger
	// Node names the node the mount is on. Files unlinked while open
	// here are held for it and its session, and a new mount (not an
	// adopted one) frees those its node's earlier sessions held.
	Node string
	// CachedIO lets the kernel cache file data while a file is open
	// (dropped at every open) instead of direct I/O. It allows shared
	// writable mmap, at the price that an open file may not see another
	// node's later writes. Off by default.
	CachedIO bool
}

// Server is a mounted volume.
type Server struct {
	dir string
	srv *fuse.Server
	log *slog.Logger
	vol *volume
	// fd is this server's own copy of the session's /dev/fuse file (the
	// server reads from another), and init the session's INIT request:
	// what Session hands on.
	fd        int
	init      []byte
	conn      int
	closeOnce sync.Once
}

// Mount serves c's volume at dir (an existing directory) until Unmount.
func Mount(dir string, c *volfs.Client, opts Options) (*Server, error) {
	s, mo := newServer(dir, c, opts, newSessionID())
	fd, init, err := mountSession(dir, &mo)
	if err != nil {
		return nil, fmt.Errorf("volfuse: mount %s: %w", dir, err)
	}
	if err := s.serve(fd, init, true, mo); err != nil {
		unix.Close(fd)
		_ = unix.Unmount(dir, unix.MNT_DETACH)
		return nil, fmt.Errorf("volfuse: mount %s: %w", dir, err)
	}
	if err := stopPolls(dir); err != nil {
		_ = s.Unmount()
		s.Wait()
		return nil, fmt.Errorf("volfuse: mount %s: %w", dir, err)
	}
	s.log.Info("volume mounted", "fsname", opts.FsName)
	// The node's earlier sessions of the volume are gone (one mount per
	// volume and node; this one is new): what they held open is not.
	go s.vol.forgetAll(true)
	return s, nil
}

// Adopt serves again the session of the mount at dir that an earlier
// server (a vold since restarted) handed on (Server.Session): the mount
// and the files open on it carry on. Requests the earlier server read and
// never answered are sent again by the kernel; a kernel that cannot
// (before Linux 6.9) would leave them waiting forever, so there Adopt
// refuses. sess.FD stays the caller's.
func Adopt(dir string, sess Session, c *volfs.Client, opts Options) (*Server, error) {
	if conn := MountedConn(dir); conn != sess.Conn {
		return nil, fmt.Errorf("volfuse: adopt %s: the mount there is not the session's (connection %d, want %d)", dir, conn, sess.Conn)
	}
	if m := initMinor(sess.Init); m < resendMinor {
		return nil, fmt.Errorf("volfuse: adopt %s: the kernel's FUSE protocol 7.%d cannot resend the requests left unanswered (7.%d can)", dir, m, resendMinor)
	}
	if sess.ID == "" {
		return nil, fmt.Errorf("volfuse: adopt %s: session without an ID", dir)
	}
	fd, err := unix.FcntlInt(sess.FD.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("volfuse: adopt %s: %w", dir, err)
	}
	s, mo := newServer(dir, c, opts, sess.ID)
	if err := s.serve(fd, sess.Init, false, mo); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("volfuse: adopt %s: %w", dir, err)
	}
	s.log.Info("volume mount taken over", "fsname", opts.FsName)
	return s, nil
}

// MountedConn returns the FUSE connection of the mount at dir, or -1 when
// dir is not a FUSE mount point.
func MountedConn(dir string) int {
	m, ok := mountAt(dir)
	if !ok || !strings.HasPrefix(m.FSType, "fuse") {
		return -1
	}
	return m.Minor
}

// newSessionID draws the name of a new session.
func newSessionID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func newServer(dir string, c *volfs.Client, opts Options, session string) (*Server, fuse.MountOptions) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.FsName == "" {
		opts.FsName = "shoal"
	}
	if opts.Name == "" {
		opts.Name = "shoal"
	}
	log := opts.Logger.With("mountpoint", dir)
	vol := &volume{c: c, log: log, cached: opts.CachedIO, session: session, node: opts.Node}
	mo := fuse.MountOptions{
		// The kernel enforces mode bits (default_permissions), and
		// processes of any user — root in a container included — may
		// use the mount (allow_other; vold runs as root).
		AllowOther: true,
		Options:    []string{"default_permissions"},
		FsName:     opts.FsName,
		Name:       opts.Name,
		// One op per write up to the chunk size Client uses anyway.
		MaxWrite: volfs.MaxWriteChunk,
		// READDIRPLUS would look up every entry of a listing (one
		// linearizable read each) whether or not it is needed.
		DisableReadDirPlus: true,
		Debug:              opts.Debug,
		Logger:             slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	return &Server{dir: dir, log: log, vol: vol, fd: -1}, mo
}

// serve serves session fd (which the server then owns).
func (s *Server) serve(fd int, init []byte, fresh bool, mo fuse.MountOptions) error {
	srv, err := serveSession(s.log, newRawFS(s.vol), fd, init, fresh, mo)
	if err != nil {
		return err
	}
	s.srv, s.fd, s.init, s.conn = srv, fd, init, MountedConn(s.dir)
	return nil
}

// Dir returns the mount point.
func (s *Server) Dir() string { return s.dir }

// Session returns what a later server needs to serve this mount again
// (Adopt): a copy of its /dev/fuse file, which the caller closes, and its
// INIT. Whoever holds the copy keeps the mount alive after this process
// is gone.
func (s *Server) Session() (Session, error) {
	fd, err := unix.FcntlInt(uintptr(s.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return Session{}, fmt.Errorf("volfuse: session of %s: %w", s.dir, err)
	}
	return Session{FD: os.NewFile(uintptr(fd), "/dev/fuse"), Init: s.init, ID: s.vol.session, Conn: s.conn}, nil
}

// Detach readies the server for its process's exit while the session
// lives on (Session): from now on a request that fails for any reason but
// a file system error (the backend is shutting down) is left unanswered,
// for the next server to get again from the kernel.
func (s *Server) Detach() { s.vol.detached.Store(true) }

// Unmount unmounts the volume. When the mount is busy (a process has a
// file open or its working directory inside), it detaches it lazily
// instead: the mount disappears from the namespace at once, and the
// server keeps serving the open files until they are closed (Wait returns
// then).
func (s *Server) Unmount() error {
	err := unix.Unmount(s.dir, 0)
	if err == nil {
		s.log.Info("volume unmounted")
		// Nothing is open any more: free what a forget missed, or what
		// a predecessor's handles kept.
		go s.vol.forgetAll(false)
		return nil
	}
	if derr := unix.Unmount(s.dir, unix.MNT_DETACH); derr != nil {
		if errors.Is(derr, unix.EINVAL) && !isMountPoint(s.dir) {
			// Already gone (someone else unmounted it).
			return nil
		}
		return fmt.Errorf("volfuse: unmount %s: %w (lazy unmount: %w)", s.dir, err, derr)
	}
	s.log.Warn("volume busy, detached lazily", "err", err)
	return nil
}

// Wait blocks until the server has stopped serving (after Unmount, once
// the kernel has released the mount).
func (s *Server) Wait() {
	s.srv.Wait()
	s.closeOnce.Do(func() { unix.Close(s.fd) })
}

// CleanStale detaches a FUSE mount at dir whose server is gone (a killed
// vold), so that a new server can mount at the same path. A live mount,
// or no mount, is left alone.
//
// A killed server's mount answers ENOTCONN ("transport endpoint is not
// connected"). But a server killed while a thread of its own waited on
// its mount (a stat or lookup there, as go-fuse makes when it mounts)
// never finishes dying: the kernel waits, uninterruptibly, for an answer
// only that process could give, so the process keeps the connection open
// and every access to the mount, the new server's included, waits too.
// So a mount that does not answer a stat within staleAfter counts as dead
// as well, and its FUSE connection is aborted (fusectl) before it is
// detached: that fails every request waiting on it and lets the old
// server exit.
func CleanStale(dir string) error {
	conn := MountedConn(dir)
	if conn < 0 {
		return nil
	}
	stat := make(chan error, 1)
	go func() { _, err := os.Stat(dir); stat <- err }()
	select {
	case err := <-stat:
		if err == nil || !errors.Is(err, syscall.ENOTCONN) && !errors.Is(err, syscall.ECONNABORTED) {
			return nil
		}
	case <-time.After(staleAfter):
		if err := abortConn(conn); err != nil {
			return fmt.Errorf("volfuse: %s does not answer: %w", dir, err)
		}
	}
	if uerr := unix.Unmount(dir, unix.MNT_DETACH); uerr != nil {
		return fmt.Errorf("volfuse: clean stale mount %s: %w", dir, uerr)
	}
	if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("volfuse: %s after unmounting the stale mount: %w", dir, err)
	}
	return nil
}

// staleAfter is how long CleanStale waits for a mount to answer.
const staleAfter = 2 * time.Second

// fusectlDir is where the kernel lists FUSE connections (fusectl).
const fusectlDir = "/sys/fs/fuse/connections"

// mountAt returns the mount at dir, the one on top if several are.
func mountAt(dir string) (*mountinfo.Info, bool) {
	ms, err := mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) {
		return m.Mountpoint != dir, false
	})
	if err != nil || len(ms) == 0 {
		return nil, false
	}
	return ms[len(ms)-1], true
}

// abortConn aborts FUSE connection conn, mounting fusectl first where the
// system has not.
func abortConn(conn int) error {
	path := filepath.Join(fusectlDir, strconv.Itoa(conn), "abort")
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		if err := unix.Mount("fusectl", fusectlDir, "fusectl", 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount fusectl: %w", err)
		}
	}
	if err := os.WriteFile(path, []byte("1"), 0); err != nil {
		return fmt.Errorf("abort FUSE connection %d: %w", conn, err)
	}
	return nil
}

// isMountPoint reports whether dir is listed as a mount point.
func isMountPoint(dir string) bool {
	_, ok := mountAt(dir)
	return ok
}

// volume is what every node of a mount shares.
type volume struct {
	c      *volfs.Client
	log    *slog.Logger
	cached bool
	// session names the FUSE session (Session.ID), node the node (Options.Node).
	session, node string
	// detached: see Server.Detach.
	detached atomic.Bool
}

// errno maps a Client error for the kernel, logging failures that are
// not plain file system errors (a lost quorum, a dead backend).
func (v *volume) errno(op string, err error) syscall.Errno {
	if err == nil {
		return 0
	}
	e := volfs.Errno(err)
	var plain syscall.Errno
	fsError := errors.As(err, &plain)
	if !fsError && v.detached.Load() {
		// Left for the next server (the kernel sends it again).
		select {}
	}
	if !fsError && !errors.Is(err, context.Canceled) {
		v.log.Warn("volume request failed", "op", op, "err", err)
	}
	return e
}
