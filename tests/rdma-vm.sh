#!/usr/bin/env bash
# rdma-vm.sh - `make test-rdma`: boot Debian's own kernel in qemu (software emulation, no KVM)
# with soft-RoCE (rdma_rxe on a dummy netdev), check the verbs stack with a
# perftest smoke pair, then run a command in the guest and exit with its
# status.  The guest sees the host's root read-only over 9p (tmpfs overlay),
# so host-built binaries and the host's rdma-core run there unchanged.
#
#   rdma-vm.sh [options] [-- command [args...]]
#
#   --cache DIR      cache for the virtme-ng venv and the unpacked kernel
#                    (default: $RDMA_VM_CACHE or build/rdma-vm of the project)
#   --logs DIR       where the guest writes its logs (default: CACHE/logs);
#                    emptied at start
#   --memory SIZE    guest memory (default 1G; 256M works, but then the
#                    page cache can't hold big libraries such as CUDA's)
#   --cpus N         guest vCPUs (default 2)
#   --timeout S      kill the VM after S seconds (default 600)
#   --no-perftest    skip the perftest smoke pair
#   -v, --verbose    print the full perftest output even when it passed
#   --install-deps   apt-get install the host packages first (root only)
#   --fetch-only     install and fetch what the VM needs (the packages with
#                    --install-deps, virtme-ng, the kernel) into the cache,
#                    then exit 0 without booting (make test runs it in the
#                    background beside the tests: the run after it waits for
#                    the cache's lock and finds everything there)
#   -e NAME=VALUE    export NAME in the guest before the command (repeatable)
#
# In the guest the command also sees RDMA_VM=1, RDMA_VM_DEV=rxe0,
# RDMA_VM_NETDEV=dummy0, RDMA_VM_ADDR=10.0.2.15, RDMA_VM_GID_INDEX=1.
# rdma_cm must connect to 10.0.2.15 (not 127.0.0.1); raw verbs need GID 1.
#
# Exit status: the command's; 1 when the VM, the rxe set-up or the smoke
# failed; 77 (skip) when qemu, virtme-ng, the kernel package or the host's
# rdma tools cannot be had, with the reason printed.
set -euo pipefail

VIRTME_NG_VERSION=1.42
HOST_PKGS="qemu-system-x86 busybox-static rdma-core ibverbs-utils rdmacm-utils perftest kmod iproute2 python3-venv"
# modules the guest doesn't need; udev would load them at boot (~5 s under TCG)
BLACKLIST=kvm,kvm_amd,kvm_intel,ccp,irqbypass,ahci,libahci,libata,sr_mod,cdrom,sg,scsi_mod,psmouse,evdev,serio_raw,pcspkr,i2c_i801,i2c_smbus,lpc_ich,iTCO_wdt,iTCO_vendor_support,intel_pmc_bxt,powernow_k8,acpi_cpufreq,aesni_intel,ghash_clmulni_intel,sha512_ssse3,sha256_ssse3,sha1_ssse3,button,joydev,floppy,snd_pcsp,drm,bochs
# module trees never needed here, dropped from the unpacked kernel (-230 MB)
PRUNE="sound drivers/gpu drivers/media drivers/net/wireless drivers/net/ethernet drivers/staging drivers/iio drivers/usb drivers/comedi drivers/bluetooth drivers/hwmon drivers/mtd drivers/mmc drivers/isdn net/bluetooth net/wireless net/mac80211"
ADDR=10.0.2.15

CACHE=${RDMA_VM_CACHE:-$(cd "$(dirname "$0")/.." && pwd)/build/rdma-vm}
LOGS=
MEM=1G
CPUS=2
TIMEOUT=600
PERFTEST=1
INSTALL=0
FETCH_ONLY=0
VERBOSE=0
GUEST_ENV=()
CMD=()

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d;s/^# \{0,1\}//'; exit "${1:-0}"; }
skip() { echo "rdma-vm: SKIP: $*" >&2; exit 77; }
die() { echo "rdma-vm: ERROR: $*" >&2; exit 1; }
now() { echo "$EPOCHREALTIME"; }
since() { awk -v a="$1" -v b="${2:-$EPOCHREALTIME}" 'BEGIN{printf "%.1f", b-a}'; }

while [ $# -gt 0 ]; do
	case $1 in
	--cache) CACHE=$2; shift 2 ;;
	--logs) LOGS=$2; shift 2 ;;
	--memory|-m) MEM=$2; shift 2 ;;
	--cpus) CPUS=$2; shift 2 ;;
	--timeout) TIMEOUT=$2; shift 2 ;;
	--no-perftest) PERFTEST=0; shift ;;
	-v|--verbose) VERBOSE=1; shift ;;
	--install-deps) INSTALL=1; shift ;;
	--fetch-only) FETCH_ONLY=1; shift ;;
	-e) [[ $2 == [A-Za-z_]*=* ]] || die "-e wants NAME=VALUE, got '$2'"; GUEST_ENV+=("$2"); shift 2 ;;
	-h|--help) usage 0 ;;
	--) shift; CMD=("$@"); break ;;
	*) echo "rdma-vm: unknown argument '$1'" >&2; usage 2 ;;
	esac
done
mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)
LOGS=${LOGS:-$CACHE/logs}
T0=$(now)

# one run at a time per cache (two TCG VMs on 2 cores only slow each other)
exec 9>"$CACHE/.lock"
flock -n 9 || { echo "rdma-vm: waiting for another run on $CACHE"; flock 9; }

# ---------------------------------------------------------------- fetch ---
[ "$(uname -m)" = x86_64 ] || skip "needs an x86_64 host (got $(uname -m))"
if [ "$INSTALL" = 1 ]; then
	[ "$(id -u)" = 0 ] || skip "--install-deps needs root"
	echo "rdma-vm: installing host packages: $HOST_PKGS"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq || skip "apt-get update failed"
	# shellcheck disable=SC2086
	apt-get install -y -qq --no-install-recommends $HOST_PKGS >/dev/null ||
		skip "apt-get install of $HOST_PKGS failed"
fi
have() { # an executable file, not just a name bash's command -v would accept
	local p
	for p in $(type -ap "$1") "/usr/sbin/$1" "/sbin/$1"; do
		[ -f "$p" ] && [ -x "$p" ] && return 0
	done
	return 1
}
need() { # need BINARY PACKAGE [why]
	have "$1" || skip "$1 not found: install $2${3:+ ($3)} (or pass --install-deps)"
}
need qemu-system-x86_64 qemu-system-x86
need busybox busybox-static "virtme-ng builds its initramfs with it"
need depmod kmod
need ip iproute2
need rdma iproute2
need ibv_devices ibverbs-utils
need python3 python3
qemu-system-x86_64 --version >/dev/null 2>&1 || skip "qemu-system-x86_64 does not run"
[ -e /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so ] ||
	ls /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so >/dev/null 2>&1 ||
	skip "rdma-core's rxe provider (librxe-rdmav*.so) not found: install rdma-core"
if [ "$PERFTEST" = 1 ] && ! { have ib_send_lat && have ib_write_bw; }; then
	echo "rdma-vm: perftest not installed: smoke pair skipped (install perftest)"
	PERFTEST=0
fi

# virtme-ng, pinned, in its own venv
VENV=$CACHE/venv
if [ ! -e "$VENV/.virtme-ng-$VIRTME_NG_VERSION" ]; then
	echo "rdma-vm: installing virtme-ng==$VIRTME_NG_VERSION into $VENV"
	rm -rf "$VENV"
	python3 -m venv "$VENV" >/dev/null 2>&1 ||
		skip "python3 -m venv failed: install python3-venv"
	"$VENV/bin/pip" install -q --disable-pip-version-check "virtme-ng==$VIRTME_NG_VERSION" ||
		{ rm -rf "$VENV"; skip "pip install virtme-ng==$VIRTME_NG_VERSION failed (no PyPI?)"; }
	touch "$VENV/.virtme-ng-$VIRTME_NG_VERSION"
fi
# vng runs virtme-run through sh: the venv's bin must be on PATH
export PATH=$VENV/bin:$PATH

# Debian's kernel: whatever linux-image-amd64 depends on now, else the
# newest one already unpacked here
KPKG=${RDMA_VM_KERNEL_PKG:-$(apt-cache depends linux-image-amd64 2>/dev/null |
	awk '/Depends: linux-image-[0-9]/{print $2; exit}' || true)}
if [ -z "$KPKG" ]; then
	KPKG=$(ls -t "$CACHE/kernel" 2>/dev/null | head -1 || true)
	[ -n "$KPKG" ] && [ -e "$CACHE/kernel/$KPKG/.complete" ] ||
		skip "apt-cache knows no linux-image-amd64 (run apt-get update) and no kernel is cached in $CACHE/kernel"
	echo "rdma-vm: apt-cache can't tell the current kernel; using the cached $KPKG"
fi
KVER=${KPKG#linux-image-}
KROOT=$CACHE/kernel/$KPKG
if [ ! -e "$KROOT/.complete" ]; then
	echo "rdma-vm: fetching $KPKG"
	rm -rf "$CACHE/dl" "$KROOT.tmp"
	mkdir -p "$CACHE/dl" "$CACHE/kernel"
	(cd "$CACHE/dl" && apt-get download -q -o APT::Sandbox::User=root "$KPKG") ||
		skip "apt-get download $KPKG failed"
	deb=$(ls "$CACHE"/dl/*.deb)
	dpkg -x "$deb" "$KROOT.tmp"
	for d in $PRUNE; do rm -rf "$KROOT.tmp/lib/modules/$KVER/kernel/$d"; done
	depmod -b "$KROOT.tmp" "$KVER"
	dpkg-deb -f "$deb" Version > "$KROOT.tmp/.complete"
	rm -rf "$CACHE/dl"
	# keep one kernel: drop the ones apt no longer points at
	find "$CACHE/kernel" -mindepth 1 -maxdepth 1 ! -name "$KPKG.tmp" -exec rm -rf {} +
	mv "$KROOT.tmp" "$KROOT"
fi
VMLINUZ=$KROOT/boot/vmlinuz-$KVER
[ -f "$VMLINUZ" ] || skip "$KPKG has no boot/vmlinuz-$KVER"
[ -n "$(find "$KROOT/lib/modules/$KVER" -name 'rdma_rxe.ko*' -print -quit)" ] ||
	skip "$KPKG has no rdma_rxe module (soft-RoCE)"
T_FETCH=$(now)
echo "rdma-vm: kernel $KPKG ($(cat "$KROOT/.complete")), virtme-ng $VIRTME_NG_VERSION, qemu $(qemu-system-x86_64 --version | awk 'NR==1{print $4}')"
if [ "$FETCH_ONLY" = 1 ]; then
	echo "rdma-vm: fetched in $(since "$T0" "$T_FETCH") s (--fetch-only: no boot)"
	exit 0
fi

# ---------------------------------------------------------- guest script ---
if [ -d "$LOGS" ] && [ -n "$(ls -A "$LOGS")" ] && [ ! -e "$LOGS/guest.sh" ]; then
	die "--logs $LOGS is not empty and holds no earlier run: not emptying it"
fi
rm -rf "$LOGS"
mkdir -p "$LOGS"
LOGS=$(cd "$LOGS" && pwd)
GUEST=$LOGS/guest.sh
{
	echo '#!/bin/bash'
	echo "# generated by rdma-vm.sh; runs inside the VM"
	printf 'LOGS=%q\nADDR=%q\nPERFTEST=%q\n' "$LOGS" "$ADDR" "$PERFTEST"
	printf 'CMD=('; [ ${#CMD[@]} = 0 ] || printf '%q ' "${CMD[@]}"; echo ')'
	printf 'GUEST_ENV=('; [ ${#GUEST_ENV[@]} = 0 ] || printf '%q ' "${GUEST_ENV[@]}"; echo ')'
	cat <<'GUEST_EOF'
set -u
exec 3>&1                      # the host reads marks from here, live
mark() { echo "@@rdma-vm $* (guest uptime $(cut -d' ' -f1 /proc/uptime)s)" >&3; }
finish() { dmesg > "$LOGS/dmesg.log" 2>&1; exit "$1"; }

mark ready-to-setup
exec >"$LOGS/setup.log" 2>&1
set -x
ok=1
modprobe rdma_rxe && modprobe rdma_ucm && modprobe dummy &&
	ip link set lo up &&
	ip link add dummy0 type dummy &&
	ip addr add "$ADDR/24" dev dummy0 &&
	ip link set dummy0 up &&
	rdma link add rxe0 type rxe netdev dummy0 || ok=0
# the IPv4-mapped GID (index 1) shows up a moment after the link
for _ in $(seq 50); do
	g=$(cat /sys/class/infiniband/rxe0/ports/1/gids/1 2>/dev/null) &&
		[ "$g" != 0000:0000:0000:0000:0000:0000:0000:0000 ] && break
	sleep 0.1
done
ibv_devices || ok=0
rdma link show || ok=0
ibv_devinfo -d rxe0 || ok=0
cat /sys/class/infiniband/rxe0/ports/1/gids/1 || ok=0
set +x
if [ "$ok" != 1 ]; then
	mark setup-failed
	finish 1
fi
mark ready "rxe0 up on dummy0 $ADDR"

# perftest smoke pair: server in the background, client to $ADDR
smoke_ok=1
if [ "$PERFTEST" = 1 ]; then
	exec >"$LOGS/perftest.log" 2>&1
	port=18515
	listening() { # TCP for plain perftest, an rdma_cm listener for -R
		ss -Htln "sport = :$1" | grep -q . ||
			rdma res show cm_id 2>/dev/null | grep -q "LISTEN.*:$1 "
	}
	for t in "ib_send_lat -n 1000" "ib_write_bw -n 1000" \
		 "ib_send_lat -n 1000 -R" "ib_write_bw -n 1000 -R"; do
		port=$((port + 1))
		echo "=== $t -d rxe0 -x 1 -p $port"
		start=$(cut -d' ' -f1 /proc/uptime)
		# shellcheck disable=SC2086
		timeout 90 $t -d rxe0 -x 1 -p $port >"$LOGS/perftest-server.log" 2>&1 &
		srv=$!
		for _ in $(seq 100); do
			listening $port || ! kill -0 $srv 2>/dev/null && break
			sleep 0.1
		done
		# shellcheck disable=SC2086
		timeout 90 $t -d rxe0 -x 1 -p $port "$ADDR"
		crc=$?
		wait $srv
		src=$?
		echo "--- server:"; cat "$LOGS/perftest-server.log"
		res=PASS
		[ $crc = 0 ] && [ $src = 0 ] || { res="FAIL (client $crc, server $src)"; smoke_ok=0; }
		line=$(grep -A1 -E '^ *#bytes' "$LOGS/perftest-server.log" | tail -1 | tr -s ' \t' ' ')
		end=$(cut -d' ' -f1 /proc/uptime)
		awk -v t="$t" -v r="$res" -v a="$start" -v b="$end" -v l="$line" \
			'BEGIN{printf "%-24s %s %5.1fs |%s\n", t, r, b-a, l}' >>"$LOGS/perftest-summary.log"
	done
	rm -f "$LOGS/perftest-server.log"
	if [ $smoke_ok = 1 ]; then mark perftest-done PASS; else mark perftest-done FAIL; fi
fi

# the command
rc=0
if [ ${#CMD[@]} -gt 0 ]; then
	export RDMA_VM=1 RDMA_VM_DEV=rxe0 RDMA_VM_NETDEV=dummy0 RDMA_VM_ADDR="$ADDR" RDMA_VM_GID_INDEX=1
	for e in ${GUEST_ENV[@]+"${GUEST_ENV[@]}"}; do export "${e?}"; done
	mark command-start "${CMD[*]}"
	exec >"$LOGS/command.log" 2>&1
	"${CMD[@]}"
	rc=$?
	mark command-done "rc=$rc"
fi
[ $smoke_ok = 1 ] || { [ $rc != 0 ] || rc=1; }
finish $rc
GUEST_EOF
} >"$GUEST"
chmod +x "$GUEST"

# ----------------------------------------------------------------- boot ---
echo "rdma-vm: booting (qemu TCG, ${CPUS} vCPU, $MEM); logs in $LOGS"
VNG=(vng --disable-kvm --force-9p -m "$MEM" --cpus "$CPUS"
	--append "modprobe.blacklist=$BLACKLIST module_blacklist=$BLACKLIST"
	--run "$VMLINUZ" --rwdir "$LOGS" --exec "$(printf '%q' "$GUEST")")
T_BOOT=$(now)
set +e
# vng opens stdout and stderr separately: merge and pipe them, and stamp each
# line with the host's clock (the guest's marks give the phase times)
timeout -k 10 "$TIMEOUT" "${VNG[@]}" 2>&1 </dev/null |
	while IFS= read -r line; do
		printf '%s %s\n' "$EPOCHREALTIME" "$line" >>"$LOGS/console.log"
		case $line in
		'@@rdma-vm '*) echo "rdma-vm: [+$(since "$T0")s] ${line#@@rdma-vm }" ;;
		*) echo "  vm| $line" ;;
		esac
	done
VRC=${PIPESTATUS[0]}
set -e
T_END=$(now)

# --------------------------------------------------------------- report ---
at() { awk -v m="$1" '$2 == "@@rdma-vm" && $3 == m {print $1; exit}' "$LOGS/console.log" 2>/dev/null || true; }
T_READY=$(at ready)
T_PERF=$(at perftest-done)
T_CMD0=$(at command-start)
T_CMD1=$(at command-done)
for f in setup.log perftest-summary.log perftest.log command.log; do
	[ -s "$LOGS/$f" ] || continue
	if [ $f = perftest.log ] && ! grep -q FAIL "$LOGS/perftest-summary.log" 2>/dev/null &&
		[ "$VERBOSE" = 0 ]; then
		echo "================ guest $f: in $LOGS/$f (printed on failure or with -v)"
		continue
	fi
	echo "================ guest $f"
	cat "$LOGS/$f"
done
echo "================ times (host clock)"
printf '  %-22s %6ss\n' "fetch (venv, kernel)" "$(since "$T0" "$T_FETCH")"
[ -n "$T_READY" ] && printf '  %-22s %6ss\n' "boot to rxe0 ready" "$(since "$T_BOOT" "$T_READY")"
[ -n "$T_READY" ] && [ -n "$T_PERF" ] && printf '  %-22s %6ss\n' "perftest" "$(since "$T_READY" "$T_PERF")"
[ -n "$T_CMD0" ] && [ -n "$T_CMD1" ] && printf '  %-22s %6ss\n' "command" "$(since "$T_CMD0" "$T_CMD1")"
last=${T_CMD1:-${T_PERF:-${T_READY:-$T_BOOT}}}
printf '  %-22s %6ss\n' "shutdown (after last)" "$(since "$last" "$T_END")"
printf '  %-22s %6ss\n' "total" "$(since "$T0" "$T_END")"

if [ "$VRC" = 124 ] || [ "$VRC" = 137 ]; then
	echo "rdma-vm: FAIL: the VM ran past --timeout $TIMEOUT s (killed)"; exit 1
fi
if [ -z "$T_READY" ]; then
	echo "rdma-vm: FAIL: the guest never brought rxe0 up (vng status $VRC); see $LOGS/setup.log, $LOGS/dmesg.log, $LOGS/console.log"
	exit 1
fi
if [ "$PERFTEST" = 1 ] && ! grep -q '@@rdma-vm perftest-done PASS' "$LOGS/console.log"; then
	echo "rdma-vm: FAIL: perftest smoke pair failed; see $LOGS/perftest.log"
	[ "$VRC" != 0 ] && exit "$VRC"
	exit 1
fi
if [ ${#CMD[@]} -gt 0 ] && [ -z "$T_CMD1" ]; then
	echo "rdma-vm: FAIL: the command did not finish in the guest (vng status $VRC)"
	[ "$VRC" != 0 ] && exit "$VRC"
	exit 1
fi
echo "rdma-vm: exit status $VRC"
exit "$VRC"
