package sched

// baselineSpecFields are the spec fields schedds knew before they
// published theirs (commit d9944a7, 2026-12-06): every node knows them.
// Frozen: a field added later is left out, so that schedds publish it.
var baselineSpecFields = map[string]bool{
	"args": true, "cap_add": true, "cap_drop": true, "configs": true, "constraints": true,
	"cpu_millis": true, "entrypoint": true, "env": true, "force_update": true, "global": true,
	"health": true, "health.cmd": true, "health.disable": true, "health.http": true,
	"health.interval": true, "health.retries": true, "health.start_period": true, "health.tcp": true,
	"health.timeout": true, "hostname": true, "hosts": true, "image": true, "job": true,
	"labels": true, "log": true, "log.driver": true, "log.max_files": true, "log.max_size": true,
	"max_concurrent": true, "max_per_node": true, "memory_bytes": true, "name": true, "network": true,
	"placement": true, "placement_prefs": true, "ports": true, "ports.container": true,
	"ports.host": true, "ports.mode": true, "ports.protocol": true, "read_only": true,
	"replicas": true, "restart": true, "restart.delay": true, "restart.max_attempts": true,
	"restart.max_delay": true, "restart.policy": true, "rollback": true, "rollback.delay": true,
	"rollback.failure_action": true, "rollback.max_failure_ratio": true, "rollback.monitor": true,
	"rollback.order": true, "rollback.parallelism": true, "schedule": true, "secrets": true,
	"stack": true, "stop_grace": true, "stop_signal": true, "sysctls": true, "tmpfs": true,
	"ulimits": true, "update": true, "update.delay": true, "update.failure_action": true,
	"update.max_failure_ratio": true, "update.monitor": true, "update.order": true,
	"update.parallelism": true, "user": true, "volumes": true, "workdir": true,
}
