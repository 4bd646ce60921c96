#!/usr/bin/env bash
# bench/run.sh runs Shoal's benchmarks and writes docs/BENCHMARKS.md: a
# header (date, machine, commit) followed by the Markdown each benchmark
# program prints. `make bench` runs it after `make build`.
#
# Environment:
#   BENCH_QUICK=1        scaled-down run (about a minute) to check the setup;
#                        it is also passed on to the programs
#   BENCHES="mst statd gossip cluster sched schedd wg netd vold"  the programs under bench/ to run, in order
#   BENCH_DIR=DIR        where the databases go (default: a new dir in $TMPDIR
#                        or /tmp); its filesystem is the one measured
#   BENCH_<NAME>_FLAGS=  extra flags for go run ./bench/<name>, e.g.
#                        BENCH_STATD_FLAGS="-keys 200000" (see -help)
#   BENCH_OUT=FILE       output file (default docs/BENCHMARKS.md)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
GO=${GO:-go}
out=${BENCH_OUT:-docs/BENCHMARKS.md}

if [[ ! -x bin/shoal-statd ]]; then
	echo "bench/run.sh: bin/shoal-statd is missing: run 'make build' (or 'make bench')" >&2
	exit 1
fi

# Every benchmark runs in its own process group (job control), so that an
# interrupted run can take down go run, the benchmark and the daemons it
# started, and nothing else.
set -m
work=$(mktemp -d "${TMPDIR:-/tmp}/shoal-bench.XXXXXX")
benchdir=${BENCH_DIR:-$work}
mkdir -p "$benchdir"
job=""
cleanup() {
	local rc=$?
	trap - EXIT INT TERM HUP
	if [[ -n "$job" ]] && kill -0 "$job" 2>/dev/null; then
		kill -TERM -- "-$job" 2>/dev/null || true
		# The benchmark cleans up after itself on SIGTERM (a cluster's
		# teardown can take several seconds); give it up to a minute.
		for _ in $(seq 600); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
		kill -KILL -- "-$job" 2>/dev/null || true
	fi
	rm -rf "$work"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# run NAME FLAGS...: bench/NAME (built by build_benches) with FLAGS...,
# its Markdown in $work/NAME.md and its progress on stderr.
run() {
	local name=$1
	shift
	echo "== bench/$name $*" >&2
	"$work/bin/$name" "$@" >"$work/$name.md" &
	job=$!
	local rc=0
	wait "$job" || rc=$?
	job=""
	if ((rc != 0)); then
		echo "bench/run.sh: bench/$name failed (exit $rc)" >&2
		exit "$rc"
	fi
}

# flags NAME: the flags bench/NAME gets, one per line.
flags() {
	local name=$1
	case "$name" in
	mst)
		[[ "$quick" == 1 ]] && printf '%s\n' -sizes 100000 -reps 1 -root-runs 21 -diff-keys 20000 -trials 2
		;;
	statd)
		printf '%s\n' -dir "$benchdir" -statd-bin "$root/bin/shoal-statd"
		[[ "$quick" == 1 ]] && printf '%s\n' -reps 2 -duration 500ms -keys 100000 -restarts 3 -list-runs 1 -quiet-wait 0
		;;
	netd)
		[[ "$quick" == 1 ]] && printf '%s\n' -load-duration 1s -load-requests 50000 -dns-duration 1s -health-tasks 2 -restarts 1
		;;
	vold)
		[[ "$quick" == 1 ]] && printf '%s\n' -seq-mib 16 -reps 1 -rand-duration 1s -read-duration 1s -failovers 1 -idle-volumes 100 -idle 5s -kv-duration 1s -settle 1s -quiesce-wait 30s -quiet-wait 0
		;;
	esac
	local var="BENCH_${name^^}_FLAGS"
	# Word splitting of the extra flags is intended; globbing is not.
	local -
	set -f
	[[ -n "${!var:-}" ]] && printf '%s\n' ${!var}
	return 0
}

quick=${BENCH_QUICK:-0}
export BENCH_QUICK=$quick
mode="full"
if [[ "$quick" == 1 ]]; then
	mode="quick (BENCH_QUICK=1: fewer keys and repetitions; not for comparison)"
fi
read -r -a benches <<<"${BENCHES:-mst statd gossip cluster sched schedd wg netd vold}"
for name in "${benches[@]}"; do
	if [[ ! -d "bench/$name" ]]; then
		echo "bench/run.sh: no benchmark bench/$name" >&2
		exit 2
	fi
done

# Every benchmark program is built before the first runs, and the commit
# is read then, beside make's build of bin/: the header names the code
# that ran, even if the working tree is edited while the benchmarks run
# (go run would build each program from the tree as it was when its turn
# came).
mkdir -p "$work/bin"
for name in "${benches[@]}"; do
	"$GO" build -o "$work/bin/$name" "./bench/$name"
done
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
	commit="$commit (with uncommitted changes in the working tree)"
fi

start=$(date +%s)
for name in "${benches[@]}"; do
	mapfile -t args < <(flags "$name")
	run "$name" "${args[@]}"
done
elapsed=$(($(date +%s) - start))
cpus=$(nproc)
model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
mem=$(awk '/^MemTotal:/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)
fs=$(findmnt -n -o FSTYPE,SOURCE --target "$benchdir" 2>/dev/null | awk '{ print $1 " on " $2 }' || true)
[[ -n "$fs" ]] || fs=$(stat -f -c %T "$benchdir")

tmp_out="$work/BENCHMARKS.md"
{
	echo "# Shoal benchmarks"
	echo
	echo "Written by \`make bench\` (bench/run.sh); do not edit by hand. Every figure is measured in the same run as its baseline."
	echo
	echo "- Date: $(date -u '+%Y-%m-%d %H:%M UTC') (run took ${elapsed} s, mode: $mode)"
	echo "- Commit: $commit"
	echo "- Machine: $cpus CPUs (${model:-unknown CPU}), $mem RAM, $(uname -s) $(uname -r) $(uname -m)"
	echo "- Go: $("$GO" env GOVERSION)"
	echo "- Bench dir filesystem: $fs"
	echo
	for name in "${benches[@]}"; do
		cat "$work/$name.md"
	done
} >"$tmp_out"
mkdir -p "$(dirname "$out")"
cp "$tmp_out" "$out"
cat "$out"
