// Package wg is the device layer of Shoal's WireGuard overlay
// (docs/NETWORKING.md): it runs and configures the WireGuard interface and
// the links, addresses, routes and network namespaces around it. The
// decisions (which subnet, which peers, which MTU) are pkg/overlay's.
//
//   - KernelAvailable tells whether the kernel has WireGuard; if so
//     Netlink.AddKernelWireGuard creates the interface.
//   - Otherwise the interface is userspace wireguard-go in a holder
//     process: RunHolder/HolderMain is its body, StartHolderWith starts it
//     detached (so it outlives netd), HolderAlive finds it again by its UAPI
//     socket, StopHolder ends it.
//   - Device configures either kind through wgctrl: key, port, peers by
//     diff, status. LoadOrCreateKey persists the private key.
//   - Netlink (bound to a network namespace), ConfigureTaskNetns,
//     EnableIPv4Forwarding, CreateNetns/DeleteNetns and InNetns do the
//     plumbing for the node and its tasks.
//
// Everything here needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN for netns).
package wg
