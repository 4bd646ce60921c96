// Package e2e holds end-to-end tests that run the real Shoal binaries as
// separate processes: kill -9 and restarts, socket activation, sd_notify,
// the CLI's exit codes, and the systemd units under a real systemd booted
// in systemd-nspawn from $SHOAL_NSPAWN_ROOT (make e2e prepares it and
// sets it; without it that test is skipped). Binaries come from
// $SHOAL_BIN_DIR (make e2e sets it) or are built into a temporary
// directory.
package e2e
