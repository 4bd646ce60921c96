package store

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/containerd/errdefs"

	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/hlc"
	"github.com/shoal-dev/shoal/pkg/mst"
)

// Options configure a Store.
type Options struct {
	// Dir is the Pebble directory.
	Dir string
	// NodeID names this node in the stamps of its writes. It is stored on
	// first open; a later Open with a different non-empty NodeID fails.
	// Empty means: the stored one, or a new random one.
	NodeID string
	// Clock issues timestamps; nil means a wall clock with the default max
	// skew.
	Clock *hlc.Clock
	// Logger receives the store's (and Pebble's) messages.
	Logger *slog.Logger
	// WatchHistory is how many changes the log keeps for watchers to
	// resume from (default 100,000).
	WatchHistory uint64
	// MSTCacheNodes bounds the decoded MST nodes kept in memory.
	MSTCacheNodes int
	// MSTLevelBits sets the MST fanout (2^bits); it must be equal on every
	// node of a cluster. Default 4.
	MSTLevelBits int
	// MaxGroup bounds how many writes share one commit (default 1024).
	MaxGroup int
	// InMemory keeps the database in memory (simulations and tests): the
	// same code paths without a disk.
	InMemory bool
}

// PebbleOptions are the Pebble options of every store (benchmarks compare
// raw Pebble with the same). The caller owns a reference to the cache:
// Unref it once the database is open.
func PebbleOptions(log pebble.Logger) *pebble.Options {
	popts := &pebble.Options{
		Logger:             log,
		FormatMajorVersion: pebble.FormatNewest,
		// NB: Pebble reserves memtable memory out of the block cache; the
		// default 8 MB cache is all memtable and caches nothing, and every
		// write reads the document it merges into.
		Cache:        pebble.NewCache(cacheBytes),
		MemTableSize: 16 << 20,
	}
	// Bloom filters spare a read of a document that does not exist yet
	// (every create) a search through every level.
	for i := range popts.Levels {
		popts.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	return popts
}

// cacheBytes sizes Pebble's block cache (memtables included).
const cacheBytes = 96 << 20

// ErrClosed is returned by calls on a closed store.
var ErrClosed = fmt.Errorf("store closed: %w", errdefs.ErrUnavailable)

// ErrCompacted is returned by Watch when the change log no longer holds
// the requested revision.
var ErrCompacted = errors.New("revision compacted")

// Store is a node's replicated document store. All methods are safe for
// concurrent use.
type Store struct {
	opts   Options
	log    *slog.Logger
	db     *pebble.DB
	clock  *hlc.Clock
	nodeID string

	reqs    chan *writeReq
	repairs chan struct{}
	closing chan struct{}
	done    chan struct{}
	closeMu sync.Once
	// aheadMu: writers read-lock it around their reads ahead, so that
	// Close does not close the database under them.
	aheadMu sync.RWMutex

	// Committed state, published by the syncer after each durable commit.
	rev   atomic.Uint64
	opSeq atomic.Uint64 // sequence number of the last durable index op
	// applied is the last index op applied to Pebble (visible to reads,
	// durable or not): see writeReq.pre.
	applied atomic.Uint64
	oldest  atomic.Uint64
	state   atomic.Pointer[committed]

	notifyMu sync.Mutex
	notify   chan struct{} // closed and replaced at every commit

	stats counters

	// Owned by the committer goroutine.
	next      pending
	recent    recentWrites
	lastStamp hlc.Timestamp // the greatest stamp committed so far
	writes    groupWrites
	fbuilding *keyFilter // being built (filter.go)
	// filter, if set, holds every key that has a document record.
	filter atomic.Pointer[keyFilter]
	// bg tracks background goroutines the committer starts.
	bg sync.WaitGroup
	// syncq hands applied groups from the committer to the syncer.
	syncq chan *inflight
	// broken is set when a WAL sync failed; no write is accepted after.
	broken atomic.Pointer[error]

	// The index, maintained by the indexer goroutine (index.go).
	index       atomic.Pointer[indexState]
	indexWake   chan struct{} // new durable index ops
	indexKick   chan struct{} // a reader waits for the index
	indexReqs   chan chan rebuildResult
	indexStop   chan struct{}
	indexDone   chan struct{}
	indexMu     sync.Mutex
	indexNotify chan struct{} // closed and replaced at every index commit
	// Owned by the indexer goroutine.
	tree    *mst.Tree
	trimmed uint64 // index ops up to here are deleted from the log
	damaged bool   // the tree is damaged; wait for a rebuild
	// testHoldIndex, set by tests, stops the indexer while true.
	testHoldIndex atomic.Bool
}

// committed is the part of the committer's state published as one unit.
type committed struct {
	live       uint64
	tombstones uint64
}

// Open opens (or creates) the store in opts.Dir and starts its committer.
func Open(opts Options) (*Store, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.Clock == nil {
		opts.Clock = hlc.NewClock(nil, 0)
	}
	if opts.WatchHistory == 0 {
		opts.WatchHistory = 100_000
	}
	if opts.MaxGroup <= 0 {
		opts.MaxGroup = 1024
	}
	if opts.MSTLevelBits == 0 {
		opts.MSTLevelBits = 4
	}
	popts := PebbleOptions(pebbleLogger{opts.Logger.With("component", "pebble")})
	defer popts.Cache.Unref()
	if opts.InMemory {
		popts.FS = vfs.NewMem()
	}
	db, err := pebble.Open(opts.Dir, popts)
	if err != nil {
		return nil, fmt.Errorf("open pebble at %s: %w", opts.Dir, err)
	}
	s := &Store{
		opts:    opts,
		log:     opts.Logger,
		db:      db,
		clock:   opts.Clock,
		reqs:    make(chan *writeReq, opts.MaxGroup),
		repairs: make(chan struct{}, 1),
		closing: make(chan struct{}),
		done:    make(chan struct{}),
		notify:  make(chan struct{}),
		syncq:   make(chan *inflight, 1),

		indexWake:   make(chan struct{}, 1),
		indexKick:   make(chan struct{}, 1),
		indexReqs:   make(chan chan rebuildResult),
		indexStop:   make(chan struct{}),
		indexDone:   make(chan struct{}),
		indexNotify: make(chan struct{}),
	}
	if err := s.load(); err != nil {
		db.Close()
		return nil, err
	}
	go s.indexer()
	go s.run()
	return s, nil
}

// load reads the scalars, checks the format and node ID, restores the HLC
// and opens the tree at its persisted root (loading no more than the root).
func (s *Store) load() error {
	format, err := s.getUint(keyFormat)
	if err != nil {
		return err
	}
	isNew := format == 0
	if !isNew && format != formatVersion && format != 1 {
		return fmt.Errorf("store format %d, this binary reads %d", format, formatVersion)
	}
	stored, err := s.getBytes(keyNodeID)
	if err != nil {
		return err
	}
	switch {
	case stored == nil && s.opts.NodeID == "":
		s.nodeID = NewNodeID()
	case stored == nil:
		s.nodeID = s.opts.NodeID
	case s.opts.NodeID != "" && s.opts.NodeID != string(stored):
		return fmt.Errorf("state dir belongs to node %q, not %q", stored, s.opts.NodeID)
	default:
		s.nodeID = string(stored)
	}
	if len(s.nodeID) > crdt.MaxNodeID {
		return fmt.Errorf("node ID longer than %d bytes", crdt.MaxNodeID)
	}
	cs, err := readCommitScalars(s.db)
	if err != nil {
		return err
	}
	if format == 1 {
		if cs, err = s.loadV1Scalars(); err != nil {
			return err
		}
	}
	if format != formatVersion {
		b := s.db.NewBatch()
		b.Set(keyFormat, binary.BigEndian.AppendUint64(nil, formatVersion), nil)
		b.Set(keyNodeID, []byte(s.nodeID), nil)
		if format == 1 {
			b.Set(keyCommit, cs.encode(), nil)
			for _, k := range [][]byte{keyRevV1, keyHLCV1, keyLiveV1, keyTombstonesV1} {
				b.Delete(k, nil)
			}
		}
		if err := b.Commit(pebble.Sync); err != nil {
			return fmt.Errorf("initialise store: %w", err)
		}
	}
	oldest, err := s.getUint(keyOldest)
	if err != nil {
		return err
	}
	if oldest == 0 {
		oldest = 1
	}
	s.rev.Store(cs.rev)
	s.oldest.Store(oldest)
	s.clock.Restore(cs.hlc)
	var root mst.Hash
	if b, err := s.getBytes(keyRoot); err != nil {
		return err
	} else if len(b) == len(root) {
		copy(root[:], b)
	}
	indexed, err := s.getUint(keyIndexed)
	if err != nil {
		return err
	}
	if indexed > cs.opSeq {
		return fmt.Errorf("index at op %d is ahead of the op log (%d): %w", indexed, cs.opSeq, errdefs.ErrDataLoss)
	}
	st := committed{live: cs.live, tombstones: cs.tombstones}
	s.state.Store(&st)
	s.opSeq.Store(cs.opSeq)
	s.applied.Store(cs.opSeq)
	s.next = pending{rev: cs.rev, opSeq: cs.opSeq, st: st, oldest: oldest}
	s.recent = newRecentWrites(cs.opSeq)
	s.lastStamp = cs.hlc
	// The index may lag the documents by the ops it had not applied when
	// the store last stopped; the indexer replays them from the op log.
	s.index.Store(&indexState{root: root, seq: indexed})
	s.trimmed = indexed
	s.tree = s.openTree(root)
	return nil
}

// loadV1Scalars reads the scalars of a format 1 store. Its index always
// matched its documents, and it had no index op log: op 0 is its state.
func (s *Store) loadV1Scalars() (commitScalars, error) {
	var cs commitScalars
	var err error
	if cs.rev, err = s.getUint(keyRevV1); err != nil {
		return cs, err
	}
	if cs.live, err = s.getUint(keyLiveV1); err != nil {
		return cs, err
	}
	if cs.tombstones, err = s.getUint(keyTombstonesV1); err != nil {
		return cs, err
	}
	if b, err := s.getBytes(keyHLCV1); err != nil {
		return cs, err
	} else if b != nil {
		if cs.hlc, err = hlc.Decode(b); err != nil {
			return cs, fmt.Errorf("stored clock: %w", err)
		}
	}
	return cs, nil
}

func (s *Store) openTree(root mst.Hash) *mst.Tree {
	return mst.Open(pebbleNodes{s.db}, root, s.mstOptions())
}

func (s *Store) mstOptions() mst.Options {
	return mst.Options{LevelBits: s.opts.MSTLevelBits, CacheNodes: s.opts.MSTCacheNodes}
}

// Close stops the committer after the writes already queued and closes the
// database. Calls after Close fail with ErrClosed.
func (s *Store) Close() error {
	var err error
	s.closeMu.Do(func() {
		close(s.closing)
		<-s.done
		// Writers' reads ahead (prepareAhead) may still be running.
		s.aheadMu.Lock()
		err = s.db.Close()
		s.aheadMu.Unlock()
	})
	return err
}

// NodeID returns the ID this node stamps its writes with.
func (s *Store) NodeID() string { return s.nodeID }

// Clock returns the store's clock.
func (s *Store) Clock() *hlc.Clock { return s.clock }

// Revision returns the latest committed revision.
func (s *Store) Revision() uint64 { return s.rev.Load() }

// Root returns the MST root of the index once it covers every write
// acknowledged before the call (see waitIndexed).
func (s *Store) Root() mst.Hash {
	s.waitIndexed()
	return s.index.Load().root
}

// NewNodeID returns a random 12-hex-digit node ID.
func NewNodeID() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (s *Store) getBytes(key []byte) ([]byte, error) { return readBytes(s.db, key) }

// readBytes returns a copy of the value at key, nil if absent.
func readBytes(r pebble.Reader, key []byte) ([]byte, error) {
	v, c, err := r.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %q: %w", key, err)
	}
	defer c.Close()
	return append([]byte(nil), v...), nil
}

func (s *Store) getUint(key []byte) (uint64, error) {
	b, err := s.getBytes(key)
	if err != nil || b == nil {
		return 0, err
	}
	if len(b) != 8 {
		return 0, fmt.Errorf("scalar %q has %d bytes: %w", key, len(b), errdefs.ErrDataLoss)
	}
	return binary.BigEndian.Uint64(b), nil
}

// pebbleNodes serves MST nodes from the database.
type pebbleNodes struct{ r pebble.Reader }

func (p pebbleNodes) GetNode(h mst.Hash) ([]byte, error) {
	v, c, err := p.r.Get(nodeKey(h))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, fmt.Errorf("node %x: %w", h[:8], mst.ErrNodeNotFound)
	}
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return append([]byte(nil), v...), nil
}

type pebbleLogger struct{ log *slog.Logger }

func (l pebbleLogger) Infof(format string, args ...any) { l.log.Debug(fmt.Sprintf(format, args...)) }
func (l pebbleLogger) Errorf(format string, args ...any) {
	l.log.Error(fmt.Sprintf(format, args...))
}
func (l pebbleLogger) Fatalf(format string, args ...any) {
	l.log.Error(fmt.Sprintf(format, args...))
	panic(fmt.Sprintf(format, args...))
}
