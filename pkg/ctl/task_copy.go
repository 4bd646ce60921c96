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

	"github.com/spf13/cobra"

	"github.com/shoal-dev/shoal/pkg/chunkio"
	"github.com/shoal-dev/shoal/pkg/volarchive"
	schedv1 "github.com/shoal-dev/shoal/proto/shoal/sched/v1"
)

// copyChunk is the size of the messages of a copy into a task.
const copyChunk = 256 << 10

func (a *app) taskCopy() *cobra.Command {
	var keepOwners bool
	cmd := &cobra.Command{
		Use:   "cp TASK:PATH DEST|-  |  cp SRC|- TASK:PATH",
		Short: "Copy files between a running task and this machine (from any node)",
		Long: `Copy a file or a directory and its tree out of a running task, or into
one, as docker cp does, on whichever node runs the task. The task's
files are those its process sees: its image's, and its volumes',
secrets' and tmpfs mounts.

An existing directory as the destination receives the copy under its own
name; any other path (whose parent is a directory) becomes its name. "-"
writes a tar stream to stdout, or reads one from stdin into a directory
of the task. Copies into a task are owned by its root user unless -a
keeps the owners they have here. The task's links resolve inside it
(an absolute one from its root), so no path leads out of the task, and
the task's image need hold no tar or shell.

A local path with a ':' in it is written with a "/" or "./" in front.`,
		Example: `  shoalctl task cp web.1a2b3c4d:/etc/nginx/nginx.conf .
  shoalctl task cp ./site web.1a2b3c4d:/usr/share/nginx/html
  shoalctl task cp web.1a2b3c4d:/var/log - | tar t`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			srcTask, srcPath, srcIn := splitTaskPath(args[0])
			dstTask, dstPath, dstIn := splitTaskPath(args[1])
			switch {
			case srcIn && dstIn:
				return usageError{errors.New("copies between two tasks are not supported: copy to this machine, then into the other task")}
			case srcIn:
				return a.copyFromTask(cmd.Context(), srcTask, srcPath, args[1])
			case dstIn:
				return a.copyToTask(cmd.Context(), args[0], dstTask, dstPath, keepOwners)
			}
			return usageError{errors.New("neither argument names a task: give TASK:PATH as the source or the destination")}
		},
	}
	cmd.Flags().BoolVarP(&keepOwners, "archive", "a", false, "keep the owners (numeric user and group) of what is copied into a task")
	return cmd
}

// splitTaskPath splits "TASK:PATH". Like docker cp, an argument that
// starts with "/" or "." is a local path, whatever ':' it holds.
func splitTaskPath(arg string) (task, path string, ok bool) {
	if strings.HasPrefix(arg, "/") || strings.HasPrefix(arg, ".") {
		return "", "", false
	}
	task, path, ok = strings.Cut(arg, ":")
	if !ok || task == "" {
		return "", "", false
	}
	return task, cmp.Or(path, "/"), true
}

// copyFromTask writes path of task to dest: extracted there as docker cp
// does, or as a tar stream to stdout for "-".
func (a *app) copyFromTask(ctx context.Context, task, path, dest string) error {
	if dest == "-" && isTerminal(a.out) {
		return usageError{errors.New("refusing to write a tar stream to a terminal: redirect stdout, or give a local path")}
	}
	var (
		root           *os.Root
		dir, renameTo  string
		err            error
		extractionDone chan error
		pw             *io.PipeWriter
		w              io.Writer = a.out
	)
	if dest != "-" {
		abs, err := filepath.Abs(dest)
		if err != nil {
			return err
		}
		if root, err = os.OpenRoot("/"); err != nil {
			return err
		}
		defer root.Close()
		// Links as this machine resolves them (root is /).
		resolved, err := volarchive.Resolve(root, abs, true)
		if err == nil {
			dir, renameTo, err = volarchive.Target(root, resolved)
		}
		if err != nil {
			return fmt.Errorf("copy to %s: %w", dest, err)
		}
	}
	c, ctx, done, err := a.scheddStream(ctx)
	if err != nil {
		return err
	}
	defer done()
	stream, err := c.TaskCopyFrom(ctx, &schedv1.TaskCopyFromRequest{Task: task, Path: path})
	if err != nil {
		return err
	}
	chunk, err := stream.Recv()
	if err != nil {
		return err
	}
	if root != nil {
		// Extracted inside the destination directory, which the archive
		// (a task's, so not trusted) cannot leave.
		into, err := root.OpenRoot(dir)
		if err != nil {
			return fmt.Errorf("copy to %s: %w", dest, err)
		}
		defer into.Close()
		var pr *io.PipeReader
		pr, pw = io.Pipe()
		w = pw
		extractionDone = make(chan error, 1)
		go func() {
			// Owned by whoever copies, as docker cp does.
			owner := &volarchive.Owner{UID: os.Getuid(), GID: os.Getgid()}
			_, err := volarchive.Read(into, pr, volarchive.ReadOptions{Rename: renameTo, Owner: owner})
			if err == nil {
				_, err = io.Copy(io.Discard, pr) // tar's padding
			}
			pr.CloseWithError(err)
			extractionDone <- err
		}()
	}
	progress := a.copyProgress("copy", task+":"+path)
	var written int64
	for {
		if _, err := w.Write(chunk.GetData()); err != nil {
			return a.copyFailed(pw, extractionDone, err)
		}
		written += int64(len(chunk.GetData()))
		if progress != nil {
			progress(written)
		}
		if chunk.GetLast() {
			break
		}
		if chunk, err = stream.Recv(); err != nil {
			return a.copyFailed(pw, extractionDone, err)
		}
	}
	if pw != nil {
		pw.Close()
		if err := <-extractionDone; err != nil {
			return fmt.Errorf("copy to %s: %w", dest, err)
		}
	}
	to := "stdout"
	if dest != "-" {
		to = "/" + filepath.Join(dir, renameTo)
	}
	fmt.Fprintf(a.errOut, "%scopied %s:%s to %s: %d entries, %s of file data%s\n", a.clearLine(), task, path, to,
		chunk.GetEntries(), bytesText(uint64(chunk.GetBytes())), skippedNote(len(chunk.GetSkipped()), chunk.GetSkipped()))
	return nil
}

// copyFailed ends an extraction under way and returns why the copy
// stopped: the extraction's error if it failed first.
func (a *app) copyFailed(pw *io.PipeWriter, done chan error, err error) error {
	fmt.Fprint(a.errOut, a.clearLine())
	if pw == nil {
		return err
	}
	pw.CloseWithError(err)
	if xerr := <-done; xerr != nil && !errors.Is(xerr, err) {
		return xerr
	}
	return err
}

// copyToTask sends src (a local path, or a tar stream from stdin for "-")
// into path of task.
func (a *app) copyToTask(ctx context.Context, src, task, path string, keepOwners bool) error {
	var (
		r      io.Reader = os.Stdin
		stats            = make(chan error, 1)
		closer io.Closer
	)
	if src == "-" {
		if isTerminal(os.Stdin) {
			return usageError{errors.New("refusing to read a tar stream from a terminal: redirect stdin, or give a local path")}
		}
	} else {
		abs, err := filepath.Abs(src)
		if err != nil {
			return err
		}
		if _, err := os.Lstat(abs); err != nil {
			return fmt.Errorf("copy %s: %w", src, err)
		}
		root, err := os.OpenRoot(filepath.Dir(abs))
		if err != nil {
			return err
		}
		defer root.Close()
		pr, pw := io.Pipe()
		r, closer = pr, pr
		progress := a.copyProgress("copy", src)
		go func() {
			_, err := volarchive.WritePath(root, filepath.Base(abs), pw, progress)
			pw.CloseWithError(err)
			stats <- err
		}()
	}
	c, ctx, done, err := a.scheddStream(ctx)
	if err != nil {
		return err
	}
	defer done()
	stream, err := c.TaskCopyTo(ctx)
	if err != nil {
		return err
	}
	if err := stream.Send(&schedv1.CopyToInput{Task: task, Path: path, KeepOwners: keepOwners, IntoDirectory: src == "-"}); err != nil {
		return err
	}
	w := &chunkio.Writer{Size: copyChunk, Send: func(b []byte) error { return stream.Send(&schedv1.CopyToInput{Data: b}) }}
	_, sendErr := io.Copy(w, r)
	if sendErr == nil {
		if rest := w.Rest(); len(rest) > 0 {
			sendErr = stream.Send(&schedv1.CopyToInput{Data: rest})
		}
	}
	if closer != nil {
		closer.Close() // stops the archive writer if sending stopped
	}
	// The receiver's answer says why a send failed (io.EOF: it ended the
	// call).
	reply, err := stream.CloseAndRecv()
	fmt.Fprint(a.errOut, a.clearLine())
	if err != nil {
		return err
	}
	if sendErr != nil && !errors.Is(sendErr, io.EOF) {
		return sendErr
	}
	if src != "-" {
		if err := <-stats; err != nil {
			return fmt.Errorf("copy %s: %w", src, err)
		}
	}
	fmt.Fprintf(a.errOut, "copied %s to %s:%s: %d entries, %s of file data%s\n", src, task, reply.GetDest(),
		reply.GetEntries(), bytesText(uint64(reply.GetBytes())), skippedNote(len(reply.GetSkipped()), reply.GetSkipped()))
	return nil
}
