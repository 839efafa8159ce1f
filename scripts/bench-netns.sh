#!/usr/bin/env bash
# bench-netns.sh - time per epoch of each gradient codec with the workers behind a bandwidth limit.
#
#   sudo scripts/bench-netns.sh [options]
#
# Builds a small network out of Linux network namespaces: a bridge (br0) in
# namespace psb-net, one namespace per shard (psb-s0, psb-s1, ...) and one per
# worker (psb-w0, psb-w1, ...), each joined to the bridge by a veth pair, on
# 10.77.0.0/24 (shard i is 10.77.0.(1+i), worker r is 10.77.0.(101+r)).
# Each WORKER's link is limited in both directions with
#   tc qdisc add dev DEV root tbf rate RATE burst 32kbit latency 50ms
# on the worker-side veth (pushes) and on the bridge-side veth (pulls); the
# shards' links are not limited. A raw TCP transfer in each direction checks
# the limit before the runs (needs python3; skipped without it).
# For each codec it writes a config (sync, seed 42, momentum 0.9, lr 0.01,
# batch 64, the codec with error feedback on, lz4 and pull as given), starts
# every shard and worker inside its namespace with `ip netns exec`
# (OPENBLAS_NUM_THREADS=1), trains, and prints one table per mode:
#   codec, wire MB pushed per worker per step, raw/wire bytes ratio,
#   seconds per epoch (the workers' own timer, slowest worker), speed-up
#   against `none` of the same table, wire MB pushed per second of epoch
#   (average over workers), test accuracy (rank 0, after the last epoch).
# By default it runs every codec behind the limit, then again without it.
# Everything it creates (namespaces, veths, bridge, qdiscs, processes, the
# temporary folder unless --logs) is removed on exit, failure, Ctrl-C or
# SIGTERM. Needs root (namespaces, veth, tc).
#
# Options:
#   --model M        mlp | cnn (default mlp)
#   --limit N        train on the first N images, 0 = all (default 12000)
#   --epochs N       epochs per run (default 1)
#   --batch B        examples per step per worker (default 64)
#   --codecs "LIST"  codecs to run, in order (default "none fp16 q8 topk sign");
#                    the speed-up column needs `none` in the list
#   --ratio R        topk ratio (default 0.01)
#   --lz4 MODE       off | on | auto (default auto)
#   --pull P         pull (weights) encoding: none | fp16 (default none)
#   --rate RATE      tbf rate of each worker link (default 100mbit)
#   --shards N       shard namespaces/processes (default 2)
#   --workers N      worker namespaces/processes (default 2)
#   --no-limit       only the table without a bandwidth limit
#   --limit-only     only the table with the bandwidth limit
#   --check-only     build the network, check the limit, and exit
#   --logs DIR       keep configs, logs and metrics in DIR (default: a
#                    temporary folder, removed at exit)
#   --cleanup        remove namespaces left by a run that was killed with
#                    SIGKILL (psb-*), and exit
#   -h, --help       this text
# Exit status: 0 when every run succeeded, 1 when one failed, 2 on bad usage.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
BIN=${PS_BIN:-$here/bin}
P=psb                      # namespace prefix
SUBNET=10.77.0
usage() { sed -n '2,49p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "bench-netns.sh: $*" >&2; exit 1; }

MODEL=mlp LIMIT=12000 EPOCHS=1 BATCH=64 CODECS="none fp16 q8 topk sign"
RATIO=0.01 LZ4=auto PULL=none RATE=100mbit NSHARDS=2 NWORKERS=2
MODES="limited unlimited" CHECK_ONLY=0 LOGDIR="" CLEANUP_ONLY=0
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --model) MODEL=$2; shift 2 ;;
    --limit) LIMIT=$2; shift 2 ;;
    --epochs) EPOCHS=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --codecs) CODECS=$2; shift 2 ;;
    --ratio) RATIO=$2; shift 2 ;;
    --lz4) LZ4=$2; shift 2 ;;
    --pull) PULL=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --shards) NSHARDS=$2; shift 2 ;;
    --workers) NWORKERS=$2; shift 2 ;;
    --no-limit) MODES=unlimited; shift ;;
    --limit-only) MODES=limited; shift ;;
    --check-only) CHECK_ONLY=1; shift ;;
    --logs) LOGDIR=$2; shift 2 ;;
    --cleanup) CLEANUP_ONLY=1; shift ;;
    *) echo "bench-netns.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
case "$MODEL" in mlp|cnn) ;; *) echo "bench-netns.sh: --model must be mlp or cnn" >&2; exit 2 ;; esac
for v in LIMIT EPOCHS BATCH NSHARDS NWORKERS; do
  [[ ${!v} =~ ^[0-9]+$ ]] || { echo "bench-netns.sh: $v needs a number" >&2; exit 2; }
done
[ "$NSHARDS" -ge 1 ] && [ "$NSHARDS" -le 50 ] && [ "$NWORKERS" -ge 1 ] && [ "$NWORKERS" -le 50 ] ||
  { echo "bench-netns.sh: --shards and --workers must be 1..50" >&2; exit 2; }
for c in $CODECS; do
  case "$c" in none|fp16|q8|topk|sign) ;; *) echo "bench-netns.sh: unknown codec '$c'" >&2; exit 2 ;; esac
done

if [ "$(id -u)" -ne 0 ]; then
  echo "bench-netns.sh: needs root: it creates network namespaces, veth pairs, a bridge" >&2
  echo "and tc qdiscs. Run it as root, e.g. 'sudo $0 $*'." >&2
  exit 2
fi
for t in ip tc jq awk; do command -v $t >/dev/null || die "'$t' is missing (apt-get install iproute2 jq gawk)"; done

ns_list() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$P-(net|s[0-9]+|w[0-9]+)\$"; }

# --- cleanup: processes first (a namespace lives on while a process is in it),
# then the namespaces, which takes their veths, bridge and qdiscs with them.
CREATED_NS=() PIDS=() TMPDIR_OWNED="" CLEANED=0
cleanup() {
  [ $CLEANED -eq 1 ] && return; CLEANED=1
  local p ns left
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for ((i = 0; i < 30; i++)); do
    left=0; for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && left=1; done
    [ $left -eq 0 ] && break; sleep 0.1
  done
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  for ns in "${CREATED_NS[@]}"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
  done
  for ns in "${CREATED_NS[@]}"; do ip netns del "$ns" 2>/dev/null; done
  [ -n "$TMPDIR_OWNED" ] && rm -rf "$TMPDIR_OWNED"
}
on_signal() { echo >&2; echo "bench-netns.sh: interrupted; cleaning up" >&2; cleanup; exit 130; }
trap cleanup EXIT
trap on_signal INT TERM HUP

if [ $CLEANUP_ONLY -eq 1 ]; then
  for ns in $(ns_list); do CREATED_NS+=("$ns"); done
  echo "bench-netns.sh: removing ${CREATED_NS[*]:-nothing}"
  exit 0
fi
stale=$(ns_list | tr '\n' ' ')
[ -z "$stale" ] || die "namespaces $stale already exist (another run, or one killed with SIGKILL: '$0 --cleanup' removes them)"
for b in ps-server ps-worker; do [ -x "$BIN/$b" ] || die "$BIN/$b missing; run 'make' first"; done

if [ -z "$LOGDIR" ]; then LOGDIR=$(mktemp -d /tmp/bench-netns.XXXXXX); TMPDIR_OWNED=$LOGDIR; fi
mkdir -p "$LOGDIR" || die "cannot create $LOGDIR"
LOGDIR=$(cd "$LOGDIR" && pwd)
# the cluster secret every process reads (authentication is on by default)
if [ -z "${PS_SECRET_FILE:-}" ]; then
  export PS_SECRET_FILE=$LOGDIR/ps.secret
  [ -e "$PS_SECRET_FILE" ] || "$here/scripts/ps-keygen" "$PS_SECRET_FILE" 2>/dev/null
fi

# --- the network
netns_add() { ip netns add "$1" || die "cannot create namespace $1"; CREATED_NS+=("$1"); ip -n "$1" link set lo up; }
LIMITED_DEVS=()   # "NS DEV" pairs that carry a worker's link
build_network() {
  netns_add $P-net
  ip -n $P-net link add br0 type bridge || die "cannot create a bridge"
  ip -n $P-net link set br0 up
  local i name addr
  for ((i = 0; i < NSHARDS + NWORKERS; i++)); do
    if [ $i -lt $NSHARDS ]; then name=s$i addr=$SUBNET.$((1 + i))
    else name=w$((i - NSHARDS)) addr=$SUBNET.$((101 + i - NSHARDS)); fi
    netns_add $P-$name
    ip link add v$name netns $P-net type veth peer name eth0 netns $P-$name ||
      die "cannot create veth pair for $name"
    ip -n $P-net link set v$name master br0 up
    ip -n $P-$name addr add $addr/24 dev eth0
    ip -n $P-$name link set eth0 up
    [ ${name:0:1} = w ] && LIMITED_DEVS+=("$P-$name eth0" "$P-net v$name")
  done
}
set_limit() {   # on | off
  local d
  for d in "${LIMITED_DEVS[@]}"; do
    set -- $d
    ip netns exec "$1" tc qdisc del dev "$2" root 2>/dev/null
    if [ "$MODE_LIMIT" = on ]; then
      ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$RATE" burst 32kbit latency 50ms ||
        die "tc tbf failed on $2 in $1"
    fi
  done
}
shard_addr() { echo "$SUBNET.$((1 + $1))"; }

# --- raw TCP check of one link (both directions), python3 only
PYTCP='
import socket, sys, time
mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "recv":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port)); s.listen(1); print("ready", flush=True)
    c, _ = s.accept(); t0 = time.time(); n = 0
    while True:
        b = c.recv(1 << 20)
        if not b: break
        n += len(b)
    dt = time.time() - t0; print("%.2f MB/s (%d MB in %.2f s)" % (n / dt / 1e6, n / 1e6, dt))
else:
    n = int(sys.argv[4]); c = socket.create_connection((host, port)); buf = b"\0" * (1 << 20)
    while n > 0: c.sendall(buf[:min(n, len(buf))]); n -= len(buf)
    c.close()
'
tcp_check() {   # FROM_NS TO_NS TO_ADDR MB -> prints the receiver's rate
  local f=$LOGDIR/tcp-check.out rp
  command -v python3 >/dev/null || { echo "skipped (no python3)"; return; }
  : >"$f"
  ip netns exec "$2" python3 -c "$PYTCP" recv "$3" 7999 >"$f" 2>&1 &
  rp=$!; PIDS+=($rp)
  for ((i = 0; i < 50; i++)); do grep -q ready "$f" && break; sleep 0.1; done
  grep -q ready "$f" || { kill "$rp" 2>/dev/null; echo "receiver did not start"; return; }
  ip netns exec "$1" python3 -c "$PYTCP" send "$3" 7999 $(($4 * 1000000)) 2>&1
  wait "$rp"
  tail -n 1 "$f"
}
check_links() {
  local rate_mb
  rate_mb=$(echo "$RATE" | awk '/mbit$/ {printf "%.2f", $1/8; exit} /gbit$/ {printf "%.2f", $1*125; exit} {print "?"}')
  echo "link check, $([ "$MODE_LIMIT" = on ] && echo "tbf $RATE (= $rate_mb MB/s)" || echo "no limit"), raw TCP, 20 MB:"
  echo "  worker 0 -> shard 0 (push direction): $(tcp_check $P-w0 $P-s0 "$(shard_addr 0)" 20)"
  echo "  shard 0 -> worker 0 (pull direction): $(tcp_check $P-s0 $P-w0 $SUBNET.101 20)"
}

# --- one training run
write_config() {   # CODEC FILE
  {
    echo "cluster:"
    echo "  servers:"
    for ((i = 0; i < NSHARDS; i++)); do echo "    - $(shard_addr $i):$((7000 + i))"; done
    echo "  workers: $NWORKERS"
    echo "consistency:"
    echo "  mode: sync"
    echo "seed: 42"
    echo "model:"
    echo "  preset: $MODEL"
    echo "train:"
    echo "  data_dir: ${PS_DATA_DIR:-/usr/share/datasets/fashion-mnist}"
    echo "  batch: $BATCH"
    echo "  epochs: $EPOCHS"
    echo "  limit: $LIMIT"
    echo "  device: auto"
    echo "optimizer:"
    echo "  name: momentum"
    echo "  lr: 0.01"
    echo "  momentum: 0.9"
    echo "compression:"
    echo "  codec: $1"
    echo "  ratio: $RATIO"
    echo "  error_feedback: true"
    echo "  lz4: $LZ4"
    echo "  pull: $PULL"
    echo "log:"
    echo "  level: info"
  } >"$2"
}
run_one() {   # CODEC DIR -> 0 on success
  local codec=$1 dir=$2 cfg=$2/config.yaml i r p rc up status=0
  mkdir -p "$dir"; rm -f "$dir"/worker-*.jsonl
  write_config "$codec" "$cfg"
  "$BIN/ps-server" --config "$cfg" --dump-config >/dev/null 2>"$dir/config-error.log" ||
    { echo "bench-netns.sh: config refused:" >&2; cat "$dir/config-error.log" >&2; return 1; }
  local spids=() wpids=()
  for ((i = 0; i < NSHARDS; i++)); do
    ip netns exec $P-s$i env OPENBLAS_NUM_THREADS=1 "$BIN/ps-server" --config "$cfg" --shard $i \
      >"$dir/server-$i.log" 2>&1 &
    spids+=($!); PIDS+=($!)
  done
  for ((t = 0; t < 100; t++)); do
    up=0
    for ((i = 0; i < NSHARDS; i++)); do
      ip netns exec $P-w0 bash -c "exec 3<>/dev/tcp/$(shard_addr $i)/$((7000 + i))" 2>/dev/null && up=$((up + 1))
    done
    [ $up -ge $NSHARDS ] && break
    for p in "${spids[@]}"; do kill -0 "$p" 2>/dev/null || { cat "$dir"/server-*.log >&2; status=1; break 2; }; done
    sleep 0.1
  done
  if [ $status -eq 0 ] && [ $up -ge $NSHARDS ]; then
    for ((r = 0; r < NWORKERS; r++)); do
      ip netns exec $P-w$r env OPENBLAS_NUM_THREADS=1 "$BIN/ps-worker" --config "$cfg" --rank $r \
        --epochs "$EPOCHS" --limit "$LIMIT" --metrics-dir "$dir" >"$dir/worker-$r.log" 2>&1 &
      wpids+=($!); PIDS+=($!)
    done
    # A failed worker would leave the others waiting at a sync barrier: stop them.
    local running=("${wpids[@]}") rest done_pid
    while [ ${#running[@]} -gt 0 ]; do
      done_pid=""; wait -n -p done_pid "${running[@]}"; rc=$?
      [ -n "$done_pid" ] || break
      rest=(); for p in "${running[@]}"; do [ "$p" = "$done_pid" ] || rest+=("$p"); done
      running=("${rest[@]}")
      if [ $rc -ne 0 ] && [ $status -eq 0 ]; then
        echo "bench-netns.sh: $codec: a worker exited with status $rc (logs: $dir)" >&2
        tail -n 5 "$dir"/worker-*.log >&2
        status=1
        for p in "${running[@]}"; do kill -TERM "$p" 2>/dev/null; done
      fi
    done
  else
    echo "bench-netns.sh: $codec: shards did not start (logs: $dir)" >&2; status=1
  fi
  for p in "${spids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${spids[@]}"; do wait "$p" 2>/dev/null; done
  return $status
}

# One table row from the workers' metrics (the last line of each is cumulative).
summarize() {   # CODEC DIR -> "codec wire_mb_per_step ratio s_per_epoch push_mb_s acc"
  jq -s -r --arg c "$1" --argjson e "$EPOCHS" '
    (group_by(.rank) | map({r: .[0].rank, steps: (map(.steps) | add), last: (max_by(.epoch))})) as $w
    | ($w | map(.last.mb_pushed_wire / .steps) | add / length) as $wire
    | (($w | map(.last.mb_pushed_raw) | add) / ($w | map(.last.mb_pushed_wire) | add)) as $ratio
    | ($w | map(.last.time_s) | max) as $t
    | ($w | map(.last.mb_pushed_wire / .last.time_s) | add / length) as $rate
    | ($w | map(select(.r == 0))[0].last.test_accuracy) as $acc
    | [$c, $wire, $ratio, $t / $e, $rate, ($acc // -1)] | @tsv' "$2"/worker-*.jsonl
}
print_table() {   # TITLE ROWS_FILE
  echo
  echo "### $1"
  echo
  echo "| codec | wire MB pushed / worker / step | raw/wire | s / epoch | speed-up vs none | avg push MB/s / worker | test accuracy |"
  echo "|---|---:|---:|---:|---:|---:|---:|"
  awk -F'\t' '
    { c[NR] = $1; w[NR] = $2; r[NR] = $3; t[NR] = $4; m[NR] = $5; a[NR] = $6; if ($1 == "none") base = $4 }
    END {
      for (i = 1; i <= NR; i++) {
        if (c[i] ~ /FAILED/) { printf "| %s | - | - | - | - | - | - |\n", c[i]; continue }
        su = (base > 0 && t[i] > 0) ? sprintf("%.2fx", base / t[i]) : "-"
        acc = a[i] >= 0 ? sprintf("%.4f", a[i]) : "-"
        printf "| %s | %.4f | %.1f | %.2f | %s | %.2f | %s |\n", c[i], w[i], r[i], t[i], su, m[i], acc
      }
    }' "$2"
}

echo "bench-netns.sh: $MODEL, $NSHARDS shard(s) + $NWORKERS worker(s) in namespaces $P-*, sync,"
echo "  --limit $LIMIT, $EPOCHS epoch(s), batch $BATCH, codecs: $CODECS (topk ratio $RATIO, lz4 $LZ4, pull $PULL)"
echo "  logs: $LOGDIR$([ -n "$TMPDIR_OWNED" ] && echo " (removed at exit; --logs keeps them)")"
build_network
overall=0
for mode in $MODES; do
  if [ $mode = limited ]; then MODE_LIMIT=on; title="tbf $RATE on each worker link (both directions)"
  else MODE_LIMIT=off; title="no bandwidth limit (veth + bridge only)"; fi
  set_limit
  echo; echo "== $title"
  check_links
  [ $CHECK_ONLY -eq 1 ] && continue
  rows=$LOGDIR/$mode.tsv; : >"$rows"
  for codec in $CODECS; do
    dir=$LOGDIR/$mode/$codec
    t0=$(date +%s.%N)
    if run_one "$codec" "$dir" && row=$(summarize "$codec" "$dir") && [ -n "$row" ]; then
      printf '%s\n' "$row" >>"$rows"
      printf '  %-5s done in %5.1f s wall: %s\n' "$codec" "$(echo "$(date +%s.%N) - $t0" | bc)" "$(echo "$row" | cut -f2-)"
    else
      printf '%s FAILED\t0\t0\t0\t0\t-1\n' "$codec" >>"$rows"; overall=1
    fi
  done
  print_table "$MODEL, $title" "$rows"
done
exit $overall
