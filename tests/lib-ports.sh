# lib-ports.sh - free_port and kill_jobs for the test scripts. Sourced, not run.
#
# free_port [TAKEN...]: prints a port on 127.0.0.1 that nothing listens on
# (a connect to it fails) and that is none of TAKEN, or nothing after 100
# tries. It picks at random in 20000-31999, below the kernel's ephemeral
# range (32768 on): no connection takes a source port there, so a port
# picked free stays free until the process it is meant for binds it, even
# with other tests running beside (docs/testing.md).
free_port() {
  local p
  for _ in $(seq 100); do
    p=$((20000 + RANDOM % 12000)) # below the ephemeral range (32768 on)
    [[ " $* " == *" $p "* ]] && continue
    (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null || { echo $p; return; }
  done
}

# kill_jobs SIGNAL PID...: sends SIGNAL to each PID that is still a job of
# this shell (started with & and not waited for yet). A PID already waited
# for may be another program's by now, the kernel reuses them: a cleanup
# that sent SIGTERM to every PID it ever started once ended a test running
# beside (it_reshard_staged, "Received signal 15"), so such a PID is left
# alone.
kill_jobs() {
  local sig=$1 p live
  shift
  live=" $(jobs -p | tr '\n' ' ') "
  for p in "$@"; do
    [[ $live == *" $p "* ]] && kill "-$sig" "$p" 2>/dev/null
  done
  return 0
}
