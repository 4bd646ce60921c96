package wg

import (
	"errors"
	"fmt"
	"math"
	"os"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// KernelAvailable reports whether the kernel has WireGuard (built in, or
// as a module it can load). It asks for a wireguard link with an
// impossible MTU, as netbird does: the kernel checks the link kind before
// the MTU, so EINVAL means the kind exists and nothing was created, while
// EOPNOTSUPP ("Unknown device type") means it does not. Asking may make
// the kernel load the module. Should a link be created after all, it is
// deleted again.
func KernelAvailable() bool {
	name := fmt.Sprintf("shwgprobe%d", os.Getpid()%100000)
	attrs := netlink.NewLinkAttrs()
	attrs.Name, attrs.MTU = name, math.MaxInt32
	link := &netlink.Wireguard{LinkAttrs: attrs}
	err := netlink.LinkAdd(link)
	if err == nil {
		_ = netlink.LinkDel(link)
		return true
	}
	return errors.Is(err, unix.EINVAL)
}
