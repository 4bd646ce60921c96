// Package volfs is the filesystem of a shoal volume as a deterministic
// replicated state machine: every replica of the volume's Raft group holds
// an FS, every mutation is an encoded Op proposed through the group and
// applied identically everywhere, and reads run against a replica after a
// ReadIndex. The package is pure: no FUSE (see volfuse), no gRPC, no disk.
//
// # State
//
// An FS is a tree of inodes — regular files, directories and symbolic
// links — each with mode (type and permission bits, Linux values), owner,
// link count, size and atime/mtime/ctime. Inode numbers are handed out by
// the state machine in log order (root = 1) and never reused within a
// volume, so a number names one inode forever: FUSE can use it as the
// kernel's inode number on every node and across restarts, with a
// constant generation. Directories map names to inode numbers and keep a
// parent pointer (used to refuse moving a directory into its own subtree).
//
// Times come from the log entry (raftgroup.Entry.Time, the group clock
// that is the same on every replica), or explicitly from setattr; never
// from the local clock. Reads are not replicated, so atime changes only
// through setattr and creation (noatime semantics).
//
// # Data lives in memory
//
// File contents are held in memory on every replica, and Snapshot
// serialises the whole state at once. That keeps the state machine simple
// and exactly reproducible, at the price that a volume costs its size in
// RAM on each of its replicas (and a snapshot transfer moves all of it).
// Volumes are therefore bounded: SetLimit is a replicated setting
// (vold's default is 1 GiB; tests use small ones) enforced on write and
// truncate over the total bytes of file data (ENOSPC); 0 means unlimited
// and exists for tests. MaxFileSize bounds single files even then (EFBIG).
//
// # Ops, results and errors
//
// An Op is encoded in the protobuf wire format (hand-written with
// protowire: tagged fields, unknown fields skipped) and is self-contained,
// so vold can forward the same bytes to another node. Apply returns an
// encoded Result per entry. File system errors are POSIX errnos carried in
// the Result, identical on every replica; Apply itself never returns an
// error (that would stop the group), and bytes that do not decode apply as
// EINVAL. Each op applies completely or not at all: errors are checked
// before anything changes.
//
// Client is the typed API over a Backend (Mutate proposes and returns the
// result once applied; Query reads linearizably). HostBackend implements
// Backend over a local raftgroup.Host; package volfstest has test
// backends.
//
// # Choices and limits
//
//   - fsync is no op at all: a mutation is acknowledged only once it has
//     been committed (durable on a quorum) and applied, so there is nothing
//     left to flush when fsync is called (volfuse tells the kernel not to
//     send it).
//   - A regular file's data is kept in 1 MiB pages (data.go), so that a
//     growing file is never reallocated and copied.
//   - A Client.Write larger than MaxWriteChunk is split into several ops;
//     each is atomic, the whole is not. WriteAppend writes at the file's
//     size as of the entry, so concurrent appends from several nodes do not
//     overwrite each other.
//   - Open-unlinked files are kept for the mount that unlinks them: an
//     unlink or a rename carries the inodes its mount has open (Holder),
//     and one of them that loses its last name stays, without a name
//     (nlink 0), its bytes counted in Used and Statfs.Held, held by the
//     mount's node and session, until that mount forgets it (Forget, at
//     the last close there) or ends (ForgetSession; ForgetOthers when
//     the node mounts the volume afresh). Held files replicate like any
//     other state, snapshots included. A file open on one node and
//     unlinked through another is freed at once (its next read there
//     fails with ENOENT): opens are not replicated, which would cost a
//     proposal per open and leases that die with their node. What a dead
//     node's mounts held, vold frees with ForgetOthers naming no session
//     of it.
//   - A volume has a level (LevelBase, LevelSpecial; MaxLevel is this
//     code's), which says with which semantics its entries apply. It
//     starts at LevelBase, which applies entries exactly as volds before
//     levels did (a test holds it to their digest), and rises only by an
//     entry of the log (KindSetLevel), which vold's group leader proposes
//     once every member's vold knows the level. So replicas on old and
//     new volds agree during a rolling upgrade. The snapshot's version is
//     the level; a replica that meets a level above its MaxLevel, in an
//     entry or a snapshot, stops (ErrLevel) rather than diverge.
//   - FIFOs and sockets (KindMknod) from LevelSpecial on: inodes without
//     data, whose I/O each node's kernel does itself, so they connect
//     processes of one node. No device nodes, extended attributes or
//     ACLs; file locks are not replicated.
//   - Digest is a SHA-256 over the canonical encoding of the whole state
//     (the snapshot's, minus the applied index): replicas that applied the
//     same entries have equal digests, which is how tests — and operators —
//     check that data is identical on every replica.
package volfs
