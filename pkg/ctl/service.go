package ctl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mattn/go-shellwords"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/protobuf/types/known/timestamppb"
	"sigs.k8s.io/yaml"

	"github.com/shoal-dev/shoal/pkg/client"
	"github.com/shoal-dev/shoal/pkg/sched"
	schedv1 "github.com/shoal-dev/shoal/proto/shoal/sched/v1"
)

func (a *app) schedd() (*client.Schedd, error) { return client.NewSchedd(a.runDir, client.Retry{}) }

// scheddStream connects to schedd for a streaming call: no timeout, the
// call lasting as long as ctx; done cancels it and closes the client.
func (a *app) scheddStream(ctx context.Context) (*client.Schedd, context.Context, func(), error) {
	c, err := a.schedd()
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	return c, ctx, func() { cancel(); c.Close() }, nil
}

// scheddCall is statdCall for schedd.
func (a *app) scheddCall(cmd *cobra.Command) (*client.Schedd, context.Context, func(), error) {
	c, err := a.schedd()
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := a.ctx(cmd)
	return c, ctx, func() { cancel(); c.Close() }, nil
}

func (a *app) serviceCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "service", Aliases: []string{"svc"}, Short: "Create and manage services"}
	cmd.AddCommand(a.serviceCreate(), a.serviceDeploy(), a.serviceLs(), a.serviceInspect(), a.servicePs(),
		a.serviceScale(), a.serviceUpdate(), a.serviceRollback(), a.serviceLogs(), a.serviceStats(), a.serviceRm())
	return cmd
}

// specFlags are the service flags shared by create and update.
type specFlags struct {
	image, cpu, memory, placement, restart, order, failure   string
	replicas, maxConcurrent                                  int
	global                                                   bool
	mode                                                     string
	env, constraints, labels, publish, volumes, secrets      []string
	configs, tmpfs, binds, capAdd, capDrop, ulimits, sysctls []string
	networks                                                 []string
	envFiles, hosts, prefs, logOpts, groups                  []string
	logDriver, hostname                                      string
	limitCPU, reserveCPU, limitMemory, reserveMemory         string
	mounts                                                   []string
	withRegistryAuth                                         bool
	// warnings are what apply took as given but ignored in part.
	warnings                                            []string
	healthCmd, entrypoint, user, workdir                string
	healthHTTP, stopSignal, schedule                    string
	healthTCP                                           int
	readOnly, noHealthcheck, init                       bool
	maxFailureRatio, rbMaxFailureRatio                  float64
	rbParallelism                                       int
	rbDelay, rbMonitor                                  time.Duration
	rbOrder, rbFailure                                  string
	healthInterval, healthTimeout, healthStart          time.Duration
	healthRetries, parallelism, maxAttempts, maxPerNode int
	pidsLimit                                           int64
	updateDelay, monitor, stopGrace                     time.Duration
	restartDelay, restartMaxDelay, restartWindow        time.Duration
	force                                               bool
}

func (f *specFlags) bind(fs *pflag.FlagSet, create bool) {
	fs.StringVar(&f.image, "image", "", "image reference, e.g. local/busybox:latest")
	fs.IntVar(&f.replicas, "replicas", 1, "number of tasks")
	if create {
		fs.BoolVar(&f.global, "global", false, "run one task on every eligible node (--mode global)")
		fs.StringVar(&f.mode, "mode", "", "replicated (default), global, replicated-job (--replicas tasks run to completion) or global-job (one per eligible node)")
	}
	fs.IntVar(&f.maxConcurrent, "max-concurrent", 0, "a replicated job's tasks running at once (0: all of --replicas)")
	fs.StringVar(&f.schedule, "schedule", "", "run the job at these times, not now: 5 cron fields (\"0 3 * * *\"), @hourly, @daily or @every 30m (UTC; prefix CRON_TZ=Europe/Paris for another zone)")
	fs.StringVar(&f.cpu, "cpu", "", "CPUs reserved and limited per task: 0.5, 2 or 500m")
	fs.StringVar(&f.memory, "memory", "", "memory reserved and limited per task: 256m, 1GiB")
	// Docker's names: Shoal reserves what it limits.
	fs.StringVar(&f.limitCPU, "limit-cpu", "", "--cpu, by Docker's name")
	fs.StringVar(&f.reserveCPU, "reserve-cpu", "", "--cpu, by Docker's name")
	fs.StringVar(&f.limitMemory, "limit-memory", "", "--memory, by Docker's name")
	fs.StringVar(&f.reserveMemory, "reserve-memory", "", "--memory, by Docker's name")
	normalizeDockerNames(fs)
	fs.BoolVar(&f.withRegistryAuth, "with-registry-auth", false, "store the credentials docker login saved here (~/.docker/config.json) for the image's registry, for every node's pulls (as shoalctl registry login)")
	if create {
		fs.StringArrayVar(&f.mounts, "mount", nil, "Docker's mount syntax for a volume (type=volume,source=NAME,target=/path[,readonly]), a host path (type=bind,source=/host/path,target=/path[,readonly]) or a tmpfs (type=tmpfs,target=/path[,tmpfs-size=64m]) (repeatable)")
	}
	fs.StringArrayVarP(&f.env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	fs.StringArrayVar(&f.envFiles, "env-file", nil, "read environment variables from a file: KEY=VALUE lines, # comments, a bare KEY taken from this shell (repeatable; --env entries come after)")
	fs.StringArrayVar(&f.constraints, "constraint", nil, "placement constraint, e.g. node.labels.zone==eu (repeatable)")
	fs.StringVar(&f.placement, "placement", "", "placement strategy: spread or binpack")
	fs.StringArrayVar(&f.prefs, "placement-pref", nil, "spread the tasks evenly over a node label's values first: spread=node.labels.LABEL (repeatable, strongest first)")
	fs.IntVar(&f.maxPerNode, "replicas-max-per-node", 0, "at most this many tasks on one node (0: no bound)")
	fs.Int64Var(&f.pidsLimit, "limit-pids", 0, "at most this many processes and threads in a task (0: no bound)")
	fs.StringVar(&f.restart, "restart", "", "restart policy: always, on-failure or never (--restart-condition any, on-failure, none: Docker's)")
	fs.IntVar(&f.maxAttempts, "restart-max-attempts", 0, "restarts allowed per slot (0: unlimited)")
	fs.DurationVar(&f.restartDelay, "restart-delay", 0, "wait before the first restart, doubled at each next one (default 1s)")
	fs.DurationVar(&f.restartMaxDelay, "restart-max-delay", 0, "longest wait between restarts (default 30s)")
	fs.DurationVar(&f.restartWindow, "restart-window", 0, "count only the restarts within this window towards --restart-max-attempts (default 0: all of them)")
	fs.StringVar(&f.healthCmd, "health-cmd", "", "health check command, run with sh -c in the container")
	fs.StringVar(&f.healthHTTP, "health-http", "", "health check: the node GETs PORT[/PATH] of the task; 200-399 is healthy")
	fs.IntVar(&f.healthTCP, "health-tcp", 0, "health check: the node connects to PORT of the task")
	fs.DurationVar(&f.healthInterval, "health-interval", 0, "time between health checks")
	fs.DurationVar(&f.healthTimeout, "health-timeout", 0, "time a health check may take")
	fs.IntVar(&f.healthRetries, "health-retries", 0, "consecutive failures that make a task unhealthy")
	fs.DurationVar(&f.healthStart, "health-start-period", 0, "grace period after start during which failures do not count")
	fs.BoolVar(&f.noHealthcheck, "no-healthcheck", false, "run no health check, not even the image's HEALTHCHECK")
	fs.IntVar(&f.parallelism, "update-parallelism", 0, "tasks updated at a time")
	fs.DurationVar(&f.updateDelay, "update-delay", 0, "pause between update batches")
	fs.StringVar(&f.order, "update-order", "", "update order: stop-first or start-first")
	fs.StringVar(&f.failure, "update-failure-action", "", "on a failed update: pause or rollback")
	fs.DurationVar(&f.monitor, "update-monitor", 0, "time after a task starts during which its failure fails the update")
	fs.Float64Var(&f.maxFailureRatio, "update-max-failure-ratio", 0, "fraction of the slots whose new tasks may fail before the update fails (0 to 1; default 0: the first failure)")
	fs.IntVar(&f.rbParallelism, "rollback-parallelism", 0, "tasks rolled back at a time (the --rollback-* flags set how a rollback walks back; without them it walks as the update)")
	fs.DurationVar(&f.rbDelay, "rollback-delay", 0, "pause between rollback batches")
	fs.StringVar(&f.rbOrder, "rollback-order", "", "rollback order: stop-first or start-first")
	fs.StringVar(&f.rbFailure, "rollback-failure-action", "", "on a failed rollback: pause")
	fs.DurationVar(&f.rbMonitor, "rollback-monitor", 0, "time after a task starts during which its failure fails the rollback")
	fs.Float64Var(&f.rbMaxFailureRatio, "rollback-max-failure-ratio", 0, "fraction of the slots whose tasks may fail before the rollback fails")
	fs.DurationVar(&f.stopGrace, "stop-grace", 0, "time between SIGTERM and SIGKILL when stopping a task (also --stop-grace-period)")
	fs.StringVar(&f.stopSignal, "stop-signal", "", "signal that stops a task before the grace ends in SIGKILL (default: the image's, else SIGTERM)")
	fs.StringArrayVar(&f.labels, "label", nil, "service label KEY=VALUE (repeatable)")
	fs.StringArrayVarP(&f.publish, "publish", "p", nil, "publish a port HOST:CONTAINER[/tcp|udp] (repeatable)")
	fs.StringArrayVar(&f.volumes, "volume", nil, "mount replicated volume NAME at /path in the container, NAME:/path[:ro] (repeatable; see shoalctl volume create)")
	fs.StringArrayVar(&f.secrets, "secret", nil, "hand secret NAME to each task as the file /run/secrets/NAME; NAME:FILE for /run/secrets/FILE, NAME:/path for /path (repeatable; see shoalctl secret create)")
	fs.StringArrayVar(&f.configs, "config", nil, "hand config NAME to each task as the file /NAME; NAME:FILE for /FILE, NAME:/path for /path (repeatable; see shoalctl config create)")
	fs.StringArrayVar(&f.binds, "bind", nil, "bind-mount /host/path of the task's node at /path in the container, /host/path:/path[:ro] (repeatable; the path must exist on every node that may run it)")
	fs.StringArrayVar(&f.tmpfs, "tmpfs", nil, "mount an empty tmpfs at /path in the container, /path[:SIZE] (repeatable)")
	fs.StringVar(&f.entrypoint, "entrypoint", "", "replace the image's entrypoint (and its default command), split as a shell would: \"sh -c\"")
	fs.StringVarP(&f.user, "user", "u", "", "run as user, uid, user:group or uid:gid")
	fs.StringVarP(&f.workdir, "workdir", "w", "", "working directory inside the container")
	fs.StringVar(&f.hostname, "hostname", "", "the tasks' hostname (default service-slot); like --env values, a template: {{.Service.Name}}, {{.Task.Slot}}, {{.Task.ID}}, {{.Node.ID}}, {{.Node.Hostname}}")
	fs.BoolVar(&f.readOnly, "read-only", false, "mount the container's root file system read-only")
	fs.BoolVar(&f.init, "init", false, "run an init as the task's PID 1 that passes signals to the command and reaps orphaned processes (docker's --init)")
	fs.StringArrayVar(&f.capAdd, "cap-add", nil, "add a Linux capability to the default set, e.g. NET_ADMIN, or ALL (repeatable)")
	fs.StringArrayVar(&f.capDrop, "cap-drop", nil, "drop a Linux capability from the default set, e.g. CHOWN, or ALL (repeatable)")
	fs.StringArrayVar(&f.ulimits, "ulimit", nil, "resource limit NAME=SOFT[:HARD], e.g. nofile=1024:2048 (repeatable)")
	fs.StringArrayVar(&f.groups, "group", nil, "supplementary group of the task's process, a name of the image's /etc/group or a GID (repeatable)")
	fs.StringArrayVar(&f.hosts, "host", nil, "add HOST:IP to the tasks' /etc/hosts (repeatable)")
	fs.StringArrayVar(&f.sysctls, "sysctl", nil, "kernel parameter of the task's namespaces KEY=VALUE: net.*, fs.mqueue.*, kernel.msg*, sem, shm* (repeatable)")
	fs.StringVar(&f.logDriver, "log-driver", "", "json-file (default: the task's log on its node, rotated) or none (output discarded)")
	fs.StringArrayVar(&f.logOpts, "log-opt", nil, "log option KEY=VALUE: max-size=10m (rotate at), max-file=5 (files kept) (repeatable; default: the node's)")
	fs.StringArrayVar(&f.networks, "network", nil, "overlay network NAME the tasks are on, or name=NAME[,alias=ALIAS][,internal] (more DNS names there; internal: no traffic leaves the overlay from tasks on internal networks only) (repeatable; default: the default network); tasks reach each other only on a network they share. host: the node's network namespace instead")
	if !create {
		fs.BoolVar(&f.force, "force", false, "replace every task even if the spec did not change")
	}
}

// apply writes the flags given on the command line into spec; for create
// every flag counts, for update only the changed ones.
func (f *specFlags) apply(fs *pflag.FlagSet, spec *sched.ServiceSpec, args []string, create bool) error {
	set := func(name string) bool { return create || fs.Changed(name) }
	if set("image") {
		spec.Image = f.image
	}
	if create && fs.Changed("global") && fs.Changed("mode") {
		return usageError{errors.New("--global and --mode: give one (--global is --mode global)")}
	}
	if create && fs.Changed("global") {
		spec.Global = f.global
	}
	if create && fs.Changed("mode") {
		if err := spec.SetMode(f.mode); err != nil {
			return usageError{err}
		}
		if spec.Job && !fs.Changed("restart") {
			// Written out, so that a node too old to know jobs
			// does not run a finished task again.
			spec.Restart.Policy = sched.RestartOnFailure
		}
	}
	if create && spec.Global && !fs.Changed("replicas") {
		f.replicas = 0
	}
	if set("replicas") {
		spec.Replicas = f.replicas
	}
	cpu, ok, err := oneValue(fs, []string{"cpu", "limit-cpu", "reserve-cpu"}, []string{f.cpu, f.limitCPU, f.reserveCPU}, parseCPU)
	if err != nil {
		return usageError{err}
	} else if ok {
		spec.CPUMillis = cpu
	}
	memory, ok, err := oneValue(fs, []string{"memory", "limit-memory", "reserve-memory"}, []string{f.memory, f.limitMemory, f.reserveMemory}, func(s string) (int64, error) {
		v, err := sched.ParseBytes(s)
		if err != nil {
			return 0, fmt.Errorf("memory %w", err)
		}
		return v, nil
	})
	if err != nil {
		return usageError{err}
	} else if ok {
		spec.MemoryBytes = memory
	}
	if fs.Changed("env") || fs.Changed("env-file") {
		var env []string
		for _, name := range f.envFiles {
			entries, err := readEnvFile(name)
			if err != nil {
				return usageError{err}
			}
			env = append(env, entries...)
		}
		for _, e := range f.env {
			if !strings.Contains(e, "=") {
				return usageError{fmt.Errorf("--env %q: want KEY=VALUE", e)}
			}
		}
		spec.Env = append(env, f.env...)
	}
	// Flags that set one field as given.
	for _, fl := range []struct {
		name  string
		apply func()
	}{
		{"constraint", func() { spec.Constraints = f.constraints }},
		{"placement-pref", func() { spec.Preferences = f.prefs }},
		{"placement", func() { spec.Placement = sched.Strategy(f.placement) }},
		{"schedule", func() { spec.Schedule = f.schedule }},
		{"max-concurrent", func() { spec.MaxConcurrent = f.maxConcurrent }},
		{"replicas-max-per-node", func() { spec.MaxPerNode = f.maxPerNode }},
		{"restart", func() { spec.Restart.Policy = sched.RestartCondition(dockerRestart(f.restart)) }},
		{"restart-delay", func() { spec.Restart.Delay = sched.Duration(f.restartDelay) }},
		{"restart-max-delay", func() { spec.Restart.MaxDelay = sched.Duration(f.restartMaxDelay) }},
		{"restart-window", func() { spec.Restart.Window = sched.Duration(f.restartWindow) }},
		{"restart-max-attempts", func() { spec.Restart.MaxAttempts = f.maxAttempts }},
		{"health-interval", func() { spec.Health.Interval = sched.Duration(f.healthInterval) }},
		{"health-timeout", func() { spec.Health.Timeout = sched.Duration(f.healthTimeout) }},
		{"health-retries", func() { spec.Health.Retries = f.healthRetries }},
		{"health-start-period", func() { spec.Health.StartPeriod = sched.Duration(f.healthStart) }},
		{"update-parallelism", func() { spec.Update.Parallelism = f.parallelism }},
		{"update-delay", func() { spec.Update.Delay = sched.Duration(f.updateDelay) }},
		{"update-order", func() { spec.Update.Order = sched.UpdateOrder(f.order) }},
		{"update-failure-action", func() { spec.Update.FailureAction = sched.FailureAction(f.failure) }},
		{"update-monitor", func() { spec.Update.Monitor = sched.Duration(f.monitor) }},
		{"update-max-failure-ratio", func() { spec.Update.MaxFailureRatio = f.maxFailureRatio }},
		{"stop-grace", func() { spec.StopGrace = sched.Duration(f.stopGrace) }},
		{"stop-signal", func() { spec.StopSignal = f.stopSignal }},
		{"volume", func() { spec.Volumes = f.volumes }},
		{"tmpfs", func() { spec.Tmpfs = f.tmpfs }},
		{"bind", func() { spec.Binds = f.binds }},
		{"user", func() { spec.User = f.user }},
		{"workdir", func() { spec.WorkDir = f.workdir }},
		{"hostname", func() { spec.Hostname = f.hostname }},
		{"read-only", func() { spec.ReadOnly = f.readOnly }},
		{"init", func() { spec.Init = f.init }},
		{"cap-add", func() { spec.CapAdd = f.capAdd }},
		{"cap-drop", func() { spec.CapDrop = f.capDrop }},
		{"host", func() { spec.Hosts = f.hosts }},
		{"ulimit", func() { spec.Ulimits = f.ulimits }},
		{"limit-pids", func() { spec.PidsLimit = f.pidsLimit }},
		{"group", func() { spec.Groups = f.groups }},
	} {
		if fs.Changed(fl.name) {
			fl.apply()
		}
	}
	if fs.Changed("network") {
		if err := setNetworks(spec, f.networks); err != nil {
			return usageError{err}
		}
	}
	// One kind of check at a time: the one given replaces the others.
	kinds := 0
	for _, name := range []string{"health-cmd", "health-http", "health-tcp"} {
		if fs.Changed(name) {
			kinds++
		}
	}
	if kinds > 1 {
		return usageError{fmt.Errorf("give one of --health-cmd, --health-http and --health-tcp")}
	}
	if fs.Changed("health-cmd") {
		spec.Health.Cmd, spec.Health.HTTP, spec.Health.TCP = nil, "", 0
		if f.healthCmd != "" {
			spec.Health.Cmd = []string{"sh", "-c", f.healthCmd}
		}
	}
	if fs.Changed("health-http") {
		spec.Health.Cmd, spec.Health.HTTP, spec.Health.TCP = nil, f.healthHTTP, 0
	}
	if fs.Changed("health-tcp") {
		spec.Health.Cmd, spec.Health.HTTP, spec.Health.TCP = nil, "", f.healthTCP
	}
	if kinds > 0 {
		spec.Health.Disable = false
	}
	if fs.Changed("no-healthcheck") {
		if f.noHealthcheck && kinds > 0 {
			return usageError{errors.New("--no-healthcheck and a health check: give one")}
		}
		for _, name := range []string{"health-interval", "health-timeout", "health-retries", "health-start-period"} {
			if f.noHealthcheck && fs.Changed(name) {
				return usageError{fmt.Errorf("--no-healthcheck and --%s: a disabled check has no settings", name)}
			}
		}
		if f.noHealthcheck {
			spec.Health = sched.HealthCheck{Disable: true}
		} else {
			spec.Health.Disable = false // the image's check again
		}
	}
	if fs.Changed("label") {
		spec.Labels = map[string]string{}
		for _, l := range f.labels {
			k, v, ok := strings.Cut(l, "=")
			if !ok || k == "" {
				return usageError{fmt.Errorf("--label %q: want KEY=VALUE", l)}
			}
			spec.Labels[k] = v
		}
	}
	if fs.Changed("publish") {
		spec.Ports = nil
		for _, p := range f.publish {
			ports, err := parsePublish(p)
			if err != nil {
				return usageError{err}
			}
			spec.Ports = append(spec.Ports, ports...)
		}
	}
	if fs.Changed("entrypoint") {
		words, err := shellwords.Parse(f.entrypoint)
		if err != nil {
			return usageError{fmt.Errorf("--entrypoint %q: %w", f.entrypoint, err)}
		}
		spec.Entrypoint = words
	}
	if fs.Changed("sysctl") {
		spec.Sysctls = nil
		for _, kv := range f.sysctls {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return usageError{fmt.Errorf("--sysctl %q: want KEY=VALUE", kv)}
			}
			if spec.Sysctls == nil {
				spec.Sysctls = map[string]string{}
			}
			spec.Sysctls[k] = v
		}
	}
	for _, fm := range []struct {
		flag    string
		entries []string
		to      *[]string
	}{{"secret", f.secrets, &spec.Secrets}, {"config", f.configs, &spec.Configs}} {
		if !fs.Changed(fm.flag) {
			continue
		}
		*fm.to = nil
		for _, e := range fm.entries {
			entry, ignored, err := longFileMount(fm.flag, e)
			if err != nil {
				return usageError{err}
			}
			if ignored != "" {
				f.warnings = append(f.warnings, ignored)
			}
			*fm.to = append(*fm.to, entry)
		}
	}
	rollback := func() *sched.UpdateConfig {
		if spec.Rollback == nil {
			spec.Rollback = &sched.UpdateConfig{}
		}
		return spec.Rollback
	}
	for _, fl := range []struct {
		name  string
		apply func()
	}{
		{"rollback-parallelism", func() { rollback().Parallelism = f.rbParallelism }},
		{"rollback-delay", func() { rollback().Delay = sched.Duration(f.rbDelay) }},
		{"rollback-order", func() { rollback().Order = sched.UpdateOrder(f.rbOrder) }},
		{"rollback-failure-action", func() { rollback().FailureAction = sched.FailureAction(f.rbFailure) }},
		{"rollback-monitor", func() { rollback().Monitor = sched.Duration(f.rbMonitor) }},
		{"rollback-max-failure-ratio", func() { rollback().MaxFailureRatio = f.rbMaxFailureRatio }},
	} {
		if fs.Changed(fl.name) {
			fl.apply()
		}
	}
	for _, m := range f.mounts {
		kind, entry, err := parseMount(m)
		if err != nil {
			return usageError{err}
		}
		switch kind {
		case "volume":
			spec.Volumes = append(spec.Volumes, entry)
		case "bind":
			spec.Binds = append(spec.Binds, entry)
		default:
			spec.Tmpfs = append(spec.Tmpfs, entry)
		}
	}
	if fs.Changed("log-driver") || fs.Changed("log-opt") {
		if err := f.applyLog(fs, spec); err != nil {
			return usageError{err}
		}
	}
	if len(args) > 0 {
		spec.Args = args
	}
	if f.force {
		spec.ForceUpdate++
	}
	return nil
}

func (f *specFlags) printWarnings(w io.Writer) {
	for _, warning := range f.warnings {
		fmt.Fprintf(w, "warning: %s\n", warning)
	}
}

// applyLog sets spec's log configuration from --log-driver and
// --log-opt: options given replace the service's; a new driver without
// options drops the old ones.
func (f *specFlags) applyLog(fs *pflag.FlagSet, spec *sched.ServiceSpec) error {
	driver := spec.Log.Driver
	if fs.Changed("log-driver") {
		driver = f.logDriver
		if driver == "json-file" || driver == "local" {
			driver = "" // Docker's names for the log Shoal keeps
		}
	}
	opts := map[string]string{}
	switch {
	case fs.Changed("log-opt"):
		for _, kv := range f.logOpts {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return fmt.Errorf("--log-opt %q: want KEY=VALUE", kv)
			}
			opts[k] = v
		}
	case !fs.Changed("log-driver") || driver == spec.Log.Driver:
		if spec.Log.MaxSize > 0 {
			opts["max-size"] = strconv.FormatInt(spec.Log.MaxSize, 10)
		}
		if spec.Log.MaxFiles > 0 {
			opts["max-file"] = strconv.Itoa(spec.Log.MaxFiles)
		}
	}
	l, err := sched.ParseLogConfig(driver, opts)
	if err != nil {
		return err
	}
	spec.Log = l
	return nil
}

// readEnvFile reads an environment file as Docker's --env-file does:
// KEY=VALUE lines, the value taken as it is (no quotes removed); blank
// lines and lines starting with # skipped; a bare KEY takes its value
// from shoalctl's environment, or is left out when unset there.
func readEnvFile(name string) ([]string, error) {
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("--env-file: %w", err)
	}
	var out []string
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimLeft(strings.TrimSuffix(line, "\r"), " \t")
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, _, hasValue := strings.Cut(line, "=")
		switch {
		case key == "" || strings.ContainsAny(key, " \t"):
			return nil, fmt.Errorf("--env-file %s:%d: %q: want KEY=VALUE or KEY, the KEY without spaces", name, i+1, line)
		case hasValue:
			out = append(out, line)
		default:
			if v, ok := os.LookupEnv(key); ok {
				out = append(out, key+"="+v)
			}
		}
	}
	return out, nil
}

// parsePublish parses HOST:CONTAINER[/tcp|udp], or ranges of as many
// ports each (8000-8002:9000-9002), one port a pair, as docker does.
func parsePublish(s string) ([]sched.Port, error) {
	if strings.Contains(s, "=") {
		p, err := parseLongPublish(s)
		return []sched.Port{p}, err
	}
	spec, proto, _ := strings.Cut(s, "/")
	h, c, ok := strings.Cut(spec, ":")
	hostLo, hostHi, err1 := portRange(h)
	ctrLo, ctrHi, err2 := portRange(c)
	if !ok || err1 != nil || err2 != nil {
		return nil, fmt.Errorf("--publish %q: want HOST:CONTAINER[/tcp|udp], e.g. 8080:80 or 8000-8002:9000-9002, or published=8080,target=80", s)
	}
	if hostHi-hostLo != ctrHi-ctrLo {
		return nil, fmt.Errorf("--publish %q: the ranges hold %d and %d ports: give as many host ports as container ports", s, hostHi-hostLo+1, ctrHi-ctrLo+1)
	}
	ports := make([]sched.Port, 0, hostHi-hostLo+1)
	for i := 0; i <= hostHi-hostLo; i++ {
		ports = append(ports, sched.Port{Host: hostLo + i, Container: ctrLo + i, Protocol: proto})
	}
	return ports, nil
}

// portRange parses "80" or "8000-8002" (at most 1,000 ports).
func portRange(s string) (lo, hi int, err error) {
	a, b, isRange := strings.Cut(s, "-")
	if lo, err = strconv.Atoi(a); err != nil {
		return 0, 0, err
	}
	hi = lo
	if isRange {
		if hi, err = strconv.Atoi(b); err != nil {
			return 0, 0, err
		}
	}
	if hi < lo || hi-lo >= 1000 {
		return 0, 0, fmt.Errorf("port range %s: want LOW-HIGH, at most 1000 ports", s)
	}
	return lo, hi, nil
}

// checkSpec validates a spec the way schedd will, so bad input fails
// before anything is sent.
func checkSpec(spec sched.ServiceSpec) ([]byte, error) {
	if err := spec.WithDefaults().Validate(); err != nil {
		return nil, usageError{err}
	}
	return json.Marshal(spec)
}

func (a *app) serviceCreate() *cobra.Command {
	var f specFlags
	var w waitFlags
	cmd := &cobra.Command{
		Use:   "create NAME --image REF [flags] [-- CMD ARGS...]",
		Short: "Create a service and wait until its tasks run",
		Example: `  shoalctl service create web --image local/busybox:latest --replicas 3 -- httpd -f -p 80
  shoalctl service create agent --image local/busybox:latest --global -- sleep 1d`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			spec := sched.ServiceSpec{Name: args[0]}
			if err := f.apply(cmd.Flags(), &spec, args[1:], true); err != nil {
				return err
			}
			f.printWarnings(a.errOut)
			data, err := checkSpec(spec)
			if err != nil {
				return err
			}
			if f.withRegistryAuth {
				if err := a.forwardRegistryAuth(cmd, []string{spec.Image}); err != nil {
					return err
				}
			}
			c, ctx, done, err := a.scheddCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			svc, err := c.CreateService(ctx, &schedv1.CreateServiceRequest{Spec: data})
			if err != nil {
				return err
			}
			fmt.Fprintf(a.errOut, "service %s created (version %d)\n", svc.GetName(), svc.GetVersion())
			a.noteLoneNetworks(ctx, c, spec)
			return a.waitService(cmd, c, svc.GetName(), svc.GetVersion(), w, false)
		},
	}
	f.bind(cmd.Flags(), true)
	w.bind(cmd.Flags())
	return cmd
}

// readSpecFile reads a YAML or JSON service spec, strictly: unknown
// fields are errors naming the field.
func readSpecFile(path string) (sched.ServiceSpec, error) {
	var spec sched.ServiceSpec
	var data []byte
	var err error
	if path == "-" {
		data, err = readAllStdin()
	} else {
		data, err = os.ReadFile(path)
	}
	if err != nil {
		return spec, usageError{err}
	}
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return spec, usageError{fmt.Errorf("%s: %w", path, err)}
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&spec); err != nil {
		return spec, usageError{fmt.Errorf("%s: %w", path, err)}
	}
	return spec, nil
}

func (a *app) serviceDeploy() *cobra.Command {
	var file string
	var w waitFlags
	cmd := &cobra.Command{
		Use:   "deploy -f SPEC.yaml",
		Short: "Create or update a service from a spec file (YAML or JSON)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return usageError{fmt.Errorf("-f SPEC.yaml is required")}
			}
			spec, err := readSpecFile(file)
			if err != nil {
				return err
			}
			data, err := checkSpec(spec)
			if err != nil {
				return err
			}
			c, ctx, done, err := a.scheddCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			svc, err := c.DeployService(ctx, &schedv1.UpdateServiceRequest{Spec: data})
			if err != nil {
				return err
			}
			fmt.Fprintf(a.errOut, "service %s deployed (version %d)\n", svc.GetName(), svc.GetVersion())
			return a.waitService(cmd, c, svc.GetName(), svc.GetVersion(), w, svc.GetVersion() > 1)
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "service spec file (- for stdin)")
	w.bind(cmd.Flags())
	return cmd
}

func (a *app) serviceUpdate() *cobra.Command {
	var f specFlags
	var w waitFlags
	cmd := &cobra.Command{
		Use:   "update NAME [flags] [-- CMD ARGS...]",
		Short: "Change a service; its tasks are replaced by a rolling update",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ctx, done, err := a.scheddCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			cur, err := c.GetService(ctx, &schedv1.GetServiceRequest{Name: args[0]})
			if err != nil {
				return err
			}
			var spec sched.ServiceSpec
			if err := json.Unmarshal(cur.GetSpec(), &spec); err != nil {
				return fmt.Errorf("stored spec of %s: %w", args[0], err)
			}
			if err := f.apply(cmd.Flags(), &spec, args[1:], false); err != nil {
				return err
			}
			f.printWarnings(a.errOut)
			data, err := checkSpec(spec)
			if err != nil {
				return err
			}
			if f.withRegistryAuth {
				if err := a.forwardRegistryAuth(cmd, []string{spec.Image}); err != nil {
					return err
				}
			}
			svc, err := c.UpdateService(ctx, &schedv1.UpdateServiceRequest{Spec: data})
			if err != nil {
				return err
			}
			fmt.Fprintf(a.errOut, "service %s updated (version %d)\n", svc.GetName(), svc.GetVersion())
			if cmd.Flags().Changed("network") {
				a.noteLoneNetworks(ctx, c, spec)
			}
			return a.waitService(cmd, c, svc.GetName(), svc.GetVersion(), w, true)
		},
	}
	f.bind(cmd.Flags(), false)
	w.bind(cmd.Flags())
	return cmd
}

func (a *app) serviceScale() *cobra.Command {
	var w waitFlags
	cmd := &cobra.Command{
		Use:   "scale NAME=REPLICAS...",
		Short: "Set the number of tasks of services",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			type target struct {
				name string
				n    uint32
			}
			var targets []target
			for _, arg := range args {
				name, n, ok := strings.Cut(arg, "=")
				v, err := strconv.ParseUint(n, 10, 32)
				if !ok || err != nil || name == "" {
					return usageError{fmt.Errorf("%q: want NAME=REPLICAS", arg)}
				}
				targets = append(targets, target{name, uint32(v)})
			}
			c, ctx, done, err := a.scheddCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			for _, t := range targets {
				svc, err := c.ScaleService(ctx, &schedv1.ScaleServiceRequest{Name: t.name, Replicas: t.n})
				if err != nil {
					return err
				}
				fmt.Fprintf(a.errOut, "service %s scaled to %d\n", t.name, t.n)
				if err := a.waitService(cmd, c, svc.GetName(), svc.GetVersion(), w, false); err != nil {
					return err
				}
			}
			return nil
		},
	}
	w.bind(cmd.Flags())
	return cmd
}

func (a *app) serviceRollback() *cobra.Command {
	var w waitFlags
	cmd := &cobra.Command{
		Use:   "rollback NAME",
		Short: "Return a service to its previous spec",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ctx, done, err := a.scheddCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			svc, err := c.RollbackService(ctx, &schedv1.GetServiceRequest{Name: args[0]})
			if err != nil {
				return err
			}
			fmt.Fprintf(a.errOut, "service %s rolled back (version %d)\n", svc.GetName(), svc.GetVersion())
			return a.waitService(cmd, c, svc.GetName(), svc.GetVersion(), w, true)
		},
	}
	w.bind(cmd.Flags())
	return cmd
}

func (a *app) serviceRm() *cobra.Command {
	var w waitFlags
	cmd := &cobra.Command{
		Use:   "rm NAME...",
		Short: "Remove services and stop their tasks",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ctx, done, err := a.scheddCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			for _, name := range args {
				if _, err := c.RemoveService(ctx, &schedv1.GetServiceRequest{Name: name}); err != nil {
					return err
				}
				fmt.Fprintf(a.errOut, "service %s removed\n", name)
			}
			if w.detach {
				return nil
			}
			return a.waitGone(cmd, c, args, w)
		},
	}
	w.bind(cmd.Flags())
	return cmd
}

// serviceView is a service in -o json/yaml output.
type serviceView struct {
	Name    string `json:"name"`
	Version uint64 `json:"version"`
	State   string `json:"state"`
	Owner   string `json:"owner"`
	Running uint32 `json:"running"`
	Desired uint32 `json:"desired"`
	// Completed counts a job's tasks that exited 0; LastRun and NextRun
	// are a scheduled job's.
	Completed     uint32            `json:"completed,omitempty"`
	LastRun       *time.Time        `json:"last_run,omitempty"`
	NextRun       *time.Time        `json:"next_run,omitempty"`
	Unschedulable []string          `json:"unschedulable,omitempty"`
	Spec          sched.ServiceSpec `json:"spec"`
	Updated       *time.Time        `json:"updated,omitempty"`
	HasPrevious   bool              `json:"has_previous,omitempty"`
}

func serviceViewOf(s *schedv1.Service) serviceView {
	v := serviceView{Name: s.GetName(), Version: s.GetVersion(), State: s.GetState(), Owner: s.GetOwner(),
		Running: s.GetRunning(), Desired: s.GetDesired(), Completed: s.GetCompleted(), Unschedulable: s.GetUnschedulable(), HasPrevious: s.GetHasPrevious()}
	v.Spec = specOf(s)
	v.Updated, v.LastRun, v.NextRun = timeOf(s.GetUpdated()), timeOf(s.GetLastRun()), timeOf(s.GetNextRun())
	return v
}

// timeOf is an optional timestamp of a response as -o json/yaml shows it
// (nil: unset, left out).
func timeOf(ts *timestamppb.Timestamp) *time.Time {
	if ts == nil {
		return nil
	}
	t := ts.AsTime()
	return &t
}

// replicasText is `service ls`'s REPLICAS: running/desired, and for a
// job its completions too, as Swarm shows them.
func replicasText(v serviceView) string {
	s := fmt.Sprintf("%d/%d", v.Running, v.Desired)
	if v.Spec.Job {
		s += fmt.Sprintf(" (%d/%d completed)", v.Completed, v.Desired)
	}
	return s
}

func (a *app) serviceLs() *cobra.Command {
	var format string
	var filters []string
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List services",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			c, ctx, done, err := a.scheddCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			resp, err := c.ListServices(ctx, &schedv1.ListServicesRequest{})
			if err != nil {
				return err
			}
			views := []serviceView{}
			for _, s := range resp.GetServices() {
				views = append(views, serviceViewOf(s))
			}
			sort.Slice(views, func(i, j int) bool { return views[i].Name < views[j].Name })
			if views, err = applyFilter(filters, serviceFilters, views); err != nil {
				return err
			}
			return renderServices(a, format, views)
		},
	}
	outputFlag(cmd, &format)
	quietFlag(cmd, &format, "Name")
	filterFlag(cmd, &filters, serviceFilters)
	return cmd
}

// renderServices writes services as `service ls` shows them.
func renderServices(a *app, format string, views []serviceView) error {
	return render(a.out, format, views, func(tw *tabwriter.Writer) {
		fmt.Fprintln(tw, "NAME\tMODE\tREPLICAS\tIMAGE\tVERSION\tSTATE\tOWNER")
		for _, v := range views {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", v.Name, v.Spec.Mode(), replicasText(v), v.Spec.Image, v.Version, v.State, v.Owner)
		}
	})
}

func (a *app) serviceInspect() *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "inspect NAME",
		Short: "Show a service: its spec and status",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if format == "table" {
				format = "yaml"
			}
			if err := checkFormat(format); err != nil {
				return err
			}
			c, ctx, done, err := a.scheddCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			s, err := c.GetService(ctx, &schedv1.GetServiceRequest{Name: args[0]})
			if err != nil {
				return err
			}
			return render(a.out, format, serviceViewOf(s), nil)
		},
	}
	cmd.Flags().StringVarP(&format, "output", "o", "yaml", "output format: yaml or json")
	return cmd
}

// taskView is a task in output.
type taskView struct {
	ID       string     `json:"id"`
	Service  string     `json:"service"`
	Slot     string     `json:"slot"`
	Node     string     `json:"node"`
	Version  uint64     `json:"version"`
	State    string     `json:"state"`
	Health   string     `json:"health,omitempty"`
	Restarts uint32     `json:"restarts"`
	ExitCode int32      `json:"exit_code"`
	Error    string     `json:"error,omitempty"`
	Current  bool       `json:"current"`
	Image    string     `json:"image,omitempty"`
	Created  *time.Time `json:"created,omitempty"`
	Started  *time.Time `json:"started,omitempty"`
	Finished *time.Time `json:"finished,omitempty"`
}

func taskViewOf(t *schedv1.Task) taskView {
	v := taskView{ID: t.GetId(), Service: t.GetService(), Slot: t.GetSlot(), Node: t.GetNode(), Version: t.GetVersion(),
		State: t.GetState(), Health: t.GetHealth(), Restarts: t.GetRestarts(), ExitCode: t.GetExitCode(), Error: t.GetError(),
		Current: t.GetCurrent(), Image: t.GetImage()}
	v.Created, v.Started, v.Finished = timeOf(t.GetCreated()), timeOf(t.GetStarted()), timeOf(t.GetFinished())
	return v
}

func renderTasks(a *app, format string, tasks []*schedv1.Task) error {
	views := []taskView{}
	for _, t := range tasks {
		views = append(views, taskViewOf(t))
	}
	sort.Slice(views, func(i, j int) bool {
		return taskKey{views[i].Service, views[i].Slot, views[i].ID}.less(taskKey{views[j].Service, views[j].Slot, views[j].ID})
	})
	return render(a.out, format, views, func(tw *tabwriter.Writer) {
		fmt.Fprintln(tw, "ID\tSERVICE\tSLOT\tNODE\tVERSION\tSTATE\tHEALTH\tRESTARTS\tERROR")
		for _, v := range views {
			state := v.State
			if !v.Current {
				state += " (superseded)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%d\t%s\n", v.ID, v.Service, v.Slot, v.Node, v.Version, state, v.Health, v.Restarts, v.Error)
		}
	})
}

// taskKey orders task lines: by service, then slot (numbers as numbers),
// then ID.
type taskKey struct{ service, slot, id string }

func (k taskKey) less(o taskKey) bool {
	if k.service != o.service {
		return k.service < o.service
	}
	if k.slot != o.slot {
		return slotLess(k.slot, o.slot)
	}
	return k.id < o.id
}

func slotLess(a, b string) bool {
	x, err1 := strconv.Atoi(a)
	y, err2 := strconv.Atoi(b)
	if err1 == nil && err2 == nil {
		return x < y
	}
	return a < b
}

func (a *app) servicePs() *cobra.Command {
	var format string
	var filters []string
	var all bool
	cmd := &cobra.Command{
		Use:   "ps NAME",
		Short: "List a service's tasks",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			c, ctx, done, err := a.scheddCall(cmd)
			if err != nil {
				return err
			}
			defer done()
			svc, err := c.GetService(ctx, &schedv1.GetServiceRequest{Name: args[0]})
			if err != nil {
				return err
			}
			resp, err := c.ListTasks(ctx, &schedv1.ListTasksRequest{Service: args[0], All: all})
			if err != nil {
				return err
			}
			tasks, err := applyFilter(filters, taskFilters, resp.GetTasks())
			if err != nil {
				return err
			}
			if err := renderTasks(a, format, tasks); err != nil {
				return err
			}
			// Slots that cannot be placed have no task to show: say why
			// they are missing (on stderr, so -o json stays a task list).
			for _, r := range svc.GetUnschedulable() {
				fmt.Fprintf(a.errOut, "unschedulable: %s\n", r)
			}
			return nil
		},
	}
	outputFlag(cmd, &format)
	quietFlag(cmd, &format, "ID")
	cmd.Flags().BoolVarP(&all, "all", "a", false, "include finished tasks")
	filterFlag(cmd, &filters, taskFilters)
	return cmd
}

// noteLoneNetworks says which of spec's networks no other service is on:
// a network exists while a service names it, so a misspelt name gives a
// service a network of its own, where Swarm would say "not found". It
// also names the networks of spec's that another service makes internal,
// which spec does not say itself.
func (a *app) noteLoneNetworks(ctx context.Context, c *client.Schedd, spec sched.ServiceSpec) {
	if len(spec.Networks) == 0 {
		return
	}
	resp, err := c.ListServices(ctx, &schedv1.ListServicesRequest{})
	if err != nil {
		return // only a note
	}
	shared := map[string]bool{}
	internalBy := map[string]string{} // network -> a service that makes it internal
	for _, s := range resp.GetServices() {
		if s.GetName() != spec.Name {
			other := specOf(s)
			for _, n := range other.OnNetworks() {
				shared[n] = true
				if slices.Contains(other.Internal, n) && internalBy[n] == "" {
					internalBy[n] = s.GetName()
				}
			}
		}
	}
	for _, n := range spec.Networks {
		switch {
		case !shared[n]:
			fmt.Fprintf(a.errOut, "note: no other service is on network %s yet (a network exists while a service names it)\n", n)
		case internalBy[n] != "" && !slices.Contains(spec.Internal, n):
			fmt.Fprintf(a.errOut, "note: network %s is internal (service %s says so): tasks on internal networks only reach nothing outside the overlay\n",
				n, internalBy[n])
		}
	}
}

// setNetworks turns --network values into the spec's fields: host alone
// is Network, the node's namespace (the spec refuses it among others);
// default alone is no Networks, the default network; NAME, or
// name=NAME[,alias=A...][,internal] (Docker's long form; internal is
// Shoal's, having no network create), is one more.
func setNetworks(spec *sched.ServiceSpec, vals []string) error {
	spec.Network, spec.Networks, spec.Aliases, spec.Internal = "", nil, nil, nil
	for _, v := range vals {
		if !strings.Contains(v, "=") {
			spec.Networks = append(spec.Networks, v)
			continue
		}
		var name string
		var as []string
		internal := false
		for _, field := range strings.Split(v, ",") {
			k, val, hasVal := strings.Cut(field, "=")
			switch k {
			case "name":
				name = val
			case "alias":
				as = append(as, val)
			case "internal":
				internal = true
				if hasVal {
					b, err := strconv.ParseBool(val)
					if err != nil {
						return fmt.Errorf("--network %q: internal=%q: want true or false", v, val)
					}
					internal = b
				}
			case "driver-opt", "ip", "ip6", "link-local-ip", "mac-address":
				return fmt.Errorf("--network %q: %s is not supported (Shoal gives each task its address on the overlay)", v, k)
			default:
				return fmt.Errorf("--network %q: unknown field %q: want name, alias and internal", v, k)
			}
		}
		if name == "" {
			return fmt.Errorf("--network %q: name is missing", v)
		}
		spec.Networks = append(spec.Networks, name)
		if len(as) > 0 {
			if spec.Aliases == nil {
				spec.Aliases = map[string][]string{}
			}
			spec.Aliases[name] = append(spec.Aliases[name], as...)
		}
		if internal {
			spec.Internal = append(spec.Internal, name)
		}
	}
	switch {
	case len(spec.Networks) == 1 && spec.Networks[0] == sched.NetworkHost:
		spec.Network, spec.Networks = sched.NetworkHost, nil
	case len(spec.Networks) == 1 && spec.Networks[0] == sched.DefaultNetwork, len(spec.Networks) == 1 && spec.Networks[0] == "":
		spec.Networks = nil
	}
	return nil
}

// waitFlags control how long-running commands wait for convergence.
type waitFlags struct {
	detach  bool
	timeout time.Duration
}

func (w *waitFlags) bind(fs *pflag.FlagSet) {
	fs.BoolVarP(&w.detach, "detach", "d", false, "return at once instead of waiting for the service to converge")
	fs.DurationVar(&w.timeout, "wait-timeout", 3*time.Minute, "give up waiting for convergence after this long")
}

// waitService polls a service until its tasks of version (or later) all
// run, showing progress, and fails if the update was paused or rolled
// back, or the wait times out.
//
// A rollout (update, rollback) is done when the owner records the version
// converged: every new task ran through the update monitor period. A
// create or scale is done when the tasks run. A job is done when every
// slot finished (converged): an error unless every task completed; a
// scheduled job's create returns at once with its next run.
func (a *app) waitService(cmd *cobra.Command, c *client.Schedd, name string, version uint64, w waitFlags, rollout bool) error {
	if w.detach {
		return nil
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), w.timeout)
	defer cancel()
	p := newProgress(a.errOut)
	timedOut := func() error { return fmt.Errorf("%s did not converge within %v (last: %s)", name, w.timeout, p.last) }
	var failedAt time.Time // a job seen finished with tasks short of complete
	for {
		s, err := c.GetService(ctx, &schedv1.GetServiceRequest{Name: name})
		if err != nil {
			if ctx.Err() != nil {
				return waitEnded(cmd, timedOut(), name)
			}
			return err
		}
		spec := specOf(s)
		job := spec.Job
		if job && spec.Schedule != "" && (version <= 1 || s.GetConverged() >= s.GetVersion()) {
			// A scheduled job runs at its times, not now; an update
			// of one applies from the next run.
			next := "none"
			if s.GetNextRun() != nil {
				next = s.GetNextRun().AsTime().UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(a.errOut, "job %s scheduled (%s): next run %s\n", name, spec.Schedule, next)
			return nil
		}
		line := fmt.Sprintf("%s: %d/%d running (version %d, %s)", name, s.GetRunning(), s.GetDesired(), s.GetVersion(), s.GetState())
		if job {
			line = fmt.Sprintf("%s: %d/%d completed, %d running (version %d, %s)", name, s.GetCompleted(), s.GetDesired(), s.GetRunning(), s.GetVersion(), s.GetState())
		}
		if len(s.GetUnschedulable()) > 0 {
			line += "; unschedulable: " + strings.Join(s.GetUnschedulable(), "; ")
		}
		p.show(line)
		done := p.end
		switch {
		case s.GetState() == "paused":
			done()
			return fmt.Errorf("update of %s failed and is paused (see `shoalctl service ps %s`; fix and update again, or `shoalctl service rollback %s`)", name, name, name)
		case version > 0 && s.GetVersion() > version && (s.GetState() == "rolling-back" || s.GetConverged() >= s.GetVersion()):
			done()
			return fmt.Errorf("update of %s to version %d failed and was rolled back (now version %d, the previous spec)", name, version, s.GetVersion())
		case job && s.GetState() == "active" && s.GetConverged() >= s.GetVersion() && s.GetCompleted() >= s.GetDesired():
			done()
			fmt.Fprintf(a.errOut, "job %s complete: %d/%d completed\n", name, s.GetCompleted(), s.GetDesired())
			return nil
		case job && s.GetState() == "active" && s.GetConverged() >= s.GetVersion():
			// Every slot finished, not every one completed: failed
			// under its restart policy, unless this node has the
			// owner's word before the last task's own (gossip brings
			// them from two nodes), which a short wait tells.
			if failedAt.IsZero() {
				failedAt = time.Now()
			} else if time.Since(failedAt) > 2*time.Second {
				done()
				return fmt.Errorf("job %s finished with %d of %d tasks completed; the others failed (see `shoalctl service ps -a %s`)", name, s.GetCompleted(), s.GetDesired(), name)
			}
		case job:
		case s.GetState() == "active" && (s.GetConverged() >= s.GetVersion() || !rollout) && s.GetRunning() == s.GetDesired():
			done()
			fmt.Fprintf(a.errOut, "%s converged: %d/%d running\n", name, s.GetRunning(), s.GetDesired())
			return nil
		}
		select {
		case <-ctx.Done():
			p.end()
			return waitEnded(cmd, timedOut(), name)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// waitGone waits until removed services have no tasks left running.
func (a *app) waitGone(cmd *cobra.Command, c *client.Schedd, names []string, w waitFlags) error {
	ctx, cancel := context.WithTimeout(cmd.Context(), w.timeout)
	defer cancel()
	for _, name := range names {
		for {
			resp, err := c.ListTasks(ctx, &schedv1.ListTasksRequest{Service: name})
			if err != nil {
				if ctx.Err() != nil {
					return waitEnded(cmd, fmt.Errorf("%s: tasks still stopping after %v", name, w.timeout), name)
				}
				return err
			}
			left, down := 0, 0
			for _, t := range resp.GetTasks() {
				switch {
				case sched.TaskState(t.GetState()).Terminal():
				case t.GetNodeDown():
					// Its node's agent stops it when the node is back;
					// waiting for that could take for ever.
					down++
				default:
					left++
				}
			}
			if left == 0 {
				if down > 0 {
					fmt.Fprintf(a.errOut, "%s: %d tasks on down nodes stop when their nodes are back\n", name, down)
				}
				break
			}
			select {
			case <-ctx.Done():
				return waitEnded(cmd, fmt.Errorf("%s: %d tasks still stopping after %v", name, left, w.timeout), name)
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
	fmt.Fprintln(a.errOut, "all tasks stopped")
	return nil
}

// waitEnded is the error of a wait for service name cut short: by the
// wait's timeout (timedOut), or by an interrupt. Either way the change
// the wait was for was made, and the cluster goes on with it.
func waitEnded(cmd *cobra.Command, timedOut error, name string) error {
	if cmd.Context().Err() != nil {
		return fmt.Errorf("interrupted while waiting; the change was made and goes on without shoalctl (see `shoalctl service ps %s`)", name)
	}
	return timedOut
}

// progress shows a wait's status line whenever it changes: rewritten in
// place on a terminal, a line each otherwise (logs, pipes).
type progress struct {
	w    io.Writer
	tty  bool
	last string
}

func newProgress(w io.Writer) *progress { return &progress{w: w, tty: isTerminal(w)} }

func (p *progress) show(line string) {
	if line == p.last {
		return
	}
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s", line)
	} else {
		fmt.Fprintln(p.w, line)
	}
	p.last = line
}

// end ends the line rewritten in place.
func (p *progress) end() {
	if p.tty {
		fmt.Fprintln(p.w)
	}
}

func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func readAllStdin() ([]byte, error) {
	var b bytes.Buffer
	_, err := b.ReadFrom(os.Stdin)
	return b.Bytes(), err
}
