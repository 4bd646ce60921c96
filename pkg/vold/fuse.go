package vold

import (
	"fmt"

	"github.com/containerd/errdefs"

	"github.com/shoal-dev/shoal/pkg/volfs"
)

// mountFUSE serves a volume's filesystem with FUSE at dir.
func mountFUSE(dir string, c *volfs.Client) (fuseServer, error) {
	return nil, fmt.Errorf("FUSE mounts are not wired in yet: %w", errdefs.ErrNotImplemented)
}

// cleanStaleMounts clears mount points left by a previous run.
func cleanStaleMounts(dir string) error { return nil }
