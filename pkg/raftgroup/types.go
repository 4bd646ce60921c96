package raftgroup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/containerd/errdefs"
)

// NodeID names a host (a vold process). The transport addresses nodes.
type NodeID uint64

// GroupID names a Raft group (one per volume, or per state machine).
type GroupID uint64

// ReplicaID is a member's Raft ID inside one group. Replica IDs are never
// reused within a group: a node removed from a group and added back gets a
// new replica ID, so stale messages and state of the old replica can never
// be mistaken for the new one's.
type ReplicaID uint64

// Member places a replica of a group on a node.
type Member struct {
	Replica ReplicaID
	Node    NodeID
}

// ChangeType is a kind of membership change.
type ChangeType int

const (
	// AddVoter adds a voting replica (or promotes a learner).
	AddVoter ChangeType = iota
	// AddLearner adds a non-voting replica (or demotes a voter).
	AddLearner
	// RemoveReplica removes a replica.
	RemoveReplica
)

func (t ChangeType) String() string {
	switch t {
	case AddVoter:
		return "add-voter"
	case AddLearner:
		return "add-learner"
	case RemoveReplica:
		return "remove"
	}
	return fmt.Sprintf("change(%d)", int(t))
}

// Change is one membership change. Node is required when adding.
type Change struct {
	Type    ChangeType
	Replica ReplicaID
	Node    NodeID
}

// Replace returns the changes that swap replica old for a new replica on
// node: applied together they go through a joint configuration, so the
// group never drops to an even number of voters.
func Replace(old, replacement ReplicaID, node NodeID) []Change {
	return []Change{
		{Type: AddVoter, Replica: replacement, Node: node},
		{Type: RemoveReplica, Replica: old},
	}
}

// Entry is a committed log entry handed to a StateMachine.
type Entry struct {
	// Index is the entry's log index: unique, strictly increasing.
	Index uint64
	// Term is the leader term the entry was proposed in.
	Term uint64
	// Time is the group clock at this entry: the greatest proposer wall time
	// recorded in any entry so far. It is the same on every replica and never
	// goes backwards, so state machines decide time-dependent things (lease
	// expiry) with it, never with their local clock.
	Time time.Time
	// Data is the proposed payload.
	Data []byte
}

// StateMachine is a group's replicated state machine. The host calls it
// from its loop goroutine only, in log order, the same on every replica;
// methods must be deterministic functions of the entries (no local clock,
// randomness or I/O whose outcome can differ between replicas). Reads from
// other goroutines (after a ReadIndex) need the state machine's own locking.
type StateMachine interface {
	// Apply applies committed entries in order and returns one result per
	// entry (nil is fine); the result is handed to the proposer. An error is
	// fatal for the group (it stops applying: the state machine is assumed
	// corrupt), so report per-command failures in the results instead.
	// The entries' data is the state machine's to keep: the host never
	// changes or reuses it after handing it over.
	Apply(entries []Entry) ([][]byte, error)
	// Snapshot serialises the whole state as of the last applied entry.
	Snapshot() ([]byte, error)
	// Restore replaces the whole state with a snapshot's.
	Restore(data []byte) error
}

// SnapshotAppender is a StateMachine that can append its snapshot (what
// Snapshot returns) to a buffer. The host uses it when it can: a large
// state is then copied once, into the buffer the host stores, not a second
// time behind the host's own header.
type SnapshotAppender interface {
	AppendSnapshot(dst []byte) ([]byte, error)
}

// SnapshotWriter is a StateMachine that can write its snapshot (what
// Snapshot returns) to a writer. When the host stores a snapshot of its
// own accord (log compaction) it then writes the state straight into its
// journal: no buffer of the whole state is allocated, zeroed and copied,
// which for a large state is most of the time the Raft loop spends on
// it. WriteSnapshot is called twice for one snapshot (the first time to
// size and checksum it) with no Apply between, and must write the same
// bytes both times; errors come only from w.
type SnapshotWriter interface {
	WriteSnapshot(w io.Writer) error
}

// SnapshotForker is a StateMachine that can fork its state cheaply:
// ForkSnapshot returns a frozen copy whose WriteSnapshot writes the
// snapshot as of the fork, from another goroutine, while the host goes on
// applying entries to the machine. With Config.BackgroundSnapshots the
// host writes the snapshots it takes of its own accord (log compaction)
// of such a machine off its loop, which no longer stalls every group of
// the node for as long as a large state takes to write.
type SnapshotForker interface {
	StateMachine
	SnapshotWriter
	ForkSnapshot() (SnapshotWriter, error)
}

// Result is the outcome of an applied proposal.
type Result struct {
	// Index is the log index the proposal was applied at.
	Index uint64
	// Data is what the state machine returned for it.
	Data []byte
}

// Proposal is a command for a group's state machine.
type Proposal struct {
	// Data is the payload handed to StateMachine.Apply.
	Data []byte
	// Key makes the proposal idempotent: of all proposals with the same key
	// applied within the deduplication window, only the first reaches the
	// state machine and later ones get its result. Empty: the host generates
	// a unique key (its own retries of a dropped proposal reuse it). Clients
	// that retry across connections or host restarts pass their own.
	Key string
	// WaitQuorum makes the future resolve only once a quorum of the group's
	// voters has applied the entry (not just the proposing replica).
	WaitQuorum bool
}

var (
	// ErrClosed is returned once the host is closed.
	ErrClosed = fmt.Errorf("raftgroup: host closed: %w", errdefs.ErrUnavailable)
	// ErrGroupNotFound is returned for a group this host does not hold.
	ErrGroupNotFound = fmt.Errorf("raftgroup: group not found: %w", errdefs.ErrNotFound)
	// ErrGroupExists is returned when creating a group the host already holds.
	ErrGroupExists = fmt.Errorf("raftgroup: group exists: %w", errdefs.ErrAlreadyExists)
	// ErrRemoved is returned for requests on a replica removed from its group.
	ErrRemoved = fmt.Errorf("raftgroup: replica removed from group: %w", errdefs.ErrFailedPrecondition)
	// ErrCanceled resolves a future given up with Cancel.
	ErrCanceled = errors.New("raftgroup: canceled")
	// ErrReplicaIDReused is returned for a membership change that would add
	// a replica ID the group has used before.
	ErrReplicaIDReused = fmt.Errorf("raftgroup: replica ID used before in this group: %w", errdefs.ErrInvalidArgument)
	// ErrInvalidChange is returned for a membership change Raft would refuse.
	ErrInvalidChange = fmt.Errorf("raftgroup: invalid membership change: %w", errdefs.ErrInvalidArgument)
	// ErrGroupBroken is returned once a group's state machine failed.
	ErrGroupBroken = fmt.Errorf("raftgroup: state machine failed: %w", errdefs.ErrUnavailable)
)

// Future is the pending outcome of an asynchronous request. The host
// resolves it from its loop; Wait blocks a caller until then.
type Future[T any] struct {
	done chan struct{}

	mu        sync.Mutex
	resolved  bool
	val       T
	err       error
	callbacks []func()
	cancel    func()
}

func newFuture[T any]() *Future[T] { return &Future[T]{done: make(chan struct{})} }

// Done is closed once the future is resolved.
func (f *Future[T]) Done() <-chan struct{} { return f.done }

// Result returns the outcome; it blocks until the future is resolved.
func (f *Future[T]) Result() (T, error) {
	<-f.done
	return f.val, f.err
}

// Wait waits for the outcome or ctx. When ctx ends first the request is
// abandoned (see Cancel) and ctx's error returned.
func (f *Future[T]) Wait(ctx context.Context) (T, error) {
	select {
	case <-f.done:
		return f.val, f.err
	case <-ctx.Done():
		f.Cancel()
		var zero T
		return zero, ctx.Err()
	}
}

// Cancel gives up on the request: the host stops retrying it and the
// future resolves with ErrCanceled. A proposal may still be applied.
func (f *Future[T]) Cancel() {
	f.mu.Lock()
	c := f.cancel
	f.mu.Unlock()
	if c != nil {
		c()
	}
	var zero T
	f.resolve(zero, ErrCanceled)
}

// resolve sets the outcome once; later calls are ignored.
func (f *Future[T]) resolve(v T, err error) bool {
	f.mu.Lock()
	if f.resolved {
		f.mu.Unlock()
		return false
	}
	f.resolved = true
	f.val, f.err = v, err
	cbs := f.callbacks
	f.callbacks = nil
	f.mu.Unlock()
	close(f.done)
	for _, cb := range cbs {
		cb()
	}
	return true
}

func (f *Future[T]) setCancel(c func()) {
	f.mu.Lock()
	f.cancel = c
	f.mu.Unlock()
}

// onDone runs cb once the future is resolved (at once if it is).
func (f *Future[T]) onDone(cb func()) {
	f.mu.Lock()
	if !f.resolved {
		f.callbacks = append(f.callbacks, cb)
		f.mu.Unlock()
		return
	}
	f.mu.Unlock()
	cb()
}

// thenMap derives a future whose value is fn of src's; cancelling it
// cancels src.
func thenMap[S, T any](src *Future[S], fn func(S) (T, error)) *Future[T] {
	dst := newFuture[T]()
	dst.setCancel(src.Cancel)
	src.onDone(func() {
		v, err := src.val, src.err
		if err != nil {
			var zero T
			dst.resolve(zero, err)
			return
		}
		dst.resolve(fn(v))
	})
	return dst
}
