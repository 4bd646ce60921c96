// Package peerauth is what every daemon's peer API shares about cluster
// mutual TLS: which node called (the node ID in the certificate the
// handshake verified), interceptors that refuse callers without one, and
// the node's own certificate and CA, obtained from the local statd and
// followed as statd renews them.
//
// Daemons other than statd hold no key material of their own: statd owns
// the node identity, and a daemon that needs to talk to its peers asks for
// it over statd.sock. The TLS configs (pki.ServerConfig, pki.ClientConfig)
// read the identity on every handshake, so a renewal needs no restart.
package peerauth

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/shoal-dev/shoal/pkg/pki"
	clusterv1 "github.com/shoal-dev/shoal/proto/shoal/cluster/v1"
)

// NodeID returns the node ID of the verified cluster certificate the
// caller presented, or an Unauthenticated error.
func NodeID(ctx context.Context) (string, error) {
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			if id, ok := pki.PeerNodeID(ti.State); ok {
				return id, nil
			}
		}
	}
	return "", fmt.Errorf("a cluster certificate is required: %w", errdefs.ErrUnauthenticated)
}

// Unary refuses every call from a caller without a cluster certificate.
func Unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if _, err := NodeID(ctx); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

// Stream is Unary for streams.
func Stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if _, err := NodeID(ss.Context()); err != nil {
		return err
	}
	return h(srv, ss)
}

// Identity is this node's certificate and the cluster CA, as statd gives
// them. The zero value holds nothing until Set (or Wait) succeeds.
type Identity struct {
	cert atomic.Pointer[pki.Identity]
	ca   atomic.Pointer[x509.CertPool]
}

// Cert returns the node certificate (nil before Set); pass it as the
// identity function of pki.ServerConfig and pki.ClientConfig.
func (i *Identity) Cert() *pki.Identity { return i.cert.Load() }

// CA returns the cluster CA pool (nil before Set).
func (i *Identity) CA() *x509.CertPool { return i.ca.Load() }

// Set installs the identity of a statd Identity answer.
func (i *Identity) Set(resp *clusterv1.IdentityResponse) error {
	id, err := pki.LoadIdentity(resp.GetNodeCertPem(), resp.GetNodeKeyPem())
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(resp.GetCaCertPem()) {
		return errors.New("bad CA certificate from statd")
	}
	i.cert.Store(id)
	i.ca.Store(pool)
	return nil
}

// Wait asks statd for the identity every second until the node is in a
// cluster (logging once that it waits), installs it and returns statd's
// answer.
func (i *Identity) Wait(ctx context.Context, statd clusterv1.ClusterClient, log *slog.Logger) (*clusterv1.IdentityResponse, error) {
	logged := false
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := statd.Identity(cctx, &clusterv1.IdentityRequest{})
		cancel()
		if err == nil {
			if err = i.Set(resp); err == nil {
				return resp, nil
			}
		}
		if !logged {
			log.Info("waiting for this node to be in a cluster", "reason", err)
			logged = true
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// Follow picks up the certificates statd renews, checking every 30 s,
// until ctx ends. Call it after Wait.
func (i *Identity) Follow(ctx context.Context, statd clusterv1.ClusterClient, log *slog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(30 * time.Second):
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := statd.Identity(cctx, &clusterv1.IdentityRequest{})
		cancel()
		if cur := i.Cert(); err == nil && (cur == nil || !resp.GetNotAfter().AsTime().Equal(cur.NotAfter)) {
			if err := i.Set(resp); err == nil {
				log.Info("node certificate reloaded", "not_after", resp.GetNotAfter().AsTime())
			}
		}
	}
}
