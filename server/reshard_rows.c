/* reshard_rows.c - a re-shard's embedding rows: gathered from the old
 * shards' scratch tables, merged in order of their last update and
 * inserted into the new shard's tables (reshard.c's merge); and the staged
 * form (the pre-copy, reshard_stage.c): the same merge made before the
 * stop, then brought up to the stop by the rows the stop's incremental
 * checkpoints changed and dropped.
 *
 * Order. A scratch table stamps in whole wall-clock seconds (table.h):
 * a row's key K is its snapshot's second less its age there, never below
 * the key of the row restored before it, so each old shard's recency list
 * is sorted by K and K depends on the files alone, not on when they were
 * read. The new table's list is the old lists merged by (K, old shard),
 * each list's own order kept on ties; its stamps are K less the oldest
 * key, its epoch set so that the newest file's time is now.
 *
 * Staged. The merge is made from the scratch tables as the pre-copy loaded
 * them (premerge), without the table's cap. After the stop's incremental
 * checkpoints reach the scratch tables, which kept the marks of what they
 * changed (keep_changes: the rows changed are the newest of each list,
 * the ids dropped are its tombstones), apply() removes every id dropped
 * from the merged table, then re-inserts the rows whose keys come after
 * the first changed row's (the few unchanged rows near the stop, and the
 * changed rows, merged) as the newest; then the cap drops the oldest
 * past it. Each old list after the stop is the list at the pre-copy less
 * the ids dropped, plus the changed rows at its newest end, all sorted by
 * key: merging those is the merge of the pre-copy's lists less the ids
 * dropped (still merged) with the changed rows merged in, so the table is
 * the one the unstaged merge builds from the same files, row for row,
 * stamp for stamp. What cannot be applied so (tombstones past their
 * bound, a full checkpoint loaded instead of the increments) is merged
 * whole as unstaged (reshard.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ps_err.h"
#include "ps_log.h"
#include "ps_time.h"
#include "reshard_int.h"
#include "rows.h"
#include "rows_wire.h"
#include "server.h"
#include "server_int.h"

#define FAILR(code, ...) do { snprintf(err, errlen, __VA_ARGS__); rc = (code); goto out; } while (0)

/* Sort order: key, then old shard, then place in its recency list (the
 * index, gathered in that order). */
static const struct ps__gathered *sort_g;

static int cmp_rows(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	if (sort_g->t[x] != sort_g->t[y])
		return sort_g->t[x] < sort_g->t[y] ? -1 : 1;
	if (sort_g->from[x] != sort_g->from[y])
		return sort_g->from[x] < sort_g->from[y] ? -1 : 1;
	return x < y ? -1 : (x > y);
}

/* Whether each of g's nruns runs is in key order. */
static int runs_sorted(const struct ps__gathered *g, int nruns)
{
	for (int j = 0; j < nruns; j++)
		for (uint64_t i = g->run[j] + 1; i < g->run[j + 1]; i++)
			if (g->t[i - 1] > g->t[i])
				return 0;
	return 1;
}

/* The order to insert g's rows in (cmp_rows): each old shard's run was
 * gathered oldest first and is in key order (scratch stamps never fall),
 * so the runs are merged (a pass over the heads, as few as the old
 * shards); a run out of order (not from a scratch table) is sorted whole. */
static void order_rows(const struct ps__gathered *g, int nruns, uint64_t *order)
{
	uint64_t pos[PS_MAX_SHARDS];

	sort_g = g;
	if (!runs_sorted(g, nruns)) {
		ps_info("re-shard: an old shard's rows are not in the order of their last update: "
			"sorting all %" PRIu64, g->n);
		for (uint64_t i = 0; i < g->n; i++)
			order[i] = i;
		qsort(order, g->n, sizeof(*order), cmp_rows);
		return;
	}
	memcpy(pos, g->run, (size_t)nruns * sizeof(*pos));
	for (uint64_t k = 0; k < g->n; k++) {
		int best = -1;
		for (int j = 0; j < nruns; j++)
			if (pos[j] < g->run[j + 1] && (best < 0 || cmp_rows(&pos[j], &pos[best]) < 0))
				best = j;
		order[k] = pos[best]++;
	}
}

int ps__gather_grow(struct ps__gathered *g, uint64_t c)
{
	uint64_t *ids;
	double *ts;
	uint32_t *fr, *rs = NULL;
	float *vs = NULL;

	if (c <= g->cap)
		return 0;
	ids = realloc(g->id, c * sizeof(*ids));
	if (ids)
		g->id = ids;
	ts = realloc(g->t, c * sizeof(*ts));
	if (ts)
		g->t = ts;
	fr = realloc(g->from, c * sizeof(*fr));
	if (fr)
		g->from = fr;
	if (g->refs) {
		rs = realloc(g->row, c * sizeof(*rs));
		if (rs)
			g->row = rs;
	} else {
		vs = realloc(g->vals, c * sizeof(*vs) * (size_t)g->row_floats);
		if (vs)
			g->vals = vs;
	}
	if (!ids || !ts || !fr || (g->refs ? !rs : !vs))
		return -ENOMEM;
	g->cap = c;
	return 0;
}

/* Adds row r of old shard from (its values v, unless g->refs). */
static int gather_add(struct ps__gathered *g, uint64_t id, double t, uint32_t from, uint32_t r,
		      const float *v)
{
	if (g->n == g->cap && ps__gather_grow(g, g->cap ? g->cap * 2 : 1024))
		return -ENOMEM;
	g->id[g->n] = id;
	g->t[g->n] = t;
	g->from[g->n] = from;
	if (g->refs)
		g->row[g->n] = r;
	else
		memcpy(g->vals + g->n * (size_t)g->row_floats, v,
		       sizeof(float) * (size_t)g->row_floats);
	g->n++;
	return 0;
}

void ps__gather_free(struct ps__gathered *g)
{
	free(g->id);
	free(g->t);
	free(g->from);
	free(g->vals);
	free(g->row);
	memset(g, 0, sizeof(*g));
}

/* A scratch row's key: whole wall-clock seconds (table.h). */
static double key_of(const struct ps_table *ot, uint32_t r)
{
	return ot->epoch + (double)ps_table_meta(ot, r)->stamp;
}

int ps__gather_rows(struct ps__gathered *g, const struct ps_table *ot, const struct ps_table *tb,
		    int j, int shard, int nshards, uint64_t *moved)
{
	/* a scratch table that kept only this shard's rows needs no second
	 * look (the same hash: the same table, shard count) */
	int kept = ot->keep_nshards == nshards && ot->keep_shard == shard && ot->tkey == tb->tkey;

	g->run[j] = g->n;
	for (uint32_t r = ot->tail; r != PS_ROW_NIL; r = ps_table_meta(ot, r)->prev) {
		uint64_t id = ps_row_id(ps_table_meta(ot, r));

		if (!kept && ps_rows_shard(tb->tkey, id, nshards) != shard)
			continue;
		if (gather_add(g, id, key_of(ot, r), (uint32_t)j, r, ps_table_vals(ot, r)))
			return -ENOMEM;
		if (j != shard)
			(*moved)++;
	}
	return 0;
}

int ps__insert_rows(struct ps_table *tb, struct ps__gathered *g, int n, struct ps_server *olds,
		    int t, double *oldest, char *err, size_t errlen)
{
	uint64_t *order = malloc((g->n ? g->n : 1) * sizeof(*order));
	struct ps_table_bulk bulk = { 0 };
	int rc = 0;

	g->run[n] = g->n;
	if (!order) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	order_rows(g, n, order);
	if (g->n)
		*oldest = g->t[order[0]];
	if (ps_table_bulk_begin(tb, &bulk, g->n)) {
		snprintf(err, errlen, "table '%s': out of memory for %" PRIu64 " rows", tb->tc->name,
			 g->n);
		rc = -ENOMEM;
		goto out;
	}
	for (uint64_t i = 0; i < g->n; i++) {
		uint64_t x = order[i];
		double st = g->t[x] - *oldest;
		uint32_t r;
		int dup;

		if (i + PS_TABLE_PREFETCH_AHEAD < g->n)
			ps_table_bulk_prefetch(tb, &bulk, g->id[order[i + PS_TABLE_PREFETCH_AHEAD]]);
		r = ps_table_bulk_insert(tb, &bulk, g->id[x], st > 0 ? (uint32_t)st : 0, &dup);
		if (r == PS_ROW_NIL) {
			if (dup)
				snprintf(err, errlen, "table '%s': row id %" PRIu64 " is in old shard %u's "
					 "checkpoint and in another's (damaged, or of two clusters?)",
					 tb->tc->name, g->id[x], g->from[x]);
			else
				snprintf(err, errlen, "table '%s': out of memory at row %" PRIu64,
					 tb->tc->name, i);
			rc = dup ? PS_EPROTO : -ENOMEM;
			goto out;
		}
		memcpy(ps_table_vals(tb, r), g->refs ?
		       ps_table_vals(&olds[g->from[x]].rows->t[t].tb, g->row[x]) :
		       g->vals + x * (size_t)g->row_floats,
		       sizeof(float) * (size_t)g->row_floats);
	}
out:
	ps_table_bulk_end(&bulk);
	free(order);
	return rc;
}

int ps__reshard_reset_tables(struct ps_server *s)
{
	for (int t = 0; s->rows && t < s->rows->ntables; t++) {
		struct ps_table *tb = &s->rows->t[t].tb;
		int rc;

		ps_table_free(tb);
		rc = ps_table_init(tb, s->cfg, t, s->cfg->nshards, ps_now_s());
		if (rc)
			return rc;
	}
	return 0;
}

/* ---- staged: the merge before the stop, the stop's changes after ---- */

int ps__reshard_premerge(struct ps_server *s, struct ps__staged *st, char *err, size_t errlen)
{
	int nt = s->rows ? s->rows->ntables : 0, rc = 0;
	uint64_t moved = 0;

	for (int t = 0; t < nt; t++) {
		struct ps_table *tb = &s->rows->t[t].tb;
		struct ps__gathered g = { 0 };
		uint64_t want = 0;
		double oldest = 0;

		g.refs = 1;
		g.row_floats = tb->row_floats;
		for (int j = 0; j < st->n; j++)
			want += st->o[j].rows->t[t].tb.nrows;
		rc = ps__gather_grow(&g, want);
		for (int j = 0; !rc && j < st->n; j++)
			rc = ps__gather_rows(&g, &st->o[j].rows->t[t].tb, tb, j, s->shard,
					     s->cfg->nshards, &moved);
		if (rc) {
			snprintf(err, errlen, "out of memory gathering the rows of table '%s'",
				 tb->tc->name);
			ps__gather_free(&g);
			return rc;
		}
		/* no cap yet: rows dropped by the stop may make room */
		tb->cap = 0;
		rc = ps__insert_rows(tb, &g, st->n, st->o, t, &oldest, err, errlen);
		ps__gather_free(&g);
		if (rc)
			return rc;
		st->kref[t] = (int64_t)oldest;
	}
	/* from here the scratch tables keep the marks of what the stop's
	 * incremental checkpoints change */
	for (int j = 0; j < st->n; j++)
		for (int t = 0; t < nt; t++) {
			struct ps_table *ot = &st->o[j].rows->t[t].tb;
			ot->keep_changes = 1;
			ot->track_tombs = 1;
			ps_table_clear_changes(ot);
		}
	st->premerged = 1;
	return 0;
}

/* How many rows of ot changed since the premerge, all at the newest end
 * of its list in key order; -1 when they are not so (then apply cannot). */
static int64_t changed_run(const struct ps_table *ot)
{
	uint64_t marked = 0, n = 0;
	uint32_t r = ot->head, newer = PS_ROW_NIL;

	if (ot->ntombs == UINT64_MAX)
		return -1; /* a dropped id not remembered */
	for (uint32_t k = 0; k < ot->nchunks; k++)
		for (uint32_t w = 0; w < PS_TABLE_CHUNK / 64; w++)
			marked += (uint64_t)__builtin_popcountll(ot->dirty[k][w]);
	for (; r != PS_ROW_NIL && ps_table_changed(ot, r); newer = r, r = ps_table_meta(ot, r)->next) {
		if (newer != PS_ROW_NIL &&
		    ps_table_meta(ot, r)->stamp > ps_table_meta(ot, newer)->stamp)
			return -1;
		n++;
	}
	return n == marked ? (int64_t)n : -1;
}

int ps__reshard_apply_possible(const struct ps__staged *st, int nt)
{
	if (!st->premerged || st->reloaded)
		return 0;
	for (int j = 0; j < st->n; j++)
		for (int t = 0; t < nt; t++)
			if (changed_run(&st->o[j].rows->t[t].tb) < 0)
				return 0;
	return 1;
}

/* Rows taken out of the merged table to be inserted again (B). */
struct taken {
	uint64_t n, cap;
	uint64_t *id;
	int64_t *k;
	uint32_t *from;
	float *vals;
};

static int take_add(struct taken *b, uint64_t id, int64_t k, uint32_t from, const float *v,
		    int rf)
{
	if (b->n == b->cap) {
		uint64_t c = b->cap ? b->cap * 2 : 256;
		uint64_t *ids = realloc(b->id, c * sizeof(*ids));
		if (ids)
			b->id = ids;
		int64_t *ks = realloc(b->k, c * sizeof(*ks));
		if (ks)
			b->k = ks;
		uint32_t *fr = realloc(b->from, c * sizeof(*fr));
		if (fr)
			b->from = fr;
		float *vs = realloc(b->vals, c * sizeof(*vs) * (size_t)rf);
		if (vs)
			b->vals = vs;
		if (!ids || !ks || !fr || !vs)
			return -ENOMEM;
		b->cap = c;
	}
	b->id[b->n] = id;
	b->k[b->n] = k;
	b->from[b->n] = from;
	memcpy(b->vals + b->n * (size_t)rf, v, sizeof(float) * (size_t)rf);
	b->n++;
	return 0;
}

/* The old shard whose scratch table holds id, or -1. */
static int owner_of(const struct ps__staged *st, int t, uint64_t id)
{
	for (int j = 0; j < st->n; j++)
		if (ps_table_find(&st->o[j].rows->t[t].tb, id) != PS_ROW_NIL)
			return j;
	return -1;
}

int ps__reshard_apply(struct ps_server *s, struct ps__staged *st, int t, double *oldest,
		      uint64_t *dropped, char *err, size_t errlen)
{
	struct ps_table *tb = &s->rows->t[t].tb;
	struct ps__gathered c = { 0 };
	struct taken b = { 0 };
	int64_t kref = st->kref[t], kmin;
	uint64_t *order = NULL, i, x, ntombs = 0;
	int rf = tb->row_floats, track = tb->track_tombs, rc = 0;

	tb->track_tombs = 0; /* the merged table's own changes are cleared after */
	c.refs = 1;
	c.row_floats = rf;
	/* the ids the stop dropped, and the changed rows' old places */
	for (int j = 0; j < st->n; j++) {
		const struct ps_table *ot = &st->o[j].rows->t[t].tb;
		for (uint64_t q = 0; q < ot->ntombs; q++)
			ps_table_remove(tb, ot->tombs[q]);
		ntombs += ot->ntombs;
	}
	/* the changed rows, each old shard's oldest first, merged by key */
	for (int j = 0; j < st->n; j++) {
		const struct ps_table *ot = &st->o[j].rows->t[t].tb;
		int64_t nc = changed_run(ot);
		uint32_t r = ot->head;

		if (nc < 0)
			FAILR(PS_EPROTO, "table '%s': old shard %d's changes since the pre-copy are "
			      "not at the newest end of its rows", tb->tc->name, j);
		for (int64_t q = 1; q < nc; q++)
			r = ps_table_meta(ot, r)->next;
		c.run[j] = c.n;
		for (int64_t q = 0; q < nc; q++, r = ps_table_meta(ot, r)->prev)
			if (gather_add(&c, ps_row_id(ps_table_meta(ot, r)), key_of(ot, r),
				       (uint32_t)j, r, NULL))
				FAILR(-ENOMEM, "out of memory");
	}
	c.run[st->n] = c.n;
	order = malloc((c.n ? c.n : 1) * sizeof(*order));
	if (!order)
		FAILR(-ENOMEM, "out of memory");
	order_rows(&c, st->n, order);
	/* B: the merged rows whose keys come after the first changed row's,
	 * taken out (newest first) to go back in among the changed rows */
	while (c.n && tb->head != PS_ROW_NIL) {
		uint32_t r = tb->head;
		uint64_t id = ps_row_id(ps_table_meta(tb, r));
		int64_t k = kref + (int64_t)ps_table_meta(tb, r)->stamp;
		int64_t k0 = (int64_t)c.t[order[0]];
		int j = -1;

		if (k < k0)
			break;
		j = owner_of(st, t, id);
		if (j < 0)
			FAILR(PS_EPROTO, "table '%s': row %" PRIu64 " of the merged table is in no old "
			      "shard's rows any more", tb->tc->name, id);
		if (k == k0 && (uint32_t)j <= c.from[order[0]])
			break;
		if (take_add(&b, id, k, (uint32_t)j, ps_table_vals(tb, r), rf))
			FAILR(-ENOMEM, "out of memory");
		ps_table_remove(tb, id);
	}
	/* the oldest key of all: the stamps' zero */
	kmin = tb->nrows ? kref + (int64_t)ps_table_meta(tb, tb->tail)->stamp
	       : c.n ? (int64_t)c.t[order[0]] : b.n ? b.k[b.n - 1] : kref;
	if (kmin != kref)
		for (uint32_t r = tb->tail; r != PS_ROW_NIL; r = ps_table_meta(tb, r)->prev)
			ps_table_meta(tb, r)->stamp =
				(uint32_t)(kref + (int64_t)ps_table_meta(tb, r)->stamp - kmin);
	/* B (oldest first: from its end) and the changed rows, merged; on
	 * equal keys and shard B's row is the older one of its list */
	i = b.n;
	x = 0;
	while (i > 0 || x < c.n) {
		int from_b = x == c.n ||
			     (i > 0 && (b.k[i - 1] < (int64_t)c.t[order[x]] ||
					(b.k[i - 1] == (int64_t)c.t[order[x]] &&
					 b.from[i - 1] <= c.from[order[x]])));
		uint64_t id = from_b ? b.id[i - 1] : c.id[order[x]];
		int64_t k = from_b ? b.k[i - 1] : (int64_t)c.t[order[x]];
		uint32_t r = ps_table_insert_newest(tb, id, (uint32_t)(k - kmin));

		if (r == PS_ROW_NIL)
			FAILR(-ENOMEM, "table '%s': out of memory", tb->tc->name);
		if (from_b) {
			memcpy(ps_table_vals(tb, r), b.vals + (i - 1) * (size_t)rf, sizeof(float) * (size_t)rf);
			i--;
		} else {
			const struct ps_table *ot = &st->o[c.from[order[x]]].rows->t[t].tb;
			memcpy(ps_table_vals(tb, r), ps_table_vals(ot, c.row[order[x]]),
			       sizeof(float) * (size_t)rf);
			x++;
		}
	}
	ps_info("re-shard: table '%s': the stop's changes applied to the rows merged while "
		"staged: %" PRIu64 " ids dropped, %" PRIu64 " rows changed, %" PRIu64 " rows near "
		"the stop placed again%s", tb->tc->name, ntombs, c.n, b.n,
		kmin != kref ? ", stamps moved to a new oldest row" : "");
	if (tb->nrows)
		*oldest = (double)kmin;
	/* the cap, as the unstaged insertion keeps it: the oldest past it go */
	ps_table_set_cap(tb, s->cfg, s->cfg->nshards);
	*dropped = 0;
	while (tb->cap && tb->nrows > tb->cap) {
		ps_table_remove(tb, ps_row_id(ps_table_meta(tb, tb->tail)));
		(*dropped)++;
	}
out:
	tb->track_tombs = track;
	free(order);
	ps__gather_free(&c);
	free(b.id);
	free(b.k);
	free(b.from);
	free(b.vals);
	return rc;
}
