package fdhold

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Main runs the holder (args: the socket path) until it has nothing to
// hold and no client, and returns the exit code.
func Main(args []string) int {
	if len(args) != 1 {
		fmt.Fprintf(os.Stderr, "usage: %s SOCKET\n", Command)
		return 2
	}
	// Nothing of the daemon's (a mount, say) stays busy because of us.
	_ = os.Chdir("/")
	if err := Serve(args[0], OrphanAfter, time.Second); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", Command, err)
		return 1
	}
	return 0
}

// emptyGrace is how long a holder with nothing to hold waits for a client.
const emptyGrace = 5 * time.Second

// holder is the holder's state.
type holder struct {
	mu      sync.Mutex
	files   map[string]heldFile
	clients int
	// alone is when the last client left (zero while one is connected).
	alone time.Time
}

type heldFile struct {
	fd   int
	meta []byte
}

// Serve listens at socket and holds files until it has none and no
// client, or none has connected for orphanAfter; it checks its files for
// dead ones every check.
func Serve(socket string, orphanAfter, check time.Duration) error {
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: socket, Net: "unixpacket"})
	if err != nil {
		return err
	}
	defer l.Close()
	h := &holder{files: map[string]heldFile{}, alone: time.Now()}
	go func() {
		for {
			conn, err := l.AcceptUnix()
			if err != nil {
				return
			}
			h.mu.Lock()
			h.clients++
			h.alone = time.Time{}
			h.mu.Unlock()
			go h.serve(conn)
		}
	}()
	t := time.NewTicker(check)
	defer t.Stop()
	for range t.C {
		if h.tick(orphanAfter) {
			return nil
		}
	}
	return nil
}

// tick drops dead files and says whether the holder should exit.
func (h *holder) tick(orphanAfter time.Duration) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for name, f := range h.files {
		if dead(f.fd) {
			unix.Close(f.fd)
			delete(h.files, name)
		}
	}
	if h.clients > 0 {
		return false
	}
	// Empty, the holder waits a little for a client (the daemon that
	// started it is about to connect).
	if len(h.files) == 0 && time.Since(h.alone) > emptyGrace || time.Since(h.alone) > orphanAfter {
		for name, f := range h.files {
			unix.Close(f.fd)
			delete(h.files, name)
		}
		return true
	}
	return false
}

// dead reports whether fd's other end is gone: poll reports an error or
// hang-up whatever events are asked for.
func dead(fd int) bool {
	p := []unix.PollFd{{Fd: int32(fd)}}
	n, err := unix.Poll(p, 0)
	return err == nil && n > 0 && p[0].Revents&(unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) != 0
}

func (h *holder) serve(conn *net.UnixConn) {
	defer func() {
		conn.Close()
		h.mu.Lock()
		h.clients--
		if h.clients == 0 {
			h.alone = time.Now()
		}
		h.mu.Unlock()
	}()
	for {
		op, body, fd, err := recv(conn)
		if err != nil {
			return
		}
		if err := h.handle(conn, op, body, fd); err != nil {
			return
		}
	}
}

func (h *holder) handle(conn *net.UnixConn, op byte, body []byte, fd int) error {
	reply := func(op byte, body []byte, fd int) error {
		var oob []byte
		if fd >= 0 {
			oob = unix.UnixRights(fd)
		}
		_, _, err := conn.WriteMsgUnix(append([]byte{op}, body...), oob, nil)
		return err
	}
	switch op {
	case opPut:
		name, meta := split(body)
		if fd < 0 {
			return reply(opErr, []byte("put without a file"), -1)
		}
		h.mu.Lock()
		if old, ok := h.files[name]; ok {
			unix.Close(old.fd)
		}
		h.files[name] = heldFile{fd: fd, meta: append([]byte(nil), meta...)}
		h.mu.Unlock()
		return reply(opOK, nil, -1)
	case opRemove:
		h.mu.Lock()
		if old, ok := h.files[string(body)]; ok {
			unix.Close(old.fd)
			delete(h.files, string(body))
		}
		h.mu.Unlock()
		return reply(opOK, nil, -1)
	case opTake:
		h.mu.Lock()
		files := make(map[string]heldFile, len(h.files))
		for name, f := range h.files {
			// Copies, so that a file dropped meanwhile is not closed
			// under the message that carries it.
			d, err := unix.FcntlInt(uintptr(f.fd), unix.F_DUPFD_CLOEXEC, 0)
			if err != nil {
				continue
			}
			files[name] = heldFile{fd: d, meta: f.meta}
		}
		h.mu.Unlock()
		var errs []error
		for name, f := range files {
			errs = append(errs, reply(opFile, entry(name, f.meta), f.fd))
			unix.Close(f.fd)
		}
		if err := errors.Join(errs...); err != nil {
			return err
		}
		return reply(opEnd, nil, -1)
	}
	if fd >= 0 {
		unix.Close(fd)
	}
	return reply(opErr, fmt.Appendf(nil, "unknown message %q", op), -1)
}
