package vold

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/shoal-dev/shoal/pkg/client"
	"github.com/shoal-dev/shoal/pkg/raftgroup"
)

// The Raft transport. Batches travel between volds as frames on mutual-TLS
// connections to the VolPeer port, where the protocol negotiated in the
// handshake ("shoal-raft/1" by ALPN) sets them apart from VolPeer's gRPC
// calls: a frame is the batch's length (4 bytes, big endian) and its
// Marshal encoding, written by the sender's lane goroutine and read by one
// goroutine per connection on the receiver, which hands it to the host
// itself: two goroutine hand-offs per hop (the lane's queue, the host's
// inbox) where a gRPC stream took about four, and no HTTP/2 framing and
// flow control per batch, which were a quarter to almost half of a vold's
// CPU for small synchronous writes.
//
// The host calls Send from its loop, which must never wait on the network;
// so every destination node gets two lanes, each a bounded queue drained
// by one goroutine that holds one connection: a lane for ordinary batches
// and one for snapshots, so that a large snapshot being sent never holds
// up the heartbeats of every other group between the same two nodes. A
// lane writes whatever is queued when it wakes (up to coalesceBytes) in
// one write, which reaches the socket as one write syscall, not one per
// TLS record (gatherConn), and the receiver reads what its socket holds
// at once (rpc.ALPNListener's read-ahead). But when a lane is connected, idle and has nothing queued,
// Send writes a small batch (most are: votes, appends of small entries,
// their answers) itself (sendHere): its frame fits the socket's buffer, so
// the write does not wait, and the lane's goroutine is not woken for it.
// On this project's 2-core VM, where waking a goroutine in another
// process costs about what handling the message does, that made a
// replicated synchronous 4 KiB write 15-25% faster and 10-20% cheaper in
// CPU (bench/vold, alternating with and without).
//
// Send fails (and the host reports the batch's replicas unreachable, which
// is what makes Raft pause and probe them) when the lane's queue is full
// or the lane is down: its last attempt to connect or send failed and it
// is waiting out its backoff before reconnecting. A broken connection
// loses whatever was queued behind it; Raft retransmits.

const (
	laneQueue     = 512
	snapLaneQueue = 4
	// maxBatchBytes bounds a frame on receipt.
	maxBatchBytes = 2 << 30
	// frameHeader is the size of the length that starts every frame.
	frameHeader = 4
	// coalesceBytes bounds what a lane gathers for one write (a single
	// larger batch goes alone), and writeChunk what it writes under one
	// deadline.
	coalesceBytes = 4 << 20
	writeChunk    = 4 << 20
	// keepBuffer bounds the buffer a lane keeps between writes: a
	// snapshot's is let go.
	keepBuffer = 2 * coalesceBytes
	// connectTimeout bounds one attempt to connect (TCP and TLS).
	connectTimeout = 3 * time.Second
	// writeTimeout is how long a connection may make no progress before
	// the lane gives up on it: a peer that stopped reading, or is gone
	// without a reset (it is also the TCP user timeout, see
	// peerPool.raftDialer).
	writeTimeout = 10 * time.Second
	// hereMax bounds a batch Send writes itself, and hereTimeout how long
	// that write may take (see sendHere).
	hereMax     = 64 << 10
	hereTimeout = 50 * time.Millisecond
	// receiveBuffer is the receiver's read buffer.
	receiveBuffer = 64 << 10
)

var (
	errQueueFull   = fmt.Errorf("raft transport: queue full: %w", errdefs.ErrUnavailable)
	errPeerDown    = fmt.Errorf("raft transport: peer unreachable: %w", errdefs.ErrUnavailable)
	errTransportOf = fmt.Errorf("raft transport: closed: %w", errdefs.ErrUnavailable)
)

// raftDialer opens a Raft connection to a node, its handshake done.
type raftDialer func(ctx context.Context, to raftgroup.NodeID) (net.Conn, error)

// transport implements raftgroup.Transport over Raft connections.
type transport struct {
	log  *slog.Logger
	dial raftDialer
	ctx  context.Context
	stop context.CancelFunc
	wg   sync.WaitGroup

	mu     sync.Mutex
	peers  map[raftgroup.NodeID]*outPeer
	closed bool

	// Counters for metrics.
	sentBatches, sentBytes, dropped, failures atomic.Uint64
	// sentHere counts the batches Send wrote itself (sendHere).
	sentHere atomic.Uint64
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
	// mu is held while frames are written to conn: by the lane's
	// goroutine, or by Send writing a batch itself (sendHere).
	mu sync.Mutex
	// conn is the lane's connection while its session runs (guarded by mu).
	conn net.Conn
	// pending counts the batches queued and not yet written: Send writes
	// itself only when none are, so that batches stay in order.
	pending atomic.Int64
	// buf holds the frames of one write (guarded by mu).
	buf []byte
}

func newTransport(log *slog.Logger, dial raftDialer) *transport {
	ctx, cancel := context.WithCancel(context.Background())
	return &transport{log: log, dial: dial, ctx: ctx, stop: cancel, peers: map[raftgroup.NodeID]*outPeer{}}
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
	if l == p.normal && dataSize(b) <= hereMax {
		if sent, err := l.sendHere(b); sent {
			return err
		}
	}
	l.pending.Add(1)
	select {
	case l.q <- b:
		return nil
	default:
		l.pending.Add(-1)
		t.dropped.Add(1)
		return errQueueFull
	}
}

// sendHere writes b on the caller's goroutine when the lane is connected,
// idle and has nothing queued, sparing the hand-off to the lane's
// goroutine; it reports whether it did (and the error if the write
// failed). A frame of a batch this small fits the socket's buffer, so the
// write does not wait; a peer that reads nothing breaks the connection
// after hereTimeout, as the lane would after writeTimeout.
func (l *lane) sendHere(b *raftgroup.Batch) (bool, error) {
	if l.pending.Load() != 0 || !l.mu.TryLock() {
		return false, nil
	}
	defer l.mu.Unlock()
	if l.conn == nil || l.pending.Load() != 0 {
		return false, nil
	}
	buf, n := l.appendFrame(l.buf[:0], b, 0)
	l.buf = buf[:0]
	if n == 0 {
		return true, nil // not encodable: dropped, as the lane would
	}
	err := l.conn.SetWriteDeadline(time.Now().Add(hereTimeout))
	if err == nil {
		_, err = l.conn.Write(buf)
	}
	if err != nil {
		// NB: the lane's goroutine waits for a batch, not on the connection:
		// with conn unset the next Send queues, which wakes it to find the
		// connection broken and make a new one.
		l.conn.Close()
		l.conn = nil
		l.t.dropped.Add(1)
		return true, fmt.Errorf("raft transport: %w: %w", err, errdefs.ErrUnavailable)
	}
	l.t.sentBatches.Add(1)
	l.t.sentHere.Add(1)
	l.t.sentBytes.Add(uint64(len(buf)))
	return true, nil
}

// dataSize is the size of the entries' data that b carries, most of its
// encoding when it is large.
func dataSize(b *raftgroup.Batch) int {
	n := 0
	for _, m := range b.Messages {
		for _, e := range m.Msg.GetEntries() {
			n += len(e.GetData())
		}
	}
	return n
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

// run connects, sends until the connection breaks, and reconnects with
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
		l.t.log.Log(ctx, lvl, "raft connection failed", "to", l.to, "lane", l.name, "failures", failures, "err", err)
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

// drain drops what is queued behind a broken connection.
func (l *lane) drain() {
	for {
		select {
		case <-l.q:
			l.pending.Add(-1)
			l.t.dropped.Add(1)
		default:
			return
		}
	}
}

// session waits for a batch, connects and sends batches until an error;
// it reports whether it connected. Connecting only when there is
// something to send keeps a lane to a node that is gone from dialing it
// forever.
func (l *lane) session(ctx context.Context) (bool, error) {
	var b *raftgroup.Batch
	select {
	case <-ctx.Done():
		return false, ctx.Err()
	case b = <-l.q:
	}
	dctx, cancel := context.WithTimeout(ctx, connectTimeout)
	conn, err := l.t.dial(dctx, l.to)
	cancel()
	if err != nil {
		l.pending.Add(-1)
		l.t.dropped.Add(1)
		return false, err
	}
	defer conn.Close()
	// Closing the connection is what interrupts a write when the
	// transport closes.
	defer context.AfterFunc(ctx, func() { conn.Close() })()
	l.mu.Lock()
	l.conn = conn
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.conn = nil
		l.mu.Unlock()
	}()
	for {
		n, err := l.write(conn, b)
		if err != nil {
			l.t.dropped.Add(uint64(n))
			return true, err
		}
		select {
		case <-ctx.Done():
			return true, ctx.Err()
		case b = <-l.q:
		}
	}
}

// write sends b and whatever else is queued, up to coalesceBytes, in one
// write; it returns the number of batches it sent or, on error, lost.
func (l *lane) write(conn net.Conn, b *raftgroup.Batch) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	taken := 1
	buf, n := l.appendFrame(l.buf[:0], b, 0)
more:
	for len(buf) < coalesceBytes {
		select {
		case b = <-l.q:
			taken++
			buf, n = l.appendFrame(buf, b, n)
		default:
			break more
		}
	}
	defer l.pending.Add(-int64(taken))
	var err error
	for p := buf; len(p) > 0 && err == nil; {
		// A deadline per chunk rather than per write: a large snapshot on
		// a slow link is progress, a peer that reads nothing is not.
		k := min(len(p), writeChunk)
		if err = conn.SetWriteDeadline(time.Now().Add(writeTimeout)); err == nil {
			_, err = conn.Write(p[:k])
		}
		p = p[k:]
	}
	if err == nil {
		l.t.sentBatches.Add(uint64(n))
		l.t.sentBytes.Add(uint64(len(buf)))
	}
	if cap(buf) <= keepBuffer {
		l.buf = buf[:0]
	} else {
		l.buf = nil
	}
	return n, err
}

// appendFrame appends b's frame to buf and counts it in n. A batch that
// cannot be encoded, or is too large for the receiver, is a bug; losing
// it is what Raft tolerates anyway.
func (l *lane) appendFrame(buf []byte, b *raftgroup.Batch, n int) ([]byte, int) {
	start := len(buf)
	buf, err := b.AppendMarshal(append(buf, 0, 0, 0, 0))
	size := len(buf) - start - frameHeader
	if err == nil && size > maxBatchBytes {
		err = fmt.Errorf("%d bytes is over the limit of %d", size, maxBatchBytes)
	}
	if err != nil {
		l.t.dropped.Add(1)
		l.t.log.Error("raft batch not sent", "to", l.to, "err", err)
		return buf[:start], n
	}
	binary.BigEndian.PutUint32(buf[start:], uint32(size))
	return buf, n + 1
}

// readFrame reads one frame and decodes its batch.
func readFrame(r *bufio.Reader) (*raftgroup.Batch, error) {
	hdr, err := r.Peek(frameHeader)
	if err != nil {
		return nil, err
	}
	size := binary.BigEndian.Uint32(hdr)
	if _, err := r.Discard(frameHeader); err != nil {
		return nil, err
	}
	if size > maxBatchBytes {
		return nil, fmt.Errorf("raft frame of %d bytes is over the limit of %d: %w", size, maxBatchBytes, errdefs.ErrInvalidArgument)
	}
	// NB: a fresh slice per frame, never a reused one: the batch's entries
	// alias it, and the host keeps them.
	data := make([]byte, size)
	if _, err := io.ReadFull(r, data); err != nil {
		return nil, err
	}
	b, err := raftgroup.UnmarshalBatch(data)
	if err != nil {
		return nil, fmt.Errorf("raft frame: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	return b, nil
}
