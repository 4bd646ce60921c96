package statd

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/proto"

	"github.com/shoal-dev/shoal/pkg/gossip"
	"github.com/shoal-dev/shoal/pkg/member"
	"github.com/shoal-dev/shoal/pkg/mst"
	"github.com/shoal-dev/shoal/pkg/peerauth"
	"github.com/shoal-dev/shoal/pkg/pki"
	peerv1 "github.com/shoal-dev/shoal/proto/shoal/peer/v1"
)

// requireCert rejects every peer call but Join from callers without a
// verified cluster certificate: an unauthenticated TLS client gets nothing.
func requireCert(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if info.FullMethod != peerv1.Peer_Join_FullMethodName {
		if _, err := peerauth.NodeID(ctx); err != nil {
			return nil, err
		}
	}
	return h(ctx, req)
}

// peerServer serves shoal.peer.v1 for one node.
type peerServer struct {
	peerv1.UnimplementedPeerServer
	c *cluster
}

func (s *peerServer) Join(ctx context.Context, req *peerv1.JoinRequest) (*peerv1.JoinResponse, error) {
	return s.c.admit(ctx, req)
}

func (s *peerServer) Ping(ctx context.Context, req *peerv1.PingRequest) (*peerv1.PingResponse, error) {
	from, err := peerauth.NodeID(ctx)
	if err != nil {
		return nil, err
	}
	if req.GetFrom() != "" && req.GetFrom() != from {
		return nil, fmt.Errorf("ping claims to be from %q but the certificate says %q: %w", req.GetFrom(), from, errdefs.ErrPermissionDenied)
	}
	out := s.c.members.HandlePing(from, fromWire(req.GetUpdates()))
	return &peerv1.PingResponse{Updates: toWire(out)}, nil
}

func (s *peerServer) PingReq(ctx context.Context, req *peerv1.PingReqRequest) (*peerv1.PingReqResponse, error) {
	target := fromWire([]*peerv1.Member{req.GetTarget()})
	if len(target) != 1 {
		return nil, fmt.Errorf("ping-req without a target: %w", errdefs.ErrInvalidArgument)
	}
	from, _ := peerauth.NodeID(ctx)
	t := target[0]
	acked, out := s.c.members.HandlePingReq(ctx, from, member.Member{ID: t.ID, Addr: t.Addr, Incarnation: t.Incarnation, State: t.State}, fromWire(req.GetUpdates()))
	return &peerv1.PingReqResponse{Acked: acked, Updates: toWire(out)}, nil
}

func (s *peerServer) Push(ctx context.Context, req *peerv1.PushRequest) (*peerv1.PushResponse, error) {
	from, _ := peerauth.NodeID(ctx)
	s.c.members.Apply(fromWire(req.GetUpdates()))
	docs := make([]gossip.WireDoc, len(req.GetDocs()))
	for i, d := range req.GetDocs() {
		docs[i] = gossip.WireDoc{Key: d.GetKey(), Data: d.GetData()}
	}
	rej, err := s.c.gossip.HandlePush(ctx, from, docs)
	s.c.gossip.Counters.Bytes(from, 0, proto.Size(req))
	return &peerv1.PushResponse{Rejected: uint32(rej)}, err
}

func (s *peerServer) Root(ctx context.Context, req *peerv1.RootRequest) (*peerv1.RootResponse, error) {
	from, _ := peerauth.NodeID(ctx)
	root, last := s.c.gossip.HandleRoot(ctx, from, unixNano(req.GetLastSync()))
	return &peerv1.RootResponse{Root: root[:], LastSync: nanos(last)}, nil
}

func unixNano(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func (s *peerServer) GetNodes(ctx context.Context, req *peerv1.GetNodesRequest) (*peerv1.GetNodesResponse, error) {
	hs := make([]mst.Hash, len(req.GetHashes()))
	for i, h := range req.GetHashes() {
		if len(h) != len(mst.Hash{}) {
			return nil, fmt.Errorf("hash %d has %d bytes: %w", i, len(h), errdefs.ErrInvalidArgument)
		}
		copy(hs[i][:], h)
	}
	nodes, err := s.c.gossip.HandleGetNodes(hs)
	if err != nil {
		return nil, err
	}
	return &peerv1.GetNodesResponse{Nodes: nodes}, nil
}

func (s *peerServer) GetDocs(ctx context.Context, req *peerv1.GetDocsRequest) (*peerv1.GetDocsResponse, error) {
	from, _ := peerauth.NodeID(ctx)
	docs, err := s.c.gossip.HandleGetDocs(from, req.GetKeys())
	if err != nil {
		return nil, err
	}
	resp := &peerv1.GetDocsResponse{Docs: make([]*peerv1.Doc, len(docs))}
	for i, d := range docs {
		resp.Docs[i] = &peerv1.Doc{Key: d.Key, Data: d.Data}
	}
	return resp, nil
}

func (s *peerServer) PullFrom(ctx context.Context, req *peerv1.PullFromRequest) (*peerv1.PullFromResponse, error) {
	from, _ := peerauth.NodeID(ctx)
	var root mst.Hash
	if len(req.GetRoot()) != len(root) {
		return nil, fmt.Errorf("root has %d bytes: %w", len(req.GetRoot()), errdefs.ErrInvalidArgument)
	}
	copy(root[:], req.GetRoot())
	n, after, err := s.c.gossip.HandlePullFrom(ctx, from, root, req.GetAfter())
	return &peerv1.PullFromResponse{Entries: uint32(n), Root: after[:]}, err
}

func (s *peerServer) Tail(ctx context.Context, req *peerv1.TailRequest) (*peerv1.TailResponse, error) {
	entries, truncated, err := s.c.gossip.HandleTail(req.GetAfter(), int(req.GetLimit()))
	if err != nil {
		return nil, err
	}
	resp := &peerv1.TailResponse{Truncated: truncated, Entries: make([]*peerv1.Entry, len(entries))}
	for i, e := range entries {
		resp.Entries[i] = &peerv1.Entry{Key: e.Key, Value: e.Value}
	}
	return resp, nil
}

// peerPool holds one lazily dialled mTLS connection per member and
// implements both the gossip and the membership transports over them.
type peerPool struct {
	c      *cluster
	mu     sync.Mutex
	conns  map[string]*peerConn // by member ID
	tlsCfg func(expectID string) *tls.Config
}

type peerConn struct {
	addr string
	conn *grpc.ClientConn
	api  peerv1.PeerClient
}

func newPeerPool(c *cluster) *peerPool {
	return &peerPool{
		c:     c,
		conns: map[string]*peerConn{},
		tlsCfg: func(expectID string) *tls.Config {
			return pki.ClientConfig(c.identity.Load, c.caPool, expectID)
		},
	}
}

// client returns the connection to member id at addr, redialling when the
// member's address changed.
func (p *peerPool) client(id, addr string) (peerv1.PeerClient, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pc := p.conns[id]; pc != nil && pc.addr == addr {
		return pc.api, nil
	} else if pc != nil {
		pc.conn.Close()
	}
	conn, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(credentials.NewTLS(p.tlsCfg(id))),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)),
	)
	if err != nil {
		return nil, err
	}
	pc := &peerConn{addr: addr, conn: conn, api: peerv1.NewPeerClient(conn)}
	p.conns[id] = pc
	return pc.api, nil
}

func (p *peerPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, pc := range p.conns {
		pc.conn.Close()
		delete(p.conns, id)
	}
}

// Alive implements gossip.Peers.
func (p *peerPool) Alive() []string {
	var out []string
	self := p.c.nodeID
	for _, m := range p.c.members.Members() {
		// Suspects are left out: a round or push to a peer that stopped
		// answering only waits for a timeout.
		if m.ID != self && m.State == member.Alive {
			out = append(out, m.ID)
		}
	}
	return out
}

// Peer implements gossip.Peers.
func (p *peerPool) Peer(id string) (gossip.Peer, error) {
	m, ok := p.c.members.Member(id)
	if !ok {
		return nil, fmt.Errorf("unknown member %s: %w", id, errdefs.ErrNotFound)
	}
	api, err := p.client(id, m.Addr)
	if err != nil {
		return nil, err
	}
	return &grpcPeer{id: id, api: api, pool: p}, nil
}

// Ping implements member.Transport.
func (p *peerPool) Ping(ctx context.Context, target member.Member, updates []member.Update) ([]member.Update, error) {
	api, err := p.client(target.ID, target.Addr)
	if err != nil {
		return nil, err
	}
	resp, err := api.Ping(ctx, &peerv1.PingRequest{From: p.c.nodeID, Updates: toWire(updates)})
	if err != nil {
		return nil, err
	}
	return fromWire(resp.GetUpdates()), nil
}

// PingReq implements member.Transport.
func (p *peerPool) PingReq(ctx context.Context, via, target member.Member, updates []member.Update) (bool, []member.Update, error) {
	api, err := p.client(via.ID, via.Addr)
	if err != nil {
		return false, nil, err
	}
	resp, err := api.PingReq(ctx, &peerv1.PingReqRequest{Target: toWire([]member.Update{target.Update()})[0], Updates: toWire(updates)})
	if err != nil {
		return false, nil, err
	}
	return resp.GetAcked(), fromWire(resp.GetUpdates()), nil
}

// grpcPeer is a gossip.Peer over the peer API; it accounts bytes as the
// protobuf sizes of requests and responses.
type grpcPeer struct {
	id   string
	api  peerv1.PeerClient
	pool *peerPool
}

func (g *grpcPeer) ID() string { return g.id }

func (g *grpcPeer) count(req, resp proto.Message) {
	g.pool.c.gossip.Counters.Bytes(g.id, proto.Size(req), proto.Size(resp))
}

func (g *grpcPeer) Push(ctx context.Context, docs []gossip.WireDoc) (int, error) {
	req := &peerv1.PushRequest{Docs: make([]*peerv1.Doc, len(docs)), Updates: toWire(g.pool.c.members.Outgoing(8))}
	for i, d := range docs {
		req.Docs[i] = &peerv1.Doc{Key: d.Key, Data: d.Data}
	}
	resp, err := g.api.Push(ctx, req)
	if err != nil {
		return 0, err
	}
	g.count(req, resp)
	return int(resp.GetRejected()), nil
}

func (g *grpcPeer) Root(ctx context.Context, mine mst.Hash, lastSync time.Time) (mst.Hash, time.Time, error) {
	req := &peerv1.RootRequest{Root: mine[:], LastSync: nanos(lastSync)}
	resp, err := g.api.Root(ctx, req)
	if err != nil {
		return mst.Hash{}, time.Time{}, err
	}
	g.count(req, resp)
	var h mst.Hash
	if len(resp.GetRoot()) != len(h) {
		return h, time.Time{}, fmt.Errorf("peer %s sent a %d-byte root: %w", g.id, len(resp.GetRoot()), errdefs.ErrDataLoss)
	}
	copy(h[:], resp.GetRoot())
	return h, unixNano(resp.GetLastSync()), nil
}

func (g *grpcPeer) GetNodes(ctx context.Context, hs []mst.Hash) ([][]byte, error) {
	req := &peerv1.GetNodesRequest{Hashes: make([][]byte, len(hs))}
	for i := range hs {
		req.Hashes[i] = hs[i][:]
	}
	resp, err := g.api.GetNodes(ctx, req)
	if err != nil {
		return nil, err
	}
	g.count(req, resp)
	if len(resp.GetNodes()) != len(hs) {
		return nil, fmt.Errorf("peer %s sent %d nodes for %d hashes: %w", g.id, len(resp.GetNodes()), len(hs), errdefs.ErrDataLoss)
	}
	return resp.GetNodes(), nil
}

func (g *grpcPeer) GetDocs(ctx context.Context, keys []string) ([]gossip.WireDoc, error) {
	req := &peerv1.GetDocsRequest{Keys: keys}
	resp, err := g.api.GetDocs(ctx, req)
	if err != nil {
		return nil, err
	}
	g.count(req, resp)
	out := make([]gossip.WireDoc, len(resp.GetDocs()))
	for i, d := range resp.GetDocs() {
		out[i] = gossip.WireDoc{Key: d.GetKey(), Data: d.GetData()}
	}
	return out, nil
}

func (g *grpcPeer) PullFrom(ctx context.Context, root mst.Hash, after []byte) (int, mst.Hash, error) {
	req := &peerv1.PullFromRequest{Root: root[:], After: after}
	resp, err := g.api.PullFrom(ctx, req)
	if err != nil {
		return 0, mst.Hash{}, err
	}
	g.count(req, resp)
	var theirs mst.Hash
	copy(theirs[:], resp.GetRoot())
	return int(resp.GetEntries()), theirs, nil
}

func (g *grpcPeer) Tail(ctx context.Context, after []byte, limit int) ([]mst.Entry, bool, error) {
	req := &peerv1.TailRequest{After: after, Limit: uint32(limit)}
	resp, err := g.api.Tail(ctx, req)
	if err != nil {
		return nil, false, err
	}
	g.count(req, resp)
	out := make([]mst.Entry, len(resp.GetEntries()))
	for i, e := range resp.GetEntries() {
		out[i] = mst.Entry{Key: e.GetKey(), Value: e.GetValue()}
	}
	return out, resp.GetTruncated(), nil
}

func toWire(us []member.Update) []*peerv1.Member {
	out := make([]*peerv1.Member, len(us))
	for i, u := range us {
		out[i] = &peerv1.Member{Id: u.ID, Addr: u.Addr, Incarnation: u.Incarnation, State: peerv1.Member_State(int32(u.State) + 1)}
	}
	return out
}

// fromWire converts received updates, dropping malformed ones.
func fromWire(ms []*peerv1.Member) []member.Update {
	out := make([]member.Update, 0, len(ms))
	for _, m := range ms {
		st := int32(m.GetState()) - 1
		if st < int32(member.Alive) || st > int32(member.Left) || pki.ValidateNodeID(m.GetId()) != nil {
			continue
		}
		if _, _, err := net.SplitHostPort(m.GetAddr()); err != nil {
			continue
		}
		out = append(out, member.Update{ID: m.GetId(), Addr: m.GetAddr(), Incarnation: m.GetIncarnation(), State: member.State(st)})
	}
	return out
}

func joinHostPort(host string, port uint32) string {
	return net.JoinHostPort(host, strconv.FormatUint(uint64(port), 10))
}
