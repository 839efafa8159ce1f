/* check_compute_cuda.c - the cuda compute backend against the cpu reference,
 * op by op (docs/architecture.md, Interfaces).
 *
 * Each case runs the same op on random inputs through both backends and
 * compares by normalized error ||cuda - cpu|| / ||cpu||: 1e-4 for dense,
 * softmax and the elementwise ops, 1e-3 for convolutions (cuDNN sums in
 * other orders than im2col + GEMM). Outputs start as garbage on both sides,
 * so an op that fails to overwrite shows.
 *
 * Without a usable GPU every comparison case skips (tu_skip: "SKIP <case>:
 * <reason from create()>") and returns; scripts/run-tests.sh counts them as
 * skipped cases. One case always asserts: create() fails with PS_ENOTSUP
 * and a reason where no GPU is expected, and succeeds where one is.
 */
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "compute.h"
#include "ps_err.h"
#include "test_util.h"

#define TOL 1e-4        /* dense, softmax, elementwise */
#define CONV_TOL 1e-3   /* convolutions */
#define GARBAGE 1.0e30f /* initial contents of every output */

/* Both backends, created for one case. */
struct pair {
	const struct ps_compute_ops *co, *go;   /* cpu, cuda */
	struct ps_compute *cpu, *gpu;
};

/* Creates both backends; returns 0, after tu_skip, when the cuda one
 * cannot run here. */
static int pair_open(struct pair *p, const char *what)
{
	char err[256] = "";
	int rc;

	memset(p, 0, sizeof(*p));
	p->co = ps_compute_find("cpu");
	ck_assert_ptr_nonnull(p->co);
	rc = p->co->create(&p->cpu, err, sizeof(err));
	ck_assert_msg(rc == 0, "cpu create: %s", err);
	p->go = ps_compute_find("cuda");
	if (!p->go) {
		snprintf(err, sizeof(err), "no cuda backend registered");
		rc = PS_ENOTSUP;
	} else {
		rc = p->go->create(&p->gpu, err, sizeof(err));
	}
	if (rc) {
		tu_skip("%s: %s", what, err[0] ? err : ps_strerror(rc));
		p->co->destroy(p->cpu);
		return 0;
	}
	return 1;
}

static void pair_close(struct pair *p)
{
	p->go->destroy(p->gpu);
	p->co->destroy(p->cpu);
}

/* Deterministic uniform values in [-1, 1). */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float frand(void)
{
	rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
	return (float)((rng_state >> 40) * (1.0 / (1ull << 24))) * 2.0f - 1.0f;
}

static float *randv(size_t n)
{
	float *v = malloc(n * sizeof(float));

	ck_assert_ptr_nonnull(v);
	for (size_t i = 0; i < n; i++)
		v[i] = frand();
	return v;
}

/* Backend memory of bytes, filled from host h, or with GARBAGE floats when
 * h is NULL. */
static void *put(const struct ps_compute_ops *o, struct ps_compute *c, const void *h,
		 size_t bytes)
{
	void *d = o->alloc(c, bytes);

	ck_assert_msg(d != NULL, "%s alloc(%zu): %s", o->name, bytes, c->err);
	if (h) {
		ck_assert_msg(o->upload(c, d, h, bytes) == 0, "%s upload: %s", o->name, c->err);
	} else {
		float *g = malloc(bytes + sizeof(float));
		ck_assert_ptr_nonnull(g);
		for (size_t i = 0; i < bytes / sizeof(float); i++)
			g[i] = GARBAGE;
		ck_assert_msg(o->upload(c, d, g, bytes) == 0, "%s upload: %s", o->name, c->err);
		ck_assert_int_eq(o->sync(c), 0);
		free(g);
	}
	return d;
}

/* Host copy of n floats (or int32s) of backend memory; caller frees. */
static void *get(const struct ps_compute_ops *o, struct ps_compute *c, const void *d,
		 size_t bytes)
{
	void *h = malloc(bytes ? bytes : 1);

	ck_assert_ptr_nonnull(h);
	ck_assert_msg(o->download(c, h, d, bytes) == 0, "%s download: %s", o->name, c->err);
	ck_assert_msg(o->sync(c) == 0, "%s sync: %s", o->name, c->err);
	return h;
}

/* ||got - want|| / ||want|| (plain ||got - want|| when want is all zero). */
static double nerr(const float *got, const float *want, size_t n)
{
	double d = 0.0, r = 0.0;

	for (size_t i = 0; i < n; i++) {
		if (!isfinite(got[i]))
			return INFINITY;
		d += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
		r += (double)want[i] * want[i];
	}
	return r > 0.0 ? sqrt(d / r) : sqrt(d);
}

/* Downloads n floats from each backend and compares them. */
static void compare(struct pair *p, const char *what, const float *gd, const float *cd, size_t n,
		    double tol)
{
	float *g = get(p->go, p->gpu, gd, n * sizeof(float));
	float *c = get(p->co, p->cpu, cd, n * sizeof(float));
	double e = nerr(g, c, n);

	ck_assert_msg(e < tol, "%s: normalized error %.3g, tolerance %.1g", what, e, tol);
	free(g);
	free(c);
}

/* The op's return on each backend: 0, or the test fails with its err. */
#define OK(p, call_gpu, call_cpu)                                                          \
	do {                                                                               \
		int rc_g_ = (call_gpu), rc_c_ = (call_cpu);                                \
		ck_assert_msg(rc_g_ == 0, "cuda: %s (%s)", (p)->gpu->err, ps_strerror(rc_g_)); \
		ck_assert_msg(rc_c_ == 0, "cpu: %s (%s)", (p)->cpu->err, ps_strerror(rc_c_)); \
	} while (0)

/* ---------------------------------------------------------------- create */

/* Whether this machine should have a usable GPU: the NVIDIA driver lists
 * one and CUDA_VISIBLE_DEVICES does not hide them all. */
static int gpu_expected(void)
{
	const char *vis = getenv("CUDA_VISIBLE_DEVICES");
	DIR *d = opendir("/proc/driver/nvidia/gpus");
	struct dirent *e;
	int n = 0;

	if (!d)
		return 0;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	if (vis && (vis[0] == '\0' || strcmp(vis, "-1") == 0 || strcmp(vis, "none") == 0))
		return 0;
	return n > 0;
}

START_TEST(test_create)
{
	const struct ps_compute_ops *go = ps_compute_find("cuda");
	struct ps_compute *c = (struct ps_compute *)&c;  /* must become NULL on failure */
	char err[256] = "";
	int rc, built = go && go->alloc;   /* the no-nvcc stub fills only create */

	ck_assert_ptr_nonnull(go);
	ck_assert_str_eq(go->name, "cuda");
	rc = go->create(&c, err, sizeof(err));
	if (built && gpu_expected()) {
		ck_assert_msg(rc == 0, "a GPU is present but create failed: %s (%s)", err,
			      ps_strerror(rc));
		ck_assert_ptr_eq(c->ops, go);
		go->destroy(c);
	} else {
		ck_assert_msg(rc == PS_ENOTSUP, "create without a GPU returned %d (%s): %s", rc,
			      ps_strerror(rc), err);
		ck_assert_msg(err[0] != '\0', "create gave no reason");
		ck_assert_ptr_null(c);
		printf("cuda create without a GPU: %s\n", err);
	}
}
END_TEST

/* ----------------------------------------------------------------- dense */

static const int dense_shapes[][3] = { /* n, in, out */
	{ 7, 33, 10 }, { 64, 300, 129 }, { 1, 5, 1 },
};

START_TEST(test_dense)
{
	const int n = dense_shapes[_i][0], in = dense_shapes[_i][1], out = dense_shapes[_i][2];
	char what[64];
	struct pair p;

	snprintf(what, sizeof(what), "dense fwd/bwd n=%d in=%d out=%d", n, in, out);
	if (!pair_open(&p, what))
		return;
	float *x = randv((size_t)n * in), *W = randv((size_t)in * out), *b = randv(out);
	float *dy = randv((size_t)n * out);
	struct ps_compute *g = p.gpu, *c = p.cpu;
	const struct ps_compute_ops *go = p.go, *co = p.co;
	float *gx = put(go, g, x, (size_t)n * in * 4), *cx = put(co, c, x, (size_t)n * in * 4);
	float *gW = put(go, g, W, (size_t)in * out * 4), *cW = put(co, c, W, (size_t)in * out * 4);
	float *gb = put(go, g, b, (size_t)out * 4), *cb = put(co, c, b, (size_t)out * 4);
	float *gdy = put(go, g, dy, (size_t)n * out * 4);
	float *cdy = put(co, c, dy, (size_t)n * out * 4);
	float *gy = put(go, g, NULL, (size_t)n * out * 4);
	float *cy = put(co, c, NULL, (size_t)n * out * 4);
	float *gdx = put(go, g, NULL, (size_t)n * in * 4);
	float *cdx = put(co, c, NULL, (size_t)n * in * 4);
	float *gdW = put(go, g, NULL, (size_t)in * out * 4);
	float *cdW = put(co, c, NULL, (size_t)in * out * 4);
	float *gdb = put(go, g, NULL, (size_t)out * 4), *cdb = put(co, c, NULL, (size_t)out * 4);

	OK(&p, go->dense_fwd(g, gx, gW, gb, gy, n, in, out),
	   co->dense_fwd(c, cx, cW, cb, cy, n, in, out));
	compare(&p, "dense y", gy, cy, (size_t)n * out, TOL);
	OK(&p, go->dense_bwd(g, gx, gW, gdy, gdx, gdW, gdb, n, in, out),
	   co->dense_bwd(c, cx, cW, cdy, cdx, cdW, cdb, n, in, out));
	compare(&p, "dense dx", gdx, cdx, (size_t)n * in, TOL);
	compare(&p, "dense dW", gdW, cdW, (size_t)in * out, TOL);
	compare(&p, "dense db", gdb, cdb, (size_t)out, TOL);
	/* dx NULL (first layer): dW, db still right. */
	ck_assert_int_eq(go->zero(g, gdW, (size_t)in * out), 0);
	ck_assert_int_eq(go->dense_bwd(g, gx, gW, gdy, NULL, gdW, gdb, n, in, out), 0);
	compare(&p, "dense dW (dx NULL)", gdW, cdW, (size_t)in * out, TOL);

	void *gbuf[] = { gx, gW, gb, gdy, gy, gdx, gdW, gdb };
	void *cbuf[] = { cx, cW, cb, cdy, cy, cdx, cdW, cdb };
	for (int i = 0; i < 8; i++) {
		go->free(g, gbuf[i]);
		co->free(c, cbuf[i]);
	}
	free(x), free(W), free(b), free(dy);
	pair_close(&p);
}
END_TEST

/* ------------------------------------------------------------------ conv */

static const struct ps_conv_shape conv_shapes[] = {
	{ .n = 2, .c = 3, .h = 8, .w = 8, .k = 4, .kh = 3, .kw = 3, .pad = 1, .stride = 1 },
	{ .n = 3, .c = 2, .h = 7, .w = 9, .k = 5, .kh = 5, .kw = 5, .pad = 2, .stride = 2 },
	{ .n = 4, .c = 3, .h = 11, .w = 10, .k = 6, .kh = 3, .kw = 3, .pad = 2, .stride = 1 },
	{ .n = 2, .c = 16, .h = 12, .w = 12, .k = 8, .kh = 1, .kw = 1, .pad = 0, .stride = 1 },
	{ .n = 8, .c = 32, .h = 16, .w = 16, .k = 64, .kh = 3, .kw = 3, .pad = 1, .stride = 1 },
};

START_TEST(test_conv)
{
	struct ps_conv_shape s = conv_shapes[_i];
	char what[64];
	struct pair p;

	ps_conv_out(&s);
	snprintf(what, sizeof(what), "conv2d fwd/bwd c=%d %dx%d k=%d %dx%d pad %d stride %d", s.c,
		 s.h, s.w, s.k, s.kh, s.kw, s.pad, s.stride);
	if (!pair_open(&p, what))
		return;
	struct ps_compute *g = p.gpu, *c = p.cpu;
	const struct ps_compute_ops *go = p.go, *co = p.co;
	size_t nx = (size_t)s.n * s.c * s.h * s.w, nw = (size_t)s.k * s.c * s.kh * s.kw;
	size_t ny = (size_t)s.n * s.k * s.oh * s.ow;
	float *x = randv(nx), *W = randv(nw), *b = randv(s.k), *dy = randv(ny);
	size_t gws_n = go->conv2d_workspace(g, &s), cws_n = co->conv2d_workspace(c, &s);
	void *gws = gws_n ? put(go, g, NULL, gws_n) : NULL, *cws = put(co, c, NULL, cws_n);
	float *gx = put(go, g, x, nx * 4), *cx = put(co, c, x, nx * 4);
	float *gW = put(go, g, W, nw * 4), *cW = put(co, c, W, nw * 4);
	float *gb = put(go, g, b, (size_t)s.k * 4), *cb = put(co, c, b, (size_t)s.k * 4);
	float *gdy = put(go, g, dy, ny * 4), *cdy = put(co, c, dy, ny * 4);
	float *gy = put(go, g, NULL, ny * 4), *cy = put(co, c, NULL, ny * 4);
	float *gdx = put(go, g, NULL, nx * 4), *cdx = put(co, c, NULL, nx * 4);
	float *gdW = put(go, g, NULL, nw * 4), *cdW = put(co, c, NULL, nw * 4);
	float *gdb = put(go, g, NULL, (size_t)s.k * 4), *cdb = put(co, c, NULL, (size_t)s.k * 4);

	OK(&p, go->conv2d_fwd(g, &s, gx, gW, gb, gy, gws, gws_n),
	   co->conv2d_fwd(c, &s, cx, cW, cb, cy, cws, cws_n));
	compare(&p, "conv y", gy, cy, ny, CONV_TOL);
	OK(&p, go->conv2d_bwd(g, &s, gx, gW, gdy, gdx, gdW, gdb, gws, gws_n),
	   co->conv2d_bwd(c, &s, cx, cW, cdy, cdx, cdW, cdb, cws, cws_n));
	compare(&p, "conv dx", gdx, cdx, nx, CONV_TOL);
	compare(&p, "conv dW", gdW, cdW, nw, CONV_TOL);
	compare(&p, "conv db", gdb, cdb, (size_t)s.k, CONV_TOL);

	/* No workspace at all: the cuda backend falls back to algorithms that
	 * need none, with the same results. */
	ck_assert_int_eq(go->zero(g, gy, ny), 0);
	ck_assert_int_eq(go->conv2d_fwd(g, &s, gx, gW, gb, gy, NULL, 0), 0);
	compare(&p, "conv y (no workspace)", gy, cy, ny, CONV_TOL);
	ck_assert_int_eq(go->zero(g, gdx, nx), 0);
	ck_assert_int_eq(go->conv2d_bwd(g, &s, gx, gW, gdy, gdx, gdW, gdb, NULL, 0), 0);
	compare(&p, "conv dx (no workspace)", gdx, cdx, nx, CONV_TOL);
	compare(&p, "conv dW (no workspace)", gdW, cdW, nw, CONV_TOL);

	/* A smaller batch than the workspace was sized for (the last batch). */
	if (s.n > 1) {
		struct ps_conv_shape t = s;
		t.n = s.n - 1;
		ck_assert_int_eq(go->conv2d_fwd(g, &t, gx, gW, gb, gy, gws, gws_n), 0);
		compare(&p, "conv y (smaller batch)", gy, cy, (size_t)t.n * s.k * s.oh * s.ow,
			CONV_TOL);
	}

	/* A shape whose oh, ow were not filled in is refused, with a reason. */
	struct ps_conv_shape bad = s;
	bad.oh += 1;
	ck_assert_int_eq(go->conv2d_fwd(g, &bad, gx, gW, gb, gy, gws, gws_n), -EINVAL);
	ck_assert_ptr_nonnull(strstr(g->err, "conv2d"));

	void *gbuf[] = { gx, gW, gb, gdy, gy, gdx, gdW, gdb, gws };
	void *cbuf[] = { cx, cW, cb, cdy, cy, cdx, cdW, cdb, cws };
	for (int i = 0; i < 9; i++) {
		go->free(g, gbuf[i]);
		co->free(c, cbuf[i]);
	}
	free(x), free(W), free(b), free(dy);
	pair_close(&p);
}
END_TEST

/* --------------------------------------------------------------- maxpool */

static const struct ps_pool_shape pool_shapes[] = {
	{ .n = 2, .c = 3, .h = 8, .w = 8, .size = 2 },
	{ .n = 1, .c = 2, .h = 7, .w = 9, .size = 3 },   /* leftover rows and columns */
	{ .n = 16, .c = 32, .h = 32, .w = 32, .size = 2 },
};

START_TEST(test_maxpool)
{
	struct ps_pool_shape s = pool_shapes[_i];
	char what[64];
	struct pair p;

	s.oh = s.h / s.size;
	s.ow = s.w / s.size;
	snprintf(what, sizeof(what), "maxpool fwd/bwd %dx%d size %d", s.h, s.w, s.size);
	if (!pair_open(&p, what))
		return;
	struct ps_compute *g = p.gpu, *c = p.cpu;
	const struct ps_compute_ops *go = p.go, *co = p.co;
	size_t nx = (size_t)s.n * s.c * s.h * s.w, ny = (size_t)s.n * s.c * s.oh * s.ow;
	float *x = randv(nx), *dy = randv(ny);
	float *gx = put(go, g, x, nx * 4), *cx = put(co, c, x, nx * 4);
	float *gdy = put(go, g, dy, ny * 4), *cdy = put(co, c, dy, ny * 4);
	float *gy = put(go, g, NULL, ny * 4), *cy = put(co, c, NULL, ny * 4);
	int32_t *gi = put(go, g, NULL, ny * 4), *ci = put(co, c, NULL, ny * 4);
	float *gdx = put(go, g, NULL, nx * 4), *cdx = put(co, c, NULL, nx * 4);

	OK(&p, go->maxpool_fwd(g, &s, gx, gy, gi), co->maxpool_fwd(c, &s, cx, cy, ci));
	compare(&p, "maxpool y", gy, cy, ny, 1e-7);
	/* Both backends record positions inside the (n, c) plane. */
	int32_t *hg = get(go, g, gi, ny * 4), *hc = get(co, c, ci, ny * 4);
	for (size_t i = 0; i < ny; i++)
		ck_assert_msg(hg[i] == hc[i], "maxpool idx[%zu] = %d, cpu %d", i, hg[i], hc[i]);
	free(hg);
	free(hc);
	OK(&p, go->maxpool_bwd(g, &s, gdy, gi, gdx), co->maxpool_bwd(c, &s, cdy, ci, cdx));
	compare(&p, "maxpool dx", gdx, cdx, nx, 1e-7);

	void *gbuf[] = { gx, gdy, gy, gi, gdx }, *cbuf[] = { cx, cdy, cy, ci, cdx };
	for (int i = 0; i < 5; i++) {
		go->free(g, gbuf[i]);
		co->free(c, cbuf[i]);
	}
	free(x), free(dy);
	pair_close(&p);
}
END_TEST

/* ------------------------------------------------ relu, scale and zero */

START_TEST(test_elementwise)
{
	const size_t n = 100003;   /* odd: not a multiple of any block size */
	struct pair p;

	if (!pair_open(&p, "relu/scale/zero"))
		return;
	struct ps_compute *g = p.gpu, *c = p.cpu;
	const struct ps_compute_ops *go = p.go, *co = p.co;
	float *x = randv(n), *dy = randv(n);
	for (size_t i = 0; i < n; i += 97)
		x[i] = 0.0f;    /* exact zeros: relu' is 0 there on both */
	float *gx = put(go, g, x, n * 4), *cx = put(co, c, x, n * 4);
	float *gdy = put(go, g, dy, n * 4), *cdy = put(co, c, dy, n * 4);
	float *gy = put(go, g, NULL, n * 4), *cy = put(co, c, NULL, n * 4);
	float *gdx = put(go, g, NULL, n * 4), *cdx = put(co, c, NULL, n * 4);

	OK(&p, go->relu_fwd(g, gx, gy, n), co->relu_fwd(c, cx, cy, n));
	compare(&p, "relu y", gy, cy, n, 1e-7);
	OK(&p, go->relu_bwd(g, gy, gdy, gdx, n), co->relu_bwd(c, cy, cdy, cdx, n));
	compare(&p, "relu dx", gdx, cdx, n, 1e-7);
	OK(&p, go->scale(g, gy, gx, -0.375f, n), co->scale(c, cy, cx, -0.375f, n));
	compare(&p, "scale", gy, cy, n, 1e-7);
	OK(&p, go->scale(g, gy, gy, 3.0f, n), co->scale(c, cy, cy, 3.0f, n));
	compare(&p, "scale in place", gy, cy, n, 1e-7);
	OK(&p, go->scale(g, gdx, gx, 1.0f, n), co->scale(c, cdx, cx, 1.0f, n));
	compare(&p, "scale by 1 (copy)", gdx, cdx, n, 1e-7);
	OK(&p, go->zero(g, gy, n - 1), co->zero(c, cy, n - 1));
	compare(&p, "zero", gy, cy, n, 1e-7);

	void *gbuf[] = { gx, gdy, gy, gdx }, *cbuf[] = { cx, cdy, cy, cdx };
	for (int i = 0; i < 4; i++) {
		go->free(g, gbuf[i]);
		co->free(c, cbuf[i]);
	}
	free(x), free(dy);
	pair_close(&p);
}
END_TEST

/* ---------------------------------------------------------- softmax_xent */

static const int xent_shapes[][2] = { /* n, classes */
	{ 37, 10 }, { 300, 1000 }, { 3000, 10 }, { 1, 1 }, { 5, 33 },
};

START_TEST(test_softmax_xent)
{
	const int n = xent_shapes[_i][0], classes = xent_shapes[_i][1];
	size_t nl = (size_t)n * classes;
	char what[64];
	struct pair p;

	snprintf(what, sizeof(what), "softmax_xent n=%d classes=%d", n, classes);
	if (!pair_open(&p, what))
		return;
	struct ps_compute *g = p.gpu, *c = p.cpu;
	const struct ps_compute_ops *go = p.go, *co = p.co;
	float *z = randv(nl);
	int32_t *lab = malloc((size_t)n * sizeof(int32_t));
	ck_assert_ptr_nonnull(lab);
	for (size_t i = 0; i < nl; i++)
		z[i] *= 8.0f;   /* a spread that makes argmax mostly right and wrong */
	for (int i = 0; i < n; i++) {
		lab[i] = (int32_t)((frand() + 1.0f) * 0.5f * classes) % classes;
		if (i % 3 == 0)   /* make some examples correct */
			z[(size_t)i * classes + lab[i]] += 20.0f;
	}
	float *gz = put(go, g, z, nl * 4), *cz = put(co, c, z, nl * 4);
	int32_t *glab = put(go, g, lab, (size_t)n * 4), *clab = put(co, c, lab, (size_t)n * 4);
	float *gd = put(go, g, NULL, nl * 4), *cd = put(co, c, NULL, nl * 4);
	float gloss = -1.0f, closs = -2.0f;
	int gright = -1, cright = -2;

	OK(&p, go->softmax_xent(g, gz, glab, n, classes, gd, &gloss, &gright),
	   co->softmax_xent(c, cz, clab, n, classes, cd, &closs, &cright));
	ck_assert_msg(fabs((double)gloss - closs) <= 1e-5 * fabs(closs) + 1e-7,
		      "loss %.9g, cpu %.9g", gloss, closs);
	ck_assert_int_eq(gright, cright);
	compare(&p, "dlogits", gd, cd, nl, TOL);

	/* Evaluation: no dlogits, same loss. */
	gloss = -1.0f;
	gright = -1;
	ck_assert_int_eq(go->softmax_xent(g, gz, glab, n, classes, NULL, &gloss, &gright), 0);
	ck_assert_msg(fabs((double)gloss - closs) <= 1e-5 * fabs(closs) + 1e-7,
		      "loss (no dlogits) %.9g, cpu %.9g", gloss, closs);
	ck_assert_int_eq(gright, cright);

	/* A label out of range is refused by both, naming the example. */
	lab[n - 1] = classes;
	ck_assert_int_eq(go->upload(g, glab, lab, (size_t)n * 4), 0);
	ck_assert_int_eq(co->upload(c, clab, lab, (size_t)n * 4), 0);
	ck_assert_int_eq(go->softmax_xent(g, gz, glab, n, classes, gd, &gloss, &gright), -EINVAL);
	ck_assert_int_eq(co->softmax_xent(c, cz, clab, n, classes, cd, &closs, &cright), -EINVAL);
	ck_assert_str_eq(g->err, c->err);

	void *gbuf[] = { gz, glab, gd }, *cbuf[] = { cz, clab, cd };
	for (int i = 0; i < 3; i++) {
		go->free(g, gbuf[i]);
		co->free(c, cbuf[i]);
	}
	free(z);
	free(lab);
	pair_close(&p);
}
END_TEST

static Suite *compute_cuda_suite(void)
{
	Suite *s = suite_create("compute_cuda");
	TCase *tc = tcase_create("core");

	/* First cuDNN use loads its engine libraries: seconds, not milliseconds. */
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_create);
	tcase_add_loop_test(tc, test_dense, 0, (int)(sizeof(dense_shapes) / sizeof(dense_shapes[0])));
	tcase_add_loop_test(tc, test_conv, 0, (int)(sizeof(conv_shapes) / sizeof(conv_shapes[0])));
	tcase_add_loop_test(tc, test_maxpool, 0, (int)(sizeof(pool_shapes) / sizeof(pool_shapes[0])));
	tcase_add_test(tc, test_elementwise);
	tcase_add_loop_test(tc, test_softmax_xent, 0,
			    (int)(sizeof(xent_shapes) / sizeof(xent_shapes[0])));
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	int failed;

	failed = tu_run_suite(compute_cuda_suite());
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
