#!/usr/bin/env bash
# The benchmarks behind `make bench`. Every figure is printed next to a
# baseline measured in the same run (raw TCP over loopback, memcpy), and as a
# ratio to it, since shared machines are noisy. Results: BENCHMARKS.md.
#   scripts/bench.sh [OPTIMIZER_BENCH_BINARY]
# PS_BENCH_SECONDS (default 3) sets the length of each run.
set -euo pipefail
cd "$(dirname "$0")/.."
S=${PS_BENCH_SECONDS:-3}
CFG=conf/bench.yaml

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
if [ $# -ge 1 ] && [ -x "$1" ]; then
  echo
  echo "-- optimizer apply rate on one core, against memcpy of the same size"
  "$1"
fi
