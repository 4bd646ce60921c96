package runtime

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/errdefs"
	"github.com/distribution/reference"
)

// Pull implements Runtime.
func (r *Containerd) Pull(ctx context.Context, ref string, opts PullOptions) (Image, error) {
	name, err := PullableRef(ref)
	if err != nil {
		return Image{}, err
	}
	ctx = r.WithNamespace(ctx)
	hostOpts := []docker.RegistryOpt{docker.WithPlainHTTP(func(host string) (bool, error) {
		return plainHTTP(opts.PlainHTTP, host), nil
	})}
	if opts.Auth != nil {
		hostOpts = append(hostOpts, docker.WithAuthorizer(docker.NewDockerAuthorizer(docker.WithAuthCreds(opts.Auth))))
	}
	hosts := docker.ConfigureDefaultRegistries(hostOpts...)
	img, err := r.client.Pull(ctx, name,
		client.WithResolver(docker.NewResolver(docker.ResolverOptions{Hosts: hosts})),
		client.WithPlatformMatcher(r.platform),
		client.WithPullUnpack,
		client.WithPullSnapshotter(r.cfg.Snapshotter),
	)
	if err != nil {
		return Image{}, wrapf(err, "pull image %s", ref)
	}
	r.log.Info("image pulled", "image", familiarName(img.Name()), "digest", img.Target().Digest)
	return r.toImage(ctx, img.Metadata()), nil
}

// plainHTTP reports whether registry host ("name[:port]") matches one of
// the entries: a host with or without its port, or, as with Docker's
// insecure-registries, a CIDR holding the host's address.
func plainHTTP(entries []string, host string) bool {
	name := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		name = h
	}
	addr, addrErr := netip.ParseAddr(name)
	for _, e := range entries {
		if e == host || e == name {
			return true
		}
		if p, err := netip.ParsePrefix(e); err == nil && addrErr == nil && p.Contains(addr) {
			return true
		}
	}
	return false
}

// PullableRef returns the normalized name of ref when it names its
// registry explicitly (the first path component has a dot or a port, or
// is localhost), and an InvalidArgument error otherwise: only such a ref
// can be pulled. A ref that pins a digest must name the registry too.
func PullableRef(ref string) (string, error) {
	n, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return "", fmt.Errorf("image %q: %v: %w", ref, err, errdefs.ErrInvalidArgument)
	}
	first, _, _ := strings.Cut(ref, "/")
	if !strings.Contains(ref, "/") || (!strings.ContainsAny(first, ".:") && first != "localhost") {
		return "", fmt.Errorf("image %q names no registry (write it as host[:port]/path:tag, e.g. docker.io/library/%s, to pull it): %w",
			ref, reference.FamiliarName(n), errdefs.ErrNotFound)
	}
	return reference.TagNameOnly(n).String(), nil
}
