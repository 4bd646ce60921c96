package raftgrouptest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// crashBlock is the unit a crash keeps or loses, as MemFS.CrashClone's.
const crashBlock = 4096

// crashDisk returns what a crash leaves of fs: everything synced, and
// each directory entry and each 4 KiB block written since its last sync
// with a probability of keepPct percent, as MemFS.CrashClone does — but
// rolled in path order, so that one seed always leaves the same disk
// (CrashClone rolls in Go's map order, which differs between runs, and
// rolls for every block, synced or not).
//
// It compares two clones: one keeping nothing unsynced and one keeping
// everything. A name in both is taken as one file whose unsynced blocks
// may survive; a file that an unsynced rename replaced could thus come
// back as a mix of the old and the new one, which a real disk would not
// do. The host renames over names only for free journal segments, whose
// content it never reads.
func crashDisk(fs *vfs.MemFS, keepPct int, rng *rand.Rand) (*vfs.MemFS, error) {
	synced := fs.CrashClone(vfs.CrashCloneCfg{})
	if keepPct <= 0 {
		return synced, nil
	}
	all := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 100, RNG: rand.New(rand.NewPCG(0, 0))})
	keep := func() bool { return rng.IntN(100) < keepPct }
	if err := keepUnsynced(synced, all, "/", keep); err != nil {
		return nil, err
	}
	return synced, nil
}

// keepUnsynced adds to dst, under dir, what keep chooses of what all
// holds beyond it, and syncs it: the next crash keeps it.
func keepUnsynced(dst, all *vfs.MemFS, dir string, keep func() bool) error {
	names, err := all.List(dir)
	if err != nil {
		return err
	}
	slices.Sort(names)
	have, err := dst.List(dir)
	if err != nil {
		return err
	}
	added := false
	for _, name := range names {
		path := all.PathJoin(dir, name)
		st, err := all.Stat(path)
		if err != nil {
			return err
		}
		if !slices.Contains(have, name) {
			if !keep() {
				continue
			}
			added = true
			if st.IsDir() {
				if err := dst.MkdirAll(path, 0o755); err != nil {
					return err
				}
			} else if f, err := dst.Create(path, vfs.WriteCategoryUnspecified); err != nil {
				return err
			} else if err := f.Close(); err != nil {
				return err
			}
		}
		if st.IsDir() {
			err = keepUnsynced(dst, all, path, keep)
		} else {
			err = keepBlocks(dst, all, path, keep)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	}
	if !added {
		return nil
	}
	d, err := dst.OpenDir(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}

// keepBlocks writes into dst's file at path the blocks of all's that
// differ from it and that keep chooses, and syncs it.
func keepBlocks(dst, all *vfs.MemFS, path string, keep func() bool) error {
	want, err := readAll(all, path)
	if err != nil {
		return err
	}
	got, err := readAll(dst, path)
	if err != nil {
		return err
	}
	var f vfs.File
	for off := 0; off < len(want); off += crashBlock {
		block := want[off:min(off+crashBlock, len(want))]
		if end := off + len(block); end <= len(got) && bytes.Equal(got[off:end], block) {
			continue
		}
		if !keep() {
			continue
		}
		if f == nil {
			if f, err = dst.OpenReadWrite(path, vfs.WriteCategoryUnspecified); err != nil {
				return err
			}
		}
		// NB: a block past the end leaves zeros before it, as a crash of
		// a file whose earlier blocks were lost would.
		if _, err := f.WriteAt(block, int64(off)); err != nil {
			f.Close()
			return err
		}
	}
	if f == nil {
		return nil
	}
	return errors.Join(f.Sync(), f.Close())
}

func readAll(fs vfs.FS, path string) ([]byte, error) {
	f, err := fs.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}
