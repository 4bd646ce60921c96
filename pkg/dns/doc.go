// Package dns is the per-node service discovery server of shoal-netd
// (DESIGN.md section 5, docs/NETWORKING.md "Service discovery").
//
// Every node answers DNS for its own tasks on its bridge address (.1:53),
// so a lookup never leaves the node and keeps working while the node is cut
// off from the rest of the cluster: the answers come from the node's own
// mirror of the state, which is exactly what the node's scheduler sees too.
// There is deliberately no cluster-wide DNS service to elect, fail over or
// keep consistent.
//
// The server is authoritative for one zone (default "shoal."):
//
//   - <service>.shoal and <slot>.<service>.shoal answer A queries with the
//     addresses the netd wiring computed from state (running, healthy tasks),
//     shuffled per answer so naive clients that take the first address
//     spread their load;
//   - a known name without addresses of the asked type (AAAA: the overlay is
//     IPv4) is NOERROR with no answers (NODATA), so resolvers don't wrongly
//     cache the name as nonexistent;
//   - an unknown name is NXDOMAIN; negative answers carry the zone's SOA so
//     resolvers cache them only for the (short) TTL;
//   - everything else is forwarded to the node's upstream resolvers, the
//     first useful answer wins; with no upstream (tests) or none answering
//     it is SERVFAIL.
//
// Records are replaced as a whole by an atomic pointer swap (Records.Set,
// Server.Update), so the next query sees the new table and a query never sees
// half an update, without locks on the query path and without restarting
// listeners. The TTL is short (5s by default) because tasks move: a
// resolver must not hold on to a replaced replica for long.
//
// UDP answers are truncated to the client's buffer size (512 bytes, or its
// EDNS0 size up to 1232) with the TC bit set, and the client retries over
// TCP, which is served on the same addresses. Malformed packets are
// rejected or dropped by miekg/dns before they reach the handler, and the
// handler recovers from panics, so one bad query cannot take discovery down
// for the node.
package dns
