// Package devcluster runs a multi-node Shoal cluster on one Linux machine:
// one network namespace per node, joined by a bridge in the host namespace,
// each node running the real daemon binaries. It backs `shoalctl dev` and
// the multi-node end-to-end tests.
//
// # Layout
//
// For a cluster named NAME with N nodes on subnet S (a /24 by default):
//
//	host namespace    bridge shbr-NAME with S.1; veth shNAME-i per node (a port of the bridge)
//	node i            netns shoal-NAME-i; eth0 with S.(10+i); lo up; default route via S.1
//	state             /var/lib/shoal-dev/NAME/cluster.json     the Spec and the names of what Up made
//	                  /var/lib/shoal-dev/NAME/ni/DAEMON/       each daemon's --state-dir
//	                  /var/lib/shoal-dev/NAME/ni/logs/P.log    stdout+stderr of process P (appended)
//	run               /run/shoal-dev/NAME/ni/                  --run-dir: the daemons' sockets, P.pid
//
// Nothing forwards traffic off the machine: the bridge address is only a
// way for the host to reach the nodes (IP forwarding and NAT are left as
// they are). IPv6 is disabled on the links the package makes, so that
// partitions, which filter IPv4 and ARP, cut every packet.
//
// # Processes
//
// A node runs the Spec's extra processes (Spec.Extra, e.g. a containerd),
// then its daemons (Spec.Daemons: shoal-statd, shoal-schedd, ...). Each is
// started inside the node's network namespace but in the host's mount
// namespace (so mounts a daemon makes are visible to the other processes
// of its node and to Down), in a session of its own with stdin from
// /dev/null and output appended to its log file. They outlive the process
// that started them; a pid file (pid and kernel start time, so a reused pid
// is never mistaken for the daemon) lets later commands find them.
//
// Arguments and environment entries of processes may use placeholders,
// expanded per node: {node} {addr} {seed} (node 1's address) {cluster}
// {netns} {nodedir} {statedir} (the process's state dir) {rundir} {logdir}
// {bridge} (the bridge address) {prefixlen}.
//
// # Use
//
//	c, err := devcluster.Up(ctx, devcluster.Spec{Name: "t1", Nodes: 3, BinDir: bin, Subnet: devcluster.AutoSubnet})
//	if err != nil { ... }                 // Up has cleaned up after itself (unless KeepOnFailure)
//	defer c.Down(context.Background())    // idempotent
//	out, errOut, code, err := c.Ctl(ctx, 1, "state", "get", "/x")
//	c.Partition([][]int{{1}, {2, 3}})
//	i, err := c.AddNode(ctx)             // node 4 joins the running cluster
//
// Load(name) finds a cluster from its cluster.json, so separate commands
// (shoalctl dev exec, dev kill, ...) can act on a cluster another process
// brought up. Every operation needs root.
//
// Errors that are the caller's fault satisfy errdefs.IsInvalidArgument;
// a missing cluster errdefs.IsNotFound; a name in use errdefs.IsAlreadyExists.
package devcluster
