/* bench_optimizer.c - throughput of each update rule on one core.
 *
 * For each optimizer (and the momentum/Nesterov variants) and each slice
 * size, apply() is called on the same slice for about --seconds seconds and
 * the rate is reported as bytes of gradient per second. memcpy of the same
 * number of bytes, timed the same way in the same run, is the baseline: the
 * ratio apply/memcpy is what to compare between machines, since both move
 * with the memory system and the noise of the moment.
 *
 * Usage: bench_optimizer [--json] [--seconds S] [--bytes B]...
 *   default sizes 1 MiB and 16 MiB of gradient (256Ki and 4Mi floats).
 * Output: "momentum  1MiB  apply 3.21 GB/s  memcpy 9.8 GB/s  ratio 0.33",
 * or with --json one JSON object per line.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "bench_util.h"
#include "optimizer.h"


struct variant {
	const char *label;
	enum ps_optim_kind kind;
	int nesterov;
	float weight_decay;
};

static const struct variant variants[] = {
	{ "sgd", PS_OPT_SGD, 0, 0.0f },
	{ "sgd-wd", PS_OPT_SGD, 0, 1e-4f },
	{ "momentum", PS_OPT_MOMENTUM, 0, 0.0f },
	{ "momentum-wd", PS_OPT_MOMENTUM, 0, 1e-4f },
	{ "nesterov", PS_OPT_MOMENTUM, 1, 0.0f },
	{ "adam", PS_OPT_ADAM, 0, 0.0f },
	{ "adam-wd", PS_OPT_ADAM, 0, 1e-4f },
	{ "adagrad", PS_OPT_ADAGRAD, 0, 0.0f },
	{ "adamw", PS_OPT_ADAMW, 0, 1e-2f },
	{ "reduce", PS_OPT_REDUCE, 0, 0.0f },
};

static float *alloc_floats(size_t n, float value)
{
	float *p = bu_alloc(n * sizeof(float));

	for (size_t i = 0; i < n; i++)
		p[i] = value;
	return p;
}

/* Bytes of gradient per second for one variant on n floats. */
static double bench_apply(const struct variant *var, size_t n, double secs)
{
	struct ps_optim_cfg cfg = {
		.kind = var->kind, .lr = 1e-3f, .momentum = 0.9f,
		.nesterov = var->nesterov, .beta1 = 0.9f, .beta2 = 0.999f,
		.eps = 1e-8f, .weight_decay = var->weight_decay,
		.initial_accumulator = 0.1f,
	};
	const struct ps_optimizer_ops *ops = ps_optimizer_get(var->kind);
	float *w = alloc_floats(n, 0.5f), *g = alloc_floats(n, 0.0f);
	float *state[PS_OPTIM_MAX_STATE] = { NULL };
	uint64_t step = 0;
	double t0, t;

	for (size_t i = 0; i < n; i++) /* varied, small, both signs */
		g[i] = (float)((int)(i * 2654435761u % 2001u) - 1000) * 1e-3f;
	for (int s = 0; s < ops->nstate; s++)
		state[s] = alloc_floats(n, 0.0f);
	if (ops->init_state)
		ops->init_state(&cfg, state, n);
	ops->apply(&cfg, w, g, state, n, step++); /* warm up */
	t0 = ps_now_s();
	do {
		for (int k = 0; k < 4; k++) {
			ops->apply(&cfg, w, g, state, n, step++);
			bu_clobber(w);
		}
		t = ps_now_s() - t0;
	} while (t < secs);
	free(w);
	free(g);
	for (int s = 0; s < ops->nstate; s++)
		free(state[s]);
	return (double)n * sizeof(float) * (double)(step - 1) / t;
}

static void usage(FILE *out)
{
	fprintf(out, "usage: bench_optimizer [--json] [--seconds S] [--bytes B]...\n"
		"  --json       one JSON object per line\n"
		"  --seconds S  time per measurement (default 1)\n"
		"  --bytes B    gradient bytes per slice, repeatable "
		"(default 1 MiB and 16 MiB)\n");
}

int main(int argc, char **argv)
{
	size_t sizes[BU_MAX_SIZES];
	int nsizes = 0, json = 0;
	double secs = 1.0;

	int rc = bu_parse_args(argc, argv, usage, &json, &secs, sizes, &nsizes);

	if (rc >= 0)
		return rc;
	for (int s = 0; s < nsizes; s++) {
		size_t n = sizes[s] / sizeof(float);
		size_t bytes = n * sizeof(float);
		char label[32];

		if (n == 0) {
			fprintf(stderr, "bench_optimizer: size %zu too small\n", sizes[s]);
			return 2;
		}
		bu_size_label(label, sizeof(label), bytes);
		for (size_t v = 0; v < sizeof(variants) / sizeof(variants[0]); v++) {
			double mc = bu_memcpy_rate(bytes, secs);
			double ap = bench_apply(&variants[v], n, secs);

			if (json)
				printf("{\"optimizer\":\"%s\",\"bytes\":%zu,\"apply_gbps\":%.3f,"
				       "\"memcpy_gbps\":%.3f,\"ratio\":%.3f}\n",
				       variants[v].label, bytes, ap * 1e-9, mc * 1e-9, ap / mc);
			else
				printf("%-12s %6s  apply %6.2f GB/s  memcpy %6.2f GB/s  ratio %.2f\n",
				       variants[v].label, label, ap * 1e-9, mc * 1e-9, ap / mc);
			fflush(stdout);
		}
	}
	return 0;
}
