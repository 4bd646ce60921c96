// Package volfuse serves a shoal volume (a volfs.Client) as a FUSE
// filesystem with hanwen/go-fuse, so that tasks see a replicated volume
// as an ordinary directory.
//
// # Design
//
// The adapter keeps no file system state of its own beyond write-behind
// buffers (below). Every other kernel request becomes one Client call:
// lookups, stats and reads are linearizable queries (a ReadIndex, then a
// read of a local replica), and every change is a Raft proposal
// acknowledged once committed and applied. So that a change made on one
// node is visible to a read on any other right after, the kernel is told
// to cache nothing:
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
// # Write-behind
//
// A write(2) that waited for its own commit would cost a Raft round trip
// (a log fsync on a quorum and a network exchange) per call, and a single
// writer would never have two in flight. So write copies the data into a
// per-inode buffer and returns; contiguous and overlapping writes merge
// into chunks of up to volfs.MaxWriteChunk, and full chunks are proposed
// at once, up to 8 concurrently per inode (Raft then carries them in one
// round), a partly filled last chunk after 100 ms without more data. At
// most 16 MiB per inode is buffered or in flight; beyond that write waits.
// Two chunks that overlap are never in flight together (Raft does not
// order concurrent proposals: a dropped one is retried after later ones),
// so writes apply in the order they were made. The rules, as for NFS:
//
//   - fsync, fdatasync and close (FUSE Flush) return only once every
//     write made before them on the inode through this mount is committed
//     (durable on a quorum) and applied. O_SYNC and O_DSYNC files, and
//     O_APPEND ones (so that appends from several nodes interleave in the
//     order they were made), write through: each write returns once
//     committed. Options.WriteThrough does that for every file.
//   - An error met by a buffered write (ENOSPC, EIO, ENOENT when another
//     node removed the file) is reported by the next write, fsync or close
//     of the descriptor that made it, once. EFBIG is reported at once.
//   - On the writer's node a write is visible at once: read, stat
//     (getattr and lookup), setattr and truncate, open with O_TRUNC, and
//     unlink or rename of the file's name first wait for the inode's
//     buffer to be committed. Other nodes see it once the writer's fsync or
//     close returned (close-to-open consistency; in practice also within a
//     fraction of a second without either, but that is not promised).
//   - If the serving process (vold) dies, writes not yet fsynced or closed
//     may be lost, exactly as unsynced data on a local filesystem when the
//     machine crashes; acknowledged fsyncs and closes are never lost.
//
// Inode numbers are the volume's own (volfs never reuses one), with a
// constant generation, so they are stable across mounts, nodes and
// restarts. Writes larger than volfs.MaxWriteChunk (1 MiB, also the FUSE
// max_write) are split into several ops by the Client.
//
// The mount uses default_permissions (the kernel checks mode bits and
// ownership against the caller) and allow_other (processes of any user,
// root in a container included, may use it); it is made with mount(2)
// directly, as vold runs as root, falling back to fusermount.
//
// # Lifecycle
//
// Mount serves until Unmount; a busy mount (open files, a working
// directory inside) is detached lazily rather than left in place, and the
// server keeps serving its open files until they close (Wait). A process
// killed while serving leaves a dead mount whose every access fails with
// ENOTCONN; CleanStale detaches it so that a restarted vold can mount at
// the same path.
//
// # Not supported
//
// File locks are not replicated (the kernel keeps them per node), nor are
// extended attributes, device nodes, FIFOs or sockets; unlinked files that
// are still open are freed at once (see volfs); atime is not updated by
// reads.
package volfuse
