package volfs_test

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/volfs"
)

// TestWriteTar: the tree as of the call, whatever is applied while the
// stream is read; kinds, modes, owners, times and links as the inodes
// have them.
func TestWriteTar(t *testing.T) {
	fs := volfs.New()
	idx := uint64(0)
	apply := func(op volfs.Op) volfs.Result {
		idx++
		return mustApply(t, fs, idx, op)
	}
	old := time.Date(2024, 5, 6, 7, 8, 9, 123, time.UTC)
	apply(volfs.Op{Kind: volfs.KindSetLimit, Size: 64 << 20})
	dir := apply(volfs.Op{Kind: volfs.KindMkdir, Parent: volfs.RootIno, Name: "etc", Mode: 0o750}).Attr.Ino
	conf := apply(volfs.Op{Kind: volfs.KindCreate, Parent: dir, Name: "conf", Mode: 0o640, UID: 1000, GID: 1000}).Attr.Ino
	apply(volfs.Op{Kind: volfs.KindWrite, Ino: conf, Data: []byte("port=80\n")})
	apply(volfs.Op{Kind: volfs.KindSetattr, Ino: conf, Valid: volfs.SetMtime, Mtime: old.UnixNano()})
	apply(volfs.Op{Kind: volfs.KindLink, Ino: conf, NewParent: volfs.RootIno, NewName: "hard"})
	apply(volfs.Op{Kind: volfs.KindSymlink, Parent: volfs.RootIno, Name: "soft", Data: []byte("etc/conf")})
	big := apply(volfs.Op{Kind: volfs.KindCreate, Parent: volfs.RootIno, Name: "big", Mode: 0o644}).Attr.Ino
	apply(volfs.Op{Kind: volfs.KindWrite, Ino: big, Data: bytes.Repeat([]byte("a"), 3<<20)})

	// The stream is read only after a write into big and a new file.
	r, w := io.Pipe()
	done := make(chan volfs.TarStats, 1)
	var buf bytes.Buffer
	go func() {
		st, err := fs.WriteTar(w)
		w.CloseWithError(err)
		done <- st
	}()
	// WriteTar forks before it writes: once its first block is read, the
	// tree it writes is fixed.
	if _, err := io.CopyN(&buf, r, 512); err != nil {
		t.Fatal(err)
	}
	apply(volfs.Op{Kind: volfs.KindWrite, Ino: big, Offset: 1 << 20, Data: []byte("changed")})
	apply(volfs.Op{Kind: volfs.KindCreate, Parent: volfs.RootIno, Name: "later", Mode: 0o644})
	if _, err := io.Copy(&buf, r); err != nil {
		t.Fatal(err)
	}
	st := <-done
	// ./, big, etc/, etc/conf, hard, soft
	if st.Entries != 6 || st.Bytes != 3<<20+8 || st.Applied != 9 {
		t.Errorf("stats %+v, want 6 entries, 3 MiB + 8 bytes, at index 9", st)
	}
	tr := tar.NewReader(&buf)
	got := map[string]*tar.Header{}
	var order []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[h.Name], order = h, append(order, h.Name)
		if h.Name == "./big" {
			data, _ := io.ReadAll(tr)
			if !bytes.Equal(data, bytes.Repeat([]byte("a"), 3<<20)) {
				t.Errorf("big holds the write applied after the call")
			}
		}
		if h.Name == "./etc/conf" {
			if data, _ := io.ReadAll(tr); string(data) != "port=80\n" {
				t.Errorf("conf: %q", data)
			}
		}
	}
	if want := "[./ ./big ./etc/ ./etc/conf ./hard ./soft]"; fmt.Sprint(order) != want {
		t.Errorf("entries %v, want %s", order, want)
	}
	if h := got["./etc/conf"]; h.Mode != 0o640 || h.Uid != 1000 || h.Gid != 1000 || !h.ModTime.Equal(old) {
		t.Errorf("conf: mode %o, owner %d:%d, time %v", h.Mode, h.Uid, h.Gid, h.ModTime)
	}
	if h := got["./etc/"]; h.Typeflag != tar.TypeDir || h.Mode != 0o750 {
		t.Errorf("etc: %+v", h)
	}
	if h := got["./hard"]; h.Typeflag != tar.TypeLink || h.Linkname != "./etc/conf" {
		t.Errorf("hard: type %c, link %q; want a hard link to the first name", h.Typeflag, h.Linkname)
	}
	if h := got["./soft"]; h.Typeflag != tar.TypeSymlink || h.Linkname != "etc/conf" {
		t.Errorf("soft: %+v", h)
	}
}
