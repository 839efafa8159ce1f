/* histo.c - latency histograms with fixed log2 buckets (histo.h). */
#include <math.h>
#include "histo.h"

void ps_histo_add(struct ps_histo *h, double seconds)
{
	double us = seconds * 1e6;
	int i = 0;

	if (us > 1.0) {
		/* smallest i with 2^i >= us */
		int e;
		double m = frexp(us, &e); /* us = m * 2^e, 0.5 <= m < 1 */
		i = m == 0.5 ? e - 1 : e;
		if (i > PS_HISTO_BUCKETS - 1)
			i = PS_HISTO_BUCKETS - 1;
	}
	h->count[i]++;
	h->sum_s += seconds > 0 ? seconds : 0;
}

double ps_histo_bound_s(int i)
{
	if (i >= PS_HISTO_BUCKETS - 1)
		return INFINITY;
	return ldexp(1.0, i) * 1e-6;
}

double ps_histo_quantile(const uint64_t *count, int n, double q)
{
	uint64_t total = 0, seen = 0;
	double rank;

	for (int i = 0; i < n; i++)
		total += count[i];
	if (total == 0)
		return NAN;
	rank = q * (double)total;
	for (int i = 0; i < n; i++) {
		if (count[i] == 0 || (double)(seen + count[i]) < rank) {
			seen += count[i];
			continue;
		}
		/* inside bucket i: between 2^(i-1) and 2^i us (0 and 1 us for i 0) */
		double f = (rank - (double)seen) / (double)count[i];
		if (i == 0)
			return f * 1e-6;
		if (i >= PS_HISTO_BUCKETS - 1)
			return ps_histo_bound_s(PS_HISTO_BUCKETS - 2); /* at least this */
		return ldexp(1.0, i - 1) * pow(2.0, f) * 1e-6;
	}
	return ps_histo_bound_s(n - 1 < PS_HISTO_BUCKETS - 2 ? n - 1 : PS_HISTO_BUCKETS - 2);
}
