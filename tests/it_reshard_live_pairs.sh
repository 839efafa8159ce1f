#!/usr/bin/env bash
# it_reshard_live_pairs.sh - `ps-local.sh CONFIG reshard NEW_CONFIG` while
# a `ps-local.sh CONFIG` with cluster.replicas: 1 trains (docs/elastic.md,
# re-sharding while the workers run), real processes: 2 pairs training mlp
# with 2 ps-worker processes go to 3 pairs while the same workers run. The
# reshard command exits 0 naming the stop clock and what moved; old pair 0's
# two processes wrote their checkpoints at the stop and exited 0 (the
# backup following its primary's stop); old pair 1's backup is killed
# (kill -9, PS_LOCAL_CRASH_AT=stop-shard) as the stop commits, and the
# re-shard goes on from its primary's file (or the backup had written its
# checkpoint and exited 0 already: either way pair 1 is whole); all 6 new processes
# re-sharded from the 4 files and the pairs formed; each worker followed
# the new map once and never resumed from a checkpoint. Then the primary of
# new shard 0 is killed (kill -9): its backup takes over and the run's
# ps-local.sh ends 0 with the workers trained to the end. (The exact sums
# of the same path are it_reshard_live's test_pairs_2_3.)
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
tmp=$(mktemp -d /tmp/ps-reshard-live-pairs.XXXXXX)
run=""
cleanup() {
  [ -n "$run" ] && kill -TERM "$run" 2>/dev/null && wait "$run" 2>/dev/null
  # a failure (seen twice in about twenty runs, under load: the workers
  # never followed the re-shard) keeps what would explain it
  if [ "$fails" -gt 0 ]; then
    for f in "$tmp/run.out" "$tmp/r1.out" "$tmp"/l/worker-?.log "$tmp"/l/server-*.log; do
      [ -f "$f" ] && { echo "---- $f (last 25 lines)"; tail -25 "$f"; }
    done
  fi
  [ -n "${PS_KEEP_TMP:-}" ] && [ "$fails" -gt 0 ] && echo "it_reshard_live_pairs: kept $tmp" && return
  rm -rf "$tmp"
}
trap cleanup EXIT
. tests/lib-ports.sh # free_port
# waits (60 s at most) until file $1 matches pattern $2
wait_for() {
  for _ in $(seq 600); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}
unset PS_SECRET_FILE
export OPENBLAS_NUM_THREADS=1
p=(); for i in 0 1 2 3 4 5; do p+=("$(free_port "${p[@]+"${p[@]}"}")"); done
mkdir -p "$tmp/ck"
cat > "$tmp/c2.yaml" <<EOF
cluster:
  servers: [127.0.0.1:${p[0]}, 127.0.0.1:${p[1]}]
  backups: [127.0.0.1:${p[3]}, 127.0.0.1:${p[4]}]
  replicas: 1
  workers: 2
replication: {timeout_ms: 600}
model: {preset: mlp}
slice_bytes: 65536
train: {batch: 32, limit: 3200, epochs: 24}
checkpoint: {dir: $tmp/ck}
security: {auth: false}
log: {level: info}
EOF
sed -e "s/servers: .*/servers: [127.0.0.1:${p[0]}, 127.0.0.1:${p[1]}, 127.0.0.1:${p[2]}]/" \
  -e "s/backups: .*/backups: [127.0.0.1:${p[3]}, 127.0.0.1:${p[4]}, 127.0.0.1:${p[5]}]/" \
  "$tmp/c2.yaml" > "$tmp/c3.yaml"

PS_LOCAL_CRASH_AT=stop-shard scripts/ps-local.sh "$tmp/c2.yaml" --logs "$tmp/l" > "$tmp/run.out" 2>&1 &
run=$!
if ! wait_for "$tmp/l/worker-0.log" "epoch 2/"; then
  bad "the 2-pair run did not train an epoch in 60 s: $(tail -5 "$tmp/run.out")"
  echo "0%: Checks: $checks, Failures: $fails, Errors: 0"
  exit 1
fi
ok
workers=$(pgrep -d ' ' -f -- "ps-worker --config $tmp/c2.yaml")

scripts/ps-local.sh "$tmp/c2.yaml" reshard "$tmp/c3.yaml" > "$tmp/r1.out" 2>&1; rc=$?
expect "reshard of pairs 2 -> 3 while the workers run succeeds ($rc): $(cat "$tmp/r1.out")" [ $rc -eq 0 ]
expect "it names the stop clock and what moved (the 3 primaries summed): $(tail -1 "$tmp/r1.out")" \
  grep -qE "2 -> 3 shards at clock [0-9]+ while the workers ran, [0-9.]+ s from the stop to the new shards listening; 3 shard\(s\) re-sharded: [1-9][0-9]* of 19 slices" "$tmp/r1.out"
from=$(echo "$tmp"/ck/reshard-from-2.*)
expect "the old checkpoints set aside (pair 0's both, pair 1's primary's)" \
  test -f "$from/shard-0.ckpt" -a -f "$from/shard-0-r1.ckpt" -a -f "$from/shard-1.ckpt"
b=$(sed -n 's/.* shards at clock \([0-9]*\) while.*/\1/p' "$tmp/r1.out")
said="stopped at clock ${b:-x} with its checkpoint written; exiting"
expect "old backup 0 followed its primary's stop at clock ${b:-?}" \
  grep -q "$said (the backup" "$tmp/l/server-0-r1.log.before-reshard-1"
expect "old primary 1 stopped at clock ${b:-?}" grep -q "$said" "$tmp/l/server-1.log.before-reshard-1"
expect "old backup 1 was killed at the stop and the re-shard went on, or it had stopped: $(grep -h 'shard 1 r1' "$tmp/run.out")" \
  eval "grep -q 'shard 1 r1 with status 137 .*at the stop; its partner wrote the pair.s checkpoint at clock ${b:-x}: going on' '$tmp/run.out' ||
    grep -q '$said (the backup' '$tmp/l/server-1-r1.log.before-reshard-1'"
n=$(grep -l "re-sharded from 2 to 3 shards" "$tmp"/l/server-*.log 2>/dev/null | wc -l)
expect "each of the 6 new processes re-sharded ($n)" [ "$n" -eq 6 ]
echo "it_reshard_live_pairs: $(tail -1 "$tmp/r1.out")"
if grep -q 'shard 1 r1 with status 137' "$tmp/run.out"; then
  echo "it_reshard_live_pairs: old backup 1 killed at the stop; the re-shard went on from its primary's file"
else
  echo "it_reshard_live_pairs: old backup 1 had written its checkpoint and exited before the kill"
fi
for k in 0 1 2; do
  expect "new pair $k formed" wait_for "$tmp/l/server-$k-r1.log" "as its backup"
done
e=$(sed -n 's/^epoch \([0-9]*\)\/.*/\1/p' "$tmp/l/worker-0.log" | tail -1)
expect "the workers train on 3 pairs" wait_for "$tmp/l/worker-0.log" "epoch $((e + 2))/"

# kill -9 of the primary of new shard 0: its backup takes over
pid=$(pgrep -f -- "ps-server --config $tmp/c3.yaml --shard 0 --reshard-from")
pid=$(for q in $pid; do tr '\0' ' ' < "/proc/$q/cmdline" | grep -q -- "--replica 1" || echo "$q"; done)
expect "the new primary of shard 0 runs (${pid:-none})" [ -n "$pid" ]
[ -n "$pid" ] && kill -KILL $pid
expect "its backup takes over" wait_for "$tmp/l/server-0-r1.log" "now the primary of shard 0"
e=$(sed -n 's/^epoch \([0-9]*\)\/.*/\1/p' "$tmp/l/worker-0.log" | tail -1)
expect "the workers train on after the takeover" wait_for "$tmp/l/worker-0.log" "epoch $((e + 1))/"
expect "the same worker processes ($workers)" \
  [ "$(pgrep -d ' ' -f -- "ps-worker --config $tmp/c2.yaml")" = "$workers" ]
wait "$run"; rc=$?
run=""
expect "the run's ps-local.sh ends 0 ($rc): $(tail -3 "$tmp/run.out")" [ $rc -eq 0 ]
expect "and its workers trained to the end" grep -q "epoch 24: test accuracy" "$tmp/l/worker-0.log"
for r in 0 1; do
  n=$(grep -c "re-shard: following" "$tmp/l/worker-$r.log")
  expect "worker $r followed the re-shard once ($n)" [ "$n" -eq 1 ]
  expect "worker $r never resumed from a checkpoint" \
    sh -c "! grep -q 'continuing at clock' '$tmp/l/worker-$r.log'"
done

echo "$(( checks ? 100 * (checks - fails) / checks : 0 ))%: Checks: $checks, Failures: $fails, Errors: 0"
[ $fails -eq 0 ]
