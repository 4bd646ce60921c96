package gossip

import (
	"maps"
	"sync"
	"time"
)

// PeerStats are the sync counters of one peer, as this node saw them.
type PeerStats struct {
	BytesSent, BytesReceived     uint64
	EntriesSent, EntriesReceived uint64
	Rounds                       uint64 // completed anti-entropy rounds
	Rejected                     uint64 // documents refused
	Failures                     uint64
	LastSync                     time.Time
	LastError                    string
}

// Counters accumulates per-peer sync statistics; it is safe for
// concurrent use and shared between Gossip and its transport.
type Counters struct {
	mu    sync.Mutex
	peers map[string]*PeerStats
}

// NewCounters returns empty counters.
func NewCounters() *Counters { return &Counters{peers: map[string]*PeerStats{}} }

func (c *Counters) get(id string) *PeerStats {
	p := c.peers[id]
	if p == nil {
		p = &PeerStats{}
		c.peers[id] = p
	}
	return p
}

// Bytes records traffic with a peer; transports call it.
func (c *Counters) Bytes(id string, sent, received int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.get(id)
	p.BytesSent += uint64(sent)
	p.BytesReceived += uint64(received)
}

func (c *Counters) entries(id string, sent, received int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.get(id)
	p.EntriesSent += uint64(sent)
	p.EntriesReceived += uint64(received)
}

func (c *Counters) rejected(id string, n int) {
	if n == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.get(id).Rejected += uint64(n)
}

func (c *Counters) synced(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.get(id)
	p.Rounds++
	p.LastSync = time.Now()
	p.LastError = ""
}

func (c *Counters) fail(id string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.get(id)
	p.Failures++
	p.LastError = err.Error()
}

// Snapshot copies the counters.
func (c *Counters) Snapshot() map[string]PeerStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]PeerStats, len(c.peers))
	for id, p := range maps.All(c.peers) {
		out[id] = *p
	}
	return out
}

// LastSync returns the latest completed round with any peer.
func (c *Counters) LastSync() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	var t time.Time
	for _, p := range c.peers {
		if p.LastSync.After(t) {
			t = p.LastSync
		}
	}
	return t
}
