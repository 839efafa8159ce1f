# Makefile - builds the parameter server, its client library and tests.
#
#   make                 bin/ps-server, bin/ps-bench, bin/ps-stat, bin/ps-worker, bin/ps-export,
#                        lib/libps.a,
#                        lib/libps.so (soname libps.so.1, only the public API exported),
#                        and the CUDA plug-in lib/ps-compute-cuda.so where nvcc and
#                        cuDNN are found (kernels/cuda.mk)
#   make test            unit tests (Check), integration tests on loopback, and
#                        the rdma tests in a soft-RoCE VM (make test-rdma)
#   make bench           ps-bench figures as ratios to baselines of the same run
#   make demo            a local 2-shard cluster and a short benchmark
#   make install PREFIX=/usr/local   (programs, libps.a/.so, public headers, ps.pc)
#   make test-python     the Python package (python/) built in a venv and its pytest suite
#   make SANITIZE=address,undefined test
#   make valgrind        the integration tests with every shard and the test
#                        itself under valgrind memcheck (about 6 minutes)
#   make test-rdma       the RDMA tests inside a qemu VM of Debian's kernel with
#                        soft-RoCE (tests/rdma-vm.sh running tests/rdma-suite.sh;
#                        about 3 minutes without KVM)
#   make demo-rdma       the demo's cnn trained over transport: rdma in that VM
#                        (on 256 images: emulation computes a few a second)
#   make mutate          mutation testing of server/, the client library and
#                        the transport, wire, codec, auth and encryption code
#                        against the suites that exercise them (scripts/mutate.sh
#                        --help; most of a day; docs/testing.md has the score)
#   make gpu-check       on a lent GPU machine: unpack gpu-bundle/ (scripts/gpu-bundle.sh),
#                        build, the CUDA tests, timings against PyTorch; docs/gpu.md
#   make clean

PREFIX   ?= /usr/local
CC       ?= gcc
SANITIZE ?=
PKGS     := libuv libprotobuf-c yaml-0.1 liblz4 check zlib libmicrohttpd libsodium libcrypto libibverbs librdmacm

.DEFAULT_GOAL := all

VARIANT  := $(if $(SANITIZE),san,rel)
OBJ      := build/$(VARIANT)
GEN      := build/gen

PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs libuv libprotobuf-c yaml-0.1 liblz4 libsodium libcrypto libibverbs librdmacm 2>/dev/null)
CHECK_LIBS := $(shell pkg-config --libs check 2>/dev/null)
SRV_LIBS   := $(shell pkg-config --libs libmicrohttpd zlib 2>/dev/null)

CFLAGS   ?= -O2 -g
# -fPIC: the library's objects go into lib/libps.so as well as lib/libps.a.
CFLAGS   += -std=gnu11 -Wall -Wextra -pthread -fno-strict-aliasing -fPIC
CPPFLAGS += -Icommon -Iserver -Iworker -Iworker/client -I$(GEN) $(PKG_CFLAGS)
LDLIBS   += $(PKG_LIBS) -lm -pthread
ifneq ($(SANITIZE),)
CFLAGS   += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=all
LDFLAGS  += -fsanitize=$(SANITIZE)
endif

# CUDA: the plug-in lib/ps-compute-cuda.so, built where nvcc and cuDNN are
# found (kernels/cuda.mk says why not, in one line, where they are not) and
# opened by ps-worker at run time: no program links the CUDA libraries.
NVCC      ?= $(shell command -v nvcc 2>/dev/null)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_CU   := $(wildcard kernels/*.cu)
ifneq ($(and $(NVCC),$(CUDA_CU)),)
include kernels/cuda.mk
else
$(info cuda: nvcc not found (put it on PATH or set NVCC): building without the CUDA plug-in)
CUDA_PLUGIN :=
endif

PROTO_C   := $(GEN)/ps.pb-c.c
# libps.a: everything a client program needs (no BLAS, no CUDA).
LIB_SRCS  := common/ps_err.c common/ps_log.c common/config.c common/config_yaml.c \
             common/config_scalar.c common/config_table.c common/config_dump.c common/config_ctr.c \
             common/config_agree.c common/optim_group.c common/table_decl.c \
             common/layers.c \
             common/shardmap.c common/rows_wire.c common/wire.c common/msg.c common/transport.c \
             common/transport_tcp.c $(wildcard worker/client/*.c) \
             common/codec.c common/codec_fp16.c common/codec_q8.c common/codec_topk.c \
             common/codec_sign.c common/codec_lz4.c common/histo.c common/finite.c \
             common/frame_mac.c common/frame_aead.c common/auth.c common/rdma_proto.c common/transport_rdma.c \
             common/version.c
SERVER    := $(filter-out server/main.c,$(wildcard server/*.c))
# Training: compute backends and the worker's model and data code.
# cpu: oneDNN (kernels/compute_dnnl*.c); ref: the plain reference (compute_ref.c);
# both take the embedding bag ops of kernels/embedding_bag_cpu.c.
COMPUTE   := $(wildcard common/compute.c kernels/compute_ref.c kernels/compute_dnnl*.c kernels/embedding_bag_cpu.c)
TRAIN     := $(wildcard worker/net.c worker/pusher.c worker/dataset.c worker/epoch.c worker/model_file.c worker/ctr_data.c worker/ctr_model.c worker/ctr_train.c worker/worker_cmd.c worker/stop_signal.c)
LIB_OBJS  := $(patsubst %.c,$(OBJ)/%.o,$(LIB_SRCS)) $(OBJ)/gen/ps.pb-c.o
SRV_OBJS  := $(patsubst %.c,$(OBJ)/%.o,$(SERVER))
TRAIN_OBJS := $(patsubst %.c,$(OBJ)/%.o,$(COMPUTE) $(TRAIN))
# Click logs: Criteo's format and the synthetic generator (ps-ctrgen).
CTR_OBJS  := $(patsubst %.c,$(OBJ)/%.o,worker/criteo.c worker/ctr_gen.c)
TRAIN_LIBS := -ldnnl -lgomp -lopenblas -lz -ldl

UNIT_SRCS := $(wildcard tests/check_*.c)
UNIT_BINS := $(patsubst tests/%.c,$(OBJ)/tests/%,$(UNIT_SRCS))
IT_SRCS   := $(wildcard tests/it_*.c)
IT_BINS   := $(patsubst tests/%.c,$(OBJ)/tests/%,$(IT_SRCS))
IT_SH     := $(wildcard tests/it_*.sh)
# Tests that spend their run waiting (paced clocks, drop and failover
# timeouts, shards restarted: a few percent of a CPU, measured with
# /usr/bin/time), and the two in network namespaces of their own (no port
# of theirs can meet another test's; they share one lane, not to meet
# each other): `make test` runs them in two lanes beside the others
# (run-tests.sh --beside), each lane's tests one after another.
IT_BESIDE  := it_checkpoint_big,it_replica,it_replica_rows,it_cluster,it_stat,it_replica_cases,it_replica_decl,it_agree,it_reshard_requests,it_elastic_repl,it_replica_auth,it_reshard_cases,it_reshard_staged
IT_BESIDE2 := it_multihost.sh,it_slurm.sh,it_reshard_crash.sh,it_fault_repl,it_fault,it_fake_shard,it_rows,it_k8s_manifests.sh,it_reshard
# Parallel jobs of `make test`'s and `make demo`'s build step.
JOBS      ?= $(shell nproc 2>/dev/null || echo 2)

PROGRAMS := bin/ps-server bin/ps-bench bin/ps-stat bin/ps-ctrgen bin/ps-export $(if $(and $(wildcard worker/dataset.c),$(wildcard kernels/compute_ref.c)),bin/ps-worker)

.PHONY: all test unit integration bench demo install clean deps fuzz fuzz-build valgrind mutate print-cc print-prefix test-rdma demo-rdma
.SECONDARY:

all: $(PROGRAMS) lib/libps.a lib/libps.so lib/ps.pc $(CUDA_PLUGIN)

# Where the worker looks for the plug-in once installed (common/compute.c).
$(OBJ)/common/compute.o $(OBJ)/common/version.o: CPPFLAGS += -DPS_PLUGIN_INSTALL_DIR='"$(PREFIX)/lib/ps"'

# Installs missing Debian packages; silent when everything is present.
deps:
	@scripts/install-deps.sh

$(PROTO_C): proto/ps.proto
	@mkdir -p $(GEN)
	protoc-c --proto_path=proto --c_out=$(GEN) proto/ps.proto

$(GEN)/ps.pb-c.h: $(PROTO_C)

# Every object depends on the generated header and on the compiler flags.
$(OBJ)/.flags: FORCE
	@mkdir -p $(OBJ)
	@echo '$(CC) $(CFLAGS) $(CPPFLAGS) $(LDFLAGS)' | cmp -s - $@ || echo '$(CC) $(CFLAGS) $(CPPFLAGS) $(LDFLAGS)' > $@
.PHONY: FORCE

# bin/ and lib/ are shared by the variants: relink them when the variant changes.
build/variant: FORCE
	@mkdir -p build
	@echo '$(VARIANT)' | cmp -s - $@ || echo '$(VARIANT)' > $@

$(OBJ)/%.o: %.c $(GEN)/ps.pb-c.h $(OBJ)/.flags
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -MMD -MP -c $< -o $@

$(OBJ)/gen/ps.pb-c.o: $(PROTO_C) $(OBJ)/.flags
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

lib/libps.a: $(LIB_OBJS) build/variant
	@mkdir -p lib
	rm -f $@ && ar rcs $@ $(LIB_OBJS)

# The shared library: soname libps.so.1; worker/client/libps.map exports the
# public API of ps_client.h and ps_err.h and makes every other symbol local.
SO_MAJOR := 1
SO_FULL  := libps.so.$(SO_MAJOR).0.0
lib/$(SO_FULL): $(LIB_OBJS) worker/client/libps.map build/variant
	@mkdir -p lib
	$(CC) $(LDFLAGS) -shared -Wl,-soname,libps.so.$(SO_MAJOR) \
		-Wl,--version-script=worker/client/libps.map -Wl,--no-undefined \
		-o $@ $(LIB_OBJS) $(LDLIBS)

lib/libps.so: lib/$(SO_FULL)
	ln -sf $(SO_FULL) lib/libps.so.$(SO_MAJOR) && ln -sf $(SO_FULL) $@

# pkg-config file for PREFIX (make install puts it in lib/pkgconfig).
lib/ps.pc: worker/client/ps.pc.in Makefile
	@mkdir -p lib
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(SO_MAJOR).0|g' $< > $@

bin/ps-server: $(OBJ)/server/main.o $(SRV_OBJS) lib/libps.a
	@mkdir -p bin
	$(CC) $(LDFLAGS) -o $@ $(filter %.o %.a,$^) $(LDLIBS) $(SRV_LIBS)

bin/ps-bench: $(OBJ)/worker/ps_bench.o $(OBJ)/worker/bench_rows.o lib/libps.a
	@mkdir -p bin
	$(CC) $(LDFLAGS) -o $@ $(filter %.o %.a,$^) $(LDLIBS)

bin/ps-stat: $(OBJ)/worker/ps_stat.o $(OBJ)/worker/ps_stat_reshard.o lib/libps.a
	@mkdir -p bin
	$(CC) $(LDFLAGS) -o $@ $(filter %.o %.a,$^) $(LDLIBS)

# ps-export reads checkpoints offline: the optimizer table for the state
# sizes, nothing else of the shard.
bin/ps-export: $(OBJ)/worker/ps_export.o $(OBJ)/worker/export_read.o $(OBJ)/worker/npz.o $(OBJ)/server/optimizer.o lib/libps.a
	@mkdir -p bin
	$(CC) $(LDFLAGS) -o $@ $(filter %.o %.a,$^) $(LDLIBS) -lz

bin/ps-ctrgen: $(OBJ)/worker/ps_ctrgen.o $(CTR_OBJS) lib/libps.a
	@mkdir -p bin
	$(CC) $(LDFLAGS) -o $@ $(filter %.o %.a,$^) $(LDLIBS) -lz

bin/ps-worker: $(OBJ)/worker/ps_worker.o $(TRAIN_OBJS) $(CTR_OBJS) lib/libps.a
	@mkdir -p bin
	$(CC) $(LDFLAGS) -o $@ $(filter %.o %.a,$^) $(LDLIBS) $(TRAIN_LIBS)

$(OBJ)/tests/%: $(OBJ)/tests/%.o $(SRV_OBJS) $(TRAIN_OBJS) $(CTR_OBJS) $(LIB_OBJS)
	$(CC) $(LDFLAGS) -o $@ $(filter %.o %.a,$^) $(LDLIBS) $(SRV_LIBS) $(TRAIN_LIBS) $(CHECK_LIBS)
# ps-export's .npz writer, which no program but ps-export links
$(OBJ)/tests/check_npz: $(OBJ)/worker/npz.o

# Tests: install what is missing, build, run every unit test then every
# integration test; the run fails if any of them fails.
test: deps
	@$(MAKE) -j$(JOBS) --no-print-directory all $(UNIT_BINS) $(IT_BINS) $(OBJ)/tests/bench_optimizer \
		$(OBJ)/tests/bench_train $(OBJ)/tests/bench_codec $(OBJ)/tests/crash_worker $(FUZZ_BINS)
	@mkdir -p build/rdma-vm && \
	  { tests/rdma-vm.sh --fetch-only $(RDMA_INSTALL) >build/rdma-vm/fetch.log 2>&1 & } && \
	  scripts/run-tests.sh --beside $(IT_BESIDE) --beside $(IT_BESIDE2) $(UNIT_BINS) $(IT_BINS) $(IT_SH); \
	  rc=$$?; wait; exit $$rc
	@$(MAKE) --no-print-directory test-python
	@$(MAKE) --no-print-directory fuzz
	@$(MAKE) --no-print-directory test-rdma RDMA_TEST_ONLY=1 RDMA_FETCHED=1

# Python against C (ps-bench) in one run: python/bench/bench_py.py, the
# figures BENCHMARKS.md records (exit 1 when a target is missed).
.PHONY: bench-python
bench-python: test-python-venv
	@secret=$$(mktemp -u /tmp/ps-bench-secret.XXXXXX) && scripts/ps-keygen $$secret 2>/dev/null && \
	  PS_SECRET_FILE=$$secret build/pyvenv/bin/python python/bench/bench_py.py; \
	  rc=$$?; rm -f $$secret; exit $$rc

# The PyTorch path against DDP (gloo) and the C worker, one epoch of the
# Fashion-MNIST cnn each: python/bench/bench_torch.py (BENCHMARKS.md).
# BENCH_TORCH_ARGS="--limit 12800" for a shorter run.
.PHONY: bench-pytorch
bench-pytorch: test-python-venv
	@build/pyvenv/bin/python python/bench/bench_torch.py $(BENCH_TORCH_ARGS)

# The pause of a live re-shard (mlp and ctr, 2 -> 3 -> 2 under ps-local.sh)
# against the moved bytes over the loopback's bandwidth + 1 s:
# scripts/bench-reshard.sh (BENCHMARKS.md, "Re-sharding").
.PHONY: bench-reshard
bench-reshard: all
	@scripts/bench-reshard.sh

# The DLRM-style example (ps.torch.Embedding) against the C ctr preset and
# DDP with sparse gradients: python/bench/bench_dlrm.py (BENCHMARKS.md).
.PHONY: bench-dlrm
bench-dlrm: test-python-venv
	@build/pyvenv/bin/python python/bench/bench_dlrm.py $(BENCH_DLRM_ARGS)

.PHONY: test-python-venv
test-python-venv: deps
	@$(MAKE) --no-print-directory all
	@scripts/test-python.sh --install-only

# The Python package (python/): pip-installed into build/pyvenv (made from
# Debian's /usr/bin/python3, offline) and its pytest suite against real
# shards (scripts/test-python.sh; docs/python.md).
.PHONY: test-python
test-python: deps
	@$(MAKE) --no-print-directory all
	@scripts/test-python.sh

# RDMA over soft-RoCE in a VM (docs/rdma.md): the host packages, virtme-ng
# and Debian's kernel are fetched once into build/rdma-vm; exit 77 = skipped
# with the reason printed (no qemu, no kernel package to be had).
RDMA_BINS := $(OBJ)/tests/check_rdma $(OBJ)/tests/check_transport $(OBJ)/tests/it_cluster \
	     $(OBJ)/tests/it_checkpoint
# RDMA_TEST_ONLY=1 (what `make test` sets): the tests alone, without the
# perftest smoke pair and the figures step, which measure rather than test,
# and a training step of 1024 images (its accuracy bar is still far above
# chance; the default 2048 is for `make test-rdma`).
# RDMA_FETCHED=1 (make test, which fetched beside the tests with
# --fetch-only): the host packages are not installed again.
RDMA_INSTALL := $(if $(filter 0,$(shell id -u)),--install-deps)
test-rdma: deps
	@$(MAKE) --no-print-directory all $(RDMA_BINS)
	@tests/rdma-vm.sh $(if $(RDMA_FETCHED),,$(RDMA_INSTALL)) \
	  $(if $(RDMA_TEST_ONLY),--no-perftest) -- \
	  tests/rdma-suite.sh $(if $(RDMA_TEST_ONLY),--no-figures --images 1024) $(OBJ); \
	  rc=$$?; [ $$rc -eq 77 ] && echo "test-rdma: SKIP (reason above)" && rc=0; exit $$rc

demo-rdma: deps
	@$(MAKE) --no-print-directory all
	@tests/rdma-vm.sh --no-perftest --timeout 1500 $(if $(filter 0,$(shell id -u)),--install-deps) \
	  -- tests/rdma-suite.sh --demo --images 256; \
	  rc=$$?; [ $$rc -eq 77 ] && echo "demo-rdma: SKIP (reason above)" && rc=0; exit $$rc

# The container image (deploy/container/Containerfile), built from Debian
# packages on a debootstrap base (no registry), then run: ps-server --help and
# a two-shard, two-worker training run inside it. Minutes; not in `make test`.
# IMAGE=name:tag names it (default localhost/ps:latest).
.PHONY: image test-image
image:
	@deploy/container/build-image.sh $(if $(IMAGE),--tag $(IMAGE))

test-image: image
	@deploy/container/test-image.sh $(if $(IMAGE),--tag $(IMAGE)); \
	  rc=$$?; [ $$rc -eq 77 ] && echo "test-image: SKIP (reason above)" && rc=0; exit $$rc

bench: deps
	@$(MAKE) --no-print-directory all $(OBJ)/tests/bench_optimizer $(OBJ)/tests/bench_train \
		$(OBJ)/tests/bench_codec
	@scripts/bench.sh $(OBJ)/tests/bench_optimizer $(OBJ)/tests/bench_train \
		$(OBJ)/tests/bench_codec

demo: deps
	@$(MAKE) -j$(JOBS) --no-print-directory all
	@scripts/demo.sh

# The first minutes on a lent GPU machine (docs/gpu.md): no deps, it has no
# network; the script unpacks gpu-bundle/ and builds with its own make calls.
.PHONY: gpu-check
gpu-check:
	@scripts/gpu-check.sh

# The launchers run from PREFIX/bin as from scripts/ (programs beside them,
# their shared shell helpers in PREFIX/lib/ps).
LAUNCHERS := scripts/ps-keygen scripts/ps-local.sh scripts/ps-cluster.sh scripts/ps.sbatch \
	     scripts/ps-plot

# The systemd units go where systemd looks for local ones, with their
# paths (programs, Documentation=) under PREFIX; the docs they point at go
# to share/doc/ps.
install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include/ps \
		$(DESTDIR)$(PREFIX)/share/doc/ps $(DESTDIR)$(PREFIX)/lib/systemd/system
	install -m 755 $(PROGRAMS) $(LAUNCHERS) $(DESTDIR)$(PREFIX)/bin
	install -d $(DESTDIR)$(PREFIX)/lib/ps
	install -m 644 scripts/ps-lib.sh $(DESTDIR)$(PREFIX)/lib/ps
	install -m 644 lib/libps.a $(DESTDIR)$(PREFIX)/lib
	install -m 755 lib/$(SO_FULL) $(DESTDIR)$(PREFIX)/lib
	ln -sf $(SO_FULL) $(DESTDIR)$(PREFIX)/lib/libps.so.$(SO_MAJOR)
	ln -sf $(SO_FULL) $(DESTDIR)$(PREFIX)/lib/libps.so
	install -d $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 644 lib/ps.pc $(DESTDIR)$(PREFIX)/lib/pkgconfig
	$(if $(CUDA_PLUGIN),install -m 755 $(CUDA_PLUGIN) $(DESTDIR)$(PREFIX)/lib/ps)
	install -m 644 worker/client/ps_client.h common/ps_err.h $(DESTDIR)$(PREFIX)/include/ps
	install -m 644 README.md docs/*.md conf/example-full.yaml $(DESTDIR)$(PREFIX)/share/doc/ps
	for u in scripts/systemd/*.service; do \
		sed 's|/usr/local/|$(PREFIX)/|g' $$u > $(DESTDIR)$(PREFIX)/lib/systemd/system/$$(basename $$u) && \
		chmod 644 $(DESTDIR)$(PREFIX)/lib/systemd/system/$$(basename $$u) || exit 1; \
	done


# Fuzzing (libFuzzer, clang): tests/fuzz/fuzz_*.c against the library built
# with ASan/UBSan into build/fuzz. `make fuzz` runs each target for
# FUZZ_SECONDS (default 12; `make test` runs them too, about a minute) with
# conf/ as the config seeds; crashes land in build/fuzz/crashes.
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 12
FUZZ_OBJ     := build/fuzz
FUZZ_FLAGS   := -g -O1 -fsanitize=address,undefined -fno-sanitize-recover=all
FUZZ_SRCS    := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BINS    := $(patsubst tests/fuzz/%.c,$(FUZZ_OBJ)/%,$(FUZZ_SRCS))
FUZZ_LIBOBJS := $(patsubst %.c,$(FUZZ_OBJ)/%.o,$(LIB_SRCS) server/handshake.c) $(FUZZ_OBJ)/gen/ps.pb-c.o

$(FUZZ_OBJ)/%.o: %.c $(GEN)/ps.pb-c.h
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(CPPFLAGS) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -std=gnu11 -pthread -MMD -MP -c $< -o $@

$(FUZZ_OBJ)/gen/ps.pb-c.o: $(PROTO_C)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(CPPFLAGS) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_OBJ)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_LIBOBJS)
	$(FUZZ_CC) $(CPPFLAGS) $(FUZZ_FLAGS) -fsanitize=fuzzer -std=gnu11 -o $@ $^ $(LDLIBS)

fuzz-build: deps $(FUZZ_BINS)

# Shards run under memcheck through tests/test_util.h (PS_TEST_VALGRIND), the
# test binaries through run-tests.sh (PS_TEST_WRAP); an error or a definite
# leak makes a process exit 99, which fails its test.
VALGRIND := valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite
valgrind: deps
	@$(MAKE) --no-print-directory all $(IT_BINS)
	@PS_TEST_VALGRIND=1 PS_TEST_WRAP="$(VALGRIND)" scripts/run-tests.sh $(IT_BINS)

# Mutation testing (universalmutator from PyPI, in a venv under build/mutate).
# The compiler line scripts use to syntax-check one file (scripts/mutate.sh).
print-cc:
	@echo '$(CC) $(CPPFLAGS) $(CFLAGS)'
# The install prefix (tests/it_docs.sh: where --version looks for the plug-in).
print-prefix:
	@echo '$(PREFIX)'

mutate: deps
	@scripts/mutate.sh

fuzz: fuzz-build
	@scripts/fuzz.sh $(FUZZ_SECONDS) $(FUZZ_BINS)

clean:
	rm -rf build bin lib

-include $(shell find build/$(VARIANT) $(FUZZ_OBJ) -name '*.d' 2>/dev/null)

# libpsfault.so (tests/fault_inject.c): LD_PRELOADed by it_fault into the
# shards it starts, to fail chosen calls (docs/testing.md, "Fault
# injection"). Built without the sanitizer, whose runtime must come first.
$(OBJ)/tests/libpsfault.so: tests/fault_inject.c
	@mkdir -p $(dir $@)
	$(CC) -std=gnu11 -O2 -g -Wall -Wextra -fPIC -shared -o $@ $< -ldl -pthread

$(OBJ)/tests/it_fault: $(OBJ)/tests/libpsfault.so
$(OBJ)/tests/it_fault_repl: $(OBJ)/tests/libpsfault.so
$(OBJ)/tests/it_stat: $(OBJ)/tests/libpsfault.so
$(OBJ)/tests/it_elastic: $(OBJ)/tests/libpsfault.so
