package wg

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NetnsDir is where named network namespaces are bind-mounted, as by
// `ip netns add`.
const NetnsDir = "/var/run/netns"

// NetnsPath is the path of the named network namespace name.
func NetnsPath(name string) string { return filepath.Join(NetnsDir, name) }

func checkNetnsName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') {
		return fmt.Errorf("wg: bad netns name %q", name)
	}
	return nil
}

// CreateNetns creates a new, empty network namespace bound at
// NetnsPath(name), like `ip netns add NAME`, and returns its path. It
// fails if the name exists. The namespace lives until DeleteNetns, even
// with no process in it.
func CreateNetns(name string) (string, error) {
	if err := checkNetnsName(name); err != nil {
		return "", err
	}
	if err := prepareNetnsDir(); err != nil {
		return "", err
	}
	path := NetnsPath(name)
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return "", fmt.Errorf("wg: create netns %s: %w", name, err)
	}
	f.Close()
	// Unshare on a thread of our own and bind its new namespace to the
	// file; the thread is never unlocked, so Go discards it on return and
	// no goroutine ever runs in the new namespace by accident.
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		src := fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
		if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("bind %s: %w", src, err)
			return
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		return "", fmt.Errorf("wg: create netns %s: %w", name, err)
	}
	return path, nil
}

// prepareNetnsDir makes NetnsDir a shared mount point, as iproute2 does,
// so that namespaces bound later propagate to mount namespaces created
// from this one (containers, `ip netns exec`).
func prepareNetnsDir() error {
	if err := os.MkdirAll(NetnsDir, 0o755); err != nil {
		return err
	}
	err := unix.Mount("", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) { // not a mount point yet
		if err := unix.Mount(NetnsDir, NetnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("wg: bind %s: %w", NetnsDir, err)
		}
		err = unix.Mount("", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	}
	if err != nil {
		return fmt.Errorf("wg: make %s shared: %w", NetnsDir, err)
	}
	return nil
}

// DeleteNetns removes the named network namespace, like `ip netns del`;
// a missing one is not an error. The namespace itself goes away when the
// last process in it exits and the last reference to it closes. Delete
// the veths leading into it first if their peers must go at once.
func DeleteNetns(name string) error {
	if err := checkNetnsName(name); err != nil {
		return err
	}
	path := NetnsPath(name)
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("wg: unmount netns %s: %w", name, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("wg: delete netns %s: %w", name, err)
	}
	return nil
}

// InNetns runs fn with its goroutine's OS thread in the network namespace
// at path ("" for the caller's). Sockets fn opens belong to that
// namespace for good; processes fn starts (exec.Cmd.Start) start in it,
// as clone copies the calling thread's namespaces. fn runs on a dedicated
// thread that is discarded afterwards, so a failed switch back can never
// leak the namespace to other goroutines. Goroutines fn starts run
// elsewhere, in the process's namespace. Do not set Pdeathsig on commands
// started this way: it fires when the starting thread exits, at once.
func InNetns(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		ns, err := netns.GetFromPath(path)
		if err != nil {
			errc <- fmt.Errorf("wg: open netns %s: %w", path, err)
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			errc <- fmt.Errorf("wg: enter netns %s: %w", path, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}
