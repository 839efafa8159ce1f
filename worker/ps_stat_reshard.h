/* ps_stat_reshard.h - ps-stat's --reshard-stop and --reshard-cancel
 * (ps_stat_reshard.c). */
#ifndef PS_STAT_RESHARD_H
#define PS_STAT_RESHARD_H

#include <signal.h>
#include "config.h"
#include "ps_client.h"

/* --reshard-stop (cancel 0) or --reshard-cancel (cancel 1) over cfg's
 * shards, with a monitor client made into *cp (the caller frees it);
 * *stop set by a signal ends the waits. 0 done, 1 refused or failed (said
 * on stderr). */
int ps__stat_reshard(const struct ps_config *cfg, struct ps_client **cp, int cancel,
		     volatile sig_atomic_t *stop);

#endif
