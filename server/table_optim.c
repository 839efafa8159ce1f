/* table_optim.c - update rules of embedding rows. A row is dim weights
 * followed by its optimizer state (ps_row_optim_nstate floats), updated
 * in place by one gradient of dim floats:
 *   sgd              w -= lr g
 *   adagrad          a += g^2;            w -= lr g / (sqrt(a) + eps)   (a per element)
 *   rowwise_adagrad  a += mean(g^2);      w -= lr g / (sqrt(a) + eps)   (one a per row)
 *   adam             m, v per element and the row's own step count t, so a
 *                    row touched rarely gets the bias correction of its own
 *                    updates, not of the table's
 *   ftrl             FTRL-Proximal (McMahan et al. 2013): z, n per element,
 *                    w derived from them with l1, l2, alpha = lr, beta
 * Plain loops over one row: rows are short and the compiler vectorises them.
 */
#include <math.h>
#include <string.h>
#include "finite.h"
#include "table.h"

static void adagrad(const struct ps_table_cfg *tc, float *restrict w, const float *restrict g)
{
	float *a = w + tc->dim;

	for (int j = 0; j < tc->dim; j++) {
		a[j] += g[j] * g[j];
		w[j] -= tc->lr * g[j] / (sqrtf(a[j]) + tc->eps);
	}
}

static void rowwise_adagrad(const struct ps_table_cfg *tc, float *restrict w,
			    const float *restrict g)
{
	float sq = 0.0f, step;

	for (int j = 0; j < tc->dim; j++)
		sq += g[j] * g[j];
	w[tc->dim] += sq / (float)tc->dim;
	step = tc->lr / (sqrtf(w[tc->dim]) + tc->eps);
	for (int j = 0; j < tc->dim; j++)
		w[j] -= step * g[j];
}

static void adam(const struct ps_table_cfg *tc, float *restrict w, const float *restrict g)
{
	float *m = w + tc->dim, *v = m + tc->dim, *t = v + tc->dim;
	float b1 = tc->beta1, b2 = tc->beta2, c1, c2;

	*t += 1.0f;
	c1 = 1.0f - powf(b1, *t);
	c2 = 1.0f - powf(b2, *t);
	for (int j = 0; j < tc->dim; j++) {
		m[j] = b1 * m[j] + (1.0f - b1) * g[j];
		v[j] = b2 * v[j] + (1.0f - b2) * g[j] * g[j];
		w[j] -= tc->lr * (m[j] / c1) / (sqrtf(v[j] / c2) + tc->eps);
	}
}

static void ftrl(const struct ps_table_cfg *tc, float *restrict w, const float *restrict g)
{
	float *z = w + tc->dim, *n = z + tc->dim;
	float alpha = tc->lr;

	for (int j = 0; j < tc->dim; j++) {
		float nn = n[j] + g[j] * g[j];
		float sigma = (sqrtf(nn) - sqrtf(n[j])) / alpha;
		z[j] += g[j] - sigma * w[j];
		n[j] = nn;
		if (fabsf(z[j]) <= tc->l1)
			w[j] = 0.0f;
		else
			w[j] = -(z[j] - copysignf(tc->l1, z[j])) /
			       ((tc->ftrl_beta + sqrtf(nn)) / alpha + tc->l2);
	}
}

void ps_row_optim_apply(const struct ps_table_cfg *tc, float *restrict row,
			const float *restrict g)
{
	switch (tc->optimizer) {
	case PS_ROPT_ADAGRAD:
		adagrad(tc, row, g);
		break;
	case PS_ROPT_ROWWISE_ADAGRAD:
		rowwise_adagrad(tc, row, g);
		break;
	case PS_ROPT_ADAM:
		adam(tc, row, g);
		break;
	case PS_ROPT_FTRL:
		ftrl(tc, row, g);
		break;
	default:
		for (int j = 0; j < tc->dim; j++)
			row[j] -= tc->lr * g[j];
		break;
	}
}

int ps_table_update_finite(const struct ps_table *tb, uint64_t id, const float *g, float *scratch)
{
	uint32_t r;

	if (!ps_words_finite(g, (size_t)tb->dim))
		return 0;
	r = ps_table_find(tb, id);
	if (r == PS_ROW_NIL)
		ps_table_row_reset(tb, id, scratch);
	else
		memcpy(scratch, ps_table_vals(tb, r), sizeof(float) * (size_t)tb->row_floats);
	ps_row_optim_apply(tb->tc, scratch, g);
	return ps_words_finite(scratch, (size_t)tb->row_floats);
}
