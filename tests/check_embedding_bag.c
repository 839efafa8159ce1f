/* check_embedding_bag.c - the cpu backend's embedding_bag_fwd/bwd against
 * a naive implementation (random bags of 0..5 entries, repeated rows,
 * sum and mean, y wider than the bags), their refusals, and the ctr
 * loop's exact AUC and click-log loading. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "compute.h"
#include "criteo.h"
#include "ctr_train.h"
#include "ps_err.h"
#include "test_util.h"

static uint64_t rng(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static float frand(uint64_t *s)
{
	return (float)((double)(rng(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

struct batch {
	struct ps_bag_shape s;
	int32_t *off, *idx, *roff, *rbags;
	float *rows, *dy;
};

/* Random bags over nrows rows; the transpose built by counting. */
static void make_batch(struct batch *b, int examples, int fields, int dim, int pad, int nrows,
		       enum ps_bag_mode mode, uint64_t seed)
{
	int nbags = examples * fields, nent = 0;
	int *cnt = calloc((size_t)nrows + 1, sizeof(int));

	b->s = (struct ps_bag_shape){ nbags, fields, dim, fields * dim + pad, nrows, mode };
	b->off = malloc(sizeof(int32_t) * (size_t)(nbags + 1));
	b->idx = malloc(sizeof(int32_t) * (size_t)nbags * 5 + 4);
	for (int k = 0; k < nbags; k++) {
		int size = (int)(rng(&seed) % 6);
		b->off[k] = nent;
		for (int e = 0; e < size; e++)
			b->idx[nent++] = (int32_t)(rng(&seed) % (uint64_t)nrows);
	}
	b->off[nbags] = nent;
	b->roff = malloc(sizeof(int32_t) * (size_t)(nrows + 1));
	b->rbags = malloc(sizeof(int32_t) * (size_t)nent + 4);
	for (int e = 0; e < nent; e++)
		cnt[b->idx[e] + 1]++;
	b->roff[0] = 0;
	for (int r = 0; r < nrows; r++)
		b->roff[r + 1] = b->roff[r] + cnt[r + 1];
	for (int r = 0; r < nrows; r++)
		cnt[r] = b->roff[r];
	for (int k = 0; k < nbags; k++)
		for (int e = b->off[k]; e < b->off[k + 1]; e++)
			b->rbags[cnt[b->idx[e]]++] = k;
	b->rows = malloc(sizeof(float) * (size_t)nrows * dim);
	for (int i = 0; i < nrows * dim; i++)
		b->rows[i] = frand(&seed);
	b->dy = malloc(sizeof(float) * (size_t)examples * b->s.ldy);
	for (int i = 0; i < examples * b->s.ldy; i++)
		b->dy[i] = frand(&seed);
	free(cnt);
}

static void free_batch(struct batch *b)
{
	free(b->off);
	free(b->idx);
	free(b->roff);
	free(b->rbags);
	free(b->rows);
	free(b->dy);
}

static void check_case(int examples, int fields, int dim, int pad, int nrows,
		       enum ps_bag_mode mode, uint64_t seed)
{
	const struct ps_compute_ops *o = &ps_compute_cpu_ops;
	struct ps_compute *c;
	struct batch b;
	char err[256];
	size_t ny;
	float *y, *drows;
	double *want;
	const float alpha = 0.25f;

	ck_assert_int_eq(o->create(&c, NULL, err, sizeof(err)), 0);
	make_batch(&b, examples, fields, dim, pad, nrows, mode, seed);
	ny = (size_t)examples * b.s.ldy;
	y = malloc(sizeof(float) * ny);
	for (size_t i = 0; i < ny; i++)
		y[i] = 7.0f; /* the numeric columns must stay */
	ck_assert_int_eq(o->embedding_bag_fwd(c, &b.s, b.rows, b.off, b.idx, y), 0);
	for (int k = 0; k < examples * fields; k++) {
		int ex = k / fields, f = k % fields, size = b.off[k + 1] - b.off[k];
		for (int d = 0; d < dim; d++) {
			double sum = 0;
			for (int e = b.off[k]; e < b.off[k + 1]; e++)
				sum += b.rows[(size_t)b.idx[e] * dim + d];
			if (mode == PS_BAG_MEAN && size)
				sum /= size;
			float got = y[(size_t)ex * b.s.ldy + f * dim + d];
			ck_assert_msg(fabs(got - sum) <= 1e-5 * (1 + fabs(sum)),
				      "fwd bag %d d %d: %g, want %g", k, d, got, sum);
		}
	}
	for (int ex = 0; ex < examples; ex++)
		for (int j = fields * dim; j < b.s.ldy; j++)
			ck_assert(y[(size_t)ex * b.s.ldy + j] == 7.0f);
	/* backward: for each entry naming row r, add the bag's dy slot */
	drows = malloc(sizeof(float) * (size_t)nrows * dim + 4);
	want = calloc((size_t)nrows * dim + 1, sizeof(double));
	for (int k = 0; k < examples * fields; k++) {
		int size = b.off[k + 1] - b.off[k];
		for (int e = b.off[k]; e < b.off[k + 1]; e++)
			for (int d = 0; d < dim; d++)
				want[(size_t)b.idx[e] * dim + d] +=
					b.dy[(size_t)(k / fields) * b.s.ldy + (k % fields) * dim + d] /
					(mode == PS_BAG_MEAN ? size : 1);
	}
	ck_assert_int_eq(o->embedding_bag_bwd(c, &b.s, b.dy, b.off, b.roff, b.rbags, drows, alpha), 0);
	for (int i = 0; i < nrows * dim; i++)
		ck_assert_msg(fabs(drows[i] - alpha * want[i]) <= 1e-5 * (1 + fabs(want[i])),
			      "bwd %d: %g, want %g", i, drows[i], alpha * want[i]);
	free(y);
	free(drows);
	free(want);
	free_batch(&b);
	o->destroy(c);
}

START_TEST(test_fwd_bwd_against_naive)
{
	check_case(1, 1, 1, 0, 1, PS_BAG_SUM, 1);
	check_case(33, 26, 16, 13, 50, PS_BAG_SUM, 2);
	check_case(33, 26, 16, 13, 50, PS_BAG_MEAN, 3);
	check_case(7, 3, 5, 0, 1000, PS_BAG_MEAN, 4);   /* most rows unused: zero gradient */
	check_case(64, 4, 8, 2, 3, PS_BAG_SUM, 5);      /* heavy repeats */
}
END_TEST

START_TEST(test_refusals)
{
	const struct ps_compute_ops *o = &ps_compute_cpu_ops;
	struct ps_compute *c;
	struct batch b;
	char err[256];
	float y[2 * 8 * 4];

	ck_assert_int_eq(o->create(&c, NULL, err, sizeof(err)), 0);
	make_batch(&b, 2, 8, 4, 0, 10, PS_BAG_SUM, 9);
	b.s.ldy = 8 * 4 - 1;
	ck_assert_int_eq(o->embedding_bag_fwd(c, &b.s, b.rows, b.off, b.idx, y), -EINVAL);
	ck_assert_msg(strstr(c->err, "bad shape"), "%s", c->err);
	b.s.ldy = 8 * 4;
	b.s.nbags = 15;   /* not examples x fields */
	ck_assert_int_eq(o->embedding_bag_fwd(c, &b.s, b.rows, b.off, b.idx, y), -EINVAL);
	b.s.nbags = 16;
	b.s.mode = (enum ps_bag_mode)2;
	ck_assert_int_eq(o->embedding_bag_bwd(c, &b.s, b.dy, b.off, b.roff, b.rbags, b.rows, 1), -EINVAL);
	b.s.mode = PS_BAG_SUM;
	ck_assert_int_gt(b.off[16], 0);
	int32_t keep = b.idx[0];
	b.idx[0] = 10;    /* past nrows */
	memset(y, 0x7f, sizeof(y));
	ck_assert_int_eq(o->embedding_bag_fwd(c, &b.s, b.rows, b.off, b.idx, y), -EINVAL);
	ck_assert_msg(strstr(c->err, "idx[0] = 10") && strstr(c->err, "outside 0..9"), "%s", c->err);
	for (size_t i = 0; i < sizeof(y) / sizeof(y[0]); i++) /* nothing written */
		ck_assert(y[i] != 0.0f && !isnan(y[i]));
	b.idx[0] = keep;
	b.rbags[0] = 16;  /* past nbags */
	ck_assert_int_eq(o->embedding_bag_bwd(c, &b.s, b.dy, b.off, b.roff, b.rbags, b.rows, 1), -EINVAL);
	ck_assert_msg(strstr(c->err, "row_bags[0] = 16"), "%s", c->err);
	free_batch(&b);
	o->destroy(c);
}
END_TEST

START_TEST(test_auc)
{
	float s1[] = { 0.1f, 0.2f, 0.3f, 0.4f };
	int32_t l1[] = { 0, 0, 1, 1 };
	float s2[] = { 0.9f, 0.8f, 0.3f, 0.1f };
	int32_t l2[] = { 0, 0, 1, 1 };
	float s3[] = { 0.5f, 0.5f, 0.5f, 0.5f };
	int32_t l3[] = { 0, 1, 0, 1 };
	/* one positive tied with one negative, above the other negative */
	float s4[] = { 0.7f, 0.7f, 0.2f };
	int32_t l4[] = { 1, 0, 0 };
	int32_t l5[] = { 1, 1, 1 };

	ck_assert(fabs(ps_ctr_auc(s1, l1, 4) - 1.0) < 1e-12);
	ck_assert(fabs(ps_ctr_auc(s2, l2, 4) - 0.0) < 1e-12);
	ck_assert(fabs(ps_ctr_auc(s3, l3, 4) - 0.5) < 1e-12);
	ck_assert(fabs(ps_ctr_auc(s4, l4, 3) - 0.75) < 1e-12);
	ck_assert(isnan(ps_ctr_auc(s4, l5, 3)));
	/* against the pair count on random scores with many ties */
	enum { N = 2000 };
	static float s[N];
	static int32_t l[N];
	uint64_t seed = 11;
	double pairs = 0, np = 0, nn = 0;
	for (int i = 0; i < N; i++) {
		s[i] = (float)(rng(&seed) % 50);
		l[i] = (int32_t)(rng(&seed) % 3 == 0);
	}
	for (int i = 0; i < N; i++)
		for (int j = 0; j < N; j++)
			if (l[i] && !l[j])
				pairs += s[i] > s[j] ? 1 : s[i] == s[j] ? 0.5 : 0;
	for (int i = 0; i < N; i++)
		l[i] ? np++ : nn++;
	ck_assert(fabs(ps_ctr_auc(s, l, N) - pairs / (np * nn)) < 1e-9);
}
END_TEST

START_TEST(test_load)
{
	char path[64], err[256];
	FILE *f;
	struct ps_ctr_data d;
	struct ps_ctr_example ex = { 0 };
	char line[512];

	snprintf(path, sizeof(path), "/tmp/ps-ctr-load-XXXXXX");
	int fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	f = fdopen(fd, "w");
	for (int i = 0; i < 3; i++) {
		ex.label = i == 1;
		ex.num[0] = i == 2 ? -1 : 9;
		ex.num_missing = 1 << 1;
		for (int k = 0; k < PS_CTR_CAT; k++)
			ex.cat[k] = 0x100 + (uint64_t)k + (uint64_t)i;
		ex.cat_missing = 1u << 3;
		ex.cat[3] = 0;
		ck_assert(fwrite(line, 1, ps_criteo_format(&ex, line), f) > 0);
	}
	fclose(f);
	ck_assert_int_eq(ps_ctr_load(&d, path, 2, err, sizeof(err)), 0);
	ck_assert_int_eq(d.n, 2);
	ck_assert_int_eq(d.label[0], 0);
	ck_assert_int_eq(d.label[1], 1);
	ck_assert(fabs(d.num[0] - log(10.0)) < 1e-6);
	ck_assert(d.num[1] == 0.0f);
	ck_assert(d.ids[5] == ps_criteo_id(5, 0x105, 0));
	ck_assert(d.ids[3] == ps_criteo_id(3, 0, 1));
	ps_ctr_data_free(&d);
	ck_assert_int_eq(ps_ctr_load(&d, path, 0, err, sizeof(err)), 0);
	ck_assert_int_eq(d.n, 3);
	ck_assert(d.num[2 * PS_CTR_NUM] == 0.0f); /* -1: not positive */
	ps_ctr_data_free(&d);
	unlink(path);
	ck_assert_int_lt(ps_ctr_load(&d, "/nonexistent/ctr.tsv", 0, err, sizeof(err)), 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("embedding_bag");
	TCase *tc = tcase_create("cpu");

	tcase_add_test(tc, test_fwd_bwd_against_naive);
	tcase_add_test(tc, test_refusals);
	tcase_add_test(tc, test_auc);
	tcase_add_test(tc, test_load);
	suite_add_tcase(s, tc);
	return tu_run_suite(s) ? 1 : 0;
}
