package vold

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/shoal-dev/shoal/pkg/daemon"
	"github.com/shoal-dev/shoal/pkg/fdhold"
	"github.com/shoal-dev/shoal/pkg/volfs"
	"github.com/shoal-dev/shoal/pkg/volfuse"
)

// Mounts across restarts. Each mount's FUSE session (its /dev/fuse file
// and the INIT the kernel sent) is handed to a holder process
// (pkg/fdhold) started from vold's own executable; the kernel keeps a
// session alive while any process has its file open. After a restart,
// vold takes the sessions back and serves each again (volfuse.Adopt),
// so the tasks using a volume keep their mount: their requests wait in
// the kernel's queue while no vold serves them. A vold that does not come
// back within fdhold.OrphanAfter loses its mounts as before (the tasks
// get ENOTCONN and schedd restarts them).

// holderExe is the executable the holder runs from (vold's own). Main
// sets it; in-process users of the package (tests) leave it empty, and
// their mounts die with them.
var holderExe string

// holderSocket is where the holder listens.
func (n *node) holderSocket() string { return filepath.Join(n.cfg.RunDir, "vold-fds.sock") }

// sessions hands FUSE sessions to the holder and takes them back.
type sessions struct {
	mu  sync.Mutex
	c   *fdhold.Client // nil: not kept
	log *slog.Logger
}

// connectSessions connects to (or starts) the holder when mounts are to
// be kept.
func connectSessions(log *slog.Logger, keep bool, socket string) *sessions {
	s := &sessions{log: log}
	if !keep || holderExe == "" {
		return s
	}
	c, err := fdhold.Connect(socket, holderExe, func(pid int) {
		daemon.MoveToOwnScope(log, pid, "shoal-vold-fds", "Shoal vold's FUSE session holder", "shoal-vold.service", "shoal-schedd.service")
	})
	if err != nil {
		log.Warn("no FUSE session holder: mounts will not outlive this vold", "err", err)
		return s
	}
	s.c = c
	return s
}

// kept reports whether sessions are handed to a holder.
func (s *sessions) kept() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.c != nil
}

// put hands srv's session to the holder under the volume's name.
func (s *sessions) put(name string, srv *volfuse.Server) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.c == nil {
		return
	}
	sess, err := srv.Session()
	if err != nil {
		s.log.Warn("FUSE session not kept", "volume", name, "err", err)
		return
	}
	defer sess.FD.Close()
	if err := s.c.Put(name, sess.FD, sess.Meta()); err != nil {
		s.log.Warn("FUSE session not kept", "volume", name, "err", err)
	}
}

// remove makes the holder drop a volume's session.
func (s *sessions) remove(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.c == nil {
		return
	}
	if err := s.c.Remove(name); err != nil {
		s.log.Warn("drop kept FUSE session", "volume", name, "err", err)
	}
}

// take returns the sessions the holder kept, by volume name.
func (s *sessions) take() map[string]volfuse.Session {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]volfuse.Session{}
	if s.c == nil {
		return out
	}
	held, err := s.c.Take()
	if err != nil {
		s.log.Warn("take kept FUSE sessions", "err", err)
		return out
	}
	for _, h := range held {
		sess, err := volfuse.SessionFromMeta(h.File, h.Meta)
		if err != nil {
			s.log.Warn("kept FUSE session unreadable; dropping it", "volume", h.Name, "err", err)
			h.File.Close()
			_ = s.c.Remove(h.Name)
			continue
		}
		out[h.Name] = sess
	}
	return out
}

// close disconnects from the holder (which keeps what it holds).
func (s *sessions) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.c != nil {
		s.c.Close()
		s.c = nil
	}
}

// fuseOptions are the options of a volume's mount on node (the holder of
// the files unlinked there while open).
func fuseOptions(log *slog.Logger, node, name string) volfuse.Options {
	return volfuse.Options{FsName: "shoal:" + name, Node: node, Logger: log.With("component", "fuse", "volume", name)}
}

// mountFUSE serves a volume's filesystem with FUSE at dir.
func mountFUSE(log *slog.Logger, dir, node, name string, c *volfs.Client) (*volfuse.Server, error) {
	return volfuse.Mount(dir, c, fuseOptions(log, node, name))
}

// adoptFUSE serves a kept session of the volume's mount at dir again.
func adoptFUSE(log *slog.Logger, dir, node, name string, sess volfuse.Session, c *volfs.Client) (*volfuse.Server, error) {
	return volfuse.Adopt(dir, sess, c, fuseOptions(log, node, name))
}

// cleanStaleMounts detaches the dead FUSE mounts a killed vold left in
// dir (one directory per volume), so that they can be mounted again.
// Those in keep are live (adopted) and left alone.
func cleanStaleMounts(dir string, keep map[string]bool) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if keep[e.Name()] {
			continue
		}
		if err := volfuse.CleanStale(filepath.Join(dir, e.Name())); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", e.Name(), err))
		}
	}
	return errors.Join(errs...)
}
