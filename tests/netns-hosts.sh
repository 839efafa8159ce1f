# netns-hosts.sh - hosts as network namespaces, for the multi-host tests
# (it_multihost.sh, it_slurm.sh). Sourced, not run.
#
# nh_up TAG A1 A2 ...: one namespace per address (hosts h1, h2, ... with
# those addresses on a /24, H[i] their namespace names), joined by a bridge
# in another namespace (BR); nothing outside them is touched but
# /etc/netns/NS/hosts, which `ip netns exec` mounts over /etc/hosts, so
# that every host names the others h1..hN. Returns non-zero with the
# reason in $nh_err when namespaces cannot be made here.
# nh_on I CMD...: runs CMD on host I. nh_write_hosts I [LINE]: host I's
# /etc/hosts again, LINE first (in place, so what runs there sees it).
# nh_procs_on I: the ps-server / ps-worker command lines running on host I.
# nh_down: every process in the namespaces killed (TERM, then KILL), the
# namespaces and their /etc/netns folders removed.
H=() A=() BR=""
nh_made_etc_netns=0
nh_up() {
  local tag=$1 i
  shift
  BR=$tag-br H=("") A=("")
  for i in $(seq $#); do H[$i]=$tag-h$i A[$i]=${!i}; done
  nh_err=$(ip netns add "$BR" 2>&1) || { BR=""; nh_err="cannot create a network namespace here: $nh_err"; return 1; }
  ip -n "$BR" link add br0 type bridge && ip -n "$BR" link set br0 up || { nh_err="cannot make a bridge"; return 1; }
  for i in $(seq $#); do
    ip netns add "${H[$i]}" &&
      ip -n "$BR" link add "h$i" type veth peer name eth0 netns "${H[$i]}" &&
      ip -n "$BR" link set "h$i" master br0 up &&
      ip -n "${H[$i]}" addr add "${A[$i]}/24" dev eth0 &&
      ip -n "${H[$i]}" link set eth0 up &&
      ip -n "${H[$i]}" link set lo up || { nh_err="cannot set up host h$i's namespace"; return 1; }
  done
  if [ ! -d /etc/netns ]; then
    mkdir /etc/netns || { nh_err="cannot make /etc/netns"; return 1; }
    nh_made_etc_netns=1
  fi
  for i in $(seq $#); do
    nh_write_hosts "$i" || { nh_err="cannot write /etc/netns/${H[$i]}/hosts"; return 1; }
  done
}
nh_on() { local i=$1; shift; ip netns exec "${H[$i]}" "$@"; }
nh_write_hosts() {
  local i names=()
  for i in $(seq $((${#H[@]} - 1))); do names+=("${A[$i]} h$i"); done
  mkdir -p "/etc/netns/${H[$1]}" &&
    printf '%s\n' ${2:+"$2"} "127.0.0.1 localhost" "${names[@]}" > "/etc/netns/${H[$1]}/hosts"
}
nh_procs_on() {
  local p
  for p in $(ip netns pids "${H[$1]}"); do
    { tr '\0' ' ' < "/proc/$p/cmdline"; } 2> /dev/null | grep -E '^[^ ]*bin/ps-(server|worker) ' |
      sed 's/ $//'
  done
}
nh_down() {
  local n p
  for n in "${H[@]:1}"; do
    p=$(ip netns pids "$n" 2> /dev/null)
    [ -n "$p" ] && kill -TERM $p 2> /dev/null
  done
  sleep 0.3
  for n in "${H[@]:1}"; do
    p=$(ip netns pids "$n" 2> /dev/null)
    [ -n "$p" ] && kill -KILL $p 2> /dev/null
  done
  for n in "${H[@]:1}" $BR; do ip netns del "$n" 2> /dev/null; done
  for n in "${H[@]:1}"; do rm -rf "/etc/netns/$n"; done
  [ $nh_made_etc_netns -eq 1 ] && rmdir /etc/netns 2> /dev/null
  return 0
}
