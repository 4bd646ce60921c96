// Package daemon is the runtime every Shoal daemon runs in.
//
// A daemon describes itself with a Spec (name, help, its own config struct
// and flags, and a Start function). Main then does everything daemons share,
// in this order:
//
//  1. flags and a strict TOML config (unknown keys are errors), with
//     precedence defaults < config file < flags given on the command line;
//  2. a log/slog logger on stderr (without timestamps under journald,
//     which adds its own);
//  3. an exclusive lock on the state dir, so a second daemon on the same
//     state refuses to start instead of corrupting it;
//  4. a gRPC server with grpc.health.v1, server reflection and the
//     shoal.daemon.v1 Info service, and Prometheus metrics on a loopback
//     HTTP port;
//  5. Start: the daemon loads its state and registers its services;
//  6. the Unix socket: taken from systemd socket activation when LISTEN_FDS
//     is set, created (mode 0660) otherwise; then health SERVING and
//     sd_notify READY=1, and WATCHDOG=1 pings when WATCHDOG_USEC is set,
//     each only after the daemon's Runtime.Liveness check (if any) passed;
//  7. on SIGTERM/SIGINT: STOPPING=1, health NOT_SERVING, a graceful gRPC
//     stop bounded in time, then the daemon's own stop function.
package daemon
