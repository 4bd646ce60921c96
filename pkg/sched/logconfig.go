package sched

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"

	units "github.com/docker/go-units"
)

// LogConfig chooses what becomes of a service's task output.
type LogConfig struct {
	// Driver is "" (the task's log on its node, written by shoal-logger:
	// what `task logs` and `service logs` read) or LogDriverNone (the
	// output is discarded).
	Driver string `json:"driver,omitempty"`
	// MaxSize and MaxFiles replace the node's rotation of the task's log
	// (schedd's log_max_size and log_max_files) when set: the file is
	// rotated at MaxSize bytes and MaxFiles files are kept, the current
	// one included.
	MaxSize  int64 `json:"max_size,omitempty"`
	MaxFiles int   `json:"max_files,omitempty"`
}

// LogDriverNone discards a task's output.
const LogDriverNone = "none"

// The bounds of LogConfig's rotation (those of pkg/tasklog's Limits).
const (
	minLogSize  = 4096
	maxLogFiles = 100
)

func (l LogConfig) check() error {
	var errs []error
	switch l.Driver {
	case "":
	case LogDriverNone:
		if l.MaxSize != 0 || l.MaxFiles != 0 {
			errs = append(errs, errors.New("log driver none keeps nothing: its output has no max-size or max-file"))
		}
	default:
		errs = append(errs, fmt.Errorf("log driver %q: want json-file (the task's log on its node) or none", l.Driver))
	}
	if l.MaxSize != 0 && l.MaxSize < minLogSize {
		errs = append(errs, fmt.Errorf("log max-size %d: want at least %d bytes", l.MaxSize, minLogSize))
	}
	if l.MaxFiles < 0 || l.MaxFiles > maxLogFiles {
		errs = append(errs, fmt.Errorf("log max-file %d: want 1 to %d", l.MaxFiles, maxLogFiles))
	}
	return errors.Join(errs...)
}

// ParseLogConfig reads Docker's --log-driver and --log-opt options:
// json-file and local (Docker's drivers that keep the log on the node)
// are Shoal's task log, none discards the output; max-size (10m, 512k)
// and max-file are the options. Unknown drivers and options are errors,
// so that a caller (a Compose file's conversion) can warn and go on.
func ParseLogConfig(driver string, opts map[string]string) (LogConfig, error) {
	var l LogConfig
	var errs []error
	switch driver {
	case "", "json-file", "local":
	case LogDriverNone:
		l.Driver = LogDriverNone
	default:
		return LogConfig{}, fmt.Errorf("log driver %q is not supported: Shoal keeps a task's log on its node (json-file, local) or discards it (none)", driver)
	}
	for _, k := range slices.Sorted(maps.Keys(opts)) {
		v := opts[k]
		switch k {
		case "max-size":
			n, err := units.RAMInBytes(v)
			if err != nil || n <= 0 {
				errs = append(errs, fmt.Errorf("log option max-size=%s: want a size such as 10m or 512k", v))
				continue
			}
			l.MaxSize = n
		case "max-file":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				errs = append(errs, fmt.Errorf("log option max-file=%s: want a count of files, at least 1", v))
				continue
			}
			l.MaxFiles = n
		default:
			errs = append(errs, fmt.Errorf("log option %q is not supported: want max-size or max-file", k))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return LogConfig{}, err
	}
	return l, l.check()
}
