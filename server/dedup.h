/* dedup.h - which pushes of one worker a shard has already handled, so a
 * push resent after a reconnect is applied at most once (docs/reliability.md).
 *
 * A worker numbers its pushes (Push.seq, increasing per process; its
 * incarnation, in the Hello, changes with each process). The shard keeps,
 * per rank, the highest number seen and a window of the 4096 below it, plus
 * the outcome of the last pushes it refused, so a resent push gets the
 * answer the first one got: an ack when it was accepted, the same error
 * when it was refused. Pure data structure; the shard's loop thread only.
 */
#ifndef PS_DEDUP_H
#define PS_DEDUP_H

#include <stdint.h>

#define PS_DEDUP_WINDOW 4096
#define PS_DEDUP_ERRS 32

enum ps_dedup_verdict {
	PS_DEDUP_NEW,      /* not seen: handle it, then ps_dedup_mark */
	PS_DEDUP_SEEN,     /* handled before; *code: 0 (accepted) or its error */
	PS_DEDUP_TOO_OLD,  /* below the window: cannot tell, must be refused */
};

struct ps_dedup {
	uint64_t incarnation;
	uint64_t max;                          /* highest seq marked; 0 = none */
	uint64_t bits[PS_DEDUP_WINDOW / 64];   /* bit (seq % WINDOW): seq in (max - WINDOW, max] seen */
	struct { uint64_t seq; int code; } errs[PS_DEDUP_ERRS]; /* refused pushes, a ring */
	unsigned nerr;
};

/* Forgets everything when incarnation is new (another worker process). */
void ps_dedup_incarnation(struct ps_dedup *d, uint64_t incarnation);

enum ps_dedup_verdict ps_dedup_check(const struct ps_dedup *d, uint64_t seq, int *code);

/* Records that push seq (> 0) was handled with outcome code (0 = accepted). */
void ps_dedup_mark(struct ps_dedup *d, uint64_t seq, int code);

/* FNV-1a of the incarnation, the highest number and the window's bits
 * (not the refused pushes' outcomes): equal windows, equal digests. */
uint64_t ps_dedup_digest(const struct ps_dedup *d);

#endif
