/* check_rows.c - embedding rows without a network: the id coding (round
 * trips, every malformed input refused), deduplication, placement spread,
 * and one table driven by random pushes, reads, expiry and eviction,
 * checked after every step against a plain model of the rules (admission
 * after N sightings, cap dropping the least recently updated row, TTL,
 * re-created rows starting from their initial values and fresh state).
 * PS_ROWS_LONG=1 runs millions of operations instead of tens of thousands.
 */
#include <check.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "ckpt_format.h"
#include "config.h"
#include "ps_err.h"
#include "ps_time.h"
#include "rows.h"
#include "rows_wire.h"
#include "server.h"
#include "table.h"
#include "table_ckpt.h"
#include "test_util.h"

static uint64_t rng(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void load(struct ps_config *cfg, const char *table)
{
	char yaml[1024], err[512];

	snprintf(yaml, sizeof(yaml), "cluster: {servers: [127.0.0.1:1], workers: 1}\n"
		 "seed: 7\nmodel:\n  tensors: [{name: w, shape: [4]}]\n  embeddings:\n"
		 "    - %s\n", table);
	ck_assert_msg(ps_config_load_string(cfg, yaml, "t", err, sizeof(err)) == 0, "%s", err);
}

START_TEST(test_ids_roundtrip)
{
	uint64_t s = 1, ids[1000], back[1000];
	uint8_t buf[1000 * PS_VARINT_MAX];
	char why[200];

	for (int round = 0; round < 200; round++) {
		size_t n = rng(&s) % 1000, len;
		uint64_t v = round % 2 ? rng(&s) % 100 : 0;
		for (size_t i = 0; i < n; i++) {
			v += 1 + (round % 3 ? rng(&s) % 1000 : rng(&s) >> 12);
			ids[i] = v;
		}
		if (round == 5 && n) /* the largest id */
			ids[n - 1] = UINT64_MAX;
		len = ps_rows_ids_encode(ids, n, buf);
		ck_assert_uint_le(len, n * PS_VARINT_MAX);
		ck_assert_int_eq(ps_rows_ids_decode(buf, len, n, back, why, sizeof(why)), 0);
		ck_assert_int_eq(memcmp(ids, back, n * 8), 0);
		/* every shorter input is refused, and so is one byte more */
		if (n) {
			ck_assert_int_eq(ps_rows_ids_decode(buf, len - 1, n, back, why, sizeof(why)),
					 PS_EPROTO);
			buf[len] = 1;
			ck_assert_int_eq(ps_rows_ids_decode(buf, len + 1, n, back, why, sizeof(why)),
					 PS_EPROTO);
		}
	}
}
END_TEST

START_TEST(test_ids_malformed)
{
	uint64_t out[4];
	char why[200];
	const uint8_t rep[] = { 3, 0 };                     /* a repeated id */
	const uint8_t longv[] = { 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 1 };
	const uint8_t over[] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2 };
	const uint8_t wrap[] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1, 1 };

	ck_assert_int_eq(ps_rows_ids_decode(rep, 2, 2, out, why, sizeof(why)), PS_EPROTO);
	ck_assert_ptr_nonnull(strstr(why, "sorted and unique"));
	ck_assert_int_eq(ps_rows_ids_decode(longv, sizeof(longv), 1, out, why, sizeof(why)), PS_EPROTO);
	ck_assert_int_eq(ps_rows_ids_decode(over, sizeof(over), 1, out, why, sizeof(why)), PS_EPROTO);
	ck_assert_ptr_nonnull(strstr(why, "2^64"));
	ck_assert_int_eq(ps_rows_ids_decode(wrap, sizeof(wrap), 2, out, why, sizeof(why)), PS_EPROTO);
	ck_assert_int_eq(ps_rows_ids_decode(wrap, 10, 1, out, why, sizeof(why)), 0);
	ck_assert_uint_eq(out[0], UINT64_MAX);
	/* 5 written in two bytes: refused, so an id list has one spelling
	 * (found by tests/fuzz/fuzz_rows.c) */
	const uint8_t pad[] = { 0x85, 0x00 };
	ck_assert_int_eq(ps_rows_ids_decode(pad, 2, 1, out, why, sizeof(why)), PS_EPROTO);
	ck_assert_ptr_nonnull(strstr(why, "padded"));
	ck_assert_int_eq(ps_rows_ids_decode(wrap, 10, 1, out, why, sizeof(why)), 0);
	ck_assert_uint_eq(out[0], UINT64_MAX);
	ck_assert_int_eq(ps_rows_ids_decode(NULL, 0, 0, out, why, sizeof(why)), 0);
}
END_TEST

START_TEST(test_dedup_and_spread)
{
	uint64_t ids[] = { 9, 3, 9, 1ull << 63, 3, 0 }, *u;
	uint32_t where[6];
	size_t n;
	struct ps_config cfg;
	uint64_t load4[4] = { 0 }, s = 3;

	ck_assert_int_eq(ps_rows_dedup(ids, 6, &u, &n, where), 0);
	ck_assert_uint_eq(n, 4);
	for (int i = 0; i < 6; i++)
		ck_assert_uint_eq(u[where[i]], ids[i]);
	for (size_t i = 1; i < n; i++)
		ck_assert_uint_lt(u[i - 1], u[i]);
	free(u);
	/* consecutive ids and random ids spread evenly over 4 shards */
	load(&cfg, "{name: e, dim: 4}");
	uint64_t key = ps_rows_table_key(&cfg.tables[0]);
	for (uint64_t i = 0; i < 400000; i++)
		load4[ps_rows_shard(key, i < 200000 ? i : rng(&s), 4)]++;
	for (int k = 0; k < 4; k++)
		ck_assert_msg(load4[k] > 99000 && load4[k] < 101000, "shard %d: %" PRIu64, k,
			      load4[k]);
	/* initial values: deterministic, different per id and table */
	float a[4], b[4];
	ps_rows_init(&cfg, 0, 5, a);
	ps_rows_init(&cfg, 0, 5, b);
	ck_assert_int_eq(memcmp(a, b, sizeof(a)), 0);
	ps_rows_init(&cfg, 0, 6, b);
	ck_assert_int_ne(memcmp(a, b, sizeof(a)), 0);
	/* every element its own draw: over 4,000 ids each of the 8 positions
	 * spreads as its distribution does (uniform in (-0.5, 0.5): mean 0,
	 * variance 1/12; normal with scale 2: mean 0, variance 4), and no two
	 * positions of a row move together */
	for (int kind = 0; kind < 2; kind++) {
		enum { D = 8, NID = 4000 };
		static float v[NID][D];
		double var = kind ? 4.0 : 1.0 / 12;
		load(&cfg, kind ? "{name: n, dim: 8, init: normal, scale: 2}"
				: "{name: u, dim: 8, init: uniform, scale: 0.5}");
		for (int i = 0; i < NID; i++)
			ps_rows_init(&cfg, 0, (uint64_t)i * 7 + 1, v[i]);
		for (int j = 0; j < D; j++) {
			double m = 0, q = 0, c = 0;
			for (int i = 0; i < NID; i++) {
				ck_assert_msg(kind || (v[i][j] > -0.5f && v[i][j] < 0.5f), "uniform row %d "
					      "[%d] = %g", i, j, (double)v[i][j]);
				m += v[i][j];
				q += (double)v[i][j] * v[i][j];
				c += (double)v[i][j] * v[i][(j + 1) % D];
			}
			m /= NID;
			q = q / NID - m * m;
			c /= NID;
			ck_assert_msg(fabs(m) < 4 * sqrt(var / NID) && fabs(q / var - 1) < 0.1 &&
				      fabs(c / var) < 0.1, "%s init, position %d over %d ids: mean %g, "
				      "variance %g (%g due), covariance with the next %g",
				      kind ? "normal" : "uniform", j, NID, m, q, var, c);
		}
	}
}
END_TEST

/* splitmix64's finaliser, as the initial values are specified (a copy:
 * the test derives each element's draw itself). */
static uint64_t spec_mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* The draws of initial values are uniform in the open (0, 1): an element
 * whose 24 bits are all 0 (or all 1) lies half a step inside the ends.
 * Found by search (about one element in 16 million), element j of id's row
 * draws the top 24 bits of mix64(base + j), base = mix64(seed ^
 * mix64(table key ^ mix64(id))): uniform gives (2u - 1) scale exactly,
 * never -scale or +scale, and normal a finite value (log 0 would not be). */
START_TEST(test_init_draws_open)
{
	enum { D = 64 };
	struct ps_config cu, cn;
	float row[D];
	int found[2] = { 0, 0 };

	load(&cu, "{name: u, dim: 64, init: uniform, scale: 0.5}");
	load(&cn, "{name: u, dim: 64, init: normal, scale: 0.5}");
	uint64_t key = ps_rows_table_key(&cu.tables[0]);
	for (uint64_t id = 1; id < (UINT64_C(1) << 23) && !(found[0] && found[1]); id++) {
		uint64_t base = spec_mix64(cu.seed ^ spec_mix64(key ^ spec_mix64(id)));
		for (int j = 0; j < D; j++) {
			uint64_t top = spec_mix64(base + (uint64_t)j) >> 40;
			if (top != 0 && top != 0xffffff)
				continue;
			int hi = top != 0;
			double u = ((double)top + 0.5) / 16777216.0;
			float want = (float)((2.0 * u - 1.0) * 0.5);
			ps_rows_init(&cu, 0, id, row);
			ck_assert_msg(row[j] == want && row[j] > -0.5f && row[j] < 0.5f, "id %" PRIu64
				      " [%d] (draw %s): %.9g, %.9g due", id, j, hi ? "all 1" : "all 0",
				      (double)row[j], (double)want);
			ps_rows_init(&cn, 0, id, row);
			ck_assert_msg(isfinite(row[j]), "normal init, id %" PRIu64 " [%d]: %g", id, j,
				      (double)row[j]);
			found[hi] = 1;
		}
	}
	ck_assert_msg(found[0] && found[1], "no element draws 24 bits of 0 and of 1 among 8 "
		      "million ids");
}
END_TEST

/* ---- the table against a model ---- */

struct mrow {
	int exists;
	int count;          /* sightings while it has no row */
	uint64_t order;     /* last update, as a sequence number */
	uint32_t stamp;     /* last update, seconds since the epoch */
	float vals[64];
};

static void model_drop(struct mrow *m)
{
	m->exists = 0;
	m->count = 0;
}

START_TEST(test_table_model)
{
	const int U = _i ? 5000 : 300, cap = _i ? 400 : 60, need = 3;
	const int ttl = _i ? 30 : 20;
	long ops = getenv("PS_ROWS_LONG") ? 3000000 : 40000;
	struct ps_config cfg;
	struct ps_table tb;
	char def[256];
	uint64_t s = 11 + (uint64_t)_i, seq = 0, evicted = 0, expired = 0, admitted = 0;
	double now = 1000.0, epoch = now;
	struct mrow *m = calloc((size_t)U, sizeof(*m));
	float g[16], got[16];
	int nrows = 0;

	snprintf(def, sizeof(def), "{name: e, dim: 8, init: uniform, scale: 1, optimizer: %s, "
		 "admission: %d, ttl: %d, max_rows: %d, filter_ids: 1048576}",
		 _i ? "adam" : "rowwise_adagrad", need, ttl, cap);
	load(&cfg, def);
	ck_assert_int_eq(ps_table_init(&tb, &cfg, 0, 1, epoch), 0);
	int rf = tb.row_floats;
	for (long op = 0; op < ops; op++) {
		unsigned r = (unsigned)(rng(&s) % 100);
		/* skewed ids: half the pushes go to a tenth of them */
		size_t u = rng(&s) % 2 ? rng(&s) % (size_t)(U / 10) : rng(&s) % (size_t)U;
		uint64_t id = (uint64_t)u * 0x9e3779b97f4a7c15ull + 1;
		uint32_t st;

		now += (double)(rng(&s) % 1000) / (_i ? 40000.0 : 4000.0);
		st = (uint32_t)(now - epoch);
		if (r < 60) {
			int k = 1 + (int)(rng(&s) % 2), rc;
			for (int j = 0; j < 8; j++)
				g[j] = (float)((int)(rng(&s) % 7) - 3);
			rc = ps_table_push(&tb, id, g, k, now);
			if (!m[u].exists) {
				m[u].count += k;
				if (m[u].count < need) {
					ck_assert_int_eq(rc, 0);
					ck_assert_int_eq(ps_admit_count(&tb.admit, id), m[u].count);
					continue;
				}
				if (nrows == cap) { /* drop the least recently updated */
					size_t old = 0;
					uint64_t best = UINT64_MAX;
					for (size_t v = 0; v < (size_t)U; v++)
						if (m[v].exists && m[v].order < best) {
							best = m[v].order;
							old = v;
						}
					model_drop(&m[old]);
					nrows--;
					evicted++;
				}
				m[u].exists = 1;
				m[u].count = 0;
				nrows++;
				admitted++;
				ps_table_row_reset(&tb, id, m[u].vals);
			}
			ck_assert_int_eq(rc, 1);
			ps_row_optim_apply(tb.tc, m[u].vals, g);
			m[u].order = ++seq;
			m[u].stamp = st;
		} else if (r < 95) {
			float want[8];
			ps_table_read(&tb, id, got);
			if (m[u].exists)
				memcpy(want, m[u].vals, sizeof(want));
			else
				ps_rows_init(&cfg, 0, id, want);
			ck_assert_msg(memcmp(got, want, sizeof(want)) == 0, "op %ld: id %zu reads %g, "
				      "model %g", op, u, got[0], want[0]);
		} else {
			ps_table_expire(&tb, now);
			for (size_t v = 0; v < (size_t)U; v++)
				if (m[v].exists && m[v].stamp + (uint32_t)ttl <= st) {
					model_drop(&m[v]);
					nrows--;
					expired++;
				}
		}
		ck_assert_uint_eq(tb.nrows, (uint64_t)nrows);
		ck_assert_uint_eq(tb.c.evicted, evicted);
		ck_assert_uint_eq(tb.c.expired, expired);
		ck_assert_uint_eq(tb.c.admitted, admitted);
		if (op % 997 == 0)
			for (size_t v = 0; v < (size_t)U; v++) {
				uint64_t vid = (uint64_t)v * 0x9e3779b97f4a7c15ull + 1;
				uint32_t row = ps_table_find(&tb, vid);
				ck_assert_int_eq(row != PS_ROW_NIL, m[v].exists);
				if (m[v].exists)
					ck_assert_int_eq(memcmp(ps_table_vals(&tb, row), m[v].vals,
								sizeof(float) * (size_t)rf), 0);
				else
					ck_assert_int_eq(ps_admit_count(&tb.admit, vid), m[v].count);
			}
	}
	/* the run was long enough to exercise every rule */
	ck_assert_uint_gt(evicted, 10);
	ck_assert_uint_gt(expired, 10);
	ck_assert_uint_eq(tb.admit.decays, 0);
	ps_table_free(&tb);
	free(m);
}
END_TEST

/* A filter that is full halves its counts instead of growing. */
START_TEST(test_filter_decay_bounded)
{
	struct ps_admit a;
	uint64_t bytes;

	ck_assert_int_eq(ps_admit_init(&a, 1024, 99), 0);
	bytes = ps_admit_bytes(&a);
	ck_assert_uint_eq(bytes, 1024 * 4);
	for (int i = 0; i < 100; i++)
		ck_assert_int_eq(ps_admit_sight(&a, 7, 1, 255), 0);
	ck_assert_int_eq(ps_admit_count(&a, 7), 100);
	/* new ids until the first decay: it comes before the slots run out */
	uint64_t id = 1000;
	while (!a.decays) {
		ck_assert_int_eq(ps_admit_sight(&a, id++, 1, 255), 0);
		ck_assert_uint_le(a.used, 1024);
	}
	ck_assert_uint_gt(id - 1000, 512);
	/* every count halved: ids seen once are gone, the frequent one kept half */
	ck_assert_int_eq(ps_admit_count(&a, 7), 50);
	ck_assert_int_eq(ps_admit_count(&a, 1000), 0);
	ck_assert_uint_le(a.used, 2);
	/* many more ids: the memory never grows */
	for (; id < 100000; id++)
		ck_assert_int_eq(ps_admit_sight(&a, id, 1, 255), 0);
	ck_assert_uint_le(a.used, 1024);
	ck_assert_uint_eq(ps_admit_bytes(&a), bytes);
	/* reaching the threshold admits and forgets the id */
	ck_assert_int_eq(ps_admit_sight(&a, 7, 255, 255), 1);
	ck_assert_int_eq(ps_admit_count(&a, 7), 0);
	ps_admit_free(&a);
}
END_TEST

/* The filter's placement is part of the checkpoint's format (its slots are
 * written as they are and read back by position, by the shard and by
 * ps-export): an id's fingerprint (bits 40..63, never 0) and first bucket
 * (the low bits) come from SplitMix64's output for it (salt 0). The
 * expected values are SplitMix64's published test vector (seed 1234567:
 * 6457827717110365317, 3203168211198807973, 9817491932198370423), not the
 * code's own, so a changed mixer reads as a changed format. */
START_TEST(test_filter_placement)
{
	static const uint64_t golden = 0x9e3779b97f4a7c15ull;
	static const uint64_t out[3] = { 6457827717110365317ull, 3203168211198807973ull,
					 9817491932198370423ull };
	struct ps_admit a;
	uint64_t id = 1234567;

	ck_assert_int_eq(ps_admit_init(&a, 1 << 16, 0), 0);
	ck_assert_uint_eq(a.nbuckets, 8192);
	for (int i = 0; i < 3; i++, id += golden) {
		uint64_t b1 = out[i] & (a.nbuckets - 1);
		uint32_t fp = (uint32_t)(out[i] >> 40) ? (uint32_t)(out[i] >> 40) : 1;
		ck_assert_int_eq(ps_admit_sight(&a, id, 3, 255), 0);
		ck_assert_msg(a.slots[b1 * 8] == (fp << 8 | 3), "id %" PRIu64 ": bucket %" PRIu64
			      " slot 0 holds %08x, expected %08x", id, b1, a.slots[b1 * 8],
			      fp << 8 | 3);
	}
	ck_assert_uint_eq(a.used, 3);
	ps_admit_free(&a);
}
END_TEST

/* ps_admit_merge (a re-shard gathering old shards' filters): every id of
 * two filters keeps its count in the merged one; the same ids from a third
 * add their counts (at most 255); a filter of another size is refused;
 * merging more than a filter holds halves its counts (none grows, the
 * slots never exceed the filter). */
START_TEST(test_filter_merge)
{
	struct ps_admit a, b, c, small;

	ck_assert_int_eq(ps_admit_init(&a, 4096, 5), 0);
	ck_assert_int_eq(ps_admit_init(&b, 4096, 5), 0);
	ck_assert_int_eq(ps_admit_init(&small, 64, 5), 0);
	for (uint64_t id = 0; id < 600; id++)
		ck_assert_int_eq(ps_admit_sight(id % 2 ? &a : &b, id, 1 + (int)(id % 7), 100), 0);
	ck_assert_int_eq(ps_admit_merge(&a, &b), 0);
	for (uint64_t id = 0; id < 600; id++)
		ck_assert_msg(ps_admit_count(&a, id) == 1 + (int)(id % 7), "id %" PRIu64 ": %d", id,
			      ps_admit_count(&a, id));
	ck_assert_uint_eq(a.used, 600);
	ck_assert_int_eq(ps_admit_merge(&small, &b), -EINVAL);
	ck_assert_int_eq(ps_admit_init(&c, 4096, 5), 0);
	for (uint64_t id = 0; id < 600; id++)
		ck_assert_int_eq(ps_admit_sight(&c, id, 200, 255), 0);
	ck_assert_int_eq(ps_admit_merge(&a, &c), 0);
	for (uint64_t id = 0; id < 600; id++)
		ck_assert_int_eq(ps_admit_count(&a, id), 200 + 1 + (int)(id % 7) > 255 ? 255
							: 200 + 1 + (int)(id % 7));
	ck_assert_uint_eq(a.used, 600);
	ps_admit_free(&a);
	ps_admit_free(&b);
	ps_admit_free(&c);
	/* two filters of 64 slots, 24 ids each of count 100, then as many as
	 * fit without a halving: together more than 64, the merge halves */
	ck_assert_int_eq(ps_admit_init(&a, 64, 5), 0);
	ck_assert_int_eq(ps_admit_init(&b, 64, 5), 0);
	for (uint64_t id = 0; id < 24; id++) {
		ps_admit_sight(&a, id, 100, 255);
		ps_admit_sight(&b, 1000 + id, 100, 255);
	}
	ck_assert_uint_eq(a.decays + b.decays, 0);
	ck_assert_uint_gt(a.used + b.used, 40);
	uint64_t used = a.used + b.used;
	for (uint64_t id = 2000; a.used + b.used <= 64; id++) {
		struct ps_admit *f = id % 2 ? &a : &b;
		ps_admit_sight(f, id, 100, 255);
		ck_assert_uint_eq(f->decays, 0); /* else rerun with another salt */
		used = a.used + b.used;
	}
	ck_assert_uint_gt(used, 64);
	ck_assert_int_eq(ps_admit_merge(&a, &b), 0);
	ck_assert_uint_gt(a.decays, 0);
	ck_assert_uint_le(a.used, 64);
	for (uint64_t id = 0; id < 24; id++) {
		ck_assert_int_le(ps_admit_count(&a, id), 100);
		ck_assert_int_le(ps_admit_count(&a, 1000 + id), 100);
	}
	ps_admit_free(&a);
	ps_admit_free(&b);
	ps_admit_free(&small);
}
END_TEST

/* ps_table_checksum (what a primary and its backup, or a restart, are
 * compared by) covers every row: two tables of the same ids, row count
 * and version differ in it when one float of one row differs, or when
 * the recency order differs; the same updates give the same checksum. And
 * the merge of admission filters where a table has none (the offline
 * re-shard of a table without admission) is no error. */
START_TEST(test_checksum_covers_rows)
{
	struct ps_config cfg;
	struct ps_table a, b;
	float g[4] = { 1, 2, 3, 4 }, h[4] = { 1, 2, 3, 4.5f };
	struct ps_admit none, none2;

	load(&cfg, "{name: e, dim: 4, init: zeros, optimizer: sgd, lr: 1}");
	ck_assert_int_eq(ps_table_init(&a, &cfg, 0, 1, 0.0), 0);
	ck_assert_int_eq(ps_table_init(&b, &cfg, 0, 1, 0.0), 0);
	for (uint64_t id = 1; id <= 5; id++) {
		ck_assert_int_eq(ps_table_push(&a, id, g, 1, 1.0), 1);
		ck_assert_int_eq(ps_table_push(&b, id, id == 5 ? h : g, 1, 1.0), 1);
	}
	ck_assert_uint_eq(a.nrows, b.nrows);
	ck_assert_msg(ps_table_checksum(&a) != ps_table_checksum(&b), "the checksum does not see "
		      "one float of the newest row");
	ck_assert_int_eq(ps_table_push(&b, 5, g, 1, 1.0), 1); /* b's row 5: g + h */
	ck_assert_int_eq(ps_table_push(&a, 5, h, 1, 1.0), 1); /* a's row 5: g + h */
	ck_assert_uint_eq(ps_table_checksum(&a), ps_table_checksum(&b));
	ck_assert_int_eq(ps_table_push(&a, 1, g, 1, 1.0), 1); /* both: row 1 updated again, */
	ck_assert_int_eq(ps_table_push(&b, 2, g, 1, 1.0), 1); /* a row 1 newest, b row 2 */
	ck_assert_int_eq(ps_table_push(&a, 2, g, 1, 1.0), 1);
	ck_assert_int_eq(ps_table_push(&b, 1, g, 1, 1.0), 1);
	ck_assert_msg(ps_table_checksum(&a) != ps_table_checksum(&b), "the checksum does not see "
		      "the recency order");
	ps_table_free(&a);
	ps_table_free(&b);
	memset(&none, 0, sizeof(none));
	memset(&none2, 0, sizeof(none2));
	ck_assert_int_eq(ps_admit_merge(&none, &none2), 0);
	ck_assert_int_eq(ps_admit_init(&none2, 64, 5), 0);
	ck_assert_int_eq(ps_admit_merge(&none, &none2), 0);
	ps_admit_free(&none2);
}
END_TEST

/* The bulk loader a restore and a re-shard fill a table with: each id
 * inserted once gets a row, an id given again is a duplicate (no second
 * row), and the bitmap of the ids seen is read and written only inside
 * its allocation (a mask past it writes beyond the buffer, which the
 * sanitizer build, san:check_rows, reports). */
START_TEST(test_bulk_insert)
{
	struct ps_config cfg;
	struct ps_table tb;
	struct ps_table_bulk bulk = { 0 };
	const uint64_t n = 20000, mul = UINT64_C(0x9e3779b97f4a7c15);
	int dup;

	load(&cfg, "{name: e, dim: 4, init: zeros}");
	ck_assert_int_eq(ps_table_init(&tb, &cfg, 0, 1, 0.0), 0);
	ck_assert_int_eq(ps_table_bulk_begin(&tb, &bulk, n), 0);
	for (uint64_t i = 0; i < n; i++) {
		ck_assert_uint_ne(ps_table_bulk_insert(&tb, &bulk, i * mul, 0, &dup), PS_ROW_NIL);
		ck_assert_int_eq(dup, 0);
	}
	for (uint64_t i = 0; i < n; i += 7) {
		ck_assert_uint_eq(ps_table_bulk_insert(&tb, &bulk, i * mul, 0, &dup), PS_ROW_NIL);
		ck_assert_int_eq(dup, 1);
	}
	ps_table_bulk_end(&bulk);
	ck_assert_uint_eq(tb.nrows, n);
	for (uint64_t i = 0; i < n; i++)
		ck_assert_uint_ne(ps_table_find(&tb, i * mul), PS_ROW_NIL);
	ps_table_free(&tb);
}
END_TEST

/* The row cap never reaches PS_ROW_NIL, the row number that means "no
 * row": a memory budget of PS_ROW_NIL rows gives PS_ROW_NIL - 1, the bound
 * max_rows' share gets too; a budget under it is kept as it is. */
START_TEST(test_cap_below_nil)
{
	struct ps_config cfg;
	struct ps_table tb;
	uint64_t cost;

	load(&cfg, "{name: e, dim: 4, init: zeros}");
	ck_assert_int_eq(ps_table_init(&tb, &cfg, 0, 1, 0.0), 0);
	cost = ps_table_row_cost(&tb);
	cfg.limits.max_table_bytes = cost * PS_ROW_NIL;
	ps_table_set_cap(&tb, &cfg, 1);
	ck_assert_uint_eq(tb.budget_rows, PS_ROW_NIL - 1);
	ck_assert_uint_eq(tb.cap, PS_ROW_NIL - 1);
	cfg.limits.max_table_bytes = cost * (PS_ROW_NIL - 2);
	ps_table_set_cap(&tb, &cfg, 1);
	ck_assert_uint_eq(tb.cap, PS_ROW_NIL - 2);
	ps_table_free(&tb);
}
END_TEST

/* A row stamped after the table's clock reads now: a backup applies its
 * primary's stamps, and its own clock, set from the primary's at the
 * snapshot, runs behind it by the snapshot's transfer. A checkpoint, full
 * or incremental, gives that row age 0, not the 136 years an unsigned
 * difference makes of it (a restart would take it for the oldest row and
 * expire it first); a row stamped 50 s ago has age 50. */
START_TEST(test_ckpt_age_of_row_ahead)
{
	struct ps_config cfg;
	struct ps_server s;
	struct ps_srv_rows rows;
	struct ps_srv_table st;
	const float g[4] = { 1, 2, 3, 4 };
	uint8_t *b;
	size_t n;

	load(&cfg, "{name: e, dim: 4, init: zeros}");
	memset(&s, 0, sizeof(s));
	memset(&rows, 0, sizeof(rows));
	memset(&st, 0, sizeof(st));
	/* the table's clock reads 100 s */
	ck_assert_int_eq(ps_table_init(&st.tb, &cfg, 0, 1, ps_now_s() - 100.0), 0);
	rows.ntables = 1;
	rows.t = &st;
	s.cfg = &cfg;
	s.rows = &rows;
	ck_assert_int_eq(ps_table_push_at(&st.tb, 11, g, 1, 50), 1);
	ck_assert_int_eq(ps_table_push_at(&st.tb, 22, g, 1, 105), 1); /* 5 s ahead */
	for (int delta = 0; delta < 2; delta++) {
		const uint8_t *p;
		struct ckpt_table ct;
		n = delta ? ps__rows_delta_size(&s) : ps__rows_ckpt_size(&s);
		b = malloc(n);
		ck_assert_ptr_nonnull(b);
		if (delta)
			ps__rows_delta_snapshot(&s, b, 1, 0, 0);
		else
			ps__rows_ckpt_snapshot(&s, b);
		p = b + (delta ? sizeof(struct ckpt_delta_head) : 0);
		memcpy(&ct, p, sizeof(ct));
		ck_assert_uint_eq(ct.nrows, 2);
		p += sizeof(ct);
		for (int i = 0; i < 2; i++) { /* least recently updated first */
			struct ckpt_row cr;
			memcpy(&cr, p + i * (sizeof(cr) + sizeof(float) * (size_t)st.tb.row_floats),
			       sizeof(cr));
			ck_assert_uint_eq(cr.id, i ? 22 : 11);
			if (i)
				ck_assert_msg(cr.age == 0, "%s checkpoint: a row stamped 5 s ahead of "
					      "the table's clock has age %u, 0 expected",
					      delta ? "an incremental" : "a full", cr.age);
			else
				ck_assert_msg(cr.age >= 50 && cr.age <= 52, "%s checkpoint: a row "
					      "stamped 50 s ago has age %u", delta ? "an incremental"
					      : "a full", cr.age);
		}
		free(b);
	}
	ps_table_free(&st.tb);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("rows");
	TCase *tc = tcase_create("rows");
	int failed;

	tcase_set_timeout(tc, getenv("PS_ROWS_LONG") ? 3600 : 60);
	TU_ADD(tc, test_ids_roundtrip);
	TU_ADD(tc, test_ids_malformed);
	TU_ADD(tc, test_dedup_and_spread);
	TU_ADD(tc, test_init_draws_open);
	TU_ADD_LOOP(tc, test_table_model, 0, 2);
	TU_ADD(tc, test_filter_decay_bounded);
	TU_ADD(tc, test_filter_merge);
	TU_ADD(tc, test_filter_placement);
	TU_ADD(tc, test_checksum_covers_rows);
	TU_ADD(tc, test_cap_below_nil);
	TU_ADD(tc, test_bulk_insert);
	TU_ADD(tc, test_ckpt_age_of_row_ahead);
	suite_add_tcase(s, tc);
	failed = tu_run_suite(s);
	return failed ? 1 : 0;
}
