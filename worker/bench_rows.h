/* bench_rows.h - ps-bench's embedding-row workloads (--op pull-rows,
 * push-rows): Zipf-distributed ids over a table, rows per second, client
 * deduplication and the load of each shard. */
#ifndef PS_BENCH_ROWS_H
#define PS_BENCH_ROWS_H

#include <stdint.h>
#include <stdio.h>
#include "config.h"

struct bench_rows_opts {
	int push;               /* push-rows, else pull-rows */
	uint64_t rows;          /* distinct ids of the table */
	int dim;
	double zipf;            /* exponent s: P(rank r) ~ r^-s */
	int batch;              /* ids per request */
	double seconds;
	int inflight, workers, local, json;
	int fp16;               /* push-rows: gradients as fp16 */
};

/* Replaces cfg's tables with the bench table "bench" (dim, rowwise adagrad). */
void ps_bench_rows_config(struct ps_config *cfg, const struct bench_rows_opts *o);

/* Runs the workload against cfg's shards (already started), prints the
 * result (text or one JSON object) to out. raw_bps is the raw TCP stream
 * baseline in bytes/s of the same run (NAN when skipped). 0 or 1. */
int ps_bench_rows_run(const struct ps_config *cfg, const struct bench_rows_opts *o,
		      double raw_bps, FILE *out);

/* A JSON number, or null when v is not finite (buf holds 32 bytes). */
const char *ps_bench_jnum(char *buf, double v, int prec);

#endif
