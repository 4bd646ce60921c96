package daemon

import (
	"context"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
)

// SystemStopping reports whether this machine's systemd is shutting it
// down: its SystemState is "stopping" while a poweroff, reboot or halt is
// under way (shutdown.target is queued or active), and never when only a
// unit is stopped or restarted. It asks PID 1 over its private socket, so
// no D-Bus daemon is needed. It is false where systemd is not PID 1, or
// does not answer within a second.
func SystemStopping(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	conn, err := sddbus.NewSystemdConnectionContext(ctx)
	if err != nil {
		return false
	}
	defer conn.Close()
	p, err := conn.SystemStateContext(ctx)
	if err != nil {
		return false
	}
	s, _ := p.Value.Value().(string)
	return s == "stopping"
}
