/* check_criteo.c - click logs: Criteo's format read back exactly from
 * plain and gzip files, malformed lines refused with FILE:LINE and the
 * text, the generator's distributions (Zipf ranks, drift retiring values,
 * click rate), determinism per example, and the AUC it reports. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include "criteo.h"
#include "ctr_gen.h"
#include "ps_err.h"
#include "test_util.h"

static void write_log(const char *path, const struct ps_ctr_gen *g, int n, int gz)
{
	gzFile f = gzopen(path, gz ? "wb" : "wbT");
	char line[1024];

	ck_assert_ptr_nonnull(f);
	for (int i = 0; i < n; i++) {
		struct ps_ctr_example ex;
		double p;
		ps_ctr_gen_example(g, (uint64_t)i, &ex, &p);
		size_t len = ps_criteo_format(&ex, line);
		ck_assert_int_eq(gzwrite(f, line, (unsigned)len), (int)len);
	}
	ck_assert_int_eq(gzclose(f), Z_OK);
}

START_TEST(test_roundtrip_plain_and_gzip)
{
	struct ps_ctr_gen_cfg gc;
	struct ps_ctr_gen g;
	char path[] = "/tmp/ps-criteo-XXXXXX", err[300];
	int fd = mkstemp(path), n = 3000, missing = 0;

	close(fd);
	ps_ctr_gen_default(&gc);
	gc.scale = 0.001;
	gc.missing = 0.05;
	ck_assert_int_eq(ps_ctr_gen_init(&g, &gc), 0);
	write_log(path, &g, n, _i);
	/* gzip really was written when asked: its magic */
	FILE *raw = fopen(path, "rb");
	int b0 = fgetc(raw), b1 = fgetc(raw);
	fclose(raw);
	ck_assert_int_eq(b0 == 0x1f && b1 == 0x8b, _i);
	struct ps_criteo *r;
	ck_assert_int_eq(ps_criteo_open(&r, path, err, sizeof(err)), 0);
	for (int i = 0; i < n; i++) {
		struct ps_ctr_example got, want;
		double p;
		ck_assert_msg(ps_criteo_next(r, &got, err, sizeof(err)) == 1, "%d: %s", i, err);
		ps_ctr_gen_example(&g, (uint64_t)i, &want, &p);
		ck_assert_int_eq(memcmp(&got, &want, sizeof(got)), 0);
		missing += __builtin_popcount(got.cat_missing);
	}
	ck_assert_int_eq(ps_criteo_next(r, &(struct ps_ctr_example){ 0 }, err, sizeof(err)), 0);
	ps_criteo_close(r);
	/* 5% of 26 x 3000 fields empty, give or take */
	ck_assert_int_gt(missing, 3000 * 26 / 40);
	ck_assert_int_lt(missing, 3000 * 26 / 12);
	unlink(path);
}
END_TEST

START_TEST(test_malformed_lines)
{
	char path[64], err[300];
	const char *good = "1\t1\t2\t3\t4\t5\t6\t7\t8\t9\t10\t11\t12\t13"
			   "\ta\tb\tc\td\te\tf\t1\t2\t3\t4\t5\t6\t7\t8\t9\t10\t11\t12\t13\t14\t15\t16\t17"
			   "\t18\t\t\n";
	char text[4096];
	struct ps_criteo *r;
	struct ps_ctr_example ex;
	static const struct {
		const char *line, *words;
	} bad[] = {
		{ "2\t1\n", "label: expected 0 or 1, got '2'" },
		{ "1\tx1\n", "integer feature 1: expected an integer, got 'x1'" },
		{ "0\t1\t2\n", "expected 40 tab-separated fields" },
		{ NULL, "categorical feature 3: expected hexadecimal, got 'zz'" },
	};

	snprintf(text, sizeof(text), "%s%s%s%s", good, bad[0].line, bad[1].line, bad[2].line);
	/* a good line with one categorical spoiled */
	char spoiled[600];
	snprintf(spoiled, sizeof(spoiled), "%s", good);
	char *c3 = strstr(spoiled, "\tc\t");
	memcpy(c3, "\tzz\t", 4);
	memmove(c3 + 4, c3 + 3, strlen(c3 + 3) + 1);
	memcpy(c3 + 1, "zz", 2);
	strcat(text, spoiled);
	strcat(text, good);
	ck_assert_int_eq(tu_write_temp(path, text), 0);
	ck_assert_int_eq(ps_criteo_open(&r, path, err, sizeof(err)), 0);
	ck_assert_int_eq(ps_criteo_next(r, &ex, err, sizeof(err)), 1);
	ck_assert_int_eq(ex.label, 1);
	ck_assert_int_eq(ex.num[12], 13);
	ck_assert_uint_eq(ex.cat[0], 0xa);
	ck_assert_uint_eq(ex.cat_missing, 3u << 24);
	for (int k = 0; k < 4; k++) {
		char want[100];
		ck_assert_int_eq(ps_criteo_next(r, &ex, err, sizeof(err)), PS_EPROTO);
		snprintf(want, sizeof(want), "%s:%d: ", path, k + 2);
		ck_assert_msg(strstr(err, want) == err, "'%s' does not start with '%s'", err, want);
		ck_assert_msg(strstr(err, bad[k].words), "'%s' does not say '%s'", err, bad[k].words);
	}
	/* and the reader goes on with the next line */
	ck_assert_int_eq(ps_criteo_next(r, &ex, err, sizeof(err)), 1);
	ck_assert_int_eq(ps_criteo_next(r, &ex, err, sizeof(err)), 0);
	ps_criteo_close(r);
	unlink(path);
	ck_assert_int_lt(ps_criteo_open(&r, "/nonexistent/x.tsv", err, sizeof(err)), 0);
	ck_assert_ptr_nonnull(strstr(err, "/nonexistent/x.tsv"));
}
END_TEST

START_TEST(test_generator_distributions)
{
	struct ps_ctr_gen_cfg gc;
	struct ps_ctr_gen g;
	struct ps_auc auc;
	int n = 40000, ones = 0, f = 2; /* field 2: the largest, exponent 0.924 */
	uint64_t clicks = 0, sum = 0;

	ps_ctr_gen_default(&gc);
	gc.scale = 0.01;
	ck_assert_int_eq(ps_ctr_gen_init(&g, &gc), 0);
	uint64_t card = 0;
	for (int k = 0; k < PS_CTR_CAT; k++) {
		card += ps_ctr_kaggle_card[k];
		ck_assert(g.s[k] >= 0.9 - 1e-9 && g.s[k] <= 1.2 + 1e-9);
	}
	ck_assert_uint_eq(card, 9249296);
	ck_assert_uint_eq(ps_ctr_kaggle_card[2], 2590000);
	/* rank 1's share against the Zipf law: 1 / H(n, s) */
	double h = 0;
	for (uint64_t r = 1; r <= g.card[f]; r++)
		h += pow((double)r, -g.s[f]);
	for (int i = 0; i < n; i++) {
		uint64_t r = ps_ctr_gen_rank(&g, (uint64_t)i, f);
		ck_assert(r >= 1 && r <= g.card[f]);
		ones += r == 1;
	}
	double want = n / h;
	ck_assert_msg(fabs(ones - want) < 5 * sqrt(want), "rank 1 drawn %d times, expected %.0f",
		      ones, want);
	/* clicks and the best AUC */
	ck_assert_int_eq(ps_auc_init(&auc), 0);
	for (int i = 0; i < n; i++) {
		struct ps_ctr_example ex;
		double p;
		ps_ctr_gen_example(&g, (uint64_t)i, &ex, &p);
		clicks += (uint64_t)ex.label;
		sum += ex.cat[0];
		ps_auc_add(&auc, p, ex.label);
	}
	double best = ps_auc_value(&auc);
	ck_assert_msg(clicks > (uint64_t)n / 8 && clicks < (uint64_t)n * 2 / 5, "%lu clicks",
		      (unsigned long)clicks);
	ck_assert_msg(best > 0.7 && best < 0.97, "best AUC %f", best);
	ps_auc_free(&auc);
	/* an example depends on its number only */
	struct ps_ctr_example a, b;
	double pa, pb;
	ps_ctr_gen_example(&g, 12345, &a, &pa);
	ps_ctr_gen_example(&g, 7, &b, &pb);
	ps_ctr_gen_example(&g, 12345, &b, &pb);
	ck_assert_int_eq(memcmp(&a, &b, sizeof(a)), 0);
	ck_assert(pa == pb);
	/* drift: the value of rank 1 moves on; without drift it stays */
	struct ps_ctr_gen gd;
	gc.drift = 1.0;
	ck_assert_int_eq(ps_ctr_gen_init(&gd, &gc), 0);
	int same0 = 0, samel = 0, late = 0;
	for (uint64_t i = 0; i < 2000; i++) {
		struct ps_ctr_example e0, el;
		double p;
		ps_ctr_gen_example(&gd, i, &e0, &p);
		ps_ctr_gen_example(&g, i, &el, &p);
		same0 += !e0.cat_missing && !el.cat_missing && e0.cat[8] == el.cat[8];
		ps_ctr_gen_example(&gd, 3000000 + i, &el, &p);
		samel += e0.cat[8] == el.cat[8];
		late++;
	}
	ck_assert_int_gt(same0, 1000);  /* at the start drift has not moved anything */
	ck_assert_int_lt(samel, late / 20); /* 3 cardinalities later: other values */
	(void)sum;
}
END_TEST

START_TEST(test_auc)
{
	struct ps_auc a;

	ck_assert_int_eq(ps_auc_init(&a), 0);
	for (int i = 0; i < 100; i++) {
		ps_auc_add(&a, 0.9, 1);
		ps_auc_add(&a, 0.1, 0);
	}
	ck_assert(fabs(ps_auc_value(&a) - 1.0) < 1e-12);
	ps_auc_add(&a, 0.05, 1); /* one positive below every negative */
	ck_assert(fabs(ps_auc_value(&a) - 100.0 * 100 / (101.0 * 100)) < 1e-12);
	ps_auc_free(&a);
	ck_assert_int_eq(ps_auc_init(&a), 0);
	ps_auc_add(&a, 0.5, 1);
	ps_auc_add(&a, 0.5, 0); /* a tie counts half */
	ck_assert(fabs(ps_auc_value(&a) - 0.5) < 1e-12);
	ps_auc_free(&a);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("criteo");
	TCase *tc = tcase_create("criteo");
	int failed;

	tcase_set_timeout(tc, 60);
	TU_ADD_LOOP(tc, test_roundtrip_plain_and_gzip, 0, 2);
	TU_ADD(tc, test_malformed_lines);
	TU_ADD(tc, test_generator_distributions);
	TU_ADD(tc, test_auc);
	suite_add_tcase(s, tc);
	failed = tu_run_suite(s);
	return failed ? 1 : 0;
}
