/* check_optimizer.c - unit tests of the update rules (server/optimizer.c).
 *
 * Small cases are compared with numbers worked out by hand from the
 * formulas (the arithmetic is in the comments), at 1e-6 relative. Long and
 * odd-length vectors, at unaligned addresses, are compared with a scalar
 * reference written here in double, so the vectorized body and the scalar
 * tails of every kernel are both checked.
 */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "optimizer.h"
#include "test_util.h"

#define REL_TOL 1e-6   /* hand-computed cases */
#define LONG_TOL 1e-5  /* float implementation vs double reference */
#define LONG_N 1000003 /* odd, not a multiple of any vector width */

/* |got - want| <= tol * |want|; reports which value differed. */
static void check_rel(double got, double want, double tol, const char *what, size_t i)
{
	ck_assert_msg(fabs(got - want) <= tol * fabs(want),
		      "%s[%zu] = %.9g, want %.9g (rel err %.3g)", what, i, got, want,
		      fabs(got - want) / fabs(want));
}

static void check_vec(const float *got, const double *want, size_t n, const char *what)
{
	for (size_t i = 0; i < n; i++)
		check_rel(got[i], want[i], REL_TOL, what, i);
}

/* One apply on a 2- or 3-element slice with g checked unmodified. */
static void step_once(const struct ps_optimizer_ops *ops, const struct ps_optim_cfg *cfg,
		      float *w, const float *g, float **state, size_t n, uint64_t step)
{
	float gcopy[8];

	ck_assert_uint_le(n, 8);
	memcpy(gcopy, g, n * sizeof(float));
	ops->apply(cfg, w, g, state, n, step);
	ck_assert_msg(memcmp(gcopy, g, n * sizeof(float)) == 0, "apply modified g");
}

/* ---------------------------------------------------------------- registry */

START_TEST(test_registry)
{
	static const struct { enum ps_optim_kind kind; const char *name; int nstate; } want[] = {
		{ PS_OPT_SGD, "sgd", 0 },
		{ PS_OPT_MOMENTUM, "momentum", 1 },
		{ PS_OPT_ADAM, "adam", 2 },
		{ PS_OPT_ADAGRAD, "adagrad", 1 },
		{ PS_OPT_ADAMW, "adamw", 2 },
		{ PS_OPT_REDUCE, "reduce", 0 },
	};

	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		const struct ps_optimizer_ops *ops = ps_optimizer_get(want[i].kind);

		ck_assert_ptr_nonnull(ops);
		ck_assert_str_eq(ops->name, want[i].name);
		ck_assert_int_eq(ops->nstate, want[i].nstate);
		ck_assert_int_le(ops->nstate, PS_OPTIM_MAX_STATE);
		ck_assert_ptr_nonnull(ops->apply);
		ck_assert_ptr_eq(ps_optimizer_find(want[i].name), ops);
	}
	/* Only adagrad needs a non-zero initial state. */
	ck_assert_ptr_null(ps_optimizer_get(PS_OPT_SGD)->init_state);
	ck_assert_ptr_null(ps_optimizer_get(PS_OPT_MOMENTUM)->init_state);
	ck_assert_ptr_null(ps_optimizer_get(PS_OPT_ADAM)->init_state);
	ck_assert_ptr_nonnull(ps_optimizer_get(PS_OPT_ADAGRAD)->init_state);

	ck_assert_ptr_null(ps_optimizer_find("nope"));
	ck_assert_ptr_null(ps_optimizer_find(""));
	ck_assert_ptr_null(ps_optimizer_find("SGD"));      /* names are case-sensitive */
	ck_assert_ptr_null(ps_optimizer_find("adamW"));
	ck_assert_ptr_null(ps_optimizer_find("ada"));
	ck_assert_ptr_null(ps_optimizer_find(NULL));
	ck_assert_ptr_null(ps_optimizer_get(PS_OPT_COUNT));
	ck_assert_ptr_null(ps_optimizer_get((enum ps_optim_kind)-1));
}
END_TEST

/* --------------------------------------------------------------------- sgd */

START_TEST(test_sgd)
{
	/* lr 0.1, w = (1, -2, 0.5), g = (0.5, 1, -2) both steps:
	 * step 1: w = 1 - 0.05 = 0.95;  -2 - 0.1 = -2.1;  0.5 + 0.2 = 0.7
	 * step 2: w = 0.95 - 0.05 = 0.9; -2.1 - 0.1 = -2.2; 0.7 + 0.2 = 0.9 */
	const struct ps_optimizer_ops *ops = ps_optimizer_get(PS_OPT_SGD);
	struct ps_optim_cfg cfg = { .kind = PS_OPT_SGD, .lr = 0.1f };
	float w[3] = { 1.0f, -2.0f, 0.5f };
	const float g[3] = { 0.5f, 1.0f, -2.0f };
	float *state[PS_OPTIM_MAX_STATE] = { NULL };
	const double w1[3] = { 0.95, -2.1, 0.7 };
	const double w2[3] = { 0.9, -2.2, 0.9 };

	step_once(ops, &cfg, w, g, state, 3, 0);
	check_vec(w, w1, 3, "w step 1");
	step_once(ops, &cfg, w, g, state, 3, 1);
	check_vec(w, w2, 3, "w step 2");
}
END_TEST

START_TEST(test_sgd_wd)
{
	/* lr 0.1, wd 0.1, w = (1, -2, 0.5), g = (0.5, 1, -2) both steps:
	 * step 1: g' = 0.5 + 0.1 = 0.6;  1 - 0.2 = 0.8;  -2 + 0.05 = -1.95
	 *         w  = 1 - 0.06 = 0.94;  -2 - 0.08 = -2.08;  0.5 + 0.195 = 0.695
	 * step 2: g' = 0.5 + 0.094 = 0.594;  1 - 0.208 = 0.792;  -2 + 0.0695 = -1.9305
	 *         w  = 0.94 - 0.0594 = 0.8806;  -2.08 - 0.0792 = -2.1592;
	 *              0.695 + 0.19305 = 0.88805 */
	const struct ps_optimizer_ops *ops = ps_optimizer_get(PS_OPT_SGD);
	struct ps_optim_cfg cfg = { .kind = PS_OPT_SGD, .lr = 0.1f, .weight_decay = 0.1f };
	float w[3] = { 1.0f, -2.0f, 0.5f };
	const float g[3] = { 0.5f, 1.0f, -2.0f };
	float *state[PS_OPTIM_MAX_STATE] = { NULL };
	const double w1[3] = { 0.94, -2.08, 0.695 };
	const double w2[3] = { 0.8806, -2.1592, 0.88805 };

	step_once(ops, &cfg, w, g, state, 3, 0);
	check_vec(w, w1, 3, "w step 1");
	step_once(ops, &cfg, w, g, state, 3, 1);
	check_vec(w, w2, 3, "w step 2");
}
END_TEST

/* ---------------------------------------------------------------- momentum */

/* Three steps of momentum (lr 0.1, mu 0.9) from w = (1, -2), v = 0, with
 * the constant gradient g = (1, -0.5); want_w/want_v per step. */
static void run_momentum(int nesterov, float wd, int nsteps,
			 const double want_w[][2], const double want_v[][2])
{
	const struct ps_optimizer_ops *ops = ps_optimizer_get(PS_OPT_MOMENTUM);
	struct ps_optim_cfg cfg = { .kind = PS_OPT_MOMENTUM, .lr = 0.1f, .momentum = 0.9f,
				    .nesterov = nesterov, .weight_decay = wd };
	float w[2] = { 1.0f, -2.0f }, v[2] = { 0.0f, 0.0f };
	const float g[2] = { 1.0f, -0.5f };
	float *state[PS_OPTIM_MAX_STATE] = { v, NULL };

	for (int s = 0; s < nsteps; s++) {
		step_once(ops, &cfg, w, g, state, 2, (uint64_t)s);
		check_vec(v, want_v[s], 2, "v");
		check_vec(w, want_w[s], 2, "w");
	}
}

START_TEST(test_momentum)
{
	/* v = 0.9 v + g; w -= 0.1 v
	 * step 1: v = 1, -0.5;            w = 1 - 0.1 = 0.9;    -2 + 0.05 = -1.95
	 * step 2: v = 0.9 + 1 = 1.9;  -0.45 - 0.5 = -0.95;
	 *         w = 0.9 - 0.19 = 0.71;  -1.95 + 0.095 = -1.855
	 * step 3: v = 1.71 + 1 = 2.71;  -0.855 - 0.5 = -1.355;
	 *         w = 0.71 - 0.271 = 0.439;  -1.855 + 0.1355 = -1.7195 */
	const double w[3][2] = { { 0.9, -1.95 }, { 0.71, -1.855 }, { 0.439, -1.7195 } };
	const double v[3][2] = { { 1.0, -0.5 }, { 1.9, -0.95 }, { 2.71, -1.355 } };

	run_momentum(0, 0.0f, 3, w, v);
}
END_TEST

START_TEST(test_momentum_nesterov)
{
	/* v = 0.9 v + g; w -= 0.1 (g + 0.9 v)
	 * step 1: v = 1, -0.5;
	 *         w = 1 - 0.1 (1 + 0.9) = 0.81;  -2 - 0.1 (-0.5 - 0.45) = -1.905
	 * step 2: v = 1.9, -0.95;
	 *         w = 0.81 - 0.1 (1 + 1.71) = 0.539;
	 *             -1.905 - 0.1 (-0.5 - 0.855) = -1.7695
	 * step 3: v = 2.71, -1.355;
	 *         w = 0.539 - 0.1 (1 + 2.439) = 0.1951;
	 *             -1.7695 - 0.1 (-0.5 - 1.2195) = -1.59755 */
	const double w[3][2] = { { 0.81, -1.905 }, { 0.539, -1.7695 }, { 0.1951, -1.59755 } };
	const double v[3][2] = { { 1.0, -0.5 }, { 1.9, -0.95 }, { 2.71, -1.355 } };

	run_momentum(1, 0.0f, 3, w, v);
}
END_TEST

START_TEST(test_momentum_wd)
{
	/* wd 0.1: g' = g + 0.1 w; v = 0.9 v + g'; w -= 0.1 v
	 * step 1: g' = 1 + 0.1 = 1.1;  -0.5 - 0.2 = -0.7;   v = g'
	 *         w = 1 - 0.11 = 0.89;  -2 + 0.07 = -1.93
	 * step 2: g' = 1 + 0.089 = 1.089;  -0.5 - 0.193 = -0.693
	 *         v = 0.99 + 1.089 = 2.079;  -0.63 - 0.693 = -1.323
	 *         w = 0.89 - 0.2079 = 0.6821;  -1.93 + 0.1323 = -1.7977 */
	const double w[2][2] = { { 0.89, -1.93 }, { 0.6821, -1.7977 } };
	const double v[2][2] = { { 1.1, -0.7 }, { 2.079, -1.323 } };

	run_momentum(0, 0.1f, 2, w, v);
}
END_TEST

START_TEST(test_momentum_nesterov_wd)
{
	/* wd 0.1: g' = g + 0.1 w; v = 0.9 v + g'; w -= 0.1 (g' + 0.9 v)
	 * step 1: g' = 1.1, -0.7;  v = 1.1, -0.7
	 *         w = 1 - 0.1 (1.1 + 0.99) = 0.791;  -2 - 0.1 (-0.7 - 0.63) = -1.867
	 * step 2: g' = 1 + 0.0791 = 1.0791;  -0.5 - 0.1867 = -0.6867
	 *         v = 0.99 + 1.0791 = 2.0691;  -0.63 - 0.6867 = -1.3167
	 *         w = 0.791 - 0.1 (1.0791 + 1.86219) = 0.791 - 0.294129 = 0.496871;
	 *             -1.867 - 0.1 (-0.6867 - 1.18503) = -1.867 + 0.187173 = -1.679827 */
	const double w[2][2] = { { 0.791, -1.867 }, { 0.496871, -1.679827 } };
	const double v[2][2] = { { 1.1, -0.7 }, { 2.0691, -1.3167 } };

	run_momentum(1, 0.1f, 2, w, v);
}
END_TEST

/* -------------------------------------------------------------------- adam */

/* Two adam steps with lr 0.1, b1 0.5, b2 0.75, eps 0.25 (all but lr exact
 * in binary; eps large so that where it is added shows), from w = (1, -1),
 * gradients (2, -0.5) then (1, 0.5). */
static void run_adam(float wd, const double want_w[2][2], const double want_m[2][2],
		     const double want_v[2][2])
{
	const struct ps_optimizer_ops *ops = ps_optimizer_get(PS_OPT_ADAM);
	struct ps_optim_cfg cfg = { .kind = PS_OPT_ADAM, .lr = 0.1f, .beta1 = 0.5f,
				    .beta2 = 0.75f, .eps = 0.25f, .weight_decay = wd };
	float w[2] = { 1.0f, -1.0f }, m[2] = { 0 }, v[2] = { 0 };
	const float g[2][2] = { { 2.0f, -0.5f }, { 1.0f, 0.5f } };
	float *state[PS_OPTIM_MAX_STATE] = { m, v };

	for (int s = 0; s < 2; s++) {
		step_once(ops, &cfg, w, g[s], state, 2, (uint64_t)s);
		check_vec(m, want_m[s], 2, "m");
		check_vec(v, want_v[s], 2, "v");
		check_vec(w, want_w[s], 2, "w");
	}
}

START_TEST(test_adam)
{
	/* step 1 (t 1, 1-b1^t = 0.5, 1-b2^t = 0.25), g = (2, -0.5):
	 *   m = 0.5*2 = 1;  0.5*-0.5 = -0.25      v = 0.25*4 = 1;  0.25*0.25 = 0.0625
	 *   mhat = 2, -0.5;  vhat = 4, 0.25;  sqrt = 2, 0.5
	 *   w = 1 - 0.1*2/(2 + 0.25) = 1 - 0.0888889 = 0.9111111
	 *       -1 - 0.1*-0.5/(0.5 + 0.25) = -1 + 0.0666667 = -0.9333333
	 * step 2 (t 2, 1-b1^t = 0.75, 1-b2^t = 0.4375), g = (1, 0.5):
	 *   m = 0.5 + 0.5 = 1;  -0.125 + 0.25 = 0.125
	 *   v = 0.75 + 0.25 = 1;  0.046875 + 0.0625 = 0.109375
	 *   mhat = 1.3333333, 0.1666667;  vhat = 2.2857143, 0.25;  sqrt = 1.5118579, 0.5
	 *   w = 0.9111111 - 0.1*1.3333333/(1.5118579 + 0.25) = 0.9111111 - 0.0756777
	 *     = 0.8354334;   -0.9333333 - 0.1*0.1666667/0.75 = -0.9555556 */
	const double w[2][2] = { { 0.911111111, -0.933333333 }, { 0.835433422, -0.955555556 } };
	const double m[2][2] = { { 1.0, -0.25 }, { 1.0, 0.125 } };
	const double v[2][2] = { { 1.0, 0.0625 }, { 1.0, 0.109375 } };

	run_adam(0.0f, w, m, v);
}
END_TEST

/* Adam and AdamW over slices of 1 to 11 values (the 4-wide loop, then a
 * tail of 0 to 3): three steps leave the floats after the slice (of w, m
 * and v) untouched, and give each value what the same value gets stepped
 * alone (a slice of 1: the scalar path), to 1e-6. */
START_TEST(test_adam_tail_and_bounds)
{
	static const enum ps_optim_kind kinds[] = { PS_OPT_ADAM, PS_OPT_ADAMW };
	const float canary = 12345.0f;

	for (size_t kk = 0; kk < 2; kk++) {
		const struct ps_optimizer_ops *ops = ps_optimizer_get(kinds[kk]);
		struct ps_optim_cfg cfg = { .kind = kinds[kk], .lr = 0.1f, .beta1 = 0.9f,
					    .beta2 = 0.99f, .eps = 1e-3f, .weight_decay = 0.01f };
		for (size_t n = 1; n <= 11; n++) {
			float w[16], m[16] = { 0 }, v[16] = { 0 }, g[16];
			float *state[PS_OPTIM_MAX_STATE] = { m, v };
			for (size_t i = n; i < 16; i++)
				w[i] = m[i] = v[i] = g[i] = canary;
			for (size_t i = 0; i < n; i++)
				w[i] = 0.5f - 0.1f * (float)i;
			for (uint64_t t = 0; t < 3; t++) {
				for (size_t i = 0; i < n; i++)
					g[i] = (float)((int)(i * 7 + t * 3) % 5) - 2.0f;
				ops->apply(&cfg, w, g, state, n, t);
			}
			for (size_t i = n; i < 16; i++)
				ck_assert_msg(w[i] == canary && m[i] == canary && v[i] == canary,
					      "%s, %zu values: float %zu past the slice written",
					      ops->name, n, i);
			for (size_t i = 0; i < n; i++) {
				float w1 = 0.5f - 0.1f * (float)i, m1 = 0, v1 = 0, g1;
				float *st1[PS_OPTIM_MAX_STATE] = { &m1, &v1 };
				for (uint64_t t = 0; t < 3; t++) {
					g1 = (float)((int)(i * 7 + t * 3) % 5) - 2.0f;
					ops->apply(&cfg, &w1, &g1, st1, 1, t);
				}
				check_rel(w[i], w1, 1e-6, "w", i);
				check_rel(m[i], m1, 1e-6, "m", i);
				check_rel(v[i], v1, 1e-6, "v", i);
			}
		}
	}
}
END_TEST

START_TEST(test_adam_wd)
{
	/* wd 0.5: g' = g + 0.5 w
	 * step 1: g' = 2 + 0.5 = 2.5;  -0.5 - 0.5 = -1
	 *   m = 1.25, -0.5;  v = 0.25*6.25 = 1.5625, 0.25
	 *   mhat = 2.5, -1;  vhat = 6.25, 1;  sqrt = 2.5, 1
	 *   w = 1 - 0.25/2.75 = 0.9090909;  -1 + 0.1/1.25 = -0.92
	 * step 2: g' = 1 + 0.4545455 = 1.4545455;  0.5 - 0.46 = 0.04
	 *   m = 0.625 + 0.7272727 = 1.3522727;  -0.25 + 0.02 = -0.23
	 *   v = 1.171875 + 0.25*2.1157025 = 1.7008006;  0.1875 + 0.0004 = 0.1879
	 *   mhat = 1.8030303, -0.3066667;  vhat = 3.8875443, 0.4294857
	 *   sqrt = 1.9716856, 0.6553516
	 *   w = 0.9090909 - 0.18030303/2.2216856 = 0.9090909 - 0.0811560 = 0.8279349
	 *       -0.92 + 0.03066667/0.9053516 = -0.92 + 0.0338727 = -0.8861273 */
	const double w[2][2] = { { 0.909090909, -0.92 }, { 0.827934949, -0.886127340 } };
	const double m[2][2] = { { 1.25, -0.5 }, { 1.352272727, -0.23 } };
	const double v[2][2] = { { 1.5625, 0.25 }, { 1.700800620, 0.1879 } };

	run_adam(0.5f, w, m, v);
}
END_TEST

START_TEST(test_adam_bias_correction)
{
	/* First step (step 0, t 1), usual betas 0.9/0.999: mhat = g and
	 * vhat = g^2, so each weight moves by lr * g/(|g| + eps) = lr * sign(g)
	 * whatever the size of g (eps 1e-8 is < 1e-6 of every |g| here).
	 * Far later (step 99999, t 1e5) both corrections are 1, so from zero
	 * state the move is lr * (1-b1) g / sqrt((1-b2) g^2). With betas exact
	 * in binary and in short decimals (the shard takes 1 - beta from the
	 * decimal the user wrote, ps_optimizer_exact), b1 = 0.875, b2 = 0.9375
	 * (b2^1e5 ~ e^-6454), that is lr * 0.125/sqrt(0.0625) = 0.5 lr * sign(g).
	 * Here sqrt(vhat) = |g|/4 >= 0.005, so eps is 1e-10 to stay below
	 * 1e-6 of it. */
	const struct ps_optimizer_ops *ops = ps_optimizer_get(PS_OPT_ADAM);
	const struct ps_optim_cfg cfgs[2] = {
		{ .kind = PS_OPT_ADAM, .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f },
		{ .kind = PS_OPT_ADAM, .lr = 1e-3f, .beta1 = 0.875f, .beta2 = 0.9375f,
		  .eps = 1e-10f },
	};
	const float g[5] = { 3.0f, -0.02f, 0.5f, -50.0f, 0.07f };
	float w[5], m[5], v[5];
	float *state[PS_OPTIM_MAX_STATE] = { m, v };
	const uint64_t steps[2] = { 0, 99999 };
	const double gain[2] = { 1.0, 0.5 };

	for (int k = 0; k < 2; k++) {
		memset(w, 0, sizeof(w));
		memset(m, 0, sizeof(m));
		memset(v, 0, sizeof(v));
		step_once(ops, &cfgs[k], w, g, state, 5, steps[k]);
		for (size_t i = 0; i < 5; i++) {
			double want = -(double)cfgs[k].lr * gain[k] * (g[i] > 0 ? 1.0 : -1.0);

			check_rel(w[i], want, REL_TOL, k ? "w late" : "w first", i);
		}
	}
}
END_TEST

/* torch.optim.SGD(momentum 0.9, dampening 0.5), lr 0.1, from w = (1, -2):
 * the first step's buffer is the gradient (1, 2) itself (no dampening):
 * w = (0.9, -2.2); the second, with g = (0.5, -1):
 * buf = 0.9*(1, 2) + 0.5*(0.5, -1) = (1.15, 1.3), w = (0.785, -2.33). */
START_TEST(test_momentum_dampening)
{
	const struct ps_optimizer_ops *ops = ps_optimizer_get(PS_OPT_MOMENTUM);
	const struct ps_optim_cfg cfg = { .kind = PS_OPT_MOMENTUM, .lr = 0.1f, .momentum = 0.9f,
					  .dampening = 0.5f };
	float w[2] = { 1.0f, -2.0f }, v[2] = { 0 };
	float *state[PS_OPTIM_MAX_STATE] = { v, NULL };
	const float g[2][2] = { { 1.0f, 2.0f }, { 0.5f, -1.0f } };
	const double want_v[2][2] = { { 1.0, 2.0 }, { 1.15, 1.3 } };
	const double want_w[2][2] = { { 0.9, -2.2 }, { 0.785, -2.33 } };

	for (int s = 0; s < 2; s++) {
		step_once(ops, &cfg, w, g[s], state, 2, (uint64_t)s);
		check_vec(v, want_v[s], 2, "v");
		check_vec(w, want_w[s], 2, "w");
	}
}
END_TEST

/* torch.optim.AdamW(lr 0.1, weight_decay 0.1), w = 1, g = 0.5: the weight
 * first shrinks to 1 * (1 - 0.01) = 0.99; then the first adam step (mhat =
 * g, vhat = g^2) moves it by lr * sign(g): 0.89. The second step, g = -0.25:
 * w = 0.89 * 0.99 - 0.1 * mhat / (sqrt(vhat) + eps) with m = 0.9*0.05 -
 * 0.025 = 0.02, v = 0.999*0.00025 + 0.001*0.0625 = 0.000312, mhat = m/0.19,
 * vhat = v/0.001999. */
START_TEST(test_adamw)
{
	const struct ps_optimizer_ops *ops = ps_optimizer_get(PS_OPT_ADAMW);
	const struct ps_optim_cfg cfg = { .kind = PS_OPT_ADAMW, .lr = 0.1f, .beta1 = 0.9f,
					  .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f };
	float w[1] = { 1.0f }, m[1] = { 0 }, v[1] = { 0 };
	float *state[PS_OPTIM_MAX_STATE] = { m, v };
	const float g1[1] = { 0.5f }, g2[1] = { -0.25f };
	const double m2 = 0.9 * 0.05 + 0.1 * -0.25, v2 = 0.999 * 0.00025 + 0.001 * 0.0625;
	const double want1[1] = { 0.89 };
	const double want2[1] = { 0.89 * 0.99 - 0.1 * (m2 / 0.19) / (sqrt(v2 / 0.001999) + 1e-8) };

	step_once(ops, &cfg, w, g1, state, 1, 0);
	check_vec(w, want1, 1, "w first");
	step_once(ops, &cfg, w, g2, state, 1, 1);
	check_vec(w, want2, 1, "w second");
}
END_TEST

/* torch.optim.Adagrad(lr 0.1, lr_decay 0.5, initial_accumulator_value 0):
 * step t uses lr / (1 + (t-1)*0.5). w = 1, g = 2: acc 4, w = 1 - 0.1*2/2 =
 * 0.9; then g = 1: acc 5, w = 0.9 - (0.1/1.5)*1/sqrt(5). */
START_TEST(test_adagrad_lr_decay)
{
	const struct ps_optimizer_ops *ops = ps_optimizer_get(PS_OPT_ADAGRAD);
	const struct ps_optim_cfg cfg = { .kind = PS_OPT_ADAGRAD, .lr = 0.1f, .eps = 1e-10f,
					  .lr_decay = 0.5f };
	float w[1] = { 1.0f }, acc[1] = { 0 };
	float *state[PS_OPTIM_MAX_STATE] = { acc, NULL };
	const float g1[1] = { 2.0f }, g2[1] = { 1.0f };
	const double want1[1] = { 0.9 }, want2[1] = { 0.9 - (0.1 / 1.5) / sqrt(5.0) };

	ops->init_state(&cfg, state, 1);
	step_once(ops, &cfg, w, g1, state, 1, 0);
	check_vec(w, want1, 1, "w first");
	step_once(ops, &cfg, w, g2, state, 1, 1);
	check_vec(w, want2, 1, "w second");
}
END_TEST

/* reduce: the weights become the gradient, whatever they were; no state;
 * finite exactly when the gradient is. */
START_TEST(test_reduce)
{
	const struct ps_optimizer_ops *ops = ps_optimizer_get(PS_OPT_REDUCE);
	const struct ps_optim_cfg cfg = { .kind = PS_OPT_REDUCE, .lr = 5.0f };
	float w[5] = { 1, 2, 3, 4, 5 }, g[5] = { -0.5f, 0, 7, 1e30f, -2 };
	float *state[PS_OPTIM_MAX_STATE] = { NULL };

	ck_assert_int_eq(ops->nstate, 0);
	ck_assert_int_eq(ps_optimizer_finite_after(ops, &cfg, w, g, state, 5, 3), 1);
	ops->apply(&cfg, w, g, state, 5, 3);
	ck_assert_int_eq(memcmp(w, g, sizeof(w)), 0);
	g[2] = NAN;
	ck_assert_int_eq(ps_optimizer_finite_after(ops, &cfg, w, g, state, 5, 4), 0);
}
END_TEST

/* ----------------------------------------------------------------- adagrad */

/* Two adagrad steps with lr 0.1, eps 0.25, initial accumulator 0.5, from
 * w = (1, -1), gradients (1.5, -0.5) then (0.5, 1). */
static void run_adagrad(float wd, const double want_w[2][2], const double want_acc[2][2])
{
	const struct ps_optimizer_ops *ops = ps_optimizer_get(PS_OPT_ADAGRAD);
	struct ps_optim_cfg cfg = { .kind = PS_OPT_ADAGRAD, .lr = 0.1f, .eps = 0.25f,
				    .weight_decay = wd, .initial_accumulator = 0.5f };
	float w[2] = { 1.0f, -1.0f }, acc[2] = { 0 };
	const float g[2][2] = { { 1.5f, -0.5f }, { 0.5f, 1.0f } };
	float *state[PS_OPTIM_MAX_STATE] = { acc, NULL };

	ops->init_state(&cfg, state, 2);
	ck_assert_float_eq(acc[0], 0.5f);
	ck_assert_float_eq(acc[1], 0.5f);
	for (int s = 0; s < 2; s++) {
		step_once(ops, &cfg, w, g[s], state, 2, (uint64_t)s);
		check_vec(acc, want_acc[s], 2, "acc");
		check_vec(w, want_w[s], 2, "w");
	}
}

START_TEST(test_adagrad)
{
	/* step 1: acc = 0.5 + 2.25 = 2.75;  0.5 + 0.25 = 0.75;  sqrt = 1.6583124, 0.8660254
	 *   w = 1 - 0.15/(1.6583124 + 0.25) = 1 - 0.0786035 = 0.9213965
	 *       -1 + 0.05/(0.8660254 + 0.25) = -1 + 0.0448019 = -0.9551981
	 * step 2: acc = 2.75 + 0.25 = 3;  0.75 + 1 = 1.75;  sqrt = 1.7320508, 1.3228757
	 *   w = 0.9213965 - 0.05/1.9820508 = 0.9213965 - 0.0252264 = 0.8961701
	 *       -0.9551981 - 0.1/1.5728757 = -0.9551981 - 0.0635778 = -1.0187760 */
	const double w[2][2] = { { 0.921396517, -0.955198152 }, { 0.896170121, -1.018775969 } };
	const double acc[2][2] = { { 2.75, 0.75 }, { 3.0, 1.75 } };

	run_adagrad(0.0f, w, acc);
}
END_TEST

START_TEST(test_adagrad_wd)
{
	/* wd 0.5: g' = g + 0.5 w
	 * step 1: g' = 1.5 + 0.5 = 2;  -0.5 - 0.5 = -1
	 *   acc = 0.5 + 4 = 4.5;  0.5 + 1 = 1.5;  sqrt = 2.1213203, 1.2247449
	 *   w = 1 - 0.2/2.3713203 = 1 - 0.0843412 = 0.9156588
	 *       -1 + 0.1/1.4747449 = -1 + 0.0678083 = -0.9321917
	 * step 2: g' = 0.5 + 0.4578294 = 0.9578294;  1 - 0.4660958 = 0.5339042
	 *   acc = 4.5 + 0.9174373 = 5.4174373;  1.5 + 0.2850537 = 1.7850537
	 *   sqrt = 2.3275389, 1.3360590
	 *   w = 0.9156588 - 0.09578294/2.5775389 = 0.9156588 - 0.0371606 = 0.8784982
	 *       -0.9321917 - 0.05339042/1.5860590 = -0.9321917 - 0.0336623 = -0.9658540 */
	const double w[2][2] = { { 0.915658801, -0.932191661 }, { 0.878498182, -0.965853976 } };
	const double acc[2][2] = { { 4.5, 1.5 }, { 5.417437161, 1.785053662 } };

	run_adagrad(0.5f, w, acc);
}
END_TEST

/* ------------------------------------------- long vectors vs double reference */

static const struct ps_optim_cfg long_cfgs[] = {
	{ .kind = PS_OPT_SGD, .lr = 0.05f },
	{ .kind = PS_OPT_SGD, .lr = 0.05f, .weight_decay = 0.01f },
	{ .kind = PS_OPT_MOMENTUM, .lr = 0.05f, .momentum = 0.9f },
	{ .kind = PS_OPT_MOMENTUM, .lr = 0.05f, .momentum = 0.9f, .weight_decay = 0.01f },
	{ .kind = PS_OPT_MOMENTUM, .lr = 0.05f, .momentum = 0.9f, .nesterov = 1 },
	{ .kind = PS_OPT_MOMENTUM, .lr = 0.05f, .momentum = 0.9f, .nesterov = 1,
	  .weight_decay = 0.01f },
	{ .kind = PS_OPT_ADAM, .lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f },
	{ .kind = PS_OPT_ADAM, .lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
	  .weight_decay = 0.01f },
	{ .kind = PS_OPT_ADAGRAD, .lr = 0.05f, .eps = 1e-10f, .initial_accumulator = 0.1f },
	{ .kind = PS_OPT_ADAGRAD, .lr = 0.05f, .eps = 1e-10f, .initial_accumulator = 0.1f,
	  .weight_decay = 0.01f },
	{ .kind = PS_OPT_MOMENTUM, .lr = 0.05f, .momentum = 0.9f, .dampening = 0.3f },
	{ .kind = PS_OPT_MOMENTUM, .lr = 0.05f, .momentum = 0.9f, .dampening = 0.3f,
	  .weight_decay = 0.01f },
	{ .kind = PS_OPT_ADAMW, .lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
	  .weight_decay = 0.05f },
	{ .kind = PS_OPT_ADAGRAD, .lr = 0.05f, .eps = 1e-10f, .initial_accumulator = 0.1f,
	  .lr_decay = 0.25f, .weight_decay = 0.01f },
	{ .kind = PS_OPT_REDUCE },
};
#define NLONG_CFGS (sizeof(long_cfgs) / sizeof(long_cfgs[0]))

/* Deterministic uniform floats in [lo, hi). */
static float rnd(uint64_t *s, float lo, float hi)
{
	*s = *s * 6364136223846793005ull + 1442695040888963407ull;
	return lo + (hi - lo) * (float)((*s >> 40) * (1.0 / 16777216.0));
}

/* The update rules, one element at a time, in double. */
static void ref_step(const struct ps_optim_cfg *c, double *w, const float *g,
		     double *s0, double *s1, size_t n, uint64_t step)
{
	const double lr = c->lr, wd = c->weight_decay, mu = c->momentum;
	const double b1 = c->beta1, b2 = c->beta2, eps = c->eps, damp = c->dampening;
	const double t = (double)step + 1.0;

	for (size_t i = 0; i < n; i++) {
		double gi = (double)g[i] + (c->kind == PS_OPT_ADAMW ? 0.0 : wd * w[i]);

		switch (c->kind) {
		case PS_OPT_SGD:
			w[i] -= lr * gi;
			break;
		case PS_OPT_MOMENTUM: /* torch: the first step's buffer is g' itself */
			s0[i] = step == 0 && damp != 0 ? gi : mu * s0[i] + (1 - damp) * gi;
			w[i] -= lr * (c->nesterov ? gi + mu * s0[i] : s0[i]);
			break;
		case PS_OPT_ADAMW: /* decoupled: the weights shrink first */
			w[i] *= 1 - lr * wd;
			/* fall through */
		case PS_OPT_ADAM:
			s0[i] = b1 * s0[i] + (1 - b1) * gi;
			s1[i] = b2 * s1[i] + (1 - b2) * gi * gi;
			w[i] -= lr * (s0[i] / (1 - pow(b1, t))) /
				(sqrt(s1[i] / (1 - pow(b2, t))) + eps);
			break;
		case PS_OPT_ADAGRAD:
			s0[i] += gi * gi;
			w[i] -= lr / (1 + (t - 1) * c->lr_decay) * gi / (sqrt(s0[i]) + eps);
			break;
		case PS_OPT_REDUCE:
			w[i] = g[i];
			break;
		default:
			ck_abort_msg("no reference for kind %d", (int)c->kind);
		}
	}
}

/* |got - want| <= LONG_TOL * max(1, |want|): relative, but absolute near
 * zero, where a float result of a cancellation has only absolute accuracy. */
static void check_long(const float *got, const double *want, size_t n, const char *what,
		       size_t cfg)
{
	for (size_t i = 0; i < n; i++) {
		double tol = LONG_TOL * fmax(1.0, fabs(want[i]));

		if (!(fabs(got[i] - want[i]) <= tol))
			ck_abort_msg("cfg %zu n %zu: %s[%zu] = %.9g, want %.9g", cfg, n,
				     what, i, (double)got[i], want[i]);
	}
}

/* n floats at a 64-byte boundary, with room for offsets up to 15 floats. */
static float *alloc_floats(size_t n)
{
	return aligned_alloc(64, ((n + 16) * sizeof(float) + 63) / 64 * 64);
}

/* Runs config long_cfgs[ci] for 3 steps on n elements placed at unaligned
 * addresses (offsets 1..3 floats from a 64-byte boundary, different per
 * array, so peeling or unaligned loads are needed) and compares w and the
 * state with ref_step; checks g is untouched. */
static void run_long(size_t ci, size_t n)
{
	const struct ps_optim_cfg *cfg = &long_cfgs[ci];
	const struct ps_optimizer_ops *ops = ps_optimizer_get(cfg->kind);
	float *wbuf = alloc_floats(n);
	float *gbuf = alloc_floats(n);
	float *gcopy = malloc((n + 1) * sizeof(float));
	float *sbuf[PS_OPTIM_MAX_STATE] = { NULL };
	float *state[PS_OPTIM_MAX_STATE] = { NULL };
	double *rw = malloc((n + 1) * sizeof(double));
	double *rs[PS_OPTIM_MAX_STATE] = { NULL };
	float *w = wbuf + 1, *g = gbuf + 3;
	uint64_t seed = 0x9e3779b97f4a7c15ull + ci;
	/* adam: late steps (bias corrections below 1); dampened momentum from a
	 * random state: a step past the first (whose buffer is g' alone, which
	 * the kernel gets from the zero state a first step always has) */
	uint64_t first_step = cfg->kind == PS_OPT_ADAM || cfg->kind == PS_OPT_ADAMW ? 7 :
			      cfg->dampening != 0.0f ? 2 : 0;

	ck_assert_ptr_nonnull(ops);
	ck_assert(wbuf && gbuf && gcopy && rw);
	for (int s = 0; s < PS_OPTIM_MAX_STATE; s++) {
		sbuf[s] = alloc_floats(n);
		rs[s] = malloc((n + 1) * sizeof(double));
		ck_assert(sbuf[s] && rs[s]);
		state[s] = sbuf[s] + 2 + s; /* offsets 2 and 3 floats */
	}
	for (size_t i = 0; i < n; i++) {
		w[i] = rnd(&seed, -2.0f, 2.0f);
		g[i] = rnd(&seed, -1.0f, 1.0f);
		rw[i] = w[i];
	}
	memcpy(gcopy, g, n * sizeof(float));
	/* State as after some training: momentum v in [-1, 1), adam m in
	 * [-0.1, 0.1) and v in [1e-4, 1e-2), adagrad from init_state. */
	if (ops->init_state) {
		ops->init_state(cfg, state, n);
	} else {
		for (size_t i = 0; i < n; i++) {
			if (cfg->kind == PS_OPT_MOMENTUM) {
				state[0][i] = rnd(&seed, -1.0f, 1.0f);
			} else if (cfg->kind == PS_OPT_ADAM || cfg->kind == PS_OPT_ADAMW) {
				state[0][i] = rnd(&seed, -0.1f, 0.1f);
				state[1][i] = rnd(&seed, 1e-4f, 1e-2f);
			}
		}
	}
	for (int s = 0; s < ops->nstate; s++)
		for (size_t i = 0; i < n; i++)
			rs[s][i] = state[s][i];

	for (uint64_t step = first_step; step < first_step + 3; step++) {
		ops->apply(cfg, w, g, state, n, step);
		ref_step(cfg, rw, g, rs[0], rs[1], n, step);
	}
	check_long(w, rw, n, "w", ci);
	for (int s = 0; s < ops->nstate; s++)
		check_long(state[s], rs[s], n, s ? "state[1]" : "state[0]", ci);
	ck_assert_msg(memcmp(g, gcopy, n * sizeof(float)) == 0, "apply modified g");

	free(wbuf);
	free(gbuf);
	free(gcopy);
	free(rw);
	for (int s = 0; s < PS_OPTIM_MAX_STATE; s++) {
		free(sbuf[s]);
		free(rs[s]);
	}
}

START_TEST(test_long_vector)
{
	run_long((size_t)_i, LONG_N);
}
END_TEST

START_TEST(test_short_lengths)
{
	/* Every length up to 40: only a tail, one or more vector blocks plus
	 * every tail length, for SSE (4) and AVX (8) widths. */
	for (size_t n = 1; n <= 40; n++)
		run_long((size_t)_i, n);
}
END_TEST

START_TEST(test_zero_length)
{
	/* n = 0 touches nothing: NULL arrays are fine. */
	struct ps_optim_cfg cfg = { .lr = 0.1f, .momentum = 0.9f, .beta1 = 0.9f,
				    .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f };
	float *state[PS_OPTIM_MAX_STATE] = { NULL };

	for (int k = PS_OPT_SGD; k < PS_OPT_COUNT; k++) {
		const struct ps_optimizer_ops *ops = ps_optimizer_get((enum ps_optim_kind)k);

		cfg.kind = (enum ps_optim_kind)k;
		if (ops->init_state)
			ops->init_state(&cfg, state, 0);
		ops->apply(&cfg, NULL, NULL, state, 0, 0);
	}
}
END_TEST

/* ps_optimizer_finite_after tells, without changing anything, whether an
 * update leaves every weight and state value finite: yes for ordinary
 * values over several of its blocks (and then the real update is indeed
 * finite), no when one element's update overflows (sgd and momentum past
 * FLT_MAX, adam's and adagrad's g*g). */
START_TEST(test_finite_after)
{
	const struct ps_optim_cfg *cfg = &long_cfgs[_i];
	const struct ps_optimizer_ops *ops = ps_optimizer_get(cfg->kind);
	enum { N = 1300 };
	float *w = alloc_floats(N), *g = alloc_floats(N), *w0 = alloc_floats(N);
	float *st[PS_OPTIM_MAX_STATE] = { alloc_floats(N), alloc_floats(N) };
	float *st0[PS_OPTIM_MAX_STATE] = { alloc_floats(N), alloc_floats(N) };
	uint64_t seed = 99 + (uint64_t)_i;

	for (size_t i = 0; i < N; i++) {
		w[i] = rnd(&seed, -1, 1);
		g[i] = rnd(&seed, -1, 1);
		st[0][i] = st[1][i] = 0.0f;
	}
	if (ops->init_state)
		ops->init_state(cfg, st, N);
	/* the element at each of the four lanes of a vector block, and in
	 * the scalar tail: a lane the block's test leaves out would pass an
	 * update that overflows there */
	static const int at[] = { 1200, 1201, 1202, 1203, N - 1 };
	for (size_t a = 0; a < sizeof(at) / sizeof(at[0]); a++)
		for (int bad = 1; bad >= 0; bad--) { /* each left ordinary */
			w[at[a]] = bad ? -FLT_MAX : 0.0f;
			/* reduce: w = g, so only a g that is not finite makes it so */
			g[at[a]] = bad ? (cfg->kind == PS_OPT_REDUCE ? INFINITY : 3e38f) : 0.0f;
			memcpy(w0, w, N * sizeof(float));
			for (int j = 0; j < ops->nstate; j++)
				memcpy(st0[j], st[j], N * sizeof(float));
			ck_assert_msg(ps_optimizer_finite_after(ops, cfg, w, g, st, N, 3) == !bad,
				      "%s: element %d %s", ops->name, at[a],
				      bad ? "overflows, yet the update was found finite" :
				      "is ordinary, yet the update was found not finite");
			ck_assert_int_eq(memcmp(w, w0, N * sizeof(float)), 0);
			for (int j = 0; j < ops->nstate; j++)
				ck_assert_int_eq(memcmp(st[j], st0[j], N * sizeof(float)), 0);
		}
	/* the good update, made for real, is finite */
	ck_assert_int_eq(ps_optimizer_finite_after(ops, cfg, w, g, st, N, 3), 1);
	ops->apply(cfg, w, g, st, N, 3);
	for (size_t i = 0; i < N; i++)
		ck_assert_msg(isfinite(w[i]), "%s: w[%zu] = %g", ops->name, i, w[i]);
	free(w);
	free(g);
	free(w0);
	for (int j = 0; j < PS_OPTIM_MAX_STATE; j++) {
		free(st[j]);
		free(st0[j]);
	}
}
END_TEST

/* finite_after against apply itself: for extreme weights and gradients
 * (a weight near FLT_MAX with a gradient of 1, whose weight decay alone
 * overflows adam's and adagrad's g*g; -FLT_MAX, which any step down
 * overflows; gradients near 2^64 and FLT_MAX, tiny and infinite ones) in a
 * vector lane and in the scalar tail, finite_after says
 * "finite" exactly when applying the update for real leaves every weight
 * and state value finite. Its definition, checked with no formula of the
 * test's own, so a check that leaves out a term (the weight decay, a
 * lane, the state) fails here. */
/* For test_finite_after_matches_apply also: weight decays whose product
 * with the rate is past 1, so that the decay itself (adamw's w *= 1 -
 * lr*wd, the others' g + wd*w) can overflow a weight the gradient would
 * not. */
static const struct ps_optim_cfg big_decay_cfgs[] = {
	{ .kind = PS_OPT_ADAMW, .lr = 1.0f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
	  .weight_decay = 1000.0f },
	{ .kind = PS_OPT_ADAM, .lr = 1.0f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
	  .weight_decay = 1000.0f },
	{ .kind = PS_OPT_SGD, .lr = 1.0f, .weight_decay = 1000.0f },
	{ .kind = PS_OPT_MOMENTUM, .lr = 1.0f, .momentum = 0.9f, .weight_decay = 1000.0f },
	{ .kind = PS_OPT_ADAGRAD, .lr = 1.0f, .eps = 1e-10f, .initial_accumulator = 0.1f,
	  .weight_decay = 1000.0f },
};
#define NBIG_DECAY (sizeof(big_decay_cfgs) / sizeof(big_decay_cfgs[0]))

START_TEST(test_finite_after_matches_apply)
{
	const struct ps_optim_cfg *cfg = _i < (int)NLONG_CFGS ? &long_cfgs[_i]
				       : &big_decay_cfgs[_i - (int)NLONG_CFGS];
	const struct ps_optimizer_ops *ops = ps_optimizer_get(cfg->kind);
	enum { N = 1300 };
	float *w = alloc_floats(N), *g = alloc_floats(N), *wr = alloc_floats(N);
	float *st[PS_OPTIM_MAX_STATE] = { alloc_floats(N), alloc_floats(N) };
	float *sr[PS_OPTIM_MAX_STATE] = { alloc_floats(N), alloc_floats(N) };
	static const float ws[] = { 3e38f, -FLT_MAX, 1e19f, 0.5f };
	static const float gs[] = { 1.0f, -1.0f, 2e19f, 3e38f, 1e-30f, INFINITY };
	static const int at[] = { 1201, N - 1 };
	uint64_t seed = 7 + (uint64_t)_i;
	int bad_seen = 0, good_seen = 0;

	for (size_t i = 0; i < N; i++) {
		w[i] = rnd(&seed, -1, 1);
		g[i] = rnd(&seed, -1, 1);
		st[0][i] = st[1][i] = 0.0f;
	}
	if (ops->init_state)
		ops->init_state(cfg, st, N);
	for (size_t a = 0; a < sizeof(at) / sizeof(at[0]); a++)
		for (size_t x = 0; x < sizeof(ws) / sizeof(ws[0]); x++)
			for (size_t y = 0; y < sizeof(gs) / sizeof(gs[0]); y++) {
				float w0 = w[at[a]], g0 = g[at[a]];
				int finite = 1;

				w[at[a]] = ws[x];
				g[at[a]] = gs[y];
				memcpy(wr, w, N * sizeof(float));
				for (int j = 0; j < ops->nstate; j++)
					memcpy(sr[j], st[j], N * sizeof(float));
				ops->apply(cfg, wr, g, sr, N, 3);
				for (size_t i = 0; i < N; i++) {
					finite &= isfinite(wr[i]) != 0;
					for (int j = 0; j < ops->nstate; j++)
						finite &= isfinite(sr[j][i]) != 0;
				}
				bad_seen |= !finite;
				good_seen |= finite;
				ck_assert_msg(ps_optimizer_finite_after(ops, cfg, w, g, st, N, 3) ==
					      finite, "%s (wd %g): w %g, g %g at %d: the update is %s, "
					      "finite_after says otherwise", ops->name,
					      (double)cfg->weight_decay, (double)ws[x], (double)gs[y],
					      at[a], finite ? "finite" : "not finite");
				w[at[a]] = w0;
				g[at[a]] = g0;
			}
	/* both answers came up, so the comparison could fail either way */
	ck_assert_msg(bad_seen && good_seen, "%s: bad %d good %d", ops->name, bad_seen,
		      good_seen);
	free(w);
	free(g);
	free(wr);
	for (int j = 0; j < PS_OPTIM_MAX_STATE; j++) {
		free(st[j]);
		free(sr[j]);
	}
}
END_TEST

static Suite *optimizer_suite(void)
{
	Suite *s = suite_create("optimizer");
	TCase *tc = tcase_create("hand");
	TCase *tl = tcase_create("reference");

	/* generous: sanitizer builds on a loaded 2-core machine */
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_registry);
	tcase_add_test(tc, test_adam_tail_and_bounds);
	tcase_add_test(tc, test_sgd);
	tcase_add_test(tc, test_sgd_wd);
	tcase_add_test(tc, test_momentum);
	tcase_add_test(tc, test_momentum_nesterov);
	tcase_add_test(tc, test_momentum_wd);
	tcase_add_test(tc, test_momentum_nesterov_wd);
	tcase_add_test(tc, test_adam);
	tcase_add_test(tc, test_adam_wd);
	tcase_add_test(tc, test_adam_bias_correction);
	tcase_add_test(tc, test_adagrad);
	tcase_add_test(tc, test_adagrad_wd);
	tcase_add_test(tc, test_zero_length);
	tcase_add_test(tc, test_momentum_dampening);
	tcase_add_test(tc, test_adamw);
	tcase_add_test(tc, test_adagrad_lr_decay);
	tcase_add_test(tc, test_reduce);
	suite_add_tcase(s, tc);

	/* Sanitizer builds of a million-element run take a few seconds. */
	tcase_set_timeout(tl, 60);
	tcase_add_loop_test(tl, test_short_lengths, 0, (int)NLONG_CFGS);
	tcase_add_loop_test(tl, test_long_vector, 0, (int)NLONG_CFGS);
	tcase_add_loop_test(tl, test_finite_after, 0, (int)NLONG_CFGS);
	tcase_add_loop_test(tl, test_finite_after_matches_apply, 0, (int)(NLONG_CFGS + NBIG_DECAY));
	suite_add_tcase(s, tl);
	return s;
}

int main(void)
{
	int failed;

	failed = tu_run_suite(optimizer_suite());
	return failed ? 1 : 0;
}
