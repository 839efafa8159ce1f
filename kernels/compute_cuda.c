/* compute_cuda.c - the "cuda" compute backend (docs/architecture.md, Interfaces;
 * docs/gpu.md), built as the plug-in lib/ps-compute-cuda.so: one GPU, a
 * compute stream and a copy stream, cuBLAS for the dense layers, cuDNN for
 * convolutions (conv2d_cudnn.c), our kernels for the rest (cuda_layers.c
 * and the .cu files). This file: lifecycle, memory, copies, events, sync
 * and the ops table the plug-in exports.
 *
 * Every op is queued and returns before it runs. Only sync() and
 * event_wait() wait; a training step waits on the push thread for each
 * gradient's event and nowhere else. Every CUDA, cuBLAS and cuDNN return is
 * checked (cuda_check.h); a fault a kernel meets after its op returned is
 * reported by the next call that checks, unless PS_CUDA_SYNC=1 makes every
 * op wait and name itself. Faults our kernels find in their inputs (a
 * maxpool index) travel in a small flags struct (cuda_flags.h).
 *
 * Math: matrix products in full fp32 unless train.tf32 is "all"; cuDNN
 * convolutions may use TF32 tensor cores unless it is "off" (the default
 * "conv" is PyTorch's). The device is the calling thread's current one
 * (CUDA_VISIBLE_DEVICES picks the GPU per worker). Ops are issued by one
 * thread; event_wait() may be called from any.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "compute_cuda.h"
#include "cuda_check.h"
#include "bias.cuh"
#include "scale.cuh"
#include "softmax_xent.cuh"
#include "ps_err.h"

/* Smallest allocation: a zero-byte request still gets a distinct pointer,
 * as from the cpu backend. cudaMalloc itself aligns to 256 bytes or more. */
#define MIN_ALLOC 256

static const struct ps_compute_ops cuda_ops;  /* below: the table this file fills */

int ps__cuda_errf(struct ps_cuda *cu, int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(cu->base.err, sizeof(cu->base.err), fmt, ap);
	va_end(ap);
	return rc;
}

/* A fault our kernels flagged, as an error (and cleared: reported once). */
static int take_flags(struct ps_cuda *cu, struct ps__cuda_flags *seen)
{
	if (!seen->bad_pool)
		return 0;
	ps__cuda_errf(cu, -EINVAL, "maxpool: index %d (entry %d) outside its window (not from "
		      "maxpool_fwd of this shape?); dx was not written", seen->bad_pool_value,
		      seen->bad_pool_at);
	memset(seen, 0, sizeof(*seen));
	CUDA_CHECK(cu->base.err, cudaMemsetAsync(cu->flags_dev, 0, sizeof(*cu->flags_dev),
						 cu->stream));
	return -EINVAL;
}

/* Waits for both streams and reads the flags; for sync() and PS_CUDA_SYNC. */
static int wait_all(struct ps_cuda *cu)
{
	/* the copy stream first: an older flags copy of a download_async must
	 * not land after (and over) the one made here */
	CUDA_CHECK(cu->base.err, cudaStreamSynchronize(cu->copy));
	CUDA_CHECK(cu->base.err, cudaMemcpyAsync(cu->flags_host, cu->flags_dev,
						 sizeof(*cu->flags_host),
						 cudaMemcpyDeviceToHost, cu->stream));
	CUDA_CHECK(cu->base.err, cudaStreamSynchronize(cu->stream));
	return take_flags(cu, cu->flags_host);
}

int ps__cuda_done(struct ps_cuda *cu, const char *op, int rc)
{
	char first[sizeof(cu->base.err)];

	if (rc || !cu->sync_each)
		return rc;
	rc = wait_all(cu);
	if (rc) {
		snprintf(first, sizeof(first), "%s", cu->base.err);
		ps__cuda_errf(cu, rc, "%s failed (PS_CUDA_SYNC=1 waited after it): %s", op, first);
	}
	return rc;
}

/* ---- lifecycle ---- */

/* Releases whatever create() got as far as making; safe on a partial one.
 * It cannot return an error: the first failure goes to stderr. */
static void release(struct ps_cuda *cu)
{
	char err[sizeof(cu->base.err)] = "";
	int rc = 0;

#define KEEP(x) do { int r_ = (x); if (r_ && !rc) { rc = r_; snprintf(err, sizeof(err), "%s", cu->base.err); } } while (0)
	if (cu->stream)
		KEEP(PS__CUDA_EVAL(cu->base.err, cudaStreamSynchronize(cu->stream)));
	if (cu->copy)
		KEEP(PS__CUDA_EVAL(cu->base.err, cudaStreamSynchronize(cu->copy)));
	KEEP(ps__cuda_conv_free(cu));
	if (cu->dnn)
		KEEP(PS__CUDNN_EVAL(cu->base.err, cudnnDestroy(cu->dnn)));
	if (cu->blas)
		KEEP(PS__CUBLAS_EVAL(cu->base.err, cublasDestroy(cu->blas)));
	if (cu->flags_host)
		KEEP(PS__CUDA_EVAL(cu->base.err, cudaFreeHost(cu->flags_host)));
	if (cu->flags_dev)
		KEEP(PS__CUDA_EVAL(cu->base.err, cudaFree(cu->flags_dev)));
	if (cu->bias_scratch)
		KEEP(PS__CUDA_EVAL(cu->base.err, cudaFree(cu->bias_scratch)));
	if (cu->xent_scratch)
		KEEP(PS__CUDA_EVAL(cu->base.err, cudaFree(cu->xent_scratch)));
	if (cu->fork)
		KEEP(PS__CUDA_EVAL(cu->base.err, cudaEventDestroy(cu->fork)));
	if (cu->copy)
		KEEP(PS__CUDA_EVAL(cu->base.err, cudaStreamDestroy(cu->copy)));
	if (cu->stream)
		KEEP(PS__CUDA_EVAL(cu->base.err, cudaStreamDestroy(cu->stream)));
#undef KEEP
	if (rc)
		fprintf(stderr, "ps-compute-cuda: releasing the backend: %s\n", err);
	(void)cudaGetLastError();  /* leave no error behind for the next user */
	free(cu);
}

/* Runs one tiny kernel and waits: proves the device can run this build's
 * code (an architecture the build has no kernels for fails here, with
 * "no kernel image", instead of at the first training step). */
static int probe(struct ps_cuda *cu)
{
	float *one = cu->bias_scratch;

	CUDA_CHECK(cu->base.err, cudaMemsetAsync(one, 0, sizeof(float), cu->stream));
	CUDA_CHECK(cu->base.err, ps__cuda_scale(cu->stream, one, one, 2.0f, 1));
	CUDA_CHECK(cu->base.err, cudaStreamSynchronize(cu->stream));
	return 0;
}

/* No driver, a driver older than this build's runtime, no device: the one
 * line the worker prints. */
static int check_driver(char *err, size_t errlen)
{
	int drv = 0, ndev = 0;
	cudaError_t e = cudaDriverGetVersion(&drv);

	if (e != cudaSuccess || drv == 0) {
		snprintf(err, errlen, "no NVIDIA driver found (libcuda.so.1 is missing: is this "
			 "a GPU machine?)");
		(void)cudaGetLastError();
		return PS_ENOTSUP;
	}
	if (drv < CUDART_VERSION) {
		snprintf(err, errlen, "the NVIDIA driver supports CUDA %d.%d, this build needs "
			 "%d.%d: install driver R580 or newer", drv / 1000, drv % 1000 / 10,
			 CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
		return PS_ENOTSUP;
	}
	e = cudaGetDeviceCount(&ndev);
	if (e != cudaSuccess || ndev < 1) {
		snprintf(err, errlen, "no usable CUDA GPU: %s",
			 e != cudaSuccess ? cudaGetErrorString(e) : "no device found");
		(void)cudaGetLastError();
		return PS_ENOTSUP;
	}
	return 0;
}

static int cuda_create(struct ps_compute **out, const struct ps_compute_opts *opts, char *err,
		       size_t errlen)
{
	const char *sync_env = getenv("PS_CUDA_SYNC");
	struct ps_cuda *cu;
	cublasMath_t math;
	int rc;

	*out = NULL;
	if ((rc = check_driver(err, errlen)))
		return rc;
	cu = calloc(1, sizeof(*cu));
	if (!cu) {
		snprintf(err, errlen, "out of memory creating the cuda backend");
		return -ENOMEM;
	}
	cu->base.ops = &cuda_ops;
	cu->tf32 = opts ? opts->tf32 : PS_TF32_CONV;
	cu->sync_each = sync_env && strcmp(sync_env, "1") == 0;
	cu->log_plans = getenv("PS_CUDA_PLANS") && strcmp(getenv("PS_CUDA_PLANS"), "1") == 0;
	CUDA_CHECK_GOTO(cu->base.err, cudaGetDevice(&cu->device), rc, err_release);
	CUDA_CHECK_GOTO(cu->base.err, cudaDeviceGetAttribute(&cu->sms,
							     cudaDevAttrMultiProcessorCount,
							     cu->device), rc, err_release);
	CUDA_CHECK_GOTO(cu->base.err, cudaStreamCreateWithFlags(&cu->stream,
								 cudaStreamNonBlocking),
			rc, err_release);
	CUDA_CHECK_GOTO(cu->base.err, cudaStreamCreateWithFlags(&cu->copy, cudaStreamNonBlocking),
			rc, err_release);
	CUDA_CHECK_GOTO(cu->base.err, cudaEventCreateWithFlags(&cu->fork, cudaEventDisableTiming),
			rc, err_release);
	CUBLAS_CHECK_GOTO(cu->base.err, cublasCreate(&cu->blas), rc, err_release);
	CUBLAS_CHECK_GOTO(cu->base.err, cublasSetStream(cu->blas, cu->stream), rc, err_release);
	math = cu->tf32 == PS_TF32_ALL ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH;
	CUBLAS_CHECK_GOTO(cu->base.err, cublasSetMathMode(cu->blas, math), rc, err_release);
	CUDNN_CHECK_GOTO(cu->base.err, cudnnCreate(&cu->dnn), rc, err_release);
	CUDNN_CHECK_GOTO(cu->base.err, cudnnSetStream(cu->dnn, cu->stream), rc, err_release);
	if ((rc = ps__cuda_conv_init(cu)))
		goto err_release;
	CUDA_CHECK_GOTO(cu->base.err, cudaMalloc(&cu->xent_scratch, ps__cuda_xent_scratch_bytes()),
			rc, err_release);
	CUDA_CHECK_GOTO(cu->base.err, cudaMalloc((void **)&cu->bias_scratch,
						 PS__BIAS_SCRATCH_FLOATS * sizeof(float)),
			rc, err_release);
	CUDA_CHECK_GOTO(cu->base.err, cudaMalloc((void **)&cu->flags_dev, sizeof(*cu->flags_dev)),
			rc, err_release);
	CUDA_CHECK_GOTO(cu->base.err, cudaMallocHost((void **)&cu->flags_host,
						     sizeof(*cu->flags_host)),
			rc, err_release);
	memset(cu->flags_host, 0, sizeof(*cu->flags_host));
	CUDA_CHECK_GOTO(cu->base.err, cudaMemsetAsync(cu->flags_dev, 0, sizeof(*cu->flags_dev),
						      cu->stream), rc, err_release);
	if ((rc = probe(cu)))
		goto err_release;
	*out = &cu->base;
	return 0;

err_release:
	if (rc == PS_ENOTSUP)
		snprintf(err, errlen, "no usable CUDA GPU: %s", cu->base.err);
	else
		snprintf(err, errlen, "cuda backend: %s", cu->base.err);
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

	if (PS__CUDA_EVAL(c->err, cudaMalloc(&p, bytes ? bytes : MIN_ALLOC)))
		return NULL;  /* the reason is in err; not sticky (cuda_check.h) */
	return p;
}

/* A failed free cannot be returned here: it is kept and returned by the
 * next sync(), the first one only. */
static void defer(struct ps_cuda *cu, int rc)
{
	if (rc && !cu->deferred) {
		cu->deferred = rc;
		snprintf(cu->deferred_err, sizeof(cu->deferred_err), "%.190s", cu->base.err);
	}
}

static void cuda_free(struct ps_compute *c, void *p)
{
	if (p)
		defer(ps__cuda_of(c), PS__CUDA_EVAL(c->err, cudaFree(p)));
}

static void *cuda_host_alloc(struct ps_compute *c, size_t bytes)
{
	void *p = NULL;

	if (PS__CUDA_EVAL(c->err, cudaMallocHost(&p, bytes ? bytes : MIN_ALLOC)))
		return NULL;
	return p;
}

static void cuda_host_free(struct ps_compute *c, void *p)
{
	if (p)
		defer(ps__cuda_of(c), PS__CUDA_EVAL(c->err, cudaFreeHost(p)));
}

/* ---- copies on the compute stream ---- */

static int cuda_upload(struct ps_compute *c, void *dst, const void *src, size_t bytes)
{
	struct ps_cuda *cu = ps__cuda_of(c);

	if (bytes)
		CUDA_CHECK(c->err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice,
						   cu->stream));
	return ps__cuda_done(cu, "upload", 0);
}

static int cuda_download(struct ps_compute *c, void *dst, const void *src, size_t bytes)
{
	struct ps_cuda *cu = ps__cuda_of(c);

	if (bytes)
		CUDA_CHECK(c->err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost,
						   cu->stream));
	return ps__cuda_done(cu, "download", 0);
}

static int cuda_sync(struct ps_compute *c)
{
	struct ps_cuda *cu = ps__cuda_of(c);
	int rc;

	c->host_syncs++;
	if ((rc = wait_all(cu)))
		return rc;
	if (cu->deferred) {
		rc = cu->deferred;
		ps__cuda_errf(cu, rc, "an earlier free failed: %s", cu->deferred_err);
		cu->deferred = 0;
	}
	return rc;
}

static int cuda_zero(struct ps_compute *c, float *x, size_t n)
{
	struct ps_cuda *cu = ps__cuda_of(c);

	if (n)
		CUDA_CHECK(c->err, cudaMemsetAsync(x, 0, n * sizeof(float), cu->stream));
	return ps__cuda_done(cu, "zero", 0);
}

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
	return ps__cuda_done(cu, "scale", 0);
}

/* ---- events and the copy stream ---- */

static int cuda_event_create(struct ps_compute *c, struct ps_compute_event **out)
{
	struct ps_compute_event *ev = calloc(1, sizeof(*ev));
	int rc;

	*out = NULL;
	if (!ev)
		return ps__cuda_errf(ps__cuda_of(c), -ENOMEM, "out of memory creating an event");
	/* Blocking: a waiting push thread sleeps instead of spinning on a core
	 * the training thread needs. */
	rc = PS__CUDA_EVAL(c->err, cudaEventCreateWithFlags(&ev->ev, cudaEventDisableTiming |
							    cudaEventBlockingSync));
	if (rc) {
		free(ev);
		return rc;
	}
	*out = ev;
	return 0;
}

static void cuda_event_free(struct ps_compute *c, struct ps_compute_event *ev)
{
	if (!ev)
		return;
	defer(ps__cuda_of(c), PS__CUDA_EVAL(c->err, cudaEventDestroy(ev->ev)));
	free(ev);
}

static int cuda_event_record(struct ps_compute *c, struct ps_compute_event *ev)
{
	struct ps_cuda *cu = ps__cuda_of(c);

	CUDA_CHECK(c->err, cudaEventRecord(ev->ev, cu->stream));
	return ps__cuda_done(cu, "event_record", 0);
}

static int cuda_stream_wait(struct ps_compute *c, struct ps_compute_event *ev)
{
	struct ps_cuda *cu = ps__cuda_of(c);

	CUDA_CHECK(c->err, cudaStreamWaitEvent(cu->stream, ev->ev, 0));
	return ps__cuda_done(cu, "stream_wait", 0);
}

/* Any thread. The flags copied behind the event's data say whether a
 * kernel before it found a bad input. */
static int cuda_event_wait(struct ps_compute *c, struct ps_compute_event *ev)
{
	struct ps_cuda *cu = ps__cuda_of(c);
	struct ps__cuda_flags seen;

	CUDA_CHECK(c->err, cudaEventSynchronize(ev->ev));
	seen = *(volatile struct ps__cuda_flags *)cu->flags_host;
	if (seen.bad_pool)
		return ps__cuda_errf(cu, -EINVAL, "maxpool: index %d (entry %d) outside its "
				     "window (not from maxpool_fwd of this shape?); dx was not "
				     "written", seen.bad_pool_value, seen.bad_pool_at);
	return 0;
}

static int cuda_download_async(struct ps_compute *c, void *dst, const void *src, size_t bytes,
			       struct ps_compute_event *ev)
{
	struct ps_cuda *cu = ps__cuda_of(c);

	CUDA_CHECK(c->err, cudaEventRecord(cu->fork, cu->stream));
	CUDA_CHECK(c->err, cudaStreamWaitEvent(cu->copy, cu->fork, 0));
	if (bytes)
		CUDA_CHECK(c->err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost,
						   cu->copy));
	CUDA_CHECK(c->err, cudaMemcpyAsync(cu->flags_host, cu->flags_dev, sizeof(*cu->flags_host),
					   cudaMemcpyDeviceToHost, cu->copy));
	CUDA_CHECK(c->err, cudaEventRecord(ev->ev, cu->copy));
	return ps__cuda_done(cu, "download_async", 0);
}

static int cuda_upload_async(struct ps_compute *c, void *dst, const void *src, size_t bytes,
			     struct ps_compute_event *after, struct ps_compute_event *ev)
{
	struct ps_cuda *cu = ps__cuda_of(c);

	if (after)
		CUDA_CHECK(c->err, cudaStreamWaitEvent(cu->copy, after->ev, 0));
	if (bytes)
		CUDA_CHECK(c->err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice,
						   cu->copy));
	CUDA_CHECK(c->err, cudaEventRecord(ev->ev, cu->copy));
	return ps__cuda_done(cu, "upload_async", 0);
}

static const struct ps_compute_ops cuda_ops = {
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
	.event_create = cuda_event_create,
	.event_free = cuda_event_free,
	.event_record = cuda_event_record,
	.stream_wait = cuda_stream_wait,
	.event_wait = cuda_event_wait,
	.download_async = cuda_download_async,
	.upload_async = cuda_upload_async,
	.zero = cuda_zero,
	.scale = cuda_scale,
	.conv2d_workspace = ps__cuda_conv2d_workspace,
	.dense_fwd = ps__cuda_dense_fwd,
	.dense_bwd = ps__cuda_dense_bwd,
	.conv2d_fwd = ps__cuda_conv2d_fwd,
	.conv2d_bwd = ps__cuda_conv2d_bwd,
	.maxpool_fwd = ps__cuda_maxpool_fwd_op,
	.maxpool_bwd = ps__cuda_maxpool_bwd_op,
	.relu_fwd = ps__cuda_relu_fwd_op,
	.relu_bwd = ps__cuda_relu_bwd_op,
	.softmax_xent = ps__cuda_softmax_xent_op,
	.embedding_bag_fwd = ps__cuda_bag_fwd_op,
	.embedding_bag_bwd = ps__cuda_bag_bwd_op,
};

/* What common/compute.c's loader looks up with dlsym. */
__attribute__((visibility("default"))) const struct ps_compute_plugin ps_compute_plugin = {
	.abi = PS_COMPUTE_ABI,
	.ops = &cuda_ops,
};
