// Package volfuse serves a shoal volume (a volfs.Client) as a FUSE
// filesystem with hanwen/go-fuse, so that tasks see a replicated volume
// as an ordinary directory.
//
// # Design
//
// The adapter keeps no file system state of its own. Every kernel request
// becomes one Client call: lookups, stats and reads are linearizable
// queries (a ReadIndex, then a read of a local replica), and every change
// is a Raft proposal acknowledged once committed and applied. So that a
// write acknowledged on one node is visible to a read on any other right
// after, the kernel is told to cache nothing:
//
//   - entry, attribute and negative-lookup timeouts are zero, so the kernel
//     asks again for every path walk and stat;
//   - files are opened with direct I/O (FOPEN_DIRECT_IO): reads and writes
//     bypass the page cache, so even an already open file sees another
//     node's writes. Options.CachedIO trades this for the page cache while
//     a file is open (it is dropped at every open), which shared writable
//     mmap needs;
//   - O_APPEND writes are appended by the state machine at the file's size
//     as the entry applies, not at the kernel's (possibly stale) idea of
//     it, so appends from several nodes never overwrite each other;
//   - READDIRPLUS is off: it would look up every entry of a listing.
//
// This costs round trips, and correctness across nodes matters more here.
//
// Inode numbers are the volume's own (volfs never reuses one), with a
// constant generation, so they are stable across mounts, nodes and
// restarts. Writes larger than volfs.MaxWriteChunk (1 MiB, also the FUSE
// max_write) are split into several ops by the Client.
//
// The adapter implements the FUSE protocol directly (fuse.RawFileSystem):
// a node id is the volfs inode number, and a file handle holds an open
// file's only state (O_APPEND), so every request can be answered by a
// process that saw none of the lookups and opens before it — which taking
// over a live FUSE session needs. Two tables are kept. Directory
// listings, from OPENDIR to RELEASEDIR, so that a listing read in several
// requests is consistent; a directory handle whose listing is unknown
// (opened by another process) lists afresh. And the count of open
// handles per inode, which UNLINK and RENAME send along so that the
// volume keeps a file unlinked while open here (volfs.Holder), and whose
// last RELEASE frees it (Forget). A server that takes a session over
// does not know its predecessor's handles (a handle carries its server's
// random epoch): files the predecessor held stay held until the mount
// ends, and a file only the predecessor's handles have open is freed at
// unlink, as files open on another node are.
//
// The mount uses default_permissions (the kernel checks mode bits and
// ownership against the caller) and allow_other (processes of any user,
// root in a container included, may use it); it is made with mount(2)
// directly, as vold runs as root (no fusermount). Flush and
// fsync have nothing to do — every acknowledged write is already durable
// on a quorum of replicas — so they answer ENOSYS, which the kernel takes
// as "never ask again" and turns into success for close and fsync(2):
// no round trip for either.
//
// # Lifecycle
//
// Mount serves until Unmount; a busy mount (open files, a working
// directory inside) is detached lazily rather than left in place, and the
// server keeps serving its open files until they close (Wait).
//
// A mount can outlive its server (session.go): the kernel keeps a FUSE
// session while any process has its /dev/fuse file open, so a server that
// hands a copy (Server.Session) to another process (pkg/fdhold) can die,
// and a new server takes the session over (Adopt). Processes using the
// mount wait meanwhile; the requests the dead server had read and not
// answered, the kernel sends again when asked (FUSE_NOTIFY_RESEND, Linux
// 6.9+), and each carries the key of its first sending
// (volfs.RequestKey: the session's ID and the kernel's request number),
// so that a mutation the group had applied is not applied twice. go-fuse
// reads INIT before serving and the kernel sends it once per session, so
// the server reads the session's saved INIT from a socket, whose
// descriptor number is then given the session's /dev/fuse file.
//
// A process killed while serving a mount that nobody else holds leaves a
// dead mount whose every access fails with ENOTCONN; CleanStale detaches
// it so that a restarted vold can mount at the same path. A process killed while one of its own threads waited on
// its mount cannot finish dying and leaves a mount that answers nothing;
// CleanStale aborts its FUSE connection (fusectl) first, which fails the
// waiting requests and lets the process go.
//
// # Not supported
//
// File locks are not replicated (the kernel keeps them per node), nor are
// extended attributes, device nodes, FIFOs or sockets; a file unlinked
// on one node while open on another is freed at once (see volfs); atime
// is not updated by reads.
package volfuse
