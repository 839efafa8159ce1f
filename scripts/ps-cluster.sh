#!/usr/bin/env bash
# ps-cluster.sh - starts or stops every process of a config on its hosts
# over ssh: shard K on the host cluster.servers[K] names, worker R on
# worker host R mod (number of worker hosts).
#
#   scripts/ps-cluster.sh CONFIG start|stop|status [options]
#
#   --worker-hosts H1,H2,..  where workers run (default: the shards' hosts)
#   --dir DIR                the project folder on every host (default: this
#                            one; CONFIG is given relative to it or absolute)
#   --logs DIR               log folder on every host (default: DIR/logs)
#   --ssh CMD                the ssh command (default: ssh -o BatchMode=yes)
#   --dry-run                print the commands instead of running them
#   -- WORKER_ARGS...        more ps-worker flags (--epochs 5, ...)
#
# start: shards first, then workers; each process runs under nohup with
# its log in the log folder. stop: SIGTERM to every process of CONFIG (the
# shards write their checkpoints if configured). status: which are running.
# Exit status: 0 when every command succeeded, 1 otherwise, 2 for usage.
# The cluster secret (security.secret_file) must be at the same path on
# every host, mode 0600: scripts/ps-keygen FILE, then copy it (scp -p).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/scripts/ps-lib.sh"

usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; }
[ $# -ge 1 ] || { usage >&2; exit 2; }
case "$1" in -h|--help) usage; exit 0 ;; esac
[ $# -ge 2 ] || { echo "ps-cluster.sh: give an action: start, stop or status" >&2; exit 2; }
CONFIG=$1 ACTION=$2; shift 2
case "$ACTION" in start|stop|status) ;; *)
  echo "ps-cluster.sh: unknown action '$ACTION' (start, stop or status)" >&2; exit 2 ;;
esac
DIR=$here LOGS="" WHOSTS="" DRY=0
SSH=${PS_SSH:-ssh -o BatchMode=yes}
while [ $# -gt 0 ]; do
  case "$1" in
    --worker-hosts) WHOSTS=$2; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    --logs) LOGS=$2; shift 2 ;;
    --ssh) SSH=$2; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    --) shift; break ;;
    *) echo "ps-cluster.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
WARGS=("$@")
LOGS=${LOGS:-$DIR/logs}
[ -r "$CONFIG" ] || { echo "ps-cluster.sh: cannot read $CONFIG" >&2; exit 2; }
SERVER=$here/bin/ps-server
[ -x "$SERVER" ] || { echo "ps-cluster.sh: $SERVER missing; run 'make' first" >&2; exit 2; }

# The config as the remote side sees it.
case "$CONFIG" in /*) RCONFIG=$CONFIG ;; *) RCONFIG=$DIR/$CONFIG ;; esac
shard_lines=$("$SERVER" --config "$CONFIG" --list-shards) || exit 2
dump=$("$SERVER" --config "$CONFIG" --dump-config) || exit 2
nworkers=$(cfg_key "$dump" cluster workers)
auth=$(cfg_key "$dump" security auth)
secret=$(cfg_key "$dump" security secret_file)
if [ "$ACTION" = start ] && [ "$auth" = true ] && [ -z "$secret" ]; then
  echo "ps-cluster.sh: $CONFIG has security.auth on but names no security.secret_file;" \
       "create one (scripts/ps-keygen FILE), copy it to every host and name it there" >&2
  exit 2
fi
mapfile -t shost < <(printf '%s\n' "$shard_lines" | awk '{print $2}')
if [ -n "$WHOSTS" ]; then
  IFS=, read -r -a whost <<< "$WHOSTS"
else
  whost=("${shost[@]}")
fi

q() { printf '%q' "$1"; }
status=0
remote() { # HOST COMMAND
  if [ $DRY -eq 1 ]; then
    printf "%s %s '%s'\n" "$SSH" "$1" "${2//\'/\'\\\'\'}"
    return 0
  fi
  $SSH "$1" "$2" || { echo "ps-cluster.sh: on $1: command failed: $2" >&2; status=1; }
}

# Every process is recognisable by its command line: the config path and
# its --shard / --rank.
server_cmd() { echo "$DIR/bin/ps-server --config $(q "$RCONFIG") --shard $1"; }
worker_cmd() {
  local extra="" a
  for a in "${WARGS[@]+"${WARGS[@]}"}"; do extra+=" $(q "$a")"; done
  echo "$DIR/bin/ps-worker --config $(q "$RCONFIG") --rank $1$extra"
}

shards() {
  for ((k = 0; k < ${#shost[@]}; k++)); do
    local h=${shost[$k]} c
    c=$(server_cmd $k)
    case $ACTION in
      start) remote "$h" "mkdir -p $(q "$LOGS") && cd $(q "$DIR") && nohup $c > $(q "$LOGS/server-$k.log") 2>&1 < /dev/null &" ;;
      stop) remote "$h" "pkill -TERM -f -- $(q "$c\$") || true" ;;
      status) remote "$h" "pgrep -f -- $(q "$c\$") > /dev/null && echo 'shard $k on $h: running' || echo 'shard $k on $h: not running'" ;;
    esac
  done
}
workers() {
  for ((r = 0; r < nworkers; r++)); do
    local h=${whost[$((r % ${#whost[@]}))]} c pat
    c=$(worker_cmd $r)
    pat="$DIR/bin/ps-worker --config $(q "$RCONFIG") --rank $r( |\$)"
    case $ACTION in
      start) remote "$h" "mkdir -p $(q "$LOGS") && cd $(q "$DIR") && nohup $c > $(q "$LOGS/worker-$r.log") 2>&1 < /dev/null &" ;;
      stop) remote "$h" "pkill -TERM -f -- $(q "$pat") || true" ;;
      status) remote "$h" "pgrep -f -- $(q "$pat") > /dev/null && echo 'worker $r on $h: running' || echo 'worker $r on $h: not running'" ;;
    esac
  done
}

case $ACTION in
  start)  # shards first, and let them listen before the workers connect
    shards; [ $DRY -eq 0 ] && sleep 1; workers ;;
  stop)   # workers first, so the shards' checkpoints hold their last clock
    workers; shards ;;
  status) shards; workers ;;
esac
exit $status
