/* config_table.c - the option tables: every key of the configuration file
 * with its type, bounds, default and help text (cfg_opts), and the tables of
 * list entries (model.tensors, model.layers, compression.tensors). The
 * loader (config.c), the dump and --help (config_dump.c) all read these.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "config.h"
#include "config_int.h"
#include "frame_aead.h"
#include "ps_err.h"

const char *const cfg_transport_names[] = { "tcp", "rdma", NULL };
const char *const cfg_consistency_names[] = { "sync", "async", NULL };
const char *const cfg_optim_names[] = { "sgd", "momentum", "adam", "adagrad", "adamw", NULL };
const char *const cfg_init_names[] = { "zeros", "const", "uniform", "normal", "arange", NULL };
const char *const cfg_level_names[] = { "debug", "info", "warn", "error", "off", NULL };
const char *const cfg_preset_names[] = { "none", "mlp", "cnn", "ctr", NULL };
const char *const cfg_bag_names[] = { "sum", "mean", NULL };
const char *const cfg_device_names[] = { "auto", "cpu", "cuda", NULL };
/* in enum ps_tf32 order (compute.h) */
const char *const cfg_tf32_names[] = { "conv", "off", "all", NULL };
const char *const cfg_pull_when_names[] = { "layer", "step", NULL };
/* in enum ps_layer_kind order */
const char *const cfg_layer_names[] = { "dense", "conv2d", "maxpool", "relu", "flatten", NULL };
/* in enum ps_codec_kind order; pull replies (weights) take only the first two */
const char *const cfg_codec_names[] = { "none", "fp16", "q8", "topk", "sign", NULL };
const char *const cfg_pull_names[] = { "none", "fp16", NULL };
/* in enum ps_lz4_mode order */
const char *const cfg_lz4_names[] = { "off", "on", "auto", NULL };
const char *const cfg_forward_names[] = { "aggregated", "every_push", NULL };
/* in enum ps_row_optim order */
const char *const cfg_row_optim_names[] = { "sgd", "adagrad", "rowwise_adagrad", "adam", "ftrl",
					    NULL };
_Static_assert(PS_CODEC_NONE == 0 && PS_CODEC_FP16 == 1 && PS_CODEC_Q8 == 2 &&
	       PS_CODEC_TOPK == 3 && PS_CODEC_SIGN == 4 && PS_CODEC_COUNT == 5, "cfg_codec_names");
_Static_assert(PS_LZ4_OFF == 0 && PS_LZ4_ON == 1 && PS_LZ4_AUTO == 2, "cfg_lz4_names");

#define C struct ps_config
const struct opt cfg_opts[] = {
	O("cluster.servers", T_SERVERS, F_REQUIRED, 1, PS_MAX_SHARDS, NULL, NULL, C, shards,
	  "listen address of each shard; the position in the list is the shard id"),
	O("cluster.workers", T_INT, F_REQUIRED, 1, 4096, NULL, NULL, C, nworkers,
	  "number of worker ranks (0..workers-1): the most workers the cluster may ever have "
	  "at once (every per-worker table of a shard and its checkpoint is sized by it)"),
	O("cluster.initial_workers", T_INT, 0, 0, 4096, "0", NULL, C, initial_workers,
	  "elastic membership: ranks below it are members from clock 0, the others join a "
	  "running cluster (ps-worker with their rank; docs/reliability.md); 0: every rank "
	  "(cluster.workers), as with a fixed worker count"),
	O("cluster.replicas", T_INT, 0, 0, 1, "0", NULL, C, replicas,
	  "1: every shard has a backup process (at cluster.backups) holding the same state; a "
	  "push is acknowledged once the backup has it, and the backup takes over when the "
	  "primary dies (docs/reliability.md); 0: no backups"),
	O("cluster.backups", T_SERVERS, 0, 0, PS_MAX_SHARDS, NULL, NULL, C, backups,
	  "cluster.replicas: 1: the address of each shard's second process, in the order of "
	  "cluster.servers; either of the two may be the primary"),
	O("cluster.listen_any", T_BOOL, 0, 0, 0, "false", NULL, C, listen_any,
	  "shards listen on every address of their host (0.0.0.0, or :: for an IPv6 servers "
	  "entry) on their servers port, instead of the servers address only; for a name that "
	  "resolves on the shard's host to an address it cannot bind or others cannot reach"),
	O("replication.timeout_ms", T_INT, 0, 500, 3600000, "2000", NULL, C, repl_timeout_ms,
	  "cluster.replicas: 1: a primary that hears nothing from its backup for this long "
	  "stops serving; a backup that hears nothing from its primary for twice this long "
	  "takes over (the failover bound); must exceed a one-way delay plus 0.2 s by a margin"),
	O("replication.forward", T_ENUM, 0, 0, 0, "aggregated", cfg_forward_names, C,
	  repl_every_push, "sync: what the primary forwards: aggregated (each clock's summed "
	  "gradient, once per slice whatever the number of workers) or every_push (each "
	  "worker's gradient, summed by the backup; costs more, kept to measure the difference)"),
	O("transport", T_ENUM, 0, 0, 0, "tcp", cfg_transport_names, C, transport,
	  "wire transport between workers and shards: tcp, or rdma (RC verbs queue pairs set "
	  "up with rdma_cm; a shard or worker without an RDMA device stops at start with the "
	  "reason; docs/rdma.md)"),
	O("rdma.device", T_PATH, 0, 0, 0, "", NULL, C, rdma_device,
	  "transport rdma: the verbs device to use (as ibv_devices lists it); \"\" = the first"),
	O("consistency.mode", T_ENUM, 0, 0, 0, "sync", cfg_consistency_names, C, consistency,
	  "sync: a clock completes when every worker pushed; async: workers run freely"),
	O("consistency.staleness", T_INT, 0, 0, 1000000, "0", NULL, C, staleness,
	  "async: clocks a worker may run ahead of the slowest one (ignored in sync)"),
	O("seed", T_U64, 0, 0, 0, "1", NULL, C, seed,
	  "seed of tensor initialization; the same seed gives the same initial model"),
	O("slice_bytes", T_SIZE, 0, 64, GiB, "1MiB", NULL, C, slice_bytes,
	  "tensors are cut into slices of at most this size, spread over the shards; multiple of 4"),
	O("model.preset", T_ENUMSTR, 0, 0, 0, "none", cfg_preset_names, C, model.preset,
	  "a built-in model: mlp (784-256-128-10), cnn (2 conv 5x5 + pool, dense 256, 10) or ctr "
	  "(click logs: 26 categorical fields bagged from model.embeddings (one table for all, "
	  "one per field, or model.embeddings[].fields), 13 numeric "
	  "features, dense 256-128-2, logistic loss; docs/embeddings.md)"),
	O("model.bag", T_ENUM, 0, 0, 0, "sum", cfg_bag_names, C, model.bag,
	  "ctr: how a field's embedding bag combines its ids' rows: sum or mean"),
	O("model.layers", T_LAYERS, 0, 1, PS_MAX_LAYERS, NULL, NULL, C, model.layers,
	  "the model as a list of layers, see model.layers[].* below (instead of a preset)"),
	O("model.input", T_DIMS3, 0, 0, 0, NULL, NULL, C, model.input,
	  "shape of one example [channels, height, width]; default [1, 28, 28]"),
	O("model.classes", T_INT, 0, 2, 100000, "10", NULL, C, model.classes,
	  "outputs of the last layer (labels 0..classes-1)"),
	O("model.tensors", T_TENSORS, 0, 1, PS_MAX_TENSORS, NULL, NULL, C, tensors,
	  "raw parameter tensors without layers (for ps-bench and tests), see model.tensors[].*"),
	O("model.embeddings", T_TABLES, 0, 0, PS_MAX_TABLES, NULL, NULL, C, tables,
	  "sparse embedding tables beside the dense tensors: rows keyed by 64-bit ids, created "
	  "on first push, spread over the shards by a hash of (table, id); see "
	  "model.embeddings[].* below and docs/embeddings.md"),
	O("optimizer.name", T_ENUM, 0, 0, 0, "sgd", cfg_optim_names, C, optim.kind,
	  "update rule applied by the shards"),
	O("optimizer.lr", T_FLOAT, F_OPEN_MIN, 0, 1e6, "0.01", NULL, C, optim.lr, "learning rate"),
	O("optimizer.momentum", T_FLOAT, F_OPEN_MAX, 0, 1, "0.9", NULL, C, optim.momentum,
	  "momentum: the factor mu of the velocity"),
	O("optimizer.nesterov", T_BOOL, 0, 0, 0, "false", NULL, C, optim.nesterov,
	  "momentum: use the Nesterov variant"),
	O("optimizer.dampening", T_FLOAT, 0, 0, 1, "0", NULL, C, optim.dampening,
	  "momentum: the velocity takes (1 - dampening) of the gradient after the first step"),
	O("optimizer.beta1", T_FLOAT, F_OPEN_MAX, 0, 1, "0.9", NULL, C, optim.beta1,
	  "adam: decay of the first moment"),
	O("optimizer.beta2", T_FLOAT, F_OPEN_MAX, 0, 1, "0.999", NULL, C, optim.beta2,
	  "adam: decay of the second moment"),
	O("optimizer.eps", T_FLOAT, F_OPEN_MIN, 0, 1, "1e-8", NULL, C, optim.eps,
	  "adam, adagrad: added to the denominator"),
	O("optimizer.weight_decay", T_FLOAT, 0, 0, 1e3, "0", NULL, C, optim.weight_decay,
	  "L2 penalty added to the gradient (adamw: decoupled, w *= 1 - lr*weight_decay first)"),
	O("optimizer.initial_accumulator", T_FLOAT, 0, 0, 1e6, "0.1", NULL, C,
	  optim.initial_accumulator, "adagrad: initial value of the squared-gradient sum"),
	O("optimizer.average", T_BOOL, 0, 0, 0, "false", NULL, C, optim.average,
	  "apply the mean of a clock's gradients (sync) or each gradient over cluster.workers "
	  "(async) instead of their sum"),
	O("compression.codec", T_ENUM, 0, 0, 0, "none", cfg_codec_names, C, compress.codec,
	  "codec of pushed gradients: none, fp16 (half), q8 (8 bits), topk (the largest ratio), "
	  "sign (1 bit); per tensor: compression.tensors"),
	O("compression.ratio", T_FLOAT, F_OPEN_MIN, 0, 1, "0.01", NULL, C, compress.ratio,
	  "topk: fraction of each slice's values sent"),
	O("compression.error_feedback", T_BOOL, 0, 0, 0, "true", NULL, C, compress.error_feedback,
	  "topk, sign, q8: the worker keeps what was not sent and adds it to the next push"),
	O("compression.lz4", T_ENUM, 0, 0, 0, "auto", cfg_lz4_names, C, compress.lz4,
	  "lossless LZ4 stage after the codec, kept for a frame only when it shrinks it; "
	  "auto: tried only where it is likely to help"),
	O("compression.pull", T_ENUM, 0, 0, 0, "none", cfg_pull_names, C, compress.pull,
	  "encoding of pull replies (weights): none or fp16"),
	O("compression.tensors", T_OVERRIDES, 0, 0, PS_MAX_TENSORS, NULL, NULL, C, compress,
	  "per-tensor codec and ratio, see compression.tensors[].* below"),
	O("limits.max_frame_bytes", T_SIZE, 0, 4 * KiB, 16 * GiB, "64MiB", NULL, C,
	  limits.max_frame_bytes, "largest frame accepted (metadata + payload); >= slice_bytes + 64KiB"),
	O("limits.max_meta_bytes", T_SIZE, 0, KiB, 64 * MiB, "1MiB", NULL, C,
	  limits.max_meta_bytes, "largest protobuf metadata accepted in a frame"),
	O("limits.connect_timeout_ms", T_INT, 0, 1, 3600000, "10000", NULL, C,
	  limits.connect_timeout_ms, "client: connect and handshake must finish within this time"),
	O("limits.request_timeout_ms", T_INT, 0, 1, 86400000, "60000", NULL, C,
	  limits.request_timeout_ms, "client: longest wait for any reply"),
	O("limits.handshake_timeout_ms", T_INT, 0, 1, 3600000, "5000", NULL, C,
	  limits.handshake_timeout_ms, "server: drop connections that do not say hello in time"),
	O("limits.max_clock_ahead", T_INT, 0, 1, 100000, "64", NULL, C, limits.max_clock_ahead,
	  "sync: a push may be at most this many clocks ahead of the shard"),
	O("limits.max_connections", T_INT, 0, 1, 1000000, "1024", NULL, C,
	  limits.max_connections, "connections per shard past the handshake (authenticated when "
	  "security.auth is on)"),
	O("limits.max_waiting_pulls", T_INT, 0, 1, 1000000, "64", NULL, C,
	  limits.max_waiting_pulls, "shard: pulls one connection may have waiting for their "
	  "clock (a worker has one per weighted layer with train.pull: layer); more are "
	  "refused with an error"),
	O("limits.max_waiting_bytes", T_SIZE, 0, 4 * KiB, 64 * GiB, "16MiB", NULL, C,
	  limits.max_waiting_bytes, "shard: bytes the row pulls of one connection waiting for "
	  "their clock may hold (each holds its ids as they came, at most its frame); more are "
	  "refused with an error"),
	O("limits.max_waiting_bytes_total", T_SIZE, 0, 4 * KiB, 1024 * GiB, "256MiB", NULL, C,
	  limits.max_waiting_bytes_total, "shard: the same for every connection together, so "
	  "their number does not matter"),
	O("limits.max_handshakes", T_INT, 0, 1, 100000, "64", NULL, C, limits.max_handshakes,
	  "connections per shard still in the handshake; a new one past it closes the oldest of "
	  "the address that has the most, so a flood without the secret cannot keep workers out"),
	O("limits.max_handshakes_per_source", T_INT, 0, 1, 100000, "8", NULL, C,
	  limits.max_handshakes_per_source, "the same from one address: a new one past it "
	  "closes that address's oldest"),
	O("limits.idle_timeout_ms", T_INT, 0, 0, 86400000, "30000", NULL, C,
	  limits.idle_timeout_ms, "a connection that sends nothing for this long is closed; "
	  "clients send heartbeats every third of it, so only dead or hung peers hit it (a "
	  "host lost without closing its connections); 0 = never"),
	O("limits.max_write_queue_bytes", T_SIZE, 0, 64 * KiB, 64 * GiB, "1GiB", NULL, C,
	  limits.max_write_queue, "shard: while more reply bytes than this wait for a peer, its "
	  "requests are not read (backpressure; one that never reads is dropped after "
	  "limits.idle_timeout_ms); >= limits.max_frame_bytes"),
	O("limits.max_queued_bytes", T_SIZE, 0, 64 * KiB, 1024 * GiB, "4GiB", NULL, C,
	  limits.max_queued_bytes, "shard: the same for every peer together: past this many "
	  "queued reply bytes no peer's requests are read; >= limits.max_write_queue_bytes"),
	O("limits.drop_timeout_ms", T_INT, 0, 0, 86400000, "0", NULL, C, limits.drop_timeout_ms,
	  "sync/async: a worker with no connection for this long (a killed process's closes at "
	  "once) leaves the live set, so the others go on without it; it rejoins when it "
	  "connects again; 0 = limits.idle_timeout_ms, at most 5 s"),
	O("limits.reconnect_timeout_ms", T_INT, 0, 0, 86400000, "60000", NULL, C,
	  limits.reconnect_timeout_ms, "client: after a lost connection, reconnect (backoff 0.1 "
	  "to 2 s) and resend what was not answered for this long; pushes are applied exactly "
	  "once; 0 = fail at once"),
	O("limits.max_table_bytes", T_SIZE, 0, MiB, 1024 * 1024 * GiB, "4GiB", NULL, C,
	  limits.max_table_bytes, "shard: memory its embedding tables may hold, shared evenly "
	  "by the tables; a table at its share drops its least recently updated row for each "
	  "new one (logged, counted in evicted), so no peer can run a shard out of memory"),
	O("limits.max_request_rows", T_INT, 0, 1, 1 << 28, "1048576", NULL, C,
	  limits.max_request_rows, "ids in one pull_rows / push_rows frame to one shard; more "
	  "are refused (by the client before sending, by the shard before decoding)"),
	O("limits.wait_spin_us", T_INT, 0, 0, 100000, "50", NULL, C, limits.wait_spin_us,
	  "client: a wait for a reply polls the shards' sockets this long (reading the reply "
	  "itself) before sleeping, which takes the I/O thread's wake-up off short round trips; "
	  "0 always sleeps"),
	O("train.data_dir", T_PATH, 0, 0, 0, "/usr/share/datasets/fashion-mnist", NULL, C,
	  train.data_dir, "folder of the IDX files train-{images,labels}-* and t10k-* (gzip or plain)"),
	O("train.train_file", T_PATH, 0, 0, 0, "", NULL, C, train.train_file,
	  "ctr: the training click log in Criteo's format (plain or gzip; ps-ctrgen writes one)"),
	O("train.test_file", T_PATH, 0, 0, 0, "", NULL, C, train.test_file,
	  "ctr: the held-out click log for the per-epoch logloss and AUC"),
	O("train.batch", T_INT, 0, 1, 65536, "64", NULL, C, train.batch,
	  "examples per step on each worker"),
	O("train.epochs", T_INT, 0, 1, 1000000, "1", NULL, C, train.epochs,
	  "passes over each worker's part of the training set"),
	O("train.limit", T_INT, 0, 0, 1e9, "0", NULL, C, train.train_limit,
	  "use only the first N training images (0 = all), split among the workers"),
	O("train.test_limit", T_INT, 0, 0, 1e9, "0", NULL, C, train.test_limit,
	  "measure test accuracy on the first N test images only (0 = all 10,000)"),
	O("train.device", T_ENUM, 0, 0, 0, "auto", cfg_device_names, C, train.device,
	  "auto: the GPU when there is a usable one, else the CPU; cuda: fail without a GPU"),
	O("train.tf32", T_ENUM, 0, 0, 0, "conv", cfg_tf32_names, C, train.tf32,
	  "cuda: TF32 tensor-core math for conv (convolutions only, matrix products in full "
	  "fp32: PyTorch's default), all (matrix products too: faster, about 3 fewer "
	  "decimal digits) or off (fp32 throughout, as the cpu backend); no effect on the cpu"),
	O("train.threads", T_INT, 0, 0, 1024, "0", NULL, C, train.threads,
	  "compute threads per worker on the cpu backend (oneDNN); 0 = auto: OMP_NUM_THREADS "
	  "if set, else the machine's cores shared among the workers on it (cluster.workers "
	  "when every shard address is loopback, as scripts/ps-local.sh runs them; else this "
	  "worker alone), at least 1; no effect on cuda"),
	O("train.pull", T_ENUM, 0, 0, 0, "layer", cfg_pull_when_names, C, train.pull,
	  "when a worker pulls the next step's weights: layer (each layer's with its "
	  "gradients' push, as soon as backward has them, so the pull of the last layers "
	  "overlaps the backward and pushes of the first; sync shards answer it once that "
	  "layer's clock is complete) or step (every tensor in one pull after the step's "
	  "last push); the same weights either way"),
	O("train.metrics_dir", T_PATH, 0, 0, 0, "metrics", NULL, C, train.metrics_dir,
	  "folder for worker-R.jsonl metrics logs (created if missing); \"\" = none"),
	O("stats.token_file", T_PATH, 0, 0, 0, "", NULL, C, stats.token_file,
	  "file holding a bearer token that /metrics requires (Authorization: Bearer ...; "
	  "mode 0600; relative to the config file); /healthz stays open; \"\" = no token"),
	O("stats.http", T_ADDR, 0, 0, 0, "", NULL, C, stats.http,
	  "host:port of the Prometheus /metrics and /healthz endpoint (libmicrohttpd); "
	  "shard k serves on port + k (see stats.port_per_shard); empty = off"),
	O("stats.port_per_shard", T_BOOL, 0, 0, 0, "true", NULL, C, stats.port_per_shard,
	  "true: shard k serves /metrics on the stats.http port + k (a backup on port + "
	  "shards + k), so shards on one host do not collide; false: every shard on the port "
	  "itself, for shards on hosts of their own (Kubernetes pods: one probe and scrape port)"),
	O("checkpoint.dir", T_PATH, 0, 0, 0, "", NULL, C, checkpoint.dir,
	  "folder of each shard's checkpoint (shard-K.ckpt): written on SIGTERM, every "
	  "checkpoint.every_s and on `ps-stat --checkpoint`, resumed from at start; \"\" = off"),
	O("checkpoint.every_s", T_INT, 0, 0, 10000000, "0", NULL, C, checkpoint.every_s,
	  "seconds between periodic checkpoints; 0 = only on SIGTERM and on request"),
	O("checkpoint.on_request", T_BOOL, 0, 0, 0, "false", NULL, C, checkpoint.on_request,
	  "a peer that holds the secret may ask a shard for a checkpoint (`ps-stat --checkpoint`); "
	  "off, such requests are refused"),
	O("checkpoint.min_interval_s", T_INT, 0, 0, 86400, "10", NULL, C,
	  checkpoint.min_interval_s, "at most one checkpoint on request per this many seconds; "
	  "requests sooner are refused"),
	O("checkpoint.incremental", T_INT, 0, 0, 1000000, "0", NULL, C, checkpoint.incremental,
	  "with embedding tables: after a full checkpoint, this many periodic or requested ones "
	  "are incremental (shard-K.ckpt.delta-N: the rows changed since the previous one, the "
	  "ids dropped as tombstones, the dense state whole), then a full one again; the one at "
	  "SIGTERM is always full; 0 = every checkpoint is full"),
	O("checkpoint.fork_bytes", T_SIZE, 0, 0, 1024 * GiB, "256MiB", NULL, C,
	  checkpoint.fork_bytes, "a background checkpoint (full or incremental) of a shard "
	  "whose state is at least this big (large embedding tables) is written by a child "
	  "made with fork() from its copy-on-write view, so the shard pauses for the fork "
	  "instead of a copy; 0 = always copy"),
	O("security.auth", T_BOOL, 0, 0, 0, "true", NULL, C, security.auth,
	  "every connection proves knowledge of the shared secret (libsodium challenge-response, "
	  "both ways); false only on a trusted network"),
	O("security.mac", T_BOOL, 0, 0, 0, "true", NULL, C, security.mac,
	  "with auth: every later frame carries a sequence number and a Poly1305 MAC, so frames "
	  "cannot be altered, replayed or injected; false saves its cost on a trusted network"),
	O("security.encrypt", T_BOOL, 0, 0, 0, "false", NULL, C, security.encrypt,
	  "with auth and mac: every later frame is encrypted (an AEAD record in place of the "
	  "MAC), so gradients and weights cannot be read on the way; costs a pass over every "
	  "byte (BENCHMARKS.md)"),
	O("security.cipher", T_ENUM, 0, 0, 0, "aes-256-gcm", ps_cipher_names, C, security.cipher,
	  "with encrypt: the AEAD cipher; aes-256-gcm is the faster where the CPU has AES "
	  "instructions, chacha20-poly1305 where it has not"),
	O("security.secret_file", T_PATH, 0, 0, 0, "", NULL, C, security.secret_file,
	  "file of at least 32 random bytes (64 hex digits), mode 0600 (scripts/ps-keygen FILE); "
	  "relative to the config file's folder; \"\" = $PS_SECRET_FILE; --secret-file overrides"),
	O("security.repl_key_file", T_PATH, 0, 0, 0, "", NULL, C, security.repl_key_file,
	  "cluster.replicas: 1 with auth: the replication key, a file like the secret's that only "
	  "the shard processes hold (the replication link proves it, not the secret); relative "
	  "to the config file's folder; \"\" = $PS_REPL_KEY_FILE; --repl-key-file overrides"),
	O("security.reader_key_file", T_PATH, 0, 0, 0, "", NULL, C, security.reader_key_file,
	  "with auth: the key of the read-only role (readers pull rows and tensors, never change "
	  "anything), a file like the secret's held by the shards and the readers, not by "
	  "workers; relative to the config file's folder; \"\" = $PS_READER_KEY_FILE (no key: "
	  "the shards refuse readers); --reader-key-file overrides"),
	O("log.level", T_ENUMSTR, 0, 0, 0, "info", cfg_level_names, C, log_level,
	  "least severe log level written to stderr"),
};
#undef C
const size_t cfg_nopts = sizeof(cfg_opts) / sizeof(cfg_opts[0]);
_Static_assert(sizeof(cfg_opts) / sizeof(cfg_opts[0]) <= CFG_MAX_OPTS, "CFG_MAX_OPTS");


#define T struct tensor_tmp
const struct opt cfg_tensor_opts[NTENSOR] = {
	O("name", T_NAME, F_REQUIRED, 1, PS_NAME_MAX - 1, NULL, NULL, T, t.name,
	  "unique name of the tensor"),
	O("shape", T_SHAPE, F_REQUIRED, 1, PS_MAX_DIMS, NULL, NULL, T, t.dims,
	  "dimensions; at most 2^34 elements in all"),
	O("init", T_ENUM, 0, 0, 0, "uniform", cfg_init_names, T, t.init,
	  "initial values: zeros, const (value), uniform in [-scale, scale], normal (std scale), "
	  "arange (index mod 1024)"),
	O("scale", T_FLOAT, 0, 0, 1e6, "0.05", NULL, T, scale, "uniform, normal: the scale"),
	O("value", T_FLOAT, 0, -1e30, 1e30, "0", NULL, T, value, "const: every element's value"),
};
#undef T

#define E struct table_tmp
const struct opt cfg_table_opts[NTABLE] = {
	O("name", T_NAME, F_REQUIRED, 1, PS_NAME_MAX - 1, NULL, NULL, E, t.name,
	  "unique name of the table (clients name it in pull_rows / push_rows)"),
	O("dim", T_INT, F_REQUIRED, 1, PS_MAX_ROW_DIM, NULL, NULL, E, t.dim, "floats per row"),
	O("init", T_ENUM, 0, 0, 0, "uniform", cfg_init_names, E, t.init,
	  "initial row values, from (seed, table, id) so a row re-created anywhere starts the "
	  "same: zeros, const (value), uniform in [-scale, scale], normal (std scale)"),
	O("scale", T_FLOAT, 0, 0, 1e6, "0.01", NULL, E, scale, "uniform, normal: the scale"),
	O("value", T_FLOAT, 0, -1e30, 1e30, "0", NULL, E, value, "const: every element's value"),
	O("optimizer", T_ENUM, 0, 0, 0, "rowwise_adagrad", cfg_row_optim_names, E, t.optimizer,
	  "update rule of the rows: sgd, adagrad, rowwise_adagrad (one accumulator per row), "
	  "adam, ftrl (FTRL-Proximal; init must be zeros)"),
	O("lr", T_FLOAT, F_OPEN_MIN, 0, 1e6, "0.01", NULL, E, t.lr, "learning rate (ftrl: alpha)"),
	O("eps", T_FLOAT, F_OPEN_MIN, 0, 1, "1e-8", NULL, E, t.eps,
	  "adam, adagrad, rowwise_adagrad: added to the denominator"),
	O("beta1", T_FLOAT, F_OPEN_MAX, 0, 1, "0.9", NULL, E, t.beta1, "adam: decay of the first moment"),
	O("beta2", T_FLOAT, F_OPEN_MAX, 0, 1, "0.999", NULL, E, t.beta2,
	  "adam: decay of the second moment"),
	O("initial_accumulator", T_FLOAT, 0, 0, 1e6, "0", NULL, E, t.initial_accumulator,
	  "adagrad, rowwise_adagrad: initial value of the squared-gradient sum"),
	O("l1", T_FLOAT, 0, 0, 1e6, "0", NULL, E, t.l1, "ftrl: L1 strength"),
	O("l2", T_FLOAT, 0, 0, 1e6, "0", NULL, E, t.l2, "ftrl: L2 strength"),
	O("ftrl_beta", T_FLOAT, 0, 0, 1e6, "1", NULL, E, t.ftrl_beta, "ftrl: beta of the learning rate"),
	O("admission", T_INT, 0, 0, 255, "0", NULL, E, t.admission,
	  "a row is created at the Nth push naming its id (pushes before it only count, in a "
	  "filter of 4 bytes per id; pulls return the initial value); 0 or 1: at the first"),
	O("ttl", T_INT, 0, 0, 1 << 30, "0", NULL, E, t.ttl_s,
	  "seconds: a row not updated for this long is dropped (checked every second); 0 = never"),
	O("max_rows", T_INT, 0, 0, 1ll << 40, "0", NULL, E, t.max_rows,
	  "rows of the whole table; each shard keeps at most its share (max_rows / shards, "
	  "rounded up) and drops its least recently updated rows past it; 0 = no cap"),
	O("filter_ids", T_INT, 0, 1024, 1ll << 32, "1048576", NULL, E, t.filter_ids,
	  "admission: ids each shard counts before every count is halved to make room "
	  "(4 bytes each)"),
	O("fields", T_FIELDS, 0, 0, PS_CTR_FIELDS, NULL, NULL, E, t.fields,
	  "ctr: the categorical fields (0..25) whose bags take their rows from this table, "
	  "e.g. [0, 1, 2]; every field in exactly one table, [] for a table the model does not "
	  "use; optional with 1 table (all fields) or 26 (field i in table i)"),
};
#undef E

/* One compression.tensors entry; codec and ratio default to the section's. */
#define V struct cfg_override
const struct opt cfg_override_opts[NOVR] = {
	O("name", T_NAME, F_REQUIRED, 1, PS_NAME_MAX - 1, NULL, NULL, V, name,
	  "a tensor of the model, also one derived from its layers (e.g. fc1.weight)"),
	O("codec", T_ENUM, 0, 0, 0, NULL, cfg_codec_names, V, codec,
	  "codec of this tensor's pushes; default compression.codec"),
	O("ratio", T_FLOAT, F_OPEN_MIN, 0, 1, NULL, NULL, V, ratio,
	  "topk only: fraction of each slice sent; default compression.ratio"),
};
#undef V

/* One model.layers entry; which keys apply depends on type. */
#define L struct ps_layer_cfg
const struct opt cfg_layer_opts[NLAYER] = {
	O("type", T_ENUM, F_REQUIRED, 0, 0, NULL, cfg_layer_names, L, kind,
	  "dense, conv2d, maxpool, relu or flatten (a bare name also works: '- relu')"),
	O("out", T_INT, 0, 1, 1 << 20, NULL, NULL, L, out, "dense: outputs; conv2d: filters"),
	O("kernel", T_INT, 0, 1, 64, NULL, NULL, L, kernel, "conv2d: square kernel size"),
	O("pad", T_INT, 0, 0, 64, "0", NULL, L, pad, "conv2d: zero padding on each side"),
	O("stride", T_INT, 0, 1, 64, "1", NULL, L, stride, "conv2d: stride"),
	O("size", T_INT, 0, 1, 64, "2", NULL, L, size, "maxpool: window and stride"),
};
#undef L
/* Keys each layer kind takes (bit i = cfg_layer_opts[i]); 'out'/'kernel' required where used. */
const unsigned cfg_layer_keys[] = {
	[PS_LAYER_DENSE] = 1u << LO_OUT,
	[PS_LAYER_CONV2D] = 1u << LO_OUT | 1u << LO_KERNEL | 1u << LO_PAD | 1u << LO_STRIDE,
	[PS_LAYER_MAXPOOL] = 1u << LO_SIZE,
	[PS_LAYER_RELU] = 0,
	[PS_LAYER_FLATTEN] = 0,
};

/* The enums of config.h are stored through int pointers. */
_Static_assert(sizeof(enum ps_transport_kind) == sizeof(int), "enum size");
_Static_assert(sizeof(enum ps_init_kind) == sizeof(int), "enum size");
_Static_assert(sizeof(enum ps_layer_kind) == sizeof(int), "enum size");

void cfg_apply_defaults(const struct opt *tab, size_t n, void *base)
{
	const char *why;

	for (size_t i = 0; i < n; i++)
		if (tab[i].def)
			cfg_parse_scalar(&tab[i], base, tab[i].def, &why);
}

void ps_config_defaults(struct ps_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg_apply_defaults(cfg_opts, NCFG, cfg);
	cfg->model.input[0] = 1;
	cfg->model.input[1] = 28;
	cfg->model.input[2] = 28;
}
