#!/usr/bin/env bash
# test-image.sh - the container image (build-image.sh) checked by running it.
#
#   deploy/container/test-image.sh [--tag TAG]     (make test-image builds it first)
#
# In the image TAG (default localhost/ps:latest): `ps-server --help`,
# `ps-worker --version` (the CUDA plug-in folder it looks in), the Python
# package imported, and a training run of two shards and two workers with
# ps-local.sh inside one container (no network but its own loopback; the
# config, secret, logs and checkpoints in a host folder mounted at /work;
# Fashion-MNIST the image's, else the host's mounted read-only): both
# workers through their epoch, both shards' checkpoints written. Exit 77
# (skipped, the reason printed) where no engine runs containers here.
set -u
cd "$(dirname "$0")/../.." || exit 1
TAG=localhost/ps:latest
[ "${1:-}" = --tag ] && TAG=${2:?--tag needs a name}
checks=0 fails=0
ok() { checks=$((checks + 1)); }
bad() { checks=$((checks + 1)); fails=$((fails + 1)); echo "FAIL: $*"; }
expect() { local what=$1; shift; if "$@"; then ok; else bad "$what"; fi; }
skip() { echo "SKIP: test-image: $*"; exit 77; }
. deploy/container/container-flags.sh
$ENGINE image exists "$TAG" 2> /dev/null || skip "no image $TAG: run make image first"
probe_flags "$TAG" || skip "$ENGINE cannot run containers here (above)"
run() { $ENGINE run --rm --network none "${RUN_FLAGS[@]}" "$@"; }
# Fashion-MNIST: the image's own (EXTRA_PACKAGES, by default), else the host's mounted
data=/usr/share/datasets/fashion-mnist mount_data=()
if ! run "$TAG" sh -c "ls $data/t10k-labels-idx1-ubyte*" > /dev/null 2>&1; then
  [ -r $data/t10k-labels-idx1-ubyte.gz ] || [ -r $data/t10k-labels-idx1-ubyte ] ||
    skip "Fashion-MNIST is neither in the image nor here (apt-get install dataset-fashion-mnist)"
  mount_data=(-v "$data:$data:ro")
  echo "test-image: the image has no Fashion-MNIST; the host's is mounted"
fi
tmp=$(mktemp -d /tmp/ps-image.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
t0=$SECONDS

out=$(run "$TAG" ps-server --help 2>&1); rc=$?
expect "ps-server --help in the image (status $rc): $out" [ $rc -eq 0 ]
expect "... prints its usage: $out" grep -q "^Usage: ps-server" <<< "$out"
out=$(run "$TAG" ps-worker --version 2>&1); rc=$?
echo "== ps-worker --version: $out"
expect "ps-worker --version (status $rc) names the plug-in folder: $out" \
  grep -q "/usr/local/lib/ps" <<< "$out"
# the loader finds a plug-in put where the image looks (built on a CUDA
# machine; here, when this tree has one, mounted: found, not loaded)
if [ -r lib/ps-compute-cuda.so ]; then
  out=$(run -v "$PWD/lib/ps-compute-cuda.so:/usr/local/lib/ps/ps-compute-cuda.so:ro" "$TAG" ps-worker --version 2>&1)
  expect "a plug-in mounted at /usr/local/lib/ps is found: $out" \
    grep -q "^cuda plug-in: /usr/local/lib/ps/ps-compute-cuda.so" <<< "$out"
fi
out=$(run "$TAG" python3 -c 'import ps; print(ps.__file__)' 2>&1); rc=$?
expect "the Python package imports (status $rc): $out" grep -q "^/usr/local/lib/python3.*/ps/__init__.py$" <<< "$out"

mkdir -p "$tmp/ckpt"
cat > "$tmp/c.yaml" <<YAML
cluster:
  servers: [127.0.0.1:7000, 127.0.0.1:7001]
  workers: 2
model: {preset: mlp}
train: {batch: 32, limit: 1280}
checkpoint: {dir: /work/ckpt}
security: {secret_file: /work/c.secret}
YAML
out=$(timeout 300 $ENGINE run --rm --network none "${RUN_FLAGS[@]}" -v "$tmp:/work" "${mount_data[@]}" \
        -e OPENBLAS_NUM_THREADS=1 "$TAG" ps-local.sh /work/c.yaml --logs /work/logs -- --epochs 1 2>&1)
rc=$?
echo "== ps-local.sh in the image: status $rc"; sed 's/^/   /' <<< "$out" | tail -n 15
expect "ps-local.sh with 2 shards and 2 workers succeeded in the image (status $rc)" [ $rc -eq 0 ]
expect "worker 0 trained and evaluated: $(tail -n 3 "$tmp/logs/worker-0.log" 2>&1)" \
  grep -q "epoch 1: test accuracy" "$tmp/logs/worker-0.log"
expect "worker 1 trained its 20 steps" grep -q "step 20/20" "$tmp/logs/worker-1.log"
expect "both shards wrote their checkpoint" test -s "$tmp/ckpt/shard-0.ckpt" -a -s "$tmp/ckpt/shard-1.ckpt"
expect "nothing of the image's runs is left" [ -z "$($ENGINE ps -q --filter ancestor="$TAG")" ]

echo "test-image: $((SECONDS - t0)) s"
echo "$(( checks ? 100 * (checks - fails) / checks : 0 ))%: Checks: $checks, Failures: $fails, Errors: 0"
[ $fails -eq 0 ]
