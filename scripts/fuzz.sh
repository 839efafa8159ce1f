#!/usr/bin/env bash
# fuzz.sh SECONDS FUZZER... - runs each libFuzzer target for SECONDS with a
# corpus in build/fuzz/corpus/NAME (seeded from conf/ for the config
# target) and stops at the first crash, leaving the input in
# build/fuzz/crashes/. Exit status 1 when any target found something.
# For a long run: make fuzz FUZZ_SECONDS=3600.
set -u
cd "$(dirname "$0")/.." || exit 1
secs=$1; shift
status=0
mkdir -p build/fuzz/crashes
for f in "$@"; do
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
    status=1
    printf 'FAIL  %-22s found a crash; input in build/fuzz/crashes/, log %s\n' "$name" "$log"
    grep -m1 -A25 'ERROR\|runtime error\|deadly signal' "$log" | sed 's/^/      | /'
  fi
done
exit $status
