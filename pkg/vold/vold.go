// Package vold wires shoal-vold, which will own replicated volumes on multi-Raft and the lock API.
// For now it runs in the shared daemon runtime only: it starts, serves
// grpc.health.v1, reflection and shoal.daemon.v1 Info on its socket, and
// exits cleanly on SIGTERM.
package vold

import (
	"context"

	"github.com/shoal-dev/shoal/pkg/daemon"
)

// Config is shoal-vold's configuration (/etc/shoal/vold.toml).
type Config struct {
	daemon.Common
}

// Spec describes shoal-vold to the daemon runtime.
func Spec() daemon.Spec {
	return daemon.Spec{
		Name:  "vold",
		Short: "Shoal vold (placeholder: health and status only)",
		Long: `shoal-vold will own replicated volumes on multi-Raft and the lock API.

In this version it only starts, serves health (grpc.health.v1), reflection
and status (shoal.daemon.v1 Info) on <run-dir>/vold.sock, and exits cleanly
on SIGTERM. It does nothing else yet.`,
		MetricsPort: 9464,
		Config:      func(c daemon.Common) daemon.Configurable { return &Config{Common: c} },
		Start: func(context.Context, *daemon.Runtime) (func(context.Context) error, error) {
			return func(context.Context) error { return nil }, nil
		},
	}
}

// Main runs shoal-vold.
func Main(args []string) int { return daemon.Main(Spec(), args) }
