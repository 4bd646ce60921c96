package volfs

import (
	"math"
	"slices"
	"strings"
	"syscall"
)

// validName checks one path component.
func validName(name string) syscall.Errno {
	switch {
	case name == "" || name == "." || name == "..":
		return syscall.EINVAL
	case len(name) > MaxNameLen:
		return syscall.ENAMETOOLONG
	case strings.ContainsAny(name, "/\x00"):
		return syscall.EINVAL
	}
	return 0
}

func (fs *FS) dir(ino uint64) (*inode, syscall.Errno) {
	d := fs.inodes[ino]
	if d == nil {
		return nil, syscall.ENOENT
	}
	if !d.isDir() {
		return nil, syscall.ENOTDIR
	}
	return d, 0
}

// child returns directory parent and its entry name's inode.
func (fs *FS) child(parent uint64, name string) (*inode, *inode, syscall.Errno) {
	d, e := fs.dir(parent)
	if e != 0 {
		return nil, nil, e
	}
	if e := validName(name); e != 0 {
		return nil, nil, e
	}
	ino, ok := d.entries[name]
	if !ok {
		return d, nil, syscall.ENOENT
	}
	return d, fs.inodes[ino], 0
}

func attrResult(n *inode) *Result { return &Result{Attr: n.attr()} }

func fail(e syscall.Errno) *Result { return &Result{Errno: e} }

// mutate applies one mutation at group time now.
func (fs *FS) mutate(op *Op, now int64) *Result {
	switch op.Kind {
	case KindCreate:
		return fs.create(op, now)
	case KindMkdir, KindSymlink:
		return fs.mknode(op, now)
	case KindMknod:
		// Before LevelSpecial, and for device nodes always: what Linux
		// file systems without them answer.
		if t := op.Mode & ModeType; fs.level < LevelSpecial || t != ModeFIFO && t != ModeSocket {
			return fail(syscall.EPERM)
		}
		return fs.mknode(op, now)
	case KindLink:
		return fs.link(op, now)
	case KindUnlink, KindRmdir:
		return fs.remove(op, now)
	case KindRename:
		return fs.rename(op, now)
	case KindSetattr:
		return fs.setattr(op, now)
	case KindWrite:
		return fs.write(op, now)
	case KindForget:
		return fs.forget(op)
	case KindSetLevel:
		// Apply refused levels above MaxLevel; a level at or below the
		// volume's is a leader's repeated raise, and does nothing.
		if op.Size == 0 {
			return fail(syscall.EINVAL)
		}
		fs.level = max(fs.level, uint32(op.Size))
		return &Result{Statfs: fs.statfs()}
	case KindSetLimit:
		if op.Size > math.MaxInt64 {
			return fail(syscall.EINVAL)
		}
		fs.limit = int64(op.Size)
		return &Result{Statfs: fs.statfs()}
	}
	return fail(syscall.EINVAL)
}

// newInode allocates the next inode number: numbers only grow, so a number
// names one inode for the volume's lifetime (stable FUSE inode numbers,
// no generation juggling).
func (fs *FS) newInode(d *inode, mode, uid, gid uint32, now int64) *inode {
	n := &inode{ino: fs.nextIno, mode: mode, uid: uid, gid: gid, nlink: 1, atime: now, mtime: now, ctime: now}
	fs.nextIno++
	// A setgid directory hands its group down (and, to directories, the
	// setgid bit itself), as on ext4.
	if d.mode&ModeSetgid != 0 {
		n.gid = d.gid
		if mode&ModeType == ModeDir {
			n.mode |= ModeSetgid
		}
	}
	fs.inodes[n.ino] = n
	return n
}

func touch(d *inode, now int64) { d.mtime, d.ctime = now, now }

func (fs *FS) create(op *Op, now int64) *Result {
	d, n, e := fs.child(op.Parent, op.Name)
	if e != 0 && e != syscall.ENOENT || d == nil {
		return fail(e)
	}
	if n != nil {
		// The name exists: another node created it after this node's
		// kernel looked. Without O_EXCL that is an open of the file.
		switch {
		case op.Flags&CreateExcl != 0:
			return fail(syscall.EEXIST)
		case n.isDir():
			return fail(syscall.EISDIR)
		case !n.isRegular():
			return fail(syscall.EEXIST)
		}
		if op.Flags&CreateTrunc != 0 && n.data.len() > 0 {
			fs.resize(n, 0)
			touch(n, now)
		}
		return attrResult(n)
	}
	n = fs.newInode(d, ModeRegular|op.Mode&ModePerm, op.UID, op.GID, now)
	d.entries[op.Name] = n.ino
	touch(d, now)
	return attrResult(n)
}

// mknode makes a directory, a symbolic link, a FIFO or a socket.
func (fs *FS) mknode(op *Op, now int64) *Result {
	d, n, e := fs.child(op.Parent, op.Name)
	if e != 0 && e != syscall.ENOENT || d == nil {
		return fail(e)
	}
	if n != nil {
		return fail(syscall.EEXIST)
	}
	if op.Kind == KindSymlink {
		switch {
		case len(op.Data) == 0:
			return fail(syscall.ENOENT)
		case len(op.Data) > MaxSymlinkLen:
			return fail(syscall.ENAMETOOLONG)
		}
		n = fs.newInode(d, ModeSymlink|0o777, op.UID, op.GID, now)
		n.target = string(op.Data)
	} else if op.Kind == KindMknod {
		n = fs.newInode(d, op.Mode&(ModeType|ModePerm), op.UID, op.GID, now)
	} else {
		if d.nlink >= math.MaxUint32-1 {
			return fail(syscall.EMLINK)
		}
		n = fs.newInode(d, ModeDir|op.Mode&ModePerm, op.UID, op.GID, now)
		n.nlink = 2
		n.parent = d.ino
		n.entries = map[string]uint64{}
		d.nlink++
	}
	d.entries[op.Name] = n.ino
	touch(d, now)
	return attrResult(n)
}

func (fs *FS) link(op *Op, now int64) *Result {
	n := fs.inodes[op.Ino]
	if n == nil || n.heldSession != "" {
		// A file without a name cannot get one back, as on Linux
		// (O_TMPFILE aside, which volumes do not offer).
		return fail(syscall.ENOENT)
	}
	if n.isDir() {
		return fail(syscall.EPERM)
	}
	d, existing, e := fs.child(op.NewParent, op.NewName)
	if e != 0 && e != syscall.ENOENT || d == nil {
		return fail(e)
	}
	if existing != nil {
		return fail(syscall.EEXIST)
	}
	if n.nlink >= math.MaxUint32-1 {
		return fail(syscall.EMLINK)
	}
	d.entries[op.NewName] = n.ino
	n.nlink++
	n.ctime = now
	touch(d, now)
	return attrResult(n)
}

// remove is unlink and rmdir.
func (fs *FS) remove(op *Op, now int64) *Result {
	d, n, e := fs.child(op.Parent, op.Name)
	if e != 0 {
		return fail(e)
	}
	if op.Kind == KindUnlink {
		if n.isDir() {
			return fail(syscall.EISDIR)
		}
	} else {
		if !n.isDir() {
			return fail(syscall.ENOTDIR)
		}
		if len(n.entries) > 0 {
			return fail(syscall.ENOTEMPTY)
		}
	}
	delete(d.entries, op.Name)
	touch(d, now)
	return fs.unref(d, n, op, now)
}

// unref drops one name of n (just removed from directory d by op) and
// frees n when it was the last, unless it is a regular file that op's
// mount has open: then the mount holds it (see the package
// documentation) until a Forget, and the result carries its attributes
// to say so.
func (fs *FS) unref(d, n *inode, op *Op, now int64) *Result {
	n.ctime = now
	if n.isDir() {
		d.nlink--
		delete(fs.inodes, n.ino)
		return &Result{}
	}
	n.nlink--
	if n.nlink > 0 {
		return &Result{}
	}
	if n.isRegular() && op.Session != "" && slices.Contains(op.Open, n.ino) {
		n.heldNode, n.heldSession = op.Node, op.Session
		fs.held[n.ino] = struct{}{}
		return attrResult(n)
	}
	fs.free(n)
	return &Result{}
}

func (fs *FS) free(n *inode) {
	fs.used -= int64(n.data.len())
	delete(fs.inodes, n.ino)
	delete(fs.held, n.ino)
}

// forget frees the open-unlinked files op names (see the Forget flags).
// Forgetting a file that is not held, or held by another mount, does
// nothing: a mount forgets what it may hold, and another mount's files
// stay.
func (fs *FS) forget(op *Op) *Result {
	if op.Flags&^(ForgetSession|ForgetOthers) != 0 || op.Flags == ForgetSession|ForgetOthers || op.Session == "" && op.Flags != ForgetOthers {
		return fail(syscall.EINVAL)
	}
	if op.Flags == 0 {
		if n := fs.inodes[op.Ino]; n != nil && n.heldSession == op.Session && n.heldNode == op.Node {
			fs.free(n)
		}
		return &Result{}
	}
	for ino := range fs.held {
		n := fs.inodes[ino]
		switch {
		case n.heldNode != op.Node:
		case op.Flags == ForgetSession && n.heldSession == op.Session,
			op.Flags == ForgetOthers && n.heldSession != op.Session:
			fs.free(n)
		}
	}
	return &Result{}
}

// within reports whether directory d is dir or lies below it.
func (fs *FS) within(d, dir *inode) bool {
	cur := d
	for range len(fs.inodes) + 1 {
		if cur.ino == dir.ino {
			return true
		}
		if cur.ino == RootIno {
			return false
		}
		cur = fs.inodes[cur.parent]
	}
	return false
}

func (fs *FS) rename(op *Op, now int64) *Result {
	if op.Flags&^(RenameNoReplace|RenameExchange) != 0 || op.Flags == RenameNoReplace|RenameExchange {
		return fail(syscall.EINVAL)
	}
	sd, src, e := fs.child(op.Parent, op.Name)
	if e != 0 {
		return fail(e)
	}
	dd, dst, e := fs.child(op.NewParent, op.NewName)
	if e != 0 && e != syscall.ENOENT || dd == nil {
		return fail(e)
	}
	if op.Flags&RenameExchange != 0 {
		return fs.exchange(op, sd, src, dd, dst, now)
	}
	if dst != nil {
		switch {
		case op.Flags&RenameNoReplace != 0:
			return fail(syscall.EEXIST)
		case dst == src:
			// Two names of one inode (or the same name): POSIX says do
			// nothing and succeed.
			return &Result{}
		case src.isDir() && !dst.isDir():
			return fail(syscall.ENOTDIR)
		case !src.isDir() && dst.isDir():
			return fail(syscall.EISDIR)
		case dst.isDir() && len(dst.entries) > 0:
			return fail(syscall.ENOTEMPTY)
		}
	}
	if src.isDir() && fs.within(dd, src) {
		return fail(syscall.EINVAL)
	}
	res := &Result{}
	if dst != nil {
		res = fs.unref(dd, dst, op, now)
	}
	delete(sd.entries, op.Name)
	dd.entries[op.NewName] = src.ino
	if src.isDir() && sd != dd {
		sd.nlink--
		dd.nlink++
		src.parent = dd.ino
	}
	src.ctime = now
	touch(sd, now)
	touch(dd, now)
	return res
}

func (fs *FS) exchange(op *Op, sd, src, dd, dst *inode, now int64) *Result {
	if dst == nil {
		return fail(syscall.ENOENT)
	}
	if src == dst {
		return &Result{}
	}
	if src.isDir() && fs.within(dd, src) || dst.isDir() && fs.within(sd, dst) {
		return fail(syscall.EINVAL)
	}
	sd.entries[op.Name], dd.entries[op.NewName] = dst.ino, src.ino
	if sd != dd {
		if src.isDir() {
			src.parent = dd.ino
			sd.nlink--
			dd.nlink++
		}
		if dst.isDir() {
			dst.parent = sd.ino
			dd.nlink--
			sd.nlink++
		}
	}
	src.ctime, dst.ctime = now, now
	touch(sd, now)
	touch(dd, now)
	return &Result{}
}

// room reports whether growing the data by grow bytes fits the limit.
func (fs *FS) room(grow int64) bool {
	return grow <= 0 || fs.limit == 0 || fs.used+grow <= fs.limit
}

// resize sets a regular file's length; new bytes are zero.
func (fs *FS) resize(n *inode, size int) {
	fs.used += int64(size - n.data.len())
	n.data.resize(size)
}

func (fs *FS) setattr(op *Op, now int64) *Result {
	n := fs.inodes[op.Ino]
	if n == nil {
		return fail(syscall.ENOENT)
	}
	// Check everything before changing anything: an op applies whole or
	// not at all.
	if op.Valid&SetSize != 0 {
		switch {
		case n.isDir():
			return fail(syscall.EISDIR)
		case !n.isRegular():
			return fail(syscall.EINVAL)
		case op.Size > MaxFileSize:
			return fail(syscall.EFBIG)
		case !fs.room(int64(op.Size) - int64(n.data.len())):
			return fail(syscall.ENOSPC)
		}
	}
	if op.Valid&SetMode != 0 {
		n.mode = n.mode&ModeType | op.Mode&ModePerm
	}
	if op.Valid&SetUID != 0 {
		n.uid = op.UID
	}
	if op.Valid&SetGID != 0 {
		n.gid = op.GID
	}
	if op.Valid&SetSize != 0 {
		if int(op.Size) != n.data.len() {
			fs.resize(n, int(op.Size))
		}
		// truncate(2) updates mtime even when the size stays.
		n.mtime = now
	}
	switch {
	case op.Valid&SetAtimeNow != 0:
		n.atime = now
	case op.Valid&SetAtime != 0:
		n.atime = op.Atime
	}
	switch {
	case op.Valid&SetMtimeNow != 0:
		n.mtime = now
	case op.Valid&SetMtime != 0:
		n.mtime = op.Mtime
	}
	n.ctime = now
	return attrResult(n)
}

func (fs *FS) write(op *Op, now int64) *Result {
	n := fs.inodes[op.Ino]
	switch {
	case n == nil:
		return fail(syscall.ENOENT)
	case n.isDir():
		return fail(syscall.EISDIR)
	case !n.isRegular():
		return fail(syscall.EINVAL)
	}
	off := op.Offset
	if op.Flags&WriteAppend != 0 {
		off = uint64(n.data.len())
	}
	if off > MaxFileSize || uint64(len(op.Data)) > MaxFileSize-off {
		return fail(syscall.EFBIG)
	}
	if len(op.Data) == 0 {
		return attrResult(n)
	}
	end := int(off) + len(op.Data)
	if !fs.room(int64(end - n.data.len())) {
		return fail(syscall.ENOSPC)
	}
	fs.used += int64(max(end-n.data.len(), 0))
	n.data.writeAt(op.Data, int(off))
	n.mtime, n.ctime = now, now
	return attrResult(n)
}

func (fs *FS) statfs() *Statfs {
	return &Statfs{Limit: fs.limit, Used: fs.used, Inodes: uint64(len(fs.inodes)), Held: uint64(len(fs.held)), Level: fs.level}
}

// query answers a read.
func (fs *FS) query(op *Op) *Result {
	switch op.Kind {
	case KindLookup:
		d, e := fs.dir(op.Parent)
		if e != 0 {
			return fail(e)
		}
		switch op.Name {
		case ".":
			return attrResult(d)
		case "..":
			return attrResult(fs.inodes[d.parent])
		}
		_, n, e := fs.child(op.Parent, op.Name)
		if e != 0 {
			return fail(e)
		}
		return attrResult(n)
	case KindGetattr:
		n := fs.inodes[op.Ino]
		if n == nil {
			return fail(syscall.ENOENT)
		}
		return attrResult(n)
	case KindReaddir:
		return fs.readdir(op)
	case KindRead:
		n := fs.inodes[op.Ino]
		switch {
		case n == nil:
			return fail(syscall.ENOENT)
		case n.isDir():
			return fail(syscall.EISDIR)
		case !n.isRegular():
			return fail(syscall.EINVAL)
		}
		if op.Offset >= uint64(n.data.len()) {
			return &Result{}
		}
		// Copied: the file may change once the lock is released.
		return &Result{Data: n.data.readAt(int(op.Offset), int(min(op.Size, MaxReadChunk)))}
	case KindReadlink:
		n := fs.inodes[op.Ino]
		switch {
		case n == nil:
			return fail(syscall.ENOENT)
		case !n.isSymlink():
			return fail(syscall.EINVAL)
		}
		return &Result{Data: []byte(n.target)}
	case KindStatfs:
		return &Result{Statfs: fs.statfs()}
	}
	return fail(syscall.EINVAL)
}

// readdir lists up to a page of entries after op.After, in name order.
func (fs *FS) readdir(op *Op) *Result {
	d, e := fs.dir(op.Ino)
	if e != 0 {
		return fail(e)
	}
	names := make([]string, 0, min(len(d.entries), readdirPage))
	for name := range d.entries {
		if name > op.After {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	r := &Result{}
	if len(names) > readdirPage {
		names, r.More = names[:readdirPage], true
	}
	r.Entries = make([]DirEntry, len(names))
	for i, name := range names {
		ino := d.entries[name]
		r.Entries[i] = DirEntry{Name: name, Ino: ino, Mode: fs.inodes[ino].mode}
	}
	return r
}
