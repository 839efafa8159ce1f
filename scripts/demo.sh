#!/usr/bin/env bash
# The demo behind `make demo`: a local cluster from conf/local.yaml (2 shards,
# 2 workers) trains the cnn preset on Fashion-MNIST for one epoch through
# scripts/ps-local.sh, showing worker 0's progress and the test accuracy; then
# the shards' statistics and a short ps-bench latency figure. Every process
# is stopped at the end; logs stay in one folder, printed at the start.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/ps-lib.sh

CONFIG=${1:-conf/local.yaml}
LOGDIR=$(mktemp -d /tmp/ps-demo.XXXXXX)

if [ ! -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] &&
   [ ! -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte ]; then
  echo "demo: Fashion-MNIST is missing; run scripts/install-deps.sh (Debian's dataset-fashion-mnist)" >&2
  exit 1
fi

echo "demo: training the cnn preset for one epoch: 2 shards, 2 workers, sync (BSP), on loopback"
start=$(date +%s)
# Halfway through, the shards' statistics as ps-stat shows them (saved in
# the log folder, printed after the run so the progress line stays clean).
( sleep 25; bin/ps-stat --config "$CONFIG" --workers > "$LOGDIR/ps-stat.txt" 2>&1 || true ) &
stat_pid=$!
scripts/ps-local.sh "$CONFIG" --logs "$LOGDIR" -- --metrics-dir "$LOGDIR/metrics"
wait $stat_pid 2>/dev/null || true
if [ -s "$LOGDIR/ps-stat.txt" ]; then
  echo
  echo "demo: the shards 25 s into training (bin/ps-stat --config $CONFIG --workers):"
  cat "$LOGDIR/ps-stat.txt"
fi
echo
echo "demo: trained in $(( $(date +%s) - start )) s; per-epoch metrics in $LOGDIR/metrics/"
grep -h "test accuracy" "$LOGDIR/worker-0.log" | tail -n 1 | sed 's/^/demo: /'

echo
echo "demo: 4 KiB push+pull latency against one local shard (ps-bench --local, 2 s)"
# the secret ps-local.sh used: the config's, else the one it made in the log folder
secret=$(cfg_key "$(bin/ps-server --config "$CONFIG" --dump-config)" security secret_file)
secret=${secret:-${PS_SECRET_FILE:-$LOGDIR/ps.secret}}
bin/ps-bench --config conf/bench.yaml --secret-file "$secret" --local --op pushpull --size 4K --seconds 2 | tee "$LOGDIR/bench-4k.txt"
echo
echo "demo: done; logs in $LOGDIR"
