/* backend_compare.h - what the tests that compare one compute backend with
 * another share (check_compute_dnnl: cpu against ref; check_compute_cuda:
 * cuda against ref): deterministic inputs, copies in and out of backend
 * memory, and the closeness check with its two bounds. Included by one test
 * file each, so the functions are static. */
#ifndef PS_BACKEND_COMPARE_H
#define PS_BACKEND_COMPARE_H

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include "compute.h"

/* Deterministic uniform values in [-1, 1). */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static inline float frand(void)
{
	rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
	return (float)((rng_state >> 40) * (1.0 / (1ull << 24))) * 2.0f - 1.0f;
}

/* n such values (caller frees). */
static inline float *randv(size_t n)
{
	float *v = malloc((n ? n : 1) * sizeof(float));

	ck_assert_ptr_nonnull(v);
	for (size_t i = 0; i < n; i++)
		v[i] = frand();
	return v;
}

/* Copies bytes of host h into backend memory d and waits for it. */
static inline void fill(const struct ps_compute_ops *o, struct ps_compute *c, void *d,
			const void *h, size_t bytes)
{
	ck_assert_msg(o->upload(c, d, h, bytes) == 0, "%s upload: %s", o->name, c->err);
	ck_assert_msg(o->sync(c) == 0, "%s sync: %s", o->name, c->err);
}

/* Host copy of bytes of backend memory; caller frees. */
static inline void *get(const struct ps_compute_ops *o, struct ps_compute *c, const void *d,
			size_t bytes)
{
	void *h = malloc(bytes ? bytes : 1);

	ck_assert_ptr_nonnull(h);
	ck_assert_msg(o->download(c, h, d, bytes) == 0, "%s download: %s", o->name, c->err);
	ck_assert_msg(o->sync(c) == 0, "%s sync: %s", o->name, c->err);
	return h;
}

/* got (from backend gname) against want (from wname), n host floats: every
 * value finite, normalized L2 error below tol, largest difference at most
 * maxabs times max |want|. Asserts only on failure: Check sends a message
 * per passing assertion, millions of them over these loops. */
static inline void bc_check_close(const char *what, const char *gname, const char *wname,
				  const float *got, const float *want, size_t n, double tol,
				  double maxabs)
{
	double d = 0.0, r = 0.0, dmax = 0.0, wmax = 0.0;
	size_t at = 0;

	for (size_t i = 0; i < n; i++) {
		if (!isfinite(got[i]))
			ck_abort_msg("%s: %s value %zu is %g (%s %g)", what, gname, i, got[i],
				     wname, want[i]);
		if (!isfinite(want[i]))
			ck_abort_msg("%s: %s value %zu is %g", what, wname, i, want[i]);
		double e = fabs((double)got[i] - want[i]);
		d += e * e;
		r += (double)want[i] * want[i];
		if (e > dmax) {
			dmax = e;
			at = i;
		}
		if (fabs(want[i]) > wmax)
			wmax = fabs(want[i]);
	}
	double ne = r > 0.0 ? sqrt(d / r) : sqrt(d);
	double abs_bound = maxabs * (wmax > 0.0 ? wmax : 1.0);
	ck_assert_msg(ne < tol, "%s: normalized error %.3g, bound %.1g", what, ne, tol);
	ck_assert_msg(dmax <= abs_bound, "%s: value %zu differs by %.3g (%s %.9g, %s %.9g), "
		      "bound %.3g", what, at, dmax, gname, got[at], wname, want[at], abs_bound);
}

#endif
