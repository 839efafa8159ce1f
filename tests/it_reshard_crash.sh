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
#  (i) the pre-copy (an embedding table: the workers push rows too): a
#      staged new shard killed before the stop: the others staged, it
#      started again unstaged after the commit, 3 shards, exact sums;
#  (j) the pre-copy's coordinator killed once its new shards are staged
#      (the record at `staging`): the staged shards die with it, the old
#      shards train on to the end; stopped, the next ps-local.sh (given
#      c3.yaml) rolls back to 2 shards, exact sums.
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
tmp=$(mktemp -d /tmp/ps-reshard-crash.XXXXXX)
pids=() # every process started here (coordinators and workers)
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  # shards whose ps-local.sh was killed with SIGKILL by a case
  pkill -KILL -f -- "--config $tmp/" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
. tests/lib-ports.sh # free_port
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
      [ $rc -eq 0 ] && grep -q "^clock $CLOCKS\$" "$c/w$r.err"
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
    [ $rrc -eq 1 ] && grep -q "shard 1 with status 137" "$c/r.out"
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
    [ $rrc -eq 1 ] && grep -q "ended before it answered" "$c/r.out"
  wait_end "$coord"
  expect "$case: the record stops at $step" [ "$(tail -n 1 "$c/ck/reshard.intent" | cut -d' ' -f1)" = "$step" ]
  scripts/ps-local.sh "$c/c2.yaml" reshard "$c/c3.yaml" > "$c/r2.out" 2>&1; rc=$?
  expect "$case: another reshard is refused until it is finished ($rc): $(cat "$c/r2.out")" \
    [ $rc -eq 1 ] && grep -q "a re-shard was interrupted .*nothing was done" "$c/r2.out"
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

# (i) the pre-copy, a staged new shard killed with SIGKILL before the stop
case=i; new_case i rows
start_coord c2.yaml l staged-shard
start_worker 0; start_worker 1
expect "i: trained 10 clocks" wait_for "$c/w0.err" "^clock 10$"
reshard
expect "i: reshard succeeded ($rrc): $(tail -n 1 "$c/r.out")" [ $rrc -eq 0 ]
expect "i: the new shards were staged, one killed: $(grep -E 'pre-copy|staged-shard' "$c/l.out" | tr '\n' ';')" \
  grep -q "PS_LOCAL_CRASH_AT=staged-shard: new shard 0 (staged) killed" "$c/l.out" &&
  grep -q "pre-copy: the old shards wrote their checkpoints and the 3 new shard(s) loaded them" "$c/l.out"
expect "i: the old shards' stop wrote incremental checkpoints on the pre-copy" \
  grep -q "re-shard stop.*delta-1.*on the re-shard's pre-copy" "$c/l/server-1.log.before-reshard-1"
expect "i: new shards 1 and 2 went on staged, shard 0 started again unstaged" \
  grep -q "same placement, staged)" "$c/l/server-1.log" && grep -q "same placement, staged)" "$c/l/server-2.log" &&
  grep -q "new shard 0 ended with status 137 .*starting it again with the same flags" "$c/l.out" &&
  grep -q "(same placement):" "$c/l/server-0.log"
check_end 3 exact
stop_coord

# (j) the pre-copy's coordinator killed with SIGKILL once the new shards
# are staged: they die with it; the old shards go on
case=j; new_case j rows
start_coord c2.yaml l staged
start_worker 0; start_worker 1
expect "j: trained 10 clocks" wait_for "$c/w0.err" "^clock 10$"
reshard
expect "j: the reshard command says its coordinator ended ($rrc): $(tail -n 1 "$c/r.out")" \
  [ $rrc -eq 1 ] && grep -q "ended before it answered" "$c/r.out"
wait_end "$coord"
expect "j: the record stops at staging" [ "$(tail -n 1 "$c/ck/reshard.intent")" = staging ]
gone=0
for _ in $(seq 100); do
  pgrep -f -- "--config $c/c3.yaml" > /dev/null || { gone=1; break; }
  sleep 0.1
done
expect "j: no staged shard is left: $(pgrep -af -- "--config $c/c3.yaml")" [ $gone = 1 ]
for r in 0 1; do
  wait_end "${wpid[$r]}"; rc=$?
  expect "j: worker $r trained to the end on the old shards ($rc)" [ $rc -eq 0 ]
done
for p in $(pgrep -f -- "--config $c/c2.yaml"); do kill -TERM "$p"; done
for _ in $(seq 100); do pgrep -f -- "--config $c/c2.yaml" > /dev/null || break; sleep 0.1; done
start_coord c3.yaml l2
expect "j: rolled back: $(grep interrupted "$c/l2.out")" \
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
    [ $rc -eq 137 ] && [ "$(tail -n 1 "$c/ck/reshard.intent" | cut -d' ' -f1)" = "$step" ]
  if [ $step = stopped ]; then n=2 other=c3; else n=3 other=c2; fi
  scripts/ps-local.sh "$c/$other.yaml" --logs "$c/l2" --worker-cmd "$W 40" > "$c/l2.out" 2>&1; rc=$?
  expect "$case: the next run ends 0 on $n shards ($rc): $(grep -E "interrupted|shard\(s\)," "$c/l2.out")" \
    [ $rc -eq 0 ] && grep -q "^ps-local.sh: $n shard(s), 2 worker(s) from $c/c$n.yaml" "$c/l2.out"
  expect "$case: its workers resumed at 20 and trained to 40, every weight the exact sum: $(grep final "$c/l2.out")" \
    grep -q "from clock 20" "$c/l2/worker-1.log" && grep -q "final: exact 4000 of 4000, short 0, wrong 0" "$c/l2.out"
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
  [ $rc -eq 1 ] && grep -q "reshard: rolled back to $c/c2.yaml: no new shard started" "$c/l2.out" \
  && grep -q "different clocks" "$c/l2.out"
expect "f: the record says so: $(tr '\n' ';' < "$c/ck/reshard.intent")" \
  grep -q '^done rolled-back' "$c/ck/reshard.intent"
expect "f: the old checkpoints are back" \
  sh -c "test -f '$c/ck/shard-0.ckpt' && test -f '$c/ck/shard-1.ckpt' && ! ls -d '$c'/ck/reshard-from-* 2>/dev/null"
scripts/ps-local.sh "$c/c2.yaml" --logs "$c/l3" --worker-cmd "$W 40" > "$c/l3.out" 2>&1; rc=$?
expect "f: the next run of c2.yaml ends 0 ($rc), resumed at 30: $(grep 'from clock' "$c/l3/worker-1.log")" \
  [ $rc -eq 0 ] && grep -q "from clock 30" "$c/l3/worker-1.log"
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
    [ $rc -eq 137 ] && [ "$(tail -n 1 "$rec" | cut -d' ' -f1)" = "$step" ]
  if [ $step = stopped ]; then n=2 other=c3 how="rolled back"; else n=3 other=c2 how="rolled forward"; fi
  cl "$c/$other.yaml" start --worker-cmd "$W 20" > "$c/s2.out" 2>&1; rc=$?
  expect "$case: the next start ($other.yaml) $how to $n shards ($rc): $(grep -E "interrupted|started [0-9]" "$c/s2.out")" \
    [ $rc -eq 0 ] && grep -q "$how" "$c/s2.out" && grep -q "started $n shard(s) and 2 worker(s) of $c/c$n.yaml" "$c/s2.out"
  cl_wait "c$n.yaml"
  expect "$case: its workers resumed at 10 and trained to 20, every weight the exact sum: $(grep -h final "$c/logs/c$n.run/worker-0.log")" \
    grep -q "from clock 10" "$c/logs/c$n.run/worker-1.log" && \
    grep -q "final: exact 4000 of 4000, short 0, wrong 0" "$c/logs/c$n.run/worker-0.log"
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
  [ $rc -eq 137 ] && grep -q "^live $run\$" "$rec" && [ "$(tail -n 1 "$rec")" = commit ]
cl "$c/c2.yaml" start > "$c/s2.out" 2>&1; rc=$?
expect "$case: the next start of c2.yaml rolled forward to 3 shards in the run ($rc): $(grep -E "interrupted|started [0-9]" "$c/s2.out")" \
  [ $rc -eq 0 ] && grep -q "rolled forward" "$c/s2.out" &&
  grep -q "started 3 shard(s) of $c/c3.yaml; the 2 worker(s) of the run follow them" "$c/s2.out"
cl_wait c3.yaml
expect "$case: the same workers followed and trained to 60, every weight the exact sum: $(grep -h final "$run/worker-0.log")" \
  [ "$(cat "$run"/worker-[01].exit | tr '\n' ' ')" = "0 0 " ] &&
  grep -q "re-shard: following $c/c3.yaml: 3 shard(s), were 2" "$run/worker-1.log" &&
  [ "$(grep -c '^final:' "$run/worker-0.log")" -eq 1 ] &&
  grep -q "final: exact 4000 of 4000, short 0, wrong 0" "$run/worker-0.log"
expect "$case: the intent record is done: $(tr '\n' ';' < "$rec")" [ "$(tail -n 1 "$rec")" = done ]
cl "$c/c3.yaml" stop > /dev/null 2>&1

echo "$(( checks ? 100 * (checks - fails) / checks : 0 ))%: Checks: $checks, Failures: $fails, Errors: 0"
[ $fails -eq 0 ]
