package sched_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/sched"
)

func validSpec() sched.ServiceSpec {
	return sched.ServiceSpec{Name: "web", Image: "local/busybox:latest", Replicas: 3}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*sched.ServiceSpec)
		want   string // substring of the error; "" for valid
	}{
		{"minimal", func(*sched.ServiceSpec) {}, ""},
		{"zero replicas is a scale", func(s *sched.ServiceSpec) { s.Replicas = 0 }, ""},
		{"global", func(s *sched.ServiceSpec) { s.Replicas, s.Global = 0, true }, ""},
		{"everything", func(s *sched.ServiceSpec) {
			s.Env = []string{"A=1", "B="}
			s.CPUMillis, s.MemoryBytes = 500, 512<<20
			s.Constraints = []string{"node.labels.zone==eu", "node.hostname != n2"}
			s.Placement = sched.Binpack
			s.Restart = sched.RestartPolicy{Policy: sched.RestartOnFailure, MaxAttempts: 3, Delay: sched.Duration(time.Second)}
			s.Health = sched.HealthCheck{Cmd: []string{"true"}, Retries: 2}
			s.Update = sched.UpdateConfig{Parallelism: 2, Order: sched.StartFirst, FailureAction: sched.ActionRollback}
			s.Ports = []sched.Port{{Host: 8080, Container: 80}, {Host: 8080, Container: 80, Protocol: "udp"}}
		}, ""},
		{"replicated job", func(s *sched.ServiceSpec) { s.Job, s.MaxConcurrent = true, 2 }, ""},
		{"image check disabled", func(s *sched.ServiceSpec) { s.Health.Disable = true }, ""},
		{"check disabled and given", func(s *sched.ServiceSpec) { s.Health = sched.HealthCheck{Disable: true, TCP: 80} }, "a check is given and disabled"},
		{"rollback settings", func(s *sched.ServiceSpec) { s.Rollback = &sched.UpdateConfig{Parallelism: 2, Order: sched.StartFirst} }, ""},
		{"rollback that rolls back", func(s *sched.ServiceSpec) { s.Rollback = &sched.UpdateConfig{FailureAction: sched.ActionRollback} },
			`rollback failure action "rollback" is unknown: use pause`},
		{"log rotation", func(s *sched.ServiceSpec) { s.Log = sched.LogConfig{MaxSize: 1 << 20, MaxFiles: 2} }, ""},
		{"log discarded", func(s *sched.ServiceSpec) { s.Log.Driver = sched.LogDriverNone }, ""},
		{"log driver unknown", func(s *sched.ServiceSpec) { s.Log.Driver = "syslog" }, `log driver "syslog": want json-file`},
		{"log file too small", func(s *sched.ServiceSpec) { s.Log.MaxSize = 100 }, "log max-size 100: want at least 4096"},
		{"log files", func(s *sched.ServiceSpec) { s.Log.MaxFiles = 101 }, "log max-file 101: want 1 to 100"},
		{"log discarded and rotated", func(s *sched.ServiceSpec) { s.Log = sched.LogConfig{Driver: sched.LogDriverNone, MaxFiles: 2} }, "log driver none keeps nothing"},
		{"global job", func(s *sched.ServiceSpec) { s.Replicas, s.Global, s.Job = 0, true, true }, ""},
		{"job that restarts always", func(s *sched.ServiceSpec) { s.Job, s.Restart.Policy = true, sched.RestartAlways },
			"a job runs to completion: restart policy always"},
		{"max concurrent of a service", func(s *sched.ServiceSpec) { s.MaxConcurrent = 1 }, "the service is not one"},
		{"max concurrent of a global job", func(s *sched.ServiceSpec) { s.Replicas, s.Global, s.Job, s.MaxConcurrent = 0, true, true, 1 },
			"the service is not one"},
		{"capabilities", func(s *sched.ServiceSpec) {
			s.CapAdd, s.CapDrop = []string{"net_admin", "CAP_SYS_TIME"}, []string{"ALL"}
		}, ""},
		{"limits and sysctls", func(s *sched.ServiceSpec) {
			s.Ulimits, s.Sysctls = []string{"nofile=1024:2048", "core=-1"}, map[string]string{"net.ipv4.ip_unprivileged_port_start": "0", "kernel.msgmax": "65536", "fs.mqueue.msg_max": "20"}
		}, ""},
		{"placement preference", func(s *sched.ServiceSpec) { s.Preferences = []string{"spread=node.labels.zone"} }, ""},
		{"bad placement preference", func(s *sched.ServiceSpec) { s.Preferences = []string{"spread=node.hostname"} }, `placement preference "spread=node.hostname": want spread=node.labels.LABEL`},
		{"extra hosts", func(s *sched.ServiceSpec) { s.Hosts = []string{"db.internal:10.0.0.5", "v6:fd00::5", "b:[fd00::6]"} }, ""},
		{"bad extra host", func(s *sched.ServiceSpec) { s.Hosts = []string{"gw:host-gateway"} }, `host "gw:host-gateway": want HOST:IP`},
		{"bad ulimit", func(s *sched.ServiceSpec) { s.Ulimits = []string{"nofile=2048:1024"} }, `ulimit "nofile=2048:1024": ulimit soft limit must be less than or equal to hard limit`},
		{"unknown ulimit", func(s *sched.ServiceSpec) { s.Ulimits = []string{"files=10"} }, `ulimit "files=10": invalid ulimit type`},
		{"node-wide sysctl", func(s *sched.ServiceSpec) { s.Sysctls = map[string]string{"vm.swappiness": "1"} }, "sysctl vm.swappiness is not one of a task's own namespaces"},
		{"net sysctl on the host network", func(s *sched.ServiceSpec) {
			s.Network, s.Sysctls = sched.NetworkHost, map[string]string{"net.core.somaxconn": "1024"}
		}, "sysctl net.core.somaxconn: a task in the node's network namespace"},
		{"unknown capability", func(s *sched.ServiceSpec) { s.CapAdd = []string{"NET_ADMIN", "FLY"} }, `capability "FLY" is unknown`},
		{"scheduled job", func(s *sched.ServiceSpec) { s.Job, s.Schedule = true, "*/15 * * * *" }, ""},
		{"job every 30s", func(s *sched.ServiceSpec) { s.Job, s.Schedule = true, "@every 30s" }, ""},
		{"schedule of a service", func(s *sched.ServiceSpec) { s.Schedule = "@hourly" }, "a schedule runs a job: the service is not one"},
		{"bad schedule", func(s *sched.ServiceSpec) { s.Job, s.Schedule = true, "every day" }, `schedule "every day":`},
		{"six cron fields", func(s *sched.ServiceSpec) { s.Job, s.Schedule = true, "0 0 3 * * *" }, `schedule "0 0 3 * * *":`},
		{"negative max concurrent", func(s *sched.ServiceSpec) { s.Job, s.MaxConcurrent = true, -1 }, "max concurrent is -1"},
		{"empty name", func(s *sched.ServiceSpec) { s.Name = "" }, "service name is empty"},
		{"upper case name", func(s *sched.ServiceSpec) { s.Name = "Web" }, `service name "Web" is invalid`},
		{"name ends with dash", func(s *sched.ServiceSpec) { s.Name = "web-" }, "is invalid"},
		{"long name", func(s *sched.ServiceSpec) { s.Name = strings.Repeat("a", 64) }, "the limit is 63"},
		{"no image", func(s *sched.ServiceSpec) { s.Image = " " }, "image is empty"},
		{"negative replicas", func(s *sched.ServiceSpec) { s.Replicas = -1 }, "replicas is -1"},
		{"global with replicas", func(s *sched.ServiceSpec) { s.Global = true }, "do not also set replicas (3)"},
		{"negative cpu", func(s *sched.ServiceSpec) { s.CPUMillis = -5 }, "cpu is -5m"},
		{"negative memory", func(s *sched.ServiceSpec) { s.MemoryBytes = -1 }, "memory is -1 bytes"},
		{"negative pids limit", func(s *sched.ServiceSpec) { s.PidsLimit = -2 }, "pids limit is -2"},
		{"empty group", func(s *sched.ServiceSpec) { s.Groups = []string{""} }, `group ""`},
		{"bad env", func(s *sched.ServiceSpec) { s.Env = []string{"=x"} }, `env entry "=x"`},
		{"constraint without operator", func(s *sched.ServiceSpec) { s.Constraints = []string{"node.labels.zone=eu"} },
			`constraint "node.labels.zone=eu": no == or != operator`},
		{"constraint unknown attribute", func(s *sched.ServiceSpec) { s.Constraints = []string{"engine.labels.a==b"} },
			`constraint "engine.labels.a==b": unknown attribute "engine.labels.a"`},
		{"constraint empty value", func(s *sched.ServiceSpec) { s.Constraints = []string{"node.id=="} }, "empty value"},
		{"bad placement", func(s *sched.ServiceSpec) { s.Placement = "random" }, `placement "random" is unknown`},
		{"bad restart policy", func(s *sched.ServiceSpec) { s.Restart.Policy = "sometimes" }, `restart policy "sometimes"`},
		{"negative attempts", func(s *sched.ServiceSpec) { s.Restart.MaxAttempts = -1 }, "max attempts is -1"},
		{"max delay below delay", func(s *sched.ServiceSpec) {
			s.Restart.Delay, s.Restart.MaxDelay = sched.Duration(time.Minute), sched.Duration(time.Second)
		}, "max delay 1s is shorter than the delay 1m0s"},
		{"health settings without command", func(s *sched.ServiceSpec) { s.Health.Retries = 3 }, "without a health check command"},
		{"bad order", func(s *sched.ServiceSpec) { s.Update.Order = "random" }, `update order "random"`},
		{"bad failure action", func(s *sched.ServiceSpec) { s.Update.FailureAction = "panic" }, `failure action "panic"`},
		{"negative parallelism", func(s *sched.ServiceSpec) { s.Update.Parallelism = -2 }, "parallelism is -2"},
		{"port out of range", func(s *sched.ServiceSpec) { s.Ports = []sched.Port{{Host: 70000, Container: 80}} }, "published port 70000 is out of range"},
		{"container port zero", func(s *sched.ServiceSpec) { s.Ports = []sched.Port{{Host: 80}} }, "container port 0 is out of range"},
		{"duplicate port", func(s *sched.ServiceSpec) {
			s.Ports = []sched.Port{{Host: 80, Container: 80}, {Host: 80, Container: 81, Protocol: "tcp"}}
		}, "port 80/tcp is published twice"},
		{"publish with network host", func(s *sched.ServiceSpec) {
			s.Network = sched.NetworkHost
			s.Ports = []sched.Port{{Host: 8080, Container: 80}}
		}, "port 8080/tcp: a --network host service cannot publish ports"},
		{"host-mode port with network host", func(s *sched.ServiceSpec) {
			s.Network = sched.NetworkHost
			s.Ports = []sched.Port{{Host: 8080, Container: 8080, Mode: sched.PortHost}}
		}, ""},
		{"bad protocol", func(s *sched.ServiceSpec) { s.Ports = []sched.Port{{Host: 80, Container: 80, Protocol: "sctp"}} }, `protocol "sctp"`},
		{"bad mode", func(s *sched.ServiceSpec) { s.Ports = []sched.Port{{Host: 80, Container: 80, Mode: "vip"}} }, `mode "vip"`},
		{"empty volume", func(s *sched.ServiceSpec) { s.Volumes = []string{""} }, "want NAME:/path[:ro]"},
		{"volume bad name", func(s *sched.ServiceSpec) { s.Volumes = []string{"Data_1:/data"} }, `name "Data_1" must be`},
		{"volume relative path", func(s *sched.ServiceSpec) { s.Volumes = []string{"data:data"} }, "must be absolute"},
		{"volume on root", func(s *sched.ServiceSpec) { s.Volumes = []string{"data:/"} }, "must be absolute and not /"},
		{"volume bad option", func(s *sched.ServiceSpec) { s.Volumes = []string{"data:/data:rx"} }, `option "rx" is unknown`},
		{"volumes on one path", func(s *sched.ServiceSpec) { s.Volumes = []string{"a:/data", "b:/data/"} }, "two volumes, binds, tmpfs, secrets or configs are mounted at /data"},
		{"stack", func(s *sched.ServiceSpec) { s.Name, s.Stack = "app-web", "app" }, ""},
		{"process", func(s *sched.ServiceSpec) {
			s.Entrypoint, s.User, s.WorkDir, s.ReadOnly = []string{"sh", "-c"}, "1000:1000", "/srv", true
		}, ""},
		{"bad user", func(s *sched.ServiceSpec) { s.User = "a b" }, `user "a b": want user`},
		{"stop signal", func(s *sched.ServiceSpec) { s.StopSignal = "SIGQUIT" }, ""},
		{"bad stop signal", func(s *sched.ServiceSpec) { s.StopSignal = "SIGNOPE" }, `stop signal "SIGNOPE": want a signal`},
		{"tmpfs", func(s *sched.ServiceSpec) { s.Tmpfs = []string{"/tmp", "/cache:64m"} }, ""},
		{"binds", func(s *sched.ServiceSpec) {
			s.Binds = []string{"/proc:/host/proc:ro", "/var/log/:/logs", "/etc/hostname:/h:rw"}
		}, ""},
		{"bind relative source", func(s *sched.ServiceSpec) { s.Binds = []string{"logs:/logs"} }, `the host path "logs" must be absolute`},
		{"bind relative target", func(s *sched.ServiceSpec) { s.Binds = []string{"/logs:logs"} }, `mount path "logs" must be absolute and not /`},
		{"bind bad option", func(s *sched.ServiceSpec) { s.Binds = []string{"/logs:/logs:z"} }, `option "z" is unknown`},
		{"bind alone", func(s *sched.ServiceSpec) { s.Binds = []string{"/logs"} }, "want /host/path:/path[:ro]"},
		{"bind on a tmpfs", func(s *sched.ServiceSpec) {
			s.Binds = []string{"/srv:/data"}
			s.Tmpfs = []string{"/data/"}
		}, "two volumes, binds, tmpfs, secrets or configs are mounted at /data"},
		{"tmpfs relative", func(s *sched.ServiceSpec) { s.Tmpfs = []string{"tmp"} }, `tmpfs "tmp": the mount path must be absolute`},
		{"tmpfs bad size", func(s *sched.ServiceSpec) { s.Tmpfs = []string{"/tmp:lots"} }, `tmpfs "/tmp:lots": want /path or /path:SIZE`},
		{"tmpfs on a volume", func(s *sched.ServiceSpec) {
			s.Volumes = []string{"data:/data"}
			s.Tmpfs = []string{"/data"}
		}, "two volumes, binds, tmpfs, secrets or configs are mounted at /data"},
		{"http health", func(s *sched.ServiceSpec) { s.Health = sched.HealthCheck{HTTP: "8080/healthz"} }, ""},
		{"tcp health", func(s *sched.ServiceSpec) { s.Health = sched.HealthCheck{TCP: 5432, Retries: 2} }, ""},
		{"bad http health", func(s *sched.ServiceSpec) { s.Health = sched.HealthCheck{HTTP: "x/y"} }, `health check http "x/y": want PORT`},
		{"bad tcp health", func(s *sched.ServiceSpec) { s.Health = sched.HealthCheck{TCP: 70000} }, "health check tcp port 70000 is out of range"},
		{"two health checks", func(s *sched.ServiceSpec) { s.Health = sched.HealthCheck{TCP: 80, Cmd: []string{"true"}} }, "give one of a command, http and tcp"},
		{"user without group", func(s *sched.ServiceSpec) { s.User = "app:" }, `user "app:": want user`},
		{"relative workdir", func(s *sched.ServiceSpec) { s.WorkDir = "srv" }, `working directory "srv" must be absolute`},
		{"stack without its prefix", func(s *sched.ServiceSpec) { s.Name, s.Stack = "web", "app" }, "must be named app-NAME"},
		{"stack alone", func(s *sched.ServiceSpec) { s.Name, s.Stack = "app-", "app" }, "service name"},
		{"bad stack", func(s *sched.ServiceSpec) { s.Name, s.Stack = "app-web", "A_p" }, `stack "A_p" is invalid`},
		{"secrets", func(s *sched.ServiceSpec) { s.Secrets = []string{"db-pass", "tls:/etc/tls/key.pem", "x:y.conf"} }, ""},
		{"secret bad name", func(s *sched.ServiceSpec) { s.Secrets = []string{"a/b"} }, `secret name "a/b" is invalid`},
		{"secret file with a slash", func(s *sched.ServiceSpec) { s.Secrets = []string{"a:conf/x"} }, "must be a plain file name"},
		{"secret file dot-dot", func(s *sched.ServiceSpec) { s.Secrets = []string{"a:.."} }, "must be a plain file name"},
		{"secret empty target", func(s *sched.ServiceSpec) { s.Secrets = []string{"a:"} }, "want NAME, NAME:FILE or NAME:/path"},
		{"secret on root", func(s *sched.ServiceSpec) { s.Secrets = []string{"a:/"} }, "must name a file"},
		{"secrets on one path", func(s *sched.ServiceSpec) { s.Secrets = []string{"a:x", "b:/run/secrets/x"} }, "two volumes, binds, tmpfs, secrets or configs are mounted at /run/secrets/x"},
		{"configs", func(s *sched.ServiceSpec) { s.Configs = []string{"nginx.conf:/etc/nginx/nginx.conf", "motd"} }, ""},
		{"config bad name", func(s *sched.ServiceSpec) { s.Configs = []string{"-x"} }, `config "-x": config name "-x" is invalid`},
		{"config on a secret's path", func(s *sched.ServiceSpec) {
			s.Secrets = []string{"a:/etc/a"}
			s.Configs = []string{"b:/etc/a"}
		}, "two volumes, binds, tmpfs, secrets or configs are mounted at /etc/a"},
		{"secret on a volume's path", func(s *sched.ServiceSpec) {
			s.Volumes = []string{"data:/data"}
			s.Secrets = []string{"a:/data"}
		}, "two volumes, binds, tmpfs, secrets or configs are mounted at /data"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := validSpec()
			tc.change(&s)
			err := s.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tc.want != "" && err == nil:
				t.Fatalf("Validate() = nil, want an error containing %q", tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("Validate() = %q, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	s := sched.ServiceSpec{Name: "A", Replicas: -1}
	err := s.Validate()
	if err == nil {
		t.Fatal("Validate() = nil")
	}
	if n := len(strings.Split(err.Error(), "\n")); n != 3 {
		t.Fatalf("Validate() reported %d problems, want 3 (name, image, replicas):\n%v", n, err)
	}
}

func TestWithDefaults(t *testing.T) {
	d := sched.ServiceSpec{Name: "web", Image: "x", Replicas: 0, Health: sched.HealthCheck{Cmd: []string{"true"}},
		Ports: []sched.Port{{Host: 80, Container: 80}}}.WithDefaults()
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"replicas untouched", d.Replicas, 0},
		{"placement", d.Placement, sched.Spread},
		{"restart policy", d.Restart.Policy, sched.RestartAlways},
		{"restart delay", d.Restart.Delay.D(), time.Second},
		{"restart max delay", d.Restart.MaxDelay.D(), 30 * time.Second},
		{"health interval", d.Health.Interval.D(), 30 * time.Second},
		{"health retries", d.Health.Retries, 3},
		{"parallelism", d.Update.Parallelism, 1},
		{"order", d.Update.Order, sched.StopFirst},
		{"failure action", d.Update.FailureAction, sched.ActionPause},
		{"monitor", d.Update.Monitor.D(), 5 * time.Second},
		{"stop grace", d.StopGrace.D(), 10 * time.Second},
		{"port protocol", d.Ports[0].Protocol, "tcp"},
		{"port mode", d.Ports[0].Mode, "ingress"},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
	if d2 := d.WithDefaults(); d2.Digest() != d.Digest() {
		t.Error("WithDefaults is not idempotent")
	}
}

func TestDigest(t *testing.T) {
	a := validSpec()
	b := a.WithDefaults() // explicit defaults are the same spec
	if a.Digest() != b.Digest() {
		t.Error("a spec and its defaults have different digests")
	}
	c := a
	c.Image = "local/busybox:1.36"
	if a.Digest() == c.Digest() {
		t.Error("changing the image kept the digest")
	}
	d := a
	d.ForceUpdate++
	if a.Digest() == d.Digest() {
		t.Error("ForceUpdate kept the digest")
	}
}

func TestSpecJSON(t *testing.T) {
	s := validSpec()
	s.StopGrace = sched.Duration(90 * time.Second)
	s.Restart.Delay = sched.Duration(1500 * time.Millisecond)
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"stop_grace":"1m30s"`) || !strings.Contains(string(b), `"delay":"1.5s"`) {
		t.Fatalf("durations are not strings: %s", b)
	}
	if strings.Contains(string(b), `"health"`) || strings.Contains(string(b), `"update"`) {
		t.Fatalf("empty sections are encoded: %s", b)
	}
	got, err := sched.DecodeSpec(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest() != s.Digest() {
		t.Fatalf("round trip changed the spec: %s", b)
	}
	// Durations also decode from nanoseconds, and unknown fields are
	// ignored (a newer CLI wrote them).
	got, err = sched.DecodeSpec([]byte(`{"name":"web","image":"x","stop_grace":2000000000,"from_the_future":1}`))
	if err != nil || got.StopGrace.D() != 2*time.Second {
		t.Fatalf("DecodeSpec = %+v, %v", got, err)
	}
	if _, err := sched.DecodeSpec([]byte(`{"stop_grace":"soon"}`)); err == nil || !strings.Contains(err.Error(), `duration "soon"`) {
		t.Fatalf("DecodeSpec(bad duration) = %v", err)
	}
}

func TestConstraints(t *testing.T) {
	n := sched.Node{ID: "id1", Name: "alpha", Hostname: "host1", Labels: map[string]string{"zone": "eu", "disk": "ssd"}}
	for _, tc := range []struct {
		expr string
		want bool
	}{
		{"node.labels.zone==eu", true},
		{"node.labels.zone == eu", true},
		{`node.labels.zone=="eu"`, true},
		{"node.labels.zone==us", false},
		{"node.labels.zone!=us", true},
		{"node.labels.disk!=hdd", true},
		{"node.labels.disk!=ssd", false},
		{"node.labels.gpu==yes", false}, // missing label never equals
		{"node.labels.gpu!=yes", true},  // and always differs
		{"node.hostname==host1", true},
		{"node.hostname!=host1", false},
		{"node.id==id1", true},
		{"node.name==alpha", true},
		{"node.name==beta", false},
	} {
		c, err := sched.ParseConstraint(tc.expr)
		if err != nil {
			t.Fatalf("ParseConstraint(%q): %v", tc.expr, err)
		}
		if got := c.Match(n); got != tc.want {
			t.Errorf("%q.Match = %v, want %v", tc.expr, got, tc.want)
		}
	}
	for _, bad := range []string{"", "node.labels.zone", "zone==eu", "node.labels.==eu", "node.cpu==4", "node.id==a==b", "node.id==''"} {
		if _, err := sched.ParseConstraint(bad); err == nil {
			t.Errorf("ParseConstraint(%q) = nil error", bad)
		}
	}
}

func TestFormat(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{sched.FormatBytes(512 << 20), "512MiB"},
		{sched.FormatBytes(1536 << 20), "1.5GiB"},
		{sched.FormatBytes(100), "100B"},
		{sched.FormatBytes(2048), "2KiB"},
		{sched.FormatCPU(250), "250m"},
		{sched.FormatCPU(1500), "1.5 CPU"},
		{sched.FormatCPU(2000), "2 CPU"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func TestParseVolume(t *testing.T) {
	for in, want := range map[string]sched.VolumeMount{
		"data:/data":       {Name: "data", Target: "/data"},
		"db-1:/var/lib/x/": {Name: "db-1", Target: "/var/lib/x"},
		"logs:/logs:ro":    {Name: "logs", Target: "/logs", ReadOnly: true},
		"logs:/logs:rw":    {Name: "logs", Target: "/logs"},
	} {
		got, err := sched.ParseVolume(in)
		if err != nil || got != want {
			t.Errorf("ParseVolume(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
}

func TestParseSecret(t *testing.T) {
	for in, want := range map[string]sched.FileMount{
		"db-pass":                  {Name: "db-pass", Target: "/run/secrets/db-pass"},
		"db-pass:pw":               {Name: "db-pass", Target: "/run/secrets/pw"},
		"tls.key:/etc/tls/key.pem": {Name: "tls.key", Target: "/etc/tls/key.pem"},
		"k:/etc//app/../k.conf":    {Name: "k", Target: "/etc/k.conf"},
	} {
		got, err := sched.ParseSecret(in)
		if err != nil || got != want {
			t.Errorf("ParseSecret(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
}

func TestParseConfig(t *testing.T) {
	for in, want := range map[string]sched.FileMount{
		"motd":              {Name: "motd", Target: "/motd"},
		"site:site.conf":    {Name: "site", Target: "/site.conf"},
		"nginx:/etc/n.conf": {Name: "nginx", Target: "/etc/n.conf"},
	} {
		got, err := sched.ParseConfig(in)
		if err != nil || got != want {
			t.Errorf("ParseConfig(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
}

func TestDigestCoversSecrets(t *testing.T) {
	a := validSpec()
	b := validSpec()
	b.Secrets = []string{"db-pass"}
	if a.Digest() == b.Digest() {
		t.Fatal("adding a secret leaves the digest: its tasks would not be replaced")
	}
}

func TestModes(t *testing.T) {
	for _, mode := range []string{sched.ModeReplicated, sched.ModeGlobal, sched.ModeReplicatedJob, sched.ModeGlobalJob} {
		var s sched.ServiceSpec
		if err := s.SetMode(mode); err != nil || s.Mode() != mode {
			t.Errorf("%s: %v, mode %s", mode, err, s.Mode())
		}
	}
	var s sched.ServiceSpec
	if err := s.SetMode("batch"); err == nil || !strings.Contains(err.Error(), `mode "batch" is unknown`) {
		t.Errorf("batch: %v", err)
	}
	// A job's restart policy defaults to on-failure, and its concurrency
	// is not part of the digest (changing it runs nothing again).
	j := validSpec()
	j.Job = true
	if p := j.WithDefaults().Restart.Policy; p != sched.RestartOnFailure {
		t.Errorf("job's default restart policy %s", p)
	}
	k := j
	k.MaxConcurrent, k.Schedule = 1, "@hourly"
	if j.Digest() != k.Digest() {
		t.Error("max concurrent or the schedule changes the digest")
	}
}

func TestDockerHealthTest(t *testing.T) {
	for _, tc := range []struct {
		test []string
		cmd  string
		none bool
		bad  bool
	}{
		{nil, "", false, false},
		{[]string{"NONE"}, "", true, false},
		{[]string{"CMD", "curl", "-f", "http://localhost/"}, "curl|-f|http://localhost/", false, false},
		{[]string{"CMD-SHELL", "test -e /ok"}, "sh|-c|test -e /ok", false, false},
		{[]string{"CMD"}, "", false, true},
		{[]string{"RUN", "x"}, "", false, true},
	} {
		cmd, none, err := sched.DockerHealthTest(tc.test)
		if strings.Join(cmd, "|") != tc.cmd || none != tc.none || (err != nil) != tc.bad {
			t.Errorf("DockerHealthTest(%q) = %q, %v, %v", tc.test, cmd, none, err)
		}
	}
	image := func(h sched.HealthCheck) sched.HealthCheck {
		return h.ImageHealthCheck([]string{"CMD-SHELL", "test -e /ok"}, time.Second, 2*time.Second, 3*time.Second, 4)
	}
	if h := image(sched.HealthCheck{}); strings.Join(h.Cmd, " ") != "sh -c test -e /ok" || h.Interval.D() != time.Second || h.Timeout.D() != 2*time.Second ||
		h.StartPeriod.D() != 3*time.Second || h.Retries != 4 {
		t.Errorf("no check of its own: %+v, want the image's", h)
	}
	if h := image(sched.HealthCheck{TCP: 80}); h.TCP != 80 || h.Cmd != nil {
		t.Errorf("a check of its own: %+v, want it kept", h)
	}
	if h := image(sched.HealthCheck{Disable: true}); h.Enabled() {
		t.Errorf("disabled: %+v, want no check", h)
	}
	if h := (sched.HealthCheck{}).ImageHealthCheck([]string{"NONE"}, 0, 0, 0, 0); h.Enabled() {
		t.Errorf("an image's HEALTHCHECK NONE: %+v", h)
	}
}

func TestTemplates(t *testing.T) {
	spec := sched.ServiceSpec{Name: "web", Image: "x", Replicas: 1, Labels: map[string]string{"tier": "front"},
		Hostname: "{{.Service.Name}}-{{.Task.Slot}}.{{.Node.ID}}",
		Env:      []string{"PLAIN=a {b}", "WHERE={{.Node.Hostname}}", "TIER={{index .Service.Labels \"tier\"}}", "TASK={{.Task.Name}}"}}
	c := sched.NewTemplateContext(spec, sched.Task{ID: "abc123", Service: "web", Slot: "2"}, sched.Node{ID: "n0de", Name: "n1", Hostname: "host-a"})
	if h, err := spec.TaskHostname(c); err != nil || h != "web-2.n0de" {
		t.Errorf("hostname %q, %v", h, err)
	}
	env, err := spec.TaskEnv(c)
	if want := "PLAIN=a {b}|WHERE=host-a|TIER=front|TASK=web.2.abc123"; err != nil || strings.Join(env, "|") != want {
		t.Errorf("env %q, %v; want %q", env, err, want)
	}
	// A node without a hostname in its document gives its name.
	if env, _ := spec.TaskEnv(sched.NewTemplateContext(spec, sched.Task{}, sched.Node{Name: "n1"})); env[1] != "WHERE=n1" {
		t.Errorf("env without a node hostname: %q", env)
	}
	if h, _ := (sched.ServiceSpec{}).TaskHostname(c); h != "" {
		t.Errorf("no hostname given: %q, want the default", h)
	}
	for _, tc := range []struct {
		change func(*sched.ServiceSpec)
		want   string
	}{
		{func(s *sched.ServiceSpec) { s.Hostname = "{{.Node.Nope}}" }, `hostname: template "{{.Node.Nope}}"`},
		{func(s *sched.ServiceSpec) { s.Hostname = "{{.Task.Slot" }, `hostname: template "{{.Task.Slot"`},
		{func(s *sched.ServiceSpec) { s.Hostname = "web_{{.Task.Slot}}" }, `hostname "web_0" (from "web_{{.Task.Slot}}") is not a hostname`},
		{func(s *sched.ServiceSpec) { s.Env = []string{"A={{.Task.Missing}}"} }, `env A: template "{{.Task.Missing}}"`},
	} {
		s := sched.ServiceSpec{Name: "web", Image: "x", Replicas: 1}
		tc.change(&s)
		if err := s.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", s, err, tc.want)
		}
	}
}
