package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/identifiers"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/platforms"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/status"
)

// Defaults of a Config.
const (
	DefaultSnapshotter = "overlayfs"
	DefaultRuntime     = "io.containerd.runc.v2"
)

// Config configures a Containerd runtime.
type Config struct {
	// Address is containerd's gRPC socket (e.g. /run/containerd/containerd.sock).
	Address string
	// Namespace is the containerd namespace holding this node's images
	// and containers. Required.
	Namespace string
	// RuncRoot is runc's state directory for this node's containers (runc
	// options Root; the shim adds /<namespace>). Empty: runc's default,
	// /run/containerd/runc. NB: containerd 1.6 keeps runc state there
	// whatever its --root and --state say, so two containerds on one
	// machine must differ in Namespace or RuncRoot, or their containers
	// collide.
	RuncRoot string
	// CgroupParent is the cgroup under which containers get cgroups
	// <CgroupParent>/<id> (cgroupfs paths, e.g. "/shoal-node1"). Empty:
	// "/" + Namespace.
	CgroupParent string
	// Snapshotter unpacks images and makes root file systems (default
	// "overlayfs").
	Snapshotter string
	// Runtime is containerd's runtime (shim) name (default
	// io.containerd.runc.v2).
	Runtime string
	// StateDir holds the runtime's own per-task files (each task's
	// /etc/hostname, /etc/hosts and /etc/resolv.conf) and the FIFOs of
	// exec sessions. Required.
	StateDir string
	// DialTimeout bounds how long a call waits for containerd to become
	// reachable before failing with Unavailable (default 2s).
	DialTimeout time.Duration
	// Logger receives the runtime's logs (nil: none).
	Logger *slog.Logger
}

// Containerd is the Runtime backed by a containerd daemon, through its Go
// client. Everything it makes lives in Config.Namespace.
type Containerd struct {
	cfg      Config
	client   *client.Client
	log      *slog.Logger
	platform platforms.MatchComparer
}

var _ Runtime = (*Containerd)(nil)

// NewContainerd returns a runtime using the containerd at cfg.Address. It
// does not wait for containerd: calls fail with Unavailable while it is
// unreachable and work once it is back.
func NewContainerd(cfg Config) (*Containerd, error) {
	if cfg.Address == "" {
		return nil, fmt.Errorf("containerd runtime: no address: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.Namespace == "" {
		return nil, fmt.Errorf("containerd runtime: no namespace: %w", errdefs.ErrInvalidArgument)
	}
	if err := identifiers.Validate(cfg.Namespace); err != nil {
		return nil, fmt.Errorf("containerd runtime: %w", err)
	}
	if cfg.StateDir == "" {
		return nil, fmt.Errorf("containerd runtime: no state dir: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.RuncRoot != "" && !filepath.IsAbs(cfg.RuncRoot) {
		return nil, fmt.Errorf("containerd runtime: runc root %q is not absolute: %w", cfg.RuncRoot, errdefs.ErrInvalidArgument)
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "/" + cfg.Namespace
	}
	if !filepath.IsAbs(cfg.CgroupParent) {
		return nil, fmt.Errorf("containerd runtime: cgroup parent %q must start with /: %w", cfg.CgroupParent, errdefs.ErrInvalidArgument)
	}
	if cfg.Snapshotter == "" {
		cfg.Snapshotter = DefaultSnapshotter
	}
	if cfg.Runtime == "" {
		cfg.Runtime = DefaultRuntime
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	abs, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	cfg.StateDir = abs
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("containerd runtime: %w", err)
	}
	c, err := client.New(cfg.Address,
		client.WithDefaultNamespace(cfg.Namespace),
		client.WithDefaultRuntime(cfg.Runtime),
		client.WithTimeout(cfg.DialTimeout),
		// NB: containerd is a local socket: reconnect within a fraction of
		// a second of its restart, not after gRPC's default backoff (up to
		// DialTimeout). Calls in between fail fast with Unavailable.
		client.WithExtraDialOpts([]grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond},
			MinConnectTimeout: cfg.DialTimeout,
		})}),
	)
	if err != nil {
		return nil, fmt.Errorf("containerd runtime: %w", classify(err))
	}
	return &Containerd{
		cfg:      cfg,
		client:   c,
		log:      cfg.Logger.With("namespace", cfg.Namespace),
		platform: platforms.Default(),
	}, nil
}

// Config returns the configuration, defaults filled in.
func (r *Containerd) Config() Config { return r.cfg }

// Client returns the containerd client, for what the Runtime interface
// does not cover (tests, diagnostics). Calls need the namespace in ctx
// (WithNamespace).
func (r *Containerd) Client() *client.Client { return r.client }

// WithNamespace returns ctx with the runtime's containerd namespace.
func (r *Containerd) WithNamespace(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, r.cfg.Namespace)
}

// Close closes the connection to containerd. Tasks keep running.
func (r *Containerd) Close() error { return r.client.Close() }

// classify makes sure err carries an errdefs class: gRPC statuses are
// mapped (Unavailable when containerd is down); errors already classified
// and context errors are left alone.
func classify(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if _, ok := status.FromError(err); ok {
		return errgrpc.ToNative(err)
	}
	return err
}

// wrapf returns err, classified, with context in front.
func wrapf(err error, format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), classify(err))
}
