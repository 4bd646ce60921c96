package gossip

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/shoal-dev/shoal/pkg/mst"
)

// MemNetwork connects Gossip instances in one process by direct calls, for
// tests and simulations. It counts the bytes each call would put on the
// wire (the payload sizes of the equivalent protobuf messages) and can cut
// links to simulate partitions.
type MemNetwork struct {
	mu    sync.RWMutex
	nodes map[string]*Gossip
	cut   map[[2]string]bool
}

// NewMemNetwork returns an empty network.
func NewMemNetwork() *MemNetwork {
	return &MemNetwork{nodes: map[string]*Gossip{}, cut: map[[2]string]bool{}}
}

// Add attaches a node.
func (n *MemNetwork) Add(id string, g *Gossip) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.nodes[id] = g
}

// Remove detaches a node (it is down).
func (n *MemNetwork) Remove(id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.nodes, id)
}

// Partition cuts every link between nodes of different groups.
func (n *MemNetwork) Partition(groups ...[]string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for i, a := range groups {
		for j, b := range groups {
			if i == j {
				continue
			}
			for _, x := range a {
				for _, y := range b {
					n.cut[[2]string{x, y}] = true
				}
			}
		}
	}
}

// Heal restores every link.
func (n *MemNetwork) Heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut = map[[2]string]bool{}
}

// Peers returns the Peers view of node self: every attached node it is
// not cut from counts as alive.
func (n *MemNetwork) Peers(self string) Peers { return memPeers{n: n, self: self} }

func (n *MemNetwork) reach(from, to string) (*Gossip, error) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	g := n.nodes[to]
	if g == nil || n.cut[[2]string{from, to}] {
		return nil, fmt.Errorf("%s unreachable from %s: %w", to, from, errdefs.ErrUnavailable)
	}
	return g, nil
}

type memPeers struct {
	n    *MemNetwork
	self string
}

func (p memPeers) Alive() []string {
	p.n.mu.RLock()
	defer p.n.mu.RUnlock()
	out := make([]string, 0, len(p.n.nodes))
	for id := range p.n.nodes {
		if id != p.self && !p.n.cut[[2]string{p.self, id}] {
			out = append(out, id)
		}
	}
	return out
}

func (p memPeers) Peer(id string) (Peer, error) { return memPeer{n: p.n, from: p.self, to: id}, nil }

type memPeer struct {
	n        *MemNetwork
	from, to string
}

func (p memPeer) ID() string { return p.to }

func (p memPeer) account(sent, received int) {
	if g, err := p.n.reach(p.to, p.from); err == nil {
		g.Counters.Bytes(p.to, sent, received)
	}
}

func docsSize(docs []WireDoc) int {
	n := 0
	for _, d := range docs {
		m := protowire.SizeBytes(len(d.Key)) + protowire.SizeBytes(len(d.Data)) + 2
		n += protowire.SizeBytes(m) + 1
	}
	return n
}

func (p memPeer) Push(ctx context.Context, docs []WireDoc) (int, error) {
	g, err := p.n.reach(p.from, p.to)
	if err != nil {
		return 0, err
	}
	rej, err := g.HandlePush(ctx, p.from, docs)
	p.account(docsSize(docs), 3)
	return rej, err
}

func (p memPeer) Root(ctx context.Context, mine mst.Hash, lastSync time.Time) (mst.Hash, time.Time, error) {
	g, err := p.n.reach(p.from, p.to)
	if err != nil {
		return mst.Hash{}, time.Time{}, err
	}
	// A root and a fixed64 time each way.
	p.account(len(mine)+2+9, len(mine)+2+9)
	root, last := g.HandleRoot(ctx, p.from, lastSync)
	return root, last, nil
}

func (p memPeer) GetNodes(_ context.Context, hs []mst.Hash) ([][]byte, error) {
	g, err := p.n.reach(p.from, p.to)
	if err != nil {
		return nil, err
	}
	nodes, err := g.HandleGetNodes(hs)
	recv := 0
	for _, b := range nodes {
		recv += protowire.SizeBytes(len(b)) + 1
	}
	p.account(len(hs)*(len(mst.Hash{})+2), recv)
	return nodes, err
}

func (p memPeer) GetDocs(_ context.Context, keys []string) ([]WireDoc, error) {
	g, err := p.n.reach(p.from, p.to)
	if err != nil {
		return nil, err
	}
	docs, err := g.HandleGetDocs(p.from, keys)
	sent := 0
	for _, k := range keys {
		sent += protowire.SizeBytes(len(k)) + 1
	}
	p.account(sent, docsSize(docs))
	return docs, err
}

func (p memPeer) PullFrom(ctx context.Context, root mst.Hash, after []byte) (int, mst.Hash, error) {
	g, err := p.n.reach(p.from, p.to)
	if err != nil {
		return 0, mst.Hash{}, err
	}
	n, theirs, err := g.HandlePullFrom(ctx, p.from, root, after)
	p.account(len(root)+2+protowire.SizeBytes(len(after))+1, 3+len(theirs)+2)
	return n, theirs, err
}

func (p memPeer) Tail(_ context.Context, after []byte, limit int) ([]mst.Entry, bool, error) {
	g, err := p.n.reach(p.from, p.to)
	if err != nil {
		return nil, false, err
	}
	entries, truncated, err := g.HandleTail(after, limit)
	recv := 2
	for _, e := range entries {
		m := protowire.SizeBytes(len(e.Key)) + protowire.SizeBytes(len(e.Value)) + 2
		recv += protowire.SizeBytes(m) + 1
	}
	p.account(protowire.SizeBytes(len(after))+1+3, recv)
	return entries, truncated, err
}
