/* compute_dnnl_conv.c - convolutions of the "cpu" backend on oneDNN.
 *
 * Per shape, made once (on conv2d_workspace or the first call) and cached:
 *   prim[0]  forward with bias                 x, W, b -> y
 *   prim[1]  backward data                     dy, W -> dx
 *   prim[2]  backward weights with bias        x, dy -> dW, db
 * all direct convolutions (deterministic, full fp32) with the layouts
 * oneDNN picks for this machine (on AVX2: nChw8c activations, OIhw8i8o
 * filters; the c = 1 first layer reads NCHW directly). The callers' tensors
 * are NCHW, so each op reorders its inputs into the workspace and its
 * outputs back: a few memory passes against the convolution's arithmetic,
 * cheaper than the im2col copies the reference makes, and the filters
 * (which change with every pull) are reordered where they are read.
 * oneDNN's scratchpad is in the workspace too, so conv2d_workspace reports
 * the most any of the three needs. dW and db are scaled by alpha after the
 * primitive: oneDNN's backward primitives take no output scale.
 */
#include <errno.h>
#include <string.h>
#include "compute_dnnl.h"
#include "compute_ref.h"
#include "ps_err.h"

/* Makes the three primitives of shape s into e. */
static int conv_make(struct dn_backend *b, struct dn_entry *e, const struct ps_conv_shape *s)
{
	dnnl_dims_t xd = { s->n, s->c, s->h, s->w }, wd = { s->k, s->c, s->kh, s->kw },
		    yd = { s->n, s->k, s->oh, s->ow }, bd = { s->k };
	dnnl_dims_t strides = { s->stride, s->stride }, pad = { s->pad, s->pad };
	/* right padding: what makes the output size come out as ps_conv_out's */
	dnnl_dims_t pad_r = { (s->oh - 1) * s->stride + s->kh - s->h - s->pad,
			      (s->ow - 1) * s->stride + s->kw - s->w - s->pad };
	dnnl_memory_desc_t xa, wa, ya, x, w, y, bias;
	dnnl_convolution_desc_t d;
	dnnl_primitive_desc_t fpd = NULL, pd;
	dnnl_primitive_attr_t attr = NULL;
	dnnl_status_t st;
	int rc;

	dnnl_memory_desc_init_by_tag(&xa, 4, xd, dnnl_f32, dnnl_format_tag_any);
	dnnl_memory_desc_init_by_tag(&wa, 4, wd, dnnl_f32, dnnl_format_tag_any);
	dnnl_memory_desc_init_by_tag(&ya, 4, yd, dnnl_f32, dnnl_format_tag_any);
	dnnl_memory_desc_init_by_tag(&x, 4, xd, dnnl_f32, dnnl_nchw);
	dnnl_memory_desc_init_by_tag(&w, 4, wd, dnnl_f32, dnnl_oihw);
	dnnl_memory_desc_init_by_tag(&y, 4, yd, dnnl_f32, dnnl_nchw);
	dnnl_memory_desc_init_by_tag(&bias, 1, bd, dnnl_f32, dnnl_a);

	if ((st = dnnl_primitive_attr_create(&attr)) ||
	    (st = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user)))
		goto err_st;
	if ((st = dnnl_convolution_forward_desc_init(&d, dnnl_forward_training,
						     dnnl_convolution_direct, &xa, &wa, &bias, &ya,
						     strides, pad, pad_r)) ||
	    (st = dnnl_primitive_desc_create(&fpd, &d, attr, b->eng, NULL)) ||
	    (st = dnnl_primitive_desc_clone(&pd, fpd)))
		goto err_st;
	rc = ps__dn_prim_make(b, &e->prim[0], pd, 4,
			      (int[]){ DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_BIAS, DNNL_ARG_DST },
			      (int[]){ 0, 0, 0, 1 }, (dnnl_memory_desc_t[]){ x, w, bias, y },
			      "conv2d forward");
	if (rc)
		goto err_rc;
	if ((st = dnnl_convolution_backward_data_desc_init(&d, dnnl_convolution_direct, &xa, &wa,
							   &ya, strides, pad, pad_r)) ||
	    (st = dnnl_primitive_desc_create(&pd, &d, attr, b->eng, fpd)))
		goto err_st;
	rc = ps__dn_prim_make(b, &e->prim[1], pd, 3,
			      (int[]){ DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC },
			      (int[]){ 0, 0, 1 }, (dnnl_memory_desc_t[]){ y, w, x },
			      "conv2d backward data");
	if (rc)
		goto err_rc;
	if ((st = dnnl_convolution_backward_weights_desc_init(&d, dnnl_convolution_direct, &xa,
							      &wa, &bias, &ya, strides, pad,
							      pad_r)) ||
	    (st = dnnl_primitive_desc_create(&pd, &d, attr, b->eng, fpd)))
		goto err_st;
	rc = ps__dn_prim_make(b, &e->prim[2], pd, 4,
			      (int[]){ DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS,
				       DNNL_ARG_DIFF_BIAS },
			      (int[]){ 0, 0, 1, 1 }, (dnnl_memory_desc_t[]){ x, y, w, bias },
			      "conv2d backward weights");
	if (rc)
		goto err_rc;
	dnnl_primitive_desc_destroy(fpd);
	dnnl_primitive_attr_destroy(attr);
	return ps__dn_entry_ws(b, e, 0);

err_st:
	rc = ps__dn_fail(&b->base, st, "conv2d");
err_rc:
	if (fpd)
		dnnl_primitive_desc_destroy(fpd);
	if (attr)
		dnnl_primitive_attr_destroy(attr);
	return rc;
}

/* The entry of shape s (checked, oh and ow from ps_conv_out), made on first use. */
static int conv_get(struct ps_compute *c, const struct ps_conv_shape *s, struct dn_entry **ep)
{
	struct dn_backend *b = dn_of(c);
	int key[9] = { s->n, s->c, s->h, s->w, s->k, s->kh, s->kw, s->pad, s->stride };
	struct dn_entry *e;
	int fresh, rc;

	if ((rc = ps__ref_conv_check(c, s)))
		return rc;
	e = ps__dn_cache_get(b, DN_CONV, key, 9, &fresh);
	if (fresh && (rc = conv_make(b, e, s))) {
		ps__dn_cache_drop(b, e);
		return rc;
	}
	*ep = e;
	return 0;
}

int ps__dn_conv2d_workspace(struct ps_compute *c, const struct ps_conv_shape *s, size_t *bytes)
{
	struct ps_conv_shape t = *s;
	struct dn_entry *e;
	int rc;

	*bytes = 0;
	ps_conv_out(&t);  /* callers may not have filled oh, ow */
	if ((rc = conv_get(c, &t, &e)))
		return rc;
	*bytes = e->ws_bytes;
	return 0;
}

static int ws_check(struct ps_compute *c, const struct dn_entry *e, const void *ws,
		    size_t ws_bytes)
{
	if (e->ws_bytes && (!ws || ws_bytes < e->ws_bytes))
		return ps__ref_fail(c, -EINVAL, "conv2d: workspace of %zu bytes, %zu needed",
				    ws ? ws_bytes : 0, e->ws_bytes);
	return 0;
}

int ps__dn_conv2d_fwd(struct ps_compute *c, const struct ps_conv_shape *s, const float *x,
		      const float *W, const float *b, float *y, void *ws, size_t ws_bytes)
{
	struct dn_entry *e;
	int rc = conv_get(c, s, &e);

	if (!rc)
		rc = ws_check(c, e, ws, ws_bytes);
	if (rc)
		return rc;
	return ps__dn_prim_run(dn_of(c), &e->prim[0],
			       (void *const[]){ (void *)x, (void *)W, (void *)b, y }, ws,
			       "conv2d forward");
}

/* Scales n floats in place (skipped for alpha 1: the gradients stay the
 * primitive's own bits). */
static void scale(float *restrict v, size_t n, float alpha)
{
	if (alpha == 1.0f)
		return;
	for (size_t i = 0; i < n; i++)
		v[i] *= alpha;
}

int ps__dn_conv2d_bwd(struct ps_compute *c, const struct ps_conv_shape *s, const float *x,
		      const float *W, const float *dy, float *dx, float *dW, float *db, void *ws,
		      size_t ws_bytes, float alpha)
{
	struct dn_entry *e;
	int rc = conv_get(c, s, &e);

	if (!rc)
		rc = ws_check(c, e, ws, ws_bytes);
	if (rc)
		return rc;
	rc = ps__dn_prim_run(dn_of(c), &e->prim[2],
			     (void *const[]){ (void *)x, (void *)dy, dW, db }, ws,
			     "conv2d backward weights");
	if (rc)
		return rc;
	scale(dW, (size_t)s->k * s->c * s->kh * s->kw, alpha);
	scale(db, (size_t)s->k, alpha);
	if (!dx)
		return 0;
	return ps__dn_prim_run(dn_of(c), &e->prim[1], (void *const[]){ (void *)dy, (void *)W, dx },
			       ws, "conv2d backward data");
}
