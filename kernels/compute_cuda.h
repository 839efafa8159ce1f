/* compute_cuda.h - the cuda backend's state, shared by its host-side files
 * (compute_cuda.c: lifecycle, memory, copies, events, the ops table;
 * cuda_layers.c: dense, pooling, relu, loss; conv2d_cudnn.c: convolutions
 * through cuDNN). Not a public header: callers see only struct ps_compute
 * and the ops the plug-in exports (compute.h).
 */
#ifndef PS_COMPUTE_CUDA_H
#define PS_COMPUTE_CUDA_H

#include <stddef.h>
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <cudnn.h>
#include "compute.h"
#include "cuda_flags.h"

#ifndef container_of
#define container_of(ptr, type, member) ((type *)((char *)(ptr) - offsetof(type, member)))
#endif

/* Conv algorithm choices remembered per (shape, workspace limit). */
#define PS__CONV_PLANS 16

/* Workspace conv2d_workspace() may ask for at most: algorithms that need
 * more (some FFT variants want gigabytes) are passed over. */
#define PS__CONV_WS_CAP ((size_t)256 << 20)

/* The algorithms for one convolution shape, each the first of cuDNN's
 * heuristic ranking that is deterministic, of the allowed math and fits the
 * workspace limit. */
struct ps__conv_plan {
	int used;
	struct ps_conv_shape shape;   /* oh, ow included */
	size_t limit;                 /* workspace bytes the choice had to fit */
	cudnnConvolutionFwdAlgo_t fwd;
	cudnnConvolutionBwdDataAlgo_t bwd_data;
	cudnnConvolutionBwdFilterAlgo_t bwd_filter;
	cudnnMathType_t fwd_math, data_math, filter_math;
	size_t fwd_ws, data_ws, filter_ws;
};

struct ps_compute_event {
	cudaEvent_t ev;
};

struct ps_cuda {
	struct ps_compute base;       /* first; ops receive &base */
	int device;
	int sms;                      /* multiprocessors: kernels size their grids by it */
	enum ps_tf32 tf32;
	int sync_each;                /* PS_CUDA_SYNC=1: wait after every op */
	cudaStream_t stream;          /* every op is queued here */
	cudaStream_t copy;            /* download_async / upload_async */
	cudaEvent_t fork;             /* hands the compute stream's position to copy */
	cublasHandle_t blas;          /* bound to stream */
	cudnnHandle_t dnn;            /* bound to stream */
	/* Descriptors reset for each conv call (host-side, cheap). */
	cudnnTensorDescriptor_t x_desc, y_desc;
	cudnnFilterDescriptor_t w_desc;
	cudnnConvolutionDescriptor_t conv_desc;
	struct ps__conv_plan plans[PS__CONV_PLANS];
	int next_plan;                /* round-robin victim when all are used */
	int log_plans;                /* PS_CUDA_PLANS=1: each new plan to stderr */
	void *xent_scratch;           /* softmax_xent's partials and result */
	float *bias_scratch;          /* bias gradients' partials */
	struct ps__cuda_flags *flags_dev, *flags_host;  /* kernel-found faults */
	int deferred;                 /* a failed free, returned by the next sync */
	char deferred_err[200];
};

#define ps__cuda_of(c) container_of((c), struct ps_cuda, base)

/* Writes a message into the backend's err (shape checks and the like, not
 * CUDA calls: those go through cuda_check.h); returns rc. */
int ps__cuda_errf(struct ps_cuda *cu, int rc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Every op ends through here: with PS_CUDA_SYNC=1 it waits for the stream
 * and, if anything failed, names op in the error. Returns rc or that error. */
int ps__cuda_done(struct ps_cuda *cu, const char *op, int rc);

/* cuda_layers.c: the ops other than convolutions. */
int ps__cuda_dense_fwd(struct ps_compute *c, const float *x, const float *W, const float *b,
		       float *y, int n, int in, int out);
int ps__cuda_dense_bwd(struct ps_compute *c, const float *x, const float *W, const float *dy,
		       float *dx, float *dW, float *db, int n, int in, int out, float alpha);
int ps__cuda_maxpool_fwd_op(struct ps_compute *c, const struct ps_pool_shape *s, const float *x,
			 float *y, int32_t *idx);
int ps__cuda_maxpool_bwd_op(struct ps_compute *c, const struct ps_pool_shape *s, const float *dy,
			 const int32_t *idx, float *dx);
int ps__cuda_relu_fwd_op(struct ps_compute *c, const float *x, float *y, size_t n);
int ps__cuda_relu_bwd_op(struct ps_compute *c, const float *y, const float *dy, float *dx,
			 size_t n);
int ps__cuda_bag_fwd_op(struct ps_compute *c, const struct ps_bag_shape *s, const float *rows,
			const int32_t *offsets, const int32_t *idx, float *y);
int ps__cuda_bag_bwd_op(struct ps_compute *c, const struct ps_bag_shape *s, const float *dy,
			const int32_t *offsets, const int32_t *row_offsets,
			const int32_t *row_bags, float *drows, float alpha);
int ps__cuda_softmax_xent_op(struct ps_compute *c, const float *logits, const int32_t *labels,
			     int n, int classes, float *dlogits, struct ps_xent_stats *st);

/* conv2d_cudnn.c: descriptors (init/free) and the three conv2d ops. */
int ps__cuda_conv_init(struct ps_cuda *cu);
int ps__cuda_conv_free(struct ps_cuda *cu);
int ps__cuda_conv2d_workspace(struct ps_compute *c, const struct ps_conv_shape *s,
			      size_t *bytes);
int ps__cuda_conv2d_fwd(struct ps_compute *c, const struct ps_conv_shape *s, const float *x,
			const float *W, const float *b, float *y, void *ws, size_t ws_bytes);
int ps__cuda_conv2d_bwd(struct ps_compute *c, const struct ps_conv_shape *s, const float *x,
			const float *W, const float *dy, float *dx, float *dW, float *db,
			void *ws, size_t ws_bytes, float alpha);

#endif
