package volfuse

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/shoal-dev/shoal/pkg/volfs"
)

// generation is the FUSE generation of every inode: volfs never reuses an
// inode number, so the pair (number, generation) is unique with a
// constant generation.
const generation = 1

// blockSize is the block size reported by stat and statfs.
const blockSize = 4096

// node is every inode of a mount: file, directory or symlink. It holds no
// state of its own beyond its number — attributes and contents are read
// from the volume on every request, so nothing goes stale when another
// node changes them.
type node struct {
	fs.Inode
	vol *volume
}

// handle is an open file. It only remembers O_APPEND: appends are done by
// the state machine at the file's size when the write applies, because
// the kernel's idea of the size may be stale when other nodes write.
type handle struct {
	append bool
}

var (
	_ fs.NodeLookuper   = (*node)(nil)
	_ fs.NodeGetattrer  = (*node)(nil)
	_ fs.NodeSetattrer  = (*node)(nil)
	_ fs.NodeCreater    = (*node)(nil)
	_ fs.NodeOpener     = (*node)(nil)
	_ fs.NodeReader     = (*node)(nil)
	_ fs.NodeWriter     = (*node)(nil)
	_ fs.NodeFlusher    = (*node)(nil)
	_ fs.NodeFsyncer    = (*node)(nil)
	_ fs.NodeMkdirer    = (*node)(nil)
	_ fs.NodeRmdirer    = (*node)(nil)
	_ fs.NodeUnlinker   = (*node)(nil)
	_ fs.NodeRenamer    = (*node)(nil)
	_ fs.NodeReaddirer  = (*node)(nil)
	_ fs.NodeSymlinker  = (*node)(nil)
	_ fs.NodeReadlinker = (*node)(nil)
	_ fs.NodeLinker     = (*node)(nil)
	_ fs.NodeStatfser   = (*node)(nil)
)

func (n *node) ino() uint64 { return n.StableAttr().Ino }

func fillAttr(a *volfs.Attr, out *fuse.Attr) {
	out.Ino = a.Ino
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

// child returns the kernel-facing inode of a, creating it on first sight.
func (n *node) child(ctx context.Context, a *volfs.Attr, out *fuse.EntryOut) *fs.Inode {
	fillAttr(a, &out.Attr)
	out.SetEntryTimeout(0)
	out.SetAttrTimeout(0)
	return n.NewInode(ctx, &node{vol: n.vol}, fs.StableAttr{Mode: a.Mode & volfs.ModeType, Ino: a.Ino, Gen: generation})
}

func (n *node) openFlags() uint32 {
	if n.vol.cached {
		// Without FOPEN_KEEP_CACHE the kernel drops cached pages at open.
		return 0
	}
	return fuse.FOPEN_DIRECT_IO
}

// Lookup implements fs.NodeLookuper.
func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	a, err := n.vol.c.Lookup(ctx, n.ino(), name)
	if err != nil {
		return nil, n.vol.errno("lookup", err)
	}
	return n.child(ctx, &a, out), 0
}

// Getattr implements fs.NodeGetattrer.
func (n *node) Getattr(ctx context.Context, _ fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	a, err := n.vol.c.GetAttr(ctx, n.ino())
	if err != nil {
		return n.vol.errno("getattr", err)
	}
	fillAttr(&a, &out.Attr)
	out.SetTimeout(0)
	return 0
}

// Setattr implements fs.NodeSetattrer (chmod, chown, truncate, utimes).
func (n *node) Setattr(ctx context.Context, _ fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
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
		a, err = n.vol.c.GetAttr(ctx, n.ino())
	} else {
		a, err = n.vol.c.Setattr(ctx, n.ino(), s)
	}
	if err != nil {
		return n.vol.errno("setattr", err)
	}
	fillAttr(&a, &out.Attr)
	out.SetTimeout(0)
	return 0
}

// Create implements fs.NodeCreater.
func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	uid, gid := ctxCaller(ctx)
	var cf uint32
	if flags&syscall.O_EXCL != 0 {
		cf |= volfs.CreateExcl
	}
	if flags&syscall.O_TRUNC != 0 {
		cf |= volfs.CreateTrunc
	}
	a, err := n.vol.c.Create(ctx, n.ino(), name, mode, uid, gid, cf)
	if err != nil {
		return nil, nil, 0, n.vol.errno("create", err)
	}
	return n.child(ctx, &a, out), &handle{append: flags&syscall.O_APPEND != 0}, n.openFlags(), 0
}

// Open implements fs.NodeOpener.
func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_TRUNC != 0 && flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		// The kernel passes O_TRUNC on only with atomic_o_trunc; doing it
		// here covers both cases.
		if _, err := n.vol.c.Setattr(ctx, n.ino(), volfs.SetAttr{Valid: volfs.SetSize}); err != nil {
			return nil, 0, n.vol.errno("open", err)
		}
	}
	return &handle{append: flags&syscall.O_APPEND != 0}, n.openFlags(), 0
}

// Read implements fs.NodeReader.
func (n *node) Read(ctx context.Context, _ fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	b, err := n.vol.c.Read(ctx, n.ino(), off, len(dest))
	if err != nil {
		return nil, n.vol.errno("read", err)
	}
	return fuse.ReadResultData(b), 0
}

// Write implements fs.NodeWriter.
func (n *node) Write(ctx context.Context, f fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	h, _ := f.(*handle)
	written, err := n.vol.c.Write(ctx, n.ino(), off, data, h != nil && h.append)
	if err != nil && written == 0 {
		return 0, n.vol.errno("write", err)
	}
	// A short write (a later chunk failed) reports what was written; the
	// caller's next write gets the error.
	return uint32(written), 0
}

// Flush implements fs.NodeFlusher: nothing is buffered here. ENOSYS tells
// the kernel so once and for all (it then returns success from close
// without asking again), which saves a round trip per close.
func (n *node) Flush(context.Context, fs.FileHandle) syscall.Errno { return syscall.ENOSYS }

// Fsync implements fs.NodeFsyncer. Every write was committed on a quorum
// of replicas before it was acknowledged, so there is nothing to sync.
// ENOSYS makes the kernel stop sending FSYNC for this mount and return
// success from fsync(2) itself: an O_DSYNC write was one request and a
// round trip for its implied fsync, now it is one. (A server that ever
// acknowledges writes before they commit must answer fsync instead.)
func (n *node) Fsync(context.Context, fs.FileHandle, uint32) syscall.Errno { return syscall.ENOSYS }

// Mkdir implements fs.NodeMkdirer.
func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	uid, gid := ctxCaller(ctx)
	a, err := n.vol.c.Mkdir(ctx, n.ino(), name, mode, uid, gid)
	if err != nil {
		return nil, n.vol.errno("mkdir", err)
	}
	return n.child(ctx, &a, out), 0
}

// Rmdir implements fs.NodeRmdirer.
func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	return n.vol.errno("rmdir", n.vol.c.Rmdir(ctx, n.ino(), name))
}

// Unlink implements fs.NodeUnlinker.
func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	return n.vol.errno("unlink", n.vol.c.Unlink(ctx, n.ino(), name))
}

// Rename implements fs.NodeRenamer (with RENAME_NOREPLACE and
// RENAME_EXCHANGE).
func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	np := newParent.EmbeddedInode().StableAttr().Ino
	return n.vol.errno("rename", n.vol.c.Rename(ctx, n.ino(), name, np, newName, flags))
}

// Readdir implements fs.NodeReaddirer.
func (n *node) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	ents, err := n.vol.c.Readdir(ctx, n.ino())
	if err != nil {
		return nil, n.vol.errno("readdir", err)
	}
	out := make([]fuse.DirEntry, len(ents))
	for i, e := range ents {
		out[i] = fuse.DirEntry{Name: e.Name, Ino: e.Ino, Mode: e.Mode & volfs.ModeType}
	}
	return fs.NewListDirStream(out), 0
}

// Symlink implements fs.NodeSymlinker.
func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	uid, gid := ctxCaller(ctx)
	a, err := n.vol.c.Symlink(ctx, n.ino(), name, target, uid, gid)
	if err != nil {
		return nil, n.vol.errno("symlink", err)
	}
	return n.child(ctx, &a, out), 0
}

// Readlink implements fs.NodeReadlinker.
func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	t, err := n.vol.c.Readlink(ctx, n.ino())
	if err != nil {
		return nil, n.vol.errno("readlink", err)
	}
	return []byte(t), 0
}

// Link implements fs.NodeLinker (hard links).
func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	a, err := n.vol.c.Link(ctx, target.EmbeddedInode().StableAttr().Ino, n.ino(), name)
	if err != nil {
		return nil, n.vol.errno("link", err)
	}
	return n.child(ctx, &a, out), 0
}

// unlimitedBlocks is the size statfs reports for a volume without a limit
// (1 PiB): df needs some total.
const unlimitedBlocks = 1 << 50 / blockSize

// Statfs implements fs.NodeStatfser: the size limit is the total, file
// data the used space.
func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	st, err := n.vol.c.Statfs(ctx)
	if err != nil {
		return n.vol.errno("statfs", err)
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
	return 0
}
