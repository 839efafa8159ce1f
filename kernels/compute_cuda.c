/* compute_cuda.c - the "cuda" compute backend (docs/architecture.md, Interfaces): one GPU, one
 * stream, cuBLAS for the dense layers, cuDNN for convolutions
 * (conv2d_cudnn.c), our kernels for the rest (the .cu files here).
 *
 * Every op is queued on the backend's stream and returns before it runs;
 * sync() waits. Only softmax_xent waits by itself, to hand back the loss.
 * Results are fp32 throughout: TF32 tensor-core math is kept off in cuBLAS
 * (default math mode) and cuDNN (FMA math), so the backend stays within the
 * cpu reference's tolerances. Shape checks and their messages are the cpu
 * backend's, so a bad call reads the same on both.
 *
 * The device is the calling thread's current one (0 unless the process
 * chose; CUDA_VISIBLE_DEVICES picks the GPU per worker). A backend is used
 * by one thread at a time (it keeps cuDNN descriptors and plans). A kernel
 * failing asynchronously shows up in a later op's or sync()'s error.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "compute_cuda.h"
#include "cuda_check.h"
#include "bias.cuh"
#include "maxpool.cuh"
#include "relu.cuh"
#include "scale.cuh"
#include "softmax_xent.cuh"
#include "ps_err.h"

/* Smallest allocation: a zero-byte request still gets a distinct pointer,
 * as from the cpu backend. cudaMalloc itself aligns to 256 bytes or more. */
#define MIN_ALLOC 256

int ps__cuda_errf(struct ps_cuda *cu, int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(cu->base.err, sizeof(cu->base.err), fmt, ap);
	va_end(ap);
	return rc;
}

/* ---- lifecycle ---- */

/* Releases whatever create() got as far as making; safe on a partial one. */
static void release(struct ps_cuda *cu)
{
	if (cu->stream)
		cudaStreamSynchronize(cu->stream);
	ps__cuda_conv_free(cu);
	if (cu->dnn)
		cudnnDestroy(cu->dnn);
	if (cu->blas)
		cublasDestroy(cu->blas);
	if (cu->xent_host)
		cudaFreeHost(cu->xent_host);
	if (cu->xent_scratch)
		cudaFree(cu->xent_scratch);
	if (cu->stream)
		cudaStreamDestroy(cu->stream);
	(void)cudaGetLastError();  /* leave no error behind for the next user */
	free(cu);
}

/* Runs one tiny kernel and waits: proves the device can run this build's
 * code (an architecture the build has no kernels for fails here, with
 * "no kernel image", instead of at the first training step). */
static int probe(struct ps_cuda *cu)
{
	float *one = cu->xent_scratch;

	CUDA_CHECK(cu->base.err, cudaMemsetAsync(one, 0, sizeof(float), cu->stream));
	CUDA_CHECK(cu->base.err, ps__cuda_scale(cu->stream, one, one, 2.0f, 1));
	CUDA_CHECK(cu->base.err, cudaStreamSynchronize(cu->stream));
	return 0;
}

static int cuda_create(struct ps_compute **out, char *err, size_t errlen)
{
	struct ps_cuda *cu;
	size_t scratch;
	int ndev = 0, rc;
	cudaError_t e;

	*out = NULL;
	/* No driver, no device, a driver older than the runtime: all say here. */
	e = cudaGetDeviceCount(&ndev);
	if (e != cudaSuccess || ndev < 1) {
		if (err && errlen)
			snprintf(err, errlen, "no usable CUDA GPU: %s",
				 e != cudaSuccess ? cudaGetErrorString(e) : "no device found");
		(void)cudaGetLastError();
		return PS_ENOTSUP;
	}
	cu = calloc(1, sizeof(*cu));
	if (!cu) {
		if (err && errlen)
			snprintf(err, errlen, "out of memory creating the cuda backend");
		return -ENOMEM;
	}
	cu->base.ops = &ps_compute_cuda_ops;
	CUDA_CHECK_GOTO(cu->base.err, cudaGetDevice(&cu->device), rc, err_release);
	CUDA_CHECK_GOTO(cu->base.err, cudaStreamCreateWithFlags(&cu->stream,
								 cudaStreamNonBlocking),
			rc, err_release);
	CUBLAS_CHECK_GOTO(cu->base.err, cublasCreate(&cu->blas), rc, err_release);
	CUBLAS_CHECK_GOTO(cu->base.err, cublasSetStream(cu->blas, cu->stream), rc, err_release);
	CUBLAS_CHECK_GOTO(cu->base.err, cublasSetMathMode(cu->blas, CUBLAS_DEFAULT_MATH), rc,
			  err_release);
	CUDNN_CHECK_GOTO(cu->base.err, cudnnCreate(&cu->dnn), rc, err_release);
	CUDNN_CHECK_GOTO(cu->base.err, cudnnSetStream(cu->dnn, cu->stream), rc, err_release);
	if ((rc = ps__cuda_conv_init(cu)))
		goto err_release;
	/* Partials, then the result at a 256-byte boundary after them. */
	scratch = (ps__cuda_xent_scratch_bytes() + 255) / 256 * 256;
	CUDA_CHECK_GOTO(cu->base.err,
			cudaMalloc(&cu->xent_scratch, scratch + sizeof(struct ps__xent_result)),
			rc, err_release);
	cu->xent_dev = (struct ps__xent_result *)((char *)cu->xent_scratch + scratch);
	CUDA_CHECK_GOTO(cu->base.err, cudaMallocHost((void **)&cu->xent_host,
						     sizeof(*cu->xent_host)),
			rc, err_release);
	if ((rc = probe(cu)))
		goto err_release;
	*out = &cu->base;
	return 0;

err_release:
	if (err && errlen) {
		if (rc == PS_ENOTSUP)
			snprintf(err, errlen, "no usable CUDA GPU: %s", cu->base.err);
		else
			snprintf(err, errlen, "cuda backend: %s", cu->base.err);
	}
	release(cu);
	return rc;
}

static void cuda_destroy(struct ps_compute *c)
{
	if (c)
		release(ps__cuda_of(c));
}

/* ---- memory ---- */

static float *cuda_alloc(struct ps_compute *c, size_t bytes)
{
	void *p = NULL;
	cudaError_t e = cudaMalloc(&p, bytes ? bytes : MIN_ALLOC);

	if (e != cudaSuccess) {
		ps__cuda_errf(ps__cuda_of(c), ps__cuda_code(e), "cudaMalloc of %zu bytes: %s", bytes,
		     cudaGetErrorString(e));
		(void)cudaGetLastError();  /* not sticky: keep it from later launches */
		return NULL;
	}
	return p;
}

static void cuda_free(struct ps_compute *c, void *p)
{
	(void)c;
	if (p)
		cudaFree(p);
}

static void *cuda_host_alloc(struct ps_compute *c, size_t bytes)
{
	void *p = NULL;
	cudaError_t e = cudaMallocHost(&p, bytes ? bytes : MIN_ALLOC);

	if (e != cudaSuccess) {
		ps__cuda_errf(ps__cuda_of(c), ps__cuda_code(e), "cudaMallocHost of %zu bytes: %s", bytes,
		     cudaGetErrorString(e));
		(void)cudaGetLastError();
		return NULL;
	}
	return p;
}

static void cuda_host_free(struct ps_compute *c, void *p)
{
	(void)c;
	if (p)
		cudaFreeHost(p);
}

static int cuda_upload(struct ps_compute *c, void *dst, const void *src, size_t bytes)
{
	if (bytes)
		CUDA_CHECK(c->err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice,
						   ps__cuda_of(c)->stream));
	return 0;
}

static int cuda_download(struct ps_compute *c, void *dst, const void *src, size_t bytes)
{
	if (bytes)
		CUDA_CHECK(c->err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost,
						   ps__cuda_of(c)->stream));
	return 0;
}

static int cuda_sync(struct ps_compute *c)
{
	CUDA_CHECK(c->err, cudaStreamSynchronize(ps__cuda_of(c)->stream));
	return 0;
}

static int cuda_zero(struct ps_compute *c, float *x, size_t n)
{
	if (n)
		CUDA_CHECK(c->err, cudaMemsetAsync(x, 0, n * sizeof(float),
						   ps__cuda_of(c)->stream));
	return 0;
}

/* a == 1 is a copy (the worker's flatten layer): a memcpy, or nothing. */
static int cuda_scale(struct ps_compute *c, float *y, const float *x, float a, size_t n)
{
	struct ps_cuda *cu = ps__cuda_of(c);

	if (n == 0 || (a == 1.0f && y == x))
		return 0;
	if (a == 1.0f)
		CUDA_CHECK(c->err, cudaMemcpyAsync(y, x, n * sizeof(float),
						   cudaMemcpyDeviceToDevice, cu->stream));
	else
		CUDA_CHECK(c->err, ps__cuda_scale(cu->stream, y, x, a, n));
	return 0;
}

/* ---- dense ----
 *
 * cuBLAS is column-major; a row-major [r, c] matrix is the column-major
 * [c, r] matrix with leading dimension c, i.e. its transpose. So each
 * row-major product is computed as its transpose:
 *   y  = x W      ->  y^T  = W^T x^T      (out x n)  = (out x in)(in x n)
 *   dW = x^T dy   ->  dW^T = dy^T x       (out x in) = (out x n)(n x in)
 *   dx = dy W^T   ->  dx^T = W dy^T       (in x n)   = (in x out)(out x n)
 */

static int dense_check(struct ps_cuda *cu, int n, int in, int out)
{
	if (n < 1 || in < 1 || out < 1)
		return ps__cuda_errf(cu, -EINVAL, "dense: bad shape n=%d in=%d out=%d", n, in, out);
	return 0;
}

static int cuda_dense_fwd(struct ps_compute *c, const float *x, const float *W, const float *b,
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
	return 0;
}

static int cuda_dense_bwd(struct ps_compute *c, const float *x, const float *W, const float *dy,
			  float *dx, float *dW, float *db, int n, int in, int out)
{
	struct ps_cuda *cu = ps__cuda_of(c);
	const float one = 1.0f, zero = 0.0f;
	int rc = dense_check(cu, n, in, out);

	if (rc)
		return rc;
	CUBLAS_CHECK(c->err, cublasSgemm(cu->blas, CUBLAS_OP_N, CUBLAS_OP_T, out, in, n, &one,
					 dy, out, x, in, &zero, dW, out));
	CUDA_CHECK(c->err, ps__cuda_bias_grad(cu->stream, db, dy, (size_t)n, out, 1));
	if (dx)
		CUBLAS_CHECK(c->err, cublasSgemm(cu->blas, CUBLAS_OP_T, CUBLAS_OP_N, in, n, out,
						 &one, W, out, dy, out, &zero, dx, in));
	return 0;
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

static int cuda_maxpool_fwd(struct ps_compute *c, const struct ps_pool_shape *s, const float *x,
			    float *y, int32_t *idx)
{
	struct ps_cuda *cu = ps__cuda_of(c);
	int rc = pool_check(cu, s);

	if (rc)
		return rc;
	CUDA_CHECK(c->err, ps__cuda_maxpool_fwd(cu->stream, x, y, idx, (size_t)s->n * s->c, s->h,
						s->w, s->size, s->oh, s->ow));
	return 0;
}

/* Unlike the cpu backend, an idx outside the plane is skipped, not
 * reported: the check would need a round trip to the host. */
static int cuda_maxpool_bwd(struct ps_compute *c, const struct ps_pool_shape *s, const float *dy,
			    const int32_t *idx, float *dx)
{
	struct ps_cuda *cu = ps__cuda_of(c);
	int rc = pool_check(cu, s);

	if (rc)
		return rc;
	CUDA_CHECK(c->err, ps__cuda_maxpool_bwd(cu->stream, dy, idx, dx, (size_t)s->n * s->c,
						s->h, s->w, s->oh, s->ow));
	return 0;
}

/* ---- relu ---- */

static int cuda_relu_fwd(struct ps_compute *c, const float *x, float *y, size_t n)
{
	CUDA_CHECK(c->err, ps__cuda_relu_fwd(ps__cuda_of(c)->stream, x, y, n));
	return 0;
}

static int cuda_relu_bwd(struct ps_compute *c, const float *y, const float *dy, float *dx,
			 size_t n)
{
	CUDA_CHECK(c->err, ps__cuda_relu_bwd(ps__cuda_of(c)->stream, y, dy, dx, n));
	return 0;
}

/* ---- loss ---- */

/* Queues the kernels and the copy of their result, then waits for it. A bad
 * label is found on the device; unlike the cpu backend, dlogits of the other
 * examples have been written by then. */
static int cuda_softmax_xent(struct ps_compute *c, const float *logits, const int32_t *labels,
			     int n, int classes, float *dlogits, float *loss, int *correct)
{
	struct ps_cuda *cu = ps__cuda_of(c);
	const struct ps__xent_result *r = cu->xent_host;

	if (n < 1 || classes < 1)
		return ps__cuda_errf(cu, -EINVAL, "softmax_xent: bad shape n=%d classes=%d", n, classes);
	CUDA_CHECK(c->err, ps__cuda_softmax_xent(cu->stream, logits, labels, n, classes, dlogits,
						 cu->xent_scratch, cu->xent_dev));
	CUDA_CHECK(c->err, cudaMemcpyAsync(cu->xent_host, cu->xent_dev, sizeof(*cu->xent_host),
					   cudaMemcpyDeviceToHost, cu->stream));
	CUDA_CHECK(c->err, cudaStreamSynchronize(cu->stream));
	if (r->bad_row >= 0)
		return ps__cuda_errf(cu, -EINVAL, "softmax_xent: label %d of example %d is outside [0, %d)",
			    r->bad_label, r->bad_row, classes);
	*loss = (float)(r->loss_sum / n);
	*correct = r->correct;
	if (!isfinite(r->loss_sum))
		return ps__cuda_errf(cu, PS_ENOFINITE, "softmax_xent: loss is not finite (NaN or "
			    "infinite logits)");
	return 0;
}

const struct ps_compute_ops ps_compute_cuda_ops = {
	.name = "cuda",
	.create = cuda_create,
	.destroy = cuda_destroy,
	.alloc = cuda_alloc,
	.free = cuda_free,
	.host_alloc = cuda_host_alloc,
	.host_free = cuda_host_free,
	.upload = cuda_upload,
	.download = cuda_download,
	.sync = cuda_sync,
	.zero = cuda_zero,
	.scale = cuda_scale,
	.conv2d_workspace = ps__cuda_conv2d_workspace,
	.dense_fwd = cuda_dense_fwd,
	.dense_bwd = cuda_dense_bwd,
	.conv2d_fwd = ps__cuda_conv2d_fwd,
	.conv2d_bwd = ps__cuda_conv2d_bwd,
	.maxpool_fwd = cuda_maxpool_fwd,
	.maxpool_bwd = cuda_maxpool_bwd,
	.relu_fwd = cuda_relu_fwd,
	.relu_bwd = cuda_relu_bwd,
	.softmax_xent = cuda_softmax_xent,
};
