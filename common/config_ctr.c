/* config_ctr.c - which embedding table each categorical field of the ctr
 * preset bags its rows from (model.embeddings[].fields).
 *
 * Three ways to say it: one table (every field shares it), exactly 26
 * tables and no 'fields' (field i in table i), or 'fields' on every table,
 * each field 0..25 in exactly one of them ('fields: []' marks a table the
 * ctr model does not use, served to other clients). Anything else is a
 * mistake worth refusing at load time with the line: a field in two
 * tables, a field in none, a table with no fields while the others have
 * theirs, 'fields' without the ctr preset. The result is the bit set
 * cfg->tables[t].fields, which the worker (ctr_train.c) reads, and the
 * bags' width: the sum over fields of their table's dim.
 */
#include <string.h>

#include "config.h"
#include "config_int.h"
#include "ps_err.h"

#define ALL_FIELDS ((1u << PS_CTR_FIELDS) - 1)

int cfg_set_fields(struct ctx *c, const struct opt *o, void *base, const struct ynode *v,
		   const char *key)
{
	uint32_t *set = (uint32_t *)((char *)base + o->off);
	char got[100];
	int64_t f;

	if (v->kind != YN_SEQ) {
		char desc[200];
		return cfg_fail(c, v->line, "key '%s': expected %s, got %s", key,
				cfg_describe(o, desc, sizeof(desc)), cfg_what(v, got, sizeof(got)));
	}
	*set = 0;
	for (size_t i = 0; i < v->nkids; i++) {
		const struct ynode *s = v->kids[i];

		if (s->kind != YN_SCALAR || cfg_parse_i64(s->text, &f) || f < 0 ||
		    f >= PS_CTR_FIELDS)
			return cfg_fail(c, s->line, "key '%s[%zu]': expected a categorical field "
					"number 0..%d, got %s", key, i, PS_CTR_FIELDS - 1,
					cfg_what(s, got, sizeof(got)));
		if (*set & (1u << f))
			return cfg_fail(c, s->line, "key '%s[%zu]': field %d is listed twice", key, i,
					(int)f);
		*set |= 1u << f;
	}
	return 0;
}

int cfg_fields_unused(struct ctx *c, const struct ps_config *cfg)
{
	for (int t = 0; t < cfg->ntables; t++)
		if (c->fields_at[t])
			return cfg_fail(c, c->fields_at[t]->line, "key 'model.embeddings[%d].fields': "
					"only the ctr preset bags fields from tables (model.preset "
					"is '%s')", t, cfg->model.preset[0] ? cfg->model.preset : "none");
	return 0;
}

const char *cfg_field_list(uint32_t set, char *buf, size_t len)
{
	size_t off = 0;

	buf[0] = '\0';
	for (int f = 0; f < PS_CTR_FIELDS && off < len; f++)
		if (set & (1u << f)) {
			int n = snprintf(buf + off, len - off, "%s%d", off ? ", " : "", f);
			off = n < 0 ? len : off + (size_t)n;
		}
	return buf;
}

int cfg_ctr_fields(struct ctx *c, struct ps_config *cfg, const struct ynode *pre,
		   const struct ynode *em, int *width)
{
	int given = -1, missing = -1, line = em ? em->line : pre->line;
	uint32_t covered = 0;
	char list[100];

	if (cfg->ntables < 1)
		return cfg_fail(c, pre->line, "key 'model.preset': ctr bags its categorical fields "
				"from embedding tables: give 'model.embeddings' (one table for "
				"every field, one per field, or each with its 'fields')");
	for (int t = 0; t < cfg->ntables; t++) {
		if (c->fields_at[t])
			given = t;
		else
			missing = t;
	}
	if (given < 0) {
		/* no 'fields' anywhere: one table for all, or one per field */
		if (cfg->ntables != 1 && cfg->ntables != PS_CTR_FIELDS)
			return cfg_fail(c, line, "key 'model.embeddings': ctr with %d tables: give "
					"1 table (every field bags from it), %d (field i from table "
					"i), or 'fields' on each table (which of the fields 0..%d it "
					"holds)", cfg->ntables, PS_CTR_FIELDS, PS_CTR_FIELDS - 1);
		for (int t = 0; t < cfg->ntables; t++)
			cfg->tables[t].fields = cfg->ntables == 1 ? ALL_FIELDS : 1u << t;
	} else if (missing >= 0) {
		return cfg_fail(c, c->table_line[missing], "key 'model.embeddings[%d]': table '%s' "
				"has no 'fields' while table '%s' has (line %d): list the fields it "
				"bags, or 'fields: []' for a table the ctr model does not use", missing,
				cfg->tables[missing].name, cfg->tables[given].name,
				c->fields_at[given]->line);
	}
	/* each field in one table only */
	for (int t = 0; t < cfg->ntables; t++) {
		uint32_t twice = cfg->tables[t].fields & covered;

		if (twice) {
			int f = __builtin_ctz(twice), first = 0;
			while (!(cfg->tables[first].fields & (1u << f)))
				first++;
			return cfg_fail(c, c->fields_at[t]->line, "key 'model.embeddings[%d].fields': "
					"field %d is already in table '%s' (line %d); each field bags "
					"from one table", t, f, cfg->tables[first].name,
					c->fields_at[first]->line);
		}
		covered |= cfg->tables[t].fields;
	}
	if (covered != ALL_FIELDS)
		return cfg_fail(c, line, "key 'model.embeddings': field%s %s in no table's "
				"'fields'; each of the fields 0..%d bags from exactly one table",
				__builtin_popcount(ALL_FIELDS & ~covered) > 1 ? "s" : "",
				cfg_field_list(ALL_FIELDS & ~covered, list, sizeof(list)),
				PS_CTR_FIELDS - 1);
	*width = 0;
	for (int t = 0; t < cfg->ntables; t++)
		*width += __builtin_popcount(cfg->tables[t].fields) * cfg->tables[t].dim;
	return 0;
}
