package volfs

import "fmt"

// CheckInvariants verifies the structure (as Restore does) and the usage
// counter, for tests.
func (fs *FS) CheckInvariants() error {
	fs.mu.RLock()
	defer fs.mu.RUnlock()
	if err := fs.check(); err != nil {
		return err
	}
	var used int64
	nlinks := map[uint64]uint32{}
	for _, n := range fs.inodes {
		used += int64(n.data.len())
		if err := n.data.check(); err != nil {
			return fmt.Errorf("inode %d: %w", n.ino, err)
		}
		if n.isDir() {
			nlinks[n.ino] += 2
			if n.ino != RootIno {
				nlinks[n.parent]++
			}
			for _, c := range n.entries {
				if !fs.inodes[c].isDir() {
					nlinks[c]++
				}
			}
		}
	}
	if used != fs.used {
		return fmt.Errorf("used %d, data %d", fs.used, used)
	}
	for ino, n := range fs.inodes {
		if n.nlink != nlinks[ino] {
			return fmt.Errorf("inode %d: nlink %d, names %d", ino, n.nlink, nlinks[ino])
		}
		if _, held := fs.held[ino]; held != (n.heldSession != "") {
			return fmt.Errorf("inode %d: in the held set %v, holder %q", ino, held, n.heldSession)
		}
	}
	for ino := range fs.held {
		if fs.inodes[ino] == nil {
			return fmt.Errorf("held inode %d does not exist", ino)
		}
	}
	return nil
}

// check verifies the page structure: full pages but the last, which is
// not empty, summing to the size; shared pages without room to grow.
func (d *fileData) check() error {
	if len(d.shared) != len(d.pages) {
		return fmt.Errorf("%d pages, %d shared flags", len(d.pages), len(d.shared))
	}
	total := 0
	for i, p := range d.pages {
		if d.shared[i] && cap(p) != len(p) {
			return fmt.Errorf("shared page %d has room to grow into (%d bytes, capacity %d)", i, len(p), cap(p))
		}
		if i < len(d.pages)-1 && len(p) != pageSize || len(p) == 0 || cap(p) > pageSize {
			return fmt.Errorf("page %d of %d has %d bytes (capacity %d)", i, len(d.pages), len(p), cap(p))
		}
		total += len(p)
	}
	if total != d.size {
		return fmt.Errorf("pages hold %d bytes, size %d", total, d.size)
	}
	return nil
}

// OnHashing makes f run while Summary hashes a state outside the lock,
// until the test ends.
func OnHashing(t interface{ Cleanup(func()) }, f func()) {
	prev := hashing
	hashing = f
	t.Cleanup(func() { hashing = prev })
}
