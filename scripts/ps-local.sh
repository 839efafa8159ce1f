#!/usr/bin/env bash
# ps-local.sh - runs every shard and worker of a config on this machine.
#
#   scripts/ps-local.sh CONFIG [--logs DIR] [--workers-only|--servers-only] [-- WORKER_ARGS...]
#   scripts/ps-local.sh CONFIG --worker-cmd "python3 train.py" [...]
#
# --worker-cmd runs CMD (with bash -c) as each worker instead of ps-worker,
# with PS_CONFIG (the config's absolute path), PS_RANK and PS_NUM_WORKERS
# in its environment (the Python package reads them: docs/python.md).
# Shards start first (with cluster.replicas: 1 each shard's backup process
# too, --replica 1, logging to server-K-r1.log); workers start once every
# one listens. Worker 0's
# progress is shown on this terminal; every process logs to DIR (default a
# new folder under /tmp, printed at the start). When the workers finish, the
# shards are stopped with SIGTERM. Ctrl-C or SIGTERM stops everything cleanly.
# Exit status: 0 when every process succeeded, 1 otherwise.
# Authentication (security.auth, on by default): when the config's secret
# file (security.secret_file, else $PS_SECRET_FILE) does not exist yet, a
# new one is generated there (scripts/ps-keygen); when neither names one,
# in DIR/ps.secret, handed to every process through PS_SECRET_FILE. With
# cluster.replicas: 1 the shards' replication key likewise
# (security.repl_key_file, else $PS_REPL_KEY_FILE, else DIR/ps.replkey),
# handed to the ps-server processes alone (--repl-key-file).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/scripts/ps-lib.sh"
BIN=${PS_BIN:-$here/bin}

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }
[ $# -ge 1 ] || { usage >&2; exit 2; }
case "$1" in -h|--help) usage; exit 0 ;; esac
CONFIG=$1; shift
LOGDIR="" MODE=all WORKER_CMD=""
while [ $# -gt 0 ]; do
  case "$1" in
    --logs) LOGDIR=$2; shift 2 ;;
    --worker-cmd) WORKER_CMD=${2:?--worker-cmd needs a command}; shift 2 ;;
    --servers-only) MODE=servers; shift ;;
    --workers-only) MODE=workers; shift ;;
    --) shift; break ;;
    *) echo "ps-local.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[ -r "$CONFIG" ] || { echo "ps-local.sh: cannot read $CONFIG" >&2; exit 2; }
for b in ps-server $([ -z "$WORKER_CMD" ] && echo ps-worker); do
  [ -x "$BIN/$b" ] || { echo "ps-local.sh: $BIN/$b missing; run 'make' first" >&2; exit 2; }
done
LOGDIR=${LOGDIR:-$(mktemp -d /tmp/ps-local.XXXXXX)}
mkdir -p "$LOGDIR"

shard_lines=$("$BIN/ps-server" --config "$CONFIG" --list-shards) || exit 2
nshards=$(printf '%s\n' "$shard_lines" | wc -l)
# cluster.replicas: 1: each shard's backup process too (--replica 1)
backup_lines=$("$BIN/ps-server" --config "$CONFIG" --list-backups) || exit 2
dump=$("$BIN/ps-server" --config "$CONFIG" --dump-config) || exit 2
nworkers=$(cfg_key "$dump" cluster workers)
transport=$(awk '/^transport:/ { print $2; exit }' <<<"$dump")
auth=$(cfg_key "$dump" security auth)
secret=$(cfg_key "$dump" security secret_file)
if [ "$auth" = true ]; then
  if [ -z "$secret" ] && [ -z "${PS_SECRET_FILE:-}" ]; then
    export PS_SECRET_FILE=$LOGDIR/ps.secret
  fi
  secret=${secret:-$PS_SECRET_FILE}
  if [ ! -e "$secret" ]; then
    "$here/scripts/ps-keygen" "$secret" || exit 2
  fi
fi
# the replication key: only the shard processes get it (workers never do)
repl_key_args=()
if [ "$auth" = true ] && [ -n "$backup_lines" ]; then
  repl_key=$(cfg_key "$dump" security repl_key_file)
  repl_key=${repl_key:-${PS_REPL_KEY_FILE:-$LOGDIR/ps.replkey}}
  if [ ! -e "$repl_key" ]; then
    "$here/scripts/ps-keygen" "$repl_key" || exit 2
  fi
  repl_key_args=(--repl-key-file "$repl_key")
fi

# Workers share this machine's cores: give each one BLAS thread per core it
# can have, unless the caller chose (OPENBLAS_NUM_THREADS).
if [ -z "${OPENBLAS_NUM_THREADS:-}" ]; then
  t=$(( $(nproc) / (nworkers > 0 ? nworkers : 1) ))
  export OPENBLAS_NUM_THREADS=$(( t > 0 ? t : 1 ))
fi

server_pids=() worker_pids=()
status=0
stop_servers() {
  for p in "${server_pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${server_pids[@]}"; do
    wait "$p"; rc=$?
    [ $rc -eq 0 ] || { echo "ps-local.sh: a shard exited with status $rc" >&2; status=1; }
  done
  server_pids=()
}
on_signal() {
  echo >&2
  echo "ps-local.sh: stopping every process" >&2
  for p in "${worker_pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${worker_pids[@]}"; do wait "$p" 2>/dev/null; done
  worker_pids=()
  stop_servers
  exit 130
}
trap on_signal INT TERM

echo "ps-local.sh: $nshards shard(s), $nworkers worker(s) from $CONFIG; logs in $LOGDIR"
if [ "$MODE" != workers ]; then
  while read -r idx host port; do
    "$BIN/ps-server" --config "$CONFIG" --shard "$idx" ${repl_key_args[@]+"${repl_key_args[@]}"} \
      >"$LOGDIR/server-$idx.log" 2>&1 &
    server_pids+=($!)
  done <<<"$shard_lines"
  if [ -n "$backup_lines" ]; then
    while read -r idx host port; do
      "$BIN/ps-server" --config "$CONFIG" --shard "$idx" --replica 1 \
        ${repl_key_args[@]+"${repl_key_args[@]}"} >"$LOGDIR/server-$idx-r1.log" 2>&1 &
      server_pids+=($!)
    done <<<"$backup_lines"
  fi
  # Wait (up to 10 s) until every shard (and backup) accepts connections on its port.
  all_lines=$shard_lines${backup_lines:+$'\n'$backup_lines}
  nproc_srv=$(printf '%s\n' "$all_lines" | wc -l)
  for ((t = 0; t < 100; t++)); do
    up=0 i=0
    while read -r idx host port; do
      h=${host#[}; h=${h%]}
      log=$LOGDIR/server-$idx.log
      [ $i -ge "$nshards" ] && log=$LOGDIR/server-$idx-r1.log
      i=$((i + 1))
      if [ "$transport" = rdma ]; then # no TCP port: the shard's log says it listens
        grep -q "listening on" "$log" 2>/dev/null && up=$((up + 1))
      else
        (exec 3<>"/dev/tcp/$h/$port") 2>/dev/null && up=$((up + 1))
      fi
    done <<<"$all_lines"
    [ "$up" -ge "$nproc_srv" ] && break
    for p in "${server_pids[@]}"; do
      kill -0 "$p" 2>/dev/null || { echo "ps-local.sh: a shard failed to start:" >&2; cat "$LOGDIR"/server-*.log >&2; stop_servers; exit 1; }
    done
    sleep 0.1
  done
  [ "$up" -ge "$nproc_srv" ] || { echo "ps-local.sh: shards did not start within 10 s" >&2; stop_servers; exit 1; }
fi
if [ "$MODE" = servers ]; then
  echo "ps-local.sh: shards running; Ctrl-C stops them"
  while :; do sleep 1; done
fi

# A worker: ps-worker, or --worker-cmd with the config and rank in its
# environment. Run as `run_worker ... &`: exec, so that $! is the worker
# itself (signals reach it, not a subshell).
run_worker() { # RANK ARGS...
  local r=$1; shift
  if [ -n "$WORKER_CMD" ]; then
    PS_CONFIG=$(realpath "$CONFIG") PS_RANK=$r PS_NUM_WORKERS=$nworkers exec bash -c "$WORKER_CMD"
  else
    exec "$BIN/ps-worker" --config "$CONFIG" --rank "$r" "$@"
  fi
}
for ((r = 0; r < nworkers; r++)); do
  if [ $r -eq 0 ]; then
    run_worker 0 "$@" 2> >(tee "$LOGDIR/worker-0.log" >&2) &
  else
    run_worker "$r" "$@" >"$LOGDIR/worker-$r.log" 2>&1 &
  fi
  worker_pids+=($!)
done
# A failed worker would leave the others waiting at a sync barrier: stop them.
running=("${worker_pids[@]}")
while [ ${#running[@]} -gt 0 ]; do
  wait -n -p done_pid "${running[@]}"; rc=$?
  [ -n "${done_pid:-}" ] || break
  rest=()
  for p in "${running[@]}"; do [ "$p" = "$done_pid" ] || rest+=("$p"); done
  running=("${rest[@]}")
  if [ $rc -ne 0 ] && [ $status -eq 0 ]; then
    for ((r = 0; r < nworkers; r++)); do [ "${worker_pids[$r]}" = "$done_pid" ] && break; done
    echo "ps-local.sh: worker $r exited with status $rc (log: $LOGDIR/worker-$r.log); stopping the others" >&2
    status=1
    for p in "${running[@]}"; do kill -TERM "$p" 2>/dev/null; done
  fi
done
worker_pids=()
stop_servers
for f in "$LOGDIR"/server-*.log; do tail -n 1 "$f"; done
exit $status
