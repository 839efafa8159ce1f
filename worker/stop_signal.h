/* stop_signal.h - how ps-worker takes SIGTERM and SIGINT. */
#ifndef PS_STOP_SIGNAL_H
#define PS_STOP_SIGNAL_H

#include <signal.h>

/* Seconds a stopped worker has to reach the end of its step. */
#define PS_STOP_GRACE_S 10

/* From now on SIGTERM and SIGINT set *stop (and start the grace alarm:
 * still running PS_STOP_GRACE_S later, the worker exits 130), and
 * SIGPIPE is ignored. Blocks the three signals in the calling thread,
 * which every thread it starts later inherits, and starts the one thread
 * that takes them (stop_signal.c says why): call it from the main thread
 * before any thread is started that runs compute kernels or the client.
 * 0, or a negative errno when that thread could not start (the signals
 * are then taken by plain handlers, as before). */
int ps__stop_signal_init(volatile sig_atomic_t *stop);

#endif
