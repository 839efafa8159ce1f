/* table_decl.c - embedding tables declared at run time: defaults, checks,
 * comparison and wire form (table_decl.h). Every bound comes from
 * cfg_table_opts (config_table.c), the table model.embeddings[] is loaded
 * with, so a declared table and a YAML one obey the same rules.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include "config_int.h"
#include "ps_err.h"
#include "table_decl.h"

void ps_table_decl_defaults(struct ps_table_cfg *t)
{
	struct table_tmp tt;

	memset(&tt, 0, sizeof(tt));
	cfg_apply_defaults(cfg_table_opts, NTABLE, &tt);
	tt.t.init_value = tt.t.init == PS_INIT_CONST ? tt.value
			  : tt.t.init == PS_INIT_UNIFORM || tt.t.init == PS_INIT_NORMAL ? tt.scale
			  : 0.0f;
	*t = tt.t;
}

/* Whether d lies within option k's bounds. */
static int in_bounds(int k, double d)
{
	const struct opt *o = &cfg_table_opts[k];

	return !(d < o->min || d > o->max || ((o->flags & F_OPEN_MIN) && d == o->min) ||
		 ((o->flags & F_OPEN_MAX) && d == o->max) || d != d);
}

static int bad(const struct ps_table_cfg *t, int k, double d, char *why, size_t wl)
{
	char b[100];

	snprintf(why, wl, "table '%s': %s is %g, expected %s", t->name, cfg_table_opts[k].key, d,
		 cfg_describe(&cfg_table_opts[k], b, sizeof(b)));
	return PS_ECONFIG;
}

int ps_table_decl_check(const struct ps_table_cfg *t, char *why, size_t wl)
{
	size_t len = strnlen(t->name, sizeof(t->name));
	const struct { int k; double v; } num[] = {
		{ EO_DIM, t->dim }, { EO_LR, t->lr }, { EO_EPS, t->eps }, { EO_BETA1, t->beta1 },
		{ EO_BETA2, t->beta2 }, { EO_ACC, t->initial_accumulator }, { EO_L1, t->l1 },
		{ EO_L2, t->l2 }, { EO_FTRL_BETA, t->ftrl_beta }, { EO_ADMISSION, t->admission },
		{ EO_TTL, t->ttl_s }, { EO_MAX_ROWS, (double)t->max_rows },
		{ EO_FILTER, (double)t->filter_ids },
	};

	if (!len || len >= PS_NAME_MAX) {
		snprintf(why, wl, "table name of %zu bytes, expected 1..%d", len, PS_NAME_MAX - 1);
		return PS_ECONFIG;
	}
	if ((int)t->init < PS_INIT_ZEROS || t->init > PS_INIT_NORMAL) {
		snprintf(why, wl, "table '%s': init %d, expected zeros, const, uniform or normal "
			 "(arange: rows have no element index)", t->name, (int)t->init);
		return PS_ECONFIG;
	}
	if (t->optimizer < 0 || t->optimizer >= PS_ROPT_COUNT) {
		snprintf(why, wl, "table '%s': optimizer %d, expected sgd, adagrad, rowwise_adagrad, "
			 "adam or ftrl", t->name, t->optimizer);
		return PS_ECONFIG;
	}
	for (size_t i = 0; i < sizeof(num) / sizeof(num[0]); i++)
		if (!in_bounds(num[i].k, num[i].v))
			return bad(t, num[i].k, num[i].v, why, wl);
	if (t->init == PS_INIT_CONST && !in_bounds(EO_VALUE, t->init_value))
		return bad(t, EO_VALUE, t->init_value, why, wl);
	if ((t->init == PS_INIT_UNIFORM || t->init == PS_INIT_NORMAL) &&
	    !in_bounds(EO_SCALE, t->init_value))
		return bad(t, EO_SCALE, t->init_value, why, wl);
	if (t->init == PS_INIT_ZEROS && t->init_value != 0.0f) {
		snprintf(why, wl, "table '%s': init zeros with a value of %g", t->name,
			 (double)t->init_value);
		return PS_ECONFIG;
	}
	if (t->optimizer == PS_ROPT_FTRL && t->init != PS_INIT_ZEROS) {
		snprintf(why, wl, "table '%s': optimizer ftrl derives the weights from its state and "
			 "starts them at 0; expected init zeros, got %s", t->name,
			 cfg_init_names[t->init]);
		return PS_ECONFIG;
	}
	if (t->fields) {
		snprintf(why, wl, "table '%s': fields are for model.embeddings of the ctr preset",
			 t->name);
		return PS_ECONFIG;
	}
	return 0;
}

int ps_table_decl_diff(const struct ps_table_cfg *a, const struct ps_table_cfg *b,
		       const char *a_is, const char *b_is, char *why, size_t wl)
{
	const struct { const char *key; double x, y; } f[] = {
		{ "dim", a->dim, b->dim }, { "init", a->init, b->init },
		{ a->init == PS_INIT_CONST ? "value" : "scale", a->init_value, b->init_value },
		{ "optimizer", a->optimizer, b->optimizer }, { "lr", a->lr, b->lr },
		{ "eps", a->eps, b->eps }, { "beta1", a->beta1, b->beta1 },
		{ "beta2", a->beta2, b->beta2 },
		{ "initial_accumulator", a->initial_accumulator, b->initial_accumulator },
		{ "l1", a->l1, b->l1 }, { "l2", a->l2, b->l2 },
		{ "ftrl_beta", a->ftrl_beta, b->ftrl_beta }, { "admission", a->admission, b->admission },
		{ "ttl", a->ttl_s, b->ttl_s }, { "max_rows", (double)a->max_rows, (double)b->max_rows },
		{ "filter_ids", (double)a->filter_ids, (double)b->filter_ids },
	};

	if (strcmp(a->name, b->name)) {
		snprintf(why, wl, "table name differs: '%s' %s, '%s' %s", a->name, a_is, b->name, b_is);
		return 1;
	}
	for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) {
		if (f[i].x == f[i].y)
			continue;
		if (!strcmp(f[i].key, "init"))
			snprintf(why, wl, "table '%s': init differs: %s %s, %s %s", a->name,
				 cfg_init_names[a->init], a_is, cfg_init_names[b->init], b_is);
		else if (!strcmp(f[i].key, "optimizer"))
			snprintf(why, wl, "table '%s': optimizer differs: %s %s, %s %s", a->name,
				 cfg_row_optim_names[a->optimizer], a_is,
				 cfg_row_optim_names[b->optimizer], b_is);
		else
			snprintf(why, wl, "table '%s': %s differs: %.9g %s, %.9g %s", a->name, f[i].key,
				 f[i].x, a_is, f[i].y, b_is);
		return 1;
	}
	return 0;
}

void ps_table_decl_to_msg(const struct ps_table_cfg *t, Ps__TableDef *m)
{
	ps__table_def__init(m);
	m->name = (char *)t->name;
	m->dim = (uint32_t)t->dim;
	m->init = (uint32_t)t->init;
	m->init_value = t->init_value;
	m->optimizer = (uint32_t)t->optimizer;
	m->lr = t->lr;
	m->eps = t->eps;
	m->beta1 = t->beta1;
	m->beta2 = t->beta2;
	m->initial_accumulator = t->initial_accumulator;
	m->l1 = t->l1;
	m->l2 = t->l2;
	m->ftrl_beta = t->ftrl_beta;
	m->admission = (uint32_t)t->admission;
	m->ttl_s = (uint64_t)t->ttl_s;
	m->max_rows = (uint64_t)t->max_rows;
	m->filter_ids = (uint64_t)t->filter_ids;
}

int ps_table_decl_from_msg(const Ps__TableDef *m, struct ps_table_cfg *t, char *why, size_t wl)
{
	size_t len = m->name ? strlen(m->name) : 0;

	memset(t, 0, sizeof(*t));
	if (!len || len >= PS_NAME_MAX) {
		snprintf(why, wl, "table name of %zu bytes, expected 1..%d", len, PS_NAME_MAX - 1);
		return PS_EPROTO;
	}
	memcpy(t->name, m->name, len + 1);
	/* the wide fields bounded before they are narrowed */
	if (m->dim > PS_MAX_ROW_DIM || m->init > PS_INIT_NORMAL || m->optimizer >= PS_ROPT_COUNT ||
	    m->admission > 255 || m->ttl_s > (1u << 30) || m->max_rows > (UINT64_C(1) << 40) ||
	    m->filter_ids > (UINT64_C(1) << 32)) {
		snprintf(why, wl, "table '%s': dim %u, init %u, optimizer %u, admission %u, ttl %"
			 PRIu64 ", max_rows %" PRIu64 " or filter_ids %" PRIu64 " out of range",
			 t->name, m->dim, m->init, m->optimizer, m->admission, m->ttl_s, m->max_rows,
			 m->filter_ids);
		return PS_ECONFIG;
	}
	t->dim = (int)m->dim;
	t->init = (enum ps_init_kind)m->init;
	t->init_value = m->init_value;
	t->optimizer = (int)m->optimizer;
	t->lr = m->lr;
	t->eps = m->eps;
	t->beta1 = m->beta1;
	t->beta2 = m->beta2;
	t->initial_accumulator = m->initial_accumulator;
	t->l1 = m->l1;
	t->l2 = m->l2;
	t->ftrl_beta = m->ftrl_beta;
	t->admission = (int)m->admission;
	t->ttl_s = (int)m->ttl_s;
	t->max_rows = (int64_t)m->max_rows;
	t->filter_ids = (int64_t)m->filter_ids;
	return ps_table_decl_check(t, why, wl);
}
