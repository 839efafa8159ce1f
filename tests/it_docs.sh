#!/usr/bin/env bash
# it_docs.sh - the docs, the example config and the programs' help agree
# with the code: conf/example-full.yaml holds every option of the table that
# `ps-server --help` prints (generated from common/config_table.c) with its
# default, and no unknown key (tests/check_example_config.py); it loads;
# every program's --version says its release, wire protocol and optional
# parts; and no page, example config or --help text says again what is no longer
# true (each phrase below was once written and then overtaken by the code).
# Prints Check-style "N%: Checks" so scripts/run-tests.sh summarises it.
set -u
cd "$(dirname "$0")/.." || exit 1
checks=0 fails=0
ok() { checks=$((checks + 1)); }
bad() { checks=$((checks + 1)); fails=$((fails + 1)); echo "FAIL: $*"; }

tmp=$(mktemp -d /tmp/ps-docs.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

bin/ps-server --help >"$tmp/help.txt" 2>&1
if out=$(python3 tests/check_example_config.py "$tmp/help.txt" conf/example-full.yaml); then ok
else bad "conf/example-full.yaml against the option table:
$out"; fi
bin/ps-server --config conf/example-full.yaml --shard 0 --dump-config >/dev/null 2>"$tmp/dump.err" &&
  ok || bad "conf/example-full.yaml does not load: $(cat "$tmp/dump.err")"

# Help texts of every program, beside the pages
for p in ps-server ps-worker ps-stat ps-bench ps-ctrgen ps-export; do
  bin/$p --help >"$tmp/help-$p.txt" 2>&1
  [ -s "$tmp/help-$p.txt" ] && ok || bad "$p --help printed nothing"
done
# --version: every program says its release (the header's), the wire
# protocol (wire.h's) and whether this build found its CUDA plug-in
want_ver=$(sed -n 's/^#define PS_VERSION_MAJOR \([0-9]*\)/\1/p' worker/client/ps_client.h).$(sed -n 's/^#define PS_VERSION_MINOR \([0-9]*\)/\1/p' worker/client/ps_client.h)
want_proto=$(sed -n 's/^#define PS_PROTOCOL_VERSION \([0-9]*\)/\1/p' common/wire.h)
if [ -e lib/ps-compute-cuda.so ]; then want_cuda="cuda plug-in: $(realpath lib/ps-compute-cuda.so)"
else want_cuda="cuda plug-in: absent"; fi
for p in ps-server ps-worker ps-stat ps-bench ps-ctrgen ps-export; do
  out=$(bin/$p --version 2>&1); rc=$?
  [ $rc -eq 0 ] && [ "$(head -1 <<<"$out")" = "$p $want_ver" ] && ok ||
    bad "$p --version (status $rc): '$(head -1 <<<"$out")', expected '$p $want_ver'"
  grep -qx "wire protocol $want_proto" <<<"$out" && ok || bad "$p --version: no 'wire protocol $want_proto' in '$out'"
  grep -q "^transports: tcp, rdma " <<<"$out" && ok || bad "$p --version: no transports line in '$out'"
  grep -q "^$want_cuda" <<<"$out" && ok || bad "$p --version: no '$want_cuda' in '$out'"
  grep -q -- "--version" "$tmp/help-$p.txt" && ok || bad "$p --help does not list --version"
done

# --version where no plug-in is found: a copy of ps-export in a folder of its
# own, the plug-in folder named by PS_COMPUTE_PLUGIN_DIR empty: every folder
# searched is named, in the order searched (the environment's, the
# program's ../lib and ../lib/ps, the install folder)
mkdir -p "$tmp/alone/bin" "$tmp/none"
cp bin/ps-export "$tmp/alone/bin/"
inst=$(make -s print-prefix 2>/dev/null)/lib/ps
if [ -r "$inst/ps-compute-cuda.so" ]; then
  want="cuda plug-in: $(realpath "$inst/ps-compute-cuda.so")"
else
  want="cuda plug-in: absent (not in $tmp/none, $tmp/alone/bin/../lib, $tmp/alone/bin/../lib/ps, $inst; built only where nvcc and cuDNN are found)"
fi
out=$(PS_COMPUTE_PLUGIN_DIR=$tmp/none "$tmp/alone/bin/ps-export" --version 2>&1)
grep -qxF "$want" <<<"$out" && ok || bad "ps-export --version alone: '$want' not in '$out'"
# a plug-in in the folder the environment names is found there first
if [ -e lib/ps-compute-cuda.so ]; then
  cp lib/ps-compute-cuda.so "$tmp/none/"
  out=$(PS_COMPUTE_PLUGIN_DIR=$tmp/none "$tmp/alone/bin/ps-export" --version 2>&1)
  grep -qxF "cuda plug-in: $tmp/none/ps-compute-cuda.so" <<<"$out" && ok ||
    bad "ps-export --version with PS_COMPUTE_PLUGIN_DIR: '$out'"
else
  echo "SKIP: the plug-in found through PS_COMPUTE_PLUGIN_DIR: this build has no lib/ps-compute-cuda.so (no nvcc)"
fi
# the transports line says why rdma cannot run here, without the advice
# meant for a config that asks for it
grep -q "^transports: tcp, rdma (verbs, rdma_cm; \(here\|not usable here\): " <<<"$out" && ok ||
  bad "ps-export --version: transports line in '$out'"
grep -q "use transport: tcp" <<<"$out" && bad "ps-export --version gives a config's advice: '$out'" || ok

# Phrases that said what is no longer true: rdma works (docs/rdma.md, tested
# in the soft-RoCE VM), unacknowledged pushes are resent (docs/reliability.md),
# the CUDA backend ran on a GPU (BENCHMARKS.md "GPU").
stale=(
  "until its data path exists"
  "Until the RDMA data path exists"
  "rdma is refused at load"
  "are not resent"
  "resending unacknowledged pushes is the"
  "compiled but not run"
  "membership is not replicated yet"
  "divides the click log by rank"
)
for phrase in "${stale[@]}"; do
  hits=$(grep -n -F -- "$phrase" README.md docs/*.md conf/*.yaml "$tmp"/help-*.txt 2>/dev/null |
    sed "s|$tmp/help-\(.*\)\.txt|\1 --help|")
  [ -z "$hits" ] && ok || bad "stale text '$phrase' in: $hits"
done

pct=$(( checks ? (checks - fails) * 100 / checks : 0 ))
echo "$pct%: Checks: $checks, Failures: $fails, Errors: 0"
[ $fails -eq 0 ]
