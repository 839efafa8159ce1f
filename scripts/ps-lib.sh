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
