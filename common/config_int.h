/* config_int.h - what the config loader's files share (not a public API).
 *
 * config.c holds the option tables and walks a YAML tree against them;
 * config_yaml.c builds that tree with libyaml; config_scalar.c parses and
 * formats the scalar values options take.
 */
#ifndef PS_CONFIG_INT_H
#define PS_CONFIG_INT_H

#include <stddef.h>
#include <stdint.h>
#include "config.h"

#define MAX_DEPTH 32            /* nesting levels accepted in a file */
#define MAX_NODES 262144        /* YAML nodes accepted in a file */
#define MAX_SCALAR 4096         /* bytes in one scalar */
#define MAX_INPUT (16u << 20)   /* bytes in one file */
#define KEY_MAX 160             /* a dotted key shown in messages */
#define KiB ((uint64_t)1024)
#define MiB (1024 * KiB)
#define GiB (1024 * MiB)
#define MAX_COUNT (1ll << 34)   /* elements in one tensor */

enum opt_type {
	T_INT,     /* int or int64_t (by size) within [min, max] */
	T_U64,     /* uint64_t, full range */
	T_SIZE,    /* uint32_t/uint64_t bytes, suffixes K KiB M MiB G GiB */
	T_FLOAT,   /* float, finite, within bounds (F_OPEN_* make them strict) */
	T_BOOL,    /* int 0/1 */
	T_ENUM,    /* enum stored as int: index into names */
	T_ENUMSTR, /* char[]: one of names, canonical spelling */
	T_ADDR,    /* char[]: "host:port", or empty for off */
	T_SERVERS, /* list of host:port into cfg->shards/nshards or cfg->backups/nbackups */
	T_TENSORS, /* list of mappings walked against tensor_opts */
	T_NAME,    /* tensor name */
	T_SHAPE,   /* tensor dims, ndims and count */
	T_PATH,    /* char[]: a file or folder name, any printable text */
	T_LAYERS,  /* list of layers (mappings walked against layer_opts, or a bare kind) */
	T_DIMS3,   /* int[3]: a list of three positive integers */
	T_OVERRIDES, /* list of mappings walked against override_opts, kept in ctx */
	T_TABLES,  /* list of mappings walked against table_opts (model.embeddings) */
	T_FIELDS,  /* uint32_t bit set: a list of ctr field numbers 0..PS_CTR_FIELDS-1 */
};

#define F_REQUIRED 1
#define F_OPEN_MIN 2
#define F_OPEN_MAX 4

struct opt {
	const char *key;          /* dotted path below the table's base mapping */
	enum opt_type type;
	unsigned flags;
	double min, max;          /* value bounds, or entry counts for lists */
	const char *def;          /* default as YAML text; NULL = zero */
	const char *const *names; /* T_ENUM, T_ENUMSTR */
	size_t off, size;         /* member in the base struct */
	const char *help;
};

#define O(k, t, fl, lo, hi, d, nm, st, m, h) \
	{ k, t, fl, lo, hi, d, nm, offsetof(st, m), sizeof(((st *)0)->m), h }

enum { YN_SCALAR, YN_SEQ, YN_MAP };

struct ynode {
	int kind, line, plain;     /* plain: scalar written without quotes */
	char *text;                /* scalar, NUL-terminated */
	size_t len;
	struct ynode **kids;       /* seq items; map keys and values alternate */
	size_t nkids, cap;
};

/* One compression.tensors entry. It names a tensor that may be derived from
 * the model's layers, so it is applied only after the model is resolved; the
 * nodes (alive until the load ends) give the lines for messages. */
struct cfg_override {
	char name[PS_NAME_MAX];
	int codec;                 /* enum ps_codec_kind, when codec_at */
	float ratio;               /* when ratio_at */
	const struct ynode *name_at, *codec_at, *ratio_at;
};

/* Everything a load needs to report errors; name is the file or given name. */
struct ctx {
	const char *name;
	char *err;
	size_t errlen;
	size_t nnodes;
	int name_line[PS_MAX_TENSORS]; /* line of each tensor's name, for duplicates */
	struct cfg_override *ovr;  /* compression.tensors entries (malloc'd), novr of them */
	size_t novr;
	const struct ynode *fields_at[PS_MAX_TABLES]; /* model.embeddings[i].fields, when given */
	int table_line[PS_MAX_TABLES]; /* line of model.embeddings[i] */
};

/* Writes "NAME:LINE: message" into the caller's buffer; returns PS_ECONFIG. */
int cfg_fail(struct ctx *c, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Copies text for a message: control bytes become '?', long text is cut. */
const char *cfg_show(const char *s, char *buf, size_t len);
/* How a node looks in a message: "a list", "a mapping" or the quoted text. */
const char *cfg_what(const struct ynode *n, char *buf, size_t len);
void cfg_node_free(struct ynode *n);
/* Parses buf into a tree of nodes (*rootp NULL for an empty document). */
int cfg_build_tree(struct ctx *c, const char *buf, size_t len, struct ynode **rootp);

int cfg_parse_i64(const char *s, int64_t *out);
int cfg_parse_size(const char *s, uint64_t *out);
int cfg_parse_double(const char *s, double *out);
const char *cfg_fmt_size(uint64_t v, char *buf, size_t len);
const char *cfg_fmt_float(float f, char *buf, size_t len);
void cfg_fmt_endpoint(const struct ps_endpoint *ep, char *buf, size_t len);
/* What an option accepts, as used in errors and --help. */
const char *cfg_describe(const struct opt *o, char *buf, size_t len);
/* Parses scalar text s for option o into base; 0, or -1 with *why set. */
int cfg_parse_scalar(const struct opt *o, void *base, const char *s, const char **why);

/* ---- the option tables (config_table.c) ---- */

/* One model.tensors entry while it is parsed: scale and value both land in
 * init_value, which one depends on init, known only after the whole entry. */
struct tensor_tmp {
	struct ps_tensor_cfg t;
	float scale, value;
};

/* One model.embeddings entry while it is parsed (scale and value as for tensors). */
struct table_tmp {
	struct ps_table_cfg t;
	float scale, value;
};

enum { EO_NAME, EO_DIM, EO_INIT, EO_SCALE, EO_VALUE, EO_OPTIMIZER, EO_LR, EO_EPS, EO_BETA1,
       EO_BETA2, EO_ACC, EO_L1, EO_L2, EO_FTRL_BETA, EO_ADMISSION, EO_TTL, EO_MAX_ROWS,
       EO_FILTER, EO_FIELDS, NTABLE };
enum { TO_NAME, TO_SHAPE, TO_INIT, TO_SCALE, TO_VALUE, NTENSOR };
enum { VO_NAME, VO_CODEC, VO_RATIO, NOVR };
enum { LO_TYPE, LO_OUT, LO_KERNEL, LO_PAD, LO_STRIDE, LO_SIZE, NLAYER };

extern const char *const cfg_transport_names[], *const cfg_consistency_names[],
	*const cfg_optim_names[], *const cfg_init_names[], *const cfg_level_names[],
	*const cfg_preset_names[], *const cfg_bag_names[], *const cfg_device_names[],
	*const cfg_tf32_names[], *const cfg_pull_when_names[],
	*const cfg_layer_names[], *const cfg_codec_names[], *const cfg_pull_names[],
	*const cfg_lz4_names[], *const cfg_row_optim_names[], *const cfg_forward_names[];
extern const struct opt cfg_opts[];
extern const size_t cfg_nopts;
#define NCFG cfg_nopts
#define CFG_MAX_OPTS 128 /* bound on cfg_nopts, for arrays sized by it */
extern const struct opt cfg_tensor_opts[NTENSOR], cfg_override_opts[NOVR], cfg_layer_opts[NLAYER],
	cfg_table_opts[NTABLE];
/* Keys each layer kind takes (bit i = cfg_layer_opts[i]). */
extern const unsigned cfg_layer_keys[];
/* config_ctr.c: the ctr preset's fields to tables (cfg->tables[].fields),
 * or the refusal of 'fields' without it; *width is the bags' columns. */
int cfg_ctr_fields(struct ctx *c, struct ps_config *cfg, const struct ynode *pre,
		   const struct ynode *em, int *width);
int cfg_fields_unused(struct ctx *c, const struct ps_config *cfg);
/* Writes the fields of set (a bit set) as "3, 7, 12" into buf (len bytes). */
const char *cfg_field_list(uint32_t set, char *buf, size_t len);
/* Parses a model.embeddings[].fields list into the bit set at o's member. */
int cfg_set_fields(struct ctx *c, const struct opt *o, void *base, const struct ynode *v,
		   const char *key);
/* Applies the defaults of table tab (n options) to the struct at base. */
void cfg_apply_defaults(const struct opt *tab, size_t n, void *base);

#endif
