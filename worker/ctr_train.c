/* ctr_train.c - the ctr preset's training loop (ctr_train.h).
 *
 * The 26 fields bag from one or more tables (cfg->tables[t].fields,
 * resolved by config_ctr.c): each table with fields is a group, and the
 * input x holds the groups' bags side by side, in table order, each
 * table's fields in increasing order (nf x dim columns per group, dims may
 * differ), then the 13 numeric features.
 *
 * A step on one worker, for a batch of B examples:
 *   host: per group, the batch's B x nf ids are deduplicated (a hash
 *         table, first-seen order) into that table's unique ids U, each
 *         bag pointing at its row of U, and the transpose (per unique row,
 *         its bags in order) built for the deterministic backward; the
 *         numeric features go to the last 13 columns of the input x.
 *   pull: each group's rows of U from its table (sync: the table's
 *         version after the last clock) and, with them, the dense weights.
 *   backend: upload, embedding_bag_fwd per group into its columns of x
 *         (the op's row stride ldy is x's width, y starts at the group's
 *         column), dense/relu layers, 2-class softmax cross-entropy (the
 *         logistic loss of the logits' difference: its mean is the binary
 *         logloss), backward to dx of the input, and embedding_bag_bwd per
 *         group gives each unique row its gradient.
 *   push: every group's row gradients to its table, then the dense
 *         gradients with the flag that ends the clock (sync: a clock's rows
 *         must reach a shard before the push that ends it; a connection's
 *         frames are handled in order), then the pulls of the next batch,
 *         which the shards answer once the clock is complete.
 * The pulls of the next step overlap the push (its batch is built before
 * they are waited for). Which batch: at each clock the members take the
 * next slots of the epoch's shuffled order, one each in rank order
 * (ps_client_members, as worker/epoch.c for the dense models); the next
 * batch is guessed as if the members stay, and built again, its rows
 * pulled again, when the pull reply names other members. Gradients are
 * scaled by 1 / (B x the clock's members) in the backward ops: the shards
 * sum the members'.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "ctr_train.h"
#include "layers.h"
#include "ps_err.h"
#include "ps_log.h"
#include "ps_time.h"

#define F PS_CTR_FIELDS
#define NUMF PS_CTR_NUMERIC

/* ---- the model on the backend ---- */

struct layer {
	enum ps_layer_kind kind;
	int in, out;                 /* per example */
	float *W, *b, *dW, *db;      /* dense */
	float *y, *dy;               /* batch x out */
	int wt;                      /* dense: weight tensor index (bias wt + 1) */
};

/* One batch's ids of one group, on the host (pinned) and on the backend. */
struct bags {
	int nu;                      /* unique ids */
	uint64_t *uniq;              /* B x F */
	int32_t *h_off, *h_idx, *h_roff, *h_rbags; /* host mirrors */
	int32_t *off, *idx, *roff, *rbags;        /* backend */
};

/* The fields that bag from one table. */
struct group {
	int t;                       /* index in cfg->tables */
	int nf, dim, col;            /* fields, floats per row, first column of its bags in x */
	int field[F];                /* its fields, increasing */
	float *rows, *drows, *h_rows, *h_drows; /* B*nf x dim */
	struct bags bg[2];           /* this step's and the next's */
	int64_t rid, pid;            /* its rows' pull and push in flight, 0 = none */
};

struct ctr {
	const struct ps_config *cfg;
	const struct ps_compute_ops *ops;
	struct ps_compute *c;
	int B, in, bagw, nl;         /* bagw: the bags' columns of x (in - 13) */
	struct layer l[PS_MAX_LAYERS];
	float *x, *dx;               /* B x in */
	float *h_x;                  /* pinned */
	int32_t *labels, *h_labels;
	float *h_logits;             /* B x 2 */
	struct ps_xent_stats *st;
	float **h_w, **h_g;          /* per dense tensor */
	int ng;
	struct group g[F];
	int64_t did;                 /* the dense pull in flight, 0 = none */
	/* dedup hash: slot -> unique index, valid when stamp matches */
	int hbits;
	uint64_t *hkey;
	int32_t *hval;
	uint32_t *hstamp, stamp;
	int32_t *count;              /* per unique row: entries (transpose) */
	struct ps_tensor *pt;        /* per tensor, for pulls and pushes */
};

static float *dalloc(struct ctr *m, size_t bytes)
{
	return m->ops->alloc(m->c, bytes ? bytes : 4);
}

static void ctr_free(struct ctr *m)
{
	const struct ps_compute_ops *o = m->ops;
	struct ps_compute *c = m->c;

	if (!o)
		return;
	for (int i = 0; i < m->nl; i++) {
		o->free(c, m->l[i].W);
		o->free(c, m->l[i].b);
		o->free(c, m->l[i].dW);
		o->free(c, m->l[i].db);
		o->free(c, m->l[i].y);
		o->free(c, m->l[i].dy);
	}
	o->free(c, m->x);
	o->free(c, m->dx);
	o->free(c, m->labels);
	o->host_free(c, m->h_x);
	o->host_free(c, m->h_labels);
	o->host_free(c, m->h_logits);
	o->host_free(c, m->st);
	for (int i = 0; i < m->ng; i++) {
		struct group *gr = &m->g[i];
		o->free(c, gr->rows);
		o->free(c, gr->drows);
		o->host_free(c, gr->h_rows);
		o->host_free(c, gr->h_drows);
		for (int k = 0; k < 2; k++) {
			struct bags *g = &gr->bg[k];
			free(g->uniq);
			o->host_free(c, g->h_off);
			o->host_free(c, g->h_idx);
			o->host_free(c, g->h_roff);
			o->host_free(c, g->h_rbags);
			o->free(c, g->off);
			o->free(c, g->idx);
			o->free(c, g->roff);
			o->free(c, g->rbags);
		}
	}
	for (int t = 0; m->h_w && t < m->cfg->ntensors; t++) {
		o->host_free(c, m->h_w[t]);
		o->host_free(c, m->h_g[t]);
	}
	free(m->h_w);
	free(m->h_g);
	free(m->hkey);
	free(m->hval);
	free(m->hstamp);
	free(m->count);
	free(m->pt);
}

/* Allocates group gr's rows and bags for batch B. 0 or -ENOMEM. */
static int group_alloc(struct ctr *m, struct group *gr, int B)
{
	const struct ps_compute_ops *ops = m->ops;
	struct ps_compute *c = m->c;
	size_t nent = (size_t)B * gr->nf, vals = nent * (size_t)gr->dim;

	gr->rows = dalloc(m, sizeof(float) * vals);
	gr->drows = dalloc(m, sizeof(float) * vals);
	gr->h_rows = ops->host_alloc(c, sizeof(float) * vals);
	gr->h_drows = ops->host_alloc(c, sizeof(float) * vals);
	if (!gr->rows || !gr->drows || !gr->h_rows || !gr->h_drows)
		return -ENOMEM;
	for (int k = 0; k < 2; k++) {
		struct bags *g = &gr->bg[k];
		g->uniq = malloc(sizeof(uint64_t) * nent);
		g->h_off = ops->host_alloc(c, sizeof(int32_t) * (nent + 1));
		g->h_idx = ops->host_alloc(c, sizeof(int32_t) * nent);
		g->h_roff = ops->host_alloc(c, sizeof(int32_t) * (nent + 1));
		g->h_rbags = ops->host_alloc(c, sizeof(int32_t) * nent);
		g->off = (int32_t *)dalloc(m, sizeof(int32_t) * (nent + 1));
		g->idx = (int32_t *)dalloc(m, sizeof(int32_t) * nent);
		g->roff = (int32_t *)dalloc(m, sizeof(int32_t) * (nent + 1));
		g->rbags = (int32_t *)dalloc(m, sizeof(int32_t) * nent);
		if (!g->uniq || !g->h_off || !g->h_idx || !g->h_roff || !g->h_rbags || !g->off ||
		    !g->idx || !g->roff || !g->rbags)
			return -ENOMEM;
	}
	return 0;
}

static int ctr_init(struct ctr *m, const struct ps_config *cfg, const struct ps_compute_ops *ops,
		    struct ps_compute *c, int B, char *err, size_t errlen)
{
	struct ps_layer_shape sh[PS_MAX_LAYERS];
	size_t nent = (size_t)B * F;
	int rc = ps_layers_infer(&cfg->model, sh, err, errlen);

	memset(m, 0, sizeof(*m));
	m->cfg = cfg;
	m->ops = ops;
	m->c = c;
	m->B = B;
	m->nl = cfg->model.nlayers;
	/* the groups, in table order: their bags' columns side by side */
	for (int t = 0; t < cfg->ntables; t++) {
		struct group *gr = &m->g[m->ng];

		if (!cfg->tables[t].fields)
			continue; /* fields: [], a table for other clients */
		gr->t = t;
		gr->dim = cfg->tables[t].dim;
		gr->col = m->bagw;
		for (int f = 0; f < F; f++)
			if (cfg->tables[t].fields & (1u << f))
				gr->field[gr->nf++] = f;
		m->bagw += gr->nf * gr->dim;
		m->ng++;
	}
	m->in = m->bagw + NUMF;
	if (rc)
		return rc;
	if (m->in != cfg->model.input[2]) { /* config_ctr.c sized the input the same way */
		snprintf(err, errlen, "ctr: the bags take %d columns and the numeric features %d, "
			 "but the model's input is %d wide", m->bagw, NUMF, cfg->model.input[2]);
		return PS_ECONFIG;
	}
	if (!ops->embedding_bag_fwd || !ops->embedding_bag_bwd) {
		snprintf(err, errlen, "backend %s has no embedding_bag ops", ops->name);
		return PS_ENOTSUP;
	}
	for (int i = 0; i < m->nl; i++) {
		struct layer *L = &m->l[i];
		L->kind = cfg->model.layers[i].kind;
		L->in = sh[i].in_c * sh[i].in_h * sh[i].in_w;
		L->out = sh[i].out_c * sh[i].out_h * sh[i].out_w;
		L->wt = sh[i].weight;
		if (L->kind != PS_LAYER_DENSE && L->kind != PS_LAYER_RELU) {
			snprintf(err, errlen, "ctr: layer %d is %s; only dense and relu", i + 1,
				 ps_layer_kind_name(L->kind));
			return PS_ECONFIG;
		}
		L->y = dalloc(m, sizeof(float) * (size_t)B * L->out);
		L->dy = dalloc(m, sizeof(float) * (size_t)B * L->out);
		if (L->kind == PS_LAYER_DENSE) {
			size_t w = (size_t)L->in * L->out;
			L->W = dalloc(m, sizeof(float) * w);
			L->dW = dalloc(m, sizeof(float) * w);
			L->b = dalloc(m, sizeof(float) * L->out);
			L->db = dalloc(m, sizeof(float) * L->out);
			if (!L->W || !L->dW || !L->b || !L->db)
				goto nomem;
		}
		if (!L->y || !L->dy)
			goto nomem;
	}
	m->x = dalloc(m, sizeof(float) * (size_t)B * m->in);
	m->dx = dalloc(m, sizeof(float) * (size_t)B * m->in);
	m->h_x = ops->host_alloc(c, sizeof(float) * (size_t)B * m->in);
	m->labels = (int32_t *)dalloc(m, sizeof(int32_t) * B);
	m->h_labels = ops->host_alloc(c, sizeof(int32_t) * B);
	m->h_logits = ops->host_alloc(c, sizeof(float) * (size_t)B * 2);
	m->st = ops->host_alloc(c, sizeof(*m->st));
	if (!m->x || !m->dx || !m->h_x || !m->labels || !m->h_labels || !m->h_logits || !m->st)
		goto nomem;
	for (int i = 0; i < m->ng; i++)
		if (group_alloc(m, &m->g[i], B))
			goto nomem;
	/* the dedup hash serves one group at a time: at most B x 26 ids */
	for (m->hbits = 4; ((size_t)1 << m->hbits) < 2 * nent; m->hbits++)
		;
	m->hkey = malloc(sizeof(uint64_t) << m->hbits);
	m->hval = malloc(sizeof(int32_t) << m->hbits);
	m->hstamp = calloc((size_t)1 << m->hbits, sizeof(uint32_t));
	m->count = malloc(sizeof(int32_t) * (nent + 1));
	m->h_w = calloc((size_t)cfg->ntensors, sizeof(float *));
	m->h_g = calloc((size_t)cfg->ntensors, sizeof(float *));
	m->pt = calloc((size_t)cfg->ntensors, sizeof(*m->pt));
	if (!m->hkey || !m->hval || !m->hstamp || !m->count || !m->h_w || !m->h_g || !m->pt)
		goto nomem;
	for (int t = 0; t < cfg->ntensors; t++) {
		m->h_w[t] = ops->host_alloc(c, sizeof(float) * (size_t)cfg->tensors[t].count);
		m->h_g[t] = ops->host_alloc(c, sizeof(float) * (size_t)cfg->tensors[t].count);
		if (!m->h_w[t] || !m->h_g[t])
			goto nomem;
	}
	return 0;
nomem:
	snprintf(err, errlen, "ctr: out of memory for batch %d (%s)", B, c->err);
	return -ENOMEM;
}

/* Deduplicates group gr's ids of examples first..first+n-1 of d (order[]
 * maps positions to examples when not NULL) into its bags k: the unique
 * ids, each bag's entry and the transpose. */
static void build_bags(struct ctr *m, struct group *gr, int k, const struct ps_ctr_data *d,
		       const int *order, int first, int n)
{
	struct bags *g = &gr->bg[k];
	uint64_t mask = ((uint64_t)1 << m->hbits) - 1;
	int nf = gr->nf, nent = n * nf;

	if (++m->stamp == 0) { /* wrapped: forget every slot */
		memset(m->hstamp, 0, sizeof(uint32_t) << m->hbits);
		m->stamp = 1;
	}
	g->nu = 0;
	for (int i = 0; i < n; i++) {
		int ex = order ? order[first + i] : first + i;
		const uint64_t *ids = d->ids + (size_t)ex * F;

		for (int j = 0; j < nf; j++) {
			uint64_t id = ids[gr->field[j]], h = (id * 0x9E3779B97F4A7C15ull) >> (64 - m->hbits);
			while (m->hstamp[h] == m->stamp && m->hkey[h] != id)
				h = (h + 1) & mask;
			if (m->hstamp[h] != m->stamp) {
				m->hstamp[h] = m->stamp;
				m->hkey[h] = id;
				m->hval[h] = g->nu;
				g->uniq[g->nu++] = id;
			}
			/* one id per bag: bag b = i * nf + j is entry b */
			g->h_idx[i * nf + j] = m->hval[h];
			g->h_off[i * nf + j] = i * nf + j;
		}
	}
	g->h_off[nent] = nent;
	/* the transpose: row r's bags in increasing order */
	memset(m->count, 0, sizeof(int32_t) * (size_t)(g->nu + 1));
	for (int e = 0; e < nent; e++)
		m->count[g->h_idx[e] + 1]++;
	g->h_roff[0] = 0;
	for (int r = 0; r < g->nu; r++)
		g->h_roff[r + 1] = g->h_roff[r] + m->count[r + 1];
	memcpy(m->count, g->h_roff, sizeof(int32_t) * (size_t)g->nu);
	for (int b = 0; b < nent; b++)
		g->h_rbags[m->count[g->h_idx[b]]++] = b;
}

/* Fills bags k of every group with examples first..first+n-1 of d (order[]
 * maps positions to examples when not NULL), and the host input x's
 * numeric columns and the labels. */
static void build_batch(struct ctr *m, int k, const struct ps_ctr_data *d, const int *order,
			int first, int n)
{
	for (int i = 0; i < n; i++) {
		int ex = order ? order[first + i] : first + i;

		memcpy(m->h_x + (size_t)i * m->in + m->bagw, d->num + (size_t)ex * NUMF,
		       sizeof(float) * NUMF);
		m->h_labels[i] = d->label[ex];
	}
	for (int i = 0; i < m->ng; i++)
		build_bags(m, &m->g[i], k, d, order, first, n);
}

/* Starts the pull of the dense weights (when dense) into h_w, and of every
 * group's rows of bags k into its h_rows (when k >= 0); the requests' ids
 * go to m->did and the groups' rid. */
static int pull_start(struct ctr *m, struct ps_client *cli, int k, int dense,
		      uint64_t min_version)
{
	const struct ps_config *cfg = m->cfg;

	if (dense) {
		for (int t = 0; t < cfg->ntensors; t++)
			m->pt[t] = ps_tensor_of(cfg, t, m->h_w[t]);
		m->did = ps_client_pull(cli, min_version, m->pt, cfg->ntensors);
		if (m->did < 0) {
			int rc = (int)m->did;
			m->did = 0;
			return rc;
		}
	}
	for (int i = 0; k >= 0 && i < m->ng; i++) {
		struct group *gr = &m->g[i];
		gr->rid = ps_client_pull_rows_async(cli, cfg->tables[gr->t].name, min_version,
						    gr->bg[k].uniq, (size_t)gr->bg[k].nu, gr->h_rows);
		if (gr->rid < 0) {
			int rc = (int)gr->rid;
			gr->rid = 0;
			return rc;
		}
	}
	return 0;
}

/* Waits for the requests of pull_start under way (none: returns at once):
 * 0 or the first error. */
static int pull_wait(struct ctr *m, struct ps_client *cli)
{
	int rc = m->did ? ps_client_wait(cli, m->did) : 0;

	m->did = 0;
	for (int i = 0; i < m->ng; i++) {
		int r = m->g[i].rid ? ps_client_wait(cli, m->g[i].rid) : 0;
		m->g[i].rid = 0;
		if (!rc)
			rc = r;
	}
	return rc;
}

/* Uploads the pulled dense weights. */
static int upload_dense(struct ctr *m)
{
	const struct ps_compute_ops *o = m->ops;
	struct ps_compute *c = m->c;
	int rc = 0;

	for (int i = 0; !rc && i < m->nl; i++) {
		struct layer *L = &m->l[i];
		if (L->kind != PS_LAYER_DENSE)
			continue;
		rc = o->upload(c, L->W, m->h_w[L->wt], sizeof(float) * (size_t)L->in * L->out);
		if (!rc)
			rc = o->upload(c, L->b, m->h_w[L->wt + 1], sizeof(float) * (size_t)L->out);
	}
	return rc;
}

/* The embedding-bag shape of group gr's bags k for n examples: one id per
 * bag, written into its columns of x (row stride: x's width). */
static struct ps_bag_shape bag_shape(const struct ctr *m, const struct group *gr, int k, int n)
{
	return (struct ps_bag_shape){ n * gr->nf, gr->nf, gr->dim, m->in, gr->bg[k].nu,
				      (enum ps_bag_mode)m->cfg->model.bag };
}

/* Uploads the input and labels of n examples and every group's bags k
 * with its rows, and queues the bags into their columns of x. */
static int upload(struct ctr *m, int k, int n)
{
	const struct ps_compute_ops *o = m->ops;
	struct ps_compute *c = m->c;
	int rc = o->upload(c, m->x, m->h_x, sizeof(float) * (size_t)n * m->in);

	if (!rc)
		rc = o->upload(c, m->labels, m->h_labels, sizeof(int32_t) * (size_t)n);
	for (int i = 0; !rc && i < m->ng; i++) {
		struct group *gr = &m->g[i];
		struct bags *g = &gr->bg[k];
		size_t nent = (size_t)n * gr->nf;
		struct ps_bag_shape s = bag_shape(m, gr, k, n);

		rc = o->upload(c, gr->rows, gr->h_rows, sizeof(float) * (size_t)g->nu * gr->dim);
		if (!rc)
			rc = o->upload(c, g->off, g->h_off, sizeof(int32_t) * (nent + 1));
		if (!rc)
			rc = o->upload(c, g->idx, g->h_idx, sizeof(int32_t) * nent);
		if (!rc)
			rc = o->upload(c, g->roff, g->h_roff, sizeof(int32_t) * (size_t)(g->nu + 1));
		if (!rc)
			rc = o->upload(c, g->rbags, g->h_rbags, sizeof(int32_t) * nent);
		if (!rc)
			rc = o->embedding_bag_fwd(c, &s, gr->rows, g->off, g->idx, m->x + gr->col);
	}
	return rc;
}

/* Queues the forward pass of n examples and the loss (dlogits into the
 * last layer's dy when train). */
static int forward(struct ctr *m, int n, int train)
{
	const struct ps_compute_ops *o = m->ops;
	const float *x = m->x;
	int rc = 0;

	for (int i = 0; !rc && i < m->nl; i++) {
		struct layer *L = &m->l[i];
		if (L->kind == PS_LAYER_DENSE)
			rc = o->dense_fwd(m->c, x, L->W, L->b, L->y, n, L->in, L->out);
		else
			rc = o->relu_fwd(m->c, x, L->y, (size_t)n * L->out);
		x = L->y;
	}
	if (!rc)
		rc = o->softmax_xent(m->c, x, m->labels, n, 2, train ? m->l[m->nl - 1].dy : NULL, m->st);
	return rc;
}

/* Queues the backward pass (bags k) and the copies of every gradient to
 * the host; alpha = 1 / (n x workers). */
static int backward(struct ctr *m, int k, int n, float alpha)
{
	const struct ps_compute_ops *o = m->ops;
	struct ps_compute *c = m->c;
	int rc = 0;

	for (int i = m->nl - 1; !rc && i >= 0; i--) {
		struct layer *L = &m->l[i];
		const float *x = i ? m->l[i - 1].y : m->x;
		float *dx = i ? m->l[i - 1].dy : m->dx;
		if (L->kind == PS_LAYER_DENSE) {
			rc = o->dense_bwd(c, x, L->W, L->dy, dx, L->dW, L->db, n, L->in, L->out, alpha);
			if (!rc)
				rc = o->download(c, m->h_g[L->wt], L->dW,
						 sizeof(float) * (size_t)L->in * L->out);
			if (!rc)
				rc = o->download(c, m->h_g[L->wt + 1], L->db, sizeof(float) * (size_t)L->out);
		} else {
			rc = o->relu_bwd(c, L->y, L->dy, dx, (size_t)n * L->out);
		}
	}
	for (int i = 0; !rc && i < m->ng; i++) {
		struct group *gr = &m->g[i];
		struct bags *g = &gr->bg[k];
		struct ps_bag_shape s = bag_shape(m, gr, k, n);

		rc = o->embedding_bag_bwd(c, &s, m->dx + gr->col, g->off, g->roff, g->rbags,
					  gr->drows, alpha);
		if (!rc)
			rc = o->download(c, gr->h_drows, gr->drows,
					 sizeof(float) * (size_t)g->nu * gr->dim);
	}
	if (!rc)
		rc = o->sync(c);
	return rc;
}

/* Held-out logloss and AUC with the weights on the backend (rows pulled
 * as they are now). */
static int evaluate(struct ctr *m, struct ps_client *cli, const struct ps_ctr_data *test,
		    double *auc, double *logloss)
{
	float *score = malloc(sizeof(float) * (size_t)test->n);
	double loss_sum = 0;
	int rc = score ? 0 : -ENOMEM;

	for (int first = 0; !rc && first < test->n; first += m->B) {
		int n = test->n - first < m->B ? test->n - first : m->B, correct, wrc;
		float loss;

		build_batch(m, 1, test, NULL, first, n);
		rc = pull_start(m, cli, 1, 0, 0);
		wrc = pull_wait(m, cli); /* also those started before a failure */
		if (!rc)
			rc = wrc;
		if (!rc)
			rc = upload(m, 1, n);
		if (!rc)
			rc = forward(m, n, 0);
		if (!rc)
			rc = m->ops->download(m->c, m->h_logits, m->l[m->nl - 1].y, sizeof(float) * 2 * (size_t)n);
		if (!rc)
			rc = m->ops->sync(m->c);
		if (!rc)
			rc = ps_compute_xent_read(m->st, 2, &loss, &correct, m->c->err, sizeof(m->c->err));
		if (rc)
			break;
		loss_sum += (double)loss * n;
		for (int i = 0; i < n; i++) /* P(click) = sigmoid(l1 - l0) */
			score[first + i] = 1.0f / (1.0f + expf(m->h_logits[2 * i] - m->h_logits[2 * i + 1]));
	}
	if (!rc) {
		*logloss = loss_sum / test->n;
		*auc = ps_ctr_auc(score, test->label, test->n);
	}
	free(score);
	return rc;
}

/* A deterministic shuffle (seed) of order[0..n). */
static void shuffle(int *order, int n, uint64_t seed)
{
	uint64_t s = seed;

	for (int i = n - 1; i > 0; i--) {
		s += 0x9E3779B97F4A7C15ull;
		uint64_t z = s;
		z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
		z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
		z ^= z >> 31;
		int j = (int)(z % (uint64_t)(i + 1)), t = order[i];
		order[i] = order[j];
		order[j] = t;
	}
}

/* The epochs' batch slots: epoch e's order is every example once,
 * shuffled by (seed, e) alike on every worker, cut into `slots` batches;
 * global slot g is batch g % slots of epoch g / slots. */
struct slots {
	const struct ps_ctr_data *d;
	int *order;                  /* d->n: the order of epoch `epoch` */
	int epoch;
	long slots;
	uint64_t seed;
	FILE *record;                /* --record-examples, or NULL */
	long slot[2];                /* the slot staged in bags k */
};

/* Builds bags k with slot g's batch. */
static void stage(struct ctr *m, struct slots *sl, int k, long g)
{
	int e = (int)(g / sl->slots);

	if (e != sl->epoch) {
		for (int i = 0; i < sl->d->n; i++)
			sl->order[i] = i;
		shuffle(sl->order, sl->d->n, sl->seed ^ ((uint64_t)(e + 1) << 32));
		sl->epoch = e;
	}
	build_batch(m, k, sl->d, sl->order, (int)(g % sl->slots) * m->B, m->B);
	sl->slot[k] = g;
}

/* --record-examples: "clock epoch slot example..." of the batch in bags k
 * (a test checks that an epoch trains every example once). */
static void record(const struct ctr *m, const struct slots *sl, int k, uint64_t clock)
{
	long g = sl->slot[k];

	if (!sl->record)
		return;
	fprintf(sl->record, "%llu %ld %ld", (unsigned long long)clock, g / sl->slots, g);
	for (int i = 0; i < m->B; i++)
		fprintf(sl->record, " %d", sl->order[(g % sl->slots) * m->B + i]);
	fputc('\n', sl->record);
	fflush(sl->record);
}

/* One line of the metrics file per epoch. */
static void write_metrics(FILE *f, const struct ctr *m, struct ps_client *cli, int rank, int epoch,
			  int steps, double t, double loss, double sps, double auc, double tloss)
{
	uint64_t given, sent, raw, wire;

	ps_client_push_bytes(cli, &raw, &wire);
	ps_client_rows_bytes(cli, &given, &sent);
	fprintf(f, "{\"rank\":%d,\"epoch\":%d,\"steps\":%d,\"time_s\":%.3f,\"preset\":\"ctr\","
		"\"train_logloss\":%.6f,\"samples_per_s\":%.1f,\"mb_pushed\":%.3f,"
		"\"mb_rows_sent\":%.3f,\"device\":\"%s\",\"consistency\":\"%s\"",
		rank, epoch, steps, t, loss, sps, raw / 1e6, sent / 1e6, m->ops->name,
		m->cfg->consistency == PS_SYNC ? "sync" : "async");
	if (!isnan(tloss))
		fprintf(f, ",\"test_logloss\":%.6f,\"test_auc\":%.6f", tloss, auc);
	fprintf(f, "}\n");
	fflush(f);
}

/* "cat 26x16" or "a 13x8, b 13x4": each table that bags fields, with its
 * fields x dim, into buf. */
static const char *tables_text(const struct ctr *m, char *buf, size_t len)
{
	size_t off = 0;

	buf[0] = '\0';
	for (int i = 0; i < m->ng && off < len; i++) {
		int n = snprintf(buf + off, len - off, "%s%s %dx%d", i ? ", " : "",
				 m->cfg->tables[m->g[i].t].name, m->g[i].nf, m->g[i].dim);
		off = n < 0 ? len : off + (size_t)n;
	}
	return buf;
}

/* Starts the push of every group's row gradients (bags k) for clock, then
 * the dense gradients that end it (and leave the cluster when leave): the
 * dense push's id, or a negative code (the row pushes already started are
 * left to push_wait). */
static int64_t push_start(struct ctr *m, struct ps_client *cli, int k, uint64_t clock, int leave)
{
	const struct ps_config *cfg = m->cfg;

	/* the rows first: in sync mode the dense push ends the clock */
	for (int i = 0; i < m->ng; i++) {
		struct group *gr = &m->g[i];
		gr->pid = ps_client_push_rows_async(cli, cfg->tables[gr->t].name, clock,
						    gr->bg[k].uniq, (size_t)gr->bg[k].nu,
						    gr->h_drows, 0);
		if (gr->pid < 0) {
			int64_t rc = gr->pid;
			gr->pid = 0;
			return rc;
		}
	}
	for (int t = 0; t < cfg->ntensors; t++)
		m->pt[t] = ps_tensor_of(cfg, t, m->h_g[t]);
	return ps_client_push(cli, clock, m->pt, cfg->ntensors,
			      PS_PUSH_END_CLOCK | (leave ? PS_PUSH_LEAVE : 0));
}

/* Waits for the row pushes of push_start and the dense push dpid (when
 * positive): 0 or the first error. */
static int push_wait(struct ctr *m, struct ps_client *cli, int64_t dpid)
{
	int rc = 0;

	for (int i = 0; i < m->ng; i++) {
		int r = m->g[i].pid ? ps_client_wait(cli, m->g[i].pid) : 0;
		m->g[i].pid = 0;
		if (!rc)
			rc = r;
	}
	if (dpid > 0) {
		int r = ps_client_wait(cli, dpid);
		if (!rc)
			rc = r;
	}
	return rc;
}

/* What a worker's part of an epoch counts. */
struct ctr_epoch {
	int e, steps;
	long seen;
	double loss_sum, t0;
};

/* The end of this worker's part of epoch ea->e: its line in the log;
 * rank 0 (not stopped) evaluates the dense weights pulled last (those
 * after the epoch's last clock: the members of a clock take slots in rank
 * order, so rank 0 reaches a new epoch only after every slot of the one
 * before) and prints the held-out AUC; the metrics line. 0, or -1 logged. */
static int epoch_end(struct ctr *m, struct ps_client *cli, const struct ps_ctr_data *test,
		     int rank, FILE *metrics, const struct ctr_epoch *ea, double t_start,
		     int stopped)
{
	double elapsed = ps_now_s() - ea->t0, auc = NAN, tloss = NAN;

	ps_info("epoch %d: %d steps, %ld examples, train logloss %.4f, %.0f samples/s", ea->e + 1,
		ea->steps, ea->seen, ea->seen ? ea->loss_sum / ea->seen : NAN,
		elapsed > 0 ? ea->seen / elapsed : 0.0);
	if (rank == 0 && !stopped) {
		if (upload_dense(m) || evaluate(m, cli, test, &auc, &tloss)) {
			ps_error("evaluation: %s / %s", m->c->err, ps_client_error(cli));
			return -1;
		}
		ps_info("epoch %d: test auc %.4f, test logloss %.4f (%d examples)", ea->e + 1, auc,
			tloss, test->n);
		printf("epoch %d test auc %.6f logloss %.6f\n", ea->e + 1, auc, tloss);
		fflush(stdout);
	}
	if (metrics)
		write_metrics(metrics, m, cli, rank, ea->e + 1, ea->steps, ps_now_s() - t_start,
			      ea->seen ? ea->loss_sum / ea->seen : NAN,
			      elapsed > 0 ? ea->seen / elapsed : 0.0, auc, tloss);
	return 0;
}

int ps_ctr_train(const struct ps_config *cfg, int rank, const struct ps_compute_ops *ops,
		 struct ps_compute *c, struct ps_client *cli, FILE *metrics, FILE *rec,
		 volatile sig_atomic_t *stop)
{
	struct ps_ctr_data train = { 0 }, test = { 0 };
	struct ctr m = { 0 };
	struct slots sl = { .epoch = -1, .record = rec, .seed = cfg->seed, .slot = { -1, -1 } };
	int rc = 1, B = cfg->train.batch, E = cfg->train.epochs;
	int sync = cfg->consistency == PS_SYNC;
	char err[1024], tabs[256];

	if (ps_ctr_load(&train, cfg->train.train_file, cfg->train.train_limit, err, sizeof(err)) ||
	    (rank == 0 && ps_ctr_load(&test, cfg->train.test_file, cfg->train.test_limit, err,
				      sizeof(err)))) {
		ps_error("%s", err);
		goto out;
	}
	/* One order of the whole click log per epoch, cut into slots of a
	 * batch; the members of each clock take the next slots, one each in
	 * rank order (ps_client_members), so whoever joins or leaves, every
	 * example of an epoch is trained once (docs/reliability.md). */
	sl.d = &train;
	sl.slots = train.n / B;
	if (sl.slots < 1) {
		ps_error("%d examples give no full batch of %d", train.n, B);
		goto out;
	}
	sl.order = malloc(sizeof(int) * (size_t)train.n);
	if (!sl.order)
		goto out;
	if (ctr_init(&m, cfg, ops, c, B, err, sizeof(err))) {
		ps_error("%s", err);
		goto out;
	}
	ps_info("training ctr (tables %s, %s bags, %d tensors) on %s: %d epoch(s) of %ld "
		"batches of %d among the workers, %s; %d training examples, %d held out",
		tables_text(&m, tabs, sizeof(tabs)), cfg->model.bag == PS_BAG_MEAN ? "mean" : "sum",
		cfg->ntensors, ops->name, E, sl.slots, B, sync ? "sync" : "async", train.n, test.n);

	/* 0, or the clock of a running cluster this worker joined */
	uint64_t clock = ps_client_clock(cli);
	double t_start = ps_now_s(), last_print = 0;
	int tty = isatty(2), cur = 0, leaving = 0;
	struct ps_members_info mi;
	struct ctr_epoch ea = { .e = -1 };
	long staged = -1; /* the slot in bags cur, its rows pulled */

	/* the dense weights of the first clock, whose reply names its members */
	if (pull_start(&m, cli, -1, 1, sync ? clock : 0))
		goto fail_req;
	for (;;) {
		float loss;
		int correct;
		int64_t dpid;

		if (pull_wait(&m, cli))
			goto fail_req;
		if (ps_client_members(cli, &mi) || mi.index < 0) {
			ps_error("clock %llu: this worker is not among its members",
				 (unsigned long long)clock);
			goto out;
		}
		long g = (long)(mi.before + (uint64_t)mi.index);
		if (g / sl.slots != ea.e) { /* this worker's first slot of a new epoch */
			if (ea.e >= 0 && epoch_end(&m, cli, &test, rank, metrics, &ea, t_start, 0))
				goto out;
			if (rank == 0)
				staged = -1; /* the evaluation used the batch buffers */
			ea = (struct ctr_epoch){ .e = (int)(g / sl.slots), .t0 = ps_now_s() };
			last_print = 0;
		}
		if (ea.e >= E) {
			/* done: the clock's other members may still train theirs */
			if (ps_client_leave(cli, clock))
				ps_warn("leaving at clock %llu: %s", (unsigned long long)clock,
					ps_client_error(cli));
			break;
		}
		if (*stop && !leaving) {
			/* this clock's slot is this worker's: trained, then it leaves */
			leaving = 1;
			ps_info("stop signal: leaving after clock %llu", (unsigned long long)clock);
		}
		if (staged != g) {
			/* the members changed since the batch was guessed */
			stage(&m, &sl, cur, g);
			if (pull_start(&m, cli, cur, 0, sync ? clock : 0) || pull_wait(&m, cli))
				goto fail_req;
		}
		record(&m, &sl, cur, clock);
		staged = -1;
		/* the shards sum the members' gradients: each scaled by 1 / (B x
		 * members of this clock) for the mean over the clock's examples */
		if (upload_dense(&m) || upload(&m, cur, B) || forward(&m, B, 1) ||
		    backward(&m, cur, B, 1.0f / ((float)B * (float)mi.count)) ||
		    ps_compute_xent_read(m.st, 2, &loss, &correct, c->err, sizeof(c->err))) {
			ps_error("clock %llu: %s", (unsigned long long)clock, c->err);
			goto out;
		}
		dpid = push_start(&m, cli, cur, clock, leaving);
		if (dpid < 0) {
			ps_error("push at clock %llu: %s", (unsigned long long)clock,
				 ps_client_error(cli));
			push_wait(&m, cli, 0);
			goto out;
		}
		clock++;
		/* the next pulls while the shards apply: with the batch of the
		 * slot this worker gets next if the members stay */
		long next = g + mi.count;
		if (!leaving && next / sl.slots < E) {
			stage(&m, &sl, cur ^ 1, next);
			staged = next;
		}
		if (!leaving && pull_start(&m, cli, staged >= 0 ? cur ^ 1 : -1, 1,
					   sync ? clock : 0)) {
			push_wait(&m, cli, dpid);
			goto fail_req;
		}
		if (push_wait(&m, cli, dpid)) {
			ps_error("push at clock %llu: %s", (unsigned long long)clock - 1,
				 ps_client_error(cli));
			goto out;
		}
		cur ^= 1;
		ea.steps++;
		ea.loss_sum += (double)loss * B;
		ea.seen += B;
		double now = ps_now_s();
		if (now - last_print > (tty ? 0.25 : 10.0)) {
			last_print = now;
			fprintf(stderr, "%sepoch %d/%d  step %d  batch %ld/%ld  %d worker(s)  logloss "
				"%.4f  %.0f samples/s%s", tty ? "\r" : "", ea.e + 1, E, ea.steps,
				g % sl.slots + 1, sl.slots, mi.count, ea.loss_sum / ea.seen,
				ea.seen / (now - ea.t0), tty ? "\033[K" : "\n");
		}
		if (leaving)
			break;
	}
	if (tty)
		fputc('\n', stderr);
	/* stopped by a signal: the epoch so far (no evaluation) */
	if (leaving && ea.seen && epoch_end(&m, cli, &test, rank, metrics, &ea, t_start, 1))
		goto out;
	rc = *stop ? 130 : 0;
	if (*stop)
		ps_info("stopped by signal");
	goto out;
fail_req:
	ps_error("pull at clock %llu: %s", (unsigned long long)clock, ps_client_error(cli));
	pull_wait(&m, cli);
out:
	ctr_free(&m);
	free(sl.order);
	ps_ctr_data_free(&train);
	ps_ctr_data_free(&test);
	return rc;
}
