#!/usr/bin/env bash
# make demo: a 3-node Shoal cluster on this machine, one network namespace
# per node, and state converging across it. Needs root (namespaces).
set -euo pipefail
cd "$(dirname "$0")/.."
ctl=bin/shoalctl
nodes=${NODES:-3}

if [ "$(id -u)" != 0 ]; then
  echo "make demo needs root (it creates network namespaces)" >&2
  exit 1
fi
command -v ip >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends iproute2 nftables; }

if $ctl dev status >/dev/null 2>&1; then
  echo "== a dev cluster exists already; removing it"
  $ctl dev down
fi

echo "== starting $nodes nodes"
$ctl dev up --nodes "$nodes"

echo
echo "== write on node 1"
$ctl dev exec 1 -- shoalctl state put /demo/greeting text="hello from node 1" count:int=1

echo
echo "== read it on every node"
for i in $(seq 1 "$nodes"); do
  for _ in $(seq 1 50); do
    if out=$($ctl dev exec "$i" -- shoalctl state get /demo/greeting -o json 2>/dev/null); then break; fi
    sleep 0.1
  done
  echo "node $i: $(echo "$out" | tr -d '\n' | sed 's/  */ /g')"
done

echo
echo "== concurrent writes to different fields on nodes 2 and $nodes merge"
$ctl dev exec 2 -- shoalctl state put /demo/greeting from2=yes
$ctl dev exec "$nodes" -- shoalctl state put /demo/greeting "from$nodes=yes"
sleep 1
$ctl dev exec 1 -- shoalctl state get /demo/greeting

echo
echo "== every node's Merkle root"
for i in $(seq 1 "$nodes"); do
  echo "node $i: $($ctl dev exec "$i" -- shoalctl cluster status -o json | grep -m1 '"root_hash"')"
done

echo
echo "== membership as node $nodes sees it"
$ctl dev exec "$nodes" -- shoalctl cluster status

cat <<MSG

The cluster keeps running. Try:
  $ctl dev exec 2 -- shoalctl node ls
  $ctl dev kill 3            # SIGKILL node 3's daemons; watch it turn dead:
  $ctl dev exec 1 -- shoalctl cluster status
  $ctl dev start 3           # it comes back alive and catches up
  $ctl dev partition 1 2,3   # cut node 1 off; $ctl dev heal to restore
  $ctl dev down              # remove everything
MSG
