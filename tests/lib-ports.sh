# lib-ports.sh - free_port for the test scripts. Sourced, not run.
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
