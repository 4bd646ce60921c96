// Package testimage builds small container images from a static busybox,
// for tests and demos that need a real image without a registry.
//
// An image is one layer holding /bin/busybox, a symlink per applet
// (/bin/sh, /bin/sleep, ...), /etc/passwd, /etc/group, /tmp and
// /www/index.html, plus an optional second layer of extra files. Every
// timestamp is fixed and every list sorted, so the same Spec and the same
// busybox give the same bytes, and so the same digests, on every run and
// every machine. Layers are uncompressed tars: gzip output may change
// between Go releases, a tar does not.
//
// Two formats are written:
//
//	WriteOCI     an OCI image layout as a tar: oci-layout, index.json (one
//	             entry per image, annotated org.opencontainers.image.ref.name
//	             with the full reference, which is what containerd's Import
//	             takes the name from), blobs/sha256/...
//	WriteDocker  what `docker save` writes: manifest.json (Config, RepoTags,
//	             Layers), repositories, <config digest>.json, <layer>/layer.tar
//
// Entries carry no "./" prefix (containerd's importer wants exact names).
//
// Default is local/busybox:latest; V2 is local/busybox:v2, the same base
// layer plus a second layer that changes /www/index.html and adds
// /etc/shoal-version, for update tests. From a shell:
//
//	go run ./pkg/testimage/cmd/mkimage -o /tmp/busybox.tar            # OCI, latest
//	go run ./pkg/testimage/cmd/mkimage -o /tmp/both.tar -v2 -format docker
package testimage

import (
	"archive/tar"
	"bytes"
	_ "crypto/sha256" // registers sha256 for go-digest
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"

	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Defaults of a Spec.
const (
	DefaultName    = "local/busybox:latest"
	V2Name         = "local/busybox:v2"
	DefaultBusybox = "/bin/busybox"
)

// Epoch is the timestamp of every file and of the image config.
var Epoch = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// DefaultApplets are the busybox applets linked into /bin.
var DefaultApplets = []string{
	"[", "awk", "cat", "cut", "date", "dd", "echo", "env", "false", "grep",
	"head", "hostname", "httpd", "id", "ip", "kill", "ls", "md5sum", "mkdir",
	"nc", "nslookup", "ping", "printf", "ps", "rm", "sed", "seq", "sh",
	"sha256sum", "sleep", "tail", "test", "timeout", "touch", "tr", "true",
	"uname", "wc", "wget",
}

// DefaultEnv is the environment of the image config.
var DefaultEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

// Spec describes one image.
type Spec struct {
	// Name is the image reference, e.g. "local/busybox:latest".
	Name string
	// Busybox is the path of a static busybox binary (default /bin/busybox).
	Busybox string
	// Applets are linked to busybox in /bin (nil: DefaultApplets).
	Applets []string
	// Files are added to (or replace files of) the base layer: path
	// without a leading slash → contents, mode 0644.
	Files map[string]string
	// Extra, when not empty, makes a second layer with these files.
	Extra map[string]string
	// Cmd and Env of the image config (nil: ["sh"] and DefaultEnv).
	Cmd []string
	Env []string
	// StopSignal of the image config ("" for none).
	StopSignal string
	// Healthcheck, if set, is the HEALTHCHECK of the image config, as
	// Docker writes it (OCI's config has no such field).
	Healthcheck *Healthcheck
	// Arch is the image's architecture (default: this machine's, GOARCH).
	Arch string
}

// Default returns the spec of local/busybox:latest.
func Default() Spec {
	return Spec{Name: DefaultName}
}

// V2 returns the spec of local/busybox:v2: the base layer of Default
// (byte for byte the same blob) plus a layer that replaces
// /www/index.html and adds /etc/shoal-version.
func V2() Spec {
	return Spec{
		Name: V2Name,
		Extra: map[string]string{
			"etc/shoal-version": "v2\n",
			"www/index.html":    "shoal test image v2\n",
		},
	}
}

// Healthcheck is a HEALTHCHECK in Docker's image config: Test is [NONE],
// [CMD, args...] or [CMD-SHELL, command]; durations are written in
// nanoseconds.
type Healthcheck struct {
	Test        []string      `json:"Test"`
	Interval    time.Duration `json:"Interval,omitempty"`
	Timeout     time.Duration `json:"Timeout,omitempty"`
	StartPeriod time.Duration `json:"StartPeriod,omitempty"`
	Retries     int           `json:"Retries,omitempty"`
}

// Built describes an image that was written.
type Built struct {
	Name string
	// Manifest is the image manifest: the target of the image in an OCI
	// layout. (For a docker-save tar the importer makes its own manifest;
	// the config and layers are the same.)
	Manifest ocispec.Descriptor
	Config   ocispec.Descriptor
	Layers   []ocispec.Descriptor
}

// blob is one blob of an image, with its bytes.
type blob struct {
	desc ocispec.Descriptor
	data []byte
}

// image is a built image held in memory.
type image struct {
	spec     Spec
	manifest blob
	config   blob
	layers   []blob
}

func (im *image) built() Built {
	b := Built{Name: im.spec.Name, Manifest: im.manifest.desc, Config: im.config.desc}
	for _, l := range im.layers {
		b.Layers = append(b.Layers, l.desc)
	}
	return b
}

// WriteOCI writes the images as one OCI image layout tar to w.
func WriteOCI(w io.Writer, images ...Spec) ([]Built, error) {
	ims, err := buildAll(images)
	if err != nil {
		return nil, err
	}
	idx := ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageIndex,
	}
	blobs := map[digest.Digest][]byte{}
	var out []Built
	for _, im := range ims {
		d := im.manifest.desc
		d.Annotations = map[string]string{ocispec.AnnotationRefName: im.spec.Name}
		d.Platform = &ocispec.Platform{OS: "linux", Architecture: im.spec.Arch}
		idx.Manifests = append(idx.Manifests, d)
		for _, b := range append([]blob{im.manifest, im.config}, im.layers...) {
			blobs[b.desc.Digest] = b.data
		}
		out = append(out, im.built())
	}
	indexJSON, err := json.Marshal(idx)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(w)
	files := []tarFile{
		{name: ocispec.ImageLayoutFile, data: []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{name: ocispec.ImageIndexFile, data: indexJSON},
		{name: "blobs/", dir: true},
		{name: "blobs/sha256/", dir: true},
	}
	for _, d := range sortedDigests(blobs) {
		files = append(files, tarFile{name: "blobs/sha256/" + d.Encoded(), data: blobs[d]})
	}
	if err := writeTar(tw, files); err != nil {
		return nil, err
	}
	return out, tw.Close()
}

// dockerManifest is one entry of a docker-save manifest.json.
type dockerManifest struct {
	Config   string
	RepoTags []string
	Layers   []string
}

// WriteDocker writes the images as one `docker save` tar to w.
func WriteDocker(w io.Writer, images ...Spec) ([]Built, error) {
	ims, err := buildAll(images)
	if err != nil {
		return nil, err
	}
	var (
		manifests []dockerManifest
		files     []tarFile
		seen      = map[string]bool{}
		repos     = map[string]map[string]string{}
		out       []Built
	)
	add := func(f tarFile) {
		if !seen[f.name] {
			seen[f.name] = true
			files = append(files, f)
		}
	}
	for _, im := range ims {
		m := dockerManifest{Config: im.config.desc.Digest.Encoded() + ".json", RepoTags: []string{im.spec.Name}}
		add(tarFile{name: m.Config, data: im.config.data})
		for _, l := range im.layers {
			dir := l.desc.Digest.Encoded()
			add(tarFile{name: dir + "/", dir: true})
			add(tarFile{name: dir + "/VERSION", data: []byte("1.0")})
			add(tarFile{name: dir + "/layer.tar", data: l.data})
			m.Layers = append(m.Layers, dir+"/layer.tar")
		}
		manifests = append(manifests, m)
		repo, tag := splitTag(im.spec.Name)
		if repos[repo] == nil {
			repos[repo] = map[string]string{}
		}
		top := im.layers[len(im.layers)-1].desc.Digest.Encoded()
		repos[repo][tag] = top
		b := im.built()
		b.Manifest = ocispec.Descriptor{}
		out = append(out, b)
	}
	mj, err := json.Marshal(manifests)
	if err != nil {
		return nil, err
	}
	rj, err := json.Marshal(repos) // encoding/json sorts map keys
	if err != nil {
		return nil, err
	}
	files = append(files, tarFile{name: "manifest.json", data: mj}, tarFile{name: "repositories", data: rj})
	sort.SliceStable(files, func(i, j int) bool { return files[i].name < files[j].name })
	tw := tar.NewWriter(w)
	if err := writeTar(tw, files); err != nil {
		return nil, err
	}
	return out, tw.Close()
}

// WriteFile writes the images to path in format "oci" or "docker".
func WriteFile(path, format string, images ...Spec) ([]Built, error) {
	var buf bytes.Buffer
	var (
		out []Built
		err error
	)
	switch format {
	case "oci", "":
		out, err = WriteOCI(&buf, images...)
	case "docker":
		out, err = WriteDocker(&buf, images...)
	default:
		return nil, fmt.Errorf("format %q: want oci or docker", format)
	}
	if err != nil {
		return nil, err
	}
	return out, os.WriteFile(path, buf.Bytes(), 0o644)
}

// OCI returns the images as an OCI layout tar in memory.
func OCI(images ...Spec) ([]byte, []Built, error) {
	var buf bytes.Buffer
	b, err := WriteOCI(&buf, images...)
	return buf.Bytes(), b, err
}

// Docker returns the images as a docker-save tar in memory.
func Docker(images ...Spec) ([]byte, []Built, error) {
	var buf bytes.Buffer
	b, err := WriteDocker(&buf, images...)
	return buf.Bytes(), b, err
}

func splitTag(name string) (repo, tag string) {
	i := strings.LastIndex(name, ":")
	if i < 0 || strings.Contains(name[i:], "/") {
		return name, "latest"
	}
	return name[:i], name[i+1:]
}

func buildAll(specs []Spec) ([]*image, error) {
	if len(specs) == 0 {
		specs = []Spec{Default()}
	}
	names := map[string]bool{}
	cache := map[string][]byte{}
	var out []*image
	for _, s := range specs {
		s = s.withDefaults()
		if names[s.Name] {
			return nil, fmt.Errorf("image %s given twice", s.Name)
		}
		names[s.Name] = true
		bb, ok := cache[s.Busybox]
		if !ok {
			var err error
			if bb, err = os.ReadFile(s.Busybox); err != nil {
				return nil, fmt.Errorf("read busybox: %w", err)
			}
			cache[s.Busybox] = bb
		}
		im, err := build(s, bb)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", s.Name, err)
		}
		out = append(out, im)
	}
	return out, nil
}

func (s Spec) withDefaults() Spec {
	if s.Name == "" {
		s.Name = DefaultName
	}
	if s.Busybox == "" {
		s.Busybox = DefaultBusybox
	}
	if s.Applets == nil {
		s.Applets = DefaultApplets
	}
	if s.Cmd == nil {
		s.Cmd = []string{"sh"}
	}
	if s.Env == nil {
		s.Env = DefaultEnv
	}
	if s.Arch == "" {
		s.Arch = runtime.GOARCH
	}
	return s
}

// build makes the layers, config and manifest of s.
func build(s Spec, busybox []byte) (*image, error) {
	base := []tarFile{
		{name: "bin/", dir: true},
		{name: "bin/busybox", data: busybox, mode: 0o755},
		{name: "dev/", dir: true},
		{name: "etc/", dir: true},
		{name: "etc/group", data: []byte("root:x:0:\nnogroup:x:65534:\n")},
		{name: "etc/passwd", data: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")},
		{name: "proc/", dir: true},
		{name: "root/", dir: true, mode: 0o700},
		{name: "sys/", dir: true},
		{name: "tmp/", dir: true, mode: 0o1777},
		{name: "usr/", dir: true},
		{name: "usr/bin/", dir: true},
		{name: "var/", dir: true},
		{name: "www/", dir: true},
		{name: "www/index.html", data: []byte("shoal test image\n")},
	}
	for _, a := range s.Applets {
		if a == "busybox" || strings.Contains(a, "/") || a == "" {
			return nil, fmt.Errorf("bad applet name %q", a)
		}
		base = append(base, tarFile{name: "bin/" + a, link: "busybox"})
	}
	base = mergeFiles(base, s.Files)
	layers := []blob{layerBlob(base)}
	if len(s.Extra) > 0 {
		layers = append(layers, layerBlob(mergeFiles(nil, s.Extra)))
	}

	var diffIDs []digest.Digest
	var history []ocispec.History
	for i, l := range layers {
		diffIDs = append(diffIDs, l.desc.Digest) // uncompressed: diff ID = digest
		by := "testimage: busybox base layer"
		if i > 0 {
			by = "testimage: extra files"
		}
		history = append(history, ocispec.History{Created: &Epoch, CreatedBy: by})
	}
	cfg := ocispec.Image{
		Created:  &Epoch,
		Platform: ocispec.Platform{OS: "linux", Architecture: s.Arch},
		Config: ocispec.ImageConfig{
			Env:        s.Env,
			Cmd:        s.Cmd,
			WorkingDir: "/",
			StopSignal: s.StopSignal,
			Labels:     map[string]string{"org.opencontainers.image.title": s.Name},
		},
		RootFS:  ocispec.RootFS{Type: "layers", DiffIDs: diffIDs},
		History: history,
	}
	var cfgJSON []byte
	var err error
	if s.Healthcheck == nil {
		cfgJSON, err = json.Marshal(cfg)
	} else {
		// The outer config shadows the OCI one: an image without a
		// health check keeps its config (and digest) byte for byte.
		cfgJSON, err = json.Marshal(struct {
			ocispec.Image
			Config struct {
				ocispec.ImageConfig
				Healthcheck *Healthcheck `json:"Healthcheck"`
			} `json:"config"`
		}{Image: cfg, Config: struct {
			ocispec.ImageConfig
			Healthcheck *Healthcheck `json:"Healthcheck"`
		}{cfg.Config, s.Healthcheck}})
	}
	if err != nil {
		return nil, err
	}
	config := newBlob(ocispec.MediaTypeImageConfig, cfgJSON)
	man := ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    config.desc,
	}
	for _, l := range layers {
		man.Layers = append(man.Layers, l.desc)
	}
	manJSON, err := json.Marshal(man)
	if err != nil {
		return nil, err
	}
	return &image{spec: s, manifest: newBlob(ocispec.MediaTypeImageManifest, manJSON), config: config, layers: layers}, nil
}

// mergeFiles adds files (path → contents) to fs, replacing entries of the
// same name and adding missing parent directories, and sorts the result.
func mergeFiles(fs []tarFile, files map[string]string) []tarFile {
	names := map[string]int{}
	for i, f := range fs {
		names[strings.TrimSuffix(f.name, "/")] = i
	}
	keys := make([]string, 0, len(files))
	for k := range files {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		name := strings.TrimPrefix(path.Clean("/"+k), "/")
		for dir := path.Dir(name); dir != "."; dir = path.Dir(dir) {
			if _, ok := names[dir]; !ok {
				names[dir] = len(fs)
				fs = append(fs, tarFile{name: dir + "/", dir: true})
			}
		}
		f := tarFile{name: name, data: []byte(files[k])}
		if i, ok := names[name]; ok {
			fs[i] = f
		} else {
			names[name] = len(fs)
			fs = append(fs, f)
		}
	}
	sort.SliceStable(fs, func(i, j int) bool { return fs[i].name < fs[j].name })
	return fs
}

func layerBlob(files []tarFile) blob {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := writeTar(tw, files); err != nil {
		panic(err) // writing to memory cannot fail but for bad headers, which we never make
	}
	if err := tw.Close(); err != nil {
		panic(err)
	}
	return newBlob(ocispec.MediaTypeImageLayer, buf.Bytes())
}

func newBlob(mediaType string, data []byte) blob {
	return blob{
		desc: ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(data), Size: int64(len(data))},
		data: data,
	}
}

// tarFile is one entry of a tar: a directory (name ends in "/"), a
// symlink, or a regular file.
type tarFile struct {
	name string
	data []byte
	link string
	dir  bool
	mode int64
}

func writeTar(tw *tar.Writer, files []tarFile) error {
	for _, f := range files {
		h := &tar.Header{
			Name:    f.name,
			ModTime: Epoch,
			Uname:   "root",
			Gname:   "root",
			Format:  tar.FormatPAX,
		}
		switch {
		case f.dir:
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
		case f.link != "":
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, f.link, 0o777
		default:
			h.Typeflag, h.Mode, h.Size = tar.TypeReg, 0o644, int64(len(f.data))
		}
		if f.mode != 0 {
			h.Mode = f.mode
		}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("%s: %w", f.name, err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(f.data); err != nil {
				return err
			}
		}
	}
	return nil
}

func sortedDigests(m map[digest.Digest][]byte) []digest.Digest {
	out := make([]digest.Digest, 0, len(m))
	for d := range m {
		out = append(out, d)
	}
	slices.Sort(out)
	return out
}
