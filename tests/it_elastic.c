/* it_elastic.c - workers joining and leaving a running cluster (two real
 * ps-server processes on loopback, worker clients in threads): exact sync
 * sums over the members of each clock, the membership every worker is told
 * for the clock it computes, the data slots it gives (each taken once), a
 * leave's delay to the others, async joins with resent pushes, refusals,
 * and ps-worker's data division (images and the ctr preset's click log):
 * every example once per epoch across a join and a leave. */
#include <check.h>
#include <dirent.h>
#include <sys/syscall.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include "ps_time.h"
#include "config.h"
#include "ps_client.h"
#include "ps_client_int.h"
#include "ps_err.h"
#include "test_util.h"

#define END 30           /* clocks of the sync run */
#define NW 3             /* worker ranks */
#define NT 3             /* tensors */

static struct ps_client *connect_retry(const struct ps_config *cfg, int rank, char *err, size_t n)
{
	struct ps_client *c = NULL;

	/* the shards may still be starting: any failure is tried again */
	for (int i = 0; i < 100; i++) {
		if (ps_client_init(&c, cfg, rank, err, n) == 0) {
			err[0] = '\0';
			return c;
		}
		tu_sleep_ms(100);
	}
	return NULL;
}

static int staleness = 1000; /* consistency.staleness of the async clusters */

static char *slurp(const char *path);

static void start_cluster(char *path, struct ps_config *cfg, const char *mode, const char *extra,
			  pid_t srv[2])
{
	char yaml[2048], err[512];

	snprintf(yaml, sizeof(yaml),
		 "%scluster:\n  servers: [%s:%d, %s:%d]\n  workers: %d\n%s"
		 "consistency:\n  mode: %s\n  staleness: %d\n"
		 "slice_bytes: 4096\n"
		 "optimizer:\n  name: sgd\n  lr: 1\n"
		 "model:\n  tensors:\n"
		 "    - {name: a, shape: [3000], init: arange}\n"
		 "    - {name: b, shape: [17, 33], init: arange}\n"
		 "    - {name: c, shape: [5], init: arange}\n"
		 "log:\n  level: warn\n",
		 tu_transport_yaml(), tu_host(), tu_free_port(), tu_host(), tu_free_port(), NW,
		 extra, mode, staleness);
	ck_assert_int_eq(tu_write_temp(path, yaml), 0);
	ck_assert_msg(ps_config_load(cfg, path, err, sizeof(err)) == 0, "%s", err);
	srv[0] = tu_start_server(path, 0);
	srv[1] = tu_start_server(path, 1);
}

static void stop_cluster(const char *path, const pid_t srv[2])
{
	ck_assert_int_eq(tu_stop_server(srv[0]), 0);
	ck_assert_int_eq(tu_stop_server(srv[1]), 0);
	unlink(path);
}

static void tensors_new(const struct ps_config *cfg, struct ps_tensor *t)
{
	for (int k = 0; k < NT; k++)
		t[k] = (struct ps_tensor){ cfg->tensors[k].name, calloc((size_t)cfg->tensors[k].count, 4),
					   cfg->tensors[k].count, 0 };
}

static void tensors_free(struct ps_tensor *t)
{
	for (int k = 0; k < NT; k++)
		free(t[k].data);
}

/* Integer gradient of worker rank at clock for element i of tensor t:
 * every sum is exact in float32. */
static float grad_value(int rank, int clock, int t, int64_t i)
{
	return (float)((rank + 1) * (int)((clock + i + t) % 7 - 3));
}

/* ---- sync: join, leave, rejoin ---- */

/* One run of a worker rank: starts once rank 0 has begun clock `after`,
 * pushes from the clock it is given to `last`, the push of `last`
 * carrying leave when `leave`. */
struct session {
	int rank, after, last, leave;
	int idx;
	int gate[2], gated[2]; /* rank 0: before pushing clock gate, wait for session gated's join */
	int leave_begin_at;    /* > 0: ps_client_leave_begin at this clock, then train to its last */
	int slow_ms;           /* a pause before each push: the others run ahead */
	const struct ps_config *cfg;
	char err[600];
	int first;
};

static _Atomic int progress;               /* rank 0's current clock */
static _Atomic int joined[4];              /* each session has joined (connected) */
static int pushed[END][NW];                /* who pushed which clock */
static struct ps_members_info told[END][NW]; /* what each was told for it */
static float *w0[NT], *wend[NT];           /* initial and final weights (rank 0) */
static pthread_mutex_t rec_mu = PTHREAD_MUTEX_INITIALIZER;

static void *session_run(void *arg)
{
	struct session *s = arg;
	struct ps_tensor g[NT], w[NT];
	struct ps_client *c;
	double deadline = ps_now_s() + 60;

	while (atomic_load(&progress) < s->after && ps_now_s() < deadline)
		tu_sleep_ms(5);
	c = connect_retry(s->cfg, s->rank, s->err, sizeof(s->err));
	if (!c)
		return NULL;
	atomic_store(&joined[s->idx], 1);
	tensors_new(s->cfg, g);
	tensors_new(s->cfg, w);
	s->first = (int)ps_client_clock(c);
	for (int clock = s->first; clock <= s->last; clock++) {
		int64_t id;
		struct ps_members_info mi;

		if (s->leave_begin_at && clock == s->leave_begin_at) {
			uint64_t last;
			if (ps_client_leave_begin(c, &last)) {
				snprintf(s->err, sizeof(s->err), "rank %d leave_begin: %s", s->rank,
					 ps_client_error(c));
				goto out;
			}
			s->last = (int)last;
			s->leave = 1;
		}
		id = ps_client_pull(c, (uint64_t)clock, w, NT);

		if (id < 0 || ps_client_wait(c, id)) {
			snprintf(s->err, sizeof(s->err), "rank %d pull %d: %s", s->rank, clock,
				 ps_client_error(c));
			goto out;
		}
		ps_client_members(c, &mi);
		if (s->rank == 0 && clock == 0)
			for (int k = 0; k < NT; k++)
				memcpy(w0[k], w[k].data, (size_t)w[k].count * 4);
		for (int k = 0; k < NT; k++)
			for (int64_t i = 0; i < g[k].count; i++)
				g[k].data[i] = grad_value(s->rank, clock, k, i);
		/* rank 0 alone would outrun a joiner: its clock waits (so the
		 * join lands before it) */
		for (int q = 0; q < 2; q++)
			while (s->gate[q] == clock && !atomic_load(&joined[s->gated[q]]) &&
			       ps_now_s() < deadline)
				tu_sleep_ms(2);
		if (s->slow_ms)
			tu_sleep_ms(s->slow_ms);
		id = ps_client_push(c, (uint64_t)clock, g, NT, PS_PUSH_END_CLOCK |
				    (s->leave && clock == s->last ? PS_PUSH_LEAVE : 0));
		if (id < 0 || ps_client_wait(c, id)) {
			snprintf(s->err, sizeof(s->err), "rank %d push %d: %s", s->rank, clock,
				 ps_client_error(c));
			goto out;
		}
		pthread_mutex_lock(&rec_mu);
		pushed[clock][s->rank] = 1;
		told[clock][s->rank] = mi;
		pthread_mutex_unlock(&rec_mu);
		if (s->rank == 0)
			atomic_store(&progress, clock + 1);
	}
	if (s->rank == 0) {
		int64_t id = ps_client_pull(c, END, w, NT);
		if (id < 0 || ps_client_wait(c, id))
			snprintf(s->err, sizeof(s->err), "final pull: %s", ps_client_error(c));
		for (int k = 0; k < NT; k++)
			memcpy(wend[k], w[k].data, (size_t)w[k].count * 4);
	}
out:
	tensors_free(g);
	tensors_free(w);
	ps_client_free(c);
	return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* After a run of sessions: the membership each worker was told for a
 * clock is who pushed it; the data slots (before + index) of every (rank,
 * clock) are 0..n-1, each once; the final weights (wend) are the initial
 * ones (w0) minus exactly the gradients pushed. Frees w0 and wend. */
static void check_told_slots_weights(const struct ps_config *cfg)
{
	/* the membership each worker was told for a clock is who pushed it */
	uint64_t slots[END * NW];
	int nslots = 0;
	for (int c = 0; c < END; c++) {
		int n = 0, idx[NW];
		for (int r = 0; r < NW; r++)
			idx[r] = pushed[c][r] ? n++ : -1;
		ck_assert_int_ge(n, 1);
		for (int r = 0; r < NW; r++) {
			if (!pushed[c][r])
				continue;
			ck_assert_uint_eq(told[c][r].clock, (uint64_t)c);
			ck_assert_msg(told[c][r].count == n && told[c][r].index == idx[r],
				      "clock %d rank %d: told %d members, index %d; %d pushed, its "
				      "index %d", c, r, told[c][r].count, told[c][r].index, n, idx[r]);
			slots[nslots++] = told[c][r].before + (uint64_t)told[c][r].index;
		}
	}
	qsort(slots, (size_t)nslots, sizeof(*slots), cmp_u64);
	for (int i = 0; i < nslots; i++)
		ck_assert_msg(slots[i] == (uint64_t)i, "data slot %d is %" PRIu64 ": one taken twice "
			      "or skipped", i, slots[i]);

	/* weights: the initial ones minus exactly the gradients pushed */
	for (int k = 0; k < NT; k++) {
		for (int64_t i = 0; i < cfg->tensors[k].count; i++) {
			float want = w0[k][i];
			for (int c = 0; c < END; c++) {
				float sum = 0;
				for (int r = 0; r < NW; r++)
					if (pushed[c][r])
						sum += grad_value(r, c, k, i);
				want -= sum;
			}
			ck_assert_msg(wend[k][i] == want, "%s[%lld] = %g, want %g",
				      cfg->tensors[k].name, (long long)i, (double)wend[k][i],
				      (double)want);
		}
		free(w0[k]);
		free(wend[k]);
	}

}

/* Rank 2 (not among cluster.initial_workers: 2) joins while ranks 0 and 1
 * train, rank 1 leaves after clock 9 and joins again later, rank 2 leaves
 * after the last clock. Every clock's update is exactly the sum of the
 * gradients of the ranks that pushed it, which are exactly the members the
 * pull replies named for it; the data slots (before + index) of every
 * (rank, clock) are 0..n-1, each once. _i 0: sync; _i 1: async with
 * consistency.staleness 0, where the same holds (docs/reliability.md). */
START_TEST(test_sync_join_leave_exact)
{
	char path[64];
	struct ps_config cfg;
	pid_t srv[2];
	pthread_t th[4];
	/* rank 0 waits before pushing clocks 12 and 22 until the joins of
	 * sessions 2 and 3 are done, so they land before it (between 5 and 13,
	 * 16 and 23) */
	struct session ss[4] = {
		{ .rank = 0, .after = 0, .last = END - 1, .gate = { 12, 22 }, .gated = { 2, 3 } },
		{ .rank = 1, .after = 0, .last = 9, .leave = 1, .gate = { -1, -1 } },
		{ .rank = 2, .after = 5, .last = END - 1, .leave = 1, .gate = { -1, -1 } },
		{ .rank = 1, .after = 16, .last = END - 1, .gate = { -1, -1 } },
	};

	/* async: rank 1 starts once rank 0 pulled the initial weights (its
	 * pushes would be applied before) */
	ss[1].after = _i;
	staleness = _i ? 0 : 1000;
	start_cluster(path, &cfg, _i ? "async" : "sync", "  initial_workers: 2\n", srv);
	staleness = 1000;
	memset(pushed, 0, sizeof(pushed));
	atomic_store(&progress, 0);
	for (int i = 0; i < 4; i++) {
		ss[i].idx = i;
		atomic_store(&joined[i], 0);
	}
	for (int k = 0; k < NT; k++) {
		w0[k] = calloc((size_t)cfg.tensors[k].count, 4);
		wend[k] = calloc((size_t)cfg.tensors[k].count, 4);
	}
	for (int i = 0; i < 3; i++) {
		ss[i].cfg = &cfg;
		ck_assert_int_eq(pthread_create(&th[i], NULL, session_run, &ss[i]), 0);
	}
	/* rank 1's second run starts once its first has left */
	ck_assert_int_eq(pthread_join(th[1], NULL), 0);
	ss[3].cfg = &cfg;
	ck_assert_int_eq(pthread_create(&th[3], NULL, session_run, &ss[3]), 0);
	for (int i = 0; i < 4; i++)
		if (i != 1)
			ck_assert_int_eq(pthread_join(th[i], NULL), 0);
	for (int i = 0; i < 4; i++)
		ck_assert_msg(!ss[i].err[0], "session %d: %s", i, ss[i].err);
	/* the joins happened at clocks no member had begun when they started
	 * (a session starts once rank 0 ended clock after - 1; rank 0's next
	 * pull is held for the others, so clock `after` itself may be the
	 * join's: async with staleness 0 got 16 for rank 1) */
	ck_assert_int_ge(ss[2].first, 5);
	ck_assert_int_le(ss[2].first, 13);
	ck_assert_int_ge(ss[3].first, 16);
	ck_assert_int_le(ss[3].first, 23);
	printf("measured: %s: rank 2 joined at clock %d (started once clock 4 ended), rank 1 left "
	       "after clock 9 and joined again at clock %d (started once clock 15 ended)\n",
	       _i ? "async, staleness 0" : "sync", ss[2].first, ss[3].first);

	check_told_slots_weights(&cfg);

	/* the shards count two joins and two leaves; epoch 4 at clock END */
	char err[512];
	struct ps_client *mon = connect_retry(&cfg, -1, err, sizeof(err));
	ck_assert_msg(mon != NULL, "%s", err);
	for (int k = 0; k < 2; k++) {
		struct ps_shard_stats st;
		ck_assert_int_eq(ps_client_stats(mon, k, &st), 0);
		ck_assert_uint_eq(st.joins, 2);
		ck_assert_uint_eq(st.leaves, 2);
		ck_assert_uint_eq(st.member_current, END);
		ck_assert_uint_eq(st.member_epoch, 4);
		ck_assert_int_eq(st.nmembers, 2); /* ranks 0 and 1 */
	}
	ps_client_free(mon);
	/* ps-stat shows the membership */
	char outp[] = "/tmp/ps-elastic-stat-XXXXXX";
	int fd = mkstemp(outp);
	ck_assert_int_ge(fd, 0);
	close(fd);
	const char *argv[] = { "bin/ps-stat", "--config", path, "--interval", "0.2", NULL };
	ck_assert_int_eq(tu_wait_child(tu_spawn(argv, outp)), 0);
	FILE *f = fopen(outp, "r");
	char text[8192] = "";
	size_t n = fread(text, 1, sizeof(text) - 1, f);
	text[n] = '\0';
	fclose(f);
	unlink(outp);
	ck_assert_msg(strstr(text, "epoch at clock  joins leaves members") &&
		      strstr(text, "     4       30      2      2 2: 0 1"), "%s", text);
	stop_cluster(path, srv);
}
END_TEST

/* Async with consistency.staleness 3: rank 2 joins while ranks 0 and 1
 * train, and rank 1 leaves later with ps_client_leave_begin. A shard
 * answers pulls up to 3 clocks past its slowest member, so the join lands
 * 3 clocks further than in sync (past every clock a worker may have been
 * told), and the leaver, counted at its clock when it began leaving, trains
 * the 3 clocks the others may have been told with it: each worker was told
 * exactly the members that pushed each clock, the data slots are taken
 * once each, and the sums are exact. */
START_TEST(test_async_join_leave_exact)
{
	char path[64], err[512];
	struct ps_config cfg;
	pid_t srv[2];
	pthread_t th[3];
	struct session ss[3] = {
		{ .rank = 0, .after = 0, .last = END - 1, .gate = { 12, -1 }, .gated = { 2, 0 } },
		/* rank 1 the slowest: the others are told clocks up to 3 past it */
		{ .rank = 1, .after = 1, .last = END - 1, .gate = { -1, -1 }, .leave_begin_at = 18,
		  .slow_ms = 20 },
		{ .rank = 2, .after = 5, .last = END - 1, .gate = { -1, -1 } },
	};

	staleness = 3;
	start_cluster(path, &cfg, "async", "  initial_workers: 2\n", srv);
	staleness = 1000;
	memset(pushed, 0, sizeof(pushed));
	atomic_store(&progress, 0);
	for (int i = 0; i < 3; i++) {
		ss[i].idx = i;
		ss[i].cfg = &cfg;
		atomic_store(&joined[i], 0);
	}
	for (int k = 0; k < NT; k++) {
		w0[k] = calloc((size_t)cfg.tensors[k].count, 4);
		wend[k] = calloc((size_t)cfg.tensors[k].count, 4);
	}
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(pthread_create(&th[i], NULL, session_run, &ss[i]), 0);
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(pthread_join(th[i], NULL), 0);
	for (int i = 0; i < 3; i++)
		ck_assert_msg(!ss[i].err[0], "session %d: %s", i, ss[i].err);
	ck_assert_int_gt(ss[2].first, 0); /* it joined a running cluster */
	ck_assert_int_ge(ss[1].last, 18 + 3);
	ck_assert_int_lt(ss[1].last, END - 1);
	printf("measured: async, staleness 3: rank 2 joined at clock %d (started after clock 5); "
	       "rank 1 began leaving at clock 18, trained up to clock %d\n", ss[2].first,
	       ss[1].last);
	/* rank 0's last pull may have come before the others' last pushes: the
	 * weights once everyone is done, from a client of a finished rank */
	struct ps_client *c = connect_retry(&cfg, 0, err, sizeof(err));
	ck_assert_msg(c != NULL, "%s", err);
	struct ps_tensor w[NT];
	tensors_new(&cfg, w);
	int64_t id = ps_client_pull(c, 0, w, NT);
	ck_assert_msg(id > 0 && ps_client_wait(c, id) == 0, "%s", ps_client_error(c));
	for (int k = 0; k < NT; k++)
		memcpy(wend[k], w[k].data, (size_t)w[k].count * 4);
	tensors_free(w);
	ps_client_free(c);
	check_told_slots_weights(&cfg);
	stop_cluster(path, srv);
}
END_TEST

/* ---- a leave's delay to the others ---- */

#define DCLOCKS 40
#define DLEAVE 19

struct dworker {
	int rank, vanish; /* rank 2: leave after DLEAVE, or just go away */
	const struct ps_config *cfg;
	double step_s[DCLOCKS];
	char err[300];
};

static void *dworker_run(void *arg)
{
	struct dworker *d = arg;
	struct ps_tensor g[NT], w[NT];
	struct ps_client *c = connect_retry(d->cfg, d->rank, d->err, sizeof(d->err));
	int last = d->rank == 2 ? DLEAVE : DCLOCKS - 1;

	if (!c)
		return NULL;
	tensors_new(d->cfg, g);
	tensors_new(d->cfg, w);
	for (int clock = 0; clock <= last; clock++) {
		double t0 = ps_now_s();
		int64_t id = ps_client_pull(c, (uint64_t)clock, w, NT);
		unsigned fl = PS_PUSH_END_CLOCK;

		if (d->rank == 2 && clock == last && !d->vanish)
			fl |= PS_PUSH_LEAVE;
		if (id < 0 || ps_client_wait(c, id) ||
		    (id = ps_client_push(c, (uint64_t)clock, g, NT, fl)) < 0 ||
		    ps_client_wait(c, id)) {
			snprintf(d->err, sizeof(d->err), "clock %d: %s", clock, ps_client_error(c));
			break;
		}
		d->step_s[clock] = ps_now_s() - t0;
	}
	tensors_free(g);
	tensors_free(w);
	ps_client_free(c);
	return NULL;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Three sync workers; rank 2 leaves after clock 19 with the leave flag
 * (_i 0), or goes away without it (_i 1: its connections close, the
 * others wait limits.drop_timeout_ms). The others' clock 20 (the barrier
 * their step 21 pulls after) takes at most
 * a heartbeat interval (idle_timeout_ms / 3) more than their median clock
 * when it leaves; the drop timeout when it vanishes. */
START_TEST(test_leave_delay)
{
	char path[64];
	struct ps_config cfg;
	pid_t srv[2];
	pthread_t th[3];
	struct dworker d[3];
	const double hb_s = 1.0, drop_s = 1.5;

	start_cluster(path, &cfg, "sync", "limits:\n  idle_timeout_ms: 3000\n"
		      "  drop_timeout_ms: 1500\n", srv);
	for (int r = 0; r < 3; r++) {
		d[r] = (struct dworker){ .rank = r, .vanish = _i, .cfg = &cfg };
		ck_assert_int_eq(pthread_create(&th[r], NULL, dworker_run, &d[r]), 0);
	}
	for (int r = 0; r < 3; r++)
		ck_assert_int_eq(pthread_join(th[r], NULL), 0);
	for (int r = 0; r < 2; r++) {
		double sorted[DCLOCKS];
		ck_assert_msg(!d[r].err[0], "rank %d: %s", r, d[r].err);
		ck_assert_msg(d[r].step_s[DCLOCKS - 1] > 0, "rank %d did not finish", r);
		memcpy(sorted, d[r].step_s, sizeof(sorted));
		qsort(sorted, DCLOCKS, sizeof(double), cmp_d);
		/* a step pulls the clock before it: clock 20's barrier is waited
		 * for in step 21 */
		double slow = d[r].step_s[DLEAVE + 1] > d[r].step_s[DLEAVE + 2]
				? d[r].step_s[DLEAVE + 1] : d[r].step_s[DLEAVE + 2];
		double delay = slow - sorted[DCLOCKS / 2];
		printf("measured: %s: rank %d's steps %d-%d took at most %.1f ms, its median step "
		       "%.1f ms: delay %.1f ms (heartbeat interval %.0f ms)\n",
		       _i ? "rank 2 went away without leaving" : "rank 2 left", r, DLEAVE + 1,
		       DLEAVE + 2, slow * 1e3, sorted[DCLOCKS / 2] * 1e3, delay * 1e3, hb_s * 1e3);
		if (!_i)
			ck_assert_msg(delay < hb_s, "a leave delayed rank %d by %.0f ms", r,
				      delay * 1e3);
		else
			ck_assert_msg(delay > drop_s * 0.8, "a vanished worker delayed rank %d by "
				      "%.0f ms only: no drop timeout?", r, delay * 1e3);
	}
	stop_cluster(path, srv);
}
END_TEST

/* ---- async: a joining worker's resent pushes apply once ---- */

static char nft_table[32];

static int nft(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int nft(const char *fmt, ...)
{
	char cmd[1024];
	va_list ap;
	int n = snprintf(cmd, sizeof(cmd), "nft ");

	va_start(ap, fmt);
	vsnprintf(cmd + n, sizeof(cmd) - (size_t)n, fmt, ap);
	va_end(ap);
	strncat(cmd, " 2>/dev/null", sizeof(cmd) - strlen(cmd) - 1);
	return system(cmd) == 0 ? 0 : -1;
}

static int nft_table_up(void)
{
	return nft("add table inet %s", nft_table) ||
	       nft("add chain inet %s out '{ type filter hook output priority 0; }'", nft_table)
	       ? -1 : 0;
}

/* Why nftables cannot be used here, or NULL when it can. */
static const char *nft_unusable(void)
{
	if (geteuid() != 0)
		return "not root";
	snprintf(nft_table, sizeof(nft_table), "ps_el_%d", (int)getpid());
	if (nft_table_up())
		return "nft cannot create a table (nftables missing, or no permission)";
	nft("delete table inet %s", nft_table);
	return NULL;
}

/* Client ports of the established connections to the shards' ports. */
static int client_ports(int p0, int p1, int *out, int max)
{
	FILE *f = fopen("/proc/net/tcp", "r");
	char line[512];
	int n = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f) && n < max) {
		unsigned lp, rp, st;
		if (sscanf(line, " %*d: %*x:%x %*x:%x %x", &lp, &rp, &st) == 3 && st == 1 &&
		    ((int)lp == p0 || (int)lp == p1))
			out[n++] = (int)rp;
	}
	fclose(f);
	return n;
}

/* Async, cluster.initial_workers 1: rank 1 joins and pushes 20 clocks;
 * the shards' answers to its clock-5 push are dropped (nftables) until it
 * gives its connections up, reconnects and resends the push. The weights
 * are exactly the initial ones minus every push once, and both shards
 * recognised the resent push. */
START_TEST(test_async_join_resend_once)
{
	char path[64], err[512];
	struct ps_config cfg;
	pid_t srv[2];
	struct ps_tensor g[NT], w[NT], init[NT];
	const char *why = nft_unusable();

	if (why) {
		tu_skip("async join with a resent push: %s", why);
		return;
	}
	start_cluster(path, &cfg, "async", "  initial_workers: 1\n"
		      "limits:\n  idle_timeout_ms: 800\n  reconnect_timeout_ms: 20000\n"
		      "  request_timeout_ms: 20000\n", srv);
	struct ps_client *c0 = connect_retry(&cfg, 0, err, sizeof(err));
	ck_assert_msg(c0 != NULL, "%s", err);
	tensors_new(&cfg, init);
	int64_t id = ps_client_pull(c0, 0, init, NT);
	ck_assert_msg(id > 0 && ps_client_wait(c0, id) == 0, "%s", ps_client_error(c0));
	ps_client_free(c0); /* the joiner's connections are then the only ones */
	struct ps_client *c1 = connect_retry(&cfg, 1, err, sizeof(err));
	ck_assert_msg(c1 != NULL, "%s", err);
	uint64_t first = ps_client_clock(c1);
	int p0 = cfg.shards[0].port, p1 = cfg.shards[1].port;
	tensors_new(&cfg, g);
	tensors_new(&cfg, w);
	for (int clock = 0; clock < 20; clock++) {
		for (int k = 0; k < NT; k++)
			for (int64_t i = 0; i < g[k].count; i++)
				g[k].data[i] = grad_value(1, clock, k, i);
		if (clock == 5) {
			int ports[8], n = client_ports(p0, p1, ports, 8);
			ck_assert_int_eq(n, 2);
			ck_assert_int_eq(nft_table_up(), 0);
			for (int i = 0; i < n; i++)
				ck_assert_int_eq(nft("add rule inet %s out tcp sport { %d, %d } "
						     "tcp dport %d drop", nft_table, p0, p1, ports[i]), 0);
		}
		id = ps_client_push(c1, first + (uint64_t)clock, g, NT, PS_PUSH_END_CLOCK);
		ck_assert_msg(id > 0, "%s", ps_client_error(c1));
		ck_assert_msg(ps_client_wait(c1, id) == 0, "push %d: %s", clock,
			      ps_client_error(c1));
		if (clock == 5)
			ck_assert_int_eq(nft("delete table inet %s", nft_table), 0);
	}
	id = ps_client_pull(c1, 0, w, NT);
	ck_assert_msg(id > 0 && ps_client_wait(c1, id) == 0, "%s", ps_client_error(c1));
	for (int k = 0; k < NT; k++)
		for (int64_t i = 0; i < w[k].count; i++) {
			float want = init[k].data[i];
			for (int clock = 0; clock < 20; clock++)
				want -= grad_value(1, clock, k, i);
			ck_assert_msg(w[k].data[i] == want, "%s[%lld] = %g, want %g: a push lost "
				      "or applied twice", w[k].name, (long long)i,
				      (double)w[k].data[i], (double)want);
		}
	uint64_t dups = 0;
	for (int k = 0; k < 2; k++) {
		struct ps_shard_stats st;
		ck_assert_int_eq(ps_client_stats(c1, k, &st), 0);
		ck_assert_uint_eq(st.joins, 1);
		dups += st.duplicate_pushes;
	}
	printf("measured: async join at clock %" PRIu64 ": %" PRIu64 " resent pushes recognised\n",
	       first, dups);
	ck_assert_uint_ge(dups, 2);
	tensors_free(g);
	tensors_free(w);
	tensors_free(init);
	ps_client_free(c1);
	stop_cluster(path, srv);
}
END_TEST

/* ---- ps-worker: every example once per epoch ---- */

#define FMNIST "/usr/share/datasets/fashion-mnist"

/* Lines of a file (0 when it is missing). */
static int count_lines(const char *path)
{
	FILE *f = fopen(path, "r");
	int n = 0, ch;

	if (!f)
		return 0;
	while ((ch = fgetc(f)) != EOF)
		n += ch == '\n';
	fclose(f);
	return n;
}

/* Waits until path has at least n lines (at most 60 s): 0, or -1. */
static int wait_lines(const char *path, int n)
{
	for (double t0 = ps_now_s(); ps_now_s() - t0 < 60; tu_sleep_ms(20))
		if (count_lines(path) >= n)
			return 0;
	return -1;
}

/* The SigBlk mask of process pid's main thread (its /proc status), or 0
 * when it cannot be read. */
static unsigned long long main_thread_sigblk(pid_t pid)
{
	char path[64], line[256];
	unsigned long long mask = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/task/%d/status", (int)pid, (int)pid);
	if (!(f = fopen(path, "r")))
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "SigBlk: %llx", &mask) == 1)
			break;
	fclose(f);
	return mask;
}

/* ps-worker ranks 0 and 1 train the config at path (cluster.initial_workers
 * 2, shards already started: srv), rank 2 starts once they have trained a
 * few steps and joins, and (with sigterm) rank 1 gets SIGTERM once rank 2
 * has trained a few: over every one of `epochs` epochs the recorded
 * batches (--record-examples) hold each of the `limit` examples exactly
 * once, the join came after clock 0 and the leave before the last clock.
 * what names the data in the measured line. */
static void data_once(const char *what, const char *path, const char *dir, pid_t srv[2],
		      int limit, int batch, int epochs, int sigterm)
{
	char rec[3][128], out[3][128];
	pid_t w[3];

	for (int r = 0; r < 3; r++) {
		snprintf(rec[r], sizeof(rec[r]), "%s/rec-%d.txt", dir, r);
		snprintf(out[r], sizeof(out[r]), "%s/worker-%d.out", dir, r);
	}
	for (int r = 0; r < 3; r++) {
		char rk[8];
		snprintf(rk, sizeof(rk), "%d", r);
		const char *argv[] = { "bin/ps-worker", "--config", path, "--rank", rk,
				       "--record-examples", rec[r], NULL };
		if (r == 2)
			ck_assert_msg(wait_lines(rec[0], 10) == 0, "rank 0 trains no steps");
		w[r] = tu_spawn(argv, out[r]);
	}
	ck_assert_msg(wait_lines(rec[2], 10) == 0, "rank 2 never trained");
	/* no stop signal may be handled on the threads that run oneDNN's
	 * kernels, which point rsp into the heap (worker/stop_signal.c): the
	 * main thread blocks them, and so every thread it starts */
	for (int r = 0; r < 3; r++) {
		unsigned long long blk = main_thread_sigblk(w[r]);
		unsigned long long want = (1ull << (SIGTERM - 1)) | (1ull << (SIGINT - 1));
		ck_assert_msg((blk & want) == want, "rank %d's main thread blocks %#llx, not "
			      "SIGTERM and SIGINT", r, blk);
	}
	if (sigterm)
		kill(w[1], SIGTERM);
	int st1 = tu_wait_child(w[1]), st0 = tu_wait_child(w[0]), st2 = tu_wait_child(w[2]);
	ck_assert_int_eq(tu_stop_server(srv[0]), 0);
	ck_assert_int_eq(tu_stop_server(srv[1]), 0);
	ck_assert_msg(st0 == 0 && st2 == 0 && st1 == (sigterm ? 130 : 0), "exit statuses %d %d %d "
		      "(outputs in %s)", st0, st1, st2, dir);
	/* each started its stop signals' thread: none warns that it did not */
	for (int r = 0; r < 3; r++) {
		char *o = slurp(out[r]);
		ck_assert_msg(o && !strstr(o, "stop signals: no thread"), "rank %d's output: %s", r,
			      o ? o : "(none)");
		free(o);
	}

	/* seen[e * limit + i]: how often epoch e trained example i; at[e *
	 * limit + p]: the example at place p of epoch e's order, + 1 */
	unsigned char *seen = calloc((size_t)epochs * (size_t)limit, 1);
	int *at = calloc((size_t)epochs * (size_t)limit, sizeof(int));
	long slots = limit / batch;
	uint64_t first[3] = { UINT64_MAX, UINT64_MAX, UINT64_MAX }, last[3] = { 0 }, top = 0;
	ck_assert_ptr_nonnull(seen);
	ck_assert_ptr_nonnull(at);
	for (int r = 0; r < 3; r++) {
		FILE *f = fopen(rec[r], "r");
		unsigned long long clock;
		long e, g;
		ck_assert_ptr_nonnull(f);
		while (fscanf(f, "%llu %ld %ld", &clock, &e, &g) == 3) {
			ck_assert_msg(e >= 0 && e < epochs, "epoch %ld recorded", e);
			for (int k = 0; k < batch; k++) {
				int i;
				ck_assert_int_eq(fscanf(f, "%d", &i), 1);
				ck_assert_msg(i >= 0 && i < limit, "example %d", i);
				seen[(size_t)e * (size_t)limit + (size_t)i]++;
				long pl = (g - e * slots) * batch + k;
				if (pl >= 0 && pl < limit)
					at[(size_t)e * (size_t)limit + (size_t)pl] = i + 1;
			}
			first[r] = clock < first[r] ? clock : first[r];
			last[r] = clock > last[r] ? clock : last[r];
			top = clock > top ? clock : top;
		}
		fclose(f);
	}
	for (int e = 0; e < epochs; e++)
		for (int i = 0; i < limit; i++)
			ck_assert_msg(seen[(size_t)e * (size_t)limit + (size_t)i] == 1, "epoch %d "
				      "trained example %d %d times", e, i,
				      seen[(size_t)e * (size_t)limit + (size_t)i]);
	free(seen);
	/* each epoch in an order of its own (shuffled again per epoch): an
	 * example at the same place as in the epoch before is chance */
	for (int e = 1; e < epochs; e++) {
		int same = 0;
		for (int q = 0; q < limit; q++)
			same += at[(size_t)e * (size_t)limit + (size_t)q] ==
				at[(size_t)(e - 1) * (size_t)limit + (size_t)q];
		ck_assert_msg(same < limit / 10, "epoch %d put %d of %d examples where epoch %d had "
			      "them: not shuffled again", e, same, limit, e - 1);
	}
	free(at);
	printf("measured: ps-worker %s data: rank 2 joined at clock %llu, rank 1 left after "
	       "clock %llu, %llu clocks; each of %d examples once in each of %d epochs\n", what,
	       (unsigned long long)first[2], (unsigned long long)last[1],
	       (unsigned long long)top + 1, limit, epochs);
	ck_assert_uint_gt(first[2], 0);
	if (sigterm)
		ck_assert_uint_lt(last[1], top);
	ck_assert_uint_lt(first[2], last[1]); /* three members for a while */
}

/* The images of the dense models (worker/epoch.c): 1,200 Fashion-MNIST
 * training images, batches of 20, 12 epochs. */
START_TEST(test_worker_data_once)
{
	char path[64], dir[] = "/tmp/ps-elastic-XXXXXX", yaml[1024];
	pid_t srv[2];
	enum { limit = 1200, batch = 20, epochs = 12 };
	char p[300];

	snprintf(p, sizeof(p), "%s/train-images-idx3-ubyte.gz", FMNIST);
	if (access(p, R_OK)) {
		tu_skip("ps-worker data division: %s not readable (Debian's dataset-fashion-mnist)",
			p);
		return;
	}
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(yaml, sizeof(yaml),
		 "cluster:\n  servers: [127.0.0.1:%d, 127.0.0.1:%d]\n  workers: 3\n"
		 "  initial_workers: 2\nseed: 7\nslice_bytes: 64KiB\nmodel: {preset: mlp}\n"
		 "train: {batch: %d, limit: %d, epochs: %d, data_dir: '%s', metrics_dir: '%s'}\n"
		 "optimizer: {name: sgd, lr: 0.05}\nlog: {level: info}\n",
		 tu_free_port(), tu_free_port(), batch, limit, epochs, FMNIST, dir);
	ck_assert_int_eq(tu_write_temp(path, yaml), 0);
	srv[0] = tu_start_server(path, 0);
	srv[1] = tu_start_server(path, 1);
	data_once("image", path, dir, srv, limit, batch, epochs, 1);
	unlink(path);
	tu_rmtree(dir);
}
END_TEST

/* The ctr preset (worker/ctr_train.c): a click log of 2,000 examples from
 * ps-ctrgen, an embedding table on the shards, batches of 20, 10 epochs;
 * _i 0 sync, _i 1 async with consistency.staleness 2 (the join lands past
 * the clocks the others may have started; the SIGTERM'd worker trains on
 * through those the others may have been told with it: ps_client_leave_begin). */
START_TEST(test_ctr_data_once)
{
	char path[64], dir[] = "/tmp/ps-elastic-ctr-XXXXXX", yaml[1400], train[128], test[128];
	char gen[128];
	pid_t srv[2];
	enum { limit = 2000, batch = 20, epochs = 10 };

	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(train, sizeof(train), "%s/train.tsv", dir);
	snprintf(test, sizeof(test), "%s/test.tsv", dir);
	snprintf(gen, sizeof(gen), "%s/gen.out", dir);
	const char *a1[] = { "bin/ps-ctrgen", "--out", train, "--samples", "2000", "--scale",
			     "0.001", "--seed", "3", NULL };
	const char *a2[] = { "bin/ps-ctrgen", "--out", test, "--samples", "200", "--skip", "2000",
			     "--scale", "0.001", "--seed", "3", NULL };
	ck_assert_int_eq(tu_wait_child(tu_spawn(a1, gen)), 0);
	ck_assert_int_eq(tu_wait_child(tu_spawn(a2, gen)), 0);
	snprintf(yaml, sizeof(yaml),
		 "cluster:\n  servers: [127.0.0.1:%d, 127.0.0.1:%d]\n  workers: 3\n"
		 "  initial_workers: 2\nseed: 7\n%s"
		 "model:\n  preset: ctr\n  embeddings:\n    - {name: cat, dim: 8, init: uniform, "
		 "scale: 0.01, optimizer: rowwise_adagrad, lr: 0.05}\n"
		 "optimizer: {name: adam, lr: 0.001}\n"
		 "train: {batch: %d, epochs: %d, train_file: '%s', test_file: '%s', "
		 "metrics_dir: '%s'}\nlog: {level: info}\n",
		 tu_free_port(), tu_free_port(),
		 _i ? "consistency: {mode: async, staleness: 2}\n" : "", batch, epochs, train, test,
		 dir);
	ck_assert_int_eq(tu_write_temp(path, yaml), 0);
	srv[0] = tu_start_server(path, 0);
	srv[1] = tu_start_server(path, 1);
	/* rank 1 leaves on SIGTERM (its handler once ran on the main thread
	 * inside oneDNN's GEMM kernels and corrupted the heap about 1 run in 10:
	 * worker/stop_signal.c) */
	data_once(_i ? "ctr (async, staleness 2)" : "ctr", path, dir, srv, limit, batch, epochs, 1);
	unlink(path);
	tu_rmtree(dir);
}
END_TEST

/* Reads one worker's --record-examples file: the clocks it trained (first,
 * last, and whether they run without a gap) and every slot it took into
 * taken[slot] (counted), slots below nslots. */
static void read_slots(const char *path, int batch, unsigned char *taken, long nslots,
		       uint64_t *first, uint64_t *last, int *gap)
{
	FILE *f = fopen(path, "r");
	unsigned long long clock;
	long e, g;

	ck_assert_ptr_nonnull(f);
	*first = UINT64_MAX;
	*last = 0;
	*gap = 0;
	while (fscanf(f, "%llu %ld %ld", &clock, &e, &g) == 3) {
		for (int k = 0; k < batch; k++) {
			int i;
			ck_assert_int_eq(fscanf(f, "%d", &i), 1);
		}
		ck_assert_msg(g >= 0 && g < nslots, "%s: slot %ld", path, g);
		taken[g]++;
		if (*first != UINT64_MAX && clock != *last + 1)
			*gap = 1;
		if (*first == UINT64_MAX)
			*first = clock;
		*last = clock;
	}
	fclose(f);
}

/* A member that never trains: rank 2 a client that connects and pushes
 * nothing (as it_rows_model's checker, which only pushes rows), ranks 0
 * and 1 ps-worker on the ctr preset, async with a staleness of 10^6, told
 * to leave (SIGTERM). Rank 2 is the slowest member at clock 0 for ever,
 * so the slowest-clock rule lets the others run to clock 10^6: a leave
 * that had to train up to there (its freeze plus the staleness) never
 * came, and each worker ran on until the 10 s grace alarm ended it
 * ("still in a step 10 s after the stop signal"). Each leaves now after
 * the highest clock told with it (the others wait there): by its own
 * stop, status 130, every clock up to its last trained, no slot taken
 * twice. */
START_TEST(test_ctr_idle_member_leave)
{
	char path[64], dir[] = "/tmp/ps-elastic-idle-XXXXXX", yaml[1400], train[128], test[128];
	char gen[128], rec[2][128], out[2][128], err[512];
	pid_t srv[2], w[2];
	struct ps_config cfg;
	enum { batch = 20, nslots = 1 << 20 };

	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(train, sizeof(train), "%s/train.tsv", dir);
	snprintf(test, sizeof(test), "%s/test.tsv", dir);
	snprintf(gen, sizeof(gen), "%s/gen.out", dir);
	const char *a1[] = { "bin/ps-ctrgen", "--out", train, "--samples", "2000", "--scale",
			     "0.001", "--seed", "3", NULL };
	const char *a2[] = { "bin/ps-ctrgen", "--out", test, "--samples", "200", "--skip", "2000",
			     "--scale", "0.001", "--seed", "3", NULL };
	ck_assert_int_eq(tu_wait_child(tu_spawn(a1, gen)), 0);
	ck_assert_int_eq(tu_wait_child(tu_spawn(a2, gen)), 0);
	snprintf(yaml, sizeof(yaml),
		 "cluster:\n  servers: [127.0.0.1:%d, 127.0.0.1:%d]\n  workers: 3\nseed: 7\n"
		 "consistency: {mode: async, staleness: 1000000}\n"
		 "model:\n  preset: ctr\n  embeddings:\n    - {name: cat, dim: 8, init: uniform, "
		 "scale: 0.01, optimizer: rowwise_adagrad, lr: 0.05}\n"
		 "optimizer: {name: adam, lr: 0.001}\n"
		 "train: {batch: %d, epochs: 1000, train_file: '%s', test_file: '%s', "
		 "metrics_dir: '%s'}\nlog: {level: info}\n",
		 tu_free_port(), tu_free_port(), batch, train, test, dir);
	ck_assert_int_eq(tu_write_temp(path, yaml), 0);
	ck_assert_msg(ps_config_load(&cfg, path, err, sizeof(err)) == 0, "%s", err);
	srv[0] = tu_start_server(path, 0);
	srv[1] = tu_start_server(path, 1);
	struct ps_client *idle = connect_retry(&cfg, 2, err, sizeof(err));
	ck_assert_msg(idle, "%s", err);
	for (int r = 0; r < 2; r++) {
		char rk[8];
		snprintf(rec[r], sizeof(rec[r]), "%s/rec-%d.txt", dir, r);
		snprintf(out[r], sizeof(out[r]), "%s/worker-%d.out", dir, r);
		snprintf(rk, sizeof(rk), "%d", r);
		const char *argv[] = { "bin/ps-worker", "--config", path, "--rank", rk,
				       "--record-examples", rec[r], NULL };
		w[r] = tu_spawn(argv, out[r]);
	}
	for (int r = 0; r < 2; r++)
		ck_assert_msg(wait_lines(rec[r], 10) == 0, "rank %d trains no steps", r);
	for (int r = 0; r < 2; r++)
		kill(w[r], SIGTERM);
	int st[2] = { tu_wait_child(w[0]), tu_wait_child(w[1]) };
	ps_client_free(idle);
	ck_assert_int_eq(tu_stop_server(srv[0]), 0);
	ck_assert_int_eq(tu_stop_server(srv[1]), 0);
	unlink(path);
	for (int r = 0; r < 2; r++) {
		char text[1500];
		FILE *f = fopen(out[r], "r");
		ck_assert_ptr_nonnull(f);
		fseek(f, 0, SEEK_END);
		long sz = ftell(f); /* the log's tail is what matters */
		fseek(f, sz > (long)sizeof(text) - 1 ? sz - (long)sizeof(text) + 1 : 0, SEEK_SET);
		text[fread(text, 1, sizeof(text) - 1, f)] = '\0';
		fclose(f);
		ck_assert_msg(st[r] == 130 && !strstr(text, "still in a step") &&
			      strstr(text, "stopped by signal"), "rank %d: status %d, not its own "
			      "leave after the stop signal (output in %s):\n%s", r, st[r], out[r],
			      text);
	}
	unsigned char *taken = calloc(nslots, 1);
	uint64_t first[2], last[2];
	int gap[2];
	ck_assert_ptr_nonnull(taken);
	for (int r = 0; r < 2; r++) {
		read_slots(rec[r], batch, taken, nslots, &first[r], &last[r], &gap[r]);
		ck_assert_msg(!gap[r], "rank %d skipped a clock between %llu and %llu", r,
			      (unsigned long long)first[r], (unsigned long long)last[r]);
	}
	for (long g = 0; g < nslots; g++)
		ck_assert_msg(taken[g] <= 1, "slot %ld trained %d times", g, taken[g]);
	free(taken);
	printf("measured: ps-worker ctr beside a member that never trains: ranks 0 and 1 left "
	       "after clocks %llu and %llu on SIGTERM\n", (unsigned long long)last[0],
	       (unsigned long long)last[1]);
	tu_rmtree(dir);
}
END_TEST

/* A thread of process pid (not its first) that does not block signal
 * sig, from /proc/PID/task/TID/status's SigBlk, and does not wait for it
 * in sigwait (whose wait unblocks what it waits for: stop_signal.c's own
 * thread, in rt_sigtimedwait, syscall 128 on x86-64 as
 * /proc/PID/task/TID/syscall says); 0 when none. */
static pid_t unblocked_thread(pid_t pid, int sig)
{
	char p[64], line[256];
	pid_t found = 0;
	struct dirent *e;
	DIR *d;

	snprintf(p, sizeof(p), "/proc/%d/task", (int)pid);
	if (!(d = opendir(p)))
		return 0;
	while (!found && (e = readdir(d))) {
		pid_t tid = (pid_t)atoi(e->d_name);
		FILE *f;
		if (tid <= 0 || tid == pid)
			continue;
		snprintf(p, sizeof(p), "/proc/%d/task/%d/syscall", (int)pid, (int)tid);
		if ((f = fopen(p, "r"))) {
			long nr = -1;
			int waits = fscanf(f, "%ld", &nr) == 1 && nr == SYS_rt_sigtimedwait;
			fclose(f);
			if (waits)
				continue;
		}
		snprintf(p, sizeof(p), "/proc/%d/task/%d/status", (int)pid, (int)tid);
		if (!(f = fopen(p, "r")))
			continue;
		while (fgets(line, sizeof(line), f))
			if (!strncmp(line, "SigBlk:", 7) &&
			    !(strtoull(line + 7, NULL, 16) & (1ull << (sig - 1))))
				found = tid;
		fclose(f);
	}
	closedir(d);
	return found;
}

/* The grace alarm (worker/stop_signal.c): a ps-worker told to stop while
 * its step waits for what will not come (a sync barrier of two workers
 * whose other never starts) exits 130 PS_STOP_GRACE_S (10 s) after the
 * first SIGTERM, saying so; a second SIGTERM 5 s in does not start the
 * grace again (the worker would be gone only at 15 s); OpenBLAS kept to
 * the calling thread (OPENBLAS_NUM_THREADS=1: its pool would leave the
 * signals unblocked), so the thread of stop_signal.c is the only one that
 * can take them, and takes both. _i 1: the thread
 * that takes the signals could not be started (its pthread_create failed,
 * by libpsfault.so): the worker says so and the signals reach the same
 * actions as handlers, on any thread. _i 2: SIGINT sent to a thread
 * started before main (OpenBLAS's pool, which does not block the signals)
 * is taken by the same action as a handler, not by the default one that
 * ends the process at once. */
START_TEST(test_stop_grace)
{
	char path[64], dir[] = "/tmp/ps-elastic-grace-XXXXXX", yaml[1024], out[128];
	char p[300];
	pid_t srv[2];

	snprintf(p, sizeof(p), "%s/train-images-idx3-ubyte.gz", FMNIST);
	if (access(p, R_OK)) {
		tu_skip("the stop grace: %s not readable (Debian's dataset-fashion-mnist)", p);
		return;
	}
	if (_i == 1 && SANITIZED) {
		tu_skip("the stop grace without the signal thread: libpsfault.so cannot come "
			"before the sanitizer's runtime");
		return;
	}
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(out, sizeof(out), "%s/worker-0.out", dir);
	snprintf(yaml, sizeof(yaml),
		 "cluster:\n  servers: [127.0.0.1:%d, 127.0.0.1:%d]\n  workers: 2\nseed: 7\n"
		 "model: {preset: mlp}\ntrain: {batch: 20, limit: 200, epochs: 100, data_dir: '%s'}\n"
		 "optimizer: {name: sgd, lr: 0.05}\nlimits: {request_timeout_ms: 120000}\n"
		 "log: {level: info}\n",
		 tu_free_port(), tu_free_port(), FMNIST);
	ck_assert_int_eq(tu_write_temp(path, yaml), 0);
	srv[0] = tu_start_server(path, 0);
	srv[1] = tu_start_server(path, 1);
	const char *argv[] = { "bin/ps-worker", "--config", path, "--rank", "0", NULL };
	if (_i == 0)
		setenv("OPENBLAS_NUM_THREADS", "1", 1);
	if (_i == 1) {
		/* the first thread started after main: OpenBLAS's pool (started
		 * by its constructor) kept to the calling thread */
		char lib[512], flog[160];
		ssize_t n = readlink("/proc/self/exe", lib, sizeof(lib) - 20);
		ck_assert_int_gt(n, 0);
		lib[n] = 0;
		strcpy(strrchr(lib, '/'), "/libpsfault.so");
		snprintf(flog, sizeof(flog), "%s/faults.log", dir);
		setenv("LD_PRELOAD", lib, 1);
		setenv("PS_FAULT", "pthread_create:1", 1);
		setenv("PS_FAULT_LOG", flog, 1);
		setenv("OPENBLAS_NUM_THREADS", "1", 1);
	}
	pid_t w = tu_spawn(argv, out);
	unsetenv("LD_PRELOAD");
	unsetenv("PS_FAULT");
	unsetenv("PS_FAULT_LOG");
	unsetenv("OPENBLAS_NUM_THREADS");
	/* rank 0 trains; its first clock's pull then waits for rank 1 */
	for (int i = 0; i < 600 && !tu_log_says(out, "training mlp"); i++)
		tu_sleep_ms(100);
	ck_assert_msg(tu_log_says(out, "training mlp"), "rank 0 never started (%s)", out);
	tu_sleep_ms(1500);
	pid_t to = 0; /* _i 2: the thread that takes the signals */
	if (_i == 2) {
		to = unblocked_thread(w, SIGINT);
		if (!to) {
			kill(w, SIGKILL);
			tu_wait_child(w);
			tu_stop_server(srv[0]);
			tu_stop_server(srv[1]);
			unlink(path);
			tu_rmtree(dir);
			tu_skip("the stop grace on a thread started before main: ps-worker has no "
				"thread that leaves SIGINT unblocked (OpenBLAS without a pool?)");
			return;
		}
	}
	double t0 = ps_now_s();
	for (int k = 0; k < 2; k++) {
		if (k)
			tu_sleep_ms(5000);
		if (to)
			ck_assert_msg(syscall(SYS_tgkill, w, to, SIGINT) == 0, "SIGINT %d to thread "
				      "%d: %s (the signal before ended the worker?)", k + 1, (int)to,
				      strerror(errno));
		else
			kill(w, SIGTERM);
	}
	int st = tu_wait_exit_s(w, 30);
	double took = ps_now_s() - t0;
	size_t len;
	char *text = (char *)tu_slurp(out, &len);
	ck_assert_msg(st == 130 && text && strstr(text, "still in a step 10 s after the stop "
						     "signal (waiting for a worker or shard "
						     "that stopped); exiting"),
		      "status %d, no grace's exit (output in %s):\n%s", st, out, text ? text : "");
	ck_assert_msg((_i != 1) == !strstr(text, "stop signals: no thread to take them (Resource "
					   "temporarily unavailable); handled on any thread"),
		      "the signal thread's failure %s (output in %s):\n%s",
		      _i == 1 ? "not told" : "told", out, text);
	/* the alarm's 10 s; a second grace from the second signal would end at 15 s */
	ck_assert_msg(took > 9.5 && took < 13.5, "the worker left %.1f s after the first SIGTERM, "
		      "not 10 s", took);
	printf("measured: ps-worker waiting at a barrier left %.1f s after SIGTERM (status %d%s)\n",
	       took, st, _i == 1 ? ", no signal thread" : _i == 2 ? ", SIGINT to an OpenBLAS thread" : "");
	free(text);
	ck_assert_int_eq(tu_stop_server(srv[0]), 0);
	ck_assert_int_eq(tu_stop_server(srv[1]), 0);
	unlink(path);
	tu_rmtree(dir);
}
END_TEST

/* ---- a shard restarted from its checkpoint keeps the membership ---- */

/* Pushes (rank + 1) everywhere for clock with c, waited for. */
static void push_const(struct ps_client *c, const struct ps_config *cfg, int rank, int clock)
{
	struct ps_tensor g[NT];

	tensors_new(cfg, g);
	for (int k = 0; k < NT; k++)
		for (int64_t i = 0; i < g[k].count; i++)
			g[k].data[i] = (float)(rank + 1);
	int64_t id = ps_client_push(c, (uint64_t)clock, g, NT, PS_PUSH_END_CLOCK);
	ck_assert_msg(id > 0 && ps_client_wait(c, id) == 0, "rank %d clock %d: %s", rank, clock,
		      ps_client_error(c));
	tensors_free(g);
}

/* Rank 2 joins (at clock 2), then both shards stop (writing their
 * checkpoints) and start again: they take the membership back from the
 * file beside the checkpoint, so rank 2's push for clock 3 is accepted and
 * the sums are exact; before, the restarted shards refused it as a rank
 * that never joined. */
START_TEST(test_restart_keeps_membership)
{
	char path[64], err[512], dir[] = "/tmp/ps-elastic-ck-XXXXXX", extra[300];
	struct ps_config cfg;
	pid_t srv[2];
	struct ps_client *c[3];
	struct ps_tensor w[NT], w0[NT];

	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(extra, sizeof(extra), "  initial_workers: 2\ncheckpoint:\n  dir: %s\n", dir);
	start_cluster(path, &cfg, "sync", extra, srv);
	for (int r = 0; r < 2; r++) {
		c[r] = connect_retry(&cfg, r, err, sizeof(err));
		ck_assert_msg(c[r] != NULL, "%s", err);
	}
	tensors_new(&cfg, w0);
	int64_t id = ps_client_pull(c[0], 0, w0, NT);
	ck_assert_msg(id > 0 && ps_client_wait(c[0], id) == 0, "%s", ps_client_error(c[0]));
	push_const(c[0], &cfg, 0, 0);
	push_const(c[1], &cfg, 1, 0);
	c[2] = connect_retry(&cfg, 2, err, sizeof(err));
	ck_assert_msg(c[2] != NULL, "%s", err);
	ck_assert_uint_eq(ps_client_clock(c[2]), 2);
	push_const(c[0], &cfg, 0, 1);
	push_const(c[1], &cfg, 1, 1);
	for (int r = 0; r < 3; r++)
		push_const(c[r], &cfg, r, 2);
	/* both shards stop (checkpoint at clock 3) and start again */
	for (int k = 0; k < 2; k++) {
		ck_assert_int_eq(tu_stop_server(srv[k]), 0);
		srv[k] = tu_start_server(path, k);
	}
	for (int r = 0; r < 3; r++)
		push_const(c[r], &cfg, r, 3);
	tensors_new(&cfg, w);
	id = ps_client_pull(c[0], 4, w, NT);
	ck_assert_msg(id > 0 && ps_client_wait(c[0], id) == 0, "%s", ps_client_error(c[0]));
	for (int k = 0; k < NT; k++)
		for (int64_t i = 0; i < w[k].count; i++)
			ck_assert_msg(w[k].data[i] == w0[k].data[i] - (4 * 1 + 4 * 2 + 2 * 3),
				      "%s[%lld] = %g, want %g", w[k].name, (long long)i,
				      (double)w[k].data[i], (double)(w0[k].data[i] - 18));
	struct ps_shard_stats st;
	ck_assert_int_eq(ps_client_stats(c[0], 1, &st), 0);
	ck_assert_uint_eq(st.joins, 1);
	ck_assert_int_eq(st.nmembers, 3);
	/* the member list itself, every entry copied to the caller */
	for (int r = 0; r < 3; r++)
		ck_assert_msg(st.members[r] == r, "members[%d] is %d, rank %d due", r, st.members[r],
			      r);
	/* rank 2 leaves after clock 4; started again, the shards keep it out
	 * (the end of its interval is in the file) */
	ck_assert_int_eq(ps_client_leave(c[2], 4), 0);
	push_const(c[0], &cfg, 0, 4);
	push_const(c[1], &cfg, 1, 4);
	for (int k = 0; k < 2; k++) {
		ck_assert_int_eq(tu_stop_server(srv[k]), 0);
		srv[k] = tu_start_server(path, k);
	}
	for (int k = 0; k < 2; k++) {
		ck_assert_int_eq(ps_client_stats(c[0], k, &st), 0);
		ck_assert_msg(st.nmembers == 2 && st.members[0] == 0 && st.members[1] == 1 &&
			      st.leaves == 1, "shard %d after a leave and a restart: %d members, "
			      "%" PRIu64 " leaves", k, st.nmembers, (uint64_t)st.leaves);
	}
	/* a damaged membership file: the shard refuses to start, naming the
	 * file, the line and what it holds; put back, it starts as before */
	char mf[200], log[200], want[400], good[4096];
	snprintf(mf, sizeof(mf), "%s/shard-1.members", dir);
	snprintf(log, sizeof(log), "%s/damaged.log", dir);
	FILE *f = fopen(mf, "r");
	ck_assert_ptr_nonnull(f);
	size_t glen = fread(good, 1, sizeof(good), f);
	fclose(f);
	ck_assert_int_eq(tu_stop_server(srv[1]), 0);
	static const struct { const char *text, *line; int ln; } bad[] = {
		{ "joins x leaves 1\n0 0 -1\n", "joins x leaves 1", 1 },
		{ "joins 1 leaves 1\n0 0 -1\n3 0 -1\n", "3 0 -1", 3 },       /* rank 0..2 */
		{ "joins 1 leaves 1\n0 0 -1\n2 4 2\n", "2 4 2", 3 },         /* to < from */
		{ "joins 1 leaves 1\n0 9007199254740992 -1\n", "0 9007199254740992 -1", 2 },
		{ "joins 1 leaves 1\n1 0 -2\n", "1 0 -2", 2 },
		{ "joins 1 leaves 1\n1 0\n", "1 0", 2 },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		f = fopen(mf, "w");
		ck_assert_ptr_nonnull(f);
		fputs(bad[i].text, f);
		fclose(f);
		pid_t p = tu_start_server_log(path, 1, log);
		int rc = tu_wait_exit_s(p, 10); /* one that starts is killed: -1 */
		snprintf(want, sizeof(want), "%s:%d: not a membership line (\"joins J leaves L\", "
			 "then \"rank from to\" with rank 0..2 and from <= to, to -1 when open): "
			 "'%s'", mf, bad[i].ln, bad[i].line);
		ck_assert_msg(rc != 0 && tu_log_says(log, want), "damage %zu: exit %d, '%s' not "
			      "in its log", i, rc, want);
	}
	f = fopen(mf, "w");
	ck_assert_ptr_nonnull(f);
	ck_assert_uint_eq(fwrite(good, 1, glen, f), glen);
	fclose(f);
	srv[1] = tu_start_server(path, 1);
	for (int t = 0; ps_client_stats(c[0], 1, &st) || st.nmembers != 2; t++) {
		ck_assert_msg(t < 300, "shard 1 with its file put back: %d members", st.nmembers);
		tu_sleep_ms(100);
	}
	ck_assert_uint_eq(st.leaves, 1);
	tensors_free(w);
	tensors_free(w0);
	for (int r = 0; r < 3; r++)
		ps_client_free(c[r]);
	stop_cluster(path, srv);
	tu_rmtree(dir);
}
END_TEST

/* ---- a hold without its join expires ---- */

/* Only the first step of a join: shard k holds its first open clock for
 * c's rank (what a client that hangs between the steps leaves behind). */
static void hold_only(struct ps_client *c, int k)
{
	static struct ps_shard_stats st;
	Ps__StatsRequest m = PS__STATS_REQUEST__INIT;
	struct req *r = ps__client_req_new(c, REQ_STATS);

	ck_assert_ptr_nonnull(r);
	r->stats = &st;
	r->id = ps__client_reserve_id(c);
	m.req_id = (uint64_t)r->id;
	m.member_op = PS__MEMBER_OP__MEMBER_HOLD;
	ck_assert_int_eq(ps__client_pack_part(&r->parts[k], &m.base), 0);
	int64_t id = ps__client_submit_built(c, 0, r);
	ck_assert_msg(id > 0 && ps_client_wait(c, id) == 0, "%s", ps_client_error(c));
	ck_assert_int_eq(st.member_status, 0);
}

/* Rank 2 leaves after clock 0 and then only holds clock 1 on both shards
 * (it never sends the join): the others' clock 1 waits for it about
 * limits.drop_timeout_ms (0.8 s), then goes on without it. */
START_TEST(test_hold_expires)
{
	char path[64], err[512];
	struct ps_config cfg;
	pid_t srv[2];
	struct ps_client *c[3];
	struct ps_tensor w[NT];

	start_cluster(path, &cfg, "sync", "limits:\n  drop_timeout_ms: 800\n"
		      "  request_timeout_ms: 20000\n", srv);
	for (int r = 0; r < 3; r++) {
		c[r] = connect_retry(&cfg, r, err, sizeof(err));
		ck_assert_msg(c[r] != NULL, "%s", err);
	}
	push_const(c[0], &cfg, 0, 0);
	push_const(c[1], &cfg, 1, 0);
	ck_assert_int_eq(ps_client_leave(c[2], 0), 0);
	for (int k = 0; k < 2; k++)
		hold_only(c[2], k);
	push_const(c[0], &cfg, 0, 1);
	push_const(c[1], &cfg, 1, 1);
	tensors_new(&cfg, w);
	double t0 = ps_now_s();
	int64_t id = ps_client_pull(c[0], 2, w, NT);
	ck_assert_msg(id > 0 && ps_client_wait(c[0], id) == 0, "%s", ps_client_error(c[0]));
	double dt = ps_now_s() - t0;
	printf("measured: a hold without its join held clock 1 for %.2f s (drop timeout 0.8 s)\n",
	       dt);
	ck_assert_msg(dt > 0.6 && dt < 5, "clock 1 closed after %.2f s", dt);
	tensors_free(w);
	for (int r = 0; r < 3; r++)
		ps_client_free(c[r]);
	stop_cluster(path, srv);
}
END_TEST

/* ---- a leave given up ---- */

/* path's text (malloc'ed), or NULL. */
static char *slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	char *b = NULL;
	long n;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && (b = malloc((size_t)n + 1))) {
		rewind(f);
		b[fread(b, 1, (size_t)n, f)] = '\0';
	}
	fclose(f);
	return b;
}

/* A leave under way is given up when a new process of its rank connects,
 * and nothing else is: rank 1 begins a leave (async, staleness 2) and its
 * process goes; its next process brings "worker 1's leave (at clock K)
 * given up: another process of its rank connected". Rank 0, which never
 * began a leave, is replaced by a new process and then dropped by the drop
 * timer, and so is rank 1's second process: the shard's log names no leave
 * of rank 0 and none at clock 2^64 - 1 (no leave). */
START_TEST(test_leave_given_up_only_when_begun)
{
	char path[64], err[512], dir[] = "/tmp/ps-elastic-unfreeze-XXXXXX", logf[300], yaml[1024];
	char *log = NULL;
	struct ps_config cfg;
	struct ps_client *c0, *c1;
	uint64_t last = 0;
	pid_t srv;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(logf, sizeof(logf), "%s/shard-0.log", dir);
	snprintf(yaml, sizeof(yaml),
		 "%scluster:\n  servers: [%s:%d]\n  workers: 2\n"
		 "consistency:\n  mode: async\n  staleness: 2\n"
		 "limits:\n  drop_timeout_ms: 300\n"
		 "optimizer:\n  name: sgd\n  lr: 1\n"
		 "model:\n  tensors:\n"
		 "    - {name: a, shape: [3000], init: arange}\n"
		 "    - {name: b, shape: [17, 33], init: arange}\n"
		 "    - {name: c, shape: [5], init: arange}\n",
		 tu_transport_yaml(), tu_host(), tu_free_port());
	ck_assert_int_eq(tu_write_temp(path, yaml), 0);
	ck_assert_msg(ps_config_load(&cfg, path, err, sizeof(err)) == 0, "%s", err);
	setenv("PS_TEST_LOG", "info", 1); /* the "given up" lines are info */
	srv = tu_start_server_log(path, 0, logf);
	unsetenv("PS_TEST_LOG");
	c0 = connect_retry(&cfg, 0, err, sizeof(err));
	ck_assert_msg(c0 != NULL, "%s", err);
	c1 = connect_retry(&cfg, 1, err, sizeof(err));
	ck_assert_msg(c1 != NULL, "%s", err);
	push_const(c0, &cfg, 0, 0);
	push_const(c1, &cfg, 1, 0);
	ck_assert_msg(ps_client_leave_begin(c1, &last) == 0, "%s", ps_client_error(c1));
	ps_client_free(c1);
	c1 = connect_retry(&cfg, 1, err, sizeof(err)); /* gives the leave up */
	ck_assert_msg(c1 != NULL, "%s", err);
	ps_client_free(c0);
	c0 = connect_retry(&cfg, 0, err, sizeof(err)); /* no leave to give up */
	ck_assert_msg(c0 != NULL, "%s", err);
	ps_client_free(c0);
	ps_client_free(c1);
	/* both dropped by the drop timer (no leave under way either) */
	for (double t0 = ps_now_s(); ps_now_s() - t0 < 10.0 * tu_time_scale(); tu_sleep_ms(50)) {
		free(log);
		log = slurp(logf);
		if (log && strstr(log, "worker 0 left the live set") &&
		    strstr(log, "worker 1 left the live set"))
			break;
	}
	ck_assert_int_eq(tu_stop_server(srv), 0);
	free(log);
	log = slurp(logf);
	ck_assert_msg(log && strstr(log, "worker 0 left the live set") &&
		      strstr(log, "worker 1 left the live set"), "the drop timer dropped not both "
		      "ranks within 10 s; the shard's log:\n%s", log ? log : "(none)");
	char want[128];
	snprintf(want, sizeof(want), "worker 1's leave (at clock %" PRIu64 ") given up: another "
		 "process of its rank connected", last);
	ck_assert_msg(strstr(log, want), "no \"%s\" in the shard's log:\n%s", want, log);
	ck_assert_msg(!strstr(log, "worker 0's leave") && !strstr(log, "18446744073709551615"),
		      "a leave nobody began given up; the shard's log:\n%s", log);
	free(log);
	unlink(path);
	tu_rmtree(dir);
}
END_TEST

/* ---- refusals ---- */

/* A worker that left is refused naming the clock it left at; a config
 * with more initial workers than ranks names the key. */
START_TEST(test_refusals)
{
	char path[64], err[512];
	struct ps_config cfg;
	pid_t srv[2];
	struct ps_tensor g[NT];

	start_cluster(path, &cfg, "async", "", srv);
	struct ps_client *c = connect_retry(&cfg, 2, err, sizeof(err));
	ck_assert_msg(c != NULL, "%s", err);
	tensors_new(&cfg, g);
	ck_assert_int_eq(ps_client_leave(c, 0), 0);
	int64_t id = ps_client_push(c, 1, g, NT, PS_PUSH_END_CLOCK);
	ck_assert_int_gt(id, 0);
	ck_assert_int_eq(ps_client_wait(c, id), PS_EREFUSED);
	ck_assert_msg(strstr(ps_client_error(c), "left the cluster at clock 1"), "%s",
		      ps_client_error(c));
	/* joining again makes it a member from a later clock */
	ck_assert_msg(ps_client_join(c) == 0, "%s", ps_client_error(c));
	uint64_t j = ps_client_clock(c);
	ck_assert_uint_ge(j, 2);
	id = ps_client_push(c, j, g, NT, PS_PUSH_END_CLOCK);
	ck_assert_msg(id > 0 && ps_client_wait(c, id) == 0, "%s", ps_client_error(c));
	tensors_free(g);
	ps_client_free(c);
	/* a monitor is no member: each refused, saying why */
	struct ps_client *mon = NULL;
	struct ps_members_info mi;
	uint64_t last = 0;
	ck_assert_msg(ps_client_init(&mon, &cfg, -1, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(ps_client_join(mon), -EINVAL);
	ck_assert_str_eq(ps_client_error(mon), "a monitor is no worker: it cannot join");
	ck_assert_int_eq(ps_client_leave(mon, 0), -EINVAL);
	ck_assert_str_eq(ps_client_error(mon), "a monitor is no worker: it cannot leave");
	ck_assert_int_eq(ps_client_join(mon), -EINVAL);
	ck_assert_int_eq(ps_client_leave_begin(mon, &last), -EINVAL);
	ck_assert_str_eq(ps_client_error(mon), "a monitor is no worker: it cannot leave");
	ck_assert_int_eq(ps_client_members(mon, &mi), -EINVAL);
	ck_assert_str_eq(ps_client_error(mon), "a monitor is no worker: it has no membership");
	ps_client_free(mon);
	stop_cluster(path, srv);

	char yaml[512];
	struct ps_config bad;
	snprintf(yaml, sizeof(yaml), "cluster:\n  servers: [127.0.0.1:1]\n  workers: 2\n"
		 "  initial_workers: 3\nmodel:\n  tensors:\n    - {name: a, shape: [4]}\n");
	ck_assert_int_eq(tu_write_temp(path, yaml), 0);
	ck_assert_int_ne(ps_config_load(&bad, path, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "cluster.initial_workers") && strstr(err, ":4"), "%s", err);
	unlink(path);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("elastic");
	TCase *tc = tcase_create("elastic");

	signal(SIGPIPE, SIG_IGN);
	tcase_set_timeout(tc, 120);
	TU_ADD_LOOP(tc, test_sync_join_leave_exact, 0, 2);
	TU_ADD(tc, test_async_join_leave_exact);
	TU_ADD_LOOP(tc, test_leave_delay, 0, 2);
	TU_ADD(tc, test_async_join_resend_once);
	TU_ADD(tc, test_refusals);
	TU_ADD(tc, test_restart_keeps_membership);
	TU_ADD(tc, test_hold_expires);
	TU_ADD(tc, test_leave_given_up_only_when_begun);
	TU_ADD(tc, test_worker_data_once);
	TU_ADD_LOOP(tc, test_ctr_data_once, 0, 2);
	TU_ADD(tc, test_ctr_idle_member_leave);
	TU_ADD_LOOP(tc, test_stop_grace, 0, 3);
	suite_add_tcase(s, tc);
	return tu_run_suite(s);
}
