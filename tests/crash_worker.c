/* crash_worker.c - a worker of known integer gradients for
 * tests/it_reshard_crash.sh (not a test itself: `make test` builds it).
 *
 *   crash_worker CLOCKS [PACE_MS]
 *
 * Rank $PS_RANK of the config that $PS_CONFIG_FOLLOW's file names (else
 * $PS_CONFIG): sync training of the config's dense tensors (init zeros,
 * sgd at lr 1), every clock a gradient of rank + 1 in every element, so
 * after clock k every weight is -k * S, S = 1 + 2 + ... + workers. It
 * starts at ps_client_clock() (a restarted worker resumes where the shards
 * say it finished), prints "clock K" to stderr after each clock, and after
 * the last one sorts every weight of its final pull: "final: exact E of T,
 * short H, wrong W, deficits: D..." -- exact: -CLOCKS * S; short: -m * S
 * for a whole number of clocks m below CLOCKS (the clocks a shard lost,
 * listed as deficits CLOCKS - m); wrong: anything else (an update applied
 * twice, or part of one). With an embedding table in the config (init
 * zeros, sgd at lr 1) it also pushes, each clock before the dense push, a
 * gradient of rank + 1 in every float of rows 1..CRASH_ROWS of the first
 * table, and counts those rows' floats in the final line the same way.
 * Exit status 0 when it trained to the end, 1 on an error (named).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "config.h"
#include "ps_client.h"
#include "ps_err.h"

#define MAX_T 8
#define CRASH_ROWS 300 /* rows pushed each clock when the config has a table */

/* The config to start with: the one $PS_CONFIG_FOLLOW's file names (a
 * worker restarted after a re-shard starts on the current map), else
 * $PS_CONFIG. */
static int config_path(char *out, size_t len)
{
	const char *ptr = getenv("PS_CONFIG_FOLLOW"), *cfg = getenv("PS_CONFIG");
	FILE *f;

	if (ptr && (f = fopen(ptr, "r"))) {
		char *ok = fgets(out, (int)len, f);
		fclose(f);
		if (ok && out[0] && out[0] != '\n') {
			out[strcspn(out, "\n")] = 0;
			return 0;
		}
	}
	if (!cfg)
		return -1;
	snprintf(out, len, "%s", cfg);
	return 0;
}

int main(int argc, char **argv)
{
	struct ps_config cfg;
	struct ps_client *c = NULL;
	struct ps_tensor tg[MAX_T], tw[MAX_T + 1];
	char path[1024], err[700] = "";
	const char *rk = getenv("PS_RANK");
	long clocks, pace = argc > 2 ? atol(argv[2]) : 0;
	int rank, nt, rc = -1;
	int64_t id;

	if (argc < 2 || (clocks = atol(argv[1])) <= 0 || !rk) {
		fprintf(stderr, "usage: PS_RANK=R PS_CONFIG=FILE crash_worker CLOCKS [PACE_MS]\n");
		return 2;
	}
	rank = atoi(rk);
	/* the shards may not listen yet, or be between two maps: 60 s */
	for (int i = 0; i < 600; i++) {
		if (config_path(path, sizeof(path))) {
			fprintf(stderr, "crash_worker: neither PS_CONFIG_FOLLOW nor PS_CONFIG names a config\n");
			return 2;
		}
		if (ps_config_load(&cfg, path, err, sizeof(err))) {
			fprintf(stderr, "crash_worker: %s\n", err);
			return 2;
		}
		rc = ps_client_init(&c, &cfg, rank, err, sizeof(err));
		if (rc == 0)
			break;
		struct timespec ts = { 0, 100 * 1000 * 1000 };
		nanosleep(&ts, NULL);
	}
	if (rc) {
		fprintf(stderr, "crash_worker: rank %d: %s (%s)\n", rank, err, ps_strerror(rc));
		return 1;
	}
	nt = cfg.ntensors < MAX_T ? cfg.ntensors : MAX_T;
	for (int t = 0; t < nt; t++) {
		size_t n = (size_t)cfg.tensors[t].count;
		float *g = malloc(n * sizeof(float)), *w = calloc(n, sizeof(float));
		if (!g || !w)
			return 1;
		for (size_t i = 0; i < n; i++)
			g[i] = (float)(rank + 1);
		tg[t] = (struct ps_tensor){ .name = cfg.tensors[t].name, .data = g, .count = (int64_t)n };
		tw[t] = (struct ps_tensor){ .name = cfg.tensors[t].name, .data = w, .count = (int64_t)n };
	}
	/* the table's rows: ids 1..CRASH_ROWS, spread over the shards by hash */
	int dim = cfg.ntables ? cfg.tables[0].dim : 0;
	size_t nr = cfg.ntables ? CRASH_ROWS : 0;
	uint64_t rid[CRASH_ROWS];
	float *rg = calloc(nr * (size_t)dim + 1, sizeof(float));
	float *rw = calloc(nr * (size_t)dim + 1, sizeof(float));
	if (!rg || !rw)
		return 1;
	for (size_t i = 0; i < nr; i++)
		rid[i] = i + 1;
	for (size_t i = 0; i < nr * (size_t)dim; i++)
		rg[i] = (float)(rank + 1);
	uint64_t k0 = ps_client_clock(c);
	fprintf(stderr, "crash_worker: rank %d of %d on %s, from clock %llu\n", rank,
		cfg.nworkers, path, (unsigned long long)k0);
	for (uint64_t k = k0; k < (uint64_t)clocks; k++) {
		if (nr && (rc = ps_client_push_rows(c, cfg.tables[0].name, k, rid, nr, rg, 0))) {
			id = 0;
			goto fail;
		}
		id = ps_client_push(c, k, tg, nt, PS_PUSH_END_CLOCK);
		if (id < 0 || (rc = ps_client_wait(c, id)))
			goto fail;
		id = ps_client_pull(c, k + 1, tw, nt);
		if (id < 0 || (rc = ps_client_wait(c, id)))
			goto fail;
		fprintf(stderr, "clock %llu\n", (unsigned long long)k + 1);
		if (pace > 0) {
			struct timespec ts = { pace / 1000, (pace % 1000) * 1000000L };
			nanosleep(&ts, NULL);
		}
	}
	if (nr && (rc = ps_client_pull_rows(c, cfg.tables[0].name, (uint64_t)clocks, rid, nr, rw))) {
		id = 0;
		goto fail;
	}
	/* every weight: -m * S for a whole number of clocks m */
	long s = (long)cfg.nworkers * (cfg.nworkers + 1) / 2, exact = 0, shortn = 0, wrong = 0, all = 0;
	long def[8];
	int nd = 0;
	tw[nt] = (struct ps_tensor){ .name = "rows", .data = rw, .count = (int64_t)nr * dim };
	for (int t = 0; t <= nt; t++) {
		const float *w = tw[t].data;
		for (int64_t i = 0; i < tw[t].count; i++, all++) {
			double v = -(double)w[i];
			long m = lround(v / (double)s);
			if ((double)(m * s) != v || m < 0 || m > clocks) {
				wrong++;
			} else if (m == clocks) {
				exact++;
			} else {
				int seen = 0;
				shortn++;
				for (int d = 0; d < nd; d++)
					seen |= def[d] == clocks - m;
				if (!seen && nd < 8)
					def[nd++] = clocks - m;
			}
		}
	}
	printf("final: exact %ld of %ld, short %ld, wrong %ld, deficits:", exact, all, shortn, wrong);
	for (int d = 0; d < nd; d++)
		printf(" %ld", def[d]);
	printf("\n");
	fflush(stdout);
	ps_client_free(c);
	return 0;
fail:
	fprintf(stderr, "crash_worker: rank %d: %s (%s)\n", rank, ps_client_error(c),
		ps_strerror(id < 0 ? (int)id : rc));
	return 1;
}
