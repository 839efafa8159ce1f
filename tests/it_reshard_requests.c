/* it_reshard_requests.c - the requests other than pushes and pulls that a
 * worker can have in flight when its client follows a live re-shard
 * (docs/elastic.md, "Re-sharding while the workers run"): declarations of
 * tensors and tables, stats and checkpoint requests. Real shard processes,
 * two worker clients with $PS_CONFIG_FOLLOW, calls in threads.
 *
 *  - test_declare_in_flight_2_3: a config without a model, 2 shards, sync.
 *    Both workers end clock 0 (empty pushes), so ps-stat stops the shards
 *    at clock 1. Rank 1 declares its tables, then its tensors, from
 *    before the stop: its table declaration waits for rank 0's (asked
 *    again every 20 ms) through the stop and the old shards' exit. Once
 *    they exited rank 0 declares its tensors (rank 0's values), then its
 *    tables, and rank 0 asks new shard 0 for a checkpoint and rank 1
 *    new shard 1 for stats: all waiting for the gone shards. 3 shards
 *    start from the checkpoints and the follow file names them: every
 *    call completes on the new map (each request in flight failed with
 *    PS_EMAP at the switch and its call started it again). Rank 1 holds
 *    rank 0's initial values; the stats and the checkpoint are the new
 *    shards' (map epoch 1; the checkpoint written); 3 clocks of integer
 *    gradients, dense and rows, give the exact sums on every shard.
 *  - test_stats_gone_shard_3_2: a stats request for shard 2 in flight
 *    while 3 shards go to 2 fails with PS_EMAP naming the shard count
 *    now (ask again), and a request for shard 1 is answered by the new
 *    shard 1.
 *  - test_declare_during_stop: a declaration reaching shards that hold a
 *    stop is refused (PS_ERESHARD) and asked again: the old shards exit
 *    at their commit (they hung when they took it) and the declaration
 *    completes on the new map with rank 0's values.
 *  - test_declare_tables_during_stop: the same of a declaration of tables:
 *    no shard holds the table under the stop; once it is cancelled the
 *    declaration completes on the same map.
 *  - test_declared_rows_in_flight_2_3: row pushes of a declared table
 *    refused at the stop are cut again for the new map, applied once.
 *  - test_declare_partial_at_stop: a declaration that reached one old
 *    shard and not the other is never committed in a stop: ps-stat
 *    cancels it and waits for the declaration (refusing the re-shard when
 *    it does not complete), a commit carrying the other shards'
 *    declarations is refused; once complete, 2 -> 3 with the exact sums.
 *  - test_declare_unfinished_at_stop: a worker that has not ended the
 *    clocks below a committed stop declares: taken (the stop waits for
 *    it), it ends them, and the stop completes with the tensors on both.
 *  - test_declare_worker_dies_at_stop: that worker (a process of its own)
 *    killed with SIGKILL once its declaration reached shard 0 and not
 *    shard 1: the stop completes once it is dropped, the new shards refuse
 *    the differing checkpoints, the old shards start again from their
 *    files, and rank 0 declaring again completes it: the exact sums.
 *  - test_declare_worker_dies_local_reshard: the same through ps-local.sh's
 *    live re-shard, which rolls back.
 */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <dirent.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "config.h"
#include "ps_client.h"
#include "ps_client_int.h" /* the requests in flight, the re-shards followed */
#include "ps_err.h"
#define RESHARD_TMPDIR "/tmp/ps-reshard-req-XXXXXX"
#include "test_reshard.h"
#include "test_util.h"

#define NW 2
#define NX 1500 /* tensor x: 6000 bytes, 6 slices of slice_bytes 1024 */
#define NY 7    /* tensor y: [7, 40] */
#define NY2 40
#define DIM 4   /* table e's rows */
#define NIDS 50
#define NCLK 3  /* clocks trained after the switch */

/* More limits: keys (indented lines) for the configs write_cfg writes. */
static const char *limits_more = "";

/* Writes the n-shard config (fresh ports) to dir/NAME.yaml: no model (the
 * workers declare it); its path in out. With model_yaml, that model. */
static void write_cfg(const char *name, int n, const char *model_yaml, char *out, size_t len)
{
	char yaml[2048], servers[256] = "";

	tu_servers_list(n, servers, sizeof(servers));
	snprintf(yaml, sizeof(yaml),
		 "cluster:\n  servers: [%s]\n  workers: %d\n"
		 "slice_bytes: 1024\nseed: 5\n"
		 "optimizer:\n  name: sgd\n  lr: 1\n%s"
		 "limits:\n  reconnect_timeout_ms: 60000\n  request_timeout_ms: 60000\n%s"
		 "checkpoint:\n  dir: %s\n  every_s: 0\n  on_request: true\nlog:\n  level: warn\n",
		 servers, NW, model_yaml, limits_more, ck);
	tu_write_named(dir, name, yaml, out, len);
}

/* The new shards of a re-shard from old_n shards (exited at their stop):
 * the old checkpoints set aside, the n-shard config NAME written (its path
 * in out) and its shards started from them into srv; each listening. */
static void start_new_shards(const char *as, int old_n, const char *name, int n,
			     const char *model_yaml, char *out, size_t len, pid_t *srv)
{
	char old[200], err[600];
	struct ps_config *nc = malloc(sizeof(*nc));

	ck_assert_ptr_nonnull(nc);
	live_move_old(as, old_n, 0, old, sizeof(old));
	write_cfg(name, n, model_yaml, out, len);
	for (int k = 0; k < n; k++)
		srv[k] = live_start(out, k, 0, old, old_n);
	ck_assert_msg(ps_config_load(nc, out, err, sizeof(err)) == 0, "%s", err);
	for (int k = 0; k < n; k++)
		ck_assert_msg(tu_wait_listen(nc->shards[k].port), "new shard %d does not listen "
			      "(logs in %s)", k, dir);
	free(nc);
}

/* The requests pending on c (waited for or not). */
/* A cluster of n shards of a config named name (model_yaml added) that the
 * workers follow, and a client per rank connected to it. */
static void start_cluster(const char *name, int n, const char *model_yaml, char *path,
			  size_t len, pid_t *srv, struct ps_client **c)
{
	char err[600];

	setup_dirs();
	write_cfg(name, n, model_yaml, path, len);
	ck_assert_msg(ps_config_load(&cfg, path, err, sizeof(err)) == 0, "%s", err);
	live_point_at(path);
	setenv("PS_CONFIG_FOLLOW", live_ptr, 1);
	for (int k = 0; k < n; k++)
		srv[k] = live_start(path, k, 0, NULL, 0);
	for (int r = 0; r < NW; r++)
		c[r] = connect_retry(r);
}

/* The clients freed, the n shards stopped (each must exit 0), the
 * folders removed. */
static void stop_cluster(struct ps_client **c, pid_t *srv, int n)
{
	for (int r = 0; r < NW; r++)
		ps_client_free(c[r]);
	for (int k = 0; k < n; k++)
		ck_assert_int_eq(tu_stop_server(srv[k]), 0);
	unsetenv("PS_CONFIG_FOLLOW");
	cleanup_dirs();
}

/* Every rank ends the clock with an empty push. */
static void end_clock_empty(struct ps_client **c)
{
	for (int r = 0; r < NW; r++) {
		int64_t id = ps_client_push(c[r], 0, NULL, 0, PS_PUSH_END_CLOCK);
		ck_assert_msg(id > 0 && ps_client_wait(c[r], id) == 0, "rank %d: empty push: %s", r,
			      ps_client_error(c[r]));
	}
}

static int pending(struct ps_client *c)
{
	int n = 0;

	pthread_mutex_lock(&c->mu);
	for (struct req *r = c->reqs; r; r = r->next)
		n++;
	pthread_mutex_unlock(&c->mu);
	return n;
}

/* Waits (10 s at most: a thread started under load) until c has at least
 * n requests pending. */
static void wait_pending(struct ps_client *c, int n, const char *what)
{
	for (int i = 0; i < 1000 && pending(c) < n; i++)
		tu_sleep_ms(10);
	ck_assert_msg(pending(c) >= n, "%s: %d request(s) in flight, expected %d", what,
		      pending(c), n);
}

/* ---- the calls, in threads ---- */

static float xa0[NX], ya0[NY * NY2], xa1[NX], ya1[NY * NY2]; /* each rank's arrays */

/* Rank 0's initial values of x and y, which the declaration takes; rank
 * 1's arrays at -100, to be overwritten by them. */
static void set_initial_values(void)
{
	for (int i = 0; i < NX; i++) {
		xa0[i] = (float)(i % 13) - 6;
		xa1[i] = -100;
	}
	for (int i = 0; i < NY * NY2; i++) {
		ya0[i] = (float)(i % 11);
		ya1[i] = -100;
	}
}
static const int64_t ydims[2] = { NY, NY2 };

struct call {
	struct ps_client *c;
	int rank, shard, write, done, rc;
	struct ps_shard_stats st;
	char err[700];
};

static void declare_tensors(struct call *a)
{
	float *x = a->rank ? xa1 : xa0, *y = a->rank ? ya1 : ya0;
	const int64_t xdims[1] = { NX };
	struct ps_param p[2] = { { .name = "x", .ndims = 1, .dims = xdims, .data = x },
				 { .name = "y", .ndims = 2, .dims = ydims, .data = y } };

	a->rc = ps_client_declare(a->c, p, 2);
	if (a->rc)
		snprintf(a->err, sizeof(a->err), "rank %d: declaring tensors: %s", a->rank,
			 ps_client_error(a->c));
}

static void declare_tables(struct call *a)
{
	struct ps_table_decl t = { .name = "e", .dim = DIM, .init = "zeros", .optimizer = "sgd",
				   .lr = 1 };

	a->rc = ps_client_declare_tables(a->c, &t, 1);
	if (a->rc)
		snprintf(a->err, sizeof(a->err), "rank %d: declaring tables: %s", a->rank,
			 ps_client_error(a->c));
}

/* Every rank declares the tables, each on a map of nshards shards (0: not
 * checked). */
static void declare_tables_all(struct ps_client **c, int nshards)
{
	struct call dec = { 0 };

	for (int r = 0; r < NW; r++) {
		dec.c = c[r];
		dec.rank = r;
		declare_tables(&dec);
		ck_assert_msg(dec.rc == 0, "%s (%s)", dec.err, ps_strerror(dec.rc));
		if (nshards)
			ck_assert_int_eq(ps_config_nshards(ps_client_config(c[r])), nshards);
	}
}

/* rank 0: tensors, then tables; rank 1: tables, then tensors */
static void *declare_thread(void *arg)
{
	struct call *a = arg;

	if (a->rank == 0) {
		declare_tensors(a);
		if (!a->rc)
			declare_tables(a);
	} else {
		declare_tables(a);
		if (!a->rc)
			declare_tensors(a);
	}
	__atomic_store_n(&a->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static void *stats_thread(void *arg)
{
	struct call *a = arg;

	a->rc = ps_client_checkpoint(a->c, a->shard, a->write, &a->st);
	if (a->rc)
		snprintf(a->err, sizeof(a->err), "%s", ps_client_error(a->c));
	__atomic_store_n(&a->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static float gx(int rank, int k, int i)
{
	return (float)((i * (rank + 2) + k * 5) % 9 - 4);
}

static float ge(int rank, int k, uint64_t id, int d)
{
	return (float)((int)(id * 3 + (uint64_t)d + (uint64_t)rank * 7 + (uint64_t)k) % 5 - 2);
}

/* One clock k of rank on c: rows of e, then x and y (ending the clock). */
static void train(struct ps_client *c, int rank, int k)
{
	static __thread float g[NX], gy[NY * NY2], ge_[NIDS * DIM];
	static __thread uint64_t ids[NIDS];
	struct ps_tensor t[2] = { { .name = "x", .data = g, .count = NX },
				  { .name = "y", .data = gy, .count = NY * NY2 } };
	int64_t id;

	for (int i = 0; i < NIDS; i++) {
		ids[i] = (uint64_t)(i * 7 + 3);
		for (int d = 0; d < DIM; d++)
			ge_[i * DIM + d] = ge(rank, k, ids[i], d);
	}
	ck_assert_msg(ps_client_push_rows(c, "e", (uint64_t)k, ids, NIDS, ge_, 0) == 0,
		      "rank %d: row push %d: %s", rank, k, ps_client_error(c));
	for (int i = 0; i < NX; i++)
		g[i] = gx(rank, k, i);
	for (int i = 0; i < NY * NY2; i++)
		gy[i] = gx(rank, k, i + 11);
	id = ps_client_push(c, (uint64_t)k, t, 2, PS_PUSH_END_CLOCK);
	ck_assert_msg(id > 0 && ps_client_wait(c, id) == 0, "rank %d: push %d: %s", rank, k,
		      ps_client_error(c));
}

/* Clocks from..NCLK of both workers on c (declared x, y and e; rank 0's
 * initial values in xa0, ya0), then each pulls: every weight and row is
 * its initial value minus the exact sum of both workers' gradients of
 * clocks 1..NCLK. */
static void train_and_check(struct ps_client **c, int from)
{
	for (int k = from; k <= NCLK; k++)
		for (int r = 0; r < NW; r++)
			train(c[r], r, k);
	static float wx[NX], wy[NY * NY2], we[NIDS * DIM];
	static uint64_t ids[NIDS];
	struct ps_tensor t[2] = { { .name = "x", .data = wx, .count = NX },
				  { .name = "y", .data = wy, .count = NY * NY2 } };
	for (int i = 0; i < NIDS; i++)
		ids[i] = (uint64_t)(i * 7 + 3);
	for (int r = 0; r < NW; r++) {
		int64_t id = ps_client_pull(c[r], NCLK + 1, t, 2);
		ck_assert_msg(id > 0 && ps_client_wait(c[r], id) == 0, "pull: %s",
			      ps_client_error(c[r]));
		ck_assert_msg(ps_client_pull_rows(c[r], "e", NCLK + 1, ids, NIDS, we) == 0,
			      "pull rows: %s", ps_client_error(c[r]));
		for (int i = 0; i < NX + NY * NY2; i++) {
			float want = i < NX ? xa0[i] : ya0[i - NX];
			float got = i < NX ? wx[i] : wy[i - NX];
			for (int k = 1; k <= NCLK; k++)
				for (int q = 0; q < NW; q++)
					want -= gx(q, k, i < NX ? i : i - NX + 11);
			ck_assert_msg(got == want, "rank %d: %s[%d] = %g, exactly %g", r,
				      i < NX ? "x" : "y", i < NX ? i : i - NX, (double)got,
				      (double)want);
		}
		for (int i = 0; i < NIDS; i++)
			for (int d = 0; d < DIM; d++) {
				float want = 0;
				for (int k = 1; k <= NCLK; k++)
					for (int q = 0; q < NW; q++)
						want -= ge(q, k, ids[i], d);
				ck_assert_msg(we[i * DIM + d] == want, "rank %d: e[%" PRIu64 "][%d] = "
					      "%g, exactly %g", r, ids[i], d,
					      (double)we[i * DIM + d], (double)want);
			}
	}
}

START_TEST(test_declare_in_flight_2_3)
{
	char c2[160], c3[160];
	struct ps_client *c[NW];
	struct call dec[NW], sta[NW];
	pthread_t tdec[NW], tsta[NW];
	pid_t srv[3];

	start_cluster("c2", 2, "", c2, sizeof(c2), srv, c);
	/* clock 0 ended by both (nothing declared yet): the stop is at 1 */
	end_clock_empty(c);
	set_initial_values();
	memset(dec, 0, sizeof(dec));
	memset(sta, 0, sizeof(sta));
	for (int r = 0; r < NW; r++) {
		dec[r].c = sta[r].c = c[r];
		dec[r].rank = sta[r].rank = r;
	}

	/* rank 1's table declaration waits for rank 0's through the stop */
	ck_assert_int_eq(pthread_create(&tdec[1], NULL, declare_thread, &dec[1]), 0);
	wait_pending(c[1], 1, "rank 1's declaration");
	pstat_stop(c2, 1);
	for (int k = 0; k < 2; k++)
		ck_assert_int_eq(tu_wait_exit(srv[k]), 0);
	/* rank 0 declares now, and asks for a checkpoint; rank 1 for stats */
	ck_assert_int_eq(pthread_create(&tdec[0], NULL, declare_thread, &dec[0]), 0);
	sta[0].shard = 0;
	sta[0].write = 1;
	sta[1].shard = 1;
	for (int r = 0; r < NW; r++)
		ck_assert_int_eq(pthread_create(&tsta[r], NULL, stats_thread, &sta[r]), 0);
	for (int r = 0; r < NW; r++)
		wait_pending(c[r], 2, r ? "rank 1's declaration and stats" :
			     "rank 0's declaration and checkpoint request");

	start_new_shards("from2", 2, "c3", 3, "", c3, sizeof(c3), srv);
	for (int r = 0; r < NW; r++)
		ck_assert_msg(!__atomic_load_n(&dec[r].done, __ATOMIC_ACQUIRE) &&
			      !__atomic_load_n(&sta[r].done, __ATOMIC_ACQUIRE),
			      "rank %d: a call ended before the switch: %s %s", r, dec[r].err,
			      sta[r].err);
	live_point_at(c3);
	for (int r = 0; r < NW; r++) {
		pthread_join(tdec[r], NULL);
		pthread_join(tsta[r], NULL);
	}
	for (int r = 0; r < NW; r++) {
		ck_assert_msg(dec[r].rc == 0, "%s (%s)", dec[r].err, ps_strerror(dec[r].rc));
		ck_assert_msg(sta[r].rc == 0, "rank %d: %s across the switch: %s (%s)", r,
			      r ? "stats" : "checkpoint", sta[r].err, ps_strerror(sta[r].rc));
		ck_assert_uint_eq(c[r]->reshards, 1);
		ck_assert_int_eq(ps_config_nshards(ps_client_config(c[r])), 3);
		ck_assert_int_eq(ps_config_ntensors(ps_client_config(c[r])), 2);
		ck_assert_int_eq(ps_config_ntables(ps_client_config(c[r])), 1);
		/* answered by the new shards */
		ck_assert_int_eq(sta[r].st.shard, sta[r].shard);
		ck_assert_uint_eq(sta[r].st.map_epoch, 1);
	}
	ck_assert_msg(sta[0].st.checkpoint_status == 0 && strstr(sta[0].st.checkpoint_path,
								 "shard-0.ckpt"),
		      "new shard 0's checkpoint: status %d, '%s' (%s)", sta[0].st.checkpoint_status,
		      sta[0].st.checkpoint_path, sta[0].st.checkpoint_error);
	/* rank 1 got rank 0's initial values, from the new shards */
	ck_assert_msg(!memcmp(xa1, xa0, sizeof(xa0)) && !memcmp(ya1, ya0, sizeof(ya0)),
		      "rank 1's declared tensors differ from rank 0's initial values");

	train_and_check(c, 1);
	stop_cluster(c, srv, 3);
}
END_TEST

START_TEST(test_stats_gone_shard_3_2)
{
	const char *model = "model:\n  tensors:\n    - {name: a, shape: [600], init: arange}\n";
	char c3[160], c2[160];
	struct ps_client *c[NW];
	struct call sta[2];
	pthread_t th[2];
	pid_t srv[3];

	start_cluster("c3", 3, model, c3, sizeof(c3), srv, c);
	end_clock_empty(c);
	pstat_stop(c3, 1);
	for (int k = 0; k < 3; k++)
		ck_assert_int_eq(tu_wait_exit(srv[k]), 0);
	/* rank 0 asks shard 2 (gone from the new map), rank 1 shard 1 */
	memset(sta, 0, sizeof(sta));
	for (int r = 0; r < NW; r++) {
		sta[r].c = c[r];
		sta[r].rank = r;
		sta[r].shard = r ? 1 : 2;
		ck_assert_int_eq(pthread_create(&th[r], NULL, stats_thread, &sta[r]), 0);
	}
	for (int r = 0; r < NW; r++)
		wait_pending(c[r], 1, "the stats request");
	start_new_shards("from3", 3, "c2", 2, model, c2, sizeof(c2), srv);
	live_point_at(c2);
	for (int r = 0; r < NW; r++)
		pthread_join(th[r], NULL);
	ck_assert_msg(sta[0].rc == PS_EMAP && strstr(sta[0].err, "there is no shard 2 now; ask "
						     "again of shards 0 to 1"),
		      "stats of shard 2 across 3 -> 2: %d (%s)", sta[0].rc, sta[0].err);
	ck_assert_msg(sta[1].rc == 0, "stats of shard 1 across 3 -> 2: %s", sta[1].err);
	ck_assert_int_eq(sta[1].st.shard, 1);
	ck_assert_uint_eq(sta[1].st.map_epoch, 1);
	/* asked again of the shards now, it is answered */
	ck_assert_int_eq(ps_config_nshards(ps_client_config(c[0])), 2);
	ck_assert_msg(ps_client_stats(c[0], 1, &sta[0].st) == 0, "%s", ps_client_error(c[0]));
	stop_cluster(c, srv, 2);
}
END_TEST


/* A declaration reaching shards that hold a re-shard's stop: refused
 * (PS_ERESHARD) and asked again, so the sync commit is not held by new
 * slices below the stop's clock (before, the shards never exited) and no
 * old shard takes it alone; it completes on the new map with rank 0's
 * values. */
START_TEST(test_declare_during_stop)
{
	char c2[160], c3[160], err[600];
	struct ps_client *c[NW], *mon;
	struct ps_shard_stats st;
	struct call dec;
	pthread_t th;
	pid_t srv[3];

	start_cluster("c2", 2, "", c2, sizeof(c2), srv, c);
	end_clock_empty(c);
	/* both shards stop at 1; rank 0 declares; then the commits */
	ck_assert_int_eq(ps_client_init(&mon, &cfg, -1, err, sizeof(err)), 0);
	for (int k = 0; k < 2; k++)
		ck_assert_msg(ps_client_stop_at(mon, k, 1, 0, &st) == 0, "%s", ps_client_error(mon));
	set_initial_values();
	memset(&dec, 0, sizeof(dec));
	dec.c = c[0];
	dec.rank = 0;
	ck_assert_int_eq(pthread_create(&th, NULL, declare_thread, &dec), 0);
	/* sent (refused and asked again; before the fix, taken at once) */
	for (int i = 0; i < 300 && !pending(c[0]) && !__atomic_load_n(&dec.done, __ATOMIC_ACQUIRE);
	     i++)
		tu_sleep_ms(10);
	for (int k = 0; k < 2; k++)
		ck_assert_msg(ps_client_stop_at(mon, k, 1, PS_STOP_COMMIT, &st) == 0, "%s",
			      ps_client_error(mon));
	ps_client_free(mon);
	for (int k = 0; k < 2; k++)
		ck_assert_msg(tu_wait_exit(srv[k]) == 0, "old shard %d did not exit 0 at its stop "
			      "(logs in %s)", k, dir);
	start_new_shards("from2", 2, "c3", 3, "", c3, sizeof(c3), srv);
	ck_assert_msg(!__atomic_load_n(&dec.done, __ATOMIC_ACQUIRE), "rank 0's declaration ended "
		      "before the switch: %s", dec.err);
	live_point_at(c3);
	pthread_join(th, NULL);
	ck_assert_msg(dec.rc == 0, "%s (%s)", dec.err, ps_strerror(dec.rc));
	ck_assert_int_eq(ps_config_nshards(ps_client_config(c[0])), 3);
	/* rank 1, on the new map too, gets rank 0's values */
	dec.c = c[1];
	dec.rank = 1;
	declare_thread(&dec);
	ck_assert_msg(dec.rc == 0, "%s (%s)", dec.err, ps_strerror(dec.rc));
	ck_assert_msg(!memcmp(xa1, xa0, sizeof(xa0)) && !memcmp(ya1, ya0, sizeof(ya0)),
		      "rank 1's declared tensors differ from rank 0's initial values");
	train_and_check(c, 1);
	stop_cluster(c, srv, 3);
}
END_TEST

static void *declare_tables_thread(void *arg)
{
	struct call *a = arg;

	declare_tables(a);
	__atomic_store_n(&a->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

/* A declaration of tables reaching shards that hold a prepared stop is
 * refused (PS_ERESHARD) and asked again, as one of tensors is: no shard
 * holds the table while the stop stands; once the stop is cancelled the
 * declaration completes on the same map and both shards hold it. */
START_TEST(test_declare_tables_during_stop)
{
	char c2[160], err[600];
	struct ps_client *c[NW], *mon;
	struct ps_shard_stats st;
	struct call dec;
	pthread_t th;
	pid_t srv[2];

	start_cluster("c2", 2, "", c2, sizeof(c2), srv, c);
	end_clock_empty(c);
	ck_assert_int_eq(ps_client_init(&mon, &cfg, -1, err, sizeof(err)), 0);
	for (int k = 0; k < 2; k++)
		ck_assert_msg(ps_client_stop_at(mon, k, 1, 0, &st) == 0, "%s", ps_client_error(mon));
	memset(&dec, 0, sizeof(dec));
	dec.c = c[0];
	dec.rank = 0;
	ck_assert_int_eq(pthread_create(&th, NULL, declare_tables_thread, &dec), 0);
	for (int i = 0; i < 300 && !pending(c[0]) && !__atomic_load_n(&dec.done, __ATOMIC_ACQUIRE);
	     i++)
		tu_sleep_ms(10);
	tu_sleep_ms(500);
	ck_assert_msg(!__atomic_load_n(&dec.done, __ATOMIC_ACQUIRE), "the declaration of tables "
		      "ended while both shards held a stop: %s", dec.err);
	for (int k = 0; k < 2; k++) {
		ck_assert_int_eq(ps_client_stats(mon, k, &st), 0);
		ck_assert_msg(st.decl_tables == 0 && st.stop_at == 1, "shard %d: %u tables declared "
			      "under its stop at %" PRIu64, k, st.decl_tables, st.stop_at);
	}
	for (int k = 0; k < 2; k++)
		ck_assert_msg(ps_client_stop_at(mon, k, 0, PS_STOP_CANCEL, &st) == 0, "%s",
			      ps_client_error(mon));
	for (int i = 0; i < 1000 && !__atomic_load_n(&dec.done, __ATOMIC_ACQUIRE); i++)
		tu_sleep_ms(10);
	ck_assert_msg(__atomic_load_n(&dec.done, __ATOMIC_ACQUIRE), "the declaration of tables "
		      "did not end within 10 s of the stop's cancel");
	pthread_join(th, NULL);
	ck_assert_msg(dec.rc == 0, "%s (%s)", dec.err, ps_strerror(dec.rc));
	ck_assert_int_eq(ps_config_nshards(ps_client_config(c[0])), 2);
	for (int k = 0; k < 2; k++) {
		ck_assert_int_eq(ps_client_stats(mon, k, &st), 0);
		ck_assert_msg(st.decl_tables == 1 && st.stop_at == 0, "shard %d after the cancel: %u "
			      "tables declared, stop at %" PRIu64, k, st.decl_tables, st.stop_at);
	}
	ps_client_free(mon);
	stop_cluster(c, srv, 2);
}
END_TEST

/* Rank 0's Declare of x and y (values xa0, ya0) sent to shard k alone,
 * over c's connection, as the first step of ps_client_declare does (a
 * worker that ended there would leave it so); 0 or the shard's code. */
static int declare_on_one(struct ps_client *c, int k)
{
	static char nx[] = "x", ny[] = "y";
	char *names[2] = { nx, ny };
	uint32_t ndims[2] = { 1, 2 };
	int64_t dims[3] = { NX, NY, NY2 };
	const float *vals[2] = { xa0, ya0 };
	struct ps_config *dc = malloc(sizeof(*dc));
	struct ps_shardmap map;
	Ps__Declare m = PS__DECLARE__INIT;
	struct req *r = ps__client_req_new(c, REQ_DECLARE);
	struct ps_iov *iov = malloc(sizeof(*iov));
	size_t pos = 0;
	uint8_t *pay;

	ck_assert(dc && r && iov);
	/* the declared config's map, as the client builds it */
	memcpy(dc, &cfg, sizeof(*dc));
	memset(dc->tensors, 0, sizeof(dc->tensors[0]) * 2);
	strcpy(dc->tensors[0].name, "x");
	dc->tensors[0].ndims = 1;
	dc->tensors[0].dims[0] = NX;
	dc->tensors[0].count = NX;
	strcpy(dc->tensors[1].name, "y");
	dc->tensors[1].ndims = 2;
	dc->tensors[1].dims[0] = NY;
	dc->tensors[1].dims[1] = NY2;
	dc->tensors[1].count = NY * NY2;
	dc->ntensors = 2;
	ck_assert_int_eq(ps_shardmap_init(&map, dc), 0);
	pay = malloc(map.shard_bytes[k] + 1);
	ck_assert_ptr_nonnull(pay);
	for (uint32_t i = 0; i < map.nslices; i++) {
		const struct ps_slice *sl = &map.slices[i];
		if (sl->shard != k)
			continue;
		memcpy(pay + pos, vals[sl->tensor] + sl->offset, (size_t)sl->count * sizeof(float));
		pos += (size_t)sl->count * sizeof(float);
	}
	r->id = ps__client_reserve_id(c);
	m.req_id = (uint64_t)r->id;
	m.n_names = 2;
	m.names = names;
	m.n_ndims = 2;
	m.ndims = ndims;
	m.n_dims = 3;
	m.dims = dims;
	m.values = 1;
	iov->base = pay;
	iov->len = pos;
	r->parts[k].iov = iov;
	r->parts[k].niov = 1;
	ck_assert_int_eq(ps__client_pack_part(&r->parts[k], &m.base), 0);
	int64_t id = ps__client_submit_built(c, 0, r);
	ck_assert_int_gt(id, 0);
	int rc = ps_client_wait(c, id);
	ps_shardmap_free(&map);
	free(pay);
	free(dc);
	return rc;
}

/* ps-stat --reshard-stop on the config at c, its output into out. */
static pid_t pstat_spawn(const char *c, const char *out)
{
	const char *argv[] = { "bin/ps-stat", "--config", c, "--reshard-stop", NULL };

	return tu_spawn(argv, out);
}

/* A declaration that reached one old shard before its stop and not the
 * other (here: rank 0's Declare sent to shard 0 alone, as by a worker that
 * ended there): the stop is not committed with the shards differing (shard
 * 0's new slices, at version 0, held its commit; the old checkpoints
 * differed in their tensors, which the new shards refuse). ps-stat finds
 * the shards' declarations differ in their answers to the stop, cancels
 * it, and, the declaration not completing within its wait, refuses the
 * re-shard with the reason, every shard taking pushes again. Asked again,
 * it waits; rank 0 declares (shard 1 takes it, shard 0 compares), and the
 * stop is committed at clock 1: 2 -> 3 from checkpoints that agree, rank 1
 * gets rank 0's values on the new map, and 3 clocks of integer gradients,
 * dense and rows, give the exact sums. */
START_TEST(test_declare_partial_at_stop)
{
	char c2[160], c3[160], out[200], err[600];
	struct ps_client *c[NW], *mon;
	struct ps_shard_stats st[2];
	struct call dec;
	pid_t srv[3], ps;

	start_cluster("c2", 2, "", c2, sizeof(c2), srv, c);
	end_clock_empty(c);
	set_initial_values();
	ck_assert_msg(declare_on_one(c[0], 0) == 0, "rank 0's Declare to shard 0: %s",
		      ps_client_error(c[0]));
	for (int k = 0; k < 2; k++)
		ck_assert_msg(ps_client_stats(c[1], k, &st[k]) == 0, "%s", ps_client_error(c[1]));
	ck_assert_msg(st[0].decl_tensors == 2 && st[1].decl_tensors == 0 && st[0].decl_digest &&
		      !st[1].decl_digest, "declared: shard 0 %d tensors (%016" PRIx64 "), shard 1 "
		      "%d (%016" PRIx64 ")", st[0].decl_tensors, st[0].decl_digest,
		      st[1].decl_tensors, st[1].decl_digest);

	/* a commit carrying what the shards declared when they accepted the
	 * stop is refused by a shard that declares otherwise, nothing
	 * committed (ps-stat's guard against a stop cancelled meanwhile) */
	ck_assert_int_eq(ps_client_init(&mon, &cfg, -1, err, sizeof(err)), 0);
	for (int k = 0; k < 2; k++)
		ck_assert_msg(ps_client_stop_at(mon, k, 1, 0, &st[k]) == 0, "%s",
			      ps_client_error(mon));
	ck_assert_msg(st[0].decl_digest != st[1].decl_digest, "the stop's answers: %016" PRIx64
		      " and %016" PRIx64, st[0].decl_digest, st[1].decl_digest);
	ck_assert_int_eq(ps__client_stop_commit(mon, 1, 1, st[0].decl_digest, &st[1]), PS_ESTATE);
	ck_assert_msg(strstr(ps_client_error(mon), "not committed: shard 1's declared tensors and "
			     "tables (0 tensors, 0 tables) are not those"), "%s",
		      ps_client_error(mon));
	for (int k = 0; k < 2; k++) {
		ck_assert_msg(ps_client_stop_at(mon, k, 0, PS_STOP_CANCEL, &st[k]) == 0, "%s",
			      ps_client_error(mon));
		ck_assert_int_eq(st[k].stop_committed, 0);
	}
	ps_client_free(mon);

	/* nothing completes it: refused, nothing stopped */
	snprintf(out, sizeof(out), "%s/pstat-refused.out", dir);
	ck_assert_msg(tu_wait_exit(pstat_spawn(c2, out)) == 1, "ps-stat did not refuse (%s)", out);
	ck_assert_msg(tu_log_says(out, "ps-stat: reshard-stop: shard 0 declares 2 tensor(s) and "
				  "0 table(s), shard 1 0 and 0: a declaration reached some shards "
				  "before their stop and not the others") &&
		      tu_log_says(out, "refused: a declaration of tensors or tables reached some "
				  "shards only"), "ps-stat's reasons (%s)", out);
	for (int k = 0; k < 2; k++) {
		ck_assert_msg(ps_client_stats(c[1], k, &st[k]) == 0, "%s", ps_client_error(c[1]));
		ck_assert_msg(st[k].stop_at == 0, "shard %d holds a stop at %" PRIu64 " after the "
			      "refusal", k, st[k].stop_at);
	}

	/* asked again, it waits; rank 0 declares meanwhile */
	snprintf(out, sizeof(out), "%s/pstat-waits.out", dir);
	ps = pstat_spawn(c2, out);
	for (int i = 0; i < 3000 && !tu_log_says(out, "waiting up to"); i++)
		tu_sleep_ms(10);
	ck_assert_msg(tu_log_says(out, "waiting up to"), "ps-stat does not wait (%s)", out);
	memset(&dec, 0, sizeof(dec));
	dec.c = c[0];
	dec.rank = 0;
	declare_tensors(&dec);
	ck_assert_msg(dec.rc == 0, "%s (%s)", dec.err, ps_strerror(dec.rc));
	ck_assert_msg(tu_wait_exit(ps) == 0, "ps-stat failed once the declaration completed (%s)",
		      out);
	ck_assert_msg(tu_log_says(out, "every shard stops at clock 1"), "ps-stat (%s)", out);
	for (int k = 0; k < 2; k++)
		ck_assert_msg(tu_wait_exit(srv[k]) == 0, "old shard %d did not exit 0 at its stop "
			      "(logs in %s)", k, dir);
	for (int k = 0; k < 2; k++) {
		char f[200];
		snprintf(f, sizeof(f), "%s/c2.yaml-shard-%d.log", dir, k);
		ck_assert_msg(tu_log_says(f, "stopped at clock 1 with its checkpoint written"),
			      "old shard %d (%s)", k, f);
	}

	start_new_shards("from2", 2, "c3", 3, "", c3, sizeof(c3), srv);
	live_point_at(c3);
	/* rank 1, on the new map, gets rank 0's values */
	dec.c = c[1];
	dec.rank = 1;
	declare_tensors(&dec);
	ck_assert_msg(dec.rc == 0, "%s (%s)", dec.err, ps_strerror(dec.rc));
	ck_assert_int_eq(ps_config_nshards(ps_client_config(c[1])), 3);
	ck_assert_msg(!memcmp(xa1, xa0, sizeof(xa0)) && !memcmp(ya1, ya0, sizeof(ya0)),
		      "rank 1's declared tensors differ from rank 0's initial values");
	/* the tables, declared on the new map by both */
	declare_tables_all(c, 0);
	train_and_check(c, 1);
	stop_cluster(c, srv, 3);
}
END_TEST

/* A worker declaring before it ended the clocks below a committed stop:
 * rank 1 ended clock 0, rank 0 has not, and ps-stat stops both shards at
 * clock 1. The shards cannot close clock 0 without rank 0, so its
 * declaration is taken (refused, it was held forever: rank 0 never ended
 * clock 0 and the shards never exited); rank 1 gets rank 0's values, rank
 * 0 ends clock 0, the shards write their checkpoints at 1 with the tensors
 * and exit 0; 2 -> 3 and 3 clocks of integer gradients give the exact
 * sums. */
START_TEST(test_declare_unfinished_at_stop)
{
	char c2[160], c3[160];
	struct ps_client *c[NW];
	struct ps_shard_stats st;
	struct call dec;
	pid_t srv[3];
	int64_t id;

	start_cluster("c2", 2, "", c2, sizeof(c2), srv, c);
	id = ps_client_push(c[1], 0, NULL, 0, PS_PUSH_END_CLOCK);
	ck_assert_msg(id > 0 && ps_client_wait(c[1], id) == 0, "%s", ps_client_error(c[1]));
	pstat_stop(c2, 1);
	for (int k = 0; k < 2; k++) {
		ck_assert_msg(ps_client_stats(c[1], k, &st) == 0, "%s", ps_client_error(c[1]));
		ck_assert_msg(st.stop_at == 1 && st.stop_committed, "shard %d: stop at %" PRIu64
			      " (%s)", k, st.stop_at, st.stop_committed ? "committed" : "prepared");
	}
	set_initial_values();
	memset(&dec, 0, sizeof(dec));
	for (int r = 0; r < NW; r++) {
		dec.c = c[r];
		dec.rank = r;
		declare_tensors(&dec);
		ck_assert_msg(dec.rc == 0, "%s (%s)", dec.err, ps_strerror(dec.rc));
		ck_assert_int_eq(ps_config_nshards(ps_client_config(c[r])), 2);
	}
	ck_assert_msg(!memcmp(xa1, xa0, sizeof(xa0)) && !memcmp(ya1, ya0, sizeof(ya0)),
		      "rank 1's declared tensors differ from rank 0's initial values");
	id = ps_client_push(c[0], 0, NULL, 0, PS_PUSH_END_CLOCK);
	ck_assert_msg(id > 0 && ps_client_wait(c[0], id) == 0, "%s", ps_client_error(c[0]));
	for (int k = 0; k < 2; k++)
		ck_assert_msg(tu_wait_exit(srv[k]) == 0, "old shard %d did not exit 0 at its stop "
			      "(logs in %s)", k, dir);
	start_new_shards("from2", 2, "c3", 3, "", c3, sizeof(c3), srv);
	live_point_at(c3);
	declare_tables_all(c, 3);
	train_and_check(c, 1);
	stop_cluster(c, srv, 3);
}
END_TEST

/* ---- a worker dying with its declaration on some shards of a committed stop ---- */

/* Reads n bytes from fd within ms milliseconds: 0, or -1 (timed out, or
 * the other end closed). */
static int read_within(int fd, void *buf, size_t n, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	size_t got = 0;

	while (got < n) {
		ssize_t r;
		if (poll(&p, 1, ms) != 1)
			return -1;
		r = read(fd, (char *)buf + got, n - got);
		if (r <= 0)
			return -1;
		got += (size_t)r;
	}
	return 0;
}

/* Rank 0 in a process of its own, the worker that dies: connected, it
 * waits for go, sends its Declare to shard 0 alone (declare_on_one: the
 * first step of ps_client_declare, as a worker killed before the next one
 * leaves it), writes the call's code on done and waits to be killed (go
 * closed, the test gone, ends it too). Forked before the test's process has a
 * client (no thread of its own to lose in the child). */
struct dying {
	pid_t pid;
	int go, done;
};

static void dying_start(struct dying *d)
{
	int go[2], done[2];
	char b = 1;

	ck_assert(pipe(go) == 0 && pipe(done) == 0);
	d->pid = fork();
	ck_assert_int_ge(d->pid, 0);
	if (!d->pid) {
		struct ps_client *c0;
		int rc;

		close(go[1]);
		close(done[0]);
		c0 = connect_retry(0);
		if (write(done[1], &b, 1) != 1 || read(go[0], &b, 1) != 1)
			_exit(2);
		rc = declare_on_one(c0, 0);
		if (write(done[1], &rc, sizeof(rc)) != (ssize_t)sizeof(rc))
			_exit(2);
		(void)!read(go[0], &b, 1);
		_exit(3); /* not killed: the test failed or ended */
	}
	close(go[0]);
	close(done[1]);
	d->go = go[1];
	d->done = done[0];
	ck_assert_msg(read_within(d->done, &b, 1, 30000) == 0, "rank 0's process did not connect "
		      "within 30 s (logs in %s)", dir);
}

/* The dying worker declares on shard 0 alone (taken: the stop waits for
 * rank 0, which has not ended clock 0), then is killed with SIGKILL. */
static void dying_declare_and_die(struct dying *d, struct ps_client *mon)
{
	struct ps_shard_stats st[2];
	int rc = -1;

	ck_assert_int_eq(write(d->go, "g", 1), 1);
	ck_assert_msg(read_within(d->done, &rc, sizeof(rc), 30000) == 0, "rank 0's declaration "
		      "to shard 0 did not end within 30 s");
	ck_assert_msg(rc == 0, "rank 0's Declare to shard 0 at the committed stop: %d (%s)", rc,
		      ps_strerror(rc));
	for (int k = 0; k < 2; k++)
		ck_assert_msg(ps_client_stats(mon, k, &st[k]) == 0, "%s", ps_client_error(mon));
	ck_assert_msg(st[0].decl_tensors == 2 && st[1].decl_tensors == 0, "declared: shard 0 %d "
		      "tensors, shard 1 %d", st[0].decl_tensors, st[1].decl_tensors);
	ck_assert_int_eq(kill(d->pid, SIGKILL), 0);
	ck_assert_int_eq(tu_wait_child(d->pid), 128 + SIGKILL);
	close(d->go);
	close(d->done);
}

/* A monitor's client of cfg, once its shards listen. */
static struct ps_client *monitor(void)
{
	struct ps_client *mon = NULL;
	char err[600];

	ck_assert_msg(ps_client_init(&mon, &cfg, -1, err, sizeof(err)) == 0, "monitor: %s", err);
	return mon;
}

/* Waits (30 s at most) until both shards hold a committed stop at b. */
static void wait_committed(struct ps_client *mon, uint64_t b)
{
	struct ps_shard_stats st;
	int k = 0;

	for (int i = 0; i < 600 && k < 2; i++) {
		ck_assert_msg(ps_client_stats(mon, k, &st) == 0, "%s", ps_client_error(mon));
		if (st.stop_at == b && st.stop_committed)
			k++;
		else
			tu_sleep_ms(50);
	}
	ck_assert_msg(k == 2, "shard %d: stop at %" PRIu64 " (%s), not a committed stop at %"
		      PRIu64, k, st.stop_at, st.stop_committed ? "committed" : "prepared", b);
}

/* Whether ck holds nothing of a new map: no shard-* file (checkpoints,
 * membership files, a new shard's marker). */
static int ck_empty_of_shards(char *found, size_t len)
{
	DIR *d = opendir(ck);
	struct dirent *e;
	int none = 1;

	ck_assert_ptr_nonnull(d);
	while ((e = readdir(d)))
		if (!strncmp(e->d_name, "shard-", 6)) {
			snprintf(found, len, "%.100s/%.200s", ck, e->d_name);
			none = 0;
		}
	closedir(d);
	return none;
}

/* After the roll back, on the old shards started again from their own
 * files (shard 0 declaring the dead worker's tensors, shard 1 none): rank
 * 0, started again, declares (shard 0 compares, shard 1 takes rank 0's
 * values), rank 1 gets rank 0's values, both declare the tables, and 3
 * clocks of integer gradients give the exact sums. c[1] is the rank 1
 * client that lived through it all; c[0] is made here. */
static void redeclare_and_train(struct ps_client **c, struct ps_client *mon)
{
	struct ps_shard_stats st[2];
	struct call dec;

	for (int k = 0; k < 2; k++) {
		ck_assert_msg(ps_client_stats(mon, k, &st[k]) == 0, "%s", ps_client_error(mon));
		ck_assert_msg(st[k].stop_at == 0 && st[k].map_epoch == 0, "old shard %d started "
			      "again: stop at %" PRIu64 ", map epoch %" PRIu64, k, st[k].stop_at,
			      st[k].map_epoch);
		ck_assert_msg(st[k].worker_clock[1] == 1, "old shard %d started again: worker 1 "
			      "finished clock %" PRIu64 ", expected 1 (its checkpoint at the stop)", k,
			      st[k].worker_clock[1]);
	}
	ck_assert_msg(st[0].decl_tensors == 2 && st[1].decl_tensors == 0, "from their files: "
		      "shard 0 declares %d tensors, shard 1 %d (expected 2 and 0)",
		      st[0].decl_tensors, st[1].decl_tensors);
	c[0] = connect_retry(0);
	memset(&dec, 0, sizeof(dec));
	dec.c = c[0];
	dec.rank = 0;
	declare_tensors(&dec);
	ck_assert_msg(dec.rc == 0, "%s (%s)", dec.err, ps_strerror(dec.rc));
	for (int k = 0; k < 2; k++)
		ck_assert_msg(ps_client_stats(mon, k, &st[k]) == 0, "%s", ps_client_error(mon));
	ck_assert_msg(st[0].decl_tensors == 2 && st[1].decl_tensors == 2 && st[0].decl_digest &&
		      st[0].decl_digest == st[1].decl_digest, "rank 0's declaration again: shard 0 "
		      "%d tensors (%016" PRIx64 "), shard 1 %d (%016" PRIx64 ")", st[0].decl_tensors,
		      st[0].decl_digest, st[1].decl_tensors, st[1].decl_digest);
	dec.c = c[1];
	dec.rank = 1;
	declare_tensors(&dec);
	ck_assert_msg(dec.rc == 0, "%s (%s)", dec.err, ps_strerror(dec.rc));
	ck_assert_msg(!memcmp(xa1, xa0, sizeof(xa0)) && !memcmp(ya1, ya0, sizeof(ya0)),
		      "rank 1's declared tensors differ from rank 0's initial values");
	declare_tables_all(c, 2);
	train_and_check(c, 1);
}

/* The new shards' refusal of the old files, in log f: old shard 1's file
 * declares nothing, old shard 0's the dead worker's 2 tensors. */
static int says_declarations_differ(const char *f, const char *old)
{
	char want[300];

	snprintf(want, sizeof(want), "%s/shard-1.ckpt: declares 0 tensors and 0 tables, "
		 "shard-0.ckpt 2 and 0", old);
	return tu_log_says(f, want);
}

/* A worker that dies with its declaration taken by one old shard of a
 * committed stop and not by the other (docs/elastic.md, "Declarations at
 * the stop"). Rank 1 ended clock 0, rank 0 (a process of its own) has not:
 * ps-stat stops both shards at clock 1, committed. Rank 0's Declare
 * reaches shard 0, which takes it (the stop waits for rank 0), and rank 0
 * is killed with SIGKILL before sending it to shard 1. Once rank 0 is
 * dropped (limits.drop_timeout_ms, 0.5 s) the clocks below 1 close and
 * both old shards write their checkpoints at 1 and exit 0: shard 0's with
 * the tensors, shard 1's without. 3 new shards started from them refuse
 * them, naming the file and what differs, and write nothing into the
 * checkpoint folder; rolled back (the files put back, as ps-local.sh
 * does), the old shards start again from their own files and serve; rank
 * 0 started again declares: shard 1 takes it, and 3 clocks of integer
 * gradients give the exact sums. */
START_TEST(test_declare_worker_dies_at_stop)
{
	char c2[160], c3[160], old[200], a[320], b[330];
	struct ps_client *c[NW], *mon;
	struct dying d;
	pid_t srv[3];
	int64_t id;

	limits_more = "  drop_timeout_ms: 500\n";
	setup_dirs();
	write_cfg("c2", 2, "", c2, sizeof(c2));
	ck_assert_msg(ps_config_load(&cfg, c2, a, sizeof(a)) == 0, "%s", a);
	live_point_at(c2);
	setenv("PS_CONFIG_FOLLOW", live_ptr, 1);
	for (int k = 0; k < 2; k++)
		srv[k] = live_start(c2, k, 0, NULL, 0);
	set_initial_values();
	dying_start(&d);
	c[1] = connect_retry(1);
	id = ps_client_push(c[1], 0, NULL, 0, PS_PUSH_END_CLOCK);
	ck_assert_msg(id > 0 && ps_client_wait(c[1], id) == 0, "%s", ps_client_error(c[1]));
	pstat_stop(c2, 1);
	mon = monitor();
	wait_committed(mon, 1);
	dying_declare_and_die(&d, mon);
	ps_client_free(mon);

	/* the stop goes on once rank 0 is dropped */
	for (int k = 0; k < 2; k++) {
		snprintf(a, sizeof(a), "%s/c2.yaml-shard-%d.log", dir, k);
		ck_assert_msg(tu_wait_exit(srv[k]) == 0, "old shard %d did not exit 0 at its stop "
			      "(%s)", k, a);
		ck_assert_msg(tu_log_says(a, "worker 0 left the live set") &&
			      tu_log_says(a, "stopped at clock 1 with its checkpoint written"),
			      "old shard %d (%s)", k, a);
		snprintf(b, sizeof(b), "%s.before", a);
		ck_assert_int_eq(rename(a, b), 0);
	}

	/* the new shards refuse the old files, writing nothing */
	live_move_old("from2", 2, 0, old, sizeof(old));
	write_cfg("c3", 3, "", c3, sizeof(c3));
	for (int k = 0; k < 3; k++)
		srv[k] = live_start(c3, k, 0, old, 2);
	for (int k = 0; k < 3; k++) {
		int rc = tu_wait_exit(srv[k]);
		snprintf(a, sizeof(a), "%s/c3.yaml-shard-%d.log", dir, k);
		ck_assert_msg(rc > 0 && rc < 128, "new shard %d: exit status %d (%s)", k, rc, a);
		ck_assert_msg(says_declarations_differ(a, old), "new shard %d does not name the "
			      "differing declarations (%s)", k, a);
	}
	ck_assert_msg(ck_empty_of_shards(a, sizeof(a)), "a new shard wrote %s", a);

	/* rolled back: the old files put back, the old shards started again */
	for (int k = 0; k < 2; k++) {
		snprintf(a, sizeof(a), "%s/shard-%d.ckpt", old, k);
		snprintf(b, sizeof(b), "%s/shard-%d.ckpt", ck, k);
		ck_assert_msg(rename(a, b) == 0, "%s: %s", a, strerror(errno));
		snprintf(a, sizeof(a), "%s/shard-%d.members", old, k);
		snprintf(b, sizeof(b), "%s/shard-%d.members", ck, k);
		ck_assert_msg(rename(a, b) == 0 || errno == ENOENT, "%s: %s", a, strerror(errno));
	}
	for (int k = 0; k < 2; k++)
		srv[k] = live_start(c2, k, 0, NULL, 0);
	for (int k = 0; k < 2; k++)
		ck_assert_msg(tu_wait_listen(cfg.shards[k].port), "old shard %d started again does "
			      "not listen (logs in %s)", k, dir);
	mon = monitor();
	redeclare_and_train(c, mon);
	ps_client_free(mon);
	stop_cluster(c, srv, 2);
	limits_more = "";
}
END_TEST

/* The same through ps-local.sh's live re-shard: `ps-local.sh c2.yaml
 * --servers-only` runs the 2 shards, the workers follow its
 * current-config, and `ps-local.sh c2.yaml reshard c3.yaml` stops them at
 * clock 1; rank 0 declares on shard 0 and is killed as above. The old
 * shards exit 0 at the stop once rank 0 is dropped; the new shards refuse
 * the old files (started again once, as ps-local.sh does, and refusing
 * again) and none wrote anything, so the re-shard rolls back: the reshard
 * command exits 1 saying so, the record ends `done rolled-back`, the old
 * shards run again from their files with the workers' follow file on
 * c2.yaml, and rank 0 declaring again completes the declaration: the
 * exact sums. */
START_TEST(test_declare_worker_dies_local_reshard)
{
	char c2[160], c3[160], a[300], l[200], co[200], ro[200], real[PATH_MAX];
	struct ps_client *c[NW], *mon;
	struct dying d;
	pid_t coord, rs;
	int64_t id;
	int rc;

	limits_more = "  drop_timeout_ms: 500\n";
	setup_dirs();
	write_cfg("c2", 2, "", c2, sizeof(c2));
	write_cfg("c3", 3, "", c3, sizeof(c3));
	ck_assert_msg(ps_config_load(&cfg, c2, a, sizeof(a)) == 0, "%s", a);
	snprintf(l, sizeof(l), "%s/l", dir);
	snprintf(co, sizeof(co), "%s/coord.out", dir);
	snprintf(ro, sizeof(ro), "%s/reshard.out", dir);
	const char *cargv[] = { "scripts/ps-local.sh", c2, "--servers-only", "--logs", l, NULL };
	const char *rargv[] = { "scripts/ps-local.sh", c2, "reshard", c3, NULL };
	coord = tu_spawn(cargv, co);
	for (int i = 0; i < 600 && !tu_log_says(co, "shards running"); i++)
		tu_sleep_ms(50);
	ck_assert_msg(tu_log_says(co, "shards running"), "ps-local.sh --servers-only (%s)", co);
	snprintf(a, sizeof(a), "%s/current-config", l);
	setenv("PS_CONFIG_FOLLOW", a, 1);
	set_initial_values();
	dying_start(&d);
	c[1] = connect_retry(1);
	id = ps_client_push(c[1], 0, NULL, 0, PS_PUSH_END_CLOCK);
	ck_assert_msg(id > 0 && ps_client_wait(c[1], id) == 0, "%s", ps_client_error(c[1]));
	rs = tu_spawn(rargv, ro);
	mon = monitor();
	wait_committed(mon, 1);
	dying_declare_and_die(&d, mon);
	ps_client_free(mon);

	rc = tu_wait_exit(rs);
	ck_assert_msg(rc == 1 && tu_log_says(ro, "rolled back to") &&
		      tu_log_says(ro, "the new shards did not start"), "ps-local.sh reshard: "
		      "status %d (%s; logs in %s)", rc, ro, l);
	/* the reason in the answer: the old files named, what differs */
	ck_assert_msg(tu_log_says(ro, "refusing to start: ") && tu_log_says(ro, "/shard-1.ckpt: "
		      "declares 0 tensors and 0 tables, shard-0.ckpt 2 and 0"), "ps-local.sh "
		      "reshard does not say why the new shards did not start (%s)", ro);
	for (int k = 0; k < 3; k++) {
		char want[120];
		snprintf(want, sizeof(want), "new shard %d ended with status 1 before the workers were "
			 "pointed at it: starting it again", k);
		ck_assert_msg(tu_log_says(co, want), "ps-local.sh: %s (%s)", want, co);
		snprintf(a, sizeof(a), "%s/server-%d.log", l, k);
		ck_assert_msg(tu_log_says(a, "declares 0 tensors and 0 tables, shard-0.ckpt 2 and 0"),
			      "new shard %d does not name the differing declarations (%s)", k, a);
	}
	snprintf(a, sizeof(a), "%s/reshard.intent", ck);
	ck_assert_msg(tu_log_says(a, "done rolled-back"), "the record (%s)", a);
	snprintf(a, sizeof(a), "%s/current-config", l);
	ck_assert_ptr_nonnull(realpath(c2, real));
	ck_assert_msg(tu_log_says(a, real), "the workers' follow file (%s) names another config "
		      "than %s", a, real);
	for (int k = 0; k < 2; k++)
		ck_assert_msg(tu_wait_listen(cfg.shards[k].port), "old shard %d started again does "
			      "not listen (logs in %s)", k, l);
	mon = monitor();
	redeclare_and_train(c, mon);
	ps_client_free(mon);
	for (int r = 0; r < NW; r++)
		ps_client_free(c[r]);
	/* ps-local.sh ends with 130 on SIGTERM, once its shards stopped */
	ck_assert_int_eq(kill(coord, SIGTERM), 0);
	rc = tu_wait_exit(coord);
	ck_assert_msg(rc == 130 && tu_log_says(co, "stopping every process"), "ps-local.sh "
		      "--servers-only: status %d (%s)", rc, co);

	unsetenv("PS_CONFIG_FOLLOW");
	cleanup_dirs();
	limits_more = "";
}
END_TEST

struct train_arg {
	struct ps_client *c;
	int rank, done;
};

static void *train_thread(void *arg)
{
	struct train_arg *a = arg;

	train(a->c, a->rank, NCLK);
	__atomic_store_n(&a->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

/* Row pushes of a declared table in flight at the switch: tensors and
 * table e declared on 2 shards, clocks 1..2 trained, both shards stopped
 * at 3 (prepared), each worker's row push for 3 refused and kept, then
 * the commits, 2 -> 3, and the pushes cut again for the new map (the
 * declared table is in the followed config): every row and weight the
 * exact sum of clocks 1..3, each applied once. */
START_TEST(test_declared_rows_in_flight_2_3)
{
	char c2[160], c3[160], err[600];
	struct ps_client *c[NW], *mon;
	struct ps_shard_stats st;
	struct call dec[NW];
	struct train_arg ta[NW];
	pthread_t th[NW];
	pid_t srv[3];

	start_cluster("c2", 2, "", c2, sizeof(c2), srv, c);
	for (int i = 0; i < NX; i++)
		xa0[i] = (float)(i % 13) - 6;
	for (int i = 0; i < NY * NY2; i++)
		ya0[i] = (float)(i % 11);
	memset(dec, 0, sizeof(dec));
	for (int r = 0; r < NW; r++) {
		dec[r].c = c[r];
		dec[r].rank = r;
		ck_assert_int_eq(pthread_create(&th[r], NULL, declare_thread, &dec[r]), 0);
	}
	for (int r = 0; r < NW; r++) {
		pthread_join(th[r], NULL);
		ck_assert_msg(dec[r].rc == 0, "%s", dec[r].err);
	}
	end_clock_empty(c);
	for (int k = 1; k < NCLK; k++)
		for (int r = 0; r < NW; r++)
			train(c[r], r, k);
	ck_assert_int_eq(ps_client_init(&mon, &cfg, -1, err, sizeof(err)), 0);
	for (int k = 0; k < 2; k++)
		ck_assert_msg(ps_client_stop_at(mon, k, NCLK, 0, &st) == 0, "%s",
			      ps_client_error(mon));
	memset(ta, 0, sizeof(ta));
	for (int r = 0; r < NW; r++) {
		ta[r].c = c[r];
		ta[r].rank = r;
		ck_assert_int_eq(pthread_create(&th[r], NULL, train_thread, &ta[r]), 0);
	}
	for (int r = 0; r < NW; r++)
		wait_pending(c[r], 1, "the row push for the stop's clock");
	for (int k = 0; k < 2; k++)
		ck_assert_msg(ps_client_stop_at(mon, k, NCLK, PS_STOP_COMMIT, &st) == 0, "%s",
			      ps_client_error(mon));
	ps_client_free(mon);
	for (int k = 0; k < 2; k++)
		ck_assert_msg(tu_wait_exit(srv[k]) == 0, "old shard %d did not exit 0 at its stop "
			      "(logs in %s)", k, dir);
	start_new_shards("from2", 2, "c3", 3, "", c3, sizeof(c3), srv);
	for (int r = 0; r < NW; r++)
		ck_assert_msg(!__atomic_load_n(&ta[r].done, __ATOMIC_ACQUIRE), "rank %d's clock %d "
			      "ended before the switch", r, NCLK);
	live_point_at(c3);
	for (int r = 0; r < NW; r++)
		pthread_join(th[r], NULL);
	for (int r = 0; r < NW; r++)
		ck_assert_uint_eq(c[r]->reshards, 1);
	train_and_check(c, NCLK + 1);
	stop_cluster(c, srv, 3);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("reshard_requests");
	TCase *tc = tcase_create("requests");

	tcase_set_timeout(tc, 120);
	TU_ADD(tc, test_declare_in_flight_2_3);
	TU_ADD(tc, test_stats_gone_shard_3_2);
	TU_ADD(tc, test_declare_during_stop);
	TU_ADD(tc, test_declare_tables_during_stop);
	TU_ADD(tc, test_declared_rows_in_flight_2_3);
	TU_ADD(tc, test_declare_partial_at_stop);
	TU_ADD(tc, test_declare_unfinished_at_stop);
	TU_ADD(tc, test_declare_worker_dies_at_stop);
	TU_ADD(tc, test_declare_worker_dies_local_reshard);
	suite_add_tcase(s, tc);
	return tu_run_suite(s);
}
