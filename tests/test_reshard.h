/* test_reshard.h - the cluster set-up the tests of re-sharding share
 * (it_reshard, it_reshard_cases, it_reshard_live, it_reshard_elastic,
 * it_reshard_staged): each case's folder with its checkpoint folder, the
 * config file a case writes
 * again for every shard count and loads into cfg, and a worker's client
 * that waits for the shards to listen; for re-sharding while the workers
 * run (the live_ helpers), the workers' $PS_CONFIG_FOLLOW file, a shard
 * process of a given config, the old checkpoints set aside and a log
 * searched. What the cluster holds (write_cfg) stays with each program.
 *
 * The including file defines RESHARD_TMPDIR, the mkdtemp template of its
 * cases' folders (one name a program, so a failure's logs say whose).
 */
#ifndef TEST_RESHARD_H
#define TEST_RESHARD_H

#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "ckpt_format.h"
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

/* ---- re-sharding while the workers run (it_reshard_live, it_reshard_elastic) ---- */

/* The workers' $PS_CONFIG_FOLLOW file: dir/current once live_point_at ran. */
static char live_ptr[128];

/* Points the workers' $PS_CONFIG_FOLLOW file (dir/current) at path,
 * written whole, then renamed into place, as ps-local.sh does; its line
 * ends in a space and CR LF, as an editor of another system may leave it,
 * which the client trims (ps_client_follow.c). */
static inline void live_point_at(const char *path)
{
	char tmp[160];
	FILE *f;

	snprintf(live_ptr, sizeof(live_ptr), "%s/current", dir);
	snprintf(tmp, sizeof(tmp), "%s.new", live_ptr);
	f = fopen(tmp, "w");
	ck_assert_ptr_nonnull(f);
	fprintf(f, "%s \r\n", path);
	fclose(f);
	ck_assert_int_eq(rename(tmp, live_ptr), 0);
}

/* Shard k's process of the config at path (rep 1: its backup, --replica
 * 1), started from the old_n shards' checkpoints in old when old is set;
 * its log dir/NAME-shard-K[-r1].log, NAME the config file's name. */
static inline pid_t live_start(const char *path, int k, int rep, const char *old, int old_n)
{
	char s[16], n[16], log[160];
	const char *argv[] = { "bin/ps-server", "--config", path, "--shard", s, "--log-level",
			       "info", "--replica", "1", NULL, NULL, NULL, NULL, NULL };
	int a = rep ? 9 : 7;

	if (old) {
		argv[a++] = "--reshard-from";
		argv[a++] = old;
		argv[a++] = "--reshard-shards";
		argv[a++] = n;
	}
	argv[a] = NULL;
	snprintf(s, sizeof(s), "%d", k);
	snprintf(n, sizeof(n), "%d", old_n);
	snprintf(log, sizeof(log), "%s/%s-shard-%d%s.log", dir, strrchr(path, '/') + 1, k,
		 rep ? "-r1" : "");
	return tu_spawn(argv, log);
}

/* Moves the n shards' checkpoints of ck (with replicas 1 their backups'
 * too) into ck/name, as ps-local.sh does: shard-K[-r1].ckpt, and the
 * membership files shard-K[-r1].members where there are any (the new
 * shards take the membership from old shard 0's). */
static inline void live_move_old(const char *name, int n, int replicas, char *to, size_t len)
{
	char a[256], b[300];

	snprintf(to, len, "%s/%s", ck, name);
	ck_assert_int_eq(mkdir(to, 0700), 0);
	for (int k = 0; k < n * (replicas + 1); k++) {
		const char *r1 = k >= n ? "-r1" : "";
		snprintf(a, sizeof(a), "%s/shard-%d%s.ckpt", ck, k % n, r1);
		snprintf(b, sizeof(b), "%s/shard-%d%s.ckpt", to, k % n, r1);
		ck_assert_msg(rename(a, b) == 0, "%s: %s", a, strerror(errno));
		snprintf(a, sizeof(a), "%s/shard-%d%s.members", ck, k % n, r1);
		snprintf(b, sizeof(b), "%s/shard-%d%s.members", to, k % n, r1);
		ck_assert_msg(rename(a, b) == 0 || errno == ENOENT, "%s: %s", a, strerror(errno));
	}
}

/* ps-stat --reshard-stop on config c: every shard stops at clock b. */
static inline void pstat_stop(const char *c, uint64_t b)
{
	char out[200], want[64];
	const char *argv[] = { "bin/ps-stat", "--config", c, "--reshard-stop", NULL };

	snprintf(out, sizeof(out), "%s/pstat-%" PRIu64 ".out", dir, b);
	ck_assert_int_eq(tu_wait_exit(tu_spawn(argv, out)), 0);
	snprintf(want, sizeof(want), "every shard stops at clock %" PRIu64, b);
	ck_assert_msg(tu_log_says(out, want), "ps-stat (%s) did not stop at clock %" PRIu64, out,
		      b);
}

/* Where the tables' part of checkpoint b begins (no declared tensors):
 * after the header, the slices, the finished clocks and, version 5, the
 * map epoch. */
static inline size_t ckpt_tables_at(const uint8_t *b)
{
	struct ckpt_hdr h;
	size_t pos = sizeof(h);

	memcpy(&h, b, sizeof(h));
	for (uint32_t k = 0; k < h.nslots; k++) {
		struct ckpt_slot cs;
		memcpy(&cs, b + pos, sizeof(cs));
		pos += sizeof(cs) + cs.count * 4 * (1 + h.nstate);
	}
	pos += h.nworkers * 8;
	if (h.magic[7] == '5')
		pos += sizeof(struct ckpt_map);
	return pos;
}

#endif
