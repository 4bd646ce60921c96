package schedd

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/shoal-dev/shoal/pkg/dockerauth"
	shoalrt "github.com/shoal-dev/shoal/pkg/runtime"
	"github.com/shoal-dev/shoal/pkg/secret"
	clusterv1 "github.com/shoal-dev/shoal/proto/shoal/cluster/v1"
	schedv1 "github.com/shoal-dev/shoal/proto/shoal/sched/v1"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

// imagesPrefix holds one document per image digest, with a field per node
// that holds the image: whom a node lacking it can fetch it from.
const imagesPrefix = "/images/"

func imageKey(d digest.Digest) string { return imagesPrefix + d.String() }

// familiar normalises an image reference the way names are shown: a
// missing tag means :latest.
func familiar(ref string) string {
	ref = strings.TrimPrefix(ref, "docker.io/")
	ref = strings.TrimPrefix(ref, "library/")
	if strings.Contains(ref, "@") || strings.HasPrefix(ref, "sha256:") {
		return ref
	}
	if i := strings.LastIndex(ref, "/"); !strings.Contains(ref[i+1:], ":") {
		ref += ":latest"
	}
	return ref
}

// publishImage records that this node holds img.
//
// One image (one digest) may be known by several names: loaded as
// local/busybox and pulled as registry.example/busybox, say. "name" is the
// latest (for display); every name is also a "ref.<name>" field, so that a
// node looking for either finds the digest and its holders.
func (n *node) publishImage(ctx context.Context, img shoalrt.Image) error {
	name := familiar(img.Name)
	fields := map[string]crdtValue{
		"name":         stringValue(name),
		"size":         intValue(img.Size),
		"node." + n.id: stringValue(time.Now().UTC().Format(time.RFC3339)),
	}
	fields[refField(name)] = stringValue(name)
	// Loading or fetching an image that was removed brings it back.
	fields[removedField] = stringValue("")
	return n.put(ctx, imageKey(img.Digest), fields)
}

// removedField marks the document of an image removed with `shoalctl
// image rm`: it holds when, and is "" while the image is live. The
// document stays, so that a node that was down at the time still learns
// to drop its copy (dropRemovedImages).
const removedField = "removed"

func imageRemoved(d *statev1.Document) bool {
	return d.GetFields()[removedField].GetStringValue() != ""
}

// imageNames lists the names an image document records.
func imageNames(d *statev1.Document) []string {
	names := []string{d.GetFields()["name"].GetStringValue()}
	for f, v := range d.GetFields() {
		if strings.HasPrefix(f, "ref.") && !slices.Contains(names, v.GetStringValue()) {
			names = append(names, v.GetStringValue())
		}
	}
	slices.Sort(names)
	return names
}

// docHolders lists the nodes an image document says hold the image.
func docHolders(d *statev1.Document) []string {
	var holders []string
	for f := range d.GetFields() {
		if id, ok := strings.CutPrefix(f, "node."); ok {
			holders = append(holders, id)
		}
	}
	slices.Sort(holders)
	return holders
}

// refField is the field of an image document that records one of its
// names. Field names allow only letters, digits and "_-.", so the name is
// hashed (its value is the name itself).
func refField(name string) string {
	sum := sha256.Sum256([]byte(name))
	return "ref." + hex.EncodeToString(sum[:16])
}

// publishImages records every image this node holds, at start.
func (n *node) publishImages(ctx context.Context) {
	imgs, err := n.rt.Images(ctx)
	if err != nil {
		n.log.Warn("list images", "err", err)
		return
	}
	for _, img := range imgs {
		if d := n.mirror.Get(imageKey(img.Digest)); d != nil && d.GetFields()["node."+n.id] != nil && d.GetFields()[refField(familiar(img.Name))] != nil {
			continue
		}
		if err := n.publishImage(ctx, img); err != nil {
			n.log.Warn("publish image", "image", img.Name, "err", err)
		}
	}
}

// imageHolders returns the digest of an image known to the cluster by
// reference (name or digest) and the nodes that hold it.
func (n *node) imageHolders(ref string) (digest.Digest, []string) {
	d := n.imageDoc(ref)
	if d == nil {
		return "", nil
	}
	return digest.Digest(strings.TrimPrefix(d.GetKey(), imagesPrefix)), docHolders(d)
}

// imageDoc returns the document of a live image ref names, nil if none.
func (n *node) imageDoc(ref string) *statev1.Document {
	want := familiar(ref)
	for _, d := range n.mirror.List(imagesPrefix) {
		dg := strings.TrimPrefix(d.GetKey(), imagesPrefix)
		name := d.GetFields()["name"].GetStringValue()
		_, named := d.GetFields()[refField(want)]
		if imageRemoved(d) || name != want && !named && dg != ref && !strings.HasSuffix(ref, "@"+dg) {
			continue
		}
		return d
	}
	return nil
}

// imageKnown reports whether the cluster (or this node) has an image.
func (n *node) imageKnown(ctx context.Context, ref string) bool {
	if _, err := n.rt.Image(ctx, ref); err == nil {
		return true
	}
	_, holders := n.imageHolders(ref)
	return len(holders) > 0
}

// imageArrival bounds how long a service create or update waits for an
// image this node does not know of yet. The node that loaded it a moment
// ago may not have told this one: gossip pushes every 200 ms and
// anti-entropy runs every second, so a few seconds cover a cluster of a
// few hundred nodes, and only a reference no node holds waits them out.
const imageArrival = 3 * time.Second

// awaitImage reports whether the cluster has ref, waiting up to within
// for a record of it to arrive.
func (n *node) awaitImage(ctx context.Context, ref string, within time.Duration) bool {
	return until(ctx, within, 100*time.Millisecond, func() bool { return n.imageKnown(ctx, ref) })
}

// ensureImage makes ref available locally, fetching it from a node that
// holds it when this node does not.
func (n *node) ensureImage(ctx context.Context, ref string) error {
	_, err := n.rt.Image(ctx, ref)
	if err == nil || !errdefs.IsNotFound(err) {
		return err
	}
	dg, holders := n.imageHolders(ref)
	alive := map[string]bool{}
	for _, id := range n.aliveNodes() {
		alive[id] = true
	}
	var errs []string
	for _, h := range holders {
		if h == n.id || !alive[h] {
			continue
		}
		start := time.Now()
		img, err := n.fetchImage(ctx, h, ref, dg)
		if err == nil {
			n.log.Info("image fetched from peer", "image", img.Name, "digest", img.Digest, "peer", h, "duration", time.Since(start).Round(time.Millisecond))
			if err := n.publishImage(ctx, img); err != nil {
				n.log.Warn("publish image", "err", err)
			}
			return nil
		}
		errs = append(errs, fmt.Sprintf("%s: %v", h, err))
		n.log.Warn("image fetch failed", "image", ref, "peer", h, "err", err)
	}
	// No peer could give it: its registry, if the ref names one. Once
	// pulled, the node publishes it, so the rest of the cluster fetches it
	// from here rather than from the registry.
	if _, perr := shoalrt.PullableRef(ref); perr == nil {
		start := time.Now()
		img, err := n.rt.Pull(ctx, ref, shoalrt.PullOptions{PlainHTTP: n.cfg.InsecureRegistries, Auth: n.registryAuth(ctx)})
		if err == nil {
			n.log.Info("image pulled from registry", "image", img.Name, "digest", img.Digest, "duration", time.Since(start).Round(time.Millisecond))
			if err := n.publishImage(ctx, img); err != nil {
				n.log.Warn("publish image", "err", err)
			}
			return nil
		}
		errs = append(errs, fmt.Sprintf("registry: %v", err))
	}
	if len(errs) > 0 {
		return fmt.Errorf("image %s: no node holding it and no registry could give it: %s", ref, strings.Join(errs, "; "))
	}
	return fmt.Errorf("image %s is on no reachable node (load it with `shoalctl image load`, or name its registry to pull it): %w", ref, errdefs.ErrNotFound)
}

// fetchImage copies an image from a peer, blob by blob, each verified by
// digest as it is written.
// The peer is asked by digest when it is known (it may hold the image
// under another name); the copy is named ref.
func (n *node) fetchImage(ctx context.Context, peerID, ref string, dg digest.Digest) (shoalrt.Image, error) {
	api, err := n.peers.client(ctx, peerID)
	if err != nil {
		return shoalrt.Image{}, err
	}
	ask := ref
	if dg != "" {
		ask = dg.String()
	}
	resp, err := api.ImageBlobs(ctx, &schedv1.ImageBlobsRequest{Ref: ask})
	if err != nil {
		return shoalrt.Image{}, err
	}
	if len(resp.GetBlobs()) == 0 {
		return shoalrt.Image{}, fmt.Errorf("peer listed no blobs: %w", errdefs.ErrDataLoss)
	}
	descs := make([]ocispec.Descriptor, len(resp.GetBlobs()))
	for i, b := range resp.GetBlobs() {
		d, err := digest.Parse(b.GetDigest())
		if err != nil {
			return shoalrt.Image{}, fmt.Errorf("peer sent a bad digest: %v: %w", err, errdefs.ErrDataLoss)
		}
		descs[i] = ocispec.Descriptor{MediaType: b.GetMediaType(), Digest: d, Size: b.GetSize(), Annotations: b.GetAnnotations()}
	}
	for _, desc := range descs {
		stream, err := api.GetBlob(ctx, &schedv1.GetBlobRequest{Digest: desc.Digest.String()})
		if err != nil {
			return shoalrt.Image{}, err
		}
		pr, pw := io.Pipe()
		go func() {
			for {
				chunk, err := stream.Recv()
				if err == io.EOF {
					pw.Close()
					return
				}
				if err != nil {
					pw.CloseWithError(err)
					return
				}
				if _, err := pw.Write(chunk.GetData()); err != nil {
					return
				}
			}
		}()
		err = n.rt.WriteBlob(ctx, desc, pr)
		pr.Close()
		if err != nil {
			return shoalrt.Image{}, fmt.Errorf("blob %s: %w", desc.Digest, err)
		}
	}
	name := ref
	if _, err := digest.Parse(ref); err == nil || strings.Contains(ref, "@") {
		name = resp.GetName() // a digest is no name: keep the peer's
	}
	return n.rt.CreateImage(ctx, name, descs[0])
}

// imageBlobs lists what a peer must fetch to hold ref.
func (n *node) imageBlobs(ctx context.Context, ref string) (*schedv1.ImageBlobsResponse, error) {
	img, err := n.rt.Image(ctx, ref)
	if err != nil {
		return nil, err
	}
	descs, err := n.rt.ImageBlobs(ctx, ref)
	if err != nil {
		return nil, err
	}
	resp := &schedv1.ImageBlobsResponse{Name: img.Name}
	for _, d := range descs {
		resp.Blobs = append(resp.Blobs, &schedv1.Descriptor{MediaType: d.MediaType, Digest: d.Digest.String(), Size: d.Size, Annotations: d.Annotations})
	}
	return resp, nil
}

// sendBlob streams a blob in chunks.
func (n *node) sendBlob(ctx context.Context, dgst string, stream schedv1.SchedPeer_GetBlobServer) error {
	d, err := digest.Parse(dgst)
	if err != nil {
		return fmt.Errorf("digest %q: %v: %w", dgst, err, errdefs.ErrInvalidArgument)
	}
	r, size, err := n.rt.ReadBlob(ctx, d)
	if err != nil {
		return err
	}
	defer r.Close()
	buf := make([]byte, 1<<20)
	first := true
	for {
		k, err := r.Read(buf)
		if k > 0 {
			chunk := &schedv1.BlobChunk{Data: buf[:k]}
			if first {
				chunk.Size, first = size, false
			}
			if err := stream.Send(chunk); err != nil {
				return err
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// loadImage imports an archive received from a client.
func (n *node) loadImage(ctx context.Context, recv func() ([]byte, error)) ([]shoalrt.Image, error) {
	f, err := os.CreateTemp(filepath.Join(n.cfg.StateDir, "images"), "load-*.tar")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	for {
		data, err := recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		if _, err := f.Write(data); err != nil {
			return nil, err
		}
	}
	if _, err := f.Seek(0, 0); err != nil {
		return nil, err
	}
	imgs, err := n.rt.Import(ctx, f)
	if err != nil {
		return nil, err
	}
	// A load right after start may come before the node has joined its
	// cluster: record the images as soon as it has, or no other node
	// would know where to fetch them.
	select {
	case <-n.ready:
	case <-ctx.Done():
		return imgs, nil
	case <-time.After(30 * time.Second):
		n.log.Warn("images loaded before the node joined a cluster; recorded at the next start")
		return imgs, nil
	}
	{
		for _, img := range imgs {
			if err := n.publishImage(ctx, img); err != nil {
				n.log.Warn("publish image", "image", img.Name, "err", err)
			}
		}
	}
	return imgs, nil
}

// registryAuth gives a pull the credentials of a registry host: those
// `shoalctl registry login` stored for the whole cluster (a secret
// labelled secret.RegistryLabel), else those of the node's
// registry_auth file, else none (an anonymous pull).
func (n *node) registryAuth(ctx context.Context) func(host string) (string, string, error) {
	fromFile := dockerauth.File(n.cfg.RegistryAuth)
	return func(host string) (string, string, error) {
		list, err := n.statd.Secrets.ListSecrets(ctx, &clusterv1.ListSecretsRequest{})
		if err != nil {
			n.log.Warn("registry credentials of the cluster not read: the node's file only", "registry", host, "err", err)
			return fromFile(host)
		}
		// The newest, should a login that replaces them be under way.
		var newest *clusterv1.SecretInfo
		for _, info := range list.GetSecrets() {
			if !dockerauth.SameRegistry(info.GetLabels()[secret.RegistryLabel], host) {
				continue
			}
			if newest == nil {
				newest = info
				continue
			}
			c := info.GetCreated().AsTime().Compare(newest.GetCreated().AsTime())
			if c > 0 || (c == 0 && info.GetName() > newest.GetName()) {
				newest = info
			}
		}
		if newest != nil {
			resp, err := n.statd.Secrets.ReadSecret(ctx, &clusterv1.ReadSecretRequest{Name: newest.GetName()})
			if err != nil {
				return "", "", fmt.Errorf("registry credentials of %s (secret %s): %w", host, newest.GetName(), err)
			}
			user, pass, found, err := dockerauth.Credentials(resp.GetData(), host)
			if err == nil && !found {
				err = errors.New("they do not name it")
			}
			if err != nil {
				return "", "", fmt.Errorf("registry credentials of %s (secret %s): %w", host, newest.GetName(), err)
			}
			return user, pass, nil
		}
		return fromFile(host)
	}
}
