#!/usr/bin/env bash
# it_launch.sh - the launchers with real processes: ps-cluster.sh prints
# the right commands with --dry-run, and through an ssh stand-in that runs
# them on this machine it starts 2 shards and 2 training workers, reports
# them running, and stops them all; ps.sbatch derives the config from the
# allocation's nodes; the systemd units pass `systemd-analyze verify`.
# Prints Check-style "N%: Checks" so scripts/run-tests.sh summarises it.
set -u
cd "$(dirname "$0")/.." || exit 1
checks=0 fails=0
ok() { checks=$((checks + 1)); }
bad() { checks=$((checks + 1)); fails=$((fails + 1)); echo "FAIL: $*"; }
expect() { # DESCRIPTION COMMAND...
  local what=$1; shift
  if "$@"; then ok; else bad "$what"; fi
}

. scripts/ps-lib.sh # cfg_key
tmp=$(mktemp -d /tmp/ps-launch.XXXXXX)
cleanup() {
  pkill -TERM -f -- "--config $tmp/" 2>/dev/null
  sleep 0.5
  pkill -KILL -f -- "--config $tmp/" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

. tests/lib-ports.sh # free_port

unset PS_SECRET_FILE
cat > "$tmp/c.yaml" <<EOF
cluster:
  servers: [127.0.0.1:$(free_port), 127.0.0.1:$(free_port)]
  workers: 2
model: {preset: mlp}
train: {batch: 32, limit: 1280, metrics_dir: "$tmp/m"}
security: {secret_file: c.secret}
log: {level: info}
EOF
# the same cluster without a secret_file: ps-local.sh makes a secret itself
sed '/^security:/d' "$tmp/c.yaml" > "$tmp/c2.yaml"
# fresh_ports: new ports for the shards of c.yaml and c2.yaml, picked right
# before each run that starts them: a port picked once at the top lies idle
# between the runs, free to the tests of make test's other lane, and a
# shard of a later run then could not bind it
fresh_ports() {
  local p0 p1
  p0=$(free_port); p1=$(free_port "$p0")
  sed -i "s|^  servers: \[127\.0\.0\.1:.*\]|  servers: [127.0.0.1:$p0, 127.0.0.1:$p1]|" \
    "$tmp/c.yaml" "$tmp/c2.yaml"
}

# ps-keygen: 64 hex digits, mode 0600, no overwriting without --force
scripts/ps-keygen "$tmp/c.secret" 2>/dev/null
expect "ps-keygen wrote 64 hex digits" grep -qxE '[0-9a-f]{64}' "$tmp/c.secret"
expect "ps-keygen made it mode 600" [ "$(stat -c %a "$tmp/c.secret")" = 600 ]
cp "$tmp/c.secret" "$tmp/c.secret.before"
scripts/ps-keygen "$tmp/c.secret" 2>/dev/null
expect "ps-keygen refuses to overwrite" cmp -s "$tmp/c.secret" "$tmp/c.secret.before"
# transport: rdma where this machine cannot run it: status 1 and one line
# naming what is missing and suggesting tcp (shard and worker alike)
sed 's/^log:/transport: rdma\nlog:/' "$tmp/c.yaml" > "$tmp/rdma.yaml"
bin/ps-server --config "$tmp/rdma.yaml" --shard 0 2>"$tmp/rdma.err"; rc=$?
expect "ps-server with rdma refused at start (status $rc): $(cat "$tmp/rdma.err")" \
  grep -q "transport rdma: .*\(no RDMA device found\|not built yet\).*use transport: tcp" "$tmp/rdma.err"
[ $rc -eq 1 ] && ok || bad "ps-server with rdma: status $rc"
bin/ps-worker --config "$tmp/rdma.yaml" --rank 0 >/dev/null 2>"$tmp/rdma-w.err"; rc=$?
expect "ps-worker with rdma refused (status $rc): $(cat "$tmp/rdma-w.err")" \
  grep -q "transport rdma: .*use transport: tcp" "$tmp/rdma-w.err"
# a shard whose address is not this host's (192.0.2.1, TEST-NET-1), or
# whose name does not resolve: status 1, the address and the remedy named
for bad in "192.0.2.1|the address is not one of this host's: run shard K on the host of cluster.servers\[K\], or set cluster.listen_any: true" \
           "ps-no-such-host.invalid|on this host; give an address in cluster.servers, add the name to DNS or /etc/hosts, or set cluster.listen_any: true"; do
  host=${bad%%|*} why=${bad#*|}
  sed "s|^  servers: \[127\.0\.0\.1:\([0-9]*\),|  servers: [$host:\1,|" "$tmp/c.yaml" > "$tmp/addr.yaml"
  timeout 60 bin/ps-server --config "$tmp/addr.yaml" --shard 0 2>"$tmp/addr.err"; rc=$?
  expect "ps-server on $host refused (status $rc), naming it and the remedy: $(cat "$tmp/addr.err")" \
    grep -q "cannot listen on $host:[0-9]*: .*$why" "$tmp/addr.err"
  [ $rc -eq 1 ] && ok || bad "ps-server on $host: status $rc"
done
# ps-cluster.sh refuses a config without a secret file (nothing to copy)
scripts/ps-cluster.sh "$tmp/c2.yaml" start --dry-run >/dev/null 2>"$tmp/nosecret.err"
expect "ps-cluster.sh refuses a config without a secret" grep -q "names no security.secret_file" "$tmp/nosecret.err"

# --dry-run: shards then workers on the hosts given, stop in reverse order
awk '/servers:/ { sub(/127\.0\.0\.1:/, "s1:"); sub(/127\.0\.0\.1:/, "s2:") } { print }' \
  "$tmp/c.yaml" > "$tmp/hosts.yaml"
out=$(scripts/ps-cluster.sh "$tmp/hosts.yaml" start --dry-run --worker-hosts w1,w2 -- --epochs 1)
expect "dry-run start prints 4 commands: $out" [ "$(printf '%s\n' "$out" | wc -l)" -eq 4 ]
expect "shard 1 on its host: $out" grep -q "^ssh -o BatchMode=yes -o ConnectTimeout=10 -- s2 .*nohup sh -c .*ps-server[^ ]* --config [^ ]*$tmp/hosts.yaml[^ ]* --shard 1; " <<< "$out"
expect "worker 1 on w2 with the extra flag" grep -q "^ssh -o BatchMode=yes -o ConnectTimeout=10 -- w2 .*ps-worker[^ ]* --config [^ ]*$tmp/hosts.yaml[^ ]* --rank 1 [^ ]*--epochs[^ ]* [^ ]*1[^ ]*; " <<< "$out"
out=$(scripts/ps-cluster.sh "$tmp/hosts.yaml" stop --dry-run --worker-hosts w1,w2)
expect "stop: workers before shards" [ "$(printf '%s\n' "$out" | head -1 | grep -c 'ps-worker')" -eq 1 ]
expect "stop: ssh gets -- before the host: $out" grep -q "^ssh -o BatchMode=yes -o ConnectTimeout=10 -- s1 'pkill " <<< "$out"
# a host starting with '-' would be an option of ssh's: refused
scripts/ps-cluster.sh "$tmp/hosts.yaml" start --dry-run --worker-hosts w1,-oProxyCommand=x > /dev/null 2> "$tmp/dash.err"
rc=$?
expect "--worker-hosts -oProxyCommand=x refused (status $rc): $(cat "$tmp/dash.err")" \
  grep -q "names host '-oProxyCommand=x', which starts with '-': refused" "$tmp/dash.err"
scripts/ps-cluster.sh "$tmp/c.yaml" launch >/dev/null 2>&1
expect "unknown action refused with status 2" [ $? -eq 2 ]
# loopback servers with workers elsewhere cannot work: refused, nothing run
scripts/ps-cluster.sh "$tmp/c.yaml" start --dry-run --worker-hosts w1,w2 > /dev/null 2> "$tmp/lo.err"
expect "loopback servers with remote workers refused (status $?)" grep -q "a loopback address, but the cluster spans other hosts (w1, w2)" "$tmp/lo.err"
# --ssh is split into words like the shell does: a quoted argument stays one
out=$(scripts/ps-cluster.sh "$tmp/hosts.yaml" start --dry-run --ssh "ssh -F '/x y/cfg'" -- --epochs 1)
expect "--ssh with a quoted path" grep -q "^ssh -F /x y/cfg -- s1 " <<< "$out"

# real processes through an ssh stand-in (host ignored, command run here
# by sh, as ssh would: POSIX sh, dash on Debian); it insists on "--"
# before the host, as the real one gets
cat > "$tmp/ssh" <<'EOF'
#!/usr/bin/env bash
[ "$1" = -- ] || { echo "ssh stand-in: '$1' where -- belongs" >&2; exit 255; }
shift 2 # -- and the host
exec sh -c "$1"
EOF
chmod +x "$tmp/ssh"
export OPENBLAS_NUM_THREADS=1
fresh_ports
scripts/ps-cluster.sh "$tmp/c.yaml" start --ssh "$tmp/ssh" --logs "$tmp/logs" -- --epochs 1
expect "start succeeds" [ $? -eq 0 ]
st=$(scripts/ps-cluster.sh "$tmp/c.yaml" status --ssh "$tmp/ssh" --logs "$tmp/logs")
expect "both shards running: $st" [ "$(grep -c 'shard .*: running' <<< "$st")" -eq 2 ]
# Polls `ps-cluster.sh status` (into $st) until PATTERN is gone from it, at
# most TRIES times, DELAY seconds apart.
wait_status_gone() { # PATTERN TRIES DELAY
  for _ in $(seq "$2"); do
    st=$(scripts/ps-cluster.sh "$tmp/c.yaml" status --ssh "$tmp/ssh" --logs "$tmp/logs")
    grep -q "$1" <<< "$st" || break
    sleep "$3"
  done
}
# the workers train one short epoch and exit
wait_status_gone 'worker .*: running' 120 0.5
expect "workers finished: $st" [ "$(grep -c 'worker .*: not running' <<< "$st")" -eq 2 ]
expect "worker 0 trained and evaluated" grep -q "epoch 1 test accuracy" "$tmp/logs/c.run/worker-0.log"
scripts/ps-cluster.sh "$tmp/c.yaml" stop --ssh "$tmp/ssh" --logs "$tmp/logs"
wait_status_gone ': running' 40 0.25
expect "everything stopped: $st" [ "$(grep -c ': not running' <<< "$st")" -eq 4 ]
expect "shard 0 logged its stop" grep -q "stopped:" "$tmp/logs/c.run/server-0.log"

# a start that fails after shards and a worker started (the host of
# worker 1, "localhost", unreachable by then): what it started is stopped
cat > "$tmp/ssh-flaky" <<'EOF'
#!/usr/bin/env bash
host=$2; shift 2
case "$host:$1" in localhost:*nohup*ps-worker*)
  echo "ssh: connect to host $host port 22: Connection refused" >&2; exit 255 ;;
esac
exec sh -c "$1"
EOF
chmod +x "$tmp/ssh-flaky"
fresh_ports
scripts/ps-cluster.sh "$tmp/c.yaml" start --ssh "$tmp/ssh-flaky" --logs "$tmp/logs" \
  --worker-hosts 127.0.0.1,localhost -- --epochs 50 > "$tmp/flaky.out" 2>&1
rc=$?
expect "a start failing at worker 1 exits 1 ($rc): $(cat "$tmp/flaky.out")" [ $rc -eq 1 ]
expect "... says which and why" grep -q "cannot start the workers on localhost over ssh: ssh: connect to host localhost port 22: Connection refused" "$tmp/flaky.out"
expect "... stops worker 0, which started" grep -q "worker 0 on 127.0.0.1: not running (" "$tmp/flaky.out"
expect "... stops the shards and worker 0 again" grep -q "nothing of this start is left running" "$tmp/flaky.out"
for _ in $(seq 20); do [ "$(pgrep -fc -- "--config $tmp/c.yaml")" -eq 0 ] && break; sleep 0.25; done
expect "... and nothing is left" [ "$(pgrep -fc -- "--config $tmp/c.yaml")" -eq 0 ]

# Every value in a remote command is quoted for POSIX sh: a project folder
# named with $(...) and quotes starts and stops like any other (its name
# used to run as a command in the remote sh -c: a --dir of $(id>file) ran)
weird="$tmp/p \$(touch pwned)'\"q"
mkdir -p "$weird" && ln -s "$PWD/bin" "$weird/bin"
fresh_ports
scripts/ps-cluster.sh "$tmp/c.yaml" start --ssh "$tmp/ssh" --logs "$tmp/logs-q" --dir "$weird" \
  -- --epochs 1 > "$tmp/q.out" 2>&1
expect "start with --dir '$weird' (status $?): $(tail -4 "$tmp/q.out")" grep -q "^ps-cluster.sh: started 2 shard" "$tmp/q.out"
scripts/ps-cluster.sh "$tmp/c.yaml" stop --ssh "$tmp/ssh" --logs "$tmp/logs-q" --dir "$weird" > "$tmp/qstop.out" 2>&1
expect "... and stops (status $?): $(cat "$tmp/qstop.out")" [ "$(grep -c ': not running' "$tmp/qstop.out")" -eq 4 ]
expect "... nothing in its name ran" test ! -e "$weird/pwned" -a ! -e "$tmp/pwned" -a ! -e pwned
for _ in $(seq 20); do [ "$(pgrep -fc -- "--config $tmp/c.yaml")" -eq 0 ] && break; sleep 0.25; done
expect "... nothing left running" [ "$(pgrep -fc -- "--config $tmp/c.yaml")" -eq 0 ]
# The run record is data, read, never run: a value holding $(...) stays a
# value, a line of code is refused naming it, and a host starting with
# '-' is refused (it reached ssh as an option)
mkdir -p "$tmp/logs-r/c-1"
ln -sfn c-1 "$tmp/logs-r/c.run"
record() { # EXTRA LINE: a run record of c.yaml on 127.0.0.1 with it
  printf '%s\n' "RUN_CONFIG=$tmp/c.yaml" "RUN_DIR=$tmp/logs-r/c-1 \$(touch $tmp/pwned2)" \
    RUN_SHARD_HOST=127.0.0.1 RUN_SHARD_HOST=127.0.0.1 RUN_WORKER_HOST=127.0.0.1 "$1" \
    > "$tmp/logs-r/c-1/run.env"
}
record "RUN_STATE=stopped"
out=$(scripts/ps-cluster.sh "$tmp/c.yaml" status --ssh "$tmp/ssh" --logs "$tmp/logs-r" 2>&1)
expect "a run record with \$(...) in a value: read as data: $out" [ "$(grep -c ': not running' <<< "$out")" -eq 4 ]
record "touch $tmp/pwned3"
out=$(scripts/ps-cluster.sh "$tmp/c.yaml" status --ssh "$tmp/ssh" --logs "$tmp/logs-r" 2>&1)
rc=$?
expect "a line of code in run.env is refused (status $rc): $out" \
  grep -q "run.env:6: not a line of a run record: 'touch $tmp/pwned3'" <<< "$out"
record "RUN_WORKER_HOST=-oProxyCommand=touch $tmp/pwned4"
out=$(scripts/ps-cluster.sh "$tmp/c.yaml" stop --ssh "$tmp/ssh" --logs "$tmp/logs-r" 2>&1)
rc=$?
expect "a host starting with '-' in run.env is refused (status $rc): $out" \
  grep -q "names host '-oProxyCommand=touch $tmp/pwned4', which starts with '-': refused" <<< "$out"
expect "... none of it ran" test ! -e "$tmp/pwned2" -a ! -e "$tmp/pwned3" -a ! -e "$tmp/pwned4"

# ps-local.sh: a whole run ends with status 0 and no process left; a run
# stopped by SIGTERM in the middle stops every process too
fresh_ports
scripts/ps-local.sh "$tmp/c2.yaml" --logs "$tmp/local" -- --epochs 1 > "$tmp/local.out" 2>&1
expect "ps-local.sh run succeeded: $(tail -3 "$tmp/local.out")" [ $? -eq 0 ]
expect "no process left after ps-local.sh" [ "$(pgrep -fc -- "--config $tmp/c2.yaml")" -eq 0 ]
expect "ps-local.sh generated a secret (mode 600)" [ "$(stat -c %a "$tmp/local/ps.secret" 2>&1)" = 600 ]
expect "the shards authenticated the workers" grep -q "worker 0 connected from .*(authenticated, frames MACed)" "$tmp/local/server-0.log"
fresh_ports
scripts/ps-local.sh "$tmp/c.yaml" --logs "$tmp/local2" -- --epochs 50 > "$tmp/local2.out" 2>&1 &
lp=$!
for _ in $(seq 100); do
  grep -q "step" "$tmp/local2/worker-0.log" 2>/dev/null && break
  sleep 0.2
done
kill -TERM $lp
wait $lp
rc=$?
expect "ps-local.sh stopped by SIGTERM reports it (status $rc)" [ $rc -ne 0 ]
for _ in $(seq 20); do [ "$(pgrep -fc -- "--config $tmp/c.yaml")" -eq 0 ] && break; sleep 0.25; done
expect "no process left after SIGTERM" [ "$(pgrep -fc -- "--config $tmp/c.yaml")" -eq 0 ]

# ps-local.sh does not supervise shards; it tells the truth about them: a
# shard killed during the run is reported at once with its status; the same
# shard restarted by hand is recognised and stopped at the end; the run's
# status is the workers' (0 here: they wait for a flag, then succeed).
# The workers are --worker-cmd programs that wait for $tmp/go.
rm -f "$tmp/go"
fresh_ports
scripts/ps-local.sh "$tmp/c.yaml" --logs "$tmp/local3" \
  --worker-cmd "while [ ! -e $tmp/go ]; do sleep 0.05; done" > "$tmp/local3.out" 2>&1 &
lp=$!
s1port=$(bin/ps-server --config "$tmp/c.yaml" --list-shards | awk '$1 == 1 { print $3 }')
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# the workers started (so every shard listened): worker 1's log is there
for _ in $(seq 200); do [ -e "$tmp/local3/worker-1.log" ] && break; sleep 0.05; done
s1pid=$(pgrep -f -- "ps-server --config $tmp/c.yaml --shard 1\$")
expect "ps-local.sh started shard 1 (pid '$s1pid')" test -n "$s1pid"
kill -KILL $s1pid
for _ in $(seq 200); do grep -q "shard 1 died" "$tmp/local3.out" && break; sleep 0.05; done
expect "ps-local.sh reports the dead shard at once: $(cat "$tmp/local3.out")" \
  grep -q "shard 1 died with status 137 while the workers ran (log: $tmp/local3/server-1.log); it is not restarted" "$tmp/local3.out"
bin/ps-server --config "$tmp/c.yaml" --shard 1 > "$tmp/restarted.log" 2>&1 &
hand=$!
for _ in $(seq 200); do listening "$s1port" && break; sleep 0.05; done
touch "$tmp/go"
wait $lp; rc=$?
expect "ps-local.sh: status 0 after a run whose workers succeeded (status $rc): $(tail -4 "$tmp/local3.out")" [ $rc -eq 0 ]
expect "ps-local.sh recognised the hand-restarted shard and stopped it" \
  grep -q "shard 1 was restarted outside ps-local.sh (pid $hand): stopping it too" "$tmp/local3.out"
expect "ps-local.sh's summary names the shard that had died" \
  grep -q "shard 1 had died during the run (status 137)" "$tmp/local3.out"
wait $hand; rc=$?
expect "the hand-restarted shard stopped cleanly (status $rc)" [ $rc -eq 0 ]
expect "no process left after ps-local.sh" [ "$(pgrep -fc -- "--config $tmp/c.yaml")" -eq 0 ]

# cluster.replicas: 1 through ps-cluster.sh: every shard's backup starts
# too, forms its pair (ps-stat), the workers train, and stop ends all
# (ports below the kernel's ephemeral range: the processes dial each other
# as they start, and a dial's source port must not take a port another
# process is about to listen on)
awk -v s="  servers: [127.0.0.1:$(free_port), 127.0.0.1:$(free_port)]" \
  -v b="  backups: [127.0.0.1:$(free_port), 127.0.0.1:$(free_port)]" \
  '/^  servers:/ { print s; print b; print "  replicas: 1"; next } { print }' "$tmp/c.yaml" > "$tmp/r.yaml"
cp "$tmp/c.secret" "$tmp/r.secret" 2>/dev/null; sed -i 's/secret_file: c.secret/secret_file: r.secret/' "$tmp/r.yaml"
PS_REPL_KEY_FILE= scripts/ps-cluster.sh "$tmp/r.yaml" start --dry-run --ssh "$tmp/ssh" >/dev/null 2>"$tmp/norepl.err"
expect "ps-cluster.sh refuses replicas without a replication key" grep -q "names no security.repl_key_file" "$tmp/norepl.err"
scripts/ps-keygen "$tmp/r.replkey" 2>/dev/null
sed -i 's/secret_file: r.secret/secret_file: r.secret, repl_key_file: r.replkey/' "$tmp/r.yaml"
scripts/ps-cluster.sh "$tmp/r.yaml" start --ssh "$tmp/ssh" --logs "$tmp/logs" -- --epochs 1 > "$tmp/r.out" 2>&1
expect "replicas: start succeeds: $(tail -3 "$tmp/r.out")" [ $? -eq 0 ]
expect "replicas: the backups started" [ "$(grep -c '^  backup [01] on 127.0.0.1, listening on' "$tmp/r.out")" -eq 2 ]
for _ in $(seq 40); do
  pairs=$(bin/ps-stat --config "$tmp/r.yaml" --interval 0.05 2>&1 | grep -cE ' (primary|backup) +[0-9]+ .* up ')
  [ "$pairs" -eq 4 ] && break
  sleep 0.25
done
expect "replicas: ps-stat shows two pairs, each a primary and a backup ($pairs of 4 up)" [ "$pairs" -eq 4 ]
rst=$(scripts/ps-cluster.sh "$tmp/r.yaml" status --ssh "$tmp/ssh" --logs "$tmp/logs")
expect "replicas: status names the backups: $rst" [ "$(grep -c '^backup [01] on 127.0.0.1: running' <<< "$rst")" -eq 2 ]
for _ in $(seq 120); do
  rst=$(scripts/ps-cluster.sh "$tmp/r.yaml" status --ssh "$tmp/ssh" --logs "$tmp/logs")
  grep -q 'worker .*: running' <<< "$rst" || break
  sleep 0.5
done
expect "replicas: workers finished: $rst" [ "$(grep -c 'worker .*: not running (exited with status 0)' <<< "$rst")" -eq 2 ]
scripts/ps-cluster.sh "$tmp/r.yaml" stop --ssh "$tmp/ssh" --logs "$tmp/logs" > "$tmp/rstop.out" 2>&1
expect "replicas: stop succeeds: $(cat "$tmp/rstop.out")" [ $? -eq 0 ]
for _ in $(seq 20); do [ "$(pgrep -fc -- "--config $tmp/r.yaml")" -eq 0 ] && break; sleep 0.25; done
expect "replicas: nothing left" [ "$(pgrep -fc -- "--config $tmp/r.yaml")" -eq 0 ]

# Slurm: the derived config names the allocated nodes with the config's ports
out=$(PS_NODES="n1 n2 n3" PS_DRY_RUN=1 PS_LOGS="$tmp/sb" scripts/ps.sbatch "$tmp/c.yaml" --epochs 2)
p0=$(bin/ps-server --config "$tmp/c.yaml" --list-shards | awk 'NR == 1 {print $3}')
expect "derived servers line" grep -q "^  servers: \[n1:$p0, n2:" "$tmp/sb/cluster.yaml"
expect "derived config loads" bin/ps-server --config "$tmp/sb/cluster.yaml" --list-shards >/dev/null
expect "srun for shard 1 on n2" grep -q -- "--nodelist=n2 .*ps-server --config $tmp/sb/cluster.yaml --shard 1" <<< "$out"
expect "worker 1 on n2 with its flags" grep -q -- "--nodelist=n2 .*ps-worker --config $tmp/sb/cluster.yaml --rank 1 --epochs 2" <<< "$out"
PS_NODES="n1" PS_DRY_RUN=1 PS_LOGS="$tmp/sb1" scripts/ps.sbatch "$tmp/c.yaml" >/dev/null 2>"$tmp/err"
expect "too few nodes refused" grep -q "2 shards need 2 nodes, the allocation has 1" "$tmp/err"
# a relative config from the submission folder: the derived config (in
# another folder) names the secret and the checkpoint folder absolutely
sed 's/^log:/checkpoint: {dir: ckpt}\nlog:/' "$tmp/c.yaml" > "$tmp/rel.yaml"
(cd "$tmp" && PS_NODES="n1 n2" PS_DRY_RUN=1 PS_LOGS="$tmp/sbrel" "$OLDPWD/scripts/ps.sbatch" rel.yaml > /dev/null)
expect "derived secret_file absolute: $(grep secret_file "$tmp/sbrel/cluster.yaml")" \
  grep -q "^  secret_file: \"$tmp/c.secret\"" "$tmp/sbrel/cluster.yaml"
expect "derived checkpoint.dir absolute: $(grep '  dir:' "$tmp/sbrel/cluster.yaml")" \
  grep -q "^  dir: \"$tmp/ckpt\"" "$tmp/sbrel/cluster.yaml"
# the same from a folder whose name holds a quote, a backslash, a colon and
# a hash: the dump escapes them, and so does ps.sbatch where it prefixes
# the working directory (a '"' there used to break the derived config)
odd="$tmp/sub \"q\\ b: #c"
mkdir -p "$odd" && cp "$tmp/rel.yaml" "$tmp/c.secret" "$odd/"
(cd "$odd" && PS_NODES="n1 n2" PS_DRY_RUN=1 PS_LOGS="$tmp/sbodd" "$OLDPWD/scripts/ps.sbatch" rel.yaml > /dev/null 2>&1)
dump=$(bin/ps-server --config "$tmp/sbodd/cluster.yaml" --dump-config 2>&1)
expect "derived config of a config in '$odd' loads: $dump" [ "$(cfg_key "$dump" checkpoint dir)" = "$odd/ckpt" ]
expect "... naming its secret there" [ "$(cfg_key "$dump" security secret_file)" = "$odd/c.secret" ]
# as Slurm runs it: a copy of the script in a spool folder, submitted from
# elsewhere; the project folder is found from the job's Command (scontrol)
mkdir -p "$tmp/spool" "$tmp/fakebin"
cp scripts/ps.sbatch "$tmp/spool/slurm_script"
cat > "$tmp/fakebin/scontrol" <<EOF
#!/bin/sh
case "\$1 \$2" in
  "show job") echo "   Command=$PWD/scripts/ps.sbatch rel.yaml" ;;
  "show hostnames") echo n1; echo n2 ;;
esac
EOF
chmod +x "$tmp/fakebin/scontrol"
out=$(cd "$tmp" && PATH="$tmp/fakebin:$PATH" SLURM_JOB_ID=42 SLURM_JOB_NODELIST="n[1-2]" \
  SLURM_SUBMIT_DIR="$tmp" PS_DRY_RUN=1 PS_LOGS="$tmp/sbslurm" bash "$tmp/spool/slurm_script" rel.yaml 2>&1)
expect "under Slurm, the project folder of the submitted script: $out" \
  grep -q -- "--nodelist=n2 .* $PWD/bin/ps-server --config $tmp/sbslurm/cluster.yaml --shard 1" <<< "$out"
out=$(PS_DIR=/nonexistent PS_NODES=n1 PS_DRY_RUN=1 scripts/ps.sbatch "$tmp/c.yaml" 2>&1)
expect "a project folder without the programs: says to set PS_DIR: $out" grep -q "set PS_DIR" <<< "$out"

# systemd units (with ExecStart pointing at this build)
if command -v systemd-analyze >/dev/null; then
  for u in ps-server@.service ps-backup@.service ps-worker@.service; do
    sed "s|/usr/local/bin/|$PWD/bin/|" "scripts/systemd/$u" > "$tmp/$u"
    if systemd-analyze verify "$tmp/$u" > "$tmp/verify" 2>&1; then ok; else
      bad "systemd-analyze verify $u: $(cat "$tmp/verify")"; fi
    # sandboxed: a daemon that needs its port, its state folder and its
    # credentials rates "OK" (at most 3.0 of 10; the units had 8.5 EXPOSED)
    if systemd-analyze security --help 2>/dev/null | grep -q -- --offline; then
      if systemd-analyze security --offline=yes --threshold=30 "$tmp/$u" > "$tmp/security" 2>&1
      then ok; else
        bad "systemd-analyze security $u: $(grep -E '^(✗|→)' "$tmp/security" | tail -25)"; fi
    else
      echo "SKIP systemd-analyze security $u: this systemd ($(systemd-analyze --version | head -1)) has no --offline"
    fi
  done
else
  echo "SKIP systemd units: systemd-analyze not found"
fi
# make install puts the units where systemd finds local ones, and the page
# their Documentation= names exists there
make -s install DESTDIR="$tmp/inst" PREFIX=/usr/local > "$tmp/install.out" 2>&1
expect "make install into a DESTDIR: $(tail -3 "$tmp/install.out")" [ $? -eq 0 ]
# ... and the launchers, which run from there without the source tree:
# programs beside them, ps-lib.sh in PREFIX/lib/ps, --version from there
ib=$tmp/inst/usr/local/bin
for f in ps-local.sh ps-cluster.sh ps.sbatch ps-plot ps-keygen; do
  expect "$f installed, executable" test -x "$ib/$f"
done
expect "ps-lib.sh installed in lib/ps" test -r "$tmp/inst/usr/local/lib/ps/ps-lib.sh"
out=$(cd / && env -u PS_COMPUTE_PLUGIN_DIR "$ib/ps-local.sh" --version 2>&1)
expect "installed ps-local.sh --version names itself and the installed ps-server's build: $out" \
  grep -q "^ps-local.sh [0-9]" <<<"$out"
if [ -e lib/ps-compute-cuda.so ]; then
  expect "... with the installed CUDA plug-in: $out" grep -q "^cuda plug-in: $tmp/inst/usr/local/lib/ps/" <<<"$out"
fi
out=$(cd / && "$ib/ps-cluster.sh" --version 2>&1)
expect "installed ps-cluster.sh --version: $out" grep -q "^ps-cluster.sh [0-9]" <<<"$out"
(cd "$tmp" && "$ib/ps-local.sh" c2.yaml --logs "$tmp/local-inst" -- --epochs 1) > "$tmp/local-inst.out" 2>&1
expect "installed ps-local.sh ran a whole cluster from another folder (status $?): $(tail -3 "$tmp/local-inst.out")" [ $? -eq 0 ]
expect "no process left after the installed ps-local.sh" [ "$(pgrep -fc -- "--config c2.yaml")" -eq 0 ]
out=$(cd "$tmp" && "$ib/ps-cluster.sh" hosts.yaml start --dry-run --worker-hosts w1 2>&1)
expect "installed ps-cluster.sh starts the installed programs, the config from the current folder: $out" \
  grep -q "^ssh .* -- s1 .*$ib/ps-server[^ ]* --config [^ ]*$tmp/hosts.yaml[^ ]* --shard 0; " <<<"$out"
expect "... and logs under \$HOME/.local/state/ps/logs: $out" grep -q "$HOME/.local/state/ps/logs/hosts-" <<<"$out"
for u in ps-server@.service ps-backup@.service ps-worker@.service; do
  f=$tmp/inst/usr/local/lib/systemd/system/$u
  doc=$(sed -n 's|^Documentation=file://||p' "$f" 2> /dev/null)
  expect "$u installed, its Documentation= ($doc) too" test -n "$doc" -a -s "$tmp/inst$doc"
done
expect "ps-server@ runs in /var/lib/ps (a relative checkpoint.dir is writable there)" \
  grep -q '^WorkingDirectory=/var/lib/ps$' scripts/systemd/ps-server@.service

echo "$(( checks ? 100 * (checks - fails) / checks : 0 ))%: Checks: $checks, Failures: $fails, Errors: 0"
[ $fails -eq 0 ]
