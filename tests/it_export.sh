#!/usr/bin/env bash
# it_export.sh - ps-export on checkpoints of real shards, without Python's
# client (python/tests/test_export.py has the bit-exact round trip): two
# shards filled by ps-bench --local (--op pull-rows fills every row, the
# SIGTERM at its end writes each shard's checkpoint), exported; numpy reads
# every id once, sorted, rows of the table's dim; the export is the same
# bytes twice; a checkpoint cut at 40 offsets or with a byte flipped at 40
# offsets, a missing shard, a wrong --since, a config of other tables: each
# exits non-zero naming the file (and the offset), writing nothing; a
# write that fails inside a table says so, and only that.
# Prints Check-style "N%: Checks" so scripts/run-tests.sh summarises it.
set -u
cd "$(dirname "$0")/.." || exit 1
checks=0 fails=0
ok() { checks=$((checks + 1)); }
bad() { checks=$((checks + 1)); fails=$((fails + 1)); echo "FAIL: $*"; }

tmp=$(mktemp -d /tmp/ps-export.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/ck"
if [ -z "${PS_SECRET_FILE:-}" ]; then
  scripts/ps-keygen "$tmp/secret" 2>/dev/null && export PS_SECRET_FILE=$tmp/secret
fi
. tests/lib-ports.sh # free_port
cat >"$tmp/base.yaml" <<EOF2
cluster:
  servers: [127.0.0.1:$(free_port), 127.0.0.1:$(free_port)]
  workers: 1
model:
  tensors:
    - {name: w, shape: [3000], init: uniform, scale: 1}
  embeddings:
    - {name: e, dim: 8}
checkpoint:
  dir: $tmp/ck
log:
  level: warn
EOF2
rows=40000 # its rows (1.25 MiB) pass the writer's 1 MiB buffer: written inside the table
bin/ps-bench --config "$tmp/base.yaml" --op pull-rows --rows $rows --dim 8 --dump-config \
  >"$tmp/c.yaml" 2>"$tmp/err" || { echo "ps-bench --dump-config: $(cat "$tmp/err")"; exit 1; }
bin/ps-bench --config "$tmp/c.yaml" --local --op pull-rows --rows $rows --dim 8 --seconds 0.3 \
  --no-baseline >"$tmp/bench.out" 2>&1 && ok || bad "ps-bench --local: $(tail -3 "$tmp/bench.out")"
[ -f "$tmp/ck/shard-0.ckpt" ] && [ -f "$tmp/ck/shard-1.ckpt" ] && ok || bad "no checkpoints: $(ls "$tmp/ck")"

bin/ps-export --config "$tmp/c.yaml" --out "$tmp/a.npz" 2>"$tmp/err" && ok ||
  bad "ps-export: $(cat "$tmp/err")"
# the summary line whole: the dense floats (the config's w, 3000) and the table's rows
grep -Eq "^ps-export: wrote $tmp/a.npz: 1 dense tensors \(3000 floats\), table 'bench' $rows rows of dim 8 in [0-9]+\.[0-9]{2} s$" "$tmp/err" &&
  ok || bad "summary: $(cat "$tmp/err")"
# numpy: Debian's (what build/pyvenv sees), else whichever python3 has it
np_py=
for p in /usr/bin/python3 build/pyvenv/bin/python python3; do
  if "$p" -c 'import numpy' 2>/dev/null; then np_py=$p; break; fi
done
if [ -z "$np_py" ]; then
  echo "SKIP the numpy check: no python3 with numpy here"
elif out=$("$np_py" - "$tmp/a.npz" $rows <<'EOF2'
import json, sys, zipfile
import numpy as np
z = np.load(sys.argv[1])
ids, rows = z["tables/bench/ids"], z["tables/bench/rows"]
meta = json.loads(zipfile.ZipFile(sys.argv[1]).read("meta.json"))
assert ids.dtype == np.uint64 and rows.dtype == np.float32, (ids.dtype, rows.dtype)
assert len(ids) == int(sys.argv[2]) and rows.shape == (len(ids), 8), rows.shape
assert (ids[1:] > ids[:-1]).all(), "ids not sorted and unique"
assert np.isfinite(rows).all() and np.abs(rows).max() > 0
assert meta["tables"]["bench"]["rows"] == len(ids) and len(meta["shards"]) == 2
assert all(k.startswith(("dense/", "tables/")) or k == "meta.json" for k in z.files)
EOF2
); then ok; else bad "numpy's view of the export: $out"; fi
bin/ps-export --config "$tmp/c.yaml" --out "$tmp/b.npz" --quiet && cmp -s "$tmp/a.npz" "$tmp/b.npz" &&
  ok || bad "a second export differs"

# out of memory anywhere: the Nth allocation of ps-export failed
# (tests/fault_inject.c's libpsfault.so), for every N until a run makes no
# fault (about 1,550 runs of 7 ms, most in the config's parse): each run
# either exports the same bytes or exits 1 or 2 saying it ran out of
# memory, leaving no file; never a signal or an export of other bytes
fault=build/rel/tests/libpsfault.so
[ -e "$fault" ] || make --no-print-directory -s "$fault" >/dev/null 2>&1
if [ ! -e "$fault" ]; then
  echo "SKIP the out-of-memory sweep: $fault is not built (make $fault)"
elif ldd bin/ps-export | grep -q libasan; then
  echo "SKIP the out-of-memory sweep: bin/ps-export is the sanitizer build (its runtime must come first)"
else
  landed=0 refused=0 late=0 wrong="" gcov=0 after=0
  # a coverage build: gcov's own write at exit allocates, and crashes when
  # that fails; such a run counts when its export was done and right
  grep -q __gcov_ bin/ps-export && gcov=1
  for n in $(seq 1 5000); do
    rm -f "$tmp/flog" "$tmp"/x.npz*
    out=$(LD_PRELOAD=$PWD/$fault PS_FAULT=alloc:$n PS_FAULT_LOG=$tmp/flog \
          bin/ps-export --config "$tmp/c.yaml" --out "$tmp/x.npz" 2>&1); rc=$?
    [ -s "$tmp/flog" ] || break
    landed=$((landed + 1))
    if [ $gcov -eq 1 ] && [ $rc -gt 128 ] && grep -q "^ps-export: wrote" <<<"$out" &&
       cmp -s "$tmp/x.npz" "$tmp/a.npz"; then
      after=$((after + 1))
      continue
    fi
    if [ $rc -eq 0 ]; then
      cmp -s "$tmp/x.npz" "$tmp/a.npz" || wrong="$wrong alloc:$n exported other bytes;"
      continue
    fi
    refused=$((refused + 1))
    last=$(tail -1 <<<"$out")
    # past the config: the export's own steps ran out
    grep -q "c.yaml" <<<"$last" || late=$((late + 1))
    if { [ $rc -ne 1 ] && [ $rc -ne 2 ]; } || ! grep -Eq "out of memory|Cannot allocate memory" <<<"$last"; then
      wrong="$wrong alloc:$n: status $rc: $last ($(head -1 "$tmp/flog"));"
    fi
    ls "$tmp"/x.npz* >/dev/null 2>&1 && wrong="$wrong alloc:$n left $(ls "$tmp"/x.npz*);"
  done
  rm -f "$tmp"/x.npz* # the last run's, which made no fault
  echo "out-of-memory sweep: $landed runs with a failed allocation, $refused refused ($late past the config)$([ $after -gt 0 ] && echo ", $after in gcov's write at exit")"
  [ -z "$wrong" ] && ok || bad "out of memory:${wrong:0:2000}"
  [ "$landed" -ge 1000 ] && [ "$late" -ge 20 ] && ok ||
    bad "the sweep reached too little: $landed runs, $late refusals past the config"
fi

# damaged files: a clear error naming the file and offset, nothing written
f=$tmp/ck/shard-1.ckpt
cp "$f" "$tmp/good"
size=$(stat -c %s "$tmp/good")
for i in $(seq 0 39); do
  cut=$((size * i / 40 + i))
  head -c $cut "$tmp/good" >"$f"
  out=$(bin/ps-export --config "$tmp/c.yaml" --out "$tmp/x.npz" 2>&1); rc=$?
  [ $rc -eq 1 ] && grep -q "$f" <<<"$out" && grep -Eq "offset|too short" <<<"$out" && ok ||
    bad "cut at $cut: status $rc: $out"
  at=$((size * i / 40 + 7))
  python3 -c "import sys; b=bytearray(open(sys.argv[1],'rb').read()); b[int(sys.argv[3])]^=0x21; open(sys.argv[2],'wb').write(b)" \
    "$tmp/good" "$f" $at
  out=$(bin/ps-export --config "$tmp/c.yaml" --out "$tmp/x.npz" 2>&1); rc=$?
  [ $rc -eq 1 ] && grep -q "$f" <<<"$out" && grep -q "offset" <<<"$out" && ok ||
    bad "byte $at flipped: status $rc: $out"
done
[ ! -e "$tmp/x.npz" ] && ok || bad "an export was written from a damaged file"
cp "$tmp/good" "$f"
mv "$tmp/ck/shard-0.ckpt" "$tmp/s0"
out=$(bin/ps-export --config "$tmp/c.yaml" --out "$tmp/x.npz" 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "shard-0.ckpt: cannot read" <<<"$out" && ok || bad "missing shard: $rc $out"
mv "$tmp/s0" "$tmp/ck/shard-0.ckpt"
out=$(bin/ps-export --config "$tmp/c.yaml" --out "$tmp/x.npz" --since 1 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "only 0 incremental" <<<"$out" && ok || bad "--since 1: $rc $out"
out=$(bin/ps-export --config "$tmp/c.yaml" --out "$tmp/x.npz" --since x 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q -- "--since x" <<<"$out" && ok || bad "--since x: $rc $out"
# a write that fails inside the table (the file size limit, SIGXFSZ
# ignored: write() fails with EFBIG): the error is the table's whole line,
# nothing an earlier step left in the exporter's error (each shard's chain
# ends at a missing incremental file, which sets no text), no file left
out=$( (trap '' XFSZ; ulimit -f 128; exec bin/ps-export --config "$tmp/c.yaml" --out "$tmp/x.npz") 2>&1); rc=$?
[ $rc -eq 1 ] && [ "$out" = "ps-export: cannot write table 'bench': File too large" ] &&
  ok || bad "a write failing in the table: $rc $out"
ls "$tmp"/x.npz* >/dev/null 2>&1 && bad "a failed export left $(ls "$tmp"/x.npz*)" || ok
sed 's/dim: 8/dim: 9/' "$tmp/c.yaml" >"$tmp/d.yaml"
out=$(bin/ps-export --config "$tmp/d.yaml" --out "$tmp/x.npz" 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "another configuration" <<<"$out" && ok || bad "other dim: $rc $out"
out=$(bin/ps-export --out "$tmp/x.npz" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q -- "--config is required" <<<"$out" && ok || bad "no --config: $rc $out"
[ ! -e "$tmp/x.npz" ] && ok || bad "an export was written by a refused run"

pct=$(( checks ? (checks - fails) * 100 / checks : 0 ))
echo "$pct%: Checks: $checks, Failures: $fails, Errors: 0"
[ $fails -eq 0 ]
