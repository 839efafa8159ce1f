/* check_dedup.c - the shard's memory of handled pushes (server/dedup.c):
 * new, seen (with the first outcome), too old to tell, and a new
 * incarnation forgetting everything. */
#include <check.h>
#include <string.h>
#include "dedup.h"
#include "ps_time.h"
#include "ps_err.h"
#include "test_util.h"

START_TEST(test_window)
{
	static struct ps_dedup d;
	int code;

	memset(&d, 0, sizeof(d));
	ps_dedup_incarnation(&d, 77);
	ck_assert_int_eq(ps_dedup_check(&d, 1, &code), PS_DEDUP_NEW);
	ps_dedup_mark(&d, 1, 0);
	ck_assert_int_eq(ps_dedup_check(&d, 1, &code), PS_DEDUP_SEEN);
	ck_assert_int_eq(code, 0);
	/* gaps (request ids of pulls) and out-of-order arrivals */
	ps_dedup_mark(&d, 5, 0);
	ck_assert_int_eq(ps_dedup_check(&d, 3, &code), PS_DEDUP_NEW);
	ps_dedup_mark(&d, 3, PS_ECLOCK);
	ck_assert_int_eq(ps_dedup_check(&d, 3, &code), PS_DEDUP_SEEN);
	ck_assert_int_eq(code, PS_ECLOCK);
	/* an older number marked keeps the window where it was: the numbers
	 * above it and below it that were seen stay seen */
	ck_assert_int_eq(ps_dedup_check(&d, 5, &code), PS_DEDUP_SEEN);
	ck_assert_int_eq(ps_dedup_check(&d, 1, &code), PS_DEDUP_SEEN);
	ck_assert_int_eq(ps_dedup_check(&d, 4, &code), PS_DEDUP_NEW);
	ck_assert_int_eq(ps_dedup_check(&d, 6, &code), PS_DEDUP_NEW);
	/* every number in a long run is remembered exactly while in the window */
	for (uint64_t s = 10; s < 10 + 3 * PS_DEDUP_WINDOW; s += 2) {
		ck_assert_int_eq(ps_dedup_check(&d, s, &code), PS_DEDUP_NEW);
		ps_dedup_mark(&d, s, 0);
		ck_assert_int_eq(ps_dedup_check(&d, s, &code), PS_DEDUP_SEEN);
		ck_assert_int_eq(ps_dedup_check(&d, s + 1, &code), PS_DEDUP_NEW);
		if (s >= PS_DEDUP_WINDOW) { /* just inside, just outside */
			ck_assert_int_eq(ps_dedup_check(&d, s - PS_DEDUP_WINDOW + 2, &code),
					 s - PS_DEDUP_WINDOW + 2 >= 10 ? PS_DEDUP_SEEN : PS_DEDUP_NEW);
			ck_assert_int_eq(ps_dedup_check(&d, s - PS_DEDUP_WINDOW, &code), PS_DEDUP_TOO_OLD);
		}
	}
	/* a jump beyond the window clears it */
	uint64_t top = d.max + 10 * PS_DEDUP_WINDOW;
	ps_dedup_mark(&d, top, 0);
	ck_assert_int_eq(ps_dedup_check(&d, top - 1, &code), PS_DEDUP_NEW);
	ck_assert_int_eq(ps_dedup_check(&d, top - PS_DEDUP_WINDOW, &code), PS_DEDUP_TOO_OLD);
	/* one far past it (numbers are request ids, shared with pulls: a long
	 * run of pulls jumps them) clears the window at once, not number by
	 * number: 2^40 steps would take the better part of an hour */
	double t0 = ps_now_s();
	ps_dedup_mark(&d, top + (1ull << 40), 0);
	ck_assert_msg(ps_now_s() - t0 < 1.0, "a jump of 2^40 took %.1f s", ps_now_s() - t0);
	ck_assert_int_eq(ps_dedup_check(&d, top + (1ull << 40), &code), PS_DEDUP_SEEN);
	ck_assert_int_eq(ps_dedup_check(&d, top + (1ull << 40) - 1, &code), PS_DEDUP_NEW);
	ck_assert_int_eq(ps_dedup_check(&d, top, &code), PS_DEDUP_TOO_OLD);
	top += 1ull << 40;
	/* the same incarnation keeps it, another forgets it */
	ps_dedup_incarnation(&d, 77);
	ck_assert_int_eq(ps_dedup_check(&d, top, &code), PS_DEDUP_SEEN);
	ps_dedup_incarnation(&d, 78);
	ck_assert_int_eq(ps_dedup_check(&d, top, &code), PS_DEDUP_NEW);
	ck_assert_int_eq(ps_dedup_check(&d, 1, &code), PS_DEDUP_NEW);
	ps_dedup_mark(&d, 0, 0); /* 0: not numbered, never remembered */
	ck_assert_int_eq(ps_dedup_check(&d, 0, &code), PS_DEDUP_NEW);
}
END_TEST

/* The outcomes of refused pushes: the last PS_DEDUP_ERRS are replayed. */
START_TEST(test_errors_ring)
{
	static struct ps_dedup d;
	int code;

	memset(&d, 0, sizeof(d));
	for (uint64_t s = 1; s <= 100; s++)
		ps_dedup_mark(&d, s, s % 2 ? PS_ESHAPE : 0);
	for (uint64_t s = 100 - PS_DEDUP_ERRS; s <= 100; s++) {
		ck_assert_int_eq(ps_dedup_check(&d, s, &code), PS_DEDUP_SEEN);
		ck_assert_int_eq(code, s % 2 ? PS_ESHAPE : 0);
	}
}
END_TEST

/* The digest (FNV-1a of the incarnation, the highest number and the
 * window's bits, as the header says; compared between a replicated pair's
 * processes): computed by the test from the same bytes, equal for equal
 * windows, and changed by each of the three alone. */
static uint64_t spec_fnv(uint64_t h, const void *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		h = (h ^ ((const uint8_t *)p)[i]) * 0x100000001b3ull;
	return h;
}

START_TEST(test_digest)
{
	static struct ps_dedup a, b;
	uint64_t h;

	memset(&a, 0, sizeof(a));
	ps_dedup_incarnation(&a, 77);
	ps_dedup_mark(&a, 3, 0);
	ps_dedup_mark(&a, 9, PS_ESHAPE);
	h = spec_fnv(0xcbf29ce484222325ull, &a.incarnation, sizeof(a.incarnation));
	h = spec_fnv(h, &a.max, sizeof(a.max));
	h = spec_fnv(h, a.bits, sizeof(a.bits));
	ck_assert_uint_eq(ps_dedup_digest(&a), h);
	b = a;
	b.nerr = 0; /* the refused pushes' outcomes are not in it */
	memset(b.errs, 0, sizeof(b.errs));
	ck_assert_uint_eq(ps_dedup_digest(&b), h);
	b = a;
	ps_dedup_mark(&b, 5, 0); /* a bit */
	ck_assert_uint_ne(ps_dedup_digest(&b), h);
	b = a;
	b.max = 10; /* the highest number alone */
	ck_assert_uint_ne(ps_dedup_digest(&b), h);
	b = a;
	b.incarnation = 78; /* the incarnation alone */
	ck_assert_uint_ne(ps_dedup_digest(&b), h);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("dedup");
	TCase *tc = tcase_create("dedup");
	int failed;

	tcase_add_test(tc, test_window);
	tcase_add_test(tc, test_errors_ring);
	tcase_add_test(tc, test_digest);
	suite_add_tcase(s, tc);
	failed = tu_run_suite(s);
	return failed ? 1 : 0;
}
