package raftgroup

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	iofs "io/fs"
	"slices"
	"strconv"
	"strings"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// segmentLog holds the data of large log entries in append-only segment
// files beside Pebble, and Pebble holds a reference to it in the entry's
// place.
//
// Why: in Pebble a large entry is copied into the WAL, the memtable, and
// then once more into a blob file when the memtable is flushed (with
// several copies through the block encoder on the way), which made the
// flush half of a replica's CPU for sequential file writes. Here it is
// written once (one copy into the page cache) and read back only if the
// entry cache no longer has it.
//
// Durability: a round writes the data of its entries first and syncs the
// segment files before the round's synced Pebble commit, so a reference
// that is durable always points at durable data. A crash between the two
// leaves unreferenced bytes, which the next start drops with their
// segment. A segment is removed (or kept to be written over) once no
// group's log or stored snapshot references it and the Pebble commits that
// dropped the references have been synced.
//
// All methods run on the host loop (or while the host is being opened).
type segmentLog struct {
	fs      vfs.FS
	dir     string
	maxSize int64

	segs   map[uint64]*segment
	active *segment
	nextID uint64
	// unsynced are the segments written since the last sync.
	unsynced []*segment
	// refs is, for each segment, the greatest log index of each group
	// whose log references it; a group's entry stops counting once its
	// log is truncated past that index or the group is destroyed.
	refs map[uint64]map[GroupID]uint64
	// snaps is the segment holding each group's stored snapshot, when it
	// is in one.
	snaps map[GroupID]uint64
	// idle is set when a segment lost its last reference.
	idle bool
	// free are dead segment files kept to be written over (their names end
	// in .free): writing into pages the page cache already holds costs a
	// fraction of growing a new file (on a VM, fresh memory faults to the
	// hypervisor), as Pebble does with its WAL.
	free []string
}

// maxFreeSegments bounds the dead segments kept for reuse.
const maxFreeSegments = 4

type segment struct {
	id   uint64
	w    vfs.File // the active segment's writer, nil once rotated out
	r    vfs.File
	size int64
}

// segmentRef locates an entry's data.
type segmentRef struct {
	seg, off, n uint64
	crc         uint32
}

// refMarker starts a stored entry whose data is in a segment. A protobuf
// encoding of raftpb.Entry (fields 1 to 4) never starts with it.
const refMarker = 0xff

const defaultSegmentSize = 64 << 20

var crcTable = crc32.MakeTable(crc32.Castagnoli)

func segmentName(id uint64) string { return fmt.Sprintf("%016x.seg", id) }

// openSegmentLog opens dir (creating it), ready for the groups' logs to
// report their references (addRef) before dropUnreferenced runs.
func openSegmentLog(fs vfs.FS, dir string) (*segmentLog, error) {
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("raftgroup: segment directory: %w", err)
	}
	// The directory's own entry must be durable before any segment in it.
	if err := syncDir(fs, fs.PathDir(dir)); err != nil {
		return nil, err
	}
	names, err := fs.List(dir)
	if err != nil {
		return nil, fmt.Errorf("raftgroup: segment directory: %w", err)
	}
	l := &segmentLog{fs: fs, dir: dir, maxSize: defaultSegmentSize, segs: map[uint64]*segment{}, refs: map[uint64]map[GroupID]uint64{}, snaps: map[GroupID]uint64{}, nextID: 1}
	slices.Sort(names)
	for _, name := range names {
		if strings.HasSuffix(name, ".free") {
			if len(l.free) < maxFreeSegments {
				l.free = append(l.free, fs.PathJoin(dir, name))
			} else if err := fs.Remove(fs.PathJoin(dir, name)); err != nil {
				return nil, fmt.Errorf("raftgroup: remove segment: %w", err)
			}
			continue
		}
		hex, ok := strings.CutSuffix(name, ".seg")
		if !ok {
			continue
		}
		id, err := strconv.ParseUint(hex, 16, 64)
		if err != nil {
			continue
		}
		f, err := fs.Open(fs.PathJoin(dir, name))
		if err != nil {
			l.close()
			return nil, fmt.Errorf("raftgroup: open segment: %w", err)
		}
		st, err := f.Stat()
		if err != nil {
			f.Close()
			l.close()
			return nil, fmt.Errorf("raftgroup: stat segment: %w", err)
		}
		l.segs[id] = &segment{id: id, r: f, size: st.Size()}
		l.nextID = max(l.nextID, id+1)
	}
	return l, nil
}

// addRef records that group g's entry index references seg.
func (l *segmentLog) addRef(g GroupID, index, seg uint64) {
	m := l.refs[seg]
	if m == nil {
		m = map[GroupID]uint64{}
		l.refs[seg] = m
	}
	m[g] = max(m[g], index)
}

// release drops group g's references up to index (its log was truncated).
func (l *segmentLog) release(g GroupID, index uint64) {
	for seg, m := range l.refs {
		if i, ok := m[g]; ok && i <= index {
			delete(m, g)
			if len(m) == 0 {
				delete(l.refs, seg)
				l.idle = true
			}
		}
	}
}

// dropGroup drops every reference of group g (its log and snapshot are
// gone).
func (l *segmentLog) dropGroup(g GroupID) {
	l.release(g, ^uint64(0))
	if _, ok := l.snaps[g]; ok {
		delete(l.snaps, g)
		l.idle = true
	}
}

// setSnapshot records that group g's stored snapshot is in seg (the
// previous one no longer counts).
func (l *segmentLog) setSnapshot(g GroupID, seg uint64) {
	if old, ok := l.snaps[g]; ok && old != seg {
		l.idle = true
	}
	l.snaps[g] = seg
}

// referenced reports the segments that logs or snapshots refer to.
func (l *segmentLog) referenced() map[uint64]bool {
	out := make(map[uint64]bool, len(l.refs)+len(l.snaps))
	for id := range l.refs {
		out[id] = true
	}
	for _, id := range l.snaps {
		out[id] = true
	}
	return out
}

// dropUnreferenced removes, at start, the segments no log references:
// nothing can reference them later.
func (l *segmentLog) dropUnreferenced() error {
	live := l.referenced()
	for id, s := range l.segs {
		if !live[id] {
			if err := l.remove(s); err != nil {
				return err
			}
		}
	}
	return nil
}

// append writes the data of group g's entry index to the active segment
// and returns its reference. It is durable only after syncPending.
func (l *segmentLog) append(g GroupID, index uint64, data []byte) (segmentRef, error) {
	ref, err := l.write(data)
	if err != nil {
		return segmentRef{}, err
	}
	l.addRef(g, index, ref.seg)
	return ref, nil
}

// write writes data to the active segment (rotating it when full).
func (l *segmentLog) write(data []byte) (segmentRef, error) {
	if l.active == nil || l.active.size > 0 && l.active.size+int64(len(data)) > l.maxSize {
		if err := l.rotate(); err != nil {
			return segmentRef{}, err
		}
	}
	s := l.active
	if len(l.unsynced) == 0 || l.unsynced[len(l.unsynced)-1] != s {
		l.unsynced = append(l.unsynced, s)
	}
	// NB: vfs.File.Write may modify its argument on some filesystems; the
	// OS and in-memory ones used here do not, and the entry's data is still
	// in use (the entry cache, messages to followers).
	if _, err := s.w.Write(data); err != nil {
		return segmentRef{}, fmt.Errorf("raftgroup: write segment %d: %w", s.id, err)
	}
	ref := segmentRef{seg: s.id, off: uint64(s.size), n: uint64(len(data)), crc: crc32.Checksum(data, crcTable)}
	s.size += int64(len(data))
	return ref, nil
}

// rotate starts a new active segment. The new file's directory entry is
// synced here so that a later sync of its data is enough.
func (l *segmentLog) rotate() error {
	if a := l.active; a != nil {
		l.active = nil
		if !slices.Contains(l.unsynced, a) {
			err := a.w.Close()
			a.w = nil
			if err != nil {
				return fmt.Errorf("raftgroup: close segment %d: %w", a.id, err)
			}
		} // else syncPending closes it
		l.idle = true // collect skips the active segment: look again
	}
	id := l.nextID
	l.nextID++
	path := l.fs.PathJoin(l.dir, segmentName(id))
	var w vfs.File
	var err error
	if n := len(l.free); n > 0 {
		// NB: the old bytes past what is written stay; a reference carries
		// its offset, length and checksum, so they are never read.
		w, err = l.fs.ReuseForWrite(l.free[n-1], path, vfs.WriteCategoryUnspecified)
		l.free = l.free[:n-1]
	} else {
		w, err = l.fs.Create(path, vfs.WriteCategoryUnspecified)
	}
	if err != nil {
		return fmt.Errorf("raftgroup: create segment: %w", err)
	}
	r, err := l.fs.Open(path)
	if err != nil {
		w.Close()
		return fmt.Errorf("raftgroup: open segment: %w", err)
	}
	if err := syncDir(l.fs, l.dir); err != nil {
		w.Close()
		r.Close()
		return err
	}
	s := &segment{id: id, w: w, r: r}
	l.segs[id] = s
	l.active = s
	return nil
}

func syncDir(fs vfs.FS, dir string) error {
	d, err := fs.OpenDir(dir)
	if err != nil {
		return fmt.Errorf("raftgroup: open segment directory: %w", err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("raftgroup: sync segment directory: %w", err)
	}
	return nil
}

// pending reports whether appended data awaits syncPending.
func (l *segmentLog) pending() bool { return len(l.unsynced) > 0 }

// syncPending makes every appended byte durable.
func (l *segmentLog) syncPending() error {
	for _, s := range l.unsynced {
		if err := s.w.SyncData(); err != nil {
			return fmt.Errorf("raftgroup: sync segment %d: %w", s.id, err)
		}
		if s != l.active {
			err := s.w.Close()
			s.w = nil
			if err != nil {
				return fmt.Errorf("raftgroup: close segment %d: %w", s.id, err)
			}
		}
	}
	l.unsynced = l.unsynced[:0]
	return nil
}

// read returns the data ref points at.
func (l *segmentLog) read(ref segmentRef) ([]byte, error) {
	s := l.segs[ref.seg]
	if s == nil {
		return nil, fmt.Errorf("raftgroup: segment %d is missing", ref.seg)
	}
	buf := make([]byte, ref.n)
	if _, err := s.r.ReadAt(buf, int64(ref.off)); err != nil {
		return nil, fmt.Errorf("raftgroup: read segment %d at %d: %w", ref.seg, ref.off, err)
	}
	if crc32.Checksum(buf, crcTable) != ref.crc {
		return nil, fmt.Errorf("raftgroup: segment %d at %d: checksum mismatch", ref.seg, ref.off)
	}
	return buf, nil
}

// collect removes the segments no log references any more, once db has
// synced the commits that dropped the references (those are not synced
// on their own: truncation can wait, removing a segment cannot).
func (l *segmentLog) collect(db *pebble.DB) error {
	if !l.idle {
		return nil
	}
	l.idle = false
	var dead []*segment
	live := l.referenced()
	for id, s := range l.segs {
		if !live[id] && s != l.active && s.w == nil {
			dead = append(dead, s)
		}
	}
	if len(dead) == 0 {
		return nil
	}
	if err := db.LogData(nil, pebble.Sync); err != nil {
		return fmt.Errorf("raftgroup: sync before dropping segments: %w", err)
	}
	for _, s := range dead {
		if err := l.remove(s); err != nil {
			return err
		}
	}
	return nil
}

func (l *segmentLog) remove(s *segment) error {
	delete(l.segs, s.id)
	if s.w != nil {
		s.w.Close()
	}
	s.r.Close()
	path := l.fs.PathJoin(l.dir, segmentName(s.id))
	if len(l.free) < maxFreeSegments {
		free := strings.TrimSuffix(path, ".seg") + ".free"
		if err := l.fs.Rename(path, free); err != nil {
			return fmt.Errorf("raftgroup: keep segment %d: %w", s.id, err)
		}
		l.free = append(l.free, free)
		return nil
	}
	if err := l.fs.Remove(path); err != nil && !errors.Is(err, iofs.ErrNotExist) {
		return fmt.Errorf("raftgroup: remove segment %d: %w", s.id, err)
	}
	return nil
}

func (l *segmentLog) close() {
	for _, s := range l.segs {
		if s.w != nil {
			s.w.Close()
		}
		s.r.Close()
	}
	l.segs = nil
}

// Stored entries with their data in a segment:
//
//	refMarker | uvarint seg | uvarint off | uvarint n | crc32c(4) | raftpb.Entry without Data

func (ref segmentRef) header() []byte {
	hdr := []byte{refMarker}
	hdr = binary.AppendUvarint(hdr, ref.seg)
	hdr = binary.AppendUvarint(hdr, ref.off)
	hdr = binary.AppendUvarint(hdr, ref.n)
	return binary.BigEndian.AppendUint32(hdr, ref.crc)
}

// setRefEntry adds entry e at key to b with its data replaced by ref.
func setRefEntry(b *pebble.Batch, key []byte, e *pb.Entry, ref segmentRef) error {
	v, err := proto.MarshalOptions{}.MarshalAppend(ref.header(), &pb.Entry{Type: e.Type, Term: e.Term, Index: e.Index})
	if err != nil {
		return err
	}
	return b.Set(key, v, nil)
}

// splitRef splits a stored value into the reference to its data (nil if
// the data is inline) and the encoding that follows it.
func splitRef(v []byte) (*segmentRef, []byte, error) {
	if len(v) == 0 || v[0] != refMarker {
		return nil, v, nil
	}
	r := reader{b: v[1:]}
	ref := &segmentRef{seg: r.uvarint(), off: r.uvarint(), n: r.uvarint()}
	if r.err != nil || len(r.b) < 4 {
		return nil, nil, fmt.Errorf("raftgroup: segment reference: %w", errShort)
	}
	ref.crc = binary.BigEndian.Uint32(r.b)
	return ref, r.b[4:], nil
}

// decodeStored decodes a stored entry. For an entry whose data is in a
// segment it returns the entry without its data and the reference.
func decodeStored(v []byte) (*pb.Entry, *segmentRef, error) {
	ref, body, err := splitRef(v)
	if err != nil {
		return nil, nil, err
	}
	e, err := decodeEntry(body)
	if err != nil {
		return nil, nil, err
	}
	return e, ref, nil
}
