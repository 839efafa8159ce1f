/* config.c - loading the cluster configuration: one option table
 * (config_table.c) drives YAML loading and validation here, and the --help
 * text and the dump of the effective config (config_dump.c).
 *
 * Loading has two steps. libyaml's event parser builds a small tree of nodes
 * that remember their line; aliases, nesting deeper than MAX_DEPTH, huge
 * scalars and oversized input are refused there, so hostile files cost little.
 * The tree is then walked against the option table (cfg_opts, and the entry
 * tables of model.tensors, model.layers and compression.tensors). The result
 * is built in a scratch struct and copied out only when every check passed:
 * a failed load leaves cfg as it was. compression.tensors entries may name tensors derived from
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
#include <unistd.h>

#include "codec.h"
#include "config.h"
#include "config_int.h"
#include "ps_err.h"

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
	int backups = o->off == offsetof(struct ps_config, backups);
	struct ps_endpoint *list = backups ? cfg->backups : cfg->shards;

	if (v->kind != YN_SEQ || v->nkids < o->min || v->nkids > o->max)
		return bad_value(c, o, v, key, v->kind == YN_SEQ ? "wrong number of entries" : NULL);
	for (size_t i = 0; i < v->nkids; i++) {
		const struct ynode *s = v->kids[i];
		struct ps_endpoint *ep = &list[i];

		snprintf(k, sizeof(k), "%s[%zu]", key, i);
		why = NULL;
		if (s->kind != YN_SCALAR || ps_endpoint_parse(s->text, ep, &why))
			return cfg_fail(c, s->line, "key '%s': expected host:port (port 1..65535, IPv6 "
				    "quoted as \"[::1]:7000\"), got %s%s%s%s", k,
				    cfg_what(s, got, sizeof(got)), why ? " (" : "", why ? why : "",
				    why ? ")" : "");
		for (size_t j = 0; j < i; j++)
			if (!strcmp(list[j].host, ep->host) && list[j].port == ep->port)
				return cfg_fail(c, s->line, "key '%s': duplicate server address %s "
					    "(also %s %zu)", k, cfg_what(s, got, sizeof(got)),
					    backups ? "backup" : "shard", j);
	}
	if (backups)
		cfg->nbackups = (int)v->nkids;
	else
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
	cfg_apply_defaults(cfg_tensor_opts, NTENSOR, &tt);
	rc = walk_map(c, cfg_tensor_opts, NTENSOR, &tt, seen, "", disp, m);
	if (rc)
		return rc;
	for (int k = 0; k < NTENSOR; k++)
		if ((cfg_tensor_opts[k].flags & F_REQUIRED) && !seen[k])
			return cfg_fail(c, m->line, "missing required key '%s.%s'", disp, cfg_tensor_opts[k].key);
	init = tt.t.init;
	uses_scale = init == PS_INIT_UNIFORM || init == PS_INIT_NORMAL;
	if (seen[TO_SCALE] && !uses_scale)
		return cfg_fail(c, seen[TO_SCALE]->line, "key '%s.scale': not used by init '%s'%s", disp,
			    cfg_init_names[init], init == PS_INIT_CONST ? " (use 'value')" : "");
	if (seen[TO_VALUE] && init != PS_INIT_CONST)
		return cfg_fail(c, seen[TO_VALUE]->line, "key '%s.value': not used by init '%s'%s", disp,
			    cfg_init_names[init], uses_scale ? " (use 'scale')" : "");
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

/* Parses one model.embeddings entry into cfg->tables[i]. */
static int set_table(struct ctx *c, struct ps_config *cfg, size_t i, const struct ynode *m,
		     const char *key)
{
	const struct ynode *seen[NTABLE] = { 0 };
	struct table_tmp tt;
	char disp[2 * KEY_MAX + 24], got[100];
	int rc, init, uses_scale;

	snprintf(disp, sizeof(disp), "%s[%zu]", key, i);
	if (m->kind != YN_MAP)
		return cfg_fail(c, m->line, "key '%s': expected a mapping with name and dim, got %s",
				disp, cfg_what(m, got, sizeof(got)));
	memset(&tt, 0, sizeof(tt));
	cfg_apply_defaults(cfg_table_opts, NTABLE, &tt);
	rc = walk_map(c, cfg_table_opts, NTABLE, &tt, seen, "", disp, m);
	if (rc)
		return rc;
	for (int k = 0; k < NTABLE; k++)
		if ((cfg_table_opts[k].flags & F_REQUIRED) && !seen[k])
			return cfg_fail(c, m->line, "missing required key '%s.%s'", disp,
					cfg_table_opts[k].key);
	init = tt.t.init;
	uses_scale = init == PS_INIT_UNIFORM || init == PS_INIT_NORMAL;
	if (init == PS_INIT_ARANGE)
		return cfg_fail(c, seen[EO_INIT]->line, "key '%s.init': expected zeros, const, uniform "
				"or normal, got 'arange' (rows have no element index)", disp);
	if (seen[EO_SCALE] && !uses_scale)
		return cfg_fail(c, seen[EO_SCALE]->line, "key '%s.scale': not used by init '%s'", disp,
				cfg_init_names[init]);
	if (seen[EO_VALUE] && init != PS_INIT_CONST)
		return cfg_fail(c, seen[EO_VALUE]->line, "key '%s.value': not used by init '%s'", disp,
				cfg_init_names[init]);
	if (tt.t.optimizer == PS_ROPT_FTRL && init != PS_INIT_ZEROS)
		return cfg_fail(c, seen[EO_INIT] ? seen[EO_INIT]->line : m->line,
				"key '%s.init': optimizer ftrl derives the weights from its state "
				"and starts them at 0; expected init: zeros, got '%s'", disp,
				cfg_init_names[init]);
	tt.t.init_value = init == PS_INIT_CONST ? tt.value : uses_scale ? tt.scale : 0.0f;
	for (size_t j = 0; j < i; j++)
		if (!strcmp(cfg->tables[j].name, tt.t.name))
			return cfg_fail(c, seen[EO_NAME]->line, "key '%s.name': duplicate table name "
					"'%s' (entry %zu)", disp, tt.t.name, j);
	c->fields_at[i] = seen[EO_FIELDS];
	c->table_line[i] = m->line;
	cfg->tables[i] = tt.t;
	return 0;
}

static int set_tables(struct ctx *c, const struct opt *o, struct ps_config *cfg,
		      const struct ynode *v, const char *key)
{
	int rc;

	if (v->kind != YN_SEQ || v->nkids < o->min || v->nkids > o->max)
		return bad_value(c, o, v, key, v->kind == YN_SEQ ? "wrong number of entries" : NULL);
	for (size_t i = 0; i < v->nkids; i++) {
		rc = set_table(c, cfg, i, v->kids[i], key);
		if (rc)
			return rc;
	}
	cfg->ntables = (int)v->nkids;
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
	cfg_apply_defaults(cfg_layer_opts, NLAYER, &l);
	if (m->kind == YN_SCALAR) {
		if (cfg_parse_scalar(&cfg_layer_opts[LO_TYPE], &l, m->text, &why))
			return fail_layer_type(c, m, disp);
		seen[LO_TYPE] = m;
	} else if (m->kind == YN_MAP) {
		rc = walk_map(c, cfg_layer_opts, NLAYER, &l, seen, "", disp, m);
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
		int takes = (cfg_layer_keys[l.kind] >> k) & 1;

		if (seen[k] && !takes)
			return cfg_fail(c, seen[k]->line, "key '%s.%s': not used by a %s layer", disp,
					cfg_layer_opts[k].key, cfg_layer_names[l.kind]);
		if (takes && !seen[k] && !cfg_layer_opts[k].def)
			return cfg_fail(c, m->line, "missing key '%s.%s' (a %s layer needs it: %s)",
					disp, cfg_layer_opts[k].key, cfg_layer_names[l.kind],
					cfg_layer_opts[k].help);
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
		rc = walk_map(c, cfg_override_opts, NOVR, e, seen, "", disp, m);
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
	case T_TABLES:
		return set_tables(c, o, base, v, key);
	case T_FIELDS:
		return cfg_set_fields(c, o, base, v, key);
	default:
		if (v->kind != YN_SCALAR || cfg_parse_scalar(o, base, v->text, &why)) {
			if (o->names == cfg_pull_names && v->kind == YN_SCALAR)
				for (int k = 0; cfg_codec_names[k]; k++)
					if (!strcasecmp(v->text, cfg_codec_names[k]))
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
static int validate(struct ctx *c, struct ps_config *cfg, const struct ynode *root,
		    const struct ynode **seen)
{
	const struct ynode *sl = seen[find_opt(cfg_opts, NCFG, "slice_bytes")];
	const struct ynode *fr = seen[find_opt(cfg_opts, NCFG, "limits.max_frame_bytes")];
	char got[100], a[32], b[32];

	for (size_t i = 0; i < NCFG; i++)
		if ((cfg_opts[i].flags & F_REQUIRED) && !seen[i])
			return cfg_fail(c, section_line(root, cfg_opts[i].key), "missing required key '%s'",
				    cfg_opts[i].key);
	/* transport: rdma loads; whether this machine can run it is the
	 * processes' start-up check (ps_rdma_probe) */
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
	if (cfg->security.encrypt && (!cfg->security.auth || !cfg->security.mac)) {
		const struct ynode *en = seen[find_opt(cfg_opts, NCFG, "security.encrypt")];

		/* the keys come from the handshake, and an encrypted frame is an
		 * authenticated one: encryption without them would be a promise
		 * the connection does not keep */
		return cfg_fail(c, en ? en->line : 0, "key 'security.encrypt': true needs security.auth: "
			    "true and security.mac: true (the keys come from the authenticated "
			    "handshake), got auth: %s, mac: %s", cfg->security.auth ? "true" : "false",
			    cfg->security.mac ? "true" : "false");
	}
	if (cfg->initial_workers > cfg->nworkers) {
		const struct ynode *iw = seen[find_opt(cfg_opts, NCFG, "cluster.initial_workers")];
		return cfg_fail(c, iw ? iw->line : 0, "key 'cluster.initial_workers': %d is more than "
			    "cluster.workers (%d), the ranks there are", cfg->initial_workers,
			    cfg->nworkers);
	}
	if (cfg->initial_workers == 0)
		cfg->initial_workers = cfg->nworkers;
	if (cfg->replicas || cfg->nbackups) {
		const struct ynode *re = seen[find_opt(cfg_opts, NCFG, "cluster.replicas")];
		const struct ynode *bk = seen[find_opt(cfg_opts, NCFG, "cluster.backups")];

		if (cfg->replicas && cfg->nbackups != cfg->nshards)
			return cfg_fail(c, bk ? bk->line : re->line, "key 'cluster.backups': "
				    "cluster.replicas: 1 needs one backup address per shard (%d), got %d",
				    cfg->nshards, cfg->nbackups);
		if (!cfg->replicas)
			return cfg_fail(c, bk->line, "key 'cluster.backups': given, but "
				    "cluster.replicas is 0 (set it to 1 to start backups)");
		for (int i = 0; i < cfg->nbackups; i++)
			for (int j = 0; j < cfg->nshards; j++)
				if (!strcmp(cfg->backups[i].host, cfg->shards[j].host) &&
				    cfg->backups[i].port == cfg->shards[j].port)
					return cfg_fail(c, bk->kids[i]->line, "key 'cluster.backups[%d]': "
						    "%s:%d is also cluster.servers[%d]", i,
						    cfg->backups[i].host, cfg->backups[i].port, j);
	}
	if (cfg->limits.max_write_queue < cfg->limits.max_frame_bytes) {
		const struct ynode *wq = seen[find_opt(cfg_opts, NCFG, "limits.max_write_queue_bytes")];

		/* the default follows a larger frame limit; a value given must hold one frame */
		if (!wq)
			cfg->limits.max_write_queue = cfg->limits.max_frame_bytes;
		else
			return cfg_fail(c, wq->line, "key 'limits.max_write_queue_bytes': expected at "
				    "least limits.max_frame_bytes = %s, got %s",
				    cfg_fmt_size(cfg->limits.max_frame_bytes, b, sizeof(b)),
				    cfg_what(wq, got, sizeof(got)));
	}
	if (cfg->limits.max_queued_bytes < cfg->limits.max_write_queue) {
		const struct ynode *tq = seen[find_opt(cfg_opts, NCFG, "limits.max_queued_bytes")];

		if (!tq)
			cfg->limits.max_queued_bytes = cfg->limits.max_write_queue;
		else
			return cfg_fail(c, tq->line, "key 'limits.max_queued_bytes': expected at "
				    "least limits.max_write_queue_bytes = %s, got %s",
				    cfg_fmt_size(cfg->limits.max_write_queue, b, sizeof(b)),
				    cfg_what(tq, got, sizeof(got)));
	}
	return 0;
}

/* The model: raw tensors, a preset or a list of layers (exactly one). With
 * layers, the shapes are checked and the parameter tensors derived from
 * them, so servers and workers agree on the tensors by construction:
 * weights uniform in +-sqrt(6 / fan_in) (He/Kaiming for ReLU nets), biases 0. */
static int keep_overrides(struct ctx *c, struct ps_config *cfg);

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
	if (!pre && !lay && !ten) {
		/* no dense model: workers declare its tensors at run time
		 * (ps_client_declare) */
		(void)root;
		cfg->declare = 1;
		cfg->ntensors = 0;
		return keep_overrides(c, cfg);
	}
	if (pre && lay)
		return cfg_fail(c, lay->line, "key 'model.layers': give either 'model.preset' "
				"(line %d) or 'model.layers', not both", pre->line);
	if (ten && at)
		return cfg_fail(c, ten->line, "key 'model.tensors': the tensors are derived from the "
				"model's layers (line %d); give one or the other", at->line);
	if (strcmp(cfg->model.preset, "ctr") && (rc = cfg_fields_unused(c, cfg)))
		return rc;
	if (ten)
		return 0;
	if (pre) {
		char name[sizeof(cfg->model.preset)];

		memcpy(name, cfg->model.preset, sizeof(name)); /* the preset writes its name back */
		ps_layers_preset(&cfg->model, name);
		if (!strcmp(name, "ctr")) {
			const struct ynode *em = seen[find_opt(cfg_opts, NCFG, "model.embeddings")];
			int width;

			rc = cfg_ctr_fields(c, cfg, pre, em, &width);
			if (rc)
				return rc;
			/* the dense part's input: the bags, then the numeric features */
			cfg->model.input[0] = cfg->model.input[1] = 1;
			cfg->model.input[2] = width + PS_CTR_NUMERIC;
			cfg->model.classes = 2;
		}
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

/* A config without a model: its compression.tensors entries are kept in
 * cfg->decl_ovr and applied by name to the tensors the workers declare
 * (ps_config_declared_codecs); what can be checked without the tensors
 * (a ratio for a codec other than topk) is checked here. */
static int keep_overrides(struct ctx *c, struct ps_config *cfg)
{
	if (c->novr > PS_MAX_DECL_OVERRIDES)
		return cfg_fail(c, c->ovr[PS_MAX_DECL_OVERRIDES].name_at->line, "key "
				"'compression.tensors': at most %d entries in a config without a "
				"model", PS_MAX_DECL_OVERRIDES);
	for (size_t k = 0; k < c->novr; k++) {
		const struct cfg_override *e = &c->ovr[k];
		struct ps_decl_override *d = &cfg->decl_ovr[k];
		int codec = e->codec_at ? e->codec : cfg->compress.codec;

		if (e->ratio_at && codec != PS_CODEC_TOPK)
			return cfg_fail(c, e->ratio_at->line, "key 'compression.tensors[%zu].ratio': "
					"only topk uses a ratio (this tensor's codec is %s%s)", k,
					cfg_codec_names[codec], e->codec_at ? "" : ", from compression.codec");
		memset(d, 0, sizeof(*d));
		memcpy(d->name, e->name, sizeof(d->name));
		d->has_codec = e->codec_at != NULL;
		d->codec = e->codec;
		d->has_ratio = e->ratio_at != NULL;
		d->ratio = e->ratio;
	}
	cfg->ndecl_ovr = (int)c->novr;
	return 0;
}

int ps_config_declared_codecs(struct ps_config *cfg, char *why, size_t wl)
{
	const struct ps_compress_cfg *cc = &cfg->compress;

	for (int i = 0; i < cfg->ntensors; i++) {
		cfg->tensors[i].codec = cc->codec;
		cfg->tensors[i].ratio = cc->ratio;
	}
	for (int k = 0; k < cfg->ndecl_ovr; k++) {
		const struct ps_decl_override *d = &cfg->decl_ovr[k];
		int t = ps_config_find_tensor(cfg, d->name);

		if (t < 0) {
			snprintf(why, wl, "%s: compression.tensors[%d] names '%s', which is not a "
				 "declared tensor", cfg->path, k, d->name);
			return PS_ECONFIG;
		}
		cfg->tensors[t].codec = d->has_codec ? d->codec : cc->codec;
		if (d->has_ratio)
			cfg->tensors[t].ratio = d->ratio;
	}
	return 0;
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

	if (cfg->declare)
		return 0; /* kept by keep_overrides for the declared names */
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
					cfg_codec_names[codec], e->codec_at ? "" : ", from compression.codec");
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
	const struct ynode *seen[CFG_MAX_OPTS] = { 0 };
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

/* A relative path of a file the config names (f, size bytes) is next to
 * the config file; stored resolved and absolute (a config loaded by a
 * relative path is taken from the working directory), so dumps and the
 * processes started from them (ps.sbatch's derived config, in another
 * folder) name the same file. */
static void cfg_resolve_path(const struct ps_config *cfg, char *f, size_t size)
{
	const char *slash = strrchr(cfg->path, '/');
	int dirlen = slash ? (int)(slash - cfg->path) : 0;
	char cwd[1024] = "", tmp[2200];

	if (!f[0] || f[0] == '/' || !cfg->path[0])
		return;
	if (cfg->path[0] != '/' && !getcwd(cwd, sizeof(cwd)))
		cwd[0] = '\0'; /* left relative to the working directory */
	if (snprintf(tmp, sizeof(tmp), "%s%s%.*s%s%s", cwd, cwd[0] ? "/" : "", dirlen, cfg->path,
		     slash ? "/" : "", f) < (int)size)
		memcpy(f, tmp, strlen(tmp) + 1);
}

/* The files named relative to the config, resolved; a resolved path with a
 * control character (from the config folder's name: a path in the file
 * cannot hold one) is refused, since no config file could name it and
 * the dump would not load back. 0 or PS_ECONFIG with c's error. */
static int cfg_resolve_secret(struct ctx *c, struct ps_config *cfg)
{
	static const char *const key[4] = { "security.secret_file", "security.repl_key_file",
					     "stats.token_file", "security.reader_key_file" };
	char *f[4] = { cfg->security.secret_file, cfg->security.repl_key_file,
		       cfg->stats.token_file, cfg->security.reader_key_file };
	size_t size[4] = { sizeof(cfg->security.secret_file),
			   sizeof(cfg->security.repl_key_file), sizeof(cfg->stats.token_file),
			   sizeof(cfg->security.reader_key_file) };

	for (int i = 0; i < 4; i++) {
		int rel = f[i][0] && f[i][0] != '/';
		cfg_resolve_path(cfg, f[i], size[i]);
		for (const char *q = f[i]; rel && *q; q++)
			if ((unsigned char)*q < 0x20 || *q == 0x7f)
				return cfg_fail(c, 0, "%s: resolved next to this file, the path would "
						"hold a control character (from the folder's name); name "
						"it by an absolute path", key[i]);
	}
	return 0;
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
	if (rc == 0)
		rc = cfg_resolve_secret(&c, cfg);

err_free_buf:
	free(buf);
err_close:
	fclose(f);
	return rc;
}

int ps_config_find_tensor(const struct ps_config *cfg, const char *name)
{
	for (int i = 0; i < cfg->ntensors; i++)
		if (!strcmp(cfg->tensors[i].name, name))
			return i;
	return PS_ENOTENSOR;
}
