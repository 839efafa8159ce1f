/* check_histo.c - the latency histogram: values land in the bucket whose
 * bound is the first at or above them, quantiles fall inside the right
 * bucket and grow with q, an empty histogram has no quantile. */
#include <check.h>
#include <math.h>
#include "histo.h"
#include "test_util.h"

static int bucket_of(double seconds)
{
	struct ps_histo h = { 0 };

	ps_histo_add(&h, seconds);
	for (int i = 0; i < PS_HISTO_BUCKETS; i++)
		if (h.count[i])
			return i;
	return -1;
}

START_TEST(test_buckets)
{
	ck_assert_int_eq(bucket_of(-1.0), 0);
	ck_assert_int_eq(bucket_of(0.0), 0);
	ck_assert_int_eq(bucket_of(1e-6), 0);
	ck_assert_int_eq(bucket_of(1.5e-6), 1);
	ck_assert_int_eq(bucket_of(2e-6), 1);
	ck_assert_int_eq(bucket_of(2.001e-6), 2);
	ck_assert_int_eq(bucket_of(1e-3), 10);     /* 1000 us: 512 < x <= 1024 */
	ck_assert_int_eq(bucket_of(67.0), 26);     /* 2^26 us = 67.1 s */
	ck_assert_int_eq(bucket_of(68.0), PS_HISTO_BUCKETS - 1);
	ck_assert_int_eq(bucket_of(1e9), PS_HISTO_BUCKETS - 1);
	for (int i = 0; i < PS_HISTO_BUCKETS - 1; i++) {
		/* every bound belongs to its own bucket, just above it to the next */
		ck_assert_int_eq(bucket_of(ps_histo_bound_s(i)), i);
		ck_assert_int_eq(bucket_of(ps_histo_bound_s(i) * 1.001), i + 1);
	}
	ck_assert(isinf(ps_histo_bound_s(PS_HISTO_BUCKETS - 1)));
}
END_TEST

START_TEST(test_quantiles)
{
	struct ps_histo h = { 0 };
	double prev = 0;

	ck_assert(isnan(ps_histo_quantile(h.count, PS_HISTO_BUCKETS, 0.5)));
	/* 90 values of 50 us, 10 of 5 ms */
	for (int i = 0; i < 90; i++)
		ps_histo_add(&h, 50e-6);
	for (int i = 0; i < 10; i++)
		ps_histo_add(&h, 5e-3);
	ck_assert_double_eq_tol(h.sum_s, 90 * 50e-6 + 10 * 5e-3, 1e-12);
	double p50 = ps_histo_quantile(h.count, PS_HISTO_BUCKETS, 0.5);
	double p99 = ps_histo_quantile(h.count, PS_HISTO_BUCKETS, 0.99);
	ck_assert_msg(p50 > 32e-6 && p50 <= 64e-6, "p50 %g", p50);     /* bucket of 50 us */
	ck_assert_msg(p99 > 4.096e-3 && p99 <= 8.192e-3, "p99 %g", p99); /* bucket of 5 ms */
	for (double q = 0.01; q <= 1.0; q += 0.01) {
		double v = ps_histo_quantile(h.count, PS_HISTO_BUCKETS, q);
		ck_assert_msg(v >= prev, "q %g: %g below %g", q, v, prev);
		prev = v;
	}
}
END_TEST

int main(void)
{
	Suite *s = suite_create("histo");
	TCase *tc = tcase_create("histo");
	int failed;

	/* generous: sanitizer builds on a loaded 2-core machine */
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_buckets);
	tcase_add_test(tc, test_quantiles);
	suite_add_tcase(s, tc);
	failed = tu_run_suite(s);
	return failed ? 1 : 0;
}
