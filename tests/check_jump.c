/* check_jump.c - the jump consistent hash re-sharding would place rows by
 * (common/jump_hash.h, docs/elastic.md): from n to n + 1 shards it moves
 * at most 1.2 / (n + 1) of 2 million rows from 2 -> 3 (10 million with
 * PS_TEST_JUMP_ROWS=10000000, BENCHMARKS.md's figure) and of 1 million
 * from 8 -> 9, each moved row to the new shard, with shards within 1% of
 * each other; the multiply-shift placement rows use today moves about
 * half. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include "jump_hash.h"
#include "rows_wire.h"
#include "test_util.h"

/* A row's 64-bit key as ps_rows_shard mixes it (splitmix64's finalizer). */
static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

/* 2 (or PS_TEST_JUMP_ROWS) million rows 2 -> 3 shards, 1 million 8 -> 9:
 * what moves, and where. */
START_TEST(test_jump_moves_few)
{
	static const int from[] = { 2, 8 };
	const char *env = getenv("PS_TEST_JUMP_ROWS");
	long nrows0 = env && atol(env) >= 1000 ? atol(env) : 2000000;
	const long rows[] = { nrows0, 1000000 };   /* 1 million: shards within 1% */

	for (int t = 0; t < 2; t++) {
		int n = from[t];
		long moved = 0, wrong = 0, count[16] = { 0 }, nrows = rows[t];
		for (uint64_t i = 0; i < (uint64_t)nrows; i++) {
			uint64_t k = mix(i);
			int a = ps_jump_hash(k, n), b = ps_jump_hash(k, n + 1);
			ck_assert(a >= 0 && a < n && b >= 0 && b <= n);
			moved += a != b;
			wrong += a != b && b != n;
			count[b]++;
		}
		double share = (double)moved / (double)nrows, bound = 1.2 / (n + 1);
		long lo = nrows, hi = 0;
		for (int k = 0; k <= n; k++) {
			lo = count[k] < lo ? count[k] : lo;
			hi = count[k] > hi ? count[k] : hi;
		}
		printf("measured: jump hash, %ld rows, %d -> %d shards: %.4f moved (1/(n+1) = %.4f, "
		       "target at most %.4f), shards %ld..%ld rows\n", nrows, n, n + 1, share,
		       1.0 / (n + 1), bound, lo, hi);
		ck_assert_msg(share <= bound, "%.4f moved, more than %.4f", share, bound);
		ck_assert_msg(wrong == 0, "%ld rows moved between old shards", wrong);
		ck_assert_msg((double)(hi - lo) / (double)hi < 0.01, "shards %ld..%ld rows", lo, hi);
	}
}
END_TEST

/* The placement of today (ps_rows_shard) moves far more: why re-sharding
 * needs the switch (1 million rows, 2 -> 3). */
START_TEST(test_multiply_shift_moves_many)
{
	long moved = 0;

	for (uint64_t i = 0; i < 1000000; i++)
		moved += ps_rows_shard(12345, i, 2) != ps_rows_shard(12345, i, 3);
	printf("measured: multiply-shift (ps_rows_shard), 1000000 rows, 2 -> 3 shards: %.4f "
	       "moved\n", moved / 1e6);
	ck_assert_msg(moved > 300000, "%ld moved", moved);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("jump");
	TCase *tc = tcase_create("jump");

	tcase_set_timeout(tc, 180);
	TU_ADD(tc, test_jump_moves_few);
	TU_ADD(tc, test_multiply_shift_moves_many);
	suite_add_tcase(s, tc);
	return tu_run_suite(s);
}
