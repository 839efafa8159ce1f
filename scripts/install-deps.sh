#!/usr/bin/env bash
# Installs the Debian packages the build, the tests and the demo need.
# Idempotent: prints nothing and exits 0 when every package is already present.
set -euo pipefail

PKGS=(
  build-essential pkg-config
  libuv1-dev
  libprotobuf-c-dev protobuf-c-compiler
  liblz4-dev
  libyaml-dev
  check
  zlib1g-dev
  libopenblas-dev libdnnl-dev
  libsodium-dev libssl-dev
  libibverbs-dev librdmacm-dev
  libmicrohttpd-dev
  dataset-fashion-mnist
  iproute2 nftables
  openssh-server openssh-client procps
  # tests/it_slurm.sh runs its own daemons with its own slurm.conf and key;
  # under systemd Debian enables munge, and slurmd/slurmctld only start
  # once /etc/slurm/slurm.conf exists
  slurmctld slurmd slurm-client munge
  gnuplot-nox
  clang libclang-rt-14-dev
  valgrind
  python3-dev python3-numpy python3-pytest python3-venv python3-setuptools python3-pip python3-wheel
  python3-yaml
  python3-torch
)
# kubectl (kustomize) for tests/it_k8s_manifests.sh: Debian's, unless one is installed
command -v kubectl > /dev/null || PKGS+=(kubernetes-client)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done" >&2
