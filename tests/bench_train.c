/* bench_train.c - compute-only training speed of the model presets: the
 * baseline that distributed training is compared with in `make bench`.
 *
 * For each preset (mlp, cnn) and backend (cpu on oneDNN, ref the plain
 * reference, cuda when a GPU is usable)
 * one process runs forward, backward and the download of every gradient to
 * host memory, exactly as ps-worker does, with no servers: what a step costs
 * before any push or pull. Reported as samples/s and ms per step.
 *
 * Usage: bench_train [--seconds S] [--batch B] [--threads T] [--backend NAME]... [--json]
 * --threads: compute threads (ps_compute_opts.threads; 0, the default, is
 * the backend's own: OMP_NUM_THREADS or the cores for cpu).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "bench_util.h"
#include "compute.h"
#include "config.h"
#include "net.h"
#include "ps_err.h"

/* Small deterministic pseudo-random floats in [-a, a]. */
static void fill(float *p, size_t n, float a, uint64_t *s)
{
	for (size_t i = 0; i < n; i++) {
		*s = *s * 6364136223846793005ull + 1442695040888963407ull;
		p[i] = a * ((float)(*s >> 40) / (float)(1 << 24) * 2.0f - 1.0f);
	}
}

/* One training step as the worker runs it, gradients waited for in push
 * order (on cuda the step's only waits). */
static int step(struct ps_net *net, const float *x, const int32_t *y, int batch)
{
	uint64_t gen;
	int wt, bt;

	if (ps_net_load_batch(net, x, y, batch) || ps_net_forward(net) ||
	    ps_net_backward(net, 1.0f, &gen))
		return -1;
	for (int k = 0; k < net->ngrads; k++)
		if (ps_net_grad_wait(net, gen, k, &wt, &bt))
			return -1;
	return 0;
}

static int bench(const char *preset, const char *backend, int batch, int threads,
		 double seconds, int json)
{
	struct ps_compute_opts opts = { .threads = threads };
	const struct ps_compute_ops *ops = NULL;
	struct ps_compute *c = NULL;
	struct ps_config *cfg = calloc(1, sizeof(*cfg));
	struct ps_net net = { 0 };
	char yaml[256], err[512] = "";
	float *x = NULL;
	int32_t *y = NULL;
	int steps = 0, rc = -1;
	uint64_t seed = 1;
	double t0, t;
	size_t in;

	if (!cfg)
		goto out;
	if (ps_compute_load(backend, &ops, err, sizeof(err))) {
		printf("%-4s %-5s skipped: %s\n", preset, backend, err);
		rc = 0;
		goto out;
	}
	snprintf(yaml, sizeof(yaml), "cluster: {servers: [127.0.0.1:1], workers: 1}\n"
		 "model: {preset: %s}\n", preset);
	if (ps_config_load_string(cfg, yaml, "bench", err, sizeof(err)))
		goto out;
	if (ops->create(&c, &opts, err, sizeof(err))) {
		printf("%-4s %-5s skipped: %s\n", preset, backend, err);
		rc = 0;
		goto out;
	}
	if (ps_net_init(&net, cfg, ops, c, batch, err, sizeof(err)))
		goto out;
	in = (size_t)cfg->model.input[0] * cfg->model.input[1] * cfg->model.input[2];
	x = malloc((size_t)batch * in * sizeof(float));
	y = malloc((size_t)batch * sizeof(int32_t));
	if (!x || !y)
		goto out;
	fill(x, (size_t)batch * in, 1.0f, &seed);
	for (int i = 0; i < batch; i++)
		y[i] = i % cfg->model.classes;
	for (int i = 0; i < cfg->ntensors; i++)
		fill(net.host_w[i], (size_t)cfg->tensors[i].count, cfg->tensors[i].init_value, &seed);
	if (ps_net_upload_weights(&net))
		goto out;
	/* one untimed step warms caches, BLAS buffers, cuDNN plans */
	if (step(&net, x, y, batch))
		goto out;
	t0 = ps_now_s();
	do {
		if (step(&net, x, y, batch))
			goto out;
		steps++;
		t = ps_now_s();
	} while (t - t0 < seconds);
	if (json)
		printf("{\"model\":\"%s\",\"backend\":\"%s\",\"batch\":%d,\"threads\":%d,"
		       "\"steps\":%d,\"ms_per_step\":%.3f,\"samples_per_s\":%.1f}\n", preset,
		       backend, batch, threads, steps, (t - t0) * 1e3 / steps,
		       steps * batch / (t - t0));
	else
		printf("%-4s %-5s batch %d: %8.2f ms/step  %9.0f samples/s  (%d steps)\n", preset,
		       backend, batch, (t - t0) * 1e3 / steps, steps * batch / (t - t0), steps);
	rc = 0;
out:
	if (rc)
		fprintf(stderr, "bench_train: %s on %s: %s%s\n", preset, backend, err,
			c ? c->err : "");
	ps_net_free(&net);
	if (c)
		c->ops->destroy(c);
	free(x);
	free(y);
	free(cfg);
	return rc;
}

int main(int argc, char **argv)
{
	double seconds = 3;
	int batch = 64, json = 0, rc = 0, threads = 0, nb = 0;
	const char *backends[8];

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
			seconds = atof(argv[++i]);
		else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
			batch = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
			threads = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--backend") && i + 1 < argc && nb < 8)
			backends[nb++] = argv[++i];
		else if (!strcmp(argv[i], "--json"))
			json = 1;
		else {
			fprintf(stderr, "usage: bench_train [--seconds S] [--batch B] [--threads T] "
				"[--backend NAME]... [--json]\n");
			return 2;
		}
	}
	if (seconds <= 0 || batch < 1 || batch > 65536 || threads < 0) {
		fprintf(stderr, "bench_train: --seconds must be > 0, --batch 1..65536, --threads >= 0\n");
		return 2;
	}
	static const char *const presets[] = { "mlp", "cnn" };
	if (!nb) {
		backends[nb++] = "cpu";
		backends[nb++] = "ref";
		backends[nb++] = "cuda";
	}
	for (int p = 0; p < 2; p++)
		for (int b = 0; b < nb; b++)
			rc |= bench(presets[p], backends[b], batch, threads, seconds, json);
	return rc ? 1 : 0;
}
