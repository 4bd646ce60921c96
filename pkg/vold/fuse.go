package vold

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/shoal-dev/shoal/pkg/volfs"
	"github.com/shoal-dev/shoal/pkg/volfuse"
)

// mountFUSE serves a volume's filesystem with FUSE at dir.
func mountFUSE(log *slog.Logger, dir, name string, c *volfs.Client) (fuseServer, error) {
	return volfuse.Mount(dir, c, volfuse.Options{FsName: "shoal:" + name, Logger: log.With("component", "fuse", "volume", name)})
}

// cleanStaleMounts detaches the dead FUSE mounts a killed vold left in
// dir (one directory per volume), so that they can be mounted again.
func cleanStaleMounts(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		errs = append(errs, volfuse.CleanStale(filepath.Join(dir, e.Name())))
	}
	return errors.Join(errs...)
}
