package wg

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The test binary doubles as the programs the tests start, picked by its
// first argument:
//
//	wg-holder --iface X --mtu M    the holder (HolderMain), as shoal-netd wg-holder
//	netd-sim NETNS IFACE MTU LOG   a stand-in for netd: starts a holder with
//	                               StartHolderWith, prints its pid, then waits to be killed
func TestMain(m *testing.M) {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "wg-holder":
			go exitWithOwner()
			os.Exit(HolderMain(os.Args[2:]))
		case "netd-sim":
			os.Exit(netdSim(os.Args[2:]))
		}
	}
	if os.Geteuid() == 0 {
		sweepDeadRuns()
		// Holders whose starter (netd-sim) was killed are re-parented to
		// the test process, which reaps them.
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			fmt.Fprintln(os.Stderr, "subreaper:", err)
			os.Exit(2)
		}
	}
	// Holders outlive whoever started them by design; in tests they must
	// not outlive the test process (a -timeout panic skips cleanups).
	os.Setenv("SHOAL_WG_TEST_OWNER", strconv.Itoa(os.Getpid()))
	code := m.Run()
	if left := leftovers(); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "left behind: %s\n", strings.Join(left, ", "))
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// exitWithOwner stops this holder (cleanly, through SIGTERM) once the
// test process that owns it is gone.
func exitWithOwner() {
	owner, err := strconv.Atoi(os.Getenv("SHOAL_WG_TEST_OWNER"))
	if err != nil {
		return
	}
	for {
		time.Sleep(200 * time.Millisecond)
		if errors.Is(unix.Kill(owner, 0), unix.ESRCH) {
			unix.Kill(os.Getpid(), unix.SIGTERM)
			return
		}
	}
}

func netdSim(args []string) int {
	if len(args) != 4 {
		fmt.Println("usage: netd-sim NETNS IFACE MTU LOG")
		return 2
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	ns, iface, mtu, log := args[0], args[1], args[2], args[3]
	pid, err := StartHolderWith(exe, []string{"wg-holder", "--iface", iface, "--mtu", mtu}, iface, HolderOptions{Netns: ns, Log: log})
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	fmt.Println(pid)
	for {
		time.Sleep(time.Hour)
	}
}

// tag is unique to this test process: netns and interface names carry it
// so that concurrent runs (and other people's tests) never collide.
var tag = fmt.Sprintf("%05x", os.Getpid()&0xfffff)

var seq atomic.Int32

// ifName returns a fresh interface name (machine-wide unique, ≤ 15 chars).
func ifName(kind string) string {
	return fmt.Sprintf("wt%s%s%d", tag, kind, seq.Add(1))
}

func netnsName() string { return fmt.Sprintf("shwgt-%s-%d", tag, seq.Add(1)) }

// sweepDeadRuns removes what an earlier test process left when it died
// before its cleanups ran (a -timeout panic): namespaces and holders whose
// tag names a process that no longer exists.
func sweepDeadRuns() {
	dead := func(tag string) bool {
		pid, err := strconv.ParseInt(tag, 16, 32)
		return err == nil && tag != fmt.Sprintf("%05x", os.Getpid()&0xfffff) && errors.Is(unix.Kill(int(pid), 0), unix.ESRCH)
	}
	socks, _ := filepath.Glob(filepath.Join(SocketDir, "wt?????*.sock"))
	for _, s := range socks {
		iface := strings.TrimSuffix(filepath.Base(s), ".sock")
		if dead(iface[2:7]) {
			StopHolder(iface, time.Second)
		}
	}
	nss, _ := filepath.Glob(filepath.Join(NetnsDir, "shwgt-*-*"))
	for _, p := range nss {
		parts := strings.Split(filepath.Base(p), "-")
		if len(parts) == 3 && dead(parts[1]) {
			DeleteNetns(filepath.Base(p))
		}
	}
}

func leftovers() []string {
	var out []string
	ns, _ := filepath.Glob(filepath.Join(NetnsDir, "shwgt-"+tag+"-*"))
	socks, _ := filepath.Glob(filepath.Join(SocketDir, "wt"+tag+"*"))
	out = append(out, ns...)
	out = append(out, socks...)
	return out
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, TUN, netlink)")
	}
}

// newNetns creates a network namespace deleted at cleanup.
func newNetns(t *testing.T) string {
	t.Helper()
	name := netnsName()
	path, err := CreateNetns(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := DeleteNetns(name); err != nil {
			t.Error(err)
		}
	})
	return path
}

func openNetlink(t *testing.T, ns string) *Netlink {
	t.Helper()
	n, err := OpenNetlink(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	return n
}

// run runs a command in network namespace ns with a timeout and returns
// its combined output.
func run(t *testing.T, ns string, timeout time.Duration, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := InNetns(ns, cmd.Start); err != nil {
		return "", err
	}
	err := cmd.Wait()
	return out.String(), err
}

// ping pings addr from ns with busybox, failing the test if no reply.
func ping(t *testing.T, ns string, addr string) {
	t.Helper()
	if out, err := run(t, ns, 10*time.Second, "busybox", "ping", "-c", "2", "-i", "0.2", "-W", "3", addr); err != nil {
		t.Fatalf("ping %s: %v\n%s", addr, err, out)
	}
}

// reap collects pid if it is (or became, through the subreaper) our
// child; it is a no-op otherwise.
func reap(pid int) {
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		var ws unix.WaitStatus
		got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		if got == pid || errors.Is(err, unix.ECHILD) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// stopHolder stops iface's holder at cleanup and checks it is gone.
func stopHolderAtCleanup(t *testing.T, iface string, pid int) {
	t.Cleanup(func() {
		if err := StopHolder(iface, 3*time.Second); err != nil {
			t.Error(err)
		}
		reap(pid)
		if HolderAlive(iface) {
			t.Errorf("holder %s still alive", iface)
		}
	})
}
