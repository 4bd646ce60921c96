package schedd

import (
	"context"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/shoal-dev/shoal/pkg/sched"
	volv1 "github.com/shoal-dev/shoal/proto/shoal/vol/v1"
)

// replicasMaxAge is how long an owner goes by what vold said of a
// volume's replicas before asking again.
const replicasMaxAge = 5 * time.Second

// volumeReplicas remembers, per volume, the nodes that hold a replica of
// it as this node's vold last said (InspectVolume), for the services this
// node owns that mount volumes: placement prefers those nodes
// (sched.Snapshot.VolumeReplicas), where the volume is served by a local
// replica instead of forwarding every operation. It is only a preference:
// a volume vold cannot tell about is left out, and placement goes on.
type volumeReplicas struct {
	mu   sync.Mutex
	seen map[string]replicaSet
}

type replicaSet struct {
	nodes []string // nil: vold did not tell
	at    time.Time
}

// of returns the replica nodes of every volume that svc's spec (or the
// spec it is being updated from) mounts, asking vold about those not
// asked within replicasMaxAge, each for at most a second.
func (r *volumeReplicas) of(ctx context.Context, vold volv1.VolumesClient, svc *sched.Service, now time.Time) map[string][]string {
	if svc == nil || vold == nil {
		return nil
	}
	mounts := slices.Clone(svc.Spec.Volumes)
	if svc.PrevSpec != nil {
		mounts = append(mounts, svc.PrevSpec.Volumes...)
	}
	if len(mounts) == 0 {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seen == nil {
		r.seen = map[string]replicaSet{}
	}
	out := map[string][]string{}
	// Once vold does not answer, the other volumes are not asked about
	// either until replicasMaxAge has passed: a vold that is down costs
	// the owner's round one second, not one per volume.
	answering := true
	for _, v := range mounts {
		m, err := sched.ParseVolume(v)
		if err != nil {
			continue
		}
		s, ok := r.seen[m.Name]
		if !ok || now.Sub(s.at) >= replicasMaxAge {
			s = replicaSet{at: now}
			if answering {
				s.nodes, answering = askReplicas(ctx, vold, m.Name)
			}
			r.seen[m.Name] = s
		}
		if s.nodes != nil {
			out[m.Name] = s.nodes
		}
	}
	for name, s := range r.seen {
		if now.Sub(s.at) > 10*replicasMaxAge {
			delete(r.seen, name) // no owned service mounts it any more
		}
	}
	return out
}

// askReplicas returns the nodes of volume's members, nil if vold does not
// know the volume or does not answer within a second; answered is false
// in the latter case.
func askReplicas(ctx context.Context, vold volv1.VolumesClient, volume string) (nodes []string, answered bool) {
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	v, err := vold.InspectVolume(cctx, &volv1.InspectVolumeRequest{Name: volume})
	if err != nil {
		return nil, status.Code(err) == codes.NotFound
	}
	nodes = []string{}
	for _, m := range v.GetMembers() {
		nodes = append(nodes, m.GetNode())
	}
	return nodes, true
}
