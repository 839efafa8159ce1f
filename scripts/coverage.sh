#!/usr/bin/env bash
# coverage.sh - which lines and branches of a file the suites mapped to it
# (scripts/mutate.sh, suites_for) never execute: code no mapped suite runs
# is code whose mutants survive. A copy of the tracked tree (as it is in
# the worktree) is built with gcov instrumentation in build/cov/tree, each
# suite runs there with its own GCOV_PREFIX, and the counts of a file's
# suites are added up (gcov's JSON) into one figure per file.
#
#   scripts/coverage.sh FILE...     e.g. scripts/coverage.sh server/pull.c
#
# Prints "FILE lines E/T (P%) branches E/T (P%)" per file and writes the
# lines never run, and those with a branch never taken, to
# build/cov/uncovered/FILE.txt. Only test programs count (san: suites run
# as their release program; scripts and pytest files are left out, said
# once). Forked test workers end with _exit, which skips gcov's write:
# the test programs are linked with -Wl,--wrap=_exit to a version that
# writes first. A process killed with SIGKILL writes nothing, so lines
# only a kill -9'd shard ran read as never run. PS_TEST_QUICK=1 as under
# make mutate. Debian's gcc and gcov; no other tool.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

if [ $# -eq 0 ] || [ "$1" = --help ] || [ "$1" = -h ]; then
  awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"
  [ $# -eq 0 ] && exit 2 || exit 0
fi
OUT=$PWD/build/cov
TREE=$OUT/tree
eval "$(sed -n '/^suites_for() {/,/^}/p' scripts/mutate.sh)"   # the mapping
declare -A SUITES
progs=""
for f in "$@"; do
  [ -f "$f" ] || { echo "coverage: no file $f" >&2; exit 2; }
  s=""
  for x in $(suites_for "$f" 2>/dev/null); do
    x=${x#san:}
    case "${x%%@*}" in
      *.sh|*.py) echo "coverage: $f: $x left out (only test programs are counted)" >&2 ;;
      *) s="$s $x"; progs="$progs ${x%%@*}" ;;
    esac
  done
  SUITES[$f]=$(printf '%s\n' $s | sort -u | tr '\n' ' ')
done
progs=$(printf '%s\n' $progs | sort -u)

mkdir -p "$TREE" "$OUT/uncovered"
git ls-files -z | tar --null -T - -cf - | tar -xf - -C "$TREE" || exit 1
cat >"$OUT/covexit.c" <<'EOF'
extern void __gcov_dump(void);
extern void __real__exit(int) __attribute__((noreturn));
void __wrap__exit(int s) __attribute__((noreturn));
void __wrap__exit(int s) { __gcov_dump(); __real__exit(s); }
EOF
gcc -c -O0 -fPIC "$OUT/covexit.c" -o "$OUT/covexit.o" || exit 1
echo "coverage: building the instrumented tree (build/cov/tree)" >&2
for p in $progs; do rm -f "$TREE/build/rel/tests/$p"; done   # relinked with the wrap
(cd "$TREE" && NVCC= CFLAGS="-O0 -g --coverage" LDFLAGS=--coverage \
   LDLIBS="-Wl,--wrap=_exit $OUT/covexit.o" make -s -j2 all \
   $(for p in $progs; do echo "build/rel/tests/$p"; done)) >"$OUT/build.log" 2>&1 || {
  echo "coverage: the instrumented build failed ($OUT/build.log)" >&2; exit 1; }

export PS_TEST_QUICK=1 PS_COMPUTE_PLUGIN_DIR=$TREE/lib
export PS_SECRET_FILE=$OUT/ps.secret PS_REPL_KEY_FILE=$OUT/ps.replkey
[ -f "$PS_SECRET_FILE" ] || scripts/ps-keygen "$PS_SECRET_FILE" 2>/dev/null || exit 1
[ -f "$PS_REPL_KEY_FILE" ] || scripts/ps-keygen "$PS_REPL_KEY_FILE" 2>/dev/null || exit 1
ran=" "
for f in "$@"; do
  for s in ${SUITES[$f]}; do
    case "$ran" in *" $s "*) continue ;; esac
    ran="$ran$s "
    d=$OUT/counts/${s//[@,]/_}
    rm -rf "$d"
    mkdir -p "$d"
    only=""
    case "$s" in *@*) only=${s#*@} ;; esac
    echo "coverage: running $s" >&2
    (cd "$TREE" && GCOV_PREFIX=$d GCOV_PREFIX_STRIP=0 PS_TEST_ONLY=$only timeout 1800 \
       "build/rel/tests/${s%%@*}" >"$d.log" 2>&1) ||
      echo "coverage: $s failed ($d.log); its counts are used all the same" >&2
  done
done

COV_SUITES=$(for f in "$@"; do printf '%s\t%s\n' "$f" "${SUITES[$f]}"; done)
export COV_SUITES
python3 - "$TREE" "$OUT" "$@" <<'PYEOF'
import json, os, shutil, subprocess, sys
tree, out, files = sys.argv[1], sys.argv[2], sys.argv[3:]
suites = dict(l.split('\t') for l in os.environ['COV_SUITES'].strip().split('\n'))
for src in files:
    lines, br = {}, {}
    for s in suites[src].split():
        d = os.path.join(out, 'counts', s.replace('@', '_').replace(',', '_'))
        objdir = d + tree + '/build/rel/' + os.path.dirname(src)
        base = os.path.splitext(os.path.basename(src))[0]
        if not os.path.exists(os.path.join(objdir, base + '.gcda')):
            continue   # the suite never ran this file's code
        shutil.copy(os.path.join(tree, 'build/rel', os.path.dirname(src), base + '.gcno'), objdir)
        r = subprocess.run(['gcov', '--json-format', '--stdout', '-b', '-o', objdir, src],
                           cwd=tree, capture_output=True, text=True)
        for doc in r.stdout.splitlines():
            for fi in json.loads(doc)['files']:
                if fi['file'] != src:
                    continue
                for l in fi['lines']:
                    n = l['line_number']
                    lines[n] = lines.get(n, 0) + l['count']
                    for k, b in enumerate(l.get('branches', [])):
                        br[(n, k)] = br.get((n, k), 0) + b['count']
    le = sum(1 for v in lines.values() if v)
    be = sum(1 for v in br.values() if v)
    print('%-32s lines %4d/%4d (%3.0f%%)  branches %4d/%4d (%3.0f%%)' % (
        src, le, len(lines), 100.0 * le / max(1, len(lines)), be, len(br),
        100.0 * be / max(1, len(br))))
    text = open(os.path.join(tree, src)).read().split('\n')
    with open(os.path.join(out, 'uncovered', src.replace('/', '_') + '.txt'), 'w') as o:
        for n in sorted(lines):
            ks = [k for (m, k) in br if m == n]
            taken = sum(1 for k in ks if br[(n, k)])
            if lines[n] == 0:
                o.write('%5d never %s\n' % (n, text[n - 1]))
            elif ks and taken < len(ks):
                o.write('%5d br %d/%d %s\n' % (n, taken, len(ks), text[n - 1]))
PYEOF
