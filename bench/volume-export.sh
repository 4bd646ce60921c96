#!/bin/bash
# bench/volume-export.sh times volume export (from a replica's fork on its
# own node, and on a node without a replica, which relays a member's) and
# import of 64 MiB in 16 files, on a 4-node dev cluster of statd and vold (needs root and make
# build; prints seconds, three rounds alternated).
set -euo pipefail
ctl=${SHOAL_CTL:-$(cd "$(dirname "$0")/.." && pwd)/bin/shoalctl}
dev="$ctl dev --name xb"
$dev up --nodes 4 --daemons statd,vold --subnet auto >/dev/null
trap '$dev down >/dev/null 2>&1' EXIT
x() { $dev exec "$@"; }
x 1 -- shoalctl volume create bench --replicas 3 --size 512Mi >/dev/null 2>&1
p=$(x 1 -- shoalctl volume mount bench)
for i in $(seq 16); do head -c 4M /dev/urandom > "$p/f$i"; done
sync
members=$(x 1 -- shoalctl volume inspect bench -o json | python3 -c 'import json,sys; print(" ".join(m["node"] for m in json.load(sys.stdin)["members"]))')
member=""; outside=""
for id in $(x 1 -- shoalctl node ls -o template='{{.ID}} {{.Name}}' | awk '{print $1":"$2}'); do
  nid=${id%%:*}; name=${id##*:}; idx=${name#n}
  if [[ " $members " == *" $nid "* ]]; then member=${member:-$idx}; else outside=$idx; fi
done
echo "member node $member, outside node $outside"
for round in 1 2 3; do
  s=$(date +%s.%N); x "$member" -- shoalctl volume export bench -o /tmp/xb-fork.tar 2>/tmp/xb-fork.err; e=$(date +%s.%N)
  fork=$(echo "$e - $s" | bc)
  s=$(date +%s.%N); x "$outside" -- shoalctl volume export bench -o /tmp/xb-relayed.tar 2>/tmp/xb-relayed.err; e=$(date +%s.%N)
  relayed=$(echo "$e - $s" | bc)
  echo "round $round: export on a replica's node ${fork}s, on the node without one ${relayed}s"
done
cat /tmp/xb-fork.err /tmp/xb-relayed.err
x 2 -- shoalctl volume create restored --replicas 3 --size 512Mi >/dev/null 2>&1
s=$(date +%s.%N); x 2 -- shoalctl volume import restored /tmp/xb-fork.tar; e=$(date +%s.%N)
echo "import: $(echo "$e - $s" | bc)s"
ls -la /tmp/xb-fork.tar /tmp/xb-relayed.tar
rm -f /tmp/xb-fork.tar /tmp/xb-relayed.tar /tmp/xb-*.err
