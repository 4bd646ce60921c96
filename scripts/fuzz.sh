#!/usr/bin/env bash
# scripts/fuzz.sh PKG:TARGET... runs each fuzz target for $FUZZTIME (go test
# allows one target per run). A run that ends with "context deadline
# exceeded" and no failing input is Go's fuzz coordinator missing its own
# -fuzztime deadline (a known flake on a loaded machine, not a finding): it
# is run again, up to twice. Any other failure, or a failing input, fails at
# once.
#
# Minimizing each new interesting input may take up to a minute by default
# and counts against -fuzztime: it stalled FuzzApply runs for 20 s and
# more (no executions counted), and a run still minimizing at its end
# overran the deadline. A second is enough for a short run (a failing
# input is still written, less minimized).
set -uo pipefail
go=${GO:-go}
fuzztime=${FUZZTIME:-10s}
minimizetime=${FUZZMINIMIZETIME:-1s}
for t in "$@"; do
  pkg=${t%%:*}
  fn=${t##*:}
  for attempt in 1 2 3; do
    echo "fuzz $pkg $fn ($fuzztime)"
    out=$("$go" test -run='^$' -fuzz="^$fn\$" -fuzztime="$fuzztime" -fuzzminimizetime="$minimizetime" "./$pkg" 2>&1)
    rc=$?
    printf '%s\n' "$out"
    if ((rc == 0)); then
      break
    fi
    if ((attempt < 3)) && grep -q 'context deadline exceeded' <<<"$out" && ! grep -q 'Failing input written to' <<<"$out"; then
      echo "fuzz $pkg $fn: the fuzz coordinator overran its deadline without a finding; running it again"
      continue
    fi
    exit "$rc"
  done
done
