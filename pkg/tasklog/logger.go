package tasklog

import (
	"context"
	"flag"
	"io"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/core/runtime/v2/logging"
)

// LoggerArgs are the arguments shoal-logger takes, as a map for
// containerd's binary logging URI (cio.BinaryIO): the shim passes each
// key and its value as two arguments, in no set order, so every key is a
// flag.
func LoggerArgs(path string, limits Limits) map[string]string {
	return map[string]string{
		"--path":      path,
		"--max-size":  strconv.FormatInt(limits.MaxSize, 10),
		"--max-files": strconv.Itoa(limits.MaxFiles),
	}
}

// drainGrace is how long a logger told to stop (the shim's SIGTERM, sent
// once the task's pipes are closed on its side) still copies what the
// pipes hold.
const drainGrace = 2 * time.Second

// Logger is shoal-logger's work, for containerd's logging.Run: it copies
// the task's stdout and stderr to the log at --path until both end.
// Whatever goes wrong, it reads the pipes to their end: a task whose
// output pipe has no reader gets SIGPIPE at its next write, so a log it
// cannot write loses the output, never the task.
func Logger(args []string) logging.LoggerFunc {
	return func(ctx context.Context, cfg *logging.Config, ready func() error) error {
		// One task's output needs little: keep the process small, as
		// there is one per task.
		runtime.GOMAXPROCS(1)
		debug.SetGCPercent(25)
		var w *File
		fs := flag.NewFlagSet("shoal-logger", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		path := fs.String("path", "", "log file")
		limits := DefaultLimits
		fs.Int64Var(&limits.MaxSize, "max-size", limits.MaxSize, "rotate at this many bytes")
		fs.IntVar(&limits.MaxFiles, "max-files", limits.MaxFiles, "files kept, the current one included")
		var setupErr error
		if setupErr = fs.Parse(args); setupErr == nil {
			w, setupErr = Create(*path, limits, nil)
		}
		if err := ready(); err != nil {
			return err
		}
		var wg sync.WaitGroup
		for stream, r := range map[string]io.Reader{Stdout: cfg.Stdout, Stderr: cfg.Stderr} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if w == nil {
					io.Copy(io.Discard, r)
					return
				}
				w.Copy(stream, r)
			}()
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			select {
			case <-done:
			case <-time.After(drainGrace):
			}
		}
		if w != nil {
			w.Close()
		}
		return setupErr
	}
}
