#!/usr/bin/env bash
# it_slurm.sh - scripts/ps.sbatch under a real Slurm across three hosts.
#
# The hosts are network namespaces (tests/netns-hosts.sh: h1, h2, h3 on a
# bridge, 10.218.0.1-3), each with its own host name (a UTS namespace),
# its own PID namespace and /proc, and a slurmd (Debian's slurm-wlm) in
# the foreground; h1 also runs munged and slurmctld. The slurm.conf,
# the munge key and every daemon's state are made here, in a temporary
# folder; nothing of the machine's own Slurm or munge is used. The
# filesystem is shared, as NFS would be.
#
# A real job: `sbatch --nodes=3 scripts/ps.sbatch CONFIG` from h3: the
# shards on h1 and h2, three workers over h1..h3, ps-stat from h3 while
# they train, the job COMPLETED with every worker through its epoch,
# checkpoints written, nothing left. Then scancel in the middle of a long
# run (the shards checkpoint and exit 0, the job CANCELLED), the same with
# scancel --signal=TERM (the steps only: the job FAILED, as its workers
# were stopped), and a port in use on h2 (the job FAILED, its output
# naming shard 1's log and reason).
#
# Needs root (namespaces), slurmctld, slurmd, slurm-client and munge
# (scripts/install-deps.sh installs them); without them it prints the
# reason and exits 77 (skipped). Prints Check-style "N%: Checks" for
# run-tests.sh.
set -u
cd "$(dirname "$0")/.." || exit 1
root=$PWD
checks=0 fails=0
ok() { checks=$((checks + 1)); }
bad() { checks=$((checks + 1)); fails=$((fails + 1)); echo "FAIL: $*"; }
expect() { # DESCRIPTION COMMAND...
  local what=$1; shift
  if "$@"; then ok; else bad "$what"; fi
}
skip() { echo "SKIP: it_slurm: $*"; exit 77; }

[ "$(id -u)" -eq 0 ] || skip "needs root for network namespaces and the Slurm daemons"
for c in ip unshare hostname /usr/sbin/munged /usr/sbin/slurmctld /usr/sbin/slurmd sbatch scontrol scancel srun; do
  command -v "$c" > /dev/null ||
    skip "$c not found (scripts/install-deps.sh installs slurmctld, slurmd, slurm-client and munge)"
done
[ -x bin/ps-server ] && [ -x bin/ps-worker ] && [ -x bin/ps-stat ] || skip "run 'make' first"
[ -r /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz ] ||
  [ -r /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte ] ||
  skip "Fashion-MNIST missing (scripts/install-deps.sh installs dataset-fashion-mnist)"
. tests/netns-hosts.sh

tmp=$(mktemp -d /tmp/ps-slurm.XXXXXX)
chmod 755 "$tmp"
cleanup() {
  nh_down
  [ -n "${PS_KEEP_TMP:-}" ] && echo "it_slurm: kept $tmp" && return
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
nh_up ps$$ 10.218.0.1 10.218.0.2 10.218.0.3 || skip "$nh_err"
on() { nh_on "$@"; }

# ---- Slurm: munge key, slurm.conf, the daemons ----
export SLURM_CONF=$tmp/slurm.conf
mkdir -p "$tmp/munge" "$tmp/ctld"
chmod 700 "$tmp/munge"
dd if=/dev/urandom of="$tmp/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$tmp/munge/munge.key"
# Short timers, so that a node registers, a job starts and a cancelled
# job is cleaned up in seconds: KillWait is the grace between SIGTERM and
# SIGKILL at scancel.
cat > "$SLURM_CONF" <<EOF
ClusterName=pstest
SlurmctldHost=h1(${A[1]})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$tmp/munge/munge.socket
StateSaveLocation=$tmp/ctld
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdSpoolDir=$tmp/slurmd-%n
SlurmdPidFile=$tmp/slurmd-%n.pid
SlurmdLogFile=$tmp/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SlurmctldTimeout=10
SlurmdTimeout=10
MessageTimeout=5
KillWait=5
MinJobAge=600
InactiveLimit=0
NodeName=h[1-3] NodeAddr=${A[1]},${A[2]},${A[3]} CPUs=2 State=UNKNOWN
PartitionName=main Nodes=h[1-3] Default=YES MaxTime=INFINITE State=UP
EOF
# Each host's first process: its host name, then (h1) munged and
# slurmctld, then slurmd, all in the foreground; it reaps what the job
# steps leave and ends with them.
# (ip netns exec mounts a sysfs of the namespace over /sys, hiding
# /sys/fs/cgroup: slurmd 22.05 initialises its cgroup plugin even with
# proctrack/pgid and task/none, and finds a cgroup v1 hierarchy by the
# tmpfs at /sys/fs/cgroup with the name=systemd hierarchy in it: a tmpfs
# private to the host and that hierarchy mounted again there, unchanged)
cat > "$tmp/init.sh" <<EOF
hostname "\$1"
mount -t tmpfs -o size=1m,mode=755 cgroup /sys/fs/cgroup && mkdir /sys/fs/cgroup/systemd &&
  mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd
if [ "\$1" = h1 ]; then
  /usr/sbin/munged --foreground --force --socket=$tmp/munge/munge.socket \
    --key-file=$tmp/munge/munge.key --pid-file=$tmp/munge/munged.pid \
    --log-file=$tmp/munge/munged.log --seed-file=$tmp/munge/munged.seed &
  for _ in \$(seq 100); do [ -S $tmp/munge/munge.socket ] && break; sleep 0.1; done
  /usr/sbin/slurmctld -D -i > $tmp/slurmctld.out 2>&1 &
fi
/usr/sbin/slurmd -D > $tmp/slurmd-\$1.out 2>&1 &
wait
EOF
for i in 1 2 3; do
  on $i unshare --uts --pid --fork --mount-proc --kill-child bash "$tmp/init.sh" "h$i" > /dev/null 2>&1 &
  disown # killed by cleanup, without a word from bash
  [ $i -eq 1 ] && for _ in $(seq 100); do [ -S "$tmp/munge/munge.socket" ] && break; sleep 0.1; done
done
# every node idle (registered) within 30 s
for _ in $(seq 300); do
  st=$(on 3 sinfo -h -N -o '%N %t' 2> /dev/null)
  [ "$(grep -c ' idle$' <<< "$st")" -eq 3 ] && break
  sleep 0.1
done
[ "$(grep -c ' idle$' <<< "$st")" -eq 3 ] ||
  skip "the Slurm nodes did not come up: sinfo says '$st'; $(tail -n 5 "$tmp"/slurm*.log "$tmp"/*.out "$tmp/munge/munged.log" 2>&1)"
out=$(on 3 timeout 30 srun --nodes=1 --nodelist=h2 hostname 2>&1)
expect "a step on h2 runs there, under h2's own host name: $out" [ "$out" = h2 ]

# ---- the cluster's config and secret (the same path on every host) ----
scripts/ps-keygen "$tmp/c.secret" 2> /dev/null
mkdir -p "$tmp/ckpt" "$tmp/job"
write_config() { # FILE SERVERS [MORE YAML]
  cat > "$1" <<EOF
cluster:
  servers: [$2]
  workers: 3
model: {preset: mlp}
train: {batch: 32, limit: 1920, metrics_dir: metrics}
checkpoint: {dir: ckpt}
security: {secret_file: c.secret}
log: {level: info}
${3:-}
EOF
}
# the shards' names here are placeholders: ps.sbatch puts the nodes in
write_config "$tmp/c.yaml" "placeholder-a:7000, placeholder-b:7001"
# submit [ARGS...]: sbatch on h3 (a login node) from $tmp, the job's id in $job
submit() {
  local out
  out=$(cd "$tmp" && on 3 sbatch --parsable --nodes=3 --output="$tmp/job/%j.out" \
          --export=ALL,PS_LOGS="$tmp/logs",OPENBLAS_NUM_THREADS=1 \
          "$root/scripts/ps.sbatch" c.yaml "$@" 2>&1)
  job=${out%%;*} tsub=$SECONDS
  echo "== sbatch ... scripts/ps.sbatch c.yaml $* -> $out"
  [[ $job =~ ^[0-9]+$ ]] || { bad "sbatch failed: $out"; job=""; }
}
state() { on 3 scontrol show job "$1" 2> /dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
wait_end() { # JOB SECONDS: until the job is neither pending nor running
  local s
  for _ in $(seq $(($2 * 10))); do
    s=$(state "$1")
    case "$s" in PENDING|RUNNING|CONFIGURING|COMPLETING|"") sleep 0.1 ;; *) break ;; esac
  done
  st=$s
  echo "== job $1: $st, $((SECONDS - tsub)) s after its submission"
  sed 's/^/   /' "$tmp/job/$1.out" 2> /dev/null
}
all_procs() { local i; for i in 1 2 3; do nh_procs_on $i | sed "s/^/h$i: /"; done; }
expect_nothing_left() { # WHAT
  local left
  for _ in $(seq 50); do left=$(all_procs); [ -z "$left" ] && break; sleep 0.1; done
  if [ -z "$left" ]; then ok; else bad "$1: processes left: $left"; fi
}
t0=$SECONDS

# ---- a real job across the hosts ----
submit --epochs 1
stat_ok=0
if [ -n "$job" ]; then
  # ps-stat from h3 while the job runs: both shards up, every worker seen
  for _ in $(seq 600); do
    [ -s "$tmp/logs/cluster.yaml" ] &&
      on 3 bin/ps-stat --config "$tmp/logs/cluster.yaml" --workers --interval 0.2 > "$tmp/stat.out" 2>&1 &&
      [ "$(grep -cE '^[01] +up ' "$tmp/stat.out")" -eq 2 ] &&
      [ "$(grep -cE '^[012] +[a-z]+ +[1-9][0-9]* [1-9][0-9]* ' "$tmp/stat.out")" -eq 3 ] && { stat_ok=1; break; }
    case "$(state "$job")" in PENDING|CONFIGURING|RUNNING) sleep 0.1 ;; *) break ;; esac
  done
  echo "== ps-stat on h3 during the job:"; sed 's/^/   /' "$tmp/stat.out"
  expect "ps-stat from h3 saw both shards up and the three workers' clocks: $(cat "$tmp/stat.out" 2>&1)" \
    [ $stat_ok -eq 1 ]
  expect "... the derived config names the allocated nodes" \
    grep -q "servers: \[h1:7000, h2:7001\]" "$tmp/logs/cluster.yaml"
  wait_end "$job" 120
  expect "the job completed (state $st)" [ "$st" = COMPLETED ]
  expect "ps.sbatch put the shards on h1, h2 and the workers over all three" \
    grep -q "shards on h1 h2, 3 workers over 3 nodes" "$tmp/job/$job.out"
  expect "worker 0 trained and evaluated: $(tail -n 3 "$tmp/logs/worker-0.log" 2>&1)" \
    grep -q "epoch 1 test accuracy" "$tmp/logs/worker-0.log"
  for r in 1 2; do
    expect "worker $r trained its 20 steps: $(tail -n 3 "$tmp/logs/worker-$r.log" 2>&1)" \
      grep -q "epoch 1: 20 steps" "$tmp/logs/worker-$r.log"
  done
  for k in 0 1; do
    expect "shard $k ran on h$((k + 1)): $(head -n 3 "$tmp/logs/server-$k.log" 2>&1)" \
      grep -q "listening on ${A[$((k + 1))]}:700$k" "$tmp/logs/server-$k.log"
    expect "shard $k wrote its checkpoint at the end" test -s "$tmp/ckpt/shard-$k.ckpt"
  done
  # worker R on node R mod 3: the shards saw each from its host's address
  for r in 0 1 2; do
    expect "worker $r connected from h$((r + 1)) (${A[$((r + 1))]}): $(grep -h 'connected from' "$tmp"/logs/server-*.log)" \
      grep -q "worker $r connected from ${A[$((r + 1))]}:" "$tmp/logs/server-0.log"
  done
  expect "the job's output reports success" grep -q "ps.sbatch: the workers finished; shard 0 exited with status 0, shard 1 exited with status 0" "$tmp/job/$job.out"
  expect_nothing_left "after the job"
fi
echo "it_slurm: the job took $((SECONDS - t0)) s"
rm -rf "$tmp"/ckpt/* "$tmp/logs"

# ---- scancel in the middle: the shards checkpoint and exit 0 ----
submit --epochs 1000
if [ -n "$job" ]; then
  for _ in $(seq 600); do
    grep -q "training mlp" "$tmp/logs/worker-2.log" 2> /dev/null && break
    sleep 0.1
  done
  expect "the long job trains" grep -q "training mlp" "$tmp/logs/worker-2.log"
  echo "== scancel $job, $((SECONDS - tsub)) s after its submission"
  on 3 scancel "$job"
  wait_end "$job" 60
  expect "the job was cancelled (state $st)" [ "$st" = CANCELLED ]
  for k in 0 1; do
    expect "shard $k checkpointed at SIGTERM: $(tail -n 3 "$tmp/logs/server-$k.log" 2>&1)" \
      test -s "$tmp/ckpt/shard-$k.ckpt"
    expect "... and stopped cleanly" grep -q "stopped: " "$tmp/logs/server-$k.log"
  done
  expect "ps.sbatch reported the shards' exit: $(cat "$tmp/job/$job.out")" \
    grep -q "ps.sbatch: cancelled; shard 0 exited with status 0, shard 1 exited with status 0" "$tmp/job/$job.out"
  expect_nothing_left "after scancel"
fi
rm -rf "$tmp"/ckpt/* "$tmp/logs"

# ---- scancel --signal=TERM: the steps only; the script ends the job ----
submit --epochs 1000
if [ -n "$job" ]; then
  for _ in $(seq 600); do
    grep -q "training mlp" "$tmp/logs/worker-2.log" 2> /dev/null && break
    sleep 0.1
  done
  echo "== scancel --signal=TERM $job, $((SECONDS - tsub)) s after its submission"
  on 3 scancel --signal=TERM "$job"
  wait_end "$job" 60
  expect "the job ended FAILED, its workers stopped (state $st)" [ "$st" = FAILED ]
  expect "the shards checkpointed and exited 0: $(cat "$tmp/job/$job.out")" \
    grep -q "ps.sbatch: the workers finished; shard 0 exited with status 0, shard 1 exited with status 0" "$tmp/job/$job.out"
  expect "... their files written" test -s "$tmp/ckpt/shard-0.ckpt" -a -s "$tmp/ckpt/shard-1.ckpt"
  expect "... the script reported the workers' failure" grep -q "ps.sbatch: done (status 1)" "$tmp/job/$job.out"
  expect_nothing_left "after scancel --signal=TERM"
fi
rm -rf "$tmp"/ckpt/* "$tmp/logs"

# ---- a port in use on h2: shard 1 cannot listen, the job fails ----
write_config "$tmp/other.yaml" "h2:7001"
sed -i '/^checkpoint:/d' "$tmp/other.yaml"
ip netns exec "${H[2]}" bin/ps-server --config "$tmp/other.yaml" --shard 0 > "$tmp/other.log" 2>&1 &
holder=$!
for _ in $(seq 50); do grep -q "listening on" "$tmp/other.log" && break; sleep 0.1; done
submit --epochs 1
if [ -n "$job" ]; then
  wait_end "$job" 60
  expect "the job failed (state $st)" [ "$st" = FAILED ]
  expect "its output names shard 1, its node and its log" \
    grep -q "ps.sbatch: shard 1 on h2 did not start; the end of its log $tmp/logs/server-1.log:" "$tmp/job/$job.out"
  expect "... with the reason" grep -q "cannot listen on h2:7001: Address already in use" "$tmp/job/$job.out"
  expect "... no worker was started" [ ! -e "$tmp/logs/worker-0.log" ]
  expect "... shard 0, started, was stopped without a checkpoint" [ ! -e "$tmp/ckpt/shard-0.ckpt" ]
  expect "... and the job's output says so" \
    grep -q "ps.sbatch: stopping the shards started; shard 0 exited with status 137, shard 1 exited with status 1" "$tmp/job/$job.out"
fi
kill -TERM $holder; wait $holder
expect_nothing_left "port in use"

echo "it_slurm: $((SECONDS - t0)) s for the jobs"
echo "$(( checks ? 100 * (checks - fails) / checks : 0 ))%: Checks: $checks, Failures: $fails, Errors: 0"
[ $fails -eq 0 ]
