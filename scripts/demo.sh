#!/usr/bin/env bash
# make demo: a 3-node Shoal cluster on this machine, one network namespace
# per node (each with its own containerd), running a replicated service:
# state converging, placement without a master, failover, a replicated
# volume. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
ctl=${SHOAL_CTL:-bin/shoalctl}
nodes=${NODES:-3}
image=${DEMO_IMAGE:-$PWD/bin/busybox.tar}
# DEMO_NAME and DEMO_SUBNET (e2e's TestDemo sets them) make it a named dev
# cluster on a subnet of its own, which leaves the default one alone.
dev="$ctl dev${DEMO_NAME:+ --name $DEMO_NAME}"
x() { $dev exec "$@"; }

if [ "$(id -u)" != 0 ]; then
  echo "make demo needs root (it creates network namespaces)" >&2
  exit 1
fi

if $dev status >/dev/null 2>&1; then
  echo "== a dev cluster exists already; removing it"
  $dev down
fi

echo "== starting $nodes nodes (statd, schedd, netd, vold and a containerd each)"
$dev up --nodes "$nodes" ${DEMO_SUBNET:+--subnet "$DEMO_SUBNET"}

echo
echo "== state: write on node 1, read on every node"
x 1 -- shoalctl state put /demo/greeting text="hello from node 1"
for i in $(seq 1 "$nodes"); do
  for _ in $(seq 1 50); do
    if out=$(x "$i" -- shoalctl state get /demo/greeting -o json 2>/dev/null); then break; fi
    sleep 0.1
  done
  echo "node $i: $(echo "$out" | grep '"text"' | tr -s ' ')"
done

# Every node's scheduler ready and known to every node, so that placement
# sees the whole cluster.
for i in $(seq 1 "$nodes"); do
  for _ in $(seq 1 100); do
    if x "$i" -- shoalctl service ls >/dev/null 2>&1 &&
      [ "$(x "$i" -- shoalctl state ls /nodes/ -o json 2>/dev/null | grep -c '"schedd_port"')" -ge "$nodes" ]; then
      break
    fi
    sleep 0.2
  done
done

echo
echo "== load an image on node 1 only (built from Debian's static busybox)"
x 1 -- shoalctl image load "$image"
# Node 2 hears of it by gossip a moment later; a create there waits
# for that record (up to 3 s) rather than refusing the image.

echo
echo "== create a 3-replica service from node 2: placed without a master"
x 2 -- shoalctl service create hello --image local/busybox:latest --replicas 3 --stop-grace 2s --publish 8080:80 -- \
  sh -c 'echo "hello from $HOSTNAME" | tee /www/index.html; exec httpd -f -p 80 -h /www'
x 3 -- shoalctl service ps hello
echo
echo "(nodes 2 and 3 fetched the image from node 1, by digest)"
x 3 -- shoalctl image ls

echo
echo "== logs of every task, read from node 3"
x 3 -- shoalctl service logs hello

echo
echo "== port 8080 answers on every node's address, whichever node runs a replica"
# A node's proxy learns of the replicas through state, a moment after
# they run: a few tries each.
fetch() {
  for _ in $(seq 1 10); do
    wget -qO- -T 2 "$1" 2>/dev/null && return
    sleep 0.5
  done
  echo unreachable
}
for i in $(seq 1 "$nodes"); do
  addr=$($dev status -o json | grep '"addr"' | sed -n "${i}p" | cut -d'"' -f4)
  [ -n "$addr" ] && echo "http://$addr:8080/ -> $(fetch "http://$addr:8080/")"
done

echo
echo "== what the replicas use (CPU, memory, the requests they answered), each node sampling its own"
x 2 -- shoalctl service stats hello --no-stream

echo
echo "== every task finds the others by name over the WireGuard overlay"
task=$(x 1 -- shoalctl task ls --service hello -o json | grep -m1 '"id"' | cut -d'"' -f4)
x 1 -- shoalctl task exec "$task" -- nslookup hello.shoal | grep -A1 'Name:' || true
x 1 -- shoalctl network inspect

echo
echo "== a replicated volume: one Raft group, 3 replicas, mounted with FUSE where a task uses it"
x 1 -- shoalctl volume create notes --replicas 3 --size 64Mi
x 2 -- shoalctl service create scribe --image local/busybox:latest --replicas 1 --stop-grace 1s --volume notes:/notes -- \
  sh -c 'while true; do echo "$(date) from $HOSTNAME" >> /notes/log; sleep 1; done'
sleep 3
x 3 -- shoalctl volume inspect notes

echo
echo "== restart the volume daemon under the scribe: the mount outlives vold, the task only pauses"
task_field() { x 1 -- shoalctl service ps scribe -o json | grep -m1 "\"$1\"" | cut -d'"' -f4; }
for _ in $(seq 1 60); do
  [ "$(task_field state)" = running ] && break
  sleep 0.5
done
scribe=$(task_field id)
snode=$(x 1 -- shoalctl node ls | awk -v id="$(task_field node)" '$1==id{print $2}')
$dev kill "${snode#n}" vold
sleep 2
$dev start "${snode#n}" vold
sleep 3
x 1 -- shoalctl service ps scribe
if [ "$(task_field id)" = "$scribe" ]; then
  echo "(the same task $scribe, never restarted: vold on $snode came back and served its mount again)"
fi

echo
echo "== kill node $nodes (its daemons and containers); its replica moves"
$dev kill "$nodes"
for _ in $(seq 1 60); do
  running=$(x 1 -- shoalctl service ls -o json | grep -m1 '"running"' | tr -dc 0-9)
  [ "$running" = 3 ] && ! x 1 -- shoalctl service ps hello | grep -q "$(x 1 -- shoalctl node ls | awk -v n="n$nodes" '$2==n{print $1}')" && break
  sleep 0.5
done
x 1 -- shoalctl service ps hello
x 1 -- shoalctl cluster status

echo
echo "== bring node $nodes back: it rejoins, no duplicate survives"
$dev start "$nodes"
sleep 5
x 1 -- shoalctl service ps hello
echo
# The returned node's vold rejoins the volume's group and catches up.
for _ in $(seq 1 60); do
  x 1 -- shoalctl volume inspect notes -o json | grep -q '"health": *"healthy"' && break
  sleep 0.5
done
echo "(the volume kept taking writes; node $nodes's replica caught up; --digests hashes each replica: equal at equal applied indexes)"
x 1 -- shoalctl volume inspect notes --digests

cat <<MSG

The cluster keeps running. Try:
  $dev exec 1 -- shoalctl events           # then scale in another terminal
  $dev exec 1 -- shoalctl service scale hello=6
  $dev exec 2 -- shoalctl stats            # CPU, memory, network of every task
  $dev exec 2 -- shoalctl task ls
  $dev exec 3 -- shoalctl task exec <task-id> -- hostname
  $dev exec 1 -- shoalctl node ls
  $dev exec 2 -- shoalctl volume mount notes   # prints a host path: cat <path>/log
  $dev exec 3 -- shoalctl volume export notes -o /tmp/notes.tar
  $dev exec 1 -- shoalctl lock acquire deploy --ttl 30s
  $dev partition 1 2,3   # cut node 1 off; $dev heal to restore
  $dev down              # remove everything
MSG
