/* check_compute_dnnl.c - the oneDNN backend "cpu" against the plain reference
 * "ref", op by op and on whole forward and backward passes
 * (docs/architecture.md, Interfaces), as check_compute_cuda does for cuda.
 *
 * Each case runs the same op on random inputs through both backends and
 * compares with two bounds: normalized error ||cpu - ref|| / ||ref|| below
 * TOL, and the largest single difference below MAXABS times the largest
 * |ref| value. A value that is not finite fails at once, naming its
 * position. Outputs start as garbage on both sides, and are reset to
 * garbage before each variant of a call, so an op that fails to write
 * shows.
 *
 * Covered: dense (matmul) and conv2d (forward, backward data, backward
 * weights with bias) on the presets' shapes (5x5 pad 2 on 28x28 c=1 k=32
 * and on 14x14 c=32 k=64, batches 32 and 64; dense 3136x256) and odd ones
 * (stride 2, 1x1, 3x3 pad 2, single images, a smaller batch than the
 * workspace was sized for), with alpha scaling only dW and db and dx NULL;
 * relu; workspace refusals; the primitive cache past its size; the same
 * bits from a second run of every op and of a whole step, with 1 and 2
 * threads (sync runs repeat bit for bit only if every op does); whole mlp
 * and cnn steps through ps_net_* with gradients in push order and no host
 * synchronization inside backward. Pooling, the loss, memory and events
 * are the reference's own code on both (compute_dnnl.c), so they are
 * checked once, in check_compute.
 */
#include <check.h>
#include <math.h>
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
#define MAXABS 1e-4     /* largest |cpu - ref| over the largest |ref| */
#define GARBAGE 1.0e30f /* initial contents of every output */

/* Both backends, created for one case; the oneDNN one with threads. */
struct pair {
	const struct ps_compute_ops *fo, *ro;   /* cpu (oneDNN), ref */
	struct ps_compute *fast, *ref;
};

static void pair_open(struct pair *p, int threads)
{
	struct ps_compute_opts opts = { .threads = threads };
	char err[512] = "";

	memset(p, 0, sizeof(*p));
	ck_assert_int_eq(ps_compute_load("cpu", &p->fo, err, sizeof(err)), 0);
	ck_assert_int_eq(ps_compute_load("ref", &p->ro, err, sizeof(err)), 0);
	ck_assert_str_eq(p->fo->name, "cpu");
	ck_assert_str_eq(p->ro->name, "ref");
	ck_assert_msg(p->fo->create(&p->fast, &opts, err, sizeof(err)) == 0, "cpu: %s", err);
	ck_assert_msg(p->ro->create(&p->ref, NULL, err, sizeof(err)) == 0, "ref: %s", err);
}

static void pair_close(struct pair *p)
{
	p->fo->destroy(p->fast);
	p->ro->destroy(p->ref);
}

/* One tensor on both backends: f (cpu) and r (ref), n floats. */
struct buf {
	float *f, *r;
	size_t n;
};

static void b_garbage(struct pair *p, struct buf *b)
{
	float *h = malloc((b->n ? b->n : 1) * sizeof(float));

	ck_assert_ptr_nonnull(h);
	for (size_t i = 0; i < b->n; i++)
		h[i] = GARBAGE;
	fill(p->fo, p->fast, b->f, h, b->n * sizeof(float));
	fill(p->ro, p->ref, b->r, h, b->n * sizeof(float));
	free(h);
}

/* n floats on both backends, from h, or GARBAGE when h is NULL. */
static struct buf b_new(struct pair *p, const float *h, size_t n)
{
	struct buf b = { p->fo->alloc(p->fast, n * sizeof(float)),
			 p->ro->alloc(p->ref, n * sizeof(float)), n };

	ck_assert_msg(b.f && b.r, "alloc of %zu floats", n);
	if (h) {
		fill(p->fo, p->fast, b.f, h, n * sizeof(float));
		fill(p->ro, p->ref, b.r, h, n * sizeof(float));
	} else {
		b_garbage(p, &b);
	}
	return b;
}

static void b_free(struct pair *p, struct buf *b)
{
	p->fo->free(p->fast, b->f);
	p->ro->free(p->ref, b->r);
	memset(b, 0, sizeof(*b));
}

/* got (cpu) against want (ref), n floats: TOL and MAXABS. */
static void check_close(const char *what, const float *got, const float *want, size_t n)
{
	bc_check_close(what, "cpu", "ref", got, want, n, TOL, MAXABS);
}

static void compare_n(struct pair *p, const char *what, const struct buf *b, size_t n)
{
	float *f = get(p->fo, p->fast, b->f, n * sizeof(float));
	float *r = get(p->ro, p->ref, b->r, n * sizeof(float));

	check_close(what, f, r, n);
	free(f);
	free(r);
}

static void compare(struct pair *p, const char *what, const struct buf *b)
{
	compare_n(p, what, b, b->n);
}

static float *keep(struct pair *p, const struct buf *b)
{
	return get(p->fo, p->fast, b->f, b->n * sizeof(float));
}

static void same_bits(struct pair *p, const char *what, const struct buf *b, const float *first)
{
	float *now = keep(p, b);

	ck_assert_msg(memcmp(now, first, b->n * sizeof(float)) == 0,
		      "%s: a second run gave other bits", what);
	free(now);
}

#define OK(p, call_fast, call_ref)                                                         \
	do {                                                                               \
		int rc_f_ = (call_fast), rc_r_ = (call_ref);                               \
		ck_assert_msg(rc_f_ == 0, "cpu: %s (%s)", (p)->fast->err, ps_strerror(rc_f_)); \
		ck_assert_msg(rc_r_ == 0, "ref: %s (%s)", (p)->ref->err, ps_strerror(rc_r_)); \
	} while (0)

/* Cases run with 1 and with 2 oneDNN threads: _i's low bit. */
static int threads_of(int i)
{
	return (i & 1) + 1;
}

/* ----------------------------------------------------------------- dense */

static const int dense_shapes[][3] = { /* n, in, out */
	{ 7, 33, 10 }, { 64, 300, 129 }, { 1, 5, 1 },
	{ 64, 784, 256 }, { 64, 256, 128 }, { 64, 128, 10 },     /* the mlp preset's */
	{ 32, 3136, 256 }, { 64, 3136, 256 }, { 64, 256, 10 },   /* the cnn preset's */
};

START_TEST(test_dense)
{
	const int *sh = dense_shapes[_i / 2];
	const int n = sh[0], in = sh[1], out = sh[2];
	const float alpha = 0.25f / (float)n;
	struct pair p;

	pair_open(&p, threads_of(_i));
	float *hx = randv((size_t)n * in), *hW = randv((size_t)in * out), *hb = randv(out);
	float *hdy = randv((size_t)n * out);
	struct ps_compute *f = p.fast, *r = p.ref;
	const struct ps_compute_ops *fo = p.fo, *ro = p.ro;
	struct buf x = b_new(&p, hx, (size_t)n * in), W = b_new(&p, hW, (size_t)in * out);
	struct buf b = b_new(&p, hb, out), dy = b_new(&p, hdy, (size_t)n * out);
	struct buf y = b_new(&p, NULL, (size_t)n * out), dx = b_new(&p, NULL, (size_t)n * in);
	struct buf dW = b_new(&p, NULL, (size_t)in * out), db = b_new(&p, NULL, out);

	OK(&p, fo->dense_fwd(f, x.f, W.f, b.f, y.f, n, in, out),
	   ro->dense_fwd(r, x.r, W.r, b.r, y.r, n, in, out));
	compare(&p, "dense y", &y);
	OK(&p, fo->dense_bwd(f, x.f, W.f, dy.f, dx.f, dW.f, db.f, n, in, out, alpha),
	   ro->dense_bwd(r, x.r, W.r, dy.r, dx.r, dW.r, db.r, n, in, out, alpha));
	compare(&p, "dense dx", &dx);
	compare(&p, "dense dW", &dW);
	compare(&p, "dense db", &db);
	float *ky = keep(&p, &y), *kdx = keep(&p, &dx), *kdW = keep(&p, &dW), *kdb = keep(&p, &db);
	b_garbage(&p, &y), b_garbage(&p, &dx), b_garbage(&p, &dW), b_garbage(&p, &db);
	ck_assert_int_eq(fo->dense_fwd(f, x.f, W.f, b.f, y.f, n, in, out), 0);
	ck_assert_int_eq(fo->dense_bwd(f, x.f, W.f, dy.f, dx.f, dW.f, db.f, n, in, out, alpha), 0);
	same_bits(&p, "dense y", &y, ky);
	same_bits(&p, "dense dx", &dx, kdx);
	same_bits(&p, "dense dW", &dW, kdW);
	same_bits(&p, "dense db", &db, kdb);
	free(ky), free(kdx), free(kdW), free(kdb);
	/* dx NULL (first layer) and another alpha: dW, db still written, and right. */
	b_garbage(&p, &dW);
	b_garbage(&p, &db);
	OK(&p, fo->dense_bwd(f, x.f, W.f, dy.f, NULL, dW.f, db.f, n, in, out, 3.0f * alpha),
	   ro->dense_bwd(r, x.r, W.r, dy.r, NULL, dW.r, db.r, n, in, out, 3.0f * alpha));
	compare(&p, "dense dW (dx NULL)", &dW);
	compare(&p, "dense db (dx NULL)", &db);
	/* a bad shape is refused with a reason */
	f->err[0] = '\0';
	ck_assert_int_eq(fo->dense_fwd(f, x.f, W.f, b.f, y.f, 0, in, out), -EINVAL);
	ck_assert(f->err[0] != '\0');

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
	{ .n = 1, .c = 5, .h = 9, .w = 6, .k = 3, .kh = 4, .kw = 2, .pad = 0, .stride = 3 },
	{ .n = 8, .c = 32, .h = 16, .w = 16, .k = 64, .kh = 3, .kw = 3, .pad = 1, .stride = 1 },
	/* the cnn preset: 5x5 pad 2 on 28x28 and 14x14, batches 32 and 64 */
	{ .n = 32, .c = 1, .h = 28, .w = 28, .k = 32, .kh = 5, .kw = 5, .pad = 2, .stride = 1 },
	{ .n = 64, .c = 1, .h = 28, .w = 28, .k = 32, .kh = 5, .kw = 5, .pad = 2, .stride = 1 },
	{ .n = 32, .c = 32, .h = 14, .w = 14, .k = 64, .kh = 5, .kw = 5, .pad = 2, .stride = 1 },
	{ .n = 64, .c = 32, .h = 14, .w = 14, .k = 64, .kh = 5, .kw = 5, .pad = 2, .stride = 1 },
};

START_TEST(test_conv)
{
	struct ps_conv_shape s = conv_shapes[_i / 2];
	const float alpha = 0.5f / (float)s.n;
	struct pair p;

	ps_conv_out(&s);
	pair_open(&p, threads_of(_i));
	struct ps_compute *f = p.fast, *r = p.ref;
	const struct ps_compute_ops *fo = p.fo, *ro = p.ro;
	size_t nx = (size_t)s.n * s.c * s.h * s.w, nw = (size_t)s.k * s.c * s.kh * s.kw;
	size_t ny = (size_t)s.n * s.k * s.oh * s.ow, fws_n = 0, rws_n = 0;
	float *hx = randv(nx), *hW = randv(nw), *hb = randv(s.k), *hdy = randv(ny);

	ck_assert_msg(fo->conv2d_workspace(f, &s, &fws_n) == 0, "cpu workspace: %s", f->err);
	ck_assert_msg(ro->conv2d_workspace(r, &s, &rws_n) == 0, "ref workspace: %s", r->err);
	void *fws = fo->alloc(f, fws_n), *rws = ro->alloc(r, rws_n);
	ck_assert(fws && rws);
	struct buf x = b_new(&p, hx, nx), W = b_new(&p, hW, nw), b = b_new(&p, hb, s.k);
	struct buf dy = b_new(&p, hdy, ny), y = b_new(&p, NULL, ny), dx = b_new(&p, NULL, nx);
	struct buf dW = b_new(&p, NULL, nw), db = b_new(&p, NULL, s.k);

	OK(&p, fo->conv2d_fwd(f, &s, x.f, W.f, b.f, y.f, fws, fws_n),
	   ro->conv2d_fwd(r, &s, x.r, W.r, b.r, y.r, rws, rws_n));
	compare(&p, "conv y", &y);
	OK(&p, fo->conv2d_bwd(f, &s, x.f, W.f, dy.f, dx.f, dW.f, db.f, fws, fws_n, alpha),
	   ro->conv2d_bwd(r, &s, x.r, W.r, dy.r, dx.r, dW.r, db.r, rws, rws_n, alpha));
	compare(&p, "conv dx", &dx);
	compare(&p, "conv dW", &dW);
	compare(&p, "conv db", &db);
	/* deterministic: the same call again gives the same bits */
	float *ky = keep(&p, &y), *kdx = keep(&p, &dx), *kdW = keep(&p, &dW), *kdb = keep(&p, &db);
	b_garbage(&p, &y), b_garbage(&p, &dx), b_garbage(&p, &dW), b_garbage(&p, &db);
	ck_assert_int_eq(fo->conv2d_fwd(f, &s, x.f, W.f, b.f, y.f, fws, fws_n), 0);
	ck_assert_int_eq(fo->conv2d_bwd(f, &s, x.f, W.f, dy.f, dx.f, dW.f, db.f, fws, fws_n, alpha),
			 0);
	same_bits(&p, "conv y", &y, ky);
	same_bits(&p, "conv dx", &dx, kdx);
	same_bits(&p, "conv dW", &dW, kdW);
	same_bits(&p, "conv db", &db, kdb);
	free(ky), free(kdx), free(kdW), free(kdb);

	/* dx NULL (how the first layer runs), alpha 1: dW and db written, right. */
	b_garbage(&p, &dW);
	b_garbage(&p, &db);
	b_garbage(&p, &dx);
	OK(&p, fo->conv2d_bwd(f, &s, x.f, W.f, dy.f, NULL, dW.f, db.f, fws, fws_n, 1.0f),
	   ro->conv2d_bwd(r, &s, x.r, W.r, dy.r, NULL, dW.r, db.r, rws, rws_n, 1.0f));
	compare(&p, "conv dW (dx NULL)", &dW);
	compare(&p, "conv db (dx NULL)", &db);

	/* A smaller batch than the workspace was sized for (the last batch). */
	if (s.n > 1) {
		struct ps_conv_shape t = s;
		size_t tws = 0;
		t.n = s.n - 1;
		ck_assert_int_eq(fo->conv2d_workspace(f, &t, &tws), 0);
		ck_assert_msg(tws <= fws_n, "a smaller batch needs more workspace: %zu > %zu",
			      tws, fws_n);
		b_garbage(&p, &y);
		OK(&p, fo->conv2d_fwd(f, &t, x.f, W.f, b.f, y.f, fws, fws_n),
		   ro->conv2d_fwd(r, &t, x.r, W.r, b.r, y.r, rws, rws_n));
		compare_n(&p, "conv y (smaller batch)", &y, (size_t)t.n * s.k * s.oh * s.ow);
	}

	/* Too small a workspace, and a shape whose oh, ow were not filled in,
	 * are refused with a reason. */
	if (fws_n) {
		f->err[0] = '\0';
		ck_assert_int_eq(fo->conv2d_fwd(f, &s, x.f, W.f, b.f, y.f, fws, fws_n - 1), -EINVAL);
		ck_assert_msg(strstr(f->err, "workspace"), "%s", f->err);
		ck_assert_int_eq(fo->conv2d_bwd(f, &s, x.f, W.f, dy.f, dx.f, dW.f, db.f, NULL, 0,
						alpha), -EINVAL);
	}
	struct ps_conv_shape bad = s;
	bad.oh += 1;
	ck_assert_int_eq(fo->conv2d_fwd(f, &bad, x.f, W.f, b.f, y.f, fws, fws_n), -EINVAL);
	ck_assert_ptr_nonnull(strstr(f->err, "conv2d"));
	size_t none = 7;
	ck_assert_int_eq(fo->conv2d_workspace(f, &(struct ps_conv_shape){ .n = 1 }, &none), -EINVAL);
	ck_assert_uint_eq(none, 0);

	struct buf *all[] = { &x, &W, &b, &dy, &y, &dx, &dW, &db };
	for (int i = 0; i < 8; i++)
		b_free(&p, all[i]);
	fo->free(f, fws);
	ro->free(r, rws);
	free(hx), free(hW), free(hb), free(hdy);
	pair_close(&p);
}
END_TEST

/* More shapes than the primitive cache holds (48), then the first ones
 * again: primitives evicted and made anew give the same right answers. */
START_TEST(test_conv_cache_eviction)
{
	enum { SHAPES = 56 };
	struct pair p;

	pair_open(&p, 1);
	struct ps_compute *f = p.fast, *r = p.ref;
	const struct ps_compute_ops *fo = p.fo, *ro = p.ro;
	struct ps_conv_shape s0 = { .n = 2, .c = 3, .h = 6, .w = 6, .k = 4, .kh = 3, .kw = 3,
				    .pad = 1, .stride = 1 };
	struct ps_conv_shape big = s0;
	big.h = big.w = 6 + SHAPES;
	ps_conv_out(&big);
	size_t nx = (size_t)big.n * big.c * big.h * big.w, nw = (size_t)big.k * big.c * 9;
	size_t ny = (size_t)big.n * big.k * big.oh * big.ow, fws_n = 0, rws_n = 0;
	float *hx = randv(nx), *hW = randv(nw), *hb = randv(big.k);
	struct buf x = b_new(&p, hx, nx), W = b_new(&p, hW, nw), b = b_new(&p, hb, big.k);
	struct buf y = b_new(&p, NULL, ny);
	ck_assert_int_eq(fo->conv2d_workspace(f, &big, &fws_n), 0);
	ck_assert_int_eq(ro->conv2d_workspace(r, &big, &rws_n), 0);
	void *fws = fo->alloc(f, fws_n), *rws = ro->alloc(r, rws_n);

	for (int round = 0; round < 2; round++) {
		for (int i = 0; i < (round ? 4 : SHAPES); i++) {
			struct ps_conv_shape s = s0;
			char what[64];
			s.h = s.w = 6 + i;
			ps_conv_out(&s);
			b_garbage(&p, &y);
			OK(&p, fo->conv2d_fwd(f, &s, x.f, W.f, b.f, y.f, fws, fws_n),
			   ro->conv2d_fwd(r, &s, x.r, W.r, b.r, y.r, rws, rws_n));
			snprintf(what, sizeof(what), "conv y, shape %d, round %d", i, round);
			compare_n(&p, what, &y, (size_t)s.n * s.k * s.oh * s.ow);
		}
	}
	b_free(&p, &x), b_free(&p, &W), b_free(&p, &b), b_free(&p, &y);
	fo->free(f, fws);
	ro->free(r, rws);
	free(hx), free(hW), free(hb);
	pair_close(&p);
}
END_TEST

/* ------------------------------------------------------------------ relu */

START_TEST(test_relu)
{
	const size_t sizes[] = { 100003, 1, 64 * 32 * 28 * 28 };
	const size_t n = sizes[_i / 2];
	struct pair p;

	pair_open(&p, threads_of(_i));
	struct ps_compute *f = p.fast, *r = p.ref;
	const struct ps_compute_ops *fo = p.fo, *ro = p.ro;
	float *hx = randv(n), *hdy = randv(n);
	for (size_t i = 0; i < n; i += 97)
		hx[i] = 0.0f;    /* exact zeros: relu' is 0 there on both */
	struct buf x = b_new(&p, hx, n), dy = b_new(&p, hdy, n), y = b_new(&p, NULL, n);
	struct buf dx = b_new(&p, NULL, n);

	OK(&p, fo->relu_fwd(f, x.f, y.f, n), ro->relu_fwd(r, x.r, y.r, n));
	compare(&p, "relu y", &y);
	OK(&p, fo->relu_bwd(f, y.f, dy.f, dx.f, n), ro->relu_bwd(r, y.r, dy.r, dx.r, n));
	compare(&p, "relu dx", &dx);
	/* exact, not just close: relu moves values, it computes nothing */
	float *fy = keep(&p, &y), *ry = get(ro, r, y.r, n * 4);
	ck_assert(memcmp(fy, ry, n * 4) == 0);
	free(fy), free(ry);
	/* in place, as the net runs it */
	OK(&p, fo->relu_fwd(f, x.f, x.f, n), ro->relu_fwd(r, x.r, x.r, n));
	compare(&p, "relu in place", &x);

	struct buf *all[] = { &x, &dy, &y, &dx };
	for (int i = 0; i < 4; i++)
		b_free(&p, all[i]);
	free(hx), free(hdy);
	pair_close(&p);
}
END_TEST

/* ------------------------------------------------------- whole networks */

/* One step of net from x, y: the gradients, each tensor its own copy
 * (caller frees), and the loss. */
static float **net_step(struct ps_net *net, const struct ps_config *cfg, const float *x,
			const int32_t *y, int batch, float *loss, int *right)
{
	float **g = calloc((size_t)cfg->ntensors, sizeof(float *));
	unsigned long syncs = net->c->host_syncs;
	uint64_t gen;

	ck_assert_ptr_nonnull(g);
	ck_assert_int_eq(ps_net_load_batch(net, x, y, batch), 0);
	ck_assert_msg(ps_net_forward(net) == 0, "%s forward: %s", net->ops->name, net->c->err);
	syncs = net->c->host_syncs;
	ck_assert_msg(ps_net_backward(net, 0.5f / batch, &gen) == 0, "%s backward: %s",
		      net->ops->name, net->c->err);
	ck_assert_msg(net->c->host_syncs == syncs, "%s backward made %lu host syncs",
		      net->ops->name, net->c->host_syncs - syncs);
	for (int k = 0; k < net->ngrads; k++) {
		int wt, bt;
		ck_assert_msg(ps_net_grad_wait(net, gen, k, &wt, &bt) == 0, "%s", net->err);
		/* push order: the last weighted layer first */
		ck_assert_int_eq(wt, 2 * (net->ngrads - 1 - k));
		ck_assert_int_eq(bt, wt + 1);
	}
	for (int t = 0; t < cfg->ntensors; t++) {
		size_t bytes = (size_t)cfg->tensors[t].count * sizeof(float);
		g[t] = malloc(bytes);
		ck_assert_ptr_nonnull(g[t]);
		memcpy(g[t], net->host_g[t], bytes);
	}
	ck_assert_int_eq(ps_net_loss(net, loss, right), 0);
	return g;
}

static void free_grads(float **g, int n)
{
	for (int t = 0; t < n; t++)
		free(g[t]);
	free(g);
}

/* A forward and backward of a preset through ps_net_* on both backends,
 * from the same weights and batch: the loss, and every gradient in push
 * order; then the same step again on cpu gives the same bits. */
START_TEST(test_whole_net)
{
	static const char *const models[] = { "mlp", "cnn" };
	const char *model = models[_i / 2];
	const int batch = 32;
	struct ps_config *cfg = calloc(1, sizeof(*cfg));
	struct ps_net fn, rn;
	char yaml[256], err[512];
	struct pair p;

	ck_assert_ptr_nonnull(cfg);
	pair_open(&p, threads_of(_i));
	snprintf(yaml, sizeof(yaml), "cluster: {servers: [127.0.0.1:1], workers: 1}\n"
		 "model: {preset: %s}\n", model);
	ck_assert_int_eq(ps_config_load_string(cfg, yaml, "t.yaml", err, sizeof(err)), 0);
	ck_assert_msg(ps_net_init(&fn, cfg, p.fo, p.fast, batch, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(ps_net_init(&rn, cfg, p.ro, p.ref, batch, err, sizeof(err)) == 0, "%s", err);
	for (int t = 0; t < cfg->ntensors; t++)
		for (int64_t i = 0; i < cfg->tensors[t].count; i++)
			fn.host_w[t][i] = rn.host_w[t][i] = 0.1f * frand();
	ck_assert_int_eq(ps_net_upload_weights(&fn), 0);
	ck_assert_int_eq(ps_net_upload_weights(&rn), 0);
	int32_t y[batch];
	for (int i = 0; i < batch; i++)
		y[i] = (i * 7) % cfg->model.classes;
	/* A pre-activation within rounding of another may win a pooling window
	 * on one backend and not the other, which moves a gradient
	 * legitimately: such a batch is drawn again. */
	float *x = NULL;
	for (int attempt = 0;; attempt++) {
		int same = 1;
		free(x);
		x = randv((size_t)batch * fn.in_count);
		ck_assert_int_eq(ps_net_load_batch(&fn, x, y, batch), 0);
		ck_assert_int_eq(ps_net_load_batch(&rn, x, y, batch), 0);
		ck_assert_int_eq(ps_net_forward(&fn), 0);
		ck_assert_int_eq(ps_net_forward(&rn), 0);
		for (int i = 0; i < fn.nlayers; i++)
			if (fn.l[i].idx)
				same &= memcmp(fn.l[i].idx, rn.l[i].idx, (size_t)batch *
					       fn.l[i].out_count * sizeof(int32_t)) == 0;
		if (same)
			break;
		ck_assert_msg(attempt < 3, "%s: maxpool chose other maxima in 4 batches", model);
	}
	float fl, rl, fl2;
	int fc, rc, fc2;
	float **fg = net_step(&fn, cfg, x, y, batch, &fl, &fc);
	float **rg = net_step(&rn, cfg, x, y, batch, &rl, &rc);
	for (int t = 0; t < cfg->ntensors; t++) {
		char name[128];
		snprintf(name, sizeof(name), "%s gradient of %s", model, cfg->tensors[t].name);
		check_close(name, fg[t], rg[t], (size_t)cfg->tensors[t].count);
	}
	ck_assert_msg(fabs((double)fl - rl) <= 1e-5 * fabs(rl), "%s loss %.9g, ref %.9g", model,
		      fl, rl);
	ck_assert_int_eq(fc, rc);
	float **fg2 = net_step(&fn, cfg, x, y, batch, &fl2, &fc2);
	for (int t = 0; t < cfg->ntensors; t++)
		ck_assert_msg(memcmp(fg[t], fg2[t], (size_t)cfg->tensors[t].count * sizeof(float)) == 0,
			      "%s: %s differs in a second identical step", model,
			      cfg->tensors[t].name);
	ck_assert(fl == fl2 && fc == fc2);
	free_grads(fg, cfg->ntensors);
	free_grads(fg2, cfg->ntensors);
	free_grads(rg, cfg->ntensors);
	ps_net_free(&fn);
	ps_net_free(&rn);
	free(x);
	free(cfg);
	pair_close(&p);
}
END_TEST

static Suite *compute_dnnl_suite(void)
{
	Suite *s = suite_create("compute_dnnl");
	TCase *tc = tcase_create("core");

	/* generous: sanitizer builds on a loaded 2-core machine */
	tcase_set_timeout(tc, 300);
	tcase_add_loop_test(tc, test_dense, 0,
			    2 * (int)(sizeof(dense_shapes) / sizeof(dense_shapes[0])));
	tcase_add_loop_test(tc, test_conv, 0, 2 * (int)(sizeof(conv_shapes) / sizeof(conv_shapes[0])));
	tcase_add_test(tc, test_conv_cache_eviction);
	tcase_add_loop_test(tc, test_relu, 0, 6);
	tcase_add_loop_test(tc, test_whole_net, 0, 4);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tu_run_suite(compute_dnnl_suite()) ? EXIT_FAILURE : EXIT_SUCCESS;
}
