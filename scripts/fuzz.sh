#!/usr/bin/env bash
# fuzz.sh SECONDS FUZZER... - runs each libFuzzer target for SECONDS with a
# corpus in build/fuzz/corpus/NAME (seeded from conf/ for the config
# target) and stops at the first crash, leaving the input in
# build/fuzz/crashes/. Exit status 1 when any target found something.
# For a long run: make fuzz FUZZ_SECONDS=3600.
set -u
cd "$(dirname "$0")/.." || exit 1
secs=$1; shift
# FUZZ_JOBS targets at a time (default: the CPUs), their lines in order
jobs=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}
mkdir -p build/fuzz/crashes

# one target: its line (and a crash's report) into build/fuzz/NAME.out
fuzz_one() {
  local f=$1 name corpus log runs cov
  name=$(basename "$f")
  corpus=build/fuzz/corpus/$name
  mkdir -p "$corpus"
  [ "$name" = fuzz_config ] && cp -n conf/*.yaml "$corpus/" 2>/dev/null
  log=build/fuzz/$name.log
  if "$f" -max_total_time="$secs" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
      -artifact_prefix=build/fuzz/crashes/"$name"- "$corpus" >"$log" 2>&1; then
    runs=$(grep -o 'Done [0-9]* runs' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    printf 'PASS  %-22s %4ss  %s, %s, corpus %s inputs\n' "$name" "$secs" "${runs:-?}" "${cov:-?}" \
      "$(ls "$corpus" | wc -l)"
  else
    printf 'FAIL  %-22s found a crash; input in build/fuzz/crashes/, log %s\n' "$name" "$log"
    grep -m1 -A25 'ERROR\|runtime error\|deadly signal' "$log" | sed 's/^/      | /'
    return 1
  fi
}

for f in "$@"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do
    wait -n
  done
  out=build/fuzz/$(basename "$f")
  { fuzz_one "$f" >"$out.out"; echo $? >"$out.rc"; } &
done
wait
status=0
for f in "$@"; do
  out=build/fuzz/$(basename "$f")
  cat "$out.out"
  [ "$(cat "$out.rc" 2>/dev/null)" = 0 ] || status=1
  rm -f "$out.out" "$out.rc"
done
exit $status
