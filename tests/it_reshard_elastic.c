/* it_reshard_elastic.c - workers joining and leaving while the shards go
 * from 2 to 3 and back to 2 under them (docs/elastic.md, "Re-sharding
 * while the workers run"; docs/reliability.md, "Workers joining and
 * leaving"): the bit-identical test, with real shard processes and
 * worker clients in threads, one libps client each.
 *
 * Sync, cluster.workers 3, cluster.initial_workers 2, momentum 0.5 at lr
 * 1, 14 clocks. Ranks 0 and 1 start; rank 2 joins at clock 3 (the members
 * held before pushing clock 2 until its join is done: the join lands at
 * the clock after); the shards go 2 -> 3 at clock 5 (ps-stat
 * --reshard-stop, the workers following their $PS_CONFIG_FOLLOW file);
 * rank 1 leaves with its push of clock 6 (PS_PUSH_LEAVE, on 3 shards);
 * the shards go 3 -> 2 at clock 9 (ps_client_stop_at, the workers let go
 * between the stop and its commit: their pushes for 9 refused, kept and
 * sent again on the new map); rank 1 joins again at clock 11 on the final
 * map (ps_client_join on the client that left, which followed the second
 * re-shard while it was not a member). Tensors a and b take pseudo-random
 * gradients of mixed magnitude (1e-3 to 1e3, not integers: the order of
 * summation shows in the bits), c integer ones (its exact value is
 * checked).
 *
 * The reference is a second run on 2 shards without any re-shard, its
 * joins and leave gated to the same clocks. Both runs: each clock's
 * pushers are the planned members, and each member was told (the pull
 * reply's membership, ps_client_members) the planned count, its index,
 * the membership epoch and the data slots before it; the runs were told
 * the same, every weight of every rank is bit-identical between them
 * (memcmp), and c is its exact expected value.
 */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "config.h"
#include "ps_client.h"
#include "ps_client_int.h"
#include "ps_err.h"
#define RESHARD_TMPDIR "/tmp/ps-reshard-elastic-XXXXXX"
#include "test_reshard.h"
#include "test_util.h"

#define NA 3000 /* tensor a: non-integer gradients */
#define NB 1000 /* b: the same */
#define NC 500  /* c: integer gradients from zeros: its exact value is checked */
#define NW 3    /* worker ranks (cluster.workers) */
#define NCLK 14

/* The plan: rank 2 joins at JOIN2, the shards go 2 -> 3 at STOP1, rank 1
 * pushes its last clock LEAVE1 on 3 shards, 3 -> 2 at STOP2, rank 1 joins
 * again at JOIN1. */
#define JOIN2 3
#define STOP1 5
#define LEAVE1 6
#define STOP2 9
#define JOIN1 11

static int member_of(int r, int k)
{
	return r == 0 || (r == 1 && (k <= LEAVE1 || k >= JOIN1)) || (r == 2 && k >= JOIN2);
}

/* membership changes in effect at clock k */
static uint64_t epoch_of(int k)
{
	return (uint64_t)((k >= JOIN2) + (k > LEAVE1) + (k >= JOIN1));
}

/* What one run gives. */
struct run {
	int pushed[NCLK][NW];
	struct ps_members_info told[NCLK][NW];
	uint64_t joined_at[NW];
	float a[NW][NA], b[NW][NB], c[NW][NC];
};
static struct run runs[2]; /* 0: with the re-shards, 1: the reference */

static uint64_t mix(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Rank's gradient at clock k for element i of tensor t (0: a, 1: b): a
 * 24-bit fraction in [-0.5, 0.5) times 1e-3, 0.1, 1, 10 or 1e3. */
static float grad_f(int rank, int k, int t, int i)
{
	static const float scale[] = { 1e-3f, 0.1f, 1.0f, 10.0f, 1e3f };
	uint64_t h = mix((uint64_t)rank << 56 ^ (uint64_t)k << 40 ^ (uint64_t)t << 32 ^ (uint64_t)i);

	return ((float)(h >> 40) / 16777216.0f - 0.5f) * scale[h % 5];
}

/* Rank's integer gradient at clock k for element i of c. */
static float grad_i(int rank, int k, int i)
{
	return (float)((rank + 1) * ((k + i) % 7 - 3));
}

/* n shards' config (fresh ports) at dir/NAME.yaml, its path in out. */
static void write_cfg(const char *name, int n, char *out, size_t len)
{
	char yaml[2048], servers[256] = "";

	tu_servers_list(n, servers, sizeof(servers));
	snprintf(yaml, sizeof(yaml),
		 "cluster:\n  servers: [%s]\n  workers: %d\n  initial_workers: 2\n"
		 "slice_bytes: 1024\nseed: 5\n"
		 "optimizer:\n  name: momentum\n  lr: 1\n  momentum: 0.5\n"
		 "model:\n  tensors:\n    - {name: a, shape: [%d], init: arange}\n"
		 "    - {name: b, shape: [%d], init: normal}\n"
		 "    - {name: c, shape: [%d], init: zeros}\n"
		 "limits:\n  reconnect_timeout_ms: 60000\n  request_timeout_ms: 60000\n"
		 "checkpoint:\n  dir: %s\n  every_s: 0\nlog:\n  level: warn\n",
		 servers, NW, NA, NB, NC, ck);
	tu_write_named(dir, name, yaml, out, len);
}

/* The new shards of a re-shard from old_n shards (exited at their stop):
 * the old checkpoints set aside (live_move_old, as AS), the n-shard config
 * NAME written (its path in out) and its shards started from them into
 * srv. */
static void start_new_shards(const char *as, int old_n, const char *name, int n, char *out,
			     size_t len, pid_t *srv)
{
	char old[200];

	live_move_old(as, old_n, 0, old, sizeof(old));
	write_cfg(name, n, out, len);
	for (int k = 0; k < n; k++)
		srv[k] = live_start(out, k, 0, old, old_n);
}

/* ---- the workers: threads, each with its own client ---- */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static uint64_t gate;         /* workers wait before pushing this clock */
static uint64_t progress[NW]; /* clocks each has finished (pushed and pulled) */
static int go[NW];            /* main's word to rank 2 to start, to rank 1 to join again */
static int joined[NW];        /* the joins done */
static int failed;            /* a worker ended with an error */
static struct ps_config cur;  /* the config of the map a starting worker connects to */

struct wk {
	int rank, rc;
	char err[700];
	struct ps_client *c;
	struct run *out;
};
static struct wk wks[NW];

/* Waits until f(arg) holds under mu, 60 s at most; 0 or -1. */
static int wait_until(int (*f)(void *), void *arg)
{
	return tu_wait_cond(&mu, &cv, f, arg, 60);
}

static int gate_open(void *arg)
{
	return *(uint64_t *)arg < gate;
}

static int go_given(void *arg)
{
	return go[*(int *)arg];
}

/* rank arg[0] has joined arg[1] times, or a worker failed */
static int joined_n(void *arg)
{
	return joined[((int *)arg)[0]] >= ((int *)arg)[1] || failed;
}

/* every planned member of clock *arg has pulled it, or a worker failed */
static int members_at(void *arg)
{
	uint64_t k = *(uint64_t *)arg;

	if (failed)
		return 1;
	for (int r = 0; r < NW; r++)
		if (member_of(r, (int)k) && progress[r] < k)
			return 0;
	return 1;
}

static void set_word(int *word, int rank, uint64_t g)
{
	pthread_mutex_lock(&mu);
	if (word)
		word[rank] = 1;
	else
		gate = g;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
}

/* Pulls clock k into the rank's weights; the membership it told in *mi. */
static int pull(struct wk *w, uint64_t k, struct ps_members_info *mi)
{
	int r = w->rank;
	struct ps_tensor t[3] = { { .name = "a", .data = w->out->a[r], .count = NA },
				  { .name = "b", .data = w->out->b[r], .count = NB },
				  { .name = "c", .data = w->out->c[r], .count = NC } };
	int64_t id = ps_client_pull(w->c, k, t, 3);

	if (id < 0 || (w->rc = ps_client_wait(w->c, id))) {
		w->rc = w->rc ? w->rc : (int)id;
		snprintf(w->err, sizeof(w->err), "rank %d: pull %" PRIu64 ": %s", r, k,
			 ps_client_error(w->c));
		return -1;
	}
	ps_client_members(w->c, mi);
	return 0;
}

/* Rank w->rank's training, its error in w->rc and w->err. */
static void worker_run(struct wk *w)
{
	int r = w->rank;
	static __thread float ga[NA], gb[NB], gc[NC];
	struct ps_tensor tg[3] = { { .name = "a", .data = ga, .count = NA },
				   { .name = "b", .data = gb, .count = NB },
				   { .name = "c", .data = gc, .count = NC } };
	struct ps_members_info mi;
	uint64_t k;
	int64_t id;

	if (r == 2 && wait_until(go_given, &r)) {
		snprintf(w->err, sizeof(w->err), "rank 2 was not told to join");
		w->rc = -1;
		return;
	}
	for (int i = 0; i < 150; i++) { /* the shards may not listen yet */
		w->rc = ps_client_init(&w->c, &cur, r, w->err, sizeof(w->err));
		if (w->rc != -ECONNREFUSED)
			break;
		tu_sleep_ms(100);
	}
	if (w->rc)
		return;
	k = ps_client_clock(w->c); /* rank 2: the clock it joined at */
	pthread_mutex_lock(&mu);
	w->out->joined_at[r] = k;
	joined[r] = 1;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
	if (pull(w, k, &mi))
		return;
	while (k < NCLK) {
		if (wait_until(gate_open, &k)) {
			snprintf(w->err, sizeof(w->err), "rank %d, clock %" PRIu64 ": the gate stayed "
				 "shut", r, k);
			w->rc = -1;
			return;
		}
		for (int i = 0; i < NA; i++)
			ga[i] = grad_f(r, (int)k, 0, i);
		for (int i = 0; i < NB; i++)
			gb[i] = grad_f(r, (int)k, 1, i);
		for (int i = 0; i < NC; i++)
			gc[i] = grad_i(r, (int)k, i);
		id = ps_client_push(w->c, k, tg, 3, PS_PUSH_END_CLOCK |
				    (r == 1 && k == LEAVE1 ? PS_PUSH_LEAVE : 0));
		if (id < 0 || (w->rc = ps_client_wait(w->c, id))) {
			w->rc = w->rc ? w->rc : (int)id;
			snprintf(w->err, sizeof(w->err), "rank %d: push %" PRIu64 ": %s", r, k,
				 ps_client_error(w->c));
			return;
		}
		pthread_mutex_lock(&mu);
		w->out->pushed[k][r] = 1;
		w->out->told[k][r] = mi;
		pthread_mutex_unlock(&mu);
		if (r == 1 && k == LEAVE1) {
			/* not a member now; joins again when told (its client
			 * follows the re-shard meanwhile) */
			if (wait_until(go_given, &r)) {
				snprintf(w->err, sizeof(w->err), "rank 1 was not told to join again");
				w->rc = -1;
				return;
			}
			w->rc = ps_client_join(w->c);
			if (w->rc) {
				snprintf(w->err, sizeof(w->err), "rank 1: join again: %s",
					 ps_client_error(w->c));
				return;
			}
			k = ps_client_clock(w->c);
			pthread_mutex_lock(&mu);
			w->out->joined_at[r] = k;
			joined[r] = 2;
			progress[r] = k;
			pthread_cond_broadcast(&cv);
			pthread_mutex_unlock(&mu);
			if (pull(w, k, &mi))
				return;
			continue;
		}
		if (pull(w, k + 1, &mi))
			return;
		k++;
		pthread_mutex_lock(&mu);
		progress[r] = k;
		pthread_cond_broadcast(&cv);
		pthread_mutex_unlock(&mu);
	}
}

static void *worker(void *arg)
{
	struct wk *w = arg;

	worker_run(w);
	pthread_mutex_lock(&mu);
	failed |= w->rc != 0;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
	return NULL;
}

/* Waits for the planned members of clock k to have pulled it. */
static void wait_members(uint64_t k)
{
	ck_assert_msg(wait_until(members_at, &k) == 0 && !failed, "the members did not reach "
		      "clock %" PRIu64 " (logs in %s): %s | %s | %s", k, dir, wks[0].err, wks[1].err,
		      wks[2].err);
}

/* Rank r's join (its first, or rank 1's second), waited for. */
static void join_now(int r, int times)
{
	int want[2] = { r, times };

	set_word(go, r, 0);
	ck_assert_msg(wait_until(joined_n, want) == 0 && !failed, "rank %d did not join (logs in "
		      "%s): %s", r, dir, wks[r].err);
}

/* Loads the config at p into cur, for the workers that start now. */
static void load_cur(const char *p)
{
	char err[600];

	ck_assert_msg(ps_config_load(&cur, p, err, sizeof(err)) == 0, "%s", err);
}

/* One run: with the re-shards (reshard 1, following) or the reference on
 * 2 shards throughout; the same gates either way. Leaves the cluster's
 * Stats of shard 0 at the end in *st. */
static void one_run(int reshard, struct run *out, struct ps_shard_stats *st)
{
	char c2[160], c3[160], c2b[160], err[600];
	pid_t srv[3];
	pthread_t th[NW];
	struct ps_client *mon;
	struct ps_config *cfg3 = NULL;
	int nsrv = 2;

	memset(out, 0, sizeof(*out));
	memset(progress, 0, sizeof(progress));
	memset(go, 0, sizeof(go));
	memset(joined, 0, sizeof(joined));
	failed = 0;
	gate = JOIN2 - 1;
	write_cfg(reshard ? "c2" : "ref", 2, c2, sizeof(c2));
	load_cur(c2);
	if (reshard) {
		live_point_at(c2);
		setenv("PS_CONFIG_FOLLOW", live_ptr, 1);
	} else {
		unsetenv("PS_CONFIG_FOLLOW");
	}
	for (int k = 0; k < 2; k++)
		srv[k] = live_start(c2, k, 0, NULL, 0);
	for (int r = 0; r < NW; r++) {
		wks[r] = (struct wk){ .rank = r, .out = out };
		ck_assert_int_eq(pthread_create(&th[r], NULL, worker, &wks[r]), 0);
	}

	/* rank 2 joins while 0 and 1 hold before pushing JOIN2 - 1 */
	wait_members(JOIN2 - 1);
	join_now(2, 1);
	set_word(NULL, 0, STOP1);

	/* 2 -> 3 at STOP1 */
	wait_members(STOP1);
	if (reshard)
		pstat_stop(c2, STOP1);
	set_word(NULL, 0, STOP2); /* pushes for STOP1 meet stopped or gone shards */
	if (reshard) {
		for (int k = 0; k < 2; k++)
			ck_assert_int_eq(tu_wait_exit(srv[k]), 0);
		start_new_shards("from2", 2, "c3", 3, c3, sizeof(c3), srv);
		nsrv = 3;
		live_point_at(c3);
	}

	/* rank 1 leaves with its push of LEAVE1; 3 -> 2 at STOP2, stopped by
	 * hand, the workers let go between the stop and its commit */
	wait_members(STOP2);
	if (reshard) {
		cfg3 = malloc(sizeof(*cfg3));
		ck_assert_ptr_nonnull(cfg3);
		ck_assert_msg(ps_config_load(cfg3, c3, err, sizeof(err)) == 0, "%s", err);
		ck_assert_int_eq(ps_client_init(&mon, cfg3, -1, err, sizeof(err)), 0);
		for (int k = 0; k < 3; k++)
			ck_assert_msg(ps_client_stop_at(mon, k, STOP2, 0, st) == 0, "shard %d: %s", k,
				      ps_client_error(mon));
	}
	set_word(NULL, 0, JOIN1 - 1); /* reshard: their pushes for STOP2 are refused, kept */
	if (reshard) {
		for (int k = 0; k < 3; k++)
			ck_assert_msg(ps_client_stop_at(mon, k, STOP2, PS_STOP_COMMIT, st) == 0,
				      "shard %d: %s", k, ps_client_error(mon));
		ps_client_free(mon);
		free(cfg3);
		for (int k = 0; k < 3; k++)
			ck_assert_int_eq(tu_wait_exit(srv[k]), 0);
		start_new_shards("from3", 3, "c2b", 2, c2b, sizeof(c2b), srv);
		nsrv = 2;
		live_point_at(c2b);
	}

	/* rank 1 joins again while 0 and 2 hold before pushing JOIN1 - 1 */
	wait_members(JOIN1 - 1);
	join_now(1, 2);
	set_word(NULL, 0, UINT64_MAX);
	for (int r = 0; r < NW; r++) {
		pthread_join(th[r], NULL);
		ck_assert_msg(wks[r].rc == 0, "rank %d: %s (%s; logs in %s)", r, wks[r].err,
			      ps_strerror(wks[r].rc), dir);
	}
	for (int r = 0; r < NW; r++) {
		ps_client_free(wks[r].c);
		wks[r].c = NULL;
	}
	load_cur(reshard ? c2b : c2);
	ck_assert_int_eq(ps_client_init(&mon, &cur, -1, err, sizeof(err)), 0);
	ck_assert_msg(ps_client_stats(mon, 0, st) == 0, "%s", ps_client_error(mon));
	ps_client_free(mon);
	for (int k = 0; k < nsrv; k++)
		ck_assert_int_eq(tu_stop_server(srv[k]), 0);
	unsetenv("PS_CONFIG_FOLLOW");
}

/* c[i] after clocks 0..nclk-1 whose gradients came from the ranks r with
 * pushed(r, k): from zeros, momentum 0.5 at lr 1 over the clocks' sums;
 * every value on the way is a multiple of 2^-13 below 2^10, exact in
 * float whatever the order. */
static double c_exact(int i, int nclk, int (*pushed)(int r, int k))
{
	double v = 0, w = 0;

	for (int k = 0; k < nclk; k++) {
		double s = 0;
		for (int r = 0; r < NW; r++)
			s += pushed(r, k) ? grad_i(r, k, i) : 0;
		v = 0.5 * v + s;
		w -= v;
	}
	return w;
}

/* A run's membership as planned, the ranks' weights alike, c exact. */
static void check_run(const char *what, const struct run *u)
{
	uint64_t before = 0;

	ck_assert_msg(u->joined_at[2] == JOIN2 && u->joined_at[1] == JOIN1,
		      "%s: rank 2 joined at clock %" PRIu64 ", rank 1 again at %" PRIu64 "; planned "
		      "%d and %d", what, u->joined_at[2], u->joined_at[1], JOIN2, JOIN1);
	for (int k = 0; k < NCLK; k++) {
		int n = 0, idx[NW];

		for (int r = 0; r < NW; r++)
			idx[r] = member_of(r, k) ? n++ : -1;
		for (int r = 0; r < NW; r++) {
			const struct ps_members_info *m = &u->told[k][r];

			ck_assert_msg(u->pushed[k][r] == member_of(r, k), "%s: clock %d: rank %d %s",
				      what, k, r, member_of(r, k) ? "did not push" : "pushed");
			if (!member_of(r, k))
				continue;
			ck_assert_msg(m->clock == (uint64_t)k && m->count == n && m->index == idx[r] &&
				      m->epoch == epoch_of(k) && m->before == before,
				      "%s: rank %d was told for clock %d: clock %" PRIu64 ", %d members, "
				      "index %d, epoch %" PRIu64 ", %" PRIu64 " slots before; planned "
				      "%d, %d, %" PRIu64 ", %" PRIu64, what, r, k, m->clock, m->count,
				      m->index, m->epoch, m->before, n, idx[r], epoch_of(k), before);
		}
		before += (uint64_t)n;
	}
	for (int r = 1; r < NW; r++)
		ck_assert_msg(!memcmp(u->a[r], u->a[0], sizeof(u->a[0])) &&
			      !memcmp(u->b[r], u->b[0], sizeof(u->b[0])) &&
			      !memcmp(u->c[r], u->c[0], sizeof(u->c[0])),
			      "%s: rank %d's weights differ from rank 0's", what, r);
	for (int i = 0; i < NC; i++)
		ck_assert_msg((double)u->c[0][i] == c_exact(i, NCLK, member_of), "%s: c[%d] = %.9g, "
			      "exactly %.9g", what, i, (double)u->c[0][i],
			      c_exact(i, NCLK, member_of));
}

START_TEST(test_join_leave_2_3_2_bit_identical)
{
	struct ps_shard_stats st;
	struct run *x = &runs[0], *ref = &runs[1];
	char log[200];
	int order_shows = 0;

	setup_dirs();
	/* the gradients are such that the order of a 3-member sum shows */
	for (int i = 0; i < NA; i++) {
		float g0 = grad_f(0, JOIN2, 0, i), g1 = grad_f(1, JOIN2, 0, i), g2 = grad_f(2, JOIN2, 0, i);
		order_shows += (g0 + g1) + g2 != (g2 + g1) + g0;
	}
	ck_assert_int_gt(order_shows, NA / 20);

	/* the reference: 2 shards throughout, not following */
	one_run(0, ref, &st);
	check_run("reference", ref);
	for (int i = 1; i < NA; i++)
		ck_assert_msg(ref->a[0][i] != (float)i, "a[%d] was not trained", i);
	ck_assert_uint_eq(st.map_epoch, 0);
	ck_assert_int_eq(tu_rmtree(ck), 0);
	ck_assert_int_eq(mkdir(ck, 0700), 0);

	/* 2 -> 3 -> 2 under the joins and the leave */
	one_run(1, x, &st);
	check_run("2 -> 3 -> 2", x);
	ck_assert_uint_eq(st.map_epoch, 2);
	ck_assert_uint_eq(st.joins, 2); /* the membership went through both re-shards */
	ck_assert_uint_eq(st.leaves, 1);
	ck_assert_uint_eq(st.member_epoch, epoch_of(NCLK - 1));
	ck_assert_int_eq(st.nmembers, 3);
	snprintf(log, sizeof(log), "%s/c3.yaml-shard-2.log", dir);
	ck_assert_msg(tu_log_says(log, "re-sharded from 2 to 3 shards"), "%s: no re-shard", log);
	snprintf(log, sizeof(log), "%s/c2b.yaml-shard-0.log", dir);
	ck_assert_msg(tu_log_says(log, "re-sharded from 3 to 2 shards"), "%s: no re-shard", log);

	/* told the same, and every weight bit-identical */
	ck_assert_msg(!memcmp(x->pushed, ref->pushed, sizeof(x->pushed)) &&
		      !memcmp(x->told, ref->told, sizeof(x->told)),
		      "the membership per clock differs from the reference's");
	for (int i = 0; i < NA; i++)
		ck_assert_msg(!memcmp(&x->a[0][i], &ref->a[0][i], 4), "a[%d]: %.9g after 2 -> 3 -> 2, "
			      "%.9g on 2 shards throughout", i, (double)x->a[0][i],
			      (double)ref->a[0][i]);
	ck_assert_msg(!memcmp(x->a, ref->a, sizeof(x->a)) && !memcmp(x->b, ref->b, sizeof(x->b)) &&
		      !memcmp(x->c, ref->c, sizeof(x->c)),
		      "the weights after 2 -> 3 -> 2 differ from 2 shards throughout");
	cleanup_dirs();
}
END_TEST

/* ---- a join in flight when its client follows a re-shard ---- */

/* Who pushed c's gradient at clock k in test_join_in_flight: rank 0
 * throughout (rank 1 left with clock 0, with no gradient), rank 1 again
 * from clock 3. */
static int pushed_in_flight(int r, int k)
{
	return r == 0 || (r == 1 && k >= 3);
}

/* Rank's push of c's gradient for clock k, waited for. */
static void push_c(struct ps_client *c, int rank, int k)
{
	static float g[NC];
	struct ps_tensor t = { .name = "c", .data = g, .count = NC };
	int64_t id;

	for (int i = 0; i < NC; i++)
		g[i] = grad_i(rank, k, i);
	id = ps_client_push(c, (uint64_t)k, &t, 1, PS_PUSH_END_CLOCK);
	ck_assert_msg(id > 0 && ps_client_wait(c, id) == 0, "rank %d: push %d: %s", rank, k,
		      ps_client_error(c));
}

/* c at clock k into w, waited for. */
static void pull_c(struct ps_client *c, int k, float *w)
{
	struct ps_tensor t = { .name = "c", .data = w, .count = NC };
	int64_t id = ps_client_pull(c, (uint64_t)k, &t, 1);

	ck_assert_msg(id > 0 && ps_client_wait(c, id) == 0, "pull %d: %s", k, ps_client_error(c));
}

struct join_arg {
	struct ps_client *c;
	int rc;
};

static void *join_thread(void *arg)
{
	struct join_arg *j = arg;

	j->rc = ps_client_join(j->c);
	return NULL;
}

static int in_flight(struct ps_client *c)
{
	int n;

	pthread_mutex_lock(&c->mu);
	n = c->reqs != NULL;
	pthread_mutex_unlock(&c->mu);
	return n;
}

/* Rank 1 left with clock 0; the shards stop at clock 2 (ps-stat
 * --reshard-stop) and exit; rank 1 calls ps_client_join, whose first step
 * waits for the gone shard 0; 3 shards start from the checkpoints and the
 * follow file names them: the client follows, the step in flight fails
 * with PS_EMAP there (only pushes and pulls are sent again), and the join
 * starts again on the new map instead of failing: rank 1 joins at clock
 * 3 (the 3 shards' first open clock, 2, plus 1) and its gradients count
 * from there, exactly. */
START_TEST(test_join_in_flight)
{
	char c2[160], c3[160], err[600];
	static float w0[NC], w1[NC];
	struct ps_client *c0, *c1, *mon;
	struct ps_config *cfg3;
	struct join_arg ja = { 0 };
	struct ps_shard_stats st;
	pthread_t th;
	pid_t srv[3];
	int i;

	setup_dirs();
	write_cfg("c2", 2, c2, sizeof(c2));
	ck_assert_msg(ps_config_load(&cfg, c2, err, sizeof(err)) == 0, "%s", err);
	live_point_at(c2);
	setenv("PS_CONFIG_FOLLOW", live_ptr, 1);
	for (int k = 0; k < 2; k++)
		srv[k] = live_start(c2, k, 0, NULL, 0);
	c0 = connect_retry(0);
	c1 = connect_retry(1);
	ck_assert_msg(ps_client_leave(c1, 0) == 0, "%s", ps_client_error(c1));
	push_c(c0, 0, 0);
	push_c(c0, 0, 1);
	pull_c(c0, 2, w0);
	pstat_stop(c2, 2);
	for (int k = 0; k < 2; k++)
		ck_assert_int_eq(tu_wait_exit(srv[k]), 0);

	/* the join, its first step waiting for the gone shard 0 */
	ck_assert(!in_flight(c1));
	ja.c = c1;
	ck_assert_int_eq(pthread_create(&th, NULL, join_thread, &ja), 0);
	for (i = 0; i < 300 && !in_flight(c1); i++)
		tu_sleep_ms(10);
	ck_assert_msg(in_flight(c1), "rank 1's join sent nothing in 3 s");

	start_new_shards("from2", 2, "c3", 3, c3, sizeof(c3), srv);
	cfg3 = malloc(sizeof(*cfg3));
	ck_assert_ptr_nonnull(cfg3);
	ck_assert_msg(ps_config_load(cfg3, c3, err, sizeof(err)) == 0, "%s", err);
	for (int k = 0; k < 3; k++)
		ck_assert_msg(tu_wait_listen(cfg3->shards[k].port), "new shard %d does not listen", k);
	ck_assert_msg(ja.rc == 0 && in_flight(c1), "the join ended before the switch: %s",
		      ps_client_error(c1));
	live_point_at(c3);
	pthread_join(th, NULL);
	ck_assert_msg(ja.rc == 0, "join across the switch: %s (%s)", ps_strerror(ja.rc),
		      ps_client_error(c1));
	ck_assert_uint_eq(c1->reshards, 1);
	ck_assert_uint_eq(ps_client_clock(c1), 3);

	push_c(c0, 0, 2);
	push_c(c0, 0, 3);
	push_c(c1, 1, 3);
	pull_c(c0, 4, w0);
	pull_c(c1, 4, w1);
	for (i = 0; i < NC; i++)
		ck_assert_msg(w0[i] == c_exact(i, 4, pushed_in_flight) && w1[i] == w0[i],
			      "c[%d] = %.9g (rank 0), %.9g (rank 1), exactly %.9g", i, (double)w0[i],
			      (double)w1[i], c_exact(i, 4, pushed_in_flight));
	ck_assert_int_eq(ps_client_init(&mon, cfg3, -1, err, sizeof(err)), 0);
	for (int k = 0; k < 3; k++) {
		ck_assert_msg(ps_client_stats(mon, k, &st) == 0, "%s", ps_client_error(mon));
		ck_assert_uint_eq(st.joins, 1);
		ck_assert_uint_eq(st.leaves, 1);
		ck_assert_uint_eq(st.map_epoch, 1);
	}
	ps_client_free(mon);
	ps_client_free(c0);
	ps_client_free(c1);
	for (int k = 0; k < 3; k++)
		ck_assert_int_eq(tu_stop_server(srv[k]), 0);
	free(cfg3);
	unsetenv("PS_CONFIG_FOLLOW");
	cleanup_dirs();
}
END_TEST

int main(void)
{
	Suite *s = suite_create("reshard_elastic");
	TCase *tc = tcase_create("elastic");

	tcase_set_timeout(tc, 240);
	TU_ADD(tc, test_join_leave_2_3_2_bit_identical);
	TU_ADD(tc, test_join_in_flight);
	suite_add_tcase(s, tc);
	return tu_run_suite(s);
}
