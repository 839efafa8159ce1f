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

#endif
