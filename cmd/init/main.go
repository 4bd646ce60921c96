// Command shoal-init is the PID 1 of tasks started with --init: see
// package taskinit.
package main

import (
	"os"

	"github.com/shoal-dev/shoal/pkg/taskinit"
)

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	os.Exit(taskinit.Run(args, os.Stderr))
}
