package raftgroup

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestUnlinkerRemovesAndReports: queued files are gone once close
// returns, a file already gone is no error, and a removal that fails is
// reported once.
func TestUnlinkerRemovesAndReports(t *testing.T) {
	dir := t.TempDir()
	var files []string
	for _, name := range []string{"a.log", "b.snap", "c.log"} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, make([]byte, 1<<20), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, p)
	}
	// A directory with a file in it cannot be removed.
	busy := filepath.Join(dir, "busy")
	if err := os.MkdirAll(filepath.Join(busy, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	u := newUnlinker(vfs.Default)
	for _, p := range files {
		u.remove(p)
	}
	u.remove(filepath.Join(dir, "never-there"))
	u.remove(busy)
	u.close()
	for _, p := range files {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s still there after close (%v)", p, err)
		}
	}
	err := u.takeErr()
	if err == nil || !strings.Contains(err.Error(), "busy") {
		t.Fatalf("failed removal reported as %v", err)
	}
	if err := u.takeErr(); err != nil {
		t.Fatalf("reported twice: %v", err)
	}
}

// TestWriteBack writes a file back on the OS filesystem (sync_file_range
// with its waits) and in memory (SyncTo), and what was written stays.
func TestWriteBack(t *testing.T) {
	for name, fs := range map[string]vfs.FS{"os": vfs.Default, "mem": vfs.NewMem()} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if name == "mem" {
				dir = "/d"
				if err := fs.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			path := fs.PathJoin(dir, "f")
			f, err := fs.Create(path, vfs.WriteCategoryUnspecified)
			if err != nil {
				t.Fatal(err)
			}
			data := []byte(strings.Repeat("shoal", 100<<10))
			var off int64
			for off < int64(len(data)) {
				n := min(int64(len(data))-off, writeBackStep)
				// A copy: the in-memory file scribbles on what it is
				// given in race builds.
				if _, err := f.Write(bytes.Clone(data[off : off+n])); err != nil {
					t.Fatal(err)
				}
				if err := writeBack(f, off, n); err != nil {
					t.Fatalf("write back [%d, %d): %v", off, off+n, err)
				}
				off += n
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			r, err := fs.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			got := make([]byte, len(data)+1)
			n, _ := r.ReadAt(got, 0)
			if string(got[:n]) != string(data) {
				t.Fatalf("read %d bytes back, wrote %d", n, len(data))
			}
		})
	}
}
