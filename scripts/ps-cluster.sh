#!/usr/bin/env bash
# ps-cluster.sh - starts, stops or shows every process of a config on its
# hosts over ssh: shard K on the host cluster.servers[K] names, worker R on
# worker host R mod (number of worker hosts).
#
#   scripts/ps-cluster.sh CONFIG start|stop|status [options] [-- WORKER_ARGS...]
#   scripts/ps-cluster.sh CONFIG reshard NEW_CONFIG [--restart] [options] [-- WORKER_ARGS...]
#
#   --worker-hosts H1,H2,..  where workers run (start; default: the shards'
#                            hosts). stop and status use the hosts recorded
#                            at start; given there, it overrides them
#   --dir DIR                the project folder or install prefix on every
#                            host, holding bin/ps-server and bin/ps-worker
#                            (default: this one: the source tree, or PREFIX
#                            for PREFIX/bin/ps-cluster.sh); a relative CONFIG
#                            is taken relative to it in a source tree, to the
#                            current folder when installed
#   --logs DIR               where run folders go, on every host and here
#                            (default: DIR/logs in a source tree,
#                            $HOME/.local/state/ps/logs when installed; give
#                            stop and status the same, they find the run there)
#   --ssh CMD                the ssh command, split into words as the shell
#                            does (quotes work); default $PS_SSH, else
#                            ssh -o BatchMode=yes -o ConnectTimeout=10;
#                            run as CMD -- HOST SCRIPT (SCRIPT: POSIX sh)
#   --wait S                 start: seconds a shard has to listen (default
#                            30); stop: seconds a shard has to exit, its
#                            checkpoint included (default 300), and so
#                            at a live reshard's stop; a worker gets at
#                            most 15, then SIGKILL
#   --dry-run                print the commands that start would run
#   --worker-cmd CMD         start: each worker runs CMD (e.g. "python3
#                            train.py") through ps-worker --exec, with
#                            PS_CONFIG, PS_RANK and PS_NUM_WORKERS set
#   --reshard-from DIR --reshard-shards N
#                            start: every shard starts from the checkpoints of
#                            N shards in DIR on its host (ps-server
#                            --reshard-from; what reshard passes)
#   --live-run RUN           start: the shards only, in the run folder RUN
#                            here, whose workers run on and follow them
#                            (what reshard passes while the workers run)
#   --restart                reshard: by restart even where the workers
#                            could follow
#   -- WORKER_ARGS...        more ps-worker flags (--epochs 5, ...)
#
# start: checks every host over ssh first (reachable, programs and config
# there, nothing of CONFIG running already); then starts each shard under
# nohup and waits until it listens; checks from every worker host that
# every shard answers (ps-stat); then starts the workers. Every start gets
# its own run folder, LOGS/NAME-DATE-TIME (NAME: CONFIG without .yaml),
# with each process's log and exit status, made on every host; here it also
# holds run.env, the hosts of the run (KEY=VALUE lines, read as data, never
# run), and LOGS/NAME.run points at it. When
# a step fails, what was started is stopped again, the failing process's
# log is shown, and start exits 1.
# stop: SIGTERM to the workers, then to the shards (which write their
# checkpoints when configured); waits for each to exit and reports its
# exit status. status: for each process, running or its exit status.
# Each worker gets PS_CONFIG_FOLLOW=RUN/current-config (RUN: the run
# folder; the file, on its host, names CONFIG), which libps follows.
# reshard while workers of the run run (docs/elastic.md, "Re-sharding
# while the workers run"): the refusals below first; NEW_CONFIG copied to
# the new shards' and workers' hosts that lack it; ps-stat --reshard-stop
# on worker 0's host (refused, status 1, with a shard down or another
# change under way: the run goes on), after a pre-copy with an embedding
# table (PS_CLUSTER_PRECOPY=0: none): the old shards write a full
# checkpoint (SIGUSR1), each new shard's host is given the ones it lacks,
# and NEW's shards start staged from them, ending with this process's ssh
# sessions unless told the commit (each of those waits at most
# PS_CLUSTER_PRECOPY_WAIT seconds, default 600; a pre-copy that fails or
# runs out of time is given up, saying why, and the re-shard goes on
# unstaged); waits for every old shard to exit
# at its stop (one that did not exit 0 rolls back: the old shards start
# again); sets the checkpoints aside as below; starts NEW_CONFIG's shards
# in the same run (start --live-run; a new shard that ends before the
# workers follow starts again once; when they still fail and none wrote
# its checkpoint, rolled back: the old files put back, the old shards
# started again, status 1), and once they answer points every
# worker host's RUN/current-config at NEW_CONFIG: the workers follow. It
# prints the stop clock, what moved and the pause. The run then goes on
# as NEW_CONFIG (status and stop of it). With --restart, without a run
# record, for a run whose workers have no follow file (an earlier
# ps-cluster.sh) or when none of its workers runs:
# reshard: re-sharding by restart (docs/elastic.md). NEW_CONFIG is CONFIG
# with other cluster.servers (and cluster.backups; refused naming the
# first other key that differs; CONFIG needs checkpoint.dir). Stops CONFIG
# as stop does (workers, then the shards, which write their checkpoints at
# one clock); on every old and new shard host moves the old shards' files
# (with cluster.replicas: 1 the backups' shard-K-r1 ones too) out of
# checkpoint.dir into checkpoint.dir/reshard-from-N.TIME and copies every
# old shard's there through this machine (ssh, tar); then starts
# NEW_CONFIG as start does, each shard (and backup) from those files
# (--reshard-from), and prints what moved.
# The workers, restarted, resume at the checkpoint's clock. Before each
# step a line goes into LOGS/reshard-SUM.intent on this machine (stopping,
# from, stopped, commit, done); a start of either config finishes an
# interrupted re-shard first: rolled back before the commit (each old
# shard's files put back on its host), forward after it (docs/reliability.md,
# "Re-sharding interrupted by a crash"); one while the workers ran (the
# record's `live RUN`) starts the shards only, in that run, and points its
# workers at them. A reshard while one is open is refused.
# Exit status: 0 when everything succeeded, 1 when a host, a process or a
# check failed, 2 for usage or a config that cannot work on these hosts.
# The cluster secret (security.secret_file) must be at the same path on
# every host, mode 0600: scripts/ps-keygen FILE, then copy it (scp -p).
# With cluster.replicas: 1 so must the replication key
# (security.repl_key_file), on the shards' hosts only.
# Every value put in a remote command is quoted for POSIX sh; a host name
# starting with '-' is refused (ssh would read it as an option), and so is
# a newline in a path or host (run.env holds one value a line).
set -uo pipefail
# In the source tree this is scripts/ps-cluster.sh (programs in ../bin);
# installed, PREFIX/bin/ps-cluster.sh (programs beside it, ps-lib.sh in
# PREFIX/lib/ps).
self=$(cd "$(dirname "$0")" && pwd)
here=$(cd "$self/.." && pwd)
installed=0
[ "$self" = "$here/bin" ] && installed=1
lib=$self/ps-lib.sh
[ -r "$lib" ] || lib=$here/lib/ps/ps-lib.sh
. "$lib"

me=ps-cluster.sh
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }
die() { echo "$me: $*" >&2; exit 2; }
[ $# -ge 1 ] || { usage >&2; exit 2; }
case "$1" in
  -h|--help) usage; exit 0 ;;
  --version) "$here/bin/ps-server" --version | sed "1s/^ps-server/$me/"; exit "${PIPESTATUS[0]}" ;;
esac
[ $# -ge 2 ] || die "give an action: start, stop or status"
CONFIG=$1 ACTION=$2; shift 2
OPTS=("$@") # start's own options, for a start that finishes an interrupted re-shard
case "$ACTION" in start|stop|status|reshard) ;; *)
  die "unknown action '$ACTION' (start, stop, status or reshard)" ;;
esac
NEW=""
if [ "$ACTION" = reshard ]; then
  [ $# -ge 1 ] || die "reshard needs NEW_CONFIG"
  NEW=$1; shift
fi
DIR=$here LOGS="" WHOSTS="" DRY=0 WAIT="" WCMD=() RESHARD_FROM="" RESHARD_N="" LIVE_RUN="" RESTART=0

SSH=${PS_SSH:-ssh -o BatchMode=yes -o ConnectTimeout=10}
while [ $# -gt 0 ]; do
  case "$1" in
    --worker-hosts|--dir|--logs|--ssh|--wait|--reshard-from|--reshard-shards|--live-run)
      [ $# -ge 2 ] || die "$1 needs a value"
      case "$1" in
        --worker-hosts) WHOSTS=$2 ;; --dir) DIR=$2 ;; --logs) LOGS=$2 ;;
        --ssh) SSH=$2 ;; --wait) WAIT=$2; WAIT_GIVEN=1 ;;
        --reshard-from) RESHARD_FROM=$2 ;; --reshard-shards) RESHARD_N=$2 ;;
        --live-run) LIVE_RUN=$2 ;;
      esac
      shift 2 ;;
    --dry-run) DRY=1; shift ;;
    --restart) RESTART=1; shift ;;
    --worker-cmd) [ $# -ge 2 ] || die "$1 needs a value"; WCMD=(--exec "$2"); shift 2 ;;
    --) shift; break ;;
    *) die "unknown option '$1' (--help lists them)" ;;
  esac
done
WARGS=(${WCMD[@]+"${WCMD[@]}"} "$@")
if [ $installed -eq 1 ]; then
  LOGS=${LOGS:-$HOME/.local/state/ps/logs}
  case "$CONFIG" in /*) ;; *) CONFIG=$PWD/$CONFIG ;; esac
fi
LOGS=${LOGS:-$DIR/logs}
for v in "$CONFIG" "$DIR" "$LOGS" "$WHOSTS"; do
  case "$v" in *$'\n'*) die "a newline in '$v': not allowed in a path or host name" ;; esac
done
if [ -n "$RESHARD_FROM$RESHARD_N" ]; then
  [ "$ACTION" = start ] && [ -n "$RESHARD_FROM" ] && [[ $RESHARD_N =~ ^[1-9][0-9]*$ ]] ||
    die "--reshard-from DIR and --reshard-shards N go together, with start"
  case "$RESHARD_FROM" in *$'\n'*) die "a newline in '$RESHARD_FROM'" ;; esac
fi
if [ -n "$LIVE_RUN" ]; then
  [ "$ACTION" = start ] || die "--live-run goes with start"
  [ -r "$LIVE_RUN/run.env" ] || die "--live-run $LIVE_RUN: no run record (run.env) there"
fi
[ "$RESTART" = 0 ] || [ "$ACTION" = reshard ] || die "--restart goes with reshard"
case "$WAIT" in
  "") WAIT=$([ "$ACTION" = stop ] && echo 300 || { [ -n "$RESHARD_FROM" ] && echo 600 || echo 30; }) ;;
  *[!0-9]*) die "--wait: expected whole seconds, got '$WAIT'" ;;
esac
WORKER_GRACE=$((WAIT < 15 ? WAIT : 15)) SHARD_SIGNAL=TERM LOG_TAIL=8 ROLLBACK=0
# a live reshard's pre-copy: seconds for each old shard's checkpoint, and
# for the new shards to load them, before it is given up (unstaged)
PWAIT=${PS_CLUSTER_PRECOPY_WAIT:-600}
[[ $PWAIT =~ ^[1-9][0-9]*$ ]] || die "PS_CLUSTER_PRECOPY_WAIT: expected whole seconds (1 or more), got '$PWAIT'"
# The ssh command as words (quotes honoured, nothing run): xargs splits.
mapfile -d '' -t SSHV < <(printf '%s' "$SSH" | xargs printf '%s\0' 2>/dev/null)
[ ${#SSHV[@]} -gt 0 ] || die "--ssh / PS_SSH: cannot split '$SSH' into words (unmatched quote?)"
[ -r "$CONFIG" ] || die "cannot read $CONFIG"
SERVER=$here/bin/ps-server
[ -x "$SERVER" ] || die "$SERVER missing; run 'make' first"

# The config as the remote side sees it.
case "$CONFIG" in /*) RCONFIG=$CONFIG ;; *) RCONFIG=$DIR/$CONFIG ;; esac
# The config the run's workers were started with: RCONFIG, or the config of
# the run before a re-shard while they ran (which they follow since).
WCONFIG=$RCONFIG
shard_lines=$("$SERVER" --config "$CONFIG" --list-shards) || exit 2
dump=$("$SERVER" --config "$CONFIG" --dump-config) || exit 2
nworkers=$(cfg_key "$dump" cluster workers)
auth=$(cfg_key "$dump" security auth)
secret=$(cfg_key "$dump" security secret_file)
if [ "$ACTION" = start ] && [ "$auth" = true ] && [ -z "$secret" ]; then
  die "$CONFIG has security.auth on but names no security.secret_file;" \
      "create one (scripts/ps-keygen FILE), copy it to every host and name it there"
fi
if [ "$ACTION" = start ] && [ "$auth" = true ] && [ "$(cfg_key "$dump" cluster replicas)" = 1 ] &&
   [ -z "$(cfg_key "$dump" security repl_key_file)" ]; then
  die "$CONFIG has cluster.replicas: 1 but names no security.repl_key_file;" \
      "create one (scripts/ps-keygen FILE), copy it to the shards' hosts only and name it there"
fi
mapfile -t shost < <(printf '%s\n' "$shard_lines" | awk '{print $2}')
mapfile -t sport < <(printf '%s\n' "$shard_lines" | awk '{print $3}')
nshards=${#shost[@]}
# cluster.replicas: 1: server process nshards + K is shard K's backup
# (--replica 1, at cluster.backups[K]); nsrv counts every server process
backup_lines=$("$SERVER" --config "$CONFIG" --list-backups) || exit 2
if [ -n "$backup_lines" ]; then
  mapfile -t -O "$nshards" shost < <(printf '%s\n' "$backup_lines" | awk '{print $2}')
  mapfile -t -O "$nshards" sport < <(printf '%s\n' "$backup_lines" | awk '{print $3}')
fi
nsrv=${#shost[@]}
NAME=$(basename "$CONFIG"); NAME=${NAME%.yaml}; NAME=${NAME%.yml}
POINTER=$LOGS/$NAME.run

sq() { printf "'%s'" "${1//\'/\'\\\'\'}"; } # one word for a POSIX shell
# An extended regex matching s literally.
re() { printf '%s' "$1" | sed 's/[][\.*^$+?(){}|]/\\&/g'; }
is_loopback() { case "$1" in 127.*|::1|localhost|localhost.*|ip6-localhost) return 0 ;; esac; return 1; }
is_wildcard() { case "$1" in 0.0.0.0|::|'*'|'') return 0 ;; esac; return 1; }

# ssh HOST SCRIPT: runs SCRIPT there (POSIX sh), stdin closed; its status.
# "--": nothing after it is an option of ssh's, whatever the host's name.
on() { "${SSHV[@]}" -- "$1" "$2" < /dev/null; }
# sh for a worker host: ps-stat of this config with the arguments ($1)
stat_script() { echo "cd $(sq "$DIR") && bin/ps-stat --config $(sq "$RCONFIG") $1"; }
# Refuses (exit 2) a host whose name starts with '-' or holds a newline;
# where: what names it.
check_host() { # HOST WHERE
  case "$1" in
    -*) die "$2 names host '$1', which starts with '-': refused (ssh would take it for an option)" ;;
    *$'\n'*|'') die "$2 names an empty host, or one with a newline" ;;
  esac
}
# Many hosts at once: par ID HOST SCRIPT starts `on` in the background,
# par_wait waits for all of them, then par_out ID is what it printed and
# par_rc ID its status (255: ssh itself failed).
PAR=$(mktemp -d "${TMPDIR:-/tmp}/ps-cluster.XXXXXX") || exit 1
trap 'rm -rf "$PAR"' EXIT
# (their pids in PARP: par_wait waits for nothing else, not for the ssh
# sessions a live re-shard's pre-copy keeps open)
PARP=()
par() { { on "$2" "$3" > "$PAR/$1.out" 2>&1; echo $? > "$PAR/$1.rc"; } & PARP+=($!); }
par_wait() { [ ${#PARP[@]} -eq 0 ] || wait "${PARP[@]}"; PARP=(); }
par_out() { cat "$PAR/$1.out" 2> /dev/null; }
par_rc() { cat "$PAR/$1.rc" 2> /dev/null || echo 255; }

# What runs where. Every process is recognisable by its command line,
# which starts with the program's path: the config path and --shard K or
# --rank R follow (the sh that records its exit status does not match).
# Server process I: its name in messages, its log's name, its arguments.
sname() { if [ "$1" -lt "$nshards" ]; then echo "shard $1"; else echo "backup $(($1 - nshards))"; fi; }
slog() { if [ "$1" -lt "$nshards" ]; then echo "server-$1"; else echo "server-$(($1 - nshards))-r1"; fi; }
sargs() { if [ "$1" -lt "$nshards" ]; then echo "--shard $1"; else echo "--shard $(($1 - nshards)) --replica 1"; fi; }
server_cmd() {
  echo "$(sq "$DIR/bin/ps-server") --config $(sq "$RCONFIG") $(sargs "$1")${RESHARD_FROM:+ --reshard-from $(sq "$RESHARD_FROM") --reshard-shards $RESHARD_N}"
}
worker_cmd() {
  local extra="" a
  for a in "${WARGS[@]+"${WARGS[@]}"}"; do extra+=" $(sq "$a")"; done
  echo "$(sq "$DIR/bin/ps-worker") --config $(sq "$WCONFIG") --rank $1$extra"
}
server_pat() { echo "^$(re "$DIR/bin/ps-server --config $RCONFIG $(sargs "$1")")( --reshard-from .*)?\$"; }
worker_pat() { echo "^$(re "$DIR/bin/ps-worker --config $WCONFIG --rank $1")( |\$)"; }
any_pat() { # (with --live-run the shards only: the run's workers go on)
  if [ -n "$LIVE_RUN" ]; then echo "^$(re "$DIR/bin/ps-server --config $RCONFIG") --shard [0-9]+( |\$)"
  else echo "^$(re "$DIR/bin/ps-")(server|worker) --config $(re "$RCONFIG") --(shard|rank) [0-9]+( |\$)"; fi
}
whost_of() { echo "${whost[$(($1 % ${#whost[@]}))]}"; }


# ---- stop and status: on the hosts of the run recorded at start ----

# The processes (selected in sel_shards / sel_workers) that run on HOST in
# PHASE (shard or worker), one "shard K" / "worker R" a line.
procs_of() { # PHASE HOST
  local i
  if [ "$1" = shard ]; then
    for i in "${sel_shards[@]}"; do [ "${shost[$i]}" = "$2" ] && echo "shard $i"; done
  else
    for i in "${sel_workers[@]}"; do [ "$(whost_of "$i")" = "$2" ] && echo "worker $i"; done
  fi
  return 0
}

# proc_report KIND INDEX: sh lines printing "@@|kind index|state|exit" for
# one process (state running or gone; exit: its status, "" if unknown) and,
# when it exited non-zero, the end of its log.
proc_report() {
  local kind=$1 i=$2 pat log ex
  if [ "$kind" = shard ]; then pat=$(server_pat "$i") log=$RUN/$(slog "$i"); else pat=$(worker_pat "$i") log=$RUN/worker-$i; fi
  ex=$log.exit log=$log.log
  local name="$kind $i"
  [ "$kind" = shard ] && name=$(sname "$i")
  if [ -z "$RUN" ]; then # no run record: no exit status to read
    echo "if pgrep -f -- $(sq "$pat") > /dev/null; then echo '@@|$name|running|'; else echo '@@|$name|gone|'; fi"
    return
  fi
  printf '%s\n' "if pgrep -f -- $(sq "$pat") > /dev/null; then echo '@@|$name|running|';" \
    "else [ -e $(sq "$ex") ] || sleep 0.3; e=\$(cat $(sq "$ex") 2> /dev/null);" \
    "echo \"@@|$name|gone|\$e\"; case \"\$e\" in ''|0|130|137|143) ;; *) tail -n $LOG_TAIL $(sq "$log") 2> /dev/null | sed 's/^/    | /' ;; esac; fi"
}

# host_script ACTION PHASE HOST: what runs on HOST for stop or status.
host_script() {
  local act=$1 phase=$2 h=$3 word p waitfor="" kill="" script=""
  local -a procs
  mapfile -t procs < <(procs_of "$phase" "$h")
  if [ "$act" = stop ]; then
    for word in "${procs[@]}"; do
      p=$([ "${word% *}" = shard ] && server_pat "${word#* }" || worker_pat "${word#* }")
      script+="pkill -$([ "$phase" = shard ] && echo "$SHARD_SIGNAL" || echo TERM) -f -- $(sq "$p"); "
      waitfor+="${waitfor:+ || }pgrep -f -- $(sq "$p")"
      kill+="pkill -KILL -f -- $(sq "$p"); "
    done
    if [ "$phase" = worker ]; then
      # A worker stops after its step (ps-worker gives up a step it is
      # stuck in 10 s after the signal); one still running after the grace
      # gets SIGKILL (workers hold nothing the shards do not).
      script+="i=0; while [ \$i -lt $((WORKER_GRACE * 10)) ] && { $waitfor; } > /dev/null; do sleep 0.1; i=\$((i + 1)); done; "
      script+="if { $waitfor; } > /dev/null; then $kill sleep 1; fi; "
    else
      script+="i=0; while [ \$i -lt $((WAIT * 10)) ] && { $waitfor; } > /dev/null; do sleep 0.1; i=\$((i + 1)); done; "
    fi
  fi
  for word in "${procs[@]}"; do script+=$(proc_report "${word% *}" "${word#* }")$'\n'; done
  printf '%s' "$script"
}

# report ACTION HOST ID PHASE: one line per process from the output of par
# ID (host_script on HOST); adds what is still running after a stop to
# `left` and sets status 1 for what failed.
report() {
  local act=$1 h=$2 id=$3 phase=$4 out line word st rest
  local -a procs
  out=$(par_out "$id")
  if [ "$(par_rc "$id")" -ne 0 ] && ! grep -q '^@@|' <<< "$out"; then
    echo "$me: cannot reach $h over ssh: $(tail -n 1 <<< "$out")" >&2
    mapfile -t procs < <(procs_of "$phase" "$h")
    for word in "${procs[@]}"; do
      [ "${word% *}" = shard ] && word=$(sname "${word#* }")
      echo "$word on $h: unknown (host not reachable)"
      [ "$act" = stop ] && left+=("$word on $h")
    done
    status=1
    return
  fi
  while IFS= read -r line; do
    case "$line" in
      '@@|'*)
        IFS='|' read -r _ word st rest <<< "$line"
        if [ "$st" = running ]; then
          if [ "$act" = stop ]; then
            echo "$word on $h: still running after ${WAIT}s; SIGKILL it on $h if it must go (a shard's checkpoint may be unfinished)"
            left+=("$word on $h"); status=1
          else
            echo "$word on $h: running"
          fi
        elif [ -z "$rest" ]; then
          echo "$word on $h: not running${RUN:+ (no exit status in $RUN)}"
        else
          case "$rest" in
            0) echo "$word on $h: not running (exited with status 0)" ;;
            130|143) echo "$word on $h: not running (stopped by a signal, status $rest)" ;;
            137) if [ "${word% *}" != worker ] || [ "$ROLLBACK" = 1 ]; then
                   echo "$word on $h: not running (killed with SIGKILL)"
                 else
                   echo "$word on $h: not running (killed: it had not stopped ${WORKER_GRACE}s after SIGTERM)"
                 fi ;;
            *) echo "$word on $h: not running (exited with status $rest)$([ "$LOG_TAIL" -gt 0 ] && echo :)"
               [ "$act" = stop ] && [ "${word% *}" != worker ] && status=1 ;;
          esac
        fi ;;
      '') ;;
      *) echo "$line" ;;
    esac
  done <<< "$out"
}

# stop_or_status ACTION: the workers' hosts at once, then the shards'
# hosts at once (stop: workers first, so the shards' checkpoints hold
# their last clock), one ssh per host; a line per process.
stop_or_status() {
  local act=$1 phase n i
  local -a hosts
  left=()
  for phase in worker shard; do
    hosts=()
    if [ $phase = worker ]; then
      for i in "${sel_workers[@]}"; do hosts+=("$(whost_of "$i")"); done
    else
      for i in "${sel_shards[@]}"; do hosts+=("${shost[$i]}"); done
    fi
    [ ${#hosts[@]} -gt 0 ] || continue
    mapfile -t hosts < <(printf '%s\n' "${hosts[@]}" | awk '!seen[$0]++')
    for ((n = 0; n < ${#hosts[@]}; n++)); do
      par "$act-$phase-$n" "${hosts[$n]}" "$(host_script "$act" $phase "${hosts[$n]}")"
    done
    par_wait
    for ((n = 0; n < ${#hosts[@]}; n++)); do report "$act" "${hosts[$n]}" "$act-$phase-$n" $phase; done
  done
}

# Reads a run record (run.env; FILE, else the one POINTER names, which
# must be of this config) into RUN, RUN_SHARD_HOSTS, RUN_WORKER_HOSTS,
# RUN_FOLLOW (the workers' $PS_CONFIG_FOLLOW file on their hosts; empty
# for a run started by a ps-cluster.sh without it) and WCONFIG (the
# workers' config); 1 when there is none. It is data: KEY=VALUE lines, the
# value as it is (an older ps-cluster.sh wrote the hosts as
# RUN_SHARD_HOSTS=(h1 h2 ), read as plain words); nothing in it is run.
# Another line, or a host starting with '-', stops with status 2 naming it.
load_run() { # [FILE]
  local f=${1:-$POINTER/run.env} line key val n=0 h
  local -a words
  [ -r "$f" ] || return 1
  RUN_CONFIG="" RUN_DIR="" RUN_SHARD_HOSTS=() RUN_WORKER_HOSTS=() RUN_FOLLOW="" RUN_WORKER_CONFIG=""
  while IFS= read -r line || [ -n "$line" ]; do
    n=$((n + 1))
    case "$line" in ''|'#'*) continue ;; esac
    key=${line%%=*} val=${line#*=}
    case "$key" in
      RUN_CONFIG) RUN_CONFIG=$val ;;
      RUN_DIR) RUN_DIR=$val ;;
      RUN_FOLLOW) RUN_FOLLOW=$val ;;
      RUN_WORKER_CONFIG) RUN_WORKER_CONFIG=$val ;;
      RUN_SHARD_HOST) RUN_SHARD_HOSTS+=("$val") ;;
      RUN_WORKER_HOST) RUN_WORKER_HOSTS+=("$val") ;;
      RUN_SHARD_HOSTS|RUN_WORKER_HOSTS)
        case "$val" in
          \(*\)) val=${val#(} val=${val%)} ;;
          *) die "$f:$n: $key: expected (HOST ...), got '$val'" ;;
        esac
        case "$val" in *[\\\'\"\$\`]*)
          die "$f:$n: $key holds quoted words, which this reader does not undo; give --worker-hosts, or start again" ;;
        esac
        read -r -a words <<< "$val"
        if [ "$key" = RUN_SHARD_HOSTS ]; then RUN_SHARD_HOSTS+=("${words[@]}"); else RUN_WORKER_HOSTS+=("${words[@]}"); fi ;;
      RUN_STATE) ;;
      *) die "$f:$n: not a line of a run record: '$line'" ;;
    esac
  done < "$f"
  for h in "${RUN_SHARD_HOSTS[@]}" "${RUN_WORKER_HOSTS[@]}"; do check_host "$h" "$f"; done
  if [ -z "${1:-}" ] && [ "$RUN_CONFIG" != "$RCONFIG" ]; then
    [ "$RUN_WORKER_CONFIG" = "$RCONFIG" ] && {
      echo "$me: the run of $RCONFIG was re-sharded while its workers ran: it runs as" \
        "$RUN_CONFIG now ($POINTER): $0 $RUN_CONFIG $ACTION" >&2; exit 2; }
    echo "$me: $POINTER is a run of $RUN_CONFIG, not $RCONFIG: give another --logs" >&2; exit 2
  fi
  RUN=$RUN_DIR WCONFIG=${RUN_WORKER_CONFIG:-$RUN_CONFIG}
  return 0
}

# ---- the re-shard's intent record (docs/reliability.md, "Re-sharding
# interrupted by a crash"), kept on this machine: LOGS/reshard-SUM.intent,
# SUM the checksum of checkpoint.dir's path, the lines of ps-local.sh's
# (stopping, from, stopped, commit, done), each added before its step:
# written whole, fsynced and renamed into place. A start of either config
# finishes an interrupted re-shard first: rolled back before `commit` (each
# old shard's files put back on its host), forward after it, unless a
# `rollback` line follows it (a live re-shard none of whose new shards
# wrote a checkpoint, being rolled back).
INTENT_F=""
ck0=$(cfg_key "$dump" checkpoint dir)
if [ -n "$ck0" ]; then
  case "$ck0" in /*) ;; *) ck0=$DIR/$ck0 ;; esac
  INTENT_F=$LOGS/reshard-$(printf '%s' "$ck0" | cksum | cut -d' ' -f1).intent
fi
intent_add() { # LINE...
  mkdir -p "$LOGS" && { cat "$INTENT_F" 2>/dev/null; printf '%s\n' "$@"; } > "$INTENT_F.tmp" &&
    sync "$INTENT_F.tmp" && mv "$INTENT_F.tmp" "$INTENT_F" && sync "$LOGS" && return 0
  echo "$me: reshard: cannot write the intent record $INTENT_F" >&2
  return 1
}
intent_get() { sed -n "s/^$1 //p" "$INTENT_F" 2>/dev/null | tail -n 1; }
intent_has() { grep -qE "^$1( |\$)" "$INTENT_F" 2>/dev/null; }
intent_open() { [ -n "$INTENT_F" ] && [ -f "$INTENT_F" ] && ! intent_has done; }
# a coordinator of the open record that still runs: its pid
intent_live() {
  local pid
  pid=$(intent_get pid)
  [ -n "$pid" ] && [[ $(tr '\0' ' ' 2>/dev/null < "/proc/$pid/cmdline") == *ps-cluster.sh* ]] && echo "$pid"
}
# Each old server process's own files back from F on its host (the copies
# made for other hosts stay in F there): a re-shard rolled back. 1 (saying
# why) when one cannot be.
put_back() { # OLD_CONFIG F OLD_N
  local lines k b out
  local -a ohost
  lines=$("$SERVER" --config "$1" --list-shards; "$SERVER" --config "$1" --list-backups) || return 1
  mapfile -t ohost < <(awk '{print $2}' <<< "$lines")
  for ((k = 0; k < ${#ohost[@]}; k++)); do
    b=shard-$((k % $3)); [ "$k" -lt "$3" ] || b+=-r1
    out=$(on "${ohost[$k]}" "cd $(sq "$ck0") || exit 3
for f in $(sq "$2")/$b.ckpt $(sq "$2")/$b.ckpt.delta-* $(sq "$2")/$b.members; do
  [ -e \"\$f\" ] || continue
  [ -e \"\${f##*/}\" ] && { echo \"\${f##*/} is there already\"; exit 3; }
  mv -- \"\$f\" . || exit 3
done
rmdir -- $(sq "$2") 2> /dev/null
echo BACK" 2>&1)
    grep -q '^BACK$' <<< "$out" || { echo "$me: $INTENT_F: cannot put $b's files back from $2" \
      "on ${ohost[$k]} (rolling a re-shard back): $(tail -n 1 <<< "$out")" >&2; return 1; }
  done
}
# Tests only (it_reshard_crash.sh): $PS_CLUSTER_CRASH_AT names a step at
# which this process kills itself with SIGKILL, as a crash there would.
crash_point() {
  [ "${PS_CLUSTER_CRASH_AT:-}" = "$1" ] || return 0
  echo "$me: PS_CLUSTER_CRASH_AT=$1: killed here with SIGKILL (a test)" >&2
  rm -rf "$PAR"
  kill -KILL $$
}
# (not in a start the re-shard's coordinator itself runs to roll back:
# PS_CLUSTER_INTENT_OWNER, its pid, is the record's)
if [ "$ACTION" = start ] && [ -z "$RESHARD_FROM" ] && [ $DRY -eq 0 ] && intent_open &&
  [ "${PS_CLUSTER_INTENT_OWNER:-}" != "$(intent_get pid)" ]; then
  p=$(intent_live)
  [ -z "$p" ] || { echo "$me: a re-shard is in progress ($me pid $p, $INTENT_F): wait for it to end" >&2; exit 1; }
  read -r _ old_n new_n < <(grep '^stopping ' "$INTENT_F")
  old=$(intent_get old_config) new=$(intent_get new_config) F=$(intent_get from)
  # a re-shard while the workers ran: its shards start in that run, whose
  # workers (still running) are pointed at them
  lr=$(intent_get live)
  live=()
  [ -n "$lr" ] && live=(--live-run "$lr")
  prog=$(realpath "$0")
  cd "$(intent_get cwd)" || exit 1
  if intent_has staging; then
    # a pre-copy's staged shards end with their coordinator's ssh session;
    # any left (a host that did not see it end) are stopped here, and
    # before `commit` the bases copied to other hosts' checkpoint.dir (not
    # moved into the folder yet) go
    case "$new" in /*) rnew=$new ;; *) rnew=$DIR/$new ;; esac
    pat="^$(re "$DIR/bin/ps-server --config $rnew --shard ")[0-9]+ --reshard-from .* --reshard-stage [0-9]+\$"
    while read -r h; do
      on "$h" "pkill -TERM -f -- $(sq "$pat")"
    done < <("$SERVER" --config "$new" --list-shards | awk '!seen[$2]++ {print $2}')
    intent_has commit || while read -r _ k h; do
      on "$h" "cd $(sq "$ck0") && rm -rf shard-$k.ckpt .precopy-$k" ||
        echo "$me: cannot remove the pre-copy's copy of shard-$k.ckpt in $ck0 on $h (an old shard's file: remove it)" >&2
    done < <(grep '^copied ' "$INTENT_F")
  fi
  # (`rollback` after `commit`: no new shard wrote a file, the coordinator
  # was rolling back)
  if ! intent_has commit || intent_has rollback; then
    if [ -n "$F" ]; then put_back "$old" "$F" "$old_n" || exit 1; fi
    intent_add "done rolled-back" || exit 1
    echo "$me: an interrupted re-shard ($old_n -> $new_n shards, $INTENT_F) had not reached its" \
      "commit$(intent_has rollback && echo ', or was rolling back'): rolled back; starting $old," \
      "its shards from their own checkpoints"
    rm -rf "$PAR"
    exec "$prog" "$old" start ${live[@]+"${live[@]}"} ${OPTS[@]+"${OPTS[@]}"}
  fi
  echo "$me: an interrupted re-shard ($old_n -> $new_n shards, $INTENT_F) had passed its commit:" \
    "rolled forward; starting $new, its shards from the old checkpoints in $F"
  rm -rf "$PAR"
  PS_CLUSTER_INTENT=$INTENT_F exec "$prog" "$new" start ${live[@]+"${live[@]}"} --reshard-from "$F" --reshard-shards "$old_n" \
    ${OPTS[@]+"${OPTS[@]}"}
fi

# ---- reshard: stop CONFIG, gather the old checkpoints, start NEW ----
if [ "$ACTION" = reshard ]; then
  [ -r "$NEW" ] || die "reshard: cannot read $NEW"
  new_dump=$("$SERVER" --config "$NEW" --dump-config) || exit 2
  key=$(cfg_first_diff "$dump" "$new_dump")
  [ -z "$key" ] || die "reshard: $NEW differs from $CONFIG in $key: a re-shard changes cluster.servers (and cluster.backups) only"
  ckdir=$(cfg_key "$dump" checkpoint dir)
  [ -n "$ckdir" ] || die "reshard: $CONFIG has no checkpoint.dir: the new shards start from the old ones' checkpoints"
  # the new shards' hosts, with cluster.replicas: 1 their backups' too
  mapfile -t nhost < <("$SERVER" --config "$NEW" --list-shards | awk '{print $2}')
  nnew=${#nhost[@]}
  mapfile -t -O "$nnew" nhost < <("$SERVER" --config "$NEW" --list-backups | awk '{print $2}')
  for h in "${shost[@]}" "${nhost[@]}"; do check_host "$h" "$CONFIG or $NEW"; done
  [ $DRY -eq 0 ] || die "reshard: --dry-run is not supported (it stops the cluster)"
  if intent_open; then
    p=$(intent_live)
    [ -n "$p" ] && { echo "$me: reshard: a re-shard is in progress ($me pid $p, $INTENT_F);" \
      "nothing was done" >&2; exit 1; }
    echo "$me: reshard: a re-shard was interrupted ($INTENT_F): start either config first (it" \
      "completes the re-shard or rolls it back); nothing was done" >&2
    exit 1
  fi
  # Live when the run's workers can follow (docs/elastic.md, "Re-sharding
  # while the workers run"): its record names their follow file, and one
  # of them runs; else by restart, saying why.
  live=0 why=""
  if [ "$RESTART" = 1 ]; then why="--restart"
  elif ! load_run; then why="no run record at $POINTER"
  elif [ -z "$RUN_FOLLOW" ]; then
    why="its workers were started by an earlier ps-cluster.sh, without a follow file (\$PS_CONFIG_FOLLOW)"
  else
    whost=("${RUN_WORKER_HOSTS[@]}")
    mapfile -t uwhost < <(for ((r = 0; r < nworkers; r++)); do whost_of $r; done | awk '!seen[$0]++')
    for ((n = 0; n < ${#uwhost[@]}; n++)); do
      script="[ -f $(sq "$RUN_FOLLOW") ] && echo HASFOLLOW"$'\n'
      for ((r = 0; r < nworkers; r++)); do
        [ "$(whost_of $r)" = "${uwhost[$n]}" ] && script+="pgrep -f -- $(sq "$(worker_pat $r)") > /dev/null && echo RUNNING $r"$'\n'
      done
      par "wk-$n" "${uwhost[$n]}" "$script"'echo OK'
    done
    par_wait
    nrun=0
    for ((n = 0; n < ${#uwhost[@]}; n++)); do
      out=$(par_out "wk-$n")
      grep -q '^OK$' <<< "$out" || { echo "$me: reshard: cannot reach ${uwhost[$n]} over ssh:" \
        "$(tail -n 1 <<< "$out"); nothing was done" >&2; exit 1; }
      r=$(grep -c '^RUNNING ' <<< "$out")
      nrun=$((nrun + r))
      [ "$r" -gt 0 ] && ! grep -q '^HASFOLLOW$' <<< "$out" && why="the workers on ${uwhost[$n]} have no follow file ($RUN_FOLLOW)"
    done
    [ "$nrun" -gt 0 ] || why="no worker of the run $RUN runs"
    [ -n "$why" ] || live=1
  fi
  [ $live -eq 1 ] || echo "$me: reshard: by restart ($why): the workers are stopped and started again"
  case "$ckdir" in /*) ck=$ckdir ;; *) ck=$DIR/$ckdir ;; esac
  F=$ck/reshard-from-$nshards.$(date +%Y%m%dT%H%M%S)
  # server process I's files: shard-K, its backup's shard-K-r1
  sfiles() { local b; b=shard-$(($1 % nshards)); [ "$1" -lt "$nshards" ] || b+=-r1; echo "$b"; }
  # Sets every old shard's files aside in F on their hosts and gives every
  # new shard's host all of them; 1 (saying why) when it cannot.
  set_aside() {
    local h own out b k n files miss copies i
    local -a rhosts uhost
    # A. on each old shard's host, its files into F (the hosts at once: each
    # moves its own shards' files, so a checkpoint.dir shared by the hosts
    # ends up holding them all); any other shard's file stays (a new shard
    # takes its own only when written after the old ones: ps-server
    # --reshard-from)
    mapfile -t rhosts < <(printf '%s\n' "${shost[@]}" "${nhost[@]}" | awk '!seen[$0]++')
    for ((n = 0; n < ${#rhosts[@]}; n++)); do
      own=""
      for ((k = 0; k < nsrv; k++)); do [ "${shost[$k]}" = "${rhosts[$n]}" ] && own+=" $(sfiles $k)"; done
      # (and the pre-copy's bases copied to this host: the files the
      # staged shards read, moved, so the same inode)
      copies=""
      for i in ${cp_k[@]+"${!cp_k[@]}"}; do [ "${cp_h[$i]}" = "${rhosts[$n]}" ] && copies+=" shard-${cp_k[$i]}"; done
      par "aside-$n" "${rhosts[$n]}" "mkdir -p $(sq "$F") && cd $(sq "$ck") || exit 3
for b in$own; do
  for f in \$b.ckpt \$b.ckpt.delta-* \$b.members; do
    [ -e \"\$f\" ] && { mv -- \"\$f\" $(sq "$F")/ || exit 3; }
  done
done
for b in$copies; do [ -e \$b.ckpt ] && { mv -- \$b.ckpt $(sq "$F")/ || exit 3; }; done
echo MOVED"
    done
    par_wait
    for ((n = 0; n < ${#rhosts[@]}; n++)); do
      out=$(par_out "aside-$n")
      grep -q '^MOVED$' <<< "$out" || {
        echo "$me: reshard: cannot set the checkpoints aside on ${rhosts[$n]}: $(tail -n 1 <<< "$out")" >&2; return 1; }
    done
    # A2. a base copied for the pre-copy is the old shard's base at the
    # stop (the same file in F on its host): its incremental ones and
    # membership file follow it; else (a newer full checkpoint replaced
    # it) the copy goes, and B copies every file (the staged shard, finding
    # another file, loads it whole)
    for i in ${cp_k[@]+"${!cp_k[@]}"}; do
      k=${cp_k[$i]} h=${cp_h[$i]} b=shard-${cp_k[$i]}
      if [ "$(on "${shost[$k]}" "stat -c %i:%s:%.9Y $(sq "$F/$b.ckpt")" 2>&1)" = "${src_id[$k]}" ]; then
        "${SSHV[@]}" -- "${shost[$k]}" "cd $(sq "$F") && tar -cf - \$(ls -d $b.ckpt.delta-* $b.members 2> /dev/null)" < /dev/null |
          "${SSHV[@]}" -- "$h" "cd $(sq "$F") && tar -xf -" && continue
      fi
      on "$h" "rm -f $(sq "$F/$b.ckpt")" ||
        { echo "$me: reshard: cannot remove the pre-copy's $b.ckpt in $F on $h" >&2; return 1; }
    done
    # B. every old shard's files onto every new shard's host that lacks
    # them: each host says which it lacks (none where the folder is shared)
    mapfile -t uhost < <(printf '%s\n' "${nhost[@]}" | awk '!seen[$0]++')
    for ((n = 0; n < ${#uhost[@]}; n++)); do
      out=""
      for ((k = 0; k < nsrv; k++)); do
        [ "${shost[$k]}" = "${uhost[$n]}" ] || out+="[ -f $(sq "$F/$(sfiles $k).ckpt") ] || echo 'LACKS $k'"$'\n'
      done
      out+="cd $(sq "$F") && for k in \$(seq 0 $((nshards - 1))); do [ -f shard-\$k.ckpt ] || [ -f shard-\$k-r1.ckpt ] || echo \"MISS \$k\"; done"$'\n'
      par "lacks-$n" "${uhost[$n]}" "${out}echo CHECKED"
    done
    par_wait
    for ((n = 0; n < ${#uhost[@]}; n++)); do
      h=${uhost[$n]} out=$(par_out "lacks-$n")
      grep -q '^CHECKED$' <<< "$out" || {
        echo "$me: reshard: cannot reach $h over ssh: $(tail -n 1 <<< "$out")" >&2; return 1; }
      miss=$(sed -n 's/^MISS //p' <<< "$out")
      for k in $(sed -n 's/^LACKS //p' <<< "$out"); do
        b=$(sfiles $k)
        # a backup that was down may have written none: its partner's will do
        [ "$k" -ge "$nshards" ] && ! on "${shost[$k]}" "[ -f $(sq "$F/$b.ckpt") ]" && continue
        files="$b.ckpt $b.ckpt.delta-* $b.members"
        "${SSHV[@]}" -- "${shost[$k]}" "cd $(sq "$F") && tar -cf - \$(ls -d $files 2> /dev/null)" < /dev/null |
          "${SSHV[@]}" -- "$h" "cd $(sq "$F") && tar -xf -" ||
          { echo "$me: reshard: cannot copy $(sname $k)'s checkpoint from ${shost[$k]} to $h; the" \
              "old checkpoints are in $F on their hosts" >&2; return 1; }
      done
      # with replicas either process's file of a pair will do (asked again
      # after a copy)
      [ -n "$(sed -n 's/^LACKS //p' <<< "$out")" ] && miss=$(on "$h" "cd $(sq "$F") && for k in \$(seq 0 $((nshards - 1))); do [ -f shard-\$k.ckpt ] || [ -f shard-\$k-r1.ckpt ] || echo \$k; done")
      [ -z "$miss" ] || { echo "$me: reshard: on $h, $F lacks shard-$(echo $miss | tr ' ' ',').ckpt: every" \
        "old shard's checkpoint is needed; nothing was started" >&2; return 1; }
    done
  }
  # Whether a new shard may have written its checkpoint of the new map:
  # a shard-K.ckpt newer than F (set aside before the new shards started)
  # in checkpoint.dir on a new shard's host, or a host that cannot tell.
  new_written() {
    local n out
    local -a uhost
    mapfile -t uhost < <(printf '%s\n' "${nhost[@]}" | awk '!seen[$0]++')
    for ((n = 0; n < ${#uhost[@]}; n++)); do
      out=$(on "${uhost[$n]}" "cd $(sq "$ck") && find . -maxdepth 1 -name 'shard-*.ckpt' -newer $(sq "$F") | sed 's/^/WROTE /'; echo CHECKED" 2>&1)
      grep -q '^CHECKED$' <<< "$out" || return 0
      grep -q '^WROTE ' <<< "$out" && return 0
    done
    return 1
  }
  # A rollback drops the new map's markers (shard-K.reshard: a new shard
  # that served before its first checkpoint names the old files there), so
  # an old shard started again does not take them for a re-shard of its own
  drop_markers() {
    local n
    local -a uhost
    mapfile -t uhost < <(printf '%s\n' "${nhost[@]}" | awk '!seen[$0]++')
    for ((n = 0; n < ${#uhost[@]}; n++)); do
      on "${uhost[$n]}" "cd $(sq "$ck") && rm -f shard-*.reshard" ||
        { echo "$me: reshard: cannot remove the new shards' markers (shard-K.reshard) in $ck" \
          "on ${uhost[$n]}" >&2; return 1; }
    done
  }
  # ---- the pre-copy of a live re-shard (docs/elastic.md, "The pre-copy"):
  # while the workers train, every old shard writes a full checkpoint
  # (SIGUSR1), every new shard's host is given each old base it lacks, and
  # NEW's shards start staged from them (--reshard-stage); past the commit
  # they apply only the stop's incremental checkpoints. Each staged shard
  # runs under a `nohup sh -c` wrapper (its parent: --reshard-stage names
  # it) started by an ssh session this process keeps open, fed by a keeper
  # that ends when this process does or when it touches $stage_ctl: the
  # session then ends too and, unless the shard was told the commit
  # (RUN/server-K.commit), stops it. So a coordinator killed while staged
  # leaves no staged shard behind.
  STAGED=() stage_jobs=() cp_k=() cp_h=()
  declare -A src_id=()
  stage_ctl=$PAR/stage-ctl
  # the sh, on new shard K's host, of its staged start's session
  stage_script() { # K
    local L=$RUN/server-$1 wrap
    wrap="$(sq "$DIR/bin/ps-server") --config $(sq "$RNEW") --shard $1 --reshard-from $(sq "$F")"
    wrap+=" --reshard-shards $nshards --reshard-stage \$\$ & p=\$!; echo \$p > $(sq "$L.staged-pid");"
    wrap+=" wait \$p; rc=\$?; if [ -e $(sq "$L.commit") ]; then echo \$rc > $(sq "$L.exit");"
    wrap+=" else echo \$rc > $(sq "$L.exit.staged"); fi"
    echo "mkdir -p $(sq "$RUN") && cd $(sq "$DIR") || exit 3
rm -f $(sq "$L.staged-pid") $(sq "$L.commit") $(sq "$L.exit.staged")
{ nohup sh -c $(sq "$wrap") > $(sq "$L.log.staged") 2>&1 < /dev/null & }
i=0
while :; do
  if grep -q 're-shard staged' $(sq "$L.log.staged") 2> /dev/null; then echo STAGED; break; fi
  if [ -e $(sq "$L.exit.staged") ]; then
    echo \"FAILED \$(grep -m 1 'refusing to start' $(sq "$L.log.staged") || tail -n 1 $(sq "$L.log.staged"))\"; break
  fi
  i=\$((i + 1)); [ \$i -le $((PWAIT * 10)) ] || { echo 'FAILED it did not load the old files within $PWAIT s (PS_CLUSTER_PRECOPY_WAIT)'; break; }
  sleep 0.1
done
cat > /dev/null
[ -e $(sq "$L.commit") ] || { p=\$(cat $(sq "$L.staged-pid") 2> /dev/null)
  [ -n \"\$p\" ] && tr '\\0' ' ' < /proc/\$p/cmdline 2> /dev/null | grep -q -- ' --reshard-stage ' && kill -TERM \"\$p\" &&
  j=0 && while kill -0 \"\$p\" 2> /dev/null && [ \$j -lt 300 ]; do sleep 0.1; j=\$((j + 1)); done; }
echo ENDED"
  }
  # Ends the staging sessions (a staged shard not told the commit stops;
  # its session waits, 30 s at most, until it has exited, so an unstaged
  # start of the same shard after it does not find it running).
  stage_end() {
    local j
    : > "$stage_ctl"
    for j in ${stage_jobs[@]+"${stage_jobs[@]}"}; do wait "$j" 2> /dev/null; done
    stage_jobs=()
  }
  # The copies given to other hosts removed again (before `from`: they lie
  # in checkpoint.dir there) and the staged shards stopped: not staged.
  precopy_cancel() {
    local i
    stage_end
    for i in ${cp_k[@]+"${!cp_k[@]}"}; do
      on "${cp_h[$i]}" "rm -f $(sq "$ck/shard-${cp_k[$i]}.ckpt")"
    done
    STAGED=() cp_k=() cp_h=()
  }
  # Sets STAGED (the new shards staged; empty: not staged, the re-shard
  # goes on unstaged, having said why); 1 when the record cannot be written.
  precopy_stage() {
    local n k h out l id ok
    local -a uhost ohosts
    mapfile -t ohosts < <(printf '%s\n' "${shost[@]}" | awk '!seen[$0]++')
    [ "${PS_CLUSTER_PRECOPY:-1}" != 0 ] && [ "$nsrv" = "$nshards" ] &&
      grep -q '^    - name: ' <<< "$(sed -n '/^  embeddings:/,/^  [a-z]/p' <<< "$dump")" || return 0
    case $(cfg_key "$dump" log level) in debug | info | warn) ;; *) return 0 ;; esac
    intent_add staging || return 1
    # 1. SIGUSR1 to every old shard, each host at once; its line waited for
    # (PS_CLUSTER_PRECOPY_WAIT from the signals: the shards write at once)
    for ((n = 0; n < ${#ohosts[@]}; n++)); do
      out="i=0"$'\n'
      for ((k = 0; k < nshards; k++)); do
        [ "${shost[$k]}" = "${ohosts[$n]}" ] || continue
        out+="o$k=\$(stat -c %s $(sq "$RUN/$(slog $k).log") 2> /dev/null || echo 0); pkill -USR1 -f -- $(sq "$(server_pat $k)") || o$k=none"$'\n'
      done
      for ((k = 0; k < nshards; k++)); do
        [ "${shost[$k]}" = "${ohosts[$n]}" ] || continue
        out+="r=''; [ \"\$o$k\" = none ] || while :; do
  r=\$(tail -c +\$((o$k + 1)) $(sq "$RUN/$(slog $k).log") 2> /dev/null | grep -m 1 -E 'checkpoint \\(re-shard pre-copy\\)|pre-copy \\(SIGUSR1\\) not taken')
  [ -n \"\$r\" ] && break; pgrep -f -- $(sq "$(server_pat $k)") > /dev/null || break
  [ \$i -lt $((PWAIT * 10)) ] || break; i=\$((i + 1)); sleep 0.1
done
case \"\$r\" in *'pre-copy) written'*) echo \"PRE $k ok \$(stat -c %i:%s:%.9Y $(sq "$ck/shard-$k.ckpt"))\" ;;
  '') if pgrep -f -- $(sq "$(server_pat $k)") > /dev/null; then echo 'PRE $k no: it wrote no pre-copy checkpoint within $PWAIT s (PS_CLUSTER_PRECOPY_WAIT)'
      else echo 'PRE $k no: it wrote no pre-copy checkpoint: it is not running'; fi ;;
  *) echo \"PRE $k no: \${r#* server\\[*\\] }\" ;; esac"$'\n'
      done
      par "pre-$n" "${ohosts[$n]}" "$out"
    done
    par_wait
    for ((n = 0; n < ${#ohosts[@]}; n++)); do
      for ((k = 0; k < nshards; k++)); do
        [ "${shost[$k]}" = "${ohosts[$n]}" ] || continue
        l=$(par_out "pre-$n" | grep "^PRE $k " | tail -n 1)
        case "$l" in
          "PRE $k ok "?*) src_id[$k]=${l#PRE $k ok } ;;
          *) [ -n "$l" ] || l="PRE $k no: cannot ask it over ssh: $(par_out "pre-$n" | tail -n 1)"
             echo "$me: reshard: not staged ($(sname $k) on ${shost[$k]}: ${l#PRE $k no: }):" \
               "going on unstaged" >&2
             return 0 ;;
        esac
      done
    done
    # 2. every new shard's host given each old base it lacks (a copy in
    # checkpoint.dir there; a folder shared with the old shard's host holds
    # that file already: the same inode, size and time)
    mapfile -t uhost < <(printf '%s\n' "${nhost[@]}" | awk '!seen[$0]++')
    for h in "${uhost[@]}"; do
      out=""
      for ((k = 0; k < nshards; k++)); do
        [ "${shost[$k]}" = "$h" ] || out+="echo \"ID $k \$(stat -c %i:%s:%.9Y $(sq "$ck/shard-$k.ckpt") 2> /dev/null)\""$'\n'
      done
      [ -n "$out" ] || continue
      out=$(on "$h" "$out" 2>&1)
      for ((k = 0; k < nshards; k++)); do
        [ "${shost[$k]}" != "$h" ] || continue
        id=$(sed -n "s/^ID $k //p" <<< "$out")
        [ "$id" = "${src_id[$k]}" ] && continue
        # (recorded first: a start that rolls back removes it)
        intent_add "copied $k $h" || return 1
        cp_k+=("$k") cp_h+=("$h")
        ok=$("${SSHV[@]}" -- "${shost[$k]}" "cd $(sq "$ck") && tar -cf - shard-$k.ckpt" < /dev/null |
          "${SSHV[@]}" -- "$h" "cd $(sq "$ck") && rm -rf .precopy-$k && mkdir .precopy-$k && tar -xf - -C .precopy-$k && mv -f .precopy-$k/shard-$k.ckpt . && rmdir .precopy-$k && echo COPIED")
        crash_point copied # (tests: killed with the first copy in place, not checked yet)
        id=$(on "${shost[$k]}" "stat -c %i:%s:%.9Y $(sq "$ck/shard-$k.ckpt")" 2>&1)
        if [ "$ok" != COPIED ] || [ "$id" != "${src_id[$k]}" ]; then
          echo "$me: reshard: not staged: $(sname $k)'s pre-copy checkpoint could not be copied from" \
            "${shost[$k]} to $h$([ "$ok" = COPIED ] && echo ' (a newer one replaced it meanwhile)'):" \
            "going on unstaged" >&2
          precopy_cancel
          return 0
        fi
      done
    done
    # 3. the new shards staged, each from an ssh session kept open
    rm -f "$stage_ctl"
    for ((k = 0; k < nnew; k++)); do
      ( while kill -0 $$ 2> /dev/null && [ ! -e "$stage_ctl" ]; do sleep 0.1; done ) |
        "${SSHV[@]}" -- "${nhost[$k]}" "$(stage_script $k)" > "$PAR/staged-$k.out" 2>&1 &
      stage_jobs+=($!)
    done
    for ((k = 0; k < nnew; k++)); do
      for ((n = 0; ; n++)); do
        l=$(grep -E '^(STAGED|FAILED)' "$PAR/staged-$k.out" 2> /dev/null | head -n 1)
        [ -n "$l" ] && break
        if [ $n -ge $((PWAIT * 10 + 100)) ] || ! kill -0 "${stage_jobs[$k]}" 2> /dev/null; then
          l="FAILED its ssh session ended: $(tail -n 1 "$PAR/staged-$k.out" 2> /dev/null)"; break
        fi
        sleep 0.1
      done
      [ "$l" = STAGED ] && continue
      echo "$me: reshard: not staged: new shard $k on ${nhost[$k]} did not load the old files (log:" \
        "$RUN/server-$k.log.staged there): $(l=${l#FAILED }; echo "${l#* server\[*\] }"); going on unstaged" >&2
      precopy_cancel
      return 0
    done
    mapfile -t STAGED < <(seq 0 $((nnew - 1)))
    crash_point staged
    if [ "${PS_CLUSTER_CRASH_AT:-}" = staged-shard ]; then # tests only: a staged shard dies
      echo "$me: PS_CLUSTER_CRASH_AT=staged-shard: new shard 0 (staged) killed with SIGKILL (a test)" >&2
      on "${nhost[0]}" "kill -KILL \$(cat $(sq "$RUN/server-0.staged-pid"))"
    fi
    echo "$me: reshard: pre-copy: the old shards wrote their checkpoints and the $nnew new shard(s)" \
      "loaded them while the workers ran"
  }
  common=(--ssh "$SSH" --dir "$DIR" --logs "$LOGS")
  [ -n "${WAIT_GIVEN:-}" ] && common+=(--wait "$WAIT")

  if [ $live -eq 1 ]; then
    # NEW on every host that runs a new shard or a worker (which loads it
    # when it follows), copied from here where it is missing
    case "$NEW" in /*) RNEW=$NEW ;; *) RNEW=$DIR/$NEW ;; esac
    mapfile -t chosts < <(printf '%s\n' "${nhost[@]}" "${uwhost[@]}" | awk '!seen[$0]++')
    # (and ps-server on the new shards' hosts: refused now, not past the commit)
    for ((n = 0; n < ${#chosts[@]}; n++)); do
      par "has-$n" "${chosts[$n]}" "cd $(sq "$DIR") && { [ -x bin/ps-server ] && echo SERVER; [ -r $(sq "$RNEW") ] && echo HAS; }; echo OK"
    done
    par_wait
    for ((n = 0; n < ${#chosts[@]}; n++)); do
      h=${chosts[$n]} out=$(par_out "has-$n")
      grep -q '^OK$' <<< "$out" || { echo "$me: reshard: cannot reach $h over ssh:" \
        "$(tail -n 1 <<< "$out"); nothing was done" >&2; exit 1; }
      printf '%s\n' "${nhost[@]}" | grep -qxF -- "$h" && ! grep -q '^SERVER$' <<< "$out" &&
        die "reshard: $h, a host of $NEW's shards, has no $DIR/bin/ps-server (make there, or --dir); nothing was done"
      grep -q '^HAS$' <<< "$out" && continue
      "${SSHV[@]}" -- "$h" "mkdir -p $(sq "${RNEW%/*}") && cat > $(sq "$RNEW.tmp") && mv -f $(sq "$RNEW.tmp") $(sq "$RNEW")" < "$NEW" ||
        { echo "$me: reshard: cannot copy $NEW to $h ($RNEW there); nothing was done" >&2; exit 1; }
      echo "$me: reshard: copied $NEW to $h ($RNEW)"
    done
    rm -f "$INTENT_F"
    intent_add "stopping $nshards $nnew" "old_config $CONFIG" "new_config $NEW" "cwd $PWD" "pid $$" \
      "live $RUN" || exit 1
    crash_point stopping
    precopy_stage || exit 1
    echo "$me: reshard: stopping the $nshards shard(s) of $CONFIG at a clock boundary; the workers keep running"
    t0=$(date +%s%N)
    # 1. the stop (refused with the reason while a shard is down or
    # another change is under way; nothing changed then)
    out=$(on "$(whost_of 0)" "$(stat_script --reshard-stop)" 2>&1)
    B=$(sed -n 's/.*stops at clock \([0-9]*\).*/\1/p' <<< "$out")
    if [ -n "$B" ] && [ "${PS_CLUSTER_CRASH_AT:-}" = stop-shard ]; then
      # tests only (it_reshard_crash.sh): the last old shard killed at its stop
      k=$((nshards - 1))
      echo "$me: PS_CLUSTER_CRASH_AT=stop-shard: $(sname $k) killed with SIGKILL (a test)" >&2
      on "${shost[$k]}" "pkill -KILL -f -- $(sq "$(server_pat $k)")"
    fi
    if [ -z "$B" ]; then
      precopy_cancel
      intent_add "done refused"
      echo "$me: reshard: refused (ps-stat --reshard-stop on $(whost_of 0)):" \
        "$(grep -v '^$' <<< "$out" | tail -n 1); the run goes on with $CONFIG" >&2
      exit 1
    fi
    # 2. every old shard closes the clocks below B, writes its checkpoint
    # and exits 0 (with cluster.replicas: 1 both processes of a pair: a
    # pair one of which did is whole)
    swait=300; [ -n "${WAIT_GIVEN:-}" ] && swait=$WAIT
    mapfile -t ohosts < <(printf '%s\n' "${shost[@]}" | awk '!seen[$0]++')
    for ((n = 0; n < ${#ohosts[@]}; n++)); do
      waitfor="" rep=""
      for ((k = 0; k < nsrv; k++)); do
        [ "${shost[$k]}" = "${ohosts[$n]}" ] || continue
        waitfor+="${waitfor:+ || }pgrep -f -- $(sq "$(server_pat $k)")"
        ex=$RUN/$(slog $k).exit
        rep+="if pgrep -f -- $(sq "$(server_pat $k)") > /dev/null; then echo 'EXIT $k running'; else"
        rep+=" j=0; while [ ! -e $(sq "$ex") ] && [ \$j -lt 20 ]; do sleep 0.1; j=\$((j + 1)); done;"
        rep+=" echo \"EXIT $k \$(cat $(sq "$ex") 2> /dev/null || echo none)\"; fi"$'\n'
      done
      par "sw-$n" "${ohosts[$n]}" "i=0; while [ \$i -lt $((swait * 10)) ] && { $waitfor; } > /dev/null; do sleep 0.1; i=\$((i + 1)); done"$'\n'"$rep"
    done
    par_wait
    declare -A sx=()
    for ((n = 0; n < ${#ohosts[@]}; n++)); do
      while read -r _ k e; do sx[$k]=$e; done < <(par_out "sw-$n" | grep '^EXIT ')
    done
    failed="" running=""
    for ((k = 0; k < nshards; k++)); do
      [ "${sx[$k]:-}" = 0 ] && continue
      [ "$nsrv" -gt "$nshards" ] && [ "${sx[$((nshards + k))]:-}" = 0 ] && {
        echo "$me: reshard: $(sname $k) on ${shost[$k]}: ${sx[$k]:-unknown} at the stop; its backup wrote" \
          "the pair's checkpoint at clock $B: going on" >&2; continue; }
      for i in $k $([ "$nsrv" -gt "$nshards" ] && echo $((nshards + k))); do
        case "${sx[$i]:-}" in
          running) running+=", $(sname $i) on ${shost[$i]}" ;;
          *) failed+=", $(sname $i) on ${shost[$i]} (status ${sx[$i]:-unknown}, log $RUN/$(slog $i).log there)" ;;
        esac
      done
    done
    if [ -n "$running" ]; then
      echo "$me: reshard: ${running#, } still running ${swait}s after the stop at clock $B;" \
        "nothing was moved. Once it has exited, the next start of $CONFIG or $NEW rolls the" \
        "re-shard back ($INTENT_F)" >&2
      exit 1
    fi
    if [ -n "$failed" ]; then
      # no commit yet: nothing was moved; the old shards start again from
      # their checkpoints (those that stopped, at B) and the workers, which
      # never left the old map, go on with it
      echo "$me: reshard: ${failed#, } did not stop with its checkpoint at clock $B: rolling back" >&2
      precopy_cancel
      if PS_CLUSTER_INTENT_OWNER=$$ "$0" "$CONFIG" start --live-run "$RUN" "${common[@]}"; then
        intent_add "done rolled-back"
        echo "$me: reshard: rolled back to $CONFIG: its shards started again from their checkpoints" \
          "(one that died at the stop from its last: its updates since are lost, as in any crash of" \
          "an unreplicated shard); the workers go on with $CONFIG" >&2
      else
        echo "$me: reshard: the old shards did not start again; the next start of $CONFIG rolls" \
          "the re-shard back ($INTENT_F)" >&2
      fi
      exit 1
    fi
    crash_point exited
    # 3. the old checkpoints set aside, every new shard's host given them
    intent_add "from $F" || exit 1
    set_aside || { echo "$me: reshard: nothing was started; the next start of $CONFIG or $NEW" \
      "rolls the re-shard back ($INTENT_F)" >&2; exit 1; }
    intent_add "stopped $B" || exit 1
    crash_point stopped
    intent_add commit || exit 1
    crash_point commit
    # 4. the new shards from them, in the same run; once every one answers
    # from the workers' hosts, the workers' follow file names NEW
    rm -f "$RUN/pointing"
    # (staged: the new shards staged are told to go on, one that ended
    # meanwhile is started unstaged)
    PS_CLUSTER_STAGED=${STAGED[*]+${STAGED[*]}} "$0" "$NEW" start --live-run "$RUN" --reshard-from "$F" \
      --reshard-shards "$nshards" "${common[@]}"; rc=$?
    stage_end
    if [ $rc -ne 0 ] && [ ! -e "$RUN/pointing" ] && ! new_written; then
      # no new shard wrote its checkpoint of the new map (a replicated one
      # writes it before it listens; one that served wrote only its marker
      # first), and the workers were never pointed at the new map: no
      # worker pushed to it, and nothing of it exists. Rolled back: the old files put back
      # on their hosts, the old shards started again from them (at B), the
      # workers, which never left the old map, go on with it.
      echo "$me: reshard: no new shard of $NEW started or wrote a checkpoint: rolling back to" \
        "$CONFIG" >&2
      rm -f "$LOGS/$(basename "${NEW%.y*ml}").run"
      # (`rollback`: a start that finds the record so rolls back too)
      intent_add rollback || exit 1
      if drop_markers && put_back "$CONFIG" "$F" "$nshards" &&
        PS_CLUSTER_INTENT_OWNER=$$ "$0" "$CONFIG" start --live-run "$RUN" "${common[@]}"; then
        intent_add "done rolled-back"
        echo "$me: reshard: rolled back to $CONFIG: the new shards did not start (their logs in" \
          "$RUN on their hosts: server-K.log.failed-*, the last try's server-K.log.before-reshard-*);" \
          "the old shards started again from their checkpoints at clock $B; the workers go on with" \
          "$CONFIG" >&2
      else
        echo "$me: reshard: the rollback did not complete; the next start of $CONFIG or $NEW" \
          "finishes it ($INTENT_F)" >&2
      fi
      exit 1
    fi
    if [ $rc -ne 0 ]; then
      echo "$me: reshard: the new shards did not start, past the commit ($INTENT_F): the old" \
        "checkpoints are in $F; the next start of either config starts the new shards from them" \
        "again (the workers, still running, follow them then)" >&2
      exit $rc
    fi
    intent_add done || exit 1
    t0=$(( ($(cat "$RUN/pointed" 2> /dev/null || date +%s%N) - t0) / 1000000 ))
    echo "$me: reshard: $nshards -> $nnew shards at clock $B while the workers ran," \
      "$((t0 / 1000)).$(printf '%03d' $((t0 % 1000))) s from the stop to the workers pointed at the" \
      "new shards; the old checkpoints are in $F on each host (kept: remove them once the new" \
      "shards have checkpointed)"
    exit 0
  fi

  rm -f "$INTENT_F"
  intent_add "stopping $nshards $nnew" "old_config $CONFIG" "new_config $NEW" "cwd $PWD" "pid $$" || exit 1
  crash_point stopping
  echo "$me: reshard: stopping $CONFIG (the workers, then the shards, which write their checkpoints)"
  "$0" "$CONFIG" stop --ssh "$SSH" --dir "$DIR" --logs "$LOGS" ${WHOSTS:+--worker-hosts "$WHOSTS"} ||
    { echo "$me: reshard: the stop failed; nothing was moved" >&2; intent_add "done refused"; exit 1; }
  intent_add "from $F" || exit 1
  set_aside || exit 1
  intent_add stopped || exit 1
  crash_point stopped
  intent_add commit || exit 1
  crash_point commit
  echo "$me: reshard: $nshards -> $nnew shards; the old checkpoints are in $F on each host" \
    "(kept: remove them once the new shards have checkpointed)"
  args=("${common[@]}" --reshard-from "$F" --reshard-shards "$nshards")
  [ -n "$WHOSTS" ] && args+=(--worker-hosts "$WHOSTS")
  "$0" "$NEW" start "${args[@]}" -- ${WARGS[@]+"${WARGS[@]}"}; rc=$?
  [ $rc -eq 0 ] && { intent_add done || exit 1; }
  [ $rc -eq 0 ] || echo "$me: reshard: the start failed past the commit ($INTENT_F): the next" \
    "start of either config starts the new shards from the old checkpoints again (or by hand: $0" \
    "$NEW start --reshard-from '$F' --reshard-shards $nshards, the same options)" >&2
  exit $rc
fi

if [ "$ACTION" != start ]; then
  RUN=""
  if load_run; then
    mapfile -t shost < <(printf '%s\n' "${RUN_SHARD_HOSTS[@]}")
    whost=("${RUN_WORKER_HOSTS[@]}")
    [ -n "$WHOSTS" ] && IFS=, read -r -a whost <<< "$WHOSTS"
  else
    if [ -n "$WHOSTS" ]; then IFS=, read -r -a whost <<< "$WHOSTS"; else
      whost=("${shost[@]}")
      echo "$me: no run record at $POINTER: looking for workers on the shards' hosts" \
           "(give --worker-hosts if they run elsewhere)" >&2
    fi
  fi
  for h in "${shost[@]}" "${whost[@]}"; do check_host "$h" "--worker-hosts or the config"; done
  if [ $DRY -eq 1 ]; then
    for ((r = 0; r < nworkers; r++)); do echo "${SSHV[*]} -- $(whost_of $r) $(sq "pkill -TERM -f -- $(sq "$(worker_pat $r)")")"; done
    for ((k = 0; k < nsrv; k++)); do echo "${SSHV[*]} -- ${shost[$k]} $(sq "pkill -TERM -f -- $(sq "$(server_pat $k)")")"; done
    exit 0
  fi
  mapfile -t sel_shards < <(seq 0 $((nsrv - 1)))
  mapfile -t sel_workers < <(seq 0 $((nworkers - 1)))
  status=0
  stop_or_status "$ACTION"
  if [ "$ACTION" = stop ]; then
    if [ ${#left[@]} -gt 0 ]; then
      echo "$me: left running: $(printf '%s, ' "${left[@]}" | sed 's/, $//')" >&2
    elif [ -n "$RUN" ] && [ -w "$RUN/run.env" ]; then
      echo "RUN_STATE=stopped" >> "$RUN/run.env"
    fi
  fi
  exit $status
fi

# ---- start ----

if [ -n "$LIVE_RUN" ]; then
  # the shards of a run whose workers keep running (reshard while they
  # run, or a start finishing one): its worker hosts, their config, their
  # follow file
  load_run "$LIVE_RUN/run.env" || die "--live-run: cannot read $LIVE_RUN/run.env"
  [ -n "$RUN_FOLLOW" ] || die "--live-run: the run in $LIVE_RUN has no follow file (RUN_FOLLOW)"
  whost=("${RUN_WORKER_HOSTS[@]}")
elif [ -n "$WHOSTS" ]; then IFS=, read -r -a whost <<< "$WHOSTS"; else whost=("${shost[@]}"); fi
[ ${#whost[@]} -gt 0 ] || die "--worker-hosts: no host given"
for h in "${shost[@]}" "${whost[@]}"; do check_host "$h" "--worker-hosts or the config"; done

# Addresses that cannot work: a wildcard is no address to reach, and a
# loopback address is reachable from its own host only.
remote=""
for h in "${shost[@]}" "${whost[@]}"; do is_loopback "$h" || remote+="${remote:+, }$h"; done
for ((k = 0; k < nshards; k++)); do
  h=${shost[$k]}
  if is_wildcard "$h"; then
    die "$CONFIG: cluster.servers[$k] is $h:${sport[$k]}, a wildcard address: workers cannot" \
        "connect to it and ssh cannot go there; name shard $k's host or its address (with" \
        "cluster.listen_any: true the shard still listens on every address)"
  fi
  if [ -n "$remote" ] && is_loopback "$h"; then
    die "$CONFIG: cluster.servers[$k] is $h:${sport[$k]}, a loopback address, but the cluster" \
        "spans other hosts ($remote): they could not reach it; name the address of the" \
        "host that runs shard $k, one every worker host reaches"
  fi
done

# The commands that start shard K / worker R in the run folder: under
# nohup, the whole background job in braces (else ssh would wait for the
# process to end), its exit status written when it ends.
# In a run whose workers go on (--live-run), the log and exit status of
# the shard process that ran there before are kept, renamed.
shard_start() {
  local log=$RUN/$(slog "$1") keep=""
  [ -n "$LIVE_RUN" ] && keep="for f in $(sq "$log.log") $(sq "$log.exit"); do [ -e \"\$f\" ] && mv -f \"\$f\" \"\$f.${RETRY_KEEP:-before-reshard}-$stamp\"; done; "
  echo "mkdir -p $(sq "$RUN") && cd $(sq "$DIR") && ${keep}{ nohup sh -c $(sq "$(server_cmd "$1"); echo \$? > $(sq "$log.exit")") > $(sq "$log.log") 2>&1 < /dev/null & }"
}
# A live re-shard's staged shard K (the pre-copy; PS_CLUSTER_STAGED lists
# them): told the commit (its wrapper then records its exit status as
# shard_start's does; the session that started it leaves it running) and
# SIGUSR1, its log moved into place; one that ended meanwhile is started
# as shard_start does, unstaged.
staged_start() {
  local log=$RUN/$(slog "$1")
  echo "sp=\$(cat $(sq "$log.staged-pid") 2> /dev/null)
if [ -n \"\$sp\" ] && kill -0 \"\$sp\" 2> /dev/null && grep -q 're-shard staged' $(sq "$log.log.staged") 2> /dev/null; then
  cd $(sq "$DIR") && for f in $(sq "$log.log") $(sq "$log.exit"); do [ -e \"\$f\" ] && mv -f \"\$f\" \"\$f.before-reshard-$stamp\"; done
  : > $(sq "$log.commit") && mv -f $(sq "$log.log.staged") $(sq "$log.log") && kill -USR1 \"\$sp\" && echo 'STAGED-GO'
else
  echo 'UNSTAGED'; [ ! -e $(sq "$log.log.staged") ] || mv -f $(sq "$log.log.staged") $(sq "$log.log.staged-ended-$stamp")
  $(shard_start "$1")
fi"
}
STAGED_SET=${PS_CLUSTER_STAGED:-}
# Each worker follows a re-shard through the file $PS_CONFIG_FOLLOW names
# (libps, docs/elastic.md): RUN/current-config on its host, which holds
# the path of the cluster's current config.
FOLLOW=""
[ -n "$LIVE_RUN" ] && FOLLOW=$RUN_FOLLOW
worker_start() {
  local log=$RUN/worker-$1
  echo "mkdir -p $(sq "$RUN") && cd $(sq "$DIR") && { PS_CONFIG_FOLLOW=$(sq "$FOLLOW") nohup sh -c $(sq "$(worker_cmd "$1"); echo \$? > $(sq "$log.exit")") > $(sq "$log.log") 2>&1 < /dev/null & }"
}
# sh for HOST: the follow file there rewritten to name RCONFIG (absolute),
# whole: written beside it and renamed (a worker reading it meanwhile reads
# the old path or the new one). The temporary name holds the host's name:
# hosts sharing the folder do not trip over each other's.
follow_script() { # HOST
  local t=$FOLLOW.tmp-${1//[^A-Za-z0-9.-]/_}
  echo "mkdir -p $(sq "${FOLLOW%/*}") && cd $(sq "$DIR") && case $(sq "$RCONFIG") in /*) c=$(sq "$RCONFIG") ;; *) c=\$PWD/$(sq "$RCONFIG") ;; esac && printf '%s\n' \"\$c\" > $(sq "$t") && mv -f $(sq "$t") $(sq "$FOLLOW") && echo POINTED"
}

stamp=$(date +%Y%m%d-%H%M%S)
RUN=$LOGS/$NAME-$stamp
[ -n "$LIVE_RUN" ] && RUN=$LIVE_RUN
[ -n "$FOLLOW" ] || FOLLOW=$RUN/current-config
if [ $DRY -eq 1 ]; then
  for ((k = 0; k < nsrv; k++)); do echo "${SSHV[*]} -- ${shost[$k]} $(sq "$(shard_start $k)")"; done
  for ((r = 0; r < nworkers; r++)); do echo "${SSHV[*]} -- $(whost_of $r) $(sq "$(worker_start $r)")"; done
  exit 0
fi
mapfile -t uwhost < <(for ((r = 0; r < nworkers; r++)); do whost_of $r; done | awk '!seen[$0]++')

# 1. Every host at once, before anything starts: reachable, the programs
# and the config there, and nothing of this config running.
mapfile -t hosts < <(printf '%s\n' "${shost[@]}" "${uwhost[@]}" | awk '!seen[$0]++')
for ((n = 0; n < ${#hosts[@]}; n++)); do
  h=${hosts[$n]} need=""
  for ((k = 0; k < nsrv; k++)); do [ "${shost[$k]}" = "$h" ] && need+=" ps-server"; done
  for ((r = 0; r < nworkers; r++)); do [ "$(whost_of $r)" = "$h" ] && need+=" ps-worker ps-stat"; done
  par "pre-$n" "$h" "cd $(sq "$DIR") 2> /dev/null || { printf 'ERR no folder %s (--dir)\\n' $(sq "$DIR"); echo OK; exit 0; }
for b in $(printf '%s\n' $need | sort -u | tr '\n' ' '); do [ -x bin/\$b ] || printf 'ERR no %s/bin/%s (make there, or --dir)\\n' $(sq "$DIR") \"\$b\"; done
[ -r $(sq "$RCONFIG") ] || printf 'ERR cannot read %s\\n' $(sq "$RCONFIG")
pgrep -af -- $(sq "$(any_pat)") | $([ -n "$STAGED_SET" ] && echo "grep -v -- ' --reshard-stage ' |") sed 's/^/RUNNING /'
echo OK"
done
par_wait
problems=() running=()
# (one process seen from two names of the same machine, 127.0.0.1 and
# 127.0.0.2 say, is listed once, on the host the config gives it)
declare -A run_at=()
for ((n = 0; n < ${#hosts[@]}; n++)); do
  h=${hosts[$n]} out=$(par_out "pre-$n")
  if [ "$(par_rc "pre-$n")" -ne 0 ] || ! grep -q '^OK$' <<< "$out"; then
    problems+=("cannot reach $h over ssh: $(grep -v '^OK$' <<< "$out" | tail -n 1)")
    continue
  fi
  while IFS= read -r line; do
    case "$line" in
      ERR\ *) problems+=("on $h: ${line#ERR }") ;;
      RUNNING\ *)
        set -- ${line#RUNNING }
        what=$(sed -nE 's/.* --(shard|rank) ([0-9]+).*/\1 \2/p' <<< "${line#RUNNING }")
        own=0 i=${what#* }
        case "$what" in
          shard\ [0-9]*) [ "${shost[$i]:-}" = "$h" ] || [ "${shost[$((nshards + i))]:-}" = "$h" ] && own=1 ;;
          rank\ [0-9]*) [ "$(whost_of "$i")" = "$h" ] && own=1 ;;
        esac
        if [ -n "${run_at[$what|$1]:-}" ]; then
          [ $own -eq 0 ] || running[${run_at[$what|$1]}]="${what/rank/worker} on $h (pid $1)"
          continue
        fi
        run_at[$what|$1]=${#running[@]}
        running+=("${what/rank/worker} on $h (pid $1)") ;;
    esac
  done <<< "$out"
done
# Points every worker host's follow file at RCONFIG; 1 (saying where) when
# one cannot be.
point_workers() {
  local n h out rc=0
  for ((n = 0; n < ${#uwhost[@]}; n++)); do par "follow-$n" "${uwhost[$n]}" "$(follow_script "${uwhost[$n]}")"; done
  par_wait
  for ((n = 0; n < ${#uwhost[@]}; n++)); do
    h=${uwhost[$n]} out=$(par_out "follow-$n")
    grep -q '^POINTED$' <<< "$out" || {
      echo "$me: cannot point the workers on $h at $RCONFIG ($FOLLOW there): $(tail -n 1 <<< "$out")" >&2; rc=1; }
  done
  return $rc
}
if [ -n "$LIVE_RUN" ] && [ ${#running[@]} -eq "$nsrv" ] && [ ${#problems[@]} -eq 0 ]; then
  # an interrupted re-shard rolled back before its old shards stopped:
  # they run; a stop they may hold (its ps-stat gone) is cancelled
  echo "$me: every shard of $CONFIG runs already; cancelling any re-shard stop they hold, not committed"
  on "$(whost_of 0)" "$(stat_script --reshard-cancel)" 2>&1 | sed 's/^/  /'
  point_workers || exit 1
  echo "$me: the workers of $LIVE_RUN follow $CONFIG"
  exit 0
fi
if [ ${#running[@]} -gt 0 ]; then
  echo "$me: $CONFIG is running already: $(printf '%s, ' "${running[@]}" | sed 's/, $//')" >&2
  echo "$me: stop it first: $0 $CONFIG stop" >&2
  exit 1
fi
if [ ${#problems[@]} -gt 0 ]; then
  printf "$me: %s\n" "${problems[@]}" >&2
  echo "$me: nothing was started" >&2
  exit 1
fi

# 2. The run folder here, with the hosts, so stop and status find them
# (with --live-run, the run's own, its record rewritten for this config).
n=1
while [ -z "$LIVE_RUN" ] && [ -e "$RUN" ]; do n=$((n + 1)); RUN=$LOGS/$NAME-$stamp-$n; done
[ -n "$LIVE_RUN" ] || FOLLOW=$RUN/current-config
mkdir -p "$RUN" || { echo "$me: cannot make the run folder $RUN here" >&2; exit 1; }
{ # data, one value a line (load_run)
  echo "# ps-cluster.sh run, started $(date -Is)"
  printf 'RUN_CONFIG=%s\n' "$RCONFIG"
  printf 'RUN_DIR=%s\n' "$RUN"
  printf 'RUN_SHARD_HOST=%s\n' "${shost[@]}"
  printf 'RUN_WORKER_HOST=%s\n' "${whost[@]}"
  printf 'RUN_WORKER_CONFIG=%s\n' "$WCONFIG"
  printf 'RUN_FOLLOW=%s\n' "$FOLLOW"
} > "$RUN/run.env.tmp" && mv -f "$RUN/run.env.tmp" "$RUN/run.env" ||
  { echo "$me: cannot write $RUN/run.env" >&2; exit 1; }
ln -sfn "$(basename "$RUN")" "$POINTER"

# Stops what this start began (workers, then shards; sel_shards and
# sel_workers hold what was started) and says what is left; exits 1.
sel_shards=() sel_workers=()
rollback() {
  echo "$me: start failed; stopping what it started" >&2
  # Shards get SIGKILL: one stopped by SIGTERM would write a checkpoint of
  # its fresh state, which a corrected config (other servers) then refuses.
  # The failing process's log was shown already.
  # Workers that just started hold nothing: a second, then SIGKILL.
  WAIT=60 WORKER_GRACE=1 SHARD_SIGNAL=KILL LOG_TAIL=0 ROLLBACK=1
  status=0
  stop_or_status stop > "$RUN/rollback.txt" 2>&1
  sed 's/^/  /' "$RUN/rollback.txt" >&2
  if [ ${#left[@]} -gt 0 ]; then
    echo "$me: left running: $(printf '%s, ' "${left[@]}" | sed 's/, $//'); stop them with: $0 $CONFIG stop" >&2
  else
    echo "$me: stopped again; nothing of this start is left running (logs: $RUN on each host)" >&2
    [ -n "$LIVE_RUN" ] || echo "RUN_STATE=failed" >> "$RUN/run.env"
  fi
  exit 1
}

# Prints the end of shard K's log (from its host) to stderr.
shard_log_tail() {
  on "${shost[$1]}" "tail -n 12 $(sq "$RUN/$(slog "$1").log")" 2>&1 | sed 's/^/    | /' >&2
}

# 3. The shards, all at once; each until it listens (or exits, or --wait
# runs out). start_shards K...: those shards; failed=1 when one did not
# listen, its number in `exited` when it ended.
start_shards() {
  local k h out log ex last addr start
  exited=() oddfail=0
  for k in "$@"; do
    log=$RUN/$(slog $k).log ex=$RUN/$(slog $k).exit
    if [ -n "$STAGED_SET" ] && [ -n "$LIVE_RUN" ] && grep -qw "$k" <<< "$STAGED_SET"; then start=$(staged_start $k); else start=$(shard_start $k); fi
    par "shard-$k" "${shost[$k]}" "$start
i=0
while :; do
  if grep -q ' listening on ' $(sq "$log") 2> /dev/null; then
    echo \"LISTENING \$(sed -n 's/.* listening on \\([^ ]*\\) .*/\\1/p' $(sq "$log") | head -n 1)\"; break
  fi
  if [ -e $(sq "$ex") ]; then echo \"EXITED \$(cat $(sq "$ex"))\"; break; fi
  i=\$((i + 1))
  if [ \$i -gt $((WAIT * 10)) ]; then echo TIMEOUT; break; fi
  sleep 0.1
done"
  done
  par_wait
  for k in "$@"; do
    h=${shost[$k]} out=$(par_out "shard-$k") log=$RUN/$(slog $k).log
    # The loop's answer is the last line: whatever the login printed before
    # it (a banner, a warning) must not hide it.
    last=$(tail -n 1 <<< "$out")
    grep -q '^UNSTAGED$' <<< "$out" && echo "$me: reshard: new $(sname $k) on $h ended while staged (log:" \
      "$RUN/$(slog $k).log.staged-ended-$stamp there): started unstaged" >&2
    case "$last" in
      LISTENING\ *) bound[$k]=${last#LISTENING }; sel_shards+=("$k") ;;
      EXITED\ *)
        echo "$me: $(sname $k) on $h exited at start (status ${last#EXITED }); the end of $log there:" >&2
        sel_shards+=("$k"); shard_log_tail $k; failed=1; exited+=("$k"); continue ;;
      TIMEOUT*)
        echo "$me: $(sname $k) on $h did not listen within ${WAIT}s (--wait); the end of $log there:" >&2
        sel_shards+=("$k"); shard_log_tail $k; failed=1; oddfail=1; continue ;;
      *)
        echo "$me: cannot start $(sname $k) on $h over ssh: $last" >&2
        [ "$(par_rc "shard-$k")" -eq 255 ] || sel_shards+=("$k") # 255: ssh never ran it
        failed=1; oddfail=1; continue ;;
    esac
    addr=${bound[$k]%:*}; addr=${addr#[}; addr=${addr%]}
    if [ -n "$remote" ] && is_loopback "$addr"; then
      echo "$me: $(sname $k) on $h listens on ${bound[$k]}, a loopback address (${shost[$k]} resolves" \
           "to it on $h: an /etc/hosts line such as '127.0.1.1 $h'?); workers on other hosts" \
           "cannot reach it. Name its address in cluster.servers, fix /etc/hosts, or set" \
           "cluster.listen_any: true" >&2
      failed=1; oddfail=1
    fi
  done
}
# A live re-shard's new shards (--live-run with --reshard-from) are past
# the commit: the new map is the only way on. A new shard that ends before
# the workers are pointed at it starts again, once, with the same flags
# (from its own checkpoint of the new map when it wrote one, else from the
# old files: the same state either way), as ps-local.sh does; its log is
# kept as server-K.log.failed-STAMP. again_shards K...: those, with what
# they say.
RETRIED=0
again_shards() {
  local k
  RETRIED=1
  for k in "$@"; do
    echo "$me: reshard: new $(sname $k) on ${shost[$k]} ended before the workers were pointed at" \
      "it: starting it again with the same flags" >&2
  done
  failed=0
  # (each listed once in sel_shards, for what a rollback stops)
  mapfile -t sel_shards < <(printf '%s\n' ${sel_shards[@]+"${sel_shards[@]}"} | grep -vxF -f <(printf '%s\n' "$@"))
  RETRY_KEEP=failed start_shards "$@"
}
bound=() failed=0
mapfile -t all_shards < <(seq 0 $((nsrv - 1)))
start_shards "${all_shards[@]}"
STAGED_SET="" # (a shard started again is started unstaged)
live_new=0
[ -n "$LIVE_RUN" ] && [ -n "$RESHARD_FROM" ] && live_new=1
[ $failed -eq 1 ] && [ $live_new -eq 1 ] && [ $oddfail -eq 0 ] && again_shards "${exited[@]}"
if [ $failed -eq 0 ] && [ $live_new -eq 1 ] && [ "${PS_CLUSTER_CRASH_AT:-}" = new-shard ]; then
  # tests only (it_reshard_crash.sh): new shard 0 killed once it listens
  echo "$me: PS_CLUSTER_CRASH_AT=new-shard: $(sname 0) killed with SIGKILL (a test)" >&2
  on "${shost[0]}" "pkill -KILL -f -- $(sq "$(server_pat 0)"); i=0; while [ ! -e $(sq "$RUN/$(slog 0).exit") ] && [ \$i -lt 100 ]; do sleep 0.1; i=\$((i + 1)); done"
fi
[ $failed -eq 0 ] || rollback

# 4. From every worker host, every shard must answer (a monitor handshake:
# ps-stat), or the workers would fail there the same way.
check_shards() {
  local n h out k
  for ((n = 0; n < ${#uwhost[@]}; n++)); do
    par "stat-$n" "${uwhost[$n]}" "cd $(sq "$DIR") || exit 3
  i=0
  while :; do
    out=\$(bin/ps-stat --config $(sq "$RCONFIG") --interval 0.05 2>&1); rc=\$?
    if [ \$rc -eq 0 ]; then echo ANSWERED; break; fi
    i=\$((i + 1))
    if [ \$rc -ne 1 ] || [ \$i -ge 4 ]; then echo \"FAILED \$rc\"; printf '%s\n' \"\$out\"; break; fi
    sleep 0.5
  done"
  done
  par_wait
  for ((n = 0; n < ${#uwhost[@]}; n++)); do
    h=${uwhost[$n]} out=$(par_out "stat-$n")
    case "$out" in
      ANSWERED*) ;;
      FAILED\ 1*)
        echo "$me: from $h, not every shard answers (ps-stat there):" >&2
        grep -E '^[0-9]+ +down ' <<< "$out" | sed 's/^/    /' >&2
        for k in $(grep -E '^[0-9]+ +down ' <<< "$out" | awk '{print $1}'); do
          echo "$me: $(sname $k) on ${shost[$k]} listens on ${bound[$k]}; the end of its log:" >&2
          shard_log_tail "$k"
        done
        failed=1 ;;
      FAILED*)
        echo "$me: on $h, ps-stat cannot check the shards (the workers there would fail too):" >&2
        tail -n +2 <<< "$out" | sed 's/^/    /' >&2
        failed=1 ;;
      *)
        echo "$me: cannot check the shards from $h over ssh: $(tail -n 1 <<< "$out")" >&2
        failed=1 ;;
    esac
  done
}
check_shards
# (a live re-shard's new shard that ended meanwhile: started again, once)
if [ $failed -eq 1 ] && [ $live_new -eq 1 ] && [ $RETRIED -eq 0 ]; then
  dead=()
  for ((k = 0; k < nsrv; k++)); do
    on "${shost[$k]}" "[ -e $(sq "$RUN/$(slog $k).exit") ]" && dead+=("$k")
  done
  if [ ${#dead[@]} -gt 0 ]; then
    again_shards "${dead[@]}"
    [ $failed -eq 0 ] && check_shards
  fi
fi
[ $failed -eq 0 ] || rollback

# 5. The workers, each host's at once; a second later, a look at those that
# ended already (data or secret missing on their host). With --live-run
# they run already: their follow file is pointed at this config, and they
# follow it.
if [ -n "$LIVE_RUN" ]; then
  # (from here a worker may follow the new map: the re-shard no longer
  # rolls back by itself, whatever fails)
  : > "$RUN/pointing"
  point_workers || rollback
  date +%s%N > "$RUN/pointed" # when: the reshard's pause ends here
  uwhost=()
fi
for ((n = 0; n < ${#uwhost[@]}; n++)); do
  h=${uwhost[$n]} script="$(follow_script "${uwhost[$n]}") > /dev/null || { echo NOFOLLOW; exit 0; }"$'\n' check=""
  for ((r = 0; r < nworkers; r++)); do
    [ "$(whost_of $r)" = "$h" ] || continue
    script+="$(worker_start $r) && echo STARTED $r"$'\n'
    check+="e=\$(cat $(sq "$RUN/worker-$r.exit") 2> /dev/null); case \"\$e\" in ''|0) ;; *) echo \"FAILED $r \$e\"; tail -n 8 $(sq "$RUN/worker-$r.log") | sed 's/^/    | /';; esac"$'\n'
  done
  par "workers-$n" "$h" "$script"'sleep 1'$'\n'"$check"
done
par_wait
for ((n = 0; n < ${#uwhost[@]}; n++)); do
  h=${uwhost[$n]} out=$(par_out "workers-$n")
  for r in $(sed -n 's/^STARTED //p' <<< "$out"); do sel_workers+=("$r"); done
  if [ "$(par_rc "workers-$n")" -eq 255 ] && ! grep -q '^STARTED ' <<< "$out"; then
    echo "$me: cannot start the workers on $h over ssh: $(tail -n 1 <<< "$out")" >&2
    failed=1
  fi
  while IFS= read -r line; do
    case "$line" in
      FAILED\ *)
        set -- $line
        echo "$me: worker $2 on $h exited at start (status $3); the end of its log:" >&2; failed=1 ;;
      NOFOLLOW) echo "$me: cannot write the workers' follow file $FOLLOW on $h; no worker started there" >&2; failed=1 ;;
      '    | '*) echo "$line" >&2 ;;
    esac
  done <<< "$out"
done
[ $failed -eq 0 ] || rollback

if [ -n "$RESHARD_FROM" ]; then
  for ((k = 0; k < nshards; k++)); do par "lines-$k" "${shost[$k]}" "grep -h 're-sharded from' $(sq "$RUN/$(slog $k).log")"; done
  par_wait
  for ((k = 0; k < nshards; k++)); do par_out "lines-$k" | grep 're-sharded from'; done > "$RUN/reshard.lines"
  echo "$me: reshard: $(reshard_summary "$RUN/reshard.lines")"
fi
# a start that rolled an interrupted re-shard forward ends its record
if [ -n "${PS_CLUSTER_INTENT:-}" ]; then
  INTENT_F=$PS_CLUSTER_INTENT
  intent_add done || exit 1
fi
if [ -n "$LIVE_RUN" ]; then
  echo "$me: started $nshards shard(s) of $CONFIG; the $nworkers worker(s) of the run follow them"
else
  echo "$me: started $nshards shard(s) and $nworkers worker(s) of $CONFIG"
fi
for ((k = 0; k < nsrv; k++)); do echo "  $(sname $k) on ${shost[$k]}, listening on ${bound[$k]}"; done
for ((r = 0; r < nworkers; r++)); do echo "  worker $r on $(whost_of $r)"; done
echo "  logs: $RUN (on each host)"
echo "  status: $0 $CONFIG status    stop: $0 $CONFIG stop"
exit 0
