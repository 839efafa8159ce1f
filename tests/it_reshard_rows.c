/* it_reshard_rows.c - re-sharding while the workers run, with an embedding
 * table (docs/elastic.md, "Re-sharding while the workers run"): real
 * shard processes and two worker clients (threads, one libps client each,
 * following $PS_CONFIG_FOLLOW) that stay up throughout.
 *
 * Each clock a worker pushes the rows of 24 ids (some repeated) with
 * integer gradients, then the dense tensor ending the clock, and pulls the
 * rows of its next clock's ids (sync: once the clock is applied) and the
 * dense tensor; table and tensor use sgd at lr 1 from zeros, so every
 * value is minus the exact sum of the gradients pushed to it.
 *
 *  - 2 -> 3 while the workers run free (paced 30 ms a clock): ps-stat
 *    --reshard-stop picks the clock, the old shards exit 0 with their
 *    checkpoints, 3 shards start from them (--reshard-from) and the
 *    workers' pointer file names the new config; row pushes refused with
 *    PS_ERESHARD and row pulls held for the next clock are cut again for
 *    the new map;
 *  - 3 -> 2 with the workers held at clock 16: every shard stopped there
 *    through ps_client_stop_at, the workers let go (their row and dense
 *    pushes for 16 refused and kept, their row pulls waiting), then the
 *    stop committed;
 *  - after 24 clocks every row of the table and every weight equals minus
 *    the exact sum of both workers' gradients (a push applied twice or
 *    lost would show), sync workers check the rows they pull each clock
 *    the same way, and each shard holds exactly the rows its jump hash
 *    names (rows counted per shard against ps_rows_shard).
 *
 * Sync (BSP) and async (staleness 2, row gradients sent as fp16: every
 * push acknowledged, so applied exactly once; the rows checked at the end
 * only); and async with limits.request_timeout_ms 250, so that waits time
 * out during the re-shards' pauses: a push given up that way is of
 * unknown outcome and the worker pushes its clock again; a counter row
 * and a[0] (each push adds 1) end between the acknowledged pushes and
 * those plus the unknown ones (the Jepsen counter rule), and some pushes
 * must have been of unknown outcome.
 *
 * Workers that push rows alone, never a dense tensor and never ending a
 * clock with PS_PUSH_END_CLOCK (sync with a dense tensor in the config
 * nobody pushes; async with a config of the table alone): 4 clocks of
 * rows, ps-stat --reshard-stop stops at clock 4, the workers' row pushes
 * for 4 are refused, and each old shard exits 0 within 20 s with its
 * checkpoint at 4 (before the fix in stop.c it waited forever: the
 * workers had finished no clock there); 2 -> 3, the pushes for 4 cut
 * again, one more clock, every row the exact sum of 6 clocks.
 */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>
#include <time.h>
#include "config.h"
#include "ps_client.h"
#include "ps_err.h"
#include "rows_wire.h"
#include "test_util.h"

#define NW 2
#define NCLK 24
#define NIDS 97       /* the ids pushed: id_of(0..NIDS) */
#define NPER 24       /* ids per worker and clock (repeats among them) */
#define DIM 4
#define NA 300
#define GATE2 16      /* the second re-shard's clock */

static char dir[64], ck[128], ptr[128];
static struct ps_config cfg0; /* the workers' first config (2 shards) */
static int async_mode;
/* async with limits.request_timeout_ms 250: a wait that times out during
 * a re-shard leaves its push of unknown outcome (the client gives it up:
 * it was applied once or not at all); the worker pushes that clock again.
 * Counted on a counter row and a[0] (gradient -1: each applied push adds
 * 1), which must lie between the acknowledged pushes and those plus the
 * unknown ones (the Jepsen counter). */
static int unknown_mode;
#define COUNTER (NIDS + 5) /* the counter row's index: outside the pool */
/* the config's model holds the table only, no dense tensor */
static int rows_only;
/* cluster.replicas: 1, a backup per shard (rows-only cases) */
static int pairs;

static void write_cfg(const char *name, int n, char *out, size_t len)
{
	char yaml[2048], servers[256] = "", backups[300] = "";

	tu_servers_list(n, servers, sizeof(servers));
	for (int k = 0, o = 0; pairs && k < n; k++)
		o += snprintf(backups + o, sizeof(backups) - (size_t)o, "%s127.0.0.1:%d%s",
			      k ? ", " : "  backups: [", tu_free_port(),
			      k == n - 1 ? "]\n  replicas: 1\nreplication: {timeout_ms: 600}\n" : "");
	snprintf(yaml, sizeof(yaml),
		 "cluster:\n  servers: [%s]\n  workers: %d\n%s"
		 "consistency:\n  mode: %s\n  staleness: 2\n"
		 "slice_bytes: 512\nseed: 5\n"
		 "optimizer:\n  name: sgd\n  lr: 1\n"
		 "model:\n%s%d%s"
		 "  embeddings:\n    - {name: e, dim: %d, init: zeros, optimizer: sgd, lr: 1}\n"
		 "limits:\n  reconnect_timeout_ms: 60000\n  request_timeout_ms: %d\n"
		 "checkpoint:\n  dir: %s\n  every_s: 0\nlog:\n  level: warn\n",
		 servers, NW, backups, async_mode ? "async" : "sync",
		 rows_only ? "# no dense tensor (" : "  tensors:\n    - {name: a, shape: [", NA,
		 rows_only ? ")\n" : "], init: zeros}\n", DIM, unknown_mode ? 250 : 60000,
		 ck);
	tu_write_named(dir, name, yaml, out, len);
}

/* Points the workers' $PS_CONFIG_FOLLOW file at path (written, then
 * renamed into place, as ps-local.sh does). */
static void point_at(const char *path)
{
	char tmp[160];
	FILE *f;

	snprintf(tmp, sizeof(tmp), "%s.new", ptr);
	f = fopen(tmp, "w");
	ck_assert_ptr_nonnull(f);
	fprintf(f, "%s\n", path);
	fclose(f);
	ck_assert_int_eq(rename(tmp, ptr), 0);
}

/* Process replica (0: the primary, 1: the backup) of shard k. */
static pid_t start_replica(const char *path, int k, int replica, const char *old, int old_n)
{
	char s[16], n[16], log[160];
	const char *argv[16] = { "bin/ps-server", "--config", path, "--shard", s, "--log-level",
				 "info" };
	int a = 7;

	if (replica) {
		argv[a++] = "--replica";
		argv[a++] = "1";
	}
	if (old) {
		argv[a++] = "--reshard-from";
		argv[a++] = old;
		argv[a++] = "--reshard-shards";
		argv[a++] = n;
	}
	snprintf(s, sizeof(s), "%d", k);
	snprintf(n, sizeof(n), "%d", old_n);
	snprintf(log, sizeof(log), "%s/%s-shard-%d%s.log", dir, strrchr(path, '/') + 1, k,
		 replica ? "-r1" : "");
	return tu_spawn(argv, log);
}

static pid_t start_shard(const char *path, int k, const char *old, int old_n)
{
	return start_replica(path, k, 0, old, old_n);
}

/* Moves the n shards' checkpoints of ck into ck/name; the folder in to. */
static void move_old(const char *name, int n, char *to, size_t len)
{
	char a[256], b[300];

	snprintf(to, len, "%s/%s", ck, name);
	ck_assert_int_eq(mkdir(to, 0700), 0);
	for (int i = 0; i < n * (pairs ? 2 : 1); i++) {
		int k = i % n;
		const char *r1 = i < n ? "" : "-r1";
		snprintf(a, sizeof(a), "%s/shard-%d%s.ckpt", ck, k, r1);
		snprintf(b, sizeof(b), "%s/shard-%d%s.ckpt", to, k, r1);
		ck_assert_msg(rename(a, b) == 0, "%s: %s", a, strerror(errno));
	}
}

/* Starts the n shards of path from the old_n checkpoints in old, and
 * waits for each to listen. */
static void start_new(const char *path, int n, const char *old, int old_n, pid_t *srv)
{
	struct ps_config *c = malloc(sizeof(*c));
	char err[600];

	ck_assert_ptr_nonnull(c);
	ck_assert_msg(ps_config_load(c, path, err, sizeof(err)) == 0, "%s", err);
	for (int k = 0; k < n * (pairs ? 2 : 1); k++)
		srv[k] = start_replica(path, k % n, k / n, old, old_n);
	for (int k = 0; k < n; k++)
		ck_assert_msg(tu_wait_listen(c->shards[k].port), "new shard %d does not listen", k);
	free(c);
}

/* ---- what the workers push ---- */

static uint64_t id_of(int i)
{
	return (uint64_t)i * 0x9e3779b97f4a7c15ull + 12345;
}

/* The j-th id index worker rank pushes at clock k (repeats within a call). */
static int idx_of(int rank, uint64_t k, int j)
{
	return (int)((rank * 31 + (int)k * 13 + j * (j % 3 ? 7 : 0) + j / 3) % NIDS);
}

static float rgrad(int rank, uint64_t k, int j, int d)
{
	return (float)((int)(((rank + 1) * (j + 1) + (int)k * 3 + d) % 5) - 2);
}

static float dgrad(int rank, uint64_t k, int i)
{
	return (float)((int)((i * (rank + 1) + (int)k * 3) % 7) - 3);
}

/* Row i's expected value after clocks 0..upto-1 of every worker. */
static void expect_row(int i, uint64_t upto, float *out)
{
	memset(out, 0, sizeof(float) * DIM);
	for (int r = 0; r < NW; r++)
		for (uint64_t k = 0; k < upto; k++)
			for (int j = 0; j < NPER; j++)
				if (idx_of(r, k, j) == i)
					for (int d = 0; d < DIM; d++)
						out[d] -= rgrad(r, k, j, d);
}

/* ---- the workers: threads, each with its own client ---- */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static uint64_t gate;            /* workers wait before pushing this clock */
static uint64_t progress[NW];    /* clocks each has finished */
static int ended[NW];            /* the worker's thread returned */

struct wk {
	int rank;
	float a[NA];
	int rc;
	char err[900];
	struct ps_client *c;
	/* unknown_mode: row and dense pushes acknowledged, of unknown outcome */
	uint64_t acked_r, unknown_r, acked_d, unknown_d;
};
static struct wk wks[NW];

/* Waits until f(arg) holds under mu, 120 s at most; 0 or -1. */
static int wait_until(int (*f)(void *), void *arg)
{
	return tu_wait_cond(&mu, &cv, f, arg, 120);
}

static int gate_open(void *arg)
{
	return *(uint64_t *)arg < gate;
}

/* Every worker at clock *arg or past it, or ended (failed: its error
 * is named then, not after the wait's deadline). */
static int all_at(void *arg)
{
	for (int r = 0; r < NW; r++)
		if (progress[r] < *(uint64_t *)arg && !ended[r])
			return 0;
	return 1;
}

static void set_gate(uint64_t g)
{
	pthread_mutex_lock(&mu);
	gate = g;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
}

static int wk_fail(struct wk *w, int rc, const char *what, uint64_t k)
{
	w->rc = rc ? rc : -1;
	snprintf(w->err, sizeof(w->err), "rank %d clock %" PRIu64 ": %s: %s", w->rank, k, what,
		 w->c ? ps_client_error(w->c) : "");
	return -1;
}

/* Waits for request id: 0 done; 1 timed out in unknown_mode (its
 * outcome unknown: counted in *unknown, when given); -1 failed. Done
 * counts in *acked, when given. */
static int outcome(struct wk *w, int64_t id, uint64_t *acked, uint64_t *unknown,
		   const char *what, uint64_t k)
{
	int rc = ps_client_wait(w->c, id);

	if (!rc) {
		if (acked)
			++*acked;
		return 0;
	}
	if (rc == PS_ETIMEDOUT && unknown_mode) {
		if (unknown)
			++*unknown;
		return 1;
	}
	return wk_fail(w, rc, what, k);
}

/* One clock k of worker w: 0, 1 to do it again (unknown_mode: a request
 * timed out), or -1 failed. */
static int one_clock(struct wk *w, uint64_t k)
{
	static __thread uint64_t ids[NPER], nids[NPER];
	static __thread float g[NPER * DIM], rows[NPER * DIM], ga[NA], want[DIM];
	struct ps_tensor tg = { .name = "a", .data = ga, .count = NA };
	struct ps_tensor tw = { .name = "a", .data = w->a, .count = NA };
	int64_t pid, did, rid, id;
	int a, b, c, d;

	for (int j = 0; j < NPER; j++) {
		ids[j] = id_of(idx_of(w->rank, k, j));
		nids[j] = id_of(idx_of(w->rank, k + 1, j));
		for (int d = 0; d < DIM; d++)
			g[j * DIM + d] = rgrad(w->rank, k, j, d);
	}
	for (int i = 0; i < NA; i++)
		ga[i] = dgrad(w->rank, k, i);
	if (unknown_mode) {
		ids[0] = id_of(COUNTER);
		for (int d = 0; d < DIM; d++)
			g[d] = -1;
		ga[0] = -1;
	}
	/* async: as fp16 (small integers are exact), cut again from that */
	pid = ps_client_push_rows_async(w->c, "e", k, ids, NPER, g,
					async_mode ? PS_PUSH_ROWS_FP16 : 0);
	if (pid < 0)
		return wk_fail(w, (int)pid, "push_rows", k);
	did = ps_client_push(w->c, k, &tg, 1, PS_PUSH_END_CLOCK);
	if (did < 0)
		return wk_fail(w, (int)did, "push", k);
	/* the next clock's rows, once this one is applied (sync) */
	rid = ps_client_pull_rows_async(w->c, "e", async_mode ? 0 : k + 1, nids, NPER, rows);
	if (rid < 0)
		return wk_fail(w, (int)rid, "pull_rows", k);
	a = outcome(w, pid, &w->acked_r, &w->unknown_r, "push_rows wait", k);
	b = outcome(w, did, &w->acked_d, &w->unknown_d, "push wait", k);
	c = outcome(w, rid, NULL, NULL, "pull_rows wait", k);
	if (a < 0 || b < 0 || c < 0)
		return -1;
	id = ps_client_pull(w->c, async_mode ? 0 : k + 1, &tw, 1);
	if (id < 0)
		return wk_fail(w, (int)id, "pull", k);
	d = outcome(w, id, NULL, NULL, "pull", k);
	if (d < 0)
		return -1;
	if (a || b || c || d)
		return 1;
	for (int j = 0; j < NPER && !async_mode; j++) {
		expect_row(idx_of(w->rank, k + 1, j), k + 1, want);
		if (memcmp(want, rows + j * DIM, sizeof(want))) {
			snprintf(w->err, sizeof(w->err), "rank %d clock %" PRIu64 ": row %d pulled "
				 "as %g %g %g %g, the exact sum gives %g %g %g %g", w->rank, k,
				 idx_of(w->rank, k + 1, j), rows[j * DIM], rows[j * DIM + 1],
				 rows[j * DIM + 2], rows[j * DIM + 3], want[0], want[1], want[2],
				 want[3]);
			w->rc = -1;
			return -1;
		}
	}
	return 0;
}

static void *work(struct wk *w);

static void *worker(void *arg)
{
	struct wk *w = arg;

	work(w);
	pthread_mutex_lock(&mu);
	ended[w->rank] = 1;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
	return NULL;
}

static void *work(struct wk *w)
{

	for (int i = 0; i < 150; i++) { /* the shards may not listen yet */
		w->rc = ps_client_init(&w->c, &cfg0, w->rank, w->err, sizeof(w->err));
		if (w->rc != -ECONNREFUSED)
			break;
		tu_sleep_ms(100);
	}
	if (w->rc)
		return NULL;
	for (uint64_t k = 0; k < NCLK; k++) {
		if (wait_until(gate_open, &k)) {
			snprintf(w->err, sizeof(w->err), "clock %" PRIu64 ": the gate stayed shut", k);
			w->rc = -1;
			return NULL;
		}
		int rc, tries = 0;
		while ((rc = one_clock(w, k)) == 1 && ++tries < 400)
			;
		if (rc) {
			if (!w->rc)
				snprintf(w->err, sizeof(w->err), "clock %" PRIu64 ": still timing out "
					 "after %d tries", k, tries);
			w->rc = w->rc ? w->rc : -1;
			return NULL;
		}
		pthread_mutex_lock(&mu);
		progress[w->rank] = k + 1;
		pthread_cond_broadcast(&cv);
		pthread_mutex_unlock(&mu);
		tu_sleep_ms(30); /* paced: the first re-shard lands inside the run */
	}
	return NULL;
}


/* The clock ps-stat's output out names as the stop's; 0 when none. */
static uint64_t stop_clock(const char *out)
{
	FILE *f = fopen(out, "r");
	char line[1024];
	unsigned long long b = 0;

	while (f && fgets(line, sizeof(line), f))
		if (strstr(line, "every shard stops at clock"))
			sscanf(strstr(line, "at clock") + 9, "%llu", &b);
	if (f)
		fclose(f);
	return b;
}

/* unknown_mode: the counter row and a[0] between the acknowledged pushes
 * and those plus the ones of unknown outcome. */
static void check_counters(struct ps_client *mon, const float *a)
{
	uint64_t id = id_of(COUNTER), ar = 0, ur = 0, ad = 0, ud = 0;
	float row[DIM];

	ck_assert_msg(ps_client_pull_rows(mon, "e", 0, &id, 1, row) == 0, "%s",
		      ps_client_error(mon));
	for (int r = 0; r < NW; r++) {
		ar += wks[r].acked_r;
		ur += wks[r].unknown_r;
		ad += wks[r].acked_d;
		ud += wks[r].unknown_d;
	}
	printf("counters: rows %g (%" PRIu64 " acknowledged, %" PRIu64 " unknown), dense %g (%"
	       PRIu64 ", %" PRIu64 ")\n", row[0], ar, ur, a[0], ad, ud);
	ck_assert_msg(ur + ud > 0, "no push of unknown outcome: the re-shards' pauses were "
		      "shorter than the 250 ms request timeout");
	for (int d = 0; d < DIM; d++)
		ck_assert_msg(row[d] >= (float)ar && row[d] <= (float)(ar + ur), "counter row[%d] = "
			      "%g: not within %" PRIu64 " acknowledged and %" PRIu64 " more of unknown "
			      "outcome", d, row[d], ar, ur);
	ck_assert_msg(a[0] >= (float)ad && a[0] <= (float)(ad + ud), "a[0] = %g: not within %"
		      PRIu64 " acknowledged and %" PRIu64 " more of unknown outcome", a[0], ad, ud);
}

/* The final check: every row and weight the exact sum (unknown_mode: the
 * counters, check_counters), each shard holding exactly the rows its jump
 * hash names. */
static void check_final(const char *path)
{
	static float rows[NIDS * DIM], a[NA], want[DIM];
	static uint64_t ids[NIDS];
	struct ps_config *c = malloc(sizeof(*c));
	struct ps_client *mon;
	struct ps_tensor ta = { .name = "a", .data = a, .count = NA };
	char err[600];
	int pushed[COUNTER + 1] = { 0 };
	uint64_t tkey;

	ck_assert_ptr_nonnull(c);
	ck_assert_msg(ps_config_load(c, path, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(ps_client_init(&mon, c, -1, err, sizeof(err)) == 0, "%s", err);
	for (int i = 0; i < NIDS; i++)
		ids[i] = id_of(i);
	ck_assert_msg(ps_client_pull_rows(mon, "e", async_mode ? 0 : NCLK, ids, NIDS, rows) == 0,
		      "%s", ps_client_error(mon));
	for (int i = 0; i < NIDS && !unknown_mode; i++) {
		expect_row(i, NCLK, want);
		ck_assert_msg(!memcmp(want, rows + i * DIM, sizeof(want)), "row %d: %g %g %g %g, "
			      "the exact sum gives %g %g %g %g", i, rows[i * DIM], rows[i * DIM + 1],
			      rows[i * DIM + 2], rows[i * DIM + 3], want[0], want[1], want[2],
			      want[3]);
	}
	ck_assert_int_eq(ps_client_wait(mon, ps_client_pull(mon, async_mode ? 0 : NCLK, &ta, 1)),
			 0);
	if (unknown_mode)
		check_counters(mon, a);
	for (int i = 0; i < NA && !unknown_mode; i++) {
		float w = 0;
		for (int r = 0; r < NW; r++)
			for (uint64_t k = 0; k < NCLK; k++)
				w -= dgrad(r, k, i);
		ck_assert_msg(a[i] == w, "a[%d] = %g, the exact sum gives %g", i, a[i], w);
	}
	for (int r = 0; r < NW; r++)
		for (uint64_t k = 0; k < NCLK; k++)
			for (int j = 0; j < NPER; j++)
				pushed[unknown_mode && !j ? COUNTER : idx_of(r, k, j)] = 1;
	tkey = ps_rows_table_key(&c->tables[0]);
	for (int k = 0; k < c->nshards; k++) {
		struct ps_shard_stats st;
		uint64_t want_n = 0;
		for (int i = 0; i <= COUNTER; i++)
			want_n += pushed[i] && ps_rows_shard(tkey, id_of(i), c->nshards) == k;
		ck_assert_int_eq(ps_client_stats(mon, k, &st), 0);
		ck_assert_str_eq(st.tables[0].name, "e");
		ck_assert_msg(st.tables[0].rows == want_n, "shard %d holds %" PRIu64 " rows, its "
			      "hash names %" PRIu64, k, st.tables[0].rows, want_n);
		ck_assert_uint_gt(want_n, 0);
	}
	ps_client_free(mon);
	free(c);
}

static void run_2_3_2(int async, int unknown)
{
	char c2[160], c3[160], c2b[160], old[200], err[600], out[200], log[200];
	pid_t srv[3];
	pthread_t th[NW];
	struct ps_client *mon;
	struct ps_shard_stats st;
	struct ps_config *cfg3;
	uint64_t at, b1;

	async_mode = async;
	unknown_mode = unknown;
	strcpy(dir, "/tmp/ps-reshard-rows-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(ck, sizeof(ck), "%s/ck", dir);
	ck_assert_int_eq(mkdir(ck, 0700), 0);
	snprintf(ptr, sizeof(ptr), "%s/current", dir);
	write_cfg("c2", 2, c2, sizeof(c2));
	ck_assert_msg(ps_config_load(&cfg0, c2, err, sizeof(err)) == 0, "%s", err);
	point_at(c2);
	setenv("PS_CONFIG_FOLLOW", ptr, 1);
	for (int k = 0; k < 2; k++)
		srv[k] = start_shard(c2, k, NULL, 0);
	set_gate(12); /* a cap: the first stop lies at 12 or below */
	memset(progress, 0, sizeof(progress));
	memset(ended, 0, sizeof(ended));
	for (int r = 0; r < NW; r++) {
		wks[r] = (struct wk){ .rank = r };
		ck_assert_int_eq(pthread_create(&th[r], NULL, worker, &wks[r]), 0);
	}
	at = 3;
	ck_assert_msg(wait_until(all_at, &at) == 0 && !ended[0] && !ended[1], "the workers did "
		      "not reach clock 3: %s %s", wks[0].err, wks[1].err);

	/* 2 -> 3 while they run: ps-stat picks the clock */
	snprintf(out, sizeof(out), "%s/pstat-1.out", dir);
	const char *pstat[] = { "bin/ps-stat", "--config", c2, "--reshard-stop", NULL };
	ck_assert_int_eq(tu_wait_exit(tu_spawn(pstat, out)), 0);
	b1 = stop_clock(out);
	ck_assert_msg(b1 >= 3 && b1 <= 12, "ps-stat (%s) stopped at clock %" PRIu64, out, b1);
	for (int k = 0; k < 2; k++)
		ck_assert_int_eq(tu_wait_exit(srv[k]), 0);
	move_old("from2", 2, old, sizeof(old));
	write_cfg("c3", 3, c3, sizeof(c3));
	start_new(c3, 3, old, 2, srv);
	point_at(c3);
	set_gate(GATE2);
	at = GATE2;
	ck_assert_msg(wait_until(all_at, &at) == 0 && !ended[0] && !ended[1], "the workers did "
		      "not reach clock %d on 3 shards: %s %s", GATE2, wks[0].err, wks[1].err);

	/* 3 -> 2: stopped at 16 by hand, the workers let go before the commit */
	cfg3 = malloc(sizeof(*cfg3));
	ck_assert_ptr_nonnull(cfg3);
	ck_assert_msg(ps_config_load(cfg3, c3, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(ps_client_init(&mon, cfg3, -1, err, sizeof(err)), 0);
	for (int k = 0; k < 3; k++) {
		ck_assert_msg(ps_client_stop_at(mon, k, GATE2, 0, &st) == 0, "shard %d: %s", k,
			      ps_client_error(mon));
		ck_assert_uint_eq(st.top_clock, GATE2); /* row pushes count too */
	}
	set_gate(UINT64_MAX); /* their pushes for 16 are refused, kept */
	tu_sleep_ms(200);     /* (the refusals come before the commit or after it) */
	for (int k = 0; k < 3; k++)
		ck_assert_msg(ps_client_stop_at(mon, k, GATE2, PS_STOP_COMMIT, &st) == 0,
			      "shard %d: %s", k, ps_client_error(mon));
	ps_client_free(mon);
	free(cfg3);
	for (int k = 0; k < 3; k++)
		ck_assert_int_eq(tu_wait_exit(srv[k]), 0);
	move_old("from3", 3, old, sizeof(old));
	write_cfg("c2b", 2, c2b, sizeof(c2b));
	start_new(c2b, 2, old, 3, srv);
	point_at(c2b);
	for (int r = 0; r < NW; r++) {
		pthread_join(th[r], NULL);
		ck_assert_msg(wks[r].rc == 0, "worker %d: %s (%s)", r, wks[r].err,
			      ps_strerror(wks[r].rc));
		ps_client_free(wks[r].c);
	}
	unsetenv("PS_CONFIG_FOLLOW");
	check_final(c2b);
	for (int k = 0; k < 2; k++)
		ck_assert_int_eq(tu_stop_server(srv[k]), 0);
	snprintf(log, sizeof(log), "%s/c3.yaml-shard-2.log", dir);
	ck_assert_msg(tu_log_says(log, "re-sharded from 2 to 3 shards"), "%s: no re-shard said", log);
	snprintf(log, sizeof(log), "%s/c3.yaml-shard-0.log", dir);
	ck_assert_msg(tu_log_says(log, "stopped at clock 16 with its checkpoint written"),
		      "%s: no stop at clock 16 said", log);
	ck_assert_int_eq(tu_rmtree(dir), 0);
}

START_TEST(test_rows_sync_2_3_2)
{
	run_2_3_2(0, 0);
}
END_TEST

START_TEST(test_rows_async_2_3_2)
{
	run_2_3_2(1, 0);
}
END_TEST

/* Async, waits timing out during the re-shards: at most once. */
START_TEST(test_rows_async_unknown_2_3_2)
{
	run_2_3_2(1, 1);
}
END_TEST

/* Clock k of rows alone from every worker: pushed by all, then waited
 * for (sync with pairs a row push is acknowledged once its clock is
 * applied, which takes every worker's). */
static void push_rows_clock(struct ps_client **w, uint64_t k)
{
	static uint64_t ids[NW][NPER];
	static float g[NW][NPER * DIM];
	int64_t id[NW];

	for (int r = 0; r < NW; r++) {
		for (int j = 0; j < NPER; j++) {
			ids[r][j] = id_of(idx_of(r, k, j));
			for (int d = 0; d < DIM; d++)
				g[r][j * DIM + d] = rgrad(r, k, j, d);
		}
		id[r] = ps_client_push_rows_async(w[r], "e", k, ids[r], NPER, g[r], 0);
		ck_assert_msg(id[r] > 0, "rank %d clock %" PRIu64 ": %s", r, k, ps_client_error(w[r]));
	}
	for (int r = 0; r < NW; r++)
		ck_assert_msg(ps_client_wait(w[r], id[r]) == 0, "rank %d clock %" PRIu64 ": %s", r, k,
			      ps_client_error(w[r]));
}

/* Workers that push rows and never a dense tensor (the clocks end with no
 * dense push: ps_client_push_rows only): ps-stat --reshard-stop stops
 * every shard at the top clock of their row pushes, each shard exits 0
 * with its checkpoint, and the new shards hold the exact rows; the
 * workers follow and go on pushing rows on the new map. */
static void run_rows_only(int async, int dense_in_cfg, int with_pairs)
{
	static float rows[NIDS * DIM], want[DIM];
	static uint64_t all[NIDS], ids4[NW][NPER];
	static float g4[NW][NPER * DIM];
	int64_t pid[NW];
	char c2[160], c3[160], old[200], err[600], out[200];
	struct ps_client *w[NW], *mon;
	struct ps_config *c = malloc(sizeof(*c));
	pid_t srv[6];
	uint64_t b, k;
	int np = with_pairs ? 2 : 1; /* processes a shard */

	ck_assert_ptr_nonnull(c);
	async_mode = async;
	unknown_mode = 0;
	rows_only = !dense_in_cfg;
	pairs = with_pairs;
	strcpy(dir, "/tmp/ps-reshard-rows-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(ck, sizeof(ck), "%s/ck", dir);
	ck_assert_int_eq(mkdir(ck, 0700), 0);
	snprintf(ptr, sizeof(ptr), "%s/current", dir);
	write_cfg("c2", 2, c2, sizeof(c2));
	ck_assert_msg(ps_config_load(&cfg0, c2, err, sizeof(err)) == 0, "%s", err);
	point_at(c2);
	setenv("PS_CONFIG_FOLLOW", ptr, 1);
	for (int r = 0; r < 2 * np; r++)
		srv[r] = start_replica(c2, r % 2, r / 2, NULL, 0);
	for (int r = 0; r < NW; r++) {
		int rc = -1;
		for (int i = 0; i < 100 && rc; i++)
			if ((rc = ps_client_init(&w[r], &cfg0, r, err, sizeof(err))))
				tu_sleep_ms(100);
		ck_assert_msg(rc == 0, "%s", err);
	}
	/* clocks 0..3 of rows alone */
	for (k = 0; k < 4; k++)
		push_rows_clock(w, k);
	snprintf(out, sizeof(out), "%s/pstat.out", dir);
	const char *pstat[] = { "bin/ps-stat", "--config", c2, "--reshard-stop", NULL };
	ck_assert_int_eq(tu_wait_exit(tu_spawn(pstat, out)), 0);
	b = stop_clock(out);
	ck_assert_msg(b == 4, "ps-stat (%s) stopped at clock %" PRIu64 ", the rows' top clock is 4",
		      out, b);
	/* clock 4 of both: refused by the stopping shards, which only then
	 * know the workers are done with the clocks below the stop */
	for (int r = 0; r < NW; r++) {
		for (int j = 0; j < NPER; j++) {
			ids4[r][j] = id_of(idx_of(r, 4, j));
			for (int d = 0; d < DIM; d++)
				g4[r][j * DIM + d] = rgrad(r, 4, j, d);
		}
		pid[r] = ps_client_push_rows_async(w[r], "e", 4, ids4[r], NPER, g4[r], 0);
		ck_assert_msg(pid[r] > 0, "rank %d: %s", r, ps_client_error(w[r]));
	}
	for (int r = 0; r < 2 * np; r++) {
		char log[200];
		snprintf(log, sizeof(log), "%s/c2.yaml-shard-%d%s.log", dir, r % 2, r < 2 ? "" : "-r1");
		ck_assert_msg(tu_wait_exit_s(srv[r], 20) == 0, "old process %d did not exit 0 within 20 s "
			      "of its stop (log %s)", r, log);
		ck_assert_msg(tu_log_says(log, "stopped at clock 4 with its checkpoint written"),
			      "%s: no stop at clock 4 said", log);
		/* a backup stops as its primary does, without taking over (it
		 * learns the workers' finished clocks before its primary exits) */
		ck_assert_msg(r < 2 || tu_log_says(log, "exiting (the backup, as its primary does)"),
			      "%s: the backup did not stop as a backup", log);
	}
	move_old("from2", 2, old, sizeof(old));
	write_cfg("c3", 3, c3, sizeof(c3));
	start_new(c3, 3, old, 2, srv);
	point_at(c3);
	for (int r = 0; r < NW; r++)
		ck_assert_msg(ps_client_wait(w[r], pid[r]) == 0, "rank %d clock 4: %s", r,
			      ps_client_error(w[r]));
	push_rows_clock(w, 5);
	for (int r = 0; r < NW; r++)
		ps_client_free(w[r]);
	unsetenv("PS_CONFIG_FOLLOW");
	ck_assert_msg(ps_config_load(c, c3, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(ps_client_init(&mon, c, -1, err, sizeof(err)) == 0, "%s", err);
	for (int i = 0; i < NIDS; i++)
		all[i] = id_of(i);
	ck_assert_msg(ps_client_pull_rows(mon, "e", async ? 0 : 6, all, NIDS, rows) == 0, "%s",
		      ps_client_error(mon));
	for (int i = 0; i < NIDS; i++) {
		expect_row(i, 6, want);
		ck_assert_msg(!memcmp(want, rows + i * DIM, sizeof(want)), "row %d: %g %g %g %g, "
			      "the exact sum gives %g %g %g %g", i, rows[i * DIM],
			      rows[i * DIM + 1], rows[i * DIM + 2], rows[i * DIM + 3], want[0],
			      want[1], want[2], want[3]);
	}
	ps_client_free(mon);
	free(c);
	for (int r = 0; r < 3 * np; r++)
		ck_assert_int_eq(tu_stop_server(srv[r]), 0);
	ck_assert_int_eq(tu_rmtree(dir), 0);
	rows_only = 0;
	pairs = 0;
}

/* sync, the config's dense tensor never pushed */
START_TEST(test_rows_only_sync)
{
	run_rows_only(0, 1, 0);
}
END_TEST

/* async, a config of the table alone */
START_TEST(test_rows_only_async)
{
	run_rows_only(1, 0, 0);
}
END_TEST

/* async, the table alone, pairs (cluster.replicas: 1): the backups reach
 * the stop through replication and exit 0 with their checkpoints too */
START_TEST(test_rows_only_async_pairs)
{
	run_rows_only(1, 0, 1);
}
END_TEST

/* sync, the dense tensor never pushed, pairs */
START_TEST(test_rows_only_sync_pairs)
{
	run_rows_only(0, 1, 1);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("reshard_rows");
	TCase *tc = tcase_create("live");

	tcase_set_timeout(tc, 300);
	TU_ADD(tc, test_rows_sync_2_3_2);
	TU_ADD(tc, test_rows_async_2_3_2);
	TU_ADD(tc, test_rows_async_unknown_2_3_2);
	TU_ADD(tc, test_rows_only_sync);
	TU_ADD(tc, test_rows_only_async);
	TU_ADD(tc, test_rows_only_async_pairs);
	TU_ADD(tc, test_rows_only_sync_pairs);
	suite_add_tcase(s, tc);
	return tu_run_suite(s);
}
