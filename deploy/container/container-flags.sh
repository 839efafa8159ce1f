# container-flags.sh - sourced by build-image.sh and test-image.sh: picks
# the engine and the flags its containers run with here.
#
# ENGINE: podman, else docker when its daemon answers (else exit 77 with
# the reason: the callers' "skipped"). probe_flags IMAGE: RUN_FLAGS and
# BUILD_FLAGS, tried in order until `ENGINE run IMAGE true` works:
#   1. none;
#   2. the open-files and process limits set to what this shell has (an
#      engine raises them to its defaults, which a container without
#      CAP_SYS_RESOURCE may not do: "setrlimit RLIMIT_NOFILE: Operation
#      not permitted") and, for podman, the runc runtime where crun
#      refuses a cgroup v1/v2 hybrid ("cgroups in hybrid mode not
#      supported").
# Prints what it settled on; fails with each try's error when none works.
if command -v podman > /dev/null; then
  ENGINE=podman
elif command -v docker > /dev/null && docker info > /dev/null 2>&1; then
  ENGINE=docker
else
  msg="no podman, and no docker daemon ($(docker info 2>&1 | grep -m1 -i 'cannot connect\|not found' || echo 'docker not found'))"
  echo "container: $msg: apt-get install podman (Debian 12)" >&2
  exit 77
fi
RUN_FLAGS=() BUILD_FLAGS=()
probe_flags() {
  local image=$1 nofile nproc err1 err2 limits=()
  err1=$($ENGINE run --rm --network none "$image" true 2>&1) && return 0
  nofile=$(ulimit -Hn) nproc=$(ulimit -Hu)
  [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ] && nproc=32768
  limits=(--ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc")
  if [ $ENGINE = podman ] && command -v runc > /dev/null; then limits+=(--runtime runc); fi
  if err2=$($ENGINE run --rm --network none "${limits[@]}" "$image" true 2>&1); then
    RUN_FLAGS=("${limits[@]}") BUILD_FLAGS=("${limits[@]}")
    echo "container: $ENGINE run fails here without flags (${err1##*Error: }); using ${limits[*]}" >&2
    return 0
  fi
  echo "container: $ENGINE cannot run a container here:" >&2
  echo "  $ENGINE run --rm $image true: $err1" >&2
  echo "  $ENGINE run --rm ${limits[*]} $image true: $err2" >&2
  [ $ENGINE = podman ] && ! command -v runc > /dev/null && echo "  (runc, which may work where crun does not, is not installed: apt-get install runc)" >&2
  return 1
}
