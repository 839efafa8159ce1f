/* cloop.c - the loop of bench_py.py's Python side, in C over libps.so: a
 * stricter baseline than ps-bench (the same calls, the same values, timed
 * around each whole call). Prints one JSON line.
 *   cloop CONFIG pushpull|push SECONDS */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "ps_client.h"

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	struct ps_config *cfg;
	struct ps_client *c;
	char err[512];
	size_t cap = 1 << 20, n_ops = 0;
	double *lat = malloc(cap * sizeof(*lat)), secs, t0;
	int pushpull;

	if (argc != 4 || !lat)
		return 2;
	pushpull = strcmp(argv[2], "pushpull") == 0;
	if (ps_config_open(&cfg, argv[1], err, sizeof(err)) ||
	    ps_client_init(&c, cfg, 0, err, sizeof(err))) {
		fprintf(stderr, "cloop: %s\n", err);
		return 1;
	}
	int64_t n = ps_config_tensor_count(cfg, 0);
	float *g = malloc((size_t)n * 4), *w = malloc((size_t)n * 4);
	for (int64_t e = 0; e < n; e++)
		g[e] = (float)((e % 7) - 3) * 1e-4f; /* ps-bench's values */
	struct ps_tensor tg = ps_tensor_of(cfg, 0, g), tw = ps_tensor_of(cfg, 0, w);
	uint64_t clock = ps_client_clock(c);
	double end = now() + atof(argv[3]);
	t0 = now();
	for (;;) {
		double t = now();
		int rc;
		if (pushpull) {
			int64_t ids[2];
			rc = ps_client_pushpull(c, clock, &tg, 1, PS_PUSH_END_CLOCK, clock + 1, &tw, 1, ids);
			if (!rc) /* the pull first, as ps-bench and the binding do */
				rc = ps_client_wait(c, ids[1]);
			if (!rc)
				rc = ps_client_wait(c, ids[0]);
		} else {
			rc = ps_client_wait(c, ps_client_push(c, clock, &tg, 1, PS_PUSH_END_CLOCK));
		}
		if (rc) {
			fprintf(stderr, "cloop: %s\n", ps_client_error(c));
			return 1;
		}
		if (n_ops < cap)
			lat[n_ops] = now() - t;
		n_ops++;
		clock++;
		if (now() >= end)
			break;
	}
	secs = now() - t0;
	size_t m = n_ops < cap ? n_ops : cap;
	qsort(lat, m, sizeof(*lat), cmp);
	printf("{\"ops\":%zu,\"p50_us\":%.3f,\"gb_per_s\":%.4f}\n", n_ops, lat[m / 2] * 1e6,
	       (double)n_ops * (double)n * 4 / secs / 1e9);
	ps_client_free(c);
	ps_config_close(cfg);
	free(g);
	free(w);
	free(lat);
	return 0;
}
