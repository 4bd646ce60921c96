// Package volarchive copies a directory tree, or one path in it, to and
// from a tar stream: what `shoalctl volume export` and `volume import` do
// through a volume's mount, and `task cp` in a task's file system. Both work inside an os.Root, so an archive's names ("../x",
// "/etc/passwd", a symlink pointing out and then written through) cannot
// reach outside the tree being filled, whatever the archive holds.
//
// Kept: regular files, directories, symbolic links, hard links (a file
// with several names is stored once), permissions, owners and
// modification times. Not kept: FIFOs, sockets and devices (counted as
// skipped; a volume holds no devices), extended attributes.
package volarchive

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"
	"time"
)

// copyBuffer is the size of the writes Read makes.
const copyBuffer = 1 << 20

// Stats counts what a copy wrote.
type Stats struct {
	// Entries are the files, directories and links written.
	Entries int
	// Bytes is the data of the regular files.
	Bytes int64
	// Skipped are the entries of kinds not kept.
	Skipped []string
}

// Write writes the tree under root to w as a tar stream, root itself as
// ".". progress, if not nil, is called with the bytes written so far after
// each file.
func Write(root *os.Root, w io.Writer, progress func(bytes int64)) (Stats, error) {
	return WritePath(root, ".", w, progress)
}

// WritePath writes name in root (a file, link, or directory and the tree
// under it) to w as a tar stream, its entries named as in root ("app",
// "app/conf"): what `docker cp` sends of a path from its parent.
func WritePath(root *os.Root, name string, w io.Writer, progress func(bytes int64)) (Stats, error) {
	buf := make([]byte, copyBuffer)
	var st Stats
	tw := tar.NewWriter(w)
	type inode struct{ dev, ino uint64 }
	seen := map[inode]string{} // files with several names: the first name written
	err := fs.WalkDir(root.FS(), path.Clean(name), func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := root.Lstat(name)
		if err != nil {
			return err
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = root.Readlink(name); err != nil {
				return err
			}
		}
		if info.Mode()&(fs.ModeNamedPipe|fs.ModeSocket|fs.ModeDevice|fs.ModeCharDevice) != 0 {
			st.Skipped = append(st.Skipped, name)
			return nil
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		hdr.Name = name
		if info.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uname, hdr.Gname = "", "" // numeric owners: the names are the node's, not the task's
		if sys, ok := info.Sys().(*syscall.Stat_t); ok && info.Mode().IsRegular() && sys.Nlink > 1 {
			key := inode{uint64(sys.Dev), sys.Ino}
			if first, ok := seen[key]; ok {
				hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
			} else {
				seen[key] = name
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		st.Entries++
		if hdr.Typeflag != tar.TypeReg || hdr.Size == 0 {
			return nil
		}
		f, err := root.Open(name)
		if err != nil {
			return err
		}
		defer f.Close()
		// Reads of copyBuffer bytes: each read of a volume's mount waits
		// for a ReadIndex.
		n, err := io.CopyBuffer(tw, io.LimitReader(f, hdr.Size), buf)
		st.Bytes += n
		if err == nil && n < hdr.Size {
			err = fmt.Errorf("%s shrank while being read (%d of %d bytes): %w", name, n, hdr.Size, io.ErrUnexpectedEOF)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if progress != nil {
			progress(st.Bytes)
		}
		return nil
	})
	if err != nil {
		return st, err
	}
	return st, tw.Close()
}

// Size sums the data of the regular files of the tar stream r, reading
// only its headers where r can seek.
func Size(r io.Reader) (entries int, bytes int64, err error) {
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return entries, bytes, nil
		}
		if err != nil {
			return entries, bytes, err
		}
		entries++
		if hdr.Typeflag == tar.TypeReg {
			bytes += hdr.Size
		}
	}
}

// ReadOptions are Read's.
type ReadOptions struct {
	// Progress, if not nil, is called with the bytes written so far
	// after each file.
	Progress func(bytes int64)
	// MaxBytes, if positive, bounds the file data written: past it Read
	// stops with ErrTooLarge.
	MaxBytes int64
	// Rename, if set, replaces the first element of every name (and of
	// hard links' targets): the name of an archive's one top entry where
	// it is extracted (Target).
	Rename string
	// Owner, if not nil, owns every entry made, whatever the archive says.
	Owner *Owner
}

// Owner is a numeric user and group.
type Owner struct{ UID, GID int }

// ErrTooLarge is Read's error for an archive past ReadOptions.MaxBytes.
var ErrTooLarge = errors.New("archive too large")

// Read extracts the tar stream r into root, which it never leaves:
// directories and files are made as the archive says (owners too, when
// chown is allowed), existing files are replaced.
func Read(root *os.Root, r io.Reader, opts ReadOptions) (Stats, error) {
	buf := make([]byte, copyBuffer)
	var st Stats
	tr := tar.NewReader(r)
	type dirTimes struct {
		name  string
		mtime time.Time
	}
	var dirs []dirTimes // set last: writing into a directory changes its time
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return st, err
		}
		name := path.Clean(hdr.Name)
		if name == "/" || name == "" {
			name = "."
		}
		name = rename(stripRoot(name), opts.Rename)
		if err := extract(root, tr, hdr, name, &st, opts, buf); err != nil {
			return st, fmt.Errorf("%s: %w", hdr.Name, err)
		}
		if hdr.Typeflag == tar.TypeDir {
			dirs = append(dirs, dirTimes{name, hdr.ModTime})
		}
		if opts.Progress != nil && hdr.Typeflag == tar.TypeReg {
			opts.Progress(st.Bytes)
		}
	}
	for _, d := range slices.Backward(dirs) {
		if err := root.Chtimes(d.name, d.mtime, d.mtime); err != nil {
			return st, fmt.Errorf("%s: %w", d.name, err)
		}
	}
	return st, nil
}

// stripRoot makes an absolute name relative ("/etc/x" → "etc/x"), as tar
// does; os.Root refuses what still leaves the tree ("../x").
func stripRoot(name string) string {
	for len(name) > 0 && name[0] == '/' {
		name = name[1:]
	}
	if name == "" {
		return "."
	}
	return name
}

// rename replaces the first element of name by top (if set).
func rename(name, top string) string {
	if top == "" {
		return name
	}
	if _, rest, ok := strings.Cut(name, "/"); ok && name != "." {
		return top + "/" + rest
	}
	return top
}

// Resolve resolves the symbolic links in name as if root were the file
// system's root, as a chroot would: an absolute link starts again at
// root and ".." stops there, so a task's /var/run -> /run leads to its
// own /run. The last element is resolved too only with followLast. The
// result is relative to root and has no links among its directories.
func Resolve(root *os.Root, name string, followLast bool) (string, error) {
	todo := strings.Split(path.Clean("/"+name), "/")
	var done []string
	hops := 0
	for len(todo) > 0 {
		p := todo[0]
		todo = todo[1:]
		switch p {
		case "", ".":
			continue
		case "..":
			if len(done) > 0 {
				done = done[:len(done)-1]
			}
			continue
		}
		cur := path.Join(append(done, p)...)
		if len(todo) == 0 && !followLast {
			done = append(done, p)
			break
		}
		info, err := root.Lstat(cur)
		if errors.Is(err, fs.ErrNotExist) && len(todo) == 0 {
			done = append(done, p) // a destination to be made
			break
		}
		if err != nil {
			return "", err
		}
		if info.Mode()&fs.ModeSymlink == 0 {
			done = append(done, p)
			continue
		}
		if hops++; hops > 40 {
			return "", fmt.Errorf("%s: %w", name, syscall.ELOOP)
		}
		target, err := root.Readlink(cur)
		if err != nil {
			return "", err
		}
		if path.IsAbs(target) {
			done = nil
		}
		todo = append(strings.Split(target, "/"), todo...)
	}
	if len(done) == 0 {
		return ".", nil
	}
	return path.Join(done...), nil
}

// Target resolves where a copy into dst (in root) goes, as docker cp
// does: into dst itself when it is a directory, the archive's top entry
// keeping its name (rename ""); else into dst's parent, which must be a
// directory, the top entry renamed to dst's last element.
func Target(root *os.Root, dst string) (dir, renameTo string, err error) {
	dst = stripRoot(path.Clean(dst))
	info, err := root.Stat(dst)
	switch {
	case err == nil && info.IsDir():
		return dst, "", nil
	case err == nil:
		return path.Dir(dst), path.Base(dst), nil
	case !errors.Is(err, fs.ErrNotExist):
		return "", "", err
	}
	parent := path.Dir(dst)
	if info, err := root.Stat(parent); err != nil {
		return "", "", err
	} else if !info.IsDir() {
		return "", "", fmt.Errorf("%s is not a directory: %w", parent, syscall.ENOTDIR)
	}
	return parent, path.Base(dst), nil
}

func extract(root *os.Root, tr *tar.Reader, hdr *tar.Header, name string, st *Stats, opts ReadOptions, buf []byte) error {
	limit := opts.MaxBytes
	uid, gid := hdr.Uid, hdr.Gid
	if opts.Owner != nil {
		uid, gid = opts.Owner.UID, opts.Owner.GID
	}
	mode := hdr.FileInfo().Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	if dir := path.Dir(name); dir != "." {
		if err := root.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if name != "." {
			if err := root.Mkdir(name, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
		}
	case tar.TypeReg:
		if err := removeNonDir(root, name); err != nil {
			return err
		}
		f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		// In writes of copyBuffer bytes: io.Copy's 32 KiB would be a
		// replicated write each on a volume's mount. A sparse entry's
		// holes come as zeros, counted against the limit.
		src := io.Reader(tr)
		if limit > 0 {
			src = io.LimitReader(tr, max(limit-st.Bytes, 0)+1)
		}
		n, err := io.CopyBuffer(struct{ io.Writer }{f}, struct{ io.Reader }{src}, buf)
		if err == nil && limit > 0 && st.Bytes+n > limit {
			err = fmt.Errorf("the archive holds more than %d bytes of file data: %w", limit, ErrTooLarge)
		}
		st.Bytes += n
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	case tar.TypeSymlink:
		if err := removeNonDir(root, name); err != nil {
			return err
		}
		st.Entries++
		if err := root.Symlink(hdr.Linkname, name); err != nil {
			return err
		}
		return chownIfAllowed(root.Lchown(name, uid, gid))
	case tar.TypeLink:
		if err := removeNonDir(root, name); err != nil {
			return err
		}
		st.Entries++
		return root.Link(rename(stripRoot(path.Clean(hdr.Linkname)), opts.Rename), name)
	default:
		st.Skipped = append(st.Skipped, name)
		return nil
	}
	st.Entries++
	if err := chownIfAllowed(root.Lchown(name, uid, gid)); err != nil {
		return err
	}
	// After chown, which clears set-user-ID bits.
	if err := root.Chmod(name, mode); err != nil {
		return err
	}
	return root.Chtimes(name, hdr.ModTime, hdr.ModTime)
}

// removeNonDir makes way for an entry: a file or link of that name goes
// (the archive's replaces it), a directory stays and makes the entry fail.
func removeNonDir(root *os.Root, name string) error {
	info, err := root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if info.IsDir() {
		return fmt.Errorf("a directory of that name is in the way: %w", fs.ErrExist)
	}
	return root.Remove(name)
}

// chownIfAllowed keeps an unprivileged import going: its files are then
// the importer's.
func chownIfAllowed(err error) error {
	if errors.Is(err, fs.ErrPermission) {
		return nil
	}
	return err
}
