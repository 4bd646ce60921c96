package raftgroup

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/shoal-dev/shoal/pkg/store"
)

// Config configures a Host.
type Config struct {
	// NodeID is this host's node (non-zero). The transport addresses it.
	NodeID NodeID
	// Dir (on FS, or the OS filesystem) holds the host's Pebble and, in
	// Dir/entries, its journal (journal.go).
	Dir string
	FS  vfs.FS
	// Transport sends batches to other hosts.
	Transport Transport
	// NewStateMachine returns the (empty) state machine of a group. The host
	// calls it when it creates, joins or reopens a group.
	NewStateMachine func(GroupID) StateMachine
	// Logger receives the host's, Raft's and Pebble's messages.
	Logger *slog.Logger
	// Now is the wall clock recorded in proposals (default time.Now).
	Now func() time.Time
	// Seed, when non-zero, seeds the generator of proposal keys so that a
	// run can be replayed; zero draws a random session.
	Seed uint64

	// TickInterval is Run's tick period (default 100ms).
	TickInterval time.Duration
	// ElectionTicks and HeartbeatTicks are Raft's timeouts in ticks
	// (defaults 10 and 1). Every host of a cluster should use the same.
	ElectionTicks  int
	HeartbeatTicks int
	// RetryTicks is how long a request waits for an outcome before the host
	// proposes it again (default ElectionTicks).
	RetryTicks int
	// QuiesceAfterTicks is how many idle ticks a leader waits before it
	// quiesces its group (default 2). DisableQuiesce keeps every group
	// ticking.
	QuiesceAfterTicks int
	DisableQuiesce    bool
	// SnapshotEntries is how many entries a group applies between two
	// snapshots (default 10,000), once they and their data weigh as much
	// as the last snapshot (1 KiB an entry beside its data); CompactionMargin is how many entries
	// before a snapshot the log keeps for slow followers (default 1,000).
	SnapshotEntries  uint64
	CompactionMargin uint64
	// SnapshotBytes also snapshots a group once it applied this much entry
	// data since its last snapshot, and at least four times that snapshot's
	// size (default 256 MiB); the log then keeps half of the entries
	// snapshotted.
	SnapshotBytes uint64
	// BackgroundSnapshots writes those snapshots of state machines that
	// can fork (SnapshotForker) off the loop, into files of their own
	// (bgsnapshot.go). Off, a snapshot is written on the loop, which is
	// deterministic (the simulated tests rely on it).
	BackgroundSnapshots bool
	// Raft flow control (defaults 1 MiB, 256, 64 MiB).
	MaxSizePerMsg       uint64
	MaxInflightMsgs     int
	MaxUncommittedBytes uint64
	// MaxInbox bounds the batches waiting for the loop (default 65,536);
	// beyond it inbound batches are dropped (Raft retries).
	MaxInbox int
	// SegmentSize is the size from which the journal starts a new segment
	// file (default 64 MiB).
	SegmentSize int64
	// DeferAppends is how long a leader may hold back appends to the
	// followers its quorum does not need (deferappend.go; default 10ms,
	// negative: never).
	DeferAppends time.Duration
	// FollowProposers moves a group's leadership to the voter that
	// proposes most of its entries (follow.go), so that a volume's writes
	// are proposed where they are replicated from.
	FollowProposers bool
	// LargeEntry is the size from which an entry's data stays in the
	// journal, referenced from Pebble, instead of being copied into Pebble
	// (default 2 KiB; negative: never). A 4 KiB write's data copied into
	// Pebble's memtable made it flush 16 MiB every two seconds or so under
	// synchronous 4 KiB writes, and the journal syncs that met those
	// flushes on the shared disk took milliseconds.
	LargeEntry int
	// Deterministic runs on the loop, to their end, what the host
	// otherwise leaves to goroutines beside it — filling a spare journal
	// segment, and the Pebble flush that frees dead segments — and turns
	// Pebble's automatic compactions off. Beside the loop their progress
	// depends on the scheduler, and so does what a simulated crash keeps;
	// with this, a simulation's run depends only on its seed
	// (raftgrouptest sets it; BackgroundSnapshots, where a test turns it
	// on, still writes off the loop). It costs the loop that work's time,
	// and Pebble its compactions: for tests only.
	Deterministic bool
	// ObserveSync, when set, is told how long each synced journal write
	// took (a round's, or a group's creation, join or removal: the write
	// and its fdatasync, by the real clock whatever Now is). The loop
	// calls it: it must not block.
	ObserveSync func(time.Duration)
}

func (c *Config) setDefaults() error {
	if c.NodeID == 0 {
		return errors.New("raftgroup: NodeID must be non-zero")
	}
	if c.Transport == nil {
		return errors.New("raftgroup: Transport is required")
	}
	if c.NewStateMachine == nil {
		return errors.New("raftgroup: NewStateMachine is required")
	}
	if c.Dir == "" {
		return errors.New("raftgroup: Dir is required")
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.TickInterval <= 0 {
		c.TickInterval = 100 * time.Millisecond
	}
	if c.DeferAppends == 0 {
		c.DeferAppends = 10 * time.Millisecond
	}
	if c.ElectionTicks <= 0 {
		c.ElectionTicks = 10
	}
	if c.HeartbeatTicks <= 0 {
		c.HeartbeatTicks = 1
	}
	if c.ElectionTicks <= c.HeartbeatTicks {
		return errors.New("raftgroup: ElectionTicks must exceed HeartbeatTicks")
	}
	if c.RetryTicks <= 0 {
		c.RetryTicks = c.ElectionTicks
	}
	if c.QuiesceAfterTicks <= 0 {
		c.QuiesceAfterTicks = 2
	}
	if c.SnapshotEntries == 0 {
		c.SnapshotEntries = 10_000
	}
	if c.CompactionMargin == 0 {
		c.CompactionMargin = 1_000
	}
	if c.SnapshotBytes == 0 {
		c.SnapshotBytes = 256 << 20
	}
	if c.SegmentSize <= 0 {
		c.SegmentSize = defaultSegmentSize
	}
	if c.MaxSizePerMsg == 0 {
		c.MaxSizePerMsg = 1 << 20
	}
	if c.MaxInflightMsgs <= 0 {
		c.MaxInflightMsgs = 256
	}
	if c.MaxUncommittedBytes == 0 {
		c.MaxUncommittedBytes = 64 << 20
	}
	if c.MaxInbox <= 0 {
		c.MaxInbox = 1 << 16
	}
	if c.LargeEntry == 0 {
		c.LargeEntry = 2 << 10
	}
	return nil
}

// Host runs many Raft groups in one process. See the package
// documentation for the design.
//
// The host's state is owned by its loop: Round (called by Run, or by a
// deterministic test) holds mu for a whole round. The public methods only
// queue work for the next round (inMu) or take mu briefly.
type Host struct {
	cfg  Config
	log  *slog.Logger
	db   *pebble.DB
	jnl  *journal
	ks   keyspace
	rlog raft.Logger

	// session and seq make generated proposal keys unique across restarts.
	session uint64

	// inMu guards the inbox: batches and requests queued for the loop.
	inMu    sync.Mutex
	inbox   []*Batch
	reqs    []request
	ticks   int
	closed  bool
	dropped uint64 // inbound batches dropped because the inbox was full
	wake    chan struct{}
	closing chan struct{}
	// bgWG counts the goroutines writing snapshots off the loop.
	bgWG sync.WaitGroup

	// index mirrors groups for Serves, which must not wait for mu.
	index sync.Map // GroupID → *group

	// mu is held by the loop for a whole round and by structural calls.
	// Everything below is guarded by it.
	mu     sync.Mutex
	seq    uint64
	groups map[GroupID]*group
	awake  map[GroupID]*group // groups that tick (not quiesced)
	dirty  map[GroupID]*group // groups that may have a Ready
	busy   map[GroupID]*group // groups with pending requests
	// retiring are the replicas removed from their groups that wait
	// until no voter needs them (retiring.go).
	retiring map[GroupID]*group
	// counted lists the groups with proposals counted this window
	// (follow.go).
	counted map[GroupID]*group
	tick    uint64
	peers   map[NodeID]*peer
	// peersStale asks for the peer set to be recomputed from memberships.
	peersStale bool
	out        map[NodeID]*Batch
	snapsSent  []sentSnap
	// held are the commit notices held back (lazycommit.go).
	held map[heldKey]heldNotice
	// deferred are the appends held back from spare followers
	// (deferappend.go).
	deferred map[heldKey]*deferredAppends
	// noticed counts, per group, the notice heartbeats received this
	// round, whose answers are not sent.
	noticed map[GroupID]int
	// acks lists, per node, the groups whose applied index to report.
	acks map[NodeID]map[GroupID]*group
	// appliedSome lists groups that applied entries this round.
	appliedSome map[GroupID]*group
	// attention lists groups with after-round work (a quiesce heartbeat
	// to act on, requests to re-propose after a leader change).
	attention  map[GroupID]*group
	nextReadID uint64
	// leaving is set by HandOff: the host takes no leadership from now
	// on; handoff is the hand-off, until it is done (handoff.go).
	leaving bool
	handoff *handOff
	err     error // fatal storage error: the host stopped
	stopped bool  // Close ran: the database may be closed
	stats   Stats
}

// Stats are counters of a host's activity (for tests and metrics).
type Stats struct {
	Rounds         uint64
	Syncs          uint64 // synced journal writes (one per round with durable writes)
	Commits        uint64 // batches written to the journal and Pebble, synced or not
	BatchesSent    uint64
	MessagesSent   uint64 // Raft messages sent, heartbeats included
	HeartbeatsSent uint64 // coalesced heartbeats and responses
	SnapshotsSent  uint64
	SnapshotsTaken uint64
	// BackgroundSnapshots counts the snapshots started off the loop (each
	// also counts in SnapshotsTaken once stored).
	BackgroundSnapshots uint64
	DroppedInbound      uint64 // messages for unknown or removed replicas
	InboxOverflow       uint64
	Ticked              uint64 // group ticks (Tick calls on RawNodes)
	QuiesceEntered      uint64
	ProposalRetries     uint64
	EarlyApplies        uint64 // Readies applied before their sync (appliesEarly)
	// LeaderTransfers counts the handovers of leadership to the replica
	// that proposed most (FollowProposers).
	LeaderTransfers uint64
	// NoticesHeld counts the commit notices held back (lazycommit.go), and
	// NoticesReleased those of them sent at a tick rather than superseded.
	NoticesHeld     uint64
	NoticesReleased uint64
	// AppendsDeferred counts the appends held back from spare followers
	// (deferappend.go), DeferredSent the queues of them sent.
	AppendsDeferred uint64
	DeferredSent    uint64
	// NoticeHeartbeats counts the commit notices sent as heartbeats that
	// want no answer (lazycommit.go).
	NoticeHeartbeats uint64
	// JournalReliefSnapshots counts the snapshots taken so that an idle
	// group's log lets go of old journal segments (journalrelief.go).
	JournalReliefSnapshots uint64

	// Gauges, at the time of the call.
	AwakeGroups     int    // groups ticking (not quiesced)
	EntryCacheBytes uint64 // log entries held in the groups' entry caches
}

type peer struct {
	lastHeard uint64 // host tick of the last batch received
	lastSent  uint64
	dead      bool
	leaving   bool // it hands its leaderships off (Batch.Leaving)
}

type sentSnap struct {
	g   GroupID
	to  ReplicaID
	n   NodeID
	msg *pb.Message
}

// request is work queued for the loop; fail resolves its future when the
// host closes first.
type request struct {
	run  func()
	fail func(error)
}

// Open opens a host: its Pebble (unless shared) and every group stored in
// it. Call Run (or drive Tick and Round) to make progress, Close to stop.
func Open(cfg Config) (*Host, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	h := &Host{
		cfg:         cfg,
		log:         cfg.Logger.With("node", uint64(cfg.NodeID)),
		wake:        make(chan struct{}, 1),
		closing:     make(chan struct{}),
		groups:      map[GroupID]*group{},
		awake:       map[GroupID]*group{},
		dirty:       map[GroupID]*group{},
		busy:        map[GroupID]*group{},
		retiring:    map[GroupID]*group{},
		counted:     map[GroupID]*group{},
		peers:       map[NodeID]*peer{},
		out:         map[NodeID]*Batch{},
		held:        map[heldKey]heldNotice{},
		deferred:    map[heldKey]*deferredAppends{},
		noticed:     map[GroupID]int{},
		acks:        map[NodeID]map[GroupID]*group{},
		appliedSome: map[GroupID]*group{},
		attention:   map[GroupID]*group{},
		peersStale:  true,
	}
	h.rlog = raftLogger{h.log.With("component", "raft")}
	if cfg.Seed != 0 {
		h.session = cfg.Seed
	} else {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, err
		}
		h.session = binary.BigEndian.Uint64(b[:])
	}
	popts := pebbleOptions(pebbleLogger{h.log.With("component", "pebble")})
	fs := cmp.Or[vfs.FS](cfg.FS, vfs.Default)
	popts.FS = fs
	if cfg.Deterministic {
		// Compactions run beside the loop, and what a crash in the middle
		// of one keeps would depend on how far it got. Without them level
		// 0 only grows: it must never stop writes.
		popts.DisableAutomaticCompactions = true
		popts.L0StopWritesThreshold = math.MaxInt32
	}
	db, err := pebble.Open(cfg.Dir, popts)
	popts.Cache.Unref()
	if err != nil {
		return nil, fmt.Errorf("raftgroup: open pebble at %s: %w", cfg.Dir, err)
	}
	h.db = db
	if h.jnl, err = openJournal(fs, fs.PathJoin(cfg.Dir, "entries")); err != nil {
		db.Close()
		return nil, err
	}
	h.jnl.maxSize = cfg.SegmentSize
	h.jnl.inline = cfg.Deterministic
	n, trace, err := h.jnl.replayTraced(db, h.ks)
	if n > 0 {
		h.log.Info("replayed the raft journal", "batches", n)
	}
	h.log.Debug("raft journal replay", "trace", trace)
	if err == nil {
		err = h.loadGroups()
	}
	if err == nil {
		err = h.jnl.dropUnreferenced()
	}
	if err != nil {
		h.jnl.close()
		h.db.Close()
		return nil, err
	}
	if !cfg.Deterministic {
		h.jnl.unlink = newUnlinker(fs)
	}
	return h, nil
}

// commit writes b to the journal (and syncs it if sync), then to Pebble.
// Every write of the host goes through it: Pebble has no WAL of its own.
func (h *Host) commit(b *pebble.Batch, sync bool) error {
	h.stats.Commits++
	var start time.Time
	if sync && h.cfg.ObserveSync != nil {
		start = time.Now()
	}
	if err := h.jnl.batch(b, h.ks, sync); err != nil {
		return err
	}
	if !start.IsZero() {
		h.cfg.ObserveSync(time.Since(start))
	}
	return b.Commit(pebble.NoSync)
}

// loadGroups reopens every group with a replica record.
func (h *Host) loadGroups() error {
	lo := append(append([]byte(nil), h.ks.prefix...), tagGroup)
	hi := append(append([]byte(nil), h.ks.prefix...), tagGroup+1)
	it, err := h.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	var ids []GroupID
	for valid := it.First(); valid; {
		g, _, ok := h.ks.parseGroupKey(it.Key())
		if !ok {
			valid = it.Next()
			continue
		}
		ids = append(ids, g)
		valid = it.SeekGE(h.ks.groupEnd(g))
	}
	if err := it.Close(); err != nil {
		return err
	}
	for _, id := range ids {
		v, err := get(h.db, h.ks.groupKey(id, sufMeta))
		if err != nil {
			return err
		}
		if v == nil {
			continue // debris of an interrupted destroy
		}
		rec, err := decodeReplicaRecord(v)
		if err != nil {
			return fmt.Errorf("group %d: %w", id, err)
		}
		if _, err := h.openGroup(id, rec.replica); err != nil {
			return fmt.Errorf("group %d: %w", id, err)
		}
	}
	return nil
}

// Close stops the host: pending requests fail with ErrClosed, and the
// Pebble it opened is closed. Nothing is flushed that was not already
// durable — a closed host is a crashed host, and that is fine.
func (h *Host) Close() error {
	h.inMu.Lock()
	if h.closed {
		h.inMu.Unlock()
		return nil
	}
	h.closed = true
	reqs := h.reqs
	h.reqs, h.inbox = nil, nil
	close(h.closing)
	h.inMu.Unlock()
	h.bgWG.Wait()
	for _, r := range reqs {
		if r.fail != nil {
			r.fail(ErrClosed)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stopped = true
	for _, id := range h.sortedGroups(h.groups) {
		h.groups[id].failPending(ErrClosed)
	}
	h.jnl.close()
	return h.db.Close()
}

// NodeID returns the host's node.
func (h *Host) NodeID() NodeID { return h.cfg.NodeID }

// Err returns the fatal error that stopped the host, if any.
func (h *Host) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// Stats returns the host's counters.
func (h *Host) Stats() Stats {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.stats
	s.AwakeGroups = len(h.awake)
	for _, g := range h.groups {
		s.EntryCacheBytes += g.st.cache.bytes
	}
	h.inMu.Lock()
	s.InboxOverflow = h.dropped
	h.inMu.Unlock()
	return s
}

// Run drives the host until ctx ends or the host is closed or fails: a
// tick every TickInterval, and a round whenever work arrives.
func (h *Host) Run(ctx context.Context) error {
	t := time.NewTicker(h.cfg.TickInterval)
	defer t.Stop()
	// due wakes the loop when deferred appends are due (deferappend.go).
	due := time.NewTimer(time.Hour)
	due.Stop()
	defer due.Stop()
	armed := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-h.closing:
			return nil
		case <-t.C:
			h.Tick()
		case <-h.wake:
		case <-due.C:
			armed = false
			if d, ok := h.nextDeferredRelease(); !ok || d > 0 {
				// A round released them, or released the older ones.
				if ok {
					due.Reset(d)
					armed = true
				}
				continue
			}
		}
		h.Round()
		if err := h.Err(); err != nil {
			return err
		}
		// While work flows, the next round (a proposal, an answer) releases
		// what is due; the timer, set later, only catches an idle host.
		if d, ok := h.nextDeferredRelease(); ok && !armed {
			due.Reset(d + h.cfg.DeferAppends)
			armed = true
		}
	}
}

// Tick queues one tick of the logical clock for the next round.
func (h *Host) Tick() {
	h.inMu.Lock()
	h.ticks++
	h.inMu.Unlock()
	h.signal()
}

// Deliver hands the host a batch received from node from. It never
// blocks; the next round processes it.
func (h *Host) Deliver(from NodeID, b *Batch) {
	if b.From == 0 {
		b.From = from
	}
	h.inMu.Lock()
	if h.closed {
		h.inMu.Unlock()
		return
	}
	if len(h.inbox) >= h.cfg.MaxInbox {
		h.dropped++
		h.inMu.Unlock()
		return
	}
	h.inbox = append(h.inbox, b)
	h.inMu.Unlock()
	h.signal()
}

func (h *Host) signal() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// enqueue queues work for the loop; if the host is closed, fail runs now.
func (h *Host) enqueue(r request) {
	h.inMu.Lock()
	if h.closed {
		h.inMu.Unlock()
		if r.fail != nil {
			r.fail(ErrClosed)
		}
		return
	}
	h.reqs = append(h.reqs, r)
	h.inMu.Unlock()
	h.signal()
}

// Round processes everything queued since the last round: inbound
// batches, requests and ticks; then it handles the Readies of every group
// with work (persisting all of them in one synced batch, sending, applying,
// advancing) and sends one batch per destination node. Run calls it; a
// deterministic test calls it directly (never both).
func (h *Host) Round() {
	h.inMu.Lock()
	if h.closed {
		h.inMu.Unlock()
		return
	}
	inbox, reqs, ticks := h.inbox, h.reqs, h.ticks
	h.inbox, h.reqs, h.ticks = nil, nil, 0
	h.inMu.Unlock()

	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err != nil || h.stopped {
		err := h.err
		if h.stopped {
			err = ErrClosed
		}
		for _, r := range reqs {
			if r.fail != nil {
				r.fail(err)
			}
		}
		return
	}
	h.stats.Rounds++
	for _, b := range inbox {
		h.receive(b)
	}
	for _, r := range reqs {
		r.run()
	}
	for range ticks {
		h.tickOnce()
	}
	h.handleReadies()
	clear(h.noticed)
	h.afterRound()
	h.checkHandOff(ticks > 0)
	if ticks > 0 && h.err == nil {
		h.relieveJournal()
	}
	h.releaseDeferred(false)
	h.flush()
	if h.err == nil && h.pendingReady() {
		h.signal()
	}
}

// pendingReady reports whether a group still has a Ready (the round hit
// its iteration cap).
func (h *Host) pendingReady() bool {
	for _, g := range h.dirty {
		if g.rn != nil && g.rn.HasReady() {
			return true
		}
	}
	return false
}

// maxReadyIterations caps the Ready cycles of one round: after Advance a
// group often has more (a leader's own acknowledgement commits entries);
// the rest waits for the next round.
const maxReadyIterations = 4

// maxCommittedSizePerReady bounds the committed entries of one Ready.
const maxCommittedSizePerReady = 16 << 20

// handleReadies follows the Ready contract for every group with work, all
// groups together so that one synced Pebble commit covers them all:
//
//  1. collect a Ready from each group;
//  2. persist every Ready's snapshot, entries and hard state in one batch,
//     synced if any Ready requires it — except that a leader's messages
//     are sent before that sync when they may be (sendsEarly), so that
//     its followers write to their disks while it writes to its own;
//  3. send: queue every (other) Ready's messages into the per-node outbox;
//  4. apply: restore snapshots, apply committed entries (ApplyConfChange
//     for configuration changes), serve read states;
//  5. Advance every group.
func (h *Host) handleReadies() {
	type ready struct {
		g  *group
		rd raft.Ready
		// persist: the Ready's commit index must be made durable
		// (commitMustPersist), judged once, before stage changes what
		// it depends on.
		persist bool
	}
	for range maxReadyIterations {
		var rds []ready
		for _, id := range h.sortedGroups(h.dirty) {
			g := h.dirty[id]
			if g.rn == nil || !g.rn.HasReady() {
				delete(h.dirty, id)
				continue
			}
			rd := g.rn.Ready()
			rds = append(rds, ready{g: g, rd: rd, persist: g.st.commitMustPersist(&rd)})
		}
		if len(rds) == 0 {
			return
		}
		// 2a. A leader's messages go out now, before the sync (see
		// sendsEarly and the package documentation).
		early := make([]bool, len(rds))
		anyEarly := false
		for i := range rds {
			if early[i] = sendsEarly(rds[i].g, &rds[i].rd, rds[i].persist); early[i] {
				h.route(rds[i].g, rds[i].rd.Messages, noticeHolder(rds[i].g, &rds[i].rd), h.spareFollowers(rds[i].g, &rds[i].rd))
				anyEarly = true
			}
		}
		if anyEarly {
			h.flush()
		}
		// 2a'. Entries already durable here and committed are applied
		// before this Ready's own writes are synced (appliesEarly): their
		// proposers need not wait for the sync of the entries proposed
		// after theirs.
		applied := make([]bool, len(rds))
		for i := range rds {
			if applied[i] = appliesEarly(rds[i].g, &rds[i].rd); applied[i] {
				rds[i].g.apply(&rds[i].rd)
				h.stats.EarlyApplies++
			}
		}
		// 2b. Persist, into a batch sized for the entries (a growing batch
		// copies them again each time it doubles).
		size := 0
		for i := range rds {
			for _, e := range rds[i].rd.Entries {
				size += proto.Size(e) + 64
			}
		}
		b := h.db.NewBatchWithSize(size + 1024)
		sync := false
		commits := make([]func(), 0, len(rds))
		for i := range rds {
			c, err := rds[i].g.st.stage(b, &rds[i].rd, rds[i].persist)
			if err != nil {
				b.Close()
				h.fail(fmt.Errorf("group %d: stage ready: %w", rds[i].g.id, err))
				return
			}
			commits = append(commits, c)
			sync = sync || rds[i].rd.MustSync || !raft.IsEmptySnap(rds[i].rd.Snapshot) || rds[i].persist
		}
		if !b.Empty() {
			if sync {
				h.stats.Syncs++
			}
			if err := h.commit(b, sync); err != nil {
				b.Close()
				h.fail(fmt.Errorf("persist ready: %w", err))
				return
			}
		}
		b.Close()
		for _, c := range commits {
			c()
		}
		// 3. Send (into the outbox, flushed at the end of the round).
		for i := range rds {
			if !early[i] {
				h.route(rds[i].g, rds[i].rd.Messages, noticeHolder(rds[i].g, &rds[i].rd), h.spareFollowers(rds[i].g, &rds[i].rd))
			}
		}
		// 4. Apply.
		for i := range rds {
			if !applied[i] {
				rds[i].g.apply(&rds[i].rd)
			}
		}
		// 5. Advance.
		for i := range rds {
			rds[i].g.rn.Advance(rds[i].rd)
		}
	}
}

// sendsEarly reports whether a Ready's messages may be sent before its
// entries and hard state are durable: the Ready must need a sync (or there
// is nothing to gain), come from a leader that stays leader, and change
// neither the term nor the vote (only the commit index, which a restarted
// leader learns again from its quorum — unless it covers a configuration
// change: persist, see commitMustPersist). Etcd raft allows sending while the
// same Ready's entries are being persisted (its documentation, and the Raft
// thesis §10.2.1): the leader's own acknowledgement of its entries reaches
// raft only at Advance, after the sync, so an entry still commits only
// once a quorum has it on disk, whether or not the leader is in it.
// Snapshots are left to the normal path (flush reports them to raft).
func sendsEarly(g *group, rd *raft.Ready, persist bool) bool {
	if !rd.MustSync || len(rd.Messages) == 0 || !raft.IsEmptySnap(rd.Snapshot) || persist {
		return false
	}
	if st := rd.SoftState; st != nil && st.RaftState != raft.StateLeader {
		return false
	}
	if g.rn.BasicStatus().RaftState != raft.StateLeader {
		return false
	}
	if hs := rd.HardState; !raft.IsEmptyHardState(hs) {
		old := g.st.hs
		if old == nil || hs.GetTerm() != old.GetTerm() || hs.GetVote() != old.GetVote() {
			return false
		}
	}
	for _, m := range rd.Messages {
		if m.GetType() == pb.MsgSnap {
			return false
		}
	}
	return true
}

// appliesEarly reports whether a Ready's committed entries may be applied
// before its entries and hard state are persisted: it must need a sync
// (or there is nothing to gain), hold no snapshot, no configuration
// change among its committed entries (raft's configuration then changes
// only after the Ready's writes, as before), and commit only entries this
// replica has already made durable. Committed entries are on a quorum's
// disks, so their results may be given out whatever becomes of this
// Ready's writes; etcd's server applies them concurrently with its WAL
// write. Requiring them durable here too keeps what this replica has
// applied within its own log, so a snapshot or a restart never finds the
// state machine ahead of it. A leader gains most: a round that commits
// one batch of proposals also syncs the next, and the first batch's
// proposers no longer wait for that sync.
func appliesEarly(g *group, rd *raft.Ready) bool {
	if !rd.MustSync || len(rd.CommittedEntries) == 0 || !raft.IsEmptySnap(rd.Snapshot) {
		return false
	}
	if rd.CommittedEntries[len(rd.CommittedEntries)-1].GetIndex() > g.st.last {
		return false
	}
	for _, e := range rd.CommittedEntries {
		if t := e.GetType(); t == pb.EntryConfChange || t == pb.EntryConfChangeV2 {
			return false
		}
	}
	return true
}

// fail stops the host after a storage error: nothing more is persisted
// or acknowledged.
func (h *Host) fail(err error) {
	if h.err != nil {
		return
	}
	h.err = err
	h.log.Error("raftgroup host stopped", "err", err)
	for _, id := range h.sortedGroups(h.groups) {
		h.groups[id].failPending(err)
	}
}

// sortedGroups returns the keys of m in order: iteration order decides
// message order, and tests replay only if it is deterministic.
func (h *Host) sortedGroups(m map[GroupID]*group) []GroupID {
	ids := make([]GroupID, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func (h *Host) outbox(n NodeID) *Batch {
	b := h.out[n]
	if b == nil {
		b = &Batch{From: h.cfg.NodeID, Leaving: h.leaving}
		h.out[n] = b
	}
	return b
}

// route queues a group's outbound Raft messages by destination node,
// coalescing plain heartbeats, and holds back the commit notices hold
// allows (nil: none; see lazycommit.go).
func (h *Host) route(g *group, msgs []*pb.Message, hold func(NodeID) bool, spare []ReplicaID) {
	for _, m := range msgs {
		to := ReplicaID(m.GetTo())
		n, ok := g.nodeOf(to)
		if !ok {
			g.rn.ReportUnreachable(uint64(to))
			if m.GetType() == pb.MsgSnap {
				g.rn.ReportSnapshot(uint64(to), raft.SnapshotFailure)
			}
			h.markDirty(g)
			continue
		}
		if m.GetType() == pb.MsgApp {
			// Any append carries the commit index: a held notice is moot.
			delete(h.held, heldKey{g.id, to})
			if h.deferAppend(g, n, m, spare) {
				continue
			}
			if hold != nil && commitNotice(m) && hold(n) {
				h.held[heldKey{g.id, to}] = heldNotice{n: n, msg: m}
				h.stats.NoticesHeld++
				continue
			}
			if hb, ok := noticeHeartbeat(g, m); ok {
				b := h.outbox(n)
				b.Heartbeats = append(b.Heartbeats, hb)
				h.stats.NoticeHeartbeats++
				continue
			}
		}
		if m.GetType() == pb.MsgHeartbeatResp && len(m.GetContext()) == 0 && h.noticed[g.id] > 0 {
			// The answer to a notice heartbeat, which wants none.
			h.noticed[g.id]--
			continue
		}
		var b *Batch
		if m.GetType() != pb.MsgSnap {
			b = h.outbox(n)
		}
		switch {
		case m.GetType() == pb.MsgHeartbeat && len(m.GetContext()) == 0:
			b.Heartbeats = append(b.Heartbeats, Heartbeat{Group: g.id, From: ReplicaID(m.GetFrom()), To: to, Term: m.GetTerm(), Commit: m.GetCommit()})
		case m.GetType() == pb.MsgHeartbeatResp && len(m.GetContext()) == 0:
			b.HeartbeatResps = append(b.HeartbeatResps, Heartbeat{Group: g.id, From: ReplicaID(m.GetFrom()), To: to, Term: m.GetTerm()})
		case m.GetType() == pb.MsgSnap:
			// NB: a snapshot travels alone, after the round's batch: it may be
			// large, and must not hold up the heartbeats and appends of other
			// groups (a transport can stream it on its own).
			h.snapsSent = append(h.snapsSent, sentSnap{g: g.id, to: to, n: n, msg: m})
		default:
			b.Messages = append(b.Messages, GroupMessage{Group: g.id, Msg: m})
		}
	}
}

// flush sends the outbox: one batch per destination node, plus liveness
// pings, then reports unreachable replicas and sent snapshots to Raft.
func (h *Host) flush() {
	for n, acks := range h.acks {
		b := h.outbox(n)
		for _, id := range h.sortedGroups(acks) {
			if g := h.groups[id]; g != nil {
				b.Acks = append(b.Acks, ApplyAck{Group: id, Replica: g.replica, Applied: g.applied})
			}
		}
	}
	clear(h.acks)
	nodes := make([]NodeID, 0, len(h.out))
	for n := range h.out {
		nodes = append(nodes, n)
	}
	slices.Sort(nodes)
	failed := map[NodeID]bool{}
	for _, n := range nodes {
		b := h.out[n]
		delete(h.out, n)
		if n == h.cfg.NodeID {
			// Replicas of one group on one node: not a supported layout,
			// but deliver rather than lose.
			h.inMu.Lock()
			h.inbox = append(h.inbox, b)
			h.inMu.Unlock()
			continue
		}
		if p := h.peers[n]; p != nil {
			p.lastSent = h.tick
		}
		h.stats.BatchesSent++
		h.stats.MessagesSent += uint64(len(b.Messages) + len(b.Heartbeats) + len(b.HeartbeatResps))
		h.stats.HeartbeatsSent += uint64(len(b.Heartbeats) + len(b.HeartbeatResps))
		if err := h.cfg.Transport.Send(n, b); err != nil {
			failed[n] = true
			h.reportUnreachable(b)
		}
	}
	for _, s := range h.snapsSent {
		g := h.groups[s.g]
		if g == nil || g.rn == nil {
			continue
		}
		status := raft.SnapshotFinish
		if failed[s.n] {
			status = raft.SnapshotFailure
		} else {
			b := &Batch{From: h.cfg.NodeID, Leaving: h.leaving, Messages: []GroupMessage{{Group: s.g, Msg: s.msg}}}
			h.stats.BatchesSent++
			h.stats.MessagesSent++
			if err := h.cfg.Transport.Send(s.n, b); err != nil {
				status = raft.SnapshotFailure
				g.rn.ReportUnreachable(uint64(s.to))
			}
		}
		// Always report: raft keeps the follower paused until it hears.
		g.rn.ReportSnapshot(uint64(s.to), status)
		if status == raft.SnapshotFinish {
			h.stats.SnapshotsSent++
		}
		h.markDirty(g)
	}
	clear(h.snapsSent)
	h.snapsSent = h.snapsSent[:0]
}

// reportUnreachable tells Raft that the replicas a failed batch was for
// could not be reached.
func (h *Host) reportUnreachable(b *Batch) {
	report := func(gid GroupID, to ReplicaID) {
		g := h.groups[gid]
		if g == nil || g.rn == nil {
			return
		}
		g.rn.ReportUnreachable(uint64(to))
		h.markDirty(g)
	}
	for _, m := range b.Messages {
		report(m.Group, ReplicaID(m.Msg.GetTo()))
	}
	for _, hb := range b.Heartbeats {
		report(hb.Group, hb.To)
	}
	for _, hb := range b.HeartbeatResps {
		report(hb.Group, hb.To)
	}
}

func (h *Host) markDirty(g *group) { h.dirty[g.id] = g }

func (h *Host) peer(n NodeID) *peer {
	p := h.peers[n]
	if p == nil {
		p = &peer{lastHeard: h.tick, lastSent: h.tick}
		h.peers[n] = p
	}
	return p
}

// receive processes an inbound batch.
func (h *Host) receive(b *Batch) {
	from := b.From
	if p := h.peers[from]; p != nil {
		p.lastHeard = h.tick
		p.dead = false
		p.leaving = b.Leaving
	}
	for _, m := range b.Messages {
		h.step(from, m.Group, m.Msg, true)
	}
	for _, hb := range b.Heartbeats {
		m := &pb.Message{
			Type:   pb.MsgHeartbeat.Enum(),
			From:   new(uint64(hb.From)),
			To:     new(uint64(hb.To)),
			Term:   new(hb.Term),
			Commit: new(hb.Commit),
		}
		if hb.Notice {
			h.noticed[hb.Group]++
		}
		if g := h.step(from, hb.Group, m, !hb.Quiesce); g != nil && hb.Quiesce {
			hint := hb
			g.quiesceHint = &hint
			h.attention[g.id] = g
		}
	}
	for _, hb := range b.HeartbeatResps {
		m := &pb.Message{
			Type: pb.MsgHeartbeatResp.Enum(),
			From: new(uint64(hb.From)),
			To:   new(uint64(hb.To)),
			Term: new(hb.Term),
		}
		// NB: a heartbeat response does not wake a quiesced leader: it
		// answers the heartbeat that quiesced the follower.
		h.step(from, hb.Group, m, false)
	}
	for _, a := range b.Acks {
		if g := h.groups[a.Group]; g != nil {
			g.recordAck(a.Replica, a.Applied)
		}
	}
	for _, id := range b.AckQueries {
		if g := h.groups[id]; g != nil && g.initialized() && !g.removed {
			h.queueAck(from, g)
		}
	}
	for _, r := range b.Removed {
		if g := h.groups[r.Group]; g != nil && g.replica == r.Replica && r.From != 0 {
			g.learnRemoved(r.Conf, r.Voters, r.From)
		}
	}
	for _, q := range b.RetireQueries {
		if g := h.groups[q.Group]; g != nil && g.initialized() && !g.removed && g.isRemovedReplica(q.Replica) {
			b := h.outbox(from)
			b.Removed = append(b.Removed, g.removedNotice(q.Replica))
		}
	}
}

// step hands a Raft message to its group; it returns the group if the
// message was stepped.
func (h *Host) step(from NodeID, gid GroupID, m *pb.Message, wake bool) *group {
	g := h.groups[gid]
	if g == nil || g.removed || g.broken != nil || ReplicaID(m.GetTo()) != g.replica {
		h.stats.DroppedInbound++
		return nil
	}
	src := ReplicaID(m.GetFrom())
	if g.isRemovedReplica(src) {
		// A replica the group removed: tell it, and do not let it wake or
		// disturb the group.
		h.stats.DroppedInbound++
		b := h.outbox(from)
		b.Removed = append(b.Removed, g.removedNotice(src))
		return nil
	}
	if _, ok := g.meta.members[src]; !ok {
		g.learned[src] = from
	}
	if wake {
		h.wakeGroup(g)
	}
	if m.GetType() == pb.MsgReadIndex || m.GetType() == pb.MsgProp {
		// A follower that reads or writes wants its log current.
		h.releaseDeferredTo(heldKey{gid, src})
	}
	if m.GetType() == pb.MsgProp {
		g.countProposals(src, len(m.GetEntries()), entryBytes(m))
	}
	if h.refusesLeadership(m) {
		h.stats.DroppedInbound++
		return g
	}
	if err := g.rn.Step(m); err != nil && !errors.Is(err, raft.ErrStepPeerNotFound) && !errors.Is(err, raft.ErrStepLocalMsg) {
		h.log.Debug("step failed", "group", uint64(gid), "type", m.GetType().String(), "err", err)
	}
	if m.GetType() == pb.MsgProp {
		h.followEarly(g, src)
	}
	h.markDirty(g)
	return g
}

// queueAck reports g's applied index to node n this round.
func (h *Host) queueAck(n NodeID, g *group) {
	if n == h.cfg.NodeID {
		return
	}
	m := h.acks[n]
	if m == nil {
		m = map[GroupID]*group{}
		h.acks[n] = m
	}
	m[g.id] = g
}

// newKey returns a proposal key unique to this host's session.
func (h *Host) newKey() string {
	h.seq++
	var b [16]byte
	binary.BigEndian.PutUint64(b[:], h.session)
	binary.BigEndian.PutUint64(b[8:], h.seq)
	return string(b[:])
}

// raftConfig returns the RawNode configuration of replica id.
func (h *Host) raftConfig(id ReplicaID, st *groupStorage, applied uint64) *raft.Config {
	return &raft.Config{
		ID:            uint64(id),
		ElectionTick:  h.cfg.ElectionTicks,
		HeartbeatTick: h.cfg.HeartbeatTicks,
		Storage:       st,
		Applied:       applied,
		MaxSizePerMsg: h.cfg.MaxSizePerMsg,
		// Committed entries come from the entry cache; more of them per
		// Ready means fewer rounds when large writes are pipelined.
		MaxCommittedSizePerReady:  maxCommittedSizePerReady,
		MaxInflightMsgs:           h.cfg.MaxInflightMsgs,
		MaxUncommittedEntriesSize: h.cfg.MaxUncommittedBytes,
		CheckQuorum:               true,
		PreVote:                   true,
		StepDownOnRemoval:         true,
		Logger:                    h.rlog,
	}
}

// pebbleOptions tunes store.PebbleOptions for a Raft log: values are
// mostly entries written once, read back soon (to apply, or to send to a
// follower) and deleted by a range deletion when the log is truncated.
//
//   - Entries at least valueSeparationMin long go to blob files when the
//     memtable is flushed, and compactions move only their references: a
//     1 MiB write is written twice (WAL, blob file) instead of once more
//     per level it passes through. Blob files die whole once truncation
//     has deleted every entry in them.
//   - No block compression: entries are file data or application
//     payloads, often incompressible, and compressing them cost more CPU
//     than the disk time it saved.
//   - No WAL: the host's journal is its write-ahead log (journal.go), and
//     replays into Pebble what a crash took from its memtables.
func pebbleOptions(log pebble.Logger) *pebble.Options {
	o := store.PebbleOptions(log)
	o.DisableWAL = true
	o.ApplyCompressionSettings(func() pebble.DBCompressionSettings { return pebble.DBCompressionNone })
	o.Experimental.ValueSeparationPolicy = func() pebble.ValueSeparationPolicy {
		return pebble.ValueSeparationPolicy{
			Enabled:               true,
			MinimumSize:           valueSeparationMin,
			MaxBlobReferenceDepth: 10,
			RewriteMinimumAge:     5 * time.Minute,
			TargetGarbageRatio:    0.2,
		}
	}
	return o
}

// valueSeparationMin is the smallest value stored in a blob file.
const valueSeparationMin = 16 << 10

// pebbleLogger sends Pebble's messages to slog.
type pebbleLogger struct{ log *slog.Logger }

func (l pebbleLogger) Infof(format string, args ...any) { l.log.Debug(fmt.Sprintf(format, args...)) }
func (l pebbleLogger) Errorf(format string, args ...any) {
	l.log.Error(fmt.Sprintf(format, args...))
}
func (l pebbleLogger) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}

// raftLogger sends Raft's messages to slog (Raft is chatty: its info is
// our debug).
type raftLogger struct{ log *slog.Logger }

func (l raftLogger) Debug(v ...any)                 { l.log.Debug(fmt.Sprint(v...)) }
func (l raftLogger) Debugf(format string, v ...any) { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l raftLogger) Info(v ...any)                  { l.log.Debug(fmt.Sprint(v...)) }
func (l raftLogger) Infof(format string, v ...any)  { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l raftLogger) Warning(v ...any)               { l.log.Warn(fmt.Sprint(v...)) }
func (l raftLogger) Warningf(format string, v ...any) {
	l.log.Warn(fmt.Sprintf(format, v...))
}
func (l raftLogger) Error(v ...any)                 { l.log.Error(fmt.Sprint(v...)) }
func (l raftLogger) Errorf(format string, v ...any) { l.log.Error(fmt.Sprintf(format, v...)) }
func (l raftLogger) Fatal(v ...any)                 { panic(fmt.Sprint(v...)) }
func (l raftLogger) Fatalf(format string, v ...any) { panic(fmt.Sprintf(format, v...)) }
func (l raftLogger) Panic(v ...any)                 { panic(fmt.Sprint(v...)) }
func (l raftLogger) Panicf(format string, v ...any) { panic(fmt.Sprintf(format, v...)) }
