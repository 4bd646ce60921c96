package volfs

import (
	"context"
	"errors"
	"fmt"
	"syscall"
)

// Backend carries encoded ops to a volume's Raft group. vold implements it
// locally (raftgroup Submit; ReadIndex then FS.Query on the local replica)
// and remotely (forwarding the same bytes to a node holding a replica).
type Backend interface {
	// Mutate proposes an encoded op to the group and returns the encoded
	// result once applied.
	Mutate(ctx context.Context, op []byte) ([]byte, error)
	// Query runs an encoded query linearizably (after a ReadIndex) on some
	// replica.
	Query(ctx context.Context, req []byte) ([]byte, error)
}

// Client is the typed API of a volume over a Backend. File system errors
// are returned as syscall.Errno values (compare with errors.Is or ==);
// anything else is a Backend failure, wrapped.
type Client struct {
	B Backend
}

// Errno maps an error from Client to the errno to hand the kernel:
// itself when it is one, EINTR for a cancelled request, EIO otherwise.
func Errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	if errors.Is(err, context.Canceled) {
		return syscall.EINTR
	}
	return syscall.EIO
}

func (c *Client) do(ctx context.Context, op *Op) (Result, error) {
	var (
		b   []byte
		err error
	)
	if op.Kind.IsMutation() {
		b, err = c.B.Mutate(ctx, op.Encode())
	} else {
		b, err = c.B.Query(ctx, op.Encode())
	}
	if err != nil {
		return Result{}, fmt.Errorf("volfs: %v: %w", op.Kind, err)
	}
	r, err := DecodeResult(b)
	if err != nil {
		return Result{}, fmt.Errorf("volfs: %v result: %w", op.Kind, err)
	}
	if r.Errno != 0 {
		return r, r.Errno
	}
	return r, nil
}

func (c *Client) attr(ctx context.Context, op *Op) (Attr, error) {
	r, err := c.do(ctx, op)
	if err != nil {
		return Attr{}, err
	}
	if r.Attr == nil {
		return Attr{}, fmt.Errorf("volfs: %v: result without attributes: %w", op.Kind, ErrMalformed)
	}
	return *r.Attr, nil
}

// Lookup returns the attributes of name in directory parent.
func (c *Client) Lookup(ctx context.Context, parent uint64, name string) (Attr, error) {
	return c.attr(ctx, &Op{Kind: KindLookup, Parent: parent, Name: name})
}

// GetAttr returns inode ino's attributes.
func (c *Client) GetAttr(ctx context.Context, ino uint64) (Attr, error) {
	return c.attr(ctx, &Op{Kind: KindGetattr, Ino: ino})
}

// Create creates regular file name in parent with permission bits mode,
// owned by uid:gid. flags are CreateExcl and CreateTrunc; without
// CreateExcl an existing regular file is returned (opened) instead.
func (c *Client) Create(ctx context.Context, parent uint64, name string, mode, uid, gid, flags uint32) (Attr, error) {
	return c.attr(ctx, &Op{Kind: KindCreate, Parent: parent, Name: name, Mode: mode, UID: uid, GID: gid, Flags: flags})
}

// Mkdir creates directory name in parent.
func (c *Client) Mkdir(ctx context.Context, parent uint64, name string, mode, uid, gid uint32) (Attr, error) {
	return c.attr(ctx, &Op{Kind: KindMkdir, Parent: parent, Name: name, Mode: mode, UID: uid, GID: gid})
}

// Mknod creates FIFO or socket name in parent: mode's type bits say which
// (ModeFIFO, ModeSocket). Device nodes, and any before the volume is at
// LevelSpecial, are EPERM.
func (c *Client) Mknod(ctx context.Context, parent uint64, name string, mode, uid, gid uint32) (Attr, error) {
	return c.attr(ctx, &Op{Kind: KindMknod, Parent: parent, Name: name, Mode: mode, UID: uid, GID: gid})
}

// Symlink creates symbolic link name in parent pointing at target.
func (c *Client) Symlink(ctx context.Context, parent uint64, name, target string, uid, gid uint32) (Attr, error) {
	return c.attr(ctx, &Op{Kind: KindSymlink, Parent: parent, Name: name, Data: []byte(target), UID: uid, GID: gid})
}

// Link adds name newName in newParent for inode ino (a hard link).
func (c *Client) Link(ctx context.Context, ino, newParent uint64, newName string) (Attr, error) {
	return c.attr(ctx, &Op{Kind: KindLink, Ino: ino, NewParent: newParent, NewName: newName})
}

// Unlink removes non-directory name from parent.
func (c *Client) Unlink(ctx context.Context, parent uint64, name string) error {
	_, err := c.UnlinkHolding(ctx, parent, name, Holder{})
	return err
}

// UnlinkHolding is Unlink from a mount that has files open: if name was
// the last name of one of h.Open, h keeps that file until it forgets it,
// and held is its inode number (0 otherwise).
func (c *Client) UnlinkHolding(ctx context.Context, parent uint64, name string, h Holder) (held uint64, err error) {
	return c.holding(ctx, h.on(&Op{Kind: KindUnlink, Parent: parent, Name: name}))
}

func (c *Client) holding(ctx context.Context, op *Op) (uint64, error) {
	r, err := c.do(ctx, op)
	if err != nil || r.Attr == nil {
		return 0, err
	}
	return r.Attr.Ino, nil
}

// Rmdir removes empty directory name from parent.
func (c *Client) Rmdir(ctx context.Context, parent uint64, name string) error {
	_, err := c.do(ctx, &Op{Kind: KindRmdir, Parent: parent, Name: name})
	return err
}

// Rename moves parent/name to newParent/newName, replacing a compatible
// existing target. flags are RenameNoReplace or RenameExchange.
func (c *Client) Rename(ctx context.Context, parent uint64, name string, newParent uint64, newName string, flags uint32) error {
	_, err := c.RenameHolding(ctx, parent, name, newParent, newName, flags, Holder{})
	return err
}

// RenameHolding is Rename from a mount that has files open: a replaced
// target that is one of h.Open and loses its last name is kept for h,
// and held is its inode number (0 otherwise).
func (c *Client) RenameHolding(ctx context.Context, parent uint64, name string, newParent uint64, newName string, flags uint32, h Holder) (held uint64, err error) {
	return c.holding(ctx, h.on(&Op{Kind: KindRename, Parent: parent, Name: name, NewParent: newParent, NewName: newName, Flags: flags}))
}

// Forget frees file ino if h's session holds it (its last open handle
// there has closed). A file that is not held, or held by another
// session, stays.
func (c *Client) Forget(ctx context.Context, h Holder, ino uint64) error {
	return c.forget(ctx, h, ino, 0)
}

// ForgetSession frees every file h's session holds (its mount has ended).
func (c *Client) ForgetSession(ctx context.Context, h Holder) error {
	return c.forget(ctx, h, 0, ForgetSession)
}

// ForgetOthers frees every file held by a session of h.Node other than
// h.Session: a node mounting a volume afresh has no other session of it
// left. With h.Session empty it frees every file the node holds (a node
// gone for good).
func (c *Client) ForgetOthers(ctx context.Context, h Holder) error {
	return c.forget(ctx, h, 0, ForgetOthers)
}

func (c *Client) forget(ctx context.Context, h Holder, ino uint64, flags uint32) error {
	if h.Session == "" && flags != ForgetOthers {
		return syscall.EINVAL
	}
	_, err := c.do(ctx, h.on(&Op{Kind: KindForget, Ino: ino, Flags: flags}))
	return err
}

// Setattr changes the attributes of ino that s.Valid selects and returns
// the new attributes.
func (c *Client) Setattr(ctx context.Context, ino uint64, s SetAttr) (Attr, error) {
	return c.attr(ctx, &Op{
		Kind: KindSetattr, Ino: ino, Valid: s.Valid, Mode: s.Mode, UID: s.UID, GID: s.GID,
		Size: s.Size, Atime: s.Atime, Mtime: s.Mtime,
	})
}

// Write writes data at off (or, with appendMode, at the end of the file
// as each chunk applies) and returns the bytes written. Data beyond
// MaxWriteChunk goes in several ops: each is atomic, the whole is not, and
// on an error the bytes of the chunks already applied are reported.
func (c *Client) Write(ctx context.Context, ino uint64, off int64, data []byte, appendMode bool) (int, error) {
	if off < 0 {
		return 0, syscall.EINVAL
	}
	op := Op{Kind: KindWrite, Ino: ino}
	if appendMode {
		op.Flags = WriteAppend
	}
	done := 0
	for i := 0; ; i++ {
		n := min(len(data)-done, MaxWriteChunk)
		op.Offset = uint64(off) + uint64(done)
		op.Data = data[done : done+n]
		if _, err := c.attr(chunkKey(ctx, i), &op); err != nil {
			return done, err
		}
		done += n
		if done == len(data) {
			return done, nil
		}
	}
}

// Read reads up to size bytes at off; fewer at the end of the file.
func (c *Client) Read(ctx context.Context, ino uint64, off int64, size int) ([]byte, error) {
	if off < 0 || size < 0 {
		return nil, syscall.EINVAL
	}
	var out []byte
	for len(out) < size {
		want := min(size-len(out), MaxReadChunk)
		r, err := c.do(ctx, &Op{Kind: KindRead, Ino: ino, Offset: uint64(off) + uint64(len(out)), Size: uint64(want)})
		if err != nil {
			return out, err
		}
		if out == nil && len(r.Data) == size {
			return r.Data, nil
		}
		out = append(out, r.Data...)
		if len(r.Data) < want {
			break
		}
	}
	return out, nil
}

// Readdir lists directory ino in name order (without "." and "..").
func (c *Client) Readdir(ctx context.Context, ino uint64) ([]DirEntry, error) {
	var out []DirEntry
	after := ""
	for {
		r, err := c.do(ctx, &Op{Kind: KindReaddir, Ino: ino, After: after})
		if err != nil {
			return nil, err
		}
		out = append(out, r.Entries...)
		if !r.More || len(r.Entries) == 0 {
			return out, nil
		}
		after = r.Entries[len(r.Entries)-1].Name
	}
}

// Readlink returns a symbolic link's target.
func (c *Client) Readlink(ctx context.Context, ino uint64) (string, error) {
	r, err := c.do(ctx, &Op{Kind: KindReadlink, Ino: ino})
	if err != nil {
		return "", err
	}
	return string(r.Data), nil
}

// Statfs returns the volume's limit and usage.
func (c *Client) Statfs(ctx context.Context) (Statfs, error) {
	r, err := c.do(ctx, &Op{Kind: KindStatfs})
	if err != nil {
		return Statfs{}, err
	}
	if r.Statfs == nil {
		return Statfs{}, fmt.Errorf("volfs: statfs: empty result: %w", ErrMalformed)
	}
	return *r.Statfs, nil
}

// SetLimit sets the volume's size limit in bytes (0: unlimited). Data
// already above a lowered limit stays; it can only shrink.
func (c *Client) SetLimit(ctx context.Context, bytes int64) error {
	if bytes < 0 {
		return syscall.EINVAL
	}
	_, err := c.do(ctx, &Op{Kind: KindSetLimit, Size: uint64(bytes)})
	return err
}

// SetLevel raises the volume to level (see MaxLevel) and returns the
// level it is at. Only a volume whose every replica's vold knows level
// may be raised: a replica that does not stops applying. A level at or
// below the volume's changes nothing.
func (c *Client) SetLevel(ctx context.Context, level uint32) (uint32, error) {
	if level == 0 {
		return 0, syscall.EINVAL
	}
	r, err := c.do(ctx, &Op{Kind: KindSetLevel, Size: uint64(level)})
	if err != nil {
		return 0, err
	}
	if r.Statfs == nil {
		// A vold before levels answers EINVAL, so this is a bug.
		return 0, fmt.Errorf("volfs: setlevel: %w: no statfs in the result", ErrMalformed)
	}
	return r.Statfs.Level, nil
}

// Digest returns the replica's state digest (see FS.Digest) at a
// linearizable point.
func (c *Client) Digest(ctx context.Context) ([32]byte, error) {
	var d [32]byte
	r, err := c.do(ctx, &Op{Kind: KindDigest})
	if err != nil {
		return d, err
	}
	if len(r.Data) != len(d) {
		return d, fmt.Errorf("volfs: digest of %d bytes: %w", len(r.Data), ErrMalformed)
	}
	copy(d[:], r.Data)
	return d, nil
}
