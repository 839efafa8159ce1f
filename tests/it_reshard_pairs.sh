#!/usr/bin/env bash
# it_reshard_pairs.sh - `ps-local.sh CONFIG reshard NEW_CONFIG` and
# `ps-cluster.sh CONFIG reshard NEW_CONFIG` with cluster.replicas: 1
# (docs/elastic.md, re-sharding by restart), real processes:
#  - ps-local.sh --restart: 2 pairs training mlp (2 workers) are stopped at a clock
#    boundary, both processes of each old pair having written a checkpoint;
#    3 pairs start from them, every one of the 6 new processes says it
#    re-sharded, the pairs form, the workers resume at the checkpoint's
#    clock and finish; each new process wrote its own checkpoint;
#  - ps-cluster.sh (an ssh stand-in running the commands here): 3 pairs
#    back to 2, the old backups' shard-K-r1 files set aside with the
#    primaries', started (pairs formed), then stopped cleanly.
# Prints Check-style "N%: Checks" so scripts/run-tests.sh summarises it.
set -u
cd "$(dirname "$0")/.." || exit 1
checks=0 fails=0
ok() { checks=$((checks + 1)); }
bad() { checks=$((checks + 1)); fails=$((fails + 1)); echo "FAIL: $*"; }
expect() { # DESCRIPTION COMMAND...
  local what=$1; shift
  if "$@"; then ok; else bad "$what"; fi
}
tmp=$(mktemp -d /tmp/ps-reshard-pairs.XXXXXX)
started=() # the ps-local.sh runs this script started in the background
cleanup() {
  local p
  kill_jobs TERM ${started[@]+"${started[@]}"} # (not waited for yet: scripts/ps-lib.sh)
  for p in "${started[@]+"${started[@]}"}"; do wait "$p" 2>/dev/null; done
  scripts/ps-cluster.sh "$tmp/c2.yaml" stop --ssh "$tmp/ssh" --logs "$tmp/logs" >/dev/null 2>&1
  rm -rf "$tmp"
}
trap cleanup EXIT
. tests/lib-ports.sh # free_port
. scripts/ps-lib.sh # kill_jobs
unset PS_SECRET_FILE
export OPENBLAS_NUM_THREADS=1
p=() ; for i in 0 1 2 3 4 5; do p+=("$(free_port)"); done
mkdir -p "$tmp/ck"
cat > "$tmp/c2.yaml" <<EOF
cluster:
  servers: [127.0.0.1:${p[0]}, 127.0.0.1:${p[1]}]
  backups: [127.0.0.1:${p[3]}, 127.0.0.1:${p[4]}]
  replicas: 1
  workers: 2
replication: {timeout_ms: 1000}
model: {preset: mlp}
slice_bytes: 65536
train: {batch: 32, limit: 3200, epochs: 40, metrics_dir: "$tmp/m"}
checkpoint: {dir: $tmp/ck}
security: {auth: false}
log: {level: info}
EOF
sed -e "s/servers: .*/servers: [127.0.0.1:${p[0]}, 127.0.0.1:${p[1]}, 127.0.0.1:${p[2]}]/" \
  -e "s/backups: .*/backups: [127.0.0.1:${p[3]}, 127.0.0.1:${p[4]}, 127.0.0.1:${p[5]}]/" \
  "$tmp/c2.yaml" > "$tmp/c3.yaml"

# ps-local.sh: 2 pairs training, re-sharded to 3 while they run
scripts/ps-local.sh "$tmp/c2.yaml" --logs "$tmp/l2" > "$tmp/run2.out" 2>&1 &
old=$!; started+=("$old")
for _ in $(seq 900); do grep -q "epoch 2/" "$tmp/l2/worker-0.log" 2>/dev/null && break; sleep 0.1; done
expect "the 2-pair run trained an epoch: $(tail -3 "$tmp/run2.out")" grep -q "epoch 2/" "$tmp/l2/worker-0.log"
scripts/ps-local.sh "$tmp/c2.yaml" reshard "$tmp/c3.yaml" --restart --logs "$tmp/l3" -- --epochs 3 \
  > "$tmp/run3.out" 2>&1; rc=$?
wait $old; oldrc=$?; started=()
expect "reshard of pairs 2 -> 3 succeeds ($rc): $(tail -5 "$tmp/run3.out")" [ $rc -eq 0 ]
expect "the old ps-local.sh was stopped as Ctrl-C stops it ($oldrc)" [ $oldrc -eq 130 ]
from=$(echo "$tmp"/ck/reshard-from-2.*)
expect "both processes of each old pair wrote a checkpoint, set aside" \
  test -f "$from/shard-0.ckpt" -a -f "$from/shard-0-r1.ckpt" -a -f "$from/shard-1.ckpt" -a -f "$from/shard-1-r1.ckpt"
expect "it says what moved (summed over the 3 primaries): $(grep moved "$tmp/run3.out")" \
  grep -qE "reshard: 3 shard\(s\) re-sharded: [1-9][0-9]* of 19 slices" "$tmp/run3.out"
n=$(grep -l "re-sharded from 2 to 3 shards" "$tmp"/l3/server-*.log 2>/dev/null | wc -l)
expect "each of the 6 new processes re-sharded ($n)" [ "$n" -eq 6 ]
n=$(cat "$tmp"/l3/server-*.log | grep -c "replication: now the primary")
expect "3 pairs formed: one primary each ($n)" [ "$n" -ge 3 ]
clock=$(sed -n 's/.*continuing at clock \([0-9]*\).*/\1/p' "$tmp/l3/worker-0.log" | head -1)
expect "the workers resumed at the checkpoint's clock (${clock:-none})" [ "${clock:-0}" -ge 50 ]
expect "and trained to the end" grep -q "epoch 3: test accuracy" "$tmp/l3/worker-0.log"
for k in 0 1 2; do
  expect "new pair $k: both processes' checkpoints" test -f "$tmp/ck/shard-$k.ckpt" -a -f "$tmp/ck/shard-$k-r1.ckpt"
done

# ps-cluster.sh: 3 pairs -> 2, the cluster stopped already; every host is
# this machine (the stand-in runs each command here)
cat > "$tmp/ssh" <<'EOF'
#!/usr/bin/env bash
[ "$1" = -- ] || { echo "ssh stand-in: '$1' where -- belongs" >&2; exit 255; }
exec sh -c "$3"
EOF
chmod +x "$tmp/ssh"
scripts/ps-cluster.sh "$tmp/c3.yaml" reshard "$tmp/c2.yaml" --ssh "$tmp/ssh" --logs "$tmp/logs" \
  -- --epochs 4 > "$tmp/run4.out" 2>&1; rc=$?
expect "ps-cluster.sh reshard of pairs 3 -> 2 succeeds ($rc): $(tail -8 "$tmp/run4.out")" [ $rc -eq 0 ]
expect "it says what moved" grep -qE "reshard: 2 shard\(s\) re-sharded: [1-9][0-9]* of 19 slices" "$tmp/run4.out"
from=$(echo "$tmp"/ck/reshard-from-3.*)
expect "the old backups' files set aside too" test -f "$from/shard-2-r1.ckpt" -a ! -e "$tmp/ck/shard-2-r1.ckpt"
expect "it started 2 backups" [ "$(grep -c '^  backup [01] on' "$tmp/run4.out")" -eq 2 ]
for _ in $(seq 900); do
  st=$(scripts/ps-cluster.sh "$tmp/c2.yaml" status --ssh "$tmp/ssh" --logs "$tmp/logs")
  grep -q 'worker .*: running' <<< "$st" || break
  sleep 0.1
done
expect "its workers trained to the end" grep -q "epoch 4 test accuracy" "$tmp/logs/c2.run/worker-0.log"
scripts/ps-cluster.sh "$tmp/c2.yaml" stop --ssh "$tmp/ssh" --logs "$tmp/logs" > "$tmp/stop.out" 2>&1
expect "and its 4 processes stop cleanly: $(cat "$tmp/stop.out")" \
  [ "$(grep -cE '(shard|backup) .*: not running \(exited with status 0\)' "$tmp/stop.out")" -eq 4 ]

echo "$(( checks ? 100 * (checks - fails) / checks : 0 ))%: Checks: $checks, Failures: $fails, Errors: 0"
[ $fails -eq 0 ]
