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
		used += int64(len(n.data))
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
	}
	return nil
}
