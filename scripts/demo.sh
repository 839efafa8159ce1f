#!/usr/bin/env bash
# The demo behind `make demo`: starts a local 2-shard cluster from
# conf/local.yaml, runs ps-bench against it (2 workers pushing and pulling the
# model in sync mode, then a 4 KiB latency run), prints the figures and stops
# every process cleanly. Logs go to one folder, printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

CONFIG=${1:-conf/local.yaml}
SECONDS_PER_RUN=${PS_DEMO_SECONDS:-3}
LOGDIR=$(mktemp -d /tmp/ps-demo.XXXXXX)
pids=()

stop_all() {
  local rc=0
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  pids=()
  return $rc
}
trap 'echo "demo: interrupted, stopping servers"; stop_all; exit 130' INT TERM
trap 'stop_all >/dev/null 2>&1 || true' EXIT

shards=$(bin/ps-server --config "$CONFIG" --list-shards | wc -l)
echo "demo: starting $shards shards from $CONFIG (logs in $LOGDIR)"
for ((i = 0; i < shards; i++)); do
  bin/ps-server --config "$CONFIG" --shard "$i" >"$LOGDIR/server-$i.log" 2>&1 &
  pids+=($!)
done
sleep 0.5
for ((i = 0; i < shards; i++)); do
  if ! kill -0 "${pids[$i]}" 2>/dev/null; then
    echo "demo: shard $i did not start:" >&2
    cat "$LOGDIR/server-$i.log" >&2
    exit 1
  fi
done

echo "demo: every worker pushes its gradients for the whole model, then pulls the new weights"
bin/ps-bench --config "$CONFIG" --op pushpull --seconds "$SECONDS_PER_RUN" | tee "$LOGDIR/bench-model.txt"

echo
echo "demo: stopping the shards"
stop_all
for ((i = 0; i < shards; i++)); do tail -n 1 "$LOGDIR/server-$i.log"; done

echo
echo "demo: 4 KiB push+pull latency against one local shard (ps-bench --local)"
bin/ps-bench --config conf/bench.yaml --local --op pushpull --size 4K --seconds "$SECONDS_PER_RUN" | tee "$LOGDIR/bench-4k.txt"
echo
echo "demo: done; logs in $LOGDIR"
