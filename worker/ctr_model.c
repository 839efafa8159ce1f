/* ctr_model.c - the ctr preset's model on the compute backend, its
 * batches, and the requests that pull and push its weights and rows
 * (ctr_int.h; the training loop is ctr_train.c).
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
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "ctr_int.h"
#include "ps_err.h"
#include "ps_log.h"
#include "ps_time.h"

/* ---- the model on the backend ---- */

static float *dalloc(struct ctr *m, size_t bytes)
{
	return m->ops->alloc(m->c, bytes ? bytes : 4);
}

void ps__ctr_free(struct ctr *m)
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

int ps__ctr_init(struct ctr *m, const struct ps_config *cfg, const struct ps_compute_ops *ops,
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
void ps__ctr_build_batch(struct ctr *m, int k, const struct ps_ctr_data *d, const int *order,
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
int ps__ctr_pull_start(struct ctr *m, struct ps_client *cli, int k, int dense,
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

/* Waits for the requests of ps__ctr_pull_start under way (none: returns at once):
 * 0 or the first error. */
int ps__ctr_pull_wait(struct ctr *m, struct ps_client *cli)
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
int ps__ctr_upload_dense(struct ctr *m)
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
int ps__ctr_upload(struct ctr *m, int k, int n)
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
int ps__ctr_forward(struct ctr *m, int n, int train)
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
int ps__ctr_backward(struct ctr *m, int k, int n, float alpha)
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
int ps__ctr_evaluate(struct ctr *m, struct ps_client *cli, const struct ps_ctr_data *test,
		     double *auc, double *logloss)
{
	float *score = malloc(sizeof(float) * (size_t)test->n);
	double loss_sum = 0;
	int rc = 0;

	if (!score) {
		snprintf(m->c->err, sizeof(m->c->err),
			 "out of memory for the scores of %d held-out examples", test->n);
		return -ENOMEM;
	}

	for (int first = 0; !rc && first < test->n; first += m->B) {
		int n = test->n - first < m->B ? test->n - first : m->B, correct, wrc;
		float loss;

		ps__ctr_build_batch(m, 1, test, NULL, first, n);
		rc = ps__ctr_pull_start(m, cli, 1, 0, 0);
		wrc = ps__ctr_pull_wait(m, cli); /* also those started before a failure */
		if (!rc)
			rc = wrc;
		if (!rc)
			rc = ps__ctr_upload(m, 1, n);
		if (!rc)
			rc = ps__ctr_forward(m, n, 0);
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

/* "cat 26x16" or "a 13x8, b 13x4": each table that bags fields, with its
 * fields x dim, into buf. */
const char *ps__ctr_tables_text(const struct ctr *m, char *buf, size_t len)
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
 * left to ps__ctr_push_wait). */
int64_t ps__ctr_push_start(struct ctr *m, struct ps_client *cli, int k, uint64_t clock,
			   int leave)
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

/* Waits for the row pushes of ps__ctr_push_start and the dense push dpid (when
 * positive): 0 or the first error. */
int ps__ctr_push_wait(struct ctr *m, struct ps_client *cli, int64_t dpid)
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
