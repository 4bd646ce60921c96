package vold

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"

	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

// Changing a volume's size limit (UpdateVolume). The limit is two things:
// the document's size (its "size_set" field, over the description's
// size_bytes), which placement counts as taken on every member's node,
// and the limit the filesystem enforces, a Raft entry every replica
// applies (volfs KindSetLimit). The document's is never below the
// filesystem's, so that a node is never promised more than placement
// counted: a growth writes the document first, a shrink sets the
// filesystem's first.

// checkResize reports why d's volume cannot have the size limit size: it
// holds more than that already, or a member's node lacks the room to
// grow it. A member whose node is not live is not asked: its replica's
// replacement is placed by the new size.
func (n *node) checkResize(ctx context.Context, name string, d *volumeDoc, size int64) error {
	switch {
	case size == d.SizeBytes:
		return nil
	case size < d.SizeBytes:
		v := n.inspect(ctx, name, d, false)
		if v.GetLeader() == "" {
			return fmt.Errorf("volume %q has no leader to say how much it holds: %w", name, errdefs.ErrUnavailable)
		}
		if v.GetUsedBytes() > size {
			return fmt.Errorf("volume %q holds %s, more than %s: free space in it first: %w", name, humanBytes(v.GetUsedBytes()), humanBytes(size), errdefs.ErrFailedPrecondition)
		}
		return nil
	}
	grow := size - d.SizeBytes
	free := map[string]int64{}
	for _, c := range n.candidates() {
		free[c.Node] = c.Free
	}
	for _, m := range d.Members {
		if f, ok := free[m.Node]; ok && f < grow {
			return fmt.Errorf("volume %q cannot grow to %s: node %s, which holds a replica, has %s free for volumes and it needs %s more (free space of its vold state dir, less the volumes it hosts): %w",
				name, humanBytes(size), m.Node, humanBytes(max(f, 0)), humanBytes(grow), errdefs.ErrResourceExhausted)
		}
	}
	return nil
}

// resize gives d's volume the size limit size (checked by checkResize),
// in the order that keeps the document's size at or above the
// filesystem's.
func (n *node) resize(ctx context.Context, name string, d *volumeDoc, size int64) error {
	if size == d.SizeBytes {
		return nil
	}
	doc := func() error { return n.putSetting(ctx, name, d, fieldSizeSet, size) }
	limit := func() error {
		next := d.clone()
		next.SizeBytes = size
		if err := n.setLimit(ctx, name, next); err != nil {
			return fmt.Errorf("apply volume %q's size limit: %w", name, err)
		}
		return nil
	}
	steps := []func() error{limit, doc}
	if size > d.SizeBytes {
		steps = []func() error{doc, limit}
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	n.log.Info("volume size limit changed", "volume", name, "group", d.Group, "from", d.SizeBytes, "to", size)
	d.SizeBytes = size
	return nil
}

// putSetting writes one of UpdateVolume's settings (field, value v) into
// d's volume's document, beside its description (volume.go says why).
func (n *node) putSetting(ctx context.Context, name string, d *volumeDoc, field string, v int64) error {
	_, err := n.statd.Put(ctx, &statev1.PutRequest{Key: volumeKey(name), Fields: map[string]*statev1.Value{field: settingField(d.Group, v)}})
	if err != nil {
		return fmt.Errorf("write volume %q: %w", name, err)
	}
	return nil
}
