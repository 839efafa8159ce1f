/* it_reshard_staged.c - a staged re-shard (the pre-copy, docs/elastic.md)
 * builds the tables an unstaged start from the same files builds, row for
 * row, with real shard processes; 2 -> 3 shards and 3 -> 2.
 *
 * The old shards hold a table (dim 64, adagrad, admission 2, ttl 6 s;
 * capped by limits.max_table_bytes at 1870 rows a shard, whatever the
 * shard count; no checkpoint.incremental) and a dense tensor; one worker
 * client trains them in sync clocks: 6,600 ids admitted (the cap
 * evicting), 4 s later the first 6,000 pushed again. Then the pre-copies
 * (SIGUSR1: each old shard writes a full checkpoint), the last old
 * shard's 1.5 s after the others' with rows of the others pushed between
 * (rows changed after their pre-copy that are older than rows unchanged
 * on the last one: the staged merge must place those again among the
 * changed ones), and the new shards start staged on them (--reshard-stage:
 * they load and merge them, and wait). Between the pre-copies and the
 * stop the worker updates 40 hot rows, admits new ids (the cap evicting
 * the least recently updated), counts others once, and the other 600 of
 * the first ids expire (the ttl). ps-stat --reshard-stop stops the old
 * shards, whose incremental checkpoints carry those changed rows and
 * dropped ids; the files are moved aside and the staged shards told to go
 * on (SIGUSR1). As many shards start from the same folder unstaged, with
 * a checkpoint folder of their own. Each new shard's first checkpoint (a
 * snapshot of the merge, taken before it serves anything) is compared with
 * its unstaged twin's:
 *  - the dense part and the finished clocks byte for byte;
 *  - its table's version, row count and counters (admitted, evicted,
 *    expired, filter lookups and hits), every row's id, weights and
 *    adagrad state in the same recency order, the same ages relative to
 *    the newest row (the stamps), and the admission filter's slots;
 * and checked: the stop's increments dropped ids and changed rows, the
 * staged shards applied them to their merge (their log says so; nothing
 * merged again whole), no expired id is on a new shard, every id admitted
 * after the pre-copies is, each row on the shard its hash names, and the
 * cap held (3 -> 2: the merge drops rows for it).
 */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "ckpt_format.h"
#include "config.h"
#include "ps_client.h"
#include "rows_wire.h"
#define RESHARD_TMPDIR "/tmp/ps-reshard-staged-XXXXXX"
#include "test_reshard.h"
#include "test_util.h"

#define DIM 64
#define RF (DIM * 2)     /* adagrad: weights and accumulators */
#define NA 256
#define NFIRST 6600      /* ids admitted before the pre-copies */
#define NSTILL 6000      /* of them, pushed again before the pre-copies */
#define NHOT 40          /* of them, pushed every clock after */
#define TTL 6
/* the cap: (1 MiB less the filter's 8192 ids in 32 KiB) / 543 bytes a row */
#define CAP 1870
#define MAXIDS 8192

/* The old cluster's config, the new one's (staged) and the new one's
 * unstaged twin (its own ports and checkpoint folder ck2). */
static char cold[160], cnew[160], cnewu[160], ck2[160];
static const char *ck_extra = ""; /* more of the checkpoint section, every config */

static void write_cfgs(int old_n, int new_n)
{
	char yaml[2048], servers[256], fmt[1024];
	const char *body =
		"slice_bytes: 256\nseed: 9\n"
		"optimizer:\n  name: momentum\n  lr: 0.5\n  momentum: 0.9\n"
		"model:\n  tensors:\n    - {name: a, shape: [%d], init: arange}\n"
		"  embeddings:\n    - {name: e, dim: %d, init: uniform, scale: 0.5, optimizer: "
		"adagrad, lr: 0.25, admission: 2, filter_ids: 8192, ttl: %d}\n"
		"limits:\n  max_table_bytes: 1MiB\n"
		"checkpoint:\n  dir: %s\n  every_s: 0\n%s"
		"security:\n  auth: false\nlog:\n  level: info\n";
	const struct { char *out; int n; const char *name, *ckd; } c[3] = {
		{ cold, old_n, "old", ck }, { cnew, new_n, "new", ck }, { cnewu, new_n, "newu", ck2 } };

	snprintf(ck2, sizeof(ck2), "%s/ck2", dir);
	ck_assert_int_eq(mkdir(ck2, 0700), 0);
	for (int i = 0; i < 3; i++) {
		tu_servers_list(c[i].n, servers, sizeof(servers));
		snprintf(fmt, sizeof(fmt), "cluster:\n  servers: [%s]\n  workers: 1\n%s", servers,
			 body);
		snprintf(yaml, sizeof(yaml), fmt, NA, DIM, TTL, c[i].ckd, ck_extra);
		tu_write_named(dir, c[i].name, yaml, c[i].out, 160);
	}
	/* cfg: the old cluster's (the worker's) */
	ck_assert_msg(ps_config_load(&cfg, cold, yaml, sizeof(yaml)) == 0, "%s", yaml);
}

static uint64_t id_of(int i)
{
	return (uint64_t)i * 7919u + 11;
}

/* i of id_of(i), or -1. */
static int index_of(uint64_t id)
{
	return id >= 11 && (id - 11) % 7919 == 0 ? (int)((id - 11) / 7919) : -1;
}

/* Shard k of config conf, logging to dir/NAME-K.log; old: --reshard-from
 * old (old_n old shards), staged (stage) with this process as its
 * launcher. */
static pid_t start(const char *conf, const char *name, int k, const char *old, int old_n,
		   int stage)
{
	char s[16], me[16], on[16], log[200];
	const char *argv[16] = { "bin/ps-server", "--config", conf, "--shard", s, "--log-level",
				 "info" };
	int a = 7;

	snprintf(s, sizeof(s), "%d", k);
	snprintf(me, sizeof(me), "%d", (int)getpid());
	snprintf(on, sizeof(on), "%d", old_n);
	snprintf(log, sizeof(log), "%s/%s-%d.log", dir, name, k);
	if (old) {
		argv[a++] = "--reshard-from";
		argv[a++] = old;
		argv[a++] = "--reshard-shards";
		argv[a++] = on;
	}
	if (stage) {
		argv[a++] = "--reshard-stage";
		argv[a++] = me;
	}
	argv[a] = NULL;
	return tu_spawn(argv, log);
}

/* Waits (60 s at most) until dir/NAME-K.log says what. */
static void wait_log(const char *name, int k, const char *what)
{
	char log[200];
	int t;

	snprintf(log, sizeof(log), "%s/%s-%d.log", dir, name, k);
	for (t = 0; t < 600 && !tu_log_says(log, what); t++)
		tu_sleep_ms(100);
	ck_assert_msg(t < 600, "%s: no '%s' within 60 s", log, what);
}

/* One clock: the rows of ids (n), gradients of halves, then the dense
 * tensor ending the clock. */
static void clock_push(struct ps_client *c, uint64_t k, const uint64_t *ids, int n)
{
	static float g[MAXIDS * DIM], ga[NA];
	struct ps_tensor tg = { .name = "a", .data = ga, .count = NA };

	for (int i = 0; i < n * DIM; i++)
		g[i] = (float)((int)((i + k) % 3) - 1) * 0.5f;
	for (int i = 0; i < NA; i++)
		ga[i] = (float)((int)((i + k) % 5) - 2);
	ck_assert_msg(ps_client_push_rows(c, "e", k, ids, (size_t)n, g, 0) == 0,
		      "push_rows %" PRIu64 ": %s", k, ps_client_error(c));
	int64_t p = ps_client_push(c, k, &tg, 1, PS_PUSH_END_CLOCK);
	ck_assert_msg(p > 0 && ps_client_wait(c, p) == 0, "push %" PRIu64 ": %s", k,
		      ps_client_error(c));
}

/* The old shard k's incremental checkpoint seq (the stop's: the last):
 * its table record (changed rows, dropped ids). */
static struct ckpt_table old_delta(const char *from, int k, int seq)
{
	char f[300];
	size_t len, pos;
	uint8_t *b;
	struct ckpt_table ct;

	snprintf(f, sizeof(f), "%s/shard-%d.ckpt.delta-%d", from, k, seq);
	b = tu_slurp(f, &len);
	ck_assert_msg(b != NULL, "%s: %s", f, strerror(errno));
	ck_assert(!memcmp(b, "PSDELTA1", 8));
	pos = ckpt_tables_at(b) + sizeof(struct ckpt_delta_head);
	memcpy(&ct, b + pos, sizeof(ct));
	free(b);
	return ct;
}

/* Waits (30 s at most) for new shard k's own checkpoint in folder d. */
static uint8_t *new_ckpt(const char *d, int k, size_t *len)
{
	char f[300];
	struct stat st;
	int t;

	snprintf(f, sizeof(f), "%s/shard-%d.ckpt", d, k);
	for (t = 0; t < 300 && stat(f, &st); t++)
		tu_sleep_ms(100);
	ck_assert_msg(t < 300, "new shard %d wrote no checkpoint in %s within 30 s", k, d);
	uint8_t *b = tu_slurp(f, len);
	ck_assert_msg(b != NULL, "%s: %s", f, strerror(errno));
	return b;
}

/* The ids on the new shards (each once). */
static uint64_t seen[4 * CAP];
static int nseen;

/* Compares staged shard k's first checkpoint (a) with its unstaged twin's
 * (u), of new_n shards; gathers its ids into seen. */
static void compare(int k, int new_n, const uint8_t *a, size_t alen, const uint8_t *u,
		    size_t ulen)
{
	size_t pa = ckpt_tables_at(a), pu = ckpt_tables_at(u);
	struct ckpt_table ta, tu;
	uint64_t tkey = ps_rows_table_key(&cfg.tables[0]);
	size_t rb = sizeof(struct ckpt_row) + RF * sizeof(float);
	struct ckpt_row la, lu;

	ck_assert_uint_eq(alen, ulen);
	ck_assert_uint_eq(pa, pu);
	/* the header (its map hash the same: ports are not in it), the
	 * slices, the finished clocks, the map epoch */
	ck_assert_msg(!memcmp(a, u, pa), "shard %d: the dense part differs", k);
	memcpy(&ta, a + pa, sizeof(ta));
	memcpy(&tu, u + pu, sizeof(tu));
	ck_assert_uint_eq(ta.version, tu.version);
	ck_assert_uint_eq(ta.nrows, tu.nrows);
	ck_assert_uint_eq(ta.admitted, tu.admitted);
	ck_assert_uint_eq(ta.evicted, tu.evicted);
	ck_assert_uint_eq(ta.expired, tu.expired);
	ck_assert_uint_eq(ta.filter_lookups, tu.filter_lookups);
	ck_assert_uint_eq(ta.filter_hits, tu.filter_hits);
	ck_assert_uint_eq(ta.filter_slots, tu.filter_slots);
	ck_assert_msg(ta.nrows > 0 && ta.nrows <= CAP, "shard %d: %" PRIu64 " rows (cap %d)", k,
		      ta.nrows, CAP);
	pa += sizeof(ta);
	pu += sizeof(tu);
	memcpy(&la, a + pa + (ta.nrows - 1) * rb, sizeof(la));
	memcpy(&lu, u + pu + (tu.nrows - 1) * rb, sizeof(lu));
	for (uint64_t i = 0; i < ta.nrows; i++, pa += rb, pu += rb) {
		struct ckpt_row ra, ru;
		int q;

		memcpy(&ra, a + pa, sizeof(ra));
		memcpy(&ru, u + pu, sizeof(ru));
		ck_assert_msg(ra.id == ru.id, "shard %d: row %" PRIu64 " of the recency order is id "
			      "%" PRIu64 " staged, %" PRIu64 " unstaged", k, i, ra.id, ru.id);
		ck_assert_msg(!memcmp(a + pa + sizeof(ra), u + pu + sizeof(ru), RF * sizeof(float)),
			      "shard %d: row %" PRIu64 ": weights or state differ", k, ra.id);
		ck_assert_msg(ra.age - la.age == ru.age - lu.age, "shard %d: row %" PRIu64 " is %u s "
			      "older than the newest staged, %u s unstaged", k, ra.id, ra.age - la.age,
			      ru.age - lu.age);
		ck_assert_int_eq(ps_rows_shard(tkey, ra.id, new_n), k);
		/* those of the first ids not pushed again expired before the stop */
		q = index_of(ra.id);
		ck_assert_msg(q < NSTILL || q >= NFIRST, "shard %d: id %" PRIu64 " expired before "
			      "the stop, and is here", k, ra.id);
		ck_assert_int_lt(nseen, 4 * CAP);
		seen[nseen++] = ra.id;
	}
	ck_assert_msg(!memcmp(a + pa, u + pu, ta.filter_slots * 4),
		      "shard %d: the admission filters differ", k);
}

/* How many times dir/NAME-K.log says what. */
static int log_count(const char *name, int k, const char *what)
{
	char log[200], line[4096];
	FILE *f;
	int n = 0;

	snprintf(log, sizeof(log), "%s/%s-%d.log", dir, name, k);
	f = fopen(log, "r");
	while (f && fgets(line, sizeof(line), f))
		n += strstr(line, what) != NULL;
	if (f)
		fclose(f);
	return n;
}

/* The old shards' files of ck moved into from, as the launcher does at a
 * commit (the full checkpoint, its ndelta incremental ones, the stop's
 * the last); the ids the stop's increments dropped and the rows they
 * changed added to *tombs and *changed. */
static void set_aside(const char *from, int old_n, int ndelta, uint64_t *tombs,
		      uint64_t *changed)
{
	char a[300], b[320], sfx[32];

	for (int j = 0; j < old_n; j++) {
		for (int q = -1; q <= ndelta; q++) {
			if (q < 0)
				snprintf(sfx, sizeof(sfx), ".members");
			else if (q == 0)
				snprintf(sfx, sizeof(sfx), ".ckpt");
			else
				snprintf(sfx, sizeof(sfx), ".ckpt.delta-%d", q);
			snprintf(a, sizeof(a), "%s/shard-%d%s", ck, j, sfx);
			snprintf(b, sizeof(b), "%s/shard-%d%s", from, j, sfx);
			ck_assert_msg(rename(a, b) == 0 || (q < 0 && errno == ENOENT), "%s: %s", a,
				      strerror(errno));
		}
		snprintf(a, sizeof(a), "%s/shard-%d.ckpt.delta-%d", ck, j, ndelta + 1);
		ck_assert_msg(access(a, F_OK) != 0, "%s: %d incremental checkpoints expected", a,
			      ndelta);
		struct ckpt_table ct = old_delta(from, j, ndelta);
		*tombs += ct.ntombs;
		*changed += ct.nrows;
	}
}

/* New shard j's first checkpoint, staged, against its unstaged twin's. */
static void compare_twin(int j, int new_n)
{
	uint8_t *x, *y;
	size_t xl, yl;

	x = new_ckpt(ck, j, &xl);
	y = new_ckpt(ck2, j, &yl);
	compare(j, new_n, x, xl, y, yl);
	free(x);
	free(y);
}

/* replace_base: old shard 0 writes a second pre-copy after the staged
 * shards loaded its first, so the full checkpoint they staged is not the
 * one the stop's increment builds on: each staged shard loads that old
 * shard's file again whole at the commit, and still equals its unstaged
 * twin. */
static void run_staged(int old_n, int new_n, int replace_base)
{
	static uint64_t ids[MAXIDS];
	pid_t old[3], stg[3], uns[3];
	char from[200], a[300];
	struct ps_client *c;
	uint64_t k = 0, tombs = 0, changed = 0, tkey;
	int n, last = old_n - 1;

	setup_dirs();
	nseen = 0;
	write_cfgs(old_n, new_n);
	tkey = ps_rows_table_key(&cfg.tables[0]);
	for (int j = 0; j < old_n; j++)
		old[j] = start(cold, "old", j, NULL, 0, 0);
	c = connect_retry(0);
	/* the first ids pushed twice (admitted; the cap evicts) */
	for (int i = 0; i < NFIRST; i++)
		ids[i] = id_of(i);
	clock_push(c, k++, ids, NFIRST);
	clock_push(c, k++, ids, NFIRST);
	/* 4 s on (within the ttl), most of them again: the rows of the others
	 * expire between the pre-copies and the stop, these not */
	tu_sleep_ms(4000);
	clock_push(c, k++, ids, NSTILL);
	/* the pre-copies: the last old shard's 1.5 s after the others', with
	 * rows of the others pushed between them (changed there), then rows
	 * of the last one (unchanged there, and newer) */
	for (int j = 0; j < last; j++)
		kill(old[j], SIGUSR1);
	for (int j = 0; j < last; j++)
		wait_log("old", j, "checkpoint (re-shard pre-copy) written");
	for (int i = n = 0; i < NSTILL; i += 3)
		if (ps_rows_shard(tkey, id_of(i), old_n) != last)
			ids[n++] = id_of(i);
	clock_push(c, k++, ids, n);
	tu_sleep_ms(1500);
	for (int i = n = 0; i < NSTILL; i += 3)
		if (ps_rows_shard(tkey, id_of(i), old_n) == last)
			ids[n++] = id_of(i);
	clock_push(c, k++, ids, n);
	kill(old[last], SIGUSR1);
	wait_log("old", last, "checkpoint (re-shard pre-copy) written");
	snprintf(from, sizeof(from), "%s/from", ck);
	ck_assert_int_eq(mkdir(from, 0700), 0);
	/* between the pre-copies and the stop, 1.5 s: the hot rows updated
	 * each clock, 10 new ids admitted every other clock (the cap
	 * evicting), 10 counted once, the others of the first ids expiring */
	for (int r = 0; r < 6; r++) {
		n = 0;
		for (int i = 0; i < NHOT; i++)
			ids[n++] = id_of(i);
		for (int i = 0; i < 10; i++)
			ids[n++] = id_of(20000 + (r / 2) * 10 + i);
		for (int i = 0; i < 10; i++)
			ids[n++] = id_of(30000 + r * 10 + i);
		clock_push(c, k++, ids, n);
		if (!r) {
			for (int j = 0; j < new_n; j++)
				stg[j] = start(cnew, "staged", j, from, old_n, 1);
			for (int j = 0; j < new_n; j++)
				wait_log("staged", j, "re-shard staged");
			if (replace_base) {
				kill(old[0], SIGUSR1);
				for (int t = 0; log_count("old", 0, "checkpoint (re-shard pre-copy) "
							  "written") < 2; t++) {
					ck_assert_msg(t < 600, "old shard 0 wrote no second pre-copy "
						      "within 60 s");
					tu_sleep_ms(100);
				}
			}
		}
		tu_sleep_ms(250);
	}
	ps_client_free(c);
	pstat_stop(cold, k);
	for (int j = 0; j < old_n; j++)
		ck_assert_int_eq(tu_wait_exit(old[j]), 0);
	/* the old files set aside, as the launcher does */
	set_aside(from, old_n, 1, &tombs, &changed);
	ck_assert_msg(tombs > 0, "the stop's increments dropped no id (expired and evicted rows)");
	ck_assert_msg(changed > 0, "the stop's increments changed no row");
	for (int j = 0; j < new_n; j++)
		kill(stg[j], SIGUSR1);
	for (int j = 0; j < new_n; j++)
		uns[j] = start(cnewu, "unstaged", j, from, old_n, 0);
	for (int j = 0; j < new_n; j++) {
		compare_twin(j, new_n);
		snprintf(a, sizeof(a), "%s/staged-%d.log", dir, j);
		ck_assert_msg(tu_log_says(a, "(same placement, staged)"), "%s: not staged", a);
		if (replace_base) {
			/* old shard 0's file is another than the one staged */
			ck_assert_msg(tu_log_says(a, "shard-0.ckpt is not the full checkpoint "
						  "staged (a newer one replaced it): loading it "
						    "whole"), "%s: the replaced base not loaded again", a);
			continue;
		}
		ck_assert_msg(tu_log_says(a, "the stop's changes applied to the rows merged"),
			      "%s: the stop's changes not applied to the merge", a);
		ck_assert_msg(!tu_log_says(a, "merging them again whole") &&
			      !tu_log_says(a, "cannot be brought up"), "%s: the staged merge was "
			      "given up", a);
	}
	/* the ids admitted after the pre-copies are on the new shards (the
	 * newest rows: the cap keeps them) */
	for (int i = 0; i < 30; i++) {
		int q = 0;
		while (q < nseen && seen[q] != id_of(20000 + i))
			q++;
		ck_assert_msg(q < nseen, "id %" PRIu64 ", admitted after the pre-copies, is on no "
			      "new shard", id_of(20000 + i));
	}
	if (new_n < old_n) {
		/* the merge dropped rows for the cap (its log says how many) */
		snprintf(a, sizeof(a), "%s/staged-0.log", dir);
		ck_assert_msg(tu_log_says(a, "least recently updated dropped"),
			      "%s: no rows dropped for the cap", a);
	}
	for (int j = 0; j < new_n; j++) {
		ck_assert_int_eq(tu_stop_server(stg[j]), 0);
		ck_assert_int_eq(tu_stop_server(uns[j]), 0);
	}
	cleanup_dirs();
}

START_TEST(test_staged_2_3)
{
	run_staged(2, 3, 0);
}
END_TEST

START_TEST(test_staged_base_replaced)
{
	run_staged(2, 3, 1);
}
END_TEST

/* The 2 old shards of cold started (pids in old), the 100 ids of ids
 * admitted by worker 0's two clocks (*k the next clock), then their
 * pre-copies written (SIGUSR1): that worker's client. */
static struct ps_client *old_precopied(pid_t *old, uint64_t *ids, uint64_t *k)
{
	struct ps_client *c;

	for (int j = 0; j < 2; j++)
		old[j] = start(cold, "old", j, NULL, 0, 0);
	c = connect_retry(0);
	for (int i = 0; i < 100; i++)
		ids[i] = id_of(i);
	clock_push(c, (*k)++, ids, 100); /* counted once */
	clock_push(c, (*k)++, ids, 100); /* admitted */
	for (int j = 0; j < 2; j++)
		kill(old[j], SIGUSR1);
	for (int j = 0; j < 2; j++)
		wait_log("old", j, "checkpoint (re-shard pre-copy) written");
	return c;
}

/* The end of a 2 -> 3 staged re-shard whose old shards (old) wrote their
 * pre-copies: the new shards stage on ck; a second later (the rows' stamps
 * are whole seconds) worker c pushes the one row id at clock k and leaves;
 * ps-stat stops the old shards, whose stop's increment (delta-(ndelta), the
 * last) changes that row alone; the files set aside, the staged shards go
 * on and as many start unstaged from the same files: each staged shard's
 * first checkpoint equals its twin's, the stop's changes applied to its
 * merge. All shards stopped. */
static void stage_one_change(struct ps_client *c, uint64_t k, uint64_t id, const pid_t *old,
			     int ndelta)
{
	pid_t stg[3], uns[3];
	char from[200], a[300];
	uint64_t tombs = 0, changed = 0;

	snprintf(from, sizeof(from), "%s/from", ck);
	ck_assert_int_eq(mkdir(from, 0700), 0);
	for (int j = 0; j < 3; j++)
		stg[j] = start(cnew, "staged", j, from, 2, 1);
	for (int j = 0; j < 3; j++)
		wait_log("staged", j, "re-shard staged");
	tu_sleep_ms(1100);
	clock_push(c, k++, &id, 1);
	ps_client_free(c);
	pstat_stop(cold, k);
	for (int j = 0; j < 2; j++)
		ck_assert_int_eq(tu_wait_exit(old[j]), 0);
	set_aside(from, 2, ndelta, &tombs, &changed);
	ck_assert_msg(changed == 1, "the stop's increments changed %" PRIu64 " rows, 1 due",
		      changed);
	for (int j = 0; j < 3; j++)
		kill(stg[j], SIGUSR1);
	for (int j = 0; j < 3; j++)
		uns[j] = start(cnewu, "unstaged", j, from, 2, 0);
	for (int j = 0; j < 3; j++) {
		compare_twin(j, 3);
		snprintf(a, sizeof(a), "%s/staged-%d.log", dir, j);
		ck_assert_msg(tu_log_says(a, "the stop's changes applied to the rows merged"),
			      "%s: the stop's changes not applied to the merge", a);
	}
	for (int j = 0; j < 3; j++) {
		ck_assert_int_eq(tu_stop_server(stg[j]), 0);
		ck_assert_int_eq(tu_stop_server(uns[j]), 0);
	}
}

/* One row changed between the pre-copies and the stop, nothing else: on
 * the new shard that owns it the stop's changes are a run of one row,
 * the edge of the merge's reordering (the merged rows newer than the
 * oldest changed one go back among the changed ones); the staged result
 * must still equal its unstaged twin. */
START_TEST(test_staged_one_change)
{
	static uint64_t ids[100];
	pid_t old[2];
	struct ps_client *c;
	uint64_t k = 0;

	setup_dirs();
	nseen = 0;
	write_cfgs(2, 3);
	c = old_precopied(old, ids, &k);
	stage_one_change(c, k, id_of(7), old, 1);
	cleanup_dirs();
}
END_TEST

/* Old shards with checkpoint.incremental write incremental checkpoints on
 * request after the pre-copy: delta-1 (30 rows changed) and delta-2 (30
 * ids admitted) are in the folder when the new shards stage, and the
 * stop's is delta-3 (one row). The staged shards load the pre-copy and
 * both before the commit, delta-3 after it, and each equals its unstaged
 * twin, which loads the chain whole. */
START_TEST(test_staged_after_deltas)
{
	static uint64_t ids[100], more[30];
	pid_t old[2];
	char a[300];
	struct ps_client *c;
	struct ps_shard_stats st;
	uint64_t k = 0;

	setup_dirs();
	nseen = 0;
	ck_extra = "  on_request: true\n  min_interval_s: 0\n  incremental: 10\n";
	write_cfgs(2, 3);
	ck_extra = "";
	c = old_precopied(old, ids, &k);
	for (int i = 0; i < 30; i++)
		more[i] = id_of(1000 + i);
	for (int d = 1; d <= 2; d++) {
		if (d == 1) {
			clock_push(c, k++, ids, 30);
		} else {
			clock_push(c, k++, more, 30);
			clock_push(c, k++, more, 30);
		}
		for (int j = 0; j < 2; j++) {
			ck_assert_msg(ps_client_checkpoint(c, j, 1, &st) == 0 &&
				      st.checkpoint_status == 0, "old shard %d: %s %s", j,
				      ps_client_error(c), st.checkpoint_error);
			snprintf(a, sizeof(a), "%s/shard-%d.ckpt.delta-%d", ck, j, d);
			ck_assert_msg(access(a, F_OK) == 0, "%s: not written", a);
		}
	}
	stage_one_change(c, k, id_of(7), old, 3);
	/* every id admitted after the pre-copy is on a new shard */
	for (int i = 0; i < 30; i++) {
		int q = 0;
		while (q < nseen && seen[q] != more[i])
			q++;
		ck_assert_msg(q < nseen, "id %" PRIu64 ", admitted after the pre-copy (delta-2), is "
			      "on no new shard", more[i]);
	}
	cleanup_dirs();
}
END_TEST

/* A staged shard refuses to stage for a process that is not its parent
 * or under a replicated config, and stops on SIGTERM or SIGINT before the
 * commit; each way it writes nothing into the checkpoint folder and says
 * why. */
START_TEST(test_staged_refusals)
{
	char from[200], pid1[16], log[200], a[300];
	pid_t old, stg;
	struct ps_client *c;
	uint64_t ids[16];
	int st;

	setup_dirs();
	write_cfgs(1, 2);
	old = start(cold, "old", 0, NULL, 0, 0);
	c = connect_retry(0);
	for (int i = 0; i < 16; i++)
		ids[i] = id_of(i);
	clock_push(c, 0, ids, 16);
	clock_push(c, 1, ids, 16);
	kill(old, SIGUSR1);
	wait_log("old", 0, "checkpoint (re-shard pre-copy) written");
	snprintf(from, sizeof(from), "%s/from", ck);
	ck_assert_int_eq(mkdir(from, 0700), 0);

	/* this test's parent, a process that runs but is not the launcher */
	snprintf(pid1, sizeof(pid1), "%d", (int)getppid());
	snprintf(log, sizeof(log), "%s/notparent-1.log", dir);
	const char *argv[] = { "bin/ps-server", "--config", cnew, "--shard", "1", "--reshard-from",
			       from, "--reshard-shards", "1", "--reshard-stage", pid1, NULL };
	stg = tu_spawn(argv, log);
	st = tu_wait_exit(stg);
	ck_assert_msg(st != 0, "a shard staged for pid %s exited 0", pid1);
	snprintf(a, sizeof(a), "--reshard-stage %s: that process, which must be this shard's "
		 "parent (the launcher), is not: gone already?", pid1);
	ck_assert_msg(tu_log_says(log, a), "%s: the refusal does not say the launcher is not "
		      "its parent", log);

	/* SIGTERM, then SIGINT, before the commit: each named */
	static const struct { const char *name, *sig_name; int sig; } stop[] = {
		{ "staged", "SIGTERM", SIGTERM }, { "staged-int", "SIGINT", SIGINT } };
	for (int i = 0; i < 2; i++) {
		char said[200];
		stg = start(cnew, stop[i].name, 1, from, 1, 1);
		wait_log(stop[i].name, 1, "re-shard staged");
		kill(stg, stop[i].sig);
		st = tu_wait_exit(stg);
		ck_assert_msg(st != 0, "a staged shard stopped by %s before the commit exited 0",
			      stop[i].sig_name);
		snprintf(said, sizeof(said), "%s came before the re-shard's commit: a staged shard "
			 "writes nothing; stopping", stop[i].sig_name);
		wait_log(stop[i].name, 1, said);
	}
	/* a re-shard's start that cannot read what lies at its own checkpoint's
	 * path (here a symbolic link, which checkpoints are never read through)
	 * refuses to start, naming it, instead of re-sharding over it */
	{
		char link[200], llog[200], want[400];
		snprintf(link, sizeof(link), "%s/shard-1.ckpt", ck);
		ck_assert_int_eq(symlink("/nonexistent-ps-target", link), 0);
		snprintf(llog, sizeof(llog), "%s/linked-1.log", dir);
		const char *largv[] = { "bin/ps-server", "--config", cnew, "--shard", "1",
					"--reshard-from", from, "--reshard-shards", "1", NULL };
		st = tu_wait_exit(tu_spawn(largv, llog));
		ck_assert_msg(st == 1, "a re-shard over a symbolic link exited %d", st);
		snprintf(want, sizeof(want), "refusing to start: %s: cannot read: %s", link,
			 strerror(ELOOP));
		ck_assert_msg(tu_log_says(llog, want), "%s: no '%s'", llog, want);
		ck_assert_int_eq(unlink(link), 0);
	}
	const char *mine[] = { "shard-1.ckpt", "shard-1.reshard", "shard-1.members" };
	for (int q = 0; q < 3; q++) {
		snprintf(a, sizeof(a), "%s/%s", ck, mine[q]);
		ck_assert_msg(access(a, F_OK) != 0, "%s: written by a staged shard that stopped "
			      "before the commit", a);
	}
	/* a replicated config: not staged, saying so (the same files, the
	 * new config with a backup for each shard) */
	{
		char yaml[4096], rcfg[160], rlog[200], *p;
		FILE *f = fopen(cnew, "r");
		size_t k = fread(yaml, 1, sizeof(yaml) - 200, f);
		fclose(f);
		yaml[k] = 0;
		ck_assert_ptr_nonnull(p = strstr(yaml, "  workers: 1\n"));
		char tail[4096];
		snprintf(tail, sizeof(tail), "%s", p);
		snprintf(p, sizeof(yaml) - (size_t)(p - yaml), "  backups: [127.0.0.1:%d, "
			 "127.0.0.1:%d]\n  replicas: 1\n%s", tu_free_port(), tu_free_port(), tail);
		tu_write_named(dir, "newrepl", yaml, rcfg, sizeof(rcfg));
		snprintf(rlog, sizeof(rlog), "%s/newrepl-1.log", dir);
		const char *rargv[] = { "bin/ps-server", "--config", rcfg, "--shard", "1",
					"--replica", "0", "--log-level", "info", "--reshard-from", from,
					"--reshard-shards", "1", "--reshard-stage", pid1, NULL };
		snprintf(pid1, sizeof(pid1), "%d", (int)getpid());
		stg = tu_spawn(rargv, rlog);
		st = tu_wait_exit(stg);
		ck_assert_msg(st != 0, "a staged shard of a replicated config exited 0");
		ck_assert_msg(tu_log_says(rlog, "--reshard-stage: a staged re-shard is not built "
					  "with cluster.replicas: 1 (start without it)"),
			      "%s: the refusal does not name cluster.replicas", rlog);
	}
	/* the old shard went on serving */
	clock_push(c, 2, ids, 16);
	ps_client_free(c);
	ck_assert_int_eq(tu_stop_server(old), 0);
	cleanup_dirs();
}
END_TEST

/* The pre-copy (SIGUSR1) is not taken where a staged re-shard cannot be
 * built: each refusal in the shard's log names the reason, no pre-copy
 * checkpoint is begun, and the shard stops cleanly after. */
START_TEST(test_precopy_refusals)
{
	static const struct {
		const char *name, *body, *why;
	} c[] = {
		{ "nockpt",
		  "model:\n  tensors:\n    - {name: a, shape: [16]}\n"
		  "  embeddings:\n    - {name: e, dim: 4}\n",
		  "checkpoints are off (no checkpoint.dir)" },
		{ "notables",
		  "model:\n  tensors:\n    - {name: a, shape: [16]}\ncheckpoint:\n  dir: %s\n",
		  "the shard has no embedding table (its dense state is written whole at the "
		  "stop anyway)" },
		{ "declared",
		  "model:\n  embeddings:\n    - {name: e, dim: 4}\ncheckpoint:\n  dir: %s\n",
		  "tensors or tables declared at run time: a staged re-shard is not built for "
		  "them" },
		{ "pair",
		  "model:\n  tensors:\n    - {name: a, shape: [16]}\n"
		  "  embeddings:\n    - {name: e, dim: 4}\ncheckpoint:\n  dir: %s\n",
		  "a staged re-shard is not built with cluster.replicas: 1" },
	};

	setup_dirs();
	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		char yaml[1024], body[512], conf[160], log[200], want[300];
		int pair = !strcmp(c[i].name, "pair");
		int p0 = tu_free_port(), p1 = tu_free_port();

		char ckd[200]; /* a folder of its own: each shard writes a checkpoint at its stop */
		snprintf(ckd, sizeof(ckd), "%s/%s", dir, c[i].name);
		ck_assert_int_eq(mkdir(ckd, 0700), 0);
		snprintf(body, sizeof(body), c[i].body, ckd);
		snprintf(yaml, sizeof(yaml),
			 "cluster:\n  servers: [127.0.0.1:%d]\n%s  workers: 1\n%s"
			 "security:\n  auth: false\nlog:\n  level: info\n",
			 p0, pair ? "  backups: [127.0.0.1:0]\n  replicas: 1\n" : "", body);
		if (pair) { /* the backup's port: never started */
			char *b = strstr(yaml, "127.0.0.1:0]");
			char tail[1024];
			snprintf(tail, sizeof(tail), "%s", b + strlen("127.0.0.1:0]"));
			snprintf(b, sizeof(yaml) - (size_t)(b - yaml), "127.0.0.1:%d]%s", p1, tail);
		}
		tu_write_named(dir, c[i].name, yaml, conf, sizeof(conf));
		snprintf(log, sizeof(log), "%s/%s-0.log", dir, c[i].name);
		const char *argv[] = { "bin/ps-server", "--config", conf, "--shard", "0",
				       "--log-level", "info", pair ? "--replica" : NULL, "0", NULL };
		pid_t pid = tu_spawn(argv, log);
		wait_log(c[i].name, 0, pair ? "replica 0" : "listening on");
		kill(pid, SIGUSR1);
		snprintf(want, sizeof(want), "re-shard pre-copy (SIGUSR1) not taken: %s", c[i].why);
		wait_log(c[i].name, 0, want);
		ck_assert_msg(!tu_log_says(log, "checkpoint (re-shard pre-copy)"),
			      "%s: a pre-copy was started after all", log);
		ck_assert_int_eq(tu_stop_server(pid), 0);
	}
	cleanup_dirs();
}
END_TEST

/* the new shards hold more rows than the cap: the merge drops the oldest */
START_TEST(test_staged_3_2)
{
	run_staged(3, 2, 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("reshard_staged");
	TCase *tc = tcase_create("staged");

	tcase_set_timeout(tc, 120);
	TU_ADD(tc, test_staged_2_3);
	TU_ADD(tc, test_staged_3_2);
	TU_ADD(tc, test_staged_base_replaced);
	TU_ADD(tc, test_staged_refusals);
	TU_ADD(tc, test_precopy_refusals);
	TU_ADD(tc, test_staged_one_change);
	TU_ADD(tc, test_staged_after_deltas);
	suite_add_tcase(s, tc);
	return tu_run_suite(s);
}
