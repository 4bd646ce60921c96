package volfuse

import (
	"context"
	"math/rand/v2"
	"os/user"
	"slices"
	"strconv"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/shoal-dev/shoal/pkg/volfs"
)

// generation is the FUSE generation of every inode: volfs never reuses an
// inode number, so the pair (number, generation) is unique with a
// constant generation.
const generation = 1

// blockSize is the block size reported by stat and statfs.
const blockSize = 4096

// The FUSE node id of an inode is its volfs inode number, and the volume's
// root is FUSE's root: this only compiles while volfs.RootIno ==
// fuse.FUSE_ROOT_ID (either difference overflows otherwise), so no
// translation between the two is needed.
const _ = (volfs.RootIno - fuse.FUSE_ROOT_ID) + (fuse.FUSE_ROOT_ID - volfs.RootIno)

// File handles (Fh of OPEN and CREATE) carry an open file's whole state,
// so that a handle issued by another process serving the same session is
// understood. The only state is O_APPEND (the lowest bit): appends are
// done by the state machine at the file's size when the write applies,
// because the kernel's idea of the size may be stale when other nodes
// write. The other bits are the issuing server's epoch (opens).
const (
	fhPlain  = 0
	fhAppend = 1
)

// rawFS serves a volume as a FUSE file system, at the level of the
// protocol. Every request is answered from its own contents (node id =
// inode number, file handle = open flags) and the volume, so that another
// process can take over a live session. Attributes and contents are read
// from the volume on every request, so nothing goes stale when another
// node changes them.
//
// Two things are kept: the count of open files per inode (opens, so that
// a file unlinked while open lives on until its last close; a successor
// does without its predecessor's counts), and directory listings between
// OPENDIR and RELEASEDIR, so that a listing read in several READDIRs is
// one consistent snapshot; a handle whose listing is not here (one opened
// by an earlier process) lists the directory afresh.
type rawFS struct {
	// Operations not implemented below answer ENOSYS.
	fuse.RawFileSystem

	vol   *volume
	opens *opens

	mu     sync.Mutex
	nextFh uint64              // next directory handle
	dirs   map[uint64]*dirList // open directory handles
}

// dirList is the listing of an open directory.
type dirList struct {
	ino     uint64
	entries []fuse.DirEntry // entry i has offset i+1
}

var _ fuse.RawFileSystem = (*rawFS)(nil)

func newRawFS(vol *volume) *rawFS {
	return &rawFS{
		RawFileSystem: fuse.NewDefaultRawFileSystem(),
		vol:           vol,
		opens:         newOpens(),
		// Directory handles start at a random number, so that this
		// process's handles do not collide with those an earlier
		// process gave out in the same session.
		nextFh: rand.Uint64(),
		dirs:   map[uint64]*dirList{},
	}
}

func (r *rawFS) String() string { return "volfuse" }

// reqCtx is the context of a request for Client calls: cancelled when the
// kernel interrupts the request, carrying the caller and the request's
// key (volfs.RequestKey).
func (r *rawFS) reqCtx(cancel <-chan struct{}, h *fuse.InHeader) context.Context {
	// The request's key: the session's name and the kernel's number for
	// the request, which stays the same when the kernel resends it to a
	// new server (but for the resend bit).
	key := r.vol.session + "/" + strconv.FormatUint(h.Unique&^uniqueResend, 16)
	return volfs.WithRequestKey(&fuse.Context{Caller: h.Caller, Cancel: cancel}, key)
}

// uniqueResend marks a request the kernel sends again (FUSE_UNIQUE_RESEND).
const uniqueResend = 1 << 63

// status maps a Client error for the kernel.
func (r *rawFS) status(op string, err error) fuse.Status {
	return fuse.Status(r.vol.errno(op, err))
}

func fillAttr(a *volfs.Attr, out *fuse.Attr) {
	out.Ino = a.Ino
	// The mode is the inode's own, permission bits included: the kernel
	// checks them (default_permissions).
	out.Mode = a.Mode
	out.Nlink = a.Nlink
	out.Owner = fuse.Owner{Uid: a.UID, Gid: a.GID}
	out.Size = a.Size
	out.Blksize = blockSize
	out.Blocks = (a.Size + 511) / 512
	out.Atime, out.Atimensec = split(a.Atime)
	out.Mtime, out.Mtimensec = split(a.Mtime)
	out.Ctime, out.Ctimensec = split(a.Ctime)
}

// split turns nanoseconds since the epoch into FUSE's seconds and
// nanoseconds (times before 1970 are clamped: FUSE's seconds are
// unsigned).
func split(ns int64) (uint64, uint32) {
	if ns < 0 {
		return 0, 0
	}
	return uint64(ns / 1e9), uint32(ns % 1e9)
}

// Zero timeouts everywhere (entries, attributes, negative lookups): the
// kernel asks again for every lookup and stat, so a change made through
// another node is seen at once. Correctness across nodes matters more
// here than saving round trips.

// fillEntry answers a request that gives the kernel a new reference to
// inode a.
func fillEntry(a *volfs.Attr, out *fuse.EntryOut) {
	out.NodeId = a.Ino
	out.Generation = generation
	fillAttr(a, &out.Attr)
	out.SetEntryTimeout(0)
	out.SetAttrTimeout(0)
}

func fillAttrOut(a *volfs.Attr, out *fuse.AttrOut) {
	fillAttr(a, &out.Attr)
	out.SetTimeout(0)
}

func (r *rawFS) openFlags() uint32 {
	if r.vol.cached {
		// Without FOPEN_KEEP_CACHE the kernel drops cached pages at open.
		return 0
	}
	return fuse.FOPEN_DIRECT_IO
}

func openFh(flags uint32) uint64 {
	if flags&syscall.O_APPEND != 0 {
		return fhAppend
	}
	return fhPlain
}

// Lookup implements LOOKUP.
func (r *rawFS) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	c := r.reqCtx(cancel, h)
	switch name {
	case ".":
		// A node revived from its id alone (the kernel sends this only
		// with export support, which is not negotiated): itself.
		a, err := r.vol.c.GetAttr(c, h.NodeId)
		if err != nil {
			return r.status("lookup", err)
		}
		fillEntry(&a, out)
		return fuse.OK
	case "..":
		// As go-fuse's node layer answered without a parent lookup.
		return fuse.Status(syscall.ESTALE)
	}
	a, err := r.vol.c.Lookup(c, h.NodeId, name)
	if err == nil {
		fillEntry(&a, out)
		return fuse.OK
	}
	if st := r.status("lookup", err); st != fuse.ENOENT {
		return st
	}
	// A negative entry (node id 0) valid for no time at all, rather than
	// ENOENT: what go-fuse's node layer answered with a zero negative
	// timeout.
	*out = fuse.EntryOut{}
	return fuse.OK
}

// Forget implements FORGET: nothing is kept per node, so nothing to drop.
func (r *rawFS) Forget(nodeID, nlookup uint64) {}

// GetAttr implements GETATTR.
func (r *rawFS) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	a, err := r.vol.c.GetAttr(r.reqCtx(cancel, &in.InHeader), in.NodeId)
	if err != nil {
		return r.status("getattr", err)
	}
	fillAttrOut(&a, out)
	return fuse.OK
}

// SetAttr implements SETATTR (chmod, chown, truncate, utimes).
func (r *rawFS) SetAttr(cancel <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	c := r.reqCtx(cancel, &in.InHeader)
	var s volfs.SetAttr
	if m, ok := in.GetMode(); ok {
		s.Valid |= volfs.SetMode
		s.Mode = m
	}
	if u, ok := in.GetUID(); ok {
		s.Valid |= volfs.SetUID
		s.UID = u
	}
	if g, ok := in.GetGID(); ok {
		s.Valid |= volfs.SetGID
		s.GID = g
	}
	if sz, ok := in.GetSize(); ok {
		s.Valid |= volfs.SetSize
		s.Size = sz
	}
	// Times are read from the raw fields: go-fuse's helpers turn "now"
	// into the local clock, which the group time must not depend on.
	switch {
	case in.Valid&fuse.FATTR_ATIME_NOW != 0:
		s.Valid |= volfs.SetAtimeNow
	case in.Valid&fuse.FATTR_ATIME != 0:
		s.Valid |= volfs.SetAtime
		s.Atime = int64(in.Atime)*1e9 + int64(in.Atimensec)
	}
	switch {
	case in.Valid&fuse.FATTR_MTIME_NOW != 0:
		s.Valid |= volfs.SetMtimeNow
	case in.Valid&fuse.FATTR_MTIME != 0:
		s.Valid |= volfs.SetMtime
		s.Mtime = int64(in.Mtime)*1e9 + int64(in.Mtimensec)
	}
	var (
		a   volfs.Attr
		err error
	)
	if s.Valid == 0 {
		// Only fields volfs keeps on its own (ctime, lock owner): report.
		a, err = r.vol.c.GetAttr(c, in.NodeId)
	} else {
		a, err = r.vol.c.Setattr(c, in.NodeId, s)
	}
	if err != nil {
		return r.status("setattr", err)
	}
	fillAttrOut(&a, out)
	return fuse.OK
}

// Create implements CREATE.
func (r *rawFS) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	var cf uint32
	if in.Flags&syscall.O_EXCL != 0 {
		cf |= volfs.CreateExcl
	}
	if in.Flags&syscall.O_TRUNC != 0 {
		cf |= volfs.CreateTrunc
	}
	a, err := r.vol.c.Create(r.reqCtx(cancel, &in.InHeader), in.NodeId, name, in.Mode, in.Caller.Uid, in.Caller.Gid, cf)
	if err != nil {
		return r.status("create", err)
	}
	fillEntry(&a, &out.EntryOut)
	out.Fh = r.opens.opened(a.Ino, in.Flags)
	out.OpenFlags = r.openFlags()
	return fuse.OK
}

// Open implements OPEN.
func (r *rawFS) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	if in.Flags&syscall.O_TRUNC != 0 && in.Flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		// The kernel passes O_TRUNC on only with atomic_o_trunc; doing it
		// here covers both cases.
		if _, err := r.vol.c.Setattr(r.reqCtx(cancel, &in.InHeader), in.NodeId, volfs.SetAttr{Valid: volfs.SetSize}); err != nil {
			return r.status("open", err)
		}
	}
	out.Fh = r.opens.opened(in.NodeId, in.Flags)
	out.OpenFlags = r.openFlags()
	return fuse.OK
}

// Read implements READ.
func (r *rawFS) Read(cancel <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	b, err := r.vol.c.Read(r.reqCtx(cancel, &in.InHeader), in.NodeId, int64(in.Offset), len(buf))
	if err != nil {
		return nil, r.status("read", err)
	}
	return fuse.ReadResultData(b), fuse.OK
}

// Write implements WRITE. (Writev is left unimplemented: the server then
// hands a split payload to Write in one piece.)
func (r *rawFS) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	written, err := r.vol.c.Write(r.reqCtx(cancel, &in.InHeader), in.NodeId, int64(in.Offset), data, in.Fh&fhAppend != 0)
	if err != nil && written == 0 {
		return 0, r.status("write", err)
	}
	// A short write (a later chunk failed) reports what was written; the
	// caller's next write gets the error.
	return uint32(written), fuse.OK
}

// Flush implements FLUSH: nothing is buffered here. ENOSYS tells the
// kernel so once and for all (it then returns success from close without
// asking again), which saves a round trip per close.
func (r *rawFS) Flush(cancel <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	return fuse.ENOSYS
}

// Fsync implements FSYNC. Every write was committed on a quorum of
// replicas before it was acknowledged, so there is nothing to sync.
// ENOSYS makes the kernel stop sending FSYNC for this mount and return
// success from fsync(2) itself: an O_DSYNC write was one request and a
// round trip for its implied fsync, now it is one. (A server that ever
// acknowledges writes before they commit must answer fsync instead.)
func (r *rawFS) Fsync(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	return fuse.ENOSYS
}

// Release implements RELEASE: the last close here of a file the volume
// holds for this session (unlinked while open) frees it.
func (r *rawFS) Release(cancel <-chan struct{}, in *fuse.ReleaseIn) {
	if r.opens.released(in.NodeId, in.Fh) {
		r.vol.forget(r.reqCtx(cancel, &in.InHeader), in.NodeId)
	}
}

// Mkdir implements MKDIR.
func (r *rawFS) Mkdir(cancel <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	a, err := r.vol.c.Mkdir(r.reqCtx(cancel, &in.InHeader), in.NodeId, name, in.Mode, in.Caller.Uid, in.Caller.Gid)
	if err != nil {
		return r.status("mkdir", err)
	}
	fillEntry(&a, out)
	return fuse.OK
}

// Rmdir implements RMDIR.
func (r *rawFS) Rmdir(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	return r.status("rmdir", r.vol.c.Rmdir(r.reqCtx(cancel, h), h.NodeId, name))
}

// Unlink implements UNLINK. It sends the inodes open here, so that the
// volume keeps the file if it is one of them.
func (r *rawFS) Unlink(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	c := r.reqCtx(cancel, h)
	held, err := r.vol.c.UnlinkHolding(c, h.NodeId, name, r.holder(c, h.NodeId, name))
	r.held(c, held)
	return r.status("unlink", err)
}

// Rename implements RENAME and RENAME2 (with RENAME_NOREPLACE and
// RENAME_EXCHANGE). A replaced target open here is kept, as by Unlink.
func (r *rawFS) Rename(cancel <-chan struct{}, in *fuse.RenameIn, oldName, newName string) fuse.Status {
	c := r.reqCtx(cancel, &in.InHeader)
	held, err := r.vol.c.RenameHolding(c, in.NodeId, oldName, in.Newdir, newName, in.Flags, r.holder(c, in.Newdir, newName))
	r.held(c, held)
	return r.status("rename", err)
}

// Symlink implements SYMLINK.
func (r *rawFS) Symlink(cancel <-chan struct{}, h *fuse.InHeader, target, name string, out *fuse.EntryOut) fuse.Status {
	a, err := r.vol.c.Symlink(r.reqCtx(cancel, h), h.NodeId, name, target, h.Caller.Uid, h.Caller.Gid)
	if err != nil {
		return r.status("symlink", err)
	}
	fillEntry(&a, out)
	return fuse.OK
}

// Readlink implements READLINK.
func (r *rawFS) Readlink(cancel <-chan struct{}, h *fuse.InHeader) ([]byte, fuse.Status) {
	t, err := r.vol.c.Readlink(r.reqCtx(cancel, h), h.NodeId)
	if err != nil {
		return nil, r.status("readlink", err)
	}
	return []byte(t), fuse.OK
}

// Link implements LINK (hard links).
func (r *rawFS) Link(cancel <-chan struct{}, in *fuse.LinkIn, name string, out *fuse.EntryOut) fuse.Status {
	a, err := r.vol.c.Link(r.reqCtx(cancel, &in.InHeader), in.Oldnodeid, in.NodeId, name)
	if err != nil {
		return r.status("link", err)
	}
	fillEntry(&a, out)
	return fuse.OK
}

// unlimitedBlocks is the size statfs reports for a volume without a limit
// (1 PiB): df needs some total.
const unlimitedBlocks = 1 << 50 / blockSize

// StatFs implements STATFS: the size limit is the total, file data the
// used space.
func (r *rawFS) StatFs(cancel <-chan struct{}, h *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	st, err := r.vol.c.Statfs(r.reqCtx(cancel, h))
	if err != nil {
		return r.status("statfs", err)
	}
	used := uint64(st.Used+blockSize-1) / blockSize
	total := uint64(unlimitedBlocks)
	if st.Limit > 0 {
		total = uint64(st.Limit) / blockSize
	}
	free := uint64(0)
	if total > used {
		free = total - used
	}
	*out = fuse.StatfsOut{
		Blocks:  total,
		Bfree:   free,
		Bavail:  free,
		Files:   st.Inodes + 1<<20,
		Ffree:   1 << 20,
		Bsize:   blockSize,
		NameLen: volfs.MaxNameLen,
		Frsize:  blockSize,
	}
	return fuse.OK
}

// list reads directory ino from the volume.
func (r *rawFS) list(c context.Context, ino uint64) (*dirList, fuse.Status) {
	ents, err := r.vol.c.Readdir(c, ino)
	if err != nil {
		return nil, r.status("readdir", err)
	}
	d := &dirList{ino: ino, entries: make([]fuse.DirEntry, len(ents))}
	for i, e := range ents {
		// Offsets as go-fuse's node layer gave them: the entry's index
		// plus one, no "." or "..".
		d.entries[i] = fuse.DirEntry{Name: e.Name, Ino: e.Ino, Mode: e.Mode & volfs.ModeType, Off: uint64(i + 1)}
	}
	return d, fuse.OK
}

// OpenDir implements OPENDIR: the listing is read now and kept under a
// new handle until RELEASEDIR.
func (r *rawFS) OpenDir(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	d, st := r.list(r.reqCtx(cancel, &in.InHeader), in.NodeId)
	if !st.Ok() {
		return st
	}
	r.mu.Lock()
	fh := r.nextFh
	r.nextFh++
	r.dirs[fh] = d
	r.mu.Unlock()
	out.Fh = fh
	return fuse.OK
}

// ReadDir implements READDIR, from the listing of the handle by offset.
func (r *rawFS) ReadDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	r.mu.Lock()
	d := r.dirs[in.Fh]
	r.mu.Unlock()
	if d == nil || d.ino != in.NodeId {
		// A handle this process did not open: list afresh, and keep the
		// listing for the handle's next READDIRs (RELEASEDIR drops it).
		var st fuse.Status
		if d, st = r.list(r.reqCtx(cancel, &in.InHeader), in.NodeId); !st.Ok() {
			return st
		}
		r.mu.Lock()
		if cur, ok := r.dirs[in.Fh]; !ok {
			r.dirs[in.Fh] = d
		} else if cur.ino == in.NodeId {
			d = cur
		}
		r.mu.Unlock()
	}
	if in.Offset > uint64(len(d.entries)) {
		return fuse.EINVAL
	}
	for _, e := range d.entries[in.Offset:] {
		if !out.AddDirEntry(e) {
			break
		}
	}
	return fuse.OK
}

// ReleaseDir implements RELEASEDIR.
func (r *rawFS) ReleaseDir(in *fuse.ReleaseIn) {
	r.mu.Lock()
	if d := r.dirs[in.Fh]; d != nil && d.ino == in.NodeId {
		delete(r.dirs, in.Fh)
	}
	r.mu.Unlock()
}

// FsyncDir implements FSYNCDIR: ENOSYS, as Fsync and for the same reason
// (go-fuse's node layer sent it to Fsync).
func (r *rawFS) FsyncDir(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	return fuse.ENOSYS
}

// The operations below had no method of their own under go-fuse's node
// layer; they answer as that layer did for them.

// Access implements ACCESS by checking the mode bits (the kernel does not
// send it with default_permissions).
func (r *rawFS) Access(cancel <-chan struct{}, in *fuse.AccessIn) fuse.Status {
	a, err := r.vol.c.GetAttr(r.reqCtx(cancel, &in.InHeader), in.NodeId)
	if err != nil {
		return r.status("access", err)
	}
	if !hasAccess(in.Caller.Uid, in.Caller.Gid, a.UID, a.GID, a.Mode, in.Mask) {
		return fuse.EACCES
	}
	return fuse.OK
}

// hasAccess reports whether a caller may access a file with mode perm
// for mask (R_OK, W_OK, X_OK bits), as go-fuse's node layer decided it.
func hasAccess(callerUID, callerGID, fileUID, fileGID, perm, mask uint32) bool {
	mask &= 7
	if mask == 0 {
		return true
	}
	if callerUID == 0 {
		// Root may read and write anything, and execute what has an
		// execute bit set, or a directory.
		return mask&1 == 0 || perm&0o111 != 0 || perm&syscall.S_IFMT == syscall.S_IFDIR
	}
	var bits uint32
	switch {
	case callerUID == fileUID:
		bits = perm >> 6
	case callerGID == fileGID:
		bits = perm >> 3
	case (perm>>3)&mask != perm&mask && inGroup(callerUID, fileGID):
		bits = perm >> 3
	default:
		bits = perm
	}
	return bits&mask == mask
}

// inGroup reports whether user uid has gid among its groups.
func inGroup(uid, gid uint32) bool {
	u, err := user.LookupId(strconv.Itoa(int(uid)))
	if err != nil {
		return false
	}
	gs, err := u.GroupIds()
	if err != nil {
		return false
	}
	return slices.Contains(gs, strconv.Itoa(int(gid)))
}

// Lseek implements LSEEK for SEEK_DATA and SEEK_HOLE (files have no
// holes as far as the kernel is told: the whole size is data).
func (r *rawFS) Lseek(cancel <-chan struct{}, in *fuse.LseekIn, out *fuse.LseekOut) fuse.Status {
	a, err := r.vol.c.GetAttr(r.reqCtx(cancel, &in.InHeader), in.NodeId)
	if err != nil {
		return r.status("lseek", err)
	}
	switch in.Whence {
	case unix.SEEK_DATA:
		if in.Offset >= a.Size {
			return fuse.Status(syscall.ENXIO)
		}
		out.Offset = in.Offset
		return fuse.OK
	case unix.SEEK_HOLE:
		if in.Offset > a.Size {
			return fuse.Status(syscall.ENXIO)
		}
		out.Offset = a.Size
		return fuse.OK
	}
	return fuse.ENOTSUP
}

// GetXAttr implements GETXATTR: no extended attributes (ENODATA).
func (r *rawFS) GetXAttr(cancel <-chan struct{}, h *fuse.InHeader, attr string, dest []byte) (uint32, fuse.Status) {
	return 0, fuse.ENOATTR
}

// ListXAttr implements LISTXATTR: an empty list.
func (r *rawFS) ListXAttr(cancel <-chan struct{}, h *fuse.InHeader, dest []byte) (uint32, fuse.Status) {
	return 0, fuse.OK
}

// SetXAttr implements SETXATTR: refused with ENODATA.
func (r *rawFS) SetXAttr(cancel <-chan struct{}, in *fuse.SetXAttrIn, attr string, data []byte) fuse.Status {
	return fuse.ENOATTR
}

// RemoveXAttr implements REMOVEXATTR: ENODATA.
func (r *rawFS) RemoveXAttr(cancel <-chan struct{}, h *fuse.InHeader, attr string) fuse.Status {
	return fuse.ENOATTR
}

// Mknod implements MKNOD: FIFOs and sockets, once the volume is at
// volfs.LevelSpecial (EPERM before, and for device nodes). Their I/O is
// each node's kernel's: a FIFO or socket connects processes of one node.
func (r *rawFS) Mknod(cancel <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	a, err := r.vol.c.Mknod(r.reqCtx(cancel, &in.InHeader), in.NodeId, name, in.Mode, in.Caller.Uid, in.Caller.Gid)
	if err != nil {
		return r.status("mknod", err)
	}
	fillEntry(&a, out)
	return fuse.OK
}

// Tmpfile implements TMPFILE (O_TMPFILE): not supported.
func (r *rawFS) Tmpfile(cancel <-chan struct{}, in *fuse.CreateIn, out *fuse.CreateOut) fuse.Status {
	return fuse.ENOTSUP
}

// Fallocate implements FALLOCATE: not supported.
func (r *rawFS) Fallocate(cancel <-chan struct{}, in *fuse.FallocateIn) fuse.Status {
	return fuse.ENOTSUP
}

// CopyFileRange implements COPY_FILE_RANGE: not supported (the kernel
// falls back to copying through reads and writes).
func (r *rawFS) CopyFileRange(cancel <-chan struct{}, in *fuse.CopyFileRangeIn) (uint32, fuse.Status) {
	return 0, fuse.ENOTSUP
}

// Ioctl implements IOCTL: none.
func (r *rawFS) Ioctl(cancel <-chan struct{}, in *fuse.IoctlIn, inbuf []byte, out *fuse.IoctlOut, outbuf []byte) fuse.Status {
	return fuse.Status(syscall.ENOTTY)
}

// GetLk, SetLk and SetLkw: the kernel keeps locks itself (locks are not
// enabled in the mount options), so these are not sent.

// GetLk implements GETLK.
func (r *rawFS) GetLk(cancel <-chan struct{}, in *fuse.LkIn, out *fuse.LkOut) fuse.Status {
	return fuse.ENOTSUP
}

// SetLk implements SETLK.
func (r *rawFS) SetLk(cancel <-chan struct{}, in *fuse.LkIn) fuse.Status {
	return fuse.ENOTSUP
}

// SetLkw implements SETLKW.
func (r *rawFS) SetLkw(cancel <-chan struct{}, in *fuse.LkIn) fuse.Status {
	return fuse.ENOTSUP
}
