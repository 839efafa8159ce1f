/* compute_ref.c - the reference compute backend "ref": host memory and OpenBLAS.
 *
 * Every other backend ("cpu" on oneDNN, "cuda") is checked against this
 * one, so it favours plain, obviously correct loops; the heavy work (dense layers, convolutions as
 * im2col + GEMM) goes to cblas_sgemm. A training step of the cnn preset
 * (batch 64) is about 4.3 GFLOP, nearly all in sgemm: about 95 ms on one
 * AVX2 core that runs sgemm at 68 GFLOPS. Ops run synchronously on the
 * calling thread (OpenBLAS may use its own threads, see OPENBLAS_NUM_THREADS),
 * so sync() has nothing to wait for, the async copies are plain copies and
 * every event is complete. Backend memory is ordinary host memory.
 *
 * Index conventions shared with other backends only through results:
 *   im2col buffer of one image: col[(ci * kh + ki) * kw + kj][oy * ow + ox]
 *   maxpool idx: position iy * w + ix of the max inside its (n, c) plane
 */
#include <cblas.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "compute.h"
#include "compute_ref.h"
#include "ps_err.h"

#define ALIGN 256

struct ref {
	struct ps_compute base;     /* first: ops receive &base */
};

/* Records the reason for a failed op in c->err and returns rc. */
int ps__ref_fail(struct ps_compute *c, int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->err, sizeof(c->err), fmt, ap);
	va_end(ap);
	return rc;
}

static int ref_create(struct ps_compute **out, const struct ps_compute_opts *opts, char *err,
		      size_t errlen)
{
	struct ref *b = calloc(1, sizeof(*b));

	(void)opts;  /* fp32 always; threads: OpenBLAS's own setting */
	*out = NULL;
	if (!b) {
		if (err && errlen)
			snprintf(err, errlen, "out of memory creating the ref backend");
		return -ENOMEM;
	}
	b->base.ops = &ps_compute_ref_ops;
	*out = &b->base;
	return 0;
}

static void ref_destroy(struct ps_compute *c)
{
	free(c);  /* base is the first member of struct ref */
}

/* aligned_alloc wants a multiple of the alignment; 0 bytes still gives a
 * distinct pointer so callers can tell success from failure. */
float *ps__ref_alloc(struct ps_compute *c, size_t bytes)
{
	size_t rounded = bytes ? (bytes + ALIGN - 1) / ALIGN * ALIGN : ALIGN;
	float *p;

	if (rounded < bytes) {
		ps__ref_fail(c, -ENOMEM, "allocation of %zu bytes is too large", bytes);
		return NULL;
	}
	p = aligned_alloc(ALIGN, rounded);
	if (!p)
		ps__ref_fail(c, -ENOMEM, "out of memory allocating %zu bytes", bytes);
	return p;
}

void ps__ref_free(struct ps_compute *c, void *p)
{
	(void)c;
	free(p);
}

void *ps__ref_host_alloc(struct ps_compute *c, size_t bytes)
{
	return ps__ref_alloc(c, bytes);
}

int ps__ref_copy(struct ps_compute *c, void *dst, const void *src, size_t bytes)
{
	(void)c;
	if (bytes)
		memmove(dst, src, bytes);
	return 0;
}

int ps__ref_sync(struct ps_compute *c)
{
	c->host_syncs++;
	return 0;
}

/* ---- events: every op has finished when it returns ---- */

struct ps_compute_event {
	char unused;
};

int ps__ref_event_create(struct ps_compute *c, struct ps_compute_event **ev)
{
	*ev = calloc(1, sizeof(**ev));
	return *ev ? 0 : ps__ref_fail(c, -ENOMEM, "out of memory creating an event");
}

void ps__ref_event_free(struct ps_compute *c, struct ps_compute_event *ev)
{
	(void)c;
	free(ev);
}

int ps__ref_event_noop(struct ps_compute *c, struct ps_compute_event *ev)
{
	(void)c;
	(void)ev;
	return 0;
}

int ps__ref_download_async(struct ps_compute *c, void *dst, const void *src, size_t bytes,
			      struct ps_compute_event *ev)
{
	(void)ev;
	return ps__ref_copy(c, dst, src, bytes);
}

int ps__ref_upload_async(struct ps_compute *c, void *dst, const void *src, size_t bytes,
			    struct ps_compute_event *after, struct ps_compute_event *ev)
{
	(void)after;
	(void)ev;
	return ps__ref_copy(c, dst, src, bytes);
}

int ps__ref_zero(struct ps_compute *c, float *x, size_t n)
{
	(void)c;
	if (n)
		memset(x, 0, n * sizeof(float));
	return 0;
}

int ps__ref_scale(struct ps_compute *c, float *y, const float *x, float a, size_t n)
{
	(void)c;
	for (size_t i = 0; i < n; i++)
		y[i] = a * x[i];
	return 0;
}

/* ---- convolution ---- */

/* Checks that s is a usable convolution shape with oh, ow from ps_conv_out(). */
int ps__ref_conv_check(struct ps_compute *c, const struct ps_conv_shape *s)
{
	if (s->n < 1 || s->c < 1 || s->h < 1 || s->w < 1 || s->k < 1 || s->kh < 1 ||
	    s->kw < 1 || s->pad < 0 || s->stride < 1)
		return ps__ref_fail(c, -EINVAL, "conv2d: bad shape n=%d c=%d h=%d w=%d k=%d kernel=%dx%d "
			    "pad=%d stride=%d", s->n, s->c, s->h, s->w, s->k, s->kh, s->kw,
			    s->pad, s->stride);
	struct ps_conv_shape t = *s;
	ps_conv_out(&t);
	if (t.oh < 1 || t.ow < 1 || s->h + 2 * s->pad < s->kh || s->w + 2 * s->pad < s->kw)
		return ps__ref_fail(c, -EINVAL, "conv2d: kernel %dx%d larger than padded input %dx%d",
			    s->kh, s->kw, s->h + 2 * s->pad, s->w + 2 * s->pad);
	if (t.oh != s->oh || t.ow != s->ow)
		return ps__ref_fail(c, -EINVAL, "conv2d: output %dx%d given, shape gives %dx%d "
			    "(call ps_conv_out)", s->oh, s->ow, t.oh, t.ow);
	return 0;
}

/* One image's im2col buffer: (c * kh * kw) rows of oh * ow floats. */
static size_t conv_col_bytes(const struct ps_conv_shape *s)
{
	return (size_t)s->c * s->kh * s->kw * (size_t)s->oh * s->ow * sizeof(float);
}

static int ref_conv2d_workspace(struct ps_compute *c, const struct ps_conv_shape *s,
				size_t *bytes)
{
	struct ps_conv_shape t = *s;
	int rc;

	*bytes = 0;
	ps_conv_out(&t);  /* callers may not have filled oh, ow */
	if ((rc = ps__ref_conv_check(c, &t)))
		return rc;
	*bytes = conv_col_bytes(&t);
	return 0;
}

static int conv_check_ws(struct ps_compute *c, const struct ps_conv_shape *s, const void *ws,
			 size_t ws_bytes)
{
	size_t need = conv_col_bytes(s);

	if (!ws || ws_bytes < need)
		return ps__ref_fail(c, -EINVAL, "conv2d: workspace of %zu bytes, %zu needed",
			    ws ? ws_bytes : 0, need);
	return 0;
}

/* The output columns [*lo, *hi) whose input column ox * stride - pad + kj
 * lies inside the image; outside it the padding reads as zero. */
static void conv_valid_range(const struct ps_conv_shape *s, int kj, int *lo, int *hi)
{
	int first = s->pad - kj;               /* need ox * stride >= first */
	int last = s->w - 1 + s->pad - kj;     /* need ox * stride <= last */

	*lo = first <= 0 ? 0 : (first + s->stride - 1) / s->stride;
	*hi = last < 0 ? 0 : last / s->stride + 1;
	if (*hi > s->ow)
		*hi = s->ow;
	if (*lo > *hi)
		*lo = *hi;
}

/* Unfolds one image x[c, h, w] into col (layout in the file comment).
 * Rows of the cnn presets are short (14, 28 floats), so the copies are
 * plain loops the compiler vectorizes rather than memcpy/memset calls. */
static void im2col(const struct ps_conv_shape *s, const float *restrict x, float *restrict col)
{
	size_t ohow = (size_t)s->oh * s->ow;
	int ow = s->ow, stride = s->stride;

	for (int ci = 0; ci < s->c; ci++) {
		for (int ki = 0; ki < s->kh; ki++) {
			for (int kj = 0; kj < s->kw; kj++) {
				float *row = col + (((size_t)ci * s->kh + ki) * s->kw + kj) * ohow;
				int lo, hi, off = kj - s->pad;
				conv_valid_range(s, kj, &lo, &hi);
				for (int oy = 0; oy < s->oh; oy++) {
					float *restrict d = row + (size_t)oy * ow;
					int iy = oy * stride - s->pad + ki;
					if (iy < 0 || iy >= s->h) {
						for (int ox = 0; ox < ow; ox++)
							d[ox] = 0.0f;
						continue;
					}
					const float *restrict src = x + ((size_t)ci * s->h + iy) * s->w;
					for (int ox = 0; ox < lo; ox++)
						d[ox] = 0.0f;
					if (stride == 1) {
						for (int ox = lo; ox < hi; ox++)
							d[ox] = src[ox + off];
					} else {
						for (int ox = lo; ox < hi; ox++)
							d[ox] = src[ox * stride + off];
					}
					for (int ox = hi; ox < ow; ox++)
						d[ox] = 0.0f;
				}
			}
		}
	}
}

/* Folds col back onto one image: dx[c, h, w] = sum of the col entries that
 * im2col read from each position (dx is zeroed first). */
static void col2im(const struct ps_conv_shape *s, const float *restrict col, float *restrict dx)
{
	size_t ohow = (size_t)s->oh * s->ow;
	int ow = s->ow, stride = s->stride;

	memset(dx, 0, (size_t)s->c * s->h * s->w * sizeof(float));
	for (int ci = 0; ci < s->c; ci++) {
		for (int ki = 0; ki < s->kh; ki++) {
			for (int kj = 0; kj < s->kw; kj++) {
				const float *row = col + (((size_t)ci * s->kh + ki) * s->kw + kj) * ohow;
				int lo, hi, off = kj - s->pad;
				conv_valid_range(s, kj, &lo, &hi);
				for (int oy = 0; oy < s->oh; oy++) {
					int iy = oy * stride - s->pad + ki;
					if (iy < 0 || iy >= s->h)
						continue;
					const float *restrict d = row + (size_t)oy * ow;
					float *restrict dst = dx + ((size_t)ci * s->h + iy) * s->w;
					if (stride == 1) {
						for (int ox = lo; ox < hi; ox++)
							dst[ox + off] += d[ox];
					} else {
						for (int ox = lo; ox < hi; ox++)
							dst[ox * stride + off] += d[ox];
					}
				}
			}
		}
	}
}

/* Per image: y_i[k, oh*ow] = W[k, c*kh*kw] x col_i + b. */
static int ref_conv2d_fwd(struct ps_compute *c, const struct ps_conv_shape *s, const float *x,
			  const float *W, const float *b, float *y, void *ws, size_t ws_bytes)
{
	int rc = ps__ref_conv_check(c, s);

	if (!rc)
		rc = conv_check_ws(c, s, ws, ws_bytes);
	if (rc)
		return rc;
	int ckk = s->c * s->kh * s->kw, ohow = s->oh * s->ow;
	size_t in_img = (size_t)s->c * s->h * s->w, out_img = (size_t)s->k * ohow;
	float *col = ws;

	for (int i = 0; i < s->n; i++) {
		float *yi = y + i * out_img;
		for (int k = 0; k < s->k; k++)
			for (int p = 0; p < ohow; p++)
				yi[(size_t)k * ohow + p] = b[k];
		im2col(s, x + i * in_img, col);
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s->k, ohow, ckk,
			    1.0f, W, ckk, col, ohow, 1.0f, yi, ohow);
	}
	return 0;
}

/* Per image, sharing the one col buffer: dW += alpha dy_i x col_i^T,
 * then col = W^T x dy_i folded back into dx_i; db = alpha times the sum of
 * dy over n, oh, ow. */
static int ref_conv2d_bwd(struct ps_compute *c, const struct ps_conv_shape *s, const float *x,
			  const float *W, const float *dy, float *dx, float *dW, float *db,
			  void *ws, size_t ws_bytes, float alpha)
{
	int rc = ps__ref_conv_check(c, s);

	if (!rc)
		rc = conv_check_ws(c, s, ws, ws_bytes);
	if (rc)
		return rc;
	int ckk = s->c * s->kh * s->kw, ohow = s->oh * s->ow;
	size_t in_img = (size_t)s->c * s->h * s->w, out_img = (size_t)s->k * ohow;
	float *col = ws;

	for (int k = 0; k < s->k; k++)
		db[k] = 0.0f;
	for (int i = 0; i < s->n; i++) {
		const float *dyi = dy + i * out_img;
		for (int k = 0; k < s->k; k++) {
			const float *r = dyi + (size_t)k * ohow;
			float sum = 0.0f;
			for (int p = 0; p < ohow; p++)
				sum += r[p];
			db[k] += sum;
		}
		im2col(s, x + i * in_img, col);
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s->k, ckk, ohow,
			    alpha, dyi, ohow, col, ohow, i ? 1.0f : 0.0f, dW, ckk);
		if (!dx)
			continue;
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ckk, ohow, s->k,
			    1.0f, W, ckk, dyi, ohow, 0.0f, col, ohow);
		col2im(s, col, dx + i * in_img);
	}
	for (int k = 0; k < s->k; k++)
		db[k] *= alpha;
	return 0;
}

/* ---- dense ---- */

int ps__ref_dense_check(struct ps_compute *c, int n, int in, int out)
{
	if (n < 1 || in < 1 || out < 1)
		return ps__ref_fail(c, -EINVAL, "dense: bad shape n=%d in=%d out=%d", n, in, out);
	return 0;
}

int ps__ref_dense_fwd(struct ps_compute *c, const float *x, const float *W, const float *b,
			 float *y, int n, int in, int out)
{
	int rc = ps__ref_dense_check(c, n, in, out);

	if (rc)
		return rc;
	for (int i = 0; i < n; i++)
		memcpy(y + (size_t)i * out, b, (size_t)out * sizeof(float));
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, out, in,
		    1.0f, x, in, W, out, 1.0f, y, out);
	return 0;
}

/* dW = alpha x^T dy, db = alpha times the column sums of dy, dx = dy W^T. */
int ps__ref_dense_bwd(struct ps_compute *c, const float *x, const float *W, const float *dy,
			 float *dx, float *dW, float *db, int n, int in, int out, float alpha)
{
	int rc = ps__ref_dense_check(c, n, in, out);

	if (rc)
		return rc;
	cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, in, out, n,
		    alpha, x, in, dy, out, 0.0f, dW, out);
	memcpy(db, dy, (size_t)out * sizeof(float));
	for (int i = 1; i < n; i++) {
		const float *r = dy + (size_t)i * out;
		for (int j = 0; j < out; j++)
			db[j] += r[j];
	}
	for (int j = 0; j < out; j++)
		db[j] *= alpha;
	if (dx)
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, in, out,
			    1.0f, dy, out, W, out, 0.0f, dx, in);
	return 0;
}

/* ---- max pooling ---- */

static int pool_check(struct ps_compute *c, const struct ps_pool_shape *s)
{
	if (s->n < 1 || s->c < 1 || s->size < 1 || s->h < s->size || s->w < s->size)
		return ps__ref_fail(c, -EINVAL, "maxpool: bad shape n=%d c=%d h=%d w=%d size=%d",
			    s->n, s->c, s->h, s->w, s->size);
	if (s->oh != s->h / s->size || s->ow != s->w / s->size)
		return ps__ref_fail(c, -EINVAL, "maxpool: output %dx%d given, shape gives %dx%d",
			    s->oh, s->ow, s->h / s->size, s->w / s->size);
	return 0;
}

/* One plane of 2x2 windows, the presets' pooling: the same scan order
 * and strict comparisons as the general loop below (the first of equal
 * maxima wins; a NaN first element stays), but with selects instead of
 * branches that mispredict on half the elements, so it vectorizes. */
__attribute__((optimize("O3"))) static void maxpool2_plane(const float *restrict xp,
							   float *restrict yp,
							   int32_t *restrict ip, int w, int oh,
							   int ow)
{
	for (int oy = 0; oy < oh; oy++) {
		const float *r0 = xp + (size_t)2 * oy * w, *r1 = r0 + w;
		int32_t base = 2 * oy * w;
		for (int ox = 0; ox < ow; ox++) {
			float m = r0[2 * ox], b = r0[2 * ox + 1], c = r1[2 * ox],
			      d = r1[2 * ox + 1];
			int32_t at = base + 2 * ox, best = at;
			int g = b > m;
			best = g ? at + 1 : best;
			m = g ? b : m;
			g = c > m;
			best = g ? at + w : best;
			m = g ? c : m;
			g = d > m;
			best = g ? at + w + 1 : best;
			m = g ? d : m;
			yp[oy * ow + ox] = m;
			ip[oy * ow + ox] = best;
		}
	}
}

int ps__ref_maxpool_fwd(struct ps_compute *c, const struct ps_pool_shape *s, const float *x,
			   float *y, int32_t *idx)
{
	int rc = pool_check(c, s);

	if (rc)
		return rc;
	size_t planes = (size_t)s->n * s->c, in_plane = (size_t)s->h * s->w;
	size_t out_plane = (size_t)s->oh * s->ow;

	if (s->size == 2) {
		for (size_t p = 0; p < planes; p++)
			maxpool2_plane(x + p * in_plane, y + p * out_plane, idx + p * out_plane,
				       s->w, s->oh, s->ow);
		return 0;
	}
	for (size_t p = 0; p < planes; p++) {
		const float *xp = x + p * in_plane;
		float *yp = y + p * out_plane;
		int32_t *ip = idx + p * out_plane;
		for (int oy = 0; oy < s->oh; oy++) {
			for (int ox = 0; ox < s->ow; ox++) {
				int y0 = oy * s->size, x0 = ox * s->size;
				int best = y0 * s->w + x0;
				float m = xp[best];
				for (int dy = 0; dy < s->size; dy++) {
					int at = (y0 + dy) * s->w + x0;
					for (int dx = 0; dx < s->size; dx++, at++) {
						if (xp[at] > m) {
							m = xp[at];
							best = at;
						}
					}
				}
				yp[oy * s->ow + ox] = m;
				ip[oy * s->ow + ox] = best;
			}
		}
	}
	return 0;
}

/* Whether idx entry (oy, ox) of a plane lies in its own window: rel - dy*w
 * in [0, size) for a row dy of the window (no division, no branch: this
 * runs for every output of every step). */
static inline int in_window(const struct ps_pool_shape *s, int32_t at, int oy, int ox)
{
	int rel = at - (oy * s->size * s->w + ox * s->size), in = 0;

	for (int dy = 0; dy < s->size; dy++)
		in |= (unsigned)(rel - dy * s->w) < (unsigned)s->size;
	return in;
}

/* Every index is checked before anything is written: one maxpool_fwd
 * cannot have produced (outside its own window) refuses the call and
 * leaves dx as it was. */
int ps__ref_maxpool_bwd(struct ps_compute *c, const struct ps_pool_shape *s, const float *dy,
			   const int32_t *idx, float *dx)
{
	int rc = pool_check(c, s), ok = 1;

	if (rc)
		return rc;
	size_t planes = (size_t)s->n * s->c, in_plane = (size_t)s->h * s->w;
	size_t out_plane = (size_t)s->oh * s->ow;

	for (size_t p = 0; p < planes; p++)
		for (int oy = 0; oy < s->oh; oy++)
			for (int ox = 0; ox < s->ow; ox++)
				ok &= in_window(s, idx[p * out_plane + oy * s->ow + ox], oy, ox);
	for (size_t o = 0; !ok && o < planes * out_plane; o++) {
		int oo = (int)(o % out_plane);
		if (!in_window(s, idx[o], oo / s->ow, oo % s->ow))
			return ps__ref_fail(c, -EINVAL, "maxpool: index %d outside its %dx%d window of the "
				    "%dx%d input (not from maxpool_fwd of this shape?)", idx[o],
				    s->size, s->size, s->h, s->w);
	}
	memset(dx, 0, planes * in_plane * sizeof(float));
	for (size_t p = 0; p < planes; p++) {
		float *dxp = dx + p * in_plane;
		for (size_t o = 0; o < out_plane; o++)
			dxp[idx[p * out_plane + o]] += dy[p * out_plane + o];
	}
	return 0;
}

/* ---- relu ---- */

/* Branch-free and vectorized (O3 versions the loops for aliasing, so in
 * place still works): a branch per element mispredicts on half the values
 * and cost a fifth of a cnn step. */
__attribute__((optimize("O3"))) int ps__ref_relu_fwd(struct ps_compute *c, const float *x,
							 float *y, size_t n)
{
	(void)c;
	for (size_t i = 0; i < n; i++) {
		float v = x[i];
		y[i] = v > 0.0f ? v : 0.0f;
	}
	return 0;
}

__attribute__((optimize("O3"))) int ps__ref_relu_bwd(struct ps_compute *c, const float *y,
							 const float *dy, float *dx, size_t n)
{
	(void)c;
	for (size_t i = 0; i < n; i++) {
		float g = dy[i];
		dx[i] = y[i] > 0.0f ? g : 0.0f;
	}
	return 0;
}

/* ---- loss ---- */

/* Per example: subtract the max logit so exp() cannot overflow; loss is
 * log(sum exp) - (logit[label] - max); dlogits = softmax - onehot. Labels
 * are all checked first so a bad batch writes nothing but the stats. */
int ps__ref_softmax_xent(struct ps_compute *c, const float *logits, const int32_t *labels,
			    int n, int classes, float *dlogits, struct ps_xent_stats *st)
{
	double total = 0.0;
	int right = 0;

	if (n < 1 || classes < 1)
		return ps__ref_fail(c, -EINVAL, "softmax_xent: bad shape n=%d classes=%d", n, classes);
	*st = (struct ps_xent_stats){ .bad_row = -1, .n = n };
	for (int i = 0; i < n; i++)
		if (labels[i] < 0 || labels[i] >= classes) {
			st->bad_row = i;
			st->bad_label = labels[i];
			return 0;
		}
	for (int i = 0; i < n; i++) {
		const float *z = logits + (size_t)i * classes;
		int arg = 0;
		for (int j = 1; j < classes; j++)
			if (z[j] > z[arg])
				arg = j;
		float max = z[arg];
		double sum = 0.0;
		for (int j = 0; j < classes; j++)
			sum += exp((double)z[j] - max);
		total += log(sum) - ((double)z[labels[i]] - max);
		right += arg == labels[i];
		if (!dlogits)
			continue;
		float *d = dlogits + (size_t)i * classes;
		double inv = 1.0 / sum;
		for (int j = 0; j < classes; j++)
			d[j] = (float)(exp((double)z[j] - max) * inv);
		d[labels[i]] -= 1.0f;
	}
	st->loss_sum = total;
	st->correct = right;
	return 0;
}

const struct ps_compute_ops ps_compute_ref_ops = {
	.name = "ref",
	.create = ref_create,
	.destroy = ref_destroy,
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
	.conv2d_workspace = ref_conv2d_workspace,
	.dense_fwd = ps__ref_dense_fwd,
	.dense_bwd = ps__ref_dense_bwd,
	.conv2d_fwd = ref_conv2d_fwd,
	.conv2d_bwd = ref_conv2d_bwd,
	.maxpool_fwd = ps__ref_maxpool_fwd,
	.maxpool_bwd = ps__ref_maxpool_bwd,
	.relu_fwd = ps__ref_relu_fwd,
	.relu_bwd = ps__ref_relu_bwd,
	.softmax_xent = ps__ref_softmax_xent,
	.embedding_bag_fwd = ps__cpu_embedding_bag_fwd,
	.embedding_bag_bwd = ps__cpu_embedding_bag_bwd,
};
