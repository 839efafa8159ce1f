#!/usr/bin/env bash
# The benchmarks behind `make bench`. Every figure is printed next to a
# baseline measured in the same run (raw TCP over loopback, memcpy), and as a
# ratio to it, since shared machines are noisy. Results: BENCHMARKS.md.
#   scripts/bench.sh [OPTIMIZER_BENCH [TRAIN_BENCH [CODEC_BENCH]]]
# PS_BENCH_SECONDS (default 3) sets the length of each run.
set -euo pipefail
cd "$(dirname "$0")/.."
S=${PS_BENCH_SECONDS:-3}
# the CUDA plug-in of this tree, for bench_train (under build/, not bin/)
export PS_COMPUTE_PLUGIN_DIR=${PS_COMPUTE_PLUGIN_DIR:-$PWD/lib}
CFG=conf/bench.yaml
# the cluster secret (authentication and frame MACs are on, as by default)
if [ -z "${PS_SECRET_FILE:-}" ]; then
  export PS_SECRET_FILE=$(mktemp -u /tmp/ps-bench-secret.XXXXXX)
  scripts/ps-keygen "$PS_SECRET_FILE" 2>/dev/null
  trap 'rm -f "$PS_SECRET_FILE"' EXIT
fi

echo "== machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r)"
echo "== 1 shard, 1 worker, loopback, momentum (conf/bench.yaml)"
echo
echo "-- 4 KiB push+pull round trip, against raw TCP ping-pong of 4 KiB"
for k in 1 4 16; do
  echo "inflight $k:"
  bin/ps-bench --config $CFG --local --op pushpull --size 4K --seconds "$S" --inflight $k | sed -n 's/^  //p'
done
for size in 1M 16M; do
  echo
  echo "-- $size push throughput, against one raw TCP stream"
  for k in 1 2 4; do
    echo "inflight $k:"
    bin/ps-bench --config $CFG --local --op push --size $size --seconds "$S" --inflight $k | sed -n 's/^  //p'
  done
done
echo
echo "-- 16 MiB pull throughput"
bin/ps-bench --config $CFG --local --op pull --size 16M --seconds "$S" --inflight 2 | sed -n 's/^  //p'
echo
echo "-- frame protection, same run: MACs (security.mac, the default), encryption (security.encrypt,"
echo "   each cipher) and unauthenticated frames (security.auth: false); ratios to no auth"
tmpc=$(mktemp -d /tmp/ps-bench-sec.XXXXXX)
{ cat $CFG; printf 'security:\n  auth: false\n'; } > "$tmpc/noauth.yaml"
{ cat $CFG; printf 'security:\n  encrypt: true\n  cipher: aes-256-gcm\n'; } > "$tmpc/aes.yaml"
{ cat $CFG; printf 'security:\n  encrypt: true\n  cipher: chacha20-poly1305\n'; } > "$tmpc/chacha.yaml"
field() { sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p"; }
for m in "pushpull 4K 1 p50_us" "push 1M 2 gb_per_s" "push 16M 2 gb_per_s"; do
  read -r op sz k f <<<"$m"   # (not `set --`: the script's own arguments are used below)
  run() { bin/ps-bench --config "$1" --local --op $op --size $sz --seconds "$S" --inflight $k --no-baseline --json 2>/dev/null | field $f; }
  none=$(run "$tmpc/noauth.yaml"); mac=$(run $CFG); aes=$(run "$tmpc/aes.yaml"); cha=$(run "$tmpc/chacha.yaml")
  awk -v op=$op -v sz=$sz -v k=$k -v f=$f -v n="$none" -v m="$mac" -v a="$aes" -v c="$cha" 'BEGIN {
    unit = f == "p50_us" ? "us p50" : "GB/s";
    printf "%-8s %-4s inflight %s (%s): no auth %8.2f, MAC %8.2f (%.2f), aes-256-gcm %8.2f (%.2f), chacha20-poly1305 %8.2f (%.2f)\n",
      op, sz, k, unit, n, m, (n > 0 ? m / n : 0), a, (n > 0 ? a / n : 0), c, (n > 0 ? c / n : 0) }'
done
rm -rf "$tmpc"
echo
echo "-- embedding rows (docs/embeddings.md): 106,496 ids a request, Zipf 1.05 over 1M rows of dim 16,"
echo "   rowwise adagrad; ratio: requests/s against a dense push of the same 6.5 MiB of values"
dense=$(bin/ps-bench --config $CFG --local --op push --size 6815744 --seconds "$S" --no-baseline --json 2>/dev/null | field ops_per_s)
for op in pull-rows push-rows; do
  out=$(bin/ps-bench --config $CFG --local --op $op --rows 1000000 --dim 16 --zipf 1.05 --seconds "$S" --json 2>/dev/null)
  awk -v op=$op -v d="$dense" -v r="$(printf '%s' "$out" | field rows_per_s)" \
      -v q="$(printf '%s' "$out" | field requests_per_s)" -v dd="$(printf '%s' "$out" | field dedup_bytes_ratio)" \
      -v b="$(printf '%s' "$out" | field table_bytes_per_row)" 'BEGIN {
    printf "%-9s %10.0f rows/s, %6.1f requests/s (dense push %.1f/s: ratio %.3f), dedup %.2f, %.1f bytes a row held\n",
      op, r, q, d, (d > 0 ? q / d : 0), dd, b }'
done
echo
echo "-- replication (cluster.replicas: 1: every shard has a backup process, a push is acknowledged"
echo "   once the backup has it), same run; ratios to replicas: 0"
tmpr=$(mktemp -d /tmp/ps-bench-repl.XXXXXX)
sed 's/^  servers: \[127.0.0.1:7100\]$/&\n  backups: [127.0.0.1:7101]\n  replicas: 1/' $CFG > "$tmpr/r1.yaml"
{ cat "$tmpr/r1.yaml"; printf 'replication:\n  forward: every_push\n'; } > "$tmpr/every.yaml"
for m in "pushpull 4K 1 p50_us" "push 1M 2 gb_per_s"; do
  read -r op sz k f <<<"$m"
  run() { bin/ps-bench --config "$1" --local --op $op --size $sz --seconds "$S" --inflight $k --no-baseline --json 2>/dev/null | field $f; }
  r0=$(run $CFG); r1=$(run "$tmpr/r1.yaml")
  awk -v op=$op -v sz=$sz -v k=$k -v f=$f -v a="$r0" -v b="$r1" 'BEGIN {
    unit = f == "p50_us" ? "us p50" : "GB/s";
    printf "%-8s %-4s inflight %s (%s): replicas 0 %8.2f, replicas 1 %8.2f (%.2f)\n", op, sz, k, unit, a, b, (a > 0 ? b / a : 0) }'
done
echo "   sync, W workers each pushing 1 MiB and pulling it back per clock: replication after"
echo "   aggregation (one summed gradient per clock to the backup) against forwarding every push"
echo "   (W gradients per clock, summed by the backup); clocks per second, ratios to replicas: 0"
# a worker that has finished leaves the live set at once, so the others' last pulls end
for c in r0 r1 every; do
  { if [ $c = r0 ]; then cat $CFG; else cat "$tmpr/$([ $c = r1 ] && echo r1 || echo every).yaml"; fi
    printf 'limits:\n  drop_timeout_ms: 100\n'; } > "$tmpr/w-$c.yaml"
done
for w in 2 4; do
  run() { bin/ps-bench --config "$1" --local --op pushpull --size 1M --seconds "$S" --inflight 1 --workers $w --no-baseline --json 2>/dev/null | field ops_per_s | awk -v w=$w '{ printf "%.1f", $1 / w }'; }
  r0=$(run "$tmpr/w-r0.yaml"); agg=$(run "$tmpr/w-r1.yaml"); every=$(run "$tmpr/w-every.yaml")
  awk -v w=$w -v a="$r0" -v b="$agg" -v c="$every" 'BEGIN {
    printf "pushpull 1M   %d workers (clocks/s): replicas 0 %7.1f, aggregated %7.1f (%.2f), every push %7.1f (%.2f)\n", w, a, b, (a > 0 ? b / a : 0), c, (a > 0 ? c / a : 0) }'
done
rm -rf "$tmpr"
if [ $# -ge 1 ] && [ -x "$1" ]; then
  echo
  echo "-- optimizer apply rate on one core, against memcpy of the same size"
  "$1"
fi
codec_bench=${3:-}
if [ -n "$codec_bench" ] && [ -x "$codec_bench" ]; then
  echo
  echo "-- gradient codecs on one core: encode and decode+add GB/s of float32, wire bytes / raw, against memcpy"
  "$codec_bench" | sed 's/^/   /'
fi
if [ $# -ge 2 ] && [ -x "$2" ] && [ -x bin/ps-worker ]; then
  echo
  echo "-- training: 2 shards + 2 workers (sync, loopback) against compute alone"
  echo "   baseline: one process, forward + backward + gradient download, no servers, 1 compute thread;"
  echo "   and each layer's weights pulled with its push (train.pull: layer, the default) against one"
  echo "   pull of every tensor after the step's last push (train.pull: step), alternated, same run"
  base=$(OPENBLAS_NUM_THREADS=1 "$2" --seconds "$S" --backend cpu --threads 1 --json)
  printf '%s\n' "$base" | sed 's/^/   /'
  tmp=$(mktemp -d /tmp/ps-bench-train.XXXXXX)
  sum_sps() { cat "$1"/worker-*.jsonl | sed -n 's/.*"samples_per_s":\([0-9.]*\).*/\1/p' | awk '{s += $1} END {print s + 0}'; }
  for m in "mlp 25600" "cnn 5120"; do
    set -- $m
    sed -e "s/preset: cnn/preset: $1/" conf/local.yaml > "$tmp/$1-layer.yaml"
    sed -e 's/^\( *\)batch: \(.*\)/\1batch: \2\n\1pull: step/' "$tmp/$1-layer.yaml" > "$tmp/$1-step.yaml"
    declare -A got=()
    for round in 1 2; do
      for mode in layer step; do
        rm -rf "$tmp/m-$1-$mode"
        scripts/ps-local.sh "$tmp/$1-$mode.yaml" --logs "$tmp/logs-$1-$mode" -- --limit "$2" \
          --metrics-dir "$tmp/m-$1-$mode" >/dev/null 2>&1 || { echo "   $1 ($mode): training run failed (logs in $tmp/logs-$1-$mode)"; continue; }
        got[$mode]="${got[$mode]:-} $(sum_sps "$tmp/m-$1-$mode")"
      done
    done
    waits=$(sed -n 's/.*"net_wait_layers_s":{\([^}]*\)}.*/\1/p' "$tmp/m-$1-layer/worker-0.jsonl" | tr -d '"')
    single=$(printf '%s\n' "$base" | sed -n "s/.*\"model\":\"$1\",\"backend\":\"cpu\".*\"samples_per_s\":\([0-9.]*\).*/\1/p")
    awk -v m="$1" -v l="${got[layer]:-}" -v st="${got[step]:-}" -v s="$single" -v w="$waits" 'BEGIN {
      nl = split(l, a, " "); ns = split(st, b, " "); la = 0; sa = 0
      for (i = 1; i <= nl; i++) la += a[i] / nl
      for (i = 1; i <= ns; i++) sa += b[i] / ns
      printf "   %s: 2 workers %.0f samples/s in all (rounds%s), compute alone %.0f samples/s per process, ratio to 2x alone %.2f\n", m, la, l, s, (s > 0 ? la / (2 * s) : 0)
      printf "   %s: pull per step %.0f samples/s (rounds%s): per layer / per step %.2f; worker 0 net wait per layer (s, push order): %s\n", m, sa, st, (sa > 0 ? la / sa : 0), w }'
    unset got
  done
  rm -rf "$tmp"
fi
