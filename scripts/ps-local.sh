#!/usr/bin/env bash
# ps-local.sh - runs every shard and worker of a config on this machine.
#
#   scripts/ps-local.sh CONFIG [--logs DIR] [--workers-only|--servers-only] [-- WORKER_ARGS...]
#   scripts/ps-local.sh CONFIG --worker-cmd "python3 train.py" [...]
#   scripts/ps-local.sh CONFIG reshard NEW_CONFIG [--restart] [same options]
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
# Shards are not supervised: one that dies while the workers run is reported
# at once (its exit status and log) and not restarted; restart it by hand
# with the same command (its checkpoint, when configured, brings its state
# back and the workers reconnect). At the end, a shard of the config running
# under ps-local.sh's own command line but not started by it (restarted by
# hand) is stopped with the others and named.
# reshard beside a running `ps-local.sh CONFIG` on this machine (without
# --restart): re-sharding while the workers run (docs/elastic.md). That
# ps-local.sh is asked (SIGUSR1, its DIR/reshard-request) to stop its
# shards at one clock boundary (ps-stat --reshard-stop: they write their
# checkpoints there and exit), set the checkpoints aside, start
# NEW_CONFIG's shards from them and point its workers at NEW_CONFIG
# (DIR/current-config, which libps follows through $PS_CONFIG_FOLLOW): the
# workers keep running, their pushes for the stop clock sent again to the
# new shards. This command prints the outcome and exits with its status;
# a refusal (a shard down) leaves the run going on CONFIG. With
# cluster.replicas: 1 both processes of every old pair stop (the backup
# follows its primary's stop) and both of every new pair start. It is
# re-sharded by restart with --restart or without a running ps-local.sh:
# reshard: re-sharding by restart (docs/elastic.md). NEW_CONFIG is CONFIG
# with other cluster.servers (and cluster.backups: with cluster.replicas: 1
# the backups start from the old files too; refused, naming the first
# other key that differs); CONFIG needs checkpoint.dir. A cluster of CONFIG running on
# this machine is stopped at a clock boundary as Ctrl-C stops it (its
# ps-local.sh is sent SIGTERM: the workers end their step, then the
# shards write their checkpoints; shards and workers of CONFIG run
# otherwise get the same, workers first); the old shards' files are moved
# into CKPT_DIR/reshard-from-N.TIME, the new shards start from them
# (ps-server --reshard-from) and the run goes on as `ps-local.sh
# NEW_CONFIG` would: the workers, restarted, resume at the checkpoint's
# clock. What moved is printed once the new shards listen.
# A crash at any step of a re-shard ends on the old map or the new one:
# before each step a line goes into CKPT_DIR/reshard.intent (stopping,
# from, stopped, commit, done), and the next ps-local.sh of either config
# (not --workers-only) finishes an interrupted one before it starts a
# shard: rolled back to CONFIG before the commit (the old checkpoints put
# back), forward to NEW_CONFIG after it (docs/reliability.md, "Re-sharding
# interrupted by a crash"). A reshard while such a record is open is refused.
# Exit status: 0 when every worker succeeded and every shard running at the
# end stopped cleanly (a shard that died during the run and was restarted
# is reported, not counted against the run); 1 otherwise.
# Authentication (security.auth, on by default): when the config's secret
# file (security.secret_file, else $PS_SECRET_FILE) does not exist yet, a
# new one is generated there (scripts/ps-keygen); when neither names one,
# in DIR/ps.secret, handed to every process through PS_SECRET_FILE. With
# cluster.replicas: 1 the shards' replication key likewise
# (security.repl_key_file, else $PS_REPL_KEY_FILE, else DIR/ps.replkey),
# handed to the ps-server processes alone (--repl-key-file).
set -uo pipefail
# In the source tree this is scripts/ps-local.sh (programs in ../bin); once
# installed, PREFIX/bin/ps-local.sh (programs beside it, ps-lib.sh in
# PREFIX/lib/ps).
self=$(cd "$(dirname "$0")" && pwd)
here=$(cd "$self/.." && pwd)
lib=$self/ps-lib.sh
[ -r "$lib" ] || lib=$here/lib/ps/ps-lib.sh
. "$lib"
BIN=${PS_BIN:-$here/bin}

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }
[ $# -ge 1 ] || { usage >&2; exit 2; }
case "$1" in
  -h|--help) usage; exit 0 ;;
  --version) "$BIN/ps-server" --version | sed '1s/^ps-server/ps-local.sh/'; exit "${PIPESTATUS[0]}" ;;
esac
CONFIG=$1; shift
RESHARD_TO=""
if [ "${1:-}" = reshard ]; then
  RESHARD_TO=${2:?reshard needs NEW_CONFIG}; shift 2
fi
LOGDIR="" MODE=all WORKER_CMD="" RESTART=0
while [ $# -gt 0 ]; do
  case "$1" in
    --logs) LOGDIR=$2; shift 2 ;;
    --worker-cmd) WORKER_CMD=${2:?--worker-cmd needs a command}; shift 2 ;;
    --servers-only) MODE=servers; shift ;;
    --restart) RESTART=1; shift ;;
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

# ---- reshard: stop CONFIG's cluster, set its checkpoints aside, go on with NEW_CONFIG ----
reshard_args=()
# pids of program NAME (ps-server, ps-worker) whose --config is the file
# CONFIG, however either path is written (relative to the process's own
# folder, or through links)
pids_of() {
  local pid got want
  want=$(realpath -m -- "$2")
  for pid in $(pgrep -x "$1" 2>/dev/null); do
    got=$(tr '\0' '\n' 2>/dev/null <"/proc/$pid/cmdline" | sed -n '/^--config$/{n;p;q}') || continue
    [ -n "$got" ] || continue
    case $got in
      /*) ;;
      *) got=$(readlink "/proc/$pid/cwd" 2>/dev/null)/$got || continue ;;
    esac
    [ "$(realpath -m -- "$got")" = "$want" ] && echo "$pid"
  done
}
# waits (300 s at most) until none of the pids runs; 1 when some still do
wait_gone() {
  local p t
  for ((t = 0; t < 3000; t++)); do
    for p in "$@"; do kill -0 "$p" 2>/dev/null && break; p=""; done
    [ -z "$p" ] && return 0
    sleep 0.1
  done
  return 1
}
# after a failed start of the new shards: where the old checkpoints are
reshard_hint() {
  [ ${#reshard_args[@]} -gt 0 ] || return 0
  echo "ps-local.sh: reshard: the re-shard passed its commit (${INTENT:-checkpoint.dir}/reshard.intent):" \
    "the old checkpoints stay in ${reshard_args[1]}; once the cause is fixed, the next" \
    "ps-local.sh of either config starts the new shards from them again (by hand: ps-server" \
    "--config $CONFIG --shard K ${reshard_args[*]}${backup_lines:+, each backup with --replica 1 too});" \
    "to go back to $CONFIG_OLD instead, move them back into checkpoint.dir and remove the record" >&2
}
# the new shards of a re-shard by restart (or of one rolled forward) did
# not start and are stopped: roll back when nothing of the new map exists
reshard_failed() {
  [ -n "$INTENT" ] && rollback_unstarted "$INTENT" && {
    echo "ps-local.sh: reshard: rolled back to $CONFIG_OLD: no new shard started or wrote a" \
      "checkpoint, and the old checkpoints are back in $INTENT; fix the cause (the new shards'" \
      "logs above) and re-shard again" >&2
    return
  }
  reshard_hint
}
# ---- the re-shard's intent record (docs/reliability.md, "Re-sharding
# interrupted by a crash") ----
# CKPT_DIR/reshard.intent: the coordinator (the ps-local.sh that re-shards)
# adds a line before each step, the whole record written, fsync'ed and
# renamed into place (a crash leaves the record before or after a line,
# never half of one):
#   stopping OLD_N NEW_N, old_config P, new_config P, follow P (the file the
#     workers follow, or none), pid P (the coordinator)
#                      the old shards are about to be stopped at a clock
#   staging            (live, a pre-copy) the old shards are about to write
#                      a full checkpoint each (SIGUSR1) and the new shards to
#                      start staged from them (--reshard-stage: they write
#                      nothing, listen to nobody and die with this process)
#   from DIR           the old checkpoints are about to move into DIR
#   stopped [B]        every old shard stopped with its checkpoint (at clock
#                      B), all set aside in DIR
#   commit             the commit point: the new shards are about to start
#                      from DIR
#   done [rolled-back|refused]
# A record without `done` is finished by the next ps-local.sh of either
# config (intent_recover): without `commit` it rolls back to the old map,
# with `commit` it rolls forward to the new one.
INTENT="" # the checkpoint folder whose record this run ends once its shards listen
intent_add() { # CKDIR LINE...: the lines appended to the record
  local d=$1 f=$1/reshard.intent
  shift
  { cat "$f" 2>/dev/null; printf '%s\n' "$@"; } >"$f.tmp" && sync "$f.tmp" && mv "$f.tmp" "$f" &&
    sync "$d" && return 0
  echo "ps-local.sh: reshard: cannot write the intent record $f" >&2
  return 1
}
intent_new() { rm -f "$1/reshard.intent" && intent_add "$@"; }
intent_get() { sed -n "s/^$2 //p" "$1/reshard.intent" 2>/dev/null | tail -n 1; }
intent_has() { grep -qE "^$2( |\$)" "$1/reshard.intent" 2>/dev/null; }
intent_open() { [ -f "$1/reshard.intent" ] && ! intent_has "$1" done; }
# the workers' $PS_CONFIG_FOLLOW file FILE pointed at CONFIG (whole, renamed)
point_follow() { realpath "$2" >"$1.tmp" && mv "$1.tmp" "$1"; }
# Tests only (it_reshard_crash.sh): $PS_LOCAL_CRASH_AT names a step at which
# this process kills itself with SIGKILL, as a crash there would.
crash_point() {
  [ "${PS_LOCAL_CRASH_AT:-}" = "$1" ] || return 0
  echo "ps-local.sh: PS_LOCAL_CRASH_AT=$1: killed here with SIGKILL (a test)" >&2
  kill -KILL $$
}
# why the re-shard recorded in CKDIR cannot start now, or nothing: its
# coordinator still runs, or it was interrupted (the next start finishes it)
intent_busy() {
  local pid
  intent_open "$1" || return 0
  pid=$(intent_get "$1" pid)
  if [ -n "$pid" ] && [[ $(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") == *ps-local.sh* ]]; then
    echo "a re-shard is in progress (ps-local.sh pid $pid, $1/reshard.intent)"
  else
    echo "a re-shard was interrupted ($1/reshard.intent): start ps-local.sh with either config" \
      "first (it completes the re-shard or rolls it back)"
  fi
}
# Puts the old checkpoints set aside in FROM ($2) back into CKDIR ($1),
# where they were; 1 (with the reason) when a file of the name is there.
put_back() {
  local f
  [ -n "$2" ] && [ -d "$2" ] || return 0
  for f in "$2"/* "$2"/older/*; do
    [ -f "$f" ] || continue
    [ -e "$1/${f##*/}" ] && { echo "ps-local.sh: $1/reshard.intent: cannot put $f back:" \
      "$1/${f##*/} exists (docs/reliability.md)" >&2; return 1; }
    mv "$f" "$1/" || return 1
  done
  rmdir "$2/older" "$2" 2>/dev/null
  return 0
}
# After the commit, the new shards all ended without starting: when none
# wrote a checkpoint of the new map into CKDIR ($1) nothing of it exists
# (a new shard writes its own, or its marker shard-K.reshard, before it
# listens, so no worker used it),
# and the re-shard rolls back: the old files are put back and the record
# ended. 0 rolled back, 1 not (the record stays at commit).
rollback_unstarted() {
  local f from
  for f in "$1"/shard-*; do [ -e "$f" ] && return 1; done
  from=$(intent_get "$1" from)
  put_back "$1" "$from" && intent_add "$1" "done rolled-back"
}
# Finishes the re-shard an unfinished record in CKDIR ($1) describes before
# this run starts shards: without `commit` the old checkpoints go back where
# they were and CONFIG becomes the old config; with it CONFIG becomes the new
# one and its shards start from the old checkpoints (reshard_args), the
# record ended once they listen. Either way the workers' follow file is
# pointed at CONFIG. Exits 1 when the coordinator still runs or a shard of
# either map still listens.
intent_recover() {
  local ck=$1 rec=$1/reshard.intent pid old new from follow f t busy old_n new_n
  intent_open "$ck" || return 0
  pid=$(intent_get "$ck" pid)
  if [ -n "$pid" ] && [[ $(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") == *ps-local.sh* ]]; then
    echo "ps-local.sh: a re-shard is in progress (ps-local.sh pid $pid, $rec): wait for it to end" >&2
    exit 1
  fi
  read -r _ old_n new_n < <(grep '^stopping ' "$rec")
  old=$(intent_get "$ck" old_config) new=$(intent_get "$ck" new_config)
  from=$(intent_get "$ck" from) follow=$(intent_get "$ck" follow)
  [ -r "$old" ] && [ -r "$new" ] || { echo "ps-local.sh: $rec: an interrupted re-shard" \
    "between $old and $new, one of which cannot be read: finish it by hand (docs/reliability.md)" >&2; exit 1; }
  # a shard of either map that still runs (its stop committed, not yet
  # exited) holds its port: 10 s to go, else refused
  for ((t = 0; t < 100; t++)); do
    busy=""
    while read -r _ host port; do
      h=${host#[}; h=${h%]}
      (exec 3<>"/dev/tcp/$h/$port") 2>/dev/null && busy="$host:$port"
    done < <("$BIN/ps-server" --config "$old" --list-shards; "$BIN/ps-server" --config "$new" --list-shards)
    [ -z "$busy" ] && break
    sleep 0.1
  done
  [ -z "$busy" ] || { echo "ps-local.sh: $rec: an interrupted re-shard, and a shard still listens at" \
    "$busy: stop it (SIGTERM) and start again" >&2; exit 1; }
  if ! intent_has "$ck" commit; then
    put_back "$ck" "$from" || exit 1
    [ -n "$follow" ] && [ -f "$follow" ] && point_follow "$follow" "$old"
    intent_add "$ck" "done rolled-back" || exit 1
    echo "ps-local.sh: an interrupted re-shard ($old_n -> $new_n shards, $rec) had not reached its" \
      "commit: rolled back; the $old_n old shards start again from their checkpoints with $old"
    CONFIG=$old
  else
    echo "ps-local.sh: an interrupted re-shard ($old_n -> $new_n shards, $rec) had passed its" \
      "commit: rolled forward; the $new_n new shards start from the old checkpoints in $from with $new"
    CONFIG=$new CONFIG_OLD=$old INTENT=$ck
    reshard_args=(--reshard-from "$from" --reshard-shards "$old_n")
  fi
}
# The running ps-local.sh of CONFIG (pids in $1, its shards in $2) re-shards
# while its workers run: asked here, the outcome printed, and this process
# exits with its status. Returns when it cannot (--restart, none or
# several running, one of a build without it).
live_reshard_ask() {
  local l s ctl rc msg t
  [ "$RESTART" = 0 ] || return 0
  l=($1) s=($2)
  [ ${#l[@]} -eq 1 ] && [ ${#s[@]} -gt 0 ] || return 0
  ctl=$(tr '\0' '\n' 2>/dev/null <"/proc/${s[0]}/environ" | sed -n 's/^PS_LOCAL_CTL=//p')
  [ -n "$ctl" ] && [ -d "$ctl" ] || return 0
  rm -f "$ctl/reshard-result"
  realpath "$RESHARD_TO" >"$ctl/reshard-request.tmp" && mv "$ctl/reshard-request.tmp" "$ctl/reshard-request" || exit 1
  echo "ps-local.sh: reshard: asking the ps-local.sh of $CONFIG (pid ${l[0]}) to re-shard while its workers run (its log: $ctl)"
  kill -USR1 "${l[0]}" || exit 1
  for ((t = 0; t < 6000; t++)); do # 600 s: the new shards load every old checkpoint
    [ -f "$ctl/reshard-result" ] && break
    kill -0 "${l[0]}" 2>/dev/null || { echo "ps-local.sh: reshard: ps-local.sh (pid ${l[0]}) ended" \
      "before it answered; see $ctl" >&2; exit 1; }
    sleep 0.1
  done
  [ -f "$ctl/reshard-result" ] || { echo "ps-local.sh: reshard: no answer within 600 s; see $ctl" >&2; exit 1; }
  read -r rc msg <"$ctl/reshard-result"
  echo "ps-local.sh: reshard: $msg"
  # 3: not built live for this config (shards of an earlier build), nothing changed
  [ "$rc" = 3 ] && { echo "ps-local.sh: reshard: re-sharding by restart instead"; return 0; }
  exit "$rc"
}
if [ -n "$RESHARD_TO" ]; then
  CONFIG_OLD=$CONFIG
  [ -r "$RESHARD_TO" ] || { echo "ps-local.sh: reshard: cannot read $RESHARD_TO" >&2; exit 2; }
  old_dump=$("$BIN/ps-server" --config "$CONFIG" --dump-config) || exit 2
  new_dump=$("$BIN/ps-server" --config "$RESHARD_TO" --dump-config) || exit 2
  key=$(cfg_first_diff "$old_dump" "$new_dump")
  if [ -n "$key" ]; then
    echo "ps-local.sh: reshard: $RESHARD_TO differs from $CONFIG in $key: a re-shard changes" \
      "cluster.servers (and cluster.backups) only" >&2
    exit 2
  fi
  ckdir=$(cfg_key "$old_dump" checkpoint dir)
  [ -n "$ckdir" ] || { echo "ps-local.sh: reshard: $CONFIG has no checkpoint.dir: the new shards" \
    "start from the old ones' checkpoints" >&2; exit 2; }
  old_n=$("$BIN/ps-server" --config "$CONFIG" --list-shards | wc -l)
  new_n=$("$BIN/ps-server" --config "$RESHARD_TO" --list-shards | wc -l)
  busy=$(intent_busy "$ckdir")
  [ -z "$busy" ] || { echo "ps-local.sh: reshard: $busy; nothing was done" >&2; exit 1; }
  # the running cluster: its ps-local.sh (the shards' parent) stops it as
  # Ctrl-C would; what else runs of CONFIG, workers first
  srv=$(pids_of ps-server "$CONFIG") launchers=""
  for p in $srv; do
    pp=$(awk '/^PPid:/ { print $2 }' "/proc/$p/status" 2>/dev/null)
    [ -n "$pp" ] && [[ $(tr '\0' ' ' 2>/dev/null <"/proc/$pp/cmdline") == *ps-local.sh* ]] &&
      launchers="$launchers $pp"
  done
  launchers=$(tr ' ' '\n' <<<"$launchers" | sort -u | tr '\n' ' ')
  live_reshard_ask "$launchers" "$srv" # exits when that ps-local.sh re-shards live
  intent_new "$ckdir" "stopping $old_n $new_n" "old_config $(realpath "$CONFIG")" \
    "new_config $(realpath "$RESHARD_TO")" "pid $$" || exit 1
  crash_point stopping
  if [ -n "${launchers// }" ]; then
    echo "ps-local.sh: reshard: stopping the ps-local.sh of $CONFIG (pid${launchers% }) at a clock boundary"
    kill -TERM $launchers 2>/dev/null
    wait_gone $launchers || { echo "ps-local.sh: reshard: ps-local.sh (pid$launchers) still runs" \
      "after 300 s; nothing was moved" >&2; exit 1; }
  fi
  wrk=$(pids_of ps-worker "$CONFIG")
  if [ -n "$wrk" ]; then
    echo "ps-local.sh: reshard: stopping the workers of $CONFIG (pid $(echo $wrk))"
    kill -TERM $wrk 2>/dev/null
    wait_gone $wrk || { echo "ps-local.sh: reshard: workers still run after 300 s" >&2; exit 1; }
  fi
  srv=$(pids_of ps-server "$CONFIG")
  if [ -n "$srv" ]; then
    echo "ps-local.sh: reshard: stopping the shards of $CONFIG (pid $(echo $srv)): they write their checkpoints"
    kill -TERM $srv 2>/dev/null
    wait_gone $srv || { echo "ps-local.sh: reshard: shards still run after 300 s" >&2; exit 1; }
  fi
  for ((k = 0; k < old_n; k++)); do # with replicas either process's file of a pair
    [ -f "$ckdir/shard-$k.ckpt" ] || [ -f "$ckdir/shard-$k-r1.ckpt" ] || { echo "ps-local.sh:" \
      "reshard: $ckdir/shard-$k.ckpt is missing: every one of the $old_n old shards' checkpoints" \
      "is needed; nothing was moved" >&2; intent_add "$ckdir" "done refused"; exit 1; }
  done
  from=$ckdir/reshard-from-$old_n.$(date +%Y%m%dT%H%M%S)
  intent_add "$ckdir" "from $from" || exit 1
  mkdir "$from" || exit 1
  # the old shards' files, and any other shard's (an older run's: a new
  # shard would take one of its own map for this re-shard's) beside them
  mkdir "$from/older"
  for f in "$ckdir"/shard-*; do
    [ -e "$f" ] || continue
    k=${f##*/shard-}; k=${k%%[.-]*}
    if [[ $k =~ ^[0-9]+$ ]] && [ "$k" -lt "$old_n" ]; then mv "$f" "$from/"; else mv "$f" "$from/older/"; fi
  done
  rmdir "$from/older" 2>/dev/null
  intent_add "$ckdir" stopped || exit 1
  crash_point stopped
  intent_add "$ckdir" commit || exit 1
  crash_point commit
  INTENT=$ckdir
  echo "ps-local.sh: reshard: $old_n -> $new_n shards; the old checkpoints are in $from (kept:" \
    "remove them once the new shards have checkpointed)"
  reshard_args=(--reshard-from "$from" --reshard-shards "$old_n")
  CONFIG=$RESHARD_TO
fi

# an interrupted re-shard of this checkpoint folder is finished first
if [ -z "$RESHARD_TO" ] && [ "$MODE" != workers ]; then
  ck0=$(cfg_key "$("$BIN/ps-server" --config "$CONFIG" --dump-config 2>/dev/null)" checkpoint dir)
  [ -n "$ck0" ] && intent_recover "$ck0"
fi
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
    "$self/ps-keygen" "$secret" || exit 2
  fi
fi
# the replication key: only the shard processes get it (workers never do)
repl_key_args=()
if [ "$auth" = true ] && [ -n "$backup_lines" ]; then
  repl_key=$(cfg_key "$dump" security repl_key_file)
  repl_key=${repl_key:-${PS_REPL_KEY_FILE:-$LOGDIR/ps.replkey}}
  if [ ! -e "$repl_key" ]; then
    "$self/ps-keygen" "$repl_key" || exit 2
  fi
  repl_key_args=(--repl-key-file "$repl_key")
fi

# Workers share this machine's cores: give each one BLAS thread per core it
# can have, unless the caller chose (OPENBLAS_NUM_THREADS).
if [ -z "${OPENBLAS_NUM_THREADS:-}" ]; then
  t=$(( $(nproc) / (nworkers > 0 ? nworkers : 1) ))
  export OPENBLAS_NUM_THREADS=$(( t > 0 ? t : 1 ))
fi

server_pids=() server_names=() worker_pids=()
declare -A server_died=() # pid -> exit status, for shards that died during the run
status=0
# The shards of this config that run now but were not started here: a
# shard restarted by hand with the command ps-local.sh used.
adopted_servers() {
  local i pid args idx want
  for i in "${!server_pids[@]}"; do
    [ -n "${server_died[${server_pids[$i]}]:-}" ] || continue
    idx=${server_names[$i]#shard }; idx=${idx% r1}
    for pid in $(pgrep -x ps-server 2>/dev/null); do
      args=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") || continue
      case " $args" in *" --config $CONFIG --shard $idx "*) ;; *) continue ;; esac
      want=0; [[ ${server_names[$i]} == *r1 ]] && want=1
      have=0; [[ " $args" == *" --replica 1 "* ]] && have=1
      [ $want -eq $have ] && echo "$pid ${server_names[$i]}"
    done
  done
}
stop_servers() {
  local p i rc adopted
  adopted=$(adopted_servers)
  for i in "${!server_pids[@]}"; do
    p=${server_pids[$i]}
    [ -n "${server_died[$p]:-}" ] || kill -TERM "$p" 2>/dev/null
  done
  while read -r p name; do
    [ -n "$p" ] || continue
    echo "ps-local.sh: $name was restarted outside ps-local.sh (pid $p): stopping it too" >&2
    kill -TERM "$p" 2>/dev/null
  done <<<"$adopted"
  for i in "${!server_pids[@]}"; do
    p=${server_pids[$i]}
    if [ -n "${server_died[$p]:-}" ]; then
      echo "ps-local.sh: ${server_names[$i]} had died during the run (status ${server_died[$p]})" >&2
      continue
    fi
    wait "$p"; rc=$?
    [ $rc -eq 0 ] || { echo "ps-local.sh: ${server_names[$i]} exited with status $rc" >&2; status=1; }
  done
  while read -r p name; do # not our child: wait until it is gone (60 s at most)
    [ -n "$p" ] || continue
    for ((t = 0; t < 600; t++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$p" 2>/dev/null && { echo "ps-local.sh: $name (pid $p) did not stop" >&2; status=1; }
  done <<<"$adopted"
  server_pids=() server_names=()
}
on_signal() {
  echo >&2
  echo "ps-local.sh: stopping every process" >&2
  kill_jobs TERM "${worker_pids[@]}" # (those that ended were waited for already)
  for p in "${worker_pids[@]}"; do wait "$p" 2>/dev/null; done
  worker_pids=()
  stop_servers
  exit 130
}
trap on_signal INT TERM

# ---- re-sharding while the workers run (docs/elastic.md) ----
# The workers follow DIR/current-config (libps: $PS_CONFIG_FOLLOW); the
# shards carry PS_LOCAL_CTL=DIR in their environment, which is how
# `ps-local.sh CONFIG reshard NEW` finds this process's folder; it writes
# DIR/reshard-request (NEW's path) and sends SIGUSR1; live_reshard answers
# in DIR/reshard-result ("STATUS message").
export PS_LOCAL_CTL=$LOGDIR PS_CONFIG_FOLLOW=$LOGDIR/current-config
realpath "$CONFIG" >"$LOGDIR/current-config"
reshard_req=0 reshards=0
trap 'reshard_req=1' USR1
# Starts shard processes of config $1 for the lines of $2 ("idx host port",
# or "idx host port r1" for a pair's backup process, --replica 1), with the
# arguments after, their logs appended to DIR/server-K.log (server-K-r1.log;
# $spawn_suffix appended to the name when set); their pids and names in
# spawned/spawned_names.
spawn_shards() {
  local cfg=$1 lines=$2 idx host port rep
  shift 2
  spawned=() spawned_names=()
  while read -r idx host port rep; do
    [ -n "$idx" ] || continue
    if [ "$rep" = r1 ]; then
      "$BIN/ps-server" --config "$cfg" --shard "$idx" --replica 1 ${repl_key_args[@]+"${repl_key_args[@]}"} \
        "$@" >>"$LOGDIR/server-$idx-r1.log${spawn_suffix:-}" 2>&1 &
      spawned+=($!) spawned_names+=("shard $idx r1")
    else
      "$BIN/ps-server" --config "$cfg" --shard "$idx" ${repl_key_args[@]+"${repl_key_args[@]}"} \
        "$@" >>"$LOGDIR/server-$idx.log${spawn_suffix:-}" 2>&1 &
      spawned+=($!) spawned_names+=("shard $idx")
    fi
  done <<<"$lines"
}
# Every process of config $1 as spawn_shards takes them: the shards, then
# with cluster.replicas: 1 their backups (marked r1).
process_lines() {
  local l b
  l=$("$BIN/ps-server" --config "$1" --list-shards 2>&1) || { echo "$l"; return 1; }
  b=$("$BIN/ps-server" --config "$1" --list-backups 2>&1) || { echo "$b"; return 1; }
  printf '%s\n' "$l"
  [ -z "$b" ] || sed 's/$/ r1/' <<<"$b"
}
# Waits (600 s at most: new shards load every old checkpoint first) until
# every address of the lines $1 listens; 1 when one of the pids after exits
# first or the time runs out.
wait_listening() {
  local lines=$1 n up t p h idx host port rep
  shift
  n=$(printf '%s\n' "$lines" | wc -l)
  for ((t = 0; t < 30000; t++)); do # 600 s in steps of 0.02 s: the pause of a re-shard counts them
    up=0
    while read -r idx host port rep; do
      h=${host#[}; h=${h%]}
      (exec 3<>"/dev/tcp/$h/$port") 2>/dev/null && up=$((up + 1))
    done <<<"$lines"
    [ "$up" -ge "$n" ] && return 0
    for p in "$@"; do kill -0 "$p" 2>/dev/null || return 1; done
    sleep 0.02
  done
  return 1
}
# The pre-copy (docs/elastic.md, "The pause"): while the workers still
# run, each old shard writes a full checkpoint (SIGUSR1; the forked writer
# for a big state, so training goes on) and NEW's shards start staged from
# them (--reshard-stage, logging to server-K.log.staged): they load the old
# files now and, at the commit, apply only the stop's incremental
# checkpoints (the rows changed since). For a config with embedding tables,
# without cluster.replicas, logging at warn or more (the lines waited for),
# unless PS_LOCAL_PRECOPY=0. Args: NEW NEW_LINES FROM OLD_N. Sets
# staged_pids/staged_names (empty: not staged, the re-shard goes on
# unstaged); 1 when the intent record cannot be written.
precopy_stage() {
  local new=$1 lines=$2 from=$3 old_n=$4 i f t l idx host port
  local -a offs=()
  staged_pids=() staged_names=()
  [ "${PS_LOCAL_PRECOPY:-1}" != 0 ] && [ "$(cfg_key "$dump" cluster replicas)" = 0 ] &&
    grep -q '^    - name: ' <<<"$(sed -n '/^  embeddings:/,/^  [a-z]/p' <<<"$dump")" || return 0
  case $(cfg_key "$dump" log level) in debug | info | warn) ;; *) return 0 ;; esac
  intent_add "$ckdir" staging || return 1
  for i in "${!server_pids[@]}"; do
    f=$LOGDIR/server-${server_names[$i]#shard }.log
    offs[$i]=$(stat -c %s "$f" 2>/dev/null || echo 0)
    kill -USR1 "${server_pids[$i]}" 2>/dev/null
  done
  # each old shard's pre-copy checkpoint written (600 s at most)
  for i in "${!server_pids[@]}"; do
    f=$LOGDIR/server-${server_names[$i]#shard }.log
    for ((t = 0; ; t++)); do
      l=$(tail -c +$((offs[$i] + 1)) "$f" 2>/dev/null |
        grep -m 1 -E 'checkpoint \(re-shard pre-copy\)|pre-copy \(SIGUSR1\) not taken')
      case $l in
        *"pre-copy) written"*) break ;;
        ?*) echo "ps-local.sh: reshard: not staged (${server_names[$i]}: ${l#* server\[*\] })" >&2; return 0 ;;
      esac
      if [ $t -ge 30000 ] || ! kill -0 "${server_pids[$i]}" 2>/dev/null; then
        echo "ps-local.sh: reshard: not staged: ${server_names[$i]} wrote no pre-copy checkpoint" >&2
        return 0
      fi
      sleep 0.02
    done
  done
  while read -r idx host port; do rm -f "$LOGDIR/server-$idx.log.staged"; done <<<"$lines"
  spawn_suffix=.staged spawn_shards "$new" "$lines" --reshard-from "$from" --reshard-shards "$old_n" \
    --reshard-stage $$
  staged_pids=("${spawned[@]}") staged_names=("${spawned_names[@]}")
  crash_point staged
  # each staged shard loaded the old files (600 s at most)
  i=0
  while read -r idx host port; do
    f=$LOGDIR/server-$idx.log.staged
    for ((t = 0; ; t++)); do
      grep -q 're-shard staged' "$f" 2>/dev/null && break
      if [ $t -ge 30000 ] || ! kill -0 "${staged_pids[$i]}" 2>/dev/null; then
        echo "ps-local.sh: reshard: not staged: new shard $idx did not load the old files (log: $f):" \
          "$(grep -m 1 'refusing to start' "$f" 2>/dev/null || tail -n 1 "$f" 2>/dev/null)" >&2
        precopy_cancel
        return 0
      fi
      sleep 0.02
    done
    i=$((i + 1))
  done <<<"$lines"
  if [ "${PS_LOCAL_CRASH_AT:-}" = staged-shard ]; then # tests only: a staged shard dies
    echo "ps-local.sh: PS_LOCAL_CRASH_AT=staged-shard: new ${staged_names[0]} (staged) killed with SIGKILL (a test)" >&2
    kill -KILL "${staged_pids[0]}"
  fi
  echo "ps-local.sh: reshard: pre-copy: the old shards wrote their checkpoints and the $((i)) new" \
    "shard(s) loaded them while the workers ran" >&2
}
# Stops the staged shards (they wrote nothing) when the re-shard does not
# go on to its commit.
precopy_cancel() {
  local p
  kill_jobs TERM ${staged_pids[@]+"${staged_pids[@]}"} # (those not waited for yet)
  for p in ${staged_pids[@]+"${staged_pids[@]}"}; do wait "$p" 2>/dev/null; done
  staged_pids=() staged_names=()
}
live_reshard() {
  local -a plogs
  local new new_lines new_all old_all new_n old_n=$nshards ckdir from k f p i rc b t t0 failed why busy pids=() names=()
  local -a staged_pids=() staged_names=()
  local -A pair_ok=() pair_bad=() again=()
  local restarted res=$LOGDIR/reshard-result
  answer() { echo "ps-local.sh: reshard: ${*:2}" >&2; printf '%s\n' "$*" >"$res.tmp" && mv "$res.tmp" "$res"; }
  new=$(cat "$LOGDIR/reshard-request" 2>/dev/null); rm -f "$LOGDIR/reshard-request"
  [ -n "$new" ] && [ -r "$new" ] || { answer 2 "cannot read the new config '$new'"; return; }
  new_lines=$("$BIN/ps-server" --config "$new" --list-shards 2>&1) || { answer 2 "$new: $new_lines"; return; }
  new_n=$(printf '%s\n' "$new_lines" | wc -l)
  # with cluster.replicas: 1 both processes of every pair (old and new)
  new_all=$(process_lines "$new") || { answer 2 "$new: $new_all"; return; }
  old_all=$(process_lines "$CONFIG") || { answer 2 "$CONFIG: $old_all"; return; }
  ckdir=$(cfg_key "$dump" checkpoint dir)
  busy=$(intent_busy "$ckdir")
  [ -z "$busy" ] || { answer 1 "$busy; the run goes on with $CONFIG"; return; }
  intent_new "$ckdir" "stopping $old_n $new_n" "old_config $(realpath "$CONFIG")" "new_config $new" \
    "follow $LOGDIR/current-config" "pid $$" || { answer 1 "cannot write $ckdir/reshard.intent"; return; }
  crash_point stopping
  from=$ckdir/reshard-from-$old_n.$(date +%Y%m%dT%H%M%S)
  precopy_stage "$new" "$new_all" "$from" "$old_n" || { answer 1 "cannot write $ckdir/reshard.intent"; return; }
  echo "ps-local.sh: reshard: stopping the $old_n shard(s) at a clock boundary; the workers keep running" >&2
  t0=$(date +%s%N)
  if ! "$BIN/ps-stat" --config "$CONFIG" --reshard-stop >"$LOGDIR/reshard-stop.out" 2>&1; then
    rc=1 # 3: the shards cannot stop live (not built for this config): nothing changed
    grep -q "while the workers run is not built" "$LOGDIR/reshard-stop.out" && rc=3
    precopy_cancel
    intent_add "$ckdir" "done refused"
    answer $rc "$(tail -n 1 "$LOGDIR/reshard-stop.out"); the run goes on with $CONFIG"
    return
  fi
  b=$(sed -n 's/.*stops at clock \([0-9]*\).*/\1/p' "$LOGDIR/reshard-stop.out")
  if [ "${PS_LOCAL_CRASH_AT:-}" = stop-shard ]; then # tests only: an old shard dies at its stop
    echo "ps-local.sh: PS_LOCAL_CRASH_AT=stop-shard: ${server_names[-1]} killed with SIGKILL (a test)" >&2
    kill -KILL "${server_pids[-1]}"
  fi
  # each old shard closes the clocks below b, writes its checkpoint and
  # exits 0; with cluster.replicas: 1 both processes of a pair do (the
  # backup follows its primary's stop through replication, server/stop.c),
  # and a pair of which one process did is whole: the re-shard reads the
  # newer file of each pair
  failed=""
  for i in "${!server_pids[@]}"; do
    p=${server_pids[$i]} rc=${server_died[${server_pids[$i]}]:-}
    [ -n "$rc" ] || { wait "$p"; rc=$?; }
    k=${server_names[$i]#shard }; k=${k% r1}
    if [ "$rc" -eq 0 ]; then pair_ok[$k]=1; else
      f=$LOGDIR/server-${server_names[$i]#shard }.log
      pair_bad[$k]="${pair_bad[$k]:-}, ${server_names[$i]} with status $rc (log: ${f// r1/-r1})"
    fi
  done
  for k in "${!pair_bad[@]}"; do
    if [ -n "${pair_ok[$k]:-}" ]; then
      echo "ps-local.sh: reshard: ${pair_bad[$k]#, } at the stop; its partner wrote the pair's" \
        "checkpoint at clock $b: going on" >&2
    else
      failed="$failed${pair_bad[$k]}"
    fi
  done
  server_pids=() server_names=()
  if [ -n "$failed" ]; then
    # Roll back (no commit yet): nothing was moved, the old map's shards
    # start again from their own checkpoints, the workers never left it.
    precopy_cancel
    spawn_shards "$CONFIG" "$old_all"
    server_pids=("${spawned[@]}") server_names=("${spawned_names[@]}")
    if ! wait_listening "$old_all" "${server_pids[@]}"; then
      answer 1 "old shard(s) died at the stop (${failed#, }), and the old shards did not start again" \
        "from their checkpoints (logs: $LOGDIR/server-*.log); the re-shard is not done" \
        "($ckdir/reshard.intent: the next ps-local.sh of $CONFIG rolls it back)"
      return
    fi
    intent_add "$ckdir" "done rolled-back"
    answer 1 "rolled back to $CONFIG: an old shard died at the stop at clock $b: ${failed#, }; the" \
      "$old_n old shards started again from their checkpoints, those that wrote theirs at the stop" \
      "from clock $b, one that died before from its last one (its updates since are lost, as in any" \
      "crash of an unreplicated shard); the workers go on with $CONFIG"
    return
  fi
  reshards=$((reshards + 1))
  intent_add "$ckdir" "from $from" || { answer 1 "cannot write $ckdir/reshard.intent"; return; }
  mkdir -p "$from/older" || { answer 1 "cannot make $from"; return; }
  for f in "$ckdir"/shard-*; do
    [ -e "$f" ] || continue
    k=${f##*/shard-}; k=${k%%[.-]*}
    if [[ $k =~ ^[0-9]+$ ]] && [ "$k" -lt "$old_n" ]; then mv "$f" "$from/"; else mv "$f" "$from/older/"; fi
  done
  rmdir "$from/older" 2>/dev/null
  intent_add "$ckdir" "stopped $b" || { answer 1 "cannot write $ckdir/reshard.intent"; return; }
  crash_point stopped
  intent_add "$ckdir" commit || { answer 1 "cannot write $ckdir/reshard.intent"; return; }
  crash_point commit
  for f in "$LOGDIR"/server-*.log; do [ -e "$f" ] && mv "$f" "$f.before-reshard-$reshards"; done
  if [ ${#staged_pids[@]} -gt 0 ]; then
    # staged: told to go on (a staged shard that died is started again
    # below, unstaged, as any new shard that ended)
    for f in "$LOGDIR"/server-*.log.staged; do [ -e "$f" ] && mv "$f" "${f%.staged}"; done
    kill -USR1 "${staged_pids[@]}" 2>/dev/null
    pids=("${staged_pids[@]}") names=("${staged_names[@]}")
    staged_pids=() staged_names=()
  else
    spawn_shards "$new" "$new_all" --reshard-from "$from" --reshard-shards "$old_n"
    pids=("${spawned[@]}") names=("${spawned_names[@]}")
  fi
  # Past the commit the new map is the only way on: a new shard that dies
  # before the workers are pointed at it starts again once with the same
  # flags (from its own checkpoint of the new map when it wrote one, else
  # from the old files: the same state either way). Each shard once,
  # whenever it ends: wait_listening returns at the first that ends, while
  # others may be about to.
  t=0
  while :; do
    wait_listening "$new_all" "${pids[@]}"
    [ "$t" = 0 ] && [ "${PS_LOCAL_CRASH_AT:-}" = new-shard ] && { # tests only
      echo "ps-local.sh: PS_LOCAL_CRASH_AT=new-shard: ${names[0]} killed with SIGKILL (a test)" >&2
      kill -KILL "${pids[0]}"; wait "${pids[0]}" 2>/dev/null; }
    t=1 failed="" restarted=0
    for i in "${!pids[@]}"; do
      kill -0 "${pids[$i]}" 2>/dev/null && continue
      wait "${pids[$i]}"; rc=$?
      if [ -n "${again[$i]:-}" ]; then failed="$failed, ${names[$i]} (status $rc)"; continue; fi
      echo "ps-local.sh: reshard: new ${names[$i]} ended with status $rc before the workers were" \
        "pointed at it: starting it again with the same flags" >&2
      spawn_shards "$new" "$(sed -n "$((i + 1))p" <<<"$new_all")" --reshard-from "$from" --reshard-shards "$old_n"
      pids[$i]=${spawned[0]} again[$i]=1 restarted=1
    done
    [ -z "$failed" ] && [ "$restarted" = 1 ] || break
  done
  server_pids=("${pids[@]}") server_names=("${names[@]}")
  if [ -n "$failed" ] || ! wait_listening "$new_all" "${pids[@]}"; then
    # none wrote its checkpoint of the new map: stopped, and rolled back.
    # Decided once every new shard has ended: one still starting when
    # another failed may be writing into the folder
    if ! compgen -G "$ckdir/shard-*" >/dev/null; then
      kill_jobs TERM "${pids[@]}" # (the failed ones were waited for above)
      for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
      server_pids=() server_names=()
    fi
    if [ ${#server_pids[@]} -eq 0 ] && ! compgen -G "$ckdir/shard-*" >/dev/null; then
      if rollback_unstarted "$ckdir"; then
        # the first new shard's reason, before the old shards' lines follow
        # it in the same logs (old files that differ in their declarations:
        # a worker died mid-declaration at the stop, docs/elastic.md)
        why=$(grep -h -m 1 'refusing to start' "$LOGDIR"/server-*.log 2>/dev/null | head -n 1)
        spawn_shards "$CONFIG" "$old_all"
        server_pids=("${spawned[@]}") server_names=("${spawned_names[@]}")
        wait_listening "$old_all" "${server_pids[@]}"
        answer 1 "rolled back to $CONFIG: the new shards did not start (${failed:+${failed#, }; }${why:+${why#* error }; }logs:" \
          "$LOGDIR/server-*.log) and none wrote a checkpoint; the old shards started again from" \
          "their checkpoints at clock $b; the workers go on with $CONFIG"
        return
      fi
    fi
    answer 1 "the new shards did not start (${failed:+${failed#, }; }logs: $LOGDIR/server-*.log); the re-shard" \
      "passed its commit ($ckdir/reshard.intent): the old checkpoints are in $from, and the next" \
      "ps-local.sh of either config starts the new shards from them again"
    return
  fi
  CONFIG=$new shard_lines=$new_lines nshards=$new_n
  backup_lines=$("$BIN/ps-server" --config "$CONFIG" --list-backups)
  dump=$("$BIN/ps-server" --config "$CONFIG" --dump-config)
  point_follow "$LOGDIR/current-config" "$CONFIG"
  intent_add "$ckdir" done
  t0=$(( ($(date +%s%N) - t0) / 1000000 ))
  plogs=() # the backups load the same: only the primaries' lines are summed
  for ((k = 0; k < new_n; k++)); do plogs+=("$LOGDIR/server-$k.log"); done
  answer 0 "$old_n -> $new_n shards at clock $b while the workers ran, $((t0 / 1000)).$(printf '%03d' $((t0 % 1000))) s" \
    "from the stop to the new shards listening; $(reshard_summary "${plogs[@]}");" \
    "the old checkpoints are in $from (kept: remove them once the new shards have checkpointed)"
}

echo "ps-local.sh: $nshards shard(s), $nworkers worker(s) from $CONFIG; logs in $LOGDIR"
if [ "$MODE" != workers ]; then
  while read -r idx host port; do
    "$BIN/ps-server" --config "$CONFIG" --shard "$idx" ${repl_key_args[@]+"${repl_key_args[@]}"} \
      ${reshard_args[@]+"${reshard_args[@]}"} >"$LOGDIR/server-$idx.log" 2>&1 &
    server_pids+=($!) server_names+=("shard $idx")
  done <<<"$shard_lines"
  if [ -n "$backup_lines" ]; then
    while read -r idx host port; do
      "$BIN/ps-server" --config "$CONFIG" --shard "$idx" --replica 1 \
        ${repl_key_args[@]+"${repl_key_args[@]}"} ${reshard_args[@]+"${reshard_args[@]}"} \
        >"$LOGDIR/server-$idx-r1.log" 2>&1 &
      server_pids+=($!) server_names+=("shard $idx r1")
    done <<<"$backup_lines"
  fi
  # Wait (up to 10 s; 600 s re-sharding, which loads every old shard's
  # checkpoint first) until every shard (and backup) accepts connections on its port.
  all_lines=$shard_lines${backup_lines:+$'\n'$backup_lines}
  nproc_srv=$(printf '%s\n' "$all_lines" | wc -l)
  limit=100; [ ${#reshard_args[@]} -gt 0 ] && limit=6000
  for ((t = 0; t < limit; t++)); do
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
      kill -0 "$p" 2>/dev/null || { echo "ps-local.sh: a shard failed to start:" >&2; cat "$LOGDIR"/server-*.log >&2; stop_servers; reshard_failed; exit 1; }
    done
    sleep 0.1
  done
  [ "$up" -ge "$nproc_srv" ] || { echo "ps-local.sh: shards did not start within $((limit / 10)) s" >&2; stop_servers; reshard_failed; exit 1; }
  if [ ${#reshard_args[@]} -gt 0 ]; then
    logs=() # the backups load the same, so only the primaries' places are summed
    for ((k = 0; k < nshards; k++)); do logs+=("$LOGDIR/server-$k.log"); done
    echo "ps-local.sh: reshard: $(reshard_summary "${logs[@]}")"
  fi
  if [ -n "$INTENT" ]; then # the new shards listen: the re-shard is done
    f=$(intent_get "$INTENT" follow)
    [ -n "$f" ] && [ -f "$f" ] && point_follow "$f" "$CONFIG"
    intent_add "$INTENT" done || exit 1
    INTENT=""
  fi
fi
if [ "$MODE" = servers ]; then
  echo "ps-local.sh: shards running; Ctrl-C stops them"
  while :; do
    sleep 1
    [ "$reshard_req" = 1 ] && { reshard_req=0; live_reshard; }
  done
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
# A shard that dies meanwhile is reported at once (not restarted).
running=("${worker_pids[@]}")
watched=("${server_pids[@]}")
while [ ${#running[@]} -gt 0 ]; do
  if [ "$reshard_req" = 1 ]; then
    reshard_req=0
    live_reshard
    watched=(${server_pids[@]+"${server_pids[@]}"})
    continue
  fi
  done_pid=""
  wait -n -p done_pid "${running[@]}" "${watched[@]}"; rc=$?
  [ -n "${done_pid:-}" ] || { [ "$reshard_req" = 1 ] && continue; break; }
  for i in "${!server_pids[@]}"; do
    [ "${server_pids[$i]}" = "$done_pid" ] || continue
    server_died[$done_pid]=$rc
    log=$LOGDIR/server-${server_names[$i]#shard }.log; log=${log// r1/-r1}
    echo "ps-local.sh: ${server_names[$i]} died with status $rc while the workers ran (log: $log);" \
      "it is not restarted: restart it by hand with the same command and the workers reconnect" >&2
  done
  if [ -n "${server_died[$done_pid]:-}" ]; then
    rest=()
    for p in "${watched[@]}"; do [ "$p" = "$done_pid" ] || rest+=("$p"); done
    watched=(${rest[@]+"${rest[@]}"})
    continue
  fi
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
