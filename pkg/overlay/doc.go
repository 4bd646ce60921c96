// Package overlay holds the pure decisions behind Shoal's WireGuard overlay
// (docs/NETWORKING.md): which /24 of the overlay CIDR a node claims
// (ClaimSubnet), which address in its subnet a task gets (IPAM), which
// WireGuard peer changes turn the device's current peers into the desired
// ones (DiffPeers), and the overlay MTU (MTU).
//
// Nothing here does I/O: callers read the current state (claims from the
// store, peers from the device) and apply the results; pkg/wg is the device
// layer that does.
package overlay
