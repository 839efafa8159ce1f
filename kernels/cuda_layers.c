/* cuda_layers.c - the cuda backend's ops other than convolutions: dense
 * layers through cuBLAS, max pooling, relu, embedding bags and the loss
 * through our kernels.
 * Shape checks and their messages are the cpu backend's, so a bad call
 * reads the same on both.
 *
 * cuBLAS is column-major; a row-major [r, c] matrix is the column-major
 * [c, r] matrix with leading dimension c, i.e. its transpose. So each
 * row-major product is computed as its transpose:
 *   y  = x W        ->  y^T  = W^T x^T          (out x n)  = (out x in)(in x n)
 *   dW = alpha x^T dy -> dW^T = alpha dy^T x    (out x in) = (out x n)(n x in)
 *   dx = dy W^T     ->  dx^T = W dy^T           (in x n)   = (in x out)(out x n)
 * alpha (the step's 1/batch and 1/workers) rides in the GEMM and in the
 * bias-gradient kernel: no pass of its own over the gradients.
 */
#include <stdio.h>
#include "compute_cuda.h"
#include "cuda_check.h"
#include "bias.cuh"
#include "embedding_bag.cuh"
#include "maxpool.cuh"
#include "relu.cuh"
#include "softmax_xent.cuh"
#include "ps_err.h"

/* ---- dense ---- */

static int dense_check(struct ps_cuda *cu, int n, int in, int out)
{
	if (n < 1 || in < 1 || out < 1)
		return ps__cuda_errf(cu, -EINVAL, "dense: bad shape n=%d in=%d out=%d", n, in, out);
	return 0;
}

int ps__cuda_dense_fwd(struct ps_compute *c, const float *x, const float *W, const float *b,
		       float *y, int n, int in, int out)
{
	struct ps_cuda *cu = ps__cuda_of(c);
	const float one = 1.0f, zero = 0.0f;
	int rc = dense_check(cu, n, in, out);

	if (rc)
		return rc;
	CUBLAS_CHECK(c->err, cublasSgemm(cu->blas, CUBLAS_OP_N, CUBLAS_OP_N, out, n, in, &one,
					 W, out, x, in, &zero, y, out));
	CUDA_CHECK(c->err, ps__cuda_bias_add(cu->stream, y, b, (size_t)n, out, 1));
	return ps__cuda_done(cu, "dense_fwd", 0);
}

int ps__cuda_dense_bwd(struct ps_compute *c, const float *x, const float *W, const float *dy,
		       float *dx, float *dW, float *db, int n, int in, int out, float alpha)
{
	struct ps_cuda *cu = ps__cuda_of(c);
	const float one = 1.0f, zero = 0.0f;
	int rc = dense_check(cu, n, in, out);

	if (rc)
		return rc;
	CUBLAS_CHECK(c->err, cublasSgemm(cu->blas, CUBLAS_OP_N, CUBLAS_OP_T, out, in, n, &alpha,
					 dy, out, x, in, &zero, dW, out));
	CUDA_CHECK(c->err, ps__cuda_bias_grad(cu->stream, db, dy, (size_t)n, out, 1, alpha,
					      cu->bias_scratch, cu->sms));
	if (dx)
		CUBLAS_CHECK(c->err, cublasSgemm(cu->blas, CUBLAS_OP_T, CUBLAS_OP_N, in, n, out,
						 &one, W, out, dy, out, &zero, dx, in));
	return ps__cuda_done(cu, "dense_bwd", 0);
}

/* ---- max pooling ---- */

static int pool_check(struct ps_cuda *cu, const struct ps_pool_shape *s)
{
	if (s->n < 1 || s->c < 1 || s->size < 1 || s->h < s->size || s->w < s->size)
		return ps__cuda_errf(cu, -EINVAL, "maxpool: bad shape n=%d c=%d h=%d w=%d size=%d",
				     s->n, s->c, s->h, s->w, s->size);
	if (s->oh != s->h / s->size || s->ow != s->w / s->size)
		return ps__cuda_errf(cu, -EINVAL, "maxpool: output %dx%d given, shape gives %dx%d",
				     s->oh, s->ow, s->h / s->size, s->w / s->size);
	return 0;
}

int ps__cuda_maxpool_fwd_op(struct ps_compute *c, const struct ps_pool_shape *s, const float *x,
			 float *y, int32_t *idx)
{
	struct ps_cuda *cu = ps__cuda_of(c);
	int rc = pool_check(cu, s);

	if (rc)
		return rc;
	CUDA_CHECK(c->err, ps__cuda_maxpool_fwd(cu->stream, x, y, idx, (size_t)s->n * s->c, s->h,
						s->w, s->size, s->oh, s->ow));
	return ps__cuda_done(cu, "maxpool_fwd", 0);
}

/* An index outside its window is refused as on the cpu, but on the
 * device: flagged there, reported by the next sync() or event_wait(). */
int ps__cuda_maxpool_bwd_op(struct ps_compute *c, const struct ps_pool_shape *s, const float *dy,
			 const int32_t *idx, float *dx)
{
	struct ps_cuda *cu = ps__cuda_of(c);
	int rc = pool_check(cu, s);

	if (rc)
		return rc;
	CUDA_CHECK(c->err, ps__cuda_maxpool_bwd(cu->stream, dy, idx, dx, (size_t)s->n * s->c,
						s->h, s->w, s->size, s->oh, s->ow, cu->flags_dev));
	return ps__cuda_done(cu, "maxpool_bwd", 0);
}

/* ---- relu ---- */

int ps__cuda_relu_fwd_op(struct ps_compute *c, const float *x, float *y, size_t n)
{
	struct ps_cuda *cu = ps__cuda_of(c);

	CUDA_CHECK(c->err, ps__cuda_relu_fwd(cu->stream, x, y, n));
	return ps__cuda_done(cu, "relu_fwd", 0);
}

int ps__cuda_relu_bwd_op(struct ps_compute *c, const float *y, const float *dy, float *dx,
			 size_t n)
{
	struct ps_cuda *cu = ps__cuda_of(c);

	CUDA_CHECK(c->err, ps__cuda_relu_bwd(cu->stream, y, dy, dx, n));
	return ps__cuda_done(cu, "relu_bwd", 0);
}

/* ---- embedding bags ---- */

int ps__cuda_bag_fwd_op(struct ps_compute *c, const struct ps_bag_shape *s, const float *rows,
			const int32_t *offsets, const int32_t *idx, float *y)
{
	struct ps_cuda *cu = ps__cuda_of(c);
	int rc = ps__bag_shape_check(s, c->err, sizeof(c->err));

	if (rc)
		return rc;
	CUDA_CHECK(c->err, ps__cuda_bag_fwd(cu->stream, s->nbags, s->fields, s->dim, s->ldy,
					    s->nrows, s->mode == PS_BAG_MEAN, rows, offsets, idx, y));
	return ps__cuda_done(cu, "embedding_bag_fwd", 0);
}

int ps__cuda_bag_bwd_op(struct ps_compute *c, const struct ps_bag_shape *s, const float *dy,
			const int32_t *offsets, const int32_t *row_offsets,
			const int32_t *row_bags, float *drows, float alpha)
{
	struct ps_cuda *cu = ps__cuda_of(c);
	int rc = ps__bag_shape_check(s, c->err, sizeof(c->err));

	if (rc)
		return rc;
	CUDA_CHECK(c->err, ps__cuda_bag_bwd(cu->stream, s->nbags, s->fields, s->dim, s->ldy,
					    s->nrows, s->mode == PS_BAG_MEAN, dy, offsets,
					    row_offsets, row_bags, drows, alpha));
	return ps__cuda_done(cu, "embedding_bag_bwd", 0);
}

/* ---- loss ---- */

/* Queued, result copied to st on the stream: no wait here (compute.h). */
int ps__cuda_softmax_xent_op(struct ps_compute *c, const float *logits, const int32_t *labels,
			     int n, int classes, float *dlogits, struct ps_xent_stats *st)
{
	struct ps_cuda *cu = ps__cuda_of(c);

	if (n < 1 || classes < 1)
		return ps__cuda_errf(cu, -EINVAL, "softmax_xent: bad shape n=%d classes=%d", n,
				     classes);
	CUDA_CHECK(c->err, ps__cuda_softmax_xent(cu->stream, logits, labels, n, classes, dlogits,
						 cu->xent_scratch, st));
	return ps__cuda_done(cu, "softmax_xent", 0);
}
