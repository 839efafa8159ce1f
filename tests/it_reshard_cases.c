/* it_reshard_cases.c - re-sharding by restart (docs/elastic.md) in the
 * modes it_reshard does not cover, with real processes:
 *
 *  - replicated shards (cluster.replicas: 1), sync, two workers, integer
 *    gradients: 2 pairs train; old pair 1's replica 0 writes a checkpoint
 *    at clock 2 and is killed -9, its backup takes over and serves clocks
 *    2 and 3; every process stops. Without either file of old pair 1 a
 *    new process refuses, naming both. 3 new pairs start from the old
 *    files (each new process from them): the newer of old pair 1's two files is
 *    taken (the stale one would be refused as of another clock), the new
 *    pairs form, the workers resume at clock 4 with the exact sums; a
 *    kill -9 of a new primary then loses nothing, and the killed process,
 *    started again, joins with the primary's checksum;
 *  - async, two worker processes stopping at different clocks (6 and 9
 *    pushes) with dense and row pushes: 2 -> 3 shards, each worker goes on
 *    at its own clock, and every weight and row is its initial value minus
 *    the exact sum of the acknowledged pushes;
 *  - embedding tables declared by the worker at run time (none in the
 *    config): 2 -> 3 shards, the worker declares them again and is acked,
 *    each new shard holds exactly the rows its hash names, the rows are
 *    the exact sums, and ids seen once before the re-shard (admission 2)
 *    get their row at their second push after it.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include "config.h"
#include "ps_client.h"
#include "ps_err.h"
#include "rows_wire.h"
#define RESHARD_TMPDIR "/tmp/ps-reshard-c-XXXXXX"
#include "test_replica.h"
#include "test_reshard.h"
#include "test_util.h"

#define NA 3000
#define NIDS 200
#define DIM 4
#define NW 2

/* What write_cfg writes besides the servers. */
struct mode {
	int replicas;   /* cluster.replicas: 1, backups at fresh ports */
	int async;
	int nworkers;
	int table;      /* model.embeddings: e (dim DIM, zeros, sgd lr 1) */
};

/* The config of an n-shard cluster (fresh ports) at path. */
static void write_cfg(int n, const struct mode *m)
{
	char yaml[4096], servers[512] = "", backups[512] = "";
	int last = 0;

	for (int k = 0, o = 0, b = 0; k < n; k++) {
		int p = m->replicas ? tu_low_free_port(last) : tu_free_port();
		o += snprintf(servers + o, sizeof(servers) - (size_t)o, "%s%s:%d", k ? ", " : "",
			      tu_host(), p);
		last = p;
		if (m->replicas) {
			p = tu_low_free_port(last);
			b += snprintf(backups + b, sizeof(backups) - (size_t)b, "%s%s:%d",
				      k ? ", " : "", tu_host(), p);
			last = p;
		}
	}
	snprintf(yaml, sizeof(yaml),
		 "%scluster:\n  servers: [%s]\n%s%s%s  workers: %d\n"
		 "%s"
		 "consistency:\n  mode: %s\n"
		 "slice_bytes: 1024\nseed: 9\n"
		 "optimizer:\n  name: sgd\n  lr: 1\n"
		 "limits:\n  idle_timeout_ms: 1500\n  drop_timeout_ms: 600000\n"
		 "  connect_timeout_ms: 2000\n  reconnect_timeout_ms: 60000\n"
		 "  request_timeout_ms: 60000\n"
		 "model:\n  tensors:\n    - {name: a, shape: [%d], init: arange}\n%s"
		 "checkpoint:\n  dir: %s\n  every_s: 0\n  on_request: true\n  min_interval_s: 0\n"
		 "log:\n  level: warn\n",
		 tu_transport_yaml(), servers, m->replicas ? "  backups: [" : "", backups,
		 m->replicas ? "]\n  replicas: 1\n" : "", m->nworkers,
		 m->replicas ? "replication:\n  timeout_ms: 1000\n" : "",
		 m->async ? "async" : "sync", NA,
		 m->table ? "  embeddings:\n    - {name: e, dim: 4, init: zeros, optimizer: sgd, "
			    "lr: 1}\n" : "", ck);
	write_config(yaml);
}

/* Process r (0, or 1: the backup) of shard k; with old (a folder)
 * re-sharding from old_n shards' checkpoints there. Its log:
 * dir/TAG-K-rR.log. */
static pid_t start_proc(const char *tag, int k, int r, const char *old, int old_n)
{
	char s[16], rs[16], n[16], log[160];
	const char *argv[16] = { "bin/ps-server", "--config", path, "--shard", s, "--log-level",
				 "info" };
	int a = 7;

	snprintf(s, sizeof(s), "%d", k);
	snprintf(rs, sizeof(rs), "%d", r);
	snprintf(n, sizeof(n), "%d", old_n);
	snprintf(log, sizeof(log), "%s/%s-%d-r%d.log", dir, tag, k, r);
	if (r) {
		argv[a++] = "--replica";
		argv[a++] = rs;
	}
	if (old) {
		argv[a++] = "--reshard-from";
		argv[a++] = old;
		argv[a++] = "--reshard-shards";
		argv[a++] = n;
	}
	argv[a] = NULL;
	return tu_spawn(argv, log);
}

/* A monitor client once each of the n shards answers it (they listen
 * after loading their checkpoints). */
static struct ps_client *monitor_up(int n)
{
	double t0 = ps_now_s();
	char err[512] = "";

	while (ps_now_s() - t0 < 60 * tu_time_scale()) {
		struct ps_client *mon = NULL;
		struct ps_shard_stats st;
		int up = 0;

		if (!ps_client_init(&mon, &cfg, -1, err, sizeof(err)))
			for (up = 0; up < n && !ps_client_stats(mon, up, &st); up++)
				;
		if (up == n)
			return mon;
		if (mon)
			ps_client_free(mon);
		tu_sleep_ms(100);
	}
	ck_abort_msg("the %d shards did not answer within 60 s: %s (logs in %s)", n, err, dir);
	return NULL;
}

/* Moves every shard-* file of ck into the fresh folder ck/name, as
 * ps-local.sh reshard does; to: that folder. */
static void move_old(const char *name, char *to, size_t len)
{
	char a[400], b[400];
	struct dirent *e;
	DIR *d;

	snprintf(to, len, "%s/%s", ck, name);
	ck_assert_int_eq(mkdir(to, 0700), 0);
	d = opendir(ck);
	ck_assert_ptr_nonnull(d);
	while ((e = readdir(d)))
		if (!strncmp(e->d_name, "shard-", 6)) {
			snprintf(a, sizeof(a), "%s/%s", ck, e->d_name);
			snprintf(b, sizeof(b), "%s/%s", to, e->d_name);
			ck_assert_msg(rename(a, b) == 0, "%s: %s", a, strerror(errno));
		}
	closedir(d);
}

/* Whether the file f holds text. */
static int file_has(const char *f, const char *text)
{
	static char buf[1 << 20];
	FILE *fp = fopen(f, "r");
	size_t n;

	if (!fp)
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, fp);
	fclose(fp);
	buf[n] = 0;
	return strstr(buf, text) != NULL;
}

/* Worker rank's integer gradient of clock, element i (dense), and of row
 * id's element j. */
static float grad(int rank, uint64_t clock, int i)
{
	return (float)((rank + 1) * ((int)((clock * 3 + (uint64_t)i) % 7) - 3));
}

static float row_grad(int rank, uint64_t clock, uint64_t id, int j)
{
	return (float)((rank + 1) * ((int)((clock + id + (uint64_t)j) % 5) - 2));
}

static uint64_t id_of(int i)
{
	return (uint64_t)i * 104729u + 3;
}

static void pull_a(struct ps_client *c, uint64_t version, float *w)
{
	struct ps_tensor t = { .name = "a", .data = w, .count = NA };
	int64_t id = ps_client_pull(c, version, &t, 1);

	ck_assert_msg(id > 0 && ps_client_wait(c, id) == 0, "pull: %s (logs in %s)",
		      ps_client_error(c), dir);
}

/* w == w0 minus the gradients of every worker at clocks [0, upto). */
static void check_sync_sums(const float *w0, const float *w, uint64_t upto, int nw)
{
	for (int i = 0; i < NA; i++) {
		double want = w0[i];
		for (uint64_t k = 0; k < upto; k++)
			for (int r = 0; r < nw; r++)
				want -= grad(r, k, i);
		ck_assert_msg((double)w[i] == want, "a[%d] = %g after %" PRIu64 " clocks, want %g "
			      "(logs in %s)", i, (double)w[i], upto, want, dir);
	}
}

/* Sync clocks [from, to) of both workers: each pushes, then both wait. */
static void sync_clocks(struct ps_client **c, uint64_t from, uint64_t to)
{
	static float g[NW][NA];

	for (uint64_t k = from; k < to; k++) {
		int64_t id[NW];
		for (int r = 0; r < NW; r++) {
			struct ps_tensor t = { .name = "a", .data = g[r], .count = NA };
			for (int i = 0; i < NA; i++)
				g[r][i] = grad(r, k, i);
			id[r] = ps_client_push(c[r], k, &t, 1, PS_PUSH_END_CLOCK);
			ck_assert_msg(id[r] > 0, "push %" PRIu64 ": %s", k, ps_client_error(c[r]));
		}
		for (int r = 0; r < NW; r++)
			ck_assert_msg(ps_client_wait(c[r], id[r]) == 0, "worker %d, clock %" PRIu64
				      ": %s (logs in %s)", r, k, ps_client_error(c[r]), dir);
	}
}

/* Until both processes of pair k report the same parameter checksum. */
static int pair_agrees(int k, double limit_s)
{
	double t0 = ps_now_s();

	while (ps_now_s() - t0 < limit_s * tu_time_scale()) {
		struct ps_shard_stats a, b;
		if (!tu_replica_stats(&cfg, k, 0, -1, &a) && !tu_replica_stats(&cfg, k, 1, -1, &b) &&
		    a.param_checksum == b.param_checksum && a.repl_lsn == b.repl_lsn)
			return 1;
		tu_sleep_ms(50);
	}
	return 0;
}

START_TEST(test_pairs_2_to_3)
{
	static float w0[NA], w[NA];
	const struct mode m = { .replicas = 1, .nworkers = NW };
	struct ps_client *c[NW];
	struct ps_shard_stats st;
	pid_t p[3][2];
	char old[300], f[400];
	struct stat sb;

	setup_dirs();
	write_cfg(2, &m);
	for (int k = 0; k < 2; k++)
		for (int r = 0; r < 2; r++)
			p[k][r] = start_proc("old", k, r, NULL, 0);
	ck_assert_msg(tu_replicas_healthy(&cfg, 2, 30) >= 0, "the 2 pairs did not form (logs in %s)",
		      dir);
	for (int r = 0; r < NW; r++)
		c[r] = connect_retry(r);
	pull_a(c[0], 0, w0);
	sync_clocks(c, 0, 2);
	/* old pair 1: replica 0 (the primary of a cold start) checkpoints at
	 * clock 2 and dies; its backup serves clocks 2 and 3 */
	ck_assert_int_eq(tu_replica_primary(&cfg, 1), 0);
	ck_assert_int_eq(tu_replica_stats(&cfg, 1, 0, 1, &st), 0);
	ck_assert_int_eq(st.checkpoint_status, 0);
	kill(p[1][0], SIGKILL);
	tu_wait_child(p[1][0]);
	p[1][0] = 0;
	sync_clocks(c, 2, 4);
	pull_a(c[0], 4, w);
	check_sync_sums(w0, w, 4, NW);
	for (int r = 0; r < NW; r++)
		ps_client_free(c[r]);
	for (int k = 0; k < 2; k++)
		for (int r = 0; r < 2; r++)
			if (p[k][r])
				ck_assert_msg(tu_stop_server(p[k][r]) == 0, "old shard %d r%d did not "
					      "stop cleanly (logs in %s)", k, r, dir);
	snprintf(f, sizeof(f), "%s/shard-1.ckpt", ck);
	ck_assert_msg(stat(f, &sb) == 0, "%s: the killed process's checkpoint of clock 2", f);
	move_old("from2", old, sizeof(old));

	/* 3 pairs, each process from the old files */
	write_cfg(3, &m);
	{
		/* neither file of old pair 1: refused, naming both */
		char a[2][400], b[2][400];
		for (int r = 0; r < 2; r++) {
			snprintf(a[r], sizeof(a[r]), "%s/shard-1%s.ckpt", old, r ? "-r1" : "");
			snprintf(b[r], sizeof(b[r]), "%s/aside-%d", dir, r);
			ck_assert_int_eq(rename(a[r], b[r]), 0);
		}
		pid_t q = start_proc("refused", 0, 1, old, 2);
		ck_assert_int_ne(tu_wait_child(q), 0);
		snprintf(f, sizeof(f), "%s/refused-0-r1.log", dir);
		ck_assert_msg(file_has(f, "shard-1.ckpt is missing, and so is") &&
			      file_has(f, "shard-1-r1.ckpt: re-sharding from 2 pairs"),
			      "%s: no refusal naming both files of old pair 1", f);
		for (int r = 0; r < 2; r++)
			ck_assert_int_eq(rename(b[r], a[r]), 0);
		/* replica 0's file alone (the backup's set aside): it is the one
		 * read, and it is of clock 2, the other pair's of 4: refused,
		 * saying so */
		ck_assert_int_eq(rename(a[1], b[1]), 0);
		q = start_proc("only0", 2, 1, old, 2);
		ck_assert_int_ne(tu_wait_child(q), 0);
		snprintf(f, sizeof(f), "%s/only0-2-r1.log", dir);
		char want[600];
		snprintf(want, sizeof(want), "%s: worker 0 finished clock 2 there, 4 in ", a[0]);
		ck_assert_msg(file_has(f, want) && !file_has(f, "only replica 1"),
			      "%s: old pair 1's replica 0 file alone not the one read ('%s' due)", f,
			      want);
		ck_assert_int_eq(rename(b[1], a[1]), 0);
	}
	for (int k = 0; k < 3; k++)
		for (int r = 0; r < 2; r++)
			p[k][r] = start_proc("new", k, r, old, 2);
	ck_assert_msg(tu_replicas_healthy(&cfg, 3, 60) >= 0, "the 3 new pairs did not form "
		      "(logs in %s)", dir);
	{
		char took[400];
		snprintf(f, sizeof(f), "%s/new-2-r1.log", dir);
		snprintf(took, sizeof(took), "taking %s/shard-1-r1.ckpt", old);
		ck_assert_msg(file_has(f, took) && file_has(f, "re-sharded from 2 to 3"),
			      "%s does not say it took old pair 1's backup's file and re-sharded",
			      f);
	}
	for (int k = 0; k < 3; k++) {
		snprintf(f, sizeof(f), "%s/shard-%d-r1.ckpt", ck, k);
		ck_assert_msg(stat(f, &sb) == 0, "%s: new backup %d wrote no checkpoint", f, k);
		/* each process says why it wrote it, naming the file */
		for (int r = 0; r < 2; r++) {
			char log[200], said[300];
			snprintf(log, sizeof(log), "%s/new-%d-r%d.log", dir, k, r);
			snprintf(said, sizeof(said), "checkpoint (re-shard): %s/shard-%d%s.ckpt", ck,
				 k, r ? "-r1" : "");
			ck_assert_msg(file_has(log, said), "%s: no '%s'", log, said);
		}
	}
	for (int r = 0; r < NW; r++) {
		c[r] = connect_retry(r);
		ck_assert_uint_eq(ps_client_clock(c[r]), 4);
	}
	pull_a(c[0], 4, w);
	check_sync_sums(w0, w, 4, NW);
	sync_clocks(c, 4, 6);
	pull_a(c[0], 6, w);
	check_sync_sums(w0, w, 6, NW);
	/* a new primary killed -9: its backup takes over, nothing lost */
	int pk = tu_replica_primary(&cfg, 2);
	ck_assert_int_ge(pk, 0);
	kill(p[2][pk], SIGKILL);
	tu_wait_child(p[2][pk]);
	sync_clocks(c, 6, 8);
	pull_a(c[1], 8, w);
	check_sync_sums(w0, w, 8, NW);
	/* started again with the same command: it resumes from its own file
	 * of the new map and joins, taking the primary's state */
	p[2][pk] = start_proc("again", 2, pk, old, 2);
	ck_assert_msg(tu_replicas_healthy(&cfg, 3, 30) >= 0, "pair 2 did not form again (logs in "
		      "%s)", dir);
	ck_assert_msg(pair_agrees(2, 10), "pair 2's processes hold different parameters (logs in "
		      "%s)", dir);
	snprintf(f, sizeof(f), "%s/again-2-r%d.log", dir, pk);
	ck_assert_msg(file_has(f, "resuming from it"), "%s: not resumed from its own checkpoint",
		      f);
	sync_clocks(c, 8, 9);
	pull_a(c[0], 9, w);
	check_sync_sums(w0, w, 9, NW);
	for (int r = 0; r < NW; r++)
		ps_client_free(c[r]);
	for (int k = 0; k < 3; k++)
		for (int r = 0; r < 2; r++)
			ck_assert_msg(tu_stop_server(p[k][r]) == 0, "new shard %d r%d did not stop "
				      "cleanly (logs in %s)", k, r, dir);
	cleanup_dirs();
}
END_TEST

/* ---- async ---- */

/* A worker process: n pushes (rows of table e, then the dense tensor
 * ending the clock) from clock `from`, each waited for. Exit status 0
 * when every one was acknowledged. */
static int async_worker(int rank, uint64_t from, int n)
{
	static float g[NA], gr[NIDS * DIM];
	static uint64_t ids[NIDS];
	struct ps_tensor t = { .name = "a", .data = g, .count = NA };
	struct ps_client *c = NULL;
	char err[512];
	int rc = -1;

	for (int i = 0; i < 300 && rc; i++) {
		rc = ps_client_init(&c, &cfg, rank, err, sizeof(err));
		if (rc)
			tu_sleep_ms(100);
	}
	if (rc) {
		fprintf(stderr, "worker %d: %s\n", rank, err);
		return 2;
	}
	if (ps_client_clock(c) > from) {
		fprintf(stderr, "worker %d: the shards continue at clock %" PRIu64 ", it at %" PRIu64
			"\n", rank, ps_client_clock(c), from);
		return 3;
	}
	for (int i = 0; i < NIDS; i++)
		ids[i] = id_of(i);
	for (uint64_t k = from; k < from + (uint64_t)n; k++) {
		for (int i = 0; i < NA; i++)
			g[i] = grad(rank, k, i);
		for (int i = 0; i < NIDS; i++)
			for (int j = 0; j < DIM; j++)
				gr[i * DIM + j] = row_grad(rank, k, ids[i], j);
		if (ps_client_push_rows(c, "e", k, ids, NIDS, gr, 0)) {
			fprintf(stderr, "worker %d push_rows %" PRIu64 ": %s\n", rank, k,
				ps_client_error(c));
			return 4;
		}
		int64_t id = ps_client_push(c, k, &t, 1, PS_PUSH_END_CLOCK);
		if (id <= 0 || ps_client_wait(c, id)) {
			fprintf(stderr, "worker %d push %" PRIu64 ": %s\n", rank, k, ps_client_error(c));
			return 5;
		}
	}
	ps_client_free(c);
	return 0;
}

/* Both workers as processes of their own, side by side: rank r pushes
 * n[r] times from clock from[r]. */
static void run_async(const uint64_t *from, const int *n)
{
	pid_t w[NW];

	for (int r = 0; r < NW; r++) {
		w[r] = fork();
		ck_assert_int_ge(w[r], 0);
		if (w[r] == 0)
			_exit(async_worker(r, from[r], n[r]));
	}
	for (int r = 0; r < NW; r++)
		ck_assert_msg(tu_wait_child(w[r]) == 0, "async worker %d failed (its stderr above; "
			      "logs in %s)", r, dir);
}

/* Every weight of a and every row of e: the initial value minus each
 * worker's pushes at clocks [0, upto[r]). */
static void check_async_sums(struct ps_client *c, const float *w0, const uint64_t *upto)
{
	static float w[NA], rows[NIDS * DIM];
	static uint64_t ids[NIDS];

	pull_a(c, 0, w);
	for (int i = 0; i < NA; i++) {
		double want = w0[i];
		for (int r = 0; r < NW; r++)
			for (uint64_t k = 0; k < upto[r]; k++)
				want -= grad(r, k, i);
		ck_assert_msg((double)w[i] == want, "a[%d] = %g, want %g (logs in %s)", i,
			      (double)w[i], want, dir);
	}
	for (int i = 0; i < NIDS; i++)
		ids[i] = id_of(i);
	ck_assert_msg(ps_client_pull_rows(c, "e", 0, ids, NIDS, rows) == 0, "pull_rows: %s",
		      ps_client_error(c));
	for (int i = 0; i < NIDS; i++)
		for (int j = 0; j < DIM; j++) {
			double want = 0;
			for (int r = 0; r < NW; r++)
				for (uint64_t k = 0; k < upto[r]; k++)
					want -= row_grad(r, k, ids[i], j);
			ck_assert_msg((double)rows[i * DIM + j] == want, "row %" PRIu64 "[%d] = %g, "
				      "want %g (logs in %s)", ids[i], j, (double)rows[i * DIM + j],
				      want, dir);
		}
}

START_TEST(test_async_2_to_3)
{
	static float w0[NA];
	const struct mode m = { .async = 1, .nworkers = NW, .table = 1 };
	const uint64_t from1[NW] = { 0, 0 }, at[NW] = { 6, 9 }, end[NW] = { 11, 14 };
	const int n1[NW] = { 6, 9 }, n2[NW] = { 5, 5 };
	struct ps_client *mon = NULL;
	pid_t p[3];
	char old[300];

	setup_dirs();
	write_cfg(2, &m);
	for (int k = 0; k < 2; k++)
		p[k] = start_proc("old", k, 0, NULL, 0);
	/* the initial weights, read by a monitor before any push */
	mon = monitor_up(2);
	pull_a(mon, 0, w0);
	ps_client_free(mon);
	run_async(from1, n1);
	for (int k = 0; k < 2; k++)
		ck_assert_int_eq(tu_stop_server(p[k]), 0);
	move_old("from2", old, sizeof(old));

	write_cfg(3, &m);
	for (int k = 0; k < 3; k++)
		p[k] = start_proc("new", k, 0, old, 2);
	mon = monitor_up(3);
	check_async_sums(mon, w0, at);
	for (int k = 0; k < 3; k++) {
		struct ps_shard_stats st;
		ck_assert_int_eq(ps_client_stats(mon, k, &st), 0);
		for (int r = 0; r < NW; r++)
			ck_assert_msg(st.worker_clock[r] == at[r], "new shard %d: worker %d finished "
				      "clock %" PRIu64 ", %" PRIu64 " before the re-shard", k, r,
				      st.worker_clock[r], at[r]);
	}
	ps_client_free(mon);
	run_async(at, n2);
	mon = monitor_up(3);
	check_async_sums(mon, w0, end);
	ps_client_free(mon);
	for (int k = 0; k < 3; k++)
		ck_assert_int_eq(tu_stop_server(p[k]), 0);
	cleanup_dirs();
}
END_TEST

/* ---- tables declared at run time ---- */

#define NDT 2
static struct ps_table_decl dt[NDT];

static void decl_init(void)
{
	memset(dt, 0, sizeof(dt));
	dt[0] = (struct ps_table_decl){ .name = "d", .dim = DIM, .init = "zeros",
					.optimizer = "sgd", .lr = 1.0f };
	dt[1] = (struct ps_table_decl){ .name = "f", .dim = DIM, .init = "zeros",
					.optimizer = "sgd", .lr = 1.0f, .admission = 2 };
}

/* Clocks [from, to) of one worker: rows of d (every id), at clock 0 rows
 * of f for the ids NIDS/2.. (seen once), and the dense tensor. */
static void decl_clocks(struct ps_client *c, uint64_t from, uint64_t to)
{
	static float g[NA], gr[NIDS * DIM];
	static uint64_t ids[NIDS];
	struct ps_tensor t = { .name = "a", .data = g, .count = NA };

	for (int i = 0; i < NIDS; i++)
		ids[i] = id_of(i);
	for (uint64_t k = from; k < to; k++) {
		for (int i = 0; i < NA; i++)
			g[i] = grad(0, k, i);
		for (int i = 0; i < NIDS; i++)
			for (int j = 0; j < DIM; j++)
				gr[i * DIM + j] = row_grad(0, k, ids[i], j);
		ck_assert_msg(ps_client_push_rows(c, "d", k, ids, NIDS, gr, 0) == 0, "push d: %s",
			      ps_client_error(c));
		if (k == 0)
			ck_assert_msg(ps_client_push_rows(c, "f", k, ids + NIDS / 2, NIDS / 2,
							  gr, 0) == 0, "push f: %s",
				      ps_client_error(c));
		int64_t id = ps_client_push(c, k, &t, 1, PS_PUSH_END_CLOCK);
		ck_assert_msg(id > 0 && ps_client_wait(c, id) == 0, "push %" PRIu64 ": %s", k,
			      ps_client_error(c));
	}
}

/* Table d's rows: minus the sum of clocks [0, upto)'s gradients. */
static void check_d(struct ps_client *c, uint64_t upto)
{
	static float rows[NIDS * DIM];
	static uint64_t ids[NIDS];

	for (int i = 0; i < NIDS; i++)
		ids[i] = id_of(i);
	ck_assert_msg(ps_client_pull_rows(c, "d", upto, ids, NIDS, rows) == 0, "pull d: %s",
		      ps_client_error(c));
	for (int i = 0; i < NIDS; i++)
		for (int j = 0; j < DIM; j++) {
			double want = 0;
			for (uint64_t k = 0; k < upto; k++)
				want -= row_grad(0, k, ids[i], j);
			ck_assert_msg((double)rows[i * DIM + j] == want, "d row %" PRIu64 "[%d] = %g "
				      "after %" PRIu64 " clocks, want %g", ids[i], j,
				      (double)rows[i * DIM + j], upto, want);
		}
}

START_TEST(test_declared_tables_2_to_3)
{
	const struct mode m = { .nworkers = 1 };
	static float got[NIDS * DIM], g1[NIDS * DIM];
	static uint64_t ids[NIDS];
	struct ps_client *c;
	pid_t p[3];
	char old[300];

	decl_init();
	setup_dirs();
	write_cfg(2, &m);
	for (int k = 0; k < 2; k++)
		p[k] = start_proc("old", k, 0, NULL, 0);
	c = connect_retry(0);
	ck_assert_msg(ps_client_declare_tables(c, dt, NDT) == 0, "declare: %s", ps_client_error(c));
	decl_clocks(c, 0, 4);
	check_d(c, 4);
	ps_client_free(c);
	for (int k = 0; k < 2; k++)
		ck_assert_int_eq(tu_stop_server(p[k]), 0);
	move_old("from2", old, sizeof(old));

	write_cfg(3, &m);
	for (int k = 0; k < 3; k++)
		p[k] = start_proc("new", k, 0, old, 2);
	c = connect_retry(0);
	ck_assert_uint_eq(ps_client_clock(c), 4);
	ck_assert_msg(ps_client_declare_tables(c, dt, NDT) == 0, "declare again after the "
		      "re-shard: %s", ps_client_error(c));
	check_d(c, 4);
	/* each new shard holds exactly the rows of d its hash names */
	{
		const struct ps_config *cc = ps_client_config(c);
		int td = -1;
		for (int t = 0; t < cc->ntables; t++)
			if (!strcmp(cc->tables[t].name, "d"))
				td = t;
		ck_assert_int_ge(td, 0);
		uint64_t tkey = ps_rows_table_key(&cc->tables[td]);
		for (int k = 0; k < 3; k++) {
			struct ps_shard_stats st;
			uint64_t want = 0, have = UINT64_MAX;
			for (int i = 0; i < NIDS; i++)
				want += ps_rows_shard(tkey, id_of(i), 3) == k;
			ck_assert_int_eq(ps_client_stats(c, k, &st), 0);
			for (int t = 0; t < PS_STATS_MAX_TABLES; t++)
				if (!strcmp(st.tables[t].name, "d"))
					have = st.tables[t].rows;
			ck_assert_msg(have == want, "new shard %d holds %" PRIu64 " rows of d, its "
				      "hash names %" PRIu64, k, have, want);
			ck_assert_uint_gt(want, 0);
		}
	}
	decl_clocks(c, 4, 6);
	check_d(c, 6);
	/* the ids f saw once before the re-shard: a second push admits them */
	for (int i = 0; i < NIDS; i++)
		ids[i] = id_of(i);
	for (int i = 0; i < NIDS / 2 * DIM; i++)
		g1[i] = 1.0f;
	ck_assert_msg(ps_client_pull_rows(c, "f", 6, ids + NIDS / 2, NIDS / 2, got) == 0, "%s",
		      ps_client_error(c));
	for (int i = 0; i < NIDS / 2 * DIM; i++)
		ck_assert_msg(got[i] == 0.0f, "f: id %" PRIu64 " has a row after one push",
			      ids[NIDS / 2 + i / DIM]);
	ck_assert_msg(ps_client_push_rows(c, "f", 6, ids + NIDS / 2, NIDS / 2, g1, 0) == 0, "%s",
		      ps_client_error(c));
	decl_clocks(c, 6, 7);
	ck_assert_msg(ps_client_pull_rows(c, "f", 7, ids + NIDS / 2, NIDS / 2, got) == 0, "%s",
		      ps_client_error(c));
	for (int i = 0; i < NIDS / 2 * DIM; i++)
		ck_assert_msg(got[i] == -1.0f, "f: id %" PRIu64 " is %g after its second push, want "
			      "-1 (admitted, the push applied: its count before the re-shard kept)",
			      ids[NIDS / 2 + i / DIM], (double)got[i]);
	check_d(c, 7);
	ps_client_free(c);
	for (int k = 0; k < 3; k++)
		ck_assert_int_eq(tu_stop_server(p[k]), 0);
	cleanup_dirs();
}
END_TEST

int main(void)
{
	Suite *s = suite_create("reshard_cases");
	TCase *tc = tcase_create("reshard_cases");

	signal(SIGPIPE, SIG_IGN);
	tcase_set_timeout(tc, 180);
	TU_ADD(tc, test_pairs_2_to_3);
	TU_ADD(tc, test_async_2_to_3);
	TU_ADD(tc, test_declared_tables_2_to_3);
	suite_add_tcase(s, tc);
	/* the pairs' replication key too, when not run by run-tests.sh */
	tu_secret_setup();
	int rc = tu_run_suite(s);
	tu_secret_cleanup();
	return rc;
}
