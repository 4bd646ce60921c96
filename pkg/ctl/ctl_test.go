package ctl

import (
	"errors"
	"fmt"
	"slices"
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

// A command given several names does them all, prints each failure once,
// and exits with the first failure's status; with one name, its error is
// the command's.
func TestEachName(t *testing.T) {
	var out, errOut strings.Builder
	a := &app{out: &out, errOut: &errOut}
	var done []string
	fn := func(name string) error {
		switch name {
		case "missing":
			return notFoundError{fmt.Errorf("%s does not exist", name)}
		case "busy":
			return fmt.Errorf("%s is in use", name)
		}
		done = append(done, name)
		return nil
	}
	err := a.eachName([]string{"a", "missing", "b", "busy"}, fn)
	var ee exitError
	if !errors.As(err, &ee) || ee.code != exitNotFound {
		t.Fatalf("eachName = %v, want the first failure's status %d", err, exitNotFound)
	}
	if !slices.Equal(done, []string{"a", "b"}) {
		t.Errorf("done %v, want a and b", done)
	}
	if errOut.String() != "error: missing does not exist\nerror: busy is in use\n" {
		t.Errorf("stderr %q", errOut.String())
	}
	if err := a.eachName([]string{"busy"}, fn); err == nil || errors.As(err, &ee) {
		t.Errorf("one name: eachName = %#v, want its own error", err)
	}
	if err := a.eachName([]string{"a", "b"}, fn); err != nil {
		t.Errorf("no failure: eachName = %v", err)
	}
}
