package schedd

import (
	"context"
	"fmt"

	shoalrt "github.com/shoal-dev/shoal/pkg/runtime"
	"github.com/shoal-dev/shoal/pkg/sched"
	volv1 "github.com/shoal-dev/shoal/proto/shoal/vol/v1"
)

// mountVolumes asks shoal-vold to mount the task's volumes on this node
// and bind-mounts each into the container. vold counts the task as a user
// of the volume until unmountVolumes, which is what keeps `volume rm` from
// pulling a volume out from under a running task.
func (n *node) mountVolumes(ctx context.Context, t sched.Task, spec sched.ServiceSpec, ts *shoalrt.TaskSpec) error {
	for _, v := range spec.Volumes {
		m, err := sched.ParseVolume(v)
		if err != nil {
			return err // validated on create: only a hand-edited document gets here
		}
		resp, err := n.vold.Mount(ctx, &volv1.MountRequest{Name: m.Name, User: t.ID})
		if err != nil {
			return fmt.Errorf("volume %s from shoal-vold: %w", m.Name, err)
		}
		ts.Mounts = append(ts.Mounts, shoalrt.Mount{Source: resp.GetPath(), Target: m.Target, ReadOnly: m.ReadOnly})
	}
	return nil
}

// unmountVolumes tells vold that the task no longer uses its volumes. It
// is idempotent on vold's side, so a task that ends and is then removed
// may call it twice.
func (n *node) unmountVolumes(ctx context.Context, taskID string, spec sched.ServiceSpec) {
	for _, v := range spec.Volumes {
		m, err := sched.ParseVolume(v)
		if err != nil {
			continue
		}
		if _, err := n.vold.Unmount(ctx, &volv1.UnmountRequest{Name: m.Name, User: taskID}); err != nil {
			n.log.Warn("release volume", "task", taskID, "volume", m.Name, "err", err)
		}
	}
}
