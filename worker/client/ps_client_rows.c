/* ps_client_rows.c - embedding rows in the client library: pull_rows and
 * push_rows (ps_client.h, docs/embeddings.md).
 *
 * A call's ids are deduplicated (sorted, repeats dropped; a push sums the
 * gradients of a repeated id in input order, so the sum is the same on
 * every run), split by the shard their (table, id) hash names, and each
 * shard's ids sent sorted and delta-varint coded (rows_wire.h). A pull's
 * reply rows are written to every input position that named the id.
 */
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

/* Distinct ids of the call and their shards. */
struct split {
	uint64_t *uniq;
	size_t nuniq;
	uint32_t *where;         /* input position -> distinct id */
	int *shard;              /* distinct id -> shard */
	uint32_t *count;         /* per shard */
};

static void split_free(struct split *sp)
{
	free(sp->uniq);
	free(sp->where);
	free(sp->shard);
	free(sp->count);
}

static int split_ids(struct ps_client *c, int t, const uint64_t *ids, size_t n,
		     struct split *sp)
{
	const struct ps_config *cfg = c->cfg;
	uint64_t tkey = ps_rows_table_key(&cfg->tables[t]);

	memset(sp, 0, sizeof(*sp));
	if (n > UINT32_MAX) {
		ps__client_set_err(c, "%zu ids in one call; at most 2^32 - 1", n);
		return PS_ETOOBIG;
	}
	sp->where = malloc(sizeof(uint32_t) * (n ? n : 1));
	sp->count = calloc((size_t)cfg->nshards, sizeof(uint32_t));
	if (!sp->where || !sp->count || ps_rows_dedup(ids, n, &sp->uniq, &sp->nuniq, sp->where))
		return -ENOMEM;
	sp->shard = malloc(sizeof(int) * (sp->nuniq ? sp->nuniq : 1));
	if (!sp->shard)
		return -ENOMEM;
	for (size_t u = 0; u < sp->nuniq; u++) {
		sp->shard[u] = ps_rows_shard(tkey, sp->uniq[u], cfg->nshards);
		sp->count[sp->shard[u]]++;
	}
	for (int k = 0; k < cfg->nshards; k++)
		if (sp->count[k] > (uint32_t)cfg->limits.max_request_rows) {
			ps__client_set_err(c, "table '%s': %u distinct ids for shard %d in one call; "
					   "at most %d (limits.max_request_rows)", cfg->tables[t].name,
					   sp->count[k], k, cfg->limits.max_request_rows);
			return PS_ETOOBIG;
		}
	return 0;
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

int64_t ps_client_pull_rows_async(struct ps_client *c, const char *table, uint64_t min_version,
				  const uint64_t *ids, size_t n, float *out)
{
	int nsh = c->cfg->nshards, t = find_table(c, table), rc;
	struct req *r = NULL;
	struct rows_req *rr = NULL;
	struct split sp;
	uint64_t sent = 0, clock;
	uint32_t *fill = NULL;

	if (t < 0)
		return t;
	rc = split_ids(c, t, ids, n, &sp);
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
	rr->nper = calloc((size_t)nsh, sizeof(uint32_t));
	rr->sidx = calloc((size_t)nsh, sizeof(uint32_t *));
	rr->first = malloc(sizeof(uint32_t) * (sp.nuniq ? sp.nuniq : 1));
	rr->next = malloc(sizeof(uint32_t) * (n ? n : 1));
	fill = calloc((size_t)nsh, sizeof(uint32_t));
	if (!rr->nper || !rr->sidx || !rr->first || !rr->next || !fill)
		goto err_free;
	rr->sidx[0] = malloc(sizeof(uint32_t) * (sp.nuniq ? sp.nuniq : 1));
	if (!rr->sidx[0])
		goto err_free;
	for (int k = 1; k < nsh; k++)
		rr->sidx[k] = rr->sidx[k - 1] + sp.count[k - 1];
	for (size_t u = 0; u < sp.nuniq; u++) {
		int k = sp.shard[u];
		rr->sidx[k][fill[k]++] = (uint32_t)u;
		rr->first[u] = UINT32_MAX;
	}
	for (size_t i = n; i-- > 0;) {
		rr->next[i] = rr->first[sp.where[i]];
		rr->first[sp.where[i]] = (uint32_t)i;
	}
	pthread_mutex_lock(&c->mu);
	clock = c->clock;
	pthread_mutex_unlock(&c->mu);
	r->id = ps__client_reserve_id(c);
	for (int k = 0; k < nsh; k++) {
		Ps__PullRows m = PS__PULL_ROWS__INIT;
		struct part *p = &r->parts[k];
		uint64_t *sid;
		if (!sp.count[k])
			continue;
		rr->nper[k] = sp.count[k];
		sid = malloc(sizeof(uint64_t) * sp.count[k]);
		p->enc = malloc((size_t)sp.count[k] * PS_VARINT_MAX);
		p->iov = malloc(sizeof(*p->iov));
		if (!sid || !p->enc || !p->iov) {
			free(sid);
			goto err_free;
		}
		for (uint32_t j = 0; j < sp.count[k]; j++)
			sid[j] = sp.uniq[rr->sidx[k][j]];
		p->iov[0].base = p->enc;
		p->iov[0].len = ps_rows_ids_encode(sid, sp.count[k], p->enc);
		p->niov = 1;
		free(sid);
		m.req_id = (uint64_t)r->id;
		m.table = (char *)c->cfg->tables[t].name;
		m.n_ids = sp.count[k];
		m.dim = (uint32_t)rr->dim;
		m.min_version = min_version;
		m.clock = clock;
		m.codec = (uint32_t)c->cfg->compress.pull;
		if (ps__client_pack_part(p, &m.base))
			goto err_free;
		sent += p->iov[0].len;
	}
	count_bytes(c, (uint64_t)n * 8, sent);
	split_free(&sp);
	free(fill);
	return ps__client_submit_built(c, 0, r);

err_free:
	split_free(&sp);
	free(fill);
	if (r)
		ps__client_req_free(c, r);
	else
		ps__client_rows_free(rr);
	return rc;
}

int64_t ps_client_push_rows_async(struct ps_client *c, const char *table, uint64_t clock,
				  const uint64_t *ids, size_t n, const float *grads,
				  unsigned flags)
{
	int nsh = c->cfg->nshards, t = find_table(c, table), rc, fp16;
	const struct ps_codec_ops *co = ps_codec_get(PS_CODEC_FP16);
	struct req *r = NULL;
	struct split sp;
	float *sum = NULL, *rows = NULL;
	size_t dim;
	uint64_t sent = 0;

	if (t < 0)
		return t;
	dim = (size_t)c->cfg->tables[t].dim;
	fp16 = (flags & PS_PUSH_ROWS_FP16) != 0;
	rc = split_ids(c, t, ids, n, &sp);
	if (rc)
		goto err_free;
	rc = -ENOMEM;
	/* the gradients of each distinct id, summed in input order */
	sum = calloc(sp.nuniq * dim + 1, sizeof(float));
	rows = malloc(sizeof(float) * (sp.nuniq * dim + 1));
	r = ps__client_req_new(c, REQ_PUSH_ROWS);
	if (!sum || !rows || !r)
		goto err_free;
	for (size_t i = 0; i < n; i++) {
		float *d = sum + (size_t)sp.where[i] * dim;
		const float *g = grads + i * dim;
		for (size_t j = 0; j < dim; j++)
			d[j] += g[j];
	}
	r->id = ps__client_reserve_id(c);
	r->clock = clock;
	for (int k = 0; k < nsh; k++) {
		Ps__PushRows m = PS__PUSH_ROWS__INIT;
		struct part *p = &r->parts[k];
		uint64_t *sid;
		size_t nk = sp.count[k], ib, vb, j = 0;
		if (!nk && c->cfg->consistency != PS_SYNC)
			continue;
		vb = fp16 ? co->max_bytes(nk * dim, NULL) : nk * dim * sizeof(float);
		sid = malloc(sizeof(uint64_t) * (nk ? nk : 1));
		p->enc = malloc(nk * PS_VARINT_MAX + 4 + vb);
		p->iov = malloc(sizeof(*p->iov));
		if (!sid || !p->enc || !p->iov) {
			free(sid);
			goto err_free;
		}
		for (size_t u = 0; u < sp.nuniq; u++)
			if (sp.shard[u] == k) {
				sid[j] = sp.uniq[u];
				memcpy(rows + j * dim, sum + u * dim, sizeof(float) * dim);
				j++;
			}
		ib = ps_rows_ids_encode(sid, nk, p->enc);
		free(sid);
		m.ids_bytes = ib;
		while (ib & 3)
			p->enc[ib++] = 0;
		if (fp16) {
			struct ps_codec_params prm = { 1.0f, 0 };
			ssize_t e = co->encode(rows, NULL, nk * dim, &prm, 0, p->enc + ib, vb);
			if (e < 0) {
				rc = (int)e;
				goto err_free;
			}
			vb = (size_t)e;
		} else {
			memcpy(p->enc + ib, rows, vb);
		}
		p->iov[0].base = p->enc;
		p->iov[0].len = ib + vb;
		p->niov = 1;
		m.req_id = (uint64_t)r->id;
		m.seq = (uint64_t)r->id; /* increasing: the shard's duplicate check */
		m.table = (char *)c->cfg->tables[t].name;
		m.n_ids = (uint32_t)nk;
		m.dim = (uint32_t)dim;
		m.clock = clock;
		m.codec = fp16 ? PS_CODEC_FP16 : PS_CODEC_NONE;
		if (ps__client_pack_part(p, &m.base))
			goto err_free;
		sent += p->iov[0].len;
	}
	count_bytes(c, (uint64_t)n * (8 + 4 * dim), sent);
	split_free(&sp);
	free(sum);
	free(rows);
	return ps__client_submit_built(c, 0, r);

err_free:
	split_free(&sp);
	free(sum);
	free(rows);
	if (r)
		ps__client_req_free(c, r);
	return rc;
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
