package vold

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
	volv1 "github.com/shoal-dev/shoal/proto/shoal/vol/v1"
)

// volumesAPI serves shoal.vol.v1.Volumes on vold.sock. Any node serves
// any call.
type volumesAPI struct {
	volv1.UnimplementedVolumesServer
	n *node
}

func (a *volumesAPI) CreateVolume(ctx context.Context, req *volv1.CreateVolumeRequest) (*volv1.Volume, error) {
	n := a.n
	if _, err := n.raftHost(); err != nil {
		return nil, err
	}
	if err := validateName(req.GetName()); err != nil {
		return nil, err
	}
	size, err := checkSize(req.GetSizeBytes())
	if err != nil {
		return nil, err
	}
	replicas, err := checkReplicas(req.GetReplicas())
	if err != nil {
		return nil, err
	}
	d, err := n.readVolume(ctx, req.GetName())
	if err != nil {
		return nil, err
	}
	if d != nil {
		return nil, fmt.Errorf("volume %q already exists (group %d): %w", req.GetName(), d.Group, errdefs.ErrAlreadyExists)
	}
	d, err = n.createVolume(ctx, req.GetName(), replicas, size)
	if err != nil {
		return nil, err
	}
	// The group has a leader; give the other members a moment to apply
	// the same, so that the answer shows a settled volume.
	v := n.inspect(ctx, req.GetName(), d, false)
	for deadline := time.Now().Add(2 * time.Second); v.GetHealth() != "healthy" && time.Now().Before(deadline) && ctx.Err() == nil; {
		time.Sleep(100 * time.Millisecond)
		v = n.inspect(ctx, req.GetName(), d, false)
	}
	return v, nil
}

// readVolume reads a volume's document from statd itself (the mirror may
// lag behind a write just made); nil if there is none.
func (n *node) readVolume(ctx context.Context, name string) (*volumeDoc, error) {
	resp, err := n.statd.Get(ctx, &statev1.GetRequest{Key: volumeKey(name)})
	if status.Code(err) == codes.NotFound {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read volume %q: %w", name, err)
	}
	return decodeVolume(resp.GetDocument())
}

// existingVolume reads a volume's document from statd, as readVolume
// does: NOT_FOUND when there is none.
func (n *node) existingVolume(ctx context.Context, name string) (*volumeDoc, error) {
	d, err := n.readVolume(ctx, name)
	if err == nil && d == nil {
		err = fmt.Errorf("volume %q does not exist: %w", name, errdefs.ErrNotFound)
	}
	return d, err
}

// knownVolume returns name's document from this node's mirror, or from
// statd when the mirror has none yet (a volume just created through
// another node): NOT_FOUND when neither has it.
func (n *node) knownVolume(ctx context.Context, name string) (*volumeDoc, error) {
	if d := n.volumeDoc(name); d != nil {
		return d, nil
	}
	return n.existingVolume(ctx, name)
}

// createVolume places a new volume, writes its document and waits until
// its group has a leader and has applied the volume's size limit (the
// system group: until a linearizable read succeeds).
func (n *node) createVolume(ctx context.Context, name string, replicas int, size int64) (*volumeDoc, error) {
	cands := n.candidates()
	nodes, silent := placeAnswering(cands, max(1, min(replicas, len(cands))), nil, size,
		func(ids []string) map[string]bool { return n.answering(ctx, ids) }, true)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	for _, id := range nodes {
		if slices.Contains(silent, id) {
			n.log.Warn("volume placed on a node whose vold does not answer: no other node can take the replica; it catches up once that vold is back, or is replaced",
				"volume", name, "peer_node", id)
		}
	}
	if len(nodes) == 0 {
		node, most := largestFree(cands)
		return nil, fmt.Errorf("volume %q of %s does not fit on any node: the most room is %s on %s (free space of its vold state dir, less the volumes it already hosts): %w",
			name, humanBytes(size), humanBytes(max(most, 0)), node, errdefs.ErrResourceExhausted)
	}
	d := &volumeDoc{
		Group:     uint64(newGroupID(name == systemVolume)),
		Replicas:  len(nodes),
		SizeBytes: size,
		Created:   time.Now().UTC(),
		CreatedBy: n.id,
	}
	for i, node := range nodes {
		d.Members = append(d.Members, docMember{Node: node, Replica: uint64(i + 1), Boot: true})
	}
	fields, err := encodeVolume(d)
	if err != nil {
		return nil, err
	}
	if _, err := n.statd.Put(ctx, &statev1.PutRequest{Key: volumeKey(name), Fields: fields}); err != nil {
		return nil, fmt.Errorf("write volume %q: %w", name, err)
	}
	n.log.Info("volume created", "volume", name, "group", d.Group, "members", strings.Join(nodes, ","), "size_bytes", size)
	n.wake()

	wctx, cancel := context.WithTimeout(ctx, time.Duration(n.cfg.CreateTimeout))
	defer cancel()
	if name == systemVolume {
		payload, _ := proto.Marshal(&volv1.GetRequest{Key: "_"})
		_, err = n.route(wctx, d, kindKVGet, payload, "")
	} else {
		err = n.setLimit(wctx, name, d)
		if err == nil {
			n.raiseNewVolume(wctx, name, d)
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("volume %q was written but its group (members %s) did not elect a leader and apply its size within %s: are vold running and reachable on those nodes? `shoalctl volume inspect %s` shows it, `shoalctl volume rm %s` removes it (%v): %w",
			name, strings.Join(nodes, ", "), time.Duration(n.cfg.CreateTimeout), name, name, err, errdefs.ErrUnavailable)
	}
	// A create of the same name racing this one may have won the document
	// (last writer wins): then this group is being destroyed everywhere.
	if cur, err := n.readVolume(ctx, name); err == nil && cur != nil && cur.Group != d.Group {
		return nil, fmt.Errorf("volume %q was created concurrently by another call (group %d): %w", name, cur.Group, errdefs.ErrAlreadyExists)
	}
	return d, nil
}

func (a *volumesAPI) ListVolumes(ctx context.Context, _ *volv1.ListVolumesRequest) (*volv1.ListVolumesResponse, error) {
	n := a.n
	if _, err := n.raftHost(); err != nil {
		return nil, err
	}
	docs := n.volumeDocs()
	names := make([]string, 0, len(docs))
	for name := range docs {
		if name != systemVolume {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	out := &volv1.ListVolumesResponse{Volumes: make([]*volv1.Volume, len(names))}
	// Live status for the table's health and leader columns, all volumes
	// at once.
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out.Volumes[i] = n.inspect(ctx, name, docs[name], false)
		}()
	}
	wg.Wait()
	return out, nil
}

func (a *volumesAPI) InspectVolume(ctx context.Context, req *volv1.InspectVolumeRequest) (*volv1.Volume, error) {
	n := a.n
	if _, err := n.raftHost(); err != nil {
		return nil, err
	}
	d, err := n.knownVolume(ctx, req.GetName())
	if err != nil {
		return nil, err
	}
	// What each member's vold lets the volume reach, asked beside the
	// members' status: an operator upgrading vold sees which member holds
	// a volume's level back.
	levels := make(chan map[string]uint32, 1)
	go func() { levels <- n.voldLevels(ctx, d.nodes()) }()
	v := n.inspect(ctx, req.GetName(), d, req.GetDigests())
	l := <-levels
	for _, m := range v.GetMembers() {
		m.VoldLevel = l[m.GetNode()]
	}
	return v, nil
}

// namedVolume returns the document of the volume a request names, once
// the Raft host runs and the name is valid: NOT_FOUND when there is none.
func (a *volumesAPI) namedVolume(ctx context.Context, name string) (*volumeDoc, error) {
	if _, err := a.n.raftHost(); err != nil {
		return nil, err
	}
	if err := validateName(name); err != nil {
		return nil, err
	}
	return a.n.existingVolume(ctx, name)
}

func (a *volumesAPI) UpdateVolume(ctx context.Context, req *volv1.UpdateVolumeRequest) (*volv1.Volume, error) {
	n := a.n
	name := req.GetName()
	if req.GetReplicas() == 0 && req.GetSizeBytes() == 0 {
		return nil, fmt.Errorf("nothing to update: give a replica count or a size: %w", errdefs.ErrInvalidArgument)
	}
	var (
		replicas int
		size     int64
		err      error
	)
	if req.GetReplicas() != 0 {
		if replicas, err = checkReplicas(req.GetReplicas()); err != nil {
			return nil, err
		}
	}
	if req.GetSizeBytes() != 0 {
		if size, err = checkSize(req.GetSizeBytes()); err != nil {
			return nil, err
		}
	}
	d, err := a.namedVolume(ctx, name)
	if err != nil {
		return nil, err
	}
	if name == systemVolume {
		return nil, fmt.Errorf("volume %q is the KV's and locks' group, which every node holds: %w", name, errdefs.ErrInvalidArgument)
	}
	// Both checked before either changes: a refused update changes
	// nothing. The new replicas are placed by the new size.
	next := d.clone()
	if size > 0 {
		next.SizeBytes = size
		if err := n.checkResize(ctx, name, d, size); err != nil {
			return nil, err
		}
	}
	if replicas > 0 {
		if err := n.checkScale(ctx, name, next, replicas); err != nil {
			return nil, err
		}
	}
	if size > 0 {
		if err := n.resize(ctx, name, d, size); err != nil {
			return nil, err
		}
	}
	if replicas > 0 {
		if err := n.setReplicaCount(ctx, name, d, replicas); err != nil {
			return nil, err
		}
	}
	return n.inspect(ctx, name, d, false), nil
}

func (a *volumesAPI) RemoveVolume(ctx context.Context, req *volv1.RemoveVolumeRequest) (*volv1.RemoveVolumeResponse, error) {
	n := a.n
	name := req.GetName()
	d, err := a.namedVolume(ctx, name)
	if err != nil {
		return nil, err
	}
	users, lift, err := n.fenceMountUsers(ctx, removalFence{Name: name, Group: d.Group})
	if err != nil {
		return nil, err
	}
	if len(users) > 0 {
		lift()
		return nil, fmt.Errorf("volume %q is in use by %s: stop them first: %w", name, strings.Join(users, ", "), errdefs.ErrFailedPrecondition)
	}
	if _, err := n.statd.Delete(ctx, &statev1.DeleteRequest{Key: volumeKey(name)}); err != nil {
		lift()
		return nil, fmt.Errorf("delete volume %q: %w", name, err)
	}
	n.log.Info("volume removed", "volume", name, "group", d.Group)
	n.wake()
	return &volv1.RemoveVolumeResponse{}, nil
}

func (a *volumesAPI) Mount(ctx context.Context, req *volv1.MountRequest) (*volv1.MountResponse, error) {
	if _, err := a.n.raftHost(); err != nil {
		return nil, err
	}
	if err := validateName(req.GetName()); err != nil {
		return nil, err
	}
	if err := checkKey("mount user", req.GetUser()); err != nil {
		return nil, err
	}
	path, err := a.n.mount(ctx, req.GetName(), req.GetUser())
	if err != nil {
		return nil, err
	}
	return &volv1.MountResponse{Path: path}, nil
}

func (a *volumesAPI) Unmount(ctx context.Context, req *volv1.UnmountRequest) (*volv1.UnmountResponse, error) {
	if _, err := a.n.raftHost(); err != nil {
		return nil, err
	}
	if err := validateName(req.GetName()); err != nil {
		return nil, err
	}
	if err := checkKey("mount user", req.GetUser()); err != nil {
		return nil, err
	}
	return &volv1.UnmountResponse{}, a.n.unmount(ctx, req.GetName(), req.GetUser())
}
