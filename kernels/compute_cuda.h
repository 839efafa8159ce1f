/* compute_cuda.h - the cuda backend's state, shared by its host-side files
 * (compute_cuda.c: lifecycle, memory, dense, pooling, relu, loss;
 * conv2d_cudnn.c: convolutions through cuDNN). Not a public header: callers
 * see only struct ps_compute and ps_compute_cuda_ops (compute.h).
 */
#ifndef PS_COMPUTE_CUDA_H
#define PS_COMPUTE_CUDA_H

#include <stddef.h>
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <cudnn.h>
#include "compute.h"
#include "softmax_xent.cuh"

#ifndef container_of
#define container_of(ptr, type, member) ((type *)((char *)(ptr) - offsetof(type, member)))
#endif

/* Conv algorithm choices remembered per (shape, workspace limit). */
#define PS__CONV_PLANS 16

/* Workspace conv2d_workspace() may ask for at most: algorithms that need
 * more (some FFT variants want gigabytes) are passed over. */
#define PS__CONV_WS_CAP ((size_t)256 << 20)

/* The algorithms for one convolution shape, each the first of cuDNN's
 * heuristic ranking that fits the workspace limit (deterministic ones first). */
struct ps__conv_plan {
	int used;
	struct ps_conv_shape shape;   /* oh, ow included */
	size_t limit;                 /* workspace bytes the choice had to fit */
	cudnnConvolutionFwdAlgo_t fwd;
	cudnnConvolutionBwdDataAlgo_t bwd_data;
	cudnnConvolutionBwdFilterAlgo_t bwd_filter;
	size_t fwd_ws, data_ws, filter_ws;
};

struct ps_cuda {
	struct ps_compute base;       /* first; ops receive &base */
	int device;
	cudaStream_t stream;          /* every op is queued here */
	cublasHandle_t blas;          /* bound to stream */
	cudnnHandle_t dnn;            /* bound to stream */
	/* Descriptors reset for each conv call (host-side, cheap). */
	cudnnTensorDescriptor_t x_desc, y_desc;
	cudnnFilterDescriptor_t w_desc;
	cudnnConvolutionDescriptor_t conv_desc;
	struct ps__conv_plan plans[PS__CONV_PLANS];
	int next_plan;                /* round-robin victim when all are used */
	/* softmax_xent: device partials and result, and the pinned host copy. */
	void *xent_scratch;
	struct ps__xent_result *xent_dev;
	struct ps__xent_result *xent_host;
};

#define ps__cuda_of(c) container_of((c), struct ps_cuda, base)

/* Writes a message into the backend's err (shape checks and the like, not
 * CUDA calls: those go through cuda_check.h); returns rc. */
int ps__cuda_errf(struct ps_cuda *cu, int rc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* conv2d_cudnn.c: descriptors (init/free) and the three conv2d ops. */
int ps__cuda_conv_init(struct ps_cuda *cu);
void ps__cuda_conv_free(struct ps_cuda *cu);
size_t ps__cuda_conv2d_workspace(struct ps_compute *c, const struct ps_conv_shape *s);
int ps__cuda_conv2d_fwd(struct ps_compute *c, const struct ps_conv_shape *s, const float *x,
			const float *W, const float *b, float *y, void *ws, size_t ws_bytes);
int ps__cuda_conv2d_bwd(struct ps_compute *c, const struct ps_conv_shape *s, const float *x,
			const float *W, const float *dy, float *dx, float *dW, float *db,
			void *ws, size_t ws_bytes);

#endif
