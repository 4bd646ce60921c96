package vold

import (
	"encoding/json"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
)

// The system group's key-value store: an applier on raftgroup's typed
// state machine (which also keeps the locks). A key's revision is the log
// index of the entry that last wrote it, so revisions of a key strictly
// increase and compare-and-swap on them is exact. Puts carry an
// idempotency key: a put retried (on another member, after a lost answer)
// within idemWindow of group time, or while fewer than maxIdem newer puts
// have been made, gets the first attempt's result without applying again.

const (
	idemWindow = 5 * time.Minute
	maxIdem    = 100_000
)

// kvPut is the replicated put command.
type kvPut struct {
	Key     string `json:"k"`
	Value   []byte `json:"v,omitempty"`
	Compare bool   `json:"c,omitempty"`
	Expect  uint64 `json:"e,omitempty"`
	IdemKey string `json:"i,omitempty"`
}

// kvPutResult is a put's outcome.
type kvPutResult struct {
	Applied  bool   `json:"applied"`
	Revision uint64 `json:"revision"`
}

type kvEntry struct {
	Value    []byte `json:"v"`
	Revision uint64 `json:"r"`
}

type idemEntry struct {
	Key    string      `json:"k"`
	Time   int64       `json:"t"`
	Result kvPutResult `json:"r"`
}

// kvStore is the applier. Apply runs on the host's loop; Get may run on
// any goroutine (after a ReadIndex), hence mu.
type kvStore struct {
	mu   sync.RWMutex
	data map[string]kvEntry
	// idem is in apply order (group time never goes back), so expiry
	// trims its head.
	idem  []idemEntry
	byKey map[string]int // idempotency key -> position in idem + offset
	off   int
	// machines are the logs of the named state machines (machines.go),
	// machinesBytes their total size; changed is closed (and replaced)
	// whenever one changes, to wake waiting readers.
	machines      map[string]*machineLog
	machinesBytes int64
	changed       chan struct{}
}

func newKVStore() *kvStore {
	return &kvStore{data: map[string]kvEntry{}, byKey: map[string]int{}, machines: map[string]*machineLog{}, changed: make(chan struct{})}
}

// newSystemMachine returns the system group's state machine and its KV.
func newSystemMachine() (raftgroup.StateMachine, *kvStore) {
	reg := raftgroup.NewRegistry()
	if err := reg.RegisterName("vold.KVPut", kvPut{}); err != nil {
		panic(err) // a fixed, valid registration
	}
	if err := reg.RegisterName("vold.MachineSet", machineSet{}); err != nil {
		panic(err)
	}
	t := raftgroup.NewTyped(reg)
	kv := newKVStore()
	t.Use(kv)
	return t, kv
}

// Apply implements raftgroup.Applier.
func (s *kvStore) Apply(c raftgroup.Command) any {
	p, put := c.Msg.(*kvPut)
	m, set := c.Msg.(*machineSet)
	if !put && !set {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := c.Time.UnixNano()
	s.expire(now)
	if set {
		return s.applyMachineSet(c, m)
	}
	if p.IdemKey != "" {
		if r, ok := s.idemResult(p.IdemKey); ok {
			return r
		}
	}
	cur := s.data[p.Key]
	var res kvPutResult
	if p.Compare && cur.Revision != p.Expect {
		res = kvPutResult{Applied: false, Revision: cur.Revision}
	} else {
		s.data[p.Key] = kvEntry{Value: p.Value, Revision: c.Index}
		res = kvPutResult{Applied: true, Revision: c.Index}
	}
	if p.IdemKey != "" {
		s.remember(p.IdemKey, now, res)
	}
	return res
}

// idemResult returns the result recorded for an idempotency key.
func (s *kvStore) idemResult(key string) (kvPutResult, bool) {
	i, ok := s.byKey[key]
	if !ok {
		return kvPutResult{}, false
	}
	return s.idem[i-s.off].Result, true
}

// remember records the result of the write with an idempotency key.
func (s *kvStore) remember(key string, now int64, res kvPutResult) {
	s.byKey[key] = s.off + len(s.idem)
	s.idem = append(s.idem, idemEntry{Key: key, Time: now, Result: res})
}

// expire drops idempotency records older than the window or beyond the
// cap; deterministic, since it depends on group time only.
func (s *kvStore) expire(now int64) {
	drop := 0
	for drop < len(s.idem) && (now-s.idem[drop].Time > int64(idemWindow) || len(s.idem)-drop > maxIdem) {
		delete(s.byKey, s.idem[drop].Key)
		drop++
	}
	if drop > 0 {
		s.idem = append([]idemEntry(nil), s.idem[drop:]...)
		s.off += drop
	}
}

// get returns a key's value and revision.
func (s *kvStore) get(key string) (kvEntry, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	e, ok := s.data[key]
	return e, ok
}

type kvSnapshot struct {
	Data     map[string]kvEntry     `json:"data"`
	Idem     []idemEntry            `json:"idem,omitempty"`
	Machines map[string]*machineLog `json:"machines,omitempty"`
}

// Snapshot implements raftgroup.Snapshotter (JSON: map keys are sorted, so
// equal states give equal bytes, which the status digest relies on).
func (s *kvStore) Snapshot() ([]byte, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return json.Marshal(kvSnapshot{Data: s.data, Idem: s.idem, Machines: s.machines})
}

var _ raftgroup.ForkingSnapshotter = (*kvStore)(nil)

// ForkSnapshot implements raftgroup.ForkingSnapshotter, so that the
// system group's snapshots (up to 64 MiB of state machine logs, and the
// KV) are encoded and written off the Raft loop: the fork copies the
// maps and slice headers, whose values, idempotency records and commands
// are never changed once applied (a machine's log only grows, or is
// replaced), and encodes them later as Snapshot would have.
func (s *kvStore) ForkSnapshot() (func() ([]byte, error), error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	snap := kvSnapshot{Data: maps.Clone(s.data), Idem: slices.Clip(s.idem), Machines: make(map[string]*machineLog, len(s.machines))}
	for name, l := range s.machines {
		snap.Machines[name] = &machineLog{Commands: slices.Clip(l.Commands)}
	}
	return func() ([]byte, error) { return json.Marshal(snap) }, nil
}

// Restore implements raftgroup.Snapshotter.
func (s *kvStore) Restore(data []byte) error {
	snap := kvSnapshot{}
	if len(data) > 0 {
		if err := json.Unmarshal(data, &snap); err != nil {
			return err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.data = snap.Data
	if s.data == nil {
		s.data = map[string]kvEntry{}
	}
	s.idem, s.off, s.byKey = snap.Idem, 0, map[string]int{}
	for i, e := range s.idem {
		s.byKey[e.Key] = i
	}
	s.machines, s.machinesBytes = snap.Machines, 0
	if s.machines == nil {
		s.machines = map[string]*machineLog{}
	}
	for _, l := range s.machines {
		for _, c := range l.Commands {
			l.bytes += c.size()
		}
		s.machinesBytes += l.bytes
	}
	s.notify()
	return nil
}

// notify wakes the readers waiting for a machine's log to change; s.mu is
// held.
func (s *kvStore) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}
