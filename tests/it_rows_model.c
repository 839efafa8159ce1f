/* it_rows_model.c - admission, eviction and the time-to-live of an
 * embedding table on real shards, checked against a model of the rules
 * while the ctr preset trains on another table of the same shards.
 *
 * Two ps-server processes serve a probe table (dim 4, rowwise adagrad,
 * admission 3, max_rows 48: 24 a shard, ttl 2 s, fields: []) and the ctr
 * model's table; two ps-worker processes train the ctr preset on a
 * generated click log (epochs without end: the members share the epochs,
 * so only this keeps them training) for as long as the checker runs
 * (async mode), then are killed. The checker, a third worker rank in this process,
 * runs a seeded random sequence of push_rows and pull_rows on the probe
 * table (hot ids, a window drifting through 4,096 ids, random far ones;
 * repeats within a push) and checks every pulled row against the model:
 *   - a push naming an id without a row counts one sighting (repeats in
 *     one push are one); the third creates the row from the id's
 *     deterministic initial value and fresh state (accumulator 0.1) and
 *     applies the push's summed gradient;
 *   - creating a row on a shard holding 24 drops that shard's least
 *     recently updated row (pulls do not count as updates);
 *   - a row not updated for 2 s is dropped; a dropped row forgets its
 *     weights, state and sightings: it reads as its initial value and
 *     needs three pushes again;
 *   - a row's weights follow rowwise adagrad exactly (bit for bit).
 * The shards' counters are checked every thousand operations (admitted
 * exactly, rows within the model's bounds) and at the end, after a quiet
 * stretch with pulls only that lets every row expire (no rows; evicted
 * within the model's bounds, the rest expired).
 *
 * Time. A shard stamps a row's update with the whole seconds since its
 * epoch e (its start) and drops rows with stamp + ttl <= now - e at a
 * tick every 200 ms, all on the monotonic clock this process reads too.
 * The test bounds e from the shard's uptime (ps_client_stats), and a
 * push's stamp from its send and acknowledgement times; a row is then
 * surely there until e_lo + stamp_lo + ttl and surely dropped after
 * e_hi + stamp_hi + ttl + 0.6 s (a tick and the shard's lag). The model
 * stays exact by never pushing to a row between the two, accepting
 * either value from a pull there (a row read back as its initial value
 * is gone: the model drops it), and dropping a row once past the second
 * bound. Most stamps are known to the second, so a shard keeping rows a
 * second too long fails the test (checked, docs/testing.md). A push whose
 * acknowledgement came after the first bound of a row it named (a slow
 * reply) is resolved by pulling that row at once: it either holds the
 * push applied to the old row or was dropped before it and only counted.
 * Rows near their expiry are the least recently updated (updates are
 * stamped in order), so the cap's evictions stay exact: creating a row
 * where the model holds 24 drops the model's oldest, which the shard has
 * either dropped by age already or drops now.
 *
 * PS_TEST_SEED (default 1) seeds the sequence, PS_TEST_OPS (default 8,000:
 * about 9 s here) sets the operations; the long run, PS_TEST_OPS=1000000,
 * is run directly, not through run-tests.sh, which stops a test at 600 s
 * (docs/testing.md).
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include "config.h"
#include "ps_client.h"
#include "ps_err.h"
#include "ps_time.h"
#include "rows_wire.h"
#include "test_util.h"

#define D 4              /* probe table: floats per row */
#define ADMIT 3          /* pushes that create a row */
#define CAP 24           /* rows per shard (max_rows 48 over 2 shards) */
#define TTL 2            /* seconds */
#define LR 0.5f
#define ACC0 0.1f        /* rowwise adagrad's initial accumulator */
#define EPS 1e-8f
#define U 4096           /* ids of the sequence */
#define HOT 8            /* ids 0..7: pushed often */
#define WIN 48           /* the drifting window of ids */
#define MULT 0x9e3779b97f4a7c15ull
#define MULT_INV 0xf1de83e19937733dull /* MULT * MULT_INV = 1 mod 2^64 */
#define NIL (-1)

static char tmpdir[64];

/* ---- the model ---- */

struct mrow {
	int shard, live, count;  /* count: sightings while there is no row */
	float w[D], acc;         /* weights and rowwise adagrad's accumulator */
	double sent, acked;      /* the last update's push: sent, acknowledged */
	int prev, next;          /* recency list of the shard: newer toward head */
};

struct model {
	const struct ps_config *cfg;
	int t;                   /* the probe table's index */
	double margin;           /* a tick (0.2 s) and the shard's lag */
	double e_lo[2], e_hi[2];  /* bounds of each shard's time of stamp 0 */
	struct mrow r[U];
	int head[2], tail[2], n[2];
	uint64_t admitted[2], dropped[2]; /* rows created; dropped, by eviction or age */
	uint64_t evicted[2];      /* the cap's drops: the shard's evicted is at most this */
	uint64_t evicted_sure[2]; /* of them, rows surely not dropped by age before: at least */
	uint64_t ambiguous;       /* pushes resolved by a pull (slow replies) */
	uint64_t checked, init_reads, uncertain_reads;
};

static uint64_t id_of(int i)
{
	return (uint64_t)(i + 1) * MULT;
}

static void unlink_row(struct model *m, int i)
{
	struct mrow *r = &m->r[i];

	if (r->prev != NIL)
		m->r[r->prev].next = r->next;
	else
		m->head[r->shard] = r->next;
	if (r->next != NIL)
		m->r[r->next].prev = r->prev;
	else
		m->tail[r->shard] = r->prev;
	r->prev = r->next = NIL;
}

static void push_head(struct model *m, int i)
{
	struct mrow *r = &m->r[i];
	int s = r->shard;

	r->prev = NIL;
	r->next = m->head[s];
	if (m->head[s] != NIL)
		m->r[m->head[s]].prev = i;
	m->head[s] = i;
	if (m->tail[s] == NIL)
		m->tail[s] = i;
}

/* Row i leaves the shard (evicted or expired): weights, state and
 * sightings forgotten. */
static void drop(struct model *m, int i)
{
	struct mrow *r = &m->r[i];

	unlink_row(m, i);
	r->live = 0;
	r->count = 0;
	m->n[r->shard]--;
	m->dropped[r->shard]++;
}

/* Row r is surely still on its shard at time t (before the first tick
 * that can drop it: the epoch's lower bound + the lowest stamp its push
 * can have + ttl), and surely gone after the last (the upper bounds, a
 * tick and the lag); in between either. */
static int sure_live(const struct model *m, const struct mrow *r, double t)
{
	int s = r->shard;

	return t < m->e_lo[s] + floor(r->sent - m->e_hi[s]) + TTL;
}

static int sure_gone(const struct model *m, const struct mrow *r, double t)
{
	int s = r->shard;

	return t > m->e_hi[s] + floor(r->acked - m->e_lo[s]) + TTL + m->margin;
}

/* Drops the rows surely expired by now (the oldest of each shard first). */
static void expire(struct model *m, double now)
{
	for (int s = 0; s < 2; s++)
		while (m->tail[s] != NIL && sure_gone(m, &m->r[m->tail[s]], now))
			drop(m, m->tail[s]);
}

static void rowwise_adagrad(struct mrow *r, const float *g)
{
	float sq = 0.0f, step;

	for (int j = 0; j < D; j++)
		sq += g[j] * g[j];
	r->acc += sq / (float)D;
	step = LR / (sqrtf(r->acc) + EPS);
	for (int j = 0; j < D; j++)
		r->w[j] -= step * g[j];
}

/* One push of gradient g (the push's sum for id i), sent at sent and
 * acknowledged at acked, as the shard applies it. */
static void model_push(struct model *m, int i, const float *g, double sent, double acked)
{
	struct mrow *r = &m->r[i];
	int s = r->shard;

	if (!r->live) {
		if (++r->count < ADMIT)
			return;
		if (m->n[s] == CAP) {
			int old = m->tail[s];
			/* the shard drops this one now, or dropped it by age already */
			m->evicted_sure[s] += sure_live(m, &m->r[old], acked);
			m->evicted[s]++;
			drop(m, old);
		}
		ps_rows_init(m->cfg, m->t, id_of(i), r->w);
		r->acc = ACC0;
		r->live = 1;
		r->count = 0;
		m->n[s]++;
		m->admitted[s]++;
	} else {
		unlink_row(m, i);
	}
	push_head(m, i);
	rowwise_adagrad(r, g);
	r->sent = sent;
	r->acked = acked;
}

/* ---- the checker ---- */

static uint64_t rng(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* An id of the sequence at operation op: hot, in the window that drifts
 * one id every 4 operations, or anywhere. */
static int pick(uint64_t *s, long op)
{
	unsigned r = (unsigned)(rng(s) % 100);

	if (r < 15)
		return (int)(rng(s) % HOT);
	if (r < 85)
		return HOT + (int)(((uint64_t)op / 4 + rng(s) % WIN) % (U - HOT));
	return (int)(rng(s) % U);
}

struct checker {
	struct model *m;
	struct ps_client *c;
	const char *table;
	uint64_t seed;
	long ops, pushes, pulls;
	char why[768];
};

/* Compares a pulled row of id i with the model: 0, or -1 with why set. */
static int check_row(struct checker *k, int i, const float *got, double sent, double done,
		     long op)
{
	struct model *m = k->m;
	struct mrow *r = &m->r[i];
	float init[D];

	ps_rows_init(m->cfg, m->t, id_of(i), init);
	m->checked++;
	if (!r->live || !sure_live(m, r, done)) {
		int is_init = !memcmp(got, init, sizeof(init));
		if (!r->live) {
			if (is_init) {
				m->init_reads++;
				return 0;
			}
			snprintf(k->why, sizeof(k->why), "op %ld: id %d (shard %d) has no row in the "
				 "model (%d sightings) but reads %g %g %g %g, not its initial "
				 "value %g %g %g %g", op, i, r->shard, r->count, got[0], got[1],
				 got[2], got[3], init[0], init[1], init[2], init[3]);
			return -1;
		}
		m->uncertain_reads++;
		if (!memcmp(got, r->w, sizeof(r->w)))
			return 0;
		if (is_init) { /* dropped by age: the shard no longer has it */
			drop(m, i);
			return 0;
		}
		snprintf(k->why, sizeof(k->why), "op %ld: id %d near its expiry (updated %.3f s "
			 "before the pull) reads %g %g %g %g: neither its weights %g %g %g %g "
			 "nor its initial value", op, i, sent - r->acked, got[0], got[1], got[2],
			 got[3], r->w[0], r->w[1], r->w[2], r->w[3]);
		return -1;
	}
	if (memcmp(got, r->w, sizeof(r->w))) {
		int s = r->shard;
		snprintf(k->why, sizeof(k->why), "op %ld: id %d (shard %d, %d rows there) reads "
			 "%.9g %.9g %.9g %.9g, the model has %.9g %.9g %.9g %.9g%s; its last push "
			 "sent %.3f, acked %.3f, this pull sent %.3f, done %.3f s after the shard's "
			 "first epoch (%.3f..%.3f s of this process's clock)", op, i, s,
			 m->n[s], got[0], got[1], got[2], got[3], r->w[0], r->w[1], r->w[2],
			 r->w[3], !memcmp(got, init, sizeof(init)) ? " (its initial value: dropped "
			 "too early)" : "", r->sent - m->e_lo[s], r->acked - m->e_lo[s],
			 sent - m->e_lo[s], done - m->e_lo[s], m->e_lo[s], m->e_hi[s]);
		return -1;
	}
	return 0;
}

/* Pulls n ids (indices idx) and checks each. */
static int do_pull(struct checker *k, const int *idx, int n, long op)
{
	uint64_t ids[8];
	float got[8 * D];
	double sent, done;

	for (int j = 0; j < n; j++)
		ids[j] = id_of(idx[j]);
	sent = ps_now_s();
	if (ps_client_pull_rows(k->c, k->table, 0, ids, (size_t)n, got)) {
		snprintf(k->why, sizeof(k->why), "op %ld: pull: %s", op, ps_client_error(k->c));
		return -1;
	}
	done = ps_now_s();
	k->pulls++;
	for (int j = 0; j < n; j++)
		if (check_row(k, idx[j], got + j * D, sent, done, op))
			return -1;
	return 0;
}

/* A push of up to 6 ids (with repeats), leaving out rows near their
 * expiry; the model follows. A row whose push was acknowledged past its
 * sure-live bound is pulled at once to learn which way it went. */
static int do_push(struct checker *k, uint64_t *s, long op)
{
	struct model *m = k->m;
	uint64_t ids[12];
	float g[12 * D], sum[12][D];
	int idx[12], uniq[12], nu = 0, n = 0, want = 1 + (int)(rng(s) % 6);
	double now = ps_now_s(), sent, acked;

	for (int j = 0; j < want; j++) {
		int i = pick(s, op);
		struct mrow *r = &m->r[i];
		if (r->live && !sure_live(m, r, now + 0.25))
			continue; /* near its expiry: its fate would be a guess */
		idx[n] = i;
		ids[n] = id_of(i);
		for (int d = 0; d < D; d++)
			g[n * D + d] = (float)((int)(rng(s) % 7) - 3);
		n++;
		if (rng(s) % 4 == 0) { /* the same id again in this push */
			idx[n] = i;
			ids[n] = ids[n - 1];
			for (int d = 0; d < D; d++)
				g[n * D + d] = (float)((int)(rng(s) % 7) - 3);
			n++;
		}
	}
	if (!n)
		return 0;
	/* the client sums repeats: small integers, so any order gives the same sum */
	for (int j = 0; j < n; j++) {
		int u = 0;
		while (u < nu && uniq[u] != idx[j])
			u++;
		if (u == nu) {
			uniq[nu++] = idx[j];
			memset(sum[u], 0, sizeof(sum[u]));
		}
		for (int d = 0; d < D; d++)
			sum[u][d] += g[j * D + d];
	}
	/* a shard applies a push's ids in ascending order (they travel sorted),
	 * so the last is the most recently updated */
	for (int a = 1; a < nu; a++)
		for (int b = a; b > 0 && id_of(uniq[b - 1]) > id_of(uniq[b]); b--) {
			int ti = uniq[b];
			float tg[D];
			uniq[b] = uniq[b - 1];
			uniq[b - 1] = ti;
			memcpy(tg, sum[b], sizeof(tg));
			memcpy(sum[b], sum[b - 1], sizeof(tg));
			memcpy(sum[b - 1], tg, sizeof(tg));
		}
	sent = ps_now_s();
	if (ps_client_push_rows(k->c, k->table, 0, ids, (size_t)n, g, 0)) {
		snprintf(k->why, sizeof(k->why), "op %ld: push: %s", op, ps_client_error(k->c));
		return -1;
	}
	acked = ps_now_s();
	k->pushes++;
	for (int u = 0; u < nu; u++) {
		struct mrow *r = &m->r[uniq[u]];
		int slow = r->live && !sure_live(m, r, acked);
		float got[D];

		model_push(m, uniq[u], sum[u], sent, acked);
		if (!slow)
			continue;
		/* applied to the old row (the model now), or the row was gone
		 * and the push counted once */
		m->ambiguous++;
		uint64_t id = id_of(uniq[u]);
		if (ps_client_pull_rows(k->c, k->table, 0, &id, 1, got)) {
			snprintf(k->why, sizeof(k->why), "op %ld: pull: %s", op, ps_client_error(k->c));
			return -1;
		}
		if (!memcmp(got, r->w, sizeof(got)))
			continue;
		float init[D];
		ps_rows_init(m->cfg, m->t, id, init);
		if (memcmp(got, init, sizeof(init))) {
			snprintf(k->why, sizeof(k->why), "op %ld: id %d pushed at its expiry reads %g "
				 "%g %g %g: neither the push applied (%g ...) nor its initial value",
				 op, uniq[u], got[0], got[1], got[2], got[3], r->w[0]);
			return -1;
		}
		drop(m, uniq[u]); /* gone by age before the push, which counted once */
		r->count = 1;
	}
	return 0;
}

/* Compares the shards' counters of the probe table with the model: the
 * admissions exactly; rows between those surely there and the model's.
 * At the end (every row surely expired): no rows, evictions between the
 * sure ones and the model's, the rest expired. 0, or -1 with why. */
static int check_counters(struct checker *k, int end, long op)
{
	struct model *m = k->m;

	for (int s = 0; s < 2; s++) {
		struct ps_shard_stats st;
		const struct ps_table_stats *ts;
		uint64_t sure = 0;
		double t;

		if (ps_client_stats(k->c, s, &st) || st.ntables <= m->t) {
			snprintf(k->why, sizeof(k->why), "op %ld: stats of shard %d: %s", op, s,
				 ps_client_error(k->c));
			return -1;
		}
		t = ps_now_s();
		ts = &st.tables[m->t];
		for (int i = m->head[s]; i != NIL && sure_live(m, &m->r[i], t); i = m->r[i].next)
			sure++;
		if (ts->admitted != m->admitted[s] || ts->rows > (uint64_t)m->n[s] || ts->rows < sure) {
			snprintf(k->why, sizeof(k->why), "op %ld: shard %d has admitted %" PRIu64 " rows "
				 "and holds %" PRIu64 "; the model admitted %" PRIu64 " and holds %d "
				 "(%" PRIu64 " surely)", op, s, ts->admitted, ts->rows, m->admitted[s],
				 m->n[s], sure);
			return -1;
		}
		if (end && (ts->rows != 0 || ts->evicted < m->evicted_sure[s] ||
			    ts->evicted > m->evicted[s] ||
			    ts->evicted + ts->expired != m->admitted[s])) {
			snprintf(k->why, sizeof(k->why), "end: shard %d: %" PRIu64 " rows, %" PRIu64
				 " evicted, %" PRIu64 " expired of %" PRIu64 " admitted; the model: "
				 "0 rows, %" PRIu64 "..%" PRIu64 " evicted", s, ts->rows, ts->evicted,
				 ts->expired, ts->admitted, m->evicted_sure[s], m->evicted[s]);
			return -1;
		}
	}
	return 0;
}

/* Pulls only, until every row has surely expired. */
static int quiet(struct checker *k, uint64_t *s, long op)
{
	double until = ps_now_s() + TTL + k->m->margin + 0.3;

	for (double now = ps_now_s(); now < until; now = ps_now_s()) {
		int idx[8], n = 1 + (int)(rng(s) % 8);

		expire(k->m, now);
		for (int j = 0; j < n; j++)
			idx[j] = pick(s, op);
		if (do_pull(k, idx, n, op))
			return -1;
		tu_sleep_ms(2);
	}
	expire(k->m, ps_now_s());
	return 0;
}

/* The sequence: k->ops operations, half pushes, half pulls (a fifth of
 * the pulled ids anywhere), with a quiet stretch every 20,000 (at least
 * one in the middle) and one at the end. 0, or -1 with why. */
static int run_checker(struct checker *k)
{
	uint64_t s = k->seed;
	long every = k->ops / 2 < 20000 ? k->ops / 2 : 20000;

	for (long op = 0; op < k->ops; op++) {
		expire(k->m, ps_now_s());
		if (op && every && op % every == 0 && quiet(k, &s, op))
			return -1;
		if (rng(&s) % 2) {
			if (do_push(k, &s, op))
				return -1;
		} else {
			int idx[8], n = 1 + (int)(rng(&s) % 8);
			for (int j = 0; j < n; j++)
				idx[j] = rng(&s) % 5 ? pick(&s, op) : (int)(rng(&s) % U);
			if (do_pull(k, idx, n, op))
				return -1;
		}
		if (op % 1000 == 999 && check_counters(k, 0, op))
			return -1;
	}
	if (quiet(k, &s, k->ops))
		return -1;
	return check_counters(k, 1, k->ops);
}

/* ---- training beside it ---- */

struct trainer {
	char cfg[64];
	int stop;                /* under mu */
	pid_t w[2];              /* the round's workers, under mu; 0 once waited for */
	pthread_mutex_t mu;
	int rounds, failed;
	char why[1200];
};

static void tail_of(const char *path, char *buf, size_t len)
{
	FILE *f = fopen(path, "r");
	long sz;
	size_t n = 0;

	if (f && fseek(f, 0, SEEK_END) == 0 && (sz = ftell(f)) >= 0 &&
	    fseek(f, sz > (long)len - 1 ? sz - (long)len + 1 : 0, SEEK_SET) == 0)
		n = fread(buf, 1, len - 1, f);
	if (f)
		fclose(f);
	buf[n] = 0;
}

/* Rounds of two ps-worker processes training the ctr preset, until stop.
 * The members share the epochs (a worker's slot follows the clocks the
 * cluster has trained), so a round trains until train_stop kills its
 * workers (kill -9: how they leave is not this test's subject, and a
 * leave on SIGTERM waits up to 10 s for a step whose shard failed over). */
static void *train_main(void *p)
{
	struct trainer *t = p;

	for (;;) {
		char out[2][128], rank[2][4];
		int stopped;

		pthread_mutex_lock(&t->mu);
		for (int r = 0; r < 2 && !t->stop; r++) {
			snprintf(out[r], sizeof(out[r]), "%s/worker-%d.out", tmpdir, r);
			snprintf(rank[r], sizeof(rank[r]), "%d", r);
			const char *a[] = { "bin/ps-worker", "--config", t->cfg, "--rank", rank[r], NULL };
			t->w[r] = tu_spawn(a, out[r]);
		}
		stopped = t->stop;
		pthread_mutex_unlock(&t->mu);
		if (stopped)
			break;
		for (int r = 0; r < 2; r++) {
			siginfo_t si;
			pid_t pid = t->w[r];
			/* waited for, not reaped, until train_stop can no longer
			 * signal its pid (which reaping frees for reuse) */
			while (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT) && errno == EINTR)
				;
			pthread_mutex_lock(&t->mu);
			t->w[r] = 0;
			stopped = t->stop;
			pthread_mutex_unlock(&t->mu);
			int st = tu_wait_child(pid);
			if (stopped && st == 128 + SIGKILL)
				st = 0;
			if (st && !t->failed) {
				int n = snprintf(t->why, sizeof(t->why), "training round %d: worker %d "
						 "exited %d:\n", t->rounds + 1, r, st);
				tail_of(out[r], t->why + n, sizeof(t->why) - (size_t)n);
				t->failed = 1;
			}
		}
		if (t->failed)
			break;
		t->rounds++;
	}
	return NULL;
}

/* Stops the rounds: the running workers are killed. */
static void train_stop(struct trainer *t)
{
	pthread_mutex_lock(&t->mu);
	t->stop = 1;
	for (int r = 0; r < 2; r++)
		if (t->w[r] > 0)
			kill(t->w[r], SIGKILL);
	pthread_mutex_unlock(&t->mu);
}

/* Row pushes applied to table 0 (the ctr model's), both shards: the
 * table's version, which a backup holds as its primary does (a process's
 * pushed_rows counts from its own start: after takeovers it may be 0). */
static uint64_t trained_pushes(struct ps_client *c)
{
	uint64_t n = 0;

	for (int s = 0; s < 2; s++) {
		struct ps_shard_stats st;
		ck_assert_int_eq(ps_client_stats(c, s, &st), 0);
		n += st.tables[0].version;
	}
	return n;
}

/* ---- replicated shards and their faults (test_rules_across_failovers) ---- */

struct faults {
	const struct ps_config *cfg;
	char cfg_path[64];
	pid_t srv[2][2];            /* [replica][shard] */
	int stop;                   /* __atomic */
	int n, primaries;           /* faults injected; of them primaries killed */
	double epoch[2][2];         /* [shard][table]: the first primary's epoch_unix */
	double epoch_off;           /* the most any process's differed from it at the end */
	char why[256];
};

/* A free port below the kernel's ephemeral range: a restarted process must
 * not find its port taken as the source port of its partner's dial. */
static int low_port(int n)
{
	static int picked[8];
	unsigned seed = (unsigned)getpid() * 2654435761u + (unsigned)n * 40503u + 3u;

	for (int i = 0; i < 1000; i++) {
		int p = 20000 + (int)(rand_r(&seed) % 12000), dup = 0;
		struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)p),
					  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		int fd = socket(AF_INET, SOCK_STREAM, 0);

		for (int j = 0; j < n; j++)
			dup |= picked[j] == p;
		if (!dup && fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
			close(fd);
			picked[n] = p;
			return p;
		}
		if (fd >= 0)
			close(fd);
	}
	return tu_free_port();
}

static pid_t start_replica(const char *cfg_path, int shard, int replica)
{
	static int starts; /* __atomic: each process its own log, none overwritten */
	char s[8], r[8], log[128];

	snprintf(s, sizeof(s), "%d", shard);
	snprintf(r, sizeof(r), "%d", replica);
	snprintf(log, sizeof(log), "%s/shard%d-r%d.%d.log", tmpdir, shard, replica,
		 __atomic_fetch_add(&starts, 1, __ATOMIC_RELAXED));
	const char *a[] = { "bin/ps-server", "--config", cfg_path, "--shard", s, "--replica", r,
			    "--log-level", "info", NULL };
	return tu_spawn(a, log);
}

/* ReplState of replica r of shard k, whether its partner is up; -1 when it
 * does not answer. */
static int repl_state(const struct ps_config *cfg, int k, int r, int *up)
{
	struct ps_config *c = malloc(sizeof(*c));
	struct ps_client *cl = NULL;
	struct ps_shard_stats st;
	char err[512];
	int rc = -1;

	memcpy(c, cfg, sizeof(*c));
	if (r)
		memcpy(c->shards, c->backups, sizeof(c->shards));
	c->limits.connect_timeout_ms = 500;
	c->limits.request_timeout_ms = 1000;
	if (!ps_client_init(&cl, c, -1, err, sizeof(err))) {
		if (!ps_client_stats(cl, k, &st)) {
			rc = (int)st.repl_state;
			*up = st.repl_partner_up;
		}
		ps_client_free(cl);
	}
	free(c);
	return rc;
}

/* Both shards have a primary whose backup holds the state; waits up to
 * limit_s. The primary of shard k in prim[k]. */
static int pairs_formed(const struct ps_config *cfg, double limit_s, int *prim)
{
	for (double t0 = ps_now_s(); ps_now_s() - t0 < limit_s * tu_time_scale(); tu_sleep_ms(50)) {
		int ok = 0;
		for (int k = 0; k < 2; k++) {
			int up0 = 0, up1 = 0, a = repl_state(cfg, k, 0, &up0), b = repl_state(cfg, k, 1, &up1);
			if (a == 3 && up0 && b == 2)
				prim[k] = 0, ok++;
			else if (b == 3 && up1 && a == 2)
				prim[k] = 1, ok++;
		}
		if (ok == 2)
			return 1;
	}
	return 0;
}

/* Until stopped: every 1.5-2.5 s, once both pairs have formed, kill -9 a
 * primary (every other fault) or a random process and restart it 0.3 s
 * later. */
static void *faults_main(void *p)
{
	struct faults *f = p;
	uint64_t seed = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull | 1;

	while (!__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE)) {
		int prim[2], pause = 1500 + (int)(rng(&seed) % 1000);
		for (int t = 0; t < pause && !__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE); t += 10)
			tu_sleep_ms(10);
		if (__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE))
			break;
		if (!pairs_formed(f->cfg, 30, prim)) {
			snprintf(f->why, sizeof(f->why), "the pairs did not form again within 30 s "
				 "(logs in %s)", tmpdir);
			break;
		}
		int k = (int)(rng(&seed) % 2);
		int r = f->n % 2 == 0 ? prim[k] : (int)(rng(&seed) % 2);
		kill(f->srv[r][k], SIGKILL);
		tu_wait_child(f->srv[r][k]);
		tu_sleep_ms(300);
		f->srv[r][k] = start_replica(f->cfg_path, k, r);
		f->n++;
		f->primaries += r == prim[k];
	}
	return NULL;
}

static long env_long(const char *name, long def)
{
	const char *e = getenv(name);

	return e && *e ? strtol(e, NULL, 10) : def;
}

/* Both processes of each shard hold the same tables (checksums, rows and
 * counters), waiting (10 s) for the backup to confirm the last batches and
 * for rows that expire meanwhile, and the first primary's epochs (within
 * EPOCH_SLACK, whatever number of takeovers came between: a state
 * transfer's delay does not move them). 0, or -1 (the difference
 * printed). */
#define EPOCH_SLACK 0.02
static int pair_tables_equal(const struct ps_config *cfg, struct faults *f)
{
	for (int k = 0; k < 2; k++) {
		struct ps_shard_stats st[2];
		int same = 0;
		for (double t0 = ps_now_s(); !same && ps_now_s() - t0 < 10 * tu_time_scale();) {
			for (int r = 0; r < 2; r++) {
				struct ps_config *c = malloc(sizeof(*c));
				struct ps_client *cl = NULL;
				char err[512];
				memcpy(c, cfg, sizeof(*c));
				if (r)
					memcpy(c->shards, c->backups, sizeof(c->shards));
				memset(&st[r], 0, sizeof(st[r]));
				if (!ps_client_init(&cl, c, -1, err, sizeof(err))) {
					ps_client_stats(cl, k, &st[r]);
					ps_client_free(cl);
				}
				free(c);
			}
			same = st[0].ntables == 2 && st[1].ntables == 2 &&
			       st[0].repl_lsn == st[1].repl_lsn &&
			       st[0].param_checksum == st[1].param_checksum;
			for (int t = 0; same && t < 2; t++) {
				const struct ps_table_stats *a = &st[0].tables[t], *b = &st[1].tables[t];
				same = a->checksum == b->checksum && a->rows == b->rows &&
				       a->admitted == b->admitted && a->evicted == b->evicted &&
				       a->expired == b->expired && a->version == b->version;
			}
			if (!same && ps_now_s() - t0 >= 10 * tu_time_scale() - 0.1) {
				fprintf(stderr, "shard %d: the two processes differ: batch %llu and "
					"%llu, table cat %llu and %llu rows, probe %llu and %llu "
					"expired\n", k, (unsigned long long)st[0].repl_lsn,
					(unsigned long long)st[1].repl_lsn,
					(unsigned long long)st[0].tables[0].rows,
					(unsigned long long)st[1].tables[0].rows,
					(unsigned long long)st[0].tables[1].expired,
					(unsigned long long)st[1].tables[1].expired);
				return -1;
			}
			if (!same)
				tu_sleep_ms(50);
		}
		if (!same)
			return -1;
		for (int r = 0; r < 2; r++)
			for (int t = 0; t < 2; t++) {
				double d = fabs(st[r].tables[t].epoch_unix - f->epoch[k][t]);
				if (d > f->epoch_off)
					f->epoch_off = d;
				if (d > EPOCH_SLACK) {
					fprintf(stderr, "shard %d replica %d table %s: epoch %.6f, the "
						"first primary's %.6f (after %d faults)\n", k, r,
						st[r].tables[t].name, st[r].tables[t].epoch_unix,
						f->epoch[k][t], f->n);
					return -1;
				}
			}
	}
	return 0;
}

/* The sequence against the model while the ctr preset trains; with
 * replicas, on two pairs of processes while faults_main kills them. */
static void rules_case(int replicas)
{
	static struct model m;
	static struct ps_config cfg;
	static struct faults fl;
	char rep[256] = "";
	pthread_t fth;
	struct trainer tr = { .stop = 0, .mu = PTHREAD_MUTEX_INITIALIZER };
	struct checker k = { .m = &m, .table = "probe" };
	char yaml[2048], train[128], test[128], gen[128], err[512];
	const char *a1[] = { "bin/ps-ctrgen", "--out", train, "--samples", "40000", "--scale",
			     "0.001", "--seed", "5", NULL };
	const char *a2[] = { "bin/ps-ctrgen", "--out", test, "--samples", "2000", "--skip",
			     "40000", "--scale", "0.001", "--seed", "5", NULL };
	pid_t srv[2];
	pthread_t th;
	uint64_t before, after;
	double t0, secs;
	int rc;

	k.seed = (uint64_t)env_long("PS_TEST_SEED", 1);
	k.ops = env_long("PS_TEST_OPS", 8000);
	snprintf(train, sizeof(train), "%s/train.tsv", tmpdir);
	snprintf(test, sizeof(test), "%s/test.tsv", tmpdir);
	snprintf(gen, sizeof(gen), "%s/gen.out", tmpdir);
	ck_assert_int_eq(tu_wait_child(tu_spawn(a1, gen)), 0);
	ck_assert_int_eq(tu_wait_child(tu_spawn(a2, gen)), 0);
	memset(&m, 0, sizeof(m));
	memset(&fl, 0, sizeof(fl));
	int port[2] = { tu_free_port(), tu_free_port() };
	if (replicas) {
		for (int i = 0; i < 2; i++)
			port[i] = low_port(i);
		snprintf(rep, sizeof(rep), "  backups: [127.0.0.1:%d, 127.0.0.1:%d]\n  replicas: 1\n"
			 "replication: {timeout_ms: 500}\nlimits: {idle_timeout_ms: 1500}\n",
			 low_port(2), low_port(3));
	}
	snprintf(yaml, sizeof(yaml),
		 "cluster:\n  servers: [127.0.0.1:%d, 127.0.0.1:%d]\n  workers: 3\n%s"
		 "consistency: {mode: async, staleness: 1000000}\nseed: 5\n"
		 "model:\n  preset: ctr\n  embeddings:\n"
		 "    - {name: cat, dim: 8, lr: 0.05, admission: 2, max_rows: 6000, fields: [0, 1, "
		 "2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, "
		 "24, 25]}\n"
		 "    - {name: probe, dim: %d, init: uniform, scale: 1, optimizer: rowwise_adagrad, "
		 "lr: %g, initial_accumulator: %g, eps: %g, admission: %d, max_rows: %d, ttl: %d, "
		 "filter_ids: 65536, fields: []}\n"
		 "optimizer: {name: adam, lr: 0.001}\n"
		 "train: {batch: 256, epochs: 1000000, metrics_dir: '', train_file: '%s', test_file: '%s'}\n"
		 "log: {level: warn}\n",
		 port[0], port[1], rep, D, (double)LR, (double)ACC0, (double)EPS, ADMIT, 2 * CAP, TTL,
		 train, test);
	ck_assert_int_eq(tu_write_temp(tr.cfg, yaml), 0);
	ck_assert_msg(ps_config_load(&cfg, tr.cfg, err, sizeof(err)) == 0, "%s", err);
	/* the model: every id's shard, no rows */
	m.cfg = &cfg;
	m.t = ps_config_find_table(&cfg, "probe");
	ck_assert_int_eq(m.t, 1);
	/* with replicas, a takeover may come between a row's expiry and the
	 * new primary's first tick: 0.2 s more. The epoch stays the first
	 * primary's whatever process serves (replica_rows.c; checked at the
	 * end), so its bounds are the same. */
	m.margin = (replicas ? 0.8 : 0.6) * tu_time_scale();
	uint64_t tkey = ps_rows_table_key(&cfg.tables[m.t]);
	for (int i = 0; i < U; i++) {
		m.r[i].shard = ps_rows_shard(tkey, id_of(i), 2);
		m.r[i].prev = m.r[i].next = NIL;
	}
	m.head[0] = m.head[1] = m.tail[0] = m.tail[1] = NIL;
	fl.cfg = &cfg;
	snprintf(fl.cfg_path, sizeof(fl.cfg_path), "%s", tr.cfg);
	for (int s = 0; s < 2; s++)
		if (replicas)
			for (int r = 0; r < 2; r++)
				fl.srv[r][s] = start_replica(tr.cfg, s, r);
		else
			srv[s] = tu_start_server(tr.cfg, s);
	if (replicas) {
		int prim[2];
		ck_assert_msg(pairs_formed(&cfg, 20, prim), "the pairs did not form (logs in %s)",
			      tmpdir);
	}
	for (int i = 0; i < 100 && !k.c; i++) {
		rc = ps_client_init(&k.c, &cfg, 2, err, sizeof(err));
		if (rc && rc != -ECONNREFUSED)
			break;
		if (rc)
			tu_sleep_ms(100);
	}
	ck_assert_msg(k.c, "%s", err);
	/* each shard's epoch (its tables start at its start, after the dense
	 * tensors are set up: well under 50 ms) from its uptime */
	for (int s = 0; s < 2; s++) {
		struct ps_shard_stats st;
		double t1 = ps_now_s();
		ck_assert_int_eq(ps_client_stats(k.c, s, &st), 0);
		m.e_lo[s] = t1 - st.uptime_s;
		m.e_hi[s] = ps_now_s() - st.uptime_s + 0.05 * tu_time_scale();
		for (int t = 0; t < 2; t++)
			fl.epoch[s][t] = st.tables[t].epoch_unix;
		/* the wall clock's time of it, to read a failure's times against the logs */
		struct timespec wt;
		clock_gettime(CLOCK_REALTIME, &wt);
		time_t e = (time_t)((double)wt.tv_sec + wt.tv_nsec / 1e9 - (ps_now_s() - m.e_lo[s]));
		double frac = fmod((double)wt.tv_sec + wt.tv_nsec / 1e9 - (ps_now_s() - m.e_lo[s]), 1.0);
		struct tm tmv;
		gmtime_r(&e, &tmv);
		fprintf(stderr, "shard %d: its first epoch at %02d:%02d:%06.3f UTC\n", s, tmv.tm_hour,
			tmv.tm_min, tmv.tm_sec + frac);
	}
	/* training first, then the sequence beside it */
	ck_assert_int_eq(pthread_create(&th, NULL, train_main, &tr), 0);
	for (double dl = ps_now_s() + 120 * tu_time_scale();
	     (before = trained_pushes(k.c)) == 0 && ps_now_s() < dl && !tr.failed;)
		tu_sleep_ms(50);
	t0 = ps_now_s();
	if (replicas)
		ck_assert_int_eq(pthread_create(&fth, NULL, faults_main, &fl), 0);
	rc = before ? run_checker(&k) : -1;
	secs = ps_now_s() - t0;
	if (replicas) {
		__atomic_store_n(&fl.stop, 1, __ATOMIC_RELEASE);
		pthread_join(fth, NULL);
	}
	after = trained_pushes(k.c);
	train_stop(&tr);
	pthread_join(th, NULL);
	if (replicas) {
		/* the pairs formed again; each backup's tables as its primary's */
		int prim[2];
		ck_assert_msg(!fl.why[0], "%s", fl.why);
		ck_assert_msg(pairs_formed(&cfg, 30, prim), "the pairs did not form again (logs in "
			      "%s)", tmpdir);
		ck_assert_int_eq(pair_tables_equal(&cfg, &fl), 0);
	}
	ps_client_free(k.c);
	for (int s = 0; s < 2; s++)
		if (replicas)
			for (int r = 0; r < 2; r++)
				ck_assert_int_eq(tu_stop_server(fl.srv[r][s]), 0);
		else
			ck_assert_int_eq(tu_stop_server(srv[s]), 0);
	unlink(tr.cfg);
	ck_assert_msg(!tr.failed, "%s", tr.why);
	ck_assert_msg(before > 0, "the ctr workers pushed no rows (logs in %s)", tmpdir);
	ck_assert_msg(rc == 0, "seed %" PRIu64 ": %s", k.seed, k.why);
	fprintf(stderr, "rows model, seed %" PRIu64 ": %ld pushes and %ld pulls in %.1f s "
		"(%.0f/s), %" PRIu64 " rows read (%" PRIu64 " as initial values, %" PRIu64
		" near expiry), %" PRIu64 " admitted, %" PRIu64 "..%" PRIu64 " evicted, %" PRIu64
		" dropped in all, %" PRIu64 " slow pushes resolved; %d training rounds, %" PRIu64
		" training row pushes meanwhile\n", k.seed, k.pushes, k.pulls, secs,
		(double)(k.pushes + k.pulls) / secs, m.checked, m.init_reads, m.uncertain_reads,
		m.admitted[0] + m.admitted[1], m.evicted_sure[0] + m.evicted_sure[1],
		m.evicted[0] + m.evicted[1], m.dropped[0] + m.dropped[1], m.ambiguous, tr.rounds,
		after - before);
	/* training went on during the sequence, and it met every rule */
	ck_assert_uint_gt(after, before);
	ck_assert_uint_gt(m.evicted_sure[0] + m.evicted_sure[1], 10);
	ck_assert_uint_gt(m.dropped[0] + m.dropped[1] - m.evicted[0] - m.evicted[1], 10);
	ck_assert_uint_gt(m.init_reads, 100);
	if (replicas) {
		fprintf(stderr, "rows model across failovers: %d faults (%d primaries killed); every "
			"process's tables' epochs the first primary's within %.6f s\n", fl.n,
			fl.primaries, fl.epoch_off);
		ck_assert_int_ge(fl.primaries, 1);
	}
}

START_TEST(test_rules_under_training)
{
	rules_case(0);
}
END_TEST

/* The same rules with cluster.replicas: 1 while primaries and backups are
 * killed (kill -9) and restarted: admission, eviction and the TTL exactly
 * as the model says, whatever process served. */
START_TEST(test_rules_across_failovers)
{
	rules_case(1);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("it_rows_model");
	TCase *tc = tcase_create("model");
	int failed;

	tu_secret_setup();
	setenv("OPENBLAS_NUM_THREADS", "1", 1); /* before any thread: the workers inherit it */
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/ps-it-rows-model-XXXXXX");
	if (!mkdtemp(tmpdir)) {
		perror("mkdtemp");
		return 1;
	}
	/* a long run is as long as its operations: no deadline of Check's */
	tcase_set_timeout(tc, env_long("PS_TEST_OPS", 8000) > 100000 ? 36000 : 300);
	TU_ADD(tc, test_rules_under_training);
	TU_ADD(tc, test_rules_across_failovers);
	suite_add_tcase(s, tc);
	failed = tu_run_suite(s);
	if (failed) /* the shards' logs are what a failure is read against */
		fprintf(stderr, "it_rows_model: kept %s\n", tmpdir);
	else
		tu_rmtree(tmpdir);
	tu_secret_cleanup();
	return failed ? 1 : 0;
}
