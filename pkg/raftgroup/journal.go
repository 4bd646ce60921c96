package raftgroup

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	iofs "io/fs"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// journal is the host's write-ahead log: every write the host makes to
// Pebble is first appended here as a record, and Pebble runs without its
// own WAL. It also holds the data of large entries and snapshots, which
// Pebble only references.
//
// Why not Pebble's WAL: a synced Pebble commit appends to a WAL file that
// grows, and on ext4 the fdatasync of a file whose size changed also
// commits the filesystem journal — two flushes of the disk where
// overwriting a file already allocated needs one. Measured on this
// project's machines, a synced 4 KiB Pebble commit took 440–650 µs and
// 820–900 µs with three replicas' hosts on one disk, against 190–230 µs
// and 340–360 µs for a write and fdatasync into a file written before.
// So the journal's segments are written over once they are free (the
// newest few dead ones are kept, as Pebble does with its WAL), a round's
// records go out with one write and at most one fdatasync, and the entry
// data of large entries is written once instead of into a WAL, a memtable
// and a blob file.
//
// Records (integers big-endian):
//
//	header crc32c(4) | kind(1) | segment id(8) | seq(8) | length(4) | payload crc32c(4)
//	payload (length bytes)
//
// The header checksum covers the header's other fields; the payload has
// its own, which a reference to blob data carries too. A record names its
// segment, so that the old bytes of a segment file being written over are
// never taken for records of the new one, and every record has the next
// sequence number, so that a scan stops at the first gap.
//
// Kinds: a batch record is the Repr of a Pebble batch, which includes the
// write of the batch's own sequence number under seqKey; a blob record is
// data that Pebble values reference by (segment, offset, length, crc).
//
// Durability: a batch is committed to Pebble after its record is
// written, and after the record is synced when the write must be durable;
// a batch that references blob data is committed only after that data is
// synced (Pebble may flush its memtable at any time, and must never hold a
// reference to bytes that a crash can lose). On open, Pebble holds a
// prefix of the batches (a flush persists whole memtables in order; its
// latest seqKey says which), and the batch records after it are replayed.
// A segment is dropped — or kept to be written over — once no log or
// snapshot references its blobs, the batch that dropped the last
// reference is durable, and Pebble has flushed every batch in the
// segment.
//
// Segments written by earlier versions (".seg") hold blobs without record
// framing; they are read through references and dropped like the others,
// never scanned. (Those versions' Pebble had its own WAL, which Pebble
// replays on open whatever its options; replay's flush then persists it.)
//
// All methods run on the host loop (or while the host is being opened).
type journal struct {
	fs      vfs.FS
	dir     string
	maxSize int64

	segs   map[uint64]*segment
	active *segment
	nextID uint64
	// seq is the sequence number of the last record written.
	seq uint64
	// unsynced are the segments written since the last sync, in order.
	unsynced []*segment
	// blobsUnsynced is set when blob data awaits a sync.
	blobsUnsynced bool
	// buf holds a batch record being encoded (reused).
	buf []byte
	// copyBlobs writes a copy of blob data, not the data itself: a
	// vfs.File may modify what it is given to write (Pebble's in-memory
	// filesystem does in race builds), and an entry's data is still in use
	// (the entry cache, messages to followers). The OS filesystem never
	// does, and spares the copy.
	copyBlobs bool
	// inline fills spares and waits for flushes on the loop
	// (Config.Deterministic).
	inline bool

	// refs is, for each segment, the greatest log index of each group
	// whose log references it; a group's entry stops counting once its
	// log is truncated past that index or the group is destroyed.
	refs map[uint64]map[GroupID]uint64
	// snaps is the segment holding each group's stored snapshot, when it
	// is in one.
	snaps map[GroupID]uint64
	// idle is set when a segment may have become dead.
	idle bool
	// releasedAt is the sequence number of the latest batch that dropped
	// references to blobs (releasePending: the next batch does); a
	// segment it left unreferenced may go only once that batch is durable,
	// or a crash could bring the references back.
	releasedAt     uint64
	releasePending bool
	// synced is the sequence number of the last record synced.
	synced uint64
	// free are dead segment files kept to be written over (their names end
	// in .free): writing into pages already allocated, and cached, costs a
	// fraction of growing a new file.
	free []string
	// spare, when set, delivers a file that a goroutine is filling with
	// zeros to maxSize (prepare), to be written over like a free one;
	// stopSpare asks that goroutine to give up.
	spare     chan string
	stopSpare chan struct{}

	// flushed is the greatest sequence number whose batch Pebble has
	// flushed to its tables; flushing is a flush under way that will make
	// it flushingSeq.
	flushed     uint64
	flushing    <-chan struct{}
	flushingSeq uint64

	// unlink removes dead files off the loop (unlink.go); nil while the
	// journal is being opened, and with inline.
	unlink *unlinker
}

// maxFreeSegments bounds the dead segments kept for reuse.
const maxFreeSegments = 4

type segment struct {
	id   uint64
	w    vfs.File // the active segment's writer, nil once rotated out and synced
	r    vfs.File
	size int64
	// legacy marks a segment of blobs without framing: one of an earlier
	// version, or a snapshot file (snapFile, written off the loop: see
	// writeSnapFile), which is removed when dead, not kept for reuse.
	legacy, snapFile bool
	// lastSeq is the sequence number of the last record in the segment.
	lastSeq uint64
	// grown marks a segment created empty (no free or spare file was
	// ready): its syncs also flush its growing size (see prepare).
	grown bool
	// syncedSize is the size at its last sync.
	syncedSize int64
	// pend gathers small records and blobs not yet written to the file
	// (counted in size): a round's blobs and its batch record reach the
	// file in one write (see segment.write).
	pend []byte
}

// segmentRef locates a blob: the payload of a blob record.
type segmentRef struct {
	seg, off, n uint64
	crc         uint32
}

// refMarker starts a stored entry whose data is in a segment. A protobuf
// encoding of raftpb.Entry (fields 1 to 4) never starts with it.
const refMarker = 0xff

const defaultSegmentSize = 64 << 20

const (
	recordBatch = 1
	recordBlob  = 2
	headerSize  = 4 + 1 + 8 + 8 + 4 + 4
	// maxRecord bounds a record's payload (a snapshot is one blob).
	maxRecord = 1<<31 - 1
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

func segmentName(id uint64) string { return fmt.Sprintf("%016x.log", id) }

// openJournal opens dir (creating it). The caller then replays it into
// Pebble (replay), lets the groups' logs report their references (addRef,
// setSnapshot) and drops what nothing needs (dropUnreferenced).
func openJournal(fs vfs.FS, dir string) (*journal, error) {
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("raftgroup: journal directory: %w", err)
	}
	// The directory's own entry must be durable before any segment in it.
	if err := syncDir(fs, fs.PathDir(dir)); err != nil {
		return nil, err
	}
	names, err := fs.List(dir)
	if err != nil {
		return nil, fmt.Errorf("raftgroup: journal directory: %w", err)
	}
	j := &journal{fs: fs, dir: dir, maxSize: defaultSegmentSize, segs: map[uint64]*segment{}, refs: map[uint64]map[GroupID]uint64{}, snaps: map[GroupID]uint64{}, nextID: 1, copyBlobs: fs != vfs.Default}
	slices.Sort(names)
	for _, name := range names {
		hex, ext, _ := strings.Cut(name, ".")
		id, err := strconv.ParseUint(hex, 16, 64)
		if err != nil {
			continue
		}
		// NB: free files count too: a new segment must not take the name
		// that a free file would get back when it dies.
		j.nextID = max(j.nextID, id+1)
		if ext == "prep" {
			// A spare being filled when the host stopped.
			if err := fs.Remove(fs.PathJoin(dir, name)); err != nil {
				return nil, fmt.Errorf("raftgroup: remove segment: %w", err)
			}
			continue
		}
		if ext == "free" {
			if len(j.free) < maxFreeSegments {
				j.free = append(j.free, fs.PathJoin(dir, name))
			} else if err := fs.Remove(fs.PathJoin(dir, name)); err != nil {
				return nil, fmt.Errorf("raftgroup: remove segment: %w", err)
			}
			continue
		}
		legacy, snapFile := ext == "seg", ext == "snap"
		if !legacy && !snapFile && ext != "log" {
			continue
		}
		f, err := fs.Open(fs.PathJoin(dir, name))
		if err != nil {
			j.close()
			return nil, fmt.Errorf("raftgroup: open segment: %w", err)
		}
		st, err := f.Stat()
		if err != nil {
			f.Close()
			j.close()
			return nil, fmt.Errorf("raftgroup: stat segment: %w", err)
		}
		j.segs[id] = &segment{id: id, r: f, size: st.Size(), legacy: legacy || snapFile, snapFile: snapFile}
	}
	return j, nil
}

// replay applies to db the batch records after the last one db holds, and
// flushes db, so that every batch in the journal is in Pebble's tables.
// It returns the number of batches applied.
//
// A segment's records end at the first one that is invalid or out of
// sequence: a sync covers every byte written before it, in every segment,
// so nothing after such a record, in that segment or in a later one
// written before the crash, was ever acknowledged. A later segment may
// go on with the next record, though: a restart after such an end
// writes its records there, with the sequence numbers that follow the
// end. So a broken segment ends only itself, and its dead tail is
// invalidated (see invalidate).
func (j *journal) replay(db *pebble.DB, ks keyspace) (int, error) {
	n, _, err := j.replayTraced(db, ks)
	return n, err
}

// replayTraced is replay, also describing what it found in each segment
// (for the host's log: a replay that ends early loses what came after).
func (j *journal) replayTraced(db *pebble.DB, ks keyspace) (int, string, error) {
	var trace strings.Builder
	v, err := get(db, ks.seqKey())
	if err != nil {
		return 0, "", err
	}
	var have uint64
	if len(v) == 8 {
		have = binary.BigEndian.Uint64(v)
	}
	ids := slices.DeleteFunc(j.segIDs(), func(id uint64) bool { return j.segs[id].legacy })
	applied := 0
	last := have        // the last record's sequence number, from have on
	var stale []staleAt // the first records of dead tails
	fmt.Fprintf(&trace, "have %d;", have)
	for _, id := range ids {
		s := j.segs[id]
		var first, seen uint64
		records := 0
		ended := false
		err := s.scan(func(off int64, h recordHeader, payload func() ([]byte, error)) (bool, error) {
			if records == 0 {
				first = h.seq
			}
			records++
			seen = h.seq
			if h.seq <= have && last == have {
				// Pebble holds it already (segments of such records may be
				// gone, so no order is checked here).
				s.lastSeq = h.seq
				return true, nil
			}
			if h.seq != last+1 {
				ended = true
				stale = append(stale, staleAt{s, off})
				return false, nil
			}
			if h.kind == recordBatch {
				data, err := payload()
				if err != nil {
					// Torn: the end of what was written.
					ended = true
					stale = append(stale, staleAt{s, off})
					return false, nil
				}
				b := db.NewBatch()
				err = b.SetRepr(data)
				if err == nil {
					err = b.Commit(pebble.NoSync)
				}
				b.Close()
				if err != nil {
					return false, fmt.Errorf("raftgroup: replay journal record %d: %w", h.seq, err)
				}
				applied++
			}
			last = h.seq
			s.lastSeq = h.seq
			return true, nil
		})
		fmt.Fprintf(&trace, " %x: %d records, seq %d..%d, size %d, ended %v;", id, records, first, seen, s.size, ended)
		if err != nil {
			return applied, trace.String(), err
		}
	}
	// A dead tail was never acknowledged, but it stays in its file, and
	// the journal goes on in a new segment with the sequence numbers that
	// follow last: a later replay must not take a dead record for one of
	// those (a torn record whose header survived has the number the next
	// record takes; a record after it, intact, one of the numbers after).
	// Their headers are zeroed, durably, before anything new is written.
	if err := j.invalidate(stale); err != nil {
		return applied, trace.String(), err
	}
	if err := db.Flush(); err != nil {
		return applied, trace.String(), fmt.Errorf("raftgroup: flush after journal replay: %w", err)
	}
	j.seq = last
	j.flushed, j.synced = j.seq, j.seq
	fmt.Fprintf(&trace, " last %d", last)
	return applied, trace.String(), nil
}

// staleAt is a record of segment s at offset off.
type staleAt struct {
	s   *segment
	off int64
}

// invalidate zeroes the header of each record named, so that a scan
// stops there, and syncs the files.
func (j *journal) invalidate(recs []staleAt) error {
	var zeros [headerSize]byte
	for _, r := range recs {
		if r.off+headerSize > r.s.size {
			continue
		}
		path := j.fs.PathJoin(j.dir, segmentName(r.s.id))
		f, err := j.fs.OpenReadWrite(path, vfs.WriteCategoryUnspecified)
		if err != nil {
			return fmt.Errorf("raftgroup: open journal segment %d to end it: %w", r.s.id, err)
		}
		_, err = f.WriteAt(zeros[:], r.off)
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("raftgroup: end journal segment %d at %d: %w", r.s.id, r.off, err)
		}
	}
	return nil
}

// scan visits the segment's records in order until fn returns false or
// the next record is invalid (torn, or left from an earlier use of the
// file) or past the end; payload reads and checks a record's payload.
func (s *segment) scan(fn func(off int64, h recordHeader, payload func() ([]byte, error)) (bool, error)) error {
	var hdr [headerSize]byte
	for off := int64(0); off+headerSize <= s.size; {
		if _, err := s.r.ReadAt(hdr[:], off); err != nil {
			return nil
		}
		h, ok := parseHeader(hdr[:])
		start := off + headerSize
		if !ok || h.seg != s.id || start+int64(h.n) > s.size {
			return nil
		}
		payload := func() ([]byte, error) {
			buf := make([]byte, h.n)
			if _, err := s.r.ReadAt(buf, start); err != nil {
				return nil, err
			}
			if crc32.Checksum(buf, crcTable) != h.crc {
				return nil, errors.New("checksum mismatch")
			}
			return buf, nil
		}
		if more, err := fn(off, h, payload); err != nil || !more {
			return err
		}
		off = start + int64(h.n)
	}
	return nil
}

type recordHeader struct {
	kind byte
	seg  uint64
	seq  uint64
	n    uint32
	crc  uint32
}

func appendHeader(b []byte, h recordHeader) []byte {
	start := len(b)
	b = append(b, 0, 0, 0, 0, h.kind)
	b = binary.BigEndian.AppendUint64(b, h.seg)
	b = binary.BigEndian.AppendUint64(b, h.seq)
	b = binary.BigEndian.AppendUint32(b, h.n)
	b = binary.BigEndian.AppendUint32(b, h.crc)
	binary.BigEndian.PutUint32(b[start:], crc32.Checksum(b[start+4:], crcTable))
	return b
}

func parseHeader(b []byte) (recordHeader, bool) {
	if len(b) < headerSize || binary.BigEndian.Uint32(b) != crc32.Checksum(b[4:headerSize], crcTable) {
		return recordHeader{}, false
	}
	h := recordHeader{
		kind: b[4],
		seg:  binary.BigEndian.Uint64(b[5:]),
		seq:  binary.BigEndian.Uint64(b[13:]),
		n:    binary.BigEndian.Uint32(b[21:]),
		crc:  binary.BigEndian.Uint32(b[25:]),
	}
	return h, h.kind == recordBatch || h.kind == recordBlob
}

// addRef records that group g's entry index references seg.
func (j *journal) addRef(g GroupID, index, seg uint64) {
	m := j.refs[seg]
	if m == nil {
		m = map[GroupID]uint64{}
		j.refs[seg] = m
	}
	m[g] = max(m[g], index)
}

// release drops group g's references up to index (its log was truncated).
// It reports whether a segment lost its last reference.
func (j *journal) release(g GroupID, index uint64) bool {
	dropped := false
	for seg, m := range j.refs {
		if i, ok := m[g]; ok && i <= index {
			delete(m, g)
			if len(m) == 0 {
				delete(j.refs, seg)
				j.released()
				dropped = true
			}
		}
	}
	return dropped
}

// releasedWritten notes that the references just dropped were dropped by
// the batch written last: its record, not the next one, is what must be
// durable before their segments go. A truncation is often a group's last
// write before it falls idle, and no next record may come for a long
// time. (The host's loop stages and writes one batch at a time, so no
// release of a batch not yet written is pending.)
func (j *journal) releasedWritten() {
	j.releasedAt, j.releasePending = max(j.releasedAt, j.seq), false
}

// dropGroup drops every reference of group g (its log and snapshot are
// gone).
func (j *journal) dropGroup(g GroupID) {
	j.release(g, ^uint64(0))
	if _, ok := j.snaps[g]; ok {
		delete(j.snaps, g)
		j.released()
	}
}

// released notes that references were dropped by the batch being staged
// or, when called after a batch was written, by that one: the next batch
// record is never earlier than either.
func (j *journal) released() {
	j.releasePending = true
	j.idle = true
}

// setSnapshot records that group g's stored snapshot is in seg (the
// previous one no longer counts).
func (j *journal) setSnapshot(g GroupID, seg uint64) {
	if old, ok := j.snaps[g]; ok && old != seg {
		j.released()
	}
	j.snaps[g] = seg
}

// referenced reports the segments that logs or snapshots refer to.
func (j *journal) referenced() map[uint64]bool {
	out := make(map[uint64]bool, len(j.refs)+len(j.snaps))
	for id := range j.refs {
		out[id] = true
	}
	for _, id := range j.snaps {
		out[id] = true
	}
	return out
}

// segIDs lists the segments in order: what the journal does to its files
// (which dead ones it keeps to write over, and their order) must not
// depend on Go's map order, or a simulation's run would not follow from
// its seed (Config.Deterministic).
func (j *journal) segIDs() []uint64 {
	ids := slices.Collect(maps.Keys(j.segs))
	slices.Sort(ids)
	return ids
}

// dropUnreferenced removes, at start (after replay), the segments no log
// references: every batch in them is in Pebble's tables.
func (j *journal) dropUnreferenced() error {
	live := j.referenced()
	for _, id := range j.segIDs() {
		if s := j.segs[id]; !live[id] {
			if err := j.remove(s); err != nil {
				return err
			}
		}
	}
	return nil
}

// blob writes data as a blob record and returns its reference. It is
// durable only after sync; commit syncs before a batch that may
// reference it.
func (j *journal) blob(data []byte) (segmentRef, error) {
	crc := crc32.Checksum(data, crcTable)
	s, err := j.startBlob(len(data), crc)
	if err != nil {
		return segmentRef{}, err
	}
	if j.copyBlobs {
		data = bytes.Clone(data)
	}
	if err := s.write(data); err != nil {
		return segmentRef{}, err
	}
	ref := segmentRef{seg: s.id, off: uint64(s.size) - uint64(len(data)), n: uint64(len(data)), crc: crc}
	s.lastSeq = j.seq
	return ref, nil
}

// startBlob writes the header of a blob record of n bytes whose checksum
// is crc and returns the segment its data is to follow in.
func (j *journal) startBlob(n int, crc uint32) (*segment, error) {
	if n > maxRecord {
		return nil, fmt.Errorf("raftgroup: %d bytes is too large for one journal record", n)
	}
	s, err := j.room(n)
	if err != nil {
		return nil, err
	}
	j.seq++
	hdr := appendHeader(j.buf[:0], recordHeader{kind: recordBlob, seg: s.id, seq: j.seq, n: uint32(n), crc: crc})
	j.buf = hdr[:0]
	if err := s.write(hdr); err != nil {
		return nil, err
	}
	j.blobsUnsynced = true
	return s, nil
}

// streamBlob writes a blob of n bytes whose checksum is crc, its data
// written by write (to which it hands the segment's writer), without the
// data in one buffer. write must write exactly those n bytes; if it does
// not, the segment holds a broken record and the error says so.
func (j *journal) streamBlob(n int, crc uint32, write func(io.Writer) error) (segmentRef, error) {
	s, err := j.startBlob(n, crc)
	if err != nil {
		return segmentRef{}, err
	}
	start := s.size
	sw := &segmentWriter{s: s, copy: j.copyBlobs}
	// Buffered for the many small pieces of an encoding; a piece as large
	// as the buffer goes straight through.
	bw := bufio.NewWriterSize(sw, 256<<10)
	err = write(bw)
	if err == nil {
		err = bw.Flush()
	}
	if sw.err != nil {
		return segmentRef{}, sw.err
	}
	if err != nil {
		return segmentRef{}, fmt.Errorf("raftgroup: write journal segment %d: %w", s.id, err)
	}
	if got := s.size - start; got != int64(n) {
		if got < int64(n) {
			// Keep the records after it readable: the header says n
			// bytes follow. Nothing refers to this blob (the caller
			// stores no reference on an error).
			if err := s.write(make([]byte, int64(n)-got)); err != nil {
				return segmentRef{}, err
			}
		}
		return segmentRef{}, fmt.Errorf("raftgroup: journal segment %d: blob of %d bytes written as %d", s.id, n, got)
	}
	s.lastSeq = j.seq
	return segmentRef{seg: s.id, off: uint64(start), n: uint64(n), crc: crc}, nil
}

// segmentWriter is an io.Writer onto a segment (see streamBlob).
type segmentWriter struct {
	s *segment
	// copy writes a copy of what it is given (see journal.copyBlobs): it
	// may be a state machine's own memory.
	copy bool
	err  error
}

func (w *segmentWriter) Write(p []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	data := p
	if w.copy {
		data = bytes.Clone(p)
	}
	if w.err = w.s.write(data); w.err != nil {
		return 0, w.err
	}
	return len(p), nil
}

// appendEntry writes the data of group g's entry index as a blob.
func (j *journal) appendEntry(g GroupID, index uint64, data []byte) (segmentRef, error) {
	ref, err := j.blob(data)
	if err != nil {
		return segmentRef{}, err
	}
	j.addRef(g, index, ref.seg)
	return ref, nil
}

// batch writes b (to which it adds its sequence number under seqKey) as
// a batch record; with sync, or when blobs await a sync, it also syncs.
// The caller commits b to Pebble afterwards.
func (j *journal) batch(b *pebble.Batch, ks keyspace, sync bool) error {
	seq := j.seq + 1
	if err := b.Set(ks.seqKey(), binary.BigEndian.AppendUint64(nil, seq), nil); err != nil {
		return err
	}
	repr := b.Repr()
	if len(repr) > maxRecord {
		return fmt.Errorf("raftgroup: a batch of %d bytes is too large for one journal record", len(repr))
	}
	s, err := j.room(len(repr))
	if err != nil {
		return err
	}
	j.seq = seq
	if j.releasePending {
		j.releasedAt, j.releasePending = seq, false
	}
	buf := appendHeader(j.buf[:0], recordHeader{kind: recordBatch, seg: s.id, seq: seq, n: uint32(len(repr)), crc: crc32.Checksum(repr, crcTable)})
	// One write for the record: the batch's bytes are copied once more,
	// which costs less than a second system call for the small batches
	// that most rounds write.
	buf = append(buf, repr...)
	j.buf = buf[:0]
	if err := s.write(buf); err != nil {
		return err
	}
	s.lastSeq = seq
	if sync || j.blobsUnsynced {
		return j.sync()
	}
	// Unsynced, the record still reaches the file now, as it did before
	// records were gathered: Pebble gets the batch next.
	return j.flushUnsynced()
}

// room returns the segment the next record of n payload bytes goes to,
// rotating the active one when it is full.
func (j *journal) room(n int) (*segment, error) {
	full := j.active == nil || j.active.size > 0 && j.active.size+headerSize+int64(n) > j.maxSize
	if full || j.active.grown && (len(j.free) > 0 || j.spareReady()) {
		if err := j.rotate(); err != nil {
			return nil, err
		}
	}
	s := j.active
	if len(j.unsynced) == 0 || j.unsynced[len(j.unsynced)-1] != s {
		j.unsynced = append(j.unsynced, s)
	}
	return s, nil
}

// gatherPart is the largest piece a segment gathers in pend, and
// gatherMax the most pend holds: a 4 KiB write's blob (its header and
// data) and the round's batch record were three system calls, each a
// few microseconds on a journal sync's way; a larger piece goes to the
// file directly, where copying it would cost more than its call.
const (
	gatherPart = 32 << 10
	gatherMax  = 256 << 10
)

// write appends parts to the segment: small ones to pend, written by
// flush (which batch, sync and read call), large ones to the file at
// once, after what pend holds.
func (s *segment) write(parts ...[]byte) error {
	for _, p := range parts {
		if len(p) <= gatherPart {
			if len(s.pend)+len(p) > gatherMax {
				if err := s.flush(); err != nil {
					return err
				}
			}
			s.pend = append(s.pend, p...)
		} else {
			if err := s.flush(); err != nil {
				return err
			}
			if _, err := s.w.Write(p); err != nil {
				return fmt.Errorf("raftgroup: write journal segment %d: %w", s.id, err)
			}
		}
		s.size += int64(len(p))
	}
	return nil
}

// flush writes what pend holds to the file.
func (s *segment) flush() error {
	if len(s.pend) == 0 {
		return nil
	}
	_, err := s.w.Write(s.pend)
	s.pend = s.pend[:0]
	if err != nil {
		return fmt.Errorf("raftgroup: write journal segment %d: %w", s.id, err)
	}
	return nil
}

// flushUnsynced writes every segment's gathered bytes to its file.
func (j *journal) flushUnsynced() error {
	for _, s := range j.unsynced {
		if err := s.flush(); err != nil {
			return err
		}
	}
	return nil
}

// rotate starts a new active segment. The new file's directory entry is
// synced here so that a later sync of its data is enough.
func (j *journal) rotate() error {
	if a := j.active; a != nil {
		j.active = nil
		if !slices.Contains(j.unsynced, a) {
			err := a.w.Close()
			a.w = nil
			if err != nil {
				return fmt.Errorf("raftgroup: close segment %d: %w", a.id, err)
			}
		} // else sync closes it
		j.idle = true // collect skips the active segment: look again
	}
	id := j.reserveID()
	path := j.fs.PathJoin(j.dir, segmentName(id))
	var w vfs.File
	var err error
	if len(j.free) == 0 {
		j.spareReady()
	}
	grown := false
	if n := len(j.free); n > 0 {
		// NB: the old bytes past what is written stay; records name their
		// segment, so a scan never takes them for records of this one.
		w, err = j.fs.ReuseForWrite(j.free[n-1], path, vfs.WriteCategoryUnspecified)
		j.free = j.free[:n-1]
	} else {
		w, err = j.fs.Create(path, vfs.WriteCategoryUnspecified)
		grown = true
	}
	if err != nil {
		return fmt.Errorf("raftgroup: create segment: %w", err)
	}
	r, err := j.fs.Open(path)
	if err != nil {
		w.Close()
		return fmt.Errorf("raftgroup: open segment: %w", err)
	}
	if err := syncDir(j.fs, j.dir); err != nil {
		w.Close()
		r.Close()
		return err
	}
	s := &segment{id: id, w: w, r: r, grown: grown}
	j.segs[id] = s
	j.active = s
	return nil
}

// spareReady moves the spare to the free files if it is ready, and
// reports whether it did.
func (j *journal) spareReady() bool {
	if j.spare == nil {
		return false
	}
	select {
	case f := <-j.spare:
		j.spare = nil
		if f == "" {
			return false
		}
		j.free = append(j.free, f)
		return true
	default:
		return false
	}
}

// smallSync is the most a sync may cover for the segment it lands in to be
// worth a spare (see prepare).
const smallSync = 64 << 10

// prepare starts filling a spare segment file with zeros in the
// background, unless one is under way. A segment written over from its
// first record onwards costs one flush per sync, where a growing file
// needs a second one for its size: measured here, a 4 KiB record and its
// fdatasync took 170 µs in a file of zeros and 255 µs in a growing one.
// For syncs of a megabyte that difference is lost in the data's own
// writing, while the zeros cost as much to write as the data (they were
// an eighth of the volds' CPU while a fresh journal took sequential
// writes). So sync prepares a spare only when a sync of a grown segment
// covered less than smallSync bytes, and room moves a grown segment's
// records to the spare, or to a free file, once one is ready.
func (j *journal) prepare() {
	if j.spare != nil {
		return
	}
	id := j.nextID
	j.nextID++
	tmp := j.fs.PathJoin(j.dir, fmt.Sprintf("%016x.prep", id))
	free := j.fs.PathJoin(j.dir, fmt.Sprintf("%016x.free", id))
	fs, size := j.fs, j.maxSize
	spare, stop := make(chan string, 1), make(chan struct{})
	j.spare, j.stopSpare = spare, stop
	fill := func() {
		ok := fillZeros(fs, tmp, size, stop) == nil && fs.Rename(tmp, free) == nil
		if !ok {
			_ = fs.Remove(tmp)
			free = ""
		}
		spare <- free
	}
	if j.inline {
		fill()
		return
	}
	go fill()
}

// fillZeros writes a file of size zero bytes and syncs it, unless stop is
// closed first.
func fillZeros(fs vfs.FS, path string, size int64, stop <-chan struct{}) error {
	f, err := fs.Create(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	defer f.Close()
	zeros := make([]byte, min(size, writeBackStep))
	for off := int64(0); off < size; off += int64(len(zeros)) {
		select {
		case <-stop:
			return errors.New("stopped")
		default:
		}
		n := min(int64(len(zeros)), size-off)
		if _, err := f.Write(zeros[:n]); err != nil {
			return err
		}
		// A little at a time, as a snapshot's file (writeBack): 64 MiB
		// left to the final sync held the journal's syncs behind it.
		if err := writeBack(f, off, n); err != nil {
			return err
		}
	}
	return f.Sync()
}

func syncDir(fs vfs.FS, dir string) error {
	d, err := fs.OpenDir(dir)
	if err != nil {
		return fmt.Errorf("raftgroup: open journal directory: %w", err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("raftgroup: sync journal directory: %w", err)
	}
	return nil
}

// sync makes every record written durable.
func (j *journal) sync() error {
	if err := j.flushUnsynced(); err != nil {
		return err
	}
	for _, s := range j.unsynced {
		if err := s.w.SyncData(); err != nil {
			return fmt.Errorf("raftgroup: sync journal segment %d: %w", s.id, err)
		}
		if s.grown && s == j.active && s.size-s.syncedSize < smallSync && len(j.free) == 0 {
			j.prepare()
		}
		s.syncedSize = s.size
		if s != j.active {
			err := s.w.Close()
			s.w, s.pend = nil, nil
			if err != nil {
				return fmt.Errorf("raftgroup: close segment %d: %w", s.id, err)
			}
			j.idle = true // collect skipped it while it was open
		}
	}
	j.unsynced = j.unsynced[:0]
	j.blobsUnsynced = false
	j.synced = j.seq
	return nil
}

// read returns the data ref points at.
func (j *journal) read(ref segmentRef) ([]byte, error) {
	s := j.segs[ref.seg]
	if s == nil {
		return nil, fmt.Errorf("raftgroup: segment %d is missing", ref.seg)
	}
	if len(s.pend) > 0 && int64(ref.off+ref.n) > s.size-int64(len(s.pend)) {
		// A blob of this round, read back before the round wrote it.
		if err := s.flush(); err != nil {
			return nil, err
		}
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

// collect drops the segments that nothing needs any more: no log or
// snapshot references them, the batch that dropped the references is
// durable, and Pebble has flushed their batches. When a flush is what is
// missing, it starts one (in the background: the loop goes on, and a
// later round drops the segments).
func (j *journal) collect(db *pebble.DB) error {
	if j.unlink != nil {
		if err := j.unlink.takeErr(); err != nil {
			return err
		}
	}
	if j.flushing != nil {
		select {
		case <-j.flushing:
			j.flushing = nil
			j.flushed = j.flushingSeq
			j.idle = true
		default:
		}
	}
	if !j.idle {
		return nil
	}
	j.idle = false
	live := j.referenced()
	durable := max(j.flushed, j.synced)
	flush := false
	for _, id := range j.segIDs() {
		s := j.segs[id]
		if live[id] || s == j.active || s.w != nil {
			continue
		}
		switch {
		case j.releasePending:
			// Wait for the next batch to be written (idle stays set).
			j.idle = true
			continue
		case s.lastSeq > j.flushed || j.releasedAt > durable:
			flush = true
			continue
		}
		if err := j.remove(s); err != nil {
			return err
		}
	}
	if flush && j.flushing == nil {
		ch, err := db.AsyncFlush()
		if err != nil {
			return fmt.Errorf("raftgroup: flush before dropping journal segments: %w", err)
		}
		j.flushing, j.flushingSeq = ch, j.seq
		if j.inline {
			<-ch
		}
	}
	return nil
}

func (j *journal) remove(s *segment) error {
	delete(j.segs, s.id)
	if s.w != nil {
		s.w.Close()
	}
	s.r.Close()
	name := segmentName(s.id)
	switch {
	case s.snapFile:
		name = snapFileName(s.id)
	case s.legacy:
		name = fmt.Sprintf("%016x.seg", s.id)
	}
	path := j.fs.PathJoin(j.dir, name)
	kept := len(j.free)
	if j.spare != nil {
		kept++
	}
	if kept < maxFreeSegments && !s.snapFile {
		free := strings.TrimSuffix(path, ".log") + ".free"
		if s.legacy {
			free = strings.TrimSuffix(path, ".seg") + ".free"
		}
		if err := j.fs.Rename(path, free); err != nil {
			return fmt.Errorf("raftgroup: keep segment %d: %w", s.id, err)
		}
		// NB: a crash can undo a rename, leaving a segment and its free
		// file both: the rename replaced that free file, listed already.
		if !slices.Contains(j.free, free) {
			j.free = append(j.free, free)
		}
		return nil
	}
	if j.unlink != nil {
		j.unlink.remove(path)
		return nil
	}
	if err := j.fs.Remove(path); err != nil && !errors.Is(err, iofs.ErrNotExist) {
		return fmt.Errorf("raftgroup: remove segment %d: %w", s.id, err)
	}
	return nil
}

func (j *journal) close() {
	if j.unlink != nil {
		j.unlink.close()
		j.unlink = nil
	}
	if j.spare != nil {
		close(j.stopSpare)
		<-j.spare
		j.spare = nil
	}
	for _, s := range j.segs {
		if s.w != nil {
			_ = s.flush() // unsynced: kept as the page cache would have it
			s.w.Close()
		}
		s.r.Close()
	}
	j.segs = nil
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
