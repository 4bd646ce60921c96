package stack

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"

	"github.com/shoal-dev/shoal/pkg/sched"
)

func load(t *testing.T, stack, yaml string) *types.Project {
	t.Helper()
	p, err := loader.LoadWithContext(context.Background(), types.ConfigDetails{
		WorkingDir:  "/work/app",
		ConfigFiles: []types.ConfigFile{{Filename: "compose.yml", Content: []byte(yaml)}},
		Environment: types.Mapping{"TAG": "v2"},
	}, func(o *loader.Options) { o.SetProjectName(stack, true) })
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	return p
}

func TestConvertSwarmFile(t *testing.T) {
	p := load(t, "app", `
services:
  web:
    image: local/web:${TAG}
    command: ["httpd", "-f", "-p", "80"]
    environment:
      MODE: prod
      EMPTY: ""
    ports: ["8080:80", {target: 53, published: "5353", protocol: udp, mode: host}]
    volumes: [data:/var/www, "shared:/shared:ro"]
    secrets: [db_pass, {source: tls, target: /etc/tls/key.pem}]
    configs: [{source: site, target: /etc/site.conf}, motd]
    healthcheck: {test: ["CMD-SHELL", "wget -q -O- localhost"], interval: 5s, retries: 2}
    stop_grace_period: 20s
    stop_signal: SIGQUIT
    depends_on: [db]
    networks: {front: {aliases: [www, site]}, corp: null}
    deploy:
      replicas: 3
      labels: {tier: front}
      resources: {limits: {cpus: "0.5", memory: 64M}, reservations: {cpus: "0.25"}}
      placement: {constraints: ["node.labels.zone==eu"], max_replicas_per_node: 2, preferences: [{spread: node.labels.rack}]}
      restart_policy: {condition: on-failure, delay: 2s, max_attempts: 4, window: 2m}
      update_config: {parallelism: 0, delay: 5s, order: start-first, failure_action: rollback, monitor: 10s, max_failure_ratio: 0.2}
  db:
    image: local/db:1
    entrypoint: /docker-entrypoint.sh
    command: postgres
    user: "999:999"
    working_dir: /var/lib/db
    read_only: true
    tmpfs: ["/run", "/tmp:rw,size=64m"]
    volumes: [{type: tmpfs, target: /cache, tmpfs: {size: 1048576}}]
    restart: "on-failure:2"
    deploy: {mode: global}
    healthcheck: {test: ["CMD", "true"]}
volumes:
  data:
    driver_opts: {size: 2G, replicas: "2"}
  shared:
    external: true
secrets:
  db_pass: {file: ./db_pass.txt}
  tls: {external: true, name: site-tls}
configs:
  site: {content: "listen 80;"}
  motd: {external: true}
networks:
  front: {internal: true}
  corp: {external: true, name: corp-net, internal: true}
  default: {internal: true}
`)
	plan, err := Convert(p, "app")
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Services) != 2 {
		t.Fatalf("services: %+v", plan.Services)
	}
	db, web := plan.Services[0], plan.Services[1]
	want := sched.ServiceSpec{
		Name: "app-web", Stack: "app", Image: "local/web:v2", Args: []string{"httpd", "-f", "-p", "80"},
		Env: []string{"EMPTY=", "MODE=prod"}, Replicas: 3, CPUMillis: 500, MemoryBytes: 64 << 20,
		Constraints: []string{"node.labels.zone==eu"}, Preferences: []string{"spread=node.labels.rack"}, MaxPerNode: 2, Labels: map[string]string{"tier": "front"},
		Restart: sched.RestartPolicy{Policy: sched.RestartOnFailure, MaxAttempts: 4, Delay: sched.Duration(2e9), Window: sched.Duration(120e9)},
		Health:  sched.HealthCheck{Cmd: []string{"sh", "-c", "wget -q -O- localhost"}, Interval: sched.Duration(5e9), Retries: 2},
		Update: sched.UpdateConfig{Parallelism: 1<<31 - 1, Delay: sched.Duration(5e9), Order: sched.StartFirst,
			FailureAction: sched.ActionRollback, Monitor: sched.Duration(10e9), MaxFailureRatio: 0.2},
		StopGrace: sched.Duration(20e9), StopSignal: "SIGQUIT",
		Ports: []sched.Port{{Host: 8080, Container: 80, Protocol: "tcp", Mode: "ingress"},
			{Host: 5353, Container: 53, Protocol: "udp", Mode: "host"}},
		Volumes: []string{"app-data:/var/www", "shared:/shared:ro"},
		Secrets: []string{"app_db_pass:/run/secrets/db_pass", "site-tls:/etc/tls/key.pem"},
		Configs: []string{"app_site:/etc/site.conf", "motd:motd"}, // /motd, Swarm's default
		// The stack's network, and an external one as it is named.
		Networks: []string{"corp-net", "app_front"},
		Aliases:  map[string][]string{"app_front": {"www", "site"}},
		Internal: []string{"app_front"},
	}
	if g, w := jsonOf(t, web), jsonOf(t, want); g != w {
		t.Errorf("web:\n got %s\nwant %s", g, w)
	}
	if !slices.Equal(db.Networks, []string{"app_default"}) || !slices.Equal(db.Internal, []string{"app_default"}) {
		t.Errorf("db names no network: on %v (internal %v), want the stack's default, internal as the file says", db.Networks, db.Internal)
	}
	if !db.Global || db.Replicas != 0 || db.Restart.Policy != sched.RestartOnFailure || db.Restart.MaxAttempts != 2 ||
		strings.Join(db.Health.Cmd, " ") != "true" || db.StackAlias() != "db" ||
		strings.Join(db.Entrypoint, " ") != "/docker-entrypoint.sh" || strings.Join(db.Args, " ") != "postgres" ||
		db.User != "999:999" || db.WorkDir != "/var/lib/db" || !db.ReadOnly ||
		strings.Join(db.Tmpfs, " ") != "/run /tmp:64m /cache:1048576" {
		t.Errorf("db: %+v", db)
	}
	if g := jsonOf(t, plan.Volumes); g != `[{"Key":"data","Name":"app-data","External":false,"SizeBytes":2147483648,"Replicas":2},{"Key":"shared","Name":"shared","External":true,"SizeBytes":0,"Replicas":0}]` {
		t.Errorf("volumes: %s", g)
	}
	if g := jsonOf(t, plan.Secrets); g != `[{"Key":"db_pass","Name":"app_db_pass","External":false,"File":"/work/app/db_pass.txt","Env":"","Content":""},{"Key":"tls","Name":"site-tls","External":true,"File":"","Env":"","Content":""}]` {
		t.Errorf("secrets: %s", g)
	}
	if g := jsonOf(t, plan.Configs); g != `[{"Key":"motd","Name":"motd","External":true,"File":"","Env":"","Content":""},{"Key":"site","Name":"app_site","External":false,"File":"","Env":"","Content":"listen 80;"}]` {
		t.Errorf("configs: %s", g)
	}
	if len(plan.Warnings) != 2 || !strings.Contains(plan.Warnings[0], "service web: depends_on is ignored") ||
		!strings.Contains(plan.Warnings[1], "service web: network corp: internal is ignored on an external network") {
		t.Errorf("warnings: %q", plan.Warnings)
	}
}

func TestConvertRefusesWhatShoalLacks(t *testing.T) {
	p := load(t, "app", `
services:
  a:
    image: x
    privileged: true
    tmpfs: ["/x:noexec"]
    volumes: [{type: bind, source: /srv, target: /srv, bind: {propagation: shared}}]
    ports: ["80"]
  b:
    build: .
    deploy: {mode: replicated-batch}
    secrets: [{source: s, target: "a/b"}]
  Bad_Name:
    image: x
secrets:
  s: {file: ./s}
`)
	_, err := Convert(p, "app")
	if err == nil {
		t.Fatal("Convert accepted it")
	}
	for _, want := range []string{
		"service a: privileged is not supported by Shoal",
		"service a: tmpfs /x: option noexec is not supported (size only)",
		"service a: volume /srv: bind propagation shared is not supported",
		"service a: port 80: publish it on a port of its own",
		"service b: no image",
		`service b: deploy: mode "replicated-batch" is not supported`,
		`service b: secret "app_s:a/b": file "a/b" must be a plain file name`,
		"service Bad_Name: its Shoal name app-Bad_Name is not a DNS label",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if _, err := Convert(load(t, "x", "services:\n  a:\n    image: x\n"), "Bad"); err == nil || !strings.Contains(err.Error(), `stack name "Bad" is invalid`) {
		t.Errorf("bad stack name: %v", err)
	}
}

// An env_file's variables come with the environment (compose-go merges
// them); the option itself is no reason to refuse the file.
func TestConvertEnvFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "app.env"), []byte("FROM_FILE=yes\nA=file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := loader.LoadWithContext(context.Background(), types.ConfigDetails{
		WorkingDir:  dir,
		ConfigFiles: []types.ConfigFile{{Filename: filepath.Join(dir, "compose.yml"), Content: []byte("services:\n  web:\n    image: x\n    env_file: app.env\n    environment: {A: \"1\"}\n")}},
	}, func(o *loader.Options) { o.SetProjectName("app", true) })
	if err != nil {
		t.Fatal(err)
	}
	plan, err := Convert(p, "app")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(plan.Services[0].Env, " "); got != "A=1 FROM_FILE=yes" {
		t.Errorf("env %q, want A=1 (environment wins) FROM_FILE=yes", got)
	}
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestConvertJobs: Swarm's job modes map to jobs, with on-failure written
// out where the file sets no restart policy; a job that restarts always,
// which would never end, is refused.
func TestConvertJobs(t *testing.T) {
	const jobs = `
services:
  migrate:
    image: x
    deploy: {mode: replicated-job, replicas: 4}
  warm:
    image: x
    deploy: {mode: global-job, restart_policy: {condition: none}}
`
	plan, err := Convert(load(t, "app", jobs), "app")
	if err != nil {
		t.Fatal(err)
	}
	warm, migrate := plan.Services[1], plan.Services[0]
	if migrate.Mode() != sched.ModeReplicatedJob || migrate.Replicas != 4 || migrate.Restart.Policy != sched.RestartOnFailure {
		t.Errorf("migrate: %+v", migrate)
	}
	if warm.Mode() != sched.ModeGlobalJob || warm.Replicas != 0 || warm.Restart.Policy != sched.RestartNever {
		t.Errorf("warm: %+v", warm)
	}
	_, err = Convert(load(t, "app", jobs+`
  forever:
    image: x
    restart: always
    deploy: {mode: replicated-job}
`), "app")
	if err == nil || !strings.Contains(err.Error(), "service forever: a job runs to completion: restart policy always") {
		t.Errorf("forever: %v", err)
	}
}

// Two services of one file cannot publish the same port: schedd would
// refuse the second only after the first was made.
func TestConvertRefusesAPortPublishedTwice(t *testing.T) {
	p := load(t, "app", `
services:
  a: {image: x, ports: ["8080:80", "53:53/udp"]}
  b: {image: x, ports: ["8080:81"]}
  c: {image: x, ports: ["53:53"]}
`)
	_, err := Convert(p, "app")
	if err == nil || !strings.Contains(err.Error(), "service b: port 8080/tcp is published by service a too") {
		t.Fatalf("Convert: %v; want b's 8080 refused", err)
	}
	if strings.Contains(err.Error(), "service c") {
		t.Errorf("53/tcp beside 53/udp refused: %v", err)
	}
}

// cap_add, cap_drop, ulimits, sysctls, extra_hosts, pids limits and group_add map to the spec; an unknown capability is the
// spec's error, naming its service.
func TestConvertCapabilities(t *testing.T) {
	plan, err := Convert(load(t, "app", `
services:
  a:
    image: x
    cap_add: [NET_ADMIN]
    cap_drop: [ALL]
    ulimits: {nproc: 65535, nofile: {soft: 20000, hard: 40000}}
    sysctls: {net.core.somaxconn: "1024"}
    extra_hosts: ["db.internal:10.0.0.5", "cache=10.0.0.6"]
    pids_limit: 100
    group_add: [audio, "4321"]
  swarm:
    image: x
    deploy: {resources: {limits: {pids: 50}}}
  unbounded:
    image: x
    pids_limit: -1
`), "app")
	if err != nil || len(plan.Services) != 3 {
		t.Fatalf("Convert: %v", err)
	}
	if groups := plan.Services[0].Groups; !slices.Equal(groups, []string{"audio", "4321"}) {
		t.Errorf("group_add %v", groups)
	}
	if a, swarm, unbounded := plan.Services[0], plan.Services[1], plan.Services[2]; a.PidsLimit != 100 || swarm.PidsLimit != 50 || unbounded.PidsLimit != 0 {
		t.Errorf("pids limits %d, %d and %d, want 100 (pids_limit), 50 (deploy's limit) and none (-1)", a.PidsLimit, swarm.PidsLimit, unbounded.PidsLimit)
	}
	if s := plan.Services[0]; !slices.Equal(s.CapAdd, []string{"NET_ADMIN"}) || !slices.Equal(s.CapDrop, []string{"ALL"}) {
		t.Errorf("cap_add %v, cap_drop %v", s.CapAdd, s.CapDrop)
	}
	if s := plan.Services[0]; !slices.Equal(s.Ulimits, []string{"nofile=20000:40000", "nproc=65535:65535"}) || s.Sysctls["net.core.somaxconn"] != "1024" {
		t.Errorf("ulimits %v, sysctls %v", s.Ulimits, s.Sysctls)
	}
	if s := plan.Services[0]; !slices.Equal(s.Hosts, []string{"cache:10.0.0.6", "db.internal:10.0.0.5"}) {
		t.Errorf("extra hosts %v", s.Hosts)
	}
	_, err = Convert(load(t, "app", "services:\n  b: {image: x, cap_add: [NOT_A_CAP]}\n"), "app")
	if err == nil || !strings.Contains(err.Error(), `service b: capability "NOT_A_CAP" is unknown`) {
		t.Errorf("unknown capability: %v", err)
	}
}

// logging's json-file or local options set the tasks' log rotation, none
// discards their output, and another driver is ignored with a warning.
func TestConvertLogging(t *testing.T) {
	plan, err := Convert(load(t, "app", `
services:
  rotated:
    image: x
    logging: {driver: json-file, options: {max-size: 200k, max-file: "10"}}
  quiet:
    image: x
    logging: {driver: none}
  remote:
    image: x
    logging: {driver: syslog, options: {syslog-address: "udp://10.0.0.1:514"}}
`), "app")
	if err != nil || len(plan.Services) != 3 {
		t.Fatalf("Convert: %v", err)
	}
	got := map[string]sched.LogConfig{}
	for _, s := range plan.Services {
		got[s.Name] = s.Log
	}
	want := map[string]sched.LogConfig{"app-rotated": {MaxSize: 200 << 10, MaxFiles: 10}, "app-quiet": {Driver: sched.LogDriverNone}, "app-remote": {}}
	if !maps.Equal(got, want) {
		t.Errorf("log configs %+v, want %+v", got, want)
	}
	if len(plan.Warnings) != 1 || !strings.Contains(plan.Warnings[0], `service remote: logging is ignored`) || !strings.Contains(plan.Warnings[0], `"syslog"`) {
		t.Errorf("warnings %q, want one for remote's syslog", plan.Warnings)
	}
}

// healthcheck disable (or test NONE) turns off the image's HEALTHCHECK.
func TestConvertHealthcheckDisable(t *testing.T) {
	plan, err := Convert(load(t, "app", `
services:
  off:
    image: x
    healthcheck: {disable: true}
  none:
    image: x
    healthcheck: {test: ["NONE"]}
  own:
    image: x
    healthcheck: {test: "test -e /ok", interval: 5s}
`), "app")
	if err != nil || len(plan.Services) != 3 {
		t.Fatalf("Convert: %v", err)
	}
	for _, s := range plan.Services {
		want := s.Name != "app-own"
		if s.Health.Disable != want || (s.Name == "app-own") != s.Health.Enabled() {
			t.Errorf("%s: health %+v", s.Name, s.Health)
		}
	}
}

// hostname maps to the tasks' hostname, templates included.
func TestConvertHostname(t *testing.T) {
	_, err := Convert(load(t, "app", "services:\n  a: {image: x, hostname: \"{{.Task.Slot}}.a\"}\n  b: {image: x, hostname: \"bad_name\"}\n"), "app")
	if err == nil || !strings.Contains(err.Error(), `service b: hostname "bad_name"`) {
		t.Fatalf("Convert: %v, want b's hostname refused", err)
	}
	plan, err := Convert(load(t, "app", "services:\n  a: {image: x, hostname: \"{{.Task.Slot}}.a\"}\n"), "app")
	if err != nil || plan.Services[0].Hostname != "{{.Task.Slot}}.a" || len(plan.Warnings) != 0 {
		t.Fatalf("Convert: %+v, %v", plan, err)
	}
}

// rollback_config sets how a rollback walks back; continue is taken as
// pause, with a warning; rollback makes no sense there.
func TestConvertRollbackConfig(t *testing.T) {
	plan, err := Convert(load(t, "app", `
services:
  a:
    image: x
    deploy:
      rollback_config: {parallelism: 2, delay: 1s, monitor: 3s, order: start-first, failure_action: continue, max_failure_ratio: 0.5}
`), "app")
	if err != nil {
		t.Fatal(err)
	}
	want := sched.UpdateConfig{Parallelism: 2, Delay: sched.Duration(time.Second), Monitor: sched.Duration(3 * time.Second), Order: sched.StartFirst,
		FailureAction: sched.ActionPause, MaxFailureRatio: 0.5}
	if r := plan.Services[0].Rollback; r == nil || *r != want {
		t.Errorf("rollback %+v, want %+v", r, want)
	}
	if len(plan.Warnings) != 1 || !strings.Contains(plan.Warnings[0], "failure_action continue is taken as pause") {
		t.Errorf("warnings %q", plan.Warnings)
	}
	_, err = Convert(load(t, "app", "services:\n  a:\n    image: x\n    deploy: {rollback_config: {failure_action: rollback}}\n"), "app")
	if err == nil || !strings.Contains(err.Error(), `rollback_config: failure_action "rollback": want pause`) {
		t.Errorf("rollback_config failure_action rollback: %v", err)
	}
}

// TestConvertBinds: host paths, short and long syntax, read-only or not,
// a relative one made absolute from the file's directory (as docker
// stack deploy does); and init.
func TestConvertBinds(t *testing.T) {
	p := load(t, "app", `
services:
  agent:
    image: x
    deploy: {mode: global}
    volumes:
      - /proc:/host/proc:ro
      - ./conf:/etc/agent
      - {type: bind, source: /var/log, target: /logs, read_only: true}
    init: true
`)
	plan, err := Convert(p, "app")
	if err != nil {
		t.Fatal(err)
	}
	if g := strings.Join(plan.Services[0].Binds, " "); g != "/proc:/host/proc:ro /work/app/conf:/etc/agent /var/log:/logs:ro" {
		t.Errorf("binds: %s", g)
	}
	if len(plan.Volumes) != 0 {
		t.Errorf("binds made volumes: %+v", plan.Volumes)
	}
	if !plan.Services[0].Init {
		t.Error("init: true was dropped")
	}
}
