package ctl

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/shoal-dev/shoal/pkg/sched"
)

// dockerAliases are `docker service create` flag names that mean the
// same as one of shoalctl's, so that a Swarm user's commands and scripts
// run as they are.
var dockerAliases = map[string]string{
	"stop-grace-period": "stop-grace",
	"restart-condition": "restart",
}

// normalizeDockerNames makes dockerAliases' names work on fs.
func normalizeDockerNames(fs *pflag.FlagSet) {
	fs.SetNormalizeFunc(func(_ *pflag.FlagSet, name string) pflag.NormalizedName {
		if to, ok := dockerAliases[name]; ok {
			return pflag.NormalizedName(to)
		}
		return pflag.NormalizedName(name)
	})
}

// dockerRestart maps Docker's restart conditions to Shoal's policies.
func dockerRestart(s string) string {
	switch s {
	case "any":
		return string(sched.RestartAlways)
	case "none":
		return string(sched.RestartNever)
	}
	return s
}

// oneValue reads a resource given by any of several flags (Shoal's
// --cpu, Docker's --limit-cpu and --reserve-cpu): Shoal reserves what it
// limits, so every value given must be the same. ok is false when none
// was given.
func oneValue(fs *pflag.FlagSet, names []string, values []string, parse func(string) (int64, error)) (v int64, ok bool, err error) {
	first := -1 // the first flag given
	for i, name := range names {
		if !fs.Changed(name) {
			continue
		}
		x, err := parse(values[i])
		if err != nil {
			return 0, false, err
		}
		if first >= 0 && x != v {
			return 0, false, fmt.Errorf("--%s %s and --%s %s differ: Shoal reserves what it limits, give one value", names[first], values[first], name, values[i])
		}
		if first < 0 {
			first = i
		}
		v, ok = x, true
	}
	return v, ok, nil
}

// parseMount reads Docker's --mount for what Shoal mounts: a replicated
// volume (type=volume, the default), a host path (type=bind) or a tmpfs,
// as an entry of --volume, --bind or --tmpfs (kind).
func parseMount(s string) (kind, entry string, err error) {
	kind = "volume"
	var src, dst, size string
	readOnly := false
	for _, field := range strings.Split(s, ",") {
		k, v, hasValue := strings.Cut(field, "=")
		switch strings.ToLower(k) {
		case "type":
			kind = v
		case "source", "src":
			src = v
		case "target", "destination", "dst":
			dst = v
		case "readonly", "ro":
			if !hasValue {
				readOnly = true
				break
			}
			b, perr := strconv.ParseBool(v)
			if perr != nil {
				return "", "", fmt.Errorf("--mount %q: readonly=%s: want true or false", s, v)
			}
			readOnly = b
		case "tmpfs-size":
			size = v
		case "volume-driver", "volume-opt", "volume-label", "volume-nocopy", "tmpfs-mode", "consistency", "bind-propagation", "bind-recursive":
			return "", "", fmt.Errorf("--mount %q: %s is not supported (Shoal's volumes are its own replicated volumes: see shoalctl volume create; binds are recursive and private)", s, k)
		default:
			return "", "", fmt.Errorf("--mount %q: unknown field %q: want type, source, target, readonly or tmpfs-size", s, k)
		}
	}
	if dst == "" {
		return "", "", fmt.Errorf("--mount %q: target is missing", s)
	}
	mode := ""
	if readOnly {
		mode = ":ro"
	}
	switch kind {
	case "volume":
		if src == "" {
			return "", "", fmt.Errorf("--mount %q: a volume needs its source (Shoal makes no anonymous volumes)", s)
		}
		return kind, src + ":" + dst + mode, nil
	case "bind":
		if src == "" {
			return "", "", fmt.Errorf("--mount %q: a bind needs its source, a path on the task's node", s)
		}
		return kind, src + ":" + dst + mode, nil
	case "tmpfs":
		if src != "" || readOnly {
			return "", "", fmt.Errorf("--mount %q: a tmpfs has no source and is writable", s)
		}
		if size != "" {
			dst += ":" + size
		}
		return kind, dst, nil
	}
	return "", "", fmt.Errorf("--mount %q: type %q: want volume, bind or tmpfs", s, kind)
}

// parseLongPublish reads Docker's long --publish syntax:
// published=8080,target=80[,protocol=udp][,mode=ingress|host].
func parseLongPublish(s string) (sched.Port, error) {
	var p sched.Port
	bad := func(format string, args ...any) (sched.Port, error) {
		return sched.Port{}, fmt.Errorf("--publish %q: "+format, append([]any{s}, args...)...)
	}
	for _, field := range strings.Split(s, ",") {
		k, v, _ := strings.Cut(field, "=")
		switch k {
		case "published":
			n, err := strconv.Atoi(v)
			if err != nil {
				return bad("published=%s: want a port", v)
			}
			p.Host = n
		case "target":
			n, err := strconv.Atoi(v)
			if err != nil {
				return bad("target=%s: want a port", v)
			}
			p.Container = n
		case "protocol":
			p.Protocol = v
		case "mode":
			if v != "ingress" && v != "host" {
				return bad("mode=%s: want ingress (every node) or host (the task's node)", v)
			}
			p.Mode = v
		default:
			return bad("unknown field %q: want published, target, protocol or mode", k)
		}
	}
	if p.Host == 0 || p.Container == 0 {
		return bad("want published=HOST,target=CONTAINER")
	}
	return p, nil
}

// longFileMount reads Docker's long --secret/--config syntax
// (source=NAME[,target=PATH][,uid=…,gid=…,mode=…]) as Shoal's NAME or
// NAME:TARGET. A task's secret and config files are root's with mode
// 0444, so other ownership or modes are reported as ignored.
func longFileMount(flag, s string) (entry, ignored string, err error) {
	if !strings.Contains(s, "=") {
		return s, "", nil
	}
	var src, dst string
	var dropped []string
	for _, field := range strings.Split(s, ",") {
		k, v, _ := strings.Cut(field, "=")
		switch k {
		case "source", "src":
			src = v
		case "target", "dst", "destination":
			dst = v
		case "uid", "gid":
			if v != "0" {
				dropped = append(dropped, field)
			}
		case "mode":
			if m, err := strconv.ParseUint(v, 8, 32); err != nil || m != 0o444 {
				dropped = append(dropped, field)
			}
		default:
			return "", "", fmt.Errorf("--%s %q: unknown field %q: want source, target, uid, gid or mode", flag, s, k)
		}
	}
	if src == "" {
		return "", "", fmt.Errorf("--%s %q: source is missing", flag, s)
	}
	entry = src
	if dst != "" {
		entry += ":" + dst
	}
	if len(dropped) > 0 {
		ignored = fmt.Sprintf("--%s %s: %s ignored (the file is root's, mode 0444)", flag, src, strings.Join(dropped, ","))
	}
	return entry, ignored, nil
}
