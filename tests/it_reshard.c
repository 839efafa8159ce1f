/* it_reshard.c - re-sharding by restart (docs/elastic.md) with real
 * processes: shards of one shard count stop with their checkpoints, and
 * shards of another count start from them (ps-server --reshard-from).
 *
 *  - sync training, integer gradients, momentum and an adagrad table:
 *    2 shards for 4 clocks, 3 for 3, 2 again for 3 gives dense weights and
 *    rows bit-identical to 10 clocks on 2 shards without a re-shard;
 *  - rows after 2 -> 3, read from the checkpoints the old and the new
 *    shards wrote: every row on the shard its hash names, its weights and
 *    optimizer state bit for bit, the rows of each old shard in the same
 *    recency order, ages never rising toward the newest; ids pushed once
 *    (admission 2) keep their count in the new owner's filter, and their
 *    second push after the re-shard creates their rows;
 *  - refusals, with no checkpoint of the new map written: an old shard's
 *    file missing, files of different clocks, another model, the old
 *    files in checkpoint.dir itself; the old placement's checkpoint
 *    without --reshard-from is refused with how to re-place it;
 *  - tensors declared by the worker, and a chain of incremental
 *    checkpoints (full, two deltas, the shards then killed): 3 shards take
 *    the declared tensors and the chain's last state;
 *  - checkpoints written as a build before re-sharding placed slices and
 *    rows (greedy, multiply-shift; made here byte by byte) load by
 *    re-placing, on 2 shards and on 3, every weight and row as written;
 *    ps-export reads them; a client whose Hello carries placement 0's map
 *    hash is refused, told to run a client of this build.
 */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <time.h>
#include <zlib.h>
#include "ckpt_format.h"
#include "config.h"
#include "config_agree.h"
#include "msg.h"
#include "ps_client.h"
#include "ps_err.h"
#include "rows_wire.h"
#include "shardmap.h"
#include "table.h"
#define RESHARD_TMPDIR "/tmp/ps-reshard-XXXXXX"
#include "test_reshard.h"
#include "test_util.h"
#include "wire.h"

#define NA 3000
#define NB 1000
#define DIM 4
#define NIDS 300

/* Tensors declared by the workers (a config without a model) and
 * incremental checkpoints: write_cfg's model section and checkpoint keys. */
static int declared;
/* security.auth off (a raw Hello reads the refusal's reason at once) */
static int noauth;

/* The config of an n-shard cluster (fresh ports) at path; nb: tensor b's
 * size (another model when not NB). */
static void write_cfg(int n, int nb)
{
	char yaml[2048], servers[256] = "";

	for (int k = 0, o = 0; k < n; k++)
		o += snprintf(servers + o, sizeof(servers) - (size_t)o, "%s127.0.0.1:%d", k ? ", " : "",
			      tu_free_port());
	char tensors[200] = "";

	if (!declared)
		snprintf(tensors, sizeof(tensors), "  tensors:\n    - {name: a, shape: [%d], init: "
			 "arange}\n    - {name: b, shape: [%d], init: arange}\n", NA, nb);
	snprintf(yaml, sizeof(yaml),
		 "cluster:\n  servers: [%s]\n  workers: 1\n"
		 "slice_bytes: 1024\nseed: 5\n"
		 "optimizer:\n  name: momentum\n  lr: 0.5\n  momentum: 0.9\n"
		 "model:\n%s"
		 "  embeddings:\n    - {name: e, dim: %d, init: uniform, scale: 0.5, "
		 "optimizer: adagrad, lr: 0.25, admission: 2}\n"
		 "checkpoint:\n  dir: %s\n  every_s: 0\n%s"
		 "%slog:\n  level: warn\n", servers, tensors, DIM, ck, declared ?
		 "  incremental: 5\n  on_request: true\n  min_interval_s: 0\n" : "",
		 noauth ? "security:\n  auth: false\n" : "");
	write_config(yaml);
}

/* Shard k of the config at path; with old (a folder) re-sharding from
 * old_n shards' checkpoints there. log: its output (NULL: dir/shard-K.log). */
static pid_t start_shard(int k, const char *old, int old_n, const char *log)
{
	char s[16], n[16], def[128];
	const char *argv[] = { "bin/ps-server", "--config", path, "--shard", s, "--log-level",
			       "info", old ? "--reshard-from" : NULL, old, "--reshard-shards", n,
			       NULL };

	snprintf(s, sizeof(s), "%d", k);
	snprintf(n, sizeof(n), "%d", old_n);
	snprintf(def, sizeof(def), "%s/shard-%d.log", dir, k);
	return tu_spawn(argv, log ? log : def);
}

static uint64_t id_of(int i)
{
	return (uint64_t)i * 7919u + 11;
}

/* Clocks [from, to): integer dense gradients; the rows of ids 0..NIDS-1
 * pushed at clocks 0 and 1 (admitted at the second), of the first half of
 * them from clock 2 on, and at clock 1 ids NIDS..NIDS+49 once (counted,
 * not admitted). Then pulls the dense
 * weights into wa, wb and the rows into rows. */
static void train(struct ps_client *c, uint64_t from, uint64_t to, float *wa, float *wb,
		  float *rows)
{
	static float ga[NA], gb[NB], gr[(NIDS + 50) * DIM];
	static uint64_t ids[NIDS + 50];
	struct ps_tensor tg[2] = { { .name = "a", .data = ga, .count = NA },
				   { .name = "b", .data = gb, .count = NB } };
	struct ps_tensor tw[2] = { { .name = "a", .data = wa, .count = NA },
				   { .name = "b", .data = wb, .count = NB } };

	for (int i = 0; i < NIDS + 50; i++)
		ids[i] = id_of(i);
	for (uint64_t k = from; k < to; k++) {
		int n = k == 1 ? NIDS + 50 : k >= 2 ? NIDS / 2 : NIDS;
		for (int i = 0; i < NA; i++)
			ga[i] = (float)((int)((i + k) % 7) - 3);
		for (int i = 0; i < NB; i++)
			gb[i] = (float)((int)((i * 3 + k) % 5) - 2);
		for (int i = 0; i < n * DIM; i++)
			gr[i] = (float)((int)((i + k) % 3) - 1);
		ck_assert_msg(ps_client_push_rows(c, "e", k, ids, (size_t)n, gr, 0) == 0,
			      "push_rows %" PRIu64 ": %s", k, ps_client_error(c));
		int64_t p = ps_client_push(c, k, tg, 2, PS_PUSH_END_CLOCK);
		ck_assert_msg(p > 0 && ps_client_wait(c, p) == 0, "push %" PRIu64 ": %s", k,
			      ps_client_error(c));
	}
	int64_t q = ps_client_pull(c, to, tw, 2);
	ck_assert_msg(q > 0 && ps_client_wait(c, q) == 0, "pull: %s", ps_client_error(c));
	ck_assert_msg(ps_client_pull_rows(c, "e", to, ids, NIDS + 50, rows) == 0, "pull_rows: %s",
		      ps_client_error(c));
}

static void stop_all(pid_t *srv, int n)
{
	for (int k = 0; k < n; k++)
		ck_assert_int_eq(tu_stop_server(srv[k]), 0);
}

/* Moves the n shards' checkpoints of ck into the fresh folder ck/name
 * (the old checkpoints' own folder, as ps-local.sh reshard makes it). */
static void move_old(const char *name, int n, char *to, size_t len)
{
	char a[256], b[300];

	snprintf(to, len, "%s/%s", ck, name);
	ck_assert_int_eq(mkdir(to, 0700), 0);
	for (int k = 0; k < n; k++) {
		snprintf(a, sizeof(a), "%s/shard-%d.ckpt", ck, k);
		snprintf(b, sizeof(b), "%s/shard-%d.ckpt", to, k);
		ck_assert_msg(rename(a, b) == 0, "%s: %s", a, strerror(errno));
	}
}

START_TEST(test_sync_2_3_2_bit_identical)
{
	static float ra[NA], rb[NB], rr[(NIDS + 50) * DIM];
	static float wa[NA], wb[NB], wr[(NIDS + 50) * DIM];
	char old1[200], old2[200], log[200], marker[300];
	pid_t srv[3];
	struct ps_client *c;

	setup_dirs();
	/* the reference: 10 clocks on 2 shards */
	write_cfg(2, NB);
	for (int k = 0; k < 2; k++)
		srv[k] = start_shard(k, NULL, 0, NULL);
	c = connect_retry(0);
	train(c, 0, 10, ra, rb, rr);
	ps_client_free(c);
	stop_all(srv, 2);
	ck_assert_int_eq(tu_rmtree(ck), 0);
	ck_assert_int_eq(mkdir(ck, 0700), 0);

	/* 4 clocks on 2, 3 on 3, 3 on 2 */
	for (int k = 0; k < 2; k++)
		srv[k] = start_shard(k, NULL, 0, NULL);
	c = connect_retry(0);
	train(c, 0, 4, wa, wb, wr);
	ps_client_free(c);
	stop_all(srv, 2);
	move_old("from2", 2, old1, sizeof(old1));
	write_cfg(3, NB);
	/* new shard 0 serves, then dies writing its first checkpoint (in the
	 * background): its marker names the old files, and a plain start of
	 * it (no --reshard-from) takes them again, the same state */
	setenv("PS_FAULT_CHECKPOINT", "write", 1);
	srv[0] = start_shard(0, old1, 2, NULL);
	unsetenv("PS_FAULT_CHECKPOINT");
	ck_assert_int_eq(tu_wait_exit(srv[0]), 128 + SIGKILL);
	{
		char m[300], f0[300];
		struct stat st;

		snprintf(m, sizeof(m), "%s/shard-0.reshard", ck);
		snprintf(f0, sizeof(f0), "%s/shard-0.ckpt", ck);
		ck_assert_msg(!stat(m, &st) && stat(f0, &st), "after new shard 0 died before its "
			      "first checkpoint: %s should exist, %s not", m, f0);
	}
	/* that marker damaged (empty, not a count, no shards, a relative
	 * folder): a plain start is refused, naming it, and takes nothing;
	 * the marker as written afterwards */
	{
		static const char *const bad[] = { "", "garbage\n", "0 /tmp\n", "2 relative/dir\n" };
		char m[300], want[400];
		size_t kl;
		uint8_t *keep;

		snprintf(m, sizeof(m), "%s/shard-0.reshard", ck);
		snprintf(want, sizeof(want), "%s: not a re-shard marker ('SHARDS /DIR' on one line)",
			 m);
		keep = tu_slurp(m, &kl);
		ck_assert_ptr_nonnull(keep);
		for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
			FILE *mf = fopen(m, "w");
			ck_assert_ptr_nonnull(mf);
			fputs(bad[i], mf);
			fclose(mf);
			snprintf(log, sizeof(log), "%s/bad-marker-%zu.log", dir, i);
			pid_t p = start_shard(0, NULL, 0, log);
			int rc = tu_wait_exit_s(p, 30);
			ck_assert_msg(rc == 1 && tu_log_says(log, want), "marker '%s': exit %d; '%s' "
				      "expected in %s", bad[i], rc, want, log);
		}
		FILE *mf = fopen(m, "w");
		ck_assert_ptr_nonnull(mf);
		fwrite(keep, 1, kl, mf);
		fclose(mf);
		free(keep);
	}
	for (int k = 0; k < 3; k++) {
		snprintf(log, sizeof(log), "%s/a-%d.log", dir, k);
		srv[k] = start_shard(k, k ? old1 : NULL, 2, log);
	}
	c = connect_retry(0);
	ck_assert_uint_eq(ps_client_clock(c), 4);
	train(c, 4, 7, wa, wb, wr);
	ps_client_free(c);
	stop_all(srv, 3);
	snprintf(marker, sizeof(marker), "%s/shard-0.reshard", ck);
	ck_assert_msg(access(marker, F_OK), "%s is left after shard 0's checkpoints", marker);
	move_old("from3", 3, old2, sizeof(old2));
	write_cfg(2, NB);
	for (int k = 0; k < 2; k++)
		srv[k] = start_shard(k, old2, 3, NULL);
	c = connect_retry(0);
	ck_assert_uint_eq(ps_client_clock(c), 7);
	train(c, 7, 10, wa, wb, wr);
	ps_client_free(c);
	stop_all(srv, 2);
	ck_assert_msg(!memcmp(wa, ra, sizeof(ra)) && !memcmp(wb, rb, sizeof(rb)),
		      "dense weights after 2 -> 3 -> 2 differ from training on 2 throughout");
	ck_assert_msg(!memcmp(wr, rr, sizeof(rr)),
		      "rows after 2 -> 3 -> 2 differ from training on 2 throughout");
	/* the re-sharded shard said what it took */
	FILE *f = fopen(log, "r");
	char line[1024];
	int said = 0;
	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		said |= strstr(line, "re-sharded from 2 to 3 shards") != NULL;
	fclose(f);
	ck_assert_msg(said, "shard 2's log (%s) does not say it re-sharded", log);
	/* the restarted shard 0 took the old files by its marker, and its
	 * first checkpoint removed the marker */
	snprintf(log, sizeof(log), "%s/a-0.log", dir);
	f = fopen(log, "r");
	said = 0;
	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		said |= strstr(line, "did not write this shard's first checkpoint: taking the old "
			       "checkpoints in") != NULL;
	fclose(f);
	ck_assert_msg(said, "shard 0's log (%s) does not say it took the old files again", log);
	cleanup_dirs();
}
END_TEST

/* ---- the rows of a checkpoint file ---- */

struct crow {
	uint64_t id;
	uint32_t age;
	float v[DIM * 2];       /* adagrad: dim weights, dim accumulators */
};

struct ctable {
	int nrows;
	struct crow *r;         /* file order: least recently updated first */
	uint32_t *filter;
	uint64_t nfilter;
};

/* Table e of the full checkpoint f (its layout: server/checkpoint.c and
 * table_ckpt.c; no declared tensors or tables). */
static void read_table(const char *f, struct ctable *t)
{
	size_t len, pos;
	uint8_t *b = tu_slurp(f, &len);
	struct ckpt_hdr h;
	struct ckpt_table ct;

	ck_assert_msg(b != NULL, "%s: %s", f, strerror(errno));
	memcpy(&h, b, sizeof(h));
	/* version 5: version 1 of a state that went through a re-shard */
	ck_assert(!memcmp(h.magic, "PSCKPT01", 8) || !memcmp(h.magic, "PSCKPT05", 8));
	pos = ckpt_tables_at(b);
	memcpy(&ct, b + pos, sizeof(ct));
	pos += sizeof(ct);
	ck_assert_uint_eq(ct.row_floats, DIM * 2);
	t->nrows = (int)ct.nrows;
	t->r = calloc(ct.nrows + 1, sizeof(*t->r));
	for (uint64_t i = 0; i < ct.nrows; i++) {
		struct ckpt_row cr;
		memcpy(&cr, b + pos, sizeof(cr));
		t->r[i].id = cr.id;
		t->r[i].age = cr.age;
		memcpy(t->r[i].v, b + pos + sizeof(cr), sizeof(t->r[i].v));
		pos += sizeof(cr) + sizeof(t->r[i].v);
	}
	t->nfilter = ct.filter_slots;
	t->filter = malloc(ct.filter_slots * 4 + 4);
	memcpy(t->filter, b + pos, ct.filter_slots * 4);
	pos += ct.filter_slots * 4;
	ck_assert_uint_eq(pos + 4, len); /* then the CRC */
	free(b);
}

static uint64_t mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* id's count in the filter t holds (the shard's own lookup, table_admit.c). */
static int admit_count(const struct ctable *t, uint64_t tkey, uint64_t id)
{
	struct ps_admit a = { .slots = t->filter, .nbuckets = t->nfilter / 8,
			      .salt = mix64(cfg.seed ^ tkey) };

	return ps_admit_count(&a, id);
}

START_TEST(test_rows_after_2_to_3)
{
	static float wa[NA], wb[NB], wr[(NIDS + 50) * DIM], init[DIM];
	struct ctable old[2], neu[3];
	char old1[200], f[300];
	pid_t srv[3];
	struct ps_client *c;
	uint64_t tkey;
	int total = 0;

	setup_dirs();
	write_cfg(2, NB);
	tkey = ps_rows_table_key(&cfg.tables[0]);
	for (int k = 0; k < 2; k++)
		srv[k] = start_shard(k, NULL, 0, NULL);
	c = connect_retry(0);
	/* two rounds, a second apart: the rows only the first updated are
	 * older by a second */
	train(c, 0, 2, wa, wb, wr);
	tu_sleep_ms(1100);
	train(c, 2, 4, wa, wb, wr);
	/* the admission filter's figures of each old shard */
	uint64_t lookups[2], hits[2], fids[2];
	for (int k = 0; k < 2; k++) {
		struct ps_shard_stats st;
		ck_assert_int_eq(ps_client_stats(c, k, &st), 0);
		lookups[k] = st.tables[0].filter_lookups;
		hits[k] = st.tables[0].filter_hits;
		fids[k] = st.tables[0].filter_ids;
		ck_assert_uint_gt(lookups[k], hits[k]);
		ck_assert_uint_gt(fids[k], 0);
	}
	ps_client_free(c);
	stop_all(srv, 2);
	move_old("from2", 2, old1, sizeof(old1));
	for (int j = 0; j < 2; j++) {
		snprintf(f, sizeof(f), "%s/shard-%d.ckpt", old1, j);
		read_table(f, &old[j]);
	}
	write_cfg(3, NB);
	for (int k = 0; k < 3; k++)
		srv[k] = start_shard(k, old1, 2, NULL);
	c = connect_retry(0);
	/* the new shards write their checkpoints in the background once they
	 * serve (renamed into place: there once whole); 30 s at most */
	for (int k = 0; k < 3; k++) {
		struct stat st;
		int t;

		snprintf(f, sizeof(f), "%s/shard-%d.ckpt", ck, k);
		for (t = 0; t < 300 && stat(f, &st); t++)
			tu_sleep_ms(100);
		ck_assert_msg(t < 300, "new shard %d wrote no checkpoint within 30 s", k);
		read_table(f, &neu[k]);
		total += neu[k].nrows;
	}
	ck_assert_int_eq(total, old[0].nrows + old[1].nrows);
	ck_assert_int_eq(total, NIDS);
	/* new shard k goes on with old shard k's filter figures (the counts of
	 * the ids themselves move with them), the third from none. Jump
	 * hashing moves ids from 2 shards to 3 only onto the new one, so new
	 * shard k < 2 takes old shard k's counts alone (as many ids counted),
	 * and the third every old shard's (at most their sum: two ids of the
	 * same fingerprint and buckets share a count) */
	for (int k = 0; k < 3; k++) {
		struct ps_shard_stats st;
		ck_assert_int_eq(ps_client_stats(c, k, &st), 0);
		if (k < 2)
			ck_assert_msg(st.tables[0].filter_ids == fids[k], "new shard %d counts %"
				      PRIu64 " ids in its filter, old shard %d counted %" PRIu64
				      " (another old shard's counts taken?)", k,
				      st.tables[0].filter_ids, k, fids[k]);
		else
			ck_assert_msg(st.tables[0].filter_ids > 0 &&
				      st.tables[0].filter_ids <= fids[0] + fids[1], "new shard 2 "
				      "counts %" PRIu64 " ids, the old ones %" PRIu64 " and %" PRIu64,
				      st.tables[0].filter_ids, fids[0], fids[1]);
		ck_assert_msg(st.tables[0].filter_lookups == (k < 2 ? lookups[k] : 0) &&
			      st.tables[0].filter_hits == (k < 2 ? hits[k] : 0), "new shard %d: "
			      "filter lookups %" PRIu64 ", hits %" PRIu64 "; %" PRIu64 " and %" PRIu64
			      " due", k, st.tables[0].filter_lookups, st.tables[0].filter_hits,
			      k < 2 ? lookups[k] : 0, k < 2 ? hits[k] : 0);
	}
	/* ages as at the snapshot: the rows only the first round updated are a
	 * second older than the newest (all of them older still when the
	 * shard took a while to write it) */
	for (int k = 0; k < 3; k++)
		ck_assert_msg(neu[k].r[0].age >= neu[k].r[neu[k].nrows - 1].age + 1,
			      "new shard %d: ages %u..%u, expected the oldest row a second older", k,
			      neu[k].r[0].age, neu[k].r[neu[k].nrows - 1].age);
	for (int k = 0; k < 3; k++) {
		int last[2] = { -1, -1 };
		ck_assert_int_gt(neu[k].nrows, 0);
		for (int i = 0; i < neu[k].nrows; i++) {
			const struct crow *r = &neu[k].r[i];
			int j, at = -1;

			ck_assert_int_eq(ps_rows_shard(tkey, r->id, 3), k);
			if (i)
				ck_assert_uint_le(r->age, neu[k].r[i - 1].age);
			for (j = 0; j < 2 && at < 0; j++)
				for (int q = 0; q < old[j].nrows && at < 0; q++)
					if (old[j].r[q].id == r->id)
						at = q;
			j--;
			ck_assert_msg(at >= 0, "row %" PRIu64 " on new shard %d is in no old file",
				      r->id, k);
			ck_assert_msg(!memcmp(r->v, old[j].r[at].v, sizeof(r->v)),
				      "row %" PRIu64 ": weights or adagrad state changed", r->id);
			/* the rows of one old shard keep their order */
			ck_assert_msg(at > last[j], "row %" PRIu64 " (old shard %d, place %d) after "
				      "place %d", r->id, j, at, last[j]);
			last[j] = at;
		}
	}
	/* ids pushed once: counted on their old shard, and on their new one */
	for (int i = NIDS; i < NIDS + 50; i++) {
		uint64_t id = id_of(i);
		int j = ps_rows_shard(tkey, id, 2), k = ps_rows_shard(tkey, id, 3);
		ck_assert_int_eq(admit_count(&old[j], tkey, id), 1);
		ck_assert_msg(admit_count(&neu[k], tkey, id) == 1, "id %" PRIu64 ": count %d on new "
			      "shard %d", id, admit_count(&neu[k], tkey, id), k);
	}
	/* so their second push creates their rows */
	{
		static uint64_t ids[50];
		static float g[50 * DIM], got[50 * DIM], za[NA], zb[NB];
		struct ps_tensor tz[2] = { { .name = "a", .data = za, .count = NA },
					   { .name = "b", .data = zb, .count = NB } };
		for (int i = 0; i < 50; i++)
			ids[i] = id_of(NIDS + i);
		for (int i = 0; i < 50 * DIM; i++)
			g[i] = 1.0f;
		ck_assert_msg(ps_client_push_rows(c, "e", 4, ids, 50, g, 0) == 0, "%s",
			      ps_client_error(c));
		int64_t p = ps_client_push(c, 4, tz, 2, PS_PUSH_END_CLOCK);
		ck_assert_msg(p > 0 && ps_client_wait(c, p) == 0, "%s", ps_client_error(c));
		ck_assert_msg(ps_client_pull_rows(c, "e", 5, ids, 50, got) == 0, "%s",
			      ps_client_error(c));
		for (int i = 0; i < 50; i++) {
			ps_rows_init(&cfg, 0, ids[i], init);
			ck_assert_msg(memcmp(got + i * DIM, init, sizeof(init)) != 0,
				      "id %" PRIu64 " has no row after its second push", ids[i]);
		}
	}
	ps_client_free(c);
	stop_all(srv, 3);
	for (int k = 0; k < 3; k++) {
		free(neu[k].r);
		free(neu[k].filter);
	}
	for (int j = 0; j < 2; j++) {
		free(old[j].r);
		free(old[j].filter);
	}
	cleanup_dirs();
}
END_TEST

/* Shard k of the config at path must refuse to start (re-sharding from
 * old, old_n shards) with a message holding want (and want2); re-sharding,
 * it wrote no checkpoint of its own. */
static void expect_refused(int k, const char *old, int old_n, const char *want,
			   const char *want2)
{
	char log[200], f[200], buf[8192];
	size_t len = 0;
	struct stat st;
	FILE *fp;

	snprintf(log, sizeof(log), "%s/refused.log", dir);
	pid_t pid = start_shard(k, old, old_n, log);
	ck_assert_int_ne(tu_wait_child(pid), 0);
	fp = fopen(log, "r");
	ck_assert_ptr_nonnull(fp);
	len = fread(buf, 1, sizeof(buf) - 1, fp);
	buf[len] = 0;
	fclose(fp);
	ck_assert_msg(strstr(buf, want) && (!want2 || strstr(buf, want2)), "expected '%s' and "
		      "'%s', got: %s", want, want2 ? want2 : "", buf);
	snprintf(f, sizeof(f), "%s/shard-%d.ckpt", ck, k);
	ck_assert_msg(!old || stat(f, &st) != 0, "%s written by a shard that refused to start", f);
}

START_TEST(test_refusals)
{
	static float wa[NA], wb[NB], wr[(NIDS + 50) * DIM];
	char old1[200], a[300], b[300], early[300];
	pid_t srv[2];
	struct ps_client *c;

	setup_dirs();
	write_cfg(2, NB);
	for (int k = 0; k < 2; k++)
		srv[k] = start_shard(k, NULL, 0, NULL);
	c = connect_retry(0);
	train(c, 0, 2, wa, wb, wr);
	ps_client_free(c);
	stop_all(srv, 2);
	/* shard 0's checkpoint of clock 2 kept aside */
	snprintf(a, sizeof(a), "%s/shard-0.ckpt", ck);
	snprintf(early, sizeof(early), "%s/early.ckpt", dir);
	ck_assert_int_eq(link(a, early), 0);
	for (int k = 0; k < 2; k++)
		srv[k] = start_shard(k, NULL, 0, NULL);
	c = connect_retry(0);
	train(c, 2, 4, wa, wb, wr);
	ps_client_free(c);
	stop_all(srv, 2);
	move_old("from2", 2, old1, sizeof(old1));

	write_cfg(3, NB);
	/* the old placement's file is told apart: a plain start of the same
	 * config names the re-shard, and so does a file of 2 shards on 3 */
	snprintf(a, sizeof(a), "%s/shard-1.ckpt", old1);
	snprintf(b, sizeof(b), "%s/shard-1.ckpt", ck);
	ck_assert_int_eq(link(a, b), 0);
	expect_refused(1, NULL, 0, "made with another configuration", "reshard NEW_CONFIG");
	ck_assert_int_eq(unlink(b), 0);
	/* the old files in checkpoint.dir itself */
	expect_refused(0, ck, 2, "is checkpoint.dir itself", NULL);
	/* a folder that is not there, named */
	{
		char none[240], want[300];
		snprintf(none, sizeof(none), "%s/no-such-folder", dir);
		snprintf(want, sizeof(want), "--reshard-from %s: No such file or directory", none);
		expect_refused(0, none, 2, want, NULL);
	}
	/* another model */
	write_cfg(3, NB + 1);
	expect_refused(2, old1, 2, "is not that of this config with 2 shards", NULL);
	/* another old shard count than the files' */
	write_cfg(3, NB);
	expect_refused(2, old1, 3, "shard-2.ckpt is missing", NULL);
	/* a missing old file */
	ck_assert_int_eq(rename(a, b), 0);
	expect_refused(2, old1, 2, "shard-1.ckpt is missing", NULL);
	ck_assert_int_eq(rename(b, a), 0);
	/* files of different clocks */
	snprintf(a, sizeof(a), "%s/shard-0.ckpt", old1);
	ck_assert_int_eq(rename(early, a), 0);
	expect_refused(1, old1, 2, "the old checkpoints are of different clocks", "shard-1.ckpt");
	cleanup_dirs();
}
END_TEST

/* ---- checkpoints of the placement before re-sharding ---- */

/* Known values: element i of tensor t, its momentum, row id's floats. */
static float dense_val(int t, int64_t i)
{
	return (float)(t * 10000 + i) * 0.5f;
}

static float row_val(uint64_t id, int j)
{
	return (float)(id % 1000) + (float)j * 0.25f;
}

/* Writes shard j's checkpoint of n shards under placement 0 (greedy slices,
 * multiply-shift rows) into folder d, as a build before re-sharding wrote
 * it (its layout: server/checkpoint.c, table_ckpt.c): every slice at
 * version and steps 3, the worker at clock 3, the rows of ids
 * id_of(0..NIDS-1) this shard held then. */
static void write_old_placement(const char *d, int j, int n)
{
	struct ps_shardmap m;
	const struct ps_table_cfg *tc = &cfg.tables[0];
	uint64_t tkey = ps_rows_table_key(tc), nb = 1, nrows = 0, clock = 3;
	char f[300];
	FILE *fp;
	uLong crc = crc32(0L, Z_NULL, 0);
	uint32_t nslots = 0, c32;
	float v[NA];

#define PUT(p, len) do { ck_assert_uint_eq(fwrite((p), 1, (len), fp), (len)); \
			 crc = crc32(crc, (const Bytef *)(p), (uInt)(len)); } while (0)
	ck_assert_int_eq(cfg.nshards, n);
	ck_assert_int_eq(ps_shardmap_init_placed(&m, &cfg, PS_PLACE_GREEDY), 0);
	for (uint32_t i = 0; i < m.nslices; i++)
		nslots += m.slices[i].shard == j;
	snprintf(f, sizeof(f), "%s/shard-%d.ckpt", d, j);
	fp = fopen(f, "wb");
	ck_assert_ptr_nonnull(fp);
	struct ckpt_hdr h = { .endian = CKPT_ENDIAN, .shard = j, .map_hash = m.hash,
			      .optimizer = (uint32_t)cfg.optim.kind, .nstate = 1, .nworkers = 1,
			      .consistency = (uint32_t)cfg.consistency, .nslots = nslots };
	memcpy(h.magic, CKPT_MAGIC, 8);
	PUT(&h, sizeof(h));
	for (uint32_t i = 0; i < m.nslices; i++) {
		const struct ps_slice *sl = &m.slices[i];
		struct ckpt_slot cs = { .slice = i, .count = (uint64_t)sl->count, .version = 3,
					.steps = 3 };
		if (sl->shard != j)
			continue;
		PUT(&cs, sizeof(cs));
		for (int64_t e = 0; e < sl->count; e++)
			v[e] = dense_val(sl->tensor, sl->offset + e);
		PUT(v, (size_t)sl->count * 4);
		for (int64_t e = 0; e < sl->count; e++)
			v[e] = -dense_val(sl->tensor, sl->offset + e);
		PUT(v, (size_t)sl->count * 4); /* momentum */
	}
	PUT(&clock, 8);
	while (nb * 8 < (uint64_t)tc->filter_ids)
		nb *= 2;
	for (int i = 0; i < NIDS; i++)
		nrows += ps_rows_shard_placed(tkey, id_of(i), n, PS_PLACE_GREEDY) == j;
	struct ckpt_table ct = { .key = tkey, .dim = DIM, .row_floats = 2 * DIM, .version = 3,
				 .nrows = nrows, .filter_slots = nb * 8, .live_rows = nrows,
				 .wall = (double)time(NULL) };
	PUT(&ct, sizeof(ct));
	for (int i = 0; i < NIDS; i++) {
		struct ckpt_row cr = { .id = id_of(i), .age = (uint32_t)(NIDS - i) / 100 };
		float rv[2 * DIM];
		if (ps_rows_shard_placed(tkey, cr.id, n, PS_PLACE_GREEDY) != j)
			continue;
		for (int q = 0; q < 2 * DIM; q++)
			rv[q] = row_val(cr.id, q);
		PUT(&cr, sizeof(cr));
		PUT(rv, sizeof(rv));
	}
	for (uint64_t q = 0; q < nb * 8; q++) {
		uint32_t zero = 0;
		PUT(&zero, 4);
	}
	c32 = (uint32_t)crc;
	ck_assert_uint_eq(fwrite(&c32, 1, 4, fp), 4);
	ck_assert_int_eq(fclose(fp), 0);
	ps_shardmap_free(&m);
#undef PUT
}

START_TEST(test_old_placement_replaced)
{
	static float wa[NA], wb[NB], got[NIDS * DIM];
	static uint64_t ids[NIDS];
	char old[200], a[300], b[300];
	pid_t srv[3];
	struct ps_client *c;

	setup_dirs();
	write_cfg(2, NB);
	snprintf(old, sizeof(old), "%s/old", ck);
	ck_assert_int_eq(mkdir(old, 0700), 0);
	for (int j = 0; j < 2; j++)
		write_old_placement(old, j, 2);
	/* a plain start from such a file says how to re-place it */
	snprintf(a, sizeof(a), "%s/shard-0.ckpt", old);
	snprintf(b, sizeof(b), "%s/shard-0.ckpt", ck);
	ck_assert_int_eq(link(a, b), 0);
	expect_refused(0, NULL, 0, "made by a build before re-sharding", "reshard CONFIG");
	ck_assert_int_eq(unlink(b), 0);
	/* ps-export reads them with their placement */
	{
		char cmd[600];
		snprintf(cmd, sizeof(cmd), "bin/ps-export --config %s --dir %s --out %s/x.npz "
			 ">%s/export.log 2>&1", path, old, dir, dir);
		ck_assert_msg(system(cmd) == 0, "ps-export of placement 0's checkpoints failed "
			      "(%s/export.log)", dir);
	}
	/* re-placed on the same 2 shards, and on 3 */
	for (int n = 2; n <= 3; n++) {
		write_cfg(n, NB);
		for (int k = 0; k < n; k++)
			srv[k] = start_shard(k, old, 2, NULL);
		c = connect_retry(0);
		ck_assert_uint_eq(ps_client_clock(c), 3);
		struct ps_tensor tw[2] = { { .name = "a", .data = wa, .count = NA },
					   { .name = "b", .data = wb, .count = NB } };
		int64_t q = ps_client_pull(c, 3, tw, 2);
		ck_assert_msg(q > 0 && ps_client_wait(c, q) == 0, "pull: %s", ps_client_error(c));
		for (int i = 0; i < NA; i++)
			ck_assert_msg(wa[i] == dense_val(0, i), "a[%d] = %g", i, wa[i]);
		for (int i = 0; i < NB; i++)
			ck_assert_msg(wb[i] == dense_val(1, i), "b[%d] = %g", i, wb[i]);
		for (int i = 0; i < NIDS; i++)
			ids[i] = id_of(i);
		ck_assert_msg(ps_client_pull_rows(c, "e", 3, ids, NIDS, got) == 0, "%s",
			      ps_client_error(c));
		for (int i = 0; i < NIDS; i++)
			for (int q2 = 0; q2 < DIM; q2++)
				ck_assert_msg(got[i * DIM + q2] == row_val(ids[i], q2), "row %" PRIu64
					      "[%d] = %g", ids[i], q2, got[i * DIM + q2]);
		ps_client_free(c);
		stop_all(srv, n);
		/* the next round starts from the old files again */
		for (int k = 0; k < n; k++) {
			snprintf(b, sizeof(b), "%s/shard-%d.ckpt", ck, k);
			ck_assert_int_eq(unlink(b), 0);
		}
	}
	cleanup_dirs();
}
END_TEST

/* Declares a and b (rank 0's values: their index) and checks the shards'
 * values came back into them. */
static void declare(struct ps_client *c, float *wa, float *wb)
{
	static const int64_t da[1] = { NA }, db[1] = { NB };
	struct ps_param p[2] = { { "a", 1, da, wa }, { "b", 1, db, wb } };

	for (int i = 0; i < NA; i++)
		wa[i] = (float)i;
	for (int i = 0; i < NB; i++)
		wb[i] = (float)i;
	ck_assert_msg(ps_client_declare(c, p, 2) == 0, "declare: %s", ps_client_error(c));
}

/* Every shard of c writes its checkpoint now (full, then incremental). */
static void checkpoint_all(struct ps_client *c, int n)
{
	for (int k = 0; k < n; k++) {
		struct ps_shard_stats st;
		ck_assert_int_eq(ps_client_checkpoint(c, k, 1, &st), 0);
		ck_assert_msg(st.checkpoint_status == 0, "shard %d: checkpoint failed", k);
	}
}

/* Tensors declared by the worker and a chain of incremental checkpoints:
 * a full one at clock 4, deltas at 6 and 8, then the shards killed (no
 * checkpoint at stop): 3 shards start from the chain with the declared
 * tensors, the weights and rows of clock 8. */
START_TEST(test_declared_and_incremental)
{
	static float wa[NA], wb[NB], wr[(NIDS + 50) * DIM];
	static float ra[NA], rb[NB], rr[(NIDS + 50) * DIM];
	static uint64_t ids[NIDS + 50];
	char old[200], f[300];
	pid_t srv[3];
	struct ps_client *c;
	struct stat st;

	declared = 1;
	setup_dirs();
	write_cfg(2, NB);
	for (int k = 0; k < 2; k++)
		srv[k] = start_shard(k, NULL, 0, NULL);
	c = connect_retry(0);
	declare(c, wa, wb);
	train(c, 0, 4, wa, wb, wr);
	checkpoint_all(c, 2);
	train(c, 4, 6, wa, wb, wr);
	checkpoint_all(c, 2);
	train(c, 6, 8, ra, rb, rr);
	checkpoint_all(c, 2);
	ps_client_free(c);
	for (int k = 0; k < 2; k++) {
		kill(srv[k], SIGKILL);
		tu_wait_child(srv[k]);
		snprintf(f, sizeof(f), "%s/shard-%d.ckpt.delta-2", ck, k);
		ck_assert_msg(stat(f, &st) == 0, "%s: %s", f, strerror(errno));
	}
	snprintf(old, sizeof(old), "%s/old", ck);
	ck_assert_int_eq(mkdir(old, 0700), 0);
	for (int k = 0; k < 2; k++)
		for (int d = 0; d <= 2; d++) {
			char a[300], b[300];
			snprintf(a, sizeof(a), "%s/shard-%d.ckpt%s", ck, k, d ? ".delta-" : "");
			snprintf(b, sizeof(b), "%s/shard-%d.ckpt%s", old, k, d ? ".delta-" : "");
			if (d) {
				snprintf(a + strlen(a), sizeof(a) - strlen(a), "%d", d);
				snprintf(b + strlen(b), sizeof(b) - strlen(b), "%d", d);
			}
			ck_assert_msg(rename(a, b) == 0, "%s: %s", a, strerror(errno));
		}
	write_cfg(3, NB);
	for (int k = 0; k < 3; k++)
		srv[k] = start_shard(k, old, 2, NULL);
	c = connect_retry(0);
	declare(c, wa, wb);
	ck_assert_uint_eq(ps_client_clock(c), 8);
	ck_assert_msg(!memcmp(wa, ra, sizeof(ra)) && !memcmp(wb, rb, sizeof(rb)),
		      "declared tensors after 2 -> 3 differ from clock 8's");
	for (int i = 0; i < NIDS + 50; i++)
		ids[i] = id_of(i);
	ck_assert_msg(ps_client_pull_rows(c, "e", 8, ids, NIDS + 50, wr) == 0, "%s",
		      ps_client_error(c));
	ck_assert_msg(!memcmp(wr, rr, sizeof(rr)), "rows after 2 -> 3 differ from clock 8's");
	ps_client_free(c);
	stop_all(srv, 3);
	declared = 0;
	cleanup_dirs();
}
END_TEST

/* A client placing slices and rows as builds before re-sharding did (its
 * Hello carries placement 0's map hash) is refused, told why. */
START_TEST(test_old_placement_client_refused)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	static char settings[PS_AGREE_MAX];
	Ps__Hello h = PS__HELLO__INIT;
	struct ps_shardmap old;
	struct ps_frame_hdr fh = { .version = PS_PROTOCOL_VERSION, .type = PS_MSG_HELLO };
	struct ps_wire_limits lim = { .max_frame = 1 << 20, .max_meta = 1 << 16 };
	uint8_t buf[8192], hdr[PS_WIRE_HDR_LEN];
	char why[200];
	size_t got = 0;
	pid_t srv;
	int fd = -1;

	noauth = 1;
	setup_dirs();
	write_cfg(1, NB);
	srv = start_shard(0, NULL, 0, NULL);
	a.sin_port = htons((uint16_t)cfg.shards[0].port);
	inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
	for (int i = 0; i < 100; i++) {
		fd = socket(AF_INET, SOCK_STREAM, 0);
		if (!connect(fd, (struct sockaddr *)&a, sizeof(a)))
			break;
		close(fd);
		fd = -1;
		tu_sleep_ms(100);
	}
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ps_shardmap_init_placed(&old, &cfg, PS_PLACE_GREEDY), 0);
	ps_config_agreement(&cfg, settings, sizeof(settings));
	h.protocol_version = PS_PROTOCOL_VERSION;
	h.role = PS__ROLE__ROLE_WORKER;
	h.shard_map_hash = old.hash;
	h.incarnation = 77;
	h.settings = settings;
	ps_shardmap_free(&old);
	fh.meta_len = (uint32_t)protobuf_c_message_get_packed_size(&h.base);
	ps_wire_encode_hdr(buf, &fh);
	protobuf_c_message_pack(&h.base, buf + PS_WIRE_HDR_LEN);
	ck_assert_int_eq(write(fd, buf, PS_WIRE_HDR_LEN + fh.meta_len),
			 (ssize_t)(PS_WIRE_HDR_LEN + fh.meta_len));
	ck_assert_int_eq(read(fd, hdr, sizeof(hdr)), (ssize_t)sizeof(hdr));
	ck_assert_int_eq(ps_wire_decode_hdr(hdr, &lim, &fh, why, sizeof(why)), 0);
	ck_assert_uint_eq(fh.type, PS_MSG_HELLO_REPLY);
	ck_assert_uint_lt(fh.meta_len + fh.payload_len, sizeof(buf));
	while (got < fh.meta_len + fh.payload_len) {
		ssize_t k = read(fd, buf + got, fh.meta_len + fh.payload_len - got);
		ck_assert_int_gt(k, 0);
		got += (size_t)k;
	}
	Ps__HelloReply *r = ps__hello_reply__unpack(NULL, fh.meta_len, buf);
	ck_assert_ptr_nonnull(r);
	ck_assert_msg(!r->ok && r->error && strstr(r->error, "as builds before re-sharding did") &&
		      strstr(r->error, "run a client of this build"), "%s",
		      r->error ? r->error : "(ok)");
	ps__hello_reply__free_unpacked(r, NULL);
	close(fd);
	ck_assert_int_eq(tu_stop_server(srv), 0);
	noauth = 0;
	cleanup_dirs();
}
END_TEST

int main(void)
{
	Suite *s = suite_create("reshard");
	TCase *tc = tcase_create("reshard");

	signal(SIGPIPE, SIG_IGN);
	tcase_set_timeout(tc, 120);
	TU_ADD(tc, test_sync_2_3_2_bit_identical);
	TU_ADD(tc, test_rows_after_2_to_3);
	TU_ADD(tc, test_refusals);
	TU_ADD(tc, test_old_placement_replaced);
	TU_ADD(tc, test_declared_and_incremental);
	TU_ADD(tc, test_old_placement_client_refused);
	suite_add_tcase(s, tc);
	return tu_run_suite(s);
}
