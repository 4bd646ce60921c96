package volfs

import (
	"strconv"
	"syscall"
	"time"
)

// File type and permission bits of Attr.Mode. They are Linux's values
// (the kernel and FUSE speak them), spelled out here so that the state
// machine's encoding does not depend on the build platform.
const (
	ModeType    uint32 = 0o170000 // mask of the type bits
	ModeDir     uint32 = 0o040000
	ModeRegular uint32 = 0o100000
	ModeSymlink uint32 = 0o120000
	// FIFOs and sockets (LevelSpecial): inodes without data, whose I/O
	// each node's kernel does itself.
	ModeFIFO   uint32 = 0o010000
	ModeSocket uint32 = 0o140000
	ModePerm   uint32 = 0o7777 // permission, setuid, setgid and sticky bits
	ModeSetgid uint32 = 0o2000
)

// RootIno is the inode number of a volume's root directory.
const RootIno uint64 = 1

// Limits on names and request sizes. MaxWriteChunk and MaxReadChunk bound
// one op or query (one Raft entry, one forwarded message); Client.Write
// and Client.Read split larger requests.
const (
	MaxNameLen    = 255
	MaxSymlinkLen = 4095
	MaxWriteChunk = 1 << 20
	MaxReadChunk  = 4 << 20
	// MaxFileSize bounds a file's size even on an unlimited volume: file
	// data is held in memory on every replica, so a truncate to an absurd
	// size must fail (EFBIG) rather than bring down every replica at once.
	MaxFileSize = 1 << 40
	// readdirPage is how many entries one readdir query returns at most.
	readdirPage = 1024
)

// Kind identifies an op. Mutations (applied through the log) and queries
// (local reads) share one numbering so that a misrouted request is
// recognised and refused (EINVAL) rather than misread.
type Kind uint32

// Mutations.
const (
	KindCreate Kind = iota + 1
	KindMkdir
	KindSymlink
	KindLink
	KindUnlink
	KindRmdir
	KindRename
	KindSetattr
	KindWrite
	KindSetLimit
	KindForget
	KindSetLevel
	KindMknod
)

// Levels of a volume's state machine. A level is a set of semantics that
// every replica must apply alike: a replica whose vold knows fewer would
// apply the same entries differently and diverge. A volume starts at
// LevelBase and its group's leader raises it (KindSetLevel, an entry in
// the log) once every member's vold publishes a higher MaxLevel, so
// volds can be upgraded one node at a time while the volume is in use.
// The level is the snapshot's format version too: a vold that does not
// know a volume's level refuses its snapshots and stops applying at its
// SetLevel entry, instead of diverging.
const (
	// LevelBase is the first level: what volds before levels applied
	// (open-unlinked files included).
	LevelBase uint32 = 1
	// LevelSpecial adds FIFOs and sockets (KindMknod). At LevelBase
	// Mknod is EPERM and changes nothing.
	LevelSpecial uint32 = 2
	// MaxLevel is the highest level this code applies.
	MaxLevel = LevelSpecial
)

// Queries.
const (
	KindLookup Kind = iota + 64
	KindGetattr
	KindReaddir
	KindRead
	KindReadlink
	KindStatfs
	KindDigest
)

// IsMutation reports whether ops of kind k go through the log.
func (k Kind) IsMutation() bool { return k >= KindCreate && k <= KindMknod }

// IsQuery reports whether k is a local read.
func (k Kind) IsQuery() bool { return k >= KindLookup && k <= KindDigest }

var kindNames = map[Kind]string{
	KindCreate: "create", KindMkdir: "mkdir", KindSymlink: "symlink", KindLink: "link",
	KindUnlink: "unlink", KindRmdir: "rmdir", KindRename: "rename", KindSetattr: "setattr",
	KindWrite: "write", KindSetLimit: "setlimit", KindForget: "forget", KindSetLevel: "setlevel", KindMknod: "mknod", KindLookup: "lookup", KindGetattr: "getattr",
	KindReaddir: "readdir", KindRead: "read", KindReadlink: "readlink", KindStatfs: "statfs",
	KindDigest: "digest",
}

func (k Kind) String() string {
	if s, ok := kindNames[k]; ok {
		return s
	}
	return "kind(" + strconv.FormatUint(uint64(k), 10) + ")"
}

// Flags of Create (Op.Flags).
const (
	// CreateExcl fails with EEXIST when the name exists (O_EXCL).
	CreateExcl uint32 = 1 << 0
	// CreateTrunc truncates an existing regular file (O_TRUNC).
	CreateTrunc uint32 = 1 << 1
)

// Flags of Rename (Op.Flags): Linux's renameat2 values.
const (
	RenameNoReplace uint32 = 1 << 0
	RenameExchange  uint32 = 1 << 1
)

// Flags of Forget (Op.Flags). Without either, Forget frees inode Ino if
// it is an open-unlinked file that Op.Node's session Op.Session holds.
const (
	// ForgetSession frees every open-unlinked file that the session holds
	// (its mount has ended).
	ForgetSession uint32 = 1 << 0
	// ForgetOthers frees every open-unlinked file that Op.Node's sessions
	// other than Op.Session hold (the node mounted the volume afresh, so
	// its earlier sessions are gone); with no Op.Session, every one the
	// node holds (the node is gone).
	ForgetOthers uint32 = 1 << 1
)

// WriteAppend (Op.Flags of a write) writes at the file's current size as
// the entry is applied, ignoring Offset: O_APPEND that stays atomic when
// several nodes append to the same file.
const WriteAppend uint32 = 1 << 0

// Bits of SetAttr.Valid (Op.Valid) saying which attributes to change.
const (
	SetMode uint32 = 1 << iota
	SetUID
	SetGID
	SetSize
	SetAtime
	SetMtime
	// SetAtimeNow and SetMtimeNow set the time to the entry's group time
	// (utimensat's UTIME_NOW): the proposer's clock is not trusted to agree
	// with the group's.
	SetAtimeNow
	SetMtimeNow
)

// Attr is an inode's attributes.
type Attr struct {
	Ino   uint64
	Mode  uint32 // type and permission bits
	Nlink uint32
	UID   uint32
	GID   uint32
	Size  uint64
	// Times in nanoseconds since the Unix epoch.
	Atime, Mtime, Ctime int64
}

// IsDir reports whether the inode is a directory.
func (a Attr) IsDir() bool { return a.Mode&ModeType == ModeDir }

// IsRegular reports whether the inode is a regular file.
func (a Attr) IsRegular() bool { return a.Mode&ModeType == ModeRegular }

// IsSymlink reports whether the inode is a symbolic link.
func (a Attr) IsSymlink() bool { return a.Mode&ModeType == ModeSymlink }

// MtimeTime returns Mtime as a time.Time.
func (a Attr) MtimeTime() time.Time { return time.Unix(0, a.Mtime) }

// DirEntry is one entry of a directory listing.
type DirEntry struct {
	Name string
	Ino  uint64
	Mode uint32 // type bits only are guaranteed
}

// Statfs reports a volume's usage.
type Statfs struct {
	// Limit is the size limit in bytes (0: unlimited).
	Limit int64
	// Used is the total size of all regular files' data.
	Used int64
	// Inodes is the number of inodes (the root included).
	Inodes uint64
	// Held is the number of open-unlinked files: inodes without a name
	// that a mount keeps while a process has them open (their data is
	// in Used).
	Held uint64
	// Level is the volume's level (LevelBase, LevelSpecial, ...).
	Level uint32
}

// SetAttr is a Setattr request: Valid says which fields apply.
type SetAttr struct {
	Valid uint32
	Mode  uint32 // permission bits; the type bits are kept
	UID   uint32
	GID   uint32
	Size  uint64
	// Atime and Mtime in nanoseconds since the epoch (SetAtime, SetMtime).
	Atime, Mtime int64
}

// Op is one request to a volume: a mutation for Backend.Mutate or a query
// for Backend.Query. Which fields matter depends on Kind; the Encode* and
// Client helpers fill them so callers need not. An encoded Op is
// self-contained: it can be forwarded to another node as is.
type Op struct {
	Kind      Kind
	Ino       uint64 // the inode operated on (link's source, setattr, write, queries)
	Parent    uint64 // the directory of Name
	Name      string
	NewParent uint64 // rename's and link's destination directory
	NewName   string
	Mode      uint32
	UID       uint32
	GID       uint32
	Flags     uint32
	Offset    uint64 // write and read offset; readdir: unused
	Size      uint64 // read size, setattr size, setlimit bytes
	Data      []byte // write data, symlink target
	Valid     uint32 // setattr
	Atime     int64
	Mtime     int64
	// After is readdir's resume point: entries with names after it.
	After string
	// Node and Session name the mount that sends an unlink, a rename or
	// a forget: the holder of the files it keeps open after their last
	// name goes.
	Node, Session string
	// Open lists the inodes the sending mount has open (unlink and
	// rename): one of them that loses its last name is kept, held by
	// Node and Session, until a Forget.
	Open []uint64
}

// Holder is a mount that keeps the files it has open once their last
// name goes (open-unlinked files, see the package documentation): Node
// is its node, Session its FUSE session (unique to one mount), Open the
// inodes it has open as it sends an op. The zero Holder keeps nothing.
type Holder struct {
	Node, Session string
	Open          []uint64
}

func (h Holder) on(op *Op) *Op {
	op.Node, op.Session, op.Open = h.Node, h.Session, h.Open
	return op
}

// Result is the outcome of an op or query. Errno is the POSIX error (0 on
// success); the other fields depend on the op.
type Result struct {
	Errno   syscall.Errno
	Attr    *Attr
	Data    []byte // read data, readlink target, digest
	Entries []DirEntry
	// More says a readdir listing continues after its last entry.
	More   bool
	Statfs *Statfs
}
