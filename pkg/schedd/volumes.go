package schedd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

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

// watchVolumes restarts a task whose volume mount died. A FUSE mount
// lives as long as the vold process serving it: when vold is killed (or
// crashes) the container's bind mount of it answers ENOTCONN forever,
// even after the new vold has mounted the volume again on the host. The
// only clean way back is a new container, so the task is stopped and its
// restart policy brings it back with a fresh bind mount.
func (n *node) watchVolumes(ctx context.Context, id string, spec sched.ServiceSpec) {
	var targets []string
	for _, v := range spec.Volumes {
		if m, err := sched.ParseVolume(v); err == nil {
			targets = append(targets, m.Target)
		}
	}
	if len(targets) == 0 {
		return
	}
	var pid uint32
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(2 * time.Second):
		}
		if pid == 0 {
			if pid = n.taskPid(ctx, id); pid == 0 {
				continue
			}
		}
		for _, t := range targets {
			// Seen through the task's own root: the container's mount.
			_, err := os.Stat(filepath.Join("/proc", strconv.Itoa(int(pid)), "root", t))
			if errors.Is(err, syscall.ENOTCONN) || errors.Is(err, syscall.ECONNABORTED) {
				n.log.Warn("task's volume mount is gone (vold restarted): restarting the task", "task", id, "target", t)
				if _, err := n.rt.Stop(ctx, id, spec.WithDefaults().StopGrace.D()); err != nil {
					n.log.Warn("stop task with a dead volume", "task", id, "err", err)
				}
				return
			}
		}
	}
}

// taskPid returns the pid of a task's running process (0 if unknown).
func (n *node) taskPid(ctx context.Context, id string) uint32 {
	infos, err := n.rt.List(ctx)
	if err != nil {
		return 0
	}
	for _, ti := range infos {
		if ti.ID == id && ti.Status == shoalrt.StatusRunning {
			return ti.Pid
		}
	}
	return 0
}
