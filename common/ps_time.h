/* ps_time.h - the one clock everything measures durations with. */
#ifndef PS_TIME_H
#define PS_TIME_H

#include <time.h>

/* Seconds on the monotonic clock (not wall time: for intervals only). */
static inline double ps_now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Seconds on the wall clock (CLOCK_REALTIME, since 1970): a time base
 * two processes share (exactly on one host, within the hosts' clock
 * skew across hosts), for the few values they exchange as instants. */
static inline double ps_wall_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The wall clock now, and in *mono the monotonic clock at the same
 * instant (read on both sides of it, again when the thread was preempted
 * between: within 0.1 ms of each other, or the closest of four tries), so
 * an instant converts between the two without a preemption's error. */
static inline double ps_wall_mono_s(double *mono)
{
	double m0 = ps_now_s(), w = ps_wall_s(), m1 = ps_now_s(), best = m1 - m0;

	*mono = (m0 + m1) / 2;
	for (int i = 0; i < 3 && best > 1e-4; i++) {
		double a = ps_now_s(), wi = ps_wall_s(), b = ps_now_s();
		if (b - a < best) {
			best = b - a;
			w = wi;
			*mono = (a + b) / 2;
		}
	}
	return w;
}

#endif
