package peerauth

import (
	"context"
	"errors"
	"testing"

	"github.com/containerd/errdefs"

	clusterv1 "github.com/shoal-dev/shoal/proto/shoal/cluster/v1"
)

func TestNodeIDWithoutCertificate(t *testing.T) {
	if id, err := NodeID(context.Background()); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Fatalf("NodeID without a peer = %q, %v; want Unauthenticated", id, err)
	}
	called := false
	_, err := Unary(context.Background(), nil, nil, func(context.Context, any) (any, error) { called = true; return nil, nil })
	if !errors.Is(err, errdefs.ErrUnauthenticated) || called {
		t.Fatalf("Unary let a caller without a certificate through: %v (handler called: %v)", err, called)
	}
}

func TestSetRefusesBadPEM(t *testing.T) {
	var i Identity
	if err := i.Set(&clusterv1.IdentityResponse{NodeCertPem: []byte("x"), NodeKeyPem: []byte("y"), CaCertPem: []byte("z")}); err == nil {
		t.Fatal("Set accepted garbage")
	}
	if i.Cert() != nil || i.CA() != nil {
		t.Fatal("a refused Set installed something")
	}
}
