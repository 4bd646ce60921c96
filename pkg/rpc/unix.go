package rpc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// SocketMode is the permission of every local daemon socket: root and the
// socket's group (a `shoal` group where the operator made one).
const SocketMode = 0o660

// ListenUnix listens on a Unix socket at path, created with SocketMode. A
// stale socket file left by a crashed daemon is removed; a socket that
// still answers belongs to a live daemon and is an error.
func ListenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("create socket dir: %w", err)
	}
	if _, err := os.Stat(path); err == nil {
		c, err := net.DialTimeout("unix", path, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil, fmt.Errorf("socket %s is in use by another process", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket: %w", err)
		}
	}
	// NB: set the umask around bind so the socket never exists with looser
	// permissions, not even for the moment before a chmod.
	old := syscall.Umask(0o117)
	l, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := os.Chmod(path, SocketMode); err != nil {
		l.Close()
		return nil, fmt.Errorf("chmod socket: %w", err)
	}
	return l, nil
}

// DialUnix returns a dialer for grpc.WithContextDialer that connects to a
// fixed socket path, whatever address gRPC passes.
func DialUnix(path string) func(context.Context, string) (net.Conn, error) {
	return func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", path)
		if err != nil && errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("no socket at %s: %w", path, err)
		}
		return c, err
	}
}
