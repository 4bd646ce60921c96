package runtime

import (
	"strings"

	"github.com/distribution/reference"
	digest "github.com/opencontainers/go-digest"
)

// Image names: containerd stores them normalized, as Docker does
// ("local/busybox:latest" is stored as "docker.io/local/busybox:latest"),
// whether they come from a docker-save tar (whose importer normalizes) or
// an OCI layout (whose ref names we normalize on import). The Runtime
// shows familiar names and accepts either form.

// normalizeName returns the stored form of an image reference, or ref
// itself if it does not parse.
func normalizeName(ref string) string {
	n, err := reference.ParseDockerRef(ref)
	if err != nil {
		return ref
	}
	return n.String()
}

// familiarName returns the short form of a stored image name.
func familiarName(name string) string {
	n, err := reference.ParseNormalizedNamed(name)
	if err != nil {
		return name
	}
	return reference.FamiliarString(n)
}

// parseRef parses an image reference as Docker does.
func parseRef(name string) (reference.Named, error) { return reference.ParseDockerRef(name) }

// refDigest returns the digest ref names ("sha256:…" or "name@sha256:…"),
// or "".
func refDigest(ref string) digest.Digest {
	if d, err := digest.Parse(ref); err == nil {
		return d
	}
	if _, after, ok := strings.Cut(ref, "@"); ok {
		if d, err := digest.Parse(after); err == nil {
			return d
		}
	}
	return ""
}
