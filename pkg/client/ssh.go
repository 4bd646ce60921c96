package client

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"al.essio.dev/pkg/shellescape"
	"github.com/mattn/go-shellwords"
)

// A run dir of the form ssh://[user@]host[:port][/remote/run/dir] names
// another node's daemons, reached through the system's ssh client (so
// that ~/.ssh/config, agents and jump hosts apply as for any ssh): each
// connection runs `shoalctl dial-stdio NAME` on that node, which joins
// ssh's standard input and output to NAME's socket, as Docker's
// ssh:// hosts run `docker system dial-stdio`. Files a command reads or
// writes (stack files, image archives, `cp`) stay on this machine.
const sshScheme = "ssh"

// SSHCommandEnv overrides the ssh client command (words split as a shell
// splits them, as GIT_SSH_COMMAND), e.g. "ssh -i key".
const SSHCommandEnv = "SHOAL_SSH_COMMAND"

// RemoteCtlEnv overrides the shoalctl run on the other node (default
// "shoalctl", found in the remote shell's PATH).
const RemoteCtlEnv = "SHOAL_REMOTE_CTL"

// parseSSH reports whether runDir is an ssh:// run dir, and parses it.
func parseSSH(runDir string) (*url.URL, bool, error) {
	if !strings.HasPrefix(runDir, sshScheme+"://") {
		return nil, false, nil
	}
	u, err := url.Parse(runDir)
	switch {
	case err != nil:
		return nil, true, fmt.Errorf("host %q: %w", runDir, err)
	case u.Hostname() == "":
		return nil, true, fmt.Errorf("host %q: no host name: want ssh://[user@]host[:port]", runDir)
	case u.RawQuery != "" || u.Fragment != "" || u.Opaque != "":
		return nil, true, fmt.Errorf("host %q: want ssh://[user@]host[:port][/run/dir]", runDir)
	}
	if _, set := u.User.Password(); set {
		return nil, true, fmt.Errorf("host %q: a password in the URL is not supported: use keys or an agent", runDir)
	}
	return u, true, nil
}

// SSHRunDir is the run dir of the daemons of host (ssh://[user@]host[:port])
// through ssh, runDir on that node ("": its default).
func SSHRunDir(host, runDir string) (string, error) {
	u, remote, err := parseSSH(host)
	switch {
	case err != nil:
		return "", err
	case !remote:
		return "", fmt.Errorf("host %q: want ssh://[user@]host[:port]", host)
	case u.Path != "" && u.Path != "/":
		return "", fmt.Errorf("host %q: want ssh://[user@]host[:port], the run dir apart", host)
	case runDir != "" && !path.IsAbs(runDir):
		return "", fmt.Errorf("run dir %q: want the absolute run dir on that node", runDir)
	}
	u.Path = ""
	if runDir != "" {
		u.Path = path.Clean(runDir)
	}
	return u.String(), nil
}

// SocketPath names a daemon's socket in runDir, local or ssh://.
func SocketPath(runDir, name string) string {
	if strings.HasPrefix(runDir, sshScheme+"://") {
		return strings.TrimSuffix(runDir, "/") + "/" + name + ".sock"
	}
	return filepath.Join(runDir, name+".sock")
}

// sshArgs is the ssh command line that reaches daemon name at u.
func sshArgs(u *url.URL, name string) ([]string, error) {
	args, err := shellwords.Parse(os.Getenv(SSHCommandEnv))
	if err != nil {
		return nil, fmt.Errorf("$%s: %w", SSHCommandEnv, err)
	}
	if len(args) == 0 {
		args = []string{"ssh"}
	}
	if user := u.User.Username(); user != "" {
		args = append(args, "-l", user)
	}
	if port := u.Port(); port != "" {
		args = append(args, "-p", port)
	}
	remote := []string{cmp.Or(os.Getenv(RemoteCtlEnv), "shoalctl")}
	if dir := u.Path; dir != "" && dir != "/" {
		if !path.IsAbs(dir) {
			return nil, fmt.Errorf("remote run dir %q: want an absolute path", dir)
		}
		remote = append(remote, "--run-dir", path.Clean(dir))
	}
	remote = append(remote, "dial-stdio", name)
	quoted := make([]string, len(remote))
	for i, w := range remote {
		quoted[i] = shellescape.Quote(w)
	}
	// ssh hands the command to the remote user's shell as one string.
	return append(args, "--", u.Hostname(), strings.Join(quoted, " ")), nil
}

// dialSSH returns a dialer for grpc.WithContextDialer that runs ssh to
// daemon name at u and speaks over its standard input and output.
func dialSSH(u *url.URL, name string) func(context.Context, string) (net.Conn, error) {
	return func(ctx context.Context, _ string) (net.Conn, error) {
		args, err := sshArgs(u, name)
		if err != nil {
			return nil, err
		}
		// Not CommandContext: the connection outlives the dial's context.
		cmd := exec.Command(args[0], args[1:]...)
		return startCommandConn(cmd)
	}
}

// commandConn is a net.Conn over a command's standard input and output.
type commandConn struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout io.ReadCloser
	stderr *lockedBuffer
	done   chan struct{} // closed once the command exited
	err    error         // its exit, set before done closes

	closeOnce sync.Once
}

func startCommandConn(cmd *exec.Cmd) (*commandConn, error) {
	c := &commandConn{cmd: cmd, stderr: &lockedBuffer{}, done: make(chan struct{})}
	// Pipes of our own, not StdinPipe and StdoutPipe: Wait closes those
	// once the command exits, under a Read of what it wrote last.
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, err
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, c.stderr
	err = cmd.Start()
	inR.Close() // the command's ends
	outW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		return nil, fmt.Errorf("run %s: %w", cmd.Path, err)
	}
	c.stdin, c.stdout = inW, outR
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

// Read reads the command's output; at its end, it says why the command
// ended (ssh's own message: no route, refused, denied), which gRPC then
// reports instead of a bare EOF.
func (c *commandConn) Read(p []byte) (int, error) {
	n, err := c.stdout.Read(p)
	if errors.Is(err, io.EOF) {
		select {
		case <-c.done:
		case <-time.After(2 * time.Second):
		}
		if msg := strings.TrimSpace(c.stderr.String()); msg != "" {
			return n, errors.New(lastLine(msg))
		}
	}
	return n, err
}

func (c *commandConn) Write(p []byte) (int, error) { return c.stdin.Write(p) }

// Close ends the input, which ends the remote dial-stdio, and stops the
// command if it does not exit by itself soon.
func (c *commandConn) Close() error {
	c.closeOnce.Do(func() {
		c.stdin.Close()
		select {
		case <-c.done:
		case <-time.After(3 * time.Second):
			c.cmd.Process.Kill()
			<-c.done
		}
		c.stdout.Close()
	})
	return nil
}

func (c *commandConn) LocalAddr() net.Addr                { return commandAddr{} }
func (c *commandConn) RemoteAddr() net.Addr               { return commandAddr{} }
func (c *commandConn) SetDeadline(t time.Time) error      { return nil }
func (c *commandConn) SetReadDeadline(t time.Time) error  { return nil }
func (c *commandConn) SetWriteDeadline(t time.Time) error { return nil }

type commandAddr struct{}

func (commandAddr) Network() string { return "command" }
func (commandAddr) String() string  { return "command" }

func lastLine(s string) string {
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// lockedBuffer collects a command's standard error, read while written.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf.Len() > 64<<10 {
		return len(p), nil // enough to say what went wrong
	}
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
