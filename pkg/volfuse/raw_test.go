package volfuse

import (
	"encoding/binary"
	"log/slog"
	"slices"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/shoal-dev/shoal/pkg/volfs"
	"github.com/shoal-dev/shoal/pkg/volfs/volfstest"
)

// TestRawStateless drives two rawFS of the same volume as two processes
// serving one FUSE session in turn: node ids and file handles the first
// gave out are understood by the second, which never saw them.
func TestRawStateless(t *testing.T) {
	vol := &volume{c: &volfs.Client{B: volfstest.NewLocal()}, log: slog.New(slog.DiscardHandler), session: "s", node: "n"}
	first, second := newRawFS(vol), newRawFS(vol)
	hdr := func(node uint64) fuse.InHeader {
		return fuse.InHeader{NodeId: node, Caller: fuse.Caller{Owner: fuse.Owner{Uid: 12, Gid: 34}}}
	}
	ok := func(what string, st fuse.Status) {
		t.Helper()
		if !st.Ok() {
			t.Fatalf("%s: %v", what, st)
		}
	}

	// A file created (O_APPEND) through the first; appended to through
	// the second with the first's node id and handle.
	var co fuse.CreateOut
	ok("create", first.Create(nil, &fuse.CreateIn{InHeader: hdr(fuse.FUSE_ROOT_ID), Flags: syscall.O_WRONLY | syscall.O_APPEND, Mode: syscall.S_IFREG | 0o644}, "f", &co))
	if co.NodeId == 0 || co.NodeId != co.Attr.Ino || co.Generation != generation || co.Attr.Uid != 12 || co.Attr.Gid != 34 {
		t.Fatalf("create: %+v", co.EntryOut)
	}
	if co.OpenFlags&fuse.FOPEN_DIRECT_IO == 0 || co.EntryTimeout() != 0 || co.AttrTimeout() != 0 {
		t.Fatalf("create: open flags %x, timeouts %v %v", co.OpenFlags, co.EntryTimeout(), co.AttrTimeout())
	}
	fNode, fFh := co.NodeId, co.Fh
	for range 2 {
		n, st := second.Write(nil, &fuse.WriteIn{InHeader: hdr(co.NodeId), Fh: co.Fh, Offset: 0}, []byte("ab"))
		ok("write", st)
		if n != 2 {
			t.Fatalf("wrote %d", n)
		}
	}
	res, st := second.Read(nil, &fuse.ReadIn{InHeader: hdr(co.NodeId), Offset: 0}, make([]byte, 100))
	ok("read", st)
	if b, _ := res.Bytes(nil); string(b) != "abab" {
		t.Fatalf("read %q: the append handle was not understood", b)
	}

	// Lookups give the inode number as node id, on either; a missing
	// name is a negative entry.
	var eo fuse.EntryOut
	h := hdr(fuse.FUSE_ROOT_ID)
	ok("lookup", second.Lookup(nil, &h, "f", &eo))
	if eo.NodeId != co.NodeId || eo.Size != 4 {
		t.Fatalf("lookup: %+v", eo)
	}
	eo = fuse.EntryOut{NodeId: 99}
	ok("lookup missing", second.Lookup(nil, &h, "nope", &eo))
	if eo.NodeId != 0 {
		t.Fatalf("negative lookup: node %d", eo.NodeId)
	}
	var ao fuse.AttrOut
	ok("getattr root", second.GetAttr(nil, &fuse.GetAttrIn{InHeader: hdr(fuse.FUSE_ROOT_ID)}, &ao))
	if ao.Ino != volfs.RootIno || ao.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		t.Fatalf("root attr: %+v", ao.Attr)
	}

	// A directory listing read across several READDIRs is one snapshot;
	// a handle of the first process lists afresh on the second.
	for _, n := range []string{"g", "h", "i"} {
		ok("create", first.Create(nil, &fuse.CreateIn{InHeader: hdr(fuse.FUSE_ROOT_ID), Mode: syscall.S_IFREG | 0o644}, n, &co))
	}
	var oo fuse.OpenOut
	ok("opendir", first.OpenDir(nil, &fuse.OpenIn{InHeader: hdr(fuse.FUSE_ROOT_ID)}, &oo))
	readdir := func(fs *rawFS, off uint64) (names []string, offs []uint64) {
		t.Helper()
		buf := make([]byte, 4096)
		l := fuse.NewDirEntryList(buf, off)
		ok("readdir", fs.ReadDir(nil, &fuse.ReadIn{InHeader: hdr(fuse.FUSE_ROOT_ID), Fh: oo.Fh, Offset: off}, l))
		b := l.Bytes()
		for len(b) > 0 { // struct fuse_dirent: ino, off, namelen, type, name
			off := binary.LittleEndian.Uint64(b[8:])
			n := int(binary.LittleEndian.Uint32(b[16:]))
			names = append(names, string(b[24:24+n]))
			offs = append(offs, off)
			b = b[(24+n+7)&^7:]
		}
		return names, offs
	}
	names, offs := readdir(first, 0)
	if !slices.Equal(names, []string{"f", "g", "h", "i"}) || !slices.Equal(offs, []uint64{1, 2, 3, 4}) {
		t.Fatalf("readdir: %q %v", names, offs)
	}
	var mo fuse.EntryOut
	ok("mkdir", first.Mkdir(nil, &fuse.MkdirIn{InHeader: hdr(fuse.FUSE_ROOT_ID), Mode: 0o755}, "a", &mo))
	if names, _ := readdir(first, 2); !slices.Equal(names, []string{"h", "i"}) {
		t.Fatalf("readdir from 2 on the same handle: %q", names)
	}
	if names, _ := readdir(second, 2); !slices.Equal(names, []string{"g", "h", "i"}) {
		t.Fatalf("readdir from 2 on another process's handle: %q", names)
	}
	if st := first.ReadDir(nil, &fuse.ReadIn{InHeader: hdr(fuse.FUSE_ROOT_ID), Fh: oo.Fh, Offset: 5}, fuse.NewDirEntryList(make([]byte, 4096), 5)); st != fuse.EINVAL {
		t.Fatalf("readdir past the end: %v", st)
	}
	first.ReleaseDir(&fuse.ReleaseIn{InHeader: hdr(fuse.FUSE_ROOT_ID), Fh: oo.Fh})
	second.ReleaseDir(&fuse.ReleaseIn{InHeader: hdr(fuse.FUSE_ROOT_ID), Fh: oo.Fh})
	if len(first.dirs)+len(second.dirs) != 0 {
		t.Fatal("listings kept after RELEASEDIR")
	}

	// File "f", open through the first (fFh), unlinked through it: the
	// volume holds it. The second's RELEASE of the first's handle does
	// not free it (the second never counted it: the file may still be
	// open through another of the first's handles); the first's does.
	held := func() uint64 {
		t.Helper()
		st, err := vol.c.Statfs(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return st.Held
	}
	h = hdr(fuse.FUSE_ROOT_ID)
	ok("unlink", first.Unlink(nil, &h, "f"))
	if held() != 1 {
		t.Fatal("the open file was not held")
	}
	second.Release(nil, &fuse.ReleaseIn{InHeader: hdr(fNode), Fh: fFh})
	if held() != 1 {
		t.Fatal("another process's release freed the held file")
	}
	first.Release(nil, &fuse.ReleaseIn{InHeader: hdr(fNode), Fh: fFh})
	if held() != 0 {
		t.Fatal("the last release did not free the held file")
	}
}
