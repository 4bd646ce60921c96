package statd

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/member"
	"github.com/shoal-dev/shoal/pkg/meminfo"
	"github.com/shoal-dev/shoal/pkg/overlay"
	"github.com/shoal-dev/shoal/pkg/pki"
	clusterv1 "github.com/shoal-dev/shoal/proto/shoal/cluster/v1"
	peerv1 "github.com/shoal-dev/shoal/proto/shoal/peer/v1"
)

// clusterServer serves shoal.cluster.v1 on the local socket.
type clusterServer struct {
	clusterv1.UnimplementedClusterServer
	c *cluster
}

func (s *clusterServer) Init(ctx context.Context, req *clusterv1.InitRequest) (*clusterv1.InitResponse, error) {
	c := s.c
	c.life.Lock()
	defer c.life.Unlock()
	if c.active.Load() {
		return nil, fmt.Errorf("this node is already a member of cluster %q: %w", c.info.Name, errdefs.ErrFailedPrecondition)
	}
	name := req.GetClusterName()
	if name == "" {
		name = "shoal"
	}
	adv, err := advertiseAddr(req.GetAdvertiseAddr(), "")
	if err != nil {
		return nil, err
	}
	cidr := req.GetOverlayCidr()
	if cidr == "" {
		cidr = defaultOverlay
	}
	prefix, err := netip.ParsePrefix(cidr)
	if err == nil {
		err = overlay.ValidateOverlay(prefix)
	}
	if err != nil {
		return nil, fmt.Errorf("overlay CIDR %q: %v: %w", cidr, err, errdefs.ErrInvalidArgument)
	}
	if prefix.Masked() != prefix {
		return nil, fmt.Errorf("overlay CIDR %q has host bits set (did you mean %s?): %w", cidr, prefix.Masked(), errdefs.ErrInvalidArgument)
	}
	now := time.Now()
	ca, err := pki.NewCA(name, caValidity, now)
	if err != nil {
		return nil, fmt.Errorf("%v: %w", err, errdefs.ErrInvalidArgument)
	}
	id, err := ca.NewIdentity(c.nodeID, []net.IP{net.ParseIP(adv)}, time.Duration(c.cfg.CertValidity), now)
	if err != nil {
		return nil, err
	}
	tok, err := pki.NewToken(ca)
	if err != nil {
		return nil, err
	}
	info := clusterFile{Name: name, Advertise: adv, PeerPort: c.cfg.PeerPort}
	if err := c.persist(ca, id, info); err != nil {
		return nil, err
	}
	// The first member is trivially in sync with its cluster.
	if err := c.st.SetMeta("last_sync", []byte(strconv.FormatInt(now.UnixNano(), 10))); err != nil {
		return nil, err
	}
	if err := c.activate(ctx, info, nil); err != nil {
		c.forget()
		return nil, err
	}
	if _, err := c.st.Put(ctx, keyClusterConfig, map[string]crdt.Value{
		"name":           crdt.String(name),
		"ca_fingerprint": crdt.String(ca.Fingerprint()),
		"ca_cert":        crdt.String(string(ca.CertPEM())),
		"created":        crdt.String(now.UTC().Format(time.RFC3339)),
		"overlay_cidr":   crdt.String(prefix.String()),
	}); err != nil {
		return nil, err
	}
	if err := c.setToken(ctx, tok); err != nil {
		return nil, err
	}
	return &clusterv1.InitResponse{ClusterName: name, NodeId: c.nodeID, Advertise: joinHostPort(adv, c.cfg.PeerPort), Token: tok.String()}, nil
}

// persist writes the identity and the membership record to the state dir.
func (c *cluster) persist(ca *pki.CA, id *pki.Identity, info clusterFile) error {
	if err := pki.SaveFiles(c.pkiDir(), ca, id); err != nil {
		return err
	}
	data, _ := json.MarshalIndent(info, "", "  ")
	tmp := c.clusterPath() + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, c.clusterPath()); err != nil {
		return err
	}
	c.ca.Store(ca)
	c.identity.Store(id)
	return nil
}

// forget removes the node's membership record and identity.
func (c *cluster) forget() {
	os.Remove(c.clusterPath())
	os.RemoveAll(c.pkiDir())
	c.ca.Store(nil)
	c.identity.Store(nil)
}

// setToken makes tok the cluster's join token: the cluster stores only the
// secret's hash; this node keeps the token itself, locally, to print it.
func (c *cluster) setToken(ctx context.Context, tok pki.Token) error {
	if err := c.st.SetMeta("join_token", []byte(tok.String())); err != nil {
		return err
	}
	_, err := c.st.Put(ctx, keyClusterJoin, map[string]crdt.Value{
		"token_hash":  crdt.String(pki.HashSecret(tok.Secret)),
		"fingerprint": crdt.String(tok.Fingerprint),
		"rotated_by":  crdt.String(c.nodeID),
	})
	return err
}

func (s *clusterServer) Token(ctx context.Context, req *clusterv1.TokenRequest) (*clusterv1.TokenResponse, error) {
	c := s.c
	if !c.active.Load() {
		return nil, errNotMember
	}
	if req.GetRotate() {
		tok, err := pki.NewToken(c.ca.Load())
		if err != nil {
			return nil, err
		}
		if err := c.setToken(ctx, tok); err != nil {
			return nil, err
		}
		return &clusterv1.TokenResponse{Token: tok.String()}, nil
	}
	rec, err := c.st.GetRaw(keyClusterJoin)
	if err != nil {
		return nil, err
	}
	live := rec.Doc.Live()
	hash, _ := live["token_hash"].AsString()
	by, _ := live["rotated_by"].AsString()
	local, _ := c.st.Meta("join_token")
	if tok, err := pki.ParseToken(string(local)); err == nil && pki.VerifySecret(tok.Secret, hash) {
		return &clusterv1.TokenResponse{Token: tok.String()}, nil
	}
	return nil, fmt.Errorf("the current join token was made on node %s and only its hash is replicated; run `shoalctl cluster token` there, or `shoalctl cluster token --rotate` here: %w", by, errdefs.ErrFailedPrecondition)
}

// defaultOverlay is the overlay network when init names none.
const defaultOverlay = "10.42.0.0/16"

var errNotMember = fmt.Errorf("this node is not in a cluster; run `shoalctl cluster init` or `shoalctl cluster join`: %w", errdefs.ErrFailedPrecondition)

func (s *clusterServer) Join(ctx context.Context, req *clusterv1.JoinRequest) (*clusterv1.JoinResponse, error) {
	c := s.c
	c.life.Lock()
	defer c.life.Unlock()
	if c.active.Load() {
		return nil, fmt.Errorf("this node is already a member of cluster %q: %w", c.info.Name, errdefs.ErrFailedPrecondition)
	}
	tok, err := pki.ParseToken(req.GetToken())
	if err != nil {
		return nil, fmt.Errorf("%v: %w", err, errdefs.ErrInvalidArgument)
	}
	addr := req.GetAddr()
	if addr == "" {
		return nil, fmt.Errorf("the address of a member is required: %w", errdefs.ErrInvalidArgument)
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		addr = joinHostPort(addr, DefaultPeerPort)
	}
	adv, err := advertiseAddr(req.GetAdvertiseAddr(), addr)
	if err != nil {
		return nil, err
	}
	key, err := pki.NewNodeKey()
	if err != nil {
		return nil, err
	}
	pub, err := pki.MarshalPublicKey(key.Public())
	if err != nil {
		return nil, err
	}
	tlsCfg, err := pki.JoinClientConfig(tok.Fingerprint)
	if err != nil {
		return nil, fmt.Errorf("%v: %w", err, errdefs.ErrInvalidArgument)
	}
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	host, _ := os.Hostname()
	jctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	resp, err := peerv1.NewPeerClient(conn).Join(jctx, &peerv1.JoinRequest{
		TokenSecret:   tok.Secret,
		NodeId:        c.nodeID,
		PublicKey:     pub,
		AdvertiseAddr: adv,
		PeerPort:      c.cfg.PeerPort,
		Hostname:      host,
	}, grpc.WaitForReady(false))
	if err != nil {
		return nil, fmt.Errorf("join through %s: %w", addr, err)
	}
	ca, err := pki.LoadCA(resp.GetCaCertPem(), resp.GetCaKeyPem())
	if err != nil {
		return nil, fmt.Errorf("join through %s: bad CA: %w", addr, err)
	}
	if ca.Fingerprint() != tok.Fingerprint {
		return nil, fmt.Errorf("join through %s: the cluster's CA does not match the token: %w", addr, errdefs.ErrPermissionDenied)
	}
	keyPEM, err := pki.EncodeKeyPEM(key)
	if err != nil {
		return nil, err
	}
	id, err := pki.LoadIdentity(resp.GetNodeCertPem(), keyPEM)
	if err != nil {
		return nil, fmt.Errorf("join through %s: bad node certificate: %w", addr, err)
	}
	info := clusterFile{Name: resp.GetClusterName(), Advertise: adv, PeerPort: c.cfg.PeerPort}
	if err := c.persist(ca, id, info); err != nil {
		return nil, err
	}
	// Count the join as the first sync: the node holds nothing stale.
	if err := c.st.SetMeta("last_sync", []byte(strconv.FormatInt(time.Now().UnixNano(), 10))); err != nil {
		return nil, err
	}
	if err := c.activate(ctx, info, fromWire(resp.GetMembers())); err != nil {
		c.forget()
		return nil, err
	}
	// Fetch the cluster's state before returning, so the node is useful at
	// once; anti-entropy finishes the job if this round fails.
	for _, m := range c.members.Members() {
		if m.ID == c.nodeID {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := c.gossip.SyncWith(sctx, m.ID)
		cancel()
		if err == nil {
			break
		}
		c.log.Warn("initial sync", "peer", m.ID, "err", err)
	}
	return &clusterv1.JoinResponse{ClusterName: info.Name, NodeId: c.nodeID, Advertise: joinHostPort(adv, c.cfg.PeerPort), Members: uint32(len(c.members.Members()))}, nil
}

func (s *clusterServer) Leave(ctx context.Context, _ *clusterv1.LeaveRequest) (*clusterv1.LeaveResponse, error) {
	c := s.c
	c.life.Lock()
	defer c.life.Unlock()
	if !c.active.Load() {
		return nil, errNotMember
	}
	c.members.Leave()
	if _, err := c.st.Put(ctx, prefixNodes+c.nodeID, map[string]crdt.Value{"left": crdt.Bool(true)}); err != nil {
		return nil, err
	}
	// Give the Left update and the node document a few rounds to spread.
	wait := 3 * time.Duration(c.cfg.ProbeInterval)
	if w := 2 * time.Duration(c.cfg.PushInterval); w > wait {
		wait = w
	}
	select {
	case <-time.After(wait):
	case <-ctx.Done():
	}
	c.deactivate()
	c.forget()
	c.log.Info("left the cluster", "cluster", c.info.Name)
	return &clusterv1.LeaveResponse{}, nil
}

func (s *clusterServer) RemoveNode(ctx context.Context, req *clusterv1.RemoveNodeRequest) (*clusterv1.RemoveNodeResponse, error) {
	c := s.c
	c.life.Lock()
	defer c.life.Unlock()
	if !c.active.Load() {
		return nil, errNotMember
	}
	id := req.GetNodeId()
	switch {
	case id == "":
		return nil, fmt.Errorf("no node given: %w", errdefs.ErrInvalidArgument)
	case id == c.nodeID:
		return nil, fmt.Errorf("node %s is this node: run `shoalctl cluster leave` here to leave the cluster: %w", id, errdefs.ErrFailedPrecondition)
	}
	if _, _, err := c.st.Get(prefixNodes + id); err != nil {
		return nil, fmt.Errorf("node %s: %w", id, err)
	}
	if m, ok := c.members.Member(id); ok && (m.State == member.Alive || m.State == member.Suspect) {
		return nil, fmt.Errorf("node %s is %s: stop it, or run `shoalctl cluster leave` on it, first: %w", id, m.State, errdefs.ErrFailedPrecondition)
	}
	if _, err := c.st.Delete(ctx, prefixNodes+id, nil); err != nil {
		return nil, err
	}
	c.members.Forget(id) // the other members forget it as the deletion reaches them (watchNodes)
	c.log.Info("node removed", "node", id)
	return &clusterv1.RemoveNodeResponse{}, nil
}

func (s *clusterServer) Status(context.Context, *clusterv1.StatusRequest) (*clusterv1.StatusResponse, error) {
	c := s.c
	st := c.st.Status()
	resp := &clusterv1.StatusResponse{
		NodeId:   c.nodeID,
		RootHash: st.Root.String(),
		Keys:     st.Live,
		Counters: st.Counters,
	}
	if !c.active.Load() {
		return resp, nil
	}
	resp.Initialized = true
	resp.ClusterName = c.info.Name
	resp.Advertise = joinHostPort(c.info.Advertise, c.info.PeerPort)
	if id := c.identity.Load(); id != nil {
		resp.CertNotAfter = timestamppb.New(id.NotAfter)
	}
	ms := c.members.Stats()
	resp.Counters["probes_sent"] = ms.ProbesSent
	resp.Counters["suspicions"] = ms.Suspicions
	resp.Counters["dead_declared"] = ms.DeadDeclared
	resp.Counters["refutations"] = ms.Refutations
	peers := c.counters.Snapshot()
	for _, m := range c.members.Members() {
		row := &clusterv1.MemberStatus{
			Id: m.ID, Addr: m.Addr, State: m.State.String(), Incarnation: m.Incarnation,
			Since: timestamppb.New(m.Since), Self: m.ID == c.nodeID,
		}
		if p, ok := peers[m.ID]; ok {
			row.Sync = &clusterv1.PeerSync{
				BytesSent: p.BytesSent, BytesReceived: p.BytesReceived,
				EntriesSent: p.EntriesSent, EntriesReceived: p.EntriesReceived,
				Rounds: p.Rounds, Rejected: p.Rejected, LastError: p.LastError,
			}
			if !p.LastSync.IsZero() {
				row.Sync.LastSync = timestamppb.New(p.LastSync)
			}
		}
		resp.Members = append(resp.Members, row)
	}
	return resp, nil
}

// advertiseAddr validates an explicit advertise IP, or picks the local
// address that routes to peer (when joining), or the first global unicast
// IPv4 address of an up interface.
func advertiseAddr(explicit, peer string) (string, error) {
	if explicit != "" {
		ip := net.ParseIP(explicit)
		if ip == nil || ip.IsUnspecified() {
			return "", fmt.Errorf("advertise address %q is not a usable IP: %w", explicit, errdefs.ErrInvalidArgument)
		}
		return ip.String(), nil
	}
	if peer != "" {
		// A UDP "connection" sends nothing; it only asks the kernel for the
		// route, hence the source address peers will see.
		if conn, err := net.Dial("udp", peer); err == nil {
			defer conn.Close()
			return conn.LocalAddr().(*net.UDPAddr).IP.String(), nil
		}
	}
	ifaces, err := net.Interfaces()
	if err != nil {
		return "", err
	}
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && ipn.IP.IsGlobalUnicast() {
				return ipn.IP.String(), nil
			}
		}
	}
	return "", fmt.Errorf("no usable address found; pass --advertise IP: %w", errdefs.ErrInvalidArgument)
}

// resources reports this machine's CPUs and memory for the node document.
func resources() (cpus int, memory int64) {
	return numCPU(), meminfo.Total()
}

func (s *clusterServer) Identity(context.Context, *clusterv1.IdentityRequest) (*clusterv1.IdentityResponse, error) {
	c := s.c
	if !c.active.Load() {
		return nil, errNotMember
	}
	id, ca := c.identity.Load(), c.ca.Load()
	key, err := id.KeyPEM()
	if err != nil {
		return nil, err
	}
	return &clusterv1.IdentityResponse{
		ClusterName: c.info.Name,
		NodeId:      c.nodeID,
		AdvertiseIp: c.info.Advertise,
		CaCertPem:   ca.CertPEM(),
		NodeCertPem: id.CertPEM(),
		NodeKeyPem:  key,
		NotAfter:    timestamppb.New(id.NotAfter),
	}, nil
}
