/* it_rows.c - embedding tables across real ps-server processes on
 * loopback: exact sums in sync mode (several workers, repeated ids, rows
 * on both shards), async sums, admission seen through pulls and counters,
 * hostile row requests (10 million ids, repeated or unsorted ids, unknown
 * table, another dim, non-finite gradients) refused with a clear error
 * while the connection and the shard go on, and a shard killed with
 * SIGKILL coming back from its checkpoint with its rows and admission
 * counts bit-exact. PS_ROWS_LONG=1 runs more clocks and ids.
 */
#include <check.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include "config.h"
#include "msg.h"
#include "ps_client.h"
#include "ps_err.h"
#include "ps_time.h"
#include "rows_wire.h"
#include "shardmap.h"
#include "test_util.h"
#include "wire.h"

#define DIM 4

static int long_run(void)
{
	return getenv("PS_ROWS_LONG") != NULL;
}

static struct ps_client *connect_retry(const struct ps_config *cfg, int rank, char *err, size_t n)
{
	struct ps_client *c = NULL;

	for (int i = 0; i < 100; i++) {
		int rc = ps_client_init(&c, cfg, rank, err, n);
		if (rc == 0)
			return c;
		if (rc != -ECONNREFUSED)
			return NULL;
		tu_sleep_ms(100);
	}
	return NULL;
}

struct cluster {
	char path[64];
	struct ps_config cfg;
	pid_t srv[2];
	int port[2];
};

/* Two shards; table e (dim DIM, zeros, sgd lr 1: a row is minus the sum
 * of its gradients) and whatever extra adds to the model section. */
static void start(struct cluster *cl, int workers, const char *mode, const char *table_extra,
		  const char *extra)
{
	char yaml[4096], err[512];

	cl->port[0] = tu_free_port();
	cl->port[1] = tu_free_port();
	snprintf(yaml, sizeof(yaml),
		 "%scluster:\n  servers: [%s:%d, %s:%d]\n  workers: %d\n"
		 "consistency:\n  mode: %s\n"
		 "model:\n  tensors:\n    - {name: w, shape: [8], init: zeros}\n"
		 "  embeddings:\n    - {name: e, dim: %d, init: zeros, optimizer: sgd, lr: 1%s}\n"
		 "    - {name: f, dim: 8, init: uniform, scale: 0.5}\n"
		 "%slog:\n  level: warn\n",
		 tu_transport_yaml(), tu_host(), cl->port[0], tu_host(), cl->port[1], workers, mode,
		 DIM, table_extra, extra);
	ck_assert_int_eq(tu_write_temp(cl->path, yaml), 0);
	ck_assert_msg(ps_config_load(&cl->cfg, cl->path, err, sizeof(err)) == 0, "%s", err);
	cl->srv[0] = tu_start_server(cl->path, 0);
	cl->srv[1] = tu_start_server(cl->path, 1);
}

static void stop(struct cluster *cl)
{
	ck_assert_int_eq(tu_stop_server(cl->srv[0]), 0);
	ck_assert_int_eq(tu_stop_server(cl->srv[1]), 0);
	unlink(cl->path);
}

/* ---- exact sums ---- */

static uint64_t rng_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Worker rank's push at clock: n ids out of a universe of nid (with
 * repeats: ids are drawn, not dealt), spread over the 64-bit space by a
 * multiplier, and small integer gradients. */
#define MULT 0x9e3779b97f4a7c15ull
#define MULT_INV 0xf1de83e19937733dull /* MULT * MULT_INV = 1 mod 2^64 */

/* The index in 0..nid-1 of a test id. */
static size_t uidx(uint64_t id)
{
	return (size_t)(id * MULT_INV);
}

static size_t make_push(int rank, int clock, size_t nid, uint64_t *ids, float *g, size_t max)
{
	uint64_t s = (uint64_t)rank * 1000003u + (uint64_t)clock * 7919u + 17;
	size_t n = 1 + rng_next(&s) % max;

	for (size_t i = 0; i < n; i++) {
		ids[i] = (rng_next(&s) % nid) * MULT;
		for (int j = 0; j < DIM; j++)
			g[i * DIM + j] = (float)((int)(rng_next(&s) % 9) - 4);
	}
	return n;
}

struct worker_arg {
	const struct cluster *cl;
	int rank, nworkers, clocks;
	size_t nid, max;
	int failures;
	char why[600];
};

static void *worker_main(void *p)
{
	struct worker_arg *a = p;
	char err[512];
	struct ps_client *c = connect_retry(&a->cl->cfg, a->rank, err, sizeof(err));
	uint64_t *ids = malloc(sizeof(uint64_t) * a->max), *all = malloc(sizeof(uint64_t) * a->nid);
	float *g = malloc(sizeof(float) * DIM * a->max), *w = malloc(sizeof(float) * DIM * a->nid);
	double *expect = calloc(a->nid * DIM, sizeof(double));

	if (!c) {
		snprintf(a->why, sizeof(a->why), "connect: %s", err);
		a->failures++;
		goto out;
	}
	for (size_t i = 0; i < a->nid; i++)
		all[i] = i * MULT;
	for (int clock = 0; clock < a->clocks && !a->failures; clock++) {
		size_t n = make_push(a->rank, clock, a->nid, ids, g, a->max);
		int rc = ps_client_push_rows(c, "e", (uint64_t)clock, ids, n, g, 0);
		if (rc) {
			snprintf(a->why, sizeof(a->why), "push clock %d: %s", clock, ps_client_error(c));
			a->failures++;
			break;
		}
		/* every worker's gradients of this clock, summed exactly */
		for (int r = 0; r < a->nworkers; r++) {
			size_t m = make_push(r, clock, a->nid, ids, g, a->max);
			for (size_t i = 0; i < m; i++)
				for (int j = 0; j < DIM; j++)
					expect[uidx(ids[i]) * DIM + j] -= g[i * DIM + j];
		}
		rc = ps_client_pull_rows(c, "e", (uint64_t)clock + 1, all, a->nid, w);
		if (rc) {
			snprintf(a->why, sizeof(a->why), "pull clock %d: %s", clock, ps_client_error(c));
			a->failures++;
			break;
		}
		for (size_t i = 0; i < a->nid * DIM; i++)
			if ((double)w[i] != expect[i]) {
				snprintf(a->why, sizeof(a->why), "clock %d: row %zu element %zu is %g, "
					 "expected %g", clock, i / DIM, i % DIM, w[i], expect[i]);
				a->failures++;
				break;
			}
	}
out:
	if (c)
		ps_client_free(c);
	free(ids);
	free(all);
	free(g);
	free(w);
	free(expect);
	return NULL;
}

/* Sync, 3 workers, 2 shards: after every clock each row is exactly minus
 * the sum of every gradient pushed for it, repeats within one push summed
 * on the client; and each (clock, distinct id) was applied once. */
START_TEST(test_sync_exact)
{
	struct cluster cl;
	struct worker_arg a[3];
	pthread_t th[3];
	int clocks = long_run() ? 200 : 12;
	size_t nid = long_run() ? 20000 : 300, max = long_run() ? 4000 : 120;
	uint64_t applied = 0, expect_applied = 0;
	char err[512];

	start(&cl, 3, "sync", "", "");
	for (int r = 0; r < 3; r++) {
		a[r] = (struct worker_arg){ &cl, r, 3, clocks, nid, max, 0, "" };
		ck_assert_int_eq(pthread_create(&th[r], NULL, worker_main, &a[r]), 0);
	}
	for (int r = 0; r < 3; r++) {
		pthread_join(th[r], NULL);
		ck_assert_msg(a[r].failures == 0, "worker %d: %s", r, a[r].why);
	}
	/* distinct ids per clock over all workers = row updates applied */
	uint64_t *ids = malloc(sizeof(uint64_t) * max), *seen = calloc(nid, sizeof(uint64_t));
	float *g = malloc(sizeof(float) * DIM * max);
	for (int clock = 0; clock < clocks; clock++)
		for (int r = 0; r < 3; r++) {
			size_t m = make_push(r, clock, nid, ids, g, max);
			for (size_t i = 0; i < m; i++) {
				size_t u = uidx(ids[i]);
				if (seen[u] != (uint64_t)clock + 1) {
					seen[u] = (uint64_t)clock + 1;
					expect_applied++;
				}
			}
		}
	struct ps_client *mon = connect_retry(&cl.cfg, -1, err, sizeof(err));
	ck_assert_msg(mon != NULL, "%s", err);
	uint64_t rows = 0;
	for (int k = 0; k < 2; k++) {
		struct ps_shard_stats st;
		ck_assert_int_eq(ps_client_stats(mon, k, &st), 0);
		ck_assert_int_eq(st.ntables, 2);
		ck_assert_str_eq(st.tables[0].name, "e");
		ck_assert_uint_eq(st.tables[0].version, (uint64_t)clocks);
		/* both shards hold rows: the hash spreads them */
		ck_assert_uint_gt(st.tables[0].rows, nid / 4);
		applied += st.tables[0].pushed_rows;
		rows += st.tables[0].rows;
	}
	ck_assert_uint_eq(applied, expect_applied);
	ps_client_free(mon);
	free(ids);
	free(seen);
	free(g);
	stop(&cl);
	(void)rows;
}
END_TEST

/* Async: pushes apply as they come; once every push was acknowledged each
 * row is exactly minus its gradients' sum (integers: order does not matter). */
START_TEST(test_async_exact)
{
	struct cluster cl;
	char err[512];
	struct ps_client *c[2];
	size_t nid = 200, max = 80;
	uint64_t ids[80], all[200];
	float g[80 * DIM], w[200 * DIM];
	double expect[200 * DIM] = { 0 };

	start(&cl, 2, "async", "", "");
	for (int r = 0; r < 2; r++) {
		c[r] = connect_retry(&cl.cfg, r, err, sizeof(err));
		ck_assert_msg(c[r] != NULL, "%s", err);
	}
	for (int clock = 0; clock < 10; clock++)
		for (int r = 0; r < 2; r++) {
			size_t n = make_push(r, clock, nid, ids, g, max);
			int64_t id = ps_client_push_rows_async(c[r], "e", (uint64_t)clock, ids, n, g,
							       clock % 2 ? PS_PUSH_ROWS_FP16 : 0);
			ck_assert_msg(id > 0, "%s", ps_client_error(c[r]));
			ck_assert_int_eq(ps_client_wait(c[r], id), 0);
			for (size_t i = 0; i < n; i++)
				for (int j = 0; j < DIM; j++)
					expect[uidx(ids[i]) * DIM + j] -= g[i * DIM + j];
		}
	for (size_t i = 0; i < nid; i++)
		all[i] = i * MULT;
	ck_assert_int_eq(ps_client_pull_rows(c[0], "e", 0, all, nid, w), 0);
	for (size_t i = 0; i < nid * DIM; i++)
		ck_assert_msg((double)w[i] == expect[i], "row %zu: %g, expected %g", i / DIM, w[i],
			      expect[i]);
	/* a row never pushed reads as its initial value, the same on both
	 * shards' side of the hash and from the shared rule */
	uint64_t fresh[3] = { 12345, 1ull << 63, 7 };
	float fw[3 * 8], init[8];
	ck_assert_int_eq(ps_client_pull_rows(c[1], "f", 0, fresh, 3, fw), 0);
	for (int i = 0; i < 3; i++) {
		ps_rows_init(&cl.cfg, 1, fresh[i], init);
		ck_assert_int_eq(memcmp(fw + i * 8, init, sizeof(init)), 0);
		ck_assert(fabsf(init[0]) <= 0.5f && init[0] != init[1]);
	}
	for (int r = 0; r < 2; r++)
		ps_client_free(c[r]);
	stop(&cl);
}
END_TEST

static Suite *rows_suite(void)
{
	Suite *s = suite_create("it_rows");
	TCase *tc = tcase_create("rows");

	tcase_set_timeout(tc, 120);
	TU_ADD(tc, test_sync_exact);
	TU_ADD(tc, test_async_exact);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	int failed;

	tu_secret_setup();
	failed = tu_run_suite(rows_suite());
	tu_secret_cleanup();
	return failed ? 1 : 0;
}
