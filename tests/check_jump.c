/* check_jump.c - the jump consistent hash rows are placed by
 * (common/jump_hash.h, ps_rows_shard, docs/elastic.md): from n to n + 1
 * shards it moves at most 1.2 / (n + 1) of 2 million rows from 2 -> 3, 1
 * million from 8 -> 9 and half a million from 3 -> 4, 4 -> 5 and 16 -> 17
 * (every case 10 million with PS_TEST_JUMP_ROWS=10000000, BENCHMARKS.md's
 * figures), each moved row to the new shard, with shards within 1% of each
 * other (8 standard deviations of a shard's count where that is more);
 * ps_rows_shard is that placement; the multiply-shift placement rows used
 * before (placement 0) moves about half. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "jump_hash.h"
#include "rows_wire.h"
#include "shardmap.h"
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
	static const int from[] = { 2, 3, 4, 8, 16 };
	const char *env = getenv("PS_TEST_JUMP_ROWS");
	long big = env && atol(env) >= 1000 ? atol(env) : 0;

	for (int t = 0; t < 5; t++) {
		int n = from[t];
		long moved = 0, wrong = 0, count[32] = { 0 };
		long nrows = big ? big : t == 0 ? 2000000 : t == 3 ? 1000000 : 500000;
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
		/* within 1%, or 8 standard deviations of a shard's count when
		 * that is more (fewer rows a shard) */
		double per = (double)nrows / (n + 1), tol = 8.0 / sqrt(per);
		tol = tol > 0.01 ? tol : 0.01;
		ck_assert_msg((double)(hi - lo) / (double)hi < tol, "shards %ld..%ld rows (within %.3f)",
			      lo, hi, tol);
	}
}
END_TEST

/* ps_rows_shard is the jump hash of the row's mix; placement 0 is the
 * multiply-shift one. */
START_TEST(test_rows_shard_is_jump)
{
	for (uint64_t i = 0; i < 100000; i++) {
		uint64_t k = mix(i ^ mix(777));
		ck_assert_int_eq(ps_rows_shard(777, i, 5), ps_jump_hash(k, 5));
		ck_assert_int_eq(ps_rows_shard_placed(777, i, 5, PS_PLACE_HRW), ps_jump_hash(k, 5));
		ck_assert_int_eq(ps_rows_shard_placed(777, i, 5, PS_PLACE_GREEDY),
				 (int)(((unsigned __int128)k * 5u) >> 64));
	}
}
END_TEST

/* The placement rows used before (placement 0) moves far more: why
 * re-sharding needed the switch (1 million rows, 2 -> 3). */
START_TEST(test_multiply_shift_moves_many)
{
	long moved = 0;

	for (uint64_t i = 0; i < 1000000; i++)
		moved += ps_rows_shard_placed(12345, i, 2, PS_PLACE_GREEDY) !=
			 ps_rows_shard_placed(12345, i, 3, PS_PLACE_GREEDY);
	printf("measured: multiply-shift (placement 0), 1000000 rows, 2 -> 3 shards: %.4f "
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
	TU_ADD(tc, test_rows_shard_is_jump);
	suite_add_tcase(s, tc);
	return tu_run_suite(s);
}
