package vold

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	volv1 "github.com/shoal-dev/shoal/proto/shoal/vol/v1"
)

// Named state machines for processes outside vold (shoal.vol.v1.StateMachines).
// vold cannot run a foreign process's code in its apply loop, so a machine
// here is its replicated log: Set appends a command (an opaque Any) once a
// quorum applied it, and a process folds the log into its own state —
// Watch is its Use(applier). The log lives in the system group's KV
// applier (kvStore.machines), so it is in the same snapshots and digests
// as the KV; a snapshot command (a process's fold of everything before)
// compacts it.

// Limits of the machines' logs (the system group's state is in memory
// and travels whole in Raft snapshots).
const (
	maxMachineBytes  = 8 << 20
	maxMachinesBytes = 64 << 20
	// machineReadBytes bounds one read's commands (forwarded answers
	// stay well under gRPC's 4 MiB message limit).
	machineReadBytes = 2 << 20
	// machineWait is how long a following read waits on a member for a
	// new command before it answers empty (under forwardAttempt).
	machineWait = 5 * time.Second
)

// machineSet is the replicated Set command.
type machineSet struct {
	Machine  string `json:"m"`
	TypeURL  string `json:"t,omitempty"`
	Value    []byte `json:"v,omitempty"`
	Snapshot bool   `json:"s,omitempty"`
	Compare  bool   `json:"c,omitempty"`
	Expect   uint64 `json:"e,omitempty"`
	IdemKey  string `json:"i,omitempty"`
}

// machineSetResult is a Set's outcome; Full says it was refused because
// the log is over its limit.
type machineSetResult struct {
	Applied bool   `json:"applied"`
	Index   uint64 `json:"index"`
	Full    bool   `json:"full,omitempty"`
}

// machineCommand is one command in a machine's log.
type machineCommand struct {
	Index    uint64 `json:"i"`
	Time     int64  `json:"t"`
	TypeURL  string `json:"u,omitempty"`
	Value    []byte `json:"v,omitempty"`
	Snapshot bool   `json:"s,omitempty"`
}

func (c machineCommand) size() int64 { return int64(len(c.TypeURL) + len(c.Value)) }

// machineLog is a machine's retained log: everything since its last
// snapshot command.
type machineLog struct {
	Commands []machineCommand `json:"c"`
	// bytes is the size of Commands (derived; Restore recomputes it).
	bytes int64
}

func (l *machineLog) last() uint64 {
	if l == nil || len(l.Commands) == 0 {
		return 0
	}
	return l.Commands[len(l.Commands)-1].Index
}

func (l *machineLog) size() int64 {
	if l == nil {
		return 0
	}
	return l.bytes
}

// applyMachineSet applies a Set; s.mu is held.
func (s *kvStore) applyMachineSet(c raftgroup.Command, p *machineSet) machineSetResult {
	idem := ""
	if p.IdemKey != "" {
		idem = "machine/" + p.IdemKey
		if r, ok := s.idemResult(idem); ok {
			return machineSetResult{Applied: r.Applied, Index: r.Revision}
		}
	}
	old := s.machines[p.Machine]
	if p.Compare && old.last() != p.Expect {
		return machineSetResult{Index: old.last()}
	}
	cmd := machineCommand{Index: c.Index, Time: c.Time.UnixNano(), TypeURL: p.TypeURL, Value: p.Value, Snapshot: p.Snapshot}
	l := old
	if l == nil || p.Snapshot {
		l = &machineLog{}
	}
	grown := s.machinesBytes - old.size() + l.bytes + cmd.size()
	if l.bytes+cmd.size() > maxMachineBytes || grown > maxMachinesBytes {
		return machineSetResult{Index: old.last(), Full: true}
	}
	l.Commands = append(l.Commands, cmd)
	l.bytes += cmd.size()
	s.machines[p.Machine] = l
	s.machinesBytes = grown
	s.notify()
	if idem != "" {
		s.remember(idem, c.Time.UnixNano(), kvPutResult{Applied: true, Revision: c.Index})
	}
	return machineSetResult{Applied: true, Index: c.Index}
}

// machineRead is a (forwarded) read of a machine's log.
type machineRead struct {
	Machine string        `json:"m"`
	After   uint64        `json:"a"`
	Wait    time.Duration `json:"w,omitempty"`
}

// readMachine returns the commands of a machine with index greater than
// after, up to machineReadBytes (at least one), and a channel closed at
// the next change.
func (s *kvStore) readMachine(name string, after uint64) ([]machineCommand, <-chan struct{}) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []machineCommand
	var n int64
	if l := s.machines[name]; l != nil {
		for _, c := range l.Commands {
			if c.Index <= after {
				continue
			}
			if len(out) > 0 && n+c.size() > machineReadBytes {
				break
			}
			out = append(out, c)
			n += c.size()
		}
	}
	return out, s.changed
}

// localMachine runs a StateMachines request on this node's replica of
// system group g.
func (n *node) localMachine(ctx context.Context, h *raftgroup.Host, g raftgroup.GroupID, kind string, payload []byte) ([]byte, error) {
	switch kind {
	case kindMachineSet:
		var req volv1.SetRequest
		if err := proto.Unmarshal(payload, &req); err != nil {
			return nil, fmt.Errorf("%s payload: %v: %w", kind, err, errdefs.ErrInvalidArgument)
		}
		msg := &machineSet{
			Machine: req.GetMachine(), TypeURL: req.GetCommand().GetTypeUrl(), Value: req.GetCommand().GetValue(),
			Snapshot: req.GetSnapshot(), Compare: req.GetCompare(), Expect: req.GetExpectIndex(), IdemKey: req.GetIdempotencyKey(),
		}
		n.stats.proposals.Add(1)
		var res machineSetResult
		var err error
		if req.GetLock() != "" {
			err = h.DoFencedQuorum(ctx, g, raftgroup.Lease{Name: req.GetLock(), Token: req.GetLockToken()}, msg, &res)
		} else {
			err = h.DoQuorum(ctx, g, msg, &res)
		}
		if errors.Is(err, raftgroup.ErrFenced) {
			return nil, fmt.Errorf("state machine %q: lock %q token %d is not the current lease: %w", req.GetMachine(), req.GetLock(), req.GetLockToken(), errdefs.ErrFailedPrecondition)
		}
		if err != nil {
			return nil, err
		}
		if res.Full {
			return nil, fmt.Errorf("state machine %q: its log is over the limit (%d bytes per machine, %d in all): compact it with a snapshot command: %w",
				req.GetMachine(), maxMachineBytes, maxMachinesBytes, errdefs.ErrResourceExhausted)
		}
		return proto.Marshal(&volv1.SetResponse{Applied: res.Applied, Index: res.Index})
	case kindMachineRead:
		var req machineRead
		if err := json.Unmarshal(payload, &req); err != nil {
			return nil, fmt.Errorf("%s payload: %v: %w", kind, err, errdefs.ErrInvalidArgument)
		}
		kv, err := n.readKV(ctx, h, g)
		if err != nil {
			return nil, err
		}
		wait := time.NewTimer(min(req.Wait, machineWait))
		defer wait.Stop()
		for {
			cmds, changed := kv.readMachine(req.Machine, req.After)
			if len(cmds) > 0 {
				return json.Marshal(cmds)
			}
			select {
			case <-changed:
			case <-wait.C:
				return json.Marshal(cmds)
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
	return nil, fmt.Errorf("unknown state machine request kind %q: %w", kind, errdefs.ErrInvalidArgument)
}

// machinesAPI serves shoal.vol.v1.StateMachines on vold.sock.
type machinesAPI struct {
	volv1.UnimplementedStateMachinesServer
	n *node
}

func (a *machinesAPI) Set(ctx context.Context, req *volv1.SetRequest) (*volv1.SetResponse, error) {
	if err := checkKey("machine", req.GetMachine()); err != nil {
		return nil, err
	}
	if req.GetCommand() == nil && !req.GetSnapshot() {
		return nil, fmt.Errorf("a command is required (only a snapshot command may be empty: it resets the machine): %w", errdefs.ErrInvalidArgument)
	}
	if s := len(req.GetCommand().GetTypeUrl()) + len(req.GetCommand().GetValue()); s > maxValueLen {
		return nil, fmt.Errorf("command of %d bytes is over the %d-byte limit: %w", s, maxValueLen, errdefs.ErrInvalidArgument)
	}
	if req.GetLock() != "" {
		if err := checkKey("lock name", req.GetLock()); err != nil {
			return nil, err
		}
	}
	req = proto.CloneOf(req)
	if req.IdempotencyKey == "" {
		req.IdempotencyKey = newKey()
	}
	out := &volv1.SetResponse{}
	return out, a.n.kvCall(ctx, kindMachineSet, req, out)
}

// Watch reads the machine's log from the system group, a batch at a
// time, each after a ReadIndex on the member that serves it; following,
// each read waits on the member until there is something new.
func (a *machinesAPI) Watch(req *volv1.WatchRequest, stream volv1.StateMachines_WatchServer) error {
	if err := checkKey("machine", req.GetMachine()); err != nil {
		return err
	}
	n, ctx := a.n, stream.Context()
	if _, err := n.raftHost(); err != nil {
		return err
	}
	d, err := n.ensureSystem(ctx)
	if err != nil {
		return err
	}
	after, caughtUp := req.GetAfter(), false
	for {
		r := machineRead{Machine: req.GetMachine(), After: after}
		if caughtUp {
			if !req.GetFollow() {
				return nil
			}
			r.Wait = machineWait
		}
		payload, _ := json.Marshal(r)
		resp, err := n.route(ctx, d, kindMachineRead, payload, "")
		if err != nil {
			return err
		}
		var cmds []machineCommand
		if err := json.Unmarshal(resp, &cmds); err != nil {
			return fmt.Errorf("state machine %q read: %w", req.GetMachine(), err)
		}
		caughtUp = len(cmds) == 0
		for _, c := range cmds {
			out := &volv1.MachineCommand{Index: c.Index, Snapshot: c.Snapshot, Time: timestamppb.New(time.Unix(0, c.Time))}
			if c.TypeURL != "" || len(c.Value) > 0 {
				out.Command = &anypb.Any{TypeUrl: c.TypeURL, Value: c.Value}
			}
			if err := stream.Send(out); err != nil {
				return err
			}
			after = c.Index
		}
	}
}
