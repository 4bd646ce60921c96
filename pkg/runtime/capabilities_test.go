package runtime

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/containers"
	capability "github.com/containerd/containerd/v2/pkg/cap"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
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

// Ulimits become the process's rlimits (-1: unlimited), sysctls the
// container's; a ulimit that does not parse is the spec's error.
func TestLimitAndSysctlOpts(t *testing.T) {
	ctx := namespaces.WithNamespace(context.Background(), "test")
	r := &Containerd{}
	opts, err := r.specOpts(nil, TaskSpec{ID: "c", Args: []string{"true"}, Ulimits: []string{"nofile=1024:2048", "core=-1"},
		Sysctls: map[string]string{"kernel.msgmax": "65536"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The image's config is not there to apply: keep the rest.
	s, err := oci.GenerateSpec(ctx, nil, &containers.Container{ID: "c"}, opts[1:]...)
	if err != nil {
		t.Fatal(err)
	}
	want := []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 2048, Soft: 1024}, {Type: "RLIMIT_CORE", Hard: ^uint64(0), Soft: ^uint64(0)}}
	// The default spec's own NOFILE (1024) is replaced.
	if !slices.Equal(s.Process.Rlimits, want) || s.Linux.Sysctl["kernel.msgmax"] != "65536" {
		t.Errorf("rlimits %v (want %v), sysctls %v", s.Process.Rlimits, want, s.Linux.Sysctl)
	}
	if _, err := r.specOpts(nil, TaskSpec{ID: "c", Ulimits: []string{"nofile=x"}}, nil); err == nil {
		t.Error("a ulimit that does not parse was taken")
	}
}

// The /etc/hosts the runtime writes names the task and ends with the
// spec's extra lines.
func TestTaskFilesHosts(t *testing.T) {
	dir := t.TempDir()
	mounts, err := writeTaskFiles(dir, TaskSpec{ID: "web.1", Hosts: []string{"10.0.0.5\tdb.internal"}})
	if err != nil || len(mounts) != 3 {
		t.Fatalf("writeTaskFiles: %v, %v", mounts, err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "hosts"))
	if err != nil || !strings.HasSuffix(string(b), "127.0.1.1\tweb.1\n10.0.0.5\tdb.internal\n") {
		t.Errorf("hosts %q, %v", b, err)
	}
}
