package vold

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/shoal-dev/shoal/pkg/chunkio"
	"github.com/shoal-dev/shoal/pkg/raftgroup"
	"github.com/shoal-dev/shoal/pkg/rpc"
	"github.com/shoal-dev/shoal/pkg/volfs"
	volv1 "github.com/shoal-dev/shoal/proto/shoal/vol/v1"
)

// exportChunk is about the most data an ExportChunk carries.
const exportChunk = 256 << 10

// ExportVolume streams a point-in-time tar of the volume: from this
// node's replica when it holds one, else from a member's through
// VolPeer.Export, so that the copy is of one applied index wherever the
// command runs.
func (a *volumesAPI) ExportVolume(req *volv1.ExportVolumeRequest, stream volv1.Volumes_ExportVolumeServer) error {
	ctx := stream.Context()
	n := a.n
	d, err := a.namedVolume(ctx, req.GetName())
	if err != nil {
		return err
	}
	if n.holds(d.group()) {
		return n.exportLocal(ctx, d.group(), req.GetName(), stream.Send)
	}
	return n.exportProxied(ctx, d, req.GetName(), stream.Send)
}

// exportLocal writes the tar of this node's replica of g: after a
// ReadIndex (so the copy holds every write acknowledged before the call),
// the filesystem is forked as for a background snapshot and written from
// the fork, while the replica goes on applying.
func (n *node) exportLocal(ctx context.Context, g raftgroup.GroupID, name string, send func(*volv1.ExportChunk) error) error {
	h, err := n.raftHost()
	if err != nil {
		return err
	}
	if _, err := h.ReadIndex(ctx, g); err != nil {
		return fmt.Errorf("volume %s: read index: %w", name, forwardedError(err))
	}
	sm, err := h.Machine(g)
	if err != nil {
		return fmt.Errorf("volume %s: %w", name, forwardedError(err))
	}
	fs, ok := sm.(*volfs.FS)
	if !ok {
		return fmt.Errorf("volume %s: group %d runs %T, not a filesystem: %w", name, g, sm, errdefs.ErrFailedPrecondition)
	}
	w := &chunkio.Writer{Size: exportChunk, Send: func(b []byte) error { return send(&volv1.ExportChunk{Data: b}) }}
	st, err := fs.WriteTar(w)
	if err != nil {
		return fmt.Errorf("export %s: %w", name, err)
	}
	return send(&volv1.ExportChunk{Data: w.Rest(), Last: true, Entries: int64(st.Entries), Bytes: st.Bytes,
		Skipped: int64(st.Skipped), Applied: st.Applied, Node: n.id})
}

// serveExport runs VolPeer.Export: the export of this node's replica of
// the group, for a node that holds none.
func (n *node) serveExport(req *volv1.ExportVolumeRequest, stream volv1.VolPeer_ExportServer) error {
	g := raftgroup.GroupID(req.GetGroup())
	if g == 0 {
		return fmt.Errorf("export of volume %q names no group: %w", req.GetName(), errdefs.ErrInvalidArgument)
	}
	if !n.holds(g) {
		return fmt.Errorf("node %s holds no replica of group %d: %w", n.id, g, errdefs.ErrNotFound)
	}
	n.stats.forwardedIn.Add(1)
	return n.exportLocal(stream.Context(), g, req.GetName(), stream.Send)
}

// exportProxied streams the export of a member's replica: members in
// forwardOrder, passing over those that cannot start one (unreachable,
// no replica yet, hung, or a vold from before VolPeer.Export). Once a
// member has sent a chunk, its failure is the export's: the archive is
// half sent.
func (n *node) exportProxied(ctx context.Context, d *volumeDoc, name string, send func(*volv1.ExportChunk) error) error {
	req := &volv1.ExportVolumeRequest{Name: name, Group: d.Group}
	var why []string
	older := 0
	for _, m := range n.forwardOrder(d) {
		if m == n.id {
			continue
		}
		started, err := n.exportFrom(ctx, m, req, send)
		switch {
		case err == nil:
			return nil
		case started:
			return fmt.Errorf("export of volume %s from node %s: %w", name, m, rpc.FromStatus(err))
		case ctx.Err() != nil:
			return fmt.Errorf("export of volume %s: %w", name, ctx.Err())
		case status.Code(err) == codes.Unimplemented:
			older++
		case !retryElsewhere(err):
			return fmt.Errorf("export of volume %s from node %s: %w", name, m, rpc.FromStatus(err))
		}
		why = append(why, fmt.Sprintf("node %s: %s", m, status.Convert(err).Message()))
	}
	if older > 0 && older == len(why) {
		return fmt.Errorf("this node holds no replica of volume %s, and the volds of its replicas' nodes (%s) cannot export for it (older volds): %w",
			name, strings.Join(d.nodes(), ", "), errdefs.ErrFailedPrecondition)
	}
	return fmt.Errorf("no replica of volume %s could export it (%s): %w", name, strings.Join(why, "; "), errdefs.ErrUnavailable)
}

// exportFrom relays member m's export of req's group to send. started
// reports whether a chunk was sent. The first chunk comes after m's
// ReadIndex and fork: a member that sends none within forwardAttempt
// (partitioned from its group) is given up.
func (n *node) exportFrom(ctx context.Context, m string, req *volv1.ExportVolumeRequest, send func(*volv1.ExportChunk) error) (started bool, err error) {
	c, err := n.pool.client(m)
	if err != nil {
		return false, status.Error(codes.Unavailable, err.Error())
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	first := time.AfterFunc(forwardAttempt, cancel)
	defer first.Stop()
	n.stats.forwardedOut.Add(1)
	stream, err := c.Export(sctx, req)
	for err == nil {
		var chunk *volv1.ExportChunk
		if chunk, err = stream.Recv(); err != nil {
			break
		}
		if !started && !first.Stop() {
			err = sctx.Err() // it fired as the chunk came
			break
		}
		started = true
		if err := send(chunk); err != nil {
			return true, err
		}
		if chunk.GetLast() {
			return true, nil
		}
	}
	n.stats.forwardErrors.Add(1)
	switch {
	case err == nil || errors.Is(err, io.EOF):
		err = status.Errorf(codes.Unavailable, "node %s ended the export before its last chunk", m)
	case !started && ctx.Err() == nil && sctx.Err() != nil:
		err = status.Errorf(codes.DeadlineExceeded, "node %s did not start the export in %s", m, forwardAttempt)
	}
	return started, err
}
