#!/usr/bin/env bash
# gpu-check.sh - the first minutes on a lent GPU machine (`make gpu-check`):
# build, prove the CUDA backend right, time it against PyTorch, one summary.
#
#   scripts/gpu-check.sh [--bundle DIR] [--steps N] [--batch B] [--tf32 off|conv|all]
#                        [--budget S] [--jobs N] [--require-gpu] [--asan] [--system]
#
# The GPU machines have the CUDA toolkit, cuDNN and PyTorch but no network and
# none of our -dev packages: scripts/gpu-bundle.sh downloads those here, the
# device tool carries them (docs/gpu.md). In order, each step recorded as
# PASS, FAIL or SKIP (with the reason); a failed step does not stop the
# steps that do not need it:
#   unpack   the bundle's .deb files into build/gpu-prefix (dpkg-deb -x, never
#            into /), .pc files pointed at it; pkg-config, CPATH, LIBRARY_PATH
#            and an rpath make the build take its headers and libraries there
#   cudnn    where cuDNN (and cuBLAS) are: the toolkit, /usr, or the pip
#            wheels of the python3 that has torch (linked into build/gpu-prefix)
#   build    make -k -jN all, check_compute_cuda, it_train, it_ctr, bench_train
#   check_compute_cuda, it_train_cuda, it_ctr_cuda (PS_TEST_DEVICE=cuda: the
#            mlp and cnn, then the ctr preset's embedding bags, on the GPU)
#   timing   one worker + one shard on this machine (scripts/ps-local.sh),
#            cnn and mlp, batch B, 2 epochs of N steps (the first warms up, the
#            second is timed), against PyTorch eager on the same GPU
#            (scripts/bench-torch.py --device cuda: same model, batch, SGD and
#            TF32 setting, N timed steps after 30 warm-up ones); and
#            bench_train (our forward+backward alone, no shard)
#   memcheck_check_compute_cuda, memcheck_it_train: the same tests under
#            compute-sanitizer --tool memcheck (SKIP when it refuses the device)
#   pytorch  the PyTorch path (ps.torch) with this machine's torch: the ps
#            package built for $PY (or the abi3 build carried in build/pyvenv
#            when $PY cannot build extensions), python/tests/test_torch.py's
#            equivalence, local-mode, SSP and misuse cases when $PY has pytest,
#            then the ResNet example on the GPU through 2 shards against DDP
#            (NCCL) on the same GPU (python/bench/bench_torch.py --model resnet)
#   asan     (--asan) the plug-in and check_compute_cuda built with
#            SANITIZE=address,undefined (bin/ and lib/ stay that variant)
# Writes build/gpu-check/summary.txt and summary.json (and copies them, with
# logs.tar.gz, to $OUT when set); exits 1 when a step failed.
# Without a GPU (this machine) the CUDA steps SKIP and the timing runs on the
# CPU (50 steps, PyTorch with as many threads as our worker's BLAS).
#   --bundle DIR   the .deb folder (default gpu-bundle/); absent: the system's packages
#   --system       use the system's packages even when the bundle is there
#   --steps N      timed steps per model on the GPU (default 300)
#   --batch B      batch of both models (default 64)
#   --tf32 MODE    train.tf32 and PyTorch's allow_tf32 flags (default conv)
#   --budget S     seconds for the whole check (default 540); a step that would
#                  start too late is SKIPped
#   --jobs N       make -j (default: the number of CPUs)
#   --require-gpu  no usable GPU is a failure, not a SKIP
#   --asan         add the sanitizer build of check_compute_cuda (about 2 min)
#   --only LIST    of the steps after build, run only these (comma-separated:
#                  cuda_tests, timing, pytorch, memcheck); the rest SKIP
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here" || exit 2

BUNDLE=$here/gpu-bundle STEPS=300 BATCH=64 TF32=conv BUDGET=540 JOBS=$(nproc)
REQUIRE_GPU=0 ASAN=0 SYSTEM=0 CPU_STEPS=50 ONLY=""
usage() { sed -n '2,51p' "$0" | sed 's/^# \{0,1\}//'; }
need() { [ "$2" -ge 2 ] || { echo "gpu-check.sh: $1 needs a value" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) need "$1" $#; BUNDLE=$2; shift 2 ;;
    --steps) need "$1" $#; STEPS=$2; shift 2 ;;
    --batch) need "$1" $#; BATCH=$2; shift 2 ;;
    --tf32) need "$1" $#; TF32=$2; shift 2 ;;
    --budget) need "$1" $#; BUDGET=$2; shift 2 ;;
    --jobs) need "$1" $#; JOBS=$2; shift 2 ;;
    --require-gpu) REQUIRE_GPU=1; shift ;;
    --asan) ASAN=1; shift ;;
    --system) SYSTEM=1; shift ;;
    --only) need "$1" $#; ONLY=",$2,"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu-check.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
case "$TF32" in off|conv|all) ;; *) echo "gpu-check.sh: --tf32: off, conv or all" >&2; exit 2 ;; esac
for v in STEPS BATCH BUDGET JOBS; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "gpu-check.sh: --${v,,}: expected a positive integer" >&2; exit 2; }
done

W=$here/build/gpu-check
P=$here/build/gpu-prefix
LIB=$P/usr/lib/x86_64-linux-gnu
mkdir -p "$W" || exit 2
rm -f "$W"/*.log "$W"/steps.tsv "$W"/timing.jsonl "$W"/summary.*
: >"$W/steps.tsv"
: >"$W/timing.jsonl"
T0=$SECONDS
export PS_SECRET_FILE=$W/ps.secret
[ -e "$PS_SECRET_FILE" ] || scripts/ps-keygen "$PS_SECRET_FILE" 2>/dev/null

say() { echo "gpu-check: $*" >&2; }
# record STEP STATUS SECONDS DETAIL: one row of the summary
record() {
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$(printf '%s' "$4" | tr '\t\n' '  ')" >>"$W/steps.tsv"
  say "$2 $1 ($3 s): $4"
}
left() { echo $((BUDGET - (SECONDS - T0))); }
# limit WANT: a step's timeout, at most what the budget leaves (less 20 s
# for the summary); 0 when too little is left to start it
limit() {
  local l=$(($(left) - 20))
  [ "$l" -ge 15 ] || { echo 0; return; }
  [ "$1" -lt "$l" ] && echo "$1" || echo "$l"
}
tail_of() { tail -n "${2:-15}" "$1" 2>/dev/null | cut -c1-200; }
# want STEP: 0 when STEP runs (no --only, or --only names it)
want() { [ -z "$ONLY" ] || [[ $ONLY == *",$1,"* ]]; }

# A python3 with torch: $PYTHON, the PATH's, the GPU image's venv, Debian's.
PY=""
for c in ${PYTHON:-} python3 /opt/torch/.venv/bin/python3 /usr/bin/python3; do
  if command -v "$c" >/dev/null && "$c" -c 'import torch' 2>/dev/null; then PY=$(command -v "$c"); break; fi
done
# Any python3 for this script's own JSON (the summary).
HPY=${PY:-$(command -v python3 || echo /usr/bin/python3)}

# ---- machine -------------------------------------------------------------
{
  echo "date $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD 2>/dev/null || echo ' (+ uncommitted changes)')"
  # shellcheck source=/dev/null
  echo "host $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"), $(uname -r), glibc $(getconf GNU_LIBC_VERSION 2>/dev/null | cut -d' ' -f2), $(nproc) CPUs"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi -L 2>&1 | sed 's/^/gpu /'
    echo "driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1 | head -1)"
  else
    echo "gpu none (no nvidia-smi)"
  fi
  NVCC=$(command -v nvcc || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; })
  echo "nvcc ${NVCC:-none}${NVCC:+ $("$NVCC" --version | grep -o 'release [0-9.]*, V[0-9.]*')}"
  if [ -n "$PY" ]; then
    echo "torch $PY: $("$PY" -c 'import torch as t; c=t.cuda.is_available(); print(t.__version__, "cuda", t.version.cuda, "cudnn", t.backends.cudnn.version() if c else None, "gpu", t.cuda.get_device_name(0) if c else None)' 2>&1 | tail -1)"
  else
    echo "torch none (no python3 imports torch)"
  fi
  command -v compute-sanitizer >/dev/null || [ -x /usr/local/cuda/bin/compute-sanitizer ] &&
    echo "compute-sanitizer $(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
} >"$W/machine.txt" 2>&1
NVCC=$(command -v nvcc || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; })
if [ -n "$NVCC" ]; then
  case ":$PATH:" in *":${NVCC%/nvcc}:"*) ;; *) PATH=$PATH:${NVCC%/nvcc} ;; esac
fi
SANITIZER=$(command -v compute-sanitizer || { [ -x /usr/local/cuda/bin/compute-sanitizer ] && echo /usr/local/cuda/bin/compute-sanitizer; })
GPU=0
nvidia-smi -L 2>/dev/null | grep -q '^GPU ' && GPU=1
cat "$W/machine.txt" >&2
if [ $GPU -eq 0 ]; then
  if [ $REQUIRE_GPU -eq 1 ]; then
    record gpu FAIL 0 "no GPU: nvidia-smi -L lists none (--require-gpu)"
  else
    record gpu SKIP 0 "no GPU: nvidia-smi -L lists none; the CUDA steps skip, timing on the CPU"
  fi
fi

# ---- unpack --------------------------------------------------------------
PKGS="libuv libprotobuf-c yaml-0.1 liblz4 check zlib libmicrohttpd libsodium libcrypto libibverbs librdmacm"
DATA=/usr/share/datasets/fashion-mnist
t=$SECONDS
shopt -s nullglob
debs=("$BUNDLE"/*.deb)
shopt -u nullglob
if [ $SYSTEM -eq 1 ] || [ ${#debs[@]} -eq 0 ]; then
  why="--system"
  [ $SYSTEM -eq 1 ] || why="no bundle in $BUNDLE (scripts/gpu-bundle.sh)"
  # shellcheck disable=SC2086
  if pkg-config --exists $PKGS 2>/dev/null; then
    record unpack SKIP 0 "$why; the system's packages have every module the build needs"
  else
    # shellcheck disable=SC2086
    record unpack FAIL 0 "$why, and the system lacks: $(for m in $PKGS; do pkg-config --exists "$m" 2>/dev/null || printf '%s ' "$m"; done)"
  fi
else
  (
    set -e
    rm -rf "$P"
    mkdir -p "$P/bin"
    for d in "${debs[@]}"; do
      if command -v dpkg-deb >/dev/null; then
        dpkg-deb -x "$d" "$P"
      else # ar p member names vary in compression: let tar detect it
        m=$(ar t "$d" | grep '^data\.tar')
        ar p "$d" "$m" | tar -x -a -f - -C "$P" 2>/dev/null || ar p "$d" "$m" | tar -xJ -C "$P"
      fi
      echo "unpacked $(basename "$d")"
    done
    # Debian's alternatives (no maintainer scripts ran): OpenBLAS's pthread
    # build as libopenblas/libblas and its headers as cblas.h.
    ob=$LIB/openblas-pthread
    if [ -d "$ob" ]; then
      for f in libopenblas.so libopenblas.so.0 libblas.so libblas.so.3; do
        [ -e "$ob/$f" ] && ln -sfn "openblas-pthread/$f" "$LIB/$f"
      done
      for h in cblas.h f77blas.h openblas_config.h; do
        [ -e "$P/usr/include/x86_64-linux-gnu/openblas-pthread/$h" ] &&
          ln -sfn "openblas-pthread/$h" "$P/usr/include/x86_64-linux-gnu/$h"
      done
    fi
    # .pc files: /usr -> the prefix; Requires.private (static links only) out
    find "$P" -name '*.pc' -path '*pkgconfig*' -print0 | xargs -0 -r sed -i \
      -e "s|^\\([A-Za-z_]*\\)=/usr\\([/ ]\\|\$\\)|\\1=$P/usr\\2|" -e '/^Requires\.private:/d'
    # tools run from the prefix find their libraries through a wrapper
    # shellcheck disable=SC2016 # $LD_LIBRARY_PATH and $@ are the wrapper's
    wrap() { printf '#!/bin/sh\nLD_LIBRARY_PATH=%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec %s "$@"\n' \
               "$LIB" "$2" >"$P/bin/$1"; chmod +x "$P/bin/$1"; }
    [ -x "$P/usr/bin/protoc-c" ] && wrap protoc-c "$P/usr/bin/protoc-c"
    command -v pkg-config >/dev/null || wrap pkg-config "$P/usr/bin/pkgconf"
    command -v make >/dev/null || wrap make "$P/usr/bin/make"
    # absolute links (zlib1g-dev's libz.so -> /lib/.../libz.so.1.2.13) point
    # at the host's files: into the prefix, where the bundle has the target
    find "$P" -type l -lname '/*' -print0 | while IFS= read -r -d '' l; do
      t=$(readlink "$l")
      if [ -e "$P$t" ]; then ln -sfn "$P$t" "$l"
      elif [ -e "$P/usr$t" ]; then ln -sfn "$P/usr$t" "$l"; fi
    done
    dangling=$(find "$P/usr" -xtype l -name '*.so*' | sed "s|^$P||")
    [ -z "$dangling" ] || echo "dangling links: $dangling"
  ) >"$W/unpack.log" 2>&1
  rc=$?
  utail=$(tail_of "$W/unpack.log" 3)
  export PATH=$P/bin:$PATH
  export PKG_CONFIG_LIBDIR=$LIB/pkgconfig:$P/usr/lib/pkgconfig:$P/usr/share/pkgconfig
  unset PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR
  export CPATH=$P/usr/include:$P/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}
  export LIBRARY_PATH=$LIB${LIBRARY_PATH:+:$LIBRARY_PATH}
  # DT_RPATH, not RUNPATH: it also serves the libraries' own dependencies
  # (libopenblas.so.0 needs the prefix's libgfortran.so.5)
  export LDFLAGS="-Wl,--disable-new-dtags -Wl,-rpath,$LIB${LDFLAGS:+ $LDFLAGS}"
  [ -d "$P$DATA" ] && DATA=$P$DATA
  # shellcheck disable=SC2086
  flags=$(pkg-config --cflags --libs $PKGS 2>>"$W/unpack.log")
  echo "pkg-config --cflags --libs: $flags" >>"$W/unpack.log"
  outside=$(tr ' ' '\n' <<<"$flags" | grep -E '^-[IL]' | grep -v "^-[IL]$P/" | tr '\n' ' ')
  if [ $rc -ne 0 ]; then
    record unpack FAIL $((SECONDS - t)) "unpacking failed: $utail"
  elif [ -z "$flags" ]; then
    record unpack FAIL $((SECONDS - t)) "pkg-config resolves none of the build's modules in $P: $(tail_of "$W/unpack.log" 3)"
  elif [ -n "$outside" ] || grep -q '^dangling' "$W/unpack.log"; then
    record unpack FAIL $((SECONDS - t)) "paths outside the prefix: $outside $(grep '^dangling' "$W/unpack.log")"
  else
    record unpack PASS $((SECONDS - t)) "${#debs[@]} packages into ${P#"$here"/}; pkg-config's -I/-L all inside it; data $DATA"
  fi
fi

# ---- cuDNN and cuBLAS ----------------------------------------------------
# wheel_dir MODULE: the folder of a pip wheel's nvidia.MODULE (a namespace
# package: __path__, not __file__)
wheel_dir() {
  [ -n "$PY" ] && "$PY" -c "import nvidia.$1 as m, os; print(list(m.__path__)[0])" 2>/dev/null
}
# link_libs SRC DST SONAME: every file of SRC/lib linked into DST/lib, plus
# the unversioned SONAME.so the linker looks for; DST/include -> SRC/include
link_libs() {
  mkdir -p "$2/lib" && ln -sfn "$1/include" "$2/include"
  local f
  for f in "$1"/lib/*; do ln -sfn "$f" "$2/lib/$(basename "$f")"; done
  if [ ! -e "$2/lib/$3.so" ]; then
    f=$(find "$1/lib" -maxdepth 1 -name "$3.so.*" | sort | head -1)
    [ -n "$f" ] && ln -sfn "$f" "$2/lib/$3.so"
  fi
}
t=$SECONDS
CUDA_HOME=${CUDA_HOME:-${NVCC:+$(dirname "$(dirname "$NVCC")")}}
CUDNN_HOME=${CUDNN_HOME:-}
cudnn_where="" cublas_where=""
if [ -z "$NVCC" ]; then
  record cudnn SKIP 0 "no nvcc: the CUDA plug-in is not built"
else
  if [ -n "$CUDNN_HOME" ]; then
    cudnn_where="CUDNN_HOME=$CUDNN_HOME (given)"
  else
    # where kernels/cuda.mk looks, in its order
    for d in "$CUDA_HOME/lib64" "$CUDA_HOME/lib" /usr/lib/x86_64-linux-gnu /usr/local/lib; do
      if [ -e "$d/libcudnn.so" ] || [ -e "$d/libcudnn.so.9" ]; then cudnn_where=$d; break; fi
    done
    if [ -z "$cudnn_where" ] && w=$(wheel_dir cudnn) && [ -d "$w/lib" ]; then
      link_libs "$w" "$P/cudnn" libcudnn
      CUDNN_HOME=$P/cudnn
      cudnn_where="pip wheel $w (linked into ${P#"$here"/}/cudnn)"
    fi
  fi
  if [ -e "$CUDA_HOME/lib64/libcublas.so" ] || [ -e /usr/lib/x86_64-linux-gnu/libcublas.so ]; then
    cublas_where=toolkit
  elif w=$(wheel_dir cublas) && [ -d "$w/lib" ]; then
    link_libs "$w" "$P/cublas" libcublas
    ln -sfn "$(find "$w/lib" -maxdepth 1 -name 'libcublasLt.so.*' | sort | head -1)" "$P/cublas/lib/libcublasLt.so"
    export LIBRARY_PATH=$P/cublas/lib${LIBRARY_PATH:+:$LIBRARY_PATH}
    export CPATH=$P/cublas/include${CPATH:+:$CPATH}
    export LDFLAGS="-Wl,-rpath,$P/cublas/lib${LDFLAGS:+ $LDFLAGS}"
    cublas_where="pip wheel $w"
  fi
  hdr=""
  for d in ${CUDNN_HOME:+"$CUDNN_HOME/include"} "$CUDA_HOME/include" /usr/include /usr/include/x86_64-linux-gnu; do
    [ -e "$d/cudnn_version.h" ] && { hdr=$d/cudnn_version.h; break; }
  done
  ver=""
  [ -n "$hdr" ] && ver=$(awk '/#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) / { v = v (v == "" ? "" : ".") $3 } END { print v }' "$hdr")
  echo "cudnn ${ver:-?} ($cudnn_where); cublas: ${cublas_where:-not found}" >>"$W/machine.txt"
  if [ -z "$cudnn_where" ]; then
    record cudnn FAIL $((SECONDS - t)) "cuDNN not found (\$CUDA_HOME/lib64 or lib, /usr/lib/x86_64-linux-gnu, /usr/local/lib, pip wheel nvidia-cudnn-cu13 of ${PY:-no python}): set CUDNN_HOME"
  elif [ -z "$cublas_where" ]; then
    record cudnn FAIL $((SECONDS - t)) "cuDNN $ver in $cudnn_where, but no libcublas.so (toolkit or pip wheel)"
  else
    record cudnn PASS $((SECONDS - t)) "cuDNN ${ver:-?}: $cudnn_where; cuBLAS: $cublas_where"
  fi
fi
export CUDA_HOME
[ -n "$CUDNN_HOME" ] && export CUDNN_HOME

# ---- build ---------------------------------------------------------------
T_CC=build/rel/tests/check_compute_cuda
T_IT=build/rel/tests/it_train
T_CTR=build/rel/tests/it_ctr
T_BT=build/rel/tests/bench_train
PLUGIN=lib/ps-compute-cuda.so
t=$SECONDS
l=$(limit 300)
if [ "$l" -eq 0 ]; then
  record build SKIP 0 "no time left (--budget $BUDGET)"
else
  timeout "$l" make -k -j"$JOBS" all "$T_CC" "$T_IT" "$T_CTR" "$T_BT" >"$W/build.log" 2>&1
  rc=$?
  miss=""
  for f in bin/ps-server bin/ps-worker bin/ps-ctrgen "$T_CC" "$T_IT" "$T_CTR" "$T_BT"; do [ -x "$f" ] || miss="$miss $f"; done
  plug="$PLUGIN built"
  if [ ! -e "$PLUGIN" ]; then # cuda.mk says why in one line, when it does
    plug=$(grep -v '^\(cc\|gcc\|nvcc\|/\)' "$W/build.log" | grep -i -m1 'cuda\|cudnn' | cut -c1-160)
    plug="no $PLUGIN${plug:+: $plug}"
  fi
  if [ $rc -eq 0 ] && [ -z "$miss" ]; then
    record build PASS $((SECONDS - t)) "make -j$JOBS; $plug"
  else
    record build FAIL $((SECONDS - t)) "make exit $rc${miss:+; missing:$miss}; $plug; $(grep -m3 -E 'error|Error' "$W/build.log" | cut -c1-200 | tr '\n' ' ')"
  fi
fi
CUDA_OK=$GPU
[ -n "$NVCC" ] || CUDA_OK=0

# run_test STEP TIMEOUT BINARY [WRAPPER...]: runs a Check test and records it
# as run-tests.sh reads it (all cases skipped, or exit 77: SKIP)
run_test() {
  local step=$1 want=$2 bin=$3 l rc log=$W/$1.log t=$SECONDS; shift 3
  l=$(limit "$want")
  [ "$l" -eq 0 ] && { record "$step" SKIP 0 "no time left (--budget $BUDGET)"; return; }
  [ -x "$bin" ] || { record "$step" FAIL 0 "$bin was not built"; return; }
  timeout -k 5 "$l" "$@" "$bin" >"$log" 2>&1
  rc=$?
  local counts skipline summary
  counts=$(grep -hE '^tu: [0-9]+ cases, [0-9]+ skipped$' "$log" | tail -1)
  skipline=$(grep -m1 '^SKIP' "$log" | cut -c1-200)
  summary=$(grep -hE '^[0-9]+%: Checks' "$log" | tail -1)
  if { [ $rc -eq 124 ] || [ $rc -eq 137 ]; } && [ "$l" -lt "$want" ]; then
    record "$step" SKIP $((SECONDS - t)) "cut off by the budget after ${l}s (its own limit: ${want}s; raise --budget): $(tail_of "$log" 4)"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    record "$step" FAIL $((SECONDS - t)) "timed out after ${l}s: $(tail_of "$log" 12)"
  elif [ $rc -eq 77 ] || { [ $rc -eq 0 ] && [ -n "$counts" ] &&
        [ "$(awk '{ print ($4 >= $2) }' <<<"$counts")" = 1 ]; }; then
    record "$step" SKIP $((SECONDS - t)) "${counts:-exit 77}: ${skipline:-no reason printed}"
  elif [ $rc -eq 0 ]; then
    record "$step" PASS $((SECONDS - t)) "$summary${counts:+ ($counts)}"
  else
    record "$step" FAIL $((SECONDS - t)) "exit $rc: $summary :: $(tail_of "$log" 25)"
  fi
}

# ---- the CUDA tests ------------------------------------------------------
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}protect_shadow_gap=0
# test programs live under build/, not beside lib/ as bin/ps-worker does:
# where the plug-in is (as scripts/run-tests.sh says it)
export PS_COMPUTE_PLUGIN_DIR=${PS_COMPUTE_PLUGIN_DIR:-$here/lib}
if ! want cuda_tests; then
  record check_compute_cuda SKIP 0 "not in --only"
elif run_test check_compute_cuda 180 "$T_CC" env PS_CUDA_PLANS=1; [ $GPU -eq 1 ]; then
  run_test it_train_cuda 180 "$T_IT" env PS_TEST_DEVICE=cuda PS_TEST_DATA="$DATA"
  run_test it_ctr_cuda 180 "$T_CTR" env PS_TEST_DEVICE=cuda
else
  record it_train_cuda SKIP 0 "no GPU (it_train with PS_TEST_DEVICE=cuda needs one)"
  record it_ctr_cuda SKIP 0 "no GPU (it_ctr with PS_TEST_DEVICE=cuda needs one)"
fi

# ---- timing --------------------------------------------------------------
if want timing; then
. tests/lib-ports.sh # free_port
DEV=cuda NSTEPS=$STEPS THREADS=$JOBS
if [ $GPU -eq 0 ] || [ $CUDA_OK -eq 0 ]; then DEV=cpu NSTEPS=$CPU_STEPS; fi
# ours MODEL: one shard and one worker on this machine, 2 epochs of NSTEPS
ours() {
  local m=$1 port cfg=$W/$1.yaml tf=1 l t=$SECONDS
  port=$(free_port)
  rm -rf "$W/metrics-$m"
  write_cfg() {
    cat >"$cfg" <<EOF
# written by scripts/gpu-check.sh: one shard, one worker, $m
cluster: {servers: [127.0.0.1:$port], workers: 1}
consistency: {mode: sync}
seed: 42
model: {preset: $m}
train:
  data_dir: $DATA
  batch: $BATCH
  epochs: 2
  limit: $((NSTEPS * BATCH))
  test_limit: 1000
  device: $DEV
$( [ $tf -eq 1 ] && echo "  tf32: $TF32")
  metrics_dir: $W/metrics-$m
optimizer: {name: sgd, lr: 0.01}
log: {level: warn}
EOF
  }
  write_cfg
  if ! bin/ps-server --config "$cfg" --dump-config >/dev/null 2>"$W/config-$m.log"; then
    if grep -q tf32 "$W/config-$m.log"; then tf=0; write_cfg; fi
  fi
  l=$(limit 200)
  [ "$l" -eq 0 ] && { tskip="$tskip ours $m: no time left;"; return 0; }
  : >"$W/timing-$m.log"
  OPENBLAS_NUM_THREADS=$THREADS timeout -k 5 "$l" scripts/ps-local.sh "$cfg" --logs "$W/logs-$m" \
    >>"$W/timing-$m.log" 2>&1 || return 1
  "$HPY" - "$W/metrics-$m/worker-0.jsonl" "$m" "$BATCH" "$NSTEPS" "$tf" "$TF32" $((SECONDS - t)) <<'EOF' >>"$W/timing.jsonl"
import json, sys
path, m, batch, steps, tf, mode, wall = sys.argv[1:]
rows = [json.loads(l) for l in open(path) if l.strip()]
cold, warm = rows[0], rows[-1]
b = int(batch)
print(json.dumps({"impl": "ours", "model": m, "batch": b, "steps": warm["steps"],
                  "device": warm["device"], "samples_per_s": warm["samples_per_s"],
                  "ms_per_step": round(1e3 * b / warm["samples_per_s"], 3),
                  "cold_samples_per_s": cold["samples_per_s"],
                  "tf32": mode if tf == "1" else "default (train.tf32 unknown to this build)",
                  "test_accuracy": warm.get("test_accuracy"), "wall_s": int(wall)}))
EOF
}
t=$SECONDS
terr="" tskip=""
if [ "$(limit 60)" -eq 0 ]; then
  tskip="no time left (--budget $BUDGET)"
elif [ ! -x bin/ps-worker ] || [ ! -x bin/ps-server ]; then
  terr="bin/ps-worker or bin/ps-server not built; "
else
  for m in cnn mlp; do
    ours "$m" || terr="$terr ours $m failed: $(tail_of "$W/timing-$m.log" 6);"
  done
fi
if [ -n "$tskip" ]; then
  :
elif [ -z "$PY" ]; then
  terr="$terr no python3 with torch;"
elif [ "$(limit 150)" -eq 0 ]; then
  tskip="$tskip PyTorch: no time left;"
else
  l=$(limit 150)
  warm=30
  [ $DEV = cpu ] && warm=5
  targs=(--device "$DEV" --steps "$NSTEPS" --warmup "$warm" --batch "$BATCH" --threads "$THREADS"
         --data "$DATA" --models cnn mlp)
  [ $DEV = cuda ] && targs+=(--tf32 "$TF32")
  if timeout -k 5 "$l" "$PY" scripts/bench-torch.py "${targs[@]}" >"$W/torch.jsonl" 2>"$W/torch.log"; then
    cat "$W/torch.jsonl" >>"$W/timing.jsonl"
    # cuDNN's own algorithm search, for reference (not PyTorch's default)
    [ $DEV = cuda ] && timeout -k 5 60 "$PY" scripts/bench-torch.py "${targs[@]}" --models cnn \
      --cudnn-benchmark 2>>"$W/torch.log" | sed 's/"impl": "pytorch"/"impl": "pytorch-cudnn-benchmark"/' >>"$W/timing.jsonl"
  else
    terr="$terr PyTorch failed: $(tail_of "$W/torch.log" 4);"
  fi
fi
if [ -x "$T_BT" ] && [ "$(limit 40)" -gt 0 ]; then
  OPENBLAS_NUM_THREADS=$THREADS timeout -k 5 "$(limit 40)" "$T_BT" --seconds 2 --batch "$BATCH" --backend cpu --backend cuda --json \
    >"$W/bench_train.log" 2>&1
  grep '^{' "$W/bench_train.log" | "$HPY" -c '
import json, sys
for l in sys.stdin:
    d = json.loads(l); d["impl"] = "ours-compute"; d["device"] = d.pop("backend"); print(json.dumps(d))' >>"$W/timing.jsonl"
fi
if [ -z "$terr" ] && [ ! -s "$W/timing.jsonl" ]; then
  record timing SKIP $((SECONDS - t)) "$tskip"
elif [ -z "$terr" ]; then
  record timing PASS $((SECONDS - t)) "device $DEV, batch $BATCH, $NSTEPS timed steps per model${tskip:+; $tskip}"
else
  record timing FAIL $((SECONDS - t)) "$terr"
fi
else
  record timing SKIP 0 "not in --only"
fi

# ---- the PyTorch path ----------------------------------------------------
pytorch_step() {
  local t=$SECONDS l pyd=$W/py how carried
  if [ -z "$PY" ]; then record pytorch SKIP 0 "no python3 with torch"; return; fi
  if [ $GPU -eq 0 ]; then record pytorch SKIP 0 "no GPU (make bench-pytorch measures the CPU)"; return; fi
  if [ ! -e lib/libps.so.1 ] || [ ! -x bin/ps-server ]; then
    record pytorch FAIL 0 "lib/libps.so.1 or bin/ps-server not built"; return
  fi
  l=$(limit 300)
  [ "$l" -eq 0 ] && { record pytorch SKIP 0 "no time left (--budget $BUDGET)"; return; }
  rm -rf "$pyd"
  # the package for $PY: built here when it can build extensions (Python.h,
  # setuptools), else the stable-ABI build carried from the Debian machine
  if "$PY" -m pip install -q --no-build-isolation --no-index --no-deps --target "$pyd" ./python \
      >"$W/pytorch-install.log" 2>&1; then
    how="built for $("$PY" -V 2>&1)"
  elif carried=$(ls -d build/pyvenv/lib/python3*/site-packages/ps 2>/dev/null | head -1) &&
       [ -n "$carried" ]; then
    mkdir -p "$pyd" && cp -r "$carried" "$pyd/" && how="the abi3 build carried in ${carried%/ps}"
  else
    record pytorch FAIL $((SECONDS - t)) "the ps package neither builds for $PY ($(tail_of "$W/pytorch-install.log" 2)) nor was carried (build/pyvenv)"
    return
  fi
  local tests="no pytest for $PY: the tests did not run" figures rc
  if "$PY" -c 'import pytest' 2>/dev/null; then
    PYTHONPATH=$pyd LD_LIBRARY_PATH=$here/lib:$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
      timeout -k 5 "$(limit 120)" "$PY" -m pytest -q -p no:cacheprovider python/tests/test_torch.py \
      -k "equivalent or local_mode or ssp or misuse" >"$W/pytorch-tests.log" 2>&1
    rc=$?
    tests="test_torch: $(grep -E '[0-9]+ (passed|failed)' "$W/pytorch-tests.log" | tail -1)"
    [ $rc -eq 0 ] || { record pytorch FAIL $((SECONDS - t)) "$how; $tests: $(tail_of "$W/pytorch-tests.log" 6)"; return; }
  fi
  PS_DATA_DIR=$DATA PYTHONPATH=$pyd LD_LIBRARY_PATH=$here/lib:$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
    timeout -k 5 "$(limit 240)" "$PY" python/bench/bench_torch.py --model resnet --device cuda \
    --workers 1 --limit 20000 --json "$W/pytorch.json" >"$W/pytorch.log" 2>&1
  rc=$?
  figures=$(grep -E 'samples/s per worker|ps / ddp' "$W/pytorch.log" | tr -s ' ' | tr '\n' ';')
  if [ $rc -eq 0 ]; then
    record pytorch PASS $((SECONDS - t)) "$how; torch $("$PY" -c 'import torch; print(torch.__version__)'); $tests; resnet on cuda, 1 worker, 20000 samples: $figures"
  else
    record pytorch FAIL $((SECONDS - t)) "$how; $tests; bench_torch exit $rc: $(tail_of "$W/pytorch.log" 8)"
  fi
}
if want pytorch; then pytorch_step; else record pytorch SKIP 0 "not in --only"; fi

# ---- compute-sanitizer ---------------------------------------------------
MC=()
[ -n "$SANITIZER" ] && MC=("$SANITIZER" --tool memcheck --error-exitcode 99 --target-processes all)
sanitize() { # STEP TIMEOUT BINARY [ENV...]
  local step=$1 want=$2 bin=$3; shift 3
  if [ ${#MC[@]} -eq 0 ]; then record "$step" SKIP 0 "no compute-sanitizer"; return; fi
  if [ $GPU -eq 0 ]; then record "$step" SKIP 0 "no GPU"; return; fi
  if [ $CUDA_OK -eq 0 ]; then record "$step" SKIP 0 "the CUDA backend was not built"; return; fi
  run_test "$step" "$want" "$bin" env "$@" "${MC[@]}"
  if grep -qiE 'device not supported|not supported on this|unable to (init|create)' "$W/$step.log" &&
     ! grep -q '^[0-9]*%: Checks' "$W/$step.log"; then # refused the device: not our bug
    sed -i '$d' "$W/steps.tsv"
    record "$step" SKIP 0 "compute-sanitizer refused the device: $(grep -m1 -iE 'not supported|unable to' "$W/$step.log" | cut -c1-160)"
  fi
}
if want memcheck; then
  sanitize memcheck_check_compute_cuda 240 "$T_CC" PS_TEST_DEVICE=cuda
  sanitize memcheck_it_train 240 "$T_IT" PS_TEST_DEVICE=cuda PS_TEST_DATA="$DATA"
fi

if [ $ASAN -eq 1 ]; then
  t=$SECONDS
  l=$(limit 200)
  if [ "$l" -eq 0 ]; then
    record asan SKIP 0 "no time left (--budget $BUDGET)"
  # all: the plug-in too, so that its host code runs under ASan (bin/ and
  # lib/ are the sanitizer variant afterwards)
  elif timeout "$l" make -j"$JOBS" SANITIZE=address,undefined all build/san/tests/check_compute_cuda >"$W/asan-build.log" 2>&1; then
    run_test asan 120 build/san/tests/check_compute_cuda
  else
    record asan FAIL $((SECONDS - t)) "sanitizer build failed: $(tail_of "$W/asan-build.log" 5)"
  fi
fi

# ---- summary -------------------------------------------------------------
"$HPY" - "$W" "$BUDGET" "$((SECONDS - T0))" <<'EOF'
import json, os, sys
w, budget, wall = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
machine = open(os.path.join(w, "machine.txt")).read().splitlines()
steps = []
for line in open(os.path.join(w, "steps.tsv")):
    name, status, secs, detail = line.rstrip("\n").split("\t", 3)
    steps.append({"step": name, "status": status, "seconds": int(secs), "detail": detail})
rows = [json.loads(l) for l in open(os.path.join(w, "timing.jsonl")) if l.strip()]
def get(impl, model):
    return next((r for r in rows if r["impl"] == impl and r["model"] == model), None)
out = ["gpu-check summary (scripts/gpu-check.sh; docs/gpu.md says how to read it)", ""]
out += ["machine:"] + ["  " + l for l in machine] + ["", "steps:"]
for s in steps:
    out.append(f"  {s['status']:4}  {s['step']:28} {s['seconds']:4}s  {s['detail']}")
targets = []
timing = []
dev = next((r["device"] for r in rows if r["impl"] == "ours"), "?")
if rows:
    out += ["", f"timing ({dev}): samples/s and ms per step, batch "
            f"{next(r['batch'] for r in rows)}; ours = 1 worker + 1 shard on this machine "
            "(scripts/ps-local.sh, 2nd epoch; cold = 1st epoch), compute = bench_train "
            "(forward+backward, no shard), pytorch = eager, same model/batch/SGD/TF32",
            f"  {'model':5} {'ours samples/s':>14} {'ms/step':>8} {'cold':>9} {'compute s/s':>11} "
            f"{'ms/step':>8} {'pytorch s/s':>11} {'ms/step':>8} {'ours/pt':>7} {'compute/pt':>10}"]
    for m in ("cnn", "mlp"):
        o, t = get("ours", m), get("pytorch", m)
        c = next((r for r in rows if r["impl"] == "ours-compute" and r["model"] == m
                  and r["device"] == dev), None)
        f = lambda r, k, fmt: format(r[k], fmt) if r and r.get(k) is not None else "-"
        ratio = o["samples_per_s"] / t["samples_per_s"] if o and t else None
        cratio = c["samples_per_s"] / t["samples_per_s"] if c and t else None
        out.append(f"  {m:5} {f(o,'samples_per_s','.0f'):>14} {f(o,'ms_per_step','.3f'):>8} "
                   f"{f(o,'cold_samples_per_s','.0f'):>9} {f(c,'samples_per_s','.0f'):>11} "
                   f"{f(c,'ms_per_step','.3f'):>8} {f(t,'samples_per_s','.0f'):>11} "
                   f"{f(t,'ms_per_step','.3f'):>8} "
                   f"{format(ratio, '.2f') if ratio else '-':>7} {format(cratio, '.2f') if cratio else '-':>10}")
        timing.append({"model": m, "ours": o, "ours_compute": c, "pytorch": t,
                       "ratio_ours_pytorch": ratio, "ratio_compute_pytorch": cratio})
        if dev == "cuda" and m == "cnn":
            targets.append(("cnn step time (compute, no shard) no worse than PyTorch eager",
                            None if not (c and t) else c["ms_per_step"] <= t["ms_per_step"],
                            f"{f(c,'ms_per_step','.3f')} vs {f(t,'ms_per_step','.3f')} ms"))
        if dev == "cuda":
            targets.append((f"{m} samples/s with the shard on this machine >= 0.8x PyTorch single-GPU",
                            None if ratio is None else ratio >= 0.8,
                            f"{format(ratio, '.2f') if ratio else '-'}x"))
    b = get("pytorch-cudnn-benchmark", "cnn")
    if b:
        out.append(f"  (PyTorch cnn with cudnn.benchmark=True: {b['samples_per_s']:.0f} samples/s, "
                   f"{b['ms_per_step']:.3f} ms/step)")
    t = get("pytorch", "cnn")
    if t:
        o = get("ours", "cnn") or {}
        out.append(f"  PyTorch: {t['torch']}, first step {t.get('first_step_ms')} ms, "
                   f"tf32 {t.get('tf32', '-')}, {t['steps']} timed steps; "
                   f"ours: train.tf32 {o.get('tf32', '-')}, test accuracy {o.get('test_accuracy')}")
if targets:
    out += ["", "targets (issue 16):"]
    for name, ok, val in targets:
        out.append(f"  {'MET    ' if ok else 'NOT MET' if ok is False else 'UNKNOWN'}  {name}: {val}")
elif rows:
    out += ["", "targets (issue 16): not measured (no GPU; the CPU timing above only proves the path)"]
failed = [s["step"] for s in steps if s["status"] == "FAIL"]
out += ["", f"result: {'FAIL (' + ', '.join(failed) + ')' if failed else 'PASS'}; "
        f"{wall}s of a {budget}s budget; logs in build/gpu-check/ (logs.tar.gz)"]
open(os.path.join(w, "summary.txt"), "w").write("\n".join(out) + "\n")
json.dump({"machine": machine, "steps": steps, "timing": timing, "rows": rows,
           "targets": [{"target": n, "met": ok, "value": v} for n, ok, v in targets],
           "failed": failed, "wall_s": wall}, open(os.path.join(w, "summary.json"), "w"), indent=1)
print("\n".join(out))
EOF
(cd "$W" && tar -czf logs.tar.gz --exclude=logs.tar.gz ./*.log ./*.txt ./*.yaml ./*.jsonl ./*.tsv \
   metrics-* logs-* 2>/dev/null)
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
  cp "$W/summary.txt" "$W/summary.json" "$W/logs.tar.gz" "$OUT/" 2>/dev/null
fi
! grep -q $'\tFAIL\t' "$W/steps.tsv"
