// Package schedd wires shoal-schedd, which will own services and tasks on containerd.
// For now it runs in the shared daemon runtime only: it starts, serves
// grpc.health.v1, reflection and shoal.daemon.v1 Info on its socket, and
// exits cleanly on SIGTERM.
package schedd

import (
	"context"

	"github.com/shoal-dev/shoal/pkg/daemon"
)

// Config is shoal-schedd's configuration (/etc/shoal/schedd.toml).
type Config struct {
	daemon.Common
}

// Spec describes shoal-schedd to the daemon runtime.
func Spec() daemon.Spec {
	return daemon.Spec{
		Name:  "schedd",
		Short: "Shoal schedd (placeholder: health and status only)",
		Long: `shoal-schedd will own services and tasks on containerd.

In this version it only starts, serves health (grpc.health.v1), reflection
and status (shoal.daemon.v1 Info) on <run-dir>/schedd.sock, and exits cleanly
on SIGTERM. It does nothing else yet.`,
		MetricsPort: 9462,
		Config:      func(c daemon.Common) daemon.Configurable { return &Config{Common: c} },
		Start: func(context.Context, *daemon.Runtime) (func(context.Context) error, error) {
			return func(context.Context) error { return nil }, nil
		},
	}
}

// Main runs shoal-schedd.
func Main(args []string) int { return daemon.Main(Spec(), args) }
