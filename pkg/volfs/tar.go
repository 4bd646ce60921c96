package volfs

import (
	"archive/tar"
	"fmt"
	"io"
	"maps"
	"slices"
	"time"
)

// TarStats counts what WriteTar wrote.
type TarStats struct {
	// Entries are the directories, files and links written.
	Entries int
	// Bytes is the data of the regular files.
	Bytes int64
	// Skipped counts FIFOs and sockets, which a tar of the volume leaves
	// out (their I/O is each node's kernel's; volarchive skips them too).
	Skipped int
	// Applied is the index of the last entry the tree reflects.
	Applied uint64
}

// WriteTar writes the tree as it is now as a tar stream (the root as
// "./"), with modes, owners, times, symbolic and hard links: a consistent
// copy at one applied index, taken like a background snapshot — a fork
// under the lock (inodes and directories copied, file pages shared, each
// side copying a page before it writes it), then written without the lock
// while the replica goes on applying. The stream is what volarchive.Read
// extracts. An error is w's.
func (fs *FS) WriteTar(w io.Writer) (TarStats, error) {
	fs.mu.Lock()
	frozen := fs.fork()
	fs.mu.Unlock()
	ew := &errWriter{w: w}
	tw := tar.NewWriter(ew)
	st := TarStats{Applied: frozen.applied}
	seen := map[uint64]string{} // inodes with several names: the first name written
	var walk func(ino uint64, name string) error
	walk = func(ino uint64, name string) error {
		n := frozen.inodes[ino]
		if n == nil {
			return fmt.Errorf("volfs: %s names inode %d, which does not exist", name, ino)
		}
		hdr := &tar.Header{
			Name: name, Mode: int64(n.mode & ModePerm), Uid: int(n.uid), Gid: int(n.gid),
			ModTime: time.Unix(0, n.mtime), Format: tar.FormatPAX,
		}
		switch {
		case n.isDir():
			hdr.Typeflag = tar.TypeDir
		case n.isSymlink():
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, n.target
		case n.isRegular():
			if first, ok := seen[ino]; ok {
				hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
				break
			}
			if n.nlink > 1 {
				seen[ino] = name
			}
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(n.data.len())
		default:
			st.Skipped++
			return nil
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		st.Entries++
		if hdr.Typeflag == tar.TypeReg {
			n.data.writeTo(tw)
			st.Bytes += hdr.Size
			if ew.err != nil {
				return ew.err
			}
		}
		if !n.isDir() {
			return nil
		}
		for _, child := range slices.Sorted(maps.Keys(n.entries)) {
			path := name + child
			if c := frozen.inodes[n.entries[child]]; c != nil && c.isDir() {
				path += "/"
			}
			if err := walk(n.entries[child], path); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(RootIno, "./"); err != nil {
		return st, err
	}
	if err := tw.Close(); err != nil {
		return st, err
	}
	return st, ew.err
}
