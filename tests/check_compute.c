/* check_compute.c - the compute backends (docs/architecture.md, Interfaces): every backward op
 * against central differences of its forward op, forward ops against naive
 * loops, softmax cross-entropy on inputs whose answer is known, and the
 * registry by name. The op cases run twice: on "ref" (the plain reference
 * the other backends are compared with, so it is the one these checks must
 * hold for first) and on "cpu" (oneDNN; check_compute_dnnl compares it with
 * ref much more tightly).
 *
 * The gradient checks use the scalar loss L = sum(y * r) for a fixed random
 * r, so dL/dy = r is what backward receives. Inputs are built away from the
 * kinks of relu (|x| >= 0.1) and maxpool (values 0.05 apart) so that a step
 * of eps = 1e-2 never crosses one. All data crosses through upload/download,
 * as it would on a device. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "compute.h"
#include "ps_err.h"
#include "test_util.h"

#define EPS 1e-2f
#define TOL 1e-2

static const struct ps_compute_ops *ops;
static struct ps_compute *cc;
static uint64_t rng_state;

static void setup(const char *backend)
{
	char err[256] = "";

	ck_assert_int_eq(ps_compute_load(backend, &ops, err, sizeof(err)), 0);
	ck_assert_ptr_nonnull(ops);
	ck_assert_int_eq(ops->create(&cc, NULL, err, sizeof(err)), 0);
	ck_assert_ptr_nonnull(cc);
	rng_state = 0x9e3779b97f4a7c15ull;
}

static void setup_ref(void)
{
	setup("ref");
}

static void setup_cpu(void)
{
	setup("cpu");
}

static void teardown(void)
{
	ops->destroy(cc);
	cc = NULL;
}

/* Uniform in [lo, hi), deterministic (xorshift64*). */
static float urand(float lo, float hi)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	uint64_t r = rng_state * 0x2545f4914f6cdd1dull;
	return lo + (hi - lo) * (float)((r >> 40) * (1.0 / 16777216.0));
}

static int irand(int lo, int hi)  /* inclusive */
{
	int v = lo + (int)(urand(0.0f, 1.0f) * (float)(hi - lo + 1));
	return v > hi ? hi : v;
}

/* A host array and its backend copy. */
struct tensor {
	float *h, *d;
	size_t n;
};

static void t_init(struct tensor *t, size_t n)
{
	t->n = n;
	t->h = calloc(n ? n : 1, sizeof(float));
	t->d = ops->alloc(cc, n * sizeof(float));
	ck_assert_ptr_nonnull(t->h);
	ck_assert_ptr_nonnull(t->d);
}

static void t_fill(struct tensor *t, float lo, float hi)
{
	for (size_t i = 0; i < t->n; i++)
		t->h[i] = urand(lo, hi);
}

static void t_up(struct tensor *t)
{
	ck_assert_int_eq(ops->upload(cc, t->d, t->h, t->n * sizeof(float)), 0);
	ck_assert_int_eq(ops->sync(cc), 0);
}

static void t_down(struct tensor *t)
{
	ck_assert_int_eq(ops->download(cc, t->h, t->d, t->n * sizeof(float)), 0);
	ck_assert_int_eq(ops->sync(cc), 0);
}

/* Fills the backend copy with NaN, so an op that accumulates instead of
 * overwriting, or skips an element, leaves a NaN the checks will see. */
static void t_poison(struct tensor *t)
{
	for (size_t i = 0; i < t->n; i++)
		t->h[i] = NAN;
	t_up(t);
}

static void t_free(struct tensor *t)
{
	free(t->h);
	ops->free(cc, t->d);
	memset(t, 0, sizeof(*t));
}

/* ---- gradient checks by central differences ---- */

enum op { OP_DENSE, OP_CONV, OP_POOL, OP_RELU };

struct gcase {
	enum op op;
	int n, in, out;                 /* dense */
	struct ps_conv_shape cs;
	struct ps_pool_shape ps;
	size_t count;                   /* relu */
	struct tensor x, W, b, y, r, dx, dW, db;
	int32_t *idx;
	void *ws;
	size_t ws_bytes;
};

static size_t conv_in(const struct ps_conv_shape *s)
{
	return (size_t)s->n * s->c * s->h * s->w;
}

static size_t conv_out(const struct ps_conv_shape *s)
{
	return (size_t)s->n * s->k * s->oh * s->ow;
}

static void g_init(struct gcase *g)
{
	size_t nx = 0, ny = 0, nw = 0, nb = 0;

	switch (g->op) {
	case OP_DENSE:
		nx = (size_t)g->n * g->in;
		ny = (size_t)g->n * g->out;
		nw = (size_t)g->in * g->out;
		nb = (size_t)g->out;
		break;
	case OP_CONV:
		ps_conv_out(&g->cs);
		nx = conv_in(&g->cs);
		ny = conv_out(&g->cs);
		nw = (size_t)g->cs.k * g->cs.c * g->cs.kh * g->cs.kw;
		nb = (size_t)g->cs.k;
		ck_assert_int_eq(ops->conv2d_workspace(cc, &g->cs, &g->ws_bytes), 0);
		g->ws = ops->alloc(cc, g->ws_bytes);
		ck_assert_ptr_nonnull(g->ws);
		break;
	case OP_POOL:
		g->ps.oh = g->ps.h / g->ps.size;
		g->ps.ow = g->ps.w / g->ps.size;
		nx = (size_t)g->ps.n * g->ps.c * g->ps.h * g->ps.w;
		ny = (size_t)g->ps.n * g->ps.c * g->ps.oh * g->ps.ow;
		g->idx = (int32_t *)ops->alloc(cc, ny * sizeof(int32_t));
		ck_assert_ptr_nonnull(g->idx);
		break;
	case OP_RELU:
		nx = ny = g->count;
		break;
	}
	t_init(&g->x, nx);
	t_init(&g->y, ny);
	t_init(&g->r, ny);
	t_init(&g->dx, nx);
	t_init(&g->W, nw);
	t_init(&g->dW, nw);
	t_init(&g->b, nb);
	t_init(&g->db, nb);
	t_fill(&g->x, -1.0f, 1.0f);
	t_fill(&g->W, -1.0f, 1.0f);
	t_fill(&g->b, -1.0f, 1.0f);
	t_fill(&g->r, -1.0f, 1.0f);
	if (g->op == OP_RELU) {
		/* |x| in [0.1, 1): no step of EPS crosses zero. */
		for (size_t i = 0; i < g->x.n; i++)
			g->x.h[i] = (urand(0.0f, 1.0f) < 0.5f ? -1.0f : 1.0f) * urand(0.1f, 1.0f);
	} else if (g->op == OP_POOL) {
		/* A shuffled ramp 0.05 apart: no step of EPS changes which is the max. */
		for (size_t i = 0; i < g->x.n; i++)
			g->x.h[i] = 0.05f * (float)i - 1.0f;
		for (size_t i = g->x.n - 1; i > 0; i--) {
			size_t j = (size_t)irand(0, (int)i);
			float t = g->x.h[i];
			g->x.h[i] = g->x.h[j];
			g->x.h[j] = t;
		}
	}
	t_up(&g->x);
	t_up(&g->W);
	t_up(&g->b);
	t_up(&g->r);
}

static void g_free(struct gcase *g)
{
	t_free(&g->x);
	t_free(&g->y);
	t_free(&g->r);
	t_free(&g->dx);
	t_free(&g->W);
	t_free(&g->dW);
	t_free(&g->b);
	t_free(&g->db);
	ops->free(cc, g->idx);
	ops->free(cc, g->ws);
}

static void g_fwd(struct gcase *g)
{
	int rc = -1;

	switch (g->op) {
	case OP_DENSE:
		rc = ops->dense_fwd(cc, g->x.d, g->W.d, g->b.d, g->y.d, g->n, g->in, g->out);
		break;
	case OP_CONV:
		rc = ops->conv2d_fwd(cc, &g->cs, g->x.d, g->W.d, g->b.d, g->y.d, g->ws,
				     g->ws_bytes);
		break;
	case OP_POOL:
		rc = ops->maxpool_fwd(cc, &g->ps, g->x.d, g->y.d, g->idx);
		break;
	case OP_RELU:
		rc = ops->relu_fwd(cc, g->x.d, g->y.d, g->count);
		break;
	}
	ck_assert_msg(rc == 0, "forward failed: %s (%s)", ps_strerror(rc), cc->err);
}

/* L = sum(y * r) for the current host x, W, b, summed in double. */
static double g_loss(struct gcase *g)
{
	double L = 0.0;

	t_up(&g->x);
	t_up(&g->W);
	t_up(&g->b);
	g_fwd(g);
	t_down(&g->y);
	for (size_t i = 0; i < g->y.n; i++)
		L += (double)g->y.h[i] * g->r.h[i];
	return L;
}

/* Backward with dy = r at the unperturbed point; dx NULL when with_dx is 0;
 * parameter gradients scaled by alpha. */
static void g_bwd_alpha(struct gcase *g, int with_dx, float alpha)
{
	float *dx = with_dx ? g->dx.d : NULL;
	int rc = -1;

	g_loss(g);
	t_poison(&g->dx);
	t_poison(&g->dW);
	t_poison(&g->db);
	switch (g->op) {
	case OP_DENSE:
		rc = ops->dense_bwd(cc, g->x.d, g->W.d, g->r.d, dx, g->dW.d, g->db.d, g->n,
				    g->in, g->out, alpha);
		break;
	case OP_CONV:
		rc = ops->conv2d_bwd(cc, &g->cs, g->x.d, g->W.d, g->r.d, dx, g->dW.d, g->db.d,
				     g->ws, g->ws_bytes, alpha);
		break;
	case OP_POOL:
		rc = ops->maxpool_bwd(cc, &g->ps, g->r.d, g->idx, g->dx.d);
		break;
	case OP_RELU:
		rc = ops->relu_bwd(cc, g->y.d, g->r.d, g->dx.d, g->count);
		break;
	}
	ck_assert_msg(rc == 0, "backward failed: %s (%s)", ps_strerror(rc), cc->err);
	t_down(&g->dx);
	t_down(&g->dW);
	t_down(&g->db);
}

static void g_bwd(struct gcase *g, int with_dx)
{
	g_bwd_alpha(g, with_dx, 1.0f);
}

/* Compares grad with (L(p + eps) - L(p - eps)) / (the step really taken in
 * float) for every element of p. */
static void g_fd(struct gcase *g, struct tensor *p, const struct tensor *grad, const char *what,
		 const char *name)
{
	for (size_t i = 0; i < p->n; i++) {
		float v = p->h[i], hi = v + EPS, lo = v - EPS;
		p->h[i] = hi;
		double lp = g_loss(g);
		p->h[i] = lo;
		double lm = g_loss(g);
		p->h[i] = v;
		double num = (lp - lm) / ((double)hi - (double)lo);
		double ana = grad->h[i];
		double scale = fmax(fmax(fabs(num), fabs(ana)), 0.1);
		ck_assert_msg(fabs(num - ana) <= TOL * scale,
			      "%s %s[%zu]: analytic %.6g, numeric %.6g", name, what, i, ana, num);
	}
	g_loss(g);  /* leave the backend copies at the unperturbed point */
}

/* Runs the full check of one case: every gradient by differences, and the
 * parameter gradients unchanged when dx is not asked for. */
static void g_check(struct gcase *g, const char *name)
{
	g_init(g);
	g_bwd(g, 1);
	g_fd(g, &g->x, &g->dx, "dx", name);
	if (g->op == OP_DENSE || g->op == OP_CONV) {
		g_fd(g, &g->W, &g->dW, "dW", name);
		g_fd(g, &g->b, &g->db, "db", name);
		float *dW = malloc(g->dW.n * sizeof(float)), *db = malloc(g->db.n * sizeof(float));
		ck_assert_ptr_nonnull(dW);
		ck_assert_ptr_nonnull(db);
		memcpy(dW, g->dW.h, g->dW.n * sizeof(float));
		memcpy(db, g->db.h, g->db.n * sizeof(float));
		g_bwd(g, 0);
		ck_assert_msg(memcmp(dW, g->dW.h, g->dW.n * sizeof(float)) == 0,
			      "%s: dW differs when dx is NULL", name);
		ck_assert_msg(memcmp(db, g->db.h, g->db.n * sizeof(float)) == 0,
			      "%s: db differs when dx is NULL", name);
		/* alpha scales dW and db (a power of two: exactly), never dx */
		float *dx = malloc(g->dx.n * sizeof(float));
		ck_assert_ptr_nonnull(dx);
		g_bwd(g, 1);
		memcpy(dx, g->dx.h, g->dx.n * sizeof(float));
		g_bwd_alpha(g, 1, 0.25f);
		for (size_t i = 0; i < g->dW.n; i++)
			ck_assert_msg(g->dW.h[i] == 0.25f * dW[i], "%s: dW[%zu] %g with alpha 1/4, "
				      "%g without", name, i, g->dW.h[i], dW[i]);
		for (size_t i = 0; i < g->db.n; i++)
			ck_assert_msg(g->db.h[i] == 0.25f * db[i], "%s: db[%zu] %g with alpha 1/4, "
				      "%g without", name, i, g->db.h[i], db[i]);
		ck_assert_msg(memcmp(dx, g->dx.h, g->dx.n * sizeof(float)) == 0,
			      "%s: alpha changed dx", name);
		free(dx);
		free(dW);
		free(db);
	}
	g_free(g);
}

START_TEST(test_grad_dense)
{
	struct gcase g = { .op = OP_DENSE, .n = 3, .in = 5, .out = 4 };
	g_check(&g, "dense 3x5->4");
	struct gcase g1 = { .op = OP_DENSE, .n = 1, .in = 7, .out = 1 };
	g_check(&g1, "dense 1x7->1");
}
END_TEST

/* Shapes for conv: pad 0 and 2, stride 1 and 2, odd sizes so stride 2
 * leaves input rows and columns unread, a non-square kernel. */
static const struct ps_conv_shape conv_cases[] = {
	{ .n = 2, .c = 3, .h = 7, .w = 6, .k = 4, .kh = 3, .kw = 3, .pad = 0, .stride = 1 },
	{ .n = 2, .c = 3, .h = 7, .w = 6, .k = 4, .kh = 3, .kw = 3, .pad = 2, .stride = 1 },
	{ .n = 2, .c = 3, .h = 7, .w = 6, .k = 4, .kh = 3, .kw = 3, .pad = 0, .stride = 2 },
	{ .n = 2, .c = 2, .h = 8, .w = 7, .k = 3, .kh = 3, .kw = 3, .pad = 2, .stride = 2 },
	{ .n = 2, .c = 2, .h = 6, .w = 6, .k = 3, .kh = 5, .kw = 5, .pad = 2, .stride = 1 },
	{ .n = 3, .c = 1, .h = 5, .w = 8, .k = 2, .kh = 2, .kw = 4, .pad = 1, .stride = 2 },
};

START_TEST(test_grad_conv2d)
{
	const struct ps_conv_shape *s = &conv_cases[_i];
	struct gcase g = { .op = OP_CONV, .cs = *s };
	char name[128];

	snprintf(name, sizeof(name), "conv2d n%d c%d %dx%d k%d %dx%d pad %d stride %d", s->n,
		 s->c, s->h, s->w, s->k, s->kh, s->kw, s->pad, s->stride);
	g_check(&g, name);
}
END_TEST

START_TEST(test_grad_maxpool)
{
	struct gcase g = { .op = OP_POOL, .ps = { .n = 2, .c = 3, .h = 7, .w = 6, .size = 2 } };
	g_check(&g, "maxpool 7x6 size 2");
	struct gcase g3 = { .op = OP_POOL, .ps = { .n = 1, .c = 2, .h = 9, .w = 10, .size = 3 } };
	g_check(&g3, "maxpool 9x10 size 3");
}
END_TEST

START_TEST(test_grad_relu)
{
	struct gcase g = { .op = OP_RELU, .count = 97 };
	g_check(&g, "relu");
}
END_TEST

/* dlogits against differences of the summed loss (n times the mean). */
START_TEST(test_grad_softmax_xent)
{
	enum { N = 4, C = 5 };
	struct tensor z, dz;
	int32_t lab[N] = { 0, 4, 2, 2 }, *dlab;
	float loss, lp, lm;
	int correct;

	t_init(&z, N * C);
	t_init(&dz, N * C);
	t_fill(&z, -2.0f, 2.0f);
	t_up(&z);
	dlab = (int32_t *)ops->alloc(cc, sizeof(lab));
	ck_assert_ptr_nonnull(dlab);
	ck_assert_int_eq(ops->upload(cc, dlab, lab, sizeof(lab)), 0);
	t_poison(&dz);
	ck_assert_int_eq(ps_compute_xent(cc, z.d, dlab, N, C, dz.d, &loss, &correct), 0);
	t_down(&dz);
	for (size_t i = 0; i < z.n; i++) {
		float v = z.h[i], hi = v + EPS, lo = v - EPS;
		z.h[i] = hi;
		t_up(&z);
		ck_assert_int_eq(ps_compute_xent(cc, z.d, dlab, N, C, NULL, &lp, &correct), 0);
		z.h[i] = lo;
		t_up(&z);
		ck_assert_int_eq(ps_compute_xent(cc, z.d, dlab, N, C, NULL, &lm, &correct), 0);
		z.h[i] = v;
		double num = N * ((double)lp - lm) / ((double)hi - (double)lo);
		double scale = fmax(fmax(fabs(num), fabs(dz.h[i])), 0.1);
		ck_assert_msg(fabs(num - dz.h[i]) <= TOL * scale,
			      "softmax_xent dlogits[%zu]: analytic %.6g, numeric %.6g", i,
			      dz.h[i], num);
	}
	ops->free(cc, dlab);
	t_free(&z);
	t_free(&dz);
}
END_TEST

/* ---- forward ops against naive loops ---- */

static void naive_conv_fwd(const struct ps_conv_shape *s, const float *x, const float *W,
			   const float *b, double *y)
{
	for (int n = 0; n < s->n; n++)
	for (int k = 0; k < s->k; k++)
	for (int oy = 0; oy < s->oh; oy++)
	for (int ox = 0; ox < s->ow; ox++) {
		double acc = b[k];
		for (int c = 0; c < s->c; c++)
		for (int ki = 0; ki < s->kh; ki++)
		for (int kj = 0; kj < s->kw; kj++) {
			int iy = oy * s->stride - s->pad + ki, ix = ox * s->stride - s->pad + kj;
			if (iy < 0 || iy >= s->h || ix < 0 || ix >= s->w)
				continue;
			acc += (double)x[((n * s->c + c) * s->h + iy) * s->w + ix] *
			       W[((k * s->c + c) * s->kh + ki) * s->kw + kj];
		}
		y[((n * s->k + k) * s->oh + oy) * s->ow + ox] = acc;
	}
}

/* The direct form of the three gradients, for shapes too big to difference. */
static void naive_conv_bwd(const struct ps_conv_shape *s, const float *x, const float *W,
			   const float *dy, double *dx, double *dW, double *db)
{
	memset(dx, 0, conv_in(s) * sizeof(double));
	memset(dW, 0, (size_t)s->k * s->c * s->kh * s->kw * sizeof(double));
	memset(db, 0, (size_t)s->k * sizeof(double));
	for (int n = 0; n < s->n; n++)
	for (int k = 0; k < s->k; k++)
	for (int oy = 0; oy < s->oh; oy++)
	for (int ox = 0; ox < s->ow; ox++) {
		double g = dy[((n * s->k + k) * s->oh + oy) * s->ow + ox];
		db[k] += g;
		for (int c = 0; c < s->c; c++)
		for (int ki = 0; ki < s->kh; ki++)
		for (int kj = 0; kj < s->kw; kj++) {
			int iy = oy * s->stride - s->pad + ki, ix = ox * s->stride - s->pad + kj;
			if (iy < 0 || iy >= s->h || ix < 0 || ix >= s->w)
				continue;
			size_t xi = (size_t)((n * s->c + c) * s->h + iy) * s->w + ix;
			size_t wi = (size_t)((k * s->c + c) * s->kh + ki) * s->kw + kj;
			dx[xi] += g * W[wi];
			dW[wi] += g * x[xi];
		}
	}
}

static void expect_close(const float *got, const double *want, size_t n, double tol,
			 const char *what, const char *name)
{
	for (size_t i = 0; i < n; i++)
		ck_assert_msg(fabs(got[i] - want[i]) <= tol * (1.0 + fabs(want[i])),
			      "%s %s[%zu]: got %.7g, want %.7g", name, what, i, got[i], want[i]);
}

/* Random shapes, including 1x1 kernels, kernels as large as the padded
 * input, strides up to 3 and a batch of one. */
START_TEST(test_conv2d_vs_naive)
{
	for (int t = 0; t < 40; t++) {
		struct gcase g = { .op = OP_CONV };
		struct ps_conv_shape *s = &g.cs;
		char name[128];
		do {
			*s = (struct ps_conv_shape){ .n = irand(1, 3), .c = irand(1, 4),
						     .h = irand(1, 11), .w = irand(1, 11),
						     .k = irand(1, 6), .kh = irand(1, 5),
						     .kw = irand(1, 5), .pad = irand(0, 2),
						     .stride = irand(1, 3) };
		} while (s->h + 2 * s->pad < s->kh || s->w + 2 * s->pad < s->kw);
		g_init(&g);
		snprintf(name, sizeof(name), "conv2d n%d c%d %dx%d k%d %dx%d pad %d stride %d",
			 s->n, s->c, s->h, s->w, s->k, s->kh, s->kw, s->pad, s->stride);
		size_t nx = g.x.n, ny = g.y.n;
		double *y = malloc(ny * sizeof(double)), *dx = malloc(nx * sizeof(double));
		double *dW = malloc(g.W.n * sizeof(double)), *db = malloc(g.b.n * sizeof(double));
		ck_assert(y && dx && dW && db);
		g_bwd(&g, 1);  /* runs the forward first: y is downloaded */
		naive_conv_fwd(s, g.x.h, g.W.h, g.b.h, y);
		expect_close(g.y.h, y, ny, 1e-5, "y", name);
		naive_conv_bwd(s, g.x.h, g.W.h, g.r.h, dx, dW, db);
		expect_close(g.dx.h, dx, nx, 1e-5, "dx", name);
		expect_close(g.dW.h, dW, g.W.n, 1e-5, "dW", name);
		expect_close(g.db.h, db, g.b.n, 1e-5, "db", name);
		free(y);
		free(dx);
		free(dW);
		free(db);
		g_free(&g);
	}
}
END_TEST

START_TEST(test_dense_vs_naive)
{
	struct gcase g = { .op = OP_DENSE, .n = 9, .in = 37, .out = 13 };
	double *y;

	g_init(&g);
	y = malloc(g.y.n * sizeof(double));
	ck_assert_ptr_nonnull(y);
	g_loss(&g);
	for (int i = 0; i < g.n; i++)
		for (int j = 0; j < g.out; j++) {
			double acc = g.b.h[j];
			for (int k = 0; k < g.in; k++)
				acc += (double)g.x.h[i * g.in + k] * g.W.h[k * g.out + j];
			y[i * g.out + j] = acc;
		}
	expect_close(g.y.h, y, g.y.n, 1e-5, "y", "dense 9x37->13");
	free(y);
	g_free(&g);
}
END_TEST

/* Each pooled value is the max of its window, idx points at it, and the
 * rows and columns past the last whole window get no gradient. */
START_TEST(test_maxpool_vs_naive)
{
	struct gcase g = { .op = OP_POOL, .ps = { .n = 2, .c = 2, .h = 7, .w = 5, .size = 2 } };
	const struct ps_pool_shape *s = &g.ps;

	g_init(&g);
	g_bwd(&g, 1);
	for (int p = 0; p < s->n * s->c; p++)
		for (int oy = 0; oy < s->oh; oy++)
			for (int ox = 0; ox < s->ow; ox++) {
				float m = -INFINITY;
				for (int i = 0; i < s->size; i++)
					for (int j = 0; j < s->size; j++) {
						int iy = oy * s->size + i, ix = ox * s->size + j;
						m = fmaxf(m, g.x.h[(p * s->h + iy) * s->w + ix]);
					}
				ck_assert_float_eq(g.y.h[(p * s->oh + oy) * s->ow + ox], m);
			}
	for (int p = 0; p < s->n * s->c; p++) {
		for (int ix = 0; ix < s->w; ix++)
			ck_assert_float_eq(g.dx.h[(p * s->h + s->h - 1) * s->w + ix], 0.0f);
		for (int iy = 0; iy < s->h; iy++)
			ck_assert_float_eq(g.dx.h[(p * s->h + iy) * s->w + s->w - 1], 0.0f);
	}
	g_free(&g);
}
END_TEST

/* Ties and NaNs: idx names the first maximum in scan order (row by row)
 * and a NaN first in its window stays, for the 2x2 windows (their own
 * loop) and size 3 alike, checked against a plain scan. */
START_TEST(test_maxpool_ties_first)
{
	static const int sizes[] = { 2, 3 };
	struct ps_pool_shape s = { .n = 2, .c = 3, .h = 9, .w = 7 };
	size_t nx = (size_t)s.n * s.c * s.h * s.w;
	float *x = malloc(nx * sizeof(float)), *y = malloc(nx * sizeof(float));
	int32_t *idx = malloc(nx * sizeof(int32_t));
	float *xd = ops->alloc(cc, nx * sizeof(float)), *yd = ops->alloc(cc, nx * sizeof(float));
	int32_t *idxd = (int32_t *)ops->alloc(cc, nx * sizeof(int32_t));
	uint32_t r = 12345;

	ck_assert(x && y && idx && xd && yd && idxd);
	for (size_t i = 0; i < nx; i++) {
		r = r * 1664525u + 1013904223u;
		x[i] = (float)((r >> 24) % 3); /* 0, 1, 2: ties in most windows */
		if ((r >> 8) % 23 == 0)
			x[i] = NAN;
	}
	ck_assert_int_eq(ops->upload(cc, xd, x, nx * sizeof(float)), 0);
	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		s.size = sizes[k];
		s.oh = s.h / s.size;
		s.ow = s.w / s.size;
		size_t no = (size_t)s.n * s.c * s.oh * s.ow;
		ck_assert_int_eq(ops->maxpool_fwd(cc, &s, xd, yd, idxd), 0);
		ck_assert_int_eq(ops->download(cc, y, yd, no * sizeof(float)), 0);
		ck_assert_int_eq(ops->download(cc, idx, idxd, no * sizeof(int32_t)), 0);
		for (int p = 0; p < s.n * s.c; p++)
			for (int oy = 0; oy < s.oh; oy++)
				for (int ox = 0; ox < s.ow; ox++) {
					const float *xp = x + (size_t)p * s.h * s.w;
					int best = oy * s.size * s.w + ox * s.size;
					for (int i = 0; i < s.size; i++)
						for (int j = 0; j < s.size; j++) {
							int at = (oy * s.size + i) * s.w + ox * s.size + j;
							if (xp[at] > xp[best])
								best = at;
						}
					size_t o = ((size_t)p * s.oh + oy) * s.ow + ox;
					ck_assert_msg(idx[o] == best, "size %d plane %d (%d,%d): idx %d, "
						      "first maximum at %d", s.size, p, oy, ox, idx[o], best);
					ck_assert_msg(memcmp(&y[o], &xp[best], sizeof(float)) == 0,
						      "size %d plane %d (%d,%d): value", s.size, p, oy, ox);
				}
	}
	ops->free(cc, xd);
	ops->free(cc, yd);
	ops->free(cc, idxd);
	free(x);
	free(y);
	free(idx);
}
END_TEST

/* ---- softmax cross-entropy on known answers ---- */

START_TEST(test_softmax_known)
{
	enum { N = 3, C = 10 };
	float z[N * C], dz[N * C], loss = -1.0f, *dzd, *zd;
	int32_t lab[N] = { 0, 7, 9 }, *labd;
	int correct = -1;

	zd = ops->alloc(cc, sizeof(z));
	dzd = ops->alloc(cc, sizeof(dz));
	labd = (int32_t *)ops->alloc(cc, sizeof(lab));
	ck_assert(zd && dzd && labd);
	ck_assert_int_eq(ops->upload(cc, labd, lab, sizeof(lab)), 0);

	/* Equal logits: loss ln(C), gradient 1/C - onehot, argmax the first. */
	for (int i = 0; i < N * C; i++)
		z[i] = 3.0f;
	ck_assert_int_eq(ops->upload(cc, zd, z, sizeof(z)), 0);
	ck_assert_int_eq(ps_compute_xent(cc, zd, labd, N, C, dzd, &loss, &correct), 0);
	ck_assert_int_eq(ops->download(cc, dz, dzd, sizeof(dz)), 0);
	ck_assert_int_eq(ops->sync(cc), 0);
	ck_assert_float_eq_tol(loss, logf((float)C), 1e-6f);
	ck_assert_int_eq(correct, 1);
	for (int i = 0; i < N; i++)
		for (int j = 0; j < C; j++)
			ck_assert_float_eq_tol(dz[i * C + j],
					       0.1f - (j == lab[i] ? 1.0f : 0.0f), 1e-7f);

	/* Logits 0 and ln 3: p(label) = 3/4. Huge logits must not overflow. */
	float z2[4] = { 0.0f, logf(3.0f), 1000.0f, -1000.0f };
	int32_t lab2[2] = { 1, 0 };
	ck_assert_int_eq(ops->upload(cc, zd, z2, sizeof(z2)), 0);
	ck_assert_int_eq(ops->upload(cc, labd, lab2, sizeof(lab2)), 0);
	ck_assert_int_eq(ps_compute_xent(cc, zd, labd, 2, 2, NULL, &loss, &correct), 0);
	ck_assert_float_eq_tol(loss, -logf(0.75f) / 2.0f, 1e-6f);
	ck_assert_int_eq(correct, 2);
	ck_assert_int_eq(ps_compute_xent(cc, zd + 2, labd + 1, 1, 2, dzd, &loss, &correct), 0);
	ck_assert(isfinite(loss));
	ck_assert_float_eq_tol(loss, 0.0f, 1e-6f);

	/* A label outside [0, classes) is refused with a reason, and nothing
	 * is written: dlogits keeps its poison. */
	int32_t bad[2][2] = { { 0, 2 }, { -1, 0 } };
	float poison[4] = { 7.0f, 7.0f, 7.0f, 7.0f }, after[4];
	for (int t = 0; t < 2; t++) {
		cc->err[0] = '\0';
		ck_assert_int_eq(ops->upload(cc, labd, bad[t], sizeof(bad[t])), 0);
		ck_assert_int_eq(ops->upload(cc, dzd, poison, sizeof(poison)), 0);
		int rc = ps_compute_xent(cc, zd, labd, 2, 2, dzd, &loss, &correct);
		ck_assert_int_eq(rc, -EINVAL);
		ck_assert_msg(strstr(cc->err, "outside [0, 2)"), "reason: %s", cc->err);
		ck_assert_int_eq(ops->download(cc, after, dzd, sizeof(after)), 0);
		ck_assert_int_eq(ops->sync(cc), 0);
		ck_assert_msg(memcmp(after, poison, sizeof(after)) == 0,
			      "dlogits written for a batch with a bad label");
	}
	/* A non-finite logit: PS_ENOFINITE, with a reason. */
	float nanz[4] = { 0.0f, NAN, 1.0f, 2.0f };
	int32_t good[2] = { 0, 1 };
	ck_assert_int_eq(ops->upload(cc, zd, nanz, sizeof(nanz)), 0);
	ck_assert_int_eq(ops->upload(cc, labd, good, sizeof(good)), 0);
	ck_assert_int_eq(ps_compute_xent(cc, zd, labd, 2, 2, dzd, &loss, &correct), PS_ENOFINITE);
	ck_assert_msg(strstr(cc->err, "not finite"), "reason: %s", cc->err);
	ops->free(cc, zd);
	ops->free(cc, dzd);
	ops->free(cc, labd);
}
END_TEST

/* ---- memory, small ops, refusals ---- */

START_TEST(test_memory_and_misc)
{
	float h[5] = { 1, -2, 3, -4, 5 }, out[5];
	float *a = ops->alloc(cc, 5 * sizeof(float)), *b = ops->alloc(cc, 1000);
	void *p = ops->host_alloc(cc, 3);

	ck_assert(a && b && p);
	ck_assert_uint_eq((uintptr_t)a % 256, 0);
	ck_assert_uint_eq((uintptr_t)b % 256, 0);
	ck_assert_int_eq(ops->upload(cc, a, h, sizeof(h)), 0);
	ck_assert_int_eq(ops->scale(cc, a, a, -2.0f, 5), 0);
	ck_assert_int_eq(ops->download(cc, out, a, sizeof(out)), 0);
	ck_assert_int_eq(ops->sync(cc), 0);
	for (int i = 0; i < 5; i++)
		ck_assert_float_eq(out[i], -2.0f * h[i]);
	ck_assert_int_eq(ops->zero(cc, a, 5), 0);
	ck_assert_int_eq(ops->download(cc, out, a, sizeof(out)), 0);
	ck_assert_int_eq(ops->sync(cc), 0);
	for (int i = 0; i < 5; i++)
		ck_assert_float_eq(out[i], 0.0f);
	ops->free(cc, a);
	ops->free(cc, b);
	ops->free(cc, NULL);
	ops->host_free(cc, p);
	ops->host_free(cc, NULL);

	/* A workspace smaller than conv2d_workspace() and a shape whose output
	 * was not computed are refused, with a reason, before anything runs. */
	struct gcase g = { .op = OP_CONV, .cs = conv_cases[1] };
	g_init(&g);
	cc->err[0] = '\0';
	ck_assert_int_lt(ops->conv2d_fwd(cc, &g.cs, g.x.d, g.W.d, g.b.d, g.y.d, g.ws,
					 g.ws_bytes - 1), 0);
	ck_assert(cc->err[0] != '\0');
	struct ps_conv_shape bad = g.cs;
	bad.oh++;
	ck_assert_int_lt(ops->conv2d_fwd(cc, &bad, g.x.d, g.W.d, g.b.d, g.y.d, g.ws,
					 g.ws_bytes), 0);
	ck_assert_int_lt(ops->dense_fwd(cc, g.x.d, g.W.d, g.b.d, g.y.d, 0, 3, 3), 0);
	g_free(&g);
}
END_TEST

/* An index maxpool_fwd cannot have written is refused, naming it, and dx
 * keeps what it held: past the plane, negative, or inside the plane but in
 * another output's window. */
START_TEST(test_maxpool_bad_index)
{
	struct ps_pool_shape s = { .n = 1, .c = 2, .h = 4, .w = 6, .size = 2, .oh = 2, .ow = 3 };
	float dy[12], dx[48], *ddy = ops->alloc(cc, sizeof(dy)), *ddx = ops->alloc(cc, sizeof(dx));
	int32_t good[12], *didx = (int32_t *)ops->alloc(cc, sizeof(good));
	const int32_t bad[] = { 24, -1, 0 };  /* 0: the first window's, given to another */

	ck_assert(ddy && ddx && didx);
	for (int p = 0; p < 2; p++)
		for (int oy = 0; oy < 2; oy++)
			for (int ox = 0; ox < 3; ox++)
				good[(p * 2 + oy) * 3 + ox] = (2 * oy + 1) * 6 + 2 * ox + 1;
	for (int i = 0; i < 12; i++)
		dy[i] = (float)(i + 1);
	ck_assert_int_eq(ops->upload(cc, ddy, dy, sizeof(dy)), 0);
	ck_assert_int_eq(ops->upload(cc, didx, good, sizeof(good)), 0);
	ck_assert_int_eq(ops->maxpool_bwd(cc, &s, ddy, didx, ddx), 0);
	ck_assert_int_eq(ops->download(cc, dx, ddx, sizeof(dx)), 0);
	ck_assert_float_eq(dx[7], 1.0f);        /* plane 0, (1, 1) */
	ck_assert_float_eq(dx[24 + 23], 12.0f); /* plane 1, (3, 5) */
	for (size_t t = 0; t < sizeof(bad) / sizeof(bad[0]); t++) {
		int32_t idx[12];
		float poison[48];
		memcpy(idx, good, sizeof(idx));
		idx[4] = bad[t];
		for (int i = 0; i < 48; i++)
			poison[i] = 7.0f;
		ck_assert_int_eq(ops->upload(cc, didx, idx, sizeof(idx)), 0);
		ck_assert_int_eq(ops->upload(cc, ddx, poison, sizeof(poison)), 0);
		cc->err[0] = '\0';
		ck_assert_int_eq(ops->maxpool_bwd(cc, &s, ddy, didx, ddx), -EINVAL);
		ck_assert_msg(strstr(cc->err, "outside its 2x2 window"), "%s", cc->err);
		ck_assert_int_eq(ops->download(cc, dx, ddx, sizeof(dx)), 0);
		ck_assert_msg(memcmp(dx, poison, sizeof(dx)) == 0, "dx written for index %d", bad[t]);
	}
	ops->free(cc, ddy);
	ops->free(cc, ddx);
	ops->free(cc, didx);
}
END_TEST

/* ---- the registry ---- */

START_TEST(test_registry)
{
	const struct ps_compute_ops *cpu = NULL, *cuda = NULL, *none = &ps_compute_cpu_ops;
	struct ps_compute *c = NULL;
	char err[512] = "";

	ck_assert_int_eq(ps_compute_load("cpu", &cpu, err, sizeof(err)), 0);
	ck_assert_str_eq(cpu->name, "cpu");
	ck_assert_ptr_eq(cpu, &ps_compute_cpu_ops);
	ck_assert_int_eq(ps_compute_load("ref", &cpu, err, sizeof(err)), 0);
	ck_assert_str_eq(cpu->name, "ref");
	ck_assert_ptr_eq(cpu, &ps_compute_ref_ops);
	ck_assert_int_eq(ps_compute_load("nope", &none, err, sizeof(err)), -ENOENT);
	ck_assert_ptr_null(none);
	ck_assert_msg(strstr(err, "'nope'"), "%s", err);
	ck_assert_int_eq(ps_compute_load("", &none, err, sizeof(err)), -ENOENT);
	ck_assert_int_eq(ps_compute_load(NULL, &none, err, sizeof(err)), -ENOENT);
	err[0] = '\0';
	int rc = ps_compute_load("cuda", &cuda, err, sizeof(err));
	if (rc) {
		/* no plug-in, or one whose libraries are missing: one reason */
		ck_assert_int_eq(rc, PS_ENOTSUP);
		ck_assert_ptr_null(cuda);
		ck_assert_msg(strstr(err, "ps-compute-cuda.so"), "no reason naming the plug-in: %s",
			      err);
		printf("check_compute: cuda plug-in not loadable: %s\n", err);
		return;
	}
	ck_assert_str_eq(cuda->name, "cuda");
	rc = cuda->create(&c, NULL, err, sizeof(err));
	if (rc == 0) {
		ck_assert_ptr_nonnull(c);
		ck_assert_ptr_eq(c->ops, cuda);
		printf("check_compute: cuda backend created\n");
		cuda->destroy(c);
	} else {
		ck_assert_int_eq(rc, PS_ENOTSUP);
		ck_assert_ptr_null(c);
		ck_assert_msg(strstr(err, "no usable CUDA GPU") || strstr(err, "driver"),
			      "cuda create failed without a reason: %s", err);
		printf("check_compute: cuda backend unavailable: %s\n", err);
	}
}
END_TEST

/* Every op case on one backend, as its own test case. */
static void add_op_cases(Suite *s, const char *name, void (*fixture)(void))
{
	TCase *ops_tc = tcase_create(name);

	tcase_add_checked_fixture(ops_tc, fixture, teardown);
	tcase_set_timeout(ops_tc, 60);
	tcase_add_test(ops_tc, test_grad_dense);
	tcase_add_loop_test(ops_tc, test_grad_conv2d, 0,
			    (int)(sizeof(conv_cases) / sizeof(conv_cases[0])));
	tcase_add_test(ops_tc, test_grad_maxpool);
	tcase_add_test(ops_tc, test_grad_relu);
	tcase_add_test(ops_tc, test_grad_softmax_xent);
	tcase_add_test(ops_tc, test_conv2d_vs_naive);
	tcase_add_test(ops_tc, test_dense_vs_naive);
	tcase_add_test(ops_tc, test_maxpool_vs_naive);
	tcase_add_test(ops_tc, test_maxpool_ties_first);
	tcase_add_test(ops_tc, test_softmax_known);
	tcase_add_test(ops_tc, test_memory_and_misc);
	tcase_add_test(ops_tc, test_maxpool_bad_index);
	suite_add_tcase(s, ops_tc);
}

static Suite *compute_suite(void)
{
	Suite *s = suite_create("compute");
	TCase *reg = tcase_create("registry");

	/* generous: sanitizer builds on a loaded 2-core machine */
	tcase_set_timeout(reg, 60);
	tcase_add_test(reg, test_registry);
	suite_add_tcase(s, reg);
	add_op_cases(s, "ref", setup_ref);
	add_op_cases(s, "cpu", setup_cpu);
	return s;
}

int main(void)
{
	int failed;

	failed = tu_run_suite(compute_suite());
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
