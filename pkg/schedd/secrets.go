package schedd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	shoalrt "github.com/shoal-dev/shoal/pkg/runtime"
	"github.com/shoal-dev/shoal/pkg/sched"
	"github.com/shoal-dev/shoal/pkg/secret"
	clusterv1 "github.com/shoal-dev/shoal/proto/shoal/cluster/v1"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

// A task's secrets (and configs) are files in a tmpfs of its own,
// <state>/secrets/<task>, each bind-mounted read-only into the container:
// the data statd opened never touches a disk. The tmpfs lives as long as
// the task can run again; it goes when the task ends for good or is
// removed, and a schedd that starts drops those whose task is gone.

// fileKind is secrets or configs: where statd keeps them (statd's
// secrets.go), and how a spec names them.
type fileKind struct {
	noun, prefix string
	config       bool
	entries      func(sched.ServiceSpec) []string
	parse        func(string) (sched.FileMount, error)
}

var (
	secretKind = fileKind{noun: "secret", prefix: "/secrets/",
		entries: func(s sched.ServiceSpec) []string { return s.Secrets }, parse: sched.ParseSecret}
	configKind = fileKind{noun: "config", prefix: "/configs/", config: true,
		entries: func(s sched.ServiceSpec) []string { return s.Configs }, parse: sched.ParseConfig}
	fileKinds = []fileKind{secretKind, configKind}
)

func kindOf(config bool) fileKind {
	if config {
		return configKind
	}
	return secretKind
}

// secretDir is the tmpfs of a task's secrets.
func (n *node) secretDir(taskID string) string {
	return filepath.Join(n.cfg.StateDir, "secrets", taskID)
}

// mountSecrets writes the task's secrets into its tmpfs and adds their
// bind mounts to ts. A task restarted in place writes them again, from
// the secret as it is now.
func (n *node) mountSecrets(ctx context.Context, t sched.Task, spec sched.ServiceSpec, ts *shoalrt.TaskSpec) error {
	type file struct {
		target string
		data   []byte
	}
	var files []file
	total := 0
	for _, k := range fileKinds {
		for _, s := range k.entries(spec) {
			m, err := k.parse(s)
			if err != nil {
				return err // validated on create: only a hand-edited document gets here
			}
			resp, err := n.readSecret(ctx, k, m.Name)
			if err != nil {
				return fmt.Errorf("%s %s from shoal-statd: %w", k.noun, m.Name, err)
			}
			files = append(files, file{m.Target, resp.GetData()})
			total += len(resp.GetData())
		}
	}
	if len(files) == 0 {
		return nil
	}
	dir := n.secretDir(t.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	mounted, err := mountinfo.Mounted(dir)
	if err != nil {
		return err
	}
	if !mounted {
		// Room for every file in its own pages, and a little more.
		size := total + len(files)*4096 + 64<<10
		opts := "mode=0700,size=" + strconv.Itoa(size)
		if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
			return fmt.Errorf("tmpfs for the secrets of task %s: %w", t.ID, err)
		}
	}
	for i, f := range files {
		// Numbered, not named after the target: two secrets may share a
		// base name in different directories.
		src := filepath.Join(dir, strconv.Itoa(i))
		if err := writeSecretFile(src, f.data); err != nil {
			return fmt.Errorf("secret for %s: %w", f.target, err)
		}
		ts.Mounts = append(ts.Mounts, shoalrt.Mount{Source: src, Target: f.target, ReadOnly: true})
	}
	return nil
}

// secretArrival bounds how long a task's start waits for a secret this
// node's statd does not have yet: one created on another node a moment
// before (a stack deploy creates its secrets, then its services) reaches
// it by gossip within a second or so.
const secretArrival = 10 * time.Second

// readSecret reads secret (or config) name from this node's statd,
// waiting up to secretArrival for it to arrive.
func (n *node) readSecret(ctx context.Context, k fileKind, name string) (*clusterv1.ReadSecretResponse, error) {
	var resp *clusterv1.ReadSecretResponse
	var err error
	until(ctx, secretArrival, 200*time.Millisecond, func() bool {
		resp, err = n.statd.Secrets.ReadSecret(ctx, &clusterv1.ReadSecretRequest{Name: name, Config: k.config})
		return status.Code(err) != codes.NotFound
	})
	return resp, err
}

// writeSecretFile replaces path with data, readable by every user of the
// container (Docker Swarm's 0444): a service's processes need not run as
// root to read their secrets.
func writeSecretFile(path string, data []byte) error {
	tmp := path + ".new"
	if err := os.WriteFile(tmp, data, 0o444); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o444); err != nil { // umask
		return err
	}
	return os.Rename(tmp, path)
}

// unmountSecrets drops a task's secrets; idempotent.
func (n *node) unmountSecrets(taskID string) {
	dir := n.secretDir(taskID)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return
	}
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
		n.log.Warn("unmount task secrets", "task", taskID, "err", err)
		return
	}
	if err := os.RemoveAll(dir); err != nil {
		n.log.Warn("remove task secrets", "task", taskID, "err", err)
	}
}

// dropStaleSecrets drops the secrets of tasks that will not run again or
// that this node no longer has (removed while schedd was away). Callers
// hold amu.
func (n *node) dropStaleSecrets() {
	entries, _ := os.ReadDir(filepath.Join(n.cfg.StateDir, "secrets"))
	for _, e := range entries {
		if lt := n.local[e.Name()]; lt == nil || lt.State.Terminal() {
			n.unmountSecrets(e.Name())
		}
	}
}

// checkSecrets refuses a spec that names a secret or config statd does
// not have, unless pending holds its key (the caller creates it first).
func (n *node) checkSecrets(ctx context.Context, spec sched.ServiceSpec, pending map[string]bool) error {
	for _, k := range fileKinds {
		for _, s := range k.entries(spec) {
			m, err := k.parse(s)
			if err != nil {
				return fmt.Errorf("%v: %w", err, errdefs.ErrInvalidArgument)
			}
			if pending[k.prefix+m.Name] {
				continue
			}
			_, err = n.statd.Get(ctx, &statev1.GetRequest{Key: k.prefix + m.Name})
			if status.Code(err) == codes.NotFound {
				return fmt.Errorf("%s %s does not exist: create it with `shoalctl %s create %s FILE`: %w", k.noun, m.Name, k.noun, m.Name, errdefs.ErrInvalidArgument)
			}
			if err != nil {
				return fmt.Errorf("%s %s: %w", k.noun, m.Name, err)
			}
		}
	}
	return nil
}

// secretUsers lists the services whose spec, or previous spec, names
// secret (or config) name.
func (n *node) secretUsers(k fileKind, name string) []string {
	return n.specUsers(func(spec sched.ServiceSpec) bool {
		for _, s := range k.entries(spec) {
			if m, err := k.parse(s); err == nil && m.Name == name {
				return true
			}
		}
		return false
	})
}

// removeSecret deletes secret (or config) name once no service names it.
func (n *node) removeSecret(ctx context.Context, k fileKind, name string) error {
	if err := secret.ValidName(name); err != nil {
		return fmt.Errorf("%s %v: %w", k.noun, err, errdefs.ErrInvalidArgument)
	}
	key := k.prefix + name
	_, err := n.statd.Get(ctx, &statev1.GetRequest{Key: key})
	if status.Code(err) == codes.NotFound {
		return fmt.Errorf("%s %s does not exist (`shoalctl %s ls` lists them): %w", k.noun, name, k.noun, errdefs.ErrNotFound)
	}
	if err != nil {
		return err
	}
	if users := n.secretUsers(k, name); len(users) > 0 {
		return fmt.Errorf("%s %s is used by service %s (its spec, or the previous one a rollback returns to): remove them, or update them without it, first: %w",
			k.noun, name, strings.Join(users, ", "), errdefs.ErrFailedPrecondition)
	}
	if _, err := n.statd.Delete(ctx, &statev1.DeleteRequest{Key: key}); err != nil {
		return fmt.Errorf("delete %s %s: %w", k.noun, name, err)
	}
	n.log.Info(k.noun+" removed", k.noun, name)
	return nil
}
