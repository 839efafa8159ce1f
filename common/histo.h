/* histo.h - latency histograms with fixed log2 buckets.
 *
 * Bucket i (0 <= i < PS_HISTO_BUCKETS - 1) counts values of at most 2^i
 * microseconds, the last bucket everything longer (over 2^26 us, about 67
 * s). The bounds are fixed, so histograms from different shards and
 * different moments can be added and subtracted bucket by bucket: ps-stat
 * takes the difference of two snapshots to get the latencies of an
 * interval, and the bounds are the `le` labels of the Prometheus histogram.
 */
#ifndef PS_HISTO_H
#define PS_HISTO_H

#include <stdint.h>

#define PS_HISTO_BUCKETS 28

struct ps_histo {
	uint64_t count[PS_HISTO_BUCKETS];
	double sum_s;            /* sum of every value added, seconds */
};

/* Counts one value (seconds; negative counts as 0). */
void ps_histo_add(struct ps_histo *h, double seconds);

/* Upper bound of bucket i in seconds; +inf for the last. */
double ps_histo_bound_s(int i);

/* The q-quantile (0 < q <= 1) of n bucket counts, in seconds, interpolated
 * geometrically inside its bucket; NAN when every count is 0. */
double ps_histo_quantile(const uint64_t *count, int n, double q);

#endif
