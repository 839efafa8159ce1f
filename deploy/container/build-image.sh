#!/usr/bin/env bash
# build-image.sh - builds the container image (deploy/container/Containerfile)
# from Debian packages only: no registry is needed.
#
#   deploy/container/build-image.sh [--tag TAG] [--base IMAGE]
#
# Without --base, the base image localhost/ps-debian:bookworm is made once:
# debootstrap (minbase) of Debian 12 into build/image/rootfs from $DEBIAN_MIRROR
# (default http://deb.debian.org/debian), imported with `podman import`.
# Then `podman build` (or buildah) of the Containerfile from the top of
# the tree, tagged TAG (default localhost/ps:latest). Needs root (or a
# rootless podman) and debootstrap for the base; the build fetches
# packages from the same mirror.
#
# Where the engine cannot apply its default limits or cgroups (a
# container without CAP_SYS_RESOURCE, a cgroup v1/v2 hybrid that crun
# refuses), the flags that work are found by trying (container-flags.sh)
# and printed. Exit status 77: no podman and no docker daemon.
set -euo pipefail
cd "$(dirname "$0")/../.."
TAG=localhost/ps:latest BASE="" MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) TAG=${2:?--tag needs a name}; shift 2 ;;
    --base) BASE=${2:?--base needs an image}; shift 2 ;;
    -h|--help) sed -n '2,/^set /{/^set /d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "build-image.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
. deploy/container/container-flags.sh
t0=$SECONDS
if [ -z "$BASE" ]; then
  BASE=localhost/ps-debian:bookworm
  if ! $ENGINE image exists "$BASE" 2> /dev/null; then
    command -v debootstrap > /dev/null ||
      { echo "build-image.sh: debootstrap not found (apt-get install debootstrap), or give --base IMAGE" >&2; exit 1; }
    root=build/image/rootfs
    if [ ! -x "$root/usr/bin/apt-get" ]; then
      rm -rf "$root"; mkdir -p build/image
      echo "build-image.sh: debootstrap bookworm into $root from $MIRROR" >&2
      debootstrap --variant=minbase bookworm "$root" "$MIRROR" > build/image/debootstrap.log 2>&1 ||
        { tail -n 20 build/image/debootstrap.log >&2; echo "build-image.sh: debootstrap failed" >&2; exit 1; }
    fi
    # the stable updates and security fixes too, from the same mirror host
    cat > "$root/etc/apt/sources.list" <<SRC
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb ${MIRROR%/debian}/debian-security bookworm-security main
SRC
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -c . | $ENGINE import - "$BASE" > /dev/null
    echo "build-image.sh: base image $BASE imported ($((SECONDS - t0)) s)" >&2
  fi
fi
probe_flags "$BASE" || exit 1
echo "build-image.sh: $ENGINE build ${BUILD_FLAGS[*]} -t $TAG (base $BASE)" >&2
$ENGINE build "${BUILD_FLAGS[@]}" --build-arg BASE="$BASE" -f deploy/container/Containerfile -t "$TAG" .
echo "build-image.sh: $TAG built in $((SECONDS - t0)) s" >&2
