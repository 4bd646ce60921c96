package volfuse_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shoal-dev/shoal/pkg/volfs"
	"github.com/shoal-dev/shoal/pkg/volfs/volfstest"
	"github.com/shoal-dev/shoal/pkg/volfuse"
)

func randBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// replicaRead reads a whole file straight from one replica's state, with
// no ReadIndex: what that replica has applied right now.
func replicaRead(t *testing.T, fs *volfs.FS, name string) []byte {
	t.Helper()
	c := &volfs.Client{B: &volfstest.Local{FS: fs}}
	ctx := context.Background()
	a, err := c.Lookup(ctx, volfs.RootIno, name)
	if err != nil {
		return nil
	}
	b, err := c.Read(ctx, a.Ino, 0, int(a.Size))
	check(t, err)
	return b
}

// TestCloseToOpen checks the visibility rule of write-behind across
// nodes: what one mount wrote is seen by the other once the writer's
// close or fsync returned.
func TestCloseToOpen(t *testing.T) {
	needFUSE(t)
	rt := volfstest.StartRealtime(t, 3)
	a, _ := mount(t, rt.Client(1))
	b, _ := mount(t, rt.Client(2))
	rng := rand.New(rand.NewPCG(1, 1))

	// Close: 3.5 MiB in 64 KiB writes (coalesced into 1 MiB chunks), then
	// a few small ones.
	data := randBytes(rng, 3<<20+512<<10)
	f, err := os.Create(filepath.Join(a, "closed"))
	check(t, err)
	for off := 0; off < len(data); off += 64 << 10 {
		_, err := f.Write(data[off:min(off+64<<10, len(data))])
		check(t, err)
	}
	check(t, f.Close())
	if got, err := os.ReadFile(filepath.Join(b, "closed")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("after close, the other mount reads %d bytes (%v), want %d", len(got), err, len(data))
	}

	// fsync, with the file still open; then a rewrite in the middle.
	f, err = os.Create(filepath.Join(a, "synced"))
	check(t, err)
	defer f.Close()
	_, err = f.Write(data[:1<<20+3])
	check(t, err)
	check(t, f.Sync())
	if got, err := os.ReadFile(filepath.Join(b, "synced")); err != nil || !bytes.Equal(got, data[:1<<20+3]) {
		t.Fatalf("after fsync, the other mount reads %d bytes (%v)", len(got), err)
	}
	_, err = f.WriteAt([]byte("middle"), 1000)
	check(t, err)
	check(t, unix.Fdatasync(int(f.Fd())))
	want := append([]byte(nil), data[:1<<20+3]...)
	copy(want[1000:], "middle")
	if got := readFile(t, filepath.Join(b, "synced")); got != string(want) {
		t.Fatal("after fdatasync, the other mount misses the rewrite")
	}
	// On the writer's node a write is visible at once, without fsync:
	// reads and stat account for the buffer.
	_, err = f.WriteAt([]byte("tail"), int64(len(want)))
	check(t, err)
	want = append(want, "tail"...)
	if got := readFile(t, filepath.Join(a, "synced")); got != string(want) {
		t.Fatal("the writer's node does not read its own unsynced write")
	}
	fi, err := os.Stat(filepath.Join(a, "synced"))
	check(t, err)
	if fi.Size() != int64(len(want)) {
		t.Fatalf("stat on the writer's node: size %d, want %d", fi.Size(), len(want))
	}
}

// TestFsyncQuorum checks that fsync returns only once the data is
// committed: applied on the writer's replica and in the log of a quorum.
func TestFsyncQuorum(t *testing.T) {
	needFUSE(t)
	rt := volfstest.StartRealtime(t, 3)
	for writer := 1; writer <= 3; writer++ {
		dir, _ := mount(t, rt.Client(writer))
		rng := rand.New(rand.NewPCG(2, uint64(writer)))
		data := randBytes(rng, 6<<20+123)
		name := fmt.Sprintf("w%d", writer)
		f, err := os.Create(filepath.Join(dir, name))
		check(t, err)
		for off := 0; off < len(data); off += 1 << 20 {
			_, err := f.Write(data[off:min(off+1<<20, len(data))])
			check(t, err)
		}
		check(t, f.Sync())
		// Right after fsync, before anything else happens.
		if got := replicaRead(t, rt.FS(writer), name); !bytes.Equal(got, data) {
			t.Fatalf("writer %d: its replica has %d bytes right after fsync, want %d", writer, len(got), len(data))
		}
		st, err := rt.Hosts[writer-1].Status(rt.Group)
		check(t, err)
		stored := 0
		for _, h := range rt.Hosts {
			s, err := h.Status(rt.Group)
			check(t, err)
			if s.LastIndex >= st.Applied {
				stored++
			}
		}
		if stored < 2 {
			t.Fatalf("writer %d: applied index %d is in the log of %d replicas right after fsync", writer, st.Applied, stored)
		}
		check(t, f.Close())
	}
}

// TestBufferedENOSPC checks that an error met by a buffered write is
// reported by the handle's next fsync, close or write.
func TestBufferedENOSPC(t *testing.T) {
	needFUSE(t)
	local := volfstest.NewLocal()
	c := &volfs.Client{B: local}
	dir, _ := mount(t, c)
	ctx := context.Background()
	check(t, c.SetLimit(ctx, 1000))

	// fsync reports it; the error is reported once.
	f, err := os.Create(filepath.Join(dir, "a"))
	check(t, err)
	_, err = f.Write(make([]byte, 2000))
	check(t, err) // buffered
	wantErrno(t, "fsync after a buffered write over the limit", f.Sync(), syscall.ENOSPC)
	check(t, f.Sync())
	check(t, f.Close())

	// close reports it.
	f, err = os.Create(filepath.Join(dir, "b"))
	check(t, err)
	_, err = f.Write(make([]byte, 2000))
	check(t, err)
	wantErrno(t, "close after a buffered write over the limit", f.Close(), syscall.ENOSPC)

	// A later write reports it, once the failed chunk was sent (a full
	// chunk is sent at once).
	f, err = os.Create(filepath.Join(dir, "c"))
	check(t, err)
	defer f.Close()
	_, err = f.Write(make([]byte, volfs.MaxWriteChunk))
	check(t, err)
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err = f.WriteAt([]byte("x"), 0)
		if err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no write reported the failed buffered write")
		}
		time.Sleep(time.Millisecond)
	}
	wantErrno(t, "write after a failed buffered write", err, syscall.ENOSPC)
	check(t, c.SetLimit(ctx, 0))
	_, err = f.WriteAt([]byte("y"), 0)
	check(t, err)
	check(t, f.Sync())
	if got := readFile(t, filepath.Join(dir, "c")); got != "y" {
		t.Fatalf("after the error, the file holds %q", got)
	}
}

// slowBackend delays every mutation by a random time, so that chunks
// sent together complete in any order, and records how many were in
// flight at once.
type slowBackend struct {
	*volfstest.Local
	inflight, peak atomic.Int32
	mu             sync.Mutex
	rng            *rand.Rand
}

func (s *slowBackend) Mutate(ctx context.Context, op []byte) ([]byte, error) {
	n := s.inflight.Add(1)
	defer s.inflight.Add(-1)
	for {
		p := s.peak.Load()
		if n <= p || s.peak.CompareAndSwap(p, n) {
			break
		}
	}
	s.mu.Lock()
	d := time.Duration(s.rng.IntN(3000)) * time.Microsecond
	s.mu.Unlock()
	time.Sleep(d)
	return s.Local.Mutate(ctx, op)
}

// TestOverlappingWrites writes overlapping ranges of one file through two
// descriptors, with chunks completing out of order in the backend: the
// file ends as the writes were made, in order.
func TestOverlappingWrites(t *testing.T) {
	needFUSE(t)
	sb := &slowBackend{Local: volfstest.NewLocal(), rng: rand.New(rand.NewPCG(3, 3))}
	dir, _ := mount(t, &volfs.Client{B: sb})
	p := filepath.Join(dir, "f")
	f1, err := os.Create(p)
	check(t, err)
	f2, err := os.OpenFile(p, os.O_WRONLY, 0)
	check(t, err)
	rng := rand.New(rand.NewPCG(4, 4))
	const span = 6 << 20
	var model []byte
	for i := range 400 {
		var size int
		switch rng.IntN(4) {
		case 0:
			size = 1 + rng.IntN(4096)
		case 1:
			size = 1 + rng.IntN(256<<10)
		default:
			size = 1 + rng.IntN(volfs.MaxWriteChunk)
		}
		off := rng.IntN(span - size)
		if rng.IntN(3) == 0 && len(model) > 0 {
			// Rewrite around the end of the previous data: merges with
			// the buffer's last extent.
			off = max(0, min(len(model)-size/2, span-size))
		}
		data := randBytes(rng, size)
		f := f1
		if rng.IntN(5) == 0 {
			f = f2
		}
		_, err := f.WriteAt(data, int64(off))
		check(t, err)
		if end := off + size; end > len(model) {
			model = append(model, make([]byte, end-len(model))...)
		}
		copy(model[off:], data)
		if i%97 == 96 {
			check(t, f1.Sync())
		}
	}
	check(t, f2.Close())
	check(t, f1.Close())
	got, err := os.ReadFile(p)
	check(t, err)
	if !bytes.Equal(got, model) {
		i := 0
		for i < min(len(got), len(model)) && got[i] == model[i] {
			i++
		}
		t.Fatalf("file differs from the writes made: %d bytes, want %d, first difference at %d", len(got), len(model), i)
	}
	if sb.peak.Load() < 2 {
		t.Errorf("at most %d write in flight at once: no pipelining", sb.peak.Load())
	}
	t.Logf("up to %d writes in flight at once", sb.peak.Load())
}

// TestSyncWritesVisible checks that O_DSYNC and O_SYNC writes write
// through: each is seen by the other mount as soon as write returns.
func TestSyncWritesVisible(t *testing.T) {
	needFUSE(t)
	rt := volfstest.StartRealtime(t, 3)
	a, _ := mount(t, rt.Client(1))
	b, _ := mount(t, rt.Client(3))
	for _, flag := range []int{syscall.O_DSYNC, syscall.O_SYNC} {
		name := fmt.Sprintf("sync%x", flag)
		f, err := os.OpenFile(filepath.Join(a, name), os.O_CREATE|os.O_WRONLY|flag, 0o644)
		check(t, err)
		var want []byte
		for i := range 20 {
			blk := bytes.Repeat([]byte{byte('a' + i)}, 4096)
			_, err := f.WriteAt(blk, int64(i)*4096)
			check(t, err)
			want = append(want, blk...)
			if got := readFile(t, filepath.Join(b, name)); got != string(want) {
				t.Fatalf("flag %#x: after write %d the other mount reads %d bytes", flag, i, len(got))
			}
		}
		check(t, f.Close())
	}
}

// durableBackend is a Local whose every mutation is appended to a log
// file and synced before it applies, so that a test can rebuild the
// volume a killed process acknowledged.
type durableBackend struct {
	*volfstest.Local
	mu  sync.Mutex
	log *os.File
}

func (d *durableBackend) Mutate(ctx context.Context, op []byte) ([]byte, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	rec := binary.AppendUvarint(nil, uint64(len(op)))
	if _, err := d.log.Write(append(rec, op...)); err != nil {
		return nil, err
	}
	if err := d.log.Sync(); err != nil {
		return nil, err
	}
	return d.Local.Mutate(ctx, op)
}

// replayLog rebuilds a durableBackend's volume from its log.
func replayLog(t *testing.T, path string) *volfstest.Local {
	t.Helper()
	b, err := os.ReadFile(path)
	check(t, err)
	l := volfstest.NewLocal()
	r := bytes.NewReader(b)
	for {
		n, err := binary.ReadUvarint(r)
		if err != nil {
			break
		}
		op := make([]byte, n)
		if _, err := io.ReadFull(r, op); err != nil {
			break // torn at the end: the process died mid-append
		}
		_, err = l.Mutate(context.Background(), op)
		check(t, err)
	}
	return l
}

// TestCrashLosesOnlyUnsynced kills the process serving a mount (kill -9)
// while a file is being written: what was fsynced or closed before is
// all there afterwards; of what was not, any part may be missing.
func TestCrashLosesOnlyUnsynced(t *testing.T) {
	if dir := os.Getenv("VOLFUSE_TEST_DURABLE"); dir != "" {
		serveDurable(dir, os.Getenv("VOLFUSE_TEST_LOG"))
		return
	}
	needFUSE(t)
	dir := t.TempDir()
	logPath := filepath.Join(t.TempDir(), "ops.log")
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashLosesOnlyUnsynced$")
	cmd.Env = append(os.Environ(), "VOLFUSE_TEST_DURABLE="+dir, "VOLFUSE_TEST_LOG="+logPath)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	check(t, err)
	check(t, cmd.Start())
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		_ = unix.Unmount(dir, unix.MNT_DETACH)
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		t.Fatalf("helper: %q %v", line, err)
	}
	rng := rand.New(rand.NewPCG(5, 5))
	synced := randBytes(rng, 2<<20+777)
	check(t, os.WriteFile(filepath.Join(dir, "closed"), synced[:300_000], 0o644))
	f, err := os.Create(filepath.Join(dir, "f"))
	check(t, err)
	_, err = f.Write(synced)
	check(t, err)
	check(t, f.Sync())
	unsynced := randBytes(rng, 3<<20)
	_, err = f.Write(unsynced)
	check(t, err)
	check(t, cmd.Process.Kill())
	_ = cmd.Wait()
	killed = true
	f.Close()

	l := replayLog(t, logPath)
	if got := replicaRead(t, l.FS, "closed"); !bytes.Equal(got, synced[:300_000]) {
		t.Fatalf("closed file: %d bytes after the crash, want %d", len(got), 300_000)
	}
	got := replicaRead(t, l.FS, "f")
	if len(got) < len(synced) || !bytes.Equal(got[:len(synced)], synced) {
		t.Fatalf("fsynced data lost in the crash: %d bytes survive", len(got))
	}
	// The unsynced part: any of it may be missing (zeros or past the
	// end), nothing else may be there.
	rest := got[len(synced):]
	kept := 0
	for i, c := range rest {
		switch c {
		case unsynced[i]:
			kept++
		case 0:
		default:
			t.Fatalf("byte %d after the synced data is %#x, never written", i, c)
		}
	}
	t.Logf("%d of %d unsynced bytes survived the crash", kept, len(unsynced))
}

// serveDurable is the helper process of TestCrashLosesOnlyUnsynced.
func serveDurable(dir, logPath string) {
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	b := &durableBackend{Local: volfstest.NewLocal(), log: lf}
	if _, err := volfuse.Mount(dir, &volfs.Client{B: b}, volfuse.Options{}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("ready")
	select {}
}
