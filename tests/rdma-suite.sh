#!/usr/bin/env bash
# rdma-suite.sh - the tests of `transport: rdma`, run inside the soft-RoCE VM
# of tests/rdma-vm.sh (`make test-rdma`, and `make test`):
#   1. check_rdma       the probe finds rxe0, names it, refuses others
#   2. check_transport  the conformance suite against rdma (clear, MAC,
#                       AES-GCM, ChaCha20-Poly1305) and test_rdma_bad_peer
#   2a. reg_mr_faults   a big frame's ibv_reg_mr failing on either end
#                       (check_transport with tests' libpsfault.so)
#   3. it_cluster       exact integer-gradient sums, 2 shards x 2 workers,
#                       sync (no auth, MACs, encryption) and async; a worker
#                       killed in a barrier; a worker that leaves and rejoins
#   4. it_checkpoint    a shard killed with -9 and restarted mid-training
#   5. training         the demo's config over rdma with the mlp preset on
#                       the first N images (ps-local.sh, 2 shards, 2
#                       workers): exit 0 and a test accuracy above chance
#                       (--demo trains the cnn itself)
#   6. figures          ps-bench over rdma against ib_send_lat/ib_write_bw
#                       of the same VM, as ratios (a smoke figure: emulated)
#   7. version          every program's --version says rdma is usable here
#                       (the host's tests see only the "not usable" line)
#
#   rdma-suite.sh [--demo] [--no-figures] [--only STEPS] [--images N] [BUILD_DIR]
#
#   --demo        run scripts/demo.sh over rdma instead (make demo-rdma)
#   --no-figures  leave out step 6, a measurement rather than a test (make
#                 test leaves it out; make test-rdma runs it)
#   --only STEPS  only these steps, named as above and split by commas
#                 (scripts/mutate.sh's rdma: suites: check_rdma,check_transport,...)
#   --images N    images the training step (or the demo) uses (default 2048; the cnn
#                 of --demo computes a few images a second here: try 256)
#   BUILD_DIR     where the test binaries are (default build/rel)
#
# Exit status: 0 when every step passed, else 1. Must run in the VM: it
# needs RDMA_VM_ADDR (the address rxe0's netdev has).
set -u
cd "$(dirname "$0")/.."

DEMO=0
FIGURES=1
IMAGES=2048
ONLY=
while [ $# -gt 0 ]; do
	case $1 in
	--demo) DEMO=1; shift ;;
	--no-figures) FIGURES=0; shift ;;
	--only) ONLY=,$2,; shift 2 ;;
	--images) IMAGES=$2; shift 2 ;;
	-h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d;s/^# \{0,1\}//'; exit 0 ;;
	*) break ;;
	esac
done
B=${1:-build/rel}
for s in ${ONLY//,/ }; do
	case $s in check_rdma | check_transport | reg_mr_faults | it_cluster | it_checkpoint | training | figures | version) ;;
	*) echo "rdma-suite: --only: no step '$s' (check_rdma, check_transport, reg_mr_faults," \
		"it_cluster, it_checkpoint, training, figures, version)" >&2; exit 2 ;;
	esac
done
ADDR=${RDMA_VM_ADDR:-}
if [ -z "$ADDR" ]; then
	echo "rdma-suite: RDMA_VM_ADDR is not set: run me inside tests/rdma-vm.sh" >&2
	exit 1
fi
export PS_TEST_HOST=$ADDR PS_TEST_TRANSPORT=rdma PS_TEST_TRANSPORTS=rdma
export PS_TEST_TIME_SCALE=${PS_TEST_TIME_SCALE:-3} # emulated: everything is slower
T=$(mktemp -d /tmp/rdma-suite.XXXXXX)
fail=0
SUMMARY=$T/summary

step() {
	local name=$1 t0=$EPOCHREALTIME rc
	shift
	case $ONLY in '' | *,"$name",*) ;; *) return 0 ;; esac
	echo "==== $name: $*"
	"$@"
	rc=$?
	awk -v n="$name" -v rc=$rc -v a="$t0" -v b="$EPOCHREALTIME" \
		'BEGIN{printf "  %-16s %-6s %6.1fs\n", n, rc ? "FAIL" : "ok", b-a}' >>"$SUMMARY"
	[ $rc = 0 ] || fail=1
	return $rc
}

# The demo's config over rdma: conf/local.yaml with the VM's address, the
# secret made next to it (ps-local.sh does), metrics in the scratch folder.
# Under emulation the cnn computes a few images a second: train.limit and
# train.test_limit keep it to IMAGES of each (the cluster's work is the same
# per step).
sed -e "s/^  servers: .*/  servers: [$ADDR:7000, $ADDR:7001]/" \
	-e "s/^  epochs: .*/  epochs: 1\n  limit: $IMAGES\n  test_limit: $IMAGES/" \
	-e "s/^log:/transport: rdma\nlog:/" conf/local.yaml >"$T/rdma.yaml"

if [ $DEMO = 1 ]; then
	scripts/demo.sh "$T/rdma.yaml"
	exit $?
fi

step check_rdma "$B/tests/check_rdma"
version() {
	local p out
	for p in ps-server ps-worker ps-stat ps-bench ps-export; do
		out=$(bin/$p --version 2>&1)
		grep -q "^transports: tcp, rdma (verbs, rdma_cm; here: .*rxe0" <<<"$out" ||
			{ echo "$p --version in the VM: $out"; return 1; }
	done
}
step version version
step check_transport "$B/tests/check_transport"
# A big frame's memory registration failing, on the sending end (the first
# ibv_reg_mr after the case's marker) and on the receiving end (the second):
# check_transport's test_rdma_reg_mr_fault with libpsfault.so, whose log
# must show the fault made (a case that skipped would pass without it).
reg_mr_faults() {
	local n
	for n in 1 2; do
		rm -f "$T/psfault.log"
		LD_PRELOAD=$PWD/$B/tests/libpsfault.so PS_FAULT=ibv_reg_mr:$n \
			PS_FAULT_AFTER="reg_mr fault: armed" PS_FAULT_LOG=$T/psfault.log \
			PS_TEST_ONLY=test_rdma_reg_mr_fault "$B/tests/check_transport" || return 1
		grep -q "ibv_reg_mr call $n " "$T/psfault.log" ||
			{ echo "reg_mr_faults: no ibv_reg_mr fault made (PS_FAULT=ibv_reg_mr:$n)"; return 1; }
	done
}
step reg_mr_faults reg_mr_faults
PS_TEST_ONLY=test_sync_exact_sum,test_async_exact_sum,test_worker_killed_in_barrier,test_sync_worker_leaves_and_rejoins \
	step it_cluster "$B/tests/it_cluster"
PS_TEST_ONLY=test_shard_killed_and_restarted step it_checkpoint "$B/tests/it_checkpoint"

train() {
	sed "s/preset: cnn/preset: mlp/" "$T/rdma.yaml" >"$T/mlp.yaml"
	# bounded (a run takes about 30 s here): a run that hangs ends with the
	# shards' and workers' logs shown, not as the VM's own time-out with none
	if ! timeout -k 10 240 scripts/ps-local.sh "$T/mlp.yaml" --logs "$T/train" -- \
		--metrics-dir "$T/metrics"; then
		local f
		for f in "$T"/train/*; do
			echo "---- $f (last 40 lines)"
			tail -n 40 "$f"
		done
		return 1
	fi
	local acc
	acc=$(grep -ho '"test_accuracy":[0-9.]*' "$T/metrics/worker-0.jsonl" | tail -1 |
		sed 's/.*://')
	echo "training over rdma: $IMAGES images, test accuracy ${acc:-none}"
	awk -v a="${acc:-0}" 'BEGIN{exit !(a > 0.3)}' # chance is 0.1
}
step training train

# Figures: the same sizes through perftest and through ps-bench, in this VM.
figures() {
	local port=18600 out=$T/figures
	perf() { # perftest server and client, the client's result line
		timeout 120 "$@" -d rxe0 -x 1 -p $port >/dev/null 2>&1 &
		sleep 1
		timeout 120 "$@" -d rxe0 -x 1 -p $port "$ADDR" 2>/dev/null |
			grep -A1 -E '^ *#bytes' | tail -1
		wait
		port=$((port + 1))
	}
	local lat bw
	lat=$(perf ib_send_lat -s 4096 -n 2000)
	bw=$(perf ib_write_bw -s 1048576 -n 200)
	printf 'security:\n  auth: false\ntransport: rdma\n' >"$T/bench.yaml"
	sed "s/127.0.0.1/$ADDR/" conf/bench.yaml >>"$T/bench.yaml"
	bin/ps-bench -c "$T/bench.yaml" -L -s 4K -t 3 -j --no-baseline >"$out.lat" 2>/dev/null &&
		bin/ps-bench -c "$T/bench.yaml" -L -o push -s 1M -t 3 -j --no-baseline \
			>"$out.bw" 2>/dev/null || return 1
	python3 - "$lat" "$bw" "$out.lat" "$out.bw" <<'EOF'
import json, sys
lat, bw = sys.argv[1].split(), sys.argv[2].split()
load = lambda f: json.loads(open(f).read().replace('nan', 'null'))  # no baseline: nan
pl, pb = load(sys.argv[3]), load(sys.argv[4])
# ib_send_lat: #bytes #iterations t_min t_max t_typical t_avg ...; one way
ib_lat = float(lat[4])
# ib_write_bw: #bytes #iterations BW_peak BW_average[MB/s] MsgRate
ib_bw = float(bw[3]) * 1e6 / 1e9
print(f"ib_send_lat 4 KiB (one way)   {ib_lat:8.1f} us typical")
print(f"ps-bench pushpull 4 KiB p50   {pl['p50_us']:8.1f} us   ratio to 2 x ib_send_lat: {pl['p50_us'] / (2 * ib_lat):.2f}")
print(f"ib_write_bw 1 MiB             {ib_bw:8.3f} GB/s")
print(f"ps-bench push 1 MiB           {pb['gb_per_s']:8.3f} GB/s ratio to ib_write_bw: {pb['gb_per_s'] / ib_bw:.2f}")
print("(soft-RoCE under qemu without KVM: proof that the paths run, not speed)")
EOF
}
[ $FIGURES = 1 ] && step figures figures

echo
echo "==== rdma-suite summary"
cat "$SUMMARY"
rm -rf "$T"
exit $fail
