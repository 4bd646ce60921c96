package raftgrouptest

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
)

// KVOp is a command of the KV state machine.
type KVOp struct {
	// Op is "put", "cas" or "get" (a get through the log).
	Op    string `json:"op"`
	Key   string `json:"key"`
	Value string `json:"value,omitempty"`
	// Old is the value a cas expects.
	Old string `json:"old,omitempty"`
}

// Encode encodes the op as a proposal payload.
func (o KVOp) Encode() []byte {
	b, err := json.Marshal(o)
	if err != nil {
		panic(err)
	}
	return b
}

// KVResult is a KV command's result.
type KVResult struct {
	OK    bool   `json:"ok"`
	Value string `json:"value"` // the value before the command
}

// DecodeKVResult decodes a result.
func DecodeKVResult(b []byte) (KVResult, error) {
	var r KVResult
	err := json.Unmarshal(b, &r)
	return r, err
}

// KV is a key-value state machine with compare-and-swap, for tests. It is
// safe to read (Get, Dump) while the host applies.
type KV struct {
	mu      sync.RWMutex
	data    map[string]string
	applied uint64
	// Applies counts applied commands (a duplicate shows up here).
	Applies int
}

// NewKV returns an empty KV.
func NewKV() *KV { return &KV{data: map[string]string{}} }

// Apply implements raftgroup.StateMachine.
func (kv *KV) Apply(entries []raftgroup.Entry) ([][]byte, error) {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	out := make([][]byte, len(entries))
	for i, e := range entries {
		if e.Index <= kv.applied {
			return nil, fmt.Errorf("kv: entry %d applied after %d", e.Index, kv.applied)
		}
		kv.applied = e.Index
		var op KVOp
		if err := json.Unmarshal(e.Data, &op); err != nil {
			return nil, fmt.Errorf("kv: entry %d: %w", e.Index, err)
		}
		kv.Applies++
		old := kv.data[op.Key]
		res := KVResult{Value: old}
		switch op.Op {
		case "put":
			kv.data[op.Key] = op.Value
			res.OK = true
		case "cas":
			if old == op.Old {
				kv.data[op.Key] = op.Value
				res.OK = true
			}
		case "get":
			res.OK = true
		}
		b, _ := json.Marshal(res)
		out[i] = b
	}
	return out, nil
}

// Snapshot implements raftgroup.StateMachine.
func (kv *KV) Snapshot() ([]byte, error) {
	kv.mu.RLock()
	defer kv.mu.RUnlock()
	return json.Marshal(kvSnap{Data: kv.data, Applied: kv.applied})
}

// AppendingKV is a KV that also implements raftgroup.SnapshotAppender,
// for tests of the host's path for such machines.
type AppendingKV struct {
	*KV
	// Appends counts AppendSnapshot's calls.
	Appends atomic.Int64
}

// AppendSnapshot implements raftgroup.SnapshotAppender.
func (a *AppendingKV) AppendSnapshot(dst []byte) ([]byte, error) {
	a.Appends.Add(1)
	b, err := a.KV.Snapshot()
	return append(dst, b...), err
}

// WritingKV is a KV that also implements raftgroup.SnapshotWriter, for
// tests of the host's snapshots written straight into its journal.
type WritingKV struct {
	*KV
	// Writes counts WriteSnapshot's calls.
	Writes atomic.Int64
}

// WriteSnapshot implements raftgroup.SnapshotWriter.
func (w *WritingKV) WriteSnapshot(dst io.Writer) error {
	w.Writes.Add(1)
	b, err := w.KV.Snapshot()
	if err != nil {
		return err
	}
	_, err = dst.Write(b)
	return err
}

type kvSnap struct {
	Data    map[string]string `json:"data"`
	Applied uint64            `json:"applied"`
}

// Restore implements raftgroup.StateMachine.
func (kv *KV) Restore(b []byte) error {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	s := kvSnap{Data: map[string]string{}}
	if b != nil {
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
	}
	if s.Data == nil {
		s.Data = map[string]string{}
	}
	kv.data, kv.applied = s.Data, s.Applied
	return nil
}

// Get reads a key locally.
func (kv *KV) Get(key string) string {
	kv.mu.RLock()
	defer kv.mu.RUnlock()
	return kv.data[key]
}

// Dump returns a copy of the data and the applied index.
func (kv *KV) Dump() (map[string]string, uint64) {
	kv.mu.RLock()
	defer kv.mu.RUnlock()
	return maps.Clone(kv.data), kv.applied
}

// Keys lists the keys.
func (kv *KV) Keys() []string {
	kv.mu.RLock()
	defer kv.mu.RUnlock()
	return slices.Sorted(maps.Keys(kv.data))
}

// ForkingKV is a KV that also implements raftgroup.SnapshotForker, for
// tests of snapshots written off the host's loop. A fork holds the
// state's snapshot as of the fork; its WriteSnapshot waits for Gate to be
// closed (if set) before it writes, and then closes Written (if set and
// not closed yet).
type ForkingKV struct {
	*KV
	Gate    <-chan struct{}
	Written chan struct{}
	// Forks counts ForkSnapshot's calls.
	Forks atomic.Int64
}

// WriteSnapshot implements raftgroup.SnapshotWriter.
func (f *ForkingKV) WriteSnapshot(dst io.Writer) error {
	b, err := f.KV.Snapshot()
	if err != nil {
		return err
	}
	_, err = dst.Write(b)
	return err
}

// ForkSnapshot implements raftgroup.SnapshotForker.
func (f *ForkingKV) ForkSnapshot() (raftgroup.SnapshotWriter, error) {
	f.Forks.Add(1)
	b, err := f.KV.Snapshot()
	return &kvFork{b: b, kv: f}, err
}

type kvFork struct {
	b  []byte
	kv *ForkingKV
}

func (k *kvFork) WriteSnapshot(dst io.Writer) error {
	if k.kv.Gate != nil {
		<-k.kv.Gate
	}
	_, err := dst.Write(k.b)
	if w := k.kv.Written; w != nil {
		writtenMu.Lock()
		select {
		case <-w:
		default:
			close(w)
		}
		writtenMu.Unlock()
	}
	return err
}

// writtenMu orders the closes of a Written that forks share.
var writtenMu sync.Mutex
