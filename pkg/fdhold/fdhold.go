// Package fdhold keeps a daemon's open files across its restarts: a
// small holder process, started by the daemon, keeps a copy of each file
// the daemon hands it (over a Unix socket, SCM_RIGHTS) and gives them
// all back to the next instance of the daemon.
//
// vold uses it for the /dev/fuse files of its mounts: the kernel keeps a
// FUSE mount's session alive as long as some process has its /dev/fuse
// file open, so with the holder keeping one, a mount outlives vold and
// the next vold serves it again. systemd's file-descriptor store would
// do the same under systemd; a holder works with or without it (the unit
// runs with KillMode=process, so a restart signals vold alone).
//
// The holder lives while a client is connected or it holds a live file.
// A file whose other end is gone (a FUSE connection aborted or unmounted
// reports POLLERR) is dropped. With no client for OrphanAfter, it closes
// everything and exits: a daemon that does not come back must not leave
// its mounts waiting forever.
package fdhold

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shoal-dev/shoal/pkg/daemon"
)

// Command is the first argument that makes a daemon's executable run as
// the holder (see Main).
const Command = "fd-holder"

// OrphanAfter is how long the holder keeps files without a client.
const OrphanAfter = 2 * time.Minute

// maxMsg bounds a message: a name and its metadata.
const maxMsg = 64 << 10

// Message kinds, the first byte of each message.
const (
	opPut    = 'P' // name \0 meta, with one file
	opRemove = 'R' // name
	opTake   = 'T' // (nothing): answered with opFile messages, then opEnd
	opFile   = 'F' // name \0 meta, with one file
	opEnd    = 'E'
	opOK     = 'K'
	opErr    = 'X' // error text
)

// Held is a file the holder gave back, with what it was stored with.
type Held struct {
	Name string
	File *os.File
	Meta []byte
}

// Client is a connection to a holder. Its methods are not safe for
// concurrent use.
type Client struct {
	conn *net.UnixConn
}

// Connect connects to the holder listening at socket, starting one
// (exe with Command and socket as arguments, in a session of its own)
// when none answers; started, when not nil, is then told its PID.
func Connect(socket, exe string, started func(pid int)) (*Client, error) {
	if c, err := dial(socket); err == nil {
		return c, nil
	}
	_ = os.Remove(socket)
	devnull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer devnull.Close()
	cmd := exec.Command(exe, Command, socket)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, devnull, devnull
	cmd.Env = daemon.ChildEnv(os.Environ())
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("fdhold: start holder: %w", err)
	}
	// The holder is not our child to wait for: it must outlive us.
	go func() { _ = cmd.Wait() }()
	if started != nil {
		started(cmd.Process.Pid)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := dial(socket)
		if err == nil {
			return c, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("fdhold: holder at %s does not answer: %w", socket, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func dial(socket string) (*Client, error) {
	conn, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: socket, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	return &Client{conn: conn}, nil
}

// Close closes the connection; the holder keeps the files.
func (c *Client) Close() error { return c.conn.Close() }

// Put hands the holder a copy of f under name (replacing what it held
// under that name), with meta.
func (c *Client) Put(name string, f *os.File, meta []byte) error {
	if err := c.send(opPut, entry(name, meta), int(f.Fd())); err != nil {
		return err
	}
	return c.ack()
}

// Remove makes the holder drop the file under name (if any).
func (c *Client) Remove(name string) error {
	if err := c.send(opRemove, []byte(name), -1); err != nil {
		return err
	}
	return c.ack()
}

// Take returns copies of every file the holder has (it keeps them).
func (c *Client) Take() ([]Held, error) {
	if err := c.send(opTake, nil, -1); err != nil {
		return nil, err
	}
	var out []Held
	for {
		op, body, fd, err := recv(c.conn)
		if err != nil {
			closeHeld(out)
			return nil, err
		}
		switch op {
		case opEnd:
			return out, nil
		case opFile:
			name, meta := split(body)
			if fd < 0 {
				closeHeld(out)
				return nil, fmt.Errorf("fdhold: %q came without a file", name)
			}
			out = append(out, Held{Name: name, File: os.NewFile(uintptr(fd), name), Meta: meta})
		default:
			closeHeld(out)
			return nil, fmt.Errorf("fdhold: unexpected message %q", op)
		}
	}
}

func closeHeld(hs []Held) {
	for _, h := range hs {
		h.File.Close()
	}
}

func (c *Client) send(op byte, body []byte, fd int) error {
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	if _, _, err := c.conn.WriteMsgUnix(append([]byte{op}, body...), oob, nil); err != nil {
		return fmt.Errorf("fdhold: send: %w", err)
	}
	return nil
}

func (c *Client) ack() error {
	op, body, fd, err := recv(c.conn)
	if fd >= 0 {
		unix.Close(fd)
	}
	switch {
	case err != nil:
		return err
	case op == opOK:
		return nil
	case op == opErr:
		return fmt.Errorf("fdhold: holder: %s", body)
	}
	return fmt.Errorf("fdhold: unexpected answer %q", op)
}

// recv reads one message and the file that came with it (fd -1 if none).
func recv(conn *net.UnixConn) (op byte, body []byte, fd int, err error) {
	buf := make([]byte, maxMsg)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil {
		return 0, nil, -1, fmt.Errorf("fdhold: receive: %w", err)
	}
	fd = -1
	if oobn > 0 {
		msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
		if perr != nil {
			return 0, nil, -1, fmt.Errorf("fdhold: control message: %w", perr)
		}
		for _, m := range msgs {
			fds, rerr := unix.ParseUnixRights(&m)
			if rerr != nil {
				continue
			}
			for _, f := range fds {
				if fd < 0 {
					fd = f
				} else {
					unix.Close(f) // one file per message
				}
			}
		}
	}
	if n == 0 {
		if fd >= 0 {
			unix.Close(fd)
		}
		return 0, nil, -1, fmt.Errorf("fdhold: receive: %w", errClosed)
	}
	return buf[0], buf[1:n], fd, nil
}

var errClosed = errors.New("connection closed")

func entry(name string, meta []byte) []byte {
	b := append([]byte(name), 0)
	return append(b, meta...)
}

func split(body []byte) (string, []byte) {
	name, meta, _ := bytes.Cut(body, []byte{0})
	return string(name), meta
}
