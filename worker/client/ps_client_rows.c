/* ps_client_rows.c - embedding rows in the client library: pull_rows and
 * push_rows (ps_client.h, docs/embeddings.md).
 *
 * A call's ids are deduplicated (sorted, repeats dropped; a push sums the
 * gradients of a repeated id in input order, so the sum is the same on
 * every run), split by the shard their (table, id) hash names, and each
 * shard's ids sent sorted and delta-varint coded (rows_wire.h). A pull's
 * reply rows are written to every input position that named the id.
 *
 * A re-shard the client follows (ps_client_follow.c) cuts a row request
 * still waiting again for the new map from its parts as sent: a push none
 * of whose parts was acknowledged from all its ids and gradients (the
 * caller's were copied at the call), a pull from the ids not answered yet.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "codec.h"
#include "ps_client_int.h"
#include "ps_err.h"
#include "rows_wire.h"

/* Where a pull's rows go: shard k's j-th row is distinct id sidx[k][j];
 * distinct id u goes to input positions first[u], next[first[u]], ... */
struct rows_req {
	int dim;
	float *out;
	uint32_t *nper;          /* per shard: rows asked for */
	uint32_t **sidx;
	uint32_t *first, *next;  /* UINT32_MAX ends a chain */
};

void ps__client_rows_free(struct rows_req *rr)
{
	if (!rr)
		return;
	if (rr->sidx)
		free(rr->sidx[0]);
	free(rr->sidx);
	free(rr->nper);
	free(rr->first);
	free(rr->next);
	free(rr);
}

/* A distinct id of a call: the id, its index among the call's distinct
 * ids (a pull's u) or its row (a push's gradients), and its shard. */
struct one {
	uint64_t id;
	uint32_t u;
	int shard;
};

static int by_id(const void *a, const void *b)
{
	uint64_t x = ((const struct one *)a)->id, y = ((const struct one *)b)->id;

	return x < y ? -1 : x > y;
}

/* The shard of each of the n ids of table t under the current map, into
 * o[i].shard and count (per shard, zeroed by the caller); PS_ETOOBIG with
 * why when a shard would get more than limits.max_request_rows. */
static int place(const struct ps_config *cfg, int t, struct one *o, size_t n, uint32_t *count,
		 char *why, size_t wl)
{
	uint64_t tkey = ps_rows_table_key(&cfg->tables[t]);

	for (size_t i = 0; i < n; i++) {
		o[i].shard = ps_rows_shard(tkey, o[i].id, cfg->nshards);
		count[o[i].shard]++;
	}
	for (int k = 0; k < cfg->nshards; k++)
		if (count[k] > (uint32_t)cfg->limits.max_request_rows) {
			snprintf(why, wl, "table '%s': %u distinct ids for shard %d in one call; at "
				 "most %d (limits.max_request_rows)", cfg->tables[t].name, count[k], k,
				 cfg->limits.max_request_rows);
			return PS_ETOOBIG;
		}
	return 0;
}

/* Pull r's parts for the current map (r->parts all zero, r->nparts ==
 * c->cfg->nshards): the n distinct ids o (ascending) split by the shard
 * their hash names, r->rows' nper and sidx made anew; every part's
 * PullRows is m with its n_ids. The bytes of ids sent added to *sent. */
static int pull_build(struct ps_client *c, struct req *r, int t, struct one *o, size_t n,
		      Ps__PullRows *m, uint64_t *sent, char *why, size_t wl)
{
	struct rows_req *rr = r->rows;
	int nsh = c->cfg->nshards, rc;
	uint32_t *nper = calloc((size_t)nsh, sizeof(uint32_t)), **sidx = calloc((size_t)nsh,
										 sizeof(*sidx));
	uint32_t *fill = calloc((size_t)nsh, sizeof(uint32_t));
	uint64_t *sid = malloc(sizeof(uint64_t) * (n ? n : 1));

	rc = -ENOMEM;
	if (!nper || !sidx || !fill || !sid || !(sidx[0] = malloc(sizeof(uint32_t) * (n ? n : 1))))
		goto out_free;
	rc = place(c->cfg, t, o, n, nper, why, wl);
	if (rc)
		goto out_free;
	for (int k = 1; k < nsh; k++)
		sidx[k] = sidx[k - 1] + nper[k - 1];
	for (size_t i = 0; i < n; i++)
		sidx[o[i].shard][fill[o[i].shard]++] = o[i].u;
	/* the rows_req's split is the new one from here on, built or not */
	if (rr->sidx)
		free(rr->sidx[0]);
	free(rr->sidx);
	free(rr->nper);
	rr->nper = nper;
	rr->sidx = sidx;
	nper = NULL;
	sidx = NULL;
	for (int k = 0; k < nsh; k++) {
		struct part *p = &r->parts[k];
		uint32_t j = 0;
		if (!rr->nper[k])
			continue;
		for (size_t i = 0; i < n; i++)
			if (o[i].shard == k)
				sid[j++] = o[i].id;
		p->enc = malloc((size_t)j * PS_VARINT_MAX);
		p->iov = malloc(sizeof(*p->iov));
		if (!p->enc || !p->iov) {
			rc = -ENOMEM;
			goto out_free;
		}
		p->iov[0].base = p->enc;
		p->iov[0].len = ps_rows_ids_encode(sid, j, p->enc);
		p->niov = 1;
		m->n_ids = j;
		if (ps__client_pack_part(p, &m->base)) {
			rc = -ENOMEM;
			goto out_free;
		}
		*sent += p->iov[0].len;
	}
	rc = 0;
out_free:
	if (rc == -ENOMEM)
		snprintf(why, wl, "out of memory");
	if (sidx)
		free(sidx[0]);
	free(sidx);
	free(nper);
	free(fill);
	free(sid);
	return rc;
}

/* Push r's parts for the current map (r->parts all zero, r->nparts ==
 * c->cfg->nshards; r->id and r->clock set): the n distinct ids o
 * (ascending) with their summed gradients rows + o[i].u * dim, split by
 * the shard their hash names; sync: every shard gets a part, with no ids
 * when none are its own. The bytes sent added to *sent. */
static int push_build(struct ps_client *c, struct req *r, int t, struct one *o, size_t n,
		      const float *rows, int fp16, uint64_t *sent, char *why, size_t wl)
{
	const struct ps_config *cfg = c->cfg;
	const struct ps_codec_ops *co = ps_codec_get(PS_CODEC_FP16);
	size_t dim = (size_t)cfg->tables[t].dim;
	uint32_t *count = calloc((size_t)cfg->nshards, sizeof(uint32_t));
	uint64_t *sid = malloc(sizeof(uint64_t) * (n ? n : 1));
	float *g = malloc(sizeof(float) * (n * dim + 1));
	int rc = -ENOMEM;

	if (!count || !sid || !g)
		goto out_free;
	rc = place(cfg, t, o, n, count, why, wl);
	if (rc)
		goto out_free;
	for (int k = 0; k < cfg->nshards; k++) {
		Ps__PushRows m = PS__PUSH_ROWS__INIT;
		struct part *p = &r->parts[k];
		size_t nk = count[k], ib, vb, j = 0;
		if (!nk && cfg->consistency != PS_SYNC)
			continue;
		for (size_t i = 0; i < n; i++)
			if (o[i].shard == k) {
				sid[j] = o[i].id;
				memcpy(g + j * dim, rows + (size_t)o[i].u * dim, sizeof(float) * dim);
				j++;
			}
		vb = fp16 ? co->max_bytes(nk * dim, NULL) : nk * dim * sizeof(float);
		p->enc = malloc(nk * PS_VARINT_MAX + 4 + vb);
		p->iov = malloc(sizeof(*p->iov));
		rc = -ENOMEM;
		if (!p->enc || !p->iov)
			goto out_free;
		ib = ps_rows_ids_encode(sid, nk, p->enc);
		m.ids_bytes = ib;
		while (ib & 3)
			p->enc[ib++] = 0;
		if (fp16) {
			struct ps_codec_params prm = { 1.0f, 0 };
			ssize_t e = co->encode(g, NULL, nk * dim, &prm, 0, p->enc + ib, vb);
			if (e < 0) {
				rc = (int)e;
				snprintf(why, wl, "fp16 encoding failed");
				goto out_free;
			}
			vb = (size_t)e;
		} else {
			memcpy(p->enc + ib, g, vb);
		}
		p->iov[0].base = p->enc;
		p->iov[0].len = ib + vb;
		p->niov = 1;
		m.req_id = (uint64_t)r->id;
		m.seq = (uint64_t)r->id; /* increasing: the shard's duplicate check */
		m.table = (char *)cfg->tables[t].name;
		m.n_ids = (uint32_t)nk;
		m.dim = (uint32_t)dim;
		m.clock = r->clock;
		m.codec = fp16 ? PS_CODEC_FP16 : PS_CODEC_NONE;
		if (ps__client_pack_part(p, &m.base))
			goto out_free;
		*sent += p->iov[0].len;
	}
	rc = 0;
out_free:
	if (rc == -ENOMEM)
		snprintf(why, wl, "out of memory");
	free(count);
	free(sid);
	free(g);
	return rc;
}

static int find_table(struct ps_client *c, const char *table)
{
	int t = table ? ps_config_find_table(c->cfg, table) : PS_ENOTENSOR;

	if (t < 0)
		ps__client_set_err(c, "no embedding table '%s' in the config (model.embeddings)",
				   table ? table : "(null)");
	return t;
}

static void count_bytes(struct ps_client *c, uint64_t given, uint64_t sent)
{
	pthread_mutex_lock(&c->mu);
	c->rows_given += given;
	c->rows_sent += sent;
	pthread_mutex_unlock(&c->mu);
}

/* The distinct ids of a call (ascending) as ones (u: their index), and
 * each input position's distinct index in *where. */
static int distinct(struct ps_client *c, const uint64_t *ids, size_t n, struct one **o,
		    size_t *nuniq, uint32_t **where)
{
	uint64_t *uniq = NULL;

	*o = NULL;
	if (n > UINT32_MAX) {
		ps__client_set_err(c, "%zu ids in one call; at most 2^32 - 1", n);
		return PS_ETOOBIG;
	}
	*where = malloc(sizeof(uint32_t) * (n ? n : 1));
	if (!*where || ps_rows_dedup(ids, n, &uniq, nuniq, *where))
		return -ENOMEM;
	*o = malloc(sizeof(**o) * (*nuniq ? *nuniq : 1));
	if (!*o) {
		free(uniq);
		return -ENOMEM;
	}
	for (size_t u = 0; u < *nuniq; u++)
		(*o)[u] = (struct one){ uniq[u], (uint32_t)u, 0 };
	free(uniq);
	return 0;
}

/* Row requests are built and submitted under one map: a re-shard waits
 * (maplock) and then cuts them again (ps__client_rows_recut). */
static int64_t pull_rows(struct ps_client *c, const char *table, uint64_t min_version,
			 const uint64_t *ids, size_t n, float *out)
{
	Ps__PullRows m = PS__PULL_ROWS__INIT;
	int t = find_table(c, table), rc;
	struct req *r = NULL;
	struct rows_req *rr = NULL;
	struct one *o = NULL;
	uint32_t *where = NULL;
	size_t nuniq = 0;
	uint64_t sent = 0;
	char why[300];

	if (t < 0)
		return t;
	rc = distinct(c, ids, n, &o, &nuniq, &where);
	if (rc)
		goto err_free;
	rc = -ENOMEM;
	r = ps__client_req_new(c, REQ_PULL_ROWS);
	rr = calloc(1, sizeof(*rr));
	if (!r || !rr)
		goto err_free;
	r->rows = rr;
	rr->dim = c->cfg->tables[t].dim;
	rr->out = out;
	rr->first = malloc(sizeof(uint32_t) * (nuniq ? nuniq : 1));
	rr->next = malloc(sizeof(uint32_t) * (n ? n : 1));
	if (!rr->first || !rr->next)
		goto err_free;
	for (size_t u = 0; u < nuniq; u++)
		rr->first[u] = UINT32_MAX;
	for (size_t i = n; i-- > 0;) {
		rr->next[i] = rr->first[where[i]];
		rr->first[where[i]] = (uint32_t)i;
	}
	pthread_mutex_lock(&c->mu);
	m.clock = c->clock;
	pthread_mutex_unlock(&c->mu);
	r->id = ps__client_reserve_id(c);
	m.req_id = (uint64_t)r->id;
	m.table = (char *)c->cfg->tables[t].name;
	m.dim = (uint32_t)rr->dim;
	m.min_version = min_version;
	m.codec = (uint32_t)c->cfg->compress.pull;
	rc = pull_build(c, r, t, o, nuniq, &m, &sent, why, sizeof(why));
	if (rc) {
		ps__client_set_err(c, "%s", why);
		goto err_free;
	}
	count_bytes(c, (uint64_t)n * 8, sent);
	free(o);
	free(where);
	return ps__client_submit_built(c, 0, r);

err_free:
	free(o);
	free(where);
	if (r)
		ps__client_req_free(c, r);
	else
		ps__client_rows_free(rr);
	return rc;
}

int64_t ps_client_pull_rows_async(struct ps_client *c, const char *table, uint64_t min_version,
				  const uint64_t *ids, size_t n, float *out)
{
	int64_t id;

	pthread_rwlock_rdlock(&c->maplock);
	id = pull_rows(c, table, min_version, ids, n, out);
	pthread_rwlock_unlock(&c->maplock);
	return id;
}

static int64_t push_rows(struct ps_client *c, const char *table, uint64_t clock,
			 const uint64_t *ids, size_t n, const float *grads, unsigned flags)
{
	int t = find_table(c, table), rc;
	struct req *r = NULL;
	struct one *o = NULL;
	uint32_t *where = NULL;
	float *sum = NULL;
	size_t dim, nuniq = 0;
	uint64_t sent = 0;
	char why[300];

	if (t < 0)
		return t;
	dim = (size_t)c->cfg->tables[t].dim;
	rc = distinct(c, ids, n, &o, &nuniq, &where);
	if (rc)
		goto err_free;
	rc = -ENOMEM;
	/* the gradients of each distinct id, summed in input order */
	sum = calloc(nuniq * dim + 1, sizeof(float));
	r = ps__client_req_new(c, REQ_PUSH_ROWS);
	if (!sum || !r)
		goto err_free;
	for (size_t i = 0; i < n; i++) {
		float *d = sum + (size_t)where[i] * dim;
		const float *g = grads + i * dim;
		for (size_t j = 0; j < dim; j++)
			d[j] += g[j];
	}
	r->id = ps__client_reserve_id(c);
	r->clock = clock;
	rc = push_build(c, r, t, o, nuniq, sum, (flags & PS_PUSH_ROWS_FP16) != 0, &sent, why,
			sizeof(why));
	if (rc) {
		ps__client_set_err(c, "%s", why);
		goto err_free;
	}
	count_bytes(c, (uint64_t)n * (8 + 4 * dim), sent);
	free(o);
	free(where);
	free(sum);
	return ps__client_submit_built(c, 0, r);

err_free:
	free(o);
	free(where);
	free(sum);
	if (r)
		ps__client_req_free(c, r);
	return rc;
}

int64_t ps_client_push_rows_async(struct ps_client *c, const char *table, uint64_t clock,
				  const uint64_t *ids, size_t n, const float *grads,
				  unsigned flags)
{
	int64_t id;

	pthread_rwlock_rdlock(&c->maplock);
	id = push_rows(c, table, clock, ids, n, grads, flags);
	pthread_rwlock_unlock(&c->maplock);
	return id;
}

int ps_client_pull_rows(struct ps_client *c, const char *table, uint64_t min_version,
			const uint64_t *ids, size_t n, float *out)
{
	int64_t id = ps_client_pull_rows_async(c, table, min_version, ids, n, out);

	return id < 0 ? (int)id : ps_client_wait(c, id);
}

int ps_client_push_rows(struct ps_client *c, const char *table, uint64_t clock,
			const uint64_t *ids, size_t n, const float *grads, unsigned flags)
{
	int64_t id = ps_client_push_rows_async(c, table, clock, ids, n, grads, flags);

	return id < 0 ? (int)id : ps_client_wait(c, id);
}

void ps_client_rows_bytes(struct ps_client *c, uint64_t *given, uint64_t *sent)
{
	pthread_mutex_lock(&c->mu);
	*given = c->rows_given;
	*sent = c->rows_sent;
	pthread_mutex_unlock(&c->mu);
}

/* ---- a re-shard (ps_client_follow.c) ---- */

/* A pull waiting: the ids of its parts not answered, decoded from what
 * was sent, asked again of their new owners. */
static int recut_pull(struct ps_client *c, struct req *r, const struct part *old, int nold,
		      char *why, size_t wl)
{
	struct rows_req *rr = r->rows;
	Ps__PullRows *m0 = NULL, m = PS__PULL_ROWS__INIT;
	struct one *o;
	uint64_t *ids, sent = 0;
	size_t n = 0, at = 0;
	int t, rc = 0;

	for (int k = 0; k < nold; k++)
		if (old[k].waiting && old[k].meta)
			n += rr->nper[k];
	o = malloc(sizeof(*o) * (n ? n : 1));
	ids = malloc(sizeof(*ids) * (n ? n : 1));
	if (!o || !ids) {
		rc = -ENOMEM;
		snprintf(why, wl, "out of memory");
		goto out_free;
	}
	for (int k = 0; k < nold && !rc; k++) {
		if (!old[k].waiting || !old[k].meta)
			continue;
		if (!m0 && !(m0 = ps__pull_rows__unpack(NULL, old[k].meta_len, old[k].meta))) {
			rc = -ENOMEM;
			snprintf(why, wl, "cannot read the row pull as sent");
			break;
		}
		rc = ps_rows_ids_decode(old[k].enc, old[k].iov[0].len, rr->nper[k], ids + at, why,
					wl);
		for (uint32_t j = 0; !rc && j < rr->nper[k]; j++)
			o[at + j] = (struct one){ ids[at + j], rr->sidx[k][j], 0 };
		at += rr->nper[k];
	}
	if (rc || !m0)
		goto out_free;
	t = ps_config_find_table(c->cfg, m0->table);
	if (t < 0) {
		rc = PS_ENOTENSOR;
		snprintf(why, wl, "no table '%s' in the new config", m0->table);
		goto out_free;
	}
	qsort(o, n, sizeof(*o), by_id);
	m.req_id = m0->req_id;
	m.table = (char *)c->cfg->tables[t].name;
	m.dim = m0->dim;
	m.min_version = m0->min_version;
	m.clock = m0->clock;
	m.codec = m0->codec;
	rc = pull_build(c, r, t, o, n, &m, &sent, why, wl);
	c->rows_sent += sent;
out_free:
	if (m0)
		ps__pull_rows__free_unpacked(m0, NULL);
	free(o);
	free(ids);
	return rc;
}

/* A push none of whose parts was acknowledged: its ids and summed
 * gradients, decoded from every part as sent (fp16 ones are exact in
 * fp16 again), split for the new map. */
static int recut_push(struct ps_client *c, struct req *r, const struct part *old, int nold,
		      char *why, size_t wl)
{
	Ps__PushRows **ms = calloc((size_t)nold, sizeof(*ms));
	const struct ps_codec_ops *co = ps_codec_get(PS_CODEC_FP16);
	struct one *o = NULL;
	uint64_t *ids = NULL, sent = 0;
	float *g = NULL;
	size_t n = 0, at = 0, dim = 0;
	int t = -1, fp16 = 0, rc = -ENOMEM;

	snprintf(why, wl, "out of memory");
	if (!ms)
		return rc;
	for (int k = 0; k < nold; k++) {
		if (!old[k].meta)
			continue;
		if (!(ms[k] = ps__push_rows__unpack(NULL, old[k].meta_len, old[k].meta)))
			goto out_free;
		n += ms[k]->n_ids;
		dim = ms[k]->dim;
		fp16 |= ms[k]->codec == PS_CODEC_FP16;
		if (t < 0 && (t = ps_config_find_table(c->cfg, ms[k]->table)) < 0) {
			rc = PS_ENOTENSOR;
			snprintf(why, wl, "no table '%s' in the new config", ms[k]->table);
			goto out_free;
		}
	}
	if (t < 0 || dim != (size_t)c->cfg->tables[t].dim) {
		rc = PS_EPROTO;
		snprintf(why, wl, "the row push as sent does not name its table's dim");
		goto out_free;
	}
	o = malloc(sizeof(*o) * (n ? n : 1));
	ids = malloc(sizeof(*ids) * (n ? n : 1));
	g = malloc(sizeof(*g) * (n * dim + 1));
	if (!o || !ids || !g)
		goto out_free;
	rc = 0;
	for (int k = 0; k < nold && !rc; k++) {
		const Ps__PushRows *m = ms[k];
		size_t off, vals;
		if (!m)
			continue;
		off = (m->ids_bytes + 3) & ~(uint64_t)3;
		vals = (size_t)m->n_ids * dim;
		rc = ps_rows_ids_decode(old[k].enc, m->ids_bytes, m->n_ids, ids + at, why, wl);
		if (!rc && m->codec == PS_CODEC_FP16)
			rc = co->decode(old[k].enc + off, old[k].iov[0].len - off, vals, g + at * dim,
					why, wl);
		else if (!rc)
			memcpy(g + at * dim, old[k].enc + off, vals * sizeof(float));
		for (uint32_t j = 0; !rc && j < m->n_ids; j++)
			o[at + j] = (struct one){ ids[at + j], (uint32_t)(at + j), 0 };
		at += m->n_ids;
	}
	if (rc)
		goto out_free;
	qsort(o, n, sizeof(*o), by_id);
	rc = push_build(c, r, t, o, n, g, fp16, &sent, why, wl);
	c->rows_sent += sent;
out_free:
	for (int k = 0; k < nold; k++)
		if (ms[k])
			ps__push_rows__free_unpacked(ms[k], NULL);
	free(ms);
	free(o);
	free(ids);
	free(g);
	return rc;
}

int ps__client_rows_recut(struct ps_client *c, struct req *r, const struct part *old, int nold,
			  char *why, size_t wl)
{
	return r->kind == REQ_PUSH_ROWS ? recut_push(c, r, old, nold, why, wl)
					: recut_pull(c, r, old, nold, why, wl);
}

/* A shard's rows for a pull_rows (I/O thread or a waiting thread, c->mu
 * held): checked whole, then written to every position that asked. */
void ps__client_on_rows_reply(struct ps_client *c, int k, const Ps__PullRowsReply *m,
			      const struct ps_frame *f)
{
	struct req *r = ps__client_find_req(c, (int64_t)m->req_id);
	struct rows_req *rr;
	char why[300] = "";
	size_t vals;
	float *tmp = NULL;
	const float *src;

	if (!r || r->kind != REQ_PULL_ROWS || !r->parts[k].waiting)
		return;
	rr = r->rows;
	vals = (size_t)rr->nper[k] * (size_t)rr->dim;
	if (m->n_rows != rr->nper[k] || m->dim != (uint32_t)rr->dim || m->codec > PS_CODEC_FP16 ||
	    f->hdr.payload_len != vals * (m->codec ? 2 : 4)) {
		snprintf(why, sizeof(why), "shard %d sent a malformed row pull reply (%u rows of dim "
			 "%u, %llu bytes; asked for %u of dim %d)", k, m->n_rows, m->dim,
			 (unsigned long long)f->hdr.payload_len, rr->nper[k], rr->dim);
		ps__client_part_done(c, r, k, PS_EPROTO, why);
		return;
	}
	tmp = malloc(sizeof(float) * (vals ? vals : 1));
	if (!tmp) {
		ps__client_part_done(c, r, k, -ENOMEM, "out of memory");
		return;
	}
	if (m->codec == PS_CODEC_FP16) {
		if (ps_codec_get(PS_CODEC_FP16)->decode(f->payload, f->hdr.payload_len, vals, tmp,
							 why, sizeof(why))) {
			free(tmp);
			ps__client_part_done(c, r, k, PS_EPROTO, why);
			return;
		}
	} else {
		memcpy(tmp, f->payload, vals * sizeof(float)); /* the payload may be unaligned */
	}
	src = tmp;
	for (uint32_t j = 0; j < rr->nper[k]; j++)
		for (uint32_t i = rr->first[rr->sidx[k][j]]; i != UINT32_MAX; i = rr->next[i])
			memcpy(rr->out + (size_t)i * (size_t)rr->dim, src + (size_t)j * (size_t)rr->dim,
			       sizeof(float) * (size_t)rr->dim);
	free(tmp);
	ps__client_part_done(c, r, k, 0, NULL);
}
