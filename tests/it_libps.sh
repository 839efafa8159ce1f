#!/usr/bin/env bash
# it_libps.sh - the shared library as a C user meets it: `make install`
# into a temporary DESTDIR puts libps.so (with its soname), the public
# headers and ps.pc in place; libps.so exports exactly the functions of
# the public headers; a program built with nothing but
# `pkg-config --cflags --libs ps` opens a config through the opaque handle
# and gets the file:line error for a bad one.
# Prints Check-style "N%: Checks" so scripts/run-tests.sh summarises it.
set -u
cd "$(dirname "$0")/.." || exit 1
checks=0 fails=0
ok() { checks=$((checks + 1)); }
bad() { checks=$((checks + 1)); fails=$((fails + 1)); echo "FAIL: $*"; }

tmp=$(mktemp -d /tmp/ps-libps.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
prefix=/usr/local
dest=$tmp/dest

# Only install's own lines: `all` is up to date when the test runs.
if make --no-print-directory install DESTDIR="$dest" PREFIX=$prefix >"$tmp/install.log" 2>&1; then ok
else bad "make install DESTDIR: $(tail -3 "$tmp/install.log")"; fi
lib=$dest$prefix/lib
for f in libps.so libps.so.1 libps.a pkgconfig/ps.pc; do
  [ -e "$lib/$f" ] && ok || bad "$lib/$f not installed"
done
headers=$(cd "$dest$prefix/include/ps" 2>/dev/null && ls | tr '\n' ' ')
[ "$headers" = "ps_client.h ps_err.h " ] && ok || bad "installed headers: '$headers', expected ps_client.h ps_err.h"

soname=$(readelf -d "$lib/libps.so" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[ "$soname" = libps.so.1 ] && ok || bad "soname '$soname', expected libps.so.1"

# Exports: every global of the version script and nothing else.
nm -D --defined-only "$lib/libps.so" | awk '$2 ~ /^[TDBRV]$/ && $3 !~ /^PS_1\.[0-9]+$/ { sub(/@.*/, "", $3); print $3 }' |
  sort >"$tmp/exported"
sed -n 's/^[[:space:]]*\(ps_[a-z_0-9]*\);$/\1/p' worker/client/libps.map | sort >"$tmp/public"
if diff "$tmp/public" "$tmp/exported" >"$tmp/diff"; then ok
else bad "libps.so exports differ from worker/client/libps.map: $(tr '\n' ' ' <"$tmp/diff")"; fi
# ... and each public function is declared in the installed headers
missing=$(for f in $(cat "$tmp/public"); do grep -q "\b$f(" "$dest$prefix"/include/ps/*.h || echo "$f"; done)
[ -z "$missing" ] && ok || bad "exported but not in the public headers: $missing"
# ... and each function the public headers declare is exported (a call a
# libps.so user could write must link)
declared=$(sed -n 's/^[a-z].*[ *]\(ps_[a-z_0-9]*\)(.*/\1/p' "$dest$prefix"/include/ps/*.h | sort -u)
unexported=$(for f in $declared; do grep -qx "$f" "$tmp/public" || echo "$f"; done)
[ -z "$unexported" ] && ok || bad "declared in the public headers but not exported: $unexported"

cat >"$tmp/tiny.c" <<'C'
#include <stdio.h>
#include <ps_client.h>
int main(int argc, char **argv)
{
	struct ps_config *cfg;
	char err[512];
	if (argc != 2)
		return 2;
	if (ps_config_open(&cfg, argv[1], err, sizeof(err))) {
		printf("error %s: %s\n", ps_strerror(PS_ECONFIG), err);
		return 1;
	}
	printf("libps %s: %d shards, %d tensors, %s %lld\n", ps_version(), ps_config_nshards(cfg),
	       ps_config_ntensors(cfg), ps_config_tensor_name(cfg, 0),
	       (long long)ps_config_tensor_count(cfg, 0));
	ps_config_close(cfg);
	return 0;
}
C
export PKG_CONFIG_SYSROOT_DIR=$dest PKG_CONFIG_PATH=$lib/pkgconfig
flags=$(pkg-config --cflags --libs ps)
if gcc -Wall -Wextra -Werror -o "$tmp/tiny" "$tmp/tiny.c" $flags 2>"$tmp/cc.log"; then ok
else bad "cc with '$flags': $(cat "$tmp/cc.log")"; fi
out=$(LD_LIBRARY_PATH=$lib "$tmp/tiny" conf/local.yaml 2>&1)
want="libps 1.0: 2 shards, 8 tensors, conv1.weight 800"
[ "$out" = "$want" ] && ok || bad "tiny conf/local.yaml: '$out', expected '$want'"
printf 'cluster:\n  servers: [127.0.0.1:1]\n  nonsense: 3\n' >"$tmp/bad.yaml"
out=$(LD_LIBRARY_PATH=$lib "$tmp/tiny" "$tmp/bad.yaml" 2>&1)
case $out in "error "*"$tmp/bad.yaml:3"*) ok ;; *) bad "bad config: '$out', expected $tmp/bad.yaml:3" ;; esac

pct=$(( checks ? (checks - fails) * 100 / checks : 0 ))
echo "$pct%: Checks: $checks, Failures: $fails, Errors: 0"
[ $fails -eq 0 ]
