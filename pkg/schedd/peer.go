package schedd

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/shoal-dev/shoal/pkg/peerauth"
	"github.com/shoal-dev/shoal/pkg/pki"
	"github.com/shoal-dev/shoal/pkg/rpc"
	"github.com/shoal-dev/shoal/pkg/sched"
	schedv1 "github.com/shoal-dev/shoal/proto/shoal/sched/v1"
)

// servePeers starts the mutual-TLS scheduler peer API. Every call needs a
// verified cluster certificate.
func (n *node) servePeers(ctx context.Context, ip string) error {
	lis, err := net.Listen("tcp", net.JoinHostPort(ip, fmt.Sprint(n.cfg.PeerPort)))
	if err != nil {
		return fmt.Errorf("scheduler peer listener: %w", err)
	}
	unary, stream := rpc.ServerInterceptors(n.log.With("component", "peer"))
	srv := grpc.NewServer(
		grpc.Creds(credentials.NewTLS(pki.ServerConfig(n.identity.Cert, n.identity.CA))),
		grpc.ChainUnaryInterceptor(unary, peerauth.Unary),
		grpc.ChainStreamInterceptor(stream, peerauth.Stream),
		grpc.MaxRecvMsgSize(16<<20),
	)
	schedv1.RegisterSchedPeerServer(srv, &peerServer{n: n})
	go srv.Serve(lis)
	go func() { <-ctx.Done(); srv.Stop() }()
	return nil
}

// peerServer serves shoal.sched.v1.SchedPeer.
type peerServer struct {
	schedv1.UnimplementedSchedPeerServer
	n *node
}

func (s *peerServer) Reserve(ctx context.Context, req *schedv1.ReserveRequest) (*schedv1.ReserveResponse, error) {
	var a sched.Reserve
	if err := json.Unmarshal(req.GetReserve(), &a); err != nil {
		return nil, fmt.Errorf("reserve: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if a.TaskID == "" || a.Service == "" || a.Slot == "" {
		return nil, fmt.Errorf("reserve without task, service or slot: %w", errdefs.ErrInvalidArgument)
	}
	// A newer owner's spec may hold fields this schedd does not know,
	// which decoding dropped: refused, as an owner that knew this node's
	// fields would not have asked.
	var raw struct{ Spec json.RawMessage }
	if json.Unmarshal(req.GetReserve(), &raw) == nil {
		if unknown := sched.UnknownSpecFields(raw.Spec); len(unknown) > 0 {
			why, _ := json.Marshal(sched.Reject{Class: sched.RejectSchedd, Detail: strings.Join(unknown, ",")})
			return &schedv1.ReserveResponse{Reject: why}, nil
		}
	}
	ok, free, why, err := s.n.acceptReserve(ctx, a)
	if err != nil {
		return nil, err
	}
	resp := &schedv1.ReserveResponse{Accepted: ok, FreeCpuMillis: free.CPUMillis, FreeMemoryBytes: free.MemoryBytes}
	if !ok {
		resp.Reject, _ = json.Marshal(why)
	}
	return resp, nil
}

func (s *peerServer) ImageBlobs(ctx context.Context, req *schedv1.ImageBlobsRequest) (*schedv1.ImageBlobsResponse, error) {
	return s.n.imageBlobs(ctx, req.GetRef())
}

func (s *peerServer) GetBlob(req *schedv1.GetBlobRequest, stream schedv1.SchedPeer_GetBlobServer) error {
	return s.n.sendBlob(stream.Context(), req.GetDigest(), stream)
}

func (s *peerServer) TaskLogs(req *schedv1.TaskLogsRequest, stream schedv1.SchedPeer_TaskLogsServer) error {
	return s.n.localLogs(stream.Context(), req, stream.Send)
}

func (s *peerServer) TaskExec(stream schedv1.SchedPeer_TaskExecServer) error {
	return s.n.localExec(stream)
}

func (s *peerServer) TaskStats(req *schedv1.TaskStatsRequest, stream schedv1.SchedPeer_TaskStatsServer) error {
	interval := req.GetInterval().AsDuration()
	if req.GetInterval() != nil && interval < minStatsInterval {
		return fmt.Errorf("stats interval %v is below %v: %w", interval, minStatsInterval, errdefs.ErrInvalidArgument)
	}
	return s.n.localStats(stream.Context(), req.GetTasks(), interval, req.GetCount(), stream.Send)
}

// peerPool keeps one connection per node's scheduler peer API.
type peerPool struct {
	n     *node
	mu    sync.Mutex
	conns map[string]*peerConn
}

type peerConn struct {
	addr string
	conn *grpc.ClientConn
	api  schedv1.SchedPeerClient
}

func newPeerPool(n *node) *peerPool { return &peerPool{n: n, conns: map[string]*peerConn{}} }

// client returns the peer API of node id.
func (p *peerPool) client(_ context.Context, id string) (schedv1.SchedPeerClient, error) {
	addr, err := p.n.nodeAddr(id)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if pc := p.conns[id]; pc != nil && pc.addr == addr {
		return pc.api, nil
	} else if pc != nil {
		pc.conn.Close()
	}
	conn, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(credentials.NewTLS(pki.ClientConfig(p.n.identity.Cert, p.n.identity.CA, id))),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)),
	)
	if err != nil {
		return nil, err
	}
	pc := &peerConn{addr: addr, conn: conn, api: schedv1.NewSchedPeerClient(conn)}
	p.conns[id] = pc
	return pc.api, nil
}
