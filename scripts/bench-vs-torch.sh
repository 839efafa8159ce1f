#!/usr/bin/env bash
# bench-vs-torch.sh - our training speed against PyTorch's, measured in one run.
#
#   scripts/bench-vs-torch.sh [--seconds S] [--rounds R] [--limit N] [--models "mlp cnn"] [--keep DIR]
#
# Each round runs, alternating ours and PyTorch's so that load on the machine
# hits both alike, for each model (mlp, cnn; batch 64):
#   1. one process, one thread, no servers: build/rel/tests/bench_train
#      --backend cpu --threads 1 (oneDNN) against scripts/bench-torch.py
#      --threads 1 (SGD step included on PyTorch's side; ours has no
#      optimizer: the shards run it), --seconds S each;
#   2. the same with one thread per core (--threads $(nproc)) on both;
#   3. 2 shards + 2 workers (scripts/ps-local.sh, a copy of conf/local.yaml
#      on free ports, CPU, momentum 0.9 lr 0.01, train.threads auto: the
#      cores shared by the two workers) against PyTorch
#      DistributedDataParallel, gloo, 2 processes of 1 thread, the same
#      optimizer, initialization and input normalization (bench-torch.py
#      --init ours --normalize): one whole
#      epoch of Fashion-MNIST each (--limit 0, the
#      default), samples/s over the epoch summed over the processes, and the
#      test accuracy after it; round r seeds ours with 41+r and PyTorch
#      with r-1 (initial weights and shuffle), so the rounds compare the
#      spread of seeds on both sides, not one seed against one. --limit N
#      trains ours on N images only and times PyTorch for S seconds (speed
#      only, no accuracy).
# Then prints every measurement, the mean per row and the ratio ours/torch,
# and for 3. both test accuracies and the difference of their means in
# points.
# Defaults: S=5, R=1, N=0. Needs no root; needs Debian's python3-torch
# (apt-get install -y python3-torch), dataset-fashion-mnist and a built tree
# (make -j2 && make build/rel/tests/bench_train).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-/usr/bin/python3}
SECONDS_PER=5 ROUNDS=1 LIMIT=0 KEEP="" MODELS="mlp cnn"

usage() { sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_PER=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --limit) LIMIT=$2; shift 2 ;;
    --keep) KEEP=$2; shift 2 ;;
    --models) MODELS=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench-vs-torch.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done

if ! "$PY" -c 'import torch, torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null; then
  echo "bench-vs-torch.sh: PyTorch (with gloo) is not importable by $PY." >&2
  echo "  Install Debian's package as root: apt-get install -y python3-torch" >&2
  echo "  (or point PYTHON=/path/to/python3 at an interpreter that has torch)" >&2
  exit 2
fi
BENCH=$here/build/rel/tests/bench_train
for f in "$BENCH" "$here/bin/ps-server" "$here/bin/ps-worker"; do
  [ -x "$f" ] || { echo "bench-vs-torch.sh: $f missing; run 'make -j2 && make build/rel/tests/bench_train'" >&2; exit 2; }
done

if [ -n "$KEEP" ]; then
  mkdir -p "$KEEP" && work=$(cd "$KEEP" && pwd) || exit 2
else
  work=$(mktemp -d /tmp/bench-vs-torch.XXXXXX) || exit 2
fi
# the cluster secret every process reads (authentication is on by default)
if [ -z "${PS_SECRET_FILE:-}" ]; then
  export PS_SECRET_FILE=$work/ps.secret
  [ -e "$PS_SECRET_FILE" ] || "$here/scripts/ps-keygen" "$PS_SECRET_FILE" 2>/dev/null
fi
trap '[ -z "$KEEP" ] && rm -rf "$work"' EXIT
results=$work/results.jsonl
: >"$results"

# A private copy of the local cluster per model: free ports (other runs may
# hold 7000/7001), the CPU, one epoch, metrics in a folder per round.
read -r p0 p1 < <("$PY" - <<'EOF'
import socket
ss = [socket.socket() for _ in range(2)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])
for s in ss: s.close()
EOF
)
for model in $MODELS; do
  sed -e "s/^\( *servers:\).*/\1 [127.0.0.1:$p0, 127.0.0.1:$p1]/" \
      -e "s/^\( *device:\).*/\1 cpu/" -e "s/^\( *epochs:\).*/\1 1/" \
      -e "s/^\( *level:\).*/\1 warn/" -e "s/^\( *preset:\).*/\1 $model/" \
      "$here/conf/local.yaml" >"$work/cluster-$model.yaml"
done
# ps-worker's input normalization (worker/dataset.h), for PyTorch's epoch
NORM=$(sed -n 's/^#define PS_DATASET_MEAN *\([0-9.]*\)f.*/\1/p' "$here/worker/dataset.h"),$(sed -n 's/^#define PS_DATASET_STD *\([0-9.]*\)f.*/\1/p' "$here/worker/dataset.h")
DATA=$(sed -n 's/^ *data_dir: *\([^ #]*\).*/\1/p' "$here/conf/local.yaml" | head -1)

tag() { # tag ROUND SETUP: JSON lines on stdin -> results, with "round", "impl", "setup" set
  "$PY" -c '
import json, sys
r, setup = int(sys.argv[1]), sys.argv[2]
for line in sys.stdin:
    line = line.strip()
    if not line.startswith("{"): continue
    d = json.loads(line)
    if d.get("backend", "cpu") not in ("cpu", "gloo"): continue
    d.setdefault("impl", "ours"); d["round"] = r; d["setup"] = setup
    print(json.dumps(d))' "$1" "$2" >>"$results"
}

ncpu=$(nproc)
echo "bench-vs-torch.sh: $ROUNDS round(s), ${SECONDS_PER}s per measurement, models $MODELS, cluster limit $LIMIT (0 = one epoch); work in $work" >&2
echo "  load average: $(cut -d' ' -f1-3 /proc/loadavg), $ncpu CPU(s)" >&2
one="1 process, 1 thread" all="1 process, $ncpu threads" dist="2 shards+2 workers / DDP 2 procs"
# the thread counts are set explicitly on both sides; OMP_NUM_THREADS and
# OPENBLAS_NUM_THREADS stay 1 for everything else
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
for ((r = 1; r <= ROUNDS; r++)); do
  for t in 1 "$ncpu"; do
    setup=$one; [ "$t" = 1 ] || setup=$all
    echo "round $r: ours, $setup" >&2
    "$BENCH" --seconds "$SECONDS_PER" --backend cpu --threads "$t" --json | \
      "$PY" -c 'import json, sys
ms = sys.argv[1].split()
for l in sys.stdin:
    if l.startswith("{") and json.loads(l)["model"] in ms: print(l, end="")' "$MODELS" | tag "$r" "$setup"
    echo "round $r: pytorch, $setup" >&2
    OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t "$PY" "$here/scripts/bench-torch.py" \
      --seconds "$SECONDS_PER" --threads "$t" --models $MODELS | tag "$r" "$setup"
  done
  for model in $MODELS; do
    echo "round $r: ours, 2 shards + 2 workers, $model" >&2
    m=$work/metrics-$model-$r
    rm -rf "$m"
    sed "s/^seed:.*/seed: $((41 + r))/" "$work/cluster-$model.yaml" >"$work/cluster-$model-$r.yaml"
    # train.threads auto (OMP_NUM_THREADS unset): the cores shared by the two workers
    if env -u OMP_NUM_THREADS "$here/scripts/ps-local.sh" "$work/cluster-$model-$r.yaml" \
         --logs "$work/logs-$model-$r" -- --limit "$LIMIT" --metrics-dir "$m" \
         >"$work/ps-local-$model-$r.out" 2>&1; then
      cat "$m"/worker-*.jsonl | "$PY" -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
acc = [r["test_accuracy"] for r in rows if "test_accuracy" in r]
d = {"impl": "ours", "model": sys.argv[1], "mode": "ddp", "backend": "cpu",
     "workers": len(rows), "steps": rows[0]["steps"],
     "samples_per_s": round(sum(r["samples_per_s"] for r in rows), 1),
     "per_process_samples_per_s": [r["samples_per_s"] for r in rows]}
if acc and sys.argv[2] == "0": d["test_accuracy"] = acc[0]
print(json.dumps(d))' "$model" "$LIMIT" | tag "$r" "$dist"
    else
      echo "bench-vs-torch.sh: ps-local.sh failed (see $work/ps-local-$model-$r.out, $work/logs-$model-$r)" >&2
      KEEP=$work
    fi
    echo "round $r: pytorch DDP (gloo), 2 processes, $model" >&2
    if [ "$LIMIT" = 0 ]; then
      "$PY" "$here/scripts/bench-torch.py" --ddp --epoch --data "$DATA" --momentum 0.9 \
        --init ours --normalize "$NORM" --seed $((r - 1)) --models "$model" | tag "$r" "$dist"
    else
      "$PY" "$here/scripts/bench-torch.py" --ddp --seconds "$SECONDS_PER" --momentum 0.9 \
        --models "$model" | tag "$r" "$dist"
    fi
  done
done

"$PY" - "$results" "$one" "$all" "$dist" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
order = sys.argv[2:]
tv = next((d["torch"] for d in rows if "torch" in d), "?")
print(f"PyTorch {tv}; batch 64; samples/s per measurement (rounds in order), mean, ratio ours/torch")
print(f"{'model':5} {'setup':34} {'ours':>16} {'pytorch':>16} {'ours mean':>10} {'torch mean':>10} {'ratio':>6}")
keys = sorted({(d["model"], d["setup"]) for d in rows},
              key=lambda k: (order.index(k[1]) if k[1] in order else 9, k[0] != "mlp"))
for k in keys:
    o = [d["samples_per_s"] for d in rows if (d["model"], d["setup"]) == k and d["impl"] == "ours"]
    t = [d["samples_per_s"] for d in rows if (d["model"], d["setup"]) == k and d["impl"] == "pytorch"]
    om = sum(o) / len(o) if o else float("nan")
    tm = sum(t) / len(t) if t else float("nan")
    fmt = lambda v: " ".join(f"{x:.0f}" for x in v) or "-"
    print(f"{k[0]:5} {k[1]:34} {fmt(o):>16} {fmt(t):>16} {om:10.0f} {tm:10.0f} {om / tm if tm else float('nan'):6.2f}")
acc = [d for d in rows if "test_accuracy" in d]
if acc:
    print("test accuracy after one epoch (2 workers / DDP 2 processes; rounds in order, a seed each), mean ours - mean pytorch in points")
    for m in sorted({d["model"] for d in acc}, key=lambda m: m != "mlp"):
        o = [d["test_accuracy"] for d in acc if d["model"] == m and d["impl"] == "ours"]
        t = [d["test_accuracy"] for d in acc if d["model"] == m and d["impl"] == "pytorch"]
        diff = (sum(o) / len(o) - sum(t) / len(t)) * 100 if o and t else float("nan")
        print(f"{m:5} ours {' '.join(f'{x:.4f}' for x in o):>16}  pytorch {' '.join(f'{x:.4f}' for x in t):>16}  {diff:+.2f} points")
EOF
echo "  load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
[ -n "$KEEP" ] && echo "results in $results" >&2
exit 0
