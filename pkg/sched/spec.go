package sched

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	capability "github.com/containerd/containerd/v2/pkg/cap"
	units "github.com/docker/go-units"
	"github.com/moby/sys/signal"
	"github.com/robfig/cron/v3"

	"github.com/shoal-dev/shoal/pkg/secret"
)

// ServiceSpec is what a user asks for: the JSON document stored in field
// `spec` of /services/<name>. Zero values mean "default" wherever a default
// exists (see WithDefaults); Validate says what is wrong with a spec in
// words a CLI user can act on.
type ServiceSpec struct {
	Name  string   `json:"name"`
	Image string   `json:"image"`
	Args  []string `json:"args,omitempty"`
	// Entrypoint replaces the image's entrypoint, and its default
	// command with it: the task runs Entrypoint then Args.
	Entrypoint []string `json:"entrypoint,omitempty"`
	// User is "user", "uid", "user:group" or "uid:gid" (default: the
	// image's); WorkDir an absolute directory (default: the image's).
	User    string `json:"user,omitempty"`
	WorkDir string `json:"workdir,omitempty"`
	// ReadOnly mounts the task's root file system read-only.
	ReadOnly bool `json:"read_only,omitempty"`
	// Init runs shoal-init as the task's PID 1, the command its child:
	// signals reach a command that installs no handlers, and orphans are
	// reaped (docker's --init).
	Init bool `json:"init,omitempty"`
	// CapAdd and CapDrop change the capabilities a task's process gets
	// from the default set (Docker's: CHOWN, NET_BIND_SERVICE, KILL, …):
	// names as capabilities(7) has them, with or without CAP_, or ALL
	// (see Capability).
	CapAdd  []string `json:"cap_add,omitempty"`
	CapDrop []string `json:"cap_drop,omitempty"`
	// Ulimits are the process's resource limits, "NAME=SOFT[:HARD]" as
	// Docker's --ulimit takes them (nofile=1024:2048; -1 is unlimited).
	Ulimits []string `json:"ulimits,omitempty"`
	// Groups are supplementary groups of the task's process, names (of
	// the image's /etc/group) or GIDs, beside those of its user.
	Groups []string `json:"groups,omitempty"`
	// Sysctls are kernel parameters of the task's own namespaces (see
	// CheckSysctl), set when it starts.
	Sysctls map[string]string `json:"sysctls,omitempty"`
	// Hosts are lines added to the task's /etc/hosts, "HOST:IP" as
	// Docker's --host takes them (see ParseHost).
	Hosts []string `json:"hosts,omitempty"`
	// Env holds KEY=VALUE entries, in order.
	Env []string `json:"env,omitempty"`

	// Replicas is the number of slots of a replicated service (0 is a
	// valid scale). A Global service has one slot per eligible node and
	// must leave Replicas at 0.
	Replicas int  `json:"replicas"`
	Global   bool `json:"global,omitempty"`
	// Job makes the service a job (Swarm's replicated-job, or global-job
	// with Global): each slot runs its task to completion once, and a
	// task that exits 0 is complete, not replaced. Replicas is then the
	// number of completions; an update (or --force) runs the job again.
	// The restart policy defaults to on-failure and may not be always.
	Job bool `json:"job,omitempty"`
	// MaxConcurrent, if above 0, bounds how many of a replicated job's
	// slots run at once (Swarm's --max-concurrent); the others start as
	// those complete or fail for good.
	MaxConcurrent int `json:"max_concurrent,omitempty"`
	// Schedule makes a job run at the times it names (a cron
	// expression, "@hourly", "@every 30m"; UTC unless it starts with
	// CRON_TZ=): not at its creation, and each time again. A run that
	// comes while a slot's task of the previous run still runs starts in
	// that slot once the task finishes. An update applies from the next
	// run.
	Schedule string `json:"schedule,omitempty"`

	// CPUMillis and MemoryBytes are both the reservation placement counts
	// against a node's capacity and the limit the runtime enforces.
	CPUMillis   int64 `json:"cpu_millis,omitempty"`
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// PidsLimit bounds the processes and threads of a task (its pids
	// cgroup), against fork bombs; 0: no bound. Not a reservation.
	PidsLimit int64 `json:"pids_limit,omitempty"`

	// Constraints must all hold on a node for it to run a task, e.g.
	// "node.labels.zone==eu" (see ParseConstraint).
	Constraints []string `json:"constraints,omitempty"`
	// Placement is the scoring strategy: spread (default) or binpack.
	Placement Strategy `json:"placement,omitempty"`
	// Preferences spread the tasks evenly over the values of node
	// labels before the strategy picks among nodes, the first the
	// strongest: "spread=node.labels.zone" (Swarm's --placement-pref).
	// Nodes without the label are one more value.
	Preferences []string `json:"placement_prefs,omitempty"`
	// MaxPerNode, if above 0, bounds a replicated service's tasks on any
	// one node (Swarm's --replicas-max-per-node): slots beyond what the
	// eligible nodes can take stay unschedulable.
	MaxPerNode int `json:"max_per_node,omitempty"`

	Restart RestartPolicy `json:"restart,omitzero"`
	Health  HealthCheck   `json:"health,omitzero"`
	Update  UpdateConfig  `json:"update,omitzero"`
	// Rollback, when set, is how a rollback walks back to the previous
	// spec (Swarm's rollback_config): its parallelism, delay, order,
	// monitor and max failure ratio; a rollback that fails pauses. Unset:
	// the update's settings walk back.
	Rollback *UpdateConfig `json:"rollback,omitempty"`
	// StopGrace is how long a stop waits after SIGTERM before SIGKILL.
	StopGrace Duration `json:"stop_grace,omitempty"`
	// StopSignal is sent first instead of the image's stop signal (or
	// SIGTERM): "SIGQUIT", "QUIT" or "3".
	StopSignal string `json:"stop_signal,omitempty"`

	Labels map[string]string `json:"labels,omitempty"`
	Ports  []Port            `json:"ports,omitempty"`
	// Volumes are replicated volumes to mount, as "NAME:/path[:ro]" (see
	// ParseVolume): the task's node asks shoal-vold to mount each one and
	// bind-mounts it into the container.
	Volumes []string `json:"volumes,omitempty"`
	// Secrets are cluster secrets to hand to each task as a read-only
	// file, as "NAME" or "NAME:TARGET" (see ParseSecret).
	Secrets []string `json:"secrets,omitempty"`
	// Configs are cluster configs, handed to each task alike (see
	// ParseConfig).
	Configs []string `json:"configs,omitempty"`
	// Binds are the node's own files or directories to bind-mount into
	// each task, as "/host/path:/path[:ro]" (see ParseBind): they must
	// exist on whichever node runs it (a global service's /proc, say).
	Binds []string `json:"binds,omitempty"`
	// Tmpfs are empty tmpfs mounts of each task, as "/path" or
	// "/path:SIZE" (see ParseTmpfs): scratch space, which a read-only
	// root needs.
	Tmpfs []string `json:"tmpfs,omitempty"`
	// Hostname is the tasks' hostname (default: service-slot), a
	// template like their environment's values (TemplateContext).
	Hostname string `json:"hostname,omitempty"`
	// Log chooses what becomes of a task's output (Docker's --log-driver
	// and --log-opt).
	Log LogConfig `json:"log,omitzero"`
	// Stack is the stack (shoalctl stack deploy) the service belongs to,
	// "" for none. A stack's service is named <stack>-<name> and also
	// answers DNS as <name>.<stack>.shoal, which its stack's tasks reach
	// by <name> alone, as in a Compose file (see StackAlias).
	Stack string `json:"stack,omitempty"`
	// Network is "" (the overlay: a namespace per task from netd) or
	// "host" (the node's own namespace).
	Network string `json:"network,omitempty"`
	// Networks name the overlay networks the tasks are on (none: the
	// default network, DefaultNetwork). Two tasks reach each other
	// over the overlay only if their services share one; the nodes and
	// published ports reach every task. A network exists while a
	// service names it. Not with Network host.
	Networks []string `json:"networks,omitempty"`
	// Aliases are, per network the service is on, more names it answers
	// DNS by there, and only there (Compose's networks.<name>.aliases,
	// `--network name=NET,alias=NAME`): <alias>.shoal, or for a stack's
	// service <alias>.<stack>.shoal, which its stack's tasks reach by
	// <alias> alone.
	Aliases map[string][]string `json:"aliases,omitempty"`
	// Internal names networks of the service's that are internal, as
	// Docker's `network create --internal` and Compose's internal: a
	// task on internal networks only reaches nothing outside the overlay
	// (but its node's DNS). A network is internal if any service on it
	// says so (`--network name=NET,internal`).
	Internal []string `json:"internal_networks,omitempty"`

	// ForceUpdate changes the spec (and so its digest) without changing
	// anything else: `service update --force` increments it to replace
	// every task.
	ForceUpdate uint64 `json:"force_update,omitempty"`
}

// NetworkHost keeps a service's tasks in their node's network namespace.
const NetworkHost = "host"

// DefaultNetwork is the overlay network of services that name none.
const DefaultNetwork = "default"

// networkNameRE is Docker's network name syntax, dots and underscores
// included (a stack's networks are <stack>_<name>).
var networkNameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)

// OnNetworks returns the overlay networks the spec's tasks are on: its
// Networks, or DefaultNetwork; none for a host-network spec.
func (s ServiceSpec) OnNetworks() []string {
	switch {
	case s.Network == NetworkHost:
		return nil
	case len(s.Networks) == 0:
		return []string{DefaultNetwork}
	}
	return s.Networks
}

// Strategy is a placement scoring strategy.
type Strategy string

// Placement strategies.
const (
	// Spread prefers nodes with fewer tasks of the service, then nodes
	// with more free resources.
	Spread Strategy = "spread"
	// Binpack prefers the node with the least free resources that still
	// fits, keeping other nodes empty.
	Binpack Strategy = "binpack"
)

// RestartPolicy says when a node restarts a task's container in place (a
// failing one at most InPlaceRestarts times; then the task moves).
type RestartPolicy struct {
	// Policy is always (default), on-failure or never.
	Policy RestartCondition `json:"policy,omitempty"`
	// MaxAttempts bounds the restarts of a slot (0: unlimited). A
	// replacement task inherits the count of the task it replaces.
	MaxAttempts int `json:"max_attempts,omitempty"`
	// Delay is the first backoff (default 1s); it doubles on every
	// restart up to MaxDelay (default 30s).
	Delay    Duration `json:"delay,omitempty"`
	MaxDelay Duration `json:"max_delay,omitempty"`
	// Window, with MaxAttempts, counts only the restarts within it
	// before a failure (Swarm's --restart-window, Compose's
	// restart_policy.window): a slot that fails now and then restarts
	// for ever, one that fails MaxAttempts times within it stops.
	Window Duration `json:"window,omitempty"`
}

// windowed reports whether p counts restarts within a window, for which
// tasks keep their restarts' times (Task.RestartTimes).
func (p RestartPolicy) windowed() bool { return p.MaxAttempts > 0 && p.Window > 0 }

// Allows reports whether p allows one more restart of a slot that failed
// at at, after restarts restarts in all, made at times (as far as the
// window goes back).
func (p RestartPolicy) Allows(restarts int, times []time.Time, at time.Time) bool {
	switch {
	case p.MaxAttempts == 0:
		return true
	case p.Window == 0:
		return restarts < p.MaxAttempts
	}
	within := 0
	for _, t := range times {
		if at.Sub(t) < p.Window.D() {
			within++
		}
	}
	return within < p.MaxAttempts
}

// track returns times with a restart at at added, less those the window
// no longer holds; nil unless p counts within a window.
func (p RestartPolicy) track(times []time.Time, at time.Time) []time.Time {
	if !p.windowed() {
		return nil
	}
	out := []time.Time{}
	for _, t := range times {
		if at.Sub(t) < p.Window.D() {
			out = append(out, t)
		}
	}
	return append(out, at)
}

// RestartCondition is when to restart.
type RestartCondition string

// Restart conditions.
const (
	RestartAlways    RestartCondition = "always"
	RestartOnFailure RestartCondition = "on-failure"
	RestartNever     RestartCondition = "never"
)

// HealthCheck is a command run inside the container (exit status 0 is
// healthy), an HTTP GET (a status from 200 to 399 is healthy) or a TCP
// connection to the task, made by its node. None of the three means no
// health check: a task is running as soon as its container is.
type HealthCheck struct {
	Cmd []string `json:"cmd,omitempty"`
	// HTTP is "PORT" or "PORT/PATH": the node GETs http://ADDR:PORT/PATH,
	// ADDR the task's overlay address (127.0.0.1 for a task in its
	// node's network namespace).
	HTTP string `json:"http,omitempty"`
	// TCP is a port the node connects to at the same address.
	TCP      int      `json:"tcp,omitempty"`
	Interval Duration `json:"interval,omitempty"` // default 30s
	Timeout  Duration `json:"timeout,omitempty"`  // default 30s
	// Retries is how many consecutive failures make a task unhealthy
	// (default 3).
	Retries int `json:"retries,omitempty"`
	// StartPeriod is a grace period after the container starts during
	// which failures are not counted (a success still counts).
	StartPeriod Duration `json:"start_period,omitempty"`
	// Disable turns off the image's health check (Docker's
	// --no-healthcheck): without a check of its own, a task runs the
	// HEALTHCHECK its image declares, if any.
	Disable bool `json:"disable,omitempty"`
}

// Enabled reports whether the spec has a health check.
func (h HealthCheck) Enabled() bool { return len(h.Cmd) > 0 || h.HTTP != "" || h.TCP != 0 }

// HTTPTarget splits HTTP into its port and path ("/" if none).
func (h HealthCheck) HTTPTarget() (port int, urlPath string, err error) {
	p, rest, _ := strings.Cut(h.HTTP, "/")
	port, err = strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535 {
		return 0, "", fmt.Errorf("health check http %q: want PORT or PORT/PATH, the port 1-65535", h.HTTP)
	}
	return port, "/" + rest, nil
}

// UpdateConfig drives rolling updates (and rollbacks).
type UpdateConfig struct {
	// Parallelism is how many slots are replaced at a time (default 1;
	// 0 after defaults never happens: use a large number for "all").
	Parallelism int `json:"parallelism,omitempty"`
	// Delay is the pause between batches.
	Delay Duration `json:"delay,omitempty"`
	// Order is stop-first (default) or start-first.
	Order UpdateOrder `json:"order,omitempty"`
	// FailureAction is pause (default) or rollback.
	FailureAction FailureAction `json:"failure_action,omitempty"`
	// Monitor is how long after it starts a new task's failure counts as
	// a failure of the update (default 5s).
	Monitor Duration `json:"monitor,omitempty"`
	// MaxFailureRatio is the fraction of the service's slots whose new
	// tasks may fail (within Monitor) before the failure action is taken
	// (Swarm's; default 0: the first failure).
	MaxFailureRatio float64 `json:"max_failure_ratio,omitempty"`
}

func (u UpdateConfig) withDefaults() UpdateConfig {
	if u.Parallelism == 0 {
		u.Parallelism = 1
	}
	if u.Order == "" {
		u.Order = StopFirst
	}
	if u.FailureAction == "" {
		u.FailureAction = ActionPause
	}
	if u.Monitor == 0 {
		u.Monitor = Duration(DefaultMonitor)
	}
	return u
}

// check reports u's problems, what ("update" or "rollback") first; the
// failure actions allowed are actions.
func (u UpdateConfig) check(what string, actions ...FailureAction) []error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(what+" "+format, args...)) }
	if u.Parallelism < 0 {
		add("parallelism is %d; it must be 1 or more", u.Parallelism)
	}
	if u.MaxFailureRatio < 0 || u.MaxFailureRatio > 1 {
		add("max failure ratio %g: want 0 to 1", u.MaxFailureRatio)
	}
	if u.Delay < 0 || u.Monitor < 0 {
		add("delay and monitor must not be negative")
	}
	switch u.Order {
	case StopFirst, StartFirst:
	default:
		add("order %q is unknown: use stop-first or start-first", u.Order)
	}
	if !slices.Contains(actions, u.FailureAction) {
		var names []string
		for _, a := range actions {
			names = append(names, string(a))
		}
		add("failure action %q is unknown: use %s", u.FailureAction, strings.Join(names, " or "))
	}
	return errs
}

// UpdateOrder says whether the old task stops before or after its
// replacement starts.
type UpdateOrder string

// Update orders.
const (
	StopFirst  UpdateOrder = "stop-first"
	StartFirst UpdateOrder = "start-first"
)

// FailureAction is what a failed update does.
type FailureAction string

// Failure actions.
const (
	ActionPause    FailureAction = "pause"
	ActionRollback FailureAction = "rollback"
)

// VolumeMount is a parsed volume entry of a service.
type VolumeMount struct {
	// Name is the replicated volume (shoalctl volume create).
	Name string
	// Target is the absolute path inside the container.
	Target   string
	ReadOnly bool
}

// ParseVolume parses "NAME:/path" or "NAME:/path:ro" (or ":rw").
func ParseVolume(s string) (VolumeMount, error) {
	name, target, ro, err := splitMount("volume", "NAME:/path[:ro]", s)
	if err != nil {
		return VolumeMount{}, err
	}
	if !volumeName.MatchString(name) {
		return VolumeMount{}, fmt.Errorf("volume %q: name %q must be 1-63 lowercase letters, digits or '-', starting with a letter or digit", s, name)
	}
	return VolumeMount{Name: name, Target: target, ReadOnly: ro}, nil
}

// splitMount splits a mount entry of kind ("volume", "bind"), SOURCE:
// /path[:ro|:rw] as usage says: the target absolute and not /, cleaned.
func splitMount(kind, usage, s string) (source, target string, readOnly bool, err error) {
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 {
		return "", "", false, fmt.Errorf("%s %q: want %s", kind, s, usage)
	}
	if target = parts[1]; !path.IsAbs(target) || path.Clean(target) == "/" {
		return "", "", false, fmt.Errorf("%s %q: mount path %q must be absolute and not /", kind, s, target)
	}
	if len(parts) == 3 {
		switch parts[2] {
		case "ro":
			readOnly = true
		case "rw":
		default:
			return "", "", false, fmt.Errorf("%s %q: option %q is unknown: use ro or rw", kind, s, parts[2])
		}
	}
	return parts[0], path.Clean(target), readOnly, nil
}

// BindMount is a parsed bind entry of a service.
type BindMount struct {
	// Source is the absolute path on the task's node.
	Source   string
	Target   string
	ReadOnly bool
}

// ParseBind parses "/host/path:/path" or "/host/path:/path:ro" (or ":rw").
func ParseBind(s string) (BindMount, error) {
	source, target, ro, err := splitMount("bind", "/host/path:/path[:ro]", s)
	if err != nil {
		return BindMount{}, err
	}
	if !path.IsAbs(source) {
		return BindMount{}, fmt.Errorf("bind %q: the host path %q must be absolute (a task may run on any node: the path is that node's)", s, source)
	}
	return BindMount{Source: path.Clean(source), Target: target, ReadOnly: ro}, nil
}

// SecretsDir is where a secret's file goes in the container unless its
// entry names a path: Docker Swarm's place.
const SecretsDir = "/run/secrets"

// FileMount is a parsed secret or config entry of a service: a file the
// task's node writes and bind-mounts read-only into the container.
type FileMount struct {
	// Name is the secret or config (shoalctl secret|config create).
	Name string
	// Target is the absolute path of its file in the container.
	Target string
}

// ParseSecret parses "NAME" (the file /run/secrets/NAME), "NAME:FILE"
// (/run/secrets/FILE) or "NAME:/abs/path".
func ParseSecret(s string) (FileMount, error) { return parseFileMount("secret", SecretsDir, s) }

// ParseConfig parses "NAME" (the file /NAME, Docker Swarm's default),
// "NAME:FILE" (/FILE) or "NAME:/abs/path".
func ParseConfig(s string) (FileMount, error) { return parseFileMount("config", "/", s) }

func parseFileMount(noun, dir, s string) (FileMount, error) {
	name, target, hasTarget := strings.Cut(s, ":")
	if err := secret.ValidName(name); err != nil {
		return FileMount{}, fmt.Errorf("%s %q: %s %v", noun, s, noun, err)
	}
	if !hasTarget {
		target = name
	}
	if target == "" {
		return FileMount{}, fmt.Errorf("%s %q: want NAME, NAME:FILE or NAME:/path", noun, s)
	}
	if !path.IsAbs(target) {
		if target == "." || target == ".." || strings.Contains(target, "/") {
			return FileMount{}, fmt.Errorf("%s %q: file %q must be a plain file name (it goes in %s), or an absolute path", noun, s, target, dir)
		}
		target = path.Join(dir, target)
	}
	target = path.Clean(target)
	if target == "/" {
		return FileMount{}, fmt.Errorf("%s %q: path %q must name a file", noun, s, target)
	}
	return FileMount{Name: name, Target: target}, nil
}

// TmpfsMount is a parsed tmpfs entry of a service.
type TmpfsMount struct {
	Target string
	// SizeBytes bounds it (0: the kernel's default, half the memory).
	SizeBytes int64
}

// ParseTmpfs parses "/path" or "/path:SIZE" (SIZE as 64m or 1GiB).
func ParseTmpfs(s string) (TmpfsMount, error) {
	target, size, hasSize := strings.Cut(s, ":")
	if !path.IsAbs(target) || path.Clean(target) == "/" {
		return TmpfsMount{}, fmt.Errorf("tmpfs %q: the mount path must be absolute and not /", s)
	}
	m := TmpfsMount{Target: path.Clean(target)}
	if hasSize {
		b, err := ParseBytes(size)
		if err != nil || b <= 0 {
			return TmpfsMount{}, fmt.Errorf("tmpfs %q: want /path or /path:SIZE, SIZE like 64m", s)
		}
		m.SizeBytes = b
	}
	return m, nil
}

var volumeName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// Port publishes a container port.
type Port struct {
	// Host is the published port (1-65535).
	Host int `json:"host"`
	// Container is the port inside the container (1-65535).
	Container int `json:"container"`
	// Protocol is tcp (default) or udp.
	Protocol string `json:"protocol,omitempty"`
	// Mode is ingress (default: the port answers on every node and netd
	// forwards to a replica anywhere) or host (the port is bound on the
	// task's own node, so two tasks publishing it cannot share a node).
	// Only host-mode ports are a placement resource.
	Mode string `json:"mode,omitempty"`
}

// Port modes and protocols.
const (
	PortIngress = "ingress"
	PortHost    = "host"
	ProtoTCP    = "tcp"
	ProtoUDP    = "udp"
)

func (p Port) String() string {
	s := fmt.Sprintf("%d:%d/%s", p.Host, p.Container, p.proto())
	if p.Mode == PortHost {
		s += " (host)"
	}
	return s
}

func (p Port) proto() string {
	if p.Protocol == "" {
		return ProtoTCP
	}
	return p.Protocol
}

// hostPortKey identifies a bound host port.
func (p Port) hostPortKey() string { return strconv.Itoa(p.Host) + "/" + p.proto() }

// HostPorts returns the ports that bind on the task's node (mode host).
func (s ServiceSpec) HostPorts() []Port {
	var out []Port
	for _, p := range s.Ports {
		if p.Mode == PortHost {
			out = append(out, p)
		}
	}
	return out
}

// Resources returns the reservation of one task of s.
func (s ServiceSpec) Resources() Resources {
	return Resources{CPUMillis: s.CPUMillis, MemoryBytes: s.MemoryBytes}
}

// Defaults.
const (
	DefaultRestartDelay    = time.Second
	DefaultRestartMaxDelay = 30 * time.Second
	DefaultHealthInterval  = 30 * time.Second
	DefaultHealthTimeout   = 30 * time.Second
	DefaultHealthRetries   = 3
	DefaultMonitor         = 5 * time.Second
	DefaultStopGrace       = 10 * time.Second
)

// WithDefaults returns s with every unset field that has a default set to
// it. It does not change Replicas: 0 replicas is a valid scale, so the CLI
// decides what an omitted --replicas means.
func (s ServiceSpec) WithDefaults() ServiceSpec {
	if s.Placement == "" {
		s.Placement = Spread
	}
	if s.Restart.Policy == "" {
		s.Restart.Policy = RestartAlways
		if s.Job {
			s.Restart.Policy = RestartOnFailure
		}
	}
	if s.Restart.Delay == 0 {
		s.Restart.Delay = Duration(DefaultRestartDelay)
	}
	if s.Restart.MaxDelay == 0 {
		s.Restart.MaxDelay = Duration(max(DefaultRestartMaxDelay, time.Duration(s.Restart.Delay)))
	}
	if s.Health.Enabled() {
		if s.Health.Interval == 0 {
			s.Health.Interval = Duration(DefaultHealthInterval)
		}
		if s.Health.Timeout == 0 {
			s.Health.Timeout = Duration(DefaultHealthTimeout)
		}
		if s.Health.Retries == 0 {
			s.Health.Retries = DefaultHealthRetries
		}
	}
	s.Update = s.Update.withDefaults()
	if s.Rollback != nil {
		r := s.Rollback.withDefaults()
		s.Rollback = &r
	}
	if s.StopGrace == 0 {
		s.StopGrace = Duration(DefaultStopGrace)
	}
	if len(s.Ports) > 0 {
		ports := make([]Port, len(s.Ports))
		for i, p := range s.Ports {
			if p.Protocol == "" {
				p.Protocol = ProtoTCP
			}
			if p.Mode == "" {
				p.Mode = PortIngress
			}
			ports[i] = p
		}
		s.Ports = ports
	}
	return s
}

// nameRE is a DNS label: services are reachable as <name>.shoal.
var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)

// ValidName checks a service name: a lowercase DNS label of at most 63
// characters, since the service answers DNS as <name>.shoal.
func ValidName(name string) error {
	switch {
	case name == "":
		return errors.New("service name is empty")
	case len(name) > 63:
		return fmt.Errorf("service name %q is %d characters long; the limit is 63 (it is a DNS label)", name, len(name))
	case !nameRE.MatchString(name):
		return fmt.Errorf("service name %q is invalid: use lowercase letters, digits and '-', starting and ending with a letter or digit (it is a DNS label)", name)
	}
	return nil
}

// StackAlias is the service's name within its stack (the name before the
// stack's prefix was added), "" for a service outside any stack.
func (s ServiceSpec) StackAlias() string {
	if s.Stack == "" {
		return ""
	}
	alias, ok := strings.CutPrefix(s.Name, s.Stack+"-")
	if !ok {
		return ""
	}
	return alias
}

// Validate reports every problem with s (after defaults are applied), one
// per line, joined with errors.Join; nil means s can be stored.
func (s ServiceSpec) Validate() error {
	d := s.WithDefaults()
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if err := ValidName(d.Name); err != nil {
		errs = append(errs, err)
	}
	if strings.TrimSpace(d.Image) == "" {
		add("image is empty")
	}
	if d.Stack != "" {
		if !nameRE.MatchString(d.Stack) || len(d.Stack) > 63 {
			add("stack %q is invalid: use lowercase letters, digits and '-', starting and ending with a letter or digit", d.Stack)
		} else if d.StackAlias() == "" {
			add("service %s of stack %s must be named %s-NAME", d.Name, d.Stack, d.Stack)
		}
	}
	if d.User != "" && (strings.ContainsAny(d.User, " \t\n") || strings.HasPrefix(d.User, ":") || strings.HasSuffix(d.User, ":")) {
		add("user %q: want user, uid, user:group or uid:gid", d.User)
	}
	if d.WorkDir != "" && !path.IsAbs(d.WorkDir) {
		add("working directory %q must be absolute", d.WorkDir)
	}
	if err := d.Log.check(); err != nil {
		errs = append(errs, err)
	}
	sample := sampleContext(d)
	if _, err := d.TaskHostname(sample); err != nil {
		errs = append(errs, err)
	}
	if _, err := d.TaskEnv(sample); err != nil {
		errs = append(errs, err)
	}
	for _, c := range slices.Concat(d.CapAdd, d.CapDrop) {
		if _, err := Capability(c); err != nil {
			errs = append(errs, err)
		}
	}
	for _, u := range d.Ulimits {
		if _, err := units.ParseUlimit(u); err != nil {
			add("ulimit %q: %v (want NAME=SOFT[:HARD], e.g. nofile=1024:2048)", u, err)
		}
	}
	for _, g := range d.Groups {
		if g == "" || strings.ContainsAny(g, ": \t\n") {
			add("group %q: want a group name or a GID", g)
		}
	}
	for _, h := range d.Hosts {
		if _, _, err := ParseHost(h); err != nil {
			errs = append(errs, err)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(d.Sysctls)) {
		if err := CheckSysctl(k, d.Network); err != nil {
			errs = append(errs, err)
		}
	}
	if d.Network != "" && d.Network != NetworkHost {
		add("network %q: want empty (the overlay) or host", d.Network)
	}
	if d.Network == NetworkHost && len(d.Networks) > 0 {
		add("networks %s: a host-network service is on no overlay network", strings.Join(d.Networks, ", "))
	}
	for i, n := range d.Networks {
		switch {
		case n == NetworkHost:
			add("network host: give it alone (--network host), not among overlay networks")
		case !networkNameRE.MatchString(n):
			add("network %q: want letters, digits, '_', '.' and '-', starting with a letter or digit, at most 63", n)
		case slices.Contains(d.Networks[:i], n):
			add("network %s given twice", n)
		}
	}
	on := d.OnNetworks()
	for _, n := range slices.Sorted(maps.Keys(d.Aliases)) {
		if !slices.Contains(on, n) {
			add("aliases on network %s: the service is not on it (it is on %s)", n, cmp.Or(strings.Join(on, ", "), "none"))
		}
		for i, a := range d.Aliases[n] {
			switch {
			case !nameRE.MatchString(a) || len(a) > 63:
				add("alias %q on network %s: want a DNS label (lower-case letters, digits and '-', at most 63)", a, n)
			case slices.Contains(d.Aliases[n][:i], a):
				add("alias %s given twice on network %s", a, n)
			}
		}
	}
	for i, n := range d.Internal {
		switch {
		case n == DefaultNetwork:
			add("network %s cannot be internal: it is the network of every service that names none", n)
		case !slices.Contains(on, n):
			add("internal network %s: the service is not on it (it is on %s)", n, cmp.Or(strings.Join(on, ", "), "none"))
		case slices.Contains(d.Internal[:i], n):
			add("internal network %s given twice", n)
		}
	}
	for _, e := range d.Env {
		k, _, ok := strings.Cut(e, "=")
		if !ok || k == "" || strings.ContainsAny(k, " \t\n") {
			add("env entry %q: want KEY=VALUE with a non-empty KEY without spaces", e)
		}
	}
	if d.Replicas < 0 {
		add("replicas is %d; it must be 0 or more", d.Replicas)
	}
	if d.Global && d.Replicas != 0 {
		add("a global service runs one task per eligible node: do not also set replicas (%d)", d.Replicas)
	}
	if d.Job && d.Restart.Policy == RestartAlways {
		add("a job runs to completion: restart policy always would run it forever; use on-failure or never")
	}
	if d.Schedule != "" {
		if !d.Job {
			add("a schedule runs a job: the service is not one (--mode replicated-job or global-job)")
		} else if _, err := ParseSchedule(d.Schedule); err != nil {
			errs = append(errs, err)
		}
	}
	if d.MaxConcurrent < 0 {
		add("max concurrent is %d; it must be 0 (no bound) or more", d.MaxConcurrent)
	}
	if d.MaxConcurrent > 0 && (!d.Job || d.Global) {
		add("max concurrent bounds a replicated job's tasks: the service is not one")
	}
	if d.MaxPerNode < 0 {
		add("max per node is %d; it must be 0 (no bound) or more", d.MaxPerNode)
	}
	if d.Global && d.MaxPerNode > 0 {
		add("a global service runs one task per node: do not also set a max per node")
	}
	if d.CPUMillis < 0 {
		add("cpu is %dm; it must be 0 or more", d.CPUMillis)
	}
	if d.MemoryBytes < 0 {
		add("memory is %d bytes; it must be 0 or more", d.MemoryBytes)
	}
	if d.PidsLimit < 0 {
		add("pids limit is %d; it must be 0 (none) or more", d.PidsLimit)
	}
	for _, c := range d.Constraints {
		if _, err := ParseConstraint(c); err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range d.Preferences {
		if _, err := ParsePreference(p); err != nil {
			errs = append(errs, err)
		}
	}
	switch d.Placement {
	case Spread, Binpack:
	default:
		add("placement %q is unknown: use spread or binpack", d.Placement)
	}
	switch d.Restart.Policy {
	case RestartAlways, RestartOnFailure, RestartNever:
	default:
		add("restart policy %q is unknown: use always, on-failure or never", d.Restart.Policy)
	}
	if d.Restart.MaxAttempts < 0 {
		add("restart max attempts is %d; it must be 0 (unlimited) or more", d.Restart.MaxAttempts)
	}
	if d.Restart.Window < 0 {
		add("restart window %v must not be negative", d.Restart.Window.D())
	}
	if d.Restart.Delay < 0 || d.Restart.MaxDelay < 0 {
		add("restart delays must not be negative")
	} else if d.Restart.MaxDelay < d.Restart.Delay {
		add("restart max delay %v is shorter than the delay %v", d.Restart.MaxDelay, d.Restart.Delay)
	}
	if d.Health.Enabled() {
		kinds := 0
		for _, set := range []bool{len(d.Health.Cmd) > 0, d.Health.HTTP != "", d.Health.TCP != 0} {
			if set {
				kinds++
			}
		}
		if kinds > 1 {
			add("health check: give one of a command, http and tcp")
		}
		if d.Health.HTTP != "" {
			if _, _, err := d.Health.HTTPTarget(); err != nil {
				errs = append(errs, err)
			}
		}
		if d.Health.TCP < 0 || d.Health.TCP > 65535 {
			add("health check tcp port %d is out of range 1-65535", d.Health.TCP)
		}
		if d.Health.Interval < 0 || d.Health.Timeout < 0 || d.Health.StartPeriod < 0 {
			add("health check durations must not be negative")
		}
		if d.Health.Retries < 0 {
			add("health check retries is %d; it must be 1 or more", d.Health.Retries)
		}
	} else if d.Health.Interval != 0 || d.Health.Timeout != 0 || d.Health.Retries != 0 || d.Health.StartPeriod != 0 {
		add("health check settings are given without a health check command")
	}
	if d.Health.Disable && d.Health.Enabled() {
		add("health check: a check is given and disabled (--no-healthcheck) at once")
	}
	errs = append(errs, d.Update.check("update", ActionPause, ActionRollback)...)
	if d.Rollback != nil {
		errs = append(errs, d.Rollback.check("rollback", ActionPause)...)
	}
	if d.StopGrace < 0 {
		add("stop grace period must not be negative")
	}
	if d.StopSignal != "" {
		if _, err := signal.ParseSignal(d.StopSignal); err != nil {
			add("stop signal %q: want a signal such as SIGQUIT, QUIT or 3", d.StopSignal)
		}
	}
	for k := range d.Labels {
		if k == "" {
			add("a label has an empty key")
		}
	}
	seen := map[string]bool{}
	for _, p := range d.Ports {
		if p.Host < 1 || p.Host > 65535 {
			add("published port %d is out of range 1-65535", p.Host)
		}
		if p.Container < 1 || p.Container > 65535 {
			add("container port %d is out of range 1-65535", p.Container)
		}
		if p.Protocol != ProtoTCP && p.Protocol != ProtoUDP {
			add("port %d: protocol %q is unknown: use tcp or udp", p.Host, p.Protocol)
		}
		if p.Mode != PortIngress && p.Mode != PortHost {
			add("port %d: mode %q is unknown: use ingress or host", p.Host, p.Mode)
		}
		k := p.hostPortKey()
		if seen[k] {
			add("port %s is published twice", k)
		}
		seen[k] = true
		// An ingress port is forwarded to task addresses on the overlay,
		// which a --network host task does not have; and netd's proxy
		// would bind the port on the very node address the task listens
		// on. Such a task listens on its node's addresses already.
		if d.Network == NetworkHost && p.Mode == PortIngress {
			add("port %s: a --network host service cannot publish ports (its tasks have no overlay address to forward to; they listen on their node's own addresses already): drop --publish, or leave the service on the overlay", k)
		}
	}
	// Every mount's target, whatever its kind, must be its own.
	targets := map[string]bool{}
	for _, kind := range []struct {
		entries []string
		target  func(string) (string, error)
	}{
		{d.Volumes, func(e string) (string, error) { m, err := ParseVolume(e); return m.Target, err }},
		{d.Binds, func(e string) (string, error) { m, err := ParseBind(e); return m.Target, err }},
		{d.Tmpfs, func(e string) (string, error) { m, err := ParseTmpfs(e); return m.Target, err }},
		{d.Secrets, func(e string) (string, error) { m, err := ParseSecret(e); return m.Target, err }},
		{d.Configs, func(e string) (string, error) { m, err := ParseConfig(e); return m.Target, err }},
	} {
		for _, e := range kind.entries {
			t, err := kind.target(e)
			if err != nil {
				add("%v", err)
				continue
			}
			if targets[t] {
				add("two volumes, binds, tmpfs, secrets or configs are mounted at %s", t)
			}
			targets[t] = true
		}
	}
	return errors.Join(errs...)
}

// Digest identifies the effective spec (after defaults): a task runs the
// current spec exactly when its digest equals the service's. Rolling back
// to a previous spec makes the tasks still running it current again, and
// an update that changes nothing replaces nothing.
func (s ServiceSpec) Digest() string {
	// Replicas, a job's concurrency and schedule and the update config
	// are the owner's business: changing them must not replace running
	// tasks (a scale is not a rollout; a schedule says when runs start).
	c := s.WithDefaults()
	c.Replicas, c.MaxConcurrent, c.Schedule, c.Update = 0, 0, "", UpdateConfig{}
	b, err := json.Marshal(c)
	if err != nil { // cannot happen: the spec has only plain types
		panic(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:12])
}

// Capability is the runtime's name of capability name: "CAP_NET_ADMIN"
// for net_admin, NET_ADMIN or CAP_NET_ADMIN, or "ALL" (every capability).
func Capability(name string) (string, error) {
	c := strings.ToUpper(strings.TrimSpace(name))
	if c == "ALL" {
		return c, nil
	}
	if !strings.HasPrefix(c, "CAP_") {
		c = "CAP_" + c
	}
	if !slices.Contains(capability.Known(), c) {
		return "", fmt.Errorf("capability %q is unknown: see capabilities(7), e.g. NET_ADMIN, or ALL", name)
	}
	return c, nil
}

// ParsePreference returns the label a placement preference spreads over:
// "zone" for "spread=node.labels.zone".
func ParsePreference(p string) (string, error) {
	label, ok := strings.CutPrefix(strings.TrimSpace(p), "spread=node.labels.")
	if !ok || label == "" || strings.ContainsAny(label, " \t=") {
		return "", fmt.Errorf("placement preference %q: want spread=node.labels.LABEL", p)
	}
	return label, nil
}

// ParseHost parses an extra /etc/hosts entry "HOST:IP" (the first colon
// ends the name, so IPv6 addresses need no brackets: db:fd00::5).
func ParseHost(entry string) (string, netip.Addr, error) {
	name, ip, ok := strings.Cut(entry, ":")
	addr, err := netip.ParseAddr(strings.Trim(ip, "[]"))
	if !ok || name == "" || strings.ContainsAny(name, " \t#") || err != nil {
		return "", netip.Addr{}, fmt.Errorf("host %q: want HOST:IP, e.g. db.internal:10.0.0.5", entry)
	}
	return name, addr, nil
}

// ipcSysctls are the kernel.* parameters of an IPC namespace, which a
// task has of its own.
var ipcSysctls = []string{"kernel.msgmax", "kernel.msgmnb", "kernel.msgmni", "kernel.sem",
	"kernel.shmall", "kernel.shmmax", "kernel.shmmni", "kernel.shm_rmid_forced"}

// CheckSysctl refuses a kernel parameter a task cannot set without
// setting it for its whole node: only those of its own IPC namespace
// (the kernel.msg*, sem and shm* ones, fs.mqueue.*) and, for a task on
// the overlay (network not host), of its network namespace (net.*), as
// Docker allows.
func CheckSysctl(key, network string) error {
	switch {
	case slices.Contains(ipcSysctls, key), strings.HasPrefix(key, "fs.mqueue."):
		return nil
	case strings.HasPrefix(key, "net.") && network == NetworkHost:
		return fmt.Errorf("sysctl %s: a task in the node's network namespace (--network host) cannot set net.*: it would change the node's", key)
	case strings.HasPrefix(key, "net."):
		return nil
	}
	return fmt.Errorf("sysctl %s is not one of a task's own namespaces: net.*, fs.mqueue.* or kernel.msg*, sem, shm* (it would change its node's)", key)
}

// DecodeSpec parses a spec document. Unknown fields are ignored, so a node
// running an older version can still schedule a spec written by a newer
// CLI (the fields it does not know are lost on its side only).
func DecodeSpec(b []byte) (ServiceSpec, error) {
	var s ServiceSpec
	if err := json.Unmarshal(b, &s); err != nil {
		return ServiceSpec{}, fmt.Errorf("service spec: %w", err)
	}
	return s, nil
}

// Duration is a time.Duration that encodes in JSON as a Go duration string
// ("1m30s") and decodes from that or from a number of nanoseconds.
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

func (d Duration) String() string { return time.Duration(d).String() }

// MarshalJSON encodes d as a duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON accepts "1m30s" or a number of nanoseconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("duration %q: %w", s, err)
		}
		*d = Duration(v)
		return nil
	}
	var n int64
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("duration: want a string like \"10s\" or nanoseconds, got %s", b)
	}
	*d = Duration(n)
	return nil
}

// Service modes, as Swarm names them (`--mode`).
const (
	ModeReplicated    = "replicated"
	ModeGlobal        = "global"
	ModeReplicatedJob = "replicated-job"
	ModeGlobalJob     = "global-job"
)

// Mode names the spec's mode.
func (s ServiceSpec) Mode() string {
	switch {
	case s.Global && s.Job:
		return ModeGlobalJob
	case s.Global:
		return ModeGlobal
	case s.Job:
		return ModeReplicatedJob
	}
	return ModeReplicated
}

// SetMode sets Global and Job from a mode's name.
func (s *ServiceSpec) SetMode(mode string) error {
	switch mode {
	case ModeReplicated, ModeGlobal, ModeReplicatedJob, ModeGlobalJob:
	default:
		return fmt.Errorf("mode %q is unknown: use %s, %s, %s or %s", mode, ModeReplicated, ModeGlobal, ModeReplicatedJob, ModeGlobalJob)
	}
	s.Global = mode == ModeGlobal || mode == ModeGlobalJob
	s.Job = mode == ModeReplicatedJob || mode == ModeGlobalJob
	return nil
}

// ParseSchedule parses a job's schedule: five cron fields (minute, hour,
// day of month, month, day of week) or a descriptor (@hourly, @daily,
// @every 90s), in UTC unless it starts with CRON_TZ=ZONE.
func ParseSchedule(s string) (cron.Schedule, error) {
	sch, err := cron.ParseStandard(s)
	if err != nil {
		return nil, fmt.Errorf("schedule %q: %w (want 5 cron fields like \"*/15 * * * *\", or @hourly, @daily, @every 30m)", s, err)
	}
	return sch, nil
}
