package schedd

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/shoal-dev/shoal/pkg/sched"
	volv1 "github.com/shoal-dev/shoal/proto/shoal/vol/v1"
)

// inspectOnly is a vold that answers InspectVolume from members and
// counts the calls; volumes it does not know are NOT_FOUND, and while
// down every call fails as a vold that does not answer.
type inspectOnly struct {
	volv1.VolumesClient
	members map[string][]string
	calls   map[string]int
	down    bool
}

func (f *inspectOnly) InspectVolume(_ context.Context, req *volv1.InspectVolumeRequest, _ ...grpc.CallOption) (*volv1.Volume, error) {
	f.calls[req.GetName()]++
	if f.down {
		return nil, status.Error(codes.Unavailable, "connection refused")
	}
	nodes, ok := f.members[req.GetName()]
	if !ok {
		return nil, status.Error(codes.NotFound, "no such volume")
	}
	v := &volv1.Volume{Name: req.GetName()}
	for _, n := range nodes {
		v.Members = append(v.Members, &volv1.Member{Node: n})
	}
	return v, nil
}

// TestVolumeReplicas checks what owners tell placement of the volumes a
// service mounts: the members' nodes, asked of vold once per
// replicasMaxAge, those of the spec being updated from too, and nothing
// for a volume vold does not answer about or a service that mounts none.
func TestVolumeReplicas(t *testing.T) {
	vold := &inspectOnly{members: map[string][]string{"data": {"n1", "n3"}, "old": {"n2"}}, calls: map[string]int{}}
	var r volumeReplicas
	t0 := time.Unix(1_000_000, 0)
	prev := sched.ServiceSpec{Volumes: []string{"old:/x"}}
	svc := &sched.Service{Spec: sched.ServiceSpec{Volumes: []string{"data:/var/lib/db", "gone:/g:ro"}}, PrevSpec: &prev}
	want := map[string][]string{"data": {"n1", "n3"}, "old": {"n2"}}
	if got := r.of(context.Background(), vold, svc, t0); !maps.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("of = %v, want %v", got, want)
	}
	r.of(context.Background(), vold, svc, t0.Add(replicasMaxAge/2))
	if vold.calls["data"] != 1 || vold.calls["gone"] != 1 {
		t.Fatalf("asked vold %v within replicasMaxAge, want once each", vold.calls)
	}
	vold.members["data"] = []string{"n4"}
	if got := r.of(context.Background(), vold, svc, t0.Add(replicasMaxAge)); !slices.Equal(got["data"], []string{"n4"}) || vold.calls["data"] != 2 {
		t.Fatalf("after replicasMaxAge: %v (asked %d times), want data on n4, asked again", got, vold.calls["data"])
	}
	if got := r.of(context.Background(), vold, &sched.Service{Spec: sched.ServiceSpec{Image: "x"}}, t0); got != nil {
		t.Fatalf("a service without volumes: %v, want nil", got)
	}
	if got := r.of(context.Background(), nil, svc, t0); got != nil {
		t.Fatalf("without a vold client: %v, want nil", got)
	}
	// A vold that does not answer is asked once per round, not once per
	// volume, and its volumes count for no node.
	vold.down = true
	before := vold.calls["data"] + vold.calls["gone"] + vold.calls["old"]
	if got := r.of(context.Background(), vold, svc, t0.Add(2*replicasMaxAge)); len(got) != 0 {
		t.Fatalf("with vold down: %v, want nothing", got)
	}
	if asked := vold.calls["data"] + vold.calls["gone"] + vold.calls["old"] - before; asked != 1 {
		t.Fatalf("with vold down it was asked %d times in one round, want 1", asked)
	}
}
