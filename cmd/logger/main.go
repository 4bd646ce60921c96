// Command shoal-logger writes one task's output to its log: containerd's
// shim starts it for each task schedd runs (containerd's binary logging),
// so that logs are kept while schedd restarts. See package tasklog.
package main

import (
	"os"

	"github.com/containerd/containerd/v2/core/runtime/v2/logging"
	"github.com/shoal-dev/shoal/pkg/tasklog"
)

func main() { logging.Run(tasklog.Logger(os.Args[1:])) }
