package statd

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/shoal-dev/shoal/pkg/buildinfo"
	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/gossip"
	"github.com/shoal-dev/shoal/pkg/member"
	"github.com/shoal-dev/shoal/pkg/pki"
	"github.com/shoal-dev/shoal/pkg/rpc"
	"github.com/shoal-dev/shoal/pkg/store"
	peerv1 "github.com/shoal-dev/shoal/proto/shoal/peer/v1"
)

// Well-known documents.
const (
	keyClusterConfig = "/cluster/config"
	keyClusterJoin   = "/cluster/join"
	prefixNodes      = "/nodes/"
)

// caValidity is the cluster CA's lifetime; node certificates are renewed
// against it long before.
const caValidity = 10 * 365 * 24 * time.Hour

// membership is what the cluster needs of package member.
type membership = *member.List

// clusterFile is the node-local record that this node is a cluster member.
type clusterFile struct {
	Name      string `json:"name"`
	Advertise string `json:"advertise"`
	PeerPort  uint32 `json:"peer_port"`
}

// cluster is statd's clustering: identity, peer server, membership and
// gossip. It is inactive until the node inits or joins a cluster.
type cluster struct {
	cfg    *Config
	log    *slog.Logger
	st     *store.Store
	nodeID string

	// life guards activation and deactivation.
	life   sync.Mutex
	active atomic.Bool
	info   clusterFile
	cancel context.CancelFunc
	wg     sync.WaitGroup

	ca       atomic.Pointer[pki.CA]
	identity atomic.Pointer[pki.Identity]
	members  membership
	gossip   *gossip.Gossip
	pool     *peerPool
	srv      *grpc.Server
	counters *gossip.Counters
	// staleMu serialises the stale check of rule 3 (see gc.go).
	staleMu sync.Mutex
}

func newCluster(cfg *Config, st *store.Store, log *slog.Logger) *cluster {
	return &cluster{cfg: cfg, log: log, st: st, nodeID: st.NodeID(), counters: gossip.NewCounters()}
}

func (c *cluster) pkiDir() string      { return filepath.Join(c.cfg.StateDir, "pki") }
func (c *cluster) clusterPath() string { return filepath.Join(c.cfg.StateDir, "cluster.json") }

func (c *cluster) caPool() *x509.CertPool {
	if ca := c.ca.Load(); ca != nil {
		return ca.Pool()
	}
	return nil
}

// resume activates the cluster at start-up if this node is a member.
func (c *cluster) resume(ctx context.Context) error {
	data, err := os.ReadFile(c.clusterPath())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var info clusterFile
	if err := json.Unmarshal(data, &info); err != nil {
		return fmt.Errorf("%s: %w", c.clusterPath(), err)
	}
	ca, id, err := pki.LoadFiles(c.pkiDir())
	if err != nil {
		return fmt.Errorf("load cluster identity: %w", err)
	}
	c.ca.Store(ca)
	c.identity.Store(id)
	c.life.Lock()
	defer c.life.Unlock()
	return c.activate(ctx, info, nil)
}

// activate starts the peer server, membership, gossip and the background
// loops. Callers hold c.life.
func (c *cluster) activate(ctx context.Context, info clusterFile, seeds []member.Update) error {
	lis, err := net.Listen("tcp", joinHostPort(c.cfg.BindAddr, info.PeerPort))
	if err != nil {
		return fmt.Errorf("peer listener: %w", err)
	}
	c.info = info
	unary, _ := rpc.ServerInterceptors(c.log.With("component", "peer"))
	c.srv = grpc.NewServer(
		grpc.Creds(credentials.NewTLS(pki.ServerConfig(c.identity.Load, c.caPool))),
		grpc.ChainUnaryInterceptor(unary, requireCert),
		grpc.MaxRecvMsgSize(64<<20),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	)
	peerv1.RegisterPeerServer(c.srv, &peerServer{c: c})
	c.pool = newPeerPool(c)
	self := member.Member{ID: c.nodeID, Addr: joinHostPort(info.Advertise, info.PeerPort), Incarnation: uint64(time.Now().UnixMilli())}
	c.members = member.New(self, c.cfg.memberConfig(), c.pool, member.SystemClock(), rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())), c.log.With("component", "member"))
	c.members.OnChange(func(m member.Member) {
		c.log.Info("member state", "member", m.ID, "addr", m.Addr, "state", m.State.String(), "incarnation", m.Incarnation)
	})
	c.gossip = gossip.New(c.cfg.gossipConfig(), c.st, c.pool, c.counters, c.log.With("component", "gossip"))
	c.gossip.Accept = c.accept
	c.gossip.PeerLastSync = c.onPeerLastSync
	if last, err := c.loadLastSync(); err == nil {
		c.gossip.SetLastSync(last)
	}
	c.seedMembers()
	// The member table of the node we joined through, incarnations and
	// states included, so this node starts with a current view.
	c.members.Apply(seeds)
	runCtx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	c.active.Store(true)
	loops := []func(context.Context){
		func(context.Context) { c.srv.Serve(lis) },
		func(ctx context.Context) { c.members.Run(ctx) },
		func(ctx context.Context) { c.gossip.Run(ctx) },
		c.watchNodes,
		c.renewLoop,
		c.gcLoop,
		c.lastSyncLoop,
	}
	for _, loop := range loops {
		c.wg.Add(1)
		go func() { defer c.wg.Done(); loop(runCtx) }()
	}
	c.log.Info("cluster active", "cluster", info.Name, "advertise", self.Addr)
	return c.writeNodeDoc(ctx)
}

// deactivate stops everything activate started. Callers hold c.life.
func (c *cluster) deactivate() {
	if !c.active.Swap(false) {
		return
	}
	c.cancel()
	c.srv.Stop()
	c.wg.Wait()
	c.pool.close()
}

func (c *cluster) close() {
	c.life.Lock()
	defer c.life.Unlock()
	c.deactivate()
}

// seedMembers adds every node document's node to the membership list.
func (c *cluster) seedMembers() {
	recs, _, _, err := c.st.List(store.ListOptions{Prefix: prefixNodes, Limit: 100_000})
	if err != nil {
		c.log.Error("read node documents", "err", err)
		return
	}
	for _, r := range recs {
		c.addNodeDoc(r.Key, r.Doc)
	}
}

func (c *cluster) addNodeDoc(key string, d crdt.Doc) {
	id := key[len(prefixNodes):]
	if !d.Exists() {
		// Removed (`shoalctl node rm`), which is refused for live nodes.
		if id == c.nodeID {
			c.log.Warn("this node was removed from the cluster while it was away: run `shoalctl cluster leave`, then join again")
		} else if c.members.Forget(id) {
			c.log.Info("removed node forgotten", "node", id)
		}
		return
	}
	if id == c.nodeID {
		return
	}
	live := d.Live()
	if left, _ := live["left"].AsBool(); left {
		return
	}
	addr, ok := live["addr"].AsString()
	port, ok2 := live["peer_port"].AsInt()
	if ok && ok2 && addr != "" {
		c.members.Add(id, joinHostPort(addr, uint32(port)))
	}
}

// watchNodes adds nodes to the membership list as their documents arrive.
func (c *cluster) watchNodes(ctx context.Context) {
	for ctx.Err() == nil {
		err := c.st.Watch(ctx, prefixNodes, c.st.Revision(), func(b store.WatchBatch) error {
			for _, e := range b.Events {
				c.addNodeDoc(e.Key, e.Doc)
			}
			return nil
		})
		if ctx.Err() == nil {
			c.log.Warn("node watch restarted", "err", err)
			time.Sleep(time.Second)
		}
	}
}

// writeNodeDoc publishes this node's description.
func (c *cluster) writeNodeDoc(ctx context.Context) error {
	host, _ := os.Hostname()
	name := c.cfg.NodeName
	if name == "" {
		name = host
	}
	fields := map[string]crdt.Value{
		"name":      crdt.String(name),
		"hostname":  crdt.String(host),
		"addr":      crdt.String(c.info.Advertise),
		"peer_port": crdt.Int(int64(c.info.PeerPort)),
		"version":   crdt.String(buildinfo.String()),
		"left":      crdt.Bool(false),
	}
	cpus, mem := resources()
	fields["cpus"] = crdt.Int(int64(cpus))
	fields["memory"] = crdt.Int(mem)
	// Write only what changed, so restarts do not churn the document.
	if cur, err := c.st.GetRaw(prefixNodes + c.nodeID); err == nil {
		live := cur.Doc.Live()
		for k, v := range fields {
			if old, ok := live[k]; ok && old.Equal(v) {
				delete(fields, k)
			}
		}
	}
	if len(fields) == 0 {
		return nil
	}
	_, err := c.st.Put(ctx, prefixNodes+c.nodeID, fields)
	return err
}

// renewLoop renews this node's certificate before it expires, without a
// restart: TLS configs read the current identity at every handshake.
func (c *cluster) renewLoop(ctx context.Context) {
	every := min(time.Duration(c.cfg.CertValidity)/20, time.Minute)
	every = max(every, 100*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		id := c.identity.Load()
		if !pki.NeedsRenewal(id, time.Now()) {
			continue
		}
		next, err := pki.Renew(c.ca.Load(), id, time.Duration(c.cfg.CertValidity), time.Now())
		if err == nil {
			err = pki.SaveFiles(c.pkiDir(), c.ca.Load(), next)
		}
		if err != nil {
			c.log.Error("renew node certificate", "err", err)
			continue
		}
		c.identity.Store(next)
		c.log.Info("node certificate renewed", "not_after", next.NotAfter.Format(time.RFC3339))
	}
}

// lastSyncLoop persists when this node last completed an anti-entropy
// round, so a node that was away longer than the tombstone retention knows
// it on return (see dropStale).
func (c *cluster) lastSyncLoop(ctx context.Context) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	var saved time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		last := c.gossip.LastSync()
		if last.After(saved) {
			if err := c.st.SetMeta("last_sync", []byte(strconv.FormatInt(last.UnixNano(), 10))); err == nil {
				saved = last
			}
		}
	}
}

// admit serves a Join: it checks the token against the cluster's current
// one and signs the newcomer's key.
func (c *cluster) admit(ctx context.Context, req *peerv1.JoinRequest) (*peerv1.JoinResponse, error) {
	rec, err := c.st.GetRaw(keyClusterJoin)
	if err != nil {
		return nil, err
	}
	stored, ok := rec.Doc.Live()["token_hash"].AsString()
	if !ok {
		return nil, fmt.Errorf("this member has no join token yet; try another member: %w", errdefs.ErrUnavailable)
	}
	if !pki.VerifySecret(req.GetTokenSecret(), stored) {
		c.log.Warn("join refused: bad token", "node", req.GetNodeId(), "addr", req.GetAdvertiseAddr())
		return nil, fmt.Errorf("join token is invalid or has been rotated: %w", errdefs.ErrPermissionDenied)
	}
	if err := pki.ValidateNodeID(req.GetNodeId()); err != nil {
		return nil, fmt.Errorf("%v: %w", err, errdefs.ErrInvalidArgument)
	}
	ip := net.ParseIP(req.GetAdvertiseAddr())
	if ip == nil {
		return nil, fmt.Errorf("advertise address %q is not an IP: %w", req.GetAdvertiseAddr(), errdefs.ErrInvalidArgument)
	}
	if req.GetPeerPort() == 0 || req.GetPeerPort() > 65535 {
		return nil, fmt.Errorf("peer port %d out of range: %w", req.GetPeerPort(), errdefs.ErrInvalidArgument)
	}
	pub, err := pki.ParsePublicKey(req.GetPublicKey())
	if err != nil {
		return nil, fmt.Errorf("%v: %w", err, errdefs.ErrInvalidArgument)
	}
	ca := c.ca.Load()
	cert, err := ca.IssueNode(req.GetNodeId(), []net.IP{ip}, pub, time.Duration(c.cfg.CertValidity), time.Now())
	if err != nil {
		return nil, fmt.Errorf("%v: %w", err, errdefs.ErrInvalidArgument)
	}
	addr := joinHostPort(ip.String(), req.GetPeerPort())
	c.members.Add(req.GetNodeId(), addr)
	c.log.Info("node admitted", "node", req.GetNodeId(), "addr", addr)
	var ms []member.Update
	for _, m := range c.members.Members() {
		ms = append(ms, m.Update())
	}
	return &peerv1.JoinResponse{
		ClusterName: c.info.Name,
		CaCertPem:   ca.CertPEM(),
		CaKeyPem:    ca.KeyPEM(),
		NodeCertPem: cert,
		Members:     toWire(ms),
	}, nil
}
