#!/usr/bin/env bash
# it_bench.sh - ps-bench --local as its --help promises: --size with a
# preset model (the shards it starts get the one 'bench' tensor too, not
# the preset's), and several sync workers (pushpull, 1 and 4 in flight)
# ending together with a result instead of leaving the last pulls to time
# out, and pushing alone without running past the shards' clock window. Each run has 30 s (it needs about 1.5); the result is checked.
# Prints Check-style "N%: Checks" so scripts/run-tests.sh summarises it.
set -u
cd "$(dirname "$0")/.." || exit 1
checks=0 fails=0
ok() { checks=$((checks + 1)); }
bad() { checks=$((checks + 1)); fails=$((fails + 1)); echo "FAIL: $*"; }

tmp=$(mktemp -d /tmp/ps-bench-it.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
. tests/lib-ports.sh # free_port
unset PS_SECRET_FILE

# bench RUN_NAME CONFIG ARGS...: runs ps-bench --local --json, checks its
# status and that every worker's operations were counted
bench() {
  local name=$1 cfg=$2; shift 2
  local t0=$SECONDS
  timeout 30 bin/ps-bench --config "$cfg" --local --seconds 0.5 --no-baseline --json "$@" \
    >"$tmp/$name.json" 2>"$tmp/$name.err"
  local rc=$? took=$((SECONDS - t0))
  [ $rc -eq 0 ] && ok || bad "$name: ps-bench $* exited $rc after ${took}s: $(tail -3 "$tmp/$name.err")"
  local ops
  ops=$(sed -n 's/.*"ops":\([0-9]*\),.*/\1/p' "$tmp/$name.json")
  [ "${ops:-0}" -gt 0 ] && ok || bad "$name: no operations in '$(cat "$tmp/$name.json")'"
  [ $took -lt 15 ] && ok || bad "$name: took ${took}s for a 0.5 s run"
}

for preset in cnn mlp; do
  printf 'cluster:\n  servers: [127.0.0.1:%s]\n  workers: 1\nmodel: {preset: %s}\n' \
    "$(free_port)" $preset >"$tmp/$preset.yaml"
  bench "$preset-size" "$tmp/$preset.yaml" --size 64K
  grep -q '"size":65536,' "$tmp/$preset-size.json" && ok ||
    bad "$preset --size 64K: '$(cat "$tmp/$preset-size.json")'"
done

# (a model of plain tensors here, so that this part does not hang on the
# preset one above)
q0=$(free_port); q1=$(free_port $q0)
printf 'cluster:\n  servers: [127.0.0.1:%s, 127.0.0.1:%s]\n  workers: 2\nmodel: {tensors: [{name: w, shape: [300000]}]}\n' \
  "$q0" "$q1" >"$tmp/two.yaml"
for k in 1 4; do
  bench "sync2-inflight$k" "$tmp/two.yaml" --size 4096 --inflight $k
  grep -q '"workers":2,"shards":2,"consistency":"sync"' "$tmp/sync2-inflight$k.json" && ok ||
    bad "2 sync workers: '$(cat "$tmp/sync2-inflight$k.json")'"
done
bench sync2-model "$tmp/two.yaml" --workers 2
# push alone: the workers keep within limits.max_clock_ahead of each other
# (a fast one used to push past it and be refused)
bench sync2-push "$tmp/two.yaml" --op push --size 4096 --inflight 4

pct=$(( checks ? (checks - fails) * 100 / checks : 0 ))
echo "$pct%: Checks: $checks, Failures: $fails, Errors: 0"
[ $fails -eq 0 ]
