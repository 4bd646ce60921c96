package testimage_test

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"slices"
	"strings"
	"testing"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/shoal-dev/shoal/pkg/testimage"
)

func skipWithoutBusybox(t *testing.T) {
	if _, err := os.Stat(testimage.DefaultBusybox); err != nil {
		t.Skipf("no %s: %v", testimage.DefaultBusybox, err)
	}
}

// untar returns the entries of a tar in order, and the files' contents.
func untar(t *testing.T, data []byte) ([]*tar.Header, map[string][]byte) {
	t.Helper()
	var hdrs []*tar.Header
	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return hdrs, files
		}
		if err != nil {
			t.Fatal(err)
		}
		hdrs = append(hdrs, h)
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files[h.Name] = b
		}
	}
}

func TestDeterministic(t *testing.T) {
	skipWithoutBusybox(t)
	a, builtA, err := testimage.OCI(testimage.Default(), testimage.V2())
	if err != nil {
		t.Fatal(err)
	}
	b, builtB, err := testimage.OCI(testimage.Default(), testimage.V2())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Error("two builds of the same images differ")
	}
	if builtA[0].Manifest.Digest != builtB[0].Manifest.Digest {
		t.Error("digests differ between builds")
	}
	d1, _, err := testimage.Docker(testimage.Default())
	if err != nil {
		t.Fatal(err)
	}
	d2, _, _ := testimage.Docker(testimage.Default())
	if !bytes.Equal(d1, d2) {
		t.Error("two docker builds differ")
	}
}

func TestOCILayout(t *testing.T) {
	skipWithoutBusybox(t)
	data, built, err := testimage.OCI(testimage.Default(), testimage.V2())
	if err != nil {
		t.Fatal(err)
	}
	hdrs, files := untar(t, data)
	for _, h := range hdrs {
		if strings.HasPrefix(h.Name, "./") || strings.HasPrefix(h.Name, "/") {
			t.Errorf("entry %q: want no ./ or / prefix", h.Name)
		}
		if !h.ModTime.Equal(testimage.Epoch) {
			t.Errorf("entry %s: mtime %v", h.Name, h.ModTime)
		}
	}
	if hdrs[0].Name != "oci-layout" {
		t.Errorf("first entry %s, want oci-layout", hdrs[0].Name)
	}
	var idx ocispec.Index
	if err := json.Unmarshal(files["index.json"], &idx); err != nil {
		t.Fatal(err)
	}
	if len(idx.Manifests) != 2 {
		t.Fatalf("index has %d manifests", len(idx.Manifests))
	}
	for i, m := range idx.Manifests {
		if got := m.Annotations[ocispec.AnnotationRefName]; got != built[i].Name {
			t.Errorf("manifest %d: ref name %q, want %q", i, got, built[i].Name)
		}
		if m.Digest != built[i].Manifest.Digest {
			t.Errorf("manifest %d: %s, want %s", i, m.Digest, built[i].Manifest.Digest)
		}
	}
	// Every blob is where its digest says, and matches it.
	for name, b := range files {
		if enc, ok := strings.CutPrefix(name, "blobs/sha256/"); ok {
			if digest.FromBytes(b).Encoded() != enc {
				t.Errorf("blob %s does not match its name", name)
			}
		}
	}
	// v2 shares v1's base layer and adds one.
	if len(built[1].Layers) != 2 || built[1].Layers[0].Digest != built[0].Layers[0].Digest {
		t.Errorf("v2 layers %+v, want v1's %s and one more", built[1].Layers, built[0].Layers[0].Digest)
	}
	// The base layer: busybox, its applets, no ./ prefixes.
	layer := files["blobs/sha256/"+built[0].Layers[0].Digest.Encoded()]
	lh, lfiles := untar(t, layer)
	var links []string
	for _, h := range lh {
		if strings.HasPrefix(h.Name, "./") {
			t.Errorf("layer entry %q", h.Name)
		}
		if h.Typeflag == tar.TypeSymlink && h.Linkname == "busybox" {
			links = append(links, strings.TrimPrefix(h.Name, "bin/"))
		}
	}
	for _, a := range []string{"sh", "sleep", "echo", "cat", "httpd", "nc", "wget", "ls", "env", "true", "false", "kill", "ps", "grep", "date", "head", "seq", "dd", "md5sum", "sha256sum", "touch", "mkdir", "rm"} {
		if !slices.Contains(links, a) {
			t.Errorf("no /bin/%s", a)
		}
	}
	bb, _ := os.ReadFile(testimage.DefaultBusybox)
	if !bytes.Equal(lfiles["bin/busybox"], bb) {
		t.Error("bin/busybox is not /bin/busybox")
	}
	// The config names the layers by diff ID (uncompressed: their digest).
	var cfg ocispec.Image
	if err := json.Unmarshal(files["blobs/sha256/"+built[1].Config.Digest.Encoded()], &cfg); err != nil {
		t.Fatal(err)
	}
	if len(cfg.RootFS.DiffIDs) != 2 || cfg.RootFS.DiffIDs[1] != built[1].Layers[1].Digest || !slices.Equal(cfg.Config.Cmd, []string{"sh"}) {
		t.Errorf("v2 config %+v", cfg)
	}
}

func TestDockerSave(t *testing.T) {
	skipWithoutBusybox(t)
	data, built, err := testimage.Docker(testimage.Default(), testimage.V2())
	if err != nil {
		t.Fatal(err)
	}
	_, files := untar(t, data)
	var ms []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(files["manifest.json"], &ms); err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 || ms[0].RepoTags[0] != "local/busybox:latest" || ms[1].RepoTags[0] != "local/busybox:v2" {
		t.Fatalf("manifest.json: %+v", ms)
	}
	for i, m := range ms {
		if digest.FromBytes(files[m.Config]) != built[i].Config.Digest {
			t.Errorf("%s: config digest", m.RepoTags[0])
		}
		for j, l := range m.Layers {
			if digest.FromBytes(files[l]) != built[i].Layers[j].Digest {
				t.Errorf("%s: layer %d digest", m.RepoTags[0], j)
			}
		}
	}
}

func TestWriteFile(t *testing.T) {
	skipWithoutBusybox(t)
	path := t.TempDir() + "/img.tar"
	if _, err := testimage.WriteFile(path, "docker", testimage.Default()); err != nil {
		t.Fatal(err)
	}
	if _, err := testimage.WriteFile(path, "zip", testimage.Default()); err == nil {
		t.Error("unknown format accepted")
	}
	if _, _, err := testimage.OCI(testimage.Default(), testimage.Default()); err == nil {
		t.Error("the same name twice accepted")
	}
}
