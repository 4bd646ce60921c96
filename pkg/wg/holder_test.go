package wg

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func selfExe(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

// TestHolderLifecycle starts a holder (this test binary in wg-holder mode)
// in a namespace, finds it by its socket, configures it, refuses a second
// one, and stops it without a trace.
func TestHolderLifecycle(t *testing.T) {
	requireRoot(t)
	ns := newNetns(t)
	iface := ifName("h")
	logPath := filepath.Join(t.TempDir(), "holder.log")
	if HolderAlive(iface) {
		t.Fatalf("%s alive before start", iface)
	}
	args := []string{"wg-holder", "--iface", iface, "--mtu", "1300"}
	t.Setenv("NOTIFY_SOCKET", "/run/systemd/notify") // as under Type=notify
	start := time.Now()
	pid, err := StartHolderWith(selfExe(t), args, iface, HolderOptions{Netns: ns, Log: logPath, Timeout: 5 * time.Second, Env: []string{"SHOAL_WG_TEST=1"}})
	if err != nil {
		t.Fatal(err)
	}
	stopHolderAtCleanup(t, iface, pid)
	t.Logf("holder pid %d answered after %v", pid, time.Since(start))

	if !HolderAlive(iface) {
		t.Fatal("not alive")
	}
	if got, err := HolderPID(iface); err != nil || got != pid {
		t.Fatalf("HolderPID = %d, %v; want %d", got, err, pid)
	}
	environ, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if env := "\x00" + string(environ); strings.Contains(env, "\x00NOTIFY_SOCKET=") || !strings.Contains(env, "\x00SHOAL_WG_TEST=1\x00") {
		t.Fatalf("holder environment: %q", environ)
	}
	// Its own session: not in our process group, not a session leader's child.
	if sid, _ := unix.Getsid(pid); sid != pid {
		t.Fatalf("holder session %d, want %d (its own)", sid, pid)
	}
	// The TUN link lives in the namespace, up, with the MTU asked for.
	n := openNetlink(t, ns)
	l, err := n.h.LinkByName(iface)
	if err != nil {
		t.Fatal(err)
	}
	if l.Attrs().MTU != 1300 || l.Attrs().Flags&net.FlagUp == 0 || l.Type() != "tuntap" {
		t.Fatalf("link %s: mtu %d flags %v type %s", iface, l.Attrs().MTU, l.Attrs().Flags, l.Type())
	}
	if _, err := netlink.LinkByName(iface); err == nil {
		t.Fatal("TUN link in the root namespace")
	}
	if fi, err := os.Stat(SocketPath(iface)); err != nil || fi.Mode().Perm()&0o077 != 0 {
		t.Fatalf("socket: %v, %v", fi, err)
	}

	_, err = StartHolderWith(selfExe(t), args, iface, HolderOptions{Netns: ns})
	if !errors.Is(err, ErrHolderRunning) {
		t.Fatalf("second holder: %v", err)
	}

	d, err := Open(iface)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	priv, err := LoadOrCreateKey(filepath.Join(t.TempDir(), "wg.key"))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := d.SetPrivateKey(priv); err != nil {
			t.Fatal(err)
		}
		if err := d.SetListenPort(51999); err != nil {
			t.Fatal(err)
		}
	}
	if pub, err := d.PublicKey(); err != nil || pub != priv.PublicKey() {
		t.Fatalf("public key %v, %v", pub, err)
	}
	if port, err := d.ListenPort(); err != nil || port != 51999 {
		t.Fatalf("listen port %d, %v", port, err)
	}
	if d.Name() != iface {
		t.Fatal("Name")
	}
	if _, err := Open("wtnosuchdev"); err == nil {
		t.Fatal("Open of a missing device")
	}

	if err := StopHolder(iface, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	if HolderAlive(iface) {
		t.Fatal("alive after stop")
	}
	if _, err := os.Stat(SocketPath(iface)); !os.IsNotExist(err) {
		t.Fatalf("socket left: %v", err)
	}
	if ok, _ := n.LinkExists(iface); ok {
		t.Fatal("TUN link left")
	}
	if !processGone(pid) {
		t.Fatal("process left")
	}
	if err := StopHolder(iface, time.Second); err != nil {
		t.Fatalf("second stop: %v", err)
	}
	// It logged its start and its stop.
	b, _ := os.ReadFile(logPath)
	if !strings.Contains(string(b), "up (pid") || !strings.Contains(string(b), "stopping") {
		t.Fatalf("holder log:\n%s", b)
	}
}

// TestStartHolderFails: a program that never serves the socket is
// reported with its log, quickly.
func TestStartHolderFails(t *testing.T) {
	requireRoot(t)
	iface := ifName("f")
	logPath := filepath.Join(t.TempDir(), "holder.log")
	// The holder itself refuses a bad MTU flag.
	_, err := StartHolderWith(selfExe(t), []string{"wg-holder", "--iface", iface, "--mtu", "x"}, iface, HolderOptions{Log: logPath, Timeout: 5 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "exited before") || !strings.Contains(err.Error(), "invalid value") {
		t.Fatalf("bad flag: %v", err)
	}
	// A program that just sleeps times out and is killed.
	start := time.Now()
	_, err = StartHolderWith("/bin/sleep", []string{"30"}, iface, HolderOptions{Timeout: 300 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "no answer") || time.Since(start) > 3*time.Second {
		t.Fatalf("sleeper: %v after %v", err, time.Since(start))
	}
	if _, err := StartHolder(selfExe(t), nil, "bad/name"); err == nil {
		t.Fatal("bad interface name accepted")
	}
	if _, err := StartHolder(selfExe(t), nil, "waytoolonginterfacename"); err == nil {
		t.Fatal("long interface name accepted")
	}
}
