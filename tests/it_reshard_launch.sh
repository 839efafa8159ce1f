#!/usr/bin/env bash
# it_reshard_launch.sh - `ps-local.sh CONFIG reshard NEW_CONFIG` and
# `ps-cluster.sh CONFIG reshard NEW_CONFIG` with real processes
# (docs/elastic.md, re-sharding by restart):
#  - refused, status 2 and nothing stopped, when NEW_CONFIG differs in more
#    than cluster.servers (naming the key) or CONFIG has no checkpoint.dir;
#    status 1 when an old shard's checkpoint is missing;
#  - ps-local.sh: a 2-shard run of mlp training is stopped at a clock
#    boundary (its ps-local.sh gets SIGTERM and ends), its checkpoints set
#    aside, 3 shards start from them and say what moved, the workers resume
#    at the checkpoint's clock and finish; the 3 new checkpoints are there;
#  - ps-cluster.sh (through an ssh stand-in running the commands here,
#    shard 2 on "localhost" as another host with its own checkpoint folder):
#    3 -> 2 the same way, old shard 2's files set aside on its host and
#    copied to the new shards' host, started and stopped again;
#  - ps-cluster.sh reshard while its workers run, with a shard down:
#    refused (status 1, ps-stat's reason), the workers going on.
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
tmp=$(mktemp -d /tmp/ps-reshard-launch.XXXXXX)
cleanup() {
  pkill -TERM -f -- "--config $tmp/" 2>/dev/null
  sleep 0.5
  pkill -KILL -f -- "--config $tmp/" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
. tests/lib-ports.sh # free_port
unset PS_SECRET_FILE
export OPENBLAS_NUM_THREADS=1
p0=$(free_port) p1=$(free_port) p2=$(free_port)
mkdir -p "$tmp/ck"
cat > "$tmp/c2.yaml" <<EOF
cluster:
  servers: [127.0.0.1:$p0, 127.0.0.1:$p1]
  workers: 2
model: {preset: mlp}
slice_bytes: 65536
train: {batch: 32, limit: 3200, epochs: 40, metrics_dir: "$tmp/m"}
checkpoint: {dir: $tmp/ck}
security: {auth: false}
log: {level: info}
EOF
sed "s/servers: .*/servers: [127.0.0.1:$p0, 127.0.0.1:$p1, localhost:$p2]/" "$tmp/c2.yaml" > "$tmp/c3.yaml"
sed 's/^train:/optimizer: {lr: 0.02}\ntrain:/' "$tmp/c3.yaml" > "$tmp/lr.yaml"
sed '/^checkpoint:/d' "$tmp/c2.yaml" > "$tmp/nock.yaml"
sed '/^checkpoint:/d' "$tmp/c3.yaml" > "$tmp/nock3.yaml"

# refusals
scripts/ps-local.sh "$tmp/c2.yaml" reshard "$tmp/lr.yaml" > "$tmp/r1.out" 2>&1; rc=$?
expect "another optimizer.lr refused: status 2 ($rc)" [ $rc -eq 2 ]
expect "another optimizer.lr refused: $(tail -n 3 "$tmp/r1.out")" \
  grep -q "differs from $tmp/c2.yaml in optimizer.lr" "$tmp/r1.out"
scripts/ps-local.sh "$tmp/nock.yaml" reshard "$tmp/nock3.yaml" > "$tmp/r2.out" 2>&1; rc=$?
expect "no checkpoint.dir refused: status 2 ($rc)" [ $rc -eq 2 ]
expect "no checkpoint.dir refused: $(tail -n 3 "$tmp/r2.out")" \
  grep -q "has no checkpoint.dir" "$tmp/r2.out"
scripts/ps-local.sh "$tmp/c2.yaml" reshard "$tmp/c3.yaml" > "$tmp/r3.out" 2>&1; rc=$?
expect "no old checkpoint: status 1 ($rc)" [ $rc -eq 1 ]
expect "no old checkpoint: $(tail -n 3 "$tmp/r3.out")" \
  grep -q "$tmp/ck/shard-0.ckpt is missing.*nothing was moved" "$tmp/r3.out"
scripts/ps-cluster.sh "$tmp/c2.yaml" reshard "$tmp/lr.yaml" > "$tmp/r4.out" 2>&1; rc=$?
expect "ps-cluster.sh: another optimizer.lr refused: status 2 ($rc)" [ $rc -eq 2 ]
expect "ps-cluster.sh: another optimizer.lr refused: $(tail -n 3 "$tmp/r4.out")" \
  grep -q "differs from $tmp/c2.yaml in optimizer.lr" "$tmp/r4.out"

# ps-local.sh: 2 shards training, re-sharded to 3 while they run
scripts/ps-local.sh "$tmp/c2.yaml" --logs "$tmp/l2" > "$tmp/run2.out" 2>&1 &
old=$!
for _ in $(seq 600); do grep -q "epoch 2/" "$tmp/l2/worker-0.log" 2>/dev/null && break; sleep 0.1; done
expect "the 2-shard run trained an epoch" grep -q "epoch 2/" "$tmp/l2/worker-0.log"
scripts/ps-local.sh "$tmp/c2.yaml" reshard "$tmp/c3.yaml" --restart --logs "$tmp/l3" -- --epochs 3 \
  > "$tmp/run3.out" 2>&1; rc=$?
wait $old; oldrc=$?
expect "reshard 2 -> 3 succeeds ($rc): $(tail -5 "$tmp/run3.out")" [ $rc -eq 0 ]
expect "the old ps-local.sh was stopped as Ctrl-C stops it ($oldrc)" [ $oldrc -eq 130 ]
expect "it says it stopped the old one" grep -q "stopping the ps-local.sh of $tmp/c2.yaml" "$tmp/run3.out"
expect "it says what moved: $(grep moved "$tmp/run3.out")" \
  grep -qE "reshard: 3 shard\(s\) re-sharded: [1-9][0-9]* of 19 slices" "$tmp/run3.out"
clock=$(sed -n 's/.*continuing at clock \([0-9]*\).*/\1/p' "$tmp/l3/worker-0.log" | head -1)
expect "the workers resumed at the checkpoint's clock (${clock:-none})" [ "${clock:-0}" -ge 50 ]
expect "and trained to the end" grep -q "epoch 3: test accuracy" "$tmp/l3/worker-0.log"
expect "the old checkpoints set aside" test -f "$(echo "$tmp"/ck/reshard-from-2.*/shard-1.ckpt)"
expect "3 new checkpoints" test -f "$tmp/ck/shard-0.ckpt" -a -f "$tmp/ck/shard-1.ckpt" -a -f "$tmp/ck/shard-2.ckpt"

# ps-cluster.sh: 3 -> 2, the cluster stopped already. Host "localhost"
# (shard 2 of c3.yaml) is another machine: the ssh stand-in runs its
# commands with its own checkpoint folder (ckb) and config copies, so the
# old shard 2's files must be copied to the new shards' host
mkdir -p "$tmp/ckb" "$tmp/b"
mv "$tmp"/ck/shard-2.* "$tmp/ckb/"
for c in c2 c3; do sed "s|dir: $tmp/ck}|dir: $tmp/ckb}|" "$tmp/$c.yaml" > "$tmp/b/$c.yaml"; done
cat > "$tmp/ssh" <<'EOF'
#!/usr/bin/env bash
[ "$1" = -- ] || { echo "ssh stand-in: '$1' where -- belongs" >&2; exit 255; }
host=$2; shift 2 # -- and the host
cmd=$1
if [ "$host" = localhost ]; then
  cmd=${cmd//$TMPD\/ck/$TMPD\/ckb}
  cmd=${cmd//$TMPD\/c2.yaml/$TMPD\/b\/c2.yaml}
  cmd=${cmd//$TMPD\/c3.yaml/$TMPD\/b\/c3.yaml}
fi
exec sh -c "$cmd"
EOF
chmod +x "$tmp/ssh"
export TMPD=$tmp
scripts/ps-cluster.sh "$tmp/c3.yaml" reshard "$tmp/c2.yaml" --ssh "$tmp/ssh" --logs "$tmp/logs" \
  -- --epochs 4 > "$tmp/run4.out" 2>&1; rc=$?
expect "ps-cluster.sh reshard 3 -> 2 succeeds ($rc): $(tail -8 "$tmp/run4.out")" [ $rc -eq 0 ]
expect "it says what moved" grep -qE "reshard: 2 shard\(s\) re-sharded: [1-9][0-9]* of 19 slices" "$tmp/run4.out"
expect "old shard 2's files set aside on its host" test -f "$(echo "$tmp"/ckb/reshard-from-3.*/shard-2.ckpt)" -a ! -e "$tmp/ckb/shard-2.ckpt"
expect "and copied to the new shards' host" cmp -s "$(echo "$tmp"/ckb/reshard-from-3.*/shard-2.ckpt)" "$(echo "$tmp"/ck/reshard-from-3.*/shard-2.ckpt)"
expect "the others set aside there" test -f "$(echo "$tmp"/ck/reshard-from-3.*/shard-1.ckpt)"
for _ in $(seq 600); do
  st=$(scripts/ps-cluster.sh "$tmp/c2.yaml" status --ssh "$tmp/ssh" --logs "$tmp/logs")
  grep -q 'worker .*: running' <<< "$st" || break
  sleep 0.1
done
expect "its workers trained to the end" grep -q "epoch 4 test accuracy" "$tmp/logs/c2.run/worker-0.log"
scripts/ps-cluster.sh "$tmp/c2.yaml" stop --ssh "$tmp/ssh" --logs "$tmp/logs" > "$tmp/stop.out" 2>&1
expect "and its shards stop: $(cat "$tmp/stop.out")" [ "$(grep -c 'shard .*: not running (exited with status 0)' "$tmp/stop.out")" -eq 2 ]

# ps-cluster.sh reshard while its workers run, refused: a shard down
# (ps-stat --reshard-stop says so); nothing changes and the workers train on
scripts/ps-cluster.sh "$tmp/c2.yaml" start --ssh "$tmp/ssh" --logs "$tmp/lg" > "$tmp/run5.out" 2>&1
expect "a long ps-cluster.sh run started: $(tail -3 "$tmp/run5.out")" grep -q "started 2 shard(s) and 2 worker(s)" "$tmp/run5.out"
pkill -KILL -f -- "bin/ps-server --config $tmp/c2.yaml --shard 1\$"
scripts/ps-cluster.sh "$tmp/c2.yaml" reshard "$tmp/c3.yaml" --ssh "$tmp/ssh" --logs "$tmp/lg" > "$tmp/run6.out" 2>&1; rc=$?
expect "live reshard with shard 1 down refused, status 1: status 1 ($rc)" [ $rc -eq 1 ]
expect "live reshard with shard 1 down refused, status 1: $(tail -n 3 "$tmp/run6.out")" \
  grep -q "reshard: refused (ps-stat --reshard-stop on 127.0.0.1): .*shard 1 .*every shard must be up; the run goes on with $tmp/c2.yaml" "$tmp/run6.out"
expect "its intent record ends done refused" [ "$(tail -n 1 "$tmp"/lg/reshard-*.intent)" = "done refused" ]
expect "the workers still run" [ "$(pgrep -fc -- "bin/ps-worker --config $tmp/c2.yaml --rank")" -eq 2 ]
expect "their follow file names c2.yaml" [ "$(cat "$tmp/lg/c2.run/current-config")" = "$tmp/c2.yaml" ]
scripts/ps-cluster.sh "$tmp/c2.yaml" stop --ssh "$tmp/ssh" --logs "$tmp/lg" --wait 5 > /dev/null 2>&1

echo "$(( checks ? 100 * (checks - fails) / checks : 0 ))%: Checks: $checks, Failures: $fails, Errors: 0"
[ $fails -eq 0 ]
