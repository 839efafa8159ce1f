/* config.c - the cluster configuration: one option table drives YAML
 * loading, validation, the --help text and the dump of the effective config.
 *
 * Loading has two steps. libyaml's event parser builds a small tree of nodes
 * that remember their line; aliases, nesting deeper than MAX_DEPTH, huge
 * scalars and oversized input are refused there, so hostile files cost little.
 * The tree is then walked against the option table (cfg_opts, and tensor_opts
 * for each model.tensors entry). The result is built in a scratch struct and
 * copied out only when every check passed: a failed load leaves cfg as it was.
 * compression.tensors entries (override_opts) may name tensors derived from
 * the model's layers, so they wait in the ctx until the model is resolved.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "codec.h"
#include "config.h"
#include "config_int.h"
#include "ps_err.h"

static const char *const transport_names[] = { "tcp", "rdma", NULL };
static const char *const consistency_names[] = { "sync", "async", NULL };
static const char *const optim_names[] = { "sgd", "momentum", "adam", "adagrad", NULL };
static const char *const init_names[] = { "zeros", "const", "uniform", "normal", "arange", NULL };
static const char *const level_names[] = { "debug", "info", "warn", "error", "off", NULL };
static const char *const preset_names[] = { "none", "mlp", "cnn", NULL };
static const char *const device_names[] = { "auto", "cpu", "cuda", NULL };
/* in enum ps_layer_kind order */
static const char *const layer_names[] = { "dense", "conv2d", "maxpool", "relu", "flatten", NULL };
/* in enum ps_codec_kind order; pull replies (weights) take only the first two */
static const char *const codec_names[] = { "none", "fp16", "q8", "topk", "sign", NULL };
static const char *const pull_names[] = { "none", "fp16", NULL };
/* in enum ps_lz4_mode order */
static const char *const lz4_names[] = { "off", "on", "auto", NULL };
_Static_assert(PS_CODEC_NONE == 0 && PS_CODEC_FP16 == 1 && PS_CODEC_Q8 == 2 &&
	       PS_CODEC_TOPK == 3 && PS_CODEC_SIGN == 4 && PS_CODEC_COUNT == 5, "codec_names");
_Static_assert(PS_LZ4_OFF == 0 && PS_LZ4_ON == 1 && PS_LZ4_AUTO == 2, "lz4_names");

#define C struct ps_config
static const struct opt cfg_opts[] = {
	O("cluster.servers", T_SERVERS, F_REQUIRED, 1, PS_MAX_SHARDS, NULL, NULL, C, shards,
	  "listen address of each shard; the position in the list is the shard id"),
	O("cluster.workers", T_INT, F_REQUIRED, 1, 4096, NULL, NULL, C, nworkers,
	  "number of worker processes (ranks 0..workers-1)"),
	O("transport", T_ENUM, 0, 0, 0, "tcp", transport_names, C, transport,
	  "wire transport between workers and shards; only tcp is available in this build"),
	O("consistency.mode", T_ENUM, 0, 0, 0, "sync", consistency_names, C, consistency,
	  "sync: a clock completes when every worker pushed; async: workers run freely"),
	O("consistency.staleness", T_INT, 0, 0, 1000000, "0", NULL, C, staleness,
	  "async: clocks a worker may run ahead of the slowest one (ignored in sync)"),
	O("seed", T_U64, 0, 0, 0, "1", NULL, C, seed,
	  "seed of tensor initialization; the same seed gives the same initial model"),
	O("slice_bytes", T_SIZE, 0, 64, GiB, "1MiB", NULL, C, slice_bytes,
	  "tensors are cut into slices of at most this size, spread over the shards; multiple of 4"),
	O("model.preset", T_ENUMSTR, 0, 0, 0, "none", preset_names, C, model.preset,
	  "a built-in model: mlp (784-256-128-10) or cnn (2 conv 5x5 + pool, dense 256, 10)"),
	O("model.layers", T_LAYERS, 0, 1, PS_MAX_LAYERS, NULL, NULL, C, model.layers,
	  "the model as a list of layers, see model.layers[].* below (instead of a preset)"),
	O("model.input", T_DIMS3, 0, 0, 0, NULL, NULL, C, model.input,
	  "shape of one example [channels, height, width]; default [1, 28, 28]"),
	O("model.classes", T_INT, 0, 2, 100000, "10", NULL, C, model.classes,
	  "outputs of the last layer (labels 0..classes-1)"),
	O("model.tensors", T_TENSORS, 0, 1, PS_MAX_TENSORS, NULL, NULL, C, tensors,
	  "raw parameter tensors without layers (for ps-bench and tests), see model.tensors[].*"),
	O("optimizer.name", T_ENUM, 0, 0, 0, "sgd", optim_names, C, optim.kind,
	  "update rule applied by the shards"),
	O("optimizer.lr", T_FLOAT, F_OPEN_MIN, 0, 1e6, "0.01", NULL, C, optim.lr, "learning rate"),
	O("optimizer.momentum", T_FLOAT, F_OPEN_MAX, 0, 1, "0.9", NULL, C, optim.momentum,
	  "momentum: the factor mu of the velocity"),
	O("optimizer.nesterov", T_BOOL, 0, 0, 0, "false", NULL, C, optim.nesterov,
	  "momentum: use the Nesterov variant"),
	O("optimizer.beta1", T_FLOAT, F_OPEN_MAX, 0, 1, "0.9", NULL, C, optim.beta1,
	  "adam: decay of the first moment"),
	O("optimizer.beta2", T_FLOAT, F_OPEN_MAX, 0, 1, "0.999", NULL, C, optim.beta2,
	  "adam: decay of the second moment"),
	O("optimizer.eps", T_FLOAT, F_OPEN_MIN, 0, 1, "1e-8", NULL, C, optim.eps,
	  "adam, adagrad: added to the denominator"),
	O("optimizer.weight_decay", T_FLOAT, 0, 0, 1e3, "0", NULL, C, optim.weight_decay,
	  "L2 penalty added to the gradient, every optimizer"),
	O("optimizer.initial_accumulator", T_FLOAT, 0, 0, 1e6, "0.1", NULL, C,
	  optim.initial_accumulator, "adagrad: initial value of the squared-gradient sum"),
	O("compression.codec", T_ENUM, 0, 0, 0, "none", codec_names, C, compress.codec,
	  "codec of pushed gradients: none, fp16 (half), q8 (8 bits), topk (the largest ratio), "
	  "sign (1 bit); per tensor: compression.tensors"),
	O("compression.ratio", T_FLOAT, F_OPEN_MIN, 0, 1, "0.01", NULL, C, compress.ratio,
	  "topk: fraction of each slice's values sent"),
	O("compression.error_feedback", T_BOOL, 0, 0, 0, "true", NULL, C, compress.error_feedback,
	  "topk, sign, q8: the worker keeps what was not sent and adds it to the next push"),
	O("compression.lz4", T_ENUM, 0, 0, 0, "auto", lz4_names, C, compress.lz4,
	  "lossless LZ4 stage after the codec, kept for a frame only when it shrinks it; "
	  "auto: tried only where it is likely to help"),
	O("compression.pull", T_ENUM, 0, 0, 0, "none", pull_names, C, compress.pull,
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
	  limits.max_connections, "connections accepted per shard"),
	O("train.data_dir", T_PATH, 0, 0, 0, "/usr/share/datasets/fashion-mnist", NULL, C,
	  train.data_dir, "folder of the IDX files train-{images,labels}-* and t10k-* (gzip or plain)"),
	O("train.batch", T_INT, 0, 1, 65536, "64", NULL, C, train.batch,
	  "examples per step on each worker"),
	O("train.epochs", T_INT, 0, 1, 1000000, "1", NULL, C, train.epochs,
	  "passes over each worker's part of the training set"),
	O("train.limit", T_INT, 0, 0, 1e9, "0", NULL, C, train.train_limit,
	  "use only the first N training images (0 = all), split among the workers"),
	O("train.device", T_ENUM, 0, 0, 0, "auto", device_names, C, train.device,
	  "auto: the GPU when there is a usable one, else the CPU; cuda: fail without a GPU"),
	O("train.metrics_dir", T_PATH, 0, 0, 0, "metrics", NULL, C, train.metrics_dir,
	  "folder for worker-R.jsonl metrics logs (created if missing); \"\" = none"),
	O("stats.http", T_ADDR, 0, 0, 0, "", NULL, C, stats.http,
	  "host:port serving Prometheus /metrics; empty = off"),
	O("log.level", T_ENUMSTR, 0, 0, 0, "info", level_names, C, log_level,
	  "least severe log level written to stderr"),
};
#undef C
#define NCFG (sizeof(cfg_opts) / sizeof(cfg_opts[0]))

/* One model.tensors entry while it is parsed: scale and value both land in
 * init_value, which one depends on init, known only after the whole entry. */
struct tensor_tmp {
	struct ps_tensor_cfg t;
	float scale, value;
};

enum { TO_NAME, TO_SHAPE, TO_INIT, TO_SCALE, TO_VALUE, NTENSOR };
#define T struct tensor_tmp
static const struct opt tensor_opts[NTENSOR] = {
	O("name", T_NAME, F_REQUIRED, 1, PS_NAME_MAX - 1, NULL, NULL, T, t.name,
	  "unique name of the tensor"),
	O("shape", T_SHAPE, F_REQUIRED, 1, PS_MAX_DIMS, NULL, NULL, T, t.dims,
	  "dimensions; at most 2^34 elements in all"),
	O("init", T_ENUM, 0, 0, 0, "uniform", init_names, T, t.init,
	  "initial values: zeros, const (value), uniform in [-scale, scale], normal (std scale), "
	  "arange (index mod 1024)"),
	O("scale", T_FLOAT, 0, 0, 1e6, "0.05", NULL, T, scale, "uniform, normal: the scale"),
	O("value", T_FLOAT, 0, -1e30, 1e30, "0", NULL, T, value, "const: every element's value"),
};
#undef T

/* One compression.tensors entry; codec and ratio default to the section's. */
enum { VO_NAME, VO_CODEC, VO_RATIO, NOVR };
#define V struct cfg_override
static const struct opt override_opts[NOVR] = {
	O("name", T_NAME, F_REQUIRED, 1, PS_NAME_MAX - 1, NULL, NULL, V, name,
	  "a tensor of the model, also one derived from its layers (e.g. fc1.weight)"),
	O("codec", T_ENUM, 0, 0, 0, NULL, codec_names, V, codec,
	  "codec of this tensor's pushes; default compression.codec"),
	O("ratio", T_FLOAT, F_OPEN_MIN, 0, 1, NULL, NULL, V, ratio,
	  "topk only: fraction of each slice sent; default compression.ratio"),
};
#undef V

/* One model.layers entry; which keys apply depends on type. */
enum { LO_TYPE, LO_OUT, LO_KERNEL, LO_PAD, LO_STRIDE, LO_SIZE, NLAYER };
#define L struct ps_layer_cfg
static const struct opt layer_opts[NLAYER] = {
	O("type", T_ENUM, F_REQUIRED, 0, 0, NULL, layer_names, L, kind,
	  "dense, conv2d, maxpool, relu or flatten (a bare name also works: '- relu')"),
	O("out", T_INT, 0, 1, 1 << 20, NULL, NULL, L, out, "dense: outputs; conv2d: filters"),
	O("kernel", T_INT, 0, 1, 64, NULL, NULL, L, kernel, "conv2d: square kernel size"),
	O("pad", T_INT, 0, 0, 64, "0", NULL, L, pad, "conv2d: zero padding on each side"),
	O("stride", T_INT, 0, 1, 64, "1", NULL, L, stride, "conv2d: stride"),
	O("size", T_INT, 0, 1, 64, "2", NULL, L, size, "maxpool: window and stride"),
};
#undef L
/* Keys each layer kind takes (bit i = layer_opts[i]); 'out'/'kernel' required where used. */
static const unsigned layer_keys[] = {
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

static void apply_defaults(const struct opt *tab, size_t n, void *base)
{
	const char *why;

	for (size_t i = 0; i < n; i++)
		if (tab[i].def)
			cfg_parse_scalar(&tab[i], base, tab[i].def, &why);
}

void ps_config_defaults(struct ps_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	apply_defaults(cfg_opts, NCFG, cfg);
	cfg->model.input[0] = 1;
	cfg->model.input[1] = 28;
	cfg->model.input[2] = 28;
}

/* ---- walking the tree against a table ---------------------------------- */

/* Reports that node v does not fit option o: "key 'k': expected X, got Y". */
static int bad_value(struct ctx *c, const struct opt *o, const struct ynode *v, const char *key,
		     const char *why)
{
	char desc[200], got[100];

	return cfg_fail(c, v->line, "key '%s': expected %s, got %s%s%s%s", key,
		    cfg_describe(o, desc, sizeof(desc)), cfg_what(v, got, sizeof(got)),
		    why ? " (" : "", why ? why : "", why ? ")" : "");
}

static int set_servers(struct ctx *c, const struct opt *o, struct ps_config *cfg,
		       const struct ynode *v, const char *key)
{
	char k[2 * KEY_MAX + 24], got[100];
	const char *why;

	if (v->kind != YN_SEQ || v->nkids < o->min || v->nkids > o->max)
		return bad_value(c, o, v, key, v->kind == YN_SEQ ? "wrong number of entries" : NULL);
	for (size_t i = 0; i < v->nkids; i++) {
		const struct ynode *s = v->kids[i];
		struct ps_endpoint *ep = &cfg->shards[i];

		snprintf(k, sizeof(k), "%s[%zu]", key, i);
		why = NULL;
		if (s->kind != YN_SCALAR || cfg_parse_endpoint(s->text, ep, &why))
			return cfg_fail(c, s->line, "key '%s': expected host:port (port 1..65535, IPv6 "
				    "quoted as \"[::1]:7000\"), got %s%s%s%s", k,
				    cfg_what(s, got, sizeof(got)), why ? " (" : "", why ? why : "",
				    why ? ")" : "");
		for (size_t j = 0; j < i; j++)
			if (!strcmp(cfg->shards[j].host, ep->host) && cfg->shards[j].port == ep->port)
				return cfg_fail(c, s->line, "key '%s': duplicate server address %s "
					    "(also shard %zu)", k, cfg_what(s, got, sizeof(got)), j);
	}
	cfg->nshards = (int)v->nkids;
	return 0;
}

static int set_shape(struct ctx *c, const struct opt *o, struct tensor_tmp *tt,
		     const struct ynode *v, const char *key)
{
	char k[2 * KEY_MAX + 24], got[100];
	int64_t d, count = 1;

	if (v->kind != YN_SEQ || v->nkids < o->min || v->nkids > o->max)
		return bad_value(c, o, v, key, v->kind == YN_SEQ ? "wrong number of entries" : NULL);
	for (size_t i = 0; i < v->nkids; i++) {
		const struct ynode *s = v->kids[i];

		snprintf(k, sizeof(k), "%s[%zu]", key, i);
		if (s->kind != YN_SCALAR || cfg_parse_i64(s->text, &d) || d < 1 || d > MAX_COUNT)
			return cfg_fail(c, s->line, "key '%s': expected a positive integer up to 2^34, "
				    "got %s", k, cfg_what(s, got, sizeof(got)));
		if (count > MAX_COUNT / d)
			return cfg_fail(c, s->line, "key '%s': expected at most 2^34 elements in all, "
				    "got more at dimension %zu", key, i);
		count *= d;
		tt->t.dims[i] = d;
	}
	tt->t.ndims = (int)v->nkids;
	tt->t.count = count;
	return 0;
}

static int walk_map(struct ctx *c, const struct opt *tab, size_t ntab, void *base,
		    const struct ynode **seen, const char *rel, const char *disp,
		    const struct ynode *map);

static int fail_layer_type(struct ctx *c, const struct ynode *m, const char *disp)
{
	char got[100];

	return cfg_fail(c, m->line, "key '%s': expected a layer type (dense, conv2d, maxpool, "
			"relu, flatten), got %s", disp, cfg_what(m, got, sizeof(got)));
}

/* Parses one model.tensors entry into cfg->tensors[i]. */
static int set_tensor(struct ctx *c, struct ps_config *cfg, size_t i, const struct ynode *m,
		      const char *key)
{
	const struct ynode *seen[NTENSOR] = { 0 };
	struct tensor_tmp tt;
	char disp[2 * KEY_MAX + 24], got[100];
	int rc, init, uses_scale;

	snprintf(disp, sizeof(disp), "%s[%zu]", key, i);
	if (m->kind != YN_MAP)
		return cfg_fail(c, m->line, "key '%s': expected a mapping with name and shape, got %s",
			    disp, cfg_what(m, got, sizeof(got)));
	memset(&tt, 0, sizeof(tt));
	apply_defaults(tensor_opts, NTENSOR, &tt);
	rc = walk_map(c, tensor_opts, NTENSOR, &tt, seen, "", disp, m);
	if (rc)
		return rc;
	for (int k = 0; k < NTENSOR; k++)
		if ((tensor_opts[k].flags & F_REQUIRED) && !seen[k])
			return cfg_fail(c, m->line, "missing required key '%s.%s'", disp, tensor_opts[k].key);
	init = tt.t.init;
	uses_scale = init == PS_INIT_UNIFORM || init == PS_INIT_NORMAL;
	if (seen[TO_SCALE] && !uses_scale)
		return cfg_fail(c, seen[TO_SCALE]->line, "key '%s.scale': not used by init '%s'%s", disp,
			    init_names[init], init == PS_INIT_CONST ? " (use 'value')" : "");
	if (seen[TO_VALUE] && init != PS_INIT_CONST)
		return cfg_fail(c, seen[TO_VALUE]->line, "key '%s.value': not used by init '%s'%s", disp,
			    init_names[init], uses_scale ? " (use 'scale')" : "");
	tt.t.init_value = init == PS_INIT_CONST ? tt.value : uses_scale ? tt.scale : 0.0f;
	for (size_t j = 0; j < i; j++)
		if (!strcmp(cfg->tensors[j].name, tt.t.name))
			return cfg_fail(c, seen[TO_NAME]->line, "key '%s.name': duplicate tensor name '%s' "
				    "(first at line %d)", disp, tt.t.name, c->name_line[j]);
	c->name_line[i] = seen[TO_NAME]->line;
	cfg->tensors[i] = tt.t;
	return 0;
}

static int set_tensors(struct ctx *c, const struct opt *o, struct ps_config *cfg,
		       const struct ynode *v, const char *key)
{
	int rc;

	if (v->kind != YN_SEQ || v->nkids < o->min || v->nkids > o->max)
		return bad_value(c, o, v, key, v->kind == YN_SEQ ? "wrong number of entries" : NULL);
	for (size_t i = 0; i < v->nkids; i++) {
		rc = set_tensor(c, cfg, i, v->kids[i], key);
		if (rc)
			return rc;
	}
	cfg->ntensors = (int)v->nkids;
	return 0;
}

/* Parses one model.layers entry: a mapping with type and the keys that
 * kind takes, or a bare kind name for layers without keys of their own. */
static int set_layer(struct ctx *c, struct ps_config *cfg, size_t i, const struct ynode *m,
		     const char *key)
{
	const struct ynode *seen[NLAYER] = { 0 };
	struct ps_layer_cfg l;
	char disp[2 * KEY_MAX + 24], got[100];
	const char *why;
	int rc;

	snprintf(disp, sizeof(disp), "%s[%zu]", key, i);
	memset(&l, 0, sizeof(l));
	apply_defaults(layer_opts, NLAYER, &l);
	if (m->kind == YN_SCALAR) {
		if (cfg_parse_scalar(&layer_opts[LO_TYPE], &l, m->text, &why))
			return fail_layer_type(c, m, disp);
		seen[LO_TYPE] = m;
	} else if (m->kind == YN_MAP) {
		rc = walk_map(c, layer_opts, NLAYER, &l, seen, "", disp, m);
		if (rc)
			return rc;
		if (!seen[LO_TYPE])
			return cfg_fail(c, m->line, "missing required key '%s.type' (one of dense, "
					"conv2d, maxpool, relu, flatten)", disp);
	} else {
		return cfg_fail(c, m->line, "key '%s': expected a layer (a mapping with type, or a "
				"bare name like relu), got %s", disp, cfg_what(m, got, sizeof(got)));
	}
	for (int k = LO_OUT; k < NLAYER; k++) {
		int takes = (layer_keys[l.kind] >> k) & 1;

		if (seen[k] && !takes)
			return cfg_fail(c, seen[k]->line, "key '%s.%s': not used by a %s layer", disp,
					layer_opts[k].key, layer_names[l.kind]);
		if (takes && !seen[k] && !layer_opts[k].def)
			return cfg_fail(c, m->line, "missing key '%s.%s' (a %s layer needs it: %s)",
					disp, layer_opts[k].key, layer_names[l.kind],
					layer_opts[k].help);
	}
	cfg->model.layers[i] = l;
	return 0;
}

static int set_layers(struct ctx *c, const struct opt *o, struct ps_config *cfg,
		      const struct ynode *v, const char *key)
{
	int rc;

	if (v->kind != YN_SEQ || v->nkids < o->min || v->nkids > o->max)
		return bad_value(c, o, v, key, v->kind == YN_SEQ ? "wrong number of entries" : NULL);
	for (size_t i = 0; i < v->nkids; i++) {
		rc = set_layer(c, cfg, i, v->kids[i], key);
		if (rc)
			return rc;
	}
	cfg->model.nlayers = (int)v->nkids;
	return 0;
}

/* Parses compression.tensors into c->ovr. The names are checked against the
 * model's tensors later, by resolve_compression(). */
static int set_overrides(struct ctx *c, const struct opt *o, const struct ynode *v,
			 const char *key)
{
	char disp[2 * KEY_MAX + 24], got[100];
	int rc;

	if (v->kind != YN_SEQ || v->nkids < o->min || v->nkids > o->max)
		return bad_value(c, o, v, key, v->kind == YN_SEQ ? "wrong number of entries" : NULL);
	free(c->ovr);
	c->novr = 0;
	c->ovr = calloc(v->nkids ? v->nkids : 1, sizeof(*c->ovr));
	if (!c->ovr)
		return cfg_fail(c, v->line, "out of memory");
	for (size_t i = 0; i < v->nkids; i++) {
		const struct ynode *m = v->kids[i], *seen[NOVR] = { 0 };
		struct cfg_override *e = &c->ovr[i];

		snprintf(disp, sizeof(disp), "%s[%zu]", key, i);
		if (m->kind != YN_MAP)
			return cfg_fail(c, m->line, "key '%s': expected a mapping with name and codec "
					"or ratio, got %s", disp, cfg_what(m, got, sizeof(got)));
		rc = walk_map(c, override_opts, NOVR, e, seen, "", disp, m);
		if (rc)
			return rc;
		if (!seen[VO_NAME])
			return cfg_fail(c, m->line, "missing required key '%s.name'", disp);
		for (size_t j = 0; j < i; j++)
			if (!strcmp(c->ovr[j].name, e->name))
				return cfg_fail(c, seen[VO_NAME]->line, "key '%s.name': duplicate entry "
						"for tensor '%s' (first at line %d)", disp, e->name,
						c->ovr[j].name_at->line);
		e->name_at = seen[VO_NAME];
		e->codec_at = seen[VO_CODEC];
		e->ratio_at = seen[VO_RATIO];
		c->novr = i + 1;
	}
	return 0;
}

static int set_dims3(struct ctx *c, struct ps_config *cfg, const struct opt *o,
		     const struct ynode *v, const char *key)
{
	int64_t d;

	if (v->kind != YN_SEQ || v->nkids != 3)
		return bad_value(c, o, v, key, v->kind == YN_SEQ ? "wrong number of entries" : NULL);
	for (size_t i = 0; i < 3; i++) {
		if (v->kids[i]->kind != YN_SCALAR || cfg_parse_i64(v->kids[i]->text, &d) || d < 1 ||
		    d > 65536)
			return bad_value(c, o, v, key, "each must be an integer in 1..65536");
		cfg->model.input[i] = (int)d;
	}
	return 0;
}

/* Parses value node v for option o; key is the dotted name for messages. */
static int set_node(struct ctx *c, const struct opt *o, void *base, const struct ynode *v,
		    const char *key)
{
	const char *why = NULL;

	switch (o->type) {
	case T_SERVERS:
		return set_servers(c, o, base, v, key);
	case T_TENSORS:
		return set_tensors(c, o, base, v, key);
	case T_SHAPE:
		return set_shape(c, o, base, v, key);
	case T_LAYERS:
		return set_layers(c, o, base, v, key);
	case T_DIMS3:
		return set_dims3(c, base, o, v, key);
	case T_OVERRIDES:
		return set_overrides(c, o, v, key);
	default:
		if (v->kind != YN_SCALAR || cfg_parse_scalar(o, base, v->text, &why)) {
			if (o->names == pull_names && v->kind == YN_SCALAR)
				for (int k = 0; codec_names[k]; k++)
					if (!strcasecmp(v->text, codec_names[k]))
						why = "q8, topk and sign are for pushed gradients, "
						      "not pulled weights";
			return bad_value(c, o, v, key, why);
		}
		return 0;
	}
}

static size_t levenshtein(const char *a, const char *b, size_t blen)
{
	size_t alen = strlen(a), row[KEY_MAX + 1], diag, tmp;

	if (alen > KEY_MAX || blen > KEY_MAX)
		return SIZE_MAX;
	for (size_t j = 0; j <= blen; j++)
		row[j] = j;
	for (size_t i = 1; i <= alen; i++) {
		diag = row[0];
		row[0] = i;
		for (size_t j = 1; j <= blen; j++) {
			tmp = row[j];
			row[j] = diag + (a[i - 1] != b[j - 1]);
			if (row[j] > row[j - 1] + 1)
				row[j] = row[j - 1] + 1;
			if (row[j] > tmp + 1)
				row[j] = tmp + 1;
			diag = tmp;
		}
	}
	return row[blen];
}

/* Refuses key k found in the mapping at rel, suggesting the closest valid
 * key there, or listing them all when none is close. */
static int unknown_key(struct ctx *c, const struct opt *tab, size_t ntab, const char *rel,
		       const char *disp, const struct ynode *k, const char *shown)
{
	const char *names[64], *best = NULL;
	size_t lens[64], nnames = 0, rl = strlen(rel), bestd = SIZE_MAX, d, klen = strlen(k->text);
	char list[1024], pre[KEY_MAX + 1];
	size_t n = 0;

	for (size_t i = 0; i < ntab && nnames < 64; i++) {
		const char *child = tab[i].key;
		size_t cl, j;

		if (rl && (strncmp(child, rel, rl) || child[rl] != '.'))
			continue;
		child += rl ? rl + 1 : 0;
		cl = strcspn(child, ".");
		for (j = 0; j < nnames; j++)
			if (lens[j] == cl && !memcmp(names[j], child, cl))
				break;
		if (j < nnames)
			continue;
		names[nnames] = child;
		lens[nnames++] = cl;
		d = levenshtein(k->text, child, cl);
		if (d < bestd) {
			bestd = d;
			best = child;
		}
	}
	snprintf(pre, sizeof(pre), "%s%s%s%s", disp, *disp && rl ? "." : "", rel,
		 *disp || rl ? "." : "");
	if (best && bestd <= (klen / 3 > 2 ? klen / 3 : 2))
		return cfg_fail(c, k->line, "unknown key '%s'; did you mean '%s%.*s'?", shown, pre,
			    (int)strcspn(best, "."), best);
	list[0] = 0;
	for (size_t i = 0; i < nnames && n < sizeof(list); i++)
		n += snprintf(list + n, sizeof(list) - n, "%s%.*s", i ? ", " : "", (int)lens[i],
			      names[i]);
	return cfg_fail(c, k->line, "unknown key '%s'; valid keys here: %s", shown, list);
}

static int find_opt(const struct opt *tab, size_t ntab, const char *key)
{
	for (size_t i = 0; i < ntab; i++)
		if (!strcmp(tab[i].key, key))
			return (int)i;
	return -1;
}

/* Walks mapping map found at table path rel (disp: prefix of the dotted keys
 * in messages). seen[i] records the value node of option i. */
static int walk_map(struct ctx *c, const struct opt *tab, size_t ntab, void *base,
		    const struct ynode **seen, const char *rel, const char *disp,
		    const struct ynode *map)
{
	const struct ynode *sections[64];
	char full[KEY_MAX], shown[2 * KEY_MAX], txt[80], got[100];
	size_t nsec = 0, rl = strlen(rel), j;
	int idx, rc, fits;

	for (size_t i = 0; i + 1 < map->nkids; i += 2) {
		const struct ynode *k = map->kids[i], *v = map->kids[i + 1];

		if (k->kind != YN_SCALAR)
			return cfg_fail(c, k->line, "expected a plain key, got %s", cfg_what(k, got, sizeof(got)));
		fits = snprintf(full, sizeof(full), "%s%s%s", rel, rl ? "." : "", k->text) <
		       (int)sizeof(full);
		snprintf(shown, sizeof(shown), "%s%s%s%s%s", disp, *disp ? "." : "", rel,
			 rl ? "." : "", cfg_show(k->text, txt, sizeof(txt)));
		idx = fits ? find_opt(tab, ntab, full) : -1;
		if (idx >= 0) {
			if (seen[idx])
				return cfg_fail(c, k->line, "duplicate key '%s' (first at line %d)", shown,
					    seen[idx]->line);
			seen[idx] = v;
			rc = set_node(c, &tab[idx], base, v, shown);
			if (rc)
				return rc;
			continue;
		}
		for (j = 0; fits && j < ntab; j++)
			if (!strncmp(tab[j].key, full, strlen(full)) && tab[j].key[strlen(full)] == '.')
				break;
		if (!fits || j == ntab)
			return unknown_key(c, tab, ntab, rel, disp, k, shown);
		for (j = 0; j < nsec; j++)
			if (!strcmp(sections[j]->text, k->text))
				return cfg_fail(c, k->line, "duplicate key '%s' (first at line %d)", shown,
					    sections[j]->line);
		if (nsec < 64)
			sections[nsec++] = k;
		if (v->kind == YN_SCALAR && v->plain && !v->len)
			continue; /* "section:" with nothing below is an empty mapping */
		if (v->kind != YN_MAP)
			return cfg_fail(c, v->line, "key '%s': expected a mapping, got %s", shown,
				    cfg_what(v, got, sizeof(got)));
		rc = walk_map(c, tab, ntab, base, seen, full, disp, v);
		if (rc)
			return rc;
	}
	return 0;
}

/* Line of the key that opens the top-level section of dotted key, or 1. */
static int section_line(const struct ynode *root, const char *key)
{
	size_t l = strcspn(key, ".");

	for (size_t i = 0; key[l] && i + 1 < root->nkids; i += 2)
		if (root->kids[i]->kind == YN_SCALAR && root->kids[i]->len == l &&
		    !memcmp(root->kids[i]->text, key, l))
			return root->kids[i]->line;
	return 1;
}

/* Checks that involve more than one option, once the whole file is read. */
static int validate(struct ctx *c, const struct ps_config *cfg, const struct ynode *root,
		    const struct ynode **seen)
{
	const struct ynode *tr = seen[find_opt(cfg_opts, NCFG, "transport")];
	const struct ynode *sl = seen[find_opt(cfg_opts, NCFG, "slice_bytes")];
	const struct ynode *fr = seen[find_opt(cfg_opts, NCFG, "limits.max_frame_bytes")];
	char got[100], a[32], b[32];

	for (size_t i = 0; i < NCFG; i++)
		if ((cfg_opts[i].flags & F_REQUIRED) && !seen[i])
			return cfg_fail(c, section_line(root, cfg_opts[i].key), "missing required key '%s'",
				    cfg_opts[i].key);
	if (cfg->transport == PS_TRANSPORT_RDMA)
		return cfg_fail(c, tr->line, "transport 'rdma' is not available yet in this build; "
			    "use 'tcp'");
	if (cfg->slice_bytes % 4)
		return cfg_fail(c, sl->line, "key 'slice_bytes': expected a multiple of 4, got %s",
			    cfg_what(sl, got, sizeof(got)));
	if (cfg->limits.max_frame_bytes < cfg->slice_bytes + 64 * KiB) {
		if (fr)
			cfg_what(fr, got, sizeof(got));
		else
			snprintf(got, sizeof(got), "'%s' (default)",
				 cfg_fmt_size(cfg->limits.max_frame_bytes, a, sizeof(a)));
		return cfg_fail(c, fr ? fr->line : sl->line, "key 'limits.max_frame_bytes': expected at "
			    "least slice_bytes + 64KiB = %" PRIu64 " (slice_bytes is %s), got %s",
			    cfg->slice_bytes + 64 * KiB, cfg_fmt_size(cfg->slice_bytes, b, sizeof(b)), got);
	}
	return 0;
}

/* The model: raw tensors, a preset or a list of layers (exactly one). With
 * layers, the shapes are checked and the parameter tensors derived from
 * them, so servers and workers agree on the tensors by construction:
 * weights uniform in +-sqrt(6 / fan_in) (He/Kaiming for ReLU nets), biases 0. */
static int resolve_model(struct ctx *c, struct ps_config *cfg, const struct ynode *root,
			 const struct ynode **seen)
{
	const struct ynode *pre = seen[find_opt(cfg_opts, NCFG, "model.preset")];
	const struct ynode *lay = seen[find_opt(cfg_opts, NCFG, "model.layers")];
	const struct ynode *ten = seen[find_opt(cfg_opts, NCFG, "model.tensors")];
	const struct ynode *at;
	struct ps_layer_shape shapes[PS_MAX_LAYERS];
	struct ps_param_desc *pd;
	char why[256];
	int n, rc = 0;

	if (!strcmp(cfg->model.preset, "none"))
		cfg->model.preset[0] = 0;
	if (pre && !cfg->model.preset[0])
		pre = NULL;
	at = lay ? lay : pre;
	if (!pre && !lay && !ten)
		return cfg_fail(c, section_line(root, "model.x"), "missing the model: give "
				"'model.preset' (mlp, cnn), 'model.layers' or 'model.tensors'");
	if (pre && lay)
		return cfg_fail(c, lay->line, "key 'model.layers': give either 'model.preset' "
				"(line %d) or 'model.layers', not both", pre->line);
	if (ten && at)
		return cfg_fail(c, ten->line, "key 'model.tensors': the tensors are derived from the "
				"model's layers (line %d); give one or the other", at->line);
	if (ten)
		return 0;
	if (pre) {
		char name[sizeof(cfg->model.preset)];

		memcpy(name, cfg->model.preset, sizeof(name)); /* the preset writes its name back */
		ps_layers_preset(&cfg->model, name);
	}
	if (ps_layers_infer(&cfg->model, shapes, why, sizeof(why)))
		return cfg_fail(c, at->line, "%s: %s", pre ? "model.preset" : "model.layers", why);
	pd = calloc(PS_MAX_TENSORS, sizeof(*pd));
	if (!pd)
		return cfg_fail(c, 0, "out of memory");
	n = ps_layers_tensors(&cfg->model, pd, PS_MAX_TENSORS, why, sizeof(why));
	if (n < 0) {
		rc = cfg_fail(c, at->line, "%s: %s", pre ? "model.preset" : "model.layers", why);
		goto out;
	}
	for (int i = 0; i < n; i++) {
		struct ps_tensor_cfg *t = &cfg->tensors[i];

		memset(t, 0, sizeof(*t));
		snprintf(t->name, sizeof(t->name), "%s", pd[i].name);
		t->ndims = pd[i].ndims;
		memcpy(t->dims, pd[i].dims, sizeof(pd[i].dims));
		t->count = pd[i].count;
		t->init = pd[i].is_bias ? PS_INIT_ZEROS : PS_INIT_UNIFORM;
		t->init_value = pd[i].is_bias ? 0.0f : (float)sqrt(6.0 / (double)pd[i].fan_in);
	}
	cfg->ntensors = n;
out:
	free(pd);
	return rc;
}

/* Refuses compression.tensors entry k, which names no tensor of the model:
 * suggests the closest name, or lists the first ones when none is close. */
static int unknown_tensor(struct ctx *c, const struct ps_config *cfg, size_t k)
{
	const struct cfg_override *e = &c->ovr[k];
	size_t d, bestd = SIZE_MAX, nl = strlen(e->name), n = 0;
	char list[400];
	int best = -1, i;

	for (i = 0; i < cfg->ntensors; i++) {
		d = levenshtein(e->name, cfg->tensors[i].name, strlen(cfg->tensors[i].name));
		if (d < bestd) {
			bestd = d;
			best = i;
		}
	}
	if (best >= 0 && bestd <= (nl / 3 > 2 ? nl / 3 : 2))
		return cfg_fail(c, e->name_at->line, "key 'compression.tensors[%zu].name': no tensor "
				"'%s' in the model; did you mean '%s'?", k, e->name,
				cfg->tensors[best].name);
	list[0] = 0;
	for (i = 0; i < cfg->ntensors && n + PS_NAME_MAX + 8 < sizeof(list); i++)
		n += snprintf(list + n, sizeof(list) - n, "%s%s", i ? ", " : "", cfg->tensors[i].name);
	return cfg_fail(c, e->name_at->line, "key 'compression.tensors[%zu].name': no tensor '%s' "
			"in the model; its tensors are %s%s", k, e->name, list,
			i < cfg->ntensors ? ", ..." : "");
}

/* Sets every tensor's push codec and ratio: the section's, or those of the
 * compression.tensors entry naming it. Runs after resolve_model(), so that
 * entries may name tensors derived from the layers. */
static int resolve_compression(struct ctx *c, struct ps_config *cfg)
{
	const struct ps_compress_cfg *cc = &cfg->compress;

	for (int i = 0; i < cfg->ntensors; i++) {
		cfg->tensors[i].codec = cc->codec;
		cfg->tensors[i].ratio = cc->ratio;
	}
	for (size_t k = 0; k < c->novr; k++) {
		const struct cfg_override *e = &c->ovr[k];
		int codec = e->codec_at ? e->codec : cc->codec;
		int t = ps_config_find_tensor(cfg, e->name);

		if (t < 0)
			return unknown_tensor(c, cfg, k);
		if (e->ratio_at && codec != PS_CODEC_TOPK)
			return cfg_fail(c, e->ratio_at->line, "key 'compression.tensors[%zu].ratio': "
					"only topk uses a ratio (this tensor's codec is %s%s)", k,
					codec_names[codec], e->codec_at ? "" : ", from compression.codec");
		cfg->tensors[t].codec = codec;
		if (e->ratio_at)
			cfg->tensors[t].ratio = e->ratio;
	}
	return 0;
}

/* Loads buf (len bytes) into cfg; on any error cfg is left untouched. */
static int load_buffer(struct ps_config *cfg, const char *buf, size_t len, const char *name,
		       char *err, size_t errlen)
{
	struct ctx c = { .name = name, .err = err, .errlen = errlen };
	const struct ynode *seen[NCFG] = { 0 };
	struct ynode *root = NULL;
	struct ps_config *tmp;
	char got[100];
	int rc;

	if (err && errlen)
		err[0] = 0;
	if (len > MAX_INPUT)
		return cfg_fail(&c, 0, "larger than %u MiB; not a configuration file", MAX_INPUT >> 20);
	tmp = malloc(sizeof(*tmp));
	if (!tmp) {
		cfg_fail(&c, 0, "out of memory");
		return -ENOMEM;
	}
	ps_config_defaults(tmp);
	rc = cfg_build_tree(&c, buf, len, &root);
	if (rc)
		goto err_free_tmp;
	if (!root || (root->kind == YN_SCALAR && root->plain && !root->len)) {
		rc = cfg_fail(&c, 1, "empty configuration; expected a mapping with at least "
			  "'cluster' and 'model'");
		goto err_free_tree;
	}
	if (root->kind != YN_MAP) {
		rc = cfg_fail(&c, root->line, "expected a mapping of sections at the top level, got %s",
			  cfg_what(root, got, sizeof(got)));
		goto err_free_tree;
	}
	rc = walk_map(&c, cfg_opts, NCFG, tmp, seen, "", "", root);
	if (!rc)
		rc = validate(&c, tmp, root, seen);
	if (!rc)
		rc = resolve_model(&c, tmp, root, seen);
	if (!rc)
		rc = resolve_compression(&c, tmp);
	if (rc)
		goto err_free_tree;
	snprintf(tmp->path, sizeof(tmp->path), "%s", name);
	memcpy(cfg, tmp, sizeof(*cfg));

err_free_tree:
	free(c.ovr);
	cfg_node_free(root);
err_free_tmp:
	free(tmp);
	return rc;
}

int ps_config_load_string(struct ps_config *cfg, const char *yaml, const char *name,
			  char *err, size_t errlen)
{
	return load_buffer(cfg, yaml, strlen(yaml), name ? name : "<string>", err, errlen);
}

int ps_config_load(struct ps_config *cfg, const char *path, char *err, size_t errlen)
{
	struct ctx c = { .name = path, .err = err, .errlen = errlen };
	size_t len = 0, cap = 64 * KiB, n;
	char *buf, *nb;
	FILE *f;
	int rc;

	f = fopen(path, "rb");
	if (!f) {
		rc = -errno;
		cfg_fail(&c, 0, "cannot open: %s", strerror(-rc));
		return rc;
	}
	buf = malloc(cap);
	if (!buf) {
		rc = -ENOMEM;
		cfg_fail(&c, 0, "out of memory");
		goto err_close;
	}
	/* read to the end (works for pipes too), at most MAX_INPUT + 1 bytes */
	for (;;) {
		n = fread(buf + len, 1, cap - len, f);
		len += n;
		if (len < cap)
			break;
		if (cap > MAX_INPUT)
			break;
		nb = realloc(buf, 2 * cap);
		if (!nb) {
			rc = -ENOMEM;
			cfg_fail(&c, 0, "out of memory");
			goto err_free_buf;
		}
		buf = nb;
		cap *= 2;
	}
	if (ferror(f)) {
		rc = errno ? -errno : -EIO;
		cfg_fail(&c, 0, "cannot read: %s", strerror(-rc));
		goto err_free_buf;
	}
	rc = load_buffer(cfg, buf, len, path, err, errlen);

err_free_buf:
	free(buf);
err_close:
	fclose(f);
	return rc;
}

/* ---- dump and help ---------------------------------------------------- */

/* Layers given explicitly are written out; a preset's are not (the preset
 * line says it), so that the dump loads back as the same configuration. */
static void dump_layers(const struct ps_config *cfg, FILE *out)
{
	const struct ps_model_cfg *m = &cfg->model;

	if (!m->nlayers || m->preset[0]) {
		fputs("[]\n", out);
		return;
	}
	fputc('\n', out);
	for (int i = 0; i < m->nlayers; i++) {
		const struct ps_layer_cfg *l = &m->layers[i];

		fprintf(out, "    - {type: %s", layer_names[l->kind]);
		if (l->kind == PS_LAYER_DENSE)
			fprintf(out, ", out: %d", l->out);
		else if (l->kind == PS_LAYER_CONV2D)
			fprintf(out, ", out: %d, kernel: %d, pad: %d, stride: %d", l->out, l->kernel,
				l->pad, l->stride);
		else if (l->kind == PS_LAYER_MAXPOOL)
			fprintf(out, ", size: %d", l->size);
		fputs("}\n", out);
	}
}

/* The tensors whose codec or ratio differ from the section's, as the
 * compression.tensors entries that give them (a list that loads back to the
 * same tensors, not necessarily the one in the file). */
static void dump_overrides(const struct ps_config *cfg, FILE *out)
{
	const struct ps_compress_cfg *cc = &cfg->compress;
	char buf[32];
	int n = 0;

	for (int i = 0; i < cfg->ntensors; i++) {
		const struct ps_tensor_cfg *t = &cfg->tensors[i];
		int ratio = t->codec == PS_CODEC_TOPK && t->ratio != cc->ratio;

		if (t->codec == cc->codec && !ratio)
			continue;
		fprintf(out, "%s    - {name: \"%s\", codec: %s", n++ ? "" : "\n", t->name,
			codec_names[t->codec]);
		if (ratio)
			fprintf(out, ", ratio: %s", cfg_fmt_float(t->ratio, buf, sizeof(buf)));
		fputs("}\n", out);
	}
	if (!n)
		fputs(" []\n", out);
}

static void dump_value(const struct ps_config *cfg, const struct opt *o, FILE *out)
{
	const char *src = (const char *)cfg + o->off;
	char buf[PS_HOST_MAX + 16];

	if ((o->type != T_TENSORS || !cfg->ntensors) && o->type != T_OVERRIDES)
		fputc(' ', out);
	switch (o->type) {
	case T_INT:
		fprintf(out, "%d\n", *(const int *)src);
		break;
	case T_U64:
		fprintf(out, "%" PRIu64 "\n", *(const uint64_t *)src);
		break;
	case T_SIZE:
		fprintf(out, "%s\n", cfg_fmt_size(o->size == sizeof(uint32_t) ? *(const uint32_t *)src
					      : *(const uint64_t *)src, buf, sizeof(buf)));
		break;
	case T_FLOAT:
		fprintf(out, "%s\n", cfg_fmt_float(*(const float *)src, buf, sizeof(buf)));
		break;
	case T_BOOL:
		fprintf(out, "%s\n", *(const int *)src ? "true" : "false");
		break;
	case T_ENUM:
		fprintf(out, "%s\n", o->names[*(const int *)src]);
		break;
	case T_ENUMSTR:
		fprintf(out, "%s\n", *src ? src : o->names[0]);
		break;
	case T_ADDR:
		fprintf(out, "\"%s\"\n", src);
		break;
	case T_SERVERS:
		fputc('[', out);
		for (int i = 0; i < cfg->nshards; i++) {
			cfg_fmt_endpoint(&cfg->shards[i], buf, sizeof(buf));
			fprintf(out, "%s\"%s\"", i ? ", " : "", buf);
		}
		fputs("]\n", out);
		break;
	case T_TENSORS:
		fputs(cfg->ntensors ? "\n" : "[]\n", out);
		for (int i = 0; i < cfg->ntensors; i++) {
			const struct ps_tensor_cfg *t = &cfg->tensors[i];

			fprintf(out, "    - name: \"%s\"\n      shape: [", t->name);
			for (int d = 0; d < t->ndims; d++)
				fprintf(out, "%s%" PRId64, d ? ", " : "", t->dims[d]);
			fprintf(out, "]\n      init: %s\n", init_names[t->init]);
			if (t->init == PS_INIT_CONST || t->init == PS_INIT_UNIFORM ||
			    t->init == PS_INIT_NORMAL)
				fprintf(out, "      %s: %s\n", t->init == PS_INIT_CONST ? "value" : "scale",
					cfg_fmt_float(t->init_value, buf, sizeof(buf)));
		}
		break;
	case T_PATH:
		fprintf(out, "\"%s\"\n", src);
		break;
	case T_DIMS3:
		fprintf(out, "[%d, %d, %d]\n", cfg->model.input[0], cfg->model.input[1],
			cfg->model.input[2]);
		break;
	case T_LAYERS:
		dump_layers(cfg, out);
		break;
	case T_OVERRIDES:
		dump_overrides(cfg, out);
		break;
	default:
		fputs("~\n", out);
		break;
	}
}

void ps_config_dump(const struct ps_config *cfg, FILE *out)
{
	char section[KEY_MAX] = "";
	const char *dot;

	fprintf(out, "# effective configuration\n");
	for (size_t i = 0; i < NCFG; i++) {
		const struct opt *o = &cfg_opts[i];
		size_t sl;

		/* options of one section are adjacent in the table */
		dot = strchr(o->key, '.');
		sl = dot ? (size_t)(dot - o->key) : 0;
		if (sl != strlen(section) || strncmp(section, o->key, sl)) {
			snprintf(section, sizeof(section), "%.*s", (int)sl, o->key);
			if (sl)
				fprintf(out, "%s:\n", section);
		}
		if (o->type == T_TENSORS && cfg->model.nlayers) {
			fprintf(out, "  # tensors: derived from the layers:");
			for (int t = 0; t < cfg->ntensors; t++)
				fprintf(out, " %s[%" PRId64 "]", cfg->tensors[t].name,
					cfg->tensors[t].count);
			fputc('\n', out);
			continue;
		}
		if (o->type == T_LAYERS && (!cfg->model.nlayers || cfg->model.preset[0]))
			continue;
		fprintf(out, "%s%s:", sl ? "  " : "", sl ? dot + 1 : o->key);
		dump_value(cfg, o, out);
	}
}

static void help_opt(FILE *out, const struct opt *o, const char *prefix)
{
	char desc[200];

	fprintf(out, "  %s%s\n      %s; ", prefix, o->key, cfg_describe(o, desc, sizeof(desc)));
	if (o->flags & F_REQUIRED)
		fprintf(out, "required\n");
	else if (o->def)
		fprintf(out, "default %s\n", *o->def ? o->def : "\"\"");
	else
		fprintf(out, "optional\n");
	fprintf(out, "      %s\n", o->help);
}

void ps_config_help(FILE *out)
{
	fprintf(out, "Configuration file (YAML; key a.b is key b in the mapping a):\n");
	for (size_t i = 0; i < NCFG; i++) {
		help_opt(out, &cfg_opts[i], "");
		if (cfg_opts[i].type == T_TENSORS)
			for (size_t j = 0; j < NTENSOR; j++)
				help_opt(out, &tensor_opts[j], "model.tensors[].");
		if (cfg_opts[i].type == T_LAYERS)
			for (size_t j = 0; j < NLAYER; j++)
				help_opt(out, &layer_opts[j], "model.layers[].");
		if (cfg_opts[i].type == T_OVERRIDES)
			for (size_t j = 0; j < NOVR; j++)
				help_opt(out, &override_opts[j], "compression.tensors[].");
	}
}

int ps_config_find_tensor(const struct ps_config *cfg, const char *name)
{
	for (int i = 0; i < cfg->ntensors; i++)
		if (!strcmp(cfg->tensors[i].name, name))
			return i;
	return PS_ENOTENSOR;
}

const char *ps_optim_name(enum ps_optim_kind k)
{
	return (unsigned)k < sizeof(optim_names) / sizeof(optim_names[0]) - 1 ? optim_names[k]
									      : "unknown";
}
