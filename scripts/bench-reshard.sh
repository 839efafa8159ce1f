#!/usr/bin/env bash
# bench-reshard.sh - the training pause of a live re-shard against its bound.
#
#   scripts/bench-reshard.sh [--rows N] [--help]
#
# Issue 35's target: a re-shard pauses training for at most the moved
# state's bytes over the loopback's measured bandwidth plus one second.
# This script measures both sides in one run on this machine:
#   1. the loopback's bandwidth: ps-bench's raw TCP baseline (16 MiB
#      writes over 127.0.0.1, 3 s);
#   2. for the mlp preset (dense, slice_bytes 64 KiB) and the ctr preset
#      (an embedding table), each trained by 2 ps-worker processes under
#      `scripts/ps-local.sh`: a live re-shard 2 -> 3 and 3 -> 2 shards
#      (`ps-local.sh CONFIG reshard NEW`), the pause as the launcher prints
#      it (from the stop request to the new shards listening) and the
#      bytes the new shards say they took from another shard. The
#      workers' pause is this plus their reconnect (they follow 0.1 s
#      after the launcher rewrites their config pointer, BENCHMARKS.md).
#   3. with --rows N (say 10000000) instead: a cluster holding an embedding
#      table of N rows (dim 16, rowwise adagrad; ps-bench --op pull-rows
#      fills every row) under training (the ctr preset bagging from that
#      table, one ps-worker) re-sharded 2 -> 3 -> 2 live by
#      `ps-local.sh CONFIG reshard NEW`, as a user would: the pre-copy
#      (docs/elastic.md) included; PS_LOCAL_PRECOPY=0 in the environment
#      measures it unstaged. The pause is the launcher's (from the stop
#      request to the new shards listening), the rows moved are checked
#      against 1.2 / (N + 1), and the new shards' log lines say where
#      their time went.
# It prints one line per re-shard: pause, moved bytes, the bound
# (bytes / bandwidth + 1 s) and pause / bound (met when <= 1).
# Benchmarks are not tests: nothing here fails on a slow machine; the
# figures go to BENCHMARKS.md with the machine they came from.
set -u
cd "$(dirname "$0")/.." || exit 1
rows=0
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --rows)
      [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] ||
        { echo "bench-reshard.sh: --rows needs a row count, not '${2:-}'" >&2; exit 2; }
      rows=$2; shift 2 ;;
    *) echo "bench-reshard.sh: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
done
for b in ps-server ps-worker ps-bench ps-ctrgen; do
  [ -x "bin/$b" ] || { echo "bench-reshard.sh: bin/$b missing; run 'make' first" >&2; exit 2; }
done
. tests/lib-ports.sh # free_port
tmp=$(mktemp -d /tmp/ps-bench-reshard.XXXXXX)
run=""
cleanup() {
  [ -n "$run" ] && kill -TERM "$run" 2>/dev/null && wait "$run" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
unset PS_SECRET_FILE
export OPENBLAS_NUM_THREADS=1
# waits (120 s at most) until file $1 matches pattern $2
wait_for() {
  for _ in $(seq 1200); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  echo "bench-reshard.sh: gave up waiting for '$2' in $1" >&2
  return 1
}

# 1. the loopback's bandwidth
bp=$(free_port)
cat > "$tmp/bench.yaml" <<EOF
cluster: {servers: [127.0.0.1:$bp], workers: 1}
model: {tensors: [{name: bench, shape: [1024]}]}
security: {auth: false}
log: {level: warn}
EOF
bw=$(bin/ps-bench --config "$tmp/bench.yaml" --local --op push --size 16M -t 3 --json 2>/dev/null |
  sed -n 's/.*"raw_gb_per_s":\([0-9.]*\).*/\1/p')
[ -n "$bw" ] || { echo "bench-reshard.sh: ps-bench gave no raw TCP figure" >&2; exit 1; }
echo "loopback (raw TCP, 16 MiB writes): $bw GB/s"

# one re-shard of the running ps-local.sh: FROM TO NAME
reshard() {
  local out pause bytes bound
  out=$(scripts/ps-local.sh "$1" reshard "$2" 2>&1) || { echo "bench-reshard.sh: $3: $out" >&2; return 1; }
  pause=$(printf '%s\n' "$out" | sed -n 's/.* while the workers ran, \([0-9.]*\) s from the stop.*/\1/p' | tail -1)
  bytes=$(cat "$tmp/l/"server-*.log 2>/dev/null |
    sed -n 's/.*another shard: [0-9]* slices, [0-9]* rows, \([0-9]*\) bytes.*/\1/p' |
    awk '{ s += $1 } END { print s + 0 }')
  [ -n "$pause" ] || { echo "bench-reshard.sh: $3: no pause in: $out" >&2; return 1; }
  bound=$(awk -v b="$bytes" -v g="$bw" 'BEGIN { printf "%.3f", b / (g * 1e9) + 1 }')
  awk -v n="$3" -v p="$pause" -v b="$bytes" -v o="$bound" 'BEGIN {
    printf "%-16s pause %.3f s, %.2f MiB moved, bound %.3f s: pause/bound %.3f (%s)\n",
           n, p, b / 1048576, o, p / o, p <= o ? "met" : "MISSED" }'
}

# 3. (--rows N) a table of N rows under training, re-sharded live by
# ps-local.sh as a user would: FROM-N TO-N CONFIG NEW
rows_reshard() {
  local from=$1 to=$2 out pause moved bytes staged
  out=$(scripts/ps-local.sh "$3" reshard "$4" 2>&1) ||
    { echo "bench-reshard.sh: rows $from -> $to: $out" >&2; return 1; }
  pause=$(printf '%s\n' "$out" | sed -n 's/.* while the workers ran, \([0-9.]*\) s from the stop.*/\1/p' | tail -1)
  [ -n "$pause" ] || { echo "bench-reshard.sh: rows $from -> $to: no pause in: $out" >&2; return 1; }
  staged=unstaged
  grep -q ', staged)' "$tmp/l/server-0.log" && staged="staged: pre-copy"
  moved=$(cat "$tmp/l/"server-?.log | sed -n 's/.*another shard: [0-9]* slices, \([0-9]*\) rows.*/\1/p' |
    awk '{ s += $1 } END { print s + 0 }')
  bytes=$(cat "$tmp/l/"server-?.log | sed -n 's/.*another shard: [0-9]* slices, [0-9]* rows, \([0-9]*\) bytes.*/\1/p' |
    awk '{ s += $1 } END { print s + 0 }')
  awk -v n="rows $from -> $to" -v p="$pause" -v b="$bytes" -v g="$bw" -v st="$staged" \
      -v m="$moved" -v r="$rows" -v f="$from" -v to="$to" 'BEGIN {
    o = b / (g * 1e9) + 1
    printf "%-16s pause %.3f s (%s), %.2f MiB moved, bound %.3f s: pause/bound %.3f (%s)\n",
           n, p, st, b / 1048576, o, p / o, p <= o ? "met" : "MISSED"
    lim = (to > f ? 1.2 / to : 1.2 / f)
    printf "%-16s %d of %d rows moved: %.4f (at most %.4f: %s)\n", n, m, r, m / r, lim,
           m / r <= lim ? "met" : "MISSED" }'
  # where the new shards' time went (their log lines)
  grep -h "re-shard staged\|incremental checkpoints applied\|changes applied to the rows merged\|re-sharded from\|checkpoint (re-shard" \
    "$tmp/l/"server-?.log | sed 's/^[^ ]* *[a-z]* *//; s/^/    /'
}
# The shards run the ctr preset's model with its embedding table named
# 'bench' (dim 16, rowwise adagrad) as ps-bench makes it; ps-bench --op
# pull-rows fills N rows; then a ps-worker trains the ctr preset on it
# (ps-local.sh --workers-only beside the shards' ps-local.sh, both with
# --logs DIR: the worker follows DIR/current-config) while the cluster is
# re-sharded 2 -> 3 -> 2 live.
rows_run() {
  local p wrk
  rports=()
  for k in 0 1 2; do p=$(free_port "${rports[@]}"); rports+=("$p"); done
  rm -rf "$tmp/ck" "$tmp/l" && mkdir -p "$tmp/ck"
  bin/ps-ctrgen --out "$tmp/train.tsv" --samples 20000 --seed 7 --scale 0.001 > /dev/null &&
    bin/ps-ctrgen --out "$tmp/test.tsv" --samples 2000 --skip 20000 --seed 7 --scale 0.001 > /dev/null || return 1
  # a table ps-bench's own ('bench': dim 16, rowwise adagrad, lr 0.01) that
  # the ctr preset bags every field from; one worker (the fill's pushes
  # close their clocks alone)
  printf '%s\n' "cluster: {servers: [127.0.0.1:${rports[0]}, 127.0.0.1:${rports[1]}], workers: 1}" \
    "model:" "  preset: ctr" "  embeddings:" \
    "    - {name: bench, dim: 16, optimizer: rowwise_adagrad, lr: 0.01, fields: [$(seq -s ', ' 0 25)]}" \
    "optimizer: {name: adam, lr: 0.001}" \
    "train: {batch: 256, epochs: 1000, train_file: $tmp/train.tsv, test_file: $tmp/test.tsv}" \
    "checkpoint: {dir: $tmp/ck, every_s: 0}" "security: {auth: false}" "log: {level: info}" \
    > "$tmp/r2.yaml"
  sed "s/servers: .*/servers: [127.0.0.1:${rports[0]}, 127.0.0.1:${rports[1]}, 127.0.0.1:${rports[2]}], workers: 1}/" \
    "$tmp/r2.yaml" > "$tmp/r3.yaml"
  scripts/ps-local.sh "$tmp/r2.yaml" --servers-only --logs "$tmp/l" > "$tmp/run.out" 2>&1 &
  run=$!
  wait_for "$tmp/run.out" "shards running" || return 1
  echo "filling $rows rows of dim 16 on 2 shards (ps-bench --op pull-rows), then 2 workers train..."
  bin/ps-bench --config "$tmp/r2.yaml" --op pull-rows --rows "$rows" --dim 16 --seconds 1 \
    --no-baseline > "$tmp/fill.out" 2>&1 || { cat "$tmp/fill.out" >&2; return 1; }
  scripts/ps-local.sh "$tmp/r2.yaml" --workers-only --logs "$tmp/l" > "$tmp/workers.out" 2>&1 &
  wrk=$!
  wait_for "$tmp/l/worker-0.log" "epoch 1/" || { kill -TERM "$wrk"; return 1; }
  rows_reshard 2 3 "$tmp/r2.yaml" "$tmp/r3.yaml" || { kill -TERM "$wrk"; return 1; }
  sleep 3
  rows_reshard 3 2 "$tmp/r3.yaml" "$tmp/r2.yaml" || { kill -TERM "$wrk"; return 1; }
  kill -TERM "$wrk" 2>/dev/null; wait "$wrk" 2>/dev/null
  kill -TERM "$run" 2>/dev/null; wait "$run" 2>/dev/null; run=""
}
if [ "$rows" -gt 0 ]; then
  rows_run || exit 1
  exit 0
fi

# 2. the two presets
case_run() { # NAME CONFIG-BODY
  local name=$1 body=$2 p0 p1 p2
  p0=$(free_port) p1=$(free_port "$p0") p2=$(free_port "$p0" "$p1")
  rm -rf "$tmp/l" "$tmp/ck" && mkdir -p "$tmp/ck"
  printf 'cluster:\n  servers: [127.0.0.1:%s, 127.0.0.1:%s]\n  workers: 2\n%s\ncheckpoint: {dir: %s/ck}\nsecurity: {auth: false}\nlog: {level: info}\n' \
    "$p0" "$p1" "$body" "$tmp" > "$tmp/c2.yaml"
  sed "s/servers: .*/servers: [127.0.0.1:$p0, 127.0.0.1:$p1, 127.0.0.1:$p2]/" "$tmp/c2.yaml" > "$tmp/c3.yaml"
  scripts/ps-local.sh "$tmp/c2.yaml" --logs "$tmp/l" > "$tmp/run.out" 2>&1 &
  run=$!
  wait_for "$tmp/l/worker-0.log" "epoch 2/" || return 1
  reshard "$tmp/c2.yaml" "$tmp/c3.yaml" "$name 2 -> 3" || return 1
  sleep 3
  reshard "$tmp/c3.yaml" "$tmp/c2.yaml" "$name 3 -> 2" || return 1
  sleep 3
  kill -TERM "$run" 2>/dev/null; wait "$run" 2>/dev/null; run=""
}
case_run mlp "model: {preset: mlp}
slice_bytes: 65536
train: {batch: 32, epochs: 1000}" || exit 1
bin/ps-ctrgen --out "$tmp/train.tsv" --samples 20000 --seed 7 --scale 0.001 > /dev/null &&
  bin/ps-ctrgen --out "$tmp/test.tsv" --samples 2000 --skip 20000 --seed 7 --scale 0.001 > /dev/null || exit 1
case_run ctr "model:
  preset: ctr
  embeddings:
    - {name: cat, dim: 8, init: uniform, scale: 0.01, optimizer: rowwise_adagrad, lr: 0.05}
optimizer: {name: adam, lr: 0.001}
train: {batch: 256, epochs: 1000, train_file: $tmp/train.tsv, test_file: $tmp/test.tsv}" || exit 1
