package vold

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/shoal-dev/shoal/pkg/volfs"
	"github.com/shoal-dev/shoal/pkg/volfuse"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

// Mounts. A node mounts a volume once, at <mount-dir>/<name>, for any
// number of users (tasks); the users are recorded in
// /volumemounts/<name>/<node>, written only by that node, so that
// RemoveVolume anywhere sees who uses a volume and a restarted vold knows
// what to mount again. A mount's FUSE session outlives vold when a holder
// keeps it (fuse.go): the next vold serves it again. Otherwise the FUSE
// server dies with the process, and at start vold clears stale mount
// points and remounts what still has users.

// mount is one mounted volume on this node.
type mount struct {
	name  string
	path  string
	users map[string]bool
	srv   *volfuse.Server
}

func (n *node) mountPath(name string) string { return filepath.Join(n.cfg.MountDir, name) }

// mount mounts volume name on this node (once) for user and returns the
// host path.
func (n *node) mount(ctx context.Context, name, user string) (string, error) {
	if err := n.awaitRestore(ctx); err != nil {
		return "", err
	}
	d, err := n.knownVolume(ctx, name)
	if err != nil {
		return "", err
	}
	n.mountMu.Lock()
	defer n.mountMu.Unlock()
	if err := n.fencedLocked(name, d.Group); err != nil {
		return "", err
	}
	m, err := n.mountLocked(name, nil)
	if err != nil {
		return "", err
	}
	if m.users[user] {
		return m.path, nil
	}
	m.users[user] = true
	if err := n.writeMountDoc(ctx, m); err != nil {
		delete(m.users, user)
		if len(m.users) == 0 {
			n.unmountLocked(m)
		}
		return "", err
	}
	n.log.Info("volume mount user added", "volume", name, "user", user, "path", m.path, "users", len(m.users))
	return m.path, nil
}

// mountLocked returns the volume's mount, mounting it if needed: serving
// kept session sess again when there is one.
func (n *node) mountLocked(name string, sess *volfuse.Session) (*mount, error) {
	if m := n.mounts[name]; m != nil {
		return m, nil
	}
	path := n.mountPath(name)
	c := &volfs.Client{B: &volumeBackend{n: n, name: name}}
	var (
		srv *volfuse.Server
		err error
	)
	if sess != nil {
		srv, err = adoptFUSE(n.log, path, n.id, name, *sess, c)
		if err != nil {
			return nil, fmt.Errorf("serve the kept mount of volume %q at %s: %w", name, path, err)
		}
	} else {
		if err := os.MkdirAll(path, 0o755); err != nil {
			return nil, fmt.Errorf("mount point for volume %q: %w", name, err)
		}
		srv, err = mountFUSE(n.log, path, n.id, name, c)
		if err != nil {
			return nil, fmt.Errorf("mount volume %q at %s: %w", name, path, err)
		}
		n.log.Info("volume mounted", "volume", name, "path", path)
	}
	n.sess.put(name, srv)
	m := &mount{name: name, path: path, users: map[string]bool{}, srv: srv}
	n.mounts[name] = m
	return m, nil
}

func (n *node) unmountLocked(m *mount) {
	n.sess.remove(m.name)
	if err := m.srv.Unmount(); err != nil {
		n.log.Warn("unmount volume", "volume", m.name, "path", m.path, "err", err)
	} else {
		n.log.Info("volume unmounted", "volume", m.name, "path", m.path)
	}
	delete(n.mounts, m.name)
}

// unmount drops user's use of a volume on this node; the last user
// unmounts it. Dropping a user that is not there is not an error.
func (n *node) unmount(ctx context.Context, name, user string) error {
	if err := n.awaitRestore(ctx); err != nil {
		return err
	}
	n.mountMu.Lock()
	defer n.mountMu.Unlock()
	m := n.mounts[name]
	if m == nil {
		// Not mounted (vold restarted and the volume is gone, say): still
		// clear the record.
		m = &mount{name: name, users: map[string]bool{}}
		for _, u := range n.recordedUsers(name) {
			m.users[u] = true
		}
		if !m.users[user] {
			return nil
		}
		delete(m.users, user)
		return n.writeMountDoc(ctx, m)
	}
	if !m.users[user] {
		return nil
	}
	delete(m.users, user)
	if err := n.writeMountDoc(ctx, m); err != nil {
		m.users[user] = true
		return err
	}
	n.log.Info("volume mount user dropped", "volume", name, "user", user, "users", len(m.users))
	if len(m.users) == 0 {
		n.unmountLocked(m)
	}
	return nil
}

// writeMountDoc records a mount's users (deleting the record when none).
func (n *node) writeMountDoc(ctx context.Context, m *mount) error {
	key := mountKey(m.name, n.id)
	if len(m.users) == 0 {
		if _, err := n.statd.Delete(ctx, &statev1.DeleteRequest{Key: key}); err != nil {
			return fmt.Errorf("clear mount record of volume %q: %w", m.name, err)
		}
		return nil
	}
	users := make([]string, 0, len(m.users))
	for u := range m.users {
		users = append(users, u)
	}
	slices.Sort(users)
	b, _ := json.Marshal(users)
	_, err := n.statd.Put(ctx, &statev1.PutRequest{Key: key, Fields: map[string]*statev1.Value{
		fieldUsers: {Kind: &statev1.Value_StringValue{StringValue: string(b)}},
		fieldPath:  {Kind: &statev1.Value_StringValue{StringValue: m.path}},
	}})
	if err != nil {
		return fmt.Errorf("record mount of volume %q: %w", m.name, err)
	}
	return nil
}

func decodeUsers(d *statev1.Document) []string {
	var users []string
	_ = json.Unmarshal([]byte(d.GetFields()[fieldUsers].GetStringValue()), &users)
	return users
}

// recordedUsers returns this node's recorded users of a volume.
func (n *node) recordedUsers(name string) []string {
	if d := n.mirror.Get(mountKey(name, n.id)); d != nil {
		return decodeUsers(d)
	}
	return nil
}

// mountUsers returns the nodes that mount a volume and its users, from
// the mirror.
func (n *node) mountUsers(name string) (nodes, users []string) {
	prefix := mountsPrefix + name + "/"
	for _, d := range n.mirror.List(prefix) {
		u := decodeUsers(d)
		if len(u) == 0 {
			continue
		}
		nodes = append(nodes, strings.TrimPrefix(d.GetKey(), prefix))
		users = append(users, u...)
	}
	slices.Sort(nodes)
	slices.Sort(users)
	return nodes, slices.Compact(users)
}

// fenceMountUsers lists a volume's users on every node, as "user on
// node", and fences the volume on every node that has none (see
// mountusers.go): call lift unless the volume is then removed. Users on
// nodes that left the cluster do not count; those on dead nodes do (the
// node may come back with its tasks), and say so.
//
// Each live node's own vold is asked for its record: the node that
// writes a record is the one that knows it, where this node's statd may
// not have heard of an unmount there yet (`volume rm` right after a
// service's tasks stopped elsewhere was refused) or of a mount (the
// volume would be removed under its user). A node whose vold does not
// answer counts as this node's statd has it.
func (n *node) fenceMountUsers(ctx context.Context, f removalFence) (users []string, lift func(), err error) {
	prefix := mountsPrefix + f.Name + "/"
	resp, err := n.statd.List(ctx, &statev1.ListRequest{Prefix: prefix, PageSize: 1000})
	if err != nil {
		return nil, nil, fmt.Errorf("list mounts of volume %q: %w", f.Name, err)
	}
	byNode := map[string][]string{}
	for _, d := range resp.GetDocuments() {
		byNode[strings.TrimPrefix(d.GetKey(), prefix)] = decodeUsers(d)
	}
	answers := n.fenceEach(ctx, f)
	own, err := n.fenceOwn(ctx, f)
	if err == nil {
		answers[n.id] = own
	}
	var fenced []string
	for node, u := range answers {
		if len(u) == 0 {
			fenced = append(fenced, node)
		}
	}
	lift = func() { n.liftEach(context.WithoutCancel(ctx), f, fenced) }
	if err != nil {
		lift()
		return nil, nil, err
	}
	maps.Copy(byNode, answers)
	for node, u := range byNode {
		state := ""
		if m := n.members.Load(); m != nil {
			state = m.members[node].State
		}
		if state == "left" {
			continue
		}
		for _, user := range u {
			if state == "dead" {
				users = append(users, user+" on "+node+" (dead)")
			} else {
				users = append(users, user+" on "+node)
			}
		}
	}
	slices.Sort(users)
	return users, lift, nil
}

// awaitRestore waits until restoreMounts has run: a mount asked for right
// after a restart must find the kept one rather than mount over it.
func (n *node) awaitRestore(ctx context.Context) error {
	select {
	case <-n.restored:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("this node's vold is still restoring its mounts (%w): %w", ctx.Err(), errdefs.ErrUnavailable)
	}
}

// restoreMounts serves again the mounts a holder kept, clears the stale
// ones and mounts again the volumes that still have users on this node.
func (n *node) restoreMounts(ctx context.Context) {
	defer close(n.restored)
	kept := n.sess.take()
	type restore struct {
		name  string
		users []string
		sess  *volfuse.Session
	}
	var todo []restore
	live := map[string]bool{} // mounts to serve again: not stale
	suffix := "/" + n.id
	for _, d := range n.mirror.List(mountsPrefix) {
		key := d.GetKey()
		if !strings.HasSuffix(key, suffix) {
			continue
		}
		name := strings.TrimSuffix(strings.TrimPrefix(key, mountsPrefix), suffix)
		users := decodeUsers(d)
		if len(users) == 0 || validateName(name) != nil {
			continue
		}
		if n.volumeDoc(name) == nil {
			n.log.Warn("mounted volume is gone; dropping its mount record", "volume", name, "users", strings.Join(users, ","))
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, _ = n.statd.Delete(cctx, &statev1.DeleteRequest{Key: key})
			cancel()
			continue
		}
		r := restore{name: name, users: users}
		if s, ok := kept[name]; ok {
			// Only the session still mounted at the volume's path is
			// served again (the mount may have been detached meanwhile).
			if volfuse.MountedConn(n.mountPath(name)) == s.Conn {
				r.sess = &s
				delete(kept, name)
				live[name] = true
			}
		}
		todo = append(todo, r)
	}
	// Sessions nobody will serve again are dropped, which ends them: the
	// stale mounts then answer ENOTCONN at once and are cleared.
	for name, s := range kept {
		s.FD.Close()
		n.sess.remove(name)
		n.log.Info("kept FUSE session dropped", "volume", name)
	}
	if err := cleanStaleMounts(n.cfg.MountDir, live); err != nil {
		n.log.Warn("clean stale mounts", "dir", n.cfg.MountDir, "err", err)
	}
	for _, r := range todo {
		n.mountMu.Lock()
		m, err := n.mountLocked(r.name, r.sess)
		if r.sess != nil {
			r.sess.FD.Close() // the server has its own copy
			if err != nil {
				// Could not serve it again: end it and mount afresh.
				n.log.Warn("take over kept mount", "volume", r.name, "err", err)
				n.sess.remove(r.name)
				if cerr := volfuse.CleanStale(n.mountPath(r.name)); cerr != nil {
					n.log.Warn("clean stale mount", "volume", r.name, "err", cerr)
				}
				m, err = n.mountLocked(r.name, nil)
			}
		}
		if err == nil {
			for _, u := range r.users {
				m.users[u] = true
			}
		}
		n.mountMu.Unlock()
		if err != nil {
			n.log.Warn("remount volume", "volume", r.name, "err", err)
			continue
		}
		n.log.Info("volume remounted", "volume", r.name, "users", strings.Join(r.users, ","), "kept", r.sess != nil)
	}
}

// detachMounts prepares the mounts for vold's exit when a holder keeps
// them: requests that fail from now on (the Raft host is closing) are
// left unanswered, for the next vold to answer.
func (n *node) detachMounts() {
	if !n.sess.kept() {
		return
	}
	n.mountMu.Lock()
	defer n.mountMu.Unlock()
	for _, m := range n.mounts {
		m.srv.Detach()
	}
}

// unmountAll unmounts every volume at shutdown; the records stay, so the
// next start mounts them again.
func (n *node) unmountAll() {
	n.mountMu.Lock()
	defer n.mountMu.Unlock()
	for _, m := range n.mounts {
		n.unmountLocked(m)
	}
}
