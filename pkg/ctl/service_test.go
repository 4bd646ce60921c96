package ctl

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/shoal-dev/shoal/pkg/sched"
	schedv1 "github.com/shoal-dev/shoal/proto/shoal/sched/v1"
)

// fakeSchedd is a schedd socket that records the specs it is asked to
// create, so tests see what the flags turned into.
type fakeSchedd struct {
	schedv1.UnimplementedSchedulerServer
	mu          sync.Mutex
	specs       []sched.ServiceSpec
	logRequests []*schedv1.TaskLogsRequest
	statsReqs   []*schedv1.TaskStatsRequest
}

func (f *fakeSchedd) CreateService(_ context.Context, req *schedv1.CreateServiceRequest) (*schedv1.Service, error) {
	var spec sched.ServiceSpec
	if err := json.Unmarshal(req.GetSpec(), &spec); err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.specs = append(f.specs, spec)
	f.mu.Unlock()
	return &schedv1.Service{Name: spec.Name, Version: 1, Spec: req.GetSpec()}, nil
}

// ListServices lists the specs created so far.
func (f *fakeSchedd) ListServices(context.Context, *schedv1.ListServicesRequest) (*schedv1.ListServicesResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	resp := &schedv1.ListServicesResponse{}
	for _, spec := range f.specs {
		data, err := json.Marshal(spec)
		if err != nil {
			return nil, err
		}
		resp.Services = append(resp.Services, &schedv1.Service{Name: spec.Name, Version: 1, Spec: data})
	}
	return resp, nil
}

// GetService answers that the service has none of its one task running,
// so a wait for it to converge never ends by itself.
func (f *fakeSchedd) GetService(_ context.Context, req *schedv1.GetServiceRequest) (*schedv1.Service, error) {
	return &schedv1.Service{Name: req.GetName(), Version: 1, Desired: 1, State: "active"}, nil
}

// startFakeSchedd serves a fakeSchedd on <dir>/schedd.sock.
func startFakeSchedd(t *testing.T) (string, *fakeSchedd) {
	t.Helper()
	dir := t.TempDir()
	lis, err := net.Listen("unix", filepath.Join(dir, "schedd.sock"))
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeSchedd{}
	srv := grpc.NewServer()
	schedv1.RegisterSchedulerServer(srv, f)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return dir, f
}

// ctlRun runs shoalctl in-process and returns stdout, stderr and the exit
// code.
func ctlRun(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	code := run(ctx, args, &out, &errOut)
	return out.String(), errOut.String(), code
}

func TestServiceCreateFlags(t *testing.T) {
	dir, fake := startFakeSchedd(t)
	envFile := filepath.Join(t.TempDir(), "app.env")
	if err := os.WriteFile(envFile, []byte("# settings\nA=1\n\n  B=\"quoted\" as is\r\nFROM_SHELL\nUNSET_HERE\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("FROM_SHELL", "yes")
	create := func(flags ...string) []string {
		return append([]string{"--run-dir", dir, "service", "create", "web", "--image", "local/busybox:latest", "--detach"}, flags...)
	}
	for _, tc := range []struct {
		name  string
		flags []string
		check func(s sched.ServiceSpec) bool
	}{
		{"cpu as CPUs", []string{"--cpu", "0.5"}, func(s sched.ServiceSpec) bool { return s.CPUMillis == 500 }},
		{"cpu as whole CPUs", []string{"--cpu", "2"}, func(s sched.ServiceSpec) bool { return s.CPUMillis == 2000 }},
		{"cpu as millicores", []string{"--cpu", "250m"}, func(s sched.ServiceSpec) bool { return s.CPUMillis == 250 }},
		{"memory in MiB", []string{"--memory", "256m"}, func(s sched.ServiceSpec) bool { return s.MemoryBytes == 256<<20 }},
		{"memory in GiB", []string{"--memory", "1.5GiB"}, func(s sched.ServiceSpec) bool { return s.MemoryBytes == 3<<29 }},
		{"memory in bytes", []string{"--memory", "1048576"}, func(s sched.ServiceSpec) bool { return s.MemoryBytes == 1<<20 }},
		{"placement", []string{"--placement", "binpack"}, func(s sched.ServiceSpec) bool { return s.Placement == sched.Binpack }},
		{"max per node", []string{"--replicas-max-per-node", "2"}, func(s sched.ServiceSpec) bool { return s.MaxPerNode == 2 }},
		{"stop signal", []string{"--stop-signal", "SIGQUIT"}, func(s sched.ServiceSpec) bool { return s.StopSignal == "SIGQUIT" }},
		{"restart", []string{"--restart", "on-failure", "--restart-max-attempts", "3", "--restart-delay", "2s", "--restart-max-delay", "1m"}, func(s sched.ServiceSpec) bool {
			return s.Restart.Policy == sched.RestartOnFailure && s.Restart.MaxAttempts == 3 && s.Restart.Delay.D() == 2*time.Second && s.Restart.MaxDelay.D() == time.Minute
		}},
		{"labels", []string{"--label", "team=web", "--label", "tier=", "--label", "x=a=b"}, func(s sched.ServiceSpec) bool {
			return len(s.Labels) == 3 && s.Labels["team"] == "web" && s.Labels["tier"] == "" && s.Labels["x"] == "a=b"
		}},
		{"update delay", []string{"--update-delay", "3s", "--update-parallelism", "2", "--update-max-failure-ratio", "0.25"}, func(s sched.ServiceSpec) bool {
			return s.Update.Delay.D() == 3*time.Second && s.Update.Parallelism == 2 && s.Update.MaxFailureRatio == 0.25
		}},
		{"health start period", []string{"--health-cmd", "test -f /ok", "--health-start-period", "5s", "--health-retries", "2"}, func(s sched.ServiceSpec) bool {
			return s.Health.StartPeriod.D() == 5*time.Second && s.Health.Retries == 2 && strings.Join(s.Health.Cmd, " ") == "sh -c test -f /ok"
		}},
		{"command after --", []string{"--replicas", "3", "--", "sleep", "10"}, func(s sched.ServiceSpec) bool {
			return s.Replicas == 3 && strings.Join(s.Args, " ") == "sleep 10"
		}},
		{"global", []string{"--global"}, func(s sched.ServiceSpec) bool { return s.Global && s.Replicas == 0 }},
		{"networks", []string{"--network", "front", "--network", "back"}, func(s sched.ServiceSpec) bool {
			return s.Network == "" && strings.Join(s.Networks, " ") == "front back"
		}},
		{"restart window", []string{"--restart-max-attempts", "3", "--restart-window", "2m"}, func(s sched.ServiceSpec) bool {
			return s.Restart.MaxAttempts == 3 && s.Restart.Window == sched.Duration(2*time.Minute)
		}},
		{"aliases", []string{"--network", "name=front,alias=web,alias=www", "--network", "back"}, func(s sched.ServiceSpec) bool {
			return slices.Equal(s.Networks, []string{"front", "back"}) && len(s.Aliases) == 1 && slices.Equal(s.Aliases["front"], []string{"web", "www"})
		}},
		{"internal", []string{"--network", "name=vault,internal", "--network", "name=back,alias=db,internal=false", "--network", "name=audit,internal=true"}, func(s sched.ServiceSpec) bool {
			return slices.Equal(s.Networks, []string{"vault", "back", "audit"}) && slices.Equal(s.Internal, []string{"vault", "audit"}) && slices.Equal(s.Aliases["back"], []string{"db"})
		}},
		{"the default network named", []string{"--network", "default"}, func(s sched.ServiceSpec) bool { return s.Network == "" && s.Networks == nil }},
		{"host network", []string{"--network", "host"}, func(s sched.ServiceSpec) bool { return s.Network == sched.NetworkHost && s.Networks == nil }},
		{"mode global", []string{"--mode", "global"}, func(s sched.ServiceSpec) bool { return s.Global && !s.Job && s.Replicas == 0 }},
		{"replicated job", []string{"--mode", "replicated-job", "--replicas", "5", "--max-concurrent", "2"}, func(s sched.ServiceSpec) bool {
			return s.Job && !s.Global && s.Replicas == 5 && s.MaxConcurrent == 2 && s.Restart.Policy == sched.RestartOnFailure
		}},
		{"global job", []string{"--mode", "global-job", "--restart", "never"}, func(s sched.ServiceSpec) bool {
			return s.Job && s.Global && s.Replicas == 0 && s.Restart.Policy == sched.RestartNever
		}},
		{"health http", []string{"--health-http", "8080/healthz"}, func(s sched.ServiceSpec) bool { return s.Health.HTTP == "8080/healthz" && s.Health.Cmd == nil }},
		{"health tcp", []string{"--health-tcp", "5432"}, func(s sched.ServiceSpec) bool { return s.Health.TCP == 5432 }},
		{"tmpfs", []string{"--tmpfs", "/tmp", "--tmpfs", "/cache:64m"}, func(s sched.ServiceSpec) bool { return strings.Join(s.Tmpfs, " ") == "/tmp /cache:64m" }},
		{"env file, then --env", []string{"--env", "C=3", "--env-file", envFile}, func(s sched.ServiceSpec) bool {
			return strings.Join(s.Env, "|") == `A=1|B="quoted" as is|FROM_SHELL=yes|C=3`
		}},
		{"placement preferences", []string{"--placement-pref", "spread=node.labels.zone", "--placement-pref", "spread=node.labels.rack"}, func(s sched.ServiceSpec) bool {
			return strings.Join(s.Preferences, " ") == "spread=node.labels.zone spread=node.labels.rack"
		}},
		{"extra hosts", []string{"--host", "db:10.0.0.5", "--host", "v6:fd00::5"}, func(s sched.ServiceSpec) bool {
			return strings.Join(s.Hosts, " ") == "db:10.0.0.5 v6:fd00::5"
		}},
		{"capabilities, limits, sysctls", []string{"--cap-add", "NET_ADMIN", "--cap-drop", "ALL", "--ulimit", "nofile=1024:2048", "--sysctl", "net.core.somaxconn=1024", "--limit-pids", "64", "--group", "staff", "--group", "4321"},
			func(s sched.ServiceSpec) bool {
				return strings.Join(s.CapAdd, "") == "NET_ADMIN" && strings.Join(s.CapDrop, "") == "ALL" && strings.Join(s.Ulimits, "") == "nofile=1024:2048" &&
					len(s.Sysctls) == 1 && s.Sysctls["net.core.somaxconn"] == "1024" && s.PidsLimit == 64 &&
					strings.Join(s.Groups, ",") == "staff,4321"
			}},
		{"hostname template", []string{"--hostname", "{{.Service.Name}}-{{.Task.Slot}}", "--env", "NODE={{.Node.Hostname}}"}, func(s sched.ServiceSpec) bool {
			return s.Hostname == "{{.Service.Name}}-{{.Task.Slot}}" && strings.Join(s.Env, "") == "NODE={{.Node.Hostname}}"
		}},
		{"docker's flag names", []string{"--limit-cpu", "0.5", "--reserve-cpu", "500m", "--limit-memory", "256m", "--stop-grace-period", "5s", "--restart-condition", "any"},
			func(s sched.ServiceSpec) bool {
				return s.CPUMillis == 500 && s.MemoryBytes == 256<<20 && s.StopGrace.D() == 5*time.Second && s.Restart.Policy == sched.RestartAlways
			}},
		{"init", []string{"--init"}, func(s sched.ServiceSpec) bool { return s.Init }},
		{"binds", []string{"--mount", "type=bind,source=/proc,target=/host/proc,readonly", "--bind", "/var/log:/logs"},
			func(s sched.ServiceSpec) bool {
				return strings.Join(s.Binds, " ") == "/var/log:/logs /proc:/host/proc:ro"
			}},
		{"docker's restart none", []string{"--restart-condition", "none"}, func(s sched.ServiceSpec) bool { return s.Restart.Policy == sched.RestartNever }},
		{"docker's mounts", []string{"--mount", "type=volume,source=data,target=/data,readonly", "--mount", "type=tmpfs,target=/tmp,tmpfs-size=64m", "--mount", "src=logs,dst=/logs", "--volume", "more:/more"},
			func(s sched.ServiceSpec) bool {
				return strings.Join(s.Volumes, " ") == "more:/more data:/data:ro logs:/logs" && strings.Join(s.Tmpfs, " ") == "/tmp:64m"
			}},
		{"port ranges", []string{"--publish", "8000-8002:9000-9002/udp", "-p", "7000:70"}, func(s sched.ServiceSpec) bool {
			return slices.Equal(s.Ports, []sched.Port{{Host: 8000, Container: 9000, Protocol: "udp"}, {Host: 8001, Container: 9001, Protocol: "udp"},
				{Host: 8002, Container: 9002, Protocol: "udp"}, {Host: 7000, Container: 70}})
		}},
		{"docker's long publish", []string{"--publish", "published=8080,target=80,protocol=udp", "--publish", "8081:81", "--publish", "published=9090,target=90,mode=host"}, func(s sched.ServiceSpec) bool {
			return len(s.Ports) == 3 && s.Ports[0] == sched.Port{Host: 8080, Container: 80, Protocol: "udp"} && s.Ports[1].Host == 8081 &&
				s.Ports[2] == sched.Port{Host: 9090, Container: 90, Mode: "host"}
		}},
		{"rollback settings", []string{"--rollback-parallelism", "3", "--rollback-order", "start-first", "--rollback-monitor", "2s"}, func(s sched.ServiceSpec) bool {
			return s.Rollback != nil && *s.Rollback == sched.UpdateConfig{Parallelism: 3, Order: sched.StartFirst, Monitor: sched.Duration(2 * time.Second)}
		}},
		{"docker's long secret and config syntax", []string{"--secret", "source=db-pass,target=/etc/db/pw,mode=0400", "--secret", "tls", "--config", "src=site,target=site.conf"},
			func(s sched.ServiceSpec) bool {
				return strings.Join(s.Secrets, " ") == "db-pass:/etc/db/pw tls" && strings.Join(s.Configs, " ") == "site:site.conf"
			}},
		{"no health check", []string{"--no-healthcheck"}, func(s sched.ServiceSpec) bool { return s.Health.Disable && !s.Health.Enabled() }},
		{"log options", []string{"--log-opt", "max-size=10m", "--log-opt", "max-file=3"}, func(s sched.ServiceSpec) bool {
			return s.Log == sched.LogConfig{MaxSize: 10 << 20, MaxFiles: 3}
		}},
		{"log driver json-file", []string{"--log-driver", "json-file", "--log-opt", "max-size=64k"}, func(s sched.ServiceSpec) bool {
			return s.Log == sched.LogConfig{MaxSize: 64 << 10}
		}},
		{"log driver none", []string{"--log-driver", "none"}, func(s sched.ServiceSpec) bool { return s.Log == sched.LogConfig{Driver: sched.LogDriverNone} }},
		{"process", []string{"--entrypoint", "sh -c 'a b'", "-u", "app:app", "-w", "/srv", "--read-only"}, func(s sched.ServiceSpec) bool {
			return strings.Join(s.Entrypoint, "|") == "sh|-c|a b" && s.User == "app:app" && s.WorkDir == "/srv" && s.ReadOnly
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake.mu.Lock()
			fake.specs = nil
			fake.mu.Unlock()
			out, errOut, code := ctlRun(t, create(tc.flags...)...)
			if code != 0 {
				t.Fatalf("exit %d: %s%s", code, out, errOut)
			}
			fake.mu.Lock()
			defer fake.mu.Unlock()
			if len(fake.specs) != 1 {
				t.Fatalf("schedd got %d creates, want 1", len(fake.specs))
			}
			if s := fake.specs[0]; s.Name != "web" || s.Image != "local/busybox:latest" || !tc.check(s) {
				t.Fatalf("flags %q gave spec %+v", tc.flags, s)
			}
		})
	}
}

func TestServiceCreateBadFlags(t *testing.T) {
	dir, fake := startFakeSchedd(t)
	for _, tc := range []struct {
		flags []string
		want  string // in the error message
	}{
		{[]string{"--cpu", "lots"}, `cpu "lots": want CPUs like 0.5 or millicores like 500m`},
		{[]string{"--cpu", "-1"}, `cpu "-1": want CPUs like 0.5`},
		{[]string{"--cpu", "1.5m"}, `cpu "1.5m"`},
		{[]string{"--memory", "12q"}, `memory "12q": want a size like 256m, 1.5GiB or 1048576`},
		{[]string{"--memory", "-5m"}, `memory "-5m"`},
		{[]string{"--placement", "random"}, `placement "random" is unknown: use spread or binpack`},
		{[]string{"--restart", "sometimes"}, `restart policy "sometimes" is unknown: use always, on-failure or never`},
		{[]string{"--label", "novalue"}, `--label "novalue": want KEY=VALUE`},
		{[]string{"--label", "=v"}, `--label "=v": want KEY=VALUE`},
		{[]string{"--update-delay", "5"}, `invalid argument "5" for "--update-delay" flag`},
		{[]string{"--update-delay", "-1s"}, "update delay and monitor must not be negative"},
		{[]string{"--update-max-failure-ratio", "1.5"}, "update max failure ratio 1.5: want 0 to 1"},
		{[]string{"--health-start-period", "5s"}, "health check settings are given without a health check command"},
		{[]string{"--health-cmd", "true", "--health-start-period", "-1s"}, "health check durations must not be negative"},
		{[]string{"--health-cmd", "true", "--health-start-period", "soon"}, `invalid argument "soon" for "--health-start-period" flag`},
		{[]string{"--env", "NOEQUALS"}, `--env "NOEQUALS": want KEY=VALUE`},
		{[]string{"--env-file", "/nonexistent/app.env"}, "--env-file: open /nonexistent/app.env"},
		{[]string{"--restart-delay", "-1s"}, "restart delays must not be negative"},
		{[]string{"--restart-window", "-1m"}, "restart window -1m0s must not be negative"},
		{[]string{"--restart-delay", "1m", "--restart-max-delay", "10s"}, "restart max delay 10s is shorter than the delay 1m0s"},
		{[]string{"--sysctl", "net.core.somaxconn"}, `--sysctl "net.core.somaxconn": want KEY=VALUE`},
		{[]string{"--sysctl", "vm.swappiness=1"}, "sysctl vm.swappiness is not one of a task's own namespaces"},
		{[]string{"--cap-add", "FLY"}, `capability "FLY" is unknown`},
		{[]string{"--network", "host", "--network", "red"}, "network host: give it alone"},
		{[]string{"--network", "red", "--network", "red"}, "network red given twice"},
		{[]string{"--network", "-red"}, `network "-red": want letters`},
		{[]string{"--network", "alias=db"}, `--network "alias=db": name is missing`},
		{[]string{"--network", "name=red,ip=10.0.0.5"}, "ip is not supported"},
		{[]string{"--network", "name=red,color=x"}, `unknown field "color"`},
		{[]string{"--network", "name=red,alias=Bad_Name"}, `alias "Bad_Name" on network red: want a DNS label`},
		{[]string{"--network", "name=red,alias=db,alias=db"}, "alias db given twice on network red"},
		{[]string{"--network", "name=host,alias=db"}, "aliases on network host: the service is not on it (it is on none)"},
		{[]string{"--network", "name=red,internal=maybe"}, `internal="maybe": want true or false`},
		{[]string{"--network", "name=default,internal"}, "network default cannot be internal"},
		{[]string{"--network", "name=red,internal", "--network", "name=red,internal"}, "network red given twice"},
		{[]string{"--ulimit", "nofile"}, `ulimit "nofile"`},
		{[]string{"--limit-pids", "-1"}, "pids limit is -1"},
		{[]string{"--group", "a:b"}, `group "a:b"`},
		{[]string{"--health-cmd", "true", "--health-tcp", "80"}, "give one of --health-cmd, --health-http and --health-tcp"},
		{[]string{"--health-http", "web/"}, `health check http "web/": want PORT or PORT/PATH`},
		{[]string{"--entrypoint", "sh -c 'unclosed"}, `--entrypoint "sh -c 'unclosed"`},
		{[]string{"--workdir", "srv"}, `working directory "srv" must be absolute`},
		{[]string{"--publish", "80"}, `--publish "80": want HOST:CONTAINER[/tcp|udp]`},
		{[]string{"--publish", "8000-8002:80"}, "the ranges hold 3 and 1 ports"},
		{[]string{"--publish", "8002-8000:80-82"}, "want HOST:CONTAINER"},
		{[]string{"--publish", "1-2000:1-2000"}, "want HOST:CONTAINER"},
		{[]string{"--mode", "batch"}, `mode "batch" is unknown: use replicated, global, replicated-job or global-job`},
		{[]string{"--mode", "global", "--global"}, "--global and --mode: give one"},
		{[]string{"--mode", "replicated-job", "--restart", "always"}, "a job runs to completion: restart policy always"},
		{[]string{"--max-concurrent", "2"}, "max concurrent bounds a replicated job's tasks"},
		{[]string{"--no-healthcheck", "--health-cmd", "true"}, "--no-healthcheck and a health check: give one"},
		{[]string{"--no-healthcheck", "--health-retries", "2"}, "--no-healthcheck and --health-retries: a disabled check has no settings"},
		{[]string{"--hostname", "web_1"}, `hostname "web_1" (from "web_1") is not a hostname`},
		{[]string{"--env", "A={{.Node.Name}}"}, `env A: template "{{.Node.Name}}"`},
		{[]string{"--limit-memory", "256m", "--reserve-memory", "128m"}, "--limit-memory 256m and --reserve-memory 128m differ: Shoal reserves what it limits"},
		{[]string{"--cpu", "1", "--limit-cpu", "2"}, "--cpu 1 and --limit-cpu 2 differ"},
		{[]string{"--mount", "type=bind,target=/srv"}, "a bind needs its source"},
		{[]string{"--mount", "type=bind,source=srv,target=/srv"}, `the host path "srv" must be absolute`},
		{[]string{"--mount", "type=npipe,source=x,target=/srv"}, "want volume, bind or tmpfs"},
		{[]string{"--bind", "/srv"}, "want /host/path:/path[:ro]"},
		{[]string{"--mount", "type=volume,target=/data"}, "a volume needs its source"},
		{[]string{"--mount", "type=volume,source=x,target=/d,volume-driver=local"}, "volume-driver is not supported"},
		{[]string{"--mount", "source=x"}, "target is missing"},
		{[]string{"--publish", "published=8080,target=80,mode=vip"}, "mode=vip: want ingress (every node) or host (the task's node)"},
		{[]string{"--publish", "published=8080"}, "want published=HOST,target=CONTAINER"},
		{[]string{"--restart-condition", "sometimes"}, `restart policy "sometimes" is unknown`},
		{[]string{"--rollback-failure-action", "rollback"}, `rollback failure action "rollback" is unknown: use pause`},
		{[]string{"--rollback-parallelism", "-1"}, "rollback parallelism is -1"},
		{[]string{"--secret", "target=/x"}, `--secret "target=/x": source is missing`},
		{[]string{"--config", "source=a,owner=me"}, `unknown field "owner"`},
		{[]string{"--log-driver", "syslog"}, `log driver "syslog" is not supported`},
		{[]string{"--log-opt", "max-size"}, `--log-opt "max-size": want KEY=VALUE`},
		{[]string{"--log-opt", "compress=true"}, `log option "compress" is not supported`},
		{[]string{"--log-opt", "max-size=1k"}, "log max-size 1024: want at least 4096 bytes"},
		{[]string{"--log-opt", "max-file=0"}, "log option max-file=0: want a count of files"},
		{[]string{"--log-driver", "none", "--log-opt", "max-file=2"}, "log driver none keeps nothing"},
	} {
		t.Run(strings.Join(tc.flags, " "), func(t *testing.T) {
			args := append([]string{"--run-dir", dir, "service", "create", "web", "--image", "local/busybox:latest", "--detach"}, tc.flags...)
			out, errOut, code := ctlRun(t, args...)
			if code != exitUsage || !strings.Contains(errOut, tc.want) {
				t.Fatalf("exit %d, stderr %q, stdout %q; want exit %d and %q", code, errOut, out, exitUsage, tc.want)
			}
		})
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if len(fake.specs) != 0 {
		t.Fatalf("bad flags reached schedd: %+v", fake.specs)
	}
}

// TestServiceWaitEnds: a wait that times out says so; one that is
// interrupted (Ctrl-C) says the service was created all the same, not
// that it timed out.
func TestServiceWaitEnds(t *testing.T) {
	dir, _ := startFakeSchedd(t)
	args := []string{"--run-dir", dir, "service", "create", "web", "--image", "local/busybox:latest"}

	_, errOut, code := ctlRun(t, append(args, "--wait-timeout", "300ms")...)
	if code == 0 || !strings.Contains(errOut, "web did not converge within 300ms (last: web: 0/1 running") {
		t.Fatalf("timed out: exit %d, stderr:\n%s", code, errOut)
	}

	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel) // what the signal handler does
	var out, stderr bytes.Buffer
	code = run(ctx, args, &out, &stderr)
	if code == 0 || !strings.Contains(stderr.String(), "interrupted while waiting; the change was made") ||
		strings.Contains(stderr.String(), "did not converge") {
		t.Fatalf("interrupted: exit %d, stderr:\n%s", code, stderr.String())
	}
}

// TestLoneNetworkNote: a network no other service is on is pointed out (a
// misspelt name makes a network of its own).
func TestLoneNetworkNote(t *testing.T) {
	dir, _ := startFakeSchedd(t)
	create := func(name string, nets ...string) string {
		args := []string{"--run-dir", dir, "service", "create", name, "--image", "local/busybox:latest", "--detach"}
		for _, n := range nets {
			args = append(args, "--network", n)
		}
		_, errOut, code := ctlRun(t, args...)
		if code != 0 {
			t.Fatalf("create %s: exit %d %q", name, code, errOut)
		}
		return errOut
	}
	if errOut := create("a", "red"); !strings.Contains(errOut, "note: no other service is on network red yet") {
		t.Errorf("the first service on red: %q", errOut)
	}
	if errOut := create("b", "red", "blue"); strings.Contains(errOut, "network red") || !strings.Contains(errOut, "network blue yet") {
		t.Errorf("the second service on red, first on blue: %q", errOut)
	}
	if errOut := create("c"); strings.Contains(errOut, "note:") {
		t.Errorf("a service on the default network: %q", errOut)
	}
	// A network another service makes internal is named, unless this
	// service says so too.
	create("d", "name=vault,internal")
	if errOut := create("e", "vault"); !strings.Contains(errOut, "note: network vault is internal (service d says so)") {
		t.Errorf("a service on a network d makes internal: %q", errOut)
	}
	if errOut := create("f", "name=vault,internal"); strings.Contains(errOut, "note:") {
		t.Errorf("a service that makes vault internal too: %q", errOut)
	}
}
