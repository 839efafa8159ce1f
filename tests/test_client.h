/* test_client.h - a libps client connected to shards that take a while to
 * start (a large state to fill or load first). */
#ifndef TEST_CLIENT_H
#define TEST_CLIENT_H

#include <check.h>
#include <sys/wait.h>
#include "config.h"
#include "ps_client.h"
#include "test_util.h"

/* Rank rank of cfg, connected: tried every 0.1 s for secs seconds while
 * the shard (process pid) starts; fails at once if the shard exits. */
static inline struct ps_client *tu_connect_while_up(const struct ps_config *cfg, int rank,
						    pid_t pid, int secs)
{
	struct ps_client *c = NULL;
	char err[512] = "";
	int st;

	for (int i = 0; i < secs * 10 && !c; i++) {
		if (ps_client_init(&c, cfg, rank, err, sizeof(err)) == 0)
			break;
		ck_assert_msg(waitpid(pid, &st, WNOHANG) == 0, "the shard exited: %s", err);
		tu_sleep_ms(100);
	}
	ck_assert_msg(c != NULL, "connect: %s", err);
	return c;
}

#endif
