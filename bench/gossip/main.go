// Command gossip measures pkg/gossip in one process, with the real store,
// sync and membership code and in-memory transports, and prints a Markdown
// section on stdout (docs/BENCHMARKS.md style: absolute figures next to a
// baseline computed or measured in the same run).
//
//   - Spread: N nodes (store.Store in memory, gossip.Gossip with the
//     default config, member.List for liveness) wired by gossip.MemNetwork
//     and a direct-call member.Transport. Writes, one at a time on random
//     nodes, are timed until 50%, 99%, 99.9% and 100% of the nodes hold
//     them, against the Serf gossip model for the same N, fanout and
//     interval.
//   - Anti-entropy: one Gossip.SyncWith between two stores of -docs
//     documents that differ in d documents, clustered (recent writes one
//     side lacks) or scattered (old documents updated on one side), with
//     the bytes gossip.Counters saw, against the payload floor, a plain
//     fanout-16 MST keyed by document key over the same documents, and a
//     full-state exchange.
//
// BENCH_QUICK=1 in the environment scales the defaults down (bench/run.sh).
package main

import (
	"context"
	"crypto/sha256"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/gossip"
	"github.com/shoal-dev/shoal/pkg/hlc"
	"github.com/shoal-dev/shoal/pkg/member"
	"github.com/shoal-dev/shoal/pkg/mst"
	"github.com/shoal-dev/shoal/pkg/store"
)

type config struct {
	nodes      []int
	writes     int
	pause      time.Duration
	timeout    time.Duration
	warmup     time.Duration
	docs       int
	ds         []int
	reps       int
	valueSize  int
	skipSpread bool
	skipAE     bool
	quiet      time.Duration
}

func main() {
	quick := os.Getenv("BENCH_QUICK") == "1"
	def := config{nodes: []int{100, 30}, writes: 30, docs: 100_000, ds: []int{1, 10, 100, 1000}, reps: 5}
	if quick {
		def = config{nodes: []int{30}, writes: 10, docs: 20_000, ds: []int{1, 100}, reps: 2}
	}
	var c config
	var nodes, ds string
	flag.StringVar(&nodes, "nodes", joinInts(def.nodes), "cluster sizes for the spread table")
	flag.IntVar(&c.writes, "writes", def.writes, "writes timed per cluster size")
	flag.DurationVar(&c.pause, "pause", 300*time.Millisecond, "pause after a write reached every node (plus up to 100ms of jitter), so writes do not overlap")
	flag.DurationVar(&c.timeout, "timeout", 10*time.Second, "give up on a write that has not reached every node after this long")
	flag.DurationVar(&c.warmup, "warmup", 3*time.Second, "time the simulated cluster runs before the first write")
	flag.IntVar(&c.docs, "docs", def.docs, "documents in each store of the anti-entropy table")
	flag.StringVar(&ds, "d", joinInts(def.ds), "numbers of differing documents in the anti-entropy table")
	flag.IntVar(&c.reps, "reps", def.reps, "repetitions of each anti-entropy case")
	flag.IntVar(&c.valueSize, "value-size", 100, "bytes in the one field of each anti-entropy document")
	flag.BoolVar(&c.skipSpread, "skip-spread", false, "skip the spread table")
	flag.BoolVar(&c.skipAE, "skip-ae", false, "skip the anti-entropy table")
	flag.DurationVar(&c.quiet, "quiet-wait", 10*time.Second, "before each measurement, wait up to this long for other processes to use less than 0.25 CPUs")
	seed := flag.Uint64("seed", 1, "random seed of the workload (the protocols seed themselves)")
	flag.Parse()
	c.nodes, c.ds = parseInts(nodes), parseInts(ds)
	if c.writes < 1 || c.reps < 1 || c.docs < 1 || c.valueSize < 1 {
		fail("-writes, -reps, -docs and -value-size must be positive")
	}
	for _, d := range c.ds {
		if d < 1 || d > c.docs {
			fail("-d values must be in [1, -docs]")
		}
	}
	rng := rand.New(rand.NewPCG(*seed, 0x60551))

	fmt.Printf("## Gossip and anti-entropy (pkg/gossip, in one process)\n\n")
	fmt.Printf("Machine: %d CPUs, %s/%s, %s. Stores are store.Store with InMemory (Pebble on a memory file system); transports are direct calls (gossip.MemNetwork, which counts the protobuf payload bytes each call would send, and a direct-call member.Transport).\n\n",
		runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version())
	if !c.skipSpread {
		spreadSection(c, rng)
	}
	if !c.skipAE {
		aeSection(c, rng)
	}
}

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// ---- spread: time until a write is everywhere ----

// memberNet connects member.Lists by direct calls. lists is filled before
// any List runs and only read afterwards.
type memberNet struct{ lists map[string]*member.List }

type memberTransport struct {
	self string
	net  *memberNet
}

func (t memberTransport) Ping(ctx context.Context, target member.Member, updates []member.Update) ([]member.Update, error) {
	l := t.net.lists[target.ID]
	if l == nil {
		return nil, fmt.Errorf("unknown member %s", target.ID)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return l.HandlePing(t.self, updates), nil
}

func (t memberTransport) PingReq(ctx context.Context, via, target member.Member, updates []member.Update) (bool, []member.Update, error) {
	l := t.net.lists[via.ID]
	if l == nil {
		return false, nil, fmt.Errorf("unknown member %s", via.ID)
	}
	acked, out := l.HandlePingReq(ctx, t.self, target, updates)
	return acked, out, nil
}

// alivePeers is gossip.Peers with statd's rule: the live peers are the
// members this node's list holds Alive (suspects are left out); calls go
// over the MemNetwork.
type alivePeers struct {
	self string
	ml   *member.List
	net  gossip.Peers
}

func (p alivePeers) Alive() []string {
	ms := p.ml.Alive()
	out := make([]string, 0, len(ms))
	for _, m := range ms {
		if m.ID != p.self {
			out = append(out, m.ID)
		}
	}
	return out
}

func (p alivePeers) Peer(id string) (gossip.Peer, error) { return p.net.Peer(id) }

type simNode struct {
	id string
	st *store.Store
	g  *gossip.Gossip
	ml *member.List
}

// tracker records when each node first holds the key being timed.
type tracker struct {
	mu   sync.Mutex
	key  string
	t0   time.Time
	at   []time.Duration // -1: not yet
	got  int
	done chan struct{}
}

func (t *tracker) begin(key string, n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.key, t.got, t.done = key, 0, make(chan struct{})
	t.at = slices.Repeat([]time.Duration{-1}, n)
	t.t0 = time.Now()
}

func (t *tracker) arrive(key string, node int, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if key != t.key || t.at[node] >= 0 {
		return
	}
	t.at[node] = now.Sub(t.t0)
	t.got++
	if t.got == len(t.at) {
		close(t.done)
	}
}

func (t *tracker) result() []time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.key = ""
	return slices.Clone(t.at)
}

// serfTime is the Serf gossip model's time until fraction f of n nodes
// holds a message: the fraction after round x is 1/(1+(n+1)·e^(−(fanout/2)·x)).
func serfTime(n, fanout int, interval time.Duration, f float64) time.Duration {
	x := (2 / float64(fanout)) * math.Log(float64(n+1)*f/(1-f))
	return time.Duration(x * float64(interval))
}

var fractions = []float64{0.5, 0.99, 0.999, 1}

type spreadResult struct {
	n          int
	times      [][]time.Duration // per fraction, one per write that reached it
	missed     []int             // per fraction, writes that did not reach it in time
	deliveries float64           // documents received per node per write
	bytes      float64           // bytes per write, all nodes
	suspicions uint64
	alive      int     // smallest alive set any node saw before the writes
	background float64 // CPUs other processes used during the writes
}

func spreadSection(c config, rng *rand.Rand) {
	gcfg := gossip.DefaultConfig()
	mcfg := member.DefaultConfig()
	fmt.Printf("### Spread: time until a write is on every node\n\n")
	fmt.Printf("N nodes in one process, each a store (in memory), a gossip.Gossip with the default config (fanout %d, %d push rounds, push interval %v, push delay %v, anti-entropy every %v ± 50%%) and a member.List with the default config (probe interval %v, suspicion timeout %v) whose Alive set is the gossip's peer set, as in statd. After %v of warm-up, %d writes (one 100-byte field, key /bench/<i>), one at a time on a random node, each timed from just before the Put until the K-th node's store watch reports it (the writer counts: K = ⌈f·N⌉, so 99.9%% of 100 or 30 nodes is every node). The next write follows %v (+ up to 100 ms) after the previous one reached every node. Percentiles are nearest-rank: with %d writes, p99 is the slowest write.\n\n",
		gcfg.Fanout, gcfg.PushRounds, gcfg.PushInterval, gcfg.PushDelay, gcfg.AntiEntropyInterval,
		mcfg.ProbeInterval, mcfg.SuspicionTimeout, c.warmup, c.writes, c.pause, c.writes)
	fmt.Printf("Baseline: the Serf gossip model for the same N, fanout and interval — fraction after round x ≈ 1/(1+(N+1)·e^(−(fanout/2)·x)), so time to fraction f = interval·(2/fanout)·ln((N+1)·f/(1−f)) (undefined for f = 1).\n\n")
	fmt.Printf("| N | fraction (nodes) | p50 | p99 | max | Serf model | p50 ÷ model | p99 ÷ model | writes that missed it |\n")
	fmt.Printf("|---:|---|---:|---:|---:|---:|---:|---:|---:|\n")
	var results []spreadResult
	for _, n := range c.nodes {
		fmt.Fprintf(os.Stderr, "gossip bench: spread, %d nodes\n", n)
		r := runSpread(c, n, gcfg, mcfg, rng)
		results = append(results, r)
		for fi, f := range fractions {
			k := need(f, n)
			row := fmt.Sprintf("| %d | %s (%d) | ", n, pct(f), k)
			ts := r.times[fi]
			if len(ts) == 0 {
				row += "– | – | – | "
			} else {
				row += fmt.Sprintf("%s | %s | %s | ", dur(pctl(ts, 0.5)), dur(pctl(ts, 0.99)), dur(slices.Max(ts)))
			}
			if f < 1 {
				m := serfTime(n, gcfg.Fanout, gcfg.PushInterval, f)
				row += dur(m) + " | "
				if len(ts) > 0 {
					row += fmt.Sprintf("%.2f× | %.2f× | ", ratio(pctl(ts, 0.5), m), ratio(pctl(ts, 0.99), m))
				} else {
					row += "– | – | "
				}
			} else {
				row += "– | – | – | "
			}
			row += fmt.Sprintf("%d of %d |", r.missed[fi], c.writes)
			fmt.Println(row)
		}
	}
	fmt.Println()
	for _, r := range results {
		fmt.Printf("- N = %d: each node received each write %.1f times (push redundancy, anti-entropy pulls included); %.1f KiB of gossip traffic per write over all nodes (payload bytes, both directions, anti-entropy root exchanges included); %d suspicions raised during the run (smallest live set any node saw before the first write: %d of %d); other processes on the machine used %.2f CPUs on average during the writes.\n",
			r.n, r.deliveries, r.bytes/1024, r.suspicions, r.alive, r.n, r.background)
	}
	fmt.Println()
	fmt.Printf("Goal: p99 time to 99.9%% ≤ 1.5× the model.")
	for _, r := range results {
		fi := slices.Index(fractions, 0.999)
		if ts := r.times[fi]; len(ts) > 0 && r.missed[fi] == 0 {
			m := serfTime(r.n, gcfg.Fanout, gcfg.PushInterval, 0.999)
			fmt.Printf(" N = %d: %s = %.2f× the model's %s, **%s**.", r.n, dur(pctl(ts, 0.99)), ratio(pctl(ts, 0.99), m), dur(m), metStr(pctl(ts, 0.99) <= m*3/2))
		} else {
			fmt.Printf(" N = %d: **not met** (%d writes never reached 99.9%%).", r.n, r.missed[fi])
		}
	}
	fmt.Printf("\n\nReading: a node pushes a change as soon as it commits it (after the %v push delay), not at the next %v tick, and every receiver commits and pushes on at once, so the first wave crosses the cluster in hops of a few milliseconds (push delay plus a commit), where the model assumes one hop per push interval. The retransmission rounds on the ticks (each node pushes a change to %d peers in each of %d rounds, hence the ≈ %d receptions per node) and anti-entropy catch the few nodes the first wave missed: the slow writes, a tick or two late, are those.\n\n",
		gcfg.PushDelay, gcfg.PushInterval, gcfg.Fanout, gcfg.PushRounds, gcfg.Fanout*gcfg.PushRounds)
}

// need is the number of nodes that make up fraction f of n.
func need(f float64, n int) int {
	return min(n, int(math.Ceil(f*float64(n)-1e-9)))
}

func runSpread(c config, n int, gcfg gossip.Config, mcfg member.Config, rng *rand.Rand) spreadResult {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	net := gossip.NewMemNetwork()
	mnet := &memberNet{lists: map[string]*member.List{}}
	nodes := make([]*simNode, n)
	inc := uint64(time.Now().UnixMilli())
	for i := range nodes {
		id := fmt.Sprintf("n%03d", i+1)
		st, err := store.Open(store.Options{Dir: "/" + id, NodeID: id, InMemory: true, Logger: discard})
		check(err)
		ml := member.New(member.Member{ID: id, Addr: id + ":7470", Incarnation: inc}, mcfg, memberTransport{self: id, net: mnet}, nil, nil, discard)
		mnet.lists[id] = ml
		g := gossip.New(gcfg, st, alivePeers{self: id, ml: ml, net: net.Peers(id)}, nil, discard)
		net.Add(id, g)
		nodes[i] = &simNode{id: id, st: st, g: g, ml: ml}
	}
	for _, a := range nodes {
		for _, b := range nodes {
			a.ml.Add(b.id, b.id+":7470")
		}
	}
	tr := &tracker{}
	ready := make(chan struct{}, n)
	for i, nd := range nodes {
		wg.Go(func() { nd.ml.Run(ctx) })
		wg.Go(func() { nd.g.Run(ctx) })
		wg.Go(func() {
			first := true
			err := nd.st.Watch(ctx, "/bench/", nd.st.Revision(), func(b store.WatchBatch) error {
				now := time.Now()
				if first {
					first = false
					ready <- struct{}{}
				}
				for _, e := range b.Events {
					tr.arrive(e.Key, i, now)
				}
				return nil
			})
			if err != nil && ctx.Err() == nil {
				fmt.Fprintf(os.Stderr, "gossip bench: watch on %s: %v\n", nd.id, err)
			}
		})
	}
	for range n {
		<-ready
	}
	time.Sleep(c.warmup)

	res := spreadResult{n: n, times: make([][]time.Duration, len(fractions)), missed: make([]int, len(fractions)), alive: n}
	for _, nd := range nodes {
		res.alive = min(res.alive, len(nd.ml.Alive()))
	}
	waitQuiet(c.quiet)
	load0 := takeLoad()
	before := totals(nodes)
	susp0 := suspicions(nodes)
	value := strings.Repeat("x", 100)
	for w := range c.writes {
		key := fmt.Sprintf("/bench/%d", w)
		writer := rng.IntN(n)
		tr.begin(key, n)
		_, err := nodes[writer].st.Put(ctx, key, map[string]crdt.Value{"v": crdt.String(value)})
		check(err)
		select {
		case <-tr.done:
		case <-time.After(c.timeout):
		}
		at := tr.result()
		var got []time.Duration
		for _, d := range at {
			if d >= 0 {
				got = append(got, d)
			}
		}
		slices.Sort(got)
		for fi, f := range fractions {
			if k := need(f, n); k <= len(got) {
				res.times[fi] = append(res.times[fi], got[k-1])
			} else {
				res.missed[fi]++
			}
		}
		if len(got) < n {
			fmt.Fprintf(os.Stderr, "gossip bench: write %d reached %d of %d nodes in %v\n", w, len(got), n, c.timeout)
		}
		time.Sleep(c.pause + time.Duration(rng.Int64N(int64(100*time.Millisecond))))
	}
	res.background = load0.others(takeLoad())
	after := totals(nodes)
	res.deliveries = float64(after.entries-before.entries) / float64(c.writes) / float64(n-1)
	res.bytes = float64(after.bytes-before.bytes) / float64(c.writes)
	res.suspicions = suspicions(nodes) - susp0

	cancel()
	wg.Wait()
	for _, nd := range nodes {
		nd.st.Close()
	}
	return res
}

type traffic struct{ bytes, entries uint64 }

func totals(nodes []*simNode) traffic {
	var t traffic
	for _, nd := range nodes {
		for _, p := range nd.g.Counters.Snapshot() {
			t.bytes += p.BytesSent + p.BytesReceived
			t.entries += p.EntriesReceived
		}
	}
	return t
}

func suspicions(nodes []*simNode) uint64 {
	var s uint64
	for _, nd := range nodes {
		s += nd.ml.Stats().Suspicions
	}
	return s
}

// ---- anti-entropy: bytes of one round ----

// aePair is two stores that gossip over a MemNetwork; their Gossips are
// not Run: rounds happen only when the benchmark calls SyncWith.
type aePair struct {
	st [2]*store.Store
	g  [2]*gossip.Gossip
}

var sideID = [2]string{"a", "b"}

// wireDocs is what gossip.MemNetwork counts for a GetDocs response (one
// repeated message of key and data): the same framing here keeps the
// baselines comparable with the counters.
func wireDocs(keys []string, data [][]byte) int {
	n := 0
	for i := range keys {
		m := protowire.SizeBytes(len(keys[i])) + protowire.SizeBytes(len(data[i])) + 2
		n += protowire.SizeBytes(m) + 1
	}
	return n
}

// wireKeys is what MemNetwork counts for a GetDocs request.
func wireKeys(keys []string) int {
	n := 0
	for _, k := range keys {
		n += protowire.SizeBytes(len(k)) + 1
	}
	return n
}

// rootExchange is what MemNetwork counts for a Root call: a root and a
// time each way.
const rootExchange = 2 * (32 + 2 + 9)

// docKey spreads keys over the key space like random IDs (task IDs, node
// IDs): key order is unrelated to write order. splitmix64 is a bijection,
// so keys are distinct.
func docKey(n uint64) string {
	z := n + 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	return fmt.Sprintf("/bench/%016x", z)
}

func randomValue(rng *rand.Rand, n int) string {
	const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b := make([]byte, n)
	for i := range b {
		b[i] = letters[rng.IntN(len(letters))]
	}
	return string(b)
}

func newPair() *aePair {
	p := &aePair{}
	net := gossip.NewMemNetwork()
	for i := range 2 {
		st, err := store.Open(store.Options{Dir: "/" + sideID[i], InMemory: true, Logger: discard})
		check(err)
		p.st[i] = st
		p.g[i] = gossip.New(gossip.DefaultConfig(), st, net.Peers(sideID[i]), nil, discard)
		net.Add(sideID[i], p.g[i])
	}
	return p
}

func (p *aePair) close() {
	for _, st := range p.st {
		st.Close()
	}
}

// bytes returns the traffic both counters hold. MemNetwork accounts each
// call once, on the caller's side, so the sum counts every byte once.
func (p *aePair) bytes() uint64 {
	var n uint64
	for _, g := range p.g {
		for _, s := range g.Counters.Snapshot() {
			n += s.BytesSent + s.BytesReceived
		}
	}
	return n
}

func mergeAll(ctx context.Context, st *store.Store, docs []store.KeyedDoc) {
	const chunk = 2048
	for start := 0; start < len(docs); start += chunk {
		for _, r := range st.MergeBatch(ctx, docs[start:min(start+chunk, len(docs))]) {
			check(r.Err)
		}
	}
}

// load writes n documents on side a, as a's own writes, and copies them to
// side b.
func (p *aePair) load(ctx context.Context, rng *rand.Rand, n, valueSize int) []string {
	a := p.st[0]
	keys := make([]string, n)
	docs := make([]store.KeyedDoc, n)
	for i := range n {
		keys[i] = docKey(uint64(i))
		stamp := crdt.Stamp{TS: a.Clock().Now(), Node: a.NodeID()}
		docs[i] = store.KeyedDoc{Key: keys[i], Doc: crdt.Set(map[string]crdt.Value{"v": crdt.String(randomValue(rng, valueSize))}, stamp)}
	}
	mergeAll(ctx, a, docs)
	var copied []store.KeyedDoc
	check(a.Scan(func(key string, d crdt.Doc) bool {
		copied = append(copied, store.KeyedDoc{Key: key, Doc: d})
		return true
	}))
	mergeAll(ctx, p.st[1], copied)
	if p.st[0].Root() != p.st[1].Root() {
		fail("roots differ after loading both stores")
	}
	return keys
}

// plainTree is a fanout-16 MST keyed by document key with the document's
// digest as value, over one store's documents.
type plainTree struct {
	nodes *mst.MemStore
	root  mst.Hash
	size  int // wire size of all documents (full-state exchange)
	docs  map[string][]byte
}

var plainOpts = mst.Options{LevelBits: 4}

func buildPlain(st *store.Store) *plainTree {
	t := &plainTree{docs: map[string][]byte{}}
	var entries []mst.Entry
	check(st.Scan(func(key string, d crdt.Doc) bool {
		enc := d.Marshal()
		sum := sha256.Sum256(enc)
		entries = append(entries, mst.Entry{Key: []byte(key), Value: sum[:]})
		t.docs[key] = enc
		t.size += wireDocs([]string{key}, [][]byte{enc})
		return true
	}))
	ch, err := mst.Build(mst.Entries(entries), plainOpts)
	check(err)
	t.nodes = mst.NewMemStore()
	t.nodes.Apply(ch)
	t.root = ch.Root
	return t
}

// pull runs mst.Pull of remote into local and returns the bytes a
// GetNodes exchange framed like MemNetwork's would move, plus the
// documents behind the entries found (GetDocs framing).
func (local *plainTree) pull(ctx context.Context, remote *plainTree) (int, int) {
	bytes := 0
	fetch := func(ctx context.Context, hs []mst.Hash) ([][]byte, error) {
		blobs, err := remote.nodes.Fetch(ctx, hs)
		bytes += len(hs) * (32 + 2)
		for _, b := range blobs {
			bytes += protowire.SizeBytes(len(b)) + 1
		}
		return blobs, err
	}
	tree := mst.Open(local.nodes, local.root, plainOpts)
	entries, _, err := mst.Pull(ctx, tree, local.nodes.Has, remote.root, fetch)
	check(err)
	var keys []string
	var data [][]byte
	for _, e := range entries {
		keys = append(keys, string(e.Key))
		data = append(data, remote.docs[string(e.Key)])
	}
	return bytes, wireKeys(keys) + wireDocs(keys, data)
}

type aeSample struct {
	floor, shoal, plain1, plain2, full float64
	pulled, pushed                     float64
	took                               time.Duration
}

var layouts = []string{"clustered", "scattered"}

func aeSection(c config, rng *rand.Rand) {
	ctx := context.Background()
	fmt.Fprintf(os.Stderr, "gossip bench: anti-entropy, loading 2 × %d documents\n", c.docs)
	p := newPair()
	defer p.close()
	start := time.Now()
	base := p.load(ctx, rng, c.docs, c.valueSize)
	loadTook := time.Since(start)
	next := uint64(c.docs)

	// samples[d][layout][starter]: starter 0 is the side that lacks the
	// changes (b), 1 the side that made them (a).
	samples := map[string][]aeSample{}
	waitQuiet(c.quiet)
	load0 := takeLoad()
	caseKey := func(d int, layout string, starter int) string { return fmt.Sprintf("%d/%s/%d", d, layout, starter) }
	for rep := range c.reps {
		for _, d := range c.ds {
			for _, layout := range layouts {
				for starter := range 2 {
					fmt.Fprintf(os.Stderr, "gossip bench: anti-entropy rep %d, d=%d %s, %s side starts\n", rep+1, d, layout, []string{"stale", "fresh"}[starter])
					s := aeCase(ctx, p, rng, base, &next, d, layout, starter, c.valueSize)
					k := caseKey(d, layout, starter)
					samples[k] = append(samples[k], s)
				}
			}
		}
	}
	background := load0.others(takeLoad())
	// Idle rounds between equal stores.
	var idle []float64
	for range 5 {
		b0 := p.bytes()
		res, err := p.g[0].SyncWith(ctx, sideID[1])
		check(err)
		if !res.Equal {
			fail("idle round between equal stores was not equal")
		}
		idle = append(idle, float64(p.bytes()-b0))
	}
	st := p.st[0].Status()
	shoalNodes, shoalBytes, shoalDepth := shoalTreeSize(p.st[0])
	plainTree := buildPlain(p.st[0])

	fmt.Printf("### Anti-entropy: bytes of one round between stores that differ in d documents\n\n")
	fmt.Printf("Two stores hold the same %d documents (key /bench/<16 hex digits of a hash of n>, so key order is unrelated to write order, like task or node IDs; one %d-byte field; %d-byte encoded document on average), loaded in %v and checked to have equal roots. Then side A writes d documents that side B lacks, and one Gossip.SyncWith runs over gossip.MemNetwork: a two-way round (root exchange; the side that starts pulls the other's differing tree nodes and documents; then it asks the other side to pull, which costs nothing if the roots are equal by then). Bytes are what gossip.Counters saw on both sides (protobuf payload sizes, without gRPC, HTTP/2 or TLS framing). *Clustered*: d new documents written on A. *Scattered*: d of the original documents, chosen at random, updated on A. Each case runs %d times with the stale side (B) starting the round and %d times with the fresh side (A) starting, on fresh changes each time. Cells show the median, the range in brackets, and the median ÷ floor. Clustered cases add documents, so the stores grow to %d documents by the end.\n\n",
		c.docs, c.valueSize, avgDocSize(p.st[0]), loadTook.Round(time.Millisecond), c.reps, c.reps, st.Live)
	fmt.Printf("Baselines, computed from the same documents after the same changes: *floor* = Σ over the d changed documents of key + encoded document. *Plain MST* = a fanout-16 MST keyed by document key with the document's digest as value (mst.Build over each store's documents) synced by the same protocol: when the stale side starts, B pulls A (mst.Pull, one way) and then the roots are equal; when the fresh side starts, A pulls B and then B pulls A (both ways). GetNodes and GetDocs are framed as MemNetwork frames them, plus the %d-byte root exchange and the documents behind the entries each pull finds (d, and another d stale ones when A pulls first in the scattered case; the brief's \"both ways + d documents\" is this minus those stale d). *Full state* = both sides send every document (a memberlist-style push-pull used as a data channel). Whole trees at the end: Shoal's index %d nodes, %s; the plain MST %d nodes, %s.\n\n",
		rootExchange, shoalNodes, fmtBytes(float64(shoalBytes)), plainTree.nodes.Len(), fmtBytes(float64(plainTree.nodes.Bytes())))
	fmt.Printf("| d | layout | floor | Shoal, stale side starts | Shoal, fresh side starts | plain MST-16, stale side starts | plain MST-16, fresh side starts | full state | docs fetched by Shoal (stale / fresh starts) |\n")
	fmt.Printf("|---:|---|---:|---:|---:|---:|---:|---:|---:|\n")
	type goalRow struct {
		d                   int
		layout              string
		shoal0, shoal1      float64 // medians by starter
		plain0, plain1, flr float64
	}
	var goals []goalRow
	for _, d := range c.ds {
		for _, layout := range layouts {
			s0, s1 := samples[caseKey(d, layout, 0)], samples[caseKey(d, layout, 1)]
			all := append(slices.Clone(s0), s1...)
			get := func(ss []aeSample, f func(aeSample) float64) []float64 {
				out := make([]float64, len(ss))
				for i, s := range ss {
					out[i] = f(s)
				}
				return out
			}
			floor := median(get(all, func(s aeSample) float64 { return s.floor }))
			cell := func(xs []float64) string {
				return bytesSpread(xs) + fmt.Sprintf(" (%.1f×)", median(xs)/floor)
			}
			shoal0 := get(s0, func(s aeSample) float64 { return s.shoal })
			shoal1 := get(s1, func(s aeSample) float64 { return s.shoal })
			plain0 := get(all, func(s aeSample) float64 { return s.plain1 })
			plain1 := get(all, func(s aeSample) float64 { return s.plain2 })
			fetched := func(ss []aeSample) string {
				return fmt.Sprintf("%.0f", median(get(ss, func(s aeSample) float64 { return s.pulled + s.pushed })))
			}
			fmt.Printf("| %d | %s | %s | %s | %s | %s | %s | %s | %s / %s |\n", d, layout,
				bytesSpread(get(all, func(s aeSample) float64 { return s.floor })),
				cell(shoal0), cell(shoal1), cell(plain0), cell(plain1),
				cell(get(all, func(s aeSample) float64 { return s.full })),
				fetched(s0), fetched(s1))
			goals = append(goals, goalRow{d: d, layout: layout, shoal0: median(shoal0), shoal1: median(shoal1), plain0: median(plain0), plain1: median(plain1), flr: floor})
		}
	}
	fmt.Println()
	fmt.Printf("Idle round between equal stores: %s (the root exchange only). Other processes on the machine used %.2f CPUs on average during the cases (bytes do not depend on it; round times would).\n\n", bytesSpread(idle), background)

	fmt.Printf("Goals. Either side starts a real round with equal probability, so *expected* is the mean of the two medians (Shoal's, and the plain MST's under the same protocol); the per-starter ratios are in brackets.\n\n")
	fmt.Printf("| goal | measured | met |\n|---|---:|---|\n")
	fmt.Printf("| idle round ≤ 200 B | %s | %s |\n", fmtBytes(median(idle)), yes(median(idle) <= 200))
	for _, g := range goals {
		if g.layout == "clustered" {
			e := (g.shoal0 + g.shoal1) / 2
			fmt.Printf("| clustered, d = %d: ≤ 4× floor | %.1f× (%s; stale starts %.1f×, fresh starts %.1f×) | %s |\n", g.d, e/g.flr, fmtBytes(e), g.shoal0/g.flr, g.shoal1/g.flr, yes(e <= 4*g.flr))
		}
	}
	for _, g := range goals {
		if g.layout == "scattered" {
			e, pe := (g.shoal0+g.shoal1)/2, (g.plain0+g.plain1)/2
			fmt.Printf("| scattered, d = %d: ≤ plain MST-16 | %.2f× plain (%s vs %s; stale starts %.2f×, fresh starts %.2f×) | %s |\n", g.d, e/pe, fmtBytes(e), fmtBytes(pe), g.shoal0/g.plain0, g.shoal1/g.plain1, yes(e <= pe))
		}
	}
	fmt.Println()
	fmt.Printf("Note: Shoal's MST is not keyed by document key. A document's index key is the HLC timestamp of its latest write (%d bytes, big-endian, so byte order is time order) followed by its key, and the value is the digest of the merged document (pkg/store/doc.go, store.IndexKey). Two peers that merged the same writes hold the same entries, hence the same root, and what one of them lacks is mostly what was written since they last synced. Those entries sit together at the right edge of the tree, in a few adjacent leaves under one spine. So fresh writes (the clustered case) cost one root-to-leaf spine plus the new leaves, whatever their keys, while in a plain MST keyed by document key the same d new documents land in d random leaves. An update of an old document moves its entry from its old place to the right edge, so the side that lacks the update still differs at d scattered places (the old entries). In the scattered case Shoal therefore walks the same scattered paths as the plain MST, plus the spine, over somewhat larger nodes (each entry carries the %d-byte timestamp). When the fresh side starts the round, it first pulls the stale side's tree, finds the stale side's old entries missing from its own tree, and fetches those d stale documents only to merge them to no effect (the \"docs fetched\" column). When the stale side starts, its pull brings it up to date, the roots are then equal, and the second half of the round costs nothing. One spine is the least a round that finds a difference can cost: a root-to-leaf path of whole nodes (%d entries on average, up to a few KiB each; at most %d nodes deep here). That is why a round that repairs only a handful of documents cannot come near 4× their floor of about 150 B each.\n\n", hlc.EncodedLen, hlc.EncodedLen, 1<<4, shoalDepth)
}

// shoalTreeSize walks a store's MST and returns its node count, bytes and
// depth (levels of nodes on the longest path).
func shoalTreeSize(st *store.Store) (nodes, size, depth int) {
	v, err := st.View()
	check(err)
	defer v.Close()
	top := -1
	bottom := math.MaxInt
	check(mst.Walk(viewNodes{v}, v.Root(), mst.Options{LevelBits: 4}, func(_ mst.Hash, n *mst.Node) error {
		nodes++
		size += len(mst.EncodeNode(n))
		top = max(top, int(n.Level))
		bottom = min(bottom, int(n.Level))
		return nil
	}))
	return nodes, size, top - bottom + 1
}

// viewNodes reads a View's nodes as an mst.NodeSource.
type viewNodes struct{ v *store.View }

func (s viewNodes) GetNode(h mst.Hash) ([]byte, error) {
	b, err := s.v.Nodes([]mst.Hash{h})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", mst.ErrNodeNotFound, err)
	}
	return b[0], nil
}

func metStr(ok bool) string {
	if ok {
		return "met"
	}
	return "not met"
}

func yes(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}

func avgDocSize(st *store.Store) int {
	n, total := 0, 0
	check(st.Scan(func(_ string, d crdt.Doc) bool {
		total += len(d.Marshal())
		n++
		return n < 1000
	}))
	return total / max(n, 1)
}

// aeCase makes side a differ from side b in d documents, measures the
// baselines, runs one round started by b (starter 0) or a (starter 1) and
// checks that it converged.
func aeCase(ctx context.Context, p *aePair, rng *rand.Rand, base []string, next *uint64, d int, layout string, starter, valueSize int) aeSample {
	a := p.st[0]
	if p.st[0].Root() != p.st[1].Root() {
		fail("roots differ before a case")
	}
	var keys []string
	if layout == "clustered" {
		for range d {
			keys = append(keys, docKey(*next))
			*next++
		}
	} else {
		for _, i := range rng.Perm(len(base))[:d] {
			keys = append(keys, base[i])
		}
	}
	// Local writes on a, concurrent so that they share commits.
	var wg sync.WaitGroup
	errs := make(chan error, d)
	vals := make([]string, d)
	for i := range vals {
		vals[i] = randomValue(rng, valueSize)
	}
	sem := make(chan struct{}, 32)
	for i, k := range keys {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			_, err := a.Put(ctx, k, map[string]crdt.Value{"v": crdt.String(vals[i])})
			if err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		check(err)
	}

	var s aeSample
	ta, tb := buildPlain(p.st[0]), buildPlain(p.st[1])
	for _, k := range keys {
		s.floor += float64(len(k) + len(ta.docs[k]))
	}
	s.full = float64(ta.size + tb.size)
	nodesBA, docsBA := tb.pull(ctx, ta) // b pulls a: finds the d changes
	nodesAB, docsAB := ta.pull(ctx, tb) // a pulls b: b's old versions, if any
	s.plain1 = float64(rootExchange + nodesBA + docsBA)
	s.plain2 = float64(rootExchange + nodesBA + nodesAB + docsBA + docsAB)

	b0 := p.bytes()
	t0 := time.Now()
	res, err := p.g[1-starter].SyncWith(ctx, sideID[starter])
	s.took = time.Since(t0)
	check(err)
	s.shoal = float64(p.bytes() - b0)
	s.pulled, s.pushed = float64(res.Pulled), float64(res.Pushed)
	if p.st[0].Root() != p.st[1].Root() {
		fail("roots differ after a round (d=%d %s)", d, layout)
	}
	return s
}

// ---- formatting ----

func pct(f float64) string {
	return strconv.FormatFloat(f*100, 'f', -1, 64) + "%"
}

// pctl is the nearest-rank percentile of ds.
func pctl(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

func fmtBytes(b float64) string {
	switch {
	case b >= 10*1024*1024:
		return fmt.Sprintf("%.0f MiB", b/(1<<20))
	case b >= 1024*1024:
		return fmt.Sprintf("%.1f MiB", b/(1<<20))
	case b >= 10*1024:
		return fmt.Sprintf("%.0f KiB", b/1024)
	case b >= 1024:
		return fmt.Sprintf("%.1f KiB", b/1024)
	default:
		return fmt.Sprintf("%.0f B", b)
	}
}

// bytesSpread is the median of xs and, if they differ, their range.
func bytesSpread(xs []float64) string {
	out := fmtBytes(median(xs))
	if lo, hi := slices.Min(xs), slices.Max(xs); lo != hi {
		out += " [" + fmtBytes(lo) + "–" + fmtBytes(hi) + "]"
	}
	return out
}

func dur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
	}
}

func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

func parseInts(s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		check(err)
		out = append(out, n)
	}
	return out
}

func check(err error) {
	if err != nil {
		fail("%v", err)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "gossip bench: "+format+"\n", args...)
	os.Exit(1)
}

// ---- background load ----

// clockTicks is USER_HZ, the unit of /proc CPU times (100 on Linux).
const clockTicks = 100

// loadSnap is the machine's busy CPU time and this process's, so that the
// CPU other processes use during a measurement can be reported next to it.
type loadSnap struct {
	at            time.Time
	machine, self time.Duration
}

func takeLoad() loadSnap {
	s := loadSnap{at: time.Now()}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line)
		// cpu user nice system idle iowait irq softirq steal guest guest_nice
		for i, v := range f[1:] {
			if i == 3 || i == 4 || i >= 8 {
				continue
			}
			n, _ := strconv.ParseInt(v, 10, 64)
			s.machine += time.Duration(n) * time.Second / clockTicks
		}
	}
	if b, err := os.ReadFile("/proc/self/stat"); err == nil {
		// Fields after the command name; utime and stime are fields 14, 15.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) > 12 {
			ut, _ := strconv.ParseInt(f[11], 10, 64)
			st, _ := strconv.ParseInt(f[12], 10, 64)
			s.self = time.Duration(ut+st) * time.Second / clockTicks
		}
	}
	return s
}

// others returns the CPUs other processes used between a and b.
func (a loadSnap) others(b loadSnap) float64 {
	busy := (b.machine - a.machine) - (b.self - a.self)
	return max(busy.Seconds(), 0) / b.at.Sub(a.at).Seconds()
}

// waitQuiet waits up to limit for a second in which other processes use
// less than a quarter of a CPU.
func waitQuiet(limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		a := takeLoad()
		time.Sleep(time.Second)
		if a.others(takeLoad()) < 0.25 {
			return
		}
	}
}
