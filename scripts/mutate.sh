#!/usr/bin/env bash
# mutate.sh - mutation testing of the code that guards correctness and
# security: each mutant (one small change to one line, made by
# universalmutator's C rules) is built and run against the narrowest test
# suites for its file; a mutant no suite fails is a survivor, a place where
# a bug would go unnoticed. Called by `make mutate`; docs/testing.md has the
# last full run's score and what each survivor means.
#
#   scripts/mutate.sh [--help]
#
# Environment:
#   MUTATE_FILES     files to mutate (default: every file of the list below)
#   MUTATE_PER_FILE  mutants tested per file (default 10, about an hour here;
#                    0 = all of them, days); drawn mutants that fail a
#                    syntax check are set aside and the draw goes on
#   MUTATE_SEED      seed of the draw (default 1): the same seed, the same mutants
#   MUTATE_TIMEOUT   seconds one suite may run before the mutant counts as
#                    killed by a hang (default 120)
#
# universalmutator (PyPI) is installed once into build/mutate/venv. Results
# go to build/mutate/: results.tsv (one line per mutant) and report.md (the
# score per file and every survivor with its line before and after).
# The file under test is always put back, also on Ctrl-C, and the tree is
# rebuilt at the end.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then
  awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"
  exit 0
fi

OUT=build/mutate
VENV=$OUT/venv
PER_FILE=${MUTATE_PER_FILE:-10}
SEED=${MUTATE_SEED:-1}
TMO=${MUTATE_TIMEOUT:-120}
T=build/rel/tests

# The files in scope: the shard, the client library, and the common code
# every frame and gradient passes through.
default_files() {
  ls server/*.c worker/client/ps_client*.c common/transport*.c common/wire*.c \
     common/codec*.c common/auth*.c common/frame_mac*.c common/config_agree.c common/optim_group.c \
     common/table_decl.c common/version.c worker/worker_cmd.c worker/ps_export.c worker/npz.c \
     worker/export_read.c 2>/dev/null |
    grep -v '^server/main.c$'
}

# The narrowest suites that exercise a file, fastest first.
suites_for() {
  case "$1" in
    server/store.c)            echo check_store it_cluster ;;
    server/optimizer.c)        echo check_optimizer check_store ;;
    server/dedup.c)            echo check_dedup it_cluster ;;
    server/checkpoint.c)       echo it_checkpoint it_groups it_decl_tables ;;
    server/handshake.c)        echo it_hostile it_reader ;;
    server/push.c)             echo it_hostile it_cluster ;;
    server/pull.c)             echo it_cluster it_hostile ;;
    server/conn.c)             echo it_reader it_hostile it_cluster ;;   # it_reader: the reader's refusals
    server/admin.c)            echo it_stat it_checkpoint it_hostile ;;   # it_hostile reads the queue figures
    server/metrics_http.c)     echo it_stat ;;
    server/declare.c)          echo it_declare it_groups ;;
    server/table_ckpt.c)       echo it_rows it_export.sh ;;
    server/reader.c)           echo it_reader ;;
    server/decl_tables.c)      echo it_decl_tables ;;
    server/members.c)          echo it_elastic ;;
    server/*)                  echo it_cluster it_checkpoint it_hostile ;;
    worker/client/ps_client_declare.c) echo it_declare it_groups ;;
    worker/client/ps_client_api.c)     echo it_client_api it_declare ;;
    worker/client/ps_client_tables.c)  echo it_decl_tables ;;
    worker/client/ps_client_members.c) echo it_elastic ;;
    worker/client/ps_client*)         echo it_fake_shard it_cluster it_checkpoint it_hostile ;;
    common/config_agree.c)     echo it_agree ;;
    common/optim_group.c)      echo it_groups ;;
    common/table_decl.c)       echo it_decl_tables ;;
    common/version.c)          echo it_docs.sh ;;        # every program's --version
    worker/worker_cmd.c)       echo it_launch.sh ;;      # ps-worker --exec under ps-cluster.sh
    worker/ps_export.c|worker/npz.c) echo it_export.sh ;;  # ps-export on real checkpoints, damaged ones
    # reading checkpoints: versions 1-2 and damage in it_export.sh; declared
    # tensors and tables (versions 2-4), --since and cut sections in pytest's
    worker/export_read.c)      echo it_export.sh test_export.py ;;
    common/transport_rdma.c)   echo check_rdma check_transport ;;
    common/transport.c)        echo check_rdma check_transport it_hostile ;;   # check_rdma: the registry's refusal
    common/transport*)         echo check_transport it_hostile ;;
    common/wire*)              echo check_wire it_hostile ;;
    common/codec*)             echo check_store check_codec ;;
    common/auth*)              echo check_auth check_transport it_hostile it_reader ;;
    common/frame_mac*)         echo check_auth check_transport ;;
    *)                         echo check_transport it_cluster ;;
  esac
}

files=${MUTATE_FILES:-$(default_files)}
mkdir -p "$OUT"
if [ ! -x "$VENV/bin/mutate" ]; then
  echo "mutate: installing universalmutator into $VENV" >&2
  python3 -m venv "$VENV" && "$VENV/bin/pip" install -q universalmutator==1.14.1 || {
    echo "mutate: cannot install universalmutator from PyPI (network?)" >&2; exit 1; }
fi

export PS_SECRET_FILE=$OUT/ps.secret
export PS_TEST_QUICK=1   # it_checkpoint leaves out its minute-long 4.4 GB case
[ -f "$PS_SECRET_FILE" ] || scripts/ps-keygen "$PS_SECRET_FILE" 2>/dev/null || exit 1

echo "mutate: building the unmutated tree and its tests" >&2
# a suite is a test program of $T, a script tests/NAME.sh (run as it is),
# or a pytest file python/tests/NAME.py (its tests, by scripts/test-python.sh)
suite_target() { case "$1" in *.sh|*.py) ;; *) echo "$T/$1" ;; esac; }
run_suite() {
  case "$1" in
    *.sh) timeout "$TMO" "tests/$1" ;;
    *.py) timeout "$TMO" scripts/test-python.sh -x -k "${1%.py}" ;;
    *)    timeout "$TMO" "$T/$1" ;;
  esac
}
make -s -j2 all $(for f in $files; do for s in $(suites_for "$f"); do suite_target "$s"; done; done | sort -u) \
  >/dev/null || { echo "mutate: the unmutated tree does not build" >&2; exit 1; }

CC_LINE=$(make -s print-cc) || exit 1
syntax_rejected=0
current=""
restore() {
  if [ -n "$current" ]; then
    cp "$OUT/orig" "$current"
    current=""
  fi
}
trap 'f0=$current; restore; echo "mutate: interrupted; $f0 put back" >&2; exit 130' INT TERM
trap restore EXIT

results=$OUT/results.tsv
: >"$results"
total=0
start=$(date +%s)
for f in $files; do
  dir=$OUT/mutants/${f//\//_}
  rm -rf "$dir"
  mkdir -p "$dir"
  "$VENV/bin/mutate" "$f" c --noCheck --mutantDir "$dir" >/dev/null 2>&1
  mapfile -t all < <(ls "$dir" | sort -V)
  # a deterministic draw: shuffle with the seed, then keep the first
  # PER_FILE that pass a syntax check with the project's own flags (with
  # --noCheck about two thirds of the rules' output does not compile, and
  # building those would only waste the time of the run)
  mapfile -t order < <(printf '%s\n' "${all[@]}" | python3 -c "
import random, sys
m = [l.strip() for l in sys.stdin if l.strip()]
random.Random('$SEED:$f').shuffle(m)
print('\n'.join(m))")
  pick=()
  rejected=0
  for m in "${order[@]}"; do
    [ -n "$m" ] || continue
    if [ "$PER_FILE" -gt 0 ] && [ "${#pick[@]}" -ge "$PER_FILE" ]; then break; fi
    if $CC_LINE -fsyntax-only -x c "$dir/$m" -iquote "$(dirname "$f")" >/dev/null 2>&1; then
      pick+=("$m")
    else
      rejected=$((rejected + 1))
    fi
  done
  syntax_rejected=$((syntax_rejected + rejected))
  suites=$(suites_for "$f")
  echo "== $f: ${#all[@]} mutants, $rejected drawn did not compile, testing ${#pick[@]} against: $suites" >&2
  cp "$f" "$OUT/orig"
  for m in "${pick[@]}"; do
    [ -n "$m" ] || continue
    total=$((total + 1))
    hdr=$(diff "$f" "$dir/$m" | head -1)
    line=${hdr%%[acd]*}
    line=${line%%,*}
    case "$hdr" in
      *a*) before="(a new line after this one)" ;;   # an inserted statement
      *)   before=$(sed -n "${line}p" "$f" | sed 's/^[[:space:]]*//') ;;
    esac
    after=$(diff "$f" "$dir/$m" | sed -n 's/^> //p' | head -1 | sed 's/^[[:space:]]*//')
    current=$f
    cp "$dir/$m" "$f"
    outcome=""
    if ! make -s -j2 all $(for s in $suites; do suite_target "$s"; done) >"$OUT/build.log" 2>&1; then
      outcome="uncompilable"
    else
      for s in $suites; do
        run_suite "$s" >"$OUT/run.log" 2>&1
        rc=$?
        if [ $rc -eq 124 ]; then outcome="killed:$s(timeout)"; break; fi
        if [ $rc -ne 0 ]; then outcome="killed:$s"; break; fi
      done
      [ -n "$outcome" ] || outcome="SURVIVED"
    fi
    restore
    printf '%s\t%s\t%s\t%s\t%s\n' "$f" "$line" "$outcome" "$before" "$after" >>"$results"
    printf '%-28s %5s  %-28s %s  ->  %s\n' "$f" "$line" "$outcome" "${before:0:60}" "${after:0:60}"
  done
done
trap - EXIT INT TERM
echo "mutate: rebuilding the unmutated tree" >&2
touch $files
make -s -j2 all >/dev/null

python3 - "$results" "$OUT/report.md" "$SEED" "$PER_FILE" "$(( $(date +%s) - start ))" "$syntax_rejected" <<'EOF'
import sys, collections
rows = [l.rstrip('\n').split('\t') for l in open(sys.argv[1]) if l.strip()]
per = collections.OrderedDict()
for f, line, out, before, after in rows:
    d = per.setdefault(f, collections.Counter())
    d['killed' if out.startswith('killed') else out] += 1
out = open(sys.argv[2], 'w')
def w(s=''):
    print(s)
    out.write(s + '\n')
w('# Mutation run: seed %s, %s mutants per file, %d s' % (sys.argv[3], sys.argv[4] or 'all', int(sys.argv[5])))
w()
w('%s mutants drawn were set aside before building: they fail a syntax check.' % sys.argv[6])
w()
w('| file | mutants | uncompilable | killed | survived |')
w('| --- | --- | --- | --- | --- |')
tk = ts = tu = 0
for f, d in per.items():
    n = sum(d.values())
    w('| %s | %d | %d | %d | %d |' % (f, n, d['uncompilable'], d['killed'], d['SURVIVED']))
    tk += d['killed']; ts += d['SURVIVED']; tu += d['uncompilable']
w('| all | %d | %d | %d | %d |' % (tk + ts + tu, tu, tk, ts))
w()
w('Score: %d of %d compiled mutants killed (%.1f%%)' % (tk, tk + ts, 100.0 * tk / max(1, tk + ts)))
w()
w('## Survivors')
w()
for f, line, o, before, after in rows:
    if o == 'SURVIVED':
        w('- `%s:%s`: `%s` -> `%s`' % (f, line, before, after))
EOF
