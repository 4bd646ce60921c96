package schedd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"

	"github.com/containerd/errdefs"

	"github.com/shoal-dev/shoal/pkg/chunkio"
	"github.com/shoal-dev/shoal/pkg/volarchive"
	schedv1 "github.com/shoal-dev/shoal/proto/shoal/sched/v1"
)

// copyChunk is about the most data a CopyChunk or CopyToInput carries.
const copyChunk = 256 << 10

func (s *api) TaskCopyFrom(req *schedv1.TaskCopyFromRequest, stream schedv1.Scheduler_TaskCopyFromServer) error {
	ctx := stream.Context()
	return s.onTaskNode(ctx, req.GetTask(), func(id string) error {
		req.Task = id
		return s.n.localCopyFrom(ctx, req, stream.Send)
	}, func(peer schedv1.SchedPeerClient, id string) error {
		req.Task = id
		remote, err := peer.TaskCopyFrom(ctx, req)
		if err != nil {
			return err
		}
		return forward(remote.Recv, stream.Send)
	})
}

func (s *api) TaskCopyTo(stream schedv1.Scheduler_TaskCopyToServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	ctx := stream.Context()
	return s.onTaskNode(ctx, first.GetTask(), func(id string) error {
		first.Task = id
		reply, err := s.n.localCopyTo(ctx, first, stream.Recv)
		if err != nil {
			return err
		}
		return stream.SendAndClose(reply)
	}, func(peer schedv1.SchedPeerClient, id string) error {
		first.Task = id
		remote, err := peer.TaskCopyTo(ctx)
		if err != nil {
			return err
		}
		next := first
		if err := forward(func() (*schedv1.CopyToInput, error) {
			if m := next; m != nil {
				next = nil
				return m, nil
			}
			return stream.Recv()
		}, remote.Send); err != nil && !errors.Is(err, io.EOF) {
			// io.EOF from Send: the receiver ended the call; its error
			// is what CloseAndRecv returns.
			return err
		}
		reply, err := remote.CloseAndRecv()
		if err != nil {
			return err
		}
		return stream.SendAndClose(reply)
	})
}

func (s *peerServer) TaskCopyFrom(req *schedv1.TaskCopyFromRequest, stream schedv1.SchedPeer_TaskCopyFromServer) error {
	return s.n.localCopyFrom(stream.Context(), req, stream.Send)
}

func (s *peerServer) TaskCopyTo(stream schedv1.SchedPeer_TaskCopyToServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	reply, err := s.n.localCopyTo(stream.Context(), first, stream.Recv)
	if err != nil {
		return err
	}
	return stream.SendAndClose(reply)
}

// taskRoot opens the file system of local task id as its process sees
// it (/proc/PID/root: its root with its mounts, volumes and secrets too),
// as an os.Root, so that no name or link in it leads out to the node's.
func (n *node) taskRoot(ctx context.Context, id string) (*os.Root, error) {
	if _, ok := n.localTask(id); !ok {
		return nil, fmt.Errorf("task %s does not run on this node: %w", id, errdefs.ErrNotFound)
	}
	pid := n.taskPid(ctx, id)
	if pid == 0 {
		return nil, fmt.Errorf("task %s is not running: %w", id, errdefs.ErrFailedPrecondition)
	}
	root, err := os.OpenRoot(fmt.Sprintf("/proc/%d/root", pid))
	if err == nil && n.taskPid(ctx, id) != pid {
		// It exited meanwhile, and pid may be another process's now.
		root.Close()
		err = fmt.Errorf("task %s is not running: %w", id, errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		return nil, fmt.Errorf("file system of task %s: %w", id, err)
	}
	return root, nil
}

// fsError classes a file system error of a copy for the API's edge.
func fsError(err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: %w", err, errdefs.ErrNotFound)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("%w: %w", err, errdefs.ErrPermissionDenied)
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.ELOOP), errors.Is(err, fs.ErrExist), strings.Contains(err.Error(), "escapes from parent"):
		// os.Root's refusal of ".." or a link leading out has no
		// exported error.
		return fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	case errors.Is(err, syscall.ENOSPC):
		return fmt.Errorf("%w: %w", err, errdefs.ErrResourceExhausted)
	}
	return err
}

// localCopyFrom streams a tar of req's path in a local task.
func (n *node) localCopyFrom(ctx context.Context, req *schedv1.TaskCopyFromRequest, send func(*schedv1.CopyChunk) error) error {
	root, err := n.taskRoot(ctx, req.GetTask())
	if err != nil {
		return err
	}
	defer root.Close()
	// The task's links lead where they would inside it: an absolute
	// one from its root.
	rel, err := volarchive.Resolve(root, req.GetPath(), false)
	if err != nil {
		return fmt.Errorf("copy from task %s: %w", req.GetTask(), fsError(err))
	}
	dir, name := path.Dir(rel), path.Base(rel)
	parent, err := root.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("copy from task %s: %w", req.GetTask(), fsError(err))
	}
	defer parent.Close()
	if _, err := parent.Lstat(name); err != nil {
		return fmt.Errorf("copy from task %s: %w", req.GetTask(), fsError(err))
	}
	w := &chunkio.Writer{Size: copyChunk, Send: func(b []byte) error { return send(&schedv1.CopyChunk{Data: b}) }}
	st, err := volarchive.WritePath(parent, name, w, nil)
	if err != nil {
		return fmt.Errorf("copy %s from task %s: %w", req.GetPath(), req.GetTask(), fsError(err))
	}
	return send(&schedv1.CopyChunk{Data: w.Rest(), Last: true, Entries: int64(st.Entries), Bytes: st.Bytes, Skipped: st.Skipped})
}

// localCopyTo extracts the tar stream recv gives into a local task.
func (n *node) localCopyTo(ctx context.Context, first *schedv1.CopyToInput, recv func() (*schedv1.CopyToInput, error)) (*schedv1.CopyToReply, error) {
	id := first.GetTask()
	root, err := n.taskRoot(ctx, id)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	dest, err := volarchive.Resolve(root, first.GetPath(), true)
	if err != nil {
		return nil, fmt.Errorf("copy to task %s: %w", id, fsError(err))
	}
	dir, rename, err := volarchive.Target(root, dest)
	if err != nil {
		return nil, fmt.Errorf("copy to task %s: %w", id, fsError(err))
	}
	if first.GetIntoDirectory() && rename != "" {
		return nil, fmt.Errorf("copy to task %s: %s is not a directory (a tar stream goes into one): %w", id, first.GetPath(), errdefs.ErrInvalidArgument)
	}
	into, err := root.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("copy to task %s: %w", id, fsError(err))
	}
	defer into.Close()
	opts := volarchive.ReadOptions{Rename: rename}
	if !first.GetKeepOwners() {
		opts.Owner = &volarchive.Owner{} // the task's root, as docker cp
	}
	r := chunkio.NewReader(first.GetData(), func() ([]byte, error) {
		m, err := recv()
		return m.GetData(), err
	})
	st, err := volarchive.Read(into, r, opts)
	if err != nil {
		return nil, fmt.Errorf("copy to task %s: %w", id, fsError(err))
	}
	// The stream's end (tar's padding) is not the archive's: read to it,
	// so that the sender's last messages find a receiver.
	if _, err := io.Copy(io.Discard, r); err != nil {
		return nil, fmt.Errorf("copy to task %s: %w", id, err)
	}
	return &schedv1.CopyToReply{Entries: int64(st.Entries), Bytes: st.Bytes, Skipped: st.Skipped, Dest: path.Join("/", dir, rename)}, nil
}
