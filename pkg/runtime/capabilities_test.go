package runtime

import (
	"context"
	"slices"
	"testing"

	"github.com/containerd/containerd/v2/core/containers"
	capability "github.com/containerd/containerd/v2/pkg/cap"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
)

// Docker's rules on the default set: a plain add and drop change it; ALL
// added grants every known capability less those dropped; ALL dropped
// keeps only those added.
func TestCapabilityOpts(t *testing.T) {
	ctx := namespaces.WithNamespace(context.Background(), "test")
	effective := func(add, drop []string) []string {
		t.Helper()
		s, err := oci.GenerateSpec(ctx, nil, &containers.Container{ID: "c"}, capabilityOpts(add, drop)...)
		if err != nil {
			t.Fatal(err)
		}
		c := s.Process.Capabilities
		if !slices.Equal(c.Effective, c.Bounding) || !slices.Equal(c.Effective, c.Permitted) {
			t.Errorf("add %v drop %v: effective %v, bounding %v, permitted %v differ", add, drop, c.Effective, c.Bounding, c.Permitted)
		}
		return c.Effective
	}
	def := effective(nil, nil)
	if !slices.Contains(def, "CAP_CHOWN") || slices.Contains(def, "CAP_NET_ADMIN") {
		t.Fatalf("default set %v: want CHOWN, not NET_ADMIN", def)
	}
	got := effective([]string{"CAP_NET_ADMIN"}, []string{"CAP_CHOWN"})
	if !slices.Contains(got, "CAP_NET_ADMIN") || slices.Contains(got, "CAP_CHOWN") || len(got) != len(def) {
		t.Errorf("add NET_ADMIN, drop CHOWN: %v", got)
	}
	if got := effective([]string{"ALL"}, []string{"CAP_SYS_ADMIN"}); len(got) != len(capability.Known())-1 || slices.Contains(got, "CAP_SYS_ADMIN") {
		t.Errorf("add ALL, drop SYS_ADMIN: %d capabilities %v", len(got), got)
	}
	if got := effective([]string{"CAP_NET_BIND_SERVICE"}, []string{"ALL"}); !slices.Equal(got, []string{"CAP_NET_BIND_SERVICE"}) {
		t.Errorf("drop ALL, add NET_BIND_SERVICE: %v", got)
	}
}
