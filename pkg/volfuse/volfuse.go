package volfuse

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
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
}

// Mount serves c's volume at dir (an existing directory) until Unmount.
func Mount(dir string, c *volfs.Client, opts Options) (*Server, error) {
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
	root := &node{vol: &volume{c: c, log: log, cached: opts.CachedIO}}
	// Zero timeouts: the kernel asks again for every lookup and stat, so
	// a change made through another node is seen at once. Correctness
	// across nodes matters more here than saving round trips.
	var zero time.Duration
	fo := &fs.Options{
		EntryTimeout:    &zero,
		AttrTimeout:     &zero,
		NegativeTimeout: &zero,
		RootStableAttr:  &fs.StableAttr{Ino: volfs.RootIno, Gen: generation},
		// Permissions come from the inodes (default_permissions), never
		// from go-fuse's defaults.
		NullPermissions: true,
		Logger:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		MountOptions: fuse.MountOptions{
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
			// vold runs as root: mount(2) directly, fusermount as fallback.
			DirectMount: true,
			Debug:       opts.Debug,
			Logger:      slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		},
	}
	srv, err := fs.Mount(dir, root, fo)
	if err != nil {
		return nil, fmt.Errorf("volfuse: mount %s: %w", dir, err)
	}
	log.Info("volume mounted", "fsname", opts.FsName)
	return &Server{dir: dir, srv: srv, log: log}, nil
}

// Dir returns the mount point.
func (s *Server) Dir() string { return s.dir }

// Unmount unmounts the volume. When the mount is busy (a process has a
// file open or its working directory inside), it detaches it lazily
// instead: the mount disappears from the namespace at once, and the
// server keeps serving the open files until they are closed (Wait returns
// then).
func (s *Server) Unmount() error {
	err := s.srv.Unmount()
	if err == nil {
		s.log.Info("volume unmounted")
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
func (s *Server) Wait() { s.srv.Wait() }

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
	conn, ok := fuseMountConn(dir)
	if !ok {
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

// fuseMountConn returns the FUSE connection of the mount at dir (the
// minor number of its device), if dir is a FUSE mount point.
func fuseMountConn(dir string) (string, bool) {
	m, ok := mountAt(dir)
	if !ok || !strings.HasPrefix(m.FSType, "fuse") {
		return "", false
	}
	return strconv.Itoa(m.Minor), true
}

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
func abortConn(conn string) error {
	path := filepath.Join(fusectlDir, conn, "abort")
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		if err := unix.Mount("fusectl", fusectlDir, "fusectl", 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount fusectl: %w", err)
		}
	}
	if err := os.WriteFile(path, []byte("1"), 0); err != nil {
		return fmt.Errorf("abort FUSE connection %s: %w", conn, err)
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
}

// errno maps a Client error for the kernel, logging failures that are
// not plain file system errors (a lost quorum, a dead backend).
func (v *volume) errno(op string, err error) syscall.Errno {
	if err == nil {
		return 0
	}
	e := volfs.Errno(err)
	var plain syscall.Errno
	if !errors.As(err, &plain) && !errors.Is(err, context.Canceled) {
		v.log.Warn("volume request failed", "op", op, "err", err)
	}
	return e
}

// ctxCaller returns the uid and gid of the process making a request.
func ctxCaller(ctx context.Context) (uint32, uint32) {
	if c, ok := fuse.FromContext(ctx); ok {
		return c.Uid, c.Gid
	}
	return 0, 0
}
