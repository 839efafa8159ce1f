#!/usr/bin/env bash
# it_reshard_live.sh - `ps-local.sh CONFIG reshard NEW_CONFIG` while a
# `ps-local.sh CONFIG` trains (docs/elastic.md, re-sharding while the
# workers run), with real processes: mlp training on 2 shards with 2
# ps-worker processes goes to 3 shards and back to 2 while the same
# workers run (their pids unchanged; each logs that it followed the new
# map twice and never resumes from a checkpoint); each reshard command
# exits 0 naming the stop clock and what moved; the run's ps-local.sh
# ends 0 with the workers trained to the end. A NEW_CONFIG differing in
# more than cluster.servers is refused (status 2) with the run going on.
# Then the same 2 -> 3 -> 2 for the ctr preset (an embedding table, data
# from ps-ctrgen): rows moved, the same workers, the run ending 0; staged
# (the pre-copy: the new shards loaded the old files before the stop and
# applied only the stop's incremental checkpoints after it).
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
tmp=$(mktemp -d /tmp/ps-reshard-live.XXXXXX)
run=""
cleanup() {
  [ -n "$run" ] && kill -TERM "$run" 2>/dev/null && wait "$run" 2>/dev/null
  # a failure keeps what would explain it: the runs' and the workers' last
  # lines (a worker that exits ends its run), and the folder on request
  if [ "$fails" -gt 0 ]; then
    for f in "$tmp"/run.out "$tmp"/runc.out "$tmp"/r?.out "$tmp"/rc?.out "$tmp"/l/worker-?.log \
      "$tmp"/lc/worker-?.log; do
      [ -f "$f" ] && { echo "---- $f (last 15 lines)"; tail -15 "$f"; }
    done
    [ -n "${PS_KEEP_TMP:-}" ] && echo "it_reshard_live: kept $tmp" && return
  fi
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
p0=$(free_port) p1=$(free_port) p2=$(free_port)
mkdir -p "$tmp/ck"
cat > "$tmp/c2.yaml" <<EOF
cluster:
  servers: [127.0.0.1:$p0, 127.0.0.1:$p1]
  workers: 2
model: {preset: mlp}
slice_bytes: 65536
train: {batch: 32, limit: 3200, epochs: 30}
checkpoint: {dir: $tmp/ck}
security: {auth: false}
log: {level: info}
EOF
sed "s/servers: .*/servers: [127.0.0.1:$p0, 127.0.0.1:$p1, 127.0.0.1:$p2]/" "$tmp/c2.yaml" > "$tmp/c3.yaml"
sed 's/^train:/optimizer: {lr: 0.02}\ntrain:/' "$tmp/c3.yaml" > "$tmp/lr.yaml"

scripts/ps-local.sh "$tmp/c2.yaml" --logs "$tmp/l" > "$tmp/run.out" 2>&1 &
run=$!
expect "the 2-shard run trained an epoch" wait_for "$tmp/l/worker-0.log" "epoch 2/"
workers=$(pgrep -d ' ' -f -- "ps-worker --config $tmp/c2.yaml")

scripts/ps-local.sh "$tmp/c2.yaml" reshard "$tmp/lr.yaml" > "$tmp/r0.out" 2>&1; rc=$?
expect "another optimizer.lr refused with status 2 ($rc): $(cat "$tmp/r0.out")" \
  eval '[ $rc -eq 2 ] && grep -q "differs from $tmp/c2.yaml in optimizer.lr" "$tmp/r0.out"'

scripts/ps-local.sh "$tmp/c2.yaml" reshard "$tmp/c3.yaml" > "$tmp/r1.out" 2>&1; rc=$?
expect "reshard 2 -> 3 while the workers run succeeds ($rc): $(cat "$tmp/r1.out")" [ $rc -eq 0 ]
expect "it names the stop clock and what moved: $(tail -1 "$tmp/r1.out")" \
  grep -qE "2 -> 3 shards at clock [0-9]+ while the workers ran, [0-9.]+ s from the stop to the new shards listening; 3 shard\(s\) re-sharded: [1-9][0-9]* of 19 slices" "$tmp/r1.out"
expect "the old checkpoints set aside" test -f "$(echo "$tmp"/ck/reshard-from-2.*/shard-1.ckpt)"
e=$(sed -n 's/^epoch \([0-9]*\)\/.*/\1/p' "$tmp/l/worker-0.log" | tail -1)
expect "the workers train on 3 shards" wait_for "$tmp/l/worker-0.log" "epoch $((e + 2))/"

# relative paths from another folder: the running shards were started with
# the absolute path, and the command must still find them
(cd "$tmp" && "$OLDPWD/scripts/ps-local.sh" c3.yaml reshard c2.yaml) > "$tmp/r2.out" 2>&1; rc=$?
expect "reshard 3 -> 2 while the workers run succeeds ($rc): $(cat "$tmp/r2.out")" [ $rc -eq 0 ]
expect "it names what moved: $(tail -1 "$tmp/r2.out")" \
  grep -qE "3 -> 2 shards at clock [0-9]+ while the workers ran, [0-9.]+ s from the stop to the new shards listening; 2 shard\(s\) re-sharded" "$tmp/r2.out"
expect "the same worker processes ($workers)" \
  [ "$(pgrep -d ' ' -f -- "ps-worker --config $tmp/c2.yaml")" = "$workers" ]
wait "$run"; rc=$?
run=""
expect "the run's ps-local.sh ends 0 ($rc): $(tail -3 "$tmp/run.out")" [ $rc -eq 0 ]
expect "and its workers trained to the end" grep -q "epoch 30: test accuracy" "$tmp/l/worker-0.log"
for r in 0 1; do
  n=$(grep -c "re-shard: following" "$tmp/l/worker-$r.log")
  expect "worker $r followed two re-shards ($n)" [ "$n" -eq 2 ]
  expect "worker $r never resumed from a checkpoint" \
    sh -c "! grep -q 'continuing at clock' '$tmp/l/worker-$r.log'"
done
expect "2 new checkpoints" test -f "$tmp/ck/shard-0.ckpt" -a -f "$tmp/ck/shard-1.ckpt" -a ! -e "$tmp/ck/shard-2.ckpt"

# The ctr preset (an embedding table) the same way: its rows move with
# the shards, its row pushes and pulls in flight follow the new map.
bin/ps-ctrgen --out "$tmp/train.tsv" --samples 20000 --seed 7 --scale 0.001 > /dev/null &&
  bin/ps-ctrgen --out "$tmp/test.tsv" --samples 2000 --skip 20000 --seed 7 --scale 0.001 > /dev/null ||
  bad "ps-ctrgen failed"
q0=$(free_port) q1=$(free_port) q2=$(free_port)
mkdir -p "$tmp/ckc"
cat > "$tmp/t2.yaml" <<EOF
cluster:
  servers: [127.0.0.1:$q0, 127.0.0.1:$q1]
  workers: 2
model:
  preset: ctr
  embeddings:
    - {name: cat, dim: 8, init: uniform, scale: 0.01, optimizer: rowwise_adagrad, lr: 0.05}
optimizer: {name: adam, lr: 0.001}
train: {batch: 256, epochs: 40, train_file: $tmp/train.tsv, test_file: $tmp/test.tsv}
checkpoint: {dir: $tmp/ckc}
security: {auth: false}
log: {level: info}
EOF
sed "s/servers: .*/servers: [127.0.0.1:$q0, 127.0.0.1:$q1, 127.0.0.1:$q2]/" "$tmp/t2.yaml" > "$tmp/t3.yaml"
scripts/ps-local.sh "$tmp/t2.yaml" --logs "$tmp/lc" > "$tmp/runc.out" 2>&1 &
run=$!
expect "the 2-shard ctr run trained an epoch" wait_for "$tmp/lc/worker-0.log" "epoch 2/"
workers=$(pgrep -d ' ' -f -- "ps-worker --config $tmp/t2.yaml")
scripts/ps-local.sh "$tmp/t2.yaml" reshard "$tmp/t3.yaml" > "$tmp/rc1.out" 2>&1; rc=$?
expect "ctr: reshard 2 -> 3 while the workers run succeeds ($rc): $(cat "$tmp/rc1.out")" [ $rc -eq 0 ]
expect "ctr: rows moved: $(tail -1 "$tmp/rc1.out")" \
  grep -qE "2 -> 3 shards at clock [0-9]+ while the workers ran, .* and [1-9][0-9]* of [0-9]+ rows moved" "$tmp/rc1.out"
# with a table the re-shard is staged (the pre-copy): the old shards' stop
# wrote an incremental checkpoint on their pre-copy, each new shard loaded
# the old files before the stop and applied only that after it
expect "ctr: staged: the pre-copy before the stop, the stop's increments after: $(grep -h 'pre-copy\|staged' "$tmp/runc.out" "$tmp"/lc/server-?.log | cut -c1-160 | tr '\n' ';')" \
  eval 'grep -q "pre-copy: the old shards wrote their checkpoints and the 3 new shard(s) loaded them" "$tmp/runc.out" &&
    grep -q "checkpoint (re-shard stop): .*delta-.*on the re-shard'"'"'s pre-copy" "$tmp/lc/server-1.log.before-reshard-1" &&
    [ "$(grep -l "the stop'"'"'s incremental checkpoints applied" "$tmp"/lc/server-?.log | wc -l)" -eq 3 ] &&
    [ "$(grep -l "(same placement, staged)" "$tmp"/lc/server-?.log | wc -l)" -eq 3 ]'
e=$(sed -n 's/^epoch \([0-9]*\)\/.*/\1/p' "$tmp/lc/worker-0.log" | tail -1)
expect "ctr: the workers train on 3 shards" wait_for "$tmp/lc/worker-0.log" "epoch $((e + 2))/"
scripts/ps-local.sh "$tmp/t3.yaml" reshard "$tmp/t2.yaml" > "$tmp/rc2.out" 2>&1; rc=$?
expect "ctr: reshard 3 -> 2 while the workers run succeeds ($rc): $(cat "$tmp/rc2.out")" \
  eval '[ $rc -eq 0 ] && grep -q "3 -> 2 shards at clock [0-9]* while the workers ran" "$tmp/rc2.out"'
expect "ctr: the same worker processes ($workers)" \
  [ "$(pgrep -d ' ' -f -- "ps-worker --config $tmp/t2.yaml")" = "$workers" ]
wait "$run"; rc=$?
run=""
expect "ctr: the run's ps-local.sh ends 0 ($rc): $(tail -3 "$tmp/runc.out")" [ $rc -eq 0 ]
expect "ctr: its workers trained to the end" grep -q "epoch 40: test auc" "$tmp/lc/worker-0.log"
for r in 0 1; do
  n=$(grep -c "re-shard: following" "$tmp/lc/worker-$r.log")
  expect "ctr: worker $r followed two re-shards ($n)" [ "$n" -eq 2 ]
  expect "ctr: worker $r never resumed from a checkpoint" \
    sh -c "! grep -q 'continuing at clock' '$tmp/lc/worker-$r.log'"
done

echo "$(( checks ? 100 * (checks - fails) / checks : 0 ))%: Checks: $checks, Failures: $fails, Errors: 0"
[ $fails -eq 0 ]
