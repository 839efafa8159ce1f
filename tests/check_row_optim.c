/* check_row_optim.c - the update rules of embedding rows
 * (server/table_optim.c) against their published formulas, written out
 * here again in double precision and without the function under test:
 * sgd, adagrad, rowwise_adagrad, adam (with its per-row step count and
 * bias correction) and FTRL-Proximal (z, n, l1, l2, beta). Each row starts
 * from nonzero weights and runs several steps of gradients of both signs
 * and different sizes, so that a swapped argument, an operator turned
 * around or a state update left out moves a weight or a state float away
 * from the formula's by far more than float rounding.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "config.h"
#include "table.h"
#include "test_util.h"

#define DIM 4
#define STEPS 6
#define MAXROW (DIM * 4)

static struct ps_table_cfg cfg_of(int optimizer)
{
	struct ps_table_cfg tc;

	memset(&tc, 0, sizeof(tc));
	tc.dim = DIM;
	tc.optimizer = optimizer;
	tc.lr = 0.05f;
	tc.eps = 1e-3f;
	tc.beta1 = 0.8f;
	tc.beta2 = 0.95f;
	tc.l1 = 0.01f;
	tc.l2 = 0.1f;
	tc.ftrl_beta = 0.5f;
	return tc;
}

/* the gradient of step s, element j: both signs, sizes 0.05 to 1.6 */
static double grad(int s, int j)
{
	static const double base[DIM] = { 0.9, -0.35, 1.6, -0.05 };
	return base[j] * (s % 2 ? -1.0 : 1.0) * (1.0 + 0.25 * s);
}

/* The expected row after each step (weights then state), in doubles. */
static void expected(int opt, const struct ps_table_cfg *tc, double *r, int s)
{
	double g[DIM];

	for (int j = 0; j < DIM; j++)
		g[j] = grad(s, j);
	switch (opt) {
	case PS_ROPT_SGD:
		for (int j = 0; j < DIM; j++)
			r[j] = r[j] - tc->lr * g[j];
		break;
	case PS_ROPT_ADAGRAD: /* Duchi et al.: a_j = sum of g_j^2 */
		for (int j = 0; j < DIM; j++) {
			r[DIM + j] = r[DIM + j] + g[j] * g[j];
			r[j] = r[j] - tc->lr * g[j] / (sqrt(r[DIM + j]) + tc->eps);
		}
		break;
	case PS_ROPT_ROWWISE_ADAGRAD: { /* one accumulator: mean of g^2 over the row */
		double mean = 0;
		for (int j = 0; j < DIM; j++)
			mean += g[j] * g[j] / DIM;
		r[DIM] += mean;
		for (int j = 0; j < DIM; j++)
			r[j] -= tc->lr * g[j] / (sqrt(r[DIM]) + tc->eps);
		break;
	}
	case PS_ROPT_ADAM: { /* Kingma & Ba, Algorithm 1, with the row's own t */
		double t = r[3 * DIM] + 1, b1 = tc->beta1, b2 = tc->beta2;
		r[3 * DIM] = t;
		for (int j = 0; j < DIM; j++) {
			double m = b1 * r[DIM + j] + (1 - b1) * g[j];
			double v = b2 * r[2 * DIM + j] + (1 - b2) * g[j] * g[j];
			double mhat = m / (1 - pow(b1, t)), vhat = v / (1 - pow(b2, t));
			r[DIM + j] = m;
			r[2 * DIM + j] = v;
			r[j] -= tc->lr * mhat / (sqrt(vhat) + tc->eps);
		}
		break;
	}
	case PS_ROPT_FTRL: /* McMahan et al. 2013, Algorithm 1, alpha = lr */
		for (int j = 0; j < DIM; j++) {
			double z = r[DIM + j], n = r[2 * DIM + j];
			double sigma = (sqrt(n + g[j] * g[j]) - sqrt(n)) / tc->lr;
			z = z + g[j] - sigma * r[j];
			n = n + g[j] * g[j];
			r[DIM + j] = z;
			r[2 * DIM + j] = n;
			if (fabs(z) <= tc->l1)
				r[j] = 0;
			else
				r[j] = -(z - (z < 0 ? -tc->l1 : tc->l1)) /
				       ((tc->ftrl_beta + sqrt(n)) / tc->lr + tc->l2);
		}
		break;
	}
}

/* One optimizer, STEPS steps from the same start: every float of the row
 * (weights and state) within a relative 1e-4 of the formula's after each.
 * The last loop index is FTRL again with an l1 of 1: some of its weights
 * are then clipped to exactly 0 (|z| <= l1) and others are not, so both
 * branches of the rule are compared. */
START_TEST(test_row_optimizer_formula)
{
	static const int opts[] = { PS_ROPT_SGD, PS_ROPT_ADAGRAD, PS_ROPT_ROWWISE_ADAGRAD,
				    PS_ROPT_ADAM, PS_ROPT_FTRL, PS_ROPT_FTRL };
	int opt = opts[_i];
	struct ps_table_cfg tc = cfg_of(opt);
	int n = DIM + ps_row_optim_nstate(&tc), clipped = 0, unclipped = 0;
	float row[MAXROW], g[DIM];
	double want[MAXROW];
	static const int nstate[] = { 0, DIM, 1, 2 * DIM + 1, 2 * DIM, 2 * DIM };

	if (_i == 5)
		tc.l1 = 1.0f;

	ck_assert_int_eq(ps_row_optim_nstate(&tc), nstate[_i]);
	ck_assert_int_le(n, MAXROW);
	for (int j = 0; j < n; j++)
		want[j] = row[j] = j < DIM ? 0.5f - 0.3f * (float)j : 0.0f;
	for (int s = 0; s < STEPS; s++) {
		for (int j = 0; j < DIM; j++)
			g[j] = (float)grad(s, j);
		ps_row_optim_apply(&tc, row, g);
		expected(opt, &tc, want, s);
		for (int j = 0; j < n; j++)
			ck_assert_msg(fabs(row[j] - want[j]) <= 1e-4 * fmax(1.0, fabs(want[j])),
				      "%s, step %d, float %d of the row (%s): %.7g where the formula "
				      "gives %.7g", ps_row_optim_name(opt), s + 1, j,
				      j < DIM ? "weight" : "state", row[j], want[j]);
		for (int j = 0; j < DIM; j++) {
			clipped += want[j] == 0.0;
			unclipped += want[j] != 0.0;
		}
	}
	if (_i == 5)
		ck_assert_msg(clipped > 0 && unclipped > 0, "ftrl with l1 %g: %d weights clipped "
			      "to 0 and %d not over the steps; both are due", tc.l1, clipped,
			      unclipped);
	/* the steps moved the weights (the comparison above means something
	 * only if the formula does not stay put) */
	double moved = 0;
	for (int j = 0; j < DIM; j++)
		moved = fmax(moved, fabs(want[j] - (0.5 - 0.3 * j)));
	ck_assert_msg(moved > 1e-2, "%s: the weights did not move", ps_row_optim_name(opt));
}
END_TEST

int main(void)
{
	Suite *s = suite_create("row_optim");
	TCase *tc = tcase_create("row_optim");

	TU_ADD_LOOP(tc, test_row_optimizer_formula, 0, 6);
	suite_add_tcase(s, tc);
	return tu_run_suite(s) ? 1 : 0;
}
