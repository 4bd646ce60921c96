package runtime

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/errdefs"
	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Import implements Runtime.
func (r *Containerd) Import(ctx context.Context, rd io.Reader) ([]Image, error) {
	ctx = r.WithNamespace(ctx)
	imgs, err := r.client.Import(ctx, rd, client.WithImageRefTranslator(normalizeName))
	if err != nil {
		err = classify(err)
		if !isClassified(err) {
			// The importer's own errors (a bad tar, a missing blob, an
			// unknown format) are the input's fault.
			err = fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
		}
		return nil, fmt.Errorf("import images: %w", err)
	}
	var out []Image
	for _, rec := range imgs {
		img := client.NewImageWithPlatform(r.client, rec, r.platform)
		if err := img.Unpack(ctx, r.cfg.Snapshotter); err != nil {
			return nil, wrapf(err, "unpack image %s", familiarName(rec.Name))
		}
		out = append(out, r.toImage(ctx, rec))
		r.log.Info("image imported", "image", familiarName(rec.Name), "digest", rec.Target.Digest)
	}
	return out, nil
}

// isClassified reports whether err belongs to one of errdefs' classes.
func isClassified(err error) bool {
	for _, is := range []func(error) bool{
		errdefs.IsInvalidArgument, errdefs.IsNotFound, errdefs.IsAlreadyExists,
		errdefs.IsFailedPrecondition, errdefs.IsUnavailable, errdefs.IsNotImplemented,
		errdefs.IsCanceled, errdefs.IsDeadlineExceeded, errdefs.IsDataLoss,
		errdefs.IsPermissionDenied, errdefs.IsResourceExhausted, errdefs.IsInternal,
		errdefs.IsConflict, errdefs.IsAborted, errdefs.IsOutOfRange, errdefs.IsUnauthorized,
	} {
		if is(err) {
			return true
		}
	}
	return false
}

// toImage describes rec; sizes and dates it cannot read are left zero.
func (r *Containerd) toImage(ctx context.Context, rec images.Image) Image {
	img := client.NewImageWithPlatform(r.client, rec, r.platform)
	out := Image{Name: familiarName(rec.Name), Digest: rec.Target.Digest, Created: rec.CreatedAt}
	if size, err := img.Size(ctx); err == nil {
		out.Size = size
	}
	if desc, err := img.Config(ctx); err == nil {
		if data, err := content.ReadBlob(ctx, r.client.ContentStore(), desc); err == nil {
			if created, hc, err := parseImageConfig(data); err == nil {
				if !created.IsZero() {
					out.Created = created
				}
				out.Healthcheck = hc
			}
		}
	}
	return out
}

// Images implements Runtime.
func (r *Containerd) Images(ctx context.Context) ([]Image, error) {
	ctx = r.WithNamespace(ctx)
	recs, err := r.client.ImageService().List(ctx)
	if err != nil {
		return nil, wrapf(err, "list images")
	}
	out := make([]Image, 0, len(recs))
	for _, rec := range recs {
		out = append(out, r.toImage(ctx, rec))
	}
	slices.SortFunc(out, func(a, b Image) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// lookup finds the image record ref names: a name as given, its
// normalized form, or a target digest ("sha256:…" or "name@sha256:…").
func (r *Containerd) lookup(ctx context.Context, ref string) (images.Image, error) {
	if ref == "" {
		return images.Image{}, fmt.Errorf("no image given: %w", errdefs.ErrInvalidArgument)
	}
	is := r.client.ImageService()
	want := refDigest(ref)
	if want == "" {
		for _, name := range []string{ref, normalizeName(ref)} {
			rec, err := is.Get(ctx, name)
			if err == nil {
				return rec, nil
			}
			if !errdefs.IsNotFound(classify(err)) {
				return images.Image{}, wrapf(err, "image %s", ref)
			}
		}
		return images.Image{}, fmt.Errorf("image %s: %w", ref, errdefs.ErrNotFound)
	}
	recs, err := is.List(ctx, fmt.Sprintf("target.digest==%q", want.String()))
	if err != nil {
		return images.Image{}, wrapf(err, "image %s", ref)
	}
	if len(recs) == 0 {
		return images.Image{}, fmt.Errorf("image %s: %w", ref, errdefs.ErrNotFound)
	}
	// Several names may share a target: pick one deterministically.
	slices.SortFunc(recs, func(a, b images.Image) int { return strings.Compare(a.Name, b.Name) })
	return recs[0], nil
}

// Image implements Runtime.
func (r *Containerd) Image(ctx context.Context, ref string) (Image, error) {
	ctx = r.WithNamespace(ctx)
	rec, err := r.lookup(ctx, ref)
	if err != nil {
		return Image{}, err
	}
	return r.toImage(ctx, rec), nil
}

// RemoveImage implements Runtime.
func (r *Containerd) RemoveImage(ctx context.Context, ref string) error {
	ctx = r.WithNamespace(ctx)
	rec, err := r.lookup(ctx, ref)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	// Synchronous, so that the blobs and snapshots no other image or
	// container uses are gone when this returns: containerd's own
	// collector may not run for a long while after a deletion.
	if err := r.client.ImageService().Delete(ctx, rec.Name, images.SynchronousDelete()); err != nil && !errdefs.IsNotFound(classify(err)) {
		return wrapf(err, "remove image %s", ref)
	}
	return nil
}

// platformHandler wraps h so that a walk follows only this platform's
// manifest of an index.
func (r *Containerd) platformHandler(h images.HandlerFunc) images.HandlerFunc {
	return images.LimitManifests(images.FilterPlatforms(h, r.platform), r.platform, 1)
}

// ImageBlobs implements Runtime.
func (r *Containerd) ImageBlobs(ctx context.Context, ref string) ([]ocispec.Descriptor, error) {
	ctx = r.WithNamespace(ctx)
	rec, err := r.lookup(ctx, ref)
	if err != nil {
		return nil, err
	}
	cs := r.client.ContentStore()
	var out []ocispec.Descriptor
	seen := map[digest.Digest]bool{}
	walk := func(ctx context.Context, desc ocispec.Descriptor) ([]ocispec.Descriptor, error) {
		if seen[desc.Digest] {
			return nil, nil
		}
		seen[desc.Digest] = true
		out = append(out, desc)
		return images.Children(ctx, cs, desc)
	}
	if err := images.Walk(ctx, r.platformHandler(walk), rec.Target); err != nil {
		return nil, wrapf(err, "blobs of image %s", ref)
	}
	return out, nil
}

// ReadBlob implements Runtime.
func (r *Containerd) ReadBlob(ctx context.Context, dgst digest.Digest) (io.ReadCloser, int64, error) {
	ctx = r.WithNamespace(ctx)
	if err := dgst.Validate(); err != nil {
		return nil, 0, fmt.Errorf("blob %q: %w: %w", dgst, err, errdefs.ErrInvalidArgument)
	}
	cs := r.client.ContentStore()
	info, err := cs.Info(ctx, dgst)
	if err != nil {
		return nil, 0, wrapf(err, "blob %s", dgst)
	}
	ra, err := cs.ReaderAt(ctx, ocispec.Descriptor{Digest: dgst, Size: info.Size})
	if err != nil {
		return nil, 0, wrapf(err, "blob %s", dgst)
	}
	return readCloser{io.NewSectionReader(ra, 0, ra.Size()), ra}, ra.Size(), nil
}

type readCloser struct {
	io.Reader
	io.Closer
}

// blobLeaseID names the lease that keeps a written blob until
// CreateImage claims it (lease IDs are at most 76 characters).
func blobLeaseID(d digest.Digest) string {
	return "shoal-blob-" + d.Encoded()[:min(len(d.Encoded()), 64)]
}

// WriteBlob implements Runtime.
//
// NB: containerd garbage-collects content that nothing references. A blob
// written here is referenced by a lease of its own (expiring after
// BlobTTL) until CreateImage makes an image reference it and drops the
// lease.
func (r *Containerd) WriteBlob(ctx context.Context, desc ocispec.Descriptor, rd io.Reader) error {
	ctx = r.WithNamespace(ctx)
	if err := desc.Digest.Validate(); err != nil {
		return fmt.Errorf("blob %q: %w: %w", desc.Digest, err, errdefs.ErrInvalidArgument)
	}
	if desc.Size < 0 {
		return fmt.Errorf("blob %s: size %d: %w", desc.Digest, desc.Size, errdefs.ErrInvalidArgument)
	}
	ls := r.client.LeasesService()
	lease := leases.Lease{ID: blobLeaseID(desc.Digest)}
	if _, err := ls.Create(ctx, leases.WithID(lease.ID), leases.WithExpiration(BlobTTL)); err != nil && !errdefs.IsAlreadyExists(classify(err)) {
		return wrapf(err, "blob %s: lease", desc.Digest)
	}
	ctx = leases.WithLease(ctx, lease.ID)
	cs := r.client.ContentStore()
	res := leases.Resource{ID: desc.Digest.String(), Type: "content"}
	if _, err := cs.Info(ctx, desc.Digest); err == nil {
		// Already here: hold it for CreateImage too.
		if err := ls.AddResource(ctx, lease, res); err != nil {
			return wrapf(err, "blob %s: lease", desc.Digest)
		}
		return nil
	}

	ref := "shoal-" + desc.Digest.String()
	w, err := content.OpenWriter(ctx, cs, content.WithRef(ref), content.WithDescriptor(desc))
	if err != nil {
		if errdefs.IsAlreadyExists(classify(err)) {
			return nil
		}
		return wrapf(err, "blob %s: open writer", desc.Digest)
	}
	defer w.Close()
	if st, err := w.Status(); err == nil && st.Offset > 0 {
		// A partial write of an earlier attempt: start over.
		if err := w.Truncate(0); err != nil {
			cs.Abort(ctx, ref)
			return wrapf(err, "blob %s: truncate", desc.Digest)
		}
	}
	verifier := desc.Digest.Verifier()
	n, err := io.Copy(io.MultiWriter(w, verifier), io.LimitReader(rd, desc.Size+1))
	if err != nil {
		cs.Abort(ctx, ref)
		return wrapf(err, "blob %s: write", desc.Digest)
	}
	if n != desc.Size {
		cs.Abort(ctx, ref)
		return fmt.Errorf("blob %s: got %s bytes, want %d: %w", desc.Digest, atLeast(n, desc.Size), desc.Size, errdefs.ErrDataLoss)
	}
	if !verifier.Verified() {
		cs.Abort(ctx, ref)
		return fmt.Errorf("blob %s: content does not match its digest: %w", desc.Digest, errdefs.ErrDataLoss)
	}
	if err := w.Commit(ctx, desc.Size, desc.Digest); err != nil {
		err = classify(err)
		if errdefs.IsAlreadyExists(err) {
			return nil
		}
		cs.Abort(ctx, ref)
		if errdefs.IsFailedPrecondition(err) {
			err = fmt.Errorf("%w: %w", err, errdefs.ErrDataLoss)
		}
		return fmt.Errorf("blob %s: commit: %w", desc.Digest, err)
	}
	return nil
}

// atLeast renders n, with a "+" when it reached the limit read (want+1):
// the writer sent more than it announced.
func atLeast(n, want int64) string {
	if n > want {
		return fmt.Sprintf("more than %d", want)
	}
	return fmt.Sprint(n)
}

// CreateImage implements Runtime.
func (r *Containerd) CreateImage(ctx context.Context, name string, target ocispec.Descriptor) (Image, error) {
	ctx = r.WithNamespace(ctx)
	if _, err := parseRef(name); err != nil {
		return Image{}, fmt.Errorf("image name %q: %w: %w", name, err, errdefs.ErrInvalidArgument)
	}
	if !images.IsManifestType(target.MediaType) && !images.IsIndexType(target.MediaType) {
		return Image{}, fmt.Errorf("image %s: target media type %q is neither a manifest nor an index: %w", name, target.MediaType, errdefs.ErrInvalidArgument)
	}
	cs := r.client.ContentStore()
	info, err := cs.Info(ctx, target.Digest)
	if err != nil {
		return Image{}, wrapf(err, "image %s: target %s", name, target.Digest)
	}
	if info.Size != target.Size {
		return Image{}, fmt.Errorf("image %s: target %s has %d bytes, not %d: %w", name, target.Digest, info.Size, target.Size, errdefs.ErrInvalidArgument)
	}

	// Check that every blob is here and label each parent with its
	// children, so that the image record keeps them all from GC.
	var blobs []digest.Digest
	check := func(ctx context.Context, desc ocispec.Descriptor) ([]ocispec.Descriptor, error) {
		if _, err := cs.Info(ctx, desc.Digest); err != nil {
			return nil, wrapf(err, "blob %s (%s)", desc.Digest, desc.MediaType)
		}
		blobs = append(blobs, desc.Digest)
		return images.Children(ctx, cs, desc)
	}
	if err := images.Walk(ctx, images.SetChildrenLabels(cs, r.platformHandler(check)), target); err != nil {
		return Image{}, fmt.Errorf("image %s: %w", name, classify(err))
	}

	rec := images.Image{Name: normalizeName(name), Target: target}
	is := r.client.ImageService()
	created, err := is.Create(ctx, rec)
	if errdefs.IsAlreadyExists(classify(err)) {
		created, err = is.Update(ctx, rec, "target")
	}
	if err != nil {
		return Image{}, wrapf(err, "image %s", name)
	}
	img := client.NewImageWithPlatform(r.client, created, r.platform)
	if err := img.Unpack(ctx, r.cfg.Snapshotter); err != nil {
		return Image{}, wrapf(err, "unpack image %s", name)
	}
	ls := r.client.LeasesService()
	for _, d := range blobs {
		if err := ls.Delete(ctx, leases.Lease{ID: blobLeaseID(d)}); err != nil && !errdefs.IsNotFound(classify(err)) {
			r.log.Warn("drop blob lease", "digest", d, "err", err)
		}
	}
	r.log.Info("image created", "image", familiarName(created.Name), "digest", target.Digest)
	return r.toImage(ctx, created), nil
}
