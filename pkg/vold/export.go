package vold

import (
	"fmt"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/shoal-dev/shoal/pkg/raftgroup"
	"github.com/shoal-dev/shoal/pkg/volfs"
	volv1 "github.com/shoal-dev/shoal/proto/shoal/vol/v1"
)

// exportChunk is about the most data an ExportChunk carries.
const exportChunk = 256 << 10

// ExportVolume streams a point-in-time tar of the volume from this node's
// replica: after a ReadIndex (so the copy holds every write acknowledged
// before the call), the filesystem is forked as for a background snapshot
// and written from the fork, while the replica goes on applying.
func (a *volumesAPI) ExportVolume(req *volv1.ExportVolumeRequest, stream volv1.Volumes_ExportVolumeServer) error {
	ctx := stream.Context()
	n := a.n
	d, err := a.namedVolume(ctx, req.GetName())
	if err != nil {
		return err
	}
	if _, ok := d.member(n.id); !ok {
		return fmt.Errorf("this node holds no replica of volume %s (its replicas are on %s): %w",
			req.GetName(), strings.Join(d.nodes(), ", "), errdefs.ErrFailedPrecondition)
	}
	h, err := n.raftHost()
	if err != nil {
		return err
	}
	g := raftgroup.GroupID(d.Group)
	if _, err := h.ReadIndex(ctx, g); err != nil {
		return fmt.Errorf("volume %s: read index: %w", req.GetName(), err)
	}
	sm, err := h.Machine(g)
	if err != nil {
		return fmt.Errorf("volume %s: %w", req.GetName(), err)
	}
	fs, ok := sm.(*volfs.FS)
	if !ok {
		return fmt.Errorf("volume %s: group %d runs %T, not a filesystem", req.GetName(), g, sm)
	}
	w := &chunkSender{send: stream.Send}
	st, err := fs.WriteTar(w)
	if err != nil {
		return fmt.Errorf("export %s: %w", req.GetName(), err)
	}
	return stream.Send(&volv1.ExportChunk{Data: w.buf, Last: true, Entries: int64(st.Entries), Bytes: st.Bytes,
		Skipped: int64(st.Skipped), Applied: st.Applied})
}

// chunkSender gathers writes into chunks of exportChunk bytes.
type chunkSender struct {
	send func(*volv1.ExportChunk) error
	buf  []byte
}

func (c *chunkSender) Write(p []byte) (int, error) {
	c.buf = append(c.buf, p...)
	for len(c.buf) >= exportChunk {
		if err := c.send(&volv1.ExportChunk{Data: c.buf[:exportChunk:exportChunk]}); err != nil {
			return 0, err
		}
		c.buf = append([]byte(nil), c.buf[exportChunk:]...)
	}
	return len(p), nil
}
