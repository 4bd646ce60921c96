package sched

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// DockerHealthTest reads a health check's test as Docker writes it (an
// image's HEALTHCHECK, a Compose file's healthcheck): [NONE] disables the
// check, [CMD, args...] runs args, [CMD-SHELL, command] runs the command
// with sh -c. An empty test is no check of its own (none is false).
func DockerHealthTest(test []string) (cmd []string, none bool, err error) {
	if len(test) == 0 {
		return nil, false, nil
	}
	switch test[0] {
	case "NONE":
		return nil, true, nil
	case "CMD":
		if len(test) > 1 {
			return slices.Clone(test[1:]), false, nil
		}
	case "CMD-SHELL":
		if len(test) > 1 {
			return []string{"sh", "-c", strings.Join(test[1:], " ")}, false, nil
		}
	}
	return nil, false, fmt.Errorf("healthcheck: test %q: want [CMD, ...], [CMD-SHELL, command] or [NONE]", test)
}

// ImageHealthCheck is the health check a task runs when its spec gives
// none and does not disable its image's: the image's HEALTHCHECK (test
// and settings as Docker stores them; zero settings take the defaults),
// or a disabled check if there is none to run.
func (h HealthCheck) ImageHealthCheck(test []string, interval, timeout, startPeriod time.Duration, retries int) HealthCheck {
	if h.Enabled() || h.Disable {
		return h
	}
	cmd, none, err := DockerHealthTest(test)
	if err != nil || none || len(cmd) == 0 {
		return h
	}
	return HealthCheck{Cmd: cmd, Interval: Duration(interval), Timeout: Duration(timeout), StartPeriod: Duration(startPeriod), Retries: retries}
}
