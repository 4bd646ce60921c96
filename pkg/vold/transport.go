package vold

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/shoal-dev/shoal/pkg/client"
	"github.com/shoal-dev/shoal/pkg/raftgroup"
	volv1 "github.com/shoal-dev/shoal/proto/shoal/vol/v1"
)

// The Raft transport. The host calls Send from its loop, which must never
// wait on the network; so every destination node gets two lanes, each a
// bounded queue drained by one goroutine that holds one VolPeer.Raft
// client stream: a lane for ordinary batches and one for snapshots, so
// that a large snapshot being streamed never holds up the heartbeats of
// every other group between the same two nodes.
//
// Send fails (and the host reports the batch's replicas unreachable, which
// is what makes Raft pause and probe them) when the lane's queue is full
// or the lane is down: its last attempt to connect or send failed and it
// is waiting out its backoff before reconnecting. A broken stream loses
// whatever was queued behind it; Raft retransmits.

const (
	laneQueue     = 512
	snapLaneQueue = 4
	// chunkSize bounds one RaftBatch message; bigger batches (snapshots)
	// go in chunks and are joined by the receiver.
	chunkSize = 4 << 20
	// maxBatchBytes bounds a joined batch on receipt.
	maxBatchBytes = 2 << 30
	// connectTimeout bounds one attempt to open a stream.
	connectTimeout = 3 * time.Second
)

var (
	errQueueFull   = fmt.Errorf("raft transport: queue full: %w", errdefs.ErrUnavailable)
	errPeerDown    = fmt.Errorf("raft transport: peer unreachable: %w", errdefs.ErrUnavailable)
	errTransportOf = fmt.Errorf("raft transport: closed: %w", errdefs.ErrUnavailable)
)

// streamOpener opens a Raft stream to a node; the transport closes the
// stream by cancelling ctx.
type streamOpener func(ctx context.Context, to raftgroup.NodeID) (volv1.VolPeer_RaftClient, error)

// transport implements raftgroup.Transport over VolPeer.Raft.
type transport struct {
	log  *slog.Logger
	open streamOpener
	ctx  context.Context
	stop context.CancelFunc
	wg   sync.WaitGroup

	mu     sync.Mutex
	peers  map[raftgroup.NodeID]*outPeer
	closed bool

	// Counters for metrics.
	sentBatches, sentBytes, dropped, failures atomic.Uint64
}

type outPeer struct {
	normal, snap *lane
}

// lane is one queue and the goroutine that sends it.
type lane struct {
	t    *transport
	to   raftgroup.NodeID
	name string
	q    chan *raftgroup.Batch
	// down is set from a failure until the backoff before the next attempt
	// has passed: Send fails at once meanwhile.
	down atomic.Bool
}

func newTransport(log *slog.Logger, open streamOpener) *transport {
	ctx, cancel := context.WithCancel(context.Background())
	return &transport{log: log, open: open, ctx: ctx, stop: cancel, peers: map[raftgroup.NodeID]*outPeer{}}
}

// Send queues b for node to. It never blocks.
func (t *transport) Send(to raftgroup.NodeID, b *raftgroup.Batch) error {
	p, err := t.peer(to)
	if err != nil {
		return err
	}
	l := p.normal
	if hasSnapshot(b) {
		l = p.snap
	}
	if l.down.Load() {
		t.dropped.Add(1)
		return errPeerDown
	}
	select {
	case l.q <- b:
		return nil
	default:
		t.dropped.Add(1)
		return errQueueFull
	}
}

func hasSnapshot(b *raftgroup.Batch) bool {
	for _, m := range b.Messages {
		if m.Msg.GetType() == pb.MsgSnap {
			return true
		}
	}
	return false
}

func (t *transport) peer(to raftgroup.NodeID) (*outPeer, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, errTransportOf
	}
	if p := t.peers[to]; p != nil {
		return p, nil
	}
	p := &outPeer{
		normal: &lane{t: t, to: to, name: "raft", q: make(chan *raftgroup.Batch, laneQueue)},
		snap:   &lane{t: t, to: to, name: "snapshot", q: make(chan *raftgroup.Batch, snapLaneQueue)},
	}
	t.peers[to] = p
	for _, l := range []*lane{p.normal, p.snap} {
		t.wg.Add(1)
		go func() { defer t.wg.Done(); l.run(t.ctx) }()
	}
	return p, nil
}

// Close stops every lane and waits for their goroutines.
func (t *transport) Close() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	t.stop()
	t.wg.Wait()
}

// run connects, sends until the stream breaks, and reconnects with
// backoff, until ctx ends.
func (l *lane) run(ctx context.Context) {
	failures := 0
	for ctx.Err() == nil {
		connected, err := l.session(ctx)
		if ctx.Err() != nil {
			return
		}
		if connected {
			failures = 0
		}
		failures++
		l.t.failures.Add(1)
		l.down.Store(true)
		l.drain()
		// Log the first failure of a run at info, the rest at debug: a dead
		// peer would otherwise fill the log.
		lvl := slog.LevelDebug
		if failures == 1 {
			lvl = slog.LevelInfo
		}
		l.t.log.Log(ctx, lvl, "raft stream failed", "to", l.to, "lane", l.name, "failures", failures, "err", err)
		wait := client.Retry{Initial: 100 * time.Millisecond, Max: 2 * time.Second}.Backoff(failures - 1)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		// Back to queueing: the next session either works or marks the
		// lane down again.
		l.down.Store(false)
	}
}

// drain drops what is queued behind a broken stream.
func (l *lane) drain() {
	for {
		select {
		case <-l.q:
			l.t.dropped.Add(1)
		default:
			return
		}
	}
}

// session waits for a batch, opens a stream and sends batches on it until
// an error; it reports whether the stream was opened. Opening only when
// there is something to send keeps a lane to a node that is gone from
// dialing it forever.
func (l *lane) session(ctx context.Context) (bool, error) {
	var first *raftgroup.Batch
	select {
	case <-ctx.Done():
		return false, ctx.Err()
	case first = <-l.q:
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Opening blocks while the connection is being made; bound it so a dead
	// peer is noticed and the lane marked down.
	opened := make(chan struct{})
	timer := time.AfterFunc(connectTimeout, func() {
		select {
		case <-opened:
		default:
			cancel()
		}
	})
	stream, err := l.t.open(sctx, l.to)
	close(opened)
	timer.Stop()
	if err != nil {
		l.t.dropped.Add(1)
		return false, err
	}
	if sctx.Err() != nil {
		l.t.dropped.Add(1)
		return false, fmt.Errorf("connect: %w", sctx.Err())
	}
	defer stream.CloseSend()
	for b := first; ; {
		data, err := b.Marshal()
		if err != nil {
			// A batch that cannot be encoded is a bug; losing it is what
			// Raft tolerates anyway.
			l.t.log.Error("raft batch marshal", "to", l.to, "err", err)
		} else {
			if err := sendChunks(stream, data); err != nil {
				return true, err
			}
			l.t.sentBatches.Add(1)
			l.t.sentBytes.Add(uint64(len(data)))
		}
		select {
		case <-ctx.Done():
			return true, ctx.Err()
		case b = <-l.q:
		}
	}
}

func sendChunks(stream volv1.VolPeer_RaftClient, data []byte) error {
	for {
		n := min(len(data), chunkSize)
		more := n < len(data)
		if err := stream.Send(&volv1.RaftBatch{Batch: data[:n], More: more}); err != nil {
			return err
		}
		if !more {
			return nil
		}
		data = data[n:]
	}
}

// raftReceiver joins chunked batches from one stream and decodes them.
type raftReceiver struct {
	buf []byte
}

// add takes one message; it returns a complete batch, or nil while a
// chunked batch is incomplete.
func (r *raftReceiver) add(m *volv1.RaftBatch) (*raftgroup.Batch, error) {
	data := m.GetBatch()
	if m.GetMore() || r.buf != nil {
		if len(r.buf)+len(data) > maxBatchBytes {
			r.buf = nil
			return nil, errors.New("raft batch too large")
		}
		r.buf = append(r.buf, data...)
		if m.GetMore() {
			return nil, nil
		}
		data, r.buf = r.buf, nil
	}
	return raftgroup.UnmarshalBatch(data)
}
