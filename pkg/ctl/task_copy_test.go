package ctl

import (
	"strings"
	"testing"
)

// TestSplitTaskPath: TASK:PATH as docker cp reads it; a local path with
// a ':' is written with "/" or "./" in front.
func TestSplitTaskPath(t *testing.T) {
	for _, c := range []struct {
		arg, task, path string
		ok              bool
	}{
		{"web.1:/etc/conf", "web.1", "/etc/conf", true},
		{"web.1:", "web.1", "/", true},
		{"web.1:rel", "web.1", "rel", true},
		{"./a:b", "", "", false},
		{"/tmp/a:b", "", "", false},
		{"plain", "", "", false},
		{":/x", "", "", false},
		{"-", "", "", false},
	} {
		task, path, ok := splitTaskPath(c.arg)
		if task != c.task || path != c.path || ok != c.ok {
			t.Errorf("splitTaskPath(%q) = %q, %q, %v", c.arg, task, path, ok)
		}
	}
}

// TestTaskCopyUsage: two tasks, or none, is a usage error (exit 2) that
// reaches no daemon.
func TestTaskCopyUsage(t *testing.T) {
	for _, args := range [][]string{
		{"task", "cp", "a.1:/x", "b.1:/y"},
		{"cp", "./here", "./there"},
		{"cp", "a.1:/x"},
	} {
		_, errOut, code := ctlRun(t, append([]string{"--run-dir", t.TempDir()}, args...)...)
		if code != 2 || errOut == "" || strings.Contains(errOut, "connect") {
			t.Errorf("%v: exit %d, %q", args, code, errOut)
		}
	}
}
