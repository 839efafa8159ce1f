/* net.c - forward and backward passes over the layers of a model, queued
 * on a compute backend without waiting for it (net.h has the step order).
 *
 * Where the waits are: the push thread waits on each gradient's event, the
 * training thread reads the loss once per step and, before a pull refills
 * host_w, waits for the upload of the last weights; nothing inside forward
 * or backward waits. On the cpu backend every op finishes as it returns,
 * so the same code runs there with waits that return at once, and the push
 * thread still overlaps: gradient k is signalled as soon as its layer is
 * done, while earlier layers are being differentiated. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "net.h"
#include "ps_err.h"

static int fail(struct ps_net *n, char *err, size_t errlen, const char *what)
{
	snprintf(err, errlen, "%s: %s", what, n->c->err[0] ? n->c->err : "out of backend memory");
	return -ENOMEM;
}

/* Backend buffers of layer i (activations, pooling indices, parameters). */
static int init_layer(struct ps_net *n, int i, const struct ps_layer_shape *sh, char *err,
		      size_t errlen)
{
	const struct ps_compute_ops *ops = n->ops;
	const struct ps_config *cfg = n->cfg;
	struct ps_compute *c = n->c;
	struct ps_net_layer *l = &n->l[i];
	int rc;

	l->cfg = &cfg->model.layers[i];
	l->sh = *sh;
	l->out_count = (size_t)sh->out_c * sh->out_h * sh->out_w;
	for (int j = 0; j < i; j++)
		l->grad_below |= n->l[j].sh.weight >= 0;
	if (l->cfg->kind == PS_LAYER_FLATTEN) {
		/* Same bytes, new shape: a view of the previous layer's buffers
		 * (layer 0: of the input slot, set by each forward). */
		l->view = 1;
		l->y = i > 0 ? n->l[i - 1].y : NULL;
		l->dy = i > 0 ? n->l[i - 1].dy : NULL;
	} else {
		l->y = ops->alloc(c, (size_t)n->batch * l->out_count * sizeof(float));
		l->dy = ops->alloc(c, (size_t)n->batch * l->out_count * sizeof(float));
		if (!l->y || !l->dy)
			return fail(n, err, errlen, "activations");
	}
	if (l->cfg->kind == PS_LAYER_CONV2D) {
		size_t ws = 0;
		l->cs = (struct ps_conv_shape){ .n = n->batch, .c = sh->in_c, .h = sh->in_h,
						.w = sh->in_w, .k = l->cfg->out,
						.kh = l->cfg->kernel, .kw = l->cfg->kernel,
						.pad = l->cfg->pad,
						.stride = l->cfg->stride ? l->cfg->stride : 1 };
		ps_conv_out(&l->cs);
		if ((rc = ops->conv2d_workspace(c, &l->cs, &ws))) {
			snprintf(err, errlen, "layer %d (conv2d): %s", i + 1, c->err);
			return rc;
		}
		if (ws > n->ws_bytes)
			n->ws_bytes = ws;
	} else if (l->cfg->kind == PS_LAYER_MAXPOOL) {
		l->ps = (struct ps_pool_shape){ .n = n->batch, .c = sh->in_c, .h = sh->in_h,
						.w = sh->in_w, .size = l->cfg->size,
						.oh = sh->out_h, .ow = sh->out_w };
		l->idx = (int32_t *)ops->alloc(c, (size_t)n->batch * l->out_count * sizeof(int32_t));
		if (!l->idx)
			return fail(n, err, errlen, "maxpool indices");
	}
	if (sh->weight >= 0) {
		int wt = sh->weight, bt = sh->bias;
		if (bt >= cfg->ntensors) {
			snprintf(err, errlen, "the config has %d tensors, the model needs more",
				 cfg->ntensors);
			return PS_ECONFIG;
		}
		n->count_of[wt] = cfg->tensors[wt].count;
		n->count_of[bt] = cfg->tensors[bt].count;
		l->W = n->dev_w[wt] = ops->alloc(c, (size_t)n->count_of[wt] * sizeof(float));
		l->b = n->dev_w[bt] = ops->alloc(c, (size_t)n->count_of[bt] * sizeof(float));
		l->dW = n->dev_g[wt] = ops->alloc(c, (size_t)n->count_of[wt] * sizeof(float));
		l->db = n->dev_g[bt] = ops->alloc(c, (size_t)n->count_of[bt] * sizeof(float));
		if (!l->W || !l->b || !l->dW || !l->db)
			return fail(n, err, errlen, "parameters");
	}
	return 0;
}

/* The events, the input slots and the pinned buffers. */
static int init_io(struct ps_net *n, char *err, size_t errlen)
{
	const struct ps_compute_ops *ops = n->ops;
	struct ps_compute *c = n->c;
	int k = 0;

	for (int s = 0; s < 2; s++) {
		n->x[s] = ops->alloc(c, (size_t)n->batch * n->in_count * sizeof(float));
		n->labels[s] = (int32_t *)ops->alloc(c, (size_t)n->batch * sizeof(int32_t));
		n->host_x[s] = ops->host_alloc(c, (size_t)n->batch * n->in_count * sizeof(float));
		n->host_y[s] = ops->host_alloc(c, (size_t)n->batch * sizeof(int32_t));
		if (!n->x[s] || !n->labels[s] || !n->host_x[s] || !n->host_y[s])
			return fail(n, err, errlen, "input buffers");
		if (ops->event_create(c, &n->e_in[s]) || ops->event_create(c, &n->e_used[s]))
			return fail(n, err, errlen, "events");
	}
	n->stats = ops->host_alloc(c, sizeof(*n->stats));
	if (!n->stats || ops->event_create(c, &n->e_loss) || ops->event_create(c, &n->e_wup))
		return fail(n, err, errlen, "loss buffer");
	for (int i = 0; i < n->nlayers; i++)
		n->ngrads += n->l[i].sh.weight >= 0;
	n->grad_layer = calloc((size_t)n->ngrads + 1, sizeof(int));
	n->e_grad = calloc((size_t)n->ngrads + 1, sizeof(*n->e_grad));
	if (!n->grad_layer || !n->e_grad) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (int i = n->nlayers - 1; i >= 0; i--) {
		if (n->l[i].sh.weight < 0)
			continue;
		n->grad_layer[k] = i;
		if (ops->event_create(c, &n->e_grad[k++]))
			return fail(n, err, errlen, "events");
	}
	return 0;
}

int ps_net_init(struct ps_net *n, const struct ps_config *cfg, const struct ps_compute_ops *ops,
		struct ps_compute *c, int batch, char *err, size_t errlen)
{
	const struct ps_model_cfg *m = &cfg->model;
	struct ps_layer_shape sh[PS_MAX_LAYERS];
	int rc;

	memset(n, 0, sizeof(*n));
	n->cfg = cfg;
	n->ops = ops;
	n->c = c;
	n->batch = batch;
	n->ready = -1;
	pthread_mutex_init(&n->mu, NULL);
	pthread_cond_init(&n->cv, NULL);
	rc = ps_layers_infer(m, sh, err, errlen);
	if (rc)
		goto err_free_net;
	n->nlayers = m->nlayers;
	n->ntensors = cfg->ntensors;
	n->in_count = (size_t)m->input[0] * m->input[1] * m->input[2];
	n->l = calloc((size_t)n->nlayers, sizeof(*n->l));
	n->host_w = calloc((size_t)n->ntensors, sizeof(float *));
	n->host_g = calloc((size_t)n->ntensors, sizeof(float *));
	n->dev_w = calloc((size_t)n->ntensors, sizeof(float *));
	n->dev_g = calloc((size_t)n->ntensors, sizeof(float *));
	n->count_of = calloc((size_t)n->ntensors, sizeof(int64_t));
	if (!n->l || !n->host_w || !n->host_g || !n->dev_w || !n->dev_g || !n->count_of) {
		snprintf(err, errlen, "out of memory");
		rc = -ENOMEM;
		goto err_free_net;
	}
	for (int i = 0; i < n->nlayers; i++)
		if ((rc = init_layer(n, i, &sh[i], err, errlen)))
			goto err_free_net;
	if (n->ws_bytes) {
		n->ws = ops->alloc(c, n->ws_bytes);
		if (!n->ws) {
			rc = fail(n, err, errlen, "convolution workspace");
			goto err_free_net;
		}
	}
	for (int t = 0; t < n->ntensors; t++) {
		size_t bytes = (size_t)cfg->tensors[t].count * sizeof(float);
		n->count_of[t] = cfg->tensors[t].count;
		n->host_w[t] = ops->host_alloc(c, bytes);
		n->host_g[t] = ops->host_alloc(c, bytes);
		if (!n->host_w[t] || !n->host_g[t]) {
			rc = fail(n, err, errlen, "host buffers");
			goto err_free_net;
		}
	}
	if ((rc = init_io(n, err, errlen)))
		goto err_free_net;
	return 0;

err_free_net:
	ps_net_free(n);
	return rc;
}

void ps_net_free(struct ps_net *n)
{
	const struct ps_compute_ops *ops = n->ops;

	if (!ops)
		return;
	ops->sync(n->c);  /* nothing queued may still use what is freed below */
	for (int i = 0; n->l && i < n->nlayers; i++) {
		struct ps_net_layer *l = &n->l[i];
		if (!l->view) {
			ops->free(n->c, l->y);
			ops->free(n->c, l->dy);
		}
		ops->free(n->c, l->idx);
		ops->free(n->c, l->W);
		ops->free(n->c, l->b);
		ops->free(n->c, l->dW);
		ops->free(n->c, l->db);
	}
	for (int t = 0; n->host_w && t < n->ntensors; t++) {
		ops->host_free(n->c, n->host_w[t]);
		ops->host_free(n->c, n->host_g[t]);
	}
	for (int s = 0; s < 2; s++) {
		ops->free(n->c, n->x[s]);
		ops->free(n->c, n->labels[s]);
		ops->host_free(n->c, n->host_x[s]);
		ops->host_free(n->c, n->host_y[s]);
		if (n->e_in[s])
			ops->event_free(n->c, n->e_in[s]);
		if (n->e_used[s])
			ops->event_free(n->c, n->e_used[s]);
	}
	for (int k = 0; n->e_grad && k < n->ngrads; k++)
		if (n->e_grad[k])
			ops->event_free(n->c, n->e_grad[k]);
	if (n->e_loss)
		ops->event_free(n->c, n->e_loss);
	if (n->e_wup)
		ops->event_free(n->c, n->e_wup);
	ops->host_free(n->c, n->stats);
	ops->free(n->c, n->ws);
	free(n->l);
	free(n->host_w);
	free(n->host_g);
	free(n->dev_w);
	free(n->dev_g);
	free(n->count_of);
	free(n->grad_layer);
	free(n->e_grad);
	pthread_cond_destroy(&n->cv);
	pthread_mutex_destroy(&n->mu);
	memset(n, 0, sizeof(*n));
}

int ps_net_batch_buffers(struct ps_net *n, float **x, int32_t **y)
{
	int rc = n->ops->event_wait(n->c, n->e_in[n->fill]);

	*x = n->host_x[n->fill];
	*y = n->host_y[n->fill];
	return rc;
}

int ps_net_batch_ready(struct ps_net *n, int count)
{
	const struct ps_compute_ops *ops = n->ops;
	int s = n->fill, classes = n->cfg->model.classes, rc;

	if (count < 1 || count > n->batch) {
		snprintf(n->c->err, sizeof(n->c->err), "batch of %d examples; 1..%d fit", count,
			 n->batch);
		return -EINVAL;
	}
	for (int i = 0; i < count; i++)
		if (n->host_y[s][i] < 0 || n->host_y[s][i] >= classes) {
			snprintf(n->c->err, sizeof(n->c->err),
				 "label %d of example %d is outside [0, %d)", n->host_y[s][i], i,
				 classes);
			return -EINVAL;
		}
	/* The slot's backend buffers may still be read by the step that used
	 * them two batches ago: the copy waits for it (e_used), the host not. */
	rc = ops->upload_async(n->c, n->x[s], n->host_x[s], (size_t)count * n->in_count * sizeof(float),
			       n->e_used[s], n->e_in[s]);
	if (!rc)
		rc = ops->upload_async(n->c, n->labels[s], n->host_y[s],
				       (size_t)count * sizeof(int32_t), NULL, n->e_in[s]);
	if (rc)
		return rc;
	n->ready = s;
	n->ready_count = count;
	n->fill = 1 - s;
	return 0;
}

int ps_net_load_batch(struct ps_net *n, const float *x, const int32_t *y, int count)
{
	float *hx;
	int32_t *hy;
	int rc;

	if (count < 1 || count > n->batch)
		return ps_net_batch_ready(n, count);  /* the error message */
	if ((rc = ps_net_batch_buffers(n, &hx, &hy)))
		return rc;
	memcpy(hx, x, (size_t)count * n->in_count * sizeof(float));
	memcpy(hy, y, (size_t)count * sizeof(int32_t));
	return ps_net_batch_ready(n, count);
}

int ps_net_forward(struct ps_net *n)
{
	const struct ps_compute_ops *ops = n->ops;
	struct ps_compute *c = n->c;
	int count = n->ready_count, s = n->ready, rc;
	const float *in;

	if (s < 0) {
		snprintf(c->err, sizeof(c->err), "forward: no batch is ready (ps_net_batch_ready)");
		return -EINVAL;
	}
	n->ready = -1;
	n->cur = s;
	n->count = count;
	in = n->x[s];
	rc = ops->stream_wait(c, n->e_in[s]);
	for (int i = 0; !rc && i < n->nlayers; i++) {
		struct ps_net_layer *l = &n->l[i];
		size_t len = (size_t)count * l->out_count;
		switch (l->cfg->kind) {
		case PS_LAYER_DENSE:
			rc = ops->dense_fwd(c, in, l->W, l->b, l->y, count,
					    l->sh.in_c * l->sh.in_h * l->sh.in_w, l->cfg->out);
			break;
		case PS_LAYER_CONV2D: {
			struct ps_conv_shape cs = l->cs;
			cs.n = count;
			rc = ops->conv2d_fwd(c, &cs, in, l->W, l->b, l->y, n->ws, n->ws_bytes);
			break;
		}
		case PS_LAYER_MAXPOOL: {
			struct ps_pool_shape ps = l->ps;
			ps.n = count;
			rc = ops->maxpool_fwd(c, &ps, in, l->y, l->idx);
			break;
		}
		case PS_LAYER_RELU:
			rc = ops->relu_fwd(c, in, l->y, len);
			break;
		case PS_LAYER_FLATTEN:
			/* a view: nothing to compute */
			if (i == 0)
				l->y = n->x[s];
			(void)len;
			break;
		}
		in = l->y;
	}
	if (rc)
		return rc;
	struct ps_net_layer *last = &n->l[n->nlayers - 1];
	rc = ops->softmax_xent(c, last->y, n->labels[s], count, n->cfg->model.classes, last->dy,
			       n->stats);
	if (!rc)
		rc = ops->event_record(c, n->e_loss);
	if (!rc)
		rc = ops->event_record(c, n->e_used[s]);
	return rc;
}

int ps_net_loss(struct ps_net *n, float *loss, int *correct)
{
	int rc = n->ops->event_wait(n->c, n->e_loss);

	if (rc)
		return rc;
	return ps_compute_xent_read(n->stats, n->cfg->model.classes, loss, correct, n->c->err,
				    sizeof(n->c->err));
}

/* One layer's backward op; dx NULL for the first layer. */
static int backward_layer(struct ps_net *n, int i, float alpha)
{
	const struct ps_compute_ops *ops = n->ops;
	struct ps_compute *c = n->c;
	struct ps_net_layer *l = &n->l[i];
	int count = n->count;
	const float *in = i > 0 ? n->l[i - 1].y : n->x[n->cur];
	/* No gradient into a layer with no parameters at or below it. */
	float *dx = l->grad_below ? n->l[i - 1].dy : NULL;
	size_t in_len = (size_t)count * l->sh.in_c * l->sh.in_h * l->sh.in_w;

	switch (l->cfg->kind) {
	case PS_LAYER_DENSE:
		return ops->dense_bwd(c, in, l->W, l->dy, dx, l->dW, l->db, count,
				      l->sh.in_c * l->sh.in_h * l->sh.in_w, l->cfg->out, alpha);
	case PS_LAYER_CONV2D: {
		struct ps_conv_shape cs = l->cs;
		cs.n = count;
		return ops->conv2d_bwd(c, &cs, in, l->W, l->dy, dx, l->dW, l->db, n->ws,
				       n->ws_bytes, alpha);
	}
	case PS_LAYER_MAXPOOL: {
		struct ps_pool_shape ps = l->ps;
		ps.n = count;
		return dx ? ops->maxpool_bwd(c, &ps, l->dy, l->idx, dx) : 0;
	}
	case PS_LAYER_RELU:
		return dx ? ops->relu_bwd(c, l->y, l->dy, dx, in_len) : 0;
	case PS_LAYER_FLATTEN:
		(void)in_len;
		return 0;  /* a view: its dy is the layer below's */
	}
	return 0;
}

int ps_net_backward(struct ps_net *n, float scale, uint64_t *gen)
{
	const struct ps_compute_ops *ops = n->ops;
	struct ps_compute *c = n->c;
	/* dlogits is the gradient of the summed loss: 1/count makes it the
	 * mean's, scale the caller's (1/workers) */
	float alpha = scale / (float)n->count;
	int rc = 0, k = 0;

	pthread_mutex_lock(&n->mu);
	*gen = ++n->gen;
	n->queued = 0;
	n->failed = 0;
	pthread_mutex_unlock(&n->mu);
	for (int i = n->nlayers - 1; !rc && i >= 0; i--) {
		struct ps_net_layer *l = &n->l[i];
		rc = backward_layer(n, i, alpha);
		if (rc || l->sh.weight < 0)
			continue;
		/* This layer's gradients are final: off to the host on the copy
		 * stream while the compute stream goes on with the layers below. */
		int wt = l->sh.weight, bt = l->sh.bias;
		rc = ops->download_async(c, n->host_g[wt], l->dW,
					 (size_t)n->count_of[wt] * sizeof(float), n->e_grad[k]);
		if (!rc)
			rc = ops->download_async(c, n->host_g[bt], l->db,
						 (size_t)n->count_of[bt] * sizeof(float), n->e_grad[k]);
		if (rc)
			break;
		pthread_mutex_lock(&n->mu);
		n->queued = ++k;
		pthread_cond_broadcast(&n->cv);
		pthread_mutex_unlock(&n->mu);
	}
	if (!rc)
		rc = ops->event_record(c, n->e_used[n->cur]);
	if (rc) {
		pthread_mutex_lock(&n->mu);
		snprintf(n->err, sizeof(n->err), "backward: %.240s", c->err);
		n->failed = rc;
		pthread_cond_broadcast(&n->cv);
		pthread_mutex_unlock(&n->mu);
	}
	return rc;
}

int ps_net_grad_wait(struct ps_net *n, uint64_t gen, int k, int *wt, int *bt)
{
	int rc;

	if (k < 0 || k >= n->ngrads)
		return -EINVAL;
	pthread_mutex_lock(&n->mu);
	while (n->gen < gen || (n->gen == gen && n->queued <= k && !n->failed))
		pthread_cond_wait(&n->cv, &n->mu);
	rc = n->gen != gen ? -ESTALE : n->failed;
	pthread_mutex_unlock(&n->mu);
	if (rc)
		return rc;
	rc = n->ops->event_wait(n->c, n->e_grad[k]);
	if (rc) {
		snprintf(n->err, sizeof(n->err), "gradient copy: %.230s", n->c->err);
		return rc;
	}
	if (k == 0) {
		/* The loss was queued before any gradient, so it is complete:
		 * gradients of a batch with a bad label or a non-finite loss
		 * are never pushed. */
		float loss;
		int correct;
		rc = ps_compute_xent_read(n->stats, n->cfg->model.classes, &loss, &correct, n->err,
					  sizeof(n->err));
		if (rc)
			return rc;
	}
	ps_net_pair(n, k, wt, bt);
	return 0;
}

void ps_net_pair(const struct ps_net *n, int k, int *wt, int *bt)
{
	*wt = n->l[n->grad_layer[k]].sh.weight;
	*bt = n->l[n->grad_layer[k]].sh.bias;
}

int ps_net_upload_weights(struct ps_net *n)
{
	for (int t = 0; t < n->ntensors; t++) {
		if (!n->dev_w[t])
			continue;
		int rc = n->ops->upload(n->c, n->dev_w[t], n->host_w[t],
					(size_t)n->count_of[t] * sizeof(float));
		if (rc)
			return rc;
	}
	return ps_net_upload_mark(n);
}

int ps_net_upload_pair(struct ps_net *n, int k)
{
	int t[2], rc = 0;

	if (k < 0 || k >= n->ngrads)
		return -EINVAL;
	ps_net_pair(n, k, &t[0], &t[1]);
	for (int i = 0; i < 2 && !rc; i++)
		rc = n->ops->upload(n->c, n->dev_w[t[i]], n->host_w[t[i]],
				    (size_t)n->count_of[t[i]] * sizeof(float));
	return rc;
}

int ps_net_upload_mark(struct ps_net *n)
{
	return n->ops->event_record(n->c, n->e_wup);
}

int ps_net_weights_wait(struct ps_net *n)
{
	return n->ops->event_wait(n->c, n->e_wup);
}
