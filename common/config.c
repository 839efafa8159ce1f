/* config.c - the cluster configuration: one option table drives YAML
 * loading, validation, the --help text and the dump of the effective config.
 *
 * Loading has two steps. libyaml's event parser builds a small tree of nodes
 * that remember their line; aliases, nesting deeper than MAX_DEPTH, huge
 * scalars and oversized input are refused there, so hostile files cost little.
 * The tree is then walked against the option table (cfg_opts, and tensor_opts
 * for each model.tensors entry). The result is built in a scratch struct and
 * copied out only when every check passed: a failed load leaves cfg as it was.
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
#include <yaml.h>

#include "config.h"
#include "ps_err.h"

#define MAX_DEPTH 32            /* nesting levels accepted in a file */
#define MAX_NODES 262144        /* YAML nodes accepted in a file */
#define MAX_SCALAR 4096         /* bytes in one scalar */
#define MAX_INPUT (16u << 20)   /* bytes in one file */
#define KEY_MAX 160             /* a dotted key shown in messages */
#define KiB ((uint64_t)1024)
#define MiB (1024 * KiB)
#define GiB (1024 * MiB)
#define MAX_COUNT (1ll << 34)   /* elements in one tensor */

/* ---- the option table ---------------------------------------------------- */

enum opt_type {
	T_INT,     /* int within [min, max] */
	T_U64,     /* uint64_t, full range */
	T_SIZE,    /* uint32_t/uint64_t bytes, suffixes K KiB M MiB G GiB */
	T_FLOAT,   /* float, finite, within bounds (F_OPEN_* make them strict) */
	T_BOOL,    /* int 0/1 */
	T_ENUM,    /* enum stored as int: index into names */
	T_ENUMSTR, /* char[]: one of names, canonical spelling */
	T_ADDR,    /* char[]: "host:port", or empty for off */
	T_SERVERS, /* list of host:port into cfg->shards/nshards */
	T_TENSORS, /* list of mappings walked against tensor_opts */
	T_NAME,    /* tensor name */
	T_SHAPE,   /* tensor dims, ndims and count */
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

static const char *const transport_names[] = { "tcp", "rdma", NULL };
static const char *const consistency_names[] = { "sync", "async", NULL };
static const char *const optim_names[] = { "sgd", "momentum", "adam", "adagrad", NULL };
static const char *const init_names[] = { "zeros", "const", "uniform", "normal", "arange", NULL };
static const char *const level_names[] = { "debug", "info", "warn", "error", "off", NULL };

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
	O("model.tensors", T_TENSORS, F_REQUIRED, 1, PS_MAX_TENSORS, NULL, NULL, C, tensors,
	  "the parameter tensors of the model, see model.tensors[].* below"),
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

/* ---- the YAML tree ----------------------------------------------------- */

enum { YN_SCALAR, YN_SEQ, YN_MAP };

struct ynode {
	int kind, line, plain;     /* plain: scalar written without quotes */
	char *text;                /* scalar, NUL-terminated */
	size_t len;
	struct ynode **kids;       /* seq items; map keys and values alternate */
	size_t nkids, cap;
};

/* Everything a load needs to report errors; name is the file or given name. */
struct ctx {
	const char *name;
	char *err;
	size_t errlen;
	size_t nnodes;
	int name_line[PS_MAX_TENSORS]; /* line of each tensor's name, for duplicates */
};

static int fail(struct ctx *c, int line, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Writes "NAME:LINE: message" into the caller's buffer; returns PS_ECONFIG. */
static int fail(struct ctx *c, int line, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (!c->err || !c->errlen)
		return PS_ECONFIG;
	n = line > 0 ? snprintf(c->err, c->errlen, "%s:%d: ", c->name, line)
		     : snprintf(c->err, c->errlen, "%s: ", c->name);
	if (n >= 0 && (size_t)n < c->errlen) {
		va_start(ap, fmt);
		vsnprintf(c->err + n, c->errlen - n, fmt, ap);
		va_end(ap);
	}
	return PS_ECONFIG;
}

/* Copies text for a message: control bytes become '?', long text is cut. */
static const char *show(const char *s, char *buf, size_t len)
{
	size_t i;

	for (i = 0; s[i] && i + 4 < len && i < 60; i++)
		buf[i] = ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) ? '?' : s[i];
	buf[i] = 0;
	if (s[i])
		strcpy(buf + i, "...");
	return buf;
}

/* How a node looks in a message: "a list", "a mapping" or the quoted text. */
static const char *what(const struct ynode *n, char *buf, size_t len)
{
	char tmp[80];

	if (n->kind == YN_SEQ)
		return "a list";
	if (n->kind == YN_MAP)
		return "a mapping";
	snprintf(buf, len, "'%s'", show(n->text, tmp, sizeof(tmp)));
	return buf;
}

static void node_free(struct ynode *n)
{
	if (!n)
		return;
	for (size_t i = 0; i < n->nkids; i++)
		node_free(n->kids[i]);
	free(n->kids);
	free(n->text);
	free(n);
}

/* Creates a node and hangs it below the innermost open collection (or makes
 * it the root), so that freeing the root always frees every node. */
static int node_attach(struct ctx *c, struct ynode **stack, int depth, struct ynode **root,
		       int kind, int line, struct ynode **out)
{
	struct ynode *n, *p, **kids;

	if (++c->nnodes > MAX_NODES)
		return fail(c, line, "more than %d YAML nodes; not a configuration file", MAX_NODES);
	n = calloc(1, sizeof(*n));
	if (!n)
		goto err_nomem;
	n->kind = kind;
	n->line = line;
	if (depth == 0) {
		*root = n;
	} else {
		p = stack[depth - 1];
		if (p->nkids == p->cap) {
			kids = realloc(p->kids, (p->cap ? 2 * p->cap : 4) * sizeof(*kids));
			if (!kids)
				goto err_free_node;
			p->kids = kids;
			p->cap = p->cap ? 2 * p->cap : 4;
		}
		p->kids[p->nkids++] = n;
	}
	*out = n;
	return 0;

err_free_node:
	free(n);
err_nomem:
	fail(c, line, "out of memory");
	return -ENOMEM;
}

/* Reports libyaml's own error: where the problem is, and what it is. */
static int syntax_error(struct ctx *c, const yaml_parser_t *p)
{
	const char *problem = p->problem ? p->problem : "unknown problem";

	if (p->error == YAML_MEMORY_ERROR) {
		fail(c, 0, "out of memory");
		return -ENOMEM;
	}
	if (p->error == YAML_READER_ERROR)
		return fail(c, 0, "invalid input at byte %zu: %s", p->problem_offset, problem);
	if (p->context)
		return fail(c, (int)p->problem_mark.line + 1, "YAML syntax error: %s (%s at line %d)",
			    problem, p->context, (int)p->context_mark.line + 1);
	return fail(c, (int)p->problem_mark.line + 1, "YAML syntax error: %s", problem);
}

/* Parses one YAML document from buf into a tree; *rootp is NULL for an
 * empty stream. */
static int build_tree(struct ctx *c, const char *buf, size_t len, struct ynode **rootp)
{
	yaml_parser_t p;
	yaml_event_t ev;
	struct ynode *stack[MAX_DEPTH], *root = NULL, *n;
	int depth = 0, ndocs = 0, done = 0, rc = 0, line;

	if (!yaml_parser_initialize(&p)) {
		fail(c, 0, "out of memory");
		return -ENOMEM;
	}
	yaml_parser_set_input_string(&p, (const unsigned char *)buf, len);
	while (!done && !rc) {
		if (!yaml_parser_parse(&p, &ev)) {
			rc = syntax_error(c, &p);
			goto err_free_tree;
		}
		line = (int)ev.start_mark.line + 1;
		switch (ev.type) {
		case YAML_DOCUMENT_START_EVENT:
			if (++ndocs > 1)
				rc = fail(c, line, "more than one YAML document; "
					  "put the whole configuration in one");
			break;
		case YAML_ALIAS_EVENT:
			rc = fail(c, line, "YAML aliases (*%s) are not supported; write the value out",
				  (const char *)ev.data.alias.anchor);
			break;
		case YAML_SCALAR_EVENT:
			if (ev.data.scalar.length > MAX_SCALAR) {
				rc = fail(c, line, "scalar of %zu bytes is longer than the limit of %d",
					  ev.data.scalar.length, MAX_SCALAR);
				break;
			}
			if (memchr(ev.data.scalar.value, 0, ev.data.scalar.length)) {
				rc = fail(c, line, "NUL character in a scalar");
				break;
			}
			rc = node_attach(c, stack, depth, &root, YN_SCALAR, line, &n);
			if (rc)
				break;
			n->plain = ev.data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
			n->len = ev.data.scalar.length;
			n->text = malloc(n->len + 1);
			if (!n->text) {
				rc = -ENOMEM;
				fail(c, line, "out of memory");
				break;
			}
			memcpy(n->text, ev.data.scalar.value, n->len);
			n->text[n->len] = 0;
			break;
		case YAML_SEQUENCE_START_EVENT:
		case YAML_MAPPING_START_EVENT:
			if (depth >= MAX_DEPTH) {
				rc = fail(c, line, "nesting deeper than %d levels", MAX_DEPTH);
				break;
			}
			rc = node_attach(c, stack, depth, &root,
					 ev.type == YAML_SEQUENCE_START_EVENT ? YN_SEQ : YN_MAP, line, &n);
			if (!rc)
				stack[depth++] = n;
			break;
		case YAML_SEQUENCE_END_EVENT:
		case YAML_MAPPING_END_EVENT:
			depth--;
			break;
		case YAML_STREAM_END_EVENT:
			done = 1;
			break;
		default:
			break;
		}
		yaml_event_delete(&ev);
	}
	if (rc)
		goto err_free_tree;
	yaml_parser_delete(&p);
	*rootp = root;
	return 0;

err_free_tree:
	node_free(root);
	yaml_parser_delete(&p);
	return rc;
}

/* ---- scalar parsing --------------------------------------------------- */

/* Decimal integer, optional sign, the whole text, no overflow. */
static int parse_i64(const char *s, int64_t *out)
{
	const char *d = (*s == '-' || *s == '+') ? s + 1 : s;
	char *end;
	long long v;

	if (!isdigit((unsigned char)*d))
		return -1;
	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno || *end)
		return -1;
	*out = v;
	return 0;
}

/* Unsigned decimal prefix; *end points past the digits. */
static int parse_u64_prefix(const char *s, uint64_t *out, char **end)
{
	const char *d = *s == '+' ? s + 1 : s;

	if (!isdigit((unsigned char)*d))
		return -1;
	errno = 0;
	*out = strtoull(d, end, 10);
	return errno ? -1 : 0;
}

/* Bytes: an integer with an optional K/KiB/M/MiB/G/GiB suffix (x1024^n). */
static int parse_size(const char *s, uint64_t *out)
{
	static const struct { const char *sfx; uint64_t mul; } sfx[] = {
		{ "", 1 }, { "K", KiB }, { "KiB", KiB }, { "M", MiB }, { "MiB", MiB },
		{ "G", GiB }, { "GiB", GiB },
	};
	uint64_t v;
	char *end;

	if (parse_u64_prefix(s, &v, &end))
		return -1;
	while (*end == ' ')
		end++;
	for (size_t i = 0; i < sizeof(sfx) / sizeof(sfx[0]); i++) {
		if (strcmp(end, sfx[i].sfx) == 0) {
			if (v > UINT64_MAX / sfx[i].mul)
				return -1;
			*out = v * sfx[i].mul;
			return 0;
		}
	}
	return -1;
}

/* A finite number, the whole text. */
static int parse_double(const char *s, double *out)
{
	char *end;

	if (!*s || isspace((unsigned char)*s))
		return -1;
	errno = 0;
	*out = strtod(s, &end);
	if (*end || errno == ERANGE || !isfinite(*out))
		return -1;
	return 0;
}

/* Writes a size with the largest exact binary suffix ("64MiB", "1000"). */
static const char *fmt_size(uint64_t v, char *buf, size_t len)
{
	if (v && v % GiB == 0)
		snprintf(buf, len, "%" PRIu64 "GiB", v / GiB);
	else if (v && v % MiB == 0)
		snprintf(buf, len, "%" PRIu64 "MiB", v / MiB);
	else if (v && v % KiB == 0)
		snprintf(buf, len, "%" PRIu64 "KiB", v / KiB);
	else
		snprintf(buf, len, "%" PRIu64, v);
	return buf;
}

/* Shortest text that parses back to exactly f. */
static const char *fmt_float(float f, char *buf, size_t len)
{
	for (int prec = 6; prec <= 9; prec++) {
		snprintf(buf, len, "%.*g", prec, (double)f);
		if ((float)strtod(buf, NULL) == f)
			break;
	}
	return buf;
}

/* Parses "host:port", "[v6]:port"; on failure *why says what is wrong. */
static int parse_endpoint(const char *s, struct ps_endpoint *ep, const char **why)
{
	const char *host = s, *port, *p;
	size_t hlen;
	int64_t v;
	int dotted = 1;
	unsigned char tmp[16];

	if (*s == '[') {
		p = strchr(s, ']');
		if (!p)
			return *why = "missing ']'", -1;
		host = s + 1;
		hlen = p - host;
		if (p[1] != ':')
			return *why = p[1] ? "expected ':' after ']'" : "missing port", -1;
		port = p + 2;
	} else {
		p = strrchr(s, ':');
		if (!p)
			return *why = "missing port", -1;
		if (memchr(s, ':', p - s))
			return *why = "write IPv6 addresses in brackets, e.g. [::1]:7000", -1;
		hlen = p - s;
		port = p + 1;
	}
	if (hlen == 0)
		return *why = "empty host", -1;
	if (hlen >= PS_HOST_MAX)
		return *why = "host too long", -1;
	memcpy(ep->host, host, hlen);
	ep->host[hlen] = 0;
	if (*s == '[') {
		if (inet_pton(AF_INET6, ep->host, tmp) != 1)
			return *why = "not an IPv6 address", -1;
	} else {
		for (size_t i = 0; i < hlen; i++) {
			if (!isalnum((unsigned char)host[i]) && !strchr(".-_", host[i]))
				return *why = "invalid character in host", -1;
			if (!isdigit((unsigned char)host[i]) && host[i] != '.')
				dotted = 0;
		}
		if (dotted && inet_pton(AF_INET, ep->host, tmp) != 1)
			return *why = "not an IPv4 address", -1;
	}
	if (!*port)
		return *why = "missing port", -1;
	for (p = port; *p; p++)
		if (!isdigit((unsigned char)*p))
			return *why = "port is not a number", -1;
	if (p - port > 5 || parse_i64(port, &v) || v < 1 || v > 65535)
		return *why = "port out of 1..65535", -1;
	ep->port = (int)v;
	return 0;
}

/* "host:port" as written back: IPv6 hosts (they contain ':') in brackets. */
static void fmt_endpoint(const struct ps_endpoint *ep, char *buf, size_t len)
{
	snprintf(buf, len, strchr(ep->host, ':') ? "[%s]:%d" : "%s:%d", ep->host, ep->port);
}

/* What an option accepts, as used in errors and --help. */
static const char *describe(const struct opt *o, char *buf, size_t len)
{
	char a[32], b[32];
	size_t n;

	switch (o->type) {
	case T_INT:
		snprintf(buf, len, "an integer in %.0f..%.0f", o->min, o->max);
		break;
	case T_U64:
		snprintf(buf, len, "an integer in 0..%" PRIu64, UINT64_MAX);
		break;
	case T_SIZE:
		snprintf(buf, len, "a size in %s..%s bytes (suffix K, KiB, M, MiB, G, GiB allowed)",
			 fmt_size((uint64_t)o->min, a, sizeof(a)), fmt_size((uint64_t)o->max, b, sizeof(b)));
		break;
	case T_FLOAT:
		snprintf(buf, len, "a number in %c%g, %g%c", o->flags & F_OPEN_MIN ? '(' : '[',
			 o->min, o->max, o->flags & F_OPEN_MAX ? ')' : ']');
		break;
	case T_BOOL:
		snprintf(buf, len, "a boolean (true/false, yes/no, on/off, 1/0)");
		break;
	case T_ENUM:
	case T_ENUMSTR:
		n = snprintf(buf, len, "one of ");
		for (int i = 0; o->names[i] && n < len; i++)
			n += snprintf(buf + n, len - n, "%s%s", i ? ", " : "", o->names[i]);
		break;
	case T_ADDR:
		snprintf(buf, len, "host:port (port 1..65535, IPv6 as [::1]:port) or \"\" for off");
		break;
	case T_SERVERS:
		snprintf(buf, len, "a list of %.0f..%.0f host:port addresses", o->min, o->max);
		break;
	case T_TENSORS:
		snprintf(buf, len, "a list of %.0f..%.0f mappings with name and shape", o->min, o->max);
		break;
	case T_NAME:
		snprintf(buf, len, "a name of 1..%d characters from A-Z a-z 0-9 _ . : / -",
			 PS_NAME_MAX - 1);
		break;
	case T_SHAPE:
		snprintf(buf, len, "a list of 1..%d positive integers", PS_MAX_DIMS);
		break;
	}
	return buf;
}

/* Parses scalar text s for option o into base. Returns 0, or -1 with *why
 * optionally set to a detail for the message. Also applies the defaults. */
static int parse_scalar(const struct opt *o, void *base, const char *s, const char **why)
{
	char *dst = (char *)base + o->off;
	int64_t i;
	uint64_t u;
	double d;
	float f;
	char *end;
	struct ps_endpoint ep;

	switch (o->type) {
	case T_INT:
		if (parse_i64(s, &i) || i < o->min || i > o->max)
			return -1;
		*(int *)dst = (int)i;
		return 0;
	case T_U64:
		if (parse_u64_prefix(s, &u, &end) || *end)
			return -1;
		*(uint64_t *)dst = u;
		return 0;
	case T_SIZE:
		if (parse_size(s, &u) || u < (uint64_t)o->min || u > (uint64_t)o->max)
			return -1;
		if (o->size == sizeof(uint32_t))
			*(uint32_t *)dst = (uint32_t)u;
		else
			*(uint64_t *)dst = u;
		return 0;
	case T_FLOAT:
		if (parse_double(s, &d))
			return -1;
		/* check both the text's value and the float it rounds to, so that
		 * 0.99999999 does not become a momentum of exactly 1 */
		f = (float)d;
		for (int k = 0; k < 2; k++, d = f) {
			if (d < o->min || d > o->max || ((o->flags & F_OPEN_MIN) && d == o->min) ||
			    ((o->flags & F_OPEN_MAX) && d == o->max))
				return -1;
		}
		*(float *)dst = f;
		return 0;
	case T_BOOL:
		if (!strcasecmp(s, "true") || !strcasecmp(s, "yes") || !strcasecmp(s, "on") ||
		    !strcmp(s, "1"))
			*(int *)dst = 1;
		else if (!strcasecmp(s, "false") || !strcasecmp(s, "no") || !strcasecmp(s, "off") ||
			 !strcmp(s, "0"))
			*(int *)dst = 0;
		else
			return -1;
		return 0;
	case T_ENUM:
	case T_ENUMSTR:
		for (int k = 0; o->names[k]; k++) {
			if (strcasecmp(s, o->names[k]) == 0) {
				if (o->type == T_ENUM)
					*(int *)dst = k;
				else
					snprintf(dst, o->size, "%s", o->names[k]);
				return 0;
			}
		}
		return -1;
	case T_ADDR:
		if (!*s) {
			*dst = 0;
			return 0;
		}
		if (parse_endpoint(s, &ep, why))
			return -1;
		fmt_endpoint(&ep, dst, o->size);
		return 0;
	case T_NAME:
		if (!*s || strlen(s) >= o->size || strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklm"
				"nopqrstuvwxyz0123456789_.:/-") != strlen(s))
			return -1;
		snprintf(dst, o->size, "%s", s);
		return 0;
	default:
		return -1;
	}
}

/* The enums of config.h are stored through int pointers. */
_Static_assert(sizeof(enum ps_transport_kind) == sizeof(int), "enum size");
_Static_assert(sizeof(enum ps_init_kind) == sizeof(int), "enum size");

static void apply_defaults(const struct opt *tab, size_t n, void *base)
{
	const char *why;

	for (size_t i = 0; i < n; i++)
		if (tab[i].def)
			parse_scalar(&tab[i], base, tab[i].def, &why);
}

void ps_config_defaults(struct ps_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	apply_defaults(cfg_opts, NCFG, cfg);
}

/* ---- walking the tree against a table ---------------------------------- */

/* Reports that node v does not fit option o: "key 'k': expected X, got Y". */
static int bad_value(struct ctx *c, const struct opt *o, const struct ynode *v, const char *key,
		     const char *why)
{
	char desc[200], got[100];

	return fail(c, v->line, "key '%s': expected %s, got %s%s%s%s", key,
		    describe(o, desc, sizeof(desc)), what(v, got, sizeof(got)),
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
		if (s->kind != YN_SCALAR || parse_endpoint(s->text, ep, &why))
			return fail(c, s->line, "key '%s': expected host:port (port 1..65535, IPv6 "
				    "quoted as \"[::1]:7000\"), got %s%s%s%s", k,
				    what(s, got, sizeof(got)), why ? " (" : "", why ? why : "",
				    why ? ")" : "");
		for (size_t j = 0; j < i; j++)
			if (!strcmp(cfg->shards[j].host, ep->host) && cfg->shards[j].port == ep->port)
				return fail(c, s->line, "key '%s': duplicate server address %s "
					    "(also shard %zu)", k, what(s, got, sizeof(got)), j);
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
		if (s->kind != YN_SCALAR || parse_i64(s->text, &d) || d < 1 || d > MAX_COUNT)
			return fail(c, s->line, "key '%s': expected a positive integer up to 2^34, "
				    "got %s", k, what(s, got, sizeof(got)));
		if (count > MAX_COUNT / d)
			return fail(c, s->line, "key '%s': expected at most 2^34 elements in all, "
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
		return fail(c, m->line, "key '%s': expected a mapping with name and shape, got %s",
			    disp, what(m, got, sizeof(got)));
	memset(&tt, 0, sizeof(tt));
	apply_defaults(tensor_opts, NTENSOR, &tt);
	rc = walk_map(c, tensor_opts, NTENSOR, &tt, seen, "", disp, m);
	if (rc)
		return rc;
	for (int k = 0; k < NTENSOR; k++)
		if ((tensor_opts[k].flags & F_REQUIRED) && !seen[k])
			return fail(c, m->line, "missing required key '%s.%s'", disp, tensor_opts[k].key);
	init = tt.t.init;
	uses_scale = init == PS_INIT_UNIFORM || init == PS_INIT_NORMAL;
	if (seen[TO_SCALE] && !uses_scale)
		return fail(c, seen[TO_SCALE]->line, "key '%s.scale': not used by init '%s'%s", disp,
			    init_names[init], init == PS_INIT_CONST ? " (use 'value')" : "");
	if (seen[TO_VALUE] && init != PS_INIT_CONST)
		return fail(c, seen[TO_VALUE]->line, "key '%s.value': not used by init '%s'%s", disp,
			    init_names[init], uses_scale ? " (use 'scale')" : "");
	tt.t.init_value = init == PS_INIT_CONST ? tt.value : uses_scale ? tt.scale : 0.0f;
	for (size_t j = 0; j < i; j++)
		if (!strcmp(cfg->tensors[j].name, tt.t.name))
			return fail(c, seen[TO_NAME]->line, "key '%s.name': duplicate tensor name '%s' "
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
	default:
		if (v->kind != YN_SCALAR || parse_scalar(o, base, v->text, &why))
			return bad_value(c, o, v, key, why);
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
		return fail(c, k->line, "unknown key '%s'; did you mean '%s%.*s'?", shown, pre,
			    (int)strcspn(best, "."), best);
	list[0] = 0;
	for (size_t i = 0; i < nnames && n < sizeof(list); i++)
		n += snprintf(list + n, sizeof(list) - n, "%s%.*s", i ? ", " : "", (int)lens[i],
			      names[i]);
	return fail(c, k->line, "unknown key '%s'; valid keys here: %s", shown, list);
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
			return fail(c, k->line, "expected a plain key, got %s", what(k, got, sizeof(got)));
		fits = snprintf(full, sizeof(full), "%s%s%s", rel, rl ? "." : "", k->text) <
		       (int)sizeof(full);
		snprintf(shown, sizeof(shown), "%s%s%s%s%s", disp, *disp ? "." : "", rel,
			 rl ? "." : "", show(k->text, txt, sizeof(txt)));
		idx = fits ? find_opt(tab, ntab, full) : -1;
		if (idx >= 0) {
			if (seen[idx])
				return fail(c, k->line, "duplicate key '%s' (first at line %d)", shown,
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
				return fail(c, k->line, "duplicate key '%s' (first at line %d)", shown,
					    sections[j]->line);
		if (nsec < 64)
			sections[nsec++] = k;
		if (v->kind == YN_SCALAR && v->plain && !v->len)
			continue; /* "section:" with nothing below is an empty mapping */
		if (v->kind != YN_MAP)
			return fail(c, v->line, "key '%s': expected a mapping, got %s", shown,
				    what(v, got, sizeof(got)));
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
			return fail(c, section_line(root, cfg_opts[i].key), "missing required key '%s'",
				    cfg_opts[i].key);
	if (cfg->transport == PS_TRANSPORT_RDMA)
		return fail(c, tr->line, "transport 'rdma' is not available yet in this build; "
			    "use 'tcp'");
	if (cfg->slice_bytes % 4)
		return fail(c, sl->line, "key 'slice_bytes': expected a multiple of 4, got %s",
			    what(sl, got, sizeof(got)));
	if (cfg->limits.max_frame_bytes < cfg->slice_bytes + 64 * KiB) {
		if (fr)
			what(fr, got, sizeof(got));
		else
			snprintf(got, sizeof(got), "'%s' (default)",
				 fmt_size(cfg->limits.max_frame_bytes, a, sizeof(a)));
		return fail(c, fr ? fr->line : sl->line, "key 'limits.max_frame_bytes': expected at "
			    "least slice_bytes + 64KiB = %" PRIu64 " (slice_bytes is %s), got %s",
			    cfg->slice_bytes + 64 * KiB, fmt_size(cfg->slice_bytes, b, sizeof(b)), got);
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
		return fail(&c, 0, "larger than %u MiB; not a configuration file", MAX_INPUT >> 20);
	tmp = malloc(sizeof(*tmp));
	if (!tmp) {
		fail(&c, 0, "out of memory");
		return -ENOMEM;
	}
	ps_config_defaults(tmp);
	rc = build_tree(&c, buf, len, &root);
	if (rc)
		goto err_free_tmp;
	if (!root || (root->kind == YN_SCALAR && root->plain && !root->len)) {
		rc = fail(&c, 1, "empty configuration; expected a mapping with at least "
			  "'cluster' and 'model'");
		goto err_free_tree;
	}
	if (root->kind != YN_MAP) {
		rc = fail(&c, root->line, "expected a mapping of sections at the top level, got %s",
			  what(root, got, sizeof(got)));
		goto err_free_tree;
	}
	rc = walk_map(&c, cfg_opts, NCFG, tmp, seen, "", "", root);
	if (!rc)
		rc = validate(&c, tmp, root, seen);
	if (rc)
		goto err_free_tree;
	snprintf(tmp->path, sizeof(tmp->path), "%s", name);
	memcpy(cfg, tmp, sizeof(*cfg));

err_free_tree:
	node_free(root);
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
		fail(&c, 0, "cannot open: %s", strerror(-rc));
		return rc;
	}
	buf = malloc(cap);
	if (!buf) {
		rc = -ENOMEM;
		fail(&c, 0, "out of memory");
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
			fail(&c, 0, "out of memory");
			goto err_free_buf;
		}
		buf = nb;
		cap *= 2;
	}
	if (ferror(f)) {
		rc = errno ? -errno : -EIO;
		fail(&c, 0, "cannot read: %s", strerror(-rc));
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

static void dump_value(const struct ps_config *cfg, const struct opt *o, FILE *out)
{
	const char *src = (const char *)cfg + o->off;
	char buf[PS_HOST_MAX + 16];

	if (o->type != T_TENSORS || !cfg->ntensors)
		fputc(' ', out);
	switch (o->type) {
	case T_INT:
		fprintf(out, "%d\n", *(const int *)src);
		break;
	case T_U64:
		fprintf(out, "%" PRIu64 "\n", *(const uint64_t *)src);
		break;
	case T_SIZE:
		fprintf(out, "%s\n", fmt_size(o->size == sizeof(uint32_t) ? *(const uint32_t *)src
					      : *(const uint64_t *)src, buf, sizeof(buf)));
		break;
	case T_FLOAT:
		fprintf(out, "%s\n", fmt_float(*(const float *)src, buf, sizeof(buf)));
		break;
	case T_BOOL:
		fprintf(out, "%s\n", *(const int *)src ? "true" : "false");
		break;
	case T_ENUM:
		fprintf(out, "%s\n", o->names[*(const int *)src]);
		break;
	case T_ENUMSTR:
		fprintf(out, "%s\n", src);
		break;
	case T_ADDR:
		fprintf(out, "\"%s\"\n", src);
		break;
	case T_SERVERS:
		fputc('[', out);
		for (int i = 0; i < cfg->nshards; i++) {
			fmt_endpoint(&cfg->shards[i], buf, sizeof(buf));
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
					fmt_float(t->init_value, buf, sizeof(buf)));
		}
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
		fprintf(out, "%s%s:", sl ? "  " : "", sl ? dot + 1 : o->key);
		dump_value(cfg, o, out);
	}
}

static void help_opt(FILE *out, const struct opt *o, const char *prefix)
{
	char desc[200];

	fprintf(out, "  %s%s\n      %s; ", prefix, o->key, describe(o, desc, sizeof(desc)));
	if (o->flags & F_REQUIRED)
		fprintf(out, "required\n");
	else
		fprintf(out, "default %s\n", o->def && *o->def ? o->def : "\"\"");
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
