/* optimizer.c - the update rules a shard applies to its parameter slices:
 * sgd, momentum (PyTorch semantics: dampening, optional Nesterov), adam (L2
 * weight decay), adamw (decoupled weight decay), adagrad (lr_decay) and
 * reduce (the weights become the gradient), each in PyTorch's order of
 * operations.
 *
 * Speed: the server applies these to every pushed gradient, so each rule is
 * a set of straight-line kernels that gcc auto-vectorizes. The cases that
 * would put a branch inside the loop (weight decay zero or not, Nesterov or
 * not) are chosen once per call, outside the loop. The kernels take every
 * array as a restrict parameter so gcc knows w, g and the state arrays do
 * not overlap and vectorizes without runtime alias checks.
 *
 * The build uses -O2, whose "very cheap" vectorizer cost model refuses loops
 * of unknown trip count, so this file asks for O3. No -march: the code is
 * SSE2 (the x86_64 baseline). sgd and momentum are also cloned for AVX2
 * (picked once at load time by an ifunc): on slices that are in cache (a
 * gradient that has just arrived) that measured 1.4-3x faster; on slices that
 * are not, both run at memory speed. adam and adagrad measured no gain
 * from the clone (their 4-wide sqrt and division bound them), so have none.
 *
 * Results are bit-identical whichever path runs: every path does the same
 * IEEE float operations in the same order (no reductions, and neither SSE2
 * nor AVX2 lets gcc contract a*b+c into an FMA), which BSP's reproducible
 * runs rely on.
 */
#pragma GCC optimize("O3")

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "optimizer.h"

/* Every kernel is written once with its cases as int parameters (use_wd,
 * nesterov, dry) and always inlined into apply(), which passes them as
 * constants: gcc folds the tests away and each call site gets its own
 * branch-free loop. dry: nothing is stored; the kernel computes the same
 * values with the same operations and returns whether any would not be
 * finite (finite_after(): reads what apply() reads, writes nothing). */
#define KERNEL static inline __attribute__((always_inline))

/* Not under ThreadSanitizer: it instruments the ifunc resolvers, which run
 * before it is initialised (the program dies while loading). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__ELF__) && \
	!defined(__SANITIZE_THREAD__)
#define AVX2_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define AVX2_CLONES
#endif

/* sqrtf() keeps errno semantics under the build's flags (-fmath-errno, which
 * neither the pragma above nor an optimize attribute turns off for builtins),
 * and that check is a branch that stops gcc from vectorizing. Where SSE is
 * there (all of x86_64) the rules that need a square root process blocks of
 * four with gcc vector extensions and sqrtps; the scalar tail (and other
 * targets) uses sqrtf. Both are correctly rounded IEEE operations done in the
 * same order, so the two paths give bit-identical results. */
#if defined(__SSE__) && defined(__GNUC__)
#define HAVE_V4 1
typedef float v4f __attribute__((vector_size(16)));

static inline v4f load4(const float *p)
{
	v4f x;

	memcpy(&x, p, sizeof(x)); /* unaligned load: movups */
	return x;
}

static inline void store4(float *p, v4f x)
{
	memcpy(p, &x, sizeof(x));
}

static inline v4f sqrt4(v4f x)
{
	return __builtin_ia32_sqrtps(x);
}

typedef int32_t v4i __attribute__((vector_size(16)));

/* Lanes whose exponent bits are all ones (NaN, infinity): -1, others 0. */
static inline v4i nonfinite4(v4f x)
{
	const v4i e = { 0x7f800000, 0x7f800000, 0x7f800000, 0x7f800000 };

	return ((v4i)x & e) == e;
}

static inline int any4(v4i m)
{
	return (m[0] | m[1] | m[2] | m[3]) != 0;
}
#endif

/* 1 when x is NaN or infinite: its exponent bits all ones (bit tests, which
 * gcc vectorizes, where isfinite() would not be). */
static inline int nonfinite(float x)
{
	uint32_t u;

	memcpy(&u, &x, sizeof(u));
	return (u & 0x7f800000u) == 0x7f800000u;
}

double ps_optimizer_exact(float x)
{
	/* a few recent answers: every apply() of adam asks for both betas */
	static __thread uint32_t in[4];
	static __thread double out[4];
	static __thread unsigned next;
	char buf[32];
	uint32_t u;
	double d = (double)x;

	memcpy(&u, &x, sizeof(u));
	for (int i = 0; i < 4; i++)
		if (in[i] == u)
			return out[i]; /* (the zero entries answer 0.0f with 0.0) */
	for (int p = 1; p <= 9; p++) {
		snprintf(buf, sizeof(buf), "%.*g", p, (double)x);
		if (strtof(buf, NULL) == x) {
			d = strtod(buf, NULL);
			break;
		}
	}
	in[next % 4] = u;
	out[next % 4] = d;
	next++;
	return d;
}

/* ---- sgd: g' = g + wd*w; w -= lr*g' ---- */

KERNEL int sgd_kernel(float *restrict w, const float *restrict g, size_t n,
		      float lr, float wd, int use_wd, int dry)
{
	int bad = 0;

	for (size_t i = 0; i < n; i++) {
		float gi = g[i];

		if (use_wd)
			gi += wd * w[i];
		float wi = w[i] - lr * gi;

		if (dry)
			bad |= nonfinite(wi);
		else
			w[i] = wi;
	}
	return bad;
}

AVX2_CLONES static void sgd_apply(const struct ps_optim_cfg *cfg, float *restrict w,
		      const float *restrict g, float **state, size_t n, uint64_t step)
{
	const float lr = cfg->lr, wd = cfg->weight_decay;

	(void)state;
	(void)step;
	if (wd == 0.0f)
		sgd_kernel(w, g, n, lr, wd, 0, 0);
	else
		sgd_kernel(w, g, n, lr, wd, 1, 0);
}

/* The finite_after() of each rule: its kernel with dry set, which never
 * stores, so casting the const away from w and the state is safe. */
AVX2_CLONES static int sgd_finite_after(const struct ps_optim_cfg *cfg, const float *w,
					const float *g, float *const *state, size_t n,
					uint64_t step)
{
	const float lr = cfg->lr, wd = cfg->weight_decay;

	(void)state;
	(void)step;
	if (wd == 0.0f)
		return !sgd_kernel((float *)w, g, n, lr, wd, 0, 1);
	return !sgd_kernel((float *)w, g, n, lr, wd, 1, 1);
}

/* ---- momentum: g' = g + wd*w; v = mu*v + (1-dampening)*g', the first
 *      step v = g'; w -= lr*v, or with Nesterov w -= lr*(g' + mu*v) ----
 * PyTorch's SGD with momentum: the first step makes the buffer a copy of
 * g' (no dampening). From the zero state that is mu*0 + 1*g', so the first
 * step runs the same kernel with the gradient's factor omd = 1 (and later
 * steps with omd = 1 - dampening; 1*g' is exact, so dampening 0 costs
 * nothing in accuracy). */

KERNEL int momentum_kernel(float *restrict w, const float *restrict g,
			   float *restrict v, size_t n, float lr, float mu, float omd, float wd,
			   int use_wd, int nesterov, int dry)
{
	int bad = 0;

	for (size_t i = 0; i < n; i++) {
		float gi = g[i];

		if (use_wd)
			gi += wd * w[i];
		float vi = mu * v[i] + omd * gi;
		float wi = nesterov ? w[i] - lr * (gi + mu * vi) : w[i] - lr * vi;

		if (dry) {
			bad |= nonfinite(vi) | nonfinite(wi);
		} else {
			v[i] = vi;
			w[i] = wi;
		}
	}
	return bad;
}

/* The gradient's factor in the velocity at this step (see above). */
static float momentum_omd(const struct ps_optim_cfg *cfg, uint64_t step)
{
	return step == 0 ? 1.0f : (float)(1.0 - ps_optimizer_exact(cfg->dampening));
}

AVX2_CLONES static void momentum_apply(const struct ps_optim_cfg *cfg, float *restrict w,
			   const float *restrict g, float **state, size_t n, uint64_t step)
{
	const float lr = cfg->lr, mu = cfg->momentum, wd = cfg->weight_decay;
	const float omd = momentum_omd(cfg, step);
	float *v = state[0];

	if (cfg->nesterov) {
		if (wd == 0.0f)
			momentum_kernel(w, g, v, n, lr, mu, omd, wd, 0, 1, 0);
		else
			momentum_kernel(w, g, v, n, lr, mu, omd, wd, 1, 1, 0);
	} else {
		if (wd == 0.0f)
			momentum_kernel(w, g, v, n, lr, mu, omd, wd, 0, 0, 0);
		else
			momentum_kernel(w, g, v, n, lr, mu, omd, wd, 1, 0, 0);
	}
}

AVX2_CLONES static int momentum_finite_after(const struct ps_optim_cfg *cfg, const float *w,
					     const float *g, float *const *state, size_t n,
					     uint64_t step)
{
	const float lr = cfg->lr, mu = cfg->momentum, wd = cfg->weight_decay;
	const float omd = momentum_omd(cfg, step);
	float *wm = (float *)w, *v = state[0];

	if (cfg->nesterov)
		return !(wd == 0.0f ? momentum_kernel(wm, g, v, n, lr, mu, omd, wd, 0, 1, 1)
				    : momentum_kernel(wm, g, v, n, lr, mu, omd, wd, 1, 1, 1));
	return !(wd == 0.0f ? momentum_kernel(wm, g, v, n, lr, mu, omd, wd, 0, 0, 1)
			    : momentum_kernel(wm, g, v, n, lr, mu, omd, wd, 1, 0, 1));
}

/* ---- adam: g' = g + wd*w; m = b1*m + (1-b1)*g'; v = b2*v + (1-b2)*g'^2;
 *      w -= (lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps), bc1 = 1-b1^t,
 *      bc2 = 1-b2^t, t = step + 1 ----
 * In PyTorch's order of operations (_single_tensor_adam): the bias
 * corrections are per call, computed once in double from the
 * hyperparameters as the user wrote them (ps_optimizer_exact) and folded into
 * two scalars, a = lr/bc1 and c = sqrt(bc2):
 *   w += ((-a) * m) / (sqrt(v) / c + eps)   (addcdiv)
 *   v = b2*v + ((1-b2)*g')*g'              (addcmul).
 * adamw first scales the weights by 1 - lr*wd (decoupled decay) and adds
 * no L2 term. */

struct adam_k {
	float b1, omb1;   /* beta1, 1 - beta1 */
	float b2, omb2;   /* beta2, 1 - beta2 */
	float a, c, eps;  /* folded step size and sqrt(bias correction 2) */
	float wd;         /* adam: L2 factor; adamw: the weights' factor 1 - lr*wd */
};

KERNEL int adam_kernel(float *restrict w, const float *restrict g,
		       float *restrict m, float *restrict v, size_t n,
		       struct adam_k k, int use_wd, int decoupled, int dry)
{
	size_t i = 0;
	int bad = 0;

#ifdef HAVE_V4
	v4i bad4 = { 0, 0, 0, 0 };

	for (; i + 4 <= n; i += 4) {
		v4f wi = load4(w + i), gi = load4(g + i);

		if (decoupled)
			wi = wi * k.wd;
		else if (use_wd)
			gi += k.wd * wi;
		v4f mi = k.b1 * load4(m + i) + k.omb1 * gi;
		v4f vi = k.b2 * load4(v + i) + (k.omb2 * gi) * gi;
		v4f wn = wi + ((-k.a) * mi) / (sqrt4(vi) / k.c + k.eps);

		if (dry) {
			bad4 |= nonfinite4(mi) | nonfinite4(vi) | nonfinite4(wn);
		} else {
			store4(m + i, mi);
			store4(v + i, vi);
			store4(w + i, wn);
		}
	}
	bad = any4(bad4);
#endif
	for (; i < n; i++) {
		float gi = g[i], wi = w[i];

		if (decoupled)
			wi = wi * k.wd;
		else if (use_wd)
			gi += k.wd * wi;
		float mi = k.b1 * m[i] + k.omb1 * gi;
		float vi = k.b2 * v[i] + (k.omb2 * gi) * gi;
		float wn = wi + ((-k.a) * mi) / (sqrtf(vi) / k.c + k.eps);

		if (dry) {
			bad |= nonfinite(mi) | nonfinite(vi) | nonfinite(wn);
		} else {
			m[i] = mi;
			v[i] = vi;
			w[i] = wn;
		}
	}
	return bad;
}

/* The scalars of one adam step (bias corrections of step + 1). */
static struct adam_k adam_consts(const struct ps_optim_cfg *cfg, uint64_t step)
{
	/* t = step + 1 >= 1, so both corrections are > 0 for betas in [0, 1). */
	double t = (double)step + 1.0;
	double b1 = ps_optimizer_exact(cfg->beta1), b2 = ps_optimizer_exact(cfg->beta2);
	double bc1 = 1.0 - pow(b1, t);
	double bc2 = 1.0 - pow(b2, t);
	struct adam_k k = {
		.b1 = cfg->beta1, .omb1 = (float)(1.0 - b1),
		.b2 = cfg->beta2, .omb2 = (float)(1.0 - b2),
		.a = (float)((double)cfg->lr / bc1),
		.c = (float)sqrt(bc2),
		.eps = cfg->eps,
		.wd = cfg->weight_decay,
	};

	if (cfg->kind == PS_OPT_ADAMW)
		k.wd = (float)(1.0 - (double)cfg->lr * ps_optimizer_exact(cfg->weight_decay));
	return k;
}

static void adam_apply(const struct ps_optim_cfg *cfg, float *restrict w,
		       const float *restrict g, float **state, size_t n, uint64_t step)
{
	struct adam_k k = adam_consts(cfg, step);

	if (cfg->kind == PS_OPT_ADAMW)
		adam_kernel(w, g, state[0], state[1], n, k, 0, 1, 0);
	else if (k.wd == 0.0f)
		adam_kernel(w, g, state[0], state[1], n, k, 0, 0, 0);
	else
		adam_kernel(w, g, state[0], state[1], n, k, 1, 0, 0);
}

static int adam_finite_after(const struct ps_optim_cfg *cfg, const float *w, const float *g,
			     float *const *state, size_t n, uint64_t step)
{
	struct adam_k k = adam_consts(cfg, step);

	if (cfg->kind == PS_OPT_ADAMW)
		return !adam_kernel((float *)w, g, state[0], state[1], n, k, 0, 1, 1);
	if (k.wd == 0.0f)
		return !adam_kernel((float *)w, g, state[0], state[1], n, k, 0, 0, 1);
	return !adam_kernel((float *)w, g, state[0], state[1], n, k, 1, 0, 1);
}

/* ---- adagrad: g' = g + wd*w; acc += g'^2; w -= clr*g'/(sqrt(acc) + eps),
 *      clr = lr / (1 + (t-1)*lr_decay), t = step + 1 ----
 * PyTorch's order: w += ((-clr) * g') / (sqrt(acc) + eps) (addcdiv). */

KERNEL int adagrad_kernel(float *restrict w, const float *restrict g,
			  float *restrict acc, size_t n, float lr, float eps,
			  float wd, int use_wd, int dry)
{
	size_t i = 0;
	int bad = 0;

#ifdef HAVE_V4
	v4i bad4 = { 0, 0, 0, 0 };

	for (; i + 4 <= n; i += 4) {
		v4f wi = load4(w + i), gi = load4(g + i);

		if (use_wd)
			gi += wd * wi;
		v4f ai = load4(acc + i) + gi * gi;
		v4f wn = wi - lr * gi / (sqrt4(ai) + eps);

		if (dry) {
			bad4 |= nonfinite4(ai) | nonfinite4(wn);
		} else {
			store4(acc + i, ai);
			store4(w + i, wn);
		}
	}
	bad = any4(bad4);
#endif
	for (; i < n; i++) {
		float gi = g[i];

		if (use_wd)
			gi += wd * w[i];
		float ai = acc[i] + gi * gi;
		float wn = w[i] - lr * gi / (sqrtf(ai) + eps);

		if (dry) {
			bad |= nonfinite(ai) | nonfinite(wn);
		} else {
			acc[i] = ai;
			w[i] = wn;
		}
	}
	return bad;
}

/* The step's learning rate (lr itself when lr_decay is 0). */
static float adagrad_clr(const struct ps_optim_cfg *cfg, uint64_t step)
{
	if (cfg->lr_decay == 0.0f)
		return cfg->lr;
	return (float)((double)cfg->lr /
		       (1.0 + (double)step * ps_optimizer_exact(cfg->lr_decay)));
}

static void adagrad_apply(const struct ps_optim_cfg *cfg, float *restrict w,
			  const float *restrict g, float **state, size_t n, uint64_t step)
{
	const float lr = adagrad_clr(cfg, step), eps = cfg->eps, wd = cfg->weight_decay;

	if (wd == 0.0f)
		adagrad_kernel(w, g, state[0], n, lr, eps, wd, 0, 0);
	else
		adagrad_kernel(w, g, state[0], n, lr, eps, wd, 1, 0);
}

static int adagrad_finite_after(const struct ps_optim_cfg *cfg, const float *w,
				const float *g, float *const *state, size_t n, uint64_t step)
{
	const float lr = adagrad_clr(cfg, step), eps = cfg->eps, wd = cfg->weight_decay;

	if (wd == 0.0f)
		return !adagrad_kernel((float *)w, g, state[0], n, lr, eps, wd, 0, 1);
	return !adagrad_kernel((float *)w, g, state[0], n, lr, eps, wd, 1, 1);
}

/* The accumulator starts at initial_accumulator (PyTorch's
 * initial_accumulator_value), not at the caller's zeros. */
static void adagrad_init_state(const struct ps_optim_cfg *cfg, float **state, size_t n)
{
	float *acc = state[0];
	const float a0 = cfg->initial_accumulator;

	for (size_t i = 0; i < n; i++)
		acc[i] = a0;
}

/* ---- reduce: w = g (the clock's gradient, averaged by the store when the
 *      group says so, becomes the tensor's value: workers that run their
 *      optimizer locally pull it back) ---- */

static void reduce_apply(const struct ps_optim_cfg *cfg, float *restrict w,
			 const float *restrict g, float **state, size_t n, uint64_t step)
{
	(void)cfg;
	(void)state;
	(void)step;
	if (n)
		memcpy(w, g, n * sizeof(float));
}

static int reduce_finite_after(const struct ps_optim_cfg *cfg, const float *w, const float *g,
			       float *const *state, size_t n, uint64_t step)
{
	int bad = 0;

	(void)cfg;
	(void)w;
	(void)state;
	(void)step;
	for (size_t i = 0; i < n; i++)
		bad |= nonfinite(g[i]);
	return !bad;
}

/* ---- registry ---- */

static const struct ps_optimizer_ops sgd_ops = {
	.name = "sgd", .nstate = 0, .init_state = NULL, .apply = sgd_apply,
	.finite_after = sgd_finite_after,
};
static const struct ps_optimizer_ops momentum_ops = {
	.name = "momentum", .nstate = 1, .init_state = NULL, .apply = momentum_apply,
	.finite_after = momentum_finite_after,
};
static const struct ps_optimizer_ops adam_ops = {
	.name = "adam", .nstate = 2, .init_state = NULL, .apply = adam_apply,
	.finite_after = adam_finite_after,
};
static const struct ps_optimizer_ops adagrad_ops = {
	.name = "adagrad", .nstate = 1, .init_state = adagrad_init_state,
	.apply = adagrad_apply, .finite_after = adagrad_finite_after,
};
static const struct ps_optimizer_ops adamw_ops = {
	.name = "adamw", .nstate = 2, .init_state = NULL, .apply = adam_apply,
	.finite_after = adam_finite_after,
};
static const struct ps_optimizer_ops reduce_ops = {
	.name = "reduce", .nstate = 0, .init_state = NULL, .apply = reduce_apply,
	.finite_after = reduce_finite_after,
};

/* Indexed by enum ps_optim_kind. */
static const struct ps_optimizer_ops *const optimizers[] = {
	[PS_OPT_SGD] = &sgd_ops,
	[PS_OPT_MOMENTUM] = &momentum_ops,
	[PS_OPT_ADAM] = &adam_ops,
	[PS_OPT_ADAGRAD] = &adagrad_ops,
	[PS_OPT_ADAMW] = &adamw_ops,
	[PS_OPT_REDUCE] = &reduce_ops,
};

#define NOPTIMIZERS (sizeof(optimizers) / sizeof(optimizers[0]))

/* The optimizer for a config kind; NULL for a kind outside the enum. */
const struct ps_optimizer_ops *ps_optimizer_get(enum ps_optim_kind kind)
{
	if ((unsigned)kind >= NOPTIMIZERS)
		return NULL;
	return optimizers[kind];
}

/* The optimizer whose name is exactly name (case-sensitive, as in the
 * config file); NULL for an unknown name or NULL. */
const struct ps_optimizer_ops *ps_optimizer_find(const char *name)
{
	if (!name)
		return NULL;
	for (size_t i = 0; i < NOPTIMIZERS; i++)
		if (strcmp(optimizers[i]->name, name) == 0)
			return optimizers[i];
	return NULL;
}

int ps_optimizer_finite_after(const struct ps_optimizer_ops *op, const struct ps_optim_cfg *cfg,
			      const float *w, const float *g, float *const *state, size_t n,
			      uint64_t step)
{
	return op->finite_after(cfg, w, g, state, n, step);
}
