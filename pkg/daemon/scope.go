package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
)

// ErrNoSystemd says systemd is not this machine's PID 1 (or does not
// answer on its private socket).
var ErrNoSystemd = errors.New("systemd is not PID 1 here")

// OwnScope moves process pid, which a daemon started to outlive it (a
// holder of files the kernel keeps a session or a device alive for), out
// of the daemon's unit into a transient scope of its own,
// "<prefix>-<pid>.scope" in system.slice. Left in the unit's control
// group, such a process is what systemd warns about at every stop of the
// unit ("left-over process ... remains running"), lists as the stopped
// unit's, and only KillMode=process keeps alive. systemd stops the scope
// by itself once its process exits.
//
// The scope is ordered before the units in before: at shutdown it stops
// after them (the daemon and those that use what the process holds), as
// the process did when KillMode=process left it to systemd's last kill.
//
// It asks PID 1 over its private socket; where systemd is not PID 1 (a
// development cluster, a container without it) there is nothing to move
// the process out of, and it returns ErrNoSystemd.
func OwnScope(ctx context.Context, pid int, prefix, description string, before ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := sddbus.NewSystemdConnectionContext(ctx)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrNoSystemd, err)
	}
	defer conn.Close()
	name := prefix + "-" + strconv.Itoa(pid) + ".scope"
	done := make(chan string, 1)
	props := []sddbus.Property{
		sddbus.PropDescription(description),
		sddbus.PropSlice("system.slice"),
		sddbus.PropPids(uint32(pid)),
	}
	if len(before) > 0 {
		props = append(props, sddbus.Property{Name: "Before", Value: godbus.MakeVariant(before)})
	}
	if _, err := conn.StartTransientUnitContext(ctx, name, "fail", props, done); err != nil {
		return "", fmt.Errorf("start scope %s: %w", name, err)
	}
	select {
	case res := <-done:
		if res != "done" {
			return "", fmt.Errorf("start scope %s: job %s", name, res)
		}
		return name, nil
	case <-ctx.Done():
		return "", fmt.Errorf("start scope %s: %w", name, ctx.Err())
	}
}

// MoveToOwnScope is OwnScope for a daemon that goes on either way: the
// process stays in the daemon's unit (where KillMode=process keeps it
// alive) when it cannot move, which it logs.
func MoveToOwnScope(log *slog.Logger, pid int, prefix, description string, before ...string) {
	scope, err := OwnScope(context.Background(), pid, prefix, description, before...)
	switch {
	case errors.Is(err, ErrNoSystemd):
		log.Debug("holder stays in this daemon's control group: no systemd", "pid", pid)
	case err != nil:
		log.Warn("holder stays in this daemon's control group", "pid", pid, "err", err)
	default:
		log.Info("holder runs in a scope of its own", "pid", pid, "scope", scope)
	}
}
