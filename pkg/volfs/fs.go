package volfs

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"syscall"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
)

// inode is one file, directory or symbolic link.
type inode struct {
	ino                 uint64
	mode                uint32
	uid, gid            uint32
	nlink               uint32
	atime, mtime, ctime int64
	// parent is a directory's parent (the root's is itself). Directories
	// have exactly one name, so one pointer is enough; it is what rename
	// walks up to refuse moving a directory into its own subtree.
	parent  uint64
	data    fileData          // regular files
	target  string            // symbolic links
	entries map[string]uint64 // directories
	// heldNode and heldSession name the mount that keeps this regular
	// file, which has no name left (nlink 0), while a process there has
	// it open; empty for every inode with a name.
	heldNode, heldSession string
}

func (n *inode) isDir() bool     { return n.mode&ModeType == ModeDir }
func (n *inode) isRegular() bool { return n.mode&ModeType == ModeRegular }
func (n *inode) isSymlink() bool { return n.mode&ModeType == ModeSymlink }

func (n *inode) attr() *Attr {
	a := &Attr{
		Ino: n.ino, Mode: n.mode, Nlink: n.nlink, UID: n.uid, GID: n.gid,
		Atime: n.atime, Mtime: n.mtime, Ctime: n.ctime,
	}
	switch {
	case n.isRegular():
		a.Size = uint64(n.data.len())
	case n.isSymlink():
		a.Size = uint64(len(n.target))
	case n.isDir():
		// Directories report a nominal size, like most filesystems.
		a.Size = 4096
	}
	return a
}

// FS is a volume's filesystem: a raftgroup.StateMachine whose every
// mutation is an encoded Op applied in log order, and whose reads (Query)
// run against the local replica. See the package documentation.
//
// The host calls Apply, Snapshot and Restore from its loop; Query, Used,
// Digest and Summary may be called from any goroutine (a read-write mutex
// orders them with Apply).
type FS struct {
	mu      sync.RWMutex
	inodes  map[uint64]*inode
	nextIno uint64
	limit   int64
	used    int64 // total length of regular files' data
	// held is the set of open-unlinked files (inodes with heldSession).
	held map[uint64]struct{}
	// level is the volume's level (LevelBase, ...; see MaxLevel): which
	// semantics its entries are applied with.
	level   uint32
	applied uint64
	// version counts the changes of the state (applies, restores; New's
	// is 1): memo is the digest Summary last computed, of the state at
	// memoVersion (0: none yet).
	version     uint64
	memoVersion uint64
	memo        [32]byte
}

var _ raftgroup.SnapshotForker = (*FS)(nil)

// New returns a volume holding only its root directory (mode 0755, owned
// by root). Every replica starts from the same New state, so they agree
// on it without a log entry.
func New() *FS {
	fs := &FS{}
	fs.reset()
	return fs
}

func (fs *FS) reset() {
	fs.inodes = map[uint64]*inode{
		RootIno: {ino: RootIno, mode: ModeDir | 0o755, nlink: 2, parent: RootIno, entries: map[string]uint64{}},
	}
	fs.nextIno = RootIno + 1
	fs.held = map[uint64]struct{}{}
	fs.limit, fs.used, fs.applied = 0, 0, 0
	fs.level = LevelBase
	fs.version++
}

// Used returns the total bytes of file data.
func (fs *FS) Used() int64 {
	fs.mu.RLock()
	defer fs.mu.RUnlock()
	return fs.used
}

// Held returns the number of open-unlinked files the volume keeps.
func (fs *FS) Held() uint64 {
	fs.mu.RLock()
	defer fs.mu.RUnlock()
	return uint64(len(fs.held))
}

// HeldNodes returns the nodes whose mounts hold open-unlinked files, in
// order.
func (fs *FS) HeldNodes() []string {
	fs.mu.RLock()
	defer fs.mu.RUnlock()
	var nodes []string
	for ino := range fs.held {
		if n := fs.inodes[ino].heldNode; !slices.Contains(nodes, n) {
			nodes = append(nodes, n)
		}
	}
	slices.Sort(nodes)
	return nodes
}

// Level returns the volume's level (see MaxLevel).
func (fs *FS) Level() uint32 {
	fs.mu.RLock()
	defer fs.mu.RUnlock()
	return fs.level
}

// Applied returns the index of the last entry applied (as of the last
// snapshot restored, or entry applied since).
func (fs *FS) Applied() uint64 {
	fs.mu.RLock()
	defer fs.mu.RUnlock()
	return fs.applied
}

// Apply implements raftgroup.StateMachine. It never fails: an op that
// does not decode or does not apply yields a result with an errno, the
// same on every replica. A file may keep a write's bytes in place (see
// fileData), so entries' data must never change afterwards, as
// raftgroup.StateMachine promises.
func (fs *FS) Apply(entries []raftgroup.Entry) ([][]byte, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.version++
	out := make([][]byte, len(entries))
	for i, e := range entries {
		var now int64
		if !e.Time.IsZero() {
			now = e.Time.UnixNano()
		}
		r, err := fs.apply(e.Data, now)
		if err != nil {
			return nil, fmt.Errorf("volfs: entry %d: %w", e.Index, err)
		}
		out[i] = r.Encode()
		fs.applied = e.Index
	}
	return out, nil
}

// ErrLevel is why a replica stops applying a volume's entries: they
// raise the volume to a level this code does not know (a newer vold's),
// and applying the entries after it with this code's semantics would
// make this replica diverge from the others.
var ErrLevel = errors.New("volume level unknown to this vold")

func (fs *FS) apply(data []byte, now int64) (*Result, error) {
	op, err := DecodeOp(data)
	if err != nil || !op.Kind.IsMutation() {
		return &Result{Errno: syscall.EINVAL}, nil
	}
	if op.Kind == KindSetLevel && op.Size > uint64(MaxLevel) {
		return nil, fmt.Errorf("%w: level %d, this vold knows up to %d", ErrLevel, op.Size, MaxLevel)
	}
	return fs.mutate(&op, now), nil
}

// Query runs an encoded query against the local state and returns the
// encoded Result. For a linearizable read, call it after a ReadIndex
// (Backend.Query). It returns an error only for bytes that are not a
// query at all; file system errors travel in the Result.
func (fs *FS) Query(req []byte) ([]byte, error) {
	op, err := DecodeOp(req)
	if err != nil {
		return nil, fmt.Errorf("volfs: query: %w", err)
	}
	if !op.Kind.IsQuery() {
		return nil, fmt.Errorf("volfs: %v is not a query: %w", op.Kind, ErrMalformed)
	}
	if op.Kind == KindDigest {
		// Hashed outside the lock (Summary).
		d := fs.Digest()
		return (&Result{Data: d[:]}).Encode(), nil
	}
	fs.mu.RLock()
	defer fs.mu.RUnlock()
	return fs.query(&op).Encode(), nil
}

// Summary returns the digest, the used bytes and the applied index, all
// of one state. Hashing a large volume takes long (SHA-256 of every
// byte), and Apply waiting for it meanwhile would stall every write into
// the volume (every replica's, when an operator inspects it): the state
// is forked under the lock (as ForkSnapshot does, so the first write
// into each page afterwards copies the page) and hashed outside it. The
// digest is kept until the state changes, so asking again about an idle
// volume forks and hashes nothing.
func (fs *FS) Summary() (digest [32]byte, used int64, applied uint64) {
	fs.mu.Lock()
	if fs.memoVersion == fs.version {
		defer fs.mu.Unlock()
		return fs.memo, fs.used, fs.applied
	}
	frozen, version := fs.fork(), fs.version
	fs.mu.Unlock()
	hashing()
	digest = frozen.digest()
	fs.mu.Lock()
	if fs.memoVersion < version {
		fs.memo, fs.memoVersion = digest, version
	}
	fs.mu.Unlock()
	return digest, frozen.used, frozen.applied
}

// hashing is called by Summary while it hashes outside the lock (a test's
// hook).
var hashing = func() {}

// Digest returns a SHA-256 of the whole filesystem state (inodes, data,
// directories, limit, inode counter), excluding the applied index:
// replicas that applied the same entries have the same digest. It is
// Summary's.
func (fs *FS) Digest() [32]byte {
	d, _, _ := fs.Summary()
	return d
}

func (fs *FS) digest() [32]byte {
	h := sha256.New()
	fs.writeState(h, false)
	var d [32]byte
	h.Sum(d[:0])
	return d
}

// Snapshot fields.
const (
	fSnapVersion protowire.Number = iota + 1
	fSnapNextIno
	fSnapLimit
	fSnapApplied
	fSnapInode
)

// Snapshot inode fields.
const (
	fInoIno protowire.Number = iota + 1
	fInoMode
	fInoUID
	fInoGID
	fInoNlink
	fInoAtime
	fInoMtime
	fInoCtime
	fInoParent
	fInoData
	fInoTarget
	fInoEntry
	fInoHeldNode
	fInoHeldSession
)

// Snapshot implements raftgroup.StateMachine: the whole state, inodes in
// number order and directory entries in name order, so equal states give
// equal bytes.
func (fs *FS) Snapshot() ([]byte, error) { return fs.AppendSnapshot(nil) }

// AppendSnapshot implements raftgroup.SnapshotAppender: Snapshot's bytes
// appended to dst, whose room is made once, for the whole state.
func (fs *FS) AppendSnapshot(dst []byte) ([]byte, error) {
	fs.mu.RLock()
	defer fs.mu.RUnlock()
	buf := bytes.NewBuffer(dst)
	buf.Grow(int(fs.used) + 128*len(fs.inodes))
	fs.writeState(buf, true)
	return buf.Bytes(), nil
}

// WriteSnapshot implements raftgroup.SnapshotWriter: Snapshot's bytes
// written to w, file data straight from the inodes. An error is w's.
func (fs *FS) WriteSnapshot(w io.Writer) error {
	fs.mu.RLock()
	defer fs.mu.RUnlock()
	ew := &errWriter{w: w}
	fs.writeState(ew, true)
	return ew.err
}

// ForkSnapshot implements raftgroup.SnapshotForker: a frozen copy of the
// state, whose WriteSnapshot writes Snapshot's bytes as of now while the
// host goes on applying to fs. It copies the inodes and directories, not
// file data: the copy shares the pages, and each side copies a page before
// it changes it (fileData.fork), so the first write into each page after a
// fork costs a page copy.
func (fs *FS) ForkSnapshot() (raftgroup.SnapshotWriter, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.fork(), nil
}

// fork returns the frozen copy ForkSnapshot describes; fs.mu is held.
func (fs *FS) fork() *FS {
	c := &FS{inodes: make(map[uint64]*inode, len(fs.inodes)), nextIno: fs.nextIno, limit: fs.limit, used: fs.used, held: maps.Clone(fs.held), level: fs.level, applied: fs.applied, version: fs.version}
	for ino, n := range fs.inodes {
		cn := *n
		cn.entries = maps.Clone(n.entries)
		cn.data = n.data.fork()
		c.inodes[ino] = &cn
	}
	return c
}

// errWriter keeps the first error of w and writes nothing after it.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	e.err = err
	return n, err
}

// writeState writes the snapshot encoding to w (a buffer or a hash, which
// never fail). File data is written straight from the inode, not copied.
func (fs *FS) writeState(w io.Writer, withApplied bool) {
	var b []byte
	// The version is the level: a LevelBase volume's snapshot is what
	// volds before levels wrote, and a vold that does not know a level
	// refuses its snapshots.
	b = putVarint(b, fSnapVersion, uint64(fs.level))
	b = putVarint(b, fSnapNextIno, fs.nextIno)
	b = putVarint(b, fSnapLimit, uint64(fs.limit))
	if withApplied {
		b = putVarint(b, fSnapApplied, fs.applied)
	}
	_, _ = w.Write(b)
	var names []string
	for _, ino := range slices.Sorted(maps.Keys(fs.inodes)) {
		n := fs.inodes[ino]
		m := b[:0]
		m = putVarint(m, fInoIno, n.ino)
		m = putVarint(m, fInoMode, uint64(n.mode))
		m = putVarint(m, fInoUID, uint64(n.uid))
		m = putVarint(m, fInoGID, uint64(n.gid))
		m = putVarint(m, fInoNlink, uint64(n.nlink))
		m = putVarint(m, fInoAtime, uint64(n.atime))
		m = putVarint(m, fInoMtime, uint64(n.mtime))
		m = putVarint(m, fInoCtime, uint64(n.ctime))
		m = putVarint(m, fInoParent, n.parent)
		m = putString(m, fInoTarget, n.target)
		m = putString(m, fInoHeldNode, n.heldNode)
		m = putString(m, fInoHeldSession, n.heldSession)
		names = names[:0]
		for name := range n.entries {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			var e []byte
			e = putString(e, fEntName, name)
			e = putVarint(e, fEntIno, n.entries[name])
			m = putMessage(m, fInoEntry, e)
		}
		size := len(m)
		if n.data.len() > 0 {
			size += protowire.SizeTag(fInoData) + protowire.SizeBytes(n.data.len())
		}
		hdr := protowire.AppendTag(nil, fSnapInode, protowire.BytesType)
		hdr = protowire.AppendVarint(hdr, uint64(size))
		_, _ = w.Write(hdr)
		_, _ = w.Write(m)
		if n.data.len() > 0 {
			d := protowire.AppendTag(nil, fInoData, protowire.BytesType)
			d = protowire.AppendVarint(d, uint64(n.data.len()))
			_, _ = w.Write(d)
			n.data.writeTo(w)
		}
		b = m
	}
}

// Restore implements raftgroup.StateMachine. It checks the snapshot's
// consistency (every entry names an inode, every directory's parent
// lists it) and leaves the state untouched when it is not. Empty data
// (the host's snapshot of a group whose state machine has none yet) is
// the initial state, as New returns it.
func (fs *FS) Restore(data []byte) error {
	if len(data) == 0 {
		fs.mu.Lock()
		defer fs.mu.Unlock()
		fs.reset()
		return nil
	}
	st, err := decodeState(data)
	if err != nil {
		return fmt.Errorf("volfs: restore: %w", err)
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.inodes, fs.nextIno, fs.limit, fs.used, fs.held, fs.level, fs.applied = st.inodes, st.nextIno, st.limit, st.used, st.held, st.level, st.applied
	fs.version++
	return nil
}

func decodeState(data []byte) (*FS, error) {
	st := &FS{inodes: map[uint64]*inode{}, held: map[uint64]struct{}{}}
	version := uint64(0)
	err := fields(data, func(n protowire.Number, t protowire.Type, v uint64, p []byte) error {
		switch {
		case n == fSnapVersion && t == protowire.VarintType:
			version = v
		case n == fSnapNextIno && t == protowire.VarintType:
			st.nextIno = v
		case n == fSnapLimit && t == protowire.VarintType:
			st.limit = int64(v)
		case n == fSnapApplied && t == protowire.VarintType:
			st.applied = v
		case n == fSnapInode && t == protowire.BytesType:
			in, err := decodeInode(p)
			if err != nil {
				return err
			}
			if in.ino == 0 || st.inodes[in.ino] != nil {
				return fmt.Errorf("%w: inode %d missing or repeated", ErrMalformed, in.ino)
			}
			st.inodes[in.ino] = in
			st.used += int64(in.data.len())
			if in.heldSession != "" {
				st.held[in.ino] = struct{}{}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if version < uint64(LevelBase) || version > uint64(MaxLevel) {
		return nil, fmt.Errorf("%w: snapshot of level %d, this vold knows up to %d: %w", ErrMalformed, version, MaxLevel, ErrLevel)
	}
	st.level = uint32(version)
	if st.level < LevelSpecial {
		for _, in := range st.inodes {
			if t := in.mode & ModeType; t == ModeFIFO || t == ModeSocket {
				return nil, fmt.Errorf("%w: inode %d is a FIFO or socket in a snapshot of level %d", ErrMalformed, in.ino, st.level)
			}
		}
	}
	if err := st.check(); err != nil {
		return nil, err
	}
	return st, nil
}

func decodeInode(p []byte) (*inode, error) {
	in := &inode{}
	err := fields(p, func(n protowire.Number, t protowire.Type, v uint64, p []byte) error {
		var err error
		switch {
		case t == protowire.VarintType:
			switch n {
			case fInoIno:
				in.ino = v
			case fInoMode:
				in.mode, err = u32(v)
			case fInoUID:
				in.uid, err = u32(v)
			case fInoGID:
				in.gid, err = u32(v)
			case fInoNlink:
				in.nlink, err = u32(v)
			case fInoAtime:
				in.atime = int64(v)
			case fInoMtime:
				in.mtime = int64(v)
			case fInoCtime:
				in.ctime = int64(v)
			case fInoParent:
				in.parent = v
			}
		case n == fInoData:
			// Copied: the snapshot buffer must not stay pinned (or be
			// mutated under us) by later writes.
			in.data = dataOf(p)
		case n == fInoTarget:
			in.target = string(p)
		case n == fInoHeldNode:
			in.heldNode = string(p)
		case n == fInoHeldSession:
			in.heldSession = string(p)
		case n == fInoEntry:
			var (
				name string
				ino  uint64
			)
			err = fields(p, func(n protowire.Number, t protowire.Type, v uint64, p []byte) error {
				switch {
				case n == fEntName && t == protowire.BytesType:
					name = string(p)
				case n == fEntIno && t == protowire.VarintType:
					ino = v
				}
				return nil
			})
			if err == nil {
				if in.entries == nil {
					in.entries = map[string]uint64{}
				}
				if _, dup := in.entries[name]; dup || validName(name) != 0 || ino == 0 {
					return fmt.Errorf("%w: bad entry %q in inode %d", ErrMalformed, name, in.ino)
				}
				in.entries[name] = ino
			}
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	switch in.mode & ModeType {
	case ModeDir:
		if in.entries == nil {
			in.entries = map[string]uint64{}
		}
		if in.data.len() > 0 || in.target != "" {
			return nil, fmt.Errorf("%w: directory %d with data", ErrMalformed, in.ino)
		}
	case ModeRegular, ModeSymlink, ModeFIFO, ModeSocket:
		if in.entries != nil {
			return nil, fmt.Errorf("%w: inode %d has entries but is no directory", ErrMalformed, in.ino)
		}
		if in.data.len() > MaxFileSize {
			return nil, fmt.Errorf("%w: inode %d too large", ErrMalformed, in.ino)
		}
		if t := in.mode & ModeType; (t == ModeFIFO || t == ModeSocket) && (in.data.len() > 0 || in.target != "") {
			return nil, fmt.Errorf("%w: FIFO or socket %d with data", ErrMalformed, in.ino)
		}
		if in.heldSession != "" && (in.mode&ModeType != ModeRegular || in.nlink != 0) {
			return nil, fmt.Errorf("%w: inode %d held open with %d links", ErrMalformed, in.ino, in.nlink)
		}
	default:
		return nil, fmt.Errorf("%w: inode %d has mode %o", ErrMalformed, in.ino, in.mode)
	}
	return in, nil
}

// check verifies a decoded state's structure: the invariants every
// operation relies on (so that a bad snapshot is refused instead of
// crashing a later op).
func (fs *FS) check() error {
	root := fs.inodes[RootIno]
	if root == nil || !root.isDir() || root.parent != RootIno {
		return fmt.Errorf("%w: no root directory", ErrMalformed)
	}
	for ino := range fs.inodes {
		if ino >= fs.nextIno {
			return fmt.Errorf("%w: inode %d not below next inode %d", ErrMalformed, ino, fs.nextIno)
		}
	}
	links := map[uint64]uint32{}
	for _, d := range fs.inodes {
		if !d.isDir() {
			continue
		}
		for name, ino := range d.entries {
			c := fs.inodes[ino]
			if c == nil {
				return fmt.Errorf("%w: entry %q of %d names missing inode %d", ErrMalformed, name, d.ino, ino)
			}
			if c.isDir() && (c.parent != d.ino || ino == RootIno) {
				return fmt.Errorf("%w: directory %d listed in %d but its parent is %d", ErrMalformed, ino, d.ino, c.parent)
			}
			links[ino]++
		}
	}
	for ino, n := range fs.inodes {
		if n.isDir() {
			if ino != RootIno && links[ino] != 1 {
				return fmt.Errorf("%w: directory %d has %d names", ErrMalformed, ino, links[ino])
			}
			p := fs.inodes[n.parent]
			if p == nil || !p.isDir() {
				return fmt.Errorf("%w: directory %d has no parent", ErrMalformed, ino)
			}
		} else if (links[ino] == 0) != (n.heldSession != "") {
			// An inode without a name is one a mount holds open, and
			// only such an inode.
			return fmt.Errorf("%w: inode %d has %d names and holder %q", ErrMalformed, ino, links[ino], n.heldSession)
		}
	}
	// Link counts are what unlink and rmdir count down: a wrong one would
	// free a file that still has names, or never free one.
	for ino, n := range fs.inodes {
		want := links[ino]
		if n.isDir() {
			want = 2
			for _, c := range n.entries {
				if fs.inodes[c].isDir() {
					want++
				}
			}
		}
		if n.nlink != want {
			return fmt.Errorf("%w: inode %d has link count %d, want %d", ErrMalformed, ino, n.nlink, want)
		}
	}
	// Every directory must reach the root by parent pointers (no cycles):
	// rename's subtree check walks them.
	for ino, n := range fs.inodes {
		if !n.isDir() {
			continue
		}
		cur, steps := ino, 0
		for cur != RootIno {
			cur = fs.inodes[cur].parent
			steps++
			if steps > len(fs.inodes) {
				return fmt.Errorf("%w: directory %d is in a cycle", ErrMalformed, ino)
			}
		}
	}
	return nil
}
