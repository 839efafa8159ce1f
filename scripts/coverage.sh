#!/usr/bin/env bash
# coverage.sh - which lines and branches of a file the suites mapped to it
# (scripts/mutate.sh, suites_for) never execute: code no mapped suite runs
# is code whose mutants survive. A copy of the tracked tree (as it is in
# the worktree) is built with gcov instrumentation in build/cov/tree, each
# suite runs there with its own GCOV_PREFIX, and the counts of a file's
# suites are added up (gcov's JSON) into one figure per file.
#
#   scripts/coverage.sh FILE...     e.g. scripts/coverage.sh server/pull.c
#   scripts/coverage.sh --union FILE...
#
# Prints "FILE lines E/T (P%) branches E/T (P%)" per file and writes the
# lines never run, and those with a branch never taken, to
# build/cov/uncovered/FILE.txt. Every kind of suite counts: test programs
# (san: and tsan: suites run as their release program), scripts (run in
# the instrumented tree, so the bin/ they start is instrumented too) and
# pytest files (over the instrumented lib/libps.so). Forked test workers
# end with _exit, which skips gcov's write: the programs are linked with
# -Wl,--wrap=_exit to a version that writes first. A process killed with
# SIGKILL writes nothing, so what only a kill -9'd shard ran reads as never
# run; COV_DUMP_MS=1000 makes every process write its counts each second
# (then only its last second is lost; --union took 18 min 26 s with it,
# 16 min 33 s without). The suites run with the build's flags in the
# environment: a script that runs make (make install in it_launch.sh)
# would otherwise rebuild the tree without gcov and void the counts.
# PS_TEST_QUICK=1 as under make mutate. Debian's gcc and gcov; no other
# tool.
#
# COV_REUSE=1 keeps the counts of the suites an earlier run left (only
# those missing run), to read them again or add files.
#
# COV_MUTANTS=1 also makes every mutant of each file (universalmutator's C
# rules, as scripts/mutate.sh draws them; its venv build/mutate/venv must
# exist: run scripts/mutate.sh once) and prints how many change a line no
# mapped suite runs: mutants that survive whatever the tests assert, so
# the share is a floor under the file's survivors. The mean over the
# files is printed last (a draw takes one mutant per file); about 2 min
# for the 70 files here.
#
# --union also runs every other test (each program of tests/, each
# tests/it_*.sh, the whole pytest suite; about 18 min here) and prints, per
# file, the lines its mapped suites run against those any test runs, and
# the suites that would add the most to its mapping (NAME+LINES): what
# any test runs but the mapping does not is code whose mutants survive
# only because scripts/mutate.sh does not run that test for the file.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

if [ $# -eq 0 ] || [ "$1" = --help ] || [ "$1" = -h ]; then
  awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"
  [ $# -eq 0 ] && exit 2 || exit 0
fi
UNION=0
[ "$1" = --union ] && { UNION=1; shift; }
OUT=$PWD/build/cov
TREE=$OUT/tree
eval "$(sed -n '/^suites_of() {/,/^}/p; /^suites_for() {/,/^}/p' scripts/mutate.sh)"   # the mapping
declare -A SUITES
progs="" pysuites=0
for f in "$@"; do
  [ -f "$f" ] || { echo "coverage: no file $f" >&2; exit 2; }
  s=""
  for x in $(suites_for "$f" 2>/dev/null); do
    x=${x#tsan:}; x=${x#san:}
    case "$x" in rdma:*) continue ;; esac   # the soft-RoCE VM's steps: not counted here
    s="$s $x"
    case "${x%%@*}" in
      *.py) pysuites=1 ;;
      *.sh) ;;
      *) progs="$progs ${x%%@*}" ;;
    esac
  done
  SUITES[$f]=$(printf '%s\n' $s | sort -u | tr '\n' ' ')
done
# --union: every other test too (not the benchmarks, the helpers a test
# program starts, or the RDMA VM's scripts, which need the VM)
extra=""
if [ "$UNION" = 1 ]; then
  for t in tests/check_*.c tests/it_*.c tests/it_*.sh; do
    t=${t#tests/}; t=${t%.c}
    case "$t" in check_compute_cuda) continue ;; esac
    extra="$extra $t"
    case "$t" in *.sh) ;; *) progs="$progs $t" ;; esac
  done
  extra="$extra pytest"
  progs="$progs crash_worker"   # it_reshard_crash.sh's worker
  pysuites=1
fi
progs=$(printf '%s\n' $progs | sort -u)

mkdir -p "$TREE" "$OUT/uncovered"
git ls-files -z | tar --null -T - -cf - | tar -xf - -C "$TREE" || exit 1
# _exit writes the counts first; and with COV_DUMP_MS every process
# writes what it ran each COV_DUMP_MS ms (and zeroes its counters, so
# nothing is counted twice): a shard a test kills with SIGKILL leaves what
# it ran until then instead of nothing (the replication tests kill
# primaries)
cat >"$OUT/covexit.c" <<'EOF'
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>
extern void __gcov_dump(void);
extern void __gcov_reset(void);
extern void __real__exit(int) __attribute__((noreturn));
/* tests/fault_inject.c's libpsfault.so, when preloaded: the dumps' own
 * allocations are not to fail (gcov would crash) nor to be counted */
static void hold_faults(void)
{
	void (*h)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "psfault_hold");
	if (h)
		h();
}
void __wrap__exit(int s) __attribute__((noreturn));
void __wrap__exit(int s) { hold_faults(); __gcov_dump(); __real__exit(s); }
static long ms;
static void *dumper(void *a)
{
	struct timespec t = { ms / 1000, ms % 1000 * 1000000 };
	(void)a;
	hold_faults();
	for (;;) {
		nanosleep(&t, NULL);
		__gcov_dump();
		__gcov_reset();
	}
	return NULL;
}
__attribute__((constructor)) static void start_dumper(void)
{
	pthread_t th;
	sigset_t all, old;
	const char *e = getenv("COV_DUMP_MS");
	atexit(hold_faults);   /* before exit's destructors, gcov's dump among them */
	ms = e ? atol(e) : 0;
	if (ms <= 0)
		return;
	sigfillset(&all);   /* the dumper takes no signal a program waits for */
	pthread_sigmask(SIG_BLOCK, &all, &old);
	if (!pthread_create(&th, NULL, dumper, NULL))
		pthread_detach(th);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}
EOF
gcc -c -O0 -fPIC "$OUT/covexit.c" -o "$OUT/covexit.o" || exit 1
echo "coverage: building the instrumented tree (build/cov/tree)" >&2
for p in $progs; do rm -f "$TREE/build/rel/tests/$p"; done   # relinked with the wrap
rm -f "$TREE"/bin/ps-* "$TREE"/lib/libps.so* "$TREE"/lib/libps.a   # and with this covexit.o
# the build's flags, also for the suites (a make they run keeps them)
export NVCC= CFLAGS="-O0 -g --coverage" LDFLAGS=--coverage LDLIBS="-Wl,--wrap=_exit $OUT/covexit.o"
(cd "$TREE" && make -s -j2 all build/rel/tests/libpsfault.so $(for p in $progs; do echo "build/rel/tests/$p"; done)) \
  >"$OUT/build.log" 2>&1 || {
  echo "coverage: the instrumented build failed ($OUT/build.log)" >&2; exit 1; }

if [ "$pysuites" = 1 ]; then   # the package over the instrumented lib/libps.so
  (cd "$TREE" && scripts/test-python.sh --install-only) >>"$OUT/build.log" 2>&1 || {
    echo "coverage: cannot install the Python package in $TREE ($OUT/build.log)" >&2; exit 1; }
fi

export PS_TEST_QUICK=1 PS_COMPUTE_PLUGIN_DIR=$TREE/lib
export PS_SECRET_FILE=$OUT/ps.secret PS_REPL_KEY_FILE=$OUT/ps.replkey
[ -f "$PS_SECRET_FILE" ] || scripts/ps-keygen "$PS_SECRET_FILE" 2>/dev/null || exit 1
[ -f "$PS_REPL_KEY_FILE" ] || scripts/ps-keygen "$PS_REPL_KEY_FILE" 2>/dev/null || exit 1
ran=" "
for f in "$@" ${extra:+--union--}; do
  if [ "$f" = --union-- ]; then list=$extra; else list=${SUITES[$f]}; fi
  for s in $list; do
    case "$ran" in *" $s "*) continue ;; esac
    ran="$ran$s "
    d=$OUT/counts/${s//[@,]/_}
    [ -n "${COV_REUSE:-}" ] && [ -d "$d" ] && continue   # counts of an earlier run
    rm -rf "$d"
    mkdir -p "$d"
    only=""
    case "$s" in *@*) only=${s#*@} ;; esac
    echo "coverage: running $s" >&2
    case "${s%%@*}" in   # as scripts/mutate.sh runs them, in the instrumented tree
      *.sh) run=(env -C "$TREE" "tests/$s") ;;
      *.py|pytest) s0=${s%%@*}   # NAME.py@EXPR: only the cases pytest -k EXPR picks
                   run=(env -C "$TREE/python/tests" ../../build/pyvenv/bin/python -m pytest -q \
                        -p no:cacheprovider ${only:+-k "$only"} "${s0/#pytest/.}") ;;
      *)    run=(env -C "$TREE" PS_TEST_ONLY="$only" "build/rel/tests/${s%%@*}") ;;
    esac
    (GCOV_PREFIX=$d GCOV_PREFIX_STRIP=0 timeout 1800 "${run[@]}" >"$d.log" 2>&1) ||
      echo "coverage: $s failed ($d.log); its counts are used all the same" >&2
  done
done

COV_SUITES=$(for f in "$@"; do printf '%s\t%s\n' "$f" "${SUITES[$f]}"; done)
export COV_SUITES COV_EXTRA=$extra
python3 - "$TREE" "$OUT" "$@" <<'PYEOF'
import json, os, shutil, subprocess, sys
tree, out, files = sys.argv[1], sys.argv[2], sys.argv[3:]
suites = dict((l.split('\t') + [''])[:2] for l in os.environ['COV_SUITES'].strip('\n').split('\n'))
extra = os.environ.get('COV_EXTRA', '').split()
def key(s):
    s = s.replace('tsan:', '').replace('san:', '')
    return s.replace('@', '_').replace(',', '_')
# counts[suite][src] = (lines {n: count}, branches {(n, k): count}), one
# gcov call per suite and folder
counts = {}
for s in sorted(set(key(x) for f in files for x in suites[f].split()) | set(extra)):
    counts[s] = {}
    byobj = {}
    for src in files:
        byobj.setdefault(os.path.dirname(src), []).append(src)
    for sub, srcs in byobj.items():
        objdir = os.path.join(out, 'counts', s) + tree + '/build/rel/' + sub
        have = []
        for src in srcs:
            base = os.path.splitext(os.path.basename(src))[0]
            if os.path.exists(os.path.join(objdir, base + '.gcda')):
                shutil.copy(os.path.join(tree, 'build/rel', sub, base + '.gcno'), objdir)
                have.append(src)
        if not have:
            continue   # the suite never ran these files' code
        r = subprocess.run(['gcov', '--json-format', '--stdout', '-b', '-o', objdir] + have,
                           cwd=tree, capture_output=True, text=True)
        for doc in r.stdout.splitlines():
            for fi in json.loads(doc)['files']:
                if fi['file'] not in have:
                    continue
                ln, br = counts[s].setdefault(fi['file'], ({}, {}))
                for l in fi['lines']:
                    n = l['line_number']
                    ln[n] = ln.get(n, 0) + l['count']
                    for k, b in enumerate(l.get('branches', [])):
                        br[(n, k)] = br.get((n, k), 0) + b['count']
def mutant_lines(src):
    """{line: mutants changing it} over every mutant of src, or None."""
    tool = os.path.join(os.getcwd(), 'build/mutate/venv/bin/mutate')
    if not os.path.exists(tool):
        return None
    import collections, tempfile
    orig = open(src).read().split('\n')
    c = collections.Counter()
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([tool, src, 'c', '--noCheck', '--mutantDir', d],
                       capture_output=True)
        for m in os.listdir(d):
            t = open(os.path.join(d, m), errors='replace').read().split('\n')
            n = next((i for i in range(min(len(t), len(orig))) if t[i] != orig[i]), None)
            if n is not None:
                c[n + 1] += 1
    return c
floor = []
def add(src, names):
    lines, br = {}, {}
    for s in names:
        ln, b = counts.get(s, {}).get(src, ({}, {}))
        for n, c in ln.items(): lines[n] = lines.get(n, 0) + c
        for n, c in b.items(): br[n] = br.get(n, 0) + c
    return lines, br
for src in files:
    mapped = [key(x) for x in suites[src].split()]
    lines, br = add(src, mapped)
    total = set(lines)
    for s in counts:   # a line no mapped suite reached still counts as a line
        total |= set(counts[s].get(src, ({}, {}))[0])
    le = sum(1 for v in lines.values() if v)
    be = sum(1 for v in br.values() if v)
    print('%-34s lines %4d/%4d (%3.0f%%)  branches %4d/%4d (%3.0f%%)' % (
        src, le, len(total), 100.0 * le / max(1, len(total)), be, len(br),
        100.0 * be / max(1, len(br))), end='')
    if extra:
        un, _ = add(src, list(counts))
        run = set(n for n, v in lines.items() if v)
        ue = sum(1 for v in un.values() if v)
        gains = sorted(((sum(1 for n, v in counts[s].get(src, ({}, {}))[0].items()
                             if v and n not in run), s) for s in counts if s not in mapped),
                       reverse=True)[:3]
        print('  any test %4d (%3.0f%%)  %s' % (ue, 100.0 * ue / max(1, len(total)),
              ' '.join('%s+%d' % (s, g) for g, s in gains if g)), end='')
    if os.environ.get('COV_MUTANTS') == '1':
        ml = mutant_lines(src)
        if ml is None:
            print('  (no build/mutate/venv: run scripts/mutate.sh once)', end='')
        else:
            unrun = sum(v for n, v in ml.items() if n in total and not lines.get(n))
            allm = sum(ml.values())
            floor.append(unrun / max(1, allm))
            print('  mutants on unrun lines %d/%d (%.1f%%)' % (unrun, allm,
                  100.0 * unrun / max(1, allm)), end='')
    print()
    text = open(os.path.join(tree, src)).read().split('\n')
    un = add(src, list(counts))[0] if extra else {}
    with open(os.path.join(out, 'uncovered', src.replace('/', '_') + '.txt'), 'w') as o:
        for n in sorted(total):
            ks = [k for (m, k) in br if m == n]
            taken = sum(1 for k in ks if br[(n, k)])
            other = ' (another test runs it)' if un.get(n) else ''
            if not lines.get(n):
                o.write('%5d never%s %s\n' % (n, other, text[n - 1]))
            elif ks and taken < len(ks):
                o.write('%5d br %d/%d %s\n' % (n, taken, len(ks), text[n - 1]))
if floor:
    print('mutants on lines no mapped suite runs: %.1f%% on average over the %d files '
          '(a floor under what a draw of one mutant per file sees survive)' %
          (100.0 * sum(floor) / len(floor), len(floor)))
PYEOF
