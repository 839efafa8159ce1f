#!/usr/bin/env bash
# it_reshard_crash.sh - a re-shard while the workers run, interrupted by a
# kill -9 at each of its steps (docs/reliability.md, "Re-sharding
# interrupted by a crash"), with real processes: `ps-local.sh c2.yaml
# --servers-only` runs 2 shards, two crash_worker processes (integer
# gradients, sgd at lr 1: every weight is the exact sum) train 60 clocks
# following its current-config, and `ps-local.sh c2.yaml reshard c3.yaml`
# asks for 3 shards at clock 10 or so. Killed with SIGKILL:
#  (a) an old shard at its stop: rolled back at once to 2 shards, the
#      others from their checkpoints at the stop clock B, the killed one
#      from its last (none here: every weight of its slices misses exactly
#      the B clocks before the stop, the others exact, none applied twice);
#  (b) a new shard right after it listens, before the workers are pointed
#      at it: started again with the same flags, 3 shards, exact sums;
#  (c) the coordinator (the ps-local.sh re-sharding) after `stopped`: the
#      next ps-local.sh (given c3.yaml) rolls back to 2 shards; after
#      `commit`: the next one (given c2.yaml) rolls forward to 3; exact sums;
#  (d) a worker during the stop, started again at once: 3 shards, exact sums;
#  (e) re-sharding by restart (--restart, the cluster stopped after 20
#      clocks): the reshard command after `stopped` (the next ps-local.sh,
#      given c3.yaml, rolls back) and after `commit` (given c2.yaml, rolls
#      forward); the workers resume at clock 20 and reach 40, exact sums;
#  (f) re-sharding by restart from old checkpoints of different clocks (as
#      an old shard killed at its stop leaves them): rolled back past the
#      commit, nothing of the new map having been written; shard 1's loss
#      exactly its clocks after its checkpoint;
#  (g) ps-cluster.sh (ssh stand-in): its reshard killed after `stopped` and
#      after `commit`; the next start of the other config rolls back or
#      forward, the workers resume and end with exact sums.
#  (h) ps-cluster.sh re-sharding while its workers run (ssh stand-in),
#      killed after `commit`: the next start of c2.yaml rolls forward in
#      the run, starting no worker; the same workers follow to 3 shards and
#      end with exact sums.
#  (i) ps-cluster.sh live again, one run of the same workers through five
#      interrupted re-shards: killed at `stopping`, `exited` and `stopped`
#      (the next start, of c3.yaml, rolls back in the run each time), a new
#      shard killed once it listens (started again, the reshard completes),
#      every new shard dying before its first checkpoint (rolled back by
#      the reshard itself, status 1); exact sums at the end.
#  (j) ps-cluster.sh live, an old shard killed at its stop: rolled back at
#      once in the run; the killed shard's slices short by exactly the
#      clocks before the stop, the others exact, none applied twice.
#  (k) the pre-copy (an embedding table: the workers push rows too): a
#      staged new shard killed before the stop: the others staged, it
#      started again unstaged after the commit, 3 shards, exact sums;
#  (l) the pre-copy's coordinator killed once its new shards are staged
#      (the record at `staging`): the staged shards die with it, the old
#      shards train on to the end; stopped, the next ps-local.sh (given
#      c3.yaml) rolls back to 2 shards, exact sums.
#  (m) ps-cluster.sh live with the pre-copy (ssh stand-in, an embedding
#      table): a staged new shard killed before the stop: the others go on
#      staged, it is started again unstaged after the commit; exact sums.
#  (n) ps-cluster.sh live with the pre-copy, the coordinator killed once
#      the new shards are staged: their ssh sessions end and the staged
#      shards with them; the next start (of c3.yaml) rolls back in the run;
#      the same re-shard again, staged, completes; exact sums.
#  (o) ps-cluster.sh live with the pre-copy on hosts that do not share
#      checkpoint.dir (an ssh stand-in giving each host a mount namespace
#      of its own; root only, else skipped saying so): the old bases copied
#      to the hosts that lack them before the stop, the incremental ones
#      after it; every new shard goes on staged from its copy; exact sums.
#  (p) ps-cluster.sh live with the pre-copy, an old shard that does not
#      write its pre-copy checkpoint in time (SIGSTOP, PS_CLUSTER_PRECOPY_WAIT
#      3 s; SIGCONT as the stop is asked): given up, saying so, the re-shard
#      goes on unstaged (the late pre-copy the base of that shard's stop
#      checkpoint); exact sums.
#  (q) the hosts of (o) (root only), one run: the coordinator killed while
#      it copies a base to another host (the next start rolls back and
#      removes the copy, the record's `copied` line); then a copied base cut
#      short before the staged shard loads it: given up, saying so, the
#      re-shard goes on unstaged; exact sums.
#  (r) ps-cluster.sh live with pairs (cluster.replicas: 1), 2 -> 3 pairs, the
#      last old primary killed at its stop: its backup's checkpoint makes the
#      pair whole, the re-shard completes; exact sums.
# Each case: the workers train to the end; the map they end on is the one
# their follow file names, every shard of it up (ps-stat --json); the
# intent record ends `done`; the old checkpoints are kept where it rolled
# forward. PS_LOCAL_CRASH_AT (ps-local.sh, tests only) picks the step.
# Prints Check-style "N%: Checks" so scripts/run-tests.sh summarises it.
set -u
cd "$(dirname "$0")/.." || exit 1
# the worker of the build variant bin/ was linked for (build/variant: rel, san)
obj=build/$(cat build/variant 2>/dev/null || echo rel)
W=$PWD/$obj/tests/crash_worker
if [ ! -x "$W" ]; then
  echo "SKIP: $W is not built (make $obj/tests/crash_worker; make test builds it)"
  exit 77
fi
CLOCKS=60 PACE=50
checks=0 fails=0
ok() { checks=$((checks + 1)); }
bad() { checks=$((checks + 1)); fails=$((fails + 1)); echo "FAIL: $*"; }
expect() { # DESCRIPTION COMMAND...
  local what=$1; shift
  if "$@"; then ok; else bad "$what"; fi
}
# the run's two workers exited 0, their follow file names config $1 (when
# given), and worker 0 found every weight and row the exact sum
trained_exact() {
  [ "$(cat "$run"/worker-[01].exit | tr "\n" " ")" = "0 0 " ] &&
    { [ -z "${1:-}" ] || [ "$(cat "$run/current-config")" = "$1" ]; } &&
    grep -q "final: exact $TOTAL of $TOTAL, short 0, wrong 0" "$run/worker-0.log"
}
tmp=$(mktemp -d /tmp/ps-reshard-crash.XXXXXX)
pids=() # every process started here (coordinators and workers)
cleanup() {
  local p
  kill_jobs TERM "${pids[@]}" # (those not waited for yet: scripts/ps-lib.sh)
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  # shards whose ps-local.sh was killed with SIGKILL by a case
  pkill -KILL -f -- "--config $tmp/" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
. tests/lib-ports.sh # free_port
. scripts/ps-lib.sh # kill_jobs
# waits (60 s at most) until file $1 matches pattern $2
wait_for() {
  for _ in $(seq 600); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}
# waits (120 s at most) for child $1 to end; its status, 124 when it did not
wait_end() {
  for _ in $(seq 1200); do
    kill -0 "$1" 2>/dev/null || { wait "$1"; return; }
    sleep 0.1
  done
  return 124
}
unset PS_SECRET_FILE PS_CONFIG_FOLLOW PS_LOCAL_CTL
export OPENBLAS_NUM_THREADS=1

# a fresh case folder $c with its configs (2 and 3 shards, fresh ports);
# with "rows" as $2 an embedding table too (crash_worker pushes 300 rows of
# 4 floats each clock): TOTAL, the floats crash_worker checks
new_case() {
  c=$tmp/$1
  mkdir -p "$c/ck"
  local p0 p1 p2 table=""
  TOTAL=4000
  if [ "${2:-}" = rows ]; then
    table="  embeddings:
    - {name: e, dim: 4, init: zeros, optimizer: sgd, lr: 1}"
    TOTAL=5200
  fi
  p0=$(free_port) && p1=$(free_port "$p0") && p2=$(free_port "$p0" "$p1")
  cat > "$c/c2.yaml" <<EOF
cluster:
  servers: [127.0.0.1:$p0, 127.0.0.1:$p1]
  workers: 2
slice_bytes: 1024
optimizer: {name: sgd, lr: 1}
model:
  tensors:
    - {name: a, shape: [3000], init: zeros}
    - {name: b, shape: [1000], init: zeros}
$table
limits: {reconnect_timeout_ms: 60000, request_timeout_ms: 60000}
checkpoint: {dir: $c/ck, every_s: 0}
security: {auth: false}
log: {level: info}
EOF
  sed "s/servers: .*/servers: [127.0.0.1:$p0, 127.0.0.1:$p1, 127.0.0.1:$p2]/" "$c/c2.yaml" > "$c/c3.yaml"
}
# the coordinator: ps-local.sh CONFIG --servers-only, logs in $c/LOGS, with
# PS_LOCAL_CRASH_AT=$3; its pid in coord once its shards listen
start_coord() { # CONFIG LOGS [CRASH_AT]
  PS_LOCAL_CRASH_AT=${3:-} scripts/ps-local.sh "$c/$1" --servers-only --logs "$c/$2" \
    > "$c/$2.out" 2>&1 &
  coord=$!
  pids+=($coord)
  wait_for "$c/$2.out" "shards running"
}
start_worker() { # RANK: following $c/l's current config
  PS_CONFIG=$c/c2.yaml PS_RANK=$1 PS_CONFIG_FOLLOW=$c/l/current-config "$W" $CLOCKS $PACE \
    >> "$c/w$1.out" 2>> "$c/w$1.err" &
  wpid[$1]=$!
  pids+=(${wpid[$1]})
}
# The case's end: the workers trained to the end on the map of N shards
# ($1), every weight as its worker 0 says ($2: exact, or rolled-back B: the
# killed shard's slices short by B clocks), and the record done.
check_end() { # N EXPECT
  local n=$1 want=$2 r rc cur up fin
  for r in 0 1; do
    wait_end "${wpid[$r]}"; rc=$?
    expect "$case: worker $r trained to the end ($rc): $(tail -n 2 "$c/w$r.err")" \
      eval '[ $rc -eq 0 ] && grep -q "^clock $CLOCKS\$" "$c/w$r.err"'
  done
  cur=$(cat "$c/l/current-config")
  expect "$case: the workers follow c$n.yaml ($cur)" [ "$cur" = "$(realpath "$c/c$n.yaml")" ]
  up=$(bin/ps-stat --config "$cur" --json 2>/dev/null | python3 -c \
    'import json,sys; s=json.load(sys.stdin)["shards"]; print(len(s), sum(1 for x in s if x.get("up")))')
  expect "$case: $n shards, all up ($up)" [ "$up" = "$n $n" ]
  fin=$(grep '^final:' "$c/w0.out" | tail -n 1)
  case $want in
    exact) expect "$case: every weight the exact sum ($fin)" \
      [ "$fin" = "final: exact $TOTAL of $TOTAL, short 0, wrong 0, deficits:" ] ;;
    rolled-back*) expect "$case: the surviving shard's weights exact, the killed one's short by the clocks before the stop, none wrong ($fin; stop at ${want#* })" \
      grep -qE "^final: exact [1-9][0-9]* of $TOTAL, short [0-9]+, wrong 0, deficits:( ${want#* })?\$" <<<"$fin" ;;
  esac
  expect "$case: the intent record is done: $(tr '\n' ';' < "$c/ck/reshard.intent")" \
    grep -q '^done' "$c/ck/reshard.intent"
}
stop_coord() { # ends the run's ps-local.sh ($coord): status 130 after SIGTERM
  kill -TERM "$coord" 2>/dev/null
  wait_end "$coord"
}
reshard() { # the reshard command, its output in $c/r.out, its status in rrc
  scripts/ps-local.sh "$c/c2.yaml" reshard "$c/c3.yaml" > "$c/r.out" 2>&1
  rrc=$?
  return $rrc
}

# (a) an old shard killed with SIGKILL at its stop
case=a; new_case a
start_coord c2.yaml l stop-shard
start_worker 0; start_worker 1
expect "a: trained 10 clocks" wait_for "$c/w0.err" "^clock 10$"
reshard
b=$(sed -n 's/.*at the stop at clock \([0-9]*\).*/\1/p' "$c/r.out")
if grep -q "rolled back to" "$c/r.out"; then
  expect "a: status 1 naming the dead shard: $(tail -n 1 "$c/r.out")" \
    eval '[ $rrc -eq 1 ] && grep -q "shard 1 with status 137" "$c/r.out"'
  check_end 2 "rolled-back $b"
  expect "a: nothing moved aside" sh -c "! ls -d '$c'/ck/reshard-from-* 2>/dev/null"
else # the shard had written its checkpoint and exited before the kill
  echo "a: old shard 1 had stopped before it was killed: the re-shard went on"
  expect "a: reshard succeeded ($rrc): $(tail -n 1 "$c/r.out")" [ $rrc -eq 0 ]
  check_end 3 exact
fi
stop_coord

# (b) a new shard killed with SIGKILL right after it listens
case=b; new_case b
start_coord c2.yaml l new-shard
start_worker 0; start_worker 1
expect "b: trained 10 clocks" wait_for "$c/w0.err" "^clock 10$"
reshard
expect "b: reshard succeeded ($rrc): $(tail -n 1 "$c/r.out")" [ $rrc -eq 0 ]
expect "b: the killed new shard was started again" \
  grep -q "new shard 0 ended with status 137 .*starting it again with the same flags" "$c/l.out"
check_end 3 exact
expect "b: the old checkpoints kept" test -f "$(echo "$c"/ck/reshard-from-2.*/shard-1.ckpt)"
stop_coord

# (c) the coordinator killed with SIGKILL after `stopped`, then after `commit`
for step in stopped commit; do
  case=c-$step; new_case "$case"
  start_coord c2.yaml l "$step"
  start_worker 0; start_worker 1
  expect "$case: trained 10 clocks" wait_for "$c/w0.err" "^clock 10$"
  reshard
  expect "$case: the reshard command says its coordinator ended ($rrc): $(tail -n 1 "$c/r.out")" \
    eval '[ $rrc -eq 1 ] && grep -q "ended before it answered" "$c/r.out"'
  wait_end "$coord"
  expect "$case: the record stops at $step" [ "$(tail -n 1 "$c/ck/reshard.intent" | cut -d' ' -f1)" = "$step" ]
  scripts/ps-local.sh "$c/c2.yaml" reshard "$c/c3.yaml" > "$c/r2.out" 2>&1; rc=$?
  expect "$case: another reshard is refused until it is finished ($rc): $(cat "$c/r2.out")" \
    eval '[ $rc -eq 1 ] && grep -q "a re-shard was interrupted .*nothing was done" "$c/r2.out"'
  # the next ps-local.sh, given the other config than the one it ends on
  if [ $step = stopped ]; then
    start_coord c3.yaml l2
    expect "$case: rolled back: $(grep interrupted "$c/l2.out")" \
      grep -q "had not reached its commit: rolled back" "$c/l2.out"
    check_end 2 exact
    expect "$case: the old checkpoints put back" sh -c "! ls -d '$c'/ck/reshard-from-* 2>/dev/null"
  else
    start_coord c2.yaml l2
    expect "$case: rolled forward: $(grep interrupted "$c/l2.out")" \
      grep -q "had passed its commit: rolled forward" "$c/l2.out"
    check_end 3 exact
    expect "$case: the old checkpoints kept" test -f "$(echo "$c"/ck/reshard-from-2.*/shard-1.ckpt)"
  fi
  stop_coord
done

# (d) a worker killed with SIGKILL during the stop, started again at once
case=d; new_case d
start_coord c2.yaml l
start_worker 0; start_worker 1
expect "d: trained 10 clocks" wait_for "$c/w0.err" "^clock 10$"
reshard &
rpid=$!
expect "d: the stop began" wait_for "$c/ck/reshard.intent" "^stopping"
kill -KILL "${wpid[1]}"
wait "${wpid[1]}" 2>/dev/null
start_worker 1
wait "$rpid"; rrc=$?
reshard_out=$(tail -n 1 "$c/r.out")
expect "d: reshard succeeded ($rrc): $reshard_out" [ $rrc -eq 0 ]
check_end 3 exact
expect "d: the restarted worker resumed past clock 0: $(grep 'from clock' "$c/w1.err" | tail -n 1)" \
  grep -qE "from clock [1-9]" <<<"$(grep 'from clock' "$c/w1.err" | tail -n 1)"
stop_coord

# (k) the pre-copy, a staged new shard killed with SIGKILL before the stop
case=k; new_case k rows
start_coord c2.yaml l staged-shard
start_worker 0; start_worker 1
expect "k: trained 10 clocks" wait_for "$c/w0.err" "^clock 10$"
reshard
expect "k: reshard succeeded ($rrc): $(tail -n 1 "$c/r.out")" [ $rrc -eq 0 ]
expect "k: the new shards were staged, one killed: $(grep -E 'pre-copy|staged-shard' "$c/l.out" | tr '\n' ';')" \
  eval 'grep -q "PS_LOCAL_CRASH_AT=staged-shard: new shard 0 (staged) killed" "$c/l.out" &&
    grep -q "pre-copy: the old shards wrote their checkpoints and the 3 new shard(s) loaded them" "$c/l.out"'
expect "k: the old shards' stop wrote incremental checkpoints on the pre-copy" \
  grep -q "re-shard stop.*delta-1.*on the re-shard's pre-copy" "$c/l/server-1.log.before-reshard-1"
expect "k: new shards 1 and 2 went on staged, shard 0 started again unstaged" \
  eval 'grep -q "same placement, staged)" "$c/l/server-1.log" && grep -q "same placement, staged)" "$c/l/server-2.log" &&
    grep -q "new shard 0 ended with status 137 .*starting it again with the same flags" "$c/l.out" &&
    grep -q "(same placement):" "$c/l/server-0.log"'
check_end 3 exact
stop_coord

# (l) the pre-copy's coordinator killed with SIGKILL once the new shards
# are staged: they die with it; the old shards go on
case=l; new_case l rows
start_coord c2.yaml l staged
start_worker 0; start_worker 1
expect "l: trained 10 clocks" wait_for "$c/w0.err" "^clock 10$"
reshard
expect "l: the reshard command says its coordinator ended ($rrc): $(tail -n 1 "$c/r.out")" \
  eval '[ $rrc -eq 1 ] && grep -q "ended before it answered" "$c/r.out"'
wait_end "$coord"
expect "l: the record stops at staging" [ "$(tail -n 1 "$c/ck/reshard.intent")" = staging ]
gone=0
for _ in $(seq 100); do
  pgrep -f -- "--config $c/c3.yaml" > /dev/null || { gone=1; break; }
  sleep 0.1
done
expect "l: no staged shard is left: $(pgrep -af -- "--config $c/c3.yaml")" [ $gone = 1 ]
for r in 0 1; do
  wait_end "${wpid[$r]}"; rc=$?
  expect "l: worker $r trained to the end on the old shards ($rc)" [ $rc -eq 0 ]
done
for p in $(pgrep -f -- "--config $c/c2.yaml"); do kill -TERM "$p"; done
for _ in $(seq 100); do pgrep -f -- "--config $c/c2.yaml" > /dev/null || break; sleep 0.1; done
start_coord c3.yaml l2
expect "l: rolled back: $(grep interrupted "$c/l2.out")" \
  grep -q "had not reached its commit: rolled back" "$c/l2.out"
check_end 2 exact
stop_coord

# (e) re-sharding by restart (--restart), the coordinator killed after
# `stopped`, then after `commit`: a run of 20 clocks ended with its
# checkpoints; the reshard command is killed; the next ps-local.sh (of the
# other config) rolls back or forward and its workers go on to clock 40
for step in stopped commit; do
  case=e-$step; new_case "$case"
  scripts/ps-local.sh "$c/c2.yaml" --logs "$c/l0" --worker-cmd "$W 20" > "$c/l0.out" 2>&1
  expect "$case: the first run trained 20 clocks: $(grep final "$c/l0.out")" \
    grep -q "final: exact 4000 of 4000, short 0, wrong 0" "$c/l0.out"
  PS_LOCAL_CRASH_AT=$step scripts/ps-local.sh "$c/c2.yaml" reshard "$c/c3.yaml" --restart \
    --logs "$c/l1" --worker-cmd "$W 40" > "$c/l1.out" 2>&1; rc=$?
  expect "$case: the reshard command was killed at $step ($rc)" \
    eval '[ $rc -eq 137 ] && [ "$(tail -n 1 "$c/ck/reshard.intent" | cut -d" " -f1)" = "$step" ]'
  if [ $step = stopped ]; then n=2 other=c3; else n=3 other=c2; fi
  scripts/ps-local.sh "$c/$other.yaml" --logs "$c/l2" --worker-cmd "$W 40" > "$c/l2.out" 2>&1; rc=$?
  expect "$case: the next run ends 0 on $n shards ($rc): $(grep -E "interrupted|shard\(s\)," "$c/l2.out")" \
    eval '[ $rc -eq 0 ] && grep -q "^ps-local.sh: $n shard(s), 2 worker(s) from $c/c$n.yaml" "$c/l2.out"'
  expect "$case: its workers resumed at 20 and trained to 40, every weight the exact sum: $(grep final "$c/l2.out")" \
    eval 'grep -q "from clock 20" "$c/l2/worker-1.log" && grep -q "final: exact 4000 of 4000, short 0, wrong 0" "$c/l2.out"'
  expect "$case: the intent record is done: $(tr '\n' ';' < "$c/ck/reshard.intent")" \
    grep -q '^done' "$c/ck/reshard.intent"
done

# (f) re-sharding by restart from checkpoints of different clocks, as an
# old shard killed at its stop leaves them (shard 1's checkpoint of clock
# 20 put back beside shard 0's of 30): the new shards refuse the mix past
# the commit, before any wrote a checkpoint, so the re-shard rolls back;
# the next run of c2.yaml resumes at 30 with shard 1 brought forward: its
# slices short by exactly those 10 clocks, the others exact, none wrong
case=f; new_case f
scripts/ps-local.sh "$c/c2.yaml" --logs "$c/l0" --worker-cmd "$W 20" > "$c/l0.out" 2>&1
cp "$c/ck/shard-1.ckpt" "$c/shard-1.ckpt.20"
scripts/ps-local.sh "$c/c2.yaml" --logs "$c/l1" --worker-cmd "$W 30" > "$c/l1.out" 2>&1
expect "f: two runs trained to 30: $(grep final "$c/l1.out")" \
  grep -q "final: exact 4000 of 4000, short 0, wrong 0" "$c/l1.out"
cp "$c/shard-1.ckpt.20" "$c/ck/shard-1.ckpt"
scripts/ps-local.sh "$c/c2.yaml" reshard "$c/c3.yaml" --restart --logs "$c/l2" \
  --worker-cmd "$W 40" > "$c/l2.out" 2>&1; rc=$?
expect "f: the reshard rolled back, status 1 ($rc): $(grep -E "rolled|different clocks" "$c/l2.out" | cut -c1-300)" \
  eval '[ $rc -eq 1 ] && grep -q "reshard: rolled back to $c/c2.yaml: no new shard started" "$c/l2.out" \
  && grep -q "different clocks" "$c/l2.out"'
expect "f: the record says so: $(tr '\n' ';' < "$c/ck/reshard.intent")" \
  grep -q '^done rolled-back' "$c/ck/reshard.intent"
expect "f: the old checkpoints are back" \
  sh -c "test -f '$c/ck/shard-0.ckpt' && test -f '$c/ck/shard-1.ckpt' && ! ls -d '$c'/ck/reshard-from-* 2>/dev/null"
scripts/ps-local.sh "$c/c2.yaml" --logs "$c/l3" --worker-cmd "$W 40" > "$c/l3.out" 2>&1; rc=$?
expect "f: the next run of c2.yaml ends 0 ($rc), resumed at 30: $(grep 'from clock' "$c/l3/worker-1.log")" \
  eval '[ $rc -eq 0 ] && grep -q "from clock 30" "$c/l3/worker-1.log"'
expect "f: shard 1's slices short by its 10 lost clocks, the others exact: $(grep final "$c/l3.out")" \
  grep -qE "final: exact [1-9][0-9]* of 4000, short [1-9][0-9]*, wrong 0, deficits: 10\$" "$c/l3.out"

# (g) ps-cluster.sh (an ssh stand-in running each command here): its
# reshard killed after `stopped`, then after `commit`; the next start,
# given the other config, rolls back or forward; its workers resume at 10
# and reach 20 with exact sums
cat > "$tmp/ssh" <<'EOF2'
#!/usr/bin/env bash
[ "$1" = -- ] || { echo "ssh stand-in: '$1' where -- belongs" >&2; exit 255; }
exec sh -c "$3"
EOF2
chmod +x "$tmp/ssh"
cl() { scripts/ps-cluster.sh "$@" --ssh "$tmp/ssh" --logs "$c/logs"; }
cl_wait() { # CONFIG: until its workers have ended (60 s at most)
  for _ in $(seq 600); do
    cl "$c/$1" status 2>/dev/null | grep -q 'worker .*: running' || return 0
    sleep 0.1
  done
  return 1
}
for step in stopped commit; do
  case=g-$step; new_case "$case"
  cl "$c/c2.yaml" start --worker-cmd "$W 10" > "$c/s0.out" 2>&1
  cl_wait c2.yaml
  cl "$c/c2.yaml" stop > /dev/null 2>&1
  expect "$case: the first run trained 10 clocks: $(grep -h final "$c"/logs/c2.run/worker-0.log)" \
    grep -q "final: exact 4000 of 4000, short 0, wrong 0" "$c/logs/c2.run/worker-0.log"
  PS_CLUSTER_CRASH_AT=$step cl "$c/c2.yaml" reshard "$c/c3.yaml" --worker-cmd "$W 20" > "$c/s1.out" 2>&1; rc=$?
  rec=$(echo "$c"/logs/reshard-*.intent)
  expect "$case: the reshard command was killed at $step ($rc): $(tail -n 1 "$c/s1.out")" \
    eval '[ $rc -eq 137 ] && [ "$(tail -n 1 "$rec" | cut -d" " -f1)" = "$step" ]'
  if [ $step = stopped ]; then n=2 other=c3 how="rolled back"; else n=3 other=c2 how="rolled forward"; fi
  cl "$c/$other.yaml" start --worker-cmd "$W 20" > "$c/s2.out" 2>&1; rc=$?
  expect "$case: the next start ($other.yaml) $how to $n shards ($rc): $(grep -E "interrupted|started [0-9]" "$c/s2.out")" \
    eval '[ $rc -eq 0 ] && grep -q "$how" "$c/s2.out" && grep -q "started $n shard(s) and 2 worker(s) of $c/c$n.yaml" "$c/s2.out"'
  cl_wait "c$n.yaml"
  expect "$case: its workers resumed at 10 and trained to 20, every weight the exact sum: $(grep -h final "$c/logs/c$n.run/worker-0.log")" \
    eval 'grep -q "from clock 10" "$c/logs/c$n.run/worker-1.log" && \
    grep -q "final: exact 4000 of 4000, short 0, wrong 0" "$c/logs/c$n.run/worker-0.log"'
  expect "$case: the intent record is done: $(tr '\n' ';' < "$rec")" grep -q '^done' "$rec"
  cl "$c/c$n.yaml" stop > /dev/null 2>&1
done

# (h) ps-cluster.sh re-sharding while its workers run (ssh stand-in):
# killed after `commit`, the workers (crash_worker, 60 clocks, following
# their run's current-config) waiting at the stop; the next start of c2.yaml
# rolls forward in that run, starting no worker: the same workers follow
# the 3 new shards and end with exact sums
case=h-live-commit; new_case "$case"
cl "$c/c2.yaml" start --worker-cmd "$W 60 100" > "$c/s0.out" 2>&1
run=$(readlink -f "$c/logs/c2.run")
wait_for "$run/worker-1.log" "^clock 3$"
PS_CLUSTER_CRASH_AT=commit cl "$c/c2.yaml" reshard "$c/c3.yaml" > "$c/s1.out" 2>&1; rc=$?
rec=$(echo "$c"/logs/reshard-*.intent)
expect "$case: the live reshard was killed at commit ($rc): $(tail -n 1 "$c/s1.out")" \
  eval '[ $rc -eq 137 ] && grep -q "^live $run\$" "$rec" && [ "$(tail -n 1 "$rec")" = commit ]'
cl "$c/c2.yaml" start > "$c/s2.out" 2>&1; rc=$?
expect "$case: the next start of c2.yaml rolled forward to 3 shards in the run ($rc): $(grep -E "interrupted|started [0-9]" "$c/s2.out")" \
  eval '[ $rc -eq 0 ] && grep -q "rolled forward" "$c/s2.out" &&
  grep -q "started 3 shard(s) of $c/c3.yaml; the 2 worker(s) of the run follow them" "$c/s2.out"'
cl_wait c3.yaml
expect "$case: the same workers followed and trained to 60, every weight the exact sum: $(grep -h final "$run/worker-0.log")" \
  eval '[ "$(cat "$run"/worker-[01].exit | tr "\n" " ")" = "0 0 " ] &&
  grep -q "re-shard: following $c/c3.yaml: 3 shard(s), were 2" "$run/worker-1.log" &&
  [ "$(grep -c "^final:" "$run/worker-0.log")" -eq 1 ] &&
  grep -q "final: exact 4000 of 4000, short 0, wrong 0" "$run/worker-0.log"'
expect "$case: the intent record is done: $(tr '\n' ';' < "$rec")" [ "$(tail -n 1 "$rec")" = done ]
cl "$c/c3.yaml" stop > /dev/null 2>&1

# (i) ps-cluster.sh re-sharding while its workers run, one run of the same
# two workers (crash_worker, 400 clocks, following their run's
# current-config) through five interrupted re-shards, each after the
# workers went on a few clocks from the last:
#  - the reshard killed at `stopping` (before the stop is asked), at
#    `exited` (the old shards exited at their stop, nothing set aside) and
#    at `stopped` (the files set aside, no new shard started): the next
#    start, of c3.yaml, rolls back in the run to c2.yaml's shards (those
#    still running, or started again from their checkpoints at the stop,
#    the files put back), starting no worker;
#  - a new shard killed with SIGKILL once it listens, before the workers
#    are pointed at it: started again with the same flags, the reshard
#    completes on 3 shards;
#  - 3 -> 2 with every new shard dying before its checkpoint of the new
#    map is written (an ssh stand-in giving the commands that start them
#    PS_FAULT_CHECKPOINT=write): each started again once, dying again;
#    none wrote one, so the reshard rolls back to c3.yaml, the old files
#    put back, status 1 saying so.
# The workers end on 3 shards with every weight the exact sum.
case=i-live-steps; new_case "$case"
cat > "$tmp/ssh-fault" <<'EOF2'
#!/usr/bin/env bash
[ "$1" = -- ] || { echo "ssh stand-in: '$1' where -- belongs" >&2; exit 255; }
case "$3" in *--reshard-from*) export PS_FAULT_CHECKPOINT=write ;; esac
exec sh -c "$3"
EOF2
chmod +x "$tmp/ssh-fault"
cl "$c/c2.yaml" start --worker-cmd "$W 400 30" > "$c/s0.out" 2>&1
run=$(readlink -f "$c/logs/c2.run")
# until worker 1 is 3 clocks past where it is now (60 s at most)
advance() {
  local k
  k=$(grep -c '^clock ' "$run/worker-1.log" 2>/dev/null)
  for _ in $(seq 600); do
    [ "$(grep -c '^clock ' "$run/worker-1.log" 2>/dev/null)" -ge $((k + 3)) ] && return 0
    sleep 0.1
  done
  return 1
}
expect "$case: the workers train" advance
for step in stopping exited stopped; do
  PS_CLUSTER_CRASH_AT=$step cl "$c/c2.yaml" reshard "$c/c3.yaml" > "$c/s-$step.out" 2>&1; rc=$?
  rec=$(echo "$c"/logs/reshard-*.intent)
  expect "$case: the live reshard was killed at $step ($rc): $(tail -n 1 "$c/s-$step.out")" \
    eval '[ $rc -eq 137 ] && grep -q "^live $run\$" "$rec"'
  cl "$c/c3.yaml" start > "$c/s-$step-2.out" 2>&1; rc=$?
  expect "$case: the next start (c3.yaml) rolled back to c2.yaml in the run ($rc): $(grep -E "interrupted|started [0-9]|runs already" "$c/s-$step-2.out" | tr '\n' ' ')" \
    eval '[ $rc -eq 0 ] && grep -q "had not reached its commit: rolled back" "$c/s-$step-2.out" &&
    grep -qE "started 2 shard\(s\) of $c/c2.yaml; the 2 worker\(s\) of the run follow them|every shard of $c/c2.yaml runs already" "$c/s-$step-2.out"'
  expect "$case: the intent record ends rolled back: $(tr '\n' ';' < "$rec")" \
    [ "$(tail -n 1 "$rec")" = "done rolled-back" ]
  expect "$case: the old checkpoints are back" sh -c "! ls -d '$c'/ck/reshard-from-* 2>/dev/null"
  expect "$case: the workers follow c2.yaml and train on after $step" \
    eval '[ "$(cat "$run/current-config")" = "$c/c2.yaml" ] && advance'
done
PS_CLUSTER_CRASH_AT=new-shard cl "$c/c2.yaml" reshard "$c/c3.yaml" > "$c/s-new.out" 2>&1; rc=$?
expect "$case: the reshard with a new shard killed completed ($rc): $(tail -n 1 "$c/s-new.out")" \
  eval '[ $rc -eq 0 ] && grep -q "reshard: new shard 0 on 127.0.0.1 ended before the workers were pointed at it: starting it again" "$c/s-new.out" &&
  grep -q "reshard: 2 -> 3 shards at clock" "$c/s-new.out"'
expect "$case: the workers follow c3.yaml and train on" \
  eval '[ "$(cat "$run/current-config")" = "$c/c3.yaml" ] && advance'
scripts/ps-cluster.sh "$c/c3.yaml" reshard "$c/c2.yaml" --ssh "$tmp/ssh-fault" --logs "$c/logs" \
  > "$c/s-fail.out" 2>&1; rc=$?
expect "$case: every new shard failed before its checkpoint: rolled back to c3.yaml, status 1 ($rc): $(grep 'reshard:' "$c/s-fail.out" | tail -n 2 | tr '\n' ' ')" \
  eval '[ $rc -eq 1 ] && [ "$(grep -c "starting it again with the same flags" "$c/s-fail.out")" -eq 2 ] &&
  grep -q "reshard: rolled back to $c/c3.yaml: the new shards did not start" "$c/s-fail.out"'
expect "$case: the intent record ends rolled back, the files back: $(tr '\n' ';' < "$rec")" \
  eval '[ "$(tail -n 1 "$rec")" = "done rolled-back" ] && ! ls -d "$c"/ck/reshard-from-3.* 2>/dev/null'
expect "$case: the new shards' markers were removed, no old shard took them: $(ls "$c"/ck/*.reshard 2>/dev/null)" \
  eval '! ls "$c"/ck/shard-*.reshard 2>/dev/null && ! grep -q "did not write this shard.s first checkpoint" "$run"/server-*.log'
cl_wait c3.yaml
expect "$case: the same workers trained to 400 on 3 shards, every weight the exact sum: $(grep -h final "$run/worker-0.log")" \
  eval '[ "$(cat "$run"/worker-[01].exit | tr "\n" " ")" = "0 0 " ] &&
  [ "$(cat "$run/current-config")" = "$c/c3.yaml" ] &&
  [ "$(grep -c "^final:" "$run/worker-0.log")" -eq 1 ] &&
  grep -q "final: exact 4000 of 4000, short 0, wrong 0" "$run/worker-0.log"'
cl "$c/c3.yaml" stop > /dev/null 2>&1

# (j) ps-cluster.sh live: the last old shard killed with SIGKILL at its
# stop (PS_CLUSTER_CRASH_AT=stop-shard, right after ps-stat's commit):
# the reshard rolls back at once, the old shards started again in the run
# (the killed one from its last checkpoint: none here, so its slices miss
# exactly the clocks before the stop), status 1; the same workers go on
# with c2.yaml to the end, nothing applied twice. (When the shard had
# stopped with its checkpoint before the kill, the re-shard went on.)
case=j-live-stop-shard; new_case "$case"
cl "$c/c2.yaml" start --worker-cmd "$W 80 30" > "$c/s0.out" 2>&1
run=$(readlink -f "$c/logs/c2.run")
wait_for "$run/worker-1.log" "^clock 5$"
PS_CLUSTER_CRASH_AT=stop-shard cl "$c/c2.yaml" reshard "$c/c3.yaml" > "$c/s1.out" 2>&1; rc=$?
rec=$(echo "$c"/logs/reshard-*.intent)
B=$(sed -n 's/.*did not stop with its checkpoint at clock \([0-9]*\).*/\1/p' "$c/s1.out")
if [ -n "$B" ]; then
  expect "$case: rolled back at once, status 1 ($rc): $(grep 'reshard:' "$c/s1.out" | tail -n 2 | tr '\n' ' ')" \
    eval '[ $rc -eq 1 ] && grep -q "shard 1 on 127.0.0.1 (status 137" "$c/s1.out" &&
    grep -q "reshard: rolled back to $c/c2.yaml: its shards started again" "$c/s1.out" &&
    [ "$(tail -n 1 "$rec")" = "done rolled-back" ]'
  n=2
else
  echo "$case: old shard 1 had stopped before it was killed: the re-shard went on"
  expect "$case: reshard succeeded ($rc): $(tail -n 1 "$c/s1.out")" [ $rc -eq 0 ]
  n=3
fi
cl_wait "c$n.yaml"
fin=$(grep -h '^final:' "$run/worker-0.log")
expect "$case: the same workers trained to the end on c$n.yaml ($fin)" \
  eval '[ "$(cat "$run"/worker-[01].exit | tr "\n" " ")" = "0 0 " ] && [ "$(cat "$run/current-config")" = "$c/c$n.yaml" ]'
if [ $n = 2 ]; then
  expect "$case: shard 0's slices exact, shard 1's short by the $B clocks before the stop, none wrong ($fin)" \
    grep -qE "^final: exact [1-9][0-9]* of 4000, short [1-9][0-9]*, wrong 0, deficits: $B\$" <<<"$fin"
else
  expect "$case: every weight the exact sum ($fin)" [ "$fin" = "final: exact 4000 of 4000, short 0, wrong 0, deficits:" ]
fi
cl "$c/c$n.yaml" stop > /dev/null 2>&1

# (m) ps-cluster.sh live with the pre-copy (an embedding table: the
# workers push rows too): a staged new shard killed with SIGKILL before the
# stop (PS_CLUSTER_CRASH_AT=staged-shard): the others go on staged, it is
# started again unstaged after the commit; 3 shards, exact sums.
case=m-live-staged-shard; new_case "$case" rows
cl "$c/c2.yaml" start --worker-cmd "$W 200 30" > "$c/s0.out" 2>&1
run=$(readlink -f "$c/logs/c2.run")
wait_for "$run/worker-1.log" "^clock 5$"
PS_CLUSTER_CRASH_AT=staged-shard cl "$c/c2.yaml" reshard "$c/c3.yaml" > "$c/s1.out" 2>&1; rc=$?
expect "$case: the reshard completed, staged, one staged shard killed ($rc): $(grep 'reshard:' "$c/s1.out" | tr '\n' ' ')" \
  eval '[ $rc -eq 0 ] && grep -q "pre-copy: the old shards wrote their checkpoints and the 3 new shard(s) loaded them" "$c/s1.out" &&
  grep -q "PS_CLUSTER_CRASH_AT=staged-shard: new shard 0 (staged) killed" "$c/s1.out" &&
  grep -q "reshard: new shard 0 on 127.0.0.1 ended while staged .*started unstaged" "$c/s1.out" &&
  grep -q "reshard: 2 -> 3 shards at clock" "$c/s1.out"'
expect "$case: the old shards' stop wrote incremental checkpoints on the pre-copy" \
  eval 'cat "$run"/server-1.log.before-reshard-* | grep -q "re-shard stop.*delta-1.*on the re-shard.s pre-copy"'
expect "$case: new shards 1 and 2 went on staged, shard 0 unstaged" \
  eval 'grep -q "same placement, staged)" "$run/server-1.log" && grep -q "same placement, staged)" "$run/server-2.log" &&
  grep -q "(same placement):" "$run/server-0.log"'
cl_wait c3.yaml
expect "$case: the same workers followed and trained to the end, every weight and row the exact sum: $(grep -h final "$run/worker-0.log")" \
  trained_exact
cl "$c/c3.yaml" stop > /dev/null 2>&1

# (n) ps-cluster.sh live with the pre-copy, its coordinator killed once
# the new shards are staged (PS_CLUSTER_CRASH_AT=staged, the record at
# `staging`): their ssh sessions end, and with them the staged shards; the
# old shards train on; the next start (of c3.yaml) rolls back in the run.
# Then the same re-shard again, staged, completes; exact sums at the end.
case=n-live-staged-coordinator; new_case "$case" rows
cl "$c/c2.yaml" start --worker-cmd "$W 300 30" > "$c/s0.out" 2>&1
run=$(readlink -f "$c/logs/c2.run")
wait_for "$run/worker-1.log" "^clock 5$"
PS_CLUSTER_CRASH_AT=staged cl "$c/c2.yaml" reshard "$c/c3.yaml" > "$c/s1.out" 2>&1; rc=$?
rec=$(echo "$c"/logs/reshard-*.intent)
expect "$case: the live reshard was killed once staged ($rc): $(tail -n 1 "$c/s1.out")" \
  eval '[ $rc -eq 137 ] && [ "$(tail -n 1 "$rec")" = staging ]'
gone=0
for _ in $(seq 100); do
  pgrep -f -- "--config $c/c3.yaml" > /dev/null || { gone=1; break; }
  sleep 0.1
done
expect "$case: no staged shard is left: $(pgrep -af -- "--config $c/c3.yaml")" [ $gone = 1 ]
expect "$case: the staged shards stopped, saying why: $(tail -qn 1 "$run"/server-*.log.staged | tr '\n' ' ')" \
  eval '[ "$(grep -l "SIGTERM came before the re-shard.s commit" "$run"/server-*.log.staged | wc -l)" -eq 3 ]'
k=$(grep -c '^clock ' "$run/worker-1.log")
wait_for "$run/worker-1.log" "^clock $((k + 3))$"
expect "$case: the workers train on with the old shards" [ "$(cat "$run/current-config")" = "$c/c2.yaml" ]
cl "$c/c3.yaml" start > "$c/s2.out" 2>&1; rc=$?
expect "$case: the next start (c3.yaml) rolled back in the run, the old shards running ($rc): $(grep -E "interrupted|runs already" "$c/s2.out" | tr '\n' ' ')" \
  eval '[ $rc -eq 0 ] && grep -q "had not reached its commit: rolled back" "$c/s2.out" &&
  grep -q "every shard of $c/c2.yaml runs already" "$c/s2.out" && [ "$(tail -n 1 "$rec")" = "done rolled-back" ]'
cl "$c/c2.yaml" reshard "$c/c3.yaml" > "$c/s3.out" 2>&1; rc=$?
expect "$case: the re-shard again, staged, completed ($rc): $(grep 'reshard:' "$c/s3.out" | tail -n 2 | tr '\n' ' ')" \
  eval '[ $rc -eq 0 ] && grep -q "pre-copy: the old shards wrote their checkpoints and the 3 new shard(s) loaded them" "$c/s3.out" &&
  [ "$(grep -l "same placement, staged)" "$run"/server-[012].log | wc -l)" -eq 3 ]'
cl_wait c3.yaml
expect "$case: the same workers trained to the end on 3 shards, every weight and row the exact sum: $(grep -h final "$run/worker-0.log")" \
  trained_exact "$c/c3.yaml"
cl "$c/c3.yaml" stop > /dev/null 2>&1

# (o) ps-cluster.sh live with the pre-copy on hosts that do not share
# checkpoint.dir: an ssh stand-in that runs each host's commands in a
# mount namespace of their own, $c/ck-HOST bound over $c/ck (root only:
# unshare -m), the shards on 127.0.0.1 and 127.0.0.2 (3: 127.0.0.3 too).
# Each new shard's host is given the old bases it lacks before the stop,
# the stop's incremental ones after it; every new shard goes on staged
# from the copy it read (no base loaded whole); exact sums.
case=o-live-staged-copies; new_case "$case" rows
mkdir -p "$c"/ck-127.0.0.{1,2,3}
cat > "$tmp/ssh-hosts" <<'EOF2'
#!/usr/bin/env bash
[ "$1" = -- ] || { echo "ssh stand-in: '$1' where -- belongs" >&2; exit 255; }
# (q) PS_TEST_CUT=HOST:FILE: that host's copy of FILE cut to half its size
# just before the first staged start there (the one the new shard loads)
if [ -n "${PS_TEST_CUT:-}" ] && [ "$2" = "${PS_TEST_CUT%%:*}" ] && [ ! -e "$PS_TEST_CK.cut" ]; then
  case "$3" in *--reshard-stage*)
    f=$PS_TEST_CK-$2/${PS_TEST_CUT#*:}
    truncate -s $(($(stat -c %s "$f") / 2)) "$f" && echo "$f" > "$PS_TEST_CK.cut" ;;
  esac
fi
exec unshare -m sh -c 'mount --bind "$1-$2" "$1" && exec sh -c "$3"' sh "$PS_TEST_CK" "$2" "$3"
EOF2
chmod +x "$tmp/ssh-hosts"
if ! PS_TEST_CK=$c/ck "$tmp/ssh-hosts" -- 127.0.0.2 "touch '$c/ck/x'" 2>/dev/null || [ ! -e "$c/ck-127.0.0.2/x" ]; then
  echo "SKIP: $case: mount namespaces (unshare -m, mount --bind) need root here"
else
  rm -f "$c/ck-127.0.0.2/x"
  sed -i 's/servers: \[127.0.0.1:\([0-9]*\), 127.0.0.1:\([0-9]*\)\]/servers: [127.0.0.1:\1, 127.0.0.2:\2]/' "$c/c2.yaml"
  sed -i 's/servers: \[127.0.0.1:\([0-9]*\), 127.0.0.1:\([0-9]*\), 127.0.0.1:\([0-9]*\)\]/servers: [127.0.0.1:\1, 127.0.0.2:\2, 127.0.0.3:\3]/' "$c/c3.yaml"
  clh() { PS_TEST_CK=$c/ck scripts/ps-cluster.sh "$@" --ssh "$tmp/ssh-hosts" --logs "$c/logs"; }
  clh "$c/c2.yaml" start --worker-cmd "$W 200 30" > "$c/s0.out" 2>&1
  run=$(readlink -f "$c/logs/c2.run")
  wait_for "$run/worker-1.log" "^clock 5$"
  clh "$c/c2.yaml" reshard "$c/c3.yaml" > "$c/s1.out" 2>&1; rc=$?
  expect "$case: the reshard completed, staged ($rc): $(grep 'reshard:' "$c/s1.out" | tr '\n' ' ')" \
    eval '[ $rc -eq 0 ] && grep -q "pre-copy: the old shards wrote their checkpoints and the 3 new shard(s) loaded them" "$c/s1.out"'
  f3=$(echo "$c"/ck-127.0.0.3/reshard-from-2.*)
  rec=$(echo "$c"/logs/reshard-*.intent)
  expect "$case: each host was given the old bases it lacked before the stop: $(grep '^copied' "$rec" | tr '\n' ';')" \
    eval '[ "$(grep "^copied " "$rec" | sort | tr "\n" ";")" = "copied 0 127.0.0.2;copied 0 127.0.0.3;copied 1 127.0.0.1;copied 1 127.0.0.3;" ]'
  expect "$case: host 3 holds both old bases and their stop's incremental ones: $(ls "$f3" | tr '\n' ' ')" \
    eval '[ -f "$f3/shard-0.ckpt" ] && [ -f "$f3/shard-0.ckpt.delta-1" ] && [ -f "$f3/shard-1.ckpt" ] && [ -f "$f3/shard-1.ckpt.delta-1" ]'
  expect "$case: every new shard went on staged from the copy it read (none loaded a base whole)" \
    eval '[ "$(grep -l "same placement, staged)" "$run"/server-[012].log | wc -l)" -eq 3 ] &&
    ! grep -q "is not the full checkpoint staged" "$run"/server-[012].log'
  cl_wait c3.yaml
  expect "$case: the workers followed and trained to the end, every weight and row the exact sum: $(grep -h final "$run/worker-0.log")" \
    trained_exact
  clh "$c/c3.yaml" stop > /dev/null 2>&1
fi

# (p) ps-cluster.sh live with the pre-copy, an old shard that does not
# write its pre-copy checkpoint in time: shard 1 stopped with SIGSTOP before
# the reshard (its SIGUSR1 waits, pending), PS_CLUSTER_PRECOPY_WAIT=3; the
# pre-copy is given up after 3 s, no new shard staged, saying so, and the
# re-shard goes on unstaged. An ssh stand-in sends shard 1 SIGCONT as the
# stop is asked: its SIGUSR1 comes then, late, so its pre-copy checkpoint
# is written after the staging was given up and its stop's checkpoint is
# an incremental one on it, which the unstaged new shards load as a chain.
# 3 shards, exact sums.
case=p-live-precopy-late; new_case "$case" rows
cat > "$tmp/ssh-cont" <<'EOF2'
#!/usr/bin/env bash
[ "$1" = -- ] || { echo "ssh stand-in: '$1' where -- belongs" >&2; exit 255; }
case "$3" in *--reshard-stop*) [ -z "${PS_TEST_CONT:-}" ] || kill -CONT "$PS_TEST_CONT" ;; esac
exec sh -c "$3"
EOF2
chmod +x "$tmp/ssh-cont"
cl "$c/c2.yaml" start --worker-cmd "$W 200 30" > "$c/s0.out" 2>&1
run=$(readlink -f "$c/logs/c2.run")
wait_for "$run/worker-1.log" "^clock 5$"
s1=$(pgrep -f -- "/bin/ps-server --config $c/c2.yaml --shard 1\$")
expect "$case: old shard 1 found ($s1)" [ -n "$s1" ]
kill -STOP $s1
PS_TEST_CONT=$s1 PS_CLUSTER_PRECOPY_WAIT=3 scripts/ps-cluster.sh "$c/c2.yaml" reshard "$c/c3.yaml" \
  --ssh "$tmp/ssh-cont" --logs "$c/logs" > "$c/s1.out" 2>&1; rc=$?
kill -CONT $s1 2>/dev/null # (whatever happened)
rec=$(echo "$c"/logs/reshard-*.intent)
expect "$case: the pre-copy given up after 3 s, saying so, the reshard completed unstaged ($rc): $(grep 'reshard:' "$c/s1.out" | tr '\n' ' ')" \
  eval '[ $rc -eq 0 ] && grep -q "reshard: not staged (shard 1 on 127.0.0.1: it wrote no pre-copy checkpoint within 3 s (PS_CLUSTER_PRECOPY_WAIT)): going on unstaged" "$c/s1.out" &&
  ! grep -q "pre-copy: the old shards wrote" "$c/s1.out" && grep -q "reshard: 2 -> 3 shards at clock" "$c/s1.out"'
expect "$case: no new shard was staged, all 3 started unstaged: $(ls "$run" | grep staged | tr '\n' ' ')" \
  eval '! ls "$run"/server-*.log.staged* > /dev/null 2>&1 && [ "$(grep -l "(same placement):" "$run"/server-[012].log | wc -l)" -eq 3 ]'
expect "$case: shard 1's SIGUSR1 came once it ran again: its pre-copy written late, its stop's checkpoint incremental on it" \
  eval 'cat "$run"/server-1.log.before-reshard-* | grep -q "checkpoint (re-shard pre-copy) written" &&
  cat "$run"/server-1.log.before-reshard-* | grep -q "re-shard stop.*delta-1.*on the re-shard.s pre-copy"'
expect "$case: the record staged, nothing copied, done: $(tr '\n' ';' < "$rec")" \
  eval 'grep -qx staging "$rec" && ! grep -q "^copied " "$rec" && [ "$(tail -n 1 "$rec")" = done ]'
cl_wait c3.yaml
expect "$case: the same workers followed and trained to the end, every weight and row the exact sum: $(grep -h final "$run/worker-0.log")" \
  trained_exact "$c/c3.yaml"
cl "$c/c3.yaml" stop > /dev/null 2>&1

# (q) ps-cluster.sh live with the pre-copy on hosts that do not share
# checkpoint.dir (the ssh stand-in of (o); root only), one run of the same
# two workers through two re-shards:
#  - the coordinator killed while it copies the old bases to the hosts
#    that lack them (PS_CLUSTER_CRASH_AT=copied: once the first copy is in
#    place, its `copied K HOST` line written before it): the next start, of
#    c3.yaml, rolls back in the run (the old shards run on) and removes the
#    copy, leaving that host's own files;
#  - a staged shard that fails to load a base: host 127.0.0.3's copy of
#    shard-0.ckpt cut to half its size just before new shard 2 starts
#    there: the staging given up, saying so (the other staged shards
#    stopped, the copies removed), the re-shard goes on unstaged and
#    completes; 3 shards, exact sums.
case=q-live-copy-faults; new_case "$case" rows
mkdir -p "$c"/ck-127.0.0.{1,2,3}
if ! PS_TEST_CK=$c/ck "$tmp/ssh-hosts" -- 127.0.0.2 "touch '$c/ck/x'" 2>/dev/null || [ ! -e "$c/ck-127.0.0.2/x" ]; then
  echo "SKIP: $case: mount namespaces (unshare -m, mount --bind) need root here"
else
  rm -f "$c/ck-127.0.0.2/x"
  sed -i 's/servers: \[127.0.0.1:\([0-9]*\), 127.0.0.1:\([0-9]*\)\]/servers: [127.0.0.1:\1, 127.0.0.2:\2]/' "$c/c2.yaml"
  sed -i 's/servers: \[127.0.0.1:\([0-9]*\), 127.0.0.1:\([0-9]*\), 127.0.0.1:\([0-9]*\)\]/servers: [127.0.0.1:\1, 127.0.0.2:\2, 127.0.0.3:\3]/' "$c/c3.yaml"
  clh() { PS_TEST_CK=$c/ck scripts/ps-cluster.sh "$@" --ssh "$tmp/ssh-hosts" --logs "$c/logs"; }
  clh "$c/c2.yaml" start --worker-cmd "$W 300 30" > "$c/s0.out" 2>&1
  run=$(readlink -f "$c/logs/c2.run")
  wait_for "$run/worker-1.log" "^clock 5$"
  PS_CLUSTER_CRASH_AT=copied clh "$c/c2.yaml" reshard "$c/c3.yaml" > "$c/s1.out" 2>&1; rc=$?
  rec=$(echo "$c"/logs/reshard-*.intent)
  read -r _ K H < <(tail -n 1 "$rec")
  expect "$case: the live reshard was killed with a base copied to another host ($rc): $(tail -n 1 "$c/s1.out"); the record: $(tr '\n' ';' < "$rec")" \
    eval '[ $rc -eq 137 ] && grep -qx staging "$rec" && [[ "$(tail -n 1 "$rec")" =~ ^copied\ [01]\ 127\.0\.0\.[123]$ ]] &&
    [ -f "$c/ck-$H/shard-$K.ckpt" ]'
  own=$((${H##*.} - 1)) # the old shard whose host H is, if any (shard-$own.ckpt its own)
  clh "$c/c3.yaml" start > "$c/s2.out" 2>&1; rc=$?
  expect "$case: the next start (c3.yaml) rolled back in the run, the old shards running ($rc): $(grep -E "interrupted|runs already|cannot remove" "$c/s2.out" | tr '\n' ' ')" \
    eval '[ $rc -eq 0 ] && grep -q "had not reached its commit: rolled back" "$c/s2.out" &&
    grep -q "every shard of $c/c2.yaml runs already" "$c/s2.out" && [ "$(tail -n 1 "$rec")" = "done rolled-back" ]'
  expect "$case: the copy of shard-$K.ckpt on $H was removed, that host's own files left: $(ls -A "$c/ck-$H" | tr '\n' ' ')" \
    eval '[ ! -e "$c/ck-$H/shard-$K.ckpt" ] && [ ! -e "$c/ck-$H/.precopy-$K" ] &&
    { [ $own -ge 2 ] || [ -f "$c/ck-$H/shard-$own.ckpt" ]; }'
  k=$(grep -c '^clock ' "$run/worker-1.log")
  expect "$case: the workers train on with the old shards" \
    eval 'wait_for "$run/worker-1.log" "^clock $((k + 3))$" && [ "$(cat "$run/current-config")" = "$c/c2.yaml" ]'
  PS_TEST_CUT=127.0.0.3:shard-0.ckpt clh "$c/c2.yaml" reshard "$c/c3.yaml" > "$c/s3.out" 2>&1; rc=$?
  expect "$case: new shard 2's base cut short: the staging given up, saying so, the reshard completed unstaged ($rc): $(grep 'reshard:' "$c/s3.out" | tr '\n' ' ')" \
    eval '[ $rc -eq 0 ] && [ -e "$c/ck.cut" ] &&
    grep -q "reshard: not staged: new shard 2 on 127.0.0.3 did not load the old files (log: .*shard-0.ckpt.*; going on unstaged" "$c/s3.out" &&
    ! grep -q "pre-copy: the old shards wrote" "$c/s3.out" && grep -q "reshard: 2 -> 3 shards at clock" "$c/s3.out"'
  expect "$case: the staged shards 0 and 1 stopped before the commit, all 3 new shards started unstaged" \
    eval '[ "$(grep -l "SIGTERM came before the re-shard.s commit" "$run"/server-[01].log.staged | wc -l)" -eq 2 ] &&
    [ "$(grep -l "(same placement):" "$run"/server-[012].log | wc -l)" -eq 3 ]'
  expect "$case: the copies were removed from the hosts' checkpoint folders (the cut one too): $(ls "$c"/ck-127.0.0.3 | tr '\n' ' ')" \
    eval '[ ! -e "$c/ck-127.0.0.3/shard-0.ckpt" ] && [ ! -e "$c/ck-127.0.0.3/shard-1.ckpt" ] &&
    [ ! -e "$c/ck-127.0.0.1/shard-1.ckpt" ] && [ ! -e "$c/ck-127.0.0.2/shard-0.ckpt" ]'
  cl_wait c3.yaml
  expect "$case: the same workers followed and trained to the end, every weight and row the exact sum: $(grep -h final "$run/worker-0.log")" \
    trained_exact "$c/c3.yaml"
  clh "$c/c3.yaml" stop > /dev/null 2>&1
fi

# (r) ps-cluster.sh live with pairs (cluster.replicas: 1; ssh stand-in),
# 2 -> 3 pairs while the same two workers run, the last old primary
# killed with SIGKILL at its stop (PS_CLUSTER_CRASH_AT=stop-shard, right
# after ps-stat's commit): its backup, which holds the stop, writes the
# pair's checkpoint at B and the re-shard goes on from that file (or the
# primary had stopped with its own first); every process of the 3 new
# pairs re-sharded from the old files; exact sums: no update lost.
case=r-live-pairs; new_case "$case"
b0=$(free_port) && b1=$(free_port "$b0") && b2=$(free_port "$b0" "$b1")
sed -i "s/^  workers: 2\$/  backups: [127.0.0.1:$b0, 127.0.0.1:$b1]\n  replicas: 1\n  workers: 2/
  s/^slice_bytes:/replication: {timeout_ms: 600}\nslice_bytes:/" "$c/c2.yaml"
sed -i "s/^  workers: 2\$/  backups: [127.0.0.1:$b0, 127.0.0.1:$b1, 127.0.0.1:$b2]\n  replicas: 1\n  workers: 2/
  s/^slice_bytes:/replication: {timeout_ms: 600}\nslice_bytes:/" "$c/c3.yaml"
cl "$c/c2.yaml" start --worker-cmd "$W 200 30" > "$c/s0.out" 2>&1
run=$(readlink -f "$c/logs/c2.run")
wait_for "$run/worker-1.log" "^clock 5$"
PS_CLUSTER_CRASH_AT=stop-shard cl "$c/c2.yaml" reshard "$c/c3.yaml" > "$c/s1.out" 2>&1; rc=$?
rec=$(echo "$c"/logs/reshard-*.intent)
expect "$case: the reshard completed, pair 1 whole through its backup ($rc): $(grep 'reshard:' "$c/s1.out" | tr '\n' ' ')" \
  eval '[ $rc -eq 0 ] && grep -q "PS_CLUSTER_CRASH_AT=stop-shard: shard 1 killed" "$c/s1.out" &&
  grep -q "reshard: 2 -> 3 shards at clock" "$c/s1.out" && [ "$(tail -n 1 "$rec")" = done ]'
if grep -q "its backup wrote the pair's checkpoint" "$c/s1.out"; then
  expect "$case: old backup 1 stopped at the stop clock with the pair's checkpoint" \
    eval 'cat "$run"/server-1-r1.log.before-reshard-* | grep -q "stopped at clock [0-9]* with its checkpoint written"'
else
  echo "$case: old shard 1 had stopped before it was killed: the re-shard went on from its own file"
fi
expect "$case: every process of the 3 new pairs re-sharded from the 2 old pairs' files" \
  eval '[ "$(grep -l "re-sharded from 2 to 3 shards" "$run"/server-[012].log "$run"/server-[012]-r1.log | wc -l)" -eq 6 ]'
cl_wait c3.yaml
expect "$case: the same workers followed and trained to the end, every weight the exact sum: $(grep -h final "$run/worker-0.log")" \
  eval '[ "$(cat "$run"/worker-[01].exit | tr "\n" " ")" = "0 0 " ] && [ "$(cat "$run/current-config")" = "$c/c3.yaml" ] &&
  grep -q "re-shard: following $c/c3.yaml: 3 shard(s), were 2" "$run/worker-1.log" &&
  grep -q "final: exact 4000 of 4000, short 0, wrong 0" "$run/worker-0.log"'
expect "$case: 3 shards and 3 backups up: $(cl "$c/c3.yaml" status 2>&1 | grep -c ': running')" \
  [ "$(cl "$c/c3.yaml" status 2>&1 | grep -E '^ *(shard|backup) ' | grep -c ': running')" -eq 6 ]
cl "$c/c3.yaml" stop > /dev/null 2>&1

echo "$(( checks ? 100 * (checks - fails) / checks : 0 ))%: Checks: $checks, Failures: $fails, Errors: 0"
[ $fails -eq 0 ]
