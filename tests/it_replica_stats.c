/* it_replica_stats.c - what a replicated shard (cluster.replicas: 1)
 * reports, checked against what the test did, and the replication link's
 * timers: one shard, its two ps-server processes, workers driven step by
 * step from this process.
 *
 *  - test_figures_follow_operations: 4 sync clocks of 2 workers (a dense
 *    tensor of 3 slices, and rows of a table with admission 2 and
 *    max_rows 15) give exactly the replicated bytes (every clock's sum of
 *    every slice, one 20-byte record per distinct row id and clock), as
 *    many batches sent as applied and as numbered, the applied bytes, and
 *    the table's admitted, evicted, pushed, pulled and live rows the
 *    operations make; the same in both processes' stats and /metrics.
 *  - test_clocks_and_dedup_after_takeover: the backup's ended clocks
 *    (worker_clock) and dedup windows (highest push number and digest)
 *    equal the primary's before a kill -9, and are the new primary's after
 *    it; the next clock moves both on by one.
 *  - test_link_timers: an idle pair stays formed past twice
 *    replication.timeout_ms, kept up by heartbeats (counted on both
 *    sides, one every quarter of the timeout); a backup stopped (SIGSTOP)
 *    makes its primary stop serving after the timeout, not before and not
 *    much after; a primary stopped makes its backup take over after twice
 *    the timeout. Each time the pair forms again once the process runs,
 *    and its primary says when the backup has the state.
 */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "config.h"
#include "ps_client.h"
#include "ps_err.h"
#include "ps_time.h"
#include "test_replica.h"
#include "test_util.h"

#define NW 2
#define NA 3000 /* floats of tensor a: 3 slices of at most 4 KiB */
#define TIMEOUT_MS 1000

static char cfg_path[64], logdir[64];
static struct ps_config cfg;
static pid_t srv[2];
static int http;

/* One shard, two processes, sync, SGD lr 1; table emb (dim 2, admission 2,
 * max_rows 15); /metrics on http + replica. */
static void start_pair(void)
{
	char yaml[2048];
	int p0 = tu_low_free_port(0), p1 = tu_low_free_port(p0);

	/* /metrics of replica r on http + r: both below the ephemeral range */
	http = tu_low_free_pair();
	snprintf(yaml, sizeof(yaml),
		 "%scluster:\n  servers: [%s:%d]\n  backups: [%s:%d]\n"
		 "  replicas: 1\n  workers: %d\n"
		 "replication:\n  timeout_ms: %d\n"
		 "consistency:\n  mode: sync\n"
		 "slice_bytes: 4096\n"
		 "optimizer:\n  name: sgd\n  lr: 1\n"
		 "stats:\n  http: 127.0.0.1:%d\n"
		 "limits:\n  idle_timeout_ms: 1500\n  drop_timeout_ms: 600000\n"
		 "  connect_timeout_ms: 2000\n  reconnect_timeout_ms: 60000\n"
		 "  request_timeout_ms: 60000\n"
		 "model:\n  tensors:\n    - {name: a, shape: [%d], init: arange}\n"
		 "  embeddings:\n    - {name: emb, dim: 2, init: zeros, optimizer: sgd, lr: 1, "
		 "admission: 2, max_rows: 15}\n",
		 tu_transport_yaml(), tu_host(), p0, tu_host(), p1, NW, TIMEOUT_MS, http, NA);
	tu_replica_config(yaml, cfg_path, &cfg, logdir, "/tmp/ps-test-repls-XXXXXX");
	tu_start_pair(cfg_path, logdir, 0, srv);
}

static void stop_pair(void)
{
	for (int r = 0; r < 2; r++)
		if (srv[r] > 0) {
			kill(srv[r], SIGCONT);
			int st = tu_stop_server(srv[r]);
			ck_assert_msg(st == 0, "replica %d exited with %d (logs in %s)", r, st, logdir);
			srv[r] = 0;
		}
	unlink(cfg_path);
	tu_rmtree(logdir);
}

/* Until one process is the primary with its backup holding the state:
 * which one, or -1 after limit_s. */
static int wait_pair(double limit_s)
{
	return tu_wait_pair(&cfg, 0, limit_s);
}

static struct ps_shard_stats stats(int r)
{
	struct ps_shard_stats st;

	ck_assert_msg(tu_replica_stats(&cfg, 0, r, -1, &st) == 0, "stats of replica %d (logs in "
		      "%s)", r, logdir);
	return st;
}

static struct ps_client *worker(int rank)
{
	struct ps_client *c = NULL;
	char err[512];

	ck_assert_msg(ps_client_init(&c, &cfg, rank, err, sizeof(err)) == 0, "worker %d: %s", rank,
		      err);
	return c;
}

/* One sync clock: rank 0 pushes rows ids[lo..hi] of emb (none when lo >
 * hi), then both push a dense gradient of a ending the clock; all acked. */
static void clock_step(struct ps_client *c[NW], uint64_t k, int lo, int hi)
{
	static float g[NW][NA], rg[64];
	uint64_t ids[32];
	int64_t id[NW + 1];
	size_t n = 0;

	id[NW] = 0;
	for (int i = lo; i <= hi; i++, n++) {
		ids[n] = (uint64_t)i;
		rg[2 * n] = (float)(i % 5 - 2);
		rg[2 * n + 1] = 1.0f;
	}
	if (n) {
		id[NW] = ps_client_push_rows_async(c[0], "emb", k, ids, n, rg, 0);
		ck_assert_msg(id[NW] > 0, "rows: %s", ps_client_error(c[0]));
	}
	for (int r = 0; r < NW; r++) {
		for (int i = 0; i < NA; i++)
			g[r][i] = (float)((i + (int)k + r) % 5 - 2);
		struct ps_tensor t = { "a", g[r], NA, 0 };
		id[r] = ps_client_push(c[r], k, &t, 1, PS_PUSH_END_CLOCK);
		ck_assert_msg(id[r] > 0, "worker %d: %s", r, ps_client_error(c[r]));
	}
	for (int r = 0; r <= NW; r++)
		if (id[r])
			ck_assert_msg(ps_client_wait(c[r < NW ? r : 0], id[r]) == 0, "clock %llu: %s",
				      (unsigned long long)k, ps_client_error(c[r < NW ? r : 0]));
}

/* The value of metric name (a line "name value") in body, or -1. */
static double metric(const char *body, const char *name)
{
	char key[160];
	const char *p;

	snprintf(key, sizeof(key), "\n%s ", name);
	p = strstr(body, key);
	return p ? atof(p + strlen(key)) : -1;
}

/* Until both processes stand at clock `want` for every worker and the
 * same batch; their stats. */
static void wait_both(uint64_t want, struct ps_shard_stats *a, int pa, struct ps_shard_stats *b)
{
	double t0 = ps_now_s();
	int ok = 0;

	while (!ok && ps_now_s() - t0 < 10 * tu_time_scale()) {
		ok = tu_replica_stats(&cfg, 0, pa, -1, a) == 0 &&
		     tu_replica_stats(&cfg, 0, !pa, -1, b) == 0 && a->repl_lsn == b->repl_lsn &&
		     a->repl_lag == 0;
		for (int r = 0; ok && r < NW; r++)
			ok = a->worker_clock[r] == want && b->worker_clock[r] == want &&
			     a->dedup_digest[r] == b->dedup_digest[r];
		if (!ok)
			tu_sleep_ms(20);
	}
	ck_assert_msg(ok, "the two processes do not agree at clock %llu: primary batch %llu, "
		      "backup batch %llu, clocks %llu/%llu and %llu/%llu (logs in %s)",
		      (unsigned long long)want, (unsigned long long)a->repl_lsn,
		      (unsigned long long)b->repl_lsn, (unsigned long long)a->worker_clock[0],
		      (unsigned long long)a->worker_clock[1], (unsigned long long)b->worker_clock[0],
		      (unsigned long long)b->worker_clock[1], logdir);
}

START_TEST(test_figures_follow_operations)
{
	struct ps_client *c[NW];
	struct ps_shard_stats a0, b0, a, b;
	static char body[1 << 17];
	uint64_t ids[20];
	float out[40];

	start_pair();
	int p = wait_pair(20);
	ck_assert_msg(p >= 0, "the pair did not form (logs in %s)", logdir);
	a0 = stats(p);
	b0 = stats(!p);
	ck_assert_int_eq(a0.ntables, 1);
	ck_assert_uint_eq(a0.tables[0].cap_rows, 15);
	for (int r = 0; r < NW; r++)
		c[r] = worker(r);
	/* rows: ids 1..20 seen once (none admitted), again (all admitted, 5
	 * of them evicted by the cap of 15), 16..20 once more (updated) */
	clock_step(c, 0, 1, 20);
	clock_step(c, 1, 1, 20);
	clock_step(c, 2, 16, 20);
	clock_step(c, 3, 1, 0);
	for (int i = 0; i < 20; i++)
		ids[i] = (uint64_t)(i + 1);
	ck_assert_msg(ps_client_pull_rows(c[0], "emb", 4, ids, 20, out) == 0, "%s",
		      ps_client_error(c[0]));
	wait_both(4, &a, p, &b);

	/* bytes: every clock's sum of the 3 slices (NA floats), once; one
	 * record (id, sightings, 2 floats) per distinct id and clock */
	const uint64_t rec = 8 + 4 + 2 * 4, want = 4ull * NA * 4 + (20 + 20 + 5) * rec;
	ck_assert_msg(a.repl_bytes - a0.repl_bytes == want, "the primary sent %llu bytes, %llu "
		      "made by the operations", (unsigned long long)(a.repl_bytes - a0.repl_bytes),
		      (unsigned long long)want);
	ck_assert_msg(b.repl_bytes - b0.repl_bytes == want, "the backup applied %llu bytes, %llu "
		      "sent", (unsigned long long)(b.repl_bytes - b0.repl_bytes),
		      (unsigned long long)want);
	/* batches: every numbered batch sent, and applied */
	ck_assert_uint_ge(a.repl_lsn - a0.repl_lsn, 4);
	ck_assert_uint_eq(a.repl_batches - a0.repl_batches, a.repl_lsn - a0.repl_lsn);
	ck_assert_uint_eq(b.repl_batches - b0.repl_batches, a.repl_lsn - a0.repl_lsn);
	/* the optimizer: 4 clocks x 3 slices, NA floats a clock, on both, and
	 * on the primary the table's 3 clocks with rows (the backup applies
	 * their rows from the batches and counts the slices only) */
	ck_assert_uint_eq(a.applies - a0.applies, 15);
	ck_assert_uint_eq(b.applies - b0.applies, 12);
	ck_assert_uint_eq(a.apply_bytes - a0.apply_bytes, 4ull * NA * 4);
	ck_assert_uint_eq(b.apply_bytes - b0.apply_bytes, 4ull * NA * 4);
	ck_assert_uint_eq(a.param_checksum, b.param_checksum);
	/* the table: the same on both but the pulls (served by the primary) */
	const struct ps_table_stats *ta = &a.tables[0], *tb = &b.tables[0];
	ck_assert_uint_eq(ta->admitted, 20);
	ck_assert_uint_eq(ta->evicted, 5);
	ck_assert_uint_eq(ta->rows, 15);
	ck_assert_uint_eq(ta->pushed_rows, 25);
	ck_assert_uint_eq(ta->pulled_rows, 20);
	ck_assert_uint_eq(ta->version, 4);
	ck_assert_uint_eq(tb->admitted, 20);
	ck_assert_uint_eq(tb->evicted, 5);
	ck_assert_uint_eq(tb->rows, 15);
	ck_assert_uint_eq(tb->pushed_rows, 25);
	ck_assert_uint_eq(tb->pulled_rows, 0);
	ck_assert_uint_eq(ta->checksum, tb->checksum);
	/* the pulled rows: 1..5 evicted read as their initial zeros, 6..15
	 * moved once (clock 1), 16..20 twice (clocks 1 and 2) */
	for (int i = 0; i < 20; i++) {
		int id = i + 1, times = id <= 5 ? 0 : id <= 15 ? 1 : 2;
		ck_assert_msg(out[2 * i] == -(float)(times * (id % 5 - 2)) &&
			      out[2 * i + 1] == -(float)times, "row %d: %g %g", id,
			      (double)out[2 * i], (double)out[2 * i + 1]);
	}
	/* /metrics of each process says the same as its stats */
	for (int r = 0; r < 2; r++) {
		const struct ps_shard_stats *st = r == p ? &a : &b;
		ck_assert_int_eq(tu_http_get(http + r, "/metrics", body, sizeof(body)), 200);
		ck_assert_msg(metric(body, "ps_replica_bytes_total") == (double)st->repl_bytes &&
			      metric(body, "ps_replica_batches_total") == (double)st->repl_batches &&
			      metric(body, "ps_table_admitted_total{table=\"emb\"}") == 20 &&
			      metric(body, "ps_table_evicted_total{table=\"emb\"}") == 5 &&
			      metric(body, "ps_table_rows{table=\"emb\"}") == 15 &&
			      metric(body, "ps_table_pushed_rows_total{table=\"emb\"}") == 25 &&
			      metric(body, "ps_table_pulled_rows_total{table=\"emb\"}") ==
			      (r == p ? 20 : 0), "replica %d:\n%s", r, body);
	}
	for (int r = 0; r < NW; r++)
		ps_client_free(c[r]);
	stop_pair();
}
END_TEST

START_TEST(test_clocks_and_dedup_after_takeover)
{
	struct ps_client *c[NW];
	struct ps_shard_stats a, b, n;

	start_pair();
	int p = wait_pair(20);
	ck_assert_msg(p >= 0, "the pair did not form (logs in %s)", logdir);
	for (int r = 0; r < NW; r++)
		c[r] = worker(r);
	for (uint64_t k = 0; k < 3; k++)
		clock_step(c, k, 1, 4);
	/* before the kill: the backup's windows and clocks are the primary's */
	wait_both(3, &a, p, &b);
	for (int r = 0; r < NW; r++) {
		/* 3 dense pushes of each, and rank 0's 3 row pushes */
		ck_assert_uint_eq(a.dedup_seq[r], r ? 3 : 6);
		ck_assert_uint_eq(b.dedup_seq[r], a.dedup_seq[r]);
		ck_assert_uint_eq(b.dedup_digest[r], a.dedup_digest[r]);
	}
	ck_assert_uint_ne(a.dedup_digest[0], a.dedup_digest[1]);
	kill(srv[p], SIGKILL);
	tu_wait_child(srv[p]);
	srv[p] = 0;
	double t0 = ps_now_s();
	memset(&n, 0, sizeof(n));
	while (ps_now_s() - t0 < 10 * tu_time_scale() &&
	       !(tu_replica_stats(&cfg, 0, !p, -1, &n) == 0 && n.repl_state == 3))
		tu_sleep_ms(20);
	ck_assert_msg(n.repl_state == 3, "no takeover (logs in %s)", logdir);
	for (int r = 0; r < NW; r++) {
		ck_assert_msg(n.worker_clock[r] == a.worker_clock[r] &&
			      n.dedup_seq[r] == a.dedup_seq[r] &&
			      n.dedup_digest[r] == a.dedup_digest[r], "worker %d: the new primary "
			      "has clock %llu, push %llu, digest %llx; the old one had %llu, %llu, "
			      "%llx", r, (unsigned long long)n.worker_clock[r],
			      (unsigned long long)n.dedup_seq[r], (unsigned long long)n.dedup_digest[r],
			      (unsigned long long)a.worker_clock[r], (unsigned long long)a.dedup_seq[r],
			      (unsigned long long)a.dedup_digest[r]);
	}
	/* the next clock goes on from there, each push once */
	clock_step(c, 3, 1, 4);
	n = stats(!p);
	for (int r = 0; r < NW; r++) {
		ck_assert_uint_eq(n.worker_clock[r], 4);
		ck_assert_uint_eq(n.dedup_seq[r], a.dedup_seq[r] + (r ? 1 : 2));
	}
	ck_assert_uint_eq(n.duplicate_pushes, 0);
	for (int r = 0; r < NW; r++)
		ps_client_free(c[r]);
	stop_pair();
}
END_TEST

/* Seconds until replica r's state is `state` (polling its stats), or -1
 * after limit_s. */
static double until_state(int r, int state, double limit_s)
{
	double t0 = ps_now_s();
	struct ps_shard_stats st;

	while (ps_now_s() - t0 < limit_s * tu_time_scale()) {
		if (tu_replica_stats(&cfg, 0, r, -1, &st) == 0 && st.repl_state == state)
			return ps_now_s() - t0;
		tu_sleep_ms(20);
	}
	return -1;
}

START_TEST(test_link_timers)
{
	const double t = TIMEOUT_MS / 1000.0, slack = 0.8 * tu_time_scale();
	struct ps_shard_stats a0, b0, a, b;

	start_pair();
	int p = wait_pair(20);
	ck_assert_msg(p >= 0, "the pair did not form (logs in %s)", logdir);

	/* idle for 3 timeouts: heartbeats keep the pair formed */
	a0 = stats(p);
	b0 = stats(!p);
	double t0 = ps_now_s();
	tu_sleep_ms(3 * TIMEOUT_MS); /* the idle time under test */
	a = stats(p);
	b = stats(!p);
	double idle = ps_now_s() - t0;
	ck_assert_msg(a.repl_state == 3 && b.repl_state == 2 && a.repl_partner_up &&
		      a.repl_epoch == a0.repl_epoch && b.repl_failovers == 0,
		      "idle %.1f s: states %d and %d, epoch %llu (was %llu), backup takeovers %llu "
		      "(logs in %s)", idle, a.repl_state, b.repl_state,
		      (unsigned long long)a.repl_epoch, (unsigned long long)a0.repl_epoch,
		      (unsigned long long)b.repl_failovers, logdir);
	uint64_t sent = a.repl_heartbeats - a0.repl_heartbeats;
	uint64_t got = b.repl_heartbeats - b0.repl_heartbeats;
	/* at most one every quarter of the timeout (checked on the 0.2 s
	 * tick: one every 0.4 s, about 7 in 3 s) */
	ck_assert_msg(sent >= 5 && sent <= 4 * idle / t + 1, "%llu heartbeats sent in %.1f s",
		      (unsigned long long)sent, idle);
	ck_assert_msg(got + 2 >= sent && got <= sent + 2, "%llu heartbeats sent, %llu received",
		      (unsigned long long)sent, (unsigned long long)got);
	ck_assert_uint_eq(a.repl_lsn, a0.repl_lsn); /* heartbeats are not batches */
	ck_assert_uint_eq(a.repl_batches, a0.repl_batches);

	/* the backup stopped: its primary stops serving after the timeout */
	kill(srv[!p], SIGSTOP);
	double took = until_state(p, 1, 10);
	kill(srv[!p], SIGCONT);
	ck_assert_msg(took >= 0, "the primary still serves with its backup stopped (logs in %s)",
		      logdir);
	fprintf(stderr, "it_replica_stats: backup stopped: the primary stopped serving after "
		"%.2f s (timeout %.1f s)\n", took, t);
	/* counted from the backup's last answer, to a heartbeat sent up to
	 * 0.4 s before the stop (every quarter of the timeout, on the 0.2 s
	 * tick) */
	ck_assert_msg(took >= t - 0.45 && took <= t + slack, "the primary stopped serving %.2f s "
		      "after its backup stopped; the timeout is %.1f s", took, t);
	p = wait_pair(20);
	ck_assert_msg(p >= 0, "the pair did not form again (logs in %s)", logdir);

	/* the primary stopped: its backup takes over after twice the timeout */
	a0 = stats(!p);
	kill(srv[p], SIGSTOP);
	took = until_state(!p, 3, 10);
	kill(srv[p], SIGCONT);
	ck_assert_msg(took >= 0, "the backup did not take over (logs in %s)", logdir);
	fprintf(stderr, "it_replica_stats: primary stopped: the backup took over after %.2f s "
		"(twice the timeout: %.1f s)\n", took, 2 * t);
	ck_assert_msg(took >= 2 * t - 0.45 && took <= 2 * t + slack, "the backup took over %.2f s "
		      "after its primary stopped; twice the timeout is %.1f s", took, 2 * t);
	b = stats(!p);
	ck_assert_uint_eq(b.repl_failovers, a0.repl_failovers + 1);
	ck_assert_uint_eq(b.repl_epoch, a0.repl_epoch + 1);
	ck_assert_msg(wait_pair(20) == !p, "the resumed process did not join as the backup (logs "
		      "in %s)", logdir);
	/* the pair formed three times: each time its primary said when the
	 * backup had the state (its confirmation of the snapshot's batch) */
	int said = 0;
	for (int r = 0; r < 2; r++) {
		char path[128];
		snprintf(path, sizeof(path), "%s/shard0-r%d.log", logdir, r);
		said += tu_file_count(path, "has the state (batch ");
	}
	ck_assert_msg(said >= 3, "the primaries said %d times that the backup had the state; the "
		      "pair formed 3 times (logs in %s)", said, logdir);
	stop_pair();
}
END_TEST

int main(void)
{
	Suite *s = suite_create("replica_stats");
	TCase *tc = tcase_create("processes");
	int rc;

	tcase_set_timeout(tc, 120);
	TU_ADD(tc, test_figures_follow_operations);
	TU_ADD(tc, test_clocks_and_dedup_after_takeover);
	TU_ADD(tc, test_link_timers);
	suite_add_tcase(s, tc);
	tu_secret_setup();
	rc = tu_run_suite(s);
	tu_secret_cleanup();
	return rc;
}
