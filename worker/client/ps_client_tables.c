/* ps_client_tables.c - declaring embedding tables at run time
 * (ps_client_declare_tables; docs/embeddings.md).
 *
 * The client turns the caller's definitions into model.embeddings entries
 * (zero and NULL fields take that key's default), checks them with the
 * config's own rules (table_decl.c), and sends every shard the whole list
 * in a DeclareTables. A shard answers with an ack, with PS_ECONFIG naming
 * the table and the differing field, or with -EAGAIN while rank 0 has not
 * declared yet: those shards are asked again every 20 ms until
 * limits.request_timeout_ms, as ps_client_declare does. Once every shard
 * accepted, the client switches to its own config copy with the tables
 * appended, so pull_rows and push_rows find them by name; their rows are
 * placed by the same (table, id) hash as a YAML table's. A worker that
 * follows a live re-shard ($PS_CONFIG_FOLLOW) while it declares sends the
 * list again to every shard of the new map (ps__client_declare_all): a
 * new shard that has the tables (from the old checkpoints) compares and
 * acks, one without them takes rank 0's list.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "config_int.h"
#include "ps_client_int.h"
#include "ps_err.h"
#include "ps_time.h"
#include "table_decl.h"

/* Index of name in names (NULL-terminated), or -1. */
static int name_index(const char *const *names, const char *name)
{
	for (int i = 0; names[i]; i++)
		if (!strcmp(names[i], name))
			return i;
	return -1;
}

/* The caller's t as a model.embeddings entry into out, defaults applied
 * and checked. 0, or PS_ECONFIG with the reason set on c. */
static int table_of(struct ps_client *c, int i, const struct ps_table_decl *t,
		    struct ps_table_cfg *out)
{
	size_t len = t->name ? strlen(t->name) : 0;
	char why[300];
	int k;

	ps_table_decl_defaults(out);
	if (!len || len >= PS_NAME_MAX) {
		ps__client_set_err(c, "table %d: name of %zu bytes, expected 1..%d", i, len,
				   PS_NAME_MAX - 1);
		return PS_ECONFIG;
	}
	memcpy(out->name, t->name, len + 1);
	if (t->dim > PS_MAX_ROW_DIM || !t->dim) {
		ps__client_set_err(c, "table '%s': dim is %u, expected an integer in 1..%d",
				   out->name, t->dim, PS_MAX_ROW_DIM);
		return PS_ECONFIG;
	}
	out->dim = (int)t->dim;
	if (t->init) {
		k = name_index(cfg_init_names, t->init);
		if (k < 0 || k == PS_INIT_ARANGE) {
			ps__client_set_err(c, "table '%s': init '%.40s', expected zeros, const, "
					   "uniform or normal", out->name, t->init);
			return PS_ECONFIG;
		}
		out->init = (enum ps_init_kind)k;
	}
	if (t->optimizer) {
		k = name_index(cfg_row_optim_names, t->optimizer);
		if (k < 0) {
			ps__client_set_err(c, "table '%s': optimizer '%.40s', expected sgd, adagrad, "
					   "rowwise_adagrad, adam or ftrl", out->name, t->optimizer);
			return PS_ECONFIG;
		}
		out->optimizer = k;
	}
	/* init_value: 0 means the default scale for uniform and normal, the
	 * value 0 for const, nothing for zeros */
	if (out->init == PS_INIT_UNIFORM || out->init == PS_INIT_NORMAL)
		out->init_value = t->init_value != 0.0f ? t->init_value : 0.01f;
	else
		out->init_value = out->init == PS_INIT_CONST ? t->init_value : 0.0f;
	if (out->init == PS_INIT_ZEROS && t->init_value != 0.0f) {
		ps__client_set_err(c, "table '%s': init_value %g is not used by init zeros",
				   out->name, (double)t->init_value);
		return PS_ECONFIG;
	}
#define DEF(f) do { if (t->f != 0.0f) out->f = t->f; } while (0)
	DEF(lr);
	DEF(eps);
	DEF(beta1);
	DEF(beta2);
	DEF(initial_accumulator);
	DEF(l1);
	DEF(l2);
	DEF(ftrl_beta);
#undef DEF
	if (t->admission > 255 || t->ttl_s > (1u << 30) || t->max_rows > (UINT64_C(1) << 40)) {
		ps__client_set_err(c, "table '%s': admission %u (0..255), ttl %llu s (0..%u) or "
				   "max_rows %llu (0..2^40) out of range", out->name, t->admission,
				   (unsigned long long)t->ttl_s, 1u << 30,
				   (unsigned long long)t->max_rows);
		return PS_ECONFIG;
	}
	out->admission = (int)t->admission;
	out->ttl_s = (int)t->ttl_s;
	out->max_rows = (int64_t)t->max_rows;
	if (ps_table_decl_check(out, why, sizeof(why))) {
		ps__client_set_err(c, "%s", why);
		return PS_ECONFIG;
	}
	for (int j = 0; j < c->cfg->ntables; j++)
		if (!strcmp(c->cfg->tables[j].name, out->name)) {
			ps__client_set_err(c, "table '%s' is a table of %s (model.embeddings): a "
					   "declared table needs a name of its own", out->name,
					   c->cfg->path);
			return PS_ECONFIG;
		}
	return 0;
}

/* Submits a DeclareTables of list (n) to shard k alone: its request id,
 * or a negative code. */
static int64_t send_tables(struct ps_client *c, const struct ps_table_cfg *list, int n, int k)
{
	Ps__DeclareTables m = PS__DECLARE_TABLES__INIT;
	Ps__TableDef *defs = calloc((size_t)n, sizeof(*defs));
	Ps__TableDef **ptrs = calloc((size_t)n, sizeof(*ptrs));
	struct req *r = ps__client_req_new(c, REQ_DECLARE_TABLES);
	int rc = -ENOMEM;

	if (!defs || !ptrs || !r)
		goto out;
	for (int i = 0; i < n; i++) {
		ps_table_decl_to_msg(&list[i], &defs[i]);
		ptrs[i] = &defs[i];
	}
	r->id = ps__client_reserve_id(c);
	m.req_id = (uint64_t)r->id;
	m.n_tables = (size_t)n;
	m.tables = ptrs;
	if (ps__client_pack_part(&r->parts[k], &m.base))
		goto out;
	rc = 0;
out:
	free(defs);
	free(ptrs);
	if (rc) {
		if (r)
			ps__client_req_free(c, r);
		return rc;
	}
	return ps__client_submit_built(c, 0, r);
}

/* send_tables() for ps__client_declare_all. */
struct tables_arg {
	const struct ps_table_cfg *list;
	int n;
};

static int64_t send_tables_arg(struct ps_client *c, void *arg, int k)
{
	const struct tables_arg *a = arg;

	return send_tables(c, a->list, a->n, k);
}

int ps_client_declare_tables(struct ps_client *c, const struct ps_table_decl *t, int n)
{
	struct ps_table_cfg *list;
	struct ps_config *cfg;
	int rc = 0, nyaml = c->cfg->ntables;
	char why[600] = "";

	if (c->rank < 0) {
		ps__client_set_err(c, "a monitor cannot declare tables");
		return PS_ESTATE;
	}
	if (c->declared_tables) {
		ps__client_set_err(c, "this client has declared its tables already");
		return PS_ESTATE;
	}
	if (n < 1 || n > PS_MAX_TABLES - nyaml || !t) {
		ps__client_set_err(c, "declaring %d tables: expected 1..%d (at most %d with the "
				   "config's %d)", n, PS_MAX_TABLES - nyaml, PS_MAX_TABLES, nyaml);
		return PS_ETOOBIG;
	}
	list = calloc((size_t)n, sizeof(*list));
	cfg = malloc(sizeof(*cfg));
	if (!list || !cfg) {
		rc = -ENOMEM;
		ps__client_set_err(c, "out of memory");
		goto out;
	}
	for (int i = 0; i < n && !rc; i++) {
		rc = table_of(c, i, &t[i], &list[i]);
		for (int j = 0; !rc && j < i; j++)
			if (!strcmp(list[j].name, list[i].name)) {
				ps__client_set_err(c, "table '%s' declared twice (#%d and #%d)",
						   list[i].name, j, i);
				rc = PS_ECONFIG;
			}
	}
	if (rc)
		goto out;
	struct tables_arg a = { list, n };
	uint64_t gen;
	double since = 0;

	do
		gen = ps__client_reshards(c);
	while ((rc = ps__client_declare_all(c, gen, send_tables_arg, &a, why, sizeof(why))) ==
		       PS__AGAIN_ON_NEW_MAP &&
	       ps__client_again_on_new_map(c, "the declaration of its tables", gen, &since));
	if (rc == PS__AGAIN_ON_NEW_MAP) {
		rc = PS_EMAP;
		snprintf(why, sizeof(why), "the shards were re-sharded again and again for "
			 "limits.reconnect_timeout_ms: declare again");
	}
	if (rc) {
		ps__client_set_err(c, "declaring %d tables: %s", n, why);
		goto out;
	}
	/* every shard has the tables: the client takes its copy with them
	 * (of the map now: a re-shard followed since the last ack took them
	 * along, every old shard having them) */
	pthread_mutex_lock(&c->mu);
	memcpy(cfg, c->cfg, sizeof(*cfg));
	memcpy(&cfg->tables[nyaml], list, sizeof(*list) * (size_t)n);
	cfg->ntables = nyaml + n;
	cfg->ndecl_tables = n;
	ps__client_retire_cfg(c, c->own_cfg); /* kept until ps_client_free */
	c->own_cfg = cfg;
	c->cfg = cfg;
	c->declared_tables = 1;
	pthread_mutex_unlock(&c->mu);
	cfg = NULL;
out:
	free(cfg);
	free(list);
	return rc;
}
