// Package units checks the systemd units in systemd/: systemd-analyze
// verify accepts them (against a throw-away root holding the installed
// binaries), no Shoal unit requires or binds to another Shoal daemon,
// so each daemon restarts on its own, and a daemon that crashes is
// started again for a while before its unit is given up.
package units

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

var daemons = []string{"statd", "schedd", "netd", "vold"}

func unitDir(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../../systemd")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestSystemdAnalyzeVerify(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Fatal("systemd-analyze not installed (make deps installs systemd)")
	}
	root := t.TempDir()
	bin := filepath.Join(root, "usr/local/bin")
	etc := filepath.Join(root, "etc/systemd/system")
	for _, d := range []string{bin, etc, filepath.Join(root, "usr/lib/systemd")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// verify resolves dependencies such as sysinit.target against the
	// root, so it needs the distribution's units beside ours.
	if out, err := exec.Command("cp", "-a", "/usr/lib/systemd/system", filepath.Join(root, "usr/lib/systemd/")).CombinedOutput(); err != nil {
		t.Fatalf("copy system units: %v %s", err, out)
	}
	for _, d := range daemons {
		out, err := exec.Command("go", "build", "-o", filepath.Join(bin, "shoal-"+d), "github.com/shoal-dev/shoal/cmd/"+d).CombinedOutput()
		if err != nil {
			t.Fatalf("build %s: %v %s", d, err, out)
		}
	}
	units, _ := filepath.Glob(filepath.Join(unitDir(t), "shoal*"))
	if len(units) != 2*len(daemons)+1 {
		t.Fatalf("want a service and a socket per daemon and shoal.target, found %v", units)
	}
	args := []string{"verify", "--man=no", "--root=" + root}
	for _, u := range units {
		data, err := os.ReadFile(u)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(etc, filepath.Base(u)), data, 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, "/etc/systemd/system/"+filepath.Base(u))
	}
	out, err := exec.Command("systemd-analyze", args...).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

func TestUnitsAreIndependent(t *testing.T) {
	for _, d := range daemons {
		svc := readUnit(t, "shoal-"+d+".service")
		if got := svc["Service.Type"]; got != "notify" {
			t.Errorf("shoal-%s.service Type=%s, want notify", d, got)
		}
		if svc["Service.WatchdogSec"] == "" || svc["Service.Restart"] == "" {
			t.Errorf("shoal-%s.service lacks WatchdogSec or Restart", d)
		}
		for _, key := range []string{"Unit.Requires", "Unit.BindsTo", "Unit.Requisite", "Unit.PartOf"} {
			for _, other := range daemons {
				if strings.Contains(svc[key], "shoal-"+other) {
					t.Errorf("shoal-%s.service %s=%s ties it to shoal-%s", d, key, svc[key], other)
				}
			}
		}
		sock := readUnit(t, "shoal-"+d+".socket")
		if sock["Socket.ListenStream"] != "/run/shoal/"+d+".sock" || sock["Socket.SocketMode"] != "0660" {
			t.Errorf("shoal-%s.socket: %v", d, sock)
		}
	}
	// schedd's tasks run on containerd: ordered after it, never tied to it.
	// Ordered after vold, netd and statd too, so that at shutdown it
	// stops (and stops the tasks, and hands them over through statd)
	// before them.
	schedd := readUnit(t, "shoal-schedd.service")
	if !strings.Contains(schedd["Unit.After"], "containerd.service") || !strings.Contains(schedd["Unit.Wants"], "containerd.service") {
		t.Errorf("shoal-schedd.service After=%s Wants=%s: want containerd.service in both", schedd["Unit.After"], schedd["Unit.Wants"])
	}
	for _, d := range []string{"vold", "netd", "statd"} {
		if !strings.Contains(schedd["Unit.After"], "shoal-"+d+".service") {
			t.Errorf("shoal-schedd.service After=%s: want shoal-%s.service (it stops first at shutdown)", schedd["Unit.After"], d)
		}
	}
	for _, key := range []string{"Unit.Requires", "Unit.BindsTo", "Unit.Requisite", "Unit.PartOf"} {
		if strings.Contains(schedd[key], "containerd") {
			t.Errorf("shoal-schedd.service %s=%s ties it to containerd", key, schedd[key])
		}
	}
	target := readUnit(t, "shoal.target")
	for _, d := range daemons {
		if !strings.Contains(target["Unit.Wants"], "shoal-"+d+".service") {
			t.Errorf("shoal.target does not want shoal-%s.service", d)
		}
	}
}

// TestCrashLoopsAreRetried: a daemon that fails at once is started
// again for at least as long as systemd's default start limit allows with
// 2 s between starts (5 starts in 10 s), before its unit is given up; and
// vold, whose node's mounts wait for it, is started again within a second
// of a crash.
func TestCrashLoopsAreRetried(t *testing.T) {
	dur := func(d, key, v, def string) time.Duration {
		t.Helper()
		if v == "" {
			v = def
		}
		if _, err := strconv.Atoi(v); err == nil {
			v += "s" // systemd's bare numbers are seconds
		}
		x, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("shoal-%s.service %s=%s: %v", d, key, v, err)
		}
		return x
	}
	for _, d := range daemons {
		svc := readUnit(t, "shoal-"+d+".service")
		delay := dur(d, "RestartSec", svc["Service.RestartSec"], "100ms")
		interval := dur(d, "StartLimitIntervalSec", svc["Unit.StartLimitIntervalSec"], "10s")
		burst := 5
		if v := svc["Unit.StartLimitBurst"]; v != "" {
			var err error
			if burst, err = strconv.Atoi(v); err != nil {
				t.Fatalf("shoal-%s.service StartLimitBurst=%s: %v", d, v, err)
			}
		}
		// Starts every delay: the limit stops the burst+1st if the burst
		// fits in the interval.
		if tried := time.Duration(burst) * delay; tried < interval && tried < 10*time.Second {
			t.Errorf("shoal-%s.service gives a crash loop up after %v (RestartSec=%v, %d starts in %v)", d, tried, delay, burst, interval)
		}
		if d == "vold" && delay > time.Second {
			t.Errorf("shoal-vold.service RestartSec=%v: a crash leaves the node's mounts waiting that long", delay)
		}
	}
}

// readUnit returns Section.Key -> values (joined by spaces) of a unit.
func readUnit(t *testing.T, name string) map[string]string {
	t.Helper()
	f, err := os.Open(filepath.Join(unitDir(t), name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "["):
			section = strings.Trim(line, "[]")
		default:
			k, v, _ := strings.Cut(line, "=")
			key := section + "." + k
			out[key] = strings.TrimSpace(out[key] + " " + v)
		}
	}
	return out
}
