/* compute.h - the compute backends a worker trains with (docs/architecture.md, Interfaces).
 *
 * A backend is a const struct ps_compute_ops found by name ("cpu", "ref",
 * "cuda") through ps_compute_load(): cpu (oneDNN) and ref (the plain
 * reference) are built in, cuda is the plug-in
 * lib/ps-compute-cuda.so, opened with dlopen on first use so that a worker
 * runs on machines without the CUDA libraries. Every float pointer an op
 * takes is backend memory from alloc() (device memory for cuda, host memory
 * for cpu); host data crosses only through the copies below. Layout is NCHW
 * float32, batch first.
 *
 * Ordering. Ops are queued in order on the backend's compute stream and may
 * return before they finish. Copies to and from host memory can also go on
 * a separate copy stream (download_async, upload_async) and signal an event,
 * so a gradient can travel to the host while later layers compute and a
 * push thread waits on that event alone; sync() waits for everything. On
 * the cpu backend every op has finished when it returns and events are
 * always complete: the same calling code is right on both.
 *
 * Ops never allocate except from the workspace they are given. All return 0
 * or a negative PS_E* code; the backend's last error text is in
 * ps_compute.err. A fault a device reports later (a kernel that failed
 * after its op returned) comes back from the next op, sync() or
 * event_wait(); with PS_CUDA_SYNC=1 the cuda backend waits after every op
 * instead, so the error names the op that failed.
 *
 * Shapes:
 *   dense   x[n, in]  W[in, out]  b[out]  y[n, out]        y = x W + b
 *   conv2d  x[n, c, h, w]  W[k_out, c, kh, kw]  b[k_out]  y[n, k_out, oh, ow]
 *           oh = (h + 2 pad - kh) / stride + 1 (cross-correlation, as cuDNN)
 *   maxpool x[n, c, h, w] -> y[n, c, h / size, w / size], window = stride = size
 *   relu    elementwise max(x, 0)
 *   softmax_xent  logits[n, classes], labels[n] (int32, backend memory)
 *   embedding_bag rows[nrows, dim] -> y[examples, ldy], see struct ps_bag_shape
 */
#ifndef PS_COMPUTE_H
#define PS_COMPUTE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Tensor-core TF32 math on the cuda backend (train.tf32). PyTorch's default
 * is CONV: convolutions may use TF32, matrix products stay full fp32. The
 * cpu backend computes fp32 whatever is asked. */
enum ps_tf32 { PS_TF32_CONV = 0, PS_TF32_OFF = 1, PS_TF32_ALL = 2 };

/* What a backend is created with; NULL gives the defaults (all zero). */
struct ps_compute_opts {
	enum ps_tf32 tf32;
	int threads;              /* compute threads, 0 = the backend's default */
};

struct ps_compute {
	const struct ps_compute_ops *ops;
	char err[256];
	/* Host waits on the issuing thread: sync() calls, counted by every
	 * backend (tests assert that a backward pass makes none). */
	unsigned long host_syncs;
};

/* A point in a backend's streams that a host thread or the compute stream
 * can wait for. Opaque; made by event_create(). */
struct ps_compute_event;

/* What softmax_xent leaves in host memory (the struct itself must come from
 * host_alloc), valid once a later sync(), event_wait() of an event recorded
 * after it, or ps_compute_xent_read() returns. */
struct ps_xent_stats {
	double loss_sum;          /* sum over examples of -log softmax[label] */
	int correct;              /* examples whose first argmax is the label */
	int bad_row;              /* first example with a label outside [0, classes), or -1 */
	int bad_label;            /* its label */
	int n;                    /* examples */
};

struct ps_conv_shape {
	int n, c, h, w;           /* input */
	int k, kh, kw;            /* filters */
	int pad, stride;
	int oh, ow;               /* output, from ps_conv_out() */
};

/* An embedding bag batch. The batch's rows (each unique id once, pulled
 * from the shards) are rows[nrows, dim]. There are nbags = examples x
 * fields bags; bag b is example b / fields, field b % fields, and holds
 * the entries offsets[b] .. offsets[b + 1] - 1 of idx, each an index into
 * rows (offsets has nbags + 1 int32, idx has offsets[nbags], both backend
 * memory). Its result goes to y[(b / fields) * ldy + (b % fields) * dim],
 * dim floats: a batch's bags are the first fields x dim columns of a
 * [examples, ldy] matrix whose other columns (the numeric features) the
 * bag ops never touch. */
enum ps_bag_mode { PS_BAG_SUM = 0, PS_BAG_MEAN = 1 };
struct ps_bag_shape {
	int nbags, fields, dim, ldy;
	int nrows;                /* rows pulled: idx values are 0..nrows-1 */
	enum ps_bag_mode mode;
};

struct ps_pool_shape {
	int n, c, h, w;           /* input */
	int size;                 /* window and stride */
	int oh, ow;               /* h / size, w / size (floor) */
};

static inline void ps_conv_out(struct ps_conv_shape *s)
{
	if (s->stride < 1) {      /* refused by every conv op; never divide by 0 */
		s->oh = s->ow = 0;
		return;
	}
	s->oh = (s->h + 2 * s->pad - s->kh) / s->stride + 1;
	s->ow = (s->w + 2 * s->pad - s->kw) / s->stride + 1;
}

struct ps_compute_ops {
	const char *name;
	/* Creates a backend. cuda without a usable GPU returns PS_ENOTSUP with
	 * the reason (no device, driver missing or too old, ...) in err. */
	int (*create)(struct ps_compute **out, const struct ps_compute_opts *opts, char *err,
		      size_t errlen);
	/* Waits for queued work and frees everything the backend holds. */
	void (*destroy)(struct ps_compute *c);

	/* Backend memory, 256-byte aligned; NULL on failure. free(NULL) is a
	 * no-op; a failure to free is kept and returned by the next sync(). */
	float *(*alloc)(struct ps_compute *c, size_t bytes);
	void (*free)(struct ps_compute *c, void *p);
	/* Host memory that copies to and from the backend fastest (pinned for cuda). */
	void *(*host_alloc)(struct ps_compute *c, size_t bytes);
	void (*host_free)(struct ps_compute *c, void *p);
	/* Copies between host and backend memory, queued on the compute
	 * stream: complete after sync() (the host buffer must stay untouched
	 * until then). */
	int (*upload)(struct ps_compute *c, void *dst, const void *src, size_t bytes);
	int (*download)(struct ps_compute *c, void *dst, const void *src, size_t bytes);
	/* Waits until everything queued has finished; counts in host_syncs. */
	int (*sync)(struct ps_compute *c);

	/* Events. create/free like alloc/free; an event never recorded is
	 * complete. An event is recorded by one thread (the one issuing ops)
	 * and may be waited for by any other. */
	int (*event_create)(struct ps_compute *c, struct ps_compute_event **ev);
	void (*event_free)(struct ps_compute *c, struct ps_compute_event *ev);
	/* Marks ev once everything queued on the compute stream so far is done. */
	int (*event_record)(struct ps_compute *c, struct ps_compute_event *ev);
	/* Later ops on the compute stream wait for ev; the host does not. */
	int (*stream_wait)(struct ps_compute *c, struct ps_compute_event *ev);
	/* Blocks the calling thread until ev is complete. Any thread. */
	int (*event_wait)(struct ps_compute *c, struct ps_compute_event *ev);
	/* On the copy stream: once everything queued on the compute stream so
	 * far is done, copies bytes from backend memory src to host memory dst
	 * (from host_alloc), then marks ev. The compute stream goes on. */
	int (*download_async)(struct ps_compute *c, void *dst, const void *src, size_t bytes,
			      struct ps_compute_event *ev);
	/* On the copy stream: once after (if not NULL) is complete, copies bytes
	 * from host memory src (from host_alloc; untouched until ev) to backend
	 * memory dst, then marks ev. Ops that read dst must stream_wait(ev). */
	int (*upload_async)(struct ps_compute *c, void *dst, const void *src, size_t bytes,
			    struct ps_compute_event *after, struct ps_compute_event *ev);

	/* Sets n floats to zero. */
	int (*zero)(struct ps_compute *c, float *x, size_t n);
	/* y = a * x elementwise over n floats (in place allowed). */
	int (*scale)(struct ps_compute *c, float *y, const float *x, float a, size_t n);

	/* Workspace bytes conv2d needs for shape s (im2col buffer, cuDNN
	 * algorithms) into *bytes; an error (a bad shape, no algorithm) is
	 * returned, never reported as 0 bytes. */
	int (*conv2d_workspace)(struct ps_compute *c, const struct ps_conv_shape *s, size_t *bytes);

	int (*dense_fwd)(struct ps_compute *c, const float *x, const float *W, const float *b,
			 float *y, int n, int in, int out);
	/* dW = alpha x^T dy and db = alpha sum_n dy are overwritten (not
	 * accumulated); dx = dy W^T is not scaled and may be NULL (first layer).
	 * alpha carries 1/batch and the worker's 1/workers, so no separate
	 * scaling pass runs over the gradients. */
	int (*dense_bwd)(struct ps_compute *c, const float *x, const float *W, const float *dy,
			 float *dx, float *dW, float *db, int n, int in, int out, float alpha);
	int (*conv2d_fwd)(struct ps_compute *c, const struct ps_conv_shape *s, const float *x,
			  const float *W, const float *b, float *y, void *ws, size_t ws_bytes);
	/* As dense_bwd: dW, db overwritten and scaled by alpha; dx may be NULL. */
	int (*conv2d_bwd)(struct ps_compute *c, const struct ps_conv_shape *s, const float *x,
			  const float *W, const float *dy, float *dx, float *dW, float *db,
			  void *ws, size_t ws_bytes, float alpha);
	/* idx (n*c*oh*ow int32, backend memory) records each max's input position
	 * within its (n, c) plane: iy * w + ix (the same on every backend). */
	int (*maxpool_fwd)(struct ps_compute *c, const struct ps_pool_shape *s, const float *x,
			   float *y, int32_t *idx);
	/* dx (n*c*h*w) is overwritten: zero except at the recorded maxima. An
	 * index maxpool_fwd cannot have written (outside its own window) is
	 * refused with -EINVAL and dx is left unwritten; on cuda the refusal
	 * comes from the next sync() or event_wait(). */
	int (*maxpool_bwd)(struct ps_compute *c, const struct ps_pool_shape *s, const float *dy,
			   const int32_t *idx, float *dx);
	int (*relu_fwd)(struct ps_compute *c, const float *x, float *y, size_t n);
	/* dx = dy where y > 0, else 0 (y is relu's output). */
	int (*relu_bwd)(struct ps_compute *c, const float *y, const float *dy, float *dx, size_t n);
	/* Softmax cross-entropy of logits against labels. Writes dlogits =
	 * softmax - onehot(label), the gradient of the summed loss (the 1/n of
	 * the mean goes into the backward ops' alpha), unless dlogits is NULL
	 * (evaluation); and the sums into *st (host memory from host_alloc),
	 * complete after a later sync or event (see struct ps_xent_stats).
	 * Queued: it does not wait, so a training step reads its loss once.
	 * If a label is outside 0..classes-1 nothing is written but st's
	 * bad_row and bad_label; ps_compute_xent_read() turns that into
	 * -EINVAL and a loss that is not finite into PS_ENOFINITE. */
	int (*softmax_xent)(struct ps_compute *c, const float *logits, const int32_t *labels,
			    int n, int classes, float *dlogits, struct ps_xent_stats *st);

	/* Bags rows into y (struct ps_bag_shape): the sum of the bag's rows,
	 * or their mean; an empty bag gives zeros. Only the bags' columns of
	 * y are written. An idx value outside 0..nrows-1 is refused with
	 * -EINVAL by the cpu backend (nothing written); the cuda backend, which
	 * does not read idx on the host, leaves such an entry out. */
	int (*embedding_bag_fwd)(struct ps_compute *c, const struct ps_bag_shape *s,
				 const float *rows, const int32_t *offsets, const int32_t *idx,
				 float *y);
	/* The rows' gradients from dy (same layout as y): drows[r, dim] (nrows
	 * x dim, overwritten) = alpha x the sum, over the bags naming row r, of
	 * the bag's dy slot (divided by the bag's size for PS_BAG_MEAN), once
	 * per entry naming r. The caller gives the transpose of idx: row r's
	 * bags are row_bags[row_offsets[r] .. row_offsets[r + 1] - 1]
	 * (row_offsets: nrows + 1 int32; row_bags: offsets[nbags] int32, each
	 * row's bags in increasing order). Every backend adds each row's terms
	 * in that order, without atomics: the result is the same every run. */
	int (*embedding_bag_bwd)(struct ps_compute *c, const struct ps_bag_shape *s,
				 const float *dy, const int32_t *offsets,
				 const int32_t *row_offsets, const int32_t *row_bags,
				 float *drows, float alpha);
};

/* Finds backend name ("cpu", "ref", "cuda") into *ops; the cuda plug-in is opened
 * on the first call (PS_COMPUTE_PLUGIN_DIR, then the folder lib/ beside the
 * program's bin/, then the install path). PS_ENOTSUP with the one-line
 * reason in err when it cannot be loaded (not built, a library missing);
 * -ENOENT for a name no backend has. Thread-safe. */
int ps_compute_load(const char *name, const struct ps_compute_ops **ops, char *err,
		    size_t errlen);

/* Reads stats written by softmax_xent over classes: the mean loss and the
 * number correct. -EINVAL naming the example for a bad label, PS_ENOFINITE
 * for a loss that is not finite (loss and correct still set); the reason in
 * err. Call only once the stats are complete (sync or a later event). */
int ps_compute_xent_read(const struct ps_xent_stats *st, int classes, float *loss, int *correct,
			 char *err, size_t errlen);

/* softmax_xent, sync, and ps_compute_xent_read in one call, into c->err:
 * for evaluation and tests, where a wait per call costs nothing. */
int ps_compute_xent(struct ps_compute *c, const float *logits, const int32_t *labels, int n,
		    int classes, float *dlogits, float *loss, int *correct);

/* The built-in backends: "cpu" on oneDNN (the default), and "ref", the plain
 * C + OpenBLAS reference every other backend is tested against. */
extern const struct ps_compute_ops ps_compute_cpu_ops;
extern const struct ps_compute_ops ps_compute_ref_ops;

/* The cpu backend's embedding bag ops (kernels/embedding_bag_cpu.c), also
 * usable by any host-memory backend. */
int ps__cpu_embedding_bag_fwd(struct ps_compute *c, const struct ps_bag_shape *s,
			      const float *rows, const int32_t *offsets, const int32_t *idx,
			      float *y);
int ps__cpu_embedding_bag_bwd(struct ps_compute *c, const struct ps_bag_shape *s,
			      const float *dy, const int32_t *offsets, const int32_t *row_offsets,
			      const int32_t *row_bags, float *drows, float alpha);
/* Shape checks of the bag ops, shared by the backends: 0, or -EINVAL
 * (-22) with the reason in err. */
static inline int ps__bag_shape_check(const struct ps_bag_shape *s, char *err, size_t errlen)
{
	if (s->fields < 1 || s->dim < 1 || s->nbags < 0 || s->nbags % s->fields ||
	    s->nrows < 0 || s->ldy < s->fields * s->dim ||
	    (s->mode != PS_BAG_SUM && s->mode != PS_BAG_MEAN)) {
		snprintf(err, errlen, "embedding_bag: bad shape nbags=%d fields=%d dim=%d ldy=%d "
			 "nrows=%d mode=%d", s->nbags, s->fields, s->dim, s->ldy, s->nrows,
			 (int)s->mode);
		return -22;
	}
	return 0;
}

/* The symbol the cuda plug-in exports: its ops, and the ABI version of this
 * header it was built against (a plug-in of another version is refused). */
#define PS_COMPUTE_ABI 3
struct ps_compute_plugin {
	int abi;
	const struct ps_compute_ops *ops;
};
#define PS_COMPUTE_PLUGIN_SYMBOL "ps_compute_plugin"

#endif
