#!/bin/bash
# bench-ctr.sh - the ctr preset's figures (BENCHMARKS.md): samples/s with 2
# shards and 2 workers on loopback, and what admission N does to the
# table's rows and the held-out AUC, in one run:
#
#   scripts/bench-ctr.sh [N=10] [SAMPLES=1000000] [SCALE=0.1]
#   scripts/bench-ctr.sh --replicas [SAMPLES=1000000] [SCALE=0.1]
#
# Writes a click log and a held-out continuation with ps-ctrgen, then
# trains one epoch without admission and one with admission N on the same
# data (sync, batch 1024, dim 16, rowwise adagrad) and prints, for each:
# the two workers' samples/s (training steps only, summed), the table's
# rows on the shards at the end, the held-out AUC and logloss, and the
# generator's best achievable AUC. With --replicas: the cost of replication
# instead, two rounds of one epoch without admission on 2 shards with
# cluster.replicas 0 and 1, the second round in the other order (replicas 1:
# each shard a primary and a backup
# process, the tables replicated), the same data. Run from the repository
# root after make.
set -eu
REPL=0
if [ "${1:-}" = --replicas ]; then REPL=1; shift; set -- 10 "$@"; fi
N=${1:-10}; SAMPLES=${2:-1000000}; SCALE=${3:-0.1}
D=$(mktemp -d /tmp/ps-bench-ctr-XXXXXX)
trap 'kill $S0 $S1 $B0 $B1 2>/dev/null; rm -rf "$D"' EXIT
S0=; S1=; B0=; B1=
bin/ps-ctrgen --out "$D/train.tsv" --samples "$SAMPLES" --scale "$SCALE" --seed 5 --admission "$N"
best=$(bin/ps-ctrgen --out "$D/test.tsv" --samples $((SAMPLES / 10)) --skip "$SAMPLES" \
	--scale "$SCALE" --seed 5 --json | sed -n 's/.*"best_auc":\([0-9.]*\).*/\1/p')
run() { # run ADMISSION [REPLICAS]
  local p0 p1 w0 r=${2:-0} rep=
  p0=$(( (RANDOM % 20000) + 10000 )); p1=$((p0 + 1))
  [ "$r" = 1 ] && rep=", backups: [127.0.0.1:$((p0 + 2)), 127.0.0.1:$((p0 + 3))], replicas: 1"
  rm -rf "$D/m$1" # each run's own figures (the workers append to their files)
  cat > "$D/c.yaml" <<YAML
cluster: {servers: [127.0.0.1:$p0, 127.0.0.1:$p1], workers: 2$rep}
consistency: {mode: sync}
security: {auth: false}
model:
  preset: ctr
  embeddings:
    - {name: cat, dim: 16, init: uniform, scale: 0.01, optimizer: rowwise_adagrad, lr: 0.05, admission: $1}
optimizer: {name: adam, lr: 0.001}
train: {train_file: '$D/train.tsv', test_file: '$D/test.tsv', batch: 1024, epochs: 1, metrics_dir: '$D/m$1'}
log: {level: warn}
YAML
  bin/ps-server --config "$D/c.yaml" --shard 0 & S0=$!
  bin/ps-server --config "$D/c.yaml" --shard 1 & S1=$!
  if [ "$r" = 1 ]; then
    bin/ps-server --config "$D/c.yaml" --shard 0 --replica 1 & B0=$!
    bin/ps-server --config "$D/c.yaml" --shard 1 --replica 1 & B1=$!
  fi
  sleep 0.5
  OPENBLAS_NUM_THREADS=1 bin/ps-worker --config "$D/c.yaml" --rank 0 > "$D/w0.out" 2>/dev/null & w0=$!
  OPENBLAS_NUM_THREADS=1 bin/ps-worker --config "$D/c.yaml" --rank 1 2>/dev/null
  wait $w0
  rows=$(bin/ps-stat --config "$D/c.yaml" --json | grep -o '"rows":[0-9]*' | awk -F: '{s += $2} END {print s}')
  kill $S0 $S1 $B0 $B1 2>/dev/null; wait $S0 $S1 $B0 $B1 2>/dev/null || true
  B0=; B1=
  sps=$(cat "$D/m$1"/worker-*.jsonl | sed -n 's/.*"samples_per_s":\([0-9.]*\).*/\1/p' | awk '{s += $1} END {printf "%.0f", s}')
  auc=$(sed -n 's/^epoch 1 test auc \([0-9.]*\) logloss \([0-9.]*\)/\1 \2/p' "$D/w0.out")
  printf "admission %-3s replicas %s %8s samples/s (2 workers)  %9s rows  held-out auc/logloss %s\n" "$1" "$r" "$sps" "$rows" "$auc"
}
if [ $REPL = 1 ]; then
  # a warm-up run first (its line says so), then the second round in the
  # other order: the first run of a round is not favoured either way
  run 0 0 | sed 's/^/warm-up, not counted: /'
  run 0 0; run 0 1; run 0 1; run 0 0
  exit 0
fi
run 0
run "$N"
echo "best achievable held-out AUC: $best"
