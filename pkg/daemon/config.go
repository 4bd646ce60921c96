package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"time"

	units "github.com/docker/go-units"
	"github.com/pelletier/go-toml/v2"
	"github.com/spf13/pflag"
)

// Common is the configuration every daemon has. Daemon configs embed it
// anonymously, so its keys sit at the top level of the TOML file beside the
// daemon's own.
type Common struct {
	// StateDir holds the daemon's persistent state.
	StateDir string `toml:"state_dir"`
	// RunDir holds the local sockets of all daemons on the node.
	RunDir string `toml:"run_dir"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `toml:"log_level"`
	// LogFormat is text or json.
	LogFormat string `toml:"log_format"`
	// MetricsAddr is the loopback host:port of the Prometheus endpoint;
	// empty disables it.
	MetricsAddr string `toml:"metrics_addr"`
	// DebugPprof also serves Go's profiler (/debug/pprof/) on the metrics
	// listener, which must then be a loopback address: profiles show
	// memory and stack contents, and collecting one costs CPU.
	DebugPprof bool `toml:"debug_pprof"`
}

// Default paths. Every one is overridable so several nodes can share a
// machine (each in its own network namespace) in dev clusters and tests.
const (
	DefaultStateRoot = "/var/lib/shoal"
	DefaultRunDir    = "/run/shoal"
	DefaultConfigDir = "/etc/shoal"
)

// Configurable is implemented by daemon configs: every config embeds Common.
type Configurable interface{ common() *Common }

func (c *Common) common() *Common { return c }

// defaultCommon returns the defaults for the named daemon.
func defaultCommon(name string, metricsPort int) Common {
	c := Common{
		StateDir:  filepath.Join(DefaultStateRoot, name),
		RunDir:    DefaultRunDir,
		LogLevel:  "info",
		LogFormat: "text",
	}
	if metricsPort > 0 {
		c.MetricsAddr = fmt.Sprintf("127.0.0.1:%d", metricsPort)
	}
	return c
}

func bindCommonFlags(fs *pflag.FlagSet, c *Common, configPath *string, name string) {
	fs.StringVar(configPath, "config", filepath.Join(DefaultConfigDir, name+".toml"),
		"TOML config file (a missing file at the default path is ignored; empty for none)")
	fs.StringVar(&c.StateDir, "state-dir", c.StateDir, "directory for persistent state")
	fs.StringVar(&c.RunDir, "run-dir", c.RunDir, "directory for the local sockets of all Shoal daemons")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "log level: debug, info, warn, error")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "log format: text, json")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", c.MetricsAddr, "host:port for Prometheus metrics (empty disables)")
	fs.BoolVar(&c.DebugPprof, "debug-pprof", c.DebugPprof, "also serve Go's profiler at /debug/pprof/ on the metrics address (loopback only)")
}

// loadConfig decodes the TOML file at path into cfg, strictly: unknown
// keys and type mismatches are errors that name the file and the key.
// Flags given on the command line win over the file, so they are re-applied
// after decoding.
func loadConfig(fs *pflag.FlagSet, path string, explicit bool, cfg any) error {
	if path == "" {
		return nil
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) && !explicit {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	// Remember what the command line said before the file overwrites it.
	type flagVal struct {
		f   *pflag.Flag
		val string
	}
	var given []flagVal
	fs.Visit(func(f *pflag.Flag) { given = append(given, flagVal{f, f.Value.String()}) })

	dec := toml.NewDecoder(bytes.NewReader(data)).DisallowUnknownFields()
	if err := dec.Decode(cfg); err != nil {
		var sm *toml.StrictMissingError
		if errors.As(err, &sm) {
			return fmt.Errorf("config %s: unknown keys:\n%s", path, sm.String())
		}
		var de *toml.DecodeError
		if errors.As(err, &de) {
			row, col := de.Position()
			return fmt.Errorf("config %s:%d:%d: %s", path, row, col, de.Error())
		}
		return fmt.Errorf("config %s: %w", path, err)
	}
	for _, g := range given {
		if g.f.Name == "config" {
			continue
		}
		if err := g.f.Value.Set(g.val); err != nil {
			return fmt.Errorf("flag --%s: %w", g.f.Name, err)
		}
	}
	return nil
}

// DumpConfig renders cfg as TOML, for --print-config.
func DumpConfig(cfg any) (string, error) {
	v := reflect.ValueOf(cfg)
	if v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	b, err := toml.Marshal(v.Interface())
	return string(b), err
}

// Duration is a time.Duration written as "500ms" or "2m" in TOML files and
// flags.
type Duration time.Duration

// UnmarshalText implements encoding.TextUnmarshaler (TOML).
func (d *Duration) UnmarshalText(b []byte) error { return d.Set(string(b)) }

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// Set implements pflag.Value.
func (d *Duration) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration %q: want e.g. 500ms, 10s, 2m", s)
	}
	*d = Duration(v)
	return nil
}

// String implements pflag.Value.
func (d Duration) String() string { return time.Duration(d).String() }

// Type implements pflag.Value.
func (d Duration) Type() string { return "duration" }

// Size is a number of bytes written as "10MiB", "512k" or "1048576" in
// TOML files and flags (binary units, as Docker's --log-opt max-size).
type Size int64

// UnmarshalText implements encoding.TextUnmarshaler (TOML).
func (s *Size) UnmarshalText(b []byte) error { return s.Set(string(b)) }

// MarshalText implements encoding.TextMarshaler.
func (s Size) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Set implements pflag.Value.
func (s *Size) Set(v string) error {
	n, err := units.RAMInBytes(v)
	if err != nil || n < 0 {
		return fmt.Errorf("size %q: want e.g. 10MiB, 512k, 1048576", v)
	}
	*s = Size(n)
	return nil
}

// String implements pflag.Value: exact, in the largest binary unit that
// divides it.
func (s Size) String() string {
	for _, u := range []struct {
		suffix string
		n      Size
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if s != 0 && s%u.n == 0 {
			return fmt.Sprintf("%d%s", s/u.n, u.suffix)
		}
	}
	return fmt.Sprintf("%d", int64(s))
}

// Type implements pflag.Value.
func (s Size) Type() string { return "size" }
