#!/usr/bin/env bash
# gpu-bundle.sh - downloads what `make gpu-check` needs on a GPU machine that
# reaches no package registry: the Debian packages of the build and the
# Fashion-MNIST dataset, as .deb files in one git-ignored folder.
#
#   scripts/gpu-bundle.sh [--out DIR] [--no-dataset] [--list]
#
# Run it here (a Debian 12 machine with apt and network), in the checkout the
# device tool sends, then carry the folder (docs/gpu.md). The GPU machines'
# image (Ubuntu with the CUDA toolkit, cuDNN, PyTorch) has a C compiler, libc
# and the base system but none of our -dev packages. The packages are the
# build's (scripts/install-deps.sh: libuv1-dev ... libopenblas-dev, check,
# pkg-config, protobuf-c-compiler) plus make, and everything they depend on,
# first alternative of each dependency, except:
#   - what every Debian/Ubuntu system or C toolchain has: Priority
#     required/important, glibc and its -dev, gcc's runtime (SKIPPED lists them);
#     zlib1g and liblz4-1 are taken anyway (their -dev's .so links point at them);
#   - -dev packages that only a static link needs (libgnutls28-dev, libnl-*-dev):
#     scripts/gpu-check.sh drops Requires.private from the unpacked .pc files.
# OpenBLAS: the pthread variant only (libopenblas-pthread-dev), as Debian's
# libopenblas-dev would pick it. Each package is trimmed of static libraries,
# documentation and manual pages (repacked, same name and version): the build
# links shared libraries, and the trimmed set is about 6 MiB smaller.
#
# Output, in DIR (default gpu-bundle/ at the repository root, git-ignored):
# the .deb files (older versions removed), MANIFEST (package, version, size)
# and SKIPPED (dependencies assumed present). Prints the total size: keep it
# under about 55 MiB, the device tool carries 64 MiB with the working tree.
#   --no-dataset  leave out dataset-fashion-mnist (31 MB); gpu-check then needs
#                 the IDX .gz files in /usr/share/datasets/fashion-mnist
#   --list        print what would be downloaded, download nothing
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
OUT=$here/gpu-bundle DATASET=1 LIST=0

usage() { sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --out) [ $# -ge 2 ] || { echo "gpu-bundle.sh: --out needs a folder" >&2; exit 2; }
           OUT=$2; shift 2 ;;
    --no-dataset) DATASET=0; shift ;;
    --list) LIST=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu-bundle.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
for t in apt-get apt-cache dpkg-deb; do
  command -v "$t" >/dev/null || { echo "gpu-bundle.sh: $t missing: run this on a Debian machine" >&2; exit 2; }
done

# What the build needs (scripts/install-deps.sh, less the tools of tests that
# gpu-check does not run), plus make and pkgconf's pkg-config.
TOP=(make pkgconf libuv1-dev libprotobuf-c-dev protobuf-c-compiler libyaml-dev liblz4-dev
     check libsodium-dev libssl-dev libibverbs-dev librdmacm-dev libmicrohttpd-dev
     zlib1g-dev libopenblas-pthread-dev libdnnl-dev)
# Present on any image with a C compiler (the GPU machines build CUDA code).
BASE=" libc6 libc6-dev libc-dev-bin linux-libc-dev libcrypt1 libcrypt-dev libnsl2 libnsl-dev
 libtirpc3 libtirpc-dev libtirpc-common rpcsvc-proto libgcc-s1 libstdc++6 gcc-12-base libgomp1
 debconf cdebconf dpkg perl-base tar adduser passwd install-info mawk libselinux1 "
# Only a static link needs these (their .pc files are only Requires.private).
STATIC_ONLY=" libgnutls28-dev libnl-3-dev libnl-route-3-dev "
# Required-priority libraries taken anyway: -dev symlinks point at them.
KEEP=" zlib1g liblz4-1 "

declare -A present=()
assumed() { # PKG: true when PKG is taken to be on the GPU machine already
  if [ -z "${present[$1]:-}" ]; then
    local prio=""
    case "$BASE" in *" $1 "*) prio=base ;; esac
    case "$KEEP" in *" $1 "*) prio=keep ;; esac
    [ -n "$prio" ] || prio=$(apt-cache show --no-all-versions "$1" 2>/dev/null |
                             awk '/^Priority:/ { print $2; exit }')
    case "$prio" in base|required|important) present[$1]=y ;; *) present[$1]=n ;; esac
  fi
  [ "${present[$1]}" = y ]
}

# One line per dependency group of PKG: its alternatives, virtual packages
# replaced by their providers.
dep_groups() {
  apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks \
    --no-replaces --no-enhances "$1" 2>/dev/null | awk '
    NR == 1 { next }
    /^ [ |](Pre)?Depends:/ {
      alt = substr($0, 2, 1) == "|"
      name = $2
      if (name ~ /^</) { virt = 1; name = "" } else virt = 0
      line = line (line == "" ? "" : " ") name
      if (!alt && !virt) { print line; line = "" }
      pending = !alt
      next
    }
    /^    / { # a provider of the virtual package just named
      if (virt) { line = line (line == "" ? "" : " ") $1; if (pending) { print line; line = ""; virt = 0 } }
      next
    }
    END { if (line != "") print line }'
}

declare -A seen=()
want=() skipped=()
queue=("${TOP[@]}")
while [ ${#queue[@]} -gt 0 ]; do
  p=${queue[0]}
  queue=("${queue[@]:1}")
  [ -n "${seen[$p]:-}" ] && continue
  seen[$p]=1
  case "$STATIC_ONLY" in *" $p "*) skipped+=("$p (static link only)"); continue ;; esac
  if assumed "$p"; then skipped+=("$p"); continue; fi
  apt-cache show --no-all-versions "$p" >/dev/null 2>&1 ||
    { echo "gpu-bundle.sh: no package '$p' in apt's lists (apt-get update?)" >&2; exit 1; }
  want+=("$p")
  while read -r -a alts; do
    [ ${#alts[@]} -gt 0 ] || continue
    pick=""
    for a in "${alts[@]}"; do # a group one of whose members is present is met
      [ -n "${seen[$a]:-}" ] && { pick=""; break; }
      if assumed "$a"; then seen[$a]=1; skipped+=("$a"); pick=""; break; fi
      [ -z "$pick" ] && pick=$a
    done
    [ -n "$pick" ] && queue+=("$pick")
  done < <(dep_groups "$p")
done
[ $DATASET -eq 1 ] && want+=(dataset-fashion-mnist)

if [ $LIST -eq 1 ]; then
  printf '%s\n' "${want[@]}"
  printf 'assumed present: %s\n' "${skipped[*]}"
  exit 0
fi

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
tmp=$(mktemp -d "$OUT/.dl.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "gpu-bundle.sh: downloading ${#want[@]} packages into $OUT" >&2
# as root, apt's sandbox user cannot write into our folder: download as root
sandbox=()
[ "$(id -u)" -eq 0 ] && sandbox=(-o APT::Sandbox::User=root)
(cd "$tmp" && apt-get -q "${sandbox[@]}" download "${want[@]}" >/dev/null) ||
  { echo "gpu-bundle.sh: apt-get download failed (network? apt-get update?)" >&2; exit 1; }
# Trim: static libraries that have a shared twin (the build links shared
# ones; check has only static ones, kept), documentation and
# manual pages out, recompressed with xz; what is left is unchanged.
for f in "$tmp"/*.deb; do
  case "$f" in */dataset-*) continue ;; esac
  if dpkg-deb -c "$f" | awk '{ print $6 }' | grep -E '\.a$|^\./usr/share/(doc|man)/' >/dev/null; then
    r=$tmp/raw
    rm -rf "$r" && dpkg-deb -R "$f" "$r"
    find "$r" \( -path "$r/usr/share/doc" -o -path "$r/usr/share/man" \) -prune -exec rm -rf {} +
    # a static library goes only where a shared one of the same name is
    # beside it: check ships libcheck_pic.a alone, and the tests link it.
    # The .so is mostly a link into the runtime package, dangling here (-L,
    # not -e); a .a that is a link takes the file it names with it
    # (libopenblas.a -> libopenblasp-r0.3.21.a, 58 MB before xz).
    find "$r" -name '*.a' -print0 | while IFS= read -r -d '' a; do
      # (an if, not &&: the loop's status is its last command's, and a
      # static library left alone must not end the script under set -e)
      if [ -e "${a%.a}.so" ] || [ -L "${a%.a}.so" ]; then
        if [ -L "$a" ]; then rm -f "$(dirname "$a")/$(readlink "$a")"; fi
        rm -f "$a"
      fi
    done
    rm -f "$r/DEBIAN/md5sums"
    dpkg-deb --root-owner-group -Zxz -z9 -b "$r" "$f" >/dev/null
  fi
done
rm -rf "$tmp/raw"
rm -f "$OUT"/*.deb
mv "$tmp"/*.deb "$OUT"/

{
  # shellcheck source=/dev/null
  echo "# gpu-bundle.sh $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "# package version bytes"
  for f in "$OUT"/*.deb; do
    printf '%s %s %s\n' "$(dpkg-deb -f "$f" Package)" "$(dpkg-deb -f "$f" Version)" "$(stat -c %s "$f")"
  done
} >"$OUT/MANIFEST"
printf '%s\n' "${skipped[@]}" >"$OUT/SKIPPED"
total=$(du -cb "$OUT"/*.deb | tail -1 | cut -f1)
data=$(du -cb "$OUT"/dataset-*.deb 2>/dev/null | tail -1 | cut -f1)
printf 'gpu-bundle.sh: %d packages, %.1f MiB (dataset %.1f MiB) in %s\n' \
  "$(find "$OUT" -maxdepth 1 -name '*.deb' | wc -l)" "$(echo "$total / 1048576" | bc -l)" \
  "$(echo "${data:-0} / 1048576" | bc -l)" "$OUT"
echo "  carry it: run(carry=[\"${OUT#"$here"/}\"], command=\"make gpu-check\") (docs/gpu.md)"
