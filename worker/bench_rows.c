/* bench_rows.c - ps-bench's embedding-row workloads (bench_rows.h).
 *
 * Each worker thread has its own client and a pool of pre-drawn requests
 * (drawing Zipf samples is not what is measured): batch ids, each the rank
 * r of a Zipf(s) draw over the table's rows mapped to a 64-bit id by a
 * bijective mix, so frequent ids are not neighbours. Rows per second count
 * the ids requested (repeats included: what a training step asks for);
 * the client's deduplication shows as the bytes it was given versus the
 * bytes it sent, and each shard's rows pulled or pushed give the load of
 * the busiest shard against the mean.
 */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "bench_rows.h"
#include "config.h"
#include "ps_client.h"
#include "ps_err.h"
#include "ps_time.h"

#define POOL 8

const char *ps_bench_jnum(char *buf, double v, int prec)
{
	if (!isfinite(v))
		return "null";
	snprintf(buf, 32, "%.*f", prec, v);
	return buf;
}

static uint64_t mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Zipf by rejection-inversion (Hörmann and Derflinger 1996): O(1) per
 * draw and no table, for any number of ranks and any exponent > 0. */
struct zipf {
	double s, n, hx0, hn, t;
};

static double zh(const struct zipf *z, double x)
{
	return z->s == 1.0 ? log(x) : (pow(x, 1.0 - z->s) - 1.0) / (1.0 - z->s);
}

static double zhinv(const struct zipf *z, double x)
{
	return z->s == 1.0 ? exp(x) : pow(1.0 + x * (1.0 - z->s), 1.0 / (1.0 - z->s));
}

static void zipf_init(struct zipf *z, uint64_t n, double s)
{
	z->s = s;
	z->n = (double)n;
	z->hx0 = zh(z, 1.5) - 1.0;
	z->hn = zh(z, z->n + 0.5);
	z->t = 2.0 - zhinv(z, zh(z, 2.5) - pow(2.0, -s));
}

static uint64_t zipf_draw(const struct zipf *z, uint64_t *state)
{
	for (;;) {
		double u = (double)(mix64((*state)++) >> 11) / 9007199254740992.0;
		double x = zhinv(z, z->hn + u * (z->hx0 - z->hn));
		double k = floor(x + 0.5);
		if (k < 1)
			k = 1;
		if (k > z->n)
			k = z->n;
		if (k - x <= z->t || u * (z->hx0 - z->hn) + z->hn >= zh(z, k + 0.5) - pow(k, -z->s))
			return (uint64_t)k;
	}
}

/* The id of rank r (1-based): a bijection of 64-bit values. */
static uint64_t rank_id(uint64_t r)
{
	return mix64(r ^ 0x5851f42d4c957f2dull);
}

void ps_bench_rows_config(struct ps_config *cfg, const struct bench_rows_opts *o)
{
	struct ps_table_cfg *t = &cfg->tables[0];

	memset(t, 0, sizeof(*t));
	snprintf(t->name, sizeof(t->name), "bench");
	t->dim = o->dim;
	t->init = PS_INIT_UNIFORM;
	t->init_value = 0.01f;
	t->optimizer = PS_ROPT_ROWWISE_ADAGRAD;
	t->lr = 0.01f;
	t->eps = 1e-8f;
	t->beta1 = 0.9f;
	t->beta2 = 0.999f;
	t->ftrl_beta = 1.0f;
	t->filter_ids = 1024;
	cfg->ntables = 1;
	/* a request's reply, and its ids, must fit a frame */
	uint64_t need = (uint64_t)o->batch * ((uint64_t)o->dim * 4 + 10) + 65536;
	if (cfg->limits.max_frame_bytes < need)
		cfg->limits.max_frame_bytes = need;
	if ((uint64_t)cfg->limits.max_request_rows < (uint64_t)o->batch)
		cfg->limits.max_request_rows = o->batch;
}

struct rw_arg {
	const struct ps_config *cfg;
	const struct bench_rows_opts *o;
	int rank;
	pthread_barrier_t *start;
	uint64_t requests, rows;
	uint64_t given, sent;
	double *lat;
	size_t nlat;
	int rc;
	char err[512];
};

static void *rows_worker(void *p)
{
	struct rw_arg *a = p;
	const struct bench_rows_opts *o = a->o;
	size_t vals = (size_t)o->batch * (size_t)o->dim;
	uint64_t *pool = malloc(sizeof(uint64_t) * (size_t)o->batch * POOL), st = 1234567 + (uint64_t)a->rank * 7777;
	float *g = malloc(sizeof(float) * vals), **out = calloc((size_t)o->inflight, sizeof(float *));
	int64_t *ids = calloc((size_t)o->inflight, sizeof(int64_t));
	double *t0 = calloc((size_t)o->inflight, sizeof(double));
	struct ps_client *c = NULL;
	struct zipf z;
	int head = 0, nin = 0, rc = 0;
	uint64_t clock = 0, next = 0;
	size_t cap = 1 << 16;

	a->lat = malloc(sizeof(double) * cap);
	for (int k = 0; out && k < o->inflight; k++)
		if (!(out[k] = malloc(sizeof(float) * vals)))
			rc = -ENOMEM;
	if (!pool || !g || !out || !ids || !t0 || !a->lat || rc) {
		a->rc = -ENOMEM;
		pthread_barrier_wait(a->start);
		goto out;
	}
	zipf_init(&z, o->rows, o->zipf);
	for (size_t i = 0; i < (size_t)o->batch * POOL; i++)
		pool[i] = rank_id(zipf_draw(&z, &st));
	for (size_t i = 0; i < vals; i++)
		g[i] = (float)((int)(i % 7) - 3) * 1e-3f;
	for (double t = ps_now_s();; usleep(100000)) {
		rc = ps_client_init(&c, a->cfg, a->rank, a->err, sizeof(a->err));
		if (rc != -ECONNREFUSED || ps_now_s() - t > 10 || !o->local)
			break;
	}
	pthread_barrier_wait(a->start);
	if (rc) {
		a->rc = rc;
		goto out;
	}
	/* Shards already running: continue at the table's clock, and do not
	 * fill a table that is full already. */
	uint64_t have = 0;
	for (int k = 0; k < a->cfg->nshards; k++) {
		struct ps_shard_stats st;
		if (ps_client_stats(c, k, &st) == 0 && st.ntables) {
			if (st.tables[0].version > clock)
				clock = st.tables[0].version;
			have += st.tables[0].rows;
		}
	}
	/* pull-rows reads rows that exist: worker 0 pushes every rank's row
	 * once first (not timed) */
	if (!o->push && a->rank == 0 && have < o->rows) {
		uint64_t *all = malloc(sizeof(uint64_t) * (size_t)o->batch);
		for (uint64_t r = 1; all && r <= o->rows && !rc; r += (uint64_t)o->batch) {
			size_t n = 0;
			for (uint64_t q = r; q <= o->rows && n < (size_t)o->batch; q++)
				all[n++] = rank_id(q);
			rc = ps_client_push_rows(c, "bench", clock++, all, n, g, 0);
		}
		free(all);
		if (rc) {
			a->rc = rc;
			snprintf(a->err, sizeof(a->err), "prefill: %s", ps_client_error(c));
			goto out;
		}
	}
	ps_client_rows_bytes(c, &a->given, &a->sent);
	uint64_t given0 = a->given, sent0 = a->sent;
	double end = ps_now_s() + o->seconds;
	for (;;) {
		int submit = ps_now_s() < end;
		if (nin == o->inflight || (!submit && nin > 0)) {
			if ((rc = ps_client_wait(c, ids[head])))
				break;
			if (a->nlat == cap) {
				double *v = realloc(a->lat, sizeof(double) * cap * 2);
				if (v) {
					a->lat = v;
					cap *= 2;
				}
			}
			if (a->nlat < cap)
				a->lat[a->nlat++] = ps_now_s() - t0[head];
			a->requests++;
			a->rows += (uint64_t)o->batch;
			head = (head + 1) % o->inflight;
			nin--;
			continue;
		}
		if (!submit)
			break;
		int k = (head + nin) % o->inflight;
		const uint64_t *req = pool + (next++ % POOL) * (size_t)o->batch;
		t0[k] = ps_now_s();
		ids[k] = o->push ? ps_client_push_rows_async(c, "bench", clock++, req,
							      (size_t)o->batch, g,
							      o->fp16 ? PS_PUSH_ROWS_FP16 : 0)
				 : ps_client_pull_rows_async(c, "bench", 0, req, (size_t)o->batch,
							      out[k]);
		if (ids[k] < 0) {
			rc = (int)ids[k];
			break;
		}
		nin++;
	}
	ps_client_rows_bytes(c, &a->given, &a->sent);
	a->given -= given0;
	a->sent -= sent0;
	if (rc) {
		a->rc = rc;
		snprintf(a->err, sizeof(a->err), "%s", ps_client_error(c));
	}
out:
	ps_client_free(c);
	for (int k = 0; out && k < o->inflight; k++)
		free(out[k]);
	free(out);
	free(ids);
	free(t0);
	free(pool);
	free(g);
	return NULL;
}

static int cmp_double(const void *x, const void *y)
{
	double a = *(const double *)x, b = *(const double *)y;

	return a < b ? -1 : a > b;
}

int ps_bench_rows_run(const struct ps_config *cfg, const struct bench_rows_opts *o,
		      double raw_bps, FILE *out)
{
	int nw = cfg->nworkers, rc = 1;
	struct rw_arg *wa = calloc((size_t)nw, sizeof(*wa));
	pthread_t *th = calloc((size_t)nw, sizeof(*th));
	pthread_barrier_t start;
	uint64_t reqs = 0, rows = 0, given = 0, sent = 0, load[PS_MAX_SHARDS] = { 0 }, lmax = 0,
		 ltot = 0, srv_rows = 0, srv_bytes = 0;
	size_t nlat = 0;
	double *lat = NULL;
	char b[12][32];

	if (!wa || !th)
		goto out;
	pthread_barrier_init(&start, NULL, (unsigned)nw);
	for (int w = 0; w < nw; w++) {
		wa[w] = (struct rw_arg){ .cfg = cfg, .o = o, .rank = w, .start = &start };
		pthread_create(&th[w], NULL, rows_worker, &wa[w]);
	}
	for (int w = 0; w < nw; w++)
		pthread_join(th[w], NULL);
	pthread_barrier_destroy(&start);
	for (int w = 0; w < nw; w++) {
		if (wa[w].rc) {
			fprintf(stderr, "ps-bench: worker %d: %s (%s)\n", w, wa[w].err,
				ps_strerror(wa[w].rc));
			goto out;
		}
		reqs += wa[w].requests;
		rows += wa[w].rows;
		given += wa[w].given;
		sent += wa[w].sent;
		nlat += wa[w].nlat;
	}
	lat = malloc(sizeof(double) * (nlat ? nlat : 1));
	for (int w = 0, at = 0; lat && w < nw; w++) {
		memcpy(lat + at, wa[w].lat, sizeof(double) * wa[w].nlat);
		at += (int)wa[w].nlat;
	}
	if (lat)
		qsort(lat, nlat, sizeof(double), cmp_double);
	/* each shard's share of the rows (pulled or pushed), and its size */
	{
		struct ps_client *mon;
		char e2[256];
		if (ps_client_init(&mon, cfg, -1, e2, sizeof(e2)) == 0) {
			for (int k = 0; k < cfg->nshards; k++) {
				struct ps_shard_stats st;
				if (ps_client_stats(mon, k, &st) || !st.ntables)
					continue;
				load[k] = o->push ? st.tables[0].pushed_rows : st.tables[0].pulled_rows;
				srv_rows += st.tables[0].rows;
				srv_bytes += st.tables[0].bytes;
			}
			ps_client_free(mon);
		}
	}
	for (int k = 0; k < cfg->nshards; k++) {
		ltot += load[k];
		if (load[k] > lmax)
			lmax = load[k];
	}
	double rows_s = (double)rows / o->seconds, reqs_s = (double)reqs / o->seconds;
	double payload_bps = rows_s * o->dim * 4.0;
	double skew = ltot ? (double)lmax / ((double)ltot / cfg->nshards) : NAN;
	double dedup = sent ? (double)given / (double)sent : NAN;
	double p50 = nlat ? lat[nlat / 2] : NAN, p99 = nlat ? lat[(size_t)(0.99 * (nlat - 1))] : NAN;
	double bpr = srv_rows ? (double)srv_bytes / (double)srv_rows : NAN;
	const char *op = o->push ? "push-rows" : "pull-rows";
	if (o->json) {
		fprintf(out, "{\"op\":\"%s\",\"rows\":%" PRIu64 ",\"dim\":%d,\"zipf\":%s,\"batch\":%d,"
			"\"seconds\":%s,\"inflight\":%d,\"workers\":%d,\"shards\":%d,"
			"\"consistency\":\"%s\",\"requests\":%" PRIu64 ",\"rows_per_s\":%s,"
			"\"requests_per_s\":%s,\"p50_ms\":%s,\"p99_ms\":%s,\"payload_gb_per_s\":%s,"
			"\"raw_gb_per_s\":%s,\"gb_ratio\":%s,\"dedup_bytes_ratio\":%s,"
			"\"busiest_shard_over_mean\":%s,\"table_rows\":%" PRIu64 ","
			"\"table_bytes_per_row\":%s}\n",
			op, o->rows, o->dim, ps_bench_jnum(b[0], o->zipf, 3), o->batch,
			ps_bench_jnum(b[1], o->seconds, 3), o->inflight, nw, cfg->nshards,
			cfg->consistency == PS_SYNC ? "sync" : "async", reqs,
			ps_bench_jnum(b[2], rows_s, 0), ps_bench_jnum(b[3], reqs_s, 2),
			ps_bench_jnum(b[4], p50 * 1e3, 3), ps_bench_jnum(b[5], p99 * 1e3, 3),
			ps_bench_jnum(b[6], payload_bps / 1e9, 4), ps_bench_jnum(b[7], raw_bps / 1e9, 4),
			ps_bench_jnum(b[8], payload_bps / raw_bps, 3), ps_bench_jnum(b[9], dedup, 3),
			ps_bench_jnum(b[10], skew, 3), srv_rows, ps_bench_jnum(b[11], bpr, 1));
	} else {
		fprintf(out, "ps-bench: %s, table of %" PRIu64 " rows, dim %d, zipf %.2f, %d ids per "
			"request, %d worker(s), %d shard(s), inflight %d, %s, %.1f s\n", op, o->rows,
			o->dim, o->zipf, o->batch, nw, cfg->nshards, o->inflight,
			cfg->consistency == PS_SYNC ? "sync" : "async", o->seconds);
		fprintf(out, "  rate        %12.0f rows/s   (%.1f requests/s)\n", rows_s, reqs_s);
		fprintf(out, "  latency     p50 %.2f ms, p99 %.2f ms per request\n", p50 * 1e3,
			p99 * 1e3);
		if (isfinite(raw_bps))
			fprintf(out, "  payload     %9.3f GB/s of row values  raw TCP stream %7.3f GB/s"
				"   ratio %.3f\n", payload_bps / 1e9, raw_bps / 1e9, payload_bps / raw_bps);
		fprintf(out, "  dedup       bytes given / bytes sent %.2f\n", dedup);
		fprintf(out, "  shards      busiest / mean load %.3f\n", skew);
		fprintf(out, "  table       %" PRIu64 " rows on the shards, %.1f bytes per row held\n",
			srv_rows, bpr);
	}
	rc = 0;
out:
	for (int w = 0; wa && w < nw; w++)
		free(wa[w].lat);
	free(lat);
	free(wa);
	free(th);
	return rc;
}
