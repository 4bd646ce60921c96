package volfuse

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// A FUSE session is the kernel's side of a mount: the connection behind
// an open /dev/fuse file. It lasts as long as some process holds that
// file open, whichever process that is, so a session can outlive the
// server that mounted it and be served again by a new one (Adopt). The
// kernel keeps the requests nobody has read yet in its queue meanwhile,
// and processes using the mount just wait.

// Session is what a new server needs to take over a mount.
type Session struct {
	// FD is the mount's /dev/fuse file.
	FD *os.File
	// Init is the INIT request the kernel sent when the volume was
	// mounted. The kernel sends it once per session, and go-fuse will not
	// serve a session without reading it first.
	Init []byte
	// ID names the session in the keys of its requests
	// (volfs.RequestKey), so that a request the kernel sends again to a
	// new server applies once.
	ID string
	// Conn is the session's FUSE connection (the minor device number of
	// the mount), which tells whether the mount at a path is still this
	// session's.
	Conn int
}

// sessionMeta is a Session less its file, as Meta encodes it.
type sessionMeta struct {
	Init []byte `json:"init"`
	ID   string `json:"id"`
	Conn int    `json:"conn"`
}

// Meta encodes what a holder keeps of the session beside its file.
func (s Session) Meta() []byte {
	b, _ := json.Marshal(sessionMeta{Init: s.Init, ID: s.ID, Conn: s.Conn})
	return b
}

// SessionFromMeta returns the session of file f that Meta encoded as meta.
func SessionFromMeta(f *os.File, meta []byte) (Session, error) {
	var m sessionMeta
	if err := json.Unmarshal(meta, &m); err != nil {
		return Session{}, fmt.Errorf("volfuse: session: %w", err)
	}
	return Session{FD: f, Init: m.Init, ID: m.ID, Conn: m.Conn}, nil
}

const (
	// fuseMinReadBuffer is the smallest buffer the kernel accepts for a
	// read of /dev/fuse.
	fuseMinReadBuffer = 8192
	// inHeaderSize is the size of struct fuse_in_header.
	inHeaderSize = 40
	// opInit is FUSE_INIT's opcode.
	opInit = 26
	// notifyResend asks the kernel to queue again the requests that were
	// read and never answered (FUSE_NOTIFY_RESEND, protocol 7.40, Linux
	// 6.9).
	notifyResend = 7
	// resendMinor is the protocol minor version that has notifyResend.
	resendMinor = 40
)

// mountSession mounts a FUSE filesystem at dir with mount(2) (vold runs
// as root, so no fusermount) and reads the kernel's INIT request.
func mountSession(dir string, mo *fuse.MountOptions) (fd int, init []byte, err error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return -1, nil, fmt.Errorf("mount point: %w", err)
	}
	fd, err = unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, nil, fmt.Errorf("open /dev/fuse: %w", err)
	}
	data := []string{
		fmt.Sprintf("fd=%d", fd),
		fmt.Sprintf("rootmode=%o", st.Mode&unix.S_IFMT),
		fmt.Sprintf("user_id=%d", os.Geteuid()),
		fmt.Sprintf("group_id=%d", os.Getegid()),
		fmt.Sprintf("max_read=%d", mo.MaxWrite),
	}
	if mo.AllowOther {
		data = append(data, "allow_other")
	}
	data = append(data, mo.Options...)
	if err := unix.Mount(mo.FsName, dir, "fuse."+mo.Name, unix.MS_NOSUID|unix.MS_NODEV, strings.Join(data, ",")); err != nil {
		unix.Close(fd)
		return -1, nil, fmt.Errorf("mount(2): %w", err)
	}
	buf := make([]byte, fuseMinReadBuffer)
	n, err := readRetry(fd, buf)
	if err == nil && (n < inHeaderSize+8 || binary.NativeEndian.Uint32(buf[4:]) != opInit) {
		err = fmt.Errorf("first request is not INIT (%d bytes)", n)
	}
	if err != nil {
		unix.Close(fd)
		_ = unix.Unmount(dir, unix.MNT_DETACH)
		return -1, nil, fmt.Errorf("read INIT: %w", err)
	}
	return fd, buf[:n], nil
}

// initMinor returns the kernel's protocol minor version from INIT.
func initMinor(init []byte) uint32 {
	if len(init) < inHeaderSize+8 {
		return 0
	}
	return binary.NativeEndian.Uint32(init[inHeaderSize+4:])
}

// serveSession starts a go-fuse server on session fd, whose INIT request
// is init. go-fuse reads INIT from the fd it is given before anything
// else, and handles it before NewServer returns. So it is given one end
// of a socket pair that holds INIT, its answer comes back on the other
// end (and goes on to the kernel when the session is new), and then the
// session's fd is duplicated onto the socket's descriptor number, from
// which go-fuse reads the kernel's requests from then on. fd stays the
// caller's.
//
// An adopted session (fresh false) may have requests that the previous
// server read and never answered; the kernel is asked to send them again
// before this server reads anything, so that none is sent twice.
func serveSession(log *slog.Logger, fs fuse.RawFileSystem, fd int, init []byte, fresh bool, mo fuse.MountOptions) (*fuse.Server, error) {
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socketpair: %w", err)
	}
	ours, theirs := sp[0], sp[1]
	if _, err := unix.Write(ours, init); err != nil {
		unix.Close(ours)
		unix.Close(theirs)
		return nil, fmt.Errorf("hand INIT to the server: %w", err)
	}
	mo.DirectMount, mo.DirectMountStrict = false, false
	// "/dev/fd/N" is go-fuse's way to serve a descriptor already opened.
	srv, err := fuse.NewServer(fs, fmt.Sprintf("/dev/fd/%d", theirs), &mo)
	if err != nil {
		unix.Close(ours)
		return nil, fmt.Errorf("start FUSE server: %w", err)
	}
	// fail stops the server that never served: with the socket's other
	// end closed, its first read finds nothing and it closes its end.
	fail := func(err error) (*fuse.Server, error) {
		unix.Close(ours)
		srv.Serve()
		return nil, err
	}
	reply := make([]byte, fuseMinReadBuffer)
	n, err := readRetry(ours, reply)
	if err != nil {
		return fail(fmt.Errorf("read the server's INIT answer: %w", err))
	}
	if fresh {
		if _, err := unix.Write(fd, reply[:n]); err != nil {
			return fail(fmt.Errorf("answer INIT: %w", err))
		}
	}
	if err := unix.Dup3(fd, theirs, unix.O_CLOEXEC); err != nil {
		return fail(fmt.Errorf("hand the session to the server: %w", err))
	}
	unix.Close(ours)
	if !fresh {
		var hdr [16]byte
		binary.NativeEndian.PutUint32(hdr[0:], uint32(len(hdr)))
		binary.NativeEndian.PutUint32(hdr[4:], notifyResend)
		if _, err := unix.Write(fd, hdr[:]); err != nil {
			log.Warn("kernel not asked to resend the requests the previous server left unanswered", "err", err)
		}
	}
	go srv.Serve()
	return srv, nil
}

func readRetry(fd int, buf []byte) (int, error) {
	for {
		n, err := unix.Read(fd, buf)
		if !errors.Is(err, unix.EINTR) {
			return n, err
		}
	}
}

// pollHackName is the file go-fuse answers for itself (LOOKUP, OPEN,
// POLL) to let a mount's owner get the kernel's first POLL answered.
const pollHackName = ".go-fuse-epoll-hack"

// stopPolls makes the kernel stop sending POLL to the session. Go's
// runtime adds every file it opens to its epoll, and for a FUSE file that
// sends POLL to the server and waits for the answer while holding one of
// the runtime's processors: a process that serves a mount and opens files
// on it (tests; vold never does) can have every processor waiting so.
// Answered ENOSYS once, the kernel never asks again for the connection.
// Raw system calls here, which let go of the processor.
func stopPolls(dir string) error {
	fd, err := unix.Open(filepath.Join(dir, pollHackName), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", pollHackName, err)
	}
	defer unix.Close(fd)
	_, _ = unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLOUT}}, 0)
	return nil
}
