/* it_elastic_repl.c - workers joining and leaving replicated shards
 * (cluster.replicas: 1): two shards, each a primary and a backup process
 * on loopback, three worker clients driven clock by clock from the test.
 * Rank 2 joins while the backup of shard 0 is stopped (its answer must
 * wait for the backup; in the second run shard 0's primary is killed -9
 * meanwhile), both primaries are killed -9; rank 1 leaves, both
 * primaries (the processes that took over) are killed -9 again. The
 * members each clock's pull names, the weights (integer gradients: every
 * element is its initial value minus the exact sum over each clock's
 * members) and the membership both processes of each pair report in their
 * stats and /metrics must all agree with the changes made.
 */
#include <check.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "config.h"
#include "ps_client.h"
#include "ps_err.h"
#include "ps_time.h"
#include "test_replica.h"
#include "test_util.h"

#define NSHARDS 2
#define NW 3
#define NT 2
#define JOIN 4  /* rank 2's join clock: the shards hold 3 (clocks 0..2 done) */
#define LEAVE 7 /* rank 1 ends clock 6 with the leave */
#define END 10

static char cfg_path[64], logdir[64];
static struct ps_config cfg;
static pid_t srv[2][NSHARDS];
static int http_base;

/* A free port below the kernel's ephemeral range, so that a restarted
 * process does not find its port taken by a dial's source port; none of
 * the n picked before it (picked[]). */
static int low_port(int *picked, int n, int span)
{
	unsigned seed = (unsigned)getpid() * 2654435761u + (unsigned)n * 40503u;

	for (int i = 0; i < 2000; i++) {
		int p = 20000 + (int)(rand_r(&seed) % 12000), ok = 1;
		for (int j = 0; j < n; j++)
			ok &= p + span <= picked[j] || p >= picked[j] + 1;
		for (int j = 0; j < span && ok; j++) {
			struct sockaddr_in sa = { .sin_family = AF_INET,
						  .sin_port = htons((uint16_t)(p + j)),
						  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
			int fd = socket(AF_INET, SOCK_STREAM, 0);
			ok &= fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
			if (fd >= 0)
				close(fd);
		}
		if (ok)
			return p;
	}
	return -1;
}

static void write_config(void)
{
	char yaml[2048];
	int picked[2 * NSHARDS + 1];

	for (int i = 0; i < 2 * NSHARDS; i++) {
		picked[i] = low_port(picked, i, 1);
		ck_assert_int_gt(picked[i], 0);
	}
	/* stats.http: shard k, replica r on http_base + k + 2 r */
	http_base = low_port(picked, 2 * NSHARDS, 2 * NSHARDS);
	ck_assert_int_gt(http_base, 0);
	snprintf(yaml, sizeof(yaml),
		 "%scluster:\n  servers: [%s:%d, %s:%d]\n  backups: [%s:%d, %s:%d]\n"
		 "  replicas: 1\n  workers: %d\n  initial_workers: 2\n"
		 "replication:\n  timeout_ms: 1500\n"
		 "consistency:\n  mode: sync\n"
		 "slice_bytes: 4096\n"
		 "optimizer:\n  name: sgd\n  lr: 1\n"
		 "stats:\n  http: 127.0.0.1:%d\n"
		 "limits:\n  idle_timeout_ms: 1500\n  drop_timeout_ms: 600000\n"
		 "  connect_timeout_ms: 2000\n  reconnect_timeout_ms: 60000\n"
		 "  request_timeout_ms: 30000\n"
		 "model:\n  tensors:\n"
		 "    - {name: a, shape: [3000], init: arange}\n"
		 "    - {name: b, shape: [17, 33], init: arange}\n",
		 tu_transport_yaml(), tu_host(), picked[0], tu_host(), picked[1], tu_host(),
		 picked[2], tu_host(), picked[3], NW, http_base);
	tu_replica_config(yaml, cfg_path, &cfg, logdir, "/tmp/ps-test-elrepl-XXXXXX");
}

/* Integer gradient of worker rank at clock: every sum is exact. */
static float grad_value(int rank, int clock, int t, int64_t i)
{
	return (float)((rank + 1) * (int)((clock * 3 + i + t) % 7 - 3));
}

/* Who is a member of clock c in this run. */
static int member(int rank, int c)
{
	return rank == 0 || (rank == 1 && c < LEAVE) || (rank == 2 && c >= JOIN);
}

static void tensors_alloc(struct ps_tensor *t)
{
	for (int k = 0; k < NT; k++)
		t[k] = (struct ps_tensor){ cfg.tensors[k].name,
					   calloc((size_t)cfg.tensors[k].count, 4),
					   cfg.tensors[k].count, 0 };
}

static void tensors_free(struct ps_tensor *t)
{
	for (int k = 0; k < NT; k++)
		free(t[k].data);
}

/* Kills -9 the primary of every shard and starts it again (it joins as
 * the backup of the process that takes over); returns once every pair is
 * whole again. */
static void kill_primaries(const char *when)
{
	int p[NSHARDS];

	for (int k = 0; k < NSHARDS; k++) {
		p[k] = tu_replica_primary(&cfg, k);
		ck_assert_msg(p[k] >= 0, "%s: shard %d has no primary (logs in %s)", when, k, logdir);
		kill(srv[p[k]][k], SIGKILL);
		tu_wait_child(srv[p[k]][k]);
	}
	for (int k = 0; k < NSHARDS; k++)
		srv[p[k]][k] = tu_start_replica(cfg_path, logdir, k, p[k], 1);
	double t = tu_replicas_healthy(&cfg, NSHARDS, 30);
	ck_assert_msg(t >= 0, "%s: the pairs did not form again (logs in %s)", when, logdir);
	for (int k = 0; k < NSHARDS; k++)
		ck_assert_msg(tu_replica_primary(&cfg, k) == !p[k], "%s: shard %d: replica %d "
			      "should serve (logs in %s)", when, k, !p[k], logdir);
	printf("measured: %s: both primaries killed -9, pairs whole again after %.2f s\n", when,
	       t);
}

struct joiner {
	struct ps_client *c;
	char err[512];
	double took;
	_Atomic int done;
};

static void *join_run(void *arg)
{
	struct joiner *j = arg;
	double t0 = ps_now_s();

	/* rank 2 is above initial_workers: ps_client_init joins */
	if (ps_client_init(&j->c, &cfg, 2, j->err, sizeof(j->err)))
		j->c = NULL;
	j->took = ps_now_s() - t0;
	atomic_store(&j->done, 1);
	return NULL;
}

/* One clock: every member of c pulls version c (checking the members it is
 * told) and pushes its gradient, rank 1 with the leave at LEAVE - 1. */
static void run_clock(struct ps_client **c, int clock, struct ps_tensor (*g)[NT],
		      struct ps_tensor (*w)[NT])
{
	int64_t id[NW] = { 0 };
	int n = 0;

	for (int r = 0; r < NW; r++)
		n += member(r, clock);
	for (int r = 0; r < NW; r++) {
		struct ps_members_info mi;

		if (!member(r, clock))
			continue;
		id[r] = ps_client_pull(c[r], (uint64_t)clock, w[r], NT);
		ck_assert_msg(id[r] > 0 && ps_client_wait(c[r], id[r]) == 0, "rank %d pull %d: %s",
			      r, clock, ps_client_error(c[r]));
		ck_assert_int_eq(ps_client_members(c[r], &mi), 0);
		ck_assert_uint_eq(mi.clock, (uint64_t)clock);
		int idx = 0;
		for (int q = 0; q < r; q++)
			idx += member(q, clock);
		ck_assert_msg(mi.count == n && mi.index == idx, "clock %d rank %d: told %d members, "
			      "index %d; want %d, %d", clock, r, mi.count, mi.index, n, idx);
	}
	for (int r = 0; r < NW; r++) {
		if (!member(r, clock))
			continue;
		for (int k = 0; k < NT; k++)
			for (int64_t i = 0; i < g[r][k].count; i++)
				g[r][k].data[i] = grad_value(r, clock, k, i);
		id[r] = ps_client_push(c[r], (uint64_t)clock, g[r], NT, PS_PUSH_END_CLOCK |
				       (r == 1 && clock == LEAVE - 1 ? PS_PUSH_LEAVE : 0));
		ck_assert_msg(id[r] > 0, "rank %d push %d: %s", r, clock, ps_client_error(c[r]));
	}
	for (int r = 0; r < NW; r++)
		if (member(r, clock))
			ck_assert_msg(ps_client_wait(c[r], id[r]) == 0, "rank %d push %d: %s (logs in "
				      "%s)", r, clock, ps_client_error(c[r]), logdir);
}

/* 1 when the log of shard k's process r holds text. */
static int log_has(int k, int r, const char *text)
{
	char path[160], buf[1 << 16];
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "%s/shard%d-r%d.log", logdir, k, r);
	f = fopen(path, "r");
	if (!f)
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	return strstr(buf, text) != NULL;
}

/* The value of metric `name` in a /metrics body, or -1. */
static double metric(const char *body, const char *name)
{
	char key[128];
	const char *p;

	snprintf(key, sizeof(key), "\n%s ", name);
	p = strstr(body, key);
	return p ? atof(p + strlen(key)) : -1;
}

/* _i 0: the primaries are killed after each change was answered; _i 1:
 * also, shard 0's primary is killed while the join's hold is applied there
 * and not confirmed by its (stopped) backup: the worker's resent request
 * holds the clock again on the process that takes over. */
START_TEST(test_membership_survives_failover)
{
	struct ps_client *c[NW] = { NULL };
	struct ps_tensor g[NW][NT], w[NW][NT], w0[NT];
	char err[512];

	write_config();
	for (int k = 0; k < NSHARDS; k++)
		for (int r = 0; r < 2; r++)
			srv[r][k] = tu_start_replica(cfg_path, logdir, k, r, 1);
	ck_assert_msg(tu_replicas_healthy(&cfg, NSHARDS, 30) >= 0, "the pairs did not form (logs "
		      "in %s)", logdir);
	for (int r = 0; r < NW; r++) {
		tensors_alloc(g[r]);
		tensors_alloc(w[r]);
	}
	tensors_alloc(w0);
	for (int r = 0; r < 2; r++)
		ck_assert_msg(ps_client_init(&c[r], &cfg, r, err, sizeof(err)) == 0, "%s", err);
	int64_t id = ps_client_pull(c[0], 0, w0, NT);
	ck_assert_msg(id > 0 && ps_client_wait(c[0], id) == 0, "%s", ps_client_error(c[0]));
	for (int clock = 0; clock < JOIN - 1; clock++)
		run_clock(c, clock, g, w);

	/* the join, with shard 0's backup stopped: its hold is not answered
	 * before the backup has it */
	/* two fresh processes with the same state: replica 0 serves, so the
	 * joining client's first dial (cluster.servers) finds the primary, not
	 * the stopped backup */
	int p0 = tu_replica_primary(&cfg, 0);
	ck_assert_msg(p0 == 0, "shard 0: replica %d serves, replica 0 expected (logs in %s)", p0,
		      logdir);
	struct joiner j = { 0 };
	pthread_t th;
	kill(srv[!p0][0], SIGSTOP);
	ck_assert_int_eq(pthread_create(&th, NULL, join_run, &j), 0);
	/* the primary holds clock 3 for rank 2 at once; the answer waits */
	double t0 = ps_now_s();
	int held = 0;
	while (!(held = log_has(0, p0, "worker 2 joining: held at clock 3")) &&
	       ps_now_s() - t0 < 1.0)
		tu_sleep_ms(10);
	tu_sleep_ms(300);
	int early = atomic_load(&j.done);
	if (_i) {
		/* the hold applied, not confirmed: the primary dies with it, and
		 * its restarted process makes the backup take over at once */
		kill(srv[p0][0], SIGKILL);
		tu_wait_child(srv[p0][0]);
		srv[p0][0] = tu_start_replica(cfg_path, logdir, 0, p0, 1);
	}
	kill(srv[!p0][0], SIGCONT);
	double stopped = ps_now_s() - t0;
	ck_assert_msg(held, "shard 0's primary did not hold a clock for rank 2 within 1 s (logs "
		      "in %s)", logdir);
	ck_assert_int_eq(pthread_join(th, NULL), 0);
	ck_assert_msg(j.c != NULL, "rank 2 did not join: %s (logs in %s)", j.err, logdir);
	ck_assert_msg(!early, "the join was answered in %.3f s while shard 0's backup was "
		      "stopped", j.took);
	printf("measured: rank 2's join took %.2f s, shard 0's backup stopped for the first "
	       "%.2f s of it%s\n", j.took, stopped, _i ? ", its primary killed -9 with the hold "
	       "unconfirmed" : "");
	if (_i) {
		/* the process that took over held the clock again for the
		 * resent request, and it serves now */
		ck_assert_msg(tu_replicas_healthy(&cfg, NSHARDS, 30) >= 0, "the pair did not form "
			      "again (logs in %s)", logdir);
		ck_assert_int_eq(tu_replica_primary(&cfg, 0), !p0);
		ck_assert_msg(log_has(0, !p0, "worker 2 joining: held at clock 3"), "the new "
			      "primary did not hold clock 3 for rank 2 (logs in %s)", logdir);
	}
	c[2] = j.c;
	ck_assert_uint_eq(ps_client_clock(c[2]), JOIN);
	kill_primaries("after the join");

	for (int clock = JOIN - 1; clock < LEAVE; clock++)
		run_clock(c, clock, g, w);
	kill_primaries("after the leave");
	for (int clock = LEAVE; clock < END; clock++)
		run_clock(c, clock, g, w);

	/* weights: the initial ones minus the exact sums of each clock's members */
	id = ps_client_pull(c[0], END, w[0], NT);
	ck_assert_msg(id > 0 && ps_client_wait(c[0], id) == 0, "%s", ps_client_error(c[0]));
	for (int k = 0; k < NT; k++)
		for (int64_t i = 0; i < cfg.tensors[k].count; i++) {
			float want = w0[k].data[i];
			for (int clock = 0; clock < END; clock++)
				for (int r = 0; r < NW; r++)
					if (member(r, clock))
						want -= grad_value(r, clock, k, i);
			ck_assert_msg(w[0][k].data[i] == want, "%s[%lld] = %g, want %g",
				      cfg.tensors[k].name, (long long)i, (double)w[0][k].data[i],
				      (double)want);
		}

	/* both processes of each pair: the same state and membership */
	for (int k = 0; k < NSHARDS; k++) {
		struct ps_shard_stats st[2];
		for (int r = 0; r < 2; r++) {
			char body[1 << 16];
			ck_assert_int_eq(tu_replica_stats(&cfg, k, r, -1, &st[r]), 0);
			ck_assert_msg(st[r].joins == 1 && st[r].leaves == 1, "shard %d replica %d: %"
				      PRIu64 " joins, %" PRIu64 " leaves", k, r, st[r].joins,
				      st[r].leaves);
			ck_assert_uint_eq(st[r].member_current, END);
			ck_assert_uint_eq(st[r].member_epoch, 2);
			ck_assert_int_eq(st[r].nmembers, 2);
			ck_assert_msg(st[r].members[0] == 0 && st[r].members[1] == 2,
				      "shard %d replica %d: members %d %d", k, r, st[r].members[0],
				      st[r].members[1]);
			ck_assert_int_eq(tu_http_get(http_base + k + 2 * r, "/metrics", body,
						     sizeof(body)), 200);
			ck_assert_msg(metric(body, "ps_member_joins_total") == 1 &&
				      metric(body, "ps_member_leaves_total") == 1 &&
				      metric(body, "ps_member_epoch") == 2,
				      "shard %d replica %d: joins %g, leaves %g, epoch %g", k, r,
				      metric(body, "ps_member_joins_total"),
				      metric(body, "ps_member_leaves_total"),
				      metric(body, "ps_member_epoch"));
		}
		ck_assert_msg(st[0].param_checksum == st[1].param_checksum, "shard %d: the pair's "
			      "weights differ (logs in %s)", k, logdir);
		ck_assert_int_eq(st[0].repl_state + st[1].repl_state, 2 + 3);
	}
	/* ps-stat --json shows both processes' membership */
	char outp[] = "/tmp/ps-elrepl-stat-XXXXXX", text[16384] = "";
	int fd = mkstemp(outp);
	ck_assert_int_ge(fd, 0);
	close(fd);
	const char *argv[] = { "bin/ps-stat", "--config", cfg_path, "--json", "--interval", "0.2",
			       NULL };
	ck_assert_int_eq(tu_wait_child(tu_spawn(argv, outp)), 0);
	FILE *sf = fopen(outp, "r");
	ck_assert_ptr_nonnull(sf);
	text[fread(text, 1, sizeof(text) - 1, sf)] = '\0';
	fclose(sf);
	unlink(outp);
	const char *at = text;
	/* each shard's, then each of its two processes' */
	for (int n = 0; n < 3 * NSHARDS; n++) {
		at = strstr(at, "\"membership\":{\"epoch\":2,\"clock\":10,\"joins\":1,"
			    "\"leaves\":1,\"count\":2,\"members\":[0,2]}");
		ck_assert_msg(at, "ps-stat --json: %d of %d entries show the membership: %s", n,
			      3 * NSHARDS, text);
		at++;
	}

	for (int r = 0; r < NW; r++) {
		ps_client_free(c[r]);
		tensors_free(g[r]);
		tensors_free(w[r]);
	}
	tensors_free(w0);
	for (int k = 0; k < NSHARDS; k++)
		for (int r = 0; r < 2; r++) {
			int st = tu_stop_server(srv[r][k]);
			ck_assert_msg(st == 0, "shard %d replica %d exited with %d (logs in %s)", k, r,
				      st, logdir);
		}
	unlink(cfg_path);
	tu_rmtree(logdir);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("elastic_repl");
	TCase *tc = tcase_create("elastic_repl");
	int rc;

	signal(SIGPIPE, SIG_IGN);
	tcase_set_timeout(tc, 180);
	TU_ADD_LOOP(tc, test_membership_survives_failover, 0, 2);
	suite_add_tcase(s, tc);
	tu_secret_setup();
	rc = tu_run_suite(s);
	tu_secret_cleanup();
	return rc;
}
