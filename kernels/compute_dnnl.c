/* compute_dnnl.c - the default CPU backend "cpu": oneDNN primitives.
 *
 * oneDNN (Debian's libdnnl, the library PyTorch itself calls for CPU
 * convolutions) runs the convolutions (compute_dnnl_conv.c), the dense
 * layers (matmul) and ReLU (eltwise), each primitive made once per shape
 * and kept in a small cache, as the cuda backend keeps its cuDNN plans.
 * What stays plain C, shared with the reference backend (compute_ref.c):
 * host memory, copies and events (ops run to completion on the calling
 * thread, as on "ref"), max pooling (the idx contract of compute.h is a
 * position in the input plane, which oneDNN's workspace is not; the plain
 * loop is a small share of a cnn step) and softmax cross-entropy.
 *
 * Threads: oneDNN as Debian builds it uses OpenMP. ps_compute_opts.threads
 * (0: OpenMP's default, OMP_NUM_THREADS or the cores) is set on the thread
 * that issues each op, so two backends in one process may differ. Results
 * are deterministic for a given thread count (oneDNN's reductions split the
 * work the same way each run), which sync training's bit-identical runs need.
 */
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dnnl_debug.h>
#include "compute_dnnl.h"
#include "compute_ref.h"
#include "ps_err.h"

#define WS_ALIGN 64

int ps__dn_fail(struct ps_compute *c, dnnl_status_t st, const char *what)
{
	return ps__ref_fail(c, st == dnnl_out_of_memory ? -ENOMEM : PS_ENOTSUP,
			    "oneDNN %s: %s", what, dnnl_status2str(st));
}

void ps__dn_enter(struct dn_backend *b)
{
	if (omp_get_max_threads() != b->threads)
		omp_set_num_threads(b->threads);
}

void ps__dn_md(dnnl_memory_desc_t *md, int ndims, const dnnl_dim_t *dims)
{
	dnnl_dims_t d = { 0 }, st = { 0 };
	dnnl_dim_t s = 1;

	for (int i = ndims - 1; i >= 0; i--) {
		d[i] = dims[i];
		st[i] = s;
		s *= dims[i];
	}
	dnnl_memory_desc_init_by_strides(md, ndims, d, dnnl_f32, st);
}

/* ---- primitives with their argument bindings ---- */

static size_t ws_take(size_t *used, size_t bytes)
{
	size_t at = (*used + WS_ALIGN - 1) / WS_ALIGN * WS_ALIGN;

	*used = at + bytes;
	return at;
}

void ps__dn_prim_free(struct dn_prim *p)
{
	for (int i = 0; i < p->nargs; i++) {
		struct dn_arg *a = &p->a[i];
		if (a->mem && a->mem != a->user)
			dnnl_memory_destroy(a->mem);
		if (a->user)
			dnnl_memory_destroy(a->user);
		if (a->reorder)
			dnnl_primitive_destroy(a->reorder);
	}
	if (p->scratch)
		dnnl_memory_destroy(p->scratch);
	if (p->p)
		dnnl_primitive_destroy(p->p);
	memset(p, 0, sizeof(*p));
}

/* Binds one argument: a plain user memory, and where the primitive wants
 * another layout, a workspace memory and the reorder between them. */
static dnnl_status_t bind_arg(struct dn_backend *b, struct dn_prim *p, dnnl_primitive_desc_t pd,
			      int arg, int out, const dnnl_memory_desc_t *plain, size_t *used)
{
	struct dn_arg *a = &p->a[p->nargs++];
	const dnnl_memory_desc_t *want = dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, arg);
	dnnl_primitive_desc_t rpd = NULL;
	dnnl_status_t st;

	a->arg = arg;
	a->out = out;
	if (!want || want->ndims == 0)
		want = plain;  /* not a layout the primitive chooses (output scales) */
	if ((st = dnnl_memory_create(&a->user, plain, b->eng, DNNL_MEMORY_NONE)))
		return st;
	if (dnnl_memory_desc_equal(want, plain)) {
		a->mem = a->user;
		return dnnl_success;
	}
	a->ws_off = ws_take(used, dnnl_memory_desc_get_size(want));
	if ((st = dnnl_memory_create(&a->mem, want, b->eng, DNNL_MEMORY_NONE)))
		return st;
	st = out ? dnnl_reorder_primitive_desc_create(&rpd, want, b->eng, plain, b->eng, NULL)
		 : dnnl_reorder_primitive_desc_create(&rpd, plain, b->eng, want, b->eng, NULL);
	if (st)
		return st;
	st = dnnl_primitive_create(&a->reorder, rpd);
	dnnl_primitive_desc_destroy(rpd);
	return st;
}

int ps__dn_prim_make(struct dn_backend *b, struct dn_prim *p, dnnl_primitive_desc_t pd,
		     int nargs, const int *args, const int *out, const dnnl_memory_desc_t *plain,
		     const char *what)
{
	const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
	size_t used = 0;
	dnnl_status_t st = dnnl_success;

	memset(p, 0, sizeof(*p));
	for (int i = 0; i < nargs && !st; i++)
		st = bind_arg(b, p, pd, args[i], out[i], &plain[i], &used);
	if (!st && sp && dnnl_memory_desc_get_size(sp) > 0) {
		p->scratch_off = ws_take(&used, dnnl_memory_desc_get_size(sp));
		st = dnnl_memory_create(&p->scratch, sp, b->eng, DNNL_MEMORY_NONE);
	}
	if (!st)
		st = dnnl_primitive_create(&p->p, pd);
	dnnl_primitive_desc_destroy(pd);
	if (st) {
		ps__dn_prim_free(p);
		return ps__dn_fail(&b->base, st, what);
	}
	p->ws_bytes = used;
	return 0;
}

static dnnl_status_t reorder(struct dn_backend *b, struct dn_arg *a)
{
	dnnl_exec_arg_t r[2] = {
		{ DNNL_ARG_SRC, a->out ? a->mem : a->user },
		{ DNNL_ARG_DST, a->out ? a->user : a->mem },
	};
	return dnnl_primitive_execute(a->reorder, b->strm, 2, r);
}

int ps__dn_prim_run(struct dn_backend *b, struct dn_prim *p, void *const *ptrs, void *ws,
		    const char *what)
{
	dnnl_exec_arg_t ea[DN_MAXARGS + 1];
	char *w = ws;
	int n = 0;
	dnnl_status_t st = dnnl_success;

	ps__dn_enter(b);
	for (int i = 0; i < p->nargs && !st; i++) {
		struct dn_arg *a = &p->a[i];
		if (!ptrs[i])
			continue;
		st = dnnl_memory_set_data_handle(a->user, ptrs[i]);
		if (!st && a->reorder) {
			st = dnnl_memory_set_data_handle(a->mem, w + a->ws_off);
			if (!st && !a->out)
				st = reorder(b, a);
		}
		ea[n++] = (dnnl_exec_arg_t){ a->arg, a->mem };
	}
	if (!st && p->scratch) {
		st = dnnl_memory_set_data_handle(p->scratch, w + p->scratch_off);
		ea[n++] = (dnnl_exec_arg_t){ DNNL_ARG_SCRATCHPAD, p->scratch };
	}
	if (!st)
		st = dnnl_primitive_execute(p->p, b->strm, n, ea);
	for (int i = 0; i < p->nargs && !st; i++)
		if (ptrs[i] && p->a[i].reorder && p->a[i].out)
			st = reorder(b, &p->a[i]);
	if (!st)
		st = dnnl_stream_wait(b->strm);
	return st ? ps__dn_fail(&b->base, st, what) : 0;
}

/* ---- the cache of primitives by shape ---- */

static void entry_free(struct dn_entry *e)
{
	for (int i = 0; i < 3; i++)
		ps__dn_prim_free(&e->prim[i]);
	free(e->own_ws);
	memset(e, 0, sizeof(*e));
}

struct dn_entry *ps__dn_cache_get(struct dn_backend *b, enum dn_kind kind, const int *key,
				  int nkey, int *fresh)
{
	struct dn_entry *e = NULL;
	int k[12] = { 0 };

	memcpy(k, key, (size_t)nkey * sizeof(int));
	*fresh = 0;
	b->tick++;
	/* before any primitive is made: oneDNN fixes a primitive's thread
	 * count when it creates it, not when it runs */
	ps__dn_enter(b);
	for (int i = 0; i < b->ncache; i++) {
		if (b->cache[i].kind == kind && !memcmp(b->cache[i].key, k, sizeof(k))) {
			b->cache[i].used = b->tick;
			return &b->cache[i];
		}
	}
	if (b->ncache < DN_CACHE) {
		e = &b->cache[b->ncache++];
	} else {
		e = &b->cache[0];
		for (int i = 1; i < DN_CACHE; i++)
			if (b->cache[i].used < e->used)
				e = &b->cache[i];
		entry_free(e);
	}
	e->kind = kind;
	memcpy(e->key, k, sizeof(k));
	e->used = b->tick;
	*fresh = 1;
	return e;
}

int ps__dn_entry_ws(struct dn_backend *b, struct dn_entry *e, int own)
{
	e->ws_bytes = 0;
	for (int i = 0; i < 3; i++)
		if (e->prim[i].ws_bytes > e->ws_bytes)
			e->ws_bytes = e->prim[i].ws_bytes;
	if (!own || !e->ws_bytes)
		return 0;
	e->own_ws = aligned_alloc(WS_ALIGN, (e->ws_bytes + WS_ALIGN - 1) / WS_ALIGN * WS_ALIGN);
	if (!e->own_ws)
		return ps__ref_fail(&b->base, -ENOMEM, "out of memory for a oneDNN scratchpad "
				    "of %zu bytes", e->ws_bytes);
	return 0;
}

void ps__dn_cache_drop(struct dn_backend *b, struct dn_entry *e)
{
	(void)b;
	entry_free(e);  /* kind 0 never matches a lookup; the slot is reused */
}

/* ---- lifecycle ---- */

static int dn_create(struct ps_compute **out, const struct ps_compute_opts *opts, char *err,
		     size_t errlen)
{
	struct dn_backend *b = calloc(1, sizeof(*b));
	dnnl_status_t st;

	*out = NULL;
	if (!b) {
		if (err && errlen)
			snprintf(err, errlen, "out of memory creating the cpu backend");
		return -ENOMEM;
	}
	b->base.ops = &ps_compute_cpu_ops;
	b->threads = opts && opts->threads > 0 ? opts->threads : omp_get_max_threads();
	if ((st = dnnl_engine_create(&b->eng, dnnl_cpu, 0)))
		goto err_free_b;
	if ((st = dnnl_stream_create(&b->strm, b->eng, dnnl_stream_default_flags)))
		goto err_free_eng;
	*out = &b->base;
	return 0;

err_free_eng:
	dnnl_engine_destroy(b->eng);
err_free_b:
	free(b);
	if (err && errlen)
		snprintf(err, errlen, "oneDNN: cannot create a CPU engine and stream: %s",
			 dnnl_status2str(st));
	return PS_ENOTSUP;
}

static void dn_destroy(struct ps_compute *c)
{
	struct dn_backend *b = dn_of(c);

	for (int i = 0; i < b->ncache; i++)
		entry_free(&b->cache[i]);
	dnnl_stream_destroy(b->strm);
	dnnl_engine_destroy(b->eng);
	free(b);
}

/* ---- dense: matmul ---- */

/* Three matmuls per shape, all on plain row-major buffers:
 *   prim[0]  y = x W + b              x[n, in] W[in, out] b[1, out]
 *   prim[1]  dx = dy W^T              W read transposed (strides)
 *   prim[2]  dW = alpha x^T dy        x read transposed; alpha a runtime scale
 * Plain layouts are what matmul takes, so nothing is reordered; oneDNN's
 * scratchpad, if any, is the entry's own buffer (dense ops take no workspace). */

static int dense_make(struct dn_backend *b, struct dn_entry *e, int n, int in, int out)
{
	dnnl_memory_desc_t x, w, bias, y, dy, wt, xt, dw, sc;
	dnnl_matmul_desc_t d;
	dnnl_primitive_desc_t pd;
	dnnl_primitive_attr_t attr = NULL;
	dnnl_status_t st;
	int rc;

	ps__dn_md(&x, 2, (dnnl_dim_t[]){ n, in });
	ps__dn_md(&w, 2, (dnnl_dim_t[]){ in, out });
	ps__dn_md(&bias, 2, (dnnl_dim_t[]){ 1, out });
	ps__dn_md(&y, 2, (dnnl_dim_t[]){ n, out });
	dy = y;
	dw = w;
	dnnl_memory_desc_init_by_strides(&wt, 2, (dnnl_dims_t){ out, in }, dnnl_f32,
					 (dnnl_dims_t){ 1, out });
	dnnl_memory_desc_init_by_strides(&xt, 2, (dnnl_dims_t){ in, n }, dnnl_f32,
					 (dnnl_dims_t){ 1, in });
	ps__dn_md(&sc, 1, (dnnl_dim_t[]){ 1 });

	if ((st = dnnl_primitive_attr_create(&attr)) ||
	    (st = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user)))
		goto err_st;
	if ((st = dnnl_matmul_desc_init(&d, &x, &w, &bias, &y)) ||
	    (st = dnnl_primitive_desc_create(&pd, &d, attr, b->eng, NULL)))
		goto err_st;
	rc = ps__dn_prim_make(b, &e->prim[0], pd, 4,
			      (int[]){ DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_BIAS, DNNL_ARG_DST },
			      (int[]){ 0, 0, 0, 1 }, (dnnl_memory_desc_t[]){ x, w, bias, y },
			      "dense forward");
	if (rc)
		goto err_rc;
	if ((st = dnnl_matmul_desc_init(&d, &dy, &wt, NULL, &x)) ||
	    (st = dnnl_primitive_desc_create(&pd, &d, attr, b->eng, NULL)))
		goto err_st;
	rc = ps__dn_prim_make(b, &e->prim[1], pd, 3,
			      (int[]){ DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST },
			      (int[]){ 0, 0, 1 }, (dnnl_memory_desc_t[]){ dy, wt, x }, "dense dx");
	if (rc)
		goto err_rc;
	if ((st = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &DNNL_RUNTIME_F32_VAL)) ||
	    (st = dnnl_matmul_desc_init(&d, &xt, &dy, NULL, &dw)) ||
	    (st = dnnl_primitive_desc_create(&pd, &d, attr, b->eng, NULL)))
		goto err_st;
	rc = ps__dn_prim_make(b, &e->prim[2], pd, 4,
			      (int[]){ DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST,
				       DNNL_ARG_ATTR_OUTPUT_SCALES },
			      (int[]){ 0, 0, 1, 0 }, (dnnl_memory_desc_t[]){ xt, dy, dw, sc }, "dense dW");
	if (rc)
		goto err_rc;
	dnnl_primitive_attr_destroy(attr);
	return ps__dn_entry_ws(b, e, 1);

err_st:
	rc = ps__dn_fail(&b->base, st, "dense");
err_rc:
	if (attr)
		dnnl_primitive_attr_destroy(attr);
	return rc;
}

/* The dense entry of this shape, made on first use. */
static int dense_get(struct ps_compute *c, int n, int in, int out, struct dn_entry **ep)
{
	struct dn_backend *b = dn_of(c);
	struct dn_entry *e;
	int fresh, rc;

	if ((rc = ps__ref_dense_check(c, n, in, out)))
		return rc;
	e = ps__dn_cache_get(b, DN_DENSE, (int[]){ n, in, out }, 3, &fresh);
	if (fresh && (rc = dense_make(b, e, n, in, out))) {
		ps__dn_cache_drop(b, e);
		return rc;
	}
	*ep = e;
	return 0;
}

static int dn_dense_fwd(struct ps_compute *c, const float *x, const float *W, const float *b,
			float *y, int n, int in, int out)
{
	struct dn_entry *e;
	int rc = dense_get(c, n, in, out, &e);

	if (rc)
		return rc;
	return ps__dn_prim_run(dn_of(c), &e->prim[0],
			       (void *const[]){ (void *)x, (void *)W, (void *)b, y }, e->own_ws,
			       "dense forward");
}

/* db = alpha times the column sums of dy, row by row so the adds vectorize. */
static void bias_grad(const float *restrict dy, float *restrict db, int n, int out, float alpha)
{
	memcpy(db, dy, (size_t)out * sizeof(float));
	for (int i = 1; i < n; i++) {
		const float *restrict r = dy + (size_t)i * out;
		for (int j = 0; j < out; j++)
			db[j] += r[j];
	}
	for (int j = 0; j < out; j++)
		db[j] *= alpha;
}

static int dn_dense_bwd(struct ps_compute *c, const float *x, const float *W, const float *dy,
			float *dx, float *dW, float *db, int n, int in, int out, float alpha)
{
	struct dn_entry *e;
	int rc = dense_get(c, n, in, out, &e);

	if (rc)
		return rc;
	rc = ps__dn_prim_run(dn_of(c), &e->prim[2],
			     (void *const[]){ (void *)x, (void *)dy, dW, &alpha }, e->own_ws, "dense dW");
	if (rc)
		return rc;
	bias_grad(dy, db, n, out, alpha);
	if (!dx)
		return 0;
	return ps__dn_prim_run(dn_of(c), &e->prim[1], (void *const[]){ (void *)dy, (void *)W, dx },
			       e->own_ws, "dense dx");
}

/* ---- relu: eltwise ---- */

/* prim[0] forward, prim[1] backward from relu's output (dx = dy where y > 0). */
static int relu_get(struct ps_compute *c, size_t n, struct dn_entry **ep)
{
	struct dn_backend *b = dn_of(c);
	dnnl_memory_desc_t md;
	dnnl_eltwise_desc_t d;
	dnnl_primitive_desc_t fpd = NULL, pd;
	dnnl_status_t st;
	struct dn_entry *e;
	int fresh, rc;

	e = ps__dn_cache_get(b, DN_RELU, (int[]){ (int)(n & 0x7fffffff), (int)(n >> 31) }, 2, &fresh);
	*ep = e;
	if (!fresh)
		return 0;
	ps__dn_md(&md, 1, (dnnl_dim_t[]){ (dnnl_dim_t)n });
	if ((st = dnnl_eltwise_forward_desc_init(&d, dnnl_forward_training,
						 dnnl_eltwise_relu_use_dst_for_bwd, &md, 0.0f, 0.0f)) ||
	    (st = dnnl_primitive_desc_create(&fpd, &d, NULL, b->eng, NULL)) ||
	    (st = dnnl_primitive_desc_clone(&pd, fpd)))
		goto err_st;
	rc = ps__dn_prim_make(b, &e->prim[0], pd, 2, (int[]){ DNNL_ARG_SRC, DNNL_ARG_DST },
			      (int[]){ 0, 1 }, (dnnl_memory_desc_t[]){ md, md }, "relu forward");
	if (rc)
		goto err_rc;
	if ((st = dnnl_eltwise_backward_desc_init(&d, dnnl_eltwise_relu_use_dst_for_bwd, &md, &md,
						  0.0f, 0.0f)) ||
	    (st = dnnl_primitive_desc_create(&pd, &d, NULL, b->eng, fpd)))
		goto err_st;
	rc = ps__dn_prim_make(b, &e->prim[1], pd, 3,
			      (int[]){ DNNL_ARG_DST, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_SRC },
			      (int[]){ 0, 0, 1 }, (dnnl_memory_desc_t[]){ md, md, md }, "relu backward");
	if (rc)
		goto err_rc;
	dnnl_primitive_desc_destroy(fpd);
	if (!(rc = ps__dn_entry_ws(b, e, 1)))
		return 0;
	goto err_rc;

err_st:
	rc = ps__dn_fail(c, st, "relu");
err_rc:
	if (fpd)
		dnnl_primitive_desc_destroy(fpd);
	ps__dn_cache_drop(b, e);
	return rc;
}

static int dn_relu_fwd(struct ps_compute *c, const float *x, float *y, size_t n)
{
	struct dn_entry *e;
	int rc;

	if (!n)
		return 0;
	if ((rc = relu_get(c, n, &e)))
		return rc;
	return ps__dn_prim_run(dn_of(c), &e->prim[0], (void *const[]){ (void *)x, y }, e->own_ws,
			       "relu forward");
}

static int dn_relu_bwd(struct ps_compute *c, const float *y, const float *dy, float *dx, size_t n)
{
	struct dn_entry *e;
	int rc;

	if (!n)
		return 0;
	if ((rc = relu_get(c, n, &e)))
		return rc;
	return ps__dn_prim_run(dn_of(c), &e->prim[1], (void *const[]){ (void *)y, (void *)dy, dx },
			       e->own_ws, "relu backward");
}

const struct ps_compute_ops ps_compute_cpu_ops = {
	.name = "cpu",
	.create = dn_create,
	.destroy = dn_destroy,
	.alloc = ps__ref_alloc,
	.free = ps__ref_free,
	.host_alloc = ps__ref_host_alloc,
	.host_free = ps__ref_free,
	.upload = ps__ref_copy,
	.download = ps__ref_copy,
	.sync = ps__ref_sync,
	.event_create = ps__ref_event_create,
	.event_free = ps__ref_event_free,
	.event_record = ps__ref_event_noop,
	.stream_wait = ps__ref_event_noop,
	.event_wait = ps__ref_event_noop,
	.download_async = ps__ref_download_async,
	.upload_async = ps__ref_upload_async,
	.zero = ps__ref_zero,
	.scale = ps__ref_scale,
	.conv2d_workspace = ps__dn_conv2d_workspace,
	.dense_fwd = dn_dense_fwd,
	.dense_bwd = dn_dense_bwd,
	.conv2d_fwd = ps__dn_conv2d_fwd,
	.conv2d_bwd = ps__dn_conv2d_bwd,
	.maxpool_fwd = ps__ref_maxpool_fwd,
	.maxpool_bwd = ps__ref_maxpool_bwd,
	.relu_fwd = dn_relu_fwd,
	.relu_bwd = dn_relu_bwd,
	.softmax_xent = ps__ref_softmax_xent,
	.embedding_bag_fwd = ps__cpu_embedding_bag_fwd,  /* host loops, as on ref */
	.embedding_bag_bwd = ps__cpu_embedding_bag_bwd,
};
