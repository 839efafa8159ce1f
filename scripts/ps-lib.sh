# ps-lib.sh - shell helpers the launch scripts share (sourced, not run).

# cfg_key DUMP SECTION KEY: the value of SECTION.KEY in DUMP, the output of
# `ps-server --config F --dump-config` (quotes removed; empty when absent).
cfg_key() {
  awk -v sec="$2" -v key="$3" '
    $0 ~ "^" sec ":" { s = 1; next }
    /^[^ ]/ { s = 0 }
    s && $0 ~ "^  " key ":" { sub("^  " key ": *", ""); gsub(/^"|"$/, ""); print; exit }' <<<"$1"
}
