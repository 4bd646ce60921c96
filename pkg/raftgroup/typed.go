package raftgroup

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
)

// The typed state-machine API: messages are Go values registered by type
// (protobuf messages are encoded as protobuf, anything else as JSON);
// Set proposes one and returns once a quorum of the group applied it;
// appliers registered with Use see every applied message, in log order,
// on every replica.

// Command is an applied message handed to an Applier.
type Command struct {
	// Index is the entry's log index (unique, increasing).
	Index uint64
	// Time is the group clock at the entry (see Entry.Time).
	Time time.Time
	// Msg is a pointer to a fresh value of the registered type.
	Msg any
}

// Applier is a state machine driven by typed messages. Apply must be
// deterministic; it ignores message types it does not handle and returns
// a result for the proposer (nil is fine; an error value is reported to
// the proposer as an error, but does not affect the log — it is already
// written). Appliers that hold state implement Snapshotter too, or they
// miss the state a snapshot carries.
type Applier interface {
	Apply(c Command) any
}

// Snapshotter is implemented by appliers that hold state. Restore(nil)
// resets to the empty state.
type Snapshotter interface {
	Snapshot() ([]byte, error)
	Restore(data []byte) error
}

// ForkingSnapshotter is a Snapshotter that can freeze its state cheaply:
// ForkSnapshot, called on the Raft loop, returns a function that later
// returns, from another goroutine and while Apply goes on, what Snapshot
// would have returned at the fork. With Config.BackgroundSnapshots, a
// Typed machine whose stateful appliers all fork is snapshotted off the
// loop (see SnapshotForker); an applier that does not fork is snapshotted
// on the loop at the fork, the rest of the snapshot off it.
type ForkingSnapshotter interface {
	Snapshotter
	ForkSnapshot() (func() ([]byte, error), error)
}

// ApplierFunc adapts a function to a stateless Applier.
type ApplierFunc func(c Command) any

// Apply implements Applier.
func (f ApplierFunc) Apply(c Command) any { return f(c) }

// Registry maps message types to names (the names are in the log: keep
// them stable, and register the same types on every host).
type Registry struct {
	mu     sync.RWMutex
	byName map[string]reflect.Type
	byType map[reflect.Type]string
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{byName: map[string]reflect.Type{}, byType: map[reflect.Type]string{}}
}

// Register registers message types under their protobuf full name or their
// Go package path and type name.
func (r *Registry) Register(msgs ...any) error {
	for _, m := range msgs {
		t := elemType(m)
		name := t.PkgPath() + "." + t.Name()
		if pm, ok := m.(proto.Message); ok {
			name = string(pm.ProtoReflect().Descriptor().FullName())
		}
		if err := r.RegisterName(name, m); err != nil {
			return err
		}
	}
	return nil
}

// RegisterName registers msg's type under name.
func (r *Registry) RegisterName(name string, msg any) error {
	t := elemType(msg)
	if t == nil || name == "" {
		return errors.New("raftgroup: register: need a named type")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if old, ok := r.byName[name]; ok && old != t {
		return fmt.Errorf("raftgroup: message name %q registered for %v", name, old)
	}
	r.byName[name] = t
	r.byType[t] = name
	return nil
}

func elemType(v any) reflect.Type {
	t := reflect.TypeOf(v)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

func (r *Registry) encode(v any) (string, []byte, error) {
	r.mu.RLock()
	name, ok := r.byType[elemType(v)]
	r.mu.RUnlock()
	if !ok {
		return "", nil, fmt.Errorf("raftgroup: message type %T not registered", v)
	}
	if pm, ok := v.(proto.Message); ok {
		b, err := proto.Marshal(pm)
		return name, b, err
	}
	b, err := json.Marshal(v)
	return name, b, err
}

func (r *Registry) decode(name string, data []byte) (any, error) {
	r.mu.RLock()
	t, ok := r.byName[name]
	r.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("raftgroup: message type %q not registered", name)
	}
	v := reflect.New(t).Interface()
	if pm, ok := v.(proto.Message); ok {
		return v, proto.Unmarshal(data, pm)
	}
	return v, json.Unmarshal(data, v)
}

// Typed is a StateMachine that decodes typed messages and hands them to
// its appliers. It also holds the group's locks (see AcquireLock).
type Typed struct {
	reg *Registry

	// mu guards the appliers list and the lock table against readers on
	// other goroutines; the loop holds it while applying.
	mu       sync.RWMutex
	appliers []Applier
	locks    *lockTable
	// written is the snapshot WriteSnapshot last wrote, until the next
	// Apply or Restore: the host calls it twice for one snapshot, which
	// must give the same bytes, and this builds them once.
	written []byte
}

// NewTyped returns a typed state machine over reg (nil: a new registry).
func NewTyped(reg *Registry) *Typed {
	if reg == nil {
		reg = NewRegistry()
	}
	for name, m := range map[string]any{
		"raftgroup.LockAcquire": lockAcquire{},
		"raftgroup.LockRenew":   lockRenew{},
		"raftgroup.LockRelease": lockRelease{},
	} {
		_ = reg.RegisterName(name, m)
	}
	return &Typed{reg: reg, locks: newLockTable()}
}

// Registry returns the registry the state machine decodes with.
func (t *Typed) Registry() *Registry { return t.reg }

// Use adds an applier. Register appliers before the group starts (in
// Config.NewStateMachine): a replica must not miss entries.
func (t *Typed) Use(a Applier) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.appliers = append(t.appliers, a)
}

// Typed entry payloads.
const (
	typedMsg    = 1
	typedFenced = 2
)

// Typed results.
const (
	resultOK     = 0
	resultErr    = 1
	resultFenced = 2
)

func encodeTyped(name string, payload []byte) []byte {
	b := []byte{typedMsg}
	b = appendBytes(b, []byte(name))
	return append(b, payload...)
}

func encodeFenced(lock string, token uint64, name string, payload []byte) []byte {
	b := []byte{typedFenced}
	b = appendBytes(b, []byte(lock))
	b = binary.AppendUvarint(b, token)
	b = appendBytes(b, []byte(name))
	return append(b, payload...)
}

// Apply implements StateMachine.
func (t *Typed) Apply(entries []Entry) ([][]byte, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.written = nil
	out := make([][]byte, len(entries))
	for i, e := range entries {
		out[i] = t.applyOne(e)
	}
	return out, nil
}

func (t *Typed) applyOne(e Entry) []byte {
	r := reader{b: e.Data}
	kind := r.byte()
	var (
		lock  string
		token uint64
	)
	if kind == typedFenced {
		lock = string(r.bytes())
		token = r.uvarint()
	}
	name := string(r.bytes())
	if r.err != nil || (kind != typedMsg && kind != typedFenced) {
		return errorResult(resultErr, "malformed typed entry")
	}
	if kind == typedFenced && !t.locks.valid(lock, token, e.Time) {
		return errorResult(resultFenced, fmt.Sprintf("lock %q token %d is not the current lease", lock, token))
	}
	msg, err := t.reg.decode(name, r.b)
	if err != nil {
		return errorResult(resultErr, err.Error())
	}
	cmd := Command{Index: e.Index, Time: e.Time, Msg: msg}
	if res, ok := t.locks.apply(cmd); ok {
		return okResult(res)
	}
	var res any
	for _, a := range t.appliers {
		if v := a.Apply(cmd); v != nil && res == nil {
			res = v
		}
	}
	if err, ok := res.(error); ok {
		return errorResult(resultErr, err.Error())
	}
	return okResult(res)
}

func okResult(v any) []byte {
	if v == nil {
		return []byte{resultOK}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return errorResult(resultErr, "result: "+err.Error())
	}
	return append([]byte{resultOK}, b...)
}

func errorResult(code byte, msg string) []byte { return append([]byte{code}, msg...) }

// ErrFenced is returned for a fenced message whose lease is not (or no
// longer) the lock's current one: its holder lost the lock.
var ErrFenced = errors.New("raftgroup: fenced: lease superseded or expired")

// ApplyError is an error an applier returned for a message.
type ApplyError struct{ Msg string }

func (e *ApplyError) Error() string { return "raftgroup: apply: " + e.Msg }

// decodeResult turns a typed result into out (JSON) or an error.
func decodeResult(data []byte, out any) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case resultOK:
		if out != nil && len(data) > 1 {
			return json.Unmarshal(data[1:], out)
		}
		return nil
	case resultFenced:
		return fmt.Errorf("%w: %s", ErrFenced, data[1:])
	default:
		return &ApplyError{Msg: string(data[1:])}
	}
}

// Snapshot implements StateMachine: the lock table, then each applier's
// snapshot (empty for appliers that are not Snapshotters).
func (t *Typed) Snapshot() ([]byte, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.snapshotLocked()
}

func (t *Typed) snapshotLocked() ([]byte, error) {
	locks, err := t.locks.snapshot()
	if err != nil {
		return nil, err
	}
	parts := make([][]byte, len(t.appliers))
	for i, a := range t.appliers {
		if s, ok := a.(Snapshotter); ok {
			if parts[i], err = s.Snapshot(); err != nil {
				return nil, err
			}
		}
	}
	return encodeTypedSnapshot(locks, parts), nil
}

func encodeTypedSnapshot(locks []byte, parts [][]byte) []byte {
	n := len(locks) + 2*binary.MaxVarintLen64
	for _, p := range parts {
		n += len(p) + binary.MaxVarintLen64
	}
	b := make([]byte, 0, n)
	b = append(b, 1)
	b = appendBytes(b, locks)
	b = binary.AppendUvarint(b, uint64(len(parts)))
	for _, p := range parts {
		b = appendBytes(b, p)
	}
	return b
}

// WriteSnapshot implements SnapshotWriter (what Snapshot returns).
func (t *Typed) WriteSnapshot(w io.Writer) error {
	t.mu.Lock()
	if t.written == nil {
		b, err := t.snapshotLocked()
		if err != nil {
			t.mu.Unlock()
			return err
		}
		t.written = b
	}
	b := t.written
	t.mu.Unlock()
	_, err := w.Write(b)
	return err
}

// ForkSnapshot implements SnapshotForker: the lock table is encoded now
// (it is small), each ForkingSnapshotter applier forked, and any other
// Snapshotter's snapshot taken now.
func (t *Typed) ForkSnapshot() (SnapshotWriter, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	locks, err := t.locks.snapshot()
	if err != nil {
		return nil, err
	}
	f := &typedFork{locks: locks, parts: make([]func() ([]byte, error), len(t.appliers))}
	for i, a := range t.appliers {
		switch s := a.(type) {
		case ForkingSnapshotter:
			if f.parts[i], err = s.ForkSnapshot(); err != nil {
				return nil, err
			}
		case Snapshotter:
			data, err := s.Snapshot()
			if err != nil {
				return nil, err
			}
			f.parts[i] = func() ([]byte, error) { return data, nil }
		}
	}
	return f, nil
}

var _ SnapshotForker = (*Typed)(nil)

// typedFork is a Typed machine's snapshot as of a fork.
type typedFork struct {
	locks []byte
	parts []func() ([]byte, error) // nil for appliers without state
	once  sync.Once
	b     []byte
	err   error
}

// WriteSnapshot implements SnapshotWriter; the snapshot is built once.
func (f *typedFork) WriteSnapshot(w io.Writer) error {
	f.once.Do(func() {
		parts := make([][]byte, len(f.parts))
		for i, p := range f.parts {
			if p != nil {
				if parts[i], f.err = p(); f.err != nil {
					return
				}
			}
		}
		f.b = encodeTypedSnapshot(f.locks, parts)
		f.parts = nil
	})
	if f.err != nil {
		return f.err
	}
	_, err := w.Write(f.b)
	return err
}

// Restore implements StateMachine.
func (t *Typed) Restore(data []byte) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.written = nil
	if data == nil {
		t.locks = newLockTable()
		for _, a := range t.appliers {
			if s, ok := a.(Snapshotter); ok {
				if err := s.Restore(nil); err != nil {
					return err
				}
			}
		}
		return nil
	}
	r := reader{b: data}
	if v := r.byte(); r.err == nil && v != 1 {
		return fmt.Errorf("raftgroup: typed snapshot format %d", v)
	}
	locks := r.bytes()
	n := r.uvarint()
	if r.err != nil {
		return fmt.Errorf("raftgroup: typed snapshot: %w", r.err)
	}
	if n != uint64(len(t.appliers)) {
		return fmt.Errorf("raftgroup: typed snapshot has %d appliers, this host %d", n, len(t.appliers))
	}
	lt, err := restoreLockTable(locks)
	if err != nil {
		return err
	}
	t.locks = lt
	for _, a := range t.appliers {
		part := r.bytes()
		if r.err != nil {
			return fmt.Errorf("raftgroup: typed snapshot: %w", r.err)
		}
		if s, ok := a.(Snapshotter); ok {
			if err := s.Restore(append([]byte(nil), part...)); err != nil {
				return err
			}
		}
	}
	return nil
}

// ErrNotTyped is returned by the typed API on a group whose state machine
// is not a *Typed.
var ErrNotTyped = errors.New("raftgroup: group state machine is not typed")

// submitTyped encodes msg with the group's registry on the loop and
// proposes it.
func (h *Host) submitTyped(id GroupID, msg any, fence *Lease, quorum bool) *Future[Result] {
	fut := newFuture[Result]()
	now := h.cfg.Now().UnixNano()
	h.enqueue(request{
		run: func() {
			if fut.isResolved() {
				return
			}
			g, err := h.liveGroup(id)
			if err != nil {
				fut.resolve(Result{}, err)
				return
			}
			t, ok := g.fsm.(*Typed)
			if !ok {
				fut.resolve(Result{}, ErrNotTyped)
				return
			}
			name, payload, err := t.reg.encode(msg)
			if err != nil {
				fut.resolve(Result{}, err)
				return
			}
			data := encodeTyped(name, payload)
			if fence != nil {
				data = encodeFenced(fence.Name, fence.Token, name, payload)
			}
			h.startProposal(id, Proposal{Data: data, WaitQuorum: quorum}, now, fut)
		},
		fail: func(err error) { fut.resolve(Result{}, err) },
	})
	return fut
}

// Set proposes msg to group id and returns once a quorum of the group's
// voters has applied it. An applier's error result is returned.
func (h *Host) Set(ctx context.Context, id GroupID, msg any) error {
	_, err := h.SetAsync(id, msg).Wait(ctx)
	return err
}

// SetAsync is Set's asynchronous form; the future holds the entry index.
func (h *Host) SetAsync(id GroupID, msg any) *Future[uint64] {
	return thenMap(h.submitTyped(id, msg, nil, true), func(r Result) (uint64, error) {
		return r.Index, decodeResult(r.Data, nil)
	})
}

// Do proposes msg to group id, waits until this replica applied it, and
// decodes the first non-nil applier result into out (JSON; out may be
// nil).
func (h *Host) Do(ctx context.Context, id GroupID, msg any, out any) error {
	r, err := h.submitTyped(id, msg, nil, false).Wait(ctx)
	if err != nil {
		return err
	}
	return decodeResult(r.Data, out)
}

// DoQuorum is Do that returns only once a quorum of voters has applied
// msg (as Set), with the applier's result decoded into out.
func (h *Host) DoQuorum(ctx context.Context, id GroupID, msg any, out any) error {
	r, err := h.DoQuorumAsync(id, msg).Wait(ctx)
	if err != nil {
		return err
	}
	return decodeResult(r.Data, out)
}

// DoQuorumAsync is DoQuorum's asynchronous form; the future holds the raw
// result (DecodeResult decodes its Data).
func (h *Host) DoQuorumAsync(id GroupID, msg any) *Future[Result] {
	return h.submitTyped(id, msg, nil, true)
}

// DecodeResult decodes the Data of a typed result into out, or returns
// the applier's error.
func DecodeResult(data []byte, out any) error { return decodeResult(data, out) }

// SetFenced is Set for a lock holder: the message is applied only if l is
// still the lock's current, unexpired lease when the entry applies (its
// group time); otherwise nothing is applied and ErrFenced returned.
func (h *Host) SetFenced(ctx context.Context, id GroupID, l Lease, msg any) error {
	_, err := h.SetFencedAsync(id, l, msg).Wait(ctx)
	return err
}

// SetFencedAsync is SetFenced's asynchronous form.
func (h *Host) SetFencedAsync(id GroupID, l Lease, msg any) *Future[uint64] {
	return thenMap(h.submitTyped(id, msg, &l, true), func(r Result) (uint64, error) {
		return r.Index, decodeResult(r.Data, nil)
	})
}

// DoFencedQuorum is DoQuorum for a lock holder (see SetFenced): msg is
// applied only while l is the lock's current, unexpired lease, else
// ErrFenced; the applier's result is decoded into out.
func (h *Host) DoFencedQuorum(ctx context.Context, id GroupID, l Lease, msg any, out any) error {
	r, err := h.submitTyped(id, msg, &l, true).Wait(ctx)
	if err != nil {
		return err
	}
	return decodeResult(r.Data, out)
}
