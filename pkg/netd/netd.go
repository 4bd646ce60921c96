// Package netd wires shoal-netd, which will own the WireGuard overlay, task networking, service DNS and published ports.
// For now it runs in the shared daemon runtime only: it starts, serves
// grpc.health.v1, reflection and shoal.daemon.v1 Info on its socket, and
// exits cleanly on SIGTERM.
package netd

import (
	"context"

	"github.com/shoal-dev/shoal/pkg/daemon"
)

// Config is shoal-netd's configuration (/etc/shoal/netd.toml).
type Config struct {
	daemon.Common
}

// Spec describes shoal-netd to the daemon runtime.
func Spec() daemon.Spec {
	return daemon.Spec{
		Name:  "netd",
		Short: "Shoal netd (placeholder: health and status only)",
		Long: `shoal-netd will own the WireGuard overlay, task networking, service DNS and published ports.

In this version it only starts, serves health (grpc.health.v1), reflection
and status (shoal.daemon.v1 Info) on <run-dir>/netd.sock, and exits cleanly
on SIGTERM. It does nothing else yet.`,
		MetricsPort: 9463,
		Config:      func(c daemon.Common) daemon.Configurable { return &Config{Common: c} },
		Start: func(context.Context, *daemon.Runtime) (func(context.Context) error, error) {
			return func(context.Context) error { return nil }, nil
		},
	}
}

// Main runs shoal-netd.
func Main(args []string) int { return daemon.Main(Spec(), args) }
