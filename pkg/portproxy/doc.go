// Package portproxy is the userspace proxy behind published ports (ingress
// mode, docs/NETWORKING.md "Published ports").
//
// A published port answers on every node, whether or not a replica runs
// there, so clients and load balancers can use any node's address. netd
// gives the proxy its node addresses (Listen) and, per published port, the
// current set of healthy replicas anywhere in the cluster (Set); the proxy
// listens on <node addr>:port and forwards each new TCP connection, or each
// UDP flow (datagrams from one client address), to one of them over the
// overlay.
//
// Why userspace rather than nftables DNAT: it needs no kernel state that
// outlives or diverges from netd, works the same in every network
// namespace and kernel, and it lets the proxy skip a replica that does not
// accept the connection and try the next one, which DNAT cannot. The price
// is that the replica sees the node's overlay address instead of the
// client's (documented; DNAT to local replicas is future work), and a copy
// through userspace (splice(2) on Linux keeps that cheap).
//
// Rules:
//
//   - New connections go round-robin over the backends; a backend that
//     fails to connect within DialTimeout is skipped (the next one is
//     tried at once) and is tried last for FailCooldown, so a dead replica
//     costs at most one failed dial until health checking removes it.
//   - Set replaces a port's backends atomically. A backend that is no
//     longer in the set gets no new connections or flows; established ones
//     are left alone, as the network docs promise, and end on their own.
//   - TCP is copied both ways with half-close: when one side finishes
//     sending, the other side is told (shutdown(SHUT_WR)) and can still
//     answer. An error on either side tears both down.
//   - UDP: one connected socket per client address to the chosen backend,
//     closed after UDPIdleTimeout without traffic either way, or when the
//     backend answers with ICMP unreachable (the next datagram picks a new
//     backend).
//   - A port stays bound while it is published, even with no healthy
//     backend (connections are then reset): giving the port up while
//     replicas restart would let another process take it. Remove gives it
//     up.
//   - Binding failures (port in use) are returned as *BindError, recorded
//     in Ports, and retried on the port's next Set; other ports are not
//     affected.
package portproxy
