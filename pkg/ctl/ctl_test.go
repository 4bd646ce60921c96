package ctl

import (
	"strings"
	"testing"
)

// Cobra's own checks (arguments, required flags, subcommands) end with
// the usage status, as shoalctl's help promises, before any daemon is
// called: the run directory here has no sockets.
func TestUsageMistakesExitWithUsageStatus(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"volume", "create"}, "accepts 1 arg(s), received 0"},
		{[]string{"volume", "create", "a", "b"}, "accepts 1 arg(s), received 2"},
		{[]string{"service", "scale"}, "requires at least 1 arg(s)"},
		{[]string{"lock", "release", "deploy"}, `required flag(s) "token" not set`},
		{[]string{"volume", "nosuch"}, `unknown command "nosuch" for "shoalctl volume"`},
		{[]string{"nosuch"}, `unknown command "nosuch" for "shoalctl"`},
		{[]string{"volume", "create", "v", "--nosuch"}, "unknown flag: --nosuch"},
	} {
		out, errOut, code := ctlRun(t, append([]string{"--run-dir", dir}, tc.args...)...)
		if code != exitUsage || !strings.Contains(errOut, tc.msg) || out != "" {
			t.Errorf("shoalctl %s: exit %d, stdout %q, stderr %q; want exit %d and %q", strings.Join(tc.args, " "), code, out, errOut, exitUsage, tc.msg)
		}
	}
	// A group command alone still shows its help, successfully.
	for _, args := range [][]string{{"volume"}, {}, {"volume", "--help"}} {
		out, errOut, code := ctlRun(t, append([]string{"--run-dir", dir}, args...)...)
		if code != exitOK || !strings.Contains(out, "Usage:") || errOut != "" {
			t.Errorf("shoalctl %s: exit %d, stdout %q, stderr %q; want its help", strings.Join(args, " "), code, out, errOut)
		}
	}
}
