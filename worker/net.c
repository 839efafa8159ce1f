/* net.c - forward and backward passes over the layers of a model. */
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
	rc = ps_layers_infer(m, sh, err, errlen);
	if (rc)
		return rc;
	n->nlayers = m->nlayers;
	n->ntensors = cfg->ntensors;
	n->l = calloc((size_t)n->nlayers, sizeof(*n->l));
	n->host_w = calloc((size_t)n->ntensors, sizeof(float *));
	n->host_g = calloc((size_t)n->ntensors, sizeof(float *));
	n->dev_w = calloc((size_t)n->ntensors, sizeof(float *));
	n->dev_g = calloc((size_t)n->ntensors, sizeof(float *));
	n->count = calloc((size_t)n->ntensors, sizeof(int64_t));
	if (!n->l || !n->host_w || !n->host_g || !n->dev_w || !n->dev_g || !n->count) {
		snprintf(err, errlen, "out of memory");
		rc = -ENOMEM;
		goto err_free_net;
	}
	size_t in_count = (size_t)m->input[0] * m->input[1] * m->input[2];
	n->x = ops->alloc(c, (size_t)batch * in_count * sizeof(float));
	n->labels = (int32_t *)ops->alloc(c, (size_t)batch * sizeof(int32_t));
	n->dx_scratch = ops->alloc(c, (size_t)batch * in_count * sizeof(float));
	if (!n->x || !n->labels || !n->dx_scratch) {
		rc = fail(n, err, errlen, "input buffers");
		goto err_free_net;
	}
	for (int i = 0; i < n->nlayers; i++) {
		struct ps_net_layer *l = &n->l[i];
		l->cfg = &m->layers[i];
		l->sh = sh[i];
		l->out_count = (size_t)sh[i].out_c * sh[i].out_h * sh[i].out_w;
		l->y = ops->alloc(c, (size_t)batch * l->out_count * sizeof(float));
		l->dy = ops->alloc(c, (size_t)batch * l->out_count * sizeof(float));
		if (!l->y || !l->dy) {
			rc = fail(n, err, errlen, "activations");
			goto err_free_net;
		}
		if (l->cfg->kind == PS_LAYER_CONV2D) {
			l->cs = (struct ps_conv_shape){ .n = batch, .c = sh[i].in_c, .h = sh[i].in_h,
							.w = sh[i].in_w, .k = l->cfg->out,
							.kh = l->cfg->kernel, .kw = l->cfg->kernel,
							.pad = l->cfg->pad,
							.stride = l->cfg->stride ? l->cfg->stride : 1 };
			ps_conv_out(&l->cs);
			size_t ws = ops->conv2d_workspace(c, &l->cs);
			if (ws > n->ws_bytes)
				n->ws_bytes = ws;
		} else if (l->cfg->kind == PS_LAYER_MAXPOOL) {
			l->ps = (struct ps_pool_shape){ .n = batch, .c = sh[i].in_c, .h = sh[i].in_h,
							.w = sh[i].in_w, .size = l->cfg->size,
							.oh = sh[i].out_h, .ow = sh[i].out_w };
			l->idx = (int32_t *)ops->alloc(c, (size_t)batch * l->out_count * sizeof(int32_t));
			if (!l->idx) {
				rc = fail(n, err, errlen, "maxpool indices");
				goto err_free_net;
			}
		}
		if (sh[i].weight >= 0) {
			int wt = sh[i].weight, bt = sh[i].bias;
			if (bt >= cfg->ntensors) {
				snprintf(err, errlen, "the config has %d tensors, the model needs more",
					 cfg->ntensors);
				rc = PS_ECONFIG;
				goto err_free_net;
			}
			n->count[wt] = cfg->tensors[wt].count;
			n->count[bt] = cfg->tensors[bt].count;
			l->W = n->dev_w[wt] = ops->alloc(c, (size_t)n->count[wt] * sizeof(float));
			l->b = n->dev_w[bt] = ops->alloc(c, (size_t)n->count[bt] * sizeof(float));
			l->dW = n->dev_g[wt] = ops->alloc(c, (size_t)n->count[wt] * sizeof(float));
			l->db = n->dev_g[bt] = ops->alloc(c, (size_t)n->count[bt] * sizeof(float));
			if (!l->W || !l->b || !l->dW || !l->db) {
				rc = fail(n, err, errlen, "parameters");
				goto err_free_net;
			}
		}
	}
	if (n->ws_bytes) {
		n->ws = ops->alloc(c, n->ws_bytes);
		if (!n->ws) {
			rc = fail(n, err, errlen, "convolution workspace");
			goto err_free_net;
		}
	}
	for (int t = 0; t < n->ntensors; t++) {
		size_t bytes = (size_t)cfg->tensors[t].count * sizeof(float);
		n->count[t] = cfg->tensors[t].count;
		n->host_w[t] = ops->host_alloc(c, bytes);
		n->host_g[t] = ops->host_alloc(c, bytes);
		if (!n->host_w[t] || !n->host_g[t]) {
			rc = fail(n, err, errlen, "host buffers");
			goto err_free_net;
		}
	}
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
	for (int i = 0; n->l && i < n->nlayers; i++) {
		struct ps_net_layer *l = &n->l[i];
		ops->free(n->c, l->y);
		ops->free(n->c, l->dy);
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
	ops->free(n->c, n->x);
	ops->free(n->c, n->labels);
	ops->free(n->c, n->dx_scratch);
	ops->free(n->c, n->ws);
	free(n->l);
	free(n->host_w);
	free(n->host_g);
	free(n->dev_w);
	free(n->dev_g);
	free(n->count);
	memset(n, 0, sizeof(*n));
}

int ps_net_upload_weights(struct ps_net *n)
{
	for (int t = 0; t < n->ntensors; t++) {
		if (!n->dev_w[t])
			continue;
		int rc = n->ops->upload(n->c, n->dev_w[t], n->host_w[t],
					(size_t)n->count[t] * sizeof(float));
		if (rc)
			return rc;
	}
	return 0;
}

int ps_net_forward(struct ps_net *n, const float *x, const int32_t *y, int count, float *loss,
		   int *correct)
{
	const struct ps_compute_ops *ops = n->ops;
	struct ps_compute *c = n->c;
	const struct ps_model_cfg *m = &n->cfg->model;
	size_t in_count = (size_t)m->input[0] * m->input[1] * m->input[2];
	const float *in = n->x;
	int rc;

	if (count < 1 || count > n->batch)
		return -EINVAL;
	rc = ops->upload(c, n->x, x, (size_t)count * in_count * sizeof(float));
	if (!rc)
		rc = ops->upload(c, n->labels, y, (size_t)count * sizeof(int32_t));
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
			/* Same bytes, new shape: copy so each layer owns its output. */
			rc = ops->scale(c, l->y, in, 1.0f, len);
			break;
		}
		in = l->y;
	}
	if (rc)
		return rc;
	struct ps_net_layer *last = &n->l[n->nlayers - 1];
	return ops->softmax_xent(c, last->y, n->labels, count, m->classes, last->dy, loss, correct);
}

int ps_net_backward(struct ps_net *n, int count, float scale,
		    int (*ready)(void *arg, int wt, int bt), void *arg)
{
	const struct ps_compute_ops *ops = n->ops;
	struct ps_compute *c = n->c;
	int rc = 0;

	for (int i = n->nlayers - 1; !rc && i >= 0; i--) {
		struct ps_net_layer *l = &n->l[i];
		const float *in = i > 0 ? n->l[i - 1].y : n->x;
		/* Gradient into this layer's input; none is needed for layer 0. */
		float *dx = i > 0 ? n->l[i - 1].dy : NULL;
		size_t in_len = (size_t)count * l->sh.in_c * l->sh.in_h * l->sh.in_w;
		switch (l->cfg->kind) {
		case PS_LAYER_DENSE:
			rc = ops->dense_bwd(c, in, l->W, l->dy, dx, l->dW, l->db, count,
					    l->sh.in_c * l->sh.in_h * l->sh.in_w, l->cfg->out);
			break;
		case PS_LAYER_CONV2D: {
			struct ps_conv_shape cs = l->cs;
			cs.n = count;
			rc = ops->conv2d_bwd(c, &cs, in, l->W, l->dy, dx, l->dW, l->db, n->ws,
					     n->ws_bytes);
			break;
		}
		case PS_LAYER_MAXPOOL: {
			struct ps_pool_shape ps = l->ps;
			ps.n = count;
			rc = dx ? ops->maxpool_bwd(c, &ps, l->dy, l->idx, dx) : 0;
			break;
		}
		case PS_LAYER_RELU:
			rc = dx ? ops->relu_bwd(c, l->y, l->dy, dx, in_len) : 0;
			break;
		case PS_LAYER_FLATTEN:
			rc = dx ? ops->scale(c, dx, l->dy, 1.0f, in_len) : 0;
			break;
		}
		if (rc || l->sh.weight < 0)
			continue;
		/* Parameters of this layer are final: scale, fetch, hand over. */
		int wt = l->sh.weight, bt = l->sh.bias;
		if (scale != 1.0f) {
			rc = ops->scale(c, l->dW, l->dW, scale, (size_t)n->count[wt]);
			if (!rc)
				rc = ops->scale(c, l->db, l->db, scale, (size_t)n->count[bt]);
		}
		if (!rc)
			rc = ops->download(c, n->host_g[wt], l->dW, (size_t)n->count[wt] * sizeof(float));
		if (!rc)
			rc = ops->download(c, n->host_g[bt], l->db, (size_t)n->count[bt] * sizeof(float));
		if (!rc)
			rc = ops->sync(c);
		if (!rc && ready)
			rc = ready(arg, wt, bt);
	}
	return rc;
}
