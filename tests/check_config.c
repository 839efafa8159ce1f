/* check_config.c - unit tests of the configuration loader (common/config.c).
 *
 * Run from the repository root (conf/local.yaml is loaded by relative path).
 * Valid files must land in every field; every error path must produce one
 * line naming file:line, the key, what was expected and the offending text;
 * hostile input (deep nesting, huge scalars, random bytes) must neither crash
 * nor leak. Exits nonzero when any test fails.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "codec.h"
#include "config.h"
#include "frame_aead.h"
#include "ps_err.h"
#include "test_util.h"

/* struct ps_config is large: keep the ones the tests use off the stack */
static struct ps_config cfg, cfg2;
static char err[1024];

/* Lines 1-3: cluster; lines 4-5: model header; tensors from line 6. */
#define CL(s, w) "cluster:\n  servers: " s "\n  workers: " w "\n"
#define MODEL(t) "model:\n  tensors:\n" t
#define T1 "    - {name: w, shape: [4]}\n"
#define BASE CL("[127.0.0.1:7000]", "1") MODEL(T1) /* lines 1-6 */
/* The ctr preset: its tables from line 7. */
#define CTR(t) CL("[a:1]", "1") "model:\n  preset: ctr\n  embeddings:\n" t
#define F0_12 "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]"
#define F13_25 "[13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25]"

/* Every option set to something other than its default. */
static const char full_yaml[] =
	"cluster:\n"
	"  servers:\n"
	"    - 10.0.0.1:7000\n"
	"    - \"[::1]:7001\"\n"
	"    - node-3.example.com:65535\n"
	"  workers: 17\n"
	"  listen_any: true\n"
	"transport: TCP\n"
	"consistency:\n"
	"  mode: async\n"
	"  staleness: 3\n"
	"seed: 18446744073709551615\n"
	"slice_bytes: 256KiB\n"
	"model:\n"
	"  tensors:\n"
	"    - name: a/b:c-d_e.f\n"
	"      shape: [2, 3, 4]\n"
	"      init: const\n"
	"      value: -1.5\n"
	"    - {name: z, shape: [7], init: zeros}\n"
	"    - {name: n, shape: [1, 1, 1, 1, 1, 1, 1, 9], init: normal, scale: 0.5}\n"
	"    - {name: r, shape: [5]}\n"
	"    - {name: big, shape: [131072, 131072], init: arange}\n"
	"optimizer:\n"
	"  name: adam\n"
	"  lr: 0.001\n"
	"  momentum: 0.5\n"
	"  nesterov: yes\n"
	"  beta1: 0.8\n"
	"  beta2: 0.99\n"
	"  eps: 1e-6\n"
	"  weight_decay: 0.0001\n"
	"  initial_accumulator: 0.2\n"
	"compression:\n"
	"  codec: q8\n"
	"  ratio: 0.25\n"
	"  error_feedback: off\n"
	"  lz4: on\n"
	"  pull: FP16\n"
	"  tensors:\n"
	"    - {name: z, codec: topk, ratio: 1}\n"
	"    - name: n\n"
	"      codec: SIGN\n"
	"    - {name: r, codec: topk}\n"
	"limits:\n"
	"  max_frame_bytes: 2 GiB\n"
	"  max_meta_bytes: 4096\n"
	"  connect_timeout_ms: 1\n"
	"  request_timeout_ms: 86400000\n"
	"  handshake_timeout_ms: 250\n"
	"  max_clock_ahead: 100000\n"
	"  max_connections: 7\n"
	"stats:\n"
	"  http: \"[::1]:9100\"\n"
	"log:\n"
	"  level: debug\n";

static int load(const char *yaml)
{
	return ps_config_load_string(&cfg, yaml, "t.yaml", err, sizeof(err));
}

START_TEST(test_defaults)
{
	ps_config_defaults(&cfg);
	ck_assert_str_eq(cfg.path, "");
	ck_assert_int_eq(cfg.nshards, 0);
	ck_assert_int_eq(cfg.nworkers, 0);
	ck_assert_int_eq(cfg.listen_any, 0);
	ck_assert_int_eq(cfg.ntensors, 0);
	ck_assert_int_eq(cfg.transport, PS_TRANSPORT_TCP);
	ck_assert_int_eq(cfg.consistency, PS_SYNC);
	ck_assert_int_eq(cfg.staleness, 0);
	ck_assert_uint_eq(cfg.seed, 1);
	ck_assert_uint_eq(cfg.slice_bytes, 1 << 20);
	ck_assert_int_eq(cfg.optim.kind, PS_OPT_SGD);
	ck_assert_float_eq(cfg.optim.lr, 0.01f);
	ck_assert_float_eq(cfg.optim.momentum, 0.9f);
	ck_assert_int_eq(cfg.optim.nesterov, 0);
	ck_assert_float_eq(cfg.optim.beta1, 0.9f);
	ck_assert_float_eq(cfg.optim.beta2, 0.999f);
	ck_assert_float_eq(cfg.optim.eps, 1e-8f);
	ck_assert_float_eq(cfg.optim.weight_decay, 0.0f);
	ck_assert_float_eq(cfg.optim.initial_accumulator, 0.1f);
	ck_assert_uint_eq(cfg.limits.max_frame_bytes, 64u << 20);
	ck_assert_uint_eq(cfg.limits.max_meta_bytes, 1u << 20);
	ck_assert_int_eq(cfg.limits.connect_timeout_ms, 10000);
	ck_assert_int_eq(cfg.limits.request_timeout_ms, 60000);
	ck_assert_int_eq(cfg.limits.handshake_timeout_ms, 5000);
	ck_assert_int_eq(cfg.limits.max_clock_ahead, 64);
	ck_assert_int_eq(cfg.limits.max_connections, 1024);
	ck_assert_str_eq(cfg.stats.http, "");
	ck_assert_str_eq(cfg.log_level, "info");
	ck_assert_int_eq(cfg.compress.codec, PS_CODEC_NONE);
	ck_assert_float_eq(cfg.compress.ratio, 0.01f);
	ck_assert_int_eq(cfg.compress.error_feedback, 1);
	ck_assert_int_eq(cfg.compress.lz4, PS_LZ4_AUTO);
	ck_assert_int_eq(cfg.compress.pull, PS_CODEC_NONE);
}
END_TEST

START_TEST(test_minimal_gets_defaults)
{
	ck_assert_msg(load(BASE) == 0, "%s", err);
	ck_assert_str_eq(err, "");
	ck_assert_str_eq(cfg.path, "t.yaml");
	ck_assert_int_eq(cfg.nshards, 1);
	ck_assert_str_eq(cfg.shards[0].host, "127.0.0.1");
	ck_assert_int_eq(cfg.shards[0].port, 7000);
	ck_assert_int_eq(cfg.nworkers, 1);
	ck_assert_int_eq(cfg.ntensors, 1);
	ck_assert_int_eq(cfg.tensors[0].init, PS_INIT_UNIFORM);
	ck_assert_float_eq(cfg.tensors[0].init_value, 0.05f);
	ck_assert_int_eq(cfg.tensors[0].count, 4);
	ps_config_defaults(&cfg2);
	ck_assert_uint_eq(cfg.seed, cfg2.seed);
	ck_assert_mem_eq(&cfg.optim, &cfg2.optim, sizeof(cfg.optim));
	ck_assert_mem_eq(&cfg.limits, &cfg2.limits, sizeof(cfg.limits));
	ck_assert_mem_eq(&cfg.compress, &cfg2.compress, sizeof(cfg.compress));
	ck_assert_int_eq(cfg.tensors[0].codec, PS_CODEC_NONE);
	ck_assert_float_eq(cfg.tensors[0].ratio, 0.01f);
	ck_assert_str_eq(cfg.log_level, "info");
}
END_TEST

START_TEST(test_full)
{
	const struct ps_tensor_cfg *t;

	ck_assert_msg(load(full_yaml) == 0, "%s", err);
	ck_assert_int_eq(cfg.nshards, 3);
	ck_assert_str_eq(cfg.shards[0].host, "10.0.0.1");
	ck_assert_int_eq(cfg.shards[0].port, 7000);
	ck_assert_str_eq(cfg.shards[1].host, "::1");
	ck_assert_int_eq(cfg.shards[1].port, 7001);
	ck_assert_str_eq(cfg.shards[2].host, "node-3.example.com");
	ck_assert_int_eq(cfg.shards[2].port, 65535);
	ck_assert_int_eq(cfg.nworkers, 17);
	ck_assert_int_eq(cfg.listen_any, 1);
	ck_assert_int_eq(cfg.transport, PS_TRANSPORT_TCP);
	ck_assert_int_eq(cfg.consistency, PS_ASYNC);
	ck_assert_int_eq(cfg.staleness, 3);
	ck_assert_uint_eq(cfg.seed, UINT64_MAX);
	ck_assert_uint_eq(cfg.slice_bytes, 256 * 1024);

	ck_assert_int_eq(cfg.ntensors, 5);
	t = &cfg.tensors[0];
	ck_assert_str_eq(t->name, "a/b:c-d_e.f");
	ck_assert_int_eq(t->ndims, 3);
	ck_assert_int_eq(t->dims[0], 2);
	ck_assert_int_eq(t->dims[1], 3);
	ck_assert_int_eq(t->dims[2], 4);
	ck_assert_int_eq(t->count, 24);
	ck_assert_int_eq(t->init, PS_INIT_CONST);
	ck_assert_float_eq(t->init_value, -1.5f);
	t = &cfg.tensors[1];
	ck_assert_str_eq(t->name, "z");
	ck_assert_int_eq(t->init, PS_INIT_ZEROS);
	ck_assert_float_eq(t->init_value, 0.0f);
	ck_assert_int_eq(t->count, 7);
	t = &cfg.tensors[2];
	ck_assert_int_eq(t->ndims, 8);
	ck_assert_int_eq(t->dims[7], 9);
	ck_assert_int_eq(t->count, 9);
	ck_assert_int_eq(t->init, PS_INIT_NORMAL);
	ck_assert_float_eq(t->init_value, 0.5f);
	t = &cfg.tensors[3];
	ck_assert_int_eq(t->init, PS_INIT_UNIFORM);
	ck_assert_float_eq(t->init_value, 0.05f);
	t = &cfg.tensors[4];
	ck_assert_int_eq(t->init, PS_INIT_ARANGE);
	ck_assert_int_eq(t->count, 1ll << 34);

	ck_assert_int_eq(cfg.optim.kind, PS_OPT_ADAM);
	ck_assert_float_eq(cfg.optim.lr, 0.001f);
	ck_assert_float_eq(cfg.optim.momentum, 0.5f);
	ck_assert_int_eq(cfg.optim.nesterov, 1);
	ck_assert_float_eq(cfg.optim.beta1, 0.8f);
	ck_assert_float_eq(cfg.optim.beta2, 0.99f);
	ck_assert_float_eq(cfg.optim.eps, 1e-6f);
	ck_assert_float_eq(cfg.optim.weight_decay, 0.0001f);
	ck_assert_float_eq(cfg.optim.initial_accumulator, 0.2f);
	ck_assert_uint_eq(cfg.limits.max_frame_bytes, 2ull << 30);
	ck_assert_uint_eq(cfg.limits.max_meta_bytes, 4096);
	ck_assert_int_eq(cfg.limits.connect_timeout_ms, 1);
	ck_assert_int_eq(cfg.limits.request_timeout_ms, 86400000);
	ck_assert_int_eq(cfg.limits.handshake_timeout_ms, 250);
	ck_assert_int_eq(cfg.limits.max_clock_ahead, 100000);
	ck_assert_int_eq(cfg.limits.max_connections, 7);
	ck_assert_str_eq(cfg.stats.http, "[::1]:9100");
	ck_assert_str_eq(cfg.log_level, "debug");
	ck_assert_int_eq(cfg.compress.codec, PS_CODEC_Q8);
	ck_assert_float_eq(cfg.compress.ratio, 0.25f);
	ck_assert_int_eq(cfg.compress.error_feedback, 0);
	ck_assert_int_eq(cfg.compress.lz4, PS_LZ4_ON);
	ck_assert_int_eq(cfg.compress.pull, PS_CODEC_FP16);
	/* a/b:c-d_e.f and big from the section; z, n and r from their entries */
	ck_assert_int_eq(cfg.tensors[0].codec, PS_CODEC_Q8);
	ck_assert_float_eq(cfg.tensors[0].ratio, 0.25f);
	ck_assert_int_eq(cfg.tensors[1].codec, PS_CODEC_TOPK);
	ck_assert_float_eq(cfg.tensors[1].ratio, 1.0f);
	ck_assert_int_eq(cfg.tensors[2].codec, PS_CODEC_SIGN);
	ck_assert_float_eq(cfg.tensors[2].ratio, 0.25f);
	ck_assert_int_eq(cfg.tensors[3].codec, PS_CODEC_TOPK);
	ck_assert_float_eq(cfg.tensors[3].ratio, 0.25f);
	ck_assert_int_eq(cfg.tensors[4].codec, PS_CODEC_Q8);

	ck_assert_int_eq(ps_config_find_tensor(&cfg, "z"), 1);
	ck_assert_int_eq(ps_config_find_tensor(&cfg, "big"), 4);
	ck_assert_int_eq(ps_config_find_tensor(&cfg, "nope"), PS_ENOTENSOR);
	ck_assert_str_eq(ps_optim_name(cfg.optim.kind), "adam");
}
END_TEST

START_TEST(test_value_forms)
{
	/* block-list servers, size spellings, bool spellings, enum case */
	static const char y[] =
		"cluster:\n  servers:\n    - localhost:1\n    - '192.168.0.1:2'\n  workers: 4096\n"
		MODEL(T1)
		"slice_bytes: 4 K\nconsistency: {mode: ASYNC, staleness: 1000000}\n"
		"optimizer: {name: Momentum, nesterov: On, momentum: 0}\n"
		"limits: {max_frame_bytes: 16GiB, max_meta_bytes: 64M}\n"
		"stats: {http: 'metrics.local:9100'}\nlog: {level: 'OFF'}\n"
		"optimizer_unused_section_check: ~\n";

	ck_assert_int_eq(load(y), PS_ECONFIG); /* last line is an unknown key */
	ck_assert_ptr_nonnull(strstr(err, "t.yaml:15: unknown key 'optimizer_unused_section_check'"));
	ck_assert_msg(ps_config_load_string(&cfg, y, "t.yaml", NULL, 0) == PS_ECONFIG, "no err buf");
	{
		char y2[sizeof(y)];

		memcpy(y2, y, sizeof(y));
		*strstr(y2, "optimizer_unused") = 0;
		ck_assert_msg(load(y2) == 0, "%s", err);
	}
	ck_assert_int_eq(cfg.nshards, 2);
	ck_assert_str_eq(cfg.shards[0].host, "localhost");
	ck_assert_int_eq(cfg.shards[0].port, 1);
	ck_assert_str_eq(cfg.shards[1].host, "192.168.0.1");
	ck_assert_int_eq(cfg.nworkers, 4096);
	ck_assert_uint_eq(cfg.slice_bytes, 4096);
	ck_assert_int_eq(cfg.consistency, PS_ASYNC);
	ck_assert_int_eq(cfg.staleness, 1000000);
	ck_assert_int_eq(cfg.optim.kind, PS_OPT_MOMENTUM);
	ck_assert_int_eq(cfg.optim.nesterov, 1);
	ck_assert_float_eq(cfg.optim.momentum, 0.0f);
	ck_assert_uint_eq(cfg.limits.max_frame_bytes, 16ull << 30);
	/* the write-queue cap's default grows to hold one frame */
	ck_assert_uint_eq(cfg.limits.max_write_queue, 16ull << 30);
	ck_assert_uint_eq(cfg.limits.max_meta_bytes, 64u << 20);
	ck_assert_str_eq(cfg.stats.http, "metrics.local:9100");
	ck_assert_str_eq(cfg.log_level, "off");
	ck_assert_str_eq(ps_optim_name(PS_OPT_SGD), "sgd");
	ck_assert_str_eq(ps_optim_name(PS_OPT_ADAGRAD), "adagrad");
	ck_assert_str_eq(ps_optim_name((enum ps_optim_kind)99), "unknown");
}
END_TEST

START_TEST(test_local_yaml)
{
	int rc = ps_config_load(&cfg, "conf/local.yaml", err, sizeof(err));

	ck_assert_msg(rc == 0, "%s", err);
	ck_assert_str_eq(cfg.path, "conf/local.yaml");
	ck_assert_int_eq(cfg.nshards, 2);
	ck_assert_str_eq(cfg.shards[0].host, "127.0.0.1");
	ck_assert_int_eq(cfg.shards[0].port, 7000);
	ck_assert_int_eq(cfg.shards[1].port, 7001);
	ck_assert_int_eq(cfg.nworkers, 2);
	ck_assert_int_eq(cfg.consistency, PS_SYNC);
	ck_assert_float_eq(cfg.optim.lr, 0.01f);
	ck_assert_str_eq(cfg.model.preset, "cnn");
	ck_assert_int_eq(cfg.ntensors, 8);
	ck_assert_int_eq(cfg.tensors[0].count, 32 * 5 * 5);
	ck_assert_int_eq(ps_config_find_tensor(&cfg, "fc2.bias"), 7);
	ck_assert_int_eq(cfg.tensors[7].count, 10);
}
END_TEST

START_TEST(test_example_full_yaml)
{
	int rc = ps_config_load(&cfg, "conf/example-full.yaml", err, sizeof(err));

	ck_assert_msg(rc == 0, "%s", err);
	ck_assert_int_eq(cfg.nshards, 2);
	ck_assert_int_eq(cfg.nworkers, 3);
	ck_assert_int_eq(cfg.ntensors, 5);
	/* every non-required option in it shows its default */
	ps_config_defaults(&cfg2);
	ck_assert_mem_eq(&cfg.optim, &cfg2.optim, sizeof(cfg.optim));
	ck_assert_mem_eq(&cfg.limits, &cfg2.limits, sizeof(cfg.limits));
	ck_assert_uint_eq(cfg.slice_bytes, cfg2.slice_bytes);
	ck_assert_uint_eq(cfg.seed, cfg2.seed);
	ck_assert_mem_eq(&cfg.compress, &cfg2.compress, sizeof(cfg.compress));
	ck_assert_mem_eq(&cfg.security, &cfg2.security, sizeof(cfg.security));
	ck_assert_int_eq(cfg.security.auth, 1);
	ck_assert_int_eq(cfg.security.mac, 1);
	ck_assert_int_eq(cfg.security.encrypt, 0);
	ck_assert_int_eq(cfg.security.cipher, PS_CIPHER_AES256GCM);
	for (int i = 0; i < cfg.ntensors; i++) {
		ck_assert_int_eq(cfg.tensors[i].codec, PS_CODEC_NONE);
		ck_assert_float_eq(cfg.tensors[i].ratio, 0.01f);
	}
}
END_TEST

/* The dump of cfg (free it). */
static char *dump_text(void)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);

	ck_assert_ptr_nonnull(f);
	ps_config_dump(&cfg, f);
	fclose(f);
	return text;
}

/* Dumps cfg, reloads the text, and checks the two structs are identical. */
static void roundtrip(void)
{
	char *text = dump_text();
	int rc;

	memset(&cfg2, 0x5a, sizeof(cfg2));
	rc = ps_config_load_string(&cfg2, text, cfg.path, err, sizeof(err));
	ck_assert_msg(rc == 0, "%s\n%s", err, text);
	ck_assert_msg(memcmp(&cfg, &cfg2, sizeof(cfg)) == 0, "dump differs:\n%s", text);
	free(text);
}

START_TEST(test_roundtrip)
{
	static const char odd[] = CL("['[fe80::1]:1', '[::ffff:1.2.3.4]:2', a:3]", "2")
		MODEL("    - {name: c, shape: [3], init: const, value: 0.3333333}\n"
		      "    - {name: u, shape: [3], scale: 1e-7}\n")
		"slice_bytes: 1000\nlimits: {max_frame_bytes: 70001, max_meta_bytes: 1025}\n"
		"optimizer: {lr: 1e6, momentum: 0.99999994, weight_decay: -0}\nseed: 0\n";

	ck_assert_msg(load(full_yaml) == 0, "%s", err);
	roundtrip();
	ck_assert_msg(load(odd) == 0, "%s", err);
	roundtrip();
	ck_assert_int_eq(ps_config_load(&cfg, "conf/local.yaml", err, sizeof(err)), 0);
	roundtrip();
	ck_assert_int_eq(ps_config_load(&cfg, "conf/example-full.yaml", err, sizeof(err)), 0);
	roundtrip();
}
END_TEST

/* --dump-config writes every string so that it loads back the same (the
 * derived config ps.sbatch writes is made from it): paths holding '"',
 * '\', ':', '#', '[', leading and trailing spaces, non-ASCII, and what
 * YAML reads as a line break (U+0085, U+2028, U+2029) reload to the same
 * config. A newline, which a path in a file cannot hold (refused) but a
 * path resolved next to the config file could, stays escaped on its line:
 * the reload refuses it naming the key, never reads another config (it
 * used to fold into a space, or make the next line a key of its own). */
START_TEST(test_dump_odd_paths)
{
	static const char odd[] = BASE
		"checkpoint:\n  dir: '/tmp/a\"b\\c: #d'\n"
		"train:\n  data_dir: '  lead and trail  '\n"
		"  metrics_dir: \"/x/\\u00e9\\u4e2d\\U0001F600/\\u0085\\u2028\\u2029/'\"\n"
		"security:\n  secret_file: '/s/#no comment/\"q\"/\\\\/end\\'\n"
		"stats:\n  token_file: '/t/a: b/- c/[d]/{e}/&f *g !h |i >j %k @l `m ''n'''\n";
	char *text;

	ck_assert_msg(load(odd) == 0, "%s", err);
	ck_assert_str_eq(cfg.checkpoint.dir, "/tmp/a\"b\\c: #d");
	ck_assert_str_eq(cfg.train.data_dir, "  lead and trail  ");
	ck_assert_str_eq(cfg.train.metrics_dir,
			 "/x/\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80/\xc2\x85\xe2\x80\xa8\xe2\x80\xa9/'");
	ck_assert_str_eq(cfg.security.secret_file, "/s/#no comment/\"q\"/\\\\/end\\");
	ck_assert_str_eq(cfg.stats.token_file, "/t/a: b/- c/[d]/{e}/&f *g !h |i >j %k @l `m 'n'");
	roundtrip();

	/* a newline (with what would be a key after it) */
	snprintf(cfg.checkpoint.dir, sizeof(cfg.checkpoint.dir), "/tmp/x\nseed: 5");
	text = dump_text();
	ck_assert_msg(strstr(text, "  dir: \"/tmp/x\\nseed: 5\"\n"), "%s", text);
	ck_assert_int_ne(ps_config_load_string(&cfg2, text, "dump.yaml", err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "checkpoint.dir") && strstr(err, "dump.yaml:"), "%s", err);
	free(text);

	/* a secret named next to a config in a folder with such a name: the
	 * resolved path dumps and reloads the same; where the name holds a
	 * newline, the config is refused at load (no file could name that
	 * path, and its dump would not load) */
	static const char *const folders[2] = { "/q\"b\\s: #h", "/nl\nx" };
	char top[] = "/tmp/ps-cfg-XXXXXX", sub[128], file[160];
	ck_assert_ptr_nonnull(mkdtemp(top));
	for (int i = 0; i < 2; i++) {
		snprintf(sub, sizeof(sub), "%s%s", top, folders[i]);
		ck_assert_int_eq(mkdir(sub, 0700), 0);
		snprintf(file, sizeof(file), "%s/c.yaml", sub);
		FILE *f = fopen(file, "w");
		ck_assert_ptr_nonnull(f);
		fputs(BASE "security:\n  secret_file: s\n", f);
		fclose(f);
		int rc = ps_config_load(&cfg, file, err, sizeof(err));
		if (i == 0) {
			ck_assert_msg(rc == 0, "%s", err);
			snprintf(file, sizeof(file), "%s/s", sub);
			ck_assert_str_eq(cfg.security.secret_file, file);
			roundtrip();
		} else {
			ck_assert_int_ne(rc, 0);
			ck_assert_msg(strstr(err, "security.secret_file: resolved next to this file"),
				      "%s", err);
		}
	}
	ck_assert_int_eq(tu_rmtree(top), 0);
}
END_TEST

/* compression.tensors: entries name tensors derived from a preset or layers
 * (the section may come before the model), codec and ratio default to the
 * section's, and the dump lists only the tensors that differ from it. */
START_TEST(test_compression)
{
	static const char mlp[] = CL("[127.0.0.1:7000]", "1")
		"compression:\n  codec: fp16\n  tensors:\n"
		"    - {name: fc1.weight, codec: topk, ratio: 0.05}\n"
		"    - {name: fc2.bias, codec: fp16}\n" /* same as the section: not dumped */
		"    - {name: fc3.bias, codec: topk}\n"
		"model: {preset: mlp}\n";
	static const char layers[] = CL("[127.0.0.1:7000]", "1")
		"model:\n  input: [1, 8, 8]\n  classes: 3\n  layers:\n"
		"    - {type: conv2d, out: 2, kernel: 3}\n    - relu\n    - {type: dense, out: 3}\n"
		"compression: {codec: topk, ratio: 0.5, tensors: [{name: conv1.weight, ratio: 1e-3},\n"
		"  {name: fc1.bias, codec: none}, {name: conv1.bias, ratio: 0.5}]}\n";
	static const char *const names[] = { "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
					     "fc3.weight", "fc3.bias" };
	char *text;
	int t;

	ck_assert_msg(load(mlp) == 0, "%s", err);
	ck_assert_int_eq(cfg.ntensors, 6);
	for (int i = 0; i < 6; i++)
		ck_assert_str_eq(cfg.tensors[i].name, names[i]);
	ck_assert_int_eq(cfg.tensors[0].codec, PS_CODEC_TOPK);
	ck_assert_float_eq(cfg.tensors[0].ratio, 0.05f);
	for (int i = 1; i < 5; i++) {
		ck_assert_int_eq(cfg.tensors[i].codec, PS_CODEC_FP16);
		ck_assert_float_eq(cfg.tensors[i].ratio, 0.01f);
	}
	ck_assert_int_eq(cfg.tensors[5].codec, PS_CODEC_TOPK);
	ck_assert_float_eq(cfg.tensors[5].ratio, 0.01f);
	text = dump_text();
	ck_assert_msg(strstr(text, "compression:\n  codec: fp16\n  ratio: 0.01\n"
			     "  error_feedback: true\n  lz4: auto\n  pull: none\n  tensors:\n"
			     "    - {name: \"fc1.weight\", codec: topk, ratio: 0.05}\n"
			     "    - {name: \"fc3.bias\", codec: topk}\n"), "%s", text);
	free(text);
	roundtrip();

	ck_assert_msg(load(layers) == 0, "%s", err);
	ck_assert_int_eq(cfg.ntensors, 4);
	t = ps_config_find_tensor(&cfg, "conv1.weight");
	ck_assert_int_ge(t, 0);
	ck_assert_int_eq(cfg.tensors[t].codec, PS_CODEC_TOPK);
	ck_assert_float_eq(cfg.tensors[t].ratio, 1e-3f);
	t = ps_config_find_tensor(&cfg, "conv1.bias");
	ck_assert_int_eq(cfg.tensors[t].codec, PS_CODEC_TOPK);
	ck_assert_float_eq(cfg.tensors[t].ratio, 0.5f);
	t = ps_config_find_tensor(&cfg, "fc1.bias");
	ck_assert_int_eq(cfg.tensors[t].codec, PS_CODEC_NONE);
	ck_assert_float_eq(cfg.tensors[t].ratio, 0.5f);
	t = ps_config_find_tensor(&cfg, "fc1.weight");
	ck_assert_int_eq(cfg.tensors[t].codec, PS_CODEC_TOPK);
	ck_assert_float_eq(cfg.tensors[t].ratio, 0.5f);
	roundtrip();

	/* a config without a model keeps its entries for the declared names
	 * (ps_config_declared_codecs; the dump loads back the same); an entry
	 * that names no declared tensor refuses the declaration */
	ck_assert_msg(load(CL("[127.0.0.1:7000]", "1") "compression:\n  codec: q8\n  tensors:\n"
			   "    - {name: w, codec: topk, ratio: 0.25}\n    - {name: b, codec: none}\n")
		      == 0, "%s", err);
	ck_assert_int_eq(cfg.declare, 1);
	ck_assert_int_eq(cfg.ndecl_ovr, 2);
	text = dump_text();
	ck_assert_msg(strstr(text, "  tensors:\n    - {name: \"w\", codec: topk, ratio: 0.25}\n"
			     "    - {name: \"b\", codec: none}\n"), "%s", text);
	free(text);
	roundtrip();
	{
		char why[300];
		static const char *const dn[] = { "x", "w", "b" };

		cfg.ntensors = 3;
		for (int i = 0; i < 3; i++) {
			memset(&cfg.tensors[i], 0, sizeof(cfg.tensors[i]));
			strcpy(cfg.tensors[i].name, dn[i]);
		}
		ck_assert_int_eq(ps_config_declared_codecs(&cfg, why, sizeof(why)), 0);
		ck_assert_int_eq(cfg.tensors[0].codec, PS_CODEC_Q8);
		ck_assert_int_eq(cfg.tensors[1].codec, PS_CODEC_TOPK);
		ck_assert_float_eq(cfg.tensors[1].ratio, 0.25f);
		ck_assert_int_eq(cfg.tensors[2].codec, PS_CODEC_NONE);
		strcpy(cfg.tensors[2].name, "bias");
		ck_assert_int_eq(ps_config_declared_codecs(&cfg, why, sizeof(why)), PS_ECONFIG);
		ck_assert_msg(strstr(why, "t.yaml: compression.tensors[1] names 'b', which is not a "
				     "declared tensor"), "%s", why);
	}

	/* no entries: the dump says so, and an empty list loads */
	ck_assert_msg(load(BASE "compression: {tensors: []}\n") == 0, "%s", err);
	ck_assert_int_eq(cfg.tensors[0].codec, PS_CODEC_NONE);
	text = dump_text();
	ck_assert_msg(strstr(text, "  pull: none\n  tensors: []\n"), "%s", text);
	free(text);
	roundtrip();
}
END_TEST

/* ctr's fields: one table for all, one per field, or lists (dims may
 * differ, a table may serve other clients with fields: []); the input is
 * the bags' width plus the 13 numeric features, and the dump loads back
 * the same fields. */
START_TEST(test_ctr_fields)
{
	char y[4096];
	int n = snprintf(y, sizeof(y), CTR(""));

	ck_assert_msg(load(CTR("    - {name: a, dim: 8}\n")) == 0, "%s", err);
	ck_assert_uint_eq(cfg.tables[0].fields, (1u << 26) - 1);
	ck_assert_int_eq(cfg.model.input[2], 26 * 8 + 13);
	roundtrip();
	/* 26 tables, dims 1..26: field i in table i */
	for (int t = 0; t < 26; t++)
		n += snprintf(y + n, sizeof(y) - (size_t)n, "    - {name: t%d, dim: %d}\n", t, t + 1);
	ck_assert_msg(load(y) == 0, "%s", err);
	for (int t = 0; t < 26; t++)
		ck_assert_uint_eq(cfg.tables[t].fields, 1u << t);
	ck_assert_int_eq(cfg.model.input[2], 26 * 27 / 2 + 13);
	roundtrip();
	ck_assert_msg(load(CTR("    - {name: probe, dim: 2, fields: []}\n"
			       "    - {name: b, dim: 4, fields: " F13_25 "}\n"
			       "    - {name: a, dim: 16, fields: [12, 11, 10, 9, 8, 7, 6, 5, 4, 3, "
			       "2, 1, 0]}\n")) == 0, "%s", err);
	ck_assert_uint_eq(cfg.tables[0].fields, 0);
	ck_assert_uint_eq(cfg.tables[1].fields, ((1u << 13) - 1) << 13);
	ck_assert_uint_eq(cfg.tables[2].fields, (1u << 13) - 1);
	ck_assert_int_eq(cfg.model.input[2], 13 * 4 + 13 * 16 + 13);
	ck_assert_int_eq(cfg.tensors[0].count, 256 * (13 * 4 + 13 * 16 + 13)); /* fc1: in x 256 */
	roundtrip();
}
END_TEST

/* Models from presets and layer lists: the tensors the shards hold are
 * derived from the layers, with He-uniform weights and zero biases. */
START_TEST(test_model)
{
	static const char cnn[] = CL("[127.0.0.1:7000, 127.0.0.1:7001]", "2")
		"model: {preset: cnn}\n"
		"train: {batch: 32, epochs: 3, limit: 6000, device: cpu, threads: 3, data_dir: /d, "
		"metrics_dir: '', pull: step}\n";
	static const char layers[] = CL("[127.0.0.1:7000]", "1")
		"model:\n  input: [3, 8, 8]\n  classes: 4\n  layers:\n"
		"    - {type: conv2d, out: 2, kernel: 3, pad: 1, stride: 2}\n"
		"    - relu\n    - {type: maxpool, size: 2}\n    - flatten\n"
		"    - {type: dense, out: 4}\n";
	static const int64_t counts[] = { 800, 32, 51200, 64, 3136 * 256, 256, 2560, 10 };

	ck_assert_msg(load(cnn) == 0, "%s", err);
	ck_assert_str_eq(cfg.model.preset, "cnn");
	ck_assert_int_eq(cfg.model.nlayers, 10);
	ck_assert_int_eq(cfg.ntensors, 8);
	for (int i = 0; i < 8; i++)
		ck_assert_int_eq(cfg.tensors[i].count, counts[i]);
	ck_assert_str_eq(cfg.tensors[0].name, "conv1.weight");
	ck_assert_str_eq(cfg.tensors[7].name, "fc2.bias");
	ck_assert_int_eq(cfg.tensors[0].init, PS_INIT_UNIFORM);
	ck_assert_float_eq_tol(cfg.tensors[0].init_value, 0.489898f, 1e-5f); /* sqrt(6/25) */
	ck_assert_float_eq_tol(cfg.tensors[4].init_value, 0.043741f, 1e-5f); /* sqrt(6/3136) */
	ck_assert_int_eq(cfg.tensors[1].init, PS_INIT_ZEROS);
	ck_assert_int_eq(cfg.train.batch, 32);
	ck_assert_int_eq(cfg.train.epochs, 3);
	ck_assert_int_eq(cfg.train.train_limit, 6000);
	ck_assert_int_eq(cfg.train.device, PS_DEVICE_CPU);
	ck_assert_int_eq(cfg.train.threads, 3);
	ck_assert_int_eq(cfg.train.pull, PS_PULL_STEP);
	ck_assert_str_eq(cfg.train.data_dir, "/d");
	ck_assert_str_eq(cfg.train.metrics_dir, "");
	roundtrip();

	ck_assert_msg(load(layers) == 0, "%s", err);
	ck_assert_str_eq(cfg.model.preset, "");
	ck_assert_int_eq(cfg.model.nlayers, 5);
	ck_assert_int_eq(cfg.model.layers[0].stride, 2);
	ck_assert_int_eq(cfg.model.layers[2].size, 2);
	ck_assert_int_eq(cfg.ntensors, 4);
	ck_assert_int_eq(cfg.tensors[0].count, 2 * 3 * 3 * 3); /* conv weight */
	ck_assert_int_eq(cfg.tensors[2].count, 2 * 2 * 2 * 4); /* 8x8 -s2-> 4x4 -pool-> 2x2 */
	roundtrip();

	/* defaults: the Debian dataset, batch 64, one epoch, device auto */
	ck_assert_msg(load(CL("[127.0.0.1:7000]", "1") "model: {preset: mlp}\n") == 0, "%s", err);
	ck_assert_int_eq(cfg.ntensors, 6);
	ck_assert_str_eq(cfg.train.data_dir, "/usr/share/datasets/fashion-mnist");
	ck_assert_int_eq(cfg.train.batch, 64);
	ck_assert_int_eq(cfg.train.device, PS_DEVICE_AUTO);
	ck_assert_int_eq(cfg.train.threads, 0);  /* auto */
	ck_assert_int_eq(cfg.train.pull, PS_PULL_LAYER);
	ck_assert_int_eq(cfg.model.input[1], 28);

	/* replicas with embedding tables: the tables are replicated too */
	ck_assert_msg(load(CL("[127.0.0.1:7000]", "1") "  backups: [127.0.0.1:7100]\n"
			   "  replicas: 1\nmodel:\n  tensors:\n    - {name: w, shape: [4]}\n"
			   "  embeddings:\n    - {name: user, dim: 4}\n") == 0, "%s", err);
	ck_assert_int_eq(cfg.replicas, 1);
	ck_assert_int_eq(cfg.ntables, 1);
	roundtrip();
}
END_TEST

START_TEST(test_help)
{
	static const char *const keys[] = {
		"cluster.servers", "cluster.workers", "cluster.listen_any", "transport",
		"consistency.mode",
		"consistency.staleness", "seed", "slice_bytes", "model.tensors",
		"model.tensors[].name", "model.tensors[].shape", "model.tensors[].init",
		"model.tensors[].scale", "model.tensors[].value", "optimizer.name", "optimizer.lr",
		"optimizer.momentum", "optimizer.nesterov", "optimizer.beta1", "optimizer.beta2",
		"optimizer.eps", "optimizer.weight_decay", "optimizer.initial_accumulator",
		"limits.max_frame_bytes", "limits.max_meta_bytes", "limits.connect_timeout_ms",
		"limits.request_timeout_ms", "limits.handshake_timeout_ms",
		"limits.max_clock_ahead", "limits.max_connections", "stats.http", "log.level",
		"model.embeddings[].fields", "model.embeddings[].max_rows",
		"compression.codec", "compression.ratio", "compression.error_feedback",
		"compression.lz4", "compression.pull", "compression.tensors",
		"compression.tensors[].name", "compression.tensors[].codec",
		"compression.tensors[].ratio", "one of none, fp16, q8, topk, sign; default none",
		"one of off, on, auto; default auto", "one of none, fp16; default none",
		"an integer in 1..4096; required", "one of sync, async; default sync",
		"a number in (0, 1e+06]; default 0.01", "default 64MiB", "4KiB..16GiB",
	};
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);

	ps_config_help(f);
	fclose(f);
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		ck_assert_msg(strstr(text, keys[i]), "help lacks '%s'", keys[i]);
	free(text);
}
END_TEST

struct ecase {
	const char *what, *yaml, *want[4];
};

static const struct ecase ecases[] = {
	/* unknown keys */
	{ "unknown key, suggestion", BASE "optimizer:\n  lrr: 0.1\n",
	  { "t.yaml:8: unknown key 'optimizer.lrr'; did you mean 'optimizer.lr'?" } },
	{ "unknown top key", BASE "optimiser:\n  lr: 0.1\n",
	  { "t.yaml:7: unknown key 'optimiser'; did you mean 'optimizer'?" } },
	{ "unknown key, list", BASE "optimizer:\n  zzzzzzzzzz: 1\n",
	  { "t.yaml:8: unknown key 'optimizer.zzzzzzzzzz'; valid keys here: name, lr, momentum,",
	    "initial_accumulator" } },
	{ "unknown tensor key", CL("[a:1]", "1") MODEL("    - {name: w, shap: [4]}\n"),
	  { "t.yaml:6: unknown key 'model.tensors[0].shap'; did you mean 'model.tensors[0].shape'?" } },
	{ "unknown limits key", BASE "limits:\n  max_conections: 3\n",
	  { "t.yaml:8: unknown key 'limits.max_conections'; did you mean 'limits.max_connections'?" } },
	/* integers */
	{ "bad int", CL("[a:1]", "12abc") MODEL(T1),
	  { "t.yaml:3: key 'cluster.workers': expected an integer in 1..4096, got '12abc'" } },
	{ "int overflow", CL("[a:1]", "99999999999999999999") MODEL(T1),
	  { "t.yaml:3: key 'cluster.workers': expected an integer", "got '99999999999999999999'" } },
	{ "int above max", CL("[a:1]", "5000") MODEL(T1),
	  { "t.yaml:3: key 'cluster.workers': expected an integer in 1..4096, got '5000'" } },
	{ "int below min", CL("[a:1]", "0") MODEL(T1), { "t.yaml:3:", "1..4096, got '0'" } },
	{ "int empty", CL("[a:1]", "") MODEL(T1), { "t.yaml:3:", "cluster.workers", "got ''" } },
	{ "int float", CL("[a:1]", "1.5") MODEL(T1), { "t.yaml:3:", "got '1.5'" } },
	{ "int mapping", CL("[a:1]", "{a: 1}") MODEL(T1),
	  { "t.yaml:3: key 'cluster.workers': expected an integer in 1..4096, got a mapping" } },
	{ "staleness", BASE "consistency:\n  staleness: 1000001\n",
	  { "t.yaml:8: key 'consistency.staleness': expected an integer in 0..1000000" } },
	{ "timeout zero", BASE "limits:\n  request_timeout_ms: 0\n",
	  { "t.yaml:8: key 'limits.request_timeout_ms': expected an integer in 1..86400000, got '0'" } },
	{ "write queue below a frame", BASE "limits:\n  max_frame_bytes: 2MiB\n"
	  "  max_write_queue_bytes: 1MiB\n",
	  { "t.yaml:9: key 'limits.max_write_queue_bytes': expected at least "
	    "limits.max_frame_bytes = 2MiB, got '1MiB'" } },
	{ "seed negative", BASE "seed: -1\n",
	  { "t.yaml:7: key 'seed': expected an integer in 0..18446744073709551615, got '-1'" } },
	{ "seed overflow", BASE "seed: 18446744073709551616\n",
	  { "t.yaml:7: key 'seed'", "got '18446744073709551616'" } },
	/* floats */
	{ "float nan", BASE "optimizer:\n  lr: .nan\n",
	  { "t.yaml:8: key 'optimizer.lr': expected a number in (0, 1e+06], got '.nan'" } },
	{ "float nan word", BASE "optimizer:\n  lr: nan\n", { "t.yaml:8:", "got 'nan'" } },
	{ "float inf", BASE "optimizer:\n  lr: inf\n", { "t.yaml:8:", "got 'inf'" } },
	{ "float huge", BASE "optimizer:\n  lr: 1e999\n", { "t.yaml:8:", "got '1e999'" } },
	{ "float junk", BASE "optimizer:\n  lr: 0.1x\n", { "t.yaml:8:", "got '0.1x'" } },
	{ "float open min", BASE "optimizer:\n  lr: 0\n",
	  { "t.yaml:8: key 'optimizer.lr': expected a number in (0, 1e+06], got '0'" } },
	{ "float open max", BASE "optimizer:\n  momentum: 1\n",
	  { "t.yaml:8: key 'optimizer.momentum': expected a number in [0, 1), got '1'" } },
	{ "float rounds to max", BASE "optimizer:\n  beta2: 0.999999999\n",
	  { "t.yaml:8: key 'optimizer.beta2'", "got '0.999999999'" } },
	{ "float negative", BASE "optimizer:\n  weight_decay: -0.1\n",
	  { "t.yaml:8: key 'optimizer.weight_decay': expected a number in [0, 1000]" } },
	/* enums and bools */
	{ "bad enum", BASE "consistency:\n  mode: eventual\n",
	  { "t.yaml:8: key 'consistency.mode': expected one of sync, async, got 'eventual'" } },
	{ "bad optimizer", BASE "optimizer:\n  name: rmsprop\n",
	  { "t.yaml:8: key 'optimizer.name': expected one of sgd, momentum, adam, adagrad, "
	    "adamw, got 'rmsprop'" } },
	{ "bad log level", BASE "log:\n  level: verbose\n",
	  { "t.yaml:8: key 'log.level': expected one of debug, info, warn, error, off, "
	    "got 'verbose'" } },
	{ "bad transport", BASE "transport: udp\n",
	  { "t.yaml:7: key 'transport': expected one of tcp, rdma, got 'udp'" } },
	{ "bad init", CL("[a:1]", "1") MODEL("    - {name: w, shape: [4], init: random}\n"),
	  { "t.yaml:6: key 'model.tensors[0].init': expected one of zeros, const, uniform, "
	    "normal, arange, got 'random'" } },
	{ "bad bool", BASE "optimizer:\n  nesterov: maybe\n",
	  { "t.yaml:8: key 'optimizer.nesterov': expected a boolean", "got 'maybe'" } },
	/* sizes */
	{ "bad size suffix", BASE "slice_bytes: 4MB\n",
	  { "t.yaml:7: key 'slice_bytes': expected a size in 64..1GiB bytes "
	    "(suffix K, KiB, M, MiB, G, GiB allowed), got '4MB'" } },
	{ "size lowercase", BASE "slice_bytes: 4kb\n", { "t.yaml:7:", "got '4kb'" } },
	{ "size overflow", BASE "slice_bytes: 99999999999999999999G\n",
	  { "t.yaml:7:", "got '99999999999999999999G'" } },
	{ "size multiply overflow", BASE "slice_bytes: 18014398509481984K\n",
	  { "t.yaml:7:", "got '18014398509481984K'" } },
	{ "size negative", BASE "slice_bytes: -4K\n", { "t.yaml:7:", "got '-4K'" } },
	{ "size below min", BASE "slice_bytes: 32\n", { "t.yaml:7:", "64..1GiB", "got '32'" } },
	{ "meta above max", BASE "limits:\n  max_meta_bytes: 65MiB\n",
	  { "t.yaml:8: key 'limits.max_meta_bytes': expected a size in 1KiB..64MiB" } },
	/* addresses */
	{ "bad address", CL("[bad host:7000]", "1") MODEL(T1),
	  { "t.yaml:2: key 'cluster.servers[0]': expected host:port", "got 'bad host:7000'",
	    "invalid character in host" } },
	{ "missing port", CL("[127.0.0.1]", "1") MODEL(T1),
	  { "t.yaml:2: key 'cluster.servers[0]': expected host:port", "got '127.0.0.1'",
	    "(missing port)" } },
	{ "empty port", CL("['127.0.0.1:']", "1") MODEL(T1), { "t.yaml:2:", "missing port" } },
	{ "port range", CL("[127.0.0.1:70000]", "1") MODEL(T1),
	  { "t.yaml:2:", "got '127.0.0.1:70000'", "port out of 1..65535" } },
	{ "port zero", CL("[h:0]", "1") MODEL(T1), { "t.yaml:2:", "port out of 1..65535" } },
	{ "port name", CL("[h:http]", "1") MODEL(T1), { "t.yaml:2:", "port is not a number" } },
	{ "empty host", CL("[':80']", "1") MODEL(T1), { "t.yaml:2:", "empty host" } },
	{ "ipv6 no brackets", CL("['::1:7000']", "1") MODEL(T1),
	  { "t.yaml:2:", "brackets, e.g. [::1]:7000" } },
	{ "ipv6 bad", CL("['[zz::1]:7000']", "1") MODEL(T1), { "t.yaml:2:", "not an IPv6 address" } },
	{ "ipv6 no port", CL("['[::1]']", "1") MODEL(T1), { "t.yaml:2:", "missing port" } },
	{ "ipv6 no bracket end", CL("['[::1:7000']", "1") MODEL(T1), { "t.yaml:2:", "missing ']'" } },
	{ "bad ipv4", CL("[300.1.1.1:7000]", "1") MODEL(T1), { "t.yaml:2:", "not an IPv4 address" } },
	{ "duplicate server", CL("[a:1, b:2, a:1]", "1") MODEL(T1),
	  { "t.yaml:2: key 'cluster.servers[2]': duplicate server address 'a:1' (also shard 0)" } },
	{ "servers scalar", CL("127.0.0.1:7000", "1") MODEL(T1),
	  { "t.yaml:2: key 'cluster.servers': expected a list of 1..256 host:port addresses, "
	    "got '127.0.0.1:7000'" } },
	{ "servers empty", CL("[]", "1") MODEL(T1),
	  { "t.yaml:2: key 'cluster.servers'", "got a list (wrong number of entries)" } },
	/* replicas: backups named, one per shard, none a servers address */
	{ "replicas without backups", CL("[a:1, b:2]", "1") "  replicas: 1\n" MODEL(T1),
	  { "t.yaml:4: key 'cluster.backups': cluster.replicas: 1 needs one backup address per "
	    "shard (2), got 0" } },
	{ "too few backups", CL("[a:1, b:2]", "1") "  backups: [c:1]\n  replicas: 1\n" MODEL(T1),
	  { "t.yaml:4: key 'cluster.backups'", "needs one backup address per shard (2), got 1" } },
	{ "backups without replicas", CL("[a:1, b:2]", "1") "  backups: [c:1, d:1]\n" MODEL(T1),
	  { "t.yaml:4: key 'cluster.backups': given, but cluster.replicas is 0" } },
	{ "backup is a server", CL("[a:1, b:2]", "1") "  backups: [b:2, d:1]\n  replicas: 1\n"
	  MODEL(T1), { "t.yaml:4: key 'cluster.backups[0]': b:2 is also cluster.servers[1]" } },
	{ "duplicate backup", CL("[a:1, b:2]", "1") "  backups: [c:1, c:1]\n  replicas: 1\n"
	  MODEL(T1), { "t.yaml:4: key 'cluster.backups[1]': duplicate server address 'c:1' "
		       "(also backup 0)" } },
	/* ctr: which table each categorical field bags from */
	{ "ctr without tables", CL("[a:1]", "1") "model:\n  preset: ctr\n",
	  { "t.yaml:5: key 'model.preset': ctr bags its categorical fields from embedding "
	    "tables: give 'model.embeddings'" } },
	{ "ctr with 2 tables, no fields", CTR("    - {name: a, dim: 4}\n    - {name: b, dim: 4}\n"),
	  { "t.yaml:7: key 'model.embeddings': ctr with 2 tables: give 1 table", "26 (field i "
	    "from table i), or 'fields' on each table" } },
	{ "ctr table without fields", CTR("    - {name: a, dim: 4, fields: " F0_12 "}\n"
					  "    - {name: b, dim: 4, fields: " F13_25 "}\n"
					  "    - {name: c, dim: 4}\n"),
	  { "t.yaml:9: key 'model.embeddings[2]': table 'c' has no 'fields' while table 'b' has "
	    "(line 8)", "or 'fields: []' for a table the ctr model does not use" } },
	{ "ctr field in two tables", CTR("    - {name: a, dim: 4, fields: " F0_12 "}\n"
					 "    - {name: b, dim: 4, fields: [12, 13]}\n"),
	  { "t.yaml:8: key 'model.embeddings[1].fields': field 12 is already in table 'a' "
	    "(line 7)" } },
	{ "ctr fields uncovered", CTR("    - {name: a, dim: 4, fields: " F0_12 "}\n"
				      "    - {name: b, dim: 4, fields: [13, 14, 15, 16, 17, 18, "
				      "19, 20, 21, 22, 24]}\n"),
	  { "t.yaml:7: key 'model.embeddings': fields 23, 25 in no table's 'fields'; each of "
	    "the fields 0..25 bags from exactly one table" } },
	{ "ctr field out of range", CTR("    - {name: a, dim: 4, fields: [0, 26]}\n"),
	  { "t.yaml:7: key 'model.embeddings[0].fields[1]': expected a categorical field number "
	    "0..25, got '26'" } },
	{ "ctr field repeated", CTR("    - {name: a, dim: 4, fields: [3, 1, 3]}\n"),
	  { "t.yaml:7: key 'model.embeddings[0].fields[2]': field 3 is listed twice" } },
	{ "ctr fields not a list", CTR("    - {name: a, dim: 4, fields: 3}\n"),
	  { "t.yaml:7: key 'model.embeddings[0].fields': expected a list of distinct field "
	    "numbers 0..25, got '3'" } },
	{ "fields without ctr", BASE "  embeddings:\n    - {name: a, dim: 4}\n"
	  "    - name: b\n      dim: 4\n      fields: [1]\n",
	  { "t.yaml:11: key 'model.embeddings[1].fields': only the ctr preset bags fields from "
	    "tables (model.preset is 'none')" } },
	{ "replicas 2", CL("[a:1]", "1") "  backups: [c:1]\n  replicas: 2\n" MODEL(T1),
	  { "t.yaml:5: key 'cluster.replicas'", "0..1", "got '2'" } },
	{ "replication timeout too short", CL("[a:1]", "1") "  backups: [c:1]\n  replicas: 1\n"
	  "replication:\n  timeout_ms: 50\n" MODEL(T1),
	  { "t.yaml:7: key 'replication.timeout_ms'", "got '50'" } },
	{ "server is a list", CL("[[1, 2]]", "1") MODEL(T1),
	  { "t.yaml:2: key 'cluster.servers[0]': expected host:port", "got a list" } },
	{ "stats.http", BASE "stats:\n  http: localhost\n",
	  { "t.yaml:8: key 'stats.http': expected host:port", "got 'localhost' (missing port)" } },
	/* tensors */
	{ "duplicate tensor", CL("[a:1]", "1") MODEL(T1 "    - {name: x, shape: [1]}\n"
						    "    - name: w\n      shape: [5]\n"),
	  { "t.yaml:8: key 'model.tensors[2].name': duplicate tensor name 'w' (first at line 6)" } },
	{ "bad tensor name", CL("[a:1]", "1") MODEL("    - {name: 'w x', shape: [4]}\n"),
	  { "t.yaml:6: key 'model.tensors[0].name': expected a name of 1..63 characters",
	    "got 'w x'" } },
	{ "long tensor name", CL("[a:1]", "1") MODEL("    - {name: "
		"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa, shape: [4]}\n"),
	  { "t.yaml:6: key 'model.tensors[0].name'", "got 'aaaaaaaaaa" } },
	{ "empty tensor name", CL("[a:1]", "1") MODEL("    - {name: '', shape: [4]}\n"),
	  { "t.yaml:6: key 'model.tensors[0].name'", "got ''" } },
	{ "shape zero", CL("[a:1]", "1") MODEL("    - {name: w, shape: [4, 0]}\n"),
	  { "t.yaml:6: key 'model.tensors[0].shape[1]': expected a positive integer up to 2^34, "
	    "got '0'" } },
	{ "shape junk", CL("[a:1]", "1") MODEL("    - {name: w, shape: [4, x]}\n"),
	  { "t.yaml:6:", "shape[1]", "got 'x'" } },
	{ "shape empty", CL("[a:1]", "1") MODEL("    - {name: w, shape: []}\n"),
	  { "t.yaml:6: key 'model.tensors[0].shape': expected a list of 1..8 positive integers",
	    "wrong number of entries" } },
	{ "shape 9 dims", CL("[a:1]", "1") MODEL("    - {name: w, shape: [1,1,1,1,1,1,1,1,1]}\n"),
	  { "t.yaml:6: key 'model.tensors[0].shape'", "wrong number of entries" } },
	{ "shape too big", CL("[a:1]", "1") MODEL("    - {name: w, shape: [131072, 131072, 2]}\n"),
	  { "t.yaml:6: key 'model.tensors[0].shape': expected at most 2^34 elements" } },
	{ "shape scalar", CL("[a:1]", "1") MODEL("    - {name: w, shape: 4}\n"),
	  { "t.yaml:6: key 'model.tensors[0].shape': expected a list of 1..8 positive integers, "
	    "got '4'" } },
	{ "tensor not mapping", CL("[a:1]", "1") MODEL("    - w\n"),
	  { "t.yaml:6: key 'model.tensors[0]': expected a mapping with name and shape, got 'w'" } },
	{ "tensor missing shape", CL("[a:1]", "1") MODEL(T1 "    - {name: v}\n"),
	  { "t.yaml:7: missing required key 'model.tensors[1].shape'" } },
	{ "tensor missing name", CL("[a:1]", "1") MODEL("    - {shape: [3]}\n"),
	  { "t.yaml:6: missing required key 'model.tensors[0].name'" } },
	{ "scale with const", CL("[a:1]", "1")
		MODEL("    - {name: w, shape: [4], init: const, scale: 1}\n"),
	  { "t.yaml:6: key 'model.tensors[0].scale': not used by init 'const' (use 'value')" } },
	{ "value with uniform", CL("[a:1]", "1") MODEL("    - {name: w, shape: [4], value: 1}\n"),
	  { "t.yaml:6: key 'model.tensors[0].value': not used by init 'uniform' (use 'scale')" } },
	{ "tensors empty", CL("[a:1]", "1") MODEL("    []\n"),
	  { "t.yaml:6: key 'model.tensors': expected a list of 1..8192 mappings",
	    "wrong number of entries" } },
	{ "tensors mapping", CL("[a:1]", "1") MODEL("    w: 1\n"),
	  { "t.yaml:6: key 'model.tensors': expected a list", "got a mapping" } },
	/* required keys */
	{ "missing servers", "cluster:\n  workers: 1\n" MODEL(T1),
	  { "t.yaml:1: missing required key 'cluster.servers'" } },
	{ "missing workers", "model:\n  tensors:\n" T1 "cluster:\n  servers: [a:1]\n",
	  { "t.yaml:4: missing required key 'cluster.workers'" } },
	{ "missing cluster", "seed: 1\n" MODEL(T1),
	  { "t.yaml:1: missing required key 'cluster.servers'" } },
	/* no model: the workers declare it (ps_client_declare); per-tensor
	 * codecs are kept for the declared names, and what needs no tensor is
	 * checked at once */
	{ "no model with a codec override's stray ratio", CL("[a:1]", "1") "compression:\n  tensors:\n"
	  "    - {name: w, codec: fp16, ratio: 0.5}\n",
	  { "t.yaml:6: key 'compression.tensors[0].ratio': only topk uses a ratio" } },
	/* checks across options */
	{ "slice not multiple of 4", BASE "slice_bytes: 1001\n",
	  { "t.yaml:7: key 'slice_bytes': expected a multiple of 4, got '1001'" } },
	{ "frame smaller than slice", BASE "slice_bytes: 1MiB\nlimits:\n  max_frame_bytes: 1MiB\n",
	  { "t.yaml:9: key 'limits.max_frame_bytes': expected at least slice_bytes + 64KiB = "
	    "1114112 (slice_bytes is 1MiB), got '1MiB'" } },
	{ "default frame smaller than slice", BASE "slice_bytes: 1GiB\n",
	  { "t.yaml:7: key 'limits.max_frame_bytes': expected at least slice_bytes + 64KiB",
	    "(slice_bytes is 1GiB)", "got '64MiB' (default)" } },
	/* structure */
	{ "duplicate key", CL("[a:1]", "1") "  workers: 2\n" MODEL(T1),
	  { "t.yaml:4: duplicate key 'cluster.workers' (first at line 3)" } },
	{ "duplicate section", BASE "cluster:\n  seed: 2\n",
	  { "t.yaml:7: duplicate key 'cluster' (first at line 1)" } },
	{ "duplicate top key", BASE "seed: 1\nseed: 2\n",
	  { "t.yaml:8: duplicate key 'seed' (first at line 7)" } },
	{ "section is a list", BASE "optimizer: [1, 2]\n",
	  { "t.yaml:7: key 'optimizer': expected a mapping, got a list" } },
	{ "section is a scalar", BASE "optimizer: sgd\n",
	  { "t.yaml:7: key 'optimizer': expected a mapping, got 'sgd'" } },
	{ "complex key", BASE "? [a, b]\n: 1\n", { "t.yaml:7: expected a plain key, got a list" } },
	{ "syntax error", BASE "optimizer: [1, 2\n",
	  { "t.yaml:8: YAML syntax error: did not find expected ',' or ']'",
	    "while parsing a flow sequence at line 7" } },
	{ "bad indentation", "cluster:\n  servers: [a:1]\n workers: 1\n",
	  { "t.yaml:3: YAML syntax error" } },
	{ "tab indentation", "cluster:\n\tworkers: 1\n", { "t.yaml:2: YAML syntax error" } },
	{ "top-level list", "- a\n- b\n",
	  { "t.yaml:1: expected a mapping of sections at the top level, got a list" } },
	{ "top-level scalar", "hello\n",
	  { "t.yaml:1: expected a mapping of sections at the top level, got 'hello'" } },
	{ "empty file", "", { "t.yaml:1: empty configuration" } },
	{ "only comments", "# nothing here\n\n", { "t.yaml:1: empty configuration" } },
	{ "only a document marker", "---\n", { "t.yaml:1: empty configuration" } },
	{ "alias", BASE "seed: &s 5\nlog: *s\n",
	  { "t.yaml:8: YAML aliases (*s) are not supported" } },
	{ "two documents", BASE "---\nseed: 1\n",
	  { "t.yaml:7: more than one YAML document" } },
	{ "NUL in scalar", BASE "seed: \"1\\0\"\n", { "t.yaml:7: NUL character in a scalar" } },
	{ "preset and layers", CL("[a:1]", "1") "model: {preset: mlp, layers: [relu]}\n",
	  { "t.yaml:4: key 'model.layers': give either 'model.preset' (line 4)" } },
	{ "preset and tensors", CL("[a:1]", "1") "model:\n  preset: cnn\n  tensors:\n" T1,
	  { "t.yaml:7: key 'model.tensors': the tensors are derived", "(line 5)" } },
	{ "unknown preset", CL("[a:1]", "1") "model: {preset: resnet}\n",
	  { "t.yaml:4: key 'model.preset': expected one of none, mlp, cnn, ctr, got 'resnet'" } },
	{ "unknown layer", CL("[a:1]", "1") "model:\n  layers: [flatten, softmax]\n",
	  { "t.yaml:5: key 'model.layers[1]': expected a layer type", "got 'softmax'" } },
	{ "layer key not used", CL("[a:1]", "1") "model:\n  layers: [{type: relu, out: 3}]\n",
	  { "t.yaml:5: key 'model.layers[0].out': not used by a relu layer" } },
	{ "conv without kernel", CL("[a:1]", "1") "model:\n  layers: [{type: conv2d, out: 3}]\n",
	  { "t.yaml:5: missing key 'model.layers[0].kernel' (a conv2d layer needs it" } },
	{ "layer without type", CL("[a:1]", "1") "model:\n  layers: [{out: 3}]\n",
	  { "t.yaml:5: missing required key 'model.layers[0].type'" } },
	{ "last layer not classes", CL("[a:1]", "1") "model:\n  layers: [{type: dense, out: 7}]\n",
	  { "t.yaml:5: model.layers: ", "7", "10 classes" } },
	{ "kernel larger than input", CL("[a:1]", "1")
	  "model:\n  input: [1, 4, 4]\n  layers: [{type: conv2d, out: 2, kernel: 9}, flatten, "
	  "{type: dense, out: 10}]\n", { "t.yaml:6: model.layers: layer 1" } },
	{ "input not 3 dims", CL("[a:1]", "1") "model: {preset: mlp, input: [28, 28]}\n",
	  { "t.yaml:4: key 'model.input': expected a list of 3 positive integers" } },
	{ "batch zero", CL("[a:1]", "1") "model: {preset: mlp}\ntrain: {batch: 0}\n",
	  { "t.yaml:5: key 'train.batch': expected an integer in 1..65536, got '0'" } },
	{ "threads negative", CL("[a:1]", "1") "model: {preset: mlp}\ntrain: {threads: -1}\n",
	  { "t.yaml:5: key 'train.threads': expected an integer in 0..1024, got '-1'" } },
	{ "pull when", CL("[a:1]", "1") "model: {preset: mlp}\ntrain: {pull: epoch}\n",
	  { "t.yaml:5: key 'train.pull': expected one of layer, step, got 'epoch'" } },
	{ "device", CL("[a:1]", "1") "model: {preset: mlp}\ntrain: {device: tpu}\n",
	  { "t.yaml:5: key 'train.device': expected one of auto, cpu, cuda, got 'tpu'" } },
	/* compression */
	{ "bad codec", BASE "compression:\n  codec: zip\n",
	  { "t.yaml:8: key 'compression.codec': expected one of none, fp16, q8, topk, sign, "
	    "got 'zip'" } },
	{ "ratio zero", BASE "compression:\n  ratio: 0\n",
	  { "t.yaml:8: key 'compression.ratio': expected a number in (0, 1], got '0'" } },
	{ "ratio above one", BASE "compression:\n  ratio: 1.5\n",
	  { "t.yaml:8: key 'compression.ratio': expected a number in (0, 1], got '1.5'" } },
	{ "bad lz4", BASE "compression: {lz4: fast}\n",
	  { "t.yaml:7: key 'compression.lz4': expected one of off, on, auto, got 'fast'" } },
	{ "bad error_feedback", BASE "compression: {error_feedback: some}\n",
	  { "t.yaml:7: key 'compression.error_feedback': expected a boolean", "got 'some'" } },
	{ "pull topk", BASE "compression:\n  pull: topk\n",
	  { "t.yaml:8: key 'compression.pull': expected one of none, fp16, got 'topk' (q8, topk "
	    "and sign are for pushed gradients, not pulled weights)" } },
	{ "pull junk", BASE "compression:\n  pull: gzip\n",
	  { "t.yaml:8: key 'compression.pull': expected one of none, fp16, got 'gzip'" } },
	{ "unknown compression key", BASE "compression:\n  ratoi: 0.1\n",
	  { "t.yaml:8: unknown key 'compression.ratoi'; did you mean 'compression.ratio'?" } },
	{ "override unknown tensor", CL("[a:1]", "1") "model: {preset: mlp}\n"
	  "compression:\n  tensors:\n    - {name: fc1.weigth, codec: topk}\n",
	  { "t.yaml:7: key 'compression.tensors[0].name': no tensor 'fc1.weigth' in the model; "
	    "did you mean 'fc1.weight'?" } },
	{ "override unknown tensor, list", BASE "compression:\n  tensors:\n"
	  "    - {name: w}\n    - {name: embedding, codec: fp16}\n",
	  { "t.yaml:10: key 'compression.tensors[1].name': no tensor 'embedding' in the model; "
	    "its tensors are w" } },
	{ "override duplicate", CL("[a:1]", "1") "model: {preset: mlp}\n"
	  "compression:\n  tensors:\n    - {name: fc1.weight, codec: topk}\n"
	  "    - {name: fc2.weight, codec: q8}\n    - name: fc1.weight\n      codec: sign\n",
	  { "t.yaml:9: key 'compression.tensors[2].name': duplicate entry for tensor "
	    "'fc1.weight' (first at line 7)" } },
	{ "override ratio, not topk", CL("[a:1]", "1") "model: {preset: mlp}\n"
	  "compression:\n  codec: topk\n  tensors:\n"
	  "    - name: fc1.weight\n      codec: fp16\n      ratio: 0.5\n",
	  { "t.yaml:10: key 'compression.tensors[0].ratio': only topk uses a ratio (this "
	    "tensor's codec is fp16)" } },
	{ "override ratio, section codec", BASE "compression:\n  codec: sign\n"
	  "  tensors: [{name: w, ratio: 0.5}]\n",
	  { "t.yaml:9: key 'compression.tensors[0].ratio': only topk uses a ratio (this "
	    "tensor's codec is sign, from compression.codec)" } },
	{ "override ratio zero", BASE "compression:\n  tensors: [{name: w, codec: topk, ratio: 0}]\n",
	  { "t.yaml:8: key 'compression.tensors[0].ratio': expected a number in (0, 1], got '0'" } },
	{ "override bad codec", BASE "compression:\n  tensors: [{name: w, codec: top-k}]\n",
	  { "t.yaml:8: key 'compression.tensors[0].codec': expected one of none, fp16, q8, topk, "
	    "sign, got 'top-k'" } },
	{ "override unknown key", BASE "compression:\n  tensors: [{name: w, codex: q8}]\n",
	  { "t.yaml:8: unknown key 'compression.tensors[0].codex'; did you mean "
	    "'compression.tensors[0].codec'?" } },
	{ "override without name", BASE "compression:\n  tensors:\n    - {codec: q8}\n",
	  { "t.yaml:9: missing required key 'compression.tensors[0].name'" } },
	{ "override not a mapping", BASE "compression:\n  tensors:\n    - w\n",
	  { "t.yaml:9: key 'compression.tensors[0]': expected a mapping with name and codec or "
	    "ratio, got 'w'" } },
	{ "overrides not a list", BASE "compression:\n  tensors: w\n",
	  { "t.yaml:8: key 'compression.tensors': expected a list of 0..8192 mappings", "got 'w'" } },
	/* encryption needs the authenticated handshake's keys */
	{ "encrypt without auth", BASE "security:\n  auth: false\n  encrypt: true\n",
	  { "t.yaml:9: key 'security.encrypt': true needs security.auth: true and security.mac: "
	    "true", "got auth: false, mac: true" } },
	{ "encrypt without mac", BASE "security:\n  mac: false\n  encrypt: true\n",
	  { "t.yaml:9: key 'security.encrypt'", "got auth: true, mac: false" } },
	{ "unknown cipher", BASE "security:\n  encrypt: true\n  cipher: aes\n",
	  { "t.yaml:9: key 'security.cipher': expected one of aes-256-gcm, chacha20-poly1305, "
	    "got 'aes'" } },
	{ "invalid UTF-8", BASE "seed: \xff\xfe\n", { "t.yaml: invalid input at byte 102" } },
	{ "control character", BASE "seed: 1\x01\n", { "t.yaml: invalid input at byte" } },
};

/* Each error case: PS_ECONFIG, one line with every wanted substring, and the
 * caller's struct left as it was. */
START_TEST(test_errors)
{
	const struct ecase *e = &ecases[_i];
	int rc;

	ps_config_defaults(&cfg);
	cfg.nworkers = 77;
	rc = load(e->yaml);
	ck_assert_msg(rc == PS_ECONFIG, "%s: rc %d, err '%s'", e->what, rc, err);
	ck_assert_msg(!strchr(err, '\n'), "%s: message not one line: '%s'", e->what, err);
	for (int k = 0; k < 4 && e->want[k]; k++)
		ck_assert_msg(strstr(err, e->want[k]), "%s: '%s' lacks '%s'", e->what, err,
			      e->want[k]);
	ck_assert_int_eq(cfg.nworkers, 77);
	ck_assert_int_eq(cfg.ntensors, 0);
}
END_TEST

/* Fills buf with n copies of unit, NUL-terminated. */
static char *repeat(const char *head, const char *unit, size_t n)
{
	size_t hl = strlen(head), ul = strlen(unit);
	char *buf = malloc(hl + n * ul + 1);

	ck_assert_ptr_nonnull(buf);
	memcpy(buf, head, hl);
	for (size_t i = 0; i < n; i++)
		memcpy(buf + hl + i * ul, unit, ul);
	buf[hl + n * ul] = 0;
	return buf;
}

START_TEST(test_deep_nesting)
{
	static const struct { const char *head, *unit; } deep[] = {
		{ "", "[" }, { "", "{" }, { "a: ", "[" }, { "a: ", "{a: " }, { "", "- " },
		{ "", "[[]]," },
	};
	char *y;

	for (size_t i = 0; i < sizeof(deep) / sizeof(deep[0]); i++) {
		y = repeat(deep[i].head, deep[i].unit, 10000);
		ck_assert_int_eq(load(y), PS_ECONFIG);
		ck_assert_msg(strstr(err, "t.yaml:1:"), "%s", err);
		free(y);
	}
	y = repeat("", "[", 10000);
	ck_assert_int_eq(load(y), PS_ECONFIG);
	ck_assert_msg(strstr(err, "t.yaml:1: nesting deeper than 32 levels"), "%s", err);
	free(y);
	/* block nesting, one level per line */
	y = malloc(200000);
	ck_assert_ptr_nonnull(y);
	y[0] = 0;
	for (int i = 0, n = 0; i < 300; i++)
		n += sprintf(y + n, "%*sk%d:\n", i, "", i);
	ck_assert_int_eq(load(y), PS_ECONFIG);
	ck_assert_msg(strstr(err, "t.yaml:33: nesting deeper than 32 levels"), "%s", err);
	free(y);
}
END_TEST

START_TEST(test_huge_input)
{
	char *y = repeat("cluster:\n  servers: [", "x", 100000);

	ck_assert_int_eq(load(y), PS_ECONFIG);
	ck_assert_msg(strstr(err, "t.yaml:2: scalar of 100000 bytes is longer than the limit"),
		      "%s", err);
	free(y);
	/* many small nodes */
	y = repeat("seed: [", "1,", 300000);
	ck_assert_int_eq(load(y), PS_ECONFIG);
	ck_assert_msg(strstr(err, "YAML nodes"), "%s", err);
	free(y);
	/* a long unknown key is cut in the message (libyaml refuses implicit
	 * keys over 1024 characters, so stay under that) */
	y = repeat("", "k", 1010);
	strcpy(y + 1000, ": 1\n");
	ck_assert_int_eq(load(y), PS_ECONFIG);
	ck_assert_msg(strstr(err, "t.yaml:1: unknown key 'kkkk") && strstr(err, "...'"), "%s", err);
	ck_assert_uint_lt(strlen(err), 400);
	free(y);
}
END_TEST

START_TEST(test_files)
{
	int rc;

	rc = ps_config_load(&cfg, "conf/does-not-exist.yaml", err, sizeof(err));
	ck_assert_int_eq(rc, -ENOENT);
	ck_assert_str_eq(err, "conf/does-not-exist.yaml: cannot open: No such file or directory");
	rc = ps_config_load(&cfg, "conf", err, sizeof(err));
	ck_assert_int_eq(rc, -EISDIR);
	ck_assert_str_eq(err, "conf: cannot read: Is a directory");
	rc = ps_config_load(&cfg, "/dev/null", err, sizeof(err));
	ck_assert_int_eq(rc, PS_ECONFIG);
	ck_assert_str_eq(err, "/dev/null:1: empty configuration; expected a mapping with at least "
			 "'cluster' and 'model'");
}
END_TEST

START_TEST(test_small_err_buffer)
{
	char small[12];

	ck_assert_int_eq(ps_config_load_string(&cfg, "x: 1\n", "t.yaml", small, sizeof(small)),
			 PS_ECONFIG);
	ck_assert_str_eq(small, "t.yaml:1: u");
	ck_assert_int_eq(ps_config_load_string(&cfg, "x: 1\n", "t.yaml", small, 1), PS_ECONFIG);
	ck_assert_str_eq(small, "");
	ck_assert_int_eq(ps_config_load_string(&cfg, "x: 1\n", NULL, err, sizeof(err)), PS_ECONFIG);
	ck_assert_msg(strstr(err, "<string>:1: unknown key 'x'"), "%s", err);
}
END_TEST

/* Every prefix of a valid file and random byte edits of it: any result is
 * fine as long as nothing crashes or leaks and failures explain themselves. */
START_TEST(test_mutations)
{
	size_t len = strlen(full_yaml);
	char *y = malloc(len + 1);
	unsigned seed = 12345;
	static const char alphabet[] = "[]{}:,-'\"&*!?#|>%@ \n\t0123456789aZ.\\\x01\xc3";

	ck_assert_ptr_nonnull(y);
	for (size_t cut = 0; cut <= len; cut++) {
		memcpy(y, full_yaml, cut);
		y[cut] = 0;
		if (load(y) != 0)
			ck_assert_msg(!strncmp(err, "t.yaml", 6) && !strchr(err, '\n'), "%s", err);
	}
	for (int iter = 0; iter < 4000; iter++) {
		memcpy(y, full_yaml, len + 1);
		for (int k = 0; k < 1 + iter % 4; k++) {
			seed = seed * 1103515245u + 12345u;
			y[(seed >> 8) % len] = alphabet[(seed >> 20) % (sizeof(alphabet) - 1)];
		}
		if (load(y) != 0)
			ck_assert_msg(!strncmp(err, "t.yaml", 6) && !strchr(err, '\n'), "%s", err);
	}
	free(y);
}
END_TEST

static Suite *config_suite(void)
{
	Suite *s = suite_create("config");
	TCase *tc = tcase_create("load");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_defaults);
	tcase_add_test(tc, test_minimal_gets_defaults);
	tcase_add_test(tc, test_full);
	tcase_add_test(tc, test_value_forms);
	tcase_add_test(tc, test_local_yaml);
	tcase_add_test(tc, test_example_full_yaml);
	tcase_add_test(tc, test_roundtrip);
	tcase_add_test(tc, test_dump_odd_paths);
	tcase_add_test(tc, test_compression);
	tcase_add_test(tc, test_model);
	tcase_add_test(tc, test_ctr_fields);
	tcase_add_test(tc, test_help);
	tcase_add_loop_test(tc, test_errors, 0, (int)(sizeof(ecases) / sizeof(ecases[0])));
	tcase_add_test(tc, test_deep_nesting);
	tcase_add_test(tc, test_huge_input);
	tcase_add_test(tc, test_files);
	tcase_add_test(tc, test_small_err_buffer);
	tcase_add_test(tc, test_mutations);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	int failed;

	failed = tu_run_suite(config_suite());
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
