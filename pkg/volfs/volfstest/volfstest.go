// Package volfstest provides Backends for testing code built on volfs:
// Local (one in-process replica, no Raft), ClusterBackend (a replica in a
// deterministic raftgrouptest cluster, driven by the caller's goroutine)
// and Realtime (hosts running in real time over an in-memory network, for
// tests where other goroutines — a FUSE server — issue requests).
package volfstest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	rgt "github.com/shoal-dev/shoal/pkg/raftgroup/raftgrouptest"
	"github.com/shoal-dev/shoal/pkg/volfs"
)

// Local is a Backend over a single in-process FS: each mutation is
// applied as the next log entry at the time Now returns (default: a clock
// starting in 2030 that moves a millisecond per entry, so runs are
// reproducible).
type Local struct {
	FS  *volfs.FS
	Now func() time.Time

	mu    sync.Mutex
	index uint64
}

// NewLocal returns a Local over a new FS raised to volfs.MaxLevel, as
// a volume whose replicas all run this code is.
func NewLocal() *Local {
	l := &Local{FS: volfs.New()}
	if _, err := (&volfs.Client{B: l}).SetLevel(context.Background(), volfs.MaxLevel); err != nil {
		panic(err)
	}
	return l
}

var _ volfs.Backend = (*Local)(nil)

// Mutate implements volfs.Backend.
func (l *Local) Mutate(ctx context.Context, op []byte) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.index++
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(l.index) * time.Millisecond)
	if l.Now != nil {
		now = l.Now()
	}
	res, err := l.FS.Apply([]raftgroup.Entry{{Index: l.index, Term: 1, Time: now, Data: op}})
	if err != nil {
		return nil, err
	}
	return res[0], nil
}

// Query implements volfs.Backend.
func (l *Local) Query(ctx context.Context, req []byte) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return l.FS.Query(req)
}

// ClusterBackend is a Backend on one node of a deterministic
// raftgrouptest cluster. Each call ticks the cluster from the calling
// goroutine until the request resolves, so a test stays single-threaded
// and reproducible. The cluster's state machines must be *volfs.FS.
type ClusterBackend struct {
	C     *rgt.Cluster
	Node  raftgroup.NodeID
	Group raftgroup.GroupID
	// MaxTicks bounds each request (default 500); beyond it the test fails.
	MaxTicks int
}

var _ volfs.Backend = (*ClusterBackend)(nil)

// ErrNodeDown is returned by a ClusterBackend whose node is crashed.
var ErrNodeDown = errors.New("volfstest: node is down")

func (b *ClusterBackend) host() (*raftgroup.Host, error) {
	h := b.C.Host(b.Node)
	if h == nil {
		return nil, fmt.Errorf("node %d: %w", b.Node, ErrNodeDown)
	}
	return h, nil
}

func (b *ClusterBackend) maxTicks() int {
	if b.MaxTicks > 0 {
		return b.MaxTicks
	}
	return 500
}

// Mutate implements volfs.Backend.
func (b *ClusterBackend) Mutate(_ context.Context, op []byte) ([]byte, error) {
	h, err := b.host()
	if err != nil {
		return nil, err
	}
	r, err := rgt.Await(b.C, h.Submit(b.Group, raftgroup.Proposal{Data: op}), b.maxTicks())
	if err != nil {
		return nil, err
	}
	return r.Data, nil
}

// Query implements volfs.Backend.
func (b *ClusterBackend) Query(_ context.Context, req []byte) ([]byte, error) {
	h, err := b.host()
	if err != nil {
		return nil, err
	}
	if _, err := rgt.Await(b.C, h.ReadIndexAsync(b.Group), b.maxTicks()); err != nil {
		return nil, err
	}
	return volfs.QueryHost(h, b.Group, req)
}

// NewCluster starts a deterministic cluster (opts.Nodes hosts, default 3)
// whose state machines are volumes (unless opts.NewStateMachine says
// otherwise), with group g replicated on every node and a leader elected.
func NewCluster(t testing.TB, opts rgt.Options, g raftgroup.GroupID) *rgt.Cluster {
	if opts.Nodes == 0 {
		opts.Nodes = 3
	}
	if opts.NewStateMachine == nil {
		opts.NewStateMachine = func(raftgroup.NodeID, raftgroup.GroupID) raftgroup.StateMachine {
			return volfs.New()
		}
	}
	c := rgt.New(t, opts)
	c.CreateGroup(g, c.NodeIDs()...)
	c.WaitLeader(g, 200)
	return c
}

// Realtime is a set of hosts running in real time (Host.Run) over an
// in-memory network, holding one volume group on every host.
type Realtime struct {
	Net   *rgt.Network
	Group raftgroup.GroupID
	Hosts []*raftgroup.Host // Hosts[i] is node i+1

	mu  sync.Mutex
	fss map[raftgroup.NodeID]*volfs.FS
}

// StartRealtime starts nodes hosts with a volume group replicated on all
// of them; everything stops when the test ends.
func StartRealtime(t testing.TB, nodes int) *Realtime {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	rt := &Realtime{
		Net:   rgt.NewNetwork(rand.New(rand.NewPCG(1, 2))),
		Group: 1,
		fss:   map[raftgroup.NodeID]*volfs.FS{},
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		for _, h := range rt.Hosts {
			_ = h.Close()
		}
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		rt.Net.AutoDeliver(ctx, time.Millisecond)
	}()
	members := make([]raftgroup.Member, nodes)
	for i := range members {
		members[i] = raftgroup.Member{Replica: raftgroup.ReplicaID(i + 1), Node: raftgroup.NodeID(i + 1)}
	}
	for i := range nodes {
		n := raftgroup.NodeID(i + 1)
		h, err := raftgroup.Open(raftgroup.Config{
			NodeID:       n,
			Dir:          "/db",
			FS:           vfs.NewMem(),
			Transport:    rt.Net.Transport(n),
			TickInterval: 10 * time.Millisecond,
			NewStateMachine: func(raftgroup.GroupID) raftgroup.StateMachine {
				fs := volfs.New()
				rt.mu.Lock()
				rt.fss[n] = fs
				rt.mu.Unlock()
				return fs
			},
		})
		if err != nil {
			t.Fatalf("open host %d: %v", n, err)
		}
		rt.Hosts = append(rt.Hosts, h)
		rt.Net.Attach(n, h)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := h.Run(ctx); err != nil {
				t.Errorf("host %d: %v", n, err)
			}
		}()
	}
	for i, h := range rt.Hosts {
		if err := h.CreateGroup(rt.Group, raftgroup.ReplicaID(i+1), members); err != nil {
			t.Fatalf("create group on node %d: %v", i+1, err)
		}
	}
	return rt
}

// Backend returns the backend of node n (1-based).
func (rt *Realtime) Backend(n int) volfs.HostBackend {
	return volfs.HostBackend{Host: rt.Hosts[n-1], Group: rt.Group}
}

// Client returns a client on node n (1-based).
func (rt *Realtime) Client(n int) *volfs.Client {
	return &volfs.Client{B: rt.Backend(n)}
}

// FS returns node n's replica (1-based).
func (rt *Realtime) FS(n int) *volfs.FS {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.fss[raftgroup.NodeID(n)]
}
