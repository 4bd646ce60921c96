// Package stack turns a Compose project, as compose-go loads it, into what
// `shoalctl stack deploy` creates: the specs of the stack's services, the
// secrets and the replicated volumes they use. It does no I/O: reading
// the files, creating secrets and volumes and deploying the services are
// shoalctl's.
//
// The rules are Docker Swarm's (`docker stack deploy`) where Shoal has the
// feature, so that a file written for Swarm deploys here unchanged:
//
//   - service web of stack app is the Shoal service app-web (a DNS label;
//     Swarm's app_web is not one), which the stack's tasks also reach as
//     web (sched.ServiceSpec.Stack);
//   - a secret, config or volume the file defines is the stack's: app_KEY
//     for a secret or config (Swarm's name), app-KEY for a volume (volume
//     names are DNS labels too); an external one keeps its name;
//   - deploy: mode, replicas, resources, placement constraints,
//     restart_policy, update_config and labels map to the spec's fields.
//
// What Shoal lacks is refused, naming the option, unless Swarm also
// ignores it (build, depends_on, container_name, links, ...), which is a
// warning. A file is checked whole: every problem is reported at once.
package stack

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/compose-spec/compose-go/v2/types"

	"github.com/shoal-dev/shoal/pkg/sched"
	"github.com/shoal-dev/shoal/pkg/secret"
)

// LabelStack marks what a stack created beside its services (secrets and
// configs), so that `stack rm` removes it too.
const LabelStack = "shoal.stack"

// Plan is what a Compose project becomes.
type Plan struct {
	Stack string
	// Services are sorted by name.
	Services []sched.ServiceSpec
	// Secrets, Configs and Volumes are those the services use, sorted by
	// name.
	Secrets []File
	Configs []File
	Volumes []Volume
	// Warnings name what was ignored, as Swarm ignores it.
	Warnings []string
}

// File is a secret or config the stack's services use.
type File struct {
	// Key is its name in the file; Name is the cluster secret's or
	// config's.
	Key, Name string
	// External ones must exist; the stack neither creates nor removes
	// them.
	External bool
	// The source of one the stack creates: a file (absolute, as compose-go
	// resolves it), an environment variable, or inline content.
	File, Env, Content string
}

// Volume is a replicated volume the stack's services mount.
type Volume struct {
	Key, Name string
	// External volumes must exist.
	External bool
	// SizeBytes and Replicas are from driver_opts size and replicas (0:
	// vold's defaults).
	SizeBytes int64
	Replicas  int32
}

// ValidName checks a stack name: a DNS label, since it prefixes service
// names and is a DNS domain (<service>.<stack>.shoal).
func ValidName(name string) error {
	if err := sched.ValidName(name); err != nil {
		return fmt.Errorf("stack name %q is invalid: use lowercase letters, digits and '-', starting and ending with a letter or digit", name)
	}
	return nil
}

// serviceKeys are the service options Shoal maps; ignoredKeys those it
// ignores with a warning, as Swarm does. Any other option is refused.
var (
	// env_file is compose-go's: it merges the files into environment.
	serviceKeys = []string{"image", "command", "entrypoint", "user", "working_dir", "read_only", "tmpfs", "environment", "env_file", "stop_signal", "deploy", "ports", "volumes", "secrets", "configs",
		"healthcheck", "stop_grace_period", "network_mode", "restart", "networks", "cap_add", "cap_drop",
		"ulimits", "sysctls", "extra_hosts", "logging", "hostname", "pids_limit", "group_add", "init"}
	ignoredKeys = []string{"build", "depends_on", "container_name", "links", "external_links", "expose",
		"labels", "profiles", "pull_policy", "stdin_open", "tty"}
)

// Convert maps project p to stack stack.
func Convert(p *types.Project, stack string) (Plan, error) {
	plan := Plan{Stack: stack}
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if err := ValidName(stack); err != nil {
		return plan, err
	}
	if len(p.Services) == 0 {
		return plan, errors.New("the file defines no services")
	}
	secrets, configs := map[string]File{}, map[string]File{}
	volumes := map[string]Volume{}
	published := map[string]string{} // "80/tcp": the service publishing it
	for _, key := range slices.Sorted(maps.Keys(p.Services)) {
		svc := p.Services[key]
		spec, warnings, err := convertService(p, stack, svc, secrets, configs, volumes)
		plan.Warnings = append(plan.Warnings, warnings...)
		if err == nil {
			err = spec.Validate()
		}
		if err != nil {
			// One line per problem, each naming its service.
			for _, e := range strings.Split(err.Error(), "\n") {
				fail("service %s: %s", key, e)
			}
			continue
		}
		for _, pt := range spec.Ports {
			at := fmt.Sprintf("%d/%s", pt.Host, cmp.Or(strings.ToLower(pt.Protocol), "tcp"))
			if other, ok := published[at]; ok {
				fail("service %s: port %s is published by service %s too", key, at, other)
			}
			published[at] = key
		}
		plan.Services = append(plan.Services, spec)
	}
	for _, k := range slices.Sorted(maps.Keys(secrets)) {
		plan.Secrets = append(plan.Secrets, secrets[k])
	}
	for _, k := range slices.Sorted(maps.Keys(configs)) {
		plan.Configs = append(plan.Configs, configs[k])
	}
	for _, k := range slices.Sorted(maps.Keys(volumes)) {
		plan.Volumes = append(plan.Volumes, volumes[k])
	}
	if len(errs) > 0 {
		return plan, errors.Join(errs...)
	}
	return plan, nil
}

func convertService(p *types.Project, stack string, svc types.ServiceConfig, secrets, configs map[string]File, volumes map[string]Volume) (sched.ServiceSpec, []string, error) {
	var errs []error
	var warnings []string
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	warn := func(format string, args ...any) {
		warnings = append(warnings, fmt.Sprintf("service %s: ", svc.Name)+fmt.Sprintf(format, args...))
	}
	spec := sched.ServiceSpec{Name: stack + "-" + svc.Name, Stack: stack, Image: svc.Image, Replicas: 1}
	if err := sched.ValidName(spec.Name); err != nil {
		return spec, nil, fmt.Errorf("its Shoal name %s is not a DNS label: use lowercase letters, digits and '-' in service names, and keep stack and service names under 63 characters together", spec.Name)
	}
	keys, err := setKeys(svc)
	if err != nil {
		return spec, nil, err
	}
	for _, k := range keys {
		switch {
		case slices.Contains(serviceKeys, k):
		case slices.Contains(ignoredKeys, k):
			warn("%s is ignored", k)
		default:
			fail("%s is not supported by Shoal", k)
		}
	}
	if svc.Image == "" {
		fail("no image: Shoal does not build images (load one with `shoalctl image load`)")
	}
	spec.Args = []string(svc.Command)
	spec.Entrypoint = []string(svc.Entrypoint)
	spec.User, spec.WorkDir, spec.ReadOnly, spec.Hostname = svc.User, svc.WorkingDir, svc.ReadOnly, svc.Hostname
	spec.Init = svc.Init != nil && *svc.Init
	spec.CapAdd, spec.CapDrop = svc.CapAdd, svc.CapDrop
	spec.PidsLimit = max(svc.PidsLimit, 0) // -1, Compose's "no limit", is none
	spec.Groups = svc.GroupAdd
	for _, name := range slices.Sorted(maps.Keys(svc.Ulimits)) {
		u := svc.Ulimits[name]
		soft, hard := u.Soft, u.Hard
		if u.Single != 0 {
			soft, hard = u.Single, u.Single
		}
		spec.Ulimits = append(spec.Ulimits, fmt.Sprintf("%s=%d:%d", name, soft, hard))
	}
	if l := svc.Logging; l != nil {
		// A Swarm file's syslog or fluentd logging deploys all the same:
		// the tasks' logs stay on their nodes.
		if cfg, err := sched.ParseLogConfig(l.Driver, l.Options); err != nil {
			warn("logging is ignored (the task's log is kept on its node, rotated as the node says): %v", err)
		} else {
			spec.Log = cfg
		}
	}
	for _, name := range slices.Sorted(maps.Keys(svc.ExtraHosts)) {
		for _, ip := range svc.ExtraHosts[name] {
			spec.Hosts = append(spec.Hosts, name+":"+ip)
		}
	}
	if len(svc.Sysctls) > 0 {
		spec.Sysctls = maps.Clone(map[string]string(svc.Sysctls))
	}
	for _, k := range slices.Sorted(maps.Keys(svc.Environment)) {
		if v := svc.Environment[k]; v != nil {
			spec.Env = append(spec.Env, k+"="+*v)
		}
	}
	// As docker stack deploy: the file's networks are the stack's,
	// <stack>_<name>, an external one is named as it is, and a service
	// that names none is on <stack>_default, so that stacks are apart.
	// A stack's network the file makes internal is in every spec on it.
	internal := func(key, name string) {
		switch nw, ok := p.Networks[key]; {
		case ok && nw.Internal && bool(nw.External):
			warn("network %s: internal is ignored on an external network (the services on it say whether it is)", key)
		case ok && nw.Internal:
			spec.Internal = append(spec.Internal, name)
		}
	}
	for _, key := range slices.Sorted(maps.Keys(svc.Networks)) {
		name := stack + "_" + key
		if nw, ok := p.Networks[key]; ok && bool(nw.External) {
			name = cmp.Or(nw.Name, key)
		}
		spec.Networks = append(spec.Networks, name)
		internal(key, name)
		c := svc.Networks[key]
		if c != nil && len(c.Aliases) > 0 {
			if spec.Aliases == nil {
				spec.Aliases = map[string][]string{}
			}
			spec.Aliases[name] = slices.Clone(c.Aliases)
		}
		if c != nil && (c.Ipv4Address != "" || c.Ipv6Address != "") {
			warn("network %s: fixed addresses are ignored (each task gets its address on the overlay)", key)
		}
	}
	if len(spec.Networks) == 0 && svc.NetworkMode == "" {
		spec.Networks = []string{stack + "_default"}
		internal("default", spec.Networks[0])
	}
	switch svc.NetworkMode {
	case "":
	case "host":
		spec.Networks = nil
		spec.Network = sched.NetworkHost
	default:
		fail("network_mode %q is not supported (only host)", svc.NetworkMode)
	}
	if svc.StopGracePeriod != nil {
		spec.StopGrace = sched.Duration(*svc.StopGracePeriod)
	}
	spec.StopSignal = svc.StopSignal
	if r, err := restartOf(svc.Restart); err != nil {
		fail("%v", err)
	} else {
		spec.Restart.Policy = r.Policy
		spec.Restart.MaxAttempts = r.MaxAttempts
	}
	if svc.Scale != nil {
		spec.Replicas = *svc.Scale
	}
	if d := svc.Deploy; d != nil {
		errs = append(errs, deploy(d, &spec, warn)...)
	}
	if spec.Job && spec.Restart.Policy == "" {
		// A job's default, written out (see ServiceSpec.Job).
		spec.Restart.Policy = sched.RestartOnFailure
	}
	if h := svc.HealthCheck; h != nil && h.Disable {
		spec.Health.Disable = true // the image's HEALTHCHECK too
	} else if h != nil {
		errs = append(errs, health(h, &spec)...)
	}
	for _, port := range svc.Ports {
		pt, err := portOf(port)
		if err != nil {
			fail("%v", err)
			continue
		}
		spec.Ports = append(spec.Ports, pt)
	}
	for _, t := range svc.Tmpfs {
		entry, err := tmpfsOf(t)
		if err != nil {
			fail("%v", err)
			continue
		}
		spec.Tmpfs = append(spec.Tmpfs, entry)
	}
	for _, v := range svc.Volumes {
		if v.Type == types.VolumeTypeTmpfs {
			entry := v.Target
			if v.Tmpfs != nil && v.Tmpfs.Size > 0 {
				entry += ":" + strconv.FormatInt(int64(v.Tmpfs.Size), 10)
			}
			spec.Tmpfs = append(spec.Tmpfs, entry)
			continue
		}
		if v.Type == types.VolumeTypeBind {
			entry, err := bindOf(v)
			if err != nil {
				fail("%v", err)
				continue
			}
			spec.Binds = append(spec.Binds, entry)
			continue
		}
		entry, vol, err := volumeOf(p, stack, v)
		if err != nil {
			fail("%v", err)
			continue
		}
		volumes[vol.Key] = vol
		spec.Volumes = append(spec.Volumes, entry)
	}
	// Secrets and configs alike: references to what the file defines.
	var secretRefs, configRefs []types.FileReferenceConfig
	definedSecrets, definedConfigs := map[string]types.FileObjectConfig{}, map[string]types.FileObjectConfig{}
	for _, ref := range svc.Secrets {
		secretRefs = append(secretRefs, types.FileReferenceConfig(ref))
	}
	for _, ref := range svc.Configs {
		configRefs = append(configRefs, types.FileReferenceConfig(ref))
	}
	for k, v := range p.Secrets {
		definedSecrets[k] = types.FileObjectConfig(v)
	}
	for k, v := range p.Configs {
		definedConfigs[k] = types.FileObjectConfig(v)
	}
	for _, kind := range []struct {
		noun    string
		refs    []types.FileReferenceConfig
		defined map[string]types.FileObjectConfig
		parse   func(string) (sched.FileMount, error)
		into    map[string]File
		entries *[]string
	}{
		{"secret", secretRefs, definedSecrets, sched.ParseSecret, secrets, &spec.Secrets},
		{"config", configRefs, definedConfigs, sched.ParseConfig, configs, &spec.Configs},
	} {
		for _, ref := range kind.refs {
			entry, f, err := fileOf(p.Name, stack, kind.noun, ref, kind.defined, kind.parse)
			if err != nil {
				fail("%v", err)
				continue
			}
			if ref.UID != "" || ref.GID != "" || (ref.Mode != nil && *ref.Mode != 0o444) {
				warn("%[1]s %[2]s: uid, gid and mode are ignored (a %[1]s's file is root's, mode 0444)", kind.noun, ref.Source)
			}
			kind.into[f.Key] = f
			*kind.entries = append(*kind.entries, entry)
		}
	}
	return spec, warnings, errors.Join(errs...)
}

// setKeys lists the options svc sets, by their names in the file.
func setKeys(svc types.ServiceConfig) ([]string, error) {
	b, err := json.Marshal(svc)
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	var keys []string
	for k, v := range m {
		switch string(v) {
		case "null", "false", "0", `""`, "[]", "{}":
			continue
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys, nil
}

// restartOf maps the service-level restart option (used when deploy has
// no restart_policy).
func restartOf(r string) (sched.RestartPolicy, error) {
	cond, n, _ := strings.Cut(r, ":")
	switch cond {
	case "":
		return sched.RestartPolicy{}, nil
	case types.RestartPolicyNo:
		return sched.RestartPolicy{Policy: sched.RestartNever}, nil
	case types.RestartPolicyAlways, types.RestartPolicyUnlessStopped:
		return sched.RestartPolicy{Policy: sched.RestartAlways}, nil
	case types.RestartPolicyOnFailure:
		p := sched.RestartPolicy{Policy: sched.RestartOnFailure}
		if n != "" {
			v, err := strconv.Atoi(n)
			if err != nil || v < 0 {
				return p, fmt.Errorf("restart %q: want on-failure[:N]", r)
			}
			p.MaxAttempts = v
		}
		return p, nil
	}
	return sched.RestartPolicy{}, fmt.Errorf("restart %q: want no, always, unless-stopped or on-failure[:N]", r)
}

func deploy(d *types.DeployConfig, spec *sched.ServiceSpec, warn func(string, ...any)) []error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf("deploy: "+format, args...)) }
	switch d.Mode {
	case "", "replicated":
		if d.Replicas != nil {
			spec.Replicas = *d.Replicas
		}
	case "global", "global-job":
		spec.Global, spec.Job, spec.Replicas = true, d.Mode == "global-job", 0
	case "replicated-job":
		// Swarm's stack deploy: replicas completions, all at once.
		spec.Job = true
		if d.Replicas != nil {
			spec.Replicas = *d.Replicas
		}
	default:
		fail("mode %q is not supported (replicated, global, replicated-job or global-job)", d.Mode)
	}
	if len(d.Labels) > 0 {
		spec.Labels = maps.Clone(map[string]string(d.Labels))
	}
	// Shoal reserves what it limits: the limit if there is one, else the
	// reservation.
	for _, r := range []*types.Resource{d.Resources.Reservations, d.Resources.Limits} {
		if r == nil {
			continue
		}
		if r.NanoCPUs > 0 {
			spec.CPUMillis = int64(math.Round(float64(r.NanoCPUs) * 1000))
		}
		if r.MemoryBytes > 0 {
			spec.MemoryBytes = int64(r.MemoryBytes)
		}
		if len(r.Devices) > 0 || len(r.GenericResources) > 0 {
			fail("resources: only cpus, memory and pids are supported")
		}
	}
	if r := d.Resources.Limits; r != nil && r.Pids > 0 {
		spec.PidsLimit = r.Pids
	}
	spec.Constraints = d.Placement.Constraints
	for _, p := range d.Placement.Preferences {
		spec.Preferences = append(spec.Preferences, "spread="+p.Spread)
	}
	spec.MaxPerNode = int(min(d.Placement.MaxReplicas, math.MaxInt32))
	if rp := d.RestartPolicy; rp != nil {
		spec.Restart = sched.RestartPolicy{}
		switch rp.Condition {
		case "", "any":
			spec.Restart.Policy = sched.RestartAlways
		case "on-failure":
			spec.Restart.Policy = sched.RestartOnFailure
		case "none":
			spec.Restart.Policy = sched.RestartNever
		default:
			fail("restart_policy: condition %q: want none, on-failure or any", rp.Condition)
		}
		if rp.Delay != nil {
			spec.Restart.Delay = sched.Duration(*rp.Delay)
		}
		if rp.MaxAttempts != nil {
			spec.Restart.MaxAttempts = int(*rp.MaxAttempts)
		}
		if rp.Window != nil {
			spec.Restart.Window = sched.Duration(*rp.Window)
		}
	}
	if u := d.UpdateConfig; u != nil {
		spec.Update = walkConfig(u, "update_config", fail, warn)
	}
	if u := d.RollbackConfig; u != nil {
		r := walkConfig(u, "rollback_config", fail, warn)
		spec.Rollback = &r
	}
	switch d.EndpointMode {
	case "", "vip", "dnsrr":
	default:
		fail("endpoint_mode %q: want vip or dnsrr", d.EndpointMode)
	}
	return errs
}

func health(h *types.HealthCheckConfig, spec *sched.ServiceSpec) []error {
	cmd, none, err := sched.DockerHealthTest(h.Test)
	switch {
	case err != nil:
		return []error{err}
	case none:
		spec.Health.Disable = true // the image's HEALTHCHECK too
		return nil
	case cmd == nil:
		return nil
	}
	spec.Health.Cmd = cmd
	dur := func(d *types.Duration) sched.Duration {
		if d == nil {
			return 0
		}
		return sched.Duration(time.Duration(*d))
	}
	spec.Health.Interval, spec.Health.Timeout, spec.Health.StartPeriod = dur(h.Interval), dur(h.Timeout), dur(h.StartPeriod)
	if h.Retries != nil {
		spec.Health.Retries = int(*h.Retries)
	}
	return nil
}

// walkConfig maps an update_config or rollback_config (key).
func walkConfig(u *types.UpdateConfig, key string, fail, warn func(string, ...any)) sched.UpdateConfig {
	var c sched.UpdateConfig
	if u.Parallelism != nil {
		// Swarm's 0 is "all at once".
		c.Parallelism = int(min(*u.Parallelism, math.MaxInt32))
		if *u.Parallelism == 0 {
			c.Parallelism = math.MaxInt32
		}
	}
	c.Delay = sched.Duration(u.Delay)
	c.Monitor = sched.Duration(u.Monitor)
	c.Order = sched.UpdateOrder(u.Order)
	switch {
	case u.FailureAction == "" || u.FailureAction == "pause":
		c.FailureAction = sched.ActionPause
	case u.FailureAction == "rollback" && key == "update_config":
		c.FailureAction = sched.ActionRollback
	case u.FailureAction == "continue":
		warn("deploy: %s: failure_action continue is taken as pause (Shoal stops at a failed %s)", key, strings.TrimSuffix(key, "_config"))
		c.FailureAction = sched.ActionPause
	case key == "update_config":
		fail("%s: failure_action %q: want pause or rollback", key, u.FailureAction)
	default:
		fail("%s: failure_action %q: want pause", key, u.FailureAction)
	}
	// compose-go's float32: 0.2 stays 0.2, not 0.20000000298.
	c.MaxFailureRatio, _ = strconv.ParseFloat(strconv.FormatFloat(float64(u.MaxFailureRatio), 'g', -1, 32), 64)
	return c
}

func portOf(p types.ServicePortConfig) (sched.Port, error) {
	name := fmt.Sprintf("port %d", p.Target)
	if p.Published == "" {
		return sched.Port{}, fmt.Errorf("%s: publish it on a port of its own (HOST:%d): Shoal does not pick one", name, p.Target)
	}
	host, err := strconv.Atoi(p.Published)
	if err != nil {
		return sched.Port{}, fmt.Errorf("%s: published %q: port ranges are not supported", name, p.Published)
	}
	if p.HostIP != "" {
		return sched.Port{}, fmt.Errorf("%s: host_ip is not supported (a published port answers on every node address)", name)
	}
	return sched.Port{Host: host, Container: int(p.Target), Protocol: p.Protocol, Mode: p.Mode}, nil
}

// tmpfsOf maps a tmpfs option, "/path" or Docker's "/path:OPTIONS" with
// OPTIONS a comma-separated list of which Shoal takes size= (rw, nosuid
// and nodev it applies anyway).
func tmpfsOf(t string) (string, error) {
	target, opts, _ := strings.Cut(t, ":")
	entry := target
	for _, o := range strings.Split(opts, ",") {
		switch k, v, _ := strings.Cut(o, "="); k {
		case "", "rw", "nosuid", "nodev":
		case "size":
			entry = target + ":" + v
		default:
			return "", fmt.Errorf("tmpfs %s: option %s is not supported (size only)", target, o)
		}
	}
	if _, err := sched.ParseTmpfs(entry); err != nil {
		return "", err
	}
	return entry, nil
}

// bindOf maps a bind mount of a host path: the path on whichever node
// runs the task (a relative one was made absolute from the file's
// directory when the file was read, as docker stack deploy does).
func bindOf(v types.ServiceVolumeConfig) (string, error) {
	if b := v.Bind; b != nil {
		if b.Propagation != "" && b.Propagation != "rprivate" {
			return "", fmt.Errorf("volume %s: bind propagation %s is not supported (binds are rprivate)", v.Target, b.Propagation)
		}
		if b.SELinux != "" {
			return "", fmt.Errorf("volume %s: bind selinux relabelling is not supported", v.Target)
		}
	}
	entry := v.Source + ":" + v.Target
	if v.ReadOnly {
		entry += ":ro"
	}
	if _, err := sched.ParseBind(entry); err != nil {
		return "", err
	}
	return entry, nil
}

func volumeOf(p *types.Project, stack string, v types.ServiceVolumeConfig) (string, Volume, error) {
	if v.Type != types.VolumeTypeVolume {
		return "", Volume{}, fmt.Errorf("volume %s: type %s is not supported (named volumes, binds and tmpfs only)", v.Target, v.Type)
	}
	if v.Source == "" {
		return "", Volume{}, fmt.Errorf("volume %s: anonymous volumes are not supported: name it, and define it under volumes", v.Target)
	}
	vc, ok := p.Volumes[v.Source]
	if !ok {
		return "", Volume{}, fmt.Errorf("volume %s is not defined under volumes", v.Source)
	}
	vol := Volume{Key: v.Source, External: bool(vc.External), Name: vc.Name}
	if vol.Name == "" || vol.Name == p.Name+"_"+v.Source {
		// compose-go's default name; a stack's own volume is stack-KEY.
		vol.Name = stack + "-" + v.Source
		if vol.External {
			vol.Name = v.Source
		}
	}
	if vc.Driver != "" && vc.Driver != "local" && vc.Driver != "shoal" {
		return "", vol, fmt.Errorf("volume %s: driver %q is not supported (Shoal's volumes are replicated by vold)", v.Source, vc.Driver)
	}
	for k, val := range vc.DriverOpts {
		switch k {
		case "size":
			b, err := sched.ParseBytes(val)
			if err != nil || b <= 0 {
				return "", vol, fmt.Errorf("volume %s: driver_opts size %q: want a size such as 512Mi or 2G", v.Source, val)
			}
			vol.SizeBytes = b
		case "replicas":
			n, err := strconv.Atoi(val)
			if err != nil || n < 1 || n > math.MaxInt32 {
				return "", vol, fmt.Errorf("volume %s: driver_opts replicas %q: want 1 or more", v.Source, val)
			}
			vol.Replicas = int32(n)
		default:
			return "", vol, fmt.Errorf("volume %s: driver_opts %s is not supported (size, replicas)", v.Source, k)
		}
	}
	entry := vol.Name + ":" + v.Target
	if v.ReadOnly {
		entry += ":ro"
	}
	if _, err := sched.ParseVolume(entry); err != nil {
		return "", vol, err
	}
	return entry, vol, nil
}

// fileOf maps a service's reference to a secret or config (noun) of
// those the file defines.
func fileOf(project, stack, noun string, ref types.FileReferenceConfig, defined map[string]types.FileObjectConfig, parse func(string) (sched.FileMount, error)) (string, File, error) {
	obj, ok := defined[ref.Source]
	if !ok {
		return "", File{}, fmt.Errorf("%s %s is not defined under %ss", noun, ref.Source, noun)
	}
	f := File{Key: ref.Source, External: bool(obj.External), Name: obj.Name, File: obj.File, Env: obj.Environment, Content: obj.Content}
	if f.Name == "" || f.Name == project+"_"+ref.Source {
		f.Name = stack + "_" + ref.Source
		if f.External {
			f.Name = ref.Source
		}
	}
	if err := secret.ValidName(f.Name); err != nil {
		return "", f, fmt.Errorf("%s %w", noun, err)
	}
	if !f.External && f.File == "" && f.Env == "" && f.Content == "" {
		return "", f, fmt.Errorf("%s %s has no file, environment or content (or mark it external)", noun, ref.Source)
	}
	target := ref.Target
	if target == "" {
		target = ref.Source
	}
	entry := f.Name + ":" + target
	if _, err := parse(entry); err != nil {
		return "", f, err
	}
	return entry, f, nil
}
