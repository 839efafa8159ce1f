#!/usr/bin/env bash
# Runs every test binary given on the command line from the repository root,
# prints one line per test (PASS, FAIL or SKIP with its reason) and a summary,
# and exits non-zero if any test failed. A failing test's output is shown.
set -u
cd "$(dirname "$0")/.." || exit 1
pass=0 fail=0 skip=0 failed=()
logdir=$(mktemp -d /tmp/ps-tests.XXXXXX)
# Authentication is on by default: every test process and the shards it
# starts share one fresh secret (tests that need another make their own).
if [ -z "${PS_SECRET_FILE:-}" ]; then
  export PS_SECRET_FILE=$logdir/ps.secret
  scripts/ps-keygen "$PS_SECRET_FILE" 2>/dev/null || exit 1
fi
for t in "$@"; do
  name=$(basename "$t")
  start=$EPOCHREALTIME
  timeout 600 ${PS_TEST_WRAP:-} "$t" >"$logdir/$name.log" 2>&1
  rc=$?
  secs=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
  skipped=$(grep -h '^SKIP' "$logdir/$name.log" || true)
  if [ $rc -eq 0 ]; then
    pass=$((pass + 1))
    summary=$(grep -hE '^[0-9]+%: Checks' "$logdir/$name.log" | tail -1)
    printf 'PASS  %-22s %6ss  %s\n' "$name" "$secs" "$summary"
    if [ -n "$skipped" ]; then
      skip=$((skip + $(printf '%s\n' "$skipped" | wc -l)))
      printf '%s\n' "$skipped" | sed 's/^/      /'
    fi
  else
    fail=$((fail + 1))
    failed+=("$name")
    printf 'FAIL  %-22s %6ss  (exit %d)\n' "$name" "$secs" "$rc"
    sed 's/^/      | /' "$logdir/$name.log" | tail -60
  fi
done
echo "tests: $pass passed, $fail failed, $skip skipped cases (logs in $logdir)"
[ $fail -eq 0 ] || { echo "failed: ${failed[*]}"; exit 1; }
