package schedd

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/shoal-dev/shoal/pkg/sched"
	schedv1 "github.com/shoal-dev/shoal/proto/shoal/sched/v1"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

// A removal is cluster-wide, as a load is: the node that is asked marks
// the image's document removed, and every node holding a copy drops it
// when it sees the mark (now, or when it next runs), then takes its own
// name off the document. The caller waits for the live holders, so that
// `image ls` on any node no longer shows the image once `image rm` has
// answered.

// defaultRemoveWait bounds how long RemoveImage waits for the holders:
// a live one drops its copy within a round of its loop (a tick, 250 ms,
// and containerd's delete).
const defaultRemoveWait = 10 * time.Second

// imageDropRetry spaces a node's attempts to drop an image containerd
// refused to delete, so that a stuck one does not cost every round.
const imageDropRetry = 10 * time.Second

// removeImage marks the image ref names removed, once no service names
// it, and waits up to wait for the live nodes holding it to drop it.
func (n *node) removeImage(ctx context.Context, ref string, wait time.Duration) (*schedv1.RemoveImageResponse, error) {
	ref = strings.TrimSpace(ref)
	if ref == "" {
		return nil, fmt.Errorf("no image given: %w", errdefs.ErrInvalidArgument)
	}
	if wait < 0 {
		return nil, fmt.Errorf("wait %s: want zero or more: %w", wait, errdefs.ErrInvalidArgument)
	}
	var (
		dg     digest.Digest
		names  []string
		before []string // the nodes holding it
	)
	if d := n.imageDoc(ref); d != nil {
		dg, names, before = digest.Digest(strings.TrimPrefix(d.GetKey(), imagesPrefix)), imageNames(d), docHolders(d)
	} else {
		// Loaded here and never recorded (before the node joined, or with
		// statd away): record it, so that the mark reaches this copy too.
		img, err := n.rt.Image(ctx, ref)
		if errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("image %s is on no node (`shoalctl image ls` lists them): %w", ref, errdefs.ErrNotFound)
		}
		if err != nil {
			return nil, err
		}
		if err := n.publishImage(ctx, img); err != nil {
			return nil, err
		}
		dg, names, before = img.Digest, []string{familiar(img.Name)}, []string{n.id}
	}
	if users := n.imageUsers(dg, names); len(users) > 0 {
		return nil, fmt.Errorf("image %s is named by service %s (its spec, or the previous one a rollback returns to): remove or update them first: %w",
			ref, strings.Join(users, ", "), errdefs.ErrFailedPrecondition)
	}
	if err := n.put(ctx, imageKey(dg), map[string]crdtValue{removedField: stringValue(time.Now().UTC().Format(time.RFC3339Nano))}); err != nil {
		return nil, fmt.Errorf("mark image %s removed: %w", ref, err)
	}
	n.wake()
	n.log.Info("image removed", "image", names[0], "digest", dg, "holders", before)

	deadline := time.Now().Add(wait)
	marked := false // the mirror has the mark: its holders are current
	for {
		d := n.mirror.Get(imageKey(dg))
		holders := docHolders(d)
		switch {
		case imageRemoved(d):
			marked = true
		case marked:
			// Loaded again meanwhile, on some node: the last word is the load's.
			return nil, fmt.Errorf("image %s was loaded again while it was being removed: %w", ref, errdefs.ErrAborted)
		}
		// A holder whose schedd shut down drops its copy when it runs
		// again: no use waiting for it (one killed is waited for).
		alive := n.aliveNodes()
		waiting := !marked || slices.ContainsFunc(holders, func(id string) bool { return slices.Contains(alive, id) && !n.shutDown(id) })
		if !waiting || !time.Now().Before(deadline) {
			resp := &schedv1.RemoveImageResponse{Name: names[0], Digest: dg.String(), Pending: holders}
			for _, id := range before {
				if !slices.Contains(holders, id) {
					resp.RemovedFrom = append(resp.RemovedFrom, id)
				}
			}
			return resp, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(min(100*time.Millisecond, time.Until(deadline))):
		}
	}
}

// imageUsers lists the services whose spec, or previous spec, names the
// image of digest dg (known by names).
func (n *node) imageUsers(dg digest.Digest, names []string) []string {
	return n.specUsers(func(spec sched.ServiceSpec) bool { return namesImage(spec.Image, dg, names) })
}

// namesImage reports whether a spec's image reference ref names the image
// of digest dg, known by names. A name counts even if it was loaded again
// with other content since: refusing then is the safe side.
func namesImage(ref string, dg digest.Digest, names []string) bool {
	if ref == "" {
		return false
	}
	if ref == dg.String() || strings.HasSuffix(ref, "@"+dg.String()) {
		return true
	}
	return slices.Contains(names, familiar(ref))
}

// dropRemovedImages deletes this node's copies of images marked removed,
// then takes the node off their documents. It runs in the scheduling
// loop, so it needs no lock of its own.
func (n *node) dropRemovedImages(ctx context.Context, now time.Time) {
	for _, d := range n.mirror.List(imagesPrefix) {
		if !imageRemoved(d) || d.GetFields()["node."+n.id] == nil {
			continue
		}
		if now.Sub(n.dropFailed[d.GetKey()]) < imageDropRetry {
			continue
		}
		dg := digest.Digest(strings.TrimPrefix(d.GetKey(), imagesPrefix))
		if err := n.dropImage(ctx, dg); err != nil {
			n.log.Warn("drop removed image", "digest", dg, "err", err)
			n.dropFailed[d.GetKey()] = now
			continue
		}
		delete(n.dropFailed, d.GetKey())
		if _, err := n.statd.Delete(ctx, &statev1.DeleteRequest{Key: d.GetKey(), Fields: []string{"node." + n.id}}); err != nil {
			n.log.Warn("record dropped image", "digest", dg, "err", err)
			n.dropFailed[d.GetKey()] = now
			continue
		}
		n.log.Info("removed image dropped", "digest", dg, "names", imageNames(d))
	}
}

// dropImage deletes every local name of digest dg; containerd frees the
// blobs nothing else uses. Tasks started from the image keep running.
func (n *node) dropImage(ctx context.Context, dg digest.Digest) error {
	imgs, err := n.rt.Images(ctx)
	if err != nil {
		return err
	}
	for _, img := range imgs {
		if img.Digest != dg {
			continue
		}
		if err := n.rt.RemoveImage(ctx, img.Name); err != nil {
			return err
		}
	}
	return nil
}

// removeWait is a request's wait, or the default.
func removeWait(d *durationpb.Duration) time.Duration {
	if d == nil {
		return defaultRemoveWait
	}
	return d.AsDuration()
}
