package gossip

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/mst"
	"github.com/shoal-dev/shoal/pkg/store"
)

// Peer is a remote node as the gossip layer calls it. Implementations
// account the bytes they move in the Counters they were given.
type Peer interface {
	ID() string
	Push(ctx context.Context, docs []WireDoc) (rejected int, err error)
	// Root exchanges roots and the times each side last completed a round
	// with anyone.
	Root(ctx context.Context, mine mst.Hash, lastSync time.Time) (mst.Hash, time.Time, error)
	GetNodes(ctx context.Context, hs []mst.Hash) ([][]byte, error)
	GetDocs(ctx context.Context, keys []string) ([]WireDoc, error)
	// Tail returns the peer's index entries after a key (see View.Tail).
	Tail(ctx context.Context, after []byte, limit int) ([]mst.Entry, bool, error)
	// PullFrom asks the peer to pull from this node (the second half of a
	// round), trying the tail after `after` first when it is set; it
	// returns the entries the peer fetched and its root afterwards.
	PullFrom(ctx context.Context, root mst.Hash, after []byte) (int, mst.Hash, error)
}

// tailLimit bounds a tail exchange: past it, walking the tree is cheaper.
const tailLimit = 1024

// Peers tells the gossip layer whom it can talk to.
type Peers interface {
	// Alive returns the IDs of live peers, excluding this node.
	Alive() []string
	// Peer returns a handle on a peer.
	Peer(id string) (Peer, error)
}

// WireDoc is a document in its canonical encoding, as peers exchange it.
type WireDoc struct {
	Key  string
	Data []byte
}

// Config tunes gossip. The defaults aim at write-to-everywhere within a
// second on clusters of tens of nodes.
type Config struct {
	// Fanout is how many random peers each push round reaches.
	Fanout int
	// PushRounds is how many rounds a change is pushed for.
	PushRounds int
	// PushInterval spaces the retransmission rounds.
	PushInterval time.Duration
	// PushDelay batches changes committed close together into one push.
	PushDelay time.Duration
	// MaxPushDocs bounds the documents in one push message.
	MaxPushDocs int
	// AntiEntropyInterval spaces anti-entropy rounds.
	AntiEntropyInterval time.Duration
	// RPCTimeout bounds every call to a peer. A peer that went away
	// without being declared dead yet must not stall a loop for long.
	RPCTimeout time.Duration
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		Fanout:              3,
		PushRounds:          3,
		PushInterval:        200 * time.Millisecond,
		PushDelay:           5 * time.Millisecond,
		MaxPushDocs:         512,
		AntiEntropyInterval: time.Second,
		RPCTimeout:          time.Second,
	}
}

// Gossip runs push and anti-entropy for one node.
type Gossip struct {
	cfg   Config
	st    *store.Store
	peers Peers
	log   *slog.Logger
	// Counters is shared with the transport, which adds the bytes.
	Counters *Counters

	mu      sync.Mutex
	hot     map[string]int  // key -> push rounds left
	pushing map[string]bool // peers with a push in flight
	kick    chan struct{}
	rnd     *rand.Rand

	// Accept, when set, filters documents received from peers before they
	// are merged (statd uses it to drop expired tombstones).
	Accept func(key string, d crdt.Doc) bool
	// PeerLastSync, when set, is told when a peer last completed a round
	// before this node exchanges anything with it, so a node that was away
	// too long can drop what it may hold stale first (see statd).
	PeerLastSync func(ctx context.Context, peer string, last time.Time)

	// watermarks holds, per peer, the greatest index key the two held the
	// last time their trees were equal (guarded by mu).
	watermarks map[string][]byte

	// from is the revision the change watch starts after: the store's
	// revision when the Gossip was made, so no change between New and Run
	// goes unpushed.
	from uint64

	// synced is when this node last completed a round, persisted by the
	// caller across restarts (SetLastSync).
	synced atomic.Int64
}

// SetLastSync seeds the time of the last completed round (from disk).
func (g *Gossip) SetLastSync(t time.Time) {
	if !t.IsZero() {
		g.synced.Store(t.UnixNano())
	}
}

// LastSync returns when this node last completed a round with any peer.
func (g *Gossip) LastSync() time.Time {
	var t time.Time
	if ns := g.synced.Load(); ns != 0 {
		t = time.Unix(0, ns)
	}
	if c := g.Counters.LastSync(); c.After(t) {
		return c
	}
	return t
}

// New returns a Gossip over st.
func New(cfg Config, st *store.Store, peers Peers, counters *Counters, log *slog.Logger) *Gossip {
	def := DefaultConfig()
	if cfg.Fanout <= 0 {
		cfg.Fanout = def.Fanout
	}
	if cfg.PushRounds <= 0 {
		cfg.PushRounds = def.PushRounds
	}
	if cfg.PushInterval <= 0 {
		cfg.PushInterval = def.PushInterval
	}
	if cfg.PushDelay < 0 {
		cfg.PushDelay = 0
	}
	if cfg.MaxPushDocs <= 0 {
		cfg.MaxPushDocs = def.MaxPushDocs
	}
	if cfg.AntiEntropyInterval <= 0 {
		cfg.AntiEntropyInterval = def.AntiEntropyInterval
	}
	if cfg.RPCTimeout <= 0 {
		cfg.RPCTimeout = def.RPCTimeout
	}
	if counters == nil {
		counters = NewCounters()
	}
	return &Gossip{
		cfg: cfg, st: st, peers: peers, log: log, Counters: counters,
		hot: map[string]int{}, pushing: map[string]bool{}, kick: make(chan struct{}, 1), from: st.Revision(),
		watermarks: map[string][]byte{},
		rnd:        rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
	}
}

// Run pushes changes and runs anti-entropy until ctx ends.
func (g *Gossip) Run(ctx context.Context) error {
	errc := make(chan error, 3)
	go func() { errc <- g.watch(ctx) }()
	go func() { errc <- g.pushLoop(ctx) }()
	go func() { errc <- g.antiEntropyLoop(ctx) }()
	err := <-errc
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// watch marks every committed change hot.
func (g *Gossip) watch(ctx context.Context) error {
	from := g.from
	for {
		err := g.st.Watch(ctx, "", from, func(b store.WatchBatch) error {
			from = b.Rev
			if len(b.Events) == 0 {
				return nil
			}
			g.mu.Lock()
			for _, e := range b.Events {
				g.hot[e.Key] = g.cfg.PushRounds
			}
			g.mu.Unlock()
			select {
			case g.kick <- struct{}{}:
			default:
			}
			return nil
		})
		if ctx.Err() != nil || errors.Is(err, store.ErrClosed) {
			return nil
		}
		// Fell behind the change log: anti-entropy repairs what we miss.
		g.log.Warn("gossip watch restarted", "err", err)
		from = g.st.Revision()
	}
}

func (g *Gossip) pushLoop(ctx context.Context) error {
	tick := time.NewTicker(g.cfg.PushInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-g.kick:
			if g.cfg.PushDelay > 0 {
				select {
				case <-time.After(g.cfg.PushDelay):
				case <-ctx.Done():
					return nil
				}
			}
		case <-tick.C:
		}
		g.pushRound(ctx)
	}
}

// pushRound sends every hot document to Fanout random live peers and
// counts the round against each.
func (g *Gossip) pushRound(ctx context.Context) {
	g.mu.Lock()
	if len(g.hot) == 0 {
		g.mu.Unlock()
		return
	}
	keys := make([]string, 0, len(g.hot))
	for k, left := range g.hot {
		keys = append(keys, k)
		if left <= 1 {
			delete(g.hot, k)
		} else {
			g.hot[k] = left - 1
		}
	}
	g.mu.Unlock()

	docs := make([]WireDoc, 0, len(keys))
	for _, k := range keys {
		rec, err := g.st.GetRaw(k)
		if err != nil || rec.Doc.IsEmpty() {
			continue
		}
		docs = append(docs, WireDoc{Key: k, Data: rec.Doc.Marshal()})
	}
	// Pushes run in the background, one at a time per peer, so a peer that
	// stopped answering delays neither the next round nor the others.
	for _, id := range g.pickIdle(g.cfg.Fanout) {
		done := func() {
			g.mu.Lock()
			delete(g.pushing, id)
			g.mu.Unlock()
		}
		p, err := g.peers.Peer(id)
		if err != nil {
			done()
			continue
		}
		go func() {
			defer done()
			for start := 0; start < len(docs); start += g.cfg.MaxPushDocs {
				chunk := docs[start:min(start+g.cfg.MaxPushDocs, len(docs))]
				cctx, cancel := context.WithTimeout(ctx, g.cfg.RPCTimeout)
				rejected, err := p.Push(cctx, chunk)
				cancel()
				if err != nil {
					g.Counters.fail(id, err)
					return
				}
				g.Counters.entries(id, len(chunk), 0)
				g.Counters.rejected(id, rejected)
			}
		}()
	}
}

// pickIdle returns up to n random live peers that no push is under way
// to, marked as pushing. Skipping a busy peer that pick chose would use
// up one of a change's rounds without sending it: a node that receives
// many changes at once runs a round for each, and its first pushes are
// still under way.
func (g *Gossip) pickIdle(n int) []string {
	alive := g.shuffledAlive()
	g.mu.Lock()
	defer g.mu.Unlock()
	var idle []string
	for _, id := range alive {
		if len(idle) == n {
			break
		}
		if !g.pushing[id] {
			g.pushing[id] = true
			idle = append(idle, id)
		}
	}
	return idle
}

// pick returns up to n distinct random live peers.
func (g *Gossip) pick(n int) []string {
	alive := g.shuffledAlive()
	if len(alive) > n {
		alive = alive[:n]
	}
	return alive
}

// shuffledAlive returns the live peers in random order.
func (g *Gossip) shuffledAlive() []string {
	alive := g.peers.Alive()
	g.mu.Lock()
	g.rnd.Shuffle(len(alive), func(i, j int) { alive[i], alive[j] = alive[j], alive[i] })
	g.mu.Unlock()
	return alive
}

func (g *Gossip) antiEntropyLoop(ctx context.Context) error {
	for {
		// Jitter keeps nodes from syncing in lockstep.
		g.mu.Lock()
		d := g.cfg.AntiEntropyInterval/2 + time.Duration(g.rnd.Int64N(int64(g.cfg.AntiEntropyInterval)))
		g.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(d):
		}
		targets := g.pick(1)
		if len(targets) == 0 {
			continue
		}
		res, err := g.SyncWith(ctx, targets[0])
		if err != nil && ctx.Err() == nil {
			g.log.Debug("anti-entropy round failed", "peer", targets[0], "err", err)
			continue
		}
		g.log.Debug("anti-entropy round", "peer", targets[0], "equal", res.Equal, "pulled", res.Pulled, "pushed", res.Pushed, "duration", res.Duration)
	}
}

// RoundResult describes one anti-entropy round.
type RoundResult struct {
	Equal    bool
	Pulled   int  // entries this node fetched
	Pushed   int  // entries the peer fetched from us
	Tail     bool // the tails since the peers were last equal sufficed
	Duration time.Duration
}

// SyncWith runs one two-way anti-entropy round with a peer.
//
// Roots are compared first; equal roots end the round. Otherwise, if the
// two were equal before, each side fetches the other's index tail since
// then: the index is ordered by write time, so that is exactly what either
// missed, unless a write with an older timestamp arrived late. If the
// roots are equal after that, the round cost little more than the payload.
// If not, each side walks the other's tree under the differing subtrees.
func (g *Gossip) SyncWith(ctx context.Context, id string) (RoundResult, error) {
	start := time.Now()
	p, err := g.peers.Peer(id)
	if err != nil {
		return RoundResult{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*g.cfg.RPCTimeout)
	defer cancel()
	root := g.st.Root()
	rctx, rcancel := context.WithTimeout(ctx, g.cfg.RPCTimeout)
	theirs, theirSync, err := p.Root(rctx, root, g.LastSync())
	rcancel()
	if err != nil {
		g.Counters.fail(id, err)
		return RoundResult{}, err
	}
	if g.PeerLastSync != nil {
		g.PeerLastSync(ctx, id, theirSync)
		root = g.st.Root()
	}
	if theirs == root {
		g.markEqual(id)
		g.Counters.synced(id)
		return RoundResult{Equal: true, Duration: time.Since(start)}, nil
	}
	var res RoundResult
	if w := g.watermark(id); w != nil {
		n, complete, err := g.pullTail(ctx, p, w)
		res.Pulled += n
		if err == nil && complete {
			pushed, after, err := p.PullFrom(ctx, g.st.Root(), w)
			res.Pushed += pushed
			if err == nil && after == g.st.Root() {
				g.markEqual(id)
				g.Counters.synced(id)
				res.Tail, res.Duration = true, time.Since(start)
				return res, nil
			}
		}
	}
	// The peer's tree may change under a long walk (a node it names is
	// gone by the time it is fetched): start again from its new root.
	var pulled int
	for attempt := 0; ; attempt++ {
		pulled, err = g.pull(ctx, p, theirs)
		if err == nil || attempt == 2 || ctx.Err() != nil {
			break
		}
		rctx, rcancel := context.WithTimeout(ctx, g.cfg.RPCTimeout)
		theirs, _, err = p.Root(rctx, g.st.Root(), g.LastSync())
		rcancel()
		if err != nil {
			break
		}
	}
	res.Pulled += pulled
	if err != nil {
		g.Counters.fail(id, err)
		return res, err
	}
	// This node now holds everything the peer held: that is what "in sync"
	// means for the last-sync time, whether or not the peer's half below
	// succeeds.
	g.Counters.synced(id)
	pushed, after, err := p.PullFrom(ctx, g.st.Root(), nil)
	res.Pushed += pushed
	res.Duration = time.Since(start)
	if err != nil {
		g.Counters.fail(id, err)
		return res, fmt.Errorf("peer's half of the round: %w", err)
	}
	if after == g.st.Root() {
		g.markEqual(id)
	}
	return res, nil
}

// watermark returns the index key this node and peer shared when last
// equal, nil if unknown.
func (g *Gossip) watermark(peer string) []byte {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.watermarks[peer]
}

// markEqual records that this node's tree equals peer's right now.
func (g *Gossip) markEqual(peer string) {
	view, err := g.st.View()
	if err != nil {
		return
	}
	defer view.Close()
	last, err := view.Last()
	if err != nil || last == nil {
		return
	}
	g.mu.Lock()
	g.watermarks[peer] = last
	g.mu.Unlock()
}

// pullTail fetches the peer's index tail after `after`, then the documents
// behind the entries this node lacks. complete is false when the tail was
// too long to take whole.
func (g *Gossip) pullTail(ctx context.Context, p Peer, after []byte) (n int, complete bool, err error) {
	entries, truncated, err := p.Tail(ctx, after, tailLimit)
	if err != nil || truncated {
		return 0, false, err
	}
	n, err = g.fetchMissing(ctx, p, entries)
	return n, err == nil, err
}

// fetchMissing fetches and merges the documents behind index entries this
// node lacks.
func (g *Gossip) fetchMissing(ctx context.Context, p Peer, entries []mst.Entry) (int, error) {
	view, err := g.st.View()
	if err != nil {
		return 0, err
	}
	var keys []string
	seen := make(map[string]bool, len(entries))
	for _, e := range entries {
		if have, err := view.HasEntry(e.Key, e.Value); err != nil || have {
			continue
		}
		k, err := store.DocKeyOfIndex(e.Key)
		if err != nil || seen[k] {
			continue
		}
		seen[k] = true
		keys = append(keys, k)
	}
	view.Close()
	return g.fetchDocs(ctx, p, keys)
}

// pull fetches and merges what the peer's tree at root has and ours lacks.
func (g *Gossip) pull(ctx context.Context, p Peer, root mst.Hash) (int, error) {
	view, err := g.st.View()
	if err != nil {
		return 0, err
	}
	defer view.Close()
	entries, _, err := mst.Pull(ctx, view.Tree(), view.HasNode, root, p.GetNodes)
	if err != nil {
		return 0, fmt.Errorf("pull tree from %s: %w", p.ID(), err)
	}
	if len(entries) == 0 {
		return 0, nil
	}
	keys := make([]string, 0, len(entries))
	seen := make(map[string]bool, len(entries))
	for _, e := range entries {
		k, err := store.DocKeyOfIndex(e.Key)
		if err != nil || seen[k] {
			continue
		}
		seen[k] = true
		keys = append(keys, k)
	}
	return g.fetchDocs(ctx, p, keys)
}

// fetchDocs fetches documents from a peer in batches and merges them.
func (g *Gossip) fetchDocs(ctx context.Context, p Peer, keys []string) (int, error) {
	total := 0
	for start := 0; start < len(keys); start += g.cfg.MaxPushDocs {
		batch := keys[start:min(start+g.cfg.MaxPushDocs, len(keys))]
		docs, err := p.GetDocs(ctx, batch)
		if err != nil {
			return total, fmt.Errorf("get docs from %s: %w", p.ID(), err)
		}
		g.Counters.entries(p.ID(), 0, len(docs))
		rejected, err := g.merge(ctx, docs)
		g.Counters.rejected(p.ID(), rejected)
		if err != nil {
			return total, err
		}
		total += len(docs)
	}
	return total, nil
}

// merge decodes and merges documents from a peer; it returns how many it
// refused (malformed, or beyond the clock skew bound).
func (g *Gossip) merge(ctx context.Context, docs []WireDoc) (rejected int, err error) {
	batch := make([]store.KeyedDoc, 0, len(docs))
	for _, w := range docs {
		d, err := crdt.Unmarshal(w.Data)
		if err != nil || store.ValidateKey(w.Key) != nil {
			rejected++
			continue
		}
		if g.Accept != nil && !g.Accept(w.Key, d) {
			continue
		}
		batch = append(batch, store.KeyedDoc{Key: w.Key, Doc: d})
	}
	for _, res := range g.st.MergeBatch(ctx, batch) {
		if res.Err != nil {
			if errors.Is(res.Err, store.ErrClosed) || errors.Is(res.Err, context.Canceled) {
				return rejected, res.Err
			}
			rejected++
		}
	}
	return rejected, nil
}

// HandlePush merges documents pushed by a peer.
func (g *Gossip) HandlePush(ctx context.Context, from string, docs []WireDoc) (int, error) {
	rejected, err := g.merge(ctx, docs)
	g.Counters.entries(from, 0, len(docs))
	g.Counters.rejected(from, rejected)
	return rejected, err
}

// HandleRoot answers the start of a peer's anti-entropy round with this
// node's root and last completed round.
func (g *Gossip) HandleRoot(ctx context.Context, from string, theirSync time.Time) (mst.Hash, time.Time) {
	if g.PeerLastSync != nil {
		g.PeerLastSync(ctx, from, theirSync)
	}
	return g.st.Root(), g.LastSync()
}

// HandleTail serves a peer's tail request.
func (g *Gossip) HandleTail(after []byte, limit int) ([]mst.Entry, bool, error) {
	if limit <= 0 || limit > tailLimit {
		limit = tailLimit
	}
	view, err := g.st.View()
	if err != nil {
		return nil, false, err
	}
	defer view.Close()
	return view.Tail(after, limit)
}

// HandleGetNodes serves tree nodes to a pulling peer.
func (g *Gossip) HandleGetNodes(hs []mst.Hash) ([][]byte, error) {
	view, err := g.st.View()
	if err != nil {
		return nil, err
	}
	defer view.Close()
	return view.Nodes(hs)
}

// HandleGetDocs serves documents to a pulling peer.
func (g *Gossip) HandleGetDocs(from string, keys []string) ([]WireDoc, error) {
	out := make([]WireDoc, 0, len(keys))
	for _, k := range keys {
		rec, err := g.st.GetRaw(k)
		if err != nil {
			return nil, err
		}
		if rec.Doc.IsEmpty() {
			continue
		}
		out = append(out, WireDoc{Key: k, Data: rec.Doc.Marshal()})
	}
	g.Counters.entries(from, len(out), 0)
	return out, nil
}

// HandlePullFrom runs the second half of a peer's round: pull from it,
// by the tail after `after` when given and enough, else by walking its
// tree. It returns the entries fetched and this node's root afterwards.
func (g *Gossip) HandlePullFrom(ctx context.Context, from string, root mst.Hash, after []byte) (int, mst.Hash, error) {
	if root == g.st.Root() {
		g.markEqual(from)
		return 0, root, nil
	}
	p, err := g.peers.Peer(from)
	if err != nil {
		return 0, g.st.Root(), err
	}
	n := 0
	if after != nil {
		m, complete, err := g.pullTail(ctx, p, after)
		n += m
		if err == nil && complete && g.st.Root() == root {
			g.markEqual(from)
			return n, root, nil
		}
	}
	m, err := g.pull(ctx, p, root)
	n += m
	if err == nil && g.st.Root() == root {
		g.markEqual(from)
	}
	return n, g.st.Root(), err
}
