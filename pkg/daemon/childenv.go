package daemon

import (
	"slices"
	"strings"
)

// ServiceManagerEnv names the variables by which systemd talks to a
// service's main process: sd_notify's socket, the watchdog, and socket
// activation. A helper process a daemon starts must not inherit them: it
// would be a second process notifying, or owning the activated sockets,
// on the service's behalf.
var ServiceManagerEnv = []string{"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"}

// ChildEnv returns env (KEY=value entries) without ServiceManagerEnv and
// the names in drop, as a new slice.
func ChildEnv(env []string, drop ...string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return slices.Contains(ServiceManagerEnv, k) || slices.Contains(drop, k)
	})
}
