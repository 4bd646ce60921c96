package ctl

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/containerd/errdefs"
	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/shoal-dev/shoal/pkg/client"
	"github.com/shoal-dev/shoal/pkg/volarchive"
	volv1 "github.com/shoal-dev/shoal/proto/shoal/vol/v1"
)

// archiveUser is who uses a volume's mount while shoalctl copies it, so
// that `volume rm` refuses meanwhile.
func archiveUser(verb string) string { return fmt.Sprintf("shoalctl-%s-%d", verb, os.Getpid()) }

// withVolumeRoot mounts volume name on this node for the copy, opens its
// tree as an os.Root and calls fn; the mount's use ends after.
func (a *app) withVolumeRoot(cmd *cobra.Command, name, verb string, fn func(v *volv1.Volume, root *os.Root) error) error {
	c, ctx, done, err := a.voldCall(cmd)
	if err != nil {
		return err
	}
	defer done()
	v, err := c.Volumes.InspectVolume(ctx, &volv1.InspectVolumeRequest{Name: name})
	if err != nil {
		return err
	}
	user := archiveUser(verb)
	m, err := c.Volumes.Mount(ctx, &volv1.MountRequest{Name: name, User: user})
	if err != nil {
		return err
	}
	defer func() {
		// Its own time: the copy may have outlasted --timeout's.
		ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
		defer cancel()
		if _, err := c.Volumes.Unmount(ctx, &volv1.UnmountRequest{Name: name, User: user}); err != nil {
			fmt.Fprintf(a.errOut, "warning: volume %s stays mounted on this node for %s: %v (shoalctl volume unmount %s --user %s)\n", name, user, err, name, user)
		}
	}()
	root, err := os.OpenRoot(m.GetPath())
	if err != nil {
		return err
	}
	defer root.Close()
	return fn(v, root)
}

func (a *app) volumeExport() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "export NAME [-o FILE]",
		Short: "Write a volume's files as a tar archive (to stdout, or FILE)",
		Long: `Write a volume's files, directories and links, with their permissions,
owners and times, as a tar archive: to FILE with -o (written beside it and
renamed once complete, so a failed export leaves nothing), else to stdout
when it is not a terminal.

The archive is the volume as it was at one moment (every write
acknowledged before the command included), taken from a fork of a replica
while writes go on: this node's replica, or else one on another node,
streamed through this node's vold. Only where no vold can do that (this
node's, or every replica's, from before exports) is the volume read
through a mount on this node while it stays in use; files written
meanwhile may then be copied half old, half new, which the command warns
of.`,
		Example: `  shoalctl volume export data -o data.tar
  shoalctl volume export data | gzip > data.tar.gz`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if output == "" && isTerminal(a.out) {
				return usageError{errors.New("refusing to write a tar archive to a terminal: give -o FILE, or redirect stdout")}
			}
			handled, why, err := a.exportFromReplica(cmd, name, output)
			if handled {
				return err
			}
			fmt.Fprintf(a.errOut, "warning: %s: copying through a mount instead, which files written meanwhile may reach half written\n", why)
			return a.withVolumeRoot(cmd, name, "export", func(_ *volv1.Volume, root *os.Root) error {
				w, commit, abort, err := archiveOutput(a.out, output)
				if err != nil {
					return err
				}
				st, err := volarchive.Write(root, w, a.copyProgress("export", name))
				if err == nil {
					err = commit()
				} else {
					abort()
				}
				if err != nil {
					return fmt.Errorf("export %s: %w", name, err)
				}
				to := "stdout"
				if output != "" {
					to = output
				}
				fmt.Fprintf(a.errOut, "%sexported %s: %d entries, %s of file data, to %s%s\n", a.clearLine(), name, st.Entries, bytesText(uint64(st.Bytes)), to, skippedNote(len(st.Skipped), st.Skipped))
				return nil
			})
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "write to FILE instead of stdout")
	return cmd
}

// exportFromReplica writes the point-in-time archive vold makes from a
// replica. handled is false when this vold cannot (a vold from before
// ExportVolume, or no replica here and older volds on the replicas'
// nodes): why says so, and nothing was written.
func (a *app) exportFromReplica(cmd *cobra.Command, name, output string) (handled bool, why string, err error) {
	c, err := client.NewVold(a.runDir, client.Retry{})
	if err != nil {
		return true, "", err
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(cmd.Context())
	defer cancel()
	stream, err := c.Volumes.ExportVolume(ctx, &volv1.ExportVolumeRequest{Name: name})
	var chunk *volv1.ExportChunk
	if err == nil {
		chunk, err = stream.Recv()
	}
	switch status.Code(err) {
	case codes.OK:
	case codes.FailedPrecondition:
		return false, strings.TrimSuffix(status.Convert(err).Message(), ": "+errdefs.ErrFailedPrecondition.Error()), nil
	case codes.Unimplemented:
		return false, "this node's vold cannot export from its replica (an older vold)", nil
	default:
		return true, "", err
	}
	w, commit, abort, err := archiveOutput(a.out, output)
	if err != nil {
		return true, "", err
	}
	progress := a.copyProgress("export", name)
	var written int64
	for {
		if _, err := w.Write(chunk.GetData()); err != nil {
			abort()
			return true, "", fmt.Errorf("export %s: %w", name, err)
		}
		written += int64(len(chunk.GetData()))
		if progress != nil {
			progress(written)
		}
		if chunk.GetLast() {
			break
		}
		if chunk, err = stream.Recv(); err != nil {
			abort()
			fmt.Fprint(a.errOut, a.clearLine())
			return true, "", fmt.Errorf("export %s: %w", name, err)
		}
	}
	if err := commit(); err != nil {
		return true, "", fmt.Errorf("export %s: %w", name, err)
	}
	from := "this node's replica" // a vold from before proxied exports
	if chunk.GetNode() != "" {
		from = "node " + chunk.GetNode() + "'s replica"
	}
	fmt.Fprintf(a.errOut, "%sexported %s as of its entry %d (from %s): %d entries, %s of file data, to %s%s\n", a.clearLine(), name,
		chunk.GetApplied(), from, chunk.GetEntries(), bytesText(uint64(chunk.GetBytes())), cmp.Or(output, "stdout"), skippedNote(int(chunk.GetSkipped()), nil))
	return true, "", nil
}

// archiveOutput is where an export goes: stdout, or a temporary file
// beside path that commit renames to path and abort removes.
func archiveOutput(stdout io.Writer, path string) (w io.Writer, commit func() error, abort func(), err error) {
	if path == "" {
		return stdout, func() error { return nil }, func() {}, nil
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return nil, nil, nil, err
	}
	abort = func() { f.Close(); os.Remove(f.Name()) }
	commit = func() error {
		err := f.Sync()
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Chmod(f.Name(), 0o600) // a volume's data may be secret
		}
		if err == nil {
			err = os.Rename(f.Name(), path)
		}
		if err != nil {
			os.Remove(f.Name())
		}
		return err
	}
	return f, commit, abort, nil
}

func (a *app) volumeImport() *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "import NAME FILE|-",
		Short: "Fill an empty volume from a tar archive (a file, or - for stdin)",
		Long: `Extract a tar archive (as volume export writes, or any tar) into a volume,
through a mount on this node: every file is a replicated write. The
volume must be empty, unless --force (files of the archive then replace
those of the same name, the others stay). An archive read from a file
that holds more data than the volume has free is refused before anything
is written; from stdin, a volume that fills up stops the import with the
files written so far kept. Names that lead out of the volume (../x, links
pointing out) fail the import.`,
		Example: `  shoalctl volume create data --size 2G
  shoalctl volume import data data.tar
  gunzip -c data.tar.gz | shoalctl volume import data -`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, path := args[0], args[1]
			var in io.Reader = os.Stdin
			var size int64 = -1
			if path != "-" {
				f, err := os.Open(path)
				if err != nil {
					return usageError{err}
				}
				defer f.Close()
				_, size, err = volarchive.Size(f)
				if err != nil {
					return usageError{fmt.Errorf("%s is not a tar archive: %w", path, err)}
				}
				if _, err := f.Seek(0, io.SeekStart); err != nil {
					return err
				}
				in = f
			}
			return a.withVolumeRoot(cmd, name, "import", func(v *volv1.Volume, root *os.Root) error {
				if free := v.GetSizeBytes() - v.GetUsedBytes(); size > free {
					return fmt.Errorf("%s holds %s of file data; volume %s has %s free of %s: nothing was written (shoalctl volume update %s --size …)",
						path, bytesText(uint64(size)), name, bytesText(uint64(max(free, 0))), bytesText(uint64(v.GetSizeBytes())), name)
				}
				if !force {
					names, err := readDirNames(root)
					if err != nil {
						return err
					}
					if len(names) > 0 {
						return fmt.Errorf("volume %s is not empty (%s): nothing was written; import into an empty volume, or give --force", name, strings.Join(names, ", "))
					}
				}
				// The free space bounds what is read from stdin too.
				opts := volarchive.ReadOptions{Progress: a.copyProgress("import", name), MaxBytes: max(v.GetSizeBytes()-v.GetUsedBytes(), 1)}
				st, err := volarchive.Read(root, in, opts)
				if err != nil {
					hint := ""
					if errors.Is(err, syscall.ENOSPC) || errors.Is(err, volarchive.ErrTooLarge) {
						hint = fmt.Sprintf(" (volume %s is full)", name)
					}
					fmt.Fprint(a.errOut, a.clearLine())
					return fmt.Errorf("import into %s stopped after %d entries, %s%s: %w", name, st.Entries, bytesText(uint64(st.Bytes)), hint, err)
				}
				fmt.Fprintf(a.errOut, "%simported into %s: %d entries, %s of file data%s\n", a.clearLine(), name, st.Entries, bytesText(uint64(st.Bytes)), skippedNote(len(st.Skipped), st.Skipped))
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "import into a volume that holds files")
	return cmd
}

// readDirNames lists up to a few names of root's top directory.
func readDirNames(root *os.Root) ([]string, error) {
	d, err := root.Open(".")
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Readdirnames(4)
	if errors.Is(err, io.EOF) {
		err = nil
	}
	if len(names) == 4 {
		names[3] = "…"
	}
	return names, err
}

// copyProgress reports a long copy's bytes on a terminal's stderr.
func (a *app) copyProgress(verb, name string) func(int64) {
	if !isTerminal(a.errOut) {
		return nil
	}
	return func(b int64) { fmt.Fprintf(a.errOut, "\r%s %s: %s ", verb, name, bytesText(uint64(b))) }
}

// clearLine clears the progress line on a terminal's stderr.
func (a *app) clearLine() string {
	if isTerminal(a.errOut) {
		return "\r\033[K"
	}
	return ""
}

func skippedNote(count int, names []string) string {
	switch {
	case count == 0:
		return ""
	case len(names) == 0:
		return fmt.Sprintf("; skipped %d FIFOs or sockets", count)
	}
	return fmt.Sprintf("; skipped %d FIFOs, sockets or devices (%s)", count, strings.Join(names[:min(3, len(names))], ", "))
}
