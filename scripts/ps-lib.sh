# ps-lib.sh - shell helpers the launch scripts share (sourced, not run).

# cfg_key DUMP SECTION KEY: the value of SECTION.KEY in DUMP, the output of
# `ps-server --config F --dump-config` (quotes removed and the escapes \"
# \\ \n \t of a double-quoted value undone; empty when absent).
cfg_key() {
  awk -v sec="$2" -v key="$3" '
    $0 ~ "^" sec ":" { s = 1; next }
    /^[^ ]/ { s = 0 }
    s && $0 ~ "^  " key ":" {
      v = $0; sub("^  " key ": *", "", v)
      if (v ~ /^".*"$/) {
        v = substr(v, 2, length(v) - 2); out = ""
        for (i = 1; i <= length(v); i++) {
          c = substr(v, i, 1)
          if (c == "\\" && i < length(v)) {
            c = substr(v, ++i, 1)
            if (c == "n") c = "\n"; else if (c == "t") c = "\t"
          }
          out = out c
        }
        v = out
      }
      print v; exit
    }' <<<"$1"
}

# cfg_first_diff OLD_DUMP NEW_DUMP: the first key (SECTION.KEY) whose line
# differs between two --dump-config outputs, cluster.servers and
# cluster.backups left out;
# empty when they differ in nothing else. What `reshard` allows to change.
cfg_first_diff() {
  awk '
    function flat(line,   k) {
      if (line ~ /^#/ || line == "") return ""
      if (line ~ /^[^ ]/) { sec = line; sub(/:.*/, "", sec); key = sec; return key "\t" line }
      if (line ~ /^  [^ ]/) { k = line; sub(/^  /, "", k); sub(/:.*/, "", k); key = sec "." k }
      return key "\t" line
    }
    FNR == 1 { sec = ""; key = "" }
    NR == FNR { f = flat($0); if (f != "" && f !~ /^cluster\.(servers|backups)\t/) a[++na] = f; next }
    { f = flat($0); if (f != "" && f !~ /^cluster\.(servers|backups)\t/) b[++nb] = f }
    END {
      n = na > nb ? na : nb
      for (i = 1; i <= n; i++)
        if (a[i] != b[i]) { k = i <= na ? a[i] : b[i]; sub(/\t.*/, "", k); print k; exit }
    }' <(printf '%s\n' "$1") <(printf '%s\n' "$2")
}

# reshard_summary LOG...: the new shards' "re-sharded from" lines summed:
# what moved, for `ps-local.sh` / `ps-cluster.sh CONFIG reshard NEW_CONFIG`.
reshard_summary() {
  awk '/re-sharded from/ {
      n++; line = $0
      if (match(line, /: [0-9]+ slices, [0-9]+ rows;/)) {
        split(substr(line, RSTART + 2, RLENGTH - 3), p, " "); sl += p[1]; ro += p[3]
      }
      if (match(line, /another shard: [0-9]+ slices, [0-9]+ rows, [0-9]+ bytes/)) {
        split(substr(line, RSTART + 15, RLENGTH - 15), q, " "); ms += q[1]; mr += q[3]; mb += q[5]
      }
    }
    END {
      if (!n) { print "no shard said what it took (see their logs)"; exit 1 }
      printf "%d shard(s) re-sharded: %d of %d slices and %d of %d rows moved to another shard (%.1f MiB)\n",
             n, ms, sl, mr, ro, mb / 1048576
    }' "$@"
}

# kill_jobs SIGNAL PID...: sends SIGNAL to each PID that is still a job of
# this shell (started with & and not waited for yet). A PID already waited
# for may be another program's by now (the kernel reuses them, soon where
# pid_max is 32768): such a PID is left alone. (A test's cleanup that sent
# SIGTERM to every PID it had started once ended another test running
# beside it.)
kill_jobs() {
  local sig=$1 p live
  shift
  live=" $(jobs -p | tr '\n' ' ') "
  for p in "$@"; do
    [[ $live == *" $p "* ]] && kill "-$sig" "$p" 2>/dev/null
  done
  return 0
}
