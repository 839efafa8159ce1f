/* it_rows.c - embedding tables across real ps-server processes on
 * loopback: exact sums in sync mode (several workers, repeated ids, rows
 * on both shards), async sums, admission seen through pulls and counters,
 * hostile row requests (10 million ids, repeated or unsorted ids, unknown
 * table, another dim, non-finite gradients) refused with a clear error
 * while the connection and the shard go on, and a shard killed with
 * SIGKILL coming back from its checkpoint with its rows and admission
 * counts bit-exact, also when killed at each step of writing one. PS_ROWS_LONG=1 runs more clocks and ids.
 */
#include <check.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <zlib.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include "config.h"
#include "ckpt_format.h"
#include "config_agree.h"
#include "msg.h"
#include "ps_client.h"
#include "ps_err.h"
#include "ps_time.h"
#include "rows_wire.h"
#include "shardmap.h"
#include "test_raw.h"
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
static void start_def(struct cluster *cl, int workers, const char *mode, const char *e_def,
		      const char *extra)
{
	char yaml[4096], err[512];

	cl->port[0] = tu_free_port();
	cl->port[1] = tu_free_port();
	snprintf(yaml, sizeof(yaml),
		 "%scluster:\n  servers: [%s:%d, %s:%d]\n  workers: %d\n"
		 "consistency:\n  mode: %s\n"
		 "model:\n  tensors:\n    - {name: w, shape: [8], init: zeros}\n"
		 "  embeddings:\n    - {name: e, dim: %d, %s}\n"
		 "    - {name: f, dim: 8, init: uniform, scale: 0.5}\n"
		 "%slog:\n  level: warn\n",
		 tu_transport_yaml(), tu_host(), cl->port[0], tu_host(), cl->port[1], workers, mode,
		 DIM, e_def, extra);
	ck_assert_int_eq(tu_write_temp(cl->path, yaml), 0);
	ck_assert_msg(ps_config_load(&cl->cfg, cl->path, err, sizeof(err)) == 0, "%s", err);
	cl->srv[0] = tu_start_server(cl->path, 0);
	cl->srv[1] = tu_start_server(cl->path, 1);
}

static void start(struct cluster *cl, int workers, const char *mode, const char *table_extra,
		  const char *extra)
{
	char def[256];

	snprintf(def, sizeof(def), "init: zeros, optimizer: sgd, lr: 1%s", table_extra);
	start_def(cl, workers, mode, def, extra);
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
	/* ps-stat shows the same tables, in its text and its JSON */
	for (int json = 0; json < 2; json++) {
		char cmd[256], out[16384], want[128];
		size_t len = 0;
		snprintf(cmd, sizeof(cmd), "bin/ps-stat --config %s%s 2>&1", cl.path,
			 json ? " --json" : "");
		FILE *p = popen(cmd, "r");
		ck_assert_ptr_nonnull(p);
		len = fread(out, 1, sizeof(out) - 1, p);
		out[len] = 0;
		ck_assert_int_eq(pclose(p), 0);
		for (int k = 0; k < 2; k++) {
			struct ps_shard_stats st;
			ck_assert_int_eq(ps_client_stats(mon, k, &st), 0);
			if (json)
				snprintf(want, sizeof(want), "\"name\":\"e\",\"dim\":4,\"rows\":%" PRIu64
					 ",", st.tables[0].rows);
			else
				snprintf(want, sizeof(want), "e                %-5d %12" PRIu64, k,
					 st.tables[0].rows);
			ck_assert_msg(strstr(out, want), "'%s' not in:\n%s", want, out);
		}
	}
	ps_client_free(mon);
	free(ids);
	free(seen);
	free(g);
	stop(&cl);
	(void)rows;
}
END_TEST

static size_t ndistinct(const uint64_t *ids, size_t n)
{
	size_t d = 0;

	for (size_t i = 0; i < n; i++) {
		size_t j = 0;
		while (j < i && ids[j] != ids[i])
			j++;
		d += j == i;
	}
	return d;
}

/* The bytes a row pull of the n distinct ids sends (each shard's part
 * delta-varint coded in ascending order): what ps_client_rows_bytes
 * counts as sent for it. */
static uint64_t pull_id_bytes(const struct ps_config *cfg, int t, const uint64_t *ids, size_t n)
{
	uint64_t key = ps_rows_table_key(&cfg->tables[t]), total = 0;
	uint64_t *part = malloc(sizeof(uint64_t) * n);
	uint8_t *enc = malloc(n * PS_VARINT_MAX + 1);

	ck_assert(part && enc);
	for (int k = 0; k < cfg->nshards; k++) {
		size_t m = 0;
		for (size_t i = 0; i < n; i++)
			if (ps_rows_shard(key, ids[i], cfg->nshards) == k)
				part[m++] = ids[i];
		for (size_t i = 1; i < m; i++) /* insertion sort: ascending */
			for (size_t j = i; j > 0 && part[j - 1] > part[j]; j--) {
				uint64_t x = part[j];
				part[j] = part[j - 1];
				part[j - 1] = x;
			}
		if (m)
			total += ps_rows_ids_encode(part, m, enc);
	}
	free(part);
	free(enc);
	return total;
}

/* Async: pushes apply as they come; once every push was acknowledged each
 * row is exactly minus its gradients' sum (integers: order does not matter).
 * And the byte figures of the row path, each against what the calls did:
 * the shards' push bytes by codec (as float32: distinct ids x dim x 4; as
 * received: what the clients say they sent), bytes_in, the pull replies'
 * bytes and bytes_out, the tables' pulled and pushed rows, and each
 * client's ps_client_rows_bytes (given: ids and gradients as passed in). */
START_TEST(test_async_exact)
{
	struct cluster cl;
	char err[512];
	struct ps_client *c[2];
	size_t nid = 200, max = 80;
	uint64_t ids[80], all[200];
	float g[80 * DIM], w[200 * DIM];
	double expect[200 * DIM] = { 0 };
	uint64_t raw[2] = { 0, 0 }, given[2] = { 0, 0 }, pushed = 0, sent[2] = { 0, 0 };
	uint64_t sent_by[2] = { 0, 0 }; /* by codec: raw, fp16 */

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
			raw[clock % 2] += ndistinct(ids, n) * DIM * 4;
			pushed += ndistinct(ids, n);
			given[r] += n * (8 + 4 * DIM);
			uint64_t gv1, sn1;
			ps_client_rows_bytes(c[r], &gv1, &sn1);
			sent_by[clock % 2] += sn1 - sent[r];
			sent[r] = sn1;
		}
	/* the push figures, before any pull */
	uint64_t sent_push = 0, wire[2] = { 0, 0 }, in = 0, raw_got[2] = { 0, 0 }, gv[2], sn[2];
	for (int r = 0; r < 2; r++) {
		ps_client_rows_bytes(c[r], &gv[r], &sn[r]);
		ck_assert_msg(gv[r] == given[r], "rank %d: ps_client_rows_bytes gives %" PRIu64
			      " bytes given, %" PRIu64 " were passed in", r, gv[r], given[r]);
		sent_push += sn[r];
	}
	for (int k = 0; k < 2; k++) {
		struct ps_shard_stats st;
		ck_assert_int_eq(ps_client_stats(c[0], k, &st), 0);
		for (int x = 0; x < 2; x++) {
			raw_got[x] += st.push_raw_bytes[x];
			wire[x] += st.push_wire_bytes[x];
		}
		in += st.bytes_in;
		ck_assert_uint_eq(st.pull_raw_bytes, 0);
	}
	for (int x = 0; x < 2; x++)
		ck_assert_msg(raw_got[x] == raw[x], "the shards count %" PRIu64 " bytes of %s row "
			      "gradients as float32; the pushes held %" PRIu64, raw_got[x],
			      x ? "fp16" : "raw", raw[x]);
	for (int x = 0; x < 2; x++)
		ck_assert_msg(wire[x] == sent_by[x], "the shards received %" PRIu64 " bytes of %s "
			      "row pushes; the clients sent %" PRIu64, wire[x], x ? "fp16" : "raw",
			      sent_by[x]);
	ck_assert_msg(in == sent_push && sent_by[0] + sent_by[1] == sent_push, "the shards' "
		      "bytes_in: %" PRIu64 "; the clients sent %" PRIu64 " bytes of row pushes", in,
		      sent_push);
	ck_assert(sent_by[1] < sent_by[0]); /* fp16: 2 bytes a value */
	for (size_t i = 0; i < nid; i++)
		all[i] = i * MULT;
	ck_assert_int_eq(ps_client_pull_rows(c[0], "e", 0, all, nid, w), 0);
	ps_client_rows_bytes(c[0], &gv[0], &sn[0]);
	ck_assert_uint_eq(gv[0], given[0] + nid * 8);
	ck_assert_uint_eq(sn[0], sent_push - sn[1] + pull_id_bytes(&cl.cfg, 0, all, nid));
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
	/* the pull replies: raw (compression.pull none), nid rows of e and 3
	 * of f (dim 8); every row pushed once per push it was named in */
	uint64_t praw = 0, pwire = 0, out = 0, pulled[2] = { 0, 0 }, pushed_got = 0;
	for (int k = 0; k < 2; k++) {
		struct ps_shard_stats st;
		ck_assert_int_eq(ps_client_stats(c[0], k, &st), 0);
		praw += st.pull_raw_bytes;
		pwire += st.pull_wire_bytes;
		out += st.bytes_out;
		for (int t = 0; t < 2; t++)
			pulled[t] += st.tables[t].pulled_rows;
		pushed_got += st.tables[0].pushed_rows;
	}
	ck_assert_msg(praw == (nid * DIM + 3 * 8) * 4 && pwire == praw && out == praw,
		      "row pull replies: %" PRIu64 " bytes as float32, %" PRIu64 " sent, bytes_out %"
		      PRIu64 "; %zu due", praw, pwire, out, (nid * DIM + 3 * 8) * 4);
	ck_assert_msg(pulled[0] == nid && pulled[1] == 3, "pulled rows: e %" PRIu64 ", f %" PRIu64
		      "; %zu and 3 due", pulled[0], pulled[1], nid);
	ck_assert_msg(pushed_got == pushed, "pushed rows of e: %" PRIu64 "; %" PRIu64 " due",
		      pushed_got, pushed);
	ps_client_rows_bytes(c[1], &gv[1], &sn[1]);
	ck_assert_uint_eq(gv[1], given[1] + 3 * 8);
	for (int r = 0; r < 2; r++)
		ps_client_free(c[r]);
	stop(&cl);
}
END_TEST


/* Async with staleness 1: a row pull is answered once the slowest worker
 * has ended the caller's clock minus 1, as a dense pull. Worker 0 ends
 * clocks 0-2 (its pulls carry clock 3) and worker 2 clocks 0-4 (clock 5),
 * worker 1 none: both pulls wait. Worker 1 ending clock 0 answers
 * neither; ending clock 1 answers worker 0's (its rows as pushed) and not
 * worker 2's; once workers 0 and 1 have ended clock 3, worker 2's. */
static void end_clock(struct ps_client *c, uint64_t clock)
{
	int64_t id = ps_client_push(c, clock, NULL, 0, PS_PUSH_END_CLOCK);

	ck_assert_msg(id > 0 && ps_client_wait(c, id) == 0, "%s", ps_client_error(c));
}

START_TEST(test_async_row_pull_staleness)
{
	struct cluster cl;
	char err[512];
	struct ps_client *c[3];
	uint64_t ids[2] = { 21, 22 };
	float g[2 * DIM], w0[2 * DIM], w2[2 * DIM];
	int64_t p0, p2;

	start(&cl, 3, "async\n  staleness: 1", "", "");
	for (int r = 0; r < 3; r++) {
		c[r] = connect_retry(&cl.cfg, r, err, sizeof(err));
		ck_assert_msg(c[r] != NULL, "%s", err);
	}
	for (int i = 0; i < 2 * DIM; i++)
		g[i] = (float)(i + 1);
	ck_assert_int_eq(ps_client_push_rows(c[2], "e", 0, ids, 2, g, 0), 0);
	for (uint64_t k = 0; k < 5; k++) {
		if (k < 3)
			end_clock(c[0], k);
		end_clock(c[2], k);
	}
	p0 = ps_client_pull_rows_async(c[0], "e", 0, ids, 2, w0);
	p2 = ps_client_pull_rows_async(c[2], "e", 0, ids, 2, w2);
	ck_assert(p0 > 0 && p2 > 0);
	ck_assert_int_eq(ps_client_wait_timeout(c[0], p0, 0.5), PS_ETIMEDOUT);
	end_clock(c[1], 0);
	ck_assert_msg(ps_client_wait_timeout(c[0], p0, 0.5) == PS_ETIMEDOUT, "worker 0's pull "
		      "(clock 3) answered with worker 1 at clock 1");
	end_clock(c[1], 1);
	ck_assert_msg(ps_client_wait_timeout(c[0], p0, 10 * tu_time_scale()) == 0, "worker 0's "
		      "pull (clock 3) with every worker past clock 1: %s", ps_client_error(c[0]));
	for (int i = 0; i < 2 * DIM; i++)
		ck_assert_msg(w0[i] == -g[i], "element %d is %g", i, w0[i]);
	ck_assert_msg(ps_client_done(c[2], p2) == 0, "worker 2's pull (clock 5) answered with "
		      "workers 0 and 1 at clock 3 and 2");
	end_clock(c[1], 2);
	end_clock(c[1], 3);
	ck_assert_int_eq(ps_client_wait_timeout(c[2], p2, 0.3), PS_ETIMEDOUT);
	end_clock(c[0], 3);
	ck_assert_msg(ps_client_wait_timeout(c[2], p2, 10 * tu_time_scale()) == 0, "worker 2's "
		      "pull (clock 5) with every worker past clock 3: %s", ps_client_error(c[2]));
	ck_assert_int_eq(memcmp(w2, w0, sizeof(w0)), 0);
	for (int r = 0; r < 3; r++)
		ps_client_free(c[r]);
	stop(&cl);
}
END_TEST

/* Sync with a worker that leaves: once it has had no connection for
 * limits.idle_timeout_ms the tables' clocks go on without it, what it
 * pushed before it left still counted. And the TTL: rows not updated for
 * ttl seconds go, and read as their initial value again. */
START_TEST(test_sync_worker_leaves_and_ttl)
{
	struct cluster cl;
	char err[512];
	struct ps_client *c0, *c1, *mon;
	uint64_t ids[3] = { 11, 12, 13 };
	float g[3 * DIM], w[3 * DIM];

	start(&cl, 2, "sync", ", ttl: 4", "limits:\n  idle_timeout_ms: 1500\n");
	c0 = connect_retry(&cl.cfg, 0, err, sizeof(err));
	ck_assert_msg(c0 != NULL, "%s", err);
	c1 = connect_retry(&cl.cfg, 1, err, sizeof(err));
	ck_assert_msg(c1 != NULL, "%s", err);
	for (int i = 0; i < 3 * DIM; i++)
		g[i] = 1.0f;
	ck_assert_int_eq(ps_client_push_rows(c1, "e", 0, ids, 3, g, 0), 0);
	ps_client_free(c1); /* worker 1 leaves after clock 0 */
	double t0 = ps_now_s();
	for (int clock = 0; clock < 3; clock++)
		ck_assert_msg(ps_client_push_rows(c0, "e", (uint64_t)clock, ids, 3, g, 0) == 0, "%s",
			      ps_client_error(c0));
	/* clock 1 waits for worker 1 until it is dropped, then goes on */
	ck_assert_msg(ps_client_pull_rows(c0, "e", 3, ids, 3, w) == 0, "%s", ps_client_error(c0));
	ck_assert_msg(ps_now_s() - t0 > 1.0, "clock 1 applied without waiting for worker 1");
	for (int i = 0; i < 3 * DIM; i++) /* worker 0's three clocks and worker 1's one */
		ck_assert_msg(w[i] == -4.0f, "element %d is %g", i, w[i]);
	/* worker 1 comes back and pushes rows for clock 2, which the tables
	 * applied without it (it never ended a clock here): acknowledged and
	 * set aside, not applied and not refused */
	mon = connect_retry(&cl.cfg, -1, err, sizeof(err));
	ck_assert_msg(mon != NULL, "%s", err);
	uint64_t errors0 = 0, errors1 = 0;
	for (int k = 0; k < 2; k++) {
		struct ps_shard_stats st;
		ck_assert_int_eq(ps_client_stats(mon, k, &st), 0);
		errors0 += st.errors;
	}
	c1 = connect_retry(&cl.cfg, 1, err, sizeof(err));
	ck_assert_msg(c1 != NULL, "%s", err);
	ck_assert_msg(ps_client_push_rows(c1, "e", 2, ids, 3, g, 0) == 0, "the late push of the "
		      "worker that came back: %s", ps_client_error(c1));
	ck_assert_int_eq(ps_client_pull_rows(c1, "e", 3, ids, 3, w), 0);
	for (int i = 0; i < 3 * DIM; i++)
		ck_assert_msg(w[i] == -4.0f, "element %d is %g after the late push", i, w[i]);
	for (int k = 0; k < 2; k++) {
		struct ps_shard_stats st;
		ck_assert_int_eq(ps_client_stats(mon, k, &st), 0);
		errors1 += st.errors;
		ck_assert_uint_eq(st.tables[0].version, 3);
	}
	ck_assert_uint_eq(errors1, errors0);
	ps_client_free(c1);
	/* no update for the ttl (4 s): the rows expire and read as their initial value */
	uint64_t expired = 0;
	for (double dl = ps_now_s() + 10 * tu_time_scale(); expired < 3 && ps_now_s() < dl;) {
		expired = 0;
		for (int k = 0; k < 2; k++) {
			struct ps_shard_stats st;
			ck_assert_int_eq(ps_client_stats(mon, k, &st), 0);
			expired += st.tables[0].expired;
		}
		if (expired < 3)
			tu_sleep_ms(100);
	}
	ck_assert_uint_eq(expired, 3);
	ck_assert_int_eq(ps_client_pull_rows(c0, "e", 0, ids, 3, w), 0);
	for (int i = 0; i < 3 * DIM; i++)
		ck_assert(w[i] == 0.0f);
	ps_client_free(mon);
	ps_client_free(c0);
	stop(&cl);
}
END_TEST


/* Rows and dense tensors in one sync step, the worker's order: rows of
 * clock c, then the dense push that ends c. A clock ended by a dense push
 * alone moves the tables on too (an empty clock for them), and rows pushed
 * for a clock already applied are refused, saying which clocks go. */
START_TEST(test_sync_rows_with_dense_end_clock)
{
	struct cluster cl;
	char err[512];
	struct ps_client *c;
	uint64_t ids[2] = { 5, 1ull << 40 };
	float g[2 * DIM], w[2 * DIM], dw[8] = { 0 }, dg[8];
	struct ps_tensor tg = { "w", dg, 8, 0 }, tw = { "w", dw, 8, 0 };

	start(&cl, 1, "sync", "", "");
	c = connect_retry(&cl.cfg, 0, err, sizeof(err));
	ck_assert_msg(c != NULL, "%s", err);
	for (int i = 0; i < 2 * DIM; i++)
		g[i] = (float)(i + 1);
	for (int i = 0; i < 8; i++)
		dg[i] = 1.0f;
	ck_assert_int_eq(ps_client_push_rows(c, "e", 0, ids, 2, g, 0), 0);
	int64_t id = ps_client_push(c, 0, &tg, 1, PS_PUSH_END_CLOCK);
	ck_assert_int_gt(id, 0);
	ck_assert_int_eq(ps_client_wait(c, id), 0);
	ck_assert_int_eq(ps_client_pull_rows(c, "e", 1, ids, 2, w), 0);
	for (int i = 0; i < 2 * DIM; i++)
		ck_assert(w[i] == -(float)(i + 1));
	/* clock 1: dense only */
	id = ps_client_push(c, 1, &tg, 1, PS_PUSH_END_CLOCK);
	ck_assert_int_gt(id, 0);
	ck_assert_int_eq(ps_client_wait(c, id), 0);
	ck_assert_int_eq(ps_client_pull_rows(c, "e", 2, ids, 2, w), 0);
	ck_assert(w[0] == -1.0f);
	id = ps_client_pull(c, 2, &tw, 1);
	ck_assert_int_gt(id, 0);
	ck_assert_int_eq(ps_client_wait(c, id), 0);
	/* rows for clock 1 after it ended: refused */
	ck_assert_int_eq(ps_client_push_rows(c, "e", 1, ids, 2, g, 0), PS_ECLOCK);
	ck_assert_msg(strstr(ps_client_error(c), "accepting clocks 2.."), "%s", ps_client_error(c));
	ps_client_free(c);
	stop(&cl);
}
END_TEST


/* Sync, two workers: worker 0 ends clock 0 with a dense push and already
 * pushes rows for clock 1; worker 1 ends clock 0 with a dense push alone.
 * Clock 0 is then complete without any row push, while rows of clock 1
 * are kept: the tables move to version 1 with the rows as they were (an
 * empty clock) and keep clock 1 for its turn, which adds worker 1's rows
 * (every gradient once). */
START_TEST(test_sync_rows_ahead_of_dense_clock)
{
	struct cluster cl;
	char err[512];
	struct ps_client *c[2];
	uint64_t ids[2] = { 5, 1ull << 40 };
	float g[3][2 * DIM], w[2 * DIM], dg[8]; /* g[0]: not pushed */
	struct ps_tensor tg = { "w", dg, 8, 0 };
	int64_t id;

	start(&cl, 2, "sync", "", "");
	for (int r = 0; r < 2; r++) {
		c[r] = connect_retry(&cl.cfg, r, err, sizeof(err));
		ck_assert_msg(c[r] != NULL, "%s", err);
	}
	for (int i = 0; i < 2 * DIM; i++) {
		g[0][i] = (float)(i + 1);
		g[1][i] = 10.0f * (float)(i + 1);
		g[2][i] = 100.0f * (float)(i + 1);
	}
	for (int i = 0; i < 8; i++)
		dg[i] = 1.0f;
	id = ps_client_push(c[0], 0, &tg, 1, PS_PUSH_END_CLOCK);
	ck_assert_int_gt(id, 0);
	ck_assert_int_eq(ps_client_wait(c[0], id), 0);
	ck_assert_int_eq(ps_client_push_rows(c[0], "e", 1, ids, 2, g[1], 0), 0);
	id = ps_client_push(c[1], 0, &tg, 1, PS_PUSH_END_CLOCK);
	ck_assert_int_gt(id, 0);
	ck_assert_int_eq(ps_client_wait(c[1], id), 0);
	ck_assert_int_eq(ps_client_pull_rows(c[1], "e", 1, ids, 2, w), 0);
	for (int i = 0; i < 2 * DIM; i++)
		ck_assert_msg(w[i] == 0.0f, "element %d at version 1 is %g; clock 0 had no rows", i,
			      w[i]);
	for (int k = 0; k < 2; k++) {
		struct ps_shard_stats st;
		ck_assert_int_eq(ps_client_stats(c[1], k, &st), 0);
		ck_assert_uint_eq(st.tables[0].version, 1);
	}
	ck_assert_int_eq(ps_client_push_rows(c[1], "e", 1, ids, 2, g[2], 0), 0);
	ck_assert_int_eq(ps_client_pull_rows(c[1], "e", 2, ids, 2, w), 0);
	for (int i = 0; i < 2 * DIM; i++)
		ck_assert_msg(w[i] == -g[1][i] - g[2][i], "element %d at version 2 is %g",
			      i, w[i]);
	for (int r = 0; r < 2; r++)
		ps_client_free(c[r]);
	stop(&cl);
}
END_TEST

/* A worker with two row pulls waiting for the sync barrier disconnects:
 * both pulls go with its connection. When the other worker then ends the
 * clock, the shard answers the pulls still waiting and must not touch the
 * freed connection of either (under the sanitizer build, ASan aborts the
 * shard on such a use; here each shard must go on answering and exit 0),
 * and the rows hold both workers' gradients. */
START_TEST(test_waiting_row_pulls_of_closed_worker)
{
	struct cluster cl;
	char err[512];
	struct ps_client *c[2];
	uint64_t ids[2] = { 5, 1ull << 40 };
	float g[2 * DIM], w[2][2 * DIM], dg[8] = { 0 };
	struct ps_tensor tg = { "w", dg, 8, 0 };
	struct ps_shard_stats st[2];

	start(&cl, 2, "sync", "", "");
	for (int r = 0; r < 2; r++) {
		c[r] = connect_retry(&cl.cfg, r, err, sizeof(err));
		ck_assert_msg(c[r] != NULL, "%s", err);
	}
	for (int i = 0; i < 2 * DIM; i++)
		g[i] = (float)(i + 1);
	/* worker 0 ends clock 0 and pulls for version 1 twice: both wait */
	ck_assert_int_eq(ps_client_push_rows(c[0], "e", 0, ids, 2, g, 0), 0);
	int64_t id = ps_client_push(c[0], 0, &tg, 1, PS_PUSH_END_CLOCK);
	ck_assert_int_gt(id, 0);
	ck_assert_int_eq(ps_client_wait(c[0], id), 0);
	uint64_t pulls0 = 0;
	for (int k = 0; k < 2; k++) {
		ck_assert_int_eq(ps_client_stats(c[1], k, &st[k]), 0);
		pulls0 += st[k].pulls;
	}
	for (int i = 0; i < 2; i++)
		ck_assert_int_gt(ps_client_pull_rows_async(c[0], "e", 1, ids, 2, w[i]), 0);
	uint64_t pulls = 0;
	double t0 = ps_now_s();
	while (pulls < pulls0 + 2 && ps_now_s() - t0 < 10 * tu_time_scale()) {
		pulls = 0;
		for (int k = 0; k < 2; k++) {
			ck_assert_int_eq(ps_client_stats(c[1], k, &st[k]), 0);
			pulls += st[k].pulls;
		}
		if (pulls < pulls0 + 2)
			tu_sleep_ms(10);
	}
	ck_assert_msg(pulls >= pulls0 + 2, "the shards got %llu row pulls of 2",
		      (unsigned long long)(pulls - pulls0));
	ps_client_free(c[0]);
	/* until both shards have seen worker 0 go */
	int up = 1;
	for (t0 = ps_now_s(); up && ps_now_s() - t0 < 10 * tu_time_scale();) {
		up = 0;
		for (int k = 0; k < 2; k++) {
			ck_assert_int_eq(ps_client_stats(c[1], k, &st[k]), 0);
			up |= st[k].worker_up[0];
		}
		if (up)
			tu_sleep_ms(10);
	}
	ck_assert_msg(!up, "the shards still see worker 0 connected");
	/* worker 1 ends clock 0: the barrier opens */
	ck_assert_int_eq(ps_client_push_rows(c[1], "e", 0, ids, 2, g, 0), 0);
	id = ps_client_push(c[1], 0, &tg, 1, PS_PUSH_END_CLOCK);
	ck_assert_int_gt(id, 0);
	ck_assert_int_eq(ps_client_wait(c[1], id), 0);
	ck_assert_msg(ps_client_pull_rows(c[1], "e", 1, ids, 2, w[0]) == 0, "%s",
		      ps_client_error(c[1]));
	for (int i = 0; i < 2 * DIM; i++)
		ck_assert_msg(w[0][i] == -2.0f * (float)(i + 1), "row float %d: %g", i,
			      (double)w[0][i]);
	for (int k = 0; k < 2; k++) {
		ck_assert_int_eq(ps_client_stats(c[1], k, &st[k]), 0);
		ck_assert_uint_eq(st[k].errors, 0);
	}
	ps_client_free(c[1]);
	stop(&cl);
}
END_TEST

/* compression.pull: fp16: rows come back as half precision (exact for
 * small integers), half the bytes of float32 on the wire. */
START_TEST(test_pull_fp16)
{
	struct cluster cl;
	char err[512];
	struct ps_client *c;
	uint64_t ids[64];
	float g[64 * DIM], w[64 * DIM];
	struct ps_shard_stats st;
	uint64_t raw = 0, wire = 0;

	start(&cl, 1, "async", "", "compression:\n  pull: fp16\n");
	c = connect_retry(&cl.cfg, 0, err, sizeof(err));
	ck_assert_msg(c != NULL, "%s", err);
	for (int i = 0; i < 64; i++)
		ids[i] = (uint64_t)i * MULT + 3;
	for (int i = 0; i < 64 * DIM; i++)
		g[i] = (float)(i % 13) - 6.0f;
	ck_assert_int_eq(ps_client_push_rows(c, "e", 0, ids, 64, g, 0), 0);
	ck_assert_int_eq(ps_client_pull_rows(c, "e", 0, ids, 64, w), 0);
	for (int i = 0; i < 64 * DIM; i++)
		ck_assert_msg(w[i] == -g[i], "element %d: %g, expected %g", i, w[i], -g[i]);
	for (int k = 0; k < 2; k++) {
		ck_assert_int_eq(ps_client_stats(c, k, &st), 0);
		raw += st.pull_raw_bytes;
		wire += st.pull_wire_bytes;
	}
	ck_assert_uint_eq(raw, 64 * DIM * 4);
	ck_assert_uint_eq(wire, 64 * DIM * 2);
	ps_client_free(c);
	stop(&cl);
}
END_TEST

/* ---- checkpoints: kill -9 and restart ---- */

#include "table.h"

static void stats_of(struct ps_client *mon, int k, struct ps_shard_stats *st)
{
	ck_assert_int_eq(ps_client_stats(mon, k, st), 0);
	ck_assert_int_eq(st->ntables, 2);
}

static char *read_text(const char *f);
static int exit_within(pid_t pid, int ms);

/* The whole of file f, malloc'd, its size in *len. */
static uint8_t *read_file(const char *f, size_t *len)
{
	struct stat sb;
	uint8_t *b;
	FILE *fp;

	ck_assert_int_eq(stat(f, &sb), 0);
	*len = (size_t)sb.st_size;
	b = malloc(*len);
	ck_assert_ptr_nonnull(b);
	fp = fopen(f, "rb");
	ck_assert_ptr_nonnull(fp);
	ck_assert_uint_eq(fread(b, 1, *len, fp), *len);
	fclose(fp);
	return b;
}

/* Writes the edited checkpoint b (len bytes) as f with its CRC made right
 * again, as a buggy or hostile writer would, the original kept as keep;
 * frees b. */
static void write_edited(const char *f, const char *keep, uint8_t *b, size_t len)
{
	uint32_t crc = (uint32_t)crc32(crc32(0L, Z_NULL, 0), b, (uInt)(len - 4));
	FILE *fp;

	memcpy(b + len - 4, &crc, 4);
	ck_assert_int_eq(rename(f, keep), 0);
	fp = fopen(f, "wb");
	ck_assert_ptr_nonnull(fp);
	ck_assert_uint_eq(fwrite(b, 1, len, fp), len);
	ck_assert_int_eq(fclose(fp), 0);
	free(b);
}

/* Edits shard 0's checkpoint in dir (the checksum made right again, as by
 * a buggy or hostile writer) and checks that the shard refuses to start,
 * naming the table and what is wrong; the file is then put back.
 * dup 0: table e claims one row more than the rest of the file could hold
 * (the shard must not read on past the file's end); dup 1: its second row
 * holds the first row's id (a restore inserts a checkpoint's rows without
 * looking each id up, and must still not take an id twice). */
static void check_row_claim_refused(const struct cluster *cl, const char *dir, uint64_t nrows,
				    int dup)
{
	char f[300], keep[300], logf[300], want[160], *log;
	struct ckpt_table ct;
	uint64_t key = ps_rows_table_key(&cl->cfg.tables[0]), claim;
	size_t at = 0, found = 0, len;
	uint8_t *b;
	int rc;

	snprintf(f, sizeof(f), "%s/shard-0.ckpt", dir);
	snprintf(keep, sizeof(keep), "%s/shard-0.kept", dir);
	snprintf(logf, sizeof(logf), "%s/shard-0-claim.log", dir);
	b = read_file(f, &len);
	/* table e's record: its key, dim and row count (the file's order of
	 * records is the shard's business; the record is found by content) */
	for (size_t p = 0; p + sizeof(ct) + 4 <= len; p++) {
		memcpy(&ct, b + p, sizeof(ct));
		if (ct.key == key && ct.dim == DIM && ct.row_floats == DIM && ct.nrows == nrows &&
		    ct.live_rows == nrows) {
			at = p;
			found++;
		}
	}
	ck_assert_msg(found == 1, "table e's record (%" PRIu64 " rows) found %zu times in %s",
		      nrows, found, f);
	memcpy(&ct, b + at, sizeof(ct));
	claim = (len - 4 - at - sizeof(ct)) /
		(sizeof(struct ckpt_row) + sizeof(float) * DIM) + 1;
	if (dup) {
		size_t rb = sizeof(struct ckpt_row) + sizeof(float) * DIM;
		uint64_t id0;
		ck_assert_uint_ge(nrows, 2);
		memcpy(&id0, b + at + sizeof(ct), sizeof(id0));
		memcpy(b + at + sizeof(ct) + rb, &id0, sizeof(id0));
		claim = id0;
	} else {
		ct.nrows = claim;
		memcpy(b + at, &ct, sizeof(ct));
	}
	write_edited(f, keep, b, len);
	rc = exit_within(tu_start_server_log(cl->path, 0, logf), 10000);
	log = read_text(logf);
	if (dup)
		snprintf(want, sizeof(want), "table 'e': row 1 holds id %" PRIu64 ", which an "
			 "earlier row holds", claim);
	else
		snprintf(want, sizeof(want), "shard-0.ckpt: table 'e' claims %" PRIu64 " rows: "
			 "more than the file holds", claim);
	ck_assert_msg(rc == 1 && log && strstr(log, "refusing to start: ") && strstr(log, want),
		      "table e %s (%" PRIu64 ", the file holds %" PRIu64 " rows): the shard %s, its "
		      "log: %s (\"%s\" expected)", dup ? "with an id twice" : "claiming more rows",
		      claim, nrows,
		      rc < 0 ? "did not exit" : "exited", log ? log : "empty", want);
	free(log);
	ck_assert_int_eq(rename(keep, f), 0);
}

/* Shard 0 started on dir's checkpoint with cl's config edited (from ->
 * to, once): it must refuse to start, its log naming the file and want. */
static void check_config_change_refused(const struct cluster *cl, const char *dir,
					const char *from, const char *to, const char *want)
{
	char path[64], logf[300], *yaml = read_text(cl->path), *log, *p;
	char *edited = malloc(strlen(yaml ? yaml : "") + strlen(to) + 1);
	int rc;

	ck_assert_ptr_nonnull(yaml);
	p = strstr(yaml, from);
	ck_assert_msg(p != NULL, "'%s' not in the config", from);
	memcpy(edited, yaml, (size_t)(p - yaml));
	strcpy(edited + (p - yaml), to);
	strcat(edited, p + strlen(from));
	ck_assert_int_eq(tu_write_temp(path, edited), 0);
	snprintf(logf, sizeof(logf), "%s/shard-0-config.log", dir);
	unlink(logf);
	rc = exit_within(tu_start_server_log(path, 0, logf), 10000);
	log = read_text(logf);
	ck_assert_msg(rc == 1 && log && strstr(log, "refusing to start: ") &&
		      strstr(log, "shard-0.ckpt: ") && strstr(log, want), "the config edited "
		      "('%s' for '%s'): the shard %s, its log: %s (\"%s\" expected)", to, from,
		      rc < 0 ? "did not exit" : "exited", log ? log : "empty", want);
	free(log);
	free(yaml);
	free(edited);
	unlink(path);
}

/* Rows, optimizer state (rowwise adagrad on table f), versions and the
 * admission counts of ids not admitted yet come back from the checkpoint
 * after both shards are killed with SIGKILL; checked bit for bit against
 * the same updates made on a table in this process. */
START_TEST(test_checkpoint_kill9)
{
	struct cluster cl;
	char dir[] = "/tmp/ps-rows-ckpt-XXXXXX", extra[256], err[512];
	struct ps_client *c, *mon;
	struct ps_table model;
	enum { N = 64 };
	uint64_t ids[N];
	float g[N * 8], got[N * 8], want[8], ones[N * DIM];
	struct ps_shard_stats before[2], after[2];

	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(extra, sizeof(extra), "checkpoint:\n  dir: %s\n  on_request: true\n"
		 "  min_interval_s: 0\n", dir);
	start(&cl, 1, "sync", ", admission: 3", extra);
	c = connect_retry(&cl.cfg, 0, err, sizeof(err));
	ck_assert_msg(c != NULL, "%s", err);
	mon = connect_retry(&cl.cfg, -1, err, sizeof(err));
	ck_assert_msg(mon != NULL, "%s", err);
	ck_assert_int_eq(ps_table_init(&model, &cl.cfg, 1, 1, ps_now_s()), 0);
	for (int i = 0; i < N; i++)
		ids[i] = (uint64_t)(i + 1) * MULT;
	for (int i = 0; i < N * DIM; i++)
		ones[i] = 1.0f;
	/* clock k pushes ids 0..N-1 to f, and to e the first N - 16 k ids
	 * (admission 3: ids pushed 3 times get rows, the rest only counts) */
	/* clock 0 also gives f BIG more rows of gradient 1: a shard then
	 * restores more rows than the loader reads at a time (4,096) */
	enum { BIG = 12000 };
	uint64_t *bids = malloc(sizeof(uint64_t) * (N + BIG));
	float *bg = malloc(sizeof(float) * 8 * (N + BIG));
	ck_assert(bids && bg);
	for (int i = 0; i < N + BIG; i++)
		bids[i] = (uint64_t)(i + 1) * MULT;
	for (int k = 0; k < 4; k++) {
		for (int i = 0; i < N * 8; i++)
			g[i] = (float)((i * 7 + k * 3) % 11) - 5.0f;
		if (!k) {
			memcpy(bg, g, sizeof(float) * N * 8);
			for (int i = N * 8; i < (N + BIG) * 8; i++)
				bg[i] = 1.0f;
		}
		ck_assert_msg(ps_client_push_rows(c, "f", (uint64_t)k, k ? ids : bids, k ? N : N + BIG,
						  k ? g : bg, 0) == 0, "%s", ps_client_error(c));
		for (int i = 0; i < N; i++)
			ck_assert_int_eq(ps_table_push(&model, ids[i], g + i * 8, 1, ps_now_s()), 1);
		ck_assert_msg(ps_client_push_rows(c, "e", (uint64_t)k, ids, (size_t)(N - 16 * k), ones,
						  0) == 0, "%s", ps_client_error(c));
	}
	/* e: ids 0..15 pushed 4 times, 16..31 3 times (rows), 32..47 twice (counted) */
	ck_assert_int_eq(ps_client_pull_rows(c, "e", 4, ids, N, got), 0);
	/* a row counts from its admission: pushed 4 times, 2 applied; 3 times, 1 */
	for (int i = 0; i < N; i++)
		ck_assert_msg(got[i * DIM] == (i < 16 ? -2.0f : i < 32 ? -1.0f : 0.0f), "e row %d: %g",
			      i, got[i * DIM]);
	float *big0 = malloc(sizeof(float) * 8 * BIG), *big1 = malloc(sizeof(float) * 8 * BIG);
	ck_assert(big0 && big1);
	ck_assert_int_eq(ps_client_pull_rows(c, "f", 4, bids + N, BIG, big0), 0);
	for (int k = 0; k < 2; k++) {
		struct ps_shard_stats st;
		ck_assert_int_eq(ps_client_checkpoint(mon, k, 1, &st), 0);
		ck_assert_msg(st.checkpoint_status == 0, "%s", st.checkpoint_error);
		stats_of(mon, k, &before[k]);
	}
	ck_assert_uint_eq(before[0].tables[0].rows + before[1].tables[0].rows, 32);
	ck_assert_uint_eq(before[0].tables[0].filter_ids + before[1].tables[0].filter_ids, 32);
	ps_client_free(c);
	ps_client_free(mon);
	for (int k = 0; k < 2; k++) {
		kill(cl.srv[k], SIGKILL);
		ck_assert_int_eq(tu_wait_child(cl.srv[k]), 128 + SIGKILL);
	}
	ck_assert_uint_gt(before[0].tables[0].rows, 0);
	check_row_claim_refused(&cl, dir, before[0].tables[0].rows, 0);
	check_row_claim_refused(&cl, dir, before[0].tables[0].rows, 1);
	/* table e's admission filter configured to another size (names, dims
	 * and optimizers are in the shard map's hash, refused before) */
	check_config_change_refused(&cl, dir, "admission: 3", "admission: 3, filter_ids: 5000",
				    "table 0 is not 'e' of dim 4 with 0 floats of state and a filter "
				    "of 8192 slots as configured (name, dim, optimizer or filter_ids "
				    "changed)");
	for (int k = 0; k < 2; k++)
		cl.srv[k] = tu_start_server(cl.path, k);
	c = connect_retry(&cl.cfg, 0, err, sizeof(err));
	ck_assert_msg(c != NULL, "%s", err);
	mon = connect_retry(&cl.cfg, -1, err, sizeof(err));
	ck_assert_msg(mon != NULL, "%s", err);
	for (int k = 0; k < 2; k++) {
		stats_of(mon, k, &after[k]);
		for (int t = 0; t < 2; t++) {
			ck_assert_uint_eq(after[k].tables[t].rows, before[k].tables[t].rows);
			ck_assert_uint_eq(after[k].tables[t].version, 4);
			ck_assert_uint_eq(after[k].tables[t].filter_ids, before[k].tables[t].filter_ids);
			ck_assert_uint_eq(after[k].tables[t].admitted, before[k].tables[t].admitted);
		}
	}
	/* f's BIG rows (more than 4,096 on each shard) as before */
	ck_assert_uint_gt(after[0].tables[1].rows, 4096 + N);
	ck_assert_uint_gt(after[1].tables[1].rows, 4096 + N);
	ck_assert_int_eq(ps_client_pull_rows(c, "f", 4, bids + N, BIG, big1), 0);
	ck_assert_msg(memcmp(big0, big1, sizeof(float) * 8 * BIG) == 0, "f's %d rows of clock 0 "
		      "differ after the restart", BIG);
	free(big0);
	free(big1);
	free(bids);
	free(bg);
	/* f: weights restored bit for bit; one more update proves the state was too */
	for (int i = 0; i < N * 8; i++)
		g[i] = (float)(i % 5) - 2.0f;
	ck_assert_msg(ps_client_push_rows(c, "f", 4, ids, N, g, 0) == 0, "%s", ps_client_error(c));
	for (int i = 0; i < N; i++)
		ps_table_push(&model, ids[i], g + i * 8, 1, ps_now_s());
	ck_assert_int_eq(ps_client_pull_rows(c, "f", 5, ids, N, got), 0);
	for (int i = 0; i < N; i++) {
		ps_table_read(&model, ids[i], want);
		ck_assert_msg(memcmp(got + i * 8, want, sizeof(want)) == 0, "f row %d: %.9g, expected "
			      "%.9g", i, got[i * 8], want[0]);
	}
	/* e: ids 32..47 had 2 sightings before the crash: one more admits them */
	ck_assert_msg(ps_client_push_rows(c, "e", 4, ids + 32, 16, ones, 0) == 0, "%s",
		      ps_client_error(c));
	ck_assert_int_eq(ps_client_pull_rows(c, "e", 5, ids, N, got), 0);
	for (int i = 0; i < N; i++)
		ck_assert_msg(got[i * DIM] == (i < 16 ? -2.0f : i < 48 ? -1.0f : 0.0f),
			      "e row %d after restart: %g", i, got[i * DIM]);
	ps_table_free(&model);
	ps_client_free(c);
	ps_client_free(mon);
	stop(&cl);
	ck_assert_int_eq(tu_rmtree(dir), 0);
}
END_TEST


static int cmp_id(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static char *read_text(const char *f);

/* The exit status of child pid if it exits within ms (scaled), else -1
 * (it is then killed and reaped). */
static int exit_within(pid_t pid, int ms)
{
	double t0 = ps_now_s();
	int st;

	while (waitpid(pid, &st, WNOHANG) == 0) {
		if ((ps_now_s() - t0) * 1000.0 > ms * tu_time_scale()) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
			return -1;
		}
		tu_sleep_ms(20);
	}
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Shard 0 of cl, started on the edited checkpoint f (how: what was done
 * to it), must refuse to start within 10 s, its log (logf) naming f and
 * want; then f's original, kept as keep, is put back. */
static void expect_refused(const struct cluster *cl, const char *f, const char *keep,
			   const char *logf, const char *want, const char *how)
{
	int rc = exit_within(tu_start_server_log(cl->path, 0, logf), 10000);
	char *log = read_text(logf);

	ck_assert_msg(rc == 1 && log && strstr(log, "refusing to start: ") && strstr(log, f) &&
		      strstr(log, want), "%s %s: the shard %s, its log: %s (\"%s\" expected)", f,
		      how, rc < 0 ? "did not exit" : "exited", log ? log : "empty", want);
	free(log);
	ck_assert_int_eq(rename(keep, f), 0);
}

/* f, a checkpoint file of cl's shard 0: table t's record (found by its
 * key, dim and row_floats) given dim + 1 and the file's CRC made right;
 * shard 0 must refuse to start, its log naming f and want. The file is
 * put back. */
static void check_record_dim_refused(const struct cluster *cl, const char *dir, const char *f,
				     int t, int row_floats, const char *want)
{
	char keep[320], logf[300];
	struct ckpt_table ct;
	uint64_t key = ps_rows_table_key(&cl->cfg.tables[t]);
	size_t at = 0, found = 0, len;
	uint8_t *b;

	snprintf(keep, sizeof(keep), "%s.kept", f);
	snprintf(logf, sizeof(logf), "%s/shard-0-record.log", dir);
	b = read_file(f, &len);
	for (size_t p = 0; p + sizeof(ct) + 4 <= len; p++) {
		memcpy(&ct, b + p, sizeof(ct));
		if (ct.key == key && ct.dim == (uint32_t)cl->cfg.tables[t].dim &&
		    ct.row_floats == (uint32_t)row_floats) {
			at = p;
			found++;
		}
	}
	ck_assert_msg(found == 1, "table %d's record found %zu times in %s", t, found, f);
	memcpy(&ct, b + at, sizeof(ct));
	ct.dim++;
	memcpy(b + at, &ct, sizeof(ct));
	write_edited(f, keep, b, len);
	expect_refused(cl, f, keep, logf, want, "with table's dim edited");
}

/* Incremental checkpoint f cut after table t's record, one slot short of
 * its admission filter (the CRC made right): the tables after it are gone,
 * so t's filter runs into the file's end, and the shard must refuse to
 * start naming f and the filter; f is put back. */
static void check_filter_cut_refused(const struct cluster *cl, const char *dir, const char *f,
				     int t)
{
	char keep[320], logf[300], want[128];
	struct ckpt_table ct;
	uint64_t key = ps_rows_table_key(&cl->cfg.tables[t]);
	size_t at = 0, found = 0, len, cut;
	uint8_t *b = read_file(f, &len);

	for (size_t p = 0; p + sizeof(ct) + 4 <= len; p++) {
		memcpy(&ct, b + p, sizeof(ct));
		if (ct.key == key && ct.dim == (uint32_t)cl->cfg.tables[t].dim &&
		    ct.filter_slots > 0 && ct.filter_slots < (1u << 24)) {
			at = p;
			found++;
		}
	}
	ck_assert_msg(found == 1, "table %d's record found %zu times in %s", t, found, f);
	memcpy(&ct, b + at, sizeof(ct));
	/* the record, its dropped ids, its rows, its filter less one slot, a CRC */
	cut = at + sizeof(ct) + ct.ntombs * 8 +
	      ct.nrows * (sizeof(struct ckpt_row) + sizeof(float) * ct.row_floats) +
	      (ct.filter_slots - 1) * sizeof(uint32_t) + 4;
	ck_assert_uint_lt(cut, len);
	snprintf(keep, sizeof(keep), "%s.kept", f);
	snprintf(logf, sizeof(logf), "%s/shard-0-cut.log", dir);
	snprintf(want, sizeof(want), "table '%s': the admission filter is cut short",
		 cl->cfg.tables[t].name);
	write_edited(f, keep, b, cut);
	expect_refused(cl, f, keep, logf, want, "cut in a table's filter");
}

/* A full checkpoint and two incremental ones of a table with a cap
 * (evictions: tombstones), admission and adam, copied on the loop (_i 0)
 * or written by a forked child (_i 1, checkpoint.fork_bytes); both shards
 * killed with
 * SIGKILL come back from base + 2 deltas exactly as a table per shard in
 * this process that saw the same updates: rows, state, counts, and the
 * recency order (the next evictions drop the same rows). */
START_TEST(test_incremental_kill9)
{
	struct cluster cl;
	char dir[] = "/tmp/ps-rows-inc-XXXXXX", extra[256], err[512];
	struct ps_client *c, *mon;
	struct ps_table model[2];
	enum { U = 120, PER = 40 };
	uint64_t all[U], ids[PER], s = 5, key;
	float g[PER * DIM], got[U * DIM], want[DIM];
	int clock = 0;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(extra, sizeof(extra), "checkpoint:\n  dir: %s\n  on_request: true\n"
		 "  min_interval_s: 0\n  incremental: 5\n  fork_bytes: %s\n", dir, _i ? "1" : "0");
	start_def(&cl, 1, "sync", "init: uniform, scale: 0.1, optimizer: adam, lr: 0.01, "
		  "admission: 2, max_rows: 60", extra);
	key = ps_rows_table_key(&cl.cfg.tables[0]);
	for (int k = 0; k < 2; k++)
		ck_assert_int_eq(ps_table_init(&model[k], &cl.cfg, 0, 2, ps_now_s()), 0);
	for (int i = 0; i < U; i++)
		all[i] = (uint64_t)(i + 1) * MULT;
	c = connect_retry(&cl.cfg, 0, err, sizeof(err));
	ck_assert_msg(c != NULL, "%s", err);
	mon = connect_retry(&cl.cfg, -1, err, sizeof(err));
	ck_assert_msg(mon != NULL, "%s", err);
	for (int phase = 0; phase < 6; phase++) {
		if (phase == 3) { /* after the full file and two deltas: kill -9 */
			ps_client_free(c);
			ps_client_free(mon);
			for (int k = 0; k < 2; k++) {
				kill(cl.srv[k], SIGKILL);
				ck_assert_int_eq(tu_wait_child(cl.srv[k]), 128 + SIGKILL);
			}
			if (!_i) { /* delta-1 copied over delta-2: refused, named */
				char d1[300], d2[300], keep[300], logf[300], cmd[1000], *log;
				int rc;
				snprintf(d1, sizeof(d1), "%s/shard-0.ckpt.delta-1", dir);
				snprintf(d2, sizeof(d2), "%s/shard-0.ckpt.delta-2", dir);
				snprintf(keep, sizeof(keep), "%s/delta-2.kept", dir);
				snprintf(logf, sizeof(logf), "%s/shard-0.log", dir);
				snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", d1, d2);
				ck_assert_int_eq(rename(d2, keep), 0);
				ck_assert_int_eq(system(cmd), 0);
				rc = exit_within(tu_start_server_log(cl.path, 0, logf), 10000);
				log = read_text(logf);
				ck_assert_msg(rc == 1 && log && strstr(log, "refusing to start: ") &&
					      strstr(log, "shard-0.ckpt.delta-2: not incremental "
						     "checkpoint 2 of the chain"), "a copy of delta-1 as "
					      "delta-2: the shard %s (%s)", rc < 0 ? "did not exit" :
					      "exited", log ? log : "the log is empty");
				free(log);
				ck_assert_int_eq(rename(keep, d2), 0);
				/* delta-2's record of e edited (its CRC made right):
				 * another dim than the config's, refused, named */
				check_record_dim_refused(&cl, dir, d2, 0, DIM + 2 * DIM + 1,
							 "table 0 is not 'e' as configured");
				/* delta-2 cut inside e's admission filter */
				check_filter_cut_refused(&cl, dir, d2, 0);
			}
			for (int k = 0; k < 2; k++)
				cl.srv[k] = tu_start_server(cl.path, k);
			c = connect_retry(&cl.cfg, 0, err, sizeof(err));
			ck_assert_msg(c != NULL, "%s", err);
			mon = connect_retry(&cl.cfg, -1, err, sizeof(err));
			ck_assert_msg(mon != NULL, "%s", err);
		}
		if (phase >= 3) { /* the shards equal the models, before and after more updates */
			ck_assert_int_eq(ps_client_pull_rows(c, "e", (uint64_t)clock, all, U, got), 0);
			for (int i = 0; i < U; i++) {
				ps_table_read(&model[ps_rows_shard(key, all[i], 2)], all[i], want);
				ck_assert_msg(memcmp(got + i * DIM, want, sizeof(want)) == 0, "phase %d: "
					      "row %d is %.9g, the model has %.9g", phase, i,
					      got[i * DIM], want[0]);
			}
			for (int k = 0; k < 2; k++) {
				struct ps_shard_stats st;
				ck_assert_int_eq(ps_client_stats(mon, k, &st), 0);
				ck_assert_uint_eq(st.tables[0].rows, model[k].nrows);
				ck_assert_uint_eq(st.tables[0].evicted, model[k].c.evicted);
				ck_assert_uint_eq(st.tables[0].admitted, model[k].c.admitted);
				ck_assert_uint_eq(st.tables[0].filter_ids, model[k].admit.used);
			}
		}
		for (int step = 0; step < 4; step++, clock++) {
			for (int i = 0; i < PER; i++) /* distinct ids: a partial shuffle */
				ids[i] = all[(i * 3 + (int)(rng_next(&s) % 3) * 41 + clock * 7) % U];
			qsort(ids, PER, sizeof(ids[0]), cmp_id);
			int n = 0;
			for (int i = 0; i < PER; i++)
				if (!n || ids[n - 1] != ids[i])
					ids[n++] = ids[i];
			for (int i = 0; i < n * DIM; i++)
				g[i] = (float)((int)(rng_next(&s) % 9) - 4) * 0.25f;
			ck_assert_msg(ps_client_push_rows(c, "e", (uint64_t)clock, ids, (size_t)n, g, 0)
				      == 0, "%s", ps_client_error(c));
			for (int i = 0; i < n; i++) /* each shard applies its ids in order */
				ps_table_push(&model[ps_rows_shard(key, ids[i], 2)], ids[i], g + i * DIM, 1,
					      ps_now_s());
		}
		if (phase < 3)
			for (int k = 0; k < 2; k++) {
				struct ps_shard_stats st;
				ck_assert_int_eq(ps_client_checkpoint(mon, k, 1, &st), 0);
				ck_assert_msg(st.checkpoint_status == 0, "%s", st.checkpoint_error);
				const char *tail = strrchr(st.checkpoint_path, '.');
				if (phase == 0)
					ck_assert_str_eq(tail, ".ckpt");
				else
					ck_assert_msg(!strcmp(tail, phase == 1 ? ".delta-1" : ".delta-2"),
						      "phase %d wrote %s", phase, st.checkpoint_path);
			}
	}
	ck_assert_uint_gt(model[0].c.evicted + model[1].c.evicted, 20);
	for (int k = 0; k < 2; k++)
		ps_table_free(&model[k]);
	ps_client_free(c);
	ps_client_free(mon);
	stop(&cl);
	ck_assert_int_eq(tu_rmtree(dir), 0);
}
END_TEST

/* ---- a shard killed at each step of writing a checkpoint ---- */

struct ckpt_asker {
	struct ps_client *c;
	struct ps_shard_stats st;
	int rc;
};

static void *ask_ckpt(void *p)
{
	struct ckpt_asker *a = p;

	a->rc = ps_client_checkpoint(a->c, 0, 1, &a->st);
	return NULL;
}

/* 0 for shard 0's full checkpoint file, else its place in the chain. */
static uint32_t ckpt_seq_of(const char *path)
{
	const char *d = strstr(path, ".delta-");

	return d ? (uint32_t)strtoul(d + 7, NULL, 10) : 0;
}

static int file_exists(const char *dir, const char *name)
{
	char p[256];
	struct stat st;

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	return lstat(p, &st) == 0;
}

/* The whole of file f, 0-terminated (free it), or NULL. */
static char *read_text(const char *f)
{
	FILE *in = fopen(f, "r");
	char *b = NULL;
	size_t cap = 0;
	ssize_t n;

	if (!in)
		return NULL;
	n = getdelim(&b, &cap, '\0', in);
	fclose(in);
	if (n < 0) {
		free(b);
		return NULL;
	}
	return b;
}

/* Clock k's push to e: 40 of the U ids (sorted), small integer gradients. */
static void crash_push(struct ps_client *c, const uint64_t *all, int u, int k)
{
	uint64_t ids[40];
	float g[40 * DIM];

	for (int i = 0; i < 40; i++)
		ids[i] = all[(k * 13 + i * 3) % u];
	qsort(ids, 40, sizeof(ids[0]), cmp_id);
	for (int i = 0; i < 40 * DIM; i++)
		g[i] = (float)((i + k) % 5 - 2);
	ck_assert_msg(ps_client_push_rows(c, "e", (uint64_t)k, ids, 40, g, 0) == 0, "%s",
		      ps_client_error(c));
}

/* Every crash point of a checkpoint of shard 0 (PS_FAULT_CHECKPOINT): of a
 * full one replacing a chain of two incremental ones (half way through
 * the data, after its fsync, after its rename with the old chain still
 * there, after the first old file is removed) and of an incremental one
 * (the same first three). Every time, the shard starts again (it used to
 * refuse to after the full file's rename: the old delta-1 did not build
 * on it) with the rows of its last whole checkpoint or of the crash, and
 * an old chain's files left behind are set aside as .stale with a log
 * line. */
START_TEST(test_checkpoint_crash_points)
{
	static const struct {
		const char *step;
		int full;
	} pts[] = { { "write", 1 }, { "fsync", 1 }, { "rename", 1 }, { "retire", 1 },
		    { "write", 0 }, { "fsync", 0 }, { "rename", 0 } };
	enum { U = 100 };
	struct cluster cl;
	char dir[] = "/tmp/ps-rows-crash-XXXXXX", extra[256], err[512], logf[300];
	uint64_t all[U], key;
	static float old[U * DIM], now[U * DIM], got[U * DIM];
	struct ps_client *c;
	uint32_t seq = 0;
	int k = 0;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(logf, sizeof(logf), "%s/shard-0.log", dir);
	snprintf(extra, sizeof(extra), "checkpoint:\n  dir: %s\n  on_request: true\n"
		 "  min_interval_s: 0\n  incremental: 2\n", dir);
	start(&cl, 1, "async", "", extra);
	key = ps_rows_table_key(&cl.cfg.tables[0]);
	for (int i = 0; i < U; i++)
		all[i] = (uint64_t)(i + 1) * MULT;
	c = connect_retry(&cl.cfg, 0, err, sizeof(err));
	ck_assert_msg(c != NULL, "%s", err);
	for (size_t p = 0; p < sizeof(pts) / sizeof(pts[0]); p++) {
		struct ps_shard_stats st;
		struct ckpt_asker a = { .c = NULL };
		pthread_t th;
		char name[128];

		/* the chain where the next checkpoint is the kind wanted: full
		 * after two incremental ones, else incremental */
		do {
			crash_push(c, all, U, k++);
			ck_assert_int_eq(ps_client_checkpoint(c, 0, 1, &st), 0);
			ck_assert_msg(st.checkpoint_status == 0, "%s", st.checkpoint_error);
			seq = ckpt_seq_of(st.checkpoint_path);
		} while (pts[p].full ? seq != 2 : seq == 2);
		ck_assert_int_eq(ps_client_pull_rows(c, "e", 0, all, U, old), 0);

		for (int n = 1; n <= 2; n++) { /* what an earlier case set aside */
			snprintf(name, sizeof(name), "%s/shard-0.ckpt.delta-%d.stale", dir, n);
			unlink(name);
		}
		/* shard 0 again, with the fault armed; it comes back from the chain */
		ps_client_free(c);
		kill(cl.srv[0], SIGKILL);
		ck_assert_int_eq(tu_wait_child(cl.srv[0]), 128 + SIGKILL);
		setenv("PS_FAULT_CHECKPOINT", pts[p].step, 1);
		cl.srv[0] = tu_start_server_log(cl.path, 0, logf);
		unsetenv("PS_FAULT_CHECKPOINT");
		c = connect_retry(&cl.cfg, 0, err, sizeof(err));
		ck_assert_msg(c != NULL, "%s", err);
		ck_assert_int_eq(ps_client_pull_rows(c, "e", 0, all, U, got), 0);
		ck_assert_msg(memcmp(got, old, sizeof(old)) == 0, "%s: not restored", pts[p].step);
		crash_push(c, all, U, k++);
		ck_assert_int_eq(ps_client_pull_rows(c, "e", 0, all, U, now), 0);
		ck_assert(memcmp(now, old, sizeof(old)) != 0);

		a.c = c;
		ck_assert_int_eq(pthread_create(&th, NULL, ask_ckpt, &a), 0);
		ck_assert_int_eq(tu_wait_child(cl.srv[0]), 128 + SIGKILL); /* died at the step */
		/* what the crash left: the scenario really happened */
		if (pts[p].full && !strcmp(pts[p].step, "rename"))
			ck_assert(file_exists(dir, "shard-0.ckpt.delta-1") &&
				  file_exists(dir, "shard-0.ckpt.delta-2"));
		if (pts[p].full && !strcmp(pts[p].step, "retire"))
			ck_assert(file_exists(dir, "shard-0.ckpt.delta-1") &&
				  !file_exists(dir, "shard-0.ckpt.delta-2"));
		snprintf(name, sizeof(name), "shard-0.ckpt.delta-%u", seq + 1);
		if (!pts[p].full)
			ck_assert_int_eq(file_exists(dir, name), !strcmp(pts[p].step, "rename"));

		cl.srv[0] = tu_start_server_log(cl.path, 0, logf);
		pthread_join(th, NULL);
		ck_assert_msg(a.rc == 0, "%s %s: the checkpoint request after the restart: %s",
			      pts[p].full ? "full" : "incremental", pts[p].step, ps_client_error(c));
		ck_assert_msg(a.st.checkpoint_status == 0, "%s", a.st.checkpoint_error);
		/* the last whole checkpoint, or the crash's: never a refusal or a mix */
		int written = !strcmp(pts[p].step, "rename") || !strcmp(pts[p].step, "retire");
		ck_assert_int_eq(ps_client_pull_rows(c, "e", 0, all, U, got), 0);
		for (int i = 0; i < U; i++) { /* shard 1 kept everything */
			const float *want = written || ps_rows_shard(key, all[i], 2) ? now : old;
			ck_assert_msg(memcmp(got + i * DIM, want + i * DIM, DIM * sizeof(float)) == 0,
				      "%s %s: shard 0 came back with other rows than %s (row %d: %g, "
				      "expected %g)", pts[p].full ? "full" : "incremental", pts[p].step,
				      written ? "at the crash" : "of its last checkpoint", i,
				      got[i * DIM], want[i * DIM]);
		}
		if (pts[p].full && written) {
			char *log;
			ck_assert(file_exists(dir, "shard-0.ckpt.delta-1.stale"));
			ck_assert_int_eq(file_exists(dir, "shard-0.ckpt.delta-2.stale"),
					 !strcmp(pts[p].step, "rename"));
			/* the log says so, naming the file (written before it listened) */
			log = read_text(logf);
			ck_assert_msg(log && strstr(log, "shard-0.ckpt.delta-1 builds on the full "
						    "checkpoint before the present one") &&
				      strstr(log, "set aside as"), "%s", log ? log : "(no log)");
			free(log);
		}
		seq = ckpt_seq_of(a.st.checkpoint_path);
	}
	ps_client_free(c);
	stop(&cl);
	ck_assert_int_eq(tu_rmtree(dir), 0);
}
END_TEST

/* ---- hostile row requests ---- */

START_TEST(test_hostile)
{
	struct cluster cl;
	struct ps_shardmap map;
	char err[512];
	int fd;
	unsigned t;

	start(&cl, 1, "async", "", "security:\n  auth: false\n");
	ck_assert_int_eq(ps_shardmap_init(&map, &cl.cfg), 0);
	fd = tu_raw_join(cl.port[0], &cl.cfg, &map, 0, 0);
	/* ten million ids: refused on the count, before anything is decoded */
	Ps__PullRows p = PS__PULL_ROWS__INIT;
	uint8_t ids[64];
	uint64_t two[2] = { 5, 9 };
	p.req_id = 1;
	p.table = "e";
	p.dim = DIM;
	p.n_ids = 10000000;
	tu_raw_expect_error(fd, PS_MSG_PULL_ROWS, &p.base, ids, 8, PS_ETOOBIG,
			    "limits.max_request_rows", NULL);
	/* unknown table, another dim */
	p.n_ids = 2;
	size_t il = ps_rows_ids_encode(two, 2, ids);
	p.table = "nosuch\x1b[2J"; /* named back, its control character shown as '?' */
	tu_raw_expect_error(fd, PS_MSG_PULL_ROWS, &p.base, ids, il, PS_ENOTENSOR,
			    "no embedding table 'nosuch?[2J' on this shard", NULL);
	p.table = "e";
	p.dim = DIM + 1;
	tu_raw_expect_error(fd, PS_MSG_PULL_ROWS, &p.base, ids, il, PS_ESHAPE,
			    "table 'e' has dim 4, the request says 5", NULL);
	p.dim = DIM;
	/* repeated ids (a delta of 0), truncated ids, bytes left over */
	uint8_t rep[2] = { 5, 0 };
	tu_raw_expect_error(fd, PS_MSG_PULL_ROWS, &p.base, rep, 2, PS_EPROTO, "sorted and unique",
			    NULL);
	tu_raw_expect_error(fd, PS_MSG_PULL_ROWS, &p.base, ids, 1, PS_EPROTO, "ids end", NULL);
	uint8_t more[3] = { 5, 4, 1 };
	tu_raw_expect_error(fd, PS_MSG_PULL_ROWS, &p.base, more, 3, PS_EPROTO, "after the 2 ids",
			    NULL);
	/* a push: values of the wrong size, and a NaN */
	Ps__PushRows q = PS__PUSH_ROWS__INIT;
	uint8_t pay[4 + 2 * DIM * 4];
	float vals[2 * DIM] = { 1, 2, 3, 4, 5, 6, 7, NAN };
	q.req_id = 2;
	q.table = "e";
	q.dim = DIM;
	q.n_ids = 2;
	q.ids_bytes = il;
	memset(pay, 0, sizeof(pay));
	memcpy(pay, ids, il);
	memcpy(pay + 4, vals, sizeof(vals));
	tu_raw_expect_error(fd, PS_MSG_PUSH_ROWS, &q.base, pay, sizeof(pay) - 4, PS_ESHAPE,
			    "does not hold", NULL);
	tu_raw_expect_error(fd, PS_MSG_PUSH_ROWS, &q.base, pay, sizeof(pay), PS_ENOFINITE,
			    "not finite", NULL);
	/* the connection still works: a good pull is answered */
	p.req_id = 3;
	ck_assert_int_eq(tu_raw_send(fd, PS_MSG_PULL_ROWS, &p.base, ids, il), 0);
	ProtobufCMessage *r = tu_raw_recv(fd, &t);
	ck_assert_ptr_nonnull(r);
	ck_assert_int_eq(t, PS_MSG_PULL_ROWS_REPLY);
	ck_assert_uint_eq(((Ps__PullRowsReply *)r)->n_rows, 2);
	protobuf_c_message_free_unpacked(r, NULL);
	close(fd);
	/* the client refuses a call past the limit without sending it */
	struct ps_client *c = connect_retry(&cl.cfg, 0, err, sizeof(err));
	ck_assert_msg(c != NULL, "%s", err);
	size_t big = (size_t)cl.cfg.limits.max_request_rows * 3;
	uint64_t *many = malloc(sizeof(uint64_t) * big);
	float *out = malloc(sizeof(float) * 4);
	for (size_t i = 0; i < big; i++)
		many[i] = i;
	ck_assert_int_eq(ps_client_pull_rows(c, "e", 0, many, big, out), PS_ETOOBIG);
	ck_assert_msg(strstr(ps_client_error(c), "table 'e': ") &&
		      strstr(ps_client_error(c), "distinct ids for shard ") &&
		      strstr(ps_client_error(c), "(limits.max_request_rows)"), "%s",
		      ps_client_error(c));
	ck_assert_int_eq(ps_client_pull_rows(c, "nosuch", 0, many, 1, out), PS_ENOTENSOR);
	/* the same for a push (its gradients: zeros), and nothing of either
	 * counted as given or sent */
	uint64_t given0, sent0, given1, sent1;
	float *zg = calloc(big * DIM, sizeof(float));
	ps_client_rows_bytes(c, &given0, &sent0);
	ck_assert_int_eq(ps_client_push_rows(c, "e", 0, many, big, zg, 0), PS_ETOOBIG);
	char want[200];
	snprintf(want, sizeof(want), "at most %d (limits.max_request_rows)",
		 cl.cfg.limits.max_request_rows);
	ck_assert_msg(strstr(ps_client_error(c), "table 'e': ") && strstr(ps_client_error(c), want),
		      "%s", ps_client_error(c));
	ck_assert_int_eq(ps_client_push_rows(c, "nosuch", 0, many, 1, zg, 0), PS_ENOTENSOR);
	ck_assert_str_eq(ps_client_error(c), "no embedding table 'nosuch' in the config "
			 "(model.embeddings)");
	ps_client_rows_bytes(c, &given1, &sent1);
	ck_assert_uint_eq(given1, given0);
	ck_assert_uint_eq(sent1, sent0);
	free(zg);
	/* and the shard serves as before, its rejections counted */
	float w[DIM];
	ck_assert_int_eq(ps_client_pull_rows(c, "e", 0, two, 1, w), 0);
	struct ps_shard_stats st;
	ck_assert_int_eq(ps_client_stats(c, 0, &st), 0);
	ck_assert_uint_ge(st.errors, 8);
	free(many);
	free(out);
	ps_client_free(c);
	ps_shardmap_free(&map);
	stop(&cl);
}
END_TEST

/* Finite row gradients whose update is not finite. Async, FTRL: a push of
 * 1e20 (g*g overflows) is refused with PS_ENOFINITE, whole (a good row in
 * the same push stays as it was), and the rows read as before; before the
 * check the row became NaN. Sync, sgd lr 1, two workers pushing 3e38 for
 * one id: both are acknowledged, their sum overflows, and the clock is
 * not applied to the table (no row changes, counted as an error); before
 * the check the row became -inf. */
START_TEST(test_huge_finite_rows)
{
	struct cluster cl;
	struct ps_client *c[2];
	struct ps_shard_stats st[2], st1[2];
	uint64_t ids[2] = { 3 * MULT, 5 * MULT };
	float g[2 * DIM], before[2 * DIM], after[2 * DIM];
	char err[512];

	/* async, ftrl */
	start_def(&cl, 1, "async", "init: zeros, optimizer: ftrl, lr: 0.1", "");
	c[0] = connect_retry(&cl.cfg, 0, err, sizeof(err));
	ck_assert_msg(c[0] != NULL, "%s", err);
	for (int j = 0; j < 2 * DIM; j++)
		g[j] = 1.0f;
	ck_assert_int_eq(ps_client_push_rows(c[0], "e", 0, ids, 2, g, 0), 0);
	ck_assert_int_eq(ps_client_pull_rows(c[0], "e", 0, ids, 2, before), 0);
	ck_assert(before[0] != 0.0f); /* the control: a push of ones applied */
	for (int k = 0; k < 2; k++)
		ck_assert_int_eq(ps_client_stats(c[0], k, &st[k]), 0);
	for (int j = DIM; j < 2 * DIM; j++)
		g[j] = 1e20f; /* the second row's update overflows, the first's does not */
	ck_assert_int_eq(ps_client_push_rows(c[0], "e", 1, ids, 2, g, 0), PS_ENOFINITE);
	ck_assert_msg(strstr(ps_client_error(c[0]), "nothing of it was applied"), "%s",
		      ps_client_error(c[0]));
	ck_assert_int_eq(ps_client_pull_rows(c[0], "e", 0, ids, 2, after), 0);
	for (int j = 0; j < 2 * DIM; j++)
		ck_assert_msg(isfinite(after[j]) && after[j] == before[j], "value %d: %g, was %g",
			      j, after[j], before[j]);
	uint64_t errs = 0;
	for (int k = 0; k < 2; k++) {
		ck_assert_int_eq(ps_client_stats(c[0], k, &st1[k]), 0);
		errs += st1[k].errors - st[k].errors;
	}
	ck_assert_uint_ge(errs, 1);
	ps_client_free(c[0]);
	stop(&cl);

	/* sync, sgd, the sum of two workers' 3e38 */
	start(&cl, 2, "sync", "", "");
	for (int r = 0; r < 2; r++) {
		c[r] = connect_retry(&cl.cfg, r, err, sizeof(err));
		ck_assert_msg(c[r] != NULL, "%s", err);
	}
	for (int j = 0; j < DIM; j++)
		g[j] = 3e38f;
	for (int r = 0; r < 2; r++)
		ck_assert_int_eq(ps_client_push_rows(c[r], "e", 0, ids, 1, g, 0), 0);
	/* the clock completed (the version moved on) without changing the row */
	ck_assert_int_eq(ps_client_pull_rows(c[0], "e", 1, ids, 1, after), 0);
	for (int j = 0; j < DIM; j++)
		ck_assert_msg(after[j] == 0.0f, "value %d: %g after a sum past FLT_MAX", j, after[j]);
	errs = 0;
	for (int k = 0; k < 2; k++) {
		ck_assert_int_eq(ps_client_stats(c[0], k, &st1[k]), 0);
		errs += st1[k].errors;
	}
	ck_assert_uint_eq(errs, 1);
	/* and the next clock applies */
	for (int j = 0; j < DIM; j++)
		g[j] = 1.0f;
	for (int r = 0; r < 2; r++)
		ck_assert_int_eq(ps_client_push_rows(c[r], "e", 1, ids, 1, g, 0), 0);
	ck_assert_int_eq(ps_client_pull_rows(c[1], "e", 2, ids, 1, after), 0);
	for (int j = 0; j < DIM; j++)
		ck_assert_msg(after[j] == -2.0f, "value %d: %g", j, after[j]);
	for (int r = 0; r < 2; r++)
		ps_client_free(c[r]);
	stop(&cl);
}
END_TEST

/* ---- parked pulls hold at most their frames, within byte limits ---- */

static long vm_hwm_kb(pid_t pid)
{
	char path[64], line[256];
	long kb = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmHWM: %ld kB", &kb) == 1)
			break;
	fclose(f);
	return kb;
}

/* Sends n row pulls of table e for clock 1 (they wait: no clock is
 * applied) and then a stats request, and reads every answer up to the
 * stats: how many were refused; each refusal must name limit. */
static int park_pulls(int fd, int n, const uint8_t *enc, size_t elen, uint32_t nids,
		      const char *limit)
{
	Ps__PullRows p = PS__PULL_ROWS__INIT;
	Ps__StatsRequest q = PS__STATS_REQUEST__INIT;
	int refused = 0;
	unsigned t;

	p.table = "e";
	p.dim = DIM;
	p.n_ids = nids;
	p.min_version = 1;
	for (int i = 0; i < n; i++) {
		p.req_id = (uint64_t)i + 1;
		ck_assert_int_eq(tu_raw_send(fd, PS_MSG_PULL_ROWS, &p.base, enc, elen), 0);
	}
	q.req_id = 1000;
	ck_assert_int_eq(tu_raw_send(fd, PS_MSG_STATS_REQUEST, &q.base, NULL, 0), 0);
	for (;;) {
		ProtobufCMessage *r = tu_raw_recv(fd, &t);
		ck_assert_msg(r != NULL, "connection closed before the stats reply");
		if (t == PS_MSG_STATS) {
			protobuf_c_message_free_unpacked(r, NULL);
			return refused;
		}
		ck_assert_msg(t == PS_MSG_ERROR, "a %s frame", ps_wire_type_name(t));
		ck_assert_int_eq(((Ps__Error *)r)->code, PS_ETOOBIG);
		ck_assert_msg(strstr(((Ps__Error *)r)->message, limit), "'%s' does not name %s",
			      ((Ps__Error *)r)->message, limit);
		refused++;
		protobuf_c_message_free_unpacked(r, NULL);
	}
}

/* The attack: 64 row pulls of a million ids each (1 MB frames of
 * delta-coded ids) parked for a clock that does not come. Each holds its
 * frame's id bytes, not 8 bytes per id, and one connection at most
 * limits.max_waiting_bytes of them (4 MiB here: 4 pulls park, 60 are
 * refused naming it), so the shard's peak memory grows by a few frames
 * (before: 558 MB). A second connection parks only up to
 * limits.max_waiting_bytes_total (6 MiB: 2 more), whatever the number of
 * connections, and the bytes of a closed connection's pulls are free
 * again. And limits.max_waiting_pulls bounds the count of one
 * connection's parked pulls, however small. */
START_TEST(test_parked_pulls_bounded)
{
	struct cluster cl;
	struct ps_shardmap map;
	enum { NIDS = 1000000, NPULL = 64 };
	uint64_t *ids = malloc(sizeof(uint64_t) * NIDS);
	uint8_t *enc = malloc((size_t)NIDS * 10);
	size_t elen;
	int a, b;

	start(&cl, 1, "sync", "", "security:\n  auth: false\nlimits:\n  max_waiting_bytes: 4MiB\n"
	      "  max_waiting_bytes_total: 6MiB\n  max_waiting_pulls: 6\n");
	ck_assert_int_eq(ps_shardmap_init(&map, &cl.cfg), 0);
	for (size_t i = 0; i < NIDS; i++)
		ids[i] = i + 1;
	elen = ps_rows_ids_encode(ids, NIDS, enc);
	ck_assert_uint_eq(elen, NIDS); /* one byte per id */
	a = tu_raw_join(cl.port[0], &cl.cfg, &map, 0, 0);
	long hwm0 = vm_hwm_kb(cl.srv[0]);
	int refused = park_pulls(a, NPULL, enc, elen, NIDS, "limits.max_waiting_bytes");
	long grew_mb = (vm_hwm_kb(cl.srv[0]) - hwm0) / 1024;
	printf("test_parked_pulls_bounded: %d pulls of %zu-byte frames, %d parked: the shard's "
	       "peak memory grew by %ld MiB\n", NPULL, elen, NPULL - refused, grew_mb);
	/* ASan's quarantine keeps freed memory, valgrind its own: measured natively */
	if (!getenv("PS_TEST_VALGRIND") && !SANITIZED)
		ck_assert_msg(grew_mb < 48, "%d parked pulls of 1 MB frames grew the shard by %ld "
			      "MiB", NPULL - refused, grew_mb);
	ck_assert_int_eq(refused, NPULL - 4);
	/* another connection: the shard's total is the bound */
	b = tu_raw_join(cl.port[0], &cl.cfg, &map, 0, 0);
	ck_assert_int_eq(park_pulls(b, 3, enc, elen, NIDS, "limits.max_waiting_bytes_total"), 1);
	/* a's pulls go with a: b parks again, once the shard has seen the close */
	close(a);
	int parked = 0;
	for (int i = 0; i < 200 && !parked; i++) {
		parked = park_pulls(b, 1, enc, elen, NIDS, "limits.max_waiting_bytes_total") == 0;
		if (!parked)
			tu_sleep_ms(20);
	}
	ck_assert_msg(parked, "the closed connection's parked pulls still count");
	/* and b's own bound holds: 3 parked, 1 more fits, then its limit */
	ck_assert_int_eq(park_pulls(b, 2, enc, elen, NIDS, "limits.max_waiting_bytes"), 1);
	close(b);
	/* a third connection, small pulls: limits.max_waiting_pulls (6 here)
	 * park, whatever their bytes; the next are refused naming it */
	uint8_t small[8];
	size_t slen = ps_rows_ids_encode(ids, 3, small);
	int c3 = tu_raw_join(cl.port[0], &cl.cfg, &map, 0, 0);
	ck_assert_int_eq(park_pulls(c3, 9, small, slen, 3, "6 pulls of this connection wait for "
				    "their clock already (limits.max_waiting_pulls)"), 3);
	close(c3);
	free(ids);
	free(enc);
	ps_shardmap_free(&map);
	stop(&cl);
}
END_TEST

/* ---- the tables' memory budget ---- */

/* Bytes a row of dim weights and nstate floats of state costs against
 * limits.max_table_bytes (table.c: values, 20 bytes of metadata, 10 of
 * index, 1 of bitmap). */
static uint64_t row_cost(int floats)
{
	return 4 * (uint64_t)floats + 20 + 10 + 1;
}

/* The attack, scaled: one worker pushes 20 x 200,000 fresh ids.
 * With limits.max_table_bytes 8 MiB (4 MiB for each of the two tables) a
 * shard keeps at most 4 MiB / 47 bytes rows of table e, drops the least
 * recently updated past it (counted in evicted, its cap in the stats) and
 * its peak memory stays within a few tens of MiB (before: every row kept,
 * 2 million a shard). Without the option a shard still has a budget:
 * 4 GiB by default. */
START_TEST(test_table_memory_budget)
{
	enum { NPUSH = 20, NIDS = 200000 };
	struct cluster cl;
	struct ps_client *c;
	struct ps_shard_stats st;
	uint64_t *ids = malloc(sizeof(uint64_t) * NIDS);
	float *g = malloc(sizeof(float) * NIDS * DIM);
	uint64_t cap = (8ull << 20) / 2 / row_cost(DIM); /* sgd: no state */
	char err[512];
	long hwm0[2];

	start(&cl, 1, "async", "", "limits:\n  max_table_bytes: 8MiB\n");
	c = connect_retry(&cl.cfg, 0, err, sizeof(err));
	ck_assert_msg(c != NULL, "%s", err);
	for (int k = 0; k < 2; k++)
		hwm0[k] = vm_hwm_kb(cl.srv[k]);
	for (size_t i = 0; i < (size_t)NIDS * DIM; i++)
		g[i] = 1.0f;
	for (int p = 0; p < NPUSH; p++) {
		for (size_t i = 0; i < NIDS; i++)
			ids[i] = ((uint64_t)p * NIDS + i) * MULT;
		ck_assert_msg(ps_client_push_rows(c, "e", (uint64_t)p, ids, NIDS, g, 0) == 0, "%s",
			      ps_client_error(c));
	}
	for (int k = 0; k < 2; k++) {
		long grew_mb;
		ck_assert_int_eq(ps_client_stats(c, k, &st), 0);
		ck_assert_str_eq(st.tables[0].name, "e");
		const struct ps_table_stats *ts = &st.tables[0];
		grew_mb = (vm_hwm_kb(cl.srv[k]) - hwm0[k]) / 1024;
		printf("test_table_memory_budget: shard %d: %" PRIu64 " rows admitted, %" PRIu64
		       " kept (cap %" PRIu64 "), %" PRIu64 " evicted, %" PRIu64 " table bytes, peak "
		       "memory +%ld MiB\n", k, ts->admitted, ts->rows, ts->cap_rows, ts->evicted,
		       ts->bytes, grew_mb);
		fflush(stdout);
		ck_assert_msg(ts->rows <= cap, "shard %d keeps %" PRIu64 " rows (peak memory +%ld "
			      "MiB), its cap is %" PRIu64, k, ts->rows, grew_mb, cap);
		if (!getenv("PS_TEST_VALGRIND") && !SANITIZED) /* as in test_parked_pulls_bounded */
			ck_assert_msg(grew_mb < 64, "shard %d grew by %ld MiB", k, grew_mb);
		ck_assert_uint_eq(ts->cap_rows, cap);
		ck_assert_uint_gt(ts->admitted, cap); /* the control: the cap was reached */
		ck_assert_uint_eq(ts->evicted, ts->admitted - ts->rows);
		/* the bytes the stats report: the rows' weights at least, and
		 * within the table's share */
		ck_assert_msg(ts->bytes >= ts->rows * 4 * DIM && ts->bytes <= (4ull << 20),
			      "shard %d: table bytes %" PRIu64 " for %" PRIu64 " rows of %d floats, "
			      "share 4 MiB", k, ts->bytes, ts->rows, DIM);
	}
	ps_client_free(c);
	stop(&cl);
	/* by default: 4 GiB shared by the two tables */
	start(&cl, 1, "async", "", "");
	c = connect_retry(&cl.cfg, 0, err, sizeof(err));
	ck_assert_msg(c != NULL, "%s", err);
	ck_assert_int_eq(ps_client_stats(c, 0, &st), 0);
	for (int t = 0; t < 2; t++)
		ck_assert_uint_eq(st.tables[t].cap_rows, (4ull << 30) / 2 /
			row_cost(cl.cfg.tables[t].dim + ps_row_optim_nstate(&cl.cfg.tables[t])));
	ps_client_free(c);
	stop(&cl);
	free(ids);
	free(g);
}
END_TEST

static Suite *rows_suite(void)
{
	Suite *s = suite_create("it_rows");
	TCase *tc = tcase_create("rows");

	tcase_set_timeout(tc, 120);
	TU_ADD(tc, test_sync_exact);
	TU_ADD(tc, test_async_exact);
	TU_ADD(tc, test_async_row_pull_staleness);
	TU_ADD(tc, test_pull_fp16);
	TU_ADD(tc, test_sync_worker_leaves_and_ttl);
	TU_ADD(tc, test_sync_rows_with_dense_end_clock);
	TU_ADD(tc, test_sync_rows_ahead_of_dense_clock);
	TU_ADD(tc, test_waiting_row_pulls_of_closed_worker);
	TU_ADD(tc, test_checkpoint_kill9);
	TU_ADD_LOOP(tc, test_incremental_kill9, 0, 2);
	TU_ADD(tc, test_checkpoint_crash_points);
	TU_ADD(tc, test_hostile);
	TU_ADD(tc, test_huge_finite_rows);
	TU_ADD(tc, test_parked_pulls_bounded);
	TU_ADD(tc, test_table_memory_budget);
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
