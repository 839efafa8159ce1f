/* bench_util.h - what the micro-benchmarks (bench_*.c) share: a monotonic
 * clock, a barrier against dead-store elimination, aligned buffers, the
 * memcpy baseline every rate is compared with, size labels, and the common
 * command line (--json, --seconds S, --bytes B...). Header-only so each
 * benchmark stays one .c file. */
#ifndef PS_BENCH_UTIL_H
#define PS_BENCH_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "ps_time.h"

#define BU_MAX_SIZES 16


/* Keeps the compiler from dropping stores to memory nobody reads. */
static inline void bu_clobber(void *p)
{
	__asm__ __volatile__("" : : "r"(p) : "memory");
}

/* len zeroed bytes, 64-byte aligned; exits on failure (benchmarks only). */
static inline void *bu_alloc(size_t len)
{
	void *p = aligned_alloc(64, (len + 63) / 64 * 64);

	if (!p) {
		fprintf(stderr, "bench: out of memory (%zu bytes)\n", len);
		exit(1);
	}
	memset(p, 0, len);
	return p;
}

/* Bytes of memcpy per second for len bytes, repeated for about secs. */
static inline double bu_memcpy_rate(size_t len, double secs)
{
	char *src = bu_alloc(len), *dst = bu_alloc(len);
	uint64_t iters = 0;
	double t0, t;

	memset(src, 1, len);
	memcpy(dst, src, len); /* warm up */
	t0 = ps_now_s();
	do {
		for (int k = 0; k < 8; k++) {
			memcpy(dst, src, len);
			bu_clobber(dst);
		}
		iters += 8;
		t = ps_now_s() - t0;
	} while (t < secs);
	free(src);
	free(dst);
	return (double)len * (double)iters / t;
}

static inline void bu_size_label(char *buf, size_t len, size_t bytes)
{
	if (bytes % (1u << 20) == 0)
		snprintf(buf, len, "%zuMiB", bytes >> 20);
	else if (bytes % 1024 == 0)
		snprintf(buf, len, "%zuKiB", bytes >> 10);
	else
		snprintf(buf, len, "%zuB", bytes);
}

/* Parses [--json] [--seconds S] [--bytes B]... (default sizes 1 MiB and
 * 16 MiB). Returns -1 to go on, or the exit status (0 after --help, 2 on a
 * bad argument, the usage written by usage()). */
static inline int bu_parse_args(int argc, char **argv, void (*usage)(FILE *), int *json,
				double *secs, size_t *sizes, int *nsizes)
{
	*nsizes = 0;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--json") == 0) {
			*json = 1;
		} else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
			*secs = atof(argv[++i]);
		} else if (strcmp(argv[i], "--bytes") == 0 && i + 1 < argc &&
			   *nsizes < BU_MAX_SIZES) {
			sizes[(*nsizes)++] = (size_t)strtoull(argv[++i], NULL, 0);
		} else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			usage(stdout);
			return 0;
		} else {
			usage(stderr);
			return 2;
		}
	}
	if (*nsizes == 0) {
		sizes[(*nsizes)++] = 1u << 20;
		sizes[(*nsizes)++] = 16u << 20;
	}
	return -1;
}

#endif
