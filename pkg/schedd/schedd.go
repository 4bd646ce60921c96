// Package schedd wires shoal-schedd: services and tasks on containerd,
// scheduled without a master (docs/SCHEDULING.md).
//
// The decisions are pkg/sched's pure functions; this package executes
// them. Every node runs the same loop: it mirrors the scheduler's
// documents from statd, reconciles the services it owns (rendezvous
// hashing over the live members statd reports) by reserving slots on
// target nodes over mutual TLS, and runs its own agent, which starts,
// restarts, health-checks and stops the tasks this node accepted. Task
// documents are written only by the node that runs them; slot documents
// only by owners. schedd keeps each accepted task's spec on disk and finds
// its containers in containerd by label, so a restart re-adopts every
// container without touching it.
package schedd

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/spf13/pflag"

	"github.com/shoal-dev/shoal/pkg/client"
	"github.com/shoal-dev/shoal/pkg/daemon"
	"github.com/shoal-dev/shoal/pkg/meminfo"
	"github.com/shoal-dev/shoal/pkg/peerauth"
	shoalrt "github.com/shoal-dev/shoal/pkg/runtime"
	"github.com/shoal-dev/shoal/pkg/sched"
	"github.com/shoal-dev/shoal/pkg/tasklog"
	schedv1 "github.com/shoal-dev/shoal/proto/shoal/sched/v1"
	volv1 "github.com/shoal-dev/shoal/proto/shoal/vol/v1"
)

// Config is shoal-schedd's configuration (/etc/shoal/schedd.toml).
type Config struct {
	daemon.Common
	// Containerd is the containerd socket; Namespace, RuncRoot and
	// CgroupParent keep this node's containers apart from others'.
	Containerd   string `toml:"containerd"`
	Namespace    string `toml:"namespace"`
	RuncRoot     string `toml:"runc_root"`
	CgroupParent string `toml:"cgroup_parent"`
	// PeerPort is the TCP port of the mutual-TLS scheduler peer API; it
	// must be the same on every node.
	PeerPort uint32 `toml:"peer_port"`
	// InsecureRegistries are registries pulled from over plain http (a
	// registry on a private network without TLS): host[:port] or a CIDR.
	InsecureRegistries []string `toml:"insecure_registries"`
	// RegistryAuth is a file of registry credentials in the format
	// `docker login` writes (~/.docker/config.json's "auths"), read at
	// each pull; missing: anonymous pulls.
	RegistryAuth string `toml:"registry_auth"`
	// CPUMillis and MemoryBytes are the capacity offered to tasks (default:
	// the machine's CPUs and memory less a reserve for the system).
	CPUMillis   int64 `toml:"cpu_millis"`
	MemoryBytes int64 `toml:"memory_bytes"`
	// Tick is the reconcile interval (changes also trigger a round).
	Tick daemon.Duration `toml:"tick"`
	// ReservationTTL is how long a reservation waits for its slot.
	ReservationTTL daemon.Duration `toml:"reservation_ttl"`
	// Logger is shoal-logger, which containerd's shim starts beside each
	// task to write its output to the task's log, each line stamped with
	// its time and stream, rotated at LogMaxSize with LogMaxFiles files
	// kept (the current one included). Default: shoal-logger beside this
	// binary; "none", or none there: the shim appends the output to the
	// log as it comes (no times, no rotation), as schedds before it did.
	Logger      string      `toml:"logger"`
	LogMaxSize  daemon.Size `toml:"log_max_size"`
	LogMaxFiles int         `toml:"log_max_files"`
	// TaskNetwork is netd (a namespace per task from shoal-netd) or host
	// (every task in the node's namespace, for nodes without netd).
	TaskNetwork string `toml:"task_network"`
}

// besideSchedd returns the path of program name installed beside this
// binary (as make install and the packages put shoal-logger and
// shoal-init), or an error saying it is not there.
func besideSchedd(name string) (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	p := filepath.Join(filepath.Dir(exe), name)
	if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("%s is not installed beside %s: %w", name, exe, errdefs.ErrFailedPrecondition)
	}
	return p, nil
}

// taskLogger resolves Config.Logger: the binary's absolute path, or ""
// for raw logs.
func (c *Config) taskLogger() (string, error) {
	switch c.Logger {
	case "none":
		return "", nil
	case "":
		p, err := besideSchedd("shoal-logger")
		if err != nil {
			return "", nil // raw logs
		}
		return p, nil
	}
	if !filepath.IsAbs(c.Logger) {
		return "", fmt.Errorf("logger %q: want an absolute path, or none", c.Logger)
	}
	if st, err := os.Stat(c.Logger); err != nil {
		return "", fmt.Errorf("logger: %w", err)
	} else if st.IsDir() || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("logger %s is not an executable file", c.Logger)
	}
	return c.Logger, nil
}

// DefaultPeerPort is the scheduler peer API's default port.
const DefaultPeerPort = 7471

// Spec describes shoal-schedd to the daemon runtime.
func Spec() daemon.Spec {
	return daemon.Spec{
		Name:  "schedd",
		Short: "Shoal scheduler daemon: services and tasks on containerd",
		Long: `shoal-schedd runs services without a master: the live node that owns a
service (rendezvous hashing) places its tasks by reserving capacity on
target nodes, each of which decides atomically against its own capacity
and runs the task on containerd. It serves the shoal.sched.v1 API on
<run-dir>/schedd.sock and needs shoal-statd on the same node.`,
		MetricsPort: 9462,
		Config: func(c daemon.Common) daemon.Configurable {
			return &Config{
				Common:         c,
				Containerd:     "/run/containerd/containerd.sock",
				Namespace:      "shoal",
				PeerPort:       DefaultPeerPort,
				Tick:           daemon.Duration(250 * time.Millisecond),
				ReservationTTL: daemon.Duration(sched.DefaultTTL),
				TaskNetwork:    "netd",
				RegistryAuth:   "/etc/shoal/registry-auth.json",
				LogMaxSize:     daemon.Size(tasklog.DefaultLimits.MaxSize),
				LogMaxFiles:    tasklog.DefaultLimits.MaxFiles,
			}
		},
		Flags: func(fs *pflag.FlagSet, cfg any) {
			c := cfg.(*Config)
			fs.StringVar(&c.Containerd, "containerd", c.Containerd, "containerd socket")
			fs.StringVar(&c.Namespace, "namespace", c.Namespace, "containerd namespace for this node's images and containers")
			fs.StringVar(&c.RuncRoot, "runc-root", c.RuncRoot, "runc state directory (distinct per node when nodes share a machine)")
			fs.StringVar(&c.CgroupParent, "cgroup-parent", c.CgroupParent, "cgroup parent of the containers (default /<namespace>)")
			fs.Uint32Var(&c.PeerPort, "peer-port", c.PeerPort, "TCP port of the scheduler peer API")
			fs.StringVar(&c.RegistryAuth, "registry-auth", c.RegistryAuth, "file of registry credentials in the format docker login writes (~/.docker/config.json), read at each pull")
			fs.StringSliceVar(&c.InsecureRegistries, "insecure-registry", c.InsecureRegistries, "registry host[:port] or CIDR to pull images from over plain http (repeatable)")
			fs.Int64Var(&c.CPUMillis, "cpu-millis", c.CPUMillis, "CPU offered to tasks in millicores (default: all CPUs)")
			fs.Int64Var(&c.MemoryBytes, "memory-bytes", c.MemoryBytes, "memory offered to tasks in bytes (default: 90% of RAM)")
			fs.Var(&c.Tick, "tick", "reconcile interval")
			fs.Var(&c.ReservationTTL, "reservation-ttl", "how long a reservation waits for its slot document")
			fs.StringVar(&c.Logger, "logger", c.Logger, "shoal-logger binary for task logs (default: beside shoal-schedd; none: raw logs)")
			fs.Var(&c.LogMaxSize, "log-max-size", "rotate a task's log at this size")
			fs.IntVar(&c.LogMaxFiles, "log-max-files", c.LogMaxFiles, "files of a task's log kept, the current one included")
			fs.StringVar(&c.TaskNetwork, "task-network", c.TaskNetwork, "netd: a network namespace per task from shoal-netd; host: tasks share the node's")
		},
		Start: start,
	}
}

// Main runs shoal-schedd.
func Main(args []string) int { return daemon.Main(Spec(), args) }

// node is one schedd.
type node struct {
	cfg   *Config
	log   *slog.Logger
	rt    shoalrt.Runtime
	statd *client.Statd
	netd  *client.Netd
	vold  volv1.VolumesClient
	// releases tells vold of tasks that no longer use a volume.
	releases *volumeReleases
	// replicas are the nodes holding the volumes that owned services
	// mount, for placement (near.go).
	replicas volumeReplicas

	// Set once the node is in a cluster (identity from statd).
	id       string
	ready    chan struct{}
	identity peerauth.Identity
	mirror   *client.Mirror
	peers    *peerPool
	ledger   *sched.Ledger
	alive    atomic.Pointer[[]string]
	// rejoined is when statd last reported a dead member alive again
	// (Unix nanoseconds; 0: never): sched.Snapshot.Rejoined.
	rejoined atomic.Int64
	capacity sched.Resources

	kick chan struct{}
	// dropFailed is when the loop last failed to drop a removed image,
	// by document key (image_remove.go; the loop's alone).
	dropFailed map[string]time.Time

	// Reserve counters, for `daemon status` and metrics: what this node
	// asked as an owner, and what it answered as a target (the two
	// owners of a race show up as rejects).
	reservesSent, reservesAccepted, reservesRejected atomic.Int64

	// Owner side (guarded by omu).
	omu      sync.Mutex
	inflight map[string]map[string]sched.InFlight // service -> slot
	accepted map[string]string                    // service/slot -> task ID accepted, slot not yet seen
	observed map[string]sched.Observation         // node -> free capacity a Reserve answer reported
	unsched  map[string]map[string]string         // service -> slot -> reason

	// logger is the shoal-logger binary that writes task logs ("": the
	// shim appends them raw), logLimits its rotation.
	logger    string
	logLimits tasklog.Limits

	// Agent side (guarded by amu).
	amu   sync.Mutex
	local map[string]*localTask
}

func start(ctx context.Context, rt *daemon.Runtime) (func(context.Context) error, error) {
	cfg := rt.Config.(*Config)
	for _, d := range []string{"tasks", "logs", "runtime", "images"} {
		if err := os.MkdirAll(filepath.Join(cfg.StateDir, d), 0o700); err != nil {
			return nil, err
		}
	}
	cr, err := shoalrt.NewContainerd(shoalrt.Config{
		Address:      cfg.Containerd,
		Namespace:    cfg.Namespace,
		RuncRoot:     cfg.RuncRoot,
		CgroupParent: cfg.CgroupParent,
		StateDir:     filepath.Join(cfg.StateDir, "runtime"),
		Logger:       rt.Log.With("component", "runtime"),
	})
	if err != nil {
		return nil, err
	}
	if cfg.TaskNetwork != "netd" && cfg.TaskNetwork != "host" {
		cr.Close()
		return nil, fmt.Errorf("task_network %q: want netd or host", cfg.TaskNetwork)
	}
	logLimits := tasklog.Limits{MaxSize: int64(cfg.LogMaxSize), MaxFiles: cfg.LogMaxFiles}
	if err := logLimits.Check(); err != nil {
		cr.Close()
		return nil, err
	}
	logger, err := cfg.taskLogger()
	if err != nil {
		cr.Close()
		return nil, err
	}
	if logger == "" {
		rt.Log.Warn("no shoal-logger: task logs are kept as printed, without times or rotation", "logger", cfg.Logger)
	}
	st, err := client.NewStatd(cfg.RunDir, client.Retry{})
	if err != nil {
		cr.Close()
		return nil, err
	}
	nd, err := client.NewNetd(cfg.RunDir, client.Retry{Attempts: 2})
	if err != nil {
		cr.Close()
		return nil, err
	}
	// Volumes are mounted by shoal-vold; a task that names one waits (and
	// retries) while vold is away, like a task waiting for its network.
	vc, err := client.Dial(cfg.RunDir, "vold", client.Retry{Attempts: 3})
	if err != nil {
		cr.Close()
		return nil, err
	}
	n := &node{
		cfg: cfg, log: rt.Log, rt: cr, statd: st, netd: nd, vold: volv1.NewVolumesClient(vc),
		ready: make(chan struct{}), kick: make(chan struct{}, 1), dropFailed: map[string]time.Time{},
		inflight: map[string]map[string]sched.InFlight{},
		accepted: map[string]string{},
		observed: map[string]sched.Observation{},
		unsched:  map[string]map[string]string{},
		local:    map[string]*localTask{},
		logger:   logger, logLimits: logLimits,
	}
	n.releases = &volumeReleases{vold: n.vold, log: rt.Log.With("component", "volumes"), path: filepath.Join(cfg.StateDir, "volume-releases.json")}
	if err := n.releases.load(); err != nil {
		// Kept for an operator to look at: overwritten only once a
		// release is pending again.
		rt.Log.Warn("pending volume releases not loaded", "err", err)
	}
	n.capacity = cfg.capacity()
	n.ledger = sched.NewLedger(n.capacity, time.Duration(cfg.ReservationTTL))
	schedv1.RegisterSchedulerServer(rt.GRPC, &api{n: n})
	rt.Details = n.details
	rt.Metrics.MustRegister(newCollector(n))
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := n.run(runCtx); err != nil && runCtx.Err() == nil {
			rt.Fatal(err)
		}
	}()
	return func(ctx context.Context) error {
		cancel()
		wg.Wait()
		if daemon.SystemStopping(ctx) {
			n.stopForShutdown()
		}
		st.Close()
		nd.Close()
		vc.Close()
		return cr.Close()
	}, nil
}

// capacity is what this node offers: configured, or the machine less a
// reserve for the system and the daemons.
func (c *Config) capacity() sched.Resources {
	r := sched.Resources{CPUMillis: c.CPUMillis, MemoryBytes: c.MemoryBytes}
	if r.CPUMillis == 0 {
		r.CPUMillis = int64(runtime.NumCPU()) * 1000
	}
	if r.MemoryBytes == 0 {
		r.MemoryBytes = meminfo.Total() / 10 * 9
	}
	return r
}

// wake asks the loop for a round now.
func (n *node) wake() {
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// isReady reports whether the node has joined a cluster and loaded state.
func (n *node) isReady() bool {
	select {
	case <-n.ready:
		return true
	default:
		return false
	}
}

// nodeID is n.id for readers off the scheduling loop: empty until the
// node is ready (the loop sets n.id before it closes ready).
func (n *node) nodeID() string {
	if !n.isReady() {
		return ""
	}
	return n.id
}

var errNotReady = fmt.Errorf("this node's scheduler is not ready: is it in a cluster (`shoalctl cluster status`)? %w", errUnavailable)

// details are the node's figures for `shoalctl daemon status` (and tests
// that watch the ledger): capacity, what is reserved, tasks, and whether
// the scheduler is ready. The socket serves (and health says SERVING) as
// soon as the process starts; scheduler_ready says the node found its
// cluster, caught up with state and re-adopted its tasks and containers.
func (n *node) details() map[string]string {
	used, capa := n.ledger.Usage(), n.ledger.Capacity()
	n.amu.Lock()
	tasks := len(n.local)
	n.amu.Unlock()
	return map[string]string{
		"node_id":           n.nodeID(),
		"scheduler_ready":   strconv.FormatBool(n.isReady()),
		"tasks":             strconv.Itoa(tasks),
		"reserves_sent":     strconv.FormatInt(n.reservesSent.Load(), 10),
		"reserves_accepted": strconv.FormatInt(n.reservesAccepted.Load(), 10),
		"reserves_rejected": strconv.FormatInt(n.reservesRejected.Load(), 10),
		"reserved_cpu":      strconv.FormatInt(used.CPUMillis, 10),
		"reserved_memory":   strconv.FormatInt(used.MemoryBytes, 10),
		"capacity_cpu":      strconv.FormatInt(capa.CPUMillis, 10),
		"capacity_memory":   strconv.FormatInt(capa.MemoryBytes, 10),
	}
}

// ownsAll is a fault-injection hook for tests: while the file
// <state-dir>/debug-own-all exists, this node reconciles every service as
// if it owned it, so owners disagree on purpose.
func (n *node) ownsAll() bool {
	_, err := os.Stat(filepath.Join(n.cfg.StateDir, "debug-own-all"))
	return err == nil
}

// specUsers lists, sorted, the services whose spec, or the previous spec
// a rollback returns to, satisfies uses: what removing an image, secret
// or config would take from them.
func (n *node) specUsers(uses func(sched.ServiceSpec) bool) []string {
	w := n.readWorld()
	var users []string
	for _, name := range sortedKeys(w.services) {
		svc := w.services[name]
		if uses(svc.Spec) || (svc.PrevSpec != nil && uses(*svc.PrevSpec)) {
			users = append(users, name)
		}
	}
	return users
}

// until calls done every interval until it returns true (true), ctx ends
// or within has passed (false): a wait for something another node is
// sending this one.
func until(ctx context.Context, within, interval time.Duration, done func() bool) bool {
	deadline := time.Now().Add(within)
	for {
		if done() {
			return true
		}
		wait := min(interval, time.Until(deadline))
		if wait <= 0 {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
	}
}
