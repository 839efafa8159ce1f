#!/usr/bin/env bash
# Runs every test binary given on the command line from the repository root,
# prints one line per test and a summary, and exits non-zero if any test
# failed. A failing test's output is shown.
#
#   PASS  name  secs  <Check's summary> [(S of N cases skipped)]
#   SKIP  name  secs  N of N cases skipped: <first SKIP line's reason>
#   FAIL  name  secs  (exit status)
#
# Skipped cases: a Check test (tests/test_util.h, tu_run_suite) ends with
# "tu: N cases, S skipped"; a test whose every case skipped is SKIP, not
# PASS, and skips are not failures. Without that line (scripts, tests not
# on tu_run_suite) each "SKIP" line counts as one skipped case and the test
# can only PASS or FAIL, unless it exits 77: then it is SKIP, with its
# first "SKIP" line as the reason (what cannot run on this machine). The
# first "SKIP" lines are listed under a PASS line.
#
#   run-tests.sh [--beside NAME,...]... TEST...
#
# --beside: the tests so named (basenames) run in a lane of their own, one
# after another, beside the others: for tests that spend their time
# waiting on paced clocks and timeouts (a few percent of a CPU), so that
# `make test` does not wait for them in turn. Each --beside is one more
# lane (tests that must not run at the same time as each other go in one
# lane). Their lines are printed when each ends.
set -u
cd "$(dirname "$0")/.." || exit 1
lanes=()
while [ "${1:-}" = --beside ]; do
  lanes+=(",$2,")
  shift 2
done
logdir=$(mktemp -d /tmp/ps-tests.XXXXXX)
# Authentication is on by default: every test process and the shards it
# starts share one fresh secret (tests that need another make their own).
if [ -z "${PS_SECRET_FILE:-}" ]; then
  export PS_SECRET_FILE=$logdir/ps.secret
  scripts/ps-keygen "$PS_SECRET_FILE" 2>/dev/null || exit 1
fi
# ... and the shards of replicated tests one replication key of their own
if [ -z "${PS_REPL_KEY_FILE:-}" ]; then
  export PS_REPL_KEY_FILE=$logdir/ps.replkey
  scripts/ps-keygen "$PS_REPL_KEY_FILE" 2>/dev/null || exit 1
fi
# The CUDA plug-in of this tree (lib/ps-compute-cuda.so, where it was built):
# test programs live under build/, not beside lib/ as bin/ps-worker does.
export PS_COMPUTE_PLUGIN_DIR=${PS_COMPUTE_PLUGIN_DIR:-$PWD/lib}
# run_one TEST: runs it, prints its line (and a failure's log), and
# appends "STATUS NAME SKIPPED-CASES" to $logdir/results.
run_one() {
  local t=$1 name start rc secs log skiplines counts ncases nskip reason summary more asan
  name=$(basename "$t")
  start=$EPOCHREALTIME
  # CUDA's driver maps memory where ASan keeps its shadow gap: a sanitizer
  # build of a test that opens the CUDA plug-in needs the gap unprotected.
  case $name in
    *cuda* | it_train) asan=${ASAN_OPTIONS:+$ASAN_OPTIONS:}protect_shadow_gap=0 ;;
    *) asan=${ASAN_OPTIONS:-} ;;
  esac
  ASAN_OPTIONS=$asan timeout 600 ${PS_TEST_WRAP:-} "$t" >"$logdir/$name.log" 2>&1
  rc=$?
  secs=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
  log=$logdir/$name.log
  skiplines=$(grep -h '^SKIP' "$log" || true)
  counts=$(grep -hE '^tu: [0-9]+ cases, [0-9]+ skipped$' "$log" | tail -1)
  if [ -n "$counts" ]; then
    read -r ncases nskip <<<"$(awk '{ print $2, $4 }' <<<"$counts")"
  else
    ncases=-1
    nskip=$(printf '%s' "$skiplines" | grep -c '^SKIP' || true)
  fi
  if [ $rc -eq 77 ] && [ -z "$counts" ]; then # a whole script skipped, with its reason
    echo "skip $name 0" >>"$logdir/results"
    reason=$(printf '%s\n' "$skiplines" | head -1 | sed 's/^SKIP:* *//')
    printf 'SKIP  %-22s %6ss  %s\n' "$name" "$secs" "${reason:-exit status 77, no reason printed}"
  elif [ $rc -eq 0 ] && [ "$ncases" -gt 0 ] && [ "$nskip" -ge "$ncases" ]; then
    echo "skip $name $nskip" >>"$logdir/results"
    reason=$(printf '%s\n' "$skiplines" | head -1 | sed 's/^SKIP:* *//')
    printf 'SKIP  %-22s %6ss  %d of %d cases skipped: %s\n' "$name" "$secs" "$nskip" \
      "$ncases" "$reason"
  elif [ $rc -eq 0 ]; then
    echo "pass $name $nskip" >>"$logdir/results"
    summary=$(grep -hE '^[0-9]+%: Checks' "$log" | tail -1)
    if [ "$nskip" -gt 0 ] && [ "$ncases" -ge 0 ]; then
      summary="$summary ($nskip of $ncases cases skipped)"
    elif [ "$nskip" -gt 0 ]; then
      summary="$summary ($nskip skipped)"
    fi
    printf 'PASS  %-22s %6ss  %s\n' "$name" "$secs" "$summary"
    if [ -n "$skiplines" ]; then # the first few, then how many more
      printf '%s\n' "$skiplines" | head -3 | sed 's/^/      /'
      more=$(( $(printf '%s\n' "$skiplines" | wc -l) - 3 ))
      [ $more -gt 0 ] && echo "      ... and $more more SKIP lines in $log"
    fi
  else
    echo "fail $name 0" >>"$logdir/results"
    printf 'FAIL  %-22s %6ss  (exit %d)\n' "$name" "$secs" "$rc"
    sed 's/^/      | /' "$log" | tail -60
  fi
}

: >"$logdir/results"
main=()
side_pids=()
for t in "$@"; do
  in_lane=0
  for l in "${lanes[@]}"; do
    case $l in *,"$(basename "$t")",*) in_lane=1 ;; esac
  done
  [ $in_lane = 0 ] && main+=("$t")
done
for k in "${!lanes[@]}"; do
  side=()
  for t in "$@"; do
    case ${lanes[$k]} in *,"$(basename "$t")",*) side+=("$t") ;; esac
  done
  [ ${#side[@]} -gt 0 ] || continue
  # each line is printed whole (one printf, or the failing log after it)
  ( for t in "${side[@]}"; do
      run_one "$t" >"$logdir/beside$k.out" 2>&1
      cat "$logdir/beside$k.out"
    done ) &
  side_pids+=($!)
done
for t in ${main[@]+"${main[@]}"}; do
  run_one "$t"
done
for p in ${side_pids[@]+"${side_pids[@]}"}; do
  wait "$p"
done
read -r pass skipped fail skipcases <<<"$(awk '
  { n[$1]++; c += $3 } END { printf "%d %d %d %d", n["pass"], n["skip"], n["fail"], c }' \
  "$logdir/results")"
failed=$(awk '$1 == "fail" { printf "%s%s", sep, $2; sep = " " }' "$logdir/results")
echo "tests: $pass passed, $skipped skipped, $fail failed, $skipcases skipped cases (logs in $logdir)"
[ "$fail" -eq 0 ] || { echo "failed: $failed"; exit 1; }
