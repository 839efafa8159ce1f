/* conv2d_cudnn.c - the cuda backend's convolutions, through cuDNN's
 * convolution API (cudnnConvolutionForward / BackwardData / BackwardFilter;
 * still in cuDNN 9, where it is marked legacy next to the graph API).
 *
 * Algorithm choice: cudnnGetConvolution*Algorithm_v7, cuDNN's heuristic
 * ranking (no trial runs, so no timing noise and no memory allocated behind
 * the caller's back), walked in rank order for the first algorithm that
 *   - reports success for the shape,
 *   - uses the math allowed: FMA (fp32 throughout) when train.tf32 is off,
 *     else FMA or cuDNN's default math, which may run on TF32 tensor cores,
 *   - with train.tf32 off, does not work in a transformed domain (FFT,
 *     Winograd): their error is TF32's, not fp32's (see acceptable()),
 *   - is deterministic: bit-identical sync runs depend on it, so a
 *     non-deterministic algorithm (backward ALGO_0 among them) is never
 *     taken, whatever its speed,
 *   - fits the workspace limit.
 * If none does, the deterministic fallbacks (implicit GEMM, backward
 * ALGO_1) are checked against the limit too; if they do not fit either,
 * the op fails saying how much workspace it needed. Every cuDNN error is
 * returned: a failed workspace query is never read as 0 bytes.
 * conv2d_workspace() plans with PS__CONV_WS_CAP as the limit and returns
 * the largest of the three workspaces; the ops plan with the workspace they
 * are actually given, so a smaller batch or a smaller buffer still works.
 * Plans are remembered per (shape, limit), the oldest replaced first.
 *
 * Bias add and bias gradient are our kernels (bias.cu); the gradient's
 * alpha rides in cuDNN's alpha for dW and in the bias kernel.
 */
#include <stdio.h>
#include <string.h>
#include "compute_cuda.h"
#include "cuda_check.h"
#include "bias.cuh"
#include "ps_err.h"

int ps__cuda_conv_init(struct ps_cuda *cu)
{
	CUDNN_CHECK(cu->base.err, cudnnCreateTensorDescriptor(&cu->x_desc));
	CUDNN_CHECK(cu->base.err, cudnnCreateTensorDescriptor(&cu->y_desc));
	CUDNN_CHECK(cu->base.err, cudnnCreateFilterDescriptor(&cu->w_desc));
	CUDNN_CHECK(cu->base.err, cudnnCreateConvolutionDescriptor(&cu->conv_desc));
	return 0;
}

/* Safe on a partly initialized backend: only what exists is destroyed.
 * Returns the first failure (each is still attempted). */
int ps__cuda_conv_free(struct ps_cuda *cu)
{
	int rc = 0, r;

	if (cu->conv_desc && (r = PS__CUDNN_EVAL(cu->base.err,
						 cudnnDestroyConvolutionDescriptor(cu->conv_desc))))
		rc = rc ? rc : r;
	if (cu->w_desc && (r = PS__CUDNN_EVAL(cu->base.err, cudnnDestroyFilterDescriptor(cu->w_desc))))
		rc = rc ? rc : r;
	if (cu->y_desc && (r = PS__CUDNN_EVAL(cu->base.err, cudnnDestroyTensorDescriptor(cu->y_desc))))
		rc = rc ? rc : r;
	if (cu->x_desc && (r = PS__CUDNN_EVAL(cu->base.err, cudnnDestroyTensorDescriptor(cu->x_desc))))
		rc = rc ? rc : r;
	cu->conv_desc = NULL;
	cu->w_desc = NULL;
	cu->x_desc = cu->y_desc = NULL;
	return rc;
}

/* Same checks and messages as the cpu backend: a usable shape whose oh, ow
 * come from ps_conv_out(). */
static int conv_check(struct ps_cuda *cu, const struct ps_conv_shape *s)
{
	if (s->n < 1 || s->c < 1 || s->h < 1 || s->w < 1 || s->k < 1 || s->kh < 1 ||
	    s->kw < 1 || s->pad < 0 || s->stride < 1)
		return ps__cuda_errf(cu, -EINVAL, "conv2d: bad shape n=%d c=%d h=%d w=%d k=%d kernel=%dx%d "
			    "pad=%d stride=%d", s->n, s->c, s->h, s->w, s->k, s->kh, s->kw,
			    s->pad, s->stride);
	struct ps_conv_shape t = *s;
	ps_conv_out(&t);
	if (t.oh < 1 || t.ow < 1 || s->h + 2 * s->pad < s->kh || s->w + 2 * s->pad < s->kw)
		return ps__cuda_errf(cu, -EINVAL, "conv2d: kernel %dx%d larger than padded input %dx%d",
			    s->kh, s->kw, s->h + 2 * s->pad, s->w + 2 * s->pad);
	if (t.oh != s->oh || t.ow != s->ow)
		return ps__cuda_errf(cu, -EINVAL, "conv2d: output %dx%d given, shape gives %dx%d "
			    "(call ps_conv_out)", s->oh, s->ow, t.oh, t.ow);
	return 0;
}

/* The math the heuristics may choose from (each entry then runs with its own). */
static cudnnMathType_t base_math(const struct ps_cuda *cu)
{
	return cu->tf32 == PS_TF32_OFF ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH;
}

/* Points the four descriptors at shape s (NCHW fp32, cross-correlation). */
static int set_descs(struct ps_cuda *cu, const struct ps_conv_shape *s)
{
	CUDNN_CHECK(cu->base.err, cudnnSetTensor4dDescriptor(cu->x_desc, CUDNN_TENSOR_NCHW,
							     CUDNN_DATA_FLOAT, s->n, s->c, s->h,
							     s->w));
	CUDNN_CHECK(cu->base.err, cudnnSetFilter4dDescriptor(cu->w_desc, CUDNN_DATA_FLOAT,
							     CUDNN_TENSOR_NCHW, s->k, s->c, s->kh,
							     s->kw));
	CUDNN_CHECK(cu->base.err, cudnnSetConvolution2dDescriptor(cu->conv_desc, s->pad, s->pad,
								  s->stride, s->stride, 1, 1,
								  CUDNN_CROSS_CORRELATION,
								  CUDNN_DATA_FLOAT));
	/* The math the heuristics may pick from; each op then sets its plan's. */
	CUDNN_CHECK(cu->base.err, cudnnSetConvolutionMathType(cu->conv_desc, base_math(cu)));
	CUDNN_CHECK(cu->base.err, cudnnSetTensor4dDescriptor(cu->y_desc, CUDNN_TENSOR_NCHW,
							     CUDNN_DATA_FLOAT, s->n, s->k, s->oh,
							     s->ow));
	return 0;
}

/* Whether a heuristic entry may be taken. transform: the algorithm works
 * in a transformed domain (FFT, Winograd). Those run on FMA math but were
 * measured on an H100 at 7.5e-4 normalized error in dW for the cnn's first
 * layer (reductions over 50,000 products): TF32's accuracy, not fp32's, so
 * with train.tf32 off they are not taken. */
static int acceptable(struct ps_cuda *cu, cudnnStatus_t st, cudnnMathType_t math,
		      cudnnDeterminism_t det, int transform)
{
	int math_ok = math == CUDNN_FMA_MATH ||
		      (cu->tf32 != PS_TF32_OFF && math == CUDNN_DEFAULT_MATH);

	if (transform && cu->tf32 == PS_TF32_OFF)
		return 0;
	return st == CUDNN_STATUS_SUCCESS && math_ok && det == CUDNN_DETERMINISTIC;
}

static int fwd_transform(cudnnConvolutionFwdAlgo_t a)
{
	return a == CUDNN_CONVOLUTION_FWD_ALGO_FFT || a == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
	       a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD ||
	       a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
}

static int data_transform(cudnnConvolutionBwdDataAlgo_t a)
{
	return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT ||
	       a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
	       a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD ||
	       a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
}

static int filter_transform(cudnnConvolutionBwdFilterAlgo_t a)
{
	return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT ||
	       a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING ||
	       a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
}

/* A workspace query's outcome: 1 usable within limit, 0 not (too big, or
 * not supported for this shape), or a negative code for a real error. */
static int ws_fits(struct ps_cuda *cu, cudnnStatus_t st, size_t need, size_t limit)
{
	if (st == CUDNN_STATUS_SUCCESS)
		return need <= limit;
	if (CUDNN_STATUS_CATEGORY(st) == CUDNN_STATUS_CATEGORY(CUDNN_STATUS_NOT_SUPPORTED))
		return 0;
	return PS__CUDNN_EVAL(cu->base.err, st);
}

/* The deterministic fallback's workspace against the limit. */
static int fallback_fits(struct ps_cuda *cu, const char *which, size_t need, size_t limit)
{
	if (need <= limit)
		return 0;
	return ps__cuda_errf(cu, -ENOMEM, "conv2d %s: no deterministic algorithm fits in %zu "
			     "bytes of workspace (the fallback needs %zu)", which, limit, need);
}

static int pick_fwd(struct ps_cuda *cu, size_t limit, struct ps__conv_plan *p)
{
	cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
	int got = 0, ok;
	size_t need = 0;
	cudnnStatus_t st;

	CUDNN_CHECK(cu->base.err, cudnnSetConvolutionMathType(cu->conv_desc, base_math(cu)));
	CUDNN_CHECK(cu->base.err, cudnnGetConvolutionForwardAlgorithm_v7(
		cu->dnn, cu->x_desc, cu->w_desc, cu->conv_desc, cu->y_desc,
		CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, perf));
	for (int i = 0; i < got; i++) {
		if (!acceptable(cu, perf[i].status, perf[i].mathType, perf[i].determinism,
				fwd_transform(perf[i].algo)))
			continue;
		/* sized under the math it will run with */
		CUDNN_CHECK(cu->base.err, cudnnSetConvolutionMathType(cu->conv_desc,
								      perf[i].mathType));
		/* the query first: as an argument beside need, its write to need
		 * could come after need was read (unspecified order) */
		st = cudnnGetConvolutionForwardWorkspaceSize(
			cu->dnn, cu->x_desc, cu->w_desc, cu->conv_desc, cu->y_desc,
			perf[i].algo, &need);
		ok = ws_fits(cu, st, need, limit);
		if (ok < 0)
			return ok;
		if (ok && perf[i].memory > need) {  /* the heuristic's figure, if larger */
			need = perf[i].memory;
			ok = need <= limit;
		}
		if (!ok)
			continue;
		p->fwd = perf[i].algo;
		p->fwd_math = perf[i].mathType;
		p->fwd_ws = need;
		return 0;
	}
	p->fwd = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
	p->fwd_math = CUDNN_FMA_MATH;
	CUDNN_CHECK(cu->base.err, cudnnSetConvolutionMathType(cu->conv_desc, CUDNN_FMA_MATH));
	CUDNN_CHECK(cu->base.err, cudnnGetConvolutionForwardWorkspaceSize(
		cu->dnn, cu->x_desc, cu->w_desc, cu->conv_desc, cu->y_desc, p->fwd, &p->fwd_ws));
	return fallback_fits(cu, "forward", p->fwd_ws, limit);
}

static int pick_bwd_data(struct ps_cuda *cu, size_t limit, struct ps__conv_plan *p)
{
	cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
	int got = 0, ok;
	size_t need = 0;
	cudnnStatus_t st;

	CUDNN_CHECK(cu->base.err, cudnnSetConvolutionMathType(cu->conv_desc, base_math(cu)));
	CUDNN_CHECK(cu->base.err, cudnnGetConvolutionBackwardDataAlgorithm_v7(
		cu->dnn, cu->w_desc, cu->y_desc, cu->conv_desc, cu->x_desc,
		CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got, perf));
	for (int i = 0; i < got; i++) {
		if (!acceptable(cu, perf[i].status, perf[i].mathType, perf[i].determinism,
				data_transform(perf[i].algo)))
			continue;
		/* sized under the math it will run with */
		CUDNN_CHECK(cu->base.err, cudnnSetConvolutionMathType(cu->conv_desc,
								      perf[i].mathType));
		st = cudnnGetConvolutionBackwardDataWorkspaceSize(
			cu->dnn, cu->w_desc, cu->y_desc, cu->conv_desc, cu->x_desc,
			perf[i].algo, &need);
		ok = ws_fits(cu, st, need, limit);
		if (ok < 0)
			return ok;
		if (ok && perf[i].memory > need) {  /* the heuristic's figure, if larger */
			need = perf[i].memory;
			ok = need <= limit;
		}
		if (!ok)
			continue;
		p->bwd_data = perf[i].algo;
		p->data_math = perf[i].mathType;
		p->data_ws = need;
		return 0;
	}
	p->bwd_data = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;  /* deterministic; ALGO_0 is not */
	p->data_math = CUDNN_FMA_MATH;
	CUDNN_CHECK(cu->base.err, cudnnSetConvolutionMathType(cu->conv_desc, CUDNN_FMA_MATH));
	CUDNN_CHECK(cu->base.err, cudnnGetConvolutionBackwardDataWorkspaceSize(
		cu->dnn, cu->w_desc, cu->y_desc, cu->conv_desc, cu->x_desc, p->bwd_data,
		&p->data_ws));
	return fallback_fits(cu, "backward data", p->data_ws, limit);
}

static int pick_bwd_filter(struct ps_cuda *cu, size_t limit, struct ps__conv_plan *p)
{
	cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
	int got = 0, ok;
	size_t need = 0;
	cudnnStatus_t st;

	CUDNN_CHECK(cu->base.err, cudnnSetConvolutionMathType(cu->conv_desc, base_math(cu)));
	CUDNN_CHECK(cu->base.err, cudnnGetConvolutionBackwardFilterAlgorithm_v7(
		cu->dnn, cu->x_desc, cu->y_desc, cu->conv_desc, cu->w_desc,
		CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &got, perf));
	for (int i = 0; i < got; i++) {
		if (!acceptable(cu, perf[i].status, perf[i].mathType, perf[i].determinism,
				filter_transform(perf[i].algo)))
			continue;
		/* sized under the math it will run with */
		CUDNN_CHECK(cu->base.err, cudnnSetConvolutionMathType(cu->conv_desc,
								      perf[i].mathType));
		st = cudnnGetConvolutionBackwardFilterWorkspaceSize(
			cu->dnn, cu->x_desc, cu->y_desc, cu->conv_desc, cu->w_desc,
			perf[i].algo, &need);
		ok = ws_fits(cu, st, need, limit);
		if (ok < 0)
			return ok;
		if (ok && perf[i].memory > need) {  /* the heuristic's figure, if larger */
			need = perf[i].memory;
			ok = need <= limit;
		}
		if (!ok)
			continue;
		p->bwd_filter = perf[i].algo;
		p->filter_math = perf[i].mathType;
		p->filter_ws = need;
		return 0;
	}
	p->bwd_filter = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;  /* deterministic; ALGO_0 is not */
	p->filter_math = CUDNN_FMA_MATH;
	CUDNN_CHECK(cu->base.err, cudnnSetConvolutionMathType(cu->conv_desc, CUDNN_FMA_MATH));
	CUDNN_CHECK(cu->base.err, cudnnGetConvolutionBackwardFilterWorkspaceSize(
		cu->dnn, cu->x_desc, cu->y_desc, cu->conv_desc, cu->w_desc, p->bwd_filter,
		&p->filter_ws));
	return fallback_fits(cu, "backward filter", p->filter_ws, limit);
}

/* The plan for s under limit: remembered, or chosen now (descriptors must
 * already describe s). */
static int get_plan(struct ps_cuda *cu, const struct ps_conv_shape *s, size_t limit,
		    const struct ps__conv_plan **out)
{
	struct ps__conv_plan *p;
	int rc;

	for (int i = 0; i < PS__CONV_PLANS; i++) {
		p = &cu->plans[i];
		if (p->used && p->limit == limit && memcmp(&p->shape, s, sizeof(*s)) == 0) {
			*out = p;
			return 0;
		}
	}
	p = &cu->plans[cu->next_plan];
	cu->next_plan = (cu->next_plan + 1) % PS__CONV_PLANS;
	memset(p, 0, sizeof(*p));
	if ((rc = pick_fwd(cu, limit, p)) || (rc = pick_bwd_data(cu, limit, p)) ||
	    (rc = pick_bwd_filter(cu, limit, p)))
		return rc;
	p->shape = *s;
	p->limit = limit;
	p->used = 1;
	if (cu->log_plans)  /* PS_CUDA_PLANS=1: which algorithms cuDNN's ranking gave */
		fprintf(stderr, "ps-compute-cuda: conv plan n=%d c=%d %dx%d k=%d %dx%d pad %d "
			"stride %d, workspace limit %zu: fwd algo %d (math %d, %zu B), bwd data "
			"algo %d (math %d, %zu B), bwd filter algo %d (math %d, %zu B)\n",
			s->n, s->c, s->h, s->w, s->k, s->kh, s->kw, s->pad, s->stride, limit,
			(int)p->fwd, (int)p->fwd_math, p->fwd_ws, (int)p->bwd_data,
			(int)p->data_math, p->data_ws, (int)p->bwd_filter, (int)p->filter_math,
			p->filter_ws);
	*out = p;
	return 0;
}

static size_t max3(size_t a, size_t b, size_t c)
{
	size_t m = a > b ? a : b;

	return m > c ? m : c;
}

int ps__cuda_conv2d_workspace(struct ps_compute *c, const struct ps_conv_shape *s,
			      size_t *bytes)
{
	struct ps_cuda *cu = ps__cuda_of(c);
	struct ps_conv_shape t = *s;
	const struct ps__conv_plan *p;
	int rc;

	*bytes = 0;
	ps_conv_out(&t);  /* as the cpu backend: callers may not have filled oh, ow */
	if ((rc = conv_check(cu, &t)) || (rc = set_descs(cu, &t)) ||
	    (rc = get_plan(cu, &t, PS__CONV_WS_CAP, &p)))
		return rc;
	*bytes = max3(p->fwd_ws, p->data_ws, p->filter_ws);
	return 0;
}

/* Shape, descriptors and plan for an op given ws_bytes of workspace. */
static int prepare(struct ps_cuda *cu, const struct ps_conv_shape *s, const void *ws,
		   size_t ws_bytes, const struct ps__conv_plan **p)
{
	int rc = conv_check(cu, s);

	if (rc)
		return rc;
	if (!ws)
		ws_bytes = 0;
	if ((rc = set_descs(cu, s)))
		return rc;
	return get_plan(cu, s, ws_bytes, p);
}

int ps__cuda_conv2d_fwd(struct ps_compute *c, const struct ps_conv_shape *s, const float *x,
			const float *W, const float *b, float *y, void *ws, size_t ws_bytes)
{
	struct ps_cuda *cu = ps__cuda_of(c);
	const struct ps__conv_plan *p;
	const float one = 1.0f, zero = 0.0f;
	int rc = prepare(cu, s, ws, ws_bytes, &p);

	if (rc)
		return rc;
	CUDNN_CHECK(c->err, cudnnSetConvolutionMathType(cu->conv_desc, p->fwd_math));
	CUDNN_CHECK(c->err, cudnnConvolutionForward(cu->dnn, &one, cu->x_desc, x, cu->w_desc, W,
						    cu->conv_desc, p->fwd, ws, p->fwd_ws, &zero,
						    cu->y_desc, y));
	CUDA_CHECK(c->err, ps__cuda_bias_add(cu->stream, y, b, (size_t)s->n, s->k,
					     (size_t)s->oh * s->ow));
	return ps__cuda_done(cu, "conv2d_fwd", 0);
}

int ps__cuda_conv2d_bwd(struct ps_compute *c, const struct ps_conv_shape *s, const float *x,
			const float *W, const float *dy, float *dx, float *dW, float *db,
			void *ws, size_t ws_bytes, float alpha)
{
	struct ps_cuda *cu = ps__cuda_of(c);
	const struct ps__conv_plan *p;
	const float one = 1.0f, zero = 0.0f;
	int rc = prepare(cu, s, ws, ws_bytes, &p);

	if (rc)
		return rc;
	CUDA_CHECK(c->err, ps__cuda_bias_grad(cu->stream, db, dy, (size_t)s->n, s->k,
					      (size_t)s->oh * s->ow, alpha, cu->bias_scratch,
					      cu->sms));
	CUDNN_CHECK(c->err, cudnnSetConvolutionMathType(cu->conv_desc, p->filter_math));
	CUDNN_CHECK(c->err, cudnnConvolutionBackwardFilter(cu->dnn, &alpha, cu->x_desc, x,
							   cu->y_desc, dy, cu->conv_desc,
							   p->bwd_filter, ws, p->filter_ws, &zero,
							   cu->w_desc, dW));
	if (dx) {
		CUDNN_CHECK(c->err, cudnnSetConvolutionMathType(cu->conv_desc, p->data_math));
		CUDNN_CHECK(c->err, cudnnConvolutionBackwardData(cu->dnn, &one, cu->w_desc, W,
								 cu->y_desc, dy, cu->conv_desc,
								 p->bwd_data, ws, p->data_ws, &zero,
								 cu->x_desc, dx));
	}
	return ps__cuda_done(cu, "conv2d_bwd", 0);
}
