/* test_reshard.h - the cluster set-up the tests of re-sharding by restart
 * share (it_reshard, it_reshard_cases): each case's folder with its
 * checkpoint folder, the config file a case writes again for every shard
 * count and loads into cfg, and a worker's client that waits for the
 * shards to listen. What the cluster holds (write_cfg) and how its
 * processes start stay with each program.
 *
 * The including file defines RESHARD_TMPDIR, the mkdtemp template of its
 * cases' folders (one name a program, so a failure's logs say whose).
 */
#ifndef TEST_RESHARD_H
#define TEST_RESHARD_H

#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "config.h"
#include "ps_client.h"
#include "test_util.h"

#ifndef RESHARD_TMPDIR
#error "define RESHARD_TMPDIR (a mkdtemp template) before including test_reshard.h"
#endif

/* The case's folder, its checkpoint folder dir/ck, the config file (made
 * at the case's first write_config) and the config last written. */
static char dir[64], ck[128], path[64];
static struct ps_config cfg;

/* yaml into the config file at path, then loaded into cfg. */
static inline void write_config(const char *yaml)
{
	char err[512];

	if (!path[0])
		ck_assert_int_eq(tu_write_temp(path, yaml), 0);
	FILE *f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs(yaml, f);
	fclose(f);
	ck_assert_msg(ps_config_load(&cfg, path, err, sizeof(err)) == 0, "%s", err);
}

/* A worker's client of rank (0 for one worker), once the shards listen
 * (30 s at most): refused connections, and a shard that still holds the
 * rank's last connection, are tried again. */
static inline struct ps_client *connect_retry(int rank)
{
	struct ps_client *c = NULL;
	char err[512];
	int rc = -1;

	for (int i = 0; i < 300; i++) {
		rc = ps_client_init(&c, &cfg, rank, err, sizeof(err));
		if (rc != -ECONNREFUSED && !strstr(err, "is connected already"))
			break;
		tu_sleep_ms(100);
	}
	ck_assert_msg(rc == 0, "connect rank %d: %s (logs in %s)", rank, err, dir);
	return c;
}

static inline void setup_dirs(void)
{
	strcpy(dir, RESHARD_TMPDIR);
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(ck, sizeof(ck), "%s/ck", dir);
	ck_assert_int_eq(mkdir(ck, 0700), 0);
	path[0] = 0;
}

static inline void cleanup_dirs(void)
{
	ck_assert_int_eq(tu_rmtree(dir), 0);
	unlink(path);
	path[0] = 0;
}

#endif
