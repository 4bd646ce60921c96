package vold

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shoal-dev/shoal/pkg/client"
	"github.com/shoal-dev/shoal/pkg/daemon"
	"github.com/shoal-dev/shoal/pkg/hugeheap"
	"github.com/shoal-dev/shoal/pkg/meminfo"
	"github.com/shoal-dev/shoal/pkg/peerauth"
	"github.com/shoal-dev/shoal/pkg/raftgroup"
	volv1 "github.com/shoal-dev/shoal/proto/shoal/vol/v1"
)

// node is one vold.
type node struct {
	cfg   *Config
	log   *slog.Logger
	rt    *daemon.Runtime
	statd *client.Statd
	names *nodeNames
	peer  *peerServer

	// Set once the node is in a cluster (identity from statd).
	id       string
	rid      raftgroup.NodeID
	ready    chan struct{}
	identity peerauth.Identity
	mirror   *client.Mirror
	members  atomic.Pointer[membership]
	// lastSweep is when repair last looked at every group (repairLoop's).
	lastSweep time.Time
	// commitMarks is the commit index each group this node leads had at
	// repair's previous round while it has learners (repairLoop's:
	// replicas.go).
	commitMarks map[raftgroup.GroupID]uint64
	pool        *peerPool
	trans       *transport
	host        atomic.Pointer[raftgroup.Host]
	// synced is set once statd has caught up with a peer since start:
	// only then may a missing document destroy a replica.
	synced atomic.Bool

	kick chan struct{}

	// kvs are the KV appliers of the system groups this node holds.
	kvMu sync.Mutex
	kvs  map[raftgroup.GroupID]*kvStore

	// leaders remembers the last leader node seen per group (a hint for
	// forwarding).
	leaders sync.Map // raftgroup.GroupID -> string

	// probes are recent pings of other volds (probe.go).
	probes probes

	// sysMu serialises creating the system group on this node.
	sysMu sync.Mutex

	// mounts are this node's FUSE mounts (mount.go).
	mountMu sync.Mutex
	mounts  map[string]*mount
	// fences are the volumes a removal asked this node not to mount
	// (mountusers.go), under mountMu.
	fences map[string]fenceHold
	// sess keeps mounts' FUSE sessions across restarts (fuse.go).
	sess *sessions
	// restored is closed once restoreMounts has run.
	restored chan struct{}

	// reconcile state: groups whose create/join failed, by error text, so
	// the log says it once.
	failed map[raftgroup.GroupID]string

	// docs memoizes decoded volume documents (reconcile.go).
	docs docCache

	stats counters
	// lat are the timing histograms (nil in tests that build a node by
	// hand: nothing is recorded then).
	lat *latencies
}

// counters are vold's own figures for metrics.
type counters struct {
	proposals, forwardedOut, forwardedIn, forwardErrors atomic.Uint64
	created, destroyed, replaced, scaleSteps            atomic.Uint64
}

func start(ctx context.Context, rt *daemon.Runtime) (func(context.Context) error, error) {
	cfg := rt.Config.(*Config)
	if err := cfg.check(); err != nil {
		return nil, err
	}
	rt.Log.Debug("go scheduler", "gomaxprocs", applyMaxProcs(cfg.MaxProcs), "cpus", runtime.NumCPU())
	premap := hugePremap
	reserveMiB := cfg.HeapReserveMiB
	if reserveMiB < 0 && os.Getenv("GOMEMLIMIT") != "" {
		// The ballast counts against a memory limit: an operator's limit
		// and an automatic reserve would fight.
		reserveMiB = 0
	}
	if !ownProcess {
		reserveMiB = 0
	}
	var mem int64
	if reserveMiB < 0 {
		mem = meminfo.Available()
	}
	if n := heapReserve(reserveMiB, mem); n > 0 {
		// Allocated and populated in the background: a GiB takes seconds
		// on the project's VMs, and while vold starts its mounts wait.
		// The reserve's mapping is what the premap would have been, so
		// the premap shrinks by it (to nothing with the default 1 GiB
		// reserve). What is left of a premap runs meanwhile, and a span
		// it frees may then be reused for the reserve: Enable has advised
		// it for huge pages first, so the runtime's zeroing of it faults
		// in huge pages.
		t := time.Now()
		hugeheap.ReserveInBackground(n, cfg.HugePages, func(p int, err error) {
			if err != nil {
				rt.Log.Info("heap reserve not made", "err", err)
				return
			}
			rt.Log.Debug("heap reserved", "bytes", n, "populated", p, "took", time.Since(t))
		})
		premap = max(0, premap-n)
	}
	if ownProcess && cfg.HugePages {
		if n, err := hugeheap.Enable(premap); err != nil {
			rt.Log.Info("transparent huge pages not advised", "err", err)
		} else {
			rt.Log.Debug("transparent huge pages advised", "mappings", n)
		}
	}
	if cfg.MountDir == "" {
		cfg.MountDir = filepath.Join(cfg.StateDir, "mounts")
	}
	for _, d := range []string{filepath.Join(cfg.StateDir, "raft"), cfg.MountDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	st, err := client.NewStatd(cfg.RunDir, client.Retry{})
	if err != nil {
		return nil, err
	}
	n := &node{
		cfg: cfg, log: rt.Log, rt: rt, statd: st, names: newNodeNames(),
		ready: make(chan struct{}), kick: make(chan struct{}, 1),
		kvs: map[raftgroup.GroupID]*kvStore{}, mounts: map[string]*mount{}, fences: map[string]fenceHold{}, restored: make(chan struct{}),
		failed: map[raftgroup.GroupID]string{},
	}
	// The mirror, peer pool and transport need no identity until used:
	// creating them here lets metrics and the API read them freely.
	n.mirror = client.NewMirror(st, rt.Log.With("component", "mirror"), volumesPrefix, mountsPrefix, nodesPrefix)
	n.pool = newPeerPool(n.identity.Cert, n.identity.CA, n.peerAddr)
	n.trans = newTransport(rt.Log.With("component", "transport"), n.pool.raftDialer(n.names))
	n.peer = &peerServer{log: rt.Log.With("component", "peer"), names: n.names, deliver: n.deliver, forward: n.serveForward, export: n.serveExport}
	volv1.RegisterVolumesServer(rt.GRPC, &volumesAPI{n: n})
	volv1.RegisterKVServer(rt.GRPC, &kvAPI{n: n})
	volv1.RegisterStateMachinesServer(rt.GRPC, &machinesAPI{n: n})
	rt.Details = n.details
	rt.Liveness = n.live
	rt.Metrics.MustRegister(newCollector(n))
	n.lat = newLatencies()
	rt.Metrics.MustRegister(n.lat.collectors()...)
	n.sess = connectSessions(rt.Log.With("component", "fuse"), cfg.KeepMounts, n.holderSocket())
	// The daemon cancels ctx before it calls the stop function below,
	// which still needs the Raft host and the peer API running: it hands
	// leadership off first. The stop function ends them.
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := n.run(runCtx, &wg); err != nil && runCtx.Err() == nil {
			rt.Fatal(err)
		}
	}()
	return func(stopCtx context.Context) error {
		// Kept mounts stay mounted for the next vold; what they ask
		// from now on waits for it.
		n.detachMounts()
		n.handOff(stopCtx)
		cancel()
		wg.Wait()
		if !n.sess.kept() {
			n.unmountAll()
		}
		n.sess.close()
		n.trans.Close()
		var err error
		if h := n.host.Load(); h != nil {
			err = h.Close()
		}
		n.pool.Close()
		st.Close()
		return err
	}, nil
}

// run waits until the node is in a cluster, starts the Raft host and the
// peer API, then reconciles replicas with the volume documents until ctx
// ends. Goroutines it starts are counted in wg.
func (n *node) run(ctx context.Context, wg *sync.WaitGroup) error {
	idr, err := n.identity.Wait(ctx, n.statd.Cluster, n.log)
	if err != nil {
		return nil // ctx ended
	}
	n.id = idr.GetNodeId()
	n.rid, err = n.names.add(n.id)
	if err != nil {
		return fmt.Errorf("this node cannot host Raft replicas: %w", err)
	}
	n.log = n.log.With("node", n.id)
	changes := n.mirror.Changes()
	goWG(wg, func() { n.mirror.Run(ctx) })
	goWG(wg, func() { n.identity.Follow(ctx, n.statd.Cluster, n.log) })
	goWG(wg, func() { n.membershipLoop(ctx) })

	h, err := raftgroup.Open(raftgroup.Config{
		NodeID:          n.rid,
		Dir:             filepath.Join(n.cfg.StateDir, "raft"),
		Transport:       n.trans,
		NewStateMachine: n.newStateMachine,
		Logger:          n.log.With("component", "raft"),
		TickInterval:    time.Duration(n.cfg.RaftTick),
		ElectionTicks:   electionTicks,
		// A volume's snapshot is the whole volume, the system group's up
		// to 64 MiB of state machine logs: written on the loop either
		// would stall every group of the node for as long.
		BackgroundSnapshots: true,
		// A volume is mostly written through one node's mount: lead it
		// from there, a hop shorter for every write.
		FollowProposers: n.cfg.FollowWriters,
		ObserveSync:     n.lat.observeSync,
	})
	if err != nil {
		return fmt.Errorf("open raft host: %w", err)
	}
	n.host.Store(h)
	goWG(wg, func() {
		if err := h.Run(ctx); err != nil {
			n.rt.Fatal(fmt.Errorf("raft host: %w", err))
		}
	})

	lis, err := listenPeers(idr.GetAdvertiseIp(), n.cfg.PeerPort)
	if err != nil {
		return err
	}
	srv := newPeerGRPC(n.log.With("component", "peer"), n.peer)
	plis := n.peer.peerListener(lis, n.identity.Cert, n.identity.CA)
	goWG(wg, func() { _ = srv.Serve(plis) })
	goWG(wg, func() { <-ctx.Done(); srv.Stop() })

	for !n.mirror.Ready() || n.members.Load() == nil {
		select {
		case <-ctx.Done():
			return nil
		case <-changes:
		case <-time.After(100 * time.Millisecond):
		}
	}
	if err := n.publishNode(ctx); err != nil {
		n.log.Warn("publish vold port", "err", err)
	}
	close(n.ready)
	n.log.Info("vold ready", "raft_node", uint64(n.rid), "peer_addr", lis.Addr().String(), "groups", len(h.Groups()))
	goWG(wg, func() {
		n.waitStatdSynced(ctx)
		n.synced.Store(true)
		n.wake()
	})
	goWG(wg, func() { n.repairLoop(ctx) })
	goWG(wg, func() { n.restoreMounts(ctx) })

	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	published := time.Now()
	asked := true // by a document change or a kick, not the tick
	var reconciled time.Time
	for {
		// A round reads every volume document: with a thousand volumes that
		// was most of an idle vold's CPU, once a second. Documents changing
		// or a kick run it at once; the tick only retries failed creates,
		// and every reconcileEvery catches what no document announces (a
		// group that removed this replica).
		if asked || len(n.failed) > 0 || time.Since(reconciled) >= reconcileEvery {
			n.reconcile(ctx)
			reconciled = time.Now()
		}
		asked = true
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			asked = false
			if time.Since(published) > 30*time.Second {
				published = time.Now()
				if err := n.publishNode(ctx); err != nil {
					n.log.Warn("publish vold free space", "err", err)
				}
			}
		case <-changes:
		case <-n.kick:
		}
	}
}

// reconcileEvery is how often reconcile runs when nothing asks for it.
const reconcileEvery = 10 * time.Second

func goWG(wg *sync.WaitGroup, fn func()) {
	wg.Add(1)
	go func() { defer wg.Done(); fn() }()
}

// wake asks the reconcile loop for a round now.
func (n *node) wake() {
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// isReady reports whether the node is in a cluster and running its host.
func (n *node) isReady() bool {
	select {
	case <-n.ready:
		return true
	default:
		return false
	}
}

// raftHost returns the host once the node is ready.
func (n *node) raftHost() (*raftgroup.Host, error) {
	if !n.isReady() {
		return nil, errNotReady
	}
	return n.host.Load(), nil
}

// live is vold's check before each systemd watchdog ping: its Raft
// host's loop syncs a journal record (raftgroup.Host.Check). A loop stuck
// on a lock, or a disk that no longer finishes a sync, stops the pings and
// systemd restarts vold; the mounts survive that (their FUSE sessions are
// kept, fuse.go). A vold not in a cluster yet has no host, and is live.
func (n *node) live(ctx context.Context) error {
	h := n.host.Load()
	if h == nil {
		return nil
	}
	return h.Check(ctx)
}

// deliver hands an inbound batch to the host, if it runs.
func (n *node) deliver(from raftgroup.NodeID, b *raftgroup.Batch) bool {
	h := n.host.Load()
	if h == nil {
		return false
	}
	h.Deliver(from, b)
	return true
}

// newStateMachine returns a group's state machine: the system group's is
// typed with the KV applier, a volume's is its filesystem.
func (n *node) newStateMachine(g raftgroup.GroupID) raftgroup.StateMachine {
	if isSystemGroup(g) {
		sm, kv := newSystemMachine()
		n.kvMu.Lock()
		n.kvs[g] = kv
		n.kvMu.Unlock()
		return sm
	}
	return newVolumeMachine()
}

// kvOf returns the KV applier of system group g held here.
func (n *node) kvOf(g raftgroup.GroupID) *kvStore {
	n.kvMu.Lock()
	defer n.kvMu.Unlock()
	return n.kvs[g]
}

// details are the node's figures for `shoalctl daemon status`.
func (n *node) details() map[string]string {
	if !n.isReady() {
		return map[string]string{"state": "waiting for the node to be in a cluster"}
	}
	out := map[string]string{"node_id": n.id}
	if h := n.host.Load(); h != nil {
		out["groups"] = fmt.Sprint(len(h.Groups()))
		out["raft_node"] = fmt.Sprint(uint64(n.rid))
	}
	n.mountMu.Lock()
	out["mounts"] = fmt.Sprint(len(n.mounts))
	n.mountMu.Unlock()
	return out
}

// handOff gives the leadership of the groups this node leads to other
// replicas before vold stops (raftgroup Host.HandOff), for up to
// HandOffTimeout: their writes then wait for one election round, not for
// an election timeout. The mounts go on meanwhile, through the new
// leaders.
func (n *node) handOff(ctx context.Context) {
	h := n.host.Load()
	if h == nil || n.cfg.HandOffTimeout <= 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, time.Duration(n.cfg.HandOffTimeout))
	defer cancel()
	t := time.Now()
	res, err := h.HandOff(ctx)
	if err != nil {
		n.log.Warn("leadership not handed off", "err", err, "took", time.Since(t).Round(time.Millisecond))
		return
	}
	n.log.Info("leadership handed off", "groups", res.Moved, "kept", res.Kept, "took", time.Since(t).Round(time.Millisecond))
}
