/* optimizer.h - update rules applied by a shard to its parameter slices.
 *
 * Each optimizer is a const struct ps_optimizer_ops found by name
 * (ps_optimizer_find) or by config kind (ps_optimizer_get). State is kept by
 * the caller: nstate float arrays of the slice's length, zero-initialised by
 * the caller (adagrad's initial accumulator is applied by init_state).
 * apply() never blocks, never allocates and touches only the arrays it gets.
 */
#ifndef PS_OPTIMIZER_H
#define PS_OPTIMIZER_H

#include <stddef.h>
#include <stdint.h>
#include "config.h"

#define PS_OPTIM_MAX_STATE 2

struct ps_optimizer_ops {
	const char *name;
	/* Number of per-element float state arrays (0..PS_OPTIM_MAX_STATE). */
	int nstate;
	/* Sets the initial state of n elements (e.g. adagrad's accumulator);
	 * NULL when zeros are right. */
	void (*init_state)(const struct ps_optim_cfg *cfg, float **state, size_t n);
	/* One update of n elements: w <- rule(w, g, state). step is the number
	 * of updates this slice has received before this one (adam's bias
	 * correction uses step + 1). g is not modified. */
	void (*apply)(const struct ps_optim_cfg *cfg, float *restrict w,
		      const float *restrict g, float **state, size_t n, uint64_t step);
	/* 1 when apply() of the same arguments would leave every weight and
	 * state value finite; reads what apply() reads, writes nothing. */
	int (*finite_after)(const struct ps_optim_cfg *cfg, const float *w, const float *g,
			    float *const *state, size_t n, uint64_t step);
};

const struct ps_optimizer_ops *ps_optimizer_get(enum ps_optim_kind kind);
/* NULL when no optimizer has that name. */
const struct ps_optimizer_ops *ps_optimizer_find(const char *name);

/* 1 when one op->apply() of these arguments would leave every weight and
 * every state value finite, else 0; changes nothing. It runs the rule's
 * own kernel without its stores (same operations, same order, so the
 * values it tests are exactly those apply() would write): a shard calls
 * it before an update and refuses the update when it says 0, so a push of
 * finite but huge gradients cannot make weights or state NaN or infinite. */
int ps_optimizer_finite_after(const struct ps_optimizer_ops *op, const struct ps_optim_cfg *cfg,
			      const float *w, const float *g, float *const *state, size_t n,
			      uint64_t step);

/* The double the user most likely wrote for x: the shortest decimal that
 * rounds to x (0.999f gives 0.999, not 0.99900001287...). PyTorch computes
 * 1 - beta and the bias corrections from the Python double; computing them
 * from this instead of (double)x keeps the shard within float rounding of
 * it (1 - 0.999f is 1.3e-5 away from 1 - 0.999 in relative terms). */
double ps_optimizer_exact(float x);

#endif
