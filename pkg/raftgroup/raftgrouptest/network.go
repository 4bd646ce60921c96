// Package raftgrouptest is a deterministic environment for raftgroup
// hosts, in the style of etcd raft's interaction tests: N hosts in one
// process over an in-memory network whose delivery, loss, delay and
// partitions the test controls, a manual clock and manual ticks, and
// crashes that lose exactly what was not synced (Pebble on a crashable
// in-memory filesystem).
//
// Nothing runs on its own: a test advances the world with Cluster.Step
// (every live host runs one round, then due messages are delivered) and
// Cluster.Tick (the clock and every host's Raft clock advance, then a few
// steps). All randomness comes from the cluster's seed: loss, delay, what
// a crash keeps (rolled in path order, crash.go), proposal keys, and
// Raft's randomized election timeouts, which etcd raft draws from
// crypto/rand (New seeds it for the test). The hosts run with
// Config.Deterministic, so nothing they do depends on the scheduler
// (unless a test turns BackgroundSnapshots on): two runs of a seed
// deliver the same batches in the same order (Network's Digest), and a
// seed that fails fails again.
package raftgrouptest

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
)

// Network is an in-memory network between hosts. Batches are encoded on
// Send and decoded on delivery (no memory is shared between hosts, and
// the wire format is exercised).
type Network struct {
	mu    sync.Mutex
	rng   *rand.Rand
	hosts map[raftgroup.NodeID]*raftgroup.Host
	queue []inflight
	now   uint64
	cut   map[[2]raftgroup.NodeID]bool

	// DropRate is the probability that a batch is lost.
	DropRate float64
	// MaxDelay delays each batch by up to this many steps (reordering
	// batches between a pair of nodes as well).
	MaxDelay int
	// SendErrors makes Send fail (instead of losing the batch silently)
	// when the link is cut or the destination is down, as a stream
	// transport that notices a broken connection would.
	SendErrors bool
	// Immediate hands batches to their destination inside Send (after
	// encoding and decoding), with no queue: for real-time runs and
	// benchmarks. Loss and partitions still apply; delays do not.
	Immediate bool
	// Tap, if set, sees every batch sent (before loss).
	Tap func(from, to raftgroup.NodeID, b *raftgroup.Batch)

	stats map[[2]raftgroup.NodeID]*LinkStats
	// delivered digests every batch handed over so far, with its step,
	// source and destination: two runs of a seed agree on it exactly
	// when they delivered the same batches in the same order.
	delivered hash.Hash64
	// trail keeps, when Trail is on, one entry per delivered batch.
	trail []Delivery
	// Trail keeps a Delivery for every batch handed over (see
	// Deliveries), for finding where two runs of a seed part.
	Trail bool
}

// Delivery describes one batch handed to its destination.
type Delivery struct {
	Step     uint64
	From, To raftgroup.NodeID
	// Digest is the digest of the encoded batch.
	Digest uint64
}

// LinkStats counts what one node sent another.
type LinkStats struct {
	Batches    int
	Messages   int // Raft messages, heartbeats included
	Heartbeats int // coalesced heartbeats and responses
	Dropped    int
}

type inflight struct {
	from, to raftgroup.NodeID
	data     []byte
	at       uint64
}

// NewNetwork returns a network whose randomness comes from rng.
func NewNetwork(rng *rand.Rand) *Network {
	return &Network{
		rng:       rng,
		hosts:     map[raftgroup.NodeID]*raftgroup.Host{},
		cut:       map[[2]raftgroup.NodeID]bool{},
		stats:     map[[2]raftgroup.NodeID]*LinkStats{},
		delivered: fnv.New64a(),
	}
}

// Attach makes node id reachable at h.
func (n *Network) Attach(id raftgroup.NodeID, h *raftgroup.Host) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.hosts[id] = h
}

// Detach makes node id unreachable (crashed or stopped).
func (n *Network) Detach(id raftgroup.NodeID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.hosts, id)
}

// Transport returns node from's transport.
func (n *Network) Transport(from raftgroup.NodeID) raftgroup.Transport {
	return transport{n: n, from: from}
}

type transport struct {
	n    *Network
	from raftgroup.NodeID
}

// ErrUnreachable is returned by Send (with SendErrors) for a cut link or
// a down node.
var ErrUnreachable = fmt.Errorf("raftgrouptest: unreachable")

func (t transport) Send(to raftgroup.NodeID, b *raftgroup.Batch) error {
	n := t.n
	data, err := b.Marshal()
	if err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.Tap != nil {
		n.Tap(t.from, to, b)
	}
	st := n.link(t.from, to)
	st.Batches++
	st.Messages += len(b.Messages) + len(b.Heartbeats) + len(b.HeartbeatResps)
	st.Heartbeats += len(b.Heartbeats) + len(b.HeartbeatResps)
	_, up := n.hosts[to]
	if n.cut[[2]raftgroup.NodeID{t.from, to}] || !up {
		st.Dropped++
		if n.SendErrors {
			return ErrUnreachable
		}
		return nil
	}
	if n.DropRate > 0 && n.rng.Float64() < n.DropRate {
		st.Dropped++
		return nil
	}
	if n.Immediate {
		h := n.hosts[to]
		n.mu.Unlock()
		defer n.mu.Lock()
		b, err := raftgroup.UnmarshalBatch(data)
		if err != nil {
			return err
		}
		h.Deliver(t.from, b)
		return nil
	}
	at := n.now + 1
	if n.MaxDelay > 0 {
		at += uint64(n.rng.IntN(n.MaxDelay + 1))
	}
	n.queue = append(n.queue, inflight{from: t.from, to: to, data: data, at: at})
	return nil
}

func (n *Network) link(from, to raftgroup.NodeID) *LinkStats {
	k := [2]raftgroup.NodeID{from, to}
	s := n.stats[k]
	if s == nil {
		s = &LinkStats{}
		n.stats[k] = s
	}
	return s
}

// Deliver advances the network by one step and hands every batch due by
// then to its destination (in send order). Batches on links cut since
// they were sent, or to nodes that went down, are lost.
func (n *Network) Deliver() int {
	n.mu.Lock()
	n.now++
	var due []inflight
	keep := n.queue[:0]
	for _, m := range n.queue {
		if m.at <= n.now {
			due = append(due, m)
		} else {
			keep = append(keep, m)
		}
	}
	clear(n.queue[len(keep):])
	n.queue = keep
	type delivery struct {
		h        *raftgroup.Host
		from, to raftgroup.NodeID
		data     []byte
	}
	var ds []delivery
	for _, m := range due {
		h, up := n.hosts[m.to]
		if !up || n.cut[[2]raftgroup.NodeID{m.from, m.to}] {
			n.link(m.from, m.to).Dropped++
			continue
		}
		ds = append(ds, delivery{h, m.from, m.to, m.data})
	}
	for _, d := range ds {
		h := fnv.New64a()
		h.Write(binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, n.now), uint64(d.from)), uint64(d.to)))
		h.Write(d.data)
		dg := h.Sum64()
		n.delivered.Write(binary.BigEndian.AppendUint64(nil, dg))
		if n.Trail {
			n.trail = append(n.trail, Delivery{Step: n.now, From: d.from, To: d.to, Digest: dg})
		}
	}
	n.mu.Unlock()
	for _, d := range ds {
		b, err := raftgroup.UnmarshalBatch(d.data)
		if err != nil {
			panic(fmt.Sprintf("raftgrouptest: undecodable batch: %v", err))
		}
		d.h.Deliver(d.from, b)
	}
	return len(ds)
}

// Digest returns the digest of every batch delivered so far (see
// Delivery): equal for two runs of a seed that delivered the same
// batches in the same order.
func (n *Network) Digest() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.delivered.Sum64()
}

// Deliveries returns the batches delivered since Trail was turned on.
func (n *Network) Deliveries() []Delivery {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.trail)
}

// InFlight returns how many batches are queued.
func (n *Network) InFlight() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.queue)
}

// Cut cuts the link from a to b (one direction).
func (n *Network) Cut(a, b raftgroup.NodeID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut[[2]raftgroup.NodeID{a, b}] = true
}

// Partition splits the nodes into sides that cannot talk to each other
// (nodes not listed keep talking to everyone).
func (n *Network) Partition(sides ...[]raftgroup.NodeID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for i, a := range sides {
		for j, b := range sides {
			if i == j {
				continue
			}
			for _, x := range a {
				for _, y := range b {
					n.cut[[2]raftgroup.NodeID{x, y}] = true
				}
			}
		}
	}
}

// Isolate cuts node a off from every other node in nodes.
func (n *Network) Isolate(a raftgroup.NodeID, nodes []raftgroup.NodeID) {
	var others []raftgroup.NodeID
	for _, x := range nodes {
		if x != a {
			others = append(others, x)
		}
	}
	n.Partition([]raftgroup.NodeID{a}, others)
}

// Heal restores every link.
func (n *Network) Heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	clear(n.cut)
}

// Stats returns what from sent to (so far).
func (n *Network) Stats(from, to raftgroup.NodeID) LinkStats {
	n.mu.Lock()
	defer n.mu.Unlock()
	if s := n.stats[[2]raftgroup.NodeID{from, to}]; s != nil {
		return *s
	}
	return LinkStats{}
}

// ResetStats zeroes the link counters.
func (n *Network) ResetStats() {
	n.mu.Lock()
	defer n.mu.Unlock()
	clear(n.stats)
}

// Links lists the links with traffic, sorted.
func (n *Network) Links() [][2]raftgroup.NodeID {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out [][2]raftgroup.NodeID
	for k := range n.stats {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b [2]raftgroup.NodeID) int {
		if a[0] != b[0] {
			return int(a[0]) - int(b[0])
		}
		return int(a[1]) - int(b[1])
	})
	return out
}

// AutoDeliver delivers batches every interval until ctx ends (for tests
// that run hosts with Host.Run in real time).
func (n *Network) AutoDeliver(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			n.Deliver()
		}
	}
}
