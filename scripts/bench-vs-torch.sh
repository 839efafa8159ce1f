#!/usr/bin/env bash
# bench-vs-torch.sh - our training speed against PyTorch's, measured in one run.
#
#   scripts/bench-vs-torch.sh [--seconds S] [--rounds R] [--limit N] [--keep DIR]
#
# Each round runs, alternating ours and PyTorch's so that load on the machine
# hits both alike:
#   1. one process, one thread, batch 64, no servers, mlp and cnn:
#      OPENBLAS_NUM_THREADS=1 build/rel/tests/bench_train --seconds S --json
#      against scripts/bench-torch.py --seconds S (SGD step included);
#   2. cnn through 2 shards + 2 workers (scripts/ps-local.sh, a copy of
#      conf/local.yaml on free ports, CPU, 1 BLAS thread per worker,
#      --limit N: N/128 steps per worker; samples/s summed over the workers)
#      against PyTorch DistributedDataParallel, gloo, 2 processes, 1 thread
#      each (scripts/bench-torch.py --ddp --seconds S).
# Then prints every measurement, the mean per row and the ratio ours/torch.
# Defaults: S=5, R=2, N=5120 (40 steps per worker). Needs no root; needs
# Debian's python3-torch (apt-get install -y python3-torch) and a built tree
# (make -j2 && make build/rel/tests/bench_train).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-/usr/bin/python3}
SECONDS_PER=5 ROUNDS=2 LIMIT=5120 KEEP=""

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_PER=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --limit) LIMIT=$2; shift 2 ;;
    --keep) KEEP=$2; shift 2 ;;
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

# A private copy of the local cluster: free ports (other runs may hold
# 7000/7001), the CPU, one epoch, metrics in a folder per round.
read -r p0 p1 < <("$PY" - <<'EOF'
import socket
ss = [socket.socket() for _ in range(2)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])
for s in ss: s.close()
EOF
)
sed -e "s/^\( *servers:\).*/\1 [127.0.0.1:$p0, 127.0.0.1:$p1]/" \
    -e "s/^\( *device:\).*/\1 cpu/" -e "s/^\( *epochs:\).*/\1 1/" \
    -e "s/^\( *level:\).*/\1 warn/" \
    "$here/conf/local.yaml" >"$work/cluster.yaml"

tag() { # tag ROUND: JSON lines on stdin -> results, with "round" and "impl" set
  "$PY" -c '
import json, sys
r = int(sys.argv[1])
for line in sys.stdin:
    line = line.strip()
    if not line.startswith("{"): continue
    d = json.loads(line)
    if d.get("backend", "cpu") not in ("cpu", "gloo"): continue
    d.setdefault("impl", "ours"); d["round"] = r
    print(json.dumps(d))' "$1" >>"$results"
}

echo "bench-vs-torch.sh: $ROUNDS round(s), ${SECONDS_PER}s per measurement, cluster limit $LIMIT; work in $work" >&2
echo "  load average: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPU(s)" >&2
# one BLAS/OpenMP thread per process everywhere (nproc reads OMP_NUM_THREADS: set after)
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
for ((r = 1; r <= ROUNDS; r++)); do
  echo "round $r: ours, single process" >&2
  "$BENCH" --seconds "$SECONDS_PER" --json | tag "$r"
  echo "round $r: pytorch, single process" >&2
  "$PY" "$here/scripts/bench-torch.py" --seconds "$SECONDS_PER" | tag "$r"
  echo "round $r: ours, 2 shards + 2 workers, cnn" >&2
  m=$work/metrics-$r
  rm -rf "$m"
  if "$here/scripts/ps-local.sh" "$work/cluster.yaml" --logs "$work/logs-$r" -- \
       --limit "$LIMIT" --metrics-dir "$m" >"$work/ps-local-$r.out" 2>&1; then
    cat "$m"/worker-*.jsonl | "$PY" -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
print(json.dumps({"impl": "ours", "model": "cnn", "mode": "ddp", "backend": "cpu",
                  "workers": len(rows), "steps": rows[0]["steps"],
                  "samples_per_s": round(sum(r["samples_per_s"] for r in rows), 1),
                  "per_process_samples_per_s": [r["samples_per_s"] for r in rows]}))' | tag "$r"
  else
    echo "bench-vs-torch.sh: ps-local.sh failed (see $work/ps-local-$r.out, $work/logs-$r)" >&2
    KEEP=$work
  fi
  echo "round $r: pytorch DDP (gloo), 2 processes, cnn" >&2
  "$PY" "$here/scripts/bench-torch.py" --ddp --seconds "$SECONDS_PER" | tag "$r"
done

"$PY" - "$results" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def key(d):
    return (d["model"], "2 shards+2 workers / DDP 2 procs" if d.get("mode") == "ddp" else "1 process, 1 thread")
tv = next((d["torch"] for d in rows if "torch" in d), "?")
print(f"PyTorch {tv}; batch 64; samples/s per measurement (rounds in order), mean, ratio ours/torch")
print(f"{'model':5} {'setup':34} {'ours':>22} {'pytorch':>22} {'ours mean':>10} {'torch mean':>10} {'ratio':>6}")
for k in sorted({key(d) for d in rows}, key=lambda k: (k[1] != "1 process, 1 thread", k[0] != "mlp")):
    o = [d["samples_per_s"] for d in rows if key(d) == k and d["impl"] == "ours"]
    t = [d["samples_per_s"] for d in rows if key(d) == k and d["impl"] == "pytorch"]
    om = sum(o) / len(o) if o else float("nan")
    tm = sum(t) / len(t) if t else float("nan")
    fmt = lambda v: " ".join(f"{x:.0f}" for x in v) or "-"
    print(f"{k[0]:5} {k[1]:34} {fmt(o):>22} {fmt(t):>22} {om:10.0f} {tm:10.0f} {om / tm if tm else float('nan'):6.2f}")
EOF
echo "  load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
[ -n "$KEEP" ] && echo "results in $results" >&2
exit 0
