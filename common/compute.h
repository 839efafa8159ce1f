/* compute.h - the compute backends a worker trains with (docs/architecture.md, Interfaces).
 *
 * A backend is a const struct ps_compute_ops found by name ("cpu", "cuda").
 * Every float pointer an op takes is backend memory from alloc() (device
 * memory for cuda, host memory for cpu); host data crosses only through
 * upload()/download(). Layout is NCHW float32, batch first. Ops are queued in
 * order on the backend's stream and may return before they finish; sync()
 * waits for all of them. Ops never allocate except from the workspace they
 * are given. All return 0 or a negative PS_E* code; the backend's last error
 * text is kept in ps_compute.err.
 *
 * Shapes:
 *   dense   x[n, in]  W[in, out]  b[out]  y[n, out]        y = x W + b
 *   conv2d  x[n, c, h, w]  W[k_out, c, kh, kw]  b[k_out]  y[n, k_out, oh, ow]
 *           oh = (h + 2 pad - kh) / stride + 1 (cross-correlation, as cuDNN)
 *   maxpool x[n, c, h, w] -> y[n, c, h / size, w / size], window = stride = size
 *   relu    elementwise max(x, 0)
 *   softmax_xent  logits[n, classes], labels[n] (int32, backend memory)
 */
#ifndef PS_COMPUTE_H
#define PS_COMPUTE_H

#include <stddef.h>
#include <stdint.h>

struct ps_compute {
	const struct ps_compute_ops *ops;
	char err[256];
};

struct ps_conv_shape {
	int n, c, h, w;           /* input */
	int k, kh, kw;            /* filters */
	int pad, stride;
	int oh, ow;               /* output, from ps_conv_out() */
};

struct ps_pool_shape {
	int n, c, h, w;           /* input */
	int size;                 /* window and stride */
	int oh, ow;               /* h / size, w / size (floor) */
};

static inline void ps_conv_out(struct ps_conv_shape *s)
{
	s->oh = (s->h + 2 * s->pad - s->kh) / s->stride + 1;
	s->ow = (s->w + 2 * s->pad - s->kw) / s->stride + 1;
}

struct ps_compute_ops {
	const char *name;
	/* Creates a backend. cuda without a usable GPU returns PS_ENOTSUP with
	 * the reason (no device, driver missing, ...) in err. */
	int (*create)(struct ps_compute **out, char *err, size_t errlen);
	void (*destroy)(struct ps_compute *c);

	/* Backend memory, 256-byte aligned; NULL on failure. free(NULL) is a no-op. */
	float *(*alloc)(struct ps_compute *c, size_t bytes);
	void (*free)(struct ps_compute *c, void *p);
	/* Host memory that copies to and from the backend fastest (pinned for cuda). */
	void *(*host_alloc)(struct ps_compute *c, size_t bytes);
	void (*host_free)(struct ps_compute *c, void *p);
	/* Copies between host and backend memory; queued, complete after sync(). */
	int (*upload)(struct ps_compute *c, void *dst, const void *src, size_t bytes);
	int (*download)(struct ps_compute *c, void *dst, const void *src, size_t bytes);
	int (*sync)(struct ps_compute *c);
	/* Sets n floats to zero. */
	int (*zero)(struct ps_compute *c, float *x, size_t n);
	/* y = a * x elementwise over n floats (in place allowed). */
	int (*scale)(struct ps_compute *c, float *y, const float *x, float a, size_t n);

	/* Workspace bytes conv2d needs for shape s (im2col buffer, cuDNN algos). */
	size_t (*conv2d_workspace)(struct ps_compute *c, const struct ps_conv_shape *s);

	int (*dense_fwd)(struct ps_compute *c, const float *x, const float *W, const float *b,
			 float *y, int n, int in, int out);
	/* dW, db are overwritten (not accumulated); dx may be NULL (first layer). */
	int (*dense_bwd)(struct ps_compute *c, const float *x, const float *W, const float *dy,
			 float *dx, float *dW, float *db, int n, int in, int out);
	int (*conv2d_fwd)(struct ps_compute *c, const struct ps_conv_shape *s, const float *x,
			  const float *W, const float *b, float *y, void *ws, size_t ws_bytes);
	/* dW, db overwritten; dx may be NULL. */
	int (*conv2d_bwd)(struct ps_compute *c, const struct ps_conv_shape *s, const float *x,
			  const float *W, const float *dy, float *dx, float *dW, float *db,
			  void *ws, size_t ws_bytes);
	/* idx (n*c*oh*ow int32, backend memory) records each max's input position
	 * within its (n, c) plane: iy * w + ix (the same on every backend). */
	int (*maxpool_fwd)(struct ps_compute *c, const struct ps_pool_shape *s, const float *x,
			   float *y, int32_t *idx);
	/* dx (n*c*h*w) is overwritten: zero except at the recorded maxima. */
	int (*maxpool_bwd)(struct ps_compute *c, const struct ps_pool_shape *s, const float *dy,
			   const int32_t *idx, float *dx);
	int (*relu_fwd)(struct ps_compute *c, const float *x, float *y, size_t n);
	/* dx = dy where y > 0, else 0 (y is relu's output). */
	int (*relu_bwd)(struct ps_compute *c, const float *y, const float *dy, float *dx, size_t n);
	/* Mean cross-entropy of softmax(logits) against labels. Writes dlogits
	 * (gradient of the mean loss), and into host memory *loss (mean) and
	 * *correct (argmax == label count); host results valid after the call
	 * returns (this op synchronizes). dlogits may be NULL (evaluation).
	 * A label outside 0..classes-1 gives -EINVAL before anything is written;
	 * a loss that is not finite gives PS_ENOFINITE (outputs written). */
	int (*softmax_xent)(struct ps_compute *c, const float *logits, const int32_t *labels,
			    int n, int classes, float *dlogits, float *loss, int *correct);
};

/* The registry: "cpu" always; "cuda" when built with nvcc (its create()
 * fails with PS_ENOTSUP on a machine without a usable GPU). NULL if unknown. */
const struct ps_compute_ops *ps_compute_find(const char *name);

extern const struct ps_compute_ops ps_compute_cpu_ops;
extern const struct ps_compute_ops ps_compute_cuda_ops;

#endif
