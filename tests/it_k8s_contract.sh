#!/usr/bin/env bash
# it_k8s_contract.sh - what the Kubernetes manifests rely on, without
# Kubernetes: the real programs in "pods" made of namespaces.
#
# Each pod is a network namespace on a bridge (10.219.0.0/24, nothing else
# touched) with its own UTS namespace, whose host name is the pod's name
# as a StatefulSet names it (ps-shard-0, ps-shard-1); its /etc/hosts (ip
# netns exec mounts /etc/netns/NS/hosts over it) stands in for cluster
# DNS, and gains the shards' names only when the test says so, as DNS
# gains a pod's name once it exists. A pod's process gets the environment
# Kubernetes gives (HOSTNAME, JOB_COMPLETION_INDEX for the Indexed Job's
# workers, nothing else) and runs the command of the manifests in
# deploy/kubernetes/base, read from them; the config is the one the
# ConfigMap carries and the keys are laid out as a Secret volume lays them
# out (KEY -> ..data/KEY -> ..TIMESTAMP/KEY, mode 0400), under a folder of
# this test instead of /etc/ps and /var/lib/ps.
#
# Checked: workers started before the shards wait for the shards' names,
# saying so, and train to the end once the names resolve (exit 0); each
# shard takes its index from its host name and each worker its rank from
# JOB_COMPLETION_INDEX; /healthz, /readyz and /metrics (with the Secret's
# token only) answer; SIGTERM checkpoints and exits 0; restarted, a shard
# answers /healthz only once its checkpoint is loaded; with replicas (the
# overlay's config and backup command, cut to one shard), a shard whose
# backup's name does not exist yet says so, is live but not ready, and
# both are ready once the backup's pod is there; a host name
# without an ordinal, an ordinal or an index the config lacks exit 2
# naming the cause (and show the precedence of $PS_SHARD, $PS_RANK and
# --rank); a worker whose shard names never appear gives up
# after limits.connect_timeout_ms naming the shard (exit 1).
#
# Needs root (namespaces); without it, or without ip/unshare, prints the
# reason and exits 77. Prints "N%: Checks" for run-tests.sh.
set -u
cd "$(dirname "$0")/.." || exit 1
top=$PWD
checks=0 fails=0
ok() { checks=$((checks + 1)); }
bad() { checks=$((checks + 1)); fails=$((fails + 1)); echo "FAIL: $*"; }
skip() { echo "SKIP: it_k8s_contract: $*"; exit 77; }

[ "$(id -u)" -eq 0 ] || skip "needs root for network and UTS namespaces"
for c in ip unshare hostname timeout python3; do
  command -v "$c" > /dev/null || skip "$c not found (scripts/install-deps.sh installs iproute2)"
done
python3 -c 'import yaml' 2> /dev/null || skip "python3-yaml missing (scripts/install-deps.sh)"
[ -x bin/ps-server ] && [ -x bin/ps-worker ] || skip "run 'make' first"
[ -r /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz ] ||
  [ -r /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte ] ||
  skip "Fashion-MNIST missing (scripts/install-deps.sh installs dataset-fashion-mnist)"

tag=pk8s$$
BR=$tag-br
declare -A NS=([s0]=$tag-s0 [s1]=$tag-s1 [w0]=$tag-w0 [w1]=$tag-w1)
declare -A IP=([s0]=10.219.0.10 [s1]=10.219.0.11 [w0]=10.219.0.20 [w1]=10.219.0.21)
tmp=$(mktemp -d /tmp/ps-k8s-contract.XXXXXX)
chmod 755 "$tmp"
made_etc_netns=0
cleanup() {
  local n p
  for n in "${NS[@]}"; do
    p=$(ip netns pids "$n" 2> /dev/null)
    [ -n "$p" ] && kill -KILL $p 2> /dev/null
  done
  for n in "${NS[@]}" "$BR"; do ip netns del "$n" 2> /dev/null; done
  for n in "${NS[@]}"; do rm -rf "/etc/netns/$n"; done
  [ $made_etc_netns -eq 1 ] && rmdir /etc/netns 2> /dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# ---- the pods' network: a bridge, one namespace per pod ----
err=$(ip netns add "$BR" 2>&1) || skip "cannot create a network namespace here: $err"
ip -n "$BR" link add br0 type bridge && ip -n "$BR" link set br0 up || skip "cannot make a bridge"
i=0
for p in s0 s1 w0 w1; do
  ip netns add "${NS[$p]}" &&
    ip -n "$BR" link add "v$i" type veth peer name eth0 netns "${NS[$p]}" &&
    ip -n "$BR" link set "v$i" master br0 up &&
    ip -n "${NS[$p]}" addr add "${IP[$p]}/24" dev eth0 &&
    ip -n "${NS[$p]}" link set eth0 up &&
    ip -n "${NS[$p]}" link set lo up || skip "cannot set up pod $p's namespace"
  i=$((i + 1))
done
unshare --uts true 2> /dev/null || skip "cannot make a UTS namespace (unshare --uts)"
# Cluster DNS: each pod's hosts file; no name server (a query to
# 127.0.0.1:53 is refused at once), so a name absent there does not resolve.
[ -d /etc/netns ] || { mkdir /etc/netns && made_etc_netns=1; } || skip "cannot make /etc/netns"
names=0 # 1: the shards' names resolve (their pods exist)
backup_names=0
write_hosts() { # POD: its hosts file, rewritten in place (what runs there sees the change)
  local d=/etc/netns/${NS[$1]}
  mkdir -p "$d" && printf 'nameserver 127.0.0.1\noptions timeout:1 attempts:1\n' > "$d/resolv.conf" &&
    {
      echo "127.0.0.1 localhost"
      if [ $names -eq 1 ]; then
        printf '%s ps-shard-0.ps-shards\n%s ps-shard-1.ps-shards\n' "${IP[s0]}" "${IP[s1]}"
      fi
      # the replicated phase: shard 0 in pod s0, its backup ps-backup-0 in s1
      if [ $backup_names -eq 1 ]; then
        printf '%s ps-shard-0.ps-shards\n%s ps-backup-0.ps-backups\n' "${IP[s0]}" "${IP[s1]}"
      fi
    } > "$d/hosts"
}
for p in s0 s1 w0 w1; do write_hosts $p || skip "cannot write /etc/netns/${NS[$p]}"; done

# ---- what the ConfigMap and the Secrets put into a pod ----
root=$tmp/root # stands for / in the pods: etc/ps/..., var/lib/ps
mkdir -p "$root/etc/ps/config" "$root/var/lib/ps" "$tmp/logs"
secret_volume() { # NAME KEY CONTENT-FILE: laid out as the kubelet does
  local d=$root/etc/ps/$1 ts=..2026_01_01_00_00_00.000000001
  mkdir -p "$d/$ts" && cp "$3" "$d/$ts/$2" && chmod 0400 "$d/$ts/$2" &&
    ln -s "$ts" "$d/..data" && ln -s "..data/$2" "$d/$2"
}
scripts/ps-keygen "$tmp/cluster.key" 2> /dev/null && scripts/ps-keygen "$tmp/repl.key" 2> /dev/null ||
  { echo "FAIL: ps-keygen"; exit 1; }
od -An -N24 -tx1 /dev/urandom | tr -d ' \n' > "$tmp/token"
token=$(cat "$tmp/token")
secret_volume cluster-key cluster.key "$tmp/cluster.key" &&
  secret_volume repl-key repl.key "$tmp/repl.key" &&
  secret_volume metrics-token token "$tmp/token" || { echo "FAIL: cannot lay out the Secrets"; exit 1; }
# The base's config and commands, with this test's root for / and a short
# run (train.limit); a second config with a short connect timeout.
if ! python3 - "$root" "$tmp" > "$tmp/cmds" 2> "$tmp/py.err" <<'EOF'; then
import sys, yaml
root, tmp = sys.argv[1:3]
base = "deploy/kubernetes/base/"
def fix(s):
    return s.replace("/etc/ps/", root + "/etc/ps/").replace("/var/lib/ps", root + "/var/lib/ps")
cfg = yaml.safe_load(fix(open(base + "cluster.yaml").read()))
cfg["train"]["limit"] = 1024
cfg["log"]["level"] = "info"
yaml.safe_dump(cfg, open(root + "/etc/ps/config/cluster.yaml", "w"))
cfg["limits"]["connect_timeout_ms"] = 1500
yaml.safe_dump(cfg, open(tmp + "/short.yaml", "w"))
# the replicated phase: the overlay's config cut to shard 0 and its backup,
# its own checkpoint folder (the map differs)
rep = yaml.safe_load(fix(open("deploy/kubernetes/overlays/replicas/cluster.yaml").read()))
rep["cluster"]["servers"] = rep["cluster"]["servers"][:1]
rep["cluster"]["backups"] = rep["cluster"]["backups"][:1]
rep["checkpoint"]["dir"] = root + "/var/lib/ps-replicas"
yaml.safe_dump(rep, open(tmp + "/replicas.yaml", "w"))
for f in (base + "statefulset-shards.yaml", base + "job-workers.yaml",
          "deploy/kubernetes/overlays/replicas/statefulset-backups.yaml"):
    d = yaml.safe_load(open(f))
    c = d["spec"]["template"]["spec"]["containers"][0]
    print(" ".join(fix(a) for a in c["command"] + c.get("args", [])))
EOF
  echo "FAIL: cannot read deploy/kubernetes/base: $(cat "$tmp/py.err")"
  exit 1
fi
{ read -r -a shard_cmd && read -r -a worker_cmd && read -r -a backup_cmd; } < "$tmp/cmds"
mkdir -p "$root/var/lib/ps-replicas"
[ "${shard_cmd[0]}" = ps-server ] && [ "${worker_cmd[0]}" = ps-worker ] ||
  { echo "FAIL: the manifests run '${shard_cmd[*]}' and '${worker_cmd[*]}'"; exit 1; }

# pod POD HOSTNAME LOG [VAR=VALUE...] -- COMMAND...: runs COMMAND as the
# pod's process (PID in $!): its namespace, its host name, only the
# environment the kubelet gives, the programs on PATH as in the image.
pod() {
  local p=$1 host=$2 log=$3 env=(); shift 3
  while [ "$1" != -- ]; do env+=("$1"); shift; done
  shift
  ip netns exec "${NS[$p]}" env -i PATH="$top/bin:/usr/sbin:/usr/bin:/sbin:/bin" HOSTNAME="$host" \
    "${env[@]}" unshare --uts -- sh -c 'hostname "$0" && exec "$@"' "$host" "$@" > "$log" 2>&1 &
}
# http POD PATH [TOKEN]: the status a GET of POD's port 9400 answers, from pod w0
http() {
  local auth=
  [ -n "${3:-}" ] && auth="Authorization: Bearer $3"$'\r\n'
  ip netns exec "${NS[w0]}" timeout 3 bash -c '
    exec 3<> "/dev/tcp/$0/9400" || exit 1
    printf "GET %s HTTP/1.0\r\n%s\r\n" "$1" "$2" >&3
    read -r _ status _ <&3 && echo "$status"' "${IP[$1]}" "$2" "$auth" 2> /dev/null
}
answers() { [ "$(http "$1" "$2")" = "$3" ]; } # POD PATH STATUS
wait_for() { # SECONDS COMMAND...: until COMMAND succeeds; 1 at the deadline
  local until=$((SECONDS + $1)); shift
  until "$@"; do
    [ $SECONDS -ge $until ] && return 1
    sleep 0.05
  done
}
# gone, or a zombie not yet reaped (kill -0 still reaches those)
exited() { ! kill -0 "$1" 2> /dev/null || [ "$(awk '{ print $3 }' "/proc/$1/stat" 2> /dev/null)" = Z ]; }
in_log() { grep -q -- "$2" "$1"; }

# ---- workers first: the shards' names do not exist yet ----
pod w0 ps-workers-0 "$tmp/logs/w0.log" JOB_COMPLETION_INDEX=0 -- "${worker_cmd[@]}"
w0=$!
pod w1 ps-workers-1 "$tmp/logs/w1.log" JOB_COMPLETION_INDEX=1 -- "${worker_cmd[@]}"
w1=$!
for w in w0 w1; do
  if wait_for 30 in_log "$tmp/logs/$w.log" "ps-shard-0.ps-shards:7000): the name does not resolve yet"; then
    ok
  else
    bad "worker $w does not say it waits for the shard's name: $(cat "$tmp/logs/$w.log")"
  fi
done

# ---- the shards: index from the host name, /healthz once listening ----
pod s0 ps-shard-0 "$tmp/logs/s0.log" -- "${shard_cmd[@]}"
s0=$!
pod s1 ps-shard-1 "$tmp/logs/s1.log" -- "${shard_cmd[@]}"
s1=$!
for s in s0 s1; do
  k=${s#s}
  if wait_for 20 answers $s /healthz 200; then ok; else
    bad "pod ps-shard-$k: /healthz does not answer 200: $(cat "$tmp/logs/$s.log")"
    exit 1 # the rest would only wait for what cannot come
  fi
  if in_log "$tmp/logs/$s.log" "server\[$k\] shard $k of 2 listening"; then ok; else
    bad "pod ps-shard-$k is not shard $k: $(cat "$tmp/logs/$s.log")"
  fi
  [ "$(http $s /readyz)" = 200 ] && ok || bad "pod ps-shard-$k: /readyz is not 200"
  [ "$(http $s /metrics)" = 401 ] && ok || bad "pod ps-shard-$k: /metrics without the token is not 401"
  [ "$(http $s /metrics "$token")" = 200 ] && ok ||
    bad "pod ps-shard-$k: /metrics with the Secret's token is not 200"
done
for w in w0 w1; do # still waiting, not failed
  kill -0 "${!w}" 2> /dev/null && ok || bad "worker $w exited before the names existed: $(cat "$tmp/logs/$w.log")"
done

# ---- the names appear: the workers train to the end ----
names=1
for p in w0 w1; do write_hosts $p; done
for w in w0 w1; do
  r=${w#w}
  if wait_for 90 exited "${!w}"; then
    wait "${!w}"
    st=$?
    [ "$st" = 0 ] && ok || bad "worker $w exited $st: $(tail -5 "$tmp/logs/$w.log")"
  else
    bad "worker $w did not finish in 90 s: $(tail -5 "$tmp/logs/$w.log")"
  fi
  if in_log "$tmp/logs/$w.log" "worker\[$r\] " && ! grep -q "worker\[$((1 - r))\] " "$tmp/logs/$w.log"; then
    ok
  else
    bad "worker $w does not run as rank $r (JOB_COMPLETION_INDEX): $(head -3 "$tmp/logs/$w.log")"
  fi
done

# ---- SIGTERM: a checkpoint and exit 0 (within a grace period) ----
sigterm_shards() { # PHASE LOG-SUFFIX
  local s k st
  kill -TERM "$s0" "$s1"
  for s in s0 s1; do
    k=${s#s}
    if wait_for 30 exited "${!s}"; then
      wait "${!s}"
      st=$?
      [ "$st" = 0 ] && ok || bad "$1: ps-shard-$k exited $st after SIGTERM: $(tail -3 "$tmp/logs/$s$2.log")"
    else
      bad "$1: ps-shard-$k still running 30 s after SIGTERM"
      kill -KILL "${!s}"
    fi
    if in_log "$tmp/logs/$s$2.log" "checkpoint (SIGTERM): $root/var/lib/ps/shard-$k.ckpt" &&
      [ -s "$root/var/lib/ps/shard-$k.ckpt" ]; then
      ok
    else
      bad "$1: ps-shard-$k wrote no checkpoint at SIGTERM: $(tail -3 "$tmp/logs/$s$2.log")"
    fi
  done
}
sigterm_shards "first run" ""

# ---- restarted: /healthz only once the checkpoint is loaded ----
for s in s0 s1; do
  k=${s#s}
  pod $s "ps-shard-$k" "$tmp/logs/$s.2.log" -- "${shard_cmd[@]}"
  eval "$s=\$!"
done
for s in s0 s1; do
  k=${s#s}
  if wait_for 20 answers $s /healthz 200; then
    # the log as it was when /healthz first answered
    if in_log "$tmp/logs/$s.2.log" "resumed from $root/var/lib/ps/shard-$k.ckpt"; then ok; else
      bad "restarted ps-shard-$k answered /healthz before its checkpoint was loaded: $(cat "$tmp/logs/$s.2.log")"
    fi
  else
    bad "restarted ps-shard-$k: /healthz does not answer: $(cat "$tmp/logs/$s.2.log")"
  fi
done
sigterm_shards "restarted" .2

# ---- replicas: a shard waits for its backup's name, not ready till then ----
with_config() { # CONFIG CMD...: CMD with --config CONFIG
  local a=("${@:2}") i
  for i in "${!a[@]}"; do [ "${a[$i]}" = --config ] && a[$((i + 1))]=$1; done
  printf '%s\n' "${a[@]}"
}
mapfile -t rshard < <(with_config "$tmp/replicas.yaml" "${shard_cmd[@]}")
mapfile -t rbackup < <(with_config "$tmp/replicas.yaml" "${backup_cmd[@]}")
pod s0 ps-shard-0 "$tmp/logs/r0.log" -- "${rshard[@]}"
s0=$!
if wait_for 20 in_log "$tmp/logs/r0.log" \
  "replication: partner ps-backup-0.ps-backups:7000: the name does not resolve yet"; then ok; else
  bad "a replicated shard does not say it waits for its partner's name: $(cat "$tmp/logs/r0.log")"
fi
if wait_for 10 answers s0 /healthz 200 && answers s0 /readyz 503; then ok; else
  bad "a shard whose partner is not there: /healthz $(http s0 /healthz) (want 200), /readyz $(http s0 /readyz) (want 503)"
fi
backup_names=1
write_hosts s0
write_hosts s1
pod s1 ps-backup-0 "$tmp/logs/r1.log" -- "${rbackup[@]}"
s1=$!
for s in s0 s1; do
  if wait_for 20 answers $s /readyz 200; then ok; else
    bad "pod $s of a replicated shard not ready once both exist: $(cat "$tmp/logs/r${s#s}.log")"
  fi
done
if in_log "$tmp/logs/r1.log" "server.r1\[0\] shard 0 of 1 listening"; then ok; else
  bad "pod ps-backup-0 is not shard 0's replica 1: $(head -5 "$tmp/logs/r1.log")"
fi
kill -TERM "$s0" "$s1"
for s in s0 s1; do
  if wait_for 30 exited "${!s}"; then
    wait "${!s}"
    st=$?
    [ "$st" = 0 ] && ok || bad "replicated pod $s exited $st after SIGTERM: $(tail -3 "$tmp/logs/r${s#s}.log")"
  else
    bad "replicated pod $s still running 30 s after SIGTERM"
    kill -KILL "${!s}"
  fi
done
backup_names=0

# ---- what a wrong pod gets: exit 2 naming the cause ----
expect_exit() { # WHAT STATUS TEXT POD HOST LOG [VAR=V...] -- CMD...
  local what=$1 want=$2 text=$3 st; shift 3
  pod "$@"
  local pid=$!
  if wait_for 20 exited $pid; then
    wait $pid
    st=$?
    if [ "$st" = "$want" ] && in_log "$3" "$text"; then ok; else
      bad "$what: exit $st (want $want), log: $(cat "$3")"
    fi
  else
    bad "$what: still running after 20 s"
    kill -KILL $pid
  fi
}
expect_exit "a pod named without an ordinal" 2 "host name 'ps-shard' does not end in -N" \
  s0 ps-shard "$tmp/logs/bad1.log" -- "${shard_cmd[@]}"
expect_exit "a third shard pod for a config of two" 2 "shard 2 does not exist" \
  s0 ps-shard-2 "$tmp/logs/bad2.log" -- "${shard_cmd[@]}"
expect_exit "a worker index the config lacks" 2 "\$JOB_COMPLETION_INDEX 2: " \
  w0 ps-workers-2 "$tmp/logs/bad3.log" JOB_COMPLETION_INDEX=2 -- "${worker_cmd[@]}"
expect_exit "a host name ending in - and no digits" 2 "host name 'ps-shard-x' does not end in -N" \
  s0 ps-shard-x "$tmp/logs/bad5.log" -- "${shard_cmd[@]}"
# the precedence: $PS_SHARD without --shard (auto: the host name again);
# $PS_RANK before the index, --rank before both (seen by the ranks refused)
no_shard=()
for a in "${shard_cmd[@]}"; do [ "$a" = --shard ] || [ "$a" = auto ] || no_shard+=("$a"); done
expect_exit "\$PS_SHARD=auto" 2 "\$PS_SHARD=auto (the host name's ordinal): shard 7 does not exist" \
  s0 ps-shard-7 "$tmp/logs/bad6.log" PS_SHARD=auto -- "${no_shard[@]}"
expect_exit "--shard before \$PS_SHARD" 2 "--shard auto (the host name's ordinal): shard 7 does not exist" \
  s0 ps-shard-7 "$tmp/logs/bad9.log" PS_SHARD=bogus -- "${shard_cmd[@]}"
expect_exit "\$PS_RANK before the index" 2 "\$PS_RANK 7: " \
  w0 ps-workers-0 "$tmp/logs/bad7.log" PS_RANK=7 JOB_COMPLETION_INDEX=0 -- "${worker_cmd[@]}"
expect_exit "--rank before both" 2 "--rank 9: " \
  w0 ps-workers-0 "$tmp/logs/bad8.log" PS_RANK=0 JOB_COMPLETION_INDEX=0 -- "${worker_cmd[@]}" --rank 9
names=0
write_hosts w1
mapfile -t short < <(with_config "$tmp/short.yaml" "${worker_cmd[@]}")
expect_exit "a worker whose shards never appear" 1 \
  "ps-shard-0.ps-shards:7000): the name did not resolve within 1500 ms (limits.connect_timeout_ms)" \
  w1 ps-workers-1 "$tmp/logs/bad4.log" JOB_COMPLETION_INDEX=1 -- "${short[@]}"

for n in "${NS[@]}"; do # nothing left running in any pod
  [ -z "$(ip netns pids "$n" 2> /dev/null)" ] && ok || bad "processes left in $n: $(ip netns pids "$n")"
done
echo "$(((checks - fails) * 100 / (checks ? checks : 1)))%: Checks: $checks, Failures: $fails, Errors: 0"
[ $fails -eq 0 ]
