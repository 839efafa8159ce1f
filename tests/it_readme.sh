#!/usr/bin/env bash
# it_readme.sh - README.md's C client example as a reader meets it: the
# program is cut out of README.md, compiled with README's own `cc` line
# against `make install` into a temporary DESTDIR (pkg-config only), and
# run as README runs it (two ranks against two real shards, sync) on a
# copy of conf/local.yaml with free ports; its output must be the lines
# README prints and its exit status 0. A stopped cluster must make it
# exit 1 with the reason.
# Prints Check-style "N%: Checks" so scripts/run-tests.sh summarises it.
set -u
cd "$(dirname "$0")/.." || exit 1
root=$PWD
checks=0 fails=0
ok() { checks=$((checks + 1)); }
bad() { checks=$((checks + 1)); fails=$((fails + 1)); echo "FAIL: $*"; }

tmp=$(mktemp -d /tmp/ps-readme.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT

. tests/lib-ports.sh # free_port
# fenced block N (1-based) of README.md whose first line matches $1
block() {
  awk -v pat="$1" '
    /^```/ { if (inb) { if (hit) exit; inb = 0; next } inb = 1; first = 1; next }
    inb && first { first = 0; if ($0 ~ pat) hit = 1 }
    inb && hit { print }' README.md
}

block '^/\* client\.c:' >"$tmp/client.c"
[ -s "$tmp/client.c" ] && ok || bad "README.md has no C block starting '/* client.c:'"
ccline=$(block '^make install PREFIX=\$HOME/ps' | grep '^cc ')
[ -n "$ccline" ] && ok || bad "README.md's build block has no 'cc' line"
expected=$(awk '/^```$/ { if (inb) { inb = 0; next } inb = 1; next } inb && /^rank [0-9]+: /' README.md | sort)
[ "$(printf '%s\n' "$expected" | grep -c .)" -eq 2 ] && ok || bad "README.md prints no two 'rank R:' lines: '$expected'"

prefix=/usr/local
dest=$tmp/dest
if make --no-print-directory install DESTDIR="$dest" PREFIX=$prefix >"$tmp/install.log" 2>&1; then ok
else bad "make install DESTDIR: $(tail -3 "$tmp/install.log")"; fi
export PKG_CONFIG_SYSROOT_DIR=$dest PKG_CONFIG_PATH=$dest$prefix/lib/pkgconfig
export LD_LIBRARY_PATH=$dest$prefix/lib
# README's line, run as printed (in the folder holding client.c), warnings fatal
if (cd "$tmp" && eval "${ccline/cc /cc -Werror }") >"$tmp/cc.log" 2>&1; then ok
else bad "README's '$ccline' failed: $(head -20 "$tmp/cc.log")"; fi

# conf/local.yaml with free ports and the secret in $tmp
p0=$(free_port); p1=$(free_port $p0)
sed -e "s|servers: \[.*\]|servers: [127.0.0.1:$p0, 127.0.0.1:$p1]|" \
    -e "s|metrics_dir: .*|metrics_dir: $tmp/m|" conf/local.yaml >"$tmp/local.yaml"
scripts/ps-keygen "$tmp/local.secret" 2>/dev/null
ports=$(sed -n 's/.*servers: \[127.0.0.1:\([0-9]*\), 127.0.0.1:\([0-9]*\)\].*/\1 \2/p' "$tmp/local.yaml")
for k in 0 1; do
  bin/ps-server --config "$tmp/local.yaml" --shard $k 2>"$tmp/shard$k.log" &
  pids+=($!)
done
for p in $ports; do # each shard listens before a client dials (10 s at most)
  for _ in $(seq 200); do (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null && break; sleep 0.05; done
done

if [ -x "$tmp/client" ]; then
  cd "$tmp" || exit 1
  ./client local.yaml 1 >"$tmp/out1" 2>"$tmp/err1" &
  c1=$!
  timeout 60 ./client local.yaml 0 >"$tmp/out0" 2>"$tmp/err0"; rc0=$?
  wait $c1; rc1=$?
  cd "$root" || exit 1
  [ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] && ok ||
    bad "client exit status $rc0 / $rc1: $(cat "$tmp/err0" "$tmp/err1")"
  got=$(cat "$tmp/out0" "$tmp/out1" | sort)
  [ "$got" = "$expected" ] && ok || bad "client printed '$got', README says '$expected'"

  # the shards gone: exit 1 and the reason on stderr, nothing on stdout
  for p in "${pids[@]}"; do kill -TERM "$p"; wait "$p"; done
  pids=()
  (cd "$tmp" && timeout 60 ./client local.yaml 0 >"$tmp/out" 2>"$tmp/err"); rc=$?
  [ $rc -eq 1 ] && [ ! -s "$tmp/out" ] && grep -q "shard" "$tmp/err" && ok ||
    bad "client without shards: status $rc, out '$(cat "$tmp/out")', err '$(cat "$tmp/err")'"
else
  bad "no client program to run"
fi

pct=$(( checks ? (checks - fails) * 100 / checks : 0 ))
echo "$pct%: Checks: $checks, Failures: $fails, Errors: 0"
[ $fails -eq 0 ]
