/* check_compute_cuda.c - the cuda compute backend (the plug-in
 * lib/ps-compute-cuda.so) against the reference backend "ref" (called cpu
 * below: the plain C + OpenBLAS code), op by op and on whole
 * forward and backward passes (docs/architecture.md, Interfaces; docs/gpu.md).
 *
 * Each case runs the same op on random inputs through both backends, the
 * cuda one with train.tf32 off (fp32 throughout), and compares with two
 * bounds: normalized error ||cuda - cpu|| / ||cpu|| below TOL, and the
 * largest single difference below MAXABS times the largest |cpu| value. A
 * value that is not finite fails at once, naming its position. Every output
 * starts as garbage on both sides, and is reset to garbage before each
 * variant of a call, so an op that fails to write shows.
 *
 * Also: conv backward without dx (the first layer), the presets' shapes,
 * the algorithm plan cache past its 16 entries, events and the copy
 * stream, the promises of compute.h (nothing written for a bad label or a
 * bad pooling index), PS_CUDA_SYNC=1 naming the failing op, whole mlp and
 * cnn steps through ps_net_* with gradients in push order and no host
 * synchronization inside backward, the same bits from a second run of
 * every dense and conv op and of a whole step (only deterministic
 * algorithms: sync runs repeat bit for bit), and TF32 convolutions within
 * TF32's precision.
 *
 * Without a usable GPU every comparison case skips (tu_skip: "SKIP <case>:
 * <reason>") and returns; scripts/run-tests.sh counts them as skipped.
 * test_create always asserts: the plug-in loads (where it was built) and
 * create() fails with PS_ENOTSUP and a reason where no GPU is expected,
 * and succeeds where one is.
 */
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "compute.h"
#include "config.h"
#include "net.h"
#include "ps_err.h"
#include "backend_compare.h"
#include "test_util.h"

#define TOL 1e-5        /* normalized L2 error, every op and whole passes */
#define MAXABS 1e-4     /* largest |cuda - cpu| over the largest |cpu| */
#define TF32_TOL 3e-3   /* TF32 keeps 10 bits of mantissa: about 1e-3 */
#define GARBAGE 1.0e30f /* initial contents of every output */

/* Both backends, created for one case. */
struct pair {
	const struct ps_compute_ops *co, *go;   /* cpu, cuda */
	struct ps_compute *cpu, *gpu;
};

/* Creates both backends (cuda with tf32 as given); returns 0, after
 * tu_skip, when the cuda one cannot run here. */
static int pair_open_tf32(struct pair *p, const char *what, enum ps_tf32 tf32)
{
	struct ps_compute_opts opts = { .tf32 = tf32 };
	char err[512] = "";
	int rc;

	memset(p, 0, sizeof(*p));
	p->co = &ps_compute_ref_ops;
	rc = p->co->create(&p->cpu, NULL, err, sizeof(err));
	ck_assert_msg(rc == 0, "cpu create: %s", err);
	rc = ps_compute_load("cuda", &p->go, err, sizeof(err));
	if (!rc)
		rc = p->go->create(&p->gpu, &opts, err, sizeof(err));
	if (rc) {
		tu_skip("%s: %s", what, err[0] ? err : ps_strerror(rc));
		p->co->destroy(p->cpu);
		return 0;
	}
	return 1;
}

static int pair_open(struct pair *p, const char *what)
{
	return pair_open_tf32(p, what, PS_TF32_OFF);
}

static void pair_close(struct pair *p)
{
	p->go->destroy(p->gpu);
	p->co->destroy(p->cpu);
}

/* One tensor on both backends: g (cuda) and c (cpu), n floats. */
struct buf {
	float *g, *c;
	size_t n;
};

/* Sets both copies to GARBAGE. */
static void b_garbage(struct pair *p, struct buf *b)
{
	float *h = malloc((b->n ? b->n : 1) * sizeof(float));

	ck_assert_ptr_nonnull(h);
	for (size_t i = 0; i < b->n; i++)
		h[i] = GARBAGE;
	fill(p->go, p->gpu, b->g, h, b->n * sizeof(float));
	fill(p->co, p->cpu, b->c, h, b->n * sizeof(float));
	free(h);
}

/* n floats on both backends, from h, or GARBAGE when h is NULL. */
static struct buf b_new(struct pair *p, const float *h, size_t n)
{
	struct buf b = { p->go->alloc(p->gpu, n * sizeof(float)),
			 p->co->alloc(p->cpu, n * sizeof(float)), n };

	ck_assert_msg(b.g && b.c, "alloc of %zu floats: %s / %s", n, p->gpu->err, p->cpu->err);
	if (h) {
		fill(p->go, p->gpu, b.g, h, n * sizeof(float));
		fill(p->co, p->cpu, b.c, h, n * sizeof(float));
	} else {
		b_garbage(p, &b);
	}
	return b;
}

static void b_free(struct pair *p, struct buf *b)
{
	p->go->free(p->gpu, b->g);
	p->co->free(p->cpu, b->c);
	memset(b, 0, sizeof(*b));
}

/* got (cuda) against want (cpu), n host floats: normalized error below tol,
 * largest difference below MAXABS (scaled like tol) times max |want|. */
static void check_close(const char *what, const float *got, const float *want, size_t n,
			double tol)
{
	bc_check_close(what, "cuda", "cpu", got, want, n, tol, MAXABS * (tol / TOL));
}

/* Downloads a buffer's first n floats from each backend and compares them. */
static void compare_n(struct pair *p, const char *what, const struct buf *b, size_t n,
		      double tol)
{
	float *g = get(p->go, p->gpu, b->g, n * sizeof(float));
	float *c = get(p->co, p->cpu, b->c, n * sizeof(float));

	check_close(what, g, c, n, tol);
	free(g);
	free(c);
}

static void compare(struct pair *p, const char *what, const struct buf *b, double tol)
{
	compare_n(p, what, b, b->n, tol);
}

/* The cuda copy of b, on the host (caller frees): to check a rerun. */
static float *keep(struct pair *p, const struct buf *b)
{
	return get(p->go, p->gpu, b->g, b->n * sizeof(float));
}

/* The cuda copy of b holds exactly the bits of first: sync runs repeat
 * bit for bit only if every op does. */
static void same_bits(struct pair *p, const char *what, const struct buf *b, const float *first)
{
	float *now = keep(p, b);

	ck_assert_msg(memcmp(now, first, b->n * sizeof(float)) == 0,
		      "%s: a second run gave other bits (a non-deterministic algorithm?)", what);
	free(now);
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
	const struct ps_compute_ops *go = NULL;
	struct ps_compute *c = (struct ps_compute *)&c;  /* must become NULL on failure */
	char err[512] = "";
	int rc = ps_compute_load("cuda", &go, err, sizeof(err));

	if (rc) {
		/* not built here (no nvcc or cuDNN), or its libraries are missing */
		ck_assert_int_eq(rc, PS_ENOTSUP);
		ck_assert_msg(strstr(err, "ps-compute-cuda.so"), "reason: %s", err);
		ck_assert_msg(!gpu_expected(), "a GPU is present but the plug-in is not: %s", err);
		tu_skip("cuda plug-in: %s", err);
		return;
	}
	ck_assert_str_eq(go->name, "cuda");
	rc = go->create(&c, NULL, err, sizeof(err));
	if (gpu_expected()) {
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
	{ 32, 3136, 256 }, { 64, 3136, 256 }, { 64, 256, 10 },   /* the cnn preset's */
};

START_TEST(test_dense)
{
	const int n = dense_shapes[_i][0], in = dense_shapes[_i][1], out = dense_shapes[_i][2];
	const float alpha = 0.25f / (float)n;
	char what[64];
	struct pair p;

	snprintf(what, sizeof(what), "dense fwd/bwd n=%d in=%d out=%d", n, in, out);
	if (!pair_open(&p, what))
		return;
	float *hx = randv((size_t)n * in), *hW = randv((size_t)in * out), *hb = randv(out);
	float *hdy = randv((size_t)n * out);
	struct ps_compute *g = p.gpu, *c = p.cpu;
	const struct ps_compute_ops *go = p.go, *co = p.co;
	struct buf x = b_new(&p, hx, (size_t)n * in), W = b_new(&p, hW, (size_t)in * out);
	struct buf b = b_new(&p, hb, out), dy = b_new(&p, hdy, (size_t)n * out);
	struct buf y = b_new(&p, NULL, (size_t)n * out), dx = b_new(&p, NULL, (size_t)n * in);
	struct buf dW = b_new(&p, NULL, (size_t)in * out), db = b_new(&p, NULL, out);

	OK(&p, go->dense_fwd(g, x.g, W.g, b.g, y.g, n, in, out),
	   co->dense_fwd(c, x.c, W.c, b.c, y.c, n, in, out));
	compare(&p, "dense y", &y, TOL);
	OK(&p, go->dense_bwd(g, x.g, W.g, dy.g, dx.g, dW.g, db.g, n, in, out, alpha),
	   co->dense_bwd(c, x.c, W.c, dy.c, dx.c, dW.c, db.c, n, in, out, alpha));
	compare(&p, "dense dx", &dx, TOL);
	compare(&p, "dense dW", &dW, TOL);
	compare(&p, "dense db", &db, TOL);
	float *kdx = keep(&p, &dx), *kdW = keep(&p, &dW), *kdb = keep(&p, &db);
	b_garbage(&p, &dx), b_garbage(&p, &dW), b_garbage(&p, &db);
	ck_assert_int_eq(go->dense_bwd(g, x.g, W.g, dy.g, dx.g, dW.g, db.g, n, in, out, alpha), 0);
	same_bits(&p, "dense dx", &dx, kdx);
	same_bits(&p, "dense dW", &dW, kdW);
	same_bits(&p, "dense db", &db, kdb);
	free(kdx), free(kdW), free(kdb);
	/* dx NULL (first layer): dW, db still written, and right. */
	b_garbage(&p, &dW);
	b_garbage(&p, &db);
	OK(&p, go->dense_bwd(g, x.g, W.g, dy.g, NULL, dW.g, db.g, n, in, out, alpha),
	   co->dense_bwd(c, x.c, W.c, dy.c, NULL, dW.c, db.c, n, in, out, alpha));
	compare(&p, "dense dW (dx NULL)", &dW, TOL);
	compare(&p, "dense db (dx NULL)", &db, TOL);

	struct buf *all[] = { &x, &W, &b, &dy, &y, &dx, &dW, &db };
	for (int i = 0; i < 8; i++)
		b_free(&p, all[i]);
	free(hx), free(hW), free(hb), free(hdy);
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
	/* the cnn preset: 5x5 pad 2 on 28x28 and 14x14, batches 32 and 64 */
	{ .n = 32, .c = 1, .h = 28, .w = 28, .k = 32, .kh = 5, .kw = 5, .pad = 2, .stride = 1 },
	{ .n = 64, .c = 1, .h = 28, .w = 28, .k = 32, .kh = 5, .kw = 5, .pad = 2, .stride = 1 },
	{ .n = 32, .c = 32, .h = 14, .w = 14, .k = 64, .kh = 5, .kw = 5, .pad = 2, .stride = 1 },
	{ .n = 64, .c = 32, .h = 14, .w = 14, .k = 64, .kh = 5, .kw = 5, .pad = 2, .stride = 1 },
};

/* One convolution case with a tolerance, cuda made with tf32. */
static void conv_case(struct ps_conv_shape s, enum ps_tf32 tf32, double tol)
{
	const float alpha = 0.5f / (float)s.n;
	char what[96];
	struct pair p;

	ps_conv_out(&s);
	snprintf(what, sizeof(what), "conv2d n=%d c=%d %dx%d k=%d %dx%d pad %d stride %d%s", s.n,
		 s.c, s.h, s.w, s.k, s.kh, s.kw, s.pad, s.stride,
		 tf32 == PS_TF32_OFF ? "" : " (tf32)");
	if (!pair_open_tf32(&p, what, tf32))
		return;
	struct ps_compute *g = p.gpu, *c = p.cpu;
	const struct ps_compute_ops *go = p.go, *co = p.co;
	size_t nx = (size_t)s.n * s.c * s.h * s.w, nw = (size_t)s.k * s.c * s.kh * s.kw;
	size_t ny = (size_t)s.n * s.k * s.oh * s.ow, gws_n = 0, cws_n = 0;
	float *hx = randv(nx), *hW = randv(nw), *hb = randv(s.k), *hdy = randv(ny);

	ck_assert_msg(go->conv2d_workspace(g, &s, &gws_n) == 0, "cuda workspace: %s", g->err);
	ck_assert_msg(co->conv2d_workspace(c, &s, &cws_n) == 0, "cpu workspace: %s", c->err);
	void *gws = gws_n ? go->alloc(g, gws_n) : NULL, *cws = co->alloc(c, cws_n);
	ck_assert(cws && (gws || !gws_n));
	struct buf x = b_new(&p, hx, nx), W = b_new(&p, hW, nw), b = b_new(&p, hb, s.k);
	struct buf dy = b_new(&p, hdy, ny), y = b_new(&p, NULL, ny), dx = b_new(&p, NULL, nx);
	struct buf dW = b_new(&p, NULL, nw), db = b_new(&p, NULL, s.k);

	OK(&p, go->conv2d_fwd(g, &s, x.g, W.g, b.g, y.g, gws, gws_n),
	   co->conv2d_fwd(c, &s, x.c, W.c, b.c, y.c, cws, cws_n));
	compare(&p, "conv y", &y, tol);
	OK(&p, go->conv2d_bwd(g, &s, x.g, W.g, dy.g, dx.g, dW.g, db.g, gws, gws_n, alpha),
	   co->conv2d_bwd(c, &s, x.c, W.c, dy.c, dx.c, dW.c, db.c, cws, cws_n, alpha));
	compare(&p, "conv dx", &dx, tol);
	compare(&p, "conv dW", &dW, tol);
	compare(&p, "conv db", &db, tol);
	/* deterministic: the same call again gives the same bits */
	float *ky = keep(&p, &y), *kdx = keep(&p, &dx), *kdW = keep(&p, &dW), *kdb = keep(&p, &db);
	b_garbage(&p, &y), b_garbage(&p, &dx), b_garbage(&p, &dW), b_garbage(&p, &db);
	ck_assert_int_eq(go->conv2d_fwd(g, &s, x.g, W.g, b.g, y.g, gws, gws_n), 0);
	ck_assert_int_eq(go->conv2d_bwd(g, &s, x.g, W.g, dy.g, dx.g, dW.g, db.g, gws, gws_n, alpha),
			 0);
	same_bits(&p, "conv y", &y, ky);
	same_bits(&p, "conv dx", &dx, kdx);
	same_bits(&p, "conv dW", &dW, kdW);
	same_bits(&p, "conv db", &db, kdb);
	free(ky), free(kdx), free(kdW), free(kdb);

	/* dx NULL (how the first layer runs): dW and db written, and right. */
	b_garbage(&p, &dW);
	b_garbage(&p, &db);
	OK(&p, go->conv2d_bwd(g, &s, x.g, W.g, dy.g, NULL, dW.g, db.g, gws, gws_n, alpha),
	   co->conv2d_bwd(c, &s, x.c, W.c, dy.c, NULL, dW.c, db.c, cws, cws_n, alpha));
	compare(&p, "conv dW (dx NULL)", &dW, tol);
	compare(&p, "conv db (dx NULL)", &db, tol);

	/* No workspace at all: deterministic algorithms that need none, or a
	 * refusal saying how much they need; never a silent wrong answer. */
	b_garbage(&p, &dx);
	b_garbage(&p, &dW);
	b_garbage(&p, &db);
	int rc = go->conv2d_bwd(g, &s, x.g, W.g, dy.g, dx.g, dW.g, db.g, NULL, 0, alpha);
	if (rc == 0) {
		ck_assert_msg(co->conv2d_bwd(c, &s, x.c, W.c, dy.c, dx.c, dW.c, db.c, cws, cws_n,
					     alpha) == 0, "cpu: %s", c->err);
		compare(&p, "conv dx (no workspace)", &dx, tol);
		compare(&p, "conv dW (no workspace)", &dW, tol);
		compare(&p, "conv db (no workspace)", &db, tol);
	} else {
		ck_assert_msg(rc == -ENOMEM, "no workspace: %s (%s)", ps_strerror(rc), g->err);
		ck_assert_msg(strstr(g->err, "workspace"), "%s", g->err);
	}
	b_garbage(&p, &y);
	rc = go->conv2d_fwd(g, &s, x.g, W.g, b.g, y.g, NULL, 0);
	if (rc == 0) {
		/* the cpu's y of the full call is still there to compare with */
		float *gy = get(go, g, y.g, ny * 4);
		co->conv2d_fwd(c, &s, x.c, W.c, b.c, y.c, cws, cws_n);
		float *cy = get(co, c, y.c, ny * 4);
		check_close("conv y (no workspace)", gy, cy, ny, tol);
		free(gy);
		free(cy);
	}

	/* A smaller batch than the workspace was sized for (the last batch). */
	if (s.n > 1) {
		struct ps_conv_shape t = s;
		t.n = s.n - 1;
		b_garbage(&p, &y);
		OK(&p, go->conv2d_fwd(g, &t, x.g, W.g, b.g, y.g, gws, gws_n),
		   co->conv2d_fwd(c, &t, x.c, W.c, b.c, y.c, cws, cws_n));
		compare_n(&p, "conv y (smaller batch)", &y, (size_t)t.n * s.k * s.oh * s.ow, tol);
	}

	/* A shape whose oh, ow were not filled in is refused, with a reason. */
	struct ps_conv_shape bad = s;
	bad.oh += 1;
	ck_assert_int_eq(go->conv2d_fwd(g, &bad, x.g, W.g, b.g, y.g, gws, gws_n), -EINVAL);
	ck_assert_ptr_nonnull(strstr(g->err, "conv2d"));
	size_t none = 7;
	ck_assert_int_eq(go->conv2d_workspace(g, &(struct ps_conv_shape){ .n = 1 }, &none), -EINVAL);
	ck_assert_uint_eq(none, 0);

	struct buf *all[] = { &x, &W, &b, &dy, &y, &dx, &dW, &db };
	for (int i = 0; i < 8; i++)
		b_free(&p, all[i]);
	go->free(g, gws);
	co->free(c, cws);
	free(hx), free(hW), free(hb), free(hdy);
	pair_close(&p);
}

START_TEST(test_conv)
{
	conv_case(conv_shapes[_i], PS_TF32_OFF, TOL);
}
END_TEST

/* train.tf32's default: convolutions on TF32 tensor cores, within TF32's
 * precision of the fp32 reference. */
START_TEST(test_conv_tf32)
{
	conv_case(conv_shapes[7], PS_TF32_CONV, TF32_TOL);
}
END_TEST

/* More shapes than the plan cache holds (16), then the first ones again:
 * plans evicted and made anew give the same right answers. */
START_TEST(test_conv_plan_eviction)
{
	enum { SHAPES = 20 };
	struct pair p;

	if (!pair_open(&p, "conv2d plan cache eviction"))
		return;
	struct ps_compute *g = p.gpu, *c = p.cpu;
	const struct ps_compute_ops *go = p.go, *co = p.co;
	struct ps_conv_shape s0 = { .n = 2, .c = 3, .h = 6, .w = 6, .k = 4, .kh = 3, .kw = 3,
				    .pad = 1, .stride = 1 };
	struct ps_conv_shape big = s0;
	big.h = big.w = 6 + SHAPES;
	ps_conv_out(&big);
	size_t nx = (size_t)big.n * big.c * big.h * big.w, nw = (size_t)big.k * big.c * 9;
	size_t ny = (size_t)big.n * big.k * big.oh * big.ow, gws_n = 0, cws_n = 0;
	float *hx = randv(nx), *hW = randv(nw), *hb = randv(big.k);
	struct buf x = b_new(&p, hx, nx), W = b_new(&p, hW, nw), b = b_new(&p, hb, big.k);
	struct buf y = b_new(&p, NULL, ny);
	ck_assert_int_eq(go->conv2d_workspace(g, &big, &gws_n), 0);
	ck_assert_int_eq(co->conv2d_workspace(c, &big, &cws_n), 0);
	void *gws = go->alloc(g, gws_n + 256), *cws = co->alloc(c, cws_n);

	for (int round = 0; round < 2; round++) {
		for (int i = 0; i < (round ? 4 : SHAPES); i++) {
			struct ps_conv_shape s = s0;
			char what[64];
			s.h = s.w = 6 + i;
			ps_conv_out(&s);
			b_garbage(&p, &y);
			OK(&p, go->conv2d_fwd(g, &s, x.g, W.g, b.g, y.g, gws, gws_n + 256),
			   co->conv2d_fwd(c, &s, x.c, W.c, b.c, y.c, cws, cws_n));
			snprintf(what, sizeof(what), "conv y, shape %d, round %d", i, round);
			compare_n(&p, what, &y, (size_t)s.n * s.k * s.oh * s.ow, TOL);
		}
	}
	b_free(&p, &x), b_free(&p, &W), b_free(&p, &b), b_free(&p, &y);
	go->free(g, gws);
	co->free(c, cws);
	free(hx), free(hW), free(hb);
	pair_close(&p);
}
END_TEST

/* --------------------------------------------------------------- maxpool */

static const struct ps_pool_shape pool_shapes[] = {
	{ .n = 2, .c = 3, .h = 8, .w = 8, .size = 2 },
	{ .n = 1, .c = 2, .h = 7, .w = 9, .size = 3 },   /* leftover rows and columns */
	{ .n = 16, .c = 32, .h = 32, .w = 32, .size = 2 },
	{ .n = 64, .c = 32, .h = 28, .w = 28, .size = 2 }, /* the cnn preset's */
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
	float *hx = randv(nx), *hdy = randv(ny);
	struct buf x = b_new(&p, hx, nx), dy = b_new(&p, hdy, ny), y = b_new(&p, NULL, ny);
	struct buf idx = b_new(&p, NULL, ny), dx = b_new(&p, NULL, nx);
	int32_t *gi = (int32_t *)idx.g, *ci = (int32_t *)idx.c;

	OK(&p, go->maxpool_fwd(g, &s, x.g, y.g, gi), co->maxpool_fwd(c, &s, x.c, y.c, ci));
	compare(&p, "maxpool y", &y, 1e-7);
	/* Both backends record the same positions inside the (n, c) plane. */
	int32_t *hg = get(go, g, gi, ny * 4), *hc = get(co, c, ci, ny * 4);
	for (size_t i = 0; i < ny; i++)
		ck_assert_msg(hg[i] == hc[i], "maxpool idx[%zu] = %d, cpu %d", i, hg[i], hc[i]);
	OK(&p, go->maxpool_bwd(g, &s, dy.g, gi, dx.g), co->maxpool_bwd(c, &s, dy.c, ci, dx.c));
	compare(&p, "maxpool dx", &dx, 1e-7);

	/* An index outside its window is refused by both, and dx is left as
	 * it was: at once on the cpu, at the next sync on cuda. */
	hg[ny / 2] = (int32_t)(s.h * s.w);          /* past the plane */
	fill(go, g, gi, hg, ny * 4);
	fill(co, c, ci, hg, ny * 4);
	b_garbage(&p, &dx);
	ck_assert_int_eq(co->maxpool_bwd(c, &s, dy.c, ci, dx.c), -EINVAL);
	ck_assert_msg(strstr(c->err, "outside its"), "%s", c->err);
	ck_assert_int_eq(go->maxpool_bwd(g, &s, dy.g, gi, dx.g), 0);
	ck_assert_int_eq(go->sync(g), -EINVAL);
	ck_assert_msg(strstr(g->err, "outside its window"), "%s", g->err);
	float *after = get(go, g, dx.g, nx * 4);  /* the flag was reported: syncs again clean */
	for (size_t i = 0; i < nx; i++)
		ck_assert_msg(after[i] == GARBAGE, "dx[%zu] written (%g) despite a bad index", i,
			      after[i]);
	free(after);
	free(hg);
	free(hc);

	struct buf *all[] = { &x, &dy, &y, &idx, &dx };
	for (int i = 0; i < 5; i++)
		b_free(&p, all[i]);
	free(hx), free(hdy);
	pair_close(&p);
}
END_TEST

/* ------------------------------------------------------ embedding bags */

/* Random bags (0..5 entries, rows repeated) over nrows rows, sum or mean,
 * y wider than the bags: both directions against the cpu, the columns
 * beyond the bags untouched, and the backward repeated bit for bit (no
 * atomics: each row sums its bags in the order given). */
START_TEST(test_embedding_bag)
{
	const int examples = 300, fields = 26, dim = 16, pad = 13, nrows = 700;
	const int nbags = examples * fields, ldy = fields * dim + pad;
	struct ps_bag_shape s = { nbags, fields, dim, ldy, nrows, _i ? PS_BAG_MEAN : PS_BAG_SUM };
	char what[64];
	struct pair p;

	snprintf(what, sizeof(what), "embedding_bag %s", _i ? "mean" : "sum");
	if (!pair_open(&p, what))
		return;
	struct ps_compute *g = p.gpu, *c = p.cpu;
	const struct ps_compute_ops *go = p.go, *co = p.co;
	int32_t *off = malloc(sizeof(int32_t) * (nbags + 1)), *idx = malloc(sizeof(int32_t) * nbags * 5);
	int32_t *roff = calloc(nrows + 1, sizeof(int32_t)), *rbags = malloc(sizeof(int32_t) * nbags * 5);
	int32_t *cnt = calloc(nrows + 1, sizeof(int32_t));
	int nent = 0;

	for (int b = 0; b < nbags; b++) {
		int size = (int)((frand() + 1.0f) * 3.0f) % 6;
		off[b] = nent;
		for (int e = 0; e < size; e++)
			idx[nent++] = (int32_t)((frand() + 1.0f) * 0.5f * (nrows - 1));
	}
	off[nbags] = nent;
	for (int e = 0; e < nent; e++)
		cnt[idx[e] + 1]++;
	for (int r = 0; r < nrows; r++)
		roff[r + 1] = roff[r] + cnt[r + 1];
	memcpy(cnt, roff, sizeof(int32_t) * nrows);
	for (int b = 0; b < nbags; b++)
		for (int e = off[b]; e < off[b + 1]; e++)
			rbags[cnt[idx[e]]++] = b;
	float *hrows = randv((size_t)nrows * dim), *hdy = randv((size_t)examples * ldy);
	float *hy = malloc(sizeof(float) * examples * ldy);
	for (int i = 0; i < examples * ldy; i++)
		hy[i] = 7.0f;
	struct buf rows = b_new(&p, hrows, (size_t)nrows * dim), dy = b_new(&p, hdy, (size_t)examples * ldy);
	struct buf y = b_new(&p, hy, (size_t)examples * ldy), dr = b_new(&p, NULL, (size_t)nrows * dim);
	/* the int32 arrays ride in float buffers of the same size */
	struct buf boff = b_new(&p, (float *)off, nbags + 1), bidx = b_new(&p, (float *)idx, nent);
	struct buf broff = b_new(&p, (float *)roff, nrows + 1), brb = b_new(&p, (float *)rbags, nent);

	OK(&p, go->embedding_bag_fwd(g, &s, rows.g, (int32_t *)boff.g, (int32_t *)bidx.g, y.g),
	   co->embedding_bag_fwd(c, &s, rows.c, (int32_t *)boff.c, (int32_t *)bidx.c, y.c));
	compare(&p, "embedding_bag y", &y, TOL);
	float *gy = keep(&p, &y);
	for (int ex = 0; ex < examples; ex++)
		for (int j = fields * dim; j < ldy; j++)
			ck_assert_msg(gy[ex * ldy + j] == 7.0f, "y[%d][%d] written", ex, j);
	free(gy);
	OK(&p, go->embedding_bag_bwd(g, &s, dy.g, (int32_t *)boff.g, (int32_t *)broff.g,
				     (int32_t *)brb.g, dr.g, 0.125f),
	   co->embedding_bag_bwd(c, &s, dy.c, (int32_t *)boff.c, (int32_t *)broff.c,
				 (int32_t *)brb.c, dr.c, 0.125f));
	compare(&p, "embedding_bag drows", &dr, TOL);
	float *first = keep(&p, &dr);
	b_garbage(&p, &dr);
	OK(&p, go->embedding_bag_bwd(g, &s, dy.g, (int32_t *)boff.g, (int32_t *)broff.g,
				     (int32_t *)brb.g, dr.g, 0.125f), 0);
	same_bits(&p, "embedding_bag drows", &dr, first);
	free(first);

	struct buf *all[] = { &rows, &dy, &y, &dr, &boff, &bidx, &broff, &brb };
	for (int i = 0; i < 8; i++)
		b_free(&p, all[i]);
	free(off), free(idx), free(roff), free(rbags), free(cnt), free(hrows), free(hdy), free(hy);
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
	float *hx = randv(n), *hdy = randv(n);
	for (size_t i = 0; i < n; i += 97)
		hx[i] = 0.0f;    /* exact zeros: relu' is 0 there on both */
	struct buf x = b_new(&p, hx, n), dy = b_new(&p, hdy, n), y = b_new(&p, NULL, n);
	struct buf dx = b_new(&p, NULL, n);

	OK(&p, go->relu_fwd(g, x.g, y.g, n), co->relu_fwd(c, x.c, y.c, n));
	compare(&p, "relu y", &y, 1e-7);
	OK(&p, go->relu_bwd(g, y.g, dy.g, dx.g, n), co->relu_bwd(c, y.c, dy.c, dx.c, n));
	compare(&p, "relu dx", &dx, 1e-7);
	OK(&p, go->scale(g, y.g, x.g, -0.375f, n), co->scale(c, y.c, x.c, -0.375f, n));
	compare(&p, "scale", &y, 1e-7);
	OK(&p, go->scale(g, y.g, y.g, 3.0f, n), co->scale(c, y.c, y.c, 3.0f, n));
	compare(&p, "scale in place", &y, 1e-7);
	b_garbage(&p, &dx);
	OK(&p, go->scale(g, dx.g, x.g, 1.0f, n), co->scale(c, dx.c, x.c, 1.0f, n));
	compare(&p, "scale by 1 (copy)", &dx, 1e-7);
	OK(&p, go->zero(g, y.g, n - 1), co->zero(c, y.c, n - 1));
	compare(&p, "zero", &y, 1e-7);

	struct buf *all[] = { &x, &dy, &y, &dx };
	for (int i = 0; i < 4; i++)
		b_free(&p, all[i]);
	free(hx), free(hdy);
	pair_close(&p);
}
END_TEST

/* ---------------------------------------------------------- softmax_xent */

static const int xent_shapes[][2] = { /* n, classes */
	{ 37, 10 }, { 300, 1000 }, { 3000, 10 }, { 1, 1 }, { 5, 33 }, { 64, 10 },
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
	float *hz = randv(nl);
	int32_t *lab = malloc((size_t)n * sizeof(int32_t));
	ck_assert_ptr_nonnull(lab);
	for (size_t i = 0; i < nl; i++)
		hz[i] *= 8.0f;   /* a spread that makes argmax mostly right and wrong */
	for (int i = 0; i < n; i++) {
		lab[i] = (int32_t)((frand() + 1.0f) * 0.5f * classes) % classes;
		if (i % 3 == 0)   /* make some examples correct */
			hz[(size_t)i * classes + lab[i]] += 20.0f;
	}
	struct buf z = b_new(&p, hz, nl), d = b_new(&p, NULL, nl), labels = b_new(&p, NULL, n);
	fill(go, g, labels.g, lab, (size_t)n * 4);
	fill(co, c, labels.c, lab, (size_t)n * 4);
	int32_t *gl = (int32_t *)labels.g, *cl = (int32_t *)labels.c;
	float gloss = -1.0f, closs = -2.0f;
	int gright = -1, cright = -2;

	OK(&p, ps_compute_xent(g, z.g, gl, n, classes, d.g, &gloss, &gright),
	   ps_compute_xent(c, z.c, cl, n, classes, d.c, &closs, &cright));
	ck_assert_msg(fabs((double)gloss - closs) <= 1e-5 * fabs(closs) + 1e-7,
		      "loss %.9g, cpu %.9g", gloss, closs);
	ck_assert_int_eq(gright, cright);
	compare(&p, "dlogits", &d, TOL);

	/* Evaluation: no dlogits, same loss. */
	gloss = -1.0f;
	gright = -1;
	ck_assert_int_eq(ps_compute_xent(g, z.g, gl, n, classes, NULL, &gloss, &gright), 0);
	ck_assert_msg(fabs((double)gloss - closs) <= 1e-5 * fabs(closs) + 1e-7,
		      "loss (no dlogits) %.9g, cpu %.9g", gloss, closs);
	ck_assert_int_eq(gright, cright);

	/* A label out of range: refused by both in the same words, naming the
	 * example, and nothing written. */
	lab[n - 1] = classes;
	fill(go, g, gl, lab, (size_t)n * 4);
	fill(co, c, cl, lab, (size_t)n * 4);
	b_garbage(&p, &d);
	ck_assert_int_eq(ps_compute_xent(g, z.g, gl, n, classes, d.g, &gloss, &gright), -EINVAL);
	ck_assert_int_eq(ps_compute_xent(c, z.c, cl, n, classes, d.c, &closs, &cright), -EINVAL);
	ck_assert_str_eq(g->err, c->err);
	float *after = get(go, g, d.g, nl * 4);
	for (size_t i = 0; i < nl; i++)
		ck_assert_msg(after[i] == GARBAGE, "dlogits[%zu] written for a bad label", i);
	free(after);

	/* Logits that are not finite: PS_ENOFINITE on both. */
	lab[n - 1] = 0;
	hz[0] = INFINITY;
	fill(go, g, gl, lab, (size_t)n * 4);
	fill(co, c, cl, lab, (size_t)n * 4);
	fill(go, g, z.g, hz, nl * 4);
	fill(co, c, z.c, hz, nl * 4);
	ck_assert_int_eq(ps_compute_xent(g, z.g, gl, n, classes, d.g, &gloss, &gright),
			 PS_ENOFINITE);
	ck_assert_int_eq(ps_compute_xent(c, z.c, cl, n, classes, d.c, &closs, &cright),
			 PS_ENOFINITE);

	b_free(&p, &z), b_free(&p, &d), b_free(&p, &labels);
	free(hz);
	free(lab);
	pair_close(&p);
}
END_TEST

/* ------------------------------------------------- events, copy stream */

struct waiter {
	const struct ps_compute_ops *o;
	struct ps_compute *c;
	struct ps_compute_event *ev;
	int rc;
};

static void *wait_other_thread(void *arg)
{
	struct waiter *w = arg;

	w->rc = w->o->event_wait(w->c, w->ev);
	return NULL;
}

START_TEST(test_events)
{
	const size_t n = 1 << 20;
	struct pair p;

	if (!pair_open(&p, "events and async copies"))
		return;
	struct ps_compute *g = p.gpu;
	const struct ps_compute_ops *go = p.go;
	struct ps_compute_event *up, *down;
	float *h = go->host_alloc(g, n * 4), *back = go->host_alloc(g, n * 4);
	float *a = go->alloc(g, n * 4), *b = go->alloc(g, n * 4);
	ck_assert(h && back && a && b);
	ck_assert_int_eq(go->event_create(g, &up), 0);
	ck_assert_int_eq(go->event_create(g, &down), 0);
	for (size_t i = 0; i < n; i++)
		h[i] = (float)i;
	unsigned long syncs = g->host_syncs;

	/* upload on the copy stream, the compute stream waits for it, scales,
	 * and the result comes back on the copy stream behind an event that
	 * another thread waits for */
	ck_assert_int_eq(go->upload_async(g, a, h, n * 4, NULL, up), 0);
	ck_assert_int_eq(go->stream_wait(g, up), 0);
	ck_assert_int_eq(go->scale(g, b, a, 2.0f, n), 0);
	ck_assert_int_eq(go->download_async(g, back, b, n * 4, down), 0);
	struct waiter w = { go, g, down, -1 };
	pthread_t th;
	ck_assert_int_eq(pthread_create(&th, NULL, wait_other_thread, &w), 0);
	ck_assert_int_eq(pthread_join(th, NULL), 0);
	ck_assert_int_eq(w.rc, 0);
	ck_assert_uint_eq(g->host_syncs, syncs);  /* no sync() was needed */
	for (size_t i = 0; i < n; i++)
		ck_assert_msg(back[i] == 2.0f * (float)i, "back[%zu] = %g", i, back[i]);

	/* event_record on the compute stream, waited for by the host */
	ck_assert_int_eq(go->scale(g, b, a, 3.0f, n), 0);
	ck_assert_int_eq(go->event_record(g, up), 0);
	ck_assert_int_eq(go->event_wait(g, up), 0);
	ck_assert_int_eq(go->download(g, back, b, 4 * 4), 0);
	ck_assert_int_eq(go->sync(g), 0);
	ck_assert(back[3] == 9.0f);

	go->event_free(g, up);
	go->event_free(g, down);
	go->free(g, a);
	go->free(g, b);
	go->host_free(g, h);
	go->host_free(g, back);
	ck_assert_int_eq(go->sync(g), 0);  /* no free failed */
	pair_close(&p);
}
END_TEST

/* PS_CUDA_SYNC=1: the op that fails says so itself. */
START_TEST(test_sync_each_names_the_op)
{
	struct ps_pool_shape s = { .n = 1, .c = 1, .h = 4, .w = 4, .size = 2, .oh = 2, .ow = 2 };
	struct pair p;

	setenv("PS_CUDA_SYNC", "1", 1);  /* this test's process only */
	if (!pair_open(&p, "PS_CUDA_SYNC=1"))
		return;
	struct ps_compute *g = p.gpu;
	const struct ps_compute_ops *go = p.go;
	int32_t bad[4] = { 0, 2, 8, 99 };
	float *dy = go->alloc(g, 16), *dx = go->alloc(g, 64);
	int32_t *idx = (int32_t *)go->alloc(g, 16);
	ck_assert(dy && dx && idx);
	fill(go, g, idx, bad, sizeof(bad));
	ck_assert_int_eq(go->maxpool_bwd(g, &s, dy, idx, dx), -EINVAL);
	ck_assert_msg(strstr(g->err, "maxpool_bwd failed (PS_CUDA_SYNC=1") &&
		      strstr(g->err, "outside its window"), "%s", g->err);
	go->free(g, dy);
	go->free(g, dx);
	go->free(g, idx);
	pair_close(&p);
}
END_TEST

/* ------------------------------------------------------- whole networks */

static const char *const net_models[] = { "mlp", "cnn" };

/* One forward and backward of a preset through ps_net_* on both backends,
 * from the same weights and batch: the loss, and every gradient in the
 * order the pushes take them. */
START_TEST(test_whole_net)
{
	const char *model = net_models[_i];
	const int batch = 32;
	struct ps_config *cfg = calloc(1, sizeof(*cfg));
	struct ps_net gn, cn;
	char yaml[256], err[512], what[64];
	struct pair p;

	snprintf(what, sizeof(what), "whole %s step", model);
	ck_assert_ptr_nonnull(cfg);
	if (!pair_open(&p, what)) {
		free(cfg);
		return;
	}
	snprintf(yaml, sizeof(yaml), "cluster: {servers: [127.0.0.1:1], workers: 1}\n"
		 "model: {preset: %s}\n", model);
	ck_assert_int_eq(ps_config_load_string(cfg, yaml, "t.yaml", err, sizeof(err)), 0);
	ck_assert_msg(ps_net_init(&gn, cfg, p.go, p.gpu, batch, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(ps_net_init(&cn, cfg, p.co, p.cpu, batch, err, sizeof(err)) == 0, "%s", err);
	for (int t = 0; t < cfg->ntensors; t++)
		for (int64_t i = 0; i < cfg->tensors[t].count; i++)
			gn.host_w[t][i] = cn.host_w[t][i] = 0.1f * frand();
	float *x = NULL;
	int32_t y[batch];
	for (int i = 0; i < batch; i++)
		y[i] = (i * 7) % cfg->model.classes;
	ck_assert_int_eq(ps_net_upload_weights(&gn), 0);
	ck_assert_int_eq(ps_net_upload_weights(&cn), 0);
	/* A pre-activation within rounding of 0 may win a pooling window on
	 * one backend and not the other, which moves a gradient legitimately:
	 * such a batch is drawn again (the pooling choices must then agree). */
	for (int attempt = 0;; attempt++) {
		int same = 1;
		free(x);
		x = randv((size_t)batch * gn.in_count);
		ck_assert_int_eq(ps_net_load_batch(&gn, x, y, batch), 0);
		ck_assert_int_eq(ps_net_load_batch(&cn, x, y, batch), 0);
		ck_assert_msg(ps_net_forward(&gn) == 0, "cuda forward: %s", p.gpu->err);
		ck_assert_int_eq(ps_net_forward(&cn), 0);
		for (int i = 0; i < gn.nlayers; i++) {
			if (!gn.l[i].idx)
				continue;
			size_t bytes = (size_t)batch * gn.l[i].out_count * sizeof(int32_t);
			int32_t *gi = get(p.go, p.gpu, gn.l[i].idx, bytes);
			int32_t *ci = get(p.co, p.cpu, cn.l[i].idx, bytes);
			same &= memcmp(gi, ci, bytes) == 0;
			free(gi);
			free(ci);
		}
		if (same)
			break;
		ck_assert_msg(attempt < 3, "%s: maxpool chose other maxima in 4 batches", model);
	}
	uint64_t ggen, cgen;
	unsigned long syncs = p.gpu->host_syncs;
	ck_assert_msg(ps_net_backward(&gn, 0.5f, &ggen) == 0, "cuda backward: %s", p.gpu->err);
	ck_assert_msg(p.gpu->host_syncs == syncs, "cuda backward made %lu host syncs",
		      p.gpu->host_syncs - syncs);
	ck_assert_int_eq(ps_net_backward(&cn, 0.5f, &cgen), 0);
	for (int k = 0; k < gn.ngrads; k++) {
		int gwt, gbt, cwt, cbt;
		ck_assert_msg(ps_net_grad_wait(&gn, ggen, k, &gwt, &gbt) == 0, "%s", gn.err);
		ck_assert_int_eq(ps_net_grad_wait(&cn, cgen, k, &cwt, &cbt), 0);
		ck_assert_int_eq(gwt, cwt);
		ck_assert_int_eq(gbt, cbt);
		char name[128];
		snprintf(name, sizeof(name), "%s gradient %d: %s", model, k, cfg->tensors[gwt].name);
		check_close(name, gn.host_g[gwt], cn.host_g[cwt], (size_t)cfg->tensors[gwt].count, TOL);
		snprintf(name, sizeof(name), "%s gradient %d: %s", model, k, cfg->tensors[gbt].name);
		check_close(name, gn.host_g[gbt], cn.host_g[cbt], (size_t)cfg->tensors[gbt].count, TOL);
	}
	float gl, cl;
	int gc, cc;
	ck_assert_int_eq(ps_net_loss(&gn, &gl, &gc), 0);
	ck_assert_int_eq(ps_net_loss(&cn, &cl, &cc), 0);
	ck_assert_msg(fabs((double)gl - cl) <= 1e-5 * fabs(cl), "%s loss %.9g, cpu %.9g", model,
		      gl, cl);
	ck_assert_int_eq(gc, cc);
	/* the same step again on cuda: the same bits (bit-identical sync runs) */
	float **first = calloc((size_t)cfg->ntensors, sizeof(float *));
	ck_assert_ptr_nonnull(first);
	for (int t = 0; t < cfg->ntensors; t++) {
		first[t] = malloc((size_t)cfg->tensors[t].count * sizeof(float));
		ck_assert_ptr_nonnull(first[t]);
		memcpy(first[t], gn.host_g[t], (size_t)cfg->tensors[t].count * sizeof(float));
	}
	ck_assert_int_eq(ps_net_load_batch(&gn, x, y, batch), 0);
	ck_assert_int_eq(ps_net_forward(&gn), 0);
	ck_assert_int_eq(ps_net_backward(&gn, 0.5f, &ggen), 0);
	for (int k = 0; k < gn.ngrads; k++) {
		int wt, bt;
		ck_assert_int_eq(ps_net_grad_wait(&gn, ggen, k, &wt, &bt), 0);
	}
	for (int t = 0; t < cfg->ntensors; t++) {
		ck_assert_msg(memcmp(first[t], gn.host_g[t],
				     (size_t)cfg->tensors[t].count * sizeof(float)) == 0,
			      "%s: %s differs in a second identical step", model,
			      cfg->tensors[t].name);
		free(first[t]);
	}
	free(first);
	ps_net_free(&gn);
	ps_net_free(&cn);
	free(x);
	free(cfg);
	pair_close(&p);
}
END_TEST

static Suite *compute_cuda_suite(void)
{
	Suite *s = suite_create("compute_cuda");
	TCase *tc = tcase_create("core");

	/* First cuDNN use loads its engine libraries: seconds, not milliseconds. */
	tcase_set_timeout(tc, 180);
	tcase_add_test(tc, test_create);
	tcase_add_loop_test(tc, test_dense, 0, (int)(sizeof(dense_shapes) / sizeof(dense_shapes[0])));
	tcase_add_loop_test(tc, test_conv, 0, (int)(sizeof(conv_shapes) / sizeof(conv_shapes[0])));
	tcase_add_test(tc, test_conv_tf32);
	tcase_add_test(tc, test_conv_plan_eviction);
	tcase_add_loop_test(tc, test_maxpool, 0, (int)(sizeof(pool_shapes) / sizeof(pool_shapes[0])));
	tcase_add_test(tc, test_elementwise);
	tcase_add_loop_test(tc, test_embedding_bag, 0, 2);
	tcase_add_loop_test(tc, test_softmax_xent, 0,
			    (int)(sizeof(xent_shapes) / sizeof(xent_shapes[0])));
	tcase_add_test(tc, test_events);
	tcase_add_test(tc, test_sync_each_names_the_op);
	tcase_add_loop_test(tc, test_whole_net, 0, 2);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tu_run_suite(compute_cuda_suite()) ? EXIT_FAILURE : EXIT_SUCCESS;
}
