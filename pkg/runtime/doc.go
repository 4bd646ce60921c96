// Package runtime is the container runtime of a Shoal node: the one
// interface schedd uses to hold images and run tasks, with two
// implementations.
//
//	Containerd  the real one, over containerd's Go client (containerd 1.6+
//	            with runc; tested against Debian's 1.6.20 and runc 1.1.5)
//	Fake        in memory, for protocol tests: deterministic, with crashes,
//	            exit codes and failures on demand
//
// Both pass the same behavioural suite (suite_test.go); package
// runtimetest starts throwaway containerds for tests that need the real
// thing.
//
// # Tasks
//
// A task is one container with one task, both named by TaskSpec.ID. Run
// creates and starts it; it runs until it exits or Stop (stop signal,
// grace, SIGKILL) ends it; it stays, stopped, with its exit code, until
// Remove deletes it and its root file system. Everything schedd needs to
// find its tasks again is in containerd: List returns every task of the
// namespace with the labels Run stored (Shoal's task metadata), status,
// pid, exit code and log path, and Wait works on tasks another process
// started. So schedd keeps no container state of its own and re-adopts
// its tasks after a restart, and a restart of schedd or of containerd
// never stops a task.
//
// Output goes to TaskSpec.LogPath, appended by containerd's shim (not by
// schedd), so logs go on while schedd restarts. Exec runs a command in a
// running task with streams (and a tty) of the caller's. Stats samples a
// running task's resource use: CPU, memory, pids and block I/O from its
// cgroup (v1 or v2, as containerd reports it), network traffic from its
// network namespace's /proc/<pid>/net/dev (none for a task on the node's
// own network: those figures would be the node's).
//
// Containerd applies, per task: CPU (CFS quota over a 100 ms period, and
// shares) and memory limits in cgroup <CgroupParent>/<id>; runc state in
// <RuncRoot>/<namespace>/<id>; the node's network namespace (containerd's
// own) unless TaskSpec.NetNSPath names one; bind mounts; a hostname, with
// /etc/hostname, /etc/hosts and a copy of the host's /etc/resolv.conf
// kept in <StateDir>/tasks/<id>/. The image's config gives the defaults
// (Cmd, Env, working dir, user, stop signal).
//
// # Images
//
// Images come from tars (Import: an OCI image layout or `docker save`
// output, see package testimage) and from peers. Names are stored
// normalized like Docker's ("docker.io/local/busybox:latest") and shown
// familiar ("local/busybox:latest"); either form, or the target digest,
// finds an image.
//
// A node that lacks an image copies it from a peer blob by blob, parents
// first, each verified against its digest:
//
//	blobs, _ := src.ImageBlobs(ctx, "local/busybox:v2")   // on the peer
//	for _, d := range blobs {
//		rc, _, _ := src.ReadBlob(ctx, d.Digest)          // streamed over the peer API
//		err := dst.WriteBlob(ctx, d, rc)                 // DataLoss if it does not match d
//	}
//	img, _ := dst.CreateImage(ctx, "local/busybox:v2", blobs[0])
//
// WriteBlob skips blobs already present, so a transfer resumes where it
// stopped and layers shared with other images are not sent again.
//
// # Errors
//
// Errors are wrapped with %w and classified with
// github.com/containerd/errdefs, for callers to test with errdefs.IsX and
// for the gRPC boundary to map to codes: NotFound (no such task, image or
// blob), AlreadyExists (task ID in use), InvalidArgument (bad spec, bad
// tar, bad digest), FailedPrecondition (exec in, or stats of, a stopped
// task), DataLoss (a blob that does not match its descriptor),
// Unavailable (containerd is not reachable: retry; the same Runtime works
// again once it is back).
//
// # One machine, several nodes
//
// containerd 1.6 keeps runc state under /run/containerd/runc/<namespace>
// and, by default, cgroups at /<namespace>/<id>, whatever its --root and
// --state. Nodes sharing a machine (a dev cluster) must therefore differ
// in Config.Namespace, and should have their own Config.RuncRoot and
// Config.CgroupParent too, so that nothing of one node is visible to
// another's cleanup. See devcluster.ContainerdLayout for the per-node
// layout and devcluster.KillContainers for tearing a node's containers
// down without its containerd.
package runtime
