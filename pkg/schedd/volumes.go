package schedd

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
		// A release of this task's earlier run that vold has not taken
		// yet must not undo this mount.
		n.releases.forget(volumeUser{volume: m.Name, task: t.ID})
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
// may call it twice. A release vold does not take is retried.
func (n *node) unmountVolumes(ctx context.Context, taskID string, spec sched.ServiceSpec) {
	for _, v := range spec.Volumes {
		m, err := sched.ParseVolume(v)
		if err != nil {
			continue
		}
		n.releases.release(ctx, volumeUser{volume: m.Name, task: taskID})
	}
}

// volumeUser is a task as a user of a volume on this node.
type volumeUser struct{ volume, task string }

const (
	// releaseRetry is how often releases vold did not take are retried.
	releaseRetry = 2 * time.Second
	// releaseTimeout bounds one Unmount call.
	releaseTimeout = 10 * time.Second
)

// volumeReleases tells vold that tasks no longer use volumes, and retries
// what vold did not take: vold down or restarting when a task ended, as
// on a node that restarts, where schedd comes back before vold. vold
// counts a task as a user until it hears of the release, and `volume rm`
// refuses a volume with users, so a release is never given up — nor
// forgotten by a schedd restart: pending releases are kept in a file
// (path) that the next schedd loads.
type volumeReleases struct {
	vold volv1.VolumesClient
	log  *slog.Logger
	// path is the file of pending releases ("": kept in memory only).
	path string

	// mu is held across each Unmount, so that a Mount of the same user
	// (forget) waits for a release in flight rather than being undone by
	// it.
	mu      sync.Mutex
	pending map[volumeUser]bool
}

// release asks vold to drop u, and keeps it for retry if vold does not.
func (r *volumeReleases) release(ctx context.Context, u volumeUser) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.unmount(ctx, u); err != nil {
		if !r.pending[u] {
			r.log.Warn("release volume: retried until vold takes it", "task", u.task, "volume", u.volume, "err", err)
		}
		if r.pending == nil {
			r.pending = map[volumeUser]bool{}
		}
		if !r.pending[u] {
			r.pending[u] = true
			r.save()
		}
		return
	}
	r.drop(u)
}

// forget drops a pending release of u (u mounts again).
func (r *volumeReleases) forget(u volumeUser) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.drop(u)
}

// drop removes u from the pending releases. r.mu is held.
func (r *volumeReleases) drop(u volumeUser) {
	if r.pending[u] {
		delete(r.pending, u)
		r.save()
	}
}

// pendingRelease is a pending release in the file.
type pendingRelease struct {
	Volume string `json:"volume"`
	Task   string `json:"task"`
}

// save writes the pending releases to r.path, replacing the file whole.
// r.mu is held. A failure is logged: the releases are still retried, only
// a restart would forget them.
func (r *volumeReleases) save() {
	if r.path == "" {
		return
	}
	list := make([]pendingRelease, 0, len(r.pending))
	for u := range r.pending {
		list = append(list, pendingRelease{Volume: u.volume, Task: u.task})
	}
	slices.SortFunc(list, func(a, b pendingRelease) int {
		return cmp.Or(cmp.Compare(a.Volume, b.Volume), cmp.Compare(a.Task, b.Task))
	})
	data, err := json.Marshal(list)
	if err == nil {
		err = replaceFile(r.path, data)
	}
	if err != nil {
		r.log.Warn("pending volume releases not saved: a restart would forget them", "err", err)
	}
}

// load reads the pending releases an earlier schedd saved; run retries
// them.
func (r *volumeReleases) load() error {
	data, err := os.ReadFile(r.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var list []pendingRelease
	if err := json.Unmarshal(data, &list); err != nil {
		return fmt.Errorf("%s: %w", r.path, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pending == nil {
		r.pending = map[volumeUser]bool{}
	}
	for _, p := range list {
		r.pending[volumeUser{volume: p.Volume, task: p.Task}] = true
	}
	if len(list) > 0 {
		r.log.Info("volume releases left by the last run: retried until vold takes them", "releases", len(list))
	}
	return nil
}

// retry tries every pending release once.
func (r *volumeReleases) retry(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for u := range r.pending {
		if ctx.Err() != nil {
			return
		}
		if err := r.unmount(ctx, u); err != nil {
			continue
		}
		r.drop(u)
		r.log.Info("volume released", "task", u.task, "volume", u.volume)
	}
}

// run retries pending releases every releaseRetry until ctx ends.
func (r *volumeReleases) run(ctx context.Context) {
	t := time.NewTicker(releaseRetry)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.retry(ctx)
		}
	}
}

// unmount is one Unmount call. A request vold rejects as invalid would
// never be taken: it counts as done.
func (r *volumeReleases) unmount(ctx context.Context, u volumeUser) error {
	cctx, cancel := context.WithTimeout(ctx, releaseTimeout)
	defer cancel()
	_, err := r.vold.Unmount(cctx, &volv1.UnmountRequest{Name: u.volume, User: u.task})
	if status.Code(err) == codes.InvalidArgument {
		r.log.Warn("release volume: vold rejects it", "task", u.task, "volume", u.volume, "err", err)
		return nil
	}
	return err
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
