package wg

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/ipc"
	"golang.zx2c4.com/wireguard/tun"

	"github.com/shoal-dev/shoal/pkg/daemon"
)

// SocketDir holds the UAPI sockets of userspace WireGuard devices
// (<iface>.sock). It is one directory for every network namespace of the
// machine, so interface names must be unique machine-wide, not just per
// namespace; wgctrl finds userspace devices there whatever namespace the
// caller is in.
const SocketDir = "/var/run/wireguard"

// SocketPath is the UAPI socket of userspace device iface.
func SocketPath(iface string) string { return filepath.Join(SocketDir, iface+".sock") }

// DefaultMTU is the holder's MTU when none is given: 1500 − 80.
const DefaultMTU = 1420

// ErrHolderRunning means a holder already serves the interface's socket.
var ErrHolderRunning = errors.New("wg: holder already running")

func checkIface(iface string) error {
	if iface == "" || len(iface) >= unix.IFNAMSIZ || strings.ContainsAny(iface, "/ \t\n:") || iface == "." || iface == ".." {
		return fmt.Errorf("wg: bad interface name %q (1–%d characters, no '/', ':' or spaces)", iface, unix.IFNAMSIZ-1)
	}
	return nil
}

// RunHolder runs userspace WireGuard device iface in this process until
// ctx is done: it creates the TUN device (MTU mtu, DefaultMTU if 0) in the
// process's network namespace, starts wireguard-go on it, brings the link
// up and serves the UAPI socket SocketPath(iface) (0600 in a 0755 dir)
// for wgctrl. On return the socket is removed and the device closed (the
// TUN link disappears with it). It also returns when the socket file is
// deleted or the device fails. It refuses to start if another holder
// answers on the socket.
//
// It is meant to run in a process of its own (HolderMain, `shoal-netd
// wg-holder`) so that the tunnel outlives its configurer. wireguard-go
// logs errors on stdout (SHOAL_WG_LOG=verbose for more, =silent for none).
func RunHolder(ctx context.Context, iface string, mtu int) error {
	if err := checkIface(iface); err != nil {
		return err
	}
	if mtu <= 0 {
		mtu = DefaultMTU
	}
	if pid, err := probe(iface, true); err == nil {
		return fmt.Errorf("%w: %s (pid %d)", ErrHolderRunning, iface, pid)
	}
	tdev, err := tun.CreateTUN(iface, mtu)
	if err != nil {
		return fmt.Errorf("wg: create TUN %s: %w", iface, err)
	}
	if real, err := tdev.Name(); err == nil && real != iface {
		tdev.Close()
		return fmt.Errorf("wg: TUN came up as %s, not %s", real, iface)
	}
	level := device.LogLevelError
	switch os.Getenv("SHOAL_WG_LOG") {
	case "verbose", "debug":
		level = device.LogLevelVerbose
	case "silent":
		level = device.LogLevelSilent
	}
	dev := device.NewDevice(tdev, conn.NewDefaultBind(), device.NewLogger(level, fmt.Sprintf("(%s) ", iface)))
	defer dev.Close() // closes the TUN too

	link, err := netlink.LinkByName(iface)
	if err == nil {
		err = netlink.LinkSetUp(link)
	}
	if err != nil {
		return fmt.Errorf("wg: set %s up: %w", iface, err)
	}

	// The socket goes last: once it answers, the device is ready.
	f, err := ipc.UAPIOpen(iface)
	if err != nil {
		return fmt.Errorf("wg: UAPI socket %s: %w", SocketPath(iface), err)
	}
	uapi, err := ipc.UAPIListen(iface, f)
	f.Close()
	if err != nil {
		os.Remove(SocketPath(iface))
		return fmt.Errorf("wg: UAPI listen %s: %w", SocketPath(iface), err)
	}
	defer uapi.Close() // unlinks the socket
	acceptErr := make(chan error, 1)
	go func() {
		for {
			c, err := uapi.Accept()
			if err != nil {
				acceptErr <- err
				return
			}
			go dev.IpcHandle(c)
		}
	}()
	log.Printf("wg-holder %s: up (pid %d, mtu %d, socket %s)", iface, os.Getpid(), mtu, SocketPath(iface))
	select {
	case <-ctx.Done():
		log.Printf("wg-holder %s: stopping", iface)
		return nil
	case err := <-acceptErr:
		return fmt.Errorf("wg: UAPI socket %s: %w", SocketPath(iface), err)
	case <-dev.Wait():
		return fmt.Errorf("wg: device %s closed", iface)
	}
}

// HolderMain is the body of the holder command (`shoal-netd wg-holder
// --iface X --mtu M`): it runs RunHolder until SIGTERM or SIGINT and
// returns the exit code. SIGHUP and SIGPIPE are ignored: a holder must not
// die because its starter's terminal or log pipe went away.
func HolderMain(args []string) int {
	fs := flag.NewFlagSet("wg-holder", flag.ContinueOnError)
	iface := fs.String("iface", "", "WireGuard interface `name` (unique on the machine)")
	mtu := fs.Int("mtu", DefaultMTU, "interface MTU")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *iface == "" || fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: wg-holder --iface NAME [--mtu MTU]")
		return 2
	}
	signal.Ignore(syscall.SIGHUP, syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := RunHolder(ctx, *iface, *mtu); err != nil {
		log.Printf("wg-holder %s: %v", *iface, err)
		return 1
	}
	return 0
}

// HolderOptions tune StartHolderWith.
type HolderOptions struct {
	// Netns is the path of the network namespace to start the holder in
	// ("" for the caller's). The device, its TUN link and its UDP socket
	// live there; the UAPI socket is machine-wide anyway.
	Netns string
	// Log is a file the holder's stdout and stderr are appended to (created
	// 0600); "" sends them to /dev/null. Never a pipe: the holder outlives
	// the reader.
	Log string
	// Timeout bounds the wait for the UAPI socket (default 10 s).
	Timeout time.Duration
	// Env is added to the caller's environment.
	Env []string
}

// StartHolder is StartHolderWith with default options.
func StartHolder(exe string, args []string, iface string) (pid int, err error) {
	return StartHolderWith(exe, args, iface, HolderOptions{})
}

// StartHolderWith starts `exe args…` (a program that ends up in
// HolderMain or RunHolder for iface) detached: in a session and process
// group of its own, so neither the caller's exit nor a signal to its
// process group reaches it; working directory /, stdin /dev/null, stdout
// and stderr to opts.Log or /dev/null; the caller's environment without
// systemd's NOTIFY_SOCKET, WATCHDOG_* and LISTEN_*, plus opts.Env. It
// returns the holder's pid once its UAPI socket answers, and kills it if
// that takes longer than opts.Timeout. It fails with ErrHolderRunning if a holder already
// answers for iface (use HolderAlive first to reuse one).
//
// Under systemd the holder stays in the caller's cgroup: the unit needs
// KillMode=process for it to survive a restart of the caller.
func StartHolderWith(exe string, args []string, iface string, opts HolderOptions) (pid int, err error) {
	if err := checkIface(iface); err != nil {
		return 0, err
	}
	if pid, err := probe(iface, true); err == nil {
		return 0, fmt.Errorf("%w: %s (pid %d)", ErrHolderRunning, iface, pid)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 10 * time.Second
	}
	stdin, err := os.Open(os.DevNull)
	if err != nil {
		return 0, err
	}
	defer stdin.Close()
	var out *os.File
	if opts.Log != "" {
		out, err = os.OpenFile(opts.Log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	} else {
		out, err = os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	}
	if err != nil {
		return 0, fmt.Errorf("wg: holder log: %w", err)
	}
	defer out.Close()
	cmd := exec.Command(exe, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, out, out
	cmd.Dir = "/"
	cmd.Env = append(daemon.ChildEnv(os.Environ()), opts.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := InNetns(opts.Netns, cmd.Start); err != nil {
		return 0, fmt.Errorf("wg: start holder %s: %w", iface, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }() // reap it if it exits while we run
	deadline := time.NewTimer(opts.Timeout)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if pid, err := probe(iface, true); err == nil {
			if pid != cmd.Process.Pid {
				_ = cmd.Process.Kill()
				return 0, fmt.Errorf("%w: %s (pid %d, started concurrently)", ErrHolderRunning, iface, pid)
			}
			return pid, nil
		}
		select {
		case err := <-exited:
			return 0, fmt.Errorf("wg: holder %s exited before its socket answered: %v%s", iface, err, logTail(opts.Log))
		case <-deadline.C:
			_ = cmd.Process.Kill()
			return 0, fmt.Errorf("wg: holder %s: no answer on %s within %v%s", iface, SocketPath(iface), opts.Timeout, logTail(opts.Log))
		case <-tick.C:
		}
	}
}

func logTail(path string) string {
	if path == "" {
		return ""
	}
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return ""
	}
	if len(b) > 1000 {
		b = b[len(b)-1000:]
	}
	return "; log: " + strings.TrimSpace(string(b))
}

// HolderAlive reports whether a userspace device answers on iface's UAPI
// socket (a get request, within a second).
func HolderAlive(iface string) bool {
	_, err := probe(iface, true)
	return err == nil
}

// HolderPID returns the pid of the process listening on iface's UAPI
// socket (SO_PEERCRED), whether or not it answers requests.
func HolderPID(iface string) (int, error) { return probe(iface, false) }

// probe connects to iface's UAPI socket and returns the listener's pid;
// with get, it also requires an errno=0 answer to a get request.
func probe(iface string, get bool) (int, error) {
	c, err := net.DialTimeout("unix", SocketPath(iface), time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	uc := c.(*net.UnixConn)
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if credErr != nil {
		return 0, credErr
	}
	if !get {
		return int(cred.Pid), nil
	}
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(c, "get=1\n\n"); err != nil {
		return 0, err
	}
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return 0, fmt.Errorf("wg: UAPI %s: %w", iface, err)
		}
		if v, ok := bytes.CutPrefix(line, []byte("errno=")); ok {
			if s := string(bytes.TrimSpace(v)); s != "0" {
				return 0, fmt.Errorf("wg: UAPI %s: errno=%s", iface, s)
			}
			return int(cred.Pid), nil
		}
	}
}

// StopHolder stops the holder of iface: SIGTERM, then SIGKILL if it has
// not exited within timeout (default 5 s). It returns once the process is
// gone (or a zombie awaiting its parent) and the socket removed. No holder
// is not an error; a stale socket file is removed.
func StopHolder(iface string, timeout time.Duration) error {
	if err := checkIface(iface); err != nil {
		return err
	}
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	pid, err := HolderPID(iface)
	if err != nil {
		if rerr := os.Remove(SocketPath(iface)); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			return fmt.Errorf("wg: remove stale socket: %w", rerr)
		}
		return nil
	}
	if err := unix.Kill(pid, unix.SIGTERM); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("wg: stop holder %s (pid %d): %w", iface, pid, err)
	}
	if waitGone(pid, timeout) {
		_ = os.Remove(SocketPath(iface)) // normally already gone
		return nil
	}
	_ = unix.Kill(pid, unix.SIGKILL)
	_ = os.Remove(SocketPath(iface))
	if !waitGone(pid, 2*time.Second) {
		return fmt.Errorf("wg: holder %s (pid %d) survived SIGKILL", iface, pid)
	}
	return nil
}

func waitGone(pid int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		if processGone(pid) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// processGone reports whether pid has exited (a zombie counts).
func processGone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	return b[i+2] == 'Z' || b[i+2] == 'X'
}
