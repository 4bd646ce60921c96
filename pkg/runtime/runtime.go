package runtime

import (
	"context"
	"encoding/json"
	"io"
	"time"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Runtime runs a node's containers and holds its images. Implementations
// are safe for concurrent use. Errors are classified with
// github.com/containerd/errdefs (IsNotFound, IsAlreadyExists,
// IsInvalidArgument, IsUnavailable, IsDataLoss, ...); see the package doc.
type Runtime interface {
	// Import loads the images of an OCI-layout tar or a `docker save` tar
	// and unpacks them for the snapshotter. A name already in use is
	// repointed to the imported image.
	Import(ctx context.Context, r io.Reader) ([]Image, error)
	// Images lists the images, sorted by name.
	Images(ctx context.Context) ([]Image, error)
	// Image returns the image ref names ("local/busybox:latest",
	// "docker.io/local/busybox:latest") or whose target digest ref is
	// ("sha256:..."); NotFound if there is none.
	Image(ctx context.Context, ref string) (Image, error)
	// RemoveImage removes an image name; its blobs go, before it returns,
	// when nothing else uses them. Removing a missing image is not an
	// error. Tasks made from the image keep running.
	RemoveImage(ctx context.Context, ref string) error

	// ImageBlobs lists the blobs this platform needs of image ref, parents
	// before children: the target (index or manifest), the platform's
	// manifest when the target is an index, the config, the layers. Copying
	// them in this order with ReadBlob and WriteBlob, then calling
	// CreateImage with the first one, transfers the image to another node.
	ImageBlobs(ctx context.Context, ref string) ([]ocispec.Descriptor, error)
	// ReadBlob opens a blob by digest and returns its size; NotFound if it
	// is not here.
	ReadBlob(ctx context.Context, dgst digest.Digest) (io.ReadCloser, int64, error)
	// WriteBlob stores a blob read from r, verifying its size and digest
	// against desc: a mismatch is an error wrapping errdefs.ErrDataLoss and
	// nothing is committed. A blob already present is not read again. A
	// written blob is kept for an hour (BlobTTL) for CreateImage to claim.
	WriteBlob(ctx context.Context, desc ocispec.Descriptor, r io.Reader) error
	// CreateImage names target once all its blobs (as ImageBlobs lists
	// them) are written, and unpacks it. A missing blob is NotFound. A name
	// already in use is repointed.
	CreateImage(ctx context.Context, name string, target ocispec.Descriptor) (Image, error)
	// Pull fetches ref from its registry and unpacks it. ref must name the
	// registry host explicitly ("registry.example:5000/app:1",
	// "docker.io/library/busybox:1.36"): a bare "busybox" is a local image
	// name here, never a silent trip to Docker Hub. Registries in
	// opts.PlainHTTP are spoken to over http.
	Pull(ctx context.Context, ref string, opts PullOptions) (Image, error)

	// Run creates task spec.ID (a container and its task) and starts it.
	// An ID in use is AlreadyExists; a missing image NotFound.
	Run(ctx context.Context, spec TaskSpec) error
	// Stop sends the stop signal to task id, waits up to grace for it to
	// exit, then kills it (SIGKILL) and returns how it exited. Stopping a
	// task that has exited returns its exit again; a container that has
	// no task (never started) returns Exit{Code: -1}. A missing container
	// is NotFound. The task stays (stopped) until Remove.
	Stop(ctx context.Context, id string, grace time.Duration) (Exit, error)
	// Remove deletes task id: it kills the task if it runs, deletes it,
	// its container and its root file system. Removing what does not
	// exist is not an error. The log file stays.
	Remove(ctx context.Context, id string) error
	// List returns every task of this runtime's namespace, sorted by ID,
	// including those a previous process started: after a restart, schedd
	// re-adopts them from here.
	List(ctx context.Context) ([]TaskInfo, error)
	// Wait returns a channel that receives how task id exits, then
	// closes. It works for tasks started by another process. If waiting
	// fails (ctx ends, the runtime becomes unreachable) the Exit carries
	// the error in Err and Code -1: wait again when it is back. A task that
	// has already exited delivers its exit at once. Missing task: NotFound.
	Wait(ctx context.Context, id string) (<-chan Exit, error)
	// Exec runs args in running task id and returns its exit code.
	// stdin, stdout and stderr may be nil, and stdout and stderr the same
	// writer; with a tty (non-nil), stderr is merged into stdout. The process gets EOF
	// on its stdin when stdin does. When ctx ends the process is killed.
	// Exec in a task that is not running is FailedPrecondition.
	Exec(ctx context.Context, id string, args []string, stdin io.Reader, stdout, stderr io.Writer, tty *Terminal) (int, error)
	// Stats samples the resource use of running task id: counters since
	// it started and gauges as they are now. A task that is not running
	// is FailedPrecondition; a missing one NotFound.
	Stats(ctx context.Context, id string) (Stats, error)

	// Close releases the connection. Tasks keep running.
	Close() error
}

// Image is an image held by a Runtime.
type Image struct {
	// Name is the familiar reference ("local/busybox:latest").
	Name string `json:"name"`
	// Digest is the digest of the image's target: its manifest, or its
	// index for multi-platform images. It names the image across nodes.
	Digest digest.Digest `json:"digest"`
	// Size is the size of the blobs this platform uses (as stored, that
	// is compressed where the layers are).
	Size int64 `json:"size"`
	// Created comes from the image config (so it is the same on every
	// node), or is when the image was stored here if the config has none.
	Created time.Time `json:"created"`
	// Healthcheck is the image's HEALTHCHECK, if its config has one
	// (Docker's image config; OCI's has no such field, but images built
	// by Docker or BuildKit carry it).
	Healthcheck *Healthcheck `json:"healthcheck,omitempty"`
}

// Healthcheck is a health check as Docker stores it in an image config.
type Healthcheck struct {
	// Test is [NONE], [CMD, args...] or [CMD-SHELL, command].
	Test        []string      `json:"Test"`
	Interval    time.Duration `json:"Interval,omitempty"`
	Timeout     time.Duration `json:"Timeout,omitempty"`
	StartPeriod time.Duration `json:"StartPeriod,omitempty"`
	Retries     int           `json:"Retries,omitempty"`
}

// parseImageConfig reads what Image reports from an image config's JSON:
// its creation time (zero if none) and health check.
func parseImageConfig(data []byte) (created time.Time, hc *Healthcheck, err error) {
	var cfg struct {
		Created *time.Time `json:"created"`
		Config  struct {
			Healthcheck *Healthcheck `json:"Healthcheck"`
		} `json:"config"`
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		return time.Time{}, nil, err
	}
	if cfg.Created != nil {
		created = *cfg.Created
	}
	if h := cfg.Config.Healthcheck; h != nil && len(h.Test) > 0 {
		hc = h
	}
	return created, hc, nil
}

// Mount is a bind mount of a host path into a task, or a tmpfs of its
// own.
type Mount struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"read_only,omitempty"`
	// Tmpfs mounts an empty tmpfs (no Source), world-writable with the
	// sticky bit (as /tmp is), at most SizeBytes (0: the kernel's
	// default, half the memory) and charged to the task's memory.
	Tmpfs     bool  `json:"tmpfs,omitempty"`
	SizeBytes int64 `json:"size_bytes,omitempty"`
}

// Terminal asks Exec for a pseudo-terminal: Width and Height (in
// characters; 0: the runtime's default) size it at the start, and each
// size Resize sends later resizes it, until Resize closes or the process
// exits.
type Terminal struct {
	Width, Height uint16
	Resize        <-chan TerminalSize
}

// TerminalSize is a terminal's width and height in characters.
type TerminalSize struct{ Width, Height uint16 }

// TaskSpec describes a task for Run.
type TaskSpec struct {
	// ID names the container and the task: letters, digits, '.', '_'
	// and '-', at most 76 characters, starting with a letter or digit.
	ID string `json:"id"`
	// Image is an image name or target digest (see Runtime.Image).
	Image string `json:"image"`
	// Args replace the image's Cmd (the image's Entrypoint, if any, stays
	// in front), as in `docker run IMAGE ARGS...`. Empty: the image's.
	Args []string `json:"args,omitempty"`
	// Entrypoint, if set, replaces the image's Entrypoint, and the image's
	// Cmd with it (as `docker run --entrypoint` does): the process is
	// Entrypoint followed by Args.
	Entrypoint []string `json:"entrypoint,omitempty"`
	// User runs the process as "user", "uid", "user:group" or "uid:gid"
	// (names from the image's /etc/passwd and /etc/group); empty: the
	// image's.
	User string `json:"user,omitempty"`
	// WorkDir, absolute, is the process's working directory; empty: the
	// image's.
	WorkDir string `json:"workdir,omitempty"`
	// ReadOnly mounts the container's root file system read-only (its
	// mounts keep their own modes).
	ReadOnly bool `json:"read_only,omitempty"`
	// CapAdd and CapDrop ("CAP_NET_ADMIN", or "ALL") change the default
	// capabilities of the process as Docker does: ALL added grants every
	// known one less those dropped; ALL dropped leaves only those added.
	CapAdd  []string `json:"cap_add,omitempty"`
	CapDrop []string `json:"cap_drop,omitempty"`
	// Ulimits are the process's resource limits, "NAME=SOFT[:HARD]"
	// (nofile=1024:2048, -1 unlimited); one that does not parse fails Run.
	Ulimits []string `json:"ulimits,omitempty"`
	// Sysctls are set in the container's namespaces (runc refuses those
	// that are not the container's own).
	Sysctls map[string]string `json:"sysctls,omitempty"`
	// Hosts are lines ("IP NAME") added to the /etc/hosts the runtime
	// writes.
	Hosts []string `json:"hosts,omitempty"`
	// Env (KEY=VALUE) is added to the image's environment, replacing
	// variables of the same name.
	Env []string `json:"env,omitempty"`
	// Labels are stored with the container and returned by List: Shoal's
	// task metadata (task ID, service, slot, ...). Keys starting with
	// "io.shoal.runtime/" and "io.containerd." are reserved.
	Labels map[string]string `json:"labels,omitempty"`
	// CPUMillis limits CPU time (1000 = one core) with a CFS quota; 0: no
	// limit.
	CPUMillis int64 `json:"cpu_millis,omitempty"`
	// MemoryBytes limits memory (the cgroup's limit); 0: no limit.
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// PidsLimit bounds the task's processes and threads (the pids
	// cgroup's limit); 0: no limit.
	PidsLimit int64 `json:"pids_limit,omitempty"`
	// Groups are supplementary groups of the process, beside its user's:
	// names of the image's /etc/group, or GIDs.
	Groups []string `json:"groups,omitempty"`
	// LogPath, an absolute path, receives the task's stdout and stderr,
	// appended by the runtime (containerd's shim), so logging goes on
	// while schedd restarts. Empty: output is discarded.
	LogPath string `json:"log_path,omitempty"`
	// LogBinary, an absolute path, is a program containerd's shim starts
	// for the task to take its output instead (containerd's binary
	// logging: stdout and stderr on its descriptors 3 and 4), with
	// LogArgs, each key and its value, as arguments. It runs as long as
	// the task, apart from schedd. LogPath is then only recorded.
	LogBinary string            `json:"log_binary,omitempty"`
	LogArgs   map[string]string `json:"log_args,omitempty"`
	// NetNSPath is the network namespace to join (e.g.
	// /var/run/netns/NAME); empty: the node's network namespace (that of
	// the runtime's daemon).
	NetNSPath string `json:"netns_path,omitempty"`
	// Mounts are bind mounts. A mount on /etc/hostname, /etc/hosts or
	// /etc/resolv.conf replaces the file the runtime provides.
	Mounts []Mount `json:"mounts,omitempty"`
	// Init, if set, is the host path of shoal-init: bind-mounted read-only
	// at InitPath, it runs as the task's PID 1 with the task's command as
	// its child (docker's --init).
	Init string `json:"init,omitempty"`
	// Hostname of the task (default: its ID, cut to 63 characters).
	Hostname string `json:"hostname,omitempty"`
	// StopSignal is what Stop sends first ("SIGTERM", "TERM", "15");
	// empty: the image's stop signal, else SIGTERM.
	StopSignal string `json:"stop_signal,omitempty"`
}

// Status is the state of a task.
type Status string

// The states of a task.
const (
	// StatusCreated: the container exists but its task was never
	// started (a Run interrupted half-way); Remove it.
	StatusCreated Status = "created"
	StatusRunning Status = "running"
	// StatusStopped: the task has exited; ExitCode and ExitedAt say how.
	StatusStopped Status = "stopped"
	StatusPaused  Status = "paused"
	StatusUnknown Status = "unknown"
)

// TaskInfo describes a task, as List returns it.
type TaskInfo struct {
	ID string `json:"id"`
	// Image is the image the task runs (familiar name).
	Image string `json:"image"`
	// Labels are TaskSpec.Labels.
	Labels  map[string]string `json:"labels,omitempty"`
	Status  Status            `json:"status"`
	Pid     uint32            `json:"pid,omitempty"`
	LogPath string            `json:"log_path,omitempty"`
	// CreatedAt is when the container was created; StartedAt when its
	// process started (running tasks only; zero when unknown).
	CreatedAt time.Time `json:"created_at"`
	StartedAt time.Time `json:"started_at,omitzero"`
	// ExitCode and ExitedAt are set for stopped tasks. A task killed by
	// signal N exits with 128+N.
	ExitCode int       `json:"exit_code"`
	ExitedAt time.Time `json:"exited_at,omitzero"`
}

// Stats is one sample of a running task's resource use, as docker stats
// shows it. The counters grow from the task's start; rates (CPU %, bytes a
// second) come from two samples.
type Stats struct {
	// Time is when the sample was taken.
	Time time.Time `json:"time"`
	// CPUNanos is the CPU time the task's processes used, user and system.
	CPUNanos uint64 `json:"cpu_nanos"`
	// MemoryBytes is the memory the task uses, less its inactive page
	// cache (what the kernel reclaims first), as docker stats counts it.
	MemoryBytes uint64 `json:"memory_bytes"`
	// MemoryLimitBytes is the task's memory limit; 0 when it has none.
	MemoryLimitBytes uint64 `json:"memory_limit_bytes,omitempty"`
	// Pids is how many processes and threads the task has.
	Pids uint64 `json:"pids"`
	// NetRxBytes and NetTxBytes are what the task's network namespace
	// received and sent on its interfaces other than loopback; 0 for a
	// task in the node's own namespace.
	NetRxBytes uint64 `json:"net_rx_bytes"`
	NetTxBytes uint64 `json:"net_tx_bytes"`
	// BlockReadBytes and BlockWriteBytes are the task's block device I/O.
	BlockReadBytes  uint64 `json:"block_read_bytes"`
	BlockWriteBytes uint64 `json:"block_write_bytes"`
}

// Exit is how a task (or an exec'd process) ended.
type Exit struct {
	// Code is the exit status, 128+N for death by signal N, -1 when
	// unknown.
	Code     int       `json:"code"`
	ExitedAt time.Time `json:"exited_at,omitzero"`
	// Err is set, on a Wait channel only, when waiting failed rather than
	// the task exiting.
	Err error `json:"-"`
}

// BlobTTL is how long a blob written by WriteBlob is kept without a
// CreateImage that uses it.
const BlobTTL = time.Hour

// Reserved label prefixes (see TaskSpec.Labels).
const (
	labelPrefix          = "io.shoal.runtime/"
	containerdLabelsFrom = "io.containerd."
)

// PullOptions tune Runtime.Pull.
type PullOptions struct {
	// PlainHTTP lists registries reached over http rather than https (a
	// registry on a private network): hosts with or without a port, or
	// CIDRs holding their addresses, as Docker's insecure-registries.
	PlainHTTP []string
	// Auth, if set, gives the user name and password (or token) for a
	// registry host ("name[:port]") that asks for them; empty: none.
	Auth func(host string) (user, secret string, err error)
}
