package runtime

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	goruntime "runtime"
	"strings"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// The fake's image store: blobs by digest and names pointing at targets,
// read from the same tars containerd imports. It follows containerd where
// it matters to callers: names are normalized, a docker-save tar gets a
// Docker schema 2 manifest made up on import (so its target digest is
// not the OCI one), and only this platform's manifest of an index counts.

// fakeImage is a named image of the fake.
type fakeImage struct {
	name   string // normalized
	target ocispec.Descriptor
}

// readTar reads every regular file of a tar into memory.
func readTar(r io.Reader) (map[string][]byte, error) {
	files := map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read tar: %w: %w", err, errdefs.ErrInvalidArgument)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return nil, fmt.Errorf("read tar: %w: %w", err, errdefs.ErrInvalidArgument)
		}
		files[strings.TrimPrefix(h.Name, "./")] = data
	}
	return files, nil
}

// parseArchive returns the blobs and named targets of an OCI-layout or
// docker-save tar.
func parseArchive(r io.Reader) (map[digest.Digest][]byte, []fakeImage, error) {
	files, err := readTar(r)
	if err != nil {
		return nil, nil, err
	}
	blobs := map[digest.Digest][]byte{}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("import: %s: %w", fmt.Sprintf(format, args...), errdefs.ErrInvalidArgument)
	}
	if idxJSON, ok := files[ocispec.ImageIndexFile]; ok {
		for name, data := range files {
			if rest, ok := strings.CutPrefix(name, "blobs/"); ok {
				alg, enc, _ := strings.Cut(rest, "/")
				d := digest.NewDigestFromEncoded(digest.Algorithm(alg), enc)
				if d.Validate() != nil || d.Algorithm().FromBytes(data) != d {
					return nil, nil, bad("blob %s does not match its digest", name)
				}
				blobs[d] = data
			}
		}
		var idx ocispec.Index
		if err := json.Unmarshal(idxJSON, &idx); err != nil {
			return nil, nil, bad("index.json: %v", err)
		}
		var out []fakeImage
		for _, m := range idx.Manifests {
			name := m.Annotations[images.AnnotationImageName]
			if name == "" {
				name = m.Annotations[ocispec.AnnotationRefName]
			}
			if name == "" {
				continue
			}
			if _, ok := blobs[m.Digest]; !ok {
				return nil, nil, bad("manifest %s of %s missing", m.Digest, name)
			}
			t := m
			t.Annotations, t.Platform = nil, nil
			out = append(out, fakeImage{name: normalizeName(name), target: t})
		}
		return blobs, out, nil
	}
	mj, ok := files["manifest.json"]
	if !ok {
		return nil, nil, bad("neither an OCI layout (index.json) nor a docker save tar (manifest.json)")
	}
	var ms []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(mj, &ms); err != nil {
		return nil, nil, bad("manifest.json: %v", err)
	}
	var out []fakeImage
	for _, m := range ms {
		cfg, ok := files[m.Config]
		if !ok {
			return nil, nil, bad("config %s missing", m.Config)
		}
		man := ocispec.Manifest{
			Versioned: specs.Versioned{SchemaVersion: 2},
			MediaType: images.MediaTypeDockerSchema2Manifest,
			Config:    ocispec.Descriptor{MediaType: images.MediaTypeDockerSchema2Config, Digest: digest.FromBytes(cfg), Size: int64(len(cfg))},
		}
		blobs[man.Config.Digest] = cfg
		for _, l := range m.Layers {
			data, ok := files[l]
			if !ok {
				return nil, nil, bad("layer %s missing", l)
			}
			d := digest.FromBytes(data)
			blobs[d] = data
			man.Layers = append(man.Layers, ocispec.Descriptor{MediaType: images.MediaTypeDockerSchema2Layer, Digest: d, Size: int64(len(data))})
		}
		mb, err := json.Marshal(man)
		if err != nil {
			return nil, nil, err
		}
		md := digest.FromBytes(mb)
		blobs[md] = mb
		for _, tag := range m.RepoTags {
			out = append(out, fakeImage{name: normalizeName(tag), target: ocispec.Descriptor{MediaType: man.MediaType, Digest: md, Size: int64(len(mb))}})
		}
	}
	return blobs, out, nil
}

// walkImage returns the blobs of target this platform uses, parents
// first. get returns a blob's bytes, or false if it is missing; a missing
// blob is an error.
func walkImage(target ocispec.Descriptor, get func(digest.Digest) ([]byte, bool)) ([]ocispec.Descriptor, error) {
	var out []ocispec.Descriptor
	seen := map[digest.Digest]bool{}
	var walk func(d ocispec.Descriptor) error
	walk = func(d ocispec.Descriptor) error {
		if seen[d.Digest] {
			return nil
		}
		seen[d.Digest] = true
		data, ok := get(d.Digest)
		if !ok {
			return fmt.Errorf("blob %s (%s): %w", d.Digest, d.MediaType, errdefs.ErrNotFound)
		}
		out = append(out, d)
		switch {
		case images.IsIndexType(d.MediaType):
			var idx ocispec.Index
			if err := json.Unmarshal(data, &idx); err != nil {
				return fmt.Errorf("index %s: %w: %w", d.Digest, err, errdefs.ErrInvalidArgument)
			}
			if m, ok := pickManifest(idx.Manifests); ok {
				return walk(m)
			}
			return fmt.Errorf("index %s has no manifest for linux/%s: %w", d.Digest, goruntime.GOARCH, errdefs.ErrNotFound)
		case images.IsManifestType(d.MediaType):
			var m ocispec.Manifest
			if err := json.Unmarshal(data, &m); err != nil {
				return fmt.Errorf("manifest %s: %w: %w", d.Digest, err, errdefs.ErrInvalidArgument)
			}
			for _, c := range append([]ocispec.Descriptor{m.Config}, m.Layers...) {
				if err := walk(c); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return out, walk(target)
}

// pickManifest picks this platform's manifest of an index (one without
// a platform matches too).
func pickManifest(ms []ocispec.Descriptor) (ocispec.Descriptor, bool) {
	for _, m := range ms {
		if m.Platform == nil || (m.Platform.OS == "linux" && m.Platform.Architecture == goruntime.GOARCH) {
			return m, true
		}
	}
	return ocispec.Descriptor{}, false
}

func verifyBlob(desc ocispec.Descriptor, data []byte) error {
	if int64(len(data)) != desc.Size {
		return fmt.Errorf("blob %s: got %s bytes, want %d: %w", desc.Digest, atLeast(int64(len(data)), desc.Size), desc.Size, errdefs.ErrDataLoss)
	}
	if desc.Digest.Algorithm().FromBytes(data) != desc.Digest {
		return fmt.Errorf("blob %s: content does not match its digest: %w", desc.Digest, errdefs.ErrDataLoss)
	}
	return nil
}

func readLimited(r io.Reader, size int64) ([]byte, error) {
	var buf bytes.Buffer
	_, err := io.Copy(&buf, io.LimitReader(r, size+1))
	return buf.Bytes(), err
}
