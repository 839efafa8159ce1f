#!/usr/bin/env bash
# mutate.sh - mutation testing of the code that guards correctness and
# security: each mutant (one small change to one line, made by
# universalmutator's C rules) is built and run against the narrowest test
# suites for its file; a mutant no suite fails is a survivor, a place where
# a bug would go unnoticed. Called by `make mutate`; docs/testing.md has the
# last full run's score and what each survivor means.
#
#   scripts/mutate.sh [--help]
#
# Environment:
#   MUTATE_FILES     files to mutate (default: every file of the list below)
#   MUTATE_PER_FILE  mutants tested per file (default 10: most of a day here
#                    over every file; 0 = all of them, weeks); drawn mutants that fail a
#                    syntax check are set aside and the draw goes on
#   MUTATE_SEED      seed of the draw (default 1): the same seed, the same mutants
#   MUTATE_TIMEOUT   seconds one suite may run before the mutant counts as
#                    killed by a hang (default: three times the suite's own
#                    unmutated time, at least 30 s; see below)
#   MUTATE_REMEASURE 1: time every suite again instead of using
#                    build/mutate/times.tsv
#   MUTATE_FILE_SAMPLE N: only N files of the list, drawn with the seed (a
#                    fresh draw over the whole default list (70 files) at
#                    one mutant each takes a day's afternoon here; half of
#                    it, drawn, is an unbiased sample of the files)
#   MUTATE_TIME_ONLY 1: build and time the suites the files need (into
#                    build/mutate/times.tsv), then stop before drawing
#                    any mutant: the timing can be done ahead of a draw
#
# Suites: a test program of build/rel/tests; `san:NAME`, the same program of
# the sanitizer build (make SANITIZE=address,undefined, build/san/tests), so
# that memory mutants count; `tsan:NAME`, a program that runs the code in
# its own process (check_*) built with ThreadSanitizer (build/tsan/tests),
# for races; `NAME@CASE,CASE`, only those cases
# (PS_TEST_ONLY); a script tests/NAME.sh; a pytest file python/tests/NAME.py;
# `rdma:STEP,STEP`, those steps of tests/rdma-suite.sh in the soft-RoCE VM
# (tests/rdma-vm.sh, about a minute to boot here), for the RDMA transport.
# Before the mutants, every suite the run needs is run once on the
# unmutated tree and timed (kept in build/mutate/times.tsv for later runs):
# a suite that fails there is left out with a warning (it would kill every
# mutant), a file's suites run fastest first, and each gets three times its
# own time. A file of the scope without an entry in suites_for gets the
# default suites and a warning.
#
# universalmutator (PyPI) is installed once into build/mutate/venv. Results
# go to build/mutate/: results.tsv (one line per mutant) and report.md (the
# score per file and every survivor with its line before and after).
# A mutant whose object file, built without debug information, is byte for
# byte the unmutated one's (a line of an #ifdef branch this build leaves
# out, say) is recorded as "same-code" and not run: no test could see it.
# The file under test is always put back, also on Ctrl-C, and the tree is
# rebuilt at the end.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then
  awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"
  exit 0
fi

OUT=build/mutate
VENV=$OUT/venv
PER_FILE=${MUTATE_PER_FILE:-10}
SEED=${MUTATE_SEED:-1}
T=build/rel/tests

# The files in scope: the shard, the client library, and the common code
# every frame, gradient and row passes through. Globs, so that a new file
# of server/ or worker/client/ is in by default.
default_files() {
  ls server/*.c worker/client/*.c common/transport*.c common/wire.c common/msg.c \
     common/codec*.c common/auth.c common/frame_mac.c common/frame_aead.c common/finite.c \
     common/rows_wire.c common/shardmap.c common/config_agree.c common/optim_group.c \
     common/table_decl.c common/version.c worker/worker_cmd.c worker/ps_export.c worker/npz.c \
     worker/export_read.c worker/epoch.c worker/ctr_model.c worker/ctr_train.c \
     worker/stop_signal.c worker/ps_stat_reshard.c 2>/dev/null |
    grep -v '^server/main.c$'
}

# The suites that exercise a file, those that kill its mutants soonest
# first (the run orders them by measured time anyway); san: suites for the
# files whose mistakes are often memory errors a release build survives.
# A file of the shard, the client or the common code whose list names no
# san: suite gets the sanitizer build of its first test program
# (suites_for, below): a leak, an overflow, a use after free or undefined
# behaviour counts in every such file, not only where one was met before
# (it_fault* are left out: they skip under the sanitizer build).
suites_of() {
  case "$1" in
    server/store.c)            echo check_store it_cluster san:check_store ;;
    server/optimizer.c)        echo check_optimizer check_store ;;
    server/dedup.c)            echo check_dedup it_cluster san:check_dedup ;;   # san: shifts past 63
    # it_rows' two cases: the table sections' refusals (damaged, out of the chain)
    # it_fault: its writes, fsync, rename and reads failed in turn (libpsfault.so)
    # it_reshard: the old files read at a re-shard (tensors, tables, epochs)
    # test_export.py@declared_tensors: a damaged declared tensor record refused at start
    # test_checkpoint_crafted.py: slices, finished clocks and table records that lie under a right CRC
    server/checkpoint.c)       echo test_checkpoint_crafted.py test_export.py@declared_tensors test_export.py@stale_chain it_checkpoint it_groups it_decl_tables it_reshard \
                                    it_rows@test_checkpoint_kill9,test_incremental_kill9 \
                                    it_fault@test_ckpt_faults,test_restore_faults san:it_checkpoint ;;
    server/handshake.c)        echo it_hostile it_reader it_replica_auth ;;
    server/push.c)             echo it_hostile it_cluster it_groups it_agree san:it_hostile ;;   # it_agree: pushes of a config that differs   # it_groups: the pushes' group rates
    server/pull.c)             echo it_cluster it_hostile san:it_cluster it_reader@test_reader_pulls_what_a_worker_pulls ;;
    # it_reader: the reader's refusals; it_replica_auth, it_replica_cases: the replicas' Hellos
    # it_reshard_ops' case: a leave begun given up when another process of its rank connects
    server/conn.c)             echo it_reader it_hostile it_cluster it_fake_shard it_replica_auth it_replica_cases it_agree \
                                    it_reshard_ops@test_one_change_at_a_time ;;
    # it_hostile reads the queue figures; it_decl_tables restarts from a
    # chain of incremental checkpoints (the base length its deltas name);
    # it_reshard_live: the re-shard stop requests; it_rows' one case: the
    # incremental checkpoints, copied on the loop or written by a forked
    # child (checkpoint.fork_bytes); it_client_api: a checkpoint asked of a
    # shard without checkpoint.dir; it_fault: the checkpoint writer's
    # failures, the CRC's read-back cut short
    # it_reshard_staged: the pre-copy's background checkpoint and its base
    server/admin.c)            echo it_stat it_checkpoint it_hostile it_decl_tables it_reshard_live it_reshard_staged \
                                    it_rows@test_incremental_kill9 it_client_api@test_stats_sized \
                                    it_fault@test_ckpt_faults it_fault_repl@test_join_hold_oom ;;
    server/metrics_http.c)     echo it_stat it_replica_cases it_replica_stats ;;  # the replication figures
    # it_replica_decl: a declaration on a pair; it_hostile's case: raw declarations that lie
    server/declare.c)          echo it_declare it_groups it_replica_decl it_fault@test_declare_oom_sweep it_hostile@test_declare_lies \
                                    it_decl_tables@test_decl_digest_follows_tables ;;
    # it_reshard_cases, it_reshard_staged: a shard's start from another map's files
    server/server.c)           echo it_cluster it_checkpoint it_stat it_hostile it_reshard_cases it_reshard_staged ;;
    server/reader.c)           echo it_reader ;;
    # it_fault: out of memory half-way through a declaration of two tables,
    # the shard under valgrind (what was made must be freed); the declared
    # tables' section of a checkpoint read with each read failed in turn
    server/decl_tables.c)      echo it_decl_tables it_fault@test_declare_oom_sweep,test_declare_tables_oom_leak,test_restore_faults test_decl_tables.py \
                                    it_reshard_requests test_export.py it_hostile@test_declare_lies ;;
    # it_hostile's case: every refusal of a join or leave step and of a
    # push by no member; it_replica_auth: a replica's membership;
    # it_reshard_ops: a join during a stop
    server/members.c)          echo it_hostile@test_member_steps_refused it_elastic it_elastic_repl it_replica_auth \
                                    it_reshard_ops@test_one_change_at_a_time san:it_elastic_repl ;;
    # it_reshard_staged: the staged load; it_reshard_pairs.sh: the pairs' two files;
    # it_fault's case: out of memory at a --reshard-from start; it_reshard_ops'
    # case: old files of two map epochs refused
    server/reshard.c)          echo it_reshard it_reshard_staged it_reshard_pairs.sh it_reshard_cases@test_pairs_2_to_3 it_fault@test_reshard_start_oom \
                                    it_reshard_ops@test_epoch_2_3_2 ;;
    # the staged start (the pre-copy) and the marker until the first
    # checkpoint: it_reshard's marker case; the staging runs under the launcher
    server/reshard_stage.c)    echo it_reshard it_reshard_staged it_reshard_live.sh ;;
    # the rows' merge by last update, and the staged merge brought up to the stop
    server/reshard_rows.c)     echo it_reshard_staged it_reshard ;;
    # replication: the scripted cases first, then the fault runs;
    # it_replica_decl: a declaration's ack waits for the backup
    # it_rows_errors: an unreplicated shard (no replication state) whose
    # connections close
    # it_fault_repl: a declaration's ack record out of memory (replica_log.c);
    # san:it_replica_auth: a one-worker pair under ASan (a copy a byte long
    # of the finished clocks overflows only there)
    server/replica.c|server/replica_log.c|server/replica_apply.c)
                               echo check_repl_rules it_rows_errors it_replica_cases it_replica_stats it_replica_auth it_replica_decl it_elastic_repl it_replica it_replica_rows it_reshard_pairs.sh \
                                    it_fault_repl@test_declare_oom,test_primary_batch_oom san:it_replica_cases \
                                    san:it_replica_auth@test_partner_contents_range_checked,test_partner_rows_range_checked ;;
    # declarations replicated; it_fault_repl: the primary out of memory copying one
    # it_replica_auth's case: a partner's batches declaring what does not hold
    server/replica_decl.c)     echo it_replica_decl it_fault_repl@test_declare_oom \
                                    it_replica_auth@test_partner_rows_range_checked san:it_replica_decl ;;
    # the tables' part of replication: row batches, tables in the snapshot
    # (it_fault_repl: the snapshot's write to a memory file interrupted, failed;
    # the backup out of memory creating a row)
    # it_replica_auth's case: a partner's lies in the tables' image and the row batches
    server/replica_rows.c)     echo it_replica_rows it_rows_model it_fault_repl@test_snapshot_faults,test_backup_rows_oom,test_primary_batch_oom \
                                    it_replica_auth@test_partner_rows_range_checked san:it_replica_rows ;;
    # tables and rows: the model checks without a network, then two shards
    server/table_optim.c)      echo check_row_optim check_rows it_rows ;;
    # test_export.py's case: the evicted ids' list out of memory (a full
    # checkpoint next)
    server/table.c|server/table_admit.c)
                               echo check_rows it_rows_model it_rows it_reshard san:check_rows \
                                    it_fault@test_declare_tables_oom_leak,test_rows_reserve_oom test_export.py@tombstones \
                                    test_export.py@row_cap ;;
    # it_decl_tables: declared tables through full and incremental checkpoints
    server/table_ckpt.c)       echo test_checkpoint_crafted.py it_rows it_rows_model it_decl_tables it_reshard_staged it_export.sh test_export.py \
                                    it_fault@test_restore_faults,test_ckpt_faults ;;
    server/rows.c)             echo it_rows it_rows_errors it_rows_model it_replica_cases it_reshard_rows \
                                    it_fault@test_rows_oom it_fault_repl@test_primary_rows_oom \
                                    san:it_rows ;;   # it_fault: a reply's buffer, a row not allocated
    # it_fault's test_client_oom: every allocation of a worker's calls failed in turn
    # it_fake_shard: row pull replies that do not fit what was asked
    worker/client/ps_client_rows.c)    echo it_fake_shard@test_malformed_row_pull_replies it_rows \
                                            it_rows_model test_embeddings.py it_reshard_rows \
                                            it_fault@test_send_eagain,test_client_oom ;;
    # it_fault: the shard out of memory at each allocation of a declaration in turn
    worker/client/ps_client_declare.c) echo it_declare it_groups it_fault@test_declare_oom_sweep it_reshard_requests ;;
    worker/client/ps_client_api.c)     echo it_client_api it_declare it_fault@test_send_eagain,test_client_oom ;;
    worker/client/ps_client_tables.c)  echo it_decl_tables test_decl_tables.py ;;
    # it_fake_shard's cases: the pace of a join refused during a stop, and its giving up;
    # scripted answers to a join's and a leave's steps that do not fit or refuse;
    # the membership of pull replies coming late
    worker/client/ps_client_members.c) echo it_fake_shard@test_join_waits_paced,test_join_answers_checked,test_leave_answers_checked,test_members_not_turned_back \
                                            it_elastic it_reshard_elastic test_elastic.py ;;
    # the live re-shard: the client following a new map, the shards' stop
    # it_client_api@test_stats_sized: a stop's struct sizes and refusals (stop_at lives here)
    worker/client/ps_client_follow.c)  echo it_client_api@test_stats_sized it_reshard_live it_reshard_rows \
                                            it_reshard_requests it_reshard_live.sh test_reshard_live.py it_fault@test_config_diff_oom ;;
    worker/client/ps_client_recut.c)   echo it_reshard_live it_reshard_rows it_reshard_live.sh ;; # the re-cut of waiting pushes at a live re-shard (test_error_feedback_2_3 among them)
    # it_reshard_ops' case: the refusals of a stop, and /metrics of a prepared and a committed one;
    # it_client_api's: a stop asked of a shard without checkpoint.dir
    server/stop.c)             echo it_reshard_order it_reshard_live it_reshard_rows it_reshard_requests it_reshard_live.sh \
                                    it_reshard_ops@test_one_change_at_a_time it_client_api@test_stats_sized ;;
    # ps-stat --reshard-stop / --reshard-cancel: the stop, its digest check, the refusals
    worker/ps_stat_reshard.c)  echo it_reshard_requests it_reshard_live it_reshard_live.sh it_reshard_ops@test_one_change_at_a_time ;;
    # ps-worker's ctr preset and its signal thread (leaves on SIGTERM)
    worker/ctr_model.c|worker/ctr_train.c) echo it_ctr it_elastic@test_ctr_data_once it_fault@test_ctr_model_oom ;;
    # test_stop_grace: the grace alarm of a worker stuck at a barrier
    worker/stop_signal.c)      echo it_elastic@test_stop_grace,test_ctr_data_once,test_worker_data_once ;;
    # it_reader: a reader's handshake and its errors; the one elastic case:
    # a join's clock read from the shards' Stats; it_client_api: the rank's
    # range; the one it_reshard_ops case: a waiting join's reason (member_error);
    # the two it_replica_stats cases: the replication figures of the Stats;
    # it_reshard_live: a live re-shard followed (pushes refused at a stop and
    # sent again, re-cut pushes a new shard's checkpoint holds, pairs);
    # test_reshard_live.py: a stop's refusals backed off (0.1 s doubled up
    # to 1 s) and pushes sent again, a shard of another map dialled again;
    # san:it_cluster's case: encoded slices packed into the push's buffer
    # (an offset a byte off overflows it, which only the sanitizer sees)
    worker/client/ps_client.c|worker/client/ps_client_build.c|worker/client/ps_client_conn.c|worker/client/ps_client_req.c)
                               echo it_fake_shard it_cluster it_checkpoint it_hostile it_replica_cases it_reader \
                                    it_elastic@test_restart_keeps_membership it_client_api \
                                    it_reshard_ops@test_one_change_at_a_time \
                                    it_replica_stats@test_figures_follow_operations,test_link_timers \
                                    it_fault@test_send_eagain,test_client_oom it_reshard_live san:it_fake_shard \
                                    san:it_cluster@test_fp16_exact test_reshard_live.py ;;
    common/config_agree.c)     echo it_agree it_replica_auth@test_partner_settings_must_agree ;;
    common/optim_group.c)      echo it_groups ;;
    common/table_decl.c)       echo it_decl_tables it_hostile@test_declare_lies ;;   # raw declarations of tables that lie
    common/version.c)          echo it_docs.sh rdma:version ;;   # every program's --version; rdma usable in the VM
    worker/worker_cmd.c)       echo test_launch.py it_launch.sh ;;   # ps-worker --exec: alone, and under ps-cluster.sh
    worker/epoch.c)            echo it_elastic it_train test_launch.py@progress_on_a_terminal ;;  # each example once per epoch; the progress line on a tty
    worker/ps_export.c)        echo it_export.sh test_export.py ;;  # ps-export on real checkpoints, damaged ones
    # check_npz: zip64, failures; under ASan for the header's buffers
    worker/npz.c)              echo check_npz san:check_npz it_export.sh test_export.py ;;
    # reading checkpoints: versions 1-2 and damage in it_export.sh; declared
    # tensors and tables (versions 2-4), --since and cut sections in pytest's
    worker/export_read.c)      echo it_export.sh test_export.py ;;
    # rdma: the verbs paths run only in the VM (the host has no RDMA device)
    common/transport_rdma.c)   echo check_rdma check_transport rdma:check_rdma,check_transport,reg_mr_faults ;;
    common/transport.c)        echo check_rdma check_transport it_hostile rdma:check_rdma san:check_transport ;;   # check_rdma: the registry's refusal; san: aligned_alloc's size, a multiple of 64
    # it_fault: accept out of memory; tsan: send_now's threads against the loop's
    common/transport_tcp.c)    echo check_transport it_hostile it_fault@test_accept_oom san:check_transport \
                                    tsan:check_transport ;;
    common/wire.c)             echo check_wire it_hostile san:check_wire ;;
    common/msg.c)              echo check_wire it_hostile it_fault_repl@test_declare_oom san:check_wire it_fault@test_rows_oom_sweep ;;  # a copy out of memory; a frame not sent for want of memory (its line)
    common/codec*)             echo check_store check_codec san:check_codec ;;
    common/finite.c)           echo check_store it_hostile check_rows ;;
    common/auth.c)             echo check_auth check_transport it_hostile it_reader ;;
    common/frame_mac.c)        echo check_auth check_transport san:check_transport ;;
    # the encrypted conformance runs: frames sealed under each cipher
    # (check_transport), the sync sums over encrypted links (it_cluster),
    # hand-sealed records from a hostile peer (it_hostile)
    common/frame_aead.c)       echo check_transport it_cluster@test_sync_exact_sum it_hostile san:check_transport ;;
    common/rows_wire.c)        echo check_rows check_jump it_rows it_reshard ;;
    common/shardmap.c)         echo check_shardmap it_cluster it_rows it_reshard ;;
    *) echo "mutate: $1 has no suites of its own in suites_for; it runs against the" \
            "defaults (it_cluster it_checkpoint it_hostile)" >&2
       echo it_cluster it_checkpoint it_hostile ;;
  esac
}
suites_for() {
  local l s
  l=$(suites_of "$1") || return
  case " $l" in *" san:"*) echo "$l"; return ;; esac
  # ps-worker's own files (training, export) are left as they are: their
  # programs train, which takes minutes under the sanitizers
  case "$1" in server/*|worker/client/*|common/*) ;; *) echo "$l"; return ;; esac
  for s in $l; do
    case "$s" in *.sh|*.py|it_fault*) ;; *) echo "$l san:$s"; return ;; esac
  done
  echo "$l"
}

files=${MUTATE_FILES:-$(default_files)}
if [ -n "${MUTATE_FILE_SAMPLE:-}" ]; then
  # a seeded draw of files, kept in the list's order
  files=$(printf '%s\n' $files | python3 -c "
import random, sys
f = [l.strip() for l in sys.stdin if l.strip()]
keep = set(random.Random('$SEED:files').sample(f, min(len(f), int('$MUTATE_FILE_SAMPLE'))))
print(' '.join(x for x in f if x in keep))")
  echo "mutate: $MUTATE_FILE_SAMPLE files drawn with seed $SEED: $files" >&2
fi
mkdir -p "$OUT"
if [ ! -x "$VENV/bin/mutate" ]; then
  echo "mutate: installing universalmutator into $VENV" >&2
  python3 -m venv "$VENV" && "$VENV/bin/pip" install -q universalmutator==1.14.1 || {
    echo "mutate: cannot install universalmutator from PyPI (network?)" >&2; exit 1; }
fi

export PS_SECRET_FILE=$PWD/$OUT/ps.secret   # absolute: pytest runs in python/tests
# the replicated shards' key, as run-tests.sh makes it (a program that does
# not make its own would see its pairs refuse to start)
export PS_REPL_KEY_FILE=$PWD/$OUT/ps.replkey
# the CUDA plug-in of this tree, as run-tests.sh finds it (test programs
# live under build/, not beside lib/ as bin/ps-worker does: without it
# it_train's refusal of device cuda named another reason, it failed on the
# unmutated tree and was left out of every draw)
export PS_COMPUTE_PLUGIN_DIR=${PS_COMPUTE_PLUGIN_DIR:-$PWD/lib}
export PS_TEST_QUICK=1   # it_replica runs fewer clocks; it_checkpoint_big skips its 4.4 GB case
export PS_TEST_SWEEP=full  # it_fault's test_client_oom fails every allocation in turn
[ -f "$PS_SECRET_FILE" ] || scripts/ps-keygen "$PS_SECRET_FILE" 2>/dev/null || exit 1
[ -f "$PS_REPL_KEY_FILE" ] || scripts/ps-keygen "$PS_REPL_KEY_FILE" 2>/dev/null || exit 1

SAN=address,undefined
declare -A SUITES
for f in $files; do SUITES[$f]=$(suites_for "$f"); done
all_suites=$(for f in $files; do printf '%s\n' ${SUITES[$f]}; done | sort -u)

# A suite's variant (rel, san or tsan), its program's make target, and its
# run: a test program of build/VARIANT/tests (PS_TEST_ONLY for NAME@CASES),
# a script tests/NAME.sh (run as it is), or a pytest file
# python/tests/NAME.py (its tests, by scripts/test-python.sh).
variant_of() { case "$1" in san:*) echo san ;; tsan:*) echo tsan ;; *) echo rel ;; esac; }
suite_target() {
  local n=${1#tsan:}
  n=${n#san:}
  n=${n%%@*}
  case "$n" in
    *.sh|*.py) ;;
    rdma:*) echo build/rel/tests/check_rdma build/rel/tests/check_transport \
                 build/rel/tests/it_cluster build/rel/tests/it_checkpoint \
                 build/rel/tests/libpsfault.so ;;
    *) echo "build/$(variant_of "$1")/tests/$n" ;;
  esac
}
# bin/ and lib/ are shared by the two builds: building one variant relinks
# them for it, so a suite's variant is built (the changed objects and a
# link) before it runs.
built=""
# tsan: (ThreadSanitizer, build/tsan) is for the programs that run the code
# in their own process (check_*): only they are built, bin/ is left alone.
build_variant() {   # variant, then the make targets of its suites
  local v=$1; shift
  case "$v" in
    san)  make -s -j2 SANITIZE=$SAN all "$@" ;;
    tsan) [ $# -eq 0 ] || make -s -j2 SANITIZE=thread OBJ=build/tsan "$@" ;;
    *)    make -s -j2 all "$@" ;;
  esac
}
ensure_built() {    # the variant of suite $1, built with the tree as it is now
  local v
  v=$(variant_of "$1")
  if [ "$v" = tsan ]; then   # its own objects: bin/ and $built stay
    build_variant tsan $(suite_target "$1") >>"$OUT/build.log" 2>&1
    return
  fi
  [ "$built" = "$v" ] && return 0
  build_variant "$v" $(suite_target "$1") >>"$OUT/build.log" 2>&1 || return 1
  built=$v
}
# timeout's TERM, then KILL 30 s later: a script's clean-up that waits for
# shards a mutant hung would otherwise hold the draw for ever (it did, at
# seed 20261152's reshard_stage.c)
limit() { timeout -k 30 "$@"; }
run_suite() {       # suite, seconds
  local n=${1#tsan:} only=""
  n=${n#san:}
  case "$n" in rdma:*) ;; *@*) only=${n#*@}; n=${n%%@*} ;; esac
  case "$n" in
    *.sh) limit "$2" "tests/$n" ;;
    # the VM's own timeout ends the guest; timeout's is the limit of the suite
    rdma:*) limit "$2" tests/rdma-vm.sh --no-perftest --timeout "$2" -- \
              tests/rdma-suite.sh --no-figures --only "${n#rdma:}" build/rel ;;
    # NAME.py@EXPR: only the cases pytest -k EXPR picks
    *.py) (cd python/tests && limit "$2" ../../build/pyvenv/bin/python -m pytest -q -x \
             -p no:cacheprovider ${only:+-k "$only"} "$n") ;;
    *)    PS_TEST_ONLY=$only limit "$2" "$(suite_target "$1")" ;;
  esac
}

echo "mutate: building the unmutated tree and its tests (release and sanitizer builds)" >&2
san_targets=$(for s in $all_suites; do [ "$(variant_of "$s")" = san ] && suite_target "$s"; done | sort -u)
tsan_targets=$(for s in $all_suites; do [ "$(variant_of "$s")" = tsan ] && suite_target "$s"; done | sort -u)
build_variant tsan $tsan_targets >/dev/null || {
  echo "mutate: the unmutated tree does not build with SANITIZE=thread" >&2; exit 1; }
if [ -n "$san_targets" ]; then
  build_variant san $san_targets >/dev/null || {
    echo "mutate: the unmutated tree does not build with SANITIZE=$SAN" >&2; exit 1; }
fi
build_variant rel $(for s in $all_suites; do [ "$(variant_of "$s")" = rel ] && suite_target "$s"; done | sort -u) \
  >/dev/null || { echo "mutate: the unmutated tree does not build" >&2; exit 1; }
built=rel
case "$all_suites" in *.py*)   # the package, installed once into build/pyvenv
                               # (after the release build: it needs lib/libps.so)
  scripts/test-python.sh --install-only >/dev/null || {
    echo "mutate: cannot install the Python package (scripts/test-python.sh)" >&2; exit 1; } ;;
esac

# Each suite's unmutated time (build/mutate/times.tsv: suite, seconds), so
# that its limit follows it: three times its time, at least 30 s. A suite
# that fails unmutated is left out (it would count every mutant as killed).
TIMES=$OUT/times.tsv
[ "${MUTATE_REMEASURE:-0}" = 1 ] && rm -f "$TIMES"
touch "$TIMES"
declare -A SECS
while IFS=$'\t' read -r s t; do [ -n "$s" ] && SECS[$s]=$t; done <"$TIMES"
for s in $all_suites; do
  [ -n "${SECS[$s]:-}" ] && continue
  ensure_built "$s" || { echo "mutate: $s does not build" >&2; exit 1; }
  echo "mutate: timing $s on the unmutated tree" >&2
  t0=$EPOCHREALTIME
  run_suite "$s" 1800 >"$OUT/run.log" 2>&1
  rc=$?
  t=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a + 0.5 }')
  if [ $rc -ne 0 ]; then
    echo "mutate: WARNING: $s fails on the unmutated tree (exit $rc, $OUT/run.log); left out" >&2
    cp "$OUT/run.log" "$OUT/unmutated-fail-${s//[:@\/]/_}.log"
    SECS[$s]=fail
    continue   # not recorded: measured again by the next run
  fi
  SECS[$s]=$t
  printf '%s\t%s\n' "$s" "$t" >>"$TIMES"
done
if [ "${MUTATE_TIME_ONLY:-0}" = 1 ]; then
  echo "mutate: suites timed ($TIMES); MUTATE_TIME_ONLY is set, no mutant drawn" >&2
  exit 0
fi
limit_of() {
  if [ -n "${MUTATE_TIMEOUT:-}" ]; then echo "$MUTATE_TIMEOUT"; return; fi
  local t=${SECS[$1]}
  [ $((3 * t)) -gt 30 ] && echo $((3 * t)) || echo 30
}
# a file's suites, fastest first, without those that fail unmutated
ordered_suites() {
  for s in ${SUITES[$1]}; do
    [ "${SECS[$s]}" = fail ] && continue
    printf '%s\t%s\n' "${SECS[$s]}" "$s"
  done | sort -n -s -k1,1 | cut -f2 | tr '\n' ' '
}

CC_LINE=$(make -s print-cc) || exit 1
# The object of $f (as it stands) into $1, without debug information (-g0:
# a mutant shifts columns, not code).
code_of() {
  $CC_LINE -g0 -c -x c "$f" -iquote "$(dirname "$f")" -o "$1" >/dev/null 2>&1
}
syntax_rejected=0
current=""
restore() {
  if [ -n "$current" ]; then
    cp "$OUT/orig" "$current"
    current=""
  fi
}
trap 'f0=$current; restore; echo "mutate: interrupted; $f0 put back" >&2; exit 130' INT TERM
trap restore EXIT

results=$OUT/results.tsv
: >"$results"
total=0
start=$(date +%s)
for f in $files; do
  dir=$OUT/mutants/${f//\//_}
  rm -rf "$dir"
  mkdir -p "$dir"
  "$VENV/bin/mutate" "$f" c --noCheck --mutantDir "$dir" >/dev/null 2>&1
  mapfile -t all < <(ls "$dir" | sort -V)
  # a deterministic draw: shuffle with the seed, then keep the first
  # PER_FILE that pass a syntax check with the project's own flags (with
  # --noCheck about two thirds of the rules' output does not compile, and
  # building those would only waste the time of the run)
  mapfile -t order < <(printf '%s\n' "${all[@]}" | python3 -c "
import random, sys
m = [l.strip() for l in sys.stdin if l.strip()]
random.Random('$SEED:$f').shuffle(m)
print('\n'.join(m))")
  pick=()
  rejected=0
  for m in "${order[@]}"; do
    [ -n "$m" ] || continue
    if [ "$PER_FILE" -gt 0 ] && [ "${#pick[@]}" -ge "$PER_FILE" ]; then break; fi
    if $CC_LINE -fsyntax-only -x c "$dir/$m" -iquote "$(dirname "$f")" >/dev/null 2>&1; then
      pick+=("$m")
    else
      rejected=$((rejected + 1))
    fi
  done
  syntax_rejected=$((syntax_rejected + rejected))
  suites=$(ordered_suites "$f")
  echo "== $f: ${#all[@]} mutants, $rejected drawn did not compile, testing ${#pick[@]} against:" \
    "$(for x in $suites; do printf '%s (%ss) ' "$x" "$(limit_of "$x")"; done)" >&2
  cp "$f" "$OUT/orig"
  # the file's code as this machine builds it, without debug information:
  # a mutant whose object is byte for byte the same (a line in a branch of
  # #ifdef this build does not take, say) cannot change what any test sees
  code_of "$OUT/orig.o" || rm -f "$OUT/orig.o"
  for m in "${pick[@]}"; do
    [ -n "$m" ] || continue
    total=$((total + 1))
    hdr=$(diff "$f" "$dir/$m" | head -1)
    line=${hdr%%[acd]*}
    line=${line%%,*}
    case "$hdr" in
      *a*) before="(a new line after this one)" ;;   # an inserted statement
      *)   before=$(sed -n "${line}p" "$f" | sed 's/^[[:space:]]*//') ;;
    esac
    after=$(diff "$f" "$dir/$m" | sed -n 's/^> //p' | head -1 | sed 's/^[[:space:]]*//')
    current=$f
    cp "$dir/$m" "$f"
    outcome=""
    : >"$OUT/build.log"
    built=""
    if [ -e "$OUT/orig.o" ] && code_of "$OUT/mut.o" && cmp -s "$OUT/orig.o" "$OUT/mut.o"; then
      outcome="same-code"
    elif ! build_variant rel $(for s in $suites; do [ "$(variant_of "$s")" = rel ] && suite_target "$s"; done) \
        >"$OUT/build.log" 2>&1; then
      outcome="uncompilable"
    else
      built=rel
      for s in $suites; do
        if ! ensure_built "$s"; then outcome="uncompilable"; break; fi
        run_suite "$s" "$(limit_of "$s")" >"$OUT/run.log" 2>&1
        rc=$?
        if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then outcome="killed:$s(timeout)"; break; fi
        if [ $rc -ne 0 ]; then outcome="killed:$s"; break; fi
      done
      [ -n "$outcome" ] || outcome="SURVIVED"
    fi
    restore
    printf '%s\t%s\t%s\t%s\t%s\n' "$f" "$line" "$outcome" "$before" "$after" >>"$results"
    printf '%-28s %5s  %-28s %s  ->  %s\n' "$f" "$line" "$outcome" "${before:0:60}" "${after:0:60}"
  done
done
trap - EXIT INT TERM
echo "mutate: rebuilding the unmutated tree" >&2
touch $files
[ -n "$san_targets" ] && build_variant san $san_targets >/dev/null
build_variant tsan $tsan_targets >/dev/null
make -s -j2 all >/dev/null

python3 - "$results" "$OUT/report.md" "$SEED" "$PER_FILE" "$(( $(date +%s) - start ))" "$syntax_rejected" <<'EOF'
import sys, collections
rows = [l.rstrip('\n').split('\t') for l in open(sys.argv[1]) if l.strip()]
per = collections.OrderedDict()
for f, line, out, before, after in rows:
    d = per.setdefault(f, collections.Counter())
    d['killed' if out.startswith('killed') else out] += 1
out = open(sys.argv[2], 'w')
def w(s=''):
    print(s)
    out.write(s + '\n')
w('# Mutation run: seed %s, %s mutants per file, %d s' % (sys.argv[3], sys.argv[4] or 'all', int(sys.argv[5])))
w()
w('%s mutants drawn were set aside before building: they fail a syntax check.' % sys.argv[6])
w()
w('| file | mutants | uncompilable | same code | killed | survived |')
w('| --- | --- | --- | --- | --- | --- |')
tk = ts = tu = tc = 0
for f, d in per.items():
    n = sum(d.values())
    w('| %s | %d | %d | %d | %d | %d |' % (f, n, d['uncompilable'], d['same-code'], d['killed'],
                                         d['SURVIVED']))
    tk += d['killed']; ts += d['SURVIVED']; tu += d['uncompilable']; tc += d['same-code']
w('| all | %d | %d | %d | %d | %d |' % (tk + ts + tu + tc, tu, tc, tk, ts))
w()
w('Score: %d of %d compiled mutants killed (%.1f%%); %d left the object code as it was '
  '(equivalent in this build, not run)' % (tk, tk + ts, 100.0 * tk / max(1, tk + ts), tc))
w()
w('## Survivors')
w()
for f, line, o, before, after in rows:
    if o == 'SURVIVED':
        w('- `%s:%s`: `%s` -> `%s`' % (f, line, before, after))
EOF
